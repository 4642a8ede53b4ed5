//! `Model::fit`'s arguments ([`Fit`]) and what it returns ([`History`]): Keras' training loop
//! over a distributed dataset, with callbacks, validation, backups, and — under
//! MultiWorkerMirrored — the group's re-forming when a worker is lost, joins, is drained or
//! preempted. The loop itself is `fit_loop.rs`'s.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use candle_nn::ModuleT;

use super::callbacks::Callback;
use super::fit_loop::FitLoop;
use super::{KerasError, Logs, Model};
use crate::data::{Dataset, DistributeOptions};
use crate::strategy::Departure;

/// The arguments of [`Model::fit`] beyond the data (Keras' `fit(...)` keywords).
pub struct Fit {
    pub(crate) epochs: usize,
    pub(crate) steps_per_epoch: Option<usize>,
    pub(crate) validation_data: Option<Dataset>,
    pub(crate) validation_steps: Option<usize>,
    pub(crate) validation_freq: usize,
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
            validation_freq: 1,
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

    /// Validates after every `epochs`-th epoch only (Keras' `validation_freq`: with 2, after
    /// epochs 2, 4, ... counted from 1); the other epochs' logs have no `val_` figures. At
    /// least 1 (the default: every epoch).
    pub fn validation_freq(mut self, epochs: usize) -> Self {
        self.validation_freq = epochs;
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
    /// the step, the chief backs it up (with a
    /// [`BackupAndRestore`](super::callbacks::BackupAndRestore)), this worker leaves and
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

impl<N: ModuleT + Send + Sync + 'static> Model<N> {
    /// Trains for `fit`'s epochs over `data` (Keras' `fit`): batches of `(features, labels)`
    /// or `(features, labels, sample_weights)` at the global batch size.
    ///
    /// Each step splits the global batch over every replica in sync and runs
    /// [`crate::train::ReplicatedModel::train_step`] (the loss averaged over the global batch,
    /// gradients summed across replicas, one update everywhere, statistics averaged); the
    /// loss and metrics of every replica are summed with one collective, so every worker logs
    /// the same figures. After each epoch it evaluates `validation_data` and runs the
    /// callbacks. With a [`BackupAndRestore`](super::callbacks::BackupAndRestore) it saves at
    /// its frequency and resumes from its newest backup at the exact step. Under
    /// MultiWorkerMirrored a lost worker re-forms the group and training goes on from the most
    /// advanced survivor's step; a joiner is admitted at a step boundary; a preempted or
    /// drained worker leaves there.
    ///
    /// The state a backup and a re-forming carry holds the rate a callback set and the running
    /// figures of the epoch in progress: an epoch that resumed midway reports the figures of
    /// all its steps, at the rate it ran at.
    pub fn fit(&mut self, data: &Dataset, fit: Fit) -> Result<History, KerasError> {
        FitLoop::start(self, data, fit)?.run()
    }
}
