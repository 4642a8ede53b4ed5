//! Typed errors per operation: bind, connect, accept, and everything on a live link.

use std::net::SocketAddr;

use crate::codec::CodecError;
use crate::frame::FrameError;
use crate::node::NodeId;
use crate::tls::TlsError;

/// Why [`Endpoint::bind`](crate::Endpoint::bind) failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The UDP socket could not be created, sized or bound.
    #[error("cannot bind UDP socket: {0}")]
    Io(#[from] std::io::Error),
    /// The node's credentials are unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A value in the transport configuration is out of range for QUIC.
    #[error("invalid transport configuration: {0}")]
    Config(String),
}

/// Why [`Endpoint::connect`](crate::Endpoint::connect) failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Handshake and identity hello did not finish within `connect_timeout`.
    #[error("connecting to {addr} timed out after {timeout_ms} ms")]
    Timeout {
        /// The address dialed.
        addr: SocketAddr,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// The peer does not speak our protocol version (no common ALPN).
    #[error("protocol version mismatch with {addr}: we speak {ours}")]
    ProtocolVersionMismatch {
        /// The address dialed.
        addr: SocketAddr,
        /// Our ALPN token.
        ours: String,
    },
    /// The TLS handshake failed on a certificate: the peer refused ours, or we refused its.
    #[error("TLS handshake with {addr} refused: {reason}")]
    CertificateRejected {
        /// The address dialed.
        addr: SocketAddr,
        /// The TLS alert or verification error.
        reason: String,
    },
    /// The peer refused our identity claim: it does not match our certificate.
    #[error("{addr} refused our identity claim {claimed}: it does not match our certificate")]
    IdentityMismatch {
        /// The address dialed.
        addr: SocketAddr,
        /// What we claimed.
        claimed: NodeId,
    },
    /// The peer's certificate names another node than the one we meant to dial.
    #[error("dialed {expected} at {addr} but its certificate names {found}")]
    UnexpectedPeer {
        /// The address dialed.
        addr: SocketAddr,
        /// The node we meant to reach.
        expected: NodeId,
        /// The node its certificate names.
        found: NodeId,
    },
    /// The connection failed during the handshake for another reason.
    #[error("connection to {addr} failed during the handshake: {reason}")]
    ConnectionLost {
        /// The address dialed.
        addr: SocketAddr,
        /// quinn's description.
        reason: String,
    },
    /// Our own credentials are unusable for a client configuration.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The endpoint cannot dial (closed, or an invalid address).
    #[error("cannot dial {addr}: {reason}")]
    Endpoint {
        /// The address dialed.
        addr: SocketAddr,
        /// quinn's description.
        reason: String,
    },
}

/// Why an incoming connection was refused; [`Endpoint::accept`](crate::Endpoint::accept)
/// reports it and keeps serving others.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The client offered no protocol version we speak.
    #[error("protocol version mismatch with {addr}: it does not speak {ours}")]
    ProtocolVersionMismatch {
        /// The client's address.
        addr: SocketAddr,
        /// Our ALPN token.
        ours: String,
    },
    /// The client's certificate is missing, self-signed, from another CA, or invalid.
    #[error("refused {addr} at the TLS handshake: {reason}")]
    CertificateRejected {
        /// The client's address.
        addr: SocketAddr,
        /// The TLS alert or verification error.
        reason: String,
    },
    /// The client claimed an identity other than the one its certificate names.
    #[error("{addr} claimed to be {claimed} but its certificate names {certified}")]
    IdentityMismatch {
        /// The client's address.
        addr: SocketAddr,
        /// What it claimed.
        claimed: NodeId,
        /// What its certificate names.
        certified: NodeId,
    },
    /// The identity hello was malformed.
    #[error("bad hello from {addr}: {reason}")]
    BadHello {
        /// The client's address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// Handshake and hello did not finish within `connect_timeout`.
    #[error("handshake with {addr} timed out after {timeout_ms} ms")]
    Timeout {
        /// The client's address.
        addr: SocketAddr,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// The client closed its own connection before the hello was done: it gave up dialling
    /// (a dial that lost a race with the other side's, a probe that had its answer). Not a
    /// refusal: nothing was wrong with the client.
    #[error("{addr} closed its connection during the handshake: {reason}")]
    Abandoned {
        /// The client's address.
        addr: SocketAddr,
        /// quinn's description.
        reason: String,
    },
    /// The connection failed during the handshake for another reason.
    #[error("connection from {addr} failed during the handshake: {reason}")]
    ConnectionLost {
        /// The client's address.
        addr: SocketAddr,
        /// quinn's description.
        reason: String,
    },
}

impl AcceptError {
    /// The address of the refused client.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::ProtocolVersionMismatch { addr, .. }
            | Self::CertificateRejected { addr, .. }
            | Self::IdentityMismatch { addr, .. }
            | Self::BadHello { addr, .. }
            | Self::Timeout { addr, .. }
            | Self::Abandoned { addr, .. }
            | Self::ConnectionLost { addr, .. } => *addr,
        }
    }
}

/// Why a request, a one-way send, or receiving on a link failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No complete reply within `request_timeout`.
    #[error("no reply from {peer} within {timeout_ms} ms")]
    Timeout {
        /// The peer.
        peer: NodeId,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// The connection is gone: closed, idle timeout (peer dead or frozen), or reset.
    #[error("connection to {peer} lost: {reason}")]
    ConnectionLost {
        /// The peer.
        peer: NodeId,
        /// Why, as quinn reports it.
        reason: String,
    },
    /// The peer refused this message (it reset or stopped the stream).
    #[error("{peer} rejected the message: {reason}")]
    Rejected {
        /// The peer.
        peer: NodeId,
        /// The reason code it gave.
        reason: RejectReason,
    },
    /// A frame exceeds a limit: ours before sending, or the peer's frame as received.
    #[error("frame to/from {peer} too large: {error}")]
    FrameTooLarge {
        /// The peer.
        peer: NodeId,
        /// Which limit.
        error: FrameError,
    },
    /// The peer's response found no room in our receive budget within
    /// `in_flight_wait_timeout` (SEC-2).
    #[error("response from {peer} refused: {error}")]
    OverBudget {
        /// The peer.
        peer: NodeId,
        /// Which budget, and how long the response waited.
        error: FrameError,
    },
    /// A frame received from the peer is malformed (truncated, trailing bytes…).
    #[error("malformed frame from {peer}: {error}")]
    Malformed {
        /// The peer.
        peer: NodeId,
        /// What was wrong.
        error: FrameError,
    },
    /// A header failed to encode or decode as the expected message type.
    #[error("message to/from {peer} failed to encode or decode: {error}")]
    Codec {
        /// The peer.
        peer: NodeId,
        /// What was wrong.
        error: CodecError,
    },
}

impl LinkError {
    /// Whether the connection itself is gone (as opposed to one message failing).
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Self::ConnectionLost { .. })
    }

    pub(crate) fn from_frame(peer: &NodeId, error: FrameError) -> Self {
        let peer = peer.clone();
        match error {
            FrameError::TooLarge { .. } => Self::FrameTooLarge { peer, error },
            FrameError::Reset { code } => Self::Rejected {
                peer,
                reason: RejectReason::from_code(code),
            },
            FrameError::ConnectionLost { reason } => Self::ConnectionLost { peer, reason },
            FrameError::OverBudget { .. } => Self::OverBudget { peer, error },
            FrameError::Truncated { .. } | FrameError::TrailingBytes | FrameError::Stream(_) => {
                Self::Malformed { peer, error }
            }
        }
    }
}

/// Why a receiver refused a message, carried as the QUIC stream error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The frame broke a limit or the framing rules.
    MalformedFrame,
    /// The receiver dropped the request without responding.
    NoResponse,
    /// The receiver's handler refused the message (e.g. it did not decode).
    Refused,
    /// The frame did not arrive completely within the receiver's `request_timeout`.
    Timeout,
    /// The receiver failed to send its response (e.g. it exceeded a limit).
    ResponseFailed,
    /// The receiver had no room for the frame in its receive budget within its
    /// `in_flight_wait_timeout` (SEC-2); the same message may succeed later.
    Busy,
    /// A code this version does not know.
    Unknown(u64),
}

impl RejectReason {
    /// The stream error code for this reason.
    pub fn code(self) -> u64 {
        match self {
            Self::MalformedFrame => 1,
            Self::NoResponse => 2,
            Self::Refused => 3,
            Self::Timeout => 4,
            Self::ResponseFailed => 5,
            Self::Busy => 6,
            Self::Unknown(code) => code,
        }
    }

    /// The reason for a stream error code.
    pub fn from_code(code: u64) -> Self {
        match code {
            1 => Self::MalformedFrame,
            2 => Self::NoResponse,
            3 => Self::Refused,
            4 => Self::Timeout,
            5 => Self::ResponseFailed,
            6 => Self::Busy,
            other => Self::Unknown(other),
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MalformedFrame => f.write_str("malformed frame"),
            Self::NoResponse => f.write_str("dropped without a response"),
            Self::Refused => f.write_str("refused by the handler"),
            Self::Timeout => f.write_str("frame incomplete within the timeout"),
            Self::ResponseFailed => f.write_str("response could not be sent"),
            Self::Busy => f.write_str("receive budget exhausted"),
            Self::Unknown(code) => write!(f, "unknown code {code}"),
        }
    }
}
