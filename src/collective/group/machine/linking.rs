//! Forming one link of a generation: which end dials, when a peer that neither takes a join
//! nor answers is taken for lost, and what a peer's answer to "do you still form it?" means for
//! the forming that asked. One table, taken by the member machine (which the membership
//! simulator drives) and by the mesh's forming in production (`forming.rs`) alike. (What a
//! mesh answers to that question is [`super::Membership::handle_still_forming`]'s.)
//!
//! Pure: time is passed in.

use std::time::{Duration, Instant};

use cohort_transport::NodeId;

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
}
