//! Keras' `Dense` as a candle-nn module: candle-nn's `Linear` (the same variable names,
//! layout and, through [`linear`], the same initial values) with an activation, computed by
//! the fused dense node of `dense_kernel` where it applies.
//!
//! It is built from a `VarBuilder` like every candle-nn layer, so it trains under every
//! strategy as they do ([`crate::train::ReplicatedModel`], [`crate::keras::Model`],
//! `ServerModel` on the parameter servers), and a model may mix it with candle-nn's own
//! layers freely. What it adds over `candle_nn::Linear` is speed on the CPU: one graph node for
//! `act(x · wᵀ + b)` whose backward skips the input's gradient when the input is data (see
//! `dense_kernel`), the same products bit for bit.

use candle_core::{Module, Tensor};
use candle_nn::{Init, VarBuilder};

use super::dense_kernel::{self, KernelLayout};

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
    pub fn apply(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Activation::Linear => Ok(x.clone()),
            Activation::Relu => x.relu(),
            Activation::Sigmoid => candle_nn::ops::sigmoid(x),
            Activation::Tanh => x.tanh(),
            // The generic softmax (candle-nn's fused `softmax_last_dim` has no backward).
            Activation::Softmax => candle_nn::ops::softmax(x, candle_core::D::Minus1),
        }
    }
}

/// A densely connected layer, `activation(x · weightᵀ + bias)`, over the last axis of its
/// input (Keras' `Dense`; candle-nn's `Linear` plus an activation).
///
/// Its variables are candle-nn's: `weight` of shape `[units, inputs]` and `bias` of shape
/// `[units]`, under the `VarBuilder`'s prefix, so checkpoints of a `candle_nn::linear` model
/// load into it and the other way round.
///
/// ```
/// use cohort::candle::{Device, Module, Tensor};
/// use cohort::nn::{dense, Activation, ModelVariables};
///
/// let variables = ModelVariables::new(7);
/// let layer = dense(3, 2, Activation::Relu, variables.var_builder(0).pp("hidden"))?;
/// let y = layer.forward(&Tensor::ones((4, 3), cohort::candle::DType::F32, &Device::Cpu)?)?;
/// assert_eq!(y.dims(), [4, 2]);
/// assert_eq!(variables.names(), ["hidden.weight", "hidden.bias"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Dense {
    weight: Tensor,
    bias: Option<Tensor>,
    activation: Activation,
}

impl Dense {
    /// The layer over `weight` (`[units, inputs]`) and an optional `bias` (`[units]`).
    pub fn new(weight: Tensor, bias: Option<Tensor>, activation: Activation) -> Self {
        Self {
            weight,
            bias,
            activation,
        }
    }

    /// The weight, `[units, inputs]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, `[units]`, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The activation.
    pub fn activation(&self) -> Activation {
        self.activation
    }
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let affine = |x: &Tensor| {
            dense_kernel::affine(
                x,
                &self.weight,
                KernelLayout::UnitsByInputs,
                self.bias.as_ref(),
                self.activation,
            )
        };
        match x.dims() {
            [_, _] => affine(x),
            [] => candle_core::bail!("dense: expected an input with a feature axis, got a scalar"),
            [leading @ .., features] => {
                // Every leading axis is a batch axis: one 2-D product over them all.
                let rows = leading.iter().product::<usize>();
                let y = affine(&x.reshape((rows, *features))?)?;
                let mut shape = leading.to_vec();
                shape.push(y.dim(1)?);
                y.reshape(shape)
            }
        }
    }
}

/// A [`Dense`] layer with Keras' defaults: a Glorot-uniform weight and a zero bias.
pub fn dense(
    inputs: usize,
    units: usize,
    activation: Activation,
    vb: VarBuilder<'_>,
) -> candle_core::Result<Dense> {
    let bound = (6.0 / (inputs + units) as f64).sqrt();
    let weight = vb.get_with_hints(
        (units, inputs),
        "weight",
        Init::Uniform {
            lo: -bound,
            up: bound,
        },
    )?;
    let bias = vb.get_with_hints(units, "bias", Init::Const(0.0))?;
    Ok(Dense::new(weight, Some(bias), activation))
}

/// A linear [`Dense`] layer with candle-nn's initializers: a drop-in for `candle_nn::linear`
/// (the same names, shapes and initial values), computed by the fused node.
pub fn linear(inputs: usize, outputs: usize, vb: VarBuilder<'_>) -> candle_core::Result<Dense> {
    let weight = vb.get_with_hints(
        (outputs, inputs),
        "weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    let bound = 1.0 / (inputs as f64).sqrt();
    let bias = vb.get_with_hints(
        outputs,
        "bias",
        Init::Uniform {
            lo: -bound,
            up: bound,
        },
    )?;
    Ok(Dense::new(weight, Some(bias), Activation::Linear))
}
