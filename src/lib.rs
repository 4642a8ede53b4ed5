//! cohort: TensorFlow's `tf.distribute` programming model in Rust, on actors that talk over
//! QUIC, built to keep training through the failures it exists to survive.
//!
//! Module map (see DESIGN.md §1):
//! - [`data`]: datasets, distributed datasets and iterators, input contexts, auto-sharding.
//! - [`strategy`]: the `Strategy` trait, the local strategies, per-replica values, reduce.
//! - [`variable`]: variables and their placement.
//! - [`collective`]: all-reduce and barriers among replicas (in process).
//! - [`nn`]: layers (`Dense`, `Embedding`), losses, the gradient tape.
//! - [`optim`]: optimizers (dense and row-sparse), with their slots.
//! - [`train`]: loss helpers, `fit` and Keras-style progress.
//! - [`checkpoint`]: the CKPT-1 checkpoint protocol.
//! - [`cluster`]: cluster specs, `TF_CONFIG`, config files.

pub mod bootstrap;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod collective;
pub mod data;
pub mod launch;
pub mod ledger;
pub mod nn;
pub mod optim;
pub mod program;
pub mod roles;
pub mod sim;
pub mod strategy;
pub mod train;
pub mod variable;
pub mod workloads;
