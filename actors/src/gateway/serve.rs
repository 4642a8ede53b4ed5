//! Inbound streams: accepting connections, serving every request and one-way message a peer
//! sends on a connection (dialed or accepted), and the checks each goes through before a
//! handler runs: the hello, SEC-1 (the claimed sender is the authenticated one), FENCE-1 (not
//! stale, aimed at this incarnation), the registry, then SEC-2 (the role in the peer's
//! certificate may send the message type). Counts and answers what it refuses.

use std::sync::{Arc, Weak};
use std::time::Duration;

use cohort_transport::codec::CodecError;
use cohort_transport::{Endpoint, Frame, Incoming, NodeId, Responder};

use super::dispatch::Dispatch;
use super::state::{ConnCtx, Inner};
use super::{lock, millis, split_payload, NoPayload, RefusedReason};
use crate::fencing::Incarnation;
use crate::wire::{Envelope, WireMsg, WireReply};

impl Inner {
    /// Handles one request on a connection whose peer authenticated as `peer`. `hello` holds the
    /// incarnation the peer said hello as, once it has.
    async fn handle_request(
        self: &Arc<Self>,
        ctx: &ConnCtx,
        frame: Frame,
    ) -> Result<Frame, CodecError> {
        let header_max = self.endpoint.config().frame_bytes_max;
        let reply = match frame.decode::<WireMsg>(header_max) {
            Err(e) => WireReply::Refused(RefusedReason::BadMessage(e.to_string())),
            Ok(WireMsg::Hello { from }) => self.handle_hello(ctx, from),
            Ok(WireMsg::Call(envelope)) => match self.check_envelope(ctx, &envelope) {
                Err(reply) => reply,
                Ok(()) => match split_payload(frame.blobs) {
                    Err(reason) => {
                        WireReply::Refused(RefusedReason::BadMessage(reason.to_string()))
                    }
                    Ok((payload, blobs)) => match self.handler_for(ctx, &envelope) {
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
                                    return Frame::encode(&WireReply::Reply, all, header_max);
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
        Frame::encode(&reply, Vec::new(), header_max)
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
                        OneWayDropped::Sender(r)
                    })
                    .and_then(|()| split_payload(frame.blobs).map_err(OneWayDropped::NoPayload))
                    .and_then(|(payload, blobs)| {
                        let refused = |r: RefusedReason| {
                            self.count_rejection(&WireReply::Refused(r.clone()));
                            OneWayDropped::Refused(r)
                        };
                        let handler = self.handler_for(ctx, &envelope).map_err(refused)?;
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
                    tracing::debug!(peer = %conn.peer(), %reason, "one-way message dropped");
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
        if let Err(stale) = self.hear_from(&from) {
            // The dialer is told which incarnation of it we know, so that it can tell that its own
            // incarnation is outdated (and come back as a newer one).
            let known = lock(&self.state)
                .fencing
                .current(&from.node)
                .map_or(from.incarnation, |(incarnation, _)| incarnation);
            return WireReply::Outdated {
                known,
                reason: stale.to_string(),
            };
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
        self.hear_from(from)
            .map_err(|stale| WireReply::Stale(stale.to_string()))
    }

    fn check_envelope(&self, ctx: &ConnCtx, envelope: &Envelope) -> Result<(), WireReply> {
        self.check_sender(ctx, &envelope.from)?;
        if envelope.to_incarnation != self.me.incarnation {
            return Err(WireReply::Stale(format!(
                "message targets {} of {}, which is now at {}",
                envelope.to_incarnation, self.me.node, self.me.incarnation
            )));
        }
        Ok(())
    }

    /// The handler `envelope` is addressed to, if the sender may send its message type: SEC-2,
    /// checked against the role in the certificate the peer authenticated with on this
    /// connection (not against anything the message claims), before the payload is decoded.
    fn handler_for(
        &self,
        ctx: &ConnCtx,
        envelope: &Envelope,
    ) -> Result<Arc<dyn Dispatch>, RefusedReason> {
        let handler = self.registry.lookup(envelope)?;
        let senders = handler.senders();
        let role = &ctx.conn.peer().role;
        if !senders.allows(role) {
            self.sender_not_allowed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                peer = %ctx.conn.peer(),
                actor = %envelope.actor,
                tag = %envelope.tag,
                allowed = %senders,
                "SEC-2: message refused, the sender's role may not send this type"
            );
            return Err(RefusedReason::SenderNotAllowed {
                tag: envelope.tag.clone(),
                role: role.clone(),
            });
        }
        Ok(handler)
    }

    fn count_rejection(&self, reply: &WireReply) {
        use std::sync::atomic::Ordering::Relaxed;
        match reply {
            WireReply::Stale(_) | WireReply::Outdated { .. } => {
                self.stale_rejected.fetch_add(1, Relaxed);
            }
            WireReply::Refused(_) => {
                self.refused.fetch_add(1, Relaxed);
            }
            WireReply::Hello { .. } | WireReply::Reply => {}
        }
    }
}

pub(super) async fn accept_loop(endpoint: Endpoint, inner: Weak<Inner>) {
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
pub(super) fn spawn_serve(inner: &Arc<Inner>, ctx: Arc<ConnCtx>) {
    lock(&inner.state)
        .served
        .entry(ctx.conn.peer().clone())
        .or_default()
        .push(Arc::clone(&ctx));
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
                    lock(&inner.state).forget_conn(ctx.conn.peer(), ctx.id);
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

/// Why a one-way message was dropped (it has no reply to carry a refusal: it is logged).
#[derive(Debug, thiserror::Error)]
enum OneWayDropped {
    /// Its sender or target incarnation was refused (SEC-1, FENCE-1): the reply a request
    /// would have had.
    #[error("{0:?}")]
    Sender(WireReply),
    /// Its frame carries no payload blob.
    #[error(transparent)]
    NoPayload(#[from] NoPayload),
    /// The registry, SEC-2 or the handler refused it.
    #[error("{0}")]
    Refused(RefusedReason),
}

/// Longest a receiver keeps delivering one call, whatever its caller says it waits.
const REPLY_WITHIN_MAX: Duration = Duration::from_secs(24 * 60 * 60);
