//! Cross-replica reduction of per-replica tensors (TensorFlow's `Strategy.reduce`).

use candle_core::Tensor;

use super::{divide_by, PerReplica, ReduceOp, StrategyError};

/// Reduces one tensor per replica to one tensor, as `tf.distribute.Strategy.reduce` does.
///
/// - `axis = None`: element-wise across replicas; every replica's tensor must have the same
///   shape and dtype. `Mean` divides by the number of replicas.
/// - `axis = Some(k)`: each replica's tensor is first summed along dimension `k`, then the sums
///   are added across replicas. `Mean` divides by the total length of dimension `k` over all
///   replicas, i.e. the true number of elements: a partial batch of 6 split 4/2 divides by 6,
///   and a replica with an empty batch adds nothing. The other dimensions must agree.
///
/// Integer tensors averaged with `Mean` give f64, as TensorFlow's true division does.
pub fn reduce_per_replica(
    op: ReduceOp,
    value: &PerReplica<Tensor>,
    axis: Option<usize>,
) -> Result<Tensor, StrategyError> {
    let values = value.values();
    let first = values.first().ok_or(StrategyError::NoReplicas)?;
    match axis {
        None => {
            check_same(values, |t| t.dims().to_vec())?;
            let mut sum = first.clone();
            for t in &values[1..] {
                sum = sum.add(t)?;
            }
            match op {
                ReduceOp::Sum => Ok(sum),
                ReduceOp::Mean => Ok(divide_by(&sum, values.len() as f64)?),
            }
        }
        Some(axis) => {
            for (replica, t) in values.iter().enumerate() {
                if axis >= t.rank() {
                    return Err(StrategyError::AxisOutOfRange {
                        axis,
                        rank: t.rank(),
                        replica,
                    });
                }
            }
            // Every dimension but `axis` must agree; `axis` itself may differ (partial batches).
            check_same(values, |t| {
                let mut dims = t.dims().to_vec();
                dims.remove(axis);
                dims
            })?;
            let mut total: Option<Tensor> = None;
            let mut count = 0usize;
            for t in values {
                count += t.dims()[axis];
                let partial = sum_along(t, axis)?;
                total = Some(match total {
                    None => partial,
                    Some(acc) => acc.add(&partial)?,
                });
            }
            let total = total.ok_or(StrategyError::NoReplicas)?;
            match op {
                ReduceOp::Sum => Ok(total),
                // 0 elements in all: 0/0 is NaN, as in TensorFlow.
                ReduceOp::Mean => Ok(divide_by(&total, count as f64)?),
            }
        }
    }
}

/// Concatenates one tensor per replica along `axis`, checking that the other dimensions and
/// the dtypes agree.
pub fn gather_per_replica(
    value: &PerReplica<Tensor>,
    axis: usize,
) -> Result<Tensor, StrategyError> {
    let values = value.values();
    if values.is_empty() {
        return Err(StrategyError::NoReplicas);
    }
    for (replica, t) in values.iter().enumerate() {
        if axis >= t.rank() {
            return Err(StrategyError::AxisOutOfRange {
                axis,
                rank: t.rank(),
                replica,
            });
        }
    }
    check_same(values, |t| {
        let mut dims = t.dims().to_vec();
        dims.remove(axis);
        dims
    })?;
    Ok(Tensor::cat(values, axis)?)
}

fn sum_along(t: &Tensor, axis: usize) -> candle_core::Result<Tensor> {
    if t.dims()[axis] == 0 {
        // An empty replica batch contributes zeros of the reduced shape.
        let mut dims = t.dims().to_vec();
        dims.remove(axis);
        return Tensor::zeros(dims, t.dtype(), t.device());
    }
    t.sum(axis)
}

fn check_same(values: &[Tensor], key: impl Fn(&Tensor) -> Vec<usize>) -> Result<(), StrategyError> {
    let first = &values[0];
    for (replica, t) in values.iter().enumerate().skip(1) {
        if key(t) != key(first) || t.dtype() != first.dtype() {
            return Err(StrategyError::ReplicaValueMismatch {
                replica,
                expected: format!("{:?} {:?}", first.dims(), first.dtype()),
                got: format!("{:?} {:?}", t.dims(), t.dtype()),
            });
        }
    }
    Ok(())
}
