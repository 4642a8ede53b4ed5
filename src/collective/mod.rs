//! Collectives: all-reduce, reduce-scatter, all-gather, broadcast and barriers among the
//! members of a group.
//!
//! This module owns two groups with one contract: every member calls the same collectives in
//! the same order, a member that leaves or a peer that never arrives is an error within the
//! group's timeout, never a hang. [`LocalGroup`] is the in-process rendezvous of the replica
//! threads of one process, used by the local strategies' replica contexts. [`ProcessGroup`]
//! joins processes over cohort's transport (QUIC, mutual TLS): a ring for large tensors and a
//! direct exchange for small ones, results bit-identical on every member (DATA-1), a
//! membership generation on every message (EPOCH-1), typed errors for a lost member, members that
//! disagree or a member's failed step ([`CollectiveError`]), and the probes by which the
//! survivors of a lost member agree on whom to re-form with. A [`ProcessSpan`] joins the two:
//! a local group whose rounds go on across processes (MultiWorkerMirrored). With the feature
//! `nccl`, [`NcclComm`] all-reduces on the GPUs: one communicator per generation of a process group,
//! bootstrapped over it and aborted when it breaks; [`NcclLocal`] does it for the GPUs of one
//! process.
//!
//! It also owns the calling thread's replica (`CurrentReplica`): which member of which group
//! the thread is while a strategy runs a replica function on it. The strategies present it as
//! their `ReplicaContext`; a variable reads it to choose its copy and aggregate its updates.

#[macro_use]
mod element;
mod error;
mod group;
mod landing;
mod local;
#[cfg(feature = "nccl")]
mod nccl;
mod ops;
mod outgoing;
mod plain;
mod replica;
mod shm;
mod span;
mod wire;

pub use element::{Element, Reduction};
pub use error::CollectiveError;
pub(crate) use group::{
    boundary, entry, reforming, FormFailed, MemberAction, MemberExit, MemberMachine, MemberMessage,
    MemberSettings, Piece, INITIAL_DIGEST,
};
pub use group::{
    loopback_group, Entry, GroupConfig, GroupMember, Joiner, Leave, Mesh, Probed, ProcessGroup,
    ENTER_REPEAT, PENDING_FRESH,
};
pub use local::{LocalGroup, LocalMember};
#[cfg(feature = "nccl")]
pub use nccl::{
    gpu_count, nccl_version, visible_gpus, Gpu, NcclComm, NcclError, NcclId, NcclLocal, NcclVersion,
};
pub use ops::plan_buckets;
pub(crate) use replica::{
    current_replica, in_replica, outside_replica, with_current_replica, CurrentReplica,
};
pub use span::{NcclWaits, ProcessSpan};
