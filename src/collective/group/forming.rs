//! Forming a group of a generation ([`Mesh::form`]): one link per pair of members (the larger
//! node id dials and joins, the other waits for its join), probes of the survivors, and the
//! leader telling an admitted joiner its generation.

use super::machine::linking::{FormLink, LinkDue, StillHeard};
use super::*;

/// How a forming that began here ended ([`Mesh::try_form`]).
pub(super) enum Attempt {
    /// Every link is up: the group trains.
    Formed(ProcessGroup),
    /// A link failed, or the forming was broken meanwhile: the group of that generation, broken
    /// by the error (its calls fail at once), and the error.
    Failed(ProcessGroup, CollectiveError),
}

/// A forming that failed ([`Mesh::form_attempt`]): the error, and the group of that
/// generation where the forming had begun (broken by the error), which another member may have
/// formed all the same (its links all up while this member's were not).
pub(crate) struct FormFailed {
    pub(crate) attempted: Option<ProcessGroup>,
    pub(crate) error: CollectiveError,
}

/// What one delivery of a join came to ([`Mesh::send_join`]).
enum Delivered {
    /// The peer answered, over this connection.
    Answered(Connection, Frame),
    /// No connection could be made now.
    Unreachable(ConnectError),
}

/// What one attempt at a connection came to ([`Mesh::connect_once`]).
enum Dialed {
    Up(Connection),
    Unreachable(ConnectError),
}

impl Mesh {
    /// Forms the group of `generation` with `members` (this node among them); see the module doc.
    /// `generation` must be above every generation formed here before (start at 1); forming it
    /// supersedes the previous group of this node. Fails within `form_timeout` if a member
    /// does not form the same generation with the same members. Returns the group already broken
    /// where a member that formed it with this process saw it fail before this process's
    /// links were all up (another member was lost meanwhile: that member's abort, or its
    /// probe as it re-forms, says so): every call fails at once, and this member re-forms
    /// with the survivors as after any failed call ([`ProcessGroup::reachable`],
    /// [`ProcessGroup::reform`]). A joiner's admission failing so is an error: it asks again.
    pub async fn form(
        &self,
        generation: u64,
        members: Vec<GroupMember>,
    ) -> Result<ProcessGroup, CollectiveError> {
        self.form_attempt(generation, members)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`Mesh::form`], with the group of the generation where a forming that failed had begun
    /// ([`FormFailed::attempted`]).
    pub(crate) async fn form_attempt(
        &self,
        generation: u64,
        members: Vec<GroupMember>,
    ) -> Result<ProcessGroup, FormFailed> {
        let refused = |error| FormFailed {
            attempted: None,
            error,
        };
        match self.try_form(generation, members).await.map_err(refused)? {
            Attempt::Formed(group) => Ok(group),
            Attempt::Failed(group, _) if group.shared.lock().cut_short => {
                tracing::info!(
                    generation,
                    "the first forming was cut short: this member re-forms with the others"
                );
                Ok(group)
            }
            Attempt::Failed(group, error) => Err(FormFailed {
                attempted: Some(group),
                error,
            }),
        }
    }

    /// [`Mesh::form`], telling a forming that failed once it had begun (its group, broken
    /// by the error, superseding this node's previous one) from one refused before it began.
    pub(super) async fn try_form(
        &self,
        generation: u64,
        members: Vec<GroupMember>,
    ) -> Result<Attempt, CollectiveError> {
        let form_error = |reason: String| CollectiveError::Form { generation, reason };
        let mut members = members;
        members.sort_by(|a, b| a.node.cmp(&b.node));
        if let Some(w) = members.windows(2).find(|w| w[0].node == w[1].node) {
            return Err(form_error(format!("{} is listed twice", w[0].node)));
        }
        let me = self.node().clone();
        let Some(rank) = members.iter().position(|m| m.node == me) else {
            return Err(form_error(format!(
                "this node {me} is not among the members"
            )));
        };
        if self.inner.config.plaintext {
            self.inner.plain_listener().await.map_err(|e| {
                form_error(format!("cannot listen for the plaintext data plane: {e}"))
            })?;
        }
        let shared = {
            let mut state = self.inner.lock();
            if let Err(latest) = state.membership.begin_forming(generation) {
                return Err(form_error(format!(
                    "generation {generation} is not above the generation {latest} already formed here"
                )));
            }
            let shared = Arc::new(Shared::new(
                generation,
                rank,
                &members,
                self.inner.config.clone(),
                self.inner.endpoint.config().frame_bytes_max,
            ));
            // Joins of an earlier generation whose forming failed here can no longer be taken.
            state.joined.retain(|(_, e), _| *e >= generation);
            state.plain_joined.retain(|(_, e), _| *e >= generation);
            let old = std::mem::replace(&mut state.group, Arc::downgrade(&shared));
            drop(state);
            if let Some(old) = old.upgrade() {
                old.fail(
                    CollectiveError::Superseded {
                        generation: old.generation,
                        current: generation,
                    },
                    false,
                );
            }
            self.inner.changed.notify_waiters();
            shared
        };
        let deadline = Instant::now() + self.inner.config.form_timeout;
        // The first link that fails fails the forming: the others' attempts (a dial of a
        // stopped member, a join its peer holds) are dropped, not waited for.
        let links = futures::future::try_join_all(
            members
                .iter()
                .enumerate()
                .filter(|(r, _)| *r != rank)
                .map(|(_, m)| self.link(&shared, m, deadline)),
        );
        // The forming ends when it breaks meanwhile (a probe cut it short, or told this
        // process it is a new one), not when its last link gives up.
        let links = tokio::select! {
            links = links => links,
            err = shared.until_broken() => Err(err),
        };
        let conns = match links {
            Ok(conns) => conns,
            Err(err) => {
                let err = shared.fail(err, false);
                let group = ProcessGroup {
                    shared,
                    mesh: self.clone(),
                };
                return Ok(Attempt::Failed(group, err));
            }
        };
        shared.start_links(&shared, conns);
        self.inner.lock().membership.formed(generation);
        tracing::debug!(generation, rank, members = ?shared.nodes, "formed a group");
        Ok(Attempt::Formed(ProcessGroup {
            shared,
            mesh: self.clone(),
        }))
    }

    /// One link of a group being formed (see [`Mesh::link_once`]), recorded once it is up:
    /// another process of that peer is then refused in this generation (it is a new incarnation,
    /// to enter and be admitted).
    pub(super) async fn link(
        &self,
        shared: &Arc<Shared>,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>), CollectiveError> {
        let (conn, plain, incarnation) = self.link_once(shared, peer, deadline).await?;
        self.inner
            .lock()
            .membership
            .linked_with(&peer.node, shared.generation, incarnation);
        Ok((conn, plain))
    }

    /// Dials and joins (larger node id) or waits for the peer's join (smaller node id),
    /// within `deadline`; the link, and which process of the peer is at its other end.
    pub(super) async fn link_once(
        &self,
        shared: &Arc<Shared>,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>, Incarnation), CollectiveError> {
        let generation = shared.generation;
        let form_error = |reason: String| CollectiveError::Form { generation, reason };
        if !linking::dials(self.node(), &peer.node) {
            return self.wait_for_join(shared, peer, deadline).await;
        }
        let plaintext = self.inner.config.plaintext;
        let mismatch = |theirs: &str| {
            form_error(format!(
                "{} uses the {theirs} data plane, this member the {} one: every member must \
                 choose alike (GroupConfig::plaintext)",
                peer.node,
                if plaintext { "plaintext" } else { "QUIC" }
            ))
        };
        let by_admission = self.inner.lock().membership.joins_by_admission(generation);
        let join = Wire::Join {
            generation,
            members: shared.nodes.clone(),
            plaintext,
            by_admission,
            incarnation: self.inner.incarnation,
        };
        let frame = Frame::encode(&join, Vec::new(), shared.header_max)
            .map_err(|e| form_error(format!("encoding the join: {e}")))?;
        let (conn, reply) = self
            .join_until_delivered(peer, generation, frame, deadline)
            .await?;
        match reply.decode::<Reply>(shared.header_max) {
            Ok(Reply::Joined {
                incarnation,
                plain: None,
            }) if !plaintext => Ok((conn, None, incarnation)),
            Ok(Reply::Joined { plain: None, .. }) => Err(mismatch("QUIC")),
            Ok(Reply::Joined { plain: Some(_), .. }) if !plaintext => Err(mismatch("plaintext")),
            Ok(Reply::Joined {
                incarnation,
                plain: Some(PlainLink { port, token }),
            }) => {
                let addr = SocketAddr::new(peer.addr.ip(), port);
                let stream = crate::collective::plain::dial(addr, token, generation, deadline)
                    .await
                    .map_err(|e| {
                        form_error(format!("the TCP link to {} at {addr}: {e}", peer.node))
                    })?;
                Ok((conn, Some(stream), incarnation))
            }
            Ok(Reply::Refused { current, detail }) => Err(CollectiveError::GenerationRefused {
                node: peer.node.clone(),
                generation,
                current,
                detail,
            }),
            Ok(Reply::Broken(err)) => Err(err),
            Ok(
                other @ (Reply::Ack | Reply::Joining | Reply::Unsettled | Reply::Entered { .. }),
            ) => Err(form_error(format!(
                "{} answered the join with {other:?}",
                peer.node
            ))),
            Err(e) => Err(form_error(format!(
                "{}'s answer to the join: {e}",
                peer.node
            ))),
        }
    }

    /// Sends this member's join (`frame`) to `peer` until it is delivered, on the course of a
    /// [`FormLink`] (again [`DIAL_RETRY`] after a dial that failed, until `deadline`, or until
    /// the peer is taken for lost while re-forming): the connection and the peer's answer.
    async fn join_until_delivered(
        &self,
        peer: &GroupMember,
        generation: u64,
        frame: Frame,
        deadline: Instant,
    ) -> Result<(Connection, Frame), CollectiveError> {
        let form_error = |reason: String| CollectiveError::Form { generation, reason };
        let detection = self.inner.endpoint.config().idle_timeout;
        let mut link = FormLink::new(self.node(), &peer.node, Instant::now().into_std());
        let mut unreachable: Option<ConnectError> = None;
        let because =
            |e: &Option<ConnectError>| e.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
        loop {
            let now = Instant::now();
            match link.due(now.into_std(), generation, detection) {
                Some(LinkDue::Lost(bound)) => {
                    return Err(form_error(format!(
                        "{} at {} not reachable for {} while re-forming (lost meanwhile){}",
                        peer.node,
                        peer.addr,
                        crate::cluster::format_duration(bound),
                        because(&unreachable),
                    )))
                }
                Some(LinkDue::Join) => {
                    match self.send_join(peer, generation, &frame, deadline).await? {
                        Delivered::Answered(conn, reply) => return Ok((conn, reply)),
                        Delivered::Unreachable(e) => {
                            link.undelivered(now.into_std(), Instant::now().into_std());
                            unreachable = Some(e);
                        }
                    }
                }
                Some(LinkDue::AskStillForming) | None => {}
            }
            let wake = link.wake_at().map_or(deadline, Instant::from_std);
            if wake >= deadline {
                return Err(form_error(format!(
                    "{} at {} not reachable within the form timeout{}",
                    peer.node,
                    peer.addr,
                    because(&unreachable),
                )));
            }
            tokio::time::sleep_until(wake).await;
        }
    }

    /// One delivery of this member's join (`frame`) to `peer`: its answer, or the dial that
    /// failed (to try again). A kept connection that died unnoticed (this process was stopped
    /// past the idle timeout) is replaced by a new one at once.
    async fn send_join(
        &self,
        peer: &GroupMember,
        generation: u64,
        frame: &Frame,
        deadline: Instant,
    ) -> Result<Delivered, CollectiveError> {
        let mut fresh = false;
        loop {
            let conn = match self.connect_once(peer, generation, fresh).await? {
                Dialed::Up(conn) => conn,
                Dialed::Unreachable(e) => return Ok(Delivered::Unreachable(e)),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match conn
                .request_within(frame.clone(), left.max(Duration::from_millis(1)))
                .await
            {
                Ok(reply) => return Ok(Delivered::Answered(conn, reply)),
                Err(LinkError::ConnectionLost { .. }) if !fresh => fresh = true,
                Err(e) => {
                    return Err(CollectiveError::Form {
                        generation,
                        reason: format!("joining {}: {e}", peer.node),
                    })
                }
            }
        }
    }

    /// A live connection to `peer` (see [`Mesh::connect_once`]), dialed again each
    /// [`DIAL_RETRY`] until `deadline` (the peer's process may not be listening yet) or until
    /// the peer is taken for lost while re-forming.
    pub(super) async fn dial(
        &self,
        peer: &GroupMember,
        generation: u64,
        deadline: Instant,
        fresh: bool,
    ) -> Result<Connection, CollectiveError> {
        let mut unreachable_since: Option<Instant> = None;
        loop {
            // Unreachable since the first failed attempt began (it may take the connect
            // timeout to fail).
            let attempt_began = Instant::now();
            let e = match self.connect_once(peer, generation, fresh).await? {
                Dialed::Up(conn) => return Ok(conn),
                Dialed::Unreachable(e) => e,
            };
            let now = Instant::now();
            if now + DIAL_RETRY >= deadline {
                return Err(CollectiveError::Form {
                    generation,
                    reason: format!(
                        "{} at {} not reachable within the form timeout: {e}",
                        peer.node, peer.addr
                    ),
                });
            }
            let since = *unreachable_since.get_or_insert(attempt_began);
            if let Some(bound) = self.lost_while_re_forming(generation, since, now) {
                return Err(CollectiveError::Form {
                    generation,
                    reason: format!(
                        "{} at {} not reachable for {bound} while re-forming (lost meanwhile): {e}",
                        peer.node, peer.addr,
                    ),
                });
            }
            tokio::time::sleep(DIAL_RETRY).await;
        }
    }

    /// One attempt at a connection to `peer`: the mesh's own if it still lives (and not
    /// `fresh`), else a new one. A refusal that no retry mends (a certificate, an identity, a
    /// protocol version) is the error that fails `generation`'s forming.
    async fn connect_once(
        &self,
        peer: &GroupMember,
        generation: u64,
        fresh: bool,
    ) -> Result<Dialed, CollectiveError> {
        if !fresh {
            if let Some(conn) = self.inner.lock().conns.get(&peer.node) {
                if conn.close_reason().is_none() {
                    return Ok(Dialed::Up(conn.clone()));
                }
            }
        }
        match self.inner.endpoint.connect(peer.addr, &peer.node).await {
            Ok(conn) => {
                self.inner.adopt(conn.clone());
                Ok(Dialed::Up(conn))
            }
            Err(
                e @ (ConnectError::CertificateRejected { .. }
                | ConnectError::UnexpectedPeer { .. }
                | ConnectError::IdentityMismatch { .. }
                | ConnectError::ProtocolVersionMismatch { .. }),
            ) => Err(CollectiveError::Form {
                generation,
                reason: format!("dialing {} at {}: {e}", peer.node, peer.addr),
            }),
            Err(e) => Ok(Dialed::Unreachable(e)),
        }
    }

    /// One probe of `peer` by `deadline` (see [`ProcessGroup::probe_members`]): its answer
    /// (alive, a new process waiting to be admitted, or no survivor that cannot tell yet), `None`
    /// where it could not be delivered or got no answer, or its refusal where it re-formed a
    /// later generation without us.
    pub(super) async fn probe(
        &self,
        peer: &GroupMember,
        generation: u64,
        deadline: Instant,
    ) -> Result<Option<reforming::ProbeReply>, CollectiveError> {
        use reforming::ProbeReply;
        let header_max = self.inner.endpoint.config().frame_bytes_max;
        let Ok(frame) = Frame::encode(&Wire::Probe { generation }, Vec::new(), header_max) else {
            return Ok(None);
        };
        let mut fresh = false;
        loop {
            let Ok(conn) = self.dial(peer, generation, deadline, fresh).await else {
                return Ok(None);
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match conn
                .request_within(frame.clone(), left.max(Duration::from_millis(1)))
                .await
            {
                Ok(reply) => {
                    return match reply.decode::<Reply>(header_max) {
                        Ok(Reply::Ack) => Ok(Some(ProbeReply::Alive)),
                        Ok(Reply::Joining) => Ok(Some(ProbeReply::Joining)),
                        // No survivor, but not to be left out of the count either.
                        Ok(Reply::Unsettled) => Ok(Some(ProbeReply::Unsettled)),
                        Ok(Reply::Refused { current, detail }) => {
                            Err(CollectiveError::GenerationRefused {
                                node: peer.node.clone(),
                                generation,
                                current,
                                detail,
                            })
                        }
                        _ => Ok(None),
                    };
                }
                // The kept connection may be the dead one of the lost member's old process, or
                // a live member's that died unnoticed: dial once more.
                Err(LinkError::ConnectionLost { .. }) if !fresh => fresh = true,
                Err(_) => return Ok(None),
            }
        }
    }

    /// Tells `joiner` once it is admitted to form `generation` with `members`, by `deadline`
    /// (see [`ProcessGroup::admit`]): whether it acked (`Some(false)`: it refused), or `None`
    /// where the telling could not be delivered (no connection, or the one used died: the
    /// round tells it again over a new one while the joiner is not lost).
    pub(super) async fn tell_admitted(
        &self,
        joiner: &GroupMember,
        generation: u64,
        members: &[GroupMember],
        deadline: Instant,
    ) -> Option<bool> {
        let header_max = self.inner.endpoint.config().frame_bytes_max;
        let admit = Wire::Admit {
            generation,
            members: members
                .iter()
                .map(|m| (m.node.clone(), m.addr.to_string()))
                .collect(),
        };
        let Ok(frame) = Frame::encode(&admit, Vec::new(), header_max) else {
            return Some(false);
        };
        let told = async {
            let conn = self.dial(joiner, generation, deadline, false).await.ok()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = conn
                .request_within(frame, left.max(Duration::from_millis(1)))
                .await
                .ok()?;
            Some(match reply.decode::<Reply>(header_max) {
                Ok(Reply::Ack) => true,
                Ok(other) => {
                    tracing::warn!(joiner = %joiner.node, ?other, "a joiner refused its admission");
                    false
                }
                Err(_) => false,
            })
        };
        tokio::time::timeout_at(deadline, told).await.ok().flatten()
    }

    /// Takes `generation` as tried here without forming it (the members agreed to skip it): a join
    /// of it, or a question whether this mesh still forms it, is refused from now on.
    pub(super) fn skip_generation(&self, generation: u64) {
        self.inner.lock().membership.skip(generation);
        self.inner.changed.notify_waiters();
    }

    pub(super) async fn wait_for_join(
        &self,
        shared: &Shared,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>, Incarnation), CollectiveError> {
        let generation = shared.generation;
        let key = (peer.node.clone(), generation);
        let detection = self.inner.endpoint.config().idle_timeout;
        let mut link = FormLink::new(self.node(), &peer.node, Instant::now().into_std());
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.inner.lock();
                // The plaintext plane's link is ready once its TCP connection said hello too.
                let ready = state.joined.contains_key(&key)
                    && (!self.inner.config.plaintext || state.plain_joined.contains_key(&key));
                if ready {
                    if let Some((conn, _, incarnation)) = state.joined.remove(&key) {
                        return Ok((conn, state.plain_joined.remove(&key), incarnation));
                    }
                }
                if let Some(reason) = state.refused_joins.remove(&key) {
                    return Err(CollectiveError::Form { generation, reason });
                }
                // The forming failed meanwhile (a probe said the others formed without us).
                if let Some(err) = shared.lock().broken.clone() {
                    return Err(err);
                }
                if state.membership.generation != generation {
                    return Err(CollectiveError::Superseded {
                        generation,
                        current: state.membership.generation,
                    });
                }
            }
            let wake = link.wake_at().map_or(deadline, Instant::from_std);
            if tokio::time::timeout_at(wake.min(deadline), changed)
                .await
                .is_ok()
            {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Form {
                    generation,
                    reason: format!("{} did not join within the form timeout", peer.node),
                });
            }
            // A join that has not come yet may never come: the peer formed this generation with
            // other members (its view of the survivors differs, and it did not list this
            // member), gave it up, or was lost. Ask, rather than wait out the form timeout.
            match link.due(now.into_std(), generation, detection) {
                Some(LinkDue::AskStillForming) => {
                    if self.ask_still_forming(shared, peer).await? {
                        link.heard_still_forming();
                    }
                }
                Some(LinkDue::Lost(bound)) => {
                    return Err(CollectiveError::Form {
                        generation,
                        reason: format!(
                            "{} did not answer for {} while re-forming (lost meanwhile)",
                            peer.node,
                            crate::cluster::format_duration(bound)
                        ),
                    });
                }
                Some(LinkDue::Join) | None => {}
            }
        }
    }

    /// Whether `peer`, whose join this member awaits, still forms its generation with the same
    /// members (`Ok(true)`), or did not answer in time (`Ok(false)`); its refusal, or its
    /// failed forming, as the error that fails this forming.
    pub(super) async fn ask_still_forming(
        &self,
        shared: &Shared,
        peer: &GroupMember,
    ) -> Result<bool, CollectiveError> {
        let generation = shared.generation;
        let ask = Wire::StillForming {
            generation,
            members: shared.nodes.clone(),
        };
        let Ok(frame) = Frame::encode(&ask, Vec::new(), shared.header_max) else {
            return Ok(false);
        };
        let by = Instant::now() + STILL_FORMING_EVERY;
        let asked = async {
            let conn = self.dial(peer, generation, by, false).await.ok()?;
            conn.request_within(frame, STILL_FORMING_EVERY).await.ok()
        };
        let Some(reply) = tokio::time::timeout_at(by, asked).await.ok().flatten() else {
            return Ok(false);
        };
        let Ok(reply) = reply.decode::<Reply>(shared.header_max) else {
            return Ok(false);
        };
        let heard = match &reply {
            Reply::Refused { .. } => StillHeard::Refused,
            Reply::Broken(_) => StillHeard::Broken,
            _ => StillHeard::Forms,
        };
        if !linking::ends_forming(generation, heard) {
            return Ok(true);
        }
        let reason = match reply {
            Reply::Refused { current, detail } => {
                return Err(CollectiveError::GenerationRefused {
                    node: peer.node.clone(),
                    generation,
                    current,
                    detail,
                })
            }
            Reply::Broken(err) => format!("{}'s forming of it failed: {err}", peer.node),
            // Not reached: only a refusal or a broken forming ends it.
            other => format!("{} answered {other:?}", peer.node),
        };
        Err(CollectiveError::Form { generation, reason })
    }

    /// Whether a peer unreachable `since` is taken for lost `now` while this mesh forms
    /// `generation` ([`linking::lost_while_re_forming`], on the transport's idle timeout): the
    /// bound it passed (as text), if so.
    pub(super) fn lost_while_re_forming(
        &self,
        generation: u64,
        since: Instant,
        now: Instant,
    ) -> Option<String> {
        let detection = self.inner.endpoint.config().idle_timeout;
        linking::lost_while_re_forming(generation, since.into_std(), now.into_std(), detection)
            .map(crate::cluster::format_duration)
    }
}
