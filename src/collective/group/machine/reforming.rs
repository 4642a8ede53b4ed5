//! How a survivor re-forms a broken group: one table of decisions, taken by the member machine
//! (which the membership simulator drives) and by `MultiWorkerMirrored::recover` in production
//! alike, so that what the simulator proves of re-forming is what a worker does.
//!
//! A re-forming is a run of attempts, at most the job's `recover_attempts`. Each attempt probes
//! the members of the group that broke (always that group, not one an earlier attempt formed:
//! a group formed at one member and failed at another would give them different measures),
//! judges the answers ([`judge`]: this worker left out, no quorum, or the survivors to form the
//! next generation with), and forms the next generation ([`super::Membership::next_generation`])
//! with the survivors, who then agree on the training state. An attempt that ends without a
//! group that agreed on the state (no quorum, forming failed, the agreement failed) is
//! followed by the next ([`Attempt::failed`]), which begins a probe timeout after the failed
//! one began: survivors whose attempts failed at different moments begin the next about as far
//! apart as they began this one, and forming waits for the later ones (up to the form
//! timeout). After the last attempt the process gives up, and its supervisor restarts it.
//!
//! Pure: time is passed in.

use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::quorum::has_quorum;

/// What the answers to a survivor's probes of a broken group's members decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The members this survivor reached (itself among them) are no quorum of the members not
    /// `replaced` (answered as new processes, their old ones gone): this attempt fails.
    NoQuorum {
        reached: Vec<NodeId>,
        replaced: Vec<NodeId>,
    },
    /// Form the next generation with `survivors` (in the broken group's rank order).
    Form { survivors: Vec<NodeId> },
}

/// The verdict on the probes of `previous` (the broken group's members, in rank order, this
/// survivor among them): `alive`, the members that answered as survivors (this one among
/// them); `joining`, those whose address answered as a new process waiting to be admitted.
/// Members that answered nothing, or could not yet say, are in neither. (A member whose live
/// group of a later generation left this survivor out ends the re-forming before any verdict.)
pub(crate) fn judge(previous: &[NodeId], alive: &[NodeId], joining: &[NodeId]) -> Verdict {
    if !has_quorum(previous, joining, alive) {
        return Verdict::NoQuorum {
            reached: alive.to_vec(),
            replaced: joining.to_vec(),
        };
    }
    Verdict::Form {
        survivors: previous
            .iter()
            .filter(|n| alive.contains(n))
            .cloned()
            .collect(),
    }
}

/// One attempt of a re-forming: its number (from 1) and when it began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// Its number, from 1.
    pub(crate) number: usize,
    /// When it began (its probes went out).
    pub(crate) began: Instant,
}

/// What follows an attempt that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterAttempt {
    /// Attempt `number` begins at `at` (or at once, where that has passed).
    Next { number: usize, at: Instant },
    /// The last attempt failed: the process gives up. `no_quorum`: the last one failed for want
    /// of a quorum (the error then says so).
    GiveUp { no_quorum: bool },
}

impl Attempt {
    /// The first attempt, beginning at `now`.
    pub(crate) fn first(now: Instant) -> Self {
        Self {
            number: 1,
            began: now,
        }
    }

    /// Attempt `number`, beginning at `now` (what [`AfterAttempt::Next`] said).
    pub(crate) fn begin(number: usize, now: Instant) -> Self {
        Self { number, began: now }
    }

    /// This attempt failed at `now` (`no_quorum`: for want of a quorum); `limit`: the attempts a
    /// re-forming makes; `span`: how long each spans at least (the probe timeout).
    pub(crate) fn failed(
        &self,
        now: Instant,
        limit: usize,
        span: Duration,
        no_quorum: bool,
    ) -> AfterAttempt {
        if self.number >= limit {
            return AfterAttempt::GiveUp { no_quorum };
        }
        AfterAttempt::Next {
            number: self.number + 1,
            at: (self.began + span).max(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u32) -> Vec<NodeId> {
        (0..n).map(|i| NodeId::new("worker", i)).collect()
    }

    #[test]
    fn survivors_with_quorum_form_in_rank_order_and_a_minority_does_not() {
        let three = workers(3);
        let alive = vec![three[2].clone(), three[0].clone()];
        assert_eq!(
            judge(&three, &alive, &[]),
            Verdict::Form {
                survivors: vec![three[0].clone(), three[2].clone()]
            }
        );
        assert_eq!(
            judge(&three, &three[2..], &[]),
            Verdict::NoQuorum {
                reached: three[2..].to_vec(),
                replaced: vec![]
            }
        );
        // Worker 1 alone of 3, with worker 2 a new process: one of the 2 counted, not the
        // lowest-ranked, so no quorum; worker 0 alone with worker 2 replaced goes on.
        assert!(matches!(
            judge(&three, &three[1..2], &three[2..]),
            Verdict::NoQuorum { .. }
        ));
        assert_eq!(
            judge(&three, &three[..1], &three[2..]),
            Verdict::Form {
                survivors: three[..1].to_vec()
            }
        );
    }

    #[test]
    fn a_failed_attempt_is_followed_a_probe_timeout_after_it_began_until_the_last() {
        let t0 = Instant::now();
        let span = Duration::from_secs(2);
        let first = Attempt::first(t0);
        // Failed early: the next waits until the span has passed.
        assert_eq!(
            first.failed(t0 + Duration::from_millis(300), 3, span, true),
            AfterAttempt::Next {
                number: 2,
                at: t0 + span
            }
        );
        // Failed late: the next begins at once.
        let late = t0 + Duration::from_secs(5);
        assert_eq!(
            first.failed(late, 3, span, false),
            AfterAttempt::Next {
                number: 2,
                at: late
            }
        );
        let last = Attempt::begin(3, late);
        assert_eq!(
            last.failed(late, 3, span, true),
            AfterAttempt::GiveUp { no_quorum: true }
        );
        assert_eq!(
            Attempt::first(t0).failed(t0, 1, span, false),
            AfterAttempt::GiveUp { no_quorum: false }
        );
    }
}
