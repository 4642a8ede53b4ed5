//! `Dataset`: an immutable description of an input pipeline, iterated as many times as wanted.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::files::CsvFormat;
use super::numpy::NdArray;
use super::spec::{check_element, Element, TensorSpec};
use super::DataError;

/// A user function applied to every element by [`Dataset::map`].
pub type MapFn = Arc<dyn Fn(Element) -> Result<Element, DataError> + Send + Sync>;
/// A user predicate applied to every element by [`Dataset::filter`].
pub type FilterFn = Arc<dyn Fn(&Element) -> Result<bool, DataError> + Send + Sync>;

/// A dataset: a source (tensors, a range, files) followed by a chain of transformations,
/// with TensorFlow's `tf.data` semantics.
///
/// A `Dataset` is a description, cheap to clone (`Arc`s inside), `Send + Sync`. Every call to
/// [`Dataset::iter`] builds a fresh iterator from the source, so a dataset can be iterated once
/// per epoch, or by several pipelines on several threads.
///
/// Building never fails for a bad argument (a zero batch size, a shard index out of range):
/// the error is reported by [`Dataset::validate`], by the first item of [`Dataset::iter`], and
/// by the distribution functions. Only [`Dataset::map`] and the constructors that take data
/// return a `Result`.
///
/// Every element is a tuple of tensor components ([`Element`]); its static type is
/// [`Dataset::element_spec`].
///
/// ```
/// use candle_core::{DType, Tensor, Device};
/// use cohort::data::{Dataset, TensorSpec};
///
/// let ds = Dataset::range(0, 10, 1).filter(|e| Ok(e[0].to_scalar::<i64>()? % 2 == 0)).batch(2, false);
/// assert_eq!(ds.element_spec(), &[TensorSpec::new(vec![None], DType::I64)]);
/// let batches: Vec<Vec<i64>> = ds
///     .iter()
///     .map(|e| e.unwrap()[0].to_vec1::<i64>().unwrap())
///     .collect();
/// assert_eq!(batches, vec![vec![0, 2], vec![4, 6], vec![8]]);
///
/// // A tuple dataset: (features, labels), both f32 of shape [1].
/// let one = Tensor::new(&[1f32], &Device::Cpu)?;
/// let ds = Dataset::from_tensors(vec![one.clone(), one]).repeat(Some(4)).batch(4, false);
/// assert_eq!(ds.element_spec()[0], TensorSpec::new(vec![None, Some(1)], DType::F32));
/// assert_eq!(ds.iter().count(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Dataset {
    node: Arc<Node>,
    spec: Arc<[TensorSpec]>,
}

impl Dataset {
    /// A dataset of exactly one element, `components` (TensorFlow's `from_tensors`).
    pub fn from_tensors(components: Element) -> Dataset {
        let spec = components.iter().map(TensorSpec::of).collect();
        Dataset::source(Source::Tensors(components), spec)
    }

    /// A dataset of the slices of `components` along their first dimension (TensorFlow's
    /// `from_tensor_slices`): element `i` is `(c[i] for c in components)`.
    ///
    /// Every component must have rank ≥ 1 and the same first dimension.
    pub fn from_tensor_slices(components: Element) -> Result<Dataset, DataError> {
        let op = "from_tensor_slices";
        if components.is_empty() {
            return Err(DataError::invalid(op, "no components"));
        }
        let mut len = None;
        let mut spec = Vec::with_capacity(components.len());
        for (i, c) in components.iter().enumerate() {
            let Some((&outer, inner)) = c.dims().split_first() else {
                return Err(DataError::invalid(
                    op,
                    format!("component {i} is a scalar; slicing needs rank >= 1"),
                ));
            };
            match len {
                None => len = Some(outer),
                Some(n) if n != outer => {
                    return Err(DataError::invalid(
                        op,
                        format!("component {i} has {outer} rows, component 0 has {n}"),
                    ))
                }
                Some(_) => {}
            }
            spec.push(TensorSpec::new(
                inner.iter().map(|&d| Some(d)).collect(),
                c.dtype(),
            ));
        }
        Ok(Dataset::source(Source::Slices(components), spec))
    }

    /// Scalars `start, start + step, …` below `stop` (above it for a negative step), as `i64`
    /// (TensorFlow's `range`). A zero step is reported when the dataset is validated.
    pub fn range(start: i64, stop: i64, step: i64) -> Dataset {
        Dataset::source(
            Source::Range { start, stop, step },
            vec![TensorSpec::new(vec![], DType::I64)],
        )
    }

    /// The slices of in-memory arrays along their first dimension, like TensorFlow's
    /// `experimental_make_numpy_dataset` (equivalent to `from_tensor_slices` of the arrays).
    pub fn from_numpy(arrays: Vec<NdArray>) -> Result<Dataset, DataError> {
        let tensors = arrays
            .iter()
            .map(NdArray::to_tensor)
            .collect::<Result<Vec<_>, _>>()?;
        Dataset::from_tensor_slices(tensors)
    }

    /// Records read from CSV files, one element per non-blank line, files in the given order
    /// (see [`CsvFormat`]). This dataset is file-backed: FILE auto-sharding splits `files`
    /// among input pipelines.
    pub fn csv_files(files: Vec<PathBuf>, format: CsvFormat) -> Dataset {
        let spec = format.element_spec();
        Dataset::source(Source::Csv { files, format }, spec)
    }

    /// Repeats the dataset `count` times, or forever for `None` (TensorFlow's `repeat`).
    /// Each pass builds a fresh iterator of the input (so a shuffle before it reshuffles).
    /// Repeating forever stops if a pass yields nothing.
    pub fn repeat(self, count: Option<usize>) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(Node::Repeat { input: self, count }, spec)
    }

    /// Stacks `batch_size` consecutive elements into one (TensorFlow's `batch`). The last
    /// batch may be smaller unless `drop_remainder`; hence the outer dimension of the spec is
    /// unknown (`None`) unless `drop_remainder`. Components must be of rank-compatible shapes.
    pub fn batch(self, batch_size: usize, drop_remainder: bool) -> Dataset {
        let outer = drop_remainder.then_some(batch_size);
        let spec: Vec<TensorSpec> = self
            .spec
            .iter()
            .map(|s| {
                let mut shape = Vec::with_capacity(s.shape.len() + 1);
                shape.push(outer);
                shape.extend_from_slice(&s.shape);
                TensorSpec::new(shape, s.dtype)
            })
            .collect();
        Dataset::op(
            Node::Batch {
                input: self,
                batch_size,
                drop_remainder,
            },
            spec,
        )
    }

    /// Shuffles with a buffer of `buffer_size` elements, seeded: the same seed gives the same
    /// order (DATA-1). Each new iterator (each epoch) draws a new, still seed-determined order,
    /// as TensorFlow's `reshuffle_each_iteration=True`.
    ///
    /// ```
    /// use cohort::data::Dataset;
    ///
    /// let order = |ds: &Dataset| -> Vec<i64> {
    ///     ds.iter().map(|e| e.unwrap()[0].to_scalar::<i64>().unwrap()).collect()
    /// };
    /// let a = Dataset::range(0, 20, 1).shuffle(8, 42);
    /// let b = Dataset::range(0, 20, 1).shuffle(8, 42);
    /// assert_eq!(order(&a), order(&b)); // same seed, same order
    /// assert_ne!(order(&a), order(&a)); // a second epoch reshuffles
    /// ```
    pub fn shuffle(self, buffer_size: usize, seed: u64) -> Dataset {
        self.shuffle_with_options(buffer_size, seed, true)
    }

    /// [`Dataset::shuffle`] with TensorFlow's `reshuffle_each_iteration` made explicit: when
    /// false, every iterator yields the same order.
    pub fn shuffle_with_options(
        self,
        buffer_size: usize,
        seed: u64,
        reshuffle_each_iteration: bool,
    ) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(
            Node::Shuffle {
                input: self,
                buffer_size,
                seed,
                reshuffle_each_iteration,
                epochs: Arc::new(AtomicU64::new(0)),
            },
            spec,
        )
    }

    /// Applies `f` to every element (TensorFlow's `map`).
    ///
    /// The output spec is learnt as TensorFlow learns it, by tracing: `f` is called twice on
    /// zero-filled probe elements of the input spec (unknown dimensions set to 1, then 2), and
    /// an output dimension that differs between the two is unknown. An error from `f` on the
    /// probes is returned here; for a function that cannot run on zeros, use
    /// [`Dataset::map_with_spec`].
    pub fn map<F>(self, f: F) -> Result<Dataset, DataError>
    where
        F: Fn(Element) -> Result<Element, DataError> + Send + Sync + 'static,
    {
        let spec = trace_map_spec(&self.spec, &f)?;
        Ok(self.map_with_spec(spec, f))
    }

    /// Applies `f` to every element, with the output spec given rather than traced. Each
    /// output is checked against `spec`; a mismatch is an error for that element.
    pub fn map_with_spec<F>(self, spec: Vec<TensorSpec>, f: F) -> Dataset
    where
        F: Fn(Element) -> Result<Element, DataError> + Send + Sync + 'static,
    {
        Dataset::op(
            Node::Map {
                input: self,
                f: Arc::new(f),
            },
            spec,
        )
    }

    /// Keeps the elements for which `predicate` is true (TensorFlow's `filter`).
    pub fn filter<F>(self, predicate: F) -> Dataset
    where
        F: Fn(&Element) -> Result<bool, DataError> + Send + Sync + 'static,
    {
        let spec = self.spec.clone();
        Dataset::op(
            Node::Filter {
                input: self,
                f: Arc::new(predicate),
            },
            spec,
        )
    }

    /// At most the first `count` elements (TensorFlow's `take`).
    pub fn take(self, count: usize) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(Node::Take { input: self, count }, spec)
    }

    /// All but the first `count` elements (TensorFlow's `skip`).
    pub fn skip(self, count: usize) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(Node::Skip { input: self, count }, spec)
    }

    /// Every `num_shards`-th element starting at `index` (TensorFlow's `shard`); `index` must
    /// be below `num_shards`.
    pub fn shard(self, num_shards: usize, index: usize) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(
            Node::Shard {
                input: self,
                num_shards,
                index,
            },
            spec,
        )
    }

    /// Produces elements on a background thread, up to `buffer_size` ahead of the consumer
    /// (TensorFlow's `prefetch`). Errors travel through the buffer in order. The thread stops
    /// when the data ends or the iterator is dropped. `buffer_size` is at most
    /// [`PREFETCH_BUFFER_MAX`] (the buffer is allocated up front).
    pub fn prefetch(self, buffer_size: usize) -> Dataset {
        let spec = self.spec.clone();
        Dataset::op(
            Node::Prefetch {
                input: self,
                buffer_size,
            },
            spec,
        )
    }

    /// The static type of every element: one [`TensorSpec`] per component.
    pub fn element_spec(&self) -> &[TensorSpec] {
        &self.spec
    }

    /// Whether the source reads files (so FILE auto-sharding applies).
    pub fn is_file_backed(&self) -> bool {
        self.files().is_some()
    }

    /// Checks every argument of the pipeline (batch sizes, shard indices, buffer sizes, file
    /// formats) without producing data.
    pub fn validate(&self) -> Result<(), DataError> {
        self.node.validate()
    }

    fn source(source: Source, spec: Vec<TensorSpec>) -> Dataset {
        Dataset {
            node: Arc::new(Node::Source(source)),
            spec: spec.into(),
        }
    }

    fn op(node: Node, spec: impl Into<Arc<[TensorSpec]>>) -> Dataset {
        Dataset {
            node: Arc::new(node),
            spec: spec.into(),
        }
    }

    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    /// The files of a file-backed source, if the source is one.
    pub(crate) fn files(&self) -> Option<&[PathBuf]> {
        let mut node = &*self.node;
        loop {
            match node {
                Node::Source(Source::Csv { files, .. }) => return Some(files),
                Node::Source(_) => return None,
                other => node = &*other.input()?.node,
            }
        }
    }

    /// A copy with new state where a copy needs it: shuffle epoch counters start again, and
    /// the source's file list is replaced when `files` is given (FILE auto-sharding). A
    /// pipeline built from a copy behaves as the dataset would in a fresh process (DATA-1).
    pub(crate) fn fresh_copy(&self, files: Option<&[PathBuf]>) -> Dataset {
        let node = match (&*self.node, files) {
            (Node::Source(Source::Csv { format, .. }), Some(files)) => Node::Source(Source::Csv {
                files: files.to_vec(),
                format: format.clone(),
            }),
            (Node::Source(s), _) => Node::Source(s.clone()),
            (
                Node::Shuffle {
                    input,
                    buffer_size,
                    seed,
                    reshuffle_each_iteration,
                    ..
                },
                _,
            ) => Node::Shuffle {
                input: input.fresh_copy(files),
                buffer_size: *buffer_size,
                seed: *seed,
                reshuffle_each_iteration: *reshuffle_each_iteration,
                epochs: Arc::new(AtomicU64::new(0)),
            },
            (other, _) => other.with_input(other.input().map(|i| i.fresh_copy(files))),
        };
        Dataset::op(node, self.spec.clone())
    }

    /// Makes every shuffle stage of this pipeline draw the order of pass `epoch` for the next
    /// iterator built (a fresh pipeline draws pass 0, then 1, ...): resuming a run at a pass
    /// gives that pass's order again (DATA-1).
    pub(crate) fn set_epoch(&self, epoch: u64) {
        let mut stage = Some(self);
        while let Some(dataset) = stage {
            if let Node::Shuffle { epochs, .. } = &*dataset.node {
                epochs.store(epoch, Ordering::Relaxed);
            }
            stage = dataset.node.input();
        }
    }

    /// The static batch size of the outermost `batch`, looking through the operations that
    /// keep the batch dimension; `None` when it cannot be known (TF's `compute_batch_size`).
    pub(crate) fn static_batch_size(&self) -> Option<usize> {
        let mut node = &*self.node;
        loop {
            match node {
                Node::Batch { batch_size, .. } => return Some(*batch_size),
                Node::Repeat { input, .. }
                | Node::Shuffle { input, .. }
                | Node::Map { input, .. }
                | Node::Filter { input, .. }
                | Node::Take { input, .. }
                | Node::Skip { input, .. }
                | Node::Shard { input, .. }
                | Node::Prefetch { input, .. } => node = &*input.node,
                Node::Source(_) | Node::Rebatch { .. } | Node::LegacyRebatch { .. } => return None,
            }
        }
    }

    /// Splits each batch into batches of the given sizes in turn (TF's `RebatchDatasetV2`).
    ///
    /// The pieces' batch dimension is static where it can be known: the input's is, and every
    /// size is the same (a global batch that splits evenly, with `drop_remainder`), as in
    /// TensorFlow.
    pub(crate) fn rebatch(self, batch_sizes: Vec<usize>) -> Dataset {
        let even = batch_sizes
            .first()
            .filter(|first| batch_sizes.iter().all(|s| s == *first))
            .copied();
        let spec = split_outer(&self.spec, |outer| {
            even.filter(|piece| batch_sizes.len() * piece == outer)
        });
        Dataset::op(
            Node::Rebatch {
                input: self,
                batch_sizes,
            },
            spec,
        )
    }

    /// Splits each batch of `b` into `num_replicas` pieces of `ceil(b / num_replicas)`, the
    /// last ones smaller or empty (TF's legacy `RebatchDataset`).
    ///
    /// Static pieces where the input's batch is static and divides evenly.
    pub(crate) fn legacy_rebatch(self, num_replicas: usize) -> Dataset {
        let spec = split_outer(&self.spec, |outer| {
            (num_replicas > 0 && outer % num_replicas == 0).then(|| outer / num_replicas)
        });
        Dataset::op(
            Node::LegacyRebatch {
                input: self,
                num_replicas,
            },
            spec,
        )
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("pipeline", &self.node.describe())
            .field("element_spec", &self.spec)
            .finish()
    }
}

/// Where the elements come from.
#[derive(Clone)]
pub(crate) enum Source {
    Tensors(Element),
    Slices(Element),
    Range {
        start: i64,
        stop: i64,
        step: i64,
    },
    Csv {
        files: Vec<PathBuf>,
        format: CsvFormat,
    },
}

/// One stage of a pipeline; every stage but a source has exactly one input.
pub(crate) enum Node {
    Source(Source),
    Repeat {
        input: Dataset,
        count: Option<usize>,
    },
    Batch {
        input: Dataset,
        batch_size: usize,
        drop_remainder: bool,
    },
    Shuffle {
        input: Dataset,
        buffer_size: usize,
        seed: u64,
        reshuffle_each_iteration: bool,
        /// Iterators built so far: the epoch number that picks each iterator's order.
        epochs: Arc<AtomicU64>,
    },
    Map {
        input: Dataset,
        f: MapFn,
    },
    Filter {
        input: Dataset,
        f: FilterFn,
    },
    Take {
        input: Dataset,
        count: usize,
    },
    Skip {
        input: Dataset,
        count: usize,
    },
    Shard {
        input: Dataset,
        num_shards: usize,
        index: usize,
    },
    Prefetch {
        input: Dataset,
        buffer_size: usize,
    },
    Rebatch {
        input: Dataset,
        batch_sizes: Vec<usize>,
    },
    LegacyRebatch {
        input: Dataset,
        num_replicas: usize,
    },
}

impl Node {
    pub(crate) fn input(&self) -> Option<&Dataset> {
        match self {
            Node::Source(_) => None,
            Node::Repeat { input, .. }
            | Node::Batch { input, .. }
            | Node::Shuffle { input, .. }
            | Node::Map { input, .. }
            | Node::Filter { input, .. }
            | Node::Take { input, .. }
            | Node::Skip { input, .. }
            | Node::Shard { input, .. }
            | Node::Prefetch { input, .. }
            | Node::Rebatch { input, .. }
            | Node::LegacyRebatch { input, .. } => Some(input),
        }
    }

    /// The same stage over another input (`new_input` is `Some` exactly when `self` has one).
    fn with_input(&self, new_input: Option<Dataset>) -> Node {
        let Some(input) = new_input else {
            return match self {
                Node::Source(s) => Node::Source(s.clone()),
                _ => unreachable!("every non-source stage has an input"),
            };
        };
        match self {
            Node::Source(s) => Node::Source(s.clone()),
            Node::Repeat { count, .. } => Node::Repeat {
                input,
                count: *count,
            },
            Node::Batch {
                batch_size,
                drop_remainder,
                ..
            } => Node::Batch {
                input,
                batch_size: *batch_size,
                drop_remainder: *drop_remainder,
            },
            Node::Shuffle {
                buffer_size,
                seed,
                reshuffle_each_iteration,
                epochs,
                ..
            } => Node::Shuffle {
                input,
                buffer_size: *buffer_size,
                seed: *seed,
                reshuffle_each_iteration: *reshuffle_each_iteration,
                epochs: epochs.clone(),
            },
            Node::Map { f, .. } => Node::Map {
                input,
                f: f.clone(),
            },
            Node::Filter { f, .. } => Node::Filter {
                input,
                f: f.clone(),
            },
            Node::Take { count, .. } => Node::Take {
                input,
                count: *count,
            },
            Node::Skip { count, .. } => Node::Skip {
                input,
                count: *count,
            },
            Node::Shard {
                num_shards, index, ..
            } => Node::Shard {
                input,
                num_shards: *num_shards,
                index: *index,
            },
            Node::Prefetch { buffer_size, .. } => Node::Prefetch {
                input,
                buffer_size: *buffer_size,
            },
            Node::Rebatch { batch_sizes, .. } => Node::Rebatch {
                input,
                batch_sizes: batch_sizes.clone(),
            },
            Node::LegacyRebatch { num_replicas, .. } => Node::LegacyRebatch {
                input,
                num_replicas: *num_replicas,
            },
        }
    }

    fn validate(&self) -> Result<(), DataError> {
        match self {
            Node::Source(Source::Range { step: 0, .. }) => {
                return Err(DataError::invalid("range", "step must not be zero"))
            }
            Node::Source(Source::Csv { format, .. }) => format.validate()?,
            Node::Source(_) => {}
            Node::Batch { batch_size: 0, .. } => {
                return Err(DataError::invalid("batch", "batch_size must be at least 1"))
            }
            Node::Shuffle { buffer_size: 0, .. } => {
                return Err(DataError::invalid(
                    "shuffle",
                    "buffer_size must be at least 1",
                ))
            }
            Node::Shard {
                num_shards, index, ..
            } => {
                if *num_shards == 0 {
                    return Err(DataError::invalid("shard", "num_shards must be at least 1"));
                }
                if index >= num_shards {
                    return Err(DataError::invalid(
                        "shard",
                        format!("index {index} is not below num_shards {num_shards}"),
                    ));
                }
            }
            Node::Prefetch { buffer_size, .. }
                if *buffer_size == 0 || *buffer_size > PREFETCH_BUFFER_MAX =>
            {
                return Err(DataError::invalid(
                    "prefetch",
                    format!("buffer_size {buffer_size} is not in 1..={PREFETCH_BUFFER_MAX}"),
                ))
            }
            Node::Rebatch { batch_sizes, .. } if batch_sizes.iter().all(|&b| b == 0) => {
                return Err(DataError::invalid(
                    "rebatch",
                    "batch_sizes must hold at least one nonzero size",
                ))
            }
            Node::LegacyRebatch {
                num_replicas: 0, ..
            } => {
                return Err(DataError::invalid(
                    "rebatch",
                    "num_replicas must be at least 1",
                ))
            }
            _ => {}
        }
        match self.input() {
            Some(input) => input.validate(),
            None => Ok(()),
        }
    }

    fn describe(&self) -> String {
        let this = match self {
            Node::Source(Source::Tensors(_)) => "from_tensors".to_string(),
            Node::Source(Source::Slices(_)) => "from_tensor_slices".to_string(),
            Node::Source(Source::Range { start, stop, step }) => {
                format!("range({start}, {stop}, {step})")
            }
            Node::Source(Source::Csv { files, .. }) => format!("csv_files({} files)", files.len()),
            Node::Repeat { count, .. } => format!("repeat({count:?})"),
            Node::Batch {
                batch_size,
                drop_remainder,
                ..
            } => format!("batch({batch_size}, {drop_remainder})"),
            Node::Shuffle {
                buffer_size, seed, ..
            } => format!("shuffle({buffer_size}, seed={seed})"),
            Node::Map { .. } => "map".to_string(),
            Node::Filter { .. } => "filter".to_string(),
            Node::Take { count, .. } => format!("take({count})"),
            Node::Skip { count, .. } => format!("skip({count})"),
            Node::Shard {
                num_shards, index, ..
            } => format!("shard({num_shards}, {index})"),
            Node::Prefetch { buffer_size, .. } => format!("prefetch({buffer_size})"),
            Node::Rebatch { batch_sizes, .. } => format!("rebatch({batch_sizes:?})"),
            Node::LegacyRebatch { num_replicas, .. } => {
                format!("legacy_rebatch({num_replicas})")
            }
        };
        match self.input() {
            Some(input) => format!("{}.{this}", input.node.describe()),
            None => this,
        }
    }
}

/// Learns `f`'s output spec from two zero-filled probes (see [`Dataset::map`]).
fn trace_map_spec(
    input: &[TensorSpec],
    f: &dyn Fn(Element) -> Result<Element, DataError>,
) -> Result<Vec<TensorSpec>, DataError> {
    let probe = |unknown: usize| -> Result<Element, DataError> {
        let element = input
            .iter()
            .map(|s| {
                let dims: Vec<usize> = s.shape.iter().map(|d| d.unwrap_or(unknown)).collect();
                Tensor::zeros(dims, s.dtype, &Device::Cpu)
            })
            .collect::<Result<Vec<_>, _>>()?;
        f(element)
    };
    let first = probe(1)?;
    let second = probe(2)?;
    let op = "map";
    if first.len() != second.len() {
        return Err(DataError::SpecMismatch {
            op,
            reason: "the number of output components depends on the input's unknown dimensions"
                .to_string(),
        });
    }
    first
        .iter()
        .zip(&second)
        .enumerate()
        .map(|(i, (a, b))| {
            if a.dtype() != b.dtype() || a.rank() != b.rank() {
                return Err(DataError::SpecMismatch {
                    op,
                    reason: format!(
                        "the dtype or rank of output component {i} depends on the input's unknown \
                         dimensions; use map_with_spec"
                    ),
                });
            }
            let shape = a
                .dims()
                .iter()
                .zip(b.dims())
                .map(|(x, y)| (x == y).then_some(*x))
                .collect();
            Ok(TensorSpec::new(shape, a.dtype()))
        })
        .collect()
}

/// `spec` with each component's batch dimension split: `piece(outer)` where the input's is
/// static and gives a static piece, unknown otherwise.
fn split_outer(spec: &[TensorSpec], piece: impl Fn(usize) -> Option<usize>) -> Vec<TensorSpec> {
    spec.iter()
        .map(|s| {
            let outer = s.shape.first().copied().flatten().and_then(&piece);
            s.with_outer_dim(outer).unwrap_or_else(|| s.clone())
        })
        .collect()
}

/// Checks a `map` output against the declared spec.
pub(crate) fn check_map_output(
    spec: &[TensorSpec],
    element: Element,
) -> Result<Element, DataError> {
    check_element("map", spec, &element)?;
    Ok(element)
}

/// Next epoch number of a shuffle stage.
pub(crate) fn next_epoch(epochs: &AtomicU64) -> u64 {
    epochs.fetch_add(1, Ordering::Relaxed)
}

/// The largest `prefetch` buffer, in elements.
pub const PREFETCH_BUFFER_MAX: usize = 1 << 16;
