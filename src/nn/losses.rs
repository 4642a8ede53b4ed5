//! Per-example losses (Keras' losses with `reduction=NONE`): each returns one value per
//! example, shape `[batch]`, to be reduced by
//! [`compute_average_loss`](crate::train::compute_average_loss).
//!
//! For inputs of rank 2 or more, the loss is averaged over the last axis, as Keras does; a
//! rank-1 input is one value per example.

use candle_core::{DType, Tensor, D};

use super::NnError;

/// Binary cross-entropy on logits, computed stably as
/// `max(x, 0) - x·z + log(1 + e^-|x|)` for logit `x` and label `z`.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use cohort::nn::losses::binary_cross_entropy_from_logits;
///
/// let logits = Tensor::new(&[[0f32], [100.]], &Device::Cpu)?;
/// let labels = Tensor::new(&[[1f32], [1.]], &Device::Cpu)?;
/// let loss = binary_cross_entropy_from_logits(&logits, &labels)?.to_vec1::<f32>()?;
/// assert!((loss[0] - std::f32::consts::LN_2).abs() < 1e-6 && loss[1] < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn binary_cross_entropy_from_logits(
    logits: &Tensor,
    labels: &Tensor,
) -> Result<Tensor, NnError> {
    same_shape("binary_cross_entropy_from_logits", logits, labels)?;
    let x = logits.to_dtype(DType::F32)?;
    let z = labels.to_dtype(DType::F32)?;
    let softplus_neg_abs = x.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?;
    let elementwise = ((x.relu()? - (&x * &z)?)? + softplus_neg_abs)?;
    mean_last_axis(&elementwise)
}

/// Softmax cross-entropy with integer class labels (Keras'
/// `SparseCategoricalCrossentropy(from_logits=True)`): logits `[batch, classes]`, labels
/// `[batch]` or `[batch, 1]` of an integer type.
pub fn sparse_softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor, NnError> {
    let name = "sparse_softmax_cross_entropy";
    let batch = logits.dims().first().copied().unwrap_or(0);
    let label_count: usize = labels.dims().iter().product();
    let fits = logits.rank() == 2
        && label_count == batch
        && (labels.rank() == 1 || (labels.rank() == 2 && labels.dims()[1] == 1));
    if !fits {
        return Err(NnError::LossShape {
            loss: name,
            predictions: logits.dims().to_vec(),
            labels: labels.dims().to_vec(),
        });
    }
    let classes = logits.dims()[1];
    let ids = checked_indices(labels, classes, "class label")?;
    let log_probs = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
    let picked = log_probs.gather(&ids.unsqueeze(1)?, 1)?.squeeze(1)?;
    Ok(picked.neg()?)
}

/// Squared error averaged over the last axis (Keras' `MeanSquaredError`).
pub fn mean_squared_error(predictions: &Tensor, targets: &Tensor) -> Result<Tensor, NnError> {
    same_shape("mean_squared_error", predictions, targets)?;
    let p = predictions.to_dtype(DType::F32)?;
    let t = targets.to_dtype(DType::F32)?;
    mean_last_axis(&(p - t)?.sqr()?)
}

fn same_shape(loss: &'static str, predictions: &Tensor, labels: &Tensor) -> Result<(), NnError> {
    if predictions.dims() != labels.dims() || predictions.rank() == 0 {
        return Err(NnError::LossShape {
            loss,
            predictions: predictions.dims().to_vec(),
            labels: labels.dims().to_vec(),
        });
    }
    Ok(())
}

fn mean_last_axis(t: &Tensor) -> Result<Tensor, NnError> {
    if t.rank() == 1 {
        return Ok(t.clone());
    }
    let last = t.dims()[t.rank() - 1];
    if last == 0 {
        // Mean over an empty axis: zero, not 0/0.
        return Ok(t.sum(D::Minus1)?);
    }
    // Sum then scale: the same numbers as `mean`, and defined for empty batches.
    Ok((t.sum(D::Minus1)? / last as f64)?)
}

/// Flattens integer `indices` to a `u32` vector after checking each is in `0..limit`.
fn checked_indices(indices: &Tensor, limit: usize, what: &'static str) -> Result<Tensor, NnError> {
    let values: Vec<i64> = match indices.dtype() {
        DType::U8 | DType::U32 | DType::I64 => indices
            .flatten_all()?
            .to_dtype(DType::I64)?
            .to_vec1::<i64>()?,
        dtype => return Err(NnError::IndexDType { what, dtype }),
    };
    let mut out = Vec::with_capacity(values.len());
    for value in values {
        if value < 0 || value as u64 >= limit as u64 {
            return Err(NnError::IndexOutOfRange { what, value, limit });
        }
        // In range of u32: `limit` is at most u32::MAX for every caller.
        out.push(value as u32);
    }
    let len = out.len();
    Ok(Tensor::from_vec(out, len, indices.device())?)
}
