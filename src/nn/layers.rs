//! Layers that own their variables: `Dense`, `Embedding`, and `Sequential` stacks of them.

use std::fmt;

use candle_core::{DType, Tensor};

use super::{dense_kernel, GradientTape, Initializer, NnError, WeightSpec};
use crate::variable::Variable;

/// A differentiable function with trainable variables (Keras' `Layer`).
pub trait Layer: Send + Sync + fmt::Debug {
    /// The layer's name (a prefix of its variables' names).
    fn name(&self) -> &str;

    /// Applies the layer to a batch, reading variables through `tape`.
    fn forward(&self, tape: &GradientTape, input: &Tensor) -> Result<Tensor, NnError>;

    /// The variables an optimizer trains, in a fixed order.
    fn trainable_variables(&self) -> Vec<Variable>;

    /// What the layer declares about each of its variables (names, shapes, initializers, how
    /// it reads them), in the order of [`Layer::trainable_variables`] for the trainable ones:
    /// what a parameter-server chief creates them from.
    fn weight_specs(&self) -> Vec<WeightSpec>;

    /// Regularization losses (unscaled, Keras' `layer.losses`), read through `tape`.
    fn regularization_losses(&self, _tape: &GradientTape) -> Result<Vec<Tensor>, NnError> {
        Ok(Vec::new())
    }
}

/// An element-wise (or last-axis) function applied after a layer's affine map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// Identity (logits).
    #[default]
    Linear,
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Softmax over the last axis.
    Softmax,
}

impl Activation {
    /// Applies the activation.
    pub fn apply(self, x: &Tensor) -> Result<Tensor, NnError> {
        Ok(match self {
            Activation::Linear => x.clone(),
            Activation::Relu => x.relu()?,
            Activation::Sigmoid => candle_nn::ops::sigmoid(x)?,
            Activation::Tanh => x.tanh()?,
            Activation::Softmax => candle_nn::ops::softmax_last_dim(x)?,
        })
    }
}

/// A densely connected layer: `activation(x · kernel + bias)` with `kernel` of shape
/// `[input_dim, units]` and `bias` of shape `[units]` (Keras' `Dense`).
///
/// Its variables are `{name}/kernel` and `{name}/bias`, created when the layer is built (so
/// under a strategy's scope they are that strategy's variables, and on a parameter-server
/// worker they are the servers' variables, read through the worker's bridge).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use cohort::nn::{Dense, GradientTape, Initializer, Layer};
///
/// let dense = Dense::builder("d", 2, 1)
///     .kernel_initializer(Initializer::Constant(1.0))
///     .kernel_l2(0.5)
///     .build()?;
/// let tape = GradientTape::new();
/// let y = dense.forward(&tape, &Tensor::new(&[[1f32, 2.]], &Device::Cpu)?)?;
/// assert_eq!(y.to_vec2::<f32>()?, [[3.0]]);
/// // L2: 0.5 * (1² + 1²)
/// let reg = dense.regularization_losses(&tape)?;
/// assert_eq!(reg[0].to_scalar::<f32>()?, 1.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Dense {
    name: String,
    specs: Vec<WeightSpec>,
    kernel: Variable,
    bias: Option<Variable>,
    activation: Activation,
    kernel_l2: Option<f32>,
}

/// Options of a [`Dense`] layer; [`DenseBuilder::build`] creates its variables.
#[derive(Debug, Clone)]
pub struct DenseBuilder {
    name: String,
    input_dim: usize,
    units: usize,
    activation: Activation,
    use_bias: bool,
    kernel_initializer: Initializer,
    bias_initializer: Initializer,
    kernel_l2: Option<f32>,
}

impl Dense {
    /// A builder for a layer named `name` mapping `input_dim` features to `units` outputs,
    /// with Keras' defaults: linear activation, a bias, Glorot-uniform kernel (seed 0), zero
    /// bias, no regularizer.
    pub fn builder(name: impl Into<String>, input_dim: usize, units: usize) -> DenseBuilder {
        DenseBuilder {
            name: name.into(),
            input_dim,
            units,
            activation: Activation::Linear,
            use_bias: true,
            kernel_initializer: Initializer::GlorotUniform { seed: 0 },
            bias_initializer: Initializer::Zeros,
            kernel_l2: None,
        }
    }

    /// The kernel variable, `[input_dim, units]`.
    pub fn kernel(&self) -> &Variable {
        &self.kernel
    }

    /// The bias variable, `[units]`, if the layer has one.
    pub fn bias(&self) -> Option<&Variable> {
        self.bias.as_ref()
    }

    /// The L2 factor on the kernel, if regularized.
    pub fn kernel_l2(&self) -> Option<f32> {
        self.kernel_l2
    }
}

impl Layer for Dense {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, tape: &GradientTape, input: &Tensor) -> Result<Tensor, NnError> {
        let in_dim = self.kernel.shape()[0];
        if input.rank() != 2 || input.dims()[1] != in_dim {
            return Err(NnError::InputShape {
                layer: self.name.clone(),
                expected: format!("[batch, {in_dim}]"),
                got: input.dims().to_vec(),
            });
        }
        let x = input.to_dtype(DType::F32)?;
        let kernel = tape.read(&self.kernel)?;
        let bias = match &self.bias {
            Some(bias) => Some(tape.read(bias)?),
            None => None,
        };
        dense_kernel::affine(&x, &kernel, bias.as_ref(), self.activation)
    }

    fn trainable_variables(&self) -> Vec<Variable> {
        let mut vars = vec![self.kernel.clone()];
        vars.extend(self.bias.clone());
        vars.retain(Variable::trainable);
        vars
    }

    fn weight_specs(&self) -> Vec<WeightSpec> {
        self.specs.clone()
    }

    fn regularization_losses(&self, tape: &GradientTape) -> Result<Vec<Tensor>, NnError> {
        match self.kernel_l2 {
            Some(factor) => {
                let kernel = tape.read(&self.kernel)?;
                Ok(vec![(kernel.sqr()?.sum_all()? * f64::from(factor))?])
            }
            None => Ok(Vec::new()),
        }
    }
}

impl DenseBuilder {
    /// The activation (default linear).
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Whether to add a bias (default true).
    pub fn use_bias(mut self, use_bias: bool) -> Self {
        self.use_bias = use_bias;
        self
    }

    /// The kernel's initializer (default Glorot uniform, seed 0).
    pub fn kernel_initializer(mut self, init: Initializer) -> Self {
        self.kernel_initializer = init;
        self
    }

    /// The bias's initializer (default zeros).
    pub fn bias_initializer(mut self, init: Initializer) -> Self {
        self.bias_initializer = init;
        self
    }

    /// An L2 regularizer on the kernel: `factor * sum(kernel²)` (Keras' `L2(factor)`).
    pub fn kernel_l2(mut self, factor: f32) -> Self {
        self.kernel_l2 = Some(factor);
        self
    }

    /// Creates the layer's variables (under the active strategy scope, if any).
    pub fn build(self) -> Result<Dense, NnError> {
        let config = |reason: String| NnError::Config {
            layer: self.name.clone(),
            reason,
        };
        if self.input_dim == 0 || self.units == 0 {
            return Err(config(format!(
                "input_dim ({}) and units ({}) must be positive",
                self.input_dim, self.units
            )));
        }
        if let Some(f) = self.kernel_l2 {
            if !(f.is_finite() && f >= 0.0) {
                return Err(config(format!("L2 factor {f} must be finite and >= 0")));
            }
        }
        let mut specs = vec![WeightSpec::new(
            format!("{}/kernel", self.name),
            vec![self.input_dim, self.units],
            self.kernel_initializer,
        )];
        if self.use_bias {
            specs.push(WeightSpec::new(
                format!("{}/bias", self.name),
                vec![self.units],
                self.bias_initializer,
            ));
        }
        let kernel = specs[0].create()?;
        let bias = match specs.get(1) {
            Some(spec) => Some(spec.create()?),
            None => None,
        };
        Ok(Dense {
            name: self.name,
            specs,
            kernel,
            bias,
            activation: self.activation,
            kernel_l2: self.kernel_l2,
        })
    }
}

/// A lookup table of `input_dim` rows of `output_dim` values (Keras' `Embedding`): integer ids
/// of any shape `S` give rows of shape `S + [output_dim]`.
///
/// Its variable is `{name}/embeddings`, initialized uniform in `±0.05` as in Keras. It reads
/// the table by rows ([`GradientTape::read_rows`]): on a parameter-server worker only the
/// batch's rows are fetched and the gradient pushed is row-sparse.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use cohort::nn::{Embedding, GradientTape, Initializer, Layer};
///
/// let emb = Embedding::new("emb", 10, 4, Initializer::Constant(0.25))?;
/// let ids = Tensor::new(&[[1i64, 2, 3], [4, 5, 9]], &Device::Cpu)?;
/// let rows = emb.forward(&GradientTape::new(), &ids)?;
/// assert_eq!(rows.dims(), &[2, 3, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Embedding {
    name: String,
    spec: WeightSpec,
    table: Variable,
}

impl Embedding {
    /// Creates the table variable (under the active strategy scope, if any).
    pub fn new(
        name: impl Into<String>,
        input_dim: usize,
        output_dim: usize,
        init: Initializer,
    ) -> Result<Self, NnError> {
        let name = name.into();
        if input_dim == 0 || output_dim == 0 || input_dim > u32::MAX as usize {
            return Err(NnError::Config {
                layer: name,
                reason: format!(
                    "input_dim ({input_dim}) must be in 1..=2^32-1 and output_dim ({output_dim}) positive"
                ),
            });
        }
        let spec = WeightSpec::new(
            format!("{name}/embeddings"),
            vec![input_dim, output_dim],
            init,
        )
        .by_rows();
        let table = spec.create()?;
        Ok(Self { name, spec, table })
    }

    /// With Keras' default initializer (uniform in `±0.05`) seeded by `seed`.
    pub fn with_seed(
        name: impl Into<String>,
        input_dim: usize,
        output_dim: usize,
        seed: u64,
    ) -> Result<Self, NnError> {
        let init = Initializer::RandomUniform {
            min: -0.05,
            max: 0.05,
            seed,
        };
        Self::new(name, input_dim, output_dim, init)
    }

    /// The table variable, `[input_dim, output_dim]`.
    pub fn table(&self) -> &Variable {
        &self.table
    }

    /// Number of rows.
    pub fn input_dim(&self) -> usize {
        self.table.shape()[0]
    }

    /// Width of a row.
    pub fn output_dim(&self) -> usize {
        self.table.shape()[1]
    }
}

impl Layer for Embedding {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, tape: &GradientTape, ids: &Tensor) -> Result<Tensor, NnError> {
        let flat = checked_indices(ids, self.input_dim(), "embedding id")?;
        let rows = tape.read_rows(&self.table, &flat)?;
        let mut shape = ids.dims().to_vec();
        shape.push(self.output_dim());
        Ok(rows.reshape(shape)?)
    }

    fn trainable_variables(&self) -> Vec<Variable> {
        if self.table.trainable() {
            vec![self.table.clone()]
        } else {
            Vec::new()
        }
    }

    fn weight_specs(&self) -> Vec<WeightSpec> {
        vec![self.spec.clone()]
    }
}

/// Layers applied one after another (Keras' `Sequential`).
#[derive(Debug, Default)]
pub struct Sequential {
    name: String,
    layers: Vec<Box<dyn Layer>>,
}

impl Sequential {
    /// An empty stack named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            layers: Vec::new(),
        }
    }

    /// Appends a layer.
    pub fn push(mut self, layer: impl Layer + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }
}

impl Layer for Sequential {
    fn name(&self) -> &str {
        &self.name
    }

    fn forward(&self, tape: &GradientTape, input: &Tensor) -> Result<Tensor, NnError> {
        let mut x = input.clone();
        for layer in &self.layers {
            x = layer.forward(tape, &x)?;
        }
        Ok(x)
    }

    fn trainable_variables(&self) -> Vec<Variable> {
        self.layers
            .iter()
            .flat_map(|l| l.trainable_variables())
            .collect()
    }

    fn weight_specs(&self) -> Vec<WeightSpec> {
        self.layers.iter().flat_map(|l| l.weight_specs()).collect()
    }

    fn regularization_losses(&self, tape: &GradientTape) -> Result<Vec<Tensor>, NnError> {
        let mut out = Vec::new();
        for layer in &self.layers {
            out.extend(layer.regularization_losses(tape)?);
        }
        Ok(out)
    }
}

/// Flattens integer `indices` to a `u32` vector after checking each is in `0..limit`.
pub(crate) fn checked_indices(
    indices: &Tensor,
    limit: usize,
    what: &'static str,
) -> Result<Tensor, NnError> {
    let values: Vec<i64> = match indices.dtype() {
        DType::U8 | DType::U32 | DType::I64 => indices
            .flatten_all()?
            .to_dtype(DType::I64)?
            .to_vec1::<i64>()?,
        dtype => return Err(NnError::IndexDType { what, dtype }),
    };
    let mut out = Vec::with_capacity(values.len());
    for value in values {
        if value < 0 || value as u64 >= limit as u64 {
            return Err(NnError::IndexOutOfRange { what, value, limit });
        }
        // In range of u32: `limit` is at most u32::MAX for every caller.
        out.push(value as u32);
    }
    let len = out.len();
    Ok(Tensor::from_vec(out, len, indices.device())?)
}
