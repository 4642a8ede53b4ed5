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

use super::callbacks::{BackupAndRestore, Callback, CallbackList, SaveFreq, TrainingContext};
use super::fit_loop::validates_after;
use super::metrics::Metric;
use super::model::{batch_stats, logs_of, split_element, stats_len, stats_of};
use super::{Fit, History, KerasError, Logs, Loss, Misuse};
use crate::checkpoint::{CheckpointManager, CheckpointPolicy};
use crate::data::Element;
use crate::nn::ModelVariables;
use crate::optim::{LearningRateSchedule, Optimizer, OptimizerScopes};
use crate::program::{
    ClusterCoordinator, CoordinatorError, DatasetHandle, Program, RowRead, ServerModel, Step,
    StepContext, StepError,
};
use crate::train::{
    figures_from_json, figures_to_json, DistributedOptimizer, StateCheckpointError,
};
use crate::variable::{Partitioner, Variable};

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
    /// Optimizers given for name scopes, in place of `optimizer` there.
    scopes: OptimizerScopes,
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
            scopes: OptimizerScopes::new(),
            steps_per_execution: 1,
        }
    }

    /// The servers update the variables of name scope `scope` (candle-nn's prefix, say
    /// `embedding`) with `optimizer` instead of `fit`'s, at its own constant rate (see
    /// `Program::optimizer_for`): an embedding table by Adagrad and the dense layers by Adam,
    /// as wide-and-deep models are trained ([`PsFit::optimizer_for_scheduled`]: following a
    /// schedule of its own). The schedule and the logs' `learning_rate` are `fit`'s
    /// optimizer's.
    pub fn optimizer_for(mut self, scope: impl Into<String>, optimizer: Optimizer) -> Self {
        self.scopes.insert(scope, optimizer);
        self
    }

    /// [`PsFit::optimizer_for`], the scope's rate following `schedule` of each variable's
    /// update count instead of the optimizer's constant rate (see
    /// `Program::optimizer_for_scheduled`).
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
        let program = program
            .optimizer(self.optimizer)
            .optimizer_scopes(&self.scopes);
        program
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
            match stats_of(
                &per_example,
                &self.metrics,
                y,
                &predictions.detach(),
                &weights,
            ) {
                Ok(replica) => {
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
        PsFitLoop::start(self, coordinator, fit)?.run()
    }
}

/// One `PsFit::fit` on the chief: its arguments, the chief's copy of the weights, the
/// backup's checkpoints, and where training stands.
struct PsFitLoop<'a, N> {
    fit: &'a PsFit<N>,
    coordinator: &'a mut ClusterCoordinator,
    epochs: usize,
    steps_per_epoch: usize,
    /// Validation closures per validated epoch (0: no validation).
    validation_steps: usize,
    /// Validates after every this many epochs.
    validation_freq: usize,
    callbacks: CallbackList,
    /// The backup's checkpoints, which the coordinator saves, where a backup was given.
    manager: Option<CheckpointManager>,
    /// The chief's copy of the weights, for the callbacks: read from the servers at each
    /// epoch's end.
    weights: Vec<Variable>,
    /// The servers apply the gradients; this one tells callbacks the rate (its count kept at
    /// the step) and takes the rate a callback sets, for the coordinator.
    optimizer: DistributedOptimizer,
    /// The rate the closures scheduled now carry.
    rate_on_servers: LearningRateSchedule,
    /// In a chief that resumed inside an epoch, the rate that epoch ran at before (the one its
    /// backup recorded), for after the epoch's callbacks run again ([`Self::run_epoch`]).
    resumed_rate: Option<f32>,
    /// In a chief that resumed inside an epoch, that epoch's figures before the backup (the
    /// sums its closures returned), for its totals ([`Self::run_epoch`]).
    resumed_figures: Option<Vec<f64>>,
    history: History,
    /// Updates applied since the job began.
    step: u64,
    epoch: usize,
    stop_training: bool,
    last_logs: Logs,
    /// When training began (after the variables and datasets were created), for the log.
    started: Instant,
}

impl<'a, N: ModuleT + Send + Sync + 'static> PsFitLoop<'a, N> {
    /// Checks `fit`'s arguments, creates the variables on the servers, restores the newest
    /// backup, and creates the per-worker datasets.
    fn start(
        ps_fit: &'a PsFit<N>,
        coordinator: &'a mut ClusterCoordinator,
        fit: Fit,
    ) -> Result<Self, KerasError> {
        let Fit {
            epochs,
            steps_per_epoch,
            validation_data,
            validation_steps,
            validation_freq,
            callbacks,
            verbose,
            ..
        } = fit;
        let steps_per_epoch = steps_per_epoch
            .filter(|&n| n > 0)
            .ok_or(Misuse::PsNeedsStepsPerEpoch)?;
        if epochs == 0 {
            return Err(Misuse::NoEpochs.into());
        }
        if validation_freq == 0 {
            return Err(Misuse::NoValidationFreq.into());
        }
        if let Some(schedule) = &ps_fit.schedule {
            schedule.validate()?;
        }
        if validation_data.is_some() {
            return Err(Misuse::PsValidationData.into());
        }
        let validation_steps = match (&ps_fit.validation_data, validation_steps) {
            (Some(_), Some(n)) if n > 0 => n,
            (Some(_), _) => return Err(Misuse::PsNeedsValidationSteps.into()),
            (None, _) => 0,
        };
        let mut callbacks = CallbackList::new(callbacks, verbose);
        let build = Arc::clone(&ps_fit.build);
        let partitioner = Arc::clone(&ps_fit.partitioner);
        ServerModel::create_variables(
            coordinator,
            ps_fit.seed,
            |vb| build(vb),
            |n, s| partitioner(n, s),
        )?;
        let copy = ModelVariables::new(ps_fit.seed);
        (ps_fit.build)(copy.var_builder(0)).map_err(KerasError::Build)?;
        let manager = callbacks.backup().map(|b| open_manager(b)).transpose()?;
        let mut optimizer = DistributedOptimizer::new(ps_fit.optimizer);
        if let Some(schedule) = &ps_fit.schedule {
            optimizer = optimizer.with_schedule(schedule.clone())?;
        }
        let rate_on_servers = optimizer.schedule();
        let mut run = Self {
            fit: ps_fit,
            coordinator,
            epochs,
            steps_per_epoch,
            validation_steps,
            validation_freq,
            callbacks,
            manager,
            weights: copy.variables(),
            optimizer,
            rate_on_servers,
            resumed_rate: None,
            resumed_figures: None,
            history: History::default(),
            step: 0,
            epoch: 0,
            stop_training: false,
            last_logs: Logs::new(),
            started: Instant::now(),
        };
        run.resume_or_back_up()?;
        run.epoch = (run.step / steps_per_epoch as u64) as usize;
        run.coordinator
            .create_per_worker_dataset(&ps_fit.train_data)?;
        if let Some(name) = &ps_fit.validation_data {
            run.coordinator.create_per_worker_dataset(name)?;
        }
        // The log's training time starts here, after the variables and datasets exist.
        run.started = Instant::now();
        Ok(run)
    }

    /// With a backup: resumes from the newest one (the step, and the rate a callback had set),
    /// or, starting afresh, saves one of the variables as created before the first step: a
    /// parameter server lost before the first scheduled backup is restored from it, and a
    /// chief lost then resumes from it (with none, either loss ends the job once the servers
    /// applied a step: nothing accounts for what they hold).
    fn resume_or_back_up(&mut self) -> Result<(), KerasError> {
        let Some(manager) = self.manager.as_mut() else {
            return Ok(());
        };
        let Some(restored) = self.coordinator.restore_checkpoint(manager)? else {
            return save_before_training(self.coordinator, manager);
        };
        self.history.resumed_at = Some(restored);
        self.step = restored;
        // The rate a callback had set (`LearningRateScheduler`) came back with the backup.
        // Resumed at an epoch's start, the callbacks go on from it (as Keras restores its
        // optimizer's rate); inside an epoch, whose callbacks run again, it is the rate that
        // epoch ran at, set once they ran, so that a rate a callback makes from the one before
        // is not made twice.
        let inside_an_epoch = restored % self.steps_per_epoch as u64 != 0;
        if inside_an_epoch {
            self.resumed_figures = recorded_figures(self.coordinator, restored)?;
        }
        if let Some(rate) = self.coordinator.learning_rate()? {
            if !inside_an_epoch {
                self.optimizer.set_learning_rate(rate)?;
                self.rate_on_servers = self.optimizer.schedule();
            } else {
                self.resumed_rate = Some(rate);
            }
        }
        Ok(())
    }

    /// Trains to the end (see [`PsFit::fit`]).
    fn run(mut self) -> Result<History, KerasError> {
        self.each_callback(0, |cb, ctx| cb.on_train_begin(ctx))?;
        while self.epoch < self.epochs && !self.stop_training {
            self.run_epoch()?;
        }
        self.finish()
    }

    /// The first step of the current epoch.
    fn epoch_start(&self) -> u64 {
        self.epoch as u64 * self.steps_per_epoch as u64
    }

    /// Runs `hook` on every callback, with the context of this moment (`within` steps into
    /// the epoch); writes the weights a callback set to the servers.
    fn run_callbacks(
        &mut self,
        within: usize,
        hook: impl FnMut(&mut dyn Callback, &mut TrainingContext<'_>) -> Result<(), KerasError>,
    ) -> Result<(), KerasError> {
        self.optimizer.set_iterations(self.step, 1);
        let mut ctx = TrainingContext {
            optimizer: &self.optimizer,
            variables: &self.weights,
            is_chief: true,
            stop_training: self.stop_training,
            step: self.step,
            step_in_epoch: within,
            epochs: self.epochs,
            steps_per_epoch: Some(self.steps_per_epoch),
            weights_set: false,
        };
        self.callbacks.each(&mut ctx, hook)?;
        self.stop_training = ctx.stop_training;
        if ctx.weights_set {
            write_weights(self.coordinator, &self.weights)?;
        }
        Ok(())
    }

    /// [`PsFitLoop::run_callbacks`], then the rate a callback set handed to the coordinator:
    /// the closures scheduled from now on carry it.
    fn each_callback(
        &mut self,
        within: usize,
        hook: impl FnMut(&mut dyn Callback, &mut TrainingContext<'_>) -> Result<(), KerasError>,
    ) -> Result<(), KerasError> {
        self.run_callbacks(within, hook)?;
        self.rate_to_servers()
    }

    /// Hands the optimizer's rate to the coordinator where it changed: the closures scheduled
    /// from now on carry it.
    fn rate_to_servers(&mut self) -> Result<(), KerasError> {
        if self.optimizer.schedule() != self.rate_on_servers {
            self.rate_on_servers = self.optimizer.schedule();
            self.coordinator
                .set_learning_rate(self.optimizer.learning_rate())?;
        }
        Ok(())
    }

    /// One epoch: its closures, its validation, the chief's copy of the weights read, the
    /// callbacks, and the epoch's backup.
    fn run_epoch(&mut self) -> Result<(), KerasError> {
        let epoch = self.epoch;
        let epoch_end = self.epoch_start() + self.steps_per_epoch as u64;
        let within = (self.step - self.epoch_start()) as usize;
        self.each_callback(within, |cb, ctx| cb.on_epoch_begin(epoch, ctx))?;
        if let Some(rate) = self.resumed_rate.take() {
            self.optimizer.set_learning_rate(rate)?;
            self.rate_to_servers()?;
        }
        let mut totals = vec![0.0f64; stats_len(&self.fit.metrics)];
        // Resumed inside this epoch: its figures before the backup count too.
        if let Some(figures) = self.resumed_figures.take() {
            if figures.len() == totals.len() {
                totals = figures;
            }
        }
        while self.step < epoch_end && !self.stop_training {
            self.train_until_backup(epoch_end, &mut totals)?;
        }
        let mut logs = logs_of(&self.fit.metrics, &totals);
        // The rate in force at the epoch's end (the schedule's at the step, or the rate a
        // callback set), as Keras logs it.
        self.optimizer.set_iterations(self.step, 1);
        logs.insert("learning_rate", f64::from(self.optimizer.learning_rate()));
        self.validate(&mut logs)?;
        read_weights(self.coordinator, &self.weights)?;
        let within = (self.step - self.epoch_start()) as usize;
        self.each_callback(within, |cb, ctx| cb.on_epoch_end(epoch, &logs, ctx))?;
        self.history.epochs.push(logs.clone());
        self.history.epoch_numbers.push(epoch);
        self.last_logs = logs;
        let by_epoch = self
            .callbacks
            .backup()
            .is_some_and(|b| b.frequency() == SaveFreq::Epoch);
        if let (Some(manager), true) = (self.manager.as_mut(), by_epoch) {
            self.coordinator.join()?;
            self.coordinator.save_checkpoint(manager, self.step)?;
        }
        self.epoch += 1;
        Ok(())
    }

    /// The closures up to the next step backup (which needs every closure before it
    /// committed) or `epoch_end`, their statistics added to `totals`; then the backup where
    /// due.
    fn train_until_backup(&mut self, epoch_end: u64, totals: &mut [f64]) -> Result<(), KerasError> {
        let backup_every = self.callbacks.backup_every_steps();
        let chunk_end = match backup_every {
            Some(n) => epoch_end.min((self.step / n + 1) * n),
            None => epoch_end,
        };
        let per_closure = u64::from(self.fit.steps_per_execution);
        let values = (self.step..chunk_end)
            .step_by(per_closure as usize)
            .map(|s| {
                let steps = per_closure.min(chunk_end - s) as u32;
                self.coordinator
                    .schedule(&TRAIN, (s, steps))
                    .map(|value| (steps, value))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let epoch_start = self.epoch_start();
        for (steps, value) in &values {
            let stats = self.coordinator.fetch(value)?;
            for (t, s) in totals.iter_mut().zip(stats) {
                *t += s;
            }
            self.step += u64::from(*steps);
            let logs = logs_of(&self.fit.metrics, totals);
            let step = self.step;
            self.each_callback((step - epoch_start) as usize, |cb, ctx| {
                cb.on_train_batch_end(step, &logs, ctx)
            })?;
        }
        self.coordinator.join()?;
        if let (Some(manager), Some(_)) = (self.manager.as_mut(), backup_every) {
            if manager.should_save(self.step, Instant::now()) {
                // The epoch's figures so far go with it: a chief that resumes from it inside
                // this epoch counts them (every closure before the cut was fetched).
                let state = serde_json::json!({ EPOCH_FIGURES_KEY: figures_to_json(totals) });
                self.coordinator
                    .save_checkpoint_with(manager, self.step, state)?;
            }
        }
        Ok(())
    }

    /// Adds the validation closures' figures to `logs`, where validation was asked for.
    fn validate(&mut self, logs: &mut Logs) -> Result<(), KerasError> {
        if self.validation_steps == 0 || !validates_after(self.epoch, self.validation_freq) {
            return Ok(());
        }
        let values = (0..self.validation_steps)
            .map(|_| self.coordinator.schedule(&EVALUATE, ()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut val = vec![0.0f64; stats_len(&self.fit.metrics)];
        for value in &values {
            for (t, s) in val.iter_mut().zip(self.coordinator.fetch(value)?) {
                *t += s;
            }
        }
        logs.extend_prefixed("val_", &logs_of(&self.fit.metrics, &val));
        Ok(())
    }

    /// The end of training: every closure joined, the chief's copy read, the callbacks'
    /// `on_train_end`, the backup's end.
    fn finish(mut self) -> Result<History, KerasError> {
        self.coordinator.join()?;
        self.history.step = self.step;
        self.history.stopped_early = self.stop_training;
        read_weights(self.coordinator, &self.weights)?;
        let logs = std::mem::take(&mut self.last_logs);
        self.run_callbacks(0, |cb, ctx| cb.on_train_end(&logs, ctx))?;
        // The backup's checkpoints are closed before the backup ends.
        self.manager = None;
        if let Some(backup) = self.callbacks.backup() {
            backup.finish(true)?;
        }
        tracing::info!(
            steps = self.step,
            seconds = self.started.elapsed().as_secs_f64(),
            "fit on the parameter servers ended"
        );
        Ok(self.history)
    }
}

/// Sets the chief's copy `weights` to the servers' values (every closure scheduled before
/// joined: a consistent cut).
fn read_weights(
    coordinator: &ClusterCoordinator,
    weights: &[crate::variable::Variable],
) -> Result<(), KerasError> {
    coordinator.join()?;
    for variable in weights {
        let values = coordinator.read_variable(variable.name())?;
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
    coordinator.join()?;
    for variable in weights {
        let values = variable
            .read_value()
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        coordinator.assign_variable(variable.name(), &values)?;
    }
    Ok(())
}

/// Where `PsFit` keeps the epoch's running figures in a backup's program state
/// ([`ClusterCoordinator::save_checkpoint_with`]).
const EPOCH_FIGURES_KEY: &str = "epoch_figures";

/// The epoch's figures the backup of step `step` that `coordinator` restored recorded; `None`
/// where it recorded none (a backup from before they were kept).
fn recorded_figures(
    coordinator: &ClusterCoordinator,
    step: u64,
) -> Result<Option<Vec<f64>>, KerasError> {
    let Some(state) = coordinator.restored_program_state() else {
        return Ok(None);
    };
    let Some(value) = state.get(EPOCH_FIGURES_KEY) else {
        return Ok(None);
    };
    figures_from_json(value)
        .map(Some)
        .ok_or_else(|| KerasError::RecordedFigures {
            step,
            key: EPOCH_FIGURES_KEY,
            found: value.clone(),
        })
}

/// The backup before the first step ([`PsFitLoop::start`]). One that cannot be written (a full
/// disk, say) is logged and training goes on without it, as it would have before the first
/// scheduled backup; any other failure is the job's.
fn save_before_training(
    coordinator: &ClusterCoordinator,
    manager: &mut CheckpointManager,
) -> Result<(), KerasError> {
    match coordinator.save_checkpoint(manager, 0) {
        Ok(dir) => tracing::debug!("backup before training: {}", dir.display()),
        Err(CoordinatorError::Checkpoint(e)) => tracing::warn!(
            "the backup before training was not saved: {e}; a parameter server or the chief \
             lost before the first scheduled backup ends the job"
        ),
        Err(e) => return Err(e.into()),
    }
    Ok(())
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
