//! The state of one formed group shared by its handles, its link tasks and the mesh: the
//! links and their send windows, the inbox of chunks, and how the group breaks and tells it.

use super::*;
use crate::collective::plain::LinkOwner;

/// The state of one formed group, shared by its handles, its link tasks and the mesh.
pub(crate) struct Shared {
    pub(crate) generation: u64,
    pub(crate) rank: usize,
    pub(crate) nodes: Vec<NodeId>,
    pub(super) addrs: Vec<SocketAddr>,
    pub(crate) config: GroupConfig,
    pub(crate) header_max: u32,
    pub(super) state: Mutex<GroupState>,
    /// Signalled when a chunk arrives or the group breaks.
    pub(super) arrived: Notify,
    pub(super) links: OnceLock<Vec<Option<Link>>>,
    pub(super) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The next operation's sequence number; held for the whole operation.
    pub(crate) ops: tokio::sync::Mutex<u64>,
    /// Whether this member is still telling the others how the group broke (see
    /// [`Shared::told`]).
    pub(super) telling: tokio::sync::watch::Sender<bool>,
    pub(super) unanswered: Unanswered,
    /// The runtime the group was formed on, which drives its links: answers and aborts sent
    /// from any thread (a call dropped where no runtime runs) go out there.
    pub(super) runtime: Option<tokio::runtime::Handle>,
}

/// Marks this member done telling the others how the group broke, when dropped.
pub(super) struct TellingDone(pub(super) tokio::sync::watch::Sender<bool>);

impl Drop for TellingDone {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

pub(super) struct Link {
    pub(super) conn: Connection,
    pub(super) out: mpsc::UnboundedSender<Outgoing>,
    /// The plaintext plane's shared-memory slots with this peer, on that plane.
    pub(super) slots: Option<Arc<crate::collective::plain::LinkSlots>>,
    /// On the plaintext plane, where a flush asks the link's sender to say once the peer
    /// acknowledged every byte written to it ([`crate::collective::plain::Drains`]).
    pub(super) drains: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
}

#[derive(Default)]
pub(super) struct GroupState {
    pub(super) broken: Option<CollectiveError>,
    /// Whether a member that formed this group's generation with this process is re-forming it
    /// while this process still formed it ([`Shared::cut_short`]).
    pub(super) cut_short: bool,
    /// Chunks delivered and not yet consumed, by (sender rank, seq, tag); at most `window`
    /// per sender.
    pub(super) inbox: HashMap<(usize, u64, u64), Arrived>,
    /// Links the peer closed (its QUIC connection closed on purpose, or its plaintext TCP link
    /// ended), by its rank, and how. A closed link is a lost member only once a call waits for
    /// a chunk from it that never came: a member that finished its last call and went away may
    /// have closed its links before this member took the chunks it had sent.
    pub(super) closed: HashMap<usize, String>,
    /// Regions of a call's result that chunks, by (sender rank, seq, tag), land in straight
    /// from a plaintext link ([`Shared::expect_landing`]).
    pub(super) landings: HashMap<(usize, u64, u64), Writable>,
    /// Calls below this seq ended here, each with every chunk sent to this member taken (every
    /// algorithm takes all it is sent): a chunk of one of them is one too many.
    pub(super) ended_below: u64,
}

pub(super) struct Arrived {
    pub(super) call: Call,
    pub(super) blob: Blob,
    pub(super) answer: Answer,
}

/// How a delivered chunk is answered once consumed (or the group broke): the QUIC request's
/// response, or on the plaintext plane the sender's read credit given back.
pub(super) enum Answer {
    Quic(Responder),
    Plain(tokio::sync::OwnedSemaphorePermit),
}

impl Answer {
    /// Gives the answer; a QUIC response is written on `runtime` (else this thread's).
    pub(super) fn give(
        self,
        reply: Reply,
        header_max: u32,
        runtime: Option<&tokio::runtime::Handle>,
    ) {
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
    pub(super) fn new(
        generation: u64,
        rank: usize,
        members: &[GroupMember],
        config: GroupConfig,
        header_max: u32,
    ) -> Self {
        Self {
            generation,
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

    pub(super) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether forming it completed here (every link up).
    pub(super) fn is_formed(&self) -> bool {
        self.links.get().is_some()
    }

    /// What the membership machine is told of this group ([`GroupView`]).
    pub(super) fn view(&self) -> GroupView<'_> {
        let state = self.lock();
        GroupView {
            generation: self.generation,
            nodes: &self.nodes,
            formed: self.is_formed(),
            broken: state.broken.is_some(),
            trained: state.ended_below > 0,
        }
    }

    /// Breaks this group, still forming here, with `err`, as one that a member formed and is
    /// re-forming: [`Mesh::form`] then returns it broken, for this member to re-form with the
    /// survivors. Whether it did (not if the forming had failed already).
    pub(super) fn cut_short(&self, err: CollectiveError) -> bool {
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
    pub(super) async fn until_broken(&self) -> CollectiveError {
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
    pub(super) fn start_links(
        &self,
        this: &Arc<Shared>,
        conns: Vec<(Connection, Option<TcpStream>)>,
    ) {
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
            let mut drains = None;
            match stream {
                Some(stream) => {
                    let (slots, drain_requests) =
                        self.start_plain_link(this, rank, stream, rx, &mut tasks);
                    link_slots = Some(slots);
                    drains = Some(drain_requests);
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
                        let generation = shared.generation;
                        shared.fail(CollectiveError::Stopped { generation }, false);
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
                            generation: shared.generation,
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
                drains,
            }));
        }
        let _ = self.links.set(links);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(tasks);
    }

    /// Starts the plaintext link with the member of `rank` over `stream`: its sender takes
    /// the chunks queued on `chunks`, its reader the peer's. Returns the link's shared-memory
    /// slots and where a flush asks its sender to drain.
    fn start_plain_link(
        &self,
        this: &Arc<Shared>,
        rank: usize,
        stream: TcpStream,
        chunks: mpsc::UnboundedReceiver<Outgoing>,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> (
        Arc<crate::collective::plain::LinkSlots>,
        mpsc::UnboundedSender<oneshot::Sender<()>>,
    ) {
        use crate::collective::plain::{read_loop, send_loop, LinkSlots, Outbox};
        let (reader, writer) = stream.into_split();
        let peer = self.nodes[rank].clone();
        let (slots, replies) = LinkSlots::new(&self.config);
        let (drain_requests, drains) = mpsc::unbounded_channel();
        let outbox = Outbox {
            chunks,
            unanswered: self.unanswered.clone(),
            drains,
        };
        tasks.push(tokio::spawn(send_loop(
            Arc::downgrade(this),
            peer.clone(),
            writer,
            outbox,
            slots.clone(),
            replies,
        )));
        tasks.push(tokio::spawn(read_loop(
            Arc::downgrade(this),
            rank,
            peer,
            reader,
            self.config.window.max(1),
            slots.clone(),
        )));
        (slots, drain_requests)
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
            generation: self.generation,
            reason: "it gave up a call before the call ended".into(),
        };
        self.break_with(
            CollectiveError::Stopped {
                generation: self.generation,
            },
            Some(gone),
        );
        self.end_links();
    }

    /// Stops every link's tasks: their TCP streams on the plaintext plane close, so that
    /// peers see this member go (as they see its QUIC connections close).
    pub(super) fn end_links(&self) {
        for task in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            task.abort();
        }
    }

    /// Asks each plaintext link's sender to say once the peer acknowledged every byte written
    /// to it so far (none on QUIC, whose chunks are answered by the peer already): an answer
    /// per link, dropped unanswered if the link ends first.
    pub(super) fn drained(&self) -> Vec<oneshot::Receiver<()>> {
        self.links
            .get()
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|link| {
                let (answer, answered) = oneshot::channel();
                link.drains.as_ref()?.send(answer).ok()?;
                Some(answered)
            })
            .collect()
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
                            generation: self.generation,
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
                        generation: self.generation,
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
                    generation: self.generation,
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
    pub(super) fn break_with(
        &self,
        err: CollectiveError,
        told: Option<CollectiveError>,
    ) -> CollectiveError {
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
    pub(super) fn tell(&self, err: CollectiveError) {
        let abort = Wire::Abort {
            generation: self.generation,
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

    pub(super) fn deliver(
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
                    current: self.generation,
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

    /// Puts a delivered chunk in the inbox (answered at once if the group is broken).
    pub(super) fn hold(
        &self,
        from: usize,
        seq: u64,
        tag: u64,
        call: Call,
        blob: Blob,
        answer: Answer,
    ) {
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
                    generation: self.generation,
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
    /// own operation ended (it dropped the chunk unanswered, or its group of our generation is gone
    /// or superseded) may be the trace of a failure elsewhere whose `Abort` is still on its
    /// way: the peer is blamed only if no such cause arrives within [`ABORT_TIMEOUT`], so that
    /// every survivor names the member that was really lost.
    pub(super) async fn on_reply(&self, peer: &NodeId, reply: Result<Frame, LinkError>) {
        let err = match reply {
            Ok(frame) => match frame.decode::<Reply>(self.header_max) {
                Ok(Reply::Ack) => return,
                Ok(Reply::Refused { current, detail }) => {
                    if current >= self.generation {
                        self.cause_within(ABORT_TIMEOUT).await;
                    }
                    CollectiveError::GenerationRefused {
                        node: peer.clone(),
                        generation: self.generation,
                        current,
                        detail,
                    }
                }
                // A peer that stopped (its own endpoint closed) is the member lost.
                Ok(Reply::Broken(CollectiveError::Stopped { .. })) => CollectiveError::MemberLost {
                    node: peer.clone(),
                    generation: self.generation,
                    reason: "it stopped".into(),
                },
                Ok(Reply::Broken(err)) => return drop(self.fail(err, false)),
                Ok(
                    other @ (Reply::Joining
                    | Reply::Unsettled
                    | Reply::Entered { .. }
                    | Reply::Joined { .. }),
                ) => CollectiveError::Link {
                    node: peer.clone(),
                    generation: self.generation,
                    reason: format!("it answered a chunk with {other:?}"),
                },
                Err(e) => CollectiveError::Link {
                    node: peer.clone(),
                    generation: self.generation,
                    reason: format!("its answer does not decode: {e}"),
                },
            },
            Err(LinkError::ConnectionLost { .. }) if self.closed_locally(peer) => {
                // This member is going away, not the peer (as the links' watchers judge).
                return drop(self.fail(
                    CollectiveError::Stopped {
                        generation: self.generation,
                    },
                    false,
                ));
            }
            Err(LinkError::ConnectionLost { reason, .. }) => CollectiveError::MemberLost {
                node: peer.clone(),
                generation: self.generation,
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
                    generation: self.generation,
                    reason: "it dropped our message unanswered (shutting down)".into(),
                }
            }
            Err(e) => CollectiveError::Link {
                node: peer.clone(),
                generation: self.generation,
                reason: e.to_string(),
            },
        };
        self.fail(err, true);
    }

    /// Whether this side closed its link to `peer` (its endpoint is closing).
    pub(super) fn closed_locally(&self, peer: &NodeId) -> bool {
        let rank = self.nodes.iter().position(|n| n == peer);
        let link = rank.and_then(|r| self.links.get()?.get(r)?.as_ref());
        link.is_some_and(|l| l.conn.closed_locally())
    }

    /// Waits at most `budget` for the group to break by another cause (an `Abort` from a
    /// member, a link's loss seen here).
    pub(super) async fn cause_within(&self, budget: Duration) {
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
pub(super) async fn send_loop(
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
            generation: shared.generation,
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

pub(super) fn respond(responder: Responder, reply: Reply, header_max: u32) {
    respond_on(None, responder, reply, header_max);
}

/// Writes `reply` on `runtime`, else on this thread's; with neither (a call dropped where no
/// runtime runs, of a group formed outside one) the request goes unanswered, which its sender
/// takes for this member going away.
pub(super) fn respond_on(
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

/// A plaintext link carries chunks for this group (`plain` names no group type).
impl crate::collective::plain::LinkOwner for Shared {
    fn generation(&self) -> u64 {
        self.generation
    }

    fn header_max(&self) -> u32 {
        self.header_max
    }

    fn fail(&self, err: CollectiveError, propagate: bool) -> CollectiveError {
        Shared::fail(self, err, propagate)
    }

    fn take_landing(&self, from: usize, seq: u64, tag: u64) -> Option<Writable> {
        Shared::take_landing(self, from, seq, tag)
    }

    /// Takes a chunk of the plaintext plane into the inbox; `credit` is the sender's read
    /// credit, given back when the chunk is consumed.
    fn deliver_plain(
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

    /// The peer closed its link after delivering what it delivered: a call that waits for a
    /// chunk from it that is not in the inbox fails with [`CollectiveError::MemberLost`] (see
    /// `GroupState::closed`).
    fn link_ended(&self, from: usize, reason: String) {
        {
            let mut state = self.lock();
            if state.broken.is_some() {
                return;
            }
            state.closed.insert(from, reason);
        }
        self.arrived.notify_waiters();
    }
}
