//! Why the coordinator machine refused or failed something: the chief's start, a closure, a
//! parameter server's loss, a cut's mark, a `schedule`. Each is an enum a caller matches on;
//! none carries a decision in its text.

use super::*;

/// Why the chief's start ([`Scheduler::handle_start`]) or a restore at start-up did not end
/// with the servers restored or started afresh.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartFailure {
    /// A parameter server was lost while the start's restore ran (it was interrupted): the
    /// servers are in no known state, and a restarted chief probes them and restores again.
    #[error("parameter server ps/{ps} was lost while the chief's start restored it: {reason}")]
    ServerLost {
        /// The server.
        ps: u32,
        /// What the restore's call to it got.
        reason: String,
    },
    /// The start (or a restore at start) came after closures were scheduled.
    #[error("the chief starts (or restores) before anything is scheduled")]
    AfterScheduling,
    /// The chief's start is under way already.
    #[error("the chief's start is under way already")]
    StartUnderWay,
    /// A parameter-server recovery is under way.
    #[error("a parameter-server recovery is under way")]
    RecoveryUnderWay,
    /// A server did not answer the start's probe.
    #[error("parameter server ps/{ps} did not answer")]
    ServerMissing {
        /// The server.
        ps: u32,
    },
    /// The job has no parameter server to restore.
    #[error("there is no parameter server to restore")]
    NoServers,
    /// The checkpoint's ledger does not balance with nothing pending (LEDGER-1).
    #[error("restored ledger does not balance with nothing pending: {0:?}")]
    LedgerUnbalanced(Ledger),
    /// No checkpoint was given (none under `root` verifies), but a server has applied
    /// closures under an earlier chief: starting afresh would reuse their ids.
    #[error(
        "no checkpoint under {} verifies, but ps/{ps} has applied closures (ids below \
         {next_free_closure_id}, restore generation {generation}) under an earlier chief: \
         starting afresh would reuse their closure ids and train on state no ledger accounts \
         for. Restart the parameter servers to start the job afresh, or give the checkpoint \
         directory they were saved to",
        root.display()
    )]
    TrainedWithoutCheckpoint {
        /// Where the checkpoints were looked for.
        root: std::path::PathBuf,
        /// The server that has applied closures.
        ps: u32,
        /// Its next free closure id.
        next_free_closure_id: u64,
        /// Its restore generation.
        generation: u64,
    },
    /// Anything else: a server that refused a step or did not answer the probe within its
    /// bound, a checkpoint that does not fit.
    #[error("{0}")]
    Failed(String),
}

/// An error from a closure, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{function} (closure {}): {error}", closure.0)]
pub struct ClosureError {
    /// The closure that failed.
    pub closure: ClosureId,
    /// The registered function name.
    pub function: String,
    /// What its worker reported.
    pub error: ClosureOutcomeError,
}

/// How a closure's outcome, as a worker reports it, is a failure ([`Scheduler::handle_result`]):
/// the closure's own, non-retryable. A worker that could not run the closure, or a server it
/// could not reach, is another input (`handle_refused`, `handle_ps_unavailable`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
pub enum ClosureOutcomeError {
    /// The step function failed: its error as the worker rendered it, text because it crossed
    /// the wire so (`RunClosureError::Step`); the coordinator decides nothing on it.
    #[error("{0}")]
    Step(String),
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
    /// A parameter server lost its state and could not be restored (no checkpoint, it did
    /// not come back within the bound, the restore failed, or the closures committed since the
    /// last checkpoint could not all be kept to run again).
    #[error("parameter server ps/{ps} was lost and cannot be recovered: {cause}")]
    PsLost {
        /// The parameter server's index.
        ps: u32,
        /// Why it cannot be recovered.
        cause: PsLossCause,
    },
}

/// Why a parameter server's loss could not be recovered ([`ClosureFailure::PsLost`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PsLossCause {
    /// It lost its variables and no checkpoint was ever saved to restore them from.
    #[error(
        "no checkpoint to restore it from; save checkpoints \
         (ClusterCoordinator::save_checkpoint) so that a lost parameter server can be restored"
    )]
    NoCheckpoint,
    /// It lost its variables and the first checkpoint, read before, never became the cut.
    #[error(
        "no checkpoint to restore it from: the first checkpoint was read but never became the \
         cut ({why})"
    )]
    FirstCheckpointNeverCut {
        /// Why its write or read-back failed.
        why: String,
    },
    /// It lost its variables and the first checkpoint, read before, was not marked durable
    /// within the wait.
    #[error(
        "no checkpoint to restore it from: the first checkpoint (cut {cut}) was read but not \
         marked durable within {wait:?} (ps_restart_wait)"
    )]
    FirstCheckpointNotMarked {
        /// The cut of that checkpoint.
        cut: u64,
        /// The wait.
        wait: Duration,
    },
    /// More closures committed since the last checkpoint than are kept to run again.
    #[error(
        "more than {retained_max} closures committed since the last checkpoint, too many to run \
         again after the rollback; checkpoint more often or raise rollback_retained_max"
    )]
    RetentionOverflow {
        /// `rollback_retained_max`.
        retained_max: usize,
    },
    /// The closures committed since the last checkpoint hold more bytes (their functions and
    /// arguments) than are kept to run them again.
    #[error(
        "the closures committed since the last checkpoint hold more than {retained_bytes_max} \
         bytes of arguments, too many to keep to run again after the rollback; checkpoint more \
         often, pass less data in a closure's arguments (a per-worker dataset instead), or \
         raise rollback_retained_bytes_max"
    )]
    RetentionBytesOverflow {
        /// `rollback_retained_bytes_max`.
        retained_bytes_max: usize,
    },
    /// It was not back (answering, and restored where it lost its variables) within the wait.
    #[error("it was not back and restored within {wait:?} (ps_restart_wait)")]
    NotBack {
        /// `ps_restart_wait`.
        wait: Duration,
    },
    /// Its restore was interrupted (a server lost again meanwhile) too many times.
    #[error("restoring was interrupted {attempts} times: {reason}")]
    RestoreInterrupted {
        /// How many times.
        attempts: u32,
        /// The last interruption.
        reason: String,
    },
    /// Restoring it from the checkpoint failed.
    #[error("restoring from the checkpoint failed: {reason}")]
    RestoreFailed {
        /// What failed.
        reason: String,
    },
}

/// Why a checkpoint's cut was not marked (the previous cut stays; CKPT-1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkCutError {
    /// The cut is past the closure ids given out.
    #[error("cut {cut} is beyond the next closure id {next}")]
    BeyondNextId {
        /// The cut.
        cut: u64,
        /// The next closure id.
        next: u64,
    },
    /// Closures below the cut are unfinished.
    #[error(
        "closures below the cut {cut} are still pending: a checkpoint cut needs nothing pending"
    )]
    Pending {
        /// The cut.
        cut: u64,
    },
    /// A parameter-server restore is under way.
    #[error("a parameter-server restore is under way")]
    Restoring,
    /// A restore began after the checkpoint was read: it is from before it.
    #[error(
        "a parameter-server restore began since the checkpoint was read (restore generation \
         {read_in}, now {now})"
    )]
    RestoreSince {
        /// The generation the checkpoint was read in.
        read_in: u64,
        /// The generation now.
        now: u64,
    },
    /// A newer checkpoint was marked since.
    #[error(
        "cut {cut} is older than the current cut {current}: a newer checkpoint was marked since"
    )]
    Older {
        /// The cut.
        cut: u64,
        /// The current cut.
        current: u64,
    },
}

/// Why `schedule` refused a closure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The queue holds `queue_max` closures already.
    #[error("schedule queue is full ({0} closures waiting)")]
    QueueFull(usize),
}
