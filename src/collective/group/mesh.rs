//! A node's collective endpoint ([`Mesh`]) and how a starting process enters the job: asks
//! whether a group lives ([`Mesh::enter`]) and waits to be admitted to it ([`Mesh::join_live`]).

use super::*;

/// A node's collective endpoint (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct Mesh {
    pub(super) inner: Arc<MeshInner>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("node", self.inner.endpoint.node())
            .field("generation", &self.inner.lock().membership.generation)
            .finish()
    }
}

/// `n` members `worker/0 .. worker/n-1` in this process, each on an endpoint of its own on
/// 127.0.0.1 (certificates from a fresh cluster CA), formed at generation 1 with `config`: for
/// tests, benchmarks, and trying a model's collectives on one machine. Each member's endpoint
/// (close one to make its member go away) and group, in rank order.
pub async fn loopback_group(
    n: u32,
    transport: cohort_transport::TransportConfig,
    config: GroupConfig,
) -> Result<(Vec<Endpoint>, Vec<ProcessGroup>), CollectiveError> {
    let form = |reason: String| CollectiveError::Form {
        generation: 1,
        reason,
    };
    let ca = cohort_transport::ClusterCa::generate("loopback-group")
        .map_err(|e| form(format!("a cluster CA: {e}")))?;
    let mut meshes = Vec::new();
    let mut members = Vec::new();
    let mut endpoints = Vec::new();
    for i in 0..n {
        let node = NodeId::new("worker", i);
        let creds = ca
            .issue(&node)
            .map_err(|e| form(format!("a certificate for {node}: {e}")))?;
        let endpoint = Endpoint::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            creds,
            transport.clone(),
        )
        .map_err(|e| form(format!("an endpoint for {node}: {e}")))?;
        let mesh = Mesh::new(endpoint.clone(), config.clone());
        let addr = mesh
            .local_addr()
            .map_err(|e| form(format!("the address of {node}: {e}")))?;
        members.push(GroupMember { node, addr });
        meshes.push(mesh);
        endpoints.push(endpoint);
    }
    let formed = futures::future::join_all(meshes.iter().map(|m| m.form(1, members.clone()))).await;
    let groups = formed.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok((endpoints, groups))
}

impl Mesh {
    /// Starts accepting links on `endpoint` (call inside a tokio runtime). The mesh takes over
    /// the endpoint's accept loop.
    pub fn new(endpoint: Endpoint, config: GroupConfig) -> Mesh {
        let inner = Arc::new(MeshInner {
            endpoint: endpoint.clone(),
            incarnation: Incarnation::random(),
            config,
            state: Mutex::new(MeshState::default()),
            changed: Notify::new(),
            acceptor: OnceLock::new(),
            plain: tokio::sync::OnceCell::new(),
        });
        let weak = Arc::downgrade(&inner);
        let acceptor = tokio::spawn(async move {
            while let Some(accepted) = endpoint.accept().await {
                // A refused peer was logged by the transport; the mesh goes on accepting.
                let Ok(conn) = accepted else { continue };
                let Some(mesh) = weak.upgrade() else { break };
                mesh.adopt(conn);
            }
        });
        let _ = inner.acceptor.set(acceptor);
        Mesh { inner }
    }

    /// This node.
    pub fn node(&self) -> &NodeId {
        self.inner.endpoint.node()
    }

    /// This process's incarnation as its membership messages carry it: each mesh is a new one.
    pub fn incarnation(&self) -> Incarnation {
        self.inner.incarnation
    }

    /// The address peers dial.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// The latest generation formed (or tried) here (0 before the first).
    pub fn generation(&self) -> u64 {
        self.inner.lock().membership.generation
    }

    /// The generation a group of generation `after` on this mesh changes to
    /// ([`Membership::next_generation`]).
    pub(super) fn next_generation(&self, after: u64) -> u64 {
        self.inner.lock().membership.next_generation(after)
    }

    /// How a starting process enters the job (see the module doc): asks each of `peers` (the
    /// other members it knows of) whether it formed a group, telling where this mesh listens
    /// (`own`). [`Entry::Join`] as soon as one did (a live job: this process is to be
    /// admitted, [`Mesh::join_live`]); [`Entry::Start`] once every peer answered that it did
    /// not, or after `within` (a peer not answering yet is taken to be starting too: forming
    /// generation 1 waits for it). From an [`Entry::Join`] on this mesh waits to be admitted: its
    /// `Enter` made it a pending joiner at the leader, whose `Admit` may come before
    /// [`Mesh::join_live`] begins, and is kept for it.
    ///
    /// Whom to ask when, and what the answers decide, is `entry::EnterRound`'s, which the
    /// member machine that the membership simulator drives follows alike; this carries out its
    /// asks as requests (one at a time per peer, each bounded by the round).
    pub async fn enter(&self, own: SocketAddr, peers: &[GroupMember], within: Duration) -> Entry {
        let peers = self.others(peers);
        self.hear_from(&peers);
        let nodes = peers.iter().map(|p| p.node.clone()).collect();
        let mut round = entry::EnterRound::new(nodes, Instant::now().into_std(), within);
        let deadline = Instant::from_std(round.deadline());
        let mut asks = InFlight::default();
        loop {
            match round.poll(Instant::now().into_std()) {
                entry::EnterPoll::NoLiveGroup => return Entry::Start,
                entry::EnterPoll::Ask(nodes) => {
                    for peer in peers.iter().filter(|p| nodes.contains(&p.node)) {
                        asks.ask(peer, self.ask_enter(peer, own, deadline));
                    }
                }
                entry::EnterPoll::Wait => {}
            }
            let Some(asked) = asks.next_until(Instant::from_std(round.wake_at())).await else {
                continue;
            };
            match asked.answer {
                Some((_, formed)) if round.answered(&asked.peer, formed) => {
                    self.inner.lock().membership.joining = true;
                    return Entry::Join;
                }
                Some(_) => {}
                None => round.undelivered(Instant::now().into_std()),
            }
        }
    }

    /// Waits, at most `within`, to be admitted to the live group: tells every one of `peers`
    /// that this process asks to join (again each [`ENTER_REPEAT`]: their pending entries
    /// expire), and forms the generation that the leader's `Admit` names with the members it names.
    /// Meanwhile this mesh answers probes as no survivor of any group. Fails with
    /// [`CollectiveError::Form`] if no admission was formed in time, or at once when every
    /// one of `peers` answers that it has no live group (every worker lost its group: they
    /// start again, forming generation 1, [`Mesh::enter`]).
    ///
    /// What is due when is `entry::JoinWait`'s, which the member machine follows alike.
    pub async fn join_live(
        &self,
        own: SocketAddr,
        peers: &[GroupMember],
        within: Duration,
    ) -> Result<ProcessGroup, CollectiveError> {
        let peers = self.others(peers);
        self.hear_from(&peers);
        self.inner.lock().membership.joining = true;
        let mut wait = entry::JoinWait::new(peers.len(), Instant::now().into_std(), within);
        let joined = self.wait_to_join(own, &peers, &mut wait, within).await;
        let mut state = self.inner.lock();
        state.membership.joining = false;
        state.membership.admission = None;
        joined
    }

    /// The body of [`Mesh::join_live`]: carries out what `wait` says is due.
    async fn wait_to_join(
        &self,
        own: SocketAddr,
        peers: &[GroupMember],
        wait: &mut entry::JoinWait,
        within: Duration,
    ) -> Result<ProcessGroup, CollectiveError> {
        let mut last = String::from("no member admitted it");
        let mut asks = InFlight::default();
        loop {
            // Armed before the admission is looked at, so that one arriving in between wakes it.
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let admitted = self.inner.lock().membership.admission.is_some();
            match wait.poll(Instant::now().into_std(), admitted) {
                entry::JoinPoll::NoLiveGroup => {
                    return Err(CollectiveError::Form {
                        generation: self.generation(),
                        reason: "no member has a live group to admit this process: every one \
                                 answered that it has none (the job is starting again)"
                            .into(),
                    })
                }
                entry::JoinPoll::TimedOut => {
                    return Err(CollectiveError::Form {
                        generation: self.generation(),
                        reason: format!(
                            "not admitted to the live group within {within:?} (the members \
                             admit a joiner at a step boundary): {last}"
                        ),
                    })
                }
                entry::JoinPoll::Form => {
                    let admission = self.inner.lock().membership.admission.take();
                    let Some((generation, members)) = admission else {
                        continue;
                    };
                    match self.form(generation, members).await {
                        Ok(group) => return Ok(group),
                        Err(err) => {
                            last = format!("forming the admitted generation {generation}: {err}");
                            wait.again(Instant::now().into_std());
                        }
                    }
                    continue;
                }
                entry::JoinPoll::Ask => {
                    // Each ask ends by the next one, which replaces what is left of it.
                    let by = Instant::from_std(wait.wake_at());
                    asks = InFlight::default();
                    for peer in peers {
                        asks.ask(peer, self.ask_enter(peer, own, by));
                    }
                }
                entry::JoinPoll::Wait => {}
            }
            let wake = Instant::from_std(wait.wake_at());
            tokio::select! {
                asked = asks.next_until(wake) => {
                    if let Some(asked) = asked {
                        if let Some((_, formed)) = asked.answer {
                            wait.answered(&asked.peer, formed);
                        }
                    }
                }
                () = &mut changed => {}
            }
        }
    }

    /// `peers` without this mesh's own node.
    fn others(&self, peers: &[GroupMember]) -> Vec<GroupMember> {
        let me = self.node();
        peers.iter().filter(|p| p.node != *me).cloned().collect()
    }

    /// This process asks `peers` to enter: until each answered, it answers probes as no
    /// survivor that cannot tell how far its node's old process went
    /// ([`Membership::no_survivor`]).
    fn hear_from(&self, peers: &[GroupMember]) {
        let others = peers.iter().map(|p| p.node.clone());
        self.inner.lock().membership.hear_from(others.collect());
    }

    /// One `Enter` to `peer` by `deadline`: its latest generation and whether it formed a group of
    /// it, or `None` if it did not answer.
    pub(super) async fn ask_enter(
        &self,
        peer: &GroupMember,
        own: SocketAddr,
        deadline: Instant,
    ) -> Option<(u64, bool)> {
        let header_max = self.inner.endpoint.config().frame_bytes_max;
        let enter = Wire::Enter {
            addr: own.to_string(),
            incarnation: self.inner.incarnation,
        };
        let frame = Frame::encode(&enter, Vec::new(), header_max).ok()?;
        let asked = async {
            let conn = self
                .dial(peer, self.generation(), deadline, false)
                .await
                .ok()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = conn
                .request_within(frame, left.max(Duration::from_millis(1)))
                .await
                .ok()?;
            match reply.decode::<Reply>(header_max) {
                Ok(Reply::Entered {
                    generation,
                    formed,
                    member_of,
                }) => {
                    self.inner
                        .lock()
                        .membership
                        .heard_from(&peer.node, member_of);
                    Some((generation, formed))
                }
                _ => None,
            }
        };
        tokio::time::timeout_at(deadline, asked)
            .await
            .ok()
            .flatten()
    }

    /// Forgets a first forming that failed, where no group was ever formed here and this mesh
    /// does not wait to be admitted, so that [`Mesh::form`] can form generation 1 again: a fresh
    /// start refused by members still waiting to be admitted to a group that is gone (their
    /// processes entered while it lived) is tried again once they see that no one has a live
    /// group and start too. Meanwhile this mesh answers that it has none, and holds their
    /// joins of generation 1 for its next forming. Returns whether it forgot; `false` (nothing
    /// changed) where a group of this mesh was formed, lives, or it waits to be admitted.
    pub fn forget_failed_start(&self) -> bool {
        let mut state = self.inner.lock();
        if state.group.upgrade().is_some() {
            return false;
        }
        state.membership.forget_failed_start()
    }
}
