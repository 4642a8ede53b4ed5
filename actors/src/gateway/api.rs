//! The gateway's public vocabulary: the [`RemoteMessage`] trait a message type implements
//! (with the [`Senders`] allowed to send it, SEC-2), the [`Remote`] envelope a local actor receives, [`GatewayConfig`], [`GatewayStats`],
//! [`PeerEvent`], and the typed errors ([`RemoteError`], [`RefusedReason`], [`RegisterError`]).
//! Data only: no IO, no state.

use std::time::Duration;

use actix::Message;
use bincode::{Decode, Encode};
use bytes::Bytes;
use cohort_transport::NodeId;

use crate::fencing::{Incarnation, IncarnationId};
use crate::heartbeat::{DeathCause, HeartbeatConfig};

/// A message type that can be sent to a named actor on another node.
///
/// `TAG` names the type on the wire; it must be unique among the types one actor accepts.
/// `SENDERS` names the roles allowed to send it (SEC-2); it has no default, so that a new
/// message type cannot forget to say who may send it.
pub trait RemoteMessage: Encode + Decode<()> + Send + 'static {
    /// The wire name of this message type.
    const TAG: &'static str;
    /// Who may send this message type (SEC-2): the receiving gateway checks it against the
    /// role in the sender's authenticated certificate before any handler runs.
    const SENDERS: Senders;
    /// The typed reply.
    type Reply: Encode + Decode<()> + Send + 'static;
}

/// The peers allowed to send a message type (SEC-2), by the role their certificate names
/// ([`NodeId::role`]). Roles are opaque strings to this crate: the application names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Senders {
    /// Every peer that authenticated with the cluster CA (SEC-1).
    Any,
    /// Only peers whose certificate names one of these roles. An empty list admits nobody.
    Roles(&'static [&'static str]),
}

impl Senders {
    /// Whether a peer whose certificate names `role` may send.
    pub fn allows(&self, role: &str) -> bool {
        match self {
            Senders::Any => true,
            Senders::Roles(roles) => roles.contains(&role),
        }
    }
}

impl std::fmt::Display for Senders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Senders::Any => f.write_str("any authenticated peer"),
            Senders::Roles(roles) => write!(f, "roles {roles:?}"),
        }
    }
}

/// What a local actor receives from the gateway: the message and who sent it.
#[derive(Debug)]
pub struct Remote<M: RemoteMessage> {
    /// The sender's incarnation, already checked against the fencing table.
    pub from: Incarnation<NodeId>,
    /// The message.
    pub msg: M,
    /// Raw byte blobs sent beside the message (tensors), as received: never re-encoded.
    pub blobs: Vec<Bytes>,
}

impl<M: RemoteMessage> Message for Remote<M> {
    type Result = M::Reply;
}

/// Gateway settings.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// This node's incarnation number; a restarted process must use a higher one.
    pub incarnation: IncarnationId,
    /// Heartbeat interval and the silence after which a peer is declared dead.
    pub heartbeat: HeartbeatConfig,
    /// Bound on a whole remote call (connect if needed, send, wait for the reply), unless the
    /// caller gives its own with [`RemoteRef::call_within`](super::RemoteRef::call_within).
    pub call_timeout: Duration,
    /// Largest encoded message or reply payload (bytes), checked before decoding.
    pub payload_bytes_max: usize,
    /// Most peers the gateway keeps connections to.
    pub peers_max: usize,
    /// Most (actor, message type) registrations.
    pub registrations_max: usize,
    /// Capacity of each [`Gateway::subscribe`](super::Gateway::subscribe) channel; a lagging subscriber loses events.
    pub subscriber_queue_max: usize,
    /// One-way messages handled at once per [`Gateway::register_fn`](super::Gateway::register_fn) registration.
    pub tells_in_flight_max: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            incarnation: IncarnationId(0),
            heartbeat: HeartbeatConfig::default(),
            call_timeout: Duration::from_secs(30),
            payload_bytes_max: 16 * 1024 * 1024,
            peers_max: 1024,
            registrations_max: 4096,
            subscriber_queue_max: 256,
            tells_in_flight_max: 1024,
        }
    }
}

/// Counters of incoming messages a gateway turned away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayStats {
    /// Messages (hellos, heartbeats, calls, one-way) rejected as stale (FENCE-1).
    pub stale_rejected: u64,
    /// Messages refused for any other reason (unknown actor, not authenticated, bad payload,
    /// sender not allowed).
    pub refused: u64,
    /// Of `refused`, the calls and one-way messages whose type the sender's role may not send
    /// (SEC-2).
    pub sender_not_allowed: u64,
}

/// A peer incarnation's life, as subscribers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEvent {
    /// The incarnation authenticated and is alive.
    Alive(Incarnation<NodeId>),
    /// The incarnation is dead (and fenced if it went silent).
    Dead {
        /// The incarnation.
        incarnation: Incarnation<NodeId>,
        /// Silence past the timeout, or superseded by a newer incarnation.
        cause: DeathCause,
    },
    /// A peer refused this node's own incarnation as outdated
    /// ([`RemoteError::Outdated`]): it knows `known`, which is not older than this one. No
    /// peer that knew the predecessor will ever admit this incarnation; the process should
    /// come back as a newer one.
    Outdated {
        /// The peer that refused.
        by: NodeId,
        /// The highest incarnation of this node it knows.
        known: IncarnationId,
    },
}

/// Why a remote call or send failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// No reply within the call timeout.
    #[error("no reply from {peer} within {timeout_ms} ms")]
    Timeout {
        /// The peer.
        peer: NodeId,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// The connection to the peer is gone or could not be made.
    #[error("peer {peer} lost: {reason}")]
    PeerLost {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: String,
    },
    /// A receive budget had no room (SEC-2), which is transient: the same message may go
    /// through later. Either the peer's in-flight byte budget was full, so the message was
    /// not delivered (its handler did not run); or ours was, for the reply, so the handler
    /// may have run, as after a [`RemoteError::Timeout`].
    #[error("{peer} is busy: {reason}")]
    Busy {
        /// The peer.
        peer: NodeId,
        /// Which budget was full.
        reason: String,
    },
    /// The peer (or this gateway) refused the message.
    #[error("{peer} refused the message: {reason}")]
    Refused {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: RefusedReason,
    },
    /// FENCE-1: this node's own incarnation is not newer than one `peer` already knows of this
    /// node (its clock stepped back past its predecessor's incarnation, or an incarnation was reused):
    /// `peer` refused its hello, and will refuse it as long as it runs with this incarnation.
    #[error("{peer} refused this node's incarnation as outdated: it knows {known} ({reason})")]
    Outdated {
        /// The peer that refused.
        peer: NodeId,
        /// The highest incarnation of this node the peer knows.
        known: IncarnationId,
        /// Why, in words.
        reason: String,
    },
    /// FENCE-1: the message came from, or targeted, an incarnation that is no longer current.
    #[error("stale incarnation talking to {peer}: {reason}")]
    Stale {
        /// The peer.
        peer: NodeId,
        /// Which incarnation was stale.
        reason: String,
    },
    /// The message failed to encode, or the reply failed to decode as the expected type.
    #[error("message to/from {peer} failed to encode or decode: {reason}")]
    Codec {
        /// The peer.
        peer: NodeId,
        /// What was wrong.
        reason: String,
    },
}

/// Why a receiver refused a message.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum RefusedReason {
    /// No actor of that name is registered on the receiving node.
    #[error("no actor named {0:?}")]
    NoSuchActor(String),
    /// The actor does not accept messages of that type.
    #[error("actor {actor:?} does not accept message type {tag:?}")]
    UnknownMessage {
        /// The actor.
        actor: String,
        /// The message type tag.
        tag: String,
    },
    /// The sender claimed an identity other than the one it authenticated as (SEC-1), or has not
    /// said hello on this connection.
    #[error("not authenticated: {0}")]
    NotAuthenticated(String),
    /// The payload did not decode as the message type, or broke the size limit.
    #[error("bad message: {0}")]
    BadMessage(String),
    /// The actor is registered but stopped before answering.
    #[error("actor {0:?} is unavailable")]
    ActorUnavailable(String),
    /// The gateway holds as many peers as its limit allows.
    #[error("too many peers")]
    TooManyPeers,
    /// SEC-2: the sender's certificate names a role that may not send this message type.
    #[error("message type {tag:?} may not be sent by role {role:?}")]
    SenderNotAllowed {
        /// The message type tag.
        tag: String,
        /// The role the sender's certificate names.
        role: String,
    },
    /// SEC-1: the TLS handshake of a dial refused a certificate (ours by the peer, or the
    /// peer's by us): permanent, unlike a peer not reachable yet. Made by the dialling gateway
    /// from the transport's error (its text), never sent by a peer; last, so that the variants
    /// before it keep their encoding.
    #[error("not authenticated: {0}")]
    CertificateRejected(String),
}

/// Why a registration failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// That actor already accepts that message type.
    #[error("actor {actor:?} already registered for message type {tag:?}")]
    Duplicate {
        /// The actor.
        actor: String,
        /// The message type tag.
        tag: String,
    },
    /// The gateway holds `registrations_max` registrations already.
    #[error("gateway already holds {0} registrations")]
    TooMany(usize),
}

#[cfg(test)]
mod tests {
    use super::Senders;

    #[test]
    fn sec2_senders_admit_exactly_their_roles() {
        assert!(Senders::Any.allows("anything"));
        let two = Senders::Roles(&["chief", "worker"]);
        assert!(two.allows("chief") && two.allows("worker"));
        assert!(!two.allows("ps") && !two.allows("") && !two.allows("Chief"));
        assert!(!Senders::Roles(&[]).allows("chief"));
        assert_eq!(two.to_string(), "roles [\"chief\", \"worker\"]");
    }
}
