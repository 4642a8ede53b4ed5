//! Frames on the wire: a length-prefixed header plus raw blobs, read with every length checked
//! against the limits before anything of that length is allocated.
//!
//! One frame travels per QUIC stream direction, and the stream is finished right after it; see
//! the crate documentation for the layout.

use bincode::{Decode, Encode};
use bytes::{Bytes, BytesMut};
use quinn::{ReadError, RecvStream, SendStream, WriteError};

use crate::budget::InFlight;
use crate::codec::{self, CodecError};
use crate::config::TransportConfig;

/// One message: an encoded header plus blobs carried beside it without re-encoding.
///
/// The header is a bincode-encoded typed message; blobs are raw bytes (tensors as
/// little-endian element bytes), moved as whole buffers, never element by element.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    /// bincode-encoded message.
    pub header: Bytes,
    /// Raw byte payloads carried beside the header.
    pub blobs: Vec<Bytes>,
}

impl Frame {
    /// A frame with a header and no blobs.
    pub fn new(header: impl Into<Bytes>) -> Self {
        Self {
            header: header.into(),
            blobs: Vec::new(),
        }
    }

    /// Encodes `msg` as the header (bounded by `header_bytes_max`) and attaches `blobs`.
    pub fn encode<T: Encode>(
        msg: &T,
        blobs: Vec<Bytes>,
        header_bytes_max: u32,
    ) -> Result<Self, CodecError> {
        Ok(Self {
            header: codec::encode(msg, header_bytes_max as usize)?,
            blobs,
        })
    }

    /// Decodes the header as a `T` (bounded by `header_bytes_max`, trailing bytes rejected).
    pub fn decode<T: Decode<()>>(&self, header_bytes_max: u32) -> Result<T, CodecError> {
        codec::decode(&self.header, header_bytes_max as usize)
    }

    /// Total bytes of all blobs.
    pub fn blob_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| b.len() as u64).sum()
    }

    /// Checks this frame against the limits a receiver will apply.
    pub fn check_limits(&self, limits: &FrameLimits) -> Result<(), FrameError> {
        limits.check(
            self.header.len() as u64,
            self.blobs.len() as u64,
            self.blob_bytes(),
        )
    }
}

/// The limits a frame is checked against, taken from [`TransportConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest header (bytes).
    pub header_bytes_max: u32,
    /// Most blobs.
    pub blobs_max: u32,
    /// Largest sum of blob lengths (bytes).
    pub blob_bytes_max: u64,
}

impl From<&TransportConfig> for FrameLimits {
    fn from(config: &TransportConfig) -> Self {
        Self {
            header_bytes_max: config.frame_bytes_max,
            blobs_max: config.blobs_per_frame_max,
            blob_bytes_max: config.blob_bytes_max,
        }
    }
}

impl FrameLimits {
    fn check(&self, header_len: u64, blob_count: u64, blob_bytes: u64) -> Result<(), FrameError> {
        if header_len > u64::from(self.header_bytes_max) {
            return Err(FrameError::TooLarge {
                what: "header",
                len: header_len,
                max: u64::from(self.header_bytes_max),
            });
        }
        if blob_count > u64::from(self.blobs_max) {
            return Err(FrameError::TooLarge {
                what: "blob count",
                len: blob_count,
                max: u64::from(self.blobs_max),
            });
        }
        if blob_bytes > self.blob_bytes_max {
            return Err(FrameError::TooLarge {
                what: "blob bytes",
                len: blob_bytes,
                max: self.blob_bytes_max,
            });
        }
        Ok(())
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A length in the frame (or of a frame to send) exceeds its limit.
    #[error("frame {what} of {len} exceeds the limit of {max}")]
    TooLarge {
        /// Which length: `header`, `blob count` or `blob bytes`.
        what: &'static str,
        /// The length found.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// No room for the frame in a receive budget within `in_flight_wait_timeout` (SEC-2).
    #[error("no room for a frame of {len} bytes in the {scope} receive budget of {max} bytes within {waited_ms} ms")]
    OverBudget {
        /// Which budget: `connection` or `node`.
        scope: &'static str,
        /// The frame's declared length (header plus blobs).
        len: u64,
        /// The budget.
        max: u64,
        /// How long the frame waited.
        waited_ms: u64,
    },
    /// The stream ended before the frame was complete.
    #[error("truncated frame: stream ended while reading the {part}")]
    Truncated {
        /// Which part was being read.
        part: &'static str,
    },
    /// The stream carried bytes after the end of the frame.
    #[error("trailing bytes after the end of the frame")]
    TrailingBytes,
    /// The peer reset the stream (or stopped reading it) with this application code.
    #[error("stream reset by peer with code {code}")]
    Reset {
        /// The QUIC application error code.
        code: u64,
    },
    /// The connection was lost while reading or writing.
    #[error("connection lost: {reason}")]
    ConnectionLost {
        /// quinn's description of why.
        reason: String,
    },
    /// Any other stream error.
    #[error("stream error: {0}")]
    Stream(String),
}

/// Writes `frame` onto `send` and finishes the stream. The blobs are handed to quinn as they
/// are (no copy).
pub(crate) async fn write_frame(
    send: &mut SendStream,
    frame: &Frame,
    limits: &FrameLimits,
) -> Result<(), FrameError> {
    frame.check_limits(limits)?;
    let mut chunks = Vec::with_capacity(2 + frame.blobs.len());
    chunks.push(encode_prefix(frame));
    chunks.push(frame.header.clone());
    chunks.extend(frame.blobs.iter().filter(|b| !b.is_empty()).cloned());
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(write_error)?;
    send.finish()
        .map_err(|_| FrameError::Stream("stream closed before finish".into()))?;
    Ok(())
}

/// Writes raw bytes onto `send` and finishes it: the test path for malformed frames.
pub(crate) async fn write_raw(
    send: &mut SendStream,
    mut chunks: Vec<Bytes>,
) -> Result<(), FrameError> {
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(write_error)?;
    send.finish()
        .map_err(|_| FrameError::Stream("stream closed before finish".into()))?;
    Ok(())
}

/// Reads one frame from `recv` and checks that the stream ends right after it.
///
/// Every length is checked against `limits` before anything past it is read. The frame's
/// declared length is then reserved in `in_flight` (SEC-2) before its header is read, and the
/// bytes kept are counted there as they arrive; the caller keeps `in_flight` until it hands
/// the frame on. No buffer is sized by a declared length alone (see [`ChunkReader`]).
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    limits: &FrameLimits,
    in_flight: &mut InFlight,
) -> Result<Frame, FrameError> {
    let mut reader = ChunkReader::new(recv, in_flight);
    let fixed = reader
        .read_prefix(FIXED_PREFIX_BYTES, "length prefix")
        .await?;
    let header_len = u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
    let blob_count = u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    limits.check(u64::from(header_len), u64::from(blob_count), 0)?;

    let lens_raw = reader
        .read_prefix(blob_count as usize * 8, "blob lengths")
        .await?;
    let mut blob_lens = Vec::with_capacity(blob_count as usize);
    let mut blob_total: u64 = 0;
    for raw in lens_raw.chunks_exact(8) {
        let len = u64::from_le_bytes(raw.try_into().expect("chunks_exact(8)"));
        blob_total = blob_total.saturating_add(len);
        limits.check(u64::from(header_len), u64::from(blob_count), blob_total)?;
        blob_lens.push(len);
    }

    reader
        .in_flight
        .reserve(u64::from(header_len).saturating_add(blob_total))
        .await?;
    let header = reader.read_part(header_len as usize, "header").await?;
    let mut blobs = Vec::with_capacity(blob_lens.len());
    for len in blob_lens {
        // Bounded by blob_bytes_max above, so the cast cannot truncate on 64-bit targets.
        blobs.push(reader.read_part(len as usize, "blob").await?);
    }
    reader.expect_end().await?;
    Ok(Frame { header, blobs })
}

/// Encodes the prefix (header length, blob count, blob lengths) for `frame`.
fn encode_prefix(frame: &Frame) -> Bytes {
    let mut prefix = Vec::with_capacity(FIXED_PREFIX_BYTES + 8 * frame.blobs.len());
    prefix.extend_from_slice(&(frame.header.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&(frame.blobs.len() as u32).to_le_bytes());
    for blob in &frame.blobs {
        prefix.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    }
    Bytes::from(prefix)
}

/// Reads a stream and hands out its parts with memory that follows the bytes that arrived,
/// never a declared length (SEC-1, SEC-2):
///
/// - the prefix is read with exact-length reads, so nothing past it is taken from quinn
///   before the frame's budget is reserved;
/// - after that, chunks come in batches (one quinn lock per batch, not per packet);
/// - a part of at least [`ZERO_COPY_BYTES_MIN`] that lies within one chunk is shared as is;
/// - any other part keeps its chunks as they arrive and, once half of it has arrived, moves
///   them into one buffer of exactly its length, into which the rest is copied as it arrives.
///   Each byte is copied at most once, and a part holds at most twice what was sent for it
///   (one and a half times its length for the moment of the move).
///
/// Everything kept is counted in the frame's [`InFlight`].
struct ChunkReader<'a> {
    recv: &'a mut RecvStream,
    in_flight: &'a mut InFlight,
    queued: std::collections::VecDeque<Bytes>,
    finished: bool,
}

impl<'a> ChunkReader<'a> {
    fn new(recv: &'a mut RecvStream, in_flight: &'a mut InFlight) -> Self {
        Self {
            recv,
            in_flight,
            queued: std::collections::VecDeque::new(),
            finished: false,
        }
    }

    /// Reads exactly `len` bytes of the (small, already bounded) prefix, taking no more from
    /// quinn than that. Not counted as held: the caller parses and drops them.
    async fn read_prefix(&mut self, len: usize, part: &'static str) -> Result<Vec<u8>, FrameError> {
        debug_assert!(self.queued.is_empty(), "prefix read after the body began");
        let mut out = Vec::new();
        while out.len() < len {
            match self
                .recv
                .read_chunk(len - out.len(), true)
                .await
                .map_err(read_error)?
            {
                Some(chunk) => out.extend_from_slice(&chunk.bytes),
                None => {
                    self.finished = true;
                    return Err(FrameError::Truncated { part });
                }
            }
        }
        Ok(out)
    }

    /// Queues the next batch of chunks; false at the end of the stream.
    async fn fill(&mut self) -> Result<bool, FrameError> {
        if self.finished {
            return Ok(false);
        }
        let mut batch: [Bytes; CHUNK_BATCH] = Default::default();
        match self
            .recv
            .read_chunks(&mut batch)
            .await
            .map_err(read_error)?
        {
            Some(n) => {
                let mut added = 0u64;
                for chunk in batch.into_iter().take(n).filter(|c| !c.is_empty()) {
                    added += chunk.len() as u64;
                    self.queued.push_back(chunk);
                }
                self.in_flight.add(added);
                Ok(true)
            }
            None => {
                self.finished = true;
                Ok(false)
            }
        }
    }

    /// The next chunk, filling from quinn if none is queued; `None` at the end of the stream.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            if let Some(chunk) = self.queued.pop_front() {
                return Ok(Some(chunk));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Reads the next `len` bytes of the body (`len` already checked against the limits).
    async fn read_part(&mut self, len: usize, part: &'static str) -> Result<Bytes, FrameError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let Some(mut front) = self.next_chunk().await? else {
            return Err(FrameError::Truncated { part });
        };
        // Small parts are copied: a slice would pin quinn's whole receive buffer.
        if front.len() >= len && len >= ZERO_COPY_BYTES_MIN {
            let out = front.split_to(len);
            if !front.is_empty() {
                self.queued.push_front(front);
            }
            return Ok(out);
        }
        self.queued.push_front(front);

        // Chunks kept as they arrived, until `buf` exists; then each piece is copied into it.
        let mut kept: Vec<Bytes> = Vec::new();
        let mut buf: Option<BytesMut> = None;
        let mut got = 0usize;
        while got < len {
            let Some(mut chunk) = self.next_chunk().await? else {
                return Err(FrameError::Truncated { part });
            };
            let take = chunk.len().min(len - got);
            let piece = chunk.split_to(take);
            if !chunk.is_empty() {
                self.queued.push_front(chunk);
            }
            got += take;
            match buf.as_mut() {
                Some(buf) => {
                    buf.extend_from_slice(&piece);
                    drop(piece);
                    self.in_flight.sub(take as u64);
                }
                // Half the part has arrived: its buffer now costs at most twice what was sent.
                None if got.saturating_mul(2) >= len => {
                    let mut whole = BytesMut::with_capacity(len);
                    self.in_flight.add(len as u64);
                    for earlier in kept.drain(..) {
                        whole.extend_from_slice(&earlier);
                    }
                    whole.extend_from_slice(&piece);
                    drop(piece);
                    self.in_flight.sub(got as u64);
                    buf = Some(whole);
                }
                None => kept.push(piece),
            }
        }
        let buf = buf.expect("a part's buffer exists once all of it has arrived");
        Ok(buf.freeze())
    }

    async fn expect_end(&mut self) -> Result<(), FrameError> {
        loop {
            if !self.queued.is_empty() {
                return Err(FrameError::TrailingBytes);
            }
            if !self.fill().await? {
                return Ok(());
            }
        }
    }
}

pub(crate) fn read_error(e: ReadError) -> FrameError {
    match e {
        ReadError::Reset(code) => FrameError::Reset {
            code: code.into_inner(),
        },
        ReadError::ConnectionLost(e) => FrameError::ConnectionLost {
            reason: e.to_string(),
        },
        other => FrameError::Stream(other.to_string()),
    }
}

pub(crate) fn write_error(e: WriteError) -> FrameError {
    match e {
        WriteError::Stopped(code) => FrameError::Reset {
            code: code.into_inner(),
        },
        WriteError::ConnectionLost(e) => FrameError::ConnectionLost {
            reason: e.to_string(),
        },
        other => FrameError::Stream(other.to_string()),
    }
}

/// Bytes of the fixed part of the prefix: header length and blob count.
pub const FIXED_PREFIX_BYTES: usize = 8;

/// Chunks taken from quinn per read.
const CHUNK_BATCH: usize = 32;

/// Parts at least this long that lie within one received chunk are shared, not copied.
const ZERO_COPY_BYTES_MIN: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: FrameLimits = FrameLimits {
        header_bytes_max: 16,
        blobs_max: 2,
        blob_bytes_max: 100,
    };

    #[test]
    fn prefix_layout_is_lengths_then_blob_lengths_little_endian() {
        let frame = Frame {
            header: Bytes::from_static(b"abc"),
            blobs: vec![Bytes::from_static(&[1; 5]), Bytes::new()],
        };
        let prefix = encode_prefix(&frame);
        assert_eq!(
            &prefix[..],
            &[3, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]
        );
    }

    #[test]
    fn limits_are_inclusive_and_name_what_broke() {
        assert!(LIMITS.check(16, 2, 100).is_ok());
        for (args, what) in [
            ((17, 0, 0), "header"),
            ((0, 3, 0), "blob count"),
            ((0, 1, 101), "blob bytes"),
        ] {
            match LIMITS.check(args.0, args.1, args.2) {
                Err(FrameError::TooLarge { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{args:?}: {other:?}"),
            }
        }
        let frame = Frame {
            header: Bytes::from_static(b"h"),
            blobs: vec![Bytes::from(vec![0u8; 60]), Bytes::from(vec![0u8; 41])],
        };
        assert!(matches!(
            frame.check_limits(&LIMITS),
            Err(FrameError::TooLarge {
                what: "blob bytes",
                len: 101,
                max: 100
            })
        ));
    }
}
