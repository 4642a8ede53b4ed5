//! The coordinator (chief): schedules closures on workers, recovers from worker loss, keeps
//! the ledger (LEDGER-1). [`ClusterCoordinator`] is the chief program's handle.

mod actor;
mod client;
mod machine;

pub use actor::CoordinatorActor;
pub use client::{ClusterCoordinator, CoordinatorError, RemoteValue, VariableSpec};
pub use machine::{
    ClosureError, ClosureFailure, ClosureId, ClosureState, Ledger, ResultDisposition,
    ScheduleError, Scheduler, SchedulerAction, SchedulerConfig, WorkerEpoch, DEFAULT_STEP_TIMEOUT,
};
