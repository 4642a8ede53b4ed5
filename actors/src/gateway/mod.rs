//! The node gateway: one per node, it owns the node's transport [`Endpoint`], delivers messages
//! from remote nodes to local actors registered by name, carries replies back, runs the
//! heartbeat failure detector for every peer it talks to, and enforces FENCE-1.
//!
//! # Protocol (over the transport's frames)
//!
//! Every frame header is a bincode-encoded [`WireMsg`](crate::wire::WireMsg) (requests and
//! one-way messages) or [`WireReply`](crate::wire::WireReply) (responses), defined in
//! [`crate::wire`]. A call's payload (the typed message, bincode, at most
//! `payload_bytes_max`) travels as blob 0, and raw byte blobs given with
//! [`RemoteRef::call_with_blobs`] (tensors) as blobs 1.., moved as whole buffers; a reply is
//! laid out the same way.
//!
//! ```text
//!  dialer                                  acceptor
//!  Hello{from: incarnation}     ──req──▶   admit(from) in the fencing table
//!                               ◀──rsp──   Hello{me: incarnation} | Outdated{known} | Refused
//!  Heartbeat{from}              ──1way─▶   (both directions, every heartbeat interval)
//!  Call{from, to_incarnation, actor, tag, reply_within_ms} + payload, blobs
//!                               ──req──▶   deliver to actor `actor`
//!                               ◀──rsp──   Reply + payload, blobs | Refused | Stale
//!  Tell{from, to_incarnation, actor, tag} + payload, blobs ──1way─▶ deliver, no reply
//! ```
//!
//! A call waits for its reply at most the gateway's `call_timeout`, or the longer bound given
//! to [`RemoteRef::call_within`]; the envelope carries it (`reply_within_ms`) and the receiver
//! stops delivering the call then too (never past 24 hours).
//!
//! # Links and addresses
//!
//! A node keeps one link per peer: the connection it sends on (calls, heartbeats). The
//! connection a peer last said hello on takes the link over at once: a newer incarnation's
//! (the old one's is closed), and a new connection of the same incarnation too (the old one is
//! left for what is in flight on it). A dead connection the node has not yet noticed thus never
//! keeps a live peer looking silent. Every connection, linked or not, is served; when the
//! linked one ends, the newest other live connection of the same incarnation carries the link
//! on (a short-lived connection such as a [`Gateway::call_fenced`] holds it only while it
//! lives).
//!
//! A peer is dialed at a [`PeerAddr`]: a socket address, or a `host:port` name resolved again on
//! every dial, bounded in time, so a peer recreated under its name with a new IP is reached
//! there. A name that does not resolve fails the dial as [`RemoteError::PeerLost`], which
//! callers retry like any unreachable peer.
//!
//! # Fencing semantics (FENCE-1)
//!
//! - Every message names its sender's incarnation; the claimed node must be the node the peer
//!   authenticated as (SEC-1), else the message is refused.
//! - A message from an incarnation older than the highest seen of that node is rejected as stale. A
//!   hello from one is answered [`Outdated`](crate::wire::WireReply::Outdated) with the incarnation
//!   known: the dialer learns that its own incarnation is outdated ([`RemoteError::Outdated`],
//!   [`PeerEvent::Outdated`]), e.g. after its clock stepped back, and can come back as a newer
//!   one.
//! - A newer incarnation's hello is evidence that the old one is dead: it is reported dead
//!   (superseded) at once, without waiting for the heartbeat budget.
//! - When the heartbeat machine declares an incarnation dead, the gateway fences it: its
//!   connection is closed and anything later from that same incarnation (e.g. a frozen process that
//!   wakes up after SIGCONT) is rejected as stale; only a restarted process, with a higher
//!   incarnation, is admitted again.
//! - A call that targets an incarnation other than the receiver's current one is rejected as stale,
//!   and a [`RemoteRef`] bound to an incarnation the sender has seen superseded or dead fails
//!   as stale without sending. The one way to still reach a fenced incarnation (to tell it
//!   that it is fenced) is [`Gateway::call_fenced`], which serves nothing that incarnation
//!   sends.
//!
//! # Who may send what (SEC-2)
//!
//! Every [`RemoteMessage`] type names the [`Senders`] allowed to send it, by the role their
//! certificate names. A call or one-way message of that type from a peer whose authenticated
//! certificate names another role is refused before its payload is decoded and before any
//! handler runs: a call is answered [`RefusedReason::SenderNotAllowed`], a one-way message is
//! dropped; both are counted in [`GatewayStats::sender_not_allowed`] and logged at warn.
//! Hellos and heartbeats, the gateway's own messages, stay open to every authenticated peer.
//!
//! The transport's receive budgets (SEC-2) bound the bytes in flight into a node. A call that
//! finds no room in the receiver's budget, or whose reply finds none in ours, fails as
//! [`RemoteError::Busy`]: transient, unlike a refusal, so a caller may try the same call again.
//!
//! # Layout
//!
//! One file per concern; each file's doc says what it owns.
//!
//! - `api.rs`: the public types (message trait, config, stats, events, errors).
//! - `addr.rs`: [`PeerAddr`], where a peer is dialed, and the name lookup on every dial.
//! - `registry.rs`: the handlers registered on this node, by (actor name, message type).
//! - `dispatch.rs`: type-erased delivery of one message type to a registered handler.
//! - `remote_ref.rs`: [`RemoteRef`], the typed sending side of a call or one-way message.
//! - `links.rs`: outbound links: dialing, saying hello, encoding a message, `call_fenced`.
//! - `serve.rs`: inbound streams: accepting connections and checking and answering what
//!   peers send.
//! - `heartbeat_driver.rs`: the task that drives the heartbeat machine and fences the dead.
//! - `state.rs`: the state shared by all of them, and the FENCE-1 gate every heard message
//!   goes through.
//! - this file: the [`Gateway`] handle and small helpers.

mod addr;
mod api;
mod dispatch;
mod heartbeat_driver;
mod links;
mod registry;
mod remote_ref;
mod serve;
mod state;

pub use addr::{LookupError, PeerAddr, ResolveError, Resolver, SystemResolver};
pub use api::{
    GatewayConfig, GatewayStats, PeerEvent, RefusedReason, RegisterError, Remote, RemoteError,
    RemoteMessage, Senders,
};
pub use remote_ref::RemoteRef;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Recipient;
use bytes::Bytes;
use cohort_transport::{Endpoint, NodeId};
use tokio::sync::{mpsc, Notify};

use crate::fencing::{FencingTable, Incarnation, IncarnationId};
use crate::heartbeat::HeartbeatMachine;
use dispatch::{FnDispatch, HandlerFn, RecipientDispatch};
use registry::Registry;
use state::{Inner, State};

/// A node's gateway. Cheap to clone; the last clone dropped (or [`Gateway::shutdown`]) closes
/// the endpoint and stops its tasks.
///
/// Calling protocol:
/// 1. Bind an [`Endpoint`] and call [`Gateway::start`] inside a tokio runtime (an actix system is
///    one) with this node's incarnation in the config.
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
    /// Starts serving `endpoint` as incarnation `config.incarnation` of the endpoint's node.
    pub fn start(endpoint: Endpoint, config: GatewayConfig) -> Gateway {
        let me = Incarnation::new(endpoint.node().clone(), config.incarnation);
        let inner = Arc::new(Inner {
            endpoint: endpoint.clone(),
            me,
            state: Mutex::new(State {
                fencing: FencingTable::new(),
                heartbeat: HeartbeatMachine::new(config.heartbeat),
                peers: HashMap::new(),
                addrs: HashMap::new(),
                served: HashMap::new(),
            }),
            registry: Registry::new(config.registrations_max),
            subscribers: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
            linked: Notify::new(),
            tasks: Mutex::new(Vec::new()),
            next_conn_id: std::sync::atomic::AtomicU64::new(0),
            stale_rejected: std::sync::atomic::AtomicU64::new(0),
            refused: std::sync::atomic::AtomicU64::new(0),
            sender_not_allowed: std::sync::atomic::AtomicU64::new(0),
            config,
        });
        let weak = Arc::downgrade(&inner);
        let accept = tokio::spawn(serve::accept_loop(endpoint, weak.clone()));
        let driver = tokio::spawn(heartbeat_driver::run(weak, inner.wake.clone()));
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
        self.inner
            .registry
            .insert(actor, M::TAG, Arc::new(RecipientDispatch(recipient)))
    }

    /// Delivers messages of type `M` addressed to `actor` to `handler`, e.g. to forward them to
    /// an actor of the node. `Err` refuses the message with that reason. A
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
        self.inner
            .registry
            .insert(actor, M::TAG, Arc::new(dispatch))
    }

    /// Removes every registration of `actor`.
    pub fn unregister(&self, actor: &str) {
        self.inner.registry.remove_actor(actor);
    }

    /// Records where `node` is, without dialing: a later call to one of its incarnations
    /// (through [`Self::remote_ref`]) dials it there when no live link exists, or when the
    /// link goes to an older incarnation than the one called.
    pub fn set_address(&self, node: &NodeId, addr: impl Into<PeerAddr>) {
        lock(&self.inner.state)
            .addrs
            .insert(node.clone(), addr.into());
    }

    /// Dials `node` at `addr` (unless a live connection exists), exchanges hellos, and returns the
    /// peer's current incarnation. A name in `addr` is resolved again on this and every later
    /// dial of `node` ([`PeerAddr`]); one that does not resolve fails as
    /// [`RemoteError::PeerLost`], which a caller retries like any unreachable peer.
    pub async fn connect(
        &self,
        addr: impl Into<PeerAddr>,
        node: &NodeId,
    ) -> Result<Incarnation<NodeId>, RemoteError> {
        lock(&self.inner.state)
            .addrs
            .insert(node.clone(), addr.into());
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
        addr: impl Into<PeerAddr>,
        node: &NodeId,
        actor: &str,
    ) -> Result<RemoteRef<M>, RemoteError> {
        let target = self.connect(addr, node).await?;
        Ok(self.remote_ref(target, actor))
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

    /// The highest incarnation seen of `node`, and whether it is alive (not declared dead or fenced).
    pub fn peer_status(&self, node: &NodeId) -> Option<(IncarnationId, bool)> {
        let state = lock(&self.inner.state);
        state.heartbeat.peer(node)
    }

    /// Outside evidence that `incarnation` is dead (its supervisor saw the process exit):
    /// declared dead at once, fenced and reported to subscribers as
    /// [`DeathCause::Reported`](crate::heartbeat::DeathCause::Reported), as a silence past
    /// the budget would be. Only the live incarnation watched now is affected: a report of
    /// an older one, or of one never heard from, is ignored. Returns whether it was declared
    /// dead.
    pub fn report_dead(&self, incarnation: &Incarnation<NodeId>) -> bool {
        let declared = {
            let mut state = lock(&self.inner.state);
            state
                .heartbeat
                .handle_reported_dead(&incarnation.node, incarnation.incarnation)
        };
        if declared {
            // The heartbeat driver fences, disconnects and publishes it.
            self.inner.wake.notify_one();
        }
        declared
    }

    /// How long `node` has been silent (nothing heard from it), if it is watched; and the
    /// detector's timeout, past which a silent peer is declared dead.
    pub fn peer_silence(&self, node: &NodeId) -> Option<(Duration, Duration)> {
        let state = lock(&self.inner.state);
        let heard = state.heartbeat.last_heard(node)?;
        Some((heard.elapsed(), state.heartbeat.config().timeout))
    }

    /// Counters of what this gateway refused so far.
    pub fn stats(&self) -> GatewayStats {
        use std::sync::atomic::Ordering::Relaxed;
        GatewayStats {
            stale_rejected: self.inner.stale_rejected.load(Relaxed),
            refused: self.inner.refused.load(Relaxed),
            sender_not_allowed: self.inner.sender_not_allowed.load(Relaxed),
        }
    }

    /// Closes the endpoint and stops the gateway's tasks.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// Splits a frame's blobs into the encoded payload (blob 0) and the raw blobs after it.
fn split_payload(mut blobs: Vec<Bytes>) -> Result<(Bytes, Vec<Bytes>), NoPayload> {
    if blobs.is_empty() {
        return Err(NoPayload);
    }
    let payload = blobs.remove(0);
    Ok((payload, blobs))
}

/// A frame that carries no payload blob (every message and reply has one: blob 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no payload blob")]
struct NoPayload;

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
