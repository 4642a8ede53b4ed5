//! The coordinator's actix shell: owns the [`Scheduler`] machine and carries out the actions
//! it drains, each a remote call bounded in time whose outcome goes back to the machine as a
//! `handle_*` event. The machine decides (whom to dial, set up, retire, fence, restore, ask
//! for positions, and in what order); this shell does IO and nothing else.
//!
//! - A closure's run is bounded by the scheduler's `step_timeout`, not by the gateway's call
//!   timeout: a long step is never cut while its worker heartbeats. Every other call is
//!   bounded by the gateway's call timeout.
//! - Every [`RECONNECT_INTERVAL`] the machine gets a reconnect tick (it dials workers without
//!   a live incarnation and parameter servers counted down); every [`WATERMARK_INTERVAL`] a
//!   watermark tick.
//! - The gateway's peer events (alive with an epoch, declared dead) go to the machine.
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
use cohort_actors::{Epoch, Gateway, Incarnation, PeerAddr, PeerEvent, Remote, RemoteError};
use cohort_transport::NodeId;
use tokio::sync::oneshot;

use super::machine::recovery::{CallFault, CheckpointRef, LoadFault, RestoreCall, RestoreReport};
use super::machine::{
    ClosureFailure, ClosureId, ClosureOutcomeError, ClosureState, ConfigureError, ConfigureTicket,
    CoordinatorStatus, CreateError, CreateTicket, CutReadError, CutReading, CutTicket,
    CutWriteError, DrainDisposition, KnownTask, MarkCutError, PositionsTicket, PsDial,
    RestoreTicket, ResultDisposition, ScheduleError, Scheduler, SchedulerAction, ServerProbe,
    SetUpDisposition, ShardRead, StartFailure, WorkerDial,
};
use super::restore::{call_fault, load_at_cut, restore_shards};
use crate::checkpoint::Checkpoint;
use crate::cluster::TaskType;
use crate::layout::Layout;
use crate::roles::protocol::{
    BeginRestore, CreateVariable, DatasetPositions, DrainRefusal, Draining, FenceWorker,
    FinishedBelow, InitSpec, JoinRefusal, Joining, LearningRate, LeaveAnswer, Leaving, PsStats,
    Retire, RewindWorker, RollBack, RunClosure, RunClosureError, SetupWorker, Snapshot,
    COORDINATOR_ACTOR, PS_ACTOR, WORKER_ACTOR,
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
    /// Parameter servers waiting for the answer to their preemption notice, by (index, epoch).
    leave_waiters: BTreeMap<(u32, u64), Vec<oneshot::Sender<LeaveAnswer>>>,
    /// Parameter servers waiting to leave the job for good, by (index, epoch).
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

    /// Carries out the scheduler's actions, answers waiters, re-arms the timer.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while let Some(action) = self.scheduler.poll_action() {
            match action {
                SchedulerAction::Dispatch {
                    worker,
                    epoch,
                    closure,
                    attempt,
                    generation,
                    function,
                    args,
                    learning_rate,
                } => {
                    let servers = (0..self.scheduler.server_span())
                        .map(|ps| self.scheduler.ps_epoch(ps).map_or(0, |(epoch, _)| epoch))
                        .collect();
                    let msg = RunClosure {
                        closure: closure.0,
                        attempt,
                        generation,
                        function,
                        args,
                        servers,
                        learning_rate,
                    };
                    self.dispatch(ctx, worker, epoch, msg);
                }
                SchedulerAction::Fence { worker, epoch } => self.fence(ctx, worker, epoch),
                SchedulerAction::Restore(call) => self.restore_call(ctx, call),
                SchedulerAction::RestoreFinished { ticket, result } => {
                    if let Some(waiter) = self.restore_waiters.remove(&ticket) {
                        let _ = waiter.send(result);
                    }
                }
                SchedulerAction::Watermark {
                    finished_below,
                    generation,
                } => self.send_watermark(ctx, finished_below, generation),
                SchedulerAction::DialPs { ps } => self.dial_ps(ctx, ps),
                SchedulerAction::RetirePs { ps, epoch } => self.retire_ps(ctx, ps, epoch),
                SchedulerAction::DialWorker { worker } => self.dial_worker(ctx, worker),
                SchedulerAction::SetUpWorker {
                    worker,
                    epoch,
                    setup,
                    version,
                } => self.set_up_worker(ctx, worker, epoch, setup, version),
                SchedulerAction::RetireWorker { worker, epoch } => {
                    self.retire_worker(ctx, worker, epoch)
                }
                SchedulerAction::Reconfigure {
                    ticket,
                    worker,
                    epoch,
                    setup,
                } => self.reconfigure(ctx, ticket, worker, epoch, setup),
                SchedulerAction::ConfigureFinished { ticket, result } => {
                    if let Some(waiter) = self.configure_waiters.remove(&ticket) {
                        let _ = waiter.send(result);
                    }
                }
                SchedulerAction::AskPositions {
                    ticket,
                    worker,
                    epoch,
                } => self.ask_positions(ctx, ticket, worker, epoch),
                SchedulerAction::CreateShard {
                    ticket,
                    ps,
                    shard,
                    msg,
                } => self.create_shard(ctx, ticket, ps, shard, msg),
                SchedulerAction::VariableCreated { ticket, result } => {
                    if let Some(waiter) = self.create_waiters.remove(&ticket) {
                        let _ = waiter.send(result);
                    }
                }
                SchedulerAction::ProbeServer { ticket, ps } => self.probe_server(ctx, ticket, ps),
                SchedulerAction::SnapshotShard {
                    ticket,
                    attempt,
                    ps,
                    shard,
                } => self.snapshot_shard(ctx, ticket, attempt, ps, shard),
                SchedulerAction::CutRead { ticket, result } => {
                    if let Some(waiter) = self.cut_waiters.remove(&ticket) {
                        let _ = waiter.send(result);
                    }
                }
                SchedulerAction::AskDrainPositions { worker, epoch } => {
                    self.ask_drain_positions(ctx, worker, epoch)
                }
                SchedulerAction::DrainFinished { worker, epoch } => {
                    tracing::info!(
                        "worker/{worker} (incarnation {epoch}) drained: its closures finished and its \
                         dataset positions are kept; it leaves the job"
                    );
                    for waiter in self
                        .drain_waiters
                        .remove(&(worker, epoch))
                        .unwrap_or_default()
                    {
                        let _ = waiter.send(());
                    }
                }
                SchedulerAction::WritePreemptionCut {
                    ticket,
                    cut,
                    root,
                    leaving,
                    reading,
                } => self.write_preemption_cut(ctx, ticket, cut, root, leaving, *reading),
                SchedulerAction::AnswerPsLeaving { ps, epoch, answer } => {
                    for waiter in self.leave_waiters.remove(&(ps, epoch)).unwrap_or_default() {
                        let _ = waiter.send(answer);
                    }
                }
                SchedulerAction::AnswerPsDraining { ps, epoch, result } => {
                    match &result {
                        Ok(()) => tracing::info!(
                            "ps/{ps} (incarnation {epoch}) left the job: its variables are on the \
                             other servers"
                        ),
                        Err(refusal) => tracing::warn!("{refusal}"),
                    }
                    let waiters = self.ps_drain_waiters.remove(&(ps, epoch));
                    for waiter in waiters.unwrap_or_default() {
                        let _ = waiter.send(result.clone());
                    }
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

    /// Runs `work` off the actor and hands its outcome to `report` (which tells the machine)
    /// on the actor, then drives the machine.
    fn spawn_reported<T: 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        work: impl std::future::Future<Output = T> + 'static,
        report: impl FnOnce(&mut Self, T) + 'static,
    ) {
        ctx.spawn(work.into_actor(self).map(move |outcome, act, ctx| {
            report(act, outcome);
            act.drive(ctx);
        }));
    }

    /// Builds the checkpoint of a preemption cut and writes it under `root` (blocking: off the
    /// actor), then tells the machine. Logs what was saved, for whoever reads why a server left.
    fn write_preemption_cut(
        &mut self,
        ctx: &mut Context<Self>,
        ticket: CutTicket,
        cut: ClosureId,
        root: PathBuf,
        leaving: Vec<u32>,
        reading: CutReading,
    ) {
        let servers = leaving
            .iter()
            .map(|ps| format!("ps/{ps}"))
            .collect::<Vec<_>>()
            .join(", ");
        // A cut with no server leaving is for servers joining or leaving the job (reshard).
        let why = if servers.is_empty() {
            "servers joining or leaving the job".to_string()
        } else {
            format!("preemption notice from {servers}")
        };
        let then = if servers.is_empty() {
            "the variables move onto the new set of servers, and their restore runs no closure \
             again"
                .to_string()
        } else {
            format!("{servers} may leave, and its restore runs no closure again")
        };
        let work = tokio::task::spawn_blocking(move || write_cut_checkpoint(&root, reading));
        self.spawn_reported(ctx, work, move |act, outcome| {
            let result = match outcome {
                Ok(Ok(saved)) => {
                    tracing::warn!(
                        "{why}: checkpoint of the cut at closure {} written to {} ({:.1} MB \
                         in {} ms, dispatch held meanwhile); {then}",
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
            act.scheduler
                .handle_preemption_cut_written(Instant::now(), ticket, result);
        });
    }

    /// Worker `worker` and where to dial it, if the cluster spec names it or it joined.
    fn worker_peer(&self, worker: u32) -> Option<(NodeId, PeerAddr)> {
        self.workers
            .get(worker as usize)
            .or_else(|| self.joined.get(&worker))
            .cloned()
    }

    /// Incarnation `epoch` of worker `worker`, if the cluster names that worker or it joined.
    fn worker_incarnation(&self, worker: u32, epoch: u64) -> Option<Incarnation<NodeId>> {
        self.worker_peer(worker)
            .map(|(node, _)| Incarnation::new(node, Epoch(epoch)))
    }

    /// The call that asks incarnation `epoch` of `worker` where its datasets are.
    fn positions_call(
        &self,
        worker: u32,
        epoch: u64,
    ) -> impl std::future::Future<Output = Result<Vec<(String, u64)>, CallFault>> + 'static {
        let reference = self.worker_incarnation(worker, epoch).map(|target| {
            self.gateway
                .remote_ref::<DatasetPositions>(target, WORKER_ACTOR)
        });
        async move {
            match reference {
                Some(r) => worker_reply(r.call(&DatasetPositions).await),
                None => Err(no_such_worker(worker)),
            }
        }
    }

    /// Asks a draining incarnation, which runs nothing now, where its datasets are.
    fn ask_drain_positions(&mut self, ctx: &mut Context<Self>, worker: u32, epoch: u64) {
        let call = self.positions_call(worker, epoch);
        self.spawn_reported(ctx, call, move |act, result| {
            if let Err(e) = &result {
                tracing::warn!(
                    "draining worker/{worker} (incarnation {epoch}) did not report its dataset \
                     positions: {e}; those of its last setup are kept"
                );
            }
            act.scheduler
                .handle_drain_positions(Instant::now(), worker, epoch, result);
        });
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>, worker: u32, epoch: u64, msg: RunClosure) {
        let closure = ClosureId(msg.closure);
        let attempt = msg.attempt;
        let Some(target) = self.worker_incarnation(worker, epoch) else {
            // A bug in the machine's inputs: it only knows the cluster's workers.
            self.scheduler
                .handle_worker_lost(Instant::now(), worker, epoch);
            return;
        };
        let reference = self.gateway.remote_ref::<RunClosure>(target, WORKER_ACTOR);
        let step_timeout = self.scheduler.config().step_timeout;
        let call = async move { reference.call_within(&msg, step_timeout).await };
        let sent = Instant::now();
        self.spawn_reported(ctx, call, move |act, reply| {
            let now = Instant::now();
            match reply {
                Ok(Ok(value)) => {
                    let disposition = act
                        .scheduler
                        .handle_result(now, worker, epoch, closure, attempt, Ok(value));
                    if disposition == ResultDisposition::Committed {
                        crate::metrics::instruments()
                            .observe_chief_step(now.duration_since(sent));
                    }
                }
                Ok(Err(RunClosureError::Step(message))) => {
                    let error = ClosureOutcomeError::Step(message);
                    act.scheduler
                        .handle_result(now, worker, epoch, closure, attempt, Err(error));
                }
                Ok(Err(RunClosureError::Refused(refusal))) => {
                    tracing::warn!(
                        "worker/{worker} (incarnation {epoch}) could not run closure {}: {refusal}; \
                         running it elsewhere and retiring that incarnation",
                        closure.0
                    );
                    act.scheduler
                        .handle_refused(now, worker, epoch, closure, attempt);
                }
                Ok(Err(RunClosureError::PsUnavailable(unavailable))) => {
                    tracing::warn!(
                        "worker/{worker} could not run closure {}: {unavailable}; holding \
                         dispatch until the parameter server is back",
                        closure.0
                    );
                    act.scheduler.handle_ps_unavailable(
                        now,
                        worker,
                        epoch,
                        closure,
                        attempt,
                        unavailable.ps,
                    );
                }
                Err(RemoteError::Timeout { .. }) => {
                    tracing::warn!(
                        "closure {} ran past the step timeout ({step_timeout:?}) on worker/{worker} \
                         (incarnation {epoch}): running it elsewhere and retiring that incarnation",
                        closure.0
                    );
                    act.scheduler.handle_worker_lost(now, worker, epoch);
                }
                Err(err) => {
                    tracing::warn!(
                        "worker/{worker} (incarnation {epoch}) lost while running closure {}: {err}",
                        closure.0
                    );
                    act.scheduler.handle_worker_lost(now, worker, epoch);
                }
            }
        });
    }

    /// Sends the low watermark the machine emitted to every parameter server; each answer is
    /// reported. A server that misses one gets the next.
    fn send_watermark(
        &mut self,
        ctx: &mut Context<Self>,
        finished_below: ClosureId,
        generation: u64,
    ) {
        let watermark = finished_below.0;
        for (ps, (node, addr)) in self.servers_in_job() {
            let gateway = self.gateway.clone();
            let msg = FinishedBelow {
                closure: watermark,
                generation,
            };
            let send = async move {
                let r = gateway
                    .resolve::<FinishedBelow>(addr, &node, PS_ACTOR)
                    .await?;
                r.call(&msg).await
            };
            self.spawn_reported(ctx, send, move |act, sent| {
                if let Err(e) = &sent {
                    tracing::debug!("low watermark {watermark} to ps/{ps}: {e}");
                }
                act.scheduler
                    .handle_watermark_sent(ps, sent.map_err(call_fault));
            });
        }
    }

    /// Tells every parameter server that `worker`'s incarnation `epoch` is fenced; each answer
    /// is reported. A server that misses it is down, and the restore that brings it back
    /// replays every fence (FENCE-1).
    fn fence(&mut self, ctx: &mut Context<Self>, worker: u32, epoch: u64) {
        tracing::info!(
            "fencing worker/{worker} incarnation {epoch} on every parameter server (FENCE-1)"
        );
        for (ps, (node, addr)) in self.servers_in_job() {
            let gateway = self.gateway.clone();
            let msg = FenceWorker { worker, epoch };
            let send = async move {
                let r = gateway
                    .resolve::<FenceWorker>(addr, &node, PS_ACTOR)
                    .await?;
                r.call(&msg).await
            };
            self.spawn_reported(ctx, send, move |act, sent| {
                if let Err(e) = &sent {
                    tracing::warn!("fencing worker/{worker} on ps/{ps}: {e}");
                }
                act.scheduler
                    .handle_fence_sent(worker, epoch, ps, sent.map_err(call_fault));
            });
        }
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

    /// Dials worker `worker` (connects, learning the incarnation that answers); one that
    /// answers as an incarnation this gateway declared dead is reported as such.
    fn dial_worker(&mut self, ctx: &mut Context<Self>, worker: u32) {
        let Some((node, addr)) = self.worker_peer(worker) else {
            self.scheduler
                .handle_worker_dialled(Instant::now(), worker, WorkerDial::Unreachable);
            return;
        };
        let gateway = self.gateway.clone();
        let dial = async move {
            match gateway.connect(addr, &node).await {
                Ok(incarnation) => WorkerDial::Answered {
                    epoch: incarnation.epoch.0,
                },
                Err(RemoteError::Stale { reason, .. }) => match gateway.peer_status(&node) {
                    Some((epoch, false)) => WorkerDial::DeclaredDead { epoch: epoch.0 },
                    _ => {
                        tracing::debug!("worker/{worker} not reachable yet: {reason}");
                        WorkerDial::Unreachable
                    }
                },
                Err(e) => {
                    tracing::debug!("worker/{worker} not reachable yet: {e}");
                    WorkerDial::Unreachable
                }
            }
        };
        self.spawn_reported(ctx, dial, move |act, outcome| {
            act.scheduler
                .handle_worker_dialled(Instant::now(), worker, outcome);
        });
    }

    /// Sets a new incarnation up from scratch ([`RewindWorker`]): a setup that a restore made
    /// outdated may have built its datasets at old positions already.
    fn set_up_worker(
        &mut self,
        ctx: &mut Context<Self>,
        worker: u32,
        epoch: u64,
        setup: SetupWorker,
        version: u64,
    ) {
        let reference = self.worker_incarnation(worker, epoch).map(|target| {
            self.gateway
                .remote_ref::<RewindWorker>(target, WORKER_ACTOR)
        });
        let call = async move {
            match reference {
                Some(r) => worker_reply(r.call(&RewindWorker { setup }).await),
                None => Err(no_such_worker(worker)),
            }
        };
        self.spawn_reported(ctx, call, move |act, result| {
            let failure = result.as_ref().err().cloned();
            let now = Instant::now();
            match act
                .scheduler
                .handle_worker_set_up(now, worker, epoch, version, result)
            {
                SetUpDisposition::Up => tracing::info!("worker/{worker} up (incarnation {epoch})"),
                SetUpDisposition::Outdated => tracing::debug!(
                    "worker/{worker} (incarnation {epoch}) was set up from an outdated setup; \
                     setting it up again"
                ),
                SetUpDisposition::Failed => tracing::debug!(
                    "setting up worker/{worker} (incarnation {epoch}): {}",
                    failure.map(|f| f.to_string()).unwrap_or_default()
                ),
            }
        });
    }

    /// Tells the fenced incarnation `epoch` of `worker`, still alive, to retire.
    fn retire_worker(&mut self, ctx: &mut Context<Self>, worker: u32, epoch: u64) {
        let Some((node, addr)) = self.worker_peer(worker) else {
            self.scheduler
                .handle_worker_retired(worker, epoch, Err(no_such_worker(worker)));
            return;
        };
        let gateway = self.gateway.clone();
        let fenced = Incarnation::new(node, Epoch(epoch));
        let call = async move { retire(&gateway, addr, fenced, WORKER_ACTOR).await };
        self.spawn_reported(ctx, call, move |act, result| {
            match &result {
                Ok(()) => tracing::info!(
                    "worker/{worker} (incarnation {epoch}) was fenced but is alive: retired it, so \
                     that it restarts as a new incarnation"
                ),
                Err(e) => tracing::debug!("retiring worker/{worker}: {e}"),
            }
            act.scheduler.handle_worker_retired(worker, epoch, result);
        });
    }

    /// Sends a live incarnation its new setup ([`SetupWorker`]).
    fn reconfigure(
        &mut self,
        ctx: &mut Context<Self>,
        ticket: ConfigureTicket,
        worker: u32,
        epoch: u64,
        setup: SetupWorker,
    ) {
        let reference = self
            .worker_incarnation(worker, epoch)
            .map(|target| self.gateway.remote_ref::<SetupWorker>(target, WORKER_ACTOR));
        let call = async move {
            match reference {
                Some(r) => worker_reply(r.call(&setup).await),
                None => Err(no_such_worker(worker)),
            }
        };
        self.spawn_reported(ctx, call, move |act, result| {
            if let Err(e) = &result {
                tracing::warn!("setting up worker/{worker} (incarnation {epoch}): {e}");
            }
            act.scheduler
                .handle_reconfigured(Instant::now(), ticket, worker, epoch, result);
        });
    }

    /// Asks a live incarnation where its datasets are ([`DatasetPositions`]).
    fn ask_positions(
        &mut self,
        ctx: &mut Context<Self>,
        ticket: PositionsTicket,
        worker: u32,
        epoch: u64,
    ) {
        let call = self.positions_call(worker, epoch);
        self.spawn_reported(ctx, call, move |act, result| {
            if let Err(e) = &result {
                tracing::warn!(
                    "worker/{worker} (incarnation {epoch}) did not report its dataset positions for \
                     the checkpoint: {e}; it is restarted from its last setup's positions, \
                     which the checkpoint records"
                );
            }
            act.scheduler
                .handle_positions(Instant::now(), ticket, worker, epoch, result);
        });
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

    /// Dials parameter server `ps` with a real call ([`PsStats`]): an answer proves that
    /// incarnation alive and tells its epoch; one from an incarnation this gateway declared
    /// dead (a false death) is reported as such. The machine decides what follows.
    fn dial_ps(&mut self, ctx: &mut Context<Self>, ps: u32) {
        let Some((node, addr)) = self.servers.get(&ps).cloned() else {
            self.scheduler
                .handle_ps_dialled(Instant::now(), ps, PsDial::Unreachable);
            return;
        };
        let gateway = self.gateway.clone();
        let dial = async move {
            let r = match gateway.resolve::<PsStats>(addr, &node, PS_ACTOR).await {
                Ok(r) => r,
                Err(RemoteError::Stale { reason, .. }) => {
                    return match gateway.peer_status(&node) {
                        Some((epoch, false)) => PsDial::DeclaredDead { epoch: epoch.0 },
                        _ => {
                            tracing::debug!("ps/{ps} not reachable yet: {reason}");
                            PsDial::Unreachable
                        }
                    };
                }
                Err(e) => {
                    tracing::debug!("ps/{ps} not reachable yet: {e}");
                    return PsDial::Unreachable;
                }
            };
            match r.call(&PsStats).await {
                Ok(stats) => PsDial::Answered {
                    epoch: r.target().epoch.0,
                    serving: stats.serving,
                },
                Err(e) => {
                    tracing::debug!("ps/{ps} not reachable yet: {e}");
                    PsDial::Unreachable
                }
            }
        };
        self.spawn_reported(ctx, dial, move |act, outcome| {
            act.scheduler.handle_ps_dialled(Instant::now(), ps, outcome);
        });
    }

    /// Creates one shard of a variable on server `ps` ([`CreateVariable`]), on whichever
    /// incarnation answers at its address.
    fn create_shard(
        &mut self,
        ctx: &mut Context<Self>,
        ticket: CreateTicket,
        ps: u32,
        shard: usize,
        msg: CreateVariable,
    ) {
        let server = self.servers.get(&ps).cloned();
        let gateway = self.gateway.clone();
        let call = async move {
            let (node, addr) = server.ok_or_else(|| no_such_server(ps))?;
            let r = gateway
                .resolve::<CreateVariable>(addr, &node, PS_ACTOR)
                .await
                .map_err(call_fault)?;
            r.call(&msg)
                .await
                .map_err(call_fault)?
                .map_err(|refusal| CallFault::Refused(refusal.to_string()))
        };
        self.spawn_reported(ctx, call, move |act, result| {
            act.scheduler
                .handle_shard_created(Instant::now(), ticket, ps, shard, result);
        });
    }

    /// Asks server `ps` which incarnation answers, its restore generation and the closure
    /// ids it has applied ([`PsStats`]), for the chief's start.
    fn probe_server(&mut self, ctx: &mut Context<Self>, ticket: RestoreTicket, ps: u32) {
        let server = self.servers.get(&ps).cloned();
        let gateway = self.gateway.clone();
        let call = async move {
            let (node, addr) = server.ok_or_else(|| no_such_server(ps))?;
            let r = gateway
                .resolve::<PsStats>(addr, &node, PS_ACTOR)
                .await
                .map_err(call_fault)?;
            let stats = r.call(&PsStats).await.map_err(call_fault)?;
            Ok(ServerProbe {
                ps,
                epoch: r.target().epoch.0,
                generation: stats.generation,
                next_free_closure_id: stats.next_free_closure_id,
            })
        };
        self.spawn_reported(ctx, call, move |act, result| {
            act.scheduler
                .handle_server_probed(Instant::now(), ticket, ps, result);
        });
    }

    /// Reads one shard of server `ps` ([`Snapshot`]) for a save's read, on whichever
    /// incarnation answers at its address (the machine tells a read across a restore by the
    /// cut state).
    fn snapshot_shard(
        &mut self,
        ctx: &mut Context<Self>,
        ticket: CutTicket,
        attempt: u32,
        ps: u32,
        shard: String,
    ) {
        let server = self.servers.get(&ps).cloned();
        let gateway = self.gateway.clone();
        let name = shard.clone();
        let call = async move {
            let (node, addr) = server.ok_or_else(|| no_such_server(ps))?;
            let r = gateway
                .resolve::<Snapshot>(addr, &node, PS_ACTOR)
                .await
                .map_err(call_fault)?;
            let (state, blobs) = r
                .call_with_blobs(&Snapshot { name }, Vec::new())
                .await
                .map_err(call_fault)?;
            let state = state.map_err(|refusal| CallFault::Refused(refusal.to_string()))?;
            Ok(ShardRead { state, blobs })
        };
        self.spawn_reported(ctx, call, move |act, result| {
            act.scheduler
                .handle_shard_read(Instant::now(), ticket, attempt, ps, &shard, result);
        });
    }

    /// Tells incarnation `epoch` of parameter server `ps`, declared dead but answering, to
    /// retire, so that its supervisor restarts it as a new incarnation (restored then).
    fn retire_ps(&mut self, ctx: &mut Context<Self>, ps: u32, epoch: u64) {
        let Some((node, addr)) = self.servers.get(&ps).cloned() else {
            self.scheduler
                .handle_ps_retired(ps, epoch, Err(no_such_server(ps)));
            return;
        };
        let gateway = self.gateway.clone();
        let fenced = Incarnation::new(node, Epoch(epoch));
        let call = async move { retire(&gateway, addr, fenced, PS_ACTOR).await };
        self.spawn_reported(ctx, call, move |act, result| {
            match &result {
                Ok(()) => tracing::warn!(
                    "ps/{ps} (incarnation {epoch}) was declared dead but is alive: retired it, so \
                     that it restarts as a new incarnation"
                ),
                Err(e) => tracing::debug!("retiring ps/{ps}: {e}"),
            }
            act.scheduler.handle_ps_retired(ps, epoch, result);
        });
    }
    /// Carries out one call of a restore on the incarnation it names; its outcome goes back to
    /// the machine as a [`RestoreReport`] of the call's generation.
    fn restore_call(&mut self, ctx: &mut Context<Self>, call: RestoreCall) {
        let gateway = self.gateway.clone();
        let server = |ps: u32, epoch: u64| {
            self.servers
                .get(&ps)
                .map(|(node, _)| Incarnation::new(node.clone(), Epoch(epoch)))
        };
        let (generation, work): (u64, futures::future::BoxFuture<'static, RestoreReport>) =
            match call {
                RestoreCall::Begin {
                    ps,
                    epoch,
                    generation,
                    fences,
                } => {
                    tracing::warn!(
                        "restore generation {generation}: ps/{ps} (incarnation {epoch}) is restored \
                         from a checkpoint with every other server"
                    );
                    let target = server(ps, epoch);
                    (
                        generation,
                        Box::pin(async move {
                            let result = match target {
                                Some(target) => gateway
                                    .remote_ref::<BeginRestore>(target, PS_ACTOR)
                                    .call(&BeginRestore { generation, fences })
                                    .await
                                    .map_err(call_fault),
                                None => Err(no_such_server(ps)),
                            };
                            RestoreReport::Begun { ps, result }
                        }),
                    )
                }
                RestoreCall::Load {
                    generation,
                    root,
                    cut,
                } => (
                    generation,
                    Box::pin(async move {
                        let shown = root.display().to_string();
                        let result = tokio::task::spawn_blocking(move || load_at_cut(&root, cut.0))
                            .await
                            .map_err(|e| LoadFault::ReaderLost(Box::new(e)))
                            .and_then(|loaded| loaded.map_err(LoadFault::from))
                            .map(|loaded| loaded.map(|c| CheckpointRef(Arc::new(c))));
                        match &result {
                            Ok(Some(c)) => tracing::info!(
                                "restore generation {generation}: the checkpoint taken at \
                                 closure {} (step {}) under {shown} is read",
                                cut.0,
                                c.0.step
                            ),
                            Ok(None) => tracing::warn!(
                                "restore generation {generation}: no checkpoint taken at closure \
                                 {} under {shown} verifies any more (lost or damaged on disk); \
                                 rolling back to the cut before it, if one is kept",
                                cut.0
                            ),
                            Err(_) => {}
                        }
                        RestoreReport::Loaded { result }
                    }),
                ),
                RestoreCall::Shards {
                    ps,
                    epoch,
                    generation,
                    checkpoint,
                    layouts,
                } => {
                    let target = server(ps, epoch);
                    (
                        generation,
                        Box::pin(async move {
                            let result = match target {
                                Some(target) => {
                                    restore_shards(&gateway, target, ps, layouts, checkpoint.0)
                                        .await
                                }
                                None => Err(no_such_server(ps)),
                            };
                            RestoreReport::ShardsRestored { ps, result }
                        }),
                    )
                }
                RestoreCall::RollBack {
                    ps,
                    epoch,
                    generation,
                    finished_below,
                } => {
                    let target = server(ps, epoch);
                    (
                        generation,
                        Box::pin(async move {
                            let msg = RollBack {
                                finished_below: finished_below.0,
                                generation,
                            };
                            let result = match target {
                                Some(target) => gateway
                                    .remote_ref::<RollBack>(target, PS_ACTOR)
                                    .call(&msg)
                                    .await
                                    .map_err(call_fault),
                                None => Err(no_such_server(ps)),
                            };
                            RestoreReport::RolledBack { ps, result }
                        }),
                    )
                }
                RestoreCall::Rewind {
                    worker,
                    epoch,
                    generation,
                    setup,
                } => {
                    let target = self.worker_incarnation(worker, epoch);
                    (
                        generation,
                        Box::pin(async move {
                            let result = match target {
                                Some(target) => worker_reply(
                                    gateway
                                        .remote_ref::<RewindWorker>(target, WORKER_ACTOR)
                                        .call(&RewindWorker { setup })
                                        .await,
                                ),
                                None => Err(no_such_worker(worker)),
                            };
                            if let Err(e) = &result {
                                tracing::warn!("rewinding worker/{worker}'s datasets: {e}");
                            }
                            RestoreReport::Rewound {
                                worker,
                                epoch,
                                result,
                            }
                        }),
                    )
                }
            };
        ctx.spawn(work.into_actor(self).map(move |report, act, ctx| {
            act.scheduler
                .handle_restore_report(Instant::now(), generation, report);
            act.drive(ctx);
        }));
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
    let epoch = fenced.epoch.0;
    gateway
        .call_fenced::<Retire>(addr, &fenced, actor, &Retire { epoch })
        .await
        .map_err(|e| CallFault::Unreachable(format!("retiring fenced incarnation {epoch}: {e}")))
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
        let epoch = msg.from.epoch.0;
        let stopping = crate::process::preemption_requested();
        if let Some(ps) = self.ps_index(&msg.from.node) {
            let answer = self
                .scheduler
                .handle_ps_leaving(Instant::now(), ps, epoch, stopping);
            let rx = match answer {
                Some(answer) => {
                    if answer == LeaveAnswer::Go {
                        tracing::warn!(
                            "ps/{ps} (incarnation {epoch}) got a preemption notice and leaves now, \
                             with no cut taken for it"
                        );
                    }
                    self.drive(ctx);
                    return Box::pin(async move { answer });
                }
                None => {
                    tracing::warn!(
                        "ps/{ps} (incarnation {epoch}) got a preemption notice: holding dispatch to \
                         take a checkpoint cut before it leaves"
                    );
                    let (tx, rx) = oneshot::channel();
                    self.leave_waiters.entry((ps, epoch)).or_default().push(tx);
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
        let answer = self
            .scheduler
            .handle_worker_leaving(Instant::now(), worker, epoch, stopping);
        if answer == LeaveAnswer::Go {
            tracing::warn!(
                "worker/{worker} (incarnation {epoch}) got a preemption notice and leaves: its \
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
        let epoch = msg.from.epoch.0;
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
                epoch,
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
                .handle_worker_joining(Instant::now(), index, epoch);
            if answer.is_ok() && !in_spec {
                let known = self.joined.get(&index).map(|(_, a)| a.to_string());
                if known.as_deref() != Some(msg.msg.addr.as_str()) {
                    tracing::info!(
                        "worker/{index} (incarnation {epoch}) joins the job at {}",
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
        let epoch = msg.from.epoch.0;
        if let Some(ps) = self.ps_index(&msg.from.node) {
            let (done, rx) = oneshot::channel();
            tracing::info!("ps/{ps} (incarnation {epoch}) asks to leave the job");
            match self.scheduler.handle_ps_draining(Instant::now(), ps, epoch) {
                Ok(true) => {
                    let _ = done.send(Ok(()));
                }
                Ok(false) => self
                    .ps_drain_waiters
                    .entry((ps, epoch))
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
                tracing::info!("worker/{worker} (incarnation {epoch}) is draining out of the job");
                match self
                    .scheduler
                    .handle_worker_draining(Instant::now(), worker, epoch)
                {
                    DrainDisposition::Done => {
                        let _ = worker_done.send(());
                    }
                    DrainDisposition::Pending => self
                        .drain_waiters
                        .entry((worker, epoch))
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
                    .handle_ps_up(Instant::now(), ps, incarnation.epoch.0);
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
                        incarnation.epoch.0
                    );
                } else {
                    // Left the job: its exit is expected.
                    tracing::debug!(
                        "ps/{ps} (incarnation {}), out of the job, is gone: {cause:?}",
                        incarnation.epoch.0
                    );
                }
                self.scheduler
                    .handle_ps_lost(Instant::now(), ps, incarnation.epoch.0);
                self.drive(ctx);
            } else if let Some(worker) = self.worker_index(&incarnation.node) {
                if self.scheduler.is_member(worker) {
                    tracing::warn!(
                        "worker/{worker} (incarnation {}) declared dead: {cause:?}",
                        incarnation.epoch.0
                    );
                } else {
                    // Drained out of the job: its exit is expected.
                    tracing::debug!(
                        "worker/{worker} (incarnation {}), drained, is gone: {cause:?}",
                        incarnation.epoch.0
                    );
                }
                self.scheduler
                    .handle_worker_lost(Instant::now(), worker, incarnation.epoch.0);
                self.drive(ctx);
            } else {
                tracing::warn!(
                    "{} (incarnation {}) declared dead: {cause:?}",
                    incarnation.node,
                    incarnation.epoch.0
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
            incarnation: Some(own.epoch.0),
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
                incarnation: known.epoch,
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
    use crate::roles::protocol::{PositionsError, SetupError, WorkerRefusal};
    use cohort_actors::{RefusedReason, Remote};
    use cohort_transport::ClusterCa;

    fn gateway(ca: &ClusterCa, node: &NodeId, epoch: u64) -> Gateway {
        crate::roles::test_support::loopback_gateway(ca, node, epoch, Duration::from_secs(5))
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
