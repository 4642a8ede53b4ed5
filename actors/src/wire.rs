//! The gateway's wire messages: the headers of the transport frames gateways exchange.
//!
//! Public so that tests and tools can speak the protocol directly (for example to check that a
//! gateway refuses a forged claim); actors use [`RemoteRef`](crate::RemoteRef) instead. The
//! exchange is described in [`crate::gateway`]. Every header is decoded by the transport's codec
//! with a size limit; a payload (blob 0) is decoded separately, with the gateway's
//! `payload_bytes_max`.

use bincode::{Decode, Encode};
use cohort_transport::NodeId;

use crate::fencing::{Incarnation, IncarnationId};
use crate::gateway::RefusedReason;

/// Request and one-way headers.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum WireMsg {
    /// First request on every connection, from the dialer, naming its incarnation.
    Hello {
        /// The dialer's incarnation; its node must be the one it authenticated as.
        from: Incarnation<NodeId>,
    },
    /// One-way liveness signal.
    Heartbeat {
        /// The sender's incarnation.
        from: Incarnation<NodeId>,
    },
    /// A request to an actor; the encoded message is blob 0, raw blobs follow.
    Call(Envelope),
    /// A one-way message to an actor; the encoded message is blob 0, raw blobs follow.
    Tell(Envelope),
}

/// Addressing of one actor message.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Envelope {
    /// The sender's incarnation.
    pub from: Incarnation<NodeId>,
    /// The receiver incarnation the sender means; any other is refused as stale (FENCE-1).
    pub to_incarnation: IncarnationId,
    /// The target actor's registered name.
    pub actor: String,
    /// The message type's [`RemoteMessage::TAG`](crate::RemoteMessage::TAG).
    pub tag: String,
    /// How long the caller waits for the reply, in milliseconds; the receiver gives up
    /// delivering the call then as well (at most 24 hours). 0 for one-way messages.
    pub reply_within_ms: u64,
}

/// Response headers.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum WireReply {
    /// Answer to [`WireMsg::Hello`]: the acceptor's incarnation.
    Hello {
        /// The acceptor's incarnation.
        me: Incarnation<NodeId>,
    },
    /// The actor's reply; the encoded reply is blob 0, raw blobs follow.
    Reply,
    /// The message was refused.
    Refused(RefusedReason),
    /// The message came from or targeted a stale incarnation (FENCE-1); says which.
    Stale(String),
    /// Answer to a [`WireMsg::Hello`] from an incarnation that is not newer than one the
    /// acceptor already knows of the same node (FENCE-1): the dialer's own incarnation is
    /// outdated (its clock stepped back, or it reused an incarnation). Carries the known incarnation.
    Outdated {
        /// The highest incarnation of the dialer's node the acceptor knows.
        known: IncarnationId,
        /// Why, in words.
        reason: String,
    },
}
