//! The mesh's side of every link: its state (the latest epoch, the links, the pending joiners,
//! which process of each peer it formed with), accepting connections, and routing each
//! incoming message to the group of its epoch or to the answer it asks for (`answers.rs`).

use super::*;

pub(super) struct MeshInner {
    pub(super) endpoint: Endpoint,
    /// This process, as its `Enter` and `Join` name it.
    pub(super) incarnation: Incarnation,
    pub(super) config: GroupConfig,
    pub(super) state: Mutex<MeshState>,
    /// Signalled when an epoch is formed here or a peer joins one.
    pub(super) changed: Notify,
    pub(super) acceptor: OnceLock<JoinHandle<()>>,
    /// Plaintext plane: the port of this mesh's TCP listener and its accept loop, once bound.
    pub(super) plain: tokio::sync::OnceCell<(u16, JoinHandle<()>)>,
}

#[derive(Default)]
pub(super) struct MeshState {
    /// The latest epoch formed here.
    pub(super) epoch: u64,
    /// Its group, while someone holds it.
    pub(super) group: Weak<Shared>,
    /// The latest connection with each peer, dialed or accepted.
    pub(super) conns: HashMap<NodeId, Connection>,
    /// Links of the forming epoch whose dialer's join arrived, until `form` takes them.
    /// Each with when its join arrived: of two processes of one peer joining the same
    /// epoch (its old one, killed while the job started, and its restart), the later wins.
    pub(super) joined: HashMap<(NodeId, u64), (Connection, Instant, Incarnation)>,
    pub(super) readers: Vec<JoinHandle<()>>,
    /// Whether this process waits to be admitted to a live group ([`Mesh::join_live`]): it
    /// answers probes as no survivor.
    pub(super) joining: bool,
    /// Whether this process is a member the others know: a group formed here (all its links
    /// up), or a member that formed the first epoch with this process (their link up) is
    /// re-forming it, which cut this process's forming short ([`Mesh::form`]). A mesh that is
    /// no member answers probes as no survivor of any group.
    pub(super) member: bool,
    /// The peers whose link of the forming (or last formed) epoch is up, by epoch: a join
    /// or enter from another process of one of them is a new incarnation.
    pub(super) linked: std::collections::HashSet<(NodeId, u64)>,
    /// Processes that asked to be admitted (`Enter`), by node.
    pub(super) pending: HashMap<NodeId, Pending>,
    /// The process of each peer this mesh last linked with (its join, or its answer to ours)
    /// or admitted: an `Enter` from that process is one it sent before it formed the group
    /// with this mesh (stale); one from another process of a member is its restart.
    pub(super) processes: HashMap<NodeId, Incarnation>,
    /// The admission this joining mesh received and has not formed yet: epoch and members.
    pub(super) admission: Option<(u64, Vec<GroupMember>)>,
    /// The latest epoch a leader admitted this joining mesh to (its `Admit` acked): a join of
    /// a later one is refused ([`MeshInner::unadmitted`]).
    pub(super) admitted_epoch: u64,
    /// Plaintext plane: tokens this mesh issued in its answers to joins, by token: the
    /// peer and epoch each one is for (each taken once).
    pub(super) plain_tokens: HashMap<crate::collective::plain::Token, (NodeId, u64)>,
    /// Plaintext plane: TCP links whose hello arrived, until `form` takes them.
    pub(super) plain_joined: HashMap<(NodeId, u64), TcpStream>,
    /// Joins refused for a reason that fails the forming here too (the data planes differ).
    pub(super) refused_joins: HashMap<(NodeId, u64), String>,
}

/// A process that asked to be admitted ([`MeshState::pending`]).
pub(super) struct Pending {
    /// Where it listens.
    pub(super) addr: SocketAddr,
    /// Which process of its node asked.
    pub(super) incarnation: Incarnation,
    /// When it last asked.
    pub(super) asked: Instant,
}

impl Drop for MeshInner {
    fn drop(&mut self) {
        if let Some(acceptor) = self.acceptor.get() {
            acceptor.abort();
        }
        if let Some((_, acceptor)) = self.plain.get() {
            acceptor.abort();
        }
        for reader in &self.lock().readers {
            reader.abort();
        }
    }
}

impl MeshInner {
    pub(super) fn lock(&self) -> MutexGuard<'_, MeshState> {
        // Every update below is a single assignment or insertion; a poisoned lock is safe.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The port of this mesh's plaintext-plane listener, bound (beside the QUIC endpoint's
    /// address) and accepting on first use: each accepted connection that says a hello with a
    /// token this mesh issued becomes that peer's link of that epoch; any other is closed.
    pub(super) async fn plain_listener(self: &Arc<Self>) -> std::io::Result<u16> {
        let bound = self
            .plain
            .get_or_try_init(|| async {
                let ip = self.endpoint.local_addr()?.ip();
                let listener = crate::collective::plain::bind(ip).await?;
                let port = listener.local_addr()?.port();
                let weak = Arc::downgrade(self);
                let acceptor = tokio::spawn(async move {
                    while let Ok((mut stream, from)) = listener.accept().await {
                        let weak = weak.clone();
                        tokio::spawn(async move {
                            let hello = crate::collective::plain::read_hello(&mut stream).await;
                            let Some(mesh) = weak.upgrade() else { return };
                            let Some((token, epoch)) = hello else {
                                tracing::warn!(%from, "closed a plaintext-plane connection that sent no hello");
                                return;
                            };
                            let _ = stream.set_nodelay(true);
                            let mut state = mesh.lock();
                            match state.plain_tokens.remove(&token) {
                                Some((peer, issued)) if issued == epoch => {
                                    state.plain_joined.insert((peer, epoch), stream);
                                    drop(state);
                                    mesh.changed.notify_waiters();
                                }
                                _ => tracing::warn!(%from, epoch, "closed a plaintext-plane connection whose token this member did not issue for that epoch"),
                            }
                        });
                    }
                });
                Ok::<_, std::io::Error>((port, acceptor))
            })
            .await?;
        Ok(bound.0)
    }

    /// Serves what `conn`'s peer sends, for every epoch, until the connection ends.
    pub(super) fn adopt(self: &Arc<Self>, conn: Connection) {
        let weak = Arc::downgrade(self);
        let reader_conn = conn.clone();
        let reader = tokio::spawn(async move {
            while let Ok(incoming) = reader_conn.accept_incoming().await {
                let Some(mesh) = weak.upgrade() else { break };
                if let Incoming::Request { frame, responder } = incoming {
                    mesh.dispatch(&reader_conn, frame, responder);
                }
            }
        });
        let mut state = self.lock();
        state.readers.retain(|r| !r.is_finished());
        state.readers.push(reader);
        state.conns.insert(conn.peer().clone(), conn);
    }

    pub(super) fn dispatch(
        self: &Arc<Self>,
        conn: &Connection,
        frame: Frame,
        responder: Responder,
    ) {
        let header_max = self.endpoint.config().frame_bytes_max;
        let wire = match frame.decode::<Wire>(header_max) {
            Ok(wire) => wire,
            Err(error) => {
                tracing::warn!(peer = %conn.peer(), %error, "refused a collective message that does not decode");
                return responder.reject(RejectReason::Refused);
            }
        };
        let peer = conn.peer().clone();
        match wire {
            Wire::Join {
                epoch,
                members,
                plaintext,
                by_admission,
                incarnation,
            } => {
                let mesh = self.clone();
                let conn = conn.clone();
                tokio::spawn(async move {
                    let reply = mesh
                        .join(&conn, epoch, members, plaintext, by_admission, incarnation)
                        .await;
                    tracing::debug!(peer = %conn.peer(), epoch, ?reply, "answered a join");
                    respond(responder, reply, header_max);
                });
            }
            Wire::Data {
                epoch,
                seq,
                tag,
                call,
            } => {
                let group = self.lock().group.upgrade();
                match group {
                    Some(group) if group.epoch == epoch => {
                        let blob = frame.blobs.into_iter().next().unwrap_or_default();
                        group.deliver(&peer, seq, tag, call, blob, responder);
                    }
                    // EPOCH-1: a message of another epoch is never delivered.
                    _ => respond(responder, self.refusal(epoch), header_max),
                }
            }
            Wire::Probe { epoch } => {
                // A prober left out of a later live group learns it at once (it is the late
                // member: the others re-formed without it).
                let (joining, member, group, linked) = {
                    let state = self.lock();
                    let key = (peer.clone(), epoch);
                    // Its link with the prober of that epoch is up here (or the prober's join
                    // was taken and the forming has not picked it up yet).
                    let linked = state.linked.contains(&key) || state.joined.contains_key(&key);
                    (state.joining, state.member, state.group.upgrade(), linked)
                };
                let reply = match group {
                    // A joiner is no survivor: the others re-form without it, then admit it.
                    _ if joining => Reply::Joining,
                    // A mesh that is no member yet is forming the first epoch, which the
                    // prober formed (or was forming) and is re-forming: that forming can no
                    // longer complete, and it ends now.
                    group if !member => {
                        let forming = group.filter(|g| {
                            g.epoch <= epoch && !g.is_formed() && g.nodes.contains(&peer)
                        });
                        match forming {
                            // The prober linked with this very process: it is a member whose
                            // links were not all up when another member was lost. It survives,
                            // and re-forms with the others (`Mesh::form` gives it the group,
                            // broken by this).
                            Some(g) if g.epoch == epoch && linked => {
                                let err = CollectiveError::Form {
                                    epoch,
                                    reason: format!(
                                        "{peer} formed epoch {epoch} with this process and lost \
                                         a member before this process's links were all up: \
                                         re-form with the survivors"
                                    ),
                                };
                                if self.cut_short(&g, err) {
                                    Reply::Ack
                                } else {
                                    Reply::Joining
                                }
                            }
                            // Not linked with it: a new process of this node, whose old one
                            // the prober formed with (lost since). It is no survivor: it
                            // enters again as a joiner (`MultiWorkerMirrored::new`).
                            Some(g) => {
                                g.fail(
                                    CollectiveError::Form {
                                        epoch: g.epoch,
                                        reason: format!(
                                            "{peer} formed epoch {epoch} without this process \
                                             and is re-forming it: enter and be admitted"
                                        ),
                                    },
                                    false,
                                );
                                self.changed.notify_waiters();
                                Reply::Joining
                            }
                            None => Reply::Joining,
                        }
                    }
                    Some(g)
                        if g.epoch > epoch
                            && !g.nodes.contains(&peer)
                            && g.lock().broken.is_none() =>
                    {
                        Reply::Refused {
                            current: g.epoch,
                            detail: format!(" and re-formed without {peer}"),
                        }
                    }
                    _ => Reply::Ack,
                };
                tracing::debug!(%peer, epoch, ?reply, "answered a probe");
                respond(responder, reply, header_max)
            }
            Wire::Enter { addr, incarnation } => {
                let reply = self.entered(&peer, &addr, incarnation);
                tracing::debug!(%peer, ?reply, "answered an enter");
                respond(responder, reply, header_max)
            }
            Wire::Admit { epoch, members } => {
                let reply = self.admitted(epoch, members);
                respond(responder, reply, header_max)
            }
            Wire::StillForming { epoch, members } => {
                let reply = self.still_forming(epoch, &members);
                respond(responder, reply, header_max);
            }
            Wire::Abort { epoch, error } => {
                let (group, joining) = {
                    let state = self.lock();
                    (state.group.upgrade(), state.joining)
                };
                if let Some(group) = group.filter(|g| g.epoch == epoch && g.nodes.contains(&peer)) {
                    if group.is_formed() || joining {
                        // A joiner's admission failing leaves it a joiner: it asks again.
                        group.fail(error, false);
                        self.changed.notify_waiters();
                    } else {
                        // Only a formed group tells its failures: the aborter formed this
                        // epoch with this process, which was still forming it.
                        self.cut_short(&group, error);
                    }
                }
                respond(responder, Reply::Ack, header_max);
            }
        }
    }
}
