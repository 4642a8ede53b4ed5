//! `keras::PsFit`: Keras' `fit` under ParameterServerStrategy, over real processes (a chief,
//! 2 parameter servers and 2 workers on 127.0.0.1): a candle-nn classifier trains to its
//! target with validation, every closure applied once, with a worker, a parameter server or
//! the chief SIGKILLed midway. The fault is tied to progress, not to time: at step
//! [`FAULT_AT`] the chief writes a marker and waits; the test kills the victim (whose PID it
//! wrote at start) and then lets the chief go on. With several steps per closure (Keras'
//! `steps_per_execution`), a worker kills itself inside a closure, after its first update.

mod keras_support;
mod ps_support;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use cohort::candle::{Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::cluster::{TaskId, TaskType};
use cohort::data::{DataError, Dataset, InputContext};
use cohort::keras::callbacks::{
    BackupAndRestore, Callback, EarlyStopping, Mode, ModelCheckpoint, SaveFreq, TrainingContext,
};
use cohort::keras::{metrics, Fit, KerasError, Logs, Loss, Model, PsFit};
use cohort::nn::{layer_norm, LayerNorm};
use cohort::optim::Optimizer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program};
use cohort::strategy::DefaultStrategy;
use cohort::train::LearningRateSchedule;
use cohort::variable::Partitioner;
use nix::sys::signal::Signal;
use ps_support::{
    beside, ledger_and_stats, ps_counter, signal, wait_for_file, wait_for_pid, write_report, Run,
};

use keras_support::{CLASSES, FEATURES};
const STEPS_PER_EPOCH: usize = 30;
const EPOCHS: usize = 3;
const VALIDATION_STEPS: usize = 3;
/// The step at which the scenario's victim (`worker`, `ps` or `chief`) is killed.
const FAULT_AT: u64 = 30;
/// The step at which the scenario `rate` kills its parameter server: inside the second epoch,
/// the first at the rate the `LearningRateScheduler` set.
const RATE_FAULT_AT: u64 = 45;

/// The step at which the scenarios `ps-early` and `chief-early` kill their victim: before the
/// first scheduled backup (every 10 steps).
const EARLY_FAULT_AT: u64 = 4;

/// The steps at which the scenarios `rate-chief` and `rate-chief-boundary` kill the chief: in
/// the third epoch, after its step-70 backup (inside the epoch) and after the step-60 one
/// (its start).
const RATE_CHIEF_FAULT_AT: u64 = 75;
const RATE_CHIEF_BOUNDARY_FAULT_AT: u64 = 62;

/// The step at which this run's victim is killed.
fn fault_at() -> u64 {
    match ps_support::scenario().as_str() {
        "rate" => RATE_FAULT_AT,
        "rate-chief" => RATE_CHIEF_FAULT_AT,
        "rate-chief-boundary" => RATE_CHIEF_BOUNDARY_FAULT_AT,
        "ps-early" | "chief-early" => EARLY_FAULT_AT,
        _ => FAULT_AT,
    }
}
/// In the run's directory: the victim's PID, the chief's marker, the test's answer.
const VICTIM_PID: &str = "victim.pid";
const MIDWAY: &str = "midway";
const FAULT_DONE: &str = "fault-done";

struct Net {
    hidden: Linear,
    norm: LayerNorm,
    out: Linear,
}

fn net(vb: VarBuilder<'static>) -> cohort::candle::Result<Net> {
    Ok(Net {
        hidden: candle_nn::linear(FEATURES, 16, vb.pp("hidden"))?,
        norm: layer_norm(16, 1e-5, vb.pp("norm"))?,
        out: candle_nn::linear(16, CLASSES, vb.pp("out"))?,
    })
}

impl ModuleT for Net {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let h = self.norm.forward(&self.hidden.forward(xs)?.relu()?)?;
        self.out.forward(&h)
    }
}

/// The shared blobs as a dataset.
fn blobs(examples: usize, seed: u64) -> Result<Dataset, DataError> {
    let (x, y) = keras_support::blobs(examples, seed)?;
    Dataset::from_tensor_slices(vec![x, y])
}

/// Steps per closure in the scenario [`KILLED_INSIDE_A_CLOSURE`].
const STEPS_PER_EXECUTION: u32 = 4;
/// The scenario: closures of [`STEPS_PER_EXECUTION`] steps, and worker 1 SIGKILLs itself as it
/// reads its 10th batch. Its closures are of 4 or 2 steps, so that batch is never a closure's
/// first: the closure's first update has been applied.
const KILLED_INSIDE_A_CLOSURE: &str = "killed-inside-a-closure";

/// Each worker's batches of 32, its own shard, repeated; slowed to 20 ms a batch so that a
/// fault lands midway.
fn train_data(ctx: &InputContext) -> Result<Dataset, DataError> {
    let data = blobs(384, 1)?
        .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        .shuffle(384, 7 + ctx.input_pipeline_id as u64)
        .repeat(None)
        .batch(32, true);
    let kills_itself =
        ps_support::scenario() == KILLED_INSIDE_A_CLOSURE && ctx.input_pipeline_id == 1;
    let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
    data.map(move |element| {
        std::thread::sleep(Duration::from_millis(20));
        let count = read.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        // Once per run (the restarted process finds the claim).
        if kills_itself
            && count == 10
            && std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(ps_support::child_dir().join("self-kill.claim"))
                .is_ok()
        {
            signal(std::process::id(), Signal::SIGKILL);
        }
        Ok(element)
    })
}

fn validation_data(_ctx: &InputContext) -> Result<Dataset, DataError> {
    Ok(blobs(96, 2)?.repeat(None).batch(32, true))
}

fn ps_fit() -> Arc<PsFit<Net>> {
    Arc::new(
        PsFit::new(
            11,
            net,
            Optimizer::adam(0.02),
            Loss::sparse_categorical_crossentropy(),
            vec![Box::new(metrics::Accuracy::sparse_categorical())],
            "train",
        )
        .validation_data("validation")
        .steps_per_execution(if ps_support::scenario() == KILLED_INSIDE_A_CLOSURE {
            STEPS_PER_EXECUTION
        } else {
            1
        })
        .learning_rate_schedule(schedule())
        // The output layer by its own optimizer (a name scope's), its rate on its own
        // schedule: restored with its own slots and update counts when a server or the chief
        // is lost.
        .optimizer_for_scheduled("out", Optimizer::adagrad(0.05), out_schedule())
        // The hidden layer's kernel split over both servers.
        .partitioner(|name, _| {
            (name == "hidden.weight").then_some(Partitioner::FixedShards { num_shards: 2 })
        }),
    )
}

/// The servers' rate: a warm-up, then a cosine decay to zero at the last step.
fn schedule() -> LearningRateSchedule {
    LearningRateSchedule::cosine_decay(0.005, (EPOCHS * STEPS_PER_EPOCH - 10) as u64)
        .with_warmup(0.03, 10)
}

/// The output layer's own rate: an exponential decay of Adagrad's.
fn out_schedule() -> LearningRateSchedule {
    LearningRateSchedule::ExponentialDecay {
        initial: 0.05,
        decay_steps: STEPS_PER_EPOCH as u64,
        decay_rate: 0.8,
        staircase: true,
    }
}

/// The task the scenario kills.
fn victim() -> Option<TaskId> {
    match ps_support::scenario().as_str() {
        "worker" => Some(TaskId::new(TaskType::Worker, 1)),
        "ps" | "rate" | "ps-early" => Some(TaskId::new(TaskType::Ps, 0)),
        "chief" | "chief-early" | "rate-chief" | "rate-chief-boundary" => {
            Some(TaskId::new(TaskType::Chief, 0))
        }
        _ => None,
    }
}

/// At [`fault_at`], once per run, the chief says so and waits for the test's fault.
struct Midway;

impl Callback for Midway {
    fn on_train_batch_end(
        &mut self,
        step: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if step != fault_at() || victim().is_none() {
            return Ok(());
        }
        let dir = ps_support::child_dir();
        let first = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join("midway.claim"))
            .is_ok();
        if first {
            let _ = ps_support::write_atomic(&dir.join(MIDWAY), b"1");
            ps_support::wait_for_file(&dir.join(FAULT_DONE), &AtomicBool::new(false));
        }
        Ok(())
    }
}

fn program() -> Program {
    // The victim says who it is, for the test to kill it at the chief's marker.
    let me = cohort::cluster::ClusterConfig::from_env()
        .ok()
        .flatten()
        .map(|c| c.task);
    if me.is_some() && me == victim() {
        let pid = format!("{} victim", std::process::id());
        let _ = ps_support::write_atomic(&ps_support::child_dir().join(VICTIM_PID), pid.as_bytes());
    }
    match ps_support::scenario().as_str() {
        "rows" => return rows::program(),
        "rate" | "rate-chief" | "rate-chief-boundary" => return rate::program(),
        _ => {}
    }
    let fit = ps_fit();
    fit.register(
        Program::new("keras-ps")
            .dataset("train", train_data)
            .dataset("validation", validation_data),
    )
    .chief(chief)
}

fn chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    let backup = ps_support::child_dir().join("backup");
    let best = ps_support::child_dir().join("best.safetensors");
    let every = ps_support::child_dir().join("epoch-{epoch}.safetensors");
    let history = ps_fit()
        .fit(
            coordinator,
            Fit::epochs(EPOCHS)
                .steps_per_epoch(STEPS_PER_EPOCH)
                .validation_steps(VALIDATION_STEPS)
                .verbose(false)
                .callback(Midway)
                .callback(
                    ModelCheckpoint::new(best.display().to_string()).save_best_only("val_accuracy"),
                )
                .callback(ModelCheckpoint::new(every.display().to_string()))
                // "Best" is the highest validation loss, so that restoring it changes the
                // servers' weights: EarlyStopping writes it to them at the end.
                .callback(
                    EarlyStopping::new("val_loss")
                        .mode(Mode::Max)
                        .patience(EPOCHS)
                        .restore_best_weights(true),
                )
                .callback(
                    BackupAndRestore::new(&backup)
                        .save_freq(SaveFreq::Steps(10))
                        .delete_checkpoint(false),
                ),
        )
        .map_err(CoordinatorError::other)?;
    let mut report = ledger_and_stats(coordinator)?;
    report["step"] = serde_json::json!(history.step);
    report["resumed_at"] = serde_json::json!(history.resumed_at);
    report["loss"] = serde_json::json!(history.get("loss"));
    report["val_accuracy"] = serde_json::json!(history.get("val_accuracy"));
    report["learning_rate"] = serde_json::json!(history.get("learning_rate"));
    report["saved_accuracy"] =
        serde_json::json!(saved_accuracy(&best).map_err(CoordinatorError::other)?);
    // The servers' weights now, against the files of the epoch EarlyStopping restored and of
    // the last epoch.
    let val_loss = history.get("val_loss");
    let worst = (0..val_loss.len())
        .max_by(|&a, &b| val_loss[a].total_cmp(&val_loss[b]).then(b.cmp(&a)))
        .unwrap_or(0);
    let file = |i: usize| {
        let epoch = history.epoch_numbers[i] + 1;
        std::path::PathBuf::from(
            every
                .display()
                .to_string()
                .replace("{epoch}", &epoch.to_string()),
        )
    };
    let on_servers = servers_weights(coordinator)?;
    let differs = |path: std::path::PathBuf| -> Result<f32, CoordinatorError> {
        let saved = file_weights(&path).map_err(CoordinatorError::other)?;
        Ok(largest_difference(&saved, &on_servers))
    };
    report["restored_vs_its_epoch"] = serde_json::json!(differs(file(worst))?);
    report["restored_vs_last_epoch"] = serde_json::json!(differs(file(val_loss.len() - 1))?);
    report["restored_is_last"] = serde_json::json!(worst == val_loss.len() - 1);
    write_report(&report)
}

/// Every variable's values in a weights file `ModelCheckpoint` wrote, by name.
fn file_weights(path: &std::path::Path) -> Result<Vec<(String, Vec<f32>)>, KerasError> {
    let mut model = Model::new(DefaultStrategy::new(), 11, net)?;
    model.load(path)?;
    model
        .variables()
        .iter()
        .map(|v| {
            Ok((
                v.name().to_owned(),
                v.read_value().flatten_all()?.to_vec1::<f32>()?,
            ))
        })
        .collect()
}

/// Every variable's values on the servers, by name.
fn servers_weights(
    coordinator: &ClusterCoordinator,
) -> Result<Vec<(String, Vec<f32>)>, CoordinatorError> {
    coordinator
        .layouts()
        .iter()
        .map(|l| Ok((l.name.clone(), coordinator.read_variable(&l.name)?)))
        .collect()
}

/// The largest absolute difference between two sets of weights by name (infinite where a
/// name or a length differs).
fn largest_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    a.iter()
        .map(|(name, values)| match b.iter().find(|(n, _)| n == name) {
            Some((_, other)) if other.len() == values.len() => values
                .iter()
                .zip(other)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max),
            _ => f32::INFINITY,
        })
        .fold(0.0, f32::max)
}

/// The validation accuracy of the weights `ModelCheckpoint` saved on the chief, loaded into a
/// model of one process.
fn saved_accuracy(path: &std::path::Path) -> Result<f64, KerasError> {
    let mut model = Model::new(DefaultStrategy::new(), 11, net)?;
    model.compile(
        Optimizer::sgd(0.0),
        Loss::sparse_categorical_crossentropy(),
        vec![Box::new(metrics::Accuracy::sparse_categorical())],
    );
    model.load(path)?;
    let logs = model.evaluate(&blobs(96, 2)?.batch(32, true))?;
    Ok(logs.get("accuracy").unwrap_or(f64::NAN))
}

#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// What every run must show: the exact step count, every training and validation closure
/// committed once and applied once on each server, and a model that learnt.
fn check(report: &serde_json::Value, what: &str) {
    check_closures(report, what, (EPOCHS * STEPS_PER_EPOCH) as u64)
}

/// [`check`], where training ran in `training_closures` closures.
fn check_closures(report: &serde_json::Value, what: &str, training_closures: u64) {
    let total = (EPOCHS * STEPS_PER_EPOCH) as u64;
    assert_eq!(report["step"], total, "{what}: {report}");
    let closures = training_closures + (EPOCHS * VALIDATION_STEPS) as u64;
    let ledger = &report["ledger"];
    assert_eq!(ledger["committed"], closures, "{what}: LEDGER-1: {ledger}");
    assert_eq!(ledger["balances"], true, "{what}: {ledger}");
    let losses: Vec<f64> = serde_json::from_value(report["loss"].clone()).unwrap();
    assert!(
        losses.last().unwrap() < &losses[0],
        "{what}: the loss did not fall: {losses:?}"
    );
    let accuracy: Vec<f64> = serde_json::from_value(report["val_accuracy"].clone()).unwrap();
    assert!(
        *accuracy.last().unwrap() > 0.9,
        "{what}: validation accuracy {accuracy:?}"
    );
    // The chief's ModelCheckpoint saved the servers' weights of its best epoch.
    let saved = report["saved_accuracy"].as_f64().unwrap_or(f64::NAN);
    assert!(
        saved > 0.9,
        "{what}: the saved weights' accuracy is {saved}"
    );
    // EarlyStopping's restored epoch is on the servers, to the bit (and it is not the last
    // epoch's, where the two differ).
    assert_eq!(report["restored_vs_its_epoch"], 0.0, "{what}: {report}");
    if report["restored_is_last"] == false {
        assert!(
            report["restored_vs_last_epoch"].as_f64().unwrap() > 0.0,
            "{what}: the last epoch's weights are still on the servers: {report}"
        );
    }
    // Each epoch logs the servers' scheduled rate at its last step.
    let rates: Vec<f64> = serde_json::from_value(report["learning_rate"].clone()).unwrap();
    let epochs_logged = rates.len();
    for (i, rate) in rates.iter().enumerate() {
        let epoch = EPOCHS - epochs_logged + i;
        let step = ((epoch + 1) * STEPS_PER_EPOCH) as u64;
        assert!(
            (rate - f64::from(schedule().at(step))).abs() < 1e-7,
            "{what}: epoch {epoch} logs rate {rate}, the schedule gives {}",
            schedule().at(step)
        );
    }
}

/// An optimizer `PsFit` gives a name scope (and its schedule) reaches the servers through the program it
/// registers on (`tests/candle_models.rs` trains a table under its own optimizer over
/// processes); `fit`'s optimizer serves the rest.
#[test]
fn a_scopes_optimizer_is_registered_for_the_servers() {
    let fit = Arc::new(
        PsFit::new(
            11,
            net,
            Optimizer::adam(0.02),
            Loss::sparse_categorical_crossentropy(),
            vec![],
            "train",
        )
        .optimizer_for("hidden", Optimizer::adagrad(0.1))
        .optimizer_for_scheduled("out", Optimizer::sgd(0.1), out_schedule()),
    );
    let program = fit.register(Program::new("scoped"));
    assert_eq!(program.ps_optimizer(), &Optimizer::adam(0.02));
    let scopes = program.ps_optimizer_scopes();
    assert_eq!(
        scopes.scoped("hidden.weight/part_1"),
        Some((&Optimizer::adagrad(0.1), None))
    );
    let out = out_schedule();
    assert_eq!(
        scopes.scoped("out.bias"),
        Some((&Optimizer::sgd(0.1), Some(&out)))
    );
    assert_eq!(scopes.of("head.weight"), None);
}

#[test]
fn fit_trains_a_candle_model_on_the_parameter_servers() {
    let run = Run::new("keras-ps", "", &[]);
    let report = run.launch();
    check(&report, "fault-free");
    // PS-1: every training closure pushed once to each server.
    assert_eq!(
        ps_counter(&report, "applied"),
        [(EPOCHS * STEPS_PER_EPOCH) as u64; 2],
        "{report}"
    );
}

/// Runs the scenario killing `victim` at [`FAULT_AT`]; the chief's report.
fn run_with_fault(
    name: &str,
    scenario: &str,
    victim: TaskId,
    restart_chief: bool,
) -> serde_json::Value {
    let mut run = Run::new(name, scenario, &[]);
    run.restart_chief = restart_chief;
    let dir = run.dir.clone();
    let what = scenario.to_owned();
    let fault = beside(move |cancel| {
        if !wait_for_file(&dir.join(MIDWAY), &cancel) {
            return;
        }
        if let Some(pid) = wait_for_pid(&dir.join(VICTIM_PID), &cancel) {
            signal(pid, Signal::SIGKILL);
            eprintln!("[test] SIGKILL {what} pid {pid} at its fault step");
        }
        let _ = std::fs::write(dir.join(FAULT_DONE), b"1");
    });
    let (code, exits) = run.launch_with_exits(&[]);
    fault.finish();
    assert_eq!(code, 0, "the chief failed; its log is above");
    assert!(
        exits
            .iter()
            .any(|e| e.task == victim && e.signal == Some(9)),
        "{victim} was not killed: {exits:?}"
    );
    run.report()
}

#[test]
fn fit_goes_on_when_a_worker_is_killed_midway() {
    let victim = TaskId::new(TaskType::Worker, 1);
    let report = run_with_fault("keras-ps-worker", "worker", victim, false);
    check(&report, "a worker killed");
    assert_eq!(
        ps_counter(&report, "applied"),
        [(EPOCHS * STEPS_PER_EPOCH) as u64; 2],
        "PS-1: {report}"
    );
}

/// Closures of several steps (Keras' `steps_per_execution`), a worker SIGKILLed inside one
/// after its first update: the closure runs again on the other worker, which has that update
/// refused as a duplicate and applies the rest, so every step's update is applied exactly once
/// on each server (PS-1) and the step count is exact.
#[test]
fn steps_per_execution_applies_each_step_once_when_a_worker_dies_inside_a_closure() {
    let run = Run::new("keras-ps-spe", KILLED_INSIDE_A_CLOSURE, &[]);
    let (code, exits) = run.launch_with_exits(&[]);
    assert_eq!(code, 0, "the chief failed; its log is above");
    let victim = TaskId::new(TaskType::Worker, 1);
    assert!(
        exits
            .iter()
            .any(|e| e.task == victim && e.signal == Some(9)),
        "{victim} did not kill itself: {exits:?}"
    );
    let report = run.report();
    // Backups every 10 steps cut each epoch's 30 steps into closures of 4, 4 and 2 steps.
    let per_epoch = 3 * (10u64.div_ceil(u64::from(STEPS_PER_EXECUTION)));
    check_closures(
        &report,
        "killed inside a closure",
        EPOCHS as u64 * per_epoch,
    );
    assert_eq!(
        ps_counter(&report, "applied"),
        [(EPOCHS * STEPS_PER_EPOCH) as u64; 2],
        "PS-1: one update per step on each server: {report}"
    );
    assert!(
        ps_counter(&report, "rejected_duplicate")
            .iter()
            .all(|&d| d >= 1),
        "the closure run again had its first update refused as applied already: {report}"
    );
}

#[test]
fn fit_goes_on_when_a_parameter_server_is_killed_midway() {
    let victim = TaskId::new(TaskType::Ps, 0);
    let report = run_with_fault("keras-ps-server", "ps", victim, false);
    check(&report, "a parameter server killed");
}

/// A parameter server SIGKILLed before the first scheduled backup: `fit` saved one of the
/// variables as created before the first step, so the server is restored from it (every
/// server rolled back, the steps since run again) and every step is still applied once.
#[test]
fn fit_goes_on_when_a_parameter_server_is_killed_before_the_first_backup() {
    let victim = TaskId::new(TaskType::Ps, 0);
    let report = run_with_fault("keras-ps-server-early", "ps-early", victim, false);
    check(&report, "a parameter server killed before the first backup");
}

/// The chief SIGKILLed before the first scheduled backup, over servers that applied steps: the
/// restarted chief resumes from the backup `fit` saved before the first step.
#[test]
fn a_chief_killed_before_the_first_backup_resumes_from_the_start() {
    let victim = TaskId::new(TaskType::Chief, 0);
    let report = run_with_fault("keras-ps-chief-early", "chief-early", victim, true);
    check_resumed(&report, 0, "the backup before the first step");
}

/// A restarted chief's run: it resumed at step `at` (`what` backup), ran exactly the steps
/// left, and its model reached its target.
fn check_resumed(report: &serde_json::Value, at: u64, what: &str) {
    let resumed = report["resumed_at"]
        .as_u64()
        .unwrap_or_else(|| panic!("no resume: {report}"));
    assert_eq!(resumed, at, "{what}");
    assert_eq!(
        report["step"],
        (EPOCHS * STEPS_PER_EPOCH) as u64,
        "{report}"
    );
    let accuracy: Vec<f64> = serde_json::from_value(report["val_accuracy"].clone()).unwrap();
    assert!(
        *accuracy.last().unwrap() > 0.9,
        "validation accuracy {accuracy:?}"
    );
}

/// The chief SIGKILLed midway and restarted: it resumes from the newest backup at its step
/// and runs exactly the steps left.
#[test]
fn a_restarted_chief_resumes_fit_from_its_backup() {
    let victim = TaskId::new(TaskType::Chief, 0);
    let report = run_with_fault("keras-ps-chief", "chief", victim, true);
    // Killed inside step 30's callbacks, before that step's backup: the newest is step 20's.
    check_resumed(&report, FAULT_AT - 10, "the newest backup (every 10 steps)");
}

/// `PsFit::read_rows`: an embedding bag whose table is split over both servers and read by
/// rows. The ids of the training data never reach the table's last [`rows::UNSEEN`] rows, and
/// the optimizer decays weights (AdamW): a dense push would decay those rows every step, a
/// push of the batch's rows leaves them exactly as they were drawn.
mod rows {
    use super::*;
    use cohort::candle::D;
    use cohort::candle_nn::Embedding;
    use cohort::nn::ModelVariables;

    const VOCAB: usize = 60;
    pub const UNSEEN: usize = 9;
    const TOKENS: usize = 4;
    const WIDTH: usize = 8;
    const SEED: u64 = 5;

    pub struct Bag {
        embedding: Embedding,
        out: Linear,
    }

    fn bag(vb: VarBuilder<'static>) -> cohort::candle::Result<Bag> {
        Ok(Bag {
            embedding: candle_nn::embedding(VOCAB, WIDTH, vb.pp("embedding"))?,
            out: candle_nn::linear(WIDTH, CLASSES, vb.pp("out"))?,
        })
    }

    impl ModuleT for Bag {
        fn forward_t(&self, ids: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
            self.out
                .forward(&self.embedding.forward(ids)?.mean(D::Minus2)?)
        }
    }

    /// Examples of class `c` hold only ids `v` with `v % CLASSES == c`, below the unseen rows.
    fn bags(examples: usize, seed: u64) -> Result<Dataset, DataError> {
        let seen = (VOCAB - UNSEEN) as u64;
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ids, mut labels) = (Vec::new(), Vec::new());
        for e in 0..examples {
            let class = (e % CLASSES) as u64;
            for _ in 0..TOKENS {
                let v = (next() % (seen / CLASSES as u64)) * CLASSES as u64 + class;
                ids.push(v as u32);
            }
            labels.push(class as u32);
        }
        let cpu = &cohort::candle::Device::Cpu;
        Dataset::from_tensor_slices(vec![
            Tensor::from_vec(ids, (examples, TOKENS), cpu)?,
            Tensor::from_vec(labels, examples, cpu)?,
        ])
    }

    fn train_data(ctx: &InputContext) -> Result<Dataset, DataError> {
        Ok(bags(300, 1 + ctx.input_pipeline_id as u64)?
            .repeat(None)
            .batch(16, true))
    }

    fn validation_data(_ctx: &InputContext) -> Result<Dataset, DataError> {
        Ok(bags(96, 99)?.repeat(None).batch(32, true))
    }

    fn ps_fit() -> Arc<PsFit<Bag>> {
        Arc::new(
            PsFit::new(
                SEED,
                bag,
                Optimizer::adamw(0.05, 0.1),
                Loss::sparse_categorical_crossentropy(),
                vec![Box::new(metrics::Accuracy::sparse_categorical())],
                "train",
            )
            .validation_data("validation")
            .read_rows(&["embedding.weight"])
            .partitioner(|name, _| {
                (name == "embedding.weight").then_some(Partitioner::FixedShards { num_shards: 2 })
            }),
        )
    }

    pub fn program() -> Program {
        ps_fit()
            .register(
                Program::new("keras-ps-rows")
                    .dataset("train", train_data)
                    .dataset("validation", validation_data),
            )
            .chief(chief)
    }

    fn chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
        let history = ps_fit()
            .fit(
                coordinator,
                Fit::epochs(2)
                    .steps_per_epoch(30)
                    .validation_steps(3)
                    .verbose(false),
            )
            .map_err(CoordinatorError::other)?;
        let initial = ModelVariables::new(SEED);
        bag(initial.var_builder(0)).map_err(CoordinatorError::other)?;
        let drawn = initial
            .get("embedding.weight")
            .expect("the bag has a table")
            .read_value()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(CoordinatorError::other)?;
        let mut report = ledger_and_stats(coordinator)?;
        report["initial"] = serde_json::json!(drawn);
        report["trained"] = serde_json::json!(coordinator.read_variable("embedding.weight")?);
        report["val_accuracy"] = serde_json::json!(history.get("val_accuracy"));
        write_report(&report)
    }

    /// The table's rows `range`, `WIDTH` values each, from a flat report array.
    pub fn rows_of(
        report: &serde_json::Value,
        key: &str,
        range: std::ops::Range<usize>,
    ) -> Vec<f32> {
        let all: Vec<f32> = serde_json::from_value(report[key].clone()).unwrap();
        all[range.start * WIDTH..range.end * WIDTH].to_vec()
    }

    pub const SEEN: std::ops::Range<usize> = 0..VOCAB - UNSEEN;
    pub const NEVER_SEEN: std::ops::Range<usize> = VOCAB - UNSEEN..VOCAB;
}

#[test]
fn fit_reads_and_pushes_only_the_rows_of_a_table_its_batches_touch() {
    let run = Run::new("keras-ps-rows", "rows", &[]);
    let report = run.launch();
    let accuracy: Vec<f64> = serde_json::from_value(report["val_accuracy"].clone()).unwrap();
    assert!(
        *accuracy.last().unwrap() > 0.9,
        "validation accuracy {accuracy:?}"
    );
    assert_eq!(report["ledger"]["committed"], 2 * 30 + 2 * 3, "{report}");
    // Rows no batch touched kept their drawn values to the bit, through 60 AdamW steps with
    // weight decay; the rest trained.
    assert_eq!(
        rows::rows_of(&report, "trained", rows::NEVER_SEEN),
        rows::rows_of(&report, "initial", rows::NEVER_SEEN),
        "a row no batch read was changed: the table was pushed whole"
    );
    assert_ne!(
        rows::rows_of(&report, "trained", rows::SEEN),
        rows::rows_of(&report, "initial", rows::SEEN)
    );
}

/// `LearningRateScheduler` under ParameterServerStrategy: the chief sets the rate between
/// epochs and the servers apply each closure at the rate it was scheduled with, also after a
/// server is lost and restored from a backup and the closures since run again.
mod rate {
    use super::*;
    use cohort::keras::callbacks::LearningRateScheduler;
    use cohort::nn::ModelVariables;

    /// The optimizer's own rate, that of the first epoch; the scheduler sets 0 after it (or,
    /// in the `rate-chief` scenarios, halves the rate before at each epoch's start).
    pub const FIRST_RATE: f32 = 0.05;
    pub const HALVING: f32 = 0.5;

    /// The examples an epoch's figures count: every one of its steps', whoever ran them and
    /// whenever the chief resumed.
    #[derive(Debug)]
    struct Examples;

    impl metrics::Metric for Examples {
        fn name(&self) -> &str {
            "examples"
        }
        fn state_len(&self) -> usize {
            1
        }
        fn batch_state(
            &self,
            _labels: &Tensor,
            _predictions: &Tensor,
            weights: &[f32],
        ) -> Result<Vec<f64>, cohort::nn::NnError> {
            Ok(vec![weights.len() as f64])
        }
        fn result(&self, state: &[f64]) -> f64 {
            state[0]
        }
    }

    fn ps_fit() -> Arc<PsFit<Net>> {
        Arc::new(PsFit::new(
            11,
            net,
            Optimizer::sgd(FIRST_RATE),
            Loss::sparse_categorical_crossentropy(),
            vec![
                Box::new(metrics::Accuracy::sparse_categorical()),
                Box::new(Examples),
            ],
            "train",
        ))
    }

    /// Whether every epoch in the chief's history counted a whole epoch's examples (each step
    /// a worker's batch of 32).
    pub fn every_epoch_counts_every_step(report: &serde_json::Value) -> bool {
        let examples: Vec<f64> = serde_json::from_value(report["examples"].clone()).unwrap();
        let whole = (STEPS_PER_EPOCH * 32) as f64;
        !examples.is_empty() && examples.iter().all(|e| *e == whole)
    }

    pub fn program() -> Program {
        ps_fit()
            .register(Program::new("keras-ps-rate").dataset("train", train_data))
            .chief(chief)
    }

    fn chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
        let every = ps_support::child_dir().join("epoch-{epoch}.safetensors");
        let history = ps_fit()
            .fit(
                coordinator,
                Fit::epochs(EPOCHS)
                    .steps_per_epoch(STEPS_PER_EPOCH)
                    .verbose(false)
                    .callback(LearningRateScheduler::new(|epoch, rate| {
                        match (epoch, ps_support::scenario().starts_with("rate-chief")) {
                            (0, _) => rate,
                            // Each epoch's rate made from the one before, as a decay that
                            // reads the optimizer's rate does.
                            (_, true) => rate * HALVING,
                            (_, false) => 0.0,
                        }
                    }))
                    .callback(Midway)
                    .callback(ModelCheckpoint::new(every.display().to_string()))
                    .callback(
                        BackupAndRestore::new(ps_support::child_dir().join("backup"))
                            .save_freq(SaveFreq::Steps(10))
                            .delete_checkpoint(false),
                    ),
            )
            .map_err(CoordinatorError::other)?;
        let epoch_file = |epoch: usize| {
            std::path::PathBuf::from(
                every
                    .display()
                    .to_string()
                    .replace("{epoch}", &epoch.to_string()),
            )
        };
        let on_servers = servers_weights(coordinator)?;
        let differs = |epoch: usize| -> Result<f32, CoordinatorError> {
            let saved = file_weights(&epoch_file(epoch)).map_err(CoordinatorError::other)?;
            Ok(largest_difference(&saved, &on_servers))
        };
        let initial = ModelVariables::new(11);
        net(initial.var_builder(0)).map_err(CoordinatorError::other)?;
        let drawn: Vec<(String, Vec<f32>)> = initial
            .variables()
            .iter()
            .map(|v| {
                let values = v.read_value().flatten_all()?.to_vec1::<f32>()?;
                Ok((v.name().to_owned(), values))
            })
            .collect::<Result<_, cohort::candle::Error>>()
            .map_err(CoordinatorError::other)?;
        let mut report = ledger_and_stats(coordinator)?;
        report["step"] = serde_json::json!(history.step);
        report["learning_rate"] = serde_json::json!(history.get("learning_rate"));
        report["resumed_at"] = serde_json::json!(history.resumed_at);
        report["loss"] = serde_json::json!(history.get("loss"));
        report["examples"] = serde_json::json!(history.get("examples"));
        report["servers_vs_epoch_1"] = serde_json::json!(differs(1)?);
        report["servers_vs_drawn"] = serde_json::json!(largest_difference(&drawn, &on_servers));
        write_report(&report)
    }
}

/// The first epoch at the optimizer's rate, the next two at 0 (`LearningRateScheduler`),
/// ps/0 SIGKILLed inside the second: restored from the step-40 backup, the closures since run
/// again at the rate they were scheduled with, so the servers end with the first epoch's
/// weights to the bit, and every closure committed once.
#[test]
fn a_learning_rate_scheduler_sets_the_servers_rate_through_a_server_restore() {
    let victim = TaskId::new(TaskType::Ps, 0);
    let report = run_with_fault("keras-ps-rate", "rate", victim, false);
    let total = (EPOCHS * STEPS_PER_EPOCH) as u64;
    assert_eq!(report["step"], total, "{report}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["committed"], total, "LEDGER-1: {ledger}");
    assert_eq!(ledger["balances"], true, "{ledger}");
    assert!(ledger["ps_restores"].as_u64() >= Some(1), "{ledger}");
    let rates: Vec<f64> = serde_json::from_value(report["learning_rate"].clone()).unwrap();
    assert_eq!(rates, [f64::from(rate::FIRST_RATE), 0.0, 0.0], "{report}");
    assert!(
        report["servers_vs_drawn"].as_f64().unwrap() > 0.0,
        "the first epoch trained nothing: {report}"
    );
    assert_eq!(
        report["servers_vs_epoch_1"], 0.0,
        "an update after the first epoch was applied at a rate other than 0: {report}"
    );
    assert!(rate::every_epoch_counts_every_step(&report), "{report}");
}

/// The chief SIGKILLed in the third epoch of a job whose `LearningRateScheduler` halves the
/// rate before at each epoch's start. The rate in force is in the backup: the restarted chief
/// trains the rest of the third epoch at a quarter of the first rate, whether it resumed
/// inside the epoch (the epoch's callbacks run again, and the backup's rate is set after them,
/// not halved twice) or at its start (the callbacks halve the backup's rate). Before, it went
/// on from the optimizer's own rate: half the first. The epoch's figures before the backup are
/// in it too: the resumed epoch counts all its examples.
#[test]
fn a_rate_made_from_the_one_before_survives_a_chiefs_restart() {
    let victim = TaskId::new(TaskType::Chief, 0);
    for (scenario, resumed_at) in [("rate-chief", 70), ("rate-chief-boundary", 60)] {
        let report = run_with_fault(&format!("keras-ps-{scenario}"), scenario, victim, true);
        assert_eq!(report["resumed_at"], resumed_at, "{scenario}: {report}");
        let total = (EPOCHS * STEPS_PER_EPOCH) as u64;
        assert_eq!(report["step"], total, "{scenario}: {report}");
        let rates: Vec<f64> = serde_json::from_value(report["learning_rate"].clone()).unwrap();
        let third = f64::from(rate::FIRST_RATE * rate::HALVING * rate::HALVING);
        let last = rates.last().copied().unwrap_or(f64::NAN);
        assert!((last - third).abs() < 1e-9, "{scenario}: {report}");
        // The resumed epoch's figures count its steps before the backup too (they are in it).
        assert!(
            rate::every_epoch_counts_every_step(&report),
            "{scenario}: {report}"
        );
    }
}
