//! A wide-and-deep click-through model on hashed categorical features under
//! ParameterServerStrategy, with Keras' `fit` driven by the chief's coordinator.
//!
//! ```sh
//! cargo run --release --example wide_deep -- launch --workers 2 --ps 2 --kill-ps-after 60s
//! ```
//!
//! runs a chief, 2 parameter servers and 2 workers as processes, SIGKILLs a parameter server
//! after epoch 3 of 5 (`ChaosPoint`; or 60 s in, if that comes first) and restarts it: the coordinator restores it from the newest backup and runs the
//! closures since again, and training ends at the exact step. Both hashed tables (the wide
//! part's weights and the deep part's embeddings) are split over the two servers. The data is
//! synthetic clicks from a planted model (8 categorical fields, pairwise effects), so that the
//! best possible AUC is known to be high; the chief prints the held-out AUC.

use std::sync::Arc;

use cohort::candle::{Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Embedding, Init, Linear, VarBuilder};
use cohort::data::synthetic::ClickLog;
use cohort::data::{DataError, Dataset, InputContext};
use cohort::keras::callbacks::{BackupAndRestore, ChaosPoint, SaveFreq};
use cohort::keras::{metrics, Fit, Loss, PsFit};
use cohort::optim::Optimizer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program};
use cohort::variable::Partitioner;

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
                .get_with_hints((ClickLog::default().buckets, width), "weight", init)?,
            width,
        ))
    };
    Ok(WideDeep {
        wide: table("wide", 1, 0.01)?,
        deep: table("deep", WIDTH, 0.05)?,
        hidden: [
            candle_nn::linear(ClickLog::default().fields * WIDTH, 64, vb.pp("hidden1"))?,
            candle_nn::linear(64, 32, vb.pp("hidden2"))?,
        ],
        out: candle_nn::linear(32, 1, vb.pp("out"))?,
    })
}

impl ModuleT for WideDeep {
    /// Hashed ids `[batch, fields]` to a click logit `[batch, 1]`.
    fn forward_t(&self, ids: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let wide = self.wide.forward(ids)?.sum(1)?;
        let mut deep = self.deep.forward(ids)?.flatten_from(1)?;
        for layer in &self.hidden {
            deep = layer.forward(&deep)?.relu()?;
        }
        wide + self.out.forward(&deep)?
    }
}

fn train_data(ctx: &InputContext) -> Result<Dataset, DataError> {
    Ok(ClickLog::default()
        .impressions(100_000, 1 + ctx.input_pipeline_id as u64)?
        .repeat(None)
        .batch(BATCH, true))
}

fn validation_data(_ctx: &InputContext) -> Result<Dataset, DataError> {
    Ok(ClickLog::default()
        .impressions(BATCH * 20, 999)?
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
        // The wide (linear) part's table by Adagrad, the deep part by Adam (optimizers by
        // name scope, as wide-and-deep models are trained).
        .optimizer_for("wide", Optimizer::adagrad(0.05))
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
                .callback(BackupAndRestore::new(backup).save_freq(SaveFreq::Steps(50)))
                .callback(ChaosPoint::after_epoch(3)),
        )
        .map_err(CoordinatorError::other)?;
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
