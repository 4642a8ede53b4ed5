//! The simulated world: the event queue, the processes and their machines, the network, the
//! checkpoint storage, and the invariant checks (see the module doc of [`super`]).
//!
//! Everything happens in `handle(event)`, one event at a time, in (time, sequence) order; the
//! only randomness is the scenario's network draws, so a scenario replays exactly.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::outcome::{self, ExpectedEnd, UnexpectedEnd};
use super::{Fault, Node, Scenario, SimConfig, StorageFault, Violation, EXTRA_SERVERS_MAX};
use crate::checkpoint::{
    checkpoint_dir_name, decode_checkpoint, encode_checkpoint_at, Checkpoint, LoadError,
};
use crate::layout::{Dtype, Layout, Shard};
use crate::optim::{OptimError, Optimizer, Slots};
use crate::roles::coordinator::{
    shard_restores, CallFault, CheckpointRef, ClosureId, ConfigureTicket, CutReadError, CutReading,
    CutTicket, CutWriteError, Ledger, PositionsTicket, PsDial, RestoreCall, RestoreReport,
    RestoreTicket, ResultDisposition, Scheduler, SchedulerAction, SchedulerConfig, ServerProbe,
    ShardRead, StartFailure, WorkerDial,
};
use crate::roles::protocol::{
    bytes_to_f32, BlobError, LeaveAnswer, PsUnavailable, RestoreVariable, RunClosure,
    RunClosureError, SetupWorker, WorkerRefusal,
};
use crate::roles::ps::{Gradient, ParameterStore, PsError, PushOrigin, PushOutcome};
use crate::roles::push::PlannedPush;
use crate::roles::worker::{DatasetPlan, Request, StepAction, StepError, WorkerMachine};

/// How a run ended, and what it saw.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The scenario's seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Every closure committed and the job ended without an error.
    pub finished: bool,
    /// How the job ended without finishing, if it did: an expected end, its cause borne out
    /// by the scenario (any other end is a violation).
    pub failure: Option<ExpectedEnd>,
    /// The first invariant broken, if any (the run stops there).
    pub violation: Option<Violation>,
    /// A hash of every event line, in order: equal for equal traces.
    pub trace_hash: u64,
    /// Every event line, when [`SimConfig::record_trace`] is set.
    pub trace: Vec<String>,
    /// The ledger at the end.
    pub ledger: Ledger,
    /// Simulated time at the end, milliseconds.
    pub sim_ms: u64,
    /// Chief incarnations that resumed the job from a checkpoint.
    pub chief_resumes: u64,
    /// Workers drained out of the job (let go by the chief, never restarted).
    pub drained: u64,
    /// Parameter servers started to join the running job.
    pub ps_joined: u64,
    /// Parameter servers let go for good after their variables moved.
    pub ps_left: u64,
    /// Incarnations declared dead from their supervisor's exit report.
    pub deaths_reported: u64,
    /// Exit reports that named an incarnation the chief no longer watched (replaced, or
    /// declared dead already): nothing done.
    pub reports_ignored: u64,
    /// Incarnations declared dead because a probe of their address was refused (their process
    /// was down, its successor not started yet, and no partition in between).
    pub deaths_refused: u64,
    /// Restores that found no checkpoint at their cut that verifies (damaged after it became
    /// the cut): a recovery then rolls back to the cut before.
    pub unreadable_cuts: u64,
    /// Parameter servers killed while the program wrote a checkpoint whose cut was read and not
    /// marked yet, with no cut before it (a recovery waits for that one).
    pub ps_lost_before_first_cut: u64,
}

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
    chief_epoch: u64,
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
    /// DATA-1: per restore generation, the stored checkpoint its shards came from.
    restored_from: BTreeMap<u64, usize>,
    /// The checkpoints restores send to the servers, by stored index (as the restore read
    /// them).
    restoring: BTreeMap<usize, Arc<Checkpoint>>,
    /// Chief incarnations that resumed from a checkpoint.
    chief_resumes: u64,
    /// Every set of layouts a message carried, by index (messages carry the index).
    layout_sets: Vec<Vec<Layout>>,
    /// Servers started to join, and let go for good.
    ps_joined: u64,
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
    /// How the job ended, once it did: finished, or an expected end ([`outcome`]).
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
        epoch: u64,
    },
    Restart {
        node: Node,
    },
    Deliver {
        from: Node,
        to: Node,
        to_epoch: u64,
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
        epoch: u64,
        run: u64,
        ps: u32,
    },
    /// A worker's step finished computing: its pushes go out.
    Computed {
        worker: u32,
        epoch: u64,
        run: u64,
    },
    Loaded {
        generation: u64,
        cut: u64,
    },
    /// The preemption grace of incarnation `epoch` of `node` is over: it exits if it still runs.
    GraceOver {
        node: Node,
        epoch: u64,
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
    /// The workers' failure detectors: chief incarnation `epoch` has been silent since it was
    /// killed for the detection budget.
    ChiefSilent {
        epoch: u64,
    },
    /// Worker incarnation `epoch` of `worker` has waited its bound for a new chief.
    ChiefWaitOver {
        worker: u32,
        epoch: u64,
    },
    /// The supervisor's report that incarnation `epoch` of `node` exited reaches the chief.
    ExitReported {
        node: Node,
        epoch: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum FaultEvent {
    Kill(Node),
    Pause(Node, u64),
    Partition(Node, u64, bool),
    Preempt(Node),
    Drain(u32),
    Rejoin(u32),
    PsJoin,
    PsLeave,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Msg {
    /// A coordinator call.
    Request {
        call: u64,
        req: Req,
    },
    /// Its answer.
    Reply {
        call: u64,
        resp: Resp,
    },
    /// Worker to server (the planned push, blobs and all), and back.
    Push {
        run: u64,
        push: crate::roles::protocol::Push,
        blobs: Vec<bytes::Bytes>,
    },
    PushReply {
        ps: u32,
        run: u64,
        /// `None`: the server was unavailable (not serving, or refused the push).
        result: Option<PushOutcome>,
    },
    /// A worker's preemption notice to the chief ([`crate::roles::protocol::Leaving`]), and
    /// the chief's answer.
    Leaving {
        worker: u32,
        epoch: u64,
    },
    /// A parameter server's preemption notice to the chief (the same message).
    PsLeaving {
        ps: u32,
        epoch: u64,
    },
    LeaveAnswer(LeaveAnswer),
    /// A worker's drain request to the chief ([`crate::roles::protocol::Draining`]), and the
    /// chief's answer once it is drained.
    Draining {
        worker: u32,
        epoch: u64,
    },
    Drained,
    /// A drained worker's new incarnation registers with the chief
    /// ([`crate::roles::protocol::Joining`]).
    Joining {
        worker: u32,
        epoch: u64,
    },
    /// A parameter server registers with the chief ([`crate::roles::protocol::Joining`]):
    /// at every start and with every new chief.
    PsJoining {
        ps: u32,
        epoch: u64,
    },
    /// A server asks to leave the job for good ([`crate::roles::protocol::Draining`]), and
    /// the chief's answer: go (its variables are elsewhere), or stay.
    PsDraining {
        ps: u32,
        epoch: u64,
    },
    PsDrainAnswer {
        go: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Req {
    Run {
        closure: u64,
        attempt: u32,
        generation: u64,
        /// The sending chief's incarnation.
        chief: u64,
    },
    /// A dial: whichever incarnation listens at the address answers with its epoch.
    Hello,
    /// Set a new incarnation up with the dataset starting at `skip` (setup `version`, from
    /// chief incarnation `chief`, with the layouts of set `layouts`).
    SetUp {
        version: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// Rebuild the dataset at `skip`.
    Rewind {
        version: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// A new setup for a live worker, the dataset (if new to it) at `skip`.
    Configure {
        version: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// Where its datasets are.
    Positions,
    Probe,
    Retire,
    Fence {
        worker: u32,
        epoch: u64,
    },
    Watermark {
        below: u64,
        generation: u64,
    },
    Begin {
        generation: u64,
        fences: Vec<(u32, u64)>,
    },
    Shards {
        stored: usize,
        layouts: usize,
    },
    RollBack {
        below: u64,
        generation: u64,
    },
    /// Read one shard for a save.
    Snapshot {
        shard: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Resp {
    Done,
    Refused(String),
    /// The serving gate refused: the actor is not serving (yet), as the gateway answers
    /// `ActorUnavailable` (calling again may succeed).
    Unavailable(String),
    Run(RunResult),
    Probe {
        epoch: u64,
        serving: bool,
        generation: u64,
        next_free: u64,
    },
    Hello {
        epoch: u64,
    },
    Positions(Vec<(String, u64)>),
    Snapshot(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum RunResult {
    Committed,
    PsUnavailable(u32),
    /// The closure's own error.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcState {
    Up,
    Paused,
    Down,
}

struct PsProc {
    epoch: u64,
    state: ProcState,
    store: ParameterStore,
    /// The rows of each variable it holds a shard of.
    rows: BTreeMap<String, std::ops::Range<usize>>,
    /// Per row it holds, the closures whose effect the row holds, in the order applied
    /// (PS-1, and the end-to-end replay: rows moved from different servers keep their own
    /// orders).
    history: Histories,
    /// Every closure id whose effect it holds, to check PS-1 against.
    effective_set: BTreeSet<u64>,
    /// Not running and not restarted by its supervisor: not started yet (a server that may
    /// join), or let go for good.
    out: bool,
    /// Asked to leave the job for good, and not answered yet.
    leaving: bool,
}

/// Per (variable, row), the closures whose effect the row holds, in the order applied.
type Histories = BTreeMap<(String, usize), Vec<u64>>;

/// A worker process: its real machine ([`WorkerMachine`]), the simulator standing in for
/// its actor and compute thread.
struct WorkerProc {
    epoch: u64,
    state: ProcState,
    machine: WorkerMachine,
    /// The closure on the compute thread.
    run: Option<WorkerRun>,
    /// Jobs admitted and waiting for the compute thread, in order (a setup or a positions
    /// request queues behind the closures admitted before it, as on the real worker).
    waiting: std::collections::VecDeque<(u64, Job)>,
    /// Its dataset's position: elements read (each closure it runs reads one).
    position: u64,
    /// Set up or rewound and nothing read since (DATA-1 checks its first read).
    fresh: bool,
    /// Drained out of the job: down until the job is scaled up again.
    drained: bool,
    /// Its position at the last answer to the chief's drain read since the newest restore;
    /// kept once the drain finished (DATA-1 for a worker that rejoins).
    drain_read: Option<u64>,
    /// The position the chief keeps for it since it was drained (none once a restore put
    /// every worker at a checkpoint's positions).
    kept: Option<u64>,
}

/// A job for a worker's compute thread, as the real worker queues them (`WorkerJob`).
enum Job {
    /// A closure, and the incarnation of the chief that sent it.
    Run(RunClosure, u64),
    /// A setup (a new incarnation's, or a rewind: `rewind`) or a new configuration.
    Setup {
        setup: SetupWorker,
        rewind: bool,
        from_chief: u64,
    },
    Positions,
}

/// The closure on the compute thread: computing, then its pushes out.
struct WorkerRun {
    call: u64,
    /// Servers whose push has not settled yet.
    pending: BTreeSet<u32>,
    /// The servers' answers so far.
    answered: Vec<(u32, PushOutcome)>,
    /// A server found unavailable (the first, by index).
    unavailable: Option<u32>,
}

struct Call {
    to: Node,
    epoch: u64,
    kind: CallKind,
}

#[derive(Debug, Clone)]
enum CallKind {
    Run {
        worker: u32,
        epoch: u64,
        closure: u64,
        attempt: u32,
    },
    Dial {
        worker: u32,
    },
    SetUp {
        worker: u32,
        epoch: u64,
        version: u64,
    },
    Reconfigure {
        ticket: ConfigureTicket,
        worker: u32,
        epoch: u64,
    },
    Positions {
        ticket: PositionsTicket,
        worker: u32,
        epoch: u64,
    },
    DrainPositions {
        worker: u32,
        epoch: u64,
    },
    Probe {
        ps: u32,
    },
    RetireWorker {
        worker: u32,
        epoch: u64,
    },
    RetirePs {
        ps: u32,
        epoch: u64,
    },
    Fence {
        worker: u32,
        epoch: u64,
        ps: u32,
    },
    Watermark {
        ps: u32,
    },
    Restore {
        generation: u64,
        call: RestoreCall,
    },
    Snapshot {
        ticket: CutTicket,
        attempt: u32,
        ps: u32,
        shard: String,
    },
    /// A new chief incarnation probes a server before restoring.
    StartProbe {
        ticket: RestoreTicket,
        ps: u32,
    },
}

#[derive(Default)]
struct Detect {
    unheard_since: Option<Duration>,
    /// The incarnation last heard, and whether it was declared dead.
    seen: Option<u64>,
    declared: Option<u64>,
}

/// The chief program: schedule a batch, join, sometimes save, until every closure ran.
struct Chief {
    scheduled: u64,
    batches: u64,
    phase: ChiefPhase,
    saves: u32,
    /// Restores at start-up that failed (each one restarts the chief).
    startup_failures: u32,
    /// Per read of a cut and server, the snapshot its newest shard read returned, with the
    /// read's attempt (the harness's record of what the saved state holds, PS-1).
    read: BTreeMap<(CutTicket, u32, String), (u32, usize)>,
    /// A save written in the background while the program schedules on
    /// (`save_checkpoint_in_background`): the next save, and the job's end, wait for it.
    background: Option<Box<PendingWrite>>,
}

enum ChiefPhase {
    Schedule,
    Join,
    /// Time to save a checkpoint: ask the coordinator to read a cut.
    Save,
    /// The coordinator reads a cut for the save (read `ticket`).
    Saving {
        ticket: CutTicket,
    },
    /// The program writes the checkpoint of the cut read (and reads it back), as
    /// `save_checkpoint` does before it marks the cut; a fault may come meanwhile.
    Writing(Box<PendingWrite>),
    /// A new chief incarnation: start (probe every server, restore) at this time.
    Starting(Duration),
    /// The chief's start runs: restoring stored checkpoint `stored`, or afresh (`None`).
    Restoring {
        ticket: RestoreTicket,
        stored: Option<usize>,
    },
}

/// A checkpoint being written: the cut read (in restore `generation`), and the harness's
/// records of it taken when it was read.
struct PendingWrite {
    checkpoint: Checkpoint,
    generation: u64,
    history: Histories,
    committed: BTreeSet<u64>,
    scheduled: u64,
    batches: u64,
}

/// A server's answer to a shard read for a save, and the closures whose effect its state held
/// then (the harness's record, PS-1).
#[derive(Debug, Clone)]
struct PsSnapshot {
    read: ShardRead,
    /// The variable the shard is of.
    shard: String,
    /// The shard's rows, each with the closures whose effect it held.
    rows: Vec<(usize, Vec<u64>)>,
}

/// A checkpoint in the simulated storage: its files as the real encoder wrote them (and the
/// save's storage fault left them), and what the harness knows of the save.
struct Stored {
    /// File name → bytes: every shard and the manifest ([`encode_checkpoint_at`]).
    files: BTreeMap<String, Vec<u8>>,
    /// The checkpoint as saved: a restore that reads this one must load exactly it (CKPT-1).
    saved: Checkpoint,
    /// Per row of every variable, the closures whose effect its saved state holds (PS-1 and
    /// the replay after a restore).
    history: Histories,
    /// Per worker, its dataset's position (DATA-1).
    positions: BTreeMap<u32, u64>,
    /// The closures committed at the cut (the end-to-end check after a chief restart).
    committed: BTreeSet<u64>,
    /// A parameter server's preemption cut: only the recovery's loader reads it (it lives
    /// apart from the program's checkpoints, which a new chief starts from).
    preemption: bool,
    /// The chief program's progress: closures scheduled and batches run.
    scheduled: u64,
    batches: u64,
}

/// Snapshots taken and not yet saved, by id (each server's reply to `Snapshot`).
type Snapshots = Vec<PsSnapshot>;

impl<'a> World<'a> {
    pub(super) fn new(config: &'a SimConfig, scenario: &'a Scenario) -> Self {
        let servers = (0..config.num_ps + EXTRA_SERVERS_MAX)
            .map(|ps| {
                let mut p = PsProc {
                    epoch: 0,
                    state: ProcState::Down,
                    store: new_store(),
                    rows: BTreeMap::new(),
                    history: BTreeMap::new(),
                    effective_set: BTreeSet::new(),
                    out: true,
                    leaving: false,
                };
                if ps < config.num_ps {
                    // The spec's servers start with the job, server `ps` holding all of
                    // variable `ps`, as the chief program creates them.
                    p.epoch = 1;
                    p.state = ProcState::Up;
                    p.out = false;
                    p.store
                        .handle_create(&variable(ps), vec![WIDTH], initial(ps))
                        .expect("a fresh store takes a new variable");
                    p.rows.insert(variable(ps), 0..WIDTH);
                    for row in 0..WIDTH {
                        p.history.insert((variable(ps), row), Vec::new());
                    }
                }
                p
            })
            .collect();
        let workers = (0..config.num_workers)
            .map(|w| WorkerProc {
                epoch: 1,
                state: ProcState::Up,
                machine: WorkerMachine::new(w, 1, config.num_ps + EXTRA_SERVERS_MAX),
                run: None,
                waiting: Default::default(),
                position: 0,
                fresh: false,
                drained: false,
                drain_read: None,
                kept: None,
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
            chief_epoch: 1,
            servers,
            workers,
            partitions: BTreeMap::new(),
            calls: BTreeMap::new(),
            next_call: 0,
            chief: Chief {
                scheduled: 0,
                batches: 0,
                // A checkpoint before training, as a program does that wants every server
                // loss to be recoverable.
                phase: ChiefPhase::Save,
                saves: 0,
                startup_failures: 0,
                read: BTreeMap::new(),
                background: None,
            },
            storage: Vec::new(),
            detector: BTreeMap::new(),
            fenced: BTreeMap::new(),
            snapshots: Vec::new(),
            dispatched: BTreeSet::new(),
            committed_before: BTreeSet::new(),
            restored_from: BTreeMap::new(),
            restoring: BTreeMap::new(),
            chief_resumes: 0,
            layout_sets: Vec::new(),
            ps_joined: 0,
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
        for fault in &scenario.faults {
            let (at_ms, event) = match *fault {
                Fault::Kill { at_ms, node } => (at_ms, FaultEvent::Kill(node)),
                Fault::Pause {
                    at_ms,
                    node,
                    for_ms,
                } => (at_ms, FaultEvent::Pause(node, for_ms)),
                Fault::Partition {
                    at_ms,
                    node,
                    for_ms,
                    one_way,
                } => (at_ms, FaultEvent::Partition(node, for_ms, one_way)),
                Fault::Preempt { at_ms, node } => (at_ms, FaultEvent::Preempt(node)),
                Fault::Drain { at_ms, worker } => (at_ms, FaultEvent::Drain(worker)),
                Fault::Rejoin { at_ms, worker } => (at_ms, FaultEvent::Rejoin(worker)),
                Fault::PsJoin { at_ms } => (at_ms, FaultEvent::PsJoin),
                Fault::PsLeave { at_ms } => (at_ms, FaultEvent::PsLeave),
                Fault::Storage { .. } => continue,
            };
            world.at(Duration::from_millis(at_ms), Event::Inject(event));
        }
        world.at(Duration::ZERO, Event::Tick);
        world
    }

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
        let failure = match &self.ended {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        SimReport {
            seed: self.scenario.seed,
            events: self.events,
            finished: matches!(self.ended, Some(Ok(()))),
            failure,
            violation: self.violation,
            trace_hash: self.trace_hash,
            trace: self.trace,
            ledger: self.coord.ledger().clone(),
            sim_ms: self.now.as_millis() as u64,
            chief_resumes: self.chief_resumes,
            drained: self.workers.iter().filter(|w| w.drained).count() as u64,
            ps_joined: self.ps_joined,
            ps_left: self.ps_left,
            deaths_reported: self.deaths_reported,
            reports_ignored: self.reports_ignored,
            deaths_refused: self.deaths_refused,
            unreadable_cuts: self.unreadable_cuts,
            ps_lost_before_first_cut: self.ps_lost_before_first_cut,
        }
    }

    fn at(&mut self, at: Duration, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at,
            seq: self.seq,
            event,
        }));
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Folds the event into the trace hash (cheaply: every event of every schedule goes
    /// through here) and, if asked, keeps its line.
    fn record(&mut self, event: &Event) {
        let mut hasher = Fnv(self.trace_hash);
        std::hash::Hash::hash(&self.now, &mut hasher);
        std::hash::Hash::hash(event, &mut hasher);
        self.trace_hash = hasher.0;
        if self.config.record_trace {
            self.trace
                .push(format!("{:>9.3}s {event:?}", self.now.as_secs_f64()));
        }
    }

    /// The job ends without finishing: with an expected end whose cause the scenario bears
    /// out, or else a violation (`END`): an error no documented end explains.
    fn end_early(&mut self, end: Result<ExpectedEnd, UnexpectedEnd>) {
        match end.and_then(|end| end.cause_holds(self.scenario).map(|()| end)) {
            Ok(end) => self.ended = Some(Err(end)),
            Err(unexpected) => self.violate("END", unexpected.to_string()),
        }
    }

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

    // ---- processes -------------------------------------------------------------------------

    fn state(&self, node: Node) -> (ProcState, u64) {
        match node {
            Node::Chief => (self.chief_state, self.chief_epoch),
            Node::Ps(i) => (
                self.servers[i as usize].state,
                self.servers[i as usize].epoch,
            ),
            Node::Worker(i) => (
                self.workers[i as usize].state,
                self.workers[i as usize].epoch,
            ),
        }
    }

    fn set_state(&mut self, node: Node, state: ProcState) {
        match node {
            Node::Chief => self.chief_state = state,
            Node::Ps(i) => self.servers[i as usize].state = state,
            Node::Worker(i) => self.workers[i as usize].state = state,
        }
    }

    /// The process dies; its supervisor starts a new incarnation after the restart delay.
    fn kill(&mut self, node: Node) {
        if self.state(node).0 == ProcState::Down {
            return;
        }
        self.set_state(node, ProcState::Down);
        match node {
            Node::Worker(i) => {
                let w = &mut self.workers[i as usize];
                w.run = None;
                w.waiting.clear();
            }
            Node::Chief => self.kill_chief(),
            Node::Ps(_) => {
                let writing = matches!(self.chief.phase, ChiefPhase::Writing(_))
                    || self.chief.background.is_some();
                if writing && self.coord.cut().is_none() {
                    self.ps_lost_before_first_cut += 1;
                }
            }
        }
        // Every other chief comes back only after its workers' detectors declared it dead, so
        // that their wait for a new chief is driven too (a supervisor slow to reschedule it).
        let slow_chief = node == Node::Chief && self.chief_epoch % 2 == 1;
        let delay = if slow_chief {
            self.config.detection_budget + self.config.restart_delay
        } else {
            self.config.restart_delay
        };
        let at = self.now + delay;
        self.at(at, Event::Restart { node });
        self.report_exit(node);
    }

    /// The supervisor saw `node`'s process exit (a failure: every `kill` is one) and may
    /// tell the chief ([`crate::process::ExitReport`]): two times in three, after up to two
    /// restart delays, so that a report may also come after the new incarnation's hello
    /// (which must not be declared dead by it) or not at all (a supervisor that does not
    /// report, as Kubernetes).
    fn report_exit(&mut self, node: Node) {
        if node == Node::Chief || self.reports.gen_range(0..3) == 0 {
            return;
        }
        let epoch = self.state(node).1;
        let most = 2 * self.config.restart_delay.as_millis() as u64;
        let after = Duration::from_millis(self.reports.gen_range(0..=most));
        self.at(self.now + after, Event::ExitReported { node, epoch });
    }

    /// The chief process dies: its coordinator's state (closures, ledger, calls, what it
    /// dialled and set up) and its program's progress are gone. Servers keep their state;
    /// workers notice the silence after the detection budget and exit to be restarted.
    fn kill_chief(&mut self) {
        self.calls.clear();
        self.detector.clear();
        self.fenced.clear();
        self.chief.read.clear();
        // A write in the background dies with its process.
        self.chief.background = None;
        self.dispatched.clear();
        let epoch = self.chief_epoch;
        let at = self.now + self.config.detection_budget;
        self.at(at, Event::ChiefSilent { epoch });
    }

    /// A new chief incarnation starts as the real one does: a fresh coordinator, which probes
    /// every server and restores them from the newest checkpoint that verifies before its
    /// program goes on from that checkpoint's step.
    ///
    /// Its cluster spec names the servers running now (as the launcher gives a restarted
    /// chief: they are `0..n`, joins taking the lowest free index and leaves the highest);
    /// every running server registers with it again, and one waiting to leave asks again.
    fn restart_chief(&mut self) {
        self.chief_epoch += 1;
        self.chief_state = ProcState::Up;
        let servers = self.running_servers().len() as u32;
        self.coord = new_coordinator(self.config, servers);
        self.committed_before.clear();
        self.chief.phase = ChiefPhase::Starting(self.now);
        let chief = self.chief_epoch;
        for ps in self.running_servers() {
            let p = &self.servers[ps as usize];
            let (epoch, leaving) = (p.epoch, p.leaving);
            self.send(
                Node::Ps(ps),
                Node::Chief,
                chief,
                Msg::PsJoining { ps, epoch },
            );
            if leaving {
                self.send(
                    Node::Ps(ps),
                    Node::Chief,
                    chief,
                    Msg::PsDraining { ps, epoch },
                );
            }
        }
    }

    /// The workers' failure detectors declare chief incarnation `epoch` dead, if it is still
    /// the one that died (not back yet): each worker's machine decides (it waits for a new
    /// chief to set it up, as the real one does, within `ps_restart_wait` here, standing for
    /// its `worker_wait`).
    fn chief_silent(&mut self, epoch: u64) {
        if self.chief_epoch != epoch || self.chief_state != ProcState::Down {
            return;
        }
        let now = self.instant();
        for w in 0..self.config.num_workers {
            let worker = &mut self.workers[w as usize];
            if worker.state == ProcState::Down {
                continue;
            }
            let budget = self.config.detection_budget;
            let cause = cohort_actors::DeathCause::Silent { silent_for: budget };
            if worker.machine.handle_chief_lost(now, cause).is_some() {
                self.kill(Node::Worker(w));
            } else {
                let at = self.now + self.config.ps_restart_wait;
                let epoch = worker.epoch;
                self.at(at, Event::ChiefWaitOver { worker: w, epoch });
            }
        }
    }

    fn restart(&mut self, node: Node) {
        match node {
            Node::Chief => self.restart_chief(),
            Node::Ps(i) => {
                if self.servers[i as usize].out {
                    // Let go for good: its supervisor does not restart it.
                    return;
                }
                self.start_server(i);
            }
            Node::Worker(i) => {
                let w = &mut self.workers[i as usize];
                if w.drained {
                    // Out of the job for good: its supervisor does not restart it.
                    return;
                }
                w.epoch += 1;
                w.state = ProcState::Up;
                w.machine = WorkerMachine::new(i, w.epoch, self.config.num_ps + EXTRA_SERVERS_MAX);
                w.run = None;
                w.waiting.clear();
                w.position = 0;
                w.fresh = false;
            }
        }
    }

    /// Starts a new incarnation of server `ps`: it holds nothing until it is restored, and
    /// registers with the chief ([`Msg::PsJoining`]), as every server does at its start.
    fn start_server(&mut self, ps: u32) {
        let p = &mut self.servers[ps as usize];
        p.epoch += 1;
        p.state = ProcState::Up;
        p.out = false;
        p.leaving = false;
        p.store = new_store();
        p.rows.clear();
        p.history.clear();
        p.effective_set.clear();
        let epoch = p.epoch;
        let chief = self.chief_epoch;
        self.send(
            Node::Ps(ps),
            Node::Chief,
            chief,
            Msg::PsJoining { ps, epoch },
        );
    }

    /// Server `ps` exits for good (let go after it left the job): nothing of it remains.
    fn end_server(&mut self, ps: u32) {
        let p = &mut self.servers[ps as usize];
        p.state = ProcState::Down;
        p.out = true;
        p.leaving = false;
        p.store = new_store();
        p.rows.clear();
        p.history.clear();
        p.effective_set.clear();
        self.ps_left += 1;
    }

    /// Servers running or to be restarted by their supervisors (not out), in index order.
    fn running_servers(&self) -> Vec<u32> {
        (0..self.servers.len() as u32)
            .filter(|ps| !self.servers[*ps as usize].out)
            .collect()
    }

    /// The index of `layouts` among the sets messages carry (added if new).
    fn intern_layouts(&mut self, layouts: &[Layout]) -> usize {
        if let Some(i) = self.layout_sets.iter().rposition(|l| l == layouts) {
            return i;
        }
        self.layout_sets.push(layouts.to_vec());
        self.layout_sets.len() - 1
    }

    fn partitioned(&self, node: Node, outgoing: bool) -> bool {
        self.partitions
            .get(&node)
            .is_some_and(|(until, one_way)| self.now < *until && (outgoing || !*one_way))
    }

    /// Whether the coordinator hears `node`'s heartbeats now.
    fn heard(&self, node: Node) -> bool {
        self.state(node).0 == ProcState::Up && !self.partitioned(node, true)
    }

    // ---- network ---------------------------------------------------------------------------

    /// Sends `msg` from `from` to incarnation `to_epoch` of `to`. Under QUIC a lost datagram
    /// is sent again: loss costs a retransmission delay; duplication is a request sent again
    /// after a reconnect. Across a partition or to a paused process a message waits; past the
    /// detection budget its connection idled out and it is gone.
    fn send(&mut self, from: Node, to: Node, to_epoch: u64, msg: Msg) {
        if self.state(from).0 == ProcState::Down {
            return;
        }
        let net = self.scenario.net;
        let copies = if self.rng.gen_bool(net.duplicate.clamp(0.0, 1.0)) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = Duration::from_micros(
                self.rng
                    .gen_range(net.latency_min_us..=net.latency_max_us.max(net.latency_min_us)),
            );
            while self.rng.gen_bool(net.loss.clamp(0.0, 0.9)) {
                delay += RETRANSMIT_DELAY;
            }
            let event = Event::Deliver {
                from,
                to,
                to_epoch,
                sent: self.now,
                msg: Box::new(msg.clone()),
            };
            self.at(self.now + delay, event);
        }
    }

    fn deliver(&mut self, from: Node, to: Node, to_epoch: u64, sent: Duration, msg: Msg) {
        let (state, epoch) = self.state(to);
        // A dial connects to whichever incarnation listens at the address.
        let dial = matches!(
            msg,
            Msg::Request {
                req: Req::Hello,
                ..
            }
        );
        if (epoch != to_epoch && !dial) || state == ProcState::Down {
            return;
        }
        let held = state == ProcState::Paused
            || self.partitioned(to, false)
            || self.partitioned(from, true);
        if held {
            if self.now >= sent + self.config.detection_budget {
                // The connection idled out: the call it carried (or answered) fails, as the
                // gateway's does when its connection is lost.
                if let Msg::Request { call, .. } | Msg::Reply { call, .. } = msg {
                    self.on_reply(call, Err(NoReply::IdledOut));
                }
                return;
            }
            // Retried until the node can take it, or the connection idles out.
            let event = Event::Deliver {
                from,
                to,
                to_epoch,
                sent,
                msg: Box::new(msg),
            };
            self.at(self.now + HOLD_RETRY, event);
            return;
        }
        match (to, msg) {
            (Node::Chief, Msg::Reply { call, resp }) => self.on_reply(call, Ok(resp)),
            (Node::Chief, Msg::Leaving { worker, epoch }) => {
                // As the coordinator actor: the simulated chief is not stopping itself (its
                // own preemption is a chief fault).
                let now = self.instant();
                let answer = self.coord.handle_worker_leaving(now, worker, epoch, false);
                let msg = Msg::LeaveAnswer(answer);
                self.send(Node::Chief, Node::Worker(worker), epoch, msg);
            }
            (Node::Chief, Msg::Draining { worker, epoch }) => {
                let now = self.instant();
                if self.coord.handle_worker_draining(now, worker, epoch)
                    == crate::roles::coordinator::DrainDisposition::Done
                {
                    self.send(Node::Chief, Node::Worker(worker), epoch, Msg::Drained);
                }
            }
            (Node::Chief, Msg::Joining { worker, epoch }) => {
                let now = self.instant();
                let _ = self.coord.handle_worker_joining(now, worker, epoch);
            }
            (Node::Chief, Msg::PsJoining { ps, epoch }) => {
                // Refusals cannot happen here (the job has a checkpoint directory and few
                // servers); a refused server would stay out and exit.
                let now = self.instant();
                let addr = format!("ps{ps}:2222");
                let _ = self.coord.handle_ps_joining(now, ps, epoch, addr);
            }
            (Node::Chief, Msg::PsDraining { ps, epoch }) => {
                let now = self.instant();
                let go = match self.coord.handle_ps_draining(now, ps, epoch) {
                    Ok(true) => Some(true),
                    Ok(false) => None,
                    Err(_) => Some(false),
                };
                if let Some(go) = go {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::PsDrainAnswer { go });
                }
            }
            (Node::Chief, Msg::PsLeaving { ps, epoch }) => {
                let now = self.instant();
                if let Some(answer) = self.coord.handle_ps_leaving(now, ps, epoch, false) {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::LeaveAnswer(answer));
                }
            }
            (Node::Ps(ps), msg) => self.ps_receive(ps, msg),
            (Node::Worker(w), msg) => self.worker_receive(w, msg),
            _ => {}
        }
    }

    // ---- the parameter server --------------------------------------------------------------

    fn ps_receive(&mut self, ps: u32, msg: Msg) {
        let node = Node::Ps(ps);
        match msg {
            // Let go after its preemption notice: it exits now and is restarted.
            Msg::LeaveAnswer(LeaveAnswer::Go) => self.kill(node),
            // Let go after it asked to leave: it exits 0 and is not restarted.
            Msg::PsDrainAnswer { go: true } if self.servers[ps as usize].leaving => {
                self.end_server(ps)
            }
            Msg::PsDrainAnswer { .. } => self.servers[ps as usize].leaving = false,
            Msg::Push { run, push, blobs } => {
                let PushOrigin { worker, epoch, .. } = push.origin;
                let result = self.apply_push(ps, &push, &blobs);
                self.send(
                    node,
                    Node::Worker(worker),
                    epoch,
                    Msg::PushReply { ps, run, result },
                );
            }
            Msg::Request {
                call,
                req: Req::Retire,
            } => {
                // It answers, then exits (its supervisor restarts it as a new incarnation).
                let resp = Resp::Done;
                self.send(
                    node,
                    Node::Chief,
                    self.chief_epoch,
                    Msg::Reply { call, resp },
                );
                self.kill(node);
            }
            Msg::Request { call, req } => {
                let resp = self.ps_request(ps, req);
                self.send(
                    node,
                    Node::Chief,
                    self.chief_epoch,
                    Msg::Reply { call, resp },
                );
            }
            _ => {}
        }
    }

    fn apply_push(
        &mut self,
        ps: u32,
        push: &crate::roles::protocol::Push,
        blobs: &[bytes::Bytes],
    ) -> Option<PushOutcome> {
        let p = &mut self.servers[ps as usize];
        // The serving gate: an empty (restarted, not restored) server refuses.
        if !p.store.serving() {
            return None;
        }
        let origin = push.origin;
        let gradients = push.decode_gradients(blobs).ok()?;
        let outcome = p.store.handle_push(origin, &gradients).ok()?;
        if outcome == PushOutcome::Applied {
            let closure = origin.closure.0;
            let again = !p.effective_set.insert(closure);
            for (name, _) in &gradients {
                for row in p.rows.get(name).cloned().unwrap_or_default() {
                    p.history
                        .entry((name.clone(), row))
                        .or_default()
                        .push(closure);
                }
            }
            if again {
                let detail = format!(
                    "ps/{ps} applied closure {closure} a second time (attempt {}, worker/{} \
                     epoch {})",
                    origin.attempt, origin.worker, origin.epoch
                );
                self.violate("PS-1", detail);
            }
        }
        (outcome != PushOutcome::SkippedNonFinite).then_some(outcome)
    }

    fn ps_request(&mut self, ps: u32, req: Req) -> Resp {
        let p = &mut self.servers[ps as usize];
        match req {
            Req::Probe => Resp::Probe {
                epoch: p.epoch,
                serving: p.store.serving(),
                generation: p.store.generation().0,
                next_free: p.store.next_free_closure_id(),
            },
            Req::Fence { worker, epoch } => {
                p.store.handle_fence(worker, epoch);
                Resp::Done
            }
            Req::Watermark { below, generation } => {
                p.store.handle_finished_below(ClosureId(below), generation);
                Resp::Done
            }
            Req::Hello => Resp::Hello { epoch: p.epoch },
            Req::Begin { generation, fences } => {
                p.store.handle_begin_restore(generation, &fences);
                Resp::Done
            }
            Req::Shards { stored, layouts } => {
                let (Some(checkpoint), Some(saved)) =
                    (self.restoring.get(&stored), self.storage.get(stored))
                else {
                    return Resp::Refused("no such checkpoint".into());
                };
                let layouts = &self.layout_sets[layouts];
                let restores = match shard_restores(ps, layouts, checkpoint) {
                    Ok(restores) => restores,
                    Err(e) => return Resp::Refused(e.to_string()),
                };
                // The rows it holds now, each with the closures the saved row held.
                let mut rows = BTreeMap::new();
                let mut history = BTreeMap::new();
                for layout in layouts {
                    for shard in layout.shards.iter().filter(|s| s.ps == ps) {
                        rows.insert(layout.name.clone(), shard.rows.clone());
                        for row in shard.rows.clone() {
                            let key = (layout.name.clone(), row);
                            let held = saved.history.get(&key).cloned().unwrap_or_default();
                            history.insert(key, held);
                        }
                    }
                }
                let p = &mut self.servers[ps as usize];
                for (msg, blobs) in restores {
                    if let Err(e) = restore_variable(&mut p.store, msg, &blobs) {
                        return Resp::Refused(e.to_string());
                    }
                }
                p.effective_set = history.values().flatten().copied().collect();
                p.rows = rows;
                p.history = history;
                Resp::Done
            }
            Req::RollBack { below, generation } => {
                p.store.handle_roll_back(ClosureId(below), generation);
                Resp::Done
            }
            Req::Snapshot { shard } => {
                // The serving gate: a server restarted and not restored is not read.
                if !p.store.serving() {
                    return Resp::Unavailable("not serving".into());
                }
                let (state, blobs) = match p.store.snapshot(&shard) {
                    Ok(read) => read,
                    Err(e) => return Resp::Refused(e.to_string()),
                };
                let rows = p
                    .rows
                    .get(&shard)
                    .cloned()
                    .unwrap_or_default()
                    .map(|row| {
                        let held = p.history.get(&(shard.clone(), row)).cloned();
                        (row, held.unwrap_or_default())
                    })
                    .collect();
                let snapshot = PsSnapshot {
                    read: ShardRead { state, blobs },
                    shard,
                    rows,
                };
                self.snapshots.push(snapshot);
                Resp::Snapshot(self.snapshots.len() - 1)
            }
            Req::Run { .. }
            | Req::SetUp { .. }
            | Req::Configure { .. }
            | Req::Positions
            | Req::Rewind { .. }
            | Req::Retire => Resp::Refused("not a worker".into()),
        }
    }

    // ---- the worker: its real machine, the simulator as its actor and compute thread ------

    fn worker_receive(&mut self, w: u32, msg: Msg) {
        let node = Node::Worker(w);
        let now = self.instant();
        match msg {
            Msg::Drained
                if self.workers[w as usize]
                    .machine
                    .handle_drained(now, true)
                    .is_some() =>
            {
                // It exits 0 and is not restarted: out of the job for good.
                self.set_state(node, ProcState::Down);
                let worker = &mut self.workers[w as usize];
                worker.run = None;
                worker.waiting.clear();
                worker.drained = true;
                worker.kept = worker.drain_read;
            }
            Msg::LeaveAnswer(answer) => {
                let exit = self.workers[w as usize]
                    .machine
                    .handle_leave_answer(now, answer);
                if exit.is_some() {
                    // It exits (143); its supervisor restarts it as a new incarnation.
                    self.kill(node);
                }
            }
            Msg::Request { call, req } => match req {
                Req::Run {
                    closure,
                    attempt,
                    generation,
                    chief,
                } => {
                    let worker = &mut self.workers[w as usize];
                    let known = worker.run.as_ref().is_some_and(|r| r.call == call)
                        || worker.waiting.iter().any(|(c, _)| *c == call);
                    if known {
                        return; // the same request again
                    }
                    if let Err(refusal) = worker.machine.admit(now, Request::Run) {
                        let resp = Resp::Refused(refusal.to_string());
                        self.send(
                            node,
                            Node::Chief,
                            self.chief_epoch,
                            Msg::Reply { call, resp },
                        );
                        return;
                    }
                    let run = RunClosure {
                        closure,
                        attempt,
                        generation,
                        function: "step".into(),
                        args: Vec::new(),
                        // The simulated worker reaches servers by index, not incarnation.
                        servers: Vec::new(),
                        learning_rate: None,
                    };
                    worker.waiting.push_back((call, Job::Run(run, chief)));
                    self.next_step(w);
                }
                Req::Hello => {
                    let epoch = self.workers[w as usize].epoch;
                    let resp = Resp::Hello { epoch };
                    self.send(
                        node,
                        Node::Chief,
                        self.chief_epoch,
                        Msg::Reply { call, resp },
                    );
                }
                Req::SetUp {
                    version,
                    chief,
                    skip,
                    layouts,
                }
                | Req::Rewind {
                    version,
                    chief,
                    skip,
                    layouts,
                }
                | Req::Configure {
                    version,
                    chief,
                    skip,
                    layouts,
                } => {
                    // A new incarnation is set up with a rewind (rebuilt from scratch), as the
                    // coordinator does, so that a setup a restore made outdated (built at old
                    // positions already) cannot stay; a live worker's new configuration keeps
                    // the datasets it reads.
                    let rewind = !matches!(req, Req::Configure { .. });
                    // What the message carries: the job's layouts, the dataset at `skip`.
                    let setup = SetupWorker {
                        num_workers: self.config.num_workers,
                        layouts: self.layout_sets[layouts].clone(),
                        servers: Vec::new(),
                        datasets: vec![(DATASET.into(), skip)],
                        version,
                    };
                    let job = Job::Setup {
                        setup,
                        rewind,
                        from_chief: chief,
                    };
                    self.enqueue(w, call, Request::Setup, job);
                }
                Req::Retire => {
                    // It answers, then exits (its supervisor restarts it as a new incarnation).
                    let epoch = self.workers[w as usize].epoch;
                    let exit = self.workers[w as usize].machine.handle_retire(now, epoch);
                    let resp = match exit {
                        Some(_) => Resp::Done,
                        None => Resp::Refused("retired already".into()),
                    };
                    self.send(
                        node,
                        Node::Chief,
                        self.chief_epoch,
                        Msg::Reply { call, resp },
                    );
                    if exit.is_some() {
                        self.kill(node);
                    }
                }
                Req::Positions => self.enqueue(w, call, Request::Positions, Job::Positions),
                _ => {
                    let resp = Resp::Refused("not a server".into());
                    self.send(
                        node,
                        Node::Chief,
                        self.chief_epoch,
                        Msg::Reply { call, resp },
                    );
                }
            },
            Msg::PushReply { ps, run, result } => {
                let epoch = self.workers[w as usize].epoch;
                self.push_answered(w, epoch, run, ps, result)
            }
            _ => {}
        }
    }

    /// Admits a setup or positions request `call` for worker `w` and queues it behind the jobs
    /// admitted before it (answered at once when the machine refuses it; a request delivered
    /// again is ignored).
    fn enqueue(&mut self, w: u32, call: u64, request: Request, job: Job) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.waiting.iter().any(|(c, _)| *c == call) {
            return; // the same request again
        }
        if let Err(refusal) = worker.machine.admit(now, request) {
            let resp = Resp::Refused(refusal.to_string());
            self.send(
                Node::Worker(w),
                Node::Chief,
                self.chief_epoch,
                Msg::Reply { call, resp },
            );
            return;
        }
        worker.waiting.push_back((call, job));
        self.next_step(w);
    }

    /// The compute thread takes the next job waiting, if it is free: a closure runs if the
    /// machine says so (its step then computes for a drawn time) or is answered at once; a
    /// setup is carried out as the machine plans it, positions are reported.
    fn next_step(&mut self, w: u32) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.run.is_some() {
            return;
        }
        while let Some((call, job)) = self.workers[w as usize].waiting.pop_front() {
            let worker = &mut self.workers[w as usize];
            let (run, from_chief) = match job {
                Job::Run(run, chief) => (run, chief),
                Job::Setup {
                    setup,
                    rewind,
                    from_chief,
                } => {
                    // Building a dataset here is setting its position: done at once.
                    let built = worker
                        .machine
                        .handle_setup(now, &setup, rewind, from_chief)
                        .map(|plan| {
                            for dataset in &plan.datasets {
                                if let DatasetPlan::Build { skip, .. } = dataset {
                                    worker.position = *skip;
                                    worker.fresh = true;
                                }
                            }
                            vec![(DATASET.to_string(), worker.position)]
                        });
                    let resp = match worker.machine.handle_setup_built(now, built) {
                        Ok(()) => Resp::Done,
                        Err(e) => Resp::Refused(e.to_string()),
                    };
                    self.reply_from(w, call, resp);
                    continue;
                }
                Job::Positions => {
                    let resp = Resp::Positions(worker.machine.handle_positions(now));
                    self.reply_from(w, call, resp);
                    continue;
                }
            };
            match worker.machine.handle_start(now, &run, from_chief) {
                StepAction::Compute => {
                    // The step reads its dataset's next element.
                    let first = std::mem::replace(&mut worker.fresh, false);
                    let read = worker.position;
                    worker.position += 1;
                    if first {
                        self.check_first_read(w, read, run.generation);
                    }
                    let worker = &mut self.workers[w as usize];
                    worker.run = Some(WorkerRun {
                        call,
                        pending: BTreeSet::new(),
                        answered: Vec::new(),
                        unavailable: None,
                    });
                    let epoch = worker.epoch;
                    let step_ms = self.rng.gen_range(STEP_MS.0..=STEP_MS.1);
                    let event = Event::Computed {
                        worker: w,
                        epoch,
                        run: call,
                    };
                    self.at(self.now + Duration::from_millis(step_ms), event);
                    return;
                }
                action => self.carry_out(w, call, action),
            }
        }
    }

    /// Worker `w` answers the chief's call `call`.
    fn reply_from(&mut self, w: u32, call: u64, resp: Resp) {
        let chief = self.chief_epoch;
        self.send(
            Node::Worker(w),
            Node::Chief,
            chief,
            Msg::Reply { call, resp },
        );
    }

    /// The step computed: its gradient for every server's variable goes to the machine, which
    /// plans the pushes; each goes out bounded in time.
    fn computed(&mut self, w: u32, epoch: u64, run: u64) {
        let worker = &self.workers[w as usize];
        if worker.epoch != epoch || worker.state == ProcState::Down {
            return;
        }
        if worker.state == ProcState::Paused {
            // A paused process computes nothing: its step goes on once it runs again.
            let event = Event::Computed {
                worker: w,
                epoch,
                run,
            };
            self.at(self.now + HOLD_RETRY, event);
            return;
        }
        if worker.run.as_ref().is_none_or(|r| r.call != run) {
            return;
        }
        let Some(closure) = worker
            .machine
            .current_origin()
            .map(|origin| origin.closure.0)
        else {
            return;
        };
        let gradients = (0..self.config.num_ps)
            .map(|ps| (variable(ps), Gradient::Dense(gradient(closure).into())))
            .collect();
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        let positions = vec![(DATASET.to_string(), worker.position)];
        let action = worker
            .machine
            .handle_computed(now, Ok((Vec::new(), gradients)), positions);
        self.carry_out(w, run, action);
    }

    /// Carries out the machine's next step for closure call `run` of worker `w`.
    fn carry_out(&mut self, w: u32, run: u64, action: StepAction) {
        let node = Node::Worker(w);
        let epoch = self.workers[w as usize].epoch;
        match action {
            StepAction::Compute => {}
            StepAction::Push(plan) => {
                if let Some(current) = self.workers[w as usize].run.as_mut() {
                    current.pending = plan.iter().map(|p| p.ps).collect();
                }
                for PlannedPush { ps, push, blobs } in plan {
                    let ps_epoch = self.servers[ps as usize].epoch;
                    self.send(node, Node::Ps(ps), ps_epoch, Msg::Push { run, push, blobs });
                    let event = Event::PushTimeout {
                        worker: w,
                        epoch,
                        run,
                        ps,
                    };
                    self.at(self.now + self.config.detection_budget, event);
                }
            }
            StepAction::Reply { result, .. } => {
                let worker = &mut self.workers[w as usize];
                if worker.run.as_ref().is_some_and(|r| r.call == run) {
                    worker.run = None;
                }
                let resp = match result {
                    Ok(_) => Resp::Run(RunResult::Committed),
                    Err(RunClosureError::PsUnavailable(u)) => {
                        Resp::Run(RunResult::PsUnavailable(u.ps))
                    }
                    Err(RunClosureError::Refused(refusal)) => Resp::Refused(refusal.to_string()),
                    Err(RunClosureError::Step(e)) => Resp::Run(RunResult::Failed(e)),
                };
                self.send(
                    node,
                    Node::Chief,
                    self.chief_epoch,
                    Msg::Reply { call: run, resp },
                );
                self.next_step(w);
            }
        }
    }

    /// One server answered (or its push timed out: `None`); once every push settled, the
    /// machine says what the closure's outcome is (a server unreachable, refusing, or
    /// answering stale makes it `PsUnavailable`, retryable).
    fn push_answered(
        &mut self,
        w: u32,
        epoch: u64,
        run: u64,
        ps: u32,
        result: Option<PushOutcome>,
    ) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.epoch != epoch || worker.state != ProcState::Up {
            return;
        }
        let Some(current) = worker.run.as_mut().filter(|r| r.call == run) else {
            return;
        };
        if !current.pending.remove(&ps) {
            return;
        }
        match result {
            Some(outcome) => current.answered.push((ps, outcome)),
            None => {
                current.unavailable = Some(current.unavailable.map_or(ps, |u| u.min(ps)));
            }
        }
        if !current.pending.is_empty() {
            return;
        }
        let pushed = match current.unavailable {
            Some(ps) => Err(StepError::PsUnavailable(PsUnavailable {
                ps,
                reason: "unreachable, or not serving".into(),
            })),
            None => {
                let mut answered = std::mem::take(&mut current.answered);
                answered.sort();
                Ok(answered)
            }
        };
        let action = worker.machine.handle_pushed(now, pushed);
        // A server refused it as fenced: it answers, then exits to come back as a new
        // incarnation (its supervisor restarts it).
        let fenced = matches!(
            &action,
            StepAction::Reply {
                result: Err(RunClosureError::Refused(WorkerRefusal::Fenced)),
                ..
            }
        );
        self.carry_out(w, run, action);
        if fenced {
            self.kill(Node::Worker(w));
        }
    }

    // ---- the coordinator's shell -----------------------------------------------------------

    fn call(&mut self, to: Node, epoch: u64, kind: CallKind, req: Req, bound: Duration) {
        let call = self.next_call;
        self.next_call += 1;
        self.calls.insert(call, Call { to, epoch, kind });
        self.send(Node::Chief, to, epoch, Msg::Request { call, req });
        self.at(self.now + bound, Event::CallTimeout { call });
    }

    /// A call's outcome: its reply, or why none came.
    fn on_reply(&mut self, call: u64, resp: Result<Resp, NoReply>) {
        let Some(Call { kind, .. }) = self.calls.remove(&call) else {
            return; // answered already (a duplicate), or given up
        };
        let now = self.instant();
        match kind {
            CallKind::Run {
                worker,
                epoch,
                closure,
                attempt,
            } => {
                let id = ClosureId(closure);
                match resp {
                    Ok(Resp::Run(RunResult::Committed)) => {
                        let disposition = self.coord.handle_result(
                            now,
                            worker,
                            epoch,
                            id,
                            attempt,
                            Ok(closure.to_le_bytes().to_vec()),
                        );
                        if disposition == ResultDisposition::Committed
                            && self.fenced.get(&worker).is_some_and(|f| epoch <= *f)
                        {
                            self.violate(
                                "FENCE-1",
                                format!("closure {closure} committed from fenced worker/{worker} epoch {epoch}"),
                            );
                        }
                    }
                    Ok(Resp::Run(RunResult::PsUnavailable(ps))) => {
                        self.coord
                            .handle_ps_unavailable(now, worker, epoch, id, attempt, ps);
                    }
                    Ok(Resp::Run(RunResult::Failed(error))) => {
                        self.coord
                            .handle_result(now, worker, epoch, id, attempt, Err(error));
                    }
                    Ok(Resp::Refused(_)) => {
                        self.coord.handle_refused(now, worker, epoch, id, attempt);
                    }
                    Ok(_) | Err(_) => self.coord.handle_worker_lost(now, worker, epoch),
                }
            }
            CallKind::Dial { worker } => {
                let dial = match resp {
                    Ok(Resp::Hello { epoch }) => {
                        let node = Node::Worker(worker);
                        let declared = self.detector.get(&node).and_then(|d| d.declared);
                        if declared == Some(epoch) {
                            WorkerDial::DeclaredDead { epoch }
                        } else {
                            WorkerDial::Answered { epoch }
                        }
                    }
                    _ => WorkerDial::Unreachable,
                };
                self.coord.handle_worker_dialled(now, worker, dial);
            }
            CallKind::SetUp {
                worker,
                epoch,
                version,
            } => {
                let result = call_result(resp);
                self.coord
                    .handle_worker_set_up(now, worker, epoch, version, result);
            }
            CallKind::Reconfigure {
                ticket,
                worker,
                epoch,
            } => {
                let result = call_result(resp);
                self.coord
                    .handle_reconfigured(now, ticket, worker, epoch, result);
            }
            CallKind::Positions {
                ticket,
                worker,
                epoch,
            } => {
                let result = match resp {
                    Ok(Resp::Positions(list)) => Ok(list),
                    other => Err(call_result(other)
                        .err()
                        .unwrap_or_else(|| CallFault::Refused("unexpected answer".into()))),
                };
                self.coord
                    .handle_positions(now, ticket, worker, epoch, result);
            }
            CallKind::DrainPositions { worker, epoch } => {
                if let Ok(Resp::Positions(list)) = &resp {
                    let position = list.iter().find(|(name, _)| name == DATASET);
                    self.workers[worker as usize].drain_read = position.map(|(_, at)| *at);
                }
                let result = match resp {
                    Ok(Resp::Positions(list)) => Ok(list),
                    other => Err(call_result(other)
                        .err()
                        .unwrap_or_else(|| CallFault::Refused("unexpected answer".into()))),
                };
                self.coord
                    .handle_drain_positions(now, worker, epoch, result);
            }
            CallKind::RetireWorker { worker, epoch } => {
                self.coord
                    .handle_worker_retired(worker, epoch, call_result(resp));
            }
            CallKind::RetirePs { ps, epoch } => {
                self.coord.handle_ps_retired(ps, epoch, call_result(resp));
            }
            CallKind::Fence { worker, epoch, ps } => {
                self.coord
                    .handle_fence_sent(worker, epoch, ps, call_result(resp));
            }
            CallKind::Watermark { ps } => {
                self.coord.handle_watermark_sent(ps, call_result(resp));
            }
            CallKind::Probe { ps } => {
                let dial = match resp {
                    Ok(Resp::Probe { epoch, serving, .. }) => {
                        let declared = self.detector.get(&Node::Ps(ps)).and_then(|d| d.declared);
                        if declared == Some(epoch) {
                            PsDial::DeclaredDead { epoch }
                        } else {
                            PsDial::Answered { epoch, serving }
                        }
                    }
                    _ => PsDial::Unreachable,
                };
                self.coord.handle_ps_dialled(now, ps, dial);
            }
            CallKind::Restore { generation, call } => {
                let fault = call_result;
                let report = match call {
                    RestoreCall::Begin { ps, .. } => RestoreReport::Begun {
                        ps,
                        result: fault(resp),
                    },
                    RestoreCall::Shards { ps, .. } => RestoreReport::ShardsRestored {
                        ps,
                        result: fault(resp),
                    },
                    RestoreCall::RollBack { ps, .. } => RestoreReport::RolledBack {
                        ps,
                        result: fault(resp),
                    },
                    RestoreCall::Rewind { worker, epoch, .. } => RestoreReport::Rewound {
                        worker,
                        epoch,
                        result: fault(resp),
                    },
                    RestoreCall::Load { .. } => return,
                };
                self.coord.handle_restore_report(now, generation, report);
            }
            CallKind::Snapshot {
                ticket,
                attempt,
                ps,
                shard,
            } => {
                let result = match resp {
                    Ok(Resp::Snapshot(id)) => {
                        let newest = self
                            .chief
                            .read
                            .get(&(ticket, ps, shard.clone()))
                            .is_none_or(|(a, _)| *a <= attempt);
                        if newest {
                            let key = (ticket, ps, shard.clone());
                            self.chief.read.insert(key, (attempt, id));
                        }
                        Ok(self.snapshots[id].read.clone())
                    }
                    other => Err(call_result(other)
                        .err()
                        .unwrap_or_else(|| CallFault::Refused("unexpected answer".into()))),
                };
                self.coord
                    .handle_shard_read(now, ticket, attempt, ps, &shard, result);
            }
            CallKind::StartProbe { ticket, ps } => {
                let result = match resp {
                    Ok(Resp::Probe {
                        epoch,
                        generation,
                        next_free,
                        ..
                    }) => Ok(ServerProbe {
                        ps,
                        epoch,
                        generation,
                        next_free_closure_id: next_free,
                    }),
                    other => Err(call_result(other)
                        .err()
                        .unwrap_or_else(|| CallFault::Refused("unexpected answer".into()))),
                };
                self.coord.handle_server_probed(now, ticket, ps, result);
            }
        }
    }

    /// Carries out what the scheduler asks, until it asks nothing more.
    fn drive(&mut self) {
        while let Some(action) = self.coord.poll_action() {
            match action {
                SchedulerAction::Dispatch {
                    worker,
                    epoch,
                    closure,
                    attempt,
                    generation,
                    ..
                } => {
                    let kind = CallKind::Run {
                        worker,
                        epoch,
                        closure: closure.0,
                        attempt,
                    };
                    let req = Req::Run {
                        closure: closure.0,
                        attempt,
                        generation,
                        chief: self.chief_epoch,
                    };
                    if self.dispatched.insert(closure.0) {
                        self.check_fresh_id(closure.0);
                    }
                    let bound = self.coord.config().step_timeout;
                    self.call(Node::Worker(worker), epoch, kind, req, bound);
                }
                SchedulerAction::Fence { worker, epoch } => {
                    let fenced = self.fenced.entry(worker).or_insert(epoch);
                    *fenced = (*fenced).max(epoch);
                    for ps in self.coord.servers_in_job() {
                        let node = Node::Ps(ps);
                        let to_epoch = self.state(node).1;
                        let kind = CallKind::Fence { worker, epoch, ps };
                        let req = Req::Fence { worker, epoch };
                        self.call(node, to_epoch, kind, req, self.config.call_timeout);
                    }
                    // Dropping the connection: calls to that incarnation fail now.
                    self.fail_calls(Node::Worker(worker), epoch);
                }
                SchedulerAction::Watermark {
                    finished_below,
                    generation,
                } => {
                    for ps in self.coord.servers_in_job() {
                        let node = Node::Ps(ps);
                        let to_epoch = self.state(node).1;
                        let req = Req::Watermark {
                            below: finished_below.0,
                            generation,
                        };
                        let kind = CallKind::Watermark { ps };
                        self.call(node, to_epoch, kind, req, self.config.call_timeout);
                    }
                }
                SchedulerAction::Restore(call) => self.restore_call(call),
                SchedulerAction::DialPs { ps } => {
                    let node = Node::Ps(ps);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    self.call(node, epoch, CallKind::Probe { ps }, Req::Probe, bound);
                }
                SchedulerAction::RetirePs { ps, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::RetirePs { ps, epoch };
                    self.call(Node::Ps(ps), epoch, kind, Req::Retire, bound);
                }
                SchedulerAction::RestoreFinished { ticket, result } => {
                    self.startup_restored(ticket, result)
                }
                SchedulerAction::DialWorker { worker } => {
                    let node = Node::Worker(worker);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    self.call(node, epoch, CallKind::Dial { worker }, Req::Hello, bound);
                }
                SchedulerAction::SetUpWorker {
                    worker,
                    epoch,
                    version,
                    setup,
                } => {
                    let kind = CallKind::SetUp {
                        worker,
                        epoch,
                        version,
                    };
                    let req = Req::SetUp {
                        version,
                        chief: self.chief_epoch,
                        skip: skip_of(&setup),
                        layouts: self.intern_layouts(&setup.layouts),
                    };
                    let bound = self.config.call_timeout;
                    self.call(Node::Worker(worker), epoch, kind, req, bound);
                }
                SchedulerAction::RetireWorker { worker, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::RetireWorker { worker, epoch };
                    self.call(Node::Worker(worker), epoch, kind, Req::Retire, bound);
                }
                SchedulerAction::Reconfigure {
                    ticket,
                    worker,
                    epoch,
                    setup,
                } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::Reconfigure {
                        ticket,
                        worker,
                        epoch,
                    };
                    let req = Req::Configure {
                        version: setup.version,
                        chief: self.chief_epoch,
                        skip: skip_of(&setup),
                        layouts: self.intern_layouts(&setup.layouts),
                    };
                    self.call(Node::Worker(worker), epoch, kind, req, bound);
                }
                SchedulerAction::AskPositions {
                    ticket,
                    worker,
                    epoch,
                } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::Positions {
                        ticket,
                        worker,
                        epoch,
                    };
                    self.call(Node::Worker(worker), epoch, kind, Req::Positions, bound);
                }
                SchedulerAction::SnapshotShard {
                    ticket,
                    attempt,
                    ps,
                    shard,
                } => {
                    // As the real shell: whichever incarnation answers at the server's address.
                    let node = Node::Ps(ps);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    let req = Req::Snapshot {
                        shard: shard.clone(),
                    };
                    let kind = CallKind::Snapshot {
                        ticket,
                        attempt,
                        ps,
                        shard,
                    };
                    self.call(node, epoch, kind, req, bound);
                }
                SchedulerAction::CutRead { ticket, result } => self.cut_read(ticket, result),
                SchedulerAction::WritePreemptionCut {
                    ticket,
                    root,
                    reading,
                    ..
                } => self.write_preemption_cut(ticket, root, *reading),
                SchedulerAction::AnswerPsLeaving { ps, epoch, answer } => {
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::LeaveAnswer(answer));
                }
                SchedulerAction::AnswerPsDraining { ps, epoch, result } => {
                    let go = result.is_ok();
                    self.send(Node::Chief, Node::Ps(ps), epoch, Msg::PsDrainAnswer { go });
                }
                SchedulerAction::ProbeServer { ticket, ps } => {
                    let node = Node::Ps(ps);
                    let epoch = self.state(node).1;
                    let bound = self.config.call_timeout;
                    let kind = CallKind::StartProbe { ticket, ps };
                    self.call(node, epoch, kind, Req::Probe, bound);
                }
                // The simulated job's variables exist from the servers' first start, as a
                // chief program creates them before anything else; it creates none later.
                SchedulerAction::CreateShard { .. } | SchedulerAction::VariableCreated { .. } => {}
                // The program's wait for a configuration: the simulated chief configures once,
                // before any worker is up.
                SchedulerAction::ConfigureFinished { .. } => {}
                SchedulerAction::AskDrainPositions { worker, epoch } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::DrainPositions { worker, epoch };
                    self.call(Node::Worker(worker), epoch, kind, Req::Positions, bound);
                }
                SchedulerAction::DrainFinished { worker, epoch } => {
                    self.send(Node::Chief, Node::Worker(worker), epoch, Msg::Drained);
                }
            }
        }
    }

    fn restore_call(&mut self, call: RestoreCall) {
        let bound = self.config.call_timeout;
        match &call {
            RestoreCall::Begin {
                ps,
                epoch,
                generation,
                fences,
            } => {
                let req = Req::Begin {
                    generation: *generation,
                    fences: fences.clone(),
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Ps(*ps), *epoch, kind, req, bound);
            }
            RestoreCall::Load {
                generation, cut, ..
            } => {
                let event = Event::Loaded {
                    generation: *generation,
                    cut: cut.0,
                };
                self.at(self.now + LOAD_DELAY, event);
            }
            RestoreCall::Shards {
                ps,
                epoch,
                generation,
                checkpoint,
                layouts,
            } => {
                let layouts = self.intern_layouts(layouts);
                let stored = checkpoint.0.step as usize;
                // A restore puts every worker at the checkpoint's positions: what a drain kept
                // before it no longer holds (the checkpoint records it if it was taken after).
                for worker in &mut self.workers {
                    worker.kept = None;
                    worker.drain_read = None;
                }
                self.restored_from.insert(*generation, stored);
                self.restoring.insert(stored, Arc::clone(&checkpoint.0));
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(
                    Node::Ps(*ps),
                    *epoch,
                    kind,
                    Req::Shards { stored, layouts },
                    bound,
                );
            }
            RestoreCall::RollBack {
                ps,
                epoch,
                generation,
                finished_below,
            } => {
                let req = Req::RollBack {
                    below: finished_below.0,
                    generation: *generation,
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Ps(*ps), *epoch, kind, req, bound);
            }
            RestoreCall::Rewind {
                worker,
                epoch,
                generation,
                setup,
            } => {
                let req = Req::Rewind {
                    version: setup.version,
                    chief: self.chief_epoch,
                    skip: skip_of(setup),
                    layouts: self.intern_layouts(&setup.layouts),
                };
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Worker(*worker), *epoch, kind, req, bound);
            }
        }
    }

    /// The newest checkpoint taken at `cut` (its ledger's next closure id) that verifies
    /// (CKPT-1), as the recovery's loader reads it: corrupt ones are skipped.
    fn load(&mut self, generation: u64, cut: u64) {
        let mut found = None;
        for stored in (0..self.storage.len()).rev() {
            match self.read_stored(stored) {
                Some(checkpoint) if checkpoint.ledger.next_closure_id == cut => {
                    found = Some(CheckpointRef(checkpoint));
                    break;
                }
                _ => {}
            }
        }
        self.unreadable_cuts += u64::from(found.is_none());
        let report = RestoreReport::Loaded { result: Ok(found) };
        let now = self.instant();
        self.coord.handle_restore_report(now, generation, report);
    }

    /// Fails every pending call to `node`'s incarnation `epoch` (its connection is gone).
    fn fail_calls(&mut self, node: Node, epoch: u64) {
        let lost: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.to == node && c.epoch == epoch)
            .map(|(id, _)| *id)
            .collect();
        for call in lost {
            self.on_reply(call, Err(NoReply::ConnectionLost { node, epoch }));
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Tick => {
                self.tick();
                self.at(self.now + TICK, Event::Tick);
            }
            Event::Inject(fault) => match fault {
                FaultEvent::Kill(node) => self.kill(node),
                FaultEvent::Pause(node, for_ms) => {
                    let (state, epoch) = self.state(node);
                    if state == ProcState::Up && node != Node::Chief {
                        self.set_state(node, ProcState::Paused);
                        let at = self.now + Duration::from_millis(for_ms);
                        self.at(at, Event::Resume { node, epoch });
                    }
                }
                FaultEvent::Partition(node, for_ms, one_way) => {
                    let until = self.now + Duration::from_millis(for_ms);
                    self.partitions.insert(node, (until, one_way));
                }
                FaultEvent::Drain(worker) => {
                    let node = Node::Worker(worker);
                    if self.state(node).0 != ProcState::Down {
                        // SIGUSR1: it tells the chief and runs on until it is let go.
                        let epoch = self.state(node).1;
                        let chief = self.chief_epoch;
                        self.send(node, Node::Chief, chief, Msg::Draining { worker, epoch });
                    }
                }
                FaultEvent::Rejoin(worker) => {
                    if self.workers[worker as usize].drained {
                        // Its supervisor starts it again; it registers with the chief.
                        self.workers[worker as usize].drained = false;
                        self.restart(Node::Worker(worker));
                        let epoch = self.workers[worker as usize].epoch;
                        let chief = self.chief_epoch;
                        let node = Node::Worker(worker);
                        self.send(node, Node::Chief, chief, Msg::Joining { worker, epoch });
                    }
                }
                FaultEvent::PsJoin => {
                    // As the launcher scales up: the lowest index not running starts (none
                    // while a server is leaving, so that the running ones stay `0..n`).
                    let leaving = self.servers.iter().any(|p| p.leaving);
                    let free =
                        (0..self.servers.len() as u32).find(|ps| self.servers[*ps as usize].out);
                    if let (false, Some(ps)) = (leaving, free) {
                        self.ps_joined += 1;
                        self.start_server(ps);
                    }
                }
                FaultEvent::PsLeave => {
                    // As the launcher scales down: the highest running server is asked to
                    // leave (SIGUSR1), if it is up and no other is leaving.
                    let leaving = self.servers.iter().any(|p| p.leaving);
                    if let (false, Some(&ps)) = (leaving, self.running_servers().last()) {
                        let node = Node::Ps(ps);
                        if self.state(node).0 == ProcState::Up {
                            let p = &mut self.servers[ps as usize];
                            p.leaving = true;
                            let (epoch, chief) = (p.epoch, self.chief_epoch);
                            self.send(node, Node::Chief, chief, Msg::PsDraining { ps, epoch });
                        }
                    }
                }
                FaultEvent::Preempt(node) => {
                    if self.state(node).0 != ProcState::Down {
                        // Every task tells the chief: a worker is let go at once, a server once
                        // the chief took its cut; unanswered, either serves through its grace.
                        let chief = self.chief_epoch;
                        match node {
                            Node::Worker(i) => {
                                let now = self.instant();
                                let worker = &mut self.workers[i as usize];
                                worker.machine.handle_preemption_notice(now);
                                let epoch = worker.epoch;
                                let msg = Msg::Leaving { worker: i, epoch };
                                self.send(node, Node::Chief, chief, msg);
                            }
                            Node::Ps(ps) => {
                                let epoch = self.state(node).1;
                                let msg = Msg::PsLeaving { ps, epoch };
                                self.send(node, Node::Chief, chief, msg);
                            }
                            Node::Chief => {}
                        }
                        // The incarnation noticed exits at the end of its grace (not a newer
                        // one, if it left and was restarted already).
                        let at = self.now + self.config.preemption_grace;
                        let epoch = self.state(node).1;
                        self.at(at, Event::GraceOver { node, epoch });
                    }
                }
            },
            Event::Resume { node, epoch } => {
                if self.state(node) == (ProcState::Paused, epoch) {
                    self.set_state(node, ProcState::Up);
                }
            }
            Event::Restart { node } => self.restart(node),
            Event::Deliver {
                from,
                to,
                to_epoch,
                sent,
                msg,
            } => self.deliver(from, to, to_epoch, sent, *msg),
            Event::CallTimeout { call } => self.on_reply(call, Err(NoReply::NoAnswerInTime)),
            Event::PushTimeout {
                worker,
                epoch,
                run,
                ps,
            } => {
                if self.state(Node::Worker(worker)) == (ProcState::Paused, epoch) {
                    // A paused process's timers fire once it runs again.
                    let event = Event::PushTimeout {
                        worker,
                        epoch,
                        run,
                        ps,
                    };
                    self.at(self.now + HOLD_RETRY, event);
                } else {
                    self.push_answered(worker, epoch, run, ps, None);
                }
            }
            Event::Loaded { generation, cut } => self.load(generation, cut),
            Event::GraceOver { node, epoch } => {
                if self.state(node).1 == epoch {
                    self.kill(node);
                }
            }
            Event::SaveWritten { chief } => self.save_written(chief),
            Event::PreemptionCutWritten { chief, ticket } => {
                let result = self.cut_writes.remove(&(chief, ticket));
                // A chief that died meanwhile took its coordinator (and the cut) with it.
                if let Some(result) = result
                    .filter(|_| chief == self.chief_epoch && self.chief_state == ProcState::Up)
                {
                    let now = self.instant();
                    self.coord
                        .handle_preemption_cut_written(now, CutTicket(ticket), result);
                }
            }
            Event::ChiefSilent { epoch } => self.chief_silent(epoch),
            Event::ExitReported { node, epoch } => self.exit_reported(node, epoch),
            Event::ChiefWaitOver { worker, epoch } => {
                let now = self.instant();
                let waited = self.config.ps_restart_wait;
                let w = &mut self.workers[worker as usize];
                if w.epoch == epoch
                    && w.state != ProcState::Down
                    && w.machine.handle_chief_wait_over(now, waited).is_some()
                {
                    self.kill(Node::Worker(worker));
                }
            }
            Event::Computed { worker, epoch, run } => self.computed(worker, epoch, run),
        }
    }

    /// The coordinator's periodic work and the chief program's next step.
    fn tick(&mut self) {
        if self.chief_state != ProcState::Up {
            return;
        }
        let now = self.instant();
        self.detect();
        self.coord.handle_reconnect_tick();
        if self.now.as_millis() % WATERMARK_EVERY.as_millis() == 0 {
            self.coord.handle_watermark_tick();
        }
        if self.coord.poll_timeout().is_some_and(|t| t <= now) {
            self.coord.handle_timeout(now);
        }
        self.program();
    }

    /// The failure detector: a node unheard for the budget is declared dead, or sooner where a
    /// probe of its address is refused; a server heard as a new incarnation is reported up.
    fn detect(&mut self) {
        let now = self.instant();
        let nodes: Vec<Node> = self
            .running_servers()
            .into_iter()
            .map(Node::Ps)
            .chain((0..self.config.num_workers).map(Node::Worker))
            .collect();
        for node in nodes {
            let (_, epoch) = self.state(node);
            let heard = self.heard(node);
            let budget = self.config.detection_budget;
            // The gateway knows every incarnation its node connected to (a dial's hello),
            // even one it has not heard a heartbeat from yet.
            let known = match node {
                Node::Worker(w) => self.coord.worker_epoch(w),
                Node::Ps(ps) => self.coord.ps_epoch(ps).map(|(epoch, _)| epoch),
                Node::Chief => None,
            };
            let entry = self.detector.entry(node).or_default();
            // A newer incarnation the coordinator dialled takes the node's link over, as a
            // hello on a new connection does: the gateway watches it from now on (silent, it
            // is declared dead in its turn), and the older one's connection is gone.
            if let Some(newer) = known.filter(|k| entry.seen.is_none_or(|seen| *k > seen)) {
                let previous = entry.seen.replace(newer);
                entry.unheard_since = None;
                if let Some(old) = previous.filter(|old| entry.declared != Some(*old)) {
                    entry.declared = Some(old);
                    self.declare_dead(now, node, old);
                }
            }
            let entry = self.detector.entry(node).or_default();
            if heard {
                entry.unheard_since = None;
                let previous = entry.seen.replace(epoch);
                if previous == Some(epoch) {
                    continue;
                }
                // A new incarnation says hello: the old one's connection is gone, and with it
                // every call to it (the gateway reports the old incarnation dead).
                if let Some(old) = previous.filter(|old| entry.declared != Some(*old)) {
                    entry.declared = Some(old);
                    self.declare_dead(now, node, old);
                }
                if let Node::Ps(ps) = node {
                    self.coord.handle_ps_up(now, ps, epoch);
                }
                continue;
            }
            let since = *entry.unheard_since.get_or_insert(self.now);
            let Some(seen) = entry.seen else { continue };
            if entry.declared == Some(seen) {
                continue;
            }
            // The gateway probes a peer silent for two heartbeat intervals; the probe is
            // refused (ICMP port unreachable) only where nothing listens: the process is down
            // and its successor not started, and no partition stands between them.
            let refused = self.now >= since + budget / REFUSED_AFTER_BUDGET_DIVISOR
                && self.state(node).0 == ProcState::Down
                && !self.partitioned(node, true)
                && !self.partitioned(node, false);
            if self.now < since + budget && !refused {
                continue;
            }
            if self.now < since + budget {
                self.deaths_refused += 1;
            }
            let Some(entry) = self.detector.get_mut(&node) else {
                continue;
            };
            entry.declared = Some(seen);
            self.declare_dead(now, node, seen);
        }
    }

    /// The chief's gateway declared incarnation `epoch` of `node` dead: the coordinator hears
    /// it, and every call to that incarnation fails.
    fn declare_dead(&mut self, now: Instant, node: Node, epoch: u64) {
        match node {
            Node::Ps(ps) => self.coord.handle_ps_lost(now, ps, epoch),
            Node::Worker(w) => self.coord.handle_worker_lost(now, w, epoch),
            Node::Chief => {}
        }
        self.fail_calls(node, epoch);
    }

    /// The supervisor's report that incarnation `epoch` of `node` exited: as the chief's
    /// gateway does, only the live incarnation it watches now is declared dead (a report of
    /// one replaced already, or never heard from, changes nothing). A chief that is down
    /// hears nothing; a paused one hears it when it runs again.
    fn exit_reported(&mut self, node: Node, epoch: u64) {
        match self.chief_state {
            ProcState::Up => {}
            // The datagram waits in the socket until the chief runs again.
            ProcState::Paused => {
                let later = self.now + Duration::from_millis(100);
                self.at(later, Event::ExitReported { node, epoch });
                return;
            }
            ProcState::Down => return,
        }
        let Some(entry) = self
            .detector
            .get_mut(&node)
            .filter(|e| e.seen == Some(epoch) && e.declared != Some(epoch))
        else {
            self.reports_ignored += 1;
            return;
        };
        entry.declared = Some(epoch);
        self.deaths_reported += 1;
        let now = self.instant();
        self.declare_dead(now, node, epoch);
    }

    /// The chief program: schedule a batch, join it, every few batches save a checkpoint.
    fn program(&mut self) {
        let now = self.instant();
        match &self.chief.phase {
            ChiefPhase::Schedule => {
                let n = self
                    .config
                    .batch
                    .min(self.config.closures - self.chief.scheduled);
                for _ in 0..n {
                    if self.coord.handle_schedule(now, "step", Vec::new()).is_err() {
                        self.violate("LIVENESS", "the schedule queue refused a closure".into());
                        return;
                    }
                }
                self.chief.scheduled += n;
                self.chief.batches += 1;
                self.chief.phase = ChiefPhase::Join;
            }
            ChiefPhase::Join => {
                if !self.coord.is_idle() {
                    return;
                }
                if let Some(error) = self.coord.take_error() {
                    self.end_early(outcome::of_closure_failure(&error));
                    return;
                }
                if self.chief.scheduled >= self.config.closures {
                    // As the program's final save would, the end waits for the servers to
                    // settle (no restore, and no server joining or leaving, under way) and for
                    // a save still written in the background.
                    let settled = !self.coord.is_holding() && !self.coord.server_changes_pending();
                    if settled && self.chief.background.is_none() {
                        self.ended = Some(Ok(()));
                    }
                    return;
                }
                self.chief.phase =
                    if self.chief.batches % self.config.save_every_batches.max(1) == 0 {
                        ChiefPhase::Save
                    } else {
                        ChiefPhase::Schedule
                    };
            }
            ChiefPhase::Save => {
                // One save in the background at a time: the one before ends first.
                if self.chief.background.is_some() {
                    return;
                }
                // As the real save: the coordinator reads the cut (waiting out recoveries and
                // servers that cannot be read for now, within SAVE_WAIT_MAX).
                let step = self.storage.len() as u64;
                match self.coord.handle_read_cut(now, step) {
                    Ok(ticket) => self.chief.phase = ChiefPhase::Saving { ticket },
                    Err(e) => self.end_early(Err(UnexpectedEnd::CutRead(e))),
                }
            }
            ChiefPhase::Saving { .. } | ChiefPhase::Writing(_) => {}
            ChiefPhase::Starting(at) => {
                if self.now < *at {
                    return;
                }
                self.start_from_checkpoint();
            }
            ChiefPhase::Restoring { .. } => {}
        }
    }

    /// The new chief incarnation's start, as the real program's `restore_checkpoint`: the
    /// newest checkpoint that verifies (CKPT-1), if any, goes to the coordinator, which probes
    /// every server and restores it (rolling back servers that went on past it), or starts
    /// afresh only if no server has applied anything (their ids and values would otherwise be
    /// reused or lost).
    fn start_from_checkpoint(&mut self) {
        let candidates: Vec<usize> = (0..self.storage.len())
            .rev()
            .filter(|stored| !self.storage[*stored].preemption)
            .collect();
        let newest = candidates
            .into_iter()
            .find_map(|stored| Some((stored, self.read_stored(stored)?)));
        let (stored, checkpoint) = match newest {
            Some((stored, checkpoint)) => (Some(stored), Some(checkpoint)),
            None => (None, None),
        };
        let root = std::path::PathBuf::from("sim-checkpoints");
        let now = self.instant();
        match self.coord.handle_start(now, checkpoint, root) {
            Ok(ticket) => self.chief.phase = ChiefPhase::Restoring { ticket, stored },
            Err(e) => self.end_early(Err(UnexpectedEnd::Start(e))),
        }
    }

    /// The coordinator's read of a cut for the chief's save ended: save it, or the program
    /// fails as the real one does when `save_checkpoint` raises.
    fn cut_read(&mut self, ticket: CutTicket, result: Result<CutReading, CutReadError>) {
        let ChiefPhase::Saving { ticket: awaited } = self.chief.phase else {
            return;
        };
        if awaited != ticket {
            return;
        }
        match result {
            Ok(reading) => {
                let Some(history) = self.take_read(ticket) else {
                    return;
                };
                let generation = reading.generation;
                let checkpoint = match reading.into_checkpoint() {
                    Ok(checkpoint) => checkpoint,
                    Err(e) => {
                        self.end_early(Err(UnexpectedEnd::Checkpoint(e)));
                        return;
                    }
                };
                let write = Box::new(PendingWrite {
                    checkpoint,
                    generation,
                    history,
                    committed: self.committed_ids(),
                    scheduled: self.chief.scheduled,
                    batches: self.chief.batches,
                });
                // As the demo, half the saves are written in the background while the program
                // schedules on (closures commit between the cut's read and its mark); the
                // others block the program until they are written.
                if self.rng.gen_bool(0.5) {
                    self.chief.background = Some(write);
                    self.chief.phase = ChiefPhase::Schedule;
                } else {
                    self.chief.phase = ChiefPhase::Writing(write);
                }
                // Writing and reading back takes a while (a large embedding's checkpoint takes
                // seconds): faults that come meanwhile find the cut read and not yet marked.
                let most = self.config.save_write_max.as_millis().max(1) as u64;
                let took = Duration::from_millis(self.rng.gen_range(1..=most));
                let chief = self.chief_epoch;
                self.at(self.now + took, Event::SaveWritten { chief });
            }
            Err(e) => self.end_early(outcome::of_cut_read(&e)),
        }
    }

    /// The chief's write of its checkpoint ended (if the incarnation that began it lives): it
    /// is stored, and marked as the cut if it reads back whole; the program goes on.
    fn save_written(&mut self, chief: u64) {
        if chief != self.chief_epoch || self.chief_state != ProcState::Up {
            return;
        }
        let write = match std::mem::replace(&mut self.chief.phase, ChiefPhase::Schedule) {
            ChiefPhase::Writing(write) => write,
            phase => {
                self.chief.phase = phase;
                match self.chief.background.take() {
                    Some(write) => write,
                    None => return,
                }
            }
        };
        self.save(*write);
    }

    /// Per row of every variable, the closures whose effect it held when read `ticket` read
    /// its shard; the harness's records of that read (and of older ones, given up) are
    /// dropped. `None`, a violation, if a row was not read.
    fn take_read(&mut self, ticket: CutTicket) -> Option<Histories> {
        let read: Vec<usize> = self
            .chief
            .read
            .iter()
            .filter(|((t, _, _), _)| *t == ticket)
            .map(|(_, (_, id))| *id)
            .collect();
        self.chief.read.retain(|(t, _, _), _| *t > ticket);
        let mut history = Histories::new();
        for id in read {
            let snapshot = &self.snapshots[id];
            for (row, held) in &snapshot.rows {
                history.insert((snapshot.shard.clone(), *row), held.clone());
            }
        }
        let complete = (0..self.config.num_ps)
            .all(|v| (0..WIDTH).all(|row| history.contains_key(&(variable(v), row))));
        if !complete {
            self.violate(
                "CKPT-1",
                "a cut was read without reading every shard".into(),
            );
            return None;
        }
        Some(history)
    }

    /// The coordinator read a parameter server's preemption cut: write it as the real shell
    /// does (the real encoder, into the simulated storage, read back), apart from the program's
    /// checkpoints; the coordinator hears that it is durable after a write's time.
    fn write_preemption_cut(
        &mut self,
        ticket: CutTicket,
        root: std::path::PathBuf,
        reading: CutReading,
    ) {
        let Some(history) = self.take_read(ticket) else {
            return;
        };
        let result = reading
            .into_checkpoint()
            .map_err(CutWriteError::from)
            .and_then(|mut checkpoint| {
                // The simulated storage names a checkpoint by its index.
                checkpoint.step = self.storage.len() as u64;
                let stored = self.storage.len();
                let positions = checkpoint.dataset_positions.clone();
                let encoded = encode_checkpoint_at(&checkpoint, self.now.as_millis() as u64)
                    .map_err(|source| CutWriteError::Save { root, source })?;
                self.storage.push(Stored {
                    files: encoded.into_iter().collect(),
                    saved: checkpoint,
                    history,
                    positions,
                    committed: self.committed_ids(),
                    scheduled: self.chief.scheduled,
                    batches: self.chief.batches,
                    preemption: true,
                });
                self.read_stored(stored)
                    .map(|_| ())
                    .ok_or(CutWriteError::Unverified)
            });
        self.cut_writes.insert((self.chief_epoch, ticket.0), result);
        let event = Event::PreemptionCutWritten {
            chief: self.chief_epoch,
            ticket: ticket.0,
        };
        self.at(self.now + LOAD_DELAY, event);
    }

    /// The chief's start ended: the program goes on from the checkpoint's step (or from the
    /// beginning, afresh), or the chief exits (its supervisor restarts it, and it tries again).
    fn startup_restored(
        &mut self,
        ticket: RestoreTicket,
        result: Result<Option<u64>, StartFailure>,
    ) {
        let ChiefPhase::Restoring { ticket: t, stored } = self.chief.phase else {
            return;
        };
        if t != ticket {
            return;
        }
        match (result, stored) {
            (Ok(Some(step)), Some(stored)) if step as usize == stored => {
                let s = &self.storage[stored];
                self.chief.scheduled = s.scheduled;
                self.chief.batches = s.batches;
                self.committed_before = s.committed.clone();
                self.chief.phase = ChiefPhase::Schedule;
                self.chief_resumes += 1;
            }
            (Ok(None), None) => {
                // Afresh: the simulated program creates no variable, so a server that lost
                // its own (restarted before any checkpoint) cannot be trained.
                if self.servers.iter().all(|s| s.out || s.store.serving()) {
                    self.chief.scheduled = 0;
                    self.chief.batches = 0;
                    self.chief.phase = ChiefPhase::Save;
                } else {
                    self.end_early(Ok(ExpectedEnd::ChiefWithoutCheckpoint));
                }
            }
            (Ok(step), stored) => {
                let detail =
                    format!("the start restored {step:?}, not the checkpoint read ({stored:?})");
                self.violate("CKPT-1", detail);
            }
            (Err(e), _) => {
                self.chief.startup_failures += 1;
                if self.chief.startup_failures > CHIEF_START_ATTEMPTS_MAX {
                    self.end_early(outcome::of_start_failure(&e, stored.is_some()));
                    return;
                }
                self.kill(Node::Chief);
            }
        }
    }

    /// DATA-1: worker `w`'s first read since its setup or rewind, in a closure dispatched in
    /// restore generation `generation`, is at `read`.
    fn check_first_read(&mut self, w: u32, read: u64, generation: u64) {
        let restore = self.restored_from.range(..=generation).next_back();
        // Drained since the newest restore (a restore clears what a drain kept): where it
        // was drained.
        let kept = self.workers[w as usize].kept;
        let expected = kept
            .or_else(|| {
                restore.and_then(|(_, stored)| self.storage[*stored].positions.get(&w).copied())
            })
            .unwrap_or(0);
        if read != expected {
            let detail = format!(
                "worker/{w} read element {read} first after its setup in generation \
                 {generation}, where the restored checkpoint (or its drain, since) puts it at \
                 {expected}"
            );
            self.violate("DATA-1", detail);
        }
    }

    /// PS-1 across chief restarts: a closure id the live chief incarnation gives out for the
    /// first time must not be one whose effect a server holds.
    fn check_fresh_id(&mut self, closure: u64) {
        if let Some(ps) = self
            .servers
            .iter()
            .position(|p| p.effective_set.contains(&closure))
        {
            let detail = format!(
                "chief incarnation {} gave out closure id {closure}, whose effect ps/{ps} holds",
                self.chief_epoch
            );
            self.violate("PS-1", detail);
        }
    }

    /// Saves a checkpoint at `cut` as the real save does: builds it from the servers'
    /// snapshots, the workers' positions and the coordinator's ledger, encodes it with the
    /// real encoder into the simulated storage (where the scenario's storage fault for this
    /// save, if any, acts on its bytes), and reads it back: only one that verifies, with the
    /// contents saved, becomes the cut (as `CheckpointManager::save` and
    /// `ClusterCoordinator::save_checkpoint` do). One that does not leaves the previous cut in
    /// place, so that a recovery restores the previous valid checkpoint and runs again
    /// everything committed since; its files stay in storage (as if the chief had crashed
    /// before removing them), and every restore must skip them.
    fn save(&mut self, write: PendingWrite) {
        let PendingWrite {
            checkpoint,
            generation,
            history,
            committed,
            scheduled,
            batches,
        } = write;
        let cut = checkpoint.ledger.next_closure_id;
        let positions = checkpoint.dataset_positions.clone();
        let index = self.chief.saves;
        self.chief.saves += 1;
        let fault = self.scenario.faults.iter().find_map(|f| match f {
            Fault::Storage { save, fault } if *save == index => Some(*fault),
            _ => None,
        });
        let stored = self.storage.len();
        let created_ms = self.now.as_millis() as u64;
        let encoded = match encode_checkpoint_at(&checkpoint, created_ms) {
            Ok(encoded) => encoded,
            Err(e) => {
                self.violate(
                    "CKPT-1",
                    format!("the save at cut {cut} cannot encode: {e}"),
                );
                return;
            }
        };
        let mut files: BTreeMap<String, Vec<u8>> = encoded.into_iter().collect();
        match fault {
            // The write fails before the manifest is published: nothing is stored, and the
            // job goes on from the previous cut (the program tells the coordinator).
            Some(StorageFault::FullDisk) => {
                self.coord
                    .handle_cut_abandoned(ClosureId(cut), "no space left on device");
                return;
            }
            // The chief dies while it writes: nothing is published.
            Some(StorageFault::CrashBeforePublish) => {
                self.kill(Node::Chief);
                return;
            }
            Some(StorageFault::Torn) => {
                let file = self.rng.gen_range(0..files.len());
                if let Some(bytes) = files.values_mut().nth(file) {
                    let keep = self.rng.gen_range(0..bytes.len().max(1));
                    bytes.truncate(keep);
                }
            }
            Some(StorageFault::BitFlip) => {
                let file = self.rng.gen_range(0..files.len());
                if let Some(bytes) = files.values_mut().nth(file) {
                    if !bytes.is_empty() {
                        let bit = self.rng.gen_range(0..bytes.len() * 8);
                        bytes[bit / 8] ^= 1 << (bit % 8);
                    }
                }
            }
            Some(StorageFault::CrashAfterPublish | StorageFault::RotAfterCut) | None => {}
        }
        self.storage.push(Stored {
            files,
            saved: checkpoint,
            history,
            positions,
            committed,
            scheduled,
            batches,
            preemption: false,
        });
        if fault == Some(StorageFault::CrashAfterPublish) {
            // The chief dies once the checkpoint is durable, before it becomes the cut: the
            // next incarnation restores from it.
            self.kill(Node::Chief);
            return;
        }
        if self.read_stored(stored).is_none() {
            // It does not verify: the job goes on from the previous cut.
            self.coord
                .handle_cut_abandoned(ClosureId(cut), "it does not read back whole");
            return;
        }
        let root = std::path::PathBuf::from("sim-checkpoints");
        // As the real shell: refused if a restore began since the servers were read.
        let marked = self
            .coord
            .handle_mark_cut(ClosureId(cut), root, Some(generation))
            .is_ok();
        if marked && fault == Some(StorageFault::RotAfterCut) {
            // It verified and is the cut now; then a bit of one of its files flips on disk.
            let files = &mut self.storage[stored].files;
            let file = self.rng.gen_range(0..files.len());
            if let Some(bytes) = files.values_mut().nth(file) {
                if !bytes.is_empty() {
                    let bit = self.rng.gen_range(0..bytes.len() * 8);
                    bytes[bit / 8] ^= 1 << (bit % 8);
                }
            }
        }
    }

    /// Reads stored checkpoint `stored` with the real decoder: `None` if it does not verify
    /// (a restore skips it). One that verifies must hold exactly what was saved (CKPT-1).
    fn read_stored(&mut self, stored: usize) -> Option<Arc<Checkpoint>> {
        let s = self.storage.get(stored)?;
        let label = checkpoint_dir_name(stored as u64);
        let read = |name: &str| {
            s.files
                .get(name)
                .cloned()
                .ok_or_else(|| LoadError::Missing {
                    file: format!("{label}/{name}"),
                    source: std::io::ErrorKind::NotFound.into(),
                })
        };
        let loaded = decode_checkpoint(&label, read).ok()?.checkpoint;
        if loaded != s.saved {
            let detail = format!("{label} verifies but does not hold what was saved");
            self.violate("CKPT-1", detail);
            return None;
        }
        Some(Arc::new(loaded))
    }

    // ---- invariants ------------------------------------------------------------------------

    /// The closures committed: those the live chief incarnation committed, and those
    /// committed before the checkpoint it resumed from (the ones its predecessors committed
    /// after that checkpoint were rolled back with the servers, and ran again as new ones).
    fn committed_ids(&self) -> BTreeSet<u64> {
        let mut committed = self.committed_before.clone();
        committed.extend((0..self.coord.next_closure_id()).filter(|id| {
            matches!(
                self.coord.state(ClosureId(*id)),
                Some(crate::roles::coordinator::ClosureState::Committed(_))
            )
        }));
        committed
    }

    fn check(&mut self) {
        let ledger = self.coord.ledger().clone();
        if !ledger.balances() {
            self.violate(
                "LEDGER-1",
                format!("the ledger does not balance: {ledger:?}"),
            );
        }
    }

    /// Every row of every variable holds the effect of exactly the committed closures, and
    /// its value and slots equal a fault-free replay of them in the order its server (or the
    /// servers it moved from) applied them.
    fn check_end_to_end(&mut self) {
        let committed = self.committed_ids();
        let ledger = self.coord.ledger().clone();
        if ledger.committed != self.config.closures || committed.len() as u64 != ledger.committed {
            self.violate(
                "END-TO-END",
                format!(
                    "{} closures committed of {} scheduled ({ledger:?})",
                    committed.len(),
                    self.config.closures
                ),
            );
            return;
        }
        let mut replays: BTreeMap<(String, Vec<u64>), ParameterStore> = BTreeMap::new();
        for layout in self.coord.layouts() {
            let name = layout.name.clone();
            let Some(v) = (0..self.config.num_ps).find(|v| variable(*v) == name) else {
                self.violate("END-TO-END", format!("unknown variable {name}"));
                return;
            };
            for shard in &layout.shards {
                let p = &self.servers[shard.ps as usize];
                let Ok(live) = p.store.variable(&name) else {
                    let detail = format!("ps/{} lost its shard of {name}", shard.ps);
                    self.violate("END-TO-END", detail);
                    return;
                };
                for row in shard.rows.clone() {
                    let held = p.history.get(&(name.clone(), row)).cloned();
                    let held = held.unwrap_or_default();
                    let effective: BTreeSet<u64> = held.iter().copied().collect();
                    if effective != committed || effective.len() != held.len() {
                        let missing: Vec<_> = committed.difference(&effective).take(5).collect();
                        let extra: Vec<_> = effective.difference(&committed).take(5).collect();
                        let detail = format!(
                            "row {row} of {name} on ps/{} holds the effect of {} closures ({} \
                             distinct) for {} committed; missing {missing:?}, not committed \
                             {extra:?}",
                            shard.ps,
                            held.len(),
                            effective.len(),
                            committed.len()
                        );
                        self.violate("END-TO-END", detail);
                        return;
                    }
                    let replay = replays
                        .entry((name.clone(), held.clone()))
                        .or_insert_with(|| replay_variable(v, &held));
                    let Ok(expected) = replay.variable(&name) else {
                        self.violate("END-TO-END", format!("the replay of {name} failed"));
                        return;
                    };
                    let at = row - shard.rows.start;
                    let slot_rows = |slots: &Slots, i: usize| -> Vec<u32> {
                        slots.iter().map(|(_, buf)| buf[i].to_bits()).collect()
                    };
                    let same = live.values()[at].to_bits() == expected.values()[row].to_bits()
                        && slot_rows(live.slots(), at) == slot_rows(expected.slots(), row)
                        && live.steps() == expected.steps();
                    if !same {
                        let detail = format!(
                            "row {row} of {name} on ps/{} differs from a fault-free replay of its \
                             {} closures: {} (steps {}) against {} (steps {})",
                            shard.ps,
                            held.len(),
                            live.values()[at],
                            live.steps(),
                            expected.values()[row],
                            expected.steps()
                        );
                        self.violate("END-TO-END", detail);
                        return;
                    }
                }
            }
        }
    }
}

/// Variable `v` (all of it) after applying `closures` once each, in order, from its initial
/// value: what a fault-free server would hold.
fn replay_variable(v: u32, closures: &[u64]) -> ParameterStore {
    let mut replay = new_store();
    replay
        .handle_create(&variable(v), vec![WIDTH], initial(v))
        .expect("a fresh store takes a new variable");
    for closure in closures {
        let origin = PushOrigin {
            worker: 0,
            epoch: 1,
            closure: ClosureId(*closure),
            attempt: 1,
            part: 0,
            generation: 0,
            learning_rate: None,
        };
        let grad = [(variable(v), Gradient::Dense(gradient(*closure).into()))];
        let applied = replay.handle_push(origin, &grad);
        debug_assert_eq!(applied, Ok(PushOutcome::Applied));
    }
    replay
}

/// A chief incarnation's coordinator, configured as the chief program does: every worker
/// reads one dataset.
fn new_coordinator(config: &SimConfig, servers: u32) -> Scheduler {
    let mut coord = Scheduler::new(SchedulerConfig {
        ps_restart_wait_max: config.ps_restart_wait,
        no_worker_wait_max: config.ps_restart_wait,
        ..SchedulerConfig::default()
    })
    .with_servers(servers)
    .with_workers(config.num_workers)
    .with_checkpoint_dir(Some(std::path::PathBuf::from("sim-checkpoints")));
    coord.handle_configure(SetupWorker {
        num_workers: config.num_workers,
        layouts: layouts(config.num_ps, servers),
        servers: Vec::new(),
        datasets: vec![(DATASET.into(), 0)],
        version: 0,
    });
    coord
}

/// The one dataset every worker reads.
const DATASET: &str = "data";

/// The dataset position a setup for a worker carries (its skip).
fn skip_of(setup: &SetupWorker) -> u64 {
    setup
        .datasets
        .iter()
        .find(|(name, _)| name == DATASET)
        .map_or(0, |(_, skip)| *skip)
}

/// A call's outcome as the machine hears it: done, refused (the callee answered no), or
/// unreachable (no answer, or the connection was lost).
fn call_result(resp: Result<Resp, NoReply>) -> Result<(), CallFault> {
    match resp {
        Ok(Resp::Done) => Ok(()),
        Ok(Resp::Refused(e)) => Err(CallFault::Refused(e)),
        Ok(Resp::Unavailable(e)) => Err(CallFault::Unreachable(e)),
        Ok(other) => Err(CallFault::Refused(format!("unexpected answer {other:?}"))),
        Err(e) => Err(CallFault::Unreachable(e.to_string())),
    }
}

/// Why a call got no reply: its connection was lost, or the caller's bound passed (the
/// gateway's `PeerLost` and `Timeout`, which the machine hears as unreachable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum NoReply {
    /// A partition or a pause held the call past the detection budget: the connection idled
    /// out.
    #[error("connection lost (idle timeout)")]
    IdledOut,
    /// The callee's incarnation went down.
    #[error("{node} (incarnation {epoch}): connection lost")]
    ConnectionLost {
        /// The callee.
        node: Node,
        /// Its incarnation.
        epoch: u64,
    },
    /// The call's bound passed.
    #[error("no answer in time")]
    NoAnswerInTime,
}

/// Why a simulated server refuses a [`RestoreVariable`] (its answer carries the text, as the
/// real server's does).
#[derive(Debug, thiserror::Error)]
enum RestoreRefusal {
    /// A blob the message names is not there.
    #[error("{what}: blob {index} missing")]
    BlobMissing {
        /// The buffer.
        what: String,
        /// Its index among the blobs.
        index: usize,
    },
    /// A blob is not a whole number of f32 values.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The slots do not fit the optimizer.
    #[error(transparent)]
    Slots(#[from] OptimError),
    /// The store refused the restore.
    #[error(transparent)]
    Store(#[from] PsError),
}

/// Restores one variable into `store` from a [`RestoreVariable`] and its blobs (the values,
/// then its slots), as the parameter server's actor does; `Err` is its refusal.
fn restore_variable(
    store: &mut ParameterStore,
    msg: RestoreVariable,
    blobs: &[bytes::Bytes],
) -> Result<(), RestoreRefusal> {
    let blob = |i: usize, what: &str| {
        let bytes = blobs.get(i).ok_or_else(|| RestoreRefusal::BlobMissing {
            what: what.to_string(),
            index: i,
        })?;
        Ok::<_, RestoreRefusal>(bytes_to_f32(bytes, what)?)
    };
    let values = blob(0, &msg.name)?;
    let mut buffers = Vec::with_capacity(msg.slots.len());
    for (i, slot) in msg.slots.iter().enumerate() {
        buffers.push((slot.clone(), blob(i + 1, &format!("{}/{slot}", msg.name))?));
    }
    let slots = Slots::restore(store.optimizer(), &msg.name, values.len(), buffers, 0)?;
    let shape = msg.shape.iter().map(|&d| d as usize).collect();
    Ok(store.handle_restore(&msg.name, shape, values, slots, msg.steps)?)
}

/// The optimizer every simulated server runs (with slots, so that restoring them matters).
fn new_store() -> ParameterStore {
    ParameterStore::new(Optimizer::adagrad(0.05)).expect("valid hyperparameters")
}

/// The job's variables (one per server the spec first named) as a chief program with
/// `servers` servers places them: variable `v` whole on server `v % servers` (with the spec's
/// servers, server `ps` holds all of [`variable`]`(ps)`).
fn layouts(variables: u32, servers: u32) -> Vec<Layout> {
    (0..variables)
        .map(|v| Layout {
            name: variable(v),
            dtype: Dtype::F32,
            shape: vec![WIDTH],
            shards: vec![Shard {
                ps: v % servers.max(1),
                rows: 0..WIDTH,
            }],
        })
        .collect()
}

/// The one variable server `ps` holds.
fn variable(ps: u32) -> String {
    format!("w{ps}")
}

fn initial(ps: u32) -> Vec<f32> {
    (0..WIDTH)
        .map(|i| (ps as f32 + 1.0) * 0.1 * i as f32)
        .collect()
}

/// Closure `closure`'s gradient: a function of its id alone, so a replay can recompute it.
fn gradient(closure: u64) -> Vec<f32> {
    (0..WIDTH as u64)
        .map(|i| ((closure.wrapping_mul(31).wrapping_add(i * 7)) % 13) as f32 / 13.0 - 0.5)
        .collect()
}

/// How long a worker's step computes, milliseconds (drawn per step from the scenario's seed).
const STEP_MS: (u64, u64) = (10, 60);
/// Elements of each server's variable.
const WIDTH: usize = 4;
/// The coordinator's tick (its reconnect interval, and the detector's resolution).
const TICK: Duration = Duration::from_millis(100);
/// A silent node is probed after this fraction of the detection budget: two heartbeat
/// intervals, with the default 500 ms interval and 3 s budget.
const REFUSED_AFTER_BUDGET_DIVISOR: u32 = 3;
/// How often the low watermark may go out.
const WATERMARK_EVERY: Duration = Duration::from_secs(1);
/// What one lost datagram costs a message (QUIC sends it again).
const RETRANSMIT_DELAY: Duration = Duration::from_millis(200);
/// How often a message held by a partition or a pause is tried again.
const HOLD_RETRY: Duration = Duration::from_millis(50);
/// Reading a checkpoint from the simulated storage.
const LOAD_DELAY: Duration = Duration::from_millis(20);
/// Restores at start-up a chief may fail before the job fails.
const CHIEF_START_ATTEMPTS_MAX: u32 = 3;

/// FNV-1a: a hasher with no per-process seed, so a trace hashes the same in every run.
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    }

    // Integers in one step rather than byte by byte: an event's fields are mostly integers,
    // and hashing every event is a good part of a schedule's cost.
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(FNV_PRIME);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
