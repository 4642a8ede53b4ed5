//! [`RemoteRef`]: a typed reference to a named actor on one incarnation of a remote node,
//! the sending side of calls and one-way messages, and the decoding of a call's reply.

use std::marker::PhantomData;
use std::time::Duration;

use bytes::Bytes;
use cohort_transport::{codec, Connection, Frame, NodeId};

use super::links::link_error;
use super::state::Inner;
use super::{millis, split_payload, Gateway, RemoteError, RemoteMessage};
use crate::fencing::Incarnation;
use crate::wire::WireReply;

/// A typed reference to a named actor on one incarnation of a remote node.
pub struct RemoteRef<M: RemoteMessage> {
    pub(super) gateway: Gateway,
    pub(super) target: Incarnation<NodeId>,
    pub(super) actor: String,
    pub(super) _msg: PhantomData<fn(M) -> M::Reply>,
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
        // A reference to a newer incarnation than the link's dials it afresh.
        let (conn, current) = inner
            .link_to_at_least(peer, self.target.incarnation.0)
            .await?;
        if current.incarnation != self.target.incarnation {
            return Err(RemoteError::Stale {
                peer: peer.clone(),
                reason: format!(
                    "reference bound to {}, but {peer} is now at {}",
                    self.target.incarnation, current.incarnation
                ),
            });
        }
        let frame = inner.encode_message(&self.target, &self.actor, msg, blobs, kind)?;
        Ok((frame, conn))
    }
}

/// A request, with how long its caller waits for the reply, or a one-way message.
pub(super) enum WireKind {
    Call(Duration),
    Tell,
}

/// The typed reply (and its blobs) in the response `reply` to a call to `peer`.
pub(super) fn decode_reply<M: RemoteMessage>(
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
                    reason: reason.to_string(),
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
        WireReply::Hello { .. } | WireReply::Outdated { .. } => Err(RemoteError::Codec {
            peer: peer.clone(),
            reason: "unexpected answer to a hello in reply to a call".to_string(),
        }),
    }
}
