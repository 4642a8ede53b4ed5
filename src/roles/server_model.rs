//! A candle-nn model (built from a `VarBuilder`) trained on the parameter servers: the same
//! model function that trains under `Mirrored` or `MultiWorkerMirrored` with
//! [`crate::train::ReplicatedModel`] trains under `ParameterServerStrategy`.
//!
//! This module owns [`ServerModel`]: on the chief it creates the model's variables on the
//! servers, each from the value [`ModelVariables`] draws for it (seeded by the seed and the
//! variable's name, so a job starts from the same weights under every strategy); on a worker
//! it builds the model over tensors that hold the servers' values for one step, differentiates
//! the batch's mean loss over the worker's local replicas and records one push per variable.
//! The pushes go when the step returns `Ok`, as every step's (PS-1), and the servers apply the
//! program's optimizer.
//!
//! A table the model reads by rows (candle-nn's `Embedding`) is read by rows when the step names
//! it with the batch's ids ([`ServerModel::build_reading_rows`]): only the batch's distinct rows
//! are pulled, the model gets a compact table of them (and the ids renumbered into it), and
//! the rows' gradients are pushed as rows. Every other variable is pulled and pushed whole.
//! Batch normalization's statistics cannot be kept on the servers (a server applies
//! gradients, and statistics are not trained): a model with them is refused on the chief,
//! naming them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::nn::{is_statistic, with_step_randomness, ModelVariables, NnError, StepRandomness};
use crate::roles::coordinator::{
    ClusterCoordinator, CoordinatorError, VariableProblem, VariableSpec,
};
use crate::roles::worker::{StepContext, StepError};
use crate::variable::Partitioner;

/// A candle-nn model whose variables live on the parameter servers, as one step of a worker
/// sees it (see the module docs).
///
/// Calling protocol:
/// 1. **Chief**, once, before scheduling steps: [`ServerModel::create_variables`] with the
///    seed and the model function (and a partitioner per variable, e.g. for a large table).
/// 2. **Worker**, in a registered step: [`ServerModel::build`] with the same model function
///    (it pulls the model's variables in one request per server), then
///    [`ServerModel::train_step`] with the batch and the per-example loss. Build in every step:
///    the values are the servers' as of that step.
///
/// ```no_run
/// use cohort::candle::{Module, Tensor};
/// use cohort::candle_nn::{self, Linear, VarBuilder};
/// use cohort::program::{Program, ServerModel, Step, StepContext, StepError};
///
/// fn model(vb: VarBuilder) -> cohort::candle::Result<Linear> {
///     candle_nn::linear(4, 1, vb.pp("out"))
/// }
///
/// static TRAIN: Step<(Vec<f32>, Vec<f32>), f32> = Step::new("train");
///
/// let program = Program::new("candle-ps")
///     .step(&TRAIN, |ctx: &mut StepContext<'_>, (x, y): (Vec<f32>, Vec<f32>)| {
///         let rows = y.len();
///         let x = Tensor::from_vec(x, (rows, 4), &cohort::candle::Device::Cpu)?;
///         let y = Tensor::from_vec(y, (rows, 1), &cohort::candle::Device::Cpu)?;
///         let model = ServerModel::build(ctx, model)?;
///         let report = model.train_step(ctx, &[x, y], 7, |linear, batch| {
///             (linear.forward(&batch[0])? - &batch[1])?.sqr()?.flatten_all()
///         })?;
///         Ok::<_, StepError>(report.loss)
///     })
///     .chief(|coordinator| {
///         ServerModel::create_variables(coordinator, 7, model, |_, _| None)?;
///         let batch = (vec![1.0; 8], vec![2.0; 2]);
///         for _ in 0..100 {
///             coordinator.schedule(&TRAIN, batch.clone())?;
///         }
///         coordinator.join()
///     });
/// std::process::exit(cohort::program::main(program));
/// ```
pub struct ServerModel<M> {
    model: M,
    /// The variables the model asked for, in the order it asked, with the tensors it holds.
    variables: Vec<(String, Var)>,
    /// The tables read by rows: each one's distinct ids, ascending (its tensor holds those
    /// rows in that order).
    rows: HashMap<String, Vec<u64>>,
}

/// A table a step's model reads by rows, and the ids the step's batch reads from it (any
/// shape, integer type).
#[derive(Debug, Clone, Copy)]
pub struct RowRead<'a> {
    /// The table's variable (candle-nn's dotted name, e.g. `embedding.weight`).
    pub variable: &'a str,
    /// The ids the batch reads.
    pub ids: &'a Tensor,
}

/// What one [`ServerModel::train_step`] did.
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

/// How a step reads a variable, and so what its gradient looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightAccess {
    /// Whole (kernels, biases): the gradient is dense.
    #[default]
    Dense,
    /// By rows (embedding tables): a step needs only its batch's rows and its gradient is
    /// row-sparse.
    Rows,
}

impl ServerModel<()> {
    /// Creates the variables of the model `build` makes on the parameter servers (chief
    /// side), in the order the model creates them, each from the value [`ModelVariables`]
    /// draws for it with `seed` and split by `partitioner(name, shape)` (None: whole,
    /// round-robin). Returns their names. A model with batch-normalization statistics is
    /// refused, naming them (see the module docs).
    pub fn create_variables<M>(
        coordinator: &mut ClusterCoordinator,
        seed: u64,
        build: impl FnOnce(VarBuilder<'static>) -> candle_core::Result<M>,
        partitioner: impl Fn(&str, &[usize]) -> Option<Partitioner>,
    ) -> Result<Vec<String>, CoordinatorError> {
        let vars = ModelVariables::new(seed);
        build(vars.var_builder(0)).map_err(CoordinatorError::Model)?;
        let variables = vars.variables();
        // Every variable checked before any is created: a refused model leaves no trace.
        for variable in &variables {
            let name = variable.name();
            if is_statistic(name) {
                return Err(CoordinatorError::Variable {
                    name: name.to_string(),
                    problem: VariableProblem::Statistic,
                });
            }
            if variable.dtype() != DType::F32 {
                return Err(CoordinatorError::Variable {
                    name: name.to_string(),
                    problem: VariableProblem::NotF32(variable.dtype()),
                });
            }
        }
        let mut names = Vec::new();
        for variable in variables {
            let name = variable.name().to_string();
            let values = variable
                .read_value()
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| CoordinatorError::Variable {
                    name: name.clone(),
                    problem: VariableProblem::InitialValue(Box::new(e)),
                })?;
            let shape = variable.shape().to_vec();
            let mut spec = VariableSpec::from_values(&name, shape.clone(), values);
            spec.partitioner = partitioner(&name, &shape);
            coordinator.create_variable(spec)?;
            names.push(name);
        }
        Ok(names)
    }
}

impl<M> ServerModel<M> {
    /// Builds the model on a worker with `build` (the chief's model function) over the
    /// servers' values: every variable it asks for must be one the chief created, with the
    /// same shape (an error names the variable otherwise); the values are pulled in one
    /// request per server.
    pub fn build(
        ctx: &StepContext<'_>,
        build: impl FnOnce(VarBuilder<'static>) -> candle_core::Result<M>,
    ) -> Result<Self, StepError> {
        Ok(Self::build_reading_rows(ctx, build, &[])?.0)
    }

    /// As [`Self::build`], with the tables of `rows` read by rows: each gets only the batch's
    /// distinct rows (pulled by id), as a compact table the model indexes with the renumbered
    /// ids returned here (one tensor per entry of `rows`, the shape of its ids, `u32`): pass
    /// those to the model in place of the ids. [`Self::train_step`] pushes those tables' rows.
    /// An id past a table's end is refused, naming the table.
    pub fn build_reading_rows(
        ctx: &StepContext<'_>,
        build: impl FnOnce(VarBuilder<'static>) -> candle_core::Result<M>,
        rows: &[RowRead<'_>],
    ) -> Result<(Self, Vec<Tensor>), StepError> {
        let layouts: HashMap<String, Vec<usize>> = ctx
            .layouts()
            .map(|l| (l.name.clone(), l.shape.clone()))
            .collect();
        let mut distinct = HashMap::new();
        let mut renumbered = Vec::with_capacity(rows.len());
        for read in rows {
            let table_rows = layouts
                .get(read.variable)
                .and_then(|shape| (shape.len() == 2).then_some(shape[0]))
                .ok_or_else(|| {
                    StepError::Step(format!(
                        "variable {:?} is read by rows, but the parameter servers hold no table (2-D variable) of that name",
                        read.variable
                    ))
                })?;
            let ids = read
                .ids
                .flatten_all()?
                .to_dtype(DType::I64)?
                .to_vec1::<i64>()?;
            if let Some(bad) = ids.iter().find(|id| !(0..table_rows as i64).contains(*id)) {
                return Err(StepError::Step(format!(
                    "variable {:?}: the batch reads row {bad}, but the table has rows 0 to {}",
                    read.variable,
                    table_rows.saturating_sub(1)
                )));
            }
            // In range, so not negative.
            let ids: Vec<u64> = ids.into_iter().map(|id| id as u64).collect();
            let mut unique = ids.clone();
            unique.sort_unstable();
            unique.dedup();
            let position: Vec<u32> = ids
                .iter()
                .map(|id| unique.binary_search(id).unwrap_or(0) as u32)
                .collect();
            renumbered.push(Tensor::from_vec(position, read.ids.shape(), &Device::Cpu)?);
            distinct.insert(read.variable.to_string(), unique);
        }
        let backend = Arc::new(PulledBackend {
            layouts,
            rows: distinct
                .iter()
                .map(|(name, ids)| (name.clone(), ids.len()))
                .collect(),
            asked: Mutex::new(Vec::new()),
        });
        let vb = VarBuilder::from_backend(
            Box::new(SharedBackend(Arc::clone(&backend))),
            DType::F32,
            Device::Cpu,
        );
        let model = build(vb).map_err(|e| StepError::Step(format!("building the model: {e}")))?;
        let variables = std::mem::take(&mut *lock(&backend.asked));
        let set = |name: &str, var: &Var, values: Vec<f32>| -> Result<(), StepError> {
            let value = Tensor::from_vec(values, var.shape(), &Device::Cpu)?;
            var.set(&value)
                .map_err(|e| StepError::Step(format!("variable {name:?}: {e}")))
        };
        let whole: Vec<&(String, Var)> = variables
            .iter()
            .filter(|(name, _)| !distinct.contains_key(name))
            .collect();
        let names: Vec<&str> = whole.iter().map(|(n, _)| n.as_str()).collect();
        for ((name, var), values) in whole.iter().zip(ctx.pull_many(&names)?) {
            set(name, var, values)?;
        }
        for (name, var) in variables.iter().filter(|(n, _)| distinct.contains_key(n)) {
            set(name, var, ctx.pull_rows(name, &distinct[name])?)?;
        }
        distinct.retain(|name, _| variables.iter().any(|(n, _)| n == name));
        Ok((
            Self {
                model,
                variables,
                rows: distinct,
            },
            renumbered,
        ))
    }

    /// The model, holding this step's values.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The names of the variables the model holds, in the order it asked for them.
    pub fn variable_names(&self) -> Vec<&str> {
        self.variables.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// One training step on `batch`: the batch is split over the worker's local replicas
    /// (contiguous slices along the first dimension), each replica computes `per_example_loss`
    /// of its slice under its step randomness (seeded by `seed`, the closure and the replica,
    /// for [`crate::nn::Dropout`]) and differentiates its share of the batch's mean loss; the
    /// replicas' gradients are summed in replica order and recorded as one push per variable.
    pub fn train_step(
        &self,
        ctx: &mut StepContext<'_>,
        batch: &[Tensor],
        seed: u64,
        per_example_loss: impl Fn(&M, &[Tensor]) -> candle_core::Result<Tensor> + Sync,
    ) -> Result<TrainReport, StepError>
    where
        M: Sync,
    {
        let examples = batch
            .first()
            .and_then(|t| t.dims().first().copied())
            .ok_or_else(|| StepError::Step("an empty batch, or a scalar first tensor".into()))?;
        if let Some(other) = batch.iter().find(|t| t.dims().first() != Some(&examples)) {
            return Err(StepError::Step(format!(
                "the batch's tensors differ in their first dimension: {examples} and {:?}",
                other.dims()
            )));
        }
        // Each update of a closure of several steps draws its own randomness; a closure's
        // first (or only) update draws the closure's.
        let step = ctx.closure_id() ^ (u64::from(ctx.update_part()) << 40);
        let vars: Vec<&Var> = self.variables.iter().map(|(_, v)| v).collect();
        let ranges = crate::roles::worker::replica_ranges(examples, ctx.replicas());
        let per_replica = ctx.on_replicas(examples, |range| {
            let replica = ranges.iter().position(|r| *r == range).unwrap_or(0) as u64;
            let slice = batch
                .iter()
                .map(|t| t.narrow(0, range.start, range.len()))
                .collect::<candle_core::Result<Vec<_>>>()?;
            let randomness = StepRandomness {
                seed,
                step,
                replica,
            };
            with_step_randomness(randomness, || {
                let per_example = per_example_loss(&self.model, &slice)
                    .map_err(|e| StepError::Step(format!("loss: {e}")))?;
                let loss = (per_example.sum_all()? / examples.max(1) as f64)?;
                let grads = loss.backward()?;
                let grads = vars
                    .iter()
                    .map(|var| grads.get(var.as_tensor()).cloned())
                    .collect::<Vec<_>>();
                Ok((loss.to_scalar::<f32>()?, grads))
            })
        })?;
        let replicas = per_replica.len();
        let loss = per_replica.iter().map(|(_, (loss, _))| loss).sum();
        let mut summed: Vec<Option<Tensor>> = vec![None; vars.len()];
        for (_, (_, grads)) in per_replica {
            for (total, grad) in summed.iter_mut().zip(grads) {
                *total = match (total.take(), grad) {
                    (Some(a), Some(b)) => Some((a + b)?),
                    (a, b) => a.or(b),
                };
            }
        }
        let mut pushes = Vec::with_capacity(vars.len());
        for ((name, var), grad) in self.variables.iter().zip(summed) {
            let Some(grad) = grad else {
                tracing::debug!("variable {name:?} got no gradient in closure {step}");
                continue;
            };
            let values = grad.flatten_all()?.to_vec1::<f32>()?;
            let (access, rows) = match self.rows.get(name) {
                Some(ids) => (WeightAccess::Rows, ids.len()),
                None => (
                    WeightAccess::Dense,
                    var.dims().first().copied().unwrap_or(1),
                ),
            };
            pushes.push(PushedGradient {
                variable: name.clone(),
                access,
                rows,
                values: values.len(),
            });
            match self.rows.get(name) {
                Some(ids) => ctx.push_rows(name, ids.clone(), values)?,
                None => ctx.push_dense(name, values)?,
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

impl<M: fmt::Debug> fmt::Debug for ServerModel<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerModel")
            .field("model", &self.model)
            .field("variables", &self.variable_names())
            .finish()
    }
}

/// candle-nn's view of the servers' variables for one step: each name the model asks for
/// gets a tensor of the layout's shape, filled by the pull after the build.
struct PulledBackend {
    /// Every variable on the servers: its name and full shape.
    layouts: HashMap<String, Vec<usize>>,
    /// The tables read by rows, with how many distinct rows this step reads of each.
    rows: HashMap<String, usize>,
    /// What the model asked for, in order.
    asked: Mutex<Vec<(String, Var)>>,
}

/// The backend handed to candle-nn (it takes ownership; the build reads what it recorded).
struct SharedBackend(Arc<PulledBackend>);

impl PulledBackend {
    fn var(
        &self,
        name: &str,
        shape: Option<&[usize]>,
        dtype: DType,
    ) -> candle_core::Result<Tensor> {
        let mismatch = |reason: String| {
            candle_core::Error::wrap(NnError::ModelMismatch {
                variable: name.to_owned(),
                reason,
            })
        };
        let on_servers = self.layouts.get(name).ok_or_else(|| {
            mismatch("the model asks for it, but the chief did not create it on the parameter servers (ServerModel::create_variables with the same model function)".into())
        })?;
        if let Some(shape) = shape.filter(|s| *s != on_servers.as_slice()) {
            return Err(mismatch(format!(
                "the model asks for shape {shape:?}, the parameter servers hold {on_servers:?}"
            )));
        }
        if dtype != DType::F32 {
            return Err(mismatch(format!(
                "the model asks for {dtype:?}; the parameter servers hold f32"
            )));
        }
        let mut asked = lock(&self.asked);
        if let Some((_, var)) = asked.iter().find(|(n, _)| n == name) {
            return Ok(var.as_tensor().clone());
        }
        // A table read by rows holds only the step's rows (the model indexes it with the
        // renumbered ids); candle-nn does not check a tensor's shape against the one it asked.
        let mut shape = on_servers.clone();
        if let Some(rows) = self.rows.get(name) {
            shape[0] = *rows;
        }
        let var = Var::zeros(shape.as_slice(), DType::F32, &Device::Cpu)?;
        asked.push((name.to_owned(), var.clone()));
        Ok(var.as_tensor().clone())
    }
}

impl SimpleBackend for SharedBackend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _init: Init,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        self.0.var(name, Some(shape.dims()), dtype)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        self.0.var(name, None, dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.layouts.contains_key(name)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The layouts a step sees, by name (for tests of the backend).
#[cfg(test)]
fn shapes(layouts: &[crate::layout::Layout]) -> HashMap<String, Vec<usize>> {
    layouts
        .iter()
        .map(|l| (l.name.clone(), l.shape.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Dtype, Layout};
    use crate::variable::PsPlacer;

    fn backend(vars: &[(&str, &[usize])]) -> Arc<PulledBackend> {
        let mut placer = PsPlacer::new(2, None);
        let layouts: Vec<Layout> = vars
            .iter()
            .map(|(name, shape)| placer.place(name, shape, Dtype::F32).unwrap())
            .collect();
        Arc::new(PulledBackend {
            layouts: shapes(&layouts),
            rows: HashMap::new(),
            asked: Mutex::new(Vec::new()),
        })
    }

    #[test]
    fn the_model_gets_one_tensor_per_name_and_a_missing_or_reshaped_variable_is_named() {
        let backend = backend(&[("out.weight", &[1, 4]), ("out.bias", &[1])]);
        let vb = VarBuilder::from_backend(
            Box::new(SharedBackend(Arc::clone(&backend))),
            DType::F32,
            Device::Cpu,
        );
        candle_nn::linear(4, 1, vb.pp("out")).unwrap();
        candle_nn::linear(4, 1, vb.pp("out")).unwrap();
        let asked: Vec<String> = lock(&backend.asked)
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        assert_eq!(asked, ["out.weight", "out.bias"]);

        let reshaped = candle_nn::linear(3, 1, vb.pp("out"))
            .unwrap_err()
            .to_string();
        assert!(
            reshaped.contains("out.weight") && reshaped.contains("[1, 3]"),
            "{reshaped}"
        );
        let missing = candle_nn::linear(4, 1, vb.pp("head"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("head.weight") && missing.contains("did not create"),
            "{missing}"
        );
    }
}
