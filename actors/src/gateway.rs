//! The node gateway: one per node, it owns the node's transport [`Endpoint`], delivers messages
//! from remote nodes to local actors registered by name, carries replies back, runs the
//! heartbeat failure detector for every peer it talks to, and enforces FENCE-1.
//!
//! # Protocol (over the transport's frames)
//!
//! Every frame header is a bincode-encoded [`WireMsg`] (requests and one-way messages) or
//! [`WireReply`] (responses), defined in [`crate::wire`]. A call's payload (the typed message,
//! bincode, at most `payload_bytes_max`) travels as blob 0, and raw byte blobs given with
//! [`RemoteRef::call_with_blobs`] (tensors) as blobs 1.., moved as whole buffers; a reply is
//! laid out the same way.
//!
//! ```text
//!  dialer                                  acceptor
//!  Hello{from: incarnation}     ──req──▶   admit(from) in the fencing table
//!                               ◀──rsp──   Hello{me: incarnation} | Stale | Refused
//!  Heartbeat{from}              ──1way─▶   (both directions, every heartbeat interval)
//!  Call{from, to_epoch, actor, tag, reply_within_ms} + payload, blobs
//!                               ──req──▶   deliver to actor `actor`
//!                               ◀──rsp──   Reply + payload, blobs | Refused | Stale
//!  Tell{from, to_epoch, actor, tag} + payload, blobs ──1way─▶ deliver, no reply
//! ```
//!
//! A call waits for its reply at most the gateway's `call_timeout`, or the longer bound given
//! to [`RemoteRef::call_within`]; the envelope carries it (`reply_within_ms`) and the receiver
//! stops delivering the call then too (never past 24 hours).
//!
//! # Fencing semantics (FENCE-1)
//!
//! - Every message names its sender's incarnation; the claimed node must be the node the peer
//!   authenticated as (SEC-1), else the message is refused.
//! - A message from an epoch older than the highest seen of that node is rejected as stale.
//! - When the heartbeat machine declares an incarnation dead, the gateway fences it: its
//!   connection is closed and anything later from that same epoch (e.g. a frozen process that
//!   wakes up after SIGCONT) is rejected as stale; only a restarted process, with a higher
//!   epoch, is admitted again.
//! - A call that targets an epoch other than the receiver's current one is rejected as stale,
//!   and a [`RemoteRef`] bound to an incarnation the sender has seen superseded or dead fails
//!   as stale without sending. The one way to still reach a fenced incarnation (to tell it
//!   that it is fenced) is [`Gateway::call_fenced`], which serves nothing that incarnation
//!   sends.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use actix::{Message, Recipient};
use bincode::{Decode, Encode};
use bytes::Bytes;
use cohort_transport::{
    codec, ConnectError, Connection, Endpoint, Frame, Incoming, LinkError, NodeId, Responder,
};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::fencing::{Admission, Epoch, FencingTable, Incarnation};
use crate::heartbeat::{DeathCause, Heard, HeartbeatConfig, HeartbeatEvent, HeartbeatMachine};
use crate::wire::{Envelope, WireMsg, WireReply};

/// A message type that can be sent to a named actor on another node.
///
/// `TAG` names the type on the wire; it must be unique among the types one actor accepts.
pub trait RemoteMessage: Encode + Decode<()> + Send + 'static {
    /// The wire name of this message type.
    const TAG: &'static str;
    /// The typed reply.
    type Reply: Encode + Decode<()> + Send + 'static;
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
    pub epoch: Epoch,
    /// Heartbeat interval and the silence after which a peer is declared dead.
    pub heartbeat: HeartbeatConfig,
    /// Bound on a whole remote call (connect if needed, send, wait for the reply), unless the
    /// caller gives its own with [`RemoteRef::call_within`].
    pub call_timeout: Duration,
    /// Largest encoded message or reply payload (bytes), checked before decoding.
    pub payload_bytes_max: usize,
    /// Most peers the gateway keeps connections to.
    pub peers_max: usize,
    /// Most (actor, message type) registrations.
    pub registrations_max: usize,
    /// Capacity of each [`Gateway::subscribe`] channel; a lagging subscriber loses events.
    pub subscriber_queue_max: usize,
    /// One-way messages handled at once per [`Gateway::register_fn`] registration.
    pub tells_in_flight_max: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            epoch: Epoch(0),
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
    /// Messages refused for any other reason (unknown actor, not authenticated, bad payload).
    pub refused: u64,
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
        /// Silence past the timeout, or superseded by a newer epoch.
        cause: DeathCause,
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
    /// The peer (or this gateway) refused the message.
    #[error("{peer} refused the message: {reason}")]
    Refused {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: RefusedReason,
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

/// A node's gateway. Cheap to clone; the last clone dropped (or [`Gateway::shutdown`]) closes
/// the endpoint and stops its tasks.
///
/// Calling protocol:
/// 1. Bind an [`Endpoint`] and call [`Gateway::start`] inside a tokio runtime (an actix system is
///    one) with this node's epoch in the config.
/// 2. [`register`](Self::register) local actors by name for each [`RemoteMessage`] type they
///    accept.
/// 3. [`connect`](Self::connect) to peers (or let them connect); each connection starts with a
///    hello that exchanges incarnations. [`resolve`](Self::resolve) connects and returns a
///    [`RemoteRef`] bound to the peer's current incarnation.
/// 4. [`subscribe`](Self::subscribe) to learn of peers alive and dead.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("me", &self.inner.me)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Starts serving `endpoint` as incarnation `config.epoch` of the endpoint's node.
    pub fn start(endpoint: Endpoint, config: GatewayConfig) -> Gateway {
        let me = Incarnation::new(endpoint.node().clone(), config.epoch);
        let inner = Arc::new(Inner {
            endpoint: endpoint.clone(),
            me,
            state: Mutex::new(State {
                fencing: FencingTable::new(),
                heartbeat: HeartbeatMachine::new(config.heartbeat),
                peers: HashMap::new(),
                addrs: HashMap::new(),
            }),
            handlers: Mutex::new(HashMap::new()),
            subscribers: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
            tasks: Mutex::new(Vec::new()),
            next_conn_id: std::sync::atomic::AtomicU64::new(0),
            stale_rejected: std::sync::atomic::AtomicU64::new(0),
            refused: std::sync::atomic::AtomicU64::new(0),
            config,
        });
        let weak = Arc::downgrade(&inner);
        let accept = tokio::spawn(accept_loop(endpoint, weak.clone()));
        let driver = tokio::spawn(heartbeat_driver(weak, inner.wake.clone()));
        lock(&inner.tasks).extend([accept, driver]);
        Gateway { inner }
    }

    /// This node's incarnation.
    pub fn incarnation(&self) -> &Incarnation<NodeId> {
        &self.inner.me
    }

    /// The endpoint's UDP address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// Delivers messages of type `M` addressed to `actor` to `recipient`.
    pub fn register<M: RemoteMessage>(
        &self,
        actor: &str,
        recipient: Recipient<Remote<M>>,
    ) -> Result<(), RegisterError> {
        self.insert_handler(actor, M::TAG, Arc::new(RecipientDispatch(recipient)))
    }

    /// Delivers messages of type `M` addressed to `actor` to `handler`, e.g. to forward them to a
    /// supervised [`ChildRef`](crate::ChildRef). `Err` refuses the message with that reason. A
    /// one-way message runs the handler in a task of its own and drops the reply; at most
    /// `tells_in_flight_max` such tasks run per registration, further messages are dropped.
    pub fn register_fn<M, F, Fut>(&self, actor: &str, handler: F) -> Result<(), RegisterError>
    where
        M: RemoteMessage,
        F: Fn(Remote<M>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<M::Reply, RefusedReason>> + Send + 'static,
    {
        self.register_fn_with_blobs(actor, move |m: Remote<M>| {
            let reply = handler(m);
            async move { reply.await.map(|r| (r, Vec::new())) }
        })
    }

    /// Like [`register_fn`](Self::register_fn), for a handler that answers raw byte blobs
    /// (tensors) beside its reply; the caller gets them from
    /// [`RemoteRef::call_with_blobs`].
    pub fn register_fn_with_blobs<M, F, Fut>(
        &self,
        actor: &str,
        handler: F,
    ) -> Result<(), RegisterError>
    where
        M: RemoteMessage,
        F: Fn(Remote<M>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(M::Reply, Vec<Bytes>), RefusedReason>>
            + Send
            + 'static,
    {
        let handler: Arc<HandlerFn<M>> = Arc::new(move |m: Remote<M>| Box::pin(handler(m)) as _);
        let dispatch = FnDispatch::<M> {
            handler,
            tells: Arc::new(tokio::sync::Semaphore::new(
                self.inner.config.tells_in_flight_max,
            )),
        };
        self.insert_handler(actor, M::TAG, Arc::new(dispatch))
    }

    fn insert_handler(
        &self,
        actor: &str,
        tag: &str,
        dispatch: Arc<dyn Dispatch>,
    ) -> Result<(), RegisterError> {
        let mut handlers = lock(&self.inner.handlers);
        let key = (actor.to_string(), tag.to_string());
        if handlers.contains_key(&key) {
            return Err(RegisterError::Duplicate {
                actor: key.0,
                tag: key.1,
            });
        }
        if handlers.len() >= self.inner.config.registrations_max {
            return Err(RegisterError::TooMany(handlers.len()));
        }
        handlers.insert(key, dispatch);
        Ok(())
    }

    /// Removes every registration of `actor`.
    pub fn unregister(&self, actor: &str) {
        lock(&self.inner.handlers).retain(|(name, _), _| name != actor);
    }

    /// Dials `node` at `addr` (unless a live connection exists), exchanges hellos, and returns the
    /// peer's current incarnation.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        node: &NodeId,
    ) -> Result<Incarnation<NodeId>, RemoteError> {
        lock(&self.inner.state).addrs.insert(node.clone(), addr);
        let timeout = self.inner.config.call_timeout;
        match tokio::time::timeout(timeout, self.inner.link_to(node)).await {
            Ok(result) => result.map(|(_, incarnation)| incarnation),
            Err(_) => Err(RemoteError::Timeout {
                peer: node.clone(),
                timeout_ms: millis(timeout),
            }),
        }
    }

    /// Connects to `node` at `addr` and returns a reference to its actor `actor`, bound to the
    /// node's current incarnation.
    pub async fn resolve<M: RemoteMessage>(
        &self,
        addr: SocketAddr,
        node: &NodeId,
        actor: &str,
    ) -> Result<RemoteRef<M>, RemoteError> {
        let target = self.connect(addr, node).await?;
        Ok(self.remote_ref(target, actor))
    }

    /// Calls `actor` on exactly the incarnation `target`, reached at `addr` over a connection
    /// of its own, even when this gateway has declared that incarnation dead or fenced it: the
    /// one way left to tell a fenced incarnation something, such as that it is fenced and
    /// should exit to come back as a new incarnation. FENCE-1 is unaffected: nothing the peer
    /// sends on that connection is served or counts as hearing from it, and the connection is
    /// closed after the reply. Fails as stale without sending when `addr` answers as another
    /// incarnation. Bounded by `call_timeout`.
    pub async fn call_fenced<M: RemoteMessage>(
        &self,
        addr: SocketAddr,
        target: &Incarnation<NodeId>,
        actor: &str,
        msg: &M,
    ) -> Result<M::Reply, RemoteError> {
        let inner = &self.inner;
        let peer = &target.node;
        let timeout = inner.config.call_timeout;
        let work = async {
            let conn = inner
                .endpoint
                .connect(addr, peer)
                .await
                .map_err(|e| connect_error(peer, e))?;
            let result = async {
                let answered = inner.say_hello(&conn, peer).await?;
                if answered != *target {
                    return Err(RemoteError::Stale {
                        peer: peer.clone(),
                        reason: format!(
                            "{peer} at {addr} runs {}, not {}",
                            answered.epoch, target.epoch
                        ),
                    });
                }
                let frame = inner.encode_message(
                    target,
                    actor,
                    msg,
                    Vec::new(),
                    WireKind::Call(timeout),
                )?;
                let reply = conn
                    .request_within(frame, timeout)
                    .await
                    .map_err(|e| link_error(peer, e))?;
                decode_reply::<M>(inner, peer, reply).map(|(reply, _)| reply)
            }
            .await;
            conn.close();
            result
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(RemoteError::Timeout {
                peer: peer.clone(),
                timeout_ms: millis(timeout),
            }),
        }
    }

    /// A reference to actor `actor` on incarnation `target`, without connecting yet.
    pub fn remote_ref<M: RemoteMessage>(
        &self,
        target: Incarnation<NodeId>,
        actor: &str,
    ) -> RemoteRef<M> {
        RemoteRef {
            gateway: self.clone(),
            target,
            actor: actor.to_string(),
            _msg: PhantomData,
        }
    }

    /// A channel of [`PeerEvent`]s from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<PeerEvent> {
        let (tx, rx) = mpsc::channel(self.inner.config.subscriber_queue_max.max(1));
        let mut subscribers = lock(&self.inner.subscribers);
        subscribers.retain(|s| !s.is_closed());
        subscribers.push(tx);
        rx
    }

    /// The highest epoch seen of `node`, and whether it is alive (not declared dead or fenced).
    pub fn peer_status(&self, node: &NodeId) -> Option<(Epoch, bool)> {
        let state = lock(&self.inner.state);
        state.heartbeat.peer(node)
    }

    /// Counters of what this gateway refused so far.
    pub fn stats(&self) -> GatewayStats {
        use std::sync::atomic::Ordering::Relaxed;
        GatewayStats {
            stale_rejected: self.inner.stale_rejected.load(Relaxed),
            refused: self.inner.refused.load(Relaxed),
        }
    }

    /// Closes the endpoint and stops the gateway's tasks.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// A typed reference to a named actor on one incarnation of a remote node.
pub struct RemoteRef<M: RemoteMessage> {
    gateway: Gateway,
    target: Incarnation<NodeId>,
    actor: String,
    _msg: PhantomData<fn(M) -> M::Reply>,
}

impl<M: RemoteMessage> Clone for RemoteRef<M> {
    fn clone(&self) -> Self {
        Self {
            gateway: self.gateway.clone(),
            target: self.target.clone(),
            actor: self.actor.clone(),
            _msg: PhantomData,
        }
    }
}

impl<M: RemoteMessage> std::fmt::Debug for RemoteRef<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRef")
            .field("target", &self.target)
            .field("actor", &self.actor)
            .field("tag", &M::TAG)
            .finish()
    }
}

impl<M: RemoteMessage> RemoteRef<M> {
    /// The incarnation this reference is bound to.
    pub fn target(&self) -> &Incarnation<NodeId> {
        &self.target
    }

    /// The actor's name on the target node.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Sends `msg` and waits (at most the gateway's `call_timeout`) for the typed reply. Blobs
    /// the receiver attaches to its reply are dropped; see [`call_with_blobs`](Self::call_with_blobs).
    pub async fn call(&self, msg: &M) -> Result<M::Reply, RemoteError> {
        self.call_with_blobs(msg, Vec::new())
            .await
            .map(|(reply, _)| reply)
    }

    /// Sends `msg` with raw byte `blobs` beside it (tensors: moved as whole buffers, never
    /// encoded element by element) and waits for the typed reply and the reply's blobs.
    pub async fn call_with_blobs(
        &self,
        msg: &M,
        blobs: Vec<Bytes>,
    ) -> Result<(M::Reply, Vec<Bytes>), RemoteError> {
        let timeout = self.gateway.inner.config.call_timeout;
        self.call_with_blobs_within(msg, blobs, timeout).await
    }

    /// Like [`call`](Self::call), but waits at most `timeout` instead of the gateway's
    /// `call_timeout`, here and at the receiver (the envelope carries it): for a call whose
    /// answer legitimately takes long, such as a whole training step. A peer that dies or goes
    /// silent still fails the call within the failure-detection budget (its connection is
    /// closed).
    pub async fn call_within(&self, msg: &M, timeout: Duration) -> Result<M::Reply, RemoteError> {
        self.call_with_blobs_within(msg, Vec::new(), timeout)
            .await
            .map(|(reply, _)| reply)
    }

    async fn call_with_blobs_within(
        &self,
        msg: &M,
        blobs: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<(M::Reply, Vec<Bytes>), RemoteError> {
        let inner = &self.gateway.inner;
        let peer = &self.target.node;
        let work = async {
            let (frame, conn) = self.prepare(msg, blobs, WireKind::Call(timeout)).await?;
            let reply = conn
                .request_within(frame, timeout)
                .await
                .map_err(|e| link_error(peer, e))?;
            decode_reply::<M>(inner, peer, reply)
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(RemoteError::Timeout {
                peer: peer.clone(),
                timeout_ms: millis(timeout),
            }),
        }
    }

    /// Sends `msg` one-way: returns once it is handed to the transport; no reply, no delivery
    /// acknowledgement.
    pub async fn tell(&self, msg: &M) -> Result<(), RemoteError> {
        self.tell_with_blobs(msg, Vec::new()).await
    }

    /// Sends `msg` one-way with raw byte `blobs` beside it.
    pub async fn tell_with_blobs(&self, msg: &M, blobs: Vec<Bytes>) -> Result<(), RemoteError> {
        let timeout = self.gateway.inner.config.call_timeout;
        let peer = &self.target.node;
        let work = async {
            let (frame, conn) = self.prepare(msg, blobs, WireKind::Tell).await?;
            conn.send(frame).await.map_err(|e| link_error(peer, e))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(RemoteError::Timeout {
                peer: peer.clone(),
                timeout_ms: millis(timeout),
            }),
        }
    }

    async fn prepare(
        &self,
        msg: &M,
        blobs: Vec<Bytes>,
        kind: WireKind,
    ) -> Result<(Frame, Connection), RemoteError> {
        let inner = &self.gateway.inner;
        let peer = &self.target.node;
        let (conn, current) = inner.link_to(peer).await?;
        if current.epoch != self.target.epoch {
            return Err(RemoteError::Stale {
                peer: peer.clone(),
                reason: format!(
                    "reference bound to {}, but {peer} is now at {}",
                    self.target.epoch, current.epoch
                ),
            });
        }
        let frame = inner.encode_message(&self.target, &self.actor, msg, blobs, kind)?;
        Ok((frame, conn))
    }
}

/// A request, with how long its caller waits for the reply, or a one-way message.
enum WireKind {
    Call(Duration),
    Tell,
}

// ---- internals ----

struct Inner {
    endpoint: Endpoint,
    me: Incarnation<NodeId>,
    config: GatewayConfig,
    state: Mutex<State>,
    handlers: Mutex<HashMap<(String, String), Arc<dyn Dispatch>>>,
    subscribers: Mutex<Vec<mpsc::Sender<PeerEvent>>>,
    wake: Arc<Notify>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    next_conn_id: std::sync::atomic::AtomicU64,
    stale_rejected: std::sync::atomic::AtomicU64,
    refused: std::sync::atomic::AtomicU64,
}

struct State {
    fencing: FencingTable<NodeId>,
    heartbeat: HeartbeatMachine<NodeId>,
    /// The connection used to send to each peer, with the peer incarnation it said hello as.
    peers: HashMap<NodeId, PeerLink>,
    /// Where to dial peers we connected to before.
    addrs: HashMap<NodeId, SocketAddr>,
}

#[derive(Clone)]
struct PeerLink {
    conn: Connection,
    /// Which [`ConnCtx`] this is, to tell connections to the same peer apart.
    conn_id: u64,
    incarnation: Incarnation<NodeId>,
}

/// One served connection: the peer authenticated as `conn.peer()`, and the incarnation it said
/// hello as, once it has.
struct ConnCtx {
    conn: Connection,
    id: u64,
    hello: Mutex<Option<Incarnation<NodeId>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn shutdown(&self) {
        self.endpoint.close();
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        let peers: Vec<_> = lock(&self.state).peers.drain().collect();
        for (_, link) in peers {
            link.conn.close();
        }
    }

    /// The live connection to `node` and the incarnation it runs, dialing and saying hello if
    /// there is none.
    async fn link_to(
        self: &Arc<Self>,
        node: &NodeId,
    ) -> Result<(Connection, Incarnation<NodeId>), RemoteError> {
        let (existing, addr) = {
            let state = lock(&self.state);
            (
                state.peers.get(node).cloned(),
                state.addrs.get(node).copied(),
            )
        };
        if let Some(link) = existing {
            // A live link to where the node is known to be is reused; a node known at a new
            // address (restarted elsewhere) is dialed afresh.
            let same_place = addr.is_none_or(|a| a == link.conn.remote_address());
            if link.conn.close_reason().is_none() && same_place {
                return Ok((link.conn, link.incarnation));
            }
        }
        let Some(addr) = addr else {
            return Err(RemoteError::PeerLost {
                peer: node.clone(),
                reason: "not connected and no known address".to_string(),
            });
        };
        let conn = self
            .endpoint
            .connect(addr, node)
            .await
            .map_err(|e| connect_error(node, e))?;
        let incarnation = match self.say_hello(&conn, node).await {
            Ok(incarnation) => incarnation,
            Err(e) => {
                conn.close();
                return Err(e);
            }
        };
        // The acceptor's incarnation goes through the same fencing as any message.
        if let Err(stale) = self.hear(&incarnation) {
            conn.close();
            return Err(RemoteError::Stale {
                peer: node.clone(),
                reason: stale,
            });
        }
        let ctx = self.conn_ctx(conn.clone(), Some(incarnation.clone()));
        if let Err(reason) = self.add_link(&ctx, &incarnation) {
            conn.close();
            return Err(RemoteError::Refused {
                peer: node.clone(),
                reason,
            });
        }
        spawn_serve(self, ctx);
        Ok((conn, incarnation))
    }

    /// Says hello on a new connection to `node` and returns the incarnation it answers as,
    /// without admitting it anywhere (the caller decides). The caller closes `conn` on error.
    async fn say_hello(
        &self,
        conn: &Connection,
        node: &NodeId,
    ) -> Result<Incarnation<NodeId>, RemoteError> {
        let hello = WireMsg::Hello {
            from: self.me.clone(),
        };
        let frame = Frame::encode(&hello, Vec::new(), self.endpoint.config().frame_bytes_max)
            .map_err(|e| RemoteError::Codec {
                peer: node.clone(),
                reason: e.to_string(),
            })?;
        let reply = conn.request(frame).await.map_err(|e| link_error(node, e))?;
        let reply: WireReply = reply
            .decode(self.endpoint.config().frame_bytes_max)
            .map_err(|e| RemoteError::Codec {
                peer: node.clone(),
                reason: e.to_string(),
            })?;
        match reply {
            WireReply::Hello { me } if &me.node == node => Ok(me),
            WireReply::Hello { me } => Err(RemoteError::Refused {
                peer: node.clone(),
                reason: RefusedReason::NotAuthenticated(format!(
                    "peer authenticated as {node} but said hello as {}",
                    me.node
                )),
            }),
            WireReply::Stale(reason) => Err(RemoteError::Stale {
                peer: node.clone(),
                reason,
            }),
            WireReply::Refused(reason) => Err(RemoteError::Refused {
                peer: node.clone(),
                reason,
            }),
            WireReply::Reply => Err(RemoteError::Codec {
                peer: node.clone(),
                reason: "unexpected reply to hello".to_string(),
            }),
        }
    }

    /// The frame of message `msg` (with `blobs`) to `actor` on incarnation `target`.
    fn encode_message<M: RemoteMessage>(
        &self,
        target: &Incarnation<NodeId>,
        actor: &str,
        msg: &M,
        blobs: Vec<Bytes>,
        kind: WireKind,
    ) -> Result<Frame, RemoteError> {
        let peer = &target.node;
        let payload =
            codec::encode(msg, self.config.payload_bytes_max).map_err(|e| RemoteError::Codec {
                peer: peer.clone(),
                reason: e.to_string(),
            })?;
        let reply_within_ms = match kind {
            WireKind::Call(timeout) => millis(timeout),
            WireKind::Tell => 0,
        };
        let envelope = Envelope {
            from: self.me.clone(),
            to_epoch: target.epoch,
            actor: actor.to_string(),
            tag: M::TAG.to_string(),
            reply_within_ms,
        };
        let header = match kind {
            WireKind::Call(_) => WireMsg::Call(envelope),
            WireKind::Tell => WireMsg::Tell(envelope),
        };
        let mut all = Vec::with_capacity(blobs.len() + 1);
        all.push(payload);
        all.extend(blobs);
        Frame::encode(&header, all, self.endpoint.config().frame_bytes_max).map_err(|e| {
            RemoteError::Codec {
                peer: peer.clone(),
                reason: e.to_string(),
            }
        })
    }

    fn conn_ctx(&self, conn: Connection, hello: Option<Incarnation<NodeId>>) -> Arc<ConnCtx> {
        let id = self
            .next_conn_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(ConnCtx {
            conn,
            id,
            hello: Mutex::new(hello),
        })
    }

    /// FENCE-1 gate for everything heard from a peer: admits `from` in the fencing table and
    /// feeds the heartbeat machine. `Err` carries why it is stale.
    fn hear(&self, from: &Incarnation<NodeId>) -> Result<(), String> {
        let now = now();
        let mut state = lock(&self.state);
        let admission = state
            .fencing
            .admit(from)
            .map_err(|stale| stale.to_string())?;
        if let Admission::Superseded { old } = &admission {
            if state
                .peers
                .get(&from.node)
                .is_some_and(|l| l.incarnation == *old)
            {
                if let Some(link) = state.peers.remove(&from.node) {
                    link.conn.close();
                }
            }
        }
        let heard = state
            .heartbeat
            .handle_heartbeat(now, from.node.clone(), from.epoch);
        drop(state);
        if heard == Heard::NewIncarnation {
            self.wake.notify_one();
        }
        match heard {
            Heard::Stale => Err(format!("{from} was declared dead")),
            Heard::Alive | Heard::NewIncarnation => Ok(()),
        }
    }

    fn add_link(
        &self,
        ctx: &ConnCtx,
        incarnation: &Incarnation<NodeId>,
    ) -> Result<(), RefusedReason> {
        let mut state = lock(&self.state);
        let replace = match state.peers.get(&incarnation.node) {
            None => {
                if state.peers.len() >= self.config.peers_max {
                    return Err(RefusedReason::TooManyPeers);
                }
                true
            }
            Some(link) => {
                link.conn.close_reason().is_some() || link.incarnation.epoch < incarnation.epoch
            }
        };
        if replace {
            state.peers.insert(
                incarnation.node.clone(),
                PeerLink {
                    conn: ctx.conn.clone(),
                    conn_id: ctx.id,
                    incarnation: incarnation.clone(),
                },
            );
        }
        Ok(())
    }

    fn publish(&self, event: PeerEvent) {
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|s| !s.is_closed());
        for s in subscribers.iter() {
            if s.try_send(event.clone()).is_err() {
                tracing::warn!(node = %self.me, "peer event subscriber lagging; event dropped");
            }
        }
    }

    /// Handles one request on a connection whose peer authenticated as `peer`. `hello` holds the
    /// incarnation the peer said hello as, once it has.
    async fn handle_request(
        self: &Arc<Self>,
        ctx: &ConnCtx,
        frame: Frame,
    ) -> Result<Frame, String> {
        let header_max = self.endpoint.config().frame_bytes_max;
        let reply = match frame.decode::<WireMsg>(header_max) {
            Err(e) => WireReply::Refused(RefusedReason::BadMessage(e.to_string())),
            Ok(WireMsg::Hello { from }) => self.handle_hello(ctx, from),
            Ok(WireMsg::Call(envelope)) => match self.check_envelope(ctx, &envelope) {
                Err(reply) => reply,
                Ok(()) => match split_payload(frame.blobs) {
                    Err(reason) => WireReply::Refused(RefusedReason::BadMessage(reason)),
                    Ok((payload, blobs)) => match self.dispatch(&envelope) {
                        Err(reason) => WireReply::Refused(reason),
                        Ok(handler) => {
                            let delivery = handler.call(
                                envelope.from,
                                payload,
                                blobs,
                                self.config.payload_bytes_max,
                            );
                            // The caller gives up after the time it said it waits; so does
                            // delivery.
                            let timeout = Duration::from_millis(envelope.reply_within_ms)
                                .min(REPLY_WITHIN_MAX);
                            let answered = tokio::time::timeout(timeout, delivery)
                                .await
                                .unwrap_or_else(|_| {
                                    Err(RefusedReason::ActorUnavailable(format!(
                                        "actor {:?} did not answer within {} ms",
                                        envelope.actor,
                                        millis(timeout)
                                    )))
                                });
                            match answered {
                                Ok((reply_payload, reply_blobs)) => {
                                    let mut all = Vec::with_capacity(reply_blobs.len() + 1);
                                    all.push(reply_payload);
                                    all.extend(reply_blobs);
                                    return Frame::encode(&WireReply::Reply, all, header_max)
                                        .map_err(|e| e.to_string());
                                }
                                Err(reason) => WireReply::Refused(reason),
                            }
                        }
                    },
                },
            },
            Ok(WireMsg::Heartbeat { .. }) | Ok(WireMsg::Tell(_)) => WireReply::Refused(
                RefusedReason::BadMessage("one-way message sent as a request".to_string()),
            ),
        };
        self.count_rejection(&reply);
        Frame::encode(&reply, Vec::new(), header_max).map_err(|e| e.to_string())
    }

    fn handle_one_way(self: &Arc<Self>, ctx: &ConnCtx, frame: Frame) {
        let conn = &ctx.conn;
        let header_max = self.endpoint.config().frame_bytes_max;
        match frame.decode::<WireMsg>(header_max) {
            Ok(WireMsg::Heartbeat { from }) => {
                if let Err(reply) = self.check_sender(ctx, &from) {
                    self.count_rejection(&reply);
                    tracing::debug!(peer = %conn.peer(), ?reply, "heartbeat dropped");
                }
            }
            Ok(WireMsg::Tell(envelope)) => {
                let result = self
                    .check_envelope(ctx, &envelope)
                    .map_err(|r| {
                        self.count_rejection(&r);
                        format!("{r:?}")
                    })
                    .and_then(|()| split_payload(frame.blobs))
                    .and_then(|(payload, blobs)| {
                        let refused = |r: RefusedReason| {
                            self.count_rejection(&WireReply::Refused(r.clone()));
                            r.to_string()
                        };
                        let handler = self.dispatch(&envelope).map_err(refused)?;
                        handler
                            .tell(
                                envelope.from.clone(),
                                payload,
                                blobs,
                                self.config.payload_bytes_max,
                            )
                            .map_err(refused)
                    });
                if let Err(reason) = result {
                    tracing::debug!(peer = %conn.peer(), reason, "one-way message dropped");
                }
            }
            Ok(other) => {
                tracing::debug!(peer = %conn.peer(), ?other, "request sent one-way; dropped")
            }
            Err(e) => {
                tracing::debug!(peer = %conn.peer(), error = %e, "undecodable one-way message")
            }
        }
    }

    fn handle_hello(self: &Arc<Self>, ctx: &ConnCtx, from: Incarnation<NodeId>) -> WireReply {
        let conn = &ctx.conn;
        if &from.node != conn.peer() {
            return WireReply::Refused(RefusedReason::NotAuthenticated(format!(
                "authenticated as {} but said hello as {}",
                conn.peer(),
                from.node
            )));
        }
        if let Err(stale) = self.hear(&from) {
            return WireReply::Stale(stale);
        }
        if let Err(reason) = self.add_link(ctx, &from) {
            return WireReply::Refused(reason);
        }
        *lock(&ctx.hello) = Some(from);
        WireReply::Hello {
            me: self.me.clone(),
        }
    }

    /// SEC-1 and FENCE-1 for a message claiming to come from `from` on `conn`.
    fn check_sender(&self, ctx: &ConnCtx, from: &Incarnation<NodeId>) -> Result<(), WireReply> {
        let conn = &ctx.conn;
        let said_hello = lock(&ctx.hello).clone();
        match said_hello {
            // A connection carries one incarnation: the one it said hello as.
            Some(h) if h == *from && &from.node == conn.peer() => {}
            Some(h) => {
                return Err(WireReply::Refused(RefusedReason::NotAuthenticated(
                    format!("connection said hello as {h} but the message claims {from}"),
                )))
            }
            None => {
                return Err(WireReply::Refused(RefusedReason::NotAuthenticated(
                    "no hello on this connection".to_string(),
                )))
            }
        }
        self.hear(from).map_err(WireReply::Stale)
    }

    fn check_envelope(&self, ctx: &ConnCtx, envelope: &Envelope) -> Result<(), WireReply> {
        self.check_sender(ctx, &envelope.from)?;
        if envelope.to_epoch != self.me.epoch {
            return Err(WireReply::Stale(format!(
                "message targets {} of {}, which is now at {}",
                envelope.to_epoch, self.me.node, self.me.epoch
            )));
        }
        Ok(())
    }

    fn count_rejection(&self, reply: &WireReply) {
        use std::sync::atomic::Ordering::Relaxed;
        match reply {
            WireReply::Stale(_) => {
                self.stale_rejected.fetch_add(1, Relaxed);
            }
            WireReply::Refused(_) => {
                self.refused.fetch_add(1, Relaxed);
            }
            WireReply::Hello { .. } | WireReply::Reply => {}
        }
    }

    fn dispatch(&self, envelope: &Envelope) -> Result<Arc<dyn Dispatch>, RefusedReason> {
        let handlers = lock(&self.handlers);
        if let Some(h) = handlers.get(&(envelope.actor.clone(), envelope.tag.clone())) {
            return Ok(h.clone());
        }
        if handlers.keys().any(|(actor, _)| actor == &envelope.actor) {
            Err(RefusedReason::UnknownMessage {
                actor: envelope.actor.clone(),
                tag: envelope.tag.clone(),
            })
        } else {
            Err(RefusedReason::NoSuchActor(envelope.actor.clone()))
        }
    }
}

/// What a handler answers: the reply's encoded payload and its blobs.
type Answer = Result<(Bytes, Vec<Bytes>), RefusedReason>;

/// A handler function as stored by [`Gateway::register_fn_with_blobs`].
type HandlerFn<M> = dyn Fn(
        Remote<M>,
    ) -> BoxFuture<'static, Result<(<M as RemoteMessage>::Reply, Vec<Bytes>), RefusedReason>>
    + Send
    + Sync;

/// Type-erased delivery of one message type to one local actor.
trait Dispatch: Send + Sync {
    fn call(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> BoxFuture<'static, Answer>;

    fn tell(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> Result<(), RefusedReason>;
}

struct RecipientDispatch<M: RemoteMessage>(Recipient<Remote<M>>);

impl<M: RemoteMessage> Dispatch for RecipientDispatch<M> {
    fn call(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> BoxFuture<'static, Answer> {
        let recipient = self.0.clone();
        Box::pin(async move {
            let msg: M = decode_payload(&payload, payload_bytes_max)?;
            let reply = recipient
                .send(Remote { from, msg, blobs })
                .await
                .map_err(|e| RefusedReason::ActorUnavailable(e.to_string()))?;
            Ok((encode_reply(&reply, payload_bytes_max)?, Vec::new()))
        })
    }

    fn tell(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> Result<(), RefusedReason> {
        let msg: M = decode_payload(&payload, payload_bytes_max)?;
        self.0
            .try_send(Remote { from, msg, blobs })
            .map_err(|e| RefusedReason::ActorUnavailable(e.to_string()))
    }
}

/// Delivery to a handler function.
struct FnDispatch<M: RemoteMessage> {
    handler: Arc<HandlerFn<M>>,
    tells: Arc<tokio::sync::Semaphore>,
}

impl<M: RemoteMessage> Dispatch for FnDispatch<M> {
    fn call(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> BoxFuture<'static, Answer> {
        let handler = self.handler.clone();
        Box::pin(async move {
            let msg: M = decode_payload(&payload, payload_bytes_max)?;
            let (reply, reply_blobs) = handler(Remote { from, msg, blobs }).await?;
            Ok((encode_reply(&reply, payload_bytes_max)?, reply_blobs))
        })
    }

    fn tell(
        &self,
        from: Incarnation<NodeId>,
        payload: Bytes,
        blobs: Vec<Bytes>,
        payload_bytes_max: usize,
    ) -> Result<(), RefusedReason> {
        let msg: M = decode_payload(&payload, payload_bytes_max)?;
        let permit = self.tells.clone().try_acquire_owned().map_err(|_| {
            RefusedReason::ActorUnavailable("too many one-way messages in flight".to_string())
        })?;
        let fut = (self.handler)(Remote { from, msg, blobs });
        tokio::spawn(async move {
            let _ = fut.await;
            drop(permit);
        });
        Ok(())
    }
}

fn decode_payload<M: RemoteMessage>(payload: &[u8], limit: usize) -> Result<M, RefusedReason> {
    codec::decode(payload, limit).map_err(|e| RefusedReason::BadMessage(e.to_string()))
}

fn encode_reply<R: Encode>(reply: &R, limit: usize) -> Result<Bytes, RefusedReason> {
    codec::encode(reply, limit).map_err(|e| RefusedReason::BadMessage(format!("reply: {e}")))
}

async fn accept_loop(endpoint: Endpoint, inner: Weak<Inner>) {
    while let Some(accepted) = endpoint.accept().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match accepted {
            Ok(conn) => {
                let ctx = inner.conn_ctx(conn, None);
                spawn_serve(&inner, ctx);
            }
            Err(e) => tracing::info!(error = %e, "refused a connection"),
        }
    }
}

/// Serves what the peer sends on one connection until it is lost.
fn spawn_serve(inner: &Arc<Inner>, ctx: Arc<ConnCtx>) {
    let weak = Arc::downgrade(inner);
    let task = tokio::spawn(async move {
        loop {
            let incoming = ctx.conn.accept_incoming().await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            match incoming {
                Ok(Incoming::OneWay(frame)) => inner.handle_one_way(&ctx, frame),
                Ok(Incoming::Request { frame, responder }) => {
                    let ctx = ctx.clone();
                    // Requests run concurrently; the transport bounds how many a peer opens.
                    tokio::spawn(async move {
                        respond(&inner, &ctx, frame, responder).await;
                    });
                }
                Err(e) => {
                    tracing::debug!(peer = %ctx.conn.peer(), error = %e, "connection ended");
                    let mut state = lock(&inner.state);
                    let same = state
                        .peers
                        .get(ctx.conn.peer())
                        .is_some_and(|l| l.conn_id == ctx.id);
                    if same {
                        state.peers.remove(ctx.conn.peer());
                    }
                    return;
                }
            }
        }
    });
    let mut tasks = lock(&inner.tasks);
    tasks.retain(|t| !t.is_finished());
    tasks.push(task);
}

async fn respond(inner: &Arc<Inner>, ctx: &ConnCtx, frame: Frame, responder: Responder) {
    let peer = ctx.conn.peer().clone();
    match inner.handle_request(ctx, frame).await {
        Ok(reply) => {
            if let Err(e) = responder.respond(reply).await {
                tracing::debug!(%peer, error = %e, "reply not delivered");
            }
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "reply failed to encode");
            responder.reject(cohort_transport::RejectReason::ResponseFailed);
        }
    }
}

/// Drives the heartbeat machine: sleeps until its next timeout (or until woken), then sends
/// heartbeats and reports and fences dead peers.
async fn heartbeat_driver(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let state = lock(&inner.state);
            state.heartbeat.poll_timeout()
        };
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wake.notified() => {}
            _ = sleep => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = now();
        let mut sends = Vec::new();
        let mut published = Vec::new();
        {
            let mut state = lock(&inner.state);
            state.heartbeat.handle_timeout(now);
            while let Some(event) = state.heartbeat.poll_event() {
                match event {
                    HeartbeatEvent::SendHeartbeat { peer } => {
                        if let Some(link) = state.peers.get(&peer) {
                            sends.push(link.conn.clone());
                        }
                    }
                    HeartbeatEvent::PeerDead { incarnation, cause } => {
                        // FENCE-1: a silent incarnation is fenced, so it cannot come back.
                        state.fencing.fence(&incarnation);
                        if state
                            .peers
                            .get(&incarnation.node)
                            .is_some_and(|l| l.incarnation.epoch <= incarnation.epoch)
                        {
                            if let Some(link) = state.peers.remove(&incarnation.node) {
                                link.conn.close();
                            }
                        }
                        published.push(PeerEvent::Dead { incarnation, cause });
                    }
                    HeartbeatEvent::PeerAlive { incarnation } => {
                        published.push(PeerEvent::Alive(incarnation));
                    }
                }
            }
        }
        for event in published {
            tracing::info!(node = %inner.me, ?event, "peer event");
            inner.publish(event);
        }
        if !sends.is_empty() {
            let header_max = inner.endpoint.config().frame_bytes_max;
            let beat = WireMsg::Heartbeat {
                from: inner.me.clone(),
            };
            let Ok(frame) = Frame::encode(&beat, Vec::new(), header_max) else {
                continue;
            };
            for conn in sends {
                let frame = frame.clone();
                // Bounded by the transport's request timeout; a frozen peer's sends just fail.
                tokio::spawn(async move {
                    let _ = conn.send(frame).await;
                });
            }
        }
    }
}

/// The typed reply (and its blobs) in the response `reply` to a call to `peer`.
fn decode_reply<M: RemoteMessage>(
    inner: &Inner,
    peer: &NodeId,
    reply: Frame,
) -> Result<(M::Reply, Vec<Bytes>), RemoteError> {
    let header: WireReply = reply
        .decode(inner.endpoint.config().frame_bytes_max)
        .map_err(|e| RemoteError::Codec {
            peer: peer.clone(),
            reason: e.to_string(),
        })?;
    match header {
        WireReply::Reply => {
            let (payload, blobs) =
                split_payload(reply.blobs).map_err(|reason| RemoteError::Codec {
                    peer: peer.clone(),
                    reason,
                })?;
            let value = codec::decode::<M::Reply>(&payload, inner.config.payload_bytes_max)
                .map_err(|e| RemoteError::Codec {
                    peer: peer.clone(),
                    reason: e.to_string(),
                })?;
            Ok((value, blobs))
        }
        WireReply::Refused(reason) => Err(RemoteError::Refused {
            peer: peer.clone(),
            reason,
        }),
        WireReply::Stale(reason) => Err(RemoteError::Stale {
            peer: peer.clone(),
            reason,
        }),
        WireReply::Hello { .. } => Err(RemoteError::Codec {
            peer: peer.clone(),
            reason: "unexpected hello in reply to a call".to_string(),
        }),
    }
}

/// Splits a frame's blobs into the encoded payload (blob 0) and the raw blobs after it.
fn split_payload(mut blobs: Vec<Bytes>) -> Result<(Bytes, Vec<Bytes>), String> {
    if blobs.is_empty() {
        return Err("no payload blob".to_string());
    }
    let payload = blobs.remove(0);
    Ok((payload, blobs))
}

fn link_error(peer: &NodeId, error: LinkError) -> RemoteError {
    match error {
        LinkError::Timeout { timeout_ms, .. } => RemoteError::Timeout {
            peer: peer.clone(),
            timeout_ms,
        },
        LinkError::ConnectionLost { reason, .. } => RemoteError::PeerLost {
            peer: peer.clone(),
            reason,
        },
        LinkError::Rejected { reason, .. } => RemoteError::Refused {
            peer: peer.clone(),
            reason: RefusedReason::BadMessage(format!("rejected by the transport: {reason:?}")),
        },
        other => RemoteError::Codec {
            peer: peer.clone(),
            reason: other.to_string(),
        },
    }
}

fn connect_error(peer: &NodeId, error: ConnectError) -> RemoteError {
    match error {
        ConnectError::Timeout { .. } => RemoteError::PeerLost {
            peer: peer.clone(),
            reason: error.to_string(),
        },
        ConnectError::CertificateRejected { .. }
        | ConnectError::IdentityMismatch { .. }
        | ConnectError::UnexpectedPeer { .. }
        | ConnectError::ProtocolVersionMismatch { .. } => RemoteError::Refused {
            peer: peer.clone(),
            reason: RefusedReason::NotAuthenticated(error.to_string()),
        },
        other => RemoteError::PeerLost {
            peer: peer.clone(),
            reason: other.to_string(),
        },
    }
}

/// Longest a receiver keeps delivering one call, whatever its caller says it waits.
const REPLY_WITHIN_MAX: Duration = Duration::from_secs(24 * 60 * 60);

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere while it was held; the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
