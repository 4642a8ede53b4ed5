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

/// A request's future: what it gave, with its peer and when it began.
type Request<'a, T> = Pin<Box<dyn Future<Output = Answered<T>> + Send + 'a>>;

/// A request that ended.
pub(super) struct Answered<T> {
    /// The peer asked.
    pub(super) peer: NodeId,
    /// When the request began (a round's measure of how long a peer stays unreachable).
    pub(super) began: std::time::Instant,
    /// What it gave.
    pub(super) answer: T,
}

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
            let peer = peer.node.clone();
            let began = Instant::now().into_std();
            self.requests.push(Box::pin(async move {
                Answered {
                    peer,
                    began,
                    answer: request.await,
                }
            }));
        }
    }

    /// The next request to end, or `None` at `wake` with none.
    pub(super) async fn next_until(&mut self, wake: Instant) -> Option<Answered<T>> {
        if self.requests.is_empty() {
            tokio::time::sleep_until(wake).await;
            return None;
        }
        let answered = tokio::time::timeout_at(wake, self.requests.next())
            .await
            .ok()
            .flatten()?;
        self.asking.remove(&answered.peer);
        Some(answered)
    }
}
