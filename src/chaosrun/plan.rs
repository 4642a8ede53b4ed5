//! The chaos plan: a TOML file of a seed and a list of faults, read once and checked before
//! anything runs. The same plan drives a real local job ([`super::run`]) and the simulator
//! ([`Plan::to_scenario`]).
//!
//! ```toml
//! seed = 7
//! expect_exit = 0            # the job's exit code when it survives (default 0)
//!
//! [[fault]]
//! kind = "kill"              # kill | pause | term | delete_checkpoint | corrupt_checkpoint
//!                            # (a kill, pause or term due while its task is being restarted
//!                            # hits the task's next process, waited for up to 10 s)
//! target = "worker:1"        # chief, ps:0, worker:1, or a role ("worker": index drawn from the seed)
//! at = "6s"                  # after the job's start, or a range "4s..9s" drawn from the seed
//! after = "first_checkpoint" # count `at` from the job's first checkpoint instead of its
//!                            # start (default "start"; "checkpoint:N" counts from the Nth
//!                            # checkpoint the runner sees; runner only, not the simulator)
//!
//! [[fault]]
//! kind = "pause"
//! target = "worker"
//! at = "4s..9s"
//! for = "2s"                 # pause only: SIGSTOP, then SIGCONT this much later
//!
//! [[fault]]
//! kind = "delete_checkpoint"
//! at = "8s"
//! which = "all"              # checkpoint kinds: "newest" (default) or "all" (delete only)
//!
//! [[fault]]
//! kind = "partition"         # nothing passes between target and peer, then healed
//! target = "worker:0"
//! peer = "chief"             # no peer: the target is cut off from every other task
//! at = "3s"
//! for = "5s"
//!
//! [[fault]]
//! kind = "disk_full"         # the checkpoint directory's filesystem full (ENOSPC), then freed
//! at = "1s"                  # (the job runs over a tmpfs of `disk_size_mib`, default 256,
//! after = "first_checkpoint" # in a mount namespace of its own)
//! for = "10s"
//!
//! [[fault]]
//! kind = "scale"             # ask the launcher for this many workers (or `ps = N`): it
//! workers = 3                # starts or drains tasks (the job was launched with
//! at = "5s"                  # `--workers MIN:MAX --run-dir`, or `--ps MIN:MAX`)
//!
//! [[fault]]
//! kind = "loss"              # each datagram between target and peer lost with this
//! target = "ps:1"            # probability (no peer: between the target and every task)
//! probability = 0.1
//! at = "2s"
//! for = "4s"
//! ```
//!
//! Every draw comes from one ChaCha stream seeded by `seed`, two draws per fault in file order
//! (its time, then its choice of index, file and byte), so the same plan gives the same
//! schedule whatever the job does. A network fault's lost datagrams are drawn in each task's
//! process from a seed derived from the plan's and the task's.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cluster::{
    format_duration, parse_duration_in, ClusterError, DurationRange, TaskType, WORKERS_MAX_LIMIT,
};
use crate::sim::{Fault, NetSettings, Node, Scenario, SimConfig};

/// The latest a fault may be planned (and the longest pause).
pub const FAULT_TIME_MAX: Duration = Duration::from_secs(24 * 3600);
/// Size of the checkpoint filesystem a `disk_full` fault fills, unless the plan gives
/// `disk_size_mib`: room for a demo's checkpoints many times over; filling it costs that much
/// memory (a tmpfs) while the fault lasts.
pub const DISK_SIZE_MIB_DEFAULT: u64 = 256;
/// The largest `disk_size_mib`.
pub const DISK_SIZE_MIB_MAX: u64 = 16 * 1024;

/// Most faults in one plan.
pub const FAULTS_MAX: usize = 256;

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL the target task.
    Kill,
    /// SIGSTOP the target task, and SIGCONT it `for` later.
    Pause,
    /// SIGTERM the target task: a preemption notice.
    Term,
    /// Delete the newest checkpoint (or all of them) under the job's checkpoint directory.
    DeleteCheckpoint,
    /// Flip one bit of one shard file of the newest checkpoint.
    CorruptCheckpoint,
    /// Cut the target from its peer (or from every other task), `for` long.
    Partition,
    /// Lose datagrams between the target and its peer (or every other task) with a
    /// probability, `for` long.
    Loss,
    /// Fill the filesystem of the job's checkpoint directory (a tmpfs of `disk_size_mib`
    /// in the job's own mount namespace) so that every write fails with ENOSPC, `for` long.
    DiskFull,
    /// Ask the job's launcher for a number of workers or parameter servers (`cohort scale`):
    /// it starts tasks, or drains the highest-indexed running ones.
    Scale,
}

impl FaultKind {
    /// Every kind, as plans spell them.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Term,
        FaultKind::DeleteCheckpoint,
        FaultKind::CorruptCheckpoint,
        FaultKind::Partition,
        FaultKind::Loss,
        FaultKind::DiskFull,
        FaultKind::Scale,
    ];

    /// The name in a plan.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Term => "term",
            FaultKind::DeleteCheckpoint => "delete_checkpoint",
            FaultKind::CorruptCheckpoint => "corrupt_checkpoint",
            FaultKind::Partition => "partition",
            FaultKind::Loss => "loss",
            FaultKind::DiskFull => "disk_full",
            FaultKind::Scale => "scale",
        }
    }

    /// Whether the fault hits a task (rather than the checkpoint directory, or the job's size).
    pub fn hits_task(self) -> bool {
        !self.acts_on_checkpoints() && self != FaultKind::Scale
    }

    /// Whether the fault acts on the job's checkpoint directory.
    pub fn acts_on_checkpoints(self) -> bool {
        matches!(
            self,
            FaultKind::DeleteCheckpoint | FaultKind::CorruptCheckpoint | FaultKind::DiskFull
        )
    }

    /// Whether the fault acts on the network between tasks (their rules files).
    pub fn is_network(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::Loss)
    }

    /// Whether the fault lasts `for` a while and is then undone.
    pub fn lasts(self) -> bool {
        matches!(
            self,
            FaultKind::Pause | FaultKind::Partition | FaultKind::Loss | FaultKind::DiskFull
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The task a fault hits: one by index, or a role whose index the seed picks among the
/// tasks of that role running when the fault is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The role.
    pub role: TaskType,
    /// The index, when the plan names one.
    pub index: Option<u32>,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}:{i}", self.role),
            None => write!(f, "{}", self.role),
        }
    }
}

/// Which checkpoints a checkpoint fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The newest.
    Newest,
    /// Every one (delete only).
    All,
}

/// What a `scale` fault asks the launcher for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleTo {
    /// This many workers (`workers = N`).
    Workers(u32),
    /// This many parameter servers (`ps = N`).
    Ps(u32),
}

impl fmt::Display for ScaleTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaleTo::Workers(n) => write!(f, "workers={n}"),
            ScaleTo::Ps(n) => write!(f, "ps={n}"),
        }
    }
}

/// When a fault is due, after the job's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// At this time.
    Fixed(Duration),
    /// Uniformly in this range (both ends included), drawn from the seed.
    Range(Duration, Duration),
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Fixed(d) => f.write_str(&format_duration(*d)),
            At::Range(a, b) => write!(f, "{}..{}", format_duration(*a), format_duration(*b)),
        }
    }
}

/// What a fault's time counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum After {
    /// The start of the launch command.
    Start,
    /// The moment the runner has seen this many distinct checkpoints (1 or more) in the job's
    /// checkpoint directory: a fault that needs an older checkpoint to fall back on (a
    /// corrupted newest one) waits for the second rather than for a time that a slow machine
    /// may not reach.
    Checkpoint(u32),
}

/// The most checkpoints a fault can wait for (`after = "checkpoint:N"`).
pub const AFTER_CHECKPOINT_MAX: u32 = 1000;

impl After {
    /// The moment the runner first sees a checkpoint.
    pub const FIRST_CHECKPOINT: After = After::Checkpoint(1);

    /// How many checkpoints must have been seen before the fault's time starts counting
    /// (0 for the start).
    pub fn checkpoints(self) -> u32 {
        match self {
            After::Start => 0,
            After::Checkpoint(n) => n,
        }
    }
}

impl fmt::Display for After {
    /// The name in a plan.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            After::Start => f.write_str("start"),
            After::Checkpoint(1) => f.write_str("first_checkpoint"),
            After::Checkpoint(n) => write!(f, "checkpoint:{n}"),
        }
    }
}

/// One fault as the plan gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// What it does.
    pub kind: FaultKind,
    /// The task it hits (task kinds only).
    pub target: Option<Target>,
    /// The other end of a network fault (`None`: every other task).
    pub peer: Option<Target>,
    /// A loss's probability, from 0 to 1.
    pub probability: Option<f64>,
    /// When.
    pub at: At,
    /// What `at` counts from.
    pub after: After,
    /// How long a pause, partition or loss lasts.
    pub lasts: Option<Duration>,
    /// Which checkpoints (checkpoint kinds only).
    pub which: Which,
    /// What a scale asks for (scale only).
    pub scale: Option<ScaleTo>,
}

impl FaultSpec {
    /// What the fault acts on, as reports name it: its target, the checkpoints, or the
    /// size a scale asks for.
    pub fn subject(&self) -> String {
        match (self.target, self.scale) {
            (Some(target), _) => target.to_string(),
            (None, Some(scale)) => scale.to_string(),
            (None, None) => "checkpoints".to_string(),
        }
    }
}

/// A fault with its time and choice drawn: what the runner applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// Its position in the plan (0-based).
    pub index: usize,
    /// The fault.
    pub spec: FaultSpec,
    /// When it is due.
    pub at: Duration,
    /// The draw that picks an index (a role target), a shard file and a byte.
    pub pick: u64,
}

/// A parsed, checked plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The file it came from.
    pub source: PathBuf,
    /// The seed of every draw.
    pub seed: u64,
    /// The exit code the job must end with.
    pub expect_exit: i32,
    /// Size of the job's checkpoint filesystem under a `disk_full` fault, MiB.
    pub disk_size_mib: u64,
    /// The faults, in file order.
    pub faults: Vec<FaultSpec>,
}

/// Why a plan cannot be used; the message names the file and the key.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct PlanError {
    /// The plan file.
    pub file: String,
    /// What is wrong, starting with the key.
    #[source]
    pub problem: PlanProblem,
}

/// What is wrong with a plan ([`PlanError`] names its file); each message starts with the key.
#[derive(Debug, thiserror::Error)]
pub enum PlanProblem {
    /// The file could not be read.
    #[error("cannot read the plan: {0}")]
    Read(#[source] std::io::Error),
    /// The text is not TOML.
    #[error("not valid TOML{}: {message}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    NotToml {
        /// The line of the error, where the parser says.
        line: Option<usize>,
        /// The parser's message.
        message: String,
    },
    /// A top-level key a plan does not have.
    #[error(
        "{key}: unknown key (a plan has seed, expect_exit, disk_size_mib and [[fault]] tables)"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// No `seed`.
    #[error("seed: missing (a number, e.g. seed = 7)")]
    MissingSeed,
    /// A `seed` that is not a number from 0 up.
    #[error("seed: {value} is not a number from 0 up (e.g. seed = 7)")]
    BadSeed {
        /// The value given.
        value: toml::Value,
    },
    /// An `expect_exit` that is not an exit code.
    #[error("expect_exit: {value} is not an exit code (0 to 255)")]
    BadExpectExit {
        /// The value given.
        value: toml::Value,
    },
    /// A `disk_size_mib` out of range.
    #[error("disk_size_mib: {value} is not a size from 1 to {DISK_SIZE_MIB_MAX} MiB")]
    BadDiskSize {
        /// The value given.
        value: toml::Value,
    },
    /// `fault` is not an array of tables.
    #[error("fault: must be an array of tables ([[fault]] sections)")]
    FaultsNotArray,
    /// More than [`FAULTS_MAX`] faults.
    #[error("fault: {count} faults, at most {FAULTS_MAX}")]
    TooManyFaults {
        /// Faults in the plan.
        count: usize,
    },
    /// A fault is wrong.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// The simulator cannot run the plan ([`Plan::to_scenario`]).
    #[error(transparent)]
    NotSimulable(#[from] NotSimulable),
}

/// What is wrong with one `[[fault]]` of a plan; each message starts with `fault[i].key`.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The entry is not a table.
    #[error("fault[{index}]: must be a table ([[fault]])")]
    NotATable {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A key a fault does not have.
    #[error(
        "fault[{index}].{key}: unknown key (a fault has kind, target, peer, probability, at, \
         after, for, which, workers, ps)"
    )]
    UnknownKey {
        /// The fault's position in the plan.
        index: usize,
        /// The key.
        key: String,
    },
    /// A key that must be a string is not one.
    #[error("fault[{index}].{key}: {value} is not a string")]
    NotAString {
        /// The fault's position in the plan.
        index: usize,
        /// The key.
        key: &'static str,
        /// The value given.
        value: toml::Value,
    },
    /// No `kind`.
    #[error("fault[{index}].kind: missing")]
    MissingKind {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A `kind` that is not one.
    #[error("fault[{index}].kind: unknown kind {kind:?}; kinds: {}", kind_names())]
    UnknownKind {
        /// The fault's position in the plan.
        index: usize,
        /// The kind given.
        kind: String,
    },
    /// A fault on a task without a `target`.
    #[error("fault[{index}].target: missing ({TASK_EXAMPLES})")]
    MissingTarget {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A scale with a `target`.
    #[error(
        "fault[{index}].target: a scale asks the launcher for a number of tasks (workers = N \
         or ps = N), not for a task"
    )]
    TargetOnScale {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A checkpoint fault with a `target`.
    #[error("fault[{index}].target: {kind} acts on the checkpoint directory, not on a task")]
    TargetOnCheckpoints {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A `target` or `peer` whose role is not one.
    #[error("fault[{index}].{key}: {text:?} is not a task ({TASK_EXAMPLES}: {TASK_ROLES})")]
    NotATask {
        /// The fault's position in the plan.
        index: usize,
        /// `target` or `peer`.
        key: &'static str,
        /// The value given.
        text: String,
    },
    /// A `target` or `peer` whose index is not a number.
    #[error("fault[{index}].{key}: {text:?} has no valid index ({TASK_EXAMPLES}: {TASK_ROLES})")]
    BadTaskIndex {
        /// The fault's position in the plan.
        index: usize,
        /// `target` or `peer`.
        key: &'static str,
        /// The value given.
        text: String,
    },
    /// No `at`.
    #[error("fault[{index}].at: missing (e.g. \"6s\" or \"4s..9s\")")]
    MissingAt {
        /// The fault's position in the plan.
        index: usize,
    },
    /// An `at` or `for` that is not a duration in range (the message names the key).
    #[error(transparent)]
    Duration(#[from] ClusterError),
    /// An `at` range whose end is before its start.
    #[error("fault[{index}].at: {text:?} ends before it starts")]
    AtReversed {
        /// The fault's position in the plan.
        index: usize,
        /// The range given.
        text: String,
    },
    /// An `after` that is not one.
    #[error(
        "fault[{index}].after: {text:?} is not \"start\", \"first_checkpoint\" or \
         \"checkpoint:N\" with N from 1 to {AFTER_CHECKPOINT_MAX}"
    )]
    BadAfter {
        /// The fault's position in the plan.
        index: usize,
        /// The value given.
        text: String,
    },
    /// A fault that lasts without a `for`.
    #[error("fault[{index}].for: missing (how long the {kind} lasts, e.g. \"3s\")")]
    MissingFor {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A `for` on a fault that does not last.
    #[error(
        "fault[{index}].for: only a pause, partition, loss or disk_full lasts ({kind} does not)"
    )]
    ForNotLasting {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A `peer` on a fault that is not a network fault.
    #[error("fault[{index}].peer: only a partition or loss has a peer ({kind} does not)")]
    PeerNotNetwork {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A `peer` that is the target itself.
    #[error("fault[{index}].peer: {peer} is the target itself ({target}); name another task")]
    PeerIsTarget {
        /// The fault's position in the plan.
        index: usize,
        /// The peer.
        peer: Target,
        /// The target.
        target: Target,
    },
    /// A loss without a `probability`.
    #[error(
        "fault[{index}].probability: missing (each datagram's chance to be lost, from 0 to 1, \
         e.g. 0.1)"
    )]
    MissingProbability {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A `probability` that is not one.
    #[error("fault[{index}].probability: {value} is not a probability from 0 to 1")]
    BadProbability {
        /// The fault's position in the plan.
        index: usize,
        /// The value given.
        value: toml::Value,
    },
    /// A `probability` on a fault other than a loss.
    #[error("fault[{index}].probability: only a loss has a probability ({kind} does not)")]
    ProbabilityNotLoss {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A delete's `which` that is not one.
    #[error("fault[{index}].which: {which:?} is not \"newest\" or \"all\"")]
    BadWhich {
        /// The fault's position in the plan.
        index: usize,
        /// The value given.
        which: String,
    },
    /// A corrupt's `which` other than `newest`.
    #[error("fault[{index}].which: {which:?}: corrupt_checkpoint hits the newest checkpoint only")]
    CorruptNewestOnly {
        /// The fault's position in the plan.
        index: usize,
        /// The value given.
        which: String,
    },
    /// A `which` on a fault that chooses no checkpoint.
    #[error(
        "fault[{index}].which: only delete_checkpoint and corrupt_checkpoint choose a \
         checkpoint ({kind} does not)"
    )]
    WhichNotCheckpoint {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// `workers` or `ps` on a fault other than a scale.
    #[error("fault[{index}].{key}: only a scale asks for a number of tasks ({kind} does not)")]
    CountNotScale {
        /// The fault's position in the plan.
        index: usize,
        /// `workers` or `ps`.
        key: &'static str,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A `workers` or `ps` that is not a number of tasks.
    #[error(
        "fault[{index}].{key}: {value} is not a number of tasks from 1 to {WORKERS_MAX_LIMIT}"
    )]
    BadCount {
        /// The fault's position in the plan.
        index: usize,
        /// `workers` or `ps`.
        key: &'static str,
        /// The value given.
        value: toml::Value,
    },
    /// A scale with neither `workers` nor `ps`.
    #[error("fault[{index}].workers: missing (a scale asks for workers = N or ps = N)")]
    MissingCount {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A scale with both `workers` and `ps`.
    #[error(
        "fault[{index}].ps: a scale asks for workers or for servers, not both: give two faults"
    )]
    BothCounts {
        /// The fault's position in the plan.
        index: usize,
    },
}

/// Why the simulator cannot run a plan ([`Plan::to_scenario`]); each message starts with
/// `fault[i].key` and says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum NotSimulable {
    /// A fault counted from a checkpoint.
    #[error(
        "fault[{index}].after: the simulator cannot count from {after} (its checkpoints are not \
         at times the plan knows); give the time from the start"
    )]
    AfterCheckpoint {
        /// The fault's position in the plan.
        index: usize,
        /// What it counts from.
        after: After,
    },
    /// A loss.
    #[error(
        "fault[{index}].kind: the simulator cannot model loss between tasks for a while (its \
         network loses datagrams at one rate for the whole run); run this plan with \
         `cohort chaos run`"
    )]
    Loss {
        /// The fault's position in the plan.
        index: usize,
    },
    /// A partition between two given tasks.
    #[error(
        "fault[{index}].peer: the simulator cannot cut two tasks from each other only \
         ({peer}); it cuts a task off from every other: give no peer, or run this plan with \
         `cohort chaos run`"
    )]
    PartitionPeer {
        /// The fault's position in the plan.
        index: usize,
        /// The peer.
        peer: Target,
    },
    /// A scale to more workers than the simulated job has.
    #[error(
        "fault[{index}].workers: {asked} is more than the simulated job's {workers} workers \
         (the simulator adds none beyond them)"
    )]
    TooManyWorkers {
        /// The fault's position in the plan.
        index: usize,
        /// Workers asked for.
        asked: u32,
        /// Workers the simulated job has.
        workers: usize,
    },
    /// A fault that does not hit a task at a time (the checkpoint kinds).
    #[error(
        "fault[{index}].kind: the simulator cannot model {kind} at a time (its storage faults \
         hit a numbered save, not the files on disk); run this plan with `cohort chaos run`"
    )]
    NotTimed {
        /// The fault's position in the plan.
        index: usize,
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A fault on an evaluator.
    #[error("fault[{index}].target: the simulator has no evaluator ({target})")]
    Evaluator {
        /// The fault's position in the plan.
        index: usize,
        /// The target.
        target: Target,
    },
    /// A target beyond the simulated job's tasks of its role.
    #[error(
        "fault[{index}].target: {target} is not in the simulated job ({count} {} task(s), \
         index {task_index} out of range)",
        target.role
    )]
    TargetOutOfRange {
        /// The fault's position in the plan.
        index: usize,
        /// The target.
        target: Target,
        /// The simulated job's tasks of its role.
        count: u32,
        /// The target's index.
        task_index: u32,
    },
}

impl Plan {
    /// Reads and checks the plan in `path`.
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError {
            file: path.display().to_string(),
            problem: PlanProblem::Read(e),
        })?;
        Self::parse(path, &text)
    }

    /// Parses and checks `text`, the contents of `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, PlanError> {
        let err = |problem: PlanProblem| PlanError {
            file: path.display().to_string(),
            problem,
        };
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            err(PlanProblem::NotToml {
                line,
                message: e.message().trim().to_string(),
            })
        })?;
        for key in table.keys() {
            if !["seed", "expect_exit", "disk_size_mib", "fault"].contains(&key.as_str()) {
                return Err(err(PlanProblem::UnknownKey { key: key.clone() }));
            }
        }
        let seed = match table.get("seed") {
            None => return Err(err(PlanProblem::MissingSeed)),
            Some(toml::Value::Integer(n)) if *n >= 0 => *n as u64,
            Some(v) => return Err(err(PlanProblem::BadSeed { value: v.clone() })),
        };
        let expect_exit = match table.get("expect_exit") {
            None => 0,
            Some(toml::Value::Integer(n)) if (0..=255).contains(n) => *n as i32,
            Some(v) => return Err(err(PlanProblem::BadExpectExit { value: v.clone() })),
        };
        let disk_size_mib = match table.get("disk_size_mib") {
            None => DISK_SIZE_MIB_DEFAULT,
            Some(toml::Value::Integer(n)) if (1..=DISK_SIZE_MIB_MAX as i64).contains(n) => {
                *n as u64
            }
            Some(v) => return Err(err(PlanProblem::BadDiskSize { value: v.clone() })),
        };
        let faults = match table.get("fault") {
            None => Vec::new(),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_fault(i, item).map_err(|e| err(e.into())))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(err(PlanProblem::FaultsNotArray)),
        };
        if faults.len() > FAULTS_MAX {
            return Err(err(PlanProblem::TooManyFaults {
                count: faults.len(),
            }));
        }
        Ok(Plan {
            source: path.to_path_buf(),
            seed,
            expect_exit,
            disk_size_mib,
            faults,
        })
    }

    /// Whether some fault acts on checkpoints (the runner then needs the checkpoint
    /// directory).
    pub fn touches_checkpoints(&self) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind.acts_on_checkpoints() || f.after != After::Start)
    }

    /// The faults with their times and choices drawn from the seed: those counted from the
    /// start first, each group earliest first (faults due at the same time in file order).
    pub fn schedule(&self) -> Vec<Scheduled> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut out: Vec<Scheduled> = self
            .faults
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                // Two draws per fault whatever its kind, so that editing one fault leaves the
                // draws of the others as they were.
                let time_draw: u64 = rng.gen();
                let pick: u64 = rng.gen();
                let at = match spec.at {
                    At::Fixed(d) => d,
                    At::Range(lo, hi) => {
                        let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
                        Duration::from_millis(lo + time_draw % (hi - lo + 1))
                    }
                };
                Scheduled {
                    index,
                    spec: spec.clone(),
                    at,
                    pick,
                }
            })
            .collect();
        out.sort_by_key(|s| (s.spec.after, s.at, s.index));
        out
    }

    /// The simulator's scenario for this plan: kill, pause and term (a preemption notice)
    /// of the chief, a server or a worker, and a partition that cuts one of them off from
    /// every other (no `peer`), at the plan's times as simulated time, over a reliable
    /// network seeded with the plan's seed. A role target picks its index among the
    /// `config`'s tasks of that role. A scale becomes the simulator's drains and rejoins of
    /// workers (down to the count: the highest running leave; up: the lowest drained come
    /// back, within the simulated job's workers) or its servers joining and leaving. Faults
    /// the simulator cannot model are refused, named:
    /// checkpoint files, a partition between two given tasks (the simulator cuts a task off
    /// from all), and loss (the simulator's loss is the network's for the whole run).
    ///
    /// Longer than most functions here on purpose: one arm per fault of a plan, each what the
    /// simulator makes of it (or why it cannot), beside `parse_fault`'s.
    pub fn to_scenario(&self, config: &SimConfig) -> Result<Scenario, PlanError> {
        let err = |refusal: NotSimulable| PlanError {
            file: self.source.display().to_string(),
            problem: refusal.into(),
        };
        let mut faults = Vec::new();
        // The workers and servers a scale leaves running, as the launcher would.
        let mut workers: Vec<bool> = vec![true; config.num_workers as usize];
        let mut servers = config.num_ps;
        for s in self.schedule() {
            let index = s.index;
            if s.spec.after != After::Start {
                return Err(err(NotSimulable::AfterCheckpoint {
                    index,
                    after: s.spec.after,
                }));
            }
            if s.spec.kind == FaultKind::Loss {
                return Err(err(NotSimulable::Loss { index }));
            }
            if let (FaultKind::Partition, Some(peer)) = (s.spec.kind, s.spec.peer) {
                return Err(err(NotSimulable::PartitionPeer { index, peer }));
            }
            let at_ms = s.at.as_millis() as u64;
            match s.spec.scale {
                Some(ScaleTo::Workers(n)) => {
                    if n as usize > workers.len() {
                        return Err(err(NotSimulable::TooManyWorkers {
                            index,
                            asked: n,
                            workers: workers.len(),
                        }));
                    }
                    let running = workers.iter().filter(|r| **r).count() as u32;
                    // The highest running ones leave; the lowest drained ones come back.
                    let (mut leave, mut back) =
                        (running.saturating_sub(n), n.saturating_sub(running));
                    for (index, on) in workers.iter_mut().enumerate().rev() {
                        if leave > 0 && *on {
                            leave -= 1;
                            *on = false;
                            faults.push(Fault::Drain {
                                at_ms,
                                worker: index as u32,
                            });
                        }
                    }
                    for (index, on) in workers.iter_mut().enumerate() {
                        if back > 0 && !*on {
                            back -= 1;
                            *on = true;
                            faults.push(Fault::Rejoin {
                                at_ms,
                                worker: index as u32,
                            });
                        }
                    }
                    continue;
                }
                Some(ScaleTo::Ps(n)) => {
                    for _ in n..servers {
                        faults.push(Fault::PsLeave { at_ms });
                    }
                    for _ in servers..n {
                        faults.push(Fault::PsJoin { at_ms });
                    }
                    servers = n;
                    continue;
                }
                None => {}
            }
            let target = match s.spec.target {
                Some(t) if s.spec.kind.hits_task() => t,
                _ => {
                    return Err(err(NotSimulable::NotTimed {
                        index,
                        kind: s.spec.kind,
                    }))
                }
            };
            let count = match target.role {
                TaskType::Chief => 1,
                TaskType::Ps => config.num_ps,
                TaskType::Worker => config.num_workers,
                TaskType::Evaluator => return Err(err(NotSimulable::Evaluator { index, target })),
            };
            let task_index = match target.index {
                Some(i) if i < count => i,
                Some(i) => {
                    return Err(err(NotSimulable::TargetOutOfRange {
                        index,
                        target,
                        count,
                        task_index: i,
                    }))
                }
                None => (s.pick % u64::from(count)) as u32,
            };
            let node = match target.role {
                TaskType::Chief => Node::Chief,
                TaskType::Ps => Node::Ps(task_index),
                _ => Node::Worker(task_index),
            };
            let for_ms = s.spec.lasts.unwrap_or_default().as_millis() as u64;
            faults.push(match s.spec.kind {
                FaultKind::Kill => Fault::Kill { at_ms, node },
                FaultKind::Term => Fault::Preempt { at_ms, node },
                FaultKind::Partition => Fault::Partition {
                    at_ms,
                    node,
                    for_ms,
                    one_way: false,
                },
                _ => Fault::Pause {
                    at_ms,
                    node,
                    for_ms,
                },
            });
        }
        Ok(Scenario {
            seed: self.seed,
            net: NetSettings::reliable(),
            faults,
        })
    }
}

/// Longer than most functions here on purpose: one arm per fault kind of a plan, each its
/// fields and their checks, so that the plan's format reads in one place.
fn parse_fault(index: usize, item: &toml::Value) -> Result<FaultSpec, FaultError> {
    let table = item.as_table().ok_or(FaultError::NotATable { index })?;
    for k in table.keys() {
        if ![
            "kind",
            "target",
            "peer",
            "probability",
            "at",
            "after",
            "for",
            "which",
            "workers",
            "ps",
        ]
        .contains(&k.as_str())
        {
            return Err(FaultError::UnknownKey {
                index,
                key: k.clone(),
            });
        }
    }
    let string = |key: &'static str| string_key(table, index, key);
    let kind_text = string("kind")?.ok_or(FaultError::MissingKind { index })?;
    let kind = FaultKind::ALL
        .into_iter()
        .find(|k| k.as_str() == kind_text)
        .ok_or_else(|| FaultError::UnknownKind {
            index,
            kind: kind_text.to_string(),
        })?;
    let target = match (string("target")?, kind.hits_task()) {
        (Some(t), true) => Some(parse_target(index, "target", t)?),
        (None, true) => return Err(FaultError::MissingTarget { index }),
        (Some(_), false) if kind == FaultKind::Scale => {
            return Err(FaultError::TargetOnScale { index })
        }
        (Some(_), false) => return Err(FaultError::TargetOnCheckpoints { index, kind }),
        (None, false) => None,
    };
    let scale = parse_scale(table, index, kind)?;
    let at_text = string("at")?.ok_or(FaultError::MissingAt { index })?;
    let at_range = DurationRange::new(Duration::ZERO, FAULT_TIME_MAX);
    let duration =
        |text: &str| parse_duration_in(&format!("fault[{index}].at"), text.trim(), at_range);
    let at = match at_text.split_once("..") {
        Some((lo, hi)) => {
            let (lo, hi) = (duration(lo)?, duration(hi)?);
            if lo > hi {
                return Err(FaultError::AtReversed {
                    index,
                    text: at_text.to_string(),
                });
            }
            At::Range(lo, hi)
        }
        None => At::Fixed(duration(at_text)?),
    };
    let after = match string("after")? {
        None | Some("start") => After::Start,
        Some("first_checkpoint") => After::FIRST_CHECKPOINT,
        Some(other) => match other.strip_prefix("checkpoint:").map(str::parse::<u32>) {
            Some(Ok(n)) if (1..=AFTER_CHECKPOINT_MAX).contains(&n) => After::Checkpoint(n),
            _ => {
                return Err(FaultError::BadAfter {
                    index,
                    text: other.to_string(),
                })
            }
        },
    };
    let lasts = match (string("for")?, kind.lasts()) {
        (Some(text), true) => Some(parse_duration_in(
            &format!("fault[{index}].for"),
            text,
            DurationRange::new(Duration::from_millis(1), FAULT_TIME_MAX),
        )?),
        (None, true) => return Err(FaultError::MissingFor { index, kind }),
        (Some(_), false) => return Err(FaultError::ForNotLasting { index, kind }),
        (None, false) => None,
    };
    let peer = match (string("peer")?, kind.is_network()) {
        (Some(text), true) => Some(parse_target(index, "peer", text)?),
        (Some(_), false) => return Err(FaultError::PeerNotNetwork { index, kind }),
        (None, _) => None,
    };
    if let (Some(t), Some(p)) = (target, peer) {
        if t.role == p.role
            && (t.index.is_some() && t.index == p.index || t.role == TaskType::Chief)
        {
            return Err(FaultError::PeerIsTarget {
                index,
                peer: p,
                target: t,
            });
        }
    }
    let probability = match (table.get("probability"), kind) {
        (None, FaultKind::Loss) => return Err(FaultError::MissingProbability { index }),
        (None, _) => None,
        (Some(v), FaultKind::Loss) => {
            let p = match v {
                toml::Value::Float(f) => Some(*f),
                toml::Value::Integer(n) => Some(*n as f64),
                _ => None,
            };
            match p {
                Some(p) if (0.0..=1.0).contains(&p) => Some(p),
                _ => {
                    return Err(FaultError::BadProbability {
                        index,
                        value: v.clone(),
                    })
                }
            }
        }
        (Some(_), _) => return Err(FaultError::ProbabilityNotLoss { index, kind }),
    };
    let which = match (string("which")?, kind) {
        (None, _) => Which::Newest,
        (Some("newest"), FaultKind::DeleteCheckpoint | FaultKind::CorruptCheckpoint) => {
            Which::Newest
        }
        (Some("all"), FaultKind::DeleteCheckpoint) => Which::All,
        (Some(w), FaultKind::DeleteCheckpoint) => {
            return Err(FaultError::BadWhich {
                index,
                which: w.to_string(),
            })
        }
        (Some(w), FaultKind::CorruptCheckpoint) => {
            return Err(FaultError::CorruptNewestOnly {
                index,
                which: w.to_string(),
            })
        }
        (Some(_), _) => return Err(FaultError::WhichNotCheckpoint { index, kind }),
    };
    Ok(FaultSpec {
        kind,
        target,
        peer,
        probability,
        at,
        after,
        lasts,
        which,
        scale,
    })
}

/// A scale fault's `workers = N` or `ps = N` (exactly one, from 1 up); refused on any other
/// kind.
fn parse_scale(
    table: &toml::Table,
    index: usize,
    kind: FaultKind,
) -> Result<Option<ScaleTo>, FaultError> {
    let count = |key: &'static str| -> Result<Option<u32>, FaultError> {
        match table.get(key) {
            None => Ok(None),
            Some(_) if kind != FaultKind::Scale => {
                Err(FaultError::CountNotScale { index, key, kind })
            }
            Some(toml::Value::Integer(n)) if (1..=i64::from(WORKERS_MAX_LIMIT)).contains(n) => {
                Ok(Some(*n as u32))
            }
            Some(v) => Err(FaultError::BadCount {
                index,
                key,
                value: v.clone(),
            }),
        }
    };
    match (count("workers")?, count("ps")?) {
        (Some(n), None) => Ok(Some(ScaleTo::Workers(n))),
        (None, Some(n)) => Ok(Some(ScaleTo::Ps(n))),
        (None, None) if kind == FaultKind::Scale => Err(FaultError::MissingCount { index }),
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(FaultError::BothCounts { index }),
    }
}

/// The string at `key` in the table of fault `index`, if any.
fn string_key<'a>(
    table: &'a toml::Table,
    index: usize,
    key: &'static str,
) -> Result<Option<&'a str>, FaultError> {
    match table.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
        Some(v) => Err(FaultError::NotAString {
            index,
            key,
            value: v.clone(),
        }),
    }
}

/// `chief`, `ps:0`, `worker/1`, or a role alone, the `key` (`target` or `peer`) of fault
/// `index`.
fn parse_target(index: usize, key: &'static str, text: &str) -> Result<Target, FaultError> {
    let (role_text, index_text) = match text.split_once([':', '/']) {
        Some((r, i)) => (r, Some(i)),
        None => (text, None),
    };
    let role: TaskType = role_text.parse().map_err(|()| FaultError::NotATask {
        index,
        key,
        text: text.to_string(),
    })?;
    let task_index = match index_text {
        None => None,
        Some(i) => Some(i.parse::<u32>().map_err(|_| FaultError::BadTaskIndex {
            index,
            key,
            text: text.to_string(),
        })?),
    };
    Ok(Target {
        role,
        index: task_index,
    })
}

/// Every fault kind's name, for the message of an unknown one.
fn kind_names() -> String {
    let kinds: Vec<&str> = FaultKind::ALL.iter().map(|k| k.as_str()).collect();
    kinds.join(", ")
}

/// How a plan names a task, for the messages of a missing or bad one.
const TASK_EXAMPLES: &str = "a task such as \"worker:1\", \"ps:0\", \"chief\", or a role";
/// The roles a plan may name.
const TASK_ROLES: &str = "chief, ps, worker, evaluator";

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Plan, PlanError> {
        Plan::parse(Path::new("plan.toml"), text)
    }

    #[test]
    fn the_shipped_plans_parse_and_the_simulator_takes_the_start_timed_one() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/chaos");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("examples/chaos") {
            let path = entry.expect("entry").path();
            let plan = Plan::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!plan.faults.is_empty(), "{}", path.display());
            assert_eq!(plan.schedule().len(), plan.faults.len());
            names.push(path.file_name().unwrap().to_string_lossy().to_string());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "delete-checkpoint-then-kill-ps.toml",
                "disk-full.toml",
                "kill-worker-and-ps.toml",
                "mwms-kill-and-preempt.toml",
                "mwms-kill-two.toml",
                "mwms-scale-and-kill.toml",
                "partition-worker-from-chief.toml",
                "term-ps-pause-worker.toml"
            ]
        );
        let plan = Plan::load(&dir.join("term-ps-pause-worker.toml")).unwrap();
        let scenario = plan.to_scenario(&SimConfig::default()).unwrap();
        assert_eq!(scenario.faults.len(), 2);
        assert!(matches!(
            scenario.faults[0],
            Fault::Preempt {
                node: Node::Ps(1),
                ..
            }
        ));
        assert!(matches!(
            scenario.faults[1],
            Fault::Pause { for_ms: 2000, .. }
        ));
    }

    #[test]
    fn draws_are_seeded_and_within_their_ranges() {
        let text = "seed = 9\n[[fault]]\nkind = \"kill\"\ntarget = \"worker\"\nat = \"4s..9s\"\n\
                    [[fault]]\nkind = \"term\"\ntarget = \"ps:0\"\nat = \"1s\"\n";
        let a = parse(text).unwrap().schedule();
        let b = parse(text).unwrap().schedule();
        assert_eq!(a, b);
        // Earliest first.
        assert_eq!(a[0].spec.kind, FaultKind::Term);
        assert!(a[1].at >= Duration::from_secs(4) && a[1].at <= Duration::from_secs(9));
        let other = parse(&text.replace("seed = 9", "seed = 10"))
            .unwrap()
            .schedule();
        assert_ne!(a[1].pick, other[1].pick);
    }

    #[test]
    fn faults_counted_from_a_later_checkpoint_come_after_those_from_an_earlier_one() {
        let text = "seed = 3\n\
                    [[fault]]\nkind = \"corrupt_checkpoint\"\nat = \"1s\"\nafter = \"checkpoint:2\"\n\
                    [[fault]]\nkind = \"kill\"\ntarget = \"ps:0\"\nat = \"5s\"\nafter = \"first_checkpoint\"\n\
                    [[fault]]\nkind = \"kill\"\ntarget = \"worker:0\"\nat = \"9s\"\n";
        let plan = parse(text).unwrap();
        assert!(plan.touches_checkpoints());
        let order: Vec<After> = plan.schedule().iter().map(|s| s.spec.after).collect();
        assert_eq!(
            order,
            [After::Start, After::FIRST_CHECKPOINT, After::Checkpoint(2)]
        );
        assert_eq!(After::Checkpoint(2).to_string(), "checkpoint:2");
        assert_eq!(After::FIRST_CHECKPOINT.to_string(), "first_checkpoint");
        let err = plan.to_scenario(&SimConfig::default()).unwrap_err();
        assert!(err.to_string().contains("cannot count from"), "{err}");
    }

    #[test]
    fn bad_plans_are_refused_naming_the_file_and_the_key() {
        let cases = [
            ("[[fault]]\nkind = \"kill\"\n", "seed: missing"),
            ("seed = \"x\"\n", "seed:"),
            ("seed = 1\nspeed = 2\n", "speed: unknown key"),
            ("seed = 1\nexpect_exit = 300\n", "expect_exit:"),
            (
                "seed = 1\n[[fault]]\nkind = \"explode\"\ntarget = \"chief\"\nat = \"1s\"\n",
                "fault[0].kind: unknown kind \"explode\"",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"partition\"\ntarget = \"chief\"\nat = \"1s\"\n",
                "fault[0].for: missing (how long the partition lasts",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"loss\"\ntarget = \"ps:0\"\nat = \"1s\"\nfor = \"1s\"\n",
                "fault[0].probability: missing",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"loss\"\ntarget = \"ps:0\"\nat = \"1s\"\nfor = \"1s\"\nprobability = 1.5\n",
                "fault[0].probability: 1.5 is not a probability",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"ps:0\"\nat = \"1s\"\nprobability = 0.5\n",
                "fault[0].probability: only a loss",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"ps:0\"\npeer = \"chief\"\nat = \"1s\"\n",
                "fault[0].peer: only a partition or loss",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"partition\"\ntarget = \"worker:1\"\npeer = \"worker:1\"\nat = \"1s\"\nfor = \"1s\"\n",
                "fault[0].peer: worker:1 is the target itself",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"partition\"\ntarget = \"worker:1\"\npeer = \"gpu\"\nat = \"1s\"\nfor = \"1s\"\n",
                "fault[0].peer: \"gpu\" is not a task",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"gpu:1\"\nat = \"1s\"\n",
                "fault[0].target: \"gpu:1\" is not a task",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"worker:x\"\nat = \"1s\"\n",
                "fault[0].target",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"soon\"\n",
                "fault[0].at",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"9s..2s\"\n",
                "fault[0].at: \"9s..2s\" ends before it starts",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"pause\"\ntarget = \"chief\"\nat = \"1s\"\n",
                "fault[0].for: missing",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"1s\"\nfor = \"1s\"\n",
                "fault[0].for: only a pause, partition, loss or disk_full lasts",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"delete_checkpoint\"\ntarget = \"chief\"\nat = \"1s\"\n",
                "fault[0].target: delete_checkpoint acts on the checkpoint directory",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\nat = \"1s\"\n",
                "fault[0].target: missing",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"1s\"\nafter = \"lunch\"\n",
                "fault[0].after",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"1s\"\nafter = \"checkpoint:0\"\n",
                "fault[0].after: \"checkpoint:0\" is not",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"1s\"\nafter = \"checkpoint:two\"\n",
                "fault[0].after: \"checkpoint:two\" is not",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"disk_full\"\nat = \"1s\"\n",
                "fault[0].for: missing",
            ),
            (
                "seed = 1\ndisk_size_mib = 0\n[[fault]]\nkind = \"disk_full\"\nat = \"1s\"\nfor = \"2s\"\n",
                "disk_size_mib: 0 is not a size",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"disk_full\"\ntarget = \"ps:0\"\nat = \"1s\"\nfor = \"2s\"\n",
                "fault[0].target: disk_full acts on the checkpoint directory",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"scale\"\nat = \"1s\"\n",
                "fault[0].workers: missing (a scale asks for workers = N or ps = N)",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"scale\"\nworkers = 2\nps = 2\nat = \"1s\"\n",
                "fault[0].ps: a scale asks for workers or for servers, not both",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"scale\"\nworkers = 0\nat = \"1s\"\n",
                "fault[0].workers: 0 is not a number of tasks from 1 to",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"scale\"\ntarget = \"worker:1\"\nworkers = 2\nat = \"1s\"\n",
                "fault[0].target: a scale asks the launcher for a number of tasks",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"worker:1\"\nworkers = 2\nat = \"1s\"\n",
                "fault[0].workers: only a scale asks for a number of tasks (kill does not)",
            ),
            ("seed = 1\n[[fault]\n", "not valid TOML"),
        ];
        for (text, expected) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.starts_with("plan.toml: "), "{err}");
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn the_simulator_refuses_what_it_cannot_model() {
        let config = SimConfig::default();
        let refused = [
            (
                "seed = 1\n[[fault]]\nkind = \"corrupt_checkpoint\"\nat = \"1s\"\n",
                "cannot model corrupt_checkpoint",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"ps:9\"\nat = \"1s\"\n",
                "ps:9 is not in the simulated job",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"ps\"\nat = \"1s\"\nafter = \"first_checkpoint\"\n",
                "fault[0].after",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"loss\"\ntarget = \"ps:0\"\nprobability = 0.2\nat = \"1s\"\nfor = \"2s\"\n",
                "fault[0].kind: the simulator cannot model loss",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"partition\"\ntarget = \"worker:0\"\npeer = \"chief\"\nat = \"1s\"\nfor = \"2s\"\n",
                "fault[0].peer: the simulator cannot cut two tasks from each other only (chief)",
            ),
            (
                "seed = 1\n[[fault]]\nkind = \"scale\"\nworkers = 5\nat = \"1s\"\n",
                "fault[0].workers: 5 is more than the simulated job's 3 workers",
            ),
        ];
        for (text, expected) in refused {
            let err = parse(text).unwrap().to_scenario(&config).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
        // Scales are the simulator's drains and rejoins (the highest running workers leave,
        // the lowest drained come back) and its servers leaving and joining.
        let plan = parse(
            "seed = 4\n\
             [[fault]]\nkind = \"scale\"\nworkers = 1\nat = \"1s\"\n\
             [[fault]]\nkind = \"scale\"\nworkers = 2\nat = \"2s\"\n\
             [[fault]]\nkind = \"scale\"\nps = 1\nat = \"3s\"\n\
             [[fault]]\nkind = \"scale\"\nps = 3\nat = \"4s\"\n",
        )
        .unwrap();
        assert_eq!(
            plan.to_scenario(&config).unwrap().faults,
            vec![
                Fault::Drain {
                    at_ms: 1000,
                    worker: 2
                },
                Fault::Drain {
                    at_ms: 1000,
                    worker: 1
                },
                Fault::Rejoin {
                    at_ms: 2000,
                    worker: 1
                },
                Fault::PsLeave { at_ms: 3000 },
                Fault::PsJoin { at_ms: 4000 },
                Fault::PsJoin { at_ms: 4000 },
            ]
        );
        assert!(!plan.touches_checkpoints());
        // A task cut off from every other is the simulator's partition.
        let plan = parse(
            "seed = 4\n[[fault]]\nkind = \"partition\"\ntarget = \"worker:1\"\nat = \"2s\"\nfor = \"3s\"\n",
        )
        .unwrap();
        assert_eq!(
            plan.to_scenario(&config).unwrap().faults,
            vec![Fault::Partition {
                at_ms: 2000,
                node: Node::Worker(1),
                for_ms: 3000,
                one_way: false
            }]
        );
    }
}
