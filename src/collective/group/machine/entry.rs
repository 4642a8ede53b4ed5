//! How a starting process enters the job: one table of decisions, taken by the member machine
//! (which the membership simulator drives) and by `MultiWorkerMirrored`'s entry in production
//! alike, so that what the simulator proves of entering is what a worker does.
//!
//! A process asks every peer whether a group lives ([`super::super::Mesh::enter`]), then
//! either waits to be admitted to it or forms the first generation with every worker. What
//! comes next depends on how its last try ended ([`EnterAfter`]):
//! - a fresh start refused by a process that has no live group (one waiting to be admitted to
//!   a group that is gone, or whose own first forming failed) is tried again after
//!   [`FRESH_START_RETRY`], asking first whether a group lives after all, within the join
//!   timeout ([`after_failed_start`]). Exiting instead, the process may be restarted faster
//!   than the waiting one can see that no group lives (the membership simulator found a
//!   supervisor's budget so run out);
//! - a process not admitted that never formed a group (or whose only forming was a first
//!   generation that failed) asks again, starting as one that never formed
//!   ([`after_not_admitted`]); a member of an older group exits;
//! - any other end of a try asks again once, then exits (its supervisor restarts it).
//!
//! Pure: time is passed in.

use std::time::{Duration, Instant};

use super::super::FRESH_START_RETRY;

/// How a starting process goes on after the others' answers to its ask to enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnterAfter {
    /// Its first ask: form the first generation, or join.
    First,
    /// Its forming of the first generation failed: join if a group lives, else exit.
    FailedStart,
    /// It was not admitted: form the first generation if no group lives, else exit.
    FailedJoin,
    /// Its fresh start was refused by a process with no live group: join if a group lives
    /// after all, else form the first generation again, within `until`.
    StartAgain {
        /// When it stops trying the first generation again.
        until: Instant,
    },
}

/// What an entering process does next, once the others answered its ask to enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryStep {
    /// Wait to be admitted to the live group (within the join timeout).
    Join,
    /// Form the first generation with every worker; a refusal may be tried again until
    /// `until` ([`after_failed_start`]).
    FreshStart {
        /// When it stops trying the first generation again.
        until: Instant,
    },
    /// Give up: the process exits with the error of its last try.
    Exit,
}

impl EnterAfter {
    /// The step after the others answered at `now`: `live`, whether one of them has a live
    /// group.
    pub(crate) fn next(self, live: bool, now: Instant, join_timeout: Duration) -> EntryStep {
        match (self, live) {
            (EnterAfter::FailedJoin, true) => EntryStep::Exit,
            (_, true) => EntryStep::Join,
            (EnterAfter::First | EnterAfter::FailedJoin, false) => EntryStep::FreshStart {
                until: now + join_timeout,
            },
            (EnterAfter::StartAgain { until }, false) if now < until => {
                EntryStep::FreshStart { until }
            }
            (EnterAfter::FailedStart | EnterAfter::StartAgain { .. }, false) => EntryStep::Exit,
        }
    }
}

/// What follows a fresh start that failed at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailedStart {
    /// Ask again at `at` whether a group lives, then join it or form the first generation
    /// again ([`EnterAfter::StartAgain`]).
    RetryAt {
        /// When to ask again.
        at: Instant,
        /// When to stop trying the first generation again.
        until: Instant,
    },
    /// Ask again whether a group lives: join it, or exit ([`EnterAfter::FailedStart`]).
    AskAgain,
}

/// A fresh start (tried within `until`) failed at `now`; `refused`: a member refused the first
/// generation. Only a refusal is tried again, and only where `forget_failed_start` forgets
/// this process's failed start (it formed no group and waits for no admission), so that the
/// first generation can be formed again.
pub(crate) fn after_failed_start(
    refused: bool,
    now: Instant,
    until: Instant,
    forget_failed_start: impl FnOnce() -> bool,
) -> AfterFailedStart {
    if refused && now < until && forget_failed_start() {
        AfterFailedStart::RetryAt {
            at: now + FRESH_START_RETRY,
            until,
        }
    } else {
        AfterFailedStart::AskAgain
    }
}

/// A joiner was not admitted: where `never_formed` (no group was ever formed here, or its only
/// forming was a first generation that failed, now forgotten), it asks whether the others start
/// again ([`EnterAfter::FailedJoin`]); else (a member of an older group) it exits (`None`).
pub(crate) fn after_not_admitted(never_formed: bool) -> Option<EnterAfter> {
    never_formed.then_some(EnterAfter::FailedJoin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entering_follows_one_table() {
        let now = Instant::now();
        let join = Duration::from_secs(10);
        let until = now + join;
        // A live group: join it, unless this process was just not admitted to it.
        assert_eq!(EnterAfter::First.next(true, now, join), EntryStep::Join);
        assert_eq!(
            EnterAfter::FailedStart.next(true, now, join),
            EntryStep::Join
        );
        assert_eq!(
            EnterAfter::StartAgain { until }.next(true, now, join),
            EntryStep::Join
        );
        assert_eq!(
            EnterAfter::FailedJoin.next(true, now, join),
            EntryStep::Exit
        );
        // No live group: start, or start again within the bound; a failed start exits.
        assert_eq!(
            EnterAfter::First.next(false, now, join),
            EntryStep::FreshStart { until }
        );
        assert_eq!(
            EnterAfter::FailedJoin.next(false, now, join),
            EntryStep::FreshStart { until }
        );
        assert_eq!(
            EnterAfter::StartAgain { until }.next(false, now, join),
            EntryStep::FreshStart { until }
        );
        assert_eq!(
            EnterAfter::StartAgain { until }.next(false, until, join),
            EntryStep::Exit
        );
        assert_eq!(
            EnterAfter::FailedStart.next(false, now, join),
            EntryStep::Exit
        );
    }

    #[test]
    fn only_a_refused_start_that_could_be_forgotten_is_tried_again_in_time() {
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        assert_eq!(
            after_failed_start(true, now, until, || true),
            AfterFailedStart::RetryAt {
                at: now + FRESH_START_RETRY,
                until
            }
        );
        assert_eq!(
            after_failed_start(false, now, until, || true),
            AfterFailedStart::AskAgain
        );
        assert_eq!(
            after_failed_start(true, now, until, || false),
            AfterFailedStart::AskAgain
        );
        assert_eq!(
            after_failed_start(true, until, until, || true),
            AfterFailedStart::AskAgain
        );
        assert_eq!(after_not_admitted(true), Some(EnterAfter::FailedJoin));
        assert_eq!(after_not_admitted(false), None);
    }
}
