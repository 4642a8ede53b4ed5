//! The operations of a [`ProcessGroup`]: all-reduce, reduce-scatter, all-gather, broadcast,
//! and the bucketed all-reduce of many tensors.
//!
//! This module owns the algorithms and their determinism (DATA-1); the group (`group/`)
//! moves the chunks. A tensor of `len` elements is cut into `n` segments (segment `k` holds
//! elements `k*(len/n) + min(k, len%n)` onwards, `len/n` of them plus one for the first
//! `len%n`), and each segment into chunks of at most `chunk_bytes`.
//!
//! - Reduction order: every element of segment `k` is reduced as
//!   `((x[k+1] op x[k+2]) op ...) op x[k]` (ranks mod `n`), whatever the algorithm and the
//!   timing, so the result is bit-identical on every member and from run to run. `Mean` is the
//!   sum divided by `n` afterwards, on each member alike.
//! - Large tensors (above `small_bytes_max`): a ring, reduce-scatter then all-gather. Every
//!   member sends to the next rank and receives from the previous one at once; each chunk is
//!   forwarded as soon as it is reduced, so all links carry data together and the steps
//!   overlap. Broadcast is a pipelined chain from the root.
//! - The ring operations write their results where they stay (`landing.rs`): the all-reduce's
//!   own segment reduced straight into it and sent on from there, the others' chunks received
//!   into it (straight from the link on the plaintext plane), its own first chunks sent from
//!   the input tensor itself; the result becomes the tensor's storage without another pass.
//!   A reduce-scatter reduces its segment into its result alike, an all-gather copies its
//!   own block into its result once and receives the others' there, a broadcast's members
//!   receive the root's chunks there and pass them on from it (the root copies its tensor
//!   into its own result once and sends from there).
//! - Small tensors (and zero-length ones): direct exchange, one message from each member to
//!   each member (broadcast: from the root, and a "done" back to it).
//!
//! Every call carries its operation, dtype and shape; a member whose call differs makes every
//! member fail with [`CollectiveError::Mismatch`].

use std::ops::Range;

use bytes::Bytes;
use candle_core::Tensor;

use super::element::{
    reduce_assign, reduce_into, reduced, tensor_error, Element, Elements, Input, Reduction,
};
use super::group::{ProcessGroup, Shared};
use super::landing::{Blob, Landing, PendingSum};
use super::wire::{tag, Call, CallOp, Phase};
use super::CollectiveError;
use crate::distribute::divide_by;

impl ProcessGroup {
    /// Reduces `tensor` element-wise with every member's; every member gets the result
    /// (bit-identical on all). Integer tensors averaged by `Mean` come back as f64.
    pub async fn all_reduce(
        &self,
        op: Reduction,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        self.all_reduce_parts(op, tensor, 0).await
    }

    /// Reduces `tensor` like [`ProcessGroup::all_reduce`] and returns only this member's
    /// segment of the flattened result (see the module doc for the segments; sizes that do not
    /// divide by the group size give the first `len % n` members one more element).
    pub async fn reduce_scatter(
        &self,
        op: Reduction,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let (element, data) = Input::of(tensor)?;
        let call = self.call(CallOp::ReduceScatter(op), element, tensor.dims(), 0);
        let n = self.size();
        let (guard, seq) = self.begin().await?;
        let result = run(
            &self.shared,
            seq,
            reduce_scatter(&self.shared, seq, &call, op, data),
        )
        .await;
        drop(guard);
        let count = segment(tensor.elem_count(), n, self.rank()).len();
        finish_mean(op, result?.into_tensor(&[count])?, n)
    }

    /// Concatenates every member's `tensor` along the first dimension, in rank order (scalars
    /// become a vector of `n`). Every member must pass the same shape.
    pub async fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let (element, data) = Input::of(tensor)?;
        let call = self.call(CallOp::AllGather, element, tensor.dims(), 0);
        let (guard, seq) = self.begin().await?;
        let result = run(
            &self.shared,
            seq,
            all_gather(&self.shared, seq, &call, data),
        )
        .await;
        drop(guard);
        let mut dims = tensor.dims().to_vec();
        match dims.first_mut() {
            Some(d0) => *d0 *= self.size(),
            None => dims.push(self.size()),
        }
        result?.into_tensor(&dims)
    }

    /// The root's `tensor`, on every member. Every member passes a tensor of the root's shape
    /// and dtype (its values are ignored).
    pub async fn broadcast(&self, root: usize, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        if root >= self.size() {
            return Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} outside the group of {} members",
                self.size()
            )));
        }
        let (element, data) = Input::of(tensor)?;
        let root_op = CallOp::Broadcast { root: root as u32 };
        let call = self.call(root_op, element, tensor.dims(), 0);
        let (guard, seq) = self.begin().await?;
        let result = run(
            &self.shared,
            seq,
            broadcast(&self.shared, seq, &call, root, data),
        )
        .await;
        drop(guard);
        result?.into_tensor(tensor.dims())
    }

    /// All-reduces `tensors` fused into buckets: consecutive tensors of one dtype, each bucket
    /// at most `bucket_bytes_max` (a larger tensor is a bucket of its own), one all-reduce per
    /// bucket, split back into the tensors' shapes. Every member must pass the same list.
    pub async fn all_reduce_bucketed(
        &self,
        op: Reduction,
        tensors: &[Tensor],
        bucket_bytes_max: usize,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if bucket_bytes_max == 0 {
            return Err(CollectiveError::InvalidArgument(
                "bucket_bytes_max must be above 0".into(),
            ));
        }
        let sizes = tensors
            .iter()
            .map(|t| {
                Ok((
                    Element::of(t.dtype())?,
                    t.elem_count() * t.dtype().size_in_bytes(),
                ))
            })
            .collect::<Result<Vec<_>, CollectiveError>>()?;
        let mut out = Vec::with_capacity(tensors.len());
        for bucket in plan_buckets(&sizes, bucket_bytes_max) {
            let members = &tensors[bucket];
            let flat = members
                .iter()
                .map(|t| t.flatten_all())
                .collect::<Result<Vec<_>, _>>()
                .map_err(tensor_error)?;
            let fused = Tensor::cat(&flat, 0).map_err(tensor_error)?;
            let parts = shapes_digest(members);
            let reduced = self.all_reduce_parts(op, &fused, parts).await?;
            let mut offset = 0;
            for t in members {
                let count = t.elem_count();
                let part = reduced
                    .narrow(0, offset, count)
                    .and_then(|p| p.reshape(t.dims()))
                    .map_err(tensor_error)?;
                out.push(part);
                offset += count;
            }
        }
        Ok(out)
    }

    async fn all_reduce_parts(
        &self,
        op: Reduction,
        tensor: &Tensor,
        parts: u64,
    ) -> Result<Tensor, CollectiveError> {
        let (element, data) = Input::of(tensor)?;
        let call = self.call(CallOp::AllReduce(op), element, tensor.dims(), parts);
        let n = self.size();
        let (guard, seq) = self.begin().await?;
        let result = run(
            &self.shared,
            seq,
            all_reduce(&self.shared, seq, &call, op, data),
        )
        .await;
        drop(guard);
        // The tensor is built over the result's buffer itself.
        let out = result?.into_tensor(tensor.dims())?;
        finish_mean(op, out, n)
    }

    fn call(&self, op: CallOp, element: Element, dims: &[usize], parts: u64) -> Call {
        let config = &self.shared.config;
        Call {
            op,
            element,
            dims: dims.iter().map(|&d| d as u64).collect(),
            parts,
            chunk_bytes: config.chunk_bytes as u64,
            small_bytes_max: config.small_bytes_max as u64,
        }
    }

    /// Takes the next sequence number, holding the group's operation lock.
    async fn begin(&self) -> Result<(tokio::sync::MutexGuard<'_, u64>, u64), CollectiveError> {
        let mut guard = self.shared.ops.lock().await;
        let seq = *guard;
        *guard += 1;
        if let Some(err) = self.broken() {
            self.shared.told().await;
            return Err(err);
        }
        Ok((guard, seq))
    }
}

/// The buckets of `tensors` (dtype and bytes of each, in order): ranges of consecutive
/// tensors of one dtype whose bytes sum to at most `bucket_bytes_max`, a larger tensor alone.
pub fn plan_buckets(tensors: &[(Element, usize)], bucket_bytes_max: usize) -> Vec<Range<usize>> {
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, (element, size)) in tensors.iter().enumerate() {
        let same_dtype = tensors[start].0 == *element;
        if i > start && (!same_dtype || bytes + size > bucket_bytes_max) {
            buckets.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < tensors.len() {
        buckets.push(start..tensors.len());
    }
    buckets
}

/// Runs call `seq`'s algorithm; its error (or a tensor error) breaks the group for every member.
/// A failed call returns once the others heard why ([`Shared::told`]). A call given up before
/// its algorithm ended (its future dropped) takes this member out of the group
/// ([`Shared::abandon`]): the others' calls would otherwise wait out the operation timeout for
/// chunks that never come, and this member's next call would start one step out of line.
async fn run<T>(
    shared: &Shared,
    seq: u64,
    algorithm: impl std::future::Future<Output = Result<T, CollectiveError>>,
) -> Result<T, CollectiveError> {
    let mut pending = Pending {
        shared,
        ended: false,
    };
    let outcome = algorithm.await;
    pending.ended = true;
    match outcome {
        Ok(out) => {
            shared.call_ended(seq);
            Ok(out)
        }
        Err(err) => {
            let err = shared.fail(err, true);
            shared.told().await;
            Err(err)
        }
    }
}

/// A call whose algorithm has not ended: dropped so, it abandons the group.
struct Pending<'a> {
    shared: &'a Shared,
    ended: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.shared.abandon();
        }
    }
}

/// The all-reduce of `data` (this member's tensor): the reduced segments, put together.
async fn all_reduce(
    g: &Shared,
    seq: u64,
    call: &Call,
    op: Reduction,
    data: Input,
) -> Result<Elements, CollectiveError> {
    let n = g.nodes.len();
    let es = call.element.size();
    let len = data.len() / es;
    if n == 1 {
        return data.read(0..data.len(), |whole| {
            Elements::from_chunks(call.element, &[whole])
        })?;
    }
    if data.len() <= g.config.small_bytes_max {
        let mine = data.read(0..data.len(), Bytes::copy_from_slice)?;
        let all = exchange_all(g, seq, call, &mine).await?;
        let mut out = vec![0u8; mine.len()];
        for k in 0..n {
            let seg = bytes_of(segment(len, n, k), es);
            fold_segment(call.element, op, &mut out[seg.clone()], k, n, |j| {
                &all[j][seg.clone()]
            });
        }
        return Elements::from_chunks(call.element, &[&out]);
    }
    // The result is written where it stays: this member's segment reduced straight into it
    // (and sent on from there as the all-gather's step 0), the others' segments received into
    // it (on the plaintext plane straight from the link, else copied from the message).
    let out = Landing::new(call.element, len)?;
    let chunk_bytes = g.config.chunk_bytes;
    let chunks_of = |k| -> Vec<Range<usize>> {
        chunks(segment(len, n, k), es, chunk_bytes)
            .map(|chunk| bytes_of(chunk, es))
            .collect()
    };
    let prev = (g.rank + n - 1) % n;
    let expected = ExpectedLandings { g, seq };
    for s in 0..n - 1 {
        let k = (g.rank + 2 * n - s - 1) % n;
        for (c, range) in chunks_of(k).into_iter().enumerate() {
            expect(g, &out, (prev, seq, tag(Phase::AllGather, s, c)), range)?;
        }
    }
    reduce_scatter_ring(g, seq, call, op, &data, true, |range, partial, mine| {
        reduce_into(call.element, op, partial, mine, out.claim(range)?).map(Blob::Landed)
    })
    .await?;
    ring_gather_phase(g, seq, call, chunks_of, |tag, range, got| {
        land(g, &out, (prev, seq, tag), range, got)
    })
    .await?;
    drop(expected);
    out.finish(release_wait(len * es)).await
}

/// Lets the result `out` expect chunk `tag` of call `seq` from `from` in its byte `range`
/// (on the plaintext plane the chunk is then received straight into it).
fn expect(
    g: &Shared,
    out: &Landing,
    (from, seq, tag): (usize, u64, u64),
    range: Range<usize>,
) -> Result<(), CollectiveError> {
    if g.config.plaintext {
        g.expect_landing(from, seq, tag, out.claim(range)?);
    }
    Ok(())
}

/// Puts chunk `tag` of call `seq` from `from`, received as `got`, in its byte `range` of the
/// result `out`: nothing to do if it was received there, else copied into the region the call
/// expected it in (or claimed now).
fn land(
    g: &Shared,
    out: &Landing,
    (from, seq, tag): (usize, u64, u64),
    range: Range<usize>,
    got: Blob,
) -> Result<(), CollectiveError> {
    if let Blob::Landed(filled) = &got {
        if filled.range() == range {
            return Ok(());
        }
    }
    let expected = g.config.plaintext.then(|| g.take_landing(from, seq, tag));
    let region = match expected.flatten() {
        Some(region) => region,
        None => out.claim(range)?,
    };
    got.read(|bytes| region.copy_from(bytes))?.map(drop)
}

/// How long an all-reduce's result of `bytes` waits for its last chunks to be written out to
/// the next member (they are sent from the result itself) before it copies itself out
/// instead: about as long as that copy would take, so that waiting never costs much more than
/// copying; no wait at all where the copy takes less than a timer tick (a small result's
/// last send can lag behind on a busy runtime).
fn release_wait(bytes: usize) -> std::time::Duration {
    let copy = std::time::Duration::from_secs_f64(bytes as f64 / COPY_BYTES_PER_SECOND);
    if copy < std::time::Duration::from_millis(1) {
        std::time::Duration::ZERO
    } else {
        copy.min(RELEASE_WAIT_MAX)
    }
}

/// A copy's speed on the machines cohort runs on, roughly (memcpy of large buffers).
const COPY_BYTES_PER_SECOND: f64 = 4e9;
/// Bound on [`release_wait`].
const RELEASE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Forgets the regions a call expected chunks in, however the call ends (cancelled included),
/// so that no region waits for a chunk after it (a chunk already received into one stays in
/// the inbox, as any delivered chunk does, until the group breaks or goes).
struct ExpectedLandings<'a> {
    g: &'a Shared,
    seq: u64,
}

impl Drop for ExpectedLandings<'_> {
    fn drop(&mut self) {
        self.g.clear_landings(self.seq);
    }
}

async fn reduce_scatter(
    g: &Shared,
    seq: u64,
    call: &Call,
    op: Reduction,
    data: Input,
) -> Result<Elements, CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    let es = call.element.size();
    let len = data.len() / es;
    let mine = bytes_of(segment(len, n, r), es);
    if n == 1 {
        return data.read(0..data.len(), |whole| {
            Elements::from_chunks(call.element, &[whole])
        })?;
    }
    if data.len() <= g.config.small_bytes_max {
        // Each member sends each other member only that member's segment.
        let data = data.read(0..data.len(), Bytes::copy_from_slice)?;
        for j in (0..n).filter(|&j| j != r) {
            let seg = bytes_of(segment(len, n, j), es);
            g.send(j, seq, tag(Phase::Direct, 0, 0), call, data.slice(seg));
        }
        let mut parts: Vec<Bytes> = vec![Bytes::new(); n];
        parts[r] = data.slice(mine.clone());
        for (j, part) in parts.iter_mut().enumerate().filter(|(j, _)| *j != r) {
            *part = g
                .recv(j, seq, tag(Phase::Direct, 0, 0), call, mine.len())
                .await?;
        }
        let mut out = vec![0u8; mine.len()];
        fold_segment(call.element, op, &mut out, r, n, |j| &parts[j][..]);
        return Elements::from_chunks(call.element, &[&out]);
    }
    // This member's segment is reduced straight into the result (nothing is sent from it).
    let own = Landing::new(call.element, mine.len() / es)?;
    reduce_scatter_ring(g, seq, call, op, &data, false, |range, partial, x| {
        let region = own.claim(range.start - mine.start..range.end - mine.start)?;
        reduce_into(call.element, op, partial, x, region).map(Blob::Landed)
    })
    .await?;
    own.finish(std::time::Duration::ZERO).await
}

/// The ring's reduce-scatter of `data` (read where it lies, never written, and sent from
/// there). At step `s` member `r` sends segment `r-s-1` to `r+1` and receives segment
/// `r-s-2` from `r-1`, adding its own; segment `r` is final at the last step, and each of its
/// chunks is `finish(its byte range in the tensor, the partial received, this member's own)`,
/// which reduces the two (`partial op own`) wherever the caller keeps it, in order. With
/// `then_gather`, each final chunk is also sent on at once as the all-gather's step 0.
async fn reduce_scatter_ring(
    g: &Shared,
    seq: u64,
    call: &Call,
    op: Reduction,
    data: &Input,
    then_gather: bool,
    mut finish: impl FnMut(Range<usize>, &[u8], &[u8]) -> Result<Blob, CollectiveError>,
) -> Result<(), CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    let es = call.element.size();
    let len = data.len() / es;
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    let first = (r + n - 1) % n;
    for (c, chunk) in chunks(segment(len, n, first), es, g.config.chunk_bytes).enumerate() {
        let range = bytes_of(chunk, es);
        // Sent from the input itself only where the call cannot end before it was written:
        // with `then_gather` every chunk comes back inside a final one; a reduce-scatter's own
        // result does not wait for it, and its caller may change the tensor once it returns.
        let blob = if then_gather {
            Blob::Input(data.clone(), range)
        } else {
            Blob::Bytes(data.read(range, Bytes::copy_from_slice)?)
        };
        g.send(next, seq, tag(Phase::ReduceScatter, 0, c), call, blob);
    }
    for s in 0..n - 1 {
        let k = (r + 2 * n - s - 2) % n;
        for (c, chunk) in chunks(segment(len, n, k), es, g.config.chunk_bytes).enumerate() {
            let range = bytes_of(chunk, es);
            // Where it came: in bytes of its own, or in a slot of the sender's shared memory,
            // read from there (never copied out first).
            let partial = g
                .recv_blob(
                    prev,
                    seq,
                    tag(Phase::ReduceScatter, s, c),
                    call,
                    range.len(),
                )
                .await?;
            // `partial op own`: the group's order (module doc).
            if s + 1 < n - 1 {
                let acc = match partial {
                    Blob::Bytes(partial) => Blob::Bytes(data.read(range.clone(), |mine| {
                        match partial.try_into_mut() {
                            // Into the partial's own buffer, just written and not shared: no
                            // fresh memory to fault in or pull through the cache.
                            Ok(mut acc) => {
                                reduce_assign(call.element, op, &mut acc, mine);
                                acc.freeze()
                            }
                            Err(partial) => reduced(call.element, op, &partial, mine),
                        }
                    })?),
                    // In a slot of the previous member's shared memory: reduced where it goes
                    // (into a slot of this member's, if the next member takes them), written
                    // once. An all-reduce only, whose call outlasts the sending (PendingSum).
                    Blob::Slot(partial) if then_gather => Blob::Sum(Box::new(PendingSum {
                        element: call.element,
                        op,
                        partial,
                        mine: data.clone(),
                        range: range.clone(),
                    })),
                    elsewhere => Blob::Bytes(elsewhere.read(|partial| {
                        data.read(range.clone(), |mine| {
                            reduced(call.element, op, partial, mine)
                        })
                    })??),
                };
                g.send(next, seq, tag(Phase::ReduceScatter, s + 1, c), call, acc);
            } else {
                let done = partial.read(|partial| {
                    data.read(range.clone(), |mine| finish(range.clone(), partial, mine))
                })???;
                if then_gather {
                    g.send(next, seq, tag(Phase::AllGather, 0, c), call, done);
                }
            }
        }
    }
    Ok(())
}

/// The all-gather of `data` (this member's block): every member's block in rank order, in
/// a result written where it stays, as the all-reduce's (module doc): this member's block
/// copied into it once and sent on from there, the others' received into it.
async fn all_gather(
    g: &Shared,
    seq: u64,
    call: &Call,
    data: Input,
) -> Result<Elements, CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    let es = call.element.size();
    let block = data.len();
    if n == 1 {
        return data.read(0..block, |whole| {
            Elements::from_chunks(call.element, &[whole])
        })?;
    }
    if block <= g.config.small_bytes_max {
        let mine = data.read(0..block, Bytes::copy_from_slice)?;
        let all = exchange_all(g, seq, call, &mine).await?;
        let parts: Vec<&[u8]> = all.iter().map(|part| &part[..]).collect();
        return Elements::from_chunks(call.element, &parts);
    }
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    let out = Landing::new(call.element, block / es * n)?;
    let cuts: Vec<Range<usize>> = chunks(0..block / es, es, g.config.chunk_bytes)
        .map(|cut| bytes_of(cut, es))
        .collect();
    let chunks_of = |k: usize| -> Vec<Range<usize>> {
        cuts.iter()
            .map(|cut| k * block + cut.start..k * block + cut.end)
            .collect()
    };
    let expected = ExpectedLandings { g, seq };
    for s in 0..n - 1 {
        let k = (r + 2 * n - s - 1) % n;
        for (c, range) in chunks_of(k).into_iter().enumerate() {
            expect(g, &out, (prev, seq, tag(Phase::AllGather, s, c)), range)?;
        }
    }
    for (c, (cut, range)) in cuts.iter().zip(chunks_of(r)).enumerate() {
        let region = out.claim(range)?;
        let filled = data.read(cut.clone(), |bytes| region.copy_from(bytes))??;
        g.send(
            next,
            seq,
            tag(Phase::AllGather, 0, c),
            call,
            Blob::Landed(filled),
        );
    }
    ring_gather_phase(g, seq, call, chunks_of, |tag, range, got| {
        land(g, &out, (prev, seq, tag), range, got)
    })
    .await?;
    drop(expected);
    out.finish(release_wait(block * n)).await
}

/// The gathering phase of a ring, after each member sent its own segment's chunks at step 0:
/// at step `s` a member receives segment `k = (rank - s - 1) mod n` from its predecessor,
/// chunk by chunk (`chunks_of(k)`: the byte ranges of segment `k`'s chunks, in order), passes
/// it on to its successor unless it is the last step (from where it is), and hands it to
/// `keep(its tag, range, chunk)` (whose error ends the call).
async fn ring_gather_phase(
    g: &Shared,
    seq: u64,
    call: &Call,
    chunks_of: impl Fn(usize) -> Vec<Range<usize>>,
    mut keep: impl FnMut(u64, Range<usize>, Blob) -> Result<(), CollectiveError>,
) -> Result<(), CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    for s in 0..n - 1 {
        let k = (r + 2 * n - s - 1) % n;
        for (c, range) in chunks_of(k).into_iter().enumerate() {
            let got_tag = tag(Phase::AllGather, s, c);
            let got = g.recv_blob(prev, seq, got_tag, call, range.len()).await?;
            if s + 1 < n - 1 {
                g.send(
                    next,
                    seq,
                    tag(Phase::AllGather, s + 1, c),
                    call,
                    got.clone(),
                );
            }
            keep(got_tag, range, got)?;
        }
    }
    Ok(())
}

/// The broadcast of the root's `data`: its values on every member, in a result written where
/// it stays (as the all-reduce's, module doc). The root copies its tensor into its own result
/// once, at the start (every member gets that snapshot; the result shares nothing with the
/// input, which a candle `Var` may write in place) and sends each chunk from there; the
/// others receive each chunk into their result and pass it down the chain from there.
async fn broadcast(
    g: &Shared,
    seq: u64,
    call: &Call,
    root: usize,
    data: Input,
) -> Result<Elements, CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    let len = data.len();
    if n == 1 {
        return data.read(0..len, |whole| {
            Elements::from_chunks(call.element, &[whole])
        })?;
    }
    let es = call.element.size();
    let done = tag(Phase::Broadcast, DONE_STEP, 0);
    if len <= g.config.small_bytes_max {
        if r == root {
            let data = data.read(0..len, Bytes::copy_from_slice)?;
            for j in (0..n).filter(|&j| j != r) {
                g.send(j, seq, tag(Phase::Direct, 0, 0), call, data.clone());
            }
            // The members' "done" says each saw the root's call and agreed with it.
            for j in (0..n).filter(|&j| j != r) {
                g.recv(j, seq, done, call, 0).await?;
            }
            return Elements::from_chunks(call.element, &[&data]);
        }
        let got = g
            .recv(root, seq, tag(Phase::Direct, 0, 0), call, len)
            .await?;
        g.send(root, seq, done, call, Bytes::new());
        return Elements::from_chunks(call.element, &[&got]);
    }
    // A chain root, root+1, ..., root-1; the last tells the root it got everything.
    let position = (r + n - root) % n;
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    let cuts: Vec<Range<usize>> = chunks(0..len / es, es, g.config.chunk_bytes)
        .map(|cut| bytes_of(cut, es))
        .collect();
    let out = Landing::new(call.element, len / es)?;
    if position == 0 {
        for (c, cut) in cuts.iter().enumerate() {
            let region = out.claim(cut.clone())?;
            let filled = data.read(cut.clone(), |bytes| region.copy_from(bytes))??;
            g.send(
                next,
                seq,
                tag(Phase::Broadcast, 0, c),
                call,
                Blob::Landed(filled),
            );
        }
        g.recv(prev, seq, done, call, 0).await?;
        return out.finish(release_wait(len)).await;
    }
    let expected = ExpectedLandings { g, seq };
    for (c, cut) in cuts.iter().enumerate() {
        expect(
            g,
            &out,
            (prev, seq, tag(Phase::Broadcast, 0, c)),
            cut.clone(),
        )?;
    }
    for (c, cut) in cuts.iter().enumerate() {
        let got_tag = tag(Phase::Broadcast, 0, c);
        let got = g.recv_blob(prev, seq, got_tag, call, cut.len()).await?;
        if position < n - 1 {
            g.send(next, seq, got_tag, call, got.clone());
        }
        land(g, &out, (prev, seq, got_tag), cut.clone(), got)?;
    }
    if position == n - 1 {
        g.send(root, seq, done, call, Bytes::new());
    }
    drop(expected);
    out.finish(release_wait(len)).await
}

/// Direct exchange: sends `data` to every member and returns every member's, in rank order.
async fn exchange_all(
    g: &Shared,
    seq: u64,
    call: &Call,
    data: &Bytes,
) -> Result<Vec<Bytes>, CollectiveError> {
    let (n, r) = (g.nodes.len(), g.rank);
    for j in (0..n).filter(|&j| j != r) {
        g.send(j, seq, tag(Phase::Direct, 0, 0), call, data.clone());
    }
    let mut all = vec![Bytes::new(); n];
    all[r] = data.clone();
    for (j, slot) in all.iter_mut().enumerate().filter(|(j, _)| *j != r) {
        *slot = g
            .recv(j, seq, tag(Phase::Direct, 0, 0), call, data.len())
            .await?;
    }
    Ok(all)
}

/// `out = ((x[k+1] op x[k+2]) op ...) op x[k]`, the order of segment `k` (module doc).
fn fold_segment<'a>(
    element: Element,
    op: Reduction,
    out: &mut [u8],
    k: usize,
    n: usize,
    part: impl Fn(usize) -> &'a [u8],
) {
    out.copy_from_slice(part((k + 1) % n));
    for i in 2..=n {
        reduce_assign(element, op, out, part((k + i) % n));
    }
}

fn finish_mean(op: Reduction, out: Tensor, n: usize) -> Result<Tensor, CollectiveError> {
    match op {
        Reduction::Mean => divide_by(&out, n as f64).map_err(tensor_error),
        _ => Ok(out),
    }
}

/// Segment `k` of `n` of `len` elements (module doc).
pub(crate) fn segment(len: usize, n: usize, k: usize) -> Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = k * base + k.min(extra);
    start..start + base + usize::from(k < extra)
}

/// `elements` cut into chunks of at most `chunk_bytes` (at least one element each); an empty
/// range is one empty chunk, so that every step of the ring sends a message.
fn chunks(
    elements: Range<usize>,
    element_size: usize,
    chunk_bytes: usize,
) -> impl Iterator<Item = Range<usize>> {
    let per_chunk = (chunk_bytes / element_size).max(1);
    let count = elements.len().div_ceil(per_chunk).max(1);
    (0..count).map(move |i| {
        let start = elements.start + i * per_chunk;
        start..(start + per_chunk).min(elements.end).max(start)
    })
}

fn bytes_of(elements: Range<usize>, element_size: usize) -> Range<usize> {
    elements.start * element_size..elements.end * element_size
}

/// A digest of the shapes and dtypes fused into a bucket (FNV-1a), so that members fusing
/// different tensors of the same total size disagree visibly (the NCCL sums check it too,
/// `span.rs`).
pub(crate) fn shapes_digest(tensors: &[Tensor]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |bytes: &[u8]| {
        for &byte in bytes {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for t in tensors {
        mix(t.dtype().as_str().as_bytes());
        for &d in t.dims().iter().chain(std::iter::once(&usize::MAX)) {
            mix(&(d as u64).to_le_bytes());
        }
    }
    hash | 1
}

/// The step of the broadcast's "done" tag.
const DONE_STEP: usize = 0xff_ffff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_tensor_and_differ_by_at_most_one() {
        for len in [0, 1, 2, 7, 10, 1001] {
            for n in 1..=5 {
                let segs: Vec<_> = (0..n).map(|k| segment(len, n, k)).collect();
                assert_eq!(segs[0].start, 0);
                assert_eq!(segs[n - 1].end, len);
                for w in segs.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }

    #[test]
    fn chunks_are_bounded_and_an_empty_segment_is_one_empty_chunk() {
        let cut: Vec<_> = chunks(10..21, 4, 16).collect();
        assert_eq!(cut, vec![10..14, 14..18, 18..21]);
        assert_eq!(chunks(5..5, 4, 16).collect::<Vec<_>>(), vec![5..5]);
        assert_eq!(chunks(0..3, 8, 4).count(), 3);
    }

    #[test]
    fn buckets_keep_order_dtype_and_limit() {
        let f = Element::F32;
        let plan = plan_buckets(
            &[
                (f, 40),
                (f, 40),
                (f, 40),
                (Element::F64, 8),
                (f, 200),
                (f, 0),
                (f, 10),
            ],
            100,
        );
        assert_eq!(plan, vec![0..2, 2..3, 3..4, 4..5, 5..7]);
        assert!(plan_buckets(&[], 100).is_empty());
    }
}
