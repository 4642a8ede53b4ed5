//! Strategies: TensorFlow's `tf.distribute.Strategy` programming model, in one process and
//! across worker processes.
//!
//! This module owns the [`Strategy`] trait (object-safe) and its generic companion
//! [`StrategyExt`] (`run`, `experimental_distribute_values_from_function`,
//! `experimental_local_results`), the four local strategies ([`DefaultStrategy`],
//! [`OneDevice`], [`Mirrored`], [`CentralStorage`]), the strategy across worker processes
//! ([`MultiWorkerMirrored`]), per-replica values ([`PerReplica`]), the
//! replica context seen inside `run` ([`ReplicaContext`]), and cross-replica `reduce`
//! (`Strategy::reduce`). Collectives among replicas live in [`crate::collective`]; variables
//! and their placement in [`crate::variable`]; datasets in [`crate::data`].
//!
//! Calling protocol, as in TensorFlow:
//! 1. Make a strategy; create variables under `let _scope = strategy.scope();`.
//! 2. Distribute input (`experimental_distribute_dataset`) or values
//!    (`experimental_distribute_values_from_function`).
//! 3. `strategy.run(replica_fn, args)` runs `replica_fn` once per replica (on the replica's
//!    thread for `Mirrored`/`CentralStorage`) and gives a [`PerReplica`] of the results; inside,
//!    `ctx.all_reduce(op, &t)` sums or averages across replicas.
//! 4. `strategy.reduce(op, &per_replica, axis)` brings results back to one tensor.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use cohort::strategy::{Mirrored, ReduceOp, Strategy, StrategyExt};
//!
//! let strategy = Mirrored::new(2)?;
//! let doubled = strategy.run(|_ctx, x: f64| x * 2.0, 3.0)?;
//! assert_eq!(strategy.experimental_local_results(&doubled), vec![6.0, 6.0]);
//!
//! let ids = strategy.run(
//!     |ctx, ()| Tensor::new(ctx.replica_id_in_sync_group() as f32, &Device::Cpu),
//!     (),
//! )?;
//! let ids = ids.transpose()?; // PerReplica<Result<T, E>> -> Result<PerReplica<T>, E>
//! let total = strategy.reduce(ReduceOp::Sum, &ids, None)?;
//! assert_eq!(total.to_scalar::<f32>()?, 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod args;
mod central_storage;
mod context;
mod default;
mod mirrored;
mod multi_worker;
mod one_device;
mod reduce;
pub(crate) mod replicas;

pub use crate::distribute::{
    divide_by, DeviceError, DeviceKind, DeviceSpec, PerReplica, ReduceOp, StrategyId,
    UnknownReduceOp,
};
pub use args::{Broadcast, RunArgs};
pub use central_storage::CentralStorage;
pub use context::{get_replica_context, in_cross_replica_context, ReplicaContext, ValueContext};
pub use default::DefaultStrategy;
pub use mirrored::Mirrored;
pub(crate) use multi_worker::metrics_addr_from_env;
pub(crate) use multi_worker::Ballot;
pub use multi_worker::{
    Admission, CastVote, Communication, CommunicationError, CountedVote, Departure, ElasticState,
    EpochProgress, GroupChange, Leave, MultiWorkerConfig, MultiWorkerMirrored, Recovery,
    SaveStateError, DEFAULT_BUCKET_BYTES_MAX, DEFAULT_ENTER_TIMEOUT, DEFAULT_JOIN_TIMEOUT,
    DEFAULT_PROBE_TIMEOUT, DEFAULT_RECOVER_ATTEMPTS,
};
pub use one_device::OneDevice;
pub use reduce::{gather_per_replica, reduce_per_replica};
pub use replicas::{ReplicaFn, DEFAULT_COLLECTIVE_TIMEOUT_MS};

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use candle_core::Tensor;

use crate::collective::CollectiveError;
use crate::data::{DataError, Dataset, DistributeOptions, DistributedDataset, InputContext};
use crate::variable::{with_replica_placement, PlacementScope, VariableError, VariablePlacement};

/// A state and compute distribution policy over replicas (TensorFlow's `tf.distribute.Strategy`).
///
/// Object-safe: `&dyn Strategy` works; the generic methods (`run`, ...) come from
/// [`StrategyExt`], implemented for every strategy including `dyn Strategy`.
///
/// ```
/// use cohort::strategy::{CentralStorage, DefaultStrategy, Mirrored, OneDevice, Strategy, StrategyExt};
///
/// let strategies: Vec<Box<dyn Strategy>> = vec![
///     Box::new(DefaultStrategy::new()),
///     Box::new(OneDevice::new("cpu:0")?),
///     Box::new(Mirrored::new(2)?),
///     Box::new(CentralStorage::new(2)?),
/// ];
/// for s in &strategies {
///     let values = s.experimental_distribute_values_from_function(|ctx| ctx.num_replicas_in_sync);
///     let doubled = s.run(|_ctx, n: usize| n * 2, values)?;
///     let n = s.num_replicas_in_sync();
///     assert_eq!(doubled.values(), vec![2 * n; n].as_slice());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Strategy: Send + Sync + fmt::Debug {
    /// TensorFlow's class name of this strategy (`"MirroredStrategy"`, ...).
    fn name(&self) -> &'static str;

    /// This strategy instance's process-unique id.
    fn id(&self) -> StrategyId;

    /// Number of replicas whose results are aggregated each step (in every process).
    fn num_replicas_in_sync(&self) -> usize;

    /// The replica ids (`replica_id_in_sync_group`) of this process's replicas: every replica
    /// for a single-process strategy, this worker's share for a multi-worker one. Per-replica
    /// values (`run`'s results, a distributed dataset's batches) hold one value for each.
    fn local_replicas(&self) -> std::ops::Range<usize> {
        0..self.num_replicas_in_sync()
    }

    /// The device of each replica, in replica order.
    fn replica_devices(&self) -> Vec<DeviceSpec>;

    /// The policy placing variables created under this strategy's scope.
    fn variable_placement(&self) -> Arc<dyn VariablePlacement>;

    /// Runs `f` once per replica, each with its [`ReplicaContext`], and gives the results in
    /// replica order. The erased form of [`StrategyExt::run`].
    fn run_replicas(&self, f: ReplicaFn) -> Result<Vec<Box<dyn Any + Send>>, StrategyError>;

    /// Enters this strategy's scope on the calling thread: variables created while the guard
    /// lives are placed by [`Strategy::variable_placement`]. Fails when another strategy's
    /// scope is active on this thread.
    fn try_scope(&self) -> Result<StrategyScope, StrategyError> {
        let inner = PlacementScope::enter(self.id(), self.name(), self.variable_placement())?;
        Ok(StrategyScope {
            _inner: inner,
            _not_send: PhantomData,
        })
    }

    /// Like [`Strategy::try_scope`].
    ///
    /// # Panics
    /// When another strategy's scope is active on this thread (a program bug, an error in
    /// TensorFlow too).
    fn scope(&self) -> StrategyScope {
        self.try_scope().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Reduces a per-replica tensor to one tensor; see [`reduce_per_replica`] for `axis`.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use cohort::strategy::{Mirrored, PerReplica, ReduceOp, Strategy};
    ///
    /// let strategy = Mirrored::new(2)?;
    /// let cpu = &Device::Cpu;
    /// let batch = PerReplica::new(vec![
    ///     Tensor::new(&[0f32, 1., 2., 3.], cpu)?,
    ///     Tensor::new(&[4f32, 5., 6., 7.], cpu)?,
    /// ]);
    /// let across = strategy.reduce(ReduceOp::Sum, &batch, None)?;
    /// assert_eq!(across.to_vec1::<f32>()?, vec![4., 6., 8., 10.]);
    /// let all = strategy.reduce(ReduceOp::Sum, &batch, Some(0))?;
    /// assert_eq!(all.to_scalar::<f32>()?, 28.);
    ///
    /// // A partial last batch of 6 split 4/2: MEAN divides by 6, not by 8.
    /// let partial = PerReplica::new(vec![
    ///     Tensor::new(&[0f32, 1., 2., 3.], cpu)?,
    ///     Tensor::new(&[4f32, 5.], cpu)?,
    /// ]);
    /// let mean = strategy.reduce(ReduceOp::Mean, &partial, Some(0))?;
    /// assert_eq!(mean.to_scalar::<f32>()?, 2.5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reduce(
        &self,
        op: ReduceOp,
        value: &PerReplica<Tensor>,
        axis: Option<usize>,
    ) -> Result<Tensor, StrategyError> {
        let expected = self.local_replicas().len();
        if value.num_replicas() != expected {
            return Err(StrategyError::ReplicaCountMismatch {
                expected,
                got: value.num_replicas(),
            });
        }
        reduce_per_replica(op, value, axis)
    }

    /// Reduces a value that is not per-replica, as TensorFlow does for a plain value: `Mean`
    /// gives the value (averaged along `axis` if given); `Sum` gives it (summed along `axis`)
    /// with one replica, and is refused with more, since summing one value "over replicas"
    /// is ambiguous.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use cohort::strategy::{DefaultStrategy, ReduceOp, Strategy};
    ///
    /// let strategy = DefaultStrategy::new();
    /// let one = Tensor::new(1f32, &Device::Cpu)?;
    /// assert_eq!(strategy.reduce_value(ReduceOp::Sum, &one, None)?.to_scalar::<f32>()?, 1.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reduce_value(
        &self,
        op: ReduceOp,
        value: &Tensor,
        axis: Option<usize>,
    ) -> Result<Tensor, StrategyError> {
        let replicas = self.num_replicas_in_sync();
        if op == ReduceOp::Sum && replicas != 1 {
            return Err(StrategyError::NonDistributedSum { replicas });
        }
        reduce_per_replica(op, &PerReplica::new(vec![value.clone()]), axis)
    }

    /// Concatenates the per-replica tensors along `axis` (TensorFlow's `Strategy.gather`):
    /// the other dimensions must agree; `axis` may differ (partial batches).
    fn gather(&self, value: &PerReplica<Tensor>, axis: usize) -> Result<Tensor, StrategyError> {
        let expected = self.local_replicas().len();
        if value.num_replicas() != expected {
            return Err(StrategyError::ReplicaCountMismatch {
                expected,
                got: value.num_replicas(),
            });
        }
        gather_per_replica(value, axis)
    }

    /// Distributes a batched dataset over this strategy's replicas (TensorFlow's
    /// `experimental_distribute_dataset`): each global batch is split into per-replica batches
    /// (remainders and partial batches as TensorFlow splits them; a replica may get an empty
    /// batch) and prefetched. One process is one input pipeline (id 0 of 1).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use cohort::data::{Dataset, DistributeOptions};
    /// use cohort::strategy::{Mirrored, Strategy, StrategyExt};
    ///
    /// let strategy = Mirrored::new(2)?;
    /// let cpu = &Device::Cpu;
    /// let ds = Dataset::from_tensors(vec![Tensor::new(&[1f32], cpu)?, Tensor::new(&[1f32], cpu)?])
    ///     .repeat(Some(4))
    ///     .batch(4, false);
    /// let dist = strategy.experimental_distribute_dataset(ds, DistributeOptions::default())?;
    /// for batch in &dist {
    ///     let out = strategy.run(
    ///         |_ctx, x: Vec<Tensor>| (&x[1] - (&x[0] * 0.3)?)?.to_vec2::<f32>(),
    ///         batch?,
    ///     )?;
    ///     for replica in out.transpose()? {
    ///         assert_eq!(replica.len(), 2);
    ///         assert!(replica.iter().all(|row| (row[0] - 0.7).abs() < 1e-6));
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn experimental_distribute_dataset(
        &self,
        dataset: Dataset,
        options: DistributeOptions,
    ) -> Result<DistributedDataset, StrategyError> {
        Ok(DistributedDataset::from_dataset(
            dataset,
            options,
            self.num_replicas_in_sync(),
            self.input_pipelines(),
            self.input_pipeline_id(),
        )?)
    }

    /// How many input pipelines a distributed dataset has across the job: one per process
    /// (worker) that runs this strategy; 1 for the strategies inside one process.
    fn input_pipelines(&self) -> usize {
        LOCAL_INPUT_PIPELINES
    }

    /// This process's input pipeline, below [`Strategy::input_pipelines`].
    fn input_pipeline_id(&self) -> usize {
        LOCAL_INPUT_PIPELINE_ID
    }

    /// The object-safe form of [`StrategyExt::distribute_datasets_from_function`].
    fn distribute_datasets_from_boxed_function(
        &self,
        dataset_fn: Box<DatasetFn>,
        options: DistributeOptions,
    ) -> Result<DistributedDataset, StrategyError> {
        Ok(DistributedDataset::from_function(
            dataset_fn,
            options,
            self.num_replicas_in_sync(),
            self.input_pipelines(),
            self.input_pipeline_id(),
        )?)
    }
}

/// A dataset function for [`Strategy::distribute_datasets_from_boxed_function`].
pub type DatasetFn = dyn Fn(&InputContext) -> Result<Dataset, DataError> + Send + Sync;

/// The generic half of [`Strategy`], for every strategy (and `dyn Strategy`).
pub trait StrategyExt: Strategy {
    /// Runs `f(ctx, item)` on every replica and gives the results (TensorFlow's
    /// `Strategy.run`). `args` is split by [`RunArgs`]: a [`PerReplica`] (e.g. a batch from a
    /// distributed iterator) gives each replica its own value, plain values go to every
    /// replica.
    ///
    /// `f` runs concurrently on the replicas' threads; inside it, [`ReplicaContext::all_reduce`]
    /// is a rendezvous of all replicas. A panic in `f` is returned as
    /// [`StrategyError::ReplicaPanicked`]. Calling `run` from inside `f` is an error.
    fn run<F, A, R>(&self, f: F, args: A) -> Result<PerReplica<R>, StrategyError>
    where
        A: RunArgs,
        F: Fn(&ReplicaContext, A::Item) -> R + Send + Sync + 'static,
        R: Send + 'static,
    {
        let items = args.split(self.local_replicas().len())?;
        let slots: Arc<Vec<Mutex<Option<A::Item>>>> =
            Arc::new(items.into_iter().map(|i| Mutex::new(Some(i))).collect());
        // A variable created inside `f` follows this strategy's policy (TensorFlow's
        // replica-context creation; see `VariableBuilder::build`).
        let (owner, policy) = (self.id(), self.variable_placement());
        let job: ReplicaFn = Arc::new(move |ctx: &ReplicaContext| {
            let item = slots[ctx.local_replica_id()]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("each replica of a step runs exactly once");
            let out = with_replica_placement(owner, Arc::clone(&policy), || f(ctx, item));
            Box::new(out) as Box<dyn Any + Send>
        });
        let outs = self.run_replicas(job)?;
        Ok(PerReplica::new(
            outs.into_iter()
                .map(|o| {
                    *o.downcast::<R>()
                        .expect("run_replicas returns what the replica function made")
                })
                .collect(),
        ))
    }

    /// Runs a fallible step `f` on every replica (as [`StrategyExt::run`]) and gives its
    /// values, or the error of the first replica whose step failed (the others may fail
    /// after it, in its collectives). A replica's error is an application error of the step:
    /// under a multi-worker strategy it aborts the step on every worker at once
    /// ([`ReplicaContext::abort_step`]), so that the other workers' `run` fails with
    /// [`CollectiveError::Application`] naming this worker and the error's message, while
    /// this worker gets its own error.
    fn try_run<F, A, T, E>(&self, f: F, args: A) -> Result<PerReplica<T>, E>
    where
        A: RunArgs,
        F: Fn(&ReplicaContext, A::Item) -> Result<T, E> + Send + Sync + 'static,
        T: Send + 'static,
        E: fmt::Display + From<StrategyError> + Send + 'static,
    {
        // The replica's own error is kept aside: the strategy's own failure report (the group
        // this worker aborted) must not hide it.
        let failed: Arc<Mutex<Vec<E>>> = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&failed);
        let out = self.run(
            move |ctx, item| match f(ctx, item) {
                Ok(value) => Some(value),
                Err(err) => {
                    ctx.abort_step(&err.to_string());
                    kept.lock().unwrap_or_else(|p| p.into_inner()).push(err);
                    None
                }
            },
            args,
        );
        // A panicking replica is the cause (its peers fail only after it left the step).
        if let Err(panicked @ StrategyError::ReplicaPanicked { .. }) = out {
            return Err(panicked.into());
        }
        // Else the first to fail is the cause, for the same reason.
        let failed = std::mem::take(&mut *failed.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(err) = failed.into_iter().next() {
            return Err(err);
        }
        let values = out?.into_values();
        Ok(PerReplica::new(values.into_iter().flatten().collect()))
    }

    /// One value per replica of this process, made by `f` from each replica's
    /// [`ValueContext`].
    fn experimental_distribute_values_from_function<T, F>(&self, mut f: F) -> PerReplica<T>
    where
        F: FnMut(&ValueContext) -> T,
    {
        let n = self.num_replicas_in_sync();
        PerReplica::new(
            self.local_replicas()
                .map(|replica| {
                    f(&ValueContext {
                        replica_id_in_sync_group: replica,
                        num_replicas_in_sync: n,
                    })
                })
                .collect(),
        )
    }

    /// Calls `dataset_fn` with this process's [`InputContext`] and distributes its dataset
    /// without rebatching or sharding (TensorFlow's `distribute_datasets_from_function`): the
    /// function batches per replica itself (`ctx.get_per_replica_batch_size(global)`), and the
    /// replicas take its elements in turn.
    fn distribute_datasets_from_function<F>(
        &self,
        dataset_fn: F,
        options: DistributeOptions,
    ) -> Result<DistributedDataset, StrategyError>
    where
        F: Fn(&InputContext) -> Result<Dataset, DataError> + Send + Sync + 'static,
    {
        self.distribute_datasets_from_boxed_function(Box::new(dataset_fn), options)
    }

    /// The values held by this process's replicas, in replica order.
    fn experimental_local_results<T: Clone>(&self, value: &PerReplica<T>) -> Vec<T> {
        value.values().to_vec()
    }
}

impl<S: Strategy + ?Sized> StrategyExt for S {}

/// The guard of a strategy's scope; the scope ends when it is dropped. Not `Send`.
#[derive(Debug)]
#[must_use = "the scope ends when this guard is dropped"]
pub struct StrategyScope {
    _inner: PlacementScope,
    _not_send: PhantomData<*const ()>,
}

/// Why a strategy operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// A strategy needs at least one replica, and a value at least one component.
    #[error("a strategy needs at least one replica")]
    NoReplicas,
    /// A per-replica value does not have one component per replica.
    #[error("expected a value for each of {expected} replica(s), got {got}")]
    ReplicaCountMismatch {
        /// Replicas in sync.
        expected: usize,
        /// Components given.
        got: usize,
    },
    /// Per-replica tensors that must agree in shape and dtype do not.
    #[error("replica {replica}'s value is {got}, replica 0's is {expected}")]
    ReplicaValueMismatch {
        /// The replica whose value differs.
        replica: usize,
        /// Replica 0's shape and dtype.
        expected: String,
        /// This replica's.
        got: String,
    },
    /// `reduce` was asked for an axis the values do not have.
    #[error("reduce axis {axis} is out of range for replica {replica}'s value of rank {rank}")]
    AxisOutOfRange {
        /// The axis asked for.
        axis: usize,
        /// The value's rank.
        rank: usize,
        /// The replica.
        replica: usize,
    },
    /// `Sum` of a value that is not per-replica, with more than one replica.
    #[error("a value that is not per-replica cannot be reduced with SUM over {replicas} replicas; pass a PerReplica value or use MEAN")]
    NonDistributedSum {
        /// Replicas in sync.
        replicas: usize,
    },
    /// The replica function panicked.
    #[error("replica {replica} panicked: {message}")]
    ReplicaPanicked {
        /// The replica.
        replica: usize,
        /// The panic message.
        message: String,
    },
    /// A replica's thread is gone and cannot take work.
    #[error("replica {replica}'s thread is gone")]
    ReplicaGone {
        /// The replica.
        replica: usize,
    },
    /// A replica's thread could not be started.
    #[error("cannot start replica {replica}'s thread: {reason}")]
    ReplicaSpawn {
        /// The replica.
        replica: usize,
        /// The operating system's reason.
        reason: String,
    },
    /// `run` was called from inside a replica function.
    #[error("`run` called inside a replica function; nested runs are not supported")]
    NestedRun,
    /// The same device was named for two replicas.
    #[error("device {device} is given for more than one replica")]
    DuplicateDevice {
        /// The device.
        device: String,
    },
    /// A device name is invalid or unsupported.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A collective among replicas failed (timeout, a replica left, mismatched tensors).
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A variable operation failed (for instance entering a second strategy's scope).
    #[error(transparent)]
    Variable(#[from] VariableError),
    /// A tensor computation failed.
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Distributing input failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A multi-worker group could not be re-formed with the survivors (the group broke by an
    /// error re-forming cannot mend, or every bounded attempt failed): `reason` says which.
    #[error("re-forming the workers' group: {reason}")]
    Recovery {
        /// Why, with the last attempt's error.
        reason: String,
    },
    /// No member of a multi-worker group holds the job's training state: every one joined a
    /// live group and was never handed it (the workers that hold it are elsewhere, or gone).
    /// Training on would start the job again from nothing beside them, so the worker exits
    /// instead (its supervisor restarts it, and it enters again as a new process).
    #[error(
        "no member of the workers' group of generation {generation} holds the job's training \
         state (each joined a live group and was never handed it): this worker exits to enter \
         again"
    )]
    NoStateHolder {
        /// The group's generation.
        generation: u64,
    },
    /// A strategy method that cannot be honoured where it was called: `side` is where
    /// (`"coordinator"` or `"worker"`), `reason` says why and what to call instead (e.g. `run`
    /// on the parameter-server coordinator, which runs no replicas).
    #[error("{strategy}::{method} is not available on the {side}: {reason}")]
    NotAvailable {
        /// The strategy's name.
        strategy: &'static str,
        /// The method refused.
        method: &'static str,
        /// Where it was called.
        side: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A call the parameter-server strategy makes on the chief's coordinator failed: the
    /// coordinator's error (`roles::coordinator::CoordinatorError`), kept as the source.
    #[error("the coordinator: {0}")]
    Coordinator(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A multi-worker strategy's configuration is wrong: `key` names what (a cluster entry,
    /// the task, the certificate directory, the replica count).
    #[error("{key}: {detail}")]
    Config {
        /// The configuration key at fault, e.g. `cluster.worker[1]` or `certs_dir`.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
}

/// A single process is one input pipeline.
const LOCAL_INPUT_PIPELINES: usize = 1;
const LOCAL_INPUT_PIPELINE_ID: usize = 0;

/// Parses and checks replica device names: CPU only, no duplicates, at least one.
pub(crate) fn parse_replica_devices<S: AsRef<str>>(
    names: &[S],
) -> Result<Vec<DeviceSpec>, StrategyError> {
    if names.is_empty() {
        return Err(StrategyError::NoReplicas);
    }
    let mut devices: Vec<DeviceSpec> = Vec::with_capacity(names.len());
    for name in names {
        let d: DeviceSpec = name.as_ref().parse()?;
        d.to_candle()?;
        if devices.contains(&d) {
            return Err(StrategyError::DuplicateDevice {
                device: d.to_string(),
            });
        }
        devices.push(d);
    }
    Ok(devices)
}

/// The shared constructor of [`Mirrored`] and [`CentralStorage`]: checks the replica device
/// names, takes a fresh strategy id and starts one replica thread per device with the default
/// collective timeout.
fn threaded_replicas<S: AsRef<str>>(
    names: &[S],
) -> Result<(StrategyId, replicas::Replicas), StrategyError> {
    let devices = parse_replica_devices(names)?;
    let id = StrategyId::next();
    let replicas = replicas::Replicas::threaded(
        devices,
        id,
        std::time::Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS),
    )?;
    Ok((id, replicas))
}
