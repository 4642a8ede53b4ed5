//! The member machine: the whole membership life of one worker process of a
//! MultiWorkerMirrored job, as events in and actions out. It enters the job (forms the first
//! generation with the others, or waits to be admitted to their live group), forms each generation (one
//! link per pair: the larger node id joins, the other takes its join and asks whether it still
//! forms the generation), trains in a formed group (a vote at every step boundary: notices to
//! leave and the leader's joiners; the all-reduce of every step; the state handed over from
//! the member with the most steps), admits joiners (the leader tells each its admission, then
//! every member whether all acked), lets members with a notice leave by agreement, and
//! re-forms after a loss (probes, the quorum rule, the next generation with the survivors). Every
//! decision of what a mesh knows alone is the [`Membership`]'s; this machine sequences them.
//!
//! Pure: no runtime, network or clock. Time is passed in (`now`), messages come in through
//! [`MemberMachine::handle_message`] and go out as [`MemberAction::Send`]; a message that
//! could not be delivered (no process listens there, or the path is cut) comes back through
//! [`MemberMachine::handle_undelivered`]; a link whose connection died (silent past the
//! detection budget) through [`MemberMachine::handle_link_lost`]. The membership simulator
//! (`sim::membership`) runs many of them over its network under faults and checks the
//! issue's invariants after every event. The step's all-reduce is modelled by one number per
//! member and step (its contribution) and the model by a digest, so that a simulated job
//! shows whether every member applied every step once and holds the same model.

use core::net::SocketAddr;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::super::{DIAL_RETRY, PENDING_FRESH, STILL_FORMING_EVERY};
use super::boundary::{self, BoundaryChange, TellRound};
use super::entry::{
    self, AfterFailedStart, EnterAfter, EnterPoll, EnterRound, EntryStep, JoinPoll, JoinWait,
};
use super::linking::{self, StillHeard};
use super::reforming::{self, AfterAttempt, Attempt, ProbeReply, ProbeRound, Probes, Verdict};
use super::{
    EnterAnswer, GroupView, JoinAnswer, JoinContext, Leave, Membership, ProbeAnswerHere,
    StillFormingHere,
};
use crate::collective::{GroupMember, Joiner};
use crate::process::Incarnation;

/// The bounds a member machine works within (production takes them from the job's
/// configuration; the simulator from its scenario).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberSettings {
    /// How long forming a generation waits for every member.
    pub(crate) form_timeout: Duration,
    /// How long a survivor waits for the answers to its probes.
    pub(crate) probe_timeout: Duration,
    /// The transport's detection budget (its idle timeout): a peer unreachable for twice
    /// this while re-forming is taken for lost.
    pub(crate) detection: Duration,
    /// How long a collective waits for a peer's message.
    pub(crate) op_timeout: Duration,
    /// How long a starting process waits for the others' answers to its ask to enter.
    pub(crate) enter_timeout: Duration,
    /// How long a joiner waits to be admitted.
    pub(crate) join_timeout: Duration,
    /// Re-forming attempts before the process gives up (and its supervisor restarts it).
    pub(crate) recover_attempts: usize,
    /// The steps the job trains.
    pub(crate) steps: u64,
    /// How long a step's computation takes before its contribution goes out.
    pub(crate) step_time: Duration,
}

/// A message between member machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberMessage {
    /// A starting (or waiting) process asks to be admitted; `addr`: where it listens.
    Enter {
        addr: SocketAddr,
        incarnation: Incarnation,
    },
    /// The answer to `Enter`: the answerer's latest generation, whether a group lives there, and
    /// the latest generation whose group it was a member of.
    Entered {
        generation: u64,
        formed: bool,
        member_of: u64,
    },
    /// A dialer joins `generation`, formed with `members` (rank order).
    Join {
        generation: u64,
        members: Vec<NodeId>,
        by_admission: bool,
        incarnation: Incarnation,
    },
    /// The join was taken: the link of `generation` is up, with this process of the acceptor.
    Joined {
        generation: u64,
        incarnation: Incarnation,
    },
    /// The join of `generation` was refused; `current`: the acceptor's latest generation.
    JoinRefused { generation: u64, current: u64 },
    /// Whether the receiver still forms `generation` with `members`.
    StillForming {
        generation: u64,
        members: Vec<NodeId>,
    },
    /// The answer to `StillForming`.
    StillFormingAnswer {
        generation: u64,
        answer: StillAnswer,
    },
    /// A survivor of `generation` probes a member.
    Probe { generation: u64 },
    /// The answer to `Probe`.
    ProbeAnswer { generation: u64, answer: ProbeReply },
    /// The leader admits the receiver to form `generation` with `members`.
    Admit {
        generation: u64,
        members: Vec<GroupMember>,
    },
    /// The answer to `Admit`.
    AdmitAnswer { generation: u64, taken: bool },
    /// A member's part of collective `seq` of the group of `generation`.
    Piece {
        generation: u64,
        seq: u64,
        piece: Piece,
    },
    /// A piece of `generation` reached a member whose group is of another generation (EPOCH-1).
    PieceRefused { generation: u64 },
    /// A member of `generation` saw the group fail.
    Abort { generation: u64 },
}

/// The answer to [`MemberMessage::StillForming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StillAnswer {
    /// Forms it (or will: its join may still come).
    Yes,
    /// Never will, or with other members; `current`: the answerer's latest generation.
    Refused { current: u64 },
    /// Its forming of it broke.
    Broken,
}

/// A member's part of one collective of its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// The step boundary's all-gather: the member's notice, and (the leader's) joiners.
    Vote {
        leaving: Option<Leave>,
        offer: Vec<Joiner>,
    },
    /// The leader's broadcast: whether every joiner acked its admission.
    Told(bool),
    /// The state all-gather: the member's completed steps and model digest.
    State { step: u64, digest: u64 },
    /// The member's contribution to the all-reduce of `step`.
    Contribution { step: u64, value: u64 },
}

/// What the machine asks its executor to do, or reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberAction {
    /// Send `message` to `to`.
    Send { to: NodeId, message: MemberMessage },
    /// A group of `generation` with `members` formed here.
    Formed {
        generation: u64,
        members: Vec<NodeId>,
    },
    /// Step `step` was applied in the group of `generation` with `members`: the model went from
    /// `parent` to `digest`.
    Applied {
        generation: u64,
        members: Vec<NodeId>,
        step: u64,
        parent: u64,
        digest: u64,
    },
    /// The state of the member with the most steps was installed here.
    Adopted {
        generation: u64,
        step: u64,
        digest: u64,
    },
    /// The job's last step was applied here: the process ends.
    Finished { step: u64, digest: u64 },
    /// The process exits (its supervisor may start it again).
    Exit(MemberExit),
}

/// Why a member process exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberExit {
    /// It left at a step boundary after a notice.
    Left(Leave),
    /// The others re-formed without it (it came back late).
    LeftOut,
    /// Re-forming failed every attempt (no quorum, or every forming failed).
    RecoveryFailed { no_quorum: bool },
    /// It could neither form the first generation nor be admitted.
    EntryFailed,
}

/// Why a group broke, as the machine records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Broke {
    /// A member's link died, or a new process of it asked to enter.
    MemberLost(NodeId),
    /// A peer refused a join, a piece or a question of this generation; `current`: its latest
    /// generation, where it said.
    Refused { by: NodeId, current: Option<u64> },
    /// A member saw it fail first.
    Aborted(NodeId),
    /// A peer's view of the members differs.
    ViewsDiffer(NodeId),
    /// A member formed it with this process and re-forms (this one survives).
    CutShort,
    /// A member formed it without this process: it is a new one, to be admitted.
    EndForming,
    /// Forming or a collective ran past its bound.
    Timeout,
    /// A peer stayed unreachable while re-forming.
    Unreachable(NodeId),
    /// The next generation began forming here.
    Superseded,
}

/// A group of this process (forming, formed, or broken).
#[derive(Debug, Clone)]
struct Group {
    generation: u64,
    members: Vec<GroupMember>,
    nodes: Vec<NodeId>,
    rank: usize,
    formed: bool,
    broken: Option<Broke>,
    cut_short: bool,
    links: BTreeMap<NodeId, Link>,
    /// Pieces received, by (collective, sender).
    inbox: BTreeMap<(u64, NodeId), Piece>,
    /// The next collective's number.
    seq: u64,
}

impl Group {
    fn view(&self) -> GroupView<'_> {
        GroupView {
            generation: self.generation,
            nodes: &self.nodes,
            formed: self.formed,
            broken: self.broken.is_some(),
        }
    }
}

/// One link of a forming group.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// This member joins the peer: its join goes out at `retry` (none: it is on its way).
    Dialing {
        retry: Option<Instant>,
        unreachable_since: Option<Instant>,
    },
    /// This member waits for the peer's join, asking at `next_ask` whether it still forms.
    Waiting {
        next_ask: Instant,
        answered: bool,
        silent_since: Option<Instant>,
    },
    Up,
}

/// What a forming is for: what follows it.
#[derive(Debug, Clone)]
enum Purpose {
    /// The first generation of a starting job; tried again until `until` where members waiting to
    /// be admitted refuse it.
    FreshStart { until: Instant },
    /// The generation a leader admitted this joiner to; `wait` is its wait to be admitted,
    /// which goes on where this forming fails.
    Admitted { wait: JoinWait },
    /// Re-forming with the survivors of `before`.
    Recover { before: Before, attempt: Attempt },
    /// Admitting joiners to the group's members.
    Admit,
    /// The stayers going on after members left.
    Depart { before: Before },
}

/// The members of a group that broke or changed (what recovery probes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Before {
    generation: u64,
    members: Vec<GroupMember>,
}

/// A collective in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Round {
    /// The state all-gather after a re-forming or an admission.
    State,
    /// The boundary vote.
    Vote,
    /// The leader tells the joiners (leader only, before the `Told` broadcast).
    Telling {
        generation: u64,
        joiners: Vec<Joiner>,
        members: Vec<GroupMember>,
        telling: TellRound,
    },
    /// The broadcast whether every joiner was told.
    Told {
        generation: u64,
        joiners: Vec<Joiner>,
        members: Vec<GroupMember>,
    },
    /// The step's computation (until `ready`), then its all-reduce.
    Step { ready: Instant },
}

#[derive(Debug, Clone)]
enum Phase {
    /// Not started yet.
    Idle,
    Entering {
        after: EnterAfter,
        round: EnterRound,
    },
    Joining {
        wait: JoinWait,
    },
    /// Waiting before trying the first generation again.
    StartAgain {
        at: Instant,
        until: Instant,
    },
    Forming {
        purpose: Purpose,
        deadline: Instant,
    },
    Training {
        round: Round,
        /// The collective's number and when it began (its pieces are awaited since).
        began: Instant,
        seq: u64,
        sent: bool,
    },
    Recovering {
        before: Before,
        attempt: Attempt,
        round: ProbeRound,
    },
    /// Waiting until `at` before re-forming attempt `number` (each spans the probe timeout).
    RecoverLater {
        before: Before,
        number: usize,
        at: Instant,
    },
    Ended,
}

/// A join answered "wait": held until this mesh reaches its generation (or its bound passes).
#[derive(Debug, Clone)]
struct HeldJoin {
    peer: NodeId,
    generation: u64,
    members: Vec<NodeId>,
    context: JoinContext,
    until: Instant,
}

/// One worker process's membership machine (see the module doc).
#[derive(Debug)]
pub(crate) struct MemberMachine {
    me: GroupMember,
    incarnation: Incarnation,
    /// Every worker of the job, this one among them (the first generation's members).
    workers: Vec<GroupMember>,
    settings: MemberSettings,
    membership: Membership,
    group: Option<Group>,
    phase: Phase,
    held: Vec<HeldJoin>,
    /// Completed steps and the model's digest.
    step: u64,
    digest: u64,
    /// Whether this process's state is to be agreed on before its next step.
    needs_state: bool,
    /// The re-forming whose group agrees on the state now: a failure before that ends is
    /// its next attempt (probing the same broken group), not a new recovery.
    recovery: Option<(Before, Attempt)>,
    notice: Option<Leave>,
    actions: VecDeque<MemberAction>,
}

/// The digest of a model no step was applied to.
pub(crate) const INITIAL_DIGEST: u64 = 0x5eed_0000_c0ff_ee00;

/// The model after step `step`, whose all-reduced contributions summed to `sum`.
pub(crate) fn apply_step(digest: u64, step: u64, sum: u64) -> u64 {
    let mut x = digest ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sum.rotate_left(17);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A member's contribution to step `step` (its shard's gradient, in the model).
pub(crate) fn contribution(node: &NodeId, step: u64) -> u64 {
    apply_step(u64::from(node.index), step, 1) % 1000
}

impl MemberMachine {
    /// A new process of `me`, one of `workers`.
    pub(crate) fn new(
        me: GroupMember,
        incarnation: Incarnation,
        mut workers: Vec<GroupMember>,
        settings: MemberSettings,
    ) -> Self {
        workers.sort_by(|a, b| a.node.cmp(&b.node));
        Self {
            me,
            incarnation,
            workers,
            settings,
            membership: Membership::default(),
            group: None,
            phase: Phase::Idle,
            held: Vec::new(),
            step: 0,
            digest: INITIAL_DIGEST,
            needs_state: false,
            recovery: None,
            notice: None,
            actions: VecDeque::new(),
        }
    }

    /// The latest generation formed or tried here.
    pub(crate) fn generation(&self) -> u64 {
        self.membership.generation
    }

    /// The generation of this process's latest group, if it formed and did not break: the group it
    /// trains with.
    pub(crate) fn live_group(&self) -> Option<u64> {
        self.group
            .as_ref()
            .filter(|g| g.formed && g.broken.is_none())
            .map(|g| g.generation)
    }

    /// Completed steps and the model's digest.
    pub(crate) fn state(&self) -> (u64, u64) {
        (self.step, self.digest)
    }

    /// A short name of the phase, for reports.
    pub(crate) fn phase_name(&self) -> &'static str {
        match &self.phase {
            Phase::Idle => "idle",
            Phase::Entering { .. } => "entering",
            Phase::Joining { .. } => "joining",
            Phase::StartAgain { .. } => "starting again",
            Phase::Forming { .. } => "forming",
            Phase::Training { .. } => "training",
            Phase::Recovering { .. } | Phase::RecoverLater { .. } => "recovering",
            Phase::Ended => "ended",
        }
    }

    /// The next action, if any.
    pub(crate) fn poll_action(&mut self) -> Option<MemberAction> {
        self.actions.pop_front()
    }

    /// The process starts: it asks the others whether a group lives.
    pub(crate) fn handle_start(&mut self, now: Instant) {
        let peers = self.peers().into_iter().map(|p| p.node).collect();
        self.membership.hear_from(peers);
        self.begin_entering(now, EnterAfter::First);
        self.progress(now);
    }

    /// A notice to leave at the next step boundary.
    pub(crate) fn handle_notice(&mut self, now: Instant, leave: Leave) {
        self.notice = Some(leave);
        self.progress(now);
    }

    /// Time passed: whatever is due now happens.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.progress(now);
    }

    /// The connection with `peer` died (silent past the detection budget, or closed).
    pub(crate) fn handle_link_lost(&mut self, now: Instant, peer: &NodeId) {
        if let Some(g) = &self.group {
            let linked = g.links.get(peer) == Some(&Link::Up);
            if g.nodes.contains(peer) && (g.formed || linked) {
                self.break_group(Broke::MemberLost(peer.clone()));
            }
        }
        self.progress(now);
    }

    /// `message`, sent to `to`, could not be delivered (nothing listens there, or the path
    /// is cut): a dial that failed.
    pub(crate) fn handle_undelivered(
        &mut self,
        now: Instant,
        to: &NodeId,
        message: &MemberMessage,
    ) {
        match (&mut self.phase, message) {
            (Phase::Forming { .. }, MemberMessage::Join { generation, .. }) => {
                if let Some(g) = self.group.as_mut().filter(|g| g.generation == *generation) {
                    if let Some(Link::Dialing {
                        retry,
                        unreachable_since,
                    }) = g.links.get_mut(to)
                    {
                        unreachable_since.get_or_insert(now);
                        *retry = Some(now + DIAL_RETRY);
                    }
                }
            }
            // A message's delivery fails as it is sent here: its ask began now.
            (Phase::Recovering { round, .. }, MemberMessage::Probe { .. }) => {
                round.undelivered(to, now, now);
            }
            (
                Phase::Training {
                    round: Round::Telling { telling, .. },
                    ..
                },
                MemberMessage::Admit { .. },
            ) => telling.undelivered(to, now, now),
            (Phase::Entering { round, .. }, MemberMessage::Enter { .. }) => {
                round.undelivered(now);
            }
            _ => {}
        }
        self.progress(now);
    }

    /// A message from `from`.
    ///
    /// Longer than most functions here on purpose: one arm per `MemberMessage`, each the
    /// machine's answer to it, so that what a member does with every message reads in one
    /// place.
    pub(crate) fn handle_message(&mut self, now: Instant, from: &NodeId, message: MemberMessage) {
        if matches!(self.phase, Phase::Ended) {
            return;
        }
        match message {
            MemberMessage::Enter { addr, incarnation } => {
                self.answer_enter(now, from, addr, incarnation)
            }
            MemberMessage::Entered {
                formed, member_of, ..
            } => {
                self.membership.heard_from(from, member_of);
                self.entered(now, from, formed)
            }
            MemberMessage::Join {
                generation,
                members,
                by_admission,
                incarnation,
            } => {
                let context = JoinContext {
                    incarnation,
                    by_admission,
                    later_join: false,
                    closed: false,
                };
                self.held
                    .retain(|h| !(h.peer == *from && h.generation == generation));
                self.held.push(HeldJoin {
                    peer: from.clone(),
                    generation,
                    members,
                    context,
                    until: now + self.settings.form_timeout,
                });
            }
            MemberMessage::Joined {
                generation,
                incarnation,
            } => {
                if let Some(g) = self.group.as_mut().filter(|g| g.generation == generation) {
                    if matches!(g.links.get(from), Some(Link::Dialing { .. })) {
                        g.links.insert(from.clone(), Link::Up);
                        self.membership.linked_with(from, generation, incarnation);
                    }
                }
            }
            MemberMessage::JoinRefused {
                generation,
                current,
            } => {
                if self.forming_generation() == Some(generation) {
                    let why = Broke::Refused {
                        by: from.clone(),
                        current: Some(current),
                    };
                    self.break_group(why);
                }
            }
            MemberMessage::StillForming {
                generation,
                members,
            } => {
                let answer = self.still_forming(generation, &members);
                self.send(
                    from,
                    MemberMessage::StillFormingAnswer { generation, answer },
                );
            }
            MemberMessage::StillFormingAnswer { generation, answer } => {
                self.still_forming_answered(from, generation, answer)
            }
            MemberMessage::Probe { generation } => self.answer_probe(from, generation),
            MemberMessage::ProbeAnswer { generation, answer } => {
                if let Phase::Recovering { before, round, .. } = &mut self.phase {
                    if before.generation == generation {
                        round.answered(from, answer);
                    }
                }
            }
            MemberMessage::Admit {
                generation,
                members,
            } => {
                let taken = self.membership.handle_admit(generation, members).is_ok();
                self.send(from, MemberMessage::AdmitAnswer { generation, taken });
            }
            MemberMessage::AdmitAnswer {
                generation: e,
                taken,
            } => {
                if let Phase::Training {
                    round:
                        Round::Telling {
                            generation,
                            telling,
                            ..
                        },
                    ..
                } = &mut self.phase
                {
                    if *generation == e {
                        telling.answered(from, taken);
                    }
                }
            }
            MemberMessage::Piece {
                generation,
                seq,
                piece,
            } => match self.group.as_mut().filter(|g| g.generation == generation) {
                Some(g) => {
                    g.inbox.insert((seq, from.clone()), piece);
                }
                None => self.send(from, MemberMessage::PieceRefused { generation }),
            },
            MemberMessage::PieceRefused { generation } => {
                if self
                    .group
                    .as_ref()
                    .is_some_and(|g| g.generation == generation)
                {
                    let why = Broke::Refused {
                        by: from.clone(),
                        current: None,
                    };
                    self.break_group(why);
                }
            }
            MemberMessage::Abort { generation } => {
                if self
                    .group
                    .as_ref()
                    .is_some_and(|g| g.generation == generation)
                {
                    self.break_group(Broke::Aborted(from.clone()));
                }
            }
        }
        self.progress(now);
    }

    /// The earliest moment something is due here without a message arriving.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let mut due: Vec<Instant> = self.held.iter().map(|h| h.until).collect();
        match &self.phase {
            Phase::Idle | Phase::Ended => {}
            Phase::Entering { round, .. } => due.push(round.wake_at()),
            Phase::Joining { wait } => due.push(wait.wake_at()),
            Phase::StartAgain { at, .. } => due.push(*at),
            Phase::Forming { deadline, .. } => {
                due.push(*deadline);
                if let Some(g) = &self.group {
                    for link in g.links.values() {
                        match link {
                            Link::Dialing {
                                retry: Some(at), ..
                            } => due.push(*at),
                            Link::Waiting { next_ask, .. } => due.push(*next_ask),
                            _ => {}
                        }
                    }
                }
            }
            Phase::Training {
                round, began, sent, ..
            } => {
                due.push(*began + self.settings.op_timeout);
                match round {
                    Round::Step { ready } if !sent => due.push(*ready),
                    Round::Telling { telling, .. } => due.push(telling.wake_at()),
                    _ => {}
                }
            }
            Phase::Recovering { round, .. } => due.push(round.wake_at()),
            Phase::RecoverLater { at, .. } => due.push(*at),
        }
        due.into_iter().min()
    }

    fn send(&mut self, to: &NodeId, message: MemberMessage) {
        self.actions.push_back(MemberAction::Send {
            to: to.clone(),
            message,
        });
    }

    fn exit(&mut self, why: MemberExit) {
        self.phase = Phase::Ended;
        self.group = None;
        self.held.clear();
        self.actions.push_back(MemberAction::Exit(why));
    }

    fn peers(&self) -> Vec<GroupMember> {
        self.workers
            .iter()
            .filter(|w| w.node != self.me.node)
            .cloned()
            .collect()
    }

    fn forming_generation(&self) -> Option<u64> {
        match (&self.phase, &self.group) {
            (Phase::Forming { .. }, Some(g)) => Some(g.generation),
            _ => None,
        }
    }

    // ---- Entering and joining ----

    fn begin_entering(&mut self, now: Instant, after: EnterAfter) {
        let peers = self.peers().into_iter().map(|p| p.node).collect();
        self.phase = Phase::Entering {
            after,
            round: EnterRound::new(peers, now, self.settings.enter_timeout),
        };
    }

    fn ask_enter(&mut self, peers: &[NodeId]) {
        let enter = MemberMessage::Enter {
            addr: self.me.addr,
            incarnation: self.incarnation,
        };
        for peer in peers {
            self.send(peer, enter.clone());
        }
    }

    fn entered(&mut self, now: Instant, from: &NodeId, formed: bool) {
        match &mut self.phase {
            Phase::Entering { after, round } => {
                let join = round.answered(from, formed);
                let after = *after;
                if join {
                    self.membership.joining = true;
                    let step = after.next(true, now, self.settings.join_timeout);
                    self.take_entry_step(now, step);
                }
            }
            Phase::Joining { wait } => wait.answered(from, formed),
            _ => {}
        }
    }
}

impl MemberMachine {
    fn begin_joining(&mut self, now: Instant) {
        self.membership.joining = true;
        let peers = self.workers.len() - 1;
        self.phase = Phase::Joining {
            wait: JoinWait::new(peers, now, self.settings.join_timeout),
        };
    }

    /// Joining: what [`JoinWait`] says is due (asking every peer, forming the generation an
    /// admission names, giving up).
    fn progress_joining(&mut self, now: Instant) {
        let Phase::Joining { wait } = &mut self.phase else {
            return;
        };
        match wait.poll(now, self.membership.admission.is_some()) {
            JoinPoll::NoLiveGroup | JoinPoll::TimedOut => self.not_admitted(now),
            JoinPoll::Form => {
                let wait = wait.clone();
                if let Some((generation, members)) = self.membership.admission.take() {
                    self.begin_forming(now, generation, members, Purpose::Admitted { wait });
                }
            }
            JoinPoll::Ask => {
                let peers: Vec<NodeId> = self.peers().into_iter().map(|p| p.node).collect();
                self.ask_enter(&peers);
            }
            JoinPoll::Wait => {}
        }
    }

    /// The joiner was not admitted: where no group was ever formed here, it asks whether the
    /// others start again; else it exits.
    fn not_admitted(&mut self, now: Instant) {
        self.membership.joining = false;
        self.membership.admission = None;
        // A process whose only forming was a first generation that failed is no member of any
        // group: it starts again like one that never formed.
        let never_formed = self.membership.generation == 0 || self.membership.forget_failed_start();
        match entry::after_not_admitted(never_formed) {
            Some(after) => self.begin_entering(now, after),
            None => self.exit(MemberExit::EntryFailed),
        }
    }

    fn progress_entering(&mut self, now: Instant) {
        let Phase::Entering { after, round } = &mut self.phase else {
            return;
        };
        let after = *after;
        match round.poll(now) {
            // Nobody has a live group: the job starts.
            EnterPoll::NoLiveGroup => {
                let step = after.next(false, now, self.settings.join_timeout);
                self.take_entry_step(now, step);
            }
            EnterPoll::Ask(peers) => self.ask_enter(&peers),
            EnterPoll::Wait => {}
        }
    }

    /// Carries out what [`EnterAfter::next`] decided.
    fn take_entry_step(&mut self, now: Instant, step: EntryStep) {
        match step {
            EntryStep::Join => self.begin_joining(now),
            EntryStep::FreshStart { until } => self.start_first_generation(now, until),
            EntryStep::Exit => self.exit(MemberExit::EntryFailed),
        }
    }

    fn start_first_generation(&mut self, now: Instant, until: Instant) {
        let members = self.workers.clone();
        self.begin_forming(now, 1, members, Purpose::FreshStart { until });
    }

    // ---- Answers to the others ----

    fn answer_enter(
        &mut self,
        now: Instant,
        from: &NodeId,
        addr: SocketAddr,
        incarnation: Incarnation,
    ) {
        let view = self.group.as_ref().map(Group::view);
        let answer = self
            .membership
            .handle_enter(from, addr, incarnation, view, now);
        let (generation, formed) = match answer {
            EnterAnswer::NoGroup { generation } => (generation, false),
            EnterAnswer::Stale { generation } => (generation, true),
            EnterAnswer::Pending {
                generation,
                restarted,
            } => {
                if restarted {
                    self.break_group(Broke::MemberLost(from.clone()));
                }
                (generation, true)
            }
        };
        let member_of = self.membership.formed_generation;
        self.send(
            from,
            MemberMessage::Entered {
                generation,
                formed,
                member_of,
            },
        );
    }

    /// Answers the held joins that can be answered now (this mesh reached their generation, or
    /// their bound passed).
    fn answer_held_joins(&mut self, now: Instant) {
        let held = std::mem::take(&mut self.held);
        for join in held {
            let view = self.group.as_ref().map(Group::view);
            let answer = self.membership.handle_join(
                &join.peer,
                join.generation,
                &join.members,
                view,
                join.context,
            );
            let generation = join.generation;
            match answer {
                JoinAnswer::Wait if now < join.until => self.held.push(join),
                JoinAnswer::Wait => {
                    let current = self.membership.generation;
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current,
                        },
                    );
                }
                JoinAnswer::Take => {
                    if let Some(g) = self.group.as_mut() {
                        g.links.insert(join.peer.clone(), Link::Up);
                    }
                    self.membership
                        .linked_with(&join.peer, generation, join.context.incarnation);
                    let incarnation = self.incarnation;
                    self.send(
                        &join.peer,
                        MemberMessage::Joined {
                            generation,
                            incarnation,
                        },
                    );
                }
                JoinAnswer::Refused { current, .. } => {
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current,
                        },
                    );
                }
                JoinAnswer::ViewsDiffer { .. } => {
                    self.break_group(Broke::ViewsDiffer(join.peer.clone()));
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current: generation,
                        },
                    );
                }
            }
        }
    }

    fn still_forming(&self, generation: u64, members: &[NodeId]) -> StillAnswer {
        let view = self.group.as_ref().map(Group::view);
        match self
            .membership
            .handle_still_forming(generation, members, view)
        {
            StillFormingHere::Yes => StillAnswer::Yes,
            StillFormingHere::Broken => StillAnswer::Broken,
            StillFormingHere::OtherMembers
            | StillFormingHere::NotAdmitted
            | StillFormingHere::Gone => StillAnswer::Refused {
                current: self.membership.generation,
            },
        }
    }

    fn still_forming_answered(&mut self, from: &NodeId, generation: u64, answer: StillAnswer) {
        if self.forming_generation() != Some(generation) {
            return;
        }
        let refused = |current| Broke::Refused {
            by: from.clone(),
            current,
        };
        let (heard, current) = match answer {
            StillAnswer::Yes => (StillHeard::Forms, None),
            StillAnswer::Refused { current } => (StillHeard::Refused, Some(current)),
            StillAnswer::Broken => (StillHeard::Broken, None),
        };
        if linking::ends_forming(generation, heard) {
            return self.break_group(refused(current));
        }
        if let Some(Link::Waiting {
            answered,
            silent_since,
            ..
        }) = self.group.as_mut().and_then(|g| g.links.get_mut(from))
        {
            *answered = true;
            *silent_since = None;
        }
    }

    fn answer_probe(&mut self, from: &NodeId, generation: u64) {
        let linked = self.membership.linked.contains(&(from.clone(), generation));
        let view = self.group.as_ref().map(Group::view);
        let answer = match self.membership.handle_probe(from, generation, view, linked) {
            ProbeAnswerHere::Alive => ProbeReply::Alive,
            ProbeAnswerHere::Joining => ProbeReply::Joining,
            ProbeAnswerHere::Unsettled => ProbeReply::Unsettled,
            ProbeAnswerHere::LeftOut { .. } => ProbeReply::LeftOut,
            ProbeAnswerHere::CutShort => {
                let cut = match self.group.as_mut() {
                    Some(g) if g.broken.is_none() => {
                        g.cut_short = true;
                        true
                    }
                    _ => false,
                };
                if cut {
                    self.membership.formed(generation);
                    self.break_group(Broke::CutShort);
                    ProbeReply::Alive
                } else {
                    self.no_survivor(generation)
                }
            }
            ProbeAnswerHere::EndForming => {
                self.break_group(Broke::EndForming);
                self.no_survivor(generation)
            }
        };
        self.send(from, MemberMessage::ProbeAnswer { generation, answer });
    }

    /// How this process, no survivor, answers a prober of `generation` (`Membership::no_survivor`).
    fn no_survivor(&self, generation: u64) -> ProbeReply {
        match self.membership.no_survivor(generation) {
            ProbeAnswerHere::Joining => ProbeReply::Joining,
            _ => ProbeReply::Unsettled,
        }
    }

    /// Breaks this process's latest group (once): a formed one tells the others (`Abort`).
    fn break_group(&mut self, why: Broke) {
        let Some(g) = self.group.as_mut() else {
            return;
        };
        if g.broken.is_some() {
            return;
        }
        // The first member to see a failure tells the others; a group superseded here, or
        // aborted by another member, has nothing to tell.
        let tell = g.formed && !matches!(why, Broke::Superseded | Broke::Aborted(_));
        g.broken = Some(why);
        if tell {
            let generation = g.generation;
            let others: Vec<NodeId> = g
                .nodes
                .iter()
                .filter(|n| **n != self.me.node)
                .cloned()
                .collect();
            for peer in others {
                self.send(&peer, MemberMessage::Abort { generation });
            }
        }
    }

    // ---- Forming ----

    fn begin_forming(
        &mut self,
        now: Instant,
        generation: u64,
        mut members: Vec<GroupMember>,
        purpose: Purpose,
    ) {
        members.sort_by(|a, b| a.node.cmp(&b.node));
        members.dedup_by(|a, b| a.node == b.node);
        let Some(rank) = members.iter().position(|m| m.node == self.me.node) else {
            let attempted = Before {
                generation,
                members,
            };
            return self.forming_failed(now, purpose, None, attempted);
        };
        if self.membership.begin_forming(generation).is_err() {
            let attempted = Before {
                generation,
                members,
            };
            return self.forming_failed(now, purpose, None, attempted);
        }
        if let Some(old) = &self.group {
            if old.broken.is_none() && old.formed {
                self.break_group(Broke::Superseded);
            }
        }
        let nodes: Vec<NodeId> = members.iter().map(|m| m.node.clone()).collect();
        let links = members
            .iter()
            .filter(|m| m.node != self.me.node)
            .map(|m| {
                let link = if linking::dials(&self.me.node, &m.node) {
                    Link::Dialing {
                        retry: Some(now),
                        unreachable_since: None,
                    }
                } else {
                    Link::Waiting {
                        next_ask: now + STILL_FORMING_EVERY,
                        answered: true,
                        silent_since: None,
                    }
                };
                (m.node.clone(), link)
            })
            .collect();
        self.group = Some(Group {
            generation,
            members,
            nodes,
            rank,
            formed: false,
            broken: None,
            cut_short: false,
            links,
            inbox: BTreeMap::new(),
            seq: 0,
        });
        self.phase = Phase::Forming {
            purpose,
            deadline: now + self.settings.form_timeout,
        };
    }

    /// Sends what forming owes its peers now, and ends it when every link is up, it broke,
    /// or its bound passed.
    fn progress_forming(&mut self, now: Instant) {
        let Phase::Forming { deadline, .. } = &self.phase else {
            return;
        };
        let deadline = *deadline;
        let Some(g) = self.group.as_mut() else {
            return;
        };
        if let Some(why) = g.broken.clone() {
            return self.forming_ended(now, Some(why));
        }
        if g.links.values().all(|l| *l == Link::Up) {
            g.formed = true;
            let generation = g.generation;
            self.membership.formed(generation);
            return self.forming_ended(now, None);
        }
        if now >= deadline {
            self.break_group(Broke::Timeout);
            return self.forming_ended(now, Some(Broke::Timeout));
        }
        let generation = g.generation;
        let nodes = g.nodes.clone();
        let detection = self.settings.detection;
        let lost_since =
            |since: Instant| linking::lost_while_re_forming(generation, since, now, detection);
        let by_admission = self.membership.joins_by_admission(generation);
        let mut sends = Vec::new();
        let mut lost = None;
        for (peer, link) in g.links.iter_mut() {
            match link {
                Link::Dialing {
                    retry,
                    unreachable_since,
                } => {
                    if unreachable_since.is_some_and(|since| lost_since(since).is_some()) {
                        lost = Some(peer.clone());
                    }
                    if retry.is_some_and(|at| now >= at) {
                        *retry = None;
                        sends.push((
                            peer.clone(),
                            MemberMessage::Join {
                                generation,
                                members: nodes.clone(),
                                by_admission,
                                incarnation: self.incarnation,
                            },
                        ));
                    }
                }
                Link::Waiting {
                    next_ask,
                    answered,
                    silent_since,
                } => {
                    if now >= *next_ask {
                        if !*answered {
                            let since =
                                *silent_since.get_or_insert(*next_ask - STILL_FORMING_EVERY);
                            if lost_since(since).is_some() {
                                lost = Some(peer.clone());
                            }
                        }
                        *answered = false;
                        *next_ask = now + STILL_FORMING_EVERY;
                        sends.push((
                            peer.clone(),
                            MemberMessage::StillForming {
                                generation,
                                members: nodes.clone(),
                            },
                        ));
                    }
                }
                Link::Up => {}
            }
        }
        if let Some(peer) = lost {
            self.break_group(Broke::Unreachable(peer.clone()));
            return self.forming_ended(now, Some(Broke::Unreachable(peer)));
        }
        for (peer, message) in sends {
            self.send(&peer, message);
        }
    }

    /// The forming ended: formed (`None`), or broken by `why`.
    fn forming_ended(&mut self, now: Instant, why: Option<Broke>) {
        let Phase::Forming { purpose, .. } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        let Some(g) = self.group.as_ref() else {
            return;
        };
        let (generation, nodes) = (g.generation, g.nodes.clone());
        let cut_short = g.cut_short;
        match why {
            None => {
                self.actions.push_back(MemberAction::Formed {
                    generation,
                    members: nodes,
                });
                self.formed(now, purpose);
            }
            // A member formed it with this process and re-forms: survive with it.
            Some(_) if cut_short && !matches!(purpose, Purpose::Admitted { .. }) => {
                let before = self.before_of_group();
                self.begin_recovering(now, before, 1);
            }
            Some(why) => {
                // A failed forming's group is gone (nothing holds it); another member may
                // have formed it, though (see `forming_failed`).
                let attempted = self.before_of_group();
                self.group = None;
                self.forming_failed(now, purpose, Some(why), attempted);
            }
        }
    }

    fn before_of_group(&self) -> Before {
        let g = self.group.as_ref().expect("a group to re-form from");
        Before {
            generation: g.generation,
            members: g.members.clone(),
        }
    }

    fn formed(&mut self, now: Instant, purpose: Purpose) {
        match purpose {
            Purpose::FreshStart { .. } => self.needs_state = false,
            Purpose::Admitted { .. } => {
                self.membership.joining = false;
                self.membership.admission = None;
                self.needs_state = true;
            }
            Purpose::Recover { before, attempt } => {
                self.needs_state = true;
                self.recovery = Some((before, attempt));
            }
            Purpose::Admit => self.needs_state = true,
            Purpose::Depart { .. } => self.needs_state = false,
        }
        self.begin_round(now, None);
    }

    /// The forming of `attempted` for `purpose` failed here (broken by `why`).
    fn forming_failed(
        &mut self,
        now: Instant,
        purpose: Purpose,
        why: Option<Broke>,
        attempted: Before,
    ) {
        match purpose {
            Purpose::FreshStart { until } => {
                // Members waiting to be admitted to a group that is gone (at whatever generation
                // they tried) refuse the first generation until they see that nobody has one: ask
                // again (join where a group lives after all), and try it again where nobody
                // has one. Exiting instead, this process may be restarted again and again
                // faster than the waiting member can see it (found by the membership
                // simulator: the supervisor's budget ran out, seeds 263 and 2909 of sweeps
                // of up to 3 workers).
                let refused = matches!(why, Some(Broke::Refused { .. }));
                let forget = || self.membership.forget_failed_start();
                match entry::after_failed_start(refused, now, until, forget) {
                    AfterFailedStart::RetryAt { at, until } => {
                        self.phase = Phase::StartAgain { at, until };
                    }
                    AfterFailedStart::AskAgain => {
                        self.begin_entering(now, EnterAfter::FailedStart);
                    }
                }
            }
            Purpose::Admitted { mut wait } => {
                wait.again(now);
                self.phase = Phase::Joining { wait };
            }
            Purpose::Recover { before, attempt } => self.next_attempt(now, before, attempt, false),
            // Another member may have formed the admission's generation (its links all up while
            // this member's were not): it measures its quorum on that generation's members from
            // then on, so this member must too. Measured on its old group instead, a member
            // cut off from it during the admission went on alone beside it (split brain,
            // found by the membership simulator, seed 890 of its first sweep).
            Purpose::Admit => self.begin_recovering(now, attempted, 1),
            Purpose::Depart { before } => self.begin_recovering(now, before, 1),
        }
    }
}

impl MemberMachine {
    /// Everything due at `now`, until nothing changes.
    fn progress(&mut self, now: Instant) {
        // Each pass moves the phase on at most one step; a bounded number always settles.
        for _ in 0..32 {
            let before = self.signature();
            self.answer_held_joins(now);
            match &self.phase {
                Phase::Idle | Phase::Ended => {}
                Phase::Entering { .. } => self.progress_entering(now),
                Phase::Joining { .. } => self.progress_joining(now),
                Phase::StartAgain { at, until } => {
                    if now >= *at {
                        let until = *until;
                        self.begin_entering(now, EnterAfter::StartAgain { until });
                    }
                }
                Phase::Forming { .. } => self.progress_forming(now),
                Phase::Training { .. } => self.progress_training(now),
                Phase::Recovering { .. } => self.progress_recovering(now),
                Phase::RecoverLater { at, .. } => {
                    if now >= *at {
                        if let Phase::RecoverLater { before, number, .. } =
                            std::mem::replace(&mut self.phase, Phase::Idle)
                        {
                            self.begin_recovering(now, before, number);
                        }
                    }
                }
            }
            if self.signature() == before {
                return;
            }
        }
    }

    /// What `progress` watches for change.
    fn signature(&self) -> (&'static str, u64, bool, bool, u64, usize, usize) {
        let (formed, broken, seq) = self
            .group
            .as_ref()
            .map_or((false, false, 0), |g| (g.formed, g.broken.is_some(), g.seq));
        let links_up = self
            .group
            .as_ref()
            .map_or(0, |g| g.links.values().filter(|l| **l == Link::Up).count());
        (
            self.phase_name(),
            self.membership.generation,
            formed,
            broken,
            seq,
            links_up,
            self.actions.len(),
        )
    }

    // ---- Training ----

    /// Begins the next collective of a formed group.
    fn begin_round(&mut self, now: Instant, round: Option<Round>) {
        let round = round.unwrap_or(if self.needs_state {
            Round::State
        } else {
            Round::Vote
        });
        let seq = self.group.as_ref().map_or(0, |g| g.seq);
        self.phase = Phase::Training {
            round,
            began: now,
            seq,
            sent: false,
        };
    }

    fn progress_training(&mut self, now: Instant) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        if g.broken.is_some() {
            return self.group_failed(now);
        }
        let Phase::Training {
            round,
            began,
            seq,
            sent,
        } = &self.phase
        else {
            return;
        };
        let (round, began, seq, sent) = (round.clone(), *began, *seq, *sent);
        if now >= began + self.settings.op_timeout {
            self.break_group(Broke::Timeout);
            return self.group_failed(now);
        }
        match round {
            Round::Step { ready } if now < ready => {}
            Round::Telling { .. } => self.progress_telling(now),
            _ => {
                if !sent {
                    self.send_piece(now, &round, seq);
                }
                if let Some(pieces) = self.pieces_of(&round, seq) {
                    if let Some(g) = self.group.as_mut() {
                        g.seq += 1;
                        g.inbox.retain(|(s, _), _| *s > seq);
                    }
                    self.round_done(now, round, pieces);
                }
            }
        }
    }

    /// Sends this member's piece of `round` (collective `seq`) to the others.
    fn send_piece(&mut self, now: Instant, round: &Round, seq: u64) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        let (generation, rank) = (g.generation, g.rank);
        let others: Vec<NodeId> = g
            .nodes
            .iter()
            .filter(|n| **n != self.me.node)
            .cloned()
            .collect();
        let nodes = g.nodes.clone();
        let piece = match round {
            Round::State => Some(Piece::State {
                step: self.step,
                digest: self.digest,
            }),
            Round::Vote => {
                let offer = if rank == 0 {
                    self.membership.pending_joiners(&nodes, now, PENDING_FRESH)
                } else {
                    Vec::new()
                };
                Some(Piece::Vote {
                    leaving: self.notice,
                    offer,
                })
            }
            // A broadcast from the leader: the others send nothing.
            Round::Told { .. } => None,
            Round::Step { .. } => Some(Piece::Contribution {
                step: self.step + 1,
                value: contribution(&self.me.node, self.step + 1),
            }),
            Round::Telling { .. } => None,
        };
        if let Phase::Training { sent, .. } = &mut self.phase {
            *sent = true;
        }
        let Some(piece) = piece else {
            return;
        };
        self.own_piece(seq, piece.clone());
        for peer in others {
            self.send(
                &peer,
                MemberMessage::Piece {
                    generation,
                    seq,
                    piece: piece.clone(),
                },
            );
        }
    }

    /// Keeps this member's own piece of collective `seq` beside the others'.
    fn own_piece(&mut self, seq: u64, piece: Piece) {
        let me = self.me.node.clone();
        if let Some(g) = self.group.as_mut() {
            g.inbox.insert((seq, me), piece);
        }
    }

    /// Every member's piece of `round` (collective `seq`), in rank order, once all came (a
    /// broadcast: the leader's alone).
    fn pieces_of(&self, round: &Round, seq: u64) -> Option<Vec<Piece>> {
        let g = self.group.as_ref()?;
        let from: Vec<&NodeId> = match round {
            Round::Told { .. } => vec![&g.nodes[0]],
            _ => g.nodes.iter().collect(),
        };
        from.into_iter()
            .map(|n| g.inbox.get(&(seq, n.clone())).cloned())
            .collect()
    }

    /// A collective of the group ended with every member's `pieces`.
    fn round_done(&mut self, now: Instant, round: Round, pieces: Vec<Piece>) {
        match round {
            Round::State => self.state_agreed(now, &pieces),
            Round::Vote => self.voted(now, &pieces),
            Round::Told {
                generation,
                joiners,
                members,
            } => {
                if pieces.first() == Some(&Piece::Told(true)) {
                    self.membership.admitting(&joiners);
                    self.begin_forming(now, generation, members, Purpose::Admit);
                } else {
                    // Not every joiner could be told: nobody forms that generation.
                    self.membership.skip(generation);
                    self.begin_step(now);
                }
            }
            Round::Step { .. } => self.stepped(now, &pieces),
            Round::Telling { .. } => {}
        }
    }

    fn state_agreed(&mut self, now: Instant, pieces: &[Piece]) {
        let states = pieces.iter().filter_map(|p| match p {
            Piece::State { step, digest } => Some((*step, *digest)),
            _ => None,
        });
        // The most steps; ties go to the lowest rank (the first such: pieces are in rank
        // order, this member's own among them).
        let mut source: Option<(u64, u64)> = None;
        for state in states {
            if source.is_none_or(|b| state.0 > b.0) {
                source = Some(state);
            }
        }
        if let Some(source) = source {
            (self.step, self.digest) = source;
        }
        let generation = self.group.as_ref().map_or(0, |g| g.generation);
        self.actions.push_back(MemberAction::Adopted {
            generation,
            step: self.step,
            digest: self.digest,
        });
        self.needs_state = false;
        self.recovery = None;
        self.begin_round(now, Some(Round::Vote));
    }

    fn voted(&mut self, now: Instant, pieces: &[Piece]) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        // The boundary after the last step: every member of the group reached it with the
        // same model, so each ends holding what the others hold. A member that applied the
        // last step alone (from messages it held while the others re-formed without it)
        // never gets here: it re-forms, and is left out or takes the others' state.
        if self.step >= self.settings.steps {
            self.actions.push_back(MemberAction::Finished {
                step: self.step,
                digest: self.digest,
            });
            self.phase = Phase::Ended;
            return;
        }
        // Every member's notice, and the leader's joiners, in rank order.
        let notices = pieces.iter().map(|piece| match piece {
            Piece::Vote { leaving, .. } => *leaving,
            _ => None,
        });
        let offer = match pieces.first() {
            Some(Piece::Vote { offer, .. }) => offer.clone(),
            _ => Vec::new(),
        };
        let next = self.membership.next_generation(g.generation);
        match boundary::decide(notices, !offer.is_empty()) {
            BoundaryChange::Depart(leavers) => {
                if let Some(why) = leavers.of(g.rank) {
                    return self.exit(MemberExit::Left(why));
                }
                let stayers = leavers.stayers(&g.members);
                let before = self.before_of_group();
                return self.begin_forming(now, next, stayers, Purpose::Depart { before });
            }
            BoundaryChange::Unchanged => return self.begin_step(now),
            BoundaryChange::Admit => {}
        }
        let mut members = g.members.clone();
        members.extend(offer.iter().map(|j| j.member.clone()));
        let round = if g.rank == 0 {
            self.membership.offered(&offer);
            let telling = TellRound::new(
                offer.iter().map(|j| j.member.node.clone()),
                next,
                (now, self.settings.form_timeout),
                self.settings.detection,
            );
            Round::Telling {
                generation: next,
                joiners: offer,
                members,
                telling,
            }
        } else {
            Round::Told {
                generation: next,
                joiners: offer,
                members,
            }
        };
        self.begin_round(now, Some(round));
    }

    /// The leader tells each joiner its admission, then broadcasts whether all acked.
    fn progress_telling(&mut self, now: Instant) {
        let Phase::Training {
            round:
                Round::Telling {
                    generation,
                    joiners,
                    members,
                    telling,
                },
            ..
        } = &mut self.phase
        else {
            return;
        };
        let generation = *generation;
        let step = telling.poll(now);
        let (joiners, members) = (joiners.clone(), members.clone());
        let admit = MemberMessage::Admit {
            generation,
            members: members.clone(),
        };
        for n in step.tell {
            self.send(&n, admit.clone());
        }
        if let Some(all_told) = step.done {
            let seq = self.group.as_ref().map_or(0, |g| g.seq);
            self.own_piece(seq, Piece::Told(all_told));
            let round = Round::Told {
                generation,
                joiners,
                members,
            };
            if let Some(g) = self.group.as_ref() {
                let others: Vec<NodeId> = g.nodes.iter().skip(1).cloned().collect();
                let g_generation = g.generation;
                for peer in others {
                    self.send(
                        &peer,
                        MemberMessage::Piece {
                            generation: g_generation,
                            seq,
                            piece: Piece::Told(all_told),
                        },
                    );
                }
            }
            if let Phase::Training { round: r, sent, .. } = &mut self.phase {
                *r = round;
                *sent = true;
            }
        }
    }

    fn begin_step(&mut self, now: Instant) {
        let ready = now + self.settings.step_time;
        self.begin_round(now, Some(Round::Step { ready }));
    }

    fn stepped(&mut self, now: Instant, pieces: &[Piece]) {
        let step = self.step + 1;
        let mut sum = 0u64;
        for piece in pieces {
            match piece {
                Piece::Contribution { step: s, value } if *s == step => {
                    sum = sum.wrapping_add(*value)
                }
                // Members that disagree on the call: the group cannot go on.
                _ => {
                    self.break_group(Broke::Timeout);
                    return self.group_failed(now);
                }
            }
        }
        let parent = self.digest;
        self.digest = apply_step(parent, step, sum);
        self.step = step;
        let g = self.group.as_ref().expect("a group trains");
        self.actions.push_back(MemberAction::Applied {
            generation: g.generation,
            members: g.nodes.clone(),
            step,
            parent,
            digest: self.digest,
        });
        // After the last step, one more boundary closes the job (see `voted`).
        self.begin_round(now, Some(Round::Vote));
    }

    /// The group this member trains in broke: re-form.
    fn group_failed(&mut self, now: Instant) {
        if let Some((before, attempt)) = self.recovery.take() {
            return self.next_attempt(now, before, attempt, false);
        }
        let before = self.before_of_group();
        self.begin_recovering(now, before, 1);
    }

    // ---- Re-forming ----

    /// Re-forming attempt `number` begins: it probes the other members of `before`.
    fn begin_recovering(&mut self, now: Instant, before: Before, number: usize) {
        let members = before.members.iter().map(|m| m.node.clone()).collect();
        let round = ProbeRound::new(
            members,
            self.me.node.clone(),
            before.generation,
            (now, self.settings.probe_timeout),
            self.settings.detection,
        );
        self.phase = Phase::Recovering {
            before,
            attempt: Attempt::begin(number, now),
            round,
        };
    }

    /// Probing: what [`ProbeRound`] says is due; once the answers are in, the verdict
    /// ([`reforming::judge`]) and the next generation's forming with the survivors.
    fn progress_recovering(&mut self, now: Instant) {
        let Phase::Recovering { before, round, .. } = &mut self.phase else {
            return;
        };
        let generation = before.generation;
        let step = round.poll(now);
        for n in step.probe {
            self.send(&n, MemberMessage::Probe { generation });
        }
        let Some(found) = step.done else {
            return;
        };
        let Phase::Recovering {
            before, attempt, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let (alive, joining) = match found {
            Probes::LeftOut(_) => return self.exit(MemberExit::LeftOut),
            Probes::Answered { alive, joining } => (alive, joining),
        };
        let previous: Vec<NodeId> = before.members.iter().map(|m| m.node.clone()).collect();
        let survivors = match reforming::judge(&previous, &alive, &joining) {
            Verdict::NoQuorum { .. } => return self.next_attempt(now, before, attempt, true),
            Verdict::Form { survivors } => survivors,
        };
        let next = self.membership.next_generation(before.generation);
        let members: Vec<GroupMember> = before
            .members
            .iter()
            .filter(|m| survivors.contains(&m.node))
            .cloned()
            .collect();
        self.begin_forming(now, next, members, Purpose::Recover { before, attempt });
    }

    /// Re-forming `attempt` failed (`no_quorum`: for want of a quorum): the next one begins a
    /// probe timeout after it began, or the process gives up ([`Attempt::failed`]).
    fn next_attempt(&mut self, now: Instant, before: Before, attempt: Attempt, no_quorum: bool) {
        let (limit, span) = (self.settings.recover_attempts, self.settings.probe_timeout);
        match attempt.failed(now, limit, span, no_quorum) {
            AfterAttempt::GiveUp { no_quorum } => {
                self.exit(MemberExit::RecoveryFailed { no_quorum })
            }
            AfterAttempt::Next { number, at } => {
                self.phase = Phase::RecoverLater { before, number, at };
            }
        }
    }
}
