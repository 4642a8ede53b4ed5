//! The restore sub-machine: one restore of every parameter server from a checkpoint, as the
//! ordered remote calls that make it safe, for both purposes it serves: the recovery after a
//! parameter server lost its state, and the chief program's restore at start-up.
//!
//! A restore runs in four phases; every call of a phase goes out at once and the next phase
//! starts when each has answered:
//! 1. **Begin**: every server enters restore `generation` ([`RestoreCall::Begin`]): from then
//!    on it refuses every push (PS-1: a push in flight from before must not apply to the
//!    restored values) and learns every fenced worker incarnation (FENCE-1); meanwhile the
//!    checkpoint taken at the cut is read ([`RestoreCall::Load`]; not when the caller holds
//!    it already);
//! 2. **Shards**: every server's shards, slots and step counts are restored
//!    ([`RestoreCall::Shards`]);
//! 3. **RollBack**: every server's PS-1 state goes back to the cut ([`RestoreCall::RollBack`]),
//!    which re-opens it to pushes of `generation`;
//! 4. **Rewind**: every live worker rebuilds its datasets at the checkpoint's positions
//!    ([`RestoreCall::Rewind`]); one that cannot is lost (it restarts, set up at those
//!    positions), which does not fail the restore.
//!
//! Every server call goes to the incarnation pinned when the restore began, never to a newer
//! one (which would be empty and be called restored). A server that cannot be reached as that
//! incarnation interrupts the restore ([`RunEnd::Interrupted`]: the owner may try again); a
//! refusal or an unusable checkpoint fails it ([`RunEnd::Failed`]). Reports of another
//! generation, or for a call not awaited, change nothing.
//!
//! Pure: no IO, no clock. The owner ([`super::Scheduler`]) starts a run, drains the calls,
//! feeds the answers back and acts on how the run ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::{ClosureId, WorkerIncarnation};
use crate::checkpoint::{Checkpoint, ListError};
use crate::layout::Layout;
use crate::roles::protocol::SetupWorker;

/// Per worker, its datasets' positions (worker → dataset → elements read).
pub type WorkerPositions = BTreeMap<u32, BTreeMap<String, u64>>;

/// A checkpoint held in memory, shared between the machine and the calls that restore it.
/// Equal when it is the same checkpoint (the same allocation).
#[derive(Debug, Clone)]
pub struct CheckpointRef(pub Arc<Checkpoint>);

impl PartialEq for CheckpointRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CheckpointRef {}

/// One remote effect of a restore, for the shell to carry out and answer with
/// [`super::Scheduler::handle_restore_report`] (with the same `generation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreCall {
    /// Send [`crate::roles::protocol::BeginRestore`] to server `ps` as incarnation `incarnation`.
    Begin {
        /// The server.
        ps: u32,
        /// Its pinned incarnation.
        incarnation: u64,
        /// The restore generation that starts.
        generation: u64,
        /// Per worker, the newest fenced incarnation.
        fences: Vec<(u32, WorkerIncarnation)>,
        /// A chief's start afresh (`CheckpointSource::Afresh`): no shard is restored, only
        /// the generation opened (nothing was lost).
        afresh: bool,
    },
    /// Read the newest checkpoint under `root` that verifies and was taken at `cut`
    /// (blocking file IO: off the actor's thread). Answer [`RestoreReport::Loaded`].
    Load {
        /// The restore generation.
        generation: u64,
        /// The checkpoint directory of the last save.
        root: PathBuf,
        /// The cut the checkpoint must have been taken at.
        cut: ClosureId,
    },
    /// Restore every shard of `layouts` placed on server `ps` from `checkpoint` (values,
    /// optimizer slots, step counts), each with a [`crate::roles::protocol::RestoreVariable`]
    /// to incarnation `incarnation`.
    Shards {
        /// The server.
        ps: u32,
        /// Its pinned incarnation.
        incarnation: u64,
        /// The restore generation.
        generation: u64,
        /// What to restore from.
        checkpoint: CheckpointRef,
        /// Every variable's layout (only the shards on `ps` are sent).
        layouts: Vec<Layout>,
    },
    /// Send [`crate::roles::protocol::RollBack`] to server `ps` as incarnation `incarnation`.
    RollBack {
        /// The server.
        ps: u32,
        /// Its pinned incarnation.
        incarnation: u64,
        /// The restore generation it ends.
        generation: u64,
        /// Every closure below it was finished at the cut.
        finished_below: ClosureId,
    },
    /// Send [`crate::roles::protocol::RewindWorker`] with `setup` to worker incarnation
    /// `worker`/`incarnation`.
    Rewind {
        /// The worker.
        worker: u32,
        /// Its live incarnation.
        incarnation: WorkerIncarnation,
        /// The restore generation.
        generation: u64,
        /// Its setup, with the checkpoint's positions as skips.
        setup: SetupWorker,
    },
}

/// How a remote call (to a parameter server or a worker) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFault {
    /// The incarnation called could not be reached (gone, restarted, no answer in time): a
    /// restore can be tried again.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// It answered with a refusal (a shape mismatch, a wrong message): trying again would not
    /// help.
    #[error("refused: {0}")]
    Refused(String),
}

/// Why the checkpoint of a restore could not be looked for ([`RestoreReport::Loaded`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadFault {
    /// The checkpoint directory could not be listed.
    #[error(transparent)]
    Unlisted(#[from] ListError),
    /// The reader (off the actor's thread) ended without an answer: it panicked or was
    /// cancelled.
    #[error("its reader failed: {0}")]
    ReaderLost(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Why a checkpoint's dataset positions cannot be read (`dataset_positions`).
#[derive(Debug, thiserror::Error)]
#[error("step {step}: {DATASET_POSITIONS_KEY}: {source}")]
pub struct PositionsError {
    /// The checkpoint's step.
    pub step: u64,
    /// Why its entry does not decode.
    pub source: serde_json::Error,
}

/// The answer to one [`RestoreCall`].
#[derive(Debug)]
pub enum RestoreReport {
    /// Answer to [`RestoreCall::Begin`].
    Begun {
        /// The server.
        ps: u32,
        /// What came of it.
        result: Result<(), CallFault>,
    },
    /// Answer to [`RestoreCall::Load`]: the checkpoint, `Ok(None)` if no valid one was taken
    /// at the cut, or why the directory could not be read.
    Loaded {
        /// What came of it.
        result: Result<Option<CheckpointRef>, LoadFault>,
    },
    /// Answer to [`RestoreCall::Shards`]. A checkpoint that does not fit the job (a missing
    /// tensor, another shape) is a [`CallFault::Refused`].
    ShardsRestored {
        /// The server.
        ps: u32,
        /// What came of it.
        result: Result<(), CallFault>,
    },
    /// Answer to [`RestoreCall::RollBack`].
    RolledBack {
        /// The server.
        ps: u32,
        /// What came of it.
        result: Result<(), CallFault>,
    },
    /// Answer to [`RestoreCall::Rewind`]; an error loses that incarnation.
    Rewound {
        /// The worker.
        worker: u32,
        /// The incarnation rewound.
        incarnation: WorkerIncarnation,
        /// What came of it.
        result: Result<(), CallFault>,
    },
}

/// How a restore run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Every server restored and rolled back to `finished_below`, every worker rewound or
    /// lost.
    Done {
        /// The checkpoint's step.
        step: u64,
        /// The positions every worker's datasets are at now.
        positions: WorkerPositions,
        /// Workers whose datasets could not be rewound: lose them.
        lost_workers: Vec<(u32, WorkerIncarnation)>,
    },
    /// Server `ps` could not be reached as its pinned incarnation.
    Interrupted {
        /// The server.
        ps: u32,
        /// What the call ran into.
        reason: String,
    },
    /// The restore cannot succeed.
    Failed {
        /// Why.
        reason: String,
    },
    /// No checkpoint taken at the cut verifies any more (lost or damaged on disk since it
    /// was saved): a recovery may roll back to an older cut instead.
    Unreadable {
        /// Why.
        reason: String,
    },
}

/// Where the checkpoint of a run comes from.
#[derive(Debug, Clone)]
pub enum CheckpointSource {
    /// Already read (the chief's restore at start-up).
    Loaded(CheckpointRef),
    /// To be read: the newest valid checkpoint under `root` taken at `cut`.
    AtCut {
        /// The checkpoint directory.
        root: PathBuf,
        /// The cut.
        cut: ClosureId,
    },
    /// None: a chief's start afresh over servers that hold variables but applied nothing. The
    /// run opens a generation above theirs (refusing every push of an earlier chief's
    /// closures from then on, PS-1) and re-opens it; no shard is restored.
    Afresh,
}

/// One restore, from its first call to its end. See the module doc for the phases.
///
/// Calling protocol:
/// 1. [`RestoreRun::start`] gives the run and its first calls;
/// 2. for each answer, [`RestoreRun::handle`] (with the live workers and the base setup, read
///    when the Rewind phase starts) gives the next calls and, once, how the run ended;
/// 3. after it ended, it ignores everything.
#[derive(Debug)]
pub struct RestoreRun {
    generation: u64,
    servers: BTreeMap<u32, u64>,
    fences: Vec<(u32, WorkerIncarnation)>,
    finished_below: ClosureId,
    source: CheckpointSource,
    layouts: Vec<Layout>,
    phase: Phase,
    /// The servers (or, in the Rewind phase, workers) whose answer the phase awaits.
    awaiting: BTreeSet<u32>,
    /// The Begin phase also awaits the checkpoint being read.
    loading: bool,
    checkpoint: Option<CheckpointRef>,
    positions: WorkerPositions,
    /// Per worker, the incarnation its rewind went to.
    rewinding: BTreeMap<u32, WorkerIncarnation>,
    lost_workers: Vec<(u32, WorkerIncarnation)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    Shards,
    RollBack,
    Rewind,
    Ended,
}

/// What a run needs from its owner when its Rewind phase starts.
#[derive(Debug, Clone, Copy)]
pub struct RewindTargets<'a> {
    /// The live worker incarnations.
    pub workers: &'a [(u32, WorkerIncarnation)],
    /// The setup every worker gets, before the checkpoint's positions are applied.
    pub setup: &'a SetupWorker,
}

impl RestoreRun {
    /// Starts restore `generation` of the servers pinned in `servers` (index → incarnation)
    /// from `source`, rolling their PS-1 state back to `finished_below`.
    pub fn start(
        generation: u64,
        servers: BTreeMap<u32, u64>,
        fences: Vec<(u32, WorkerIncarnation)>,
        finished_below: ClosureId,
        source: CheckpointSource,
        layouts: Vec<Layout>,
    ) -> (Self, Vec<RestoreCall>) {
        let mut run = Self {
            generation,
            servers,
            fences,
            finished_below,
            checkpoint: match &source {
                CheckpointSource::Loaded(c) => Some(c.clone()),
                CheckpointSource::AtCut { .. } | CheckpointSource::Afresh => None,
            },
            source,
            layouts,
            phase: Phase::Begin,
            awaiting: BTreeSet::new(),
            loading: false,
            positions: WorkerPositions::new(),
            rewinding: BTreeMap::new(),
            lost_workers: Vec::new(),
        };
        let calls = run.enter(Phase::Begin, None);
        (run, calls)
    }

    /// The restore generation this run opened.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The server incarnations this run is for.
    pub fn pinned(&self) -> &BTreeMap<u32, u64> {
        &self.servers
    }

    /// Takes one answer; returns the next calls and, when this answer ended the run, how.
    ///
    /// Longer than most functions here on purpose: one arm per kind of restore answer, each how
    /// the run goes on after it, so that the restore's protocol reads in one place.
    pub fn handle(
        &mut self,
        report: RestoreReport,
        targets: RewindTargets<'_>,
    ) -> (Vec<RestoreCall>, Option<RunEnd>) {
        let ps_fault = |ps: u32, fault: CallFault, what: &str| match fault {
            CallFault::Unreachable(reason) => RunEnd::Interrupted {
                ps,
                reason: format!("{what}: {reason}"),
            },
            CallFault::Refused(reason) => RunEnd::Failed {
                reason: format!("ps/{ps} {what}: {reason}"),
            },
        };
        match (self.phase, report) {
            (Phase::Begin, RestoreReport::Begun { ps, result }) if self.awaiting.remove(&ps) => {
                if let Err(fault) = result {
                    return self.end(ps_fault(ps, fault, "beginning the restore"));
                }
            }
            (Phase::Begin, RestoreReport::Loaded { result }) if self.loading => match result {
                Ok(Some(checkpoint)) => {
                    self.loading = false;
                    self.checkpoint = Some(checkpoint);
                }
                Ok(None) => {
                    let (root, cut) = match &self.source {
                        CheckpointSource::AtCut { root, cut } => (root.display().to_string(), *cut),
                        CheckpointSource::Loaded(_) | CheckpointSource::Afresh => {
                            (String::new(), self.finished_below)
                        }
                    };
                    return self.end(RunEnd::Unreadable {
                        reason: format!(
                            "no valid checkpoint cut at closure {} under {root}: the closures \
                             committed since cannot be run again",
                            cut.0
                        ),
                    });
                }
                Err(fault) => {
                    return self.end(RunEnd::Failed {
                        reason: format!("reading the checkpoint: {fault}"),
                    })
                }
            },
            (Phase::Shards, RestoreReport::ShardsRestored { ps, result })
                if self.awaiting.remove(&ps) =>
            {
                if let Err(fault) = result {
                    return self.end(ps_fault(ps, fault, "restoring its shards"));
                }
            }
            (Phase::RollBack, RestoreReport::RolledBack { ps, result })
                if self.awaiting.remove(&ps) =>
            {
                if let Err(fault) = result {
                    return self.end(ps_fault(ps, fault, "rolling back"));
                }
            }
            (
                Phase::Rewind,
                RestoreReport::Rewound {
                    worker,
                    incarnation,
                    result,
                },
            ) if self.rewinding.get(&worker) == Some(&incarnation)
                && self.awaiting.remove(&worker) =>
            {
                if result.is_err() {
                    self.lost_workers.push((worker, incarnation));
                }
            }
            // Not awaited (a duplicate, another phase): nothing changes.
            _ => return (Vec::new(), None),
        }
        if !self.awaiting.is_empty() || self.loading {
            return (Vec::new(), None);
        }
        // On to the next phase; one with nothing to await (no live worker to rewind) is
        // passed at once, so that a run never waits for an answer nobody was asked for.
        loop {
            let next = match self.phase {
                Phase::Begin => Phase::Shards,
                Phase::Shards => Phase::RollBack,
                Phase::RollBack => Phase::Rewind,
                Phase::Rewind | Phase::Ended => Phase::Ended,
            };
            if next == Phase::Ended {
                return self.done();
            }
            if next == Phase::Rewind {
                match self.checkpoint.as_ref().map(|c| dataset_positions(&c.0)) {
                    Some(Err(e)) => {
                        return self.end(RunEnd::Failed {
                            reason: e.to_string(),
                        })
                    }
                    Some(Ok(positions)) => self.positions = positions,
                    None => {}
                }
            }
            let calls = self.enter(next, Some(targets));
            if !self.awaiting.is_empty() {
                return (calls, None);
            }
        }
    }

    fn done(&mut self) -> (Vec<RestoreCall>, Option<RunEnd>) {
        let end = RunEnd::Done {
            step: self.checkpoint.as_ref().map_or(0, |c| c.0.step),
            positions: std::mem::take(&mut self.positions),
            lost_workers: std::mem::take(&mut self.lost_workers),
        };
        self.end(end)
    }

    fn end(&mut self, end: RunEnd) -> (Vec<RestoreCall>, Option<RunEnd>) {
        self.phase = Phase::Ended;
        self.awaiting.clear();
        (Vec::new(), Some(end))
    }

    fn enter(&mut self, phase: Phase, targets: Option<RewindTargets<'_>>) -> Vec<RestoreCall> {
        self.phase = phase;
        let generation = self.generation;
        let servers: Vec<(u32, u64)> = self.servers.iter().map(|(p, e)| (*p, *e)).collect();
        self.awaiting = servers.iter().map(|(ps, _)| *ps).collect();
        match phase {
            Phase::Begin => {
                let mut calls: Vec<RestoreCall> = servers
                    .into_iter()
                    .map(|(ps, incarnation)| RestoreCall::Begin {
                        ps,
                        incarnation,
                        generation,
                        fences: self.fences.clone(),
                        afresh: matches!(self.source, CheckpointSource::Afresh),
                    })
                    .collect();
                if let CheckpointSource::AtCut { root, cut } = &self.source {
                    self.loading = true;
                    calls.push(RestoreCall::Load {
                        generation,
                        root: root.clone(),
                        cut: *cut,
                    });
                }
                calls
            }
            Phase::Shards => {
                // A start afresh restores no shard: the phase has nothing to await.
                let Some(checkpoint) = self.checkpoint.clone() else {
                    self.awaiting.clear();
                    return Vec::new();
                };
                servers
                    .into_iter()
                    .map(|(ps, incarnation)| RestoreCall::Shards {
                        ps,
                        incarnation,
                        generation,
                        checkpoint: checkpoint.clone(),
                        layouts: self.layouts.clone(),
                    })
                    .collect()
            }
            Phase::RollBack => servers
                .into_iter()
                .map(|(ps, incarnation)| RestoreCall::RollBack {
                    ps,
                    incarnation,
                    generation,
                    finished_below: self.finished_below,
                })
                .collect(),
            Phase::Rewind => {
                let targets = targets.expect("the Rewind phase is entered from handle");
                self.rewinding = targets.workers.iter().copied().collect();
                self.awaiting = self.rewinding.keys().copied().collect();
                self.rewinding
                    .iter()
                    .map(|(worker, incarnation)| RestoreCall::Rewind {
                        worker: *worker,
                        incarnation: *incarnation,
                        generation,
                        setup: setup_with_positions(targets.setup, self.positions.get(worker)),
                    })
                    .collect()
            }
            Phase::Ended => Vec::new(),
        }
    }
}

/// `setup` with its datasets resuming at `positions` (a worker's, from a checkpoint).
pub fn setup_with_positions(
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

/// The per-worker, per-dataset positions a checkpoint keeps (none in a checkpoint without
/// them: datasets start over), or why they cannot be read.
pub fn dataset_positions(ckpt: &Checkpoint) -> Result<WorkerPositions, PositionsError> {
    match ckpt.extra.get(DATASET_POSITIONS_KEY) {
        Some(value) => serde_json::from_value(value.clone()).map_err(|source| PositionsError {
            step: ckpt.step,
            source,
        }),
        None => Ok(WorkerPositions::new()),
    }
}

/// Where a checkpoint's manifest keeps per-worker, per-dataset positions (the
/// `dataset_positions` field holds each worker's total).
pub const DATASET_POSITIONS_KEY: &str = "dataset_positions_by_name";
