//! The messages of the process group, carried as transport requests (header: one bincode
//! message below; blob 0: a tensor chunk as little-endian elements).
//!
//! ```text
//!  Join  { generation, members, plaintext, by_admission, incarnation }
//!                                        dialer -> acceptor, once per link and generation
//!  Data  { generation, seq, tag, call } + blob   one chunk of the seq-th operation
//!  Abort { generation, error }                the first error a member saw, to every member
//!  Probe { generation }                       is the receiver alive? (re-forming with survivors)
//!  Enter { addr, incarnation }           a starting process asks whether a group lives
//!                                        (and, if one does, to be admitted to it)
//!  Admit { generation, members }              the live group's leader -> an admitted joiner
//!  StillForming { generation, members }       does the receiver still form this generation?
//!  reply: Ack | Joined { incarnation, plain } (to Join)
//!       | Refused { current, detail } | Broken(error) | Joining
//!       | Entered { generation, formed }      (to Enter)
//! ```
//!
//! Every message carries the membership generation; a member refuses every message of another
//! generation (EPOCH-1). `Enter` and `Join` carry the sender's process [`Incarnation`], and the
//! answer to a join the acceptor's: a member knows which process of each peer it formed its
//! group with, so an ask from another one is a new process (its old one is gone), and a late
//! ask of the same one is stale. A `Data` request is answered when the receiving operation consumes it, so
//! that a sender's window of unanswered requests bounds what waits in the receiver.

use bincode::{Decode, Encode};
use cohort_transport::NodeId;

use super::element::{Element, Reduction};
use super::CollectiveError;
use crate::process::Incarnation;

/// A process group message.
#[derive(Debug, Clone, Encode, Decode)]
pub(crate) enum Wire {
    /// The dialer of a link asks the acceptor whether it formed `generation` with `members`.
    Join {
        /// The generation being formed.
        generation: u64,
        /// Its members, in rank order.
        members: Vec<NodeId>,
        /// Whether the dialer's chunks go over the plaintext data plane (both ends must agree).
        plaintext: bool,
        /// Whether the dialer forms `generation` as a joiner the leader admitted to it. The leader
        /// tells every joiner of a generation before any member forms it, but a joiner may hear
        /// of its admission after another joiner dialed it: such a join is waited on (within
        /// the form timeout) for the acceptor's own admission, where a survivor's join of an
        /// generation the acceptor was not admitted to means its old process and is refused at once.
        by_admission: bool,
        /// The dialer's process.
        incarnation: Incarnation,
    },
    /// One chunk of the `seq`-th operation of the group of `generation`; blob 0 holds the chunk.
    Data {
        /// The sender's generation.
        generation: u64,
        /// The operation's sequence number in the group.
        seq: u64,
        /// Which chunk of which step (see [`tag`]).
        tag: u64,
        /// The operation as the sender called it (checked against the receiver's).
        call: Call,
    },
    /// Whether the receiver is alive, asked by a member of the group of `generation` that is
    /// re-forming it with the survivors; answered `Ack` by any live mesh.
    Probe {
        /// The generation the sender is leaving.
        generation: u64,
    },
    /// A process starting its mesh asks whether the receiver's group lives; if one does,
    /// the receiver keeps the sender as a pending joiner (for a while: the sender repeats it
    /// until it is admitted), to be admitted at the group's next step boundary.
    Enter {
        /// Where the sender's mesh listens (`host:port`).
        addr: String,
        /// The sender's process: a member of the live group that formed it with this very
        /// process takes the ask for one sent before its admission reached it (stale), and
        /// one from any other process of a member for that member's restart.
        incarnation: Incarnation,
    },
    /// The live group's leader admits the receiver (a pending joiner): form `generation` with
    /// `members` (node, `host:port`), every current member and the admitted joiners.
    Admit {
        /// The generation to form.
        generation: u64,
        /// Its members and where their meshes listen.
        members: Vec<(NodeId, String)>,
    },
    /// The group of `generation` failed at the sender with `error`; the receiver fails too.
    Abort {
        /// The generation of the failed group.
        generation: u64,
        /// The error, as the sender saw it.
        error: CollectiveError,
    },
    /// An acceptor still waiting for the receiver's join of `generation` asks whether the receiver
    /// forms that generation with `members`: `Ack` while it does (or has not reached that generation
    /// yet), else `Refused` (it is past that generation, or forms it with other members) or
    /// `Broken` (its forming of it failed). The join will then never come.
    StillForming {
        /// The generation the sender forms.
        generation: u64,
        /// Its members, in rank order.
        members: Vec<NodeId>,
    },
}

/// The answer to a [`Wire`] request.
#[derive(Debug, Clone, Encode, Decode)]
pub(crate) enum Reply {
    /// Taken.
    Ack,
    /// The receiver is at another generation (or its group of this generation has other members).
    Refused {
        /// The receiver's generation.
        current: u64,
        /// Why, when the generations are equal.
        detail: String,
    },
    /// The receiver's group of this generation already failed with this error.
    Broken(CollectiveError),
    /// The acceptor's answer to a taken `Join`: its process, and on the plaintext data plane
    /// where to finish the link.
    Joined {
        /// The acceptor's process.
        incarnation: Incarnation,
        /// Plaintext plane: connect to this port of the acceptor's address over TCP and say
        /// this token first (it binds the TCP link to this peer and generation: the token travels
        /// only over QUIC's mutual TLS). `None` on the QUIC data plane.
        plain: Option<PlainLink>,
    },
    /// The answer to a probe from a process waiting to be admitted: it is no survivor of
    /// any group (survivors re-form without it, and admit it afterwards).
    Joining,
    /// The answer to a probe from a process no survivor of any group that cannot tell yet
    /// that its node's old process was a member of no group later than the prober's: the
    /// prober counts it as a member that did not answer (see `Membership::no_survivor`).
    Unsettled,
    /// The answer to [`Wire::Enter`]: the receiver's latest generation, and whether a group of
    /// it was formed (it lives, or broke and is re-forming): then the sender is to join
    /// rather than form the first generation.
    Entered {
        /// The receiver's latest generation (0: it formed none yet).
        generation: u64,
        /// Whether that generation's group was formed.
        formed: bool,
        /// The latest generation whose group the receiver was a member of (0: none).
        member_of: u64,
    },
}

/// Where the dialer of a plaintext link connects its TCP stream ([`Reply::Joined`]).
#[derive(Debug, Clone, Copy, Encode, Decode)]
pub(crate) struct PlainLink {
    /// The acceptor's TCP listener port.
    pub(crate) port: u16,
    /// The link's one-time token.
    pub(crate) token: u128,
}

/// An operation as one member called it: every member must call the same.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Call {
    /// What operation.
    pub(crate) op: CallOp,
    /// The tensor's element type.
    pub(crate) element: Element,
    /// The tensor's shape.
    pub(crate) dims: Vec<u64>,
    /// For a fused bucket: a digest of the shapes fused into it (0 otherwise).
    pub(crate) parts: u64,
    /// The caller's [`GroupConfig::chunk_bytes`](super::GroupConfig::chunk_bytes): members
    /// must cut chunks alike.
    pub(crate) chunk_bytes: u64,
    /// The caller's [`GroupConfig::small_bytes_max`](super::GroupConfig::small_bytes_max):
    /// members must choose the algorithm alike.
    pub(crate) small_bytes_max: u64,
}

/// The operations of a process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub(crate) enum CallOp {
    /// All-reduce.
    AllReduce(Reduction),
    /// Reduce-scatter.
    ReduceScatter(Reduction),
    /// All-gather.
    AllGather,
    /// Broadcast from the member of this rank.
    Broadcast {
        /// The root's rank.
        root: u32,
    },
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op {
            CallOp::AllReduce(op) => write!(f, "all_reduce({op})")?,
            CallOp::ReduceScatter(op) => write!(f, "reduce_scatter({op})")?,
            CallOp::AllGather => f.write_str("all_gather")?,
            CallOp::Broadcast { root } => write!(f, "broadcast(root {root})")?,
        }
        write!(f, " of {:?} {:?}", self.element, self.dims)?;
        if self.parts != 0 {
            write!(f, " (bucket {:016x})", self.parts)?;
        }
        if f.alternate() {
            write!(
                f,
                " in chunks of {} B, direct up to {} B",
                self.chunk_bytes, self.small_bytes_max
            )?;
        }
        Ok(())
    }
}

/// The phases of an operation, the top bits of a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Ring reduce-scatter.
    ReduceScatter = 0,
    /// Ring all-gather.
    AllGather = 1,
    /// Direct exchange (small tensors): one message from each member to each member.
    Direct = 2,
    /// Broadcast chain, and the last member's "done" back to the root.
    Broadcast = 3,
}

/// A chunk's tag: its phase, the ring step and the chunk index in the segment.
pub(crate) fn tag(phase: Phase, step: usize, chunk: usize) -> u64 {
    ((phase as u64) << 56) | (((step as u64) & 0xff_ffff) << 32) | (chunk as u64 & 0xffff_ffff)
}
