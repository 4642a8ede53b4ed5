//! candle-nn's normalization layers, trainable: candle-nn 0.11 runs `LayerNorm` and `RmsNorm`
//! on contiguous input through fused kernels that record no backward pass, so a loss gets no
//! gradient through them (nor for anything before them). These take the same variables
//! (`weight`, and `bias` for layer normalization, under the same names) and compute the same
//! function with differentiable ops. `candle_nn::ops::softmax_last_dim` has the same gap: use
//! `candle_nn::ops::softmax(x, D::Minus1)` in a model that trains.

use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;

/// Layer normalization over the last dimension (Keras' `LayerNormalization`), with a
/// differentiable forward pass; its variables are candle-nn's `weight` (ones) and `bias`
/// (zeros).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

/// A trainable [`LayerNorm`] over `size` features, built as `candle_nn::layer_norm` builds one.
pub fn layer_norm(size: usize, eps: f64, vb: VarBuilder<'_>) -> candle_core::Result<LayerNorm> {
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?;
    let bias = vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.0))?;
    Ok(LayerNorm { weight, bias, eps })
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, self.eps as f32)
    }
}

/// Root-mean-square normalization over the last dimension, with a differentiable forward
/// pass; its variable is candle-nn's `weight` (ones).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

/// A trainable [`RmsNorm`] over `size` features, built as `candle_nn::rms_norm` builds one.
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder<'_>) -> candle_core::Result<RmsNorm> {
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?;
    Ok(RmsNorm { weight, eps })
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm_slow(x, &self.weight, self.eps as f32)
    }
}
