//! cohort-transport: bytes between nodes. QUIC (quinn) with mutual TLS against a cluster CA,
//! bounded framing, and typed bincode messages. It knows nothing about
//! training: a node is an opaque [`NodeId`] `role/index`.
//!
//! # What it owns
//!
//! - [`tls`]: the cluster CA, per-node certificates naming `role/index`, rustls configs (TLS
//!   1.3, ring provider passed explicitly, never installed process-wide).
//! - [`Endpoint`]: binds UDP (buffers sized by socket2), dials and accepts. Every connection is
//!   mutually authenticated; there is no plaintext path. ALPN carries the protocol version
//!   (`cohort/6`); a mismatch fails with "protocol version mismatch". After the handshake the
//!   dialer claims its identity in a hello; the acceptor checks the claim equals the node its
//!   certificate names and closes the connection otherwise (SEC-1).
//! - [`Connection`]: request/response, one-way messages, incoming messages, loss detection
//!   (keep-alive plus idle timeout: a dead or frozen peer becomes
//!   [`LinkError::ConnectionLost`] within [`TransportConfig::idle_timeout`]).
//! - [`frame`] and [`codec`]: the wire format below and bincode 2 with a limit always set.
//! - [`budget`]: the bytes of incoming frames in flight, bounded per connection and per node.
//! - [`socket`]: the UDP socket (4 MiB buffers), the wrapper every endpoint puts around its
//!   socket so that quinn's batches of datagrams go out whole whatever the path's MTU
//!   ([`socket::WholeBatches`]: datagrams up to 64 KiB on loopback), and quinn's socket traits
//!   re-exported, so that `chaos` can slide a faulty socket under [`Endpoint::bind_with_socket`].
//!
//! # Wire format
//!
//! Each message travels on its own QUIC stream: a request on a bidirectional stream (the
//! response comes back on the same stream), a one-way message on a unidirectional one. Each
//! direction carries exactly one frame and is then finished:
//!
//! ```text
//!  0         4         8                    8+8n            8+8n+h
//!  +---------+---------+--------------------+---------------+--------+-----+----------+
//!  | h: u32  | n: u32  | len_0 .. len_{n-1} | header        | blob 0 | ... | blob n-1 |
//!  | LE      | LE      | u64 LE each        | h bytes       | len_0  |     | len_{n-1}|
//!  +---------+---------+--------------------+---------------+--------+-----+----------+
//!  header: one bincode-2 message (standard config, size limit set, no trailing bytes)
//!  blobs:  raw bytes (tensors as little-endian elements), never re-encoded
//! ```
//!
//! # Limits (defaults in [`TransportConfig`])
//!
//! | what                              | limit                                    | default  |
//! |-----------------------------------|------------------------------------------|----------|
//! | header bytes `h`                  | `frame_bytes_max`                        | 16 MiB   |
//! | blob count `n`                    | `blobs_per_frame_max`                    | 1024     |
//! | sum of blob lengths               | `blob_bytes_max`                         | 256 MiB  |
//! | a request, end to end             | `request_timeout` (or `request_within`)  | 30 s     |
//! | handshake plus hello              | `connect_timeout`                        | 5 s      |
//! | silence before loss               | `idle_timeout` (keep-alive every 750 ms) | 3 s      |
//! | concurrent streams                | `bidi_streams_max`, `uni_streams_max`    | 256 each |
//! | queued incoming messages          | `incoming_queue_max`                     | 1024     |
//! | frame bytes in flight, connection | `connection_in_flight_bytes_max`         | 512 MiB  |
//! | frame bytes in flight, node       | `node_in_flight_bytes_max`               | 1 GiB    |
//! | wait for room in those budgets    | `in_flight_wait_timeout`                 | 10 s     |
//!
//! Every length is checked against its limit before anything past it is read, and no buffer is
//! ever sized by a declared length alone: a part's chunks are kept as they arrive and its
//! buffer (exactly its length) is allocated once half of it has arrived, so memory follows what
//! the peer actually sent, at most twice over ([`frame`]). Bytes in flight are bounded per
//! connection and per node (SEC-2, [`budget`]): a frame reserves its declared length from both
//! budgets before its header is read and gives it back when it is handed to the application
//! (a response: when it is returned to the requester). A frame that finds no room within
//! `in_flight_wait_timeout` is refused with [`RejectReason::Busy`] (a response fails with
//! [`LinkError::OverBudget`]); a frame larger than a budget passes when it is alone. The
//! counters are in [`Connection::in_flight`] and [`Endpoint::in_flight`].
//!
//! A frame that breaks a rule (too large, truncated, trailing bytes) is refused on its own
//! stream with [`RejectReason::MalformedFrame`]; other streams of the connection go on. The
//! bincode decoder's own limit is chosen from the input length ([`codec`]), so a huge length
//! inside a small header is an error, not an allocation.

pub mod baseline;
pub mod budget;
pub mod codec;
pub mod config;
pub mod connection;
pub mod endpoint;
pub mod error;
pub mod frame;
pub mod node;
pub mod reload;
pub mod socket;
pub mod tls;

pub use budget::InFlightStats;
pub use bytes::Bytes;
pub use codec::CodecError;
pub use config::{TransportConfig, UDP_PAYLOAD_LARGEST, UDP_PAYLOAD_MIN};
pub use connection::{Connection, Incoming, Responder};
pub use endpoint::Endpoint;
pub use error::{AcceptError, BindError, ConnectError, LinkError, RejectReason};
pub use frame::{Frame, FrameError, FrameLimits};
pub use node::{NodeId, NodeIdError};
pub use tls::{
    ClusterCa, NodeCredentials, TlsError, CA_FILE, CA_VALIDITY_DEFAULT, NODE_VALIDITY_DEFAULT,
};

/// The wire protocol version, carried in ALPN as `cohort/<version>`. Bumped whenever an
/// encoding changes, so that nodes of two versions fail the handshake instead of misreading
/// each other (2: the gateway's typed refusal for a sender role SEC-2 does not allow; 3: a
/// worker's setup carries the variable layouts typed, and the parameter servers' refusals are
/// typed errors; 4: a push names which of its closure's updates it is, for closures of several
/// steps; 5: a closure and its pushes carry the learning rate the chief scheduled it with).
pub const PROTOCOL_VERSION: u16 = 6;
