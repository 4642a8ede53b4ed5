//! Keras' `fit` under ParameterServerStrategy: the chief's coordinator schedules one closure
//! per step (or per `steps_per_execution` steps) on the workers, which read their own
//! per-worker dataset, pull the model's variables, compute gradients over their local replicas
//! and push them (PS-1: each of a closure's updates applied once); validation runs as closures
//! too. Code never travels: every process
//! registers the same steps ([`PsFit::register`]) and the chief runs [`PsFit::fit`].
//!
//! Recovery is the coordinator's: a lost worker's closure runs on another, a lost parameter
//! server is restored from the newest checkpoint and the closures committed since run again;
//! with a [`BackupAndRestore`] the chief saves those checkpoints and a restarted chief resumes
//! at the step of the newest one.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{DType, Tensor};
use candle_nn::{ModuleT, VarBuilder};

use super::callbacks::{BackupAndRestore, Callback, ProgbarLogger, SaveFreq, TrainingContext};
use super::metrics::Metric;
use super::model::{batch_stats, logs_of, split_element, stats_len};
use super::{Fit, History, KerasError, Logs, Loss};
use crate::checkpoint::{CheckpointManager, CheckpointPolicy};
use crate::data::Element;
use crate::nn::ModelVariables;
use crate::optim::{LearningRateSchedule, Optimizer};
use crate::program::{
    ClusterCoordinator, DatasetHandle, Program, RowRead, ServerModel, Step, StepContext, StepError,
};
use crate::train::{DistributedOptimizer, StateCheckpointError};
use crate::variable::Partitioner;

/// A closure of training: the global step it starts at and how many steps it runs; their
/// statistics (loss, examples, metrics), summed.
static TRAIN: Step<(u64, u32), Vec<f64>> = Step::new("cohort.keras.train");
/// A step of validation: its statistics.
static EVALUATE: Step<(), Vec<f64>> = Step::new("cohort.keras.evaluate");

type BuildFn<N> = dyn Fn(VarBuilder<'static>) -> candle_core::Result<N> + Send + Sync;
type PartitionFn = dyn Fn(&str, &[usize]) -> Option<Partitioner> + Send + Sync;

/// A candle-nn network trained by Keras' `fit` on a parameter-server cluster (see the
/// module docs). The servers apply its optimizer, at its constant learning rate or by a
/// [`LearningRateSchedule`] of each variable's update count
/// ([`PsFit::learning_rate_schedule`]), until a callback sets a rate
/// (`LearningRateScheduler`): the closures scheduled after that carry it, and the servers
/// apply their updates at it on every attempt (`ClusterCoordinator::set_learning_rate`).
/// Callbacks run on the chief, with a copy of the weights it reads from the servers at
/// the end of each epoch (after its validation) and of training: `ModelCheckpoint` saves
/// those, and a callback's `weights()` are those; weights a callback sets
/// (`EarlyStopping::restore_best_weights`) are written to the servers once the closures in
/// flight finished (`ClusterCoordinator::assign_variable`).
///
/// Calling protocol:
/// 1. every process builds the same `PsFit` and calls [`PsFit::register`] on its `Program`,
///    beside `Program::dataset` for the training (and validation) data: a function of the
///    worker's input context giving that worker's batches, repeated for as long as training
///    runs;
/// 2. the chief's function calls [`PsFit::fit`] with the coordinator.
pub struct PsFit<N> {
    seed: u64,
    optimizer: Optimizer,
    build: Arc<BuildFn<N>>,
    loss: Loss,
    metrics: Arc<[Box<dyn Metric>]>,
    train_data: String,
    validation_data: Option<String>,
    partitioner: Arc<PartitionFn>,
    /// Tables (2-D variables) read and pushed by the rows the batch's ids touch.
    row_tables: Vec<String>,
    schedule: Option<LearningRateSchedule>,
    steps_per_execution: u32,
}

impl<N: ModuleT + Send + Sync + 'static> PsFit<N> {
    /// A network built by `build` (initial weights drawn from `seed`, as `Model::new`
    /// draws them), trained by the servers with `optimizer` on `loss`, reporting `metrics`,
    /// on the per-worker dataset registered as `train_data`.
    pub fn new<F>(
        seed: u64,
        build: F,
        optimizer: Optimizer,
        loss: Loss,
        metrics: Vec<Box<dyn Metric>>,
        train_data: impl DatasetHandle,
    ) -> Self
    where
        F: Fn(VarBuilder<'static>) -> candle_core::Result<N> + Send + Sync + 'static,
    {
        Self {
            seed,
            optimizer,
            build: Arc::new(build),
            loss,
            metrics: metrics.into(),
            train_data: train_data.dataset_name().to_owned(),
            validation_data: None,
            partitioner: Arc::new(|_, _| None),
            row_tables: Vec::new(),
            schedule: None,
            steps_per_execution: 1,
        }
    }

    /// Each closure runs `steps` training steps (Keras' `steps_per_execution`, at least 1):
    /// fewer round trips between the chief and the workers per step. Every step applies its
    /// own update before the next pulls (as each step's `apply_gradients` does in Keras), each
    /// applied at most once however often the closure runs again after a failure (PS-1); the
    /// callbacks' batch hooks run once per closure, at its last step, as in Keras. An epoch
    /// or a step backup's cadence that `steps` does not divide ends a closure early.
    pub fn steps_per_execution(mut self, steps: u32) -> Self {
        self.steps_per_execution = steps.max(1);
        self
    }

    /// The servers' learning rate follows `schedule` of each variable's update count (Keras'
    /// warm-up, cosine or step decay), instead of the optimizer's constant rate; the logs'
    /// `learning_rate` is its value at the step.
    pub fn learning_rate_schedule(mut self, schedule: LearningRateSchedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// Reads the embedding tables `tables` (candle-nn's names, `embedding.weight`) by rows:
    /// each closure pulls only the rows its batch's ids touch and pushes only their
    /// gradients, instead of the whole tables (TensorFlow's sparse embedding lookups on
    /// parameter servers). The ids are the features (each element's first tensor), and every
    /// table listed is indexed by them: the network gets them renumbered into the rows pulled.
    /// An id past a table's end fails its closure, naming the table.
    pub fn read_rows(mut self, tables: &[&str]) -> Self {
        self.row_tables = tables.iter().map(|t| (*t).to_owned()).collect();
        self
    }

    /// Validates after each epoch on the per-worker dataset registered as `name`
    /// (`Fit::validation_steps` batches; the figures are `val_<name>`).
    pub fn validation_data(mut self, name: impl DatasetHandle) -> Self {
        self.validation_data = Some(name.dataset_name().to_owned());
        self
    }

    /// How each variable is split over the servers (`None`: whole, placed round-robin), by
    /// name and shape: an embedding table split by rows, say.
    pub fn partitioner(
        mut self,
        partitioner: impl Fn(&str, &[usize]) -> Option<Partitioner> + Send + Sync + 'static,
    ) -> Self {
        self.partitioner = Arc::new(partitioner);
        self
    }

    /// Registers the training and validation steps and the servers' optimizer on `program`
    /// (every process).
    pub fn register(self: &Arc<Self>, program: Program) -> Program {
        let train = Arc::clone(self);
        let evaluate = Arc::clone(self);
        let program = match &self.schedule {
            Some(schedule) => program.learning_rate_schedule(schedule.clone()),
            None => program,
        };
        program
            .optimizer(self.optimizer)
            .step(
                &TRAIN,
                move |ctx: &mut StepContext<'_>, (_, steps): (u64, u32)| {
                    let mut totals = vec![0.0f64; stats_len(&train.metrics)];
                    for index in 0..steps.max(1) {
                        if index > 0 {
                            // The previous step's update, before this step pulls.
                            ctx.apply_gradients()?;
                        }
                        for (t, s) in totals.iter_mut().zip(train.train_closure(ctx)?) {
                            *t += s;
                        }
                    }
                    Ok(totals)
                },
            )
            .step(&EVALUATE, move |ctx: &mut StepContext<'_>, ()| {
                evaluate.evaluate_closure(ctx)
            })
    }

    /// One training step on a worker: the next batch of its dataset, the gradients of its
    /// replicas, recorded as one update; the batch's statistics.
    fn train_closure(&self, ctx: &mut StepContext<'_>) -> Result<Vec<f64>, StepError> {
        let element = ctx.next(&self.train_data)?;
        let (model, element) = self.model_for(ctx, element)?;
        let stats = Mutex::new(vec![0.0f64; stats_len(&self.metrics)]);
        let step_error: Mutex<Option<String>> = Mutex::new(None);
        model.train_step(ctx, &element, self.seed, |net, batch| {
            let element = batch.to_vec();
            let (x, y, weights) =
                split_element(&element).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let predictions = net.forward_t(x, true)?;
            let per_example = self
                .loss
                .per_example(&predictions, y)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            match batch_stats(
                &self.loss,
                &self.metrics,
                y,
                Some(&predictions.detach()),
                weights.clone(),
            ) {
                Ok(replica) => {
                    let replica = replica.to_vec1::<f64>()?;
                    let mut total = stats.lock().unwrap_or_else(|p| p.into_inner());
                    for (t, s) in total.iter_mut().zip(replica) {
                        *t += s;
                    }
                }
                Err(e) => {
                    *step_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string())
                }
            }
            let w = Tensor::new(weights.as_slice(), per_example.device())?;
            per_example.to_dtype(DType::F32)? * w
        })?;
        if let Some(e) = step_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(StepError::Step(e));
        }
        Ok(stats.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// The network with the servers' values for `element`: the tables read by rows hold only
    /// the rows its ids touch, and the ids (its first tensor) are renumbered into them.
    fn model_for(
        &self,
        ctx: &StepContext<'_>,
        mut element: Element,
    ) -> Result<(ServerModel<N>, Element), StepError> {
        if self.row_tables.is_empty() {
            return Ok((ServerModel::build(ctx, |vb| (self.build)(vb))?, element));
        }
        let ids = element
            .first()
            .cloned()
            .ok_or_else(|| StepError::Step("a batch with no tensors".into()))?;
        let reads: Vec<RowRead<'_>> = self
            .row_tables
            .iter()
            .map(|table| RowRead {
                variable: table,
                ids: &ids,
            })
            .collect();
        let (model, renumbered) =
            ServerModel::build_reading_rows(ctx, |vb| (self.build)(vb), &reads)?;
        // Every table is indexed by the same ids, so they are renumbered alike.
        if let Some(first) = renumbered.into_iter().next() {
            element[0] = first;
        }
        Ok((model, element))
    }

    /// One validation step on a worker: the next batch of its validation dataset, the
    /// network in inference mode; the batch's statistics.
    fn evaluate_closure(&self, ctx: &mut StepContext<'_>) -> Result<Vec<f64>, StepError> {
        let name = self
            .validation_data
            .as_deref()
            .ok_or_else(|| StepError::Step("no validation dataset was given".into()))?;
        let element = ctx.next(name)?;
        let (model, element) = self.model_for(ctx, element)?;
        let (x, y, weights) =
            split_element(&element).map_err(|e| StepError::Step(e.to_string()))?;
        let predictions = model.model().forward_t(x, false)?;
        let stats = batch_stats(&self.loss, &self.metrics, y, Some(&predictions), weights)
            .map_err(|e| StepError::Step(e.to_string()))?;
        Ok(stats.to_vec1::<f64>()?)
    }

    /// Trains on the cluster (Keras' `fit` with a `ParameterServerStrategy`): creates the
    /// variables on the servers, resumes from the newest backup where a [`BackupAndRestore`]
    /// has one, and runs `fit`'s epochs of `steps_per_epoch` closures (required: the data is
    /// per worker and runs on), each epoch's validation, and the callbacks, on the chief.
    pub fn fit(
        &self,
        coordinator: &mut ClusterCoordinator,
        fit: Fit,
    ) -> Result<History, KerasError> {
        let Fit {
            epochs,
            steps_per_epoch,
            validation_data,
            validation_steps,
            callbacks: user_callbacks,
            verbose,
            ..
        } = fit;
        let steps_per_epoch = steps_per_epoch.filter(|&n| n > 0).ok_or_else(|| {
            KerasError::Config(
                "fit under ParameterServerStrategy needs steps_per_epoch (each worker's data \
                 runs on)"
                    .into(),
            )
        })?;
        if epochs == 0 {
            return Err(KerasError::Config("fit: epochs must be at least 1".into()));
        }
        if let Some(schedule) = &self.schedule {
            schedule
                .validate()
                .map_err(|e| KerasError::Config(e.to_string()))?;
        }
        if validation_data.is_some() {
            return Err(KerasError::Config(
                "under ParameterServerStrategy the validation data is a registered dataset \
                 function (code never travels): give PsFit::validation_data(name)"
                    .into(),
            ));
        }
        let validation_steps = match (&self.validation_data, validation_steps) {
            (Some(_), Some(n)) if n > 0 => n,
            (Some(_), _) => {
                return Err(KerasError::Config(
                    "fit under ParameterServerStrategy with validation needs validation_steps"
                        .into(),
                ))
            }
            (None, _) => 0,
        };
        let mut callbacks: Vec<Box<dyn Callback>> = Vec::with_capacity(user_callbacks.len() + 1);
        if verbose {
            callbacks.push(Box::new(ProgbarLogger::stderr()));
        }
        callbacks.extend(user_callbacks);
        let backup_index = callbacks.iter_mut().position(|c| c.as_backup().is_some());

        let build = Arc::clone(&self.build);
        let partitioner = Arc::clone(&self.partitioner);
        ServerModel::create_variables(
            coordinator,
            self.seed,
            |vb| build(vb),
            |n, s| partitioner(n, s),
        )
        .map_err(coordinator_error)?;
        // The chief's copy of the weights, for the callbacks: read from the servers at each
        // epoch's end.
        let copy = ModelVariables::new(self.seed);
        (self.build)(copy.var_builder(0))
            .map_err(|e| KerasError::Config(format!("building the model: {e}")))?;
        let weights = copy.variables();
        let mut manager = match backup_index.and_then(|i| callbacks[i].as_backup()) {
            Some(backup) => Some(open_manager(backup)?),
            None => None,
        };
        let mut history = History::default();
        let mut step = 0u64;
        if let Some(manager) = manager.as_mut() {
            if let Some(restored) = coordinator
                .restore_checkpoint(manager)
                .map_err(coordinator_error)?
            {
                history.resumed_at = Some(restored);
                step = restored;
            }
        }
        coordinator
            .create_per_worker_dataset(&self.train_data)
            .map_err(coordinator_error)?;
        if let Some(name) = &self.validation_data {
            coordinator
                .create_per_worker_dataset(name)
                .map_err(coordinator_error)?;
        }

        // The servers apply the gradients; this one tells callbacks the rate (its count kept
        // at the step) and takes the rate a callback sets, for the coordinator.
        let mut optimizer = DistributedOptimizer::new(self.optimizer);
        if let Some(schedule) = &self.schedule {
            optimizer = optimizer.with_schedule(schedule.clone())?;
        }
        let mut rate_on_servers = optimizer.schedule();
        let started = Instant::now();
        let mut stop_training = false;
        let mut last_logs = Logs::new();
        let mut epoch = (step / steps_per_epoch as u64) as usize;
        macro_rules! context {
            ($within:expr) => {{
                optimizer.set_iterations(step, 1);
                TrainingContext {
                    optimizer: &optimizer,
                    variables: &weights,
                    is_chief: true,
                    stop_training,
                    step,
                    step_in_epoch: $within,
                    epochs,
                    steps_per_epoch: Some(steps_per_epoch),
                    weights_set: false,
                }
            }};
        }
        macro_rules! each_callback {
            ($within:expr, |$cb:ident, $ctx:ident| $body:expr) => {{
                let mut $ctx = context!($within);
                for $cb in callbacks.iter_mut() {
                    $body?;
                }
                stop_training = $ctx.stop_training;
                if $ctx.weights_set {
                    write_weights(coordinator, &weights)?;
                }
                // A rate a callback set: the closures scheduled from now on carry it.
                if optimizer.schedule() != rate_on_servers {
                    rate_on_servers = optimizer.schedule();
                    coordinator
                        .set_learning_rate(optimizer.learning_rate())
                        .map_err(coordinator_error)?;
                }
            }};
        }
        each_callback!(0, |cb, ctx| cb.on_train_begin(&mut ctx));
        while epoch < epochs && !stop_training {
            let epoch_start = epoch as u64 * steps_per_epoch as u64;
            let epoch_end = epoch_start + steps_per_epoch as u64;
            each_callback!((step - epoch_start) as usize, |cb, ctx| cb
                .on_epoch_begin(epoch, &mut ctx));
            let mut totals = vec![0.0f64; stats_len(&self.metrics)];
            while step < epoch_end && !stop_training {
                // Up to the next backup (which needs every closure before it committed).
                let chunk_end = match backup_every(&mut callbacks, backup_index) {
                    Some(n) => epoch_end.min((step / n + 1) * n),
                    None => epoch_end,
                };
                let per_closure = u64::from(self.steps_per_execution);
                let values = (step..chunk_end)
                    .step_by(per_closure as usize)
                    .map(|s| {
                        let steps = per_closure.min(chunk_end - s) as u32;
                        coordinator
                            .schedule(&TRAIN, (s, steps))
                            .map(|value| (steps, value))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(coordinator_error)?;
                for (steps, value) in &values {
                    let stats = coordinator.fetch(value).map_err(coordinator_error)?;
                    for (t, s) in totals.iter_mut().zip(stats) {
                        *t += s;
                    }
                    step += u64::from(*steps);
                    let logs = logs_of(&self.metrics, &totals);
                    each_callback!((step - epoch_start) as usize, |cb, ctx| cb
                        .on_train_batch_end(step, &logs, &mut ctx));
                }
                coordinator.join().map_err(coordinator_error)?;
                if let (Some(manager), Some(_)) =
                    (manager.as_mut(), backup_every(&mut callbacks, backup_index))
                {
                    if manager.should_save(step, Instant::now()) {
                        coordinator
                            .save_checkpoint(manager, step)
                            .map_err(coordinator_error)?;
                    }
                }
            }
            let mut logs = logs_of(&self.metrics, &totals);
            // The rate in force at the epoch's end (the schedule's at the step, or the rate a
            // callback set), as Keras logs it.
            optimizer.set_iterations(step, 1);
            logs.insert("learning_rate", f64::from(optimizer.learning_rate()));
            if validation_steps > 0 {
                let values = (0..validation_steps)
                    .map(|_| coordinator.schedule(&EVALUATE, ()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(coordinator_error)?;
                let mut val = vec![0.0f64; stats_len(&self.metrics)];
                for value in &values {
                    for (t, s) in val
                        .iter_mut()
                        .zip(coordinator.fetch(value).map_err(coordinator_error)?)
                    {
                        *t += s;
                    }
                }
                logs.extend_prefixed("val_", &logs_of(&self.metrics, &val));
            }
            read_weights(coordinator, &weights)?;
            each_callback!((step - epoch_start) as usize, |cb, ctx| cb
                .on_epoch_end(epoch, &logs, &mut ctx));
            history.epochs.push(logs.clone());
            history.epoch_numbers.push(epoch);
            last_logs = logs;
            if let (Some(manager), Some(backup)) = (
                manager.as_mut(),
                backup_index.and_then(|i| callbacks[i].as_backup()),
            ) {
                if backup.frequency() == SaveFreq::Epoch {
                    coordinator.join().map_err(coordinator_error)?;
                    coordinator
                        .save_checkpoint(manager, step)
                        .map_err(coordinator_error)?;
                }
            }
            epoch += 1;
        }
        coordinator.join().map_err(coordinator_error)?;
        history.step = step;
        history.stopped_early = stop_training;
        read_weights(coordinator, &weights)?;
        let mut ctx = context!(0);
        for cb in callbacks.iter_mut() {
            cb.on_train_end(&last_logs, &mut ctx)?;
        }
        if ctx.weights_set {
            write_weights(coordinator, &weights)?;
        }
        if let Some(backup) = backup_index.and_then(|i| callbacks[i].as_backup()) {
            drop(manager);
            backup.finish(true)?;
        }
        tracing::info!(
            steps = step,
            seconds = started.elapsed().as_secs_f64(),
            "fit on the parameter servers ended"
        );
        Ok(history)
    }
}

/// Sets the chief's copy `weights` to the servers' values (every closure scheduled before
/// joined: a consistent cut).
fn read_weights(
    coordinator: &ClusterCoordinator,
    weights: &[crate::variable::Variable],
) -> Result<(), KerasError> {
    coordinator.join().map_err(coordinator_error)?;
    for variable in weights {
        let values = coordinator
            .read_variable(variable.name())
            .map_err(coordinator_error)?;
        let value = Tensor::from_vec(values, variable.shape(), &candle_core::Device::Cpu)?;
        variable.assign(&value)?;
    }
    Ok(())
}

/// Writes the chief's copy `weights`, which a callback set, to the servers, once every
/// closure scheduled before finished.
fn write_weights(
    coordinator: &ClusterCoordinator,
    weights: &[crate::variable::Variable],
) -> Result<(), KerasError> {
    coordinator.join().map_err(coordinator_error)?;
    for variable in weights {
        let values = variable
            .read_value()
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        coordinator
            .assign_variable(variable.name(), &values)
            .map_err(coordinator_error)?;
    }
    Ok(())
}

/// The cadence of step backups, if the backup saves by steps.
fn backup_every(callbacks: &mut [Box<dyn Callback>], index: Option<usize>) -> Option<u64> {
    match index
        .and_then(|i| callbacks[i].as_backup())
        .map(|b| b.frequency())
    {
        Some(SaveFreq::Steps(n)) => Some(n.max(1)),
        _ => None,
    }
}

fn open_manager(backup: &BackupAndRestore) -> Result<CheckpointManager, KerasError> {
    let policy = CheckpointPolicy {
        save_every_steps: match backup.frequency() {
            SaveFreq::Steps(n) => Some(n.max(1)),
            SaveFreq::Epoch => None,
        },
        save_every: None,
        keep_last: 2,
    };
    CheckpointManager::new(backup.dir(), policy, Instant::now()).map_err(|source| {
        KerasError::Backup {
            dir: backup.dir().to_path_buf(),
            source: Box::new(StateCheckpointError::Policy {
                dir: backup.dir().to_path_buf(),
                source,
            }),
        }
    })
}

fn coordinator_error(e: crate::program::CoordinatorError) -> KerasError {
    KerasError::Cluster(e)
}
