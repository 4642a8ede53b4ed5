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
    /// Largest UDP payload (bytes) this endpoint accepts and path-MTU discovery probes for.
    /// Discovery settles on what the path carries (about 1,452 on Ethernet), so a high bound
    /// costs little there, while on loopback it lets one packet carry several KiB and divides
    /// the per-packet cost (packet building, acks, syscalls) accordingly. At most
    /// [`UDP_PAYLOAD_BATCHED_MAX`] (binding an endpoint refuses more, naming why).
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
            udp_payload_max: UDP_PAYLOAD_MAX,
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
/// Default bound for path-MTU discovery: the largest payload of which quinn's segmentation
/// offload batch (up to 10 datagrams in one `sendmsg`, `UDP_SEGMENT`) still fits in one UDP
/// datagram of at most 65,507 bytes (10 × 6,400 = 64,000). Above about 6,550 a full batch
/// no longer fits and the kernel refuses it: measured on loopback, 16,000 ran `cohort bench
/// mwms` 17–21 % slower than the earlier default 4,000 (chosen below the sizes that
/// "collapsed" for that reason), while 6,400 carries a bare QUIC stream 22 % faster and the
/// parameter servers' push and pull 15 % (docs/benchmarks.md).
const UDP_PAYLOAD_MAX: u16 = 6_400;
/// The smallest UDP payload every QUIC path must carry.
pub const UDP_PAYLOAD_MIN: u16 = 1_200;
/// The largest [`TransportConfig::udp_payload_max`] an endpoint takes: quinn's batch of 10
/// segmentation-offload datagrams must fit in one UDP datagram over IPv4 (65,507 bytes), else
/// the kernel refuses the send (`EMSGSIZE`) and quinn drops the whole batch as it would a
/// path-MTU probe, so every full batch is lost and resent.
pub const UDP_PAYLOAD_BATCHED_MAX: u16 = 6_550;
