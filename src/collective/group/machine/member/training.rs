//! Training in a formed group: the state agreed on, the boundary vote (departures, the leader's
//! telling of an admission), and each step's all-reduce.

use super::*;

impl MemberMachine {
    /// Begins the next collective of a formed group.
    pub(super) fn begin_round(&mut self, now: Instant, round: Option<Round>) {
        let round = round.unwrap_or(if self.needs_state {
            Round::State
        } else {
            Round::Vote
        });
        let seq = self.group.as_ref().map_or(0, |g| g.seq);
        self.phase = Phase::Training {
            round,
            began: now,
            seq,
            sent: false,
        };
    }

    pub(super) fn progress_training(&mut self, now: Instant) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        if let Phase::Training {
            round: Round::Step {
                computed: false, ..
            },
            ..
        } = &self.phase
        {
            // A step's computation is not left midway (production's training thread is inside
            // it): a failure of the group meanwhile is taken once it is done, as the step's
            // all-reduce then fails at once.
            return;
        }
        if g.broken.is_some() {
            return self.group_failed(now);
        }
        let Phase::Training {
            round,
            began,
            seq,
            sent,
        } = &self.phase
        else {
            return;
        };
        let (round, began, seq, sent) = (round.clone(), *began, *seq, *sent);
        if now >= began + self.settings.op_timeout {
            self.break_group(Broke::Timeout);
            return self.group_failed(now);
        }
        match round {
            Round::Telling { .. } => self.progress_telling(now),
            // The round's end comes from the executor (`handle_round_done`).
            _ if !sent => self.run_round(now, &round, seq),
            _ => {}
        }
    }

    /// Asks the executor to run collective `seq` of `round` ([`MemberAction::RunRound`]):
    /// this member's piece to the others, every member's awaited (a broadcast: the leader's).
    pub(super) fn run_round(&mut self, now: Instant, round: &Round, seq: u64) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        let (generation, rank) = (g.generation, g.rank);
        let others = g.others(&self.me.node);
        let nodes = g.nodes.clone();
        let piece = match round {
            Round::State => Some(Piece::State {
                held: self.holds_state.then_some((self.step, self.digest)),
            }),
            Round::Vote => Some(Piece::Vote(self.vote(now, rank, &nodes))),
            // A broadcast from the leader: the others send nothing.
            Round::Told { .. } => None,
            // The next boundary's vote, cast as the step began, rides in the step.
            Round::Step { vote, .. } => Some(Piece::Contribution {
                step: self.step + 1,
                value: contribution(&self.me.node, self.step + 1),
                vote: vote.clone(),
            }),
            Round::Telling { .. } => None,
        };
        if let Phase::Training { sent, .. } = &mut self.phase {
            *sent = true;
        }
        let from = match round {
            Round::Told { .. } => vec![nodes[0].clone()],
            Round::Telling { .. } => return,
            _ => nodes,
        };
        let from = self.processes_of(from);
        let to = if piece.is_some() { others } else { Vec::new() };
        self.actions.push_back(MemberAction::RunRound {
            generation,
            seq,
            piece,
            to,
            from,
        });
    }

    /// Each of `nodes` with the process of it this member's group linked with (this process for
    /// itself): whose pieces a round of the group takes.
    fn processes_of(&self, nodes: Vec<NodeId>) -> Vec<(NodeId, Option<Incarnation>)> {
        nodes
            .into_iter()
            .map(|node| {
                let process = if node == self.me.node {
                    Some(self.incarnation)
                } else {
                    self.membership.linked_process(&node)
                };
                (node, process)
            })
            .collect()
    }

    /// This member's vote at a step boundary of the group of `nodes`, where it has `rank`.
    fn vote(&mut self, now: Instant, rank: usize, nodes: &[NodeId]) -> Vote {
        let offer = if rank == 0 {
            self.membership.pending_joiners(nodes, now, PENDING_FRESH)
        } else {
            Vec::new()
        };
        Vote {
            leaving: self.notice,
            offer,
        }
    }

    /// A collective of the group ended with every member's `pieces`.
    pub(super) fn round_done(&mut self, now: Instant, round: Round, pieces: Vec<Piece>) {
        match round {
            Round::State => self.state_agreed(now, &pieces),
            Round::Vote => {
                let votes = pieces.into_iter().map(|piece| match piece {
                    Piece::Vote(vote) => Some(vote),
                    _ => None,
                });
                self.voted(now, votes.collect())
            }
            Round::Told {
                generation,
                joiners,
                members,
            } => {
                if pieces.first() == Some(&Piece::Told(true)) {
                    self.membership.admitting(&joiners);
                    self.begin_forming(now, generation, members, Purpose::Admit);
                } else {
                    // Not every joiner could be told: nobody forms that generation.
                    self.membership.skip(generation);
                    self.begin_step(now);
                }
            }
            Round::Step { .. } => self.stepped(now, &pieces),
            Round::Telling { .. } => {}
        }
    }

    pub(super) fn state_agreed(&mut self, now: Instant, pieces: &[Piece]) {
        let states = pieces.iter().filter_map(|p| match p {
            Piece::State { held } => *held,
            _ => None,
        });
        // The most steps of the members that hold the job's state; ties go to the lowest rank
        // (the first such: pieces are in rank order, this member's own among them).
        let mut source: Option<(u64, u64)> = None;
        for state in states {
            if source.is_none_or(|b| state.0 > b.0) {
                source = Some(state);
            }
        }
        // A group of joiners none of which was handed the state must not train: it would start
        // the job again from nothing while the members that hold it live on elsewhere (found
        // by the membership simulator: an admitted process whose handover never completed
        // re-formed alone as the lowest-ranked half and trained from step 0 while the member
        // that admitted it held step 23; seed 11001485 of 2 workers and 16 faults).
        let Some(source) = source else {
            return self.exit(MemberExit::NoStateHolder);
        };
        (self.step, self.digest) = source;
        self.holds_state = true;
        let generation = self.group.as_ref().map_or(0, |g| g.generation);
        self.actions.push_back(MemberAction::Adopted {
            generation,
            step: self.step,
            digest: self.digest,
        });
        self.needs_state = false;
        self.recovery = None;
        self.begin_round(now, Some(Round::Vote));
    }

    /// Every member's vote at this boundary (`None` for a piece that was no vote), in rank
    /// order.
    pub(super) fn voted(&mut self, now: Instant, votes: Vec<Option<Vote>>) {
        let Some(g) = self.group.as_ref() else {
            return;
        };
        // The boundary after the last step: every member of the group reached it with the
        // same model, so each ends holding what the others hold. A member that applied the
        // last step alone (from messages it held while the others re-formed without it)
        // never gets here: it re-forms, and is left out or takes the others' state.
        if self.step >= self.settings.steps {
            self.actions.push_back(MemberAction::Finished {
                step: self.step,
                digest: self.digest,
            });
            self.phase = Phase::Ended;
            return;
        }
        // Every member's notice, and the leader's joiners, in rank order.
        let notices = votes
            .iter()
            .map(|vote| vote.as_ref().and_then(|v| v.leaving));
        let offer = match votes.first() {
            Some(Some(vote)) => vote.offer.clone(),
            _ => Vec::new(),
        };
        let next = self.membership.next_generation(g.generation);
        match boundary::decide(notices, !offer.is_empty()) {
            BoundaryChange::Depart(leavers) => {
                if let Some(why) = leavers.of(g.rank) {
                    return self.exit(MemberExit::Left(why));
                }
                let stayers = leavers.stayers(&g.members);
                let before = self.before_of_group();
                return self.begin_forming(now, next, stayers, Purpose::Depart { before });
            }
            BoundaryChange::Unchanged => return self.begin_step(now),
            BoundaryChange::Admit => {}
        }
        let mut members = g.members.clone();
        members.extend(offer.iter().map(|j| j.member.clone()));
        let round = if g.rank == 0 {
            self.membership.offered(&offer);
            let telling = TellRound::new(
                offer.iter().map(|j| j.member.node.clone()),
                next,
                (now, self.settings.form_timeout),
                self.settings.detection,
            );
            Round::Telling {
                generation: next,
                joiners: offer,
                members,
                telling,
            }
        } else {
            Round::Told {
                generation: next,
                joiners: offer,
                members,
            }
        };
        self.begin_round(now, Some(round));
    }

    /// The leader tells each joiner its admission, then broadcasts whether all acked.
    pub(super) fn progress_telling(&mut self, now: Instant) {
        let Phase::Training {
            round:
                Round::Telling {
                    generation,
                    joiners,
                    members,
                    telling,
                },
            ..
        } = &mut self.phase
        else {
            return;
        };
        let generation = *generation;
        let step = telling.poll(now);
        let (joiners, members) = (joiners.clone(), members.clone());
        let admit = MemberMessage::Admit {
            generation,
            members: members.clone(),
        };
        for n in step.tell {
            self.send(&n, admit.clone());
        }
        if let Some(all_told) = step.done {
            let round = Round::Told {
                generation,
                joiners,
                members,
            };
            if let Some(g) = self.group.as_ref() {
                let (g_generation, seq) = (g.generation, g.seq);
                let others: Vec<NodeId> = g.nodes.iter().skip(1).cloned().collect();
                // The leader's broadcast: its own piece is the whole round.
                let from = vec![(self.me.node.clone(), Some(self.incarnation))];
                self.actions.push_back(MemberAction::RunRound {
                    generation: g_generation,
                    seq,
                    piece: Some(Piece::Told(all_told)),
                    to: others,
                    from,
                });
            }
            if let Phase::Training { round: r, sent, .. } = &mut self.phase {
                *r = round;
                *sent = true;
            }
        }
    }

    /// Begins the next step: its computation (the executor's: the user's step in production,
    /// a stretch of simulated time in the simulator), then its all-reduce.
    pub(super) fn begin_step(&mut self, now: Instant) {
        // The vote at the boundary after this step is cast now, unless the closing boundary
        // comes next (as production's training loops cast it).
        let vote = match &self.group {
            Some(g) if self.step + 1 < self.settings.steps => {
                let (rank, nodes) = (g.rank, g.nodes.clone());
                Some(self.vote(now, rank, &nodes))
            }
            _ => None,
        };
        self.begin_round(
            now,
            Some(Round::Step {
                computed: false,
                vote,
            }),
        );
        if let Some(g) = &self.group {
            let (generation, seq, step) = (g.generation, g.seq, self.step + 1);
            self.actions.push_back(MemberAction::Compute {
                generation,
                seq,
                step,
            });
        }
    }

    pub(super) fn stepped(&mut self, now: Instant, pieces: &[Piece]) {
        let step = self.step + 1;
        let mut sum = 0u64;
        let mut votes = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Contribution {
                    step: s,
                    value,
                    vote,
                } if *s == step => {
                    sum = sum.wrapping_add(*value);
                    votes.push(vote.clone());
                }
                // Members that disagree on the call: the group cannot go on.
                _ => {
                    self.break_group(Broke::Timeout);
                    return self.group_failed(now);
                }
            }
        }
        let parent = self.digest;
        self.digest = apply_step(parent, step, sum);
        self.step = step;
        let g = self.group.as_ref().expect("a group trains");
        self.actions.push_back(MemberAction::Applied {
            generation: g.generation,
            members: g.nodes.clone(),
            step,
            parent,
            digest: self.digest,
        });
        // The next boundary was voted in the step where every member's contribution carried
        // its vote; else (after the last step, where one more boundary closes the job: see
        // `voted`) it votes on its own.
        if votes.iter().all(Option::is_some) {
            return self.voted(now, votes);
        }
        self.begin_round(now, Some(Round::Vote));
    }

    /// The group this member trains in broke: re-form from it. Where it broke before the
    /// state of a re-forming was agreed on, that is the re-forming's next attempt, which
    /// probes this group ([`Reforming::agreement_failed`]).
    pub(super) fn group_failed(&mut self, now: Instant) {
        let before = self.before_of_group();
        match self.recovery.take() {
            Some(mut reforming) => {
                let step = reforming.agreement_failed(before, now);
                self.take_reform_step(now, reforming, step);
            }
            None => self.begin_reforming(now, before),
        }
    }
}
