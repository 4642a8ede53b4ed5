//! What a cohort process is, apart from the role it runs: how it ends (its exit codes), how it
//! hears a stop request (SIGTERM/SIGINT as a preemption notice), and the role configuration it
//! runs with once the bootstrap has resolved it.
//!
//! The bootstrap ([`crate::bootstrap`]) sets these up, the roles read them (the chief's
//! `ClusterCoordinator::preemption_requested`, the evaluator's exit), and the launcher
//! ([`crate::launch`]) reads the exit codes of its children. This module starts no role and
//! must never depend on one: it sits below all three.
//!
//! Exit codes (DESIGN §7), a process's last word to its supervisor (the launcher, Kubernetes).
//! Kubernetes under `restartPolicy: ExitCode` (Kubeflow's training operator) restarts a task
//! only for a code of 128 or more and takes 1–127 as permanent; cohort's codes follow that
//! rule, and [`restart_wanted`] is the one place that says which codes ask for a restart:
//!
//! | code | constant | meaning | kind |
//! |---|---|---|---|
//! | 0 | [`JOB_DONE_EXIT_CODE`] | success; a worker or parameter server after the chief's goodbye | done |
//! | 1 | [`TRAINING_ERROR_EXIT_CODE`] | training failed (the chief's program returned an error or panicked; a role could not start) | permanent |
//! | 2 | [`BAD_CONFIG_EXIT_CODE`] | bad config or usage, with a message naming the key | permanent |
//! | 141 | [`STDOUT_CLOSED_EXIT_CODE`] | a command's reader closed its standard output (`cohort ckpt show DIR \| head`), as after SIGPIPE | not a role's code |
//! | 143 | [`PREEMPTED_EXIT_CODE`] | stopped after SIGTERM/SIGINT (128 + SIGTERM) | restart me |
//! | 170 | [`PANIC_EXIT_CODE`] | a panic (crash-only) | restart me, as a new incarnation |
//! | 171 | [`RETIRED_EXIT_CODE`] | a worker lost its chief, or the chief retired this worker or parameter server incarnation, or a peer refused this incarnation as outdated (FENCE-1) | restart me, as a new incarnation |
//! | 172 | [`PS_LOST_EXIT_CODE`] | the chief gave up on a parameter server that could not be recovered, or one was lost while the chief's start restored the servers | restart me: the chief resumes from its checkpoint |
//! | 173 | [`crate::checkpoint::FAILPOINT_EXIT_CODE`] | a checkpoint failpoint fired (tests only: a crash) | restart me |
//! | 128 + N | — | killed by signal N (as a shell or Kubernetes reports it) | restart me |
//!
//! The local launcher ([`crate::launch`]) ends the job whenever the chief exits, and restarts
//! any other task that did not exit 0, the permanent failures too (within its restart budget,
//! as `restartPolicy: OnFailure` would); a task that exits 143 left on a preemption notice and
//! is restarted outside that budget, with no growing backoff.
//!
//! A supervisor that saw a task's process exit may say so to the chief at once
//! ([`ExitReport`], over the chief's `supervisor_socket`): the launcher does.
//!
//! Preemption (DESIGN §5): SIGTERM (or SIGINT) is a notice, not a kill. Once it arrived,
//! [`preemption_requested`] is true for the rest of the process's life.

mod allocator;
mod compute_threads;
mod exit_codes;
mod exit_report;
mod incarnation;
mod signals;
pub(crate) mod stdout;
mod temp_dir;

use std::sync::OnceLock;

use crate::cluster::RoleConfig;

pub use allocator::{keep_freed_memory, no_transparent_huge_pages, with_system_huge_pages};
pub use compute_threads::{
    compute_threads_given, describe_compute_threads, follow_cpu_quota, ComputeThreads,
    COMPUTE_THREADS_ENV,
};
pub use exit_codes::{
    restart_wanted, BAD_CONFIG_EXIT_CODE, JOB_DONE_EXIT_CODE, PANIC_EXIT_CODE, PREEMPTED_EXIT_CODE,
    PS_LOST_EXIT_CODE, RETIRED_EXIT_CODE, TRAINING_ERROR_EXIT_CODE,
};
pub use exit_report::{
    send_exit_report, ExitReport, ExitReportError, ExitReports, ExitSocketError,
    SOCKET_PATH_BYTES_MAX,
};
pub use incarnation::Incarnation;
pub(crate) use signals::on_stop_signal;
pub use signals::{drain_on_signal, preemption_requested, stop_on_signals};
pub use stdout::STDOUT_CLOSED_EXIT_CODE;
pub use temp_dir::new_temp_dir;

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

/// This process's incarnation: `explicit` when a configuration layer gives one (a
/// launcher does), else milliseconds since the Unix epoch at `now` (at least 1): larger than
/// the incarnation of any predecessor that started earlier (see `bootstrap`'s module docs for a
/// clock that steps back).
pub fn incarnation_number(explicit: Option<u64>, now: std::time::SystemTime) -> u64 {
    explicit.unwrap_or_else(|| {
        let since = now
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}
