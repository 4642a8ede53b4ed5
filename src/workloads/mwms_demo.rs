//! The MultiWorkerMirrored main job (`cohort demo --strategy multi-worker-mirrored`): the
//! chief and the workers of a local cluster (3 in all by default, each its own process under
//! the launcher) train the digits classifier synchronously, elastically, to at least 95 %
//! held-out accuracy, while the launcher SIGKILLs a worker midway and restarts it.
//!
//! What a user sees, from the chief (from the group's first member: while the chief is away,
//! the lowest-ranked worker, and it again once admitted back): one line per epoch (mean loss,
//! steps/s, the group's generation and its workers), each change of the group (the survivors
//! re-forming without the killed worker at a new generation, then admitting its new process at the
//! next), and, from the first member at the end only, a summary with every generation
//! it saw and the held-out accuracy; from every task, its final model's
//! digest (`final model: step S, digest D`, equal on every member: `cohort chaos run` compares
//! them). The plan of steps follows the job's starting workers ([`PLANNED_WORKERS_ENV`], else
//! the cluster's configuration), not the group's size at a process's start, so that a worker
//! restarted while the group is smaller, or added while it runs, stops with the others.
//! Elastic: a worker added while the job trains (`cohort scale` up) joins the group at a step
//! boundary; one sent SIGUSR1 (`cohort scale` down) leaves at the next, for good, exit 0. The
//! run is
//! [`dense_sync::train_elastic_on`] over the digits problem: no checkpoint is read on the way,
//! the survivors hold the model and the restarted worker receives it from them.
//!
//! This module owns one task of that job ([`run_task`]): its settings from the environment
//! the launcher gives every task, the printing, and the final evaluation.

use crate::process::stdout::outln;
use crate::run_report::FinalModel;
use std::time::Instant;

use super::dense_sync::{self, DenseProblem, ElasticEvent, ElasticOptions};
use super::digits::{Digits, CLASSES, PIXELS};
use super::models;
use crate::cluster::{ConfigKey, TaskType};
use crate::strategy::{MultiWorkerConfig, MultiWorkerMirrored, Strategy};
use crate::train::StateCheckpoints;

/// Environment variable: training epochs (over the training split, at the starting global
/// batch).
pub const EPOCHS_ENV: &str = "COHORT_DEMO_DIGITS_EPOCHS";
/// What sums the gradients (`ring`, `nccl`): `cohort demo --communication`. With NCCL, each
/// task takes the GPU of its place in the cluster (the chief 0, worker i the i-th after it).
pub const COMMUNICATION_ENV: &str = "COHORT_DEMO_COMMUNICATION";
/// Default epochs.
pub const DEFAULT_EPOCHS: usize = 30;
/// Environment variable: the workers the job starts with, the chief included (the launcher
/// sets it; every task of a job must see the same). The plan of steps follows it: a worker
/// added beyond the others' cluster spec is given a spec naming more tasks. Unset, the tasks
/// of the cluster spec count.
pub const PLANNED_WORKERS_ENV: &str = "COHORT_DEMO_PLANNED_WORKERS";
/// Examples per replica and step.
pub const PER_REPLICA_BATCH: usize = 32;
/// Hidden units of the classifier (64 → 64 → 10, as the parameter-server demo's).
pub const HIDDEN: usize = 64;
/// Adam's learning rate.
pub const LEARNING_RATE: f32 = 0.005;
/// The held-out accuracy the job must reach.
pub const TARGET_ACCURACY: f32 = 0.95;
/// The chief saves a checkpoint every this many epochs (and at every departure), where the
/// job has a checkpoint directory.
const CHECKPOINT_EVERY_EPOCHS: usize = 5;
/// Fraction of the digits held out (the split's seed is fixed: every task holds the same).
const HELD_OUT_FRACTION: f64 = 0.2;
const SPLIT_SEED: u64 = 7;

/// What a task of the job could not do.
#[derive(Debug, thiserror::Error)]
pub enum MwmsDemoError {
    /// The task's settings from the environment (`TF_CONFIG` and the rest) are wrong.
    #[error("bad config: {0}")]
    Config(#[from] crate::bootstrap::TaskConfigError),
    /// A setting of the demo's own is wrong: the variable, and what it must be.
    #[error("bad config: {env}: {value:?} is not {wanted}")]
    Setting {
        /// The environment variable.
        env: &'static str,
        /// What it holds.
        value: String,
        /// What it must hold.
        wanted: &'static str,
    },
    /// The planned workers ([`PLANNED_WORKERS_ENV`]) are no count.
    #[error("bad config: {PLANNED_WORKERS_ENV}: {0}")]
    PlannedWorkers(#[source] crate::cluster::CountError),
    /// The checkpoint directory could not be opened.
    #[error("bad config: {env}: {0}", env = ConfigKey::CHECKPOINT_DIR.env)]
    Checkpoints(#[source] Box<crate::train::StateCheckpointError>),
    /// A signal could not be watched.
    #[error("cannot watch for {signal}: {source}")]
    Signal {
        /// The signal's name.
        signal: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The digits could not be loaded.
    #[error("bad config: {0}")]
    Digits(#[from] super::digits::DigitsError),
    /// The group could not be formed.
    #[error("training failed: {0}")]
    Group(#[from] crate::strategy::StrategyError),
    /// Training failed (the group could not go on).
    #[error("training failed: {0}")]
    Training(#[from] crate::train::TrainError),
    /// The trained model lacks a variable the accuracy needs.
    #[error("training failed: no variable {0}")]
    MissingVariable(&'static str),
    /// The held-out accuracy could not be computed.
    #[error("training failed: {0}")]
    Evaluation(#[from] crate::nn::NnError),
    /// This worker left after a preemption notice (SIGTERM).
    #[error("preempted: left the group at a step boundary")]
    Preempted,

    /// The classifier missed the accuracy target.
    #[error("held-out accuracy {accuracy:.1}% is below the target of {target:.0}%")]
    Accuracy {
        /// Reached, in percent.
        accuracy: f32,
        /// Wanted, in percent.
        target: f32,
    },
}

impl MwmsDemoError {
    /// The error of watching `signal` that failed with an I/O error.
    fn signal(signal: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Signal { signal, source }
    }

    /// The process exit code: 2 for a bad setting, 143 after a preemption notice (restart
    /// me), 1 otherwise (a drained worker returns `Ok`: exit 0, do not restart me).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_)
            | Self::Setting { .. }
            | Self::PlannedWorkers(_)
            | Self::Checkpoints(_)
            | Self::Signal { .. }
            | Self::Digits(_) => 2,
            Self::Preempted => crate::process::PREEMPTED_EXIT_CODE as u8,
            _ => 1,
        }
    }
}

/// Runs this process's task of the job, from the environment the launcher gives it
/// (`TF_CONFIG`, `COHORT_CERTS`, `COHORT_DETECTION_BUDGET`, `COHORT_REPLICAS`,
/// [`EPOCHS_ENV`]); see the module doc.
pub fn run_task() -> Result<(), MwmsDemoError> {
    let started = Instant::now();
    let config = task_config()?;
    // SIGUSR1 (the launcher scaling the job down) drains it: it leaves at the next step
    // boundary, for good. Watched from the start: a drain while it still joins the group
    // lets it finish joining and then leave, rather than killing it (a loss the others
    // would have to detect).
    let drain = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::process::drain_on_signal(&drain)
        .map_err(MwmsDemoError::signal("SIGUSR1"))?;
    let (planned_workers, epochs) = planned_run(&config)?;
    let digits = Digits::load()?;
    let (train, held_out) = digits.split(HELD_OUT_FRACTION, SPLIT_SEED);
    let problem = DenseProblem {
        features: PIXELS,
        hidden: HIDDEN,
        classes: CLASSES,
        learning_rate: LEARNING_RATE,
        x: train.features,
        y: train.labels,
    };
    let steps_per_epoch = problem
        .examples()
        .div_ceil(PER_REPLICA_BATCH * planned_workers * config.local_replicas);
    let steps = epochs * steps_per_epoch;
    let mut strategy = MultiWorkerMirrored::new(config)?;
    let mut log = GroupLog::start(&strategy, epochs, steps_per_epoch);
    if log.leads {
        outln!(
            "MultiWorkerMirrored: {} workers × {} replica(s), group generation {}, summing over {}; \
             digits: {} training and {} held-out examples, {PER_REPLICA_BATCH} per replica and \
             step",
            log.workers,
            strategy.local_replicas().len(),
            log.group_generation,
            strategy.communication(),
            problem.examples(),
            held_out.len()
        );
    }
    let seed = 11 + 1000 * strategy.worker_index() as u64;
    // SIGTERM (the launcher's stop, or a preemption) is this worker's notice: it leaves at
    // the next step boundary after the chief saved that step.
    let notice = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::process::stop_on_signals(&notice)
        .map_err(MwmsDemoError::signal("SIGTERM"))?;
    let mut checkpoints = open_checkpoints(steps_per_epoch)?;
    let options = ElasticOptions {
        notice: Some(&notice),
        drain: Some(&drain),
        checkpoints: checkpoints.as_mut(),
    };
    let run = dense_sync::train_elastic_on(
        &mut strategy,
        &problem,
        steps,
        PER_REPLICA_BATCH,
        seed,
        options,
        &mut |event| log.on_event(event),
    )?;
    let me = log.me;
    if run.drained {
        outln!("{me}: drained: left the group for good");
        return Ok(());
    }
    if run.left.is_some() {
        outln!("{me}: left the group after its preemption notice");
        return Err(MwmsDemoError::Preempted);
    }
    let outcome = run.outcome;
    // Every member's model, for a reader (`cohort chaos run`) to compare: one model.
    outln!("final model: step {steps}, digest {}", outcome.digest());
    // What `cohort chaos run` reads of this task (the strategy wrote that the job is a
    // MultiWorkerMirrored one as it was made, and keeps the chief's group generations).
    strategy.report_final_model(FinalModel {
        step: steps as u64,
        digest: outcome.digest(),
    });
    // One summary: from the group's first member at the end.
    if !strategy.is_chief() {
        return Ok(());
    }
    let summary = Summary {
        started,
        steps,
        outcome: &outcome,
        held_out: &held_out,
        log: &log,
    };
    summary.print()
}

/// The chief's summary at the end: the held-out accuracy against its target, the group's
/// generations and the last loss.
struct Summary<'a> {
    started: Instant,
    steps: usize,
    outcome: &'a dense_sync::DenseOutcome,
    held_out: &'a super::digits::Digits,
    log: &'a GroupLog,
}

impl Summary<'_> {
    fn print(&self) -> Result<(), MwmsDemoError> {
        let accuracy = held_out_accuracy(self.outcome, self.held_out)?;
        outln!("== summary ({:.1}s)", self.started.elapsed().as_secs_f64());
        self.log.print_generations();
        let last_loss = self
            .outcome
            .losses
            .iter()
            .rev()
            .find(|l| !l.is_nan())
            .copied()
            .unwrap_or(f32::NAN);
        outln!("  steps: {}, last loss {last_loss:.4}", self.steps);
        outln!(
            "  digits: held-out accuracy {:.1}% (target >= {:.0}%)",
            100.0 * accuracy,
            100.0 * TARGET_ACCURACY
        );
        if accuracy < TARGET_ACCURACY {
            return Err(MwmsDemoError::Accuracy {
                accuracy: 100.0 * accuracy,
                target: 100.0 * TARGET_ACCURACY,
            });
        }
        Ok(())
    }
}

/// The run's plan, from the job's configuration, the same in every process (a worker
/// restarted while the group is smaller must stop at the step the others stop at): the
/// workers planned and the epochs.
fn planned_run(config: &MultiWorkerConfig) -> Result<(usize, usize), MwmsDemoError> {
    let spec = &config.cluster.cluster;
    let planned_workers = match std::env::var(PLANNED_WORKERS_ENV) {
        Ok(text) => {
            crate::cluster::parse_count(&text, "workers", crate::cluster::WORKERS_MAX_LIMIT)
                .map_err(MwmsDemoError::PlannedWorkers)? as usize
        }
        Err(_) => spec.num_tasks(TaskType::Chief) + spec.num_tasks(TaskType::Worker),
    };
    let epochs = match std::env::var(EPOCHS_ENV) {
        Ok(text) => text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| MwmsDemoError::Setting {
                env: EPOCHS_ENV,
                value: text.clone(),
                wanted: "a whole number from 1 to 10000",
            })?,
        Err(_) => DEFAULT_EPOCHS,
    };
    Ok((planned_workers, epochs))
}

/// The job's checkpoints, where it was given a checkpoint directory: every
/// [`CHECKPOINT_EVERY_EPOCHS`] epochs, the newest 3 kept.
fn open_checkpoints(steps_per_epoch: usize) -> Result<Option<StateCheckpoints>, MwmsDemoError> {
    let Some(dir) = std::env::var_os(ConfigKey::CHECKPOINT_DIR.env) else {
        return Ok(None);
    };
    StateCheckpoints::open(
        std::path::Path::new(&dir),
        Some((CHECKPOINT_EVERY_EPOCHS * steps_per_epoch) as u64),
        3,
    )
    .map(Some)
    .map_err(|e| MwmsDemoError::Checkpoints(Box::new(e)))
}

/// The classifier's accuracy on the held-out digits. The MLP's layers hold candle-nn's
/// `[units, inputs]` weights; the accuracy function takes `[inputs, units]` kernels.
fn held_out_accuracy(
    outcome: &dense_sync::DenseOutcome,
    held_out: &super::digits::Digits,
) -> Result<f32, MwmsDemoError> {
    let variable = |name: &'static str| {
        outcome
            .variables
            .get(name)
            .map(Vec::as_slice)
            .ok_or(MwmsDemoError::MissingVariable(name))
    };
    let kernel = |name: &'static str,
                  inputs: usize,
                  units: usize|
     -> Result<Vec<f32>, MwmsDemoError> {
        let weight = variable(name)?;
        Ok((0..inputs * units)
            .map(|i| weight[(i % units) * inputs + i / units])
            .collect())
    };
    let hidden = kernel("hidden0.weight", PIXELS, HIDDEN)?;
    let logits = kernel("logits.weight", HIDDEN, CLASSES)?;
    let params: Vec<&[f32]> = vec![
        &hidden,
        variable("hidden0.bias")?,
        &logits,
        variable("logits.bias")?,
    ];
    models::mlp_accuracy(
        &[PIXELS, HIDDEN, CLASSES],
        &params,
        &held_out.features,
        &held_out.labels,
    )
    .map_err(MwmsDemoError::from)
}

/// What a member prints and remembers of the group as training goes: whether it leads (the
/// group's first member reports for it, and that changes as the group does), each epoch's
/// losses, and the generations it saw.
struct GroupLog {
    me: crate::cluster::TaskId,
    me_node: cohort_transport::NodeId,
    leads: bool,
    workers: usize,
    group_generation: u64,
    /// This process joined the live group (a restart): it sees the generations from its
    /// admission on.
    joined_live: bool,
    /// `(generation, workers, from step, what happened)`.
    generations: Vec<(u64, usize, usize, String)>,
    epochs: usize,
    steps_per_epoch: usize,
    epoch_losses: Vec<f32>,
    epoch_started: Instant,
}

impl GroupLog {
    fn start(strategy: &MultiWorkerMirrored, epochs: usize, steps_per_epoch: usize) -> Self {
        let me = strategy.task();
        let group = strategy.process_group();
        let joined_live = group.generation() > 1;
        let generations = if joined_live {
            Vec::new()
        } else {
            vec![(group.generation(), group.size(), 0usize, String::new())]
        };
        if joined_live {
            outln!(
                "{me}: found the group training; admitted at generation {} ({} workers)",
                group.generation(),
                group.size()
            );
        }
        Self {
            me_node: crate::cluster::node_id(me),
            me,
            leads: strategy.is_chief(),
            workers: group.size(),
            group_generation: group.generation(),
            joined_live,
            generations,
            epochs,
            steps_per_epoch,
            epoch_losses: Vec::new(),
            epoch_started: Instant::now(),
        }
    }

    /// The group has `members` in `generation` now.
    fn regroup(&mut self, members: &[cohort_transport::NodeId], generation: u64) {
        self.leads = members.first() == Some(&self.me_node);
        self.workers = members.len();
        self.group_generation = generation;
    }

    fn on_event(&mut self, event: ElasticEvent<'_>) {
        match event {
            ElasticEvent::Step { step, loss } => self.on_step(step, loss),
            ElasticEvent::Recovered(r) => {
                self.regroup(&r.members, r.generation);
                let lost: Vec<String> = r.lost.iter().map(ToString::to_string).collect();
                // A re-forming after a partition healed may lose no one.
                let what = if lost.is_empty() {
                    "no worker lost".to_string()
                } else {
                    format!("lost {}", lost.join(", "))
                };
                if self.leads {
                    outln!(
                        "group re-formed: generation {} with {} workers ({what}: {}); going on from \
                         step {} with {} of their state, no checkpoint read",
                        r.generation, self.workers, r.cause, r.step, r.source
                    );
                }
                self.generations
                    .push((r.generation, self.workers, r.step as usize, what));
            }
            ElasticEvent::Departed(d) => {
                self.regroup(&d.members, d.generation);
                let what = d.describe();
                if self.leads {
                    // Only a preemption needs the checkpoint: drained workers leave for good.
                    let checkpoint = if d.saved {
                        "checkpoint saved"
                    } else if d.drained.len() == d.left.len() {
                        "no checkpoint needed"
                    } else {
                        "checkpoint NOT saved"
                    };
                    outln!(
                        "group shrank at step {}: {what}; {checkpoint}; generation {} with {} workers",
                        d.step, d.generation, self.workers
                    );
                }
                self.generations
                    .push((d.generation, self.workers, d.step as usize, what));
            }
            ElasticEvent::Saved { step, dir } => {
                outln!("saved checkpoint of step {step} in {}", dir.display());
            }
            ElasticEvent::Restored { step, dir } => {
                outln!(
                    "resumed from the checkpoint of step {step} in {}",
                    dir.display()
                );
            }
            ElasticEvent::Admitted(a) => {
                self.regroup(&a.members, a.generation);
                let joined: Vec<String> = a.joined.iter().map(ToString::to_string).collect();
                let what = format!("admitted {}", joined.join(", "));
                if a.joined.contains(&self.me_node) {
                    outln!(
                        "{}: received step {}, the variables and the optimizer state from {}",
                        self.me, a.step, a.source
                    );
                }
                if self.leads {
                    outln!(
                        "group grew: generation {} with {} workers ({what}, sent the state of {}); \
                         going on from step {}",
                        a.generation, self.workers, a.source, a.step
                    );
                }
                self.generations
                    .push((a.generation, self.workers, a.step as usize, what));
            }
        }
    }

    /// A step trained: its loss recorded; the leader says when the launcher's chaos kill is
    /// due (midway) and how each epoch went.
    fn on_step(&mut self, step: usize, loss: f32) {
        self.epoch_losses.push(loss);
        crate::status::record_loss(step as u64, f64::from(loss));
        let steps = self.epochs * self.steps_per_epoch;
        if self.leads && step + 1 == steps / 2 {
            // The launcher's chaos kill comes now (`launch --kill-worker-after` is the
            // fallback).
            outln!(
                "{} midway at step {}",
                crate::launch::CHAOS_MARKER,
                step + 1
            );
        }
        if self.leads && (step + 1) % self.steps_per_epoch == 0 {
            let mean = self.epoch_losses.iter().sum::<f32>() / self.epoch_losses.len() as f32;
            let rate =
                self.epoch_losses.len() as f64 / self.epoch_started.elapsed().as_secs_f64();
            outln!(
                "epoch {}/{}: loss {mean:.4}, {rate:.0} steps/s, group generation {} of {} \
                 workers",
                (step + 1) / self.steps_per_epoch,
                self.epochs,
                self.group_generation,
                self.workers
            );
            self.epoch_losses.clear();
            self.epoch_started = Instant::now();
        }
    }

    /// The summary's list of the generations this process saw.
    fn print_generations(&self) {
        if self.joined_live {
            outln!(
                "  group generations (seen by this process of {}, admitted after a restart; the \
                 generations before were its previous process's):",
                self.me
            );
        } else {
            outln!("  group generations:");
        }
        for (epoch, workers, step, what) in &self.generations {
            if what.is_empty() {
                outln!("    generation {epoch}: {workers} workers from step {step}");
            } else {
                outln!("    generation {epoch}: {workers} workers from step {step} ({what})");
            }
        }
    }
}

/// The strategy's settings from the environment (see
/// [`crate::bootstrap::multi_worker_config_from_env`]).
fn task_config() -> Result<MultiWorkerConfig, MwmsDemoError> {
    Ok(crate::bootstrap::multi_worker_config_from_env(
        COMMUNICATION_ENV,
    )?)
}
