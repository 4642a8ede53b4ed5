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
/// use cohort::program::{CoordinatorError, Program, PsModel, StepContext};
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
/// let program = Program::new("bridge")
///     .step("train", |ctx: &mut StepContext<'_>, _args: &[u8]| {
///         let model = PsModel::build(ctx, model)?;
///         let x = Tensor::new(&[[1f32, 2.], [-1., -2.]], &candle_core::Device::Cpu)?;
///         let y = Tensor::new(&[[1f32], [0.]], &candle_core::Device::Cpu)?;
///         let report = model.train_step(ctx, &[x, y])?;
///         Ok(report.loss.to_le_bytes().to_vec())
///     })
///     .chief(|coordinator| {
///         let declared = declare(model).map_err(|e| CoordinatorError::Other(e.to_string()))?;
///         PsModel::create_variables(coordinator, &declared.network().weight_specs(), |_| None)?;
///         for _ in 0..100 {
///             coordinator.schedule("train", Vec::new())?;
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
        with_ps_tape(ctx, HashMap::new(), |tape| Ok(f(tape, &self.model)?))
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
        let (loss, examples, grads) = with_ps_tape(ctx, prefetched, |tape| {
            let per_example = self
                .model
                .per_example_loss(tape, batch)
                .map_err(|e| StepError::Step(format!("loss: {e}")))?;
            let examples = per_example.dims().first().copied().unwrap_or(1);
            // The batch's mean: a zero-example batch gives zero, not 0/0.
            let mut loss = (per_example.sum_all()? / examples.max(1) as f64)?;
            let regularization = self
                .model
                .regularization_losses(tape)
                .map_err(|e| StepError::Step(format!("regularization losses: {e}")))?;
            for r in regularization {
                loss = (loss + r)?;
            }
            let grads = tape.sparse_gradient(&loss, &variables)?;
            Ok((loss.to_scalar::<f32>()?, examples, grads))
        })?;
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

/// Runs `compute` on a scoped helper thread with a tape whose source asks this thread, which
/// holds the step context, for each pull. The tape owns its source (a tape has no lifetime),
/// so the source is a channel to the context rather than a borrow of it. A whole read of a
/// variable in `prefetched` is answered from it (once); any other read is a pull.
fn with_ps_tape<T: Send>(
    ctx: &StepContext<'_>,
    mut prefetched: HashMap<String, Vec<f32>>,
    compute: impl FnOnce(&GradientTape) -> Result<T, StepError> + Send,
) -> Result<T, StepError> {
    std::thread::scope(|scope| {
        let (requests, served) = channel::<ReadRequest>();
        let helper = scope.spawn(move || {
            let source = ChannelSource {
                requests: Mutex::new(requests),
            };
            let tape = GradientTape::with_source(Arc::new(source));
            compute(&tape)
            // The tape, and with it the last sender, drops here: the serving loop ends.
        });
        // Serve reads until the helper drops its source (finished, failed or panicked).
        while let Ok(request) = served.recv() {
            let pulled = match &request.rows {
                None => match prefetched.remove(&request.variable) {
                    Some(values) => Ok(values),
                    None => ctx.pull(&request.variable),
                },
                Some(ids) => ctx.pull_rows(&request.variable, ids),
            };
            // The helper may have gone (a panic); then nobody waits for this reply.
            let _ = request.reply.send(pulled.map_err(|e| e.to_string()));
        }
        match helper.join() {
            Ok(result) => result,
            Err(panic) => Err(StepError::Step(format!(
                "model computation panicked: {}",
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into())
            ))),
        }
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
