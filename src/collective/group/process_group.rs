//! A formed group ([`ProcessGroup`]): its members, its re-forming with the survivors and its
//! admission of joiners at the next generation, and waiting until its messages were taken.

use super::forming::Attempt;
use super::*;

/// A formed group of processes: its rank, members and generation, and the operations (`ops.rs`).
/// Cheap to clone; operations of one group run one at a time, in call order.
#[derive(Clone)]
pub struct ProcessGroup {
    pub(crate) shared: Arc<Shared>,
    pub(super) mesh: Mesh,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("generation", &self.shared.generation)
            .field("rank", &self.shared.rank)
            .field("members", &self.shared.nodes)
            .finish()
    }
}

impl ProcessGroup {
    /// This member's rank (its index in the sorted node ids).
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.shared.nodes.len()
    }

    /// The group's generation (its membership generation: one per formation).
    pub fn generation(&self) -> u64 {
        self.shared.generation
    }

    /// The members' nodes in rank order.
    pub fn members(&self) -> &[NodeId] {
        &self.shared.nodes
    }

    /// The peers this member passes chunks to through shared memory
    /// ([`GroupConfig::shared_memory`]): those of the plaintext plane on this host that took
    /// its segment, which happens with its first chunk worth a slot to each.
    pub fn shared_memory_peers(&self) -> Vec<NodeId> {
        let Some(links) = self.shared.links.get() else {
            return Vec::new();
        };
        links
            .iter()
            .zip(&self.shared.nodes)
            .filter(|(link, _)| {
                link.as_ref()
                    .and_then(|l| l.slots.as_ref())
                    .is_some_and(|slots| slots.lending())
            })
            .map(|(_, node)| node.clone())
            .collect()
    }

    /// The error that broke this group, if one did.
    pub fn broken(&self) -> Option<CollectiveError> {
        self.shared.lock().broken.clone()
    }

    /// Waits, at most `within`, until every message this member sent was answered (its peers
    /// took it) or the group broke; whether it got there (a plaintext link its peer closed
    /// counts as drained: that peer wants nothing more from it). A member whose operation ended may
    /// still have its last chunks on the way to a peer whose operation has not: a member about
    /// to go away (its process exiting) flushes first, so that the peer is not left to take
    /// it for lost. On the plaintext plane a chunk counts once written into the kernel, so the
    /// flush then also waits until each peer acknowledged every byte of its link: a process
    /// that exits with bytes of a link unread has Linux reset the link and discard what it had
    /// not sent yet.
    pub async fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let idle = self
                .shared
                .unanswered
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0;
            if self.broken().is_some() {
                return idle;
            }
            if idle {
                break;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(FLUSH_POLL).await;
        }
        // Then each plaintext link's peer acknowledges what it was sent. A group that breaks
        // meanwhile is not waited for: its links end with it (dropping the requests).
        let drained = futures::future::join_all(self.shared.drained());
        tokio::select! {
            answers = drained => answers.iter().all(Result::is_ok),
            _ = self.shared.until_broken() => false,
            () = tokio::time::sleep_until(deadline) => false,
        }
    }

    /// Breaks the group with `err` (the first failure wins: the group's error, if it broke
    /// already) and tells every member; returns once they heard it, as a failed call does.
    /// For a failure the group's own calls cannot see (the NCCL communicator beside it).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) async fn fail_with(&self, err: CollectiveError) -> CollectiveError {
        let err = self.shared.fail(err, true);
        self.shared.told().await;
        err
    }

    /// Fails this group with [`CollectiveError::Application`] naming this member and
    /// `message` (its step failed in the application), tells every member (each one's pending
    /// and later calls fail with it at once), and returns once they heard it (bounded by the
    /// abort's timeout) or with the error that broke the group before.
    pub async fn abort(&self, message: impl Into<String>) -> CollectiveError {
        let err = CollectiveError::Application {
            node: self.shared.nodes[self.shared.rank].clone(),
            generation: self.shared.generation,
            message: message.into(),
        };
        let err = self.shared.fail(err, true);
        self.shared.told().await;
        err
    }

    /// The members of this group that are alive: this node, and each member that answers a
    /// probe within `within` (dialed anew if its link is gone), in rank order. Survivors that
    /// probe alike (the lost members dead, the others answering) get the same list, which is
    /// what [`ProcessGroup::reform`] needs of every survivor. Fails with
    /// [`CollectiveError::GenerationRefused`] when a member already formed a later generation without
    /// this node (this node is the late one: it was taken for lost).
    pub async fn reachable(&self, within: Duration) -> Result<Vec<NodeId>, CollectiveError> {
        self.probe_members(within).await.map(|probed| probed.alive)
    }

    /// [`ProcessGroup::reachable`], telling also which of the members that did not answer as
    /// survivors answered as new processes waiting to be admitted ([`Probed::joining`]).
    ///
    /// Whom to probe when, and when the answers are all in, is `reforming::ProbeRound`'s,
    /// which the member machine that the membership simulator drives follows alike; this
    /// carries out its probes as requests (one at a time per member, each bounded by the round).
    pub async fn probe_members(&self, within: Duration) -> Result<Probed, CollectiveError> {
        use reforming::{ProbeReply, Probes};
        let generation = self.shared.generation;
        let members: Vec<GroupMember> = (self.shared.nodes.iter().zip(&self.shared.addrs))
            .map(|(node, addr)| GroupMember {
                node: node.clone(),
                addr: *addr,
            })
            .collect();
        let me = self.shared.nodes[self.shared.rank].clone();
        let nodes = self.shared.nodes.clone();
        let detection = self.mesh.inner.endpoint.config().idle_timeout;
        let now = Instant::now().into_std();
        let mut round = reforming::ProbeRound::new(nodes, me, generation, (now, within), detection);
        let deadline = Instant::from_std(round.deadline());
        // The first refusal of each member that left this one out, to fail with.
        let mut refusals: HashMap<NodeId, CollectiveError> = HashMap::new();
        let mut probes = InFlight::default();
        loop {
            let step = round.poll(Instant::now().into_std());
            for member in members.iter().filter(|m| step.probe.contains(&m.node)) {
                probes.ask(member, self.mesh.probe(member, generation, deadline));
            }
            match step.done {
                Some(Probes::LeftOut(by)) => {
                    return Err(refusals.remove(&by).unwrap_or_else(|| {
                        CollectiveError::GenerationRefused {
                            node: by,
                            generation,
                            current: generation,
                            detail: String::new(),
                        }
                    }))
                }
                Some(Probes::Answered { alive, joining }) => return Ok(Probed { alive, joining }),
                None => {}
            }
            let wake = Instant::from_std(round.wake_at());
            let Some(probed) = probes.next_until(wake).await else {
                continue;
            };
            let node = probed.peer;
            match probed.answer {
                Ok(Some(reply)) => round.answered(&node, reply),
                Ok(None) => round.undelivered(&node, probed.began, Instant::now().into_std()),
                Err(refused) => {
                    refusals.entry(node.clone()).or_insert(refused);
                    round.answered(&node, ProbeReply::LeftOut);
                }
            }
        }
    }

    /// The leader tells each of `joiners` its admission to `generation` with `members`;
    /// whether every one acked. Whom to tell when, and when the telling is over, is
    /// [`boundary::TellRound`]'s, which the member machine follows alike; this carries out its
    /// tellings as requests (one at a time per joiner, each bounded by the round).
    async fn tell_joiners(
        &self,
        joiners: &[Joiner],
        generation: u64,
        members: &[GroupMember],
    ) -> bool {
        let detection = self.mesh.inner.endpoint.config().idle_timeout;
        let now = Instant::now().into_std();
        let nodes = joiners.iter().map(|j| j.member.node.clone());
        let within = self.shared.config.form_timeout;
        let mut telling = boundary::TellRound::new(nodes, generation, (now, within), detection);
        let deadline = Instant::from_std(telling.deadline());
        let mut tells = InFlight::default();
        loop {
            let step = telling.poll(Instant::now().into_std());
            for joiner in joiners
                .iter()
                .filter(|j| step.tell.contains(&j.member.node))
            {
                let tell = self
                    .mesh
                    .tell_admitted(&joiner.member, generation, members, deadline);
                tells.ask(&joiner.member, tell);
            }
            if let Some(every_one) = step.done {
                return every_one;
            }
            let Some(told) = tells.next_until(Instant::from_std(telling.wake_at())).await else {
                continue;
            };
            match told.answer {
                Some(taken) => telling.answered(&told.peer, taken),
                None => telling.undelivered(&told.peer, told.began, Instant::now().into_std()),
            }
        }
    }

    /// Forms the group of the next generation of this node's mesh (one above the latest formed or
    /// tried here: this group's generation + 1, unless a re-forming attempt already took that one)
    /// with `survivors` (members of this group, this node among them), at the addresses this
    /// group was formed with. Every survivor must call it with the same survivors.
    /// This group's messages still on their way go first ([`ProcessGroup::flush`], bounded by
    /// the form timeout), unless it is broken.
    pub async fn reform(&self, survivors: &[NodeId]) -> Result<ProcessGroup, CollectiveError> {
        self.reform_attempt(survivors)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`ProcessGroup::reform`], with the group of the next generation where a forming that
    /// failed had begun ([`FormFailed::attempted`]): a re-forming's next attempt probes it.
    pub(crate) async fn reform_attempt(
        &self,
        survivors: &[NodeId],
    ) -> Result<ProcessGroup, FormFailed> {
        let generation = self.mesh.next_generation(self.shared.generation);
        let mut members = Vec::with_capacity(survivors.len());
        for node in survivors {
            let Some(i) = self.shared.nodes.iter().position(|n| n == node) else {
                return Err(FormFailed {
                    attempted: None,
                    error: CollectiveError::Form {
                        generation,
                        reason: format!(
                            "{node} is not a member of generation {}",
                            self.shared.generation
                        ),
                    },
                });
            };
            members.push(GroupMember {
                node: node.clone(),
                addr: self.shared.addrs[i],
            });
        }
        self.hand_over().await;
        self.mesh.form_attempt(generation, members).await
    }

    /// The processes that asked this member to be admitted (`Enter`) within the last
    /// [`PENDING_FRESH`] and are not members of this group, in node order, with where they
    /// listen. Only the leader's (rank 0's) count: the members agree on its list before
    /// [`ProcessGroup::admit`].
    pub fn pending_joiners(&self) -> Vec<Joiner> {
        let now = Instant::now().into_std();
        self.mesh
            .inner
            .lock()
            .membership
            .pending_joiners(&self.shared.nodes, now, PENDING_FRESH)
    }

    /// Forms the next generation (as [`ProcessGroup::reform`] numbers it) with every member of
    /// this group and `joiners` (processes waiting in [`Mesh::join_live`]). Every member must
    /// call it with the same joiners. The leader (rank 0) first tells each joiner the generation and
    /// members (`Admit`, each bounded by the form timeout; one lost on a link that died is told
    /// again over a new one while the joiner is not out of reach for long), and forgets them as
    /// pending (a joiner still waiting asks again); then it tells the members, over this group,
    /// whether every joiner acked. Only then do the members form the next generation with them, so
    /// that a joiner is asked to form a generation only once admitted to it (it refuses any other
    /// at once: a member's list naming its node then meant its old process).
    ///
    /// `Ok(None)` where the leader could not tell every joiner: no member forms that generation (each
    /// skips it: a joiner told nevertheless is refused at once and asks again), and this group
    /// goes on unchanged. Where forming the admission's generation fails here (a joiner that does
    /// not form it, a link cut meanwhile), it returns that generation's group all the same, broken:
    /// its calls fail at once, and re-forming probes and measures the quorum on its members,
    /// the joiners among them ([`ProcessGroup::probe_members`], [`ProcessGroup::reform`]).
    /// Another member may have formed it (its links all up while this member's were not) and
    /// measures on those members from then on; measured on this group instead, a member cut
    /// off from a joiner during the admission could go on alone beside it (a split brain the
    /// membership simulator found). Fails as this group's calls do. This group's messages
    /// still on their way go first, as in [`ProcessGroup::reform`].
    pub async fn admit(&self, joiners: &[Joiner]) -> Result<Option<ProcessGroup>, CollectiveError> {
        if joiners.is_empty() {
            return Ok(None);
        }
        let generation = self.mesh.next_generation(self.shared.generation);
        let mut members: Vec<GroupMember> = self
            .shared
            .nodes
            .iter()
            .zip(&self.shared.addrs)
            .map(|(node, addr)| GroupMember {
                node: node.clone(),
                addr: *addr,
            })
            .collect();
        members.extend(joiners.iter().map(|j| j.member.clone()));
        let mut every_one_told = 0u8;
        if self.shared.rank == 0 {
            self.mesh.inner.lock().membership.offered(joiners);
            every_one_told = u8::from(self.tell_joiners(joiners, generation, &members).await);
        }
        let flag = candle_core::Tensor::new(&[every_one_told], &candle_core::Device::Cpu)
            .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
        let told = self
            .broadcast(0, &flag)
            .await?
            .to_vec1::<u8>()
            .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
        if told.first() != Some(&1) {
            if self.shared.rank == 0 {
                tracing::info!(
                    generation,
                    "not every joiner could be told its admission: skipping that generation"
                );
            }
            self.mesh.skip_generation(generation);
            return Ok(None);
        }
        // The admitted processes' asks still on their way are theirs, not new ones'.
        self.mesh.inner.lock().membership.admitting(joiners);
        self.hand_over().await;
        match self.mesh.try_form(generation, members).await? {
            Attempt::Formed(group) => Ok(Some(group)),
            Attempt::Failed(group, err) => {
                tracing::info!(generation, %err, "forming the admission's generation failed here: re-forming measures on its members");
                Ok(Some(group))
            }
        }
    }

    /// Before the group of the next generation supersedes this one: waits, at most the form
    /// timeout, until every message this member sent was taken, unless the group broke. A
    /// member's call ends once it has what it needs, while its own last messages (a
    /// broadcast's "done" to the root, the ring's last chunks) may still be queued for a peer
    /// whose call has not ended; the next generation's group drops this one, and its links' queues
    /// with it. A peer that goes away right after that call (a preempted member, which
    /// leaves while the others re-form without it) would otherwise wait for them until the
    /// operation timeout. The peers' calls need those messages, so in a group that is not
    /// broken this is about one round trip.
    pub(super) async fn hand_over(&self) {
        if self.broken().is_none() {
            self.flush(self.shared.config.form_timeout).await;
        }
    }
}
