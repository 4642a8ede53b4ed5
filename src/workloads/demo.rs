//! The main job (`cohort demo`): parameter-server training of the two built-in workloads on a
//! local cluster — the digits classifier to ≥ 95 % held-out accuracy, then a CTR model whose
//! 1,000,000 × 16 embedding table is split over both parameter servers — with a worker killed
//! midway by the launcher to show that nothing is lost or applied twice.
//!
//! Every process of the job runs [`demo_program`]; only the chief prints progress.
//!
//! Checkpoints and preemption: the chief restores the newest valid checkpoint of its
//! checkpoint directory at start (`cohort demo --checkpoint-dir DIR` of an earlier run; by
//! default each run gets a fresh temporary directory) and resumes at that checkpoint's step,
//! saying which checkpoint and step. On SIGTERM (or Ctrl-C) it stops scheduling, lets the steps
//! in flight finish, saves a checkpoint and exits 143; passing the same `--checkpoint-dir`
//! again resumes from it.
//! With `--warm-start FILE.safetensors` (and `--warm-start-map`) and no checkpoint to resume,
//! the variables start from that file instead of their initializers (see
//! [`crate::checkpoint::WarmStart`]; the coordinator applies it as it creates them).
//!
//! TensorBoard: the chief writes each epoch's mean `loss`, `steps_per_second` and
//! `ledger/committed` at the global step under `<checkpoint_dir>/logs/train`
//! ([`crate::summary`]).
//!
//! Evaluator: a task of type `evaluator` (e.g. `cohort role --job demo --task-type evaluator
//! --checkpoint-dir DIR` with the job's cluster) prints the digits classifier's held-out
//! accuracy for every new checkpoint in `DIR` ([`crate::roles::evaluator`]).

use crate::process::stdout::outln;
use crate::run_report::{chief_report, write_report, TaskReport};
use std::time::Instant;

use candle_core::{Device, Tensor};

use super::ctr::{CtrConfig, CtrData};
use super::digits::{Digits, DigitsError, PIXELS};
use super::models::{self, ParamSpec};
use crate::checkpoint::{CheckpointManager, CheckpointPolicy};
use crate::data::{DataError, Dataset};
use crate::layout::Layout;
use crate::ledger::Ledger;
use crate::nn::NnError;
use crate::optim::Optimizer;
use crate::program::{
    CheckpointVariables, ClusterCoordinator, CoordinatorError, EvalError, Metrics, PendingSave,
    Program, SavedInBackground, Step, StepContext, StepError, VariableSpec,
};
use crate::summary::{logs_dir, JobSummaries};
use crate::train::{Progbar, ProgbarMode};
use crate::variable::Partitioner;

/// How long each phase of the demo trains (read from the environment on every process).
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Digits epochs (of `digits_steps_per_epoch` steps).
    pub digits_epochs: usize,
    /// Steps per digits epoch.
    pub digits_steps_per_epoch: usize,
    /// CTR epochs (of `ctr_steps_per_epoch` steps).
    pub ctr_epochs: usize,
    /// Steps per CTR epoch.
    pub ctr_steps_per_epoch: usize,
    /// Where checkpoints go (`None`: the role's configured `checkpoint_dir`, else a fresh
    /// temporary directory).
    pub checkpoint_dir: Option<std::path::PathBuf>,
}

impl DemoConfig {
    /// Defaults, overridden by `COHORT_DEMO_DIGITS_EPOCHS`, `COHORT_DEMO_CTR_EPOCHS` and
    /// `COHORT_DEMO_STEPS_PER_EPOCH`; a value that is not a whole number in
    /// [`DEMO_SETTING_RANGE`] is refused naming the variable, and so is a bad
    /// `COHORT_DEMO_CTR_VOCAB` (the embedding's rows: [`ctr_config`]).
    pub fn from_env() -> Result<Self, DemoSettingError> {
        let number = |env, default| setting(env, default, DEMO_SETTING_RANGE);
        let steps = number("COHORT_DEMO_STEPS_PER_EPOCH", 100)?;
        ctr_config()?;
        Ok(Self {
            digits_epochs: number("COHORT_DEMO_DIGITS_EPOCHS", 8)?,
            digits_steps_per_epoch: steps,
            ctr_epochs: number("COHORT_DEMO_CTR_EPOCHS", 8)?,
            ctr_steps_per_epoch: steps * 2,
            checkpoint_dir: None,
        })
    }
}

/// The demo's epochs and steps per epoch each lie in this range (their products stay far
/// from overflowing).
pub const DEMO_SETTING_RANGE: std::ops::RangeInclusive<usize> = 1..=100_000;

/// The rows the CTR demo's embedding table may have (`COHORT_DEMO_CTR_VOCAB`): up to ten times
/// the default's million, whose table and optimizer slots the servers hold in memory.
pub const DEMO_VOCAB_RANGE: std::ops::RangeInclusive<usize> = 1..=10_000_000;

/// A demo setting from the environment that is not a whole number in its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad config: {env}: {value:?} is not a whole number from {min} to {max}")]
pub struct DemoSettingError {
    /// The environment variable.
    pub env: &'static str,
    /// Its value.
    pub value: String,
    /// The least value it takes.
    pub min: usize,
    /// The largest value it takes.
    pub max: usize,
}

/// The demo setting `env` from the environment: `default` where it is not set.
fn setting(
    env: &'static str,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, DemoSettingError> {
    parse_setting(env, std::env::var(env).ok(), default, range)
}

/// The demo setting `env` of `value` (`None`: not set, `default`), refused unless a whole
/// number in `range`.
fn parse_setting(
    env: &'static str,
    value: Option<String>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, DemoSettingError> {
    let Some(text) = value else {
        return Ok(default);
    };
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or(DemoSettingError {
            env,
            value: text,
            min: *range.start(),
            max: *range.end(),
        })
}

/// The CTR workload's shape: the default 1,000,000-row vocabulary, or `COHORT_DEMO_CTR_VOCAB`
/// rows (read on every process, like [`DemoConfig::from_env`]): a small table keeps each
/// checkpoint small where a test runs the demo many times. A value outside
/// [`DEMO_VOCAB_RANGE`] is refused naming the variable.
pub fn ctr_config() -> Result<CtrConfig, DemoSettingError> {
    let default = CtrConfig::default();
    let vocab = setting(
        "COHORT_DEMO_CTR_VOCAB",
        default.vocab as usize,
        DEMO_VOCAB_RANGE,
    )?;
    Ok(CtrConfig {
        vocab: vocab as u64,
        ..default
    })
}

/// How often the demo checkpoints during training (checked at the end of each epoch).
const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(4);

/// Set to `true` by `cohort demo` when its launcher will kill a worker at the chaos marker.
pub const CHAOS_ENV: &str = "COHORT_DEMO_CHAOS";

/// Examples per digits step.
pub const DIGITS_BATCH: usize = 32;
/// Examples per CTR step.
pub const CTR_BATCH: usize = 512;
/// Embedding width of the CTR model.
pub const CTR_DIM: usize = 16;

/// One step of the digits classifier on this worker's next batch; its value is the batch's loss.
pub static DIGITS_STEP: Step<(), f32> = Step::new("digits_step");
/// One step of the CTR model on this worker's next batch; its value is the batch's loss.
pub static CTR_STEP: Step<(), f32> = Step::new("ctr_step");

/// The demo's program: datasets, steps and the chief's loop.
pub fn demo_program() -> Program {
    Program::new("cohort-demo")
        .optimizer(Optimizer::adagrad(0.1))
        .dataset("digits", digits_dataset)
        .dataset("clicks", clicks_dataset)
        .step(&DIGITS_STEP, digits_step)
        .step(&CTR_STEP, ctr_step)
        .chief(|coordinator| {
            let config = DemoConfig::from_env().map_err(CoordinatorError::other)?;
            run_chief(coordinator, &config)
        })
        .evaluator(digits_evaluation)
}

/// The evaluator's metric: held-out accuracy of the digits classifier in a checkpoint.
fn digits_evaluation(vars: &CheckpointVariables) -> Result<Metrics, EvalError> {
    let (_, test) = Digits::load()
        .map_err(EvalError::other)?
        .split(HELD_OUT, SPLIT_SEED);
    let params = models::digits_params(0)
        .iter()
        .map(|s| vars.f32(&s.name))
        .collect::<Result<Vec<_>, _>>()?;
    let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let accuracy =
        models::digits_accuracy(&views, &test.features, &test.labels).map_err(EvalError::other)?;
    Ok(vec![("digits_accuracy".into(), f64::from(accuracy))])
}

fn digits_dataset(ctx: &crate::data::InputContext) -> Result<Dataset, DataError> {
    let (train, _) = Digits::load()
        .map_err(|e| DataError::Function(e.to_string()))?
        .split(HELD_OUT, SPLIT_SEED);
    let n = train.len();
    let features = Tensor::from_vec(train.features, (n, PIXELS), &Device::Cpu)?;
    let labels = Tensor::from_vec(train.labels, n, &Device::Cpu)?;
    Ok(Dataset::from_tensor_slices(vec![features, labels])?
        .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        .shuffle(1024, 7 + ctx.input_pipeline_id as u64)
        .repeat(None)
        .batch(DIGITS_BATCH, true))
}

fn clicks_dataset(ctx: &crate::data::InputContext) -> Result<Dataset, DataError> {
    let config = ctr_config().map_err(bad_setting)?;
    // Each worker reads its own stream of the planted model's clicks.
    let seed = 1000 + ctx.input_pipeline_id as u64;
    let spec = vec![
        crate::data::TensorSpec::new(
            vec![Some(CTR_BATCH * config.fields)],
            candle_core::DType::I64,
        ),
        crate::data::TensorSpec::new(vec![Some(CTR_BATCH)], candle_core::DType::F32),
    ];
    Ok(
        Dataset::range(0, i64::MAX, 1).map_with_spec(spec, move |element| {
            let batch = element[0].to_scalar::<i64>()? as u64;
            let data = CtrData::generate(&config, seed, batch * CTR_BATCH as u64, CTR_BATCH);
            let ids: Vec<i64> = data.ids.iter().map(|&id| id as i64).collect();
            Ok(vec![
                Tensor::from_vec(ids, CTR_BATCH * config.fields, &Device::Cpu)?,
                Tensor::from_vec(data.labels, CTR_BATCH, &Device::Cpu)?,
            ])
        }),
    )
}

fn digits_step(ctx: &mut StepContext<'_>, (): ()) -> Result<f32, StepError> {
    let batch = ctx.next("digits")?;
    let features = batch[0].flatten_all()?.to_vec1::<f32>()?;
    let labels = batch[1].to_vec1::<i64>()?;
    let specs = models::digits_params(0);
    let params = specs
        .iter()
        .map(|s| ctx.pull(&s.name))
        .collect::<Result<Vec<_>, _>>()?;
    let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let width = features.len() / labels.len().max(1);
    // The batch shared by the worker's local replicas (`replicas`), their mean gradients
    // combined into the one push.
    let parts = ctx.on_replicas(labels.len(), |r| {
        let features = &features[r.start * width..r.end * width];
        Ok(models::digits_step(&views, features, &labels[r])?)
    })?;
    let out = models::StepOutput::combine(parts);
    for (spec, grad) in specs.iter().zip(out.grads) {
        ctx.push_dense(&spec.name, grad)?;
    }
    Ok(out.loss)
}

/// A bad demo setting where a worker reads it (the chief refuses it first, at its start).
fn bad_setting(err: DemoSettingError) -> DataError {
    DataError::InvalidArgument {
        op: err.env,
        reason: err.to_string(),
    }
}

fn ctr_step(ctx: &mut StepContext<'_>, (): ()) -> Result<f32, StepError> {
    let config = ctr_config().map_err(bad_setting)?;
    let batch = ctx.next("clicks")?;
    let ids: Vec<u64> = batch[0]
        .to_vec1::<i64>()?
        .into_iter()
        .map(|id| id as u64)
        .collect();
    let labels = batch[1].to_vec1::<f32>()?;
    let (unique, positions) = models::unique_rows(&ids);
    let embedding = models::ctr_embedding_param(&config, CTR_DIM, 0).name;
    let rows = ctx.pull_rows(&embedding, &unique)?;
    let head: Vec<Vec<f32>> = models::ctr_head_params(CTR_DIM, 0)
        .iter()
        .map(|s| ctx.pull(&s.name))
        .collect::<Result<_, _>>()?;
    let fields = config.fields;
    // Every replica reads the batch's rows; the rows its share does not touch get zero.
    let parts = ctx.on_replicas(labels.len(), |r| {
        Ok(models::ctr_step(
            &rows,
            CTR_DIM,
            &positions[r.start * fields..r.end * fields],
            fields,
            [&head[0], &head[1]],
            &labels[r],
        )?)
    })?;
    let out = models::StepOutput::combine(parts);
    let mut grads = out.grads.into_iter();
    ctx.push_rows(&embedding, unique, grads.next().unwrap_or_default())?;
    for (spec, grad) in models::ctr_head_params(CTR_DIM, 0).iter().zip(grads) {
        ctx.push_dense(&spec.name, grad)?;
    }
    Ok(out.loss)
}

fn run_chief(
    coordinator: &mut ClusterCoordinator,
    config: &DemoConfig,
) -> Result<(), CoordinatorError> {
    let started = Instant::now();
    tracing::info!(
        "cohort demo: parameter-server training on {} workers and {} parameter servers (each its own process, talking QUIC with mutual TLS)",
        coordinator.num_workers(),
        coordinator.num_ps()
    );
    let mut out = ChiefOutputs::open(coordinator, config)?;
    let ctr = ctr_config().map_err(CoordinatorError::other)?;
    let (embedding, layout) = create_variables(coordinator, &ctr)?;
    let resumed = coordinator.restore_checkpoint(&mut out.checkpoints)?;
    announce_resume(coordinator, &out.checkpoint_dir, resumed);
    let mut step = resumed.unwrap_or(0);
    let digits_steps = (config.digits_epochs * config.digits_steps_per_epoch) as u64;
    let ctr_steps = (config.ctr_epochs * config.ctr_steps_per_epoch) as u64;

    let Some(accuracy) = train_digits(coordinator, &mut out, config, &mut step, resumed)? else {
        return save_and_stop(coordinator, &mut out.checkpoints, step, &out.checkpoint_dir);
    };
    let ctr_run = CtrRun {
        ctr: &ctr,
        embedding: &embedding.name,
        layout: &layout,
        first_step: digits_steps,
    };
    let Some((ctr_loss, floor)) = train_ctr(coordinator, &mut out, config, &mut step, &ctr_run)?
    else {
        return save_and_stop(coordinator, &mut out.checkpoints, step, &out.checkpoint_dir);
    };
    let checkpoint_dir = out.checkpoint_dir.clone();
    let saved = if resumed == Some(step) {
        checkpoint_dir.join(crate::checkpoint::checkpoint_dir_name(step))
    } else {
        save_final(coordinator, &mut out.checkpoints, step)?
    };
    // The loss curve beside the checkpoints (the status page's history, drawn).
    let loss_png = checkpoint_dir.join("loss.png");
    if let Err(e) = crate::status::write_loss_png(&loss_png, "cohort demo: train loss per epoch") {
        tracing::warn!("no loss curve: {e}");
    }

    let ledger = print_summary(
        coordinator,
        &DemoEnd {
            started,
            accuracy,
            ctr_loss,
            floor,
            step,
            total_steps: digits_steps + ctr_steps,
            resumed,
            checkpoint_dir: &checkpoint_dir,
            saved: &saved,
            loss_png: &loss_png,
            summaries: &out.summaries,
        },
    )?;
    hold_until_released();
    if !ledger.balances() || ledger.committed != ledger.scheduled {
        return Err(DemoError::Ledger(ledger).into());
    }
    Ok(())
}

/// What every phase of the chief's run writes to: its checkpoints (and their directory), its
/// progress bar and its summaries.
struct ChiefOutputs {
    checkpoint_dir: std::path::PathBuf,
    checkpoints: CheckpointManager,
    progress: Progbar,
    summaries: JobSummaries,
}

impl ChiefOutputs {
    /// The job's checkpoint directory (the configured one, else a new temporary one), saved
    /// on a cadence as well as at the end of each workload, so that a parameter server lost
    /// late re-runs at most the closures since the last save (TensorFlow's
    /// `BackupAndRestore` saves per epoch), checked at the end of every epoch.
    fn open(
        coordinator: &ClusterCoordinator,
        config: &DemoConfig,
    ) -> Result<Self, CoordinatorError> {
        let checkpoint_dir = config
            .checkpoint_dir
            .clone()
            .or_else(|| coordinator.checkpoint_dir())
            .map_or_else(
                || crate::process::new_temp_dir("cohort-demo-").map_err(DemoError::TempDir),
                Ok,
            )?;
        let policy = CheckpointPolicy {
            save_every_steps: None,
            save_every: Some(SAVE_EVERY),
            keep_last: 2,
        };
        let checkpoints = CheckpointManager::new(&checkpoint_dir, policy, Instant::now())?;
        Ok(Self {
            checkpoints,
            progress: Progbar::stderr(ProgbarMode::Auto),
            summaries: JobSummaries::create(&logs_dir(&checkpoint_dir, "train")),
            checkpoint_dir,
        })
    }
}

/// Workload 1, the digits, from `step` (a resumed run's): its held-out accuracy at the end,
/// or `None` when a stop request ended it (the caller saves and stops).
fn train_digits(
    coordinator: &mut ClusterCoordinator,
    out: &mut ChiefOutputs,
    config: &DemoConfig,
    step: &mut u64,
    resumed: Option<u64>,
) -> Result<Option<f64>, CoordinatorError> {
    let digits_steps = (config.digits_epochs * config.digits_steps_per_epoch) as u64;
    tracing::info!("workload 1/2: handwritten digits (1,797 8x8 images; 20% held out), MLP 64-64-10, Adagrad on the parameter servers");
    coordinator.create_per_worker_dataset("digits")?;
    coordinator.wait_for_workers(
        coordinator.num_workers() as usize,
        std::time::Duration::from_secs(60),
    )?;
    let (_, test) = Digits::load()
        .map_err(DemoError::from)?
        .split(HELD_OUT, SPLIT_SEED);
    let digits_accuracy = |coordinator: &ClusterCoordinator| -> Result<f64, CoordinatorError> {
        let params = models::digits_params(0)
            .iter()
            .map(|s| coordinator.read_variable(&s.name))
            .collect::<Result<Vec<_>, _>>()?;
        let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        models::digits_accuracy(&views, &test.features, &test.labels)
            .map(f64::from)
            .map_err(|e| DemoError::Evaluate(e).into())
    };
    let phase = Phase {
        step: &DIGITS_STEP,
        first_step: 0,
        epochs: config.digits_epochs,
        steps_per_epoch: config.digits_steps_per_epoch,
    };
    if *step >= digits_steps {
        tracing::info!(
            step = *step,
            "done before the checkpoint (step {step} >= {digits_steps})"
        );
    }
    // A checkpoint before training, durable before the first step: a parameter server lost
    // before the cadence's first save is restored from it, and a chief lost then resumes from
    // it (with none, either loss would end the job once the servers have applied a step:
    // nothing accounts for what they hold).
    if resumed.is_none() {
        save_or_warn(
            coordinator,
            &mut out.checkpoints,
            *step,
            "checkpoint before training",
            "a parameter server or the chief lost before the first epoch's checkpoint ends the job",
        )?;
    }
    let preempted = run_phase(
        coordinator,
        &mut out.progress,
        &mut out.checkpoints,
        &mut out.summaries,
        &phase,
        step,
        |coordinator, loss, step| {
            let accuracy = digits_accuracy(coordinator)?;
            tracing::info!(
                step,
                "train loss {loss:.4}, held-out accuracy {:.1}%",
                accuracy * 100.0
            );
            Ok(())
        },
    )?;
    if preempted {
        return Ok(None);
    }
    let accuracy = digits_accuracy(coordinator)?;
    if *step == digits_steps && resumed != Some(*step) {
        // Not the end of the job if it fails: the cadence tries again (as `finish_save` says).
        save_or_warn(
            coordinator,
            &mut out.checkpoints,
            *step,
            &format!("checkpoint at step {step}"),
            "the previous checkpoint (if any) stays the one a recovery restores, and training \
             goes on",
        )?;
    }
    Ok(Some(accuracy))
}

/// What workload 2 trains: the CTR problem, its partitioned embedding, and the step it
/// starts at (after the digits').
struct CtrRun<'a> {
    ctr: &'a CtrConfig,
    embedding: &'a str,
    layout: &'a Layout,
    first_step: u64,
}

/// Workload 2, click-through rate with a partitioned embedding, from `step`: its held-out log
/// loss and the planted floor at the end, or `None` when a stop request ended it.
fn train_ctr(
    coordinator: &mut ClusterCoordinator,
    out: &mut ChiefOutputs,
    config: &DemoConfig,
    step: &mut u64,
    run: &CtrRun<'_>,
) -> Result<Option<(f64, f64)>, CoordinatorError> {
    tracing::info!(
        "workload 2/2: click-through rate, {} x {CTR_DIM} embedding split over both parameter servers + linear head; \
         synthetic clicks from a planted model",
        run.ctr.vocab
    );
    log_layout(run.layout);
    coordinator.create_per_worker_dataset("clicks")?;
    let held_out = CtrData::generate(run.ctr, 99, 0, 20_000);
    let floor = held_out.loss_floor();
    tracing::info!("planted floor (best possible held-out log loss): {floor:.4}");
    crate::status::record_marker(run.first_step, "ctr");
    let phase = Phase {
        step: &CTR_STEP,
        first_step: run.first_step,
        epochs: config.ctr_epochs,
        steps_per_epoch: config.ctr_steps_per_epoch,
    };
    let mut ctr_epochs_done = 0;
    let preempted = run_phase(
        coordinator,
        &mut out.progress,
        &mut out.checkpoints,
        &mut out.summaries,
        &phase,
        step,
        |coordinator, loss, step| {
            let ctr_loss = ctr_held_out_loss(coordinator, &held_out, run.embedding)?;
            tracing::info!(
                step,
                "train loss {loss:.4}, held-out log loss {ctr_loss:.4} (floor {floor:.4}, gap {:+.4})",
                ctr_loss - floor
            );
            ctr_epochs_done += 1;
            if ctr_epochs_done == config.ctr_epochs / 2
                && std::env::var(CHAOS_ENV).as_deref() == Ok("true")
            {
                // The launcher watches for this marker and SIGKILLs a worker now, so the
                // failure lands midway through training on any machine speed.
                tracing::info!(
                    "{} midway: the launcher now SIGKILLs a worker; watch its closure get re-dispatched",
                    crate::launch::CHAOS_MARKER
                );
            }
            Ok(())
        },
    )?;
    if preempted {
        return Ok(None);
    }
    Ok(Some((
        ctr_held_out_loss(coordinator, &held_out, run.embedding)?,
        floor,
    )))
}

/// Creates every variable of both workloads from the start, so that every checkpoint holds
/// all of them and any of them can be restored: the digits MLP, the CTR embedding (split over
/// both servers) and its head. Returns the embedding's spec and layout.
fn create_variables(
    coordinator: &mut ClusterCoordinator,
    ctr: &CtrConfig,
) -> Result<(ParamSpec, Layout), CoordinatorError> {
    for spec in models::digits_params(0) {
        coordinator.create_variable(to_variable(spec))?;
    }
    let embedding = models::ctr_embedding_param(ctr, CTR_DIM, 11);
    let layout = coordinator.create_variable(
        to_variable(embedding.clone()).partitioned(Partitioner::FixedShards { num_shards: 2 }),
    )?;
    for spec in models::ctr_head_params(CTR_DIM, 12) {
        coordinator.create_variable(to_variable(spec))?;
    }
    Ok((embedding, layout))
}

/// Says where the demo resumes from (the checkpoint it restored) or where its checkpoints go.
fn announce_resume(
    coordinator: &ClusterCoordinator,
    checkpoint_dir: &std::path::Path,
    resumed: Option<u64>,
) {
    match resumed {
        Some(step) => tracing::info!(
            step,
            "resumed from checkpoint {} at step {step}",
            checkpoint_dir
                .join(crate::checkpoint::checkpoint_dir_name(step))
                .display()
        ),
        None => tracing::info!(
            "checkpoints go to {} (none there yet: starting from step 0{})",
            checkpoint_dir.display(),
            coordinator
                .warm_start_file()
                .map(|file| format!(", variables from {} (warm start)", file.display()))
                .unwrap_or_default()
        ),
    }
}

/// Saves a checkpoint at `step` (`what`, in the log); one that could not be written is
/// logged with its `consequence` and training goes on. Any other failure is the job's.
fn save_or_warn(
    coordinator: &mut ClusterCoordinator,
    checkpoints: &mut CheckpointManager,
    step: u64,
    what: &str,
    consequence: &str,
) -> Result<(), CoordinatorError> {
    match coordinator.save_checkpoint(checkpoints, step) {
        Ok(saved) => tracing::info!(step, "{what}: {}", saved.display()),
        Err(CoordinatorError::Checkpoint(e)) => {
            tracing::warn!(step, "{what} not saved: {e}; {consequence}")
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Says where each shard of a partitioned variable lives.
fn log_layout(layout: &Layout) {
    tracing::info!(
        "{}: {} shards: {}",
        layout.name,
        layout.shards.len(),
        layout
            .shards
            .iter()
            .map(|s| format!("rows {}..{} on ps/{}", s.rows.start, s.rows.end, s.ps))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// How the demo ended, for its summary.
struct DemoEnd<'a> {
    started: Instant,
    accuracy: f64,
    ctr_loss: f64,
    floor: f64,
    step: u64,
    total_steps: u64,
    resumed: Option<u64>,
    checkpoint_dir: &'a std::path::Path,
    saved: &'a std::path::Path,
    loss_png: &'a std::path::Path,
    summaries: &'a JobSummaries,
}

/// Prints the demo's summary (the ledger, every server's counts, the models' figures, where
/// the checkpoints, loss curve and TensorBoard events are) and writes the same figures as the
/// run report `cohort chaos run` reads; returns the ledger.
fn print_summary(
    coordinator: &ClusterCoordinator,
    end: &DemoEnd<'_>,
) -> Result<Ledger, CoordinatorError> {
    let ledger = coordinator.ledger()?;
    let stats = coordinator.ps_stats()?;
    outln!("\n== summary ({:.1}s)", end.started.elapsed().as_secs_f64());
    outln!(
        "  ledger: {} closures scheduled, {} committed, {} re-dispatched after a worker or parameter server was lost, {} results rejected as stale, {} failed, {} pending",
        ledger.scheduled, ledger.committed, ledger.redispatched, ledger.rejected_stale, ledger.failed, ledger.pending
    );
    if ledger.ps_restores > 0 {
        outln!(
            "  parameter-server recovery: {} restore(s) from a checkpoint, {} committed closures rolled back and run again",
            ledger.ps_restores, ledger.rolled_back
        );
    }
    for (ps, s) in stats.iter().enumerate() {
        outln!(
            "  ps/{ps}: {} pushes applied, {} duplicates refused (PS-1), {} stale pushes refused (FENCE-1), {} non-finite skipped",
            s.applied, s.rejected_duplicate, s.rejected_stale, s.skipped_non_finite
        );
    }
    outln!(
        "  digits: held-out accuracy {:.1}% (target >= 95%)",
        end.accuracy * 100.0
    );
    outln!(
        "  ctr: held-out log loss {:.4}, planted floor {:.4}",
        end.ctr_loss, end.floor
    );
    // The runner reads "resumed" (the servers were restored at the start, rolling back what
    // a chief before this one had them apply).
    outln!(
        "  steps: {} of {} (this run: {}{})",
        end.step,
        end.total_steps,
        end.step - end.resumed.unwrap_or(0),
        end.resumed
            .map(|from| format!(", resumed from step {from}"))
            .unwrap_or_default()
    );
    outln!(
        "  checkpoints: {} (newest {})",
        end.checkpoint_dir.display(),
        end.saved.display()
    );
    // The same figures for `cohort chaos run`, as data.
    write_report(&TaskReport {
        resumed: end.resumed.is_some(),
        ..chief_report(&ledger, stats.iter().map(|s| (s.applied, s.rejected_duplicate)))
    });
    if end.loss_png.exists() {
        outln!("  loss curve: {}", end.loss_png.display());
    }
    if let Some(events) = end.summaries.path() {
        outln!(
            "  TensorBoard: {} (tensorboard --logdir {})",
            events.display(),
            end.checkpoint_dir.join("logs").display()
        );
    }
    Ok(ledger)
}

/// Keeps the finished job up (its status page and metrics served) until the file named by
/// [`HOLD_ENV`] exists, for at most [`HOLD_MAX`]: a look at the end state before it exits.
fn hold_until_released() {
    let Some(file) = std::env::var_os(HOLD_ENV) else {
        return;
    };
    let file = std::path::PathBuf::from(file);
    outln!(
        "  holding until {} exists (at most {HOLD_MAX:?})",
        file.display()
    );
    let deadline = Instant::now() + HOLD_MAX;
    while !file.exists() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A file whose creation lets a finished demo exit (see `hold_until_released`).
pub const HOLD_ENV: &str = "COHORT_DEMO_HOLD_UNTIL";
/// Longest a finished demo waits for [`HOLD_ENV`]'s file.
const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// One workload's epochs: steps `first_step .. first_step + epochs * steps_per_epoch` of the
/// job's global step count.
struct Phase {
    step: &'static Step<(), f32>,
    first_step: u64,
    epochs: usize,
    steps_per_epoch: usize,
}

/// Runs the epochs of `phase` that are not behind `step` (a resumed run starts mid-phase, even
/// mid-epoch); `after_epoch` reports each finished epoch (its mean loss, the step reached), as do the TensorBoard `summaries`
/// (mean loss, steps per second, committed closures). Returns true when a stop was requested
/// (the steps in flight have finished and `step` counts them).
#[allow(clippy::too_many_arguments)]
fn run_phase(
    coordinator: &ClusterCoordinator,
    progress: &mut Progbar,
    checkpoints: &mut CheckpointManager,
    summaries: &mut JobSummaries,
    phase: &Phase,
    step: &mut u64,
    mut after_epoch: impl FnMut(&ClusterCoordinator, f64, u64) -> Result<(), CoordinatorError>,
) -> Result<bool, CoordinatorError> {
    let in_background = &mut None::<PendingSave>;
    for epoch in 1..=phase.epochs {
        let epoch_end = phase.first_step + (epoch * phase.steps_per_epoch) as u64;
        if *step >= epoch_end {
            continue;
        }
        let remaining = (epoch_end - *step) as usize;
        let outcome = run_epoch(
            coordinator,
            progress,
            phase.step,
            epoch,
            phase.epochs,
            remaining,
        )?;
        *step += outcome.steps as u64;
        if outcome.steps > 0 {
            summaries.scalars(
                *step,
                &[
                    ("loss", outcome.mean_loss),
                    (
                        "steps_per_second",
                        outcome.steps as f64 / outcome.took.as_secs_f64().max(1e-9),
                    ),
                    ("ledger/committed", coordinator.ledger()?.committed as f64),
                ],
            );
            crate::status::record_loss(*step, outcome.mean_loss);
        }
        if outcome.stopped {
            if let Some(pending) = in_background.take() {
                finish_save(pending, checkpoints);
            }
            return Ok(true);
        }
        after_epoch(coordinator, outcome.mean_loss, *step)?;
        // The phase's last epoch is saved at the phase's end (a second save of the same step
        // would be refused). One save in the background at a time: training waits for the one
        // before only when the next is due (a save written meanwhile is just reported).
        if epoch < phase.epochs {
            let due =
                |checkpoints: &CheckpointManager| checkpoints.should_save(*step, Instant::now());
            if let Some(pending) = in_background.take_if(|p| p.is_finished() || due(checkpoints)) {
                finish_save(pending, checkpoints);
            }
            // Due again once the one before is recorded (its start is the cadence's).
            if in_background.is_none() && due(checkpoints) {
                *in_background =
                    Some(coordinator.save_checkpoint_in_background(checkpoints, *step)?);
            }
        }
    }
    if let Some(pending) = in_background.take() {
        finish_save(pending, checkpoints);
    }
    Ok(false)
}

/// Attempts at the last checkpoint, the trained model, before the job gives up on it.
const FINAL_SAVE_ATTEMPTS: u32 = 10;
/// The wait between two of them.
const FINAL_SAVE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// The checkpoint of the trained model at `step`: a failed write (a full disk, say) is tried
/// again, [`FINAL_SAVE_ATTEMPTS`] times [`FINAL_SAVE_RETRY`] apart, as it may pass; then the
/// job fails with the last error.
fn save_final(
    coordinator: &ClusterCoordinator,
    checkpoints: &mut CheckpointManager,
    step: u64,
) -> Result<std::path::PathBuf, CoordinatorError> {
    let mut attempt = 1;
    loop {
        match coordinator.save_checkpoint(checkpoints, step) {
            Err(CoordinatorError::Checkpoint(e)) if attempt < FINAL_SAVE_ATTEMPTS => {
                tracing::warn!(
                    step,
                    "the final checkpoint at step {step} not saved (attempt {attempt} of \
                     {FINAL_SAVE_ATTEMPTS}): {e}; trying again in {FINAL_SAVE_RETRY:?}"
                );
                attempt += 1;
                std::thread::sleep(FINAL_SAVE_RETRY);
            }
            result => return result,
        }
    }
}

/// Waits for a save on the checkpoint cadence and says what it cost, or why it is not a
/// checkpoint: a save that failed (a full disk, a write error, a checkpoint that did not read
/// back) leaves the previous checkpoint as the cut and training goes on; the next epoch's end
/// tries again, as the cadence is still due.
fn finish_save(pending: PendingSave, checkpoints: &mut CheckpointManager) {
    let step = pending.step();
    match pending.wait(checkpoints) {
        Ok(saved) => report_saved(saved),
        Err(e) => tracing::warn!(
            step,
            "checkpoint at step {step} not saved: {e}; the previous checkpoint stays the one a \
             recovery restores, and training goes on (the next epoch's end tries again)"
        ),
    }
}

/// What a save on the checkpoint cadence cost: the time training waited (the servers read)
/// and the time until it was written, verified and the cut (in the background), and its size.
fn report_saved(saved: SavedInBackground) {
    let bytes: u64 = std::fs::read_dir(&saved.dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    tracing::info!(
        step = saved.step,
        "checkpoint at step {}: {}, {:.1} MB; training waited {:.0} ms \
         for the cut, written in the background in {:.0} ms",
        saved.step,
        saved.dir.display(),
        bytes as f64 / 1e6,
        saved.read_took.as_secs_f64() * 1e3,
        saved.total.as_secs_f64() * 1e3,
    );
}

/// The preemption path: checkpoint at `step`, say how to resume, and return (the process then
/// exits 143).
fn save_and_stop(
    coordinator: &ClusterCoordinator,
    checkpoints: &mut CheckpointManager,
    step: u64,
    dir: &std::path::Path,
) -> Result<(), CoordinatorError> {
    let saved = coordinator.save_checkpoint(checkpoints, step)?;
    tracing::info!(
        step,
        "stop requested: saved checkpoint {} at step {step}; resume with: cohort demo \
         --checkpoint-dir {}",
        saved.display(),
        dir.display()
    );
    Ok(())
}

/// What one epoch did.
struct EpochOutcome {
    mean_loss: f64,
    steps: usize,
    took: std::time::Duration,
    stopped: bool,
}

/// Runs up to `steps` closures of `step`, keeping a few per worker scheduled ahead, and
/// reports their mean loss. On a stop request it schedules nothing more and waits for what is
/// in flight.
fn run_epoch(
    coordinator: &ClusterCoordinator,
    progress: &mut Progbar,
    step: &Step<(), f32>,
    epoch: usize,
    epochs: usize,
    steps: usize,
) -> Result<EpochOutcome, CoordinatorError> {
    let started = Instant::now();
    let _ = progress.begin_epoch(epoch, epochs, Some(steps));
    let window = (coordinator.num_workers() as usize * AHEAD_PER_WORKER).max(1);
    let mut in_flight = std::collections::VecDeque::with_capacity(window);
    let (mut scheduled, mut done, mut total) = (0usize, 0usize, 0.0f64);
    loop {
        let stopped = coordinator.preemption_requested();
        while !stopped && scheduled < steps && in_flight.len() < window {
            in_flight.push_back(coordinator.schedule(step, ())?);
            scheduled += 1;
        }
        let Some(value) = in_flight.pop_front() else {
            break;
        };
        let loss = coordinator.fetch(&value)?;
        total += f64::from(loss);
        done += 1;
        let _ = progress.update(done, &[("loss", total / done as f64)]);
    }
    coordinator.join()?;
    let mean_loss = total / done.max(1) as f64;
    let took = started.elapsed();
    let _ = progress.end_epoch(done, &[("loss", mean_loss)]);
    Ok(EpochOutcome {
        mean_loss,
        steps: done,
        took,
        stopped: done < steps,
    })
}

fn ctr_held_out_loss(
    coordinator: &ClusterCoordinator,
    data: &CtrData,
    embedding: &str,
) -> Result<f64, CoordinatorError> {
    let (unique, positions) = models::unique_rows(&data.ids);
    let rows = coordinator.read_rows(embedding, &unique)?;
    let head: Vec<Vec<f32>> = models::ctr_head_params(CTR_DIM, 0)
        .iter()
        .map(|s| coordinator.read_variable(&s.name))
        .collect::<Result<_, _>>()?;
    let loss = models::ctr_loss(
        &rows,
        CTR_DIM,
        &positions,
        data.fields,
        [&head[0], &head[1]],
        &data.labels,
    )
    .map_err(DemoError::Evaluate)?;
    Ok(f64::from(loss))
}

/// Why the demo's chief failed, apart from the coordinator's own errors (carried as
/// [`CoordinatorError::Other`]).
#[derive(Debug, thiserror::Error)]
enum DemoError {
    /// No checkpoint directory is configured, and a temporary one could not be made.
    #[error("cannot make a temporary checkpoint directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// The digits data set could not be read.
    #[error(transparent)]
    Digits(#[from] DigitsError),
    /// A model could not be evaluated on its held-out data.
    #[error("held-out evaluation: {0}")]
    Evaluate(#[source] NnError),
    /// At the end, the ledger does not balance or not every scheduled closure committed.
    #[error("LEDGER-1 violated: {0:?}")]
    Ledger(Ledger),
}

impl From<DemoError> for CoordinatorError {
    fn from(e: DemoError) -> Self {
        CoordinatorError::other(e)
    }
}

fn to_variable(spec: ParamSpec) -> VariableSpec {
    VariableSpec::new(spec.name, spec.shape, spec.init)
}

/// Closures scheduled ahead per worker, so a worker never waits for the chief.
const AHEAD_PER_WORKER: usize = 4;

/// Fraction of digits held out for evaluation, and the seed of the split.
const HELD_OUT: f64 = 0.2;
const SPLIT_SEED: u64 = 42;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demo_setting_outside_its_range_is_refused_naming_the_variable() {
        let vocab = |value: Option<&str>| {
            parse_setting(
                "COHORT_DEMO_CTR_VOCAB",
                value.map(str::to_string),
                1_000_000,
                DEMO_VOCAB_RANGE,
            )
        };
        assert_eq!(vocab(None), Ok(1_000_000));
        assert_eq!(vocab(Some(" 5000 ")), Ok(5000));
        for bad in ["0", "-3", "lots", "", "10000001", "18446744073709551616"] {
            let err = vocab(Some(bad)).expect_err(bad);
            assert_eq!(err.env, "COHORT_DEMO_CTR_VOCAB");
            let message = err.to_string();
            assert!(
                message.contains("COHORT_DEMO_CTR_VOCAB") && message.contains("1 to 10000000"),
                "{message}"
            );
        }
    }
}
