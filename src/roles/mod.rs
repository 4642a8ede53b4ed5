//! The role actors of parameter-server training: coordinator (chief), parameter server,
//! worker; and the evaluator, which only reads checkpoints. Each role keeps its decisions in a pure `machine` (no IO, time passed in) and does
//! its IO in an actor shell (DESIGN §2).

pub mod coordinator;
pub mod evaluator;
pub mod node;
pub mod protocol;
pub mod ps;
pub mod worker;

pub use crate::bootstrap::{
    launch_from_args, launch_local, preemption_requested, role_config, run_role, LaunchFlags,
    DETECTION_BUDGET_ENV, LOST_CHIEF_EXIT_CODE, PANIC_EXIT_CODE, PREEMPTED_EXIT_CODE,
    WORKER_WAIT_ENV,
};
