//! The state one gateway shares between its handle, its serving tasks and its heartbeat
//! driver: the fencing table, the heartbeat machine, the link used to send to each peer, the
//! handler registry and the counters. Owns `hear_from`, the FENCE-1 gate every message heard
//! from a peer goes through, and the bookkeeping of links (one per peer: `add_link`,
//! `State::forget_conn`), served connections and subscribers. Does no IO of its own
//! beyond closing connections it drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cohort_transport::{Connection, Endpoint, NodeId};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use super::addr::PeerAddr;
use super::registry::Registry;
use super::{lock, now, GatewayConfig, PeerEvent, RefusedReason};
use crate::fencing::{Admission, FencingTable, Incarnation, Stale};
use crate::heartbeat::{Heard, HeartbeatMachine};

pub(super) struct Inner {
    pub(super) endpoint: Endpoint,
    pub(super) me: Incarnation<NodeId>,
    pub(super) config: GatewayConfig,
    pub(super) state: Mutex<State>,
    pub(super) registry: Registry,
    pub(super) subscribers: Mutex<Vec<mpsc::Sender<PeerEvent>>>,
    pub(super) wake: Arc<Notify>,
    /// Signalled whenever a peer's link is set: a dial under way to that peer may find it
    /// linked already (its new incarnation said hello first).
    pub(super) linked: Notify,
    pub(super) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(super) next_conn_id: std::sync::atomic::AtomicU64,
    pub(super) stale_rejected: std::sync::atomic::AtomicU64,
    pub(super) refused: std::sync::atomic::AtomicU64,
    pub(super) sender_not_allowed: std::sync::atomic::AtomicU64,
}

pub(super) struct State {
    pub(super) fencing: FencingTable<NodeId>,
    pub(super) heartbeat: HeartbeatMachine<NodeId>,
    /// The connection used to send to each peer, with the peer incarnation it said hello as.
    pub(super) peers: HashMap<NodeId, PeerLink>,
    /// Where to dial peers we connected to before.
    pub(super) addrs: HashMap<NodeId, PeerAddr>,
    /// Every connection being served, by the peer it authenticated as, oldest first: where a
    /// link falls back to when its connection ends.
    pub(super) served: HashMap<NodeId, Vec<Arc<ConnCtx>>>,
}

impl State {
    /// Forgets the served connection `id` to `node`, which has ended. If it carried the link
    /// to `node`, the newest other live connection the same incarnation said hello on carries
    /// it on (a peer's short-lived connection, such as a `call_fenced`, took the link over for
    /// its lifetime only); with none, the link is gone until the next hello or dial.
    pub(super) fn forget_conn(&mut self, node: &NodeId, id: u64) {
        if let Some(list) = self.served.get_mut(node) {
            list.retain(|c| c.id != id);
            if list.is_empty() {
                self.served.remove(node);
            }
        }
        let Some(link) = self.peers.get(node) else {
            return;
        };
        if link.conn_id != id {
            return;
        }
        let incarnation = link.incarnation.clone();
        let next = self.served.get(node).and_then(|list| {
            list.iter()
                .rev()
                .find(|c| {
                    c.conn.close_reason().is_none() && lock(&c.hello).as_ref() == Some(&incarnation)
                })
                .cloned()
        });
        match next {
            Some(ctx) => {
                self.peers.insert(
                    node.clone(),
                    PeerLink {
                        conn: ctx.conn.clone(),
                        conn_id: ctx.id,
                        incarnation,
                    },
                );
            }
            None => {
                self.peers.remove(node);
            }
        }
    }
}

/// Why a peer's incarnation was not heard (FENCE-1): whatever it sent is dropped.
#[derive(Debug, thiserror::Error)]
pub(super) enum StaleSender {
    /// The fencing table refused it: a newer incarnation of its node was seen, or it was
    /// fenced.
    #[error(transparent)]
    Fenced(#[from] Stale),
    /// The heartbeat machine declared it dead.
    #[error("{from} was declared dead")]
    DeclaredDead {
        /// The incarnation heard from.
        from: Incarnation<NodeId>,
    },
}

#[derive(Clone)]
pub(super) struct PeerLink {
    pub(super) conn: Connection,
    /// Which [`ConnCtx`] this is, to tell connections to the same peer apart.
    pub(super) conn_id: u64,
    pub(super) incarnation: Incarnation<NodeId>,
}

/// One served connection: the peer authenticated as `conn.peer()`, and the incarnation it said
/// hello as, once it has.
pub(super) struct ConnCtx {
    pub(super) conn: Connection,
    pub(super) id: u64,
    pub(super) hello: Mutex<Option<Incarnation<NodeId>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    pub(super) fn shutdown(&self) {
        self.endpoint.close();
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        let peers: Vec<_> = {
            let mut state = lock(&self.state);
            state.served.clear();
            state.peers.drain().collect()
        };
        for (_, link) in peers {
            link.conn.close();
        }
    }

    /// The live connection to `node` and the incarnation it runs, dialing and saying hello if
    /// there is none.
    pub(super) fn conn_ctx(
        &self,
        conn: Connection,
        hello: Option<Incarnation<NodeId>>,
    ) -> Arc<ConnCtx> {
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
    /// feeds the heartbeat machine. `Err` says why it is stale.
    pub(super) fn hear_from(&self, from: &Incarnation<NodeId>) -> Result<(), StaleSender> {
        let now = now();
        let mut state = lock(&self.state);
        let admission = state.fencing.admit(from)?;
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
            .handle_heartbeat(now, from.node.clone(), from.incarnation);
        drop(state);
        if heard == Heard::NewIncarnation {
            self.wake.notify_one();
        }
        match heard {
            Heard::Stale => Err(StaleSender::DeclaredDead { from: from.clone() }),
            Heard::Alive | Heard::NewIncarnation => Ok(()),
        }
    }

    /// Makes the connection of `ctx`, on which `incarnation` (already admitted by
    /// [`hear_from`](Self::hear_from)) just said hello, the one link used to send to its node:
    /// one link per peer, and the newest hello takes it over at once. A newer incarnation's
    /// connection replaces (and closes) the old one's; a new connection of the same
    /// incarnation (it dialed again, or it restarted without a newer incarnation) replaces the old
    /// link too, which is left open for what is in flight on it but carries nothing new:
    /// heartbeats and calls move to the connection the peer last said hello on, so a dead
    /// connection never keeps a live peer looking silent.
    pub(super) fn add_link(
        &self,
        ctx: &ConnCtx,
        incarnation: &Incarnation<NodeId>,
    ) -> Result<(), RefusedReason> {
        let mut state = lock(&self.state);
        let replaced = match state.peers.get(&incarnation.node) {
            None => {
                if state.peers.len() >= self.config.peers_max {
                    return Err(RefusedReason::TooManyPeers);
                }
                None
            }
            // `hear_from` refused anything older than the link's incarnation.
            Some(link) if link.incarnation.incarnation > incarnation.incarnation => return Ok(()),
            Some(link) => Some(link.clone()),
        };
        state.peers.insert(
            incarnation.node.clone(),
            PeerLink {
                conn: ctx.conn.clone(),
                conn_id: ctx.id,
                incarnation: incarnation.clone(),
            },
        );
        drop(state);
        self.linked.notify_waiters();
        if let Some(old) =
            replaced.filter(|old| old.incarnation.incarnation < incarnation.incarnation)
        {
            old.conn.close();
        }
        Ok(())
    }

    pub(super) fn publish(&self, event: PeerEvent) {
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|s| !s.is_closed());
        for s in subscribers.iter() {
            if s.try_send(event.clone()).is_err() {
                tracing::warn!(node = %self.me, "peer event subscriber lagging; event dropped");
            }
        }
    }
}
