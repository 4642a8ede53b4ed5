//! How a starting process enters the job: one table of decisions, taken by the member machine
//! (which the membership simulator drives) and by `MultiWorkerMirrored`'s entry in production
//! alike, so that what the simulator proves of entering is what a worker does.
//!
//! A process asks every peer whether a group lives ([`super::super::Mesh::enter`]), then
//! either waits to be admitted to it or forms the first generation with every worker. What
//! comes next depends on how its last try ended ([`EnterAfter`]):
//! - a fresh start that failed (refused by a process that has no live group, one waiting to
//!   be admitted to a group that is gone or whose own first forming failed; aborted by a member
//!   whose forming broke; ended by a survivor's probe; timed out) is tried again after
//!   [`FRESH_START_RETRY`], asking first whether a group lives after all, within the join
//!   timeout ([`after_failed_start`]). Exiting instead, the process may be restarted faster
//!   than the others can see that no group lives (the membership simulator found a
//!   supervisor's budget so run out, first after refusals, then after aborts);
//! - a process not admitted that never formed a group (or whose only forming was a first
//!   generation that failed) asks again, starting as one that never formed
//!   ([`after_not_admitted`]); a member of an older group exits;
//! - any other end of a try asks again once, then exits (its supervisor restarts it).
//!
//! Asking and waiting are sequenced here too, message by message, for both executors:
//! [`EnterRound`] (one ask to enter: whom to ask when, and when the answers decide) and
//! [`JoinWait`] (waiting to be admitted: asking again each [`ENTER_REPEAT`], forming an
//! admission, giving up). The member machine carries out their polls with simulated messages;
//! the mesh ([`super::super::Mesh::enter`], [`super::super::Mesh::join_live`]) with requests over
//! QUIC.
//!
//! Pure: time is passed in.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::super::{DIAL_RETRY, ENTER_REPEAT, FRESH_START_RETRY};

/// How a starting process goes on after the others' answers to its ask to enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnterAfter {
    /// Its first ask: form the first generation, or join.
    First,
    /// Its forming of the first generation failed: join if a group lives, else exit.
    FailedStart,
    /// It was not admitted: form the first generation if no group lives, else exit.
    FailedJoin,
    /// Its fresh start failed: join if a group lives after all, else form the first
    /// generation again, within `until`.
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

/// A fresh start (tried within `until`) failed at `now`, whatever ended it. It is tried
/// again where `forget_failed_start` forgets this process's failed start (it formed no group
/// and waits for no admission), so that the first generation can be formed again.
pub(crate) fn after_failed_start(
    now: Instant,
    until: Instant,
    forget_failed_start: impl FnOnce() -> bool,
) -> AfterFailedStart {
    if now < until && forget_failed_start() {
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

/// How long an ask to enter waits for a peer's answer before it asks that peer again.
pub(crate) const ENTER_RESEND: Duration = Duration::from_millis(500);

/// One ask to enter: every peer is asked whether a group lives (`Enter`); the first answer that
/// one does decides the round (join it), and so do answers from every peer that none does, or
/// the round's bound (no live group: the job starts). A peer that has not answered is asked
/// again each [`ENTER_RESEND`], and [`DIAL_RETRY`] after an ask that could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnterRound {
    /// The peers to hear from (every worker but this one).
    peers: Vec<NodeId>,
    answered: BTreeSet<NodeId>,
    deadline: Instant,
    resend: Instant,
}

/// What an ask to enter does next ([`EnterRound::poll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EnterPoll {
    /// Ask these peers now (those that have not answered).
    Ask(Vec<NodeId>),
    /// Nothing is due before [`EnterRound::wake_at`].
    Wait,
    /// No peer has a live group: every one answered so, or the round's bound passed.
    NoLiveGroup,
}

impl EnterRound {
    /// A round asking `peers` from `now`, within `within`.
    pub(crate) fn new(peers: Vec<NodeId>, now: Instant, within: Duration) -> Self {
        Self {
            peers,
            answered: BTreeSet::new(),
            deadline: now + within,
            resend: now,
        }
    }

    /// `from` answered; `formed`: a group lives there. Returns whether that decides the round:
    /// this process is to join the live group.
    pub(crate) fn answered(&mut self, from: &NodeId, formed: bool) -> bool {
        self.answered.insert(from.clone());
        formed
    }

    /// An ask could not be delivered at `now`: the unanswered peers are asked again soon.
    pub(crate) fn undelivered(&mut self, now: Instant) {
        self.resend = self.resend.min(now + DIAL_RETRY);
    }

    /// What is due at `now`.
    pub(crate) fn poll(&mut self, now: Instant) -> EnterPoll {
        if self.answered.len() >= self.peers.len() || now >= self.deadline {
            return EnterPoll::NoLiveGroup;
        }
        if now < self.resend {
            return EnterPoll::Wait;
        }
        self.resend = now + ENTER_RESEND;
        let unanswered = self.peers.iter().filter(|p| !self.answered.contains(*p));
        EnterPoll::Ask(unanswered.cloned().collect())
    }

    /// When the round is next due without an answer (a resend or its bound).
    pub(crate) fn wake_at(&self) -> Instant {
        self.resend.min(self.deadline)
    }

    /// When the round gives up on the peers that did not answer.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Waiting to be admitted to a live group: every peer is asked to admit this process (`Enter`:
/// it is then a pending joiner at the leader) each [`ENTER_REPEAT`], since a pending entry
/// expires; the generation an admission names is formed; the wait gives up at its bound, or
/// at once when every peer answered, since the last ask, that it has no live group (every
/// worker lost its group: they start again). A forming of the admission that failed goes back
/// to waiting, asking at once, within the same bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JoinWait {
    /// How many peers there are (every worker but this one).
    peers: usize,
    until: Instant,
    next_ask: Instant,
    /// The peers that answered, since the last ask, that they have no live group.
    no_group: BTreeSet<NodeId>,
}

/// What a process waiting to be admitted does next ([`JoinWait::poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinPoll {
    /// Ask every peer to be admitted now.
    Ask,
    /// Form the generation of the admission received.
    Form,
    /// Nothing is due before [`JoinWait::wake_at`] (or an answer, or an admission).
    Wait,
    /// Every peer answered that it has no live group: not admitted.
    NoLiveGroup,
    /// The wait's bound passed: not admitted.
    TimedOut,
}

impl JoinWait {
    /// Waiting from `now`, within `within`, with `peers` peers to ask.
    pub(crate) fn new(peers: usize, now: Instant, within: Duration) -> Self {
        Self {
            peers,
            until: now + within,
            next_ask: now,
            no_group: BTreeSet::new(),
        }
    }

    /// The forming of an admission failed at `now`: wait again, asking at once, within the
    /// same bound.
    pub(crate) fn again(&mut self, now: Instant) {
        self.next_ask = now;
        self.no_group.clear();
    }

    /// `from` answered an ask; `formed`: a group lives there.
    pub(crate) fn answered(&mut self, from: &NodeId, formed: bool) {
        if formed {
            self.no_group.clear();
        } else {
            self.no_group.insert(from.clone());
        }
    }

    /// What is due at `now`; `admitted`: an admission was received and not formed yet.
    pub(crate) fn poll(&mut self, now: Instant, admitted: bool) -> JoinPoll {
        if self.peers > 0 && self.no_group.len() == self.peers {
            return JoinPoll::NoLiveGroup;
        }
        if admitted {
            return JoinPoll::Form;
        }
        if now >= self.until {
            return JoinPoll::TimedOut;
        }
        if now < self.next_ask {
            return JoinPoll::Wait;
        }
        self.next_ask = now + ENTER_REPEAT;
        self.no_group.clear();
        JoinPoll::Ask
    }

    /// When the wait is next due without an answer or an admission (an ask or its bound).
    pub(crate) fn wake_at(&self) -> Instant {
        self.next_ask.min(self.until)
    }
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
    fn a_failed_start_that_could_be_forgotten_is_tried_again_in_time() {
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        assert_eq!(
            after_failed_start(now, until, || true),
            AfterFailedStart::RetryAt {
                at: now + FRESH_START_RETRY,
                until
            }
        );
        // A member of a group, or one waiting to be admitted: it asks again (joins or exits).
        assert_eq!(
            after_failed_start(now, until, || false),
            AfterFailedStart::AskAgain
        );
        assert_eq!(
            after_failed_start(until, until, || true),
            AfterFailedStart::AskAgain
        );
        assert_eq!(after_not_admitted(true), Some(EnterAfter::FailedJoin));
        assert_eq!(after_not_admitted(false), None);
    }

    fn nodes(n: u32) -> Vec<NodeId> {
        (1..=n).map(|i| NodeId::new("worker", i)).collect()
    }

    #[test]
    fn an_ask_to_enter_asks_the_silent_peers_again_and_ends_on_the_first_live_group() {
        let t0 = Instant::now();
        let peers = nodes(3);
        let mut round = EnterRound::new(peers.clone(), t0, Duration::from_secs(5));
        assert_eq!(round.poll(t0), EnterPoll::Ask(peers.clone()));
        assert_eq!(round.poll(t0), EnterPoll::Wait);
        assert_eq!(round.wake_at(), t0 + ENTER_RESEND);
        assert!(!round.answered(&peers[0], false));
        // Only the peers that did not answer are asked again.
        assert_eq!(
            round.poll(t0 + ENTER_RESEND),
            EnterPoll::Ask(peers[1..].to_vec())
        );
        // An ask that could not be delivered is tried again sooner.
        let t1 = t0 + ENTER_RESEND + Duration::from_millis(10);
        round.undelivered(t1);
        assert_eq!(round.wake_at(), t1 + DIAL_RETRY);
        // One live group decides the round.
        assert!(round.answered(&peers[2], true));
    }

    #[test]
    fn an_ask_to_enter_finds_no_live_group_when_all_answered_or_in_time() {
        let t0 = Instant::now();
        let peers = nodes(2);
        let mut round = EnterRound::new(peers.clone(), t0, Duration::from_secs(5));
        let _ = round.poll(t0);
        round.answered(&peers[0], false);
        assert_eq!(round.poll(t0), EnterPoll::Wait);
        round.answered(&peers[1], false);
        assert_eq!(round.poll(t0), EnterPoll::NoLiveGroup);
        let mut silent = EnterRound::new(peers, t0, Duration::from_secs(5));
        let _ = silent.poll(t0);
        assert_eq!(silent.wake_at(), t0 + ENTER_RESEND);
        assert_eq!(
            silent.poll(t0 + Duration::from_secs(5)),
            EnterPoll::NoLiveGroup
        );
        // Alone, a process has nobody to hear from.
        let mut alone = EnterRound::new(Vec::new(), t0, Duration::from_secs(5));
        assert_eq!(alone.poll(t0), EnterPoll::NoLiveGroup);
    }

    #[test]
    fn a_joiner_asks_each_repeat_forms_an_admission_and_gives_up_when_no_group_lives() {
        let t0 = Instant::now();
        let peers = nodes(2);
        let within = Duration::from_secs(10);
        let mut wait = JoinWait::new(2, t0, within);
        assert_eq!(wait.poll(t0, false), JoinPoll::Ask);
        assert_eq!(wait.poll(t0, false), JoinPoll::Wait);
        assert_eq!(wait.wake_at(), t0 + ENTER_REPEAT);
        // An admission is formed before anything else is due.
        assert_eq!(wait.poll(t0, true), JoinPoll::Form);
        // Its forming failed: ask again at once, within the same bound.
        let t1 = t0 + Duration::from_secs(2);
        wait.again(t1);
        assert_eq!(wait.poll(t1, false), JoinPoll::Ask);
        // Answers since the last ask: one live group keeps it waiting.
        wait.answered(&peers[0], false);
        wait.answered(&peers[1], true);
        assert_eq!(wait.poll(t1, false), JoinPoll::Wait);
        wait.answered(&peers[1], false);
        assert_eq!(wait.poll(t1, false), JoinPoll::Wait);
        wait.answered(&peers[0], false);
        assert_eq!(wait.poll(t1, false), JoinPoll::NoLiveGroup);
        // Its bound.
        let mut late = JoinWait::new(2, t0, within);
        let _ = late.poll(t0, false);
        assert_eq!(late.poll(t0 + within, false), JoinPoll::TimedOut);
    }
}
