//! The coordinator's actix shell: owns the [`Scheduler`] machine and does the IO it asks for —
//! dispatching closures to workers, fencing lost incarnations on the parameter servers,
//! (re)connecting workers and preparing each new incarnation before it gets work.
//!
//! - A closure's run is bounded by the scheduler's `step_timeout`, not by the gateway's call
//!   timeout: a long step is never cut while its worker heartbeats.
//! - A fenced worker incarnation that is still alive (a step past the step timeout, a refused
//!   setup or job, a false death from the failure detector) is sent [`Retire`] when it answers
//!   a reconnect, so that it exits and comes back as a new incarnation instead of idling.
//! - Every [`WATERMARK_INTERVAL`], if it has risen, the scheduler's low watermark goes to every
//!   parameter server ([`FinishedBelow`], with the restore generation), which bounds the
//!   closure ids they keep for PS-1; none while a recovery holds dispatch.
//! - Parameter servers are watched like workers: the gateway's peer events (alive with an
//!   epoch, declared dead) and a worker's [`RunClosureError::PsUnavailable`] go to the
//!   scheduler; a server it counts as down is dialled every [`RECONNECT_INTERVAL`] with a real
//!   call ([`PsStats`]), so that only an answer proves it back (and an answer holding no
//!   variable counts as a lost state); one that answers as an incarnation declared dead is
//!   retired ([`Retire`]) so that it restarts as a new one.
//! - On [`SchedulerAction::Restore`], every call goes to the server incarnations the scheduler
//!   pinned: [`BeginRestore`] (pushes refused from then on, fences replayed), every shard
//!   restored from the checkpoint taken at the cut under the directory of the last save
//!   ([`MarkCut`]; read only, never cleaning up), the PS-1 state rolled back to the cut
//!   ([`RollBack`], which re-opens the server to pushes of the new generation), and every live
//!   worker's datasets rewound to the checkpoint's positions ([`RewindWorker`]) before
//!   anything is dispatched again. No new worker is set up while a restore runs, and a new
//!   incarnation is always set up from scratch ([`RewindWorker`]) at the current positions.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use cohort_actors::{Epoch, Gateway, Incarnation, PeerEvent, RemoteError, RemoteRef};
use cohort_transport::NodeId;
use tokio::sync::oneshot;

use super::machine::{
    ClosureFailure, ClosureId, ClosureState, Ledger, ScheduleError, Scheduler, SchedulerAction,
};
pub use super::restore::WorkerPositions;
use super::restore::{
    dataset_positions, load_at_cut, ps_call_error, restore_servers, RestoreError,
};
use crate::roles::protocol::{
    BeginRestore, DatasetPositions, FenceWorker, FinishedBelow, PsStats, Retire, RewindWorker,
    RollBack, RunClosure, RunClosureError, SetupWorker, PS_ACTOR, WORKER_ACTOR,
};
use crate::variable::ShardLayout;

/// Who waits for one closure's value.
type FetchWaiter = oneshot::Sender<Result<Vec<u8>, ClosureFailure>>;

/// The coordinator actor.
pub struct CoordinatorActor {
    gateway: Gateway,
    scheduler: Scheduler,
    workers: Vec<(NodeId, SocketAddr)>,
    servers: Vec<(NodeId, SocketAddr)>,
    /// Live worker incarnations and the reference bound to each.
    worker_refs: BTreeMap<u32, RemoteRef<RunClosure>>,
    /// Highest epoch ever seen per worker (a returning process must be newer).
    worker_epochs: BTreeMap<u32, u64>,
    connecting: BTreeMap<u32, bool>,
    setup: SetupWorker,
    /// Dataset positions restored from a checkpoint, per worker: where each worker's
    /// datasets resume.
    positions: BTreeMap<u32, BTreeMap<String, u64>>,
    /// Bumped on every `Configure`: a setup sent before the bump is outdated.
    setup_version: u64,
    join_waiters: Vec<oneshot::Sender<Result<(), ClosureFailure>>>,
    fetch_waiters: HashMap<ClosureId, Vec<FetchWaiter>>,
    timer: Option<SpawnHandle>,
    /// The low watermark last sent to the parameter servers.
    watermark_sent: u64,
    /// Where the last checkpoint was saved (or restored from): a recovery restores from it.
    checkpoint_root: Option<PathBuf>,
    /// Parameter servers being dialled now (one dial each at a time).
    ps_dialling: BTreeMap<u32, bool>,
}

impl CoordinatorActor {
    /// A coordinator over `workers` and `servers` (index = task index).
    pub fn new(
        gateway: Gateway,
        scheduler: Scheduler,
        workers: Vec<(NodeId, SocketAddr)>,
        servers: Vec<(NodeId, SocketAddr)>,
    ) -> Self {
        let num_workers = workers.len() as u32;
        Self {
            gateway,
            scheduler,
            workers,
            servers,
            worker_refs: BTreeMap::new(),
            worker_epochs: BTreeMap::new(),
            connecting: BTreeMap::new(),
            setup: SetupWorker {
                num_workers,
                layouts_json: "[]".into(),
                datasets: Vec::new(),
            },
            setup_version: 0,
            positions: BTreeMap::new(),
            join_waiters: Vec::new(),
            fetch_waiters: HashMap::new(),
            timer: None,
            watermark_sent: 0,
            checkpoint_root: None,
            ps_dialling: BTreeMap::new(),
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
                } => {
                    let msg = RunClosure {
                        closure: closure.0,
                        attempt,
                        generation,
                        function,
                        args,
                    };
                    self.dispatch(ctx, worker, epoch, msg);
                }
                SchedulerAction::Fence { worker, epoch } => self.fence(worker, epoch),
                SchedulerAction::Restore {
                    cut,
                    generation,
                    servers,
                    fences,
                } => self.restore(ctx, cut, generation, servers, fences),
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

    fn dispatch(&mut self, ctx: &mut Context<Self>, worker: u32, epoch: u64, msg: RunClosure) {
        let closure = ClosureId(msg.closure);
        let attempt = msg.attempt;
        let Some(reference) = self.worker_refs.get(&worker).cloned() else {
            // The machine only dispatches to live workers; the reference went with a loss we
            // have not told it about yet.
            self.scheduler
                .handle_worker_lost(Instant::now(), worker, epoch);
            return;
        };
        let step_timeout = self.scheduler.config().step_timeout;
        let call = async move { reference.call_within(&msg, step_timeout).await };
        ctx.spawn(call.into_actor(self).map(move |reply, act, ctx| {
            let now = Instant::now();
            match reply {
                Ok(Ok(value)) => {
                    act.scheduler
                        .handle_result(now, worker, epoch, closure, attempt, Ok(value));
                }
                Ok(Err(RunClosureError::Step(message))) => {
                    act.scheduler
                        .handle_result(now, worker, epoch, closure, attempt, Err(message));
                }
                Ok(Err(RunClosureError::Refused(refusal))) => {
                    tracing::warn!(
                        "worker/{worker} (epoch {epoch}) could not run closure {}: {refusal}; \
                         running it elsewhere and retiring that incarnation",
                        closure.0
                    );
                    act.scheduler
                        .handle_refused(now, worker, epoch, closure, attempt);
                    act.forget_ref_unless_live(worker, epoch);
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
                         (epoch {epoch}): running it elsewhere and retiring that incarnation",
                        closure.0
                    );
                    act.lose_worker(worker, epoch);
                }
                Err(err) => {
                    tracing::warn!(
                        "worker/{worker} (epoch {epoch}) lost while running closure {}: {err}",
                        closure.0
                    );
                    act.lose_worker(worker, epoch);
                }
            }
            act.drive(ctx);
        }));
    }

    fn lose_worker(&mut self, worker: u32, epoch: u64) {
        self.scheduler
            .handle_worker_lost(Instant::now(), worker, epoch);
        self.forget_ref_unless_live(worker, epoch);
    }

    /// Drops the reference bound to `worker`'s incarnation `epoch` once the scheduler no
    /// longer counts that incarnation alive, so the next reconnect round finds it (and
    /// retires it if it still answers).
    fn forget_ref_unless_live(&mut self, worker: u32, epoch: u64) {
        if self.scheduler.worker_epoch(worker) != Some(epoch)
            && self
                .worker_refs
                .get(&worker)
                .is_some_and(|r| r.target().epoch.0 == epoch)
        {
            self.worker_refs.remove(&worker);
        }
    }

    /// Sends the scheduler's low watermark to every parameter server if it rose since the
    /// last time, with the restore generation it was computed in: a server that has rolled
    /// back since ignores it. None goes out while a recovery holds dispatch (the closures
    /// committed since the cut may run again). A server that misses one gets the next.
    fn send_watermark(&mut self) {
        if self.scheduler.is_holding() {
            return;
        }
        let watermark = self.scheduler.low_watermark().0;
        if watermark <= self.watermark_sent {
            return;
        }
        self.watermark_sent = watermark;
        let generation = self.scheduler.generation();
        for (node, addr) in self.servers.clone() {
            let gateway = self.gateway.clone();
            let msg = FinishedBelow {
                closure: watermark,
                generation,
            };
            actix::spawn(async move {
                let sent = match gateway
                    .resolve::<FinishedBelow>(addr, &node, PS_ACTOR)
                    .await
                {
                    Ok(r) => r.call(&msg).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = sent {
                    tracing::debug!("low watermark {watermark} to {node}: {e}");
                }
            });
        }
    }

    fn fence(&self, worker: u32, epoch: u64) {
        tracing::info!("fencing worker/{worker} epoch {epoch} on every parameter server (FENCE-1)");
        for (node, addr) in self.servers.clone() {
            let gateway = self.gateway.clone();
            let msg = FenceWorker { worker, epoch };
            actix::spawn(async move {
                match gateway.resolve::<FenceWorker>(addr, &node, PS_ACTOR).await {
                    Ok(r) => {
                        if let Err(e) = r.call(&msg).await {
                            tracing::warn!("fencing worker/{worker} on {node}: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("fencing worker/{worker} on {node}: {e}"),
                }
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

    /// Dials every worker that has no live incarnation; a new incarnation is set up (layouts,
    /// datasets) before the scheduler may give it work, and a fenced one that still answers is
    /// retired. One dial per worker at a time; the next round retries what failed. None while
    /// a restore runs: a worker set up now would start at the dataset positions the restore
    /// is about to replace.
    fn reconnect(&mut self, ctx: &mut Context<Self>) {
        if self.scheduler.is_restoring() {
            return;
        }
        for (index, (node, addr)) in self.workers.clone().into_iter().enumerate() {
            let worker = index as u32;
            if self.worker_refs.contains_key(&worker) || self.connecting.get(&worker) == Some(&true)
            {
                continue;
            }
            self.connecting.insert(worker, true);
            let gateway = self.gateway.clone();
            let setup = self.setup_for(worker);
            let version = self.setup_version;
            let known = self.worker_epochs.get(&worker).copied();
            let work = async move {
                let incarnation = match gateway.connect(addr, &node).await {
                    Ok(incarnation) => incarnation,
                    Err(RemoteError::Stale { reason, .. }) => {
                        // The node answers as an incarnation this gateway declared dead (a
                        // false death: frozen past the budget, then woken). It can do nothing
                        // useful any more (FENCE-1): tell it to make way for a new one.
                        return match gateway.peer_status(&node) {
                            Some((epoch, false)) => {
                                let fenced = Incarnation::new(node, epoch);
                                retire(&gateway, addr, fenced, WORKER_ACTOR)
                                    .await
                                    .map(Reached::Retired)
                            }
                            _ => Err(reason),
                        };
                    }
                    Err(e) => return Err(e.to_string()),
                };
                if known.is_some_and(|k| incarnation.epoch.0 <= k) {
                    // The incarnation the coordinator fenced, still alive (a step past the
                    // step timeout, a refused setup or job): retire it.
                    return retire(&gateway, addr, incarnation, WORKER_ACTOR)
                        .await
                        .map(Reached::Retired);
                }
                // Rebuilt from scratch: a setup a restore made outdated (discarded below) may
                // have built the datasets at old positions already.
                let setup_ref =
                    gateway.remote_ref::<RewindWorker>(incarnation.clone(), WORKER_ACTOR);
                setup_ref
                    .call(&RewindWorker { setup })
                    .await
                    .map_err(|e| e.to_string())??;
                Ok::<_, String>(Reached::New(incarnation))
            };
            ctx.spawn(work.into_actor(self).map(move |result, act, ctx| {
                act.connecting.insert(worker, false);
                match result {
                    // Reconfigured meanwhile: the next round sets it up with the current setup.
                    Ok(Reached::New(_)) if version != act.setup_version => {}
                    Ok(Reached::New(incarnation)) => act.worker_up(ctx, worker, incarnation),
                    Ok(Reached::Retired(epoch)) => tracing::info!(
                        "worker/{worker} (epoch {epoch}) was fenced but is alive: retired it, \
                         so that it restarts as a new incarnation"
                    ),
                    Err(err) => tracing::debug!("worker/{worker} not reachable yet: {err}"),
                }
            }));
        }
    }

    fn worker_up(
        &mut self,
        ctx: &mut Context<Self>,
        worker: u32,
        incarnation: Incarnation<NodeId>,
    ) {
        let epoch = incarnation.epoch.0;
        tracing::info!("worker/{worker} up (epoch {epoch})");
        self.worker_epochs.insert(worker, epoch);
        self.worker_refs
            .insert(worker, self.gateway.remote_ref(incarnation, WORKER_ACTOR));
        self.scheduler
            .handle_worker_up(Instant::now(), worker, epoch);
        self.drive(ctx);
    }

    /// The setup for one worker: the shared one, with its datasets resuming at the positions
    /// restored for that worker.
    fn setup_for(&self, worker: u32) -> SetupWorker {
        setup_with_positions(&self.setup, self.positions.get(&worker))
    }

    fn ps_index(&self, node: &NodeId) -> Option<u32> {
        self.servers
            .iter()
            .position(|(n, _)| n == node)
            .map(|i| i as u32)
    }

    /// Dials every parameter server the scheduler counts as down (or has never seen) with a
    /// real call: an answer proves that incarnation alive and tells its epoch.
    fn dial_servers(&mut self, ctx: &mut Context<Self>) {
        for (index, (node, addr)) in self.servers.clone().into_iter().enumerate() {
            let ps = index as u32;
            let wanted = match self.scheduler.ps_epoch(ps) {
                None => true,
                Some((_, alive)) => !alive,
            };
            if !wanted || self.ps_dialling.get(&ps) == Some(&true) {
                continue;
            }
            self.ps_dialling.insert(ps, true);
            let gateway = self.gateway.clone();
            let dial = async move {
                let r = match gateway.resolve::<PsStats>(addr, &node, PS_ACTOR).await {
                    Ok(r) => r,
                    Err(RemoteError::Stale { reason, .. }) => {
                        // Answers as an incarnation declared dead (a false death): it can do
                        // nothing useful any more (FENCE-1); retire it so that its supervisor
                        // restarts it as a new incarnation, which is then restored.
                        return match gateway.peer_status(&node) {
                            Some((epoch, false)) => {
                                let fenced = Incarnation::new(node, epoch);
                                retire(&gateway, addr, fenced, PS_ACTOR)
                                    .await
                                    .map(DialOutcome::Retired)
                            }
                            _ => Err(reason),
                        };
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let stats = r.call(&PsStats).await.map_err(|e| e.to_string())?;
                Ok(DialOutcome::Up(r.target().epoch.0, stats.serving))
            };
            ctx.spawn(dial.into_actor(self).map(move |result, act, ctx| {
                act.ps_dialling.insert(ps, false);
                match result {
                    Ok(DialOutcome::Up(epoch, serving)) => {
                        act.scheduler
                            .handle_ps_answered(Instant::now(), ps, epoch, serving);
                        act.drive(ctx);
                    }
                    Ok(DialOutcome::Retired(epoch)) => tracing::warn!(
                        "ps/{ps} (epoch {epoch}) was declared dead but is alive: retired it, so \
                         that it restarts as a new incarnation"
                    ),
                    Err(e) => tracing::debug!("ps/{ps} not reachable yet: {e}"),
                }
            }));
        }
    }

    /// Carries out [`SchedulerAction::Restore`], each step on the server incarnations the
    /// scheduler pinned (`servers`): opens restore `generation` on every server (pushes
    /// refused from then on, the fences replayed: PS-1, FENCE-1), restores every server from
    /// the checkpoint taken at `cut`, rolls their PS-1 state back to the cut (which re-opens
    /// them to pushes of `generation`), rewinds every live worker's datasets to the
    /// checkpoint's positions, then tells the scheduler, which queues again what committed
    /// since the cut. A server that cannot be reached as its pinned incarnation interrupts the
    /// restore (tried again); anything else fails it.
    fn restore(
        &mut self,
        ctx: &mut Context<Self>,
        cut: ClosureId,
        generation: u64,
        pinned: Vec<(u32, u64)>,
        fences: Vec<(u32, u64)>,
    ) {
        let Some(root) = self.checkpoint_root.clone() else {
            self.scheduler
                .handle_restore_failed(Instant::now(), "no checkpoint directory is known".into());
            return;
        };
        let layouts: Vec<ShardLayout> = match serde_json::from_str(&self.setup.layouts_json) {
            Ok(layouts) => layouts,
            Err(e) => {
                self.scheduler
                    .handle_restore_failed(Instant::now(), format!("variable layouts: {e}"));
                return;
            }
        };
        tracing::warn!(
            "restoring every parameter server from the checkpoint under {} cut at closure {} \
             (restore generation {generation})",
            root.display(),
            cut.0
        );
        // A worker being set up now would get the positions the restore replaces.
        self.setup_version += 1;
        let gateway = self.gateway.clone();
        let servers = self.servers.clone();
        let setup = self.setup.clone();
        let pinned: BTreeMap<u32, u64> = pinned.into_iter().collect();
        let workers: Vec<(u32, Incarnation<NodeId>)> = self
            .worker_refs
            .iter()
            .map(|(w, r)| (*w, r.target().clone()))
            .collect();
        let work = async move {
            let incarnation = |ps: u32| -> Result<(Incarnation<NodeId>, SocketAddr), RestoreError> {
                let (node, addr) = servers
                    .get(ps as usize)
                    .cloned()
                    .ok_or_else(|| RestoreError::Ps(format!("no ps {ps}")))?;
                let epoch = pinned.get(&ps).ok_or_else(|| RestoreError::Unreachable {
                    ps,
                    reason: "its incarnation was not known when the restore began".into(),
                })?;
                Ok((Incarnation::new(node, Epoch(*epoch)), addr))
            };
            for ps in 0..servers.len() as u32 {
                let (target, _) = incarnation(ps)?;
                let msg = BeginRestore {
                    generation,
                    fences: fences.clone(),
                };
                gateway
                    .remote_ref::<BeginRestore>(target, PS_ACTOR)
                    .call(&msg)
                    .await
                    .map_err(|e| ps_call_error(ps, e))?;
            }
            let dir = root.display().to_string();
            let ckpt = tokio::task::spawn_blocking(move || load_at_cut(&root, cut.0))
                .await
                .map_err(|e| RestoreError::Checkpoint(format!("reading the checkpoint: {e}")))??
                .ok_or_else(|| {
                    RestoreError::Checkpoint(format!(
                        "no valid checkpoint cut at closure {} under {dir}: the closures \
                         committed since cannot be run again",
                        cut.0
                    ))
                })?;
            restore_servers(&gateway, &servers, Some(&pinned), &layouts, &ckpt).await?;
            for ps in 0..servers.len() as u32 {
                let (target, _) = incarnation(ps)?;
                let msg = RollBack {
                    finished_below: cut.0,
                    generation,
                };
                gateway
                    .remote_ref::<RollBack>(target, PS_ACTOR)
                    .call(&msg)
                    .await
                    .map_err(|e| ps_call_error(ps, e))?;
            }
            let positions = dataset_positions(&ckpt)?;
            let mut lost = Vec::new();
            for (worker, incarnation) in workers {
                let msg = RewindWorker {
                    setup: setup_with_positions(&setup, positions.get(&worker)),
                };
                let r = gateway.remote_ref::<RewindWorker>(incarnation.clone(), WORKER_ACTOR);
                let error = match r.call(&msg).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e,
                    Err(e) => e.to_string(),
                };
                tracing::warn!("rewinding worker/{worker}'s datasets: {error}");
                lost.push((worker, incarnation.epoch.0));
            }
            Ok::<_, RestoreError>((ckpt.step, positions, lost))
        };
        ctx.spawn(work.into_actor(self).map(move |result, act, ctx| {
            let now = Instant::now();
            match result {
                Ok((step, positions, lost)) => {
                    act.positions = positions;
                    // Setups sent before now carry the old positions.
                    act.setup_version += 1;
                    // Every server's low watermark is the cut now.
                    act.watermark_sent = cut.0;
                    // A worker whose datasets could not be rewound starts over as a new
                    // incarnation, set up at the restored positions.
                    for (worker, epoch) in lost {
                        act.lose_worker(worker, epoch);
                    }
                    match act.scheduler.handle_restored(now, cut) {
                        Ok(requeued) => tracing::warn!(
                            "every parameter server restored from the checkpoint at step \
                             {step}; {requeued} closures committed since it run again"
                        ),
                        Err(e) => tracing::warn!("restore finished too late: {e}"),
                    }
                }
                Err(RestoreError::Unreachable { ps, reason }) => {
                    tracing::warn!(
                        "parameter-server restore interrupted: ps/{ps}: {reason}; trying again \
                         once every server answers"
                    );
                    act.scheduler
                        .handle_restore_interrupted(now, Some(ps), reason);
                }
                Err(e) => {
                    tracing::error!("parameter-server recovery failed: {e}");
                    act.scheduler.handle_restore_failed(now, e.to_string());
                }
            }
            act.drive(ctx);
        }));
    }

    fn worker_index(&self, node: &NodeId) -> Option<u32> {
        self.workers
            .iter()
            .position(|(n, _)| n == node)
            .map(|i| i as u32)
    }
}

/// `setup` with its datasets resuming at `positions` (a worker's, from a checkpoint).
fn setup_with_positions(
    setup: &SetupWorker,
    positions: Option<&BTreeMap<String, u64>>,
) -> SetupWorker {
    let mut setup = setup.clone();
    if let Some(positions) = positions {
        for (name, skip) in &mut setup.datasets {
            if let Some(position) = positions.get(name) {
                *skip = *position;
            }
        }
    }
    setup
}

/// What a reconnect round made of a worker that answered.
enum Reached {
    /// A new incarnation, set up and ready for work.
    New(Incarnation<NodeId>),
    /// A fenced incarnation, told to retire (its epoch).
    Retired(u64),
}

/// What a dial of a parameter server found.
enum DialOutcome {
    /// It answered as this incarnation, serving (holding variables) or not.
    Up(u64, bool),
    /// It answered as an incarnation declared dead, and was told to retire (its epoch).
    Retired(u64),
}

/// Tells the fenced incarnation `fenced` (its `actor`), at `addr`, to retire ([`Retire`]).
async fn retire(
    gateway: &Gateway,
    addr: SocketAddr,
    fenced: Incarnation<NodeId>,
    actor: &str,
) -> Result<u64, String> {
    let epoch = fenced.epoch.0;
    gateway
        .call_fenced::<Retire>(addr, &fenced, actor, &Retire { epoch })
        .await
        .map_err(|e| format!("retiring fenced epoch {epoch}: {e}"))?;
    Ok(epoch)
}

impl Actor for CoordinatorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let mut events = self.gateway.subscribe();
        let me = ctx.address();
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                // `send` waits while the mailbox is full; `try_send` would fail then and end
                // this loop, and no later death would ever reach the scheduler.
                if me.send(PeerChanged(event)).await.is_err() {
                    break;
                }
            }
        });
        self.reconnect(ctx);
        self.dial_servers(ctx);
        ctx.run_interval(RECONNECT_INTERVAL, |act, ctx| {
            act.reconnect(ctx);
            act.dial_servers(ctx);
        });
        ctx.run_interval(WATERMARK_INTERVAL, |act, _| act.send_watermark());
    }
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
                tracing::warn!(
                    "ps/{ps} (epoch {}) declared dead: {cause:?}; holding dispatch until it is \
                     back and restored",
                    incarnation.epoch.0
                );
                self.scheduler
                    .handle_ps_lost(Instant::now(), ps, incarnation.epoch.0);
                self.drive(ctx);
            } else if let Some(worker) = self.worker_index(&incarnation.node) {
                tracing::warn!(
                    "worker/{worker} (epoch {}) declared dead: {cause:?}",
                    incarnation.epoch.0
                );
                self.lose_worker(worker, incarnation.epoch.0);
                self.drive(ctx);
            } else {
                tracing::warn!(
                    "{} (epoch {}) declared dead: {cause:?}",
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

/// The ledger, and whether nothing is pending.
pub struct Status;

impl Message for Status {
    type Result = (Ledger, bool, usize);
}

impl Handler<Status> for CoordinatorActor {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Context<Self>) -> Self::Result {
        MessageResult((
            self.scheduler.ledger().clone(),
            self.scheduler.is_idle(),
            self.scheduler.live_workers(),
        ))
    }
}

/// Replace what every worker incarnation is set up with (layouts, datasets). Live workers are
/// set up again right away; the reply comes once they all answered, so that no closure
/// scheduled afterwards can overtake its setup. It carries the first setup a live worker
/// refused (e.g. an unregistered dataset function); a worker that could not be reached is
/// treated as lost, not as an error.
pub struct Configure(pub SetupWorker);

impl Message for Configure {
    type Result = oneshot::Receiver<Result<(), String>>;
}

impl Handler<Configure> for CoordinatorActor {
    type Result = MessageResult<Configure>;

    fn handle(&mut self, msg: Configure, ctx: &mut Context<Self>) -> Self::Result {
        self.setup = msg.0;
        self.setup_version += 1;
        let (done, rx) = oneshot::channel();
        let calls: Vec<_> = self
            .worker_refs
            .iter()
            .map(|(worker, r)| {
                let worker = *worker;
                let incarnation = r.target().clone();
                let reference = self
                    .gateway
                    .remote_ref::<SetupWorker>(incarnation.clone(), WORKER_ACTOR);
                let setup = self.setup_for(worker);
                async move {
                    let result = reference.call(&setup).await;
                    (worker, incarnation.epoch.0, result)
                }
            })
            .collect();
        ctx.spawn(futures::future::join_all(calls).into_actor(self).map(
            move |results, act, ctx| {
                let mut refused = Ok(());
                for (worker, epoch, result) in results {
                    let error = match result {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => {
                            // The worker answered: the setup itself is wrong, and the program
                            // must hear it rather than see every worker vanish.
                            let e = format!("worker/{worker} refused its setup: {e}");
                            if refused.is_ok() {
                                refused = Err(e.clone());
                            }
                            e
                        }
                        Err(e) => e.to_string(),
                    };
                    tracing::warn!("setting up worker/{worker}: {error}");
                    act.lose_worker(worker, epoch);
                }
                act.drive(ctx);
                let _ = done.send(refused);
            },
        ));
        MessageResult(rx)
    }
}

/// The ledger with the ids a checkpoint keeps: (ledger, next closure id, committed ids,
/// ids ended without a value).
pub struct LedgerSnapshot;

impl Message for LedgerSnapshot {
    type Result = (Ledger, u64, Vec<u64>, Vec<u64>);
}

impl Handler<LedgerSnapshot> for CoordinatorActor {
    type Result = MessageResult<LedgerSnapshot>;

    fn handle(&mut self, _: LedgerSnapshot, _: &mut Context<Self>) -> Self::Result {
        let (committed, ended) = self.scheduler.finished_ids();
        MessageResult((
            self.scheduler.ledger().clone(),
            self.scheduler.next_closure_id(),
            committed,
            ended,
        ))
    }
}

/// Continue an earlier coordinator's ledger, closure ids and the restore generation the
/// parameter servers are at (see [`Scheduler::resume`], [`Scheduler::resume_generation`]).
pub struct ResumeLedger(pub Ledger, pub u64, pub u64);

impl Message for ResumeLedger {
    type Result = Result<(), String>;
}

impl Handler<ResumeLedger> for CoordinatorActor {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: ResumeLedger, _: &mut Context<Self>) -> Self::Result {
        self.scheduler.resume(msg.0, msg.1)?;
        self.scheduler.resume_generation(msg.2);
        Ok(())
    }
}

/// What a checkpoint's consistency depends on: (next closure id, restore generation, whether
/// a recovery holds dispatch). A save reads it before and after reading the servers: if it
/// changed, or a recovery held dispatch, the save would mix two cuts (CKPT-1).
pub struct CutProbe;

impl Message for CutProbe {
    type Result = (u64, u64, bool);
}

impl Handler<CutProbe> for CoordinatorActor {
    type Result = MessageResult<CutProbe>;

    fn handle(&mut self, _: CutProbe, _: &mut Context<Self>) -> Self::Result {
        MessageResult((
            self.scheduler.next_closure_id(),
            self.scheduler.generation(),
            self.scheduler.is_holding(),
        ))
    }
}

/// Where every live worker's datasets are (worker → dataset → elements read).
pub struct CollectPositions;

impl Message for CollectPositions {
    type Result = oneshot::Receiver<Result<WorkerPositions, String>>;
}

impl Handler<CollectPositions> for CoordinatorActor {
    type Result = MessageResult<CollectPositions>;

    fn handle(&mut self, _: CollectPositions, ctx: &mut Context<Self>) -> Self::Result {
        let (done, rx) = oneshot::channel();
        let calls: Vec<_> = self
            .worker_refs
            .iter()
            .map(|(worker, r)| {
                let worker = *worker;
                let reference = self
                    .gateway
                    .remote_ref::<DatasetPositions>(r.target().clone(), WORKER_ACTOR);
                async move {
                    let reply = reference
                        .call(&DatasetPositions)
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|r| r);
                    (worker, reply)
                }
            })
            .collect();
        ctx.spawn(
            futures::future::join_all(calls)
                .into_actor(self)
                .map(move |results, _, _| {
                    let mut positions = WorkerPositions::new();
                    for (worker, reply) in results {
                        match reply {
                            Ok(list) => {
                                positions.insert(worker, list.into_iter().collect());
                            }
                            Err(e) => {
                                let _ = done.send(Err(format!("worker/{worker}: {e}")));
                                return;
                            }
                        }
                    }
                    let _ = done.send(Ok(positions));
                }),
        );
        MessageResult(rx)
    }
}

/// Where each worker's datasets resume (restored from a checkpoint); applies to every worker
/// incarnation set up from now on.
pub struct SetPositions(pub WorkerPositions);

impl Message for SetPositions {
    type Result = ();
}

impl Handler<SetPositions> for CoordinatorActor {
    type Result = ();

    fn handle(&mut self, msg: SetPositions, _: &mut Context<Self>) {
        self.positions = msg.0;
    }
}

/// A checkpoint taken at `cut` (the next closure id then, with nothing pending) is durable
/// under `root`: a parameter-server recovery restores from there and rolls back to `cut`
/// (see [`Scheduler::mark_cut`]).
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
    type Result = Result<(), String>;
}

impl Handler<MarkCut> for CoordinatorActor {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: MarkCut, _: &mut Context<Self>) -> Self::Result {
        if let Some(generation) = msg.generation {
            if generation != self.scheduler.generation() {
                return Err(format!(
                    "a parameter-server restore began since the checkpoint was read (restore \
                     generation {generation}, now {})",
                    self.scheduler.generation()
                ));
            }
        }
        self.scheduler.mark_cut(msg.cut)?;
        self.checkpoint_root = Some(msg.root);
        Ok(())
    }
}

/// How often workers without a live incarnation are dialled (and fenced ones that still
/// answer are retired), and parameter servers counted down are dialled.
const RECONNECT_INTERVAL: Duration = Duration::from_millis(200);
/// How often the low watermark goes to the parameter servers when it has risen: each keeps
/// about this long's worth of applied closure ids for PS-1.
const WATERMARK_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roles::coordinator::SchedulerConfig;
    use cohort_actors::{Epoch, GatewayConfig, HeartbeatConfig, RefusedReason, Remote};
    use cohort_transport::{ClusterCa, Endpoint, TransportConfig};

    fn gateway(ca: &ClusterCa, node: &NodeId, epoch: u64) -> Gateway {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let endpoint =
            Endpoint::bind(any, ca.issue(node).unwrap(), TransportConfig::for_tests()).unwrap();
        Gateway::start(
            endpoint,
            GatewayConfig {
                epoch: Epoch(epoch),
                heartbeat: HeartbeatConfig {
                    interval: Duration::from_millis(100),
                    timeout: Duration::from_secs(2),
                },
                call_timeout: Duration::from_secs(5),
                ..GatewayConfig::default()
            },
        )
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
            let (ledger, idle, _) = actor.send(Status).await.unwrap();
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
                            Some((name, _)) => {
                                Err(format!("no dataset function {name:?} registered"))
                            }
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
            let workers = vec![(worker_node, worker.local_addr().unwrap())];
            let chief = gateway(&ca, &NodeId::new("chief", 0), 1);
            let scheduler = Scheduler::new(SchedulerConfig::default());
            let actor = CoordinatorActor::new(chief, scheduler, workers, Vec::new()).start();
            while actor.send(Status).await.unwrap().2 < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let setup = SetupWorker {
                num_workers: 1,
                layouts_json: "[]".into(),
                datasets: vec![("missing".into(), 0)],
            };
            let rx = actor.send(Configure(setup)).await.unwrap();
            let err = rx.await.unwrap().unwrap_err();
            assert!(err.contains("worker/0") && err.contains("missing"), "{err}");
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
            super::super::restore::DATASET_POSITIONS_KEY: { "0": { "ids": 5 } }
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
            scheduler.mark_cut(ClosureId(0)).unwrap();
            let servers = vec![(ps_node, ps.local_addr().unwrap())];
            let workers = vec![(worker_node, worker.local_addr().unwrap())];
            let actor = CoordinatorActor::new(chief, scheduler, workers, servers).start();
            let setup = SetupWorker {
                num_workers: 1,
                layouts_json: "[]".into(),
                datasets: vec![("ids".into(), 0)],
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
            while actor.send(Status).await.unwrap().2 < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (ledger, _, _) = actor.send(Status).await.unwrap();
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
