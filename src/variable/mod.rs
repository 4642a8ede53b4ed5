//! Variables: named, mutable tensors, and where they live.
//!
//! This module owns [`Variable`] (plain, mirrored per replica, or one central host copy), its
//! update semantics in replica and cross-replica context, and the placement seam
//! ([`VariablePlacement`], [`Placement`], [`PlacementScope`]) that strategies plug their
//! policies into. It never runs replicas itself: it reads the calling thread's replica (kept
//! by [`crate::collective`], presented to users as `strategy::get_replica_context`) to decide
//! which copy a read or update touches.
//!
//! Update rules (TensorFlow's, for `MirroredVariable` and central-storage variables):
//! - From cross-replica context (outside `run`), an update applies to every component.
//! - From a replica context of the strategy that owns the variable, an update is first
//!   aggregated across the replicas by the variable's [`VariableAggregation`] (an all-reduce
//!   among the replicas: every replica must make the same update call), then each replica
//!   writes its own component (mirrored) or replica 0 writes the single copy and the others
//!   wait for it (central). With `VariableAggregation::None` and more than one replica this is
//!   an error, as in TensorFlow.
//! - [`Variable::update_in_sync`] is for updates the caller already made identical on every
//!   replica (an optimizer applying all-reduced gradients): no aggregation, each replica writes
//!   its own component.
//! - A plain variable is updated directly from any context.
//!
//! Gradients: a trainable float variable stores its value as a candle variable tensor, so
//! `read_value()` can be differentiated against directly (`loss.backward()?.get(&value)`).
//! Every stored value is detached from the graph that computed it and copied, so an update
//! never keeps an old step's graph alive and a value read earlier is a snapshot.
//!
//! A variable placed on parameter servers ([`Placement::ParameterServer`]) or only declared
//! ([`Placement::Declared`]) has no local copy: [`Variable::try_read_value`] and every update
//! refuse it with [`VariableError::NoLocalCopy`], and its initial value is never drawn. A
//! parameter-server step reads it with `StepContext::pull`.
//!
//! Values are candle tensors on the CPU. Element types are whatever candle holds (f32, f64,
//! i64, i32, ...); TensorFlow's int32 may be given as i64.

pub(crate) mod in_place;
mod partition;
mod placement;
mod rows;

pub use partition::{place_again, PartitionError, Partitioner, PsPlacer, SHARDS_MAX};
pub use placement::{
    current_placement, CentralPlacement, DeclaredPlacement, LocalPlacement, MirroredPlacement,
    ParameterServerPlacement, Placement, PlacementScope, VariablePlacement, VariableRequest,
};
pub(crate) use placement::{replica_placement, with_replica_placement};
pub use rows::{row_id_map, unique_rows, RowIdHasher, RowIdMap};

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use candle_core::{DType, Tensor};

use crate::collective::{current_replica, outside_replica, CollectiveError, CurrentReplica};
use crate::distribute::{DeviceError, DeviceSpec, ReduceOp};
use crate::layout::Layout;

/// How updates made in replica context are combined across replicas
/// (TensorFlow's `tf.VariableAggregation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum VariableAggregation {
    /// No aggregation: updating a synchronized variable from a replica context is an error.
    #[default]
    None,
    /// The replicas' updates are summed.
    Sum,
    /// The replicas' updates are averaged.
    Mean,
    /// Replica 0's update is taken; the others' are ignored.
    OnlyFirstReplica,
}

/// A named, mutable tensor (TensorFlow's `tf.Variable`), cheap to clone: clones share storage.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use cohort::strategy::{Mirrored, Strategy};
/// use cohort::variable::Variable;
///
/// let plain = Variable::new("w", Tensor::new(&[1f32, 2.], &Device::Cpu)?)?;
/// assert_eq!(plain.num_components(), 1);
///
/// let strategy = Mirrored::new(2)?;
/// let mirrored = {
///     let _scope = strategy.scope();
///     Variable::new("m", Tensor::new(&[1f32, 2.], &Device::Cpu)?)?
/// };
/// assert_eq!(mirrored.num_components(), 2);
/// mirrored.assign_add(&Tensor::new(&[1f32, 1.], &Device::Cpu)?)?; // cross-replica: both copies
/// for c in mirrored.components() {
///     assert_eq!(c.to_vec1::<f32>()?, vec![2., 3.]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Variable {
    inner: Arc<Inner>,
}

impl Variable {
    /// Creates a variable placed by the innermost active strategy scope on this thread, or a
    /// plain local variable when there is none. Trainable, with no aggregation.
    pub fn new(name: impl Into<String>, initial_value: Tensor) -> Result<Self, VariableError> {
        VariableBuilder::new(name, initial_value).build()
    }

    /// A builder for a variable with non-default options.
    pub fn builder(name: impl Into<String>, initial_value: Tensor) -> VariableBuilder {
        VariableBuilder::new(name, initial_value)
    }

    /// A process-unique id (keys for optimizer slots and checkpoints' layouts).
    pub fn id(&self) -> VariableId {
        self.inner.id
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its shape; every update keeps it.
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// Its element type; every update keeps it.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// Whether optimizers train it.
    pub fn trainable(&self) -> bool {
        self.inner.trainable
    }

    /// How replica-context updates are aggregated.
    pub fn aggregation(&self) -> VariableAggregation {
        self.inner.aggregation
    }

    /// Where it lives.
    pub fn placement(&self) -> &Placement {
        &self.inner.placement
    }

    /// Whether it has one copy per replica.
    pub fn is_mirrored(&self) -> bool {
        matches!(self.inner.placement, Placement::Mirrored { .. })
    }

    /// Number of stored copies: replicas for a mirrored variable, 0 for one without a local
    /// copy (on parameter servers, or declared only), else 1.
    pub fn num_components(&self) -> usize {
        self.inner.components.len()
    }

    /// Whether this process holds the value (false on parameter servers or declared only).
    pub fn has_local_copy(&self) -> bool {
        !self.inner.components.is_empty()
    }

    /// The layout of a variable on parameter servers.
    pub fn ps_layout(&self) -> Option<&Layout> {
        match &self.inner.placement {
            Placement::ParameterServer { layout } => Some(layout),
            _ => None,
        }
    }

    /// The current value: in a replica context of the owning strategy, this replica's copy;
    /// elsewhere, the primary copy (component 0).
    ///
    /// A variable with no local copy reads as zeros of its shape (a broadcast scalar, no
    /// storage); use [`Variable::try_read_value`] to get an error instead.
    pub fn read_value(&self) -> Tensor {
        if let Some(zeros) = &self.inner.placeholder {
            return zeros.clone();
        }
        let component = match self.synced_ctx() {
            Some(ctx) if self.is_mirrored() => ctx.local_replica(),
            _ => 0,
        };
        self.read_component(component)
    }

    /// The current value (as [`Variable::read_value`]), or [`VariableError::NoLocalCopy`] for
    /// a variable whose value lives elsewhere.
    pub fn try_read_value(&self) -> Result<Tensor, VariableError> {
        self.local()?;
        Ok(self.read_value())
    }

    /// Every stored copy, in component (replica) order.
    pub fn components(&self) -> Vec<Tensor> {
        (0..self.num_components())
            .map(|i| self.read_component(i))
            .collect()
    }

    /// Sets the value (see the module doc for replica-context rules).
    pub fn assign(&self, value: &Tensor) -> Result<(), VariableError> {
        self.update(UpdateKind::Assign, value)
    }

    /// Adds `delta` to the value (see the module doc for replica-context rules).
    pub fn assign_add(&self, delta: &Tensor) -> Result<(), VariableError> {
        self.update(UpdateKind::Add, delta)
    }

    /// Subtracts `delta` from the value (see the module doc for replica-context rules).
    pub fn assign_sub(&self, delta: &Tensor) -> Result<(), VariableError> {
        self.update(UpdateKind::Sub, delta)
    }

    /// Replaces the value with `f(current)`, where the caller guarantees that `f` computes the
    /// same result on every replica (for example from all-reduced gradients).
    ///
    /// In cross-replica context `f` is applied to every component. In a replica context of the
    /// owning strategy each replica applies it to its own component, without aggregation (a
    /// central variable is written once, by replica 0, and every replica waits for that write).
    /// `f`'s result must keep the variable's shape and dtype.
    pub fn update_in_sync(
        &self,
        f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<(), VariableError> {
        self.local()?;
        match self.synced_ctx() {
            None => self.write_all(|current| f(current)),
            Some(ctx) => self.write_own(&ctx, |current| f(current)),
        }
    }

    /// [`Variable::update_in_sync`] for an f32 variable, where `f` writes the new value over
    /// the current one's elements (the same on every replica, as there). A live variable's
    /// copy stored contiguously on the CPU is written where it is stored (what
    /// [`Variable::update_in_sync`] does through a copy and `candle_core::Var::set`); any
    /// other goes through a copy. An `f` that fails leaves a copy it wrote through unchanged,
    /// but not one it wrote in place: it must fail before it writes (the optimizer's kernels
    /// check everything first).
    pub(crate) fn update_f32_in_sync(
        &self,
        f: impl Fn(&mut [f32]) -> candle_core::Result<()>,
    ) -> Result<(), VariableError> {
        self.local()?;
        if self.inner.dtype != DType::F32 {
            return Err(VariableError::DTypeMismatch {
                name: self.inner.name.clone(),
                expected: self.inner.dtype,
                got: DType::F32,
            });
        }
        let through_copy = |current: &Tensor| -> candle_core::Result<Tensor> {
            let mut elements = current.flatten_all()?.to_vec1::<f32>()?;
            f(&mut elements)?;
            Tensor::from_vec(elements, current.shape(), current.device())
        };
        let Some(ctx) = self.synced_ctx() else {
            return self.write_all(through_copy);
        };
        self.write_own_slot(&ctx, |slot| {
            if self.is_live() && slot.is_variable() && in_place::writable_f32(slot) {
                return Ok(in_place::write_f32(slot, &f)?);
            }
            let next = through_copy(slot)?;
            self.check(&next)?;
            self.store(slot, &next)
        })
    }

    fn update(&self, kind: UpdateKind, value: &Tensor) -> Result<(), VariableError> {
        self.local()?;
        self.check(value)?;
        match self.synced_ctx() {
            None => self.write_all(|current| kind.apply(current, value)),
            Some(ctx) => {
                let value = self.aggregate(&ctx, value)?;
                self.write_own(&ctx, |current| kind.apply(current, &value))
            }
        }
    }

    /// The replica context if the calling thread is a replica of the strategy that keeps this
    /// variable in sync.
    fn synced_ctx(&self) -> Option<CurrentReplica> {
        let owner = self.inner.placement.strategy()?;
        current_replica().filter(|ctx| ctx.strategy_id() == owner)
    }

    fn aggregate(&self, ctx: &CurrentReplica, value: &Tensor) -> Result<Tensor, VariableError> {
        let collective = |source: CollectiveError| VariableError::Collective {
            name: self.inner.name.clone(),
            source,
        };
        let reduced = match self.inner.aggregation {
            VariableAggregation::None if ctx.num_replicas_in_sync() == 1 => {
                return Ok(value.clone())
            }
            VariableAggregation::None => {
                return Err(VariableError::AggregationRequired {
                    name: self.inner.name.clone(),
                })
            }
            VariableAggregation::Sum => ctx.member().all_reduce(ReduceOp::Sum, value),
            VariableAggregation::Mean => ctx.member().all_reduce(ReduceOp::Mean, value),
            VariableAggregation::OnlyFirstReplica => {
                let contribution = if ctx.replica_id_in_sync_group() == 0 {
                    value.clone()
                } else {
                    value.zeros_like()?
                };
                ctx.member().all_reduce(ReduceOp::Sum, &contribution)
            }
        }
        .map_err(collective)?;
        // Mean of an integer variable comes back as f64; keep the variable's dtype.
        Ok(reduced.to_dtype(self.inner.dtype)?)
    }

    /// Writes this replica's component (mirrored) or, for a single shared copy, lets replica 0
    /// write while the others wait.
    fn write_own(
        &self,
        ctx: &CurrentReplica,
        f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<(), VariableError> {
        self.write_own_slot(ctx, |slot| {
            let next = f(slot)?;
            self.check(&next)?;
            self.store(slot, &next)
        })
    }

    /// [`Variable::write_own`] with `write` writing the slot itself (checked and stored).
    fn write_own_slot(
        &self,
        ctx: &CurrentReplica,
        write_slot: impl Fn(&mut Tensor) -> Result<(), VariableError>,
    ) -> Result<(), VariableError> {
        let replica = ctx.local_replica();
        if self.is_mirrored() {
            return write_slot(&mut write(&self.inner.components[replica]));
        }
        if self.is_live() {
            // The shared copy is written in place: every replica must be done reading it (its
            // forward pass) before replica 0 writes.
            self.barrier(ctx)?;
        }
        let written = if replica == 0 {
            write_slot(&mut write(&self.inner.components[0]))
        } else {
            Ok(())
        };
        // Every replica waits here even if replica 0 failed, so none is left waiting for it.
        self.barrier(ctx)?;
        written
    }

    /// Waits for every replica of `ctx`'s step, naming this variable if that fails.
    fn barrier(&self, ctx: &CurrentReplica) -> Result<(), VariableError> {
        ctx.member()
            .barrier()
            .map_err(|source| VariableError::Collective {
                name: self.inner.name.clone(),
                source,
            })
    }

    /// Refuses a variable that has no value here.
    fn local(&self) -> Result<(), VariableError> {
        if self.has_local_copy() {
            Ok(())
        } else {
            Err(VariableError::NoLocalCopy {
                name: self.inner.name.clone(),
                placement: format!("{:?}", self.inner.placement),
            })
        }
    }

    fn read_component(&self, i: usize) -> Tensor {
        let stored = self.inner.components[i]
            .read()
            .unwrap_or_else(|p| p.into_inner());
        if self.is_live() {
            // Updates write a live variable's storage in place: hand out a snapshot, itself a
            // candle variable for a trainable one (so that it can be differentiated against,
            // as any read). A copy cannot fail on a stored CPU tensor; if it ever did, the
            // shared value is still the right one to give.
            let detached = stored.detach();
            let snapshot = if self.inner.trainable && stored.is_variable() {
                candle_core::Var::from_tensor(&detached).map(candle_core::Var::into_inner)
            } else {
                detached.copy()
            };
            return snapshot.unwrap_or_else(|_| stored.clone());
        }
        stored.clone()
    }

    /// Copy `component`'s storage as a candle variable tensor that every later update of this
    /// variable writes in place (TensorFlow's variable handle): what a candle-nn layer built
    /// through [`crate::nn::ModelVariables`] holds, so that the layer sees each update without
    /// being rebuilt.
    ///
    /// From the first call on, the variable is *live*: updates copy new values into the
    /// existing storage instead of replacing it, and [`Variable::read_value`] gives a copy, so
    /// that a value read earlier still stays a snapshot.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use cohort::variable::Variable;
    ///
    /// let w = Variable::new("w", Tensor::new(&[1f32, 2.], &Device::Cpu)?)?;
    /// let live = w.live_component(0)?;
    /// let before = w.read_value();
    /// w.assign_add(&Tensor::new(&[1f32, 1.], &Device::Cpu)?)?;
    /// assert_eq!(live.to_vec1::<f32>()?, [2., 3.]); // the held tensor sees the update
    /// assert_eq!(before.to_vec1::<f32>()?, [1., 2.]); // an earlier read stays a snapshot
    /// assert!(w.live_component(1).is_err()); // a plain variable has one copy
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn live_component(&self, component: usize) -> Result<Tensor, VariableError> {
        self.local()?;
        let slot =
            self.inner
                .components
                .get(component)
                .ok_or_else(|| VariableError::NoSuchComponent {
                    name: self.inner.name.clone(),
                    component,
                    components: self.inner.components.len(),
                })?;
        let mut stored = write(slot);
        if !stored.is_variable() {
            // A non-trainable value is stored as a plain tensor; a live one needs storage
            // that can be written in place (copied once, here).
            *stored = candle_core::Var::from_tensor(&stored.detach())?.into_inner();
        }
        self.inner.live.store(true, Ordering::Release);
        Ok(stored.clone())
    }

    /// Whether some copy was handed out by [`Variable::live_component`].
    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::Acquire)
    }

    /// Stores `value` (checked) into `slot`: in place for a live variable, so that the tensors
    /// handed out keep seeing it; as a new stored value otherwise.
    fn store(&self, slot: &mut Tensor, value: &Tensor) -> Result<(), VariableError> {
        if self.is_live() && slot.is_variable() {
            let live = candle_core::Var::from_tensor(slot)?;
            let value = value.detach();
            if live.set(&value).is_err() {
                // `set` refuses a value that shares the live storage (a view of it): copy it.
                live.set(&value.copy()?)?;
            }
            return Ok(());
        }
        *slot = self.to_stored(value)?;
        Ok(())
    }

    /// Applies `f` to every component, all or none: nothing is written unless every new value
    /// was computed and checked.
    fn write_all(
        &self,
        f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<(), VariableError> {
        let mut guards = self.lock_all();
        let mut next = Vec::with_capacity(guards.len());
        for g in guards.iter() {
            let value = f(g)?;
            self.check(&value)?;
            next.push(value);
        }
        for (g, value) in guards.iter_mut().zip(next) {
            self.store(g, &value)?;
        }
        Ok(())
    }

    /// Write guards on every component, taken in component order (the only order anything
    /// takes more than one, so this cannot deadlock).
    fn lock_all(&self) -> Vec<RwLockWriteGuard<'_, Tensor>> {
        self.inner.components.iter().map(write).collect()
    }

    fn to_stored(&self, value: &Tensor) -> Result<Tensor, VariableError> {
        stored_value(value, self.inner.trainable)
    }

    fn check(&self, value: &Tensor) -> Result<(), VariableError> {
        if value.dtype() != self.inner.dtype {
            return Err(VariableError::DTypeMismatch {
                name: self.inner.name.clone(),
                expected: self.inner.dtype,
                got: value.dtype(),
            });
        }
        if value.dims() != self.inner.shape.as_slice() {
            return Err(VariableError::ShapeMismatch {
                name: self.inner.name.clone(),
                expected: self.inner.shape.clone(),
                got: value.dims().to_vec(),
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Variable")
            .field("name", &self.inner.name)
            .field("shape", &self.inner.shape)
            .field("dtype", &self.inner.dtype)
            .field("placement", &self.inner.placement)
            .finish()
    }
}

/// A process-unique variable id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VariableId(pub u64);

/// Options for a new [`Variable`].
#[derive(Debug)]
pub struct VariableBuilder {
    name: String,
    initial: Initial,
    trainable: bool,
    aggregation: VariableAggregation,
    placement: Option<Arc<dyn VariablePlacement>>,
}

impl VariableBuilder {
    /// A trainable variable with no aggregation, placed by the active scope.
    pub fn new(name: impl Into<String>, initial_value: Tensor) -> Self {
        Self {
            name: name.into(),
            initial: Initial::Value(initial_value),
            trainable: true,
            aggregation: VariableAggregation::None,
            placement: None,
        }
    }

    /// A variable of `shape` and `dtype` whose initial value `make(shape)` is drawn only if
    /// the placement keeps a local copy (not on parameter servers, not when only declared).
    pub fn deferred(
        name: impl Into<String>,
        shape: Vec<usize>,
        dtype: DType,
        make: impl FnOnce(&[usize]) -> candle_core::Result<Tensor> + Send + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            initial: Initial::Deferred {
                shape,
                dtype,
                make: Box::new(make),
            },
            trainable: true,
            aggregation: VariableAggregation::None,
            placement: None,
        }
    }

    /// Whether optimizers train it (default true).
    pub fn trainable(mut self, trainable: bool) -> Self {
        self.trainable = trainable;
        self
    }

    /// How replica-context updates are aggregated (default none).
    pub fn aggregation(mut self, aggregation: VariableAggregation) -> Self {
        self.aggregation = aggregation;
        self
    }

    /// Places it by `policy` instead of the active scope's.
    pub fn placement(mut self, policy: Arc<dyn VariablePlacement>) -> Self {
        self.placement = Some(policy);
        self
    }

    /// Creates the variable; every component starts as a copy of the initial value.
    ///
    /// Inside `run` (replica context) the variable follows the policy of the strategy running
    /// the replica, as in TensorFlow: one variable for all of this process's replicas
    /// (mirrored under `Mirrored` and MultiWorkerMirrored, one copy under the default
    /// strategy), every copy starting from the value of the replica that created it (under
    /// MultiWorkerMirrored, the first worker's, after every worker checked it creates the same
    /// variable). Create it once and share it between the replicas (a layer built on its first
    /// call, [`crate::nn::ModelVariables`] by name): each call makes a new variable.
    ///
    /// ```
    /// use std::sync::{Arc, OnceLock};
    /// use candle_core::{Device, Tensor};
    /// use cohort::strategy::{Mirrored, StrategyExt};
    /// use cohort::variable::Variable;
    ///
    /// let strategy = Mirrored::new(2)?;
    /// let lazy: Arc<OnceLock<Variable>> = Arc::new(OnceLock::new());
    /// let layer = Arc::clone(&lazy);
    /// strategy.run(
    ///     move |_ctx, ()| {
    ///         // The first replica to get here creates it, the other takes it.
    ///         let w = layer.get_or_init(|| {
    ///             Variable::new("w", Tensor::new(&[1f32, 2.], &Device::Cpu).unwrap()).unwrap()
    ///         });
    ///         w.read_value().to_vec1::<f32>().unwrap()
    ///     },
    ///     (),
    /// )?;
    /// let w = lazy.get().unwrap();
    /// assert!(w.is_mirrored());
    /// assert_eq!(w.num_components(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<Variable, VariableError> {
        let Some(replica) = current_replica() else {
            let policy = self
                .placement
                .clone()
                .or_else(|| current_placement().map(|(_, p)| p));
            return self.build_placed(policy);
        };
        let policy = match (&self.placement, replica_placement()) {
            (Some(policy), _) => Arc::clone(policy),
            (None, Some((_, policy))) => policy,
            // A replica function run without a strategy's `run` (no policy is known).
            (None, None) => return Err(VariableError::CreatedInReplicaContext { name: self.name }),
        };
        // One replica creates at a time: under a policy spanning processes every worker then
        // checks and broadcasts its new variables in the same order. The creation itself is
        // cross-replica work done once for every replica of this process.
        let _one_at_a_time = replica.member().exclusive();
        outside_replica(|| self.build_placed(Some(policy)))
    }

    fn build_placed(
        self,
        policy: Option<Arc<dyn VariablePlacement>>,
    ) -> Result<Variable, VariableError> {
        let (shape, dtype) = match &self.initial {
            Initial::Value(value) => (value.dims().to_vec(), value.dtype()),
            Initial::Deferred { shape, dtype, .. } => (shape.clone(), *dtype),
        };
        let request = VariableRequest {
            name: &self.name,
            shape: &shape,
            dtype,
        };
        let placement = match &policy {
            Some(policy) => policy.place(&request)?,
            None => Placement::Local {
                device: DeviceSpec::cpu(0),
            },
        };
        let devices = placement.devices();
        let (components, placeholder) = if devices.is_empty() {
            // No local copy: the initial value is never drawn; reads give zeros of the shape
            // from a broadcast scalar, whatever the variable's size.
            let zeros = Tensor::zeros((), dtype, &candle_core::Device::Cpu)?
                .broadcast_as(shape.as_slice())?;
            (Vec::new(), Some(zeros))
        } else {
            let initial_value = match self.initial {
                Initial::Value(value) => value,
                Initial::Deferred { shape, make, .. } => {
                    let value = make(&shape)?;
                    // The drawn value must be what was declared (and placed).
                    if value.dims() != shape.as_slice() {
                        return Err(VariableError::ShapeMismatch {
                            name: self.name,
                            expected: shape,
                            got: value.dims().to_vec(),
                        });
                    }
                    if value.dtype() != dtype {
                        return Err(VariableError::DTypeMismatch {
                            name: self.name,
                            expected: dtype,
                            got: value.dtype(),
                        });
                    }
                    value
                }
            };
            let components = devices
                .iter()
                .map(|d| {
                    let device = d.to_candle()?;
                    let value = initial_value.to_device(&device)?;
                    Ok(RwLock::new(stored_value(&value, self.trainable)?))
                })
                .collect::<Result<Vec<_>, VariableError>>()?;
            (components, None)
        };
        let variable = Variable {
            inner: Arc::new(Inner {
                id: VariableId(NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                name: self.name,
                shape,
                dtype,
                trainable: self.trainable,
                aggregation: self.aggregation,
                placement,
                components,
                live: AtomicBool::new(false),
                placeholder,
            }),
        };
        if let Some(policy) = &policy {
            policy.created(&variable)?;
        }
        Ok(variable)
    }
}

/// A new variable's initial value: given, or drawn when (and only if) it is stored.
enum Initial {
    Value(Tensor),
    Deferred {
        shape: Vec<usize>,
        dtype: DType,
        make: DrawInitial,
    },
}

/// Draws a deferred initial value for a shape.
type DrawInitial = Box<dyn FnOnce(&[usize]) -> candle_core::Result<Tensor> + Send>;

impl fmt::Debug for Initial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Initial::Value(value) => f.debug_tuple("Value").field(value).finish(),
            Initial::Deferred { shape, dtype, .. } => f
                .debug_struct("Deferred")
                .field("shape", shape)
                .field("dtype", dtype)
                .finish_non_exhaustive(),
        }
    }
}

/// Why a variable could not be created or updated.
#[derive(Debug, thiserror::Error)]
pub enum VariableError {
    /// The new value's shape differs from the variable's.
    #[error("variable {name:?} has shape {expected:?}, got a value of shape {got:?}")]
    ShapeMismatch {
        /// The variable.
        name: String,
        /// Its shape.
        expected: Vec<usize>,
        /// The value's shape.
        got: Vec<usize>,
    },
    /// The new value's dtype differs from the variable's.
    #[error("variable {name:?} has dtype {expected:?}, got a value of dtype {got:?}")]
    DTypeMismatch {
        /// The variable.
        name: String,
        /// Its dtype.
        expected: DType,
        /// The value's dtype.
        got: DType,
    },
    /// A synchronized variable with no aggregation was updated from a replica context.
    #[error("variable {name:?} is synchronized across replicas and has no aggregation: updating it inside `run` needs VariableAggregation Sum, Mean or OnlyFirstReplica (or use update_in_sync with an update already identical on every replica)")]
    AggregationRequired {
        /// The variable.
        name: String,
    },
    /// A variable was created inside a replica function that no strategy's `run` started, so
    /// no strategy's placement is known.
    #[error("variable {name:?} was created inside a replica function not started by a strategy's `run` (no placement policy is known): create it inside `run`, or give it a placement, or create it under the strategy's scope outside `run`")]
    CreatedInReplicaContext {
        /// The variable.
        name: String,
    },
    /// A strategy's scope was entered inside another strategy's scope.
    #[error(
        "cannot enter the scope of {entering} inside the scope of {active}: mixing strategies"
    )]
    MixedStrategies {
        /// The strategy whose scope is active.
        active: String,
        /// The strategy whose scope was being entered.
        entering: String,
    },
    /// The placement policy refused the variable.
    #[error("cannot place variable {name:?}: {reason}")]
    Placement {
        /// The variable.
        name: String,
        /// Why.
        reason: String,
    },
    /// The variable's device cannot hold tensors.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The cross-replica aggregation of an update failed.
    #[error("synchronizing an update of variable {name:?} across replicas failed: {source}")]
    Collective {
        /// The variable.
        name: String,
        /// The collective's error.
        source: CollectiveError,
    },
    /// Another worker's model created another variable at this point, or this one with
    /// another shape or type (every worker must build the same model).
    #[error("variable {name:?}: {detail}")]
    DiffersAcrossWorkers {
        /// The variable, as this worker's model creates it.
        name: String,
        /// What differs, and on which worker.
        detail: String,
    },
    /// The variable has no value in this process (it lives on parameter servers, or is only
    /// declared).
    #[error("variable {name:?} has no local copy ({placement}): a parameter-server step pulls it (`StepContext::pull`) and pushes gradients instead of updating it")]
    NoLocalCopy {
        /// The variable.
        name: String,
        /// Where it is, in words.
        placement: String,
    },
    /// A copy that does not exist was asked for.
    #[error("variable {name:?} has {components} copies; there is no copy {component}")]
    NoSuchComponent {
        /// The variable.
        name: String,
        /// The copy asked for.
        component: usize,
        /// How many it has.
        components: usize,
    },
    /// The tensor computation of an update failed.
    #[error("tensor operation on a variable failed: {0}")]
    Tensor(#[from] candle_core::Error),
}

#[derive(Debug)]
struct Inner {
    id: VariableId,
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    trainable: bool,
    aggregation: VariableAggregation,
    placement: Placement,
    components: Vec<RwLock<Tensor>>,
    /// Whether a copy's storage was handed out ([`Variable::live_component`]): updates are
    /// then written in place.
    live: AtomicBool,
    /// Zeros of the shape, for reads of a variable with no local copy.
    placeholder: Option<Tensor>,
}

#[derive(Debug, Clone, Copy)]
enum UpdateKind {
    Assign,
    Add,
    Sub,
}

impl UpdateKind {
    fn apply(self, current: &Tensor, value: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            UpdateKind::Assign => Ok(value.clone()),
            UpdateKind::Add => current.add(value),
            UpdateKind::Sub => current.sub(value),
        }
    }
}

/// The form a value is stored in: detached from its graph and copied; a trainable float value
/// becomes a candle variable so that reads can be differentiated against.
fn stored_value(value: &Tensor, trainable: bool) -> Result<Tensor, VariableError> {
    let detached = value.detach();
    if trainable && detached.dtype().is_float() {
        Ok(candle_core::Var::from_tensor(&detached)?.into_inner())
    } else {
        // A copy, so that the stored value never aliases a tensor the caller still holds.
        Ok(detached.copy()?)
    }
}

fn write(lock: &RwLock<Tensor>) -> RwLockWriteGuard<'_, Tensor> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);
