//! Type-erased delivery of one message type to one registered handler: an actix
//! [`Recipient`] or a handler function. Decodes the payload (bounded by `payload_bytes_max`),
//! runs the handler, encodes the reply; one-way messages to a handler function run in tasks
//! bounded by `tells_in_flight_max`.

use std::sync::Arc;

use actix::Recipient;
use bincode::Encode;
use bytes::Bytes;
use cohort_transport::{codec, NodeId};
use futures::future::BoxFuture;

use super::{RefusedReason, Remote, RemoteMessage, Senders};
use crate::fencing::Incarnation;

/// What a handler answers: the reply's encoded payload and its blobs.
pub(super) type Answer = Result<(Bytes, Vec<Bytes>), RefusedReason>;

/// A handler function as stored by [`Gateway::register_fn_with_blobs`](super::Gateway::register_fn_with_blobs).
pub(super) type HandlerFn<M> = dyn Fn(
        Remote<M>,
    ) -> BoxFuture<'static, Result<(<M as RemoteMessage>::Reply, Vec<Bytes>), RefusedReason>>
    + Send
    + Sync;

/// Type-erased delivery of one message type to one local actor.
pub(super) trait Dispatch: Send + Sync {
    /// Who may send the message type (SEC-2): its [`RemoteMessage::SENDERS`].
    fn senders(&self) -> Senders;

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

pub(super) struct RecipientDispatch<M: RemoteMessage>(pub(super) Recipient<Remote<M>>);

impl<M: RemoteMessage> Dispatch for RecipientDispatch<M> {
    fn senders(&self) -> Senders {
        M::SENDERS
    }

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
pub(super) struct FnDispatch<M: RemoteMessage> {
    pub(super) handler: Arc<HandlerFn<M>>,
    pub(super) tells: Arc<tokio::sync::Semaphore>,
}

impl<M: RemoteMessage> Dispatch for FnDispatch<M> {
    fn senders(&self) -> Senders {
        M::SENDERS
    }

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
