//! The iterators behind a [`Dataset`]: one per stage, built fresh for every pass.
//!
//! Every iterator yields `Result<Element, DataError>`; an `Err` stands for one failed element
//! and iteration may go on after it. No iterator panics on data.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread;

use candle_core::Tensor;
use cohort_actors::contain_panic;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::dataset::{check_map_output, next_epoch, Dataset, FilterFn, Node, Source};
use super::files::CsvIter;
use super::spec::Element;
use super::DataError;

/// A boxed element iterator that can move to another thread.
pub(crate) type BoxIter = Box<dyn Iterator<Item = Result<Element, DataError>> + Send>;

/// An iterator over a [`Dataset`]'s elements; built by [`Dataset::iter`].
///
/// Yields `Err` for an element that failed (a map error, a bad record) and carries on with the
/// next element afterwards, as TensorFlow does; `None` at the end of the data.
pub struct DatasetIterator {
    inner: BoxIter,
}

impl Dataset {
    /// A fresh iterator from the start of the data. A pipeline that fails [`Dataset::validate`]
    /// yields that error once, then ends.
    pub fn iter(&self) -> DatasetIterator {
        let inner = match self.validate() {
            Ok(()) => self.build(),
            Err(e) => Box::new(std::iter::once(Err(e))),
        };
        DatasetIterator { inner }
    }

    /// This dataset's stages as iterators, fresh from the start of the data.
    pub(crate) fn build(&self) -> BoxIter {
        build(self)
    }
}

impl Iterator for DatasetIterator {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

impl std::fmt::Debug for DatasetIterator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetIterator").finish_non_exhaustive()
    }
}

impl IntoIterator for &Dataset {
    type Item = Result<Element, DataError>;
    type IntoIter = DatasetIterator;

    fn into_iter(self) -> DatasetIterator {
        self.iter()
    }
}

/// Builds a fresh iterator for `dataset` (arguments already validated).
///
/// Longer than most functions here on purpose: one arm per kind of dataset node, each the
/// iterator that carries it out.
pub(crate) fn build(dataset: &Dataset) -> BoxIter {
    match dataset.node() {
        Node::Source(Source::Tensors(element)) => Box::new(std::iter::once(Ok(element.clone()))),
        Node::Source(Source::Slices(components)) => Box::new(SliceIter {
            rows: components
                .first()
                .map_or(0, |c| c.dims().first().copied().unwrap_or(0)),
            components: components.clone(),
            next_row: 0,
        }),
        Node::Source(Source::Range { start, stop, step }) => Box::new(RangeIter {
            next: Some(*start),
            stop: *stop,
            step: *step,
        }),
        Node::Source(Source::Csv { files, format }) => {
            Box::new(CsvIter::new(files.clone(), format.clone()))
        }
        Node::Repeat { input, count } => Box::new(RepeatIter {
            input: input.clone(),
            passes_left: *count,
            current: None,
            produced_this_pass: false,
        }),
        Node::Batch {
            input,
            batch_size,
            drop_remainder,
        } => match slice_batches(input, *batch_size, *drop_remainder) {
            Some(fast) => Box::new(fast),
            None => Box::new(BatchIter {
                input: Some(input.build()),
                batch_size: *batch_size,
                drop_remainder: *drop_remainder,
            }),
        },
        Node::Shuffle {
            input,
            buffer_size,
            seed,
            reshuffle_each_iteration,
            epochs,
        } => {
            let mut rng = ChaCha8Rng::seed_from_u64(*seed);
            // DATA-1: the order depends only on the seed and on how many iterators this
            // stage built before (the epoch), never on time or thread.
            let epoch = next_epoch(epochs);
            rng.set_stream(if *reshuffle_each_iteration { epoch } else { 0 });
            Box::new(ShuffleIter {
                input: Some(input.build()),
                buffer: Vec::with_capacity((*buffer_size).min(SHUFFLE_PREALLOC_MAX)),
                buffer_size: *buffer_size,
                rng,
            })
        }
        Node::Map { input, f } => {
            let f = f.clone();
            let spec = dataset.element_spec().to_vec();
            Box::new(input.build().map(move |item| {
                item.and_then(|e| f(e))
                    .and_then(|e| check_map_output(&spec, e))
            }))
        }
        Node::Filter { input, f } => Box::new(FilterIter {
            input: input.build(),
            predicate: f.clone(),
        }),
        Node::Take { input, count } => Box::new(input.build().take(*count)),
        Node::Skip { input, count } => Box::new(SkipIter {
            input: input.build(),
            to_skip: *count,
        }),
        Node::Shard {
            input,
            num_shards,
            index,
        } => {
            let (num_shards, index) = (*num_shards, *index);
            Box::new(
                input
                    .build()
                    .enumerate()
                    .filter(move |(i, _)| i % num_shards == index)
                    .map(|(_, item)| item),
            )
        }
        Node::Prefetch { input, buffer_size } => spawn_prefetch(input.clone(), *buffer_size),
        Node::Rebatch { input, batch_sizes } => Box::new(RebatchIter {
            input: input.build(),
            batch_sizes: batch_sizes.clone(),
            position: 0,
            current: None,
            offset: 0,
            done: false,
        }),
        Node::LegacyRebatch {
            input,
            num_replicas,
        } => Box::new(LegacyRebatchIter {
            input: input.build(),
            num_replicas: *num_replicas,
            pending: VecDeque::new(),
        }),
    }
}

/// Stacks elements along a new outer dimension, component by component.
pub(crate) fn stack_elements(op: &'static str, elements: &[Element]) -> Result<Element, DataError> {
    let Some(first) = elements.first() else {
        return Err(DataError::invalid(op, "no elements to stack"));
    };
    let mut out = Vec::with_capacity(first.len());
    for (c, head) in first.iter().enumerate() {
        let mut parts = Vec::with_capacity(elements.len());
        for e in elements {
            let Some(t) = e.get(c).filter(|_| e.len() == first.len()) else {
                return Err(DataError::SpecMismatch {
                    op,
                    reason: format!("elements with {} and {} components", first.len(), e.len()),
                });
            };
            if t.dims() != head.dims() {
                return Err(DataError::IncompatibleShapes {
                    op,
                    component: c,
                    expected: head.dims().to_vec(),
                    got: t.dims().to_vec(),
                });
            }
            parts.push(t);
        }
        out.push(Tensor::stack(&parts, 0)?);
    }
    Ok(out)
}

/// The number of rows (outer dimension) shared by every component of a batched element.
fn batch_rows(op: &'static str, element: &Element) -> Result<usize, DataError> {
    let mut rows = None;
    for (c, t) in element.iter().enumerate() {
        let Some(&outer) = t.dims().first() else {
            return Err(DataError::SpecMismatch {
                op,
                reason: format!("component {c} is a scalar; rebatching needs batched input"),
            });
        };
        match rows {
            None => rows = Some(outer),
            Some(r) if r != outer => {
                return Err(DataError::IncompatibleShapes {
                    op,
                    component: c,
                    expected: vec![r],
                    got: vec![outer],
                })
            }
            Some(_) => {}
        }
    }
    rows.ok_or_else(|| DataError::invalid(op, "element has no components"))
}

fn narrow_element(element: &Element, start: usize, len: usize) -> Result<Element, DataError> {
    element
        .iter()
        .map(|t| t.narrow(0, start, len).map_err(DataError::from))
        .collect()
}

fn concat_pieces(pieces: Vec<Element>) -> Result<Element, DataError> {
    if pieces.len() == 1 {
        return Ok(pieces.into_iter().next().unwrap_or_default());
    }
    let components = pieces.first().map_or(0, Vec::len);
    (0..components)
        .map(|c| {
            let parts: Vec<&Tensor> = pieces.iter().map(|p| &p[c]).collect();
            Tensor::cat(&parts, 0).map_err(DataError::from)
        })
        .collect()
}

struct SliceIter {
    components: Element,
    rows: usize,
    next_row: usize,
}

impl Iterator for SliceIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_row >= self.rows {
            return None;
        }
        let row = self.next_row;
        self.next_row += 1;
        Some(
            self.components
                .iter()
                .map(|c| c.get(row).map_err(DataError::from))
                .collect(),
        )
    }
}

struct RangeIter {
    next: Option<i64>,
    stop: i64,
    step: i64,
}

impl Iterator for RangeIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let value = self.next?;
        let in_range = if self.step > 0 {
            value < self.stop
        } else {
            value > self.stop
        };
        if !in_range {
            self.next = None;
            return None;
        }
        self.next = value.checked_add(self.step);
        Some(
            Tensor::new(value, &candle_core::Device::Cpu)
                .map(|t| vec![t])
                .map_err(DataError::from),
        )
    }
}

struct RepeatIter {
    input: Dataset,
    passes_left: Option<usize>,
    current: Option<BoxIter>,
    produced_this_pass: bool,
}

impl Iterator for RepeatIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                match &mut self.passes_left {
                    Some(0) => return None,
                    Some(n) => *n -= 1,
                    None => {}
                }
                self.current = Some(self.input.build());
                self.produced_this_pass = false;
            }
            match self.current.as_mut().and_then(Iterator::next) {
                Some(item) => {
                    self.produced_this_pass = true;
                    return Some(item);
                }
                None => {
                    self.current = None;
                    // An empty pass means every pass is empty: stop rather than spin forever.
                    if !self.produced_this_pass {
                        self.passes_left = Some(0);
                        return None;
                    }
                }
            }
        }
    }
}

struct BatchIter {
    input: Option<BoxIter>,
    batch_size: usize,
    drop_remainder: bool,
}

impl Iterator for BatchIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let input = self.input.as_mut()?;
        let mut elements = Vec::with_capacity(self.batch_size.min(BATCH_PREALLOC_MAX));
        while elements.len() < self.batch_size {
            match input.next() {
                Some(Ok(e)) => elements.push(e),
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.input = None;
                    break;
                }
            }
        }
        if elements.is_empty() || (self.drop_remainder && elements.len() < self.batch_size) {
            return None;
        }
        Some(stack_elements("batch", &elements))
    }
}

/// `batch` straight over `from_tensor_slices` (optionally repeated): batches are row ranges
/// of the source tensors, cut with `narrow` instead of slicing and stacking row by row. Same
/// values, same order as [`BatchIter`]; this is the common `slices.repeat().batch(n)` case.
struct SliceBatchIter {
    components: Element,
    rows: usize,
    next_row: usize,
    /// The pass over the rows in progress, from 0.
    pass: usize,
    /// How many passes in all; `None` forever.
    passes: Option<usize>,
    batch_size: usize,
    drop_remainder: bool,
}

/// The fast path for `batch`, when its input is (a repeat of) tensor slices.
fn slice_batches(
    input: &Dataset,
    batch_size: usize,
    drop_remainder: bool,
) -> Option<SliceBatchIter> {
    let (components, passes) = match input.node() {
        Node::Source(Source::Slices(c)) => (c, Some(1)),
        Node::Repeat { input, count } => match input.node() {
            Node::Source(Source::Slices(c)) => (c, *count),
            _ => return None,
        },
        _ => return None,
    };
    let rows = components.first()?.dims().first().copied()?;
    // Nothing to read (an empty source, or zero passes): start at the end of the last pass,
    // as `repeat` itself stops on an empty pass.
    let empty = rows == 0 || passes == Some(0);
    Some(SliceBatchIter {
        components: components.clone(),
        rows,
        next_row: if empty { rows } else { 0 },
        pass: 0,
        passes: if empty { Some(0) } else { passes },
        batch_size,
        drop_remainder,
    })
}

impl Iterator for SliceBatchIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut got = 0;
        while got < self.batch_size {
            if self.next_row == self.rows {
                let last_pass = self.passes.is_some_and(|n| self.pass + 1 >= n);
                if last_pass || self.rows == 0 {
                    break;
                }
                self.pass += 1;
                self.next_row = 0;
            }
            let take = (self.batch_size - got).min(self.rows - self.next_row);
            runs.push((self.next_row, take));
            self.next_row += take;
            got += take;
        }
        if got == 0 || (self.drop_remainder && got < self.batch_size) {
            return None;
        }
        let batch = runs
            .iter()
            .map(|&(start, len)| narrow_element(&self.components, start, len))
            .collect::<Result<Vec<_>, _>>()
            .and_then(concat_pieces);
        Some(batch)
    }
}

struct ShuffleIter {
    input: Option<BoxIter>,
    buffer: Vec<Element>,
    buffer_size: usize,
    rng: ChaCha8Rng,
}

impl Iterator for ShuffleIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.buffer.len() < self.buffer_size {
            let Some(input) = self.input.as_mut() else {
                break;
            };
            match input.next() {
                Some(Ok(e)) => self.buffer.push(e),
                Some(Err(e)) => return Some(Err(e)),
                None => self.input = None,
            }
        }
        if self.buffer.is_empty() {
            return None;
        }
        let pick = self.rng.gen_range(0..self.buffer.len());
        Some(Ok(self.buffer.swap_remove(pick)))
    }
}

struct FilterIter {
    input: BoxIter,
    predicate: FilterFn,
}

impl Iterator for FilterIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let element = match self.input.next()? {
                Ok(e) => e,
                Err(e) => return Some(Err(e)),
            };
            match (self.predicate)(&element) {
                Ok(true) => return Some(Ok(element)),
                Ok(false) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

struct SkipIter {
    input: BoxIter,
    to_skip: usize,
}

impl Iterator for SkipIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.to_skip > 0 {
            self.to_skip -= 1;
            if let Err(e) = self.input.next()? {
                return Some(Err(e));
            }
        }
        self.input.next()
    }
}

/// Splits input batches into output batches of `batch_sizes[i % len]` rows, taking rows across
/// input batches when one runs short; the very last output may be partial. A size of 0 gives
/// an empty batch while more input remains.
struct RebatchIter {
    input: BoxIter,
    batch_sizes: Vec<usize>,
    position: usize,
    current: Option<(Element, usize)>,
    offset: usize,
    done: bool,
}

impl Iterator for RebatchIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.batch_sizes.is_empty() {
            return None;
        }
        let want = self.batch_sizes[self.position % self.batch_sizes.len()];
        let mut pieces = Vec::new();
        let mut got = 0;
        loop {
            // Never pull input past what this output needs: an error or the end belongs to
            // the next output.
            if want > 0 && got == want {
                break;
            }
            let available = self
                .current
                .as_ref()
                .map_or(0, |(_, rows)| rows - self.offset);
            if available == 0 {
                match self.input.next() {
                    None => {
                        self.done = true;
                        break;
                    }
                    Some(Err(e)) => return Some(Err(e)),
                    Some(Ok(batch)) => match batch_rows("rebatch", &batch) {
                        Ok(rows) => {
                            self.current = Some((batch, rows));
                            self.offset = 0;
                            continue;
                        }
                        Err(e) => return Some(Err(e)),
                    },
                }
            }
            if got == want {
                break;
            }
            let take = (want - got).min(available);
            let Some((batch, _)) = self.current.as_ref() else {
                break;
            };
            match narrow_element(batch, self.offset, take) {
                Ok(piece) => pieces.push(piece),
                Err(e) => return Some(Err(e)),
            }
            self.offset += take;
            got += take;
        }
        if got == 0 {
            if self.done {
                return None;
            }
            // want == 0: an empty batch shaped like the input.
            let (batch, _) = self.current.as_ref()?;
            self.position += 1;
            return Some(narrow_element(batch, self.offset, 0));
        }
        self.position += 1;
        Some(concat_pieces(pieces))
    }
}

/// Splits each input batch of `b` rows into `num_replicas` batches of `ceil(b / num_replicas)`
/// rows, the last ones smaller or empty.
struct LegacyRebatchIter {
    input: BoxIter,
    num_replicas: usize,
    pending: VecDeque<Element>,
}

impl Iterator for LegacyRebatchIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending.pop_front() {
            return Some(Ok(e));
        }
        let batch = match self.input.next()? {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        let rows = match batch_rows("rebatch", &batch) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let per_replica = rows.div_ceil(self.num_replicas);
        for k in 0..self.num_replicas {
            let start = (k * per_replica).min(rows);
            let len = per_replica.min(rows - start);
            match narrow_element(&batch, start, len) {
                Ok(piece) => self.pending.push_back(piece),
                Err(e) => return Some(Err(e)),
            }
        }
        self.pending.pop_front().map(Ok)
    }
}

enum Prefetched {
    Item(Result<Element, DataError>),
    End,
    Failed(String),
}

/// Runs `input` on a new thread that stays at most `buffer_size` elements ahead.
fn spawn_prefetch(input: Dataset, buffer_size: usize) -> BoxIter {
    let (tx, rx) = sync_channel::<Prefetched>(buffer_size);
    let producer = move || {
        // A stage's panic is the pipeline's error (a value, even in a crash-only process).
        let outcome = contain_panic(AssertUnwindSafe(|| {
            for item in input.build() {
                if tx.send(Prefetched::Item(item)).is_err() {
                    return; // the consumer is gone
                }
            }
            let _ = tx.send(Prefetched::End);
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a pipeline stage panicked".to_string());
            let _ = tx.send(Prefetched::Failed(message));
        }
    };
    match thread::Builder::new()
        .name("cohort-prefetch".to_string())
        .spawn(producer)
    {
        Ok(_) => Box::new(PrefetchIter {
            rx,
            finished: false,
        }),
        Err(e) => Box::new(std::iter::once(Err(DataError::Producer(format!(
            "cannot start the prefetch thread: {e}"
        ))))),
    }
}

struct PrefetchIter {
    rx: Receiver<Prefetched>,
    finished: bool,
}

impl Iterator for PrefetchIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        match self.rx.recv() {
            Ok(Prefetched::Item(item)) => Some(item),
            Ok(Prefetched::End) => {
                self.finished = true;
                None
            }
            Ok(Prefetched::Failed(message)) => {
                self.finished = true;
                Some(Err(DataError::Producer(message)))
            }
            Err(_) => {
                self.finished = true;
                Some(Err(DataError::Producer(
                    "the producer stopped without finishing".to_string(),
                )))
            }
        }
    }
}

/// Pre-allocation caps, so that a huge batch or buffer size asks memory only as data arrives.
const BATCH_PREALLOC_MAX: usize = 4096;
const SHUFFLE_PREALLOC_MAX: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(ds: &Dataset) -> Vec<Vec<i64>> {
        ds.iter()
            .map(|e| e.unwrap()[0].to_vec1::<i64>().unwrap())
            .collect()
    }

    #[test]
    fn rebatch_takes_rows_across_input_batches() {
        // TF's RebatchDatasetV2 examples.
        let ds = Dataset::range(0, 8, 1)
            .batch(4, false)
            .rebatch(vec![2, 1, 1]);
        assert_eq!(
            rows(&ds),
            vec![vec![0, 1], vec![2], vec![3], vec![4, 5], vec![6], vec![7]]
        );
        let ds = Dataset::range(0, 16, 1).batch(4, false).rebatch(vec![6]);
        assert_eq!(
            rows(&ds),
            vec![
                (0..6).collect(),
                (6..12).collect(),
                (12..16).collect::<Vec<_>>()
            ]
        );
    }

    #[test]
    fn rebatch_size_zero_gives_empty_batches_only_while_data_remains() {
        let ds = Dataset::range(0, 3, 1).batch(1, false).rebatch(vec![1, 0]);
        assert_eq!(rows(&ds), vec![vec![0], vec![], vec![1], vec![], vec![2]]);
    }

    #[test]
    fn legacy_rebatch_splits_by_ceiling() {
        let ds = Dataset::range(0, 5, 1).batch(5, false).legacy_rebatch(4);
        assert_eq!(rows(&ds), vec![vec![0, 1], vec![2, 3], vec![4], vec![]]);
    }

    #[test]
    fn static_batch_size_looks_through_shape_keeping_ops() {
        let ds = Dataset::range(0, 5, 1)
            .batch(4, false)
            .repeat(None)
            .prefetch(2)
            .take(3);
        assert_eq!(ds.static_batch_size(), Some(4));
        assert_eq!(Dataset::range(0, 5, 1).static_batch_size(), None);
    }

    #[test]
    fn rebatching_a_scalar_is_an_error() {
        let ds = Dataset::range(0, 2, 1).rebatch(vec![1]);
        assert!(matches!(
            ds.iter().next(),
            Some(Err(DataError::SpecMismatch { op: "rebatch", .. }))
        ));
    }

    #[test]
    fn slice_batch_fast_path_matches_element_by_element_batching() {
        let table = Tensor::arange(0i64, 7, &candle_core::Device::Cpu).unwrap();
        let slices = Dataset::from_tensor_slices(vec![table]).unwrap();
        for count in [Some(0), Some(1), Some(3), None] {
            for (size, drop) in [(1, false), (3, false), (3, true), (7, false), (10, false)] {
                let fast = slices.clone().repeat(count).batch(size, drop).take(12);
                // A filter that keeps everything takes the general path.
                let slow = slices
                    .clone()
                    .repeat(count)
                    .filter(|_| Ok(true))
                    .batch(size, drop)
                    .take(12);
                assert_eq!(
                    rows(&fast),
                    rows(&slow),
                    "count {count:?} size {size} drop {drop}"
                );
            }
        }
        let empty = Dataset::from_tensor_slices(vec![Tensor::zeros(
            0,
            candle_core::DType::I64,
            &candle_core::Device::Cpu,
        )
        .unwrap()])
        .unwrap();
        assert_eq!(rows(&empty.repeat(None).batch(2, false)).len(), 0);
    }
}
