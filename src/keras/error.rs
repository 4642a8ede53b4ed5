//! Why a Keras operation failed: [`KerasError`], and [`Misuse`] for the arguments and data
//! that cannot work (each named, none as text).

use std::path::{Path, PathBuf};

use crate::data::DataError;
use crate::nn::NnError;
use crate::strategy::StrategyError;
use crate::summary::SummaryError;
use crate::train::{ScheduleError, TrainError};
use crate::variable::VariableError;

/// Why a model operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KerasError {
    /// `fit` or `evaluate` before `compile`.
    #[error("the model is not compiled: call Model::compile(optimizer, loss, metrics) before {0}")]
    NotCompiled(&'static str),
    /// An argument of `fit`, `evaluate` or `predict`, or the data given, that cannot work.
    #[error(transparent)]
    Misuse(#[from] Misuse),
    /// A dataset element without the components the model needs.
    #[error("a batch has {got} components; the model needs (features, labels) and optionally sample weights")]
    BatchComponents {
        /// Components the batch has.
        got: usize,
    },
    /// Weights (a file, a backup, a callback's) that do not fit the model.
    #[error("weights from {source_name}: {detail}")]
    Weights {
        /// Where they come from.
        source_name: String,
        /// What does not fit.
        detail: String,
    },
    /// The backup of `BackupAndRestore` could not be written or read.
    #[error("backup in {}: {source}", dir.display())]
    Backup {
        /// The backup directory.
        dir: PathBuf,
        /// What failed.
        source: Box<crate::train::StateCheckpointError>,
    },
    /// A parameter-server backup's record of the epoch's running figures (what `PsFit`
    /// keeps beside the variables) is not what `fit` writes.
    #[error(
        "the backup of step {step} records the epoch's figures ({key:?}) as {found}, not a list \
         of f64 bit patterns"
    )]
    RecordedFigures {
        /// The backup's step.
        step: u64,
        /// The key in the program state.
        key: &'static str,
        /// What is there.
        found: serde_json::Value,
    },
    /// A file could not be written or read.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Writing progress failed.
    #[error("writing progress failed: {0}")]
    Progress(#[from] std::io::Error),
    /// The training step failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The network could not be built (`PsFit`'s copy of the weights on the chief).
    #[error("building the model: {0}")]
    Build(#[source] candle_core::Error),
    /// A layer, loss or metric failed.
    #[error(transparent)]
    Nn(#[from] NnError),
    /// The parameter-server cluster refused or failed an operation (`PsFit::fit`).
    #[error(transparent)]
    Cluster(#[from] crate::program::CoordinatorError),
    /// A strategy operation failed.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// The input pipeline failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A variable could not be read or set.
    #[error(transparent)]
    Variable(#[from] VariableError),
    /// A TensorBoard event file could not be written.
    #[error(transparent)]
    Summary(#[from] SummaryError),
    /// `PlotHistory` could not draw or write its chart.
    #[error("PlotHistory: {0}")]
    Plot(#[from] crate::plot::PlotError),
    /// A tensor computation failed.
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
}

impl From<ScheduleError> for KerasError {
    fn from(e: ScheduleError) -> Self {
        KerasError::Train(e.into())
    }
}

impl KerasError {
    pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> Self {
        KerasError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

/// An argument, or the data given, that `fit`, `evaluate` or `predict` cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misuse {
    /// `Fit::epochs(0)`.
    #[error("fit: epochs must be at least 1")]
    NoEpochs,
    /// `Fit::validation_freq(0)`.
    #[error("fit: validation_freq must be at least 1")]
    NoValidationFreq,
    /// `Fit::steps_per_epoch(0)`.
    #[error("fit: steps_per_epoch must be at least 1")]
    NoStepsPerEpoch,
    /// `fit`, `evaluate` or `predict` over a dataset that yielded no batch.
    #[error("{operation}: the dataset yielded no batches")]
    NoBatches {
        /// `fit`, `evaluate` or `predict`.
        operation: &'static str,
    },
    /// A network built lazily, and an empty dataset to build it on.
    #[error("the model has no variables yet, and the dataset to build it on is empty")]
    NothingToBuildOn,
    /// Under MultiWorkerMirrored, data sharded by files over the workers.
    #[error(
        "fit: the data is sharded by files over the workers, whose passes can then end at \
         different steps; give DistributeOptions::with_policy(AutoShardPolicy::Data) (every \
         worker reads every global batch and keeps its slices)"
    )]
    ShardedByFiles,
    /// Sample weights whose count is not the batch's.
    #[error("sample weights hold {values} values for a batch of {batch}: give one per example")]
    SampleWeights {
        /// Weights given.
        values: usize,
        /// Examples in the batch.
        batch: usize,
    },
    /// A metric whose batch statistics are not as many as it declares.
    #[error("metric `{metric}` gave {got} statistics, it declares {declared}")]
    MetricStatistics {
        /// The metric's name.
        metric: String,
        /// Statistics it gave.
        got: usize,
        /// Statistics it declares (`Metric::state_len`).
        declared: usize,
    },
    /// `PsFit::fit` without `steps_per_epoch`.
    #[error(
        "fit under ParameterServerStrategy needs steps_per_epoch (each worker's data runs on)"
    )]
    PsNeedsStepsPerEpoch,
    /// `PsFit::fit` with `Fit::validation_data` (a dataset object) instead of a registered one.
    #[error(
        "under ParameterServerStrategy the validation data is a registered dataset function \
         (code never travels): give PsFit::validation_data(name)"
    )]
    PsValidationData,
    /// `PsFit::fit` validating without `validation_steps`.
    #[error("fit under ParameterServerStrategy with validation needs validation_steps")]
    PsNeedsValidationSteps,
}
