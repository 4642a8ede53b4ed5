//! Re-forming after a loss: the attempts, each probing the broken group's members
//! ([`ProbeRound`]) and forming the next generation with the survivors.

use super::*;

impl MemberMachine {
    /// Re-forming attempt `number` begins: it probes the other members of `before`.
    pub(super) fn begin_recovering(&mut self, now: Instant, before: Before, number: usize) {
        let members = before.members.iter().map(|m| m.node.clone()).collect();
        let round = ProbeRound::new(
            members,
            self.me.node.clone(),
            before.generation,
            (now, self.settings.probe_timeout),
            self.settings.detection,
        );
        self.phase = Phase::Recovering {
            before,
            attempt: Attempt::begin(number, now),
            round,
        };
    }

    /// Probing: what [`ProbeRound`] says is due; once the answers are in, the verdict
    /// ([`reforming::judge`]) and the next generation's forming with the survivors.
    pub(super) fn progress_recovering(&mut self, now: Instant) {
        let Phase::Recovering { before, round, .. } = &mut self.phase else {
            return;
        };
        let generation = before.generation;
        let step = round.poll(now);
        for n in step.probe {
            self.send(&n, MemberMessage::Probe { generation });
        }
        let Some(found) = step.done else {
            return;
        };
        let Phase::Recovering {
            before, attempt, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let (alive, joining) = match found {
            Probes::LeftOut(_) => return self.exit(MemberExit::LeftOut),
            Probes::Answered { alive, joining } => (alive, joining),
        };
        let previous: Vec<NodeId> = before.members.iter().map(|m| m.node.clone()).collect();
        let survivors = match reforming::judge(&previous, &alive, &joining) {
            Verdict::NoQuorum { .. } => return self.next_attempt(now, before, attempt, true),
            Verdict::Form { survivors } => survivors,
        };
        let next = self.membership.next_generation(before.generation);
        let members: Vec<GroupMember> = before
            .members
            .iter()
            .filter(|m| survivors.contains(&m.node))
            .cloned()
            .collect();
        self.begin_forming(now, next, members, Purpose::Recover { before, attempt });
    }

    /// Re-forming `attempt` failed (`no_quorum`: for want of a quorum): the next one begins a
    /// probe timeout after it began, or the process gives up ([`Attempt::failed`]).
    pub(super) fn next_attempt(
        &mut self,
        now: Instant,
        before: Before,
        attempt: Attempt,
        no_quorum: bool,
    ) {
        let (limit, span) = (self.settings.recover_attempts, self.settings.probe_timeout);
        match attempt.failed(now, limit, span, no_quorum) {
            AfterAttempt::GiveUp { no_quorum } => {
                self.exit(MemberExit::RecoveryFailed { no_quorum })
            }
            AfterAttempt::Next { number, at } => {
                self.phase = Phase::RecoverLater { before, number, at };
            }
        }
    }
}
