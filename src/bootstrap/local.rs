//! `launch`: a whole local cluster of this same executable, one process per task, supervised
//! by the [`crate::launch`] launcher on 127.0.0.1 (the demo's and the tests' cluster). Each task
//! then starts its role through [`super::run_role`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{
    parse_duration_in, ConfigKey, DurationRange, TaskId, TaskType, DEFAULT_PREEMPTION_GRACE,
    WORKERS_MAX_LIMIT,
};
use crate::launch::{self, LaunchConfig, LaunchOutcome, Launcher, RestartLimits};
use crate::process::{
    stop_on_signals, BAD_CONFIG_EXIT_CODE, PREEMPTED_EXIT_CODE, TRAINING_ERROR_EXIT_CODE,
};

/// Environment variable: failure-detection budget, e.g. `"3s"`.
pub const DETECTION_BUDGET_ENV: &str = ConfigKey::DETECTION_BUDGET.env;
/// Environment variable: how long pending work may wait with no live worker, e.g. `"60s"`.
pub const WORKER_WAIT_ENV: &str = ConfigKey::WORKER_WAIT.env;

/// `launch --workers N|MIN:MAX --ps N|MIN:MAX [--kill-worker-after DURATION] [--run-dir DIR]`: a local
/// cluster of this same executable; `extra_args` go to every task.
pub fn launch_from_args(args: &[String], extra_args: Vec<String>) -> i32 {
    match std::env::current_exe() {
        Ok(program) => launch_program_from_args(program, args, extra_args),
        Err(e) => {
            eprintln!("error: cannot find this executable to launch its tasks: {e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// [`launch_from_args`] with every task running `program` (an interpreter, whose script and
/// its arguments are `task_args`: cohort's Python package launches `sys.executable`, which in
/// a virtual environment is not the file the process runs from).
pub fn launch_program_from_args(
    program: std::path::PathBuf,
    args: &[String],
    task_args: Vec<String>,
) -> i32 {
    use clap::Parser;
    let parsed = match LaunchArgs::try_parse_from(
        std::iter::once("launch".to_string()).chain(args.iter().cloned()),
    ) {
        Ok(parsed) => parsed,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                BAD_CONFIG_EXIT_CODE
            } else {
                0
            };
        }
    };
    launch_program(program, &parsed.flags, task_args, Vec::new())
}

/// The help of `launch`'s flags for a launcher of another front end (`python -m cohort
/// launch`): `usage` follows "Usage: " and `about` heads the text; the flags are
/// [`LaunchFlags`]'.
pub fn launch_help(usage: &str, about: &str) -> String {
    use clap::CommandFactory;
    LaunchArgs::command()
        .override_usage(usage.to_string())
        .about(about.to_string())
        .render_help()
        .to_string()
}

/// Workers a launch starts without `--workers`.
pub const DEFAULT_WORKERS: &str = "2";
/// Parameter servers a parameter-server launch starts without `--ps`.
pub const DEFAULT_PS: &str = "2";

/// Flags of `launch`.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchFlags {
    /// Worker processes: N, or MIN:MAX to start MIN and allow up to MAX (elastic workers:
    /// `cohort scale --run-dir DIR --workers N` grows or shrinks the job; give --run-dir).
    #[arg(long, default_value = DEFAULT_WORKERS, value_parser = WorkerCount::parse)]
    pub workers: WorkerCount,
    /// Parameter-server processes: N, or MIN:MAX to start MIN and allow up to MAX (elastic
    /// servers: `cohort scale --run-dir DIR --ps N` adds or removes servers, each at a
    /// checkpoint cut; the job needs a checkpoint directory).
    #[arg(long, default_value = DEFAULT_PS, value_parser = WorkerCount::parse)]
    pub ps: WorkerCount,
    /// Evaluator processes (at most 16): each evaluates every new checkpoint with the
    /// program's evaluation function (the demo's reports held-out digits accuracy).
    #[arg(long, default_value_t = 0, value_parser = parse_evaluators)]
    pub evaluators: u32,
    /// SIGKILL worker 1 (or 0 with one worker) once, this long after launch, to show recovery
    /// (e.g. "20s").
    #[arg(long, value_parser = |s: &str| parse_duration_in("--kill-worker-after", s, KILL_AFTER_RANGE))]
    pub kill_worker_after: Option<Duration>,
    /// SIGKILL parameter server 0 once, this long after launch, to show its restore from the
    /// newest checkpoint (e.g. "20s"; not with --kill-worker-after).
    #[arg(long, conflicts_with = "kill_worker_after", value_parser = |s: &str| parse_duration_in("--kill-ps-after", s, KILL_AFTER_RANGE))]
    pub kill_ps_after: Option<Duration>,
    /// Directory for the run's certificates (default: a new temporary directory).
    #[arg(long)]
    pub run_dir: Option<std::path::PathBuf>,
    /// Failure-detection budget of every task.
    #[arg(long, default_value = "3s", value_parser = |s: &str| parse_duration_in("--detection-budget", s, detection_budget_range()))]
    pub detection_budget: Duration,
    /// Local replicas of every worker: each scheduled step runs on them (threads), their
    /// gradients summed in the worker before its one push (sets `replicas` in every task).
    #[arg(long, default_value_t = 1, value_parser = parse_replicas)]
    pub replicas: u32,
    /// Serve no metrics (by default every task serves Prometheus metrics and /healthz on a
    /// free loopback port, recorded in `<run-dir>/metrics/<role>-<index>.addr`).
    #[arg(long)]
    pub no_metrics: bool,
    /// The chief is a peer of the workers (a MultiWorkerMirrored job, which sets it): see
    /// [`LaunchConfig::peer_chief`].
    #[arg(skip)]
    pub peer_chief: bool,
}

impl LaunchFlags {
    /// The cluster a benchmark launches: 1 chief, 2 parameter servers and 2 workers, one
    /// replica each, with the default detection budget, in `run_dir`; every task serving
    /// metrics where `metrics`.
    pub(crate) fn bench_cluster(run_dir: std::path::PathBuf, metrics: bool) -> Self {
        Self {
            workers: 2.into(),
            ps: 2.into(),
            evaluators: 0,
            kill_worker_after: None,
            kill_ps_after: None,
            run_dir: Some(run_dir),
            detection_budget: Duration::from_secs(3),
            replicas: 1,
            no_metrics: !metrics,
            peer_chief: false,
        }
    }
}

/// The most evaluator processes a local cluster starts (each evaluates every checkpoint).
const EVALUATORS_LIMIT: u32 = 16;

/// `launch --evaluators`: a whole number from 0 to [`EVALUATORS_LIMIT`].
fn parse_evaluators(text: &str) -> Result<u32, EvaluatorCountError> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= EVALUATORS_LIMIT)
        .ok_or_else(|| EvaluatorCountError {
            text: text.to_string(),
        })
}

/// A `launch --evaluators` that is not a whole number from 0 to [`EVALUATORS_LIMIT`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a number of evaluators (a whole number from 0 to {EVALUATORS_LIMIT})")]
struct EvaluatorCountError {
    /// The text given.
    text: String,
}

/// `launch --replicas`: a whole number from 1 to [`crate::cluster::REPLICAS_LIMIT`]; the error
/// is the cluster module's count error (not nameable here: `cluster` does not re-export it).
fn parse_replicas(text: &str) -> Result<u32, impl std::error::Error + Send + Sync + 'static> {
    crate::cluster::parse_count(text, "replicas", crate::cluster::REPLICAS_LIMIT)
}

/// The range of `launch --detection-budget`: that of the key it sets in every task.
fn detection_budget_range() -> DurationRange {
    ConfigKey::DETECTION_BUDGET
        .duration_range()
        .unwrap_or(KILL_AFTER_RANGE)
}

/// How many workers (or parameter servers) a launched job starts with, and the most it may
/// have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerCount {
    /// Workers started.
    pub min: u32,
    /// The most workers the job may have (at least `min`).
    pub max: u32,
}

impl WorkerCount {
    /// `N` (a fixed number) or `MIN:MAX`, each from 1 to [`WORKERS_MAX_LIMIT`], MIN ≤ MAX.
    pub fn parse(text: &str) -> Result<Self, WorkerCountError> {
        let number = |part: &str| {
            part.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=WORKERS_MAX_LIMIT).contains(n))
                .ok_or_else(|| WorkerCountError::NotACount {
                    text: text.to_string(),
                })
        };
        let (min, max) = match text.split_once(':') {
            Some((min, max)) => (number(min)?, number(max)?),
            None => {
                let n = number(text)?;
                (n, n)
            }
        };
        if min > max {
            return Err(WorkerCountError::MinAboveMax {
                text: text.to_string(),
                min,
                max,
            });
        }
        Ok(Self { min, max })
    }
}

/// Why a `--workers` or `--ps` value is not a [`WorkerCount`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerCountError {
    /// Not `N` or `MIN:MAX` with each a whole number in range.
    #[error("{text:?}: expected N or MIN:MAX, each a whole number from 1 to {WORKERS_MAX_LIMIT}")]
    NotACount {
        /// The value given.
        text: String,
    },
    /// `MIN:MAX` with MIN above MAX.
    #[error("{text:?}: MIN ({min}) is above MAX ({max})")]
    MinAboveMax {
        /// The value given.
        text: String,
        /// Its MIN.
        min: u32,
        /// Its MAX.
        max: u32,
    },
}

impl From<u32> for WorkerCount {
    fn from(n: u32) -> Self {
        Self { min: n, max: n }
    }
}

impl std::fmt::Display for WorkerCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

#[derive(Debug, clap::Parser)]
pub(crate) struct LaunchArgs {
    #[command(flatten)]
    pub(crate) flags: LaunchFlags,
}

/// Runs a local cluster per `flags`; every task runs this executable with `task_args`.
pub fn launch_local(
    flags: &LaunchFlags,
    task_args: Vec<String>,
    env: Vec<(String, String)>,
) -> i32 {
    match std::env::current_exe() {
        Ok(program) => launch_program(program, flags, task_args, env),
        Err(e) => {
            eprintln!("error: cannot find this executable to launch its tasks: {e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// Runs a local cluster per `flags`; every task runs `program` with `task_args`.
pub fn launch_program(
    program: std::path::PathBuf,
    flags: &LaunchFlags,
    task_args: Vec<String>,
    mut env: Vec<(String, String)>,
) -> i32 {
    if let Err(e) = super::logging::init() {
        // No subscriber to report through.
        eprintln!("error: bad config: {e}");
        return BAD_CONFIG_EXIT_CODE;
    }
    super::logging::set_launcher();
    let run_dir = match make_dirs(flags, &env) {
        Ok(dir) => dir,
        Err(code) => return code,
    };
    env.push((
        DETECTION_BUDGET_ENV.into(),
        crate::cluster::format_duration(flags.detection_budget),
    ));
    if flags.replicas > 1 {
        env.push((ConfigKey::REPLICAS.env.into(), flags.replicas.to_string()));
    }
    // Every task shares this machine's cores: one compute thread per task beats several
    // tasks each spreading a matrix product over all cores and fighting for them.
    if !crate::process::compute_threads_given() {
        env.push((crate::process::COMPUTE_THREADS_ENV.into(), "1".into()));
    }
    let victim = TaskId::new(TaskType::Worker, u32::from(flags.workers.min > 1));
    let stop_grace = launched_preemption_grace(&env) + STOP_GRACE_MARGIN;
    let config = LaunchConfig {
        num_workers: flags.workers.min,
        num_ps: flags.ps.min,
        num_evaluators: flags.evaluators,
        program,
        args: task_args,
        env,
        run_dir: run_dir.clone(),
        restart: RestartLimits {
            restarts_max: 5,
            window: Duration::from_secs(60),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
        },
        // Room for the chief's preemption checkpoint (its grace comes from the same
        // environment the children inherit), then a margin.
        stop_grace,
        kill_once: flags
            .kill_worker_after
            .map(|after| (victim, after))
            .or(flags
                .kill_ps_after
                .map(|after| (TaskId::new(TaskType::Ps, 0), after))),
        // As Kubernetes would: a chief that asks for a restart resumes from its checkpoint.
        restart_chief: true,
        metrics: !flags.no_metrics,
        peer_chief: flags.peer_chief,
        json_logs: super::logging::json_format(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = stop_on_signals(&stop) {
        tracing::warn!("cannot watch for Ctrl-C/SIGTERM: {e}");
    }
    let mut launcher =
        match Launcher::start_elastic_servers(config, flags.workers.max, flags.ps.max) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{e}");
                return if matches!(e, launch::LaunchError::Cluster(_)) {
                    BAD_CONFIG_EXIT_CODE
                } else {
                    TRAINING_ERROR_EXIT_CODE
                };
            }
        };
    announce(flags, &run_dir, &launcher);
    let outcome = launcher.supervise(&stop);
    drop(launcher);
    if flags.run_dir.is_none() {
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    match outcome {
        Ok(LaunchOutcome::ChiefExited(code)) => code,
        Ok(LaunchOutcome::WorkersFinished) => 0,
        // The chief's own code when it exited while stopping (143 after its preemption
        // checkpoint, anything else it returned); 143 when it had to be killed.
        Ok(LaunchOutcome::Stopped { chief }) => chief.unwrap_or(PREEMPTED_EXIT_CODE),
        Err(e) => {
            tracing::error!("{e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// The run directory (`--run-dir`, else a new temporary one) and the checkpoint directory the
/// job is given (in `env`, or this process's environment), created before any task starts: a
/// directory the job cannot have is bad configuration. `Err`: the exit code.
fn make_dirs(flags: &LaunchFlags, env: &[(String, String)]) -> Result<std::path::PathBuf, i32> {
    let run_dir = match flags.run_dir.clone() {
        Some(dir) => dir,
        None => match crate::process::new_temp_dir("cohort-run-") {
            Ok(dir) => dir,
            Err(e) => {
                tracing::error!(
                    "cannot make a run directory under {}: {e}",
                    std::env::temp_dir().display()
                );
                return Err(crate::process::BAD_CONFIG_EXIT_CODE);
            }
        },
    };
    // A directory the job cannot have is bad configuration, said before any task starts.
    let checkpoint_dir = env
        .iter()
        .find(|(key, _)| key == ConfigKey::CHECKPOINT_DIR.env)
        .map(|(_, dir)| std::path::PathBuf::from(dir))
        .or_else(|| std::env::var_os(ConfigKey::CHECKPOINT_DIR.env).map(Into::into));
    let wanted = [
        ("--run-dir", Some(&run_dir)),
        ("checkpoint_dir", checkpoint_dir.as_ref()),
    ];
    for (what, dir) in wanted {
        let Some(dir) = dir else { continue };
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::error!(
                "bad config: {what} {}: cannot create it: {e}",
                dir.display()
            );
            return Err(BAD_CONFIG_EXIT_CODE);
        }
    }
    Ok(run_dir)
}

/// Says what the launcher started, how to scale it where it is elastic, and where each task
/// serves its metrics.
fn announce(flags: &LaunchFlags, run_dir: &std::path::Path, launcher: &Launcher) {
    tracing::info!(
        "started {} parameter server(s) and {} worker(s) and the chief on 127.0.0.1 (certificates in {})",
        flags.ps.min,
        flags.workers.min,
        run_dir.join("certs").display()
    );
    if flags.ps.max > flags.ps.min {
        tracing::info!(
            "elastic: up to {} parameter servers; `cohort scale --run-dir {} --ps N` adds or removes servers (each at a checkpoint cut)",
            flags.ps.max,
            run_dir.display()
        );
    }
    if flags.workers.max > flags.workers.min {
        tracing::info!(
            "elastic: up to {} workers; `cohort scale --run-dir {} --workers N` grows or shrinks the job",
            flags.workers.max,
            run_dir.display()
        );
    }
    for (task, addr) in launcher.metrics_addrs() {
        tracing::info!("{task}: metrics on http://{addr}/metrics");
    }
}

/// The preemption grace the launched tasks will use: from their extra environment `env`, else
/// from this process's environment (which they inherit), else the default.
fn launched_preemption_grace(env: &[(String, String)]) -> Duration {
    let key = ConfigKey::PREEMPTION_GRACE.env;
    env.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var(key).ok())
        .and_then(|v| {
            let range = ConfigKey::PREEMPTION_GRACE.duration_range()?;
            parse_duration_in(key, &v, range).ok()
        })
        .unwrap_or(DEFAULT_PREEMPTION_GRACE)
}

/// Range of `launch --kill-worker-after`: a demo's failure comes within a day of its start.
const KILL_AFTER_RANGE: DurationRange =
    DurationRange::new(Duration::ZERO, Duration::from_secs(24 * 3600));
/// What the launcher adds to the preemption grace before it SIGKILLs a stopping task.
const STOP_GRACE_MARGIN: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_n_or_min_to_max_and_anything_else_is_refused_by_name() {
        assert_eq!(WorkerCount::parse("3"), Ok(WorkerCount { min: 3, max: 3 }));
        assert_eq!(
            WorkerCount::parse("2:4"),
            Ok(WorkerCount { min: 2, max: 4 })
        );
        assert_eq!(WorkerCount::parse("2:4").unwrap().to_string(), "2:4");
        assert_eq!(WorkerCount::from(2).to_string(), "2");
        let err = WorkerCount::parse("4:2").unwrap_err();
        assert_eq!(
            err,
            WorkerCountError::MinAboveMax {
                text: "4:2".into(),
                min: 4,
                max: 2
            }
        );
        assert_eq!(err.to_string(), "\"4:2\": MIN (4) is above MAX (2)");
        for bad in ["0", "0:2", "2:", ":2", "x", "1:10001", "-1"] {
            let err = WorkerCount::parse(bad).unwrap_err();
            assert!(
                matches!(err, WorkerCountError::NotACount { .. }),
                "{bad}: {err}"
            );
            assert!(
                err.to_string().contains("expected N or MIN:MAX"),
                "{bad}: {err}"
            );
        }
    }
}
