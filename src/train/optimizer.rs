//! `apply_gradients`: gradients summed across replicas, then one kernel update per variable.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use candle_core::{DType, Device, Tensor};

use super::{LearningRateSchedule, ScheduleError, TrainError};
use crate::optim::{
    NonFinitePolicy, OptimError, Optimizer, OptimizerState, Screen, Slots, UpdateOutcome,
};
use crate::strategy::{get_replica_context, ReduceOp, ReplicaContext};
use crate::variable::{in_place, Variable, VariableId};

/// An optimizer for training loops under a strategy (Keras' optimizer inside a
/// `strategy.scope()`): [`DistributedOptimizer::apply_gradients`] called in a replica context
/// first sums every gradient across the replicas in sync (one all-reduce), then each replica
/// applies the same update to its own copy of each variable, so mirrored variables stay equal.
/// Called in cross-replica context (or with plain variables), it applies the gradients as
/// given.
///
/// The update is [`crate::optim`]'s kernel; the optimizer keeps its slots per variable and per
/// copy (each replica updates its own slots the same way), and counts steps per replica
/// (Keras' `iterations`).
///
/// Gradients are checked before anything changes: the count, each shape against its
/// variable's, each variable's dtype (`f32`). A summed gradient holding NaN or ±Inf skips the
/// whole step on every replica (counted in [`DistributedOptimizer::skipped_steps`]) or fails
/// it, per the optimizer's [`NonFinitePolicy`].
///
/// ```
/// use candle_core::{Device, Tensor};
/// use cohort::optim::Optimizer;
/// use cohort::strategy::{Mirrored, Strategy, StrategyExt};
/// use cohort::train::DistributedOptimizer;
/// use cohort::variable::Variable;
/// use std::sync::Arc;
///
/// let strategy = Mirrored::new(2)?;
/// let w = {
///     let _scope = strategy.scope();
///     Variable::new("w", Tensor::new(&[1f32, 1.], &Device::Cpu)?)?
/// };
/// let opt = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.5)));
/// let (w2, opt2) = (w.clone(), Arc::clone(&opt));
/// // Replica 0's gradient is [1, 0], replica 1's is [0, 1]: each applies their sum [1, 1].
/// strategy
///     .run(
///         move |ctx, ()| {
///             let g = if ctx.replica_id_in_sync_group() == 0 { [1f32, 0.] } else { [0., 1.] };
///             let g = Tensor::new(&g, &Device::Cpu)?;
///             opt2.apply_gradients([(g, w2.clone())])
///         },
///         (),
///     )?
///     .transpose()?;
/// for copy in w.components() {
///     assert_eq!(copy.to_vec1::<f32>()?, [0.5, 0.5]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct DistributedOptimizer {
    optimizer: Optimizer,
    /// Keras' `global_clipnorm`: the summed gradients are scaled down to this global norm.
    global_clipnorm: Option<f32>,
    state: Mutex<State>,
}

/// What one `apply_gradients` call did.
#[derive(Debug, Clone)]
pub struct AppliedGradients {
    /// The gradients applied, in the order given: summed across replicas in a replica
    /// context, as given otherwise.
    pub gradients: Vec<Tensor>,
    /// Whether the update was applied or skipped for non-finite gradients.
    pub outcome: UpdateOutcome,
    /// The values given to [`DistributedOptimizer::apply_gradients_summing`] beside the
    /// gradients, summed across the replicas in sync in the same all-reduce (as given outside
    /// a replica context; empty after [`DistributedOptimizer::apply_gradients`]).
    pub summed: Vec<f32>,
}

impl DistributedOptimizer {
    /// Wraps an optimizer kernel.
    pub fn new(optimizer: Optimizer) -> Self {
        let schedule = LearningRateSchedule::Constant(optimizer.learning_rate());
        Self {
            optimizer,
            global_clipnorm: None,
            state: Mutex::new(State {
                slots: HashMap::new(),
                iterations: HashMap::new(),
                skipped_steps: 0,
                schedule,
            }),
        }
    }

    /// The same optimizer, its learning rate following `schedule` (of the update count)
    /// rather than the kernel's constant. An invalid schedule is refused, naming what is wrong.
    pub fn with_schedule(self, schedule: LearningRateSchedule) -> Result<Self, TrainError> {
        schedule.validate()?;
        self.lock().schedule = schedule;
        Ok(self)
    }

    /// The same optimizer, clipping the gradients (summed across replicas) by their global
    /// norm before each update (Keras' `global_clipnorm`): when the norm over every gradient
    /// of the step exceeds `clipnorm`, all are scaled by `clipnorm / norm`.
    pub fn with_global_clipnorm(mut self, clipnorm: f32) -> Result<Self, TrainError> {
        if !(clipnorm.is_finite() && clipnorm > 0.0) {
            return Err(OptimError::Hyperparameter {
                name: "global_clipnorm".into(),
                value: clipnorm,
                reason: "must be finite and positive".into(),
            }
            .into());
        }
        self.global_clipnorm = Some(clipnorm);
        Ok(self)
    }

    /// The learning rate the next update will use (the schedule at the current step count).
    pub fn learning_rate(&self) -> f32 {
        let state = self.lock();
        let step = state.iterations.get(&0).copied().unwrap_or(0);
        state.schedule.at(step)
    }

    /// Sets a constant learning rate from the next update on, replacing any schedule (what
    /// Keras' `LearningRateScheduler` callback does between epochs). Call it between steps,
    /// on every worker alike.
    pub fn set_learning_rate(&self, learning_rate: f32) -> Result<(), TrainError> {
        let schedule = LearningRateSchedule::Constant(learning_rate);
        schedule.validate()?;
        self.lock().schedule = schedule;
        Ok(())
    }

    /// The learning-rate schedule in force.
    pub fn schedule(&self) -> LearningRateSchedule {
        self.lock().schedule.clone()
    }

    /// The kernel and its hyperparameters.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// Steps applied so far (replica 0's count; every replica counts the same).
    pub fn iterations(&self) -> u64 {
        self.lock().iterations.get(&0).copied().unwrap_or(0)
    }

    /// Steps skipped for non-finite gradients under [`NonFinitePolicy::Skip`].
    pub fn skipped_steps(&self) -> u64 {
        self.lock().skipped_steps
    }

    /// A copy of the slots of `variable`'s copy `component` (replica index for a mirrored
    /// variable, else 0), if the optimizer has updated it.
    pub fn slots(&self, variable: &Variable, component: usize) -> Option<Slots> {
        self.lock().slots.get(&(variable.id(), component)).cloned()
    }

    /// Installs `slots` (e.g. restored from a checkpoint with
    /// [`Slots::restore`]) for `variable`'s copy `component`. Call in cross-replica context,
    /// between steps; for a mirrored variable, install them for every replica's copy.
    pub fn restore_slots(&self, variable: &Variable, component: usize, slots: Slots) {
        self.lock().slots.insert((variable.id(), component), slots);
    }

    /// Sets every replica's step count (e.g. from a checkpoint), so that Adam's bias
    /// correction resumes where it stopped.
    pub fn set_iterations(&self, iterations: u64, num_replicas: usize) {
        let mut state = self.lock();
        for replica in 0..num_replicas.max(1) {
            state.iterations.insert(replica, iterations);
        }
    }

    /// Applies `grads_and_vars` (TensorFlow's `optimizer.apply_gradients(zip(grads, vars))`).
    ///
    /// In a replica context, every replica must call it with the same variables in the same
    /// order (it is a collective).
    pub fn apply_gradients<I>(&self, grads_and_vars: I) -> Result<AppliedGradients, TrainError>
    where
        I: IntoIterator<Item = (Tensor, Variable)>,
    {
        self.apply_gradients_summing(grads_and_vars, &[])
    }

    /// [`DistributedOptimizer::apply_gradients`], summing `also` (say, this replica's share of
    /// the loss) across the replicas in sync in the same all-reduce as the gradients:
    /// [`AppliedGradients::summed`], the same on every replica. One collective a step where a
    /// separate reduction of the loss would be a second, whose wait for the slowest member
    /// costs a step of a small model as much as its compute. `also` takes no part in the
    /// non-finite check or the clipping.
    pub fn apply_gradients_summing<I>(
        &self,
        grads_and_vars: I,
        also: &[f32],
    ) -> Result<AppliedGradients, TrainError>
    where
        I: IntoIterator<Item = (Tensor, Variable)>,
    {
        let pairs: Vec<(Tensor, Variable)> = grads_and_vars.into_iter().collect();
        self.optimizer.validate()?;
        for (grad, var) in &pairs {
            check_pair(grad, var)?;
        }
        let ctx = get_replica_context();
        let syncing = ctx.as_ref().filter(|c| c.num_replicas_in_sync() > 1);
        if let Some(ctx) = syncing {
            if let Some((_, var)) = pairs
                .iter()
                .find(|(_, v)| v.placement().strategy() != Some(ctx.strategy_id()))
            {
                return Err(TrainError::VariableNotSynced {
                    variable: var.name().to_owned(),
                });
            }
        }

        // One fresh, contiguous f32 buffer on the CPU, read where it lies from here on: the
        // gradients' views, the screen, the clipping's norm and the kernels read it, and
        // nothing copies it again.
        let joined = on_cpu(sum_across_replicas(syncing, &pairs, also)?)?;
        let gradients_len = joined.elem_count() - also.len();
        let summed = read(&joined, |e| e[gradients_len..].to_vec())?;
        let replica = ctx.as_ref().map_or(0, ReplicaContext::local_replica_id);

        let non_finite = read(&joined, |e| {
            crate::optim::first_non_finite(&e[..gradients_len]).map(|i| (i, e[i]))
        })?;
        if let Some((index, value)) = non_finite {
            let (variable, local_index) = variable_at(&pairs, index);
            match self.optimizer.non_finite_policy() {
                NonFinitePolicy::Skip => {
                    if replica == 0 {
                        self.lock().skipped_steps += 1;
                    }
                    return Ok(AppliedGradients {
                        gradients: views_like(&joined, &pairs)?,
                        outcome: UpdateOutcome::SkippedNonFinite,
                        summed,
                    });
                }
                NonFinitePolicy::Error => {
                    return Err(OptimError::NonFinite {
                        variable: variable.name().to_owned(),
                        index: local_index,
                        value,
                    }
                    .into())
                }
            }
        }

        let joined = match self.global_clipnorm {
            Some(clipnorm) => clipped(joined, gradients_len, clipnorm)?,
            None => joined,
        };
        let (step, kernel) = {
            let mut state = self.lock();
            let done = state.iterations.get(&replica).copied().unwrap_or(0);
            let kernel = self.optimizer.with_learning_rate(state.schedule.at(done));
            // A rate the kernel refuses fails the step before it counts.
            kernel.validate()?;
            state.iterations.insert(replica, done + 1);
            (done + 1, kernel)
        };
        read(&joined, |flat| {
            let mut offset = 0;
            for (grad, var) in &pairs {
                let len = grad.elem_count();
                let g = &flat[offset..offset + len];
                offset += len;
                self.apply_one(&kernel, ctx.as_ref(), var, g, step)?;
            }
            Ok::<(), TrainError>(())
        })??;
        Ok(AppliedGradients {
            gradients: views_like(&joined, &pairs)?,
            outcome: UpdateOutcome::Applied,
            summed,
        })
    }

    fn apply_one(
        &self,
        kernel: &Optimizer,
        ctx: Option<&ReplicaContext>,
        var: &Variable,
        grad: &[f32],
        step: u64,
    ) -> Result<(), TrainError> {
        let synced = ctx.filter(|c| var.placement().strategy() == Some(c.strategy_id()));
        let refused: RefCell<Option<OptimError>> = RefCell::new(None);
        let result = match synced {
            Some(ctx) => {
                let component = if var.is_mirrored() {
                    ctx.local_replica_id()
                } else {
                    0
                };
                var.update_f32_in_sync(|params| {
                    self.kernel_in_place(kernel, var, component, params, grad, step, &refused)
                })
                .map_err(TrainError::from)
            }
            None => {
                // Cross-replica context (or a plain variable): compute once, assign to every copy.
                let current = var.read_value();
                self.kernel(kernel, var, 0, &current, grad, step, &refused)
                    .map_err(TrainError::from)
                    .and_then(|next| var.assign(&next).map_err(TrainError::from))
            }
        };
        match refused.into_inner() {
            Some(e) => Err(e.into()),
            None => result,
        }
    }

    /// Runs the kernel on `current`, recording a refusal in `refused` (candle's error type
    /// cannot carry it through `update_in_sync`).
    #[allow(clippy::too_many_arguments)]
    fn kernel(
        &self,
        kernel: &Optimizer,
        var: &Variable,
        component: usize,
        current: &Tensor,
        grad: &[f32],
        step: u64,
        refused: &RefCell<Option<OptimError>>,
    ) -> candle_core::Result<Tensor> {
        let mut params = current.flatten_all()?.to_vec1::<f32>()?;
        self.kernel_in_place(kernel, var, component, &mut params, grad, step, refused)?;
        Tensor::from_vec(params, current.shape(), current.device())
    }

    /// Runs the kernel over `params` where they lie, recording a refusal in `refused`. A
    /// refusal comes before the kernel writes anything (its checks come first; the gradients
    /// were screened for non-finite values before), so `params` are whole either way.
    #[allow(clippy::too_many_arguments)]
    fn kernel_in_place(
        &self,
        kernel: &Optimizer,
        var: &Variable,
        component: usize,
        params: &mut [f32],
        grad: &[f32],
        step: u64,
        refused: &RefCell<Option<OptimError>>,
    ) -> candle_core::Result<()> {
        let mut state = self.lock();
        let slots = state
            .slots
            .entry((var.id(), component))
            .or_insert_with(|| self.optimizer.new_slots(var.name(), params.len()));
        if let Err(e) = kernel.apply_dense_with(params, grad, slots, step, Screen::AlreadyDone) {
            let message = e.to_string();
            *refused.borrow_mut() = Some(e);
            return Err(candle_core::Error::Msg(message));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl From<Optimizer> for DistributedOptimizer {
    fn from(optimizer: Optimizer) -> Self {
        Self::new(optimizer)
    }
}

/// What elastic re-forming moves between workers (the slots of every copy, the step count).
impl OptimizerState for DistributedOptimizer {
    fn kernel(&self) -> &Optimizer {
        &self.optimizer
    }

    fn export_slots(&self, variable: &Variable, component: usize) -> Option<Slots> {
        self.slots(variable, component)
    }

    fn import_slots(&self, variable: &Variable, component: usize, slots: Slots) {
        self.restore_slots(variable, component, slots);
    }

    fn steps(&self) -> u64 {
        self.iterations()
    }

    fn set_steps(&self, steps: u64, components: usize) {
        self.set_iterations(steps, components);
    }

    fn learning_rate_schedule(&self) -> Option<LearningRateSchedule> {
        Some(self.schedule())
    }

    fn set_learning_rate_schedule(
        &self,
        schedule: LearningRateSchedule,
    ) -> Result<(), ScheduleError> {
        schedule.validate()?;
        self.lock().schedule = schedule;
        Ok(())
    }
}

#[derive(Debug)]
struct State {
    /// Keyed by variable and copy (replica index for mirrored variables, else 0).
    slots: HashMap<(VariableId, usize), Slots>,
    /// Steps applied, per replica (0 in cross-replica context).
    iterations: HashMap<usize, u64>,
    skipped_steps: u64,
    /// The learning rate of each update, by the replica's step count.
    schedule: LearningRateSchedule,
}

/// `joined` with its first `gradients_len` elements scaled so that their L2 norm is at most
/// `clipnorm` (a copy, only where they must be scaled). The norm is summed in f64 in a fixed
/// order, so every replica scales its identical copy alike.
fn clipped(joined: Tensor, gradients_len: usize, clipnorm: f32) -> Result<Tensor, TrainError> {
    let norm = read(&joined, |e| {
        e[..gradients_len]
            .iter()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum::<f64>()
            .sqrt()
    })?;
    if norm <= f64::from(clipnorm) {
        return Ok(joined);
    }
    let scale = (f64::from(clipnorm) / norm) as f32;
    let mut flat = joined.to_vec1::<f32>()?;
    for g in flat[..gradients_len].iter_mut() {
        *g *= scale;
    }
    let len = flat.len();
    Ok(Tensor::from_vec(flat, len, &Device::Cpu)?)
}

/// `f` of the elements of `joined`, a contiguous f32 CPU tensor ([`on_cpu`]'s), where they lie.
fn read<R>(joined: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R, TrainError> {
    in_place::read_f32(joined, f).ok_or_else(|| {
        TrainError::Tensor(candle_core::Error::Msg(
            "the summed gradients are not a contiguous f32 CPU buffer".into(),
        ))
    })
}

/// `joined` as a contiguous f32 tensor on the CPU: itself where it is one (a CPU
/// all-reduce's result), else a copy (a device's).
fn on_cpu(joined: Tensor) -> Result<Tensor, TrainError> {
    if in_place::read_f32(&joined, |_| ()).is_some() {
        return Ok(joined);
    }
    let flat = joined
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let len = flat.len();
    Ok(Tensor::from_vec(flat, len, &Device::Cpu)?)
}

fn check_pair(grad: &Tensor, var: &Variable) -> Result<(), TrainError> {
    if var.dtype() != DType::F32 {
        return Err(TrainError::VariableDType {
            variable: var.name().to_owned(),
            dtype: var.dtype(),
        });
    }
    if grad.dims() != var.shape() {
        return Err(TrainError::GradientShape {
            variable: var.name().to_owned(),
            expected: var.shape().to_vec(),
            got: grad.dims().to_vec(),
        });
    }
    Ok(())
}

/// Every gradient flattened and concatenated, then `also`, summed across replicas with one
/// all-reduce when `ctx` is given. Gradients on the CPU are gathered into one buffer (one copy
/// each, read where they lie); a device's are concatenated there, for its own all-reduce.
fn sum_across_replicas(
    ctx: Option<&ReplicaContext>,
    pairs: &[(Tensor, Variable)],
    also: &[f32],
) -> Result<Tensor, TrainError> {
    let device = pairs
        .first()
        .map_or(Device::Cpu, |(g, _)| g.device().clone());
    let mut joined = if device.is_cpu() {
        let len = pairs.iter().map(|(g, _)| g.elem_count()).sum::<usize>() + also.len();
        let mut flat = Vec::with_capacity(len);
        for (g, _) in pairs {
            let g = g.to_dtype(DType::F32)?;
            if in_place::read_f32(&g, |e| flat.extend_from_slice(e)).is_none() {
                flat.extend(g.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        flat.extend_from_slice(also);
        Tensor::from_vec(flat, len, &Device::Cpu)?
    } else {
        let mut parts = pairs
            .iter()
            .map(|(g, _)| g.to_dtype(DType::F32)?.flatten_all())
            .collect::<candle_core::Result<Vec<_>>>()?;
        if !also.is_empty() {
            parts.push(Tensor::from_slice(also, also.len(), &device)?);
        }
        Tensor::cat(&parts, 0)?
    };
    if let Some(ctx) = ctx.filter(|_| joined.elem_count() > 0) {
        joined = ctx.all_reduce(ReduceOp::Sum, &joined)?;
    }
    Ok(joined)
}

/// Views of `joined`'s leading elements shaped like each pair's variable, in order (no copy).
fn views_like(joined: &Tensor, pairs: &[(Tensor, Variable)]) -> Result<Vec<Tensor>, TrainError> {
    let mut offset = 0;
    pairs
        .iter()
        .map(|(g, var)| {
            let len = g.elem_count();
            let view = joined.narrow(0, offset, len)?.reshape(var.shape())?;
            offset += len;
            Ok(view)
        })
        .collect()
}

/// The variable whose gradient holds element `index` of the concatenation, and the index
/// within that gradient. `index` is in range of the concatenation.
fn variable_at(pairs: &[(Tensor, Variable)], index: usize) -> (&Variable, usize) {
    let mut start = 0;
    for (g, var) in pairs {
        let end = start + g.elem_count();
        if index < end {
            return (var, index - start);
        }
        start = end;
    }
    unreachable!("index {index} is inside the concatenated gradients")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::LearningRateSchedule;
    use candle_core::Device;

    #[test]
    fn gradients_are_clipped_by_global_norm_and_the_rate_follows_the_schedule() {
        let w = Variable::new("w", Tensor::new(&[0f32, 0.], &Device::Cpu).unwrap()).unwrap();
        let schedule = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![0],
            values: vec![1.0, 0.5],
        };
        let opt = DistributedOptimizer::new(Optimizer::sgd(1.0))
            .with_schedule(schedule)
            .unwrap()
            .with_global_clipnorm(1.0)
            .unwrap();
        // Norm 5, clipped to 1: the update is [0.6, 0.8] at rate 1.
        let g = Tensor::new(&[3f32, 4.], &Device::Cpu).unwrap();
        let applied = opt.apply_gradients([(g.clone(), w.clone())]).unwrap();
        assert_eq!(applied.gradients[0].to_vec1::<f32>().unwrap(), [0.6, 0.8]);
        assert_eq!(w.read_value().to_vec1::<f32>().unwrap(), [-0.6, -0.8]);
        // The second update runs at 0.5.
        assert_eq!(opt.learning_rate(), 0.5);
        opt.apply_gradients([(g, w.clone())]).unwrap();
        let v = w.read_value().to_vec1::<f32>().unwrap();
        assert!(
            (v[0] + 0.9).abs() < 1e-6 && (v[1] + 1.2).abs() < 1e-6,
            "{v:?}"
        );
        // A small gradient is left alone; a constant rate replaces the schedule.
        opt.set_learning_rate(0.25).unwrap();
        assert_eq!(opt.schedule(), LearningRateSchedule::Constant(0.25));
        assert!(opt.set_learning_rate(f32::NAN).is_err());
    }

    /// A live variable is written where it is stored (the tensors handed out see each update),
    /// and an update its kernel refuses (slots of another length) writes nothing.
    #[test]
    fn a_live_variable_is_updated_in_place_and_a_refused_update_writes_nothing() {
        use crate::optim::Slots;
        use crate::strategy::{Mirrored, Strategy, StrategyExt};
        use std::sync::Arc;
        let strategy = Mirrored::new(2).unwrap();
        let w = {
            let _scope = strategy.scope();
            Variable::new("w", Tensor::new(&[1f32, 1.], &Device::Cpu).unwrap()).unwrap()
        };
        let held: Vec<Tensor> = (0..2).map(|c| w.live_component(c).unwrap()).collect();
        let kernel = Optimizer::momentum(0.5, 0.9);
        let opt = Arc::new(DistributedOptimizer::new(kernel));
        let step = || {
            let (w, opt) = (w.clone(), Arc::clone(&opt));
            strategy
                .run(
                    move |_ctx, ()| {
                        let g = Tensor::new(&[1f32, 2.], &Device::Cpu)?;
                        opt.apply_gradients([(g, w.clone())])
                    },
                    (),
                )
                .unwrap()
        };
        // The summed gradient [2, 4]; momentum's first step moves by -0.5 of it.
        assert!(step().values().iter().all(Result::is_ok));
        for copy in &held {
            assert_eq!(copy.to_vec1::<f32>().unwrap(), [0., -1.]);
        }
        let slot = kernel.slot_names()[0];
        for component in 0..2 {
            let wrong = Slots::restore(&kernel, "w", 3, [(slot, vec![0f32; 3])], 0).unwrap();
            opt.restore_slots(&w, component, wrong);
        }
        let refused = step();
        for outcome in refused.values() {
            assert!(
                matches!(
                    outcome,
                    Err(TrainError::Optim(OptimError::ParamsLength { .. }))
                ),
                "{outcome:?}"
            );
        }
        for copy in &held {
            assert_eq!(copy.to_vec1::<f32>().unwrap(), [0., -1.]);
        }
    }

    #[test]
    fn values_beside_the_gradients_are_summed_in_their_all_reduce_and_never_skip_a_step() {
        use crate::strategy::{Mirrored, Strategy, StrategyExt};
        use std::sync::Arc;
        let strategy = Mirrored::new(2).unwrap();
        let w = {
            let _scope = strategy.scope();
            Variable::new("w", Tensor::new(&[1f32, 1.], &Device::Cpu).unwrap()).unwrap()
        };
        let opt = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.5)));
        let (w2, opt2) = (w.clone(), Arc::clone(&opt));
        let applied = strategy
            .run(
                move |ctx, ()| {
                    let replica = ctx.replica_id_in_sync_group() as f32;
                    let g = Tensor::new(&[replica, 1. - replica], &Device::Cpu)?;
                    // A non-finite value beside the gradients is summed, not judged.
                    let also = [replica + 1., 10. * replica, f32::INFINITY];
                    opt2.apply_gradients_summing([(g, w2.clone())], &also)
                },
                (),
            )
            .unwrap()
            .transpose()
            .unwrap();
        for one in applied.values() {
            assert_eq!(one.outcome, UpdateOutcome::Applied);
            assert_eq!(one.summed[..2], [3., 10.]);
            assert!(one.summed[2].is_infinite());
            assert_eq!(one.gradients[0].to_vec1::<f32>().unwrap(), [1., 1.]);
        }
        for copy in w.components() {
            assert_eq!(copy.to_vec1::<f32>().unwrap(), [0.5, 0.5]);
        }
        // Outside a replica context the values come back as given.
        let plain = Variable::new("p", Tensor::new(&[0f32], &Device::Cpu).unwrap()).unwrap();
        let g = Tensor::new(&[1f32], &Device::Cpu).unwrap();
        let alone = opt.apply_gradients_summing([(g, plain)], &[7.]).unwrap();
        assert_eq!(alone.summed, [7.]);
        assert!(opt.apply_gradients([]).unwrap().summed.is_empty());
    }
}
