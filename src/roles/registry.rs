//! The registry of a program: the functions every process of a job registers by name (its
//! datasets, steps, chief loop and evaluation function) and the parameter servers' optimizer.
//!
//! The roles look their functions up here: a worker its step and dataset functions, the chief
//! its loop, an evaluator its evaluation function. Users build a [`Program`] through
//! [`crate::program`], which re-exports it with the types its functions see; this module
//! starts nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::coordinator::{ClusterCoordinator, CoordinatorError};
use super::eval_fn::{CheckpointVariables, EvalError, Metrics};
use super::step::{decode, encode, DatasetHandle, Step};
use super::worker::{StepContext, StepError};
use crate::data::{DataError, Dataset, InputContext};
use crate::optim::{
    LearningRateSchedule, OptimError, Optimizer, OptimizerScopes, ScheduleError, ScopeError,
};

pub use super::step::DatasetFn;
pub use super::worker::{StepFn, WorkerFunctions};
/// The chief's training loop.
pub type ChiefFn =
    Arc<dyn Fn(&mut ClusterCoordinator) -> Result<(), CoordinatorError> + Send + Sync>;
/// The evaluator's function: the variables of one checkpoint in, named metrics out.
pub type EvalFn = Arc<dyn Fn(&CheckpointVariables) -> Result<Metrics, EvalError> + Send + Sync>;

/// What is wrong with a program's parameter-server settings ([`Program::check_ps_settings`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PsSettingsError {
    /// The program's optimizer ([`Program::optimizer`]).
    #[error("the parameter servers' optimizer: {0}")]
    Optimizer(OptimError),
    /// A name scope or its optimizer ([`Program::optimizer_for`]).
    #[error(transparent)]
    Scope(#[from] ScopeError),
    /// The learning-rate schedule ([`Program::learning_rate_schedule`]).
    #[error("the parameter servers' learning-rate schedule: {0}")]
    Schedule(ScheduleError),
}

/// The registered functions of one job.
#[derive(Clone)]
pub struct Program {
    name: String,
    datasets: BTreeMap<String, DatasetFn>,
    steps: BTreeMap<String, StepFn>,
    chief: Option<ChiefFn>,
    evaluator: Option<EvalFn>,
    optimizer: Optimizer,
    scopes: OptimizerScopes,
    schedule: Option<LearningRateSchedule>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("datasets", &self.datasets.keys().collect::<Vec<_>>())
            .field("steps", &self.steps.keys().collect::<Vec<_>>())
            .field("evaluator", &self.evaluator.is_some())
            .finish_non_exhaustive()
    }
}

impl Program {
    /// An empty program called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            datasets: BTreeMap::new(),
            steps: BTreeMap::new(),
            chief: None,
            evaluator: None,
            optimizer: Optimizer::sgd(0.01),
            scopes: OptimizerScopes::new(),
            schedule: None,
        }
    }

    /// Registers a dataset function under `name` (for `create_per_worker_dataset`).
    ///
    /// Each worker calls it with an [`InputContext`] of one input pipeline per worker
    /// (`num_input_pipelines` = the workers, `input_pipeline_id` = this worker's index) and
    /// `num_replicas_in_sync` = the workers: an element is one worker's batch for one step,
    /// which the step splits among the worker's local replicas (its `replicas` key), so
    /// `get_per_replica_batch_size(global)` is that per-worker batch whatever the replicas.
    ///
    /// `name` is the function's name or its [`WorkerData`](crate::program::WorkerData)
    /// handle, by which the chief creates the dataset and steps read it.
    pub fn dataset(
        mut self,
        name: impl DatasetHandle,
        f: impl Fn(&InputContext) -> Result<Dataset, DataError> + Send + Sync + 'static,
    ) -> Self {
        self.datasets
            .insert(name.dataset_name().to_owned(), Arc::new(f));
        self
    }

    /// Registers `f` as the step `step` (for `ClusterCoordinator::schedule`): a worker runs it
    /// with the argument the chief scheduled, decoded, and sends back its value, encoded. An
    /// argument that does not decode as an `A` is the closure's error
    /// ([`StepError::Arguments`], naming the step), as is a value that does not encode.
    ///
    /// ```
    /// use cohort::program::{Program, Step, StepContext, StepError, WorkerFunctions};
    ///
    /// static SCALE: Step<(f32, Vec<f32>), Vec<f32>> = Step::new("scale");
    /// let program = Program::new("my-job").step(&SCALE, |_ctx: &mut StepContext<'_>, (by, xs)| {
    ///     Ok::<_, StepError>(xs.into_iter().map(|x| x * by).collect())
    /// });
    /// assert!(program.step_fn("scale").is_some());
    /// ```
    pub fn step<A, R>(
        self,
        step: &Step<A, R>,
        f: impl Fn(&mut StepContext<'_>, A) -> Result<R, StepError> + Send + Sync + 'static,
    ) -> Self
    where
        A: DeserializeOwned + 'static,
        R: Serialize + 'static,
    {
        let name = step.name();
        self.step_encoded(name, move |ctx, bytes| {
            let args = decode::<A>(bytes).map_err(|reason| StepError::Arguments {
                step: name.into(),
                reason,
            })?;
            let value = f(ctx, args)?;
            encode(&value).map_err(|reason| StepError::Value {
                step: name.into(),
                reason,
            })
        })
    }

    /// Registers a step function under `name` that takes and returns its own bytes (for
    /// `ClusterCoordinator::schedule_encoded`): the layer typed steps ([`Self::step`]) are
    /// built on, for a program that encodes its values itself.
    pub fn step_encoded(
        mut self,
        name: impl Into<String>,
        f: impl Fn(&mut StepContext<'_>, &[u8]) -> Result<Vec<u8>, StepError> + Send + Sync + 'static,
    ) -> Self {
        self.steps.insert(name.into(), Arc::new(f));
        self
    }

    /// Sets the chief's training loop.
    pub fn chief(
        mut self,
        f: impl Fn(&mut ClusterCoordinator) -> Result<(), CoordinatorError> + Send + Sync + 'static,
    ) -> Self {
        self.chief = Some(Arc::new(f));
        self
    }

    /// Sets the evaluation function run by an `evaluator` task (TensorFlow's sidecar
    /// evaluator; see [`crate::roles::evaluator`]). That task does not join training: it
    /// watches `checkpoint_dir` and calls `f` once for each newer checkpoint that verifies,
    /// with that checkpoint's step and whole variables (parts from every parameter server put
    /// back together; optimizer slots left out), then prints the returned metrics as one line
    /// `[evaluator] step N: name=value ...`. An error or a panic from `f` ends the evaluator
    /// with exit code 1.
    ///
    /// ```
    /// use cohort::program::{CheckpointVariables, EvalError, Program};
    ///
    /// let program = Program::new("my-job").evaluator(|vars: &CheckpointVariables| {
    ///     let w = vars.f32("w")?;
    ///     let norm = w.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    ///     Ok::<_, EvalError>(vec![("w_norm".to_string(), norm)])
    /// });
    /// assert!(program.evaluator_fn().is_some());
    /// ```
    pub fn evaluator(
        mut self,
        f: impl Fn(&CheckpointVariables) -> Result<Metrics, EvalError> + Send + Sync + 'static,
    ) -> Self {
        self.evaluator = Some(Arc::new(f));
        self
    }

    /// The optimizer the parameter servers apply pushes with (default: SGD, rate 0.01).
    pub fn optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// The optimizer the parameter servers update the variables of name scope `scope` with,
    /// instead of [`Program::optimizer`]'s: a variable named `scope`, or `scope/...` or
    /// `scope.…` (a partitioned variable's shards among them), takes the optimizer of the
    /// longest scope it is in ([`OptimizerScopes`]), as a wide-and-deep model trains its
    /// linear part with one optimizer and its deep part with another. It applies its own
    /// constant rate ([`Program::optimizer_for_scheduled`]: its own schedule):
    /// [`Program::learning_rate_schedule`] and the rate the chief sets
    /// ([`ClusterCoordinator::set_learning_rate`]) are the program optimizer's. A checkpoint
    /// records each variable's slots, and restoring one whose slots another optimizer made
    /// fails naming the variable. Every process registers the same; a bad scope or optimizer
    /// fails every role's start (exit code 2), naming the scope
    /// ([`Program::check_ps_settings`]).
    ///
    /// ```
    /// use cohort::optim::Optimizer;
    /// use cohort::program::Program;
    ///
    /// let program = Program::new("wide-deep")
    ///     .optimizer(Optimizer::adam(0.001))
    ///     .optimizer_for("wide", Optimizer::adagrad(0.05));
    /// assert_eq!(program.ps_optimizer_scopes().of("wide/kernel"), Some(&Optimizer::adagrad(0.05)));
    /// assert_eq!(program.ps_optimizer_scopes().of("deep/kernel"), None);
    /// ```
    pub fn optimizer_for(mut self, scope: impl Into<String>, optimizer: Optimizer) -> Self {
        self.scopes.insert(scope, optimizer);
        self
    }

    /// [`Program::optimizer_for`], the scope's rate following `schedule` of each variable's
    /// update count (as [`Program::learning_rate_schedule`] does for the program optimizer's)
    /// instead of the optimizer's constant rate: the wide part of a wide-and-deep model decayed
    /// on its own course, say. A schedule that cannot give a rate fails every role's start
    /// (exit code 2), naming the scope.
    ///
    /// ```
    /// use cohort::optim::Optimizer;
    /// use cohort::program::Program;
    /// use cohort::train::LearningRateSchedule;
    ///
    /// let decay = LearningRateSchedule::cosine_decay(0.05, 10_000);
    /// let program = Program::new("wide-deep")
    ///     .optimizer(Optimizer::adam(0.001))
    ///     .optimizer_for_scheduled("wide", Optimizer::adagrad(0.05), decay.clone());
    /// assert_eq!(
    ///     program.ps_optimizer_scopes().scoped("wide/kernel"),
    ///     Some((&Optimizer::adagrad(0.05), Some(&decay)))
    /// );
    /// ```
    pub fn optimizer_for_scheduled(
        mut self,
        scope: impl Into<String>,
        optimizer: Optimizer,
        schedule: LearningRateSchedule,
    ) -> Self {
        self.scopes
            .insert_scoped(scope.into(), optimizer, Some(schedule));
        self
    }

    /// Every scope of `scopes` with its optimizer and schedule, as [`Program::optimizer_for`]
    /// and [`Program::optimizer_for_scheduled`] give one (replacing what was given for the
    /// same scope before).
    pub fn optimizer_scopes(mut self, scopes: &OptimizerScopes) -> Self {
        for (scope, optimizer, schedule) in scopes.iter() {
            self.scopes
                .insert_scoped(scope.to_owned(), *optimizer, schedule.cloned());
        }
        self
    }

    /// The parameter servers' learning rate as a function of each variable's update count
    /// (Keras' schedules: warm-up, cosine decay...), in place of the optimizer's constant
    /// rate. Every process registers the same; a schedule that cannot give a rate fails every
    /// role's start (exit code 2), naming it.
    pub fn learning_rate_schedule(mut self, schedule: LearningRateSchedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// The parameter servers' optimizer.
    pub fn ps_optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// Checks what the parameter servers will be given: the optimizer, every name scope's
    /// and the learning-rate schedule. Every role checks it before it starts, so that a bad
    /// one ends the whole job at once, naming it, rather than the servers alone.
    pub fn check_ps_settings(&self) -> Result<(), PsSettingsError> {
        self.optimizer
            .validate()
            .map_err(PsSettingsError::Optimizer)?;
        self.scopes.validate()?;
        if let Some(schedule) = &self.schedule {
            schedule.validate().map_err(PsSettingsError::Schedule)?;
        }
        Ok(())
    }

    /// The optimizers given for name scopes ([`Program::optimizer_for`]).
    pub fn ps_optimizer_scopes(&self) -> &OptimizerScopes {
        &self.scopes
    }

    /// The parameter servers' learning-rate schedule, if any.
    pub fn ps_learning_rate_schedule(&self) -> Option<&LearningRateSchedule> {
        self.schedule.as_ref()
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of the registered steps, in order.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.keys().map(String::as_str)
    }

    /// The chief's loop.
    pub fn chief_fn(&self) -> Option<&ChiefFn> {
        self.chief.as_ref()
    }

    /// The evaluation function.
    pub fn evaluator_fn(&self) -> Option<&EvalFn> {
        self.evaluator.as_ref()
    }
}

/// What a worker runs of the program: its step and dataset functions, by name.
impl WorkerFunctions for Program {
    fn dataset_fn(&self, name: &str) -> Option<&DatasetFn> {
        self.datasets.get(name)
    }

    fn step_fn(&self, name: &str) -> Option<&StepFn> {
        self.steps.get(name)
    }
}
