//! Forming one link of a generation: which end dials, when a peer that neither takes a join
//! nor answers is taken for lost, and what a peer's answer to "do you still form it?" means for
//! the forming that asked. One table, taken by the member machine (which the membership
//! simulator drives) and by the mesh's forming in production (`forming.rs`) alike. (What a
//! mesh answers to that question is [`super::Membership::handle_still_forming`]'s.)
//!
//! [`FormLink`] is one link's course while a generation forms: when its join goes out (again),
//! when the peer is asked whether it still forms, and when it is taken for lost. The member
//! machine keeps one per peer of a forming group; production's `Mesh::link_once` and
//! `Mesh::wait_for_join` each drive one over QUIC.
//!
//! Pure: time is passed in.

use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::super::{DIAL_RETRY, STILL_FORMING_EVERY};

/// Whether `me` dials `peer` and joins (the larger node id does), rather than waiting for the
/// peer's join.
pub(crate) fn dials(me: &NodeId, peer: &NodeId) -> bool {
    me > peer
}

/// Whether a peer unreachable (its dial failing, or its answers missing) since `since` is taken
/// for lost at `now` while forming `generation`: the bound it passed, if so. Never for the first
/// generation, whose processes may still be starting (the form timeout bounds it); twice the
/// transport's `detection` budget (its idle timeout) for a later one, whose members answered a
/// probe just before (re-forming) or are live members (an admission), so that a member lost
/// meanwhile costs about the detection budget, not the form timeout.
pub(crate) fn lost_while_re_forming(
    generation: u64,
    since: Instant,
    now: Instant,
    detection: Duration,
) -> Option<Duration> {
    lost_bound(generation, detection).filter(|bound| now.duration_since(since) >= *bound)
}

/// How long a peer may stay unreachable while this member forms `generation` (or probes or
/// admits for it) before it is taken for lost ([`lost_while_re_forming`]): twice `detection`
/// for a later generation, none for the first.
pub(crate) fn lost_bound(generation: u64, detection: Duration) -> Option<Duration> {
    (generation > 1).then_some(detection * 2)
}

/// What a peer whose join this member awaits answered when asked whether it still forms the
/// generation with the same members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StillHeard {
    /// It forms it (or will: its join may still come).
    Forms,
    /// It never will, or forms it with other members.
    Refused,
    /// Its forming of it broke.
    Broken,
}

/// Whether the answer `heard` fails this member's forming of `generation` (else it waits on for
/// the peer's join). A refusal does. A broken forming does, except for the first generation:
/// there it was cut short at the peer (a member formed it and re-forms), and that member's probe
/// decides whether this one survives or joins.
pub(crate) fn ends_forming(generation: u64, heard: StillHeard) -> bool {
    match heard {
        StillHeard::Forms => false,
        StillHeard::Refused => true,
        StillHeard::Broken => generation > 1,
    }
}

/// One link of a generation being formed, from this member's end (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FormLink {
    /// This member joins the peer: its join goes out at `retry` (none: it is on its way).
    Dialing {
        retry: Option<Instant>,
        /// When the first join that could not be delivered was sent.
        unreachable_since: Option<Instant>,
    },
    /// This member waits for the peer's join, asking at `next_ask` whether it still forms.
    Waiting {
        next_ask: Instant,
        /// Whether the peer answered the last ask.
        answered: bool,
        /// When the first ask it did not answer was sent.
        silent_since: Option<Instant>,
    },
    /// The link is up.
    Up,
}

/// What a link of a forming owes its peer now ([`FormLink::due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkDue {
    /// Send the join (the first, or again after one that could not be delivered).
    Join,
    /// Ask the peer whether it still forms the generation with the same members.
    AskStillForming,
    /// The peer has been unreachable or silent past this bound: the forming fails.
    Lost(Duration),
}

impl FormLink {
    /// The link between `me` and `peer` as a forming begins at `now`: the larger node id joins
    /// at once, the other waits, asking first one [`STILL_FORMING_EVERY`] from now.
    pub(crate) fn new(me: &NodeId, peer: &NodeId, now: Instant) -> Self {
        if dials(me, peer) {
            Self::Dialing {
                retry: Some(now),
                unreachable_since: None,
            }
        } else {
            Self::Waiting {
                next_ask: now + STILL_FORMING_EVERY,
                answered: true,
                silent_since: None,
            }
        }
    }

    /// What is due at `now` while forming `generation` (on the transport's `detection`
    /// budget), taken out of the schedule: a peer lost ([`lost_while_re_forming`]) before
    /// anything else.
    pub(crate) fn due(
        &mut self,
        now: Instant,
        generation: u64,
        detection: Duration,
    ) -> Option<LinkDue> {
        let lost = |since: Instant| lost_while_re_forming(generation, since, now, detection);
        match self {
            Self::Dialing {
                retry,
                unreachable_since,
            } => {
                if let Some(bound) = unreachable_since.and_then(lost) {
                    return Some(LinkDue::Lost(bound));
                }
                if !retry.is_some_and(|at| now >= at) {
                    return None;
                }
                *retry = None;
                Some(LinkDue::Join)
            }
            Self::Waiting {
                next_ask,
                answered,
                silent_since,
            } => {
                if now < *next_ask {
                    return None;
                }
                if !*answered {
                    // Silent since the ask it did not answer went out.
                    let since = *silent_since.get_or_insert(*next_ask - STILL_FORMING_EVERY);
                    if let Some(bound) = lost(since) {
                        return Some(LinkDue::Lost(bound));
                    }
                }
                *answered = false;
                *next_ask = now + STILL_FORMING_EVERY;
                Some(LinkDue::AskStillForming)
            }
            Self::Up => None,
        }
    }

    /// The join sent at `began` could not be delivered (by `now`): it goes again
    /// [`DIAL_RETRY`] from now.
    pub(crate) fn undelivered(&mut self, began: Instant, now: Instant) {
        if let Self::Dialing {
            retry,
            unreachable_since,
        } = self
        {
            unreachable_since.get_or_insert(began);
            *retry = Some(now + DIAL_RETRY);
        }
    }

    /// The peer answered that it still forms the generation: it is not silent.
    pub(crate) fn heard_still_forming(&mut self) {
        if let Self::Waiting {
            answered,
            silent_since,
            ..
        } = self
        {
            *answered = true;
            *silent_since = None;
        }
    }

    /// The link is up (the peer took this member's join, or this member took the peer's).
    pub(crate) fn up(&mut self) {
        *self = Self::Up;
    }

    pub(crate) fn is_up(&self) -> bool {
        *self == Self::Up
    }

    /// Whether this member joins the peer (rather than waiting for its join).
    pub(crate) fn is_dialing(&self) -> bool {
        matches!(self, Self::Dialing { .. })
    }

    /// When something is next due on this link without an answer (none: nothing is).
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        match self {
            Self::Dialing { retry, .. } => *retry,
            Self::Waiting { next_ask, .. } => Some(*next_ask),
            Self::Up => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_node_dials() {
        let (w0, w1) = (NodeId::new("worker", 0), NodeId::new("worker", 1));
        assert!(dials(&w1, &w0));
        assert!(!dials(&w0, &w1));
    }

    #[test]
    fn a_silent_peer_is_lost_after_twice_the_detection_budget_except_at_the_first_generation() {
        let t0 = Instant::now();
        let detection = Duration::from_secs(3);
        let later = t0 + Duration::from_secs(6);
        assert_eq!(
            lost_while_re_forming(2, t0, later, detection),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            lost_while_re_forming(2, t0, later - Duration::from_millis(1), detection),
            None
        );
        assert_eq!(lost_while_re_forming(1, t0, later, detection), None);
    }

    #[test]
    fn a_refusal_ends_forming_and_a_broken_one_ends_it_past_the_first_generation() {
        assert!(!ends_forming(3, StillHeard::Forms));
        assert!(ends_forming(1, StillHeard::Refused));
        assert!(ends_forming(2, StillHeard::Broken));
        assert!(!ends_forming(1, StillHeard::Broken));
    }

    #[test]
    fn a_join_that_cannot_be_delivered_goes_again_until_the_peer_is_lost() {
        let (w0, w1) = (NodeId::new("worker", 0), NodeId::new("worker", 1));
        let t0 = Instant::now();
        let detection = Duration::from_secs(1);
        let mut link = FormLink::new(&w1, &w0, t0);
        assert!(link.is_dialing());
        assert_eq!(link.due(t0, 2, detection), Some(LinkDue::Join));
        assert_eq!(link.due(t0, 2, detection), None, "the join is on its way");
        let t1 = t0 + Duration::from_millis(50);
        link.undelivered(t0, t1);
        assert_eq!(link.wake_at(), Some(t1 + DIAL_RETRY));
        assert_eq!(link.due(t1, 2, detection), None);
        assert_eq!(link.due(t1 + DIAL_RETRY, 2, detection), Some(LinkDue::Join));
        // Unreachable since the first failed join: lost twice the detection budget later,
        // but never at the first generation.
        let t2 = t0 + 2 * detection;
        link.undelivered(t1 + DIAL_RETRY, t2);
        assert_eq!(
            link.due(t2, 2, detection),
            Some(LinkDue::Lost(2 * detection))
        );
        let mut first = FormLink::new(&w1, &w0, t0);
        let _ = first.due(t0, 1, detection);
        first.undelivered(t0, t2);
        assert_eq!(
            first.due(t2 + DIAL_RETRY, 1, detection),
            Some(LinkDue::Join)
        );
        link.up();
        assert!(link.is_up() && link.wake_at().is_none());
    }

    #[test]
    fn a_waiting_end_asks_each_period_and_a_silent_peer_is_lost() {
        let (w0, w1) = (NodeId::new("worker", 0), NodeId::new("worker", 1));
        let t0 = Instant::now();
        let detection = Duration::from_secs(1);
        let mut link = FormLink::new(&w0, &w1, t0);
        assert!(!link.is_dialing());
        assert_eq!(link.due(t0, 2, detection), None);
        let ask1 = t0 + STILL_FORMING_EVERY;
        assert_eq!(link.due(ask1, 2, detection), Some(LinkDue::AskStillForming));
        link.heard_still_forming();
        let ask2 = ask1 + STILL_FORMING_EVERY;
        assert_eq!(link.due(ask2, 2, detection), Some(LinkDue::AskStillForming));
        // Unanswered from ask2 on: silent since ask2, lost once that is twice the budget ago.
        let mut at = ask2;
        let lost = loop {
            at += STILL_FORMING_EVERY;
            match link.due(at, 2, detection) {
                Some(LinkDue::AskStillForming) => continue,
                other => break (other, at),
            }
        };
        assert_eq!(lost.0, Some(LinkDue::Lost(2 * detection)));
        assert!(lost.1.duration_since(ask2) >= 2 * detection);
        assert!(lost.1.duration_since(ask2) < 2 * detection + STILL_FORMING_EVERY);
    }
}
