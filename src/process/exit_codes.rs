//! The exit codes of a cohort process (the table is in the module doc of [`crate::process`]).

/// Success: the job is done. A worker or parameter server exits with it after the chief's
/// goodbye, and its supervisor does not restart it.
pub const JOB_DONE_EXIT_CODE: i32 = 0;
/// Training failed: the chief's program returned an error or panicked, a role could not run.
pub const TRAINING_ERROR_EXIT_CODE: i32 = 1;
/// Bad configuration or usage; the message printed before names the key.
pub const BAD_CONFIG_EXIT_CODE: i32 = 2;
/// A worker's exit code when it lost its chief or the chief retired it (its supervisor
/// restarts it as a new incarnation).
pub const LOST_CHIEF_EXIT_CODE: i32 = 75;
/// Exit code after a stop request (SIGTERM/SIGINT): 128 + SIGTERM, as a shell reports it.
pub const PREEMPTED_EXIT_CODE: i32 = 143;
/// A role process's exit code after a panic (crash-only: its supervisor restarts it as a new
/// incarnation). Above 128 like a death by signal, but not 128 + any common signal (130
/// SIGINT, 134 SIGABRT, 137 SIGKILL, 139 SIGSEGV, 143 SIGTERM), so a panic is never mistaken
/// for one.
pub const PANIC_EXIT_CODE: i32 = 170;
