//! The coordinator's shell: what the coordinator actor does around its machine
//! ([`Scheduler`](crate::roles::coordinator::Scheduler)), over the simulated network. Every
//! [`SchedulerAction`](crate::roles::coordinator::SchedulerAction) is carried out by the
//! coordinator's one executor ([`executor::plan`], [`executor::deliver`]), which the actor
//! runs too; this shell only moves the executor's calls as simulated messages, reads their
//! answers back as the gateway would, hands the messages that reach the chief to the machine,
//! and runs the coordinator's periodic work. It decides nothing itself; it keeps the harness's
//! records (FENCE-1, PS-1, what each save read) as calls go out and answers come in.

use std::sync::Arc;
use std::time::Duration;

use super::super::Node;
use super::job::{skip_of, DATASET};
use super::network::{Msg, Req, Resp, RunResult};
use super::storage::LOAD_DELAY;
use super::{Event, ProcState, World};
use crate::roles::coordinator::executor::{
    self, Answer, Delivered, Effect, Reply, Request, Route, Target,
};
use crate::roles::coordinator::{CallFault, ServerProbe};
use crate::roles::protocol::{PsUnavailable, RunClosureError, SetupWorker};

/// A coordinator call in flight: to which incarnation of which node, and where its answer
/// goes in the machine.
pub(super) struct Call {
    pub(super) to: Node,
    pub(super) incarnation: u64,
    pub(super) route: Route,
}

/// Why a call got no reply: its connection was lost, or the caller's bound passed (the
/// gateway's `PeerLost` and `Timeout`, which the machine hears as unreachable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum NoReply {
    /// A partition or a pause held the call past the detection budget: the connection idled
    /// out.
    #[error("connection lost (idle timeout)")]
    IdledOut,
    /// The callee's incarnation went down.
    #[error("{node} (incarnation {incarnation}): connection lost")]
    ConnectionLost {
        /// The callee.
        node: Node,
        /// Its incarnation.
        incarnation: u64,
    },
    /// The call's bound passed.
    #[error("no answer in time")]
    NoAnswerInTime,
}

impl World<'_> {
    /// The coordinator's periodic work and the chief program's next step.
    pub(super) fn tick(&mut self) {
        if self.chief_state != ProcState::Up {
            return;
        }
        let now = self.instant();
        self.detect();
        self.coord.handle_reconnect_tick();
        if self.now.as_millis() % WATERMARK_EVERY.as_millis() == 0 {
            self.coord.handle_watermark_tick();
        }
        if self.coord.poll_timeout().is_some_and(|t| t <= now) {
            self.coord.handle_timeout(now);
        }
        self.program();
    }

    /// A message reaches the chief: a reply goes to the call it answers, a notice from a
    /// worker or a server to the coordinator's machine, as the coordinator actor does.
    pub(super) fn chief_receive(&mut self, msg: Msg) {
        match msg {
            Msg::Reply { call, resp } => self.on_reply(call, Ok(resp)),
            Msg::Leaving {
                worker,
                incarnation,
            } => {
                // As the coordinator actor: the simulated chief is not stopping itself (its
                // own preemption is a chief fault).
                let now = self.instant();
                let answer = self
                    .coord
                    .handle_worker_leaving(now, worker, incarnation, false);
                let msg = Msg::LeaveAnswer(answer);
                self.send(Node::Chief, Node::Worker(worker), incarnation, msg);
            }
            Msg::Draining {
                worker,
                incarnation,
            } => {
                let now = self.instant();
                if self.coord.handle_worker_draining(now, worker, incarnation)
                    == crate::roles::coordinator::DrainDisposition::Done
                {
                    self.send(Node::Chief, Node::Worker(worker), incarnation, Msg::Drained);
                }
            }
            Msg::Joining {
                worker,
                incarnation,
            } => {
                let now = self.instant();
                let _ = self.coord.handle_worker_joining(now, worker, incarnation);
            }
            Msg::PsJoining { ps, incarnation } => {
                // Refusals cannot happen here (the job has a checkpoint directory and few
                // servers); a refused server would stay out and exit.
                let now = self.instant();
                let addr = format!("ps{ps}:2222");
                let _ = self.coord.handle_ps_joining(now, ps, incarnation, addr);
            }
            Msg::PsDraining { ps, incarnation } => {
                let now = self.instant();
                let go = match self.coord.handle_ps_draining(now, ps, incarnation) {
                    Ok(true) => Some(true),
                    Ok(false) => None,
                    Err(_) => Some(false),
                };
                if let Some(go) = go {
                    self.send(
                        Node::Chief,
                        Node::Ps(ps),
                        incarnation,
                        Msg::PsDrainAnswer { go },
                    );
                }
            }
            Msg::PsLeaving { ps, incarnation } => {
                let now = self.instant();
                if let Some(answer) = self.coord.handle_ps_leaving(now, ps, incarnation, false) {
                    self.send(
                        Node::Chief,
                        Node::Ps(ps),
                        incarnation,
                        Msg::LeaveAnswer(answer),
                    );
                }
            }
            _ => {}
        }
    }

    /// A call's outcome: its reply, or why none came, read as the gateway reads it and handed
    /// to the executor.
    pub(super) fn on_reply(&mut self, call: u64, resp: Result<Resp, NoReply>) {
        let Some(Call { to, route, .. }) = self.calls.remove(&call) else {
            return; // answered already (a duplicate), or given up
        };
        let outcome = self.reply_of(to, &route, resp);
        self.hand_to_machine(route, outcome);
    }

    /// Hands an outcome to the executor; FENCE-1: a result from an incarnation fenced must
    /// not commit.
    pub(super) fn hand_to_machine(&mut self, route: Route, outcome: Result<Reply, CallFault>) {
        let now = self.instant();
        let delivered = executor::deliver(&mut self.coord, now, route, outcome);
        if let Delivered::Committed {
            worker,
            incarnation,
            closure,
            ..
        } = delivered
        {
            if self.fenced.get(&worker).is_some_and(|f| incarnation <= *f) {
                self.violate(
                    "FENCE-1",
                    format!(
                        "closure {} committed from fenced worker/{worker} incarnation {incarnation}",
                        closure.0
                    ),
                );
            }
        }
    }

    /// Carries out what the scheduler asks, until it asks nothing more: the executor's plan
    /// of each action. A chief that exits on the way (its start failed) carries out nothing
    /// more: what its machine still asked dies with the process.
    pub(super) fn drive(&mut self) {
        while self.chief_state == ProcState::Up {
            let Some(action) = self.coord.poll_action() else {
                return;
            };
            let now = self.instant();
            for effect in executor::plan(&self.coord, now, action) {
                if self.chief_state != ProcState::Up {
                    return;
                }
                match effect {
                    Effect::Call(call) => self.call(call),
                    Effect::Answer(answer) => self.answer(answer),
                    Effect::Fenced {
                        worker,
                        incarnation,
                    } => {
                        let fenced = self.fenced.entry(worker).or_insert(incarnation);
                        *fenced = (*fenced).max(incarnation);
                        // Dropping the connection: calls to that incarnation fail now.
                        self.fail_calls(Node::Worker(worker), incarnation);
                    }
                }
            }
        }
    }

    /// Tells whoever waits for a request the machine ended: the chief program, or a task's
    /// process (as a message).
    fn answer(&mut self, answer: Answer) {
        match answer {
            Answer::Started { ticket, result } => self.startup_restored(ticket, result),
            Answer::CutRead { ticket, result } => self.cut_read(ticket, result),
            Answer::Drained {
                worker,
                incarnation,
            } => {
                // The drain finished here: the chief keeps the position it read, and sets the
                // worker's next process up there, whether or not this process takes the answer
                // (one retired as fenced meanwhile restarts and joins: seed 17403745 of 1
                // server, 2 workers and up to 12 faults, where the harness kept the position
                // only once the process exited as drained, and expected the restore's).
                let w = &mut self.workers[worker as usize];
                w.kept = w.drain_read;
                self.send(Node::Chief, Node::Worker(worker), incarnation, Msg::Drained);
            }
            Answer::PsLeaving {
                ps,
                incarnation,
                answer,
            } => {
                self.send(
                    Node::Chief,
                    Node::Ps(ps),
                    incarnation,
                    Msg::LeaveAnswer(answer),
                );
            }
            Answer::PsDraining {
                ps,
                incarnation,
                result,
            } => {
                let go = result.is_ok();
                self.send(
                    Node::Chief,
                    Node::Ps(ps),
                    incarnation,
                    Msg::PsDrainAnswer { go },
                );
            }
            Answer::VariableCreated { ticket, result } => self.variable_created(ticket, result),
            // The program's wait for a configuration: the simulated chief configures the
            // workers without waiting for them.
            Answer::Configured { .. } => {}
        }
    }

    /// Fails every pending call to `node`'s incarnation `incarnation` (its connection is gone).
    pub(super) fn fail_calls(&mut self, node: Node, incarnation: u64) {
        let lost: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.to == node && c.incarnation == incarnation)
            .map(|(id, _)| *id)
            .collect();
        for call in lost {
            self.on_reply(call, Err(NoReply::ConnectionLost { node, incarnation }));
        }
    }

    /// Sends one of the executor's calls as a simulated request to the incarnation it names
    /// (or the one up now, for a call to whichever answers at the address); its reply (or
    /// none within the call's bound) comes back to [`World::on_reply`]. The checkpoint
    /// storage's work is done on the simulated storage after a delay.
    fn call(&mut self, call: executor::Call) {
        let executor::Call {
            request,
            bound,
            route,
        } = call;
        let bound = bound.unwrap_or(self.config.call_timeout);
        let (to, incarnation) = match request.target() {
            Target::Worker {
                worker,
                incarnation,
            } => {
                let node = Node::Worker(worker);
                (node, incarnation.unwrap_or_else(|| self.state(node).1))
            }
            Target::Ps { ps, incarnation } => {
                let node = Node::Ps(ps);
                (node, incarnation.unwrap_or_else(|| self.state(node).1))
            }
            Target::Storage => (Node::Chief, self.chief_incarnation),
        };
        let Some(req) = self.request_of(request, &route) else {
            return;
        };
        let call = self.next_call;
        self.next_call += 1;
        self.calls.insert(
            call,
            Call {
                to,
                incarnation,
                route,
            },
        );
        self.send(Node::Chief, to, incarnation, Msg::Request { call, req });
        self.at(self.now + bound, Event::CallTimeout { call });
    }

    /// The simulated message that carries `request` (the harness notes what it checks as it
    /// goes out), or `None` where nothing goes over the network: the storage's work, done
    /// here, and a variable's creation, which the simulated job never asks for.
    ///
    /// Longer than most functions here on purpose: one arm per `Request`, each how the
    /// simulated world carries it out, as the actor's `outcome_of` does for the real one.
    fn request_of(&mut self, request: Request, route: &Route) -> Option<Req> {
        let setup_req = |world: &mut Self, setup: &SetupWorker| {
            (
                world.chief_incarnation,
                skip_of(setup),
                world.intern_layouts(&setup.layouts),
            )
        };
        let req = match request {
            Request::Run { msg, .. } => {
                // PS-1 across chief restarts, checked as an id is given out the first time.
                if self.dispatched.insert(msg.closure) {
                    self.check_fresh_id(msg.closure);
                }
                Req::Run {
                    closure: msg.closure,
                    attempt: msg.attempt,
                    generation: msg.generation,
                    chief: self.chief_incarnation,
                    servers: msg.servers.clone(),
                }
            }
            Request::DialWorker { .. } => Req::Hello,
            Request::Rewind { setup, .. } => {
                let (chief, skip, layouts) = setup_req(self, &setup);
                match route {
                    Route::SetUp { version, .. } => Req::SetUp {
                        version: *version,
                        generation: setup.generation,
                        chief,
                        skip,
                        layouts,
                    },
                    _ => Req::Rewind {
                        version: setup.version,
                        generation: setup.generation,
                        chief,
                        skip,
                        layouts,
                    },
                }
            }
            Request::Configure { setup, .. } => {
                let (chief, skip, layouts) = setup_req(self, &setup);
                Req::Configure {
                    version: setup.version,
                    generation: setup.generation,
                    chief,
                    skip,
                    layouts,
                }
            }
            Request::Positions { .. } => Req::Positions,
            Request::RetireWorker { .. } | Request::RetirePs { .. } => Req::Retire,
            Request::Stats { .. } => Req::Probe,
            Request::Fence { msg, .. } => Req::Fence {
                worker: msg.worker,
                incarnation: msg.incarnation,
            },
            Request::Watermark { msg, .. } => Req::Watermark {
                below: msg.closure,
                generation: msg.generation,
            },
            Request::BeginRestore { msg, .. } => {
                // A restore begins: it puts every worker at the checkpoint's positions, also
                // one that rolls the servers back without sending shards (a checkpoint they
                // hold already), so what a drain kept before it no longer holds (found by
                // DATA-1 at seed 15001485 of 1 server, 2 workers and up to 12 faults: a drain's
                // kept position outlived two chief restarts whose restores only rolled back).
                self.forget_drained_positions();
                if msg.afresh {
                    self.restored_from.insert(msg.generation, None);
                }
                Req::Begin {
                    generation: msg.generation,
                    fences: msg.fences,
                    afresh: msg.afresh,
                }
            }
            Request::RestoreShards {
                checkpoint,
                layouts,
                ..
            } => {
                let layouts = self.intern_layouts(&layouts);
                let stored = checkpoint.0.step as usize;
                self.forget_drained_positions();
                if let Route::Restore { generation, .. } = route {
                    self.restored_from.insert(*generation, Some(stored));
                }
                self.restoring.insert(stored, Arc::clone(&checkpoint.0));
                Req::Shards { stored, layouts }
            }
            Request::RollBack { msg, .. } => Req::RollBack {
                below: msg.finished_below,
                generation: msg.generation,
            },
            Request::Snapshot { msg, .. } => Req::Snapshot { shard: msg.name },
            // The chief program's creation of its variables before each start.
            Request::Create { msg, .. } => {
                let shape: Vec<usize> = msg.shape.iter().map(|&d| d as usize).collect();
                match crate::roles::ps::initial_values(&msg.name, &shape, &msg.init) {
                    Ok(values) => Req::Create {
                        shard: msg.name,
                        shape: msg.shape,
                        values: values.into_iter().map(f32::to_bits).collect(),
                    },
                    Err(e) => {
                        self.violate("HARNESS", format!("the chief's creation is invalid: {e}"));
                        return None;
                    }
                }
            }
            // The checkpoint is read from the simulated storage after a delay.
            Request::Load {
                generation, cut, ..
            } => {
                let event = Event::Loaded {
                    generation,
                    cut: cut.0,
                };
                self.at(self.now + LOAD_DELAY, event);
                return None;
            }
            Request::WriteCut { root, reading, .. } => {
                if let Route::CutWritten { ticket } = route {
                    self.write_preemption_cut(*ticket, root, *reading);
                }
                return None;
            }
        };
        Some(req)
    }

    /// A restore puts every worker at the checkpoint's positions: what a drain kept before it
    /// no longer holds (the checkpoint records it if it was taken after).
    fn forget_drained_positions(&mut self) {
        for worker in &mut self.workers {
            worker.kept = None;
            worker.drain_read = None;
        }
    }

    /// What a simulated answer from `to` is as the gateway reads it: a refusal, a connection
    /// lost or an answer not in time are [`CallFault`]s, and an incarnation the chief's
    /// detector declared dead answers as such (the gateway refuses it as stale). The harness
    /// notes what each save read and what a draining worker reported.
    fn reply_of(
        &mut self,
        to: Node,
        route: &Route,
        resp: Result<Resp, NoReply>,
    ) -> Result<Reply, CallFault> {
        let resp = resp.map_err(|no_reply| CallFault::Unreachable(no_reply.to_string()))?;
        let declared = |world: &Self, incarnation: u64| {
            world.detector.get(&to).and_then(|d| d.declared) == Some(incarnation)
        };
        let reply = match resp {
            Resp::Done => Reply::Done,
            Resp::Refused(e) => return Err(CallFault::Refused(e)),
            Resp::Unavailable(e) => return Err(CallFault::Unreachable(e)),
            Resp::Run(RunResult::Committed) => {
                if matches!(to, Node::Worker(w) if w >= self.config.num_workers) {
                    self.ran_past_spec += 1;
                }
                // The simulated step's value is its closure id.
                let value = match route {
                    Route::Run { closure, .. } => closure.0.to_le_bytes().to_vec(),
                    _ => Vec::new(),
                };
                Reply::Ran(Ok(value))
            }
            Resp::Run(RunResult::PsUnavailable(ps)) => {
                let unavailable = PsUnavailable {
                    ps,
                    reason: "not serving".into(),
                };
                Reply::Ran(Err(RunClosureError::PsUnavailable(unavailable)))
            }
            Resp::Run(RunResult::Failed(error)) => Reply::Ran(Err(RunClosureError::Step(error))),
            Resp::Hello { incarnation } if declared(self, incarnation) => {
                Reply::DeclaredDead { incarnation }
            }
            Resp::Hello { incarnation } => Reply::Worker { incarnation },
            Resp::Probe { incarnation, .. } if declared(self, incarnation) => {
                Reply::DeclaredDead { incarnation }
            }
            Resp::Probe {
                incarnation,
                serving,
                generation,
                restoring,
                next_free,
            } => {
                let ps = match to {
                    Node::Ps(ps) => ps,
                    _ => 0,
                };
                let probe = ServerProbe {
                    ps,
                    incarnation,
                    generation,
                    next_free_closure_id: next_free,
                    serving,
                    restoring,
                };
                Reply::Server { probe }
            }
            Resp::Positions(list) => {
                if let Route::DrainPositions { worker, .. } = route {
                    let position = list.iter().find(|(name, _)| name == DATASET);
                    self.workers[*worker as usize].drain_read = position.map(|(_, at)| *at);
                }
                Reply::Positions(list)
            }
            Resp::Snapshot(id) => {
                // PS-1: the harness keeps the newest attempt's snapshot of each (read,
                // server, shard).
                if let Route::Snapshot {
                    ticket,
                    attempt,
                    ps,
                    shard,
                } = route
                {
                    let key = (*ticket, *ps, shard.clone());
                    let newest = self
                        .chief
                        .read
                        .get(&key)
                        .is_none_or(|(a, _)| *a <= *attempt);
                    if newest {
                        self.chief.read.insert(key, (*attempt, id));
                    }
                }
                Reply::Shard(self.snapshots[id].read.clone())
            }
        };
        Ok(reply)
    }
}

/// How often the low watermark may go out.
const WATERMARK_EVERY: Duration = Duration::from_secs(1);
