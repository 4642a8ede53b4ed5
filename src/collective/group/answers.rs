//! The mesh's answers to membership messages: a join of a generation, an ask to enter (`Enter`),
//! an admission, whether it still forms a generation, and the refusals of another generation.

use super::*;

impl MeshInner {
    /// The answer to a dialer's join of `generation`: waits (at most `form_timeout`) for this node
    /// to form it, then acks if it formed it with the same members. A joiner not admitted to
    /// `generation` refuses at once, unless the dialer is a joiner admitted to it (`by_admission`):
    /// its own admission is then on its way (see [`Wire::Join`]).
    pub(super) async fn join(
        &self,
        conn: &Connection,
        generation: u64,
        members: Vec<NodeId>,
        plaintext: bool,
        by_admission: bool,
        incarnation: Incarnation,
    ) -> Reply {
        let arrived = Instant::now();
        let deadline = arrived + self.config.form_timeout;
        if plaintext != self.config.plaintext {
            return self.refuse_other_plane(conn.peer(), generation, plaintext);
        }
        let peer = conn.peer().clone();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                let key = (peer.clone(), generation);
                let context = JoinContext {
                    incarnation,
                    by_admission,
                    later_join: state
                        .joined
                        .get(&key)
                        .is_some_and(|(_, at, _)| *at > arrived),
                    closed: conn.close_reason().is_some(),
                };
                let group = state.group.upgrade();
                let view = group.as_deref().map(Shared::view);
                let answer = state
                    .membership
                    .handle_join(&peer, generation, &members, view, context);
                match answer {
                    JoinAnswer::Wait => {}
                    JoinAnswer::Take => {
                        state
                            .joined
                            .insert(key, (conn.clone(), arrived, incarnation));
                        let plain = match self.plain.get() {
                            Some((port, _)) if self.config.plaintext => {
                                let token = crate::collective::plain::new_token();
                                state.plain_tokens.insert(token, (peer, generation));
                                Some(PlainLink { port: *port, token })
                            }
                            _ => None,
                        };
                        drop(state);
                        self.changed.notify_waiters();
                        return Reply::Joined {
                            incarnation: self.incarnation,
                            plain,
                        };
                    }
                    JoinAnswer::Refused { current, why } => {
                        return Reply::Refused {
                            current,
                            detail: why.detail(&peer, generation, current),
                        }
                    }
                    JoinAnswer::ViewsDiffer { theirs, ours } => {
                        drop(state);
                        if let Some(g) = group {
                            let reason = format!(
                                "{peer} forms it with members {theirs:?}, this member with \
                                 {ours:?}: the views differ"
                            );
                            g.fail(CollectiveError::Form { generation, reason }, false);
                            self.changed.notify_waiters();
                        }
                        return Reply::Refused {
                            current: generation,
                            detail: JoinRefusal::OtherMembers(ours)
                                .detail(&peer, generation, generation),
                        };
                    }
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let state = self.lock();
                return Reply::Refused {
                    current: state.membership.generation,
                    detail: format!(
                        " and did not form generation {generation} within its form timeout"
                    ),
                };
            }
        }
    }

    /// Refuses `peer`'s join of `generation` over the data plane it chose (`plaintext`), not
    /// this member's, and fails this member's wait for that join with the same reason.
    fn refuse_other_plane(&self, peer: &NodeId, generation: u64, plaintext: bool) -> Reply {
        let plane = |p: bool| if p { "plaintext" } else { "QUIC" };
        let reason = format!(
            "{peer} uses the {} data plane, this member the {} one: every member must choose \
             alike (GroupConfig::plaintext)",
            plane(plaintext),
            plane(self.config.plaintext)
        );
        self.lock()
            .refused_joins
            .insert((peer.clone(), generation), reason.clone());
        self.changed.notify_waiters();
        Reply::Refused {
            current: generation,
            detail: format!(": {reason}"),
        }
    }

    /// The answer to a process's `Enter` (see [`Mesh::enter`]), as the membership machine
    /// decides it ([`Membership::handle_enter`]); fails a live group of which the asker is a
    /// member when it is a new process of that member (its old incarnation is gone).
    pub(super) fn entered(&self, peer: &NodeId, addr: &str, incarnation: Incarnation) -> Reply {
        let mut state = self.lock();
        let Ok(addr) = addr.parse::<SocketAddr>() else {
            tracing::warn!(%peer, addr, "refused an enter whose address does not parse");
            return Reply::Refused {
                current: state.membership.generation,
                detail: format!(" (the address {addr:?} does not parse)"),
            };
        };
        let group = state.group.upgrade();
        let view = group.as_deref().map(Shared::view);
        let now = Instant::now().into_std();
        let answer = state
            .membership
            .handle_enter(peer, addr, incarnation, view, now);
        let member_of = state.membership.formed_generation;
        drop(state);
        match answer {
            EnterAnswer::NoGroup { generation } => Reply::Entered {
                generation,
                formed: false,
                member_of,
            },
            EnterAnswer::Stale { generation } => {
                tracing::debug!(%peer, %incarnation, "an ask to join from a process already a member: sent before it formed this group, ignored");
                Reply::Entered {
                    generation,
                    formed: true,
                    member_of,
                }
            }
            EnterAnswer::Pending {
                generation,
                restarted,
            } => {
                if let Some(g) = group.filter(|_| restarted) {
                    g.fail(
                        CollectiveError::MemberLost {
                            node: peer.clone(),
                            generation,
                            reason: format!(
                                "a new process of it ({incarnation}) asks to join: the old one \
                                 is gone"
                            ),
                        },
                        true,
                    );
                }
                Reply::Entered {
                    generation,
                    formed: true,
                    member_of,
                }
            }
        }
    }

    /// The answer to a probe by `peer`, a member of `generation` re-forming it with the survivors,
    /// as the membership machine decides it ([`Membership::handle_probe`]). A prober left out
    /// of a later live group learns it at once (it is the late member: the others re-formed
    /// without it).
    pub(super) fn probed(&self, peer: &NodeId, generation: u64) -> Reply {
        let (answer, group) = {
            let mut state = self.lock();
            let key = (peer.clone(), generation);
            // Its link with the prober of that generation is up here (or the prober's join was
            // taken and the forming has not picked it up yet).
            let linked = state.membership.linked.contains(&key) || state.joined.contains_key(&key);
            let group = state.group.upgrade();
            let view = group.as_deref().map(Shared::view);
            (
                state
                    .membership
                    .handle_probe(peer, generation, view, linked),
                group,
            )
        };
        match (answer, group) {
            (ProbeAnswerHere::Alive, _) => Reply::Ack,
            (ProbeAnswerHere::LeftOut { current }, _) => Reply::Refused {
                current,
                detail: format!(" and re-formed without {peer}"),
            },
            // A member whose links were not all up when another member was lost: it
            // survives, and re-forms with the others (`Mesh::form` gives it the group, broken
            // by this).
            (ProbeAnswerHere::CutShort, Some(g)) => {
                let err = CollectiveError::Form {
                    generation,
                    reason: format!(
                        "{peer} formed generation {generation} with this process and lost a member before \
                         this process's links were all up: re-form with the survivors"
                    ),
                };
                if self.cut_short(&g, err) {
                    Reply::Ack
                } else {
                    self.no_survivor(generation)
                }
            }
            // A new process of this node, whose old one the prober formed with (lost since), or
            // a joiner forming the admission's generation the prober re-forms from. It is no
            // survivor: it enters again as a joiner (`MultiWorkerMirrored::new`).
            (ProbeAnswerHere::EndForming, Some(g)) => {
                g.fail(
                    CollectiveError::Form {
                        generation: g.generation,
                        reason: format!(
                            "{peer} re-forms from generation {generation} without this process: enter \
                             and be admitted"
                        ),
                    },
                    false,
                );
                self.changed.notify_waiters();
                self.no_survivor(generation)
            }
            (ProbeAnswerHere::Joining, _) => Reply::Joining,
            (ProbeAnswerHere::Unsettled, _) => Reply::Unsettled,
            (ProbeAnswerHere::CutShort | ProbeAnswerHere::EndForming, None) => {
                self.no_survivor(generation)
            }
        }
    }

    /// How this process, no survivor, answers a prober of `generation`
    /// ([`Membership::no_survivor`]).
    fn no_survivor(&self, generation: u64) -> Reply {
        match self.lock().membership.no_survivor(generation) {
            ProbeAnswerHere::Joining => Reply::Joining,
            _ => Reply::Unsettled,
        }
    }

    /// The answer to the leader's `Admit`: taken if this mesh waits to be admitted and the
    /// generation is above every one formed here.
    pub(super) fn admitted(&self, generation: u64, members: Vec<(NodeId, String)>) -> Reply {
        let mut parsed = Vec::with_capacity(members.len());
        for (node, addr) in members {
            match addr.parse::<SocketAddr>() {
                Ok(addr) => parsed.push(GroupMember { node, addr }),
                Err(_) => {
                    return Reply::Refused {
                        current: self.lock().membership.generation,
                        detail: format!(" (the address {addr:?} of {node} does not parse)"),
                    }
                }
            }
        }
        let taken = self.lock().membership.handle_admit(generation, parsed);
        if let Err(current) = taken {
            return Reply::Refused {
                current,
                detail: " (not waiting to be admitted)".into(),
            };
        }
        self.changed.notify_waiters();
        Reply::Ack
    }

    /// Breaks `group`, still forming here, with `err` as one that a member formed with this
    /// process and is re-forming ([`Shared::cut_short`]): this process is a member from now
    /// on. Whether it did.
    pub(super) fn cut_short(&self, group: &Shared, err: CollectiveError) -> bool {
        let cut = group.cut_short(err);
        if cut {
            self.lock().membership.formed(group.generation);
        }
        self.changed.notify_waiters();
        cut
    }

    /// The answer to [`Wire::StillForming`]: whether this mesh forms (or will form) `generation`
    /// with `members`.
    pub(super) fn still_forming(&self, generation: u64, members: &[NodeId]) -> Reply {
        let state = self.lock();
        let group = state.group.upgrade();
        let view = group.as_deref().map(Shared::view);
        match state
            .membership
            .handle_still_forming(generation, members, view)
        {
            StillFormingHere::Yes => Reply::Ack,
            StillFormingHere::NotAdmitted => Self::unadmitted_refusal(&state, generation),
            StillFormingHere::Gone => self.refusal_locked(&state, generation),
            StillFormingHere::OtherMembers => Reply::Refused {
                current: generation,
                detail: group
                    .map(|g| format!(" with members {:?}", g.nodes))
                    .unwrap_or_default(),
            },
            StillFormingHere::Broken => match group.and_then(|g| g.lock().broken.clone()) {
                Some(err) => Reply::Broken(err),
                // Not reached: a group's break is for good.
                None => self.refusal_locked(&state, generation),
            },
        }
    }

    pub(super) fn unadmitted_refusal(state: &MeshState, generation: u64) -> Reply {
        Reply::Refused {
            current: state.membership.generation,
            detail: format!(
                " (a new process waiting to be admitted, not admitted to generation {generation}: its old \
                 one is gone)"
            ),
        }
    }

    pub(super) fn refusal(&self, generation: u64) -> Reply {
        let state = self.lock();
        self.refusal_locked(&state, generation)
    }

    pub(super) fn refusal_locked(&self, state: &MeshState, generation: u64) -> Reply {
        Reply::Refused {
            current: state.membership.generation,
            detail: if state.membership.generation == generation {
                " (its group of that generation is gone)".into()
            } else {
                String::new()
            },
        }
    }
}
