//! A candle-nn model under a strategy: one copy per local replica over one set of variables,
//! and the synchronous training step of TensorFlow's custom-training-loop guide.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use super::{compute_average_loss, AppliedGradients, DistributedOptimizer, TrainError};
use crate::nn::{with_step_randomness, ModelVariables, NnError, StepRandomness};
use crate::strategy::{ReduceOp, ReplicaContext, Strategy, StrategyId};
use crate::variable::Variable;

/// A model written for candle-nn (built from a `VarBuilder`), distributed by a strategy: its
/// variables are the strategy's (mirrored under `Mirrored` and `MultiWorkerMirrored`, plain
/// under the default strategy), and it is built once per local replica so that each replica's
/// layers hold that replica's copies (TensorFlow's `with strategy.scope(): model = ...`).
///
/// Calling protocol:
/// 1. [`ReplicatedModel::build`] in cross-replica context, with the function that builds the
///    model from a `VarBuilder` (any candle-nn constructors: `linear`, `conv2d`, `embedding`,
///    `layer_norm`, `batch_norm`, `lstm`, ...). Every replica's build must ask for the same
///    variables; a replica that asks for another shape or a new name is refused, naming it.
/// 2. Inside `strategy.run`, [`ReplicatedModel::train_step`] runs the replica's forward pass
///    under its step randomness, scales the loss by the global batch, all-reduces the gradients
///    and applies them on every replica ([`DistributedOptimizer`]), then averages the
///    statistics (batch normalization's running mean and variance) across the replicas, as
///    TensorFlow aggregates them (`MEAN`).
/// 3. [`ReplicatedModel::replica`] gives the replica's copy for evaluation and prediction;
///    [`ReplicatedModel::primary`] gives copy 0 in cross-replica context.
///
/// ```
/// use std::sync::Arc;
/// use cohort::candle::{Device, Module, Tensor};
/// use cohort::candle_nn;
/// use cohort::optim::Optimizer;
/// use cohort::strategy::{Mirrored, ReduceOp, Strategy, StrategyExt};
/// use cohort::train::{DistributedOptimizer, ReplicatedModel, StepSpec};
///
/// let strategy = Mirrored::new(2)?;
/// let model = Arc::new(ReplicatedModel::build(&strategy, 1, |vb| candle_nn::linear(2, 1, vb.pp("out")))?);
/// let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.1)));
/// let x = Tensor::new(&[[1f32, 0.], [0., 1.]], &Device::Cpu)?;
/// let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
/// let losses = strategy.run(
///     move |ctx, x: Tensor| {
///         m.train_step(ctx, &o, StepSpec::new(0), |layer| layer.forward(&x)?.sqr()?.flatten_all())
///     },
///     x,
/// )?.transpose()?;
/// let mean_loss = strategy.reduce(ReduceOp::Sum, &losses.map(|s| s.loss.clone()), None)?;
/// // The same global loss came with the gradients' all-reduce, with no collective of its own.
/// let global = losses.values()[0].global_loss();
/// assert!((global - mean_loss.to_scalar::<f32>()?).abs() < 1e-6);
/// // Both replicas' copies took the same update.
/// let weight = model.variables().get("out.weight").unwrap();
/// let copies = weight.components();
/// assert_eq!(copies[0].to_vec2::<f32>()?, copies[1].to_vec2::<f32>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ReplicatedModel<M> {
    /// The strategy it was built for: only its replicas run it.
    strategy: StrategyId,
    strategy_name: &'static str,
    variables: ModelVariables,
    replicas: Vec<M>,
    /// The variables as of the last time the set grew: a model built lazily (layers that
    /// create their variables on their first call) adds them inside its first step.
    lists: RwLock<Arc<VariableLists>>,
    /// Whether variables without a gradient were reported (once per model).
    warned_no_gradient: AtomicBool,
}

/// A model's variables split into what is trained and what is a statistic, with each local
/// replica's live tensors of them.
#[derive(Debug)]
struct VariableLists {
    /// How many variables the set had when these were taken.
    taken_of: usize,
    trainable: Vec<Variable>,
    /// Per replica, the live tensor of each trainable variable (the order of `trainable`):
    /// what its gradients are keyed by.
    trainable_live: Vec<Vec<Tensor>>,
    statistics: Vec<Variable>,
    /// Per replica, the live tensor of each statistic.
    statistics_live: Vec<Vec<Tensor>>,
}

impl VariableLists {
    fn take(
        variables: &ModelVariables,
        local: usize,
        strategy_name: &str,
    ) -> Result<Self, TrainError> {
        let all = variables.variables();
        let (trainable, statistics): (Vec<Variable>, Vec<Variable>) =
            all.iter().cloned().partition(Variable::trainable);
        if local > 1 {
            if let Some(shared) = statistics.iter().find(|v| !v.is_mirrored()) {
                // Each replica's layer would update one shared copy in its forward pass,
                // concurrently with the others.
                return Err(NnError::Config {
                    layer: shared.name().to_owned(),
                    reason: format!(
                        "{strategy_name} keeps one copy of this statistic for its {local} replicas, which batch normalization cannot update from each replica: use Mirrored or MultiWorkerMirrored"
                    ),
                }
                .into());
            }
        }
        Ok(Self {
            taken_of: all.len(),
            trainable_live: live_tensors(&trainable, local)?,
            statistics_live: live_tensors(&statistics, local)?,
            trainable,
            statistics,
        })
    }
}

/// What one replica's [`ReplicatedModel::train_step`] needs besides the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSpec {
    /// The global step (the seed of this step's dropout masks, with the model's seed).
    pub step: u64,
    /// The number of examples in the global batch; `None` for `replicas × local batch` (give
    /// it for a short last batch so that the gradient is that of the true mean).
    pub global_batch_size: Option<usize>,
}

impl StepSpec {
    /// Step `step` of full batches.
    pub fn new(step: u64) -> Self {
        Self {
            step,
            global_batch_size: None,
        }
    }

    /// The same, for a global batch of `size` examples.
    pub fn global_batch_size(mut self, size: usize) -> Self {
        self.global_batch_size = Some(size);
        self
    }
}

/// What one replica's training step gave.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// This replica's loss, scaled by the global batch: the replicas' losses sum to the global
    /// batch's mean loss (`strategy.reduce(ReduceOp::Sum, ...)`).
    pub loss: Tensor,
    /// The update (applied, or skipped for non-finite gradients). Its
    /// [`AppliedGradients::summed`] holds the global loss first, then what the closure of
    /// [`ReplicatedModel::train_step_summing`] gave ([`StepOutput::global_loss`],
    /// [`StepOutput::sums`]).
    pub applied: AppliedGradients,
}

impl StepOutput {
    /// The global batch's mean loss: every replica's `loss` summed across every replica in
    /// sync, in the gradients' all-reduce (the same bits on every replica, with no collective
    /// of its own). Training loops read it instead of reducing `loss`.
    pub fn global_loss(&self) -> f32 {
        self.applied.summed.first().copied().unwrap_or(f32::NAN)
    }

    /// What the closure of [`ReplicatedModel::train_step_summing`] gave beside the loss,
    /// summed across every replica in sync in the same all-reduce (empty after
    /// [`ReplicatedModel::train_step`]).
    pub fn sums(&self) -> &[f32] {
        self.applied.summed.get(1..).unwrap_or_default()
    }
}

impl<M: Send + Sync> ReplicatedModel<M> {
    /// Builds the model once per local replica of `strategy` over one set of variables, its
    /// initial values drawn from `seed` (the same on every worker and run).
    pub fn build<F>(strategy: &dyn Strategy, seed: u64, build: F) -> Result<Self, TrainError>
    where
        F: Fn(VarBuilder<'static>) -> candle_core::Result<M>,
    {
        let variables = ModelVariables::with_placement(seed, strategy.variable_placement());
        let local = strategy.local_replicas().len();
        let mut replicas = Vec::with_capacity(local);
        for replica in 0..local {
            let before = variables.names();
            let model = build(variables.var_builder(replica))?;
            if replica > 0 {
                let after = variables.names();
                if let Some(extra) = after.get(before.len()) {
                    return Err(NnError::ModelMismatch {
                        variable: extra.clone(),
                        reason: format!(
                            "replica {replica}'s model created it, replica 0's did not: build the same model on every replica"
                        ),
                    }
                    .into());
                }
            }
            replicas.push(model);
        }
        // Every worker's model the same (MultiWorkerMirrored), before any step.
        strategy
            .variable_placement()
            .model_built()
            .map_err(NnError::from)?;
        let lists = VariableLists::take(&variables, local, strategy.name())?;
        Ok(Self {
            strategy: strategy.id(),
            strategy_name: strategy.name(),
            variables,
            replicas,
            lists: RwLock::new(Arc::new(lists)),
            warned_no_gradient: AtomicBool::new(false),
        })
    }

    /// The variable lists, taken again if the model created variables since (a lazily built
    /// model, inside its first step: every replica's forward pass has created all it uses by
    /// the time it asks, so every replica gets the same lists).
    fn lists(&self) -> Result<Arc<VariableLists>, TrainError> {
        let now = self.variables.len();
        let current = Arc::clone(&self.lists.read().unwrap_or_else(|p| p.into_inner()));
        if current.taken_of == now {
            return Ok(current);
        }
        let mut lists = self.lists.write().unwrap_or_else(|p| p.into_inner());
        if lists.taken_of != self.variables.len() {
            *lists = Arc::new(VariableLists::take(
                &self.variables,
                self.replicas.len(),
                self.strategy_name,
            )?);
        }
        Ok(Arc::clone(&lists))
    }

    /// The model's variables.
    pub fn variables(&self) -> &ModelVariables {
        &self.variables
    }

    /// The variables optimizers train, in creation order (those created so far, for a model
    /// built lazily).
    pub fn trainable_variables(&self) -> Result<Vec<Variable>, TrainError> {
        Ok(self.lists()?.trainable.clone())
    }

    /// The number of copies (local replicas).
    pub fn num_replicas(&self) -> usize {
        self.replicas.len()
    }

    /// The copy of the replica running `ctx`: an error for a replica of another strategy than
    /// the one the model was built for.
    pub fn replica(&self, ctx: &ReplicaContext) -> Result<&M, TrainError> {
        Ok(&self.replicas[self.local_index(ctx)?])
    }

    /// Copy 0, for cross-replica use (evaluation, prediction, export).
    pub fn primary(&self) -> &M {
        &self.replicas[0]
    }

    /// Every local replica's copy, in replica order (for cross-replica use: building a lazy
    /// model on each copy, say).
    pub fn copies(&self) -> &[M] {
        &self.replicas
    }

    /// The gradients of the scalar `loss` (computed by the replica's copy) with respect to the
    /// trainable variables, in their order; zeros for a variable `loss` does not depend on.
    pub fn gradients(
        &self,
        ctx: &ReplicaContext,
        loss: &Tensor,
    ) -> Result<Vec<Tensor>, TrainError> {
        let lists = self.lists()?;
        self.gradients_of(ctx, &lists, loss)
    }

    fn gradients_of(
        &self,
        ctx: &ReplicaContext,
        lists: &VariableLists,
        loss: &Tensor,
    ) -> Result<Vec<Tensor>, TrainError> {
        let store = loss.backward()?;
        let live = &lists.trainable_live[self.local_index(ctx)?];
        let mut missing = Vec::new();
        let gradients = live
            .iter()
            .zip(&lists.trainable)
            .map(|(tensor, variable)| match store.get(tensor) {
                Some(g) => Ok(g.detach()),
                None => {
                    missing.push(variable.name());
                    Ok(tensor.zeros_like()?.detach())
                }
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        if !missing.is_empty() && !self.warned_no_gradient.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                variables = ?missing,
                "these trainable variables got no gradient: the loss does not depend on them, or it reaches them only through an op candle cannot differentiate (candle-nn's fused layer_norm, rms_norm or softmax_last_dim: use cohort::nn::layer_norm, rms_norm or candle_nn::ops::softmax)"
            );
        }
        Ok(gradients)
    }

    /// The index of `ctx`'s replica among the copies, if it is a replica of the model's
    /// strategy.
    fn local_index(&self, ctx: &ReplicaContext) -> Result<usize, TrainError> {
        let index = ctx.local_replica_id();
        if ctx.strategy_id() != self.strategy || index >= self.replicas.len() {
            return Err(TrainError::ForeignReplica {
                replica: index,
                replicas: self.replicas.len(),
            });
        }
        Ok(index)
    }

    /// One synchronous training step of this replica (see the type's calling protocol):
    /// `per_example_loss` runs the replica's copy on its batch and gives one loss per example.
    pub fn train_step<F>(
        &self,
        ctx: &ReplicaContext,
        optimizer: &DistributedOptimizer,
        spec: StepSpec,
        per_example_loss: F,
    ) -> Result<StepOutput, TrainError>
    where
        F: FnOnce(&M) -> candle_core::Result<Tensor>,
    {
        self.train_step_summing(ctx, optimizer, spec, |model| {
            Ok((per_example_loss(model)?, Vec::new()))
        })
    }

    /// [`ReplicatedModel::train_step`], where the closure also gives values to sum across
    /// every replica in sync (say, the step's metric statistics): they ride in the gradients'
    /// all-reduce with the loss, and come back summed ([`StepOutput::sums`]), the same on
    /// every replica, with no collective of their own.
    pub fn train_step_summing<F>(
        &self,
        ctx: &ReplicaContext,
        optimizer: &DistributedOptimizer,
        spec: StepSpec,
        per_example_loss_and_sums: F,
    ) -> Result<StepOutput, TrainError>
    where
        F: FnOnce(&M) -> candle_core::Result<(Tensor, Vec<f32>)>,
    {
        let model = self.replica(ctx)?;
        let randomness = StepRandomness {
            seed: self.variables.seed(),
            step: spec.step,
            replica: ctx.replica_id_in_sync_group() as u64,
        };
        let (per_example, extra) =
            with_step_randomness(randomness, || per_example_loss_and_sums(model))?;
        let loss = compute_average_loss(
            &per_example,
            spec.global_batch_size,
            ctx.num_replicas_in_sync(),
        )?;
        let lists = self.lists()?;
        let gradients = self.gradients_of(ctx, &lists, &loss)?;
        // The loss (and the closure's values) ride in the gradients' all-reduce: the global
        // loss without a second collective.
        let share = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        let mut also = Vec::with_capacity(1 + extra.len());
        also.push(share);
        also.extend_from_slice(&extra);
        let applied = optimizer.apply_gradients_summing(
            gradients.into_iter().zip(lists.trainable.iter().cloned()),
            &also,
        )?;
        self.average_statistics_of(ctx, &lists)?;
        Ok(StepOutput {
            loss: loss.detach(),
            applied,
        })
    }

    /// Averages every statistic across the replicas in sync and writes the mean into each
    /// replica's copy (TensorFlow's `MEAN` aggregation of a moving statistic): after it, the
    /// copies agree again. A collective: every replica calls it.
    pub fn average_statistics(&self, ctx: &ReplicaContext) -> Result<(), TrainError> {
        let lists = self.lists()?;
        self.average_statistics_of(ctx, &lists)
    }

    fn average_statistics_of(
        &self,
        ctx: &ReplicaContext,
        lists: &VariableLists,
    ) -> Result<(), TrainError> {
        if ctx.num_replicas_in_sync() <= 1 || lists.statistics.is_empty() {
            return Ok(());
        }
        let own: Vec<Tensor> = lists.statistics_live[self.local_index(ctx)?]
            .iter()
            .map(|live| live.copy().map(|t| t.detach()))
            .collect::<Result<_, _>>()?;
        let means = ctx.all_reduce_many(ReduceOp::Mean, &own)?;
        for (variable, mean) in lists.statistics.iter().zip(means) {
            let mean = mean.to_dtype(variable.dtype())?;
            variable.update_in_sync(|_| Ok(mean.clone()))?;
        }
        Ok(())
    }
}

/// Per local replica, the live tensor of each of `variables` (its copy for that replica).
fn live_tensors(variables: &[Variable], local: usize) -> Result<Vec<Vec<Tensor>>, TrainError> {
    (0..local)
        .map(|replica| {
            variables
                .iter()
                .map(|v| Ok(v.live_component(ModelVariables::component_of(v, replica))?))
                .collect()
        })
        .collect()
}
