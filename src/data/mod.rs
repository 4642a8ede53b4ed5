//! Input pipelines: datasets, their distribution over replicas, input contexts, sharding.
//!
//! This module owns TensorFlow's `tf.data` and distributed-input semantics, in process:
//! - [`Dataset`]: a re-iterable, `Send` description of a pipeline (sources, `batch`,
//!   `shuffle`, `map`, `prefetch`, …) whose elements are tuples of candle tensors
//!   ([`Element`]) typed by [`TensorSpec`]s;
//! - [`DistributedDataset`] / [`DistributedIterator`]: one input pipeline's share of a
//!   dataset, auto-sharded ([`AutoShardPolicy`]), rebatched into per-replica batches and
//!   prefetched, yielding [`PerReplica`](crate::strategy::PerReplica) values;
//! - [`InputContext`]: what a dataset function learns about the distribution.
//!
//! Tensors live on the CPU. Element types: `f32`, `f64`, `i64` (TensorFlow's `int32`, what
//! Python integers become, is `i64` here), plus whatever candle carries through `map`.
//!
//! It never talks to the network, and it never blocks a caller except on the data itself:
//! prefetching runs on its own threads, bounded by the buffer sizes given.

mod dataset;
pub mod datasets;
mod distribute;
mod error;
mod files;
mod numpy;
mod pipeline;
mod spec;
pub mod synthetic;
pub mod text;

pub use dataset::{Dataset, FilterFn, MapFn, PREFETCH_BUFFER_MAX};
pub use distribute::{
    batch_sizes_for_pipeline, AutoShardPolicy, DistributeOptions, DistributedDataset,
    DistributedIterator, InputContext, InputOptions, IteratorPosition,
};
pub use error::DataError;
pub use files::{CsvComponent, CsvFormat, CsvRecordError};
pub use numpy::{experimental_make_numpy_dataset, NdArray, NdData};
pub use pipeline::DatasetIterator;
pub use spec::{Element, TensorSpec};
