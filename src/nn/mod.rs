//! Layers, losses and gradients over candle, with parameters held in
//! [`Variable`](crate::variable::Variable)s.
//!
//! This module owns the model-building pieces a training loop calls: layers that create and
//! own their variables through the variable API ([`Dense`], [`Embedding`], stacked with
//! [`Sequential`]), seeded initializers ([`Initializer`]), per-example losses ([`losses`]), and
//! the [`GradientTape`] that turns variable reads into candle autograd leaves so that
//! `loss.backward()` yields one gradient per variable.
//!
//! A layer's variables are created where the layer is built: under a strategy's scope they
//! are mirrored (or placed) by that strategy, outside they are plain. Reads made through a
//! tape inside a replica function see that replica's copy. This module never updates
//! variables; optimizers do ([`crate::train::DistributedOptimizer`]).
//!
//! The same layers run on a parameter-server cluster: each layer declares its variables
//! ([`Layer::weight_specs`], listed without drawing values by [`declare`]), the chief creates
//! them on the servers, and on a worker they are built with no local copy; a tape with a
//! [`VariableSource`] then reads them (only the batch's rows of an [`Embedding`] table) and
//! [`GradientTape::sparse_gradient`] gives row gradients for tables. This module does no
//! networking: the source and the pushes are the worker's bridge,
//! `cohort::roles::worker::PsModel`.
//!
//! Models written for candle-nn build through [`ModelVariables`], a `VarBuilder` whose
//! variables are a strategy's (each layer holds its replica's live copy, updated in place);
//! [`Dropout`] draws its masks from the step's seeded randomness ([`with_step_randomness`]), the
//! same under every strategy; [`layer_norm`] and [`rms_norm`] are candle-nn's normalizations
//! with a backward pass, and [`multi_head_attention`] is the self-attention candle-nn lacks
//! (Keras' `MultiHeadAttention`, with its causal mask), built from candle-nn's linear layers;
//! [`transformer_decoder`] and [`token_and_position_embedding`] are KerasNLP's decoder block and
//! input embedding built from those. `crate::train::ReplicatedModel` builds such a model per replica and
//! trains it.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use cohort::nn::{losses, Dense, GradientTape, Initializer, Layer};
//!
//! let layer = Dense::builder("dense", 1, 1)
//!     .kernel_initializer(Initializer::Constant(0.5))
//!     .build()?;
//! let x = Tensor::new(&[[1f32], [2.]], &Device::Cpu)?;
//! let y = Tensor::new(&[[1f32], [0.]], &Device::Cpu)?;
//! let tape = GradientTape::new();
//! let per_example = losses::binary_cross_entropy_from_logits(&layer.forward(&tape, &x)?, &y)?;
//! assert_eq!(per_example.dims(), &[2]);
//! let grads = tape.gradient(&per_example.sum_all()?, &layer.trainable_variables())?;
//! assert_eq!(grads.len(), 2); // kernel and bias
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod attention;
mod dense_kernel;
mod init;
mod layers;
pub mod losses;
mod model_vars;
mod random;
mod tape;
mod trainable;
mod transformer;
mod weights;

pub use attention::{multi_head_attention, MultiHeadAttention};
pub(crate) use dense_kernel::affine;
pub use init::Initializer;
pub use layers::{Activation, Dense, DenseBuilder, Embedding, Layer, Sequential};
pub use model_vars::{is_statistic, ModelVariables, STATISTICS};
pub use random::{with_step_randomness, Dropout, StepRandomness};
pub use tape::{Gradient, GradientTape, VariableSource};
pub use trainable::{layer_norm, rms_norm, LayerNorm, RmsNorm};
pub use transformer::{
    token_and_position_embedding, transformer_decoder, TokenAndPositionEmbedding,
    TransformerDecoder,
};
pub use weights::{declare, WeightAccess, WeightSpec};

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
    /// A variable with no local copy was read through a tape without a variable source.
    #[error("variable {variable:?} has no local copy and the tape has no variable source: on a parameter-server worker, run the model through the worker's bridge (`PsModel`)")]
    NoSource {
        /// The variable.
        variable: String,
    },
    /// The variable source could not give a variable's value.
    #[error("reading variable {variable:?} from its source failed: {reason}")]
    Source {
        /// The variable.
        variable: String,
        /// Why.
        reason: String,
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
