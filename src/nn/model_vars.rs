//! candle-nn's `VarBuilder` over cohort's variables: any model written for candle-nn builds
//! its weights as variables placed by a strategy.
//!
//! [`ModelVariables`] owns one model's variables, in creation order, keyed by candle-nn's
//! dotted names (`conv1.weight`, `norm.running_mean`). [`ModelVariables::var_builder`] gives a
//! `candle_nn::VarBuilder` for one copy of the model (a replica's): the first request of a name
//! creates the variable through the placement policy the set was made with (mirrored under
//! `Mirrored` and `MultiWorkerMirrored`, plain under the default strategy) and every request
//! hands out that copy's *live* tensor ([`Variable::live_component`]): the layer keeps it, and
//! every later update of the variable (an optimizer step, a restore, a state handover) is
//! written into it in place.
//!
//! Initial values are drawn here, not by candle's unseeded CPU RNG: each variable's from a
//! stream seeded by the set's seed and the variable's name, so every replica, worker and run
//! with the same seed starts from the same bits (DATA-1), whatever order the layers are built
//! in.
//!
//! Variables whose last name segment is one of [`STATISTICS`] (batch normalization's running
//! mean and variance) are not trained: they are aggregated with `MEAN` across replicas, as
//! TensorFlow aggregates a moving statistic.
//!
//! A model may also be built lazily, its layers asking for their variables on their first call
//! inside `run`: the first replica to ask for a name creates the variable (for all of this
//! process's replicas, by the strategy's policy) and the others get that one, so the replicas
//! never hold diverging copies of their own.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::NnError;
use crate::variable::{Variable, VariableAggregation, VariableBuilder, VariablePlacement};

/// Last name segments of variables that hold statistics, not trained weights (candle-nn's
/// batch normalization names them so).
pub const STATISTICS: &[&str] = &["running_mean", "running_var"];

/// One model's variables, created through candle-nn's `VarBuilder` (see the module doc).
/// Cheap to clone: clones share the set.
///
/// ```
/// use cohort::candle::{Device, Module, Tensor};
/// use cohort::candle_nn;
/// use cohort::nn::ModelVariables;
///
/// let vars = ModelVariables::new(7);
/// let layer = candle_nn::linear(3, 2, vars.var_builder(0).pp("dense"))?;
/// assert_eq!(vars.names(), ["dense.weight", "dense.bias"]);
/// // Updates reach the layer: it holds the variable's live storage.
/// let weight = vars.get("dense.weight").unwrap();
/// weight.assign(&Tensor::ones((2, 3), cohort::candle::DType::F32, &Device::Cpu)?)?;
/// vars.get("dense.bias").unwrap().assign(&Tensor::zeros(2, cohort::candle::DType::F32, &Device::Cpu)?)?;
/// let y = layer.forward(&Tensor::new(&[[1f32, 2., 3.]], &Device::Cpu)?)?;
/// assert_eq!(y.to_vec2::<f32>()?, [[6., 6.]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ModelVariables {
    inner: Arc<Inner>,
}

struct Inner {
    seed: u64,
    placement: Option<Arc<dyn VariablePlacement>>,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    variables: Vec<Variable>,
    by_name: HashMap<String, usize>,
}

impl ModelVariables {
    /// An empty set of plain variables (one copy each), initial values seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Self::build(seed, None)
    }

    /// An empty set whose variables `placement` places (a strategy's
    /// `variable_placement()`): one copy per local replica under a mirrored strategy.
    pub fn with_placement(seed: u64, placement: Arc<dyn VariablePlacement>) -> Self {
        Self::build(seed, Some(placement))
    }

    fn build(seed: u64, placement: Option<Arc<dyn VariablePlacement>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                seed,
                placement,
                registry: Mutex::new(Registry::default()),
            }),
        }
    }

    /// A `VarBuilder` (f32, CPU) for copy `component` of the model: replica `component`'s
    /// copies of mirrored variables, the only copy of others.
    pub fn var_builder(&self, component: usize) -> VarBuilder<'static> {
        let backend: Box<dyn SimpleBackend> = Box::new(Backend {
            vars: self.clone(),
            component,
        });
        VarBuilder::from_backend(backend, DType::F32, Device::Cpu)
    }

    /// Every variable, in creation order.
    pub fn variables(&self) -> Vec<Variable> {
        self.lock().variables.clone()
    }

    /// How many variables the model created so far.
    pub fn len(&self) -> usize {
        self.lock().variables.len()
    }

    /// Whether the model created no variable yet (a model built lazily, before its first
    /// call).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The variables optimizers train, in creation order.
    pub fn trainable_variables(&self) -> Vec<Variable> {
        self.lock()
            .variables
            .iter()
            .filter(|v| v.trainable())
            .cloned()
            .collect()
    }

    /// The variables that are not trained (statistics), in creation order.
    pub fn non_trainable_variables(&self) -> Vec<Variable> {
        self.lock()
            .variables
            .iter()
            .filter(|v| !v.trainable())
            .cloned()
            .collect()
    }

    /// The variable named `name`, if the model created it.
    pub fn get(&self, name: &str) -> Option<Variable> {
        let registry = self.lock();
        registry
            .by_name
            .get(name)
            .map(|&i| registry.variables[i].clone())
    }

    /// The variables' names, in creation order.
    pub fn names(&self) -> Vec<String> {
        self.lock()
            .variables
            .iter()
            .map(|v| v.name().to_owned())
            .collect()
    }

    /// The seed initial values are drawn from.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Which copy of `variable` component `component` of the model holds: its own for a
    /// mirrored variable, the single copy otherwise.
    pub fn component_of(variable: &Variable, component: usize) -> usize {
        if variable.is_mirrored() {
            component
        } else {
            0
        }
    }

    /// The variable `name`, created on its first request with `init`, checked on later ones.
    fn request(
        &self,
        name: &str,
        shape: &[usize],
        init: Init,
        dtype: DType,
    ) -> Result<Variable, NnError> {
        let mut registry = self.lock();
        if let Some(&i) = registry.by_name.get(name) {
            let existing = registry.variables[i].clone();
            if existing.shape() != shape || existing.dtype() != dtype {
                return Err(NnError::ModelMismatch {
                    variable: name.to_owned(),
                    reason: format!(
                        "asked for {dtype:?} of shape {shape:?}, but it was created as {:?} of shape {:?}",
                        existing.dtype(),
                        existing.shape()
                    ),
                });
            }
            return Ok(existing);
        }
        let seed = variable_seed(self.inner.seed, name);
        let statistic = is_statistic(name);
        let shape_owned = shape.to_vec();
        let mut builder = VariableBuilder::deferred(name, shape_owned, dtype, move |shape| {
            draw(init, shape, dtype, seed)
        })
        .trainable(!statistic);
        if statistic {
            builder = builder.aggregation(VariableAggregation::Mean);
        }
        if let Some(placement) = &self.inner.placement {
            builder = builder.placement(Arc::clone(placement));
        }
        let variable = builder.build()?;
        let index = registry.variables.len();
        registry.variables.push(variable.clone());
        registry.by_name.insert(name.to_owned(), index);
        Ok(variable)
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for ModelVariables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelVariables")
            .field("seed", &self.inner.seed)
            .field("variables", &self.names())
            .finish()
    }
}

/// Whether `name` (candle-nn's dotted path) names a statistic rather than a trained weight.
pub fn is_statistic(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    STATISTICS.contains(&last)
}

/// candle-nn's view of one copy of the model.
struct Backend {
    vars: ModelVariables,
    component: usize,
}

impl Backend {
    fn live(&self, variable: &Variable) -> candle_core::Result<Tensor> {
        variable
            .live_component(ModelVariables::component_of(variable, self.component))
            .map_err(|e| candle_core::Error::wrap(NnError::from(e)))
    }
}

impl SimpleBackend for Backend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        init: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if !dev.is_cpu() {
            return Err(candle_core::Error::wrap(NnError::Config {
                layer: name.to_owned(),
                reason: format!("cohort's variables live on the CPU; the model asked for {dev:?}"),
            }));
        }
        let variable = self
            .vars
            .request(name, shape.dims(), init, dtype)
            .map_err(candle_core::Error::wrap)?;
        self.live(&variable)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        _dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let variable = self.vars.get(name).ok_or_else(|| {
            candle_core::Error::wrap(NnError::ModelMismatch {
                variable: name.to_owned(),
                reason: "asked for without a shape, and no layer created it".to_owned(),
            })
        })?;
        if variable.dtype() != dtype {
            return Err(candle_core::Error::wrap(NnError::ModelMismatch {
                variable: name.to_owned(),
                reason: format!("asked for as {dtype:?}, it is {:?}", variable.dtype()),
            }));
        }
        self.live(&variable)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.vars.get(name).is_some()
    }
}

/// A stream seed for one variable: the set's seed mixed with the name (FNV-1a), so that a
/// variable's initial value does not depend on the order layers are built in.
fn variable_seed(seed: u64, name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Draws `init` for `shape` from a ChaCha stream seeded with `seed`, as `dtype`.
fn draw(init: Init, shape: &[usize], dtype: DType, seed: u64) -> candle_core::Result<Tensor> {
    let len: usize = shape.iter().product();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f32> = match init {
        Init::Const(c) => vec![c as f32; len],
        Init::Uniform { lo, up } => uniform(&mut rng, len, lo, up),
        Init::Randn { mean, stdev } => normal(&mut rng, len, mean, stdev),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let fan = fan.for_shape(&Shape::from(shape)).max(1);
            let std = non_linearity.gain() / (fan as f64).sqrt();
            match dist {
                candle_nn::init::NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    uniform(&mut rng, len, -bound, bound)
                }
                candle_nn::init::NormalOrUniform::Normal => normal(&mut rng, len, 0.0, std),
            }
        }
    };
    Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)
}

fn uniform(rng: &mut ChaCha8Rng, len: usize, lo: f64, up: f64) -> Vec<f32> {
    (0..len)
        .map(|_| (lo + (up - lo) * rng.gen::<f64>()) as f32)
        .collect()
}

/// Box–Muller, written out so that the stream depends only on `rand_chacha`'s.
fn normal(rng: &mut ChaCha8Rng, len: usize, mean: f64, stdev: f64) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
            let u2: f64 = rng.gen();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (mean + stdev * z) as f32
        })
        .collect()
}
