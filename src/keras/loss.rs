//! The loss a model is compiled with: one value per example from predictions and labels
//! (Keras' losses with `reduction=NONE`); [`super::Model`] averages it over the global batch.

use std::fmt;
use std::sync::Arc;

use candle_core::{DType, Tensor};

use crate::nn::{losses, NnError};

/// A per-example loss: `(predictions, labels) -> [batch]`.
type LossFn = dyn Fn(&Tensor, &Tensor) -> Result<Tensor, NnError> + Send + Sync;

/// A loss for [`super::Model::compile`]: Keras' built-in losses by constructor, or any
/// function of predictions and labels giving one value per example.
#[derive(Clone)]
pub struct Loss {
    name: String,
    per_example: Arc<LossFn>,
}

impl Loss {
    /// Softmax cross-entropy with integer class labels on logits `[batch, classes]` (Keras'
    /// `SparseCategoricalCrossentropy(from_logits=True)`); for sequences, logits
    /// `[batch, positions..., classes]` against labels `[batch, positions...]`, an example's
    /// loss the mean over its positions.
    pub fn sparse_categorical_crossentropy() -> Self {
        Self::custom(
            "sparse_categorical_crossentropy",
            |logits: &Tensor, labels: &Tensor| {
                if logits.rank() <= 2 {
                    return losses::sparse_softmax_cross_entropy(logits, labels);
                }
                let dims = logits.dims();
                let (batch, classes) = (dims[0], dims[dims.len() - 1]);
                let positions = logits.elem_count() / (batch * classes).max(1);
                if labels.elem_count() != batch * positions || labels.dims().first() != Some(&batch)
                {
                    return Err(NnError::LossShape {
                        loss: "sparse_categorical_crossentropy",
                        predictions: dims.to_vec(),
                        labels: labels.dims().to_vec(),
                    });
                }
                let flat = losses::sparse_softmax_cross_entropy(
                    &logits.reshape((batch * positions, classes))?,
                    &labels.reshape(batch * positions)?,
                )?;
                Ok(flat.reshape((batch, positions))?.mean(1)?)
            },
        )
    }

    /// Binary cross-entropy on logits against labels of the same shape in `[0, 1]` (Keras'
    /// `BinaryCrossentropy(from_logits=True)`), averaged over the last axis.
    pub fn binary_crossentropy() -> Self {
        Self::custom(
            "binary_crossentropy",
            losses::binary_cross_entropy_from_logits,
        )
    }

    /// Squared error averaged over the last axis (Keras' `MeanSquaredError`).
    pub fn mean_squared_error() -> Self {
        Self::custom("mean_squared_error", losses::mean_squared_error)
    }

    /// Absolute error averaged over the last axis (Keras' `MeanAbsoluteError`).
    pub fn mean_absolute_error() -> Self {
        Self::custom("mean_absolute_error", |p: &Tensor, t: &Tensor| {
            if p.dims() != t.dims() || p.rank() == 0 {
                return Err(NnError::LossShape {
                    loss: "mean_absolute_error",
                    predictions: p.dims().to_vec(),
                    labels: t.dims().to_vec(),
                });
            }
            let diff = (p.to_dtype(DType::F32)? - t.to_dtype(DType::F32)?)?.abs()?;
            if diff.rank() == 1 {
                return Ok(diff);
            }
            Ok(diff.mean(candle_core::D::Minus1)?)
        })
    }

    /// A loss of the user's: `per_example(predictions, labels)` gives one value per example.
    pub fn custom<F>(name: impl Into<String>, per_example: F) -> Self
    where
        F: Fn(&Tensor, &Tensor) -> Result<Tensor, NnError> + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            per_example: Arc::new(per_example),
        }
    }

    /// The loss's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One loss per example of the batch: `[batch]`.
    pub fn per_example(&self, predictions: &Tensor, labels: &Tensor) -> Result<Tensor, NnError> {
        let values = (self.per_example)(predictions, labels)?;
        let batch = predictions.dims().first().copied().unwrap_or(0);
        if values.dims() != [batch] {
            return Err(NnError::Config {
                layer: self.name.clone(),
                reason: format!(
                    "the loss gave shape {:?} for a batch of {batch}: a loss gives one value per example",
                    values.dims()
                ),
            });
        }
        Ok(values)
    }
}

impl fmt::Debug for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loss").field("name", &self.name).finish()
    }
}
