//! The coordinator (chief): schedules closures on workers, recovers from worker loss and from
//! parameter-server loss (holds dispatch, restores every server from the last checkpoint and
//! runs again what committed since), keeps the ledger (LEDGER-1). [`ClusterCoordinator`] is
//! the chief program's handle.
//!
//! - `machine` ([`Scheduler`]) decides everything: scheduling, the ledger, recovery, (in
//!   `machine::recovery`) the ordered calls of every restore, at start-up or after a loss,
//!   (in `machine::control`) dialling, setting up and retiring workers and configuring them,
//!   (in `machine::servers`) creating variables and the chief's start (probe, then restore or
//!   afresh), (in `machine::save`) reading a consistent cut for a checkpoint, and (in
//!   `machine::membership`) elastic workers: a worker joining the running job or drained
//!   out of it;
//! - `executor` is the one executor of the machine's actions, which the actor and the
//!   simulator both run: what each action asks of the world (calls, answers, fences), and
//!   where each call's outcome goes in the machine;
//! - `actor` moves the executor's calls over QUIC (and the checkpoint storage's work onto
//!   blocking threads) and answers the program's waits;
//! - `restore` is the restore's IO (sending a server's shards, reading a checkpoint);
//! - `client` is the blocking [`ClusterCoordinator`] API over the actor: it forwards the
//!   program's requests to the machine and waits for their end; it writes the checkpoints the
//!   machine reads (the checkpoint manager's IO).

mod actor;
mod client;
pub(crate) mod executor;
mod machine;
mod restore;

pub(crate) use restore::shard_restores;

pub use actor::{
    ChiefStopping, ClusterView, CoordinatorActor, Counters, JoinedWorkers, ServerTopology,
    StatusView, Topology,
};
pub use client::{
    CheckpointError, ClusterCoordinator, CoordinatorError, Encoded, PendingSave, RemoteValue,
    SavedInBackground, VariableProblem, VariableSpec, PROGRAM_STATE_KEY, SAVE_WAIT_MAX,
};
pub use machine::recovery::{
    CallFault, CheckpointRef, LoadFault, PositionsError, RestoreCall, RestoreReport,
    WorkerPositions, DATASET_POSITIONS_KEY,
};
pub use machine::{
    CheckpointBuildError, ClosureError, ClosureFailure, ClosureId, ClosureOutcomeError,
    ClosureState, ConfigureError, ConfigureTicket, ControlCounters, CoordinatorStatus, CreateError,
    CreateTicket, CutReadError, CutReading, CutState, CutTicket, CutWriteError, DrainDisposition,
    KnownTask, Ledger, LedgerState, MalformedRead, MarkCutError, PositionsTicket, PsDial,
    PsLossCause, RestoreTicket, ResultDisposition, ScheduleError, Scheduler, SchedulerAction,
    SchedulerConfig, ServerProbe, SetUpDisposition, ShardRead, StartFailure, TaskLiveness,
    WorkerDial, WorkerIncarnation, PREEMPTION_CUTS_DIR, PREEMPTION_CUT_MAX,
};
