//! Entering the job: asking whether a group lives ([`EnterRound`]), waiting to be admitted
//! ([`JoinWait`]), and what follows a failed try ([`entry`]'s table).

use super::*;

impl MemberMachine {
    pub(super) fn begin_entering(&mut self, now: Instant, after: EnterAfter) {
        let peers = self.peers().into_iter().map(|p| p.node).collect();
        self.phase = Phase::Entering {
            after,
            round: EnterRound::new(peers, now, self.settings.enter_timeout),
        };
    }

    pub(super) fn ask_enter(&mut self, peers: &[NodeId]) {
        let enter = MemberMessage::Enter {
            addr: self.me.addr,
            incarnation: self.incarnation,
        };
        for peer in peers {
            self.send(peer, enter.clone());
        }
    }

    pub(super) fn entered(&mut self, now: Instant, from: &NodeId, formed: bool) {
        match &mut self.phase {
            Phase::Entering { after, round } => {
                let join = round.answered(from, formed);
                let after = *after;
                if join {
                    self.membership.joining = true;
                    let step = after.next(true, now, self.settings.join_timeout);
                    self.take_entry_step(now, step);
                }
            }
            Phase::Joining { wait } => wait.answered(from, formed),
            _ => {}
        }
    }

    pub(super) fn begin_joining(&mut self, now: Instant) {
        self.membership.joining = true;
        let peers = self.workers.len() - 1;
        self.phase = Phase::Joining {
            wait: JoinWait::new(peers, now, self.settings.join_timeout),
        };
    }

    /// Joining: what [`JoinWait`] says is due (asking every peer, forming the generation an
    /// admission names, giving up).
    pub(super) fn progress_joining(&mut self, now: Instant) {
        let Phase::Joining { wait } = &mut self.phase else {
            return;
        };
        match wait.poll(now, self.membership.admission.is_some()) {
            JoinPoll::NoLiveGroup | JoinPoll::TimedOut => self.not_admitted(now),
            JoinPoll::Form => {
                let wait = wait.clone();
                if let Some((generation, members)) = self.membership.admission.take() {
                    self.begin_forming(now, generation, members, Purpose::Admitted { wait });
                }
            }
            JoinPoll::Ask => {
                let peers: Vec<NodeId> = self.peers().into_iter().map(|p| p.node).collect();
                self.ask_enter(&peers);
            }
            JoinPoll::Wait => {}
        }
    }

    /// The joiner was not admitted: where no group was ever formed here, it asks whether the
    /// others start again; else it exits.
    pub(super) fn not_admitted(&mut self, now: Instant) {
        self.membership.joining = false;
        self.membership.admission = None;
        // A process whose only forming was a first generation that failed is no member of any
        // group: it starts again like one that never formed.
        let never_formed = self.membership.generation == 0 || self.membership.forget_failed_start();
        match entry::after_not_admitted(never_formed) {
            Some(after) => self.begin_entering(now, after),
            None => self.exit(MemberExit::EntryFailed),
        }
    }

    pub(super) fn progress_entering(&mut self, now: Instant) {
        let Phase::Entering { after, round } = &mut self.phase else {
            return;
        };
        let after = *after;
        match round.poll(now) {
            // Nobody has a live group: the job starts.
            EnterPoll::NoLiveGroup => {
                let step = after.next(false, now, self.settings.join_timeout);
                self.take_entry_step(now, step);
            }
            EnterPoll::Ask(peers) => self.ask_enter(&peers),
            EnterPoll::Wait => {}
        }
    }

    /// Carries out what [`EnterAfter::next`] decided.
    pub(super) fn take_entry_step(&mut self, now: Instant, step: EntryStep) {
        match step {
            EntryStep::Join => self.begin_joining(now),
            EntryStep::FreshStart { until } => self.start_first_generation(now, until),
            EntryStep::Exit => self.exit(MemberExit::EntryFailed),
        }
    }

    pub(super) fn start_first_generation(&mut self, now: Instant, until: Instant) {
        let members = self.workers.clone();
        self.begin_forming(now, 1, members, Purpose::FreshStart { until });
    }
}
