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
//! detection budget) through [`MemberMachine::handle_link_lost`]. What production's group and
//! training loop do beside the membership is the executor's, as there: a step's computation
//! ([`MemberAction::Compute`], answered by [`MemberMachine::handle_computed`]) and each
//! collective of a group ([`MemberAction::RunRound`], answered by
//! [`MemberMachine::handle_round_done`] or [`MemberMachine::handle_round_refused`]); the
//! machine decides what each round carries and what its result means. The membership
//! simulator (`sim::membership`) runs many of them over its network under faults and checks
//! the invariants after every event. The step's all-reduce is modelled by one number
//! per member and step (its contribution) and the model by a digest, so that a simulated job
//! shows whether every member applied every step once and holds the same model.
//!
//! This file holds the machine's state and its events; its messages are in `messages.rs`, and
//! each phase of its life in a file of its own: `entering.rs`, `answers.rs` (its answers to the
//! others), `forming.rs`, `training.rs` and `recovering.rs`.

use core::net::SocketAddr;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::super::PENDING_FRESH;
use super::boundary::{self, BoundaryChange, TellRound};
use super::entry::{
    self, AfterFailedStart, EnterAfter, EnterPoll, EnterRound, EntryStep, JoinPoll, JoinWait,
};
use super::linking::{self, FormLink, LinkDue, StillHeard};
use super::reforming::{ProbeReply, ProbeRound, ReformStep, Reforming};
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
}

impl MemberSettings {
    /// Production's bounds shortened as the tests shorten them, for a job of `steps` steps:
    /// what the membership simulator's workers run with, and the machine's own tests.
    pub(crate) fn shortened(steps: u64) -> Self {
        Self {
            form_timeout: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(2),
            detection: Duration::from_secs(2),
            op_timeout: Duration::from_secs(20),
            enter_timeout: Duration::from_secs(3),
            join_timeout: Duration::from_secs(30),
            recover_attempts: 3,
            steps,
        }
    }
}

mod answers;
mod entering;
mod forming;
mod messages;
mod recovering;
#[cfg(test)]
mod step_tests;
mod training;

pub(crate) use messages::{
    Broke, MemberAction, MemberExit, MemberMessage, Piece, StillAnswer, Vote,
};

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
    links: BTreeMap<NodeId, FormLink>,
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
            trained: self.seq > 0,
        }
    }

    /// The group's members other than `me`, in rank order.
    fn others(&self, me: &NodeId) -> Vec<NodeId> {
        self.nodes.iter().filter(|n| *n != me).cloned().collect()
    }
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
    /// Re-forming with the survivors of the group `reforming` probed.
    Recover { reforming: Reforming<Before> },
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
    /// The step's computation ([`MemberAction::Compute`], until the executor says it is done:
    /// `computed`), then its all-reduce, which carries `vote`: this member's vote at the
    /// boundary after the step, cast as the step began, as production's training loops cast
    /// it before they compute (`MultiWorkerMirrored::cast_vote`: a notice that comes during
    /// the step is voted at the next boundary). None before the closing boundary, which is
    /// voted by a round of its own.
    Step { computed: bool, vote: Option<Vote> },
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
    /// A re-forming attempt probes the members of the group `reforming` probes.
    Recovering {
        reforming: Reforming<Before>,
        round: ProbeRound,
    },
    /// Waiting until `at` before `reforming`'s next attempt (each spans the probe timeout).
    RecoverLater {
        reforming: Reforming<Before>,
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
    /// Whether this process holds the job's state: from its start (the job's first state),
    /// not once admitted to a live group, again once a member that holds it handed it over.
    holds_state: bool,
    /// The re-forming whose group agrees on the state now: a failure before that ends is its
    /// next attempt (counted against the same limit), not a new recovery.
    recovery: Option<Reforming<Before>>,
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
            holds_state: true,
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

    /// The connection with `peer`'s process `process` died (silent past the detection budget,
    /// or closed). A connection belongs to one process: where this machine's link with `peer`
    /// is with a later process of it (it died and came back, and linked again), the death of
    /// the old one's connection says nothing of that link (found by the membership simulator,
    /// which lost a new process's link when the detection of its predecessor's death came due:
    /// seed 20039265 of up to 7 workers and 16 faults).
    pub(crate) fn handle_link_lost(&mut self, now: Instant, peer: &NodeId, process: Incarnation) {
        if self.membership.linked_with_another_process(peer, process) {
            return self.progress(now);
        }
        if let Some(g) = &self.group {
            let linked = g.links.get(peer).is_some_and(FormLink::is_up);
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
                    // Its delivery fails as it is sent here: the join began now.
                    if let Some(link) = g.links.get_mut(to) {
                        link.undelivered(now, now);
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
            // An answer to another process's ask or join of this node (its old one) is none of
            // this process's: production answers on the asker's own stream.
            MemberMessage::Entered { to, .. }
            | MemberMessage::Joined { to, .. }
            | MemberMessage::JoinRefused { to, .. }
                if to != self.incarnation => {}
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
                ..
            } => {
                if let Some(g) = self.group.as_mut().filter(|g| g.generation == generation) {
                    if let Some(link) = g.links.get_mut(from).filter(|l| l.is_dialing()) {
                        link.up();
                        self.membership.linked_with(from, generation, incarnation);
                    }
                }
            }
            MemberMessage::JoinRefused {
                generation,
                current,
                ..
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
                if let Phase::Recovering { reforming, round } = &mut self.phase {
                    if reforming.probed().generation == generation {
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

    /// Collective `seq` of the group of `generation` ([`MemberAction::RunRound`]) ended with
    /// every awaited member's `pieces`, in rank order. Taken where this member's group still
    /// awaits it (not broken, nor past its operation timeout: those end it first).
    pub(crate) fn handle_round_done(
        &mut self,
        now: Instant,
        generation: u64,
        seq: u64,
        pieces: Vec<Piece>,
    ) {
        // As every event's progress does, the joins held for this moment are answered first.
        self.answer_held_joins(now);
        let awaited = match (&self.phase, &self.group) {
            (Phase::Training { round, began, .. }, Some(g)) => (g.generation == generation
                && g.seq == seq
                && g.broken.is_none()
                && now < *began + self.settings.op_timeout)
                .then(|| round.clone()),
            _ => None,
        };
        if let Some(round) = awaited {
            if let Some(g) = self.group.as_mut() {
                g.seq += 1;
            }
            self.round_done(now, round, pieces);
        }
        self.progress(now);
    }

    /// A peer (`by`) refused a piece of this member's group of `generation`: its group is of
    /// another generation (EPOCH-1), so this one cannot go on.
    pub(crate) fn handle_round_refused(&mut self, now: Instant, generation: u64, by: &NodeId) {
        if self.group_generation() == Some(generation) {
            let why = Broke::Refused {
                by: by.clone(),
                current: None,
            };
            self.break_group(why);
        }
        self.progress(now);
    }

    /// The step computed for collective `seq` of the group of `generation`
    /// ([`MemberAction::Compute`]) is done: its contribution goes out with the vote at the
    /// boundary after it. Taken where this member's group still awaits it (a computation for a
    /// group that broke meanwhile is not the next one's).
    pub(crate) fn handle_computed(&mut self, now: Instant, generation: u64, seq: u64) {
        let current = self
            .group
            .as_ref()
            .is_some_and(|g| g.generation == generation && g.seq == seq);
        if let Phase::Training {
            round: Round::Step { computed, .. },
            began,
            ..
        } = &mut self.phase
        {
            if current {
                *computed = true;
                // The step's all-reduce begins now: its wait for the others is bounded from
                // here, as production's call is.
                *began = now;
            }
        }
        self.progress(now);
    }

    /// The generation of this process's latest group (forming, formed or broken): the one
    /// whose collectives' pieces it takes.
    pub(crate) fn group_generation(&self) -> Option<u64> {
        self.group.as_ref().map(|g| g.generation)
    }

    /// Whether the process's membership life is over (it finished or exits).
    pub(crate) fn ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
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
                    due.extend(g.links.values().filter_map(FormLink::wake_at));
                }
            }
            Phase::Training { round, began, .. } => {
                due.push(*began + self.settings.op_timeout);
                if let Round::Telling { telling, .. } = round {
                    due.push(telling.wake_at());
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
                        if let Phase::RecoverLater { mut reforming, .. } =
                            std::mem::replace(&mut self.phase, Phase::Idle)
                        {
                            reforming.begin_next(now);
                            self.begin_recovering(now, reforming);
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
            .map_or(0, |g| g.links.values().filter(|l| l.is_up()).count());
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
}
