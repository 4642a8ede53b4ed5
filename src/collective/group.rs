//! The process group: collectives between processes over cohort's transport (QUIC, mutual
//! TLS).
//!
//! This module owns a node's collective endpoint ([`Mesh`]: it accepts the links of every
//! group the node forms and routes each message to the group of its epoch), the forming of a
//! group ([`Mesh::form`], [`ProcessGroup::reform`]), the per-link send windows and the inbox of
//! a group, and the failure rules below. The algorithms over these live in `ops.rs`.
//!
//! Calling protocol, per member:
//! 1. [`Mesh::new`] over an [`Endpoint`] of the node (its own port: collective traffic never
//!    queues behind the control plane); the mesh accepts connections from then on.
//! 2. [`Mesh::form`] with an epoch and the members (node and address); ranks follow the sorted
//!    node ids. Every member must form the same epoch with the same members; the member with
//!    the larger node id of each pair dials, the other accepts, and the link is ready once both
//!    formed that epoch (a `Join` carries it). A forming fails as soon as one link fails: an
//!    acceptor refusing a join whose list differs from its own fails too (the dialer forms
//!    that epoch with that list only), and an acceptor still waiting for a join asks the
//!    dialer every second whether it still forms the epoch with the same members
//!    (`StillForming`), failing on a refusal; in a re-forming (epoch > 1) a peer unreachable
//!    for twice the idle timeout fails it too. So views that differ, or a member lost while
//!    the others re-form, cost about the detection budget, not the form timeout.
//! 3. Call the operations (`ops.rs`) in the same order on every member; the `k`-th call of
//!    every member is one operation and must agree (operation, shape, dtype).
//! 4. On any error the group is broken for good: every pending and later call fails with the
//!    same error. Re-form with the survivors at the next epoch ([`ProcessGroup::reform`]),
//!    the survivors being the members that answer a probe ([`ProcessGroup::reachable`]).
//! 5. A group is superseded by the next epoch's (re-formed or with joiners admitted), which
//!    first waits until this member's messages of the group were taken: a call ends once it
//!    has what it needs, its own last messages perhaps still queued for a peer whose call
//!    has not ended (dropping a group drops its queues). A member going away flushes first
//!    ([`ProcessGroup::flush`]) for the same reason.
//!
//! Joining a live group (a restarted or new process):
//! 1. A starting process asks the others first ([`Mesh::enter`]): if none formed a group yet
//!    (the job is starting), it forms epoch 1 with them; if one did, it is to join.
//! 2. A joiner repeats its `Enter` to every member until it is admitted ([`Mesh::join_live`]);
//!    each member keeps it as pending for a while. Every `Enter` and `Join` carries the
//!    sender's process [`Incarnation`], and each member knows the process of each peer it
//!    formed its group with: a member of the live group asking to enter from another process
//!    is a new incarnation (an ask of the same process is one it sent before its admission
//!    reached it, and is ignored): its old one is gone, and the group fails at once with
//!    [`CollectiveError::MemberLost`] (the survivors re-form without it: a joiner answers
//!    probes as no survivor).
//! 3. At a step boundary the members agree on the joiners (their leader's pending ones, see
//!    [`ProcessGroup::pending_joiners`]) and form the next epoch with them
//!    ([`ProcessGroup::admit`]): the leader tells each joiner the epoch and members (`Admit`),
//!    then whether every joiner acked (a broadcast over the group), and only then every one
//!    forms it as in step 2 above; where one could not be told (an admission lost on a link
//!    that died is told again over a new one while the joiner was not out of reach for twice
//!    the idle timeout), every member skips that epoch and goes on, and the joiners ask again.
//!    A joiner refuses at once to form an epoch it was not admitted to: a member naming its
//!    node meant its old process.
//!
//! Failure rules:
//! - A member is lost when its connection fails or stays silent past the transport's idle
//!   timeout (the detection budget): every survivor's pending call fails with
//!   [`CollectiveError::MemberLost`] (each survivor watches every link, and the first member to
//!   see a failure sends it to all others as an `Abort`). A member that closes its links on
//!   purpose (its process going away after its last call) is lost only to a call that waits
//!   for a chunk from it that never came, so that a peer still taking its last chunks
//!   finishes.
//! - A member whose step failed in the application aborts the group
//!   ([`ProcessGroup::abort`]): every member's pending and later calls fail with
//!   [`CollectiveError::Application`] naming it and its message.
//! - A probe is answered by any live mesh, except one whose live group of a later epoch left
//!   the prober out: it refuses, so the late member learns it was taken for lost. A joiner
//!   answers as no survivor. So does a mesh still forming the first epoch whose link with the
//!   prober is not up (a new process of a member, forming the epoch that the others formed
//!   with its old process): its forming fails at once, and its process enters again as a
//!   joiner. One whose link with the prober is up is a member whose links were not all up
//!   when another member was lost: it answers as a survivor, and its forming ends with the
//!   group broken ([`Mesh::form`]), so that it re-forms with the others.
//! - EPOCH-1: every message carries its epoch; a message of another epoch than the group's is
//!   refused ([`CollectiveError::EpochRefused`] at the sender), never delivered.
//! - Members that disagree on a call all fail with [`CollectiveError::Mismatch`].
//! - A member that gives up a call before it ends (drops its future) leaves the group as a
//!   member that stops ([`CollectiveError::Stopped`] here, lost to the others; `ops.rs`).
//! - Every wait is bounded: forming by `form_timeout`, a peer's message by `op_timeout`, a
//!   send by the link's window of `window` unanswered requests (a request is answered when the
//!   receiving operation consumes it, so a receiver holds at most `window` chunks per peer).
//!   A link's queue of chunks not yet sent holds at most one operation's chunks for that peer
//!   (the operation produced them; an operation never waits on sending, only on receiving, so
//!   that a ring of full windows cannot deadlock).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use cohort_transport::{
    ConnectError, Connection, Endpoint, Frame, Incoming, LinkError, NodeId, RejectReason, Responder,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::landing::{Blob, Writable};
use super::wire::{Call, PlainLink, Reply, Wire};
use super::CollectiveError;
use crate::process::Incarnation;

/// Settings of a process group; every member should use the same (a member whose chunking
/// differs fails its first large call with [`CollectiveError::Mismatch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// Tensors up to this many bytes go by direct exchange (one message to each member);
    /// larger ones by the ring.
    pub small_bytes_max: usize,
    /// The ring's chunk: a segment is cut into chunks of at most this many bytes, each sent as
    /// soon as it is reduced, so that every link carries data at once.
    pub chunk_bytes: usize,
    /// Most unanswered chunks per link (the sender's window).
    pub window: usize,
    /// How long an operation waits for a peer's message whose connection still lives.
    pub op_timeout: Duration,
    /// How long forming a group waits for every member (dialing, and its `Join`).
    pub form_timeout: Duration,
    /// The plaintext data plane (`plain.rs`): chunks over TCP between members authenticated
    /// over QUIC when each link forms, for clusters inside a trusted network only (tensors
    /// travel unencrypted). Off by default; every member must choose alike (a member whose
    /// choice differs fails forming with [`CollectiveError::Form`] naming it).
    pub plaintext: bool,
    /// On the plaintext plane, members on one host pass large chunks through shared memory
    /// (`/dev/shm`) instead of TCP: one copy in place of the kernel's two (`shm.rs`). Each
    /// link falls back to TCP alone where the peer cannot map this member's segment (another
    /// host or container, another user, a full `/dev/shm`) or has this off. On by default;
    /// without `plaintext` it does nothing.
    pub shared_memory: bool,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            small_bytes_max: 64 * 1024,
            chunk_bytes: 1024 * 1024,
            window: 8,
            op_timeout: Duration::from_secs(60),
            form_timeout: Duration::from_secs(30),
            plaintext: false,
            shared_memory: true,
        }
    }
}

impl GroupConfig {
    /// The defaults with waits short enough for tests on loopback.
    pub fn for_tests() -> Self {
        Self {
            op_timeout: Duration::from_secs(20),
            form_timeout: Duration::from_secs(10),
            ..Self::default()
        }
    }
}

/// A member of a group to form: its node and where its mesh listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The member's node (its certificate names it).
    pub node: NodeId,
    /// The UDP address of its mesh's endpoint.
    pub addr: SocketAddr,
}

/// A process waiting to be admitted to the live group ([`ProcessGroup::pending_joiners`],
/// [`ProcessGroup::admit`]): the member it is to be, and which process of that node asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joiner {
    /// Its node and where its mesh listens.
    pub member: GroupMember,
    /// The process that asked: every member records it on admitting it, so that this
    /// process's asks still on their way are not taken for a new one's.
    pub incarnation: Incarnation,
}

/// A node's collective endpoint (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct Mesh {
    inner: Arc<MeshInner>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("node", self.inner.endpoint.node())
            .field("epoch", &self.inner.lock().epoch)
            .finish()
    }
}

/// `n` members `worker/0 .. worker/n-1` in this process, each on an endpoint of its own on
/// 127.0.0.1 (certificates from a fresh cluster CA), formed at epoch 1 with `config`: for
/// tests, benchmarks, and trying a model's collectives on one machine. Each member's endpoint
/// (close one to make its member go away) and group, in rank order.
pub async fn loopback_group(
    n: u32,
    transport: cohort_transport::TransportConfig,
    config: GroupConfig,
) -> Result<(Vec<Endpoint>, Vec<ProcessGroup>), CollectiveError> {
    let form = |reason: String| CollectiveError::Form { epoch: 1, reason };
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

    /// The latest epoch formed here (0 before the first).
    pub fn epoch(&self) -> u64 {
        self.inner.lock().epoch
    }

    /// How a starting process enters the job (see the module doc): asks each of `peers` (the
    /// other members it knows of) whether it formed a group, telling where this mesh listens
    /// (`own`). [`Entry::Join`] as soon as one did (a live job: this process is to be
    /// admitted, [`Mesh::join_live`]); [`Entry::Start`] once every peer answered that it did
    /// not, or after `within` (a peer not answering yet is taken to be starting too: forming
    /// epoch 1 waits for it). From an [`Entry::Join`] on this mesh waits to be admitted: its
    /// `Enter` made it a pending joiner at the leader, whose `Admit` may come before
    /// [`Mesh::join_live`] begins, and is kept for it.
    pub async fn enter(&self, own: SocketAddr, peers: &[GroupMember], within: Duration) -> Entry {
        let deadline = Instant::now() + within;
        let mut asks: futures::stream::FuturesUnordered<_> = peers
            .iter()
            .map(|peer| self.ask_enter(peer, own, deadline))
            .collect();
        use futures::StreamExt;
        while let Some(answer) = asks.next().await {
            if let Some((_, true)) = answer {
                self.inner.lock().joining = true;
                return Entry::Join;
            }
        }
        Entry::Start
    }

    /// Waits, at most `within`, to be admitted to the live group: tells every one of `peers`
    /// that this process asks to join (again each [`ENTER_REPEAT`]: their pending entries
    /// expire), and forms the epoch that the leader's `Admit` names with the members it names.
    /// Meanwhile this mesh answers probes as no survivor of any group. Fails with
    /// [`CollectiveError::Form`] if no admission was formed in time, or at once when every
    /// one of `peers` answers that it has no live group (every worker lost its group: they
    /// start again, forming epoch 1, [`Mesh::enter`]).
    pub async fn join_live(
        &self,
        own: SocketAddr,
        peers: &[GroupMember],
        within: Duration,
    ) -> Result<ProcessGroup, CollectiveError> {
        let deadline = Instant::now() + within;
        self.inner.lock().joining = true;
        let mut last = String::from("no member admitted it");
        let joined = loop {
            let ask_by = (Instant::now() + ENTER_REPEAT).min(deadline);
            let answers =
                futures::future::join_all(peers.iter().map(|p| self.ask_enter(p, own, ask_by)))
                    .await;
            if !answers.is_empty() && answers.iter().all(|a| matches!(a, Some((_, false)))) {
                break Err(CollectiveError::Form {
                    epoch: self.epoch(),
                    reason: "no member has a live group to admit this process: every one \
                             answered that it has none (the job is starting again)"
                        .into(),
                });
            }
            if let Some((epoch, members)) = self.wait_admission(ask_by).await {
                match self.form(epoch, members).await {
                    Ok(group) => break Ok(group),
                    Err(err) => last = format!("forming the admitted epoch {epoch}: {err}"),
                }
            }
            if Instant::now() >= deadline {
                break Err(CollectiveError::Form {
                    epoch: self.epoch(),
                    reason: format!(
                        "not admitted to the live group within {within:?} (the members admit a \
                         joiner at a step boundary): {last}"
                    ),
                });
            }
        };
        let mut state = self.inner.lock();
        state.joining = false;
        state.admission = None;
        joined
    }

    /// One `Enter` to `peer` by `deadline`: its latest epoch and whether it formed a group of
    /// it, or `None` if it did not answer.
    async fn ask_enter(
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
            let conn = self.dial(peer, self.epoch(), deadline, false).await.ok()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = conn
                .request_within(frame, left.max(Duration::from_millis(1)))
                .await
                .ok()?;
            match reply.decode::<Reply>(header_max) {
                Ok(Reply::Entered { epoch, formed }) => Some((epoch, formed)),
                _ => None,
            }
        };
        tokio::time::timeout_at(deadline, asked)
            .await
            .ok()
            .flatten()
    }

    /// The admission this joining mesh received by `deadline`, if one came.
    async fn wait_admission(&self, deadline: Instant) -> Option<(u64, Vec<GroupMember>)> {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(admission) = self.inner.lock().admission.take() {
                return Some(admission);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.inner.lock().admission.take();
            }
        }
    }

    /// Forgets a first forming that failed, where no group was ever formed here and this mesh
    /// does not wait to be admitted, so that [`Mesh::form`] can form epoch 1 again: a fresh
    /// start refused by members still waiting to be admitted to a group that is gone (their
    /// processes entered while it lived) is tried again once they see that no one has a live
    /// group and start too. Meanwhile this mesh answers that it has none, and holds their
    /// joins of epoch 1 for its next forming. Returns whether it forgot; `false` (nothing
    /// changed) where a group of this mesh was formed, lives, or it waits to be admitted.
    pub fn forget_failed_start(&self) -> bool {
        let mut state = self.inner.lock();
        if state.member || state.joining || state.epoch != 1 || state.group.upgrade().is_some() {
            return false;
        }
        state.epoch = 0;
        // Its links are of the failed attempt: the next one links anew.
        state.linked.clear();
        true
    }

    /// Forms the group of `epoch` with `members` (this node among them); see the module doc.
    /// `epoch` must be above every epoch formed here before (start at 1); forming it
    /// supersedes the previous group of this node. Fails within `form_timeout` if a member
    /// does not form the same epoch with the same members. Returns the group already broken
    /// where a member that formed it with this process saw it fail before this process's
    /// links were all up (another member was lost meanwhile: that member's abort, or its
    /// probe as it re-forms, says so): every call fails at once, and this member re-forms
    /// with the survivors as after any failed call ([`ProcessGroup::reachable`],
    /// [`ProcessGroup::reform`]). A joiner's admission failing so is an error: it asks again.
    pub async fn form(
        &self,
        epoch: u64,
        members: Vec<GroupMember>,
    ) -> Result<ProcessGroup, CollectiveError> {
        let form_error = |reason: String| CollectiveError::Form { epoch, reason };
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
            if epoch <= state.epoch {
                return Err(form_error(format!(
                    "epoch {epoch} is not above the epoch {} already formed here",
                    state.epoch
                )));
            }
            let shared = Arc::new(Shared::new(
                epoch,
                rank,
                &members,
                self.inner.config.clone(),
                self.inner.endpoint.config().frame_bytes_max,
            ));
            state.epoch = epoch;
            state.linked.retain(|(_, e)| *e == epoch);
            // Joins of an earlier epoch whose forming failed here can no longer be taken.
            state.joined.retain(|(_, e), _| *e >= epoch);
            state.plain_joined.retain(|(_, e), _| *e >= epoch);
            let old = std::mem::replace(&mut state.group, Arc::downgrade(&shared));
            drop(state);
            if let Some(old) = old.upgrade() {
                old.fail(
                    CollectiveError::Superseded {
                        epoch: old.epoch,
                        current: epoch,
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
                if shared.lock().cut_short {
                    tracing::info!(epoch, %err, "the first forming was cut short: this member re-forms with the others");
                    return Ok(ProcessGroup {
                        shared,
                        mesh: self.clone(),
                    });
                }
                return Err(err);
            }
        };
        shared.start_links(&shared, conns);
        self.inner.lock().member = true;
        tracing::debug!(epoch, rank, members = ?shared.nodes, "formed a group");
        Ok(ProcessGroup {
            shared,
            mesh: self.clone(),
        })
    }

    /// One link of a group being formed (see [`Mesh::link_once`]), recorded once it is up:
    /// another process of that peer is then refused in this epoch (it is a new incarnation,
    /// to enter and be admitted).
    async fn link(
        &self,
        shared: &Arc<Shared>,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>), CollectiveError> {
        let (conn, plain, incarnation) = self.link_once(shared, peer, deadline).await?;
        let mut state = self.inner.lock();
        if state.epoch == shared.epoch {
            state.linked.insert((peer.node.clone(), shared.epoch));
            state.processes.insert(peer.node.clone(), incarnation);
        }
        Ok((conn, plain))
    }

    /// Dials and joins (larger node id) or waits for the peer's join (smaller node id),
    /// within `deadline`; the link, and which process of the peer is at its other end.
    async fn link_once(
        &self,
        shared: &Arc<Shared>,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>, Incarnation), CollectiveError> {
        let epoch = shared.epoch;
        let form_error = |reason: String| CollectiveError::Form { epoch, reason };
        if self.node() < &peer.node {
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
        let by_admission = {
            let state = self.inner.lock();
            state.joining && state.admitted_epoch == epoch
        };
        let join = Wire::Join {
            epoch,
            members: shared.nodes.clone(),
            plaintext,
            by_admission,
            incarnation: self.inner.incarnation,
        };
        let frame = Frame::encode(&join, Vec::new(), shared.header_max)
            .map_err(|e| form_error(format!("encoding the join: {e}")))?;
        let mut fresh = false;
        let (conn, reply) = loop {
            let conn = self.dial(peer, epoch, deadline, fresh).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            match conn
                .request_within(frame.clone(), left.max(Duration::from_millis(1)))
                .await
            {
                Ok(reply) => break (conn, reply),
                // A kept connection may have died unnoticed (this process was stopped past
                // the idle timeout): dial once more before giving up.
                Err(LinkError::ConnectionLost { .. }) if !fresh => fresh = true,
                Err(e) => return Err(form_error(format!("joining {}: {e}", peer.node))),
            }
        };
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
                let stream = super::plain::dial(addr, token, epoch, deadline)
                    .await
                    .map_err(|e| {
                        form_error(format!("the TCP link to {} at {addr}: {e}", peer.node))
                    })?;
                Ok((conn, Some(stream), incarnation))
            }
            Ok(Reply::Refused { current, detail }) => Err(CollectiveError::EpochRefused {
                node: peer.node.clone(),
                epoch,
                current,
                detail,
            }),
            Ok(Reply::Broken(err)) => Err(err),
            Ok(other @ (Reply::Ack | Reply::Joining | Reply::Entered { .. })) => Err(form_error(
                format!("{} answered the join with {other:?}", peer.node),
            )),
            Err(e) => Err(form_error(format!(
                "{}'s answer to the join: {e}",
                peer.node
            ))),
        }
    }

    /// A live connection to `peer`: the mesh's own if it still lives (and not `fresh`), else a
    /// new one (retried until `deadline`: the peer's process may not be listening yet).
    async fn dial(
        &self,
        peer: &GroupMember,
        epoch: u64,
        deadline: Instant,
        fresh: bool,
    ) -> Result<Connection, CollectiveError> {
        if !fresh {
            if let Some(conn) = self.inner.lock().conns.get(&peer.node) {
                if conn.close_reason().is_none() {
                    return Ok(conn.clone());
                }
            }
        }
        let mut unreachable_since: Option<Instant> = None;
        loop {
            // Unreachable since the first failed attempt began (it may take the connect
            // timeout to fail).
            let attempt_began = Instant::now();
            match self.inner.endpoint.connect(peer.addr, &peer.node).await {
                Ok(conn) => {
                    self.inner.adopt(conn.clone());
                    return Ok(conn);
                }
                Err(
                    e @ (ConnectError::CertificateRejected { .. }
                    | ConnectError::UnexpectedPeer { .. }
                    | ConnectError::IdentityMismatch { .. }
                    | ConnectError::ProtocolVersionMismatch { .. }),
                ) => {
                    return Err(CollectiveError::Form {
                        epoch,
                        reason: format!("dialing {} at {}: {e}", peer.node, peer.addr),
                    })
                }
                Err(e) => {
                    let now = Instant::now();
                    if now + DIAL_RETRY >= deadline {
                        return Err(CollectiveError::Form {
                            epoch,
                            reason: format!(
                                "{} at {} not reachable within the form timeout: {e}",
                                peer.node, peer.addr
                            ),
                        });
                    }
                    let since = *unreachable_since.get_or_insert(attempt_began);
                    if let Some(bound) = self.lost_while_re_forming(epoch, since, now) {
                        return Err(CollectiveError::Form {
                            epoch,
                            reason: format!(
                                "{} at {} not reachable for {bound} while re-forming (lost \
                                 meanwhile): {e}",
                                peer.node, peer.addr,
                            ),
                        });
                    }
                    tokio::time::sleep(DIAL_RETRY).await;
                }
            }
        }
    }

    /// Whether `peer` answers a probe by `deadline` (see [`ProcessGroup::reachable`]): `Ok`
    /// with whether it is alive, or its refusal if it re-formed a later epoch without us.
    async fn probe(
        &self,
        peer: &GroupMember,
        epoch: u64,
        deadline: Instant,
    ) -> Result<ProbeAnswer, CollectiveError> {
        let header_max = self.inner.endpoint.config().frame_bytes_max;
        let Ok(frame) = Frame::encode(&Wire::Probe { epoch }, Vec::new(), header_max) else {
            return Ok(ProbeAnswer::Silent);
        };
        let mut fresh = false;
        loop {
            let Ok(conn) = self.dial(peer, epoch, deadline, fresh).await else {
                return Ok(ProbeAnswer::Silent);
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match conn
                .request_within(frame.clone(), left.max(Duration::from_millis(1)))
                .await
            {
                Ok(reply) => {
                    return match reply.decode::<Reply>(header_max) {
                        Ok(Reply::Ack) => Ok(ProbeAnswer::Alive),
                        Ok(Reply::Joining) => Ok(ProbeAnswer::Joining),
                        Ok(Reply::Refused { current, detail }) => {
                            Err(CollectiveError::EpochRefused {
                                node: peer.node.clone(),
                                epoch,
                                current,
                                detail,
                            })
                        }
                        _ => Ok(ProbeAnswer::Silent),
                    }
                }
                // The kept connection may be the dead one of the lost member's old process, or
                // a live member's that died unnoticed: dial once more.
                Err(LinkError::ConnectionLost { .. }) if !fresh => fresh = true,
                Err(_) => return Ok(ProbeAnswer::Silent),
            }
        }
    }

    /// Tells `joiner` it is admitted to form `epoch` with `members`, by `deadline`; whether
    /// it acked. An admission lost on a link that died (cut between the leader and the joiner
    /// alone) is told again over a new one, while the joiner was not out of reach for twice
    /// the idle timeout.
    async fn tell_admitted(
        &self,
        joiner: &GroupMember,
        epoch: u64,
        members: &[GroupMember],
        deadline: Instant,
    ) -> bool {
        let header_max = self.inner.endpoint.config().frame_bytes_max;
        let admit = Wire::Admit {
            epoch,
            members: members
                .iter()
                .map(|m| (m.node.clone(), m.addr.to_string()))
                .collect(),
        };
        let Ok(frame) = Frame::encode(&admit, Vec::new(), header_max) else {
            return false;
        };
        let told = async {
            // When the admission was first lost on the way (the link with the joiner cut).
            let mut lost_since: Option<Instant> = None;
            loop {
                let fresh = lost_since.is_some();
                let conn = self.dial(joiner, epoch, deadline, fresh).await.ok()?;
                let left = deadline.saturating_duration_since(Instant::now());
                let reply = match conn
                    .request_within(frame.clone(), left.max(Duration::from_millis(1)))
                    .await
                {
                    Ok(reply) => reply,
                    // Lost on a link that died (a partition between the leader and the joiner,
                    // which the others may not have): told again over a new one, while the
                    // joiner was not out of reach for long.
                    Err(LinkError::ConnectionLost { .. }) => {
                        let now = Instant::now();
                        let since = *lost_since.get_or_insert(now);
                        if self.lost_while_re_forming(epoch, since, now).is_some() {
                            return None;
                        }
                        tokio::time::sleep(DIAL_RETRY).await;
                        continue;
                    }
                    Err(_) => return None,
                };
                return match reply.decode::<Reply>(header_max) {
                    Ok(Reply::Ack) => Some(()),
                    Ok(other) => {
                        tracing::warn!(joiner = %joiner.node, ?other, "a joiner refused its admission");
                        None
                    }
                    Err(_) => None,
                };
            }
        };
        matches!(tokio::time::timeout_at(deadline, told).await, Ok(Some(())))
    }

    /// Takes `epoch` as tried here without forming it (the members agreed to skip it): a join
    /// of it, or a question whether this mesh still forms it, is refused from now on.
    fn skip_epoch(&self, epoch: u64) {
        let mut state = self.inner.lock();
        state.epoch = state.epoch.max(epoch);
        drop(state);
        self.inner.changed.notify_waiters();
    }

    async fn wait_for_join(
        &self,
        shared: &Shared,
        peer: &GroupMember,
        deadline: Instant,
    ) -> Result<(Connection, Option<TcpStream>, Incarnation), CollectiveError> {
        let epoch = shared.epoch;
        let key = (peer.node.clone(), epoch);
        let mut next_ask = Instant::now() + STILL_FORMING_EVERY;
        // Since when the peer has not answered whether it still forms this epoch.
        let mut silent_since: Option<Instant> = None;
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
                    return Err(CollectiveError::Form { epoch, reason });
                }
                // The forming failed meanwhile (a probe said the others formed without us).
                if let Some(err) = shared.lock().broken.clone() {
                    return Err(err);
                }
                if state.epoch != epoch {
                    return Err(CollectiveError::Superseded {
                        epoch,
                        current: state.epoch,
                    });
                }
            }
            if tokio::time::timeout_at(next_ask.min(deadline), changed)
                .await
                .is_ok()
            {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Form {
                    epoch,
                    reason: format!("{} did not join within the form timeout", peer.node),
                });
            }
            // A join that has not come yet may never come: the peer formed this epoch with
            // other members (its view of the survivors differs, and it did not list this
            // member), gave it up, or was lost. Ask, rather than wait out the form timeout.
            next_ask = now + STILL_FORMING_EVERY;
            if self.ask_still_forming(shared, peer).await? {
                silent_since = None;
            } else {
                let since = *silent_since.get_or_insert(now);
                if let Some(bound) = self.lost_while_re_forming(epoch, since, now) {
                    return Err(CollectiveError::Form {
                        epoch,
                        reason: format!(
                            "{} did not answer for {bound} while re-forming (lost meanwhile)",
                            peer.node
                        ),
                    });
                }
            }
        }
    }

    /// Whether `peer`, whose join this member awaits, still forms its epoch with the same
    /// members (`Ok(true)`), or did not answer in time (`Ok(false)`); its refusal, or its
    /// failed forming, as the error that fails this forming.
    async fn ask_still_forming(
        &self,
        shared: &Shared,
        peer: &GroupMember,
    ) -> Result<bool, CollectiveError> {
        let epoch = shared.epoch;
        let ask = Wire::StillForming {
            epoch,
            members: shared.nodes.clone(),
        };
        let Ok(frame) = Frame::encode(&ask, Vec::new(), shared.header_max) else {
            return Ok(false);
        };
        let by = Instant::now() + STILL_FORMING_EVERY;
        let asked = async {
            let conn = self.dial(peer, epoch, by, false).await.ok()?;
            conn.request_within(frame, STILL_FORMING_EVERY).await.ok()
        };
        let Some(reply) = tokio::time::timeout_at(by, asked).await.ok().flatten() else {
            return Ok(false);
        };
        match reply.decode::<Reply>(shared.header_max) {
            Ok(Reply::Refused { current, detail }) => Err(CollectiveError::EpochRefused {
                node: peer.node.clone(),
                epoch,
                current,
                detail,
            }),
            // A first forming broken at the peer was cut short there (a member formed it and
            // is re-forming): its probe decides whether this member survives or joins, so the
            // answer is left to it.
            Ok(Reply::Broken(_)) if epoch == 1 => Ok(true),
            Ok(Reply::Broken(err)) => Err(CollectiveError::Form {
                epoch,
                reason: format!("{}'s forming of it failed: {err}", peer.node),
            }),
            Ok(_) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    /// Whether a peer unreachable `since` is taken for lost `now` while this mesh forms
    /// `epoch`: the bound it passed (as text), if so. None for the first epoch, whose
    /// processes may still be starting (the form timeout bounds it); twice the transport's
    /// idle timeout (the detection budget) for a later one, whose members answered a probe
    /// just before (re-forming) or are live members (an admission).
    fn lost_while_re_forming(&self, epoch: u64, since: Instant, now: Instant) -> Option<String> {
        let bound = self.inner.endpoint.config().idle_timeout * 2;
        (epoch > 1 && now.duration_since(since) >= bound)
            .then(|| crate::cluster::format_duration(bound))
    }
}

/// What a member's probes of its group found ([`ProcessGroup::probe_members`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probed {
    /// The members that answered as live members (this one among them), in rank order: the
    /// survivors.
    pub alive: Vec<NodeId>,
    /// The members whose address answered with a new process of that member, waiting to be
    /// admitted: its old process is gone, and it is no survivor.
    pub joining: Vec<NodeId>,
}

/// One member's answer to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeAnswer {
    /// A live mesh that is no joiner.
    Alive,
    /// A new process of that member, waiting to be admitted.
    Joining,
    /// No answer in time.
    Silent,
}

/// A formed group of processes: its rank, members and epoch, and the operations (`ops.rs`).
/// Cheap to clone; operations of one group run one at a time, in call order.
#[derive(Clone)]
pub struct ProcessGroup {
    pub(crate) shared: Arc<Shared>,
    mesh: Mesh,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("epoch", &self.shared.epoch)
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

    /// The membership epoch.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
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
    /// took it) or the group broke; whether it got there. A member whose operation ended may
    /// still have its last chunks on the way to a peer whose operation has not: a member about
    /// to go away (its process exiting) flushes first, so that the peer is not left to take
    /// it for lost.
    pub async fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let idle = self
                .shared
                .unanswered
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0;
            if idle || self.broken().is_some() {
                return idle;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(FLUSH_POLL).await;
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
            epoch: self.shared.epoch,
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
    /// [`CollectiveError::EpochRefused`] when a member already formed a later epoch without
    /// this node (this node is the late one: it was taken for lost).
    pub async fn reachable(&self, within: Duration) -> Result<Vec<NodeId>, CollectiveError> {
        self.probe_members(within).await.map(|probed| probed.alive)
    }

    /// [`ProcessGroup::reachable`], telling also which of the members that did not answer as
    /// survivors answered as new processes waiting to be admitted ([`Probed::joining`]).
    pub async fn probe_members(&self, within: Duration) -> Result<Probed, CollectiveError> {
        let deadline = Instant::now() + within;
        let epoch = self.shared.epoch;
        let probes = self.shared.nodes.iter().enumerate().map(|(rank, node)| {
            let member = GroupMember {
                node: node.clone(),
                addr: self.shared.addrs[rank],
            };
            let me = rank == self.shared.rank;
            async move {
                if me {
                    return Ok((member.node, ProbeAnswer::Alive));
                }
                let probe = self.mesh.probe(&member, epoch, deadline);
                let answer = tokio::time::timeout_at(deadline, probe)
                    .await
                    .unwrap_or(Ok(ProbeAnswer::Silent))?;
                Ok((member.node, answer))
            }
        });
        let answers = futures::future::join_all(probes).await;
        let mut probed = Probed::default();
        for answer in answers {
            match answer? {
                (node, ProbeAnswer::Alive) => probed.alive.push(node),
                (node, ProbeAnswer::Joining) => probed.joining.push(node),
                (_, ProbeAnswer::Silent) => {}
            }
        }
        Ok(probed)
    }

    /// Forms the group of the next epoch of this node's mesh (one above the latest formed or
    /// tried here: this group's epoch + 1, unless a re-forming attempt already took that one)
    /// with `survivors` (members of this group, this node among them), at the addresses this
    /// group was formed with. Every survivor must call it with the same survivors.
    /// This group's messages still on their way go first ([`ProcessGroup::flush`], bounded by
    /// the form timeout), unless it is broken.
    pub async fn reform(&self, survivors: &[NodeId]) -> Result<ProcessGroup, CollectiveError> {
        let epoch = self.shared.epoch.max(self.mesh.epoch()) + 1;
        let mut members = Vec::with_capacity(survivors.len());
        for node in survivors {
            let Some(i) = self.shared.nodes.iter().position(|n| n == node) else {
                return Err(CollectiveError::Form {
                    epoch,
                    reason: format!("{node} is not a member of epoch {}", self.shared.epoch),
                });
            };
            members.push(GroupMember {
                node: node.clone(),
                addr: self.shared.addrs[i],
            });
        }
        self.hand_over().await;
        self.mesh.form(epoch, members).await
    }

    /// The processes that asked this member to be admitted (`Enter`) within the last
    /// [`PENDING_FRESH`] and are not members of this group, in node order, with where they
    /// listen. Only the leader's (rank 0's) count: the members agree on its list before
    /// [`ProcessGroup::admit`].
    pub fn pending_joiners(&self) -> Vec<Joiner> {
        let mut state = self.mesh.inner.lock();
        let now = Instant::now();
        state
            .pending
            .retain(|_, pending| now.duration_since(pending.asked) < PENDING_FRESH);
        let mut joiners: Vec<Joiner> = state
            .pending
            .iter()
            .filter(|(node, _)| !self.shared.nodes.contains(node))
            .map(|(node, pending)| Joiner {
                member: GroupMember {
                    node: node.clone(),
                    addr: pending.addr,
                },
                incarnation: pending.incarnation,
            })
            .collect();
        joiners.sort_by(|a, b| a.member.node.cmp(&b.member.node));
        joiners
    }

    /// Forms the next epoch (as [`ProcessGroup::reform`] numbers it) with every member of
    /// this group and `joiners` (processes waiting in [`Mesh::join_live`]). Every member must
    /// call it with the same joiners. The leader (rank 0) first tells each joiner the epoch and
    /// members (`Admit`, each bounded by the form timeout; one lost on a link that died is told
    /// again over a new one while the joiner is not out of reach for long), and forgets them as
    /// pending (a joiner still waiting asks again); then it tells the members, over this group,
    /// whether every joiner acked. Only then do the members form the next epoch with them, so
    /// that a joiner is asked to form an epoch only once admitted to it (it refuses any other
    /// at once: a member's list naming its node then meant its old process).
    ///
    /// `Ok(None)` where the leader could not tell every joiner: no member forms that epoch (each
    /// skips it: a joiner told nevertheless is refused at once and asks again), and this group
    /// goes on unchanged. Fails as forming does: a joiner that does not form it fails the
    /// attempt at every member, whose group of this epoch is then superseded (re-form with the
    /// survivors, [`ProcessGroup::reachable`]), and as this group's calls do. This group's
    /// messages still on their way go first, as in [`ProcessGroup::reform`].
    pub async fn admit(&self, joiners: &[Joiner]) -> Result<Option<ProcessGroup>, CollectiveError> {
        if joiners.is_empty() {
            return Ok(None);
        }
        let epoch = self.shared.epoch.max(self.mesh.epoch()) + 1;
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
            {
                let mut state = self.mesh.inner.lock();
                for joiner in joiners {
                    state.pending.remove(&joiner.member.node);
                }
            }
            let deadline = Instant::now() + self.shared.config.form_timeout;
            let told = joiners.iter().map(|joiner| {
                self.mesh
                    .tell_admitted(&joiner.member, epoch, &members, deadline)
            });
            let told = futures::future::join_all(told).await;
            every_one_told = u8::from(told.iter().all(|t| *t));
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
                    epoch,
                    "not every joiner could be told its admission: skipping that epoch"
                );
            }
            self.mesh.skip_epoch(epoch);
            return Ok(None);
        }
        {
            // The admitted processes' asks still on their way are theirs, not new ones'.
            let mut state = self.mesh.inner.lock();
            for joiner in joiners {
                state
                    .processes
                    .insert(joiner.member.node.clone(), joiner.incarnation);
            }
        }
        self.hand_over().await;
        self.mesh.form(epoch, members).await.map(Some)
    }

    /// Before the group of the next epoch supersedes this one: waits, at most the form
    /// timeout, until every message this member sent was taken, unless the group broke. A
    /// member's call ends once it has what it needs, while its own last messages (a
    /// broadcast's "done" to the root, the ring's last chunks) may still be queued for a peer
    /// whose call has not ended; the next epoch's group drops this one, and its links' queues
    /// with it. A peer that goes away right after that call (a preempted member, which
    /// leaves while the others re-form without it) would otherwise wait for them until the
    /// operation timeout. The peers' calls need those messages, so in a group that is not
    /// broken this is about one round trip.
    async fn hand_over(&self) {
        if self.broken().is_none() {
            self.flush(self.shared.config.form_timeout).await;
        }
    }
}

/// How a starting process enters the job ([`Mesh::enter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// No member formed a group yet: form epoch 1 with them.
    Start,
    /// A member formed a group: wait to be admitted to it ([`Mesh::join_live`]).
    Join,
}

struct MeshInner {
    endpoint: Endpoint,
    /// This process, as its `Enter` and `Join` name it.
    incarnation: Incarnation,
    config: GroupConfig,
    state: Mutex<MeshState>,
    /// Signalled when an epoch is formed here or a peer joins one.
    changed: Notify,
    acceptor: OnceLock<JoinHandle<()>>,
    /// Plaintext plane: the port of this mesh's TCP listener and its accept loop, once bound.
    plain: tokio::sync::OnceCell<(u16, JoinHandle<()>)>,
}

#[derive(Default)]
struct MeshState {
    /// The latest epoch formed here.
    epoch: u64,
    /// Its group, while someone holds it.
    group: Weak<Shared>,
    /// The latest connection with each peer, dialed or accepted.
    conns: HashMap<NodeId, Connection>,
    /// Links of the forming epoch whose dialer's join arrived, until `form` takes them.
    /// Each with when its join arrived: of two processes of one peer joining the same
    /// epoch (its old one, killed while the job started, and its restart), the later wins.
    joined: HashMap<(NodeId, u64), (Connection, Instant, Incarnation)>,
    readers: Vec<JoinHandle<()>>,
    /// Whether this process waits to be admitted to a live group ([`Mesh::join_live`]): it
    /// answers probes as no survivor.
    joining: bool,
    /// Whether this process is a member the others know: a group formed here (all its links
    /// up), or a member that formed the first epoch with this process (their link up) is
    /// re-forming it, which cut this process's forming short ([`Mesh::form`]). A mesh that is
    /// no member answers probes as no survivor of any group.
    member: bool,
    /// The peers whose link of the forming (or last formed) epoch is up, by epoch: a join
    /// or enter from another process of one of them is a new incarnation.
    linked: std::collections::HashSet<(NodeId, u64)>,
    /// Processes that asked to be admitted (`Enter`), by node.
    pending: HashMap<NodeId, Pending>,
    /// The process of each peer this mesh last linked with (its join, or its answer to ours)
    /// or admitted: an `Enter` from that process is one it sent before it formed the group
    /// with this mesh (stale); one from another process of a member is its restart.
    processes: HashMap<NodeId, Incarnation>,
    /// The admission this joining mesh received and has not formed yet: epoch and members.
    admission: Option<(u64, Vec<GroupMember>)>,
    /// The latest epoch a leader admitted this joining mesh to (its `Admit` acked): a join of
    /// a later one is refused ([`MeshInner::unadmitted`]).
    admitted_epoch: u64,
    /// Plaintext plane: tokens this mesh issued in its answers to joins, by token: the
    /// peer and epoch each one is for (each taken once).
    plain_tokens: HashMap<super::plain::Token, (NodeId, u64)>,
    /// Plaintext plane: TCP links whose hello arrived, until `form` takes them.
    plain_joined: HashMap<(NodeId, u64), TcpStream>,
    /// Joins refused for a reason that fails the forming here too (the data planes differ).
    refused_joins: HashMap<(NodeId, u64), String>,
}

/// A process that asked to be admitted ([`MeshState::pending`]).
struct Pending {
    /// Where it listens.
    addr: SocketAddr,
    /// Which process of its node asked.
    incarnation: Incarnation,
    /// When it last asked.
    asked: Instant,
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
    fn lock(&self) -> MutexGuard<'_, MeshState> {
        // Every update below is a single assignment or insertion; a poisoned lock is safe.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The port of this mesh's plaintext-plane listener, bound (beside the QUIC endpoint's
    /// address) and accepting on first use: each accepted connection that says a hello with a
    /// token this mesh issued becomes that peer's link of that epoch; any other is closed.
    async fn plain_listener(self: &Arc<Self>) -> std::io::Result<u16> {
        let bound = self
            .plain
            .get_or_try_init(|| async {
                let ip = self.endpoint.local_addr()?.ip();
                let listener = super::plain::bind(ip).await?;
                let port = listener.local_addr()?.port();
                let weak = Arc::downgrade(self);
                let acceptor = tokio::spawn(async move {
                    while let Ok((mut stream, from)) = listener.accept().await {
                        let weak = weak.clone();
                        tokio::spawn(async move {
                            let hello = super::plain::read_hello(&mut stream).await;
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
    fn adopt(self: &Arc<Self>, conn: Connection) {
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

    fn dispatch(self: &Arc<Self>, conn: &Connection, frame: Frame, responder: Responder) {
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

    /// The answer to a dialer's join of `epoch`: waits (at most `form_timeout`) for this node
    /// to form it, then acks if it formed it with the same members. A joiner not admitted to
    /// `epoch` refuses at once, unless the dialer is a joiner admitted to it (`by_admission`):
    /// its own admission is then on its way (see [`Wire::Join`]).
    async fn join(
        &self,
        conn: &Connection,
        epoch: u64,
        members: Vec<NodeId>,
        plaintext: bool,
        by_admission: bool,
        incarnation: Incarnation,
    ) -> Reply {
        let arrived = Instant::now();
        let deadline = arrived + self.config.form_timeout;
        if plaintext != self.config.plaintext {
            let plane = |p: bool| if p { "plaintext" } else { "QUIC" };
            let reason = format!(
                "{} uses the {} data plane, this member the {} one: every member must choose \
                 alike (GroupConfig::plaintext)",
                conn.peer(),
                plane(plaintext),
                plane(self.config.plaintext)
            );
            self.lock()
                .refused_joins
                .insert((conn.peer().clone(), epoch), reason.clone());
            self.changed.notify_waiters();
            return Reply::Refused {
                current: epoch,
                detail: format!(": {reason}"),
            };
        }
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                if state.epoch >= epoch {
                    let group = state.group.upgrade().filter(|g| g.epoch == epoch);
                    return match group {
                        // Its links are all up: a join of it again comes from a new
                        // incarnation of the dialer (enter first, then be admitted).
                        Some(g) if g.is_formed() => Reply::Refused {
                            current: epoch,
                            detail: format!(
                                " (formed already: {} is to enter and be admitted)",
                                conn.peer()
                            ),
                        },
                        // Its link of this epoch is up already, with another process of it
                        // (the one before a restart): this one is to enter and be admitted.
                        Some(_) if state.linked.contains(&(conn.peer().clone(), epoch)) => {
                            Reply::Refused {
                                current: epoch,
                                detail: format!(
                                    " (linked already with another process of {}: this one \
                                     is to enter and be admitted)",
                                    conn.peer()
                                ),
                            }
                        }
                        Some(g) if g.nodes == members => {
                            let peer = conn.peer().clone();
                            let key = (peer.clone(), epoch);
                            // A later process of it joined too, or this one is gone already.
                            if state
                                .joined
                                .get(&key)
                                .is_some_and(|(_, at, _)| *at > arrived)
                                || conn.close_reason().is_some()
                            {
                                return Reply::Refused {
                                    current: epoch,
                                    detail: format!(
                                        " (a later process of {peer} joined it: this one is \
                                         gone)"
                                    ),
                                };
                            }
                            state
                                .joined
                                .insert(key, (conn.clone(), arrived, incarnation));
                            let plain = match self.plain.get() {
                                Some((port, _)) if self.config.plaintext => {
                                    let token = super::plain::new_token();
                                    state.plain_tokens.insert(token, (peer, epoch));
                                    Some(PlainLink { port: *port, token })
                                }
                                _ => None,
                            };
                            let reply = Reply::Joined {
                                incarnation: self.incarnation,
                                plain,
                            };
                            drop(state);
                            self.changed.notify_waiters();
                            reply
                        }
                        Some(g) => {
                            let reply = Reply::Refused {
                                current: epoch,
                                detail: format!(" with members {:?}", g.nodes),
                            };
                            // A member forms an epoch once, with one list: a member of this
                            // forming that forms it with another list never joins it, so it
                            // fails here now rather than at the form timeout (the dialer
                            // fails on this refusal).
                            if !g.is_formed() && g.nodes.contains(conn.peer()) {
                                drop(state);
                                let reason = format!(
                                    "{} forms it with members {members:?}, this member with \
                                     {:?}: the views differ",
                                    conn.peer(),
                                    g.nodes
                                );
                                g.fail(CollectiveError::Form { epoch, reason }, false);
                                self.changed.notify_waiters();
                            }
                            reply
                        }
                        None => self.refusal_locked(&state, epoch),
                    };
                }
                if Self::unadmitted(&state, epoch) && !by_admission {
                    return Self::unadmitted_refusal(&state, epoch);
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let state = self.lock();
                return Reply::Refused {
                    current: state.epoch,
                    detail: format!(" and did not form epoch {epoch} within its form timeout"),
                };
            }
        }
    }

    /// The answer to a process's `Enter` (see [`Mesh::enter`]); keeps it as pending where a
    /// group was formed here, and fails a live group of which it is a member (its old
    /// incarnation is gone). An ask from the very process this mesh formed its group with (or
    /// admitted to it) is one it sent before then, delivered late: ignored.
    fn entered(&self, peer: &NodeId, addr: &str, incarnation: Incarnation) -> Reply {
        let mut state = self.lock();
        let epoch = state.epoch;
        if state.joining || epoch == 0 {
            return Reply::Entered {
                epoch,
                formed: false,
            };
        }
        let group = state.group.upgrade().filter(|g| g.epoch == epoch);
        // Its first forming failed and is gone: no group lives here to admit anyone.
        if group.is_none() && !state.member {
            return Reply::Entered {
                epoch,
                formed: false,
            };
        }
        let same_process = state.processes.get(peer) == Some(&incarnation);
        if let Some(g) = &group {
            // The first group forming and waiting for it: the job is starting (unless it
            // linked with another process of it already: then this one is a restart).
            if epoch == 1
                && !g.is_formed()
                && g.nodes.contains(peer)
                && (same_process || !state.linked.contains(&(peer.clone(), epoch)))
            {
                return Reply::Entered {
                    epoch,
                    formed: false,
                };
            }
        }
        if same_process && group.as_ref().is_some_and(|g| g.nodes.contains(peer)) {
            tracing::debug!(%peer, %incarnation, "an ask to join from a process already a member: sent before it formed this group, ignored");
            return Reply::Entered {
                epoch,
                formed: true,
            };
        }
        let Ok(addr) = addr.parse::<SocketAddr>() else {
            tracing::warn!(%peer, addr, "refused an enter whose address does not parse");
            return Reply::Refused {
                current: epoch,
                detail: format!(" (the address {addr:?} does not parse)"),
            };
        };
        state.pending.insert(
            peer.clone(),
            Pending {
                addr,
                incarnation,
                asked: Instant::now(),
            },
        );
        drop(state);
        if let Some(g) = group.filter(|g| g.is_formed() && g.nodes.contains(peer)) {
            g.fail(
                CollectiveError::MemberLost {
                    node: peer.clone(),
                    epoch,
                    reason: format!(
                        "a new process of it ({incarnation}) asks to join: the old one is gone"
                    ),
                },
                true,
            );
        }
        Reply::Entered {
            epoch,
            formed: true,
        }
    }

    /// The answer to the leader's `Admit`: taken if this mesh waits to be admitted and the
    /// epoch is above every one formed here.
    fn admitted(&self, epoch: u64, members: Vec<(NodeId, String)>) -> Reply {
        let mut parsed = Vec::with_capacity(members.len());
        for (node, addr) in members {
            match addr.parse::<SocketAddr>() {
                Ok(addr) => parsed.push(GroupMember { node, addr }),
                Err(_) => {
                    return Reply::Refused {
                        current: self.lock().epoch,
                        detail: format!(" (the address {addr:?} of {node} does not parse)"),
                    }
                }
            }
        }
        let mut state = self.lock();
        if !state.joining || epoch <= state.epoch {
            return Reply::Refused {
                current: state.epoch,
                detail: " (not waiting to be admitted)".into(),
            };
        }
        state.admission = Some((epoch, parsed));
        state.admitted_epoch = state.admitted_epoch.max(epoch);
        drop(state);
        self.changed.notify_waiters();
        Reply::Ack
    }

    /// Breaks `group`, still forming here, with `err` as one that a member formed with this
    /// process and is re-forming ([`Shared::cut_short`]): this process is a member from now
    /// on. Whether it did.
    fn cut_short(&self, group: &Shared, err: CollectiveError) -> bool {
        let cut = group.cut_short(err);
        if cut {
            self.lock().member = true;
        }
        self.changed.notify_waiters();
        cut
    }

    /// The answer to [`Wire::StillForming`]: whether this mesh forms (or will form) `epoch`
    /// with `members`.
    fn still_forming(&self, epoch: u64, members: &[NodeId]) -> Reply {
        let state = self.lock();
        if state.epoch < epoch {
            if Self::unadmitted(&state, epoch) {
                return Self::unadmitted_refusal(&state, epoch);
            }
            // Not there yet: its join may still come.
            return Reply::Ack;
        }
        match state.group.upgrade().filter(|g| g.epoch == epoch) {
            Some(g) if g.nodes != members => Reply::Refused {
                current: epoch,
                detail: format!(" with members {:?}", g.nodes),
            },
            Some(g) => match g.lock().broken.clone() {
                Some(err) => Reply::Broken(err),
                None => Reply::Ack,
            },
            None => self.refusal_locked(&state, epoch),
        }
    }

    /// Whether this mesh waits to be admitted and was not admitted to `epoch`: it never forms
    /// it. The members form an epoch with a joiner only once the leader's admission reached it
    /// ([`ProcessGroup::admit`]), so a member asking it about another (a `Join`, or whether it
    /// still forms it) lists its node for its old process, lost since: refused at once, that
    /// member's forming fails now rather than at its form timeout, and it re-forms (this
    /// process answering its probe as a joiner).
    fn unadmitted(state: &MeshState, epoch: u64) -> bool {
        state.joining && state.epoch < epoch && state.admitted_epoch < epoch
    }

    fn unadmitted_refusal(state: &MeshState, epoch: u64) -> Reply {
        Reply::Refused {
            current: state.epoch,
            detail: format!(
                " (a new process waiting to be admitted, not admitted to epoch {epoch}: its old \
                 one is gone)"
            ),
        }
    }

    fn refusal(&self, epoch: u64) -> Reply {
        let state = self.lock();
        self.refusal_locked(&state, epoch)
    }

    fn refusal_locked(&self, state: &MeshState, epoch: u64) -> Reply {
        Reply::Refused {
            current: state.epoch,
            detail: if state.epoch == epoch {
                " (its group of that epoch is gone)".into()
            } else {
                String::new()
            },
        }
    }
}

/// The state of one formed group, shared by its handles, its link tasks and the mesh.
pub(crate) struct Shared {
    pub(crate) epoch: u64,
    pub(crate) rank: usize,
    pub(crate) nodes: Vec<NodeId>,
    addrs: Vec<SocketAddr>,
    pub(crate) config: GroupConfig,
    pub(crate) header_max: u32,
    state: Mutex<GroupState>,
    /// Signalled when a chunk arrives or the group breaks.
    arrived: Notify,
    links: OnceLock<Vec<Option<Link>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The next operation's sequence number; held for the whole operation.
    pub(crate) ops: tokio::sync::Mutex<u64>,
    /// Whether this member is still telling the others how the group broke (see
    /// [`Shared::told`]).
    telling: tokio::sync::watch::Sender<bool>,
    unanswered: Unanswered,
    /// The runtime the group was formed on, which drives its links: answers and aborts sent
    /// from any thread (a call dropped where no runtime runs) go out there.
    runtime: Option<tokio::runtime::Handle>,
}

/// Marks this member done telling the others how the group broke, when dropped.
struct TellingDone(tokio::sync::watch::Sender<bool>);

impl Drop for TellingDone {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

struct Link {
    conn: Connection,
    out: mpsc::UnboundedSender<Outgoing>,
    /// The plaintext plane's shared-memory slots with this peer, on that plane.
    slots: Option<Arc<super::plain::LinkSlots>>,
}

/// Chunks queued or sent to any peer and not yet answered (see [`ProcessGroup::flush`]).
pub(crate) type Unanswered = Arc<std::sync::atomic::AtomicUsize>;

pub(crate) struct Outgoing {
    pub(crate) seq: u64,
    pub(crate) tag: u64,
    pub(crate) call: Call,
    pub(crate) blob: Blob,
}

#[derive(Default)]
struct GroupState {
    broken: Option<CollectiveError>,
    /// Whether a member that formed this group's epoch with this process is re-forming it
    /// while this process still formed it ([`Shared::cut_short`]).
    cut_short: bool,
    /// Chunks delivered and not yet consumed, by (sender rank, seq, tag); at most `window`
    /// per sender.
    inbox: HashMap<(usize, u64, u64), Arrived>,
    /// Links the peer closed (its QUIC connection closed on purpose, or its plaintext TCP link
    /// ended), by its rank, and how. A closed link is a lost member only once a call waits for
    /// a chunk from it that never came: a member that finished its last call and went away may
    /// have closed its links before this member took the chunks it had sent.
    closed: HashMap<usize, String>,
    /// Regions of a call's result that chunks, by (sender rank, seq, tag), land in straight
    /// from a plaintext link ([`Shared::expect_landing`]).
    landings: HashMap<(usize, u64, u64), Writable>,
    /// Calls below this seq ended here, each with every chunk sent to this member taken (every
    /// algorithm takes all it is sent): a chunk of one of them is one too many.
    ended_below: u64,
}

struct Arrived {
    call: Call,
    blob: Blob,
    answer: Answer,
}

/// How a delivered chunk is answered once consumed (or the group broke): the QUIC request's
/// response, or on the plaintext plane the sender's read credit given back.
enum Answer {
    Quic(Responder),
    Plain(tokio::sync::OwnedSemaphorePermit),
}

impl Answer {
    /// Gives the answer; a QUIC response is written on `runtime` (else this thread's).
    fn give(self, reply: Reply, header_max: u32, runtime: Option<&tokio::runtime::Handle>) {
        match self {
            Answer::Quic(responder) => respond_on(runtime, responder, reply, header_max),
            // The next chunk may be read; a sender learns of a failure from its `Abort`.
            Answer::Plain(permit) => drop(permit),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.end_links();
    }
}

impl Shared {
    fn new(
        epoch: u64,
        rank: usize,
        members: &[GroupMember],
        config: GroupConfig,
        header_max: u32,
    ) -> Self {
        Self {
            epoch,
            rank,
            nodes: members.iter().map(|m| m.node.clone()).collect(),
            addrs: members.iter().map(|m| m.addr).collect(),
            config,
            header_max,
            state: Mutex::new(GroupState::default()),
            arrived: Notify::new(),
            links: OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
            ops: tokio::sync::Mutex::new(0),
            telling: tokio::sync::watch::channel(false).0,
            unanswered: Unanswered::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether forming it completed here (every link up).
    fn is_formed(&self) -> bool {
        self.links.get().is_some()
    }

    /// Breaks this group, still forming here, with `err`, as one that a member formed and is
    /// re-forming: [`Mesh::form`] then returns it broken, for this member to re-form with the
    /// survivors. Whether it did (not if the forming had failed already).
    fn cut_short(&self, err: CollectiveError) -> bool {
        {
            let mut state = self.lock();
            if state.broken.is_some() {
                return false;
            }
            state.cut_short = true;
        }
        self.fail(err, false);
        true
    }

    /// The error that breaks this group, once it does.
    async fn until_broken(&self) -> CollectiveError {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(err) = self.lock().broken.clone() {
                return err;
            }
            arrived.await;
        }
    }

    /// Starts each link's sender (window-bounded) and its loss watcher; `conns` are the
    /// peers' connections in rank order, this member left out, each with its TCP stream on
    /// the plaintext plane (then chunks go over it, and a reader takes the peer's).
    fn start_links(&self, this: &Arc<Shared>, conns: Vec<(Connection, Option<TcpStream>)>) {
        let mut links = Vec::with_capacity(self.nodes.len());
        let mut tasks = Vec::new();
        let mut conns = conns.into_iter();
        for rank in 0..self.nodes.len() {
            if rank == self.rank {
                links.push(None);
                continue;
            }
            let Some((conn, stream)) = conns.next() else {
                break;
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let chunks_on_tcp = stream.is_some();
            let mut link_slots = None;
            match stream {
                Some(stream) => {
                    let (reader, writer) = stream.into_split();
                    let peer = self.nodes[rank].clone();
                    let (slots, replies) = super::plain::LinkSlots::new(&self.config);
                    link_slots = Some(slots.clone());
                    tasks.push(tokio::spawn(super::plain::send_loop(
                        Arc::downgrade(this),
                        peer.clone(),
                        writer,
                        rx,
                        self.unanswered.clone(),
                        slots.clone(),
                        replies,
                    )));
                    tasks.push(tokio::spawn(super::plain::read_loop(
                        Arc::downgrade(this),
                        rank,
                        peer,
                        reader,
                        self.config.window.max(1),
                        slots,
                    )));
                }
                None => tasks.push(tokio::spawn(send_loop(
                    Arc::downgrade(this),
                    conn.clone(),
                    rx,
                    self.config.window.max(1),
                    self.unanswered.clone(),
                ))),
            }
            let weak = Arc::downgrade(this);
            let watched = conn.clone();
            tasks.push(tokio::spawn(async move {
                let reason = watched.closed().await;
                if let Some(shared) = weak.upgrade() {
                    if watched.closed_locally() {
                        // This member is going away (its endpoint closed), not the peer: it
                        // blames no one, and its peers see its links close.
                        let epoch = shared.epoch;
                        shared.fail(CollectiveError::Stopped { epoch }, false);
                        shared.end_links();
                        return;
                    }
                    if watched.closed_by_peer() {
                        // The peer went away on purpose (its last call done, its process
                        // ending): lost only if a call waits for a chunk from it that never
                        // came (`GroupState::closed`). On the plaintext plane its chunks come
                        // over TCP, which may still hold some after QUIC closed: the TCP
                        // link's own end (after its last byte) says so there.
                        if !chunks_on_tcp {
                            shared.link_ended(rank, reason.to_string());
                        }
                        return;
                    }
                    shared.fail(
                        CollectiveError::MemberLost {
                            node: watched.peer().clone(),
                            epoch: shared.epoch,
                            reason: reason.to_string(),
                        },
                        true,
                    );
                }
            }));
            links.push(Some(Link {
                conn,
                out: tx,
                slots: link_slots,
            }));
        }
        let _ = self.links.set(links);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(tasks);
    }

    /// This member gives up the group in the middle of a call (its caller dropped the call):
    /// as a member that stops, it fails the group here with [`CollectiveError::Stopped`], tells
    /// the others it is lost ([`CollectiveError::MemberLost`] naming it: they need not wait
    /// for its next chunk to find out), and ends its links. A chunk of theirs held here is
    /// answered with `Stopped`, which they take for its loss too. Runs in drops, on any
    /// thread: the answers and the `Abort` go out on the group's own runtime.
    pub(crate) fn abandon(&self) {
        let gone = CollectiveError::MemberLost {
            node: self.nodes[self.rank].clone(),
            epoch: self.epoch,
            reason: "it gave up a call before the call ended".into(),
        };
        self.break_with(CollectiveError::Stopped { epoch: self.epoch }, Some(gone));
        self.end_links();
    }

    /// Stops every link's tasks: their TCP streams on the plaintext plane close, so that
    /// peers see this member go (as they see its QUIC connections close).
    fn end_links(&self) {
        for task in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            task.abort();
        }
    }

    /// Queues a chunk for `to` (never waits: the link's sender applies the window).
    pub(crate) fn send(&self, to: usize, seq: u64, tag: u64, call: &Call, blob: impl Into<Blob>) {
        if let Some(Some(link)) = self.links.get().and_then(|l| l.get(to)) {
            let mut blob = blob.into();
            if !self.config.plaintext && !matches!(blob, Blob::Bytes(_)) {
                // QUIC takes bytes of their own: copied now, on the caller's thread, so that
                // no queue holds the input or the result (which the call would wait for).
                match blob.into_bytes() {
                    Ok(bytes) => blob = Blob::Bytes(bytes),
                    Err(err) => {
                        self.fail(err, true);
                        return;
                    }
                }
            }
            self.unanswered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // A closed queue means the group is broken or the link ended; the caller learns it
            // on its next wait.
            let queued = link.out.send(Outgoing {
                seq,
                tag,
                call: call.clone(),
                blob,
            });
            if queued.is_err() {
                self.unanswered
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// Waits for the chunk `tag` of call `seq` from `from`, `bytes` long; answers its request.
    pub(crate) async fn recv(
        &self,
        from: usize,
        seq: u64,
        tag: u64,
        call: &Call,
        bytes: usize,
    ) -> Result<Bytes, CollectiveError> {
        self.recv_blob(from, seq, tag, call, bytes)
            .await?
            .into_bytes()
    }

    /// [`Shared::recv`], the chunk where it is: in its own bytes, or already in its place in
    /// the result if a region was expected for it ([`Shared::expect_landing`]).
    pub(crate) async fn recv_blob(
        &self,
        from: usize,
        seq: u64,
        tag: u64,
        call: &Call,
        bytes: usize,
    ) -> Result<Blob, CollectiveError> {
        let deadline = Instant::now() + self.config.op_timeout;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let found = {
                let mut state = self.lock();
                if let Some(err) = &state.broken {
                    return Err(err.clone());
                }
                let other = state
                    .inbox
                    .iter()
                    .find(|((_, s, _), a)| *s == seq && a.call != *call)
                    .map(|((r, _, _), a)| (*r, a.call.clone()));
                if let Some((rank, theirs)) = other {
                    drop(state);
                    return Err(self.fail(self.mismatch(seq, call, rank, &theirs), true));
                }
                let found = state.inbox.remove(&(from, seq, tag));
                if found.is_none() {
                    if let Some(reason) = state.closed.get(&from).cloned() {
                        drop(state);
                        let err = CollectiveError::MemberLost {
                            node: self.nodes[from].clone(),
                            epoch: self.epoch,
                            reason,
                        };
                        return Err(self.fail(err, true));
                    }
                }
                found
            };
            if let Some(arrived) = found {
                arrived
                    .answer
                    .give(Reply::Ack, self.header_max, self.runtime.as_ref());
                if arrived.blob.len() != bytes {
                    let err = CollectiveError::Link {
                        node: self.nodes[from].clone(),
                        epoch: self.epoch,
                        reason: format!(
                            "call {seq}: a chunk of {} bytes where {bytes} were due",
                            arrived.blob.len()
                        ),
                    };
                    return Err(self.fail(err, true));
                }
                return Ok(arrived.blob);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let err = CollectiveError::PeerTimeout {
                    epoch: self.epoch,
                    seq,
                    node: self.nodes[from].clone(),
                    timeout_ms: u64::try_from(self.config.op_timeout.as_millis())
                        .unwrap_or(u64::MAX),
                };
                return Err(self.fail(err, true));
            }
        }
    }

    /// Breaks the group with `err` unless it is already broken (the first error wins and is
    /// returned); answers every held chunk; with `propagate`, tells every member.
    pub(crate) fn fail(&self, err: CollectiveError, propagate: bool) -> CollectiveError {
        let told = propagate.then(|| err.clone());
        self.break_with(err, told)
    }

    /// [`Shared::fail`], telling every member `told` (if any) where that differs from the
    /// error here.
    fn break_with(&self, err: CollectiveError, told: Option<CollectiveError>) -> CollectiveError {
        let held: Vec<Arrived> = {
            let mut state = self.lock();
            if let Some(first) = &state.broken {
                return first.clone();
            }
            state.broken = Some(err.clone());
            if told.is_some() {
                // Set before anyone can see the group broken, so that `told` waits for it.
                self.telling.send_replace(true);
            }
            state.landings.clear();
            state.inbox.drain().map(|(_, a)| a).collect()
        };
        for arrived in held {
            arrived.answer.give(
                Reply::Broken(err.clone()),
                self.header_max,
                self.runtime.as_ref(),
            );
        }
        self.arrived.notify_waiters();
        if let Some(told) = told {
            self.tell(told);
        }
        err
    }

    /// Sends every member an `Abort` carrying `err`, on the group's runtime (best effort: a
    /// member that does not hear it finds the failure itself); [`Shared::told`] waits for it.
    fn tell(&self, err: CollectiveError) {
        let abort = Wire::Abort {
            epoch: self.epoch,
            error: err,
        };
        let Ok(frame) = Frame::encode(&abort, Vec::new(), self.header_max) else {
            self.telling.send_replace(false);
            return;
        };
        let sends: Vec<_> = self
            .links
            .get()
            .into_iter()
            .flatten()
            .flatten()
            .map(|link| {
                let (conn, frame) = (link.conn.clone(), frame.clone());
                async move {
                    let _ = conn.request_within(frame, ABORT_TIMEOUT).await;
                }
            })
            .collect();
        // Done telling when the sends end, or when the task is dropped unrun (its runtime
        // shutting down): `told` never waits for a task that will not run.
        let done = TellingDone(self.telling.clone());
        let runtime = self.runtime.clone();
        match runtime.or_else(|| tokio::runtime::Handle::try_current().ok()) {
            Some(runtime) => {
                runtime.spawn(async move {
                    futures::future::join_all(sends).await;
                    drop(done);
                });
            }
            None => drop(done),
        }
    }

    /// Waits (at most [`ABORT_TIMEOUT`]) until every member heard this member's `Abort`, if it
    /// sent one. An operation that failed returns only after this, so that whatever this
    /// member does next (dropping the group, re-forming, exiting) cannot reach a survivor
    /// before the failure's cause does: a survivor whose message this member drops as its
    /// operation ends is already broken with the real cause, and never takes the drop for
    /// this member's loss.
    pub(crate) async fn told(&self) {
        let mut telling = self.telling.subscribe();
        let _ = tokio::time::timeout(ABORT_TIMEOUT, telling.wait_for(|busy| !*busy)).await;
    }

    fn deliver(
        &self,
        peer: &NodeId,
        seq: u64,
        tag: u64,
        call: Call,
        blob: Bytes,
        responder: Responder,
    ) {
        let Some(from) = self.nodes.iter().position(|n| n == peer) else {
            return respond(
                responder,
                Reply::Refused {
                    current: self.epoch,
                    detail: format!(" and {peer} is not a member of it"),
                },
                self.header_max,
            );
        };
        self.hold(from, seq, tag, call, blob.into(), Answer::Quic(responder));
    }

    /// Lets chunk `tag` of call `seq` from `from` be received straight into `region` (on the
    /// plaintext plane; a chunk that comes otherwise is copied there by whoever takes it
    /// back with [`Shared::take_landing`]).
    pub(crate) fn expect_landing(&self, from: usize, seq: u64, tag: u64, region: Writable) {
        self.lock().landings.insert((from, seq, tag), region);
    }

    /// The region expected for chunk `tag` of call `seq` from `from`, if it is still free.
    pub(crate) fn take_landing(&self, from: usize, seq: u64, tag: u64) -> Option<Writable> {
        self.lock().landings.remove(&(from, seq, tag))
    }

    /// Call `seq` ended here with its result: every chunk sent to this member for it was
    /// taken, so a later one is a sender's fault ([`Shared::deliver_plain`] and the QUIC path
    /// refuse it).
    pub(crate) fn call_ended(&self, seq: u64) {
        let mut state = self.lock();
        state.ended_below = state.ended_below.max(seq + 1);
    }

    /// Forgets every region expected for call `seq` (the call is over).
    pub(crate) fn clear_landings(&self, seq: u64) {
        self.lock().landings.retain(|(_, s, _), _| *s != seq);
    }

    /// The peer of rank `from` closed its link (`reason`) after delivering what it delivered:
    /// a call that waits for a chunk from it that is not in the inbox fails with
    /// [`CollectiveError::MemberLost`] (see `GroupState::closed`).
    pub(crate) fn link_ended(&self, from: usize, reason: String) {
        {
            let mut state = self.lock();
            if state.broken.is_some() {
                return;
            }
            state.closed.insert(from, reason);
        }
        self.arrived.notify_waiters();
    }

    /// Takes a chunk of the plaintext plane from the member of rank `from`; `credit` is the
    /// sender's read credit, given back when the chunk is consumed.
    pub(crate) fn deliver_plain(
        &self,
        from: usize,
        seq: u64,
        tag: u64,
        call: Call,
        blob: Blob,
        credit: tokio::sync::OwnedSemaphorePermit,
    ) {
        self.hold(from, seq, tag, call, blob, Answer::Plain(credit));
    }

    /// Puts a delivered chunk in the inbox (answered at once if the group is broken).
    fn hold(&self, from: usize, seq: u64, tag: u64, call: Call, blob: Blob, answer: Answer) {
        let mut state = self.lock();
        if let Some(err) = &state.broken {
            let err = err.clone();
            drop(state);
            return answer.give(Reply::Broken(err), self.header_max, self.runtime.as_ref());
        }
        // A sender sends each chunk once (no layer below retries a chunk): a second copy, or
        // one of a call that ended here, is the sender's fault, named as such, not a
        // confusion in a result nor a chunk held for good.
        let fault = if state.inbox.contains_key(&(from, seq, tag)) {
            Some(format!("it sent chunk {tag:#x} of call {seq} twice"))
        } else if seq < state.ended_below {
            Some(format!(
                "it sent chunk {tag:#x} of call {seq} after that call ended here"
            ))
        } else {
            None
        };
        if let Some(reason) = fault {
            drop(state);
            let err = self.fail(
                CollectiveError::Link {
                    node: self.nodes[from].clone(),
                    epoch: self.epoch,
                    reason,
                },
                true,
            );
            return answer.give(Reply::Broken(err), self.header_max, self.runtime.as_ref());
        }
        state
            .inbox
            .insert((from, seq, tag), Arrived { call, blob, answer });
        drop(state);
        self.arrived.notify_waiters();
    }

    pub(crate) fn mismatch(
        &self,
        seq: u64,
        ours: &Call,
        rank: usize,
        theirs: &Call,
    ) -> CollectiveError {
        let (mut expected, mut got) = (ours.to_string(), theirs.to_string());
        if expected == got {
            (expected, got) = (format!("{ours:#}"), format!("{theirs:#}"));
        }
        let (reporter, node) = (&self.nodes[self.rank], &self.nodes[rank]);
        CollectiveError::Mismatch {
            seq,
            node: node.clone(),
            calls: format!("{node} called {got}, {reporter} called {expected}"),
        }
    }

    /// Takes a peer's answer to one of our chunks. A refusal that a live peer gives once its
    /// own operation ended (it dropped the chunk unanswered, or its group of our epoch is gone
    /// or superseded) may be the trace of a failure elsewhere whose `Abort` is still on its
    /// way: the peer is blamed only if no such cause arrives within [`ABORT_TIMEOUT`], so that
    /// every survivor names the member that was really lost.
    async fn on_reply(&self, peer: &NodeId, reply: Result<Frame, LinkError>) {
        let err = match reply {
            Ok(frame) => match frame.decode::<Reply>(self.header_max) {
                Ok(Reply::Ack) => return,
                Ok(Reply::Refused { current, detail }) => {
                    if current >= self.epoch {
                        self.cause_within(ABORT_TIMEOUT).await;
                    }
                    CollectiveError::EpochRefused {
                        node: peer.clone(),
                        epoch: self.epoch,
                        current,
                        detail,
                    }
                }
                // A peer that stopped (its own endpoint closed) is the member lost.
                Ok(Reply::Broken(CollectiveError::Stopped { .. })) => CollectiveError::MemberLost {
                    node: peer.clone(),
                    epoch: self.epoch,
                    reason: "it stopped".into(),
                },
                Ok(Reply::Broken(err)) => return drop(self.fail(err, false)),
                Ok(other @ (Reply::Joining | Reply::Entered { .. } | Reply::Joined { .. })) => {
                    CollectiveError::Link {
                        node: peer.clone(),
                        epoch: self.epoch,
                        reason: format!("it answered a chunk with {other:?}"),
                    }
                }
                Err(e) => CollectiveError::Link {
                    node: peer.clone(),
                    epoch: self.epoch,
                    reason: format!("its answer does not decode: {e}"),
                },
            },
            Err(LinkError::ConnectionLost { .. }) if self.closed_locally(peer) => {
                // This member is going away, not the peer (as the links' watchers judge).
                return drop(self.fail(CollectiveError::Stopped { epoch: self.epoch }, false));
            }
            Err(LinkError::ConnectionLost { reason, .. }) => CollectiveError::MemberLost {
                node: peer.clone(),
                epoch: self.epoch,
                reason,
            },
            // Only a member going away drops a chunk unanswered (its process or group ends),
            // which a survivor does after an abort: wait for that abort's cause first.
            Err(LinkError::Rejected {
                reason: RejectReason::NoResponse,
                ..
            }) => {
                self.cause_within(ABORT_TIMEOUT).await;
                CollectiveError::MemberLost {
                    node: peer.clone(),
                    epoch: self.epoch,
                    reason: "it dropped our message unanswered (shutting down)".into(),
                }
            }
            Err(e) => CollectiveError::Link {
                node: peer.clone(),
                epoch: self.epoch,
                reason: e.to_string(),
            },
        };
        self.fail(err, true);
    }

    /// Whether this side closed its link to `peer` (its endpoint is closing).
    fn closed_locally(&self, peer: &NodeId) -> bool {
        let rank = self.nodes.iter().position(|n| n == peer);
        let link = rank.and_then(|r| self.links.get()?.get(r)?.as_ref());
        link.is_some_and(|l| l.conn.closed_locally())
    }

    /// Waits at most `budget` for the group to break by another cause (an `Abort` from a
    /// member, a link's loss seen here).
    async fn cause_within(&self, budget: Duration) {
        let deadline = Instant::now() + budget;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if self.lock().broken.is_some() {
                return;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return;
            }
        }
    }
}

/// Sends a link's queued chunks in order, at most `window` unanswered at once.
async fn send_loop(
    group: Weak<Shared>,
    conn: Connection,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
    window: usize,
    unanswered: Unanswered,
) {
    let window = Arc::new(Semaphore::new(window));
    while let Some(out) = queue.recv().await {
        let Ok(permit) = window.clone().acquire_owned().await else {
            break;
        };
        let Some(shared) = group.upgrade() else { break };
        let data = Wire::Data {
            epoch: shared.epoch,
            seq: out.seq,
            tag: out.tag,
            call: out.call,
        };
        let encoded = out.blob.into_bytes().and_then(|blob| {
            Frame::encode(&data, vec![blob], shared.header_max)
                .map_err(|e| CollectiveError::Tensor(format!("encoding a chunk: {e}")))
        });
        let frame = match encoded {
            Ok(frame) => frame,
            Err(err) => {
                shared.fail(err, true);
                break;
            }
        };
        let timeout = shared.config.op_timeout;
        drop(shared);
        let (conn, group, unanswered) = (conn.clone(), group.clone(), unanswered.clone());
        tokio::spawn(async move {
            let reply = conn.request_within(frame, timeout).await;
            drop(permit);
            unanswered.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(shared) = group.upgrade() {
                shared.on_reply(conn.peer(), reply).await;
            }
        });
    }
}

fn respond(responder: Responder, reply: Reply, header_max: u32) {
    respond_on(None, responder, reply, header_max);
}

/// Writes `reply` on `runtime`, else on this thread's; with neither (a call dropped where no
/// runtime runs, of a group formed outside one) the request goes unanswered, which its sender
/// takes for this member going away.
fn respond_on(
    runtime: Option<&tokio::runtime::Handle>,
    responder: Responder,
    reply: Reply,
    header_max: u32,
) {
    let frame = match Frame::encode(&reply, Vec::new(), header_max) {
        Ok(frame) => frame,
        Err(_) => return responder.reject(RejectReason::ResponseFailed),
    };
    match runtime
        .cloned()
        .or_else(|| tokio::runtime::Handle::try_current().ok())
    {
        Some(runtime) => {
            runtime.spawn(async move {
                // A requester that is gone needs no answer.
                let _ = responder.respond(frame).await;
            });
        }
        None => drop(responder),
    }
}

/// Pause between dials of a member that is not listening yet.
const DIAL_RETRY: Duration = Duration::from_millis(100);
/// How often a member still waiting for a peer's join asks whether the peer still forms that
/// epoch ([`Wire::StillForming`]), and how long each ask may take.
const STILL_FORMING_EVERY: Duration = Duration::from_secs(1);
/// How often a joiner asks again to be admitted ([`Mesh::join_live`]).
pub const ENTER_REPEAT: Duration = Duration::from_secs(1);
/// How long a member keeps a joiner as pending after its last `Enter`: a few of its repeats,
/// so that a joiner that went away is not admitted (which would fail the admission).
pub const PENDING_FRESH: Duration = Duration::from_secs(3);
/// How often [`ProcessGroup::flush`] looks again.
const FLUSH_POLL: Duration = Duration::from_millis(5);
/// Bound on telling a member that the group failed.
const ABORT_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_transport::TransportConfig;

    /// Two members of epoch 1 over QUIC on loopback, with their endpoints.
    async fn pair() -> (Vec<Endpoint>, Vec<ProcessGroup>) {
        let formed = loopback_group(2, TransportConfig::for_tests(), GroupConfig::for_tests());
        tokio::time::timeout(Duration::from_secs(30), formed)
            .await
            .expect("formed in time")
            .unwrap()
    }

    /// The description of an f32 call of `op` over a tensor of `dims`.
    fn f32_call(op: super::super::wire::CallOp, dims: Vec<u64>) -> Call {
        Call {
            op,
            element: super::super::element::Element::F32,
            dims,
            parts: 0,
            chunk_bytes: 1024,
            small_bytes_max: 1024,
        }
    }

    /// Delivers a 4-byte chunk `tag` of call `seq` from rank 1 to `shared` as the plaintext
    /// plane's reader would, with a read credit of `credits`.
    fn deliver_from_rank_1(
        shared: &Shared,
        seq: u64,
        tag: u64,
        call: Call,
        credits: &Arc<tokio::sync::Semaphore>,
    ) {
        let credit = credits.clone().try_acquire_owned().unwrap();
        let blob = Blob::Bytes(Bytes::from_static(&[0; 4]));
        shared.deliver_plain(1, seq, tag, call, blob, credit);
    }

    /// A chunk that arrives twice while the first copy still waits to be taken fails the group
    /// with a link error naming the sender, for this member and the others alike (the check
    /// is on the inbox's key, whatever the chunk carries: on the plaintext plane the first copy
    /// may lie in its region of the result, which the second would otherwise have claimed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_sent_twice_fails_the_group_naming_its_sender() {
        let (_endpoints, groups) = pair().await;
        let shared = &groups[0].shared;
        let call = f32_call(super::super::wire::CallOp::AllGather, vec![1]);
        let credits = Arc::new(tokio::sync::Semaphore::new(2));
        for _ in 0..2 {
            deliver_from_rank_1(shared, 0, 7, call.clone(), &credits);
        }
        let expected = |err: &CollectiveError| {
            matches!(err, CollectiveError::Link { node, epoch: 1, reason }
                if *node == NodeId::new("worker", 1) && reason.contains("twice"))
        };
        let broken = groups[0].broken().expect("broken");
        assert!(expected(&broken), "{broken}");
        // Both copies' credits came back: the link's reader is not held up.
        assert_eq!(credits.available_permits(), 2);
        // The sender hears it too.
        let deadline = Instant::now() + Duration::from_secs(10);
        while groups[1].broken().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let told = groups[1].broken().expect("the other member was told");
        assert!(expected(&told), "{told}");
    }

    /// A chunk of a call that ended here (every chunk it was sent taken) fails the group with a
    /// link error naming the sender, instead of waiting in the inbox for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_of_a_call_that_ended_fails_the_group_naming_its_sender() {
        let (_endpoints, groups) = pair().await;
        let t = candle_core::Tensor::ones(1000, candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap();
        let sums = futures::future::join_all(
            groups
                .iter()
                .map(|g| g.all_reduce(super::super::Reduction::Sum, &t)),
        );
        for sum in tokio::time::timeout(Duration::from_secs(30), sums)
            .await
            .expect("summed in time")
        {
            sum.unwrap();
        }
        assert!(groups[0].broken().is_none());
        let sum = super::super::wire::CallOp::AllReduce(super::super::Reduction::Sum);
        let credits = Arc::new(tokio::sync::Semaphore::new(1));
        deliver_from_rank_1(&groups[0].shared, 0, 0, f32_call(sum, vec![1000]), &credits);
        let broken = groups[0].broken().expect("broken");
        assert!(
            matches!(&broken, CollectiveError::Link { node, reason, .. }
                if *node == NodeId::new("worker", 1) && reason.contains("ended")),
            "{broken}"
        );
        assert_eq!(credits.available_permits(), 1);
    }

    /// A member knows which process of each peer it formed its group with: an ask to join
    /// from that very process (sent before it formed the group, delivered however late) is
    /// ignored and the group goes on; one from another process of that peer is its restart,
    /// which fails the group at once and leaves the new process pending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_enter_from_a_members_own_process_is_stale_and_from_another_is_its_restart() {
        let (_endpoints, groups) = pair().await;
        let peer = NodeId::new("worker", 1);
        let addr = groups[1].mesh.local_addr().unwrap().to_string();
        let own = groups[1].mesh.incarnation();
        let inner = &groups[0].mesh.inner;
        assert_eq!(inner.lock().processes.get(&peer), Some(&own));
        // Later than any time window would have allowed.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let reply = inner.entered(&peer, &addr, own);
        assert!(
            matches!(
                reply,
                Reply::Entered {
                    epoch: 1,
                    formed: true
                }
            ),
            "{reply:?}"
        );
        assert!(groups[0].broken().is_none(), "a stale ask broke the group");
        assert!(!inner.lock().pending.contains_key(&peer));

        let restarted = Incarnation::random();
        let reply = inner.entered(&peer, &addr, restarted);
        assert!(
            matches!(
                reply,
                Reply::Entered {
                    epoch: 1,
                    formed: true
                }
            ),
            "{reply:?}"
        );
        let broken = groups[0]
            .broken()
            .expect("a new process of a member breaks the group");
        assert!(
            matches!(&broken, CollectiveError::MemberLost { node, epoch: 1, reason }
                if *node == peer && reason.contains(&restarted.to_string())),
            "{broken}"
        );
        let state = inner.lock();
        let pending = state
            .pending
            .get(&peer)
            .expect("the new process is pending");
        assert_eq!(pending.incarnation, restarted);
    }
}
