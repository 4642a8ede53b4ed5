//! Outbound links: dialing a peer, saying hello on a new connection, encoding a message into
//! a frame, and [`Gateway::call_fenced`]. A dialed connection is then served like an accepted
//! one (`serve.rs`), since the peer sends requests and heartbeats on it too.

use std::sync::Arc;

use bytes::Bytes;
use cohort_transport::{codec, ConnectError, Connection, Frame, LinkError, NodeId, RejectReason};

use super::addr::PeerAddr;
use super::remote_ref::{decode_reply, WireKind};
use super::serve::spawn_serve;
use super::state::Inner;
use super::{lock, millis, Gateway, PeerEvent, RefusedReason, RemoteError, RemoteMessage};
use crate::fencing::Incarnation;
use crate::wire::{Envelope, WireMsg, WireReply};

impl Gateway {
    /// Calls `actor` on exactly the incarnation `target`, reached at `addr` over a connection
    /// of its own, even when this gateway has declared that incarnation dead or fenced it: the
    /// one way left to tell a fenced incarnation something, such as that it is fenced and
    /// should exit to come back as a new incarnation. FENCE-1 is unaffected: nothing the peer
    /// sends on that connection is served or counts as hearing from it, and the connection is
    /// closed after the reply. Fails as stale without sending when `addr` answers as another
    /// incarnation. A name in `addr` is resolved now. Bounded by `call_timeout`.
    pub async fn call_fenced<M: RemoteMessage>(
        &self,
        addr: impl Into<PeerAddr>,
        target: &Incarnation<NodeId>,
        actor: &str,
        msg: &M,
    ) -> Result<M::Reply, RemoteError> {
        let inner = &self.inner;
        let peer = &target.node;
        let timeout = inner.config.call_timeout;
        let addr: PeerAddr = addr.into();
        let work = async {
            let addr = resolve(&addr, peer).await?;
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
                            answered.incarnation, target.incarnation
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
}

impl Inner {
    /// The live connection to `node` and the incarnation it runs, dialing and saying hello if
    /// there is none.
    pub(super) async fn link_to(
        self: &Arc<Self>,
        node: &NodeId,
    ) -> Result<(Connection, Incarnation<NodeId>), RemoteError> {
        self.link_to_at_least(node, 0).await
    }

    /// [`Self::link_to`], where a link to an incarnation older than `incarnation` counts as outdated
    /// and the node is dialed afresh: whoever names incarnation `incarnation` knows that it exists,
    /// so the old one is gone even if its connection has not idled out yet (a process that
    /// exits without closing its connections leaves them open until then).
    pub(super) async fn link_to_at_least(
        self: &Arc<Self>,
        node: &NodeId,
        incarnation: u64,
    ) -> Result<(Connection, Incarnation<NodeId>), RemoteError> {
        let (existing, addr, dead) = {
            let state = lock(&self.state);
            (
                state.peers.get(node).cloned(),
                state.addrs.get(node).cloned(),
                // The incarnation of the node this gateway declared dead, if the newest it
                // knows is one.
                state
                    .fencing
                    .current(node)
                    .filter(|(_, fenced)| *fenced)
                    .map(|(incarnation, _)| incarnation.0),
            )
        };
        if let Some(link) = existing {
            // A live link to where the node is known to be is reused; a node known at a new
            // address (restarted elsewhere) is dialed afresh. A name not dialed yet is where
            // the live link goes (the peer dialed us).
            let same_place = addr
                .as_ref()
                .and_then(PeerAddr::last_resolved)
                .is_none_or(|a| a == link.conn.remote_address());
            let outdated = link.incarnation.incarnation.0 < incarnation;
            if link.conn.close_reason().is_none() && same_place && !outdated {
                return Ok((link.conn, link.incarnation));
            }
        }
        let Some(addr) = addr else {
            return Err(RemoteError::PeerLost {
                peer: node.clone(),
                reason: "not connected and no known address".to_string(),
            });
        };
        let mut dial = self.dial_detached(node, addr);
        // A dial to a node declared dead races its successor: a new incarnation that says
        // hello to this node while the dial waits (on the port its predecessor left closed,
        // where the dial's first packet was lost) links it at once, and the caller takes that
        // link instead of waiting; the dial goes on by itself. First contacts wait for their
        // dial.
        let Some(dead) = dead else {
            return dial_result(node, (&mut dial).await);
        };
        loop {
            let linked = self.linked.notified();
            tokio::pin!(linked);
            linked.as_mut().enable();
            if let Some(link) = self.newer_live_link(node, dead, incarnation) {
                return Ok(link);
            }
            tokio::select! {
                result = &mut dial => return dial_result(node, result),
                () = &mut linked => {}
            }
        }
    }

    /// [`Self::dial`] in a task of its own, its outcome on the returned channel. Once the
    /// peer has answered the dial's hello it holds a link over that connection and may send
    /// requests on it at once; a dial dropped half-way (its caller timed out, or took a link
    /// from the peer's own hello instead) would leave nothing here serving that connection,
    /// and the peer's requests on it would be dropped unanswered. Run apart, every dial that
    /// gets through its hello is served, whoever still waits for it. Bounded by the connect
    /// and request timeouts; aborted with the gateway.
    fn dial_detached(
        self: &Arc<Self>,
        node: &NodeId,
        addr: PeerAddr,
    ) -> tokio::sync::oneshot::Receiver<Result<(Connection, Incarnation<NodeId>), RemoteError>>
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = Arc::clone(self);
        let node = node.clone();
        let task = tokio::spawn(async move {
            let _ = tx.send(inner.dial(&node, addr).await);
        });
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
        rx
    }

    /// The live link to `node`, if it is to an incarnation of at least `incarnation` and newer than
    /// the one declared dead (`dead`).
    fn newer_live_link(
        &self,
        node: &NodeId,
        dead: u64,
        incarnation: u64,
    ) -> Option<(Connection, Incarnation<NodeId>)> {
        let state = lock(&self.state);
        let link = state.peers.get(node)?;
        let at = link.incarnation.incarnation.0;
        let usable = link.conn.close_reason().is_none() && at >= incarnation && at > dead;
        usable.then(|| (link.conn.clone(), link.incarnation.clone()))
    }

    /// Dials `node` at `addr` and says hello: the link to the incarnation that answers.
    async fn dial(
        self: &Arc<Self>,
        node: &NodeId,
        addr: PeerAddr,
    ) -> Result<(Connection, Incarnation<NodeId>), RemoteError> {
        // A name is looked up on every dial: a peer recreated elsewhere under the same name is
        // reached at its new address.
        let addr = resolve(&addr, node).await?;
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
        if let Err(stale) = self.hear_from(&incarnation) {
            conn.close();
            return Err(RemoteError::Stale {
                peer: node.clone(),
                reason: stale.to_string(),
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
    pub(super) async fn say_hello(
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
            WireReply::Outdated { known, reason } => {
                tracing::warn!(
                    %node, %known, me = %self.me,
                    "this incarnation was refused as outdated: {reason}"
                );
                self.publish(PeerEvent::Outdated {
                    by: node.clone(),
                    known,
                });
                Err(RemoteError::Outdated {
                    peer: node.clone(),
                    known,
                    reason,
                })
            }
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
    pub(super) fn encode_message<M: RemoteMessage>(
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
            to_incarnation: target.incarnation,
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
}

/// What a detached dial to `node` came to; a dial stopped with its gateway is a lost peer.
fn dial_result(
    node: &NodeId,
    outcome: Result<
        Result<(Connection, Incarnation<NodeId>), RemoteError>,
        tokio::sync::oneshot::error::RecvError,
    >,
) -> Result<(Connection, Incarnation<NodeId>), RemoteError> {
    outcome.unwrap_or_else(|_| {
        Err(RemoteError::PeerLost {
            peer: node.clone(),
            reason: "the gateway stopped while dialing".to_string(),
        })
    })
}

/// `addr` resolved now; a name that does not resolve (yet) is a peer not reachable for now.
async fn resolve(addr: &PeerAddr, peer: &NodeId) -> Result<std::net::SocketAddr, RemoteError> {
    addr.resolve()
        .await
        .map_err(|reason| RemoteError::PeerLost {
            peer: peer.clone(),
            reason: reason.to_string(),
        })
}

pub(super) fn link_error(peer: &NodeId, error: LinkError) -> RemoteError {
    match error {
        LinkError::Timeout { timeout_ms, .. } => RemoteError::Timeout {
            peer: peer.clone(),
            timeout_ms,
        },
        LinkError::ConnectionLost { reason, .. } => RemoteError::PeerLost {
            peer: peer.clone(),
            reason,
        },
        // The peer's in-flight byte budget was full: it dropped the message unread.
        LinkError::Rejected {
            reason: RejectReason::Busy,
            ..
        } => RemoteError::Busy {
            peer: peer.clone(),
            reason: format!(
                "rejected by the transport: {}: its in-flight byte budget is full",
                RejectReason::Busy
            ),
        },
        // Our receive budget had no room for the reply within its wait.
        LinkError::OverBudget { error, .. } => RemoteError::Busy {
            peer: peer.clone(),
            reason: format!("the reply found no room in this node's receive budget: {error}"),
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
        ConnectError::CertificateRejected { .. } => RemoteError::Refused {
            peer: peer.clone(),
            reason: RefusedReason::CertificateRejected(error.to_string()),
        },
        ConnectError::IdentityMismatch { .. }
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
