//! The process group: collectives between processes over cohort's transport (QUIC, mutual
//! TLS).
//!
//! This module owns a node's collective endpoint ([`Mesh`]: it accepts the links of every
//! group the node forms and routes each message to the group of its generation), the forming of a
//! group ([`Mesh::form`], [`ProcessGroup::reform`]), the per-link send windows and the inbox of
//! a group, and the failure rules below. The algorithms over these live in `ops.rs`.
//!
//! The membership decisions that follow from what a mesh knows alone (its latest generation,
//! whether it is a member or waits to be admitted, which process of each peer it formed
//! with, the pending joiners) are taken by a pure machine (`machine.rs`: the answers to an
//! ask to enter, a probe and an admission); the rest of this module carries them out over the
//! network. Its files: `mesh.rs` (the endpoint, entering a job), `forming.rs` (links, probes,
//! telling an admission), `process_group.rs`, `acceptor.rs` (the mesh's state and routing),
//! `answers.rs` (replies to membership messages), `shared.rs` (a formed group's links, inbox
//! and breaking).
//!
//! Calling protocol, per member:
//! 1. [`Mesh::new`] over an [`Endpoint`] of the node (its own port: collective traffic never
//!    queues behind the control plane); the mesh accepts connections from then on.
//! 2. [`Mesh::form`] with a generation and the members (node and address); ranks follow the sorted
//!    node ids. Every member must form the same generation with the same members; the member with
//!    the larger node id of each pair dials, the other accepts, and the link is ready once both
//!    formed that generation (a `Join` carries it). A forming fails as soon as one link fails: an
//!    acceptor refusing a join whose list differs from its own fails too (the dialer forms
//!    that generation with that list only), and an acceptor still waiting for a join asks the
//!    dialer every second whether it still forms the generation with the same members
//!    (`StillForming`), failing on a refusal; in a re-forming (generation > 1) a peer unreachable
//!    for twice the idle timeout fails it too. So views that differ, or a member lost while
//!    the others re-form, cost about the detection budget, not the form timeout.
//! 3. Call the operations (`ops.rs`) in the same order on every member; the `k`-th call of
//!    every member is one operation and must agree (operation, shape, dtype).
//! 4. On any error the group is broken for good: every pending and later call fails with the
//!    same error. Re-form with the survivors at the next generation ([`ProcessGroup::reform`]),
//!    the survivors being the members that answer a probe ([`ProcessGroup::reachable`]).
//! 5. A group is superseded by the next generation's (re-formed or with joiners admitted), which
//!    first waits until this member's messages of the group were taken: a call ends once it
//!    has what it needs, its own last messages perhaps still queued for a peer whose call
//!    has not ended (dropping a group drops its queues). A member going away flushes first
//!    ([`ProcessGroup::flush`]) for the same reason.
//!
//! Joining a live group (a restarted or new process):
//! 1. A starting process asks the others first ([`Mesh::enter`]): if none formed a group yet
//!    (the job is starting), it forms generation 1 with them; if one did, it is to join.
//! 2. A joiner repeats its `Enter` to every member until it is admitted ([`Mesh::join_live`]);
//!    each member keeps it as pending for a while. Every `Enter` and `Join` carries the
//!    sender's process [`Incarnation`], and each member knows the process of each peer it
//!    formed its group with: a member of the live group asking to enter from another process
//!    is a new incarnation (an ask of the same process is one it sent before its admission
//!    reached it, and is ignored): its old one is gone, and the group fails at once with
//!    [`CollectiveError::MemberLost`] (the survivors re-form without it: a joiner answers
//!    probes as no survivor).
//! 3. At a step boundary the members agree on the joiners (their leader's pending ones, see
//!    [`ProcessGroup::pending_joiners`]) and form the next generation with them
//!    ([`ProcessGroup::admit`]): the leader tells each joiner the generation and members (`Admit`),
//!    then whether every joiner acked (a broadcast over the group), and only then every one
//!    forms it as in step 2 above; where one could not be told (an admission lost on a link
//!    that died is told again over a new one while the joiner was not out of reach for twice
//!    the idle timeout), every member skips that generation and goes on, and the joiners ask again.
//!    A joiner refuses at once to form a generation it was not admitted to: a member naming its
//!    node meant its old process.
//!
//! Failure rules:
//! - A member is lost when its connection fails or stays silent past the transport's idle
//!   timeout (the detection budget): every survivor's pending call fails with
//!   [`CollectiveError::MemberLost`] (each survivor watches every link, and the first member to
//!   see a failure sends it to all others as an `Abort`). A member that closes its links on
//!   purpose (its process going away after its last call) is lost only to a call that waits
//!   for a chunk from it that never came, so that a peer still taking its last chunks
//!   finishes.
//! - A member whose step failed in the application aborts the group
//!   ([`ProcessGroup::abort`]): every member's pending and later calls fail with
//!   [`CollectiveError::Application`] naming it and its message.
//! - A probe is answered by any live mesh, except one whose live group of a later generation left
//!   the prober out: it refuses, so the late member learns it was taken for lost. A joiner
//!   answers as no survivor. So does a mesh still forming the first generation whose link with the
//!   prober is not up (a new process of a member, forming the generation that the others formed
//!   with its old process): its forming fails at once, and its process enters again as a
//!   joiner. One whose link with the prober is up is a member whose links were not all up
//!   when another member was lost: it answers as a survivor, and its forming ends with the
//!   group broken ([`Mesh::form`]), so that it re-forms with the others.
//! - EPOCH-1: every message carries its generation; a message of another generation than the group's is
//!   refused ([`CollectiveError::GenerationRefused`] at the sender), never delivered.
//! - Members that disagree on a call all fail with [`CollectiveError::Mismatch`].
//! - A member that gives up a call before it ends (drops its future) leaves the group as a
//!   member that stops ([`CollectiveError::Stopped`] here, lost to the others; `ops.rs`).
//! - Every wait is bounded: forming by `form_timeout`, a peer's message by `op_timeout`, a
//!   send by the link's window of `window` unanswered requests (a request is answered when the
//!   receiving operation consumes it, so a receiver holds at most `window` chunks per peer).
//!   A link's queue of chunks not yet sent holds at most one operation's chunks for that peer
//!   (the operation produced them; an operation never waits on sending, only on receiving, so
//!   that a ring of full windows cannot deadlock).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use cohort_transport::{
    ConnectError, Connection, Endpoint, Frame, Incoming, LinkError, NodeId, RejectReason, Responder,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::landing::{Blob, Writable};
use super::wire::{Call, PlainLink, Reply, Wire};
use super::CollectiveError;
use crate::process::Incarnation;

mod acceptor;
mod answers;
mod forming;
mod in_flight;
mod machine;
mod mesh;
mod process_group;
mod shared;
#[cfg(test)]
mod tests;

use super::outgoing::{Outgoing, Unanswered};
use acceptor::{MeshInner, MeshState};
pub(crate) use forming::FormFailed;
use in_flight::InFlight;
pub use machine::Leave;
pub(crate) use machine::{
    boundary, entry, reforming, MemberAction, MemberExit, MemberMachine, MemberMessage,
    MemberSettings, Piece, INITIAL_DIGEST,
};
use machine::{
    linking, EnterAnswer, GroupView, JoinAnswer, JoinContext, JoinRefusal, Membership,
    ProbeAnswerHere, StillFormingHere,
};
pub use mesh::{loopback_group, Mesh};
pub use process_group::ProcessGroup;
use shared::respond;
pub(crate) use shared::Shared;

/// Settings of a process group; every member should use the same (a member whose chunking
/// differs fails its first large call with [`CollectiveError::Mismatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// Tensors up to this many bytes go by direct exchange (one message to each member);
    /// larger ones by the ring.
    pub small_bytes_max: usize,
    /// The ring's chunk: a segment is cut into chunks of at most this many bytes, each sent as
    /// soon as it is reduced, so that every link carries data at once.
    pub chunk_bytes: usize,
    /// Most unanswered chunks per link (the sender's window).
    pub window: usize,
    /// How long an operation waits for a peer's message whose connection still lives.
    pub op_timeout: Duration,
    /// How long forming a group waits for every member (dialing, and its `Join`).
    pub form_timeout: Duration,
    /// The plaintext data plane (`plain.rs`): chunks over TCP between members authenticated
    /// over QUIC when each link forms, for clusters inside a trusted network only (tensors
    /// travel unencrypted). Off by default; every member must choose alike (a member whose
    /// choice differs fails forming with [`CollectiveError::Form`] naming it).
    pub plaintext: bool,
    /// On the plaintext plane, members on one host pass large chunks through shared memory
    /// (`/dev/shm`) instead of TCP: one copy in place of the kernel's two (`shm.rs`). Each
    /// link falls back to TCP alone where the peer cannot map this member's segment (another
    /// host or container, another user, a full `/dev/shm`) or has this off. On by default;
    /// without `plaintext` it does nothing.
    pub shared_memory: bool,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            small_bytes_max: 64 * 1024,
            chunk_bytes: 1024 * 1024,
            window: 8,
            op_timeout: Duration::from_secs(60),
            form_timeout: Duration::from_secs(30),
            plaintext: false,
            shared_memory: true,
        }
    }
}

impl GroupConfig {
    /// The defaults with waits short enough for tests on loopback.
    pub fn for_tests() -> Self {
        Self {
            op_timeout: Duration::from_secs(20),
            form_timeout: Duration::from_secs(10),
            ..Self::default()
        }
    }
}

/// A member of a group to form: its node and where its mesh listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The member's node (its certificate names it).
    pub node: NodeId,
    /// The UDP address of its mesh's endpoint.
    pub addr: SocketAddr,
}

/// A process waiting to be admitted to the live group ([`ProcessGroup::pending_joiners`],
/// [`ProcessGroup::admit`]): the member it is to be, and which process of that node asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joiner {
    /// Its node and where its mesh listens.
    pub member: GroupMember,
    /// The process that asked: every member records it on admitting it, so that this
    /// process's asks still on their way are not taken for a new one's.
    pub incarnation: Incarnation,
}

/// How a starting process enters the job ([`Mesh::enter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// No member formed a group yet: form generation 1 with them.
    Start,
    /// A member formed a group: wait to be admitted to it ([`Mesh::join_live`]).
    Join,
}

/// What a member's probes of its group found ([`ProcessGroup::probe_members`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probed {
    /// The members that answered as live members (this one among them), in rank order: the
    /// survivors.
    pub alive: Vec<NodeId>,
    /// The members whose address answered with a new process of that member, waiting to be
    /// admitted: its old process is gone, and it is no survivor.
    pub joining: Vec<NodeId>,
}

/// Pause between dials of a member that is not listening yet.
const DIAL_RETRY: Duration = Duration::from_millis(100);
/// How often a member still waiting for a peer's join asks whether the peer still forms that
/// generation ([`Wire::StillForming`]), and how long each ask may take.
const STILL_FORMING_EVERY: Duration = Duration::from_secs(1);
/// How long a fresh start refused by a member still waiting to be admitted waits before it
/// forms the first generation again (that member asks the others each second whether a group
/// lives, and starts once none does).
pub(crate) const FRESH_START_RETRY: Duration = Duration::from_millis(500);
/// How often a joiner asks again to be admitted ([`Mesh::join_live`]).
pub const ENTER_REPEAT: Duration = Duration::from_secs(1);
/// How long a member keeps a joiner as pending after its last `Enter`: a few of its repeats,
/// so that a joiner that went away is not admitted (which would fail the admission).
pub const PENDING_FRESH: Duration = Duration::from_secs(3);
/// How often [`ProcessGroup::flush`] looks again.
const FLUSH_POLL: Duration = Duration::from_millis(5);
/// Bound on telling a member that the group failed.
const ABORT_TIMEOUT: Duration = Duration::from_secs(2);
