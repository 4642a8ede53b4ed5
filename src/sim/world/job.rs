//! The simulated job: its variables (one per server the spec first named, a few elements
//! each) and how a chief program places them, each closure's gradient (a function of its id
//! alone, so a replay can recompute it), the one dataset every worker reads, the servers'
//! optimizer and the coordinator a chief incarnation configures.

use super::super::{SimConfig, EXTRA_WORKERS_MAX};
use crate::layout::{Dtype, Layout, Shard};
use crate::optim::Optimizer;
use crate::roles::coordinator::{Scheduler, SchedulerConfig};
use crate::roles::protocol::{InitSpec, SetupWorker};
use crate::roles::ps::ParameterStore;

/// A chief incarnation's coordinator, configured as the chief program does: every worker
/// reads one dataset.
pub(super) fn new_coordinator(config: &SimConfig, servers: u32) -> Scheduler {
    let mut coord = Scheduler::new(SchedulerConfig {
        ps_restart_wait_max: config.ps_restart_wait,
        no_worker_wait_max: config.ps_restart_wait,
        ..SchedulerConfig::default()
    })
    .with_servers(servers)
    .with_workers(config.num_workers)
    .with_workers_max(config.num_workers + EXTRA_WORKERS_MAX)
    .with_checkpoint_dir(Some(std::path::PathBuf::from("sim-checkpoints")));
    // The variables' layouts come with their creation (the chief program's, before its start).
    coord.handle_configure(setup(config, Vec::new()));
    coord
}

/// What the chief program configures the workers with once it created `layouts`: every
/// worker reads one dataset.
pub(super) fn setup(config: &SimConfig, layouts: Vec<Layout>) -> SetupWorker {
    SetupWorker {
        num_workers: config.num_workers,
        layouts,
        servers: Vec::new(),
        datasets: vec![(DATASET.into(), 0)],
        version: 0,
        generation: 0,
    }
}

/// The one dataset every worker reads.
pub(super) const DATASET: &str = "data";

/// The dataset position a setup for a worker carries (its skip).
pub(super) fn skip_of(setup: &SetupWorker) -> u64 {
    setup
        .datasets
        .iter()
        .find(|(name, _)| name == DATASET)
        .map_or(0, |(_, skip)| *skip)
}

/// The optimizer every simulated server runs (with slots, so that restoring them matters).
pub(super) fn new_store() -> ParameterStore {
    ParameterStore::new(Optimizer::adagrad(0.05)).expect("valid hyperparameters")
}

/// The one variable server `ps` holds.
pub(super) fn variable(ps: u32) -> String {
    format!("w{ps}")
}

/// The initial value of server `ps`'s variable ([`variable`]).
pub(super) fn initial(ps: u32) -> Vec<f32> {
    (0..WIDTH)
        .map(|i| (ps as f32 + 1.0) * 0.1 * i as f32)
        .collect()
}

/// Variable `v`'s initial value as the chief program's creation sends it.
pub(super) fn initial_spec(v: u32) -> InitSpec {
    InitSpec::Values(initial(v).iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// Closure `closure`'s gradient: a function of its id alone, so a replay can recompute it.
pub(super) fn gradient(closure: u64) -> Vec<f32> {
    (0..WIDTH as u64)
        .map(|i| ((closure.wrapping_mul(31).wrapping_add(i * 7)) % 13) as f32 / 13.0 - 0.5)
        .collect()
}

/// The job's variables (one per server the spec first named) as a chief program with
/// `servers` servers places them: variable `v` whole on server `v % servers` (with the spec's
/// servers, server `ps` holds all of [`variable`]`(ps)`).
pub(super) fn layouts(variables: u32, servers: u32) -> Vec<Layout> {
    (0..variables)
        .map(|v| Layout {
            name: variable(v),
            dtype: Dtype::F32,
            shape: vec![WIDTH],
            shards: vec![Shard {
                ps: v % servers.max(1),
                rows: 0..WIDTH,
            }],
        })
        .collect()
}

/// Elements of each server's variable.
pub(super) const WIDTH: usize = 4;
