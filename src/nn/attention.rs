//! Multi-head self-attention built from candle-nn's linear layers (candle-nn has none): Keras'
//! `layers.MultiHeadAttention` for a sequence attending to itself, with its causal mask.

use candle_core::{Device, Module, Tensor, D};
use candle_nn::{Linear, VarBuilder};

use super::NnError;

/// Multi-head self-attention over `[batch, time, width]` (Keras' `MultiHeadAttention(heads,
/// width / heads)` called as `mha(x, x)`): one projection to the queries, keys and values of
/// every head (`qkv`), scaled dot-product attention per head, and an output projection
/// (`proj`). With [`MultiHeadAttention::causal`] a position attends only to itself and the
/// positions before it (Keras' `use_causal_mask=True`), as a decoder does.
///
/// Its softmax is candle-nn's differentiable one, so it trains under every strategy as any
/// candle-nn layer does.
///
/// ```
/// use cohort::candle::{DType, Device, Module, Tensor};
/// use cohort::nn::{multi_head_attention, ModelVariables};
///
/// let vars = ModelVariables::new(1);
/// let attention = multi_head_attention(8, 2, vars.var_builder(0).pp("attention"))?.causal();
/// let x = Tensor::randn(0f32, 1., (3, 5, 8), &Device::Cpu)?;
/// assert_eq!(attention.forward(&x)?.dims(), &[3, 5, 8]);
/// assert_eq!(vars.names(), ["attention.qkv.weight", "attention.qkv.bias", "attention.proj.weight", "attention.proj.bias"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MultiHeadAttention {
    name: String,
    qkv: Linear,
    proj: Linear,
    width: usize,
    heads: usize,
    causal: bool,
}

/// A [`MultiHeadAttention`] of `heads` heads over `width` features (`heads` must divide
/// `width`), its variables `qkv.*` and `proj.*` under `vb`.
pub fn multi_head_attention(
    width: usize,
    heads: usize,
    vb: VarBuilder<'_>,
) -> candle_core::Result<MultiHeadAttention> {
    if heads == 0 || width % heads != 0 {
        return Err(candle_core::Error::wrap(NnError::Config {
            layer: vb.prefix(),
            reason: format!("{heads} heads cannot split {width} features evenly"),
        }));
    }
    Ok(MultiHeadAttention {
        name: vb.prefix(),
        qkv: candle_nn::linear(width, 3 * width, vb.pp("qkv"))?,
        proj: candle_nn::linear(width, width, vb.pp("proj"))?,
        width,
        heads,
        causal: false,
    })
}

impl MultiHeadAttention {
    /// The same layer, each position attending only to itself and the ones before it.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, time, width) = x.dims3()?;
        if width != self.width {
            return Err(candle_core::Error::wrap(NnError::InputShape {
                layer: self.name.clone(),
                expected: format!("[batch, time, {}]", self.width),
                got: x.dims().to_vec(),
            }));
        }
        let head_width = width / self.heads;
        // [3, batch, heads, time, head_width]
        let qkv = self
            .qkv
            .forward(x)?
            .reshape((batch, time, 3, self.heads, head_width))?
            .permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (
            qkv.get(0)?.contiguous()?,
            qkv.get(1)?.contiguous()?,
            qkv.get(2)?.contiguous()?,
        );
        let mut scores = (q.matmul(&k.t()?)? / (head_width as f64).sqrt())?;
        if self.causal {
            scores = scores.broadcast_add(&causal_mask(time, x.device())?)?;
        }
        let mixed = candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)?;
        self.proj
            .forward(&mixed.transpose(1, 2)?.reshape((batch, time, width))?)
    }
}

/// `[time, time]`: 0 where a query may look (the key is not after it), -inf elsewhere.
fn causal_mask(time: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mask: Vec<f32> = (0..time * time)
        .map(|i| {
            if i % time > i / time {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (time, time), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::ModelVariables;

    #[test]
    fn a_causal_position_sees_nothing_after_it() {
        let vars = ModelVariables::new(3);
        let attention = multi_head_attention(4, 2, vars.var_builder(0))
            .unwrap()
            .causal();
        let x = Tensor::randn(0f32, 1., (1, 3, 4), &Device::Cpu).unwrap();
        // Change the last position only: the first two outputs stay, the last moves.
        let later = Tensor::cat(
            &[
                x.narrow(1, 0, 2).unwrap(),
                Tensor::ones((1, 1, 4), candle_core::DType::F32, &Device::Cpu).unwrap(),
            ],
            1,
        )
        .unwrap();
        let (a, b) = (
            attention.forward(&x).unwrap(),
            attention.forward(&later).unwrap(),
        );
        let diff = (a - b).unwrap().abs().unwrap().max(2).unwrap();
        let diff = diff.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
        assert!(diff[0] < 1e-6 && diff[1] < 1e-6, "{diff:?}");
        assert!(diff[2] > 1e-4, "{diff:?}");
    }

    #[test]
    fn heads_that_do_not_split_the_width_are_refused_naming_the_layer() {
        let vars = ModelVariables::new(3);
        let err = multi_head_attention(6, 4, vars.var_builder(0).pp("block0.attention"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("block0.attention") && err.contains("4 heads"),
            "{err}"
        );
        let attention = multi_head_attention(4, 2, vars.var_builder(0).pp("a")).unwrap();
        let wrong = Tensor::zeros((1, 3, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(attention.forward(&wrong).is_err());
    }
}
