//! The layers cohort adds to candle-nn, its losses, and the `VarBuilder` whose variables are
//! a strategy's.
//!
//! There is one layer library: candle-nn. A model is built from a `VarBuilder` with
//! candle-nn's constructors (`linear`, `conv2d`, `embedding`, `batch_norm`, `lstm`, ...) and
//! this module's, which are candle-nn modules too:
//! - [`dense`] and [`linear`]: Keras' `Dense` (candle-nn's `Linear` with an activation and
//!   candle-nn's variable names), computed on the CPU by one fused graph node whose backward
//!   skips the input's gradient when the input is data;
//! - [`Dropout`], whose masks come from the step's seeded randomness
//!   ([`with_step_randomness`]), the same under every strategy (DATA-1);
//! - [`layer_norm`] and [`rms_norm`]: candle-nn's normalizations with a backward pass;
//! - [`multi_head_attention`] (Keras' `MultiHeadAttention`, with its causal mask),
//!   [`transformer_decoder`] and [`token_and_position_embedding`] (KerasNLP's decoder block
//!   and input embedding), built from candle-nn's layers.
//!
//! [`ModelVariables`] is the `VarBuilder` backend whose variables are a strategy's (each
//! layer holds its replica's live copy, updated in place); `crate::train::ReplicatedModel`
//! builds a model per replica over it, `crate::keras::Model` trains it under every strategy,
//! and `ServerModel` (in `crate::program`) trains the same model on the parameter servers.
//! [`losses`] gives per-example losses, [`Initializer`] the seeded initial values of
//! variables created by name on the parameter servers. This module never updates variables;
//! optimizers do ([`crate::train::DistributedOptimizer`]).
//!
//! ```
//! use cohort::candle::{Device, Module, Tensor};
//! use cohort::nn::{dense, losses, Activation, ModelVariables};
//!
//! let variables = ModelVariables::new(1);
//! let layer = dense(1, 1, Activation::Linear, variables.var_builder(0).pp("dense"))?;
//! let x = Tensor::new(&[[1f32], [2.]], &Device::Cpu)?;
//! let y = Tensor::new(&[[1f32], [0.]], &Device::Cpu)?;
//! let per_example = losses::binary_cross_entropy_from_logits(&layer.forward(&x)?, &y)?;
//! assert_eq!(per_example.dims(), &[2]);
//! let grads = per_example.sum_all()?.backward()?;
//! // The weight and the bias each got a gradient.
//! for variable in variables.trainable_variables() {
//!     assert!(grads.get(&variable.live_component(0)?).is_some());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod attention;
mod dense;
mod dense_kernel;
mod init;
pub mod losses;
mod model_vars;
mod random;
mod trainable;
mod transformer;

pub use attention::{multi_head_attention, MultiHeadAttention};
pub use dense::{dense, linear, Activation, Dense};
pub(crate) use dense_kernel::{affine, KernelLayout};
pub use init::Initializer;
pub use model_vars::{is_statistic, ModelVariables, STATISTICS};
pub use random::{with_step_randomness, Dropout, StepRandomness};
pub use trainable::{layer_norm, rms_norm, LayerNorm, RmsNorm};
pub use transformer::{
    token_and_position_embedding, transformer_decoder, TokenAndPositionEmbedding,
    TransformerDecoder,
};

use candle_core::DType;

use crate::variable::VariableError;

/// Why a layer, loss or gradient computation failed.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// A tensor computation failed (shapes that do not fit, an unsupported op).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Creating or reading a variable failed.
    #[error(transparent)]
    Variable(#[from] VariableError),
    /// A layer got an input whose shape it cannot take.
    #[error("layer `{layer}` expects input of shape {expected}, got {got:?}")]
    InputShape {
        /// The layer's name.
        layer: String,
        /// What it expects, in words.
        expected: String,
        /// The input's shape.
        got: Vec<usize>,
    },
    /// A loss got predictions and labels that do not fit together.
    #[error(
        "loss `{loss}`: predictions of shape {predictions:?} do not fit labels of shape {labels:?}"
    )]
    LossShape {
        /// The loss's name.
        loss: &'static str,
        /// The predictions' shape.
        predictions: Vec<usize>,
        /// The labels' shape.
        labels: Vec<usize>,
    },
    /// A class label or embedding id outside its range.
    #[error("{what} {value} is out of range 0..{limit}")]
    IndexOutOfRange {
        /// What the index is (a class label, an embedding id).
        what: &'static str,
        /// The value found.
        value: i64,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// Indices (labels, ids) of a type that cannot index.
    #[error("{what} must be an integer tensor (u8, u32 or i64), got {dtype:?}")]
    IndexDType {
        /// What the indices are.
        what: &'static str,
        /// Their dtype.
        dtype: DType,
    },
    /// A model asked for a variable differently from how it was created (another shape or
    /// dtype, or a name no layer created): the model was built differently on two replicas
    /// or workers, or differs from the one a checkpoint holds.
    #[error("variable {variable:?}: {reason}")]
    ModelMismatch {
        /// The variable's name.
        variable: String,
        /// What differs.
        reason: String,
    },
    /// A layer's configuration is impossible (zero units, a negative regularization factor).
    #[error("layer `{layer}`: {reason}")]
    Config {
        /// The layer's name.
        layer: String,
        /// What is wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests;
