//! [`Model`]: a candle-nn network built under a strategy, with Keras' `compile`, `evaluate`,
//! `predict`, `save` and `load` (`fit` is in `fit.rs`).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::{ModuleT, VarBuilder};

use super::metrics::Metric;
use super::{save, KerasError, Logs, Loss, Misuse};
use crate::data::{Dataset, DistributeOptions, Element};
use crate::strategy::SaveStateError;
use crate::strategy::{
    Ballot, CastVote, CentralStorage, DefaultStrategy, ElasticState, GroupChange, Leave, Mirrored,
    MultiWorkerMirrored, OneDevice, PerReplica, Recovery, ReduceOp, Strategy, StrategyError,
    StrategyExt,
};
use crate::train::{DistributedOptimizer, ReplicatedModel, TrainError};
use crate::variable::Variable;

/// The strategy a [`Model`] trains under, owned by it (Keras' `with strategy.scope():`). Made
/// from any of cohort's synchronous strategies with `into()`.
#[derive(Debug)]
pub struct ModelStrategy(Held);

#[derive(Debug)]
enum Held {
    /// One process: the default strategy, `OneDevice`, `Mirrored`, `CentralStorage`.
    Local(Box<dyn Strategy>),
    /// Several worker processes whose group re-forms when one is lost, joins or leaves.
    MultiWorker(Box<MultiWorkerMirrored>),
}

macro_rules! local_strategy {
    ($($strategy:ty),*) => {$(
        impl From<$strategy> for ModelStrategy {
            fn from(strategy: $strategy) -> Self {
                ModelStrategy(Held::Local(Box::new(strategy)))
            }
        }
    )*};
}
local_strategy!(DefaultStrategy, OneDevice, Mirrored, CentralStorage);

impl From<MultiWorkerMirrored> for ModelStrategy {
    fn from(strategy: MultiWorkerMirrored) -> Self {
        ModelStrategy(Held::MultiWorker(Box::new(strategy)))
    }
}

impl ModelStrategy {
    /// The strategy.
    pub fn strategy(&self) -> &dyn Strategy {
        match &self.0 {
            Held::Local(s) => s.as_ref(),
            Held::MultiWorker(s) => s.as_ref(),
        }
    }

    /// The MultiWorkerMirrored strategy, if it is one.
    pub fn multi_worker(&mut self) -> Option<&mut MultiWorkerMirrored> {
        match &mut self.0 {
            Held::Local(_) => None,
            Held::MultiWorker(s) => Some(s),
        }
    }

    pub(crate) fn is_chief(&self) -> bool {
        match &self.0 {
            Held::Local(_) => true,
            Held::MultiWorker(s) => s.is_chief(),
        }
    }

    /// Whether this worker joined a running group and waits for the live state.
    pub(crate) fn awaits_state(&self) -> bool {
        match &self.0 {
            Held::Local(_) => false,
            Held::MultiWorker(s) => s.awaits_state(),
        }
    }

    /// Makes every worker's state the most advanced one's (a fresh start after a restore).
    pub(crate) fn agree(&mut self, state: &mut ElasticState<'_>) -> Result<(), StrategyError> {
        match &mut self.0 {
            Held::Local(_) => Ok(()),
            Held::MultiWorker(s) => s.agree(state).map(|_| ()),
        }
    }

    /// The group's changes at a step boundary, voted by `ballot` (nothing changes in one
    /// process).
    pub(crate) fn at_step_boundary(
        &mut self,
        state: &mut ElasticState<'_>,
        ballot: Ballot,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        match &mut self.0 {
            Held::Local(_) => Ok(None),
            Held::MultiWorker(s) => s.at_boundary(state, ballot, save),
        }
    }

    /// This worker's vote at the next step boundary, to count in the step before it (none in
    /// one process: it has no group).
    pub(crate) fn cast_vote(
        &self,
        leaving: Option<Leave>,
    ) -> Result<Option<CastVote>, StrategyError> {
        match &self.0 {
            Held::Local(_) => Ok(None),
            Held::MultiWorker(s) => s.cast_vote(leaving).map(Some),
        }
    }

    /// Re-forms the group after `err`, where that can mend it: `None` where it cannot (one
    /// process, or an error that is not a lost peer).
    pub(crate) fn recover(
        &mut self,
        err: &TrainError,
        state: &mut ElasticState<'_>,
    ) -> Result<Option<Recovery>, StrategyError> {
        let Held::MultiWorker(s) = &mut self.0 else {
            return Ok(None);
        };
        match err.collective_cause() {
            Some(crate::collective::CollectiveError::Application { .. }) | None => Ok(None),
            Some(_) => s.recover(state).map(Some),
        }
    }
}

/// What `compile` set.
pub(crate) struct Compiled {
    pub(crate) optimizer: Arc<DistributedOptimizer>,
    pub(crate) loss: Loss,
    pub(crate) metrics: Arc<[Box<dyn Metric>]>,
}

/// A candle-nn network under a strategy, trained Keras' way (see the [module](super) docs).
///
/// The network is any type built from a `VarBuilder` that implements candle's `ModuleT`
/// (every `Module` does): `forward_t(x, true)` in training, `forward_t(x, false)` in
/// evaluation and prediction, so dropout and batch normalization behave as in Keras. Dataset
/// elements are `(features, labels)` or `(features, labels, sample_weights)`, batched to the
/// global batch; each step splits the global batch over every replica in sync.
pub struct Model<N> {
    strategy: ModelStrategy,
    network: Arc<ReplicatedModel<N>>,
    pub(crate) compiled: Option<Compiled>,
}

impl<N: ModuleT + Send + Sync + 'static> Model<N> {
    /// Builds the network under `strategy` (once per local replica over one set of
    /// variables), its initial weights drawn from `seed` (the same on every worker and run).
    pub fn new<S, F>(strategy: S, seed: u64, build: F) -> Result<Self, KerasError>
    where
        S: Into<ModelStrategy>,
        F: Fn(VarBuilder<'static>) -> candle_core::Result<N>,
    {
        let strategy = strategy.into();
        let network = Arc::new(ReplicatedModel::build(strategy.strategy(), seed, build)?);
        Ok(Self {
            strategy,
            network,
            compiled: None,
        })
    }

    /// Runs the network once on `features` with each local replica's copy, in cross-replica
    /// context (Keras' `model.build`): a network whose layers create their variables on their
    /// first call creates them now, by the strategy's policy (mirrored on every replica; under
    /// MultiWorkerMirrored checked against every worker's and started from the first
    /// worker's, so every worker must build, except one that joins a running group: it takes
    /// the group's variables at its first step boundary). [`Model::fit`] builds an unbuilt
    /// model on its first batch by itself; build first to load weights into it.
    pub fn build(&mut self, features: &Tensor) -> Result<(), KerasError> {
        for copy in self.network.copies() {
            copy.forward_t(features, false)?;
        }
        Ok(())
    }

    /// Builds the network on the first example of `data` if it has no variables yet (a
    /// network built lazily).
    pub(crate) fn build_if_unbuilt(&mut self, data: &Dataset) -> Result<(), KerasError> {
        if !self.network.variables().is_empty() {
            return Ok(());
        }
        let first = data.iter().next().ok_or(Misuse::NothingToBuildOn)??;
        let features = first
            .first()
            .ok_or(KerasError::BatchComponents { got: 0 })?;
        let rows = features.dims().first().copied().unwrap_or(0).min(1);
        self.build(&features.narrow(0, 0, rows)?)
    }

    /// Sets the optimizer (a kernel, or a [`DistributedOptimizer`] with a learning-rate
    /// schedule or clipping), the loss and the metrics (Keras' `compile`). Compiling again
    /// starts a new optimizer state.
    pub fn compile(
        &mut self,
        optimizer: impl Into<DistributedOptimizer>,
        loss: Loss,
        metrics: Vec<Box<dyn Metric>>,
    ) {
        self.compiled = Some(Compiled {
            optimizer: Arc::new(optimizer.into()),
            loss,
            metrics: metrics.into(),
        });
    }

    /// The strategy it runs under.
    pub fn strategy(&self) -> &dyn Strategy {
        self.strategy.strategy()
    }

    pub(crate) fn model_strategy(&mut self) -> &mut ModelStrategy {
        &mut self.strategy
    }

    /// The network of replica 0 (for cross-replica use: export, inspection).
    pub fn network(&self) -> &N {
        self.network.primary()
    }

    pub(crate) fn replicated(&self) -> &Arc<ReplicatedModel<N>> {
        &self.network
    }

    /// Every variable (trainable weights and statistics), in creation order: none yet for a
    /// network that creates its variables on its first call, before [`Model::build`] or
    /// [`Model::fit`].
    pub fn variables(&self) -> Vec<Variable> {
        self.network.variables().variables()
    }

    /// A table of the variables (name, shape, parameters) and the totals, trainable and not
    /// (Keras' `model.summary()`).
    pub fn summary(&self) -> String {
        let variables = self.variables();
        let width = variables
            .iter()
            .map(|v| v.name().len())
            .max()
            .unwrap_or(8)
            .max(8);
        let mut out = format!(
            "{:<width$}  {:<16}  {:>10}\n",
            "variable", "shape", "params"
        );
        let (mut trainable, mut other) = (0usize, 0usize);
        for v in &variables {
            let params: usize = v.shape().iter().product();
            if v.trainable() {
                trainable += params;
            } else {
                other += params;
            }
            let shape = format!("{:?}", v.shape());
            out.push_str(&format!(
                "{:<width$}  {shape:<16}  {params:>10}\n",
                v.name()
            ));
        }
        out.push_str(&format!(
            "total params: {}\ntrainable params: {trainable}\nnon-trainable params: {other}\n",
            trainable + other
        ));
        out
    }

    /// The optimizer `compile` set.
    pub fn optimizer(&self) -> Option<&Arc<DistributedOptimizer>> {
        self.compiled.as_ref().map(|c| &c.optimizer)
    }

    /// Writes every variable to a safetensors file at `path` (Keras' `save_weights`), by
    /// name; Python's `safetensors` reads it.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), KerasError> {
        save::save_variables(&self.variables(), path.as_ref())
    }

    /// Sets every variable from a safetensors file `save` wrote: a tensor missing, of another
    /// shape, or one the model does not have is refused, naming it, before anything changes.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<(), KerasError> {
        let path = path.as_ref();
        let weights = save::load_file(path)?;
        save::assign_weights(&self.variables(), &weights, &path.display().to_string())
    }

    /// The loss and metrics over every batch of `data` (Keras' `evaluate`), reduced over every
    /// replica of every worker: the same figures on every worker.
    pub fn evaluate(&mut self, data: &Dataset) -> Result<Logs, KerasError> {
        self.evaluate_steps(data, None)
    }

    /// [`Model::evaluate`] over at most `steps` batches.
    pub fn evaluate_steps(
        &mut self,
        data: &Dataset,
        steps: Option<usize>,
    ) -> Result<Logs, KerasError> {
        let compiled = self
            .compiled
            .as_ref()
            .ok_or(KerasError::NotCompiled("evaluate"))?;
        let strategy = self.strategy.strategy();
        let distributed =
            strategy.experimental_distribute_dataset(data.clone(), DistributeOptions::default())?;
        let metrics = Arc::clone(&compiled.metrics);
        let mut totals = vec![0.0f64; stats_len(&metrics)];
        let mut iter = distributed.iter();
        let mut done = 0;
        while steps.is_none_or(|s| done < s) {
            let Some(batch) = iter.get_next_as_optional()? else {
                break;
            };
            let network = Arc::clone(&self.network);
            let loss = compiled.loss.clone();
            let metrics = Arc::clone(&metrics);
            let per_replica = strategy.run(
                move |ctx, element: Element| -> Result<Tensor, KerasError> {
                    let (x, y, weights) = split_element(&element)?;
                    let net = network.replica(ctx)?;
                    let predictions = if x.dims().first() == Some(&0) {
                        None
                    } else {
                        Some(net.forward_t(x, false)?)
                    };
                    batch_stats(&loss, &metrics, y, predictions.as_ref(), weights)
                },
                batch,
            )?;
            let summed = sum_stats(strategy, per_replica)?;
            for (t, s) in totals.iter_mut().zip(summed) {
                *t += s;
            }
            done += 1;
        }
        if done == 0 {
            return Err(Misuse::NoBatches {
                operation: "evaluate",
            }
            .into());
        }
        Ok(logs_of(&metrics, &totals))
    }

    /// The network's outputs for the features (the first component) of every batch of
    /// `data`, in order, concatenated along the first axis (Keras' `predict`). Under
    /// MultiWorkerMirrored every worker gets every prediction.
    pub fn predict(&self, data: &Dataset) -> Result<Tensor, KerasError> {
        let strategy = self.strategy.strategy();
        let distributed =
            strategy.experimental_distribute_dataset(data.clone(), DistributeOptions::default())?;
        let mut outputs = Vec::new();
        for batch in &distributed {
            let network = Arc::clone(&self.network);
            let per_replica = strategy.run(
                move |ctx, element: Element| -> Result<Tensor, KerasError> {
                    let x = element
                        .first()
                        .ok_or(KerasError::BatchComponents { got: 0 })?;
                    Ok(network.replica(ctx)?.forward_t(x, false)?)
                },
                batch?,
            )?;
            let values = per_replica
                .into_values()
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
            let rows: Vec<Tensor> = values
                .iter()
                .map(|v| {
                    Tensor::new(
                        &[v.dims().first().copied().unwrap_or(0) as i64],
                        &Device::Cpu,
                    )
                })
                .collect::<Result<_, _>>()?;
            let gathered = strategy.gather(&PerReplica::new(values), 0)?;
            outputs.push(match distributed.applied_shard_policy() {
                // DATA sharding deals a global batch's slices to the workers in turn (worker
                // `w`'s replica `r` holds slice `w + r × workers`): put them back in order.
                Some(crate::data::AutoShardPolicy::Data) => {
                    let rows = strategy
                        .gather(&PerReplica::new(rows), 0)?
                        .to_vec1::<i64>()?;
                    in_slice_order(&gathered, &rows, strategy.local_replicas().len())?
                }
                _ => gathered,
            });
        }
        if outputs.is_empty() {
            return Err(Misuse::NoBatches {
                operation: "predict",
            }
            .into());
        }
        Ok(Tensor::cat(&outputs, 0)?)
    }
}

/// `gathered` (every replica's rows, worker after worker, `local` replicas each, `rows[g]`
/// rows from replica `g`) with the slices in the order DATA sharding cut them from the global
/// batch: slice `s` is on worker `s % workers`, replica `s / workers`.
fn in_slice_order(gathered: &Tensor, rows: &[i64], local: usize) -> Result<Tensor, KerasError> {
    let local = local.max(1);
    let workers = rows.len() / local;
    let mut starts = Vec::with_capacity(rows.len());
    let mut at = 0usize;
    for &n in rows {
        starts.push(at);
        at += n.max(0) as usize;
    }
    let pieces = (0..rows.len())
        .map(|slice| {
            let g = (slice % workers.max(1)) * local + slice / workers.max(1);
            gathered.narrow(0, starts[g], rows[g].max(0) as usize)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tensor::cat(&pieces, 0)?)
}

/// Features, labels and per-example weights (ones when the element has none) of a batch.
pub(crate) fn split_element(element: &Element) -> Result<(&Tensor, &Tensor, Vec<f32>), KerasError> {
    let [x, y, rest @ ..] = element.as_slice() else {
        return Err(KerasError::BatchComponents { got: element.len() });
    };
    let batch = x.dims().first().copied().unwrap_or(0);
    let weights = match rest.first() {
        Some(w) => {
            let w = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            if w.len() != batch {
                return Err(Misuse::SampleWeights {
                    values: w.len(),
                    batch,
                }
                .into());
            }
            w
        }
        None => vec![1.0; batch],
    };
    Ok((x, y, weights))
}

/// The statistics of one replica's batch: the weighted loss sum, the example count, then
/// each metric's statistics; as an f64 tensor to be summed over replicas.
pub(crate) fn batch_stats(
    loss: &Loss,
    metrics: &[Box<dyn Metric>],
    labels: &Tensor,
    predictions: Option<&Tensor>,
    weights: Vec<f32>,
) -> Result<Tensor, KerasError> {
    match predictions {
        None => Ok(Tensor::new(vec![0f64; stats_len(metrics)], &Device::Cpu)?),
        Some(predictions) => {
            let per_example = loss.per_example(predictions, labels)?;
            let stats = stats_of(&per_example, metrics, labels, predictions, &weights)?;
            Ok(Tensor::new(stats, &Device::Cpu)?)
        }
    }
}

/// [`batch_stats`] of a batch whose unweighted per-example losses a step computed already
/// (`per_example`), so that they are not computed again.
pub(crate) fn stats_of(
    per_example: &Tensor,
    metrics: &[Box<dyn Metric>],
    labels: &Tensor,
    predictions: &Tensor,
    weights: &[f32],
) -> Result<Vec<f64>, KerasError> {
    let mut stats = Vec::with_capacity(stats_len(metrics));
    let per_example = per_example.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let weighted: f64 = per_example
        .iter()
        .zip(weights)
        .map(|(l, w)| f64::from(*l) * f64::from(*w))
        .sum();
    stats.push(weighted);
    stats.push(weights.len() as f64);
    for metric in metrics {
        let state = metric.batch_state(labels, predictions, weights)?;
        if state.len() != metric.state_len() {
            return Err(Misuse::MetricStatistics {
                metric: metric.name().to_owned(),
                got: state.len(),
                declared: metric.state_len(),
            }
            .into());
        }
        stats.extend(state);
    }
    Ok(stats)
}

pub(crate) fn stats_len(metrics: &[Box<dyn Metric>]) -> usize {
    2 + metrics.iter().map(|m| m.state_len()).sum::<usize>()
}

/// Every replica's statistics summed (over every worker, with one collective).
pub(crate) fn sum_stats(
    strategy: &dyn Strategy,
    per_replica: PerReplica<Result<Tensor, KerasError>>,
) -> Result<Vec<f64>, KerasError> {
    let values = every_value(per_replica)?;
    let summed = strategy.reduce(ReduceOp::Sum, &PerReplica::new(values), None)?;
    Ok(summed.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// The statistics every replica holds already summed (a training step's, summed in its
/// gradients' all-reduce): the first replica's.
pub(crate) fn first_stats(
    per_replica: PerReplica<Result<Vec<f64>, KerasError>>,
) -> Result<Vec<f64>, KerasError> {
    Ok(every_value(per_replica)?
        .into_iter()
        .next()
        .unwrap_or_default())
}

/// Every replica's value, or the error that says why the step failed: a replica that fails
/// makes its peers' collectives fail, so the cause is preferred over a peer's failure.
fn every_value<T>(per_replica: PerReplica<Result<T, KerasError>>) -> Result<Vec<T>, KerasError> {
    let mut values = Vec::new();
    let mut first_error = None;
    for result in per_replica.into_values() {
        match result {
            Ok(v) => values.push(v),
            Err(e) => {
                let peer_failure = matches!(&first_error, Some(KerasError::Train(t)) if t.collective_cause().is_some());
                if first_error.is_none() || peer_failure {
                    first_error = Some(e);
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(values),
    }
}

/// `loss` and each metric's result from summed statistics.
pub(crate) fn logs_of(metrics: &[Box<dyn Metric>], totals: &[f64]) -> Logs {
    let mut logs = Logs::new();
    let examples = totals[1];
    logs.insert(
        "loss",
        if examples > 0.0 {
            totals[0] / examples
        } else {
            f64::NAN
        },
    );
    let mut offset = 2;
    for metric in metrics {
        let len = metric.state_len();
        logs.insert(metric.name(), metric.result(&totals[offset..offset + len]));
        offset += len;
    }
    logs
}
