//! Where a collective's bytes live: the result written in place ([`Landing`]) and a chunk's
//! payload wherever it already is ([`Blob`]).
//!
//! A ring all-reduce used to build its result in passes of its own: each final chunk reduced
//! into fresh memory, then copied into the result; each chunk received into a buffer, then
//! copied again; this member's own chunks copied out of its input before sending. On the
//! plaintext plane those copies cost as much CPU as the kernel's TCP work. Here:
//!
//! - A [`Landing`] is the result's buffer, of its own element type, allocated once and cut
//!   into disjoint byte regions that are filled in any order: by reducing straight into one
//!   ([`Writable::fill_from_iter`]), by a link's reader receiving a chunk straight into one
//!   ([`Writable::read_from`]), or by a copy. Once every byte is in and no region is held, it
//!   becomes the tensor's storage ([`Landing::finish`]), with no pass over the whole. Its
//!   regions hold little-endian bytes, as the wire does (on a big-endian machine `finish`
//!   turns each element around, the one pass it makes there).
//! - A [`Blob`] is what a send or a receive carries: shared bytes, a filled region of a
//!   landing, a range of the caller's input tensor read where it lies, or a slot of a peer's
//!   shared-memory segment (`shm.rs`). The plaintext plane writes each from where it is; QUIC
//!   takes bytes (a copy for the others).
//!
//! This module holds the collectives' only shared writes, and so their unsafe code. Its
//! invariants: a region is claimed once ([`Landing::claim`] refuses any overlap with a region
//! claimed before), written only through the [`Writable`] that claim returned (which the
//! writer owns), readable ([`Filled`]) only after it was written whole, and never written
//! again; the buffer is a vector again only when the filled regions cover it and no region
//! is held any more (else its filled bytes are copied out).

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

use super::element::{Element, Elements, Input, RegionSink};
use super::shm::Received;
use super::CollectiveError;

/// A result buffer filled region by region (module doc).
pub(crate) struct Landing {
    inner: Arc<Inner>,
}

struct Inner {
    /// The result's vector: capacity for every element, length 0 until [`Landing::finish`]
    /// takes it. While regions are out it is touched only through `base` (never as a vector).
    values: Mutex<Option<Elements>>,
    /// The vector's buffer.
    base: *mut u8,
    /// The buffer's length in bytes.
    bytes: usize,
    element: Element,
    /// Claimed regions, start -> end, disjoint.
    claimed: Mutex<BTreeMap<usize, usize>>,
    /// Bytes of the claimed regions written whole.
    filled: AtomicUsize,
    /// Regions held ([`Writable`]s and [`Filled`]s alive): each counts itself out once it is
    /// done with the buffer, before it tells `released`.
    held: AtomicUsize,
    /// Told when a region is let go (see [`Landing::finish`]).
    released: Notify,
}

// SAFETY: `base` points into `values`' heap buffer, which never moves (the vector is never
// resized) and lives as long as `Inner`, or, once `finish` took it, as long as the result (no
// region is held any more by then, and none can be made). Writes go only through a
// `Writable`, which owns its region exclusively (claims are disjoint); reads only through a
// `Filled`, whose region is never written again. So no byte is written by two threads, nor
// read while written.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`; the shared state besides the buffer is a mutex, an atomic and a
// `Notify`.
unsafe impl Sync for Inner {}

impl Landing {
    /// A result of `count` elements of `element`, none written (nothing is zeroed).
    pub(crate) fn new(element: Element, count: usize) -> Result<Self, CollectiveError> {
        let mut values = Elements::try_with_capacity(element, count)?;
        let base = values.buffer_ptr();
        Ok(Self {
            inner: Arc::new(Inner {
                values: Mutex::new(Some(values)),
                base,
                bytes: count * element.size(),
                element,
                claimed: Mutex::new(BTreeMap::new()),
                filled: AtomicUsize::new(0),
                held: AtomicUsize::new(0),
                released: Notify::new(),
            }),
        })
    }

    /// The region `range` (bytes of the result, whole elements) to write once. Refused if it
    /// lies outside the result, cuts an element, or overlaps a region claimed before.
    pub(crate) fn claim(&self, range: Range<usize>) -> Result<Writable, CollectiveError> {
        let inner = &self.inner;
        let size = inner.element.size();
        let refused = |why: &str| {
            CollectiveError::Tensor(format!(
                "bytes {range:?} of a result of {} bytes: {why}",
                inner.bytes
            ))
        };
        if range.start > range.end || range.end > inner.bytes {
            return Err(refused("outside the result"));
        }
        if range.start % size != 0 || range.end % size != 0 {
            return Err(refused("not whole elements"));
        }
        if !range.is_empty() {
            let mut claimed = inner.claimed.lock().unwrap_or_else(|p| p.into_inner());
            // Claims are disjoint: only the last one starting before our end can overlap.
            if let Some((_, &end)) = claimed.range(..range.end).next_back() {
                if end > range.start {
                    return Err(refused("claimed before"));
                }
            }
            claimed.insert(range.start, range.end);
        }
        Ok(Writable {
            inner: Inner::hold(inner),
            range,
        })
    }

    /// The result as its element type's vector, once every byte was written. A region still
    /// held (a send of a filled region not yet written out) is waited for, at most `wait`
    /// (zero: not at all); after that the filled bytes are copied out instead.
    pub(crate) async fn finish(self, wait: Duration) -> Result<Elements, CollectiveError> {
        let filled = self.inner.filled.load(Ordering::SeqCst);
        if filled != self.inner.bytes {
            return Err(CollectiveError::Tensor(format!(
                "a result of {} bytes with only {filled} in",
                self.inner.bytes
            )));
        }
        let inner = self.inner;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let released = inner.released.notified();
            tokio::pin!(released);
            // Registered before looking, so that a region let go from now on wakes it.
            released.as_mut().enable();
            if inner.held.load(Ordering::Acquire) == 0 {
                return inner.take_values();
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                // SAFETY: every byte was written (the filled regions are disjoint and cover
                // the buffer), and what is still held only reads.
                let whole = unsafe { std::slice::from_raw_parts(inner.base, inner.bytes) };
                return Elements::from_chunks(inner.element, &[whole]);
            }
        }
    }
}

impl Inner {
    /// A new handle of a region: counted as held until it drops.
    fn hold(inner: &Arc<Inner>) -> Arc<Inner> {
        inner.held.fetch_add(1, Ordering::SeqCst);
        inner.clone()
    }

    /// Counts a handle out (it no longer touches the buffer) and tells `finish`.
    fn let_go(&self) {
        self.held.fetch_sub(1, Ordering::Release);
        self.released.notify_one();
    }

    /// The filled result, once no region is held.
    fn take_values(&self) -> Result<Elements, CollectiveError> {
        let taken = self.values.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut values) = taken else {
            return Err(CollectiveError::Tensor("a result taken twice".into()));
        };
        let count = self.bytes / self.element.size();
        // SAFETY: `finish` checked that the filled regions cover the buffer (disjoint, within
        // it, summing to its length), so its first `count` elements are initialized; every
        // element type is plain data. No region is held, and none can be made any more
        // (`finish` consumed the `Landing`), so nothing else touches the buffer from now on.
        unsafe { with_vec!(&mut values, v => v.set_len(count)) };
        if cfg!(target_endian = "big") {
            with_vec!(&mut values, v => v.iter_mut().for_each(|x| bytemuck::bytes_of_mut(x).reverse()));
        }
        Ok(values)
    }
}

/// A claimed region, written by whoever owns this (module doc).
pub(crate) struct Writable {
    inner: Arc<Inner>,
    range: Range<usize>,
}

impl Writable {
    pub(crate) fn len(&self) -> usize {
        self.range.len()
    }

    fn uninit(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the region lies within the buffer (checked by `claim`) and this `Writable`
        // is its only handle (claims are disjoint), so the slice aliases nothing.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.inner
                    .base
                    .add(self.range.start)
                    .cast::<MaybeUninit<u8>>(),
                self.range.len(),
            )
        }
    }

    fn into_filled(self) -> Filled {
        self.inner
            .filled
            .fetch_add(self.range.len(), Ordering::SeqCst);
        Filled {
            inner: Inner::hold(&self.inner),
            range: self.range.clone(),
        }
    }

    /// Fills the region with a copy of `src` (as long as the region).
    pub(crate) fn copy_from(mut self, src: &[u8]) -> Result<Filled, CollectiveError> {
        if src.len() != self.len() {
            return Err(CollectiveError::Tensor(format!(
                "{} bytes for a region of {}",
                src.len(),
                self.len()
            )));
        }
        let out = self.uninit();
        // SAFETY: `out` is this region's (exclusive) and `src` as long; they cannot overlap,
        // `src` being a shared borrow and `out` the only handle of its bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u8>(), src.len())
        };
        Ok(self.into_filled())
    }

    /// Fills the region with `values` (of the result's element size), in order; fewer values
    /// than the region holds leave it unfilled (an error), more are not taken.
    pub(crate) fn fill_from_iter<T: bytemuck::Pod>(
        mut self,
        values: impl Iterator<Item = T>,
    ) -> Result<Filled, CollectiveError> {
        let wanted = self.len() / std::mem::size_of::<T>().max(1);
        if std::mem::size_of::<T>() != self.inner.element.size() {
            return Err(CollectiveError::Tensor(format!(
                "values of {} bytes for a result of {:?}",
                std::mem::size_of::<T>(),
                self.inner.element
            )));
        }
        let bytes = self.uninit();
        let start = bytes.as_mut_ptr();
        if start.align_offset(std::mem::align_of::<T>()) != 0
            || bytes.len() != wanted * std::mem::size_of::<T>()
        {
            return Err(CollectiveError::Tensor(
                "a region that is not aligned to its elements".into(),
            ));
        }
        // SAFETY: the region is exclusively ours (see `uninit`), `start` is aligned for `T` and
        // the region holds exactly `wanted` of them (both checked above); `MaybeUninit<T>`
        // asks nothing of the bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(start.cast::<MaybeUninit<T>>(), wanted) };
        let mut written = 0;
        for (slot, mut value) in out.iter_mut().zip(values) {
            // The buffer holds little-endian bytes, as the wire does, until `finish`.
            if cfg!(target_endian = "big") {
                bytemuck::bytes_of_mut(&mut value).reverse();
            }
            slot.write(value);
            written += 1;
        }
        if written != wanted {
            return Err(CollectiveError::Tensor(format!(
                "{written} values for a region of {wanted}"
            )));
        }
        Ok(self.into_filled())
    }

    /// Fills the region with the next `len()` bytes of `reader` (a chunk received straight
    /// into its place).
    pub(crate) async fn read_from<R: AsyncRead + Unpin>(
        mut self,
        reader: &mut R,
    ) -> std::io::Result<Filled> {
        let len = self.len();
        let region = self.uninit();
        // An address, not a pointer, so that the future stays `Send`.
        let start = region.as_ptr().addr();
        let mut buf = ReadBuf::uninit(region);
        while buf.filled().len() < len {
            let before = buf.filled().len();
            std::future::poll_fn(|cx| Pin::new(&mut *reader).poll_read(cx, &mut buf)).await?;
            // A reader may swap the `ReadBuf` for one of its own (safe code can): then what it
            // reports filled is not this region.
            if buf.filled().as_ptr().addr() != start || buf.capacity() != len {
                return Err(std::io::Error::other(
                    "the reader filled another buffer than the region",
                ));
            }
            if buf.filled().len() == before {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        // `ReadBuf` vouches that its filled part, the whole region (its pointer checked after
        // every read), was written.
        Ok(self.into_filled())
    }
}

impl Drop for Writable {
    fn drop(&mut self) {
        self.inner.let_go();
    }
}

/// A reduction writes straight into a region (`element::reduce_into`).
impl RegionSink for Writable {
    type Filled = Filled;

    fn len(&self) -> usize {
        Writable::len(self)
    }

    fn fill<T: bytemuck::Pod>(
        self,
        values: impl Iterator<Item = T>,
    ) -> Result<Filled, CollectiveError> {
        self.fill_from_iter(values)
    }
}

/// A region written whole: read-only from now on, shared by whoever sends it.
pub(crate) struct Filled {
    inner: Arc<Inner>,
    range: Range<usize>,
}

impl Filled {
    /// The region's bytes of the result.
    pub(crate) fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the region lies within the buffer, was written whole before this `Filled`
        // existed, and is never written again (its claim stays, so no `Writable` overlaps it).
        unsafe {
            std::slice::from_raw_parts(self.inner.base.add(self.range.start), self.range.len())
        }
    }
}

impl Clone for Filled {
    fn clone(&self) -> Self {
        Self {
            inner: Inner::hold(&self.inner),
            range: self.range.clone(),
        }
    }
}

impl Drop for Filled {
    fn drop(&mut self) {
        self.inner.let_go();
    }
}

/// A chunk's payload, wherever its bytes are (module doc).
#[derive(Clone)]
pub(crate) enum Blob {
    /// Bytes of their own (a message's blob, an intermediate sum).
    Bytes(Bytes),
    /// A filled region of this member's result.
    Landed(Filled),
    /// A byte range of this member's input tensor, read where it lies.
    Input(Input, Range<usize>),
    /// A chunk in a slot of a peer's shared-memory segment, read where its sender put it
    /// (`shm.rs`); the slot goes back when the last clone drops.
    Slot(Arc<Received>),
    /// An intermediate sum of the ring not computed yet: a partial sum in a slot, reduced with
    /// this member's input where the sum goes (straight into a slot of this member's segment:
    /// NCCL's reduce-copy), so that it is written once.
    Sum(Box<PendingSum>),
}

/// `partial op` this member's input over `range` (see [`Blob::Sum`]). Only an all-reduce
/// makes one: its call cannot end before every such sum was sent (each comes back inside a
/// final chunk), so the input is read while the caller still waits.
#[derive(Clone)]
pub(crate) struct PendingSum {
    pub(crate) element: Element,
    pub(crate) op: super::Reduction,
    pub(crate) partial: Arc<Received>,
    pub(crate) mine: Input,
    pub(crate) range: Range<usize>,
}

impl PendingSum {
    fn compute(&self) -> Result<Bytes, CollectiveError> {
        let partial = self.partial.bytes();
        self.mine.read(self.range.clone(), |mine| {
            super::element::reduced(self.element, self.op, partial, mine)
        })
    }
}

impl Blob {
    pub(crate) fn len(&self) -> usize {
        match self {
            Blob::Bytes(bytes) => bytes.len(),
            Blob::Landed(filled) => filled.range.len(),
            Blob::Input(_, range) => range.len(),
            Blob::Slot(received) => received.len(),
            Blob::Sum(sum) => sum.range.len(),
        }
    }

    /// `f` of the payload's bytes (for an input, under the tensor's read lock; a pending sum
    /// is computed first, on each call: take [`Blob::into_bytes`] to keep it).
    pub(crate) fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, CollectiveError> {
        match self {
            Blob::Bytes(bytes) => Ok(f(bytes)),
            Blob::Landed(filled) => Ok(f(filled.bytes())),
            Blob::Input(input, range) => input.read(range.clone(), f),
            Blob::Slot(received) => Ok(f(received.bytes())),
            Blob::Sum(sum) => Ok(f(&sum.compute()?)),
        }
    }

    /// Writes the payload into `out` (as long as it): a pending sum is reduced straight
    /// into it, anything else copied.
    pub(crate) fn write_to(&self, out: &mut [u8]) -> Result<(), CollectiveError> {
        if let Blob::Sum(sum) = self {
            let partial = sum.partial.bytes();
            return sum.mine.read(sum.range.clone(), |mine| {
                super::element::reduce_to(sum.element, sum.op, partial, mine, out)
            })?;
        }
        self.read(|bytes| {
            if bytes.len() != out.len() {
                return Err(CollectiveError::Tensor(format!(
                    "{} bytes into {}",
                    bytes.len(),
                    out.len()
                )));
            }
            out.copy_from_slice(bytes);
            Ok(())
        })?
    }

    /// The payload as bytes of its own: shared if it is, copied (or computed) if it is not.
    pub(crate) fn into_bytes(self) -> Result<Bytes, CollectiveError> {
        match self {
            Blob::Bytes(bytes) => Ok(bytes),
            Blob::Sum(sum) => sum.compute(),
            other => other.read(Bytes::copy_from_slice),
        }
    }
}

impl From<Bytes> for Blob {
    fn from(bytes: Bytes) -> Self {
        Blob::Bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn reduce_into_a_region_matches_reduce_assign_aligned_or_not() {
        use super::super::element::{pod_bytes, reduce_assign, reduce_into, Reduction};
        use half::bf16;
        let cases: [(Element, Vec<u8>, Vec<u8>); 3] = [
            (
                Element::F32,
                pod_bytes(vec![0f32, 1.0, f32::NAN, -3.0]).to_vec(),
                pod_bytes(vec![-0f32, 2.0, 1.0, 4.0]).to_vec(),
            ),
            (
                Element::I64,
                pod_bytes(vec![i64::MAX, -7, 3]).to_vec(),
                pod_bytes(vec![1i64, 9, -3]).to_vec(),
            ),
            (
                Element::BF16,
                pod_bytes(vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]).to_vec(),
                pod_bytes(vec![bf16::from_f32(0.25), bf16::from_f32(8.0)]).to_vec(),
            ),
        ];
        for (element, a, b) in cases {
            // The same values one byte off their alignment take the element-wise path.
            let shifted = |v: &[u8]| -> Vec<u8> { [0u8].iter().chain(v).copied().collect() };
            let (a_off, b_off) = (shifted(&a), shifted(&b));
            for op in [Reduction::Sum, Reduction::Max, Reduction::Min] {
                let mut want = a.clone();
                reduce_assign(element, op, &mut want, &b);
                for (x, y) in [(&a[..], &b[..]), (&a_off[1..], &b_off[1..])] {
                    let count = a.len() / element.size();
                    let landing = Landing::new(element, count).unwrap();
                    let region = landing.claim(0..a.len()).unwrap();
                    let filled = reduce_into(element, op, x, y, region).unwrap();
                    assert_eq!(filled.bytes(), &want[..], "{element:?} {op}");
                }
            }
            let landing = Landing::new(element, a.len() / element.size()).unwrap();
            let region = landing.claim(0..a.len()).unwrap();
            let short = reduce_into(element, Reduction::Sum, &a, &b[1..], region);
            assert!(short.is_err(), "operands of different lengths are refused");
        }
    }

    #[tokio::test]
    async fn regions_filled_in_any_order_become_the_result() {
        let landing = Landing::new(Element::F32, 5).unwrap();
        let tail = landing.claim(12..20).unwrap();
        let head = landing.claim(0..8).unwrap();
        let middle = landing.claim(8..12).unwrap();
        let tail = tail.copy_from(&floats(&[4.0, 5.0])).unwrap();
        assert_eq!(tail.bytes(), &floats(&[4.0, 5.0])[..]);
        let _ = head.fill_from_iter([1.0f32, 2.0].into_iter()).unwrap();
        let mut reader: &[u8] = &floats(&[3.0]);
        let middle = middle.read_from(&mut reader).await.unwrap();
        assert_eq!(middle.range(), 8..12);
        drop((tail, middle));
        let values = landing.finish(Duration::from_secs(1)).await.unwrap();
        let tensor = values.into_tensor(&[5]).unwrap();
        assert_eq!(
            tensor.to_vec1::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0, 4.0, 5.0]
        );
    }

    #[tokio::test]
    async fn overlapping_misaligned_and_outside_claims_are_refused() {
        let landing = Landing::new(Element::F32, 4).unwrap();
        let _held = landing.claim(4..12).unwrap();
        for range in [0..8, 8..16, 4..8, 0..16, 2..4, 12..20] {
            assert!(landing.claim(range.clone()).is_err(), "{range:?} taken");
        }
        assert!(landing.claim(0..4).is_ok());
        assert!(landing.claim(12..16).is_ok());
        assert!(
            landing.claim(8..8).is_ok(),
            "an empty region overlaps nothing"
        );
    }

    #[tokio::test]
    async fn an_unfilled_region_fails_the_result_and_a_short_fill_leaves_it_unfilled() {
        let landing = Landing::new(Element::F32, 4).unwrap();
        let _ = landing.claim(0..8).unwrap().copy_from(&floats(&[1.0, 2.0]));
        let short = landing.claim(8..16).unwrap();
        assert!(short.fill_from_iter([3.0f32].into_iter()).is_err());
        let Err(err) = landing.finish(Duration::from_millis(10)).await else {
            panic!("a result with a region never filled was finished");
        };
        assert!(err.to_string().contains("only 8 in"), "{err}");

        let landing = Landing::new(Element::F32, 2).unwrap();
        let mut short: &[u8] = &[0u8; 5];
        let err = landing.claim(0..8).unwrap().read_from(&mut short).await;
        assert!(err.is_err(), "a stream that ends early fills nothing");
        let wrong_size = landing
            .claim(0..0)
            .unwrap()
            .fill_from_iter([1u64].into_iter());
        assert!(wrong_size.is_err());
    }

    /// A reader that fills a buffer of its own in place of the one it was given.
    struct Swapper;

    impl AsyncRead for Swapper {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let own: &'static mut [u8] = Box::leak(vec![7u8; buf.remaining()].into_boxed_slice());
            *buf = ReadBuf::new(own);
            buf.set_filled(buf.capacity());
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_reader_that_swaps_the_buffer_fills_nothing() {
        let landing = Landing::new(Element::F32, 2).unwrap();
        let err = landing.claim(0..8).unwrap().read_from(&mut Swapper).await;
        assert!(err.is_err());
        let Err(err) = landing.finish(Duration::ZERO).await else {
            panic!("a region the reader never wrote was taken as filled");
        };
        assert!(err.to_string().contains("only 0 in"), "{err}");
    }

    /// A result of [1, 2], whole, with its one region still held.
    fn filled_and_held() -> (Landing, Filled) {
        let landing = Landing::new(Element::F32, 2).unwrap();
        let held = landing
            .claim(0..8)
            .unwrap()
            .copy_from(&floats(&[1.0, 2.0]))
            .unwrap();
        (landing, held)
    }

    #[tokio::test]
    async fn finish_waits_for_a_held_region_and_copies_after_the_wait() {
        let (landing, held) = filled_and_held();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(held);
        });
        let values = landing.finish(Duration::from_secs(10)).await.unwrap();
        assert_eq!(
            values.into_tensor(&[2]).unwrap().to_vec1::<f32>().unwrap(),
            vec![1.0, 2.0]
        );
        release.await.unwrap();

        let (landing, held) = filled_and_held();
        let values = landing.finish(Duration::ZERO).await.unwrap();
        assert_eq!(
            held.bytes(),
            &floats(&[1.0, 2.0])[..],
            "the holder still reads"
        );
        assert_eq!(
            values.into_tensor(&[2]).unwrap().to_vec1::<f32>().unwrap(),
            vec![1.0, 2.0]
        );
    }
}
