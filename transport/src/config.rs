//! Transport limits and timeouts, one struct shared by both ends of every connection.

use std::time::Duration;

/// Limits and timeouts for an [`Endpoint`](crate::Endpoint) and all its connections.
///
/// [`TransportConfig::default`] is for production; [`TransportConfig::for_tests`] keeps the
/// same limits with timeouts short enough for tests on loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// Largest encoded header a frame may carry (bytes), checked before reading it.
    pub frame_bytes_max: u32,
    /// Largest sum of blob lengths in one frame (bytes), checked before reading them.
    pub blob_bytes_max: u64,
    /// Most blobs one frame may carry.
    pub blobs_per_frame_max: u32,
    /// Bound on one request: open, write, and read of the whole response.
    pub request_timeout: Duration,
    /// Bound on a QUIC+TLS handshake plus the identity hello, on both sides.
    pub connect_timeout: Duration,
    /// How often an idle connection sends a keep-alive; well below `idle_timeout`.
    pub keep_alive_interval: Duration,
    /// Failure-detection budget: a connection that hears nothing for this long is lost.
    pub idle_timeout: Duration,
    /// UDP socket send and receive buffer size (bytes), set with socket2.
    pub socket_buffer_bytes: usize,
    /// Most concurrent requests (bidirectional streams) a peer may open to us.
    pub bidi_streams_max: u32,
    /// Most concurrent one-way messages (unidirectional streams) a peer may open to us.
    pub uni_streams_max: u32,
    /// Per-stream flow-control window (bytes).
    pub stream_window_bytes: u32,
    /// Per-connection flow-control window (bytes), bounding what a peer may buffer in us.
    pub connection_window_bytes: u32,
    /// Most received messages queued for [`Connection::accept_incoming`](crate::Connection::accept_incoming).
    pub incoming_queue_max: usize,
    /// Most bytes of incoming frames one connection may have in flight (SEC-2): the declared
    /// lengths of frames being received or waiting for
    /// [`Connection::accept_incoming`](crate::Connection::accept_incoming), and of responses
    /// being received. A frame declaring more than this takes the whole budget, so it passes
    /// when it is alone.
    pub connection_in_flight_bytes_max: u64,
    /// Most bytes of incoming frames the whole endpoint (the node) may have in flight, summed
    /// over its connections (SEC-2); at least `connection_in_flight_bytes_max`.
    pub node_in_flight_bytes_max: u64,
    /// How long a frame waits for room in those budgets before it is refused with
    /// [`RejectReason::Busy`](crate::RejectReason::Busy) (a response:
    /// [`LinkError::OverBudget`](crate::LinkError::OverBudget)).
    pub in_flight_wait_timeout: Duration,
    /// Most handshakes an endpoint runs at once; more wait.
    pub handshakes_in_flight_max: usize,
    /// Most established connections queued for [`Endpoint::accept`](crate::Endpoint::accept).
    pub accept_queue_max: usize,
    /// Largest UDP payload (bytes) this endpoint accepts and path-MTU discovery probes for;
    /// by default [`UDP_PAYLOAD_LARGEST`], the most it may be (binding an endpoint refuses
    /// more, naming why). Discovery settles on what the path carries (about 1,452 on
    /// Ethernet, about 8,952 with jumbo frames), so a high bound costs a few probes there,
    /// while on loopback one packet carries up to 64 KiB and the per-packet cost (packet
    /// building, acks, system calls, wake-ups) is divided accordingly. quinn's batches of
    /// datagrams go out whole whatever the size ([`WholeBatches`](crate::socket::WholeBatches)).
    pub udp_payload_max: u16,
    /// Protocol version sent in ALPN as `cohort/<n>`; change it only to test a mismatch.
    pub protocol_version: u16,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            frame_bytes_max: 16 * MIB as u32,
            blob_bytes_max: 256 * MIB,
            blobs_per_frame_max: 1024,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_millis(750),
            idle_timeout: Duration::from_secs(3),
            socket_buffer_bytes: 4 * MIB as usize,
            bidi_streams_max: 256,
            uni_streams_max: 256,
            stream_window_bytes: 16 * MIB as u32,
            connection_window_bytes: 64 * MIB as u32,
            incoming_queue_max: 1024,
            // Far above what the links carry in a round trip (1.4 GB/s moves 1 GiB in under a
            // second), so they bound memory without throttling; one connection holds at least
            // one largest frame (16 MiB header plus 256 MiB of blobs).
            connection_in_flight_bytes_max: 512 * MIB,
            node_in_flight_bytes_max: 1024 * MIB,
            in_flight_wait_timeout: Duration::from_secs(10),
            handshakes_in_flight_max: 64,
            accept_queue_max: 64,
            udp_payload_max: UDP_PAYLOAD_LARGEST,
            protocol_version: crate::PROTOCOL_VERSION,
        }
    }
}

impl TransportConfig {
    /// The production limits with timeouts short enough for loopback tests.
    pub fn for_tests() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            keep_alive_interval: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(800),
            in_flight_wait_timeout: Duration::from_secs(2),
            ..Self::default()
        }
    }

    /// The ALPN token for [`TransportConfig::protocol_version`].
    pub fn alpn(&self) -> Vec<u8> {
        format!("{ALPN_PREFIX}{}", self.protocol_version).into_bytes()
    }
}

/// ALPN tokens are `cohort/<version>`.
pub const ALPN_PREFIX: &str = "cohort/";

const MIB: u64 = 1024 * 1024;
/// The smallest UDP payload every QUIC path must carry.
pub const UDP_PAYLOAD_MIN: u16 = 1_200;
/// The largest [`TransportConfig::udp_payload_max`] an endpoint takes: the most payload one
/// UDP datagram carries over IPv4 ([`UDP_SEND_MAX`](crate::socket::UDP_SEND_MAX)).
pub const UDP_PAYLOAD_LARGEST: u16 = crate::socket::UDP_SEND_MAX as u16;
