//! Asking each of some peers once for an answer, as a survivor probes the members of a broken
//! group ([`super::reforming::ProbeRound`]) and a leader tells the joiners their admission
//! ([`super::boundary::TellRound`]): every peer is asked at once, again [`DIAL_RETRY`] after an
//! ask that could not be delivered, until every one answered, or was unreachable past the
//! round's lost bound, or the round's time ran out. One round, polled alike by the member
//! machine (simulated messages) and by the mesh (requests over QUIC).
//!
//! Pure: time is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::super::DIAL_RETRY;

/// One round of asks (see the module doc); `R` is a peer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AskRound<R> {
    /// Every peer's answer, once it came.
    answers: BTreeMap<NodeId, Option<R>>,
    /// When each peer is to be asked (again).
    retry: BTreeMap<NodeId, Instant>,
    /// When an ask of each peer that could not be delivered began (the earliest).
    unreachable_since: BTreeMap<NodeId, Instant>,
    /// The peers unreachable past the lost bound: asked no more.
    lost: BTreeSet<NodeId>,
    deadline: Instant,
    /// How long a peer may stay unreachable before it is taken for lost (none: until the
    /// round's end).
    lost_after: Option<Duration>,
}

impl<R: Copy + PartialEq> AskRound<R> {
    /// Asking `peers` from `now`, within `within`; a peer unreachable for `lost_after` is
    /// asked no more.
    pub(crate) fn new(
        peers: impl IntoIterator<Item = NodeId>,
        now: Instant,
        within: Duration,
        lost_after: Option<Duration>,
    ) -> Self {
        let peers: Vec<NodeId> = peers.into_iter().collect();
        Self {
            answers: peers.iter().map(|n| (n.clone(), None)).collect(),
            retry: peers.into_iter().map(|n| (n, now)).collect(),
            unreachable_since: BTreeMap::new(),
            lost: BTreeSet::new(),
            deadline: now + within,
            lost_after,
        }
    }

    /// `from` answered `answer` (a peer the round does not ask counts for nothing).
    pub(crate) fn answered(&mut self, from: &NodeId, answer: R) {
        if let Some(slot) = self.answers.get_mut(from) {
            *slot = Some(answer);
        }
    }

    /// The ask of `to` that began at `began` could not be delivered (by `now`): it goes
    /// again soon, unless `to` answered meanwhile or has been unreachable past the lost bound.
    pub(crate) fn undelivered(&mut self, to: &NodeId, began: Instant, now: Instant) {
        if !self.answers.get(to).is_some_and(Option::is_none) {
            return;
        }
        let since = *self
            .unreachable_since
            .entry(to.clone())
            .and_modify(|since| *since = (*since).min(began))
            .or_insert(began);
        if self
            .lost_after
            .is_some_and(|bound| now.saturating_duration_since(since) >= bound)
        {
            self.lost.insert(to.clone());
            self.retry.remove(to);
        } else {
            self.retry.insert(to.clone(), now + DIAL_RETRY);
        }
    }

    /// The peers to ask at `now`, taken out of the schedule.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<NodeId> {
        let due: Vec<NodeId> = self
            .retry
            .iter()
            .filter(|(_, at)| now >= **at)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &due {
            self.retry.remove(n);
        }
        due
    }

    /// Whether the round is over at `now`: every peer answered or was lost, or its time ran out.
    pub(crate) fn finished(&self, now: Instant) -> bool {
        now >= self.deadline
            || self
                .answers
                .iter()
                .all(|(n, a)| a.is_some() || self.lost.contains(n))
    }

    /// `peer`'s answer, if it came.
    pub(crate) fn answer(&self, peer: &NodeId) -> Option<R> {
        self.answers.get(peer).copied().flatten()
    }

    /// Whether every peer answered `answer`.
    pub(crate) fn all_answered(&self, answer: R) -> bool {
        self.answers.values().all(|a| *a == Some(answer))
    }

    /// When the round is next due without an answer (an ask again, or its end).
    pub(crate) fn wake_at(&self) -> Instant {
        self.retry
            .values()
            .copied()
            .chain([self.deadline])
            .min()
            .unwrap_or(self.deadline)
    }

    /// When the round ends, answered or not.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: u32) -> Vec<NodeId> {
        (1..=n).map(|i| NodeId::new("worker", i)).collect()
    }

    #[test]
    fn a_peer_unreachable_past_the_lost_bound_is_asked_no_more_and_ends_the_round_for_it() {
        let t0 = Instant::now();
        let two = peers(2);
        let bound = Duration::from_secs(1);
        let mut round = AskRound::new(two.clone(), t0, Duration::from_secs(10), Some(bound));
        assert_eq!(round.take_due(t0), two);
        round.answered(&two[0], true);
        // Unreachable: asked again after a moment, while within the bound.
        let t1 = t0 + Duration::from_millis(300);
        round.undelivered(&two[1], t0, t1);
        assert_eq!(round.wake_at(), t1 + DIAL_RETRY);
        assert!(!round.finished(t1));
        assert_eq!(round.take_due(t1 + DIAL_RETRY), vec![two[1].clone()]);
        // Still unreachable a bound after its first failed ask began: lost.
        let t2 = t0 + bound;
        round.undelivered(&two[1], t1 + DIAL_RETRY, t2);
        assert!(round.finished(t2));
        assert_eq!(round.take_due(t2 + bound), Vec::<NodeId>::new());
        assert_eq!(round.answer(&two[1]), None);
        assert!(!round.all_answered(true));
    }

    #[test]
    fn without_a_lost_bound_an_unreachable_peer_is_asked_until_the_round_ends() {
        let t0 = Instant::now();
        let one = peers(1);
        let mut round = AskRound::<bool>::new(one.clone(), t0, Duration::from_secs(2), None);
        let _ = round.take_due(t0);
        round.undelivered(&one[0], t0, t0 + Duration::from_millis(1900));
        assert!(!round.finished(t0 + Duration::from_millis(1900)));
        assert!(round.finished(t0 + Duration::from_secs(2)));
        // A stranger's answer counts for nothing; a peer's answer ends the round.
        let mut answered = AskRound::new(one.clone(), t0, Duration::from_secs(2), None);
        answered.answered(&NodeId::new("worker", 9), false);
        assert!(!answered.finished(t0));
        answered.answered(&one[0], true);
        assert!(answered.finished(t0) && answered.all_answered(true));
    }
}
