//! How a survivor re-forms a broken group: one table of decisions, taken by the member machine
//! (which the membership simulator drives) and by `MultiWorkerMirrored::recover` in production
//! alike, so that what the simulator proves of re-forming is what a worker does.
//!
//! A re-forming is a run of attempts, at most the job's `recover_attempts`. Each attempt probes
//! the members of the group that broke (or, after an attempt whose group formed here and
//! failed to agree on the state, that group: see [`Reforming`]), judges the answers ([`judge`]: this worker left out, no quorum, or the survivors to form the
//! next generation with), and forms the next generation ([`super::Membership::next_generation`])
//! with the survivors, who then agree on the training state. An attempt that ends without a
//! group that agreed on the state (no quorum, forming failed, the agreement failed) is
//! followed by the next ([`Attempt::failed`]), which begins a probe timeout after the failed
//! one began: survivors whose attempts failed at different moments begin the next about as far
//! apart as they began this one, and forming waits for the later ones (up to the form
//! timeout). After the last attempt the process gives up, and its supervisor restarts it.
//!
//! The sequence of attempts is [`Reforming`]'s (what follows each outcome, which group the
//! next attempt probes), and an attempt's probes are sequenced here too, message by message,
//! for both executors:
//! [`ProbeRound`] (whom to probe when, and when the answers are all in; an [`AskRound`]) is
//! polled alike by the member machine, with simulated messages, and by
//! `ProcessGroup::probe_members`, with requests over QUIC.
//!
//! Pure: time is passed in.

use std::time::{Duration, Instant};

use cohort_transport::NodeId;

use super::ask_round::AskRound;
use super::quorum::has_quorum;

/// A member's answer to a survivor's probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeReply {
    /// A live member: a survivor.
    Alive,
    /// A new process waiting to be admitted (or no member): no survivor, on no side.
    Joining,
    /// No survivor, but it cannot tell yet that its node's old process was on no side the
    /// prober does not know of (`Membership::no_survivor`): counted as a member that did not
    /// answer.
    Unsettled,
    /// Its live group of a later generation left the prober out.
    LeftOut,
}

/// One attempt's probes of the members of a broken group: every other member is probed at
/// once, again [`DIAL_RETRY`](super::super::DIAL_RETRY) after a probe that could not be
/// delivered, while it was not unreachable past the lost bound
/// ([`super::linking::lost_bound`]); the round ends when every one answered or was lost, or the
/// probe timeout passed ([`AskRound`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeRound {
    /// The broken group's members in rank order, this survivor among them.
    members: Vec<NodeId>,
    me: NodeId,
    asks: AskRound<ProbeReply>,
}

/// What a probe round does next ([`ProbeRound::poll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeStep {
    /// Probe these members now.
    pub(crate) probe: Vec<NodeId>,
    /// The round's end, where it ended.
    pub(crate) done: Option<Probes>,
}

/// What a probe round found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probes {
    /// This member (the first in rank order to say so) formed a later generation without this
    /// survivor: it was left out, and no attempt can bring it back.
    LeftOut(NodeId),
    /// The survivors (this one among them) and the members that answered as new processes
    /// waiting to be admitted, each in rank order: what [`judge`] judges.
    Answered {
        alive: Vec<NodeId>,
        joining: Vec<NodeId>,
    },
}

impl ProbeRound {
    /// `me` probes the other `members` (rank order, `me` among them) of the group of
    /// `generation` from `now`, within `within`; `detection` is the transport's detection
    /// budget (the lost bound's measure).
    pub(crate) fn new(
        members: Vec<NodeId>,
        me: NodeId,
        generation: u64,
        (now, within): (Instant, Duration),
        detection: Duration,
    ) -> Self {
        let others: Vec<NodeId> = members.iter().filter(|n| **n != me).cloned().collect();
        let lost_after = super::linking::lost_bound(generation, detection);
        Self {
            asks: AskRound::new(others, now, within, lost_after),
            members,
            me,
        }
    }

    /// `from` answered `reply`.
    pub(crate) fn answered(&mut self, from: &NodeId, reply: ProbeReply) {
        self.asks.answered(from, reply);
    }

    /// The probe of `to` that began at `began` could not be delivered (by `now`).
    pub(crate) fn undelivered(&mut self, to: &NodeId, began: Instant, now: Instant) {
        self.asks.undelivered(to, began, now);
    }

    /// What is due at `now`: the probes due, and the round's end where every member answered
    /// (or was lost) or its time ran out.
    pub(crate) fn poll(&mut self, now: Instant) -> ProbeStep {
        let probe = self.asks.take_due(now);
        ProbeStep {
            probe,
            done: self.asks.finished(now).then(|| self.found()),
        }
    }

    /// When the round is next due without an answer (a probe again, or its end).
    pub(crate) fn wake_at(&self) -> Instant {
        self.asks.wake_at()
    }

    /// When the round ends, answered or not.
    pub(crate) fn deadline(&self) -> Instant {
        self.asks.deadline()
    }

    fn found(&self) -> Probes {
        let with = |reply: ProbeReply| -> Vec<NodeId> {
            let answered = |n: &&NodeId| self.asks.answer(n) == Some(reply);
            self.members.iter().filter(answered).cloned().collect()
        };
        if let Some(by) = with(ProbeReply::LeftOut).into_iter().next() {
            return Probes::LeftOut(by);
        }
        let alive = self
            .members
            .iter()
            .filter(|n| **n == self.me || self.asks.answer(n) == Some(ProbeReply::Alive))
            .cloned()
            .collect();
        Probes::Answered {
            alive,
            joining: with(ProbeReply::Joining),
        }
    }
}

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

/// Why a re-forming attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptFailure {
    /// The members reached (this one among them) were no quorum of those not `replaced`.
    NoQuorum {
        reached: Vec<NodeId>,
        replaced: Vec<NodeId>,
    },
    /// The members reached were a quorum of the group probed but not of `attempted`, the
    /// members of a generation whose forming began here and failed, which another survivor may
    /// have formed ([`Reforming::forming_failed`]).
    NoQuorumOfAttempt {
        reached: Vec<NodeId>,
        attempted: Vec<NodeId>,
    },
    /// Forming the next generation with the survivors failed.
    FormingFailed,
    /// The group formed, and agreeing on the training state in it failed.
    AgreementFailed,
}

impl AttemptFailure {
    /// Whether the attempt failed for want of a quorum (of the group probed, or of an attempt).
    pub(crate) fn no_quorum(&self) -> bool {
        matches!(self, Self::NoQuorum { .. } | Self::NoQuorumOfAttempt { .. })
    }
}

/// What a re-forming does next ([`Reforming`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReformStep {
    /// Form the next generation with `survivors` (the probed group's members that answered as
    /// such, in its rank order); then agree on the state in it.
    Form { survivors: Vec<NodeId> },
    /// The attempt failed (`why`): the next begins at `at` ([`Reforming::begin_next`]), and
    /// probes [`Reforming::probed`].
    Retry { at: Instant, why: AttemptFailure },
    /// The last attempt failed (`why`): the process gives up (its supervisor restarts it).
    GiveUp { why: AttemptFailure },
    /// `by` formed a later generation without this survivor: no attempt can bring it back.
    LeftOut(NodeId),
}

/// A re-forming's sequence of attempts, one table for both executors (the member machine, and
/// `MultiWorkerMirrored::recover` in production): what follows the probes, a forming and the
/// agreement on the state, and which group the next attempt probes. `G` is how an executor
/// holds a group (the machine: its members and generation; production: the process group).
///
/// The group probed is the broken one, then any group formed here whose agreement on the state
/// failed: a member that agreed on the state in it before it broke measures its quorum on that
/// generation from then on, and so must every member that formed it. Measured on the older
/// group instead, a member cut off during the state's handover found a quorum of it with a
/// member the others had left out, and went on beside them (split brain, found by the
/// membership simulator: seed 8087292 of up to 5 workers and 14 faults). A group whose forming
/// began here and failed is not probed in its place, but every later attempt needs a quorum of
/// it as well ([`Reforming::forming_failed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reforming<G> {
    probed: G,
    /// The members (rank order) of each group whose forming began here and failed since the
    /// group probed: another survivor may have formed it and goes on from it.
    attempted: Vec<Vec<NodeId>>,
    attempt: Attempt,
    /// The attempt that follows a failed one, once [`ReformStep::Retry`] said when.
    next: Option<usize>,
    /// The attempts a re-forming makes.
    limit: usize,
    /// How long each attempt spans at least (the probe timeout).
    span: Duration,
}

impl<G> Reforming<G> {
    /// A re-forming of `broken` whose first attempt begins at `now`: at most `limit` attempts,
    /// each spanning at least `span`.
    pub(crate) fn new(broken: G, now: Instant, limit: usize, span: Duration) -> Self {
        Self {
            probed: broken,
            attempted: Vec::new(),
            attempt: Attempt::first(now),
            next: None,
            limit,
            span,
        }
    }

    /// The group the current attempt probes.
    pub(crate) fn probed(&self) -> &G {
        &self.probed
    }

    /// The current attempt's number, from 1.
    pub(crate) fn attempt(&self) -> usize {
        self.attempt.number
    }

    /// The attempt a [`ReformStep::Retry`] announced begins, at `now`.
    pub(crate) fn begin_next(&mut self, now: Instant) {
        if let Some(number) = self.next.take() {
            self.attempt = Attempt::begin(number, now);
        }
    }

    /// The probes of the members of `previous` (the probed group's, in rank order) found
    /// `found` at `now`.
    pub(crate) fn probes_answered(
        &mut self,
        previous: &[NodeId],
        found: Probes,
        now: Instant,
    ) -> ReformStep {
        let (alive, joining) = match found {
            Probes::LeftOut(by) => return ReformStep::LeftOut(by),
            Probes::Answered { alive, joining } => (alive, joining),
        };
        let short = self
            .attempted
            .iter()
            .find(|members| !has_quorum(members, &joining, &alive));
        match (judge(previous, &alive, &joining), short) {
            (Verdict::Form { .. }, Some(attempted)) => {
                let why = AttemptFailure::NoQuorumOfAttempt {
                    attempted: attempted.clone(),
                    reached: alive,
                };
                self.failed(now, why)
            }
            (Verdict::Form { survivors }, None) => ReformStep::Form { survivors },
            (Verdict::NoQuorum { reached, replaced }, _) => {
                self.failed(now, AttemptFailure::NoQuorum { reached, replaced })
            }
        }
    }

    /// Forming the next generation failed at `now`. Where it had begun (`attempted`: the
    /// members of that generation, in rank order), every later attempt needs a quorum of them
    /// as well as of the group probed: another survivor may have formed it (its links all up
    /// while this one's were not: the answer to this one's join was lost, say) and measures
    /// its quorum on it from then on. Measured on the probed group alone, a survivor whose
    /// forming failed found a quorum of it with a member the forming had left out, and went on
    /// beside the survivor that formed it (split brain, found by the membership simulator:
    /// seed 5027068 of up to 3 workers and 10 faults). It is not probed in the probed group's
    /// place: survivors whose attempts differed (each saw other members alive) would each
    /// measure on its own attempt, and a lone lowest-ranked one passes on one that another
    /// passes on with the rest.
    pub(crate) fn forming_failed(
        &mut self,
        attempted: Option<Vec<NodeId>>,
        now: Instant,
    ) -> ReformStep {
        self.attempted.extend(attempted);
        self.failed(now, AttemptFailure::FormingFailed)
    }

    /// Agreeing on the state in `formed` (the generation this attempt formed) failed at `now`:
    /// the next attempt probes `formed`.
    pub(crate) fn agreement_failed(&mut self, formed: G, now: Instant) -> ReformStep {
        self.probed = formed;
        self.attempted.clear();
        self.failed(now, AttemptFailure::AgreementFailed)
    }

    fn failed(&mut self, now: Instant, why: AttemptFailure) -> ReformStep {
        let no_quorum = why.no_quorum();
        match self.attempt.failed(now, self.limit, self.span, no_quorum) {
            AfterAttempt::GiveUp { .. } => ReformStep::GiveUp { why },
            AfterAttempt::Next { number, at } => {
                self.next = Some(number);
                ReformStep::Retry { at, why }
            }
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

    /// The sequence of a re-forming: the survivors with a quorum form; a failed attempt is
    /// followed by the next a probe timeout after it began, probing the group that failed to
    /// agree on the state, or whose forming had begun, where that was the failure; the last
    /// gives up, saying why; a member that left this one out ends it at once.
    #[test]
    fn a_reforming_forms_with_a_quorum_retries_failed_attempts_and_gives_up_after_the_last() {
        let three = workers(3);
        let span = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut reforming = Reforming::new("generation 4", t0, 3, span);
        assert_eq!(
            (*reforming.probed(), reforming.attempt()),
            ("generation 4", 1)
        );
        let answered = |alive: &[NodeId]| Probes::Answered {
            alive: alive.to_vec(),
            joining: vec![],
        };
        assert_eq!(
            reforming.probes_answered(&three, answered(&three[..2]), t0),
            ReformStep::Form {
                survivors: three[..2].to_vec()
            }
        );
        // Forming was refused before it began: the next attempt waits out the span, begins
        // when told, and probes the same group.
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(
            reforming.forming_failed(None, t1),
            ReformStep::Retry {
                at: t0 + span,
                why: AttemptFailure::FormingFailed
            }
        );
        assert_eq!(reforming.attempt(), 1);
        let t2 = t0 + span;
        reforming.begin_next(t2);
        assert_eq!(
            (*reforming.probed(), reforming.attempt()),
            ("generation 4", 2)
        );
        // Its group formed and failed to agree on the state: the next probes that group.
        let t3 = t2 + Duration::from_secs(3);
        assert_eq!(
            reforming.agreement_failed("generation 5", t3),
            ReformStep::Retry {
                at: t3,
                why: AttemptFailure::AgreementFailed
            }
        );
        reforming.begin_next(t3);
        assert_eq!(
            (*reforming.probed(), reforming.attempt()),
            ("generation 5", 3)
        );
        // The last attempt without a quorum: the process gives up, for want of one.
        assert_eq!(
            reforming.probes_answered(&three, answered(&three[2..]), t3),
            ReformStep::GiveUp {
                why: AttemptFailure::NoQuorum {
                    reached: three[2..].to_vec(),
                    replaced: vec![]
                }
            }
        );
        // A forming that had begun failed: another survivor may have formed it, so every
        // later attempt needs a quorum of its members as well as of the group probed.
        let mut begun = Reforming::new("generation 4", t0, 3, span);
        assert!(matches!(
            begun.forming_failed(Some(three[..2].to_vec()), t0),
            ReformStep::Retry { .. }
        ));
        begun.begin_next(t0 + span);
        assert_eq!(*begun.probed(), "generation 4");
        // Workers 1 and 2 are a quorum of the three, not of the attempt's workers 0 and 1.
        assert_eq!(
            begun.probes_answered(&three, answered(&three[1..]), t0 + span),
            ReformStep::Retry {
                at: t0 + span * 2,
                why: AttemptFailure::NoQuorumOfAttempt {
                    reached: three[1..].to_vec(),
                    attempted: three[..2].to_vec()
                }
            }
        );
        begun.begin_next(t0 + span * 2);
        assert_eq!(
            begun.probes_answered(&three, answered(&three[..2]), t0 + span * 2),
            ReformStep::Form {
                survivors: three[..2].to_vec()
            }
        );
        let mut left_out = Reforming::new("generation 4", t0, 3, span);
        assert_eq!(
            left_out.probes_answered(&three, Probes::LeftOut(three[1].clone()), t0),
            ReformStep::LeftOut(three[1].clone())
        );
    }

    /// A probe round of `members` by `me` of the group of generation 2 (a lost bound of twice
    /// one second), from `t0`, within two seconds.
    fn probing(members: &[NodeId], me: usize, t0: Instant) -> ProbeRound {
        let detection = Duration::from_secs(1);
        let within = (t0, Duration::from_secs(2));
        ProbeRound::new(members.to_vec(), members[me].clone(), 2, within, detection)
    }

    #[test]
    fn a_probe_round_probes_every_other_member_again_after_a_failed_delivery_until_all_answered() {
        let retry = crate::collective::group::DIAL_RETRY;
        let t0 = Instant::now();
        let four = workers(4);
        let mut round = probing(&four, 1, t0);
        let others = vec![four[0].clone(), four[2].clone(), four[3].clone()];
        let first = round.poll(t0);
        assert_eq!((first.probe, first.done), (others, None));
        assert_eq!(round.wake_at(), t0 + Duration::from_secs(2));
        // Undelivered: probed again a moment later (a member that answered since is probed
        // again too, harmlessly: its next answer replaces the first); a failed delivery to a
        // member that answered already is not tried again.
        let t1 = t0 + Duration::from_millis(50);
        round.undelivered(&four[0], t0, t1);
        round.undelivered(&four[2], t0, t1);
        round.answered(&four[2], ProbeReply::Joining);
        round.answered(&four[3], ProbeReply::Unsettled);
        round.undelivered(&four[3], t0, t1);
        assert_eq!(round.wake_at(), t1 + retry);
        let again = round.poll(t1 + retry);
        assert_eq!(again.probe, vec![four[0].clone(), four[2].clone()]);
        assert_eq!(again.done, None);
        round.answered(&four[0], ProbeReply::Alive);
        // A stranger's answer counts for nothing.
        round.answered(&NodeId::new("worker", 9), ProbeReply::LeftOut);
        let done = round.poll(t1 + retry);
        assert_eq!(
            done.done,
            Some(Probes::Answered {
                alive: vec![four[0].clone(), four[1].clone()],
                joining: vec![four[2].clone()],
            })
        );
    }

    #[test]
    fn a_probe_round_ends_at_its_bound_and_a_member_that_left_this_one_out_ends_it_so() {
        let t0 = Instant::now();
        let three = workers(3);
        let mut silent = probing(&three, 0, t0);
        let _ = silent.poll(t0);
        assert_eq!(silent.poll(t0 + Duration::from_secs(1)).done, None);
        assert_eq!(
            silent.poll(t0 + Duration::from_secs(2)).done,
            Some(Probes::Answered {
                alive: vec![three[0].clone()],
                joining: vec![],
            })
        );
        let mut left_out = probing(&three, 0, t0);
        let _ = left_out.poll(t0);
        left_out.answered(&three[2], ProbeReply::LeftOut);
        left_out.answered(&three[1], ProbeReply::Alive);
        assert_eq!(
            left_out.poll(t0).done,
            Some(Probes::LeftOut(three[2].clone()))
        );
    }
}
