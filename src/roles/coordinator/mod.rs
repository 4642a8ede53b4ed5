//! The coordinator (chief): schedules closures on workers, recovers from worker loss and from
//! parameter-server loss (holds dispatch, restores every server from the last checkpoint and
//! runs again what committed since), keeps the ledger (LEDGER-1). [`ClusterCoordinator`] is
//! the chief program's handle.

mod actor;
mod client;
mod machine;
mod restore;

pub use actor::CoordinatorActor;
pub use client::{ClusterCoordinator, CoordinatorError, RemoteValue, VariableSpec};
pub use machine::{
    ps_restart_wait_for, ClosureError, ClosureFailure, ClosureId, ClosureState, Ledger,
    ResultDisposition, ScheduleError, Scheduler, SchedulerAction, SchedulerConfig, WorkerEpoch,
    DEFAULT_STEP_TIMEOUT,
};
