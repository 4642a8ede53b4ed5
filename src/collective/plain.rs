//! The plaintext data plane of a process group ([`GroupConfig::plaintext`]): a group's chunks
//! over TCP, for clusters inside a trusted network, as NCCL and gloo do. Off by default.
//!
//! Peers are authenticated over QUIC at setup, not on TCP: when a link of an epoch forms, the
//! acceptor answers the dialer's `Join` (over QUIC, mutual TLS) with the port of its TCP
//! listener and a fresh random token; the dialer connects there and sends the token and the
//! epoch first. The acceptor takes the connection as that peer's link of that epoch only if
//! the token is one it issued for them (each token once); anything else is closed unread. After
//! that, tensors travel unencrypted and unauthenticated: anyone who can read or inject TCP
//! segments between the members can read or change them.
//!
//! A link's frames: `u32` header length, the header (a bincode `Wire::Data`, as on QUIC),
//! `u64` blob length, the blob; both lengths bounded by the transport's frame limit. The
//! receiver reads the next frame only while it holds fewer than the group's `window` unread
//! chunks of that sender (TCP's own flow control then holds the sender back), which is what a
//! request's late answer does on QUIC. A chunk whose region of the result the call expects
//! (an all-reduce's all-gather) is read straight into it, others into a buffer of their own;
//! a chunk that lies in the caller's input or in the result is written from there
//! (`landing.rs`). A malformed frame or a failed write loses the member at
//! once ([`CollectiveError::MemberLost`]); a link the peer closed loses it when a call waits for
//! a chunk from it that never came (a member that finished its last call and exited closes its
//! links before its peers took every chunk it sent, as they are entitled to). Control messages
//! (`Abort`, probes) stay on QUIC.
//!
//! This module owns the listener, the handshake and a link's two loops; the group's
//! state machine stays in `group.rs`.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use cohort_transport::{Frame, NodeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::group::{Outgoing, Shared, Unanswered};
use super::landing::{Blob, Writable};
use super::wire::Wire;
use super::CollectiveError;

/// Bytes a dialer sends first: the token (16) and the epoch (8), little-endian.
const HELLO_BYTES: usize = 24;
/// How long an accepted connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A token the acceptor issued to one peer for one epoch's link.
pub(crate) type Token = u128;

/// A fresh random token.
pub(crate) fn new_token() -> Token {
    rand::random::<u128>()
}

/// Binds this mesh's TCP listener on `ip` (any free port).
pub(crate) async fn bind(ip: std::net::IpAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::new(ip, 0)).await
}

/// Reads an accepted connection's hello: its token and epoch, or `None` if it sends no
/// well-formed hello in time.
pub(crate) async fn read_hello(stream: &mut TcpStream) -> Option<(Token, u64)> {
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut hello))
        .await
        .ok()?
        .ok()?;
    let token = Token::from_le_bytes(hello[..16].try_into().ok()?);
    let epoch = u64::from_le_bytes(hello[16..].try_into().ok()?);
    Some((token, epoch))
}

/// Dials the acceptor's listener at `addr` by `deadline` and sends the hello.
pub(crate) async fn dial(
    addr: SocketAddr,
    token: Token,
    epoch: u64,
    deadline: Instant,
) -> std::io::Result<TcpStream> {
    let connect = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut hello = [0u8; HELLO_BYTES];
        hello[..16].copy_from_slice(&token.to_le_bytes());
        hello[16..].copy_from_slice(&epoch.to_le_bytes());
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

/// Writes the chunks queued for one peer, in order; a write error loses the member.
pub(crate) async fn send_loop(
    group: Weak<Shared>,
    peer: NodeId,
    mut writer: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
    unanswered: Unanswered,
) {
    while let Some(out) = queue.recv().await {
        let Some(shared) = group.upgrade() else { break };
        let data = Wire::Data {
            epoch: shared.epoch,
            seq: out.seq,
            tag: out.tag,
            call: out.call,
        };
        let header = match Frame::encode(&data, Vec::new(), shared.header_max) {
            Ok(frame) => frame.header,
            Err(e) => {
                shared.fail(
                    CollectiveError::Tensor(format!("encoding a chunk: {e}")),
                    true,
                );
                break;
            }
        };
        drop(shared);
        let mut prefix = Vec::with_capacity(4 + header.len() + 8);
        prefix.extend_from_slice(&(header.len() as u32).to_le_bytes());
        prefix.extend_from_slice(&header);
        prefix.extend_from_slice(&(out.blob.len() as u64).to_le_bytes());
        let written = async {
            writer.write_all(&prefix).await.map_err(Unsent::Link)?;
            match &out.blob {
                Blob::Bytes(bytes) => writer.write_all(bytes).await.map_err(Unsent::Link),
                in_place => write_in_place(&writer, in_place).await,
            }
        }
        .await;
        unanswered.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        drop(out.blob);
        if let Err(Unsent::Blob(err)) = written {
            if let Some(shared) = group.upgrade() {
                shared.fail(err, true);
            }
            break;
        }
        if let Err(Unsent::Link(e)) = written {
            if let Some(shared) = group.upgrade() {
                shared.fail(
                    CollectiveError::MemberLost {
                        node: peer.clone(),
                        epoch: shared.epoch,
                        reason: format!("its TCP link failed: {e}"),
                    },
                    true,
                );
            }
            break;
        }
    }
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
/// unread at a time; the end of the stream or a malformed frame loses the member.
pub(crate) async fn read_loop(
    group: Weak<Shared>,
    from: usize,
    peer: NodeId,
    mut reader: OwnedReadHalf,
    window: usize,
) {
    let credits = Arc::new(Semaphore::new(window.max(1)));
    loop {
        let Ok(permit) = credits.clone().acquire_owned().await else {
            return;
        };
        let (epoch, frame_max) = match group.upgrade() {
            Some(shared) => (shared.epoch, shared.header_max as u64),
            None => return,
        };
        let read = read_frame(&mut reader, frame_max, |wire, blob_len| {
            // A chunk whose place in the result is known is received straight into it.
            let Wire::Data {
                epoch: sent,
                seq,
                tag,
                ..
            } = wire
            else {
                return None;
            };
            let shared = group.upgrade()?;
            let region = (*sent == epoch)
                .then(|| shared.take_landing(from, *seq, *tag))
                .flatten()?;
            (region.len() as u64 == blob_len).then_some(region)
        })
        .await;
        let Some(shared) = group.upgrade() else {
            return;
        };
        match read {
            Ok((
                Wire::Data {
                    epoch: sent,
                    seq,
                    tag,
                    call,
                },
                blob,
            )) if sent == epoch => {
                shared.deliver_plain(from, seq, tag, call, blob, permit);
            }
            Ok((other, _)) => {
                shared.fail(
                    CollectiveError::Link {
                        node: peer.clone(),
                        epoch,
                        reason: format!(
                            "its TCP link carried {other:?}, not a chunk of epoch {epoch}"
                        ),
                    },
                    true,
                );
                return;
            }
            Err(ReadError::Ended(reason)) => {
                shared.link_ended(from, reason);
                return;
            }
            Err(ReadError::Malformed(reason)) => {
                shared.fail(
                    CollectiveError::MemberLost {
                        node: peer.clone(),
                        epoch,
                        reason,
                    },
                    true,
                );
                return;
            }
        }
    }
}

/// Why a link's next frame could not be read.
enum ReadError {
    /// The connection ended (closed or reset): the member is lost if a chunk it owed is
    /// awaited (`Shared::link_ended`).
    Ended(String),
    /// The peer sent something that is not a frame within the limits: lost at once.
    Malformed(String),
}

/// One frame: its header decoded and its blob, received into the region `landing(header,
/// blob length)` gives, or into bytes of its own.
async fn read_frame(
    reader: &mut OwnedReadHalf,
    frame_max: u64,
    landing: impl FnOnce(&Wire, u64) -> Option<Writable>,
) -> Result<(Wire, Blob), ReadError> {
    let io = |e: std::io::Error| ReadError::Ended(format!("its TCP link ended: {e}"));
    let header_len = reader.read_u32_le().await.map_err(io)? as u64;
    if header_len > frame_max {
        return Err(ReadError::Malformed(format!(
            "a chunk header of {header_len} bytes (limit {frame_max})"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    reader.read_exact(&mut header).await.map_err(io)?;
    let blob_len = reader.read_u64_le().await.map_err(io)?;
    if blob_len > frame_max {
        return Err(ReadError::Malformed(format!(
            "a chunk of {blob_len} bytes (limit {frame_max})"
        )));
    }
    let frame = Frame {
        header: Bytes::from(header),
        blobs: Vec::new(),
    };
    let wire = frame
        .decode::<Wire>(frame_max as u32)
        .map_err(|e| ReadError::Malformed(format!("a chunk header that does not decode: {e}")))?;
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
