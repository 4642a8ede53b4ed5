//! A bare quinn stream, for benchmarks to measure cohort against in the same run.
//!
//! Same QUIC flow-control windows, socket buffers and TLS 1.3 (ring) as an [`Endpoint`](crate::Endpoint), but raw
//! bytes on one stream per message: no framing, no identity hello, no client authentication,
//! no limits and no message queue. Nothing in cohort's own paths uses it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::mpsc;

use crate::{NodeCredentials, NodeId, TransportConfig};

/// Why the baseline could not be set up or run.
#[derive(Debug, thiserror::Error)]
#[error("bare quinn baseline: {0}")]
pub struct BaselineError(String);

fn err(e: impl std::fmt::Display) -> BaselineError {
    BaselineError(e.to_string())
}

/// A client and a server endpoint on 127.0.0.1 joined by one bare quinn connection.
pub struct BarePair {
    conn: quinn::Connection,
    received: tokio::sync::Mutex<mpsc::UnboundedReceiver<u64>>,
    _server: quinn::Endpoint,
    _client: quinn::Endpoint,
}

impl BarePair {
    /// Sets up both ends with `server_creds`' certificate (the client checks it against the
    /// CA, the server asks for no client certificate). Call inside a tokio runtime.
    pub async fn new(
        server_id: &NodeId,
        server_creds: &NodeCredentials,
        config: &TransportConfig,
    ) -> Result<Self, BaselineError> {
        // cohort's own provider, so that the bare stream seals its packets as cohort does.
        let provider = crate::tls::provider();
        let certs = CertificateDer::pem_slice_iter(server_creds.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let key = PrivateKeyDer::from_pem_slice(server_creds.key_pem.as_bytes()).map_err(err)?;
        let mut server_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(err)?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(err)?;
        server_tls.alpn_protocols = vec![b"bare".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server_creds.ca_cert_pem.as_bytes()) {
            roots.add(cert.map_err(err)?).map_err(err)?;
        }
        let mut client_tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(err)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client_tls.alpn_protocols = vec![b"bare".to_vec()];

        let transport = Arc::new(same_windows(config));
        let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(
            quinn::crypto::rustls::QuicServerConfig::try_from(server_tls).map_err(err)?,
        ));
        server_config.transport_config(transport.clone());
        let mut client_config = quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(client_tls).map_err(err)?,
        ));
        client_config.transport_config(transport);

        let server = bare_endpoint(Some(server_config), config)?;
        let mut client = bare_endpoint(None, config)?;
        client.set_default_client_config(client_config);

        let (tx, rx) = mpsc::unbounded_channel();
        let acceptor = server.clone();
        tokio::spawn(async move {
            while let Some(incoming) = acceptor.accept().await {
                let Ok(conn) = incoming.await else { continue };
                let tx = tx.clone();
                let uni = conn.clone();
                tokio::spawn(async move {
                    while let Ok(mut recv) = uni.accept_uni().await {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            if let Ok(data) = recv.read_to_end(MESSAGE_BYTES_MAX).await {
                                let _ = tx.send(data.len() as u64);
                            }
                        });
                    }
                });
                tokio::spawn(async move {
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            if let Ok(data) = recv.read_to_end(ECHO_BYTES_MAX).await {
                                let _ = send.write_all(&data).await;
                                let _ = send.finish();
                            }
                        });
                    }
                });
            }
        });
        let addr = server.local_addr().map_err(err)?;
        let conn = client.connect(addr, &server_id.dns_name()).map_err(err)?;
        let conn = tokio::time::timeout(config.connect_timeout, conn)
            .await
            .map_err(err)?
            .map_err(err)?;
        Ok(Self {
            conn,
            received: tokio::sync::Mutex::new(rx),
            _server: server,
            _client: client,
        })
    }

    /// Sends `count` one-way messages of `size` bytes, one stream each, and returns the
    /// goodput in MiB/s once the server has read them all.
    pub async fn goodput(&self, size: usize, count: usize) -> Result<f64, BaselineError> {
        let payload = Bytes::from(vec![0xa5u8; size.min(MESSAGE_BYTES_MAX)]);
        let mut received = self.received.lock().await;
        let started = Instant::now();
        let conn = self.conn.clone();
        let sender = tokio::spawn(async move {
            for _ in 0..count {
                let mut send = conn.open_uni().await.map_err(err)?;
                send.write_chunk(payload.clone()).await.map_err(err)?;
                send.finish().map_err(err)?;
            }
            Ok::<_, BaselineError>(())
        });
        let mut bytes = 0u64;
        for _ in 0..count {
            let got = tokio::time::timeout(WAIT_MAX, received.recv())
                .await
                .map_err(err)?;
            bytes += got.ok_or_else(|| BaselineError("server stopped".into()))?;
        }
        let elapsed = started.elapsed();
        sender.await.map_err(err)??;
        Ok(bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64())
    }

    /// `samples` request/response round trips of `bytes` bytes each, after a 10 % warm-up.
    pub async fn round_trips(
        &self,
        bytes: usize,
        samples: usize,
    ) -> Result<Vec<Duration>, BaselineError> {
        let payload = vec![7u8; bytes.min(ECHO_BYTES_MAX)];
        let mut times = Vec::with_capacity(samples);
        for i in 0..samples + samples / 10 {
            let started = Instant::now();
            let (mut send, mut recv) = self.conn.open_bi().await.map_err(err)?;
            send.write_all(&payload).await.map_err(err)?;
            send.finish().map_err(err)?;
            let reply = tokio::time::timeout(WAIT_MAX, recv.read_to_end(ECHO_BYTES_MAX))
                .await
                .map_err(err)?
                .map_err(err)?;
            let elapsed = started.elapsed();
            if reply.len() != payload.len() {
                return Err(BaselineError(format!(
                    "echo of {} bytes came back as {}",
                    payload.len(),
                    reply.len()
                )));
            }
            if i >= samples / 10 {
                times.push(elapsed);
            }
        }
        Ok(times)
    }
}

/// The same flow-control windows, stream limits, path-MTU bound and initial congestion window
/// cohort configures.
fn same_windows(config: &TransportConfig) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.mtu_discovery_config(Some(crate::endpoint::mtu_discovery(config)));
    transport.congestion_controller_factory(Arc::new(crate::endpoint::congestion(config)));
    transport
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(config.bidi_streams_max))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(config.uni_streams_max))
        .stream_receive_window(quinn::VarInt::from_u32(config.stream_window_bytes))
        .receive_window(quinn::VarInt::from_u32(config.connection_window_bytes))
        .send_window(u64::from(config.connection_window_bytes));
    transport
}

/// A quinn endpoint on the same kind of socket cohort binds (buffers sized alike, batches of
/// datagrams sent whole: [`crate::socket::WholeBatches`]).
fn bare_endpoint(
    server: Option<quinn::ServerConfig>,
    config: &TransportConfig,
) -> Result<quinn::Endpoint, BaselineError> {
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let socket = crate::socket::bind_udp(any, config).map_err(err)?;
    let socket = crate::socket::wrap_udp(socket).map_err(err)?;
    quinn::Endpoint::new_with_abstract_socket(
        crate::endpoint::quinn_endpoint_config(config).map_err(err)?,
        server,
        Arc::new(crate::socket::WholeBatches::new(socket)),
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(err)
}

/// Largest one-way message the baseline sends.
const MESSAGE_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Largest echoed request.
const ECHO_BYTES_MAX: usize = 64 * 1024;
/// Bound on any single wait of the baseline.
const WAIT_MAX: Duration = Duration::from_secs(60);
