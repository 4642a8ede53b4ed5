//! The QUIC endpoint of one node: binds a UDP socket, dials peers, accepts peers, and runs
//! the mutual-TLS handshake plus identity hello for every connection.
//!
//! Calling protocol:
//! 1. [`Endpoint::bind`] (or [`Endpoint::bind_with_socket`] under chaos) inside a tokio
//!    runtime; the endpoint starts accepting at once.
//! 2. [`Endpoint::connect`] to dial a peer by address and expected [`NodeId`].
//! 3. Loop on [`Endpoint::accept`]: each item is a verified [`Connection`] or the reason one
//!    peer was refused; a refusal never stops the loop. `None` means the endpoint is closed.
//! 4. [`Endpoint::close`] ends every connection; [`Endpoint::wait_idle`] lets the close flush.
//!
//! Credentials rotate without a restart: [`Endpoint::rotate_credentials`] (or the watch of a
//! certificates directory, [`crate::reload`]) puts new ones in place for the handshakes that
//! follow, in both directions; connections already up keep theirs.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bincode::{Decode, Encode};
use quinn::{ConnectionError, TokioRuntime, VarInt};
use tokio::sync::{mpsc, Mutex, Semaphore};

use crate::budget::{self, ByteBudget, InFlight, InFlightStats};
use crate::codec::CodecError;
use crate::config::TransportConfig;
use crate::connection::{duration_ms, Connection};
use crate::error::{AcceptError, BindError, ConnectError};
use crate::frame::{read_frame, write_frame, FrameError, FrameLimits};
use crate::node::NodeId;
use crate::socket::AsyncUdpSocket;
use crate::tls::{self, NodeCredentials};
use crate::Frame;

/// One node's QUIC endpoint, both client and server. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("node", &self.inner.node)
            .field("addr", &self.inner.quinn.local_addr().ok())
            .finish()
    }
}

impl Endpoint {
    /// Binds a UDP socket at `addr` (send and receive buffers sized per `config`) and starts
    /// accepting connections. Must be called inside a tokio runtime.
    pub fn bind(
        addr: SocketAddr,
        creds: NodeCredentials,
        config: TransportConfig,
    ) -> Result<Self, BindError> {
        let socket = crate::socket::bind_udp(addr, &config)?;
        let socket = crate::socket::wrap_udp(socket)?;
        Self::bind_with_socket(socket, creds, config)
    }

    /// Like [`Endpoint::bind`] over a socket of the caller's making (the chaos socket).
    pub fn bind_with_socket(
        socket: Arc<dyn AsyncUdpSocket>,
        creds: NodeCredentials,
        config: TransportConfig,
    ) -> Result<Self, BindError> {
        creds.node.validate().map_err(tls::TlsError::from)?;
        budget::check_config(&config).map_err(|e| BindError::Config(e.to_string()))?;
        let node_budget = ByteBudget::new("node", config.node_in_flight_bytes_max);
        let config = Arc::new(config);
        let transport = Arc::new(quinn_transport(&config)?);
        let server = server_config(&creds, &config, transport.clone())?;
        let client = client_config(&creds.ca_cert_pem, Some(&creds), &config, transport.clone())
            .map_err(BindError::Tls)?;

        let quinn = quinn::Endpoint::new_with_abstract_socket(
            quinn_endpoint_config(&config)?,
            Some(server),
            Arc::new(crate::socket::WholeBatches::new(socket)),
            Arc::new(TokioRuntime),
        )?;
        let (tx, rx) = mpsc::channel(config.accept_queue_max.max(1));
        let acceptor = tokio::spawn(accept_loop(
            quinn.clone(),
            creds.node.clone(),
            config.clone(),
            node_budget.clone(),
            tx,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                quinn,
                node: creds.node.clone(),
                creds: std::sync::RwLock::new(creds),
                config,
                transport,
                client: std::sync::RwLock::new(client),
                accepted: Mutex::new(rx),
                acceptor,
                node_budget,
            }),
        })
    }

    /// This node's identity.
    pub fn node(&self) -> &NodeId {
        &self.inner.node
    }

    /// Puts `creds` (a new certificate and key for this node, and the CA certificates to
    /// trust) in place of the current ones for every handshake from now on: the certificate
    /// this endpoint presents as server and as client, and the CAs it checks peers against.
    /// Connections already up are not touched. Refused, changing nothing, if `creds` name
    /// another node or do not make a valid TLS configuration. To rotate the cluster CA,
    /// trust both CAs (both certificates in the CA file) until every node holds a certificate
    /// of the new one.
    pub fn rotate_credentials(&self, creds: NodeCredentials) -> Result<(), tls::TlsError> {
        if creds.node != self.inner.node {
            return Err(tls::TlsError::NodeName(format!(
                "new credentials name {}, this endpoint is {}",
                creds.node, self.inner.node
            )));
        }
        let server = server_config(&creds, &self.inner.config, self.inner.transport.clone())
            .map_err(|e| match e {
                BindError::Tls(e) => e,
                other => tls::TlsError::Config(other.to_string()),
            })?;
        let client = client_config(
            &creds.ca_cert_pem,
            Some(&creds),
            &self.inner.config,
            self.inner.transport.clone(),
        )?;
        self.inner.quinn.set_server_config(Some(server));
        *write(&self.inner.client) = client;
        *write(&self.inner.creds) = creds;
        Ok(())
    }

    /// The credentials this endpoint presents and trusts now.
    pub fn credentials(&self) -> NodeCredentials {
        read(&self.inner.creds).clone()
    }

    /// The configuration every connection of this endpoint runs under.
    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// The node's receive budget and what all its connections' incoming frames hold of it
    /// (SEC-2); [`Connection::in_flight`] gives one connection's share.
    pub fn in_flight(&self) -> InFlightStats {
        self.inner.node_budget.stats()
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.quinn.local_addr()
    }

    /// Dials `expected_peer` at `addr`: TLS handshake (its certificate must name
    /// `expected_peer` and chain to our CA), then our identity hello, all within
    /// `connect_timeout`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        expected_peer: &NodeId,
    ) -> Result<Connection, ConnectError> {
        let client = read(&self.inner.client).clone();
        self.connect_inner(addr, expected_peer, client, &self.inner.node)
            .await
    }

    /// Test path: dials presenting `client` (or no certificate) and claiming `claimed`, to
    /// check that the peer refuses what it must. Never use it for real traffic.
    #[doc(hidden)]
    pub async fn connect_as(
        &self,
        addr: SocketAddr,
        expected_peer: &NodeId,
        client: Option<&NodeCredentials>,
        claimed: &NodeId,
    ) -> Result<Connection, ConnectError> {
        let ca_cert_pem = read(&self.inner.creds).ca_cert_pem.clone();
        let config = client_config(
            &ca_cert_pem,
            client,
            &self.inner.config,
            self.inner.transport.clone(),
        )?;
        self.connect_inner(addr, expected_peer, config, claimed)
            .await
    }

    /// Waits for the next incoming connection. `Some(Err(_))` reports one refused peer and
    /// the endpoint goes on serving; `None` means the endpoint is closed.
    pub async fn accept(&self) -> Option<Result<Connection, AcceptError>> {
        self.inner.accepted.lock().await.recv().await
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.inner
            .quinn
            .close(VarInt::from_u32(CLOSE_ENDPOINT), b"endpoint closed");
        self.inner.acceptor.abort();
    }

    /// Waits (at most `connect_timeout`) for closed connections to finish telling their peers.
    pub async fn wait_idle(&self) {
        let _ = tokio::time::timeout(
            self.inner.config.connect_timeout,
            self.inner.quinn.wait_idle(),
        )
        .await;
    }

    async fn connect_inner(
        &self,
        addr: SocketAddr,
        expected: &NodeId,
        client: quinn::ClientConfig,
        claimed: &NodeId,
    ) -> Result<Connection, ConnectError> {
        let config = &self.inner.config;
        expected.validate().map_err(|e| ConnectError::Endpoint {
            addr,
            reason: e.to_string(),
        })?;
        let connecting = self
            .inner
            .quinn
            .connect_with(client, addr, &expected.dns_name())
            .map_err(|e| ConnectError::Endpoint {
                addr,
                reason: e.to_string(),
            })?;
        let handshake = async {
            let conn = connecting
                .await
                .map_err(|e| connect_error(addr, claimed, config, &e))?;
            let found = peer_node_id(&conn).map_err(|e| ConnectError::CertificateRejected {
                addr,
                reason: e.to_string(),
            })?;
            if &found != expected {
                conn.close(VarInt::from_u32(CLOSE_UNEXPECTED_PEER), b"unexpected peer");
                return Err(ConnectError::UnexpectedPeer {
                    addr,
                    expected: expected.clone(),
                    found,
                });
            }
            let hello = Hello {
                protocol_version: config.protocol_version,
                node: claimed.clone(),
            };
            let exchanged = async {
                let (mut send, mut recv) = conn.open_bi().await?;
                let frame = Frame::encode(&hello, Vec::new(), HELLO_BYTES_MAX)?;
                write_frame(&mut send, &frame, &HELLO_LIMITS).await?;
                let ack = read_frame(&mut recv, &HELLO_LIMITS, &mut InFlight::unmetered()).await?;
                Ok::<_, HelloError>(ack.decode::<HelloAck>(HELLO_BYTES_MAX)?)
            }
            .await;
            match exchanged {
                Ok(_) => Ok(Connection::new(
                    conn,
                    found,
                    config.clone(),
                    self.inner.node_budget.clone(),
                )),
                Err(error) => Err(match conn.close_reason() {
                    Some(closed) => connect_error(addr, claimed, config, &closed),
                    None => {
                        conn.close(VarInt::from_u32(CLOSE_BAD_HELLO), b"bad hello ack");
                        ConnectError::ConnectionLost {
                            addr,
                            reason: error.to_string(),
                        }
                    }
                }),
            }
        };
        match tokio::time::timeout(config.connect_timeout, handshake).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                addr,
                timeout_ms: duration_ms(config.connect_timeout),
            }),
        }
    }
}

/// The connecting side's identity claim, sent on the first stream after the TLS handshake.
#[derive(Debug, Encode, Decode)]
struct Hello {
    protocol_version: u16,
    node: NodeId,
}

/// The accepting side's answer to a valid [`Hello`].
#[derive(Debug, Encode, Decode)]
struct HelloAck {
    node: NodeId,
}

pub(crate) struct Inner {
    quinn: quinn::Endpoint,
    /// This node: what every credentials put in place must name.
    node: NodeId,
    /// The credentials in place (rotated by [`Endpoint::rotate_credentials`]).
    creds: std::sync::RwLock<NodeCredentials>,
    config: Arc<TransportConfig>,
    transport: Arc<quinn::TransportConfig>,
    /// The client side of every dial from now on (rotated with `creds`).
    client: std::sync::RwLock<quinn::ClientConfig>,
    accepted: Mutex<mpsc::Receiver<Result<Connection, AcceptError>>>,
    acceptor: tokio::task::JoinHandle<()>,
    node_budget: Arc<ByteBudget>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Runs each incoming handshake on its own task (at most `handshakes_in_flight_max` at once)
/// so that a slow or hostile client never holds up the others.
async fn accept_loop(
    quinn: quinn::Endpoint,
    node: NodeId,
    config: Arc<TransportConfig>,
    node_budget: Arc<ByteBudget>,
    tx: mpsc::Sender<Result<Connection, AcceptError>>,
) {
    let slots = Arc::new(Semaphore::new(config.handshakes_in_flight_max.max(1)));
    while let Some(incoming) = quinn.accept().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (node, config, tx) = (node.clone(), config.clone(), tx.clone());
        let node_budget = node_budget.clone();
        tokio::spawn(async move {
            let result = server_handshake(incoming, &node, &config, node_budget).await;
            drop(slot);
            match result {
                Ok(conn) => {
                    // An unaccepted connection is closed rather than held forever.
                    if let Err(mpsc::error::SendTimeoutError::Timeout(Ok(conn))) =
                        tx.send_timeout(Ok(conn), config.connect_timeout).await
                    {
                        tracing::warn!(peer = %conn.peer(), "accept queue full; closing connection");
                        conn.close();
                    }
                }
                Err(error @ AcceptError::Abandoned { .. }) => {
                    // The client's own choice: nothing to warn about, nothing to report.
                    tracing::debug!(%error, "an incoming connection was given up by its client");
                }
                Err(error) => {
                    tracing::warn!(%error, "refused an incoming connection");
                    // Refusals are reported if there is room; they never block the loop.
                    let _ = tx.try_send(Err(error));
                }
            }
        });
    }
}

async fn server_handshake(
    incoming: quinn::Incoming,
    node: &NodeId,
    config: &Arc<TransportConfig>,
    node_budget: Arc<ByteBudget>,
) -> Result<Connection, AcceptError> {
    let addr = incoming.remote_address();
    let handshake = async {
        let conn = incoming.await.map_err(|e| accept_error(addr, config, &e))?;
        let certified = match peer_node_id(&conn) {
            Ok(id) => id,
            Err(e) => {
                let reason = e.to_string();
                conn.close(VarInt::from_u32(CLOSE_BAD_CERTIFICATE), reason.as_bytes());
                return Err(AcceptError::CertificateRejected { addr, reason });
            }
        };
        let hello = async {
            let (send, mut recv) = conn.accept_bi().await?;
            let frame = read_frame(&mut recv, &HELLO_LIMITS, &mut InFlight::unmetered()).await?;
            let hello = frame.decode::<Hello>(HELLO_BYTES_MAX)?;
            Ok::<_, HelloError>((send, hello))
        }
        .await;
        let (mut send, hello) = match hello {
            Ok(ok) => ok,
            // A client that closed its own connection gave up dialling: not a bad hello.
            Err(HelloError::Stream(error)) if closed_by_client(&error) => {
                return Err(AcceptError::Abandoned {
                    addr,
                    reason: error.to_string(),
                })
            }
            Err(error) => {
                conn.close(VarInt::from_u32(CLOSE_BAD_HELLO), b"bad hello");
                return Err(match conn.close_reason() {
                    Some(ConnectionError::LocallyClosed) | None => AcceptError::BadHello {
                        addr,
                        reason: error.to_string(),
                    },
                    Some(other) => AcceptError::ConnectionLost {
                        addr,
                        reason: other.to_string(),
                    },
                });
            }
        };
        if hello.protocol_version != config.protocol_version {
            conn.close(
                VarInt::from_u32(CLOSE_BAD_HELLO),
                b"protocol version mismatch",
            );
            return Err(AcceptError::ProtocolVersionMismatch {
                addr,
                ours: String::from_utf8_lossy(&config.alpn()).into_owned(),
            });
        }
        if hello.node != certified {
            conn.close(
                VarInt::from_u32(CLOSE_IDENTITY_MISMATCH),
                b"identity claim does not match certificate",
            );
            return Err(AcceptError::IdentityMismatch {
                addr,
                claimed: hello.node,
                certified,
            });
        }
        let ack = Frame::encode(
            &HelloAck { node: node.clone() },
            Vec::new(),
            HELLO_BYTES_MAX,
        )
        .map_err(|e| AcceptError::BadHello {
            addr,
            reason: e.to_string(),
        })?;
        write_frame(&mut send, &ack, &HELLO_LIMITS)
            .await
            .map_err(|e| AcceptError::ConnectionLost {
                addr,
                reason: e.to_string(),
            })?;
        Ok(Connection::new(
            conn,
            certified,
            config.clone(),
            node_budget,
        ))
    };
    match tokio::time::timeout(config.connect_timeout, handshake).await {
        Ok(result) => result,
        Err(_) => Err(AcceptError::Timeout {
            addr,
            timeout_ms: duration_ms(config.connect_timeout),
        }),
    }
}

/// A lock's value for reading, even after a panic elsewhere (the value is replaced whole).
fn read<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The server side of every handshake: `creds`' certificate, client certificates checked
/// against its CAs.
fn server_config(
    creds: &NodeCredentials,
    config: &TransportConfig,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, BindError> {
    let server_tls = tls::rustls_server_config(creds, config.alpn())?;
    let server_crypto = quinn::crypto::rustls::QuicServerConfig::try_from(server_tls)
        .map_err(|e| BindError::Config(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport);
    Ok(server)
}

fn client_config(
    ca_cert_pem: &str,
    client: Option<&NodeCredentials>,
    config: &TransportConfig,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, tls::TlsError> {
    let rustls = tls::rustls_client_config(ca_cert_pem, client, config.alpn())?;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(rustls)
        .map_err(|e| tls::TlsError::Config(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport);
    Ok(client)
}

fn quinn_transport(config: &TransportConfig) -> Result<quinn::TransportConfig, BindError> {
    let idle = quinn::IdleTimeout::try_from(config.idle_timeout).map_err(|_| {
        BindError::Config(format!("idle_timeout {:?} too large", config.idle_timeout))
    })?;
    if config.keep_alive_interval >= config.idle_timeout {
        return Err(BindError::Config(format!(
            "keep_alive_interval {:?} must be below idle_timeout {:?}",
            config.keep_alive_interval, config.idle_timeout
        )));
    }
    let mut transport = quinn::TransportConfig::default();
    transport.mtu_discovery_config(Some(mtu_discovery(config)));
    transport.congestion_controller_factory(Arc::new(congestion(config)));
    transport
        .max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(config.keep_alive_interval))
        .max_concurrent_bidi_streams(VarInt::from_u32(config.bidi_streams_max))
        .max_concurrent_uni_streams(VarInt::from_u32(config.uni_streams_max))
        .stream_receive_window(VarInt::from_u32(config.stream_window_bytes))
        .receive_window(VarInt::from_u32(config.connection_window_bytes))
        .send_window(u64::from(config.connection_window_bytes));
    Ok(transport)
}

/// Cubic (quinn's default controller) with an initial window that carries a path-MTU probe
/// beside the usual ten packets' worth (14,720 bytes, RFC 9002): quinn sends a probe, a ping
/// padded up to the size it tries (up to [`TransportConfig::udp_payload_max`], 64 KiB by
/// default), whenever a connection has nothing else to send, and counts it in flight until it
/// is acknowledged or lost. With the usual window, a probe sent right after the handshake
/// left no room for the next message (an answer waited a round trip behind it, or a lost
/// probe's timeout on a path that does not carry it).
pub(crate) fn congestion(config: &TransportConfig) -> quinn::congestion::CubicConfig {
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(INITIAL_WINDOW_PACKETS_BYTES + u64::from(config.udp_payload_max));
    cubic
}

/// Ten packets of 1,472 bytes: the initial window RFC 9002 recommends, quinn's default.
const INITIAL_WINDOW_PACKETS_BYTES: u64 = 14_720;

/// Path-MTU discovery up to [`TransportConfig::udp_payload_max`].
pub(crate) fn mtu_discovery(config: &TransportConfig) -> quinn::MtuDiscoveryConfig {
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(config.udp_payload_max);
    mtu
}

/// The endpoint-wide settings: the largest UDP payload accepted from peers.
pub(crate) fn quinn_endpoint_config(
    config: &TransportConfig,
) -> Result<quinn::EndpointConfig, BindError> {
    use crate::config::{UDP_PAYLOAD_LARGEST, UDP_PAYLOAD_MIN};
    let bad = |why: &str| {
        BindError::Config(format!(
            "udp_payload_max {} outside {UDP_PAYLOAD_MIN}..={UDP_PAYLOAD_LARGEST}{why}",
            config.udp_payload_max
        ))
    };
    if config.udp_payload_max > UDP_PAYLOAD_LARGEST {
        return Err(bad(
            ": no UDP datagram over IPv4 carries more than 65,507 bytes of payload",
        ));
    }
    let mut endpoint = quinn::EndpointConfig::default();
    endpoint
        .max_udp_payload_size(config.udp_payload_max)
        .map_err(|_| bad(""))?;
    Ok(endpoint)
}

/// Why the node a peer's certificate names could not be read.
#[derive(Debug, thiserror::Error)]
enum PeerIdentityError {
    /// The peer presented no certificate.
    #[error("peer presented no certificate")]
    NoCertificate,
    /// quinn's peer identity is not the rustls certificate chain it should be.
    #[error("unexpected peer identity type")]
    UnexpectedIdentityType,
    /// The peer's certificate chain is empty.
    #[error("peer presented an empty certificate chain")]
    EmptyChain,
    /// The leaf certificate names no valid node.
    #[error(transparent)]
    NodeName(#[from] tls::TlsError),
}

/// Why the identity hello or its ack did not go through once the TLS handshake had.
#[derive(Debug, thiserror::Error)]
enum HelloError {
    /// The hello's stream could not be opened or accepted: the connection failed or closed.
    #[error(transparent)]
    Stream(#[from] ConnectionError),
    /// The hello's frame could not be written or read whole.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The hello did not encode or decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// The node named by the peer's (already CA-verified) leaf certificate.
fn peer_node_id(conn: &quinn::Connection) -> Result<NodeId, PeerIdentityError> {
    let identity = conn
        .peer_identity()
        .ok_or(PeerIdentityError::NoCertificate)?;
    let certs = identity
        .downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
        .map_err(|_| PeerIdentityError::UnexpectedIdentityType)?;
    let leaf = certs.first().ok_or(PeerIdentityError::EmptyChain)?;
    Ok(tls::node_id_from_cert(leaf)?)
}

/// What went wrong, as seen from the QUIC close that ended a handshake.
enum Failure {
    ProtocolVersion,
    Certificate(String),
    IdentityMismatch,
    Other(String),
}

fn classify(error: &ConnectionError) -> Failure {
    let tls_alert = |code: quinn::TransportErrorCode, reason: String| {
        let code = u64::from(code);
        if (0x100..=0x1ff).contains(&code) {
            let alert = (code - 0x100) as u8;
            if alert == NO_APPLICATION_PROTOCOL_ALERT {
                return Failure::ProtocolVersion;
            }
            let name = rustls::AlertDescription::from(alert);
            return Failure::Certificate(if reason.is_empty() {
                format!("TLS alert {name:?}")
            } else {
                format!("TLS alert {name:?}: {reason}")
            });
        }
        Failure::Other(error.to_string())
    };
    match error {
        ConnectionError::TransportError(e) => tls_alert(e.code, e.reason.clone()),
        ConnectionError::ConnectionClosed(close) => tls_alert(
            close.error_code,
            String::from_utf8_lossy(&close.reason).into_owned(),
        ),
        ConnectionError::ApplicationClosed(close)
            if close.error_code == VarInt::from_u32(CLOSE_IDENTITY_MISMATCH) =>
        {
            Failure::IdentityMismatch
        }
        ConnectionError::ApplicationClosed(close)
            if close.error_code == VarInt::from_u32(CLOSE_BAD_CERTIFICATE) =>
        {
            Failure::Certificate(String::from_utf8_lossy(&close.reason).into_owned())
        }
        other => Failure::Other(other.to_string()),
    }
}

fn connect_error(
    addr: SocketAddr,
    claimed: &NodeId,
    config: &TransportConfig,
    error: &ConnectionError,
) -> ConnectError {
    match classify(error) {
        Failure::ProtocolVersion => ConnectError::ProtocolVersionMismatch {
            addr,
            ours: String::from_utf8_lossy(&config.alpn()).into_owned(),
        },
        Failure::Certificate(reason) => ConnectError::CertificateRejected { addr, reason },
        Failure::IdentityMismatch => ConnectError::IdentityMismatch {
            addr,
            claimed: claimed.clone(),
        },
        Failure::Other(reason) => ConnectError::ConnectionLost { addr, reason },
    }
}

fn accept_error(
    addr: SocketAddr,
    config: &TransportConfig,
    error: &ConnectionError,
) -> AcceptError {
    if closed_by_client(error) {
        return AcceptError::Abandoned {
            addr,
            reason: error.to_string(),
        };
    }
    match classify(error) {
        Failure::ProtocolVersion => AcceptError::ProtocolVersionMismatch {
            addr,
            ours: String::from_utf8_lossy(&config.alpn()).into_owned(),
        },
        Failure::Certificate(reason) => AcceptError::CertificateRejected { addr, reason },
        Failure::IdentityMismatch | Failure::Other(_) => AcceptError::ConnectionLost {
            addr,
            reason: error.to_string(),
        },
    }
}

/// Whether the client closed the connection itself, as the application does when it gives up a
/// dial (a normal application close, which during the TLS handshake travels as the transport
/// error APPLICATION_ERROR without its code), rather than the connection failing, being
/// refused, or the client refusing us (a close with another code).
fn closed_by_client(error: &ConnectionError) -> bool {
    match error {
        ConnectionError::ApplicationClosed(close) => {
            close.error_code == VarInt::from_u32(CLOSE_NORMAL)
        }
        ConnectionError::ConnectionClosed(close) => {
            close.error_code == quinn::TransportErrorCode::APPLICATION_ERROR
        }
        _ => false,
    }
}

/// Connection close codes (QUIC application error codes).
pub(crate) const CLOSE_NORMAL: u32 = 0;
pub(crate) const CLOSE_IDENTITY_MISMATCH: u32 = 1;
pub(crate) const CLOSE_BAD_HELLO: u32 = 2;
pub(crate) const CLOSE_BAD_CERTIFICATE: u32 = 3;
pub(crate) const CLOSE_UNEXPECTED_PEER: u32 = 4;
pub(crate) const CLOSE_ENDPOINT: u32 = 5;

/// TLS alert `no_application_protocol`: the peers share no ALPN token, i.e. no version.
const NO_APPLICATION_PROTOCOL_ALERT: u8 = 120;

/// The hello and its ack are tiny; a hostile one cannot make us read more.
const HELLO_BYTES_MAX: u32 = 1024;
const HELLO_LIMITS: FrameLimits = FrameLimits {
    header_bytes_max: HELLO_BYTES_MAX,
    blobs_max: 0,
    blob_bytes_max: 0,
};
