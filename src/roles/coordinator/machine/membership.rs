//! Elastic workers: which workers belong to the job now, a worker joining a running job, and a
//! worker drained out of it.
//!
//! The cluster spec names the workers the job starts with (indexed from 0). The job may have
//! up to [`Scheduler::with_workers_max`] workers, which is also its number of input pipelines:
//! worker `N` always reads pipeline `N`, whoever runs it, so a worker that joins or leaves
//! never changes what the others read.
//!
//! - **Join** ([`Scheduler::handle_worker_joining`]): a worker incarnation says it is a
//!   worker of this job ([`crate::roles::protocol::Joining`]); its index comes from its
//!   certificate. An index at or past `workers_max` is refused; any other becomes a member
//!   (again, if it was drained) and is dialled at once, then set up by the ordinary path
//!   ([`super::control`]): its per-worker datasets are built, resuming at the positions kept
//!   for its index, before it gets any work.
//! - **Drain** ([`Scheduler::handle_worker_draining`]): the live incarnation gets no new work;
//!   once what it runs has finished (and no restore runs), its dataset positions are read
//!   ([`SchedulerAction::AskDrainPositions`]) and kept for its index (a checkpoint records
//!   them; a worker that joins later with that index resumes there), the incarnation is fenced
//!   (FENCE-1) and the worker stops being a member: it is not dialled again.
//!   [`SchedulerAction::DrainFinished`] then lets it go (it exits 0). A draining worker that
//!   dies or leaves meanwhile is handled as any lost worker (its closures run elsewhere) and
//!   its drain ends with it. Nothing is lost or run twice: a drained worker's closures
//!   committed normally, and its positions are those after its last closure.
//!
//! Pure: no IO, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::recovery::CallFault;
use super::{Scheduler, SchedulerAction, WorkerIncarnation};
use crate::roles::protocol::JoinRefusal;

/// Who belongs to the job, beyond the workers of the cluster spec.
#[derive(Debug, Default)]
pub(super) struct Membership {
    /// The most workers the job may have (its input pipelines); 0 until set, then at least
    /// the spec's workers.
    workers_max: u32,
    /// Workers past the cluster spec that joined and were not drained since.
    joined: BTreeSet<u32>,
    /// Workers of the cluster spec drained out of the job (and not joined again).
    removed: BTreeSet<u32>,
    /// Drains under way, by worker.
    draining: BTreeMap<u32, Drain>,
}

/// One drain under way.
#[derive(Debug, Clone, Copy)]
struct Drain {
    /// The incarnation being drained.
    incarnation: WorkerIncarnation,
    /// Its positions were asked for in this restore generation (`None`: not asked yet).
    asked_in: Option<u64>,
    /// A new incarnation of the worker joined while it drained: it stays a member.
    rejoined: bool,
}

/// What became of a drain request ([`Scheduler::handle_worker_draining`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainDisposition {
    /// The incarnation was not live (not set up yet, or lost): it is no longer a member and
    /// may go now.
    Done,
    /// The drain is under way: [`SchedulerAction::DrainFinished`] says when it may go.
    Pending,
}

impl Scheduler {
    /// The job may have up to `workers_max` workers (at least those of the cluster spec):
    /// its input pipelines, and the bound on a joining worker's index.
    pub fn with_workers_max(mut self, workers_max: u32) -> Self {
        self.membership.workers_max = workers_max;
        self
    }

    /// The most workers the job may have (never fewer than the cluster spec's).
    pub fn workers_max(&self) -> u32 {
        self.membership.workers_max.max(self.worker_set.spec())
    }

    /// The workers that belong to the job now, in index order: those of the cluster spec not
    /// drained, and those that joined.
    pub fn members(&self) -> Vec<u32> {
        (0..self.worker_set.spec())
            .filter(|w| !self.membership.removed.contains(w))
            .chain(self.membership.joined.iter().copied())
            .collect()
    }

    /// Whether `worker` belongs to the job now.
    pub fn is_member(&self, worker: u32) -> bool {
        if self.worker_set.is_spec_worker(worker) {
            !self.membership.removed.contains(&worker)
        } else {
            self.membership.joined.contains(&worker)
        }
    }

    /// Whether `worker` is being drained (it gets no new work).
    pub fn is_draining(&self, worker: u32) -> bool {
        self.membership.draining.contains_key(&worker)
    }

    /// Incarnation `incarnation` of `worker` (the index its certificate names) says it is a worker
    /// of this job. Refused past `workers_max`; otherwise the worker is a member from now on
    /// and is dialled at once (then set up, its datasets built, before it gets work).
    pub fn handle_worker_joining(
        &mut self,
        _now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
    ) -> Result<(), JoinRefusal> {
        let workers_max = self.workers_max();
        if worker >= workers_max {
            return Err(JoinRefusal::BeyondMax {
                worker,
                workers_max,
            });
        }
        if let Some(drain) = self.membership.draining.get_mut(&worker) {
            if incarnation > drain.incarnation {
                drain.rejoined = true;
            }
        }
        if self.worker_set.is_spec_worker(worker) {
            self.membership.removed.remove(&worker);
        } else {
            self.membership.joined.insert(worker);
        }
        self.dial_workers();
        Ok(())
    }

    /// The live incarnation `incarnation` of `worker` is to leave the job (scaled down). See the
    /// module docs; [`DrainDisposition::Pending`] is answered later by
    /// [`SchedulerAction::DrainFinished`].
    pub fn handle_worker_draining(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
    ) -> DrainDisposition {
        let live = self.worker_incarnation(worker);
        if live.is_some_and(|live| live > incarnation) {
            // An older incarnation: the newer one serves on and stays a member.
            return DrainDisposition::Done;
        }
        if live != Some(incarnation) {
            // Not serving (still being set up, or lost): it is simply no longer a member.
            if self
                .membership
                .draining
                .get(&worker)
                .is_none_or(|d| d.incarnation < incarnation)
            {
                self.remove_member(worker);
            }
            return DrainDisposition::Done;
        }
        self.membership.draining.entry(worker).or_insert(Drain {
            incarnation,
            asked_in: None,
            rejoined: false,
        });
        self.dispatch(now);
        DrainDisposition::Pending
    }

    /// The answer of `worker`'s draining incarnation `incarnation` to a
    /// [`SchedulerAction::AskDrainPositions`]: its positions are kept for its index (on no
    /// answer, those of its last setup are), and the drain ends. Positions read before a
    /// restore that began since are stale: they are asked for again.
    pub fn handle_drain_positions(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        result: Result<Vec<(String, u64)>, CallFault>,
    ) {
        let Some(drain) = self.membership.draining.get(&worker).copied() else {
            return;
        };
        if drain.incarnation != incarnation {
            return;
        }
        if drain.asked_in != Some(self.generation) || self.is_restoring() {
            if let Some(d) = self.membership.draining.get_mut(&worker) {
                d.asked_in = None;
            }
            self.dispatch(now);
            return;
        }
        if let Ok(list) = result {
            self.positions.insert(worker, list.into_iter().collect());
        }
        if self.worker_incarnation(worker) == Some(incarnation) {
            // FENCE-1: nothing it sends may change state any more (it runs nothing now).
            self.lose_worker(worker);
        }
        self.end_drain(worker);
        self.dispatch(now);
    }

    /// Moves every drain on (called with every dispatch): a drained incarnation that is gone
    /// ends its drain; one with nothing in flight, while no restore runs, is asked for its
    /// positions.
    pub(super) fn advance_drains(&mut self) {
        let drains: Vec<(u32, Drain)> = self
            .membership
            .draining
            .iter()
            .map(|(w, d)| (*w, *d))
            .collect();
        for (worker, drain) in drains {
            let live = self.worker_incarnation(worker) == Some(drain.incarnation);
            if !live {
                self.end_drain(worker);
                continue;
            }
            let idle = self
                .workers
                .get(&worker)
                .is_some_and(|w| w.in_flight.is_empty());
            if drain.asked_in.is_none() && idle && !self.is_restoring() {
                if let Some(d) = self.membership.draining.get_mut(&worker) {
                    d.asked_in = Some(self.generation);
                }
                self.actions.push_back(SchedulerAction::AskDrainPositions {
                    worker,
                    incarnation: drain.incarnation,
                });
            }
        }
    }

    fn end_drain(&mut self, worker: u32) {
        let Some(drain) = self.membership.draining.remove(&worker) else {
            return;
        };
        if !drain.rejoined {
            self.remove_member(worker);
        }
        self.actions.push_back(SchedulerAction::DrainFinished {
            worker,
            incarnation: drain.incarnation,
        });
    }

    fn remove_member(&mut self, worker: u32) {
        if self.worker_set.is_spec_worker(worker) {
            self.membership.removed.insert(worker);
        } else {
            self.membership.joined.remove(&worker);
        }
    }
}
