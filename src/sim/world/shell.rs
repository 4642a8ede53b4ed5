//! The coordinator's shell: what the coordinator actor does around its machine
//! ([`Scheduler`](crate::roles::coordinator::Scheduler)). It carries out every
//! [`SchedulerAction`] (calls to workers and servers, each bounded in time, and answers), turns
//! each call's reply (or why none came) into the machine's `handle_*` input, hands the
//! messages that reach the chief to the machine, and runs the coordinator's periodic work. It
//! decides nothing itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::Node;
use super::job::{skip_of, DATASET};
use super::network::{Msg, Req, Resp, RunResult};
use super::storage::LOAD_DELAY;
use super::{Event, ProcState, World};
use crate::roles::coordinator::{
    CallFault, ClosureId, ConfigureTicket, CutTicket, PositionsTicket, PsDial, RestoreCall,
    RestoreReport, RestoreTicket, ResultDisposition, SchedulerAction, ServerProbe, WorkerDial,
};
use crate::roles::protocol::SetupWorker;

/// A coordinator call in flight: to which incarnation of which node, and what it is for.
pub(super) struct Call {
    pub(super) to: Node,
    pub(super) epoch: u64,
    pub(super) kind: CallKind,
}

/// What a call is for: where its reply goes in the machine.
#[derive(Debug, Clone)]
pub(super) enum CallKind {
    Run {
        worker: u32,
        epoch: u64,
        closure: u64,
        attempt: u32,
    },
    Dial {
        worker: u32,
    },
    SetUp {
        worker: u32,
        epoch: u64,
        version: u64,
    },
    Reconfigure {
        ticket: ConfigureTicket,
        worker: u32,
        epoch: u64,
    },
    Positions {
        ticket: PositionsTicket,
        worker: u32,
        epoch: u64,
    },
    DrainPositions {
        worker: u32,
        epoch: u64,
    },
    Probe {
        ps: u32,
    },
    RetireWorker {
        worker: u32,
        epoch: u64,
    },
    RetirePs {
        ps: u32,
        epoch: u64,
    },
    Fence {
        worker: u32,
        epoch: u64,
        ps: u32,
    },
    Watermark {
        ps: u32,
    },
    Restore {
        generation: u64,
        call: RestoreCall,
    },
    Snapshot {
        ticket: CutTicket,
        attempt: u32,
        ps: u32,
        shard: String,
    },
    /// A new chief incarnation probes a server before restoring.
    StartProbe {
        ticket: RestoreTicket,
        ps: u32,
    },
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
    #[error("{node} (incarnation {epoch}): connection lost")]
    ConnectionLost {
        /// The callee.
        node: Node,
        /// Its incarnation.
        epoch: u64,
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
            Msg::Leaving { worker, epoch } => {
                // As the coordinator actor: the simulated chief is not stopping itself (its
                // own preemption is a chief fault).
                let now = self.instant();
                let answer = self.coord.handle_worker_leaving(now, worker, epoch, false);
                let msg = Msg::LeaveAnswer(answer);
                self.send(Node::Chief, Node::Worker(worker), epoch, msg);
            }
            Msg::Draining { worker, epoch } => {
                let now = self.instant();
                if self.coord.handle_worker_draining(now, worker, epoch)
                    == crate::roles::coordinator::DrainDisposition::Done
                {
                    self.send(Node::Chief, Node::Worker(worker), epoch, Msg::Drained);
                }
            }
            Msg::Joining { worker, epoch } => {
                let now = self.instant();
                let _ = self.coord.handle_worker_joining(now, worker, epoch);
            }
            Msg::PsJoining { ps, epoch } => {
                // Refusals cannot happen here (the job has a checkpoint directory and few
                // servers); a refused server would stay out and exit.
                let now = self.instant();
                let addr = format!("ps{ps}:2222");
                let _ = self.coord.handle_ps_joining(now, ps, epoch, addr);
            }
            Msg::PsDraining { ps, epoch } => {
                let now = self.instant();
                let go = match self.coord.handle_ps_draining(now, ps, epoch) {
                    Ok(true) => Some(true),
                    Ok(false) => None,
                    Err(_) => Some(false),
                };
                if let Some(go) = go {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::PsDrainAnswer { go });
                }
            }
            Msg::PsLeaving { ps, epoch } => {
                let now = self.instant();
                if let Some(answer) = self.coord.handle_ps_leaving(now, ps, epoch, false) {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::LeaveAnswer(answer));
                }
            }
            _ => {}
        }
    }

    /// A call's outcome: its reply, or why none came.
    pub(super) fn on_reply(&mut self, call: u64, resp: Result<Resp, NoReply>) {
        let Some(Call { kind, .. }) = self.calls.remove(&call) else {
            return; // answered already (a duplicate), or given up
        };
        let now = self.instant();
        match kind {
            CallKind::Run {
                worker,
                epoch,
                closure,
                attempt,
            } => self.run_replied(now, worker, epoch, closure, attempt, resp),
            CallKind::Dial { worker } => {
                let dial = self.worker_dial(worker, resp);
                self.coord.handle_worker_dialled(now, worker, dial);
            }
            CallKind::SetUp {
                worker,
                epoch,
                version,
            } => {
                let result = call_result(resp);
                self.coord
                    .handle_worker_set_up(now, worker, epoch, version, result);
            }
            CallKind::Reconfigure {
                ticket,
                worker,
                epoch,
            } => {
                let result = call_result(resp);
                self.coord
                    .handle_reconfigured(now, ticket, worker, epoch, result);
            }
            CallKind::Positions {
                ticket,
                worker,
                epoch,
            } => {
                let result = positions_of(resp);
                self.coord
                    .handle_positions(now, ticket, worker, epoch, result);
            }
            CallKind::DrainPositions { worker, epoch } => {
                if let Ok(Resp::Positions(list)) = &resp {
                    let position = list.iter().find(|(name, _)| name == DATASET);
                    self.workers[worker as usize].drain_read = position.map(|(_, at)| *at);
                }
                let result = positions_of(resp);
                self.coord
                    .handle_drain_positions(now, worker, epoch, result);
            }
            CallKind::RetireWorker { worker, epoch } => {
                self.coord
                    .handle_worker_retired(worker, epoch, call_result(resp));
            }
            CallKind::RetirePs { ps, epoch } => {
                self.coord.handle_ps_retired(ps, epoch, call_result(resp));
            }
            CallKind::Fence { worker, epoch, ps } => {
                self.coord
                    .handle_fence_sent(worker, epoch, ps, call_result(resp));
            }
            CallKind::Watermark { ps } => {
                self.coord.handle_watermark_sent(ps, call_result(resp));
            }
            CallKind::Probe { ps } => {
                let dial = self.ps_dial(ps, resp);
                self.coord.handle_ps_dialled(now, ps, dial);
            }
            CallKind::Restore { generation, call } => {
                if let Some(report) = restore_report(call, resp) {
                    self.coord.handle_restore_report(now, generation, report);
                }
            }
            CallKind::Snapshot {
                ticket,
                attempt,
                ps,
                shard,
            } => self.shard_read(now, ticket, attempt, ps, shard, resp),
            CallKind::StartProbe { ticket, ps } => {
                let result = start_probe(ps, resp);
                self.coord.handle_server_probed(now, ticket, ps, result);
            }
        }
    }

    /// Carries out what the scheduler asks, until it asks nothing more.
    ///
    /// Longer than most functions here on purpose: a flat table with one arm per
    /// [`SchedulerAction`], each a call or one of the helpers below, kept whole so that what
    /// the shell does for every action reads in one place (as the coordinator actor's does).
    pub(super) fn drive(&mut self) {
        while let Some(action) = self.coord.poll_action() {
            match action {
                SchedulerAction::Dispatch {
                    worker,
                    epoch,
                    closure,
                    attempt,
                    generation,
                    ..
                } => self.dispatch(worker, epoch, closure, attempt, generation),
                SchedulerAction::Fence { worker, epoch } => self.fence(worker, epoch),
                SchedulerAction::Watermark {
                    finished_below,
                    generation,
                } => self.send_watermark(finished_below, generation),
                SchedulerAction::Restore(call) => self.restore_call(call),
                SchedulerAction::DialPs { ps } => {
                    let node = Node::Ps(ps);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    self.call(node, epoch, CallKind::Probe { ps }, Req::Probe, bound);
                }
                SchedulerAction::RetirePs { ps, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::RetirePs { ps, epoch };
                    self.call(Node::Ps(ps), epoch, kind, Req::Retire, bound);
                }
                SchedulerAction::RestoreFinished { ticket, result } => {
                    self.startup_restored(ticket, result)
                }
                SchedulerAction::DialWorker { worker } => {
                    let node = Node::Worker(worker);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    self.call(node, epoch, CallKind::Dial { worker }, Req::Hello, bound);
                }
                SchedulerAction::SetUpWorker {
                    worker,
                    epoch,
                    version,
                    setup,
                } => self.set_up_worker(worker, epoch, version, &setup),
                SchedulerAction::RetireWorker { worker, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::RetireWorker { worker, epoch };
                    self.call(Node::Worker(worker), epoch, kind, Req::Retire, bound);
                }
                SchedulerAction::Reconfigure {
                    ticket,
                    worker,
                    epoch,
                    setup,
                } => self.reconfigure(ticket, worker, epoch, &setup),
                SchedulerAction::AskPositions {
                    ticket,
                    worker,
                    epoch,
                } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::Positions {
                        ticket,
                        worker,
                        epoch,
                    };
                    self.call(Node::Worker(worker), epoch, kind, Req::Positions, bound);
                }
                SchedulerAction::SnapshotShard {
                    ticket,
                    attempt,
                    ps,
                    shard,
                } => self.snapshot_shard(ticket, attempt, ps, shard),
                SchedulerAction::CutRead { ticket, result } => self.cut_read(ticket, result),
                SchedulerAction::WritePreemptionCut {
                    ticket,
                    root,
                    reading,
                    ..
                } => self.write_preemption_cut(ticket, root, *reading),
                SchedulerAction::AnswerPsLeaving { ps, epoch, answer } => {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::LeaveAnswer(answer));
                }
                SchedulerAction::AnswerPsDraining { ps, epoch, result } => {
                    let go = result.is_ok();
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::PsDrainAnswer { go });
                }
                SchedulerAction::ProbeServer { ticket, ps } => {
                    let node = Node::Ps(ps);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    let kind = CallKind::StartProbe { ticket, ps };
                    self.call(node, epoch, kind, Req::Probe, bound);
                }
                // The simulated job's variables exist from the servers' first start, as a
                // chief program creates them before anything else; it creates none later.
                SchedulerAction::CreateShard { .. } | SchedulerAction::VariableCreated { .. } => {}
                // The program's wait for a configuration: the simulated chief configures once,
                // before any worker is up.
                SchedulerAction::ConfigureFinished { .. } => {}
                SchedulerAction::AskDrainPositions { worker, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::DrainPositions { worker, epoch };
                    self.call(Node::Worker(worker), epoch, kind, Req::Positions, bound);
                }
                SchedulerAction::DrainFinished { worker, epoch } => {
                    self.send(Node::Chief, Node::Worker(worker), epoch, Msg::Drained);
                }
            }
        }
    }

    /// Fails every pending call to `node`'s incarnation `epoch` (its connection is gone).
    pub(super) fn fail_calls(&mut self, node: Node, epoch: u64) {
        let lost: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.to == node && c.epoch == epoch)
            .map(|(id, _)| *id)
            .collect();
        for call in lost {
            self.on_reply(call, Err(NoReply::ConnectionLost { node, epoch }));
        }
    }

    /// Calls incarnation `epoch` of `to` with `req`; its reply (or none within `bound`) comes
    /// back to [`World::on_reply`] as `kind` says.
    fn call(&mut self, to: Node, epoch: u64, kind: CallKind, req: Req, bound: Duration) {
        let call = self.next_call;
        self.next_call += 1;
        self.calls.insert(call, Call { to, epoch, kind });
        self.send(Node::Chief, to, epoch, Msg::Request { call, req });
        self.at(self.now + bound, Event::CallTimeout { call });
    }

    /// Carries out one call of the restore machine (the load is no call: the checkpoint is
    /// read from the simulated storage after a delay).
    fn restore_call(&mut self, call: RestoreCall) {
        let bound = self.config.call_timeout;
        match &call {
            RestoreCall::Begin {
                ps,
                epoch,
                generation,
                fences,
            } => {
                let req = Req::Begin {
                    generation: *generation,
                    fences: fences.clone(),
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Ps(*ps), *epoch, kind, req, bound);
            }
            RestoreCall::Load {
                generation, cut, ..
            } => {
                let event = Event::Loaded {
                    generation: *generation,
                    cut: cut.0,
                };
                self.at(self.now + LOAD_DELAY, event);
            }
            RestoreCall::Shards {
                ps,
                epoch,
                generation,
                checkpoint,
                layouts,
            } => {
                let layouts = self.intern_layouts(layouts);
                let stored = checkpoint.0.step as usize;
                // A restore puts every worker at the checkpoint's positions: what a drain kept
                // before it no longer holds (the checkpoint records it if it was taken after).
                for worker in &mut self.workers {
                    worker.kept = None;
                    worker.drain_read = None;
                }
                self.restored_from.insert(*generation, stored);
                self.restoring.insert(stored, Arc::clone(&checkpoint.0));
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(
                    Node::Ps(*ps),
                    *epoch,
                    kind,
                    Req::Shards { stored, layouts },
                    bound,
                );
            }
            RestoreCall::RollBack {
                ps,
                epoch,
                generation,
                finished_below,
            } => {
                let req = Req::RollBack {
                    below: finished_below.0,
                    generation: *generation,
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Ps(*ps), *epoch, kind, req, bound);
            }
            RestoreCall::Rewind {
                worker,
                epoch,
                generation,
                setup,
            } => {
                let req = Req::Rewind {
                    version: setup.version,
                    chief: self.chief_epoch,
                    skip: skip_of(setup),
                    layouts: self.intern_layouts(&setup.layouts),
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Worker(*worker), *epoch, kind, req, bound);
            }
        }
    }

    /// Worker `w`'s answer to closure call `closure` (attempt `attempt`, to incarnation
    /// `epoch`) goes to the machine; FENCE-1: a result from an incarnation fenced must not
    /// commit.
    fn run_replied(
        &mut self,
        now: Instant,
        worker: u32,
        epoch: u64,
        closure: u64,
        attempt: u32,
        resp: Result<Resp, NoReply>,
    ) {
        let id = ClosureId(closure);
        match resp {
            Ok(Resp::Run(RunResult::Committed)) => {
                let disposition = self.coord.handle_result(
                    now,
                    worker,
                    epoch,
                    id,
                    attempt,
                    Ok(closure.to_le_bytes().to_vec()),
                );
                if disposition == ResultDisposition::Committed
                    && self.fenced.get(&worker).is_some_and(|f| epoch <= *f)
                {
                    self.violate(
                        "FENCE-1",
                        format!(
                            "closure {closure} committed from fenced worker/{worker} epoch {epoch}"
                        ),
                    );
                }
            }
            Ok(Resp::Run(RunResult::PsUnavailable(ps))) => {
                self.coord
                    .handle_ps_unavailable(now, worker, epoch, id, attempt, ps);
            }
            Ok(Resp::Run(RunResult::Failed(error))) => {
                let error = crate::roles::coordinator::ClosureOutcomeError::Step(error);
                self.coord
                    .handle_result(now, worker, epoch, id, attempt, Err(error));
            }
            Ok(Resp::Refused(_)) => {
                self.coord.handle_refused(now, worker, epoch, id, attempt);
            }
            Ok(_) | Err(_) => self.coord.handle_worker_lost(now, worker, epoch),
        }
    }

    /// What a dial of worker `worker` found: the incarnation that answered (one the
    /// detector declared dead already is reported so), or nothing.
    fn worker_dial(&self, worker: u32, resp: Result<Resp, NoReply>) -> WorkerDial {
        match resp {
            Ok(Resp::Hello { epoch }) => {
                let node = Node::Worker(worker);
                let declared = self.detector.get(&node).and_then(|d| d.declared);
                if declared == Some(epoch) {
                    WorkerDial::DeclaredDead { epoch }
                } else {
                    WorkerDial::Answered { epoch }
                }
            }
            _ => WorkerDial::Unreachable,
        }
    }

    /// What a probe of server `ps` found, as [`World::worker_dial`] for a worker.
    fn ps_dial(&self, ps: u32, resp: Result<Resp, NoReply>) -> PsDial {
        match resp {
            Ok(Resp::Probe { epoch, serving, .. }) => {
                let declared = self.detector.get(&Node::Ps(ps)).and_then(|d| d.declared);
                if declared == Some(epoch) {
                    PsDial::DeclaredDead { epoch }
                } else {
                    PsDial::Answered { epoch, serving }
                }
            }
            _ => PsDial::Unreachable,
        }
    }

    /// A server's answer to a shard read for a save: the machine hears it, and the harness
    /// keeps the newest attempt's snapshot of each (read, server, shard) (PS-1).
    fn shard_read(
        &mut self,
        now: Instant,
        ticket: CutTicket,
        attempt: u32,
        ps: u32,
        shard: String,
        resp: Result<Resp, NoReply>,
    ) {
        let result = match resp {
            Ok(Resp::Snapshot(id)) => {
                let newest = self
                    .chief
                    .read
                    .get(&(ticket, ps, shard.clone()))
                    .is_none_or(|(a, _)| *a <= attempt);
                if newest {
                    let key = (ticket, ps, shard.clone());
                    self.chief.read.insert(key, (attempt, id));
                }
                Ok(self.snapshots[id].read.clone())
            }
            other => Err(answer_fault(other)),
        };
        self.coord
            .handle_shard_read(now, ticket, attempt, ps, &shard, result);
    }

    /// Sends closure `closure` (attempt `attempt`, restore generation `generation`) to
    /// incarnation `epoch` of `worker`; PS-1 across chief restarts is checked as an id is
    /// given out for the first time.
    fn dispatch(
        &mut self,
        worker: u32,
        epoch: u64,
        closure: ClosureId,
        attempt: u32,
        generation: u64,
    ) {
        let kind = CallKind::Run {
            worker,
            epoch,
            closure: closure.0,
            attempt,
        };
        let req = Req::Run {
            closure: closure.0,
            attempt,
            generation,
            chief: self.chief_epoch,
        };
        if self.dispatched.insert(closure.0) {
            self.check_fresh_id(closure.0);
        }
        let bound = self.coord.config().step_timeout;
        self.call(Node::Worker(worker), epoch, kind, req, bound);
    }

    /// Fences incarnation `epoch` of `worker` on every server in the job (FENCE-1 records
    /// it), and drops the connection to it: calls to that incarnation fail now.
    fn fence(&mut self, worker: u32, epoch: u64) {
        let fenced = self.fenced.entry(worker).or_insert(epoch);
        *fenced = (*fenced).max(epoch);
        for ps in self.coord.servers_in_job() {
            let node = Node::Ps(ps);
            let to_epoch = self.state(node).1;
            let kind = CallKind::Fence { worker, epoch, ps };
            let req = Req::Fence { worker, epoch };
            self.call(node, to_epoch, kind, req, self.config.call_timeout);
        }
        // Dropping the connection: calls to that incarnation fail now.
        self.fail_calls(Node::Worker(worker), epoch);
    }

    /// Sends the low watermark to every server in the job.
    fn send_watermark(&mut self, finished_below: ClosureId, generation: u64) {
        for ps in self.coord.servers_in_job() {
            let node = Node::Ps(ps);
            let to_epoch = self.state(node).1;
            let req = Req::Watermark {
                below: finished_below.0,
                generation,
            };
            let kind = CallKind::Watermark { ps };
            self.call(node, to_epoch, kind, req, self.config.call_timeout);
        }
    }

    /// Sets incarnation `epoch` of `worker` up (setup `version`).
    fn set_up_worker(&mut self, worker: u32, epoch: u64, version: u64, setup: &SetupWorker) {
        let kind = CallKind::SetUp {
            worker,
            epoch,
            version,
        };
        let req = Req::SetUp {
            version,
            chief: self.chief_epoch,
            skip: skip_of(setup),
            layouts: self.intern_layouts(&setup.layouts),
        };
        let bound = self.config.call_timeout;
        self.call(Node::Worker(worker), epoch, kind, req, bound);
    }

    /// Sends the live incarnation `epoch` of `worker` its new setup.
    fn reconfigure(
        &mut self,
        ticket: ConfigureTicket,
        worker: u32,
        epoch: u64,
        setup: &SetupWorker,
    ) {
        let bound = self.config.call_timeout;
        let kind = CallKind::Reconfigure {
            ticket,
            worker,
            epoch,
        };
        let req = Req::Configure {
            version: setup.version,
            chief: self.chief_epoch,
            skip: skip_of(setup),
            layouts: self.intern_layouts(&setup.layouts),
        };
        self.call(Node::Worker(worker), epoch, kind, req, bound);
    }

    /// Reads one shard of server `ps` for a cut.
    fn snapshot_shard(&mut self, ticket: CutTicket, attempt: u32, ps: u32, shard: String) {
        // As the real shell: whichever incarnation answers at the server's address.
        let node = Node::Ps(ps);
        let epoch = self.state(node).1;
        let bound = self.config.call_timeout;
        let req = Req::Snapshot {
            shard: shard.clone(),
        };
        let kind = CallKind::Snapshot {
            ticket,
            attempt,
            ps,
            shard,
        };
        self.call(node, epoch, kind, req, bound);
    }
}

/// A call's outcome as the machine hears it: done, refused (the callee answered no), or
/// unreachable (no answer, or the connection was lost).
fn call_result(resp: Result<Resp, NoReply>) -> Result<(), CallFault> {
    match resp {
        Ok(Resp::Done) => Ok(()),
        Ok(Resp::Refused(e)) => Err(CallFault::Refused(e)),
        Ok(Resp::Unavailable(e)) => Err(CallFault::Unreachable(e)),
        Ok(other) => Err(CallFault::Refused(format!("unexpected answer {other:?}"))),
        Err(e) => Err(CallFault::Unreachable(e.to_string())),
    }
}

/// Why a call that asked for an answer of its own got none: the fault [`call_result`] finds,
/// or a refusal when the callee answered something else.
fn answer_fault(resp: Result<Resp, NoReply>) -> CallFault {
    call_result(resp)
        .err()
        .unwrap_or_else(|| CallFault::Refused("unexpected answer".into()))
}

/// A positions request's outcome: the worker's datasets' positions, or why none came.
fn positions_of(resp: Result<Resp, NoReply>) -> Result<Vec<(String, u64)>, CallFault> {
    match resp {
        Ok(Resp::Positions(list)) => Ok(list),
        other => Err(answer_fault(other)),
    }
}

/// A restore call's outcome as the restore machine hears it (`None` for the load, which is
/// no call: its outcome comes as [`Event::Loaded`]).
fn restore_report(call: RestoreCall, resp: Result<Resp, NoReply>) -> Option<RestoreReport> {
    let fault = call_result;
    let report = match call {
        RestoreCall::Begin { ps, .. } => RestoreReport::Begun {
            ps,
            result: fault(resp),
        },
        RestoreCall::Shards { ps, .. } => RestoreReport::ShardsRestored {
            ps,
            result: fault(resp),
        },
        RestoreCall::RollBack { ps, .. } => RestoreReport::RolledBack {
            ps,
            result: fault(resp),
        },
        RestoreCall::Rewind { worker, epoch, .. } => RestoreReport::Rewound {
            worker,
            epoch,
            result: fault(resp),
        },
        RestoreCall::Load { .. } => return None,
    };
    Some(report)
}

/// A new chief's probe of server `ps` before its start restores: what the server holds, or
/// why it did not answer.
fn start_probe(ps: u32, resp: Result<Resp, NoReply>) -> Result<ServerProbe, CallFault> {
    match resp {
        Ok(Resp::Probe {
            epoch,
            generation,
            next_free,
            ..
        }) => Ok(ServerProbe {
            ps,
            epoch,
            generation,
            next_free_closure_id: next_free,
        }),
        other => Err(answer_fault(other)),
    }
}

/// How often the low watermark may go out.
const WATERMARK_EVERY: Duration = Duration::from_secs(1);
