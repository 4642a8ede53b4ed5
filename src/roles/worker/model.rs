//! The bridge between `nn` models and the parameter servers: the same model code that trains
//! in process under `Mirrored` or `OneDevice` trains on a parameter-server cluster.
//!
//! This module owns [`PsModel`]: on the chief it turns a model's declared variables
//! ([`Layer::weight_specs`](crate::nn::Layer::weight_specs)) into variables on the parameter servers; on a worker it builds the
//! model with its variables placed on the servers ([`Placement::ParameterServer`]) and runs a
//! step through a tape whose reads are pulls (only a batch's rows for an embedding table) and
//! whose gradients become the step's pushes (row-sparse for tables read by rows).
//!
//! [`Placement::ParameterServer`]: crate::variable::Placement::ParameterServer

use std::collections::HashMap;
use std::fmt;
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};

use super::{StepContext, StepError};
use crate::layout::Layout;
use crate::nn::{Gradient, GradientTape, NnError, VariableSource, WeightAccess, WeightSpec};
use crate::roles::coordinator::{ClusterCoordinator, CoordinatorError, VariableSpec};
use crate::train::Model;
use crate::variable::{ParameterServerPlacement, Partitioner, Variable};

/// A model whose variables live on the parameter servers, as a worker's step sees it.
///
/// Calling protocol:
/// 1. **Chief**, once, before scheduling steps: list the model's variables without drawing
///    them ([`crate::nn::declare`] then [`Layer::weight_specs`](crate::nn::Layer::weight_specs)) and create them on the
///    servers with [`PsModel::create_variables`] (choose a partitioner per variable, e.g. for
///    a large embedding table).
/// 2. **Worker**, in a registered step function: build the model with [`PsModel::build`]
///    (the same builder function the in-process run uses; building is cheap: no values are
///    drawn or stored on the worker), then call [`PsModel::train_step`] with a batch. It
///    fetches the variables the model reads whole ([`Model::whole_read_variables`]: kernels,
///    biases) in one request per server before the forward pass, reads any other variable
///    when the pass first touches it (`StepContext::pull`, or `pull_rows` with only the
///    batch's distinct ids for a table read by rows), differentiates the mean loss of the batch (plus regularization losses), and
///    records one push per variable: dense, or rows for a table read by rows. The pushes are
///    sent when the step function returns `Ok`, as every step's are (PS-1), and the servers
///    apply the program's optimizer.
/// 3. For evaluation on a worker, [`PsModel::run`] gives a tape that reads from the servers
///    and pushes nothing.
///
/// ```no_run
/// use candle_core::Tensor;
/// use cohort::nn::{declare, losses, Activation, Dense, Layer, NnError, Sequential};
/// use cohort::program::{CoordinatorError, Program, PsModel, Step, StepContext, StepError};
/// use cohort::train::Supervised;
///
/// // The model, written once: in process it is built under a strategy's scope and trained
/// // with `fit`; here its variables live on the parameter servers.
/// fn model() -> Result<Supervised<Sequential>, NnError> {
///     let net = Sequential::new("net")
///         .push(Dense::builder("hidden", 2, 8).activation(Activation::Relu).build()?)
///         .push(Dense::builder("out", 8, 1).build()?);
///     Ok(Supervised::new(net, losses::binary_cross_entropy_from_logits))
/// }
///
/// /// One step on a fixed batch; its value is the batch's loss.
/// static TRAIN: Step<(), f32> = Step::new("train");
///
/// let program = Program::new("bridge")
///     .step(&TRAIN, |ctx: &mut StepContext<'_>, ()| {
///         let model = PsModel::build(ctx, model)?;
///         let x = Tensor::new(&[[1f32, 2.], [-1., -2.]], &candle_core::Device::Cpu)?;
///         let y = Tensor::new(&[[1f32], [0.]], &candle_core::Device::Cpu)?;
///         let report = model.train_step(ctx, &[x, y])?;
///         Ok::<_, StepError>(report.loss)
///     })
///     .chief(|coordinator| {
///         let declared = declare(model).map_err(|e| CoordinatorError::Other(e.to_string()))?;
///         PsModel::create_variables(coordinator, &declared.network().weight_specs(), |_| None)?;
///         for _ in 0..100 {
///             coordinator.schedule(&TRAIN, ())?;
///         }
///         coordinator.join()
///     });
/// std::process::exit(cohort::program::main(program));
/// ```
pub struct PsModel<M> {
    model: M,
}

/// What one [`PsModel::train_step`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// The batch's mean loss (regularization included), before the update.
    pub loss: f32,
    /// Examples in the batch.
    pub examples: usize,
    /// Local replicas the batch was split over (the worker's `replicas`, fewer for a batch
    /// with fewer examples).
    pub replicas: usize,
    /// The push recorded for each trainable variable, in the model's order.
    pub pushes: Vec<PushedGradient>,
}

/// One variable's recorded gradient, in size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedGradient {
    /// The variable.
    pub variable: String,
    /// Dense (the whole variable) or rows.
    pub access: WeightAccess,
    /// Rows pushed (a dense push counts every row; a 1-D variable is one row).
    pub rows: usize,
    /// Values pushed.
    pub values: usize,
}

impl PsModel<()> {
    /// Creates the variables of `specs` on the parameter servers (chief side), in order,
    /// each split by `partitioner(spec)` (None: whole, round-robin).
    pub fn create_variables(
        coordinator: &mut ClusterCoordinator,
        specs: &[WeightSpec],
        partitioner: impl Fn(&WeightSpec) -> Option<Partitioner>,
    ) -> Result<Vec<Layout>, CoordinatorError> {
        specs
            .iter()
            .map(|spec| {
                let mut ps_spec = VariableSpec::new(&spec.name, spec.shape.clone(), spec.init);
                ps_spec.partitioner = partitioner(spec);
                coordinator.create_variable(ps_spec)
            })
            .collect()
    }
}

impl<M> PsModel<M> {
    /// Builds the model on a worker with `build`: every variable it creates is placed on the
    /// parameter servers by the layout the chief created under its name (an error names a
    /// variable the chief did not create, or created with another shape).
    pub fn build(
        ctx: &StepContext<'_>,
        build: impl FnOnce() -> Result<M, NnError>,
    ) -> Result<Self, StepError> {
        let placement = ParameterServerPlacement::new(ctx.layouts.values().cloned());
        let _scope = placement.scope().map_err(NnError::from)?;
        Ok(Self { model: build()? })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Runs `f` with a tape that reads this model's variables from the parameter servers;
    /// nothing is pushed. `f` runs on a helper thread while this one serves its reads.
    pub fn run<T: Send>(
        &self,
        ctx: &StepContext<'_>,
        f: impl FnOnce(&GradientTape, &M) -> Result<T, NnError> + Send,
    ) -> Result<T, StepError>
    where
        M: Sync,
    {
        let f = Mutex::new(Some(f));
        let mut results = with_ps_tapes(ctx, HashMap::new(), 1, |_, tape| {
            let f = f
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or_else(|| StepError::Step("the model computation ran twice".into()))?;
            Ok(f(tape, &self.model)?)
        })?;
        results
            .pop()
            .ok_or_else(|| StepError::Step("the model computation gave no result".into()))
    }
}

impl<M: Model> PsModel<M> {
    /// One training step on `batch` (see the type's calling protocol): forward through the
    /// servers' values, gradient of the batch's mean loss plus regularization, one recorded
    /// push per trainable variable.
    pub fn train_step(
        &self,
        ctx: &mut StepContext<'_>,
        batch: &[Tensor],
    ) -> Result<TrainReport, StepError> {
        let variables = self.model.trainable_variables();
        if let Some(local) = variables.iter().find(|v| v.ps_layout().is_none()) {
            return Err(StepError::Step(format!(
                "variable {:?} is trainable but not on the parameter servers: build the model with PsModel::build",
                local.name()
            )));
        }
        // What the pass reads whole, fetched up front in one request per server.
        let prefetch: Vec<String> = self
            .model
            .whole_read_variables()
            .unwrap_or_default()
            .into_iter()
            .filter(|name| ctx.layout(name).is_ok())
            .collect();
        let names: Vec<&str> = prefetch.iter().map(String::as_str).collect();
        let prefetched = prefetch
            .iter()
            .cloned()
            .zip(ctx.pull_many(&names)?)
            .collect();
        // The batch split over the worker's local replicas (contiguous slices, the first
        // ones one example larger when it does not divide): each replica differentiates its
        // examples' share of the batch's mean loss, so their summed gradients are the whole
        // batch's gradient, pushed once (PS-1 unchanged).
        let slices = split_batch(batch, ctx.replicas())?;
        let global_examples = match slices.len() {
            1 => None,
            _ => Some(batch[0].dims()[0]),
        };
        let per_replica = with_ps_tapes(ctx, prefetched, slices.len(), |replica, tape| {
            let slice = &slices[replica];
            let per_example = self
                .model
                .per_example_loss(tape, slice)
                .map_err(|e| StepError::Step(format!("loss: {e}")))?;
            let examples = per_example.dims().first().copied().unwrap_or(1);
            // The batch's mean: a zero-example batch gives zero, not 0/0.
            let divisor = global_examples.unwrap_or(examples).max(1);
            let mut loss = (per_example.sum_all()? / divisor as f64)?;
            // Regularization belongs to the step once, not once per replica.
            if replica == 0 {
                let regularization = self
                    .model
                    .regularization_losses(tape)
                    .map_err(|e| StepError::Step(format!("regularization losses: {e}")))?;
                for r in regularization {
                    loss = (loss + r)?;
                }
            }
            let grads = tape.sparse_gradient(&loss, &variables)?;
            Ok((loss.to_scalar::<f32>()?, examples, grads))
        })?;
        let replicas = per_replica.len();
        let loss = per_replica.iter().map(|(loss, _, _)| loss).sum();
        let examples = per_replica.iter().map(|(_, examples, _)| examples).sum();
        let grads = sum_replica_gradients(
            &variables,
            per_replica.into_iter().map(|(_, _, grads)| grads).collect(),
        )?;
        let mut pushes = Vec::with_capacity(variables.len());
        for (variable, grad) in variables.iter().zip(grads) {
            let name = variable.name();
            let row_len: usize = variable.shape().iter().skip(1).product();
            match grad {
                None => {}
                Some(Gradient::Dense(g)) => {
                    let values = g.flatten_all()?.to_vec1::<f32>()?;
                    pushes.push(PushedGradient {
                        variable: name.to_string(),
                        access: WeightAccess::Dense,
                        rows: variable.shape().first().copied().unwrap_or(1),
                        values: values.len(),
                    });
                    ctx.push_dense(name, values)?;
                }
                Some(Gradient::Rows { ids, values }) => {
                    let values = values.flatten_all()?.to_vec1::<f32>()?;
                    debug_assert_eq!(values.len(), ids.len() * row_len);
                    pushes.push(PushedGradient {
                        variable: name.to_string(),
                        access: WeightAccess::Rows,
                        rows: ids.len(),
                        values: values.len(),
                    });
                    ctx.push_rows(name, ids, values)?;
                }
            }
        }
        Ok(TrainReport {
            loss,
            examples,
            replicas,
            pushes,
        })
    }
}

impl<M: fmt::Debug> fmt::Debug for PsModel<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PsModel")
            .field("model", &self.model)
            .finish()
    }
}

/// The slices of `batch` for up to `replicas` local replicas: contiguous along the first
/// dimension, sizes differing by at most one, never empty. One slice (the batch as it is)
/// when there is one replica, fewer than two examples, or a tensor that cannot be split with
/// the others (a scalar, or first dimensions that differ).
fn split_batch(batch: &[Tensor], replicas: usize) -> Result<Vec<Vec<Tensor>>, StepError> {
    let examples = batch.first().and_then(|t| t.dims().first().copied());
    let splittable = examples.is_some_and(|n| {
        batch
            .iter()
            .all(|t| t.rank() > 0 && t.dims().first() == Some(&n))
    });
    if !splittable {
        return Ok(vec![batch.to_vec()]);
    }
    let ranges = super::replica_ranges(examples.unwrap_or(0), replicas);
    if ranges.len() == 1 {
        return Ok(vec![batch.to_vec()]);
    }
    ranges
        .into_iter()
        .map(|range| {
            batch
                .iter()
                .map(|t| Ok(t.narrow(0, range.start, range.len())?))
                .collect()
        })
        .collect()
}

/// Sums the replicas' gradients of each variable, in replica order (so the sum is the same on
/// every run): dense ones added, rows merged by id (a row two replicas touched gets the sum of
/// both, ids in ascending order). One replica's gradients are returned as they are.
fn sum_replica_gradients(
    variables: &[Variable],
    mut replicas: Vec<Vec<Option<Gradient>>>,
) -> Result<Vec<Option<Gradient>>, StepError> {
    if replicas.len() == 1 {
        return Ok(replicas.pop().unwrap_or_default());
    }
    let mut summed = Vec::with_capacity(variables.len());
    for (i, variable) in variables.iter().enumerate() {
        let parts: Vec<Gradient> = replicas
            .iter_mut()
            .filter_map(|grads| grads.get_mut(i).and_then(Option::take))
            .collect();
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            summed.push(None);
            continue;
        };
        let merged = match first {
            Gradient::Dense(mut total) => {
                for part in parts {
                    let Gradient::Dense(g) = part else {
                        return Err(mixed(variable));
                    };
                    total = (total + g)?;
                }
                Gradient::Dense(total)
            }
            Gradient::Rows { ids, values } => {
                let width: usize = variable.shape().iter().skip(1).product::<usize>().max(1);
                let mut rows: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
                let mut add = |ids: Vec<u64>, values: Tensor| -> Result<(), StepError> {
                    let values = values.flatten_all()?.to_vec1::<f32>()?;
                    for (id, row) in ids.into_iter().zip(values.chunks(width)) {
                        let sum = rows.entry(id).or_insert_with(|| vec![0.0; width]);
                        for (s, v) in sum.iter_mut().zip(row) {
                            *s += v;
                        }
                    }
                    Ok(())
                };
                add(ids, values)?;
                for part in parts {
                    let Gradient::Rows { ids, values } = part else {
                        return Err(mixed(variable));
                    };
                    add(ids, values)?;
                }
                let ids: Vec<u64> = rows.keys().copied().collect();
                let values: Vec<f32> = rows.into_values().flatten().collect();
                let values = Tensor::from_vec(values, (ids.len(), width), &Device::Cpu)?;
                Gradient::Rows { ids, values }
            }
        };
        summed.push(Some(merged));
    }
    Ok(summed)
}

fn mixed(variable: &Variable) -> StepError {
    StepError::Step(format!(
        "replicas disagree on how variable {:?} was read (dense on one, by rows on another)",
        variable.name()
    ))
}

/// Runs `compute` for each of `replicas` local replicas on scoped helper threads, each with a
/// tape whose source asks this thread, which holds the step context, for each pull; returns
/// their results in replica order (the first replica's error if any failed). The tape owns
/// its source (a tape has no lifetime), so the source is a channel to the context rather than
/// a borrow of it. A whole read of a variable in `prefetched` is answered from it (once per
/// replica); any other read is a pull.
fn with_ps_tapes<T: Send>(
    ctx: &StepContext<'_>,
    prefetched: HashMap<String, Vec<f32>>,
    replicas: usize,
    compute: impl Fn(usize, &GradientTape) -> Result<T, StepError> + Sync,
) -> Result<Vec<T>, StepError> {
    let replicas = replicas.max(1);
    // Each replica reads a prefetched variable once: copies for all but the last reader.
    let mut prefetched: HashMap<String, (Vec<f32>, usize)> = prefetched
        .into_iter()
        .map(|(name, values)| (name, (values, replicas)))
        .collect();
    std::thread::scope(|scope| {
        let (requests, served) = channel::<ReadRequest>();
        let compute = &compute;
        let helpers: Vec<_> = (0..replicas)
            .map(|replica| {
                let requests = requests.clone();
                scope.spawn(move || {
                    let source = ChannelSource {
                        requests: Mutex::new(requests),
                    };
                    let tape = GradientTape::with_source(Arc::new(source));
                    compute(replica, &tape)
                    // The tape, and with it this helper's sender, drops here.
                })
            })
            .collect();
        drop(requests);
        // Serve reads until every helper dropped its source (finished, failed or panicked).
        while let Ok(request) = served.recv() {
            let pulled = match &request.rows {
                None => match prefetched.get_mut(&request.variable) {
                    Some((values, readers)) if *readers > 1 => {
                        *readers -= 1;
                        Ok(values.clone())
                    }
                    Some(_) => Ok(prefetched
                        .remove(&request.variable)
                        .map(|(values, _)| values)
                        .unwrap_or_default()),
                    None => ctx.pull(&request.variable),
                },
                Some(ids) => ctx.pull_rows(&request.variable, ids),
            };
            // The helper may have gone (a panic); then nobody waits for this reply.
            let _ = request.reply.send(pulled.map_err(|e| e.to_string()));
        }
        helpers
            .into_iter()
            .map(|helper| match helper.join() {
                Ok(result) => result,
                Err(panic) => Err(StepError::Step(format!(
                    "model computation panicked: {}",
                    cohort_actors::panic_message(panic.as_ref())
                ))),
            })
            .collect()
    })
}

/// A read the helper thread asks the step thread for.
struct ReadRequest {
    variable: String,
    /// `None`: the whole variable; else these rows.
    rows: Option<Vec<u64>>,
    reply: SyncSender<Result<Vec<f32>, String>>,
}

/// The tape's source on the helper thread: each read is a request to the step thread.
struct ChannelSource {
    requests: Mutex<Sender<ReadRequest>>,
}

impl fmt::Debug for ChannelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChannelSource(parameter servers)")
    }
}

impl ChannelSource {
    fn ask(
        &self,
        variable: &Variable,
        rows: Option<Vec<u64>>,
        shape: &[usize],
    ) -> Result<Tensor, NnError> {
        let failed = |reason: String| NnError::Source {
            variable: variable.name().to_string(),
            reason,
        };
        let (reply, answer) = sync_channel(1);
        let request = ReadRequest {
            variable: variable.name().to_string(),
            rows,
            reply,
        };
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(request)
            .map_err(|_| failed("the step thread stopped serving reads".into()))?;
        // The step thread answers every request it receives; each pull is bounded by the
        // gateway's call timeout, so this wait is too.
        let values = answer
            .recv()
            .map_err(|_| failed("the step thread dropped the read".into()))?
            .map_err(failed)?;
        let expected: usize = shape.iter().product();
        if values.len() != expected {
            return Err(failed(format!(
                "pulled {} values for shape {shape:?}",
                values.len()
            )));
        }
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
    }
}

impl VariableSource for ChannelSource {
    fn read(&self, variable: &Variable) -> Result<Tensor, NnError> {
        self.ask(variable, None, variable.shape())
    }

    fn read_rows(&self, variable: &Variable, ids: &[u64]) -> Result<Tensor, NnError> {
        let width = variable.shape().get(1).copied().unwrap_or(1);
        self.ask(variable, Some(ids.to_vec()), &[ids.len(), width])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(values: &[f32]) -> Tensor {
        Tensor::from_vec(values.to_vec(), (values.len(), 1), &Device::Cpu).unwrap()
    }

    #[test]
    fn a_batch_splits_into_contiguous_slices_that_differ_by_at_most_one() {
        let x = column(&[0., 1., 2., 3., 4.]);
        let y = Tensor::from_vec(vec![0i64, 1, 2, 3, 4], 5, &Device::Cpu).unwrap();
        let slices = split_batch(&[x.clone(), y], 3).unwrap();
        let sizes: Vec<usize> = slices.iter().map(|s| s[0].dims()[0]).collect();
        assert_eq!(sizes, [2, 2, 1]);
        let firsts: Vec<f32> = slices
            .iter()
            .map(|s| s[0].flatten_all().unwrap().to_vec1::<f32>().unwrap()[0])
            .collect();
        assert_eq!(firsts, [0., 2., 4.]);
        assert_eq!(slices[2][1].to_vec1::<i64>().unwrap(), [4]);
        // More replicas than examples: one example each; one replica, or a batch that cannot
        // be split with its labels: the batch as it is.
        assert_eq!(split_batch(std::slice::from_ref(&x), 8).unwrap().len(), 5);
        assert_eq!(split_batch(std::slice::from_ref(&x), 1).unwrap().len(), 1);
        let other = column(&[1., 2.]);
        assert_eq!(split_batch(&[x, other], 2).unwrap().len(), 1);
        let scalar = Tensor::new(3f32, &Device::Cpu).unwrap();
        assert_eq!(split_batch(&[scalar], 2).unwrap().len(), 1);
    }

    #[test]
    fn replicas_gradients_sum_dense_and_merge_rows_by_id() {
        let zeros =
            |shape: &[usize]| Tensor::zeros(shape, candle_core::DType::F32, &Device::Cpu).unwrap();
        let dense = Variable::new("d", zeros(&[2])).unwrap();
        let table = Variable::new("t", zeros(&[10, 2])).unwrap();
        let rows = |ids: Vec<u64>, values: Vec<f32>| Gradient::Rows {
            values: Tensor::from_vec(values, (ids.len(), 2), &Device::Cpu).unwrap(),
            ids,
        };
        let dense_grad = |a: f32, b: f32| {
            Gradient::Dense(Tensor::from_vec(vec![a, b], 2, &Device::Cpu).unwrap())
        };
        let summed = sum_replica_gradients(
            &[dense.clone(), table.clone()],
            vec![
                vec![
                    Some(dense_grad(1., 2.)),
                    Some(rows(vec![7, 3], vec![1., 1., 2., 2.])),
                ],
                vec![
                    Some(dense_grad(10., 20.)),
                    Some(rows(vec![3], vec![5., 5.])),
                ],
            ],
        )
        .unwrap();
        let Some(Gradient::Dense(d)) = &summed[0] else {
            panic!("dense: {:?}", summed[0])
        };
        assert_eq!(d.to_vec1::<f32>().unwrap(), [11., 22.]);
        let Some(Gradient::Rows { ids, values }) = &summed[1] else {
            panic!("rows: {:?}", summed[1])
        };
        assert_eq!(ids, &[3, 7]);
        assert_eq!(
            values.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [7., 7., 1., 1.]
        );
        // A variable no replica touched has no gradient; dense on one replica and rows on
        // another is an error naming the variable.
        let none =
            sum_replica_gradients(std::slice::from_ref(&dense), vec![vec![None], vec![None]])
                .unwrap();
        assert!(none[0].is_none());
        let err = sum_replica_gradients(
            &[table],
            vec![
                vec![Some(dense_grad(1., 1.))],
                vec![Some(rows(vec![1], vec![1., 1.]))],
            ],
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"t\""), "{err}");
    }
}
