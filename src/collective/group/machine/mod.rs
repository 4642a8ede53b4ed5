//! The membership machine of a mesh: what it knows of who is in its group (its latest generation,
//! whether it is a member or waits to be admitted, which process of each peer it formed with,
//! the pending joiners, the admission it received), and every answer that follows from that
//! alone: to an ask to enter, a probe, an admission, and whether it may ever form a generation.
//!
//! Pure: it names no runtime, network or clock (time is passed in), so tests drive it exactly
//! as the mesh does. The mesh keeps it under its lock, hands it a view of its latest group
//! ([`GroupView`]) and carries out what it decides (failing or cutting short that group,
//! replying, telling waiters).

use core::net::SocketAddr;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::{GroupMember, Joiner};
use crate::process::Incarnation;

mod ask_round;
pub(crate) mod boundary;
pub(crate) mod entry;
pub(super) mod linking;
mod member;
mod quorum;
pub(crate) mod reforming;

pub(crate) use member::{
    MemberAction, MemberExit, MemberMachine, MemberMessage, MemberSettings, Piece, INITIAL_DIGEST,
};

/// A mesh's membership state (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Membership {
    /// The latest generation formed (or tried, or skipped) here.
    pub(super) generation: u64,
    /// Whether this process waits to be admitted to a live group ([`super::Mesh::join_live`]):
    /// it answers probes as no survivor.
    pub(super) joining: bool,
    /// Whether this process is a member the others know: a group formed here (all its links
    /// up), or a member that formed the first generation with this process (their link up) is
    /// re-forming it, which cut this process's forming short ([`super::Mesh::form`]). A mesh
    /// that is no member answers probes as no survivor of any group.
    pub(super) member: bool,
    /// The peers whose link of the forming (or last formed) generation is up, by generation.
    pub(super) linked: HashSet<(NodeId, u64)>,
    /// Processes that asked to be admitted (`Enter`), by node.
    pub(super) pending: HashMap<NodeId, Pending>,
    /// The process of each peer this mesh last linked with (its join, or its answer to ours)
    /// or admitted: an `Enter` from that process is one it sent before it formed the group
    /// with this mesh (stale); one from another process of a member is its restart.
    pub(super) processes: HashMap<NodeId, Incarnation>,
    /// The admission this joining mesh received and has not formed yet: generation and members.
    pub(super) admission: Option<(u64, Vec<GroupMember>)>,
    /// The latest generation a leader admitted this joining mesh to (its `Admit` acked): a join of
    /// a later one is refused ([`Membership::unadmitted`]).
    pub(super) admitted_generation: u64,
    /// The latest generation whose group this process was a member of ([`Membership::formed`]):
    /// its answers to `Enter` carry it, so that a new process learns how far its old one
    /// may have gone.
    pub(super) formed_generation: u64,
    /// The peers this process asks to enter ([`Membership::hear_from`]); until it is set,
    /// this process cannot tell how far its node's old process went.
    pub(super) to_hear: Option<Vec<NodeId>>,
    /// The latest generation each peer said it was a member of (its answers to `Enter`).
    pub(super) heard: HashMap<NodeId, u64>,
    /// The latest generation whose prober this process told that it is no survivor
    /// ([`Membership::no_survivor`]; 0: none). That prober counted it out and may go on
    /// without it, so this process never survives a forming of that generation or an earlier
    /// one from then on ([`Membership::handle_probe`]).
    pub(super) counted_out: u64,
}

/// A process that asked to be admitted ([`Membership::pending`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pending {
    /// Where it listens.
    pub(super) addr: SocketAddr,
    /// Which process of its node asked.
    pub(super) incarnation: Incarnation,
    /// When it last asked.
    pub(super) asked: Instant,
}

/// What the machine is told of the mesh's latest group, while one lives.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupView<'a> {
    /// Its generation (not above [`Membership::generation`]).
    pub(super) generation: u64,
    /// Its members, in rank order.
    pub(super) nodes: &'a [NodeId],
    /// Whether all its links are up.
    pub(super) formed: bool,
    /// Whether it broke.
    pub(super) broken: bool,
    /// Whether a collective of it completed here.
    pub(super) trained: bool,
}

impl GroupView<'_> {
    /// Whether this group still forms, with `peer` among its members, `generation` or an
    /// earlier one: a probe of `generation` by `peer` means that forming can no longer
    /// complete as it was meant to.
    fn forms_up_to_with(&self, generation: u64, peer: &NodeId) -> bool {
        self.generation <= generation && !self.formed && self.nodes.contains(peer)
    }
}

/// The answer to an ask to enter ([`Membership::handle_enter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EnterAnswer {
    /// No group lives here to admit anyone (none formed yet, this mesh itself waits to be
    /// admitted, its first forming failed, its first generation broke before any collective
    /// completed, or the job is starting and the asker is one of the first generation's
    /// members): the asker is to form the first generation. `generation`: this mesh's latest.
    NoGroup { generation: u64 },
    /// The asker is the very process this mesh formed its group with (or admitted): the ask
    /// was sent before then and arrives late. Changes nothing.
    Stale { generation: u64 },
    /// Kept as a pending joiner. `restarted`: the asker is a new process of a member of the
    /// live, formed group, whose old process is then gone: the mesh fails that group.
    Pending { generation: u64, restarted: bool },
}

/// The answer to a dialer's join of a generation ([`Membership::handle_join`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum JoinAnswer {
    /// This mesh has not reached that generation yet: wait for it (within the form timeout).
    Wait,
    /// Taken: the dialer's link of that generation.
    Take,
    /// Refused (the dialer's forming fails on it); `current`: this mesh's latest generation.
    Refused { current: u64, why: JoinRefusal },
    /// Refused, and this mesh's own forming of the generation fails too: the dialer forms it with
    /// other members (`theirs`) than this mesh (`ours`), and a member forms a generation once,
    /// with one list, so it never joins this one (failing now, not at the form timeout).
    ViewsDiffer {
        theirs: Vec<NodeId>,
        ours: Vec<NodeId>,
    },
}

/// Why a join is refused ([`JoinAnswer::Refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum JoinRefusal {
    /// The group of that generation is formed (all its links up): the dialer is a new process of a
    /// member, to enter and be admitted.
    FormedAlready,
    /// The link with that peer of that generation is up already, with another process of it (the
    /// one before a restart): this one is to enter and be admitted.
    LinkedWithAnotherProcess,
    /// The link with that peer of that generation is up already, with this very process: its join
    /// came again (over a new connection); the link it had is the one the group holds.
    LinkedAlready,
    /// A later process of that peer joined that generation too, or this one's connection is gone.
    LaterProcessJoined,
    /// This mesh forms that generation with other members.
    OtherMembers(Vec<NodeId>),
    /// This mesh went past that generation (or its group of it is gone).
    Passed,
    /// This mesh waits to be admitted and was not admitted to that generation
    /// ([`Membership::unadmitted`]).
    Unadmitted,
}

impl JoinRefusal {
    /// The refusal's detail as the dialer's error shows it (after "refused generation E, at C").
    pub(super) fn detail(&self, peer: &NodeId, generation: u64, current: u64) -> String {
        match self {
            JoinRefusal::FormedAlready => {
                format!(" (formed already: {peer} is to enter and be admitted)")
            }
            JoinRefusal::LinkedWithAnotherProcess => format!(
                " (linked already with another process of {peer}: this one is to enter and be \
                 admitted)"
            ),
            JoinRefusal::LinkedAlready => format!(
                " (linked already with this process of {peer}, whose join came again: its \
                 group re-forms)"
            ),
            JoinRefusal::LaterProcessJoined => {
                format!(" (a later process of {peer} joined it: this one is gone)")
            }
            JoinRefusal::OtherMembers(ours) => format!(" with members {ours:?}"),
            JoinRefusal::Passed if current == generation => " (its group of that generation is gone)".into(),
            JoinRefusal::Passed => String::new(),
            JoinRefusal::Unadmitted => format!(
                " (a new process waiting to be admitted, not admitted to generation {generation}: its old \
                 one is gone)"
            ),
        }
    }
}

/// What the mesh knows of a join besides what it carries ([`Membership::handle_join`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JoinContext {
    /// The dialer's process.
    pub(super) incarnation: Incarnation,
    /// Whether the dialer forms the generation as a joiner the leader admitted to it.
    pub(super) by_admission: bool,
    /// Whether a join of the same peer and generation arrived after this one (a later process).
    pub(super) later_join: bool,
    /// Whether the connection this join came over is closed already.
    pub(super) closed: bool,
}

/// The answer to a member asking whether this mesh still forms a generation
/// ([`Membership::handle_still_forming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StillFormingHere {
    /// It forms it, or will (it has not reached it yet): the asker waits on for its join.
    Yes,
    /// It forms it with other members: it never joins the asker's.
    OtherMembers,
    /// It never forms it: it waits to be admitted, and was not admitted to it.
    NotAdmitted,
    /// Its group of that generation is gone (superseded), or it never formed it.
    Gone,
    /// Its forming of it broke.
    Broken,
}

/// The answer to a member's probe ([`Membership::handle_probe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ProbeAnswerHere {
    /// A live mesh: the prober may count it as a survivor.
    Alive,
    /// No survivor: a joiner, or a mesh that never was a member, whose node's old process
    /// (if it had one) was a member of no group later than the prober's: the prober may leave
    /// it out of its quorum's count ([`Membership::no_survivor`]).
    Joining,
    /// No survivor, but this process cannot tell yet that its node's old process was a member
    /// of no group later than the prober's (a peer has not answered its `Enter`, or one
    /// answered a later generation): the prober counts it as a member that did not answer.
    Unsettled,
    /// This mesh's live group of generation `current`, later than the prober's, left the prober
    /// out: it was taken for lost.
    LeftOut { current: u64 },
    /// This mesh still forms the first generation the prober formed with this very process (their
    /// link is up), and the prober lost another member meanwhile and re-forms: this mesh
    /// survives too. The mesh cuts its forming short (answering [`Self::Alive`] if that
    /// worked, else [`Self::Joining`]).
    CutShort,
    /// This mesh forms a generation the prober formed without this process (with its old one,
    /// lost since), or, waiting to be admitted, the admission's generation the prober re-forms
    /// from: it is no survivor. The mesh ends that forming, and answers as a joiner.
    EndForming,
}

impl Membership {
    /// A process asks to be admitted (`Enter`) at `now`, from `addr`, as `incarnation`;
    /// `group` is the mesh's group of its latest generation, if it lives.
    pub(super) fn handle_enter(
        &mut self,
        peer: &NodeId,
        addr: SocketAddr,
        incarnation: Incarnation,
        group: Option<GroupView<'_>>,
        now: Instant,
    ) -> EnterAnswer {
        let generation = self.generation;
        if self.joining || generation == 0 {
            return EnterAnswer::NoGroup { generation };
        }
        let group = group.filter(|g| g.generation == generation);
        // Its first forming failed and is gone: no group lives here to admit anyone.
        if group.is_none() && !self.member {
            return EnterAnswer::NoGroup { generation };
        }
        let same_process = self.processes.get(peer) == Some(&incarnation);
        let in_group = group.is_some_and(|g| g.nodes.contains(peer));
        if let Some(g) = group {
            // A first generation that broke before any collective completed here was no job
            // yet: it formed at this process only, or not with the others' fresh start. Told
            // "a group lives", a process waiting to be admitted would refuse the others' next
            // fresh start while this one finds no quorum, exits and comes back, again and
            // again (the membership simulator found that livelock).
            if generation == 1 && g.broken && !g.trained {
                return EnterAnswer::NoGroup { generation };
            }
            // The first group forming and waiting for it: the job is starting (unless it
            // linked with another process of it already: then this one is a restart).
            if generation == 1
                && !g.formed
                && in_group
                && (same_process || !self.linked.contains(&(peer.clone(), generation)))
            {
                return EnterAnswer::NoGroup { generation };
            }
        }
        if same_process && in_group {
            return EnterAnswer::Stale { generation };
        }
        self.pending.insert(
            peer.clone(),
            Pending {
                addr,
                incarnation,
                asked: now,
            },
        );
        EnterAnswer::Pending {
            generation,
            restarted: group.is_some_and(|g| g.formed) && in_group,
        }
    }

    /// A dialer (`peer`) joins `generation` with `members` (its list, in rank order); `group` is
    /// the mesh's latest group, if it lives. Answered at once where this mesh reached that
    /// generation, or will never form it; else [`JoinAnswer::Wait`].
    pub(super) fn handle_join(
        &self,
        peer: &NodeId,
        generation: u64,
        members: &[NodeId],
        group: Option<GroupView<'_>>,
        context: JoinContext,
    ) -> JoinAnswer {
        if self.generation < generation {
            if self.unadmitted(generation) && !context.by_admission {
                return JoinAnswer::Refused {
                    current: self.generation,
                    why: JoinRefusal::Unadmitted,
                };
            }
            return JoinAnswer::Wait;
        }
        let Some(g) = group.filter(|g| g.generation == generation) else {
            return JoinAnswer::Refused {
                current: self.generation,
                why: JoinRefusal::Passed,
            };
        };
        // Refused by this mesh's group of that very generation.
        let refused = |why| JoinAnswer::Refused {
            current: generation,
            why,
        };
        if g.formed {
            return refused(JoinRefusal::FormedAlready);
        }
        if self.linked.contains(&(peer.clone(), generation)) {
            return refused(if self.processes.get(peer) == Some(&context.incarnation) {
                JoinRefusal::LinkedAlready
            } else {
                JoinRefusal::LinkedWithAnotherProcess
            });
        }
        if g.nodes != members {
            if g.nodes.contains(peer) {
                return JoinAnswer::ViewsDiffer {
                    theirs: members.to_vec(),
                    ours: g.nodes.to_vec(),
                };
            }
            return refused(JoinRefusal::OtherMembers(g.nodes.to_vec()));
        }
        if context.later_join || context.closed {
            return refused(JoinRefusal::LaterProcessJoined);
        }
        JoinAnswer::Take
    }

    /// A member of `generation` probes this mesh (re-forming with the survivors); `group` is the
    /// mesh's latest group, if it lives (of any generation), and `linked` whether this mesh's link
    /// with the prober of `generation` is up (or its join was taken).
    pub(super) fn handle_probe(
        &mut self,
        peer: &NodeId,
        generation: u64,
        group: Option<GroupView<'_>>,
        linked: bool,
    ) -> ProbeAnswerHere {
        // A joiner is no survivor: the others re-form without it, then admit it. Where it
        // still forms the admission's generation with the prober (or an earlier one), it ends
        // that forming: the prober counts it out, so it must never complete that generation
        // with the others (they and the prober would be two groups, each with a quorum).
        let forming_with_prober = group.filter(|g| g.forms_up_to_with(generation, peer));
        if self.joining {
            if forming_with_prober.is_some() {
                return ProbeAnswerHere::EndForming;
            }
            return self.no_survivor(generation);
        }
        if !self.member {
            // No member yet: this mesh forms the first generation, which the prober formed (or was
            // forming) and is re-forming: that forming can no longer complete. It survives
            // with the prober, unless it told a prober of that generation that it is no
            // survivor: that one goes on without it, and this mesh must not go on with another
            // (found by the membership simulator: a process counted out after its fresh start
            // failed formed the first generation again with a member whose link with the
            // prober was still up from before, and survived that member's re-forming beside
            // the prober; seed 8116243 of up to 5 workers and 14 faults).
            let survives = generation > self.counted_out && linked;
            return match forming_with_prober {
                Some(g) if g.generation == generation && survives => ProbeAnswerHere::CutShort,
                Some(_) => ProbeAnswerHere::EndForming,
                None => self.no_survivor(generation),
            };
        }
        match group {
            Some(g) if g.generation > generation && !g.nodes.contains(peer) && !g.broken => {
                ProbeAnswerHere::LeftOut {
                    current: g.generation,
                }
            }
            _ => ProbeAnswerHere::Alive,
        }
    }

    /// A member whose join of `generation` this mesh awaits asks whether it still forms that
    /// generation with `members` ([`linking`]); `group` is the mesh's latest group, if it lives.
    pub(super) fn handle_still_forming(
        &self,
        generation: u64,
        members: &[NodeId],
        group: Option<GroupView<'_>>,
    ) -> StillFormingHere {
        if self.generation < generation {
            if self.unadmitted(generation) {
                return StillFormingHere::NotAdmitted;
            }
            // Not there yet: its join may still come.
            return StillFormingHere::Yes;
        }
        match group.filter(|g| g.generation == generation) {
            Some(g) if g.nodes != members => StillFormingHere::OtherMembers,
            Some(g) if g.broken => StillFormingHere::Broken,
            Some(_) => StillFormingHere::Yes,
            None => StillFormingHere::Gone,
        }
    }

    /// Whether this mesh forms `generation` as a joiner the leader admitted to it (its joins
    /// say so).
    pub(super) fn joins_by_admission(&self, generation: u64) -> bool {
        self.joining && self.admitted_generation == generation
    }

    /// The leader admits this mesh to form `generation` with `members`: taken (`Ok`) if it waits to
    /// be admitted and `generation` is above every one formed here; else `Err` with its generation.
    pub(super) fn handle_admit(
        &mut self,
        generation: u64,
        members: Vec<GroupMember>,
    ) -> Result<(), u64> {
        if !self.joining || generation <= self.generation {
            return Err(self.generation);
        }
        self.admission = Some((generation, members));
        self.admitted_generation = self.admitted_generation.max(generation);
        Ok(())
    }

    /// Whether this mesh waits to be admitted and was not admitted to `generation`: it never forms
    /// it. The members form a generation with a joiner only once the leader's admission reached it
    /// ([`super::ProcessGroup::admit`]), so a member asking it about another (a `Join`, or
    /// whether it still forms it) lists its node for its old process, lost since: refused at
    /// once, that member's forming fails now rather than at its form timeout, and it re-forms
    /// (this process answering its probe as a joiner).
    pub(super) fn unadmitted(&self, generation: u64) -> bool {
        self.joining && self.generation < generation && self.admitted_generation < generation
    }

    /// The processes that asked to be admitted within `fresh` before `now` and are not among
    /// `members`, in node order; older asks are forgotten.
    pub(super) fn pending_joiners(
        &mut self,
        members: &[NodeId],
        now: Instant,
        fresh: Duration,
    ) -> Vec<Joiner> {
        self.pending
            .retain(|_, pending| now.saturating_duration_since(pending.asked) < fresh);
        let mut joiners: Vec<Joiner> = self
            .pending
            .iter()
            .filter(|(node, _)| !members.contains(node))
            .map(|(node, pending)| Joiner {
                member: GroupMember {
                    node: node.clone(),
                    addr: pending.addr,
                },
                incarnation: pending.incarnation,
            })
            .collect();
        joiners.sort_by(|a, b| a.member.node.cmp(&b.member.node));
        joiners
    }

    /// The leader is about to tell `joiners` their admission: they are no longer pending (a
    /// joiner still waiting asks again).
    pub(super) fn offered(&mut self, joiners: &[Joiner]) {
        for joiner in joiners {
            self.pending.remove(&joiner.member.node);
        }
    }

    /// The members agreed to form the next generation with `joiners`: their asks still on their
    /// way are theirs, not new processes'.
    pub(super) fn admitting(&mut self, joiners: &[Joiner]) {
        for joiner in joiners {
            self.processes
                .insert(joiner.member.node.clone(), joiner.incarnation);
        }
    }

    /// This mesh's link of `generation` with `peer`, whose process is `incarnation`, is up.
    /// How this process, no survivor of any group, answers a prober of `generation`:
    /// [`ProbeAnswerHere::Joining`] only once every peer it asks to enter answered, and none
    /// (nor this process) was a member of a group later than `generation`; else
    /// [`ProbeAnswerHere::Unsettled`].
    ///
    /// A prober leaves a member that answers as a joiner out of its quorum's count (its old
    /// process is gone, on no side). That holds only if the old process was on no side the
    /// prober does not know of: a member that later groups left out (paused, cut off), whose
    /// peer then died and came back, would otherwise count the peer out, while the group that
    /// left it out counted the same peer out too, and both would go on alone (a split brain
    /// the membership simulator found). Any group its old process was a member of after the
    /// prober's generation has a live member that answers the new process's `Enter` with a generation
    /// above the prober's, unless every one of them is gone too.
    pub(super) fn no_survivor(&mut self, generation: u64) -> ProbeAnswerHere {
        let Some(peers) = &self.to_hear else {
            return ProbeAnswerHere::Unsettled;
        };
        let heard_all = peers.iter().all(|p| self.heard.contains_key(p));
        let latest = self.heard.values().copied().max().unwrap_or(0);
        if heard_all && latest.max(self.formed_generation) <= generation {
            self.counted_out = self.counted_out.max(generation);
            ProbeAnswerHere::Joining
        } else {
            ProbeAnswerHere::Unsettled
        }
    }

    /// This process asks `peers` (not itself) to enter: until each answered, it cannot tell
    /// how far its node's old process went ([`Membership::no_survivor`]).
    pub(super) fn hear_from(&mut self, peers: Vec<NodeId>) {
        self.to_hear = Some(peers);
    }

    /// `peer` answered this process's `Enter`: the latest generation whose group it was a member of.
    pub(super) fn heard_from(&mut self, peer: &NodeId, formed_generation: u64) {
        let latest = self.heard.entry(peer.clone()).or_default();
        *latest = (*latest).max(formed_generation);
    }

    /// This process is a member of the group of `generation` (all its links up, or its forming cut
    /// short by a member that formed it with this process).
    pub(super) fn formed(&mut self, generation: u64) {
        self.member = true;
        self.formed_generation = self.formed_generation.max(generation);
    }

    /// The process of `peer` this mesh last linked with (its join, or its answer to ours) or
    /// admitted, if any.
    pub(super) fn linked_process(&self, peer: &NodeId) -> Option<Incarnation> {
        self.processes.get(peer).copied()
    }

    /// Whether the process of `peer` this mesh last linked with (or admitted) is another than
    /// `process`.
    pub(super) fn linked_with_another_process(&self, peer: &NodeId, process: Incarnation) -> bool {
        self.linked_process(peer).is_some_and(|p| p != process)
    }

    pub(super) fn linked_with(&mut self, peer: &NodeId, generation: u64, incarnation: Incarnation) {
        if self.generation == generation {
            self.linked.insert((peer.clone(), generation));
            self.processes.insert(peer.clone(), incarnation);
        }
    }

    /// Begins forming `generation` here: `Err` with the latest generation if it is not above it (an
    /// generation is formed once).
    pub(super) fn begin_forming(&mut self, generation: u64) -> Result<(), u64> {
        if generation <= self.generation {
            return Err(self.generation);
        }
        self.generation = generation;
        self.linked.retain(|(_, e)| *e == generation);
        Ok(())
    }

    /// Forgets a first forming that failed (no group of this mesh lives), where no group was
    /// ever formed here and this mesh does not wait to be admitted, so that the first generation
    /// can be formed again ([`super::Mesh::forget_failed_start`]). Whether it forgot.
    pub(super) fn forget_failed_start(&mut self) -> bool {
        if self.member || self.joining || self.generation != 1 {
            return false;
        }
        self.generation = 0;
        // Its links are of the failed attempt: the next one links anew.
        self.linked.clear();
        true
    }

    /// Takes `generation` as tried here without forming it (the members agreed to skip it).
    pub(super) fn skip(&mut self, generation: u64) {
        self.generation = self.generation.max(generation);
    }

    /// The generation a group of generation `after` changes to (re-formed, admitting or
    /// departing): one above the latest formed, tried or skipped here, which an earlier
    /// attempt may have taken already.
    pub(super) fn next_generation(&self, after: u64) -> u64 {
        // Saturating: a generation only a broken or hostile peer would name (the largest) is
        // tried again and refused as not above the latest, rather than overflowing.
        after.max(self.generation).saturating_add(1)
    }
}

/// Why a worker leaves the group at a step boundary
/// (`MultiWorkerMirrored::at_step_boundary`, and the member machine's boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// A preemption notice (SIGTERM): the chief saves the agreed step first, and the worker's
    /// supervisor may start it again (it rejoins).
    Preempted,
    /// Scaled down for good (SIGUSR1, `cohort scale`): no checkpoint is needed, the stayers
    /// hold the state.
    Drained,
}

impl Leave {
    /// This worker's notice in the step boundary's all-gather: 0 stays, 1 preempted, 2 drained.
    pub(crate) fn vote(leaving: Option<Leave>) -> i64 {
        match leaving {
            None => 0,
            Some(Leave::Preempted) => 1,
            Some(Leave::Drained) => 2,
        }
    }

    /// Why a worker leaves at the next step boundary, from its flags: its preemption
    /// `notice` (set on SIGTERM) or its `drain` (set on SIGUSR1); a notice set too makes it a
    /// preemption (the chief saves first).
    pub fn noticed(
        notice: Option<&std::sync::atomic::AtomicBool>,
        drain: Option<&std::sync::atomic::AtomicBool>,
    ) -> Option<Leave> {
        let set = |flag: Option<&std::sync::atomic::AtomicBool>| {
            flag.is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
        };
        if set(notice) {
            Some(Leave::Preempted)
        } else if set(drain) {
            Some(Leave::Drained)
        } else {
            None
        }
    }

    /// A worker's notice from its vote. Any other non-zero value (a newer peer's notice
    /// this build does not know) is taken as a preemption: the worker leaves, after a save.
    pub(crate) fn of_vote(vote: i64) -> Option<Leave> {
        match vote {
            0 => None,
            2 => Some(Leave::Drained),
            _ => Some(Leave::Preempted),
        }
    }
}

#[cfg(test)]
mod membership_tests;
