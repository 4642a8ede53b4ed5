//! The loop of [`Model::fit`] (its arguments and what it returns are in `fit.rs`): where
//! training stands, each step boundary, each step, each epoch's end and each re-forming of
//! the group, as methods of one [`FitLoop`].
//!
//! Where training stands is two numbers, the ones `MultiWorkerMirrored` carries over a
//! re-forming and a backup stores: `step`, the updates applied since the job began, and the
//! input position, [`Cursor`]: which pass over the data (the order a seeded shuffle draws for
//! it) and how many batches of it were consumed. The epoch follows from them: with
//! `steps_per_epoch`, `step / steps_per_epoch` (the data runs on across epochs, as in Keras);
//! without, an epoch is one pass.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use candle_core::Tensor;
use candle_nn::ModuleT;

use super::callbacks::{Callback, CallbackList, SaveFreq, TrainingContext};
use super::metrics::Metric;
use super::model::{first_stats, logs_of, split_element, stats_len, stats_of};
use super::{Fit, History, KerasError, Logs, Loss, Misuse, Model};
use crate::data::{AutoShardPolicy, Dataset, DistributeOptions, DistributedDataset, Element};
use crate::optim::OptimizerState;
use crate::strategy::{
    Ballot, CastVote, CountedVote, Departure, ElasticState, EpochProgress, GroupChange, Leave,
    PerReplica, SaveStateError, StrategyExt,
};
use crate::train::{DistributedOptimizer, ReplicatedModel, StepSpec, TrainError};
use crate::variable::Variable;

/// The input position: pass `pass` over the data, `batches` of it consumed. Stored as one
/// `u64` (pass in the high 32 bits) where `MultiWorkerMirrored` and the backups keep a
/// position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cursor {
    pass: u64,
    batches: u64,
}

impl Cursor {
    fn encode(self) -> u64 {
        (self.pass << 32) | (self.batches & 0xFFFF_FFFF)
    }
    fn decode(position: u64) -> Self {
        Self {
            pass: position >> 32,
            batches: position & 0xFFFF_FFFF,
        }
    }
    fn next_pass(self) -> Self {
        Self {
            pass: self.pass + 1,
            batches: 0,
        }
    }
}

/// The state handed to the strategy (a step boundary, a re-forming) and to the backups.
fn elastic_state<'a>(
    step: u64,
    cursor: Cursor,
    epochs: EpochProgress,
    variables: &'a [Variable],
    optimizer: &'a DistributedOptimizer,
) -> ElasticState<'a> {
    ElasticState {
        step,
        position: cursor.encode(),
        variables,
        optimizer: Some(optimizer),
        epochs,
    }
}

/// What the start of `epoch` owes the learning rate on a worker that took its state from
/// another (a backup, a joiner's admission, a re-forming), given the training epochs begun
/// where the state came from (`carried`) and whether `epoch` had begun here (`open`). The
/// optimizer holds the carried rate by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochStart {
    /// `epoch` had begun here and there: nothing is owed but the carried figures (the state's
    /// step may be ahead of this worker's).
    Begun,
    /// `epoch` had begun there, not here: its callbacks run here (they log, they open the
    /// epoch) and the carried rate, already the epoch's, is put back after them, so that a
    /// schedule that makes each rate from the one before is not applied twice; the epoch's
    /// figures so far are the carried ones.
    RunKeepingRate,
    /// `epoch` had not begun there: its callbacks run from the carried rate, here as there
    /// (again, where it had begun here).
    Run,
}

impl EpochStart {
    fn of(epoch: usize, open: bool, carried: u64) -> Self {
        match (carried > epoch as u64, open) {
            (true, true) => Self::Begun,
            (true, false) => Self::RunKeepingRate,
            (false, _) => Self::Run,
        }
    }
}

/// Whether the epoch numbered `epoch` (from 0) is validated under `validation_freq`.
pub(super) fn validates_after(epoch: usize, validation_freq: usize) -> bool {
    validation_freq > 0 && (epoch + 1) % validation_freq == 0
}

/// What a step boundary leaves `fit` to do.
enum Boundary {
    /// Take the next step.
    Step,
    /// Training is over: the closing boundary passed.
    Finished,
    /// The group changed (a joiner admitted, a worker departed or lost): go on with the new
    /// one, from the agreed step.
    Regroup,
    /// This worker left the group on its notice or drain.
    Left(Departure),
}

/// One `fit`: its arguments, the model's parts it trains, and where training stands.
pub(super) struct FitLoop<'m, N> {
    model: &'m mut Model<N>,
    data: &'m Dataset,
    epochs: usize,
    steps_per_epoch: Option<usize>,
    validation_data: Option<Dataset>,
    validation_steps: Option<usize>,
    validation_freq: usize,
    distribute: DistributeOptions,
    notice: Option<Arc<AtomicBool>>,
    drain: Option<Arc<AtomicBool>>,
    callbacks: CallbackList,
    optimizer: Arc<DistributedOptimizer>,
    loss: Loss,
    metrics: Arc<[Box<dyn Metric>]>,
    /// The global batch where the dataset's batch dimension is static.
    static_batch: Option<usize>,
    variables: Vec<Variable>,
    network: Arc<ReplicatedModel<N>>,
    /// Rank 0 of the group now (it changes as the group re-forms): the one that writes.
    is_chief: bool,
    history: History,
    /// Updates applied since the job began.
    step: u64,
    cursor: Cursor,
    epoch: usize,
    step_in_epoch: usize,
    /// Steps per epoch where known: given, or counted in the first pass.
    known_steps: Option<usize>,
    stop_training: bool,
    /// Whether the current epoch's `on_epoch_begin` ran and its totals count.
    epoch_open: bool,
    /// The epoch's statistics so far (loss, examples, metrics), summed.
    totals: Vec<f64>,
    last_logs: Logs,
    /// The next boundary's votes, counted in the step before it (none after a group change:
    /// that boundary votes on its own, as the closing one does).
    counted_vote: Option<CountedVote>,
    /// Where the state this worker took last stood in its epochs, until the next boundary
    /// settles what the epoch's start owes ([`EpochStart`]) and takes its figures.
    carried_epochs: Option<EpochProgress>,
    /// A backup by steps fell due at the last step: it is written once it is known whether
    /// that step ended an epoch ([`FitLoop::write_due_step_backup`]).
    step_backup_due: bool,
}

impl<'m, N: ModuleT + Send + Sync + 'static> FitLoop<'m, N> {
    /// Checks `fit`'s arguments, builds a network built lazily, and resumes from the newest
    /// backup on a fresh start (a joiner takes the live state at its first step boundary
    /// instead).
    pub(super) fn start(
        model: &'m mut Model<N>,
        data: &'m Dataset,
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
            distribute,
            notice,
            drain,
        } = fit;
        if epochs == 0 {
            return Err(Misuse::NoEpochs.into());
        }
        if validation_freq == 0 {
            return Err(Misuse::NoValidationFreq.into());
        }
        if steps_per_epoch == Some(0) {
            return Err(Misuse::NoStepsPerEpoch.into());
        }
        let compiled = model
            .compiled
            .as_ref()
            .ok_or(KerasError::NotCompiled("fit"))?;
        let optimizer = Arc::clone(&compiled.optimizer);
        let loss = compiled.loss.clone();
        let metrics = Arc::clone(&compiled.metrics);
        let static_batch = data
            .element_spec()
            .first()
            .and_then(|spec| spec.shape.first().copied().flatten());
        // A network built lazily creates its variables now, before anything counts on them.
        model.build_if_unbuilt(data)?;
        let variables = model.variables();
        let network = Arc::clone(model.replicated());
        let is_chief = model.model_strategy().is_chief();
        let totals = vec![0.0f64; stats_len(&metrics)];
        let mut run = Self {
            model,
            data,
            epochs,
            steps_per_epoch,
            validation_data,
            validation_steps,
            validation_freq,
            distribute,
            notice,
            drain,
            callbacks: CallbackList::new(callbacks, verbose),
            optimizer,
            loss,
            metrics,
            static_batch,
            variables,
            network,
            is_chief,
            history: History::default(),
            step: 0,
            cursor: Cursor::default(),
            epoch: 0,
            step_in_epoch: 0,
            known_steps: steps_per_epoch,
            stop_training: false,
            epoch_open: false,
            totals,
            last_logs: Logs::new(),
            counted_vote: None,
            carried_epochs: None,
            step_backup_due: false,
        };
        run.resume_from_backup()?;
        (run.epoch, run.step_in_epoch) = run.epoch_at();
        Ok(run)
    }

    /// Trains to the end (see [`Model::fit`]).
    ///
    /// Each pass of 'group trains with one group; the last boundary comes after the last step
    /// (the closing boundary): under MultiWorkerMirrored a worker that applied the last step
    /// while the others failed it (a ring delivers a step to some members and not to others)
    /// meets them there and gives them its state, instead of ending with a model they do not
    /// hold.
    pub(super) fn run(mut self) -> Result<History, KerasError> {
        self.each_callback(|cb, ctx| cb.on_train_begin(ctx))?;
        'group: loop {
            let distributed = self.distribute_data()?;
            // Made at the first step of this group (none where only the closing boundary is
            // left).
            let mut iter = None;
            loop {
                match self.boundary()? {
                    Boundary::Step => {}
                    Boundary::Finished => break 'group,
                    Boundary::Regroup => continue 'group,
                    Boundary::Left(departure) => {
                        // A drained chief leaves without the departure's backup: the one due
                        // at its last step is still written.
                        self.write_due_step_backup()?;
                        self.history.left = Some(departure);
                        self.history.step = self.step;
                        return Ok(self.history);
                    }
                }
                let iter = match &mut iter {
                    Some(iter) => iter,
                    None => iter
                        .insert(distributed.iter_at_pass(self.cursor.pass, self.cursor.batches)?),
                };
                let Some(batch) = iter.get_next_as_optional()? else {
                    self.end_pass()?;
                    self.write_due_step_backup()?;
                    continue 'group;
                };
                self.write_due_step_backup()?;
                if !self.step(batch)? {
                    continue 'group;
                }
            }
        }
        self.finish()
    }

    /// The epoch and the step within it that `step` and the cursor fall in.
    fn epoch_at(&self) -> (usize, usize) {
        match self.steps_per_epoch {
            Some(n) => (
                (self.step / n as u64) as usize,
                (self.step % n as u64) as usize,
            ),
            None => (self.cursor.pass as usize, self.cursor.batches as usize),
        }
    }

    /// Where training stands in its epochs: those begun (the current one once its callbacks
    /// ran) and, within a begun one, its figures so far.
    fn epochs(&self) -> EpochProgress {
        EpochProgress {
            begun: self.epoch as u64 + u64::from(self.epoch_open),
            figures: if self.epoch_open {
                self.totals.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// Goes on from a state taken from another worker or a backup (the optimizer's part is in
    /// place already): its step and input position, and where it stood in its epochs, which
    /// the next boundary settles ([`FitLoop::begin_epoch`]).
    fn take_state(&mut self, step: u64, position: u64, epochs: EpochProgress) {
        self.step = step;
        self.cursor = Cursor::decode(position);
        self.carried_epochs = Some(epochs);
    }

    /// Begins the current epoch where it has not begun here: its callbacks' `on_epoch_begin`
    /// (a `LearningRateScheduler` sets the epoch's rate), as the state taken last owes it
    /// ([`EpochStart`]).
    fn begin_epoch(&mut self) -> Result<(), KerasError> {
        let carried = self.carried_epochs.take();
        let start = match &carried {
            Some(carried) => EpochStart::of(self.epoch, self.epoch_open, carried.begun),
            None if self.epoch_open => EpochStart::Begun,
            None => EpochStart::Run,
        };
        // Where the epoch had begun, its figures so far are the state's (the same on every
        // worker that held it).
        let epoch = self.epoch;
        let figures = carried
            .filter(|c| c.begun > epoch as u64 && c.figures.len() == self.totals.len())
            .map(|c| c.figures);
        let keep = match start {
            EpochStart::Begun => {
                if let Some(figures) = figures {
                    self.totals = figures;
                }
                return Ok(());
            }
            EpochStart::RunKeepingRate => Some(self.optimizer.schedule()),
            EpochStart::Run => None,
        };
        self.totals.iter_mut().for_each(|t| *t = 0.0);
        self.epoch_open = true;
        self.each_callback(|cb, ctx| cb.on_epoch_begin(epoch, ctx))?;
        if let Some(schedule) = keep {
            self.optimizer
                .set_learning_rate_schedule(schedule)
                .map_err(TrainError::from)?;
        }
        if let Some(figures) = figures {
            self.totals = figures;
        }
        Ok(())
    }

    /// Runs `hook` on every callback, with the context of this moment.
    fn each_callback(
        &mut self,
        hook: impl FnMut(&mut dyn Callback, &mut TrainingContext<'_>) -> Result<(), KerasError>,
    ) -> Result<(), KerasError> {
        let mut ctx = TrainingContext {
            optimizer: &self.optimizer,
            variables: &self.variables,
            is_chief: self.is_chief,
            stop_training: self.stop_training,
            step: self.step,
            step_in_epoch: self.step_in_epoch,
            epochs: self.epochs,
            steps_per_epoch: self.known_steps,
            weights_set: false,
        };
        self.callbacks.each(&mut ctx, hook)?;
        self.stop_training = ctx.stop_training;
        Ok(())
    }

    /// A fresh start resumes from the newest backup (the chief's, given to every worker).
    fn resume_from_backup(&mut self) -> Result<(), KerasError> {
        if self.model.model_strategy().awaits_state() {
            return Ok(());
        }
        let local_copies = self.model.strategy().local_replicas().len();
        let Some(backup) = self.callbacks.backup() else {
            return Ok(());
        };
        let mut state = elastic_state(
            0,
            Cursor::default(),
            EpochProgress::default(),
            &self.variables,
            &self.optimizer,
        );
        if self.is_chief {
            let dir = backup.dir().to_path_buf();
            backup
                .checkpoints()?
                .restore_into(&mut state, local_copies)
                .map_err(|source| KerasError::Backup {
                    dir,
                    source: Box::new(source),
                })?;
        }
        // A worker lost while the restored state is handed out leaves the others with part of
        // it: fail, and let the job start again (restoring again).
        self.model.model_strategy().agree(&mut state)?;
        if state.step > 0 || state.position > 0 {
            self.history.resumed_at = Some(state.step);
            tracing::info!(step = state.step, "fit resumes from a backup");
        }
        self.take_state(state.step, state.position, state.epochs.clone());
        Ok(())
    }

    /// The data distributed over the group of this moment.
    fn distribute_data(&self) -> Result<DistributedDataset, KerasError> {
        let distributed = self
            .model
            .strategy()
            .experimental_distribute_dataset(self.data.clone(), self.distribute)?;
        if distributed.applied_shard_policy() == Some(AutoShardPolicy::File) {
            // Each worker would end its pass when its own files do, and the workers'
            // collectives would no longer pair.
            return Err(Misuse::ShardedByFiles.into());
        }
        Ok(distributed)
    }

    /// The step boundary: an epoch begun where one is due, joiners admitted, notices and
    /// drains honoured, a lost worker's group re-formed.
    fn boundary(&mut self) -> Result<Boundary, KerasError> {
        let finishing = self.epoch >= self.epochs || self.stop_training;
        self.is_chief = self.model.model_strategy().is_chief();
        if !finishing {
            self.begin_epoch()?;
        }
        let leaving = Leave::noticed(self.notice.as_deref(), self.drain.as_deref());
        let mut state = elastic_state(
            self.step,
            self.cursor,
            self.epochs(),
            &self.variables,
            &self.optimizer,
        );
        let mut backup = self.callbacks.backup();
        let mut save = |state: &ElasticState<'_>| -> Result<(), SaveStateError> {
            if let Some(backup) = backup.as_deref_mut() {
                backup.checkpoints()?.save(state)?;
            }
            Ok(())
        };
        // The closing boundary votes on its own: a worker that applied the last step meets
        // there those whose all-reduce failed it.
        let ballot = match self.counted_vote.take() {
            Some(counted) if !finishing => Ballot::Counted(counted),
            _ => Ballot::Now(leaving),
        };
        let change = self
            .model
            .model_strategy()
            .at_step_boundary(&mut state, ballot, &mut save);
        match change {
            Ok(None) if finishing => Ok(Boundary::Finished),
            Ok(None) => Ok(Boundary::Step),
            Ok(Some(GroupChange::Admitted(admission))) => {
                tracing::info!(step = admission.step, joined = ?admission.joined, "fit admitted workers to the group");
                let epochs = state.epochs.clone();
                self.take_state(admission.step, admission.position, epochs);
                self.resync();
                Ok(Boundary::Regroup)
            }
            Ok(Some(GroupChange::Departed(departure))) => {
                tracing::info!(
                    step = self.step,
                    "fit goes on after a departure: {}",
                    departure.describe()
                );
                Ok(Boundary::Regroup)
            }
            Ok(Some(GroupChange::Leaving(departure))) => Ok(Boundary::Left(departure)),
            Err(e) => {
                self.recover_or_fail(TrainError::from(e))?;
                self.resync();
                Ok(Boundary::Regroup)
            }
        }
    }

    /// After the group re-formed or admitted a joiner, training goes on from the agreed step:
    /// the epoch it falls in continues (or a new one begins).
    fn resync(&mut self) {
        let (now, within) = self.epoch_at();
        if now != self.epoch {
            self.epoch_open = false;
        }
        self.epoch = now;
        self.step_in_epoch = within;
    }

    /// The pass over the data is over: the next begins, and without `steps_per_epoch` so
    /// does the next epoch.
    fn end_pass(&mut self) -> Result<(), KerasError> {
        if self.cursor.batches == 0 {
            return Err(Misuse::NoBatches { operation: "fit" }.into());
        }
        self.cursor = self.cursor.next_pass();
        if self.steps_per_epoch.is_none() {
            self.known_steps = Some(self.step_in_epoch);
            self.finish_epoch()?;
        }
        Ok(())
    }

    /// One step over `batch`. Whether training goes on with this group (`false`: the group
    /// re-formed after a lost worker).
    fn step(&mut self, batch: PerReplica<Element>) -> Result<bool, KerasError> {
        let global = self
            .static_batch
            .or_else(|| self.local_global_batch(&batch));
        let before = self.optimizer.iterations();
        // The next boundary's vote rides in this step's all-reduce.
        let leaving = Leave::noticed(self.notice.as_deref(), self.drain.as_deref());
        let vote = self.model.model_strategy().cast_vote(leaving)?;
        let run = self.run_replicas(batch, global, vote.as_ref());
        // A step counts once its update was applied here, even where the group broke right
        // after; a skipped (non-finite) update counts as a step too.
        let applied = self.optimizer.iterations() > before;
        match run {
            Ok(mut stats) => {
                if let Some(vote) = vote {
                    let sums = stats.split_off(stats.len().saturating_sub(vote.len()));
                    let sums: Vec<f32> = sums.into_iter().map(|v| v as f32).collect();
                    self.counted_vote = Some(vote.counted(&sums));
                }
                self.record_step(stats)
            }
            Err(failed) => {
                let err = training_failure(failed)?;
                if applied {
                    self.step += 1;
                    self.cursor.batches += 1;
                }
                self.recover_or_fail(err)?;
                self.resync();
                Ok(false)
            }
        }
    }

    /// The step on every replica: its statistics summed over the group.
    fn run_replicas(
        &mut self,
        batch: PerReplica<Element>,
        global_batch_size: Option<usize>,
        vote: Option<&CastVote>,
    ) -> Result<Vec<f64>, KerasError> {
        let vote = vote.cloned();
        let network = Arc::clone(&self.network);
        let optimizer = Arc::clone(&self.optimizer);
        let loss = self.loss.clone();
        let metrics = Arc::clone(&self.metrics);
        let spec = StepSpec {
            step: self.step,
            global_batch_size,
        };
        let strategy = self.model.strategy();
        strategy
            .run(
                move |ctx, element: Element| -> Result<Vec<f64>, KerasError> {
                    let ballot = vote.as_ref().map(|v| v.values(ctx.local_replica_id()));
                    let step = (&*network, &*optimizer, &loss);
                    train_replica(step, &metrics, ctx, spec, &element, ballot)
                },
                batch,
            )
            .map_err(KerasError::from)
            .and_then(first_stats)
    }

    /// The examples of a step where the dataset's batch is not static: exact in one process
    /// (every replica's rows); under MultiWorkerMirrored `None` (each replica's rows times
    /// the replicas, as Keras scales per-replica losses).
    fn local_global_batch(&mut self, batch: &PerReplica<Element>) -> Option<usize> {
        if self.model.model_strategy().multi_worker().is_some() {
            return None;
        }
        Some(
            batch
                .values()
                .iter()
                .map(|e| {
                    e.first()
                        .and_then(|t| t.dims().first().copied())
                        .unwrap_or(0)
                })
                .sum(),
        )
    }

    /// A step applied: its statistics counted, the batch callbacks, a backup where due, and
    /// the epoch's end where it came. Whether training goes on with this group.
    fn record_step(&mut self, stats: Vec<f64>) -> Result<bool, KerasError> {
        self.step += 1;
        self.cursor.batches += 1;
        self.step_in_epoch += 1;
        for (t, s) in self.totals.iter_mut().zip(stats) {
            *t += s;
        }
        let logs = logs_of(&self.metrics, &self.totals);
        let step = self.step;
        self.each_callback(|cb, ctx| cb.on_train_batch_end(step, &logs, ctx))?;
        self.step_backup_due |= self.is_chief && self.step_backup_falls_due()?;
        // Keras ends the epoch, validation and callbacks included, when a callback stops
        // training in its middle.
        if self.steps_per_epoch == Some(self.step_in_epoch) || self.stop_training {
            let same_group = self.finish_epoch()?;
            self.write_due_step_backup()?;
            return Ok(same_group);
        }
        Ok(true)
    }

    /// The end of an epoch: its logs with validation, the callbacks, the history, the epoch's
    /// backup. Whether training goes on with this group (`false`: a worker was lost during
    /// the validation, and the group re-formed).
    fn finish_epoch(&mut self) -> Result<bool, KerasError> {
        let mut logs = logs_of(&self.metrics, &self.totals);
        logs.insert("learning_rate", f64::from(self.optimizer.learning_rate()));
        let same_group = self.validate(&mut logs)?;
        self.is_chief = self.model.model_strategy().is_chief();
        let stop_asked = self.stop_training;
        let epoch = self.epoch;
        self.each_callback(|cb, ctx| cb.on_epoch_end(epoch, &logs, ctx))?;
        self.stop_training |= stop_asked;
        self.history.epochs.push(logs.clone());
        self.history.epoch_numbers.push(epoch);
        self.last_logs = logs;
        self.back_up_at_epoch_end()?;
        self.epoch += 1;
        self.step_in_epoch = 0;
        self.epoch_open = false;
        Ok(same_group)
    }

    /// Adds the validation's figures to `logs`. Whether training goes on with this group:
    /// a worker lost during validation re-forms it, and the epoch goes without validation
    /// figures. Evaluating again is not safe: a survivor that failed in the epoch's last step
    /// instead re-forms at the same agreed step and goes on with the next epoch's first step
    /// boundary, which this worker must meet.
    fn validate(&mut self, logs: &mut Logs) -> Result<bool, KerasError> {
        let Some(validation) = self.validation_data.as_ref() else {
            return Ok(true);
        };
        if !validates_after(self.epoch, self.validation_freq) {
            return Ok(true);
        }
        match self.model.evaluate_steps(validation, self.validation_steps) {
            Ok(val) => {
                logs.extend_prefixed("val_", &val);
                Ok(true)
            }
            Err(failed) => {
                let err = training_failure(failed)?;
                self.recover_or_fail(err)?;
                tracing::warn!(
                    "a worker was lost during validation: this epoch has no validation figures"
                );
                Ok(false)
            }
        }
    }

    /// Re-forms the group after `err` where it can (the survivors agree on the most advanced
    /// step and input position); the error otherwise.
    fn recover_or_fail(&mut self, err: TrainError) -> Result<(), KerasError> {
        let mut state = elastic_state(
            self.step,
            self.cursor,
            self.epochs(),
            &self.variables,
            &self.optimizer,
        );
        match self.model.model_strategy().recover(&err, &mut state)? {
            None => Err(err.into()),
            Some(recovery) => {
                tracing::info!(step = recovery.step, lost = ?recovery.lost, "fit re-formed the group");
                self.history.recoveries += 1;
                self.take_state(state.step, state.position, state.epochs.clone());
                Ok(())
            }
        }
    }

    /// At an epoch's end: backs the state up on the chief where the backup is by epochs.
    fn back_up_at_epoch_end(&mut self) -> Result<(), KerasError> {
        let by_epochs = self
            .callbacks
            .backup()
            .is_some_and(|b| b.frequency() == SaveFreq::Epoch);
        if self.is_chief && by_epochs {
            self.back_up()?;
        }
        Ok(())
    }

    /// Whether a backup by steps falls due at the step just applied.
    fn step_backup_falls_due(&mut self) -> Result<bool, KerasError> {
        let step = self.step;
        match self.callbacks.backup() {
            Some(backup) if matches!(backup.frequency(), SaveFreq::Steps(_)) => {
                Ok(backup.checkpoints()?.should_save(step))
            }
            _ => Ok(false),
        }
    }

    /// Writes the backup by steps that fell due at the last step, once it is known whether
    /// that step ended an epoch: at the next batch, or after the epoch's end. A backup taken
    /// before the end of the epoch its step closed could not say whether that end ran (the
    /// crash may have come before or after it): resumed from it, a job ended the epoch again
    /// (its validation, `on_epoch_end` and history entry twice) or, where the epoch's length
    /// is given, not at all.
    fn write_due_step_backup(&mut self) -> Result<(), KerasError> {
        if std::mem::take(&mut self.step_backup_due) && self.is_chief {
            self.back_up()?;
        }
        Ok(())
    }

    /// Backs the state up now (the chief's backup).
    fn back_up(&mut self) -> Result<(), KerasError> {
        let epochs = self.epochs();
        let Some(backup) = self.callbacks.backup() else {
            return Ok(());
        };
        let state = elastic_state(
            self.step,
            self.cursor,
            epochs,
            &self.variables,
            &self.optimizer,
        );
        let dir = backup.dir().to_path_buf();
        backup
            .checkpoints()?
            .save(&state)
            .map(|_| ())
            .map_err(|source| KerasError::Backup {
                dir,
                source: Box::new(source),
            })
    }

    /// The end of training: the history, the callbacks' `on_train_end`, the backup's end.
    fn finish(mut self) -> Result<History, KerasError> {
        self.history.step = self.step;
        self.history.stopped_early = self.stop_training;
        self.is_chief = self.model.model_strategy().is_chief();
        let logs = std::mem::take(&mut self.last_logs);
        self.each_callback(|cb, ctx| cb.on_train_end(&logs, ctx))?;
        let is_chief = self.is_chief;
        if let Some(backup) = self.callbacks.backup() {
            backup.finish(is_chief)?;
        }
        self.report_final_model()?;
        Ok(self.history)
    }

    /// Under MultiWorkerMirrored, where `cohort chaos run` asks for a run report: this
    /// worker's final model (its variables at the last step), which every member must share.
    fn report_final_model(&mut self) -> Result<(), KerasError> {
        if !crate::run_report::asked() {
            return Ok(());
        }
        let variables = self.model.variables();
        let Some(strategy) = self.model.model_strategy().multi_worker() else {
            return Ok(());
        };
        let model = crate::run_report::FinalModel::of_variables(self.step, &variables)
            .map_err(crate::strategy::StrategyError::from)?;
        strategy.report_final_model(model);
        Ok(())
    }
}

/// A failed step's error as a training error, which re-forming may mend; any other error
/// (a bad batch, a loss that refuses its labels) as it is, to end `fit`.
fn training_failure(failed: KerasError) -> Result<TrainError, KerasError> {
    match failed {
        KerasError::Train(e) => Ok(e),
        KerasError::Strategy(e) => Ok(e.into()),
        other => Err(other),
    }
}

/// One replica's training step; the step's statistics (loss, examples, metrics) summed over
/// every replica in sync. They ride in the gradients' all-reduce
/// ([`ReplicatedModel::train_step_summing`]): one collective a step, where summing them
/// after the step was a second one, whose wait for the slowest worker cost a small model's
/// step about as much as its compute.
fn train_replica<N: ModuleT + Send + Sync>(
    (network, optimizer, loss): (&ReplicatedModel<N>, &DistributedOptimizer, &Loss),
    metrics: &[Box<dyn Metric>],
    ctx: &crate::strategy::ReplicaContext,
    spec: StepSpec,
    element: &Element,
    ballot: Option<Vec<f32>>,
) -> Result<Vec<f64>, KerasError> {
    let (x, y, weights) = split_element(element)?;
    let empty = x.dims().first() == Some(&0);
    let mut loss_error = None;
    let mut stats_error = None;
    let output = network
        .train_step_summing(ctx, optimizer, spec, |net| {
            if empty {
                // Nothing to learn from, but the replica still takes part in the all-reduce.
                let nothing = Tensor::zeros(0, candle_core::DType::F32, x.device())?;
                let mut stats = vec![0.0; stats_len(metrics)];
                stats.extend(ballot.unwrap_or_default());
                return Ok((nothing, stats));
            }
            let p = net.forward_t(x, true)?;
            let per_example = match loss.per_example(&p, y) {
                Ok(l) => l,
                Err(e) => {
                    let message = e.to_string();
                    loss_error = Some(e);
                    return Err(candle_core::Error::Msg(message));
                }
            };
            let mut stats: Vec<f32> =
                match stats_of(&per_example, metrics, y, &p.detach(), &weights) {
                    Ok(stats) => stats.into_iter().map(|v| v as f32).collect(),
                    Err(e) => {
                        let message = e.to_string();
                        stats_error = Some(e);
                        return Err(candle_core::Error::Msg(message));
                    }
                };
            stats.extend(ballot.unwrap_or_default());
            let w = Tensor::new(weights.as_slice(), per_example.device())?;
            Ok(((per_example.to_dtype(candle_core::DType::F32)? * w)?, stats))
        })
        .map_err(|e| match (loss_error.take(), stats_error.take()) {
            (Some(typed), _) => KerasError::Nn(typed),
            (None, Some(typed)) => typed,
            (None, None) => KerasError::Train(e),
        })?;
    Ok(output.sums().iter().map(|v| f64::from(*v)).collect())
}

#[cfg(test)]
mod tests {
    use super::validates_after;

    #[test]
    fn every_n_th_epoch_counted_from_one_is_validated() {
        let validated = |freq| {
            (0..6)
                .filter(|&e| validates_after(e, freq))
                .collect::<Vec<_>>()
        };
        assert_eq!(validated(1), [0, 1, 2, 3, 4, 5]);
        assert_eq!(validated(2), [1, 3, 5]);
        assert_eq!(validated(4), [3]);
        assert_eq!(validated(0), Vec::<usize>::new());
    }
}
