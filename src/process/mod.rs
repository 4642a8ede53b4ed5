//! What a cohort process is, apart from the role it runs: how it ends (its exit codes), how it
//! hears a stop request (SIGTERM/SIGINT as a preemption notice), and the role configuration it
//! runs with once the bootstrap has resolved it.
//!
//! The bootstrap ([`crate::bootstrap`]) sets these up, the roles read them (the chief's
//! `ClusterCoordinator::preemption_requested`, the evaluator's exit), and the launcher
//! ([`crate::launch`]) reads the exit codes of its children. This module starts no role and
//! must never depend on one: it sits below all three.
//!
//! Exit codes (DESIGN §7), a process's last word to its supervisor (the launcher, Kubernetes):
//!
//! | code | constant | meaning | restarted |
//! |---|---|---|---|
//! | 0 | [`JOB_DONE_EXIT_CODE`] | success; a worker or parameter server after the chief's goodbye | no |
//! | 1 | [`TRAINING_ERROR_EXIT_CODE`] | training failed (the chief's program returned an error or panicked) | by policy |
//! | 2 | [`BAD_CONFIG_EXIT_CODE`] | bad config or usage, with a message naming the key | by policy |
//! | 75 | [`LOST_CHIEF_EXIT_CODE`] | a worker lost its chief, or the chief retired this incarnation (FENCE-1) | yes, as a new incarnation |
//! | 143 | [`PREEMPTED_EXIT_CODE`] | stopped after SIGTERM/SIGINT | no (the job stops) |
//! | 170 | [`PANIC_EXIT_CODE`] | a panic (crash-only) | yes, as a new incarnation |
//!
//! A checkpoint failpoint exits with its own code, [`crate::checkpoint::FAILPOINT_EXIT_CODE`].
//!
//! Preemption (DESIGN §5): SIGTERM (or SIGINT) is a notice, not a kill. Once it arrived,
//! [`preemption_requested`] is true for the rest of the process's life.

mod exit_codes;
mod signals;

use std::sync::OnceLock;

use crate::cluster::RoleConfig;

pub use exit_codes::{
    BAD_CONFIG_EXIT_CODE, JOB_DONE_EXIT_CODE, LOST_CHIEF_EXIT_CODE, PANIC_EXIT_CODE,
    PREEMPTED_EXIT_CODE, TRAINING_ERROR_EXIT_CODE,
};
pub(crate) use signals::on_stop_signal;
pub use signals::{preemption_requested, stop_on_signals};

/// The configuration of the role this process runs, once the bootstrap
/// ([`crate::bootstrap::run_role`]) has resolved it; `None` in any other process.
pub fn role_config() -> Option<&'static RoleConfig> {
    ROLE_CONFIG.get()
}

/// Records `config` as this process's role configuration, the first time only (a process runs
/// one role); returns the recorded one.
pub(crate) fn set_role_config(config: RoleConfig) -> &'static RoleConfig {
    ROLE_CONFIG.get_or_init(|| config)
}

static ROLE_CONFIG: OnceLock<RoleConfig> = OnceLock::new();
