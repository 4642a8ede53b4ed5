//! The one executor of the coordinator's actions: what every [`SchedulerAction`] asks of the
//! world, and where each answer goes in the machine. The coordinator actor and the simulator
//! both run it; each only moves its [`Call`]s (the actor over QUIC, the simulator over its
//! simulated network) and hands the outcome back to [`deliver`].
//!
//! - [`plan`] turns one action into [`Effect`]s: calls (each naming its target incarnation,
//!   its request, how long it may take and where its answer goes), answers to whoever waits
//!   for a request the machine ended, and a fence (the fenced incarnation's calls fail from
//!   now on).
//! - [`deliver`] turns a call's outcome (the [`Reply`], or the [`CallFault`] for why none
//!   came) into the machine's `handle_*` input, and logs what an operator needs to read.
//!
//! Neither touches a socket, a thread or a clock: time is passed in. What differs between the
//! actor and the simulator is only how a request travels and how its answer is read.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::machine::recovery::{CallFault, CheckpointRef, LoadFault, RestoreCall, RestoreReport};
use super::machine::{
    ClosureId, ClosureOutcomeError, ConfigureError, ConfigureTicket, CreateError, CreateTicket,
    CutReadError, CutReading, CutTicket, CutWriteError, PositionsTicket, PsDial, RestoreTicket,
    ResultDisposition, Scheduler, SchedulerAction, ServerProbe, SetUpDisposition, ShardRead,
    StartFailure, WorkerDial, WorkerIncarnation,
};
use crate::layout::Layout;
use crate::roles::protocol::{
    BeginRestore, CreateVariable, DrainRefusal, FenceWorker, FinishedBelow, LeaveAnswer, RollBack,
    RunClosure, RunClosureError, SetupWorker, Snapshot,
};

/// What the world does for one action.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Send a request; its outcome goes to [`deliver`] with the call's route.
    Call(Call),
    /// Tell whoever waits that a request the machine took ended.
    Answer(Answer),
    /// Incarnation `incarnation` of `worker` is fenced (FENCE-1): a call to it still in flight
    /// fails now, and nothing it sends may change state.
    Fenced {
        /// The worker.
        worker: u32,
        /// The fenced incarnation (and every older one).
        incarnation: WorkerIncarnation,
    },
}

/// One call: a request to one target, bounded in time, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Call {
    /// What to ask, and of whom.
    pub request: Request,
    /// How long the call may take; `None`: the world's bound for a call (the gateway's call
    /// timeout).
    pub bound: Option<Duration>,
    /// Where the outcome goes in the machine ([`deliver`]).
    pub route: Route,
}

/// Whom a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A worker: incarnation `incarnation`, or (`None`) whichever answers at its address.
    Worker {
        /// The worker.
        worker: u32,
        /// The incarnation meant; a call never reaches a newer one (FENCE-1).
        incarnation: Option<WorkerIncarnation>,
    },
    /// A parameter server: incarnation `incarnation`, or (`None`) whichever answers at its address.
    Ps {
        /// The server.
        ps: u32,
        /// The incarnation meant.
        incarnation: Option<u64>,
    },
    /// The checkpoint storage, local to the coordinator (blocking work, off its thread).
    Storage,
}

/// What a call asks, with its target.
#[derive(Debug)]
pub(crate) enum Request {
    /// Run a closure on incarnation `incarnation` of `worker`.
    Run {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
        /// The closure.
        msg: RunClosure,
    },
    /// Connect to `worker` and learn the incarnation that answers.
    DialWorker {
        /// The worker.
        worker: u32,
    },
    /// Set incarnation `incarnation` of `worker` up from scratch, its datasets rebuilt at the
    /// setup's positions ([`crate::roles::protocol::RewindWorker`]).
    Rewind {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
        /// The setup.
        setup: SetupWorker,
    },
    /// Give the live incarnation `incarnation` of `worker` a new setup, keeping the datasets it
    /// reads.
    Configure {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
        /// The setup.
        setup: SetupWorker,
    },
    /// Ask incarnation `incarnation` of `worker` where its datasets are.
    Positions {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
    },
    /// Tell the fenced (or declared dead) incarnation `incarnation` of `worker` to retire.
    RetireWorker {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
    },
    /// Ask server `ps` which incarnation answers, whether it serves, its restore generation
    /// and the closure ids it applied ([`crate::roles::protocol::PsStats`]).
    Stats {
        /// The server.
        ps: u32,
    },
    /// Tell the declared-dead incarnation `incarnation` of server `ps` to retire.
    RetirePs {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
    },
    /// Tell server `ps` (whichever incarnation answers) that a worker incarnation is fenced.
    Fence {
        /// The server.
        ps: u32,
        /// The fence.
        msg: FenceWorker,
    },
    /// Send server `ps` the low watermark.
    Watermark {
        /// The server.
        ps: u32,
        /// The watermark.
        msg: FinishedBelow,
    },
    /// Begin a restore on incarnation `incarnation` of server `ps`.
    BeginRestore {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
        /// The restore's generation and the fences to replay.
        msg: BeginRestore,
    },
    /// Send incarnation `incarnation` of server `ps` its shards of `checkpoint`.
    RestoreShards {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
        /// The checkpoint.
        checkpoint: CheckpointRef,
        /// Where every variable lives now.
        layouts: Vec<Layout>,
    },
    /// Roll incarnation `incarnation` of server `ps` back to the restored cut, re-opening it.
    RollBack {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
        /// The cut and the generation.
        msg: RollBack,
    },
    /// Create one shard of a variable on server `ps`.
    Create {
        /// The server.
        ps: u32,
        /// The shard's name, shape and initial value.
        msg: CreateVariable,
    },
    /// Read one shard of server `ps` for a save.
    Snapshot {
        /// The server.
        ps: u32,
        /// The shard.
        msg: Snapshot,
    },
    /// Read the checkpoint taken at closure `cut` under `root`, for restore `generation`.
    Load {
        /// The restore's generation (for the log).
        generation: u64,
        /// The checkpoint directory.
        root: PathBuf,
        /// The cut it was taken at.
        cut: ClosureId,
    },
    /// Build the checkpoint of a preemption cut and write it under `root`.
    WriteCut {
        /// The cut.
        cut: ClosureId,
        /// Where to write it.
        root: PathBuf,
        /// The servers that gave notice, for the log.
        leaving: Vec<u32>,
        /// What was read.
        reading: Box<CutReading>,
    },
}

impl Request {
    /// Whom it goes to.
    pub(crate) fn target(&self) -> Target {
        let worker_at = |worker: u32, incarnation: u64| Target::Worker {
            worker,
            incarnation: Some(incarnation),
        };
        let ps_at = |ps: u32, incarnation: u64| Target::Ps {
            ps,
            incarnation: Some(incarnation),
        };
        let any_ps = |ps: u32| Target::Ps {
            ps,
            incarnation: None,
        };
        match self {
            Request::Run {
                worker,
                incarnation,
                ..
            }
            | Request::Rewind {
                worker,
                incarnation,
                ..
            }
            | Request::Configure {
                worker,
                incarnation,
                ..
            }
            | Request::Positions {
                worker,
                incarnation,
            }
            | Request::RetireWorker {
                worker,
                incarnation,
            } => worker_at(*worker, *incarnation),
            Request::DialWorker { worker } => Target::Worker {
                worker: *worker,
                incarnation: None,
            },
            Request::RetirePs { ps, incarnation }
            | Request::BeginRestore {
                ps, incarnation, ..
            }
            | Request::RestoreShards {
                ps, incarnation, ..
            }
            | Request::RollBack {
                ps, incarnation, ..
            } => ps_at(*ps, *incarnation),
            Request::Stats { ps }
            | Request::Fence { ps, .. }
            | Request::Watermark { ps, .. }
            | Request::Create { ps, .. }
            | Request::Snapshot { ps, .. } => any_ps(*ps),
            Request::Load { .. } | Request::WriteCut { .. } => Target::Storage,
        }
    }
}

/// What a call got back when its target answered (a refusal or no answer is a [`CallFault`]).
#[derive(Debug)]
pub(crate) enum Reply {
    /// Done, nothing to report.
    Done,
    /// A closure's run: its value, or why the worker did not produce one.
    Ran(Result<Vec<u8>, RunClosureError>),
    /// A worker's incarnation answered a dial.
    Worker {
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// The incarnation that answered is one the failure detector declared dead (frozen past
    /// the budget, then woken).
    DeclaredDead {
        /// The incarnation.
        incarnation: u64,
    },
    /// A server's statistics (its `ps` is the target's).
    Server {
        /// Which incarnation answered, its restore generation, the ids it applied, and
        /// whether it holds any variable.
        probe: ServerProbe,
    },
    /// A worker's dataset positions.
    Positions(Vec<(String, u64)>),
    /// One shard as read.
    Shard(ShardRead),
    /// The checkpoint at a cut (`None`: none verifies any more), or why it could not be
    /// looked for.
    Loaded(Result<Option<CheckpointRef>, LoadFault>),
    /// A preemption cut's checkpoint written, or why not.
    CutWritten(Result<(), CutWriteError>),
}

impl Reply {
    /// Its name, for a refusal that names an answer it did not expect.
    fn name(&self) -> &'static str {
        match self {
            Reply::Done => "done",
            Reply::Ran(_) => "a closure's run",
            Reply::Worker { .. } => "a worker's incarnation",
            Reply::DeclaredDead { .. } => "an incarnation declared dead",
            Reply::Server { .. } => "a server's statistics",
            Reply::Positions(_) => "dataset positions",
            Reply::Shard(_) => "a shard",
            Reply::Loaded(_) => "a checkpoint",
            Reply::CutWritten(_) => "a cut's checkpoint written",
        }
    }
}

/// Where a call's outcome goes in the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// [`Scheduler::handle_result`] and its kin.
    Run {
        /// The worker.
        worker: u32,
        /// The incarnation it ran on.
        incarnation: WorkerIncarnation,
        /// The closure.
        closure: ClosureId,
        /// The attempt.
        attempt: u32,
        /// When it was sent (the chief's step latency).
        sent: Instant,
    },
    /// [`Scheduler::handle_worker_dialled`].
    WorkerDial {
        /// The worker.
        worker: u32,
    },
    /// [`Scheduler::handle_worker_set_up`].
    SetUp {
        /// The worker.
        worker: u32,
        /// The incarnation.
        incarnation: WorkerIncarnation,
        /// The setup version.
        version: u64,
    },
    /// [`Scheduler::handle_reconfigured`].
    Reconfigure {
        /// The configuration.
        ticket: ConfigureTicket,
        /// The worker.
        worker: u32,
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// [`Scheduler::handle_positions`].
    Positions {
        /// The collection.
        ticket: PositionsTicket,
        /// The worker.
        worker: u32,
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// [`Scheduler::handle_drain_positions`].
    DrainPositions {
        /// The worker.
        worker: u32,
        /// The draining incarnation.
        incarnation: WorkerIncarnation,
    },
    /// [`Scheduler::handle_worker_retired`].
    RetireWorker {
        /// The worker.
        worker: u32,
        /// The incarnation.
        incarnation: WorkerIncarnation,
    },
    /// [`Scheduler::handle_ps_dialled`].
    PsDial {
        /// The server.
        ps: u32,
    },
    /// [`Scheduler::handle_ps_retired`].
    RetirePs {
        /// The server.
        ps: u32,
        /// The incarnation.
        incarnation: u64,
    },
    /// [`Scheduler::handle_fence_sent`].
    Fence {
        /// The fenced worker.
        worker: u32,
        /// The fenced incarnation.
        incarnation: WorkerIncarnation,
        /// The server told.
        ps: u32,
    },
    /// [`Scheduler::handle_watermark_sent`].
    Watermark {
        /// The server told.
        ps: u32,
    },
    /// [`Scheduler::handle_restore_report`].
    Restore {
        /// The restore's generation.
        generation: u64,
        /// Which call of the restore.
        step: RestoreStep,
    },
    /// [`Scheduler::handle_shard_created`].
    CreateShard {
        /// The creation.
        ticket: CreateTicket,
        /// The server.
        ps: u32,
        /// The shard's index.
        shard: usize,
    },
    /// [`Scheduler::handle_server_probed`].
    StartProbe {
        /// The start.
        ticket: RestoreTicket,
        /// The server.
        ps: u32,
    },
    /// [`Scheduler::handle_shard_read`].
    Snapshot {
        /// The read.
        ticket: CutTicket,
        /// Its attempt.
        attempt: u32,
        /// The server.
        ps: u32,
        /// The shard.
        shard: String,
    },
    /// [`Scheduler::handle_preemption_cut_written`].
    CutWritten {
        /// The read.
        ticket: CutTicket,
    },
}

/// Which call of a restore an outcome answers (the [`RestoreReport`] it becomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestoreStep {
    /// [`RestoreReport::Begun`].
    Begin {
        /// The server.
        ps: u32,
    },
    /// [`RestoreReport::Loaded`].
    Load,
    /// [`RestoreReport::ShardsRestored`].
    Shards {
        /// The server.
        ps: u32,
    },
    /// [`RestoreReport::RolledBack`].
    RollBack {
        /// The server.
        ps: u32,
    },
    /// [`RestoreReport::Rewound`].
    Rewind {
        /// The worker.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
    },
}

/// A request the machine took ended: whoever waits for it is told.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The chief's start, or a restore asked for at start, ended.
    Started {
        /// The request.
        ticket: RestoreTicket,
        /// The step restored (`None`: afresh), or why it failed.
        result: Result<Option<u64>, StartFailure>,
    },
    /// A configuration reached every live worker, or the first refusal.
    Configured {
        /// The request.
        ticket: ConfigureTicket,
        /// The outcome.
        result: Result<(), ConfigureError>,
    },
    /// A variable's creation ended.
    VariableCreated {
        /// The request.
        ticket: CreateTicket,
        /// The outcome.
        result: Result<(), CreateError>,
    },
    /// A save's read ended.
    CutRead {
        /// The request.
        ticket: CutTicket,
        /// The cut, or why none can be taken.
        result: Result<CutReading, CutReadError>,
    },
    /// A worker incarnation's drain ended: it may go.
    Drained {
        /// The worker.
        worker: u32,
        /// The drained incarnation.
        incarnation: WorkerIncarnation,
    },
    /// A parameter server's preemption notice is answered.
    PsLeaving {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
        /// The answer.
        answer: LeaveAnswer,
    },
    /// A parameter server's request to leave the job is answered.
    PsDraining {
        /// The server.
        ps: u32,
        /// Its incarnation.
        incarnation: u64,
        /// Whether it may go.
        result: Result<(), DrainRefusal>,
    },
}

/// What [`deliver`] did that the world may want to know (the actor's step latency, the
/// simulator's FENCE-1 check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// A closure's result committed.
    Committed {
        /// The worker that ran it.
        worker: u32,
        /// Its incarnation.
        incarnation: WorkerIncarnation,
        /// The closure.
        closure: ClosureId,
        /// From its dispatch to its commit.
        took: Duration,
    },
    /// Anything else.
    Other,
}

/// What the world does for `action`, drained from `scheduler` at `now`.
///
/// Longer than most functions here on purpose: a flat table with one arm per
/// [`SchedulerAction`], so that what every action asks of the world reads in one place.
pub(crate) fn plan(scheduler: &Scheduler, now: Instant, action: SchedulerAction) -> Vec<Effect> {
    let call = |request: Request, route: Route| {
        Effect::Call(Call {
            request,
            bound: None,
            route,
        })
    };
    match action {
        SchedulerAction::Dispatch {
            worker,
            incarnation,
            closure,
            attempt,
            generation,
            function,
            args,
            learning_rate,
        } => {
            // Each server's incarnation the closure's pushes are meant for.
            let servers = (0..scheduler.server_span())
                .map(|ps| {
                    scheduler
                        .ps_incarnation(ps)
                        .map_or(0, |(incarnation, _)| incarnation)
                })
                .collect();
            let msg = RunClosure {
                closure: closure.0,
                attempt,
                generation,
                function,
                args,
                servers,
                learning_rate,
            };
            // Bounded by the step timeout, not the call timeout: a long step is never cut
            // while its worker heartbeats.
            vec![Effect::Call(Call {
                request: Request::Run {
                    worker,
                    incarnation,
                    msg,
                },
                bound: Some(scheduler.config().step_timeout),
                route: Route::Run {
                    worker,
                    incarnation,
                    closure,
                    attempt,
                    sent: now,
                },
            })]
        }
        SchedulerAction::Fence {
            worker,
            incarnation,
        } => {
            tracing::info!(
                "fencing worker/{worker} incarnation {incarnation} on every parameter server (FENCE-1)"
            );
            let mut effects: Vec<Effect> = scheduler
                .servers_in_job()
                .into_iter()
                .map(|ps| {
                    let msg = FenceWorker {
                        worker,
                        incarnation,
                    };
                    call(
                        Request::Fence { ps, msg },
                        Route::Fence {
                            worker,
                            incarnation,
                            ps,
                        },
                    )
                })
                .collect();
            effects.push(Effect::Fenced {
                worker,
                incarnation,
            });
            effects
        }
        SchedulerAction::Restore(restore) => vec![restore_call(restore)],
        SchedulerAction::RestoreFinished { ticket, result } => {
            vec![Effect::Answer(Answer::Started { ticket, result })]
        }
        SchedulerAction::Watermark {
            finished_below,
            generation,
        } => scheduler
            .servers_in_job()
            .into_iter()
            .map(|ps| {
                let msg = FinishedBelow {
                    closure: finished_below.0,
                    generation,
                };
                call(Request::Watermark { ps, msg }, Route::Watermark { ps })
            })
            .collect(),
        SchedulerAction::DialPs { ps } => vec![call(Request::Stats { ps }, Route::PsDial { ps })],
        SchedulerAction::RetirePs { ps, incarnation } => vec![call(
            Request::RetirePs { ps, incarnation },
            Route::RetirePs { ps, incarnation },
        )],
        SchedulerAction::DialWorker { worker } => vec![call(
            Request::DialWorker { worker },
            Route::WorkerDial { worker },
        )],
        SchedulerAction::SetUpWorker {
            worker,
            incarnation,
            setup,
            version,
        } => vec![call(
            Request::Rewind {
                worker,
                incarnation,
                setup,
            },
            Route::SetUp {
                worker,
                incarnation,
                version,
            },
        )],
        SchedulerAction::RetireWorker {
            worker,
            incarnation,
        } => vec![call(
            Request::RetireWorker {
                worker,
                incarnation,
            },
            Route::RetireWorker {
                worker,
                incarnation,
            },
        )],
        SchedulerAction::Reconfigure {
            ticket,
            worker,
            incarnation,
            setup,
        } => vec![call(
            Request::Configure {
                worker,
                incarnation,
                setup,
            },
            Route::Reconfigure {
                ticket,
                worker,
                incarnation,
            },
        )],
        SchedulerAction::ConfigureFinished { ticket, result } => {
            vec![Effect::Answer(Answer::Configured { ticket, result })]
        }
        SchedulerAction::AskPositions {
            ticket,
            worker,
            incarnation,
        } => vec![call(
            Request::Positions {
                worker,
                incarnation,
            },
            Route::Positions {
                ticket,
                worker,
                incarnation,
            },
        )],
        SchedulerAction::CreateShard {
            ticket,
            ps,
            shard,
            msg,
        } => vec![call(
            Request::Create { ps, msg },
            Route::CreateShard { ticket, ps, shard },
        )],
        SchedulerAction::VariableCreated { ticket, result } => {
            vec![Effect::Answer(Answer::VariableCreated { ticket, result })]
        }
        SchedulerAction::ProbeServer { ticket, ps } => vec![call(
            Request::Stats { ps },
            Route::StartProbe { ticket, ps },
        )],
        SchedulerAction::SnapshotShard {
            ticket,
            attempt,
            ps,
            shard,
        } => {
            let msg = Snapshot {
                name: shard.clone(),
            };
            vec![call(
                Request::Snapshot { ps, msg },
                Route::Snapshot {
                    ticket,
                    attempt,
                    ps,
                    shard,
                },
            )]
        }
        SchedulerAction::CutRead { ticket, result } => {
            vec![Effect::Answer(Answer::CutRead { ticket, result })]
        }
        SchedulerAction::AskDrainPositions {
            worker,
            incarnation,
        } => vec![call(
            Request::Positions {
                worker,
                incarnation,
            },
            Route::DrainPositions {
                worker,
                incarnation,
            },
        )],
        SchedulerAction::DrainFinished {
            worker,
            incarnation,
        } => {
            tracing::info!(
                "worker/{worker} (incarnation {incarnation}) drained: its closures finished and its \
                 dataset positions are kept; it leaves the job"
            );
            vec![Effect::Answer(Answer::Drained {
                worker,
                incarnation,
            })]
        }
        SchedulerAction::WritePreemptionCut {
            ticket,
            cut,
            root,
            leaving,
            reading,
        } => vec![call(
            Request::WriteCut {
                cut,
                root,
                leaving,
                reading,
            },
            Route::CutWritten { ticket },
        )],
        SchedulerAction::AnswerPsLeaving {
            ps,
            incarnation,
            answer,
        } => {
            vec![Effect::Answer(Answer::PsLeaving {
                ps,
                incarnation,
                answer,
            })]
        }
        SchedulerAction::AnswerPsDraining {
            ps,
            incarnation,
            result,
        } => {
            match &result {
                Ok(()) => tracing::info!(
                    "ps/{ps} (incarnation {incarnation}) left the job: its variables are on the other \
                     servers"
                ),
                Err(refusal) => tracing::warn!("{refusal}"),
            }
            vec![Effect::Answer(Answer::PsDraining {
                ps,
                incarnation,
                result,
            })]
        }
    }
}

/// The call that carries out one call of a restore.
fn restore_call(restore: RestoreCall) -> Effect {
    let (generation, step, request) = match restore {
        RestoreCall::Begin {
            ps,
            incarnation,
            generation,
            fences,
            afresh,
        } => {
            log_begin(ps, incarnation, generation, afresh);
            let msg = BeginRestore {
                generation,
                fences,
                afresh,
            };
            let request = Request::BeginRestore {
                ps,
                incarnation,
                msg,
            };
            (generation, RestoreStep::Begin { ps }, request)
        }
        RestoreCall::Load {
            generation,
            root,
            cut,
        } => {
            let request = Request::Load {
                generation,
                root,
                cut,
            };
            (generation, RestoreStep::Load, request)
        }
        RestoreCall::Shards {
            ps,
            incarnation,
            generation,
            checkpoint,
            layouts,
        } => {
            let request = Request::RestoreShards {
                ps,
                incarnation,
                checkpoint,
                layouts,
            };
            (generation, RestoreStep::Shards { ps }, request)
        }
        RestoreCall::RollBack {
            ps,
            incarnation,
            generation,
            finished_below,
        } => {
            let msg = RollBack {
                finished_below: finished_below.0,
                generation,
            };
            let request = Request::RollBack {
                ps,
                incarnation,
                msg,
            };
            (generation, RestoreStep::RollBack { ps }, request)
        }
        RestoreCall::Rewind {
            worker,
            incarnation,
            generation,
            setup,
        } => {
            let request = Request::Rewind {
                worker,
                incarnation,
                setup,
            };
            (
                generation,
                RestoreStep::Rewind {
                    worker,
                    incarnation,
                },
                request,
            )
        }
    };
    Effect::Call(Call {
        request,
        bound: None,
        route: Route::Restore { generation, step },
    })
}

/// Says what a restore's begin on server `ps` is: a start afresh (nothing was lost, and nothing
/// is read back), or a restore from a checkpoint.
fn log_begin(ps: u32, incarnation: u64, generation: u64, afresh: bool) {
    if afresh {
        tracing::info!(
            "restore generation {generation}: ps/{ps} (incarnation {incarnation}) starts afresh \
             (no checkpoint; an earlier chief's pushes are refused from now on)"
        );
    } else {
        tracing::warn!(
            "restore generation {generation}: ps/{ps} (incarnation {incarnation}) is restored \
             from a checkpoint with every other server"
        );
    }
}

/// Hands a call's outcome (`outcome`: what came back, or why nothing did) to the machine
/// where `route` says, at `now`.
///
/// Longer than most functions here on purpose: one arm per [`Route`], each the machine's
/// input and what an operator reads in the log, kept whole as [`plan`] is.
pub(crate) fn deliver(
    scheduler: &mut Scheduler,
    now: Instant,
    route: Route,
    outcome: Result<Reply, CallFault>,
) -> Delivered {
    match route {
        Route::Run {
            worker,
            incarnation,
            closure,
            attempt,
            sent,
        } => {
            return run_delivered(
                scheduler,
                now,
                (worker, incarnation),
                closure,
                attempt,
                sent,
                outcome,
            )
        }
        Route::WorkerDial { worker } => {
            let dial = match outcome {
                Ok(Reply::Worker { incarnation }) => WorkerDial::Answered { incarnation },
                Ok(Reply::DeclaredDead { incarnation }) => WorkerDial::DeclaredDead { incarnation },
                other => {
                    tracing::debug!("worker/{worker} not reachable yet: {}", fault_of(other));
                    WorkerDial::Unreachable
                }
            };
            scheduler.handle_worker_dialled(now, worker, dial);
        }
        Route::SetUp {
            worker,
            incarnation,
            version,
        } => {
            let result = done(outcome);
            let failure = result.as_ref().err().map(|f| f.to_string());
            match scheduler.handle_worker_set_up(now, worker, incarnation, version, result) {
                SetUpDisposition::Up => tracing::info!("worker/{worker} up (incarnation {incarnation})"),
                SetUpDisposition::Outdated => tracing::debug!(
                    "worker/{worker} (incarnation {incarnation}) was set up from an outdated setup; \
                     setting it up again"
                ),
                SetUpDisposition::Failed => tracing::debug!(
                    "setting up worker/{worker} (incarnation {incarnation}): {}",
                    failure.unwrap_or_default()
                ),
            }
        }
        Route::Reconfigure {
            ticket,
            worker,
            incarnation,
        } => {
            let result = done(outcome);
            if let Err(e) = &result {
                tracing::warn!("setting up worker/{worker} (incarnation {incarnation}): {e}");
            }
            scheduler.handle_reconfigured(now, ticket, worker, incarnation, result);
        }
        Route::Positions {
            ticket,
            worker,
            incarnation,
        } => {
            let result = positions(outcome);
            if let Err(e) = &result {
                tracing::warn!(
                    "worker/{worker} (incarnation {incarnation}) did not report its dataset positions \
                     for the checkpoint: {e}; it is restarted from its last setup's positions, \
                     which the checkpoint records"
                );
            }
            scheduler.handle_positions(now, ticket, worker, incarnation, result);
        }
        Route::DrainPositions {
            worker,
            incarnation,
        } => {
            let result = positions(outcome);
            if let Err(e) = &result {
                tracing::warn!(
                    "draining worker/{worker} (incarnation {incarnation}) did not report its dataset \
                     positions: {e}; those of its last setup are kept"
                );
            }
            scheduler.handle_drain_positions(now, worker, incarnation, result);
        }
        Route::RetireWorker {
            worker,
            incarnation,
        } => {
            let result = done(outcome);
            match &result {
                Ok(()) => tracing::info!(
                    "worker/{worker} (incarnation {incarnation}) was fenced but is alive: retired it, so \
                     that it restarts as a new incarnation"
                ),
                Err(e) => tracing::debug!("retiring worker/{worker}: {e}"),
            }
            scheduler.handle_worker_retired(worker, incarnation, result);
        }
        Route::PsDial { ps } => {
            let dial = match outcome {
                Ok(Reply::Server { probe }) => PsDial::Answered {
                    incarnation: probe.incarnation,
                    serving: probe.serving,
                },
                Ok(Reply::DeclaredDead { incarnation }) => PsDial::DeclaredDead { incarnation },
                other => {
                    tracing::debug!("ps/{ps} not reachable yet: {}", fault_of(other));
                    PsDial::Unreachable
                }
            };
            scheduler.handle_ps_dialled(now, ps, dial);
        }
        Route::RetirePs { ps, incarnation } => {
            let result = done(outcome);
            match &result {
                Ok(()) => tracing::warn!(
                    "ps/{ps} (incarnation {incarnation}) was declared dead but is alive: retired it, so \
                     that it restarts as a new incarnation"
                ),
                Err(e) => tracing::debug!("retiring ps/{ps}: {e}"),
            }
            scheduler.handle_ps_retired(ps, incarnation, result);
        }
        Route::Fence {
            worker,
            incarnation,
            ps,
        } => {
            let result = done(outcome);
            if let Err(e) = &result {
                tracing::warn!("fencing worker/{worker} on ps/{ps}: {e}");
            }
            scheduler.handle_fence_sent(worker, incarnation, ps, result);
        }
        Route::Watermark { ps } => {
            let result = done(outcome);
            if let Err(e) = &result {
                tracing::debug!("low watermark to ps/{ps}: {e}");
            }
            scheduler.handle_watermark_sent(ps, result);
        }
        Route::Restore { generation, step } => {
            let report = restore_report(step, outcome);
            scheduler.handle_restore_report(now, generation, report);
        }
        Route::CreateShard { ticket, ps, shard } => {
            scheduler.handle_shard_created(now, ticket, ps, shard, done(outcome));
        }
        Route::StartProbe { ticket, ps } => {
            let result = match outcome {
                Ok(Reply::Server { probe }) => Ok(ServerProbe { ps, ..probe }),
                // As a connection refused: the probe is asked again.
                Ok(Reply::DeclaredDead { incarnation }) => Err(CallFault::Unreachable(format!(
                    "ps/{ps} answered as incarnation {incarnation}, declared dead"
                ))),
                other => Err(fault_of(other)),
            };
            scheduler.handle_server_probed(now, ticket, ps, result);
        }
        Route::Snapshot {
            ticket,
            attempt,
            ps,
            shard,
        } => {
            let result = match outcome {
                Ok(Reply::Shard(read)) => Ok(read),
                other => Err(fault_of(other)),
            };
            scheduler.handle_shard_read(now, ticket, attempt, ps, &shard, result);
        }
        Route::CutWritten { ticket } => {
            let result = match outcome {
                Ok(Reply::CutWritten(result)) => result,
                other => Err(CutWriteError::WriterLost(Box::new(fault_of(other)))),
            };
            scheduler.handle_preemption_cut_written(now, ticket, result);
        }
    }
    Delivered::Other
}

/// A closure's run answered (or not): the machine hears its result, a refusal, a server
/// that could not be reached, or the worker lost.
fn run_delivered(
    scheduler: &mut Scheduler,
    now: Instant,
    (worker, incarnation): (u32, WorkerIncarnation),
    closure: ClosureId,
    attempt: u32,
    sent: Instant,
    outcome: Result<Reply, CallFault>,
) -> Delivered {
    match outcome {
        Ok(Reply::Ran(Ok(value))) => {
            let disposition =
                scheduler.handle_result(now, worker, incarnation, closure, attempt, Ok(value));
            if disposition == ResultDisposition::Committed {
                return Delivered::Committed {
                    worker,
                    incarnation,
                    closure,
                    took: now.saturating_duration_since(sent),
                };
            }
        }
        Ok(Reply::Ran(Err(RunClosureError::Step(message)))) => {
            let error = ClosureOutcomeError::Step(message);
            scheduler.handle_result(now, worker, incarnation, closure, attempt, Err(error));
        }
        Ok(Reply::Ran(Err(RunClosureError::PsUnavailable(unavailable)))) => {
            tracing::warn!(
                "worker/{worker} could not run closure {}: {unavailable}; holding dispatch until \
                 the parameter server is back",
                closure.0
            );
            scheduler.handle_ps_unavailable(
                now,
                worker,
                incarnation,
                closure,
                attempt,
                unavailable.ps,
            );
        }
        Ok(Reply::Ran(Err(RunClosureError::Refused(refusal)))) => refused(
            scheduler,
            now,
            (worker, incarnation),
            closure,
            attempt,
            &refusal,
        ),
        Err(CallFault::Refused(refusal)) => refused(
            scheduler,
            now,
            (worker, incarnation),
            closure,
            attempt,
            &refusal,
        ),
        other => {
            tracing::warn!(
                "worker/{worker} (incarnation {incarnation}) lost while running closure {}: {}",
                closure.0,
                fault_of(other)
            );
            scheduler.handle_worker_lost(now, worker, incarnation);
        }
    }
    Delivered::Other
}

/// A worker could not take a closure: it runs elsewhere, and that incarnation is retired;
/// unless the refusal was for an attempt superseded since or came from a fenced incarnation
/// (e.g. a worker refusing a closure of an older chief or restore generation): the machine
/// ignores that, and the log says so rather than announce a retirement that never happens.
fn refused(
    scheduler: &mut Scheduler,
    now: Instant,
    (worker, incarnation): (u32, WorkerIncarnation),
    closure: ClosureId,
    attempt: u32,
    refusal: &dyn std::fmt::Display,
) {
    match scheduler.handle_refused(now, worker, incarnation, closure, attempt) {
        ResultDisposition::RejectedStale => tracing::info!(
            "worker/{worker} (incarnation {incarnation}) refused closure {} attempt {attempt}, \
             superseded since: {refusal}; ignored",
            closure.0
        ),
        _ => tracing::warn!(
            "worker/{worker} (incarnation {incarnation}) could not run closure {}: {refusal}; \
             running it elsewhere and retiring that incarnation",
            closure.0
        ),
    }
}

/// A restore call's outcome as the restore machine hears it.
fn restore_report(step: RestoreStep, outcome: Result<Reply, CallFault>) -> RestoreReport {
    match step {
        RestoreStep::Begin { ps } => RestoreReport::Begun {
            ps,
            result: done(outcome),
        },
        RestoreStep::Load => {
            let result = match outcome {
                Ok(Reply::Loaded(result)) => result,
                other => Err(LoadFault::ReaderLost(Box::new(fault_of(other)))),
            };
            RestoreReport::Loaded { result }
        }
        RestoreStep::Shards { ps } => RestoreReport::ShardsRestored {
            ps,
            result: done(outcome),
        },
        RestoreStep::RollBack { ps } => RestoreReport::RolledBack {
            ps,
            result: done(outcome),
        },
        RestoreStep::Rewind {
            worker,
            incarnation,
        } => {
            let result = done(outcome);
            if let Err(e) = &result {
                tracing::warn!("rewinding worker/{worker}'s datasets: {e}");
            }
            RestoreReport::Rewound {
                worker,
                incarnation,
                result,
            }
        }
    }
}

/// A call that expects nothing back: done, or why not (an answer of another kind is a
/// refusal).
fn done(outcome: Result<Reply, CallFault>) -> Result<(), CallFault> {
    match outcome {
        Ok(Reply::Done) => Ok(()),
        other => Err(fault_of(other)),
    }
}

/// A positions request's outcome.
fn positions(outcome: Result<Reply, CallFault>) -> Result<Vec<(String, u64)>, CallFault> {
    match outcome {
        Ok(Reply::Positions(list)) => Ok(list),
        other => Err(fault_of(other)),
    }
}

/// Why an outcome is not the answer its call expected: its fault, or a refusal naming the
/// answer that came instead.
fn fault_of(outcome: Result<Reply, CallFault>) -> CallFault {
    match outcome {
        Err(fault) => fault,
        Ok(reply) => CallFault::Refused(format!("unexpected answer: {}", reply.name())),
    }
}
