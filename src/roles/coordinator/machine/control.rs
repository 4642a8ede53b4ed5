//! The coordinator machine's control plane towards workers, and the save's reads: which worker
//! is dialled and when, how a new incarnation is set up or a fenced one retired, the fan-out of
//! a new configuration to live workers, the collection of dataset positions for a save's read
//! ([`super::save`]), and what a save reads of the machine (the cut state, the ledger with its
//! ids).
//!
//! Worker lifecycle, in the order the machine drives it:
//! 1. every reconnect tick, each worker with no live incarnation and no dial under way is
//!    dialled ([`SchedulerAction::DialWorker`]); none while a restore runs (a worker set up now
//!    would start at the positions the restore is about to replace);
//! 2. the dial's outcome ([`Scheduler::handle_worker_dialled`]): an incarnation the failure
//!    detector declared dead, or one not newer than the newest fenced or set up, is retired
//!    ([`SchedulerAction::RetireWorker`], FENCE-1: it can do nothing useful and must come back
//!    as a new one); a newer one is set up from scratch ([`SchedulerAction::SetUpWorker`],
//!    with [`Scheduler::setup_for`] and the setup version it was made from);
//! 3. the setup's outcome ([`Scheduler::handle_worker_set_up`]): the incarnation is up unless
//!    the setup was outdated meanwhile (a restore or a new configuration) or a restore runs;
//!    then the next tick sets it up again.
//!
//! One dial (with its setup) at a time per worker. Every remote effect's outcome comes back,
//! including those the machine takes no decision on (retiring, fencing, the watermark): they
//! are counted in [`ControlCounters`].
//!
//! Pure: no IO, no clock; `now` is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use super::dials::WorkerSet;
use super::recovery::{CallFault, WorkerPositions};
use super::{
    ClosureId, CutReadError, Ledger, MarkCutError, Scheduler, SchedulerAction, WorkerIncarnation,
};
use crate::roles::protocol::{LeaveAnswer, SetupWorker};
use crate::roles::push::LearningRate;

/// What a dial of a worker found ([`SchedulerAction::DialWorker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerDial {
    /// Incarnation `incarnation` answered.
    Answered {
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// It answered as incarnation `incarnation`, which the failure detector declared dead (a false
    /// death: frozen past the budget, then woken).
    DeclaredDead {
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// No answer (not up yet, unreachable): dialled again at the next tick.
    Unreachable,
}

/// What became of a new incarnation's setup ([`Scheduler::handle_worker_set_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetUpDisposition {
    /// The incarnation is up and may get work.
    Up,
    /// The setup was outdated meanwhile (or a restore runs): the next tick sets it up again.
    Outdated,
    /// The setup failed: the next tick dials it again.
    Failed,
}

/// Names a configuration fanned out with [`Scheduler::handle_reconfigure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigureTicket(pub u64);

/// Names a collection of dataset positions for a save's read
/// ([`Scheduler::handle_read_cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PositionsTicket(pub u64);

/// What a checkpoint's consistency depends on. A save reads it before and after reading the
/// servers: if it changed, or a recovery held dispatch, the save would mix two cuts (CKPT-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutState {
    /// The id the next scheduled closure gets.
    pub next_closure_id: u64,
    /// The restore generation.
    pub generation: u64,
    /// Whether a parameter-server recovery holds dispatch.
    pub holding: bool,
}

/// The ledger with the closure ids a checkpoint keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerState {
    /// The counts (LEDGER-1).
    pub ledger: Ledger,
    /// The id the next scheduled closure gets.
    pub next_closure_id: u64,
    /// Retained committed closures.
    pub committed_ids: Vec<u64>,
    /// Retained closures that ended without a value.
    pub ended_ids: Vec<u64>,
}

/// The coordinator's state as the program's status calls see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorStatus {
    /// The ledger (LEDGER-1).
    pub ledger: Ledger,
    /// Nothing queued or in flight.
    pub idle: bool,
    /// Workers with a live incarnation.
    pub live_workers: usize,
    /// A parameter-server recovery holds dispatch (a server is lost, restarting or being
    /// restored).
    pub recovering: bool,
    /// The rate the closures scheduled from now on carry (`None`: the servers' own).
    pub learning_rate: Option<LearningRate>,
}

/// What the machine knows of one task's incarnation (the status page's tasks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskLiveness {
    /// No incarnation seen yet (or none since the machine started).
    Waiting,
    /// Its incarnation is up.
    Alive,
    /// Its incarnation was lost (declared dead or unreachable) and no newer one is up.
    Dead,
    /// A worker being drained: it gets no new work.
    Draining,
    /// Out of the job: a worker drained, a parameter server that left.
    Retired,
}

/// One task as the machine knows it: index, newest incarnation seen, liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownTask {
    /// The task index.
    pub index: u32,
    /// Its newest incarnation seen, if any.
    pub incarnation: Option<u64>,
    /// What the machine makes of it.
    pub liveness: TaskLiveness,
}

/// Outcomes of remote effects the machine takes no decision on, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// Fenced worker incarnations that answered and were told to retire.
    pub workers_retired: u64,
    /// Parameter-server incarnations declared dead that answered and were told to retire.
    pub servers_retired: u64,
    /// Retire calls that did not get through (the process was gone already, most often).
    pub retires_failed: u64,
    /// Fences a parameter server did not take (it is down; a restore replays every fence).
    pub fences_undelivered: u64,
    /// Low watermarks a parameter server did not take (it gets the next one).
    pub watermarks_undelivered: u64,
    /// Setups of a new incarnation that failed (it is dialled again).
    pub setups_failed: u64,
    /// Setups of a new incarnation discarded as outdated (it is set up again).
    pub setups_outdated: u64,
    /// Worker incarnations that left after a preemption notice (handed back their closures).
    pub workers_left: u64,
    /// Parameter-server incarnations that left after a preemption notice.
    pub servers_left: u64,
    /// Preemption cuts taken and marked (each server that left with one restores with nothing
    /// to run again).
    pub preemption_cuts: u64,
    /// Preemption cuts given up (the servers left without one).
    pub preemption_cuts_given_up: u64,
}

/// Why setting the workers up again failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigureError {
    /// Too many configurations are under way.
    #[error("{max} worker configurations are under way already")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// A worker refused its setup (the setup itself is wrong: a dataset function it does not
    /// register, say); that worker is lost.
    #[error("worker/{worker} refused its setup: {reason}")]
    Refused {
        /// The worker.
        worker: u32,
        /// What it said.
        reason: String,
    },
}

/// The control sub-machine's requests to every live worker under way: configurations and
/// collections of dataset positions, each waiting for the answers of the incarnations it went
/// to (at most [`REQUESTS_PENDING_MAX`] of each kind).
#[derive(Debug, Default)]
pub(super) struct WorkerRequests {
    /// Configurations, with their first refusal.
    configures: FanOut<ConfigureTicket, Option<ConfigureError>>,
    /// Collections of dataset positions, with the positions answered.
    collections: FanOut<PositionsTicket, WorkerPositions>,
}

impl WorkerRequests {
    /// A configuration `ticket` went to the incarnations `to`.
    fn begin_configure(
        &mut self,
        ticket: ConfigureTicket,
        to: Vec<(u32, WorkerIncarnation)>,
    ) -> Result<(), ConfigureError> {
        if !self.configures.begin(ticket, to, None) {
            return Err(ConfigureError::TooMany {
                max: REQUESTS_PENDING_MAX,
            });
        }
        Ok(())
    }

    /// Incarnation `incarnation` of `worker` answered configuration `ticket`, refusing it
    /// (`refused`) or not; `false` if that answer was not awaited.
    fn configure_answered(
        &mut self,
        ticket: ConfigureTicket,
        worker: u32,
        incarnation: WorkerIncarnation,
        refused: Option<&str>,
    ) -> bool {
        let Some(first_refusal) = self.configures.answered(ticket, worker, incarnation) else {
            return false;
        };
        if let Some(reason) = refused {
            first_refusal.get_or_insert_with(|| ConfigureError::Refused {
                worker,
                reason: reason.to_string(),
            });
        }
        true
    }

    /// Configuration `ticket`'s outcome (its first refusal), taken out once every answer is in.
    fn take_finished_configure(
        &mut self,
        ticket: ConfigureTicket,
    ) -> Option<Result<(), ConfigureError>> {
        let first_refusal = self.configures.take_done(ticket)?;
        Some(first_refusal.map_or(Ok(()), Err))
    }

    /// A collection `ticket` of dataset positions went to the incarnations `to`.
    fn begin_collection(
        &mut self,
        ticket: PositionsTicket,
        to: Vec<(u32, WorkerIncarnation)>,
    ) -> Result<(), CutReadError> {
        if !self.collections.begin(ticket, to, WorkerPositions::new()) {
            return Err(CutReadError::PositionsBusy {
                max: REQUESTS_PENDING_MAX,
            });
        }
        Ok(())
    }

    /// Incarnation `incarnation` of `worker` answered collection `ticket` with its positions
    /// (`None`: it could not); `false` if that answer was not awaited.
    fn positions_answered(
        &mut self,
        ticket: PositionsTicket,
        worker: u32,
        incarnation: WorkerIncarnation,
        positions: Option<Vec<(String, u64)>>,
    ) -> bool {
        let Some(answered) = self.collections.answered(ticket, worker, incarnation) else {
            return false;
        };
        if let Some(list) = positions {
            answered.insert(worker, list.into_iter().collect());
        }
        true
    }

    /// Collection `ticket`'s answers, taken out once every answer is in.
    fn take_finished_collection(&mut self, ticket: PositionsTicket) -> Option<WorkerPositions> {
        self.collections.take_done(ticket)
    }
}

/// Requests of one kind, each sent to some worker incarnations and gathering `A` from their
/// answers until none is awaited; at most [`REQUESTS_PENDING_MAX`] at once.
#[derive(Debug)]
struct FanOut<K, A> {
    pending: BTreeMap<K, (BTreeSet<(u32, WorkerIncarnation)>, A)>,
}

impl<K, A> Default for FanOut<K, A> {
    fn default() -> Self {
        Self {
            pending: BTreeMap::new(),
        }
    }
}

impl<K: Ord, A> FanOut<K, A> {
    /// Request `ticket` went to `to`, gathering into `gathered`; `false` (nothing recorded)
    /// if [`REQUESTS_PENDING_MAX`] are under way.
    fn begin(&mut self, ticket: K, to: Vec<(u32, WorkerIncarnation)>, gathered: A) -> bool {
        if self.pending.len() >= REQUESTS_PENDING_MAX {
            return false;
        }
        self.pending
            .insert(ticket, (to.into_iter().collect(), gathered));
        true
    }

    /// What request `ticket` gathers, if the answer of `worker`'s incarnation `incarnation`
    /// was awaited (it is not any more).
    fn answered(
        &mut self,
        ticket: K,
        worker: u32,
        incarnation: WorkerIncarnation,
    ) -> Option<&mut A> {
        let (waiting, gathered) = self.pending.get_mut(&ticket)?;
        waiting.remove(&(worker, incarnation)).then_some(gathered)
    }

    /// What request `ticket` gathered, taken out once no answer is awaited.
    fn take_done(&mut self, ticket: K) -> Option<A> {
        if !self
            .pending
            .get(&ticket)
            .is_some_and(|(waiting, _)| waiting.is_empty())
        {
            return None;
        }
        self.pending.remove(&ticket).map(|(_, gathered)| gathered)
    }
}

impl Scheduler {
    /// The cluster has `num_workers` workers, indexed from 0: each without a live incarnation
    /// is dialled ([`Self::handle_reconnect_tick`]).
    pub fn with_workers(mut self, num_workers: u32) -> Self {
        self.worker_set = WorkerSet::of_spec(num_workers);
        self
    }

    /// Emits [`SchedulerAction::DialWorker`] for every worker with no live incarnation and no
    /// dial under way, unless a restore runs (part of [`Self::handle_reconnect_tick`]).
    pub(super) fn dial_workers(&mut self) {
        if self.is_restoring() {
            return;
        }
        for worker in self.members() {
            if self.worker_incarnation(worker).is_none() && self.worker_set.start_dial(worker) {
                self.actions
                    .push_back(SchedulerAction::DialWorker { worker });
            }
        }
    }

    /// The outcome of a [`SchedulerAction::DialWorker`]. A dead-declared or not-newer
    /// incarnation is retired ([`SchedulerAction::RetireWorker`]); a newer one is set up
    /// ([`SchedulerAction::SetUpWorker`]) unless a restore began meanwhile (then the next
    /// tick dials it again); no answer waits for the next tick.
    pub fn handle_worker_dialled(&mut self, _now: Instant, worker: u32, dial: WorkerDial) {
        if !self.worker_set.is_dialling(worker) {
            return;
        }
        let known = self.known_worker_incarnation(worker);
        match dial {
            WorkerDial::Answered { incarnation } if known.is_none_or(|k| incarnation > k) => {
                if self.is_restoring() {
                    self.worker_set.dial_ended(worker);
                    return;
                }
                self.actions.push_back(SchedulerAction::SetUpWorker {
                    worker,
                    incarnation,
                    setup: self.setup_for(worker),
                    version: self.setup_version,
                });
            }
            WorkerDial::Answered { incarnation } | WorkerDial::DeclaredDead { incarnation } => {
                self.worker_set.dial_ended(worker);
                self.actions.push_back(SchedulerAction::RetireWorker {
                    worker,
                    incarnation,
                });
            }
            WorkerDial::Unreachable => {
                self.worker_set.dial_ended(worker);
            }
        }
    }

    /// The outcome of a [`SchedulerAction::SetUpWorker`] made from setup `version`: the
    /// incarnation is up (and may get work) if the setup is still current and no restore
    /// runs; otherwise the next tick dials and sets it up again.
    pub fn handle_worker_set_up(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        version: u64,
        result: Result<(), CallFault>,
    ) -> SetUpDisposition {
        self.worker_set.dial_ended(worker);
        if result.is_err() {
            self.control.setups_failed += 1;
            return SetUpDisposition::Failed;
        }
        // A worker drained meanwhile is not a member any more (see `membership`).
        if version != self.setup_version || self.is_restoring() || !self.is_member(worker) {
            self.control.setups_outdated += 1;
            return SetUpDisposition::Outdated;
        }
        self.handle_worker_up(now, worker, incarnation);
        SetUpDisposition::Up
    }

    /// The outcome of a [`SchedulerAction::RetireWorker`] (counted).
    pub fn handle_worker_retired(
        &mut self,
        _worker: u32,
        _epoch: WorkerIncarnation,
        result: Result<(), CallFault>,
    ) {
        match result {
            Ok(()) => self.control.workers_retired += 1,
            Err(_) => self.control.retires_failed += 1,
        }
    }

    /// The outcome of a [`SchedulerAction::RetirePs`] (counted).
    pub fn handle_ps_retired(&mut self, _ps: u32, _epoch: u64, result: Result<(), CallFault>) {
        match result {
            Ok(()) => self.control.servers_retired += 1,
            Err(_) => self.control.retires_failed += 1,
        }
    }

    /// Whether parameter server `ps` took the fence of `worker`'s incarnation `incarnation`
    /// ([`SchedulerAction::Fence`]); counted. A server that missed it is down: the restore
    /// that brings it back replays every fence (FENCE-1).
    pub fn handle_fence_sent(
        &mut self,
        _worker: u32,
        _epoch: WorkerIncarnation,
        _ps: u32,
        result: Result<(), CallFault>,
    ) {
        if result.is_err() {
            self.control.fences_undelivered += 1;
        }
    }

    /// Whether parameter server `ps` took the low watermark ([`SchedulerAction::Watermark`]);
    /// counted. A server that missed one gets the next.
    pub fn handle_watermark_sent(&mut self, _ps: u32, result: Result<(), CallFault>) {
        if result.is_err() {
            self.control.watermarks_undelivered += 1;
        }
    }

    /// Worker `worker`'s incarnation `incarnation` got a preemption notice and is about to go. Unless
    /// the chief is `stopping` too (its own preemption checkpoint needs the workers to finish
    /// its steps: the worker stays through its grace), the incarnation is lost now, as if the
    /// failure detector had declared it dead: fenced (FENCE-1), its closures queued again for
    /// other workers at once, and the worker dialled again when it comes back as a new
    /// incarnation. An incarnation not live (older, fenced already) may go as well.
    pub fn handle_worker_leaving(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        stopping: bool,
    ) -> LeaveAnswer {
        if stopping {
            return LeaveAnswer::Stay;
        }
        if self.worker_incarnation(worker) == Some(incarnation) {
            self.control.workers_left += 1;
            self.handle_worker_lost(now, worker, incarnation);
        }
        LeaveAnswer::Go
    }

    /// The program changed what workers are set up with (`layouts` are the setup's, parsed):
    /// as [`Self::handle_configure`], and every live worker is set up again right away
    /// ([`SchedulerAction::Reconfigure`]). [`SchedulerAction::ConfigureFinished`] with the
    /// returned ticket comes once every one answered, so that no closure scheduled afterwards
    /// can overtake its setup; it carries the first refusal (the setup itself is wrong, and the
    /// program must hear it). A worker that refused or could not be reached is lost. Refused
    /// with more than `REQUESTS_PENDING_MAX` configurations under way.
    pub fn handle_reconfigure(
        &mut self,
        now: Instant,
        setup: SetupWorker,
    ) -> Result<ConfigureTicket, ConfigureError> {
        let ticket = ConfigureTicket(self.next_ticket);
        let live = self.live_incarnations();
        self.requests.begin_configure(ticket, live.clone())?;
        self.next_ticket += 1;
        self.handle_configure(setup);
        for &(worker, incarnation) in &live {
            self.actions.push_back(SchedulerAction::Reconfigure {
                ticket,
                worker,
                incarnation,
                setup: self.setup_for(worker),
            });
        }
        self.finish_configure(now, ticket);
        Ok(ticket)
    }

    /// The answer of `worker`'s incarnation `incarnation` to a [`SchedulerAction::Reconfigure`]:
    /// a refusal is recorded for the program and, as no answer, loses the worker.
    pub fn handle_reconfigured(
        &mut self,
        now: Instant,
        ticket: ConfigureTicket,
        worker: u32,
        incarnation: WorkerIncarnation,
        result: Result<(), CallFault>,
    ) {
        let refused = match &result {
            Err(CallFault::Refused(reason)) => Some(reason.as_str()),
            _ => None,
        };
        if !self
            .requests
            .configure_answered(ticket, worker, incarnation, refused)
        {
            return;
        }
        if result.is_err() {
            self.handle_worker_lost(now, worker, incarnation);
        }
        self.finish_configure(now, ticket);
    }

    /// Asks every live worker where its datasets are, for the save's read under way
    /// ([`SchedulerAction::AskPositions`]); the read gets them once every one answered (see
    /// [`super::save`]). Refused with more than [`REQUESTS_PENDING_MAX`] collections under way
    /// (those of reads given up still count until their answers come, each bounded in time).
    pub(super) fn collect_positions(&mut self) -> Result<PositionsTicket, CutReadError> {
        let ticket = PositionsTicket(self.next_ticket);
        let live = self.live_incarnations();
        self.requests.begin_collection(ticket, live.clone())?;
        self.next_ticket += 1;
        for &(worker, incarnation) in &live {
            self.actions.push_back(SchedulerAction::AskPositions {
                ticket,
                worker,
                incarnation,
            });
        }
        Ok(ticket)
    }

    /// The answer of `worker`'s incarnation `incarnation` to a [`SchedulerAction::AskPositions`]. A
    /// save must survive any worker fault the job survives: a worker that does not answer is
    /// lost (fenced; its closures run elsewhere), and the checkpoint records it where its next
    /// incarnation will start, the positions it was last set up from.
    pub fn handle_positions(
        &mut self,
        now: Instant,
        ticket: PositionsTicket,
        worker: u32,
        incarnation: WorkerIncarnation,
        result: Result<Vec<(String, u64)>, CallFault>,
    ) {
        let lost = result.is_err();
        if !self
            .requests
            .positions_answered(ticket, worker, incarnation, result.ok())
        {
            return;
        }
        if lost {
            self.handle_worker_lost(now, worker, incarnation);
        }
        self.finish_positions(ticket, now);
    }

    /// [`Self::mark_cut`] for a save that read the servers in restore `generation` (if
    /// known): refused if a restore began since (the checkpoint is from before it, CKPT-1).
    pub fn handle_mark_cut(
        &mut self,
        cut: ClosureId,
        root: PathBuf,
        generation: Option<u64>,
    ) -> Result<(), MarkCutError> {
        if let Some(generation) = generation.filter(|g| *g != self.generation) {
            let refused = MarkCutError::RestoreSince {
                read_in: generation,
                now: self.generation,
            };
            self.cut_write_ended(cut, Some(refused.to_string()));
            return Err(refused);
        }
        self.mark_cut(cut, root)
    }

    /// What a save's consistency depends on now.
    pub fn cut_state(&self) -> CutState {
        CutState {
            next_closure_id: self.next_id,
            generation: self.generation,
            holding: self.is_holding(),
        }
    }

    /// The ledger with the ids a checkpoint keeps.
    pub fn ledger_state(&self) -> LedgerState {
        let (committed_ids, ended_ids) = self.finished_ids();
        LedgerState {
            ledger: self.ledger.clone(),
            next_closure_id: self.next_id,
            committed_ids,
            ended_ids,
        }
    }

    /// The ledger, whether nothing is pending, and the live workers.
    pub fn status(&self) -> CoordinatorStatus {
        CoordinatorStatus {
            ledger: self.ledger.clone(),
            idle: self.is_idle(),
            live_workers: self.live_workers(),
            recovering: self.is_holding(),
            learning_rate: self.learning_rate,
        }
    }

    /// Every worker the machine knows of (the cluster spec's, those that joined, any seen),
    /// in index order, with its liveness.
    pub fn known_workers(&self) -> Vec<KnownTask> {
        let indices: BTreeSet<u32> = self
            .members()
            .into_iter()
            .chain(self.workers.keys().copied())
            .chain(0..self.worker_set.spec())
            .collect();
        indices
            .into_iter()
            .map(|index| {
                let entry = self.workers.get(&index);
                let liveness = if !self.is_member(index) {
                    TaskLiveness::Retired
                } else if self.is_draining(index) {
                    TaskLiveness::Draining
                } else {
                    match entry {
                        Some(w) if w.alive => TaskLiveness::Alive,
                        Some(_) => TaskLiveness::Dead,
                        None => TaskLiveness::Waiting,
                    }
                };
                KnownTask {
                    index,
                    incarnation: entry.map(|w| w.incarnation),
                    liveness,
                }
            })
            .collect()
    }

    /// Every parameter server the machine knows of (those of the job now, and any seen
    /// before), in index order, with its liveness.
    pub fn known_servers(&self) -> Vec<KnownTask> {
        let indices: BTreeSet<u32> = self
            .server_set
            .indexes()
            .iter()
            .chain(self.servers.keys())
            .copied()
            .collect();
        indices
            .into_iter()
            .map(|index| {
                let entry = self.servers.get(&index);
                let liveness = if !self.server_set.contains(index) {
                    TaskLiveness::Retired
                } else {
                    match entry {
                        Some(ps) if ps.alive && !ps.dead => TaskLiveness::Alive,
                        Some(_) => TaskLiveness::Dead,
                        None => TaskLiveness::Waiting,
                    }
                };
                KnownTask {
                    index,
                    incarnation: entry.map(|ps| ps.incarnation),
                    liveness,
                }
            })
            .collect()
    }

    /// Outcomes of the remote effects the machine takes no decision on.
    pub fn control_counters(&self) -> ControlCounters {
        self.control
    }

    /// Workers with a dial or a setup under way.
    pub fn workers_dialling(&self) -> Vec<u32> {
        self.worker_set.dialling().collect()
    }

    /// The newest incarnation of `worker` ever up or fenced: an answer from one not newer is
    /// a fenced incarnation still alive (FENCE-1).
    fn known_worker_incarnation(&self, worker: u32) -> Option<WorkerIncarnation> {
        let up = self.workers.get(&worker).map(|w| w.incarnation);
        let fenced = self.fenced.get(&worker).copied();
        up.max(fenced)
    }

    fn live_incarnations(&self) -> Vec<(u32, WorkerIncarnation)> {
        self.workers
            .iter()
            .filter(|(_, w)| w.alive)
            .map(|(i, w)| (*i, w.incarnation))
            .collect()
    }

    fn finish_configure(&mut self, now: Instant, ticket: ConfigureTicket) {
        if let Some(result) = self.requests.take_finished_configure(ticket) {
            self.actions
                .push_back(SchedulerAction::ConfigureFinished { ticket, result });
        }
        self.dispatch(now);
    }

    /// Hands a collection that every worker answered to the save's read that asked for it.
    pub(super) fn finish_positions(&mut self, ticket: PositionsTicket, now: Instant) {
        let Some(answered) = self.requests.take_finished_collection(ticket) else {
            return;
        };
        // Workers not live now restart from their last setup's positions.
        let mut positions = self.positions.clone();
        positions.extend(answered);
        // A read given up since finds nothing to hand them to.
        self.cut_positions_collected(now, ticket, positions);
    }
}

/// Configurations, and collections of positions, under way at once (each ends once every
/// live worker answered, and every call is bounded in time).
pub const REQUESTS_PENDING_MAX: usize = 64;
