//! The exit codes of a cohort process (the table is in the module doc of [`crate::process`]),
//! and which of them ask the process's supervisor for a restart ([`restart_wanted`]).
//!
//! The split follows Kubernetes' `restartPolicy: ExitCode` (Kubeflow's training operator):
//! a code of 128 or more is retryable, 1–127 a permanent failure. So every outcome after which
//! a new incarnation can make progress is 128 or more, and apart from 128 + any common signal
//! (130 SIGINT, 134 SIGABRT, 137 SIGKILL, 139 SIGSEGV, 143 SIGTERM; any standard signal gives
//! 129–159) so that it is never mistaken for one: cohort's own restart codes are 170 and up. Bad configuration (2) and a training
//! error (1) stay below, as a restart would only fail again.

/// Success: the job is done. A worker or parameter server exits with it after the chief's
/// goodbye (a worker also once drained out of the job), and its supervisor does not restart
/// it.
pub const JOB_DONE_EXIT_CODE: i32 = 0;
/// Training failed: the chief's program returned an error or panicked, a role could not run.
/// Permanent: a restart would fail the same way.
pub const TRAINING_ERROR_EXIT_CODE: i32 = 1;
/// Bad configuration or usage; the message printed before names the key. Permanent.
pub const BAD_CONFIG_EXIT_CODE: i32 = 2;
/// Exit code after a stop request (SIGTERM/SIGINT): 128 + SIGTERM, as a shell reports it.
/// Restart-me: a preempted task is rescheduled by its supervisor (the local launcher instead
/// stops the whole job when it is the one that asked).
pub const PREEMPTED_EXIT_CODE: i32 = 143;
/// A role process's exit code after a panic (crash-only: its supervisor restarts it as a new
/// incarnation).
pub const PANIC_EXIT_CODE: i32 = 170;
/// A worker or parameter server whose incarnation is over: it lost its chief (silent past the
/// detection budget, which fences it) or the chief retired it (FENCE-1). Also any role whose
/// incarnation a peer refused as outdated (it knows a newer one of the same node: the clock
/// stepped back). Restart-me: the new incarnation is taken back by the chief (a parameter
/// server is restored).
pub const RETIRED_EXIT_CODE: i32 = 171;
/// The chief gave up because a parameter server was lost and could not be recovered (it did
/// not come back within `ps_restart_wait`, no checkpoint, the restore failed). Restart-me: a
/// restarted chief resumes from its last checkpoint, restoring every server (and fails
/// permanently, exit 1, when there is none to resume from and the servers went on).
pub const PS_LOST_EXIT_CODE: i32 = 172;

/// Whether a process that exited with `code` asks its supervisor to restart it: 128 or more
/// (Kubernetes' `restartPolicy: ExitCode` rule). A death by signal N, reported as 128 + N,
/// is one. 0 (done) and 1–127 (permanent failures) are not.
pub fn restart_wanted(code: i32) -> bool {
    code >= 128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restart_me_code_is_128_or_more_and_every_permanent_one_below() {
        for code in [
            PREEMPTED_EXIT_CODE,
            PANIC_EXIT_CODE,
            RETIRED_EXIT_CODE,
            PS_LOST_EXIT_CODE,
            crate::checkpoint::FAILPOINT_EXIT_CODE,
            128 + 9,
        ] {
            assert!(restart_wanted(code), "{code}");
        }
        for code in [
            JOB_DONE_EXIT_CODE,
            TRAINING_ERROR_EXIT_CODE,
            BAD_CONFIG_EXIT_CODE,
            127,
        ] {
            assert!(!restart_wanted(code), "{code}");
        }
    }

    #[test]
    fn cohorts_own_restart_codes_are_distinct_and_apart_from_every_standard_signal() {
        let own = [
            PANIC_EXIT_CODE,
            RETIRED_EXIT_CODE,
            PS_LOST_EXIT_CODE,
            crate::checkpoint::FAILPOINT_EXIT_CODE,
        ];
        for (i, code) in own.iter().enumerate() {
            assert!(*code <= 255, "{code} fits an exit status");
            // 1..=31: the standard signals (SIGHUP .. SIGSYS), 128 + N when they kill.
            assert!(
                !(1..=31).any(|signal| *code == 128 + signal),
                "{code} reads as a death by signal"
            );
            assert!(!own[..i].contains(code), "{code} is used twice");
        }
    }
}
