//! A decoder-only transformer's pieces from candle-nn's layers: KerasNLP's
//! `TokenAndPositionEmbedding` and `TransformerDecoder` (self-attention only, pre-norm), so a
//! language model is a stack of calls rather than a page of hand-written blocks.

use candle_core::{Module, Tensor};
use candle_nn::{Embedding, Init, Linear, VarBuilder};

use super::{layer_norm, multi_head_attention, LayerNorm, MultiHeadAttention, NnError};

/// Token ids `[batch, time]` to `[batch, time, width]`: a learned embedding of each token
/// plus a learned embedding of each position (KerasNLP's `TokenAndPositionEmbedding`). Its
/// variables are `tokens.weight` (`[vocabulary, width]`) and `positions` (`[context, width]`,
/// drawn from N(0, 0.02²)) under `vb`.
///
/// ```
/// use cohort::candle::{Device, Module, Tensor};
/// use cohort::nn::{token_and_position_embedding, ModelVariables};
///
/// let vars = ModelVariables::new(1);
/// let embed = token_and_position_embedding(10, 4, 8, vars.var_builder(0))?;
/// let ids = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?;
/// assert_eq!(embed.forward(&ids)?.dims(), &[1, 4, 8]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TokenAndPositionEmbedding {
    name: String,
    tokens: Embedding,
    positions: Tensor,
}

/// A [`TokenAndPositionEmbedding`] of `vocabulary` tokens over sequences of at most `context`
/// positions, `width` features each.
pub fn token_and_position_embedding(
    vocabulary: usize,
    context: usize,
    width: usize,
    vb: VarBuilder<'_>,
) -> candle_core::Result<TokenAndPositionEmbedding> {
    let init = Init::Randn {
        mean: 0.0,
        stdev: 0.02,
    };
    Ok(TokenAndPositionEmbedding {
        name: vb.prefix(),
        tokens: candle_nn::embedding(vocabulary, width, vb.pp("tokens"))?,
        positions: vb.get_with_hints((context, width), "positions", init)?,
    })
}

impl Module for TokenAndPositionEmbedding {
    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (_, time) = ids.dims2()?;
        let context = self.positions.dim(0)?;
        if time > context {
            return Err(candle_core::Error::wrap(NnError::InputShape {
                layer: self.name.clone(),
                expected: format!("[batch, time <= {context}]"),
                got: ids.dims().to_vec(),
            }));
        }
        self.tokens
            .forward(ids)?
            .broadcast_add(&self.positions.narrow(0, 0, time)?)
    }
}

/// One pre-norm decoder block over `[batch, time, width]`: `x + attention(norm1(x))`, then
/// `+ down(gelu(up(norm2(x))))` (KerasNLP's `TransformerDecoder` without cross-attention,
/// `normalize_first=True`). Its variables under `vb` are `norm1.*`, the attention's `qkv.*` and
/// `proj.*`, `norm2.*`, `up.*` and `down.*`.
///
/// ```
/// use cohort::candle::{DType, Device, Module, Tensor};
/// use cohort::nn::{transformer_decoder, ModelVariables};
///
/// let vars = ModelVariables::new(1);
/// let block = transformer_decoder(8, 2, 32, vars.var_builder(0).pp("block0"))?;
/// let x = Tensor::randn(0f32, 1., (3, 5, 8), &Device::Cpu)?;
/// assert_eq!(block.forward(&x)?.dims(), &[3, 5, 8]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TransformerDecoder {
    norm1: LayerNorm,
    attention: MultiHeadAttention,
    norm2: LayerNorm,
    up: Linear,
    down: Linear,
}

/// A causal [`TransformerDecoder`] of `heads` heads over `width` features, its feed-forward
/// part `hidden` wide (KerasNLP's `intermediate_dim`); layer norms with epsilon 1e-5.
pub fn transformer_decoder(
    width: usize,
    heads: usize,
    hidden: usize,
    vb: VarBuilder<'_>,
) -> candle_core::Result<TransformerDecoder> {
    Ok(TransformerDecoder {
        norm1: layer_norm(width, 1e-5, vb.pp("norm1"))?,
        attention: multi_head_attention(width, heads, vb.clone())?.causal(),
        norm2: layer_norm(width, 1e-5, vb.pp("norm2"))?,
        up: candle_nn::linear(width, hidden, vb.pp("up"))?,
        down: candle_nn::linear(hidden, width, vb.pp("down"))?,
    })
}

impl Module for TransformerDecoder {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = (x + self.attention.forward(&self.norm1.forward(x)?)?)?;
        let feed_forward = self
            .down
            .forward(&self.up.forward(&self.norm2.forward(&x)?)?.gelu()?)?;
        &x + feed_forward
    }
}
