//! The plaintext data plane of a process group ([`GroupConfig::plaintext`]): a group's chunks
//! over TCP, for clusters inside a trusted network, as NCCL and gloo do. Off by default.
//!
//! Peers are authenticated over QUIC at setup, not on TCP: when a link of a generation forms, the
//! acceptor answers the dialer's `Join` (over QUIC, mutual TLS) with the port of its TCP
//! listener and a fresh random token; the dialer connects there and sends the token and the
//! generation first. The acceptor takes the connection as that peer's link of that generation only if
//! the token is one it issued for them (each token once); anything else is closed unread. After
//! that, tensors travel unencrypted and unauthenticated: anyone who can read or inject TCP
//! segments between the members can read or change them.
//!
//! A link's chunk frames: `u32` header length, the header (a bincode `Wire::Data`, as on
//! QUIC), `u64` blob length, the blob; both lengths bounded by the transport's frame limit.
//! Between two members on one host the blob is in shared memory instead (`shm.rs`): the blob
//! length carries [`IN_SLOT`] and a `u32` slot number follows in place of the blob. Between
//! chunk frames, never inside one, a link carries the shared-memory control frames, whose first
//! `u32` is one no header length can be: a segment offered ([`OFFER`]), the answer
//! ([`ANSWER`]), a slot given back ([`CREDIT`]). The receiver reads the next chunk frame only
//! while it holds fewer than the group's `window` unread chunks of that sender (TCP's own flow
//! control then holds the sender back), which is what a request's late answer does on QUIC;
//! control frames ahead of it are read whatever the window. A chunk whose region of the result
//! the call expects (an all-reduce's all-gather) is read straight into it (or copied there from
//! its slot), others into a buffer of their own (or left in their slot); a chunk that lies in
//! the caller's input or in the result is written from there (`landing.rs`), and an
//! all-reduce's intermediate sum whose partial lies in a slot is reduced straight into the
//! slot it goes in (`Blob::Sum`; computed aside first if no slot is free at once, so that a
//! ring of members never each hold a predecessor's slot while waiting for one of their own). A malformed frame
//! or a failed write of a chunk loses the member at once ([`CollectiveError::MemberLost`]); a
//! link the peer closed loses it when a call waits for a chunk from it that never came (a
//! member that finished its last call and exited closes its links before its peers took every
//! chunk it sent, as they are entitled to, and before it took their slots back). A chunk
//! counts as sent once the kernel took it, so a member's flush before it goes away also waits
//! until the peer acknowledged every byte of the link ([`Drains`]). The group's
//! control messages (`Abort`, probes) stay on QUIC.
//!
//! This module owns the listener, the handshake and a link's two loops; the group's
//! state machine stays in `group/`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use cohort_transport::{CodecError, Frame, NodeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::landing::{Blob, Writable};
use super::outgoing::{Outgoing, Unanswered};
use super::shm::{Borrower, Lender, Offer, Segment, SlotError};
use super::wire::{Call, Wire};
use super::{CollectiveError, GroupConfig};

/// Bytes a dialer sends first: the token (16) and the generation (8), little-endian.
const HELLO_BYTES: usize = 24;
/// How long an accepted connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A link's first `u32` where it is not a chunk header's length: a control frame. A slot
/// given back (`u32` slot).
const CREDIT: u32 = u32::MAX;
/// A segment offered (`u16` name length, the name, `u32` slots, `u64` slot bytes, `u128`
/// probe).
const OFFER: u32 = u32::MAX - 1;
/// The answer to an offer (`u8`: 1 taken, 0 not).
const ANSWER: u32 = u32::MAX - 2;
/// Set in a chunk's blob length when its payload is in a slot; the slot's `u32` follows.
const IN_SLOT: u64 = 1 << 63;
/// The least payload that goes through shared memory, where slots are larger than four times
/// this: a segment is made for a link only once a chunk this large goes over it, and smaller
/// chunks cost little on TCP. With smaller slots (a small `chunk_bytes`), a quarter of a slot.
const SLOT_MIN_BYTES: usize = 16 * 1024;
/// The longest segment name a peer may offer.
const NAME_MAX: usize = 64;
/// How long a chunk waits for a free slot before it goes over TCP instead (a receiver that
/// holds every slot while it waits for a later chunk never stalls the link for good).
const SLOT_WAIT: Duration = Duration::from_millis(20);
/// How often a link's sender looks again whether its peer acknowledged every byte written to
/// it, while a flush waits for that ([`Drains`]).
const DRAIN_POLL: Duration = Duration::from_millis(2);

/// A flush's requests to a link's sender: each is answered once the peer's kernel has
/// acknowledged every byte written to the link so far, or once the connection is closed (the
/// peer dropped the link: nothing more can be delivered, and nothing is waited for), or
/// dropped if the sender ends first.
///
/// A chunk written into the kernel is not yet the peer's: should this process exit with
/// unread bytes in the link's receive queue (a slot the peer gave back late), Linux resets the
/// connection and discards whatever it had not sent, and the peer's reader then sees the
/// link end while still owed that chunk. A member about to go away waits for these answers
/// ([`ProcessGroup::flush`](super::ProcessGroup::flush)), which the QUIC plane has in its
/// answers already.
pub(crate) type Drains = mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<()>>;

/// What the group hands a plaintext link's sender: the chunks queued for the peer, the
/// group's count of chunks not yet answered, and its flushes' requests.
pub(crate) struct Outbox {
    pub(crate) chunks: mpsc::UnboundedReceiver<Outgoing>,
    pub(crate) unanswered: Unanswered,
    pub(crate) drains: Drains,
}

/// What a plaintext link needs of the group it carries chunks for (the group's shared state
/// implements it), so that this module names no group type.
pub(crate) trait LinkOwner: Send + Sync + 'static {
    /// The group's generation (every chunk carries it).
    fn generation(&self) -> u64;
    /// The largest frame header the group reads.
    fn header_max(&self) -> u32;
    /// Breaks the group with `err` (told to the other members if `propagate`).
    fn fail(&self, err: CollectiveError, propagate: bool) -> CollectiveError;
    /// The region a chunk of call `seq` (its `tag`) from the member of rank `from` lands in,
    /// if its call gave one.
    fn take_landing(&self, from: usize, seq: u64, tag: u64) -> Option<Writable>;
    /// A chunk from the member of rank `from`; `credit` goes back to the sender once it is
    /// consumed.
    fn deliver_plain(
        &self,
        from: usize,
        seq: u64,
        tag: u64,
        call: Call,
        blob: Blob,
        credit: tokio::sync::OwnedSemaphorePermit,
    );
    /// The link from the member of rank `from` ended (`reason`).
    fn link_ended(&self, from: usize, reason: String);
}

/// A token the acceptor issued to one peer for one generation's link.
pub(crate) type Token = u128;

/// A fresh random token.
pub(crate) fn new_token() -> Token {
    rand::random::<u128>()
}

/// Binds this mesh's TCP listener on `ip` (any free port).
pub(crate) async fn bind(ip: std::net::IpAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::new(ip, 0)).await
}

/// Reads an accepted connection's hello: its token and generation, or `None` if it sends no
/// well-formed hello in time.
pub(crate) async fn read_hello(stream: &mut TcpStream) -> Option<(Token, u64)> {
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut hello))
        .await
        .ok()?
        .ok()?;
    let token = Token::from_le_bytes(hello[..16].try_into().ok()?);
    let generation = u64::from_le_bytes(hello[16..].try_into().ok()?);
    Some((token, generation))
}

/// Dials the acceptor's listener at `addr` by `deadline` and sends the hello.
pub(crate) async fn dial(
    addr: SocketAddr,
    token: Token,
    generation: u64,
    deadline: Instant,
) -> std::io::Result<TcpStream> {
    let connect = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut hello = [0u8; HELLO_BYTES];
        hello[..16].copy_from_slice(&token.to_le_bytes());
        hello[16..].copy_from_slice(&generation.to_le_bytes());
        stream.write_all(&hello).await?;
        Ok(stream)
    };
    match tokio::time::timeout_at(deadline, connect).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "not connected within the form timeout",
        )),
    }
}

/// What one link's two loops share: the shared-memory slots each way, once the two ends set
/// them up (`shm.rs`).
pub(crate) struct LinkSlots {
    /// Whether this member offers and takes segments ([`GroupConfig::shared_memory`]).
    enabled: bool,
    /// The slots of a segment this member makes, and their size.
    slots: u32,
    slot_bytes: usize,
    /// This member's segment: not made yet, offered, lent from, or not to be (refused, or it
    /// could not be made).
    out: Mutex<Outward>,
    /// Slots of the peer's segment to give back, and answers to its offer: the sender loop
    /// writes them ahead of its next chunk.
    credits: mpsc::UnboundedSender<u32>,
    answers: mpsc::UnboundedSender<bool>,
    /// Told when the peer gives a slot back.
    freed: tokio::sync::Notify,
}

/// Where a chunk's payload goes.
enum Lend {
    /// After its header on TCP (small, or no segment to lend from).
    Tcp,
    /// Every slot is lent.
    Full,
    /// Copied into this slot.
    Slot(u32),
}

enum Outward {
    None,
    Offered(Segment),
    Lending(Arc<Lender>),
    Off,
}

/// What a link's sender loop takes from its reader loop: slots to give back and answers.
pub(crate) struct Replies {
    credits: mpsc::UnboundedReceiver<u32>,
    answers: mpsc::UnboundedReceiver<bool>,
}

impl Replies {
    /// The next control frame to write: a slot given back, or an answer to an offer.
    async fn next(&mut self) -> Option<Vec<u8>> {
        tokio::select! {
            biased;
            Some(slot) = self.credits.recv() => {
                let mut frame = CREDIT.to_le_bytes().to_vec();
                frame.extend_from_slice(&slot.to_le_bytes());
                Some(frame)
            }
            Some(taken) = self.answers.recv() => {
                let mut frame = ANSWER.to_le_bytes().to_vec();
                frame.push(u8::from(taken));
                Some(frame)
            }
            else => None,
        }
    }
}

impl LinkSlots {
    pub(crate) fn new(config: &GroupConfig) -> (Arc<Self>, Replies) {
        let slot_bytes = config.chunk_bytes.max(config.small_bytes_max).max(1);
        let slots = super::shm::slots_within(config.window.max(1).saturating_mul(2), slot_bytes);
        let (credits, credits_rx) = mpsc::unbounded_channel();
        let (answers, answers_rx) = mpsc::unbounded_channel();
        let link = Arc::new(Self {
            enabled: config.shared_memory && slots >= 2,
            slots,
            slot_bytes,
            out: Mutex::new(Outward::None),
            credits,
            answers,
            freed: tokio::sync::Notify::new(),
        });
        let replies = Replies {
            credits: credits_rx,
            answers: answers_rx,
        };
        (link, replies)
    }

    /// The least chunk worth a slot (see [`SLOT_MIN_BYTES`]; never empty).
    fn slot_min(&self) -> usize {
        SLOT_MIN_BYTES.min(self.slot_bytes / 4).max(1)
    }

    /// Whether the peer took this member's segment (chunks worth a slot go through it).
    pub(crate) fn lending(&self) -> bool {
        matches!(*self.out(), Outward::Lending(_))
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Outward> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The offer frame to write before a chunk of `len` bytes, if this is the first chunk
    /// worth a segment (made now; where it cannot be, the link stays on TCP). Only the link's
    /// sender calls it, once per chunk, so nothing else moves the offer on meanwhile.
    async fn offer_before(&self, len: usize) -> Option<Vec<u8>> {
        if !self.enabled || len < self.slot_min() || !matches!(*self.out(), Outward::None) {
            return None;
        }
        // Reserving the segment's pages (up to its whole size) may take a while: off the
        // runtime's threads, which carry every link's chunks.
        let (slots, slot_bytes) = (self.slots, self.slot_bytes);
        let made = tokio::task::spawn_blocking(move || Segment::create(slots, slot_bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let mut out = self.out();
        if !matches!(*out, Outward::None) {
            return None;
        }
        let (segment, offer) = match made {
            Ok(made) => made,
            Err(e) => {
                tracing::debug!("no shared-memory segment for a plaintext link: {e}");
                *out = Outward::Off;
                return None;
            }
        };
        *out = Outward::Offered(segment);
        let mut frame = Vec::with_capacity(4 + 2 + offer.name.len() + 4 + 8 + 16);
        frame.extend_from_slice(&OFFER.to_le_bytes());
        frame.extend_from_slice(&(offer.name.len() as u16).to_le_bytes());
        frame.extend_from_slice(offer.name.as_bytes());
        frame.extend_from_slice(&offer.slots.to_le_bytes());
        frame.extend_from_slice(&offer.slot_bytes.to_le_bytes());
        frame.extend_from_slice(&offer.probe.to_le_bytes());
        Some(frame)
    }

    /// The slot `blob` was copied into, if the peer took this member's segment, the chunk is
    /// worth it and a slot is free.
    fn lend(&self, blob: &Blob) -> Result<Lend, CollectiveError> {
        if blob.len() < self.slot_min() {
            return Ok(Lend::Tcp);
        }
        let lender = match &*self.out() {
            Outward::Lending(lender) if blob.len() <= lender.segment().slot_bytes() => {
                lender.clone()
            }
            _ => return Ok(Lend::Tcp),
        };
        let slot = lender.lend_with(blob.len(), |out| blob.write_to(out))?;
        Ok(slot.map_or(Lend::Full, Lend::Slot))
    }

    /// The peer answered this member's offer.
    fn answered(&self, taken: bool) -> Result<(), MalformedFrame> {
        let mut out = self.out();
        match std::mem::replace(&mut *out, Outward::Off) {
            Outward::Offered(segment) if taken => {
                segment.unlink();
                *out = Outward::Lending(Arc::new(Lender::new(segment)));
                Ok(())
            }
            // Refused: the segment goes (its memory with it).
            Outward::Offered(_) => Ok(()),
            other => {
                *out = other;
                Err(MalformedFrame::UnaskedAnswer)
            }
        }
    }

    /// The peer gave `slot` back.
    fn give_back(&self, slot: u32) -> Result<(), MalformedFrame> {
        match &*self.out() {
            Outward::Lending(lender) => lender.give_back(slot)?,
            _ => return Err(MalformedFrame::CreditWithoutSegment { slot }),
        }
        // A permit if no chunk waits now: the next to find the slots full looks again.
        self.freed.notify_one();
        Ok(())
    }

    /// Takes the peer's `offer` if this member can map its segment: the borrower to read its
    /// slots from, or `None` (the answer, either way, goes back over the link).
    fn take(&self, offer: &Offer) -> Option<Arc<Borrower>> {
        let taken = if self.enabled {
            match Segment::open(offer) {
                Ok(segment) => Some(Borrower::new(segment, self.credits.clone())),
                Err(e) => {
                    tracing::debug!("a peer's shared-memory segment is not for this member: {e}");
                    None
                }
            }
        } else {
            None
        };
        let _ = self.answers.send(taken.is_some());
        taken
    }
}

/// Writes the chunks queued for one peer, in order, and ahead of them the slots and answers
/// its reader loop has for the peer; a write error loses the member.
pub(crate) async fn send_loop<G: LinkOwner>(
    group: Weak<G>,
    peer: NodeId,
    mut writer: OwnedWriteHalf,
    outbox: Outbox,
    link: Arc<LinkSlots>,
    mut replies: Replies,
) {
    let Outbox {
        chunks: mut queue,
        unanswered,
        mut drains,
    } = outbox;
    let lost = |e: std::io::Error| {
        if let Some(shared) = group.upgrade() {
            shared.fail(
                CollectiveError::MemberLost {
                    node: peer.clone(),
                    generation: shared.generation(),
                    reason: format!("its TCP link failed: {e}"),
                },
                true,
            );
        }
    };
    let mut sender = Sender {
        writer: &mut writer,
        link: &link,
        replies: &mut replies,
        peer: &peer,
    };
    // Flushes waiting for the peer to acknowledge what was written (answered, or dropped
    // with the loop if the link ends first).
    let mut draining = Vec::new();
    loop {
        tokio::select! {
            biased;
            Some(control) = sender.replies.next() => {
                if !sender.write_control(&control).await {
                    break;
                }
                // Each control frame restarts the poll's timer below: a steady stream of them
                // (slots given back to a peer still sending) would put the look off.
                if !draining.is_empty() {
                    sender.answer_drained(&mut draining);
                }
            }
            Some(request) = drains.recv() => {
                draining.push(request);
                sender.answer_drained(&mut draining);
            }
            () = tokio::time::sleep(DRAIN_POLL), if !draining.is_empty() => {
                sender.answer_drained(&mut draining);
            }
            out = queue.recv() => match out {
                Some(out) => {
                    if !sender.send_chunk(&group, &unanswered, out, &lost).await {
                        break;
                    }
                }
                None => break,
            },
        }
    }
    // Whatever is still queued will not be sent: it counts as unanswered no longer (a flush
    // does not wait for it), and the group's later sends find the queue closed.
    queue.close();
    while queue.try_recv().is_ok() {
        unanswered.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A link's writing side, as its sender loop runs it.
struct Sender<'a> {
    writer: &'a mut OwnedWriteHalf,
    link: &'a LinkSlots,
    replies: &'a mut Replies,
    peer: &'a NodeId,
}

impl Sender<'_> {
    /// Answers the flushes waiting in `draining` if the peer has acknowledged every byte
    /// written to the link.
    fn answer_drained(&self, draining: &mut Vec<tokio::sync::oneshot::Sender<()>>) {
        if unacknowledged(self.writer.as_ref()) == 0 {
            for request in draining.drain(..) {
                let _ = request.send(());
            }
        }
    }

    /// Writes a control frame; `false` if the link ended.
    async fn write_control(&mut self, control: &[u8]) -> bool {
        if let Err(e) = self.writer.write_all(control).await {
            // A slot given back or an answer to a peer that went away (its last call done,
            // its process gone): it needs neither. Were it still there, it would see this
            // link end (the writer drops with the loop) and lose this member only if it
            // waits for a chunk from it (`Shared::link_ended`).
            tracing::debug!(peer = %self.peer, "a plaintext link ended while giving back a slot: {e}");
            return false;
        }
        true
    }

    /// Where `blob` goes: a slot as soon as one is free, waiting at most [`SLOT_WAIT`] (its
    /// own control frames written meanwhile, so that two members waiting for each other's
    /// slots give them back); after that, TCP. `None` if the link ended meanwhile.
    ///
    /// A pending sum that finds no free slot is computed into bytes of its own first: it
    /// holds a slot of the previous member's, and a ring of members each waiting for a slot
    /// while holding the one its predecessor waits for would stall them all.
    async fn place(&mut self, blob: &mut Blob) -> Option<Result<Lend, CollectiveError>> {
        let lent = self.link.lend(blob);
        if !matches!(lent, Ok(Lend::Full)) {
            return Some(lent);
        }
        if matches!(blob, Blob::Sum(_)) {
            match std::mem::replace(blob, Blob::Bytes(Bytes::new())).into_bytes() {
                Ok(bytes) => *blob = Blob::Bytes(bytes),
                Err(e) => return Some(Err(e)),
            }
        }
        let deadline = Instant::now() + SLOT_WAIT;
        loop {
            tokio::select! {
                biased;
                Some(control) = self.replies.next() => {
                    if !self.write_control(&control).await {
                        return None;
                    }
                }
                () = self.link.freed.notified() => {
                    let lent = self.link.lend(blob);
                    if !matches!(lent, Ok(Lend::Full)) {
                        return Some(lent);
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Some(Ok(Lend::Tcp)),
            }
        }
    }

    /// Writes one chunk: its header, and its payload after it or in a slot. `false` if the
    /// link is done (the group went or broke, or the link ended).
    async fn send_chunk<G: LinkOwner>(
        &mut self,
        group: &Weak<G>,
        unanswered: &Unanswered,
        out: Outgoing,
        lost: &impl Fn(std::io::Error),
    ) -> bool {
        let Some(shared) = group.upgrade() else {
            return false;
        };
        let data = Wire::Data {
            generation: shared.generation(),
            seq: out.seq,
            tag: out.tag,
            call: out.call,
        };
        let header = match Frame::encode(&data, Vec::new(), shared.header_max()) {
            Ok(frame) => frame.header,
            Err(e) => {
                shared.fail(
                    CollectiveError::Tensor(format!("encoding a chunk: {e}")),
                    true,
                );
                return false;
            }
        };
        drop(shared);
        let len = out.blob.len();
        let mut prefix = self.link.offer_before(len).await.unwrap_or_default();
        let mut blob = out.blob;
        let Some(mut lent) = self.place(&mut blob).await else {
            unanswered.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            return false;
        };
        if !matches!(lent, Ok(Lend::Slot(_))) && matches!(blob, Blob::Sum(_)) {
            // A pending sum that goes over TCP is computed once, not at every partial write.
            match std::mem::replace(&mut blob, Blob::Bytes(Bytes::new())).into_bytes() {
                Ok(bytes) => blob = Blob::Bytes(bytes),
                Err(e) => lent = Err(e),
            }
        }
        prefix.extend_from_slice(&(header.len() as u32).to_le_bytes());
        prefix.extend_from_slice(&header);
        if let Ok(Lend::Slot(slot)) = lent {
            prefix.extend_from_slice(&(len as u64 | IN_SLOT).to_le_bytes());
            prefix.extend_from_slice(&slot.to_le_bytes());
        } else {
            prefix.extend_from_slice(&(len as u64).to_le_bytes());
        }
        let writer = &mut *self.writer;
        let written = async {
            let lent = lent.map_err(Unsent::Blob)?;
            writer.write_all(&prefix).await.map_err(Unsent::Link)?;
            match (&blob, lent) {
                (_, Lend::Slot(_)) => Ok(()),
                (Blob::Bytes(bytes), _) => writer.write_all(bytes).await.map_err(Unsent::Link),
                (in_place, _) => write_in_place(writer, in_place).await,
            }
        }
        .await;
        unanswered.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        drop(blob);
        match written {
            Ok(()) => true,
            Err(Unsent::Blob(err)) => {
                if let Some(shared) = group.upgrade() {
                    shared.fail(err, true);
                }
                false
            }
            Err(Unsent::Link(e)) => {
                lost(e);
                false
            }
        }
    }
}

/// Bytes written to `stream` that its peer has not acknowledged yet (Linux's `SIOCOUTQ`):
/// what a reset of the connection would discard. 0 where nothing more will be delivered over
/// it: a connection that was reset or closed (the peer dropped the link after its last call,
/// and bytes written after that, a slot given back say, are never acknowledged: the kernel's
/// count of them stays), a socket that failed, or a count that cannot be read (another
/// platform).
#[allow(unsafe_code)]
fn unacknowledged(stream: &TcpStream) -> usize {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        /// `TCP_CLOSE` of Linux's `include/net/tcp_states.h`: the state a reset or a
        /// finished close leaves the connection in.
        const TCP_CLOSE: u8 = 7;
        let fd = stream.as_raw_fd();
        // `tcp_info`'s first byte is the connection's state; the kernel copies as many bytes
        // of it as asked.
        let mut state: u8 = 0;
        let mut len = std::mem::size_of::<u8>() as libc::socklen_t;
        // SAFETY: the descriptor is the open socket `stream` borrows for this call, and
        // TCP_INFO writes at most `len` (1) bytes through the pointer, which is valid for them.
        let read = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                std::ptr::addr_of_mut!(state).cast(),
                &mut len,
            )
        };
        if read != 0 || state == TCP_CLOSE {
            return 0;
        }
        let mut queued: libc::c_int = 0;
        // SAFETY: as above; SIOCOUTQ (TIOCOUTQ) writes one `c_int` through the pointer, which
        // is valid for it.
        let read = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
        if read == 0 {
            return usize::try_from(queued).unwrap_or(0);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
    0
}

/// Why a chunk was not written.
enum Unsent {
    /// The link failed: the member is lost.
    Link(std::io::Error),
    /// The chunk's bytes could not be read where they lie (its input tensor changed).
    Blob(CollectiveError),
}

/// Writes a payload from where it lies (a region of the result, a range of the input): each
/// write takes what the socket accepts, the bytes borrowed only for that moment (an input
/// tensor's read lock is not held across a wait).
async fn write_in_place(writer: &OwnedWriteHalf, blob: &Blob) -> Result<(), Unsent> {
    let len = blob.len();
    let mut written = 0;
    while written < len {
        writer.writable().await.map_err(Unsent::Link)?;
        let attempt = blob
            .read(|bytes| writer.try_write(&bytes[written..]))
            .map_err(Unsent::Blob)?;
        match attempt {
            Ok(0) => return Err(Unsent::Link(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Unsent::Link(e)),
        }
    }
    Ok(())
}

/// Reads one peer's chunks (`from` is its rank) into the group's inbox, at most `window`
/// unread at a time, and the control frames between them (slots given back, offers and
/// answers: read whatever the window, so that a credit waits behind a chunk frame only, at
/// most until the sender gives up waiting for a slot); the
/// end of the stream or a malformed frame loses the member.
pub(crate) async fn read_loop<G: LinkOwner>(
    group: Weak<G>,
    from: usize,
    peer: NodeId,
    mut reader: OwnedReadHalf,
    window: usize,
    link: Arc<LinkSlots>,
) {
    let credits = Arc::new(Semaphore::new(window.max(1)));
    let mut borrower: Option<Arc<Borrower>> = None;
    loop {
        let (generation, frame_max) = match group.upgrade() {
            Some(shared) => (shared.generation(), u64::from(shared.header_max())),
            None => return,
        };
        let read = match reader.read_u32_le().await {
            Err(e) => Err(ended(e)),
            Ok(first @ (CREDIT | OFFER | ANSWER)) => {
                match read_control(&mut reader, first, &link, &mut borrower).await {
                    Ok(()) => continue,
                    Err(e) => Err(e),
                }
            }
            Ok(header_len) => {
                let Ok(permit) = credits.clone().acquire_owned().await else {
                    return;
                };
                read_frame(
                    &mut reader,
                    header_len as u64,
                    frame_max,
                    borrower.as_ref(),
                    |wire, blob_len| {
                        // A chunk whose place in the result is known is received straight
                        // into it.
                        let Wire::Data {
                            generation: sent,
                            seq,
                            tag,
                            ..
                        } = wire
                        else {
                            return None;
                        };
                        let shared = group.upgrade()?;
                        let region = (*sent == generation)
                            .then(|| shared.take_landing(from, *seq, *tag))
                            .flatten()?;
                        (region.len() as u64 == blob_len).then_some(region)
                    },
                )
                .await
                .map(|read| (read, permit))
            }
        };
        let Some(shared) = group.upgrade() else {
            return;
        };
        if !take_read(shared.as_ref(), from, &peer, generation, read) {
            return;
        }
    }
}

/// What [`read_loop`] does with one frame it read from `peer` (rank `from`) of `generation`:
/// a chunk of that generation goes to the group's inbox (`true`: read on); anything else (a
/// frame that is no such chunk, the end of the stream, a malformed frame) fails the group or
/// ends the link (`false`).
fn take_read<G: LinkOwner>(
    shared: &G,
    from: usize,
    peer: &NodeId,
    generation: u64,
    read: Result<((Wire, Blob), tokio::sync::OwnedSemaphorePermit), ReadError>,
) -> bool {
    match read {
        Ok((
            (
                Wire::Data {
                    generation: sent,
                    seq,
                    tag,
                    call,
                },
                blob,
            ),
            permit,
        )) if sent == generation => {
            shared.deliver_plain(from, seq, tag, call, blob, permit);
            true
        }
        Ok(((other, _), _)) => {
            shared.fail(
                CollectiveError::Link {
                    node: peer.clone(),
                    generation,
                    reason: format!(
                        "its TCP link carried {other:?}, not a chunk of generation {generation}"
                    ),
                },
                true,
            );
            false
        }
        Err(ended @ ReadError::Ended(_)) => {
            shared.link_ended(from, ended.to_string());
            false
        }
        Err(ReadError::Malformed(malformed)) => {
            shared.fail(
                CollectiveError::MemberLost {
                    node: peer.clone(),
                    generation,
                    reason: malformed.to_string(),
                },
                true,
            );
            false
        }
    }
}

fn ended(e: std::io::Error) -> ReadError {
    ReadError::Ended(e)
}

/// Reads and applies the control frame that began with `first`.
async fn read_control(
    reader: &mut OwnedReadHalf,
    first: u32,
    link: &LinkSlots,
    borrower: &mut Option<Arc<Borrower>>,
) -> Result<(), ReadError> {
    match first {
        CREDIT => {
            let slot = reader.read_u32_le().await.map_err(ended)?;
            Ok(link.give_back(slot)?)
        }
        ANSWER => {
            let taken = reader.read_u8().await.map_err(ended)?;
            Ok(link.answered(taken == 1)?)
        }
        _ => {
            let name_len = reader.read_u16_le().await.map_err(ended)? as usize;
            if name_len > NAME_MAX {
                return Err(MalformedFrame::NameTooLong { len: name_len }.into());
            }
            let mut name = vec![0u8; name_len];
            reader.read_exact(&mut name).await.map_err(ended)?;
            let offer = Offer {
                name: String::from_utf8(name).map_err(|_| MalformedFrame::NameNotUtf8)?,
                slots: reader.read_u32_le().await.map_err(ended)?,
                slot_bytes: reader.read_u64_le().await.map_err(ended)?,
                probe: reader.read_u128_le().await.map_err(ended)?,
            };
            if borrower.is_some() {
                return Err(MalformedFrame::SecondOffer.into());
            }
            *borrower = link.take(&offer);
            Ok(())
        }
    }
}

/// Why a link's next frame could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// The connection ended (closed or reset): the member is lost if a chunk it owed is
    /// awaited (`Shared::link_ended`).
    #[error("its TCP link ended: {0}")]
    Ended(std::io::Error),
    /// The peer sent something that is not a frame within the limits: lost at once.
    #[error(transparent)]
    Malformed(#[from] MalformedFrame),
}

/// What a peer sent that is not a frame within the limits.
#[derive(Debug, thiserror::Error)]
enum MalformedFrame {
    /// A segment offered under a name longer than [`NAME_MAX`].
    #[error("a segment name of {len} bytes (limit {NAME_MAX})")]
    NameTooLong {
        /// The name's length.
        len: usize,
    },
    /// A segment offered under a name that is not UTF-8.
    #[error("a segment name that is not UTF-8")]
    NameNotUtf8,
    /// A second segment offered on the same link.
    #[error("it offered a second segment")]
    SecondOffer,
    /// An answer to an offer this member did not make.
    #[error("it answered an offer this member did not make")]
    UnaskedAnswer,
    /// A slot given back while this member lends none.
    #[error("it gave back slot {slot} of no segment it took")]
    CreditWithoutSegment {
        /// The slot.
        slot: u32,
    },
    /// A slot that does not fit the segment, or is not where the protocol has it.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// A chunk header longer than a frame may be.
    #[error("a chunk header of {len} bytes (limit {max})")]
    HeaderTooLong {
        /// The header's length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A chunk longer than a frame may be.
    #[error("a chunk of {len} bytes (limit {max})")]
    ChunkTooLong {
        /// The chunk's length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A chunk header that does not decode.
    #[error("a chunk header that does not decode: {0}")]
    Undecodable(CodecError),
    /// A chunk in a slot while this member took no segment of the peer's.
    #[error("a chunk in slot {slot} of no segment this member took")]
    SlotWithoutSegment {
        /// The slot.
        slot: u32,
    },
    /// A chunk in a slot that does not fit the region it lands in.
    #[error("{0}")]
    Landing(CollectiveError),
}

/// One chunk after its header's length: its header decoded and its blob, received into the
/// region `landing(header, blob length)` gives, or into bytes of its own; a blob in a slot of
/// the peer's segment (`borrowed`) is copied into that region, or stays where it is.
async fn read_frame(
    reader: &mut OwnedReadHalf,
    header_len: u64,
    frame_max: u64,
    borrowed: Option<&Arc<Borrower>>,
    landing: impl FnOnce(&Wire, u64) -> Option<Writable>,
) -> Result<(Wire, Blob), ReadError> {
    let io = ended;
    if header_len > frame_max {
        return Err(MalformedFrame::HeaderTooLong {
            len: header_len,
            max: frame_max,
        }
        .into());
    }
    let mut header = vec![0u8; header_len as usize];
    reader.read_exact(&mut header).await.map_err(io)?;
    let blob_len = reader.read_u64_le().await.map_err(io)?;
    let slot = if blob_len & IN_SLOT != 0 {
        Some(reader.read_u32_le().await.map_err(io)?)
    } else {
        None
    };
    let blob_len = blob_len & !IN_SLOT;
    if blob_len > frame_max {
        return Err(MalformedFrame::ChunkTooLong {
            len: blob_len,
            max: frame_max,
        }
        .into());
    }
    let frame = Frame {
        header: Bytes::from(header),
        blobs: Vec::new(),
    };
    let wire = frame
        .decode::<Wire>(frame_max as u32)
        .map_err(MalformedFrame::Undecodable)?;
    if let Some(slot) = slot {
        let Some(borrowed) = borrowed else {
            return Err(MalformedFrame::SlotWithoutSegment { slot }.into());
        };
        let received = borrowed
            .take(slot, blob_len)
            .map_err(MalformedFrame::from)?;
        // Copied into its place if it has one: the slot goes back at once.
        let blob = match landing(&wire, blob_len) {
            Some(region) => Blob::Landed(
                region
                    .copy_from(received.bytes())
                    .map_err(MalformedFrame::Landing)?,
            ),
            None => Blob::Slot(Arc::new(received)),
        };
        return Ok((wire, blob));
    }
    if let Some(region) = landing(&wire, blob_len) {
        let filled = region.read_from(reader).await.map_err(io)?;
        return Ok((wire, Blob::Landed(filled)));
    }
    // Read into spare capacity (no zeroing first): every pass over a chunk counts here.
    let mut blob = bytes::BytesMut::with_capacity(blob_len as usize);
    while blob.len() < blob_len as usize {
        if reader.read_buf(&mut blob).await.map_err(io)? == 0 {
            return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok((wire, Blob::Bytes(blob.freeze())))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::collective::wire::CallOp;
    use crate::collective::{Element, Reduction};

    /// A group that only sends: nothing is delivered to it, and a failure is a test failure.
    struct Sending;

    impl LinkOwner for Sending {
        fn generation(&self) -> u64 {
            1
        }
        fn header_max(&self) -> u32 {
            1 << 20
        }
        fn fail(&self, err: CollectiveError, _propagate: bool) -> CollectiveError {
            panic!("the sending link failed: {err}")
        }
        fn take_landing(&self, _from: usize, _seq: u64, _tag: u64) -> Option<Writable> {
            None
        }
        fn deliver_plain(
            &self,
            _from: usize,
            _seq: u64,
            _tag: u64,
            _call: Call,
            _blob: Blob,
            _credit: tokio::sync::OwnedSemaphorePermit,
        ) {
        }
        fn link_ended(&self, _from: usize, _reason: String) {}
    }

    /// Reads one chunk frame off `stream` and returns its payload's length and bytes read, or
    /// the error the link ended with.
    async fn read_chunk(stream: &mut TcpStream) -> std::io::Result<(u64, Vec<u8>)> {
        let header_len = stream.read_u32_le().await?;
        let mut header = vec![0; header_len as usize];
        stream.read_exact(&mut header).await?;
        let len = stream.read_u64_le().await?;
        let mut payload = vec![0; usize::try_from(len).expect("a test chunk fits memory")];
        stream.read_exact(&mut payload).await?;
        Ok((len, payload))
    }

    /// A member that exits right after its flush, with bytes of the link unread (Linux then
    /// resets the link and discards what it had not sent): its peer still reads the whole of
    /// its last chunk, because the flush waited until the peer acknowledged every byte.
    #[tokio::test]
    async fn a_flushed_link_delivers_its_last_chunk_although_the_member_resets_it_on_exit() {
        // More than both kernels' buffers of a loopback link hold together: part of the chunk
        // is still in the leaving member's send queue when its write ends.
        const PAYLOAD: usize = 32 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let leaving = TcpStream::connect(address).await.expect("connect");
        let (mut staying, _) = listener.accept().await.expect("accept");
        // Bytes the leaving member never reads: closing its socket then resets the link.
        staying.write_all(&[7; 64 * 1024]).await.expect("write");

        let config = GroupConfig {
            shared_memory: false,
            ..GroupConfig::for_tests()
        };
        let (slots, replies) = LinkSlots::new(&config);
        let owner = Arc::new(Sending);
        let unanswered: Unanswered = Arc::new(AtomicUsize::new(1));
        let (queue, queued) = mpsc::unbounded_channel();
        let (drain, drains) = mpsc::unbounded_channel();
        let (reader, writer) = leaving.into_split();
        let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i % 251) as u8).collect();
        queue
            .send(Outgoing {
                seq: 1,
                tag: 0,
                call: Call {
                    op: CallOp::AllReduce(Reduction::Sum),
                    element: Element::U8,
                    dims: vec![PAYLOAD as u64],
                    parts: 0,
                    chunk_bytes: PAYLOAD as u64,
                    small_bytes_max: 0,
                },
                blob: Blob::Bytes(Bytes::from(payload.clone())),
            })
            .expect("queue");
        let sender = tokio::spawn(send_loop(
            Arc::downgrade(&owner),
            NodeId::new("worker", 1),
            writer,
            Outbox {
                chunks: queued,
                unanswered: unanswered.clone(),
                drains,
            },
            slots,
            replies,
        ));
        // The peer is slow to read: the chunk waits in the leaving member's send queue.
        let reading = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            read_chunk(&mut staying).await
        });

        // The flush, as `ProcessGroup::flush` runs it: every chunk written, then drained.
        while unanswered.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        drain.send(answer).expect("the sender listens");
        tokio::time::timeout(Duration::from_secs(20), answered)
            .await
            .expect("the peer acknowledged every byte within the bound")
            .expect("the link did not end");

        // The member exits: its socket closes with bytes unread.
        sender.abort();
        let _ = sender.await;
        drop(reader);
        drop(queue);

        let (len, read) = reading
            .await
            .expect("the reader ran")
            .expect("the peer read the whole chunk before the link ended");
        assert_eq!(len, PAYLOAD as u64);
        assert!(read == payload, "the chunk arrived intact");
    }

    /// A peer that dropped the link after its last call (its group superseded) never
    /// acknowledges what is written after that (a slot given back): its kernel answers with a
    /// reset, and the bytes stay in the sender's count. Nothing more will be delivered, so the
    /// link counts nothing unacknowledged, and a flush waiting for it is answered, not held
    /// until its bound.
    #[tokio::test]
    async fn a_link_the_peer_dropped_counts_nothing_unacknowledged() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let mut leaving = TcpStream::connect(address).await.expect("connect");
        let (staying, _) = listener.accept().await.expect("accept");
        drop(staying);
        // One write, as a control frame is: the kernel takes it before the reset comes.
        leaving
            .write_all(&[0u8; 8])
            .await
            .expect("the first write after the peer's close is taken");
        let deadline = Instant::now() + Duration::from_secs(10);
        while unacknowledged(&leaving) != 0 {
            assert!(
                Instant::now() < deadline,
                "a link the peer dropped still counts {} bytes unacknowledged",
                unacknowledged(&leaving)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
