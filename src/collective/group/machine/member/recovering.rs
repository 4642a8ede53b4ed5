//! Re-forming after a loss: the attempts ([`Reforming`]'s sequence), each probing the members of
//! the group it probes ([`ProbeRound`]) and forming the next generation with the survivors.

use super::*;

impl MemberMachine {
    /// A re-forming of `broken` begins at `now`.
    pub(super) fn begin_reforming(&mut self, now: Instant, broken: Before) {
        let (limit, span) = (self.settings.recover_attempts, self.settings.probe_timeout);
        self.begin_recovering(now, Reforming::new(broken, now, limit, span));
    }

    /// `reforming`'s current attempt begins: it probes the other members of the group it
    /// probes.
    pub(super) fn begin_recovering(&mut self, now: Instant, reforming: Reforming<Before>) {
        let before = reforming.probed();
        let members = before.members.iter().map(|m| m.node.clone()).collect();
        let round = ProbeRound::new(
            members,
            self.me.node.clone(),
            before.generation,
            (now, self.settings.probe_timeout),
            self.settings.detection,
        );
        self.phase = Phase::Recovering { reforming, round };
    }

    /// Probing: what [`ProbeRound`] says is due; once the answers are in, what the re-forming
    /// does with them ([`Reforming::probes_answered`]).
    pub(super) fn progress_recovering(&mut self, now: Instant) {
        let Phase::Recovering { reforming, round } = &mut self.phase else {
            return;
        };
        let generation = reforming.probed().generation;
        let step = round.poll(now);
        for n in step.probe {
            self.send(&n, MemberMessage::Probe { generation });
        }
        let Some(found) = step.done else {
            return;
        };
        let Phase::Recovering { mut reforming, .. } =
            std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let previous: Vec<NodeId> = reforming
            .probed()
            .members
            .iter()
            .map(|m| m.node.clone())
            .collect();
        let step = reforming.probes_answered(&previous, found, now);
        self.take_reform_step(now, reforming, step);
    }

    /// Carries out what `reforming` decided: the next generation's forming with the
    /// survivors, the next attempt later, or the end of the process.
    pub(super) fn take_reform_step(
        &mut self,
        now: Instant,
        reforming: Reforming<Before>,
        step: ReformStep,
    ) {
        match step {
            ReformStep::Form { survivors } => {
                let before = reforming.probed();
                let next = self.membership.next_generation(before.generation);
                let members: Vec<GroupMember> = before
                    .members
                    .iter()
                    .filter(|m| survivors.contains(&m.node))
                    .cloned()
                    .collect();
                self.begin_forming(now, next, members, Purpose::Recover { reforming });
            }
            ReformStep::Retry { at, .. } => self.phase = Phase::RecoverLater { reforming, at },
            ReformStep::GiveUp { why } => {
                let no_quorum = why.no_quorum();
                self.exit(MemberExit::RecoveryFailed { no_quorum });
            }
            ReformStep::LeftOut(_) => self.exit(MemberExit::LeftOut),
        }
    }
}
