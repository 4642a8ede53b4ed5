//! The mesh's side of every link: its state (the latest generation, the links, the pending joiners,
//! which process of each peer it formed with), accepting connections, and routing each
//! incoming message to the group of its generation or to the answer it asks for (`answers.rs`).

use super::*;

pub(super) struct MeshInner {
    pub(super) endpoint: Endpoint,
    /// This process, as its `Enter` and `Join` name it.
    pub(super) incarnation: Incarnation,
    pub(super) config: GroupConfig,
    pub(super) state: Mutex<MeshState>,
    /// Signalled when a generation is formed here or a peer joins one.
    pub(super) changed: Notify,
    pub(super) acceptor: OnceLock<JoinHandle<()>>,
    /// Plaintext plane: the port of this mesh's TCP listener and its accept loop, once bound.
    pub(super) plain: tokio::sync::OnceCell<(u16, JoinHandle<()>)>,
}

#[derive(Default)]
pub(super) struct MeshState {
    /// What this mesh knows of who is in its group, and the answers that follow from it.
    pub(super) membership: Membership,
    /// Its group, while someone holds it.
    pub(super) group: Weak<Shared>,
    /// The latest connection with each peer, dialed or accepted.
    pub(super) conns: HashMap<NodeId, Connection>,
    /// Links of the forming generation whose dialer's join arrived, until `form` takes them.
    /// Each with when its join arrived: of two processes of one peer joining the same
    /// generation (its old one, killed while the job started, and its restart), the later wins.
    pub(super) joined: HashMap<(NodeId, u64), (Connection, Instant, Incarnation)>,
    pub(super) readers: Vec<JoinHandle<()>>,
    /// Plaintext plane: tokens this mesh issued in its answers to joins, by token: the
    /// peer and generation each one is for (each taken once).
    pub(super) plain_tokens: HashMap<crate::collective::plain::Token, (NodeId, u64)>,
    /// Plaintext plane: TCP links whose hello arrived, until `form` takes them.
    pub(super) plain_joined: HashMap<(NodeId, u64), TcpStream>,
    /// Joins refused for a reason that fails the forming here too (the data planes differ).
    pub(super) refused_joins: HashMap<(NodeId, u64), String>,
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
    /// token this mesh issued becomes that peer's link of that generation; any other is closed.
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
                            let Some((token, generation)) = hello else {
                                tracing::warn!(%from, "closed a plaintext-plane connection that sent no hello");
                                return;
                            };
                            let _ = stream.set_nodelay(true);
                            let mut state = mesh.lock();
                            match state.plain_tokens.remove(&token) {
                                Some((peer, issued)) if issued == generation => {
                                    state.plain_joined.insert((peer, generation), stream);
                                    drop(state);
                                    mesh.changed.notify_waiters();
                                }
                                _ => tracing::warn!(%from, generation, "closed a plaintext-plane connection whose token this member did not issue for that generation"),
                            }
                        });
                    }
                });
                Ok::<_, std::io::Error>((port, acceptor))
            })
            .await?;
        Ok(bound.0)
    }

    /// Serves what `conn`'s peer sends, for every generation, until the connection ends.
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

    /// Longer than most functions here on purpose: one arm per collective wire message, each
    /// what the acceptor does with it, so that every message a mesh takes reads in one place.
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
                generation,
                members,
                plaintext,
                by_admission,
                incarnation,
            } => {
                let mesh = self.clone();
                let conn = conn.clone();
                tokio::spawn(async move {
                    let reply = mesh
                        .join(
                            &conn,
                            generation,
                            members,
                            plaintext,
                            by_admission,
                            incarnation,
                        )
                        .await;
                    tracing::debug!(peer = %conn.peer(), generation, ?reply, "answered a join");
                    respond(responder, reply, header_max);
                });
            }
            Wire::Data {
                generation,
                seq,
                tag,
                call,
            } => {
                let group = self.lock().group.upgrade();
                match group {
                    Some(group) if group.generation == generation => {
                        let blob = frame.blobs.into_iter().next().unwrap_or_default();
                        group.deliver(&peer, seq, tag, call, blob, responder);
                    }
                    // EPOCH-1: a message of another generation is never delivered.
                    _ => respond(responder, self.refusal(generation), header_max),
                }
            }
            Wire::Probe { generation } => {
                let reply = self.probed(&peer, generation);
                tracing::debug!(%peer, generation, ?reply, "answered a probe");
                respond(responder, reply, header_max)
            }
            Wire::Enter { addr, incarnation } => {
                let reply = self.entered(&peer, &addr, incarnation);
                tracing::debug!(%peer, ?reply, "answered an enter");
                respond(responder, reply, header_max)
            }
            Wire::Admit {
                generation,
                members,
            } => {
                let reply = self.admitted(generation, members);
                respond(responder, reply, header_max)
            }
            Wire::StillForming {
                generation,
                members,
            } => {
                let reply = self.still_forming(generation, &members);
                respond(responder, reply, header_max);
            }
            Wire::Abort { generation, error } => {
                let (group, joining) = {
                    let state = self.lock();
                    (state.group.upgrade(), state.membership.joining)
                };
                if let Some(group) =
                    group.filter(|g| g.generation == generation && g.nodes.contains(&peer))
                {
                    if group.is_formed() || joining {
                        // A joiner's admission failing leaves it a joiner: it asks again.
                        group.fail(error, false);
                        self.changed.notify_waiters();
                    } else {
                        // Only a formed group tells its failures: the aborter formed this
                        // generation with this process, which was still forming it.
                        self.cut_short(&group, error);
                    }
                }
                respond(responder, Reply::Ack, header_max);
            }
        }
    }
}
