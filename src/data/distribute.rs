//! Distributed input: one input pipeline's share of a dataset, split over its replicas.
//!
//! A process (a worker) runs one input pipeline (`input_pipeline_id` of
//! `num_input_pipelines`) feeding `num_replicas_in_sync / num_input_pipelines` local replicas.
//! [`DistributedDataset::from_dataset`] is TensorFlow's `experimental_distribute_dataset`:
//!
//! 1. auto-shard across input pipelines by the [`AutoShardPolicy`];
//! 2. rebatch: every global batch of `G` becomes per-replica batches so that one step over all
//!    replicas of all pipelines consumes exactly `G` elements. Replica sizes are `G / n`
//!    plus one for the first `G % n` sub-batches (`n` = replicas in sync), rotated so each
//!    pipeline starts at its own replicas; a short last batch fills replicas in order, so
//!    later replicas may get a smaller or an empty batch;
//! 3. prefetch on a background thread, one batch per local replica.
//!
//! [`DistributedDataset::from_function`] is `distribute_datasets_from_function`: the user's
//! function builds this pipeline's dataset from an [`InputContext`], with no sharding and no
//! rebatching; local replicas take its elements in turn.
//!
//! Which pipelines have data at the end is not agreed across processes here: in a multi-worker
//! job the coordinator decides when an epoch ends.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::pipeline::BoxIter;
use super::spec::{Element, TensorSpec};
use super::{DataError, Dataset};
use crate::distribute::PerReplica;

/// What one input pipeline knows about the distribution (TensorFlow's
/// `tf.distribute.InputContext`), given to the dataset function of
/// [`DistributedDataset::from_function`].
///
/// ```
/// use cohort::data::{DataError, InputContext};
///
/// let ctx = InputContext::new(2, 1, 4);
/// assert_eq!(ctx.get_per_replica_batch_size(64)?, 16);
/// assert!(matches!(ctx.get_per_replica_batch_size(66), Err(DataError::NotDivisible { .. })));
/// # Ok::<(), DataError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InputContext {
    /// How many input pipelines there are (usually one per worker).
    pub num_input_pipelines: usize,
    /// This pipeline's index, below `num_input_pipelines`.
    pub input_pipeline_id: usize,
    /// Replicas taking part in each step, across all pipelines.
    pub num_replicas_in_sync: usize,
}

/// How [`DistributedDataset::from_dataset`] splits a dataset among input pipelines (TF's
/// `tf.data.experimental.AutoShardPolicy`).
///
/// ```
/// use cohort::data::{AutoShardPolicy, Dataset, DistributeOptions, DistributedDataset};
///
/// // Two pipelines (workers) of one replica each; in-memory data, so AUTO shards by DATA:
/// // pipeline 1 keeps every other element.
/// let ds = Dataset::range(0, 8, 1).batch(2, false);
/// let dist = DistributedDataset::from_dataset(ds, DistributeOptions::default(), 2, 2, 1)?;
/// assert_eq!(dist.applied_shard_policy(), Some(AutoShardPolicy::Data));
/// let mine: Vec<i64> = dist
///     .iter()
///     .map(|step| step.map(|s| s.values()[0][0].to_vec1::<i64>().unwrap()))
///     .collect::<Result<Vec<_>, _>>()?
///     .concat();
/// assert_eq!(mine, vec![1, 3, 5, 7]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum AutoShardPolicy {
    /// FILE when the source reads at least one file per pipeline, DATA otherwise.
    #[default]
    Auto,
    /// Each pipeline reads its own files (file `i` goes to pipeline `i % n`); a source that
    /// reads no files falls back to DATA with a warning.
    File,
    /// Each pipeline reads everything and keeps its own share of the rebatched elements.
    Data,
    /// No sharding: every pipeline reads everything.
    Off,
}

/// Options of distributed input (TF's `tf.distribute.InputOptions` together with the
/// `experimental_distribute` options of `tf.data.Options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DistributeOptions {
    /// How to shard among input pipelines (ignored by `from_function`).
    pub auto_shard_policy: AutoShardPolicy,
    /// Batches prefetched per local replica (at least 1).
    pub per_replica_buffer_size: usize,
}

/// The name TensorFlow users look for.
pub type InputOptions = DistributeOptions;

/// One input pipeline's share of a dataset, split into per-replica batches; iterate it once per
/// epoch (TensorFlow's `tf.distribute.DistributedDataset`).
///
/// Each iteration builds a fresh pipeline (with its own prefetch thread). Iterating yields
/// `Result<PerReplica<Element>, DataError>` and stops at the end of the data.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use cohort::data::{Dataset, DistributeOptions, DistributedDataset, TensorSpec};
///
/// // Global batch 4 over 2 replicas: each replica gets 2 of each batch.
/// let ds = Dataset::from_tensor_slices(vec![Tensor::new(&[1i64, 2, 3, 4], &Device::Cpu)?])?
///     .repeat(None)
///     .batch(4, false);
/// let dist = DistributedDataset::from_dataset(ds, DistributeOptions::default(), 2, 1, 0)?;
/// let first = dist.iter().next().unwrap()?;
/// assert_eq!(first.values()[0][0].to_vec1::<i64>()?, vec![1, 2]);
/// assert_eq!(first.values()[1][0].to_vec1::<i64>()?, vec![3, 4]);
///
/// // Per-replica specs: the batch dimension is unknown.
/// let one = Tensor::new(&[1f32], &Device::Cpu)?;
/// let two = Tensor::new(&[2i64], &Device::Cpu)?;
/// let ds = Dataset::from_tensors(vec![one, two]).repeat(Some(100)).batch(16, false);
/// let dist = DistributedDataset::from_dataset(ds, DistributeOptions::default(), 2, 1, 0)?;
/// let spec = dist.element_spec();
/// assert_eq!(spec.num_replicas(), 2);
/// assert_eq!(spec.values()[1][1], TensorSpec::new(vec![None, Some(1)], DType::I64));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DistributedDataset {
    pipeline: Dataset,
    spec: Arc<[TensorSpec]>,
    context: InputContext,
    local_replicas: usize,
    sharding: Option<AutoShardPolicy>,
    rebatched: bool,
}

/// An iterator over a [`DistributedDataset`] (TensorFlow's `tf.distribute.DistributedIterator`).
///
/// Calling protocol:
/// 1. [`DistributedIterator::get_next`] gives one batch per local replica, or
///    [`DataError::OutOfRange`] once no replica has data;
/// 2. when only some replicas have data, the others get an empty batch (outer dimension 0);
/// 3. [`DistributedIterator::get_next_as_optional`] is the same with the end as `Ok(None)`;
/// 4. [`DistributedIterator::position`] counts what was consumed, and
///    [`DistributedDataset::iter_at`] rebuilds an iterator at a saved position.
///
/// An error for one element (a failed map, a bad record) is returned by the call that met it;
/// the batches already pulled for that step are lost, and the next call goes on.
///
/// ```
/// use cohort::data::{DataError, Dataset, DistributeOptions, DistributedDataset};
///
/// let ds = Dataset::range(0, 5, 1).batch(4, false);
/// let dist = DistributedDataset::from_dataset(ds, DistributeOptions::default(), 2, 1, 0)?;
/// let mut it = dist.iter();
/// let step = it.get_next()?;
/// assert_eq!(step.values()[0][0].to_vec1::<i64>()?, vec![0, 1]);
/// assert_eq!(step.values()[1][0].to_vec1::<i64>()?, vec![2, 3]);
/// let step = it.get_next_as_optional()?.expect("one more step");
/// assert_eq!(step.values()[0][0].to_vec1::<i64>()?, vec![4]);
/// assert_eq!(step.values()[1][0].dims(), &[0]); // an empty batch
/// assert!(it.get_next_as_optional()?.is_none());
/// assert!(matches!(it.get_next(), Err(DataError::OutOfRange)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DistributedIterator {
    inner: BoxIter,
    spec: Arc<[TensorSpec]>,
    local_replicas: usize,
    position: IteratorPosition,
    exhausted: bool,
}

/// How far a [`DistributedIterator`] has gone: what a checkpoint saves per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct IteratorPosition {
    /// Successful `get_next` calls (steps), counting those that returned empty batches.
    pub steps: u64,
    /// Per-replica batches taken from the pipeline (empty fill-ins not counted).
    pub elements: u64,
}

impl InputContext {
    /// A context; `input_pipeline_id` must be below `num_input_pipelines`.
    pub fn new(
        num_input_pipelines: usize,
        input_pipeline_id: usize,
        num_replicas_in_sync: usize,
    ) -> Self {
        Self {
            num_input_pipelines,
            input_pipeline_id,
            num_replicas_in_sync,
        }
    }

    /// The batch size each replica should use so that a step consumes `global_batch_size`
    /// elements; an error when the replicas do not divide it.
    pub fn get_per_replica_batch_size(&self, global_batch_size: usize) -> Result<usize, DataError> {
        if self.num_replicas_in_sync == 0 || global_batch_size % self.num_replicas_in_sync != 0 {
            return Err(DataError::NotDivisible {
                global_batch_size,
                num_replicas_in_sync: self.num_replicas_in_sync,
            });
        }
        Ok(global_batch_size / self.num_replicas_in_sync)
    }

    /// Replicas fed by this pipeline.
    pub fn num_local_replicas(&self) -> usize {
        self.num_replicas_in_sync / self.num_input_pipelines.max(1)
    }

    fn check(&self, op: &'static str) -> Result<(), DataError> {
        let Self {
            num_input_pipelines: pipelines,
            input_pipeline_id: id,
            num_replicas_in_sync: replicas,
        } = *self;
        if pipelines == 0 || replicas == 0 {
            return Err(DataError::invalid(
                op,
                "num_input_pipelines and num_replicas_in_sync must be at least 1",
            ));
        }
        if id >= pipelines {
            return Err(DataError::invalid(
                op,
                format!("input_pipeline_id {id} is not below num_input_pipelines {pipelines}"),
            ));
        }
        if replicas % pipelines != 0 {
            return Err(DataError::invalid(
                op,
                format!(
                    "every input pipeline must feed the same number of replicas: \
                     {replicas} replicas in sync over {pipelines} pipelines"
                ),
            ));
        }
        Ok(())
    }
}

impl Default for InputContext {
    /// One pipeline, one replica.
    fn default() -> Self {
        Self::new(1, 0, 1)
    }
}

impl Default for DistributeOptions {
    fn default() -> Self {
        Self {
            auto_shard_policy: AutoShardPolicy::Auto,
            per_replica_buffer_size: 1,
        }
    }
}

impl DistributeOptions {
    /// Default options with the given sharding policy.
    pub fn with_policy(auto_shard_policy: AutoShardPolicy) -> Self {
        Self {
            auto_shard_policy,
            ..Self::default()
        }
    }
}

impl DistributedDataset {
    /// Distributes a batched dataset (TF's `experimental_distribute_dataset`): auto-shards it
    /// for pipeline `input_pipeline_id` of `num_input_pipelines`, rebatches each global batch
    /// over `num_replicas_in_sync` replicas, prefetches. See the module docs.
    ///
    /// With more than one replica every component must be batched (rank ≥ 1).
    pub fn from_dataset(
        dataset: Dataset,
        options: DistributeOptions,
        num_replicas_in_sync: usize,
        num_input_pipelines: usize,
        input_pipeline_id: usize,
    ) -> Result<DistributedDataset, DataError> {
        let op = "experimental_distribute_dataset";
        let context =
            InputContext::new(num_input_pipelines, input_pipeline_id, num_replicas_in_sync);
        context.check(op)?;
        check_options(op, &options)?;
        dataset.validate()?;
        let local_replicas = context.num_local_replicas();

        let sharding = (num_input_pipelines > 1)
            .then(|| resolve_policy(&dataset, options.auto_shard_policy, num_input_pipelines))
            .transpose()?;
        let mut pipeline = match (sharding, dataset.files()) {
            (Some(AutoShardPolicy::File), Some(files)) => {
                let mine: Vec<_> = files
                    .iter()
                    .skip(input_pipeline_id)
                    .step_by(num_input_pipelines)
                    .cloned()
                    .collect();
                dataset.fresh_copy(Some(&mine))
            }
            _ => dataset.fresh_copy(None),
        };

        let rebatched = num_replicas_in_sync > 1;
        if rebatched {
            if let Some(component) = dataset.element_spec().iter().position(|s| s.rank() == 0) {
                return Err(DataError::NotBatched {
                    num_replicas: num_replicas_in_sync,
                    component,
                });
            }
            pipeline = if sharding == Some(AutoShardPolicy::Data) {
                // DATA: every pipeline splits each global batch the same way into one piece
                // per replica in sync, then keeps its own pieces.
                pipeline
                    .legacy_rebatch(num_replicas_in_sync)
                    .shard(num_input_pipelines, input_pipeline_id)
            } else {
                match dataset.static_batch_size() {
                    Some(global) => pipeline.rebatch(batch_sizes_for_pipeline(
                        global,
                        num_input_pipelines,
                        local_replicas,
                        input_pipeline_id,
                    )),
                    None => pipeline.legacy_rebatch(local_replicas),
                }
            };
        }
        let spec: Arc<[TensorSpec]> = pipeline.element_spec().into();
        let pipeline =
            pipeline.prefetch(local_replicas.saturating_mul(options.per_replica_buffer_size));
        pipeline.validate()?;
        Ok(DistributedDataset {
            pipeline,
            spec,
            context,
            local_replicas,
            sharding,
            rebatched,
        })
    }

    /// Builds this pipeline's dataset with `dataset_fn` (TF's
    /// `distribute_datasets_from_function`): the function gets this pipeline's
    /// [`InputContext`] and returns a dataset already sharded and batched per replica as it
    /// wants; nothing is sharded or rebatched here. The local replicas take its elements in
    /// turn (replica `r` of `k` gets elements `r, r + k, …`). `options.auto_shard_policy` is
    /// ignored, as in TensorFlow.
    ///
    /// ```
    /// use cohort::data::{Dataset, DistributeOptions, DistributedDataset, InputContext};
    ///
    /// let dist = DistributedDataset::from_function(
    ///     |ctx: &InputContext| {
    ///         let per_replica = ctx.get_per_replica_batch_size(4)?;
    ///         Ok(Dataset::range(0, 8, 1)
    ///             .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ///             .batch(per_replica, false))
    ///     },
    ///     DistributeOptions::default(),
    ///     2,
    ///     1,
    ///     0,
    /// )?;
    /// let step = dist.iter().get_next()?;
    /// assert_eq!(step.values()[0][0].to_vec1::<i64>()?, vec![0, 1]);
    /// assert_eq!(step.values()[1][0].to_vec1::<i64>()?, vec![2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_function(
        dataset_fn: impl Fn(&InputContext) -> Result<Dataset, DataError> + Send + Sync + 'static,
        options: DistributeOptions,
        num_replicas_in_sync: usize,
        num_input_pipelines: usize,
        input_pipeline_id: usize,
    ) -> Result<DistributedDataset, DataError> {
        let op = "distribute_datasets_from_function";
        let context =
            InputContext::new(num_input_pipelines, input_pipeline_id, num_replicas_in_sync);
        context.check(op)?;
        check_options(op, &options)?;
        let dataset = dataset_fn(&context)?;
        dataset.validate()?;
        let local_replicas = context.num_local_replicas();
        let spec: Arc<[TensorSpec]> = dataset.element_spec().into();
        let pipeline = dataset
            .fresh_copy(None)
            .prefetch(local_replicas.saturating_mul(options.per_replica_buffer_size));
        pipeline.validate()?;
        Ok(DistributedDataset {
            pipeline,
            spec,
            context,
            local_replicas,
            sharding: None,
            rebatched: false,
        })
    }

    /// A fresh iterator from the start of this pipeline's data (one epoch).
    pub fn iter(&self) -> DistributedIterator {
        DistributedIterator {
            inner: self.pipeline.build(),
            spec: self.spec.clone(),
            local_replicas: self.local_replicas,
            position: IteratorPosition::default(),
            exhausted: false,
        }
    }

    /// A fresh iterator moved forward by `position.steps` steps, to resume after a restore.
    /// Exact when the pipeline is deterministic (seeded shuffles: DATA-1). An error when the
    /// data ends first.
    pub fn iter_at(&self, position: IteratorPosition) -> Result<DistributedIterator, DataError> {
        let mut it = self.iter();
        while it.position.steps < position.steps {
            match it.get_next() {
                Ok(_) => {}
                Err(DataError::OutOfRange) => {
                    return Err(DataError::invalid(
                        "iter_at",
                        format!(
                            "the data ends after {} steps, before step {}",
                            it.position.steps, position.steps
                        ),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(it)
    }

    /// A fresh iterator of pass `pass` over the data (the order a seeded shuffle draws for
    /// that pass, as if `pass` iterators had been built before), moved forward by `steps`
    /// steps: where a run that stopped `steps` steps into that pass resumes (DATA-1). An
    /// error when the pass ends first.
    pub fn iter_at_pass(&self, pass: u64, steps: u64) -> Result<DistributedIterator, DataError> {
        self.pipeline.set_epoch(pass);
        self.iter_at(IteratorPosition { steps, elements: 0 })
    }

    /// The spec of what each local replica receives.
    pub fn element_spec(&self) -> PerReplica<Vec<TensorSpec>> {
        per_replica_spec(&self.spec, self.local_replicas)
    }

    /// The context of this pipeline.
    pub fn input_context(&self) -> InputContext {
        self.context
    }

    /// Replicas fed by this pipeline (the length of every [`PerReplica`] it yields).
    pub fn num_local_replicas(&self) -> usize {
        self.local_replicas
    }

    /// The sharding that was applied: `File`, `Data` or `Off` after resolving `Auto` and the
    /// FILE fallback; `None` when there was nothing to shard (one pipeline, or
    /// `from_function`).
    pub fn applied_shard_policy(&self) -> Option<AutoShardPolicy> {
        self.sharding
    }

    /// Whether global batches are split over replicas (`from_dataset` with several replicas).
    pub fn is_rebatched(&self) -> bool {
        self.rebatched
    }
}

impl fmt::Debug for DistributedDataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedDataset")
            .field("context", &self.context)
            .field("sharding", &self.sharding)
            .field("rebatched", &self.rebatched)
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

impl IntoIterator for &DistributedDataset {
    type Item = Result<PerReplica<Element>, DataError>;
    type IntoIter = DistributedIterator;

    fn into_iter(self) -> DistributedIterator {
        self.iter()
    }
}

impl DistributedIterator {
    /// The next batch of every local replica; [`DataError::OutOfRange`] once none has data.
    pub fn get_next(&mut self) -> Result<PerReplica<Element>, DataError> {
        self.get_next_as_optional()?.ok_or(DataError::OutOfRange)
    }

    /// The next batch of every local replica, or `None` once none has data.
    pub fn get_next_as_optional(&mut self) -> Result<Option<PerReplica<Element>>, DataError> {
        if self.exhausted {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(self.local_replicas);
        for _ in 0..self.local_replicas {
            if self.exhausted {
                break;
            }
            match self.inner.next() {
                Some(Ok(element)) => {
                    self.position.elements += 1;
                    values.push(element);
                }
                Some(Err(e)) => return Err(e),
                None => self.exhausted = true,
            }
        }
        if values.is_empty() {
            return Ok(None);
        }
        while values.len() < self.local_replicas {
            let empty = self
                .spec
                .iter()
                .map(TensorSpec::empty_batch)
                .collect::<Result<Vec<_>, _>>()?;
            values.push(empty);
        }
        self.position.steps += 1;
        Ok(Some(PerReplica::new(values)))
    }

    /// The spec of what each local replica receives.
    pub fn element_spec(&self) -> PerReplica<Vec<TensorSpec>> {
        per_replica_spec(&self.spec, self.local_replicas)
    }

    /// What this iterator has consumed so far.
    pub fn position(&self) -> IteratorPosition {
        self.position
    }
}

impl Iterator for DistributedIterator {
    type Item = Result<PerReplica<Element>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_as_optional().transpose()
    }
}

impl fmt::Debug for DistributedIterator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedIterator")
            .field("local_replicas", &self.local_replicas)
            .field("position", &self.position)
            .field("exhausted", &self.exhausted)
            .finish_non_exhaustive()
    }
}

/// The per-replica batch sizes of pipeline `pipeline_id` for a global batch of `global`
/// (TF's `batch_sizes_for_worker`): `n = pipelines * local_replicas` sizes summing to `global`,
/// the first `global % n` one larger, rotated to start at this pipeline's first replica.
pub fn batch_sizes_for_pipeline(
    global: usize,
    pipelines: usize,
    local_replicas: usize,
    pipeline_id: usize,
) -> Vec<usize> {
    let n = (pipelines * local_replicas).max(1);
    let mut sizes: Vec<usize> = (0..n)
        .map(|i| global / n + usize::from(i < global % n))
        .collect();
    sizes.rotate_left((pipeline_id * local_replicas) % n);
    sizes
}

fn check_options(op: &'static str, options: &DistributeOptions) -> Result<(), DataError> {
    if options.per_replica_buffer_size == 0 {
        return Err(DataError::invalid(
            op,
            "per_replica_buffer_size must be at least 1",
        ));
    }
    Ok(())
}

/// Resolves AUTO and the FILE fallback to the sharding actually applied.
fn resolve_policy(
    dataset: &Dataset,
    policy: AutoShardPolicy,
    pipelines: usize,
) -> Result<AutoShardPolicy, DataError> {
    let files = dataset.files().map(<[_]>::len);
    Ok(match (policy, files) {
        (AutoShardPolicy::Off, _) => AutoShardPolicy::Off,
        (AutoShardPolicy::Data, _) => AutoShardPolicy::Data,
        (AutoShardPolicy::File, Some(n)) if n >= pipelines => AutoShardPolicy::File,
        (AutoShardPolicy::File, Some(n)) => {
            return Err(DataError::NotEnoughFiles {
                num_files: n,
                num_input_pipelines: pipelines,
            })
        }
        (AutoShardPolicy::File, None) => {
            tracing::warn!(
                "auto_shard_policy FILE: the dataset reads no files; sharding by DATA instead \
                 (every pipeline reads all the data and keeps its share)"
            );
            AutoShardPolicy::Data
        }
        (AutoShardPolicy::Auto, Some(n)) if n >= pipelines => AutoShardPolicy::File,
        (AutoShardPolicy::Auto, Some(n)) => {
            tracing::warn!(
                num_files = n,
                num_input_pipelines = pipelines,
                "auto_shard_policy AUTO: fewer files than input pipelines; sharding by DATA"
            );
            AutoShardPolicy::Data
        }
        (AutoShardPolicy::Auto, None) => AutoShardPolicy::Data,
    })
}

fn per_replica_spec(spec: &[TensorSpec], replicas: usize) -> PerReplica<Vec<TensorSpec>> {
    PerReplica::new(vec![spec.to_vec(); replicas])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_follow_tensorflow_example() {
        // G = 7, two pipelines of two replicas: [2, 2, 2, 1] and [2, 1, 2, 2].
        assert_eq!(batch_sizes_for_pipeline(7, 2, 2, 0), vec![2, 2, 2, 1]);
        assert_eq!(batch_sizes_for_pipeline(7, 2, 2, 1), vec![2, 1, 2, 2]);
        assert_eq!(batch_sizes_for_pipeline(4, 1, 2, 0), vec![2, 2]);
        assert_eq!(batch_sizes_for_pipeline(1, 1, 2, 0), vec![1, 0]);
    }

    #[test]
    fn context_rejects_uneven_replicas_and_bad_ids() {
        assert!(InputContext::new(2, 0, 3).check("t").is_err());
        assert!(InputContext::new(2, 2, 4).check("t").is_err());
        assert!(InputContext::new(0, 0, 4).check("t").is_err());
        assert!(InputContext::new(2, 1, 4).check("t").is_ok());
    }

    #[test]
    fn unbatched_dataset_cannot_be_split_over_replicas() {
        let err = DistributedDataset::from_dataset(
            Dataset::range(0, 4, 1),
            DistributeOptions::default(),
            2,
            1,
            0,
        )
        .unwrap_err();
        assert!(matches!(err, DataError::NotBatched { .. }), "{err}");
    }
}
