//! The restart policy: a pure machine that decides, for each failure of a supervised child,
//! whether to restart it (after how long) or to escalate to the parent.
//!
//! It owns the sliding window of recent failures and nothing else: no clock, no timer, no actor.
//! Roles are crash-only (see [`supervisor`](crate::supervisor)), so the children are processes:
//! the process supervisor (cohort's local launcher) feeds it each exit of a task with the time
//! passed in and honours the delay it returns.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Limits of a [`RestartPolicy`]: at most `restarts_max` restarts within any sliding window of
/// `window`, each delayed by an exponential backoff from `backoff_base` capped at `backoff_max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartLimits {
    /// Restarts allowed within one window; the failure after that many escalates.
    pub restarts_max: u32,
    /// Length of the sliding window over which restarts are counted.
    pub window: Duration,
    /// Delay before the first restart in a window; doubled for each further restart.
    pub backoff_base: Duration,
    /// Upper bound of the delay before any restart.
    pub backoff_max: Duration,
}

impl Default for RestartLimits {
    /// 3 restarts within 60 s, backoff 100 ms doubling up to 5 s.
    fn default() -> Self {
        Self {
            restarts_max: 3,
            window: Duration::from_secs(60),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// What the supervisor must do about one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartDecision {
    /// Rebuild the child after waiting `after`; `attempt` is the 1-based number of this restart
    /// within the current window.
    Restart {
        /// Backoff delay to honour before rebuilding the child.
        after: Duration,
        /// Which restart this is within the window (1 for the first).
        attempt: u32,
    },
    /// Too many failures within the window: give up on the child and tell the parent.
    Escalate {
        /// Failures counted within the window, including this one.
        failures_in_window: u32,
    },
}

/// Restart decisions for one child: at most N restarts in a sliding window, exponential backoff
/// with a cap, then escalate.
///
/// Calling protocol:
/// 1. Create one policy per supervised child with [`RestartPolicy::new`].
/// 2. Each time the child fails, call [`RestartPolicy::handle_failure`] with the time of the
///    failure (non-decreasing across calls).
/// 3. On [`RestartDecision::Restart`], wait `after`, then rebuild the child from its source of
///    truth; on [`RestartDecision::Escalate`], stop the child and report to the parent. Once it
///    has escalated, the policy keeps answering `Escalate` until [`RestartPolicy::reset`].
///
/// The `restarts_max + 1`-th failure within any window of `window` escalates. The backoff of the
/// k-th restart in the window (k from 1) is `backoff_base * 2^(k-1)`, capped at `backoff_max`;
/// failures older than the window are forgotten, so a child that has been healthy for a whole
/// window starts again from `backoff_base`.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    limits: RestartLimits,
    /// Times of the failures that led to a restart, oldest first, all within the window.
    restarts: VecDeque<Instant>,
    escalated: bool,
}

impl RestartPolicy {
    /// A policy with no failures recorded yet.
    pub fn new(limits: RestartLimits) -> Self {
        Self {
            limits,
            restarts: VecDeque::new(),
            escalated: false,
        }
    }

    /// The limits this policy applies.
    pub fn limits(&self) -> &RestartLimits {
        &self.limits
    }

    /// Records a failure at `now` and decides what to do about it.
    pub fn handle_failure(&mut self, now: Instant) -> RestartDecision {
        self.forget_before(now);
        let in_window = u32::try_from(self.restarts.len()).unwrap_or(u32::MAX);
        if self.escalated || in_window >= self.limits.restarts_max {
            self.escalated = true;
            return RestartDecision::Escalate {
                failures_in_window: in_window.saturating_add(1),
            };
        }
        self.restarts.push_back(now);
        let attempt = in_window + 1;
        RestartDecision::Restart {
            after: self.backoff(attempt),
            attempt,
        }
    }

    /// The delay before starting again a child that left on a preemption notice (it saved or
    /// handed back its work and exited as asked). A preemption is not a failure of the child:
    /// it spends nothing of `restarts_max` and does not grow the backoff, so a long job on
    /// spot machines, preempted far more often than any crash budget allows, is neither
    /// escalated nor left waiting ever longer; the child comes back after `backoff_base`, as
    /// after a first failure. Crashes around it are counted as before.
    pub fn after_preemption(&self) -> Duration {
        self.limits.backoff_base
    }

    /// Restarts counted within the window ending at `now`.
    pub fn restarts_in_window(&self, now: Instant) -> u32 {
        let count = self
            .restarts
            .iter()
            .filter(|&&t| !self.expired(t, now))
            .count();
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// Whether the policy has escalated (and keeps escalating until reset).
    pub fn has_escalated(&self) -> bool {
        self.escalated
    }

    /// Forgets every failure and the escalation, as for a freshly supervised child.
    pub fn reset(&mut self) {
        self.restarts.clear();
        self.escalated = false;
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(BACKOFF_DOUBLINGS_MAX);
        let factor = 1u32 << shift;
        self.limits
            .backoff_base
            .checked_mul(factor)
            .unwrap_or(self.limits.backoff_max)
            .min(self.limits.backoff_max)
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some(&oldest) = self.restarts.front() {
            if self.expired(oldest, now) {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
    }

    /// A failure at `t` no longer counts once a whole window has passed since it.
    fn expired(&self, t: Instant, now: Instant) -> bool {
        now.saturating_duration_since(t) >= self.limits.window
    }
}

/// 2^30 times any sensible base already exceeds any sensible cap; bounding the shift keeps the
/// multiplication from overflowing.
const BACKOFF_DOUBLINGS_MAX: u32 = 30;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(n: u32) -> RestartLimits {
        RestartLimits {
            restarts_max: n,
            window: Duration::from_secs(10),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn preemptions_spend_no_budget_and_do_not_grow_the_backoff() {
        let t0 = Instant::now();
        let mut p = RestartPolicy::new(limits(2));
        for _ in 0..50 {
            assert_eq!(p.after_preemption(), ms(100));
        }
        assert_eq!(p.restarts_in_window(t0), 0);
        // Crashes are counted as if no preemption had happened.
        assert_eq!(
            p.handle_failure(t0),
            RestartDecision::Restart {
                after: ms(100),
                attempt: 1
            }
        );
        assert_eq!(p.after_preemption(), ms(100));
        assert_eq!(
            p.handle_failure(t0 + ms(1)),
            RestartDecision::Restart {
                after: ms(200),
                attempt: 2
            }
        );
        assert!(matches!(
            p.handle_failure(t0 + ms(2)),
            RestartDecision::Escalate { .. }
        ));
    }

    #[test]
    fn backoff_doubles_then_caps_then_escalates() {
        let t0 = Instant::now();
        let mut p = RestartPolicy::new(limits(6));
        let afters: Vec<_> = (0..6)
            .map(|i| match p.handle_failure(t0 + ms(i)) {
                RestartDecision::Restart { after, attempt } => {
                    assert_eq!(attempt as u64, i + 1);
                    after
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            afters,
            vec![ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(
            p.handle_failure(t0 + ms(7)),
            RestartDecision::Escalate {
                failures_in_window: 7
            }
        );
        assert!(p.has_escalated());
    }

    #[test]
    fn failures_spread_beyond_the_window_never_escalate() {
        let t0 = Instant::now();
        let mut p = RestartPolicy::new(limits(2));
        for i in 0..20 {
            // One failure every 6 s: at most two within any 10 s window.
            let d = p.handle_failure(t0 + Duration::from_secs(6 * i));
            assert!(matches!(d, RestartDecision::Restart { .. }), "{i}: {d:?}");
        }
    }

    #[test]
    fn window_slides_and_backoff_restarts_from_base() {
        let t0 = Instant::now();
        let mut p = RestartPolicy::new(limits(2));
        assert!(matches!(
            p.handle_failure(t0),
            RestartDecision::Restart { after, attempt: 1 } if after == ms(100)
        ));
        assert!(matches!(
            p.handle_failure(t0 + Duration::from_secs(5)),
            RestartDecision::Restart { after, attempt: 2 } if after == ms(200)
        ));
        // The first failure left the window exactly at t0 + 10 s.
        assert_eq!(p.restarts_in_window(t0 + Duration::from_secs(10)), 1);
        assert!(matches!(
            p.handle_failure(t0 + Duration::from_secs(10)),
            RestartDecision::Restart { attempt: 2, .. }
        ));
        // Three failures within (5 s, 10 s]: the third restart in the window escalates.
        assert!(matches!(
            p.handle_failure(t0 + Duration::from_secs(11)),
            RestartDecision::Escalate {
                failures_in_window: 3
            }
        ));
    }

    #[test]
    fn escalation_is_sticky_until_reset() {
        let t0 = Instant::now();
        let mut p = RestartPolicy::new(limits(1));
        assert!(matches!(
            p.handle_failure(t0),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            p.handle_failure(t0),
            RestartDecision::Escalate { .. }
        ));
        // Even after the window passed, an escalated policy stays escalated.
        assert!(matches!(
            p.handle_failure(t0 + Duration::from_secs(60)),
            RestartDecision::Escalate { .. }
        ));
        p.reset();
        assert!(matches!(
            p.handle_failure(t0 + Duration::from_secs(61)),
            RestartDecision::Restart { attempt: 1, .. }
        ));
    }

    #[test]
    fn zero_restarts_escalates_on_first_failure() {
        let mut p = RestartPolicy::new(limits(0));
        assert_eq!(
            p.handle_failure(Instant::now()),
            RestartDecision::Escalate {
                failures_in_window: 1
            }
        );
    }

    #[test]
    fn huge_base_saturates_at_cap() {
        let mut p = RestartPolicy::new(RestartLimits {
            restarts_max: 100,
            window: Duration::from_secs(1),
            backoff_base: Duration::MAX,
            backoff_max: Duration::from_secs(3),
        });
        let t0 = Instant::now();
        for _ in 0..50 {
            assert!(matches!(
                p.handle_failure(t0),
                RestartDecision::Restart { after, .. } if after == Duration::from_secs(3)
            ));
        }
    }

    proptest! {
        /// Over any order of failure times: never more than `restarts_max` restarts within any
        /// window, every delay within [base, cap], and escalation exactly when the window is full.
        #[test]
        fn never_more_than_n_restarts_in_any_window(
            n in 0u32..6,
            gaps_ms in proptest::collection::vec(0u64..4_000, 1..60),
        ) {
            let l = limits(n);
            let t0 = Instant::now();
            let mut p = RestartPolicy::new(l.clone());
            let mut now = t0;
            let mut restarts: Vec<Instant> = Vec::new();
            for gap in gaps_ms {
                now += ms(gap);
                let recent = restarts.iter().filter(|&&t| now.duration_since(t) < l.window).count();
                match p.handle_failure(now) {
                    RestartDecision::Restart { after, attempt } => {
                        prop_assert!(recent < n as usize);
                        prop_assert_eq!(attempt as usize, recent + 1);
                        prop_assert!(after >= l.backoff_base && after <= l.backoff_max);
                        restarts.push(now);
                    }
                    RestartDecision::Escalate { .. } => {
                        prop_assert!(recent >= n as usize);
                        break;
                    }
                }
            }
        }
    }
}
