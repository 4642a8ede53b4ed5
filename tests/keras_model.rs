//! `cohort::keras::Model` through the public API: the same `fit` under the default strategy,
//! `Mirrored` and MultiWorkerMirrored (worker processes over QUIC), evaluation, prediction,
//! saving and loading, the callbacks, and `BackupAndRestore` resuming a SIGKILLed process at
//! the exact step.

mod keras_support;
mod mwms_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::candle::{Device, Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::data::Dataset;
use cohort::keras::callbacks::{
    BackupAndRestore, Callback, CsvLogger, EarlyStopping, LearningRateScheduler, ModelCheckpoint,
    SaveFreq, TensorBoard, TrainingContext,
};
use cohort::keras::{metrics, Fit, History, KerasError, Logs, Loss, Model, ModelStrategy};
use cohort::nn::{Dropout, LayerNorm};
use cohort::optim::Optimizer;
use cohort::strategy::{DefaultStrategy, Mirrored, MultiWorkerMirrored, Strategy};
use cohort::train::{DistributedOptimizer, LearningRateSchedule};

use keras_support::{CLASSES, FEATURES};
const EXAMPLES: usize = 384;
const BATCH: usize = 32;

/// A classifier with a hidden layer, layer normalization and dropout.
struct Net {
    hidden: Linear,
    norm: LayerNorm,
    dropout: Dropout,
    out: Linear,
}

impl Net {
    fn build(
        hidden: usize,
        dropout: f32,
    ) -> impl Fn(VarBuilder<'static>) -> cohort::candle::Result<Net> {
        move |vb| {
            Ok(Net {
                hidden: candle_nn::linear(FEATURES, hidden, vb.pp("hidden"))?,
                norm: cohort::nn::layer_norm(hidden, 1e-5, vb.pp("norm"))?,
                dropout: Dropout::new(dropout).map_err(cohort::candle::Error::wrap)?,
                out: candle_nn::linear(hidden, CLASSES, vb.pp("out"))?,
            })
        }
    }
}

impl ModuleT for Net {
    fn forward_t(&self, xs: &Tensor, train: bool) -> cohort::candle::Result<Tensor> {
        let h = self.norm.forward(&self.hidden.forward(xs)?.relu()?)?;
        self.out.forward(&self.dropout.forward_t(&h, train)?)
    }
}

fn blobs(examples: usize, seed: u64) -> (Tensor, Tensor) {
    keras_support::blobs(examples, seed).unwrap()
}

fn train_data() -> Dataset {
    let (x, y) = blobs(EXAMPLES, 1);
    Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .shuffle(EXAMPLES, 42)
        .batch(BATCH, true)
}

fn validation_data() -> Dataset {
    let (x, y) = blobs(96, 2);
    Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .batch(BATCH, true)
}

/// A classifier whose layers create their variables on their first call (as Keras layers
/// do): nothing exists until it is built.
struct LazyNet {
    vb: VarBuilder<'static>,
    layers: std::sync::OnceLock<(Linear, Linear)>,
}

impl LazyNet {
    fn new(vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        Ok(Self {
            vb,
            layers: std::sync::OnceLock::new(),
        })
    }
}

impl ModuleT for LazyNet {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        if self.layers.get().is_none() {
            let width = xs.dim(1)?;
            let built = (
                candle_nn::linear(width, 16, self.vb.pp("hidden"))?,
                candle_nn::linear(16, CLASSES, self.vb.pp("out"))?,
            );
            let _ = self.layers.set(built);
        }
        let (hidden, out) = self.layers.get().expect("built above");
        out.forward(&hidden.forward(xs)?.relu()?)
    }
}

fn compiled(strategy: impl Into<ModelStrategy>, hidden: usize, dropout: f32) -> Model<Net> {
    compile(Model::new(strategy, 11, Net::build(hidden, dropout)).unwrap())
}

/// `model` compiled as every test here compiles it.
fn compile<N: ModuleT + Send + Sync + 'static>(mut model: Model<N>) -> Model<N> {
    let optimizer = DistributedOptimizer::new(Optimizer::adamw(0.0, 0.01))
        .with_schedule(LearningRateSchedule::cosine_decay(0.001, 60).with_warmup(0.02, 12))
        .unwrap()
        .with_global_clipnorm(5.0)
        .unwrap();
    model.compile(
        optimizer,
        Loss::sparse_categorical_crossentropy(),
        vec![
            Box::new(metrics::Accuracy::sparse_categorical()),
            Box::new(metrics::TopKAccuracy::sparse(2)),
        ],
    );
    model
}

/// Losses and validation accuracy per epoch, and every variable's values at the end.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Trained {
    loss: Vec<f64>,
    val_accuracy: Vec<f64>,
    step: u64,
    resumed_at: Option<u64>,
    weights: Vec<(String, Vec<f32>)>,
    /// `predict` on the validation data, flattened (empty where not asked).
    predictions: Vec<f32>,
    /// The learning rate of each epoch.
    learning_rate: Vec<f64>,
    /// The epochs this `fit` ended, in order (a resumed one: those after its backup).
    epoch_numbers: Vec<usize>,
}

fn trained<N: ModuleT + Send + Sync + 'static>(model: &Model<N>, history: &History) -> Trained {
    Trained {
        loss: history.get("loss"),
        val_accuracy: history
            .get("val_accuracy")
            .into_iter()
            .filter(|v| !v.is_nan())
            .collect(),
        step: history.step,
        resumed_at: history.resumed_at,
        weights: model
            .variables()
            .iter()
            .map(|v| {
                let value = v
                    .read_value()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                (v.name().to_owned(), value)
            })
            .collect(),
        predictions: Vec::new(),
        learning_rate: history.get("learning_rate"),
        epoch_numbers: history.epoch_numbers.clone(),
    }
}

/// A schedule that makes each epoch's rate from the one before (0.02, then 0.7 of the rate
/// in force): the rate is part of the state, which a resumed job or a joining worker must take
/// rather than run the schedule again from the optimizer's own rate.
fn decaying_rate() -> LearningRateScheduler {
    LearningRateScheduler::new(|epoch, rate| if epoch == 0 { 0.02 } else { rate * 0.7 })
}

fn fit_five_epochs(strategy: impl Into<ModelStrategy>, dropout: f32) -> Trained {
    let mut model = compiled(strategy, 16, dropout);
    let history = model
        .fit(
            &train_data(),
            Fit::epochs(5)
                .validation_data(validation_data())
                .verbose(false),
        )
        .unwrap();
    let mut result = trained(&model, &history);
    result.predictions = model
        .predict(&validation_data())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    result
}

fn assert_close(a: &Trained, b: &Trained, what: &str) {
    assert_eq!(a.loss.len(), b.loss.len(), "{what}: epochs");
    for (epoch, (x, y)) in a.loss.iter().zip(&b.loss).enumerate() {
        assert!(
            (x - y).abs() < 1e-5,
            "{what}: epoch {epoch} loss {x} vs {y}"
        );
    }
    assert_eq!(
        a.val_accuracy, b.val_accuracy,
        "{what}: validation accuracy"
    );
    assert_eq!(
        a.predictions.len(),
        b.predictions.len(),
        "{what}: predictions"
    );
    let worst = a
        .predictions
        .iter()
        .zip(&b.predictions)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "{what}: predictions differ by {worst}");
    for ((name, x), (_, y)) in a.weights.iter().zip(&b.weights) {
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "{what}: {name} differs by {worst}");
    }
}

#[test]
fn fit_trains_the_same_under_the_default_strategy_and_mirrored() {
    let default = fit_five_epochs(DefaultStrategy::new(), 0.1);
    assert_eq!(default.step, 5 * (EXAMPLES / BATCH) as u64);
    assert!(
        default.loss[4] < default.loss[0] / 3.0,
        "the loss did not fall: {:?}",
        default.loss
    );
    assert!(
        default.val_accuracy[4] > 0.9,
        "validation accuracy {:?}",
        default.val_accuracy
    );
    let mirrored = fit_five_epochs(Mirrored::new(2).unwrap(), 0.1);
    assert_close(&default, &mirrored, "Mirrored(2)");
}

/// `validation_freq(2)` validates after epochs 2 and 4 (counted from 1) only, as Keras does;
/// 0 is refused, naming it.
#[test]
fn validation_runs_after_every_validation_freq_th_epoch() {
    let mut model = compiled(DefaultStrategy::new(), 16, 0.0);
    let fit = Fit::epochs(4)
        .validation_data(validation_data())
        .validation_freq(2)
        .verbose(false);
    let history = model.fit(&train_data(), fit).unwrap();
    let validated: Vec<bool> = history
        .get("val_loss")
        .iter()
        .map(|v| v.is_finite())
        .collect();
    assert_eq!(validated, [false, true, false, true]);
    let err = model
        .fit(
            &train_data(),
            Fit::epochs(1).validation_freq(0).verbose(false),
        )
        .unwrap_err();
    assert!(err.to_string().contains("validation_freq"), "{err}");
}

/// A worker process of the MultiWorkerMirrored test: 2 local replicas, 4 in sync.
#[test]
fn keras_mwms_worker_process() {
    mwms_support::run_if_worker_process(|config| {
        let strategy = MultiWorkerMirrored::new(config.with_local_replicas(2)).unwrap();
        assert_eq!(strategy.num_replicas_in_sync(), 4);
        fit_five_epochs(strategy, 0.0)
    });
}

#[test]
fn fit_trains_the_same_under_multi_worker_mirrored() {
    // Without dropout: DATA sharding deals a global batch's slices to the workers in turn
    // (worker 0's two replicas get slices 0 and 2), as TensorFlow does, so a slice meets
    // another replica's dropout mask than under one replica.
    let default = fit_five_epochs(DefaultStrategy::new(), 0.0);
    let reports = scratch("fit-reports");
    let workers: Vec<Trained> = mwms_support::process_pair_reporting(
        "keras-fit",
        "keras_mwms_worker_process",
        Some(&reports),
    );
    for (i, worker) in workers.iter().enumerate() {
        assert_eq!(worker.step, default.step, "worker {i}'s steps");
        assert_close(&default, worker, &format!("MultiWorkerMirrored worker {i}"));
    }
    fit_reported_one_model_as_the_chaos_runner_reads_it(&reports, default.step);
}

/// What `fit` under MultiWorkerMirrored left in the workers' run reports (`reports`), with no
/// code of the program's own: a collective job, the same final model from both workers at
/// `step`, and the first worker's group generations, which `cohort chaos run`'s checks pass.
fn fit_reported_one_model_as_the_chaos_runner_reads_it(reports: &std::path::Path, step: u64) {
    use cohort::chaosrun::{membership_check, one_model_check, plan::Plan, run::ReportedSummary};
    let (read, errors) = cohort::run_report::read_reports(reports);
    assert!(errors.is_empty(), "{errors:?}");
    let names: Vec<&String> = read.keys().collect();
    assert_eq!(names, ["worker/0", "worker/1"], "the reports: {read:?}");
    for report in read.values() {
        assert!(report.collective, "{report:?}");
        let model = report.final_model.as_ref().expect("a final model");
        assert_eq!(model.step, step, "{report:?}");
    }
    let digests: Vec<&str> = read
        .values()
        .filter_map(|r| r.final_model.as_ref().map(|m| m.digest.as_str()))
        .collect();
    assert_eq!(digests[0], digests[1], "one model on both workers");
    let generations: Vec<(u64, u64, u64)> = read["worker/0"]
        .group_generations
        .iter()
        .map(|g| (g.generation, g.workers, g.from_step))
        .collect();
    assert_eq!(generations, [(1, 2, 0)]);
    assert!(read["worker/1"].group_generations.is_empty());
    let plan = Plan::parse(std::path::Path::new("plan.toml"), "seed = 1\n").unwrap();
    let group = ReportedSummary::gather(&read, &errors).group;
    assert!(group.is_collective());
    for check in [
        one_model_check(&plan, &group),
        membership_check(&plan, &group),
    ] {
        assert_eq!(check.status, "passed", "{check:?}");
    }
}

#[test]
fn evaluate_predict_save_and_load() {
    let dir = scratch("save");
    let mut model = compiled(DefaultStrategy::new(), 16, 0.0);
    model
        .fit(&train_data(), Fit::epochs(2).verbose(false))
        .unwrap();
    let logs = model.evaluate(&validation_data()).unwrap();
    let summary = model.summary();
    // 8×16 + 16 + 16 + 16 + 16×3 + 3 parameters, all trainable.
    assert!(
        summary.contains("hidden.weight") && summary.contains("total params: 227"),
        "{summary}"
    );
    let predictions = model.predict(&validation_data()).unwrap();
    assert_eq!(predictions.dims(), [96, CLASSES]);
    let path = dir.join("weights.safetensors");
    model.save(&path).unwrap();

    // Another model of the same shape, other initial weights: the file makes it the same.
    let mut other = Model::new(Mirrored::new(2).unwrap(), 99, Net::build(16, 0.0)).unwrap();
    other.compile(
        Optimizer::sgd(0.1),
        Loss::sparse_categorical_crossentropy(),
        vec![
            Box::new(metrics::Accuracy::sparse_categorical()),
            Box::new(metrics::TopKAccuracy::sparse(2)),
        ],
    );
    other.load(&path).unwrap();
    let again = other.evaluate(&validation_data()).unwrap();
    assert!((logs.get("loss").unwrap() - again.get("loss").unwrap()).abs() < 1e-6);
    assert_eq!(logs.get("accuracy"), again.get("accuracy"));
    let predicted_again = other.predict(&validation_data()).unwrap();
    let diff = (predictions - predicted_again)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);

    // A model of another shape: refused, naming the variable and both shapes, and unchanged.
    let mut wider = compiled(DefaultStrategy::new(), 24, 0.0);
    let before = wider.evaluate(&validation_data()).unwrap();
    let err = wider.load(&path).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KerasError::Weights { .. }), "{err:?}");
    assert!(
        text.contains("hidden.weight") && text.contains("[16, 8]") && text.contains("[24, 8]"),
        "{text}"
    );
    assert_eq!(wider.evaluate(&validation_data()).unwrap(), before);

    // Not a safetensors file: named.
    std::fs::write(dir.join("junk.safetensors"), b"not a tensor file").unwrap();
    let err = other
        .load(dir.join("junk.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("junk.safetensors") && err.contains("safetensors"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_named() {
    let mut model = Model::new(DefaultStrategy::new(), 1, Net::build(4, 0.0)).unwrap();
    let err = model.fit(&train_data(), Fit::epochs(1)).unwrap_err();
    assert!(matches!(err, KerasError::NotCompiled("fit")), "{err:?}");
    let mut model = compiled(DefaultStrategy::new(), 4, 0.0);
    let err = model.fit(&train_data(), Fit::epochs(0)).unwrap_err();
    assert!(err.to_string().contains("epochs"), "{err}");
    let features_only = Dataset::from_tensor_slices(vec![blobs(64, 3).0])
        .unwrap()
        .batch(BATCH, true);
    let err = model
        .fit(&features_only, Fit::epochs(1).verbose(false))
        .unwrap_err();
    assert!(
        matches!(err, KerasError::BatchComponents { got: 1 }),
        "{err:?}"
    );
    // Labels past the classes: the loss names them.
    let (x, _) = blobs(64, 3);
    let bad_labels = Tensor::from_vec(vec![7u32; 64], 64, &Device::Cpu).unwrap();
    let data = Dataset::from_tensor_slices(vec![x, bad_labels])
        .unwrap()
        .batch(BATCH, true);
    let err = model
        .fit(&data, Fit::epochs(1).verbose(false))
        .unwrap_err()
        .to_string();
    assert!(err.contains('7') && err.contains("class"), "{err}");
    let err = DistributedOptimizer::new(Optimizer::sgd(0.1))
        .with_global_clipnorm(-1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("global_clipnorm"), "{err}");
}

/// Records what it saw, to check the callback protocol.
#[derive(Default)]
struct Recorder {
    events: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Callback for Recorder {
    fn on_train_begin(&mut self, _ctx: &mut TrainingContext<'_>) -> Result<(), KerasError> {
        self.events.lock().unwrap().push("train_begin".into());
        Ok(())
    }
    fn on_epoch_begin(
        &mut self,
        epoch: usize,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        self.events
            .lock()
            .unwrap()
            .push(format!("epoch_begin {epoch} lr {}", ctx.learning_rate()));
        Ok(())
    }
    fn on_epoch_end(
        &mut self,
        epoch: usize,
        logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        assert!(
            logs.get("val_loss").is_some() && logs.get("accuracy").is_some(),
            "{logs}"
        );
        self.events
            .lock()
            .unwrap()
            .push(format!("epoch_end {epoch}"));
        Ok(())
    }
    fn on_train_end(
        &mut self,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        self.events.lock().unwrap().push("train_end".into());
        Ok(())
    }
}

#[test]
fn callbacks_schedule_log_checkpoint_and_stop_early() {
    let dir = scratch("callbacks");
    let mut model = Model::new(DefaultStrategy::new(), 5, Net::build(16, 0.0)).unwrap();
    model.compile(
        Optimizer::adam(0.02),
        Loss::sparse_categorical_crossentropy(),
        vec![Box::new(metrics::Accuracy::sparse_categorical())],
    );
    let recorder = Recorder::default();
    let events = std::sync::Arc::clone(&recorder.events);
    // From epoch 2 the rate is zero: the validation loss stops improving, and with patience 1
    // training stops after that epoch (the third).
    let history = model
        .fit(
            &train_data(),
            Fit::epochs(10)
                .validation_data(validation_data())
                .verbose(false)
                .callback(LearningRateScheduler::new(|epoch, rate| {
                    if epoch >= 2 {
                        0.0
                    } else {
                        rate
                    }
                }))
                .callback(EarlyStopping::new("val_loss").patience(1))
                .callback(CsvLogger::new(dir.join("log.csv")))
                .callback(TensorBoard::new(dir.join("tb")).update_freq_steps(4))
                .callback(ModelCheckpoint::new(
                    dir.join("ckpt-{epoch}.safetensors").display().to_string(),
                ))
                .callback(recorder),
        )
        .unwrap();
    assert!(history.stopped_early);
    assert_eq!(history.epochs.len(), 3, "{:?}", history.get("val_loss"));
    assert_eq!(
        history.get("learning_rate"),
        [0.02f32 as f64, 0.02f32 as f64, 0.0]
    );
    let events = events.lock().unwrap().clone();
    assert_eq!(events.first().map(String::as_str), Some("train_begin"));
    assert_eq!(events.last().map(String::as_str), Some("train_end"));
    assert!(
        events.contains(&"epoch_begin 2 lr 0".to_string()),
        "{events:?}"
    );
    let csv = std::fs::read_to_string(dir.join("log.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(
        lines[0].starts_with("epoch,loss,accuracy,learning_rate,val_loss,val_accuracy"),
        "{csv}"
    );
    assert!(lines[3].starts_with("2,"), "{csv}");
    for epoch in 1..=3 {
        assert!(dir.join(format!("ckpt-{epoch}.safetensors")).exists());
    }
    for sub in ["train", "validation"] {
        let files: Vec<_> = std::fs::read_dir(dir.join("tb").join(sub))
            .unwrap()
            .collect();
        assert!(!files.is_empty(), "no event file in tb/{sub}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for a test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-keras-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const BACKUP_CHILD_ENV: &str = "COHORT_KERAS_BACKUP_CHILD";
const BACKUP_OUT_ENV: &str = "COHORT_KERAS_BACKUP_OUT";
const STALL_AT_ENV: &str = "COHORT_KERAS_STALL_AT";
const EPOCH_END_ENV: &str = "COHORT_KERAS_EPOCH_END";

/// Stalls the process at step `at` (after telling the parent), so that it is SIGKILLed there.
struct StallAt {
    at: u64,
    marker: PathBuf,
}

impl Callback for StallAt {
    fn on_train_batch_end(
        &mut self,
        step: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if step == self.at {
            std::fs::write(&self.marker, step.to_string()).unwrap();
            std::thread::sleep(Duration::from_secs(120));
        }
        Ok(())
    }
}

/// How the backup test's epochs end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochEnd {
    /// After `steps_per_epoch` steps (12, one pass over the data).
    Counted,
    /// Where a pass over the data ends (no `steps_per_epoch`: the end is known only when
    /// the next batch is asked for).
    Pass,
}

/// Three epochs of 12 steps (one pass over the data each) under Mirrored(2), backed up every
/// 6 steps (two backups an epoch, the second at its last step), each epoch's rate made from
/// the one before.
fn fit_with_backup(backup: &Path, stall: Option<StallAt>, end: EpochEnd) -> Trained {
    let mut model = compiled(Mirrored::new(2).unwrap(), 16, 0.1);
    let mut fit = Fit::epochs(3)
        .verbose(false)
        .callback(decaying_rate())
        .callback(BackupAndRestore::new(backup).save_freq(SaveFreq::Steps(6)));
    if end == EpochEnd::Counted {
        fit = fit.steps_per_epoch(EXAMPLES / BATCH);
    }
    if let Some(stall) = stall {
        fit = fit.callback(stall);
    }
    let history = model.fit(&train_data(), fit).unwrap();
    trained(&model, &history)
}

/// The process of the backup test (run by it, with the environment saying what to do).
#[test]
fn keras_backup_child_process() {
    let Ok(backup) = std::env::var(BACKUP_CHILD_ENV) else {
        return;
    };
    let out = PathBuf::from(std::env::var(BACKUP_OUT_ENV).unwrap());
    let stall = std::env::var(STALL_AT_ENV).ok().map(|at| StallAt {
        at: at.parse().unwrap(),
        marker: out.with_extension("stalled"),
    });
    let end = match std::env::var(EPOCH_END_ENV).as_deref() {
        Ok("pass") => EpochEnd::Pass,
        _ => EpochEnd::Counted,
    };
    let result = fit_with_backup(Path::new(&backup), stall, end);
    std::fs::write(&out, serde_json::to_vec(&result).unwrap()).unwrap();
    std::process::exit(0);
}

fn start_child(
    backup: &Path,
    out: &Path,
    stall_at: Option<u64>,
    end: EpochEnd,
) -> std::process::Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "keras_backup_child_process", "--nocapture"])
        .env(BACKUP_CHILD_ENV, backup)
        .env(BACKUP_OUT_ENV, out)
        .env(
            EPOCH_END_ENV,
            if end == EpochEnd::Pass {
                "pass"
            } else {
                "counted"
            },
        )
        .stdin(Stdio::null());
    if let Some(at) = stall_at {
        command.env(STALL_AT_ENV, at.to_string());
    }
    command.spawn().expect("start the training process")
}

fn wait_for(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < deadline,
            "{what} did not happen within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A kill of the backup test: the step the first run is SIGKILLed at, the backup's step the
/// second run resumes from, and the epochs the second run ends.
struct Kill {
    at: u64,
    backed_up: u64,
    epochs_after: &'static [usize],
}

/// Runs the backup test's job, SIGKILLed at each of `kills` and started again, and checks
/// that it resumes at the backup's step, ends each epoch once, and ends with the same bits as
/// a job never stopped.
fn resumes_after_kills(name: &str, end: EpochEnd, kills: &[Kill]) {
    let dir = scratch(name);
    let reference = fit_with_backup(&dir.join("reference-backup"), None, end);
    assert_eq!(reference.step, 36);
    assert_eq!(reference.resumed_at, None);
    assert_eq!(reference.epoch_numbers, [0, 1, 2]);
    assert!(
        !dir.join("reference-backup").exists(),
        "the backup outlived a finished fit"
    );
    for kill in kills {
        let kill_at = kill.at;
        let backup = dir.join(format!("backup-{kill_at}"));
        let out = dir.join(format!("first-{kill_at}.json"));
        let mut first = start_child(&backup, &out, Some(kill_at), end);
        let marker = out.with_extension("stalled");
        wait_for(
            &format!("the stall at step {kill_at}"),
            Duration::from_secs(60),
            || marker.exists(),
        );
        first.kill().unwrap();
        first.wait().unwrap();
        assert!(backup.exists(), "no backup before the kill at {kill_at}");

        let out = dir.join(format!("second-{kill_at}.json"));
        let mut second = start_child(&backup, &out, None, end);
        let mut status = None;
        wait_for("the resumed run", Duration::from_secs(120), || {
            status = second.try_wait().unwrap();
            status.is_some()
        });
        assert!(
            status.unwrap().success(),
            "the run resumed after the kill at {kill_at} failed (its log is above)"
        );
        let resumed: Trained = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(resumed.resumed_at, Some(kill.backed_up));
        assert_eq!(resumed.step, 36, "the step count is exact");
        // Each epoch ends once over both runs: the epochs the first ended before the kill are
        // not ended again, and none is left unended.
        assert_eq!(
            resumed.epoch_numbers, kill.epochs_after,
            "the epochs ended after the kill at {kill_at}"
        );
        // (As f32, the rate's own type: JSON need not give an f64's last bit back.)
        let last_rate = |t: &Trained| t.learning_rate.last().map(|r| *r as f32);
        assert_eq!(
            last_rate(&resumed),
            last_rate(&reference),
            "the last epoch's rate after the kill at {kill_at}"
        );
        // Same data order, same dropout masks, same optimizer state and rate: the same bits.
        assert_eq!(
            resumed.weights, reference.weights,
            "the job resumed after the kill at {kill_at} ended elsewhere"
        );
        // The last epoch's figures count its steps before the backup too (they are in it).
        assert_eq!(
            resumed.loss.last(),
            reference.loss.last(),
            "the last epoch's loss after the kill at {kill_at}"
        );
        assert!(!backup.exists(), "the backup outlived a finished fit");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILLed at step 26 (epoch 2, its 2nd step; the newest backup is of step 24, the end of
/// epoch 1, before epoch 2's rate was set) and at step 33 (epoch 2, its 9th step; the newest
/// backup is of step 30, inside epoch 2 at its rate), the job started again resumes at the
/// backup's step with the rate in force there and ends with the same bits as a job never
/// stopped.
#[test]
fn backup_and_restore_resumes_a_sigkilled_job_at_the_exact_step() {
    let kills = [
        Kill {
            at: 26,
            backed_up: 24,
            epochs_after: &[2],
        },
        Kill {
            at: 33,
            backed_up: 30,
            epochs_after: &[2],
        },
    ];
    resumes_after_kills("backup", EpochEnd::Counted, &kills);
}

/// Where an epoch is a pass over the data, its end is known only when the next batch is asked
/// for: a backup due at a pass's last step is written after that epoch's end. SIGKILLed at
/// step 13 (the newest backup is of step 12, a pass's last step, and epoch 0 ended after it),
/// the job resumes at step 12 without ending epoch 0 again (its validation, callbacks and
/// history entry ran once); SIGKILLed at step 12 itself, before that step's backup, it
/// resumes at step 6 and ends epoch 0 then.
#[test]
fn a_backup_at_a_passs_last_step_does_not_end_that_epoch_again() {
    let kills = [
        Kill {
            at: 13,
            backed_up: 12,
            epochs_after: &[1, 2],
        },
        Kill {
            at: 12,
            backed_up: 6,
            epochs_after: &[0, 1, 2],
        },
    ];
    resumes_after_kills("backup-by-pass", EpochEnd::Pass, &kills);
}

/// Steps per epoch and epochs of the elastic test: 80 steps of a global batch of 48.
const ELASTIC_STEPS_PER_EPOCH: usize = 20;
const ELASTIC_EPOCHS: usize = 4;
/// The step at which the worker to kill stalls (to be SIGKILLed there) in its first life,
/// unless the test's `stall-at` file names another.
const ELASTIC_KILL_AT: u64 = 15;

/// The step at which the elastic test's victim stalls: `stall-at` in its directory, else
/// [`ELASTIC_KILL_AT`].
fn stall_step(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("stall-at"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(ELASTIC_KILL_AT)
}

/// Paces the elastic test's workers (so that a restarted worker joins before the end), writes
/// each step to `step-<worker>` in the test's directory, and, where `stall-<worker>` is there
/// (the first life of the worker to kill), stalls at [`stall_step`].
struct Pace {
    dir: PathBuf,
    worker: usize,
}

impl Callback for Pace {
    fn on_train_batch_end(
        &mut self,
        step: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        std::fs::write(
            self.dir.join(format!("step-{}", self.worker)),
            step.to_string(),
        )
        .unwrap();
        let stall = self.dir.join(format!("stall-{}", self.worker));
        if step == stall_step(&self.dir) && std::fs::remove_file(&stall).is_ok() {
            std::fs::write(self.dir.join(format!("stalled-{}", self.worker)), "").unwrap();
            std::thread::sleep(Duration::from_secs(120));
        }
        let pace = std::fs::read_to_string(self.dir.join("pace-ms"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40);
        std::thread::sleep(Duration::from_millis(pace));
        Ok(())
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ElasticTrained {
    trained: Trained,
    recoveries: usize,
}

/// A worker process of the elastic test: 1 replica, loss detected within about a second.
#[test]
fn keras_elastic_worker_process() {
    mwms_support::run_if_worker_process(|mut config| {
        config.transport.idle_timeout = Duration::from_millis(800);
        config.transport.keep_alive_interval = Duration::from_millis(200);
        config.group.form_timeout = Duration::from_secs(5);
        let strategy = MultiWorkerMirrored::new(config).unwrap();
        let worker = strategy.worker_index();
        let out = PathBuf::from(std::env::var(mwms_support::CHILD_OUT_ENV).unwrap());
        let dir = out.parent().unwrap().to_path_buf();
        let (x, y) = blobs(EXAMPLES, 1);
        let data = Dataset::from_tensor_slices(vec![x, y])
            .unwrap()
            .shuffle(EXAMPLES, 42)
            .batch(48, true);
        // The lazy case: every worker builds its network on its first batch, the restarted
        // one as it joins (it takes the group's variables at its first step boundary).
        if dir.join("lazy").exists() {
            let model = compile(Model::new(strategy, 11, LazyNet::new).unwrap());
            return elastic_fit(model, &data, dir, worker);
        }
        elastic_fit(compiled(strategy, 16, 0.1), &data, dir, worker)
    });
}

/// The elastic test's `fit` of `model` on `data` in a worker process.
fn elastic_fit<N: ModuleT + Send + Sync + 'static>(
    mut model: Model<N>,
    data: &Dataset,
    dir: PathBuf,
    worker: usize,
) -> ElasticTrained {
    let history = model
        .fit(
            data,
            Fit::epochs(ELASTIC_EPOCHS)
                .steps_per_epoch(ELASTIC_STEPS_PER_EPOCH)
                .validation_data(validation_data())
                .verbose(false)
                .callback(decaying_rate())
                .callback(BackupAndRestore::new(dir.join("backup")).save_freq(SaveFreq::Steps(10)))
                .callback(Pace { dir, worker }),
        )
        .unwrap();
    ElasticTrained {
        trained: trained(&model, &history),
        recoveries: history.recoveries,
    }
}

fn read_step(dir: &Path, worker: usize) -> u64 {
    std::fs::read_to_string(dir.join(format!("step-{worker}")))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Three workers `fit` under MultiWorkerMirrored; worker 2 is SIGKILLed mid-epoch, the other
/// two re-form and go on, and worker 2 started again joins them: every worker ends at the
/// exact step with the same bits, and the model still learns.
#[test]
fn fit_survives_a_sigkilled_worker_and_takes_it_back_when_it_restarts() {
    elastic_case("keras-elastic", 2, false, ELASTIC_KILL_AT);
}

/// As above with worker 2 killed after the last step of the first epoch: the others lose it
/// while they validate that epoch, re-form, and go on with the data distributed over the
/// group they re-formed (two workers' slices of each global batch, not three).
#[test]
fn fit_survives_a_worker_lost_during_validation() {
    elastic_case(
        "keras-elastic-validation",
        2,
        false,
        ELASTIC_STEPS_PER_EPOCH as u64,
    );
}

/// As above with a network whose layers are built on their first call: every worker builds
/// it on its first batch, and the restarted worker, joining the live group, builds its own
/// before taking the group's variables.
#[test]
fn fit_builds_a_lazy_network_on_a_restarted_worker_that_joins() {
    elastic_case("keras-elastic-lazy", 2, true, ELASTIC_KILL_AT);
}

/// As above with the chief (worker 0, the group's rank 0 and the one that backs up) killed:
/// the other two re-form under a new rank 0, and the restarted chief joins them.
#[test]
fn fit_survives_a_sigkilled_chief_and_takes_it_back_when_it_restarts() {
    elastic_case("keras-elastic-chief", 0, false, ELASTIC_KILL_AT);
}

/// As above with the restarted worker joining two epochs after it was lost (the group's rate
/// then made twice since it last held it): it takes the group's rate with the state, rather
/// than running the schedule again from its optimizer's own. The workers step more slowly
/// (100 ms) so that it joins before the end.
#[test]
fn a_worker_that_joins_epochs_later_takes_the_groups_learning_rate() {
    let case = ElasticCase {
        respawn_at: 2 * ELASTIC_STEPS_PER_EPOCH as u64 + 2,
        pace_ms: 100,
        ..ElasticCase::new("keras-elastic-rate", 2, ELASTIC_KILL_AT)
    };
    case.run();
}

fn elastic_case(name: &str, victim: usize, lazy: bool, stall_at: u64) {
    ElasticCase {
        lazy,
        ..ElasticCase::new(name, victim, stall_at)
    }
    .run();
}

/// One elastic test: `victim` stalls at `stall_at` and is SIGKILLed, the survivors train on to
/// `respawn_at`, and the victim starts again and joins.
struct ElasticCase<'a> {
    name: &'a str,
    victim: usize,
    lazy: bool,
    stall_at: u64,
    respawn_at: u64,
    /// Each step's pause on every worker.
    pace_ms: u64,
}

impl<'a> ElasticCase<'a> {
    fn new(name: &'a str, victim: usize, stall_at: u64) -> Self {
        Self {
            name,
            victim,
            lazy: false,
            stall_at,
            respawn_at: stall_at + 5,
            pace_ms: 40,
        }
    }

    fn run(self) {
        let ElasticCase {
            name,
            victim,
            lazy,
            stall_at,
            respawn_at,
            pace_ms,
        } = self;
        let total = (ELASTIC_EPOCHS * ELASTIC_STEPS_PER_EPOCH) as u64;
        let mut workers = mwms_support::WorkerProcesses::start_with(
            name,
            3,
            "keras_elastic_worker_process",
            |dir| {
                std::fs::write(dir.join(format!("stall-{victim}")), "").unwrap();
                std::fs::write(dir.join("stall-at"), stall_at.to_string()).unwrap();
                std::fs::write(dir.join("pace-ms"), pace_ms.to_string()).unwrap();
                if lazy {
                    std::fs::write(dir.join("lazy"), "").unwrap();
                }
            },
        );
        let dir = workers.dir().to_path_buf();
        wait_for("the victim's stall", Duration::from_secs(60), || {
            dir.join(format!("stalled-{victim}")).exists()
        });
        workers.kill(victim);
        let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
        // The survivors re-form and train on; then the victim comes back.
        wait_for("the survivors' progress", Duration::from_secs(60), || {
            survivors.iter().all(|&i| read_step(&dir, i) >= respawn_at)
        });
        assert!(
            read_step(&dir, survivors[0]) < total - 10,
            "the survivors finished before the restart"
        );
        workers.spawn(victim);
        let results: Vec<ElasticTrained> = workers.wait();
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.trained.step, total, "worker {i}'s step count");
            // The schedule ran once an epoch on the group, whoever joined when.
            let last_rate = (1..ELASTIC_EPOCHS).fold(0.02f32, |rate, _| rate * 0.7);
            assert_eq!(
                r.trained.learning_rate.last().map(|r| *r as f32),
                Some(last_rate),
                "worker {i}'s rate in the last epoch: {:?}",
                r.trained.learning_rate
            );
            assert_eq!(
                r.trained.weights, results[0].trained.weights,
                "worker {i} ends elsewhere"
            );
            // The last epoch's figures are the group's, whoever joined in it.
            assert_eq!(
                r.trained.loss.last(),
                results[0].trained.loss.last(),
                "worker {i}'s loss in the last epoch"
            );
            let accuracy = r.trained.val_accuracy.last().copied().unwrap_or(f64::NAN);
            assert!(
                accuracy > 0.9,
                "worker {i}: validation accuracy {:?}",
                r.trained.val_accuracy
            );
        }
        if stall_at % ELASTIC_STEPS_PER_EPOCH as u64 == 0 {
            // Lost at an epoch's end: the survivors lost the victim in that epoch's validation,
            // which then has no figures (they re-formed instead of validating again).
            for &i in &survivors {
                assert_eq!(
                    results[i].trained.val_accuracy.len(),
                    ELASTIC_EPOCHS - 1,
                    "worker {i}'s validation figures: {:?}",
                    results[i].trained.val_accuracy
                );
            }
        }
        assert!(
            survivors.iter().all(|&i| results[i].recoveries >= 1),
            "{:?}",
            results.iter().map(|r| r.recoveries).collect::<Vec<_>>()
        );
        assert!(
            !dir.join("backup").exists(),
            "the backup outlived a finished fit"
        );
    }
}

/// A backup of another model (a layer of another width) is refused when `fit` would resume
/// from it, naming the variable and both shapes, before any variable changes.
#[test]
fn a_backup_of_another_model_is_refused_naming_the_variable() {
    let dir = scratch("backup-mismatch");
    let backup = dir.join("backup");
    let mut narrow = compiled(DefaultStrategy::new(), 16, 0.0);
    narrow
        .fit(
            &train_data(),
            Fit::epochs(1)
                .verbose(false)
                .callback(BackupAndRestore::new(&backup).delete_checkpoint(false)),
        )
        .unwrap();
    assert!(backup.exists());
    let mut wide = compiled(DefaultStrategy::new(), 24, 0.0);
    let before = wide.evaluate(&validation_data()).unwrap();
    let err = wide
        .fit(
            &train_data(),
            Fit::epochs(2)
                .verbose(false)
                .callback(BackupAndRestore::new(&backup)),
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KerasError::Backup { .. }), "{err:?}");
    assert!(
        text.contains("hidden.weight") && text.contains("[16, 8]") && text.contains("[24, 8]"),
        "{text}"
    );
    assert_eq!(wide.evaluate(&validation_data()).unwrap(), before);
    assert!(backup.exists(), "the refused backup was deleted");
    let _ = std::fs::remove_dir_all(&dir);
}
