//! The handlers registered on one node, by (actor name, message type tag): bounded by
//! `registrations_max`, one handler per pair, looked up for every incoming message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::dispatch::Dispatch;
use super::{lock, RefusedReason, RegisterError};
use crate::wire::Envelope;

/// Handlers by (actor, tag).
pub(super) struct Registry {
    handlers: Mutex<HashMap<(String, String), Arc<dyn Dispatch>>>,
    registrations_max: usize,
}

impl Registry {
    /// An empty registry that holds at most `registrations_max` handlers.
    pub(super) fn new(registrations_max: usize) -> Self {
        Self {
            handlers: Mutex::new(HashMap::new()),
            registrations_max,
        }
    }

    /// Adds the handler of message type `tag` for `actor`.
    pub(super) fn insert(
        &self,
        actor: &str,
        tag: &str,
        dispatch: Arc<dyn Dispatch>,
    ) -> Result<(), RegisterError> {
        let mut handlers = lock(&self.handlers);
        let key = (actor.to_string(), tag.to_string());
        if handlers.contains_key(&key) {
            return Err(RegisterError::Duplicate {
                actor: key.0,
                tag: key.1,
            });
        }
        if handlers.len() >= self.registrations_max {
            return Err(RegisterError::TooMany(handlers.len()));
        }
        handlers.insert(key, dispatch);
        Ok(())
    }

    /// Removes every registration of `actor`.
    pub(super) fn remove_actor(&self, actor: &str) {
        lock(&self.handlers).retain(|(name, _), _| name != actor);
    }

    /// The handler `envelope` is addressed to, or why there is none.
    pub(super) fn lookup(&self, envelope: &Envelope) -> Result<Arc<dyn Dispatch>, RefusedReason> {
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
