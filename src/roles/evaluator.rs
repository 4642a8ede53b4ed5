//! The evaluator role (TensorFlow's sidecar evaluator): a process that does not join training
//! but watches the checkpoint directory, and evaluates every newer valid checkpoint with the
//! program's evaluation function ([`crate::program::Program::evaluator`]).
//!
//! For each checkpoint it evaluates, it reports one log event (info, with a `step` field; see
//! [`crate::bootstrap::LOG_FORMAT_ENV`] for the formats), in text:
//!
//! ```text
//! 2026-11-25T23:50:01.123Z  INFO evaluator/0: step 200: accuracy=0.9583333333333334 loss=0.1234 step=200
//! ```
//!
//! Values are printed in full (Rust's shortest exact `f64` form), in the order the function
//! returned them. The same metrics go, at the checkpoint's step, to a TensorBoard event file
//! under `<checkpoint_dir>/logs/eval` ([`crate::summary`]; a failure to write it is a warning).
//!
//! What it does with the checkpoint directory (`checkpoint_dir`): it lists `ckpt-<step>`
//! directories and reads them with [`read_checkpoint`], which verifies the manifest, sizes and
//! checksums as restore does (CKPT-1). It writes nothing there but its summaries under
//! `logs/eval` and never removes anything (the
//! leftovers of crashed saves belong to the chief). A checkpoint that does not verify is
//! skipped with a message naming the file, and not read again; the next newest one that is
//! still newer than the last evaluated is tried instead.
//!
//! It stops:
//! - with exit code 0 after evaluating a checkpoint at `eval_until_step` or later, if set;
//! - with exit code 0 when no new checkpoint has appeared for `eval_idle_timeout` (default
//!   [`crate::cluster::DEFAULT_EVAL_IDLE_TIMEOUT`]), counted from the start or from the last
//!   checkpoint it read (evaluated or skipped);
//! - with exit code 143 on SIGTERM or SIGINT, at once (an evaluation in progress is dropped:
//!   nothing is lost, the evaluator writes no checkpoint);
//! - with exit code 1 when the evaluation function fails or panics;
//! - with exit code 2 when the program registers no evaluation function or no
//!   `checkpoint_dir` is configured.
//!
//! The decisions (which checkpoint next, when to stop) live in [`Watch`], a pure state machine;
//! [`run_evaluator`] does the IO.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::checkpoint::{list_checkpoints, read_checkpoint, CheckpointEntry, LoadError};
use crate::cluster::{format_duration, RoleConfig};
use crate::roles::eval_fn::{CheckpointVariables, Metrics};
use crate::roles::registry::{EvalFn, Program};

/// The evaluator's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchConfig {
    /// Time between two listings of the checkpoint directory when nothing is new.
    pub poll_interval: Duration,
    /// Stop after this long with no new checkpoint.
    pub idle_timeout: Duration,
    /// Stop after evaluating a checkpoint at this step or later.
    pub until_step: Option<u64>,
}

/// What the evaluator does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchAction {
    /// Read, verify and evaluate this checkpoint, then report with
    /// [`Watch::handle_evaluated`] or [`Watch::handle_corrupt`].
    Evaluate(CheckpointEntry),
    /// Nothing new: list the directory again after this long.
    Wait(Duration),
    /// Stop (exit 0).
    Stop(StopReason),
}

/// Why the evaluator stops by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// No new checkpoint for this long (at least the idle timeout).
    Idle {
        /// Time since the start or the last checkpoint read.
        idle_for: Duration,
    },
    /// A checkpoint at `step` was evaluated, at or past `until_step`.
    ReachedStep {
        /// The step evaluated.
        step: u64,
        /// The configured limit.
        until_step: u64,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Idle { idle_for } => write!(
                f,
                "no new checkpoint for {} (eval_idle_timeout)",
                format_duration(*idle_for)
            ),
            StopReason::ReachedStep { step, until_step } => {
                write!(f, "evaluated step {step} (eval_until_step {until_step})")
            }
        }
    }
}

/// The evaluator's decisions, without IO: which checkpoint to evaluate next, how long to wait,
/// when to stop. Time is passed in.
///
/// Calling protocol:
/// 1. [`new`](Self::new) with the limits and the current time;
/// 2. list the checkpoint directory and pass the entries to
///    [`handle_listing`](Self::handle_listing), which says what to do;
/// 3. after an [`WatchAction::Evaluate`], report [`handle_evaluated`](Self::handle_evaluated)
///    (the checkpoint verified and was evaluated) or [`handle_corrupt`](Self::handle_corrupt)
///    (it did not verify); after a [`WatchAction::Wait`], wait; then go to 2. Stop at
///    [`WatchAction::Stop`].
///
/// Only a checkpoint newer than the last one evaluated is ever chosen, the newest first; one
/// reported corrupt is never chosen again (CKPT-1: nothing that failed to verify is used).
#[derive(Debug, Clone)]
pub struct Watch {
    config: WatchConfig,
    last_evaluated: Option<u64>,
    corrupt: BTreeSet<u64>,
    idle_since: Instant,
    stop: Option<StopReason>,
}

impl Watch {
    /// A watch that has evaluated nothing yet, idle since `now`.
    pub fn new(config: WatchConfig, now: Instant) -> Self {
        Self {
            config,
            last_evaluated: None,
            corrupt: BTreeSet::new(),
            idle_since: now,
            stop: None,
        }
    }

    /// The step of the last checkpoint evaluated.
    pub fn last_evaluated(&self) -> Option<u64> {
        self.last_evaluated
    }

    /// What to do, given the checkpoint directories listed at `now` (any order).
    pub fn handle_listing(&mut self, entries: &[CheckpointEntry], now: Instant) -> WatchAction {
        if let Some(reason) = self.stop {
            return WatchAction::Stop(reason);
        }
        // Forget corrupt checkpoints that are gone (retention), so the set stays bounded by
        // what the directory holds.
        self.corrupt
            .retain(|step| entries.iter().any(|e| e.step == *step));
        let newest = entries
            .iter()
            .filter(|e| self.last_evaluated.is_none_or(|last| e.step > last))
            .filter(|e| !self.corrupt.contains(&e.step))
            .max_by_key(|e| e.step);
        if let Some(entry) = newest {
            return WatchAction::Evaluate(entry.clone());
        }
        let idle_for = now.saturating_duration_since(self.idle_since);
        if idle_for >= self.config.idle_timeout {
            let reason = StopReason::Idle { idle_for };
            self.stop = Some(reason);
            return WatchAction::Stop(reason);
        }
        WatchAction::Wait(
            self.config
                .poll_interval
                .min(self.config.idle_timeout - idle_for),
        )
    }

    /// The checkpoint at `step` verified and was evaluated at `now`.
    pub fn handle_evaluated(&mut self, step: u64, now: Instant) {
        self.last_evaluated = Some(self.last_evaluated.map_or(step, |last| last.max(step)));
        self.idle_since = now;
        if let Some(until_step) = self.config.until_step {
            if step >= until_step {
                self.stop = Some(StopReason::ReachedStep { step, until_step });
            }
        }
    }

    /// The checkpoint at `step` did not verify at `now`: it is never chosen again.
    pub fn handle_corrupt(&mut self, step: u64, now: Instant) {
        self.corrupt.insert(step);
        self.idle_since = now;
    }
}

/// Why the evaluator role could not run or ended in failure.
#[derive(Debug, thiserror::Error)]
pub enum EvaluatorError {
    /// The configuration or the program does not allow an evaluator (exit 2).
    #[error("{0}")]
    Config(String),
    /// The evaluation function failed or panicked (exit 1).
    #[error("{0}")]
    Failed(String),
}

/// Runs the evaluator role of `program` with `config` until it stops (see the module doc);
/// returns the exit code: 0 (stopped by itself) or 143 (SIGTERM/SIGINT).
pub fn run_evaluator(program: &Program, config: &RoleConfig) -> Result<i32, EvaluatorError> {
    let evaluate = program.evaluator_fn().cloned().ok_or_else(|| {
        EvaluatorError::Config(format!(
            "task.type: this process is an evaluator, but program {:?} registers no evaluation \
             function (Program::evaluator)",
            program.name()
        ))
    })?;
    let root = config.checkpoint_dir.clone().ok_or_else(|| {
        EvaluatorError::Config(
            "checkpoint_dir: the evaluator needs the checkpoint directory to watch: pass \
             --checkpoint-dir, set COHORT_CHECKPOINT_DIR, or set checkpoint_dir in cohort.toml"
                .into(),
        )
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = crate::process::stop_on_signals(&stop) {
        tracing::warn!("cannot watch for SIGTERM/SIGINT: {e}");
    }
    let watch_config = WatchConfig {
        poll_interval: POLL_INTERVAL,
        idle_timeout: config.eval_idle_timeout,
        until_step: config.eval_until_step,
    };
    tracing::info!(
        "watching {} for checkpoints (stops after {} with none new{})",
        root.display(),
        format_duration(watch_config.idle_timeout),
        watch_config
            .until_step
            .map(|s| format!(" or after step {s}"))
            .unwrap_or_default()
    );
    let mut summaries =
        crate::summary::JobSummaries::create(&crate::summary::logs_dir(&root, "eval"));
    let mut watch = Watch::new(watch_config, Instant::now());
    let mut listing_failed = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            tracing::info!("stop requested (SIGTERM): exiting");
            return Ok(crate::process::PREEMPTED_EXIT_CODE);
        }
        let entries = match list_checkpoints(&root) {
            Ok(entries) => {
                listing_failed = false;
                entries
            }
            Err(e) => {
                // Retried at the next poll; the idle timeout bounds how long.
                if !listing_failed {
                    tracing::warn!("{e}");
                }
                listing_failed = true;
                Vec::new()
            }
        };
        match watch.handle_listing(&entries, Instant::now()) {
            WatchAction::Evaluate(entry) => {
                let began = Instant::now();
                let Some(outcome) = evaluate_in_thread(&entry.dir, &evaluate, &stop) else {
                    continue; // stopped: reported at the top of the loop
                };
                let instruments = crate::metrics::instruments();
                match outcome {
                    Outcome::Evaluated { step, metrics } => {
                        instruments.evaluations.inc();
                        instruments
                            .evaluation_seconds
                            .observe(began.elapsed().as_secs_f64());
                        instruments
                            .evaluated_step
                            .set(i64::try_from(step).unwrap_or(i64::MAX));
                        tracing::info!(step, "step {step}: {}", format_metrics(&metrics));
                        let scalars: Vec<(&str, f64)> =
                            metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                        summaries.scalars(step, &scalars);
                        watch.handle_evaluated(entry.step, Instant::now());
                    }
                    Outcome::Corrupt(error) => {
                        instruments.evaluations_skipped.inc();
                        tracing::warn!("skipped checkpoint {}: {error}", entry.dir.display());
                        watch.handle_corrupt(entry.step, Instant::now());
                    }
                    Outcome::Failed(message) => {
                        return Err(EvaluatorError::Failed(format!(
                            "evaluating {}: {message}",
                            entry.dir.display()
                        )))
                    }
                }
            }
            WatchAction::Wait(wait) => sleep_unless_stopped(wait, &stop),
            WatchAction::Stop(reason) => {
                tracing::info!("{reason}: stopping");
                return Ok(0);
            }
        }
    }
}

/// The metrics as printed after `step N: `: `name=value` separated by spaces.
pub fn format_metrics(metrics: &[(String, f64)]) -> String {
    if metrics.is_empty() {
        return "(no metrics)".into();
    }
    metrics
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What reading and evaluating one checkpoint gave.
enum Outcome {
    Evaluated { step: u64, metrics: Metrics },
    Corrupt(LoadError),
    Failed(String),
}

/// Reads, verifies and evaluates the checkpoint in `dir` on a thread of its own, so that a stop
/// request is answered at once even while a large checkpoint is hashed or a slow evaluation
/// runs. `None` when stopped first.
fn evaluate_in_thread(dir: &Path, evaluate: &EvalFn, stop: &AtomicBool) -> Option<Outcome> {
    let (tx, rx) = mpsc::channel();
    let dir = dir.to_path_buf();
    let evaluate = Arc::clone(evaluate);
    let spawned = std::thread::Builder::new()
        .name("evaluator".into())
        .spawn(move || {
            // The user's function panicking is a failed evaluation (exit 1), not a crash: the
            // sender is dropped unsent and the loop below says so.
            let outcome = cohort_actors::contain_panic(std::panic::AssertUnwindSafe(|| {
                evaluate_checkpoint(&dir, &evaluate)
            }));
            if let Ok(outcome) = outcome {
                let _ = tx.send(outcome);
            }
        });
    if let Err(e) = spawned {
        return Some(Outcome::Failed(format!("cannot start a thread: {e}")));
    }
    loop {
        match rx.recv_timeout(STOP_CHECK_INTERVAL) {
            Ok(outcome) => return Some(outcome),
            Err(mpsc::RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Some(Outcome::Failed("the evaluation function panicked".into()))
            }
        }
    }
}

fn evaluate_checkpoint(dir: &Path, evaluate: &EvalFn) -> Outcome {
    let loaded = match read_checkpoint(dir) {
        Ok(loaded) => loaded,
        Err(error) => return Outcome::Corrupt(error),
    };
    let variables = match CheckpointVariables::from_checkpoint(&loaded.checkpoint, dir) {
        Ok(variables) => variables,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match evaluate(&variables) {
        Ok(metrics) => Outcome::Evaluated {
            step: variables.step(),
            metrics,
        },
        Err(e) => Outcome::Failed(format!("the evaluation function failed: {e}")),
    }
}

fn sleep_unless_stopped(wait: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + wait;
    loop {
        let now = Instant::now();
        if now >= deadline || stop.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(STOP_CHECK_INTERVAL.min(deadline - now));
    }
}

/// Time between two listings of the checkpoint directory when nothing is new.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a wait looks whether a stop was requested.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, TensorBytes};
    use crate::layout::{Dtype, Layout, Shard};
    use crate::roles::eval_fn::EvalError;
    use std::path::PathBuf;

    const IDLE: Duration = Duration::from_secs(10);

    fn watch(until_step: Option<u64>, t0: Instant) -> Watch {
        Watch::new(
            WatchConfig {
                poll_interval: POLL_INTERVAL,
                idle_timeout: IDLE,
                until_step,
            },
            t0,
        )
    }

    fn entries(steps: &[u64]) -> Vec<CheckpointEntry> {
        steps
            .iter()
            .map(|&step| CheckpointEntry {
                step,
                dir: PathBuf::from(format!("root/ckpt-{step}")),
            })
            .collect()
    }

    fn evaluate(step: u64) -> WatchAction {
        WatchAction::Evaluate(CheckpointEntry {
            step,
            dir: PathBuf::from(format!("root/ckpt-{step}")),
        })
    }

    #[test]
    fn the_newest_checkpoint_is_evaluated_first_and_older_ones_never() {
        let t0 = Instant::now();
        let mut w = watch(None, t0);
        assert_eq!(w.handle_listing(&entries(&[20, 10, 30]), t0), evaluate(30));
        w.handle_evaluated(30, t0);
        assert_eq!(
            w.handle_listing(&entries(&[10, 20, 30]), t0),
            WatchAction::Wait(POLL_INTERVAL)
        );
        assert_eq!(w.handle_listing(&entries(&[20, 30, 40]), t0), evaluate(40));
        w.handle_evaluated(40, t0);
        assert_eq!(w.last_evaluated(), Some(40));
    }

    #[test]
    fn ckpt1_a_corrupt_checkpoint_is_skipped_for_the_next_newer_than_the_last_evaluated() {
        let t0 = Instant::now();
        let mut w = watch(None, t0);
        assert_eq!(w.handle_listing(&entries(&[10]), t0), evaluate(10));
        w.handle_evaluated(10, t0);
        assert_eq!(w.handle_listing(&entries(&[10, 20, 30]), t0), evaluate(30));
        w.handle_corrupt(30, t0);
        assert_eq!(w.handle_listing(&entries(&[10, 20, 30]), t0), evaluate(20));
        w.handle_corrupt(20, t0);
        // Both corrupt, 10 done: nothing to do, and the corrupt ones are never tried again.
        assert_eq!(
            w.handle_listing(&entries(&[10, 20, 30]), t0),
            WatchAction::Wait(POLL_INTERVAL)
        );
        assert_eq!(w.handle_listing(&entries(&[20, 30, 40]), t0), evaluate(40));
        // Gone from the directory: forgotten.
        w.handle_evaluated(40, t0);
        w.handle_listing(&entries(&[40]), t0);
        assert!(w.corrupt.is_empty());
    }

    #[test]
    fn it_stops_after_the_idle_timeout_with_nothing_new() {
        let t0 = Instant::now();
        let mut w = watch(None, t0);
        assert_eq!(w.handle_listing(&[], t0), WatchAction::Wait(POLL_INTERVAL));
        // The wait never overshoots the idle deadline.
        let late = t0 + IDLE - Duration::from_millis(300);
        assert_eq!(
            w.handle_listing(&[], late),
            WatchAction::Wait(Duration::from_millis(300))
        );
        // A checkpoint read (here, evaluated) restarts the idle clock.
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(w.handle_listing(&entries(&[5]), t1), evaluate(5));
        w.handle_evaluated(5, t1);
        assert_eq!(
            w.handle_listing(&entries(&[5]), t0 + IDLE),
            WatchAction::Wait(POLL_INTERVAL)
        );
        let action = w.handle_listing(&entries(&[5]), t1 + IDLE);
        assert_eq!(
            action,
            WatchAction::Stop(StopReason::Idle { idle_for: IDLE })
        );
        // Stopped stays stopped, even if a checkpoint appears.
        assert_eq!(w.handle_listing(&entries(&[5, 6]), t1 + IDLE), action);
    }

    #[test]
    fn a_corrupt_checkpoint_also_restarts_the_idle_clock() {
        let t0 = Instant::now();
        let mut w = watch(None, t0);
        let t1 = t0 + IDLE - Duration::from_secs(1);
        assert_eq!(w.handle_listing(&entries(&[7]), t1), evaluate(7));
        w.handle_corrupt(7, t1);
        assert_eq!(
            w.handle_listing(&entries(&[7]), t0 + IDLE),
            WatchAction::Wait(POLL_INTERVAL)
        );
    }

    #[test]
    fn it_stops_after_evaluating_a_checkpoint_at_the_until_step() {
        let t0 = Instant::now();
        let mut w = watch(Some(25), t0);
        assert_eq!(w.handle_listing(&entries(&[10]), t0), evaluate(10));
        w.handle_evaluated(10, t0);
        // A corrupt checkpoint past the limit does not stop it.
        assert_eq!(w.handle_listing(&entries(&[10, 30]), t0), evaluate(30));
        w.handle_corrupt(30, t0);
        assert_eq!(
            w.handle_listing(&entries(&[10, 30]), t0),
            WatchAction::Wait(POLL_INTERVAL)
        );
        assert_eq!(w.handle_listing(&entries(&[10, 30, 40]), t0), evaluate(40));
        w.handle_evaluated(40, t0);
        assert_eq!(
            w.handle_listing(&entries(&[10, 30, 40, 50]), t0),
            WatchAction::Stop(StopReason::ReachedStep {
                step: 40,
                until_step: 25
            })
        );
    }

    #[test]
    fn variables_are_put_back_together_from_their_parts() {
        let mut ckpt = Checkpoint::new(12, 2);
        ckpt.layout.push(Layout {
            name: "w".into(),
            dtype: Dtype::F32,
            shape: vec![3, 2],
            shards: vec![Shard { ps: 1, rows: 0..2 }, Shard { ps: 0, rows: 2..3 }],
        });
        ckpt.layout
            .push(Layout::unsharded("b", Dtype::F32, vec![2], 0));
        let part = |shape, values: &[f32]| TensorBytes::from_f32(shape, values).unwrap();
        ckpt.shards[1]
            .tensors
            .insert("w/part_0".into(), part(vec![2, 2], &[1.0, 2.0, 3.0, 4.0]));
        ckpt.shards[1].tensors.insert(
            "w/part_0/slot/accumulator".into(),
            part(vec![2, 2], &[9.0; 4]),
        );
        ckpt.shards[0]
            .tensors
            .insert("w/part_1".into(), part(vec![1, 2], &[5.0, 6.0]));
        ckpt.shards[0]
            .tensors
            .insert("b".into(), part(vec![2], &[-1.0, -2.0]));
        ckpt.validate().unwrap();
        let vars = CheckpointVariables::from_checkpoint(&ckpt, "root/ckpt-12").unwrap();
        assert_eq!(vars.step(), 12);
        assert_eq!(vars.names().collect::<Vec<_>>(), ["b", "w"]);
        assert_eq!(vars.get("w").unwrap().shape(), [3, 2]);
        assert_eq!(vars.f32("w").unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(vars.f32("b").unwrap(), [-1.0, -2.0]);
        assert!(matches!(
            vars.f32("nope"),
            Err(EvalError::MissingVariable { .. })
        ));
    }

    #[test]
    fn metrics_print_exactly_in_order() {
        let metrics = vec![("loss".to_string(), 0.1 + 0.2), ("acc".to_string(), 1.0)];
        assert_eq!(format_metrics(&metrics), "loss=0.30000000000000004 acc=1");
        assert_eq!(format_metrics(&[]), "(no metrics)");
    }
}
