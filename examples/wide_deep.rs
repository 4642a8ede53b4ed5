//! A wide-and-deep click-through model on hashed categorical features under
//! ParameterServerStrategy, with Keras' `fit` driven by the chief's coordinator.
//!
//! ```sh
//! cargo run --release --example wide_deep -- launch --workers 2 --ps 2 --kill-ps-after 8s
//! ```
//!
//! runs a chief, 2 parameter servers and 2 workers as processes, SIGKILLs a parameter server
//! 8 s in and restarts it: the coordinator restores it from the newest backup and runs the
//! closures since again, and training ends at the exact step. Both hashed tables (the wide
//! part's weights and the deep part's embeddings) are split over the two servers. The data is
//! synthetic clicks from a planted model (8 categorical fields, pairwise effects), so that the
//! best possible AUC is known to be high; the chief prints the held-out AUC.

use std::sync::Arc;

use cohort::candle::{DType, Device, Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Embedding, Init, Linear, VarBuilder};
use cohort::data::{DataError, Dataset, InputContext};
use cohort::keras::callbacks::{BackupAndRestore, SaveFreq};
use cohort::keras::{metrics, Fit, Loss, PsFit};
use cohort::optim::Optimizer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program};
use cohort::variable::Partitioner;

const FIELDS: usize = 8;
const VALUES: u64 = 500;
const BUCKETS: usize = 20_000;
const WIDTH: usize = 8;
const BATCH: usize = 256;

struct WideDeep {
    wide: Embedding,
    deep: Embedding,
    hidden: [Linear; 2],
    out: Linear,
}

fn wide_deep(vb: VarBuilder<'static>) -> cohort::candle::Result<WideDeep> {
    let table = |name: &str, width: usize, stdev: f64| -> cohort::candle::Result<Embedding> {
        let init = Init::Randn { mean: 0.0, stdev };
        Ok(Embedding::new(
            vb.pp(name)
                .get_with_hints((BUCKETS, width), "weight", init)?,
            width,
        ))
    };
    Ok(WideDeep {
        wide: table("wide", 1, 0.01)?,
        deep: table("deep", WIDTH, 0.05)?,
        hidden: [
            candle_nn::linear(FIELDS * WIDTH, 64, vb.pp("hidden1"))?,
            candle_nn::linear(64, 32, vb.pp("hidden2"))?,
        ],
        out: candle_nn::linear(32, 1, vb.pp("out"))?,
    })
}

impl ModuleT for WideDeep {
    /// Hashed ids `[batch, FIELDS]` to a click logit `[batch, 1]`.
    fn forward_t(&self, ids: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let wide = self.wide.forward(ids)?.sum(1)?;
        let mut deep = self.deep.forward(ids)?.flatten_from(1)?;
        for layer in &self.hidden {
            deep = layer.forward(&deep)?.relu()?;
        }
        wide + self.out.forward(&deep)?
    }
}

/// A field's value hashed into the shared buckets.
fn bucket(field: usize, value: u64) -> u32 {
    let h = (field as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ value.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h % BUCKETS as u64) as u32
}

/// `n` synthetic impressions from stream `seed`: skewed field values, clicks from a planted
/// logit (a weight per value of fields 0–3, and an interaction of fields 4 and 5).
fn impressions(n: usize, seed: u64) -> Result<Dataset, DataError> {
    let mut state = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let effect = |field: usize, value: u64| ((bucket(field, value) % 97) as f32 / 48.0) - 1.0;
    let (mut ids, mut clicks) = (Vec::with_capacity(n * FIELDS), Vec::with_capacity(n));
    for _ in 0..n {
        let values: Vec<u64> = (0..FIELDS)
            .map(|_| (next() % VALUES) * (next() % VALUES) / VALUES)
            .collect();
        let mut logit = -0.5 + (0..4).map(|f| 1.5 * effect(f, values[f])).sum::<f32>();
        if (values[4] + values[5]) % 3 == 0 {
            logit += 2.0;
        }
        let click = ((next() % 10_000) as f32 / 10_000.0) < 1.0 / (1.0 + (-logit).exp());
        ids.extend(values.iter().enumerate().map(|(f, &v)| bucket(f, v)));
        clicks.push(f32::from(u8::from(click)));
    }
    Dataset::from_tensor_slices(vec![
        Tensor::from_vec(ids, (n, FIELDS), &Device::Cpu)?,
        Tensor::from_vec(clicks, (n, 1), &Device::Cpu)?.to_dtype(DType::F32)?,
    ])
}

fn train_data(ctx: &InputContext) -> Result<Dataset, DataError> {
    Ok(impressions(100_000, 1 + ctx.input_pipeline_id as u64)?
        .repeat(None)
        .batch(BATCH, true))
}

fn validation_data(_ctx: &InputContext) -> Result<Dataset, DataError> {
    Ok(impressions(BATCH * 20, 999)?
        .repeat(None)
        .batch(BATCH, true))
}

fn spec() -> Arc<PsFit<WideDeep>> {
    Arc::new(
        PsFit::new(
            3,
            wide_deep,
            Optimizer::adam(0.002),
            Loss::binary_crossentropy(),
            vec![
                Box::new(metrics::Auc::new().from_logits()),
                Box::new(metrics::Accuracy::binary(0.0)),
            ],
            "train",
        )
        .validation_data("validation")
        // Each closure pulls and pushes only the rows its batch touches.
        .read_rows(&["wide.weight", "deep.weight"])
        .partitioner(|name, _| {
            (name.starts_with("wide") || name.starts_with("deep"))
                .then_some(Partitioner::FixedShards { num_shards: 2 })
        }),
    )
}

fn chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    let backup = std::env::temp_dir().join("cohort-wide-deep-backup");
    let history = spec()
        .fit(
            coordinator,
            Fit::epochs(5)
                .steps_per_epoch(400)
                .validation_steps(20)
                .callback(BackupAndRestore::new(backup).save_freq(SaveFreq::Steps(50))),
        )
        .map_err(|e| CoordinatorError::Other(e.to_string()))?;
    println!(
        "wide_deep: held-out AUC {:.4}, accuracy {:.4} after {} steps (resumed at {:?})",
        history.get("val_auc").last().unwrap_or(&f64::NAN),
        history.get("val_accuracy").last().unwrap_or(&f64::NAN),
        history.step,
        history.resumed_at,
    );
    Ok(())
}

fn main() {
    let program = spec().register(
        Program::new("wide-deep")
            .dataset("train", train_data)
            .dataset("validation", validation_data),
    );
    std::process::exit(cohort::program::main(program.chief(chief)));
}
