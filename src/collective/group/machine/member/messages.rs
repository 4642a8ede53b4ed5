//! What member machines say to each other ([`MemberMessage`]) and what a machine asks its
//! executor to do ([`MemberAction`]), with why a member exits and why a group broke.

use super::*;

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
        /// The process whose ask it answers.
        to: Incarnation,
    },
    /// A dialer joins `generation`, formed with `members` (rank order).
    Join {
        generation: u64,
        members: Vec<NodeId>,
        by_admission: bool,
        incarnation: Incarnation,
    },
    /// The join was taken: the link of `generation` is up, with this process of the acceptor.
    /// `to`: the joiner's process whose join it answers (production answers on that process's
    /// own stream, which no later process of the node can read).
    Joined {
        generation: u64,
        incarnation: Incarnation,
        to: Incarnation,
    },
    /// The join of `generation` by the joiner's process `to` was refused; `current`: the
    /// acceptor's latest generation.
    JoinRefused {
        generation: u64,
        current: u64,
        to: Incarnation,
    },
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
    /// The step boundary's all-gather, where no step before it carried the vote.
    Vote(Vote),
    /// The leader's broadcast: whether every joiner acked its admission.
    Told(bool),
    /// The state all-gather: the member's completed steps and model digest, `None` from a
    /// member that holds none of the job's state (it was admitted and never handed it).
    State { held: Option<(u64, u64)> },
    /// The member's contribution to the all-reduce of `step`, with its vote at the boundary
    /// after it unless the closing boundary comes next (production's `CastVote`).
    Contribution {
        step: u64,
        value: u64,
        vote: Option<Vote>,
    },
}

/// A member's vote at a step boundary: its notice, and (the leader's) joiners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Vote {
    pub(crate) leaving: Option<Leave>,
    pub(crate) offer: Vec<Joiner>,
}

/// What the machine asks its executor to do, or reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberAction {
    /// Send `message` to `to`.
    Send { to: NodeId, message: MemberMessage },
    /// Compute step `step` (the user's step in production, simulated time in the simulator)
    /// for collective `seq` of the group of `generation`, then say so with
    /// [`MemberMachine::handle_computed`]: its contribution and the vote at the boundary after
    /// it go out then. A computation that never ends ends at the machine's operation timeout.
    Compute {
        generation: u64,
        seq: u64,
        step: u64,
    },
    /// Run collective `seq` of the group of `generation` over the group's links: send `piece`
    /// (none: this member sends nothing, as in the leader's broadcast) to `to`, and gather
    /// the pieces of `from` (rank order, this member's own among them where it sent one), each
    /// from the process of it the group linked with (production's links are connections of
    /// one process: a piece an earlier process of a member sent is never this group's; where
    /// no process of a member is known, none of its pieces is).
    /// The executor answers with [`MemberMachine::handle_round_done`] once all came, or
    /// [`MemberMachine::handle_round_refused`] where a peer's group is of another generation
    /// (EPOCH-1); a round that never completes ends at the machine's operation timeout.
    /// Production's collectives are the group's all-gathers, broadcast and the step's
    /// all-reduce; the simulator's carry the pieces over its network.
    RunRound {
        generation: u64,
        seq: u64,
        piece: Option<Piece>,
        to: Vec<NodeId>,
        from: Vec<(NodeId, Option<Incarnation>)>,
    },
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
    /// No member of its group holds the job's state: every one was admitted and never handed
    /// it (the members that hold it are elsewhere, or gone). It enters again as a new process.
    NoStateHolder,
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
