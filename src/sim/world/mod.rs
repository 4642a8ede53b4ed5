//! The simulated world: the event queue, the processes and their machines, the network, the
//! checkpoint storage, and the invariant checks (see the module doc of [`super`]).
//!
//! Everything happens in `handle(event)`, one event at a time, in (time, sequence) order; the
//! only randomness is the scenario's network draws, so a scenario replays exactly.
//!
//! This module owns the [`World`] itself: its state, its construction, the event queue and the
//! main loop that hands each event to its handler. The handlers live in one room per concern,
//! each an `impl World` block over the same state:
//! - `network`: the messages, their links (latency, loss, duplication, partitions) and delivery;
//! - `processes`: the processes' lifecycle (kill, pause, restart, preemption, drains, scaling)
//!   and the faults the scenario injects into them;
//! - `server` and `worker`: the parameter servers' and workers' real machines, the simulator
//!   standing in for their actors (and the worker's compute thread);
//! - `shell`: the coordinator's shell: the coordinator's one executor (the actor's too) run
//!   over the simulated network, its calls sent and their replies read as the gateway reads
//!   them;
//! - `detector`: the chief's failure detector and the supervisors' exit reports;
//! - `chief`: the chief program (schedule, join, save, start from a checkpoint);
//! - `storage`: the simulated checkpoint storage, its faults and its verified reads;
//! - `checks`: the invariants checked after every event and at the end;
//! - `job`: the simulated job itself (its variables, gradients, dataset, coordinator);
//! - `report`: the [`SimReport`] and the trace hash.
//!
//! No room keeps state of its own: everything a run holds is a field of [`World`], so that one
//! seed's run is one value, replayed exactly.

mod checks;
mod chief;
mod detector;
mod job;
mod network;
mod processes;
mod report;
mod server;
mod shell;
mod storage;
mod worker;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::outcome::{ExpectedEnd, UnexpectedEnd};
use super::{Node, Scenario, SimConfig, Violation, EXTRA_SERVERS_MAX, EXTRA_WORKERS_MAX};
use crate::checkpoint::Checkpoint;
use crate::layout::Layout;
use crate::roles::coordinator::executor::{Reply, Route};
use crate::roles::coordinator::{CutTicket, CutWriteError, Scheduler};

use chief::{Chief, ChiefPhase};
use detector::Detect;
use job::new_coordinator;
use network::{Msg, HOLD_RETRY};
use processes::{FaultEvent, ProcState};
use report::FNV_OFFSET;
use server::PsProc;
use shell::{Call, NoReply};
use storage::{Snapshots, Stored};
use worker::WorkerProc;

pub use report::SimReport;

/// One run's whole state: the clock and the event queue, the processes and their machines, the
/// network's partitions and calls in flight, the storage, and the harness's records the
/// invariants are checked against.
pub(super) struct World<'a> {
    config: &'a SimConfig,
    scenario: &'a Scenario,
    rng: ChaCha8Rng,
    /// The supervisor's exit reports: whether one is sent, and when it arrives (a stream of
    /// its own, so that the other draws of a seed do not move).
    reports: ChaCha8Rng,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    events: u64,
    trace_hash: u64,
    trace: Vec<String>,
    coord: Scheduler,
    /// The chief process (coordinator and program): up or down, and its incarnation.
    chief_state: ProcState,
    chief_incarnation: u64,
    servers: Vec<PsProc>,
    workers: Vec<WorkerProc>,
    /// Cut-off nodes: until when, and whether only their outgoing messages are lost.
    partitions: BTreeMap<Node, (Duration, bool)>,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    chief: Chief,
    storage: Vec<Stored>,
    detector: BTreeMap<Node, Detect>,
    /// FENCE-1: per worker, the newest incarnation the coordinator fenced.
    fenced: BTreeMap<u32, u64>,
    /// Server snapshots taken for saves, by id.
    snapshots: Snapshots,
    /// Closure ids the live chief incarnation has dispatched (PS-1 across chief restarts).
    dispatched: BTreeSet<u64>,
    /// Closures committed before the checkpoint the live chief incarnation resumed from.
    committed_before: BTreeSet<u64>,
    /// Whether a server ever applied a closure's push, took a watermark above closure 0 (ids
    /// given out, which no new chief may give out again) or began a restore of a checkpoint's
    /// shards: the harness's own record of whether a chief without a checkpoint may find
    /// servers it must count as trained
    /// ([`ExpectedEnd::ChiefWithoutCheckpoint`](super::outcome::ExpectedEnd)'s cause).
    servers_trained: bool,
    /// DATA-1: per restore generation, the stored checkpoint its shards came from (`None`: a
    /// chief's start afresh, which puts every worker at the start of its data). A generation
    /// is a chief incarnation's: a later chief over servers that restarted may open one a dead
    /// chief used, and the newest begin of it counts.
    restored_from: BTreeMap<u64, Option<usize>>,
    /// The checkpoints restores send to the servers, by stored index (as the restore read
    /// them).
    restoring: BTreeMap<usize, Arc<Checkpoint>>,
    /// Chief incarnations that resumed from a checkpoint.
    chief_resumes: u64,
    /// Every set of layouts a message carried, by index (messages carry the index).
    layout_sets: Vec<Vec<Layout>>,
    /// Servers started to join, and let go for good.
    ps_joined: u64,
    /// Workers past the spec that joined (each start of one).
    workers_joined: u64,
    /// Closures workers past the spec ran whole (their answers as the chief reads them).
    ran_past_spec: u64,
    /// READ-1: what each run of a closure read as its step began.
    reads: BTreeMap<RunKey, ServersRead>,
    ps_left: u64,
    deaths_reported: u64,
    reports_ignored: u64,
    deaths_refused: u64,
    unreadable_cuts: u64,
    ps_lost_before_first_cut: u64,
    /// How each preemption cut's write went, by the chief incarnation that wrote it and its
    /// read's ticket, until the event that tells the coordinator comes (an event is hashed
    /// into the trace; the error is not hashable).
    cut_writes: BTreeMap<(u64, u64), Result<(), CutWriteError>>,
    violation: Option<Violation>,
    /// How the job ended, once it did: finished, or an expected end
    /// ([`outcome`](super::outcome)).
    ended: Option<Result<(), ExpectedEnd>>,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Queued {
    at: Duration,
    seq: u64,
    event: Event,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Event {
    /// The coordinator's periodic work: detector, dials, watermark, timeouts, the program.
    Tick,
    Inject(FaultEvent),
    Resume {
        node: Node,
        incarnation: u64,
    },
    Restart {
        node: Node,
    },
    Deliver {
        from: Node,
        to: Node,
        to_incarnation: u64,
        sent: Duration,
        /// Boxed: the event queue moves its entries as it orders them, and a message (a push
        /// with its gradients) is many times the size of every other event.
        msg: Box<Msg>,
    },
    CallTimeout {
        call: u64,
    },
    PushTimeout {
        worker: u32,
        incarnation: u64,
        run: u64,
        ps: u32,
    },
    /// A worker's step finished computing: its pushes go out.
    Computed {
        worker: u32,
        incarnation: u64,
        run: u64,
    },
    Loaded {
        generation: u64,
        cut: u64,
    },
    /// The preemption grace of incarnation `incarnation` of `node` is over: it exits if it still runs.
    GraceOver {
        node: Node,
        incarnation: u64,
    },
    /// The chief (incarnation `chief`) finished writing its program's checkpoint.
    SaveWritten {
        chief: u64,
    },
    /// The chief (incarnation `chief`) finished writing the preemption cut read as `ticket`
    /// (how it went waits in `World::cut_writes`).
    PreemptionCutWritten {
        chief: u64,
        ticket: u64,
    },
    /// The workers' failure detectors: chief incarnation `incarnation` has been silent since it was
    /// killed for the detection budget.
    ChiefSilent {
        incarnation: u64,
    },
    /// Worker incarnation `incarnation` of `worker` has waited its bound for a new chief.
    ChiefWaitOver {
        worker: u32,
        incarnation: u64,
    },
    /// The supervisor's report that incarnation `incarnation` of `node` exited reaches the chief.
    ExitReported {
        node: Node,
        incarnation: u64,
    },
}

/// A run of a closure: its worker, that worker's incarnation, the closure and the attempt.
type RunKey = (u32, u64, u64, u32);
/// What a step read as it began (READ-1): each running server's process and restore
/// generation, by server.
type ServersRead = BTreeMap<u32, (u64, u64)>;

impl<'a> World<'a> {
    /// The job at its start (the spec's servers and every worker up, a chief about to save a
    /// first checkpoint), with the scenario's faults queued at their times.
    pub(super) fn new(config: &'a SimConfig, scenario: &'a Scenario) -> Self {
        let servers = (0..config.num_ps + EXTRA_SERVERS_MAX)
            .map(|ps| PsProc::new(ps, config.num_ps))
            .collect();
        // The spec's workers up; those past it not started (out of the job until one joins).
        let workers = (0..config.num_workers + EXTRA_WORKERS_MAX)
            .map(|w| {
                if w < config.num_workers {
                    WorkerProc::new(w, config)
                } else {
                    WorkerProc::not_started(w, config)
                }
            })
            .collect();
        let mut world = Self {
            config,
            scenario,
            rng: ChaCha8Rng::seed_from_u64(scenario.seed),
            reports: ChaCha8Rng::seed_from_u64(scenario.seed ^ super::REPORT_STREAM),
            base: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: 0,
            trace_hash: FNV_OFFSET,
            trace: Vec::new(),
            coord: new_coordinator(config, config.num_ps),
            chief_state: ProcState::Up,
            chief_incarnation: 1,
            servers,
            workers,
            partitions: BTreeMap::new(),
            calls: BTreeMap::new(),
            next_call: 0,
            chief: Chief {
                scheduled: 0,
                batches: 0,
                // The program creates its variables and starts (afresh), then saves a
                // checkpoint before training, as a program does that wants every server loss
                // to be recoverable.
                phase: ChiefPhase::Starting(Duration::ZERO),
                saves: 0,
                startup_failures: 0,
                spec_servers: config.num_ps,
                read: BTreeMap::new(),
                background: None,
            },
            storage: Vec::new(),
            detector: BTreeMap::new(),
            fenced: BTreeMap::new(),
            snapshots: Vec::new(),
            dispatched: BTreeSet::new(),
            committed_before: BTreeSet::new(),
            servers_trained: false,
            restored_from: BTreeMap::new(),
            restoring: BTreeMap::new(),
            chief_resumes: 0,
            layout_sets: Vec::new(),
            ps_joined: 0,
            workers_joined: 0,
            ran_past_spec: 0,
            reads: BTreeMap::new(),
            ps_left: 0,
            deaths_reported: 0,
            deaths_refused: 0,
            reports_ignored: 0,
            unreadable_cuts: 0,
            ps_lost_before_first_cut: 0,
            cut_writes: BTreeMap::new(),
            violation: None,
            ended: None,
        };
        world.schedule_faults();
        world.at(Duration::ZERO, Event::Tick);
        world
    }

    /// Runs events in (time, sequence) order until the job ends, an invariant breaks, or
    /// nothing is left to happen; after each event the coordinator's actions are carried out
    /// and the invariants checked.
    pub(super) fn run(mut self) -> SimReport {
        while self.violation.is_none() && self.ended.is_none() {
            let Some(Reverse(next)) = self.queue.pop() else {
                self.violate(
                    "LIVENESS",
                    "nothing left to happen, and the job has not ended".into(),
                );
                break;
            };
            if next.at > self.config.time_max {
                self.violate(
                    "LIVENESS",
                    format!(
                        "the job did not end within {:?} of simulated time (ledger {:?}; \
                         oldest unfinished closure {} is {:?}; live workers {})",
                        self.config.time_max,
                        self.coord.ledger(),
                        self.coord.low_watermark().0,
                        self.coord.state(self.coord.low_watermark()),
                        self.coord.live_workers()
                    ),
                );
                break;
            }
            self.now = next.at;
            self.events += 1;
            self.record(&next.event);
            self.handle(next.event);
            self.drive();
            self.check();
        }
        if self.violation.is_none() {
            if let Some(Ok(())) = &self.ended {
                self.check_end_to_end();
            }
        }
        self.into_report()
    }

    /// Queues `event` at simulated time `at` (after every event queued before it for then).
    fn at(&mut self, at: Duration, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at,
            seq: self.seq,
            event,
        }));
    }

    /// The simulated time as the machines take it.
    fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// The job ends without finishing: with an expected end whose cause the scenario bears
    /// out, or else a violation (`END`): an error no documented end explains.
    fn end_early(&mut self, end: Result<ExpectedEnd, UnexpectedEnd>) {
        let trained = self.servers_trained;
        match end.and_then(|end| end.cause_holds(self.scenario, trained).map(|()| end)) {
            Ok(end) => self.ended = Some(Err(end)),
            Err(unexpected) => self.violate("END", unexpected.to_string()),
        }
    }

    /// Records `invariant` broken (the first one only: the run stops there).
    fn violate(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                invariant,
                detail,
                at_ms: self.now.as_millis() as u64,
                event: self.events,
            });
        }
    }

    /// Hands one event to its handler.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Tick => {
                self.tick();
                self.at(self.now + TICK, Event::Tick);
            }
            Event::Inject(fault) => self.inject(fault),
            Event::Resume { node, incarnation } => {
                if self.state(node) == (ProcState::Paused, incarnation) {
                    self.set_state(node, ProcState::Up);
                }
            }
            Event::Restart { node } => self.restart(node),
            Event::Deliver {
                from,
                to,
                to_incarnation,
                sent,
                msg,
            } => self.deliver(from, to, to_incarnation, sent, *msg),
            Event::CallTimeout { call } => self.on_reply(call, Err(NoReply::NoAnswerInTime)),
            Event::PushTimeout {
                worker,
                incarnation,
                run,
                ps,
            } => {
                if self.state(Node::Worker(worker)) == (ProcState::Paused, incarnation) {
                    // A paused process's timers fire once it runs again.
                    let event = Event::PushTimeout {
                        worker,
                        incarnation,
                        run,
                        ps,
                    };
                    self.at(self.now + HOLD_RETRY, event);
                } else {
                    self.push_answered(worker, incarnation, run, ps, None);
                }
            }
            Event::Loaded { generation, cut } => self.load(generation, cut),
            Event::GraceOver { node, incarnation } => {
                if self.state(node).1 == incarnation {
                    self.kill(node);
                }
            }
            Event::SaveWritten { chief } => self.save_written(chief),
            Event::PreemptionCutWritten { chief, ticket } => {
                let result = self.cut_writes.remove(&(chief, ticket));
                // A chief that died meanwhile took its coordinator (and the cut) with it.
                if let Some(result) = result.filter(|_| {
                    chief == self.chief_incarnation && self.chief_state == ProcState::Up
                }) {
                    let route = Route::CutWritten {
                        ticket: CutTicket(ticket),
                    };
                    self.hand_to_machine(route, Ok(Reply::CutWritten(result)));
                }
            }
            Event::ChiefSilent { incarnation } => self.chief_silent(incarnation),
            Event::ExitReported { node, incarnation } => self.exit_reported(node, incarnation),
            Event::ChiefWaitOver {
                worker,
                incarnation,
            } => {
                let now = self.instant();
                let waited = self.config.ps_restart_wait;
                let w = &mut self.workers[worker as usize];
                if w.incarnation == incarnation
                    && w.state != ProcState::Down
                    && w.machine.handle_chief_wait_over(now, waited).is_some()
                {
                    self.kill(Node::Worker(worker));
                }
            }
            Event::Computed {
                worker,
                incarnation,
                run,
            } => self.computed(worker, incarnation, run),
        }
    }
}

/// The coordinator's tick (its reconnect interval, and the detector's resolution).
const TICK: Duration = Duration::from_millis(100);
