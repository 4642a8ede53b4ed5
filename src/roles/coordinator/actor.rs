//! The coordinator's actix shell: owns the [`Scheduler`] machine and runs the coordinator's
//! one [`executor`] on the actions it drains: each becomes remote calls bounded in time, which
//! this shell moves over QUIC, and whose outcomes the executor hands back to the machine as
//! `handle_*` events (the simulator runs the same executor over its simulated network). The
//! machine decides (whom to dial, set up, retire, fence, restore, ask for positions, and in
//! what order); this shell does IO and nothing else.
//!
//! - A closure's run is bounded by the scheduler's `step_timeout`, not by the gateway's call
//!   timeout: a long step is never cut while its worker heartbeats. Every other call is
//!   bounded by the gateway's call timeout.
//! - Every [`RECONNECT_INTERVAL`] the machine gets a reconnect tick (it dials workers without
//!   a live incarnation and parameter servers counted down); every [`WATERMARK_INTERVAL`] a
//!   watermark tick.
//! - The gateway's peer events (alive with an incarnation, declared dead) go to the machine.
//! - A remote reference is made per call from the incarnation the action names, so that a
//!   call never reaches a newer incarnation than the machine meant (FENCE-1).
//! - The checkpoint of a restore is read off the actor's thread and never cleaned up here.
//! - Fences and watermarks go to every parameter server; each server's answer is reported
//!   ([`Scheduler::handle_fence_sent`], [`Scheduler::handle_watermark_sent`]).
//! - The chief program's requests (start, create a variable, configure workers, read a cut for
//!   a save, mark it) go to the machine and are answered when the machine ends them: the
//!   program waits on a ticket, never on a remote call of its own.
//! - Elastic workers (the machine's `membership`): a worker's [`Joining`] gives the address a
//!   worker past the cluster spec is dialled at (its index is its certificate's); a
//!   [`Draining`] call is answered when the machine ends the drain.
//! - Preemption notices ([`Leaving`]) from workers are answered at once; a parameter server's
//!   is answered when the machine has taken its preemption cut, which this shell builds and
//!   writes off the actor's thread (copying tensors here would stall the node's heartbeats).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use cohort_actors::{
    Gateway, Incarnation, IncarnationId, PeerAddr, PeerEvent, Remote, RemoteError, RemoteMessage,
};
use cohort_transport::NodeId;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::executor::{self, Answer, Call, Delivered, Effect, Reply, Request};
use super::machine::recovery::{CallFault, CheckpointRef, LoadFault};
use super::machine::{
    ClosureFailure, ClosureId, ClosureState, ConfigureError, ConfigureTicket, CoordinatorStatus,
    CreateError, CreateTicket, CutReadError, CutReading, CutTicket, CutWriteError,
    DrainDisposition, KnownTask, MarkCutError, RestoreTicket, ScheduleError, Scheduler,
    ServerProbe, ShardRead, StartFailure,
};
use super::restore::{call_fault, load_at_cut, restore_shards};
use crate::checkpoint::Checkpoint;
use crate::cluster::TaskType;
use crate::layout::Layout;
use crate::roles::protocol::{
    BeginRestore, CreateVariable, DatasetPositions, DrainRefusal, Draining, InitSpec, JoinRefusal,
    Joining, LearningRate, LeaveAnswer, Leaving, PsStats, Retire, RewindWorker, RollBack,
    RunClosure, SetupWorker, Snapshot, COORDINATOR_ACTOR, PS_ACTOR, WORKER_ACTOR,
};

/// A parameter server waiting to hear whether it may leave the job.
type PsDrainWaiter = oneshot::Sender<Result<(), DrainRefusal>>;

/// Who waits for one closure's value.
type FetchWaiter = oneshot::Sender<Result<Vec<u8>, ClosureFailure>>;

/// The coordinator actor.
pub struct CoordinatorActor {
    gateway: Gateway,
    scheduler: Scheduler,
    workers: Vec<(NodeId, PeerAddr)>,
    /// Every parameter server ever in the job, by index, with where to dial it: the cluster
    /// spec's, and those that joined (the machine says which are in the job now).
    servers: BTreeMap<u32, (NodeId, PeerAddr)>,
    join_waiters: Vec<oneshot::Sender<Result<(), ClosureFailure>>>,
    fetch_waiters: HashMap<ClosureId, Vec<FetchWaiter>>,
    /// Who waits for the chief's start (or a restore at start-up), by ticket.
    restore_waiters: BTreeMap<RestoreTicket, oneshot::Sender<Result<Option<u64>, StartFailure>>>,
    /// Who waits for a variable's shards to be created, by ticket.
    create_waiters: BTreeMap<CreateTicket, oneshot::Sender<Result<(), CreateError>>>,
    /// Who waits for a save's read, by ticket.
    cut_waiters: BTreeMap<CutTicket, oneshot::Sender<Result<CutReading, CutReadError>>>,
    /// Who waits for a configuration to reach every live worker, by ticket.
    configure_waiters: BTreeMap<ConfigureTicket, oneshot::Sender<Result<(), ConfigureError>>>,
    /// Workers past the cluster spec that joined, with where to dial them (by index).
    joined: BTreeMap<u32, (NodeId, PeerAddr)>,
    /// Draining incarnations waiting for the machine to end their drain.
    drain_waiters: BTreeMap<(u32, u64), Vec<oneshot::Sender<()>>>,
    /// Parameter servers waiting for the answer to their preemption notice, by (index, incarnation).
    leave_waiters: BTreeMap<(u32, u64), Vec<oneshot::Sender<LeaveAnswer>>>,
    /// Parameter servers waiting to leave the job for good, by (index, incarnation).
    ps_drain_waiters: BTreeMap<(u32, u64), Vec<PsDrainWaiter>>,
    timer: Option<SpawnHandle>,
}

impl CoordinatorActor {
    /// A coordinator over `workers` and `servers` (index = task index).
    pub fn new(
        gateway: Gateway,
        scheduler: Scheduler,
        workers: Vec<(NodeId, PeerAddr)>,
        servers: Vec<(NodeId, PeerAddr)>,
    ) -> Self {
        let addresses = (0..)
            .zip(&servers)
            .map(|(ps, (_, addr))| (ps, addr.to_string()))
            .collect();
        let mut scheduler = scheduler
            .with_servers(servers.len() as u32)
            .with_server_addresses(addresses)
            .with_workers(workers.len() as u32);
        let setup = SetupWorker {
            // One input pipeline per worker the job may have: a worker that joins or leaves
            // never changes what the others read.
            num_workers: scheduler.workers_max(),
            layouts: Vec::new(),
            servers: Vec::new(),
            datasets: Vec::new(),
            // Stamped by the coordinator's machine when it hands the setup out.
            version: 0,
            generation: 0,
        };
        scheduler.handle_configure(setup);
        Self {
            gateway,
            scheduler,
            workers,
            servers: (0..).zip(servers).collect(),
            join_waiters: Vec::new(),
            fetch_waiters: HashMap::new(),
            restore_waiters: BTreeMap::new(),
            configure_waiters: BTreeMap::new(),
            create_waiters: BTreeMap::new(),
            cut_waiters: BTreeMap::new(),
            joined: BTreeMap::new(),
            drain_waiters: BTreeMap::new(),
            leave_waiters: BTreeMap::new(),
            ps_drain_waiters: BTreeMap::new(),
            timer: None,
        }
    }

    /// Carries out the scheduler's actions (the [`executor`]'s plan of each), answers
    /// waiters, re-arms the timer.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while let Some(action) = self.scheduler.poll_action() {
            for effect in executor::plan(&self.scheduler, Instant::now(), action) {
                match effect {
                    Effect::Call(call) => self.call(ctx, call),
                    Effect::Answer(answer) => self.answer(answer),
                    // The servers refuse the fenced incarnation's pushes once told (the
                    // fence's calls), and the machine its results: a call to it in flight
                    // ends as it ends.
                    Effect::Fenced { .. } => {}
                }
            }
        }
        self.answer_fetches();
        if self.scheduler.is_idle() && !self.join_waiters.is_empty() {
            let result = self.scheduler.take_error().map_or(Ok(()), Err);
            for waiter in self.join_waiters.drain(..) {
                let _ = waiter.send(result.clone());
            }
        }
        if let Some(handle) = self.timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(deadline) = self.scheduler.poll_timeout() {
            let delay = deadline.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(delay, |act, ctx| {
                act.scheduler.handle_timeout(Instant::now());
                act.drive(ctx);
            }));
        }
    }

    /// Sends one call off the actor; its outcome goes back to the machine through the
    /// executor's [`executor::deliver`], then the machine is driven.
    fn call(&mut self, ctx: &mut Context<Self>, call: Call) {
        let Call {
            request,
            bound,
            route,
        } = call;
        let outcome = self.outcome_of(request, bound);
        ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
            let delivered = executor::deliver(&mut act.scheduler, Instant::now(), route, outcome);
            if let Delivered::Committed { took, .. } = delivered {
                crate::metrics::instruments().observe_chief_step(took);
            }
            act.drive(ctx);
        }));
    }

    /// Tells whoever waits for a request the machine ended.
    fn answer(&mut self, answer: Answer) {
        match answer {
            Answer::Started { ticket, result } => tell(&mut self.restore_waiters, &ticket, result),
            Answer::Configured { ticket, result } => {
                tell(&mut self.configure_waiters, &ticket, result)
            }
            Answer::VariableCreated { ticket, result } => {
                tell(&mut self.create_waiters, &ticket, result)
            }
            Answer::CutRead { ticket, result } => tell(&mut self.cut_waiters, &ticket, result),
            Answer::Drained {
                worker,
                incarnation,
            } => {
                for waiter in self
                    .drain_waiters
                    .remove(&(worker, incarnation))
                    .unwrap_or_default()
                {
                    let _ = waiter.send(());
                }
            }
            Answer::PsLeaving {
                ps,
                incarnation,
                answer,
            } => {
                for waiter in self
                    .leave_waiters
                    .remove(&(ps, incarnation))
                    .unwrap_or_default()
                {
                    let _ = waiter.send(answer);
                }
            }
            Answer::PsDraining {
                ps,
                incarnation,
                result,
            } => {
                let waiters = self.ps_drain_waiters.remove(&(ps, incarnation));
                for waiter in waiters.unwrap_or_default() {
                    let _ = waiter.send(result.clone());
                }
            }
        }
    }

    /// The work that carries `request` out over the gateway (or, for the checkpoint
    /// storage, on a blocking thread), and what came of it. A remote reference is made from
    /// the incarnation the request names, so that it never reaches a newer one (FENCE-1).
    ///
    /// Longer than most functions here on purpose: one arm per [`Request`], each how that
    /// request travels, kept whole so that the shell's IO reads in one place.
    fn outcome_of(&self, request: Request, bound: Option<Duration>) -> BoxFuture<'static, Outcome> {
        let gateway = self.gateway.clone();
        let worker_at = |worker: u32, incarnation: u64| {
            self.worker_incarnation(worker, incarnation)
                .ok_or_else(|| no_such_worker(worker))
        };
        let server = |ps: u32| {
            self.servers
                .get(&ps)
                .cloned()
                .ok_or_else(|| no_such_server(ps))
        };
        let server_at = |ps: u32, incarnation: u64| {
            self.servers
                .get(&ps)
                .map(|(node, _)| Incarnation::new(node.clone(), IncarnationId(incarnation)))
                .ok_or_else(|| no_such_server(ps))
        };
        match request {
            Request::Run {
                worker,
                incarnation,
                msg,
            } => {
                let target = worker_at(worker, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<RunClosure>(target?, WORKER_ACTOR);
                    let reply = match bound {
                        Some(bound) => r.call_within(&msg, bound).await,
                        None => r.call(&msg).await,
                    };
                    // Whatever kept the answer from coming, the worker is lost for this
                    // closure: it runs elsewhere.
                    reply
                        .map(Reply::Ran)
                        .map_err(|e| CallFault::Unreachable(e.to_string()))
                })
            }
            Request::DialWorker { worker } => {
                let peer = self.worker_peer(worker);
                Box::pin(async move {
                    let (node, addr) = peer.ok_or_else(|| no_such_worker(worker))?;
                    match gateway.connect(addr, &node).await {
                        Ok(incarnation) => Ok(Reply::Worker {
                            incarnation: incarnation.incarnation.0,
                        }),
                        Err(e) => declared_dead(&gateway, &node, e),
                    }
                })
            }
            Request::Rewind {
                worker,
                incarnation,
                setup,
            } => {
                let target = worker_at(worker, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<RewindWorker>(target?, WORKER_ACTOR);
                    worker_reply(r.call(&RewindWorker { setup }).await).map(|()| Reply::Done)
                })
            }
            Request::Configure {
                worker,
                incarnation,
                setup,
            } => {
                let target = worker_at(worker, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<SetupWorker>(target?, WORKER_ACTOR);
                    worker_reply(r.call(&setup).await).map(|()| Reply::Done)
                })
            }
            Request::Positions {
                worker,
                incarnation,
            } => {
                let target = worker_at(worker, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<DatasetPositions>(target?, WORKER_ACTOR);
                    worker_reply(r.call(&DatasetPositions).await).map(Reply::Positions)
                })
            }
            Request::RetireWorker {
                worker,
                incarnation,
            } => {
                let peer = self.worker_peer(worker);
                Box::pin(async move {
                    let (node, addr) = peer.ok_or_else(|| no_such_worker(worker))?;
                    let fenced = Incarnation::new(node, IncarnationId(incarnation));
                    retire(&gateway, addr, fenced, WORKER_ACTOR)
                        .await
                        .map(|()| Reply::Done)
                })
            }
            Request::Stats { ps } => {
                let server = server(ps);
                Box::pin(async move {
                    let (node, addr) = server?;
                    let r = match gateway.resolve::<PsStats>(addr, &node, PS_ACTOR).await {
                        Ok(r) => r,
                        Err(e) => return declared_dead(&gateway, &node, e),
                    };
                    let stats = r.call(&PsStats).await.map_err(call_fault)?;
                    Ok(Reply::Server {
                        probe: ServerProbe {
                            ps,
                            incarnation: r.target().incarnation.0,
                            generation: stats.generation,
                            next_free_closure_id: stats.next_free_closure_id,
                            serving: stats.serving,
                            restoring: stats.restoring,
                        },
                    })
                })
            }
            Request::RetirePs { ps, incarnation } => {
                let server = server(ps);
                Box::pin(async move {
                    let (node, addr) = server?;
                    let fenced = Incarnation::new(node, IncarnationId(incarnation));
                    retire(&gateway, addr, fenced, PS_ACTOR)
                        .await
                        .map(|()| Reply::Done)
                })
            }
            Request::Fence { ps, msg } => Box::pin(tell_server(gateway, server(ps), msg)),
            Request::Watermark { ps, msg } => Box::pin(tell_server(gateway, server(ps), msg)),
            Request::BeginRestore {
                ps,
                incarnation,
                msg,
            } => {
                let target = server_at(ps, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<BeginRestore>(target?, PS_ACTOR);
                    r.call(&msg).await.map_err(call_fault)?;
                    Ok(Reply::Done)
                })
            }
            Request::RestoreShards {
                ps,
                incarnation,
                checkpoint,
                layouts,
            } => {
                let target = server_at(ps, incarnation);
                Box::pin(async move {
                    restore_shards(&gateway, target?, ps, layouts, checkpoint.0).await?;
                    Ok(Reply::Done)
                })
            }
            Request::RollBack {
                ps,
                incarnation,
                msg,
            } => {
                let target = server_at(ps, incarnation);
                Box::pin(async move {
                    let r = gateway.remote_ref::<RollBack>(target?, PS_ACTOR);
                    r.call(&msg).await.map_err(call_fault)?;
                    Ok(Reply::Done)
                })
            }
            Request::Create { ps, msg } => {
                let server = server(ps);
                Box::pin(async move {
                    let (node, addr) = server?;
                    let r = gateway
                        .resolve::<CreateVariable>(addr, &node, PS_ACTOR)
                        .await;
                    r.map_err(call_fault)?
                        .call(&msg)
                        .await
                        .map_err(call_fault)?
                        .map_err(|refusal| CallFault::Refused(refusal.to_string()))?;
                    Ok(Reply::Done)
                })
            }
            Request::Snapshot { ps, msg } => {
                let server = server(ps);
                Box::pin(async move {
                    let (node, addr) = server?;
                    let r = gateway.resolve::<Snapshot>(addr, &node, PS_ACTOR).await;
                    let (state, blobs) = r
                        .map_err(call_fault)?
                        .call_with_blobs(&msg, Vec::new())
                        .await
                        .map_err(call_fault)?;
                    let state = state.map_err(|refusal| CallFault::Refused(refusal.to_string()))?;
                    Ok(Reply::Shard(ShardRead { state, blobs }))
                })
            }
            Request::Load {
                generation,
                root,
                cut,
            } => Box::pin(load_checkpoint(generation, root, cut)),
            Request::WriteCut {
                cut,
                root,
                leaving,
                reading,
            } => Box::pin(write_preemption_cut(cut, root, leaving, *reading)),
        }
    }

    /// Worker `worker` and where to dial it, if the cluster spec names it or it joined.
    fn worker_peer(&self, worker: u32) -> Option<(NodeId, PeerAddr)> {
        self.workers
            .get(worker as usize)
            .or_else(|| self.joined.get(&worker))
            .cloned()
    }

    /// Incarnation `incarnation` of worker `worker`, if the cluster names that worker or it joined.
    fn worker_incarnation(&self, worker: u32, incarnation: u64) -> Option<Incarnation<NodeId>> {
        self.worker_peer(worker)
            .map(|(node, _)| Incarnation::new(node, IncarnationId(incarnation)))
    }

    fn answer_fetches(&mut self) {
        let ready: Vec<ClosureId> = self
            .fetch_waiters
            .keys()
            .copied()
            .filter(|id| {
                // A closure can finish and be forgotten in one event (more closures ending at
                // once than `finished_retained_max`): its waiters must still be answered.
                self.scheduler.is_forgotten(*id)
                    || matches!(
                        self.scheduler.state(*id),
                        Some(ClosureState::Committed(_) | ClosureState::Failed(_))
                    )
            })
            .collect();
        for id in ready {
            let result = match self.scheduler.state(id) {
                Some(ClosureState::Committed(v)) => Ok(v.clone()),
                Some(ClosureState::Failed(f)) => Err(f.clone()),
                None => Err(ClosureFailure::Forgotten(id)),
                _ => continue,
            };
            for waiter in self.fetch_waiters.remove(&id).unwrap_or_default() {
                let _ = waiter.send(result.clone());
            }
        }
    }

    fn ps_index(&self, node: &NodeId) -> Option<u32> {
        self.servers
            .iter()
            .find(|(_, (n, _))| n == node)
            .map(|(ps, _)| *ps)
    }

    /// The parameter servers of the job now, with where to dial each.
    fn servers_in_job(&self) -> Vec<(u32, (NodeId, PeerAddr))> {
        self.scheduler
            .servers_in_job()
            .into_iter()
            .filter_map(|ps| self.servers.get(&ps).map(|peer| (ps, peer.clone())))
            .collect()
    }

    fn worker_index(&self, node: &NodeId) -> Option<u32> {
        self.workers
            .iter()
            .position(|(n, _)| n == node)
            .map(|i| i as u32)
            .or_else(|| {
                self.joined
                    .iter()
                    .find(|(_, (n, _))| n == node)
                    .map(|(i, _)| *i)
            })
    }
}

/// Answers the program's wait under `ticket`, if it still waits (a wait given up is gone).
fn tell<K: Ord, T>(waiters: &mut BTreeMap<K, oneshot::Sender<T>>, ticket: &K, value: T) {
    if let Some(waiter) = waiters.remove(ticket) {
        let _ = waiter.send(value);
    }
}

/// A call for a parameter server the cluster spec does not name (a bug in the machine's
/// inputs): it can never succeed.
fn no_such_server(ps: u32) -> CallFault {
    CallFault::Refused(format!("no parameter server ps/{ps} in the cluster"))
}

/// A call for a worker the cluster spec does not name (a bug in the machine's inputs): it can
/// never succeed.
fn no_such_worker(worker: u32) -> CallFault {
    CallFault::Refused(format!("no worker worker/{worker} in the cluster"))
}

/// A worker's answer to a call whose reply carries the worker's own refusal (`Result<T, E>`):
/// that refusal (the worker answered: the request itself is wrong) or a call that failed (it
/// could not be reached, or answered too late).
fn worker_reply<T, E: std::fmt::Display>(
    reply: Result<Result<T, E>, RemoteError>,
) -> Result<T, CallFault> {
    match reply {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(refusal)) => Err(CallFault::Refused(refusal.to_string())),
        Err(e) => Err(CallFault::Unreachable(e.to_string())),
    }
}

/// The program's wait for a request the machine took under a ticket (`asked`), answered when
/// the machine ends it; a request the machine refused is answered at once with the refusal.
fn wait_for_ticket<K: Ord, T, E>(
    waiters: &mut BTreeMap<K, oneshot::Sender<Result<T, E>>>,
    asked: Result<K, E>,
) -> oneshot::Receiver<Result<T, E>> {
    let (done, rx) = oneshot::channel();
    match asked {
        Ok(ticket) => {
            waiters.insert(ticket, done);
        }
        Err(e) => {
            let _ = done.send(Err(e));
        }
    }
    rx
}

/// Tells the fenced incarnation `fenced` (its `actor`), at `addr`, to retire ([`Retire`]).
async fn retire(
    gateway: &Gateway,
    addr: PeerAddr,
    fenced: Incarnation<NodeId>,
    actor: &str,
) -> Result<(), CallFault> {
    let incarnation = fenced.incarnation.0;
    gateway
        .call_fenced::<Retire>(addr, &fenced, actor, &Retire { incarnation })
        .await
        .map_err(|e| {
            CallFault::Unreachable(format!("retiring fenced incarnation {incarnation}: {e}"))
        })
}

/// What came of a call: the answer, or why none came.
type Outcome = Result<Reply, CallFault>;

/// A connection to `node` that failed with `error`: an incarnation the gateway declared dead
/// that answered (a false death: frozen past the budget, then woken) is reported as such,
/// anything else as the call's fault.
fn declared_dead(gateway: &Gateway, node: &NodeId, error: RemoteError) -> Outcome {
    if let RemoteError::Stale { .. } = &error {
        if let Some((incarnation, false)) = gateway.peer_status(node) {
            return Ok(Reply::DeclaredDead {
                incarnation: incarnation.0,
            });
        }
    }
    Err(call_fault(error))
}

/// Tells whichever incarnation answers at a server's address (`server`, or why it has none)
/// `msg`, whose answer is nothing.
async fn tell_server<M: RemoteMessage<Reply = ()>>(
    gateway: Gateway,
    server: Result<(NodeId, PeerAddr), CallFault>,
    msg: M,
) -> Outcome {
    let (node, addr) = server?;
    let r = gateway.resolve::<M>(addr, &node, PS_ACTOR).await;
    r.map_err(call_fault)?
        .call(&msg)
        .await
        .map_err(call_fault)?;
    Ok(Reply::Done)
}

/// Reads the checkpoint taken at closure `cut` under `root` (blocking: off the actor).
async fn load_checkpoint(generation: u64, root: PathBuf, cut: ClosureId) -> Outcome {
    let shown = root.display().to_string();
    let result = tokio::task::spawn_blocking(move || load_at_cut(&root, cut.0))
        .await
        .map_err(|e| LoadFault::ReaderLost(Box::new(e)))
        .and_then(|loaded| loaded.map_err(LoadFault::from))
        .map(|loaded| loaded.map(|c| CheckpointRef(Arc::new(c))));
    match &result {
        Ok(Some(c)) => tracing::info!(
            "restore generation {generation}: the checkpoint taken at closure {} (step {}) under \
             {shown} is read",
            cut.0,
            c.0.step
        ),
        Ok(None) => tracing::warn!(
            "restore generation {generation}: no checkpoint taken at closure {} under {shown} \
             verifies any more (lost or damaged on disk); rolling back to the cut before it, if \
             one is kept",
            cut.0
        ),
        Err(_) => {}
    }
    Ok(Reply::Loaded(result))
}

/// Builds the checkpoint of a preemption cut and writes it under `root` (blocking: off the
/// actor). Logs what was saved, for whoever reads why a server left.
async fn write_preemption_cut(
    cut: ClosureId,
    root: PathBuf,
    leaving: Vec<u32>,
    reading: CutReading,
) -> Outcome {
    let servers = leaving
        .iter()
        .map(|ps| format!("ps/{ps}"))
        .collect::<Vec<_>>()
        .join(", ");
    // A cut with no server leaving is for servers joining or leaving the job (reshard).
    let (why, then) = if servers.is_empty() {
        (
            "servers joining or leaving the job".to_string(),
            "the variables move onto the new set of servers, and their restore runs no closure \
             again"
                .to_string(),
        )
    } else {
        (
            format!("preemption notice from {servers}"),
            format!("{servers} may leave, and its restore runs no closure again"),
        )
    };
    let written = tokio::task::spawn_blocking(move || write_cut_checkpoint(&root, reading)).await;
    let result = match written {
        Ok(Ok(saved)) => {
            tracing::warn!(
                "{why}: checkpoint of the cut at closure {} written to {} ({:.1} MB in {} ms, \
                 dispatch held meanwhile); {then}",
                cut.0,
                saved.dir.display(),
                saved.bytes as f64 / 1e6,
                saved.took.as_millis(),
            );
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(CutWriteError::WriterLost(Box::new(e))),
    };
    Ok(Reply::CutWritten(result))
}

impl Actor for CoordinatorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let mut events = self.gateway.subscribe();
        let me = ctx.address();
        // Ends when the actor stops (the send fails) or the gateway closes its event stream;
        // nothing for the machine to hear.
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                // `send` waits while the mailbox is full; `try_send` would fail then and end
                // this loop, and no later death would ever reach the scheduler.
                if me.send(PeerChanged(event)).await.is_err() {
                    break;
                }
            }
        });
        // Workers that got a preemption notice say so (a cluster without the actor's node
        // registered twice is a bug in the bootstrap: logged, and the notice then goes
        // unheard, the failure detector notices the worker's exit instead).
        if let Err(e) = self
            .gateway
            .register::<Leaving>(COORDINATOR_ACTOR, ctx.address().recipient())
        {
            tracing::error!("the coordinator cannot hear workers' preemption notices: {e}");
        }
        // Workers joining the job and leaving it for good (elastic workers).
        if let Err(e) = self
            .gateway
            .register::<Joining>(COORDINATOR_ACTOR, ctx.address().recipient())
            .and_then(|()| {
                self.gateway
                    .register::<Draining>(COORDINATOR_ACTOR, ctx.address().recipient())
            })
        {
            tracing::error!("the coordinator cannot hear workers joining or draining: {e}");
        }
        self.scheduler.handle_reconnect_tick();
        self.drive(ctx);
        ctx.run_interval(RECONNECT_INTERVAL, |act, ctx| {
            act.scheduler.handle_reconnect_tick();
            act.drive(ctx);
        });
        ctx.run_interval(WATERMARK_INTERVAL, |act, ctx| {
            act.scheduler.handle_watermark_tick();
            act.drive(ctx);
        });
    }
}

impl Handler<Remote<Leaving>> for CoordinatorActor {
    type Result = ResponseFuture<LeaveAnswer>;

    /// A worker or parameter server got a preemption notice: the machine decides whether it
    /// goes now (a worker's closures run elsewhere at once), after a cut (a parameter server),
    /// or stays (this chief is stopping too).
    fn handle(&mut self, msg: Remote<Leaving>, ctx: &mut Context<Self>) -> Self::Result {
        let incarnation = msg.from.incarnation.0;
        let stopping = crate::process::preemption_requested();
        if let Some(ps) = self.ps_index(&msg.from.node) {
            let answer =
                self.scheduler
                    .handle_ps_leaving(Instant::now(), ps, incarnation, stopping);
            let rx = match answer {
                Some(answer) => {
                    if answer == LeaveAnswer::Go {
                        tracing::warn!(
                            "ps/{ps} (incarnation {incarnation}) got a preemption notice and leaves now, \
                             with no cut taken for it"
                        );
                    }
                    self.drive(ctx);
                    return Box::pin(async move { answer });
                }
                None => {
                    tracing::warn!(
                        "ps/{ps} (incarnation {incarnation}) got a preemption notice: holding dispatch to \
                         take a checkpoint cut before it leaves"
                    );
                    let (tx, rx) = oneshot::channel();
                    self.leave_waiters
                        .entry((ps, incarnation))
                        .or_default()
                        .push(tx);
                    rx
                }
            };
            self.drive(ctx);
            // Dropped unanswered (the actor stopped): the server goes as if told to.
            return Box::pin(async move { rx.await.unwrap_or(LeaveAnswer::Go) });
        }
        let Some(worker) = self.worker_index(&msg.from.node) else {
            return Box::pin(async { LeaveAnswer::Go });
        };
        let answer =
            self.scheduler
                .handle_worker_leaving(Instant::now(), worker, incarnation, stopping);
        if answer == LeaveAnswer::Go {
            tracing::warn!(
                "worker/{worker} (incarnation {incarnation}) got a preemption notice and leaves: its \
                 closures run elsewhere now"
            );
        }
        self.drive(ctx);
        Box::pin(async move { answer })
    }
}

impl Handler<Remote<Joining>> for CoordinatorActor {
    type Result = MessageResult<Remote<Joining>>;

    /// A worker or parameter server registers: the machine decides whether it belongs to the
    /// job (its role and index are the ones its certificate names, SEC-1); one past the
    /// cluster spec is dialled at the address it gave.
    fn handle(&mut self, msg: Remote<Joining>, ctx: &mut Context<Self>) -> Self::Result {
        let node = msg.from.node.clone();
        let index = node.index;
        let incarnation = msg.from.incarnation.0;
        let is_ps = node.role == TaskType::Ps.as_str();
        let in_spec = if is_ps {
            self.scheduler.is_spec_server(index)
        } else {
            (index as usize) < self.workers.len()
        };
        if !in_spec
            && msg
                .msg
                .addr
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return MessageResult(Err(JoinRefusal::BadAddress {
                task: node.to_string(),
                addr: msg.msg.addr,
            }));
        }
        let answer = if is_ps {
            let answer = self.scheduler.handle_ps_joining(
                Instant::now(),
                index,
                incarnation,
                msg.msg.addr.clone(),
            );
            if answer.is_ok() && !in_spec {
                self.servers
                    .insert(index, (node, PeerAddr::new(&msg.msg.addr)));
            }
            answer
        } else {
            let answer = self
                .scheduler
                .handle_worker_joining(Instant::now(), index, incarnation);
            if answer.is_ok() && !in_spec {
                let known = self.joined.get(&index).map(|(_, a)| a.to_string());
                if known.as_deref() != Some(msg.msg.addr.as_str()) {
                    tracing::info!(
                        "worker/{index} (incarnation {incarnation}) joins the job at {}",
                        msg.msg.addr
                    );
                    self.joined
                        .insert(index, (node, PeerAddr::new(&msg.msg.addr)));
                }
            }
            answer
        };
        if let Err(refusal) = &answer {
            tracing::warn!("{refusal}");
        }
        self.drive(ctx);
        MessageResult(answer)
    }
}

impl Handler<Remote<Draining>> for CoordinatorActor {
    type Result = ResponseFuture<Result<(), DrainRefusal>>;

    /// A worker or parameter server leaves the job for good: answered once the machine has
    /// drained it (a worker) or moved its variables onto the other servers (a server).
    fn handle(&mut self, msg: Remote<Draining>, ctx: &mut Context<Self>) -> Self::Result {
        let incarnation = msg.from.incarnation.0;
        if let Some(ps) = self.ps_index(&msg.from.node) {
            let (done, rx) = oneshot::channel();
            tracing::info!("ps/{ps} (incarnation {incarnation}) asks to leave the job");
            match self
                .scheduler
                .handle_ps_draining(Instant::now(), ps, incarnation)
            {
                Ok(true) => {
                    let _ = done.send(Ok(()));
                }
                Ok(false) => self
                    .ps_drain_waiters
                    .entry((ps, incarnation))
                    .or_default()
                    .push(done),
                Err(refusal) => {
                    tracing::warn!("{refusal}");
                    let _ = done.send(Err(refusal));
                }
            }
            self.drive(ctx);
            return Box::pin(async move {
                rx.await.unwrap_or_else(|_| {
                    Err(DrainRefusal::Failed {
                        ps,
                        reason: "the coordinator stopped".into(),
                    })
                })
            });
        }
        let (worker_done, worker_rx) = oneshot::channel();
        match self.worker_index(&msg.from.node) {
            Some(worker) => {
                tracing::info!(
                    "worker/{worker} (incarnation {incarnation}) is draining out of the job"
                );
                match self
                    .scheduler
                    .handle_worker_draining(Instant::now(), worker, incarnation)
                {
                    DrainDisposition::Done => {
                        let _ = worker_done.send(());
                    }
                    DrainDisposition::Pending => self
                        .drain_waiters
                        .entry((worker, incarnation))
                        .or_default()
                        .push(worker_done),
                }
            }
            None => {
                let _ = worker_done.send(());
            }
        }
        self.drive(ctx);
        Box::pin(async move {
            let _ = worker_rx.await;
            Ok(())
        })
    }
}

/// The chief got a stop request (its own preemption notice): a parameter server's
/// preemption cut under way is given up and its servers stay, to serve the program's own
/// checkpoint (see [`Scheduler::handle_chief_stopping`]).
pub struct ChiefStopping;

impl Message for ChiefStopping {
    type Result = ();
}

impl Handler<ChiefStopping> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, _: ChiefStopping, ctx: &mut Context<Self>) {
        self.scheduler.handle_chief_stopping(Instant::now());
        self.drive(ctx);
    }
}

/// What writing a preemption cut's checkpoint produced.
struct SavedCut {
    dir: PathBuf,
    bytes: u64,
    took: Duration,
}

/// Builds the checkpoint of `reading` and saves it durably under `root` (keeping the newest
/// two: CKPT-1, an older one goes only once the new one verifies). Blocking.
fn write_cut_checkpoint(
    root: &std::path::Path,
    reading: CutReading,
) -> Result<SavedCut, CutWriteError> {
    use crate::checkpoint::{CheckpointManager, CheckpointPolicy};
    let started = Instant::now();
    let checkpoint = reading.into_checkpoint()?;
    // A cut at the same closure as one written before (nothing finished or ran since: two
    // changes in a row, say) holds the same rows: the one on disk serves.
    let existing = root.join(crate::checkpoint::checkpoint_dir_name(checkpoint.step));
    if let Ok(loaded) = crate::checkpoint::read_checkpoint(&existing) {
        if loaded.checkpoint.ledger.next_closure_id == checkpoint.ledger.next_closure_id {
            return Ok(SavedCut {
                bytes: dir_bytes(&existing),
                dir: existing,
                took: started.elapsed(),
            });
        }
    }
    let policy = CheckpointPolicy {
        keep_last: 2,
        ..Default::default()
    };
    let mut manager = CheckpointManager::new(root, policy, started)?;
    let dir = manager
        .save(&checkpoint, Instant::now())
        .map_err(|source| CutWriteError::Save {
            root: root.to_path_buf(),
            source,
        })?;
    Ok(SavedCut {
        bytes: dir_bytes(&dir),
        dir,
        took: started.elapsed(),
    })
}

/// The bytes of the files directly in `dir` (0 if it cannot be read).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

struct PeerChanged(PeerEvent);

impl Message for PeerChanged {
    type Result = ();
}

impl Handler<PeerChanged> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: PeerChanged, ctx: &mut Context<Self>) {
        if let PeerEvent::Alive(incarnation) = &msg.0 {
            if let Some(ps) = self.ps_index(&incarnation.node) {
                self.scheduler
                    .handle_ps_up(Instant::now(), ps, incarnation.incarnation.0);
                self.drive(ctx);
            }
            return;
        }
        if let PeerEvent::Dead { incarnation, cause } = msg.0 {
            if let Some(ps) = self.ps_index(&incarnation.node) {
                if self.scheduler.servers_in_job().contains(&ps) {
                    tracing::warn!(
                        "ps/{ps} (incarnation {}) declared dead: {cause:?}; holding dispatch until it \
                         is back and restored",
                        incarnation.incarnation.0
                    );
                } else {
                    // Left the job: its exit is expected.
                    tracing::debug!(
                        "ps/{ps} (incarnation {}), out of the job, is gone: {cause:?}",
                        incarnation.incarnation.0
                    );
                }
                self.scheduler
                    .handle_ps_lost(Instant::now(), ps, incarnation.incarnation.0);
                self.drive(ctx);
            } else if let Some(worker) = self.worker_index(&incarnation.node) {
                if self.scheduler.is_member(worker) {
                    tracing::warn!(
                        "worker/{worker} (incarnation {}) declared dead: {cause:?}",
                        incarnation.incarnation.0
                    );
                } else {
                    // Drained out of the job: its exit is expected.
                    tracing::debug!(
                        "worker/{worker} (incarnation {}), drained, is gone: {cause:?}",
                        incarnation.incarnation.0
                    );
                }
                self.scheduler.handle_worker_lost(
                    Instant::now(),
                    worker,
                    incarnation.incarnation.0,
                );
                self.drive(ctx);
            } else {
                tracing::warn!(
                    "{} (incarnation {}) declared dead: {cause:?}",
                    incarnation.node,
                    incarnation.incarnation.0
                );
            }
        }
    }
}

/// Queue a closure.
pub struct Schedule {
    /// Registered function name.
    pub function: String,
    /// Encoded arguments.
    pub args: Vec<u8>,
}

impl Message for Schedule {
    type Result = Result<ClosureId, ScheduleError>;
}

impl Handler<Schedule> for CoordinatorActor {
    type Result = Result<ClosureId, ScheduleError>;

    fn handle(&mut self, msg: Schedule, ctx: &mut Context<Self>) -> Self::Result {
        let id = self
            .scheduler
            .handle_schedule(Instant::now(), &msg.function, msg.args)?;
        self.drive(ctx);
        Ok(id)
    }
}

/// The learning rate the closures scheduled from now on carry (`None`: the servers' own);
/// see [`Scheduler::handle_set_learning_rate`].
pub struct SetLearningRate(pub Option<LearningRate>);

impl Message for SetLearningRate {
    type Result = ();
}

impl Handler<SetLearningRate> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: SetLearningRate, _: &mut Context<Self>) {
        self.scheduler.handle_set_learning_rate(msg.0);
    }
}

/// Wait until nothing is queued or in flight; the first failure since the last join, if any.
pub struct Join;

impl Message for Join {
    type Result = oneshot::Receiver<Result<(), ClosureFailure>>;
}

impl Handler<Join> for CoordinatorActor {
    type Result = MessageResult<Join>;

    fn handle(&mut self, _: Join, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.join_waiters.push(tx);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// Wait for one closure's value.
pub struct Fetch(pub ClosureId);

impl Message for Fetch {
    type Result = oneshot::Receiver<Result<Vec<u8>, ClosureFailure>>;
}

impl Handler<Fetch> for CoordinatorActor {
    type Result = MessageResult<Fetch>;

    fn handle(&mut self, msg: Fetch, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        if self.scheduler.is_forgotten(msg.0) {
            let _ = tx.send(Err(ClosureFailure::Forgotten(msg.0)));
            return MessageResult(rx);
        }
        if self.scheduler.state(msg.0).is_none() {
            let _ = tx.send(Err(ClosureFailure::Unavailable {
                closure: msg.0,
                reason: "never scheduled here".into(),
            }));
            return MessageResult(rx);
        }
        self.fetch_waiters.entry(msg.0).or_default().push(tx);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// The ledger, whether nothing is pending, and the live workers.
pub struct Status;

impl Message for Status {
    type Result = CoordinatorStatus;
}

impl Handler<Status> for CoordinatorActor {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.scheduler.status())
    }
}

/// The ledger and the counters of remote effects (preemption cuts among them), as the
/// chief's metrics endpoint reads them at scrape time.
pub struct Counters;

impl Message for Counters {
    type Result = (CoordinatorStatus, super::ControlCounters);
}

impl Handler<Counters> for CoordinatorActor {
    type Result = MessageResult<Counters>;

    fn handle(&mut self, _: Counters, _: &mut Context<Self>) -> Self::Result {
        MessageResult((self.scheduler.status(), self.scheduler.control_counters()))
    }
}

/// The cluster as the coordinator knows it, for the chief's status page: every task the
/// machine knows of with where it is dialled, its newest incarnation, its liveness, and how
/// long the failure detector has heard nothing from it; the ledger; the checkpoint cut.
/// Answered from memory (no call goes out), bounded by the cluster's size.
pub struct StatusView;

/// The answer to [`StatusView`].
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// Tasks: the chief first, then parameter servers and workers by index.
    pub tasks: Vec<crate::status::TaskStatus>,
    /// The ledger (LEDGER-1).
    pub ledger: crate::ledger::Ledger,
    /// The cut of the newest checkpoint the machine restores from (a closure id), if any.
    pub cut: Option<u64>,
}

/// The status page's state of a task the machine sees as `liveness`, silent for `silence`
/// (with the failure detector's timeout) when the detector watches it: a live task silent for
/// more than half the timeout is suspected.
fn task_state(
    liveness: super::machine::TaskLiveness,
    silence: Option<(Duration, Duration)>,
) -> crate::status::TaskState {
    use super::machine::TaskLiveness;
    use crate::status::TaskState;
    match liveness {
        TaskLiveness::Waiting => TaskState::Waiting,
        TaskLiveness::Alive => match silence {
            Some((silent, timeout)) if silent > timeout / 2 => TaskState::Suspected,
            _ => TaskState::Alive,
        },
        TaskLiveness::Dead => TaskState::Dead,
        TaskLiveness::Draining => TaskState::Draining,
        TaskLiveness::Retired => TaskState::Retired,
    }
}

impl Message for StatusView {
    type Result = ClusterView;
}

impl Handler<StatusView> for CoordinatorActor {
    type Result = MessageResult<StatusView>;

    fn handle(&mut self, _: StatusView, _: &mut Context<Self>) -> Self::Result {
        use crate::status::{TaskState, TaskStatus};
        let own = self.gateway.incarnation();
        let address = self
            .gateway
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut tasks = vec![TaskStatus {
            role: "chief".into(),
            index: 0,
            address,
            incarnation: Some(own.incarnation.0),
            state: TaskState::Alive,
            heartbeat_age_ms: None,
        }];
        let silence = |peer: Option<&(NodeId, PeerAddr)>| {
            peer.and_then(|(node, _)| self.gateway.peer_silence(node))
        };
        let mut add = |role: &str, known: KnownTask, peer: Option<&(NodeId, PeerAddr)>| {
            let heard = silence(peer);
            tasks.push(TaskStatus {
                role: role.into(),
                index: known.index,
                address: peer.map(|(_, addr)| addr.to_string()).unwrap_or_default(),
                incarnation: known.incarnation,
                state: task_state(known.liveness, heard),
                heartbeat_age_ms: heard.map(|(age, _)| age.as_millis() as u64),
            });
        };
        for known in self.scheduler.known_servers() {
            add("ps", known, self.servers.get(&known.index));
        }
        for known in self.scheduler.known_workers() {
            let peer = self
                .workers
                .get(known.index as usize)
                .or_else(|| self.joined.get(&known.index));
            add("worker", known, peer);
        }
        MessageResult(ClusterView {
            tasks,
            ledger: self.scheduler.ledger().clone(),
            cut: self.scheduler.cut().map(|c| c.0),
        })
    }
}

/// The job's parameter servers now and where their variables are: what the chief's program
/// reads variables with (servers may have joined or left since it placed them, see the
/// machine's `reshard`).
pub struct Topology;

/// The answer to [`Topology`].
#[derive(Debug, Clone)]
pub struct ServerTopology {
    /// The parameter servers of the job, by index, with where to dial each.
    pub servers: BTreeMap<u32, (NodeId, PeerAddr)>,
    /// Every variable's layout, as placed now.
    pub layouts: Vec<Layout>,
}

impl Message for Topology {
    type Result = ServerTopology;
}

impl Handler<Topology> for CoordinatorActor {
    type Result = MessageResult<Topology>;

    fn handle(&mut self, _: Topology, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ServerTopology {
            servers: self.servers_in_job().into_iter().collect(),
            layouts: self.scheduler.layouts().to_vec(),
        })
    }
}

/// The workers past the cluster spec that are members of the job now (they joined and were
/// not drained since), with where they are dialled: the chief's goodbye at the end of a job
/// reaches them too.
pub struct JoinedWorkers;

impl Message for JoinedWorkers {
    type Result = Vec<(NodeId, PeerAddr)>;
}

impl Handler<JoinedWorkers> for CoordinatorActor {
    type Result = MessageResult<JoinedWorkers>;

    fn handle(&mut self, _: JoinedWorkers, _: &mut Context<Self>) -> Self::Result {
        let members = self.scheduler.members();
        MessageResult(
            self.joined
                .iter()
                .filter(|(worker, _)| members.contains(worker))
                .map(|(_, peer)| peer.clone())
                .collect(),
        )
    }
}

/// Replace what every worker incarnation is set up with (layouts, datasets); see
/// [`Scheduler::handle_reconfigure`]. The reply comes once every live worker answered, with
/// the first setup one refused (e.g. an unregistered dataset function).
pub struct Configure(pub SetupWorker);

impl Message for Configure {
    type Result = oneshot::Receiver<Result<(), ConfigureError>>;
}

impl Handler<Configure> for CoordinatorActor {
    type Result = MessageResult<Configure>;

    fn handle(&mut self, msg: Configure, ctx: &mut Context<Self>) -> Self::Result {
        let asked = self.scheduler.handle_reconfigure(Instant::now(), msg.0);
        let rx = wait_for_ticket(&mut self.configure_waiters, asked);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// The chief's start (see [`Scheduler::handle_start`]): probe every parameter server, then
/// restore `checkpoint` (read from `root`), or start afresh when there is none and no server
/// has trained. The reply carries the step restored (`None`: afresh) once the start ended, or
/// why the chief cannot start.
pub struct Start {
    /// The newest checkpoint that verifies, if any.
    pub checkpoint: Option<Arc<Checkpoint>>,
    /// The checkpoint root directory: a later recovery restores from there.
    pub root: PathBuf,
}

impl Message for Start {
    type Result = oneshot::Receiver<Result<Option<u64>, StartFailure>>;
}

impl Handler<Start> for CoordinatorActor {
    type Result = MessageResult<Start>;

    fn handle(&mut self, msg: Start, ctx: &mut Context<Self>) -> Self::Result {
        let asked = self
            .scheduler
            .handle_start(Instant::now(), msg.checkpoint, msg.root);
        let rx = wait_for_ticket(&mut self.restore_waiters, asked);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// Create every shard of a variable (see [`Scheduler::handle_create_variable`]). The reply
/// says once every shard answered: `Ok`, or the first failure.
pub struct CreateShards {
    /// Where the variable's shards live.
    pub layout: Layout,
    /// Each shard's initial value, in shard order.
    pub inits: Vec<InitSpec>,
}

impl Message for CreateShards {
    type Result = oneshot::Receiver<Result<(), CreateError>>;
}

impl Handler<CreateShards> for CoordinatorActor {
    type Result = MessageResult<CreateShards>;

    fn handle(&mut self, msg: CreateShards, ctx: &mut Context<Self>) -> Self::Result {
        let asked = self
            .scheduler
            .handle_create_variable(Instant::now(), &msg.layout, msg.inits);
        let rx = wait_for_ticket(&mut self.create_waiters, asked);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// Read a consistent cut of every parameter server for a checkpoint at `step` (see
/// [`Scheduler::handle_read_cut`]). The reply carries the checkpoint to write, or why none
/// can be taken.
pub struct ReadCut {
    /// The checkpoint's step.
    pub step: u64,
}

impl Message for ReadCut {
    type Result = oneshot::Receiver<Result<CutReading, CutReadError>>;
}

impl Handler<ReadCut> for CoordinatorActor {
    type Result = MessageResult<ReadCut>;

    fn handle(&mut self, msg: ReadCut, ctx: &mut Context<Self>) -> Self::Result {
        let asked = self.scheduler.handle_read_cut(Instant::now(), msg.step);
        let rx = wait_for_ticket(&mut self.cut_waiters, asked);
        self.drive(ctx);
        MessageResult(rx)
    }
}

/// A checkpoint taken at `cut` (the next closure id then, with nothing pending) is durable
/// under `root`: a parameter-server recovery restores from there and rolls back to `cut`
/// (see [`Scheduler::handle_mark_cut`]).
pub struct MarkCut {
    /// The cut.
    pub cut: ClosureId,
    /// The checkpoint root directory.
    pub root: PathBuf,
    /// The restore generation the checkpoint was read in, if known: refused if a restore
    /// began since (the checkpoint would be from before it, CKPT-1).
    pub generation: Option<u64>,
}

impl Message for MarkCut {
    type Result = Result<(), MarkCutError>;
}

impl Handler<MarkCut> for CoordinatorActor {
    type Result = Result<(), MarkCutError>;

    fn handle(&mut self, msg: MarkCut, ctx: &mut Context<Self>) -> Self::Result {
        let marked = self
            .scheduler
            .handle_mark_cut(msg.cut, msg.root, msg.generation);
        // A recovery that waited for this checkpoint may restore from it now.
        self.drive(ctx);
        marked
    }
}

/// The checkpoint of the cut `cut` could not be written, or did not read back whole: it never
/// becomes the cut (see [`Scheduler::handle_cut_abandoned`]).
pub struct AbandonCut {
    /// The cut read for it.
    pub cut: ClosureId,
    /// Why it was not written.
    pub reason: String,
}

impl Message for AbandonCut {
    type Result = ();
}

impl Handler<AbandonCut> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: AbandonCut, ctx: &mut Context<Self>) -> Self::Result {
        self.scheduler.handle_cut_abandoned(msg.cut, &msg.reason);
        self.drive(ctx);
    }
}

/// How often the machine gets a reconnect tick: workers without a live incarnation are
/// dialled (and fenced ones that still answer are retired), and parameter servers counted
/// down are dialled.
const RECONNECT_INTERVAL: Duration = Duration::from_millis(200);
/// How often the low watermark goes to the parameter servers when it has risen: each keeps
/// about this long's worth of applied closure ids for PS-1.
const WATERMARK_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::task_state;
    use crate::roles::coordinator::TaskLiveness;
    use crate::status::TaskState;

    #[test]
    fn a_silent_live_task_is_suspected() {
        let timeout = Duration::from_secs(3);
        let of = |silent| task_state(TaskLiveness::Alive, Some((silent, timeout)));
        assert_eq!(of(Duration::from_millis(100)), TaskState::Alive);
        assert_eq!(of(Duration::from_secs(2)), TaskState::Suspected);
        assert_eq!(
            task_state(TaskLiveness::Dead, Some((Duration::ZERO, timeout))),
            TaskState::Dead
        );
    }

    use super::*;
    use crate::roles::coordinator::SchedulerConfig;
    use crate::roles::coordinator::{WorkerPositions, DATASET_POSITIONS_KEY};
    use crate::roles::protocol::{PositionsError, RunClosureError, SetupError, WorkerRefusal};
    use cohort_actors::{RefusedReason, Remote};
    use cohort_transport::ClusterCa;

    fn gateway(ca: &ClusterCa, node: &NodeId, incarnation: u64) -> Gateway {
        crate::roles::test_support::loopback_gateway(ca, node, incarnation, Duration::from_secs(5))
    }

    fn run(test: impl std::future::Future<Output = ()>) {
        System::new().block_on(async move {
            tokio::time::timeout(Duration::from_secs(30), test)
                .await
                .expect("test timed out");
        });
    }

    /// LEDGER-1 seen from `fetch`: a closure that fails and is forgotten in the same event
    /// (more closures end at once than are retained) still answers its waiter.
    #[test]
    fn ledger_1_fetch_of_a_closure_forgotten_as_it_finished_is_answered() {
        run(async {
            let ca = ClusterCa::generate("test").unwrap();
            let chief = gateway(&ca, &NodeId::new("chief", 0), 1);
            let scheduler = Scheduler::new(SchedulerConfig {
                no_worker_wait_max: Duration::from_millis(50),
                finished_retained_max: 1,
                ..SchedulerConfig::default()
            });
            let actor = CoordinatorActor::new(chief, scheduler, Vec::new(), Vec::new()).start();
            let mut ids = Vec::new();
            for _ in 0..3 {
                let schedule = Schedule {
                    function: "step".into(),
                    args: Vec::new(),
                };
                ids.push(actor.send(schedule).await.unwrap().unwrap());
            }
            let rx = actor.send(Fetch(ids[0])).await.unwrap();
            let answer = tokio::time::timeout(Duration::from_secs(5), rx)
                .await
                .expect("the fetch waiter was never answered")
                .unwrap();
            assert_eq!(answer, Err(ClosureFailure::Forgotten(ids[0])));
            let CoordinatorStatus { ledger, idle, .. } = actor.send(Status).await.unwrap();
            assert!(
                idle && ledger.balances() && ledger.unavailable == 3,
                "{ledger:?}"
            );
        });
    }

    /// A setup a live worker refuses (an unregistered dataset function) reaches the program
    /// through `Configure` instead of silently losing the worker.
    #[test]
    fn configure_reports_a_setup_the_worker_refused() {
        run(async {
            let ca = ClusterCa::generate("test").unwrap();
            let worker_node = NodeId::new("worker", 0);
            let worker = gateway(&ca, &worker_node, 7);
            worker
                .register_fn::<SetupWorker, _, _>(
                    WORKER_ACTOR,
                    |m: Remote<SetupWorker>| async move {
                        Ok::<_, RefusedReason>(match m.msg.datasets.first() {
                            Some((name, _)) => Err(SetupError::UnknownDataset(name.clone())),
                            None => Ok(()),
                        })
                    },
                )
                .unwrap();
            // A new incarnation is set up from scratch (datasets rebuilt at their positions).
            worker
                .register_fn::<RewindWorker, _, _>(WORKER_ACTOR, |_: Remote<RewindWorker>| async {
                    Ok::<_, RefusedReason>(Ok(()))
                })
                .unwrap();
            let workers = vec![(worker_node, worker.local_addr().unwrap().into())];
            let chief = gateway(&ca, &NodeId::new("chief", 0), 1);
            let scheduler = Scheduler::new(SchedulerConfig::default());
            let actor = CoordinatorActor::new(chief, scheduler, workers, Vec::new()).start();
            while actor.send(Status).await.unwrap().live_workers < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let setup = SetupWorker {
                num_workers: 1,
                layouts: Vec::new(),
                servers: Vec::new(),
                datasets: vec![("missing".into(), 0)],
                version: 0,
                generation: 0,
            };
            let rx = actor.send(Configure(setup)).await.unwrap();
            let err = rx.await.unwrap().unwrap_err();
            assert!(
                matches!(&err, ConfigureError::Refused { worker: 0, reason } if reason.contains("missing")),
                "{err}"
            );
        });
    }
    /// A save survives a worker fault: a worker that cannot report its dataset positions is
    /// lost (fenced, restarted as a new incarnation) and the checkpoint records where that
    /// incarnation will start, instead of the whole save failing.
    #[test]
    fn a_worker_lost_while_positions_are_collected_does_not_fail_the_save() {
        run(async {
            let ca = ClusterCa::generate("test").unwrap();
            let mut workers = Vec::new();
            let mut gateways = Vec::new();
            for index in 0..2u32 {
                let node = NodeId::new("worker", index);
                let worker = gateway(&ca, &node, 7);
                worker
                    .register_fn::<RewindWorker, _, _>(
                        WORKER_ACTOR,
                        |_: Remote<RewindWorker>| async { Ok::<_, RefusedReason>(Ok(())) },
                    )
                    .unwrap();
                worker
                    .register_fn::<DatasetPositions, _, _>(
                        WORKER_ACTOR,
                        move |_: Remote<DatasetPositions>| async move {
                            Ok::<_, RefusedReason>(match index {
                                0 => Ok(vec![("ids".to_string(), 7)]),
                                _ => Err(PositionsError::Refused(WorkerRefusal::ComputeStopped)),
                            })
                        },
                    )
                    .unwrap();
                workers.push((node, worker.local_addr().unwrap().into()));
                gateways.push(worker);
            }
            let chief = gateway(&ca, &NodeId::new("chief", 0), 1);
            let scheduler = Scheduler::new(SchedulerConfig::default());
            let actor = CoordinatorActor::new(chief, scheduler, workers, Vec::new()).start();
            while actor.send(Status).await.unwrap().live_workers < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let rx = actor.send(ReadCut { step: 3 }).await.unwrap();
            let reading = tokio::time::timeout(Duration::from_secs(10), rx)
                .await
                .expect("the cut was never read")
                .unwrap()
                .expect("the save survives the worker's fault");
            let ckpt = &reading.into_checkpoint().unwrap();
            let expected: WorkerPositions = [(0, [("ids".to_string(), 7)].into_iter().collect())]
                .into_iter()
                .collect();
            let recorded: WorkerPositions =
                serde_json::from_value(ckpt.extra[DATASET_POSITIONS_KEY].clone()).unwrap();
            assert_eq!(recorded, expected);
            assert_eq!(ckpt.dataset_positions[&0], 7);
            let live = actor.send(Status).await.unwrap().live_workers;
            assert_eq!(live, 1, "the worker that could not report is lost");
        });
    }

    /// A worker incarnation that comes up while a restore runs is brought up only once the
    /// restore is over, at the dataset positions it restored (never at the old ones, and never
    /// left out of the rewind).
    #[test]
    fn a_worker_that_comes_up_during_a_restore_is_set_up_at_the_restored_positions() {
        use crate::checkpoint::{Checkpoint, CheckpointManager, CheckpointPolicy};
        use crate::roles::protocol::{PsStatsReply, WorkerRefusal};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};

        let root = std::env::temp_dir().join(format!(
            "cohort-restore-positions-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let mut ckpt = Checkpoint::new(1, 1);
        ckpt.extra = serde_json::json!({
            super::super::machine::recovery::DATASET_POSITIONS_KEY: { "0": { "ids": 5 } }
        });
        CheckpointManager::new(&root, CheckpointPolicy::default(), Instant::now())
            .unwrap()
            .save(&ckpt, Instant::now())
            .unwrap();
        let ckpt_root = root.clone();
        run(async move {
            let ca = ClusterCa::generate("test").unwrap();
            // ps/0 answers the dial holding no variable (its state is lost) once the cut is
            // marked, and holds the restore open until the worker has been up for a while.
            let ps_node = NodeId::new("ps", 0);
            let ps = gateway(&ca, &ps_node, 3);
            let cut_marked = Arc::new(AtomicBool::new(false));
            let marked = Arc::clone(&cut_marked);
            ps.register_fn::<PsStats, _, _>(PS_ACTOR, move |_: Remote<PsStats>| {
                let marked = Arc::clone(&marked);
                async move {
                    while !marked.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok::<_, RefusedReason>(PsStatsReply::default())
                }
            })
            .unwrap();
            let worker_node = NodeId::new("worker", 0);
            let worker = gateway(&ca, &worker_node, 7);
            // The datasets (name, elements to skip) of every setup the worker received.
            type Setups = Mutex<Vec<Vec<(String, u64)>>>;
            let setups: Arc<Setups> = Arc::default();
            let begun = Arc::new(AtomicBool::new(false));
            {
                let worker = worker.clone();
                let setups = Arc::clone(&setups);
                let begun = Arc::clone(&begun);
                ps.register_fn::<BeginRestore, _, _>(PS_ACTOR, move |_: Remote<BeginRestore>| {
                    let worker = worker.clone();
                    let setups = Arc::clone(&setups);
                    let begun = Arc::clone(&begun);
                    async move {
                        if !begun.swap(true, Ordering::SeqCst) {
                            // The worker comes up now; reconnect rounds (every 200 ms) could
                            // set it up while the restore is held open.
                            let _ = worker.register_fn::<RewindWorker, _, _>(
                                WORKER_ACTOR,
                                move |m: Remote<RewindWorker>| {
                                    setups.lock().unwrap().push(m.msg.setup.datasets.clone());
                                    async { Ok::<_, RefusedReason>(Ok(())) }
                                },
                            );
                            let _ = worker.register_fn::<RunClosure, _, _>(
                                WORKER_ACTOR,
                                |_: Remote<RunClosure>| async {
                                    Ok::<_, RefusedReason>(Err(RunClosureError::Refused(
                                        WorkerRefusal::ComputeStopped,
                                    )))
                                },
                            );
                            tokio::time::sleep(RECONNECT_INTERVAL * 4).await;
                        }
                        Ok::<_, RefusedReason>(())
                    }
                })
                .unwrap();
            }
            ps.register_fn::<RollBack, _, _>(PS_ACTOR, |_: Remote<RollBack>| async {
                Ok::<_, RefusedReason>(())
            })
            .unwrap();
            let chief = gateway(&ca, &NodeId::new("chief", 0), 1);
            let mut scheduler = Scheduler::new(SchedulerConfig::default());
            scheduler.mark_cut(ClosureId(0), ckpt_root.clone()).unwrap();
            let servers = vec![(ps_node, ps.local_addr().unwrap().into())];
            let workers = vec![(worker_node, worker.local_addr().unwrap().into())];
            let actor = CoordinatorActor::new(chief, scheduler, workers, servers).start();
            let setup = SetupWorker {
                num_workers: 1,
                layouts: Vec::new(),
                servers: Vec::new(),
                datasets: vec![("ids".into(), 0)],
                version: 0,
                generation: 0,
            };
            actor
                .send(Configure(setup))
                .await
                .unwrap()
                .await
                .unwrap()
                .unwrap();
            let mark = MarkCut {
                cut: ClosureId(0),
                root: ckpt_root,
                generation: None,
            };
            actor.send(mark).await.unwrap().unwrap();
            cut_marked.store(true, Ordering::SeqCst);
            while actor.send(Status).await.unwrap().live_workers < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let ledger = actor.send(Status).await.unwrap().ledger;
            assert_eq!(ledger.ps_restores, 1, "{ledger:?}");
            // A reconnect round that began just before the restore may still deliver a setup
            // at the old positions; the coordinator discards that round (its setup version is
            // outdated) and sets the worker up again. What counts is the setup that brought
            // the worker up: the last one it received.
            let setups = setups.lock().unwrap().clone();
            assert_eq!(
                setups.last(),
                Some(&vec![("ids".to_string(), 5)]),
                "the worker was brought up at the old positions: {setups:?}"
            );
        });
        let _ = std::fs::remove_dir_all(&root);
    }
}
