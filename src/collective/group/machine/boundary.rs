//! What a group's members decide at a step boundary: one table of decisions, taken by the
//! member machine (which the membership simulator drives) and by
//! `MultiWorkerMirrored::at_step_boundary` in production alike, so that what the simulator
//! proves of departures and admissions is what a worker does.
//!
//! At every boundary each member votes (its notice to leave, if any; the leader, rank 0, adds
//! the joiners that asked it) and every member gets every vote, in rank order. From the same
//! votes every member takes the same decision ([`decide`]):
//! - where any member has a notice, the leavers leave and the stayers re-form without them at
//!   the next generation, by agreement; joiners wait for the next boundary (an admission and a
//!   departure at once would need the leavers to form a generation they then leave). Where a
//!   leaver was preempted (not drained), the chief saves the agreed step before anyone leaves
//!   ([`Leavers::needs_save`]): its supervisor may start it again, and it resumes from there;
//! - else, where the leader offers joiners, the members admit them;
//! - else nothing changes, and the next step runs.
//!
//! The leader's telling of an admission is sequenced here too, for both executors:
//! [`TellRound`] (whom to tell when, and when every joiner acked or the telling failed) is
//! polled alike by the member machine and by `ProcessGroup::admit`.
//!
//! Pure: no runtime, network or clock (time is passed in).

use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::ask_round::AskRound;
use super::Leave;

/// The leader telling each joiner its admission to a generation: every joiner is told at once,
/// again after a telling that could not be delivered while the joiner was not unreachable past
/// the lost bound ([`super::linking::lost_bound`]), within the form timeout ([`AskRound`]). The
/// admission goes ahead only where every joiner acked; a joiner that refused, was lost or did
/// not answer in time fails it (the members skip that generation, and the joiners ask again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TellRound {
    asks: AskRound<bool>,
}

/// What the leader's telling does next ([`TellRound::poll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TellStep {
    /// Tell these joiners now.
    pub(crate) tell: Vec<NodeId>,
    /// The telling's end, where it ended: whether every joiner acked.
    pub(crate) done: Option<bool>,
}

impl TellRound {
    /// Telling `joiners` their admission to `generation` from `now`, within `within`;
    /// `detection` is the transport's detection budget (the lost bound's measure).
    pub(crate) fn new(
        joiners: impl IntoIterator<Item = NodeId>,
        generation: u64,
        (now, within): (Instant, Duration),
        detection: Duration,
    ) -> Self {
        let lost_after = super::linking::lost_bound(generation, detection);
        Self {
            asks: AskRound::new(joiners, now, within, lost_after),
        }
    }

    /// `joiner` answered: `taken`, whether it acked its admission.
    pub(crate) fn answered(&mut self, joiner: &NodeId, taken: bool) {
        self.asks.answered(joiner, taken);
    }

    /// The telling of `joiner` that began at `began` could not be delivered (by `now`).
    pub(crate) fn undelivered(&mut self, joiner: &NodeId, began: Instant, now: Instant) {
        self.asks.undelivered(joiner, began, now);
    }

    /// What is due at `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> TellStep {
        let tell = self.asks.take_due(now);
        TellStep {
            tell,
            done: self
                .asks
                .finished(now)
                .then(|| self.asks.all_answered(true)),
        }
    }

    /// When the telling is next due without an answer (a telling again, or its end).
    pub(crate) fn wake_at(&self) -> Instant {
        self.asks.wake_at()
    }

    /// When the telling ends, answered or not.
    pub(crate) fn deadline(&self) -> Instant {
        self.asks.deadline()
    }
}

/// The members leaving at a step boundary: their ranks, and why each leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leavers {
    by_rank: Vec<(usize, Leave)>,
}

/// What the votes of a step boundary decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundaryChange {
    /// Nobody leaves and the leader offers no joiner: the next step runs.
    Unchanged,
    /// The leavers leave; the stayers re-form without them.
    Depart(Leavers),
    /// The members admit the joiners the leader offered.
    Admit,
}

/// The decision of a boundary whose votes were `notices` (each member's notice to leave, in
/// rank order); `offered`: whether the leader offered joiners.
pub(crate) fn decide(
    notices: impl IntoIterator<Item = Option<Leave>>,
    offered: bool,
) -> BoundaryChange {
    let by_rank: Vec<(usize, Leave)> = notices
        .into_iter()
        .enumerate()
        .filter_map(|(rank, notice)| Some((rank, notice?)))
        .collect();
    if !by_rank.is_empty() {
        return BoundaryChange::Depart(Leavers { by_rank });
    }
    if offered {
        return BoundaryChange::Admit;
    }
    BoundaryChange::Unchanged
}

impl Leavers {
    /// Why the member of `rank` leaves, if it does.
    pub(crate) fn of(&self, rank: usize) -> Option<Leave> {
        self.by_rank
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, why)| *why)
    }

    /// The members of `members` (in rank order) that leave.
    pub(crate) fn leaving<T: Clone>(&self, members: &[T]) -> Vec<T> {
        self.select(members, |why| why.is_some())
    }

    /// The members of `members` (in rank order) that were drained (leave for good).
    pub(crate) fn drained<T: Clone>(&self, members: &[T]) -> Vec<T> {
        self.select(members, |why| why == Some(Leave::Drained))
    }

    /// The members of `members` (in rank order) that stay: those the next generation is
    /// formed with.
    pub(crate) fn stayers<T: Clone>(&self, members: &[T]) -> Vec<T> {
        self.select(members, |why| why.is_none())
    }

    /// Whether the chief saves the agreed step before anyone leaves: a leaver was preempted
    /// (its supervisor may start it again, to resume from that save). Drained workers leave
    /// for good and the stayers hold the state, so a drain alone needs none.
    pub(crate) fn needs_save(&self) -> bool {
        self.by_rank.iter().any(|(_, why)| *why == Leave::Preempted)
    }

    fn select<T: Clone>(&self, members: &[T], keep: impl Fn(Option<Leave>) -> bool) -> Vec<T> {
        members
            .iter()
            .enumerate()
            .filter(|(rank, _)| keep(self.of(*rank)))
            .map(|(_, m)| m.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_makes_a_departure_before_any_admission() {
        let notices = [None, Some(Leave::Drained), None, Some(Leave::Preempted)];
        let BoundaryChange::Depart(leavers) = decide(notices, true) else {
            panic!("a notice departs")
        };
        let members = ["w0", "w1", "w2", "w3"];
        assert_eq!(leavers.leaving(&members), ["w1", "w3"]);
        assert_eq!(leavers.drained(&members), ["w1"]);
        assert_eq!(leavers.stayers(&members), ["w0", "w2"]);
        assert_eq!(leavers.of(3), Some(Leave::Preempted));
        assert_eq!(leavers.of(0), None);
        assert!(
            leavers.needs_save(),
            "a preempted leaver needs the chief's save"
        );
    }

    #[test]
    fn drains_alone_need_no_save_and_no_notice_admits_or_goes_on() {
        let BoundaryChange::Depart(leavers) = decide([Some(Leave::Drained), None], false) else {
            panic!("a drain departs")
        };
        assert!(!leavers.needs_save());
        assert_eq!(decide([None, None], true), BoundaryChange::Admit);
        assert_eq!(decide([None, None], false), BoundaryChange::Unchanged);
        assert_eq!(decide([], false), BoundaryChange::Unchanged);
    }

    #[test]
    fn a_telling_goes_ahead_only_where_every_joiner_acked_and_gives_up_on_a_lost_one() {
        let t0 = Instant::now();
        let joiners: Vec<NodeId> = (3..5).map(|i| NodeId::new("worker", i)).collect();
        let detection = Duration::from_millis(500);
        let new = |t0| TellRound::new(joiners.clone(), 3, (t0, Duration::from_secs(10)), detection);
        let mut telling = new(t0);
        let first = telling.poll(t0);
        assert_eq!((first.tell, first.done), (joiners.clone(), None));
        telling.answered(&joiners[0], true);
        telling.answered(&joiners[1], true);
        assert_eq!(telling.poll(t0).done, Some(true));
        // A refusal fails it.
        let mut refused = new(t0);
        let _ = refused.poll(t0);
        refused.answered(&joiners[0], true);
        refused.answered(&joiners[1], false);
        assert_eq!(refused.poll(t0).done, Some(false));
        // A joiner unreachable for twice the detection budget is given up: the telling fails
        // then, long before the form timeout.
        let mut lost = new(t0);
        let _ = lost.poll(t0);
        lost.answered(&joiners[0], true);
        lost.undelivered(&joiners[1], t0, t0 + Duration::from_millis(200));
        assert_eq!(lost.poll(t0 + Duration::from_millis(200)).done, None);
        let later = t0 + Duration::from_secs(1);
        lost.undelivered(&joiners[1], t0 + Duration::from_millis(300), later);
        assert_eq!(lost.poll(later).done, Some(false));
    }
}
