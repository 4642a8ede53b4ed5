//! Values that differ per replica, and the reduction operators over them.

use candle_core::{DType, Tensor};

/// One value per replica in sync, indexed by `replica_id_in_sync_group`
/// (TensorFlow's `PerReplica` / `DistributedValues`).
///
/// ```
/// use cohort::strategy::{Mirrored, PerReplica, Strategy, StrategyExt};
///
/// let strategy = Mirrored::new(2)?;
/// // From a value function: each replica's value made from its context.
/// let n = strategy.experimental_distribute_values_from_function(|ctx| ctx.num_replicas_in_sync);
/// assert_eq!(n, PerReplica::new(vec![2, 2]));
/// // `run` gives replica i the i-th value.
/// let doubled = strategy.run(|_ctx, n: usize| n * 2, n)?;
/// assert_eq!(strategy.experimental_local_results(&doubled), vec![4, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PerReplica<T> {
    values: Vec<T>,
}

impl<T> PerReplica<T> {
    /// Wraps one value per replica, in replica order.
    pub fn new(values: Vec<T>) -> Self {
        Self { values }
    }

    /// The per-replica values, in replica order (TF's `experimental_local_results`).
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// Consumes the wrapper, giving the per-replica values in replica order.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }

    /// Number of replicas the value spans.
    pub fn num_replicas(&self) -> usize {
        self.values.len()
    }

    /// The value of replica `replica_id`, if there is one.
    pub fn get(&self, replica_id: usize) -> Option<&T> {
        self.values.get(replica_id)
    }

    /// Applies `f` to every replica's value.
    pub fn map<U>(&self, f: impl FnMut(&T) -> U) -> PerReplica<U> {
        PerReplica::new(self.values.iter().map(f).collect())
    }

    /// Iterates over the per-replica values in replica order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.values.iter()
    }
}

impl<T, E> PerReplica<Result<T, E>> {
    /// The values if every replica succeeded, else the error of the lowest failing replica.
    pub fn transpose(self) -> Result<PerReplica<T>, E> {
        self.values
            .into_iter()
            .collect::<Result<Vec<T>, E>>()
            .map(PerReplica::new)
    }
}

impl<T> IntoIterator for PerReplica<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a PerReplica<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.iter()
    }
}

impl<T> From<Vec<T>> for PerReplica<T> {
    fn from(values: Vec<T>) -> Self {
        Self::new(values)
    }
}

/// How values from several replicas combine (TF's `tf.distribute.ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Sum divided by the number of contributions (replicas, or elements along an axis).
    Mean,
}

impl std::str::FromStr for ReduceOp {
    type Err = UnknownReduceOp;

    /// Parses TensorFlow's spellings, `"SUM"` and `"MEAN"` (any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "SUM" => Ok(ReduceOp::Sum),
            "MEAN" => Ok(ReduceOp::Mean),
            _ => Err(UnknownReduceOp {
                name: s.to_string(),
            }),
        }
    }
}

/// Divides `value` by `n`: float tensors keep their dtype, integer tensors become f64.
pub fn divide_by(value: &Tensor, n: f64) -> candle_core::Result<Tensor> {
    let value = match value.dtype() {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => value.clone(),
        _ => value.to_dtype(DType::F64)?,
    };
    let divisor = Tensor::new(n, value.device())?.to_dtype(value.dtype())?;
    value.broadcast_div(&divisor)
}

/// A reduce operation name that is neither `SUM` nor `MEAN`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reduce operation {name:?}: expected \"SUM\" or \"MEAN\"")]
pub struct UnknownReduceOp {
    /// The name given.
    pub name: String,
}
