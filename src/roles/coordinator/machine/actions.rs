//! What the coordinator machine tells its shell: the actions it emits
//! ([`SchedulerAction`], drained with [`Scheduler::poll_action`]), and the small values its
//! inputs and outputs carry (a closure's state, a dial's or a probe's answer, what became of a
//! result).

use super::*;

/// Where a closure is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClosureState {
    /// Waiting in the queue.
    Queued,
    /// Running on a worker incarnation.
    InFlight {
        /// The worker's index.
        worker: u32,
        /// The worker's incarnation.
        incarnation: WorkerIncarnation,
        /// Which attempt (1 for the first dispatch).
        attempt: u32,
    },
    /// Finished; its encoded return value.
    Committed(Vec<u8>),
    /// Finished without a value.
    Failed(ClosureFailure),
}

/// What the shell must do, drained with [`Scheduler::poll_action`].
#[derive(Debug, Clone, PartialEq)]
pub enum SchedulerAction {
    /// Send this closure to this worker incarnation.
    Dispatch {
        /// Target worker index.
        worker: u32,
        /// Target worker incarnation.
        incarnation: WorkerIncarnation,
        /// The closure.
        closure: ClosureId,
        /// Attempt number (1 for the first dispatch).
        attempt: u32,
        /// The restore generation ([`Scheduler::generation`]): the worker's pushes carry it.
        generation: u64,
        /// The registered function name.
        function: String,
        /// Encoded arguments.
        args: Vec<u8>,
        /// The learning rate in force when it was scheduled
        /// ([`Scheduler::handle_set_learning_rate`]): the same on every attempt.
        learning_rate: Option<LearningRate>,
    },
    /// A worker incarnation is gone: nothing it sends may change state any more (FENCE-1).
    /// The shell tells every parameter server ([`crate::roles::protocol::FenceWorker`]),
    /// answering each with [`Scheduler::handle_fence_sent`]. If the incarnation still
    /// answers, the next dial retires it ([`SchedulerAction::RetireWorker`]).
    Fence {
        /// The worker index.
        worker: u32,
        /// The fenced incarnation (and every older one).
        incarnation: WorkerIncarnation,
    },
    /// One call of a restore (see `recovery`): carry it out on the incarnation it names and
    /// answer with [`Scheduler::handle_restore_report`].
    Restore(RestoreCall),
    /// The chief's start ([`Scheduler::handle_start`]) or a restore asked for with
    /// [`Scheduler::handle_restore_at_start`] ended: the checkpoint's step, `None` for a start
    /// afresh, or why it failed.
    RestoreFinished {
        /// The ticket the request got.
        ticket: RestoreTicket,
        /// The step restored (`None`: started afresh), or why not.
        result: Result<Option<u64>, StartFailure>,
    },
    /// Dial parameter server `ps` with a real call ([`crate::roles::protocol::PsStats`]): only
    /// an answer proves an incarnation alive. Answer with [`Scheduler::handle_ps_dialled`].
    DialPs {
        /// The server.
        ps: u32,
    },
    /// Tell incarnation `incarnation` of parameter server `ps`, declared dead but answering, to
    /// retire ([`crate::roles::protocol::Retire`]): it can do nothing useful any more
    /// (FENCE-1), and its supervisor restarts it as a new incarnation, which is restored.
    RetirePs {
        /// The server.
        ps: u32,
        /// The incarnation declared dead.
        incarnation: u64,
    },
    /// Send the low watermark to every parameter server
    /// ([`crate::roles::protocol::FinishedBelow`]): every closure below `finished_below` is
    /// finished for good (PS-1 may forget their ids), computed in restore `generation` (a
    /// server that rolled back since ignores it). A server that misses one gets the next.
    /// Each server's answer goes to [`Scheduler::handle_watermark_sent`].
    Watermark {
        /// The low watermark.
        finished_below: ClosureId,
        /// The restore generation it was computed in.
        generation: u64,
    },
    /// Dial worker `worker` (connect and learn the incarnation that answers). Answer with
    /// [`Scheduler::handle_worker_dialled`].
    DialWorker {
        /// The worker.
        worker: u32,
    },
    /// Set up the new incarnation `incarnation` of `worker` from scratch
    /// ([`crate::roles::protocol::RewindWorker`] with `setup`). Answer with
    /// [`Scheduler::handle_worker_set_up`], passing `version` back.
    SetUpWorker {
        /// The worker.
        worker: u32,
        /// The incarnation that answered the dial.
        incarnation: WorkerIncarnation,
        /// What it is set up with.
        setup: SetupWorker,
        /// The setup version it was made from.
        version: u64,
    },
    /// Tell incarnation `incarnation` of `worker`, fenced (or declared dead) but answering, to
    /// retire ([`crate::roles::protocol::Retire`]) so that it restarts as a new incarnation.
    /// Answer with [`Scheduler::handle_worker_retired`].
    RetireWorker {
        /// The worker.
        worker: u32,
        /// The fenced incarnation.
        incarnation: WorkerIncarnation,
    },
    /// Send the live incarnation `incarnation` of `worker` its new setup
    /// ([`crate::roles::protocol::SetupWorker`]) for configuration `ticket`. Answer with
    /// [`Scheduler::handle_reconfigured`].
    Reconfigure {
        /// The configuration.
        ticket: ConfigureTicket,
        /// The worker.
        worker: u32,
        /// Its live incarnation.
        incarnation: WorkerIncarnation,
        /// What it is set up with now.
        setup: SetupWorker,
    },
    /// A configuration asked for with [`Scheduler::handle_reconfigure`] reached every live
    /// worker: `Ok`, or the first refusal.
    ConfigureFinished {
        /// The ticket the request got.
        ticket: ConfigureTicket,
        /// The first refusal, if any.
        result: Result<(), ConfigureError>,
    },
    /// Ask the live incarnation `incarnation` of `worker` where its datasets are
    /// ([`crate::roles::protocol::DatasetPositions`]) for collection `ticket`. Answer with
    /// [`Scheduler::handle_positions`].
    AskPositions {
        /// The collection.
        ticket: PositionsTicket,
        /// The worker.
        worker: u32,
        /// Its live incarnation.
        incarnation: WorkerIncarnation,
    },
    /// Create shard `shard` of a variable on server `ps` (the message says its name, shape
    /// and initial value). Answer with [`Scheduler::handle_shard_created`].
    CreateShard {
        /// The creation.
        ticket: CreateTicket,
        /// The server.
        ps: u32,
        /// The shard's index in the layout.
        shard: usize,
        /// What to send.
        msg: crate::roles::protocol::CreateVariable,
    },
    /// A creation asked for with [`Scheduler::handle_create_variable`] ended: `Ok`, or the
    /// first failure.
    VariableCreated {
        /// The ticket the request got.
        ticket: CreateTicket,
        /// The first failure, if any.
        result: Result<(), CreateError>,
    },
    /// Ask server `ps` ([`crate::roles::protocol::PsStats`]) which incarnation answers, its
    /// restore generation and the closure ids it has applied, for the chief's start. Answer
    /// with [`Scheduler::handle_server_probed`].
    ProbeServer {
        /// The start.
        ticket: RestoreTicket,
        /// The server.
        ps: u32,
    },
    /// Read shard `shard` of server `ps` ([`crate::roles::protocol::Snapshot`]) for attempt
    /// `attempt` of a save's read. Answer with [`Scheduler::handle_shard_read`].
    SnapshotShard {
        /// The read.
        ticket: CutTicket,
        /// The attempt.
        attempt: u32,
        /// The server.
        ps: u32,
        /// The shard's name.
        shard: String,
    },
    /// A save's read asked for with [`Scheduler::handle_read_cut`] ended: the checkpoint to
    /// write, or why none can be taken.
    CutRead {
        /// The ticket the request got.
        ticket: CutTicket,
        /// The cut, or why not.
        result: Result<CutReading, CutReadError>,
    },
    /// Ask the draining incarnation `incarnation` of `worker`, which runs nothing now, where its
    /// datasets are ([`crate::roles::protocol::DatasetPositions`]; see `membership`).
    /// Answer with [`Scheduler::handle_drain_positions`].
    AskDrainPositions {
        /// The worker.
        worker: u32,
        /// The draining incarnation.
        incarnation: WorkerIncarnation,
    },
    /// The drain of incarnation `incarnation` of `worker` ended (see `membership`): it may go.
    DrainFinished {
        /// The worker.
        worker: u32,
        /// The drained incarnation.
        incarnation: WorkerIncarnation,
    },
    /// A parameter server's preemption cut was read (`preempt`): build its checkpoint and
    /// write it under `root` (blocking work: off the actor's thread), then answer with
    /// [`Scheduler::handle_preemption_cut_written`].
    WritePreemptionCut {
        /// The read.
        ticket: CutTicket,
        /// The cut (the checkpoint's ledger records it as its next closure id).
        cut: ClosureId,
        /// Where to write it ([`PREEMPTION_CUTS_DIR`] under the checkpoint directory).
        root: PathBuf,
        /// The servers that gave notice, for the log.
        leaving: Vec<u32>,
        /// What was read.
        reading: Box<CutReading>,
    },
    /// Answer parameter server `ps`'s preemption notice from incarnation `incarnation` (see
    /// [`Scheduler::handle_ps_leaving`]).
    AnswerPsLeaving {
        /// The server.
        ps: u32,
        /// The incarnation that gave notice.
        incarnation: u64,
        /// The answer.
        answer: crate::roles::protocol::LeaveAnswer,
    },
    /// Answer parameter server `ps`'s request to leave the job from incarnation `incarnation`
    /// ([`Scheduler::handle_ps_draining`]): `Ok`, it may go (it exits 0); else it stays.
    AnswerPsDraining {
        /// The server.
        ps: u32,
        /// The incarnation that asked.
        incarnation: u64,
        /// The answer.
        result: Result<(), crate::roles::protocol::DrainRefusal>,
    },
}

/// What a dial of a parameter server found ([`SchedulerAction::DialPs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsDial {
    /// Incarnation `incarnation` answered, holding variables (`serving`) or not.
    Answered {
        /// The incarnation.
        incarnation: u64,
        /// Whether it holds any variable.
        serving: bool,
    },
    /// It answered as incarnation `incarnation`, which the failure detector declared dead.
    DeclaredDead {
        /// The incarnation.
        incarnation: u64,
    },
    /// No answer (not up yet, unreachable, refused): dialled again at the next tick.
    Unreachable,
}

/// Names a restore asked for with [`Scheduler::handle_restore_at_start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RestoreTicket(pub u64);

/// A parameter server as it answered before a restore at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerProbe {
    /// Its index.
    pub ps: u32,
    /// The incarnation that answered.
    pub incarnation: u64,
    /// The restore generation it is at.
    pub generation: u64,
    /// The smallest closure id above every id it has applied.
    pub next_free_closure_id: u64,
    /// Whether it holds a variable (and so may take a push of an earlier chief's closure).
    pub serving: bool,
    /// Whether a restore began there and was not rolled back: its variables may be a
    /// checkpoint's, restored part way by an earlier chief.
    pub restoring: bool,
}

/// What became of a result a worker reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultDisposition {
    /// The result committed its closure.
    Committed,
    /// The function failed; the error is recorded for `join` and queued closures were cancelled.
    Failed,
    /// From a fenced incarnation or a superseded attempt: ignored (FENCE-1).
    RejectedStale,
    /// The worker could not run the closure: its incarnation was fenced and the closure queued
    /// again, as for a lost worker.
    WorkerLost,
    /// A parameter server was unreachable: the closure was queued again and dispatch is held
    /// until the servers are back (and restored if one lost its state).
    PsUnavailable,
}
