//! cohort: TensorFlow's `tf.distribute` programming model in Rust, on actors that talk over
//! QUIC, built to keep training through the failures it exists to survive.
//!
//! Module map (see DESIGN.md §1):
//! - [`distribute`]: the shared `tf.distribute` vocabulary (devices, strategy ids, per-replica
//!   values, reduce operations); a leaf every other module may use.
//! - [`data`]: datasets, distributed datasets and iterators, input contexts, auto-sharding.
//! - [`strategy`]: the `Strategy` trait, the local strategies, per-replica values, reduce.
//! - [`layout`]: where the rows of a variable live (one type for placement, worker setup and
//!   checkpoints).
//! - [`variable`]: variables and their placement.
//! - [`collective`]: all-reduce and barriers among replicas (in process), and collectives
//!   between processes over the transport (the process group).
//! - [`nn`]: layers (`Dense`, `Embedding`), losses, the gradient tape.
//! - [`optim`]: optimizers (dense and row-sparse), with their slots.
//! - [`train`]: loss helpers, `fit` and Keras-style progress.
//! - [`checkpoint`]: the CKPT-1 checkpoint protocol.
//! - [`cluster`]: cluster specs, `TF_CONFIG`, config files.
//! - [`roles`]: the coordinator, parameter-server, worker and evaluator roles, and the
//!   registry of a program's functions.
//! - [`process`]: exit codes, stop signals and the role configuration of this process.
//! - [`metrics`]: a role process's Prometheus metrics and the endpoint serving them (a leaf).
//! - [`summary`]: TensorBoard event files of scalar summaries (a leaf).
//! - [`bootstrap`]: starting a process as a role, and the local launch of a whole cluster.
//! - [`program`]: the user's entry point (`Program`, `main`).
//! - `chaosrun`: chaos plans (shared with the simulator, `sim`) applied to a real local job,
//!   its invariants checked afterwards (`cohort chaos run`); with `cli` and `workloads`, these
//!   serve the `cohort` binary and are not part of the library API.
//!
//! The modules form a graph without cycles (the test `module_graph` keeps it so): shared
//! vocabulary sits in leaves (`distribute`, `ledger`), process concerns low (`process`, used by
//! the roles and the launcher), the roles below the bootstrap, and the bootstrap below the
//! user's `program`.

/// candle's tensors (`candle-core`), re-exported so that a model's version matches cohort's.
pub use candle_core as candle;
/// candle's layers and `VarBuilder` (`candle-nn`), re-exported so that a model's version
/// matches cohort's: build models with [`nn::ModelVariables`] or [`train::ReplicatedModel`].
pub use candle_nn;

/// Declares modules that are not part of the library API: private, except to cohort's own
/// tests and benches (the `internals` feature, which only cohort's dev-dependency on itself
/// turns on).
macro_rules! internal_modules {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        $(#[$attr])*
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code)]
        $(#[$attr])*
        mod $name;
    )*};
}

internal_modules! {
    /// The chaos runner (`cohort chaos run`).
    chaosrun;
    /// The `cohort` command line. Its doc comments are clap's `--help` text, where
    /// `<run-dir>` is a placeholder, not HTML.
    #[allow(rustdoc::invalid_html_tags)]
    cli;
    /// The simulator (`cohort sim`).
    sim;
    /// The built-in demo and benchmark workloads.
    workloads;
}

/// The `cohort` binary's `main`: its command line (not part of the library API).
#[doc(hidden)]
pub fn cli_main() -> std::process::ExitCode {
    cli::run()
}

pub mod bootstrap;
pub mod checkpoint;
pub mod cluster;
pub mod collective;
pub mod data;
pub mod distribute;
pub mod keras;
pub mod launch;
pub mod layout;
pub mod ledger;
pub mod metrics;
pub mod nn;
pub mod optim;
pub mod plot;
pub mod process;
pub mod program;
pub mod roles;
pub mod run_report;
pub mod status;
pub mod strategy;
pub mod summary;
pub mod train;
pub mod variable;
