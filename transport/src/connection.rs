//! An authenticated connection to one peer: requests, one-way messages, and incoming ones.
//!
//! Calling protocol:
//! 1. Get a `Connection` from [`Endpoint::connect`](crate::Endpoint::connect) or
//!    [`Endpoint::accept`](crate::Endpoint::accept); [`Connection::peer`] is the verified
//!    identity of the other side.
//! 2. Call [`Connection::request`] / [`Connection::send`] from any number of tasks.
//! 3. Loop on [`Connection::accept_incoming`] to serve what the peer sends; answer each
//!    [`Incoming::Request`] through its [`Responder`] (dropping it rejects the request).
//! 4. [`Connection::closed`] resolves when the peer is gone (closed, idle past the budget,
//!    reset); every pending call then fails with [`LinkError::ConnectionLost`].
//!
//! Each message travels on its own stream, so one slow or malformed message never holds up
//! another, and messages are delivered reliably but in no guaranteed order: a sender that needs
//! order must wait for a reply or number its messages.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bincode::{Decode, Encode};
use bytes::Bytes;
use quinn::{RecvStream, SendStream, VarInt};
use tokio::sync::{mpsc, Mutex};

use crate::budget::{ByteBudget, InFlight, InFlightStats, ReceiveBudget};
use crate::config::TransportConfig;
use crate::error::{LinkError, RejectReason};
use crate::frame::{read_frame, write_frame, write_raw, FrameError, FrameLimits};
use crate::node::NodeId;
use crate::Frame;

/// A live, mutually authenticated connection to one peer. Cheap to clone.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.inner.peer)
            .field("addr", &self.inner.quinn.remote_address())
            .finish()
    }
}

/// A message the peer sent us.
#[derive(Debug)]
pub enum Incoming {
    /// A request: answer it with `responder`.
    Request {
        /// The request.
        frame: Frame,
        /// Where the response goes.
        responder: Responder,
    },
    /// A one-way message: no answer expected.
    OneWay(Frame),
}

/// The way back to a requester. Dropping it without responding rejects the request with
/// [`RejectReason::NoResponse`].
pub struct Responder {
    send: Option<SendStream>,
    peer: NodeId,
    limits: FrameLimits,
    timeout: Duration,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("peer", &self.peer)
            .finish()
    }
}

impl Connection {
    /// The peer's identity, as named by its CA-verified certificate.
    pub fn peer(&self) -> &NodeId {
        &self.inner.peer
    }

    /// The peer's UDP address.
    pub fn remote_address(&self) -> SocketAddr {
        self.inner.quinn.remote_address()
    }

    /// The configuration this connection runs under.
    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// Current round-trip time estimate.
    pub fn rtt(&self) -> Duration {
        self.inner.quinn.rtt()
    }

    /// How many malformed frames from the peer were refused on this connection so far.
    pub fn rejected_frames(&self) -> u64 {
        self.inner.rejected_frames.load(Ordering::Relaxed)
    }

    /// This connection's receive budget and what its incoming frames hold of it (SEC-2);
    /// [`Endpoint::in_flight`](crate::Endpoint::in_flight) sums over the node.
    pub fn in_flight(&self) -> InFlightStats {
        self.inner.budget.connection().stats()
    }

    /// Sends a request and waits for its response, all within `request_timeout`.
    pub async fn request(&self, frame: Frame) -> Result<Frame, LinkError> {
        self.request_within(frame, self.inner.config.request_timeout)
            .await
    }

    /// Sends a request and waits for its response, all within `timeout` instead of
    /// `request_timeout`: for a request whose answer legitimately takes long (a whole training
    /// step). The connection's idle timeout still ends it when the peer goes silent.
    pub async fn request_within(
        &self,
        frame: Frame,
        timeout: Duration,
    ) -> Result<Frame, LinkError> {
        frame
            .check_limits(&self.inner.limits)
            .map_err(|e| self.frame_error(e))?;
        self.bounded_by(timeout, async {
            let (mut send, mut recv) = self.open_bi().await?;
            write_frame(&mut send, &frame, &self.inner.limits)
                .await
                .map_err(|e| self.frame_error(e))?;
            // The response is handed to the caller on return, which ends what it holds.
            let mut in_flight = self.inner.budget.start();
            read_frame(&mut recv, &self.inner.limits, &mut in_flight)
                .await
                .map_err(|e| self.frame_error(e))
        })
        .await
    }

    /// Sends a one-way message; returns once it is handed to QUIC (delivery is reliable while
    /// the connection lives, but not acknowledged to the caller).
    pub async fn send(&self, frame: Frame) -> Result<(), LinkError> {
        frame
            .check_limits(&self.inner.limits)
            .map_err(|e| self.frame_error(e))?;
        self.bounded(async {
            let mut send = self.open_uni().await?;
            write_frame(&mut send, &frame, &self.inner.limits)
                .await
                .map_err(|e| self.frame_error(e))
        })
        .await
    }

    /// Encodes `request` as the header, sends it with `blobs`, and decodes the response.
    pub async fn request_msg<Req: Encode, Resp: Decode<()>>(
        &self,
        request: &Req,
        blobs: Vec<Bytes>,
    ) -> Result<(Resp, Vec<Bytes>), LinkError> {
        let header_max = self.inner.config.frame_bytes_max;
        let frame = Frame::encode(request, blobs, header_max).map_err(|e| self.codec_error(e))?;
        let response = self.request(frame).await?;
        let msg = response
            .decode(header_max)
            .map_err(|e| self.codec_error(e))?;
        Ok((msg, response.blobs))
    }

    /// Encodes `msg` as the header and sends it one-way with `blobs`.
    pub async fn send_msg<M: Encode>(&self, msg: &M, blobs: Vec<Bytes>) -> Result<(), LinkError> {
        let frame = Frame::encode(msg, blobs, self.inner.config.frame_bytes_max)
            .map_err(|e| self.codec_error(e))?;
        self.send(frame).await
    }

    /// Waits for the next message from the peer. Frames that break the framing rules never
    /// get here: they are refused on their own stream and counted in
    /// [`Connection::rejected_frames`]. Fails once the connection is lost.
    pub async fn accept_incoming(&self) -> Result<Incoming, LinkError> {
        let mut incoming = self.inner.incoming.lock().await;
        match incoming.recv().await {
            // Handing the message over ends what it holds of the receive budget.
            Some(delivery) => Ok(delivery.incoming),
            None => Err(self.lost()),
        }
    }

    /// Resolves when the connection is lost, with the reason.
    pub async fn closed(&self) -> LinkError {
        let reason = self.inner.quinn.closed().await;
        self.lost_because(reason)
    }

    /// Why the connection was lost, or `None` while it lives.
    pub fn close_reason(&self) -> Option<LinkError> {
        self.inner
            .quinn
            .close_reason()
            .map(|reason| self.lost_because(reason))
    }

    /// Whether this side closed the connection (it, or its endpoint, was closed here), as
    /// opposed to the peer closing it or the link failing.
    pub fn closed_locally(&self) -> bool {
        matches!(
            self.inner.quinn.close_reason(),
            Some(quinn::ConnectionError::LocallyClosed)
        )
    }

    /// Whether the peer closed the connection on purpose (it closed the connection or its
    /// endpoint: its process is going away), as opposed to this side closing it or the link
    /// failing.
    pub fn closed_by_peer(&self) -> bool {
        matches!(
            self.inner.quinn.close_reason(),
            Some(quinn::ConnectionError::ApplicationClosed(_))
        )
    }

    /// Closes the connection now; pending calls on both sides fail with
    /// [`LinkError::ConnectionLost`].
    pub fn close(&self) {
        self.inner
            .quinn
            .close(VarInt::from_u32(crate::endpoint::CLOSE_NORMAL), b"closed");
    }

    /// Test path: writes `chunks` as they are onto a new request stream and reads the reply
    /// frame. Used to send malformed frames; never use it for real traffic.
    #[doc(hidden)]
    pub async fn raw_request(&self, chunks: Vec<Bytes>) -> Result<Frame, LinkError> {
        self.bounded(async {
            let (mut send, mut recv) = self.open_bi().await?;
            // A refusal can stop our writing early; the reply (or reset) says why.
            let written = write_raw(&mut send, chunks).await;
            let mut in_flight = self.inner.budget.start();
            match read_frame(&mut recv, &self.inner.limits, &mut in_flight).await {
                Ok(frame) => Ok(frame),
                Err(e) => Err(self.frame_error(written.err().unwrap_or(e))),
            }
        })
        .await
    }

    /// Test path: opens a request stream to write raw bytes on at the caller's pace, leaving it
    /// open in between; used to hold a frame half sent. Never use it for real traffic.
    #[doc(hidden)]
    pub async fn raw_open(&self) -> Result<RawRequest, LinkError> {
        let (send, recv) = self.bounded(self.open_bi()).await?;
        Ok(RawRequest {
            conn: self.clone(),
            send,
            recv,
        })
    }

    /// Test path: writes `chunks` as they are onto a new one-way stream.
    #[doc(hidden)]
    pub async fn raw_send(&self, chunks: Vec<Bytes>) -> Result<(), LinkError> {
        self.bounded(async {
            let mut send = self.open_uni().await?;
            write_raw(&mut send, chunks)
                .await
                .map_err(|e| self.frame_error(e))
        })
        .await
    }

    pub(crate) fn new(
        quinn: quinn::Connection,
        peer: NodeId,
        config: Arc<TransportConfig>,
        node_budget: Arc<ByteBudget>,
    ) -> Self {
        let limits = FrameLimits::from(&*config);
        let budget = ReceiveBudget::new(node_budget, &config);
        let (tx, rx) = mpsc::channel(config.incoming_queue_max.max(1));
        let rejected_frames = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn(serve_streams(
            quinn.clone(),
            StreamServer {
                tx,
                peer: peer.clone(),
                limits,
                timeout: config.request_timeout,
                rejected_frames: rejected_frames.clone(),
                budget: budget.clone(),
            },
        ));
        Self {
            inner: Arc::new(Inner {
                quinn,
                peer,
                limits,
                config,
                incoming: Mutex::new(rx),
                rejected_frames,
                budget,
                reader,
            }),
        }
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, LinkError>>,
    ) -> Result<T, LinkError> {
        self.bounded_by(self.inner.config.request_timeout, fut)
            .await
    }

    async fn bounded_by<T>(
        &self,
        timeout: Duration,
        fut: impl std::future::Future<Output = Result<T, LinkError>>,
    ) -> Result<T, LinkError> {
        match tokio::time::timeout(timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(match self.close_reason() {
                Some(lost) => lost,
                None => LinkError::Timeout {
                    peer: self.inner.peer.clone(),
                    timeout_ms: duration_ms(timeout),
                },
            }),
        }
    }

    async fn open_bi(&self) -> Result<(SendStream, RecvStream), LinkError> {
        self.inner
            .quinn
            .open_bi()
            .await
            .map_err(|e| self.lost_because(e))
    }

    async fn open_uni(&self) -> Result<SendStream, LinkError> {
        self.inner
            .quinn
            .open_uni()
            .await
            .map_err(|e| self.lost_because(e))
    }

    fn frame_error(&self, error: FrameError) -> LinkError {
        LinkError::from_frame(&self.inner.peer, error)
    }

    fn codec_error(&self, error: crate::codec::CodecError) -> LinkError {
        LinkError::Codec {
            peer: self.inner.peer.clone(),
            error,
        }
    }

    fn lost(&self) -> LinkError {
        match self.inner.quinn.close_reason() {
            Some(reason) => self.lost_because(reason),
            None => LinkError::ConnectionLost {
                peer: self.inner.peer.clone(),
                reason: "connection reader stopped".into(),
            },
        }
    }

    fn lost_because(&self, reason: quinn::ConnectionError) -> LinkError {
        LinkError::ConnectionLost {
            peer: self.inner.peer.clone(),
            reason: reason.to_string(),
        }
    }
}

impl Responder {
    /// Sends the response, within `request_timeout`.
    pub async fn respond(mut self, frame: Frame) -> Result<(), LinkError> {
        let Some(mut send) = self.send.take() else {
            return Ok(());
        };
        let result =
            tokio::time::timeout(self.timeout, write_frame(&mut send, &frame, &self.limits)).await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                let _ = send.reset(code(RejectReason::ResponseFailed));
                Err(LinkError::from_frame(&self.peer, error))
            }
            Err(_) => {
                let _ = send.reset(code(RejectReason::Timeout));
                Err(LinkError::Timeout {
                    peer: self.peer.clone(),
                    timeout_ms: duration_ms(self.timeout),
                })
            }
        }
    }

    /// Encodes `msg` as the response header and sends it with `blobs`.
    pub async fn respond_msg<M: Encode>(self, msg: &M, blobs: Vec<Bytes>) -> Result<(), LinkError> {
        match Frame::encode(msg, blobs, self.limits.header_bytes_max) {
            Ok(frame) => self.respond(frame).await,
            Err(error) => {
                let peer = self.peer.clone();
                self.reject(RejectReason::ResponseFailed);
                Err(LinkError::Codec { peer, error })
            }
        }
    }

    /// Refuses the request; the requester gets [`LinkError::Rejected`] with `reason`.
    pub fn reject(mut self, reason: RejectReason) {
        if let Some(mut send) = self.send.take() {
            let _ = send.reset(code(reason));
        }
    }

    /// The requester.
    pub fn peer(&self) -> &NodeId {
        &self.peer
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(mut send) = self.send.take() {
            let _ = send.reset(code(RejectReason::NoResponse));
        }
    }
}

/// A request stream written at the test's pace ([`Connection::raw_open`]). Dropping it
/// finishes what was written (quinn finishes a dropped stream).
#[doc(hidden)]
pub struct RawRequest {
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
}

impl std::fmt::Debug for RawRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRequest").finish_non_exhaustive()
    }
}

impl RawRequest {
    /// Writes `bytes` as they are, within `request_timeout`.
    pub async fn write(&mut self, bytes: Bytes) -> Result<(), LinkError> {
        let conn = self.conn.clone();
        let send = &mut self.send;
        conn.bounded(async {
            send.write_chunk(bytes)
                .await
                .map_err(|e| conn.frame_error(crate::frame::write_error(e)))
        })
        .await
    }

    /// Finishes the stream and reads the reply frame (or the refusal), within
    /// `request_timeout`.
    pub async fn finish_and_reply(mut self) -> Result<Frame, LinkError> {
        let conn = self.conn.clone();
        // A stream the peer already refused cannot finish; the reply then says why.
        let _ = self.send.finish();
        conn.bounded(async {
            let mut in_flight = conn.inner.budget.start();
            read_frame(&mut self.recv, &conn.inner.limits, &mut in_flight)
                .await
                .map_err(|e| conn.frame_error(e))
        })
        .await
    }
}

struct Inner {
    quinn: quinn::Connection,
    peer: NodeId,
    limits: FrameLimits,
    config: Arc<TransportConfig>,
    incoming: Mutex<mpsc::Receiver<Delivery>>,
    rejected_frames: Arc<AtomicU64>,
    budget: ReceiveBudget,
    reader: tokio::task::JoinHandle<()>,
}

/// A received message on its way to [`Connection::accept_incoming`], still holding its share
/// of the receive budget: a full queue is bounded by the budget too, not only by its length.
struct Delivery {
    incoming: Incoming,
    _in_flight: InFlight,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The reader holds a quinn handle; without this the connection would outlive us.
        self.reader.abort();
    }
}

/// What each stream-reading task needs; deliberately no connection handle, so that reading
/// tasks never keep a dropped connection alive.
#[derive(Clone)]
struct StreamServer {
    tx: mpsc::Sender<Delivery>,
    peer: NodeId,
    limits: FrameLimits,
    timeout: Duration,
    rejected_frames: Arc<AtomicU64>,
    budget: ReceiveBudget,
}

/// Accepts the peer's streams; each is read on its own task so that one slow or malformed
/// stream never holds up the others. quinn's stream limits bound how many run at once.
async fn serve_streams(quinn: quinn::Connection, server: StreamServer) {
    loop {
        tokio::select! {
            bi = quinn.accept_bi() => match bi {
                Ok((send, recv)) => {
                    tokio::spawn(server.clone().read_stream(Some(send), recv));
                }
                Err(_) => break,
            },
            uni = quinn.accept_uni() => match uni {
                Ok(recv) => {
                    tokio::spawn(server.clone().read_stream(None, recv));
                }
                Err(_) => break,
            },
        }
    }
}

impl StreamServer {
    async fn read_stream(self, send: Option<SendStream>, mut recv: RecvStream) {
        let mut in_flight = self.budget.start();
        let result = tokio::time::timeout(
            self.timeout,
            read_frame(&mut recv, &self.limits, &mut in_flight),
        )
        .await;
        let refuse = |reason: RejectReason, mut send: Option<SendStream>, mut recv: RecvStream| {
            let _ = recv.stop(code(reason));
            if let Some(send) = send.as_mut() {
                let _ = send.reset(code(reason));
            }
        };
        let frame = match result {
            Ok(Ok(frame)) => frame,
            Ok(Err(FrameError::ConnectionLost { .. } | FrameError::Reset { .. })) => return,
            Ok(Err(error @ FrameError::OverBudget { .. })) => {
                // Counted in the budget's stats; the frame was well formed.
                tracing::warn!(peer = %self.peer, %error, "refused a frame: receive budget exhausted");
                return refuse(RejectReason::Busy, send, recv);
            }
            Ok(Err(error)) => {
                self.rejected_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %self.peer, %error, "refused a malformed frame");
                return refuse(RejectReason::MalformedFrame, send, recv);
            }
            Err(_) => {
                self.rejected_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %self.peer, "refused a frame not complete within the request timeout");
                return refuse(RejectReason::Timeout, send, recv);
            }
        };
        let incoming = match send {
            Some(send) => Incoming::Request {
                frame,
                responder: Responder {
                    send: Some(send),
                    peer: self.peer.clone(),
                    limits: self.limits,
                    timeout: self.timeout,
                },
            },
            None => Incoming::OneWay(frame),
        };
        // If nobody accepts any more, dropping the message drops its responder, which
        // rejects the request.
        let _ = self
            .tx
            .send(Delivery {
                incoming,
                _in_flight: in_flight,
            })
            .await;
    }
}

fn code(reason: RejectReason) -> VarInt {
    VarInt::from_u64(reason.code()).unwrap_or(VarInt::MAX)
}

pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
