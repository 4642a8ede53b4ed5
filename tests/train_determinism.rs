//! DATA-1: with the same seed and no faults, training is reproducible — the same batches in
//! the same order and bit-identical final variables — across two independent runs of a
//! shuffled dataset on 2 mirrored replicas with seeded initial values.

use anyhow::Result;
use cohort::candle::{Device, Module, Tensor};
use cohort::data::{Dataset, DistributeOptions};
use cohort::keras::{Fit, Loss, Model};
use cohort::nn::{dense, Activation, Dense};
use cohort::optim::Optimizer;
use cohort::strategy::{Mirrored, Strategy};
use cohort::train::DistributedOptimizer;

const EXAMPLES: usize = 64;

fn dataset(seed: u64) -> Result<Dataset> {
    let cpu = &Device::Cpu;
    let x: Vec<f32> = (0..EXAMPLES * 3)
        .map(|i| ((i * 29) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let y: Vec<i64> = (0..EXAMPLES).map(|i| (i % 3) as i64).collect();
    Ok(Dataset::from_tensor_slices(vec![
        Tensor::from_vec(x, (EXAMPLES, 3), cpu)?,
        Tensor::from_vec(y, EXAMPLES, cpu)?,
    ])?
    .shuffle(EXAMPLES, seed)
    .batch(8, false))
}

/// The batches each replica sees in one pass, as raw bits.
fn batches(seed: u64) -> Result<Vec<Vec<Vec<u32>>>> {
    let strategy = Mirrored::new(2)?;
    let dist =
        strategy.experimental_distribute_dataset(dataset(seed)?, DistributeOptions::default())?;
    let mut out = Vec::new();
    for batch in &dist {
        let mut step = Vec::new();
        for element in batch?.values() {
            let bits: Vec<u32> = element[0]
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect();
            step.push(bits);
        }
        out.push(step);
    }
    Ok(out)
}

/// The classifier: 3 → 8 (ReLU) → 3 logits.
struct Mlp {
    hidden: Dense,
    logits: Dense,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> cohort::candle::Result<Tensor> {
        self.logits.forward(&self.hidden.forward(x)?)
    }
}

/// Trains a small softmax classifier for 3 epochs (`keras::Model::fit`, AdamW) and returns
/// its final variables' bits.
fn train(data_seed: u64, init_seed: u64) -> Result<Vec<Vec<u32>>> {
    let mut model = Model::new(Mirrored::new(2)?, init_seed, |vb| {
        Ok(Mlp {
            hidden: dense(3, 8, Activation::Relu, vb.pp("hidden"))?,
            logits: dense(8, 3, Activation::Linear, vb.pp("logits"))?,
        })
    })?;
    model.compile(
        DistributedOptimizer::new(Optimizer::adamw(0.01, 1e-3)),
        Loss::sparse_categorical_crossentropy(),
        Vec::new(),
    );
    model.fit(&dataset(data_seed)?, Fit::epochs(3).verbose(false))?;
    let mut out = Vec::new();
    for var in model.variables() {
        let comps = var.components();
        let bits: Vec<u32> = comps[0]
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        for c in &comps[1..] {
            let other: Vec<u32> = c
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(bits, other, "mirrored copies of {} diverged", var.name());
        }
        out.push(bits);
    }
    Ok(out)
}

#[test]
fn data_1_same_seed_gives_same_batches_in_same_order() -> Result<()> {
    let first = batches(11)?;
    assert_eq!(first.len(), EXAMPLES / 8);
    assert_eq!(first, batches(11)?);
    // The seed matters: another seed gives another order (so the check above can fail).
    assert_ne!(first, batches(12)?);
    Ok(())
}

#[test]
fn data_1_same_seed_gives_bit_identical_final_variables() -> Result<()> {
    let first = train(5, 100)?;
    assert_eq!(first, train(5, 100)?);
    assert_ne!(first, train(6, 100)?, "data seed had no effect");
    assert_ne!(first, train(5, 101)?, "initializer seed had no effect");
    Ok(())
}
