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

use super::{Fault, Node, Scenario, SimConfig, StorageFault, Violation};
use crate::checkpoint::Checkpoint;
use crate::optim::{Optimizer, Slots};
use crate::roles::coordinator::{
    CallFault, CheckpointRef, ClosureId, ConfigureTicket, Ledger, PositionsTicket, PsDial,
    RestoreCall, RestoreReport, ResultDisposition, Scheduler, SchedulerAction, SchedulerConfig,
    WorkerDial,
};
use crate::roles::protocol::SetupWorker;
use crate::roles::ps::{Gradient, ParameterStore, PushOrigin, PushOutcome};

/// How a run ended, and what it saw.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The scenario's seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Every closure committed and the job ended without an error.
    pub finished: bool,
    /// The error the job ended with, if it failed (allowed, when a fault is beyond repair).
    pub failure: Option<String>,
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
}

pub(super) struct World<'a> {
    config: &'a SimConfig,
    scenario: &'a Scenario,
    rng: ChaCha8Rng,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    events: u64,
    trace_hash: u64,
    trace: Vec<String>,
    coord: Scheduler,
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
    violation: Option<Violation>,
    ended: Option<Result<(), String>>,
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
        msg: Msg,
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
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum FaultEvent {
    Kill(Node),
    Pause(Node, u64),
    Partition(Node, u64, bool),
    Preempt(Node),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Msg {
    /// A coordinator call.
    Request { call: u64, req: Req },
    /// Its answer.
    Reply { call: u64, resp: Resp },
    /// Worker to server, and back.
    Push {
        worker: u32,
        epoch: u64,
        run: u64,
        origin: Origin,
    },
    PushReply {
        ps: u32,
        run: u64,
        result: PushResult,
    },
}

/// [`PushOrigin`] as the simulator orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Origin {
    closure: u64,
    attempt: u32,
    generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Req {
    Run {
        closure: u64,
        attempt: u32,
        generation: u64,
    },
    /// A dial: whichever incarnation listens at the address answers with its epoch.
    Hello,
    SetUp {
        setup_version: u64,
    },
    /// A new setup for a live worker.
    Configure,
    /// Where its datasets are.
    Positions,
    Rewind,
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
    },
    RollBack {
        below: u64,
        generation: u64,
    },
    Snapshot,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Resp {
    Done,
    Refused(String),
    Run(RunResult),
    Probe { epoch: u64, serving: bool },
    Hello { epoch: u64 },
    Positions(Vec<(String, u64)>),
    Snapshot(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum RunResult {
    Committed,
    PsUnavailable(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum PushResult {
    Applied,
    Duplicate,
    Stale,
    Unavailable,
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
    /// The closures whose effect this server's variables hold, in the order applied (PS-1).
    effective: Vec<u64>,
    /// Every closure id applied since the last restore, to check PS-1 against.
    effective_set: BTreeSet<u64>,
}

struct WorkerProc {
    epoch: u64,
    state: ProcState,
    run: Option<WorkerRun>,
    /// Got a preemption notice: it takes no new step (the real worker's compute stops).
    preempted: bool,
}

/// The worker's step: push to every server, wait for every answer, report.
struct WorkerRun {
    call: u64,
    closure: u64,
    attempt: u32,
    generation: u64,
    replies: BTreeMap<u32, Option<PushResult>>,
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
}

enum ChiefPhase {
    Schedule,
    Join,
    /// Reading every server for a checkpoint: (next id, generation) when it began, and the
    /// snapshots so far.
    Save {
        probe: (u64, u64),
        snapshots: BTreeMap<u32, usize>,
        failed: bool,
    },
    /// Waiting to read again until this time.
    SaveBackoff(Duration),
}

/// A server's state as a checkpoint holds it.
#[derive(Debug, Clone)]
struct PsSnapshot {
    variables: Vec<StoredShard>,
    effective: Vec<u64>,
}

/// One variable as a checkpoint holds it: name, shape, values, optimizer slots, steps.
type StoredShard = (String, Vec<usize>, Vec<f32>, Slots, u64);

/// A checkpoint in the simulated storage.
struct Stored {
    cut: u64,
    servers: Vec<PsSnapshot>,
    /// It verifies (no torn or flipped file).
    valid: bool,
    /// What a restore gets (the same `Arc` every time).
    checkpoint: Arc<Checkpoint>,
}

/// Snapshots taken and not yet saved, by id (each server's reply to `Snapshot`).
type Snapshots = Vec<PsSnapshot>;

impl<'a> World<'a> {
    pub(super) fn new(config: &'a SimConfig, scenario: &'a Scenario) -> Self {
        let scheduler = Scheduler::new(SchedulerConfig {
            ps_restart_wait_max: config.ps_restart_wait,
            no_worker_wait_max: config.ps_restart_wait,
            ..SchedulerConfig::default()
        })
        .with_servers(config.num_ps)
        .with_workers(config.num_workers);
        let servers = (0..config.num_ps)
            .map(|ps| {
                let mut store = new_store();
                store
                    .handle_create(&variable(ps), vec![WIDTH], initial(ps))
                    .expect("a fresh store takes a new variable");
                PsProc {
                    epoch: 1,
                    state: ProcState::Up,
                    store,
                    effective: Vec::new(),
                    effective_set: BTreeSet::new(),
                }
            })
            .collect();
        let workers = (0..config.num_workers)
            .map(|_| WorkerProc {
                epoch: 1,
                state: ProcState::Up,
                run: None,
                preempted: false,
            })
            .collect();
        let mut world = Self {
            config,
            scenario,
            rng: ChaCha8Rng::seed_from_u64(scenario.seed),
            base: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: 0,
            trace_hash: FNV_OFFSET,
            trace: Vec::new(),
            coord: scheduler,
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
                phase: ChiefPhase::SaveBackoff(Duration::ZERO),
                saves: 0,
            },
            storage: Vec::new(),
            detector: BTreeMap::new(),
            fenced: BTreeMap::new(),
            snapshots: Vec::new(),
            violation: None,
            ended: None,
        };
        world.coord.handle_configure(
            SetupWorker {
                num_workers: config.num_workers,
                layouts_json: "[]".into(),
                datasets: Vec::new(),
            },
            Vec::new(),
        );
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
            Node::Chief => (ProcState::Up, 1),
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
            Node::Chief => {}
            Node::Ps(i) => self.servers[i as usize].state = state,
            Node::Worker(i) => self.workers[i as usize].state = state,
        }
    }

    /// The process dies; its supervisor starts a new incarnation after the restart delay.
    fn kill(&mut self, node: Node) {
        if self.state(node).0 == ProcState::Down || node == Node::Chief {
            return;
        }
        self.set_state(node, ProcState::Down);
        if let Node::Worker(i) = node {
            self.workers[i as usize].run = None;
        }
        let at = self.now + self.config.restart_delay;
        self.at(at, Event::Restart { node });
    }

    fn restart(&mut self, node: Node) {
        match node {
            Node::Chief => {}
            Node::Ps(i) => {
                let p = &mut self.servers[i as usize];
                p.epoch += 1;
                p.state = ProcState::Up;
                // A new incarnation holds nothing until it is restored.
                p.store = new_store();
                p.effective.clear();
                p.effective_set.clear();
            }
            Node::Worker(i) => {
                let w = &mut self.workers[i as usize];
                w.epoch += 1;
                w.state = ProcState::Up;
                w.run = None;
                w.preempted = false;
            }
        }
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
                msg: msg.clone(),
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
                    self.on_reply(call, Err("connection lost (idle timeout)".into()));
                }
                return;
            }
            // Retried until the node can take it, or the connection idles out.
            let event = Event::Deliver {
                from,
                to,
                to_epoch,
                sent,
                msg,
            };
            self.at(self.now + HOLD_RETRY, event);
            return;
        }
        match (to, msg) {
            (Node::Chief, Msg::Reply { call, resp }) => self.on_reply(call, Ok(resp)),
            (Node::Ps(ps), msg) => self.ps_receive(ps, msg),
            (Node::Worker(w), msg) => self.worker_receive(w, msg),
            _ => {}
        }
    }

    // ---- the parameter server --------------------------------------------------------------

    fn ps_receive(&mut self, ps: u32, msg: Msg) {
        let node = Node::Ps(ps);
        match msg {
            Msg::Push {
                worker,
                epoch: worker_epoch,
                run,
                origin,
            } => {
                let result = self.apply_push(ps, worker, worker_epoch, origin);
                self.send(
                    node,
                    Node::Worker(worker),
                    worker_epoch,
                    Msg::PushReply { ps, run, result },
                );
            }
            Msg::Request {
                call,
                req: Req::Retire,
            } => {
                // It answers, then exits (its supervisor restarts it as a new incarnation).
                let resp = Resp::Done;
                self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                self.kill(node);
            }
            Msg::Request { call, req } => {
                let resp = self.ps_request(ps, req);
                self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
            }
            _ => {}
        }
    }

    fn apply_push(
        &mut self,
        ps: u32,
        worker: u32,
        worker_epoch: u64,
        origin: Origin,
    ) -> PushResult {
        let p = &mut self.servers[ps as usize];
        if p.store.variables().next().is_none() {
            // The serving gate: an empty (restarted, not restored) server refuses.
            return PushResult::Unavailable;
        }
        let grad = gradient(origin.closure);
        let push_origin = PushOrigin {
            worker,
            epoch: worker_epoch,
            closure: ClosureId(origin.closure),
            attempt: origin.attempt,
            generation: origin.generation,
        };
        let gradients = [(variable(ps), Gradient::Dense(grad.into()))];
        match p.store.handle_push(push_origin, &gradients) {
            Ok(PushOutcome::Applied) => {
                if !p.effective_set.insert(origin.closure) {
                    let detail = format!(
                        "ps/{ps} applied closure {} a second time (attempt {}, worker/{worker} \
                         epoch {worker_epoch})",
                        origin.closure, origin.attempt
                    );
                    self.violate("PS-1", detail);
                }
                self.servers[ps as usize].effective.push(origin.closure);
                PushResult::Applied
            }
            Ok(PushOutcome::Duplicate) => PushResult::Duplicate,
            Ok(PushOutcome::Stale) => PushResult::Stale,
            Ok(PushOutcome::SkippedNonFinite) | Err(_) => PushResult::Unavailable,
        }
    }

    fn ps_request(&mut self, ps: u32, req: Req) -> Resp {
        let p = &mut self.servers[ps as usize];
        match req {
            Req::Probe => Resp::Probe {
                epoch: p.epoch,
                serving: p.store.variables().next().is_some(),
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
            Req::Shards { stored } => {
                let Some(snapshot) = self
                    .storage
                    .get(stored)
                    .and_then(|s| s.servers.get(ps as usize).cloned())
                else {
                    return Resp::Refused("no such checkpoint".into());
                };
                let p = &mut self.servers[ps as usize];
                for (name, shape, values, slots, steps) in snapshot.variables {
                    if let Err(e) = p.store.handle_restore(&name, shape, values, slots, steps) {
                        return Resp::Refused(e.to_string());
                    }
                }
                p.effective_set = snapshot.effective.iter().copied().collect();
                p.effective = snapshot.effective;
                Resp::Done
            }
            Req::RollBack { below, generation } => {
                p.store.handle_roll_back(ClosureId(below), generation);
                Resp::Done
            }
            Req::Snapshot => {
                if p.store.variables().next().is_none() {
                    return Resp::Refused("not serving".into());
                }
                let variables = p
                    .store
                    .variables()
                    .map(|(name, v)| {
                        (
                            name.to_string(),
                            v.shape().to_vec(),
                            v.values().to_vec(),
                            v.slots().clone(),
                            v.steps(),
                        )
                    })
                    .collect();
                let snapshot = PsSnapshot {
                    variables,
                    effective: p.effective.clone(),
                };
                self.pending_snapshots().push(snapshot);
                Resp::Snapshot(self.pending_snapshots().len() - 1)
            }
            Req::Run { .. }
            | Req::SetUp { .. }
            | Req::Configure
            | Req::Positions
            | Req::Rewind
            | Req::Retire => Resp::Refused("not a worker".into()),
        }
    }

    fn pending_snapshots(&mut self) -> &mut Snapshots {
        &mut self.snapshots
    }

    // ---- the worker (a stand-in for its machine) -------------------------------------------

    fn worker_receive(&mut self, w: u32, msg: Msg) {
        let node = Node::Worker(w);
        let epoch = self.workers[w as usize].epoch;
        match msg {
            Msg::Request { call, req } => match req {
                Req::Run {
                    closure,
                    attempt,
                    generation,
                } => {
                    let worker = &mut self.workers[w as usize];
                    if worker.preempted {
                        let resp = Resp::Refused("preempted".into());
                        self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                        return;
                    }
                    if worker.run.as_ref().is_some_and(|r| r.call == call) {
                        return; // the same request again
                    }
                    if worker.run.is_some() {
                        let resp = Resp::Refused("busy".into());
                        self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                        return;
                    }
                    worker.run = Some(WorkerRun {
                        call,
                        closure,
                        attempt,
                        generation,
                        replies: (0..self.config.num_ps).map(|ps| (ps, None)).collect(),
                    });
                    let step_ms = self.rng.gen_range(STEP_MS.0..=STEP_MS.1);
                    let event = Event::Computed {
                        worker: w,
                        epoch,
                        run: call,
                    };
                    self.at(self.now + Duration::from_millis(step_ms), event);
                }
                Req::SetUp { .. } | Req::Configure | Req::Rewind => {
                    self.send(
                        node,
                        Node::Chief,
                        1,
                        Msg::Reply {
                            call,
                            resp: Resp::Done,
                        },
                    );
                }
                Req::Hello => {
                    let resp = Resp::Hello { epoch };
                    self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                }
                Req::Positions => {
                    let resp = Resp::Positions(Vec::new());
                    self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                }
                Req::Retire => {
                    let resp = Resp::Done;
                    self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                    self.kill(node);
                }
                _ => {
                    let resp = Resp::Refused("not a server".into());
                    self.send(node, Node::Chief, 1, Msg::Reply { call, resp });
                }
            },
            Msg::PushReply { ps, run, result } => self.push_answered(w, epoch, run, ps, result),
            _ => {}
        }
    }

    /// The step computed: its gradient goes to every server, each push bounded in time.
    fn computed(&mut self, w: u32, epoch: u64, run: u64) {
        let node = Node::Worker(w);
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
        let Some(current) = worker.run.as_ref().filter(|r| r.call == run) else {
            return;
        };
        let origin = Origin {
            closure: current.closure,
            attempt: current.attempt,
            generation: current.generation,
        };
        for ps in 0..self.config.num_ps {
            let ps_epoch = self.servers[ps as usize].epoch;
            let msg = Msg::Push {
                worker: w,
                epoch,
                run,
                origin,
            };
            self.send(node, Node::Ps(ps), ps_epoch, msg);
            let event = Event::PushTimeout {
                worker: w,
                epoch,
                run,
                ps,
            };
            self.at(self.now + self.config.detection_budget, event);
        }
    }

    /// One server answered (or its push timed out, as [`PushResult::Unavailable`]); once all
    /// did, the worker reports as the real one does: a server unreachable, refusing, or
    /// answering stale makes the closure's outcome `PsUnavailable` (retryable), else it
    /// committed.
    fn push_answered(&mut self, w: u32, epoch: u64, run: u64, ps: u32, result: PushResult) {
        let worker = &mut self.workers[w as usize];
        if worker.epoch != epoch || worker.state != ProcState::Up {
            return;
        }
        let Some(current) = worker.run.as_mut().filter(|r| r.call == run) else {
            return;
        };
        match current.replies.get_mut(&ps) {
            Some(slot @ None) => *slot = Some(result),
            _ => return,
        }
        if current.replies.values().any(Option::is_none) {
            return;
        }
        let run = worker.run.take().expect("checked above");
        let unavailable = run.replies.iter().find_map(|(ps, r)| match r {
            Some(PushResult::Applied | PushResult::Duplicate) => None,
            _ => Some(*ps),
        });
        let result = match unavailable {
            Some(ps) => RunResult::PsUnavailable(ps),
            None => RunResult::Committed,
        };
        self.send(
            Node::Worker(w),
            Node::Chief,
            1,
            Msg::Reply {
                call: run.call,
                resp: Resp::Run(result),
            },
        );
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
    fn on_reply(&mut self, call: u64, resp: Result<Resp, String>) {
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
                    Ok(Resp::Probe { epoch, serving }) => {
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
                        result: fault(resp).map_err(|e| e.to_string()),
                    },
                    RestoreCall::Load { .. } => return,
                };
                self.coord.handle_restore_report(now, generation, report);
            }
            CallKind::Snapshot { ps } => {
                if let ChiefPhase::Save {
                    snapshots, failed, ..
                } = &mut self.chief.phase
                {
                    match resp {
                        Ok(Resp::Snapshot(id)) => {
                            snapshots.insert(ps, id);
                        }
                        _ => *failed = true,
                    }
                }
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
                    };
                    let bound = self.coord.config().step_timeout;
                    self.call(Node::Worker(worker), epoch, kind, req, bound);
                }
                SchedulerAction::Fence { worker, epoch } => {
                    let fenced = self.fenced.entry(worker).or_insert(epoch);
                    *fenced = (*fenced).max(epoch);
                    for ps in 0..self.config.num_ps {
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
                    for ps in 0..self.config.num_ps {
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
                    ..
                } => {
                    let kind = CallKind::SetUp {
                        worker,
                        epoch,
                        version,
                    };
                    let req = Req::SetUp {
                        setup_version: version,
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
                    ..
                } => {
                    let bound = self.config.call_timeout;
                    let kind = CallKind::Reconfigure {
                        ticket,
                        worker,
                        epoch,
                    };
                    self.call(Node::Worker(worker), epoch, kind, Req::Configure, bound);
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
                // The chief program's waits: nothing for the executor to carry out.
                SchedulerAction::RestoreFinished { .. }
                | SchedulerAction::ConfigureFinished { .. }
                | SchedulerAction::PositionsCollected { .. } => {}
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
                ..
            } => {
                let stored = checkpoint.0.step as usize;
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Ps(*ps), *epoch, kind, Req::Shards { stored }, bound);
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
                ..
            } => {
                let kind = CallKind::Restore {
                    generation: *generation,
                    call: call.clone(),
                };
                self.call(Node::Worker(*worker), *epoch, kind, Req::Rewind, bound);
            }
        }
    }

    /// The newest checkpoint taken at `cut` that verifies (CKPT-1): corrupt ones are skipped.
    fn load(&mut self, generation: u64, cut: u64) {
        let found = self
            .storage
            .iter()
            .rev()
            .find(|s| s.cut == cut && s.valid)
            .map(|s| CheckpointRef(Arc::clone(&s.checkpoint)));
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
            self.on_reply(
                call,
                Err(format!("{node} (epoch {epoch}): connection lost")),
            );
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
                FaultEvent::Preempt(node) => {
                    if self.state(node).0 != ProcState::Down {
                        // A server keeps serving through its grace; a worker takes no new step.
                        if let Node::Worker(i) = node {
                            self.workers[i as usize].preempted = true;
                        }
                        let at = self.now + self.config.preemption_grace;
                        self.at(at, Event::Inject(FaultEvent::Kill(node)));
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
            } => self.deliver(from, to, to_epoch, sent, msg),
            Event::CallTimeout { call } => self.on_reply(call, Err("no answer in time".into())),
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
                    self.push_answered(worker, epoch, run, ps, PushResult::Unavailable);
                }
            }
            Event::Loaded { generation, cut } => self.load(generation, cut),
            Event::Computed { worker, epoch, run } => self.computed(worker, epoch, run),
        }
    }

    /// The coordinator's periodic work and the chief program's next step.
    fn tick(&mut self) {
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

    /// The failure detector: a node unheard for the budget is declared dead; a server heard
    /// as a new incarnation is reported up.
    fn detect(&mut self) {
        let now = self.instant();
        let nodes: Vec<Node> = (0..self.config.num_ps)
            .map(Node::Ps)
            .chain((0..self.config.num_workers).map(Node::Worker))
            .collect();
        for node in nodes {
            let (_, epoch) = self.state(node);
            let heard = self.heard(node);
            let budget = self.config.detection_budget;
            let entry = self.detector.entry(node).or_default();
            if heard {
                entry.unheard_since = None;
                let previous = entry.seen.replace(epoch);
                if previous == Some(epoch) {
                    continue;
                }
                // A new incarnation says hello: the old one's connection is gone, and with it
                // every call to it (the gateway reports the old incarnation dead).
                let old = previous.filter(|old| entry.declared != Some(*old));
                if let Some(old) = old {
                    entry.declared = Some(old);
                }
                match node {
                    Node::Ps(ps) => {
                        if let Some(old) = old {
                            self.coord.handle_ps_lost(now, ps, old);
                        }
                        self.coord.handle_ps_up(now, ps, epoch);
                    }
                    Node::Worker(w) => {
                        if let Some(old) = old {
                            self.coord.handle_worker_lost(now, w, old);
                        }
                    }
                    Node::Chief => {}
                }
                if let Some(old) = old {
                    self.fail_calls(node, old);
                }
                continue;
            }
            let since = *entry.unheard_since.get_or_insert(self.now);
            let Some(seen) = entry.seen else { continue };
            if self.now < since + budget || entry.declared == Some(seen) {
                continue;
            }
            entry.declared = Some(seen);
            match node {
                Node::Ps(ps) => self.coord.handle_ps_lost(now, ps, seen),
                Node::Worker(w) => self.coord.handle_worker_lost(now, w, seen),
                Node::Chief => {}
            }
            self.fail_calls(node, seen);
        }
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
                    self.ended = Some(Err(error.to_string()));
                    return;
                }
                if self.chief.scheduled >= self.config.closures {
                    self.ended = Some(Ok(()));
                    return;
                }
                self.chief.phase =
                    if self.chief.batches % self.config.save_every_batches.max(1) == 0 {
                        ChiefPhase::SaveBackoff(self.now)
                    } else {
                        ChiefPhase::Schedule
                    };
            }
            ChiefPhase::SaveBackoff(until) => {
                if self.now < *until {
                    return;
                }
                if self.coord.is_holding() {
                    self.chief.phase = ChiefPhase::SaveBackoff(self.now + SAVE_BACKOFF);
                    return;
                }
                if let Some(error) = self.coord.take_error() {
                    self.ended = Some(Err(error.to_string()));
                    return;
                }
                let probe = (self.coord.next_closure_id(), self.coord.generation());
                self.chief.phase = ChiefPhase::Save {
                    probe,
                    snapshots: BTreeMap::new(),
                    failed: false,
                };
                for ps in 0..self.config.num_ps {
                    let epoch = self.servers[ps as usize].epoch;
                    let bound = self.config.call_timeout;
                    self.call(
                        Node::Ps(ps),
                        epoch,
                        CallKind::Snapshot { ps },
                        Req::Snapshot,
                        bound,
                    );
                }
            }
            ChiefPhase::Save {
                probe,
                snapshots,
                failed,
            } => {
                let probe = *probe;
                let failed = *failed;
                if !failed && snapshots.len() < self.config.num_ps as usize {
                    return;
                }
                let disturbed = failed
                    || self.coord.is_holding()
                    || (self.coord.next_closure_id(), self.coord.generation()) != probe;
                if disturbed {
                    self.chief.phase = ChiefPhase::SaveBackoff(self.now + SAVE_BACKOFF);
                    return;
                }
                let ids: Vec<usize> = snapshots.values().copied().collect();
                let servers: Vec<PsSnapshot> = ids
                    .into_iter()
                    .map(|id| self.snapshots[id].clone())
                    .collect();
                self.save(probe.0, servers);
                self.chief.phase = ChiefPhase::Schedule;
            }
        }
    }

    /// Writes a checkpoint at `cut` (with the scenario's storage fault for this save, if any)
    /// and marks the cut once it is durable.
    fn save(&mut self, cut: u64, servers: Vec<PsSnapshot>) {
        let index = self.chief.saves;
        self.chief.saves += 1;
        let fault = self.scenario.faults.iter().find_map(|f| match f {
            Fault::Storage { save, fault } if *save == index => Some(*fault),
            _ => None,
        });
        if fault == Some(StorageFault::FullDisk) {
            return; // the save fails; the job goes on from the previous cut
        }
        let stored = self.storage.len();
        let mut checkpoint = Checkpoint::new(stored as u64, self.config.num_ps as usize);
        checkpoint.ledger.next_closure_id = cut;
        self.storage.push(Stored {
            cut,
            servers,
            valid: fault.is_none(),
            checkpoint: Arc::new(checkpoint),
        });
        let root = std::path::PathBuf::from("sim-checkpoints");
        let _ = self.coord.mark_cut(ClosureId(cut), root);
    }

    // ---- invariants ------------------------------------------------------------------------

    fn check(&mut self) {
        let ledger = self.coord.ledger().clone();
        if !ledger.balances() {
            self.violate(
                "LEDGER-1",
                format!("the ledger does not balance: {ledger:?}"),
            );
        }
    }

    /// Every server's effective closures are exactly the committed ones, and its variable and
    /// slots equal a fault-free replay of them in the order it applied them.
    fn check_end_to_end(&mut self) {
        let committed: BTreeSet<u64> = (0..self.coord.next_closure_id())
            .filter(|id| {
                matches!(
                    self.coord.state(ClosureId(*id)),
                    Some(crate::roles::coordinator::ClosureState::Committed(_))
                )
            })
            .collect();
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
        for ps in 0..self.config.num_ps {
            let p = &self.servers[ps as usize];
            let effective: BTreeSet<u64> = p.effective.iter().copied().collect();
            if effective != committed || effective.len() != p.effective.len() {
                let missing: Vec<_> = committed.difference(&effective).take(5).collect();
                let extra: Vec<_> = effective.difference(&committed).take(5).collect();
                let detail = format!(
                    "ps/{ps} holds the effect of {} closures ({} distinct) for {} committed; \
                     missing {missing:?}, not committed {extra:?}",
                    p.effective.len(),
                    effective.len(),
                    committed.len()
                );
                self.violate("END-TO-END", detail);
                return;
            }
            let mut replay = new_store();
            replay
                .handle_create(&variable(ps), vec![WIDTH], initial(ps))
                .expect("a fresh store takes a new variable");
            for (n, closure) in p.effective.iter().enumerate() {
                let origin = PushOrigin {
                    worker: 0,
                    epoch: 1,
                    closure: ClosureId(*closure),
                    attempt: 1,
                    generation: 0,
                };
                let grad = [(variable(ps), Gradient::Dense(gradient(*closure).into()))];
                if replay.handle_push(origin, &grad) != Ok(PushOutcome::Applied) {
                    self.violate(
                        "END-TO-END",
                        format!("the replay of ps/{ps} refused push {n}"),
                    );
                    return;
                }
            }
            let name = variable(ps);
            let (Ok(live), Ok(expected)) = (p.store.variable(&name), replay.variable(&name)) else {
                self.violate("END-TO-END", format!("ps/{ps} lost its variable"));
                return;
            };
            let same = live
                .values()
                .iter()
                .map(|v| v.to_bits())
                .eq(expected.values().iter().map(|v| v.to_bits()))
                && live.slots() == expected.slots()
                && live.steps() == expected.steps();
            if !same {
                let detail = format!(
                    "ps/{ps}'s variable differs from a fault-free replay of its {} closures: \
                     {:?} (steps {}) against {:?} (steps {})",
                    p.effective.len(),
                    live.values(),
                    live.steps(),
                    expected.values(),
                    expected.steps()
                );
                self.violate("END-TO-END", detail);
                return;
            }
        }
    }
}

/// The optimizer every simulated server runs (with slots, so that restoring them matters).
/// A call's outcome as the machine hears it: done, refused (the callee answered no), or
/// unreachable (no answer, or the connection was lost).
fn call_result(resp: Result<Resp, String>) -> Result<(), CallFault> {
    match resp {
        Ok(Resp::Done) => Ok(()),
        Ok(Resp::Refused(e)) => Err(CallFault::Refused(e)),
        Ok(other) => Err(CallFault::Refused(format!("unexpected answer {other:?}"))),
        Err(e) => Err(CallFault::Unreachable(e)),
    }
}

fn new_store() -> ParameterStore {
    ParameterStore::new(Optimizer::adagrad(0.05)).expect("valid hyperparameters")
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
/// How often the low watermark may go out.
const WATERMARK_EVERY: Duration = Duration::from_secs(1);
/// What one lost datagram costs a message (QUIC sends it again).
const RETRANSMIT_DELAY: Duration = Duration::from_millis(200);
/// How often a message held by a partition or a pause is tried again.
const HOLD_RETRY: Duration = Duration::from_millis(50);
/// Reading a checkpoint from the simulated storage.
const LOAD_DELAY: Duration = Duration::from_millis(20);
/// Pause before a save reads the servers again.
const SAVE_BACKOFF: Duration = Duration::from_millis(200);

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
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
