//! The two workloads' models as functions of their parameters: forward pass, mean loss and
//! gradients for one batch, with parameters given as flat `f32` buffers (what a worker pulls
//! from the parameter servers) and gradients returned the same way (what it pushes).
//!
//! Compute is candle on CPU with its autograd; the losses are [`crate::nn::losses`].

use candle_core::{Device, Tensor, Var, D};

use crate::nn::{losses, Activation, Initializer, KernelLayout, NnError};

use super::{ctr, digits};

/// A model parameter: name, shape, initializer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The variable's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// How it starts.
    pub init: Initializer,
}

/// Loss and gradients of one batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Mean loss over the batch.
    pub loss: f32,
    /// One gradient per parameter given, in the same order and layout.
    pub grads: Vec<Vec<f32>>,
}

impl StepOutput {
    /// The whole batch's mean loss and gradients from its replicas' (each the mean over its
    /// share of the batch, given with the share's examples, as `StepContext::on_replicas`
    /// returns them): each weighted by its share, summed in replica order. One part is
    /// returned as it is.
    pub fn combine(mut parts: Vec<(std::ops::Range<usize>, StepOutput)>) -> StepOutput {
        if parts.len() == 1 {
            return parts.pop().map(|(_, out)| out).unwrap_or_default();
        }
        let examples: usize = parts.iter().map(|(share, _)| share.len()).sum();
        let mut total = StepOutput::default();
        for (share, part) in parts {
            let weight = share.len() as f32 / examples.max(1) as f32;
            total.loss += weight * part.loss;
            if total.grads.is_empty() {
                total.grads = part.grads.iter().map(|g| vec![0.0; g.len()]).collect();
            }
            for (sum, grad) in total.grads.iter_mut().zip(part.grads) {
                for (s, g) in sum.iter_mut().zip(grad) {
                    *s += weight * g;
                }
            }
        }
        total
    }
}

/// Layer widths of the digits classifier: 64 → 64 (ReLU) → 10.
pub const DIGITS_LAYERS: [usize; 3] = [digits::PIXELS, 64, digits::CLASSES];

/// The digits classifier's parameters (an [`mlp_params`] named `digits`).
pub fn digits_params(seed: u64) -> Vec<ParamSpec> {
    mlp_params("digits", &DIGITS_LAYERS, seed)
}

/// Mean cross-entropy and gradients of the digits classifier on `features` (`n × 64`) and
/// `labels` (`n`); `params` in the order of [`digits_params`].
pub fn digits_step(
    params: &[&[f32]],
    features: &[f32],
    labels: &[i64],
) -> Result<StepOutput, NnError> {
    mlp_step(&DIGITS_LAYERS, params, features, labels)
}

/// Fraction of `labels` the digits classifier gets right.
pub fn digits_accuracy(
    params: &[&[f32]],
    features: &[f32],
    labels: &[i64],
) -> Result<f32, NnError> {
    mlp_accuracy(&DIGITS_LAYERS, params, features, labels)
}

/// A multi-layer perceptron with ReLU between layers and softmax cross-entropy on top:
/// `layers[0]` inputs, `layers[last]` classes. Kernels are Glorot-uniform, biases zero;
/// names are `<name>/layer_<i>/kernel` and `.../bias`, kernel then bias per layer.
pub fn mlp_params(name: &str, layers: &[usize], seed: u64) -> Vec<ParamSpec> {
    mlp_shapes(layers)
        .into_iter()
        .enumerate()
        .map(|(i, shape)| {
            let layer = i / 2;
            let (part, init) = if i % 2 == 0 {
                (
                    "kernel",
                    Initializer::GlorotUniform {
                        seed: seed + layer as u64,
                    },
                )
            } else {
                ("bias", Initializer::Zeros)
            };
            ParamSpec {
                name: format!("{name}/layer_{layer}/{part}"),
                shape,
                init,
            }
        })
        .collect()
}

/// Mean cross-entropy and gradients of an MLP (see [`mlp_params`]) on `features`
/// (`n × layers[0]`) and integer `labels`.
pub fn mlp_step(
    layers: &[usize],
    params: &[&[f32]],
    features: &[f32],
    labels: &[i64],
) -> Result<StepOutput, NnError> {
    // One copy of each parameter, as a variable made from the slice would take.
    let params = params.iter().map(|p| p.to_vec()).collect();
    let features = features_tensor(layers, features)?;
    let labels = Tensor::from_slice(labels, labels.len(), &Device::Cpu)?;
    mlp_step_owned(layers, params, &features, &labels)
}

/// [`mlp_step`] on parameters it takes over (no copy: a pull's buffers) and a batch already
/// in tensors (`features` `n × layers[0]`, read in place even as a view of a larger batch;
/// `labels` `n` integers), as a parameter-server step holds them.
pub fn mlp_step_owned(
    layers: &[usize],
    params: Vec<Vec<f32>>,
    features: &Tensor,
    labels: &Tensor,
) -> Result<StepOutput, NnError> {
    let shapes = mlp_shapes(layers);
    check_count(params.len(), shapes.len())?;
    let vars = params
        .into_iter()
        .zip(&shapes)
        .map(|(p, shape)| Var::from_vec(p, shape.as_slice(), &Device::Cpu))
        .collect::<Result<Vec<_>, _>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let logits = mlp_logits(&tensors, features)?;
    let loss = losses::sparse_softmax_cross_entropy(&logits, labels)?.mean_all()?;
    gradients(&loss, &vars)
}

/// Fraction of `labels` an MLP gets right.
pub fn mlp_accuracy(
    layers: &[usize],
    params: &[&[f32]],
    features: &[f32],
    labels: &[i64],
) -> Result<f32, NnError> {
    let tensors = mlp_shapes(layers)
        .iter()
        .zip(params)
        .map(|(shape, p)| Tensor::from_slice(p, shape.as_slice(), &Device::Cpu))
        .collect::<Result<Vec<_>, _>>()?;
    let predicted = mlp_logits(&tensors, &features_tensor(layers, features)?)?
        .argmax(D::Minus1)?
        .to_vec1::<u32>()?;
    let correct = predicted
        .iter()
        .zip(labels)
        .filter(|(p, l)| i64::from(**p) == **l)
        .count();
    Ok(correct as f32 / labels.len().max(1) as f32)
}

/// The CTR model's dense head: a linear layer over the summed embeddings.
pub fn ctr_head_params(dim: usize, seed: u64) -> Vec<ParamSpec> {
    vec![
        ParamSpec {
            name: "ctr/head/kernel".into(),
            shape: vec![dim],
            init: Initializer::GlorotUniform { seed },
        },
        ParamSpec {
            name: "ctr/head/bias".into(),
            shape: vec![1],
            init: Initializer::Zeros,
        },
    ]
}

/// The CTR model's embedding table (rows initialized uniform in ±0.05, as Keras does).
pub fn ctr_embedding_param(config: &ctr::CtrConfig, dim: usize, seed: u64) -> ParamSpec {
    ParamSpec {
        name: "ctr/embedding".into(),
        shape: vec![config.vocab as usize, dim],
        init: Initializer::RandomUniform {
            min: -0.05,
            max: 0.05,
            seed,
        },
    }
}

pub use crate::variable::unique_rows;

/// Mean log loss and gradients of the CTR model. `rows` holds the pulled embedding rows
/// (`unique × dim`), `positions` maps each of the batch's `n × fields` ids to its row; the
/// gradients come back as `[rows, head kernel, head bias]`, the first row-sparse.
///
/// The model is small enough that its forward and backward passes are written out here: a
/// sparse gather, a dot product and a scatter-add, with no tensor graph to build per step (the
/// same loss as [`losses::binary_cross_entropy_from_logits`]; a test checks the gradients
/// against finite differences).
pub fn ctr_step(
    rows: &[f32],
    dim: usize,
    positions: &[u32],
    fields: usize,
    head: [&[f32]; 2],
    labels: &[f32],
) -> Result<StepOutput, NnError> {
    let forward = ctr_forward(rows, dim, positions, fields, head, labels)?;
    let n = labels.len();
    let [w, _] = head;
    let mut grad_rows = vec![0.0f32; rows.len()];
    let mut grad_w = vec![0.0f32; dim];
    let mut grad_b = 0.0f32;
    for (b, (&logit, &label)) in forward.logits.iter().zip(labels).enumerate() {
        // d(mean BCE)/d(logit) = (sigmoid(logit) - label) / n.
        let g = (super::ctr::sigmoid(logit) - label) / n as f32;
        grad_b += g;
        let pooled = &forward.pooled[b * dim..(b + 1) * dim];
        for (gw, p) in grad_w.iter_mut().zip(pooled) {
            *gw += g * p;
        }
        for &pos in &positions[b * fields..(b + 1) * fields] {
            let row = &mut grad_rows[pos as usize * dim..(pos as usize + 1) * dim];
            for (gr, wd) in row.iter_mut().zip(w) {
                *gr += g * wd;
            }
        }
    }
    Ok(StepOutput {
        loss: forward.loss,
        grads: vec![grad_rows, grad_w, vec![grad_b]],
    })
}

/// Mean log loss of the CTR model (no gradients), for evaluation.
pub fn ctr_loss(
    rows: &[f32],
    dim: usize,
    positions: &[u32],
    fields: usize,
    head: [&[f32]; 2],
    labels: &[f32],
) -> Result<f32, NnError> {
    Ok(ctr_forward(rows, dim, positions, fields, head, labels)?.loss)
}

/// The CTR model's forward pass: summed embeddings per example, logits, mean log loss.
struct CtrForward {
    pooled: Vec<f32>,
    logits: Vec<f32>,
    loss: f32,
}

fn ctr_forward(
    rows: &[f32],
    dim: usize,
    positions: &[u32],
    fields: usize,
    head: [&[f32]; 2],
    labels: &[f32],
) -> Result<CtrForward, NnError> {
    let bad =
        |detail: String| NnError::Tensor(candle_core::Error::Msg(format!("ctr model: {detail}")));
    let n = labels.len();
    let [w, bias] = head;
    if dim == 0 || rows.len() % dim != 0 {
        return Err(bad(format!(
            "{} embedding values do not make rows of width {dim}",
            rows.len()
        )));
    }
    if w.len() != dim || bias.len() != 1 {
        return Err(bad(format!(
            "head of {} + {} values for width {dim}",
            w.len(),
            bias.len()
        )));
    }
    if Some(positions.len()) != n.checked_mul(fields) {
        return Err(bad(format!(
            "{} ids for {n} examples of {fields} fields",
            positions.len()
        )));
    }
    let unique = rows.len() / dim;
    if let Some(&pos) = positions.iter().find(|&&p| p as usize >= unique) {
        return Err(bad(format!(
            "id position {pos} outside the {unique} pulled rows"
        )));
    }
    let mut pooled = vec![0.0f32; n * dim];
    let mut logits = Vec::with_capacity(n);
    let mut total = 0.0f64;
    for (b, &label) in labels.iter().enumerate() {
        let sum = &mut pooled[b * dim..(b + 1) * dim];
        for &pos in &positions[b * fields..(b + 1) * fields] {
            for (s, r) in sum
                .iter_mut()
                .zip(&rows[pos as usize * dim..(pos as usize + 1) * dim])
            {
                *s += r;
            }
        }
        let logit = sum.iter().zip(w).map(|(p, wd)| p * wd).sum::<f32>() + bias[0];
        // Stable BCE from logits: max(x, 0) - x·y + ln(1 + e^-|x|).
        let x = f64::from(logit);
        total += x.max(0.0) - x * f64::from(label) + (-x.abs()).exp().ln_1p();
        logits.push(logit);
    }
    Ok(CtrForward {
        pooled,
        logits,
        loss: (total / n.max(1) as f64) as f32,
    })
}

fn mlp_shapes(layers: &[usize]) -> Vec<Vec<usize>> {
    layers
        .windows(2)
        .flat_map(|w| [vec![w[0], w[1]], vec![w[1]]])
        .collect()
}

/// `features` (`n × layers[0]`, flat) as the tensor the first layer reads.
fn features_tensor(layers: &[usize], features: &[f32]) -> Result<Tensor, NnError> {
    let inputs = layers.first().copied().unwrap_or(1).max(1);
    let n = features.len() / inputs;
    Ok(Tensor::from_slice(features, (n, inputs), &Device::Cpu)?)
}

fn mlp_logits(params: &[Tensor], features: &Tensor) -> Result<Tensor, NnError> {
    let mut x = features.clone();
    let last = params.len() / 2;
    for (i, pair) in params.chunks(2).enumerate() {
        let activation = if i + 1 < last {
            Activation::Relu
        } else {
            Activation::Linear
        };
        x = crate::nn::affine(&x, &pair[0], KernelLayout::InputsByUnits, pair.get(1), activation)?;
    }
    Ok(x)
}

/// Refuses another number of parameters than the model has (`expected`).
fn check_count(given: usize, expected: usize) -> Result<(), NnError> {
    if given != expected {
        return Err(NnError::Tensor(candle_core::Error::Msg(format!(
            "expected {expected} parameters, got {given}"
        ))));
    }
    Ok(())
}

fn gradients(loss: &Tensor, vars: &[Var]) -> Result<StepOutput, NnError> {
    let store = loss.backward()?;
    let grads = vars
        .iter()
        .map(|v| match store.get(v.as_tensor()) {
            Some(g) => Ok(g.flatten_all()?.to_vec1::<f32>()?),
            None => Ok(vec![0.0; v.as_tensor().elem_count()]),
        })
        .collect::<Result<Vec<_>, NnError>>()?;
    Ok(StepOutput {
        loss: loss.to_scalar::<f32>()?,
        grads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::Optimizer;

    fn init(spec: &ParamSpec) -> Vec<f32> {
        spec.init
            .init(&spec.shape)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn a_step_on_owned_parameters_and_a_view_of_a_batch_matches_the_step_on_slices() {
        let layers = [6, 5, 3];
        let params: Vec<Vec<f32>> = mlp_params("m", &layers, 3).iter().map(init).collect();
        // Rows 2..6 of a batch of 8: a view that starts inside its storage.
        let all: Vec<f32> = (0..8 * 6).map(|i| (i as f32 * 0.37).sin()).collect();
        let labels: Vec<i64> = vec![0, 1, 2, 0, 1, 2, 0, 1];
        let features = Tensor::from_slice(&all, (8, 6), &Device::Cpu).unwrap();
        let label_tensor = Tensor::from_slice(&labels, 8, &Device::Cpu).unwrap();
        let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let on_slices = mlp_step(&layers, &views, &all[12..36], &labels[2..6]).unwrap();
        let owned = mlp_step_owned(
            &layers,
            params.clone(),
            &features.narrow(0, 2, 4).unwrap(),
            &label_tensor.narrow(0, 2, 4).unwrap(),
        )
        .unwrap();
        assert_eq!(on_slices.loss.to_bits(), owned.loss.to_bits());
        assert_eq!(on_slices.grads, owned.grads);
        assert!(mlp_step_owned(&layers, params[..3].to_vec(), &features, &label_tensor).is_err());
    }

    #[test]
    fn digits_classifier_learns_to_95_percent_held_out() {
        let data = digits::Digits::load().unwrap();
        let (train, test) = data.split(0.2, 42);
        let specs = digits_params(1);
        let mut params: Vec<Vec<f32>> = specs.iter().map(init).collect();
        let adagrad = Optimizer::adagrad(0.1);
        let mut slots: Vec<_> = specs
            .iter()
            .zip(&params)
            .map(|(s, p)| adagrad.new_slots(&s.name, p.len()))
            .collect();
        let batch = 64;
        for step in 0..600 {
            let start = (step * batch) % (train.len() - batch);
            let out = digits_step(
                &params.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                &train.features[start * digits::PIXELS..(start + batch) * digits::PIXELS],
                &train.labels[start..start + batch],
            )
            .unwrap();
            for ((p, g), s) in params.iter_mut().zip(&out.grads).zip(&mut slots) {
                adagrad.apply_dense(p, g, s, step as u64 + 1).unwrap();
            }
        }
        let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let accuracy = digits_accuracy(&views, &test.features, &test.labels).unwrap();
        assert!(accuracy >= 0.95, "held-out accuracy {accuracy}");
    }

    /// What the demo's steps do with local replicas: each replica's mean over its share,
    /// combined by share, is the whole batch's mean (to float rounding).
    #[test]
    fn replicas_shares_combine_to_the_whole_batchs_loss_and_gradients() {
        let data = digits::Digits::load().unwrap();
        let specs = digits_params(3);
        let params: Vec<Vec<f32>> = specs.iter().map(init).collect();
        let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let n = 37;
        let features = &data.features[..n * digits::PIXELS];
        let labels = &data.labels[..n];
        let whole = digits_step(&views, features, labels).unwrap();
        for replicas in [1, 2, 3, 5] {
            let parts = crate::roles::worker::replica_ranges(n, replicas)
                .into_iter()
                .map(|r| {
                    let f = &features[r.start * digits::PIXELS..r.end * digits::PIXELS];
                    (r.clone(), digits_step(&views, f, &labels[r]).unwrap())
                })
                .collect();
            let combined = StepOutput::combine(parts);
            assert!(
                (combined.loss - whole.loss).abs() < 1e-5,
                "{replicas} replicas"
            );
            for (a, b) in combined
                .grads
                .iter()
                .flatten()
                .zip(whole.grads.iter().flatten())
            {
                assert!((a - b).abs() < 1e-5, "{replicas} replicas: {a} vs {b}");
            }
        }
    }

    #[test]
    fn ctr_row_gradients_match_finite_differences() {
        let dim = 4;
        let rows: Vec<f32> = (0..3 * dim)
            .map(|i| (i as f32 * 0.37).sin() * 0.1)
            .collect();
        let positions = [0u32, 1, 2, 0, 2, 2];
        let head_w = [0.3f32, -0.2, 0.5, 0.1];
        let head_b = [0.05f32];
        let labels = [1.0f32, 0.0, 1.0];
        let out = ctr_step(&rows, dim, &positions, 2, [&head_w, &head_b], &labels).unwrap();
        let eps = 1e-3;
        for i in [0, 5, 11] {
            let mut plus = rows.clone();
            plus[i] += eps;
            let mut minus = rows.clone();
            minus[i] -= eps;
            let lp = ctr_loss(&plus, dim, &positions, 2, [&head_w, &head_b], &labels).unwrap();
            let lm = ctr_loss(&minus, dim, &positions, 2, [&head_w, &head_b], &labels).unwrap();
            let numeric = (lp - lm) / (2.0 * eps);
            assert!(
                (numeric - out.grads[0][i]).abs() < 1e-3,
                "row grad {i}: {numeric} vs {}",
                out.grads[0][i]
            );
        }
    }

    #[test]
    fn ctr_loss_equals_the_nn_loss_on_the_same_logits() {
        let dim = 3;
        let rows: Vec<f32> = (0..4 * dim).map(|i| (i as f32 * 0.71).cos()).collect();
        let positions = [0u32, 3, 1, 1, 2, 0];
        let (w, b) = ([0.4f32, -0.9, 0.2], [0.3f32]);
        let labels = [1.0f32, 0.0, 1.0];
        let ours = ctr_loss(&rows, dim, &positions, 2, [&w, &b], &labels).unwrap();
        let logits: Vec<f32> = (0..3)
            .map(|e| {
                (0..dim)
                    .map(|d| {
                        positions[e * 2..e * 2 + 2]
                            .iter()
                            .map(|&p| rows[p as usize * dim + d])
                            .sum::<f32>()
                            * w[d]
                    })
                    .sum::<f32>()
                    + b[0]
            })
            .collect();
        let logits = Tensor::from_vec(logits, (3, 1), &Device::Cpu).unwrap();
        let targets = Tensor::from_slice(&labels, (3, 1), &Device::Cpu).unwrap();
        let reference: f32 = losses::binary_cross_entropy_from_logits(&logits, &targets)
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!((ours - reference).abs() < 1e-6, "{ours} vs {reference}");
        assert!(ctr_loss(&rows, dim, &[9, 0, 0, 0, 0, 0], 2, [&w, &b], &labels).is_err());
    }
}
