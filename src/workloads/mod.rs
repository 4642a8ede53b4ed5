//! The built-in workloads of the main job and the benchmarks: the handwritten digits
//! classifier and a CTR model with a large partitioned embedding table, with their data.

pub mod bench;
pub mod ctr;
pub mod demo;
pub mod dense_sync;
pub mod digits;
pub mod models;
pub mod mwms_bench;
pub mod mwms_demo;
pub mod recovery;
