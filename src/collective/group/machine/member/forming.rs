//! Forming a generation: one link per pair (the larger node id joins, the other takes its join
//! and asks whether the joiner still forms it), and what follows a forming that ended.

use super::*;

impl MemberMachine {
    pub(super) fn begin_forming(
        &mut self,
        now: Instant,
        generation: u64,
        mut members: Vec<GroupMember>,
        purpose: Purpose,
    ) {
        members.sort_by(|a, b| a.node.cmp(&b.node));
        members.dedup_by(|a, b| a.node == b.node);
        let Some(rank) = members.iter().position(|m| m.node == self.me.node) else {
            let attempted = Before {
                generation,
                members,
            };
            return self.forming_failed(now, purpose, attempted, false);
        };
        if self.membership.begin_forming(generation).is_err() {
            let attempted = Before {
                generation,
                members,
            };
            return self.forming_failed(now, purpose, attempted, false);
        }
        if let Some(old) = &self.group {
            if old.broken.is_none() && old.formed {
                self.break_group(Broke::Superseded);
            }
        }
        let nodes: Vec<NodeId> = members.iter().map(|m| m.node.clone()).collect();
        let links = members
            .iter()
            .filter(|m| m.node != self.me.node)
            .map(|m| (m.node.clone(), FormLink::new(&self.me.node, &m.node, now)))
            .collect();
        self.group = Some(Group {
            generation,
            members,
            nodes,
            rank,
            formed: false,
            broken: None,
            cut_short: false,
            links,
            seq: 0,
        });
        self.phase = Phase::Forming {
            purpose,
            deadline: now + self.settings.form_timeout,
        };
    }

    /// Sends what forming owes its peers now, and ends it when every link is up, it broke,
    /// or its bound passed.
    pub(super) fn progress_forming(&mut self, now: Instant) {
        let Phase::Forming { deadline, .. } = &self.phase else {
            return;
        };
        let deadline = *deadline;
        let Some(g) = self.group.as_mut() else {
            return;
        };
        if let Some(why) = g.broken.clone() {
            return self.forming_ended(now, Some(why));
        }
        if g.links.values().all(FormLink::is_up) {
            g.formed = true;
            let generation = g.generation;
            self.membership.formed(generation);
            return self.forming_ended(now, None);
        }
        if now >= deadline {
            self.break_group(Broke::Timeout);
            return self.forming_ended(now, Some(Broke::Timeout));
        }
        let generation = g.generation;
        let nodes = g.nodes.clone();
        let detection = self.settings.detection;
        let by_admission = self.membership.joins_by_admission(generation);
        let mut sends = Vec::new();
        let mut lost = None;
        for (peer, link) in g.links.iter_mut() {
            let message = match link.due(now, generation, detection) {
                None => continue,
                Some(LinkDue::Lost(_)) => {
                    lost = Some(peer.clone());
                    continue;
                }
                Some(LinkDue::Join) => MemberMessage::Join {
                    generation,
                    members: nodes.clone(),
                    by_admission,
                    incarnation: self.incarnation,
                },
                Some(LinkDue::AskStillForming) => MemberMessage::StillForming {
                    generation,
                    members: nodes.clone(),
                },
            };
            sends.push((peer.clone(), message));
        }
        if let Some(peer) = lost {
            self.break_group(Broke::Unreachable(peer.clone()));
            return self.forming_ended(now, Some(Broke::Unreachable(peer)));
        }
        for (peer, message) in sends {
            self.send(&peer, message);
        }
    }

    /// The forming ended: formed (`None`), or broken by `why`.
    pub(super) fn forming_ended(&mut self, now: Instant, why: Option<Broke>) {
        let Phase::Forming { purpose, .. } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        let Some(g) = self.group.as_ref() else {
            return;
        };
        let (generation, nodes) = (g.generation, g.nodes.clone());
        let cut_short = g.cut_short;
        match why {
            None => {
                self.actions.push_back(MemberAction::Formed {
                    generation,
                    members: nodes,
                });
                self.formed(now, purpose);
            }
            // A member formed it with this process and re-forms: survive with it.
            Some(_) if cut_short && !matches!(purpose, Purpose::Admitted { .. }) => {
                let before = self.before_of_group();
                self.begin_reforming(now, before);
            }
            Some(_) => {
                // A failed forming's group is gone (nothing holds it); another member may
                // have formed it, though (see `forming_failed`).
                let attempted = self.before_of_group();
                self.group = None;
                self.forming_failed(now, purpose, attempted, true);
            }
        }
    }

    pub(super) fn before_of_group(&self) -> Before {
        let g = self.group.as_ref().expect("a group to re-form from");
        Before {
            generation: g.generation,
            members: g.members.clone(),
        }
    }

    pub(super) fn formed(&mut self, now: Instant, purpose: Purpose) {
        match purpose {
            Purpose::FreshStart { .. } => self.needs_state = false,
            Purpose::Admitted { .. } => {
                self.membership.joining = false;
                self.membership.admission = None;
                self.needs_state = true;
                // What it holds is not the job's: the live group's state is handed to it.
                self.holds_state = false;
            }
            Purpose::Recover { reforming } => {
                self.needs_state = true;
                self.recovery = Some(reforming);
            }
            Purpose::Admit => self.needs_state = true,
            Purpose::Depart { .. } => self.needs_state = false,
        }
        self.begin_round(now, None);
    }

    /// The forming of `attempted` for `purpose` failed here; `begun`: it had begun (another
    /// member may have formed it), else it was refused before.
    pub(super) fn forming_failed(
        &mut self,
        now: Instant,
        purpose: Purpose,
        attempted: Before,
        begun: bool,
    ) {
        match purpose {
            Purpose::FreshStart { until } => {
                // Members waiting to be admitted to a group that is gone (at whatever generation
                // they tried) refuse the first generation until they see that nobody has one,
                // and a member whose forming broke aborts it: ask again (join where a group
                // lives after all), and try it again where nobody has one. Exiting instead,
                // this process may be restarted again and again faster than the others can
                // see it (found by the membership simulator: the supervisor's budget ran out,
                // seeds 263 and 2909 of sweeps of up to 3 workers after refusals, 4126886 of
                // up to 6 workers after aborts).
                let forget = || self.membership.forget_failed_start();
                match entry::after_failed_start(now, until, forget) {
                    AfterFailedStart::RetryAt { at, until } => {
                        self.phase = Phase::StartAgain { at, until };
                    }
                    AfterFailedStart::AskAgain => {
                        self.begin_entering(now, EnterAfter::FailedStart);
                    }
                }
            }
            Purpose::Admitted { mut wait } => {
                wait.again(now);
                self.phase = Phase::Joining { wait };
            }
            Purpose::Recover { mut reforming } => {
                let attempted = begun.then(|| attempted.members.iter().map(|m| m.node.clone()));
                let step = reforming.forming_failed(attempted.map(Iterator::collect), now);
                self.take_reform_step(now, reforming, step);
            }
            // Another member may have formed the admission's generation (its links all up while
            // this member's were not): it measures its quorum on that generation's members from
            // then on, so this member must too. Measured on its old group instead, a member
            // cut off from it during the admission went on alone beside it (split brain,
            // found by the membership simulator, seed 890 of its first sweep).
            Purpose::Admit => self.begin_reforming(now, attempted),
            Purpose::Depart { before } => self.begin_reforming(now, before),
        }
    }
}
