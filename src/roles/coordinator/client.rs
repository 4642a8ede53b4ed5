//! `ClusterCoordinator`: TensorFlow's `tf.distribute.coordinator.ClusterCoordinator`, as the
//! chief's training loop sees it. Its methods block the calling thread (the chief's program
//! thread, never the node's runtime) and talk to the coordinator actor.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use cohort_actors::{Gateway, PeerAddr};
use cohort_transport::NodeId;
use tokio::runtime::Handle;

use super::actor::{
    AbandonCut, Configure, CoordinatorActor, CreateShards, Fetch, Join, MarkCut, ReadCut, Schedule,
    ServerTopology, SetLearningRate, Start, Status, Topology,
};
pub use super::machine::SAVE_WAIT_MAX;
use super::machine::{CheckpointBuildError, ConfigureError, CreateError, CutReadError};
use super::machine::{ClosureFailure, ClosureId, CutReading, Ledger, ScheduleError, StartFailure};
use crate::checkpoint::{
    CheckpointManager, ListError, PolicyError, SaveError, WarmStart, WarmStartError,
};
use crate::layout::{Dtype, Layout};
use crate::nn::{Initializer, NnError};
use crate::roles::protocol::PsError;
use crate::roles::protocol::{
    f32_blob, f32_to_bytes, AssignVariable, InitSpec, LearningRate, PsRefusal, PsStats,
    PsStatsReply, PsUnavailable, SetupWorker, PS_ACTOR,
};
use crate::roles::ps_client::PsClient;
use crate::roles::step::{decode, encode, DatasetHandle, Step, ValueCodecError};
use crate::roles::step::{PsFailure, StepError};
use crate::variable::{PartitionError, Partitioner, PsPlacer};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A variable to create on the parameter servers.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSpec {
    /// Its name.
    pub name: String,
    /// Its full shape.
    pub shape: Vec<usize>,
    /// How it starts.
    pub init: Initializer,
    /// How to split it over parameter servers (None: whole, round-robin).
    pub partitioner: Option<Partitioner>,
    /// Its whole initial value, row-major, in place of `init` (a warm start still wins).
    pub values: Option<Arc<[f32]>>,
}

impl VariableSpec {
    /// A variable of zeros.
    pub fn zeros(name: impl Into<String>, shape: Vec<usize>) -> Self {
        Self::new(name, shape, Initializer::Zeros)
    }

    /// A variable drawn from `init`.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, init: Initializer) -> Self {
        Self {
            name: name.into(),
            shape,
            init,
            partitioner: None,
            values: None,
        }
    }

    /// A variable starting from `values` (its whole value, row-major: as many as `shape`
    /// holds, which `create_variable` checks).
    pub fn from_values(name: impl Into<String>, shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self {
            values: Some(values.into()),
            ..Self::zeros(name, shape)
        }
    }

    /// Splits the variable over parameter servers with `partitioner`.
    pub fn partitioned(mut self, partitioner: Partitioner) -> Self {
        self.partitioner = Some(partitioner);
        self
    }
}

/// A scheduled closure's future value (TensorFlow's `RemoteValue`): an `R` once the closure
/// has run ([`ClusterCoordinator::fetch`]). A closure scheduled by name with its own bytes
/// ([`ClusterCoordinator::schedule_encoded`]) is a `RemoteValue<Encoded>`, read with
/// [`ClusterCoordinator::fetch_encoded`].
pub struct RemoteValue<R> {
    id: ClosureId,
    value: PhantomData<fn() -> R>,
}

/// The value type of a closure scheduled with its own bytes: its value is bytes the program
/// decodes itself ([`ClusterCoordinator::fetch_encoded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoded {}

impl<R> RemoteValue<R> {
    fn new(id: ClosureId) -> Self {
        Self {
            id,
            value: PhantomData,
        }
    }

    /// The closure's id in the ledger.
    pub fn closure_id(&self) -> ClosureId {
        self.id
    }
}

impl<R> Clone for RemoteValue<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for RemoteValue<R> {}

impl<R> PartialEq for RemoteValue<R> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl<R> Eq for RemoteValue<R> {}

impl<R> std::hash::Hash for RemoteValue<R> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl<R> std::fmt::Debug for RemoteValue<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteValue({})", self.id.0)
    }
}

/// Why a coordinator call failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// A closure failed (its own error), was cancelled, or could not run; raised by `join` and
    /// `fetch`.
    #[error(transparent)]
    Closure(#[from] ClosureFailure),
    /// The schedule queue is full.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A variable could not be placed.
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// A variable spec is invalid (e.g. a duplicate name).
    #[error("variable {name:?}: {problem}")]
    Variable {
        /// The variable.
        name: String,
        /// What is wrong.
        problem: VariableProblem,
    },
    /// The program schedules a step it does not register: no worker could run it.
    #[error("no step {step:?} is registered in this program (registered: {registered})")]
    UnknownStep {
        /// The step scheduled.
        step: String,
        /// The steps that are registered, comma-separated.
        registered: String,
    },
    /// A step's argument could not be encoded.
    #[error("step {step:?}: its argument does not encode: {reason}")]
    Arguments {
        /// The step.
        step: String,
        /// What the encoder found.
        reason: ValueCodecError,
    },
    /// A closure's value does not decode as the type its step declares (the workers run
    /// another build of the program than the chief).
    #[error("closure {closure}: its value does not decode: {reason}")]
    Value {
        /// The closure.
        closure: u64,
        /// What the decoder found.
        reason: ValueCodecError,
    },
    /// A parameter server refused a read of the chief's, or could not be reached, past the
    /// recoveries waited for ([`ClusterCoordinator::read_variable`] and the like).
    #[error("parameter server: {0}")]
    ParameterServer(#[source] StepError),
    /// Setting the workers up again failed (a worker refused its setup).
    #[error(transparent)]
    Configure(#[from] ConfigureError),
    /// A variable's creation was refused, or a server did not create its shard.
    #[error("parameter server: {0}")]
    CreateVariable(#[from] CreateError),
    /// A checkpoint could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The chief's start (probing the servers, restoring a checkpoint) failed.
    #[error("checkpoint: {0}")]
    Start(StartFailure),
    /// No consistent cut of the servers could be read for a checkpoint.
    #[error("checkpoint: {0}")]
    CutRead(#[from] CutReadError),
    /// A parameter server was lost while the chief's start restored the servers from the
    /// checkpoint: they are in no known state. Not the program's fault: a restarted chief
    /// probes them and restores again (the chief exits 172, restart me).
    #[error("parameter server ps/{ps} was lost while the chief's start restored it: {reason}")]
    ServerLostAtStart {
        /// The server.
        ps: u32,
        /// What the restore's call to it got.
        reason: String,
    },
    /// The warm start cannot be used (its file, its name map, or a variable it does not fit).
    #[error(transparent)]
    WarmStart(Box<WarmStartError>),
    /// The coordinator actor is gone (the node is shutting down).
    #[error("coordinator stopped")]
    Stopped,
    /// A learning rate that is not finite and non-negative
    /// ([`ClusterCoordinator::set_learning_rate`]).
    #[error("learning rate {0} refused: it must be finite and non-negative")]
    LearningRate(f32),
    /// Waited past the bound.
    #[error("{what} did not finish within {bound:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The bound.
        bound: Duration,
    },
    /// A variable's initial value could not be drawn from its initializer.
    #[error("variable {name:?}: drawing its initial value: {source}")]
    InitialValue {
        /// The variable.
        name: String,
        /// What the initializer hit (boxed: it is large).
        source: Box<NnError>,
    },
    /// The model whose variables are created on the servers could not be built
    /// ([`crate::program::ServerModel::create_variables`]).
    #[error("building the model: {0}")]
    Model(#[source] candle_core::Error),
    /// Any other failure of the chief's program: its own error, whose type the library does
    /// not know ([`CoordinatorError::other`]).
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// What is wrong with a variable the program creates, reads or assigns
/// ([`CoordinatorError::Variable`]).
#[derive(Debug, thiserror::Error)]
pub enum VariableProblem {
    /// Its initial values do not fill its shape.
    #[error("{given} initial values for shape {shape:?} ({expected} values)")]
    InitialValues {
        /// Values given.
        given: usize,
        /// The shape.
        shape: Vec<usize>,
        /// Values the shape holds.
        expected: usize,
    },
    /// A shape whose element count does not fit in a machine word.
    #[error("shape {shape:?} holds more elements than a machine word counts")]
    ShapeTooLarge {
        /// The shape.
        shape: Vec<usize>,
    },
    /// A variable of that name exists already.
    #[error("created twice")]
    CreatedTwice,
    /// An assignment of another length than the variable's.
    #[error("it holds {expected} values (shape {shape:?}); the assignment gives {given}")]
    AssignmentLength {
        /// Values the variable holds.
        expected: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// Values the assignment gives.
        given: usize,
    },
    /// No variable of that name was created.
    #[error("no such variable")]
    Unknown,
    /// A batch-normalization statistic, which the parameter servers cannot keep.
    #[error(
        "batch-normalization statistics cannot be kept on the parameter servers (they apply \
         gradients, and a statistic is not trained); use layer normalization, or train this \
         model under Mirrored or MultiWorkerMirrored"
    )]
    Statistic,
    /// Not f32, the only type the parameter servers hold.
    #[error("is {0:?}; the parameter servers hold f32 variables")]
    NotF32(candle_core::DType),
    /// Its initial value could not be read from the model.
    #[error("reading its initial value: {0}")]
    InitialValue(#[source] Box<candle_core::Error>),
}

impl CoordinatorError {
    /// A copy of this error where it asks for the chief's restart rather than the job's end:
    /// a parameter server lost past recovery ([`ClosureFailure::PsLost`]) or lost while the
    /// start restored the servers ([`CoordinatorError::ServerLostAtStart`]). Neither is the
    /// program's fault: a restarted chief probes the servers and resumes from the last
    /// checkpoint, so the chief exits [`crate::process::PS_LOST_EXIT_CODE`] (restart me).
    /// `None` for every other error.
    pub fn restart_wanted(&self) -> Option<CoordinatorError> {
        match self {
            CoordinatorError::Closure(failure @ ClosureFailure::PsLost { .. }) => {
                Some(CoordinatorError::Closure(failure.clone()))
            }
            CoordinatorError::ServerLostAtStart { ps, reason } => {
                Some(CoordinatorError::ServerLostAtStart {
                    ps: *ps,
                    reason: reason.clone(),
                })
            }
            _ => None,
        }
    }

    /// A failure of the chief's program itself ([`CoordinatorError::Other`]): `error` is kept
    /// as it is (a caller may downcast it); a message (`&str`, `String`) is taken too.
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        CoordinatorError::Other(error.into())
    }
}

impl From<WarmStartError> for CoordinatorError {
    fn from(e: WarmStartError) -> Self {
        CoordinatorError::WarmStart(Box::new(e))
    }
}

/// A checkpoint manager the program makes with a policy it cannot run
/// ([`CheckpointManager::new`]): `?` in the chief's program.
impl From<PolicyError> for CoordinatorError {
    fn from(e: PolicyError) -> Self {
        CoordinatorError::Checkpoint(CheckpointError::Policy(e))
    }
}

/// Why a checkpoint was not saved or restored ([`CoordinatorError::Checkpoint`]). A save that
/// fails never becomes the cut: recoveries go on restoring the previous one.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The cut read does not make a checkpoint.
    #[error(transparent)]
    Build(#[from] CheckpointBuildError),
    /// A checkpoint manager could not be made (its policy).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Writing it, or reading it back whole (CKPT-1), failed.
    #[error(transparent)]
    Save(#[from] SaveError),
    /// The thread that writes a background save could not be started.
    #[error("cannot start the writer: {0}")]
    WriterSpawn(#[source] std::io::Error),
    /// The thread that writes a background save panicked.
    #[error("the checkpoint writer panicked")]
    WriterPanicked,
    /// The checkpoint root could not be listed to restore from it.
    #[error(transparent)]
    List(#[from] ListError),
}

/// The chief's handle on the cluster.
pub struct ClusterCoordinator {
    actor: Addr<CoordinatorActor>,
    runtime: Handle,
    gateway: Gateway,
    /// The cluster spec's parameter servers (the job's servers now come from the actor:
    /// [`Self::topology`]).
    servers: Vec<(NodeId, PeerAddr)>,
    num_workers: u32,
    placer: PsPlacer,
    /// The servers `placer` places over (indexes).
    placed_over: Vec<u32>,
    layouts: Vec<Layout>,
    datasets: Vec<(String, u64)>,
    wait_max: Duration,
    /// Where variables start from when created (`None`: not read from the configuration yet;
    /// `Some(None)`: no warm start).
    warm_start: Option<Option<Arc<WarmStart>>>,
    /// The steps the program registers (`None`: not known, anything may be scheduled).
    registered_steps: Option<BTreeSet<String>>,
    /// Set once [`Self::restore_checkpoint`] restored the servers from a checkpoint.
    resumed: std::sync::atomic::AtomicBool,
    /// The program's own state that checkpoint recorded ([`Self::restored_program_state`]).
    program_state: std::sync::Mutex<Option<serde_json::Value>>,
}

/// Where a checkpoint's manifest keeps the program's own state at the cut
/// ([`ClusterCoordinator::save_checkpoint_with`]).
pub const PROGRAM_STATE_KEY: &str = "program_state";

impl ClusterCoordinator {
    pub(crate) fn new(
        actor: Addr<CoordinatorActor>,
        runtime: Handle,
        gateway: Gateway,
        servers: Vec<(NodeId, PeerAddr)>,
        num_workers: u32,
        wait_max: Duration,
    ) -> Self {
        let placer = PsPlacer::new(servers.len() as u32, None);
        let placed_over = (0..servers.len() as u32).collect();
        Self {
            actor,
            runtime,
            gateway,
            servers,
            num_workers,
            placer,
            placed_over,
            layouts: Vec::new(),
            datasets: Vec::new(),
            wait_max,
            warm_start: None,
            registered_steps: None,
            resumed: std::sync::atomic::AtomicBool::new(false),
            program_state: std::sync::Mutex::new(None),
        }
    }

    /// Workers in the cluster.
    pub fn num_workers(&self) -> u32 {
        self.num_workers
    }

    /// Parameter servers in the job now (the cluster spec's, changed by every server that
    /// joined or left since).
    pub fn num_ps(&self) -> u32 {
        self.topology().servers.len() as u32
    }

    /// The job's parameter servers now, by index, and every variable's layout as placed now
    /// (servers may have joined or left since a variable was created: the coordinator moved
    /// its rows). With the coordinator stopped: the cluster spec's servers and the layouts as
    /// created.
    pub fn topology(&self) -> ServerTopology {
        self.ask(Topology).unwrap_or_else(|_| ServerTopology {
            servers: (0..).zip(self.servers.iter().cloned()).collect(),
            layouts: self.layouts.clone(),
        })
    }

    /// True once this process got SIGTERM (a preemption notice) or SIGINT. The program should
    /// stop scheduling, save a checkpoint and return; the process then exits 143. Parameter
    /// servers and workers keep serving meanwhile, up to the preemption grace.
    pub fn preemption_requested(&self) -> bool {
        crate::process::preemption_requested()
    }

    /// The configured checkpoint directory (`--checkpoint-dir`, `COHORT_CHECKPOINT_DIR`, or
    /// `checkpoint_dir` in cohort.toml), if any.
    pub fn checkpoint_dir(&self) -> Option<PathBuf> {
        crate::process::role_config().and_then(|config| config.checkpoint_dir.clone())
    }

    /// Sets where variables created from now on start from, in place of their initializers
    /// (`None`: their initializers). Without this call, the configured `warm_start` and
    /// `warm_start_map` (`--warm-start`, `COHORT_WARM_START`, cohort.toml) are used.
    pub fn set_warm_start(&mut self, warm_start: Option<WarmStart>) {
        self.warm_start = Some(warm_start.map(Arc::new));
    }

    /// The file the variables created so far started from (a warm start), if any.
    pub fn warm_start_file(&self) -> Option<&std::path::Path> {
        self.warm_start.as_ref()?.as_deref().map(WarmStart::file)
    }

    /// The warm start in use: the one set, else the configured one (read once).
    fn warm_start(&mut self) -> Result<Option<Arc<WarmStart>>, CoordinatorError> {
        if let Some(set) = &self.warm_start {
            return Ok(set.clone());
        }
        let loaded = configured_warm_start()?;
        self.warm_start = Some(loaded.clone());
        Ok(loaded)
    }

    /// Creates a variable on the parameter servers (placed round-robin, or split by its
    /// partitioner) and tells every worker where it lives.
    ///
    /// With a warm start (see [`Self::set_warm_start`]) its values come from the warm-start
    /// file instead of its initializer, each server given its rows; a variable the file has no
    /// tensor for, or one of another shape, is an error naming the variable and the file, and
    /// nothing is created. Optimizer state starts fresh either way. A checkpoint restored
    /// afterwards ([`Self::restore_checkpoint`]) overrides these values.
    pub fn create_variable(&mut self, spec: VariableSpec) -> Result<Layout, CoordinatorError> {
        let Some(expected) = spec.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
            return Err(CoordinatorError::Variable {
                problem: VariableProblem::ShapeTooLarge {
                    shape: spec.shape.clone(),
                },
                name: spec.name,
            });
        };
        if let Some(values) = spec.values.as_deref().filter(|v| v.len() != expected) {
            return Err(CoordinatorError::Variable {
                problem: VariableProblem::InitialValues {
                    given: values.len(),
                    shape: spec.shape.clone(),
                    expected,
                },
                name: spec.name,
            });
        }
        if self.layouts.iter().any(|l| l.name == spec.name) {
            return Err(CoordinatorError::Variable {
                name: spec.name,
                problem: VariableProblem::CreatedTwice,
            });
        }
        let layout = self.place(&spec)?;
        let inits = self.initial_values(&spec, &layout)?;
        // Servers being resharded: created once they are (the coordinator refuses until then).
        let deadline = Instant::now() + self.wait_max;
        loop {
            let rx = self.ask(CreateShards {
                layout: layout.clone(),
                inits: inits.clone(),
            })?;
            match self.wait(rx, "creating a variable")? {
                Err(CreateError::Resharding { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                result => {
                    result?;
                    break;
                }
            }
        }
        self.layouts.push(layout.clone());
        self.configure_workers()?;
        Ok(layout)
    }

    /// Where `spec`'s shards live: whole variables continue the coordinator-wide round-robin
    /// over the job's servers now, partitioned ones start their shards there too.
    fn place(&mut self, spec: &VariableSpec) -> Result<Layout, CoordinatorError> {
        // Placed over the job's servers now: their indexes, in order.
        let servers: Vec<u32> = self.topology().servers.keys().copied().collect();
        if servers != self.placed_over {
            // Servers joined or left: whole variables continue the round-robin over the new
            // set from where the variables created so far leave it.
            self.placer = PsPlacer::new(servers.len() as u32, None);
            for _ in 0..self.layouts.len() {
                let _ = self.placer.place("_", &[1], Dtype::F32);
            }
            self.placed_over = servers.clone();
        }
        let mut placer = PsPlacer::new(servers.len() as u32, spec.partitioner);
        // Whole variables continue the coordinator-wide round-robin; partitioned ones start
        // their shards there too.
        for _ in 0..self.layouts.len() {
            let _ = placer.place("_", &[1], Dtype::F32);
        }
        let mut layout = match spec.partitioner {
            None => self.placer.place(&spec.name, &spec.shape, Dtype::F32)?,
            Some(_) => placer.place(&spec.name, &spec.shape, Dtype::F32)?,
        };
        for shard in &mut layout.shards {
            shard.ps = servers[shard.ps as usize];
        }
        Ok(layout)
    }

    /// Each shard's initial value of `spec` placed as `layout`: the warm-start file's rows,
    /// the values the spec gives, or its initializer's.
    fn initial_values(
        &mut self,
        spec: &VariableSpec,
        layout: &Layout,
    ) -> Result<Vec<InitSpec>, CoordinatorError> {
        let fan_in = spec.shape.first().copied().unwrap_or(1) as u64;
        let fan_out = spec.shape.iter().skip(1).product::<usize>() as u64;
        Ok(match self.warm_start()? {
            Some(warm) => warm
                .shard_values(layout)?
                .into_iter()
                .map(|values| InitSpec::Values(values.into_data()))
                .collect(),
            None => match spec.values.as_deref() {
                Some(values) => {
                    let row_len = layout.row_len();
                    layout
                        .shards
                        .iter()
                        .map(|shard| {
                            InitSpec::Values(f32_to_bytes(
                                &values[shard.rows.start * row_len..shard.rows.end * row_len],
                            ))
                        })
                        .collect()
                }
                None => (0..layout.shards.len())
                    .map(|i| {
                        shard_init(
                            &spec.init,
                            i as u64,
                            fan_in,
                            fan_out,
                            &layout.shard_shape(i),
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|source| CoordinatorError::InitialValue {
                        name: spec.name.clone(),
                        source: Box::new(source),
                    })?,
            },
        })
    }

    /// Every worker builds its own dataset from the registered function `function` (its
    /// name, or its [`WorkerData`](crate::program::WorkerData) handle; `InputContext`: one
    /// input pipeline per worker); steps read it with `StepContext::next` by the same. A
    /// restarted worker rebuilds it before running anything.
    pub fn create_per_worker_dataset(
        &mut self,
        function: impl DatasetHandle,
    ) -> Result<(), CoordinatorError> {
        let function = function.dataset_name();
        if !self.datasets.iter().any(|(f, _)| f == function) {
            self.datasets.push((function.to_string(), 0));
        }
        self.configure_workers()
    }

    /// Queues the step `step` with argument `args` on whichever worker is free (TensorFlow's
    /// `schedule`); its value is an `R` ([`Self::fetch`]). A step this program does not
    /// register is refused here, naming it ([`CoordinatorError::UnknownStep`]).
    ///
    /// ```no_run
    /// use cohort::program::{Program, Step, StepContext, StepError};
    ///
    /// static SQUARE: Step<u64, u64> = Step::new("square");
    /// let program = Program::new("my-job")
    ///     .step(&SQUARE, |_ctx: &mut StepContext<'_>, x: u64| Ok::<_, StepError>(x * x))
    ///     .chief(|coordinator| {
    ///         let value = coordinator.schedule(&SQUARE, 7)?;
    ///         assert_eq!(coordinator.fetch(&value)?, 49);
    ///         Ok(())
    ///     });
    /// std::process::exit(cohort::program::main(program));
    /// ```
    pub fn schedule<A: Serialize, R>(
        &self,
        step: &Step<A, R>,
        args: A,
    ) -> Result<RemoteValue<R>, CoordinatorError> {
        let bytes = encode(&args).map_err(|reason| CoordinatorError::Arguments {
            step: step.name().into(),
            reason,
        })?;
        Ok(RemoteValue::new(self.schedule_by_name(step.name(), bytes)?))
    }

    /// Queues the step registered as `function` with its own encoded `args` (a step
    /// registered with `Program::step_encoded`); its value is bytes ([`Self::fetch_encoded`]).
    pub fn schedule_encoded(
        &self,
        function: &str,
        args: Vec<u8>,
    ) -> Result<RemoteValue<Encoded>, CoordinatorError> {
        Ok(RemoteValue::new(self.schedule_by_name(function, args)?))
    }

    fn schedule_by_name(
        &self,
        function: &str,
        args: Vec<u8>,
    ) -> Result<ClosureId, CoordinatorError> {
        if let Some(registered) = &self.registered_steps {
            if !registered.contains(function) {
                return Err(CoordinatorError::UnknownStep {
                    step: function.into(),
                    registered: registered.iter().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(self.ask(Schedule {
            function: function.into(),
            args,
        })??)
    }

    /// Only the steps `names` can be scheduled: the others are refused at `schedule`
    /// instead of failing on a worker (the chief runs the same program as its workers).
    pub(crate) fn with_registered_steps<'n>(
        mut self,
        names: impl Iterator<Item = &'n str>,
    ) -> Self {
        self.registered_steps = Some(names.map(str::to_string).collect());
        self
    }

    /// Blocks until every scheduled closure has finished; raises the first error since the
    /// last `join` (queued closures were cancelled when it happened). The coordinator stays
    /// usable afterwards.
    pub fn join(&self) -> Result<(), CoordinatorError> {
        let rx = self.ask(Join)?;
        self.wait(rx, "join")?.map_err(CoordinatorError::from)
    }

    /// Sets the learning rate the parameter servers apply the closures scheduled from now on
    /// at, in place of their optimizer's rate or schedule (what Keras' `LearningRateScheduler`
    /// does under ParameterServerStrategy, between epochs). The rate travels with each closure
    /// and its pushes: a closure run again after a worker or a server was lost applies at the
    /// rate it was scheduled with, and a restarted server needs to be told nothing. The
    /// closures already scheduled keep theirs. A checkpoint records the rate in force at its
    /// cut, and a chief that restores it goes on at that rate ([`Self::learning_rate`]).
    /// Refused, changing nothing, if `rate` is not finite and non-negative.
    pub fn set_learning_rate(&self, rate: f32) -> Result<(), CoordinatorError> {
        let rate = LearningRate::new(rate).ok_or(CoordinatorError::LearningRate(rate))?;
        self.ask(SetLearningRate(Some(rate)))
    }

    /// The learning rate the closures scheduled from now on carry: the one
    /// [`Self::set_learning_rate`] set last, or, in a chief that resumed, the one the closures
    /// after its checkpoint's cut carried ([`Self::restore_checkpoint`]: a rate Keras'
    /// `LearningRateScheduler` set survives a chief's restart, as Keras restores its
    /// optimizer's rate from a backup). `None`: the servers' own (their optimizer's rate or
    /// schedule).
    pub fn learning_rate(&self) -> Result<Option<f32>, CoordinatorError> {
        Ok(self.ask(Status)?.learning_rate.map(LearningRate::get))
    }

    /// True when nothing is queued or in flight.
    pub fn done(&self) -> Result<bool, CoordinatorError> {
        Ok(self.ask(Status)?.idle)
    }

    /// Blocks for a closure's value, or its error (TensorFlow's `fetch`).
    pub fn fetch<R: DeserializeOwned>(
        &self,
        value: &RemoteValue<R>,
    ) -> Result<R, CoordinatorError> {
        let bytes = self.fetch_encoded(value)?;
        decode(&bytes).map_err(|reason| CoordinatorError::Value {
            closure: value.id.0,
            reason,
        })
    }

    /// Blocks for a closure's value as the bytes its worker sent, or its error.
    pub fn fetch_encoded<R>(&self, value: &RemoteValue<R>) -> Result<Vec<u8>, CoordinatorError> {
        let rx = self.ask(Fetch(value.id))?;
        self.wait(rx, "fetch")?.map_err(CoordinatorError::from)
    }

    /// The ledger (LEDGER-1).
    pub fn ledger(&self) -> Result<Ledger, CoordinatorError> {
        Ok(self.ask(Status)?.ledger)
    }

    /// Workers currently alive.
    pub fn live_workers(&self) -> Result<usize, CoordinatorError> {
        Ok(self.ask(Status)?.live_workers)
    }

    /// Blocks until `count` workers are alive, or the bound passes.
    pub fn wait_for_workers(&self, count: usize, bound: Duration) -> Result<(), CoordinatorError> {
        let deadline = Instant::now() + bound;
        while self.live_workers()? < count {
            if Instant::now() >= deadline {
                return Err(CoordinatorError::Timeout {
                    what: "waiting for workers",
                    bound,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The counters of every parameter server in the job, in index order (the spec's
    /// servers are indexed from 0; see [`Self::topology`] for a job whose servers changed).
    ///
    /// Across recoveries, as [`Self::read_variable`] (see `Self::across_recoveries`): a
    /// job's summary must not fail for a server that is being recovered.
    pub fn ps_stats(&self) -> Result<Vec<PsStatsReply>, CoordinatorError> {
        self.across_recoveries("asking the servers for their counts", |topology| {
            Ok(topology
                .servers
                .keys()
                .map(|ps| self.call_ps_in(topology, *ps, PsStats))
                .collect())
        })
    }

    /// Reads a variable's whole value (for evaluation on the chief).
    pub fn read_variable(&self, name: &str) -> Result<Vec<f32>, CoordinatorError> {
        self.read_from_servers(name, |client, layout| client.pull(layout))
    }

    /// Sets a variable's whole value on the servers (Keras' `set_weights` under
    /// ParameterServerStrategy: `EarlyStopping`'s best weights, say), each shard on its
    /// server, the optimizer slots and step counts kept. Call it with no closure in flight
    /// (after [`Self::join`]): a closure running meanwhile would push against the old value.
    /// A value of another length is refused before anything is sent, naming the variable; a
    /// server being recovered is waited for (a shard it holds is set again after the restore,
    /// which would roll it back).
    pub fn assign_variable(&self, name: &str, values: &[f32]) -> Result<(), CoordinatorError> {
        self.across_recoveries(&format!("assigning {name}"), |topology| {
            let layout = layout_in(topology, name)?;
            let expected: usize = layout.shape.iter().product();
            if values.len() != expected {
                return Err(CoordinatorError::Variable {
                    name: name.into(),
                    problem: VariableProblem::AssignmentLength {
                        expected,
                        shape: layout.shape.clone(),
                        given: values.len(),
                    },
                });
            }
            let row_len = layout.row_len();
            for (index, shard) in layout.shards.iter().enumerate() {
                let part = &values[shard.rows.start * row_len..shard.rows.end * row_len];
                let msg = AssignVariable {
                    name: layout.shard_name(index),
                };
                match self.call_ps_with_blobs(topology, shard.ps, msg, vec![f32_blob(part)]) {
                    Ok(Ok(())) => {}
                    // Restarted and not restored yet, or restoring: wait for its recovery.
                    Ok(Err(PsRefusal::Store(
                        PsError::UnknownVariable(_) | PsError::AssignDuringRestore { .. },
                    ))) => {
                        return Ok(Err(StepError::PsUnavailable(PsUnavailable {
                            ps: shard.ps,
                            reason: format!("it cannot take {name} now"),
                        })))
                    }
                    Ok(Err(refusal)) => return Ok(Err(StepError::ps(refusal))),
                    Err(e) => return Ok(Err(e)),
                }
            }
            Ok(Ok(()))
        })
    }

    /// Reads rows of a `[rows, width]` variable.
    pub fn read_rows(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, CoordinatorError> {
        self.read_from_servers(name, |client, layout| client.pull_rows(layout, ids))
    }

    /// Reads variable `name` from the servers with `read`, across recoveries (see
    /// [`Self::across_recoveries`]): a program reading its variables while a server is
    /// recovered gets the restored values, not an error.
    fn read_from_servers<T>(
        &self,
        name: &str,
        read: impl Fn(&PsClient, &Layout) -> Result<T, StepError>,
    ) -> Result<T, CoordinatorError> {
        self.across_recoveries(&format!("reading {name}"), |topology| {
            let layout = layout_in(topology, name)?;
            Ok(read(&ps_client(self, topology), layout))
        })
    }

    /// Runs `call` over the current servers. Where a server cannot answer for now (lost,
    /// paused past the detection budget, restarting, not restored yet:
    /// [`StepError::PsUnavailable`]), waits for the recovery that restores it and runs it
    /// again, as a save does. Bounded by the coordinator's wait and [`READ_ATTEMPTS_MAX`]
    /// runs; any other failure is returned at once (`call`'s own error without running it
    /// again). `what` names the work in the log.
    fn across_recoveries<T>(
        &self,
        what: &str,
        call: impl Fn(&ServerTopology) -> Result<Result<T, StepError>, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        let deadline = Instant::now() + self.wait_max;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match call(&self.topology())? {
                Ok(value) => return Ok(value),
                Err(StepError::PsUnavailable(unavailable))
                    if attempts < READ_ATTEMPTS_MAX && Instant::now() < deadline =>
                {
                    tracing::debug!("{what}: {unavailable}; waiting for its recovery to try again");
                    self.wait_for_recovery(deadline)?;
                }
                Err(e) => return Err(CoordinatorError::ParameterServer(e)),
            }
        }
    }

    /// Waits (polling) until no parameter-server recovery holds dispatch, or `deadline`.
    /// A first short pause lets a loss that was just hit be noticed.
    fn wait_for_recovery(&self, deadline: Instant) -> Result<(), CoordinatorError> {
        std::thread::sleep(RECOVERY_POLL);
        while Instant::now() < deadline && self.ask(Status)?.recovering {
            std::thread::sleep(RECOVERY_POLL);
        }
        Ok(())
    }

    /// The layouts of every variable created so far, as placed now.
    pub fn layouts(&self) -> Vec<Layout> {
        self.topology().layouts
    }

    /// Waits for in-flight work, then writes a checkpoint of every variable shard and its
    /// optimizer slots, with the ledger (CKPT-1: the manager's protocol).
    ///
    /// The coordinator's machine reads the cut (see `machine::save`). A save survives every
    /// fault the job survives: a worker that does not report its dataset positions is
    /// restarted from those the checkpoint records; a parameter server that cannot
    /// be read for now (unreachable, no answer in time, restarting or restoring) makes the
    /// save wait for the recovery that restores it and read again; a recovery that starts
    /// while the servers are read would mix two cuts in one checkpoint, so the save is taken
    /// again. It fails when the job itself fails (`join` raises), at once when a server
    /// refuses a read for good (a refusal that no recovery explains: reading again would get
    /// the same answer), past [`SAVE_WAIT_MAX`] or `SAVE_ATTEMPTS_MAX` disturbed reads, or
    /// when the checkpoint written does not read back whole (then it is not the cut: a
    /// recovery restores the previous one).
    pub fn save_checkpoint(
        &self,
        manager: &mut CheckpointManager,
        step: u64,
    ) -> Result<PathBuf, CoordinatorError> {
        self.save_checkpoint_with(manager, step, serde_json::Value::Null)
    }

    /// [`Self::save_checkpoint`], recording beside the variables the program's own state at
    /// the cut (`program_state`, any JSON; `null`: none), in the manifest's extra state under
    /// [`PROGRAM_STATE_KEY`]: what a program must know to go on exactly from this checkpoint
    /// that the servers do not hold (`PsFit` keeps its epoch's running figures there). A chief
    /// that restores the checkpoint reads it back with [`Self::restored_program_state`].
    pub fn save_checkpoint_with(
        &self,
        manager: &mut CheckpointManager,
        step: u64,
        program_state: serde_json::Value,
    ) -> Result<PathBuf, CoordinatorError> {
        let reading = self.read_cut(step)?;
        let generation = reading.generation;
        let cut = reading.ledger.next_closure_id;
        // Assembled here, on the program's thread: it copies every tensor.
        let written = reading
            .into_checkpoint()
            .map_err(CheckpointError::from)
            .and_then(|mut ckpt| {
                if !program_state.is_null() {
                    ckpt.extra[PROGRAM_STATE_KEY] = program_state;
                }
                Ok(manager.save(&ckpt, Instant::now())?)
            });
        // The manager read it back whole (CKPT-1): a checkpoint that does not verify is an
        // error here and never becomes the cut, so recoveries go on restoring the previous
        // one and its closures run again (the coordinator hears it: a recovery may wait for
        // this one as the first). Durable: a parameter-server recovery rolls every server back
        // to this cut, unless a restore began since the servers were read.
        let dir = written.map_err(|e| {
            self.actor.do_send(AbandonCut {
                cut: ClosureId(cut),
                reason: e.to_string(),
            });
            CoordinatorError::Checkpoint(e)
        })?;
        self.mark_cut(cut, manager.root(), Some(generation));
        Ok(dir)
    }

    /// [`Self::save_checkpoint`] with the writing off the step path (as CheckFreq and
    /// TensorFlow's async checkpointing do): training waits only for the cut to be read (the
    /// servers snapshot their shards, nothing pending meanwhile); the checkpoint is then built,
    /// written, read back (CKPT-1) and marked as the cut on a thread of its own while the
    /// program schedules on. Until it is marked, a parameter-server recovery restores the
    /// previous checkpoint (and runs again what committed since it), so nothing is lost if the
    /// write fails or a server is lost meanwhile. [`PendingSave::wait`] ends it (and tells
    /// `manager` it saved); one save in flight at a time is the caller's rule (each holds a
    /// copy of every variable until it is written).
    pub fn save_checkpoint_in_background(
        &self,
        manager: &CheckpointManager,
        step: u64,
    ) -> Result<PendingSave, CoordinatorError> {
        let started = Instant::now();
        let reading = self.read_cut(step)?;
        let read_took = started.elapsed();
        let root = manager.root().to_path_buf();
        let policy = manager.policy().clone();
        let actor = self.actor.clone();
        let runtime = self.runtime.clone();
        let writer = std::thread::Builder::new()
            .name(format!("checkpoint-{step}"))
            .spawn(move || -> Result<PathBuf, CheckpointError> {
                let generation = reading.generation;
                let cut = ClosureId(reading.ledger.next_closure_id);
                let written = reading
                    .into_checkpoint()
                    .map_err(CheckpointError::from)
                    .and_then(|ckpt| {
                        let mut writer = CheckpointManager::new(&root, policy, Instant::now())?;
                        Ok(writer.save(&ckpt, Instant::now())?)
                    });
                let dir = written.inspect_err(|e| {
                    actor.do_send(AbandonCut {
                        cut,
                        reason: e.to_string(),
                    })
                })?;
                let marked = runtime.block_on(actor.send(MarkCut {
                    cut,
                    root,
                    generation: Some(generation),
                }));
                match marked {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!("checkpoint {} not marked as the cut: {e}", dir.display())
                    }
                    Err(e) => {
                        tracing::warn!("checkpoint {} not marked as the cut: {e}", dir.display())
                    }
                }
                Ok(dir)
            })
            .map_err(CheckpointError::WriterSpawn)?;
        Ok(PendingSave {
            step,
            started,
            read_took,
            writer,
        })
    }

    /// The consistent cut for a checkpoint at `step`, read once nothing is pending.
    fn read_cut(&self, step: u64) -> Result<CutReading, CoordinatorError> {
        self.join()?;
        let rx = self.ask(ReadCut { step })?;
        let read = self.wait_within(
            rx,
            "reading a checkpoint cut",
            SAVE_WAIT_MAX + self.wait_max,
        )?;
        match read {
            Ok(reading) => Ok(reading),
            Err(e) => {
                // A job that failed meanwhile says so first.
                self.join()?;
                Err(CoordinatorError::CutRead(e))
            }
        }
    }

    /// Tells the coordinator that the checkpoints under `root` hold the variables as they were
    /// at `cut` (the next closure id, with nothing pending). A cut it refuses (something was
    /// scheduled meanwhile from another thread) only leaves the previous one in place.
    fn mark_cut(&self, cut: u64, root: &std::path::Path, generation: Option<u64>) {
        let marked = self.ask(MarkCut {
            cut: ClosureId(cut),
            root: root.to_path_buf(),
            generation,
        });
        match marked {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("checkpoint cut at closure {cut} not marked: {e}"),
            Err(e) => tracing::warn!("checkpoint cut at closure {cut} not marked: {e}"),
        }
    }

    /// Restores every variable this coordinator created from the newest valid checkpoint, if
    /// there is one, and returns its step. Checkpoints that did not verify are logged with the
    /// reason naming the file. With a warm start, first checks that its name map names only
    /// variables created so far (call this once every variable exists, before training).
    pub fn restore_checkpoint(
        &self,
        manager: &mut CheckpointManager,
    ) -> Result<Option<u64>, CoordinatorError> {
        let warm = match &self.warm_start {
            Some(set) => set.clone(),
            None => configured_warm_start()?,
        };
        if let Some(warm) = warm {
            // A map entry for a variable the job never created is a typo to report before
            // training starts, not to ignore.
            let names: Vec<&str> = self.layouts.iter().map(|l| l.name.as_str()).collect();
            warm.check_map_names(&names)?;
        }
        let outcome = manager.restore_latest().map_err(CheckpointError::from)?;
        for skipped in &outcome.skipped {
            tracing::warn!(
                "skipped checkpoint {}: {}",
                skipped.dir.display(),
                skipped.error
            );
        }
        // The machine probes every server first: with no checkpoint it starts afresh only
        // over servers that applied nothing; with one, its restore starts above every closure
        // id and restore generation a live server is at (see `Scheduler::handle_start`).
        let program_state = outcome
            .restored
            .as_ref()
            .and_then(|loaded| loaded.checkpoint.extra.get(PROGRAM_STATE_KEY))
            .filter(|state| !state.is_null())
            .cloned();
        let rx = self.ask(Start {
            checkpoint: outcome.restored.map(|loaded| Arc::new(loaded.checkpoint)),
            root: manager.root().to_path_buf(),
        })?;
        let restored =
            self.wait(rx, "restoring the checkpoint")?
                .map_err(|failure| match failure {
                    StartFailure::ServerLost { ps, reason } => {
                        CoordinatorError::ServerLostAtStart { ps, reason }
                    }
                    other => CoordinatorError::Start(other),
                })?;
        if restored.is_some() {
            self.resumed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            if let Ok(mut kept) = self.program_state.lock() {
                *kept = program_state;
            }
        }
        Ok(restored)
    }

    /// The program's own state that the checkpoint [`Self::restore_checkpoint`] restored
    /// recorded ([`Self::save_checkpoint_with`]); `None` where it restored none, or the
    /// checkpoint recorded no such state.
    pub fn restored_program_state(&self) -> Option<serde_json::Value> {
        self.program_state.lock().ok().and_then(|kept| kept.clone())
    }

    /// Whether this coordinator restored the servers from a checkpoint
    /// ([`Self::restore_checkpoint`] found one): a restarted chief that resumed.
    pub(crate) fn resumed(&self) -> bool {
        self.resumed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn configure_workers(&self) -> Result<(), CoordinatorError> {
        let setup = SetupWorker {
            num_workers: self.num_workers,
            layouts: self.layouts.clone(),
            servers: Vec::new(),
            datasets: self.datasets.clone(),
            // Stamped by the coordinator's machine when it hands the setup out.
            version: 0,
            generation: 0,
        };
        let rx = self.ask(Configure(setup))?;
        Ok(self.wait(rx, "configuring workers")??)
    }

    /// Calls server `ps` of `topology`; a failure as a step reads it (a server unreachable,
    /// gone or restarting is [`StepError::PsUnavailable`]).
    fn call_ps_in<M: cohort_actors::RemoteMessage>(
        &self,
        topology: &ServerTopology,
        ps: u32,
        msg: M,
    ) -> Result<M::Reply, StepError> {
        self.call_ps_with_blobs(topology, ps, msg, Vec::new())
    }

    /// Calls parameter server `ps` of `topology` with `msg` and `blobs` beside it (the
    /// reply's blobs left out).
    fn call_ps_with_blobs<M: cohort_actors::RemoteMessage>(
        &self,
        topology: &ServerTopology,
        ps: u32,
        msg: M,
        blobs: Vec<bytes::Bytes>,
    ) -> Result<M::Reply, StepError> {
        let (node, addr) = topology
            .servers
            .get(&ps)
            .cloned()
            .ok_or_else(|| StepError::ps(PsFailure::NoSuchServer(ps)))?;
        let gateway = self.gateway.clone();
        self.runtime
            .block_on(async move {
                let r = gateway.resolve::<M>(addr, &node, PS_ACTOR).await?;
                r.call_with_blobs(&msg, blobs).await
            })
            .map(|(reply, _)| reply)
            .map_err(|e| StepError::from_ps_call(ps, e))
    }

    fn ask<M>(&self, msg: M) -> Result<M::Result, CoordinatorError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        CoordinatorActor: actix::Handler<M>,
    {
        self.runtime
            .block_on(self.actor.send(msg))
            .map_err(|_| CoordinatorError::Stopped)
    }

    fn wait<T>(
        &self,
        rx: tokio::sync::oneshot::Receiver<T>,
        what: &'static str,
    ) -> Result<T, CoordinatorError> {
        self.wait_within(rx, what, self.wait_max)
    }

    fn wait_within<T>(
        &self,
        rx: tokio::sync::oneshot::Receiver<T>,
        what: &'static str,
        bound: Duration,
    ) -> Result<T, CoordinatorError> {
        self.runtime
            .block_on(async move { tokio::time::timeout(bound, rx).await })
            .map_err(|_| CoordinatorError::Timeout { what, bound })?
            .map_err(|_| CoordinatorError::Stopped)
    }
}

/// Most reads of a variable ([`ClusterCoordinator::read_variable`]) when servers cannot be read
/// for now: each waits for the recovery under way.
const READ_ATTEMPTS_MAX: u32 = 5;
/// How often a read waiting for a recovery asks whether it ended.
const RECOVERY_POLL: Duration = Duration::from_millis(50);

/// The layout of variable `name` in `topology`.
fn layout_in<'a>(topology: &'a ServerTopology, name: &str) -> Result<&'a Layout, CoordinatorError> {
    topology
        .layouts
        .iter()
        .find(|l| l.name == name)
        .ok_or_else(|| CoordinatorError::Variable {
            name: name.into(),
            problem: VariableProblem::Unknown,
        })
}

/// A client over the servers of `topology`.
fn ps_client(coordinator: &ClusterCoordinator, topology: &ServerTopology) -> PsClient {
    let mut client = PsClient::new(
        coordinator.gateway.clone(),
        coordinator.runtime.clone(),
        Vec::new(),
    );
    client.know_servers(
        topology
            .servers
            .iter()
            .map(|(ps, peer)| (*ps, peer.clone())),
    );
    client
}

/// A checkpoint being written off the program's thread
/// ([`ClusterCoordinator::save_checkpoint_in_background`]).
#[derive(Debug)]
pub struct PendingSave {
    step: u64,
    started: Instant,
    read_took: Duration,
    writer: std::thread::JoinHandle<Result<PathBuf, CheckpointError>>,
}

/// A checkpoint written in the background, and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedInBackground {
    /// Its directory.
    pub dir: PathBuf,
    /// Its step.
    pub step: u64,
    /// How long training waited: the cut's read.
    pub read_took: Duration,
    /// From the read's start until it was durable, verified and marked.
    pub total: Duration,
}

impl PendingSave {
    /// Whether the writer is done (then [`Self::wait`] does not block).
    pub fn is_finished(&self) -> bool {
        self.writer.is_finished()
    }

    /// The checkpoint's step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Waits for the checkpoint to be written, verified and marked, and records it in
    /// `manager` (its cadence counts from when this save began). An error says why it is not
    /// a checkpoint (the previous one stays the cut).
    pub fn wait(
        self,
        manager: &mut CheckpointManager,
    ) -> Result<SavedInBackground, CoordinatorError> {
        let dir = self
            .writer
            .join()
            .map_err(|_| CheckpointError::WriterPanicked)??;
        manager.record_saved(self.step, self.started);
        Ok(SavedInBackground {
            dir,
            step: self.step,
            read_took: self.read_took,
            total: self.started.elapsed(),
        })
    }
}

/// The warm start the role's configuration names (`warm_start`, `warm_start_map`), read and
/// checked; `None` when it names none.
fn configured_warm_start() -> Result<Option<Arc<WarmStart>>, WarmStartError> {
    let config = crate::process::role_config();
    let Some(file) = config.and_then(|c| c.warm_start.as_deref()) else {
        return Ok(None);
    };
    let map = config.and_then(|c| c.warm_start_map.as_deref());
    Ok(Some(Arc::new(WarmStart::open(file, map)?)))
}

fn shard_init(
    init: &Initializer,
    shard: u64,
    fan_in: u64,
    fan_out: u64,
    shape: &[usize],
) -> Result<InitSpec, NnError> {
    // Each shard draws from its own seed, so the layout and seeds fix every bit (DATA-1).
    Ok(match *init {
        Initializer::Zeros => InitSpec::Zeros,
        Initializer::Constant(c) => InitSpec::Constant(c),
        Initializer::RandomUniform { min, max, seed } => InitSpec::Uniform {
            min,
            max,
            seed: seed.wrapping_add(shard),
        },
        Initializer::GlorotUniform { seed } => InitSpec::GlorotUniform {
            seed: seed.wrapping_add(shard),
            fan_in,
            fan_out,
        },
        Initializer::RandomNormal { .. } => {
            let seeded = match *init {
                Initializer::RandomNormal { mean, stddev, seed } => Initializer::RandomNormal {
                    mean,
                    stddev,
                    seed: seed.wrapping_add(shard),
                },
                other => other,
            };
            let values = seeded
                .init(shape)
                .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))?;
            InitSpec::Values(f32_to_bytes(&values))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointPolicy;
    use crate::roles::coordinator::{Scheduler, SchedulerConfig};
    use crate::roles::protocol::PsError;
    use crate::roles::protocol::{BeginRestore, CreateVariable, PsRefusal, RollBack, Snapshot};
    use cohort_actors::Remote;
    use cohort_transport::ClusterCa;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn gateway(ca: &ClusterCa, node: &NodeId) -> Gateway {
        crate::roles::test_support::loopback_gateway(ca, node, 1, Duration::from_secs(5))
    }

    #[test]
    fn only_a_server_lost_past_this_runs_recovery_asks_for_the_chiefs_restart() {
        let lost = CoordinatorError::Closure(ClosureFailure::PsLost {
            ps: 1,
            cause: crate::roles::coordinator::PsLossCause::NoCheckpoint,
        });
        let copy = lost
            .restart_wanted()
            .expect("a lost server asks for a restart");
        assert_eq!(copy.to_string(), lost.to_string());
        let at_start = CoordinatorError::ServerLostAtStart {
            ps: 0,
            reason: "closed".into(),
        };
        let copy = at_start
            .restart_wanted()
            .expect("so does one lost at the start");
        assert_eq!(copy.to_string(), at_start.to_string());
        for other in [
            CoordinatorError::Closure(ClosureFailure::Cancelled(ClosureId(3))),
            CoordinatorError::Stopped,
            CoordinatorError::LearningRate(f32::NAN),
            CoordinatorError::other("the program's own failure"),
        ] {
            assert!(other.restart_wanted().is_none(), "{other}");
        }
    }

    /// Runs `body` with a coordinator over one fake parameter server (handlers from
    /// `register`, plus a `CreateVariable` that accepts) on 127.0.0.1, with variable `w`
    /// created and an empty checkpoint directory; stops everything afterwards.
    fn with_fake_ps<T>(
        tag: &str,
        register: fn(&Gateway),
        body: impl FnOnce(&mut ClusterCoordinator, &mut CheckpointManager) -> T,
    ) -> T {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let system = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let ca = ClusterCa::generate("test").unwrap();
                let ps_node = NodeId::new("ps", 0);
                let ps = gateway(&ca, &ps_node);
                ps.register_fn::<CreateVariable, _, _>(
                    PS_ACTOR,
                    |_: Remote<CreateVariable>| async { Ok(Ok(())) },
                )
                .unwrap();
                register(&ps);
                let chief = gateway(&ca, &NodeId::new("chief", 0));
                let servers = vec![(ps_node, ps.local_addr().unwrap().into())];
                let scheduler = Scheduler::new(SchedulerConfig::default());
                let actor = actix::Actor::start(CoordinatorActor::new(
                    chief.clone(),
                    scheduler,
                    Vec::new(),
                    servers.clone(),
                ));
                ready_tx
                    .send((actor, chief, Handle::current(), servers))
                    .unwrap();
                let _ = tokio::time::timeout(Duration::from_secs(60), stop_rx).await;
                drop(ps);
            });
        });
        let (actor, chief, runtime, servers) = ready_rx.recv().unwrap();
        let mut coordinator =
            ClusterCoordinator::new(actor, runtime, chief, servers, 0, Duration::from_secs(10));
        coordinator
            .create_variable(VariableSpec::zeros("w", vec![2, 2]))
            .unwrap();
        let root = std::env::temp_dir().join(format!(
            "cohort-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let mut manager =
            CheckpointManager::new(&root, CheckpointPolicy::default(), Instant::now()).unwrap();
        let out = body(&mut coordinator, &mut manager);
        let _ = stop_tx.send(());
        system.join().unwrap();
        let _ = std::fs::remove_dir_all(&root);
        out
    }

    /// A parameter server that refuses to read a shard, with no recovery under way to explain
    /// it, fails the save at once with the refusal, instead of retrying for `SAVE_WAIT_MAX`.
    #[test]
    fn a_save_fails_at_once_when_a_server_refuses_the_read_for_good() {
        let (err, elapsed) = with_fake_ps(
            "save-refused",
            |ps| {
                ps.register_fn::<Snapshot, _, _>(PS_ACTOR, |m: Remote<Snapshot>| async move {
                    Ok(Err(PsRefusal::Store(PsError::UnknownVariable(m.msg.name))))
                })
                .unwrap();
            },
            |coordinator, manager| {
                let started = Instant::now();
                let err = coordinator.save_checkpoint(manager, 1).unwrap_err();
                (err, started.elapsed())
            },
        );
        let message = err.to_string();
        assert!(
            message.contains("no checkpoint taken at step 1")
                && message.contains("ps/0 refused")
                && message.contains("does not exist on this parameter server"),
            "{message}"
        );
        // At once, not after the save's wait for a recovery (SAVE_WAIT_MAX, 10 min).
        assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    }

    /// With no checkpoint to restore, a coordinator starts afresh only over servers that have
    /// applied nothing: servers that trained under an earlier chief would see their closure
    /// ids reused (PS-1) and hold state no ledger accounts for, so it refuses, saying why.
    #[test]
    fn no_checkpoint_over_servers_that_trained_is_refused_not_a_fresh_start() {
        let trained = with_fake_ps(
            "restore-trained",
            |ps| {
                ps.register_fn::<PsStats, _, _>(PS_ACTOR, |_: Remote<PsStats>| async {
                    Ok(PsStatsReply {
                        applied: 40,
                        next_free_closure_id: 40,
                        serving: true,
                        ..PsStatsReply::default()
                    })
                })
                .unwrap();
            },
            |coordinator, manager| coordinator.restore_checkpoint(manager),
        );
        let message = trained.unwrap_err().to_string();
        assert!(
            message.contains("no checkpoint") && message.contains("ps/0 has applied closures"),
            "{message}"
        );
        // A first start: the server holds no variable yet, so no push can reach it.
        let fresh = with_fake_ps(
            "restore-fresh",
            |ps| {
                ps.register_fn::<PsStats, _, _>(PS_ACTOR, |_: Remote<PsStats>| async {
                    Ok(PsStatsReply::default())
                })
                .unwrap();
            },
            |coordinator, manager| coordinator.restore_checkpoint(manager),
        );
        assert_eq!(fresh.unwrap(), None);
        // A restarted chief over a server that holds variables and applied nothing: it opens
        // a generation of its own there first (an earlier chief's push may still be on its
        // way), probes again, and starts afresh.
        static BEGUN: AtomicU64 = AtomicU64::new(0);
        let fresh = with_fake_ps(
            "restore-fenced",
            |ps| {
                ps.register_fn::<PsStats, _, _>(PS_ACTOR, |_: Remote<PsStats>| async {
                    Ok(PsStatsReply {
                        serving: true,
                        ..PsStatsReply::default()
                    })
                })
                .unwrap();
                ps.register_fn::<BeginRestore, _, _>(PS_ACTOR, |_: Remote<BeginRestore>| async {
                    BEGUN.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
                ps.register_fn::<RollBack, _, _>(PS_ACTOR, |_: Remote<RollBack>| async { Ok(()) })
                    .unwrap();
            },
            |coordinator, manager| coordinator.restore_checkpoint(manager),
        );
        assert_eq!(fresh.unwrap(), None);
        assert_eq!(BEGUN.load(Ordering::SeqCst), 1);
    }
}
