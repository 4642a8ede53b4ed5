//! `Model::fit`: Keras' training loop over a distributed dataset, with callbacks, validation,
//! backups, and — under MultiWorkerMirrored — the group's re-forming when a worker is lost,
//! joins, is drained or preempted.
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

use super::callbacks::{BackupAndRestore, Callback, ProgbarLogger, SaveFreq, TrainingContext};
use super::model::{batch_stats, logs_of, split_element, stats_len, sum_stats};
use super::{KerasError, Logs, Model};
use crate::data::{Dataset, DistributeOptions, Element};
use crate::strategy::SaveStateError;
use crate::strategy::{Departure, ElasticState, GroupChange, Leave, StrategyExt};
use crate::train::{StepSpec, TrainError};

/// The arguments of [`Model::fit`] beyond the data (Keras' `fit(...)` keywords).
pub struct Fit {
    pub(crate) epochs: usize,
    pub(crate) steps_per_epoch: Option<usize>,
    pub(crate) validation_data: Option<Dataset>,
    pub(crate) validation_steps: Option<usize>,
    pub(crate) callbacks: Vec<Box<dyn Callback>>,
    pub(crate) verbose: bool,
    pub(crate) distribute: DistributeOptions,
    pub(crate) notice: Option<Arc<AtomicBool>>,
    pub(crate) drain: Option<Arc<AtomicBool>>,
}

impl Fit {
    /// `epochs` epochs, with Keras' defaults otherwise (an epoch is a pass over the data, a
    /// progress bar on standard error, no validation, no callbacks).
    pub fn epochs(epochs: usize) -> Self {
        Self {
            epochs,
            steps_per_epoch: None,
            validation_data: None,
            validation_steps: None,
            callbacks: Vec::new(),
            verbose: true,
            distribute: DistributeOptions::default(),
            notice: None,
            drain: None,
        }
    }

    /// Epochs of `steps` steps: the data runs on across epochs, and starts over when it ends.
    pub fn steps_per_epoch(mut self, steps: usize) -> Self {
        self.steps_per_epoch = Some(steps);
        self
    }

    /// Evaluates on `data` after every epoch; its figures go in the logs as `val_<name>`.
    pub fn validation_data(mut self, data: Dataset) -> Self {
        self.validation_data = Some(data);
        self
    }

    /// At most `steps` batches of the validation data.
    pub fn validation_steps(mut self, steps: usize) -> Self {
        self.validation_steps = Some(steps);
        self
    }

    /// Adds a callback (they run in the order added, after the progress bar).
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Whether to show the progress bar (default `true`).
    pub fn verbose(mut self, verbose: bool) -> Self {
        self.verbose = verbose;
        self
    }

    /// How the data is distributed over the replicas.
    pub fn distribute(mut self, options: DistributeOptions) -> Self {
        self.distribute = options;
        self
    }

    /// Under MultiWorkerMirrored: this worker's preemption notice (e.g. set on SIGTERM by
    /// [`crate::process::stop_on_signals`]). At the next step boundary every worker agrees on
    /// the step, the chief backs it up (with a [`BackupAndRestore`]), this worker leaves and
    /// `fit` returns ([`History::left`]) while the others go on.
    pub fn preemption_notice(mut self, notice: Arc<AtomicBool>) -> Self {
        self.notice = Some(notice);
        self
    }

    /// Under MultiWorkerMirrored: this worker's drain (scaled down for good): it leaves at
    /// the next step boundary without a backup.
    pub fn drain(mut self, drain: Arc<AtomicBool>) -> Self {
        self.drain = Some(drain);
        self
    }
}

/// What `fit` did (Keras' `History`).
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Each epoch's logs, in order (from the epoch it resumed at, after a restore).
    pub epochs: Vec<Logs>,
    /// The epoch (from 0) of each entry of `epochs`.
    pub epoch_numbers: Vec<usize>,
    /// Updates applied since the job began, when `fit` returned.
    pub step: u64,
    /// The step a backup resumed training at, if one did.
    pub resumed_at: Option<u64>,
    /// Re-formings of the group after a lost worker (MultiWorkerMirrored).
    pub recoveries: usize,
    /// Where this worker left the group on a notice or drain (then `fit` returned there).
    pub left: Option<Departure>,
    /// Whether a callback stopped training early.
    pub stopped_early: bool,
}

impl History {
    /// The figure `name` of every epoch (Keras' `history.history[name]`); `NaN` where an
    /// epoch lacks it.
    pub fn get(&self, name: &str) -> Vec<f64> {
        self.epochs
            .iter()
            .map(|logs| logs.get(name).unwrap_or(f64::NAN))
            .collect()
    }
}

/// The input position: pass `pass` over the data, `batches` of it consumed. Stored as one
/// `u64` (pass in the high 32 bits) where `MultiWorkerMirrored` and the backups keep a
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl<N: ModuleT + Send + Sync + 'static> Model<N> {
    /// Trains for `fit`'s epochs over `data` (Keras' `fit`): batches of `(features, labels)`
    /// or `(features, labels, sample_weights)` at the global batch size.
    ///
    /// Each step splits the global batch over every replica in sync and runs
    /// [`crate::train::ReplicatedModel::train_step`] (the loss averaged over the global batch,
    /// gradients summed across replicas, one update everywhere, statistics averaged); the
    /// loss and metrics of every replica are summed with one collective, so every worker logs
    /// the same figures. After each epoch it evaluates `validation_data` and runs the
    /// callbacks. With a [`BackupAndRestore`] it saves at its frequency and resumes from its
    /// newest backup at the exact step. Under MultiWorkerMirrored a lost worker re-forms the
    /// group and training goes on from the most advanced survivor's step; a joiner is
    /// admitted at a step boundary; a preempted or drained worker leaves there.
    ///
    /// The figures of an epoch that resumed midway count its steps since the resume.
    pub fn fit(&mut self, data: &Dataset, fit: Fit) -> Result<History, KerasError> {
        let Fit {
            epochs,
            steps_per_epoch,
            validation_data,
            validation_steps,
            callbacks: user_callbacks,
            verbose,
            distribute,
            notice,
            drain,
        } = fit;
        if epochs == 0 {
            return Err(KerasError::Config("fit: epochs must be at least 1".into()));
        }
        if steps_per_epoch == Some(0) {
            return Err(KerasError::Config(
                "fit: steps_per_epoch must be at least 1".into(),
            ));
        }
        let compiled = self
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
        let mut callbacks: Vec<Box<dyn Callback>> = Vec::with_capacity(user_callbacks.len() + 1);
        if verbose {
            callbacks.push(Box::new(ProgbarLogger::stderr()));
        }
        callbacks.extend(user_callbacks);
        let backup_index = callbacks.iter_mut().position(|c| c.as_backup().is_some());
        // A network built lazily creates its variables now, before anything counts on them.
        self.build_if_unbuilt(data)?;
        let variables = self.variables();
        let network = Arc::clone(self.replicated());
        // Rank 0 of the group now (it changes as the group re-forms): the one that writes.
        let mut is_chief = self.model_strategy().is_chief();
        let local_copies = self.strategy().local_replicas().len();
        let mut history = History::default();

        let mut step = 0u64;
        let mut cursor = Cursor {
            pass: 0,
            batches: 0,
        };
        // A fresh start resumes from the newest backup (the chief's, given to every worker);
        // a joiner takes the live state at its first step boundary instead.
        if let Some(index) = backup_index {
            if !self.model_strategy().awaits_state() {
                let backup = callbacks[index].as_backup().expect("found above");
                let mut state = ElasticState {
                    step: 0,
                    position: 0,
                    variables: &variables,
                    optimizer: Some(optimizer.as_ref()),
                };
                if is_chief {
                    let dir = backup.dir().to_path_buf();
                    backup
                        .checkpoints()?
                        .restore_into(&mut state, local_copies)
                        .map_err(|source| KerasError::Backup {
                            dir,
                            source: Box::new(source),
                        })?;
                }
                // A worker lost while the restored state is handed out leaves the others with
                // part of it: fail, and let the job start again (restoring again).
                self.model_strategy().agree(&mut state)?;
                if state.step > 0 || state.position > 0 {
                    history.resumed_at = Some(state.step);
                    tracing::info!(step = state.step, "fit resumes from a backup");
                }
                step = state.step;
                cursor = Cursor::decode(state.position);
            }
        }

        let epoch_of = |step: u64, cursor: Cursor| -> (usize, usize) {
            match steps_per_epoch {
                Some(n) => ((step / n as u64) as usize, (step % n as u64) as usize),
                None => (cursor.pass as usize, cursor.batches as usize),
            }
        };
        let (mut epoch, mut step_in_epoch) = epoch_of(step, cursor);
        let mut known_steps = steps_per_epoch;
        let mut stop_training = false;
        let mut epoch_open = false;
        let mut totals = vec![0.0f64; stats_len(&metrics)];
        let mut last_logs = Logs::new();

        macro_rules! context {
            () => {
                TrainingContext {
                    optimizer: &optimizer,
                    variables: &variables,
                    is_chief,
                    stop_training,
                    step,
                    step_in_epoch,
                    epochs,
                    steps_per_epoch: known_steps,
                    weights_set: false,
                }
            };
        }
        macro_rules! each_callback {
            (|$cb:ident, $ctx:ident| $body:expr) => {{
                let mut $ctx = context!();
                for $cb in callbacks.iter_mut() {
                    $body?;
                }
                stop_training = $ctx.stop_training;
            }};
        }
        // After the group re-formed or admitted a joiner, training goes on from the agreed
        // step: the epoch it falls in continues (or a new one begins).
        macro_rules! resync {
            () => {{
                let (now, within) = epoch_of(step, cursor);
                if now != epoch {
                    epoch_open = false;
                }
                epoch = now;
                step_in_epoch = within;
            }};
        }
        // The end of an epoch: its logs with validation, the callbacks, the history, the
        // epoch's backup.
        macro_rules! finish_epoch {
            () => {{
                let logs = epoch_logs(&metrics, &totals, optimizer.learning_rate());
                let logs = self.end_epoch(
                    logs,
                    validation_data.as_ref(),
                    validation_steps,
                    &mut step,
                    &mut cursor,
                    &variables,
                    &optimizer,
                    &mut history,
                )?;
                is_chief = self.model_strategy().is_chief();
                let stop_asked = stop_training;
                each_callback!(|cb, ctx| cb.on_epoch_end(epoch, &logs, &mut ctx));
                stop_training |= stop_asked;
                history.epochs.push(logs.clone());
                history.epoch_numbers.push(epoch);
                last_logs = logs;
                back_up_if_due(
                    backup_index.and_then(|i| callbacks[i].as_backup()),
                    is_chief,
                    true,
                    step,
                    cursor,
                    &variables,
                    &optimizer,
                )?;
                epoch += 1;
                step_in_epoch = 0;
                epoch_open = false;
            }};
        }
        each_callback!(|cb, ctx| cb.on_train_begin(&mut ctx));

        // Each pass of 'group trains with one group; the last boundary comes after the last
        // step (the closing boundary): under MultiWorkerMirrored a worker that applied the
        // last step while the others failed it (a ring delivers a step to some members and
        // not to others) meets them there and gives them its state, instead of ending with a
        // model they do not hold.
        'group: loop {
            let strategy = self.strategy();
            let distributed = strategy.experimental_distribute_dataset(data.clone(), distribute)?;
            if distributed.applied_shard_policy() == Some(crate::data::AutoShardPolicy::File) {
                // Each worker would end its pass when its own files do, and the workers'
                // collectives would no longer pair.
                return Err(KerasError::Config(
                    "fit: the data is sharded by files over the workers, whose passes can then \
                     end at different steps; give DistributeOptions::with_policy(AutoShardPolicy::Data) \
                     (every worker reads every global batch and keeps its slices)"
                        .into(),
                ));
            }
            // Made at the first step of this group (none where only the closing boundary is
            // left).
            let mut iter = None;
            loop {
                let finishing = epoch >= epochs || stop_training;
                is_chief = self.model_strategy().is_chief();
                if !finishing && !epoch_open {
                    totals.iter_mut().for_each(|t| *t = 0.0);
                    epoch_open = true;
                    each_callback!(|cb, ctx| cb.on_epoch_begin(epoch, &mut ctx));
                }
                // The step boundary: joiners admitted, notices and drains honoured.
                let leaving = Leave::noticed(notice.as_deref(), drain.as_deref());
                let mut state = ElasticState {
                    step,
                    position: cursor.encode(),
                    variables: &variables,
                    optimizer: Some(optimizer.as_ref()),
                };
                let change = {
                    let mut backup = backup_index.and_then(|i| callbacks[i].as_backup());
                    let mut save = |state: &ElasticState<'_>| -> Result<(), SaveStateError> {
                        if let Some(backup) = backup.as_deref_mut() {
                            backup.checkpoints()?.save(state)?;
                        }
                        Ok(())
                    };
                    self.model_strategy()
                        .at_step_boundary(&mut state, leaving, &mut save)
                };
                match change {
                    Ok(None) if finishing => break 'group,
                    Ok(None) => {}
                    Ok(Some(GroupChange::Admitted(admission))) => {
                        tracing::info!(step = admission.step, joined = ?admission.joined, "fit admitted workers to the group");
                        step = admission.step;
                        cursor = Cursor::decode(admission.position);
                        resync!();
                        continue 'group;
                    }
                    Ok(Some(GroupChange::Departed(departure))) => {
                        tracing::info!(
                            step,
                            "fit goes on after a departure: {}",
                            departure.describe()
                        );
                        continue 'group;
                    }
                    Ok(Some(GroupChange::Leaving(departure))) => {
                        history.left = Some(departure);
                        history.step = step;
                        return Ok(history);
                    }
                    Err(e) => {
                        let err = TrainError::from(e);
                        self.recover_or_fail(
                            err,
                            &mut step,
                            &mut cursor,
                            &variables,
                            &optimizer,
                            &mut history,
                        )?;
                        resync!();
                        continue 'group;
                    }
                }

                let iter = match &mut iter {
                    Some(iter) => iter,
                    None => iter.insert(distributed.iter_at_pass(cursor.pass, cursor.batches)?),
                };
                let Some(batch) = iter.get_next_as_optional()? else {
                    // The pass is over.
                    if cursor.batches == 0 {
                        return Err(KerasError::Config(
                            "fit: the dataset yielded no batches".into(),
                        ));
                    }
                    cursor = cursor.next_pass();
                    if steps_per_epoch.is_none() {
                        known_steps = Some(step_in_epoch);
                        finish_epoch!();
                    }
                    continue 'group;
                };

                // The step.
                let global = static_batch.or_else(|| self.local_global_batch(&batch));
                let before = optimizer.iterations();
                let run = {
                    let network = Arc::clone(&network);
                    let optimizer = Arc::clone(&optimizer);
                    let loss = loss.clone();
                    let metrics = Arc::clone(&metrics);
                    let spec = StepSpec {
                        step,
                        global_batch_size: global,
                    };
                    self.strategy()
                        .run(
                            move |ctx, element: Element| -> Result<Tensor, KerasError> {
                                train_replica(
                                    &network, &optimizer, &loss, &metrics, ctx, spec, &element,
                                )
                            },
                            batch,
                        )
                        .map_err(KerasError::from)
                        .and_then(|per_replica| sum_stats(self.strategy(), per_replica))
                };
                // A step counts once its update was applied here, even where the group broke
                // right after; a skipped (non-finite) update counts as a step too.
                let applied = optimizer.iterations() > before;
                match run {
                    Ok(stats) => {
                        step += 1;
                        cursor.batches += 1;
                        step_in_epoch += 1;
                        for (t, s) in totals.iter_mut().zip(stats) {
                            *t += s;
                        }
                        let logs = logs_of(&metrics, &totals);
                        each_callback!(|cb, ctx| cb.on_train_batch_end(step, &logs, &mut ctx));
                        back_up_if_due(
                            backup_index.and_then(|i| callbacks[i].as_backup()),
                            is_chief,
                            false,
                            step,
                            cursor,
                            &variables,
                            &optimizer,
                        )?;
                        // Keras ends the epoch, validation and callbacks included, when a
                        // callback stops training in its middle.
                        if steps_per_epoch == Some(step_in_epoch) || stop_training {
                            finish_epoch!();
                        }
                    }
                    Err(failed) => {
                        let err = training_failure(failed)?;
                        if applied {
                            step += 1;
                            cursor.batches += 1;
                        }
                        self.recover_or_fail(
                            err,
                            &mut step,
                            &mut cursor,
                            &variables,
                            &optimizer,
                            &mut history,
                        )?;
                        resync!();
                        continue 'group;
                    }
                }
            }
        }
        history.step = step;
        history.stopped_early = stop_training;
        is_chief = self.model_strategy().is_chief();
        let mut ctx = context!();
        for cb in callbacks.iter_mut() {
            cb.on_train_end(&last_logs, &mut ctx)?;
        }
        if let Some(index) = backup_index {
            if let Some(backup) = callbacks[index].as_backup() {
                backup.finish(is_chief)?;
            }
        }
        Ok(history)
    }

    /// The examples of a step where the dataset's batch is not static: exact in one process
    /// (every replica's rows); under MultiWorkerMirrored `None` (each replica's rows times
    /// the replicas, as Keras scales per-replica losses).
    fn local_global_batch(
        &mut self,
        batch: &crate::strategy::PerReplica<Element>,
    ) -> Option<usize> {
        if self.model_strategy().multi_worker().is_some() {
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

    /// Re-forms the group after `err` where it can (the survivors agree on the most advanced
    /// step and input position); the error otherwise.
    fn recover_or_fail(
        &mut self,
        err: TrainError,
        step: &mut u64,
        cursor: &mut Cursor,
        variables: &[crate::variable::Variable],
        optimizer: &Arc<crate::train::DistributedOptimizer>,
        history: &mut History,
    ) -> Result<(), KerasError> {
        let mut state = ElasticState {
            step: *step,
            position: cursor.encode(),
            variables,
            optimizer: Some(optimizer.as_ref()),
        };
        match self.model_strategy().recover(&err, &mut state)? {
            None => Err(err.into()),
            Some(recovery) => {
                tracing::info!(step = recovery.step, lost = ?recovery.lost, "fit re-formed the group");
                history.recoveries += 1;
                *step = state.step;
                *cursor = Cursor::decode(state.position);
                Ok(())
            }
        }
    }

    /// The epoch's logs with the validation's figures added (without them when a worker was
    /// lost meanwhile: the group re-forms).
    #[allow(clippy::too_many_arguments)]
    fn end_epoch(
        &mut self,
        mut logs: Logs,
        validation: Option<&Dataset>,
        validation_steps: Option<usize>,
        step: &mut u64,
        cursor: &mut Cursor,
        variables: &[crate::variable::Variable],
        optimizer: &Arc<crate::train::DistributedOptimizer>,
        history: &mut History,
    ) -> Result<Logs, KerasError> {
        let Some(validation) = validation else {
            return Ok(logs);
        };
        match self.evaluate_steps(validation, validation_steps) {
            Ok(val) => logs.extend_prefixed("val_", &val),
            // A worker lost during validation: the group re-forms, and this epoch goes without
            // validation figures. Evaluating again is not safe: a survivor that failed in the
            // epoch's last step instead re-forms at the same agreed step and goes on with the
            // next epoch's first step boundary, which this worker must meet.
            Err(failed) => {
                let err = training_failure(failed)?;
                self.recover_or_fail(err, step, cursor, variables, optimizer, history)?;
                tracing::warn!(
                    "a worker was lost during validation: this epoch has no validation figures"
                );
            }
        }
        Ok(logs)
    }
}

/// Backs the state up on the chief where `backup` is due: at an epoch's end for a backup by
/// epochs, at a step boundary by its step cadence otherwise.
fn back_up_if_due(
    backup: Option<&mut BackupAndRestore>,
    is_chief: bool,
    at_epoch_end: bool,
    step: u64,
    cursor: Cursor,
    variables: &[crate::variable::Variable],
    optimizer: &Arc<crate::train::DistributedOptimizer>,
) -> Result<(), KerasError> {
    let Some(backup) = backup.filter(|_| is_chief) else {
        return Ok(());
    };
    let due = match backup.frequency() {
        SaveFreq::Epoch => at_epoch_end,
        SaveFreq::Steps(_) => !at_epoch_end && backup.checkpoints()?.should_save(step),
    };
    if due {
        save_backup(backup, step, cursor, variables, optimizer)?;
    }
    Ok(())
}

fn save_backup(
    backup: &mut BackupAndRestore,
    step: u64,
    cursor: Cursor,
    variables: &[crate::variable::Variable],
    optimizer: &Arc<crate::train::DistributedOptimizer>,
) -> Result<(), KerasError> {
    let state = ElasticState {
        step,
        position: cursor.encode(),
        variables,
        optimizer: Some(optimizer.as_ref()),
    };
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

/// A failed step's error as a training error, which re-forming may mend; any other error
/// (a bad batch, a loss that refuses its labels) as it is, to end `fit`.
fn training_failure(failed: KerasError) -> Result<TrainError, KerasError> {
    match failed {
        KerasError::Train(e) => Ok(e),
        KerasError::Strategy(e) => Ok(e.into()),
        other => Err(other),
    }
}

/// The epoch's figures and the learning rate.
fn epoch_logs(
    metrics: &[Box<dyn super::metrics::Metric>],
    totals: &[f64],
    learning_rate: f32,
) -> Logs {
    let mut logs = logs_of(metrics, totals);
    logs.insert("learning_rate", f64::from(learning_rate));
    logs
}

/// One replica's training step; its statistics (loss, examples, metrics).
fn train_replica<N: ModuleT + Send + Sync>(
    network: &crate::train::ReplicatedModel<N>,
    optimizer: &crate::train::DistributedOptimizer,
    loss: &super::Loss,
    metrics: &[Box<dyn super::metrics::Metric>],
    ctx: &crate::strategy::ReplicaContext,
    spec: StepSpec,
    element: &Element,
) -> Result<Tensor, KerasError> {
    let (x, y, weights) = split_element(element)?;
    let empty = x.dims().first() == Some(&0);
    let mut predictions = None;
    let mut loss_error = None;
    network
        .train_step(ctx, optimizer, spec, |net| {
            if empty {
                // Nothing to learn from, but the replica still takes part in the all-reduce.
                return Tensor::zeros(0, candle_core::DType::F32, x.device());
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
            predictions = Some(p.detach());
            let w = Tensor::new(weights.as_slice(), per_example.device())?;
            per_example.to_dtype(candle_core::DType::F32)? * w
        })
        .map_err(|e| match loss_error.take() {
            Some(typed) => KerasError::Nn(typed),
            None => KerasError::Train(e),
        })?;
    batch_stats(loss, metrics, y, predictions.as_ref(), weights)
}
