//! The training step: loss helpers, an optimizer that synchronizes gradients across
//! replicas, a candle-nn model per replica, and Keras-style progress.
//!
//! This module owns what TensorFlow's custom-training-loop guide asks of a user, in Rust:
//! - [`compute_average_loss`] and [`scale_regularization_loss`] scale a replica's loss so that
//!   summing gradients across replicas gives the gradient of the global batch's mean loss;
//! - [`DistributedOptimizer::apply_gradients`] sums gradients across the replicas of the
//!   calling replica context (all-reduce SUM) and then applies the same update on every
//!   replica with the kernels of [`crate::optim`], so mirrored variables stay equal;
//! - [`ReplicatedModel`] builds a candle-nn model once per replica over the strategy's
//!   variables and runs that step for it ([`ReplicatedModel::train_step`]);
//! - [`Progbar`] prints Keras 3's progress.
//!
//! The loop over epochs, with callbacks and recovery, is `crate::keras::Model::fit`.
//!
//! It never creates threads of its own (replicas belong to the strategy) and never reads
//! datasets except through the distributed iterator it is given.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use cohort::train::{compute_average_loss, scale_regularization_loss};
//!
//! // One of 2 replicas holds 4 examples: the global batch defaults to 2 × 4 = 8.
//! let per_example = Tensor::new(&[1f32, 2., 3., 4.], &Device::Cpu)?;
//! let loss = compute_average_loss(&per_example, None, 2)?;
//! assert_eq!(loss.to_scalar::<f32>()?, 10.0 / 8.0);
//! // With the true global batch (a short last batch of 6 examples): 10 / 6.
//! let loss = compute_average_loss(&per_example, Some(6), 2)?;
//! assert!((loss.to_scalar::<f32>()? - 10.0 / 6.0).abs() < 1e-6);
//! // Regularization losses are divided by the replicas in sync.
//! let reg = scale_regularization_loss(&Tensor::new(0.5f32, &Device::Cpu)?, 2)?;
//! assert_eq!(reg.to_scalar::<f32>()?, 0.25);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod optimizer;
mod progbar;
mod replicated;
mod state_checkpoint;

pub use crate::optim::{LearningRateSchedule, ScheduleError};
pub use optimizer::{AppliedGradients, DistributedOptimizer};
pub use progbar::{Progbar, ProgbarMode, BAR_WIDTH};
pub use replicated::{ReplicatedModel, StepOutput, StepSpec};
pub(crate) use state_checkpoint::{figures_from_json, figures_to_json};
pub use state_checkpoint::{StateCheckpointError, StateCheckpoints};

use candle_core::{DType, Tensor};

use crate::data::DataError;
use crate::nn::NnError;
use crate::optim::OptimError;
use crate::strategy::StrategyError;
use crate::variable::VariableError;

/// The sum of `per_example_loss` divided by the global batch size (TensorFlow's
/// `tf.nn.compute_average_loss`).
///
/// `global_batch_size` defaults to `num_replicas_in_sync ×` the local batch (the first
/// dimension of `per_example_loss`); give it explicitly when batches can be short (the last
/// batch of an epoch), so that the replicas' gradients sum to the gradient of the true mean.
/// A global batch of zero examples gives a loss of zero (division without NaN).
pub fn compute_average_loss(
    per_example_loss: &Tensor,
    global_batch_size: Option<usize>,
    num_replicas_in_sync: usize,
) -> Result<Tensor, TrainError> {
    if num_replicas_in_sync == 0 {
        return Err(TrainError::ZeroReplicas);
    }
    let local_batch = per_example_loss.dims().first().copied().unwrap_or(1);
    let global = match global_batch_size {
        Some(g) => g,
        None => local_batch.saturating_mul(num_replicas_in_sync),
    };
    let total = per_example_loss.sum_all()?;
    if global == 0 {
        return Ok(total.zeros_like()?);
    }
    Ok((total / global as f64)?)
}

/// `loss` divided by the number of replicas in sync (TensorFlow's
/// `tf.nn.scale_regularization_loss`): each replica adds its share of a regularization loss, so
/// that summing gradients across replicas counts it once.
pub fn scale_regularization_loss(
    loss: &Tensor,
    num_replicas_in_sync: usize,
) -> Result<Tensor, TrainError> {
    if num_replicas_in_sync == 0 {
        return Err(TrainError::ZeroReplicas);
    }
    let total = loss.sum_all()?;
    Ok((total / num_replicas_in_sync as f64)?)
}

impl TrainError {
    /// The collective failure under this error, if it is one (a lost or stalled peer, a
    /// broken group): what re-forming a MultiWorkerMirrored group can mend, unless it is an
    /// application error the peers agreed on.
    pub fn collective_cause(&self) -> Option<&crate::collective::CollectiveError> {
        match self {
            TrainError::Strategy(StrategyError::Collective(e))
            | TrainError::Strategy(StrategyError::Variable(VariableError::Collective {
                source: e,
                ..
            }))
            | TrainError::Variable(VariableError::Collective { source: e, .. }) => Some(e),
            _ => None,
        }
    }
}

/// Why a training operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The training state's checkpoints could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(Box<StateCheckpointError>),
    /// A loss helper was told there are no replicas.
    #[error("num_replicas_in_sync must be at least 1")]
    ZeroReplicas,
    /// `apply_gradients` got a different number of gradients and variables.
    #[error("apply_gradients got {gradients} gradients for {variables} variables")]
    GradientCount {
        /// Gradients given.
        gradients: usize,
        /// Variables given.
        variables: usize,
    },
    /// A gradient's shape differs from its variable's.
    #[error("gradient for variable `{variable}` has shape {got:?}, the variable has {expected:?}")]
    GradientShape {
        /// The variable.
        variable: String,
        /// The variable's shape.
        expected: Vec<usize>,
        /// The gradient's shape.
        got: Vec<usize>,
    },
    /// A variable the optimizer cannot train (only `f32` variables are trained).
    #[error("variable `{variable}` has dtype {dtype:?}; optimizers train f32 variables")]
    VariableDType {
        /// The variable.
        variable: String,
        /// Its dtype.
        dtype: DType,
    },
    /// A variable not kept in sync by the strategy whose replica is applying gradients.
    #[error("variable `{variable}` is not synchronized by the strategy running this replica; create it under that strategy's scope")]
    VariableNotSynced {
        /// The variable.
        variable: String,
    },
    /// A model built for one strategy was run by a replica of another (or of more replicas).
    #[error("a replica (local index {replica}) of another strategy ran a model built for a strategy with {replicas} local replicas: build the model under the strategy that runs it")]
    ForeignReplica {
        /// The replica's local index.
        replica: usize,
        /// The model's copies.
        replicas: usize,
    },
    /// A dataset element without the components a model needs.
    #[error("a batch has {got} components, the model needs {needed}")]
    BatchComponents {
        /// Components the model needs.
        needed: usize,
        /// Components the batch has.
        got: usize,
    },
    /// A learning-rate schedule that cannot give a rate.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// An optimizer kernel refused an update.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// A strategy operation (run, all-reduce, reduce) failed.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A variable update failed.
    #[error(transparent)]
    Variable(#[from] VariableError),
    /// A layer, loss or gradient computation failed.
    #[error(transparent)]
    Nn(#[from] NnError),
    /// The input pipeline failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A tensor computation failed.
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Writing progress failed.
    #[error("writing progress failed: {0}")]
    Io(#[from] std::io::Error),
}

impl From<StateCheckpointError> for TrainError {
    fn from(e: StateCheckpointError) -> Self {
        TrainError::Checkpoint(Box::new(e))
    }
}
