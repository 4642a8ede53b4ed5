//! The custom-training-loop example of TensorFlow's distributed-training guide, on cohort:
//! a one-unit dense model with an L2 kernel regularizer, SGD, binary cross-entropy from
//! logits, `from_tensors(([1.], [1.])).repeat(1000)` batched to a global batch of 10 over 2
//! mirrored replicas. The loss must fall step by step, and the gradients applied must equal
//! the single-replica gradients of the same global batch.

use std::sync::Arc;

use anyhow::Result;
use cohort::candle::{Device, Module, Tensor};
use cohort::candle_nn::VarBuilder;
use cohort::data::{Dataset, DistributeOptions};
use cohort::nn::{dense, losses, Activation, Dense, ModelVariables};
use cohort::optim::Optimizer;
use cohort::strategy::{Mirrored, OneDevice, ReduceOp, Strategy, StrategyExt};
use cohort::train::{
    compute_average_loss, scale_regularization_loss, DistributedOptimizer, ReplicatedModel,
    TrainError,
};

/// The model: one unit, `dense.weight` and `dense.bias` (Keras' `Dense(1)`).
fn layer(vb: VarBuilder<'static>) -> cohort::candle::Result<Dense> {
    dense(1, 1, Activation::Linear, vb.pp("dense"))
}

/// The seed of the model's initial values.
const SEED: u64 = 7;
const GLOBAL_BATCH: usize = 10;
const L2: f32 = 1e-4;
/// Keras' SGD default learning rate.
const LEARNING_RATE: f32 = 0.01;

/// What one step of one run produced: the global loss, the gradients applied (per variable,
/// flattened), and the variables after the step.
#[derive(Debug, Clone)]
struct Step {
    loss: f32,
    applied: Vec<Vec<f32>>,
    variables: Vec<Vec<f32>>,
}

/// Runs the guide's loop under `strategy` over `dataset` and records every step.
fn run_loop(strategy: &dyn Strategy, dataset: Dataset) -> Result<Vec<Step>> {
    let model = Arc::new(ReplicatedModel::build(strategy, SEED, layer)?);
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(LEARNING_RATE)));
    let dist = strategy.experimental_distribute_dataset(dataset, DistributeOptions::default())?;
    let replicas = strategy.num_replicas_in_sync();
    let mut steps = Vec::new();
    for batch in &dist {
        let (step_model, optimizer) = (Arc::clone(&model), Arc::clone(&optimizer));
        let out = strategy.run(
            move |ctx, inputs: Vec<Tensor>| -> Result<(Tensor, Vec<Vec<f32>>), TrainError> {
                let (features, labels) = (&inputs[0], &inputs[1]);
                let layer = step_model.replica(ctx)?;
                let predictions = layer.forward(features)?;
                let per_example = losses::binary_cross_entropy_from_logits(&predictions, labels)?;
                // Default global batch: replicas × local batch (no short batches here).
                let mut loss = compute_average_loss(&per_example, None, replicas)?;
                // Keras' kernel_regularizer=L2(L2), scaled by the replicas in sync.
                let reg = (layer.weight().sqr()?.sum_all()? * f64::from(L2))?;
                loss = (loss + scale_regularization_loss(&reg, replicas)?)?;
                let grads = step_model.gradients(ctx, &loss)?;
                let vars = step_model.trainable_variables()?;
                let applied = optimizer.apply_gradients(grads.into_iter().zip(vars))?;
                let applied = applied
                    .gradients
                    .iter()
                    .map(|g| g.flatten_all()?.to_vec1::<f32>())
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Ok((loss, applied))
            },
            batch?,
        )?;
        let out = out.transpose()?;
        let losses = out.map(|(loss, _)| loss.clone());
        let loss = strategy
            .reduce(ReduceOp::Sum, &losses, None)?
            .to_scalar::<f32>()?;
        // Every replica applied the same summed gradients.
        let applied = out.values()[0].1.clone();
        for (_, other) in out.values() {
            assert_eq!(other, &applied, "replicas applied different gradients");
        }
        let variables = model
            .trainable_variables()?
            .iter()
            .map(|v| {
                let comps = v.components();
                for c in &comps {
                    assert_eq!(
                        c.flatten_all()?.to_vec1::<f32>()?,
                        comps[0].flatten_all()?.to_vec1::<f32>()?,
                        "mirrored copies of {} diverged",
                        v.name()
                    );
                }
                comps[0].flatten_all()?.to_vec1::<f32>()
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        steps.push(Step {
            loss,
            applied,
            variables,
        });
    }
    Ok(steps)
}

fn guide_dataset() -> Result<Dataset> {
    let cpu = &Device::Cpu;
    Ok(
        Dataset::from_tensors(vec![Tensor::new(&[1f32], cpu)?, Tensor::new(&[1f32], cpu)?])
            .repeat(Some(1000))
            .batch(GLOBAL_BATCH, false),
    )
}

/// Ten distinct examples per global batch, so that each replica's half differs.
fn varied_dataset() -> Result<Dataset> {
    let cpu = &Device::Cpu;
    let x: Vec<f32> = (0..200)
        .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..200).map(|i| ((i * 13) % 3 == 0) as u8 as f32).collect();
    Ok(Dataset::from_tensor_slices(vec![
        Tensor::from_vec(x, (200, 1), cpu)?,
        Tensor::from_vec(y, (200, 1), cpu)?,
    ])?
    .batch(GLOBAL_BATCH, false))
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{what}: {a:?} vs {b:?}");
    }
}

#[test]
fn guide_loop_loss_falls_every_step() -> Result<()> {
    let strategy = Mirrored::new(2)?;
    let steps = run_loop(&strategy, guide_dataset()?)?;
    assert_eq!(steps.len(), 1000 / GLOBAL_BATCH);
    for pair in steps.windows(2) {
        assert!(
            pair[1].loss < pair[0].loss,
            "loss rose from {} to {}",
            pair[0].loss,
            pair[1].loss
        );
    }
    assert!(steps.last().unwrap().loss < 0.9 * steps[0].loss);
    Ok(())
}

#[test]
fn mirrored_gradients_equal_single_replica_gradients_of_the_global_batch() -> Result<()> {
    for (name, dataset) in [
        ("guide", guide_dataset as fn() -> Result<Dataset>),
        ("varied", varied_dataset),
    ] {
        let mirrored = run_loop(&Mirrored::new(2)?, dataset()?)?;
        let single = run_loop(&OneDevice::new("cpu:0")?, dataset()?)?;
        assert_eq!(mirrored.len(), single.len(), "{name}");
        for (k, (m, s)) in mirrored.iter().zip(&single).enumerate() {
            let what = format!("{name} step {k}");
            assert!(
                (m.loss - s.loss).abs() <= 1e-6,
                "{what}: loss {} vs {}",
                m.loss,
                s.loss
            );
            for (gm, gs) in m.applied.iter().zip(&s.applied) {
                assert_close(gm, gs, 1e-6, &format!("{what} gradient"));
            }
            for (vm, vs) in m.variables.iter().zip(&s.variables) {
                assert_close(vm, vs, 1e-6, &format!("{what} variable"));
            }
        }
    }
    Ok(())
}

#[test]
fn first_step_gradient_matches_the_hand_computed_value() -> Result<()> {
    // With kernel w, bias 0 and x = y = 1: d/dw mean BCE = sigmoid(w) - 1, plus 2·L2·w.
    let strategy = Mirrored::new(2)?;
    let steps = run_loop(&strategy, guide_dataset()?.take(1))?;
    let w0 = {
        let variables = ModelVariables::new(SEED);
        layer(variables.var_builder(0))?;
        variables
            .get("dense.weight")
            .expect("the weight")
            .read_value()
            .flatten_all()?
            .to_vec1::<f32>()?[0]
    };
    let sigmoid = 1.0 / (1.0 + (-w0).exp());
    let want_kernel = sigmoid - 1.0 + 2.0 * L2 * w0;
    let want_bias = sigmoid - 1.0;
    assert_close(
        &steps[0].applied[0],
        &[want_kernel],
        1e-6,
        "kernel gradient",
    );
    assert_close(&steps[0].applied[1], &[want_bias], 1e-6, "bias gradient");
    assert_close(
        &steps[0].variables[0],
        &[w0 - LEARNING_RATE * want_kernel],
        1e-6,
        "kernel after one step",
    );
    Ok(())
}

#[test]
fn a_steps_global_loss_and_sums_ride_in_the_gradients_all_reduce() -> Result<()> {
    let strategy = Mirrored::new(2)?;
    let model = Arc::new(ReplicatedModel::build(&strategy, SEED, layer)?);
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(LEARNING_RATE)));
    let dist =
        strategy.experimental_distribute_dataset(guide_dataset()?, DistributeOptions::default())?;
    let batch = (&dist).into_iter().next().expect("a batch")?;
    let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
    let out = strategy
        .run(
            move |ctx, inputs: Vec<Tensor>| {
                let replica = ctx.replica_id_in_sync_group() as f32;
                m.train_step_summing(ctx, &o, cohort::train::StepSpec::new(0), |layer| {
                    let predictions = layer.forward(&inputs[0])?;
                    let per_example =
                        losses::binary_cross_entropy_from_logits(&predictions, &inputs[1])
                            .map_err(cohort::candle::Error::wrap)?;
                    // Each replica's examples and its index: summed over both replicas.
                    let examples = inputs[0].dims()[0] as f32;
                    Ok((per_example, vec![examples, replica]))
                })
            },
            batch,
        )?
        .transpose()?;
    let reduced = strategy
        .reduce(ReduceOp::Sum, &out.map(|s| s.loss.clone()), None)?
        .to_scalar::<f32>()?;
    for step in out.values() {
        assert_eq!(step.sums(), [GLOBAL_BATCH as f32, 1.0]);
        assert!(
            (step.global_loss() - reduced).abs() < 1e-6,
            "{} vs {reduced}",
            step.global_loss()
        );
    }
    assert_eq!(out.values()[0].global_loss(), out.values()[1].global_loss());
    Ok(())
}
