//! A model with Keras' shape over any candle-nn network: [`Model::compile`] with an optimizer,
//! a [`Loss`] and [`metrics`]; [`Model::fit`] with epochs, steps per epoch, validation data and
//! [`callbacks`]; [`Model::evaluate`], [`Model::predict`], [`Model::save`] and
//! [`Model::load`]. The same code trains under the default strategy, `OneDevice`, `Mirrored`,
//! `CentralStorage` and `MultiWorkerMirrored`; under ParameterServerStrategy, [`PsFit`] runs
//! `fit` from the chief's coordinator.
//!
//! ```
//! use cohort::candle::{Device, Module, Tensor};
//! use cohort::candle_nn::{linear, Linear};
//! use cohort::data::Dataset;
//! use cohort::keras::{metrics, Fit, Loss, Model};
//! use cohort::optim::Optimizer;
//! use cohort::strategy::Mirrored;
//!
//! // y = 2x - 1 on 64 points, batches of 16 split over 2 replicas.
//! let x: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
//! let y: Vec<f32> = x.iter().map(|v| 2.0 * v - 1.0).collect();
//! let cpu = &Device::Cpu;
//! let data = Dataset::from_tensor_slices(vec![
//!     Tensor::from_vec(x, (64, 1), cpu)?,
//!     Tensor::from_vec(y, (64, 1), cpu)?,
//! ])?
//! .batch(16, true);
//!
//! let mut model = Model::new(Mirrored::new(2)?, 7, |vb| linear(1, 1, vb.pp("out")))?;
//! model.compile(
//!     Optimizer::sgd(0.5),
//!     Loss::mean_squared_error(),
//!     vec![Box::new(metrics::Mean::absolute_error())],
//! );
//! let history = model.fit(&data, Fit::epochs(20).verbose(false))?;
//! let losses = history.get("loss");
//! assert!(losses[19] < losses[0] / 10.0);
//! let logs = model.evaluate(&data)?;
//! assert!(logs.get("mae").unwrap() < 0.1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This module owns Keras' training surface and nothing below it: the step is
//! [`crate::train::ReplicatedModel`]'s, the update [`crate::train::DistributedOptimizer`]'s,
//! re-forming a group after a lost worker `MultiWorkerMirrored`'s, and backups
//! [`crate::train::StateCheckpoints`]'.

pub mod callbacks;
mod fit;
mod logs;
mod loss;
pub mod metrics;
mod model;
mod ps;
mod save;

pub use fit::{Fit, History};
pub use logs::Logs;
pub use loss::Loss;
pub use model::{Model, ModelStrategy};
pub use ps::PsFit;

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
    /// An argument of `fit`, `evaluate` or `predict` that cannot work.
    #[error("{0}")]
    Config(String),
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
