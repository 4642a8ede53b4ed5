//! What `keras::Model::fit` costs over a hand-written step loop on the same model, data and
//! strategy: `cargo bench --bench fit_overhead` (the target is at most 3 %).
//!
//! Both train the same MLP (784-256-256-10, the `cohort bench mwms` model) under `Mirrored(2)`
//! for the same global batches: the hand loop calls `ReplicatedModel::train_step` inside
//! `strategy.run` and reduces the loss, as TensorFlow's custom-training-loop guide does; `fit`
//! adds its callbacks, metrics (accuracy here) and bookkeeping. The runs alternate, several
//! rounds, and the best round of each is compared (the least disturbed by the machine).

use std::sync::Arc;
use std::time::Instant;

use cohort::candle::{Device, Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::data::{Dataset, DistributeOptions, Element};
use cohort::keras::{metrics, Fit, Loss, Model};
use cohort::optim::Optimizer;
use cohort::strategy::{Mirrored, ReduceOp, Strategy, StrategyExt};
use cohort::train::{DistributedOptimizer, ReplicatedModel, StepSpec};

const EXAMPLES: usize = 16384;
const BATCH: usize = 128;
const ROUNDS: usize = 7;

struct Mlp {
    layers: [Linear; 3],
}

fn mlp(vb: VarBuilder<'static>) -> cohort::candle::Result<Mlp> {
    Ok(Mlp {
        layers: [
            candle_nn::linear(784, 256, vb.pp("l1"))?,
            candle_nn::linear(256, 256, vb.pp("l2"))?,
            candle_nn::linear(256, 10, vb.pp("l3"))?,
        ],
    })
}

impl ModuleT for Mlp {
    fn forward_t(&self, x: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let h = self.layers[0].forward(x)?.relu()?;
        let h = self.layers[1].forward(&h)?.relu()?;
        self.layers[2].forward(&h)
    }
}

fn data() -> anyhow::Result<Dataset> {
    let x = Tensor::rand(0f32, 1., (EXAMPLES, 784), &Device::Cpu)?;
    let y: Vec<u32> = (0..EXAMPLES as u32).map(|i| i % 10).collect();
    let y = Tensor::from_vec(y, EXAMPLES, &Device::Cpu)?;
    Ok(Dataset::from_tensor_slices(vec![x, y])?.batch(BATCH, true))
}

/// Seconds for one epoch with `fit`.
fn fit_epoch(data: &Dataset) -> anyhow::Result<f64> {
    let mut model = Model::new(Mirrored::new(2)?, 1, mlp)?;
    model.compile(
        Optimizer::adam(1e-3),
        Loss::sparse_categorical_crossentropy(),
        vec![Box::new(metrics::Accuracy::sparse_categorical())],
    );
    let start = Instant::now();
    model.fit(data, Fit::epochs(1).verbose(false))?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds for one epoch of the hand-written loop.
fn hand_epoch(data: &Dataset) -> anyhow::Result<f64> {
    let strategy = Mirrored::new(2)?;
    let model = Arc::new(ReplicatedModel::build(&strategy, 1, mlp)?);
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::adam(1e-3)));
    // Timed from the distribution of the data on, as `fit` is.
    let start = Instant::now();
    let distributed =
        strategy.experimental_distribute_dataset(data.clone(), DistributeOptions::default())?;
    for (step, batch) in (&distributed).into_iter().enumerate() {
        let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
        let outputs = strategy
            .run(
                move |ctx, e: Element| {
                    m.train_step(
                        ctx,
                        &o,
                        StepSpec::new(step as u64).global_batch_size(BATCH),
                        |net| {
                            cohort::nn::losses::sparse_softmax_cross_entropy(
                                &net.forward_t(&e[0], true)?,
                                &e[1],
                            )
                            .map_err(cohort::candle::Error::wrap)
                        },
                    )
                },
                batch?,
            )?
            .transpose()?;
        let loss = strategy.reduce(ReduceOp::Sum, &outputs.map(|o| o.loss.clone()), None)?;
        std::hint::black_box(loss.to_scalar::<f32>()?);
    }
    Ok(start.elapsed().as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let data = data()?;
    // Warm-up: allocator, thread pools.
    hand_epoch(&data)?;
    fit_epoch(&data)?;
    let (mut best_fit, mut best_hand) = (f64::INFINITY, f64::INFINITY);
    for round in 1..=ROUNDS {
        let hand = hand_epoch(&data)?;
        let fit = fit_epoch(&data)?;
        println!("round {round}: hand loop {hand:.3} s, fit {fit:.3} s");
        best_hand = best_hand.min(hand);
        best_fit = best_fit.min(fit);
    }
    let steps = (EXAMPLES / BATCH) as f64;
    let overhead = 100.0 * (best_fit / best_hand - 1.0);
    println!(
        "best of {ROUNDS}: hand loop {:.1} steps/s, fit {:.1} steps/s: fit costs {overhead:+.1} % (target at most 3 %)",
        steps / best_hand,
        steps / best_fit
    );
    Ok(())
}
