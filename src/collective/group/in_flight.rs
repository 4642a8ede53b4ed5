//! Requests to peers in flight, at most one per peer: how the mesh carries out a membership
//! round's "ask these peers" ([`super::entry::EnterRound`], [`super::entry::JoinWait`],
//! [`super::reforming::ProbeRound`]) while it waits for the round's next moment.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use cohort_transport::NodeId;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::time::Instant;

use super::GroupMember;

/// A request's future: its peer, and what it gave.
type Request<'a, T> = Pin<Box<dyn Future<Output = (NodeId, T)> + Send + 'a>>;

/// The requests in flight (see the module doc).
pub(super) struct InFlight<'a, T> {
    requests: FuturesUnordered<Request<'a, T>>,
    asking: HashSet<NodeId>,
}

impl<T> Default for InFlight<'_, T> {
    fn default() -> Self {
        Self {
            requests: FuturesUnordered::new(),
            asking: HashSet::new(),
        }
    }
}

impl<'a, T: 'a> InFlight<'a, T> {
    /// Sends `peer` the request `request`, unless one to it is in flight still.
    pub(super) fn ask(&mut self, peer: &GroupMember, request: impl Future<Output = T> + Send + 'a) {
        if self.asking.insert(peer.node.clone()) {
            let node = peer.node.clone();
            self.requests
                .push(Box::pin(async move { (node, request.await) }));
        }
    }

    /// The next request to end (its peer and what it gave), or `None` at `wake` with none.
    pub(super) async fn next_until(&mut self, wake: Instant) -> Option<(NodeId, T)> {
        if self.requests.is_empty() {
            tokio::time::sleep_until(wake).await;
            return None;
        }
        let (node, answer) = tokio::time::timeout_at(wake, self.requests.next())
            .await
            .ok()
            .flatten()?;
        self.asking.remove(&node);
        Some((node, answer))
    }
}
