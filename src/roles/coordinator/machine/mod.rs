//! The coordinator's scheduling decisions as a pure state machine: which closure runs where,
//! what happens when a worker or a parameter server is lost, what `join` reports, and the
//! ledger (LEDGER-1).
//!
//! Parameter-server recovery (DESIGN §5): when a parameter server is lost (declared dead, seen
//! back as a new incarnation, or reported unreachable by a worker), dispatch is held; the
//! closures in flight finish or fail (those that failed for the server are queued again); once
//! every server is back, every server is restored from the checkpoint taken at the last cut
//! (the restore sub-machine, [`recovery`], whose calls come out as
//! [`SchedulerAction::Restore`]) and the closures committed since that cut are queued again ([`Ledger::rolled_back`]), so that each scheduled closure's effect is present exactly
//! once. Each restore starts a new restore generation: the servers refuse every push while it
//! runs and any push, watermark or roll-back of an older generation after it (PS-1), and it
//! carries every fence so far to servers that restarted (FENCE-1). A server that restarts
//! while the restore runs (its pinned incarnation changed) is restored again; an interrupted
//! restore is tried again, a bounded number of times. With no cut, past
//! [`SchedulerConfig::ps_restart_wait_max`] waiting for the servers (a running restore is
//! never cut), or with more closures committed since the cut than
//! [`SchedulerConfig::rollback_retained_max`] (or more bytes of them than
//! [`SchedulerConfig::rollback_retained_bytes_max`]), the loss fails `join` with
//! [`ClosureFailure::PsLost`] instead.
//!
//! The cut before the last one stays a fallback: the closures committed since it are kept
//! too (while they fit in `rollback_retained_max`), so that a recovery whose checkpoint
//! cannot be read any more (a file lost or bit-flipped on disk after the save verified it)
//! rolls back to the older checkpoint instead of failing, and runs again everything
//! committed since that one.
//!
//! The chief program's restore at start-up runs through the same sub-machine
//! ([`Scheduler::handle_restore_at_start`]), and the machine also owns what every worker
//! incarnation is set up with (layouts, datasets, the positions they resume at) and when the
//! low watermark goes to the servers.
//!
//! No IO, no clock, no threads: the actor shell passes `now` in and carries out the actions it
//! drains. This is what lets the recovery logic be tested over every order of events.
//!
//! This file holds the [`Scheduler`]'s state and configuration and a closure's life (schedule,
//! dispatch, results, a worker's loss); `ps_recovery.rs` a parameter server's loss and every
//! restore; `actions.rs` what the shell is told, `failures.rs` why something failed; and each
//! sub-machine (control, membership, preempt, recovery, reshard, rollback, save, servers) the
//! state it owns.

mod actions;
pub mod control;
#[cfg(test)]
mod control_tests;
mod created_again;
#[cfg(test)]
mod created_again_tests;
mod cut_reads;
mod dials;
mod failures;
pub mod membership;
#[cfg(test)]
mod membership_tests;
pub mod preempt;
#[cfg(test)]
mod preempt_tests;
mod ps_recovery;
pub mod recovery;
#[cfg(test)]
mod recovery_tests;
pub mod reshard;
#[cfg(test)]
mod reshard_tests;
mod rollback;
pub mod save;
#[cfg(test)]
mod save_tests;
pub mod servers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::checkpoint::Checkpoint;
use crate::cluster::{ps_restart_wait_for, DEFAULT_DETECTION_BUDGET, DEFAULT_STEP_TIMEOUT};
pub use crate::ledger::Ledger;
use crate::roles::protocol::SetupWorker;
use crate::roles::push::LearningRate;

pub use control::ConfigureError;
use control::WorkerRequests;
pub use control::{
    ConfigureTicket, ControlCounters, CoordinatorStatus, CutState, KnownTask, LedgerState,
    PositionsTicket, SetUpDisposition, TaskLiveness, WorkerDial,
};
use cut_reads::CutReads;
use dials::{ServerSet, WorkerSet};
pub use membership::DrainDisposition;
use preempt::Preemptions;
pub use preempt::{CutWriteError, PREEMPTION_CUTS_DIR, PREEMPTION_CUT_MAX};
use recovery::{
    CheckpointRef, CheckpointSource, RestoreCall, RestoreReport, RestoreRun, RewindTargets, RunEnd,
    WorkerPositions,
};
use rollback::{KeptCut, RestoreBlocker, Retained, RetainedBounds, RollbackLine};
use save::recorded_learning_rate;
pub use save::{CheckpointBuildError, CutReadError, MalformedRead};
pub use save::{CutReading, CutTicket, ShardRead, SAVE_WAIT_MAX};
use servers::{ChiefStart, Creates};
pub use servers::{CreateError, CreateTicket};

pub use crate::ledger::{ClosureId, WorkerIncarnation};

pub use actions::{
    ClosureState, PsDial, RestoreTicket, ResultDisposition, SchedulerAction, ServerProbe,
};
pub use failures::{
    ClosureError, ClosureFailure, ClosureOutcomeError, MarkCutError, PsLossCause, ScheduleError,
    StartFailure,
};

/// How the coordinator schedules; every count is bounded.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Closures in flight on one worker at a time (TensorFlow's default is 1).
    pub in_flight_per_worker: usize,
    /// Closures that may wait in the queue; `schedule` beyond this is refused.
    pub queue_max: usize,
    /// Dispatch attempts of one closure before it fails as unavailable (bounds re-dispatch).
    pub attempts_max: u32,
    /// How long pending work may wait with no live worker before it fails as unavailable.
    pub no_worker_wait_max: Duration,
    /// Finished closures whose values stay fetchable; older ones are forgotten (the ledger
    /// still counts them), so a long job's memory stays bounded.
    pub finished_retained_max: usize,
    /// Bound on one closure's run on a worker (the coordinator's call that dispatches it), kept
    /// apart from the bound on ordinary remote calls: a step that is merely long is never cut
    /// while its worker heartbeats. Past it the step counts as hung: the worker incarnation is
    /// fenced and retired and the closure re-dispatched. A worker that dies or freezes is
    /// caught by the failure detector within its budget, not by this. At most 24 hours (how
    /// long a receiving gateway keeps delivering one call).
    pub step_timeout: Duration,
    /// How long dispatch is held after a parameter server is lost, for its new incarnation
    /// (restarted by the supervisor) to come back and every server to be restored; past it
    /// `join`/`fetch` fail naming the server. Default: [`ps_restart_wait_for`] the detection
    /// budget.
    pub ps_restart_wait_max: Duration,
    /// Closures committed since the last checkpoint whose function and arguments are kept, so
    /// that a rollback to that checkpoint can run them again. Past it a parameter-server loss
    /// cannot be recovered (and says so) until the next checkpoint.
    pub rollback_retained_max: usize,
    /// The same bound in bytes of those closures' functions and arguments (64 bytes counted
    /// for each besides), so that a program that passes its data in a closure's arguments
    /// keeps the chief's memory bounded: past it, as past `rollback_retained_max`.
    pub rollback_retained_bytes_max: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            in_flight_per_worker: 1,
            queue_max: 100_000,
            attempts_max: 16,
            no_worker_wait_max: Duration::from_secs(60),
            finished_retained_max: 100_000,
            step_timeout: DEFAULT_STEP_TIMEOUT,
            ps_restart_wait_max: ps_restart_wait_for(DEFAULT_DETECTION_BUDGET),
            rollback_retained_max: 100_000,
            rollback_retained_bytes_max: 1 << 30,
        }
    }
}

/// The scheduling state machine behind `ClusterCoordinator`.
///
/// Calling protocol:
/// 1. `handle_worker_up(now, worker, incarnation)` when a worker incarnation connects, and
///    `handle_worker_lost(now, worker, incarnation)` when the failure detector declares it dead;
/// 2. `handle_schedule(now, function, args)` for each `schedule` call;
/// 3. drain `poll_action()` after every `handle_*` call and carry the actions out;
/// 4. `handle_result(now, worker, incarnation, closure, attempt, outcome)` when a worker reports,
///    `handle_refused(now, worker, incarnation, closure, attempt)` when it could not run the closure;
/// 5. arm a timer for `poll_timeout()` and call `handle_timeout(now)` when it fires;
/// 6. `join` is done when `is_idle()`; `take_error()` then gives the first failure, once;
/// 7. `low_watermark()` at any time: every closure below it is finished for good;
/// 8. parameter servers: `handle_ps_up(now, ps, incarnation)` whenever a server incarnation is seen
///    alive (a newer incarnation means it restarted and lost its state), `handle_ps_lost` when the
///    failure detector declares one dead, `handle_ps_unavailable` when a worker could not
///    reach one; while [`Scheduler::ps_down`] names servers, dial them and report what answers;
/// 9. `mark_cut(cut, root)` after each durable checkpoint (taken with nothing pending) under
///    `root`; each [`SchedulerAction::Restore`] call is answered with
///    `handle_restore_report` (with its generation); `handle_restore_at_start(now, ..)` asks
///    for the chief program's restore at start-up, answered by
///    [`SchedulerAction::RestoreFinished`];
/// 10. `generation()` is the restore generation: it goes with each dispatch;
///     `handle_watermark_tick()` at a steady interval emits [`SchedulerAction::Watermark`]
///     when the low watermark rose (never while `is_holding()`);
/// 11. `handle_configure(setup)` when the program changes what workers are set up
///     with; `setup_for(worker)` is what a new incarnation of `worker` gets, and
///     `setup_version()` changes whenever a setup handed out before becomes outdated (a
///     restore moved the positions, or a new configuration);
/// 12. workers (see `control`): `handle_reconnect_tick()` at a steady interval also emits
///     [`SchedulerAction::DialWorker`] for workers with no live incarnation; answer with
///     `handle_worker_dialled`, then `handle_worker_set_up` for the
///     [`SchedulerAction::SetUpWorker`] that may follow; `handle_worker_retired`,
///     `handle_ps_retired`, `handle_fence_sent` and `handle_watermark_sent` report the
///     outcome of the other remote effects;
/// 13. `handle_reconfigure(now, setup, layouts)` sets every live worker up again, answered by
///     [`SchedulerAction::ConfigureFinished`];
/// 14. parameter servers (see `servers`): `handle_create_variable(now, layout, inits)` creates a
///     variable's shards ([`SchedulerAction::CreateShard`], each answered with
///     `handle_shard_created`), ended by [`SchedulerAction::VariableCreated`];
///     `handle_start(now, checkpoint, root)` is the chief's start: it probes every server
///     ([`SchedulerAction::ProbeServer`], answered with `handle_server_probed`), then restores
///     or starts afresh, ended by [`SchedulerAction::RestoreFinished`];
/// 15. saves (see `save`): `handle_read_cut(now, step)` reads a consistent cut
///     ([`SchedulerAction::SnapshotShard`], answered with `handle_shard_read`, and
///     [`SchedulerAction::AskPositions`], answered with `handle_positions`), ended by
///     [`SchedulerAction::CutRead`]; once the checkpoint is durable,
///     `handle_mark_cut(cut, root, generation)` makes it the cut, and a write that failed is
///     reported with `handle_cut_abandoned(cut, reason)`;
/// 16. preemption notices (see `preempt`): `handle_worker_leaving` answers a worker at once;
///     `handle_ps_leaving` answers a server at once or later with
///     [`SchedulerAction::AnswerPsLeaving`], after the preemption cut asked for with
///     [`SchedulerAction::WritePreemptionCut`] is reported with
///     `handle_preemption_cut_written`; `handle_chief_stopping` when the chief's own notice
///     comes.
/// 17. servers joining and leaving the job (see `reshard`): `handle_ps_joining` and
///     `handle_ps_draining` (a leave answered at once or later with
///     [`SchedulerAction::AnswerPsDraining`]); the cut goes through item 16's
///     [`SchedulerAction::WritePreemptionCut`], the move through a restore.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    closures: BTreeMap<ClosureId, Closure>,
    queue: VecDeque<ClosureId>,
    workers: BTreeMap<u32, WorkerEntry>,
    actions: VecDeque<SchedulerAction>,
    ledger: Ledger,
    first_error: Option<ClosureFailure>,
    /// Since when pending work has had no live worker to run on.
    starved_since: Option<Instant>,
    /// Finished closures, oldest first, for bounded retention.
    finished: VecDeque<ClosureId>,
    /// Closures queued or in flight (`ledger.pending` of them), for the low watermark.
    unfinished: BTreeSet<ClosureId>,
    next_id: u64,
    /// The learning rate the closures scheduled from now on carry (`None`: the servers'
    /// own), as Keras' `LearningRateScheduler` sets it between epochs.
    learning_rate: Option<LearningRate>,
    /// Parameter servers by index: their newest incarnation and whether it is reachable.
    servers: BTreeMap<u32, PsEntry>,
    /// A parameter-server recovery under way: dispatch is held while it lasts.
    recovery: Option<Recovery>,
    /// The cut a recovery rolls back to, its fallback, the closures kept to run again and
    /// the save being written (the `rollback` sub-machine).
    rollback: RollbackLine,
    /// Parameter servers whose loss could not be recovered, and why.
    lost_for_good: BTreeMap<u32, PsLossCause>,
    /// The restore generation: bumped when a restore is asked for (see [`SchedulerAction`]).
    generation: u64,
    /// FENCE-1: per worker, the newest fenced incarnation (replayed to restored servers).
    fenced: BTreeMap<u32, WorkerIncarnation>,
    /// What every worker incarnation is set up with, before its positions are applied.
    setup: SetupWorker,
    /// Where each worker's datasets resume (the last restore's checkpoint).
    positions: WorkerPositions,
    /// Bumped whenever setups handed out before are outdated.
    setup_version: u64,
    /// The low watermark last emitted.
    watermark_sent: u64,
    /// The next [`RestoreTicket`].
    next_ticket: u64,
    /// The parameter servers of the job (the cluster spec's at first, then as servers join
    /// and leave: [`reshard`]), dialled while not known alive (the `dials` sub-machine).
    server_set: ServerSet,
    /// Servers joining and leaving ([`reshard`]).
    resharding: reshard::Resharding,
    /// The workers of the cluster spec, dialled while they have no live incarnation (the
    /// `dials` sub-machine).
    worker_set: WorkerSet,
    /// Configurations and collections of dataset positions sent to the live workers, waiting
    /// for their answers (the `control` sub-machine).
    requests: WorkerRequests,
    /// Variables whose shards are being created (the creation sub-machine).
    creates: Creates,
    /// The chief's start while its probes are out, and whether it ended well (the start
    /// sub-machine).
    start: ChiefStart,
    /// Reads of a cut: the first is under way, the others wait for it (the `cut_reads`
    /// sub-machine).
    cut_reads: CutReads,
    /// Parameter servers' preemption notices and the cuts taken for them (the `preempt`
    /// sub-machine).
    preemption: Preemptions,
    /// Outcomes of remote effects no decision depends on.
    control: ControlCounters,
    /// Workers that joined or were drained (elastic workers).
    membership: membership::Membership,
}

#[derive(Debug, Clone, Copy)]
struct PsEntry {
    incarnation: u64,
    alive: bool,
    /// Declared dead by the failure detector: this incarnation never counts as back.
    dead: bool,
}

/// A parameter-server recovery (or the restore at start-up): dispatch is held from `since`.
#[derive(Debug)]
struct Recovery {
    since: Instant,
    /// Servers whose state is gone (dead, or back as a new incarnation): a restore is needed.
    state_lost: BTreeSet<u32>,
    /// The restore running now, if one was started and has not ended.
    run: Option<ActiveRun>,
    /// Restores interrupted so far in this recovery (bounded by [`RESTORE_ATTEMPTS_MAX`]).
    interrupted: u32,
    /// Before the chief's start: the creation again of lost servers' shards under way
    /// (`created_again.rs`).
    creating_again: Option<CreateTicket>,
}

/// A restore under way, and what it is for.
#[derive(Debug)]
struct ActiveRun {
    run: RestoreRun,
    purpose: Purpose,
}

#[derive(Debug, Clone)]
enum Purpose {
    /// A recovery: roll every server back to the last cut.
    Recovery { cut: ClosureId },
    /// The chief program's restore at start-up: continue the checkpoint's ledger.
    Startup {
        ticket: RestoreTicket,
        ledger: Ledger,
        next_id: u64,
        /// The checkpoint's own cut (its ledger's next closure id).
        stored_at: u64,
        root: PathBuf,
        /// The rate the closures after the checkpoint's cut carried: the closures this chief
        /// schedules carry it too, until the program sets another.
        learning_rate: Option<LearningRate>,
    },
    /// The chief's start afresh over servers that hold variables: open a generation that
    /// refuses an earlier chief's pushes, then probe the servers again ([`servers`]).
    FreshStart {
        ticket: RestoreTicket,
        root: PathBuf,
    },
}

impl Recovery {
    fn restoring(&self) -> bool {
        self.run.is_some()
    }

    fn pinned(&self) -> BTreeMap<u32, u64> {
        self.run
            .as_ref()
            .map(|a| a.run.pinned().clone())
            .unwrap_or_default()
    }
}

#[derive(Debug)]
struct Closure {
    function: String,
    args: Vec<u8>,
    state: ClosureState,
    attempts: u32,
    learning_rate: Option<LearningRate>,
}

#[derive(Debug)]
struct WorkerEntry {
    incarnation: WorkerIncarnation,
    alive: bool,
    in_flight: Vec<ClosureId>,
}

impl Scheduler {
    /// A scheduler with no workers and nothing scheduled.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            rollback: RollbackLine::new(RetainedBounds {
                closures: config.rollback_retained_max,
                bytes: config.rollback_retained_bytes_max,
            }),
            config,
            closures: BTreeMap::new(),
            queue: VecDeque::new(),
            workers: BTreeMap::new(),
            actions: VecDeque::new(),
            ledger: Ledger::default(),
            first_error: None,
            starved_since: None,
            finished: VecDeque::new(),
            unfinished: BTreeSet::new(),
            next_id: 0,
            learning_rate: None,
            servers: BTreeMap::new(),
            recovery: None,
            lost_for_good: BTreeMap::new(),
            generation: 0,
            fenced: BTreeMap::new(),
            setup: SetupWorker {
                num_workers: 0,
                layouts: Vec::new(),
                servers: Vec::new(),
                datasets: Vec::new(),
                // Stamped by the coordinator's machine when it hands the setup out.
                version: 0,
                generation: 0,
            },
            positions: WorkerPositions::new(),
            setup_version: 0,
            watermark_sent: 0,
            next_ticket: 0,
            server_set: ServerSet::default(),
            resharding: reshard::Resharding::default(),
            worker_set: WorkerSet::default(),
            requests: WorkerRequests::default(),
            creates: Creates::default(),
            start: ChiefStart::default(),
            cut_reads: CutReads::default(),
            preemption: Preemptions::default(),
            control: ControlCounters::default(),
            membership: membership::Membership::default(),
        }
    }

    /// The job's checkpoint directory, where preemption cuts go before the program's first
    /// save (`preempt`).
    pub fn with_checkpoint_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.preemption.checkpoint_dir = dir;
        self
    }

    /// The cluster has `num_servers` parameter servers, indexed from 0: each is dialled
    /// ([`Self::handle_reconnect_tick`]) until it is known alive.
    pub fn with_servers(mut self, num_servers: u32) -> Self {
        self.server_set = ServerSet::of_spec(num_servers);
        self
    }

    /// The parameter servers of the job now, by index (the cluster spec's, changed by every
    /// server that joined or left since: `reshard`).
    pub fn servers_in_job(&self) -> Vec<u32> {
        self.server_set.indexes().iter().copied().collect()
    }

    /// One past the largest index of a server in the job: the length of every per-server list
    /// indexed by server.
    pub fn server_span(&self) -> u32 {
        self.server_set.indexes().last().map_or(0, |ps| ps + 1)
    }

    /// Time to dial again (the shell calls this at a steady interval): emits
    /// [`SchedulerAction::DialPs`] for every parameter server never seen or not reachable now
    /// that has no dial under way, and [`SchedulerAction::DialWorker`] for every worker with
    /// no live incarnation (see `control`).
    pub fn handle_reconnect_tick(&mut self) {
        self.dial_workers();
        let servers = &self.servers;
        let due = self
            .server_set
            .dials_due(|ps| servers.get(&ps).is_none_or(|e| !e.alive));
        for ps in due {
            self.actions.push_back(SchedulerAction::DialPs { ps });
        }
    }

    /// The outcome of a [`SchedulerAction::DialPs`]: an answer counts as
    /// [`Self::handle_ps_answered`]; an incarnation declared dead that answers is retired
    /// ([`SchedulerAction::RetirePs`]); no answer waits for the next tick.
    pub fn handle_ps_dialled(&mut self, now: Instant, ps: u32, dial: PsDial) {
        self.server_set.dial_ended(ps);
        match dial {
            PsDial::Answered {
                incarnation,
                serving,
            } => self.handle_ps_answered(now, ps, incarnation, serving),
            PsDial::DeclaredDead { incarnation } => self
                .actions
                .push_back(SchedulerAction::RetirePs { ps, incarnation }),
            PsDial::Unreachable => {}
        }
    }

    /// Queues a closure; it is dispatched to the first free worker.
    pub fn handle_schedule(
        &mut self,
        now: Instant,
        function: &str,
        args: Vec<u8>,
    ) -> Result<ClosureId, ScheduleError> {
        if self.queue.len() >= self.config.queue_max {
            return Err(ScheduleError::QueueFull(self.queue.len()));
        }
        let id = ClosureId(self.next_id);
        self.next_id += 1;
        self.closures.insert(
            id,
            Closure {
                function: function.to_string(),
                args,
                state: ClosureState::Queued,
                attempts: 0,
                learning_rate: self.learning_rate,
            },
        );
        self.queue.push_back(id);
        self.unfinished.insert(id);
        self.ledger.scheduled += 1;
        self.ledger.pending += 1;
        self.dispatch(now);
        Ok(id)
    }

    /// The closures scheduled from now on carry `rate` (`None`: the servers' own rate, their
    /// optimizer's or schedule's), and each applies its updates at it on every attempt,
    /// including a run again after a restore. Those scheduled before keep theirs, so a
    /// rate set between two epochs (Keras' `LearningRateScheduler`) changes exactly the
    /// steps after it, whatever fails.
    pub fn handle_set_learning_rate(&mut self, rate: Option<LearningRate>) {
        self.learning_rate = rate;
    }

    /// A worker incarnation is up. A newer incarnation of a known worker supersedes the old one: the
    /// old incarnation is fenced and its in-flight closures re-dispatched. An incarnation not newer
    /// than one already seen is ignored: a fenced incarnation never comes back (FENCE-1).
    pub fn handle_worker_up(&mut self, now: Instant, worker: u32, incarnation: WorkerIncarnation) {
        if let Some(entry) = self.workers.get(&worker) {
            if incarnation <= entry.incarnation {
                return;
            }
            if entry.alive {
                self.lose_worker(worker);
            }
        }
        self.workers.insert(
            worker,
            WorkerEntry {
                incarnation,
                alive: true,
                in_flight: Vec::new(),
            },
        );
        self.dispatch(now);
    }

    /// The failure detector declared a worker incarnation dead: fence it and re-dispatch what
    /// it was running (at-least-once execution; PS-1 keeps the effect exactly once).
    pub fn handle_worker_lost(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
    ) {
        match self.workers.get(&worker) {
            Some(entry) if entry.alive && entry.incarnation == incarnation => {
                self.lose_worker(worker)
            }
            _ => return,
        }
        self.dispatch(now);
    }

    /// A worker reported a closure's outcome: `Ok(encoded value)`, or the non-retryable error
    /// of the function.
    pub fn handle_result(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        closure: ClosureId,
        attempt: u32,
        outcome: Result<Vec<u8>, ClosureOutcomeError>,
    ) -> ResultDisposition {
        if !self.is_current(worker, incarnation, closure, attempt) {
            // FENCE-1: a fenced incarnation or superseded attempt changes nothing.
            self.ledger.rejected_stale += 1;
            return ResultDisposition::RejectedStale;
        }
        if let Some(entry) = self.workers.get_mut(&worker) {
            entry.in_flight.retain(|c| *c != closure);
        }
        let disposition = match outcome {
            Ok(value) => {
                self.retain_for_rollback(closure);
                self.finish(closure, ClosureState::Committed(value));
                self.ledger.committed += 1;
                ResultDisposition::Committed
            }
            Err(error) => {
                let function = self.closures[&closure].function.clone();
                let failure = ClosureFailure::Error(ClosureError {
                    closure,
                    function,
                    error,
                });
                self.finish(closure, ClosureState::Failed(failure.clone()));
                self.ledger.failed += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(failure);
                }
                self.cancel_queued();
                ResultDisposition::Failed
            }
        };
        self.dispatch(now);
        disposition
    }

    /// The worker could not run a closure it was given (its queue full, its compute thread
    /// gone): the worker's failure, not the closure's. As for a lost worker, the incarnation
    /// is fenced and what it was running goes back to the queue (counted as re-dispatched),
    /// so the closure runs elsewhere or on the worker's next incarnation (LEDGER-1). A refusal
    /// from a fenced incarnation or for a superseded attempt is ignored (FENCE-1).
    pub fn handle_refused(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        closure: ClosureId,
        attempt: u32,
    ) -> ResultDisposition {
        if !self.is_current(worker, incarnation, closure, attempt) {
            self.ledger.rejected_stale += 1;
            return ResultDisposition::RejectedStale;
        }
        self.lose_worker(worker);
        self.dispatch(now);
        ResultDisposition::WorkerLost
    }

    /// Time for the low watermark to go out again (the shell calls this at a steady
    /// interval): emits [`SchedulerAction::Watermark`] if it rose since the last one. None
    /// while a recovery holds dispatch (the closures committed since the cut may run again).
    pub fn handle_watermark_tick(&mut self) {
        if self.is_holding() {
            return;
        }
        let watermark = self.low_watermark();
        if watermark.0 <= self.watermark_sent {
            return;
        }
        self.watermark_sent = watermark.0;
        self.actions.push_back(SchedulerAction::Watermark {
            finished_below: watermark,
            generation: self.generation,
        });
    }

    /// The program changed what workers are set up with (the setup's layouts are also what a
    /// restore restores): setups handed out before are outdated. Its number of input
    /// pipelines is at least the most workers the job may have.
    ///
    /// Placement is the machine's: a variable it knows keeps the layout it has (servers may
    /// have joined or left since the program placed it, `reshard`), and the servers past the
    /// cluster spec are its own.
    pub fn handle_configure(&mut self, mut setup: SetupWorker) {
        for layout in &mut setup.layouts {
            if let Some(known) = self.setup.layouts.iter().find(|l| l.name == layout.name) {
                *layout = known.clone();
            }
        }
        setup.servers = self.setup.servers.clone();
        self.setup = setup;
        // One input pipeline per worker the job may have (see `membership`).
        self.setup.num_workers = self.setup.num_workers.max(self.workers_max());
        self.setup_version += 1;
    }

    /// What a new incarnation of `worker` is set up with: the configured setup, its datasets
    /// resuming at the positions the last restore gave that worker.
    pub fn setup_for(&self, worker: u32) -> SetupWorker {
        let mut setup = recovery::setup_with_positions(&self.setup, self.positions.get(&worker));
        setup.version = self.setup_version;
        setup.generation = self.generation;
        setup
    }

    /// Every variable's layout, as placed now.
    pub fn layouts(&self) -> &[crate::layout::Layout] {
        &self.setup.layouts
    }

    /// Changes whenever a setup handed out before is outdated.
    pub fn setup_version(&self) -> u64 {
        self.setup_version
    }

    /// Where each worker's datasets resume (the last restore's checkpoint positions): what a
    /// worker that is not live now starts from.
    pub fn positions(&self) -> &WorkerPositions {
        &self.positions
    }

    /// The last checkpoint cut, if any.
    pub fn cut(&self) -> Option<ClosureId> {
        self.rollback.cut()
    }

    /// Whether what the servers hold is this coordinator's to account for: its start ended
    /// (restored, or afresh), or it scheduled work without one (its program chose not to
    /// restore). Before that, a restarted chief's servers may hold a dead chief's work that
    /// the start's restore rolls back: no cut may be taken of it.
    pub(super) fn servers_accounted(&self) -> bool {
        self.start.ended_well() || self.next_id != 0
    }

    /// Whether dispatch is held for a parameter-server recovery.
    pub fn is_holding(&self) -> bool {
        self.recovery.is_some()
    }

    /// Parameter servers not reachable now (to be dialled), by index.
    pub fn ps_down(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter(|(_, e)| !e.alive)
            .map(|(ps, _)| *ps)
            .collect()
    }

    /// The known incarnation of parameter server `ps`, and whether it is reachable.
    pub fn ps_incarnation(&self, ps: u32) -> Option<(u64, bool)> {
        self.servers.get(&ps).map(|e| (e.incarnation, e.alive))
    }

    /// The low watermark: the smallest closure id not finished yet (queued, in flight or
    /// waiting to be re-dispatched), or the next id to be scheduled when every closure is
    /// finished. Every closure below it is committed or ended with an error and will never be
    /// dispatched again, so a parameter server may forget their ids (PS-1). While a recovery
    /// holds dispatch it is at most the cut: the closures committed since may run again
    /// (LEDGER-1); the shell sends none then anyway.
    pub fn low_watermark(&self) -> ClosureId {
        let watermark = self
            .unfinished
            .first()
            .copied()
            .unwrap_or(ClosureId(self.next_id));
        match (&self.recovery, self.rollback.floor(self.generation)) {
            (Some(_), Some(cut)) => watermark.min(cut),
            _ => watermark,
        }
    }

    /// The restore generation: how many restores were asked for (plus where a restarted
    /// coordinator resumed it, [`Self::resume_generation`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Continues the restore generation the parameter servers are at (a restarted
    /// coordinator reconnecting to live servers): it never goes down, or every push would be
    /// refused as stale.
    pub fn resume_generation(&mut self, generation: u64) {
        self.generation = self.generation.max(generation);
    }

    /// Whether a restore is under way (asked for, not reported yet).
    pub fn is_restoring(&self) -> bool {
        self.recovery.as_ref().is_some_and(Recovery::restoring)
    }

    /// The configuration this scheduler runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// When the shell must call [`Scheduler::handle_timeout`] next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let starved = self
            .starved_since
            .map(|since| since + self.config.no_worker_wait_max);
        // A restore under way is bounded by its own calls' bounds (cutting it would leave the
        // closures committed since the cut without their effect).
        let recovery = self
            .recovery
            .as_ref()
            .filter(|r| !r.restoring())
            .map(|r| r.since + self.config.ps_restart_wait_max);
        [
            starved,
            recovery,
            self.cut_read_deadline(),
            self.start_deadline(),
            self.preemption.deadline(),
            self.create_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Time passed: pending work that has waited past the bound with no live worker fails as
    /// unavailable, so `join` neither hangs forever nor returns early; a recovery past its
    /// bound fails; a save's read that waited out its pause begins an attempt; servers the
    /// chief's start could not reach are probed again.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance_cut_read(now);
        self.advance_preemption(now);
        self.create_again(now);
        self.probe_again(now);
        if let Some(r) = self.recovery.as_ref().filter(|r| !r.restoring()) {
            if now >= r.since + self.config.ps_restart_wait_max {
                let ps = self.recovering_ps().unwrap_or(0);
                let wait = self.config.ps_restart_wait_max;
                let cause = match (self.rollback.cut(), self.cut_being_written()) {
                    (None, Some(written)) => PsLossCause::FirstCheckpointNotMarked {
                        cut: written.cut.0,
                        wait,
                    },
                    _ => PsLossCause::NotBack { wait },
                };
                self.fail_recovery(ps, cause);
                self.dispatch(now);
            }
        }
        let Some(deadline) = self
            .starved_since
            .map(|since| since + self.config.no_worker_wait_max)
        else {
            return;
        };
        if now < deadline || self.live_workers() > 0 {
            return;
        }
        let reason = format!("no live worker for {:?}", self.config.no_worker_wait_max);
        while let Some(id) = self.queue.pop_front() {
            self.fail_unavailable(id, reason.clone());
        }
        self.starved_since = None;
    }

    /// The next action for the shell.
    pub fn poll_action(&mut self) -> Option<SchedulerAction> {
        self.actions.pop_front()
    }

    /// True when nothing is queued or in flight (`join` may return).
    pub fn is_idle(&self) -> bool {
        self.ledger.pending == 0
    }

    /// Closures on workers now.
    fn in_flight_count(&self) -> usize {
        self.workers.values().map(|w| w.in_flight.len()).sum()
    }

    /// Where in the queue the first closure is that was dispatched before (its effect may be
    /// partly on the servers already), if any.
    fn first_retry(&self) -> Option<usize> {
        self.queue
            .iter()
            .position(|id| self.closures.get(id).is_some_and(|c| c.attempts > 0))
    }

    /// The first failure since the last call (what `join` raises); clears it so the
    /// coordinator stays usable.
    pub fn take_error(&mut self) -> Option<ClosureFailure> {
        self.first_error.take()
    }

    /// A closure's state, if it was ever scheduled.
    pub fn state(&self, closure: ClosureId) -> Option<&ClosureState> {
        self.closures.get(&closure).map(|c| &c.state)
    }

    /// The ledger (LEDGER-1).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Workers currently alive.
    pub fn live_workers(&self) -> usize {
        self.workers.values().filter(|w| w.alive).count()
    }

    /// The live incarnation of `worker`, if any.
    pub fn worker_incarnation(&self, worker: u32) -> Option<WorkerIncarnation> {
        self.workers
            .get(&worker)
            .filter(|w| w.alive)
            .map(|w| w.incarnation)
    }

    fn lose_worker(&mut self, worker: u32) {
        let Some(entry) = self.workers.get_mut(&worker) else {
            return;
        };
        entry.alive = false;
        let incarnation = entry.incarnation;
        let lost = std::mem::take(&mut entry.in_flight);
        let fenced = self.fenced.entry(worker).or_insert(incarnation);
        *fenced = (*fenced).max(incarnation);
        self.actions.push_back(SchedulerAction::Fence {
            worker,
            incarnation,
        });
        // Lost closures go to the front: they were scheduled before anything still queued.
        for id in lost.into_iter().rev() {
            if let Some(c) = self.closures.get_mut(&id) {
                c.state = ClosureState::Queued;
                self.queue.push_front(id);
                self.ledger.redispatched += 1;
            }
        }
    }

    fn dispatch(&mut self, now: Instant) {
        self.advance_recovery();
        self.resume_start_after_recovery();
        self.advance_drains();
        self.advance_waiting_notices(now);
        self.advance_preemption(now);
        self.advance_reshard(now);
        loop {
            // Dispatch is held while a parameter server is being recovered; while a preemption
            // cut is taken only closures that ran before go out (see `preempt`).
            if self.queue.is_empty() || self.recovery.is_some() {
                break;
            }
            let position = if self.preemption.holds() {
                match self
                    .preemption
                    .drains()
                    .then(|| self.first_retry())
                    .flatten()
                {
                    Some(position) => position,
                    None => break,
                }
            } else {
                0
            };
            let free = self
                .workers
                .iter()
                .filter(|(i, w)| {
                    w.alive
                        && w.in_flight.len() < self.config.in_flight_per_worker
                        && !self.is_draining(**i)
                })
                .min_by_key(|(i, w)| (w.in_flight.len(), **i))
                .map(|(i, w)| (*i, w.incarnation));
            let Some((worker, incarnation)) = free else {
                break;
            };
            let Some(id) = self.queue.remove(position) else {
                break;
            };
            let attempts_max = self.config.attempts_max;
            let closure = self
                .closures
                .get_mut(&id)
                .expect("queued closures are known");
            if closure.attempts >= attempts_max {
                self.fail_unavailable(id, format!("gave up after {attempts_max} attempts"));
                continue;
            }
            closure.attempts += 1;
            let attempt = closure.attempts;
            closure.state = ClosureState::InFlight {
                worker,
                incarnation,
                attempt,
            };
            self.actions.push_back(SchedulerAction::Dispatch {
                worker,
                incarnation,
                closure: id,
                attempt,
                generation: self.generation,
                function: closure.function.clone(),
                args: closure.args.clone(),
                learning_rate: closure.learning_rate,
            });
            self.workers
                .get_mut(&worker)
                .expect("chosen worker exists")
                .in_flight
                .push(id);
        }
        let starved = !self.queue.is_empty() && self.live_workers() == 0;
        self.starved_since = match (starved, self.starved_since) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(now),
            (false, _) => None,
        };
    }

    fn finish(&mut self, id: ClosureId, state: ClosureState) {
        if let Some(c) = self.closures.get_mut(&id) {
            c.state = state;
            // The arguments are no longer needed once a closure can never run again.
            c.args = Vec::new();
            self.ledger.pending -= 1;
            self.unfinished.remove(&id);
            self.finished.push_back(id);
        }
        while self.finished.len() > self.config.finished_retained_max {
            if let Some(old) = self.finished.pop_front() {
                self.closures.remove(&old);
            }
        }
    }

    /// The id the next scheduled closure will get.
    pub fn next_closure_id(&self) -> u64 {
        self.next_id
    }

    /// Ids of the retained finished closures: (committed, ended without a value).
    pub fn finished_ids(&self) -> (Vec<u64>, Vec<u64>) {
        let mut committed = Vec::new();
        let mut ended = Vec::new();
        for (id, c) in &self.closures {
            match c.state {
                ClosureState::Committed(_) => committed.push(id.0),
                ClosureState::Failed(_) => ended.push(id.0),
                ClosureState::Queued | ClosureState::InFlight { .. } => {}
            }
        }
        (committed, ended)
    }

    /// Continues the ledger and closure ids of an earlier coordinator (restored from a
    /// checkpoint taken with nothing pending), so counts carry on and no closure id is reused
    /// (PS-1 keys on closure ids). Refused once this scheduler has scheduled anything.
    pub fn resume(&mut self, ledger: Ledger, next_id: u64) -> Result<(), StartFailure> {
        if self.next_id != 0 || !self.closures.is_empty() {
            return Err(StartFailure::AfterScheduling);
        }
        if ledger.pending != 0 || !ledger.balances() {
            return Err(StartFailure::LedgerUnbalanced(ledger));
        }
        self.ledger = ledger;
        self.next_id = next_id;
        Ok(())
    }

    /// Whether `closure` was scheduled here but has been forgotten since it finished.
    pub fn is_forgotten(&self, closure: ClosureId) -> bool {
        closure.0 < self.next_id && !self.closures.contains_key(&closure)
    }

    /// Whether a report about `closure` comes from the live incarnation running its current
    /// attempt (FENCE-1: anything else changes nothing).
    fn is_current(
        &self,
        worker: u32,
        incarnation: WorkerIncarnation,
        closure: ClosureId,
        attempt: u32,
    ) -> bool {
        let current = matches!(
            self.closures.get(&closure).map(|c| &c.state),
            Some(ClosureState::InFlight { worker: w, incarnation: e, attempt: a }) if *w == worker && *e == incarnation && *a == attempt
        );
        current
            && self
                .workers
                .get(&worker)
                .is_some_and(|w| w.alive && w.incarnation == incarnation)
    }

    /// Keeps a committing closure's function and arguments if it commits at or above the cut,
    /// so that a rollback to the cut can run it again.
    fn retain_for_rollback(&mut self, id: ClosureId) {
        if !self.rollback.keeps(id, self.generation) {
            return;
        }
        let closures = &mut self.closures;
        self.rollback.retain(id, || {
            let c = closures.get_mut(&id)?;
            Some(Retained {
                function: c.function.clone(),
                args: std::mem::take(&mut c.args),
                attempts: c.attempts,
                learning_rate: c.learning_rate,
            })
        });
    }

    fn fail_unavailable(&mut self, id: ClosureId, reason: String) {
        let failure = ClosureFailure::Unavailable {
            closure: id,
            reason,
        };
        self.finish(id, ClosureState::Failed(failure.clone()));
        self.ledger.unavailable += 1;
        if self.first_error.is_none() {
            self.first_error = Some(failure);
        }
    }

    fn cancel_queued(&mut self) {
        while let Some(id) = self.queue.pop_front() {
            self.finish(id, ClosureState::Failed(ClosureFailure::Cancelled(id)));
            self.ledger.cancelled += 1;
        }
    }
}

/// The end of a restore at a cut no restore was asked for (`Scheduler::handle_restored`):
/// nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no restore at cut {cut} was asked for")]
struct NoRestoreAsked {
    /// The cut named.
    cut: u64,
}

/// Restores one parameter-server recovery may start before its loss counts as unrecoverable
/// (each interrupted because a server could not be reached, e.g. it restarted again).
pub const RESTORE_ATTEMPTS_MAX: u32 = 5;

#[cfg(test)]
mod scheduler_tests;
