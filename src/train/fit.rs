//! `fit`: the synchronous training loop over a distributed dataset, with progress.

use std::fmt;
use std::sync::Arc;

use candle_core::Tensor;

use super::{
    compute_average_loss, scale_regularization_loss, DistributedOptimizer, Progbar, ProgbarMode,
    TrainError,
};
use crate::data::{Dataset, DistributeOptions, Element};
use crate::nn::{GradientTape, Layer, NnError, WeightAccess};
use crate::strategy::{PerReplica, Strategy, StrategyError, StrategyExt};
use crate::variable::Variable;

/// What `fit` trains: a loss per example of a batch, computed through a tape, and the
/// variables it depends on.
pub trait Model: Send + Sync {
    /// The variables the optimizer trains, in a fixed order.
    fn trainable_variables(&self) -> Vec<Variable>;

    /// One loss per example of `batch` (a dataset element: features, labels, ...), reading
    /// variables through `tape`.
    fn per_example_loss(&self, tape: &GradientTape, batch: &[Tensor])
        -> Result<Tensor, TrainError>;

    /// Regularization losses, unscaled (Keras' `model.losses`).
    fn regularization_losses(&self, _tape: &GradientTape) -> Result<Vec<Tensor>, TrainError> {
        Ok(Vec::new())
    }

    /// The variables a forward pass reads whole (kernels, biases; not tables read by rows),
    /// if the model knows them: a parameter-server step fetches them all in one round trip
    /// per server before the pass. `None` (the default): each is read when first touched.
    fn whole_read_variables(&self) -> Option<Vec<String>> {
        None
    }
}

/// A network and a per-example loss on `(features, labels)` batches: the loss of
/// `network(batch[0])` against `batch[1]`.
pub struct Supervised<L> {
    network: L,
    loss: LossFn,
}

/// A per-example loss: predictions and labels to one value per example.
type LossFn = fn(&Tensor, &Tensor) -> Result<Tensor, NnError>;

impl<L: Layer> Supervised<L> {
    /// Pairs `network` with `loss` (e.g. [`crate::nn::losses::mean_squared_error`]).
    pub fn new(network: L, loss: LossFn) -> Self {
        Self { network, loss }
    }

    /// The network.
    pub fn network(&self) -> &L {
        &self.network
    }
}

impl<L> fmt::Debug for Supervised<L>
where
    L: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervised")
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl<L: Layer> Model for Supervised<L> {
    fn trainable_variables(&self) -> Vec<Variable> {
        self.network.trainable_variables()
    }

    fn per_example_loss(
        &self,
        tape: &GradientTape,
        batch: &[Tensor],
    ) -> Result<Tensor, TrainError> {
        let [features, labels, ..] = batch else {
            return Err(TrainError::BatchComponents {
                needed: 2,
                got: batch.len(),
            });
        };
        let predictions = self.network.forward(tape, features)?;
        Ok((self.loss)(&predictions, labels)?)
    }

    fn regularization_losses(&self, tape: &GradientTape) -> Result<Vec<Tensor>, TrainError> {
        Ok(self.network.regularization_losses(tape)?)
    }

    fn whole_read_variables(&self) -> Option<Vec<String>> {
        Some(
            self.network
                .weight_specs()
                .into_iter()
                .filter(|spec| spec.access == WeightAccess::Dense)
                .map(|spec| spec.name)
                .collect(),
        )
    }
}

/// The mean loss of each epoch, in order (Keras' `History.history["loss"]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Per epoch: the mean over its steps of the global batch loss (regularization included),
    /// weighted by each step's number of examples.
    pub loss: Vec<f64>,
    /// Steps run in each epoch.
    pub steps: Vec<usize>,
}

/// Options of [`fit_with_options`].
#[derive(Debug)]
pub struct FitOptions {
    /// Where and how progress is shown.
    pub progress: Progbar,
    /// How the dataset is distributed over the replicas.
    pub distribute: DistributeOptions,
}

impl Default for FitOptions {
    fn default() -> Self {
        Self {
            progress: Progbar::stderr(ProgbarMode::Auto),
            distribute: DistributeOptions::default(),
        }
    }
}

/// Trains `model` for `epochs` passes over `dataset` (batched to the global batch size) under
/// `strategy`, showing Keras 3's progress bar on standard error ([`Progbar`]: a bar on a
/// terminal, one line per epoch otherwise), and returns the loss history (Keras' `model.fit`).
///
/// Each step distributes the global batch over the replicas; each replica computes its
/// per-example losses, averages them over the *global* batch ([`compute_average_loss`] with
/// the step's true example count, so short batches weigh right), adds its share of the
/// regularization losses ([`scale_regularization_loss`]), takes gradients, and calls
/// [`DistributedOptimizer::apply_gradients`], which sums them across replicas. The model's
/// variables must have been created under `strategy`'s scope.
///
/// ```
/// use std::sync::Arc;
/// use candle_core::{Device, Tensor};
/// use cohort::data::Dataset;
/// use cohort::nn::{losses, Dense, Initializer};
/// use cohort::optim::Optimizer;
/// use cohort::strategy::{Mirrored, Strategy};
/// use cohort::train::{fit, DistributedOptimizer, Supervised};
///
/// let strategy = Mirrored::new(2)?;
/// let model = {
///     let _scope = strategy.scope();
///     let dense = Dense::builder("dense", 1, 1)
///         .kernel_initializer(Initializer::Zeros)
///         .build()?;
///     Arc::new(Supervised::new(dense, losses::mean_squared_error))
/// };
/// // y = 2x on 8 points.
/// let x: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
/// let y: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
/// let cpu = &Device::Cpu;
/// let data = Dataset::from_tensor_slices(vec![
///     Tensor::from_vec(x, (8, 1), cpu)?,
///     Tensor::from_vec(y, (8, 1), cpu)?,
/// ])?
/// .batch(4, false);
/// let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.5)));
/// let history = fit(&strategy, model, optimizer, data, 5)?;
/// assert_eq!(history.loss.len(), 5);
/// assert!(history.loss[4] < history.loss[0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fit<S, M>(
    strategy: &S,
    model: Arc<M>,
    optimizer: Arc<DistributedOptimizer>,
    dataset: Dataset,
    epochs: usize,
) -> Result<History, TrainError>
where
    S: Strategy + ?Sized,
    M: Model + 'static,
{
    fit_with_options(
        strategy,
        model,
        optimizer,
        dataset,
        epochs,
        FitOptions::default(),
    )
}

/// [`fit`] with options: where progress goes, how the dataset is distributed.
pub fn fit_with_options<S, M>(
    strategy: &S,
    model: Arc<M>,
    optimizer: Arc<DistributedOptimizer>,
    dataset: Dataset,
    epochs: usize,
    options: FitOptions,
) -> Result<History, TrainError>
where
    S: Strategy + ?Sized,
    M: Model + 'static,
{
    if epochs == 0 {
        return Err(TrainError::Fit("epochs must be at least 1".to_owned()));
    }
    let FitOptions {
        mut progress,
        distribute,
    } = options;
    let distributed = strategy.experimental_distribute_dataset(dataset, distribute)?;
    let mut history = History::default();
    let mut steps_hint = None;
    for epoch in 1..=epochs {
        progress.begin_epoch(epoch, epochs, steps_hint)?;
        let mut steps = 0;
        let mut weighted_loss = 0.0_f64;
        let mut examples = 0_usize;
        for batch in &distributed {
            let batch = batch?;
            let global = global_examples(&batch);
            if global == 0 {
                continue;
            }
            let loss = train_step(strategy, &model, &optimizer, batch, global)?;
            steps += 1;
            weighted_loss += loss * global as f64;
            examples += global;
            progress.update(steps, &[("loss", weighted_loss / examples as f64)])?;
        }
        if steps == 0 {
            return Err(TrainError::Fit("the dataset yielded no batches".to_owned()));
        }
        let loss = weighted_loss / examples as f64;
        progress.end_epoch(steps, &[("loss", loss)])?;
        history.loss.push(loss);
        history.steps.push(steps);
        steps_hint = Some(steps);
    }
    Ok(history)
}

/// One synchronous step; gives the global batch's loss (the SUM over replicas of their
/// scaled losses).
fn train_step<S, M>(
    strategy: &S,
    model: &Arc<M>,
    optimizer: &Arc<DistributedOptimizer>,
    batch: PerReplica<Element>,
    global: usize,
) -> Result<f64, TrainError>
where
    S: Strategy + ?Sized,
    M: Model + 'static,
{
    let replicas = strategy.num_replicas_in_sync();
    let model = Arc::clone(model);
    let optimizer = Arc::clone(optimizer);
    let per_replica = strategy.run(
        move |_ctx, element: Element| -> Result<f64, TrainError> {
            let tape = GradientTape::new();
            let per_example = model.per_example_loss(&tape, &element)?;
            let mut loss = compute_average_loss(&per_example, Some(global), replicas)?;
            for reg in model.regularization_losses(&tape)? {
                loss = (loss + scale_regularization_loss(&reg, replicas)?)?;
            }
            let variables = model.trainable_variables();
            let grads = tape.gradient(&loss, &variables)?;
            optimizer.apply_gradients(grads.into_iter().zip(variables))?;
            Ok(f64::from(
                loss.to_dtype(candle_core::DType::F32)?.to_scalar::<f32>()?,
            ))
        },
        batch,
    )?;
    let mut total = 0.0;
    let mut first_error = None;
    for result in per_replica {
        match result {
            Ok(loss) => total += loss,
            // A replica that fails makes its peers' collectives fail too; report the cause.
            Err(e) if first_error.is_none() || is_peer_failure(first_error.as_ref()) => {
                first_error = Some(e)
            }
            Err(_) => {}
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

fn is_peer_failure(e: Option<&TrainError>) -> bool {
    matches!(
        e,
        Some(TrainError::Strategy(StrategyError::Collective(_)))
            | Some(TrainError::Variable(
                crate::variable::VariableError::Collective { .. }
            ))
    )
}

/// Examples in a step: the first dimension of each replica's first component, summed.
fn global_examples(batch: &PerReplica<Element>) -> usize {
    batch
        .values()
        .iter()
        .map(|element| {
            element
                .first()
                .and_then(|t| t.dims().first().copied())
                .unwrap_or(0)
        })
        .sum()
}
