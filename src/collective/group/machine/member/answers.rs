//! The member's answers to the others: to an ask to enter, a join, a question whether it still
//! forms a generation, a probe, and the joins it holds until it can answer them.

use super::*;

impl MemberMachine {
    pub(super) fn answer_enter(
        &mut self,
        now: Instant,
        from: &NodeId,
        addr: SocketAddr,
        incarnation: Incarnation,
    ) {
        let view = self.group.as_ref().map(Group::view);
        let answer = self
            .membership
            .handle_enter(from, addr, incarnation, view, now);
        let (generation, formed) = match answer {
            EnterAnswer::NoGroup { generation } => (generation, false),
            EnterAnswer::Stale { generation } => (generation, true),
            EnterAnswer::Pending {
                generation,
                restarted,
            } => {
                if restarted {
                    self.break_group(Broke::MemberLost(from.clone()));
                }
                (generation, true)
            }
        };
        let member_of = self.membership.formed_generation;
        self.send(
            from,
            MemberMessage::Entered {
                generation,
                formed,
                member_of,
                to: incarnation,
            },
        );
    }

    /// Answers the held joins that can be answered now (this mesh reached their generation, or
    /// their bound passed).
    pub(super) fn answer_held_joins(&mut self, now: Instant) {
        let held = std::mem::take(&mut self.held);
        for join in held {
            let view = self.group.as_ref().map(Group::view);
            let answer = self.membership.handle_join(
                &join.peer,
                join.generation,
                &join.members,
                view,
                join.context,
            );
            let generation = join.generation;
            match answer {
                JoinAnswer::Wait if now < join.until => self.held.push(join),
                JoinAnswer::Wait => {
                    let current = self.membership.generation;
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current,
                            to: join.context.incarnation,
                        },
                    );
                }
                JoinAnswer::Take => {
                    if let Some(g) = self.group.as_mut() {
                        g.links.insert(join.peer.clone(), FormLink::Up);
                    }
                    self.membership
                        .linked_with(&join.peer, generation, join.context.incarnation);
                    let incarnation = self.incarnation;
                    self.send(
                        &join.peer,
                        MemberMessage::Joined {
                            generation,
                            incarnation,
                            to: join.context.incarnation,
                        },
                    );
                }
                JoinAnswer::Refused { current, .. } => {
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current,
                            to: join.context.incarnation,
                        },
                    );
                }
                JoinAnswer::ViewsDiffer { .. } => {
                    self.break_group(Broke::ViewsDiffer(join.peer.clone()));
                    self.send(
                        &join.peer,
                        MemberMessage::JoinRefused {
                            generation,
                            current: generation,
                            to: join.context.incarnation,
                        },
                    );
                }
            }
        }
    }

    pub(super) fn still_forming(&self, generation: u64, members: &[NodeId]) -> StillAnswer {
        let view = self.group.as_ref().map(Group::view);
        match self
            .membership
            .handle_still_forming(generation, members, view)
        {
            StillFormingHere::Yes => StillAnswer::Yes,
            StillFormingHere::Broken => StillAnswer::Broken,
            StillFormingHere::OtherMembers
            | StillFormingHere::NotAdmitted
            | StillFormingHere::Gone => StillAnswer::Refused {
                current: self.membership.generation,
            },
        }
    }

    pub(super) fn still_forming_answered(
        &mut self,
        from: &NodeId,
        generation: u64,
        answer: StillAnswer,
    ) {
        if self.forming_generation() != Some(generation) {
            return;
        }
        let refused = |current| Broke::Refused {
            by: from.clone(),
            current,
        };
        let (heard, current) = match answer {
            StillAnswer::Yes => (StillHeard::Forms, None),
            StillAnswer::Refused { current } => (StillHeard::Refused, Some(current)),
            StillAnswer::Broken => (StillHeard::Broken, None),
        };
        if linking::ends_forming(generation, heard) {
            return self.break_group(refused(current));
        }
        if let Some(link) = self.group.as_mut().and_then(|g| g.links.get_mut(from)) {
            link.heard_still_forming();
        }
    }

    pub(super) fn answer_probe(&mut self, from: &NodeId, generation: u64) {
        let linked = self.membership.linked.contains(&(from.clone(), generation));
        let view = self.group.as_ref().map(Group::view);
        let answer = match self.membership.handle_probe(from, generation, view, linked) {
            ProbeAnswerHere::Alive => ProbeReply::Alive,
            ProbeAnswerHere::Joining => ProbeReply::Joining,
            ProbeAnswerHere::Unsettled => ProbeReply::Unsettled,
            ProbeAnswerHere::LeftOut { .. } => ProbeReply::LeftOut,
            ProbeAnswerHere::CutShort => {
                let cut = match self.group.as_mut() {
                    Some(g) if g.broken.is_none() => {
                        g.cut_short = true;
                        true
                    }
                    _ => false,
                };
                if cut {
                    self.membership.formed(generation);
                    self.break_group(Broke::CutShort);
                    ProbeReply::Alive
                } else {
                    self.no_survivor(generation)
                }
            }
            ProbeAnswerHere::EndForming => {
                self.break_group(Broke::EndForming);
                self.no_survivor(generation)
            }
        };
        self.send(from, MemberMessage::ProbeAnswer { generation, answer });
    }

    /// How this process, no survivor, answers a prober of `generation` (`Membership::no_survivor`).
    pub(super) fn no_survivor(&mut self, generation: u64) -> ProbeReply {
        match self.membership.no_survivor(generation) {
            ProbeAnswerHere::Joining => ProbeReply::Joining,
            _ => ProbeReply::Unsettled,
        }
    }

    /// Breaks this process's latest group (once): a formed one tells the others (`Abort`).
    pub(super) fn break_group(&mut self, why: Broke) {
        let Some(g) = self.group.as_mut() else {
            return;
        };
        if g.broken.is_some() {
            return;
        }
        // The first member to see a failure tells the others; a group superseded here, or
        // aborted by another member, has nothing to tell.
        let tell = g.formed && !matches!(why, Broke::Superseded | Broke::Aborted(_));
        g.broken = Some(why);
        if tell {
            let generation = g.generation;
            let others = g.others(&self.me.node);
            for peer in others {
                self.send(&peer, MemberMessage::Abort { generation });
            }
        }
    }
}
