//! Collectives: all-reduce and barriers among the replicas of one step.
//!
//! This module owns the in-process collective ([`LocalGroup`]): a rendezvous of the replica
//! threads of one process, used by the local strategies' replica contexts. Later issues add the
//! ring over transport and NCCL (feature `nccl`) beside it; they keep the same contract: every
//! member calls the same collectives in the same order, a member that leaves or a peer that
//! never arrives is an error within the group's timeout, never a hang.
//!
//! It also owns the calling thread's replica ([`CurrentReplica`]): which member of which group
//! the thread is while a strategy runs a replica function on it. The strategies present it as
//! their `ReplicaContext`; a variable reads it to choose its copy and aggregate its updates.

mod local;
mod replica;

pub use local::{CollectiveError, LocalGroup, LocalMember};
pub(crate) use replica::{current_replica, in_replica, with_current_replica, CurrentReplica};
