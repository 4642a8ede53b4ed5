//! The messages of parameter-server training, as they travel between the chief, the parameter
//! servers and the workers (bincode 2 through the actor gateway, DESIGN §3).
//!
//! Tensors (and row-id lists) travel as raw little-endian blobs beside the message header
//! (the gateway's `call_with_blobs`), never as element-by-element sequences and never
//! re-encoded; each message says which blobs it carries, in order. Every reply of a parameter
//! server that can fail carries a typed [`PsRefusal`] whose message names what was wrong, so
//! that a remote refusal reads as well as a local one.

use bincode::{Decode, Encode};
use cohort_actors::{RemoteMessage, Senders};

pub use super::blob::{
    blob, blob_u64, bytes_to_f32, decode_f32_into, f32_blob, f32_shared_blob, f32_to_bytes,
    f32_vec_blob, f32_view, u64_blob, u64_vec_blob, u64_view, BlobError, Element,
};
pub use super::push::{LearningRate, Push, PushOrigin, PushOutcome, WireGradient};
use crate::layout::Layout;
use crate::optim::{OptimError, ScheduleError};

/// SEC-2: control messages (creating, restoring, fencing, rolling back, dispatching,
/// retiring, shutting down) come only from the chief.
pub const CHIEF: Senders = Senders::Roles(&[CHIEF_ROLE]);
/// SEC-2: variable reads come from the workers' steps and from the chief (evaluation on the
/// chief, [`crate::program::ClusterCoordinator::read_variable`]).
pub const CHIEF_OR_WORKER: Senders = Senders::Roles(&[CHIEF_ROLE, WORKER_ROLE]);
/// SEC-2: gradients come only from the workers' steps.
pub const WORKER: Senders = Senders::Roles(&[WORKER_ROLE]);
/// SEC-2: preemption notices come from the tasks the chief schedules on: workers and
/// parameter servers.
pub const WORKER_OR_PS: Senders = Senders::Roles(&[WORKER_ROLE, PS_ROLE]);

/// The certificate role of the chief (`TaskType::Chief`).
const CHIEF_ROLE: &str = "chief";
/// The certificate role of a worker (`TaskType::Worker`).
const WORKER_ROLE: &str = "worker";
/// The certificate role of a parameter server (`TaskType::Ps`).
const PS_ROLE: &str = "ps";

/// The actor name of the parameter server on its node.
pub const PS_ACTOR: &str = "ps";
/// The actor name of the worker on its node.
pub const WORKER_ACTOR: &str = "worker";
/// The actor name of the coordinator on the chief's node.
pub const COORDINATOR_ACTOR: &str = "coordinator";

/// How a parameter server fills a new variable (values are generated where they live, so a
/// 1,000,000-row table never crosses the network at creation).
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub enum InitSpec {
    /// All zeros.
    Zeros,
    /// Every element the same.
    Constant(f32),
    /// Uniform in `[min, max)` from `seed`.
    Uniform {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
        /// RNG seed.
        seed: u64,
    },
    /// Glorot uniform over the *full* variable's fans, from `seed`.
    GlorotUniform {
        /// RNG seed.
        seed: u64,
        /// Fan in of the full variable.
        fan_in: u64,
        /// Fan out of the full variable.
        fan_out: u64,
    },
    /// Explicit values, little-endian f32.
    Values(Vec<u8>),
}

/// Create a variable shard on a parameter server (idempotent for the same shape).
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct CreateVariable {
    /// The shard's name.
    pub name: String,
    /// The shard's shape.
    pub shape: Vec<u64>,
    /// How to fill it.
    pub init: InitSpec,
}

impl RemoteMessage for CreateVariable {
    const TAG: &'static str = "ps.create";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<(), PsRefusal>;
}

/// Replace a shard's values, slots and step count (restore from a checkpoint). Blobs: the
/// values, then one per slot in the order of `slots`.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct RestoreVariable {
    /// The shard's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Optimizer slot names, in blob order.
    pub slots: Vec<String>,
    /// Updates applied so far.
    pub steps: u64,
}

impl RemoteMessage for RestoreVariable {
    const TAG: &'static str = "ps.restore";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<(), PsRefusal>;
}

/// Set a shard's values from the chief (Keras' `set_weights` under ParameterServerStrategy),
/// its optimizer slots and step count kept. Blob 0: the values, little-endian f32. Sent with
/// no closure in flight; refused while a restore is under way.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct AssignVariable {
    /// The shard's name.
    pub name: String,
}

impl RemoteMessage for AssignVariable {
    const TAG: &'static str = "ps.assign";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<(), PsRefusal>;
}

/// Read whole shards. Reply blobs: one per name, little-endian f32.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct Pull {
    /// The shards, by name.
    pub names: Vec<String>,
}

impl RemoteMessage for Pull {
    const TAG: &'static str = "ps.pull";
    const SENDERS: Senders = CHIEF_OR_WORKER;
    type Reply = Result<(), PsRefusal>;
}

/// Read some rows of a `[rows, width]` shard. Blob: the row indices within the shard,
/// little-endian u64. Reply blob: the rows, concatenated, little-endian f32.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct PullRows {
    /// The shard.
    pub name: String,
}

impl RemoteMessage for PullRows {
    const TAG: &'static str = "ps.pull_rows";
    const SENDERS: Senders = CHIEF_OR_WORKER;
    type Reply = Result<(), PsRefusal>;
}

impl RemoteMessage for Push {
    const TAG: &'static str = "ps.push";
    const SENDERS: Senders = WORKER;
    type Reply = Result<PushOutcome, PsRefusal>;
}

/// The coordinator declared a worker incarnation lost (FENCE-1).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct FenceWorker {
    /// The worker.
    pub worker: u32,
    /// The fenced incarnation (and older).
    pub incarnation: u64,
}

impl RemoteMessage for FenceWorker {
    const TAG: &'static str = "ps.fence";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// The coordinator's low watermark: every closure with an id below `closure` is finished for
/// good (committed or ended with an error) and will never be dispatched again. A parameter
/// server forgets the ids below it that it kept for PS-1 and refuses any push below it as a
/// duplicate (it can only be a late retry of a finished closure). Sent to every parameter
/// server periodically, whenever it has risen, never while a recovery holds dispatch. A
/// server ignores one from a restore generation older than its own: a watermark computed
/// before a rollback would refuse the closures run again after it (PS-1, LEDGER-1).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct FinishedBelow {
    /// The smallest closure id still unfinished (queued, in flight or waiting to be retried),
    /// or the next id to be scheduled when none is.
    pub closure: u64,
    /// The coordinator's restore generation when it computed the watermark.
    pub generation: u64,
}

impl RemoteMessage for FinishedBelow {
    const TAG: &'static str = "ps.finished_below";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// A shard's full state, for a checkpoint.
#[derive(Debug, Clone, PartialEq, Encode, Decode)]
pub struct Snapshot {
    /// The shard.
    pub name: String,
}

/// A shard's shape, slot names and step count. Reply blobs: the values, then one per slot in
/// the order of `slots`, little-endian f32.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct ShardState {
    /// Its shape.
    pub shape: Vec<u64>,
    /// Optimizer slot names, in blob order.
    pub slots: Vec<String>,
    /// Updates applied so far.
    pub steps: u64,
}

impl RemoteMessage for Snapshot {
    const TAG: &'static str = "ps.snapshot";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<ShardState, PsRefusal>;
}

/// The parameter server's counters (PS-1 / FENCE-1 evidence).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PsStats;

/// Counters of one parameter server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct PsStatsReply {
    /// Pushes applied.
    pub applied: u64,
    /// Pushes refused as duplicates of an applied closure (PS-1).
    pub rejected_duplicate: u64,
    /// Pushes refused from fenced incarnations (FENCE-1), at the PS or its gateway.
    pub rejected_stale: u64,
    /// Pushes skipped for non-finite gradients.
    pub skipped_non_finite: u64,
    /// Pushes refused as invalid.
    pub rejected_invalid: u64,
    /// The first closure id a new closure may use without being taken for a duplicate here:
    /// above every id applied here and at least the low watermark (0 if neither).
    pub next_free_closure_id: u64,
    /// Closure ids kept for PS-1 (those applied at or above the low watermark).
    pub applied_ids_held: u64,
    /// The low watermark this parameter server knows ([`FinishedBelow`]).
    pub finished_below: u64,
    /// Whether it holds any variable (a restarted server holds none until it is restored).
    pub serving: bool,
    /// The restore generation it is at ([`BeginRestore`]).
    pub generation: u64,
    /// Whether a restore of that generation that writes a checkpoint's shards began here and
    /// was not rolled back yet ([`RollBack`]): what it holds may be that checkpoint's,
    /// restored part way. A start afresh cut short ([`BeginRestore::afresh`]) is not one.
    pub restoring: bool,
    /// Pushes refused because they came from an older restore generation or arrived while a
    /// restore was under way (PS-1; counted in `rejected_stale` too).
    pub rejected_old_generation: u64,
}

impl RemoteMessage for PsStats {
    const TAG: &'static str = "ps.stats";
    const SENDERS: Senders = CHIEF;
    type Reply = PsStatsReply;
}

/// Run one scheduled closure on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct RunClosure {
    /// The closure.
    pub closure: u64,
    /// Which attempt.
    pub attempt: u32,
    /// The coordinator's restore generation at dispatch; the worker's pushes carry it.
    pub generation: u64,
    /// The registered function's name.
    pub function: String,
    /// Its encoded arguments.
    pub args: Vec<u8>,
    /// Per parameter server (by index), the incarnation the chief knows serving (0: none
    /// known): the worker's calls go to it, or to a newer one, never to an older one whose
    /// connection has not idled out yet (a server restored under a new incarnation is reached
    /// at once).
    pub servers: Vec<u64>,
    /// The rate the chief scheduled the closure with, which its pushes carry
    /// ([`crate::roles::push::PushOrigin::learning_rate`]); `None`: the servers' own.
    pub learning_rate: Option<LearningRate>,
}

impl RemoteMessage for RunClosure {
    const TAG: &'static str = "worker.run";
    const SENDERS: Senders = CHIEF;
    /// The encoded return value, or why there is none.
    type Reply = Result<Vec<u8>, RunClosureError>;
}

/// Why a worker returned no value for a closure.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum RunClosureError {
    /// The step function failed: the closure's own, non-retryable error.
    #[error("{0}")]
    Step(String),
    /// The worker could not run the closure: the worker's failure, not the closure's. The
    /// coordinator treats it as a lost worker for that closure (fences the incarnation and
    /// runs the closure elsewhere).
    #[error(transparent)]
    Refused(#[from] WorkerRefusal),
    /// A parameter server could not be reached (or had lost its state and refused): the
    /// server's failure, retryable. The coordinator queues the closure again and holds
    /// dispatch until the server is back (restored from a checkpoint if it restarted).
    #[error(transparent)]
    PsUnavailable(#[from] PsUnavailable),
}

/// Why a worker could not be set up (or rewound). The worker keeps its previous setup.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode, thiserror::Error)]
pub enum SetupError {
    /// The variable layouts are malformed.
    #[error("variable layouts: {0}")]
    Layouts(String),
    /// A setup older than one this incarnation took from the same chief incarnation (a
    /// delayed request overtaken by a newer one): ignored, nothing changed.
    #[error("setup version {version} is older than version {taken}, taken already: ignored")]
    Outdated {
        /// The setup's version.
        version: u64,
        /// The newest version taken.
        taken: u64,
    },
    /// A restored position beyond what a worker skips.
    #[error("dataset {dataset:?}: cannot resume {skip} elements in (at most {max})")]
    SkipTooFar {
        /// The dataset function.
        dataset: String,
        /// Elements asked to skip.
        skip: u64,
        /// The most a worker skips ([`crate::roles::worker::SKIP_MAX`]).
        max: u64,
    },
    /// No dataset function of that name is registered in the program.
    #[error("no dataset function {0:?} registered")]
    UnknownDataset(String),
    /// Building the dataset failed.
    #[error("dataset {dataset:?}: {reason}")]
    Build {
        /// The dataset function.
        dataset: String,
        /// What went wrong.
        reason: String,
    },
    /// Reading the dataset up to its restored position failed.
    #[error("dataset {dataset:?}: resuming at element {skip}: {reason}")]
    Resume {
        /// The dataset function.
        dataset: String,
        /// The position it was resuming at.
        skip: u64,
        /// What went wrong.
        reason: String,
    },
    /// The worker could not take the setup.
    #[error(transparent)]
    Refused(#[from] WorkerRefusal),
}

/// Why a worker reported no dataset positions.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode, thiserror::Error)]
pub enum PositionsError {
    /// The worker could not take the request.
    #[error(transparent)]
    Refused(#[from] WorkerRefusal),
}

/// Why a request to the parameter server was refused. Nothing changed. It travels in the
/// server's replies, inside [`PsRefusal`].
#[derive(Debug, Clone, PartialEq, thiserror::Error, bincode::Encode, bincode::Decode)]
pub enum PsError {
    /// The learning-rate schedule cannot give a rate.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// No variable of that name lives here.
    #[error("variable {0:?} does not exist on this parameter server")]
    UnknownVariable(String),
    /// The initial value does not fill the shape.
    #[error("variable {name:?}: shape {shape:?} needs {expected} values, got {got}")]
    InitialValueLength {
        /// The variable.
        name: String,
        /// The shape.
        shape: Vec<usize>,
        /// Values the shape needs.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// Row operations need a 2-D variable.
    #[error(
        "variable {name:?} has shape {shape:?}; row access needs a 2-D [rows, width] variable"
    )]
    NotRowShaped {
        /// The variable.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A row id outside the table.
    #[error("variable {name:?}: row {row} out of range (rows: {rows})")]
    RowOutOfRange {
        /// The variable.
        name: String,
        /// The row asked for.
        row: u64,
        /// Rows in the variable.
        rows: usize,
    },
    /// A reply would exceed what one message may carry.
    #[error(
        "variable {name:?}: the request asks for more than {elements_max} values in one reply"
    )]
    TooLarge {
        /// The variable.
        name: String,
        /// The most values one reply may carry.
        elements_max: usize,
    },
    /// A variable can be restored only while a restore runs (between the begin and the
    /// roll-back of a restore generation): a restore message delivered again after the
    /// roll-back would otherwise wipe out the updates applied since (PS-1).
    #[error("variable {name:?}: no restore is under way (a variable is restored only between the begin and the roll-back of a restore)")]
    NotRestoring {
        /// The variable.
        name: String,
    },
    /// An assignment of a variable while a restore is under way (it would be rolled back).
    #[error("variable {name:?}: a restore is under way; assign it once the restore is done")]
    AssignDuringRestore {
        /// The variable.
        name: String,
    },
    /// An assignment whose value does not fill the variable.
    #[error("variable {name:?} holds {expected} values, the assignment gives {got}")]
    AssignLength {
        /// The variable.
        name: String,
        /// Values it holds.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A restored step count that leaves no room for another update.
    #[error("variable {name:?}: restored step count {steps} is out of range")]
    BadStepCount {
        /// The variable.
        name: String,
        /// The step count given.
        steps: u64,
    },
    /// Restored slots do not fit the variable or the optimizer.
    #[error(
        "variable {name:?}: restored optimizer slots do not match its length or the optimizer"
    )]
    SlotsMismatch {
        /// The variable.
        name: String,
    },
    /// The optimizer refused the gradient (shape, dtype or non-finite under the error policy).
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// An optimizer given for a name scope cannot serve (the scope named).
    #[error("{reason}")]
    OptimizerScope {
        /// What is wrong, naming the scope.
        reason: String,
    },
}

/// Why a worker could not take a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum WorkerRefusal {
    /// Its compute thread's queue is full.
    #[error("worker busy: {queued} jobs already queued")]
    Busy {
        /// Jobs waiting already.
        queued: u32,
    },
    /// Its compute thread has stopped.
    #[error("worker compute thread stopped")]
    ComputeStopped,
    /// Its compute thread dropped the job without answering.
    #[error("worker compute thread dropped the job")]
    JobDropped,
    /// A parameter server refused this incarnation's push as fenced (FENCE-1): the
    /// incarnation exits to come back as a new one.
    #[error("a parameter server refused this worker incarnation as fenced (FENCE-1)")]
    Fenced,
    /// A closure reached it before any setup took effect.
    #[error("worker not set up")]
    NotSetUp,
    /// It is retired (fenced by the chief) or exiting.
    #[error("worker retired")]
    Retired,
    /// The closure comes from an older chief incarnation than the one that set this worker up
    /// (sent before that chief died): it never commits, and reading its data would skip it.
    #[error("closure from chief incarnation {chief}, older than the one that set this worker up ({current})")]
    FromOldChief {
        /// The sending chief's incarnation.
        chief: u64,
        /// The incarnation of the chief whose setup this worker took.
        current: u64,
    },
    /// The closure belongs to an earlier restore generation than the setup this worker took
    /// from the same chief (sent before a restore, delivered after its rewind): it never
    /// commits, and reading its data would skip it.
    #[error(
        "closure of restore generation {generation}, older than this worker's setup ({current})"
    )]
    FromOldGeneration {
        /// The closure's restore generation.
        generation: u64,
        /// The restore generation of the setup this worker took.
        current: u64,
    },
}

/// From the chief to a worker incarnation it fenced (FENCE-1) while that process may still
/// be alive (a step past the step timeout, a refused setup or job, a false death): the worker
/// exits with the code that makes its supervisor restart it as a new incarnation, which the
/// coordinator then takes back. Sent with `Gateway::call_fenced`, since the chief's gateway
/// may have fenced the incarnation itself.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Retire {
    /// The fenced incarnation; a worker acts on it only if it is its own.
    pub incarnation: u64,
}

impl RemoteMessage for Retire {
    const TAG: &'static str = "worker.retire";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// From the chief at the end of a job that succeeded, to every worker and parameter server:
/// the job is over, exit with success now (and do not wait out the detection budget to
/// notice that the chief is gone).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Shutdown;

impl RemoteMessage for Shutdown {
    const TAG: &'static str = "node.shutdown";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// From a worker or parameter-server incarnation that got a preemption notice (SIGTERM), to
/// the chief: it is about to go. The chief answers whether it may leave ([`LeaveAnswer::Go`])
/// or must keep serving through its grace ([`LeaveAnswer::Stay`]: the chief is stopping too,
/// and its own preemption checkpoint needs the workers to finish its steps and the servers to
/// be read). A worker is answered at once: its incarnation is fenced and its closure handed
/// back, to run elsewhere now rather than after the failure detector's budget. A parameter
/// server is answered once the chief has taken a checkpoint cut with dispatch held, so that
/// its restore runs nothing again (`crate::roles::coordinator::machine::preempt`).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Leaving {
    /// The leaving incarnation.
    pub incarnation: u64,
}

/// The chief's answer to [`Leaving`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub enum LeaveAnswer {
    /// Leave now: the incarnation is fenced and its closure runs elsewhere.
    Go,
    /// Keep serving until the chief is gone or the grace has passed.
    Stay,
}

impl RemoteMessage for Leaving {
    const TAG: &'static str = "coordinator.leaving";
    const SENDERS: Senders = WORKER_OR_PS;
    type Reply = LeaveAnswer;
}

/// From a worker or parameter-server incarnation to the chief when it registers: it is a task
/// of this job and is dialled at `addr` (the `host:port` it serves on). A task the cluster
/// spec does not name joins the running job this way (elastic workers and parameter
/// servers); for one the spec names it changes nothing. The chief takes the task's role and
/// index from its certificate (SEC-1), never from the message. A worker is set up (its
/// datasets built) before it gets any work; a parameter server is given its share of the
/// variables at the next checkpoint cut (the coordinator machine's `reshard`).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Joining {
    /// The joining incarnation.
    pub incarnation: u64,
    /// Where the chief dials it: `host:port`.
    pub addr: String,
}

/// Why the chief refused a task's [`Joining`]: a permanent error of the task's configuration
/// (it exits 2).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum JoinRefusal {
    /// Its index (from its certificate) is past the most workers the job may have.
    #[error(
        "worker/{worker} cannot join: the job has at most {workers_max} workers (workers_max), \
         indexed from 0"
    )]
    BeyondMax {
        /// The worker's index.
        worker: u32,
        /// The most workers the job may have.
        workers_max: u32,
    },
    /// The address it gave is not `host:port`.
    #[error("{task} cannot join: its address {addr:?} is not host:port")]
    BadAddress {
        /// The task, `role/index`.
        task: String,
        /// The address given.
        addr: String,
    },
    /// A parameter server's index past the most a job may have.
    #[error(
        "ps/{ps} cannot join: parameter servers are indexed below {servers_max} \
         (SERVERS_MAX)"
    )]
    PsBeyondMax {
        /// The server's index.
        ps: u32,
        /// The bound.
        servers_max: u32,
    },
    /// A parameter server the cluster spec does not name cannot join a job that has no
    /// checkpoint directory: its share of the variables is moved at a checkpoint cut.
    #[error(
        "ps/{ps} cannot join: the job has no checkpoint directory (checkpoint_dir) to take \
         the cut that moves variables onto it"
    )]
    PsNoCheckpointDir {
        /// The server's index.
        ps: u32,
    },
}

/// The most parameter servers a job may have (their indexes are below it): bounds what a
/// joining server may ask for and every per-server list on the wire.
pub const SERVERS_MAX: u32 = 1024;

impl RemoteMessage for Joining {
    const TAG: &'static str = "coordinator.joining";
    const SENDERS: Senders = WORKER_OR_PS;
    type Reply = Result<(), JoinRefusal>;
}

/// From a worker or parameter-server incarnation asked to leave the job for good (scaled
/// down: the drain signal, SIGUSR1) to the chief, which answers once the task may go; it then
/// exits 0 (not restarted). A worker: the chief gives it no new work, lets what it runs
/// finish, keeps its dataset positions for its index, fences it and stops counting it as a
/// member. A parameter server: at a checkpoint cut its variables move onto the other servers
/// (the coordinator machine's `reshard`), so nothing is lost and nothing runs again.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Draining {
    /// The draining incarnation.
    pub incarnation: u64,
}

impl RemoteMessage for Draining {
    const TAG: &'static str = "coordinator.draining";
    const SENDERS: Senders = WORKER_OR_PS;
    type Reply = Result<(), DrainRefusal>;
}

/// Why the chief did not let a parameter server leave the job ([`Draining`]): it stays and
/// keeps serving (a worker's drain is never refused).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum DrainRefusal {
    /// It is the job's only parameter server.
    #[error("ps/{ps} is the job's only parameter server; it cannot leave")]
    LastServer {
        /// The server.
        ps: u32,
    },
    /// The job has no checkpoint directory for the cut that moves its variables.
    #[error(
        "ps/{ps} cannot leave: the job has no checkpoint directory (checkpoint_dir) to take \
         the cut that moves its variables onto the other servers"
    )]
    NoCheckpointDir {
        /// The server.
        ps: u32,
    },
    /// The cut or the move of its variables failed (why); the job goes on with it.
    #[error("ps/{ps} cannot leave now: {reason}")]
    Failed {
        /// The server.
        ps: u32,
        /// What went wrong.
        reason: String,
    },
}

/// Prepare a worker incarnation before any closure: the variable layouts and the per-worker
/// datasets to (re)build. Sent to every new incarnation, so a restarted worker rebuilds its
/// datasets before it runs anything.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct SetupWorker {
    /// Workers in the cluster (the number of input pipelines).
    pub num_workers: u32,
    /// Every variable's layout; the worker validates each ([`Layout::validate`]) before it
    /// takes the setup.
    pub layouts: Vec<Layout>,
    /// Datasets to build: registered dataset function name and elements to skip first (a
    /// restored position).
    pub datasets: Vec<(String, u64)>,
    /// Every parameter server of the job now, with the `host:port` it serves on: servers may
    /// have joined or left since the worker's own cluster spec was written.
    pub servers: Vec<(u32, String)>,
    /// The coordinator's setup version (`Scheduler::setup_version`), which grows whenever a
    /// setup handed out before becomes outdated (a restore, a new configuration). A worker
    /// ignores a setup older than one it has taken from the same chief incarnation: a request
    /// overtaken by a newer one (another stream, delayed) must not undo it.
    pub version: u64,
    /// The coordinator's restore generation when it handed the setup out
    /// ([`RunClosure::generation`]). A closure of an earlier generation from the same chief
    /// (sent before a restore, delivered after its rewind) is refused: it can never commit,
    /// and reading its data would skip that data for the closures that do.
    pub generation: u64,
}

impl RemoteMessage for SetupWorker {
    const TAG: &'static str = "worker.setup";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<(), SetupError>;
}

/// Why a parameter server refused a request ([`CreateVariable`], [`RestoreVariable`],
/// [`AssignVariable`], [`Pull`], [`PullRows`], [`Push`], [`Snapshot`]). Nothing changed on the server. Its
/// message names what was wrong (the variable, the blob, the sender).
#[derive(Debug, Clone, PartialEq, Encode, Decode, thiserror::Error)]
pub enum PsRefusal {
    /// The store refused it (an unknown variable, a shape or length that does not fit, a
    /// restore outside a restore, the optimizer's refusal).
    #[error(transparent)]
    Store(#[from] PsError),
    /// A blob of the request is missing or malformed.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// A shard larger than a parameter server holds.
    #[error("shape {shape:?} exceeds {elements_max} elements per shard")]
    ShapeTooLarge {
        /// The shape asked for.
        shape: Vec<u64>,
        /// The most elements one shard may have.
        elements_max: u64,
    },
    /// The initializer cannot fill the variable.
    #[error("variable {name:?}: {problem}")]
    Initializer {
        /// The variable.
        name: String,
        /// What is wrong with the initializer.
        problem: InitProblem,
    },
    /// A pull naming more variables than one pull may.
    #[error("a pull may name at most {max} variables, got {got}")]
    TooManyNames {
        /// Variables named.
        got: u64,
        /// The most one pull may name.
        max: u64,
    },
    /// A push that names another worker or incarnation than the authenticated sender (SEC-2).
    #[error(
        "push names worker/{worker} incarnation {incarnation} but comes from {from} incarnation {from_incarnation} \
         (SEC-2: a worker pushes only as itself)"
    )]
    NotTheSender {
        /// The worker the push names.
        worker: u32,
        /// The incarnation the push names.
        incarnation: u64,
        /// The authenticated sender.
        from: String,
        /// The sender's incarnation.
        from_incarnation: u64,
    },
}

impl From<OptimError> for PsRefusal {
    fn from(error: OptimError) -> Self {
        Self::Store(PsError::Optim(error))
    }
}

/// What is wrong with a variable's initializer ([`InitSpec`]).
#[derive(Debug, Clone, PartialEq, Encode, Decode, thiserror::Error)]
pub enum InitProblem {
    /// A constant that is NaN or infinite.
    #[error("constant initializer {0} is not finite")]
    NonFiniteConstant(f32),
    /// A uniform range that is not finite or not ordered.
    #[error("uniform initializer needs finite min <= max, got [{min}, {max})")]
    BadUniformRange {
        /// Lower bound given.
        min: f32,
        /// Upper bound given.
        max: f32,
    },
    /// Drawing the values failed.
    #[error("drawing the initial values failed: {0}")]
    Draw(String),
}

/// How far this worker incarnation has read each of its datasets (elements, counting those
/// skipped to resume), for a checkpoint's dataset positions.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct DatasetPositions;

impl RemoteMessage for DatasetPositions {
    const TAG: &'static str = "worker.positions";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<Vec<(String, u64)>, PositionsError>;
}

/// A parameter server a worker could not reach while running a closure (see
/// [`RunClosureError::PsUnavailable`]).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, thiserror::Error)]
#[error("parameter server ps/{ps} unavailable: {reason}")]
pub struct PsUnavailable {
    /// The parameter server's index.
    pub ps: u32,
    /// What the call ran into.
    pub reason: String,
}

/// From the chief to every parameter server when a recovery's restore starts: the server
/// enters restore generation `generation` and refuses every push until the [`RollBack`] of
/// that generation re-opens it, and any push of an older generation after that (PS-1: a push
/// still in flight from before the restore must not apply to the restored variables). It
/// also learns every worker incarnation fenced so far, since a restarted server knows none
/// (FENCE-1). A server already at a newer generation ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct BeginRestore {
    /// The restore generation that starts.
    pub generation: u64,
    /// Per worker, the newest fenced incarnation.
    pub fences: Vec<(u32, u64)>,
    /// Whether it is a chief's start afresh, which restores no shard (the server's probe
    /// answers say so: [`PsStatsReply::restoring`]).
    pub afresh: bool,
}

impl RemoteMessage for BeginRestore {
    const TAG: &'static str = "ps.begin_restore";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// From the chief to every parameter server after a recovery restored them all from the
/// checkpoint taken at a cut: PS-1's state goes back to that cut. Every closure below
/// `finished_below` was finished when the checkpoint was taken; none at or above it had
/// applied, so the ids kept as applied are dropped and the low watermark is set to the cut
/// (lowered if need be), and the closures queued again since can apply once more. Pushes of
/// `generation` are accepted again; a roll-back of an older generation is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct RollBack {
    /// The checkpoint's cut (its next closure id).
    pub finished_below: u64,
    /// The restore generation it ends ([`BeginRestore`]).
    pub generation: u64,
}

impl RemoteMessage for RollBack {
    const TAG: &'static str = "ps.roll_back";
    const SENDERS: Senders = CHIEF;
    type Reply = ();
}

/// From the chief to every live worker after a parameter-server recovery: rebuild every
/// dataset from the start of `setup`, skipping to the positions it gives (the checkpoint's),
/// dropping where the datasets were.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct RewindWorker {
    /// The setup, with the checkpoint's positions as skips.
    pub setup: SetupWorker,
}

impl RemoteMessage for RewindWorker {
    const TAG: &'static str = "worker.rewind";
    const SENDERS: Senders = CHIEF;
    type Reply = Result<(), SetupError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sec2_sender_roles_are_the_certificate_roles_of_the_cluster() {
        use crate::cluster::TaskType;
        assert_eq!(CHIEF_ROLE, TaskType::Chief.as_str());
        assert_eq!(WORKER_ROLE, TaskType::Worker.as_str());
        // Control is the chief's alone; a parameter server or an evaluator sends nothing.
        for role in ["worker", "ps", "evaluator"] {
            assert!(!CHIEF.allows(role), "{role}");
            assert!(!FenceWorker::SENDERS.allows(role), "{role}");
            assert!(!RunClosure::SENDERS.allows(role), "{role}");
        }
        assert!(Push::SENDERS.allows("worker") && !Push::SENDERS.allows("chief"));
        assert!(Pull::SENDERS.allows("chief") && Pull::SENDERS.allows("worker"));
        assert!(!PullRows::SENDERS.allows("ps") && !PullRows::SENDERS.allows("evaluator"));
        // Only a worker or a server joins or drains (as itself: its role and index come from
        // its certificate).
        for role in ["chief", "evaluator"] {
            assert!(!Joining::SENDERS.allows(role), "{role}");
            assert!(!Draining::SENDERS.allows(role), "{role}");
        }
        for role in ["worker", "ps"] {
            assert!(Joining::SENDERS.allows(role) && Draining::SENDERS.allows(role));
        }
    }

    #[test]
    fn f32_bytes_round_trip_bit_exact() {
        let values = [0.0f32, -1.5, f32::NAN, f32::INFINITY, 1e-30];
        let back = bytes_to_f32(&f32_to_bytes(&values), "t").unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            bytes_to_f32(&[1, 2, 3], "grad w").unwrap_err().to_string(),
            "grad w: 3 bytes is not a whole number of f32 values"
        );
        assert_eq!(
            blob_u64(&u64_blob(&[0, 7, u64::MAX]), "ids").unwrap(),
            [0, 7, u64::MAX]
        );
        assert!(blob_u64(&[0; 9], "ids")
            .unwrap_err()
            .to_string()
            .starts_with("ids: 9 bytes"));
        assert_eq!(
            blob(&[], 0, "push w").unwrap_err().to_string(),
            "push w: missing blob 0 (message carries 0)"
        );
        let mut out = [0.0f32; 2];
        assert_eq!(
            decode_f32_into(&mut out, &[0; 4], "rows of w")
                .unwrap_err()
                .to_string(),
            "rows of w: 4 bytes where 2 f32 values were expected"
        );
    }
}
