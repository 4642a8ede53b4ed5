//! The membership simulator's world: the worker processes (each a member machine, or down),
//! their supervisor, the network between them (delays, cuts, a dead or paused peer), the
//! detection of a lost link, and the event queue that drives them all in virtual time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cohort_transport::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checks::Checks;
use super::rounds::{Received, RoundMessage, Rounds};
use super::{MembershipConfig, MembershipFaultKind, MembershipScenario, MembershipViolation};
use crate::collective::{
    GroupMember, Leave, MemberAction, MemberExit, MemberMachine, MemberMessage, MemberSettings,
};
use crate::process::Incarnation;

/// What one membership run found.
#[derive(Debug, Clone, Default)]
pub struct MembershipReport {
    /// Whether the job finished (a process applied the last step).
    pub finished: bool,
    /// The first invariant broken, if any.
    pub violation: Option<MembershipViolation>,
    /// Events processed.
    pub events: u64,
    /// Groups formed (at any process).
    pub groups_formed: u64,
    /// Process exits, by why.
    pub exits: BTreeMap<&'static str, u64>,
    /// Virtual time the run took.
    pub took: Duration,
    /// Messages a lossy link made late (a datagram of theirs sent again).
    pub late_on_lossy: u64,
    /// Connections a lossy link idled out (sent again past the detection budget).
    pub idled_out: u64,
    /// Every event and every report of a machine, in order, where the run was traced
    /// ([`super::trace_membership_seed`]).
    pub trace: Vec<String>,
}

/// How long a step's computation takes ([`MemberAction::Compute`]).
const STEP_TIME: Duration = Duration::from_millis(150);

/// How long a preempted or drained worker has to leave before it is killed.
const GRACE: Duration = Duration::from_secs(10);
/// How long a dial to a peer that cannot be reached takes to fail.
const DIAL_FAILS_AFTER: Duration = Duration::from_millis(50);
/// The first probe timeout after a lost datagram on a lossy link (a LAN's round trip plus
/// QUIC's timer granularity and ack delay); each one after doubles it.
const PROBE_TIMEOUT_FIRST: Duration = Duration::from_millis(30);
/// The seed stream of lost datagrams (`World::retransmitted`).
const LOSS_DRAWS: u64 = 0x6c6f_7374;
/// Bound on events in one run (a livelock is a violation, not a hang).
const EVENTS_MAX: u64 = 500_000;
/// The supervisor's budget, the launcher's (`cohort launch`): past this many failed
/// processes of one worker within [`RESTART_WINDOW`] it gives up.
const RESTARTS_MAX: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug)]
enum Event {
    Start {
        worker: usize,
    },
    Deliver {
        to: usize,
        life: u64,
        from: usize,
        message: Wire,
    },
    Undelivered {
        to: usize,
        life: u64,
        peer: usize,
        message: Wire,
    },
    Timer {
        worker: usize,
        life: u64,
    },
    /// `worker`'s process `life` computed the step of collective `seq` of the group of
    /// `generation`.
    Computed {
        worker: usize,
        life: u64,
        generation: u64,
        seq: u64,
    },
    /// `worker`'s process `life` loses its connection with `peer`'s process `peer_life`.
    LinkLost {
        worker: usize,
        life: u64,
        peer: usize,
        peer_life: u64,
    },
    Fault(MembershipFaultKind),
    Resume {
        worker: usize,
        life: u64,
    },
    KillIfStill {
        worker: usize,
        life: u64,
    },
    Heal {
        cut: u64,
    },
    Fast {
        worker: usize,
    },
}

/// What the simulated network carries: the machines' membership messages, and the pieces of
/// their groups' collectives ([`Rounds`]).
#[derive(Debug)]
enum Wire {
    Member(MemberMessage),
    Round(RoundMessage),
}

/// Whether a process runs, and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    /// Running (or paused).
    No,
    /// Gone; its supervisor starts it again.
    Restarting,
    /// Scaled down: started again only when added back.
    Drained,
    /// It finished the job.
    Finished,
}

struct Proc {
    node: NodeId,
    addr: SocketAddr,
    machine: Option<MemberMachine>,
    /// Its machine's collectives (a new process's start empty).
    rounds: Rounds,
    /// Which process of this worker runs (each start is a new one).
    life: u64,
    down: Down,
    paused_until: Option<Duration>,
    /// Events that reached it while paused, in order.
    deferred: Vec<Event>,
    /// Extra delay of its outgoing messages (a slow link), until it heals.
    slow: Duration,
    /// Its links' datagram loss, in percent, and until when ([`MembershipFaultKind::Lossy`]).
    lossy: Option<(u32, Duration)>,
    /// Whether it was told to leave for good (a drain): not started again when killed.
    draining: bool,
    /// Whether it was drained for good (a drain that is not undone): never started again, and,
    /// once its process is gone, not listed to the processes started from then on (the
    /// launcher's specs leave it out once it exited).
    drained_for_good: bool,
    /// When its processes exited with a failure, within the supervisor's window.
    failures: Vec<Duration>,
    timer_at: Option<Duration>,
}

pub(super) struct World {
    config: MembershipConfig,
    scenario: MembershipScenario,
    base: Instant,
    now: Duration,
    rng: ChaCha8Rng,
    /// The draws of lost datagrams: a stream of its own, consulted only on a lossy link.
    loss_rng: ChaCha8Rng,
    procs: Vec<Proc>,
    queue: BTreeMap<(Duration, u64), Event>,
    seq: u64,
    /// Cut paths (unordered pairs), by cut id.
    cuts: BTreeMap<u64, (BTreeSet<(usize, usize)>, Duration)>,
    checks: Checks,
    report: MembershipReport,
    /// When the first process finished (the run ends a little after).
    finished_at: Option<Duration>,
    /// Whether each event and machine report goes into the report's trace.
    tracing: bool,
}

impl World {
    pub(super) fn new(config: &MembershipConfig, scenario: &MembershipScenario) -> Self {
        let procs = (0..scenario.workers)
            .map(|i| Proc {
                node: NodeId::new("worker", i as u32),
                addr: SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000)),
                machine: None,
                rounds: Rounds::default(),
                life: 0,
                down: Down::Restarting,
                paused_until: None,
                deferred: Vec::new(),
                slow: Duration::ZERO,
                lossy: None,
                draining: false,
                drained_for_good: false,
                failures: Vec::new(),
                timer_at: None,
            })
            .collect();
        let mut world = Self {
            config: config.clone(),
            scenario: scenario.clone(),
            base: Instant::now(),
            now: Duration::ZERO,
            rng: ChaCha8Rng::seed_from_u64(scenario.seed),
            loss_rng: ChaCha8Rng::seed_from_u64(scenario.seed ^ LOSS_DRAWS),
            procs,
            queue: BTreeMap::new(),
            seq: 0,
            cuts: BTreeMap::new(),
            checks: Checks::default(),
            report: MembershipReport::default(),
            finished_at: None,
            tracing: false,
        };
        for worker in 0..scenario.workers {
            // Processes start a little apart, as pods do.
            let at = Duration::from_millis(world.rng.gen_range(0..1_500));
            world.schedule(at, Event::Start { worker });
        }
        for fault in &scenario.faults {
            world.schedule(fault.at, Event::Fault(fault.kind.clone()));
        }
        world
    }

    /// The same world, recording every event and machine report in the report's trace.
    pub(super) fn traced(mut self) -> Self {
        self.tracing = true;
        self
    }

    fn schedule(&mut self, at: Duration, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    pub(super) fn run(mut self) -> MembershipReport {
        let deadline =
            self.scenario.faults_end().max(self.config.fault_window) + self.config.liveness_bound;
        while let Some(((at, _), event)) = self.queue.pop_first() {
            if at > deadline {
                self.now = deadline;
                break;
            }
            self.now = at;
            self.report.events += 1;
            if self.report.events > EVENTS_MAX {
                self.report.violation = Some(MembershipViolation {
                    invariant: "LIVENESS",
                    detail: format!("more than {EVENTS_MAX} events: a livelock"),
                    at: self.now,
                });
                break;
            }
            self.handle(event);
            if let Some(v) = self.checks.take_violation() {
                self.report.violation = Some(v);
                break;
            }
            if self.report.violation.is_some() {
                break;
            }
            // The others of the finishing group end within a moment of the first.
            if self
                .finished_at
                .is_some_and(|t| self.now > t + Duration::from_secs(5))
            {
                break;
            }
        }
        self.report.took = self.now;
        self.report.finished = self.finished_at.is_some();
        if self.report.violation.is_none() {
            if let Some(v) = self.checks.at_end(self.now) {
                self.report.violation = Some(v);
            } else if !self.report.finished {
                let states: Vec<String> = self
                    .procs
                    .iter()
                    .map(|p| match &p.machine {
                        Some(m) => format!(
                            "{} {} at generation {}, step {}",
                            p.node,
                            m.phase_name(),
                            m.generation(),
                            m.state().0
                        ),
                        None => format!("{} down ({:?})", p.node, p.down),
                    })
                    .collect();
                self.report.violation = Some(MembershipViolation {
                    invariant: "LIVENESS",
                    detail: format!(
                        "the job did not finish within {:?} of the last fault: {}",
                        self.config.liveness_bound,
                        states.join("; ")
                    ),
                    at: self.now,
                });
            }
        }
        self.report
    }

    fn running(&self, worker: usize) -> bool {
        let p = &self.procs[worker];
        p.down == Down::No && p.machine.is_some()
    }

    fn handle(&mut self, event: Event) {
        if self.tracing {
            self.report.trace.push(format!("{:>12.6?} {event:?}", self.now));
        }
        // A paused process takes nothing until it resumes.
        if let Some(worker) = Self::target(&event) {
            let p = &mut self.procs[worker];
            if p.paused_until.is_some() && !matches!(event, Event::Resume { .. }) {
                p.deferred.push(event);
                return;
            }
        }
        match event {
            Event::Start { worker } => self.start(worker),
            Event::Deliver {
                to,
                life,
                from,
                message: Wire::Round(message),
            } => self.deliver_round(to, life, from, message),
            Event::Deliver {
                to,
                life,
                from,
                message: Wire::Member(message),
            } => {
                let live_before = self.procs[to].machine.as_ref().and_then(|m| m.live_group());
                let enter_from = match &message {
                    MemberMessage::Enter { incarnation, .. } => Some(*incarnation),
                    _ => None,
                };
                self.with_machine(to, life, |m, now| {
                    let from = NodeId::new("worker", from as u32);
                    m.handle_message(now, &from, message);
                });
                if let (Some(generation), Some(incarnation)) = (live_before, enter_from) {
                    self.check_restart_taken(to, from, generation, incarnation);
                }
            }
            Event::Undelivered {
                to,
                life,
                peer,
                message,
            } => self.with_machine(to, life, |m, now| match message {
                Wire::Member(message) => {
                    let peer = NodeId::new("worker", peer as u32);
                    m.handle_undelivered(now, &peer, &message);
                }
                // A piece that could not be delivered: the link's loss or the operation
                // timeout ends its round.
                Wire::Round(_) => m.handle_timeout(now),
            }),
            Event::Computed {
                worker,
                life,
                generation,
                seq,
            } => self.with_machine(worker, life, |m, now| {
                m.handle_computed(now, generation, seq)
            }),
            Event::Timer { worker, life } => {
                if self.procs[worker].life == life {
                    self.procs[worker].timer_at = None;
                }
                self.with_machine(worker, life, |m, now| m.handle_timeout(now));
            }
            Event::LinkLost {
                worker,
                life,
                peer,
                peer_life,
            } => self.with_machine(worker, life, |m, now| {
                let process = Self::incarnation(peer, peer_life);
                let peer = NodeId::new("worker", peer as u32);
                m.handle_link_lost(now, &peer, process);
            }),
            Event::Fault(fault) => self.inject(fault),
            Event::Resume { worker, life } => self.resume(worker, life),
            Event::KillIfStill { worker, life } => {
                if self.procs[worker].life == life && self.running(worker) {
                    let draining = self.procs[worker].draining;
                    self.kill(worker, !draining);
                    if draining {
                        self.procs[worker].down = Down::Drained;
                    }
                }
            }
            Event::Heal { cut } => {
                self.cuts.remove(&cut);
            }
            Event::Fast { worker } => self.procs[worker].slow = Duration::ZERO,
        }
    }

    /// A piece of a collective (or its refusal) from `from` reaches `to`'s process `life`.
    fn deliver_round(&mut self, to: usize, life: u64, from: usize, message: RoundMessage) {
        if self.procs[to].life != life || !self.running(to) {
            return;
        }
        let Some(current) = self.procs[to].machine.as_ref().map(|m| m.group_generation()) else {
            return;
        };
        if self.procs[to].machine.as_ref().is_some_and(MemberMachine::ended) {
            return;
        }
        let from_node = NodeId::new("worker", from as u32);
        match message {
            RoundMessage::Piece {
                generation,
                seq,
                piece,
                process,
            } => match self.procs[to].rounds.received(
                current,
                (from_node, process),
                generation,
                seq,
                piece,
            ) {
                Received::Refuse => {
                    let refused = RoundMessage::Refused { generation };
                    self.send(to, from, Wire::Round(refused));
                    self.with_machine(to, life, |m, now| m.handle_timeout(now));
                }
                Received::Kept => self.with_machine(to, life, |m, now| m.handle_timeout(now)),
                Received::Done((generation, seq, pieces)) => {
                    self.with_machine(to, life, |m, now| {
                        m.handle_round_done(now, generation, seq, pieces)
                    })
                }
            },
            RoundMessage::Refused { generation } => self.with_machine(to, life, |m, now| {
                m.handle_round_refused(now, generation, &from_node)
            }),
        }
    }

    /// `to`'s live group of `generation` took an `Enter` of `from`'s process `incarnation`: if the
    /// group broke on it while that very process runs as a member of the same group, a late
    /// ask (sent before it formed the group) was taken for a new process (RESTART).
    fn check_restart_taken(
        &mut self,
        to: usize,
        from: usize,
        generation: u64,
        incarnation: Incarnation,
    ) {
        let broke = self.procs[to]
            .machine
            .as_ref()
            .is_some_and(|m| m.live_group().is_none());
        let sender = &self.procs[from];
        let same_process =
            self.running(from) && incarnation == Self::incarnation(from, sender.life);
        let member = sender
            .machine
            .as_ref()
            .is_some_and(|m| m.live_group() == Some(generation));
        if broke && same_process && member {
            self.report.violation.get_or_insert(MembershipViolation {
                invariant: "RESTART",
                detail: format!(
                    "worker/{to}'s group of generation {generation} broke on a late ask to enter from \
                     worker/{from}'s process {incarnation}, a live member of that group, taken \
                     for a new process"
                ),
                at: self.now,
            });
        }
    }

    /// The incarnation of `worker`'s process `life`.
    fn incarnation(worker: usize, life: u64) -> Incarnation {
        Incarnation::from_raw(((worker as u64) << 32) | life)
    }

    /// The worker an event is for, where a pause holds it back.
    fn target(event: &Event) -> Option<usize> {
        match event {
            Event::Deliver { to, .. } | Event::Undelivered { to, .. } => Some(*to),
            Event::Timer { worker, .. }
            | Event::Computed { worker, .. }
            | Event::LinkLost { worker, .. } => Some(*worker),
            _ => None,
        }
    }

    /// Runs `f` on the machine of `worker` if its process `life` still runs, then carries
    /// out what it asks.
    fn with_machine(
        &mut self,
        worker: usize,
        life: u64,
        f: impl FnOnce(&mut MemberMachine, Instant),
    ) {
        if self.procs[worker].life != life || !self.running(worker) {
            return;
        }
        let now = self.instant();
        if let Some(m) = self.procs[worker].machine.as_mut() {
            f(m, now);
        }
        self.after_step(worker);
    }

    fn start(&mut self, worker: usize) {
        // A process of it runs already (its supervisor started it), or the job is over.
        if self.finished_at.is_some()
            || self.procs[worker].drained_for_good
            || matches!(self.procs[worker].down, Down::No | Down::Finished)
        {
            return;
        }
        // The job's workers now, as the launcher's spec names them: not those drained for good
        // whose process is gone.
        let workers: Vec<GroupMember> = self
            .procs
            .iter()
            .filter(|p| !(p.drained_for_good && p.down != Down::No))
            .map(|p| GroupMember {
                node: p.node.clone(),
                addr: p.addr,
            })
            .collect();
        let p = &mut self.procs[worker];
        p.life += 1;
        p.rounds = Rounds::default();
        p.down = Down::No;
        p.paused_until = None;
        p.deferred.clear();
        p.timer_at = None;
        p.draining = false;
        let incarnation = Self::incarnation(worker, p.life);
        let me = GroupMember {
            node: p.node.clone(),
            addr: p.addr,
        };
        let mut machine = MemberMachine::new(me, incarnation, workers, MemberSettings::shortened(self.config.steps));
        machine.handle_start(self.base + self.now);
        p.machine = Some(machine);
        self.checks.started(worker, p.life);
        self.after_step(worker);
    }

    /// Carries out what `worker`'s machine asks, checks the invariants, and sets its timer.
    fn after_step(&mut self, worker: usize) {
        while let Some(action) = self.procs[worker]
            .machine
            .as_mut()
            .and_then(MemberMachine::poll_action)
        {
            self.carry_out(worker, action);
        }
        let life = self.procs[worker].life;
        if let Some(m) = &self.procs[worker].machine {
            self.checks.observe(worker, life, m, self.now);
            if let Some(due) = m.poll_timeout() {
                let at = due.saturating_duration_since(self.base).max(self.now);
                let p = &self.procs[worker];
                if p.timer_at.is_none_or(|t| at < t || t < self.now) {
                    self.procs[worker].timer_at = Some(at);
                    self.schedule(at, Event::Timer { worker, life });
                }
            }
        }
    }

    fn carry_out(&mut self, worker: usize, action: MemberAction) {
        let life = self.procs[worker].life;
        let reports = !matches!(
            action,
            MemberAction::Send { .. } | MemberAction::RunRound { .. } | MemberAction::Compute { .. }
        );
        if self.tracing && reports {
            let line = format!("{:>12.6?}   worker/{worker} ({life}): {action:?}", self.now);
            self.report.trace.push(line);
        }
        match action {
            MemberAction::Send { to, message } => {
                let to = to.index as usize;
                self.send(worker, to, Wire::Member(message));
            }
            MemberAction::Compute {
                generation, seq, ..
            } => {
                let computed = Event::Computed {
                    worker,
                    life,
                    generation,
                    seq,
                };
                self.schedule(self.now + STEP_TIME, computed)
            }
            MemberAction::RunRound {
                generation,
                seq,
                piece,
                to,
                from,
            } => self.run_round(worker, generation, seq, piece, to, from),
            MemberAction::Formed { .. } => self.report.groups_formed += 1,
            MemberAction::Applied {
                generation,
                members,
                step,
                parent,
                digest,
            } => self.checks.applied(
                worker, life, generation, members, step, parent, digest, self.now,
            ),
            MemberAction::Adopted { step, digest, .. } => {
                self.checks.adopted(worker, life, step, digest, self.now)
            }
            MemberAction::Finished { step, digest } => {
                self.checks.finished(worker, step, digest, self.now);
                self.finished_at.get_or_insert(self.now);
                let p = &mut self.procs[worker];
                p.down = Down::Finished;
                p.machine = None;
                self.lost_by_peers(worker);
            }
            MemberAction::Exit(why) => {
                let name = match &why {
                    MemberExit::Left(Leave::Preempted) => "left (preempted)",
                    MemberExit::Left(Leave::Drained) => "left (drained)",
                    MemberExit::LeftOut => "left out",
                    MemberExit::RecoveryFailed { no_quorum: true } => "no quorum",
                    MemberExit::RecoveryFailed { no_quorum: false } => "re-forming failed",
                    MemberExit::EntryFailed => "entry failed",
                    MemberExit::NoStateHolder => "no state holder",
                };
                *self.report.exits.entry(name).or_default() += 1;
                if !matches!(why, MemberExit::Left(_)) && self.supervisor_gives_up(worker, name) {
                    return;
                }
                let drained = why == MemberExit::Left(Leave::Drained);
                self.kill(worker, !drained);
                if drained {
                    self.procs[worker].down = Down::Drained;
                }
            }
        }
    }

    /// Carries out `worker`'s round ([`MemberAction::RunRound`]): its piece to the others,
    /// and the round's end where every awaited piece came already.
    fn run_round(
        &mut self,
        worker: usize,
        generation: u64,
        seq: u64,
        piece: Option<crate::collective::Piece>,
        to: Vec<NodeId>,
        from: Vec<(NodeId, Option<Incarnation>)>,
    ) {
        let process = Self::incarnation(worker, self.procs[worker].life);
        if let Some(piece) = &piece {
            for peer in to {
                let message = RoundMessage::Piece {
                    generation,
                    seq,
                    piece: piece.clone(),
                    process,
                };
                self.send(worker, peer.index as usize, Wire::Round(message));
            }
        }
        let p = &mut self.procs[worker];
        let me = (&p.node, process);
        if let Some((generation, seq, pieces)) = p.rounds.run(me, generation, seq, piece, from) {
            let now = self.instant();
            if let Some(m) = self.procs[worker].machine.as_mut() {
                m.handle_round_done(now, generation, seq, pieces);
            }
        }
    }

    /// Whether the path between `a` and `b` is cut now; if so, when it heals.
    fn cut_until(&self, a: usize, b: usize) -> Option<Duration> {
        let pair = (a.min(b), a.max(b));
        self.cuts
            .values()
            .filter(|(pairs, _)| pairs.contains(&pair))
            .map(|(_, until)| *until)
            .max()
    }

    fn send(&mut self, from: usize, to: usize, message: Wire) {
        let detection = MemberSettings::shortened(self.config.steps).detection;
        if to >= self.procs.len() || !self.running(to) {
            return self.dial_failed(from, to, message);
        }
        let delay = Duration::from_micros(self.rng.gen_range(200..8_000)) + self.procs[from].slow;
        let mut at = self.now + delay;
        if let Some(heals) = self.cut_until(from, to) {
            // A connection outlives a cut shorter than the detection budget (its packets are
            // sent again); a longer one fails the dial.
            if heals > self.now + detection {
                return self.dial_failed(from, to, message);
            }
            at = heals + delay;
        }
        match self.retransmitted(from, to) {
            Some(extra) if extra > detection => return self.connection_idled_out(from, to, message),
            Some(extra) => at += extra,
            None => {}
        }
        let life = self.procs[to].life;
        self.schedule(
            at,
            Event::Deliver {
                to,
                life,
                from,
                message,
            },
        );
    }

    /// The datagram loss on the path between `a` and `b` now, in percent: the worse of their
    /// lossy links'.
    fn loss_percent(&self, a: usize, b: usize) -> u32 {
        [a, b]
            .iter()
            .filter_map(|&w| self.procs[w].lossy)
            .filter(|(_, until)| *until > self.now)
            .map(|(percent, _)| percent)
            .max()
            .unwrap_or(0)
    }

    /// What a message from `from` to `to` loses to datagrams sent again on a lossy path: the
    /// probe timeouts it waited, each twice the one before (as QUIC backs off); `None` on a
    /// path that loses nothing.
    fn retransmitted(&mut self, from: usize, to: usize) -> Option<Duration> {
        let percent = self.loss_percent(from, to);
        if percent == 0 {
            return None;
        }
        let detection = MemberSettings::shortened(self.config.steps).detection;
        let (mut extra, mut timeout) = (Duration::ZERO, PROBE_TIMEOUT_FIRST);
        while extra <= detection && self.loss_rng.gen_ratio(percent, 100) {
            extra += timeout;
            timeout *= 2;
        }
        if extra > detection {
            self.report.idled_out += 1;
        } else if !extra.is_zero() {
            self.report.late_on_lossy += 1;
        }
        Some(extra)
    }

    /// The connection between `from` and `to` idled out on a lossy path while carrying
    /// `message`: it is not delivered, and both ends lose their link after the detection budget.
    fn connection_idled_out(&mut self, from: usize, to: usize, message: Wire) {
        let detection = MemberSettings::shortened(self.config.steps).detection;
        for (x, y) in [(from, to), (to, from)] {
            if self.running(x) {
                self.loses_link_later(x, y);
            }
        }
        self.schedule(
            self.now + detection,
            Event::Undelivered {
                to: from,
                life: self.procs[from].life,
                peer: to,
                message,
            },
        );
    }

    /// `from`'s dial of `to` for `message` fails a moment from now (nothing listens there, or
    /// the path is cut).
    fn dial_failed(&mut self, from: usize, to: usize, message: Wire) {
        let life = self.procs[from].life;
        self.schedule(
            self.now + DIAL_FAILS_AFTER,
            Event::Undelivered {
                to: from,
                life,
                peer: to,
                message,
            },
        );
    }

    /// The peers of `worker` lose their link with it after the detection budget.
    fn lost_by_peers(&mut self, worker: usize) {
        for peer in 0..self.procs.len() {
            if peer != worker && self.running(peer) {
                self.loses_link_later(peer, worker);
            }
        }
    }

    /// `worker`'s process of now loses its connection with `peer`'s process of now after the
    /// detection budget (a connection is between two processes: `LinkLost` names both).
    fn loses_link_later(&mut self, worker: usize, peer: usize) {
        let detection = MemberSettings::shortened(self.config.steps).detection;
        let (life, peer_life) = (self.procs[worker].life, self.procs[peer].life);
        self.schedule(
            self.now + detection,
            Event::LinkLost {
                worker,
                life,
                peer,
                peer_life,
            },
        );
    }

    /// The process of `worker` dies; its supervisor starts it again (`restart`) after a
    /// moment.
    /// A process of `worker` exited with a failure (`why`): whether its supervisor gives up,
    /// as the launcher does past [`RESTARTS_MAX`] failures within [`RESTART_WINDOW`] (the job
    /// then ends with exit 1: a violation, since no fault ends a job so).
    fn supervisor_gives_up(&mut self, worker: usize, why: &str) -> bool {
        let now = self.now;
        let failures = &mut self.procs[worker].failures;
        failures.retain(|t| now.saturating_sub(*t) < RESTART_WINDOW);
        failures.push(now);
        if failures.len() <= RESTARTS_MAX {
            return false;
        }
        let p = &mut self.procs[worker];
        p.machine = None;
        p.down = Down::Drained;
        self.report.violation.get_or_insert(MembershipViolation {
            invariant: "RESTARTS",
            detail: format!(
                "{} failed {} times within {RESTART_WINDOW:?} (the last: {why}): its supervisor \
                 gives up, as the launcher does, and the job ends",
                p.node,
                RESTARTS_MAX + 1
            ),
            at: now,
        });
        true
    }

    fn kill(&mut self, worker: usize, restart: bool) {
        let p = &mut self.procs[worker];
        if p.down != Down::No {
            return;
        }
        p.machine = None;
        p.paused_until = None;
        p.deferred.clear();
        p.down = Down::Restarting;
        self.checks.stopped(worker);
        self.lost_by_peers(worker);
        if restart {
            let after = Duration::from_millis(self.rng.gen_range(300..2_500));
            self.schedule(self.now + after, Event::Start { worker });
        }
    }

    fn resume(&mut self, worker: usize, life: u64) {
        let p = &mut self.procs[worker];
        if p.life != life || p.paused_until.is_none() {
            return;
        }
        p.paused_until = None;
        let deferred = std::mem::take(&mut p.deferred);
        for event in deferred {
            self.handle(event);
        }
        // Whatever came due while it was stopped happens now.
        self.with_machine(worker, life, |m, now| m.handle_timeout(now));
    }

    fn inject(&mut self, fault: MembershipFaultKind) {
        let detection = MemberSettings::shortened(self.config.steps).detection;
        match fault {
            MembershipFaultKind::Kill {
                worker,
                restart_after,
            } => {
                if self.running(worker) {
                    self.kill(worker, false);
                    self.schedule(self.now + restart_after, Event::Start { worker });
                }
            }
            MembershipFaultKind::Pause { worker, lasting } => {
                if !self.running(worker) || self.procs[worker].paused_until.is_some() {
                    return;
                }
                let life = self.procs[worker].life;
                self.procs[worker].paused_until = Some(self.now);
                self.schedule(self.now + lasting, Event::Resume { worker, life });
                if lasting > detection {
                    // Silent past the budget: both ends lose the link.
                    self.lost_by_peers(worker);
                    for peer in 0..self.procs.len() {
                        if peer != worker {
                            self.loses_link_later(worker, peer);
                        }
                    }
                }
            }
            MembershipFaultKind::Preempt { worker } => self.notice(worker, Leave::Preempted),
            MembershipFaultKind::Drain {
                worker,
                add_after,
                for_good,
            } => {
                if self.running(worker) {
                    self.notice(worker, Leave::Drained);
                    // The launcher never scales below one worker.
                    let others = (0..self.procs.len())
                        .filter(|&w| w != worker && !self.procs[w].drained_for_good)
                        .count();
                    if for_good && others > 0 {
                        self.procs[worker].drained_for_good = true;
                    } else {
                        // Scaled back up later: a new process of it is added.
                        self.schedule(self.now + GRACE + add_after, Event::Start { worker });
                    }
                }
            }
            MembershipFaultKind::Cut { a, b, lasting } => {
                self.cut([(a, b)].into_iter().collect(), lasting)
            }
            MembershipFaultKind::Split { side, lasting } => {
                let n = self.procs.len();
                let pairs = side
                    .iter()
                    .flat_map(|&a| (0..n).filter(|b| !side.contains(b)).map(move |b| (a, b)))
                    .collect();
                self.cut(pairs, lasting)
            }
            MembershipFaultKind::Slow {
                worker,
                extra,
                lasting,
            } => {
                self.procs[worker].slow = extra;
                self.schedule(self.now + lasting, Event::Fast { worker });
            }
            MembershipFaultKind::Lossy {
                worker,
                percent,
                lasting,
            } => self.procs[worker].lossy = Some((percent, self.now + lasting)),
        }
    }

    fn notice(&mut self, worker: usize, leave: Leave) {
        if !self.running(worker) {
            return;
        }
        let life = self.procs[worker].life;
        self.procs[worker].draining = leave == Leave::Drained;
        self.with_machine(worker, life, |m, now| m.handle_notice(now, leave));
        self.schedule(self.now + GRACE, Event::KillIfStill { worker, life });
    }

    /// Cuts the paths of `pairs` for `lasting`; ends of a path cut past the detection budget
    /// lose their link.
    fn cut(&mut self, pairs: BTreeSet<(usize, usize)>, lasting: Duration) {
        let detection = MemberSettings::shortened(self.config.steps).detection;
        let pairs: BTreeSet<(usize, usize)> = pairs
            .into_iter()
            .filter(|(a, b)| a != b)
            .map(|(a, b)| (a.min(b), a.max(b)))
            .collect();
        if pairs.is_empty() {
            return;
        }
        self.seq += 1;
        let id = self.seq;
        self.schedule(self.now + lasting, Event::Heal { cut: id });
        if lasting > detection {
            for &(a, b) in &pairs {
                for (x, y) in [(a, b), (b, a)] {
                    self.loses_link_later(x, y);
                }
            }
        }
        self.cuts.insert(id, (pairs, self.now + lasting));
    }
}
