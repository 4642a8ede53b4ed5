//! The coordinator's scheduling decisions as a pure state machine: which closure runs where,
//! what happens when a worker is lost, what `join` reports, and the ledger (LEDGER-1).
//!
//! No IO, no clock, no threads: the actor shell passes `now` in and carries out the actions it
//! drains. This is what lets the recovery logic be tested over every order of events.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Identifies a scheduled closure for its whole life, across re-dispatches.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ClosureId(pub u64);

/// The incarnation of a worker process (FENCE-1): a restarted worker has a larger epoch.
pub type WorkerEpoch = u64;

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
        }
    }
}

/// An error from a closure, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{function} (closure {}): {message}", closure.0)]
pub struct ClosureError {
    /// The closure that failed.
    pub closure: ClosureId,
    /// The registered function name.
    pub function: String,
    /// The error's message.
    pub message: String,
}

/// Why a closure did not produce a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClosureFailure {
    /// The function itself returned a non-retryable error.
    #[error("{0}")]
    Error(ClosureError),
    /// It was queued when another closure failed, and was cancelled (TF: CancelledError).
    #[error("closure {} cancelled: an earlier closure failed", .0.0)]
    Cancelled(ClosureId),
    /// It finished so long ago that its value is no longer kept (`finished_retained_max`).
    #[error("closure {} finished long ago; its value is no longer kept", .0.0)]
    Forgotten(ClosureId),
    /// No worker could run it within the bound (all workers lost, or too many attempts).
    #[error("closure {} unavailable: {reason}", closure.0)]
    Unavailable {
        /// The closure.
        closure: ClosureId,
        /// Why it could not run.
        reason: String,
    },
}

/// Where a closure is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClosureState {
    /// Waiting in the queue.
    Queued,
    /// Running on a worker incarnation.
    InFlight {
        /// The worker's index.
        worker: u32,
        /// The worker's incarnation.
        epoch: WorkerEpoch,
        /// Which attempt (1 for the first dispatch).
        attempt: u32,
    },
    /// Finished; its encoded return value.
    Committed(Vec<u8>),
    /// Finished without a value.
    Failed(ClosureFailure),
}

/// What the shell must do, drained with [`Scheduler::poll_action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerAction {
    /// Send this closure to this worker incarnation.
    Dispatch {
        /// Target worker index.
        worker: u32,
        /// Target worker incarnation.
        epoch: WorkerEpoch,
        /// The closure.
        closure: ClosureId,
        /// Attempt number (1 for the first dispatch).
        attempt: u32,
        /// The registered function name.
        function: String,
        /// Encoded arguments.
        args: Vec<u8>,
    },
    /// A worker incarnation is gone: nothing it sends may change state any more (FENCE-1).
    /// The shell tells the parameter servers, drops the connection, and retires the
    /// incarnation if its process still answers (so that it restarts as a new one).
    Fence {
        /// The worker index.
        worker: u32,
        /// The fenced incarnation (and every older one).
        epoch: WorkerEpoch,
    },
}

/// What became of a result a worker reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultDisposition {
    /// The result committed its closure.
    Committed,
    /// The function failed; the error is recorded for `join` and queued closures were cancelled.
    Failed,
    /// From a fenced incarnation or a superseded attempt: ignored (FENCE-1).
    RejectedStale,
    /// The worker could not run the closure: its incarnation was fenced and the closure queued
    /// again, as for a lost worker.
    WorkerLost,
}

/// The coordinator's account of every scheduled closure (LEDGER-1).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    /// Closures ever scheduled.
    pub scheduled: u64,
    /// Closures that committed a value.
    pub committed: u64,
    /// Closures that failed with their own error.
    pub failed: u64,
    /// Closures cancelled because another failed.
    pub cancelled: u64,
    /// Closures that could not run (no worker within the bound, attempts exhausted).
    pub unavailable: u64,
    /// Re-dispatches after the worker running the closure was lost.
    pub redispatched: u64,
    /// Results rejected because they came from a fenced incarnation or a superseded attempt.
    pub rejected_stale: u64,
    /// Closures queued or in flight now.
    pub pending: u64,
}

impl Ledger {
    /// LEDGER-1: every scheduled closure is committed, pending, or ended with an error.
    pub fn balances(&self) -> bool {
        self.scheduled
            == self.committed + self.failed + self.cancelled + self.unavailable + self.pending
    }
}

/// Why `schedule` refused a closure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The queue holds `queue_max` closures already.
    #[error("schedule queue is full ({0} closures waiting)")]
    QueueFull(usize),
}

/// The scheduling state machine behind `ClusterCoordinator`.
///
/// Calling protocol:
/// 1. `handle_worker_up(now, worker, epoch)` when a worker incarnation connects, and
///    `handle_worker_lost(now, worker, epoch)` when the failure detector declares it dead;
/// 2. `handle_schedule(now, function, args)` for each `schedule` call;
/// 3. drain `poll_action()` after every `handle_*` call and carry the actions out;
/// 4. `handle_result(now, worker, epoch, closure, attempt, outcome)` when a worker reports,
///    `handle_refused(now, worker, epoch, closure, attempt)` when it could not run the closure;
/// 5. arm a timer for `poll_timeout()` and call `handle_timeout(now)` when it fires;
/// 6. `join` is done when `is_idle()`; `take_error()` then gives the first failure, once;
/// 7. `low_watermark()` at any time: every closure below it is finished for good.
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
}

#[derive(Debug)]
struct Closure {
    function: String,
    args: Vec<u8>,
    state: ClosureState,
    attempts: u32,
}

#[derive(Debug)]
struct WorkerEntry {
    epoch: WorkerEpoch,
    alive: bool,
    in_flight: Vec<ClosureId>,
}

impl Scheduler {
    /// A scheduler with no workers and nothing scheduled.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
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
            },
        );
        self.queue.push_back(id);
        self.unfinished.insert(id);
        self.ledger.scheduled += 1;
        self.ledger.pending += 1;
        self.dispatch(now);
        Ok(id)
    }

    /// A worker incarnation is up. A newer epoch of a known worker supersedes the old one: the
    /// old incarnation is fenced and its in-flight closures re-dispatched. An epoch not newer
    /// than one already seen is ignored: a fenced incarnation never comes back (FENCE-1).
    pub fn handle_worker_up(&mut self, now: Instant, worker: u32, epoch: WorkerEpoch) {
        if let Some(entry) = self.workers.get(&worker) {
            if epoch <= entry.epoch {
                return;
            }
            if entry.alive {
                self.lose_worker(worker);
            }
        }
        self.workers.insert(
            worker,
            WorkerEntry {
                epoch,
                alive: true,
                in_flight: Vec::new(),
            },
        );
        self.dispatch(now);
    }

    /// The failure detector declared a worker incarnation dead: fence it and re-dispatch what
    /// it was running (at-least-once execution; PS-1 keeps the effect exactly once).
    pub fn handle_worker_lost(&mut self, now: Instant, worker: u32, epoch: WorkerEpoch) {
        match self.workers.get(&worker) {
            Some(entry) if entry.alive && entry.epoch == epoch => self.lose_worker(worker),
            _ => return,
        }
        self.dispatch(now);
    }

    /// A worker reported a closure's outcome: `Ok(encoded value)` or `Err(message)` for a
    /// non-retryable error of the function.
    pub fn handle_result(
        &mut self,
        now: Instant,
        worker: u32,
        epoch: WorkerEpoch,
        closure: ClosureId,
        attempt: u32,
        outcome: Result<Vec<u8>, String>,
    ) -> ResultDisposition {
        let current = matches!(
            self.closures.get(&closure).map(|c| &c.state),
            Some(ClosureState::InFlight { worker: w, epoch: e, attempt: a }) if *w == worker && *e == epoch && *a == attempt
        );
        let live = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.alive && w.epoch == epoch);
        if !current || !live {
            // FENCE-1: a fenced incarnation or superseded attempt changes nothing.
            self.ledger.rejected_stale += 1;
            return ResultDisposition::RejectedStale;
        }
        if let Some(entry) = self.workers.get_mut(&worker) {
            entry.in_flight.retain(|c| *c != closure);
        }
        let disposition = match outcome {
            Ok(value) => {
                self.finish(closure, ClosureState::Committed(value));
                self.ledger.committed += 1;
                ResultDisposition::Committed
            }
            Err(message) => {
                let function = self.closures[&closure].function.clone();
                let failure = ClosureFailure::Error(ClosureError {
                    closure,
                    function,
                    message,
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
        epoch: WorkerEpoch,
        closure: ClosureId,
        attempt: u32,
    ) -> ResultDisposition {
        let current = matches!(
            self.closures.get(&closure).map(|c| &c.state),
            Some(ClosureState::InFlight { worker: w, epoch: e, attempt: a }) if *w == worker && *e == epoch && *a == attempt
        );
        let live = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.alive && w.epoch == epoch);
        if !current || !live {
            self.ledger.rejected_stale += 1;
            return ResultDisposition::RejectedStale;
        }
        self.lose_worker(worker);
        self.dispatch(now);
        ResultDisposition::WorkerLost
    }

    /// The low watermark: the smallest closure id not finished yet (queued, in flight or
    /// waiting to be re-dispatched), or the next id to be scheduled when every closure is
    /// finished. Every closure below it is committed or ended with an error and will never be
    /// dispatched again, so a parameter server may forget their ids (PS-1).
    pub fn low_watermark(&self) -> ClosureId {
        self.unfinished
            .first()
            .copied()
            .unwrap_or(ClosureId(self.next_id))
    }

    /// The configuration this scheduler runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// When the shell must call [`Scheduler::handle_timeout`] next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.starved_since
            .map(|since| since + self.config.no_worker_wait_max)
    }

    /// Time passed: pending work that has waited past the bound with no live worker fails as
    /// unavailable, so `join` neither hangs forever nor returns early.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(deadline) = self.poll_timeout() else {
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
    pub fn worker_epoch(&self, worker: u32) -> Option<WorkerEpoch> {
        self.workers
            .get(&worker)
            .filter(|w| w.alive)
            .map(|w| w.epoch)
    }

    fn lose_worker(&mut self, worker: u32) {
        let Some(entry) = self.workers.get_mut(&worker) else {
            return;
        };
        entry.alive = false;
        let epoch = entry.epoch;
        let lost = std::mem::take(&mut entry.in_flight);
        self.actions
            .push_back(SchedulerAction::Fence { worker, epoch });
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
        loop {
            if self.queue.is_empty() {
                break;
            }
            let free = self
                .workers
                .iter()
                .filter(|(_, w)| w.alive && w.in_flight.len() < self.config.in_flight_per_worker)
                .min_by_key(|(i, w)| (w.in_flight.len(), **i))
                .map(|(i, w)| (*i, w.epoch));
            let Some((worker, epoch)) = free else { break };
            let Some(id) = self.queue.pop_front() else {
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
                epoch,
                attempt,
            };
            self.actions.push_back(SchedulerAction::Dispatch {
                worker,
                epoch,
                closure: id,
                attempt,
                function: closure.function.clone(),
                args: closure.args.clone(),
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
    pub fn resume(&mut self, ledger: Ledger, next_id: u64) -> Result<(), String> {
        if self.next_id != 0 || !self.closures.is_empty() {
            return Err("the ledger can only be restored before anything is scheduled".into());
        }
        if ledger.pending != 0 || !ledger.balances() {
            return Err(format!(
                "restored ledger does not balance with nothing pending: {ledger:?}"
            ));
        }
        self.ledger = ledger;
        self.next_id = next_id;
        Ok(())
    }

    /// Whether `closure` was scheduled here but has been forgotten since it finished.
    pub fn is_forgotten(&self, closure: ClosureId) -> bool {
        closure.0 < self.next_id && !self.closures.contains_key(&closure)
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

/// Default [`SchedulerConfig::step_timeout`]: 30 minutes. Training steps take milliseconds to
/// seconds and a step that evaluates a whole dataset minutes, so a step still running after
/// half an hour is almost surely hung; and it is retried well before the chief's one-hour
/// bound on a single `join` or `fetch` wait gives up.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut Scheduler) -> Vec<SchedulerAction> {
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    fn dispatched(actions: &[SchedulerAction]) -> Vec<(u32, ClosureId, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                SchedulerAction::Dispatch {
                    worker,
                    closure,
                    attempt,
                    ..
                } => Some((*worker, *closure, *attempt)),
                SchedulerAction::Fence { .. } => None,
            })
            .collect()
    }

    #[test]
    fn one_closure_in_flight_per_worker_and_free_worker_takes_next() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.handle_worker_up(t, 0, 1);
        s.handle_worker_up(t, 1, 1);
        let ids: Vec<_> = (0..3)
            .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
            .collect();
        assert_eq!(
            dispatched(&drain(&mut s)),
            vec![(0, ids[0], 1), (1, ids[1], 1)]
        );
        assert_eq!(
            s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![7])),
            ResultDisposition::Committed
        );
        assert_eq!(dispatched(&drain(&mut s)), vec![(1, ids[2], 1)]);
        assert!(s.ledger().balances());
    }

    #[test]
    fn ledger_1_lost_worker_closure_is_redispatched_and_stale_result_rejected() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.handle_worker_up(t, 0, 1);
        let id = s.handle_schedule(t, "step", vec![1]).unwrap();
        drain(&mut s);
        s.handle_worker_lost(t, 0, 1);
        assert_eq!(
            drain(&mut s),
            vec![SchedulerAction::Fence {
                worker: 0,
                epoch: 1
            }]
        );
        assert_eq!(s.state(id), Some(&ClosureState::Queued));
        s.handle_worker_up(t, 1, 1);
        assert_eq!(dispatched(&drain(&mut s)), vec![(1, id, 2)]);
        // FENCE-1: the old incarnation's late result changes nothing.
        assert_eq!(
            s.handle_result(t, 0, 1, id, 1, Ok(vec![])),
            ResultDisposition::RejectedStale
        );
        assert_eq!(
            s.handle_result(t, 1, 1, id, 2, Ok(vec![9])),
            ResultDisposition::Committed
        );
        let l = s.ledger();
        assert_eq!(
            (l.scheduled, l.committed, l.redispatched, l.rejected_stale),
            (1, 1, 1, 1)
        );
        assert!(l.balances() && s.is_idle());
    }

    #[test]
    fn restarted_worker_supersedes_its_old_incarnation() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.handle_worker_up(t, 0, 1);
        let id = s.handle_schedule(t, "step", vec![]).unwrap();
        drain(&mut s);
        s.handle_worker_up(t, 0, 2);
        let actions = drain(&mut s);
        assert_eq!(
            actions[0],
            SchedulerAction::Fence {
                worker: 0,
                epoch: 1
            }
        );
        assert_eq!(dispatched(&actions), vec![(0, id, 2)]);
        // An older epoch announcing itself later is ignored.
        s.handle_worker_up(t, 0, 1);
        assert!(drain(&mut s).is_empty());
        assert_eq!(s.worker_epoch(0), Some(2));
        // FENCE-1: a lost incarnation that wakes up (SIGCONT) is not taken back.
        s.handle_worker_lost(t, 0, 2);
        drain(&mut s);
        s.handle_worker_up(t, 0, 2);
        assert_eq!(s.worker_epoch(0), None);
    }

    #[test]
    fn error_surfaces_once_cancels_queued_and_scheduler_stays_usable() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.handle_worker_up(t, 0, 1);
        let a = s.handle_schedule(t, "step", vec![]).unwrap();
        let b = s.handle_schedule(t, "step", vec![]).unwrap();
        drain(&mut s);
        assert_eq!(
            s.handle_result(t, 0, 1, a, 1, Err("bad input".into())),
            ResultDisposition::Failed
        );
        assert_eq!(
            s.state(b),
            Some(&ClosureState::Failed(ClosureFailure::Cancelled(b)))
        );
        assert!(s.is_idle());
        let err = s.take_error().unwrap();
        assert!(err.to_string().contains("bad input"), "{err}");
        assert_eq!(s.take_error(), None);
        let c = s.handle_schedule(t, "step", vec![]).unwrap();
        assert_eq!(dispatched(&drain(&mut s)), vec![(0, c, 1)]);
        assert_eq!(
            s.handle_result(t, 0, 1, c, 1, Ok(vec![])),
            ResultDisposition::Committed
        );
        assert!(s.ledger().balances());
        assert_eq!(s.ledger().cancelled, 1);
    }

    #[test]
    fn all_workers_lost_waits_within_bound_then_resumes_or_fails() {
        let t = Instant::now();
        let bound = Duration::from_secs(10);
        let mut s = Scheduler::new(SchedulerConfig {
            no_worker_wait_max: bound,
            ..Default::default()
        });
        s.handle_worker_up(t, 0, 1);
        let a = s.handle_schedule(t, "step", vec![]).unwrap();
        drain(&mut s);
        s.handle_worker_lost(t, 0, 1);
        assert_eq!(s.poll_timeout(), Some(t + bound));
        // Before the bound nothing fails; the worker returns and the closure runs again.
        s.handle_timeout(t + bound / 2);
        assert!(!s.is_idle());
        s.handle_worker_up(t + bound / 2, 0, 2);
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(dispatched(&drain(&mut s)), vec![(0, a, 2)]);
        // Lost again and never back: past the bound the work fails as unavailable.
        s.handle_worker_lost(t + bound, 0, 2);
        s.handle_timeout(t + bound + bound);
        assert!(s.is_idle());
        assert!(matches!(
            s.take_error(),
            Some(ClosureFailure::Unavailable { .. })
        ));
        assert!(s.ledger().balances());
    }

    #[test]
    fn finished_closures_are_retained_up_to_the_bound() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig {
            finished_retained_max: 2,
            ..Default::default()
        });
        s.handle_worker_up(t, 0, 1);
        let ids: Vec<_> = (0..3)
            .map(|_| {
                let id = s.handle_schedule(t, "f", vec![]).unwrap();
                drain(&mut s);
                s.handle_result(t, 0, 1, id, 1, Ok(vec![1]));
                id
            })
            .collect();
        assert!(s.is_forgotten(ids[0]) && s.state(ids[0]).is_none());
        assert_eq!(s.state(ids[2]), Some(&ClosureState::Committed(vec![1])));
        assert!(!s.is_forgotten(ClosureId(99)));
        assert_eq!(s.ledger().committed, 3);
    }

    #[test]
    fn a_resumed_ledger_carries_on_counts_and_ids() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        let earlier = Ledger {
            scheduled: 10,
            committed: 9,
            cancelled: 1,
            ..Default::default()
        };
        s.resume(earlier, 10).unwrap();
        s.handle_worker_up(t, 0, 1);
        let id = s.handle_schedule(t, "f", vec![]).unwrap();
        assert_eq!(id, ClosureId(10));
        drain(&mut s);
        s.handle_result(t, 0, 1, id, 1, Ok(vec![]));
        assert_eq!((s.ledger().scheduled, s.ledger().committed), (11, 10));
        assert!(s.ledger().balances());
        assert!(
            s.resume(Ledger::default(), 0).is_err(),
            "only before scheduling"
        );
        let unbalanced = Ledger {
            scheduled: 3,
            ..Default::default()
        };
        assert!(Scheduler::new(SchedulerConfig::default())
            .resume(unbalanced, 3)
            .is_err());
    }

    #[test]
    fn attempts_are_bounded() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig {
            attempts_max: 2,
            ..Default::default()
        });
        let id = s.handle_schedule(t, "step", vec![]).unwrap();
        for epoch in 1..=3 {
            s.handle_worker_up(t, 0, epoch);
            s.handle_worker_lost(t, 0, epoch);
        }
        assert!(matches!(
            s.state(id),
            Some(ClosureState::Failed(ClosureFailure::Unavailable { .. }))
        ));
        assert!(s.ledger().balances());
    }

    #[test]
    fn ledger_1_holds_over_random_event_orders() {
        use rand::{Rng, SeedableRng};
        for seed in 0..300u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let t = Instant::now();
            let mut s = Scheduler::new(SchedulerConfig {
                attempts_max: 4,
                ..Default::default()
            });
            let mut epochs = [0u64; 3];
            let mut in_flight: Vec<(u32, u64, ClosureId, u32)> = Vec::new();
            for _ in 0..200 {
                match rng.gen_range(0..6) {
                    0 => {
                        let _ = s.handle_schedule(t, "f", vec![]);
                    }
                    1 => {
                        let w = rng.gen_range(0..3);
                        epochs[w] += 1;
                        s.handle_worker_up(t, w as u32, epochs[w]);
                    }
                    2 => {
                        let w = rng.gen_range(0..3);
                        s.handle_worker_lost(t, w as u32, epochs[w]);
                    }
                    _ if !in_flight.is_empty() => {
                        let (w, e, c, a) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                        if rng.gen_bool(0.05) {
                            s.handle_refused(t, w, e, c, a);
                        } else {
                            let outcome = if rng.gen_bool(0.05) {
                                Err("boom".into())
                            } else {
                                Ok(vec![])
                            };
                            s.handle_result(t, w, e, c, a, outcome);
                        }
                    }
                    _ => {}
                }
                // Below the low watermark every closure is finished for good.
                let watermark = s.low_watermark();
                assert!(watermark.0 <= s.next_closure_id(), "seed {seed}");
                for id in 0..watermark.0 {
                    assert!(
                        matches!(
                            s.state(ClosureId(id)),
                            None | Some(ClosureState::Committed(_) | ClosureState::Failed(_))
                        ),
                        "seed {seed}: closure {id} below the watermark {watermark:?} is unfinished"
                    );
                }
                while let Some(a) = s.poll_action() {
                    if let SchedulerAction::Dispatch {
                        worker,
                        epoch,
                        closure,
                        attempt,
                        ..
                    } = a
                    {
                        in_flight.push((worker, epoch, closure, attempt));
                    }
                }
                assert!(s.ledger().balances(), "seed {seed}: {:?}", s.ledger());
            }
        }
    }

    #[test]
    fn ledger_1_a_worker_refusal_redispatches_the_closure_and_fences_the_incarnation() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.handle_worker_up(t, 0, 1);
        s.handle_worker_up(t, 1, 1);
        let ids: Vec<_> = (0..3)
            .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
            .collect();
        assert_eq!(
            dispatched(&drain(&mut s)),
            vec![(0, ids[0], 1), (1, ids[1], 1)]
        );
        // Worker 0 could not take the closure: the worker's failure, not the closure's.
        assert_eq!(
            s.handle_refused(t, 0, 1, ids[0], 1),
            ResultDisposition::WorkerLost
        );
        assert_eq!(
            drain(&mut s),
            vec![SchedulerAction::Fence {
                worker: 0,
                epoch: 1
            }]
        );
        assert_eq!(s.state(ids[0]), Some(&ClosureState::Queued));
        assert_eq!(s.worker_epoch(0), None);
        assert_eq!(s.take_error(), None, "a refusal is not the closure's error");
        // FENCE-1: the fenced incarnation's late refusal or result changes nothing.
        assert_eq!(
            s.handle_refused(t, 0, 1, ids[0], 1),
            ResultDisposition::RejectedStale
        );
        // The refused closure runs next, ahead of what was queued after it.
        assert_eq!(
            s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![])),
            ResultDisposition::Committed
        );
        assert_eq!(dispatched(&drain(&mut s)), vec![(1, ids[0], 2)]);
        // The worker's next incarnation takes work again.
        s.handle_worker_up(t, 0, 2);
        assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[2], 1)]);
        s.handle_result(t, 1, 1, ids[0], 2, Ok(vec![]));
        s.handle_result(t, 0, 2, ids[2], 1, Ok(vec![]));
        let l = s.ledger();
        assert_eq!(
            (
                l.scheduled,
                l.committed,
                l.failed,
                l.cancelled,
                l.redispatched
            ),
            (3, 3, 0, 0, 1)
        );
        assert!(l.balances() && s.is_idle());
    }

    #[test]
    fn low_watermark_is_the_oldest_unfinished_closure() {
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig::default());
        assert_eq!(s.low_watermark(), ClosureId(0));
        s.handle_worker_up(t, 0, 1);
        s.handle_worker_up(t, 1, 1);
        let ids: Vec<_> = (0..3)
            .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
            .collect();
        drain(&mut s);
        s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![]));
        drain(&mut s);
        // Closure 1 finished, but 0 has not: nothing below 0 is known finished.
        assert_eq!(s.low_watermark(), ids[0]);
        s.handle_result(t, 0, 1, ids[0], 1, Ok(vec![]));
        assert_eq!(s.low_watermark(), ids[2]);
        // A closure waiting to be re-dispatched is unfinished.
        s.handle_worker_lost(t, 0, 1);
        s.handle_worker_lost(t, 1, 1);
        assert_eq!(s.state(ids[2]), Some(&ClosureState::Queued));
        assert_eq!(s.low_watermark(), ids[2]);
        s.handle_worker_up(t, 0, 2);
        drain(&mut s);
        s.handle_result(t, 0, 2, ids[2], 2, Ok(vec![]));
        // Everything finished: the next id to be scheduled.
        assert_eq!(s.low_watermark(), ClosureId(3));
        // A resumed scheduler starts at the ids it resumes from.
        let mut resumed = Scheduler::new(SchedulerConfig::default());
        let earlier = Ledger {
            scheduled: 10,
            committed: 10,
            ..Default::default()
        };
        resumed.resume(earlier, 10).unwrap();
        assert_eq!(resumed.low_watermark(), ClosureId(10));
    }
}
