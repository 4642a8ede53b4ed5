//! The local launcher: runs a whole cluster as separate processes on 127.0.0.1 and supervises
//! them, the way Kubernetes would in production (DESIGN §4: the process-level supervisor).
//!
//! It owns: an ephemeral cluster CA and the node certificates; free loopback ports; one child
//! process per task (the same program, its role given through `TF_CONFIG`); restarting a task
//! that dies, with backoff and a restart budget ([`RestartPolicy`] from `cohort-actors`);
//! forwarding SIGINT/SIGTERM to every child; and streaming child output with a role prefix.
//! It never looks inside training: the job ends when the chief exits (in a MultiWorkerMirrored
//! job, whose chief is a peer, not when it leaves on a preemption notice:
//! [`LaunchConfig::peer_chief`]). A task other than the
//! chief that exits with code 0 has finished (the chief said the job is done) and is not
//! restarted; any other exit, or death by a signal, is a failure and restarts it (`after_exit`):
//! the exits that ask for a restart ([`restart_wanted`]: 128 and above, as Kubernetes'
//! `restartPolicy: ExitCode` reads them), and the permanent failures too (1, 2), which the
//! launcher retries within the restart budget as `restartPolicy: OnFailure` would. Roles are
//! crash-only: a panic ends a role process with [`PANIC_EXIT_CODE`] (170), which is such a
//! failure, so the panicking task comes back as a new incarnation within its restart budget
//! (the chief's panic, like any exit of the chief, ends the job).
//!
//! Failpoints: [`FAILPOINT_ENV`] (`COHORT_FAILPOINT`, in [`LaunchConfig::env`] or inherited)
//! reaches only a task's first incarnation. A restart runs without it, so that a fault injected
//! once (e.g. `ps.push.panic`) is recovered from instead of firing again in every incarnation
//! until the restart budget is spent.
//!
//! What a child finds in its environment:
//! - `TF_CONFIG`: the cluster and its own task (TensorFlow's format);
//! - `COHORT_CERTS`: the directory with `ca.pem` and its `<role>-<index>.pem/.key`;
//! - `COHORT_INCARNATION`: its incarnation, larger after every restart (FENCE-1);
//! - `COHORT_WORKERS_MAX`: the most workers the job may have (elastic workers);
//! - `COHORT_RUN_DIR` ([`RUN_DIR_ENV`]): the run directory, where a task may ask the launcher
//!   to scale the job ([`request_scale`]) as `cohort scale` does;
//! - `COHORT_METRICS_ADDR` when [`LaunchConfig::metrics`] is on: a loopback address of its own
//!   (the same across its restarts) where it serves Prometheus metrics and `/healthz`; the
//!   launcher records it in [`metrics_addr_file`] (`<run_dir>/metrics/<role>-<index>.addr`);
//! - the chief only: `COHORT_SUPERVISOR_SOCKET` ([`supervisor_socket_path`]), where it hears
//!   the launcher's report of every other task's failed exit ([`crate::process::ExitReport`],
//!   sent the moment the launcher reaps it), so that a dead task is known at once;
//! - `COHORT_NET_FAULTS` when [`NET_FAULTS_DIR_ENV`] (`COHORT_NET_FAULTS_DIR`, in
//!   [`LaunchConfig::env`] or inherited; `cohort chaos run` sets it) names a directory: its
//!   own rules file there, [`net_rules_file`] (`<dir>/<role>-<index>.rules`, the same across
//!   its restarts), under which its transport socket drops datagrams
//!   (`cohort_chaos::rules`). The launcher records every task's transport address beside it
//!   ([`net_addr_file`], `<dir>/<role>-<index>.addr`) so the rules can name peers.
//!
//! Elastic workers ([`Launcher::start_elastic`]): the job starts with `num_workers` workers
//! and may have up to `workers_max`. Ports and certificates are made for all of them at the
//! start; the chief's cluster spec names the first `num_workers` only, and a worker past them
//! gets a spec naming it (the job's, its own address added), so that it joins the running job
//! by telling the chief ([`crate::roles::protocol::Joining`]). A scale request
//! ([`request_scale`], `cohort scale`: a file queued in the run directory's
//! [`SCALE_REQUESTS_DIR`], taken in order every tick, so that two requests made at once are
//! both carried out) starts
//! the lowest free indices, or drains the highest running ones: SIGUSR1, after which the
//! worker finishes its closure, the chief keeps its dataset positions, and it exits 0. A
//! drained worker is never restarted, whatever its exit, and the tasks started after it was
//! drained get a spec without it: it has left the job.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use cohort_actors::RestartLimits;
use cohort_actors::{RestartDecision, RestartPolicy};
use cohort_transport::ClusterCa;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::checkpoint::FAILPOINT_ENV;
use crate::cluster::{ClusterConfig, ClusterSpec, ConfigKey, TaskId, TaskType};
use crate::process::{restart_wanted, JOB_DONE_EXIT_CODE, PANIC_EXIT_CODE, PREEMPTED_EXIT_CODE};

/// Environment variable naming a launched task's run directory (see the module docs).
pub const RUN_DIR_ENV: &str = "COHORT_RUN_DIR";
/// Environment variable naming the certificate directory of a launched task: the one its
/// configuration reads ([`ConfigKey::CERTS_DIR`]).
pub const CERTS_ENV: &str = ConfigKey::CERTS_DIR.env;
/// Environment variable carrying a launched task's incarnation: the one its
/// configuration reads ([`ConfigKey::INCARNATION`]).
pub const INCARNATION_ENV: &str = ConfigKey::INCARNATION.env;
/// A chief output line containing this asks the launcher to carry out its `kill_once` now, so
/// a demo can place its failure at a chosen point of training rather than at a wall-clock time.
pub const CHAOS_MARKER: &str = "[chaos-point]";

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// Workers to start.
    pub num_workers: u32,
    /// Parameter servers to start.
    pub num_ps: u32,
    /// Evaluators to start: sidecar evaluation of the job's checkpoints (see
    /// `Program::evaluator`); usually 0.
    pub num_evaluators: u32,
    /// The program every task runs (usually the current executable).
    pub program: PathBuf,
    /// Arguments every task gets (the role comes from `TF_CONFIG`, not from these).
    pub args: Vec<String>,
    /// Extra environment for every task.
    pub env: Vec<(String, String)>,
    /// Where certificates go (`<run_dir>/certs`).
    pub run_dir: PathBuf,
    /// Restart budget and backoff per task (a task other than the chief that exits 0 has
    /// finished and is not restarted).
    pub restart: RestartLimits,
    /// How long children get between SIGTERM and SIGKILL when the job stops.
    pub stop_grace: Duration,
    /// Restart a chief that exits asking for a restart (a code of 128 or more other than a
    /// stop request's 130 or 143: cohort's 170–173, or a death by another signal), as
    /// Kubernetes' `ExitCode` policy restarts the chief's pod: its program resumes from its
    /// last checkpoint. Off, any exit of the chief ends the job with its code.
    pub restart_chief: bool,
    /// The chief is one worker among peers (MultiWorkerMirrored: rank 0 of the group, which
    /// goes on without it): a chief that exits other than with 0 while the launcher is not
    /// stopping (preempted, killed, or failed, say for want of a quorum) is restarted as a
    /// worker is (a preempted one outside the restart budget), and rejoins. If every other
    /// task finishes (exit 0) while it is away, the job is done: a chief restarted meanwhile
    /// is stopped, and the job ends with 0 ([`LaunchOutcome::WorkersFinished`]). Its exit
    /// with 0 ends the job. Off (a parameter-server job, whose chief is the coordinator), the
    /// chief's exit ends the job.
    pub peer_chief: bool,
    /// Kill this task with SIGKILL once (the demo's midway failure): this long after launch,
    /// or as soon as the chief prints a line containing [`CHAOS_MARKER`], whichever is first.
    pub kill_once: Option<(TaskId, Duration)>,
    /// Give every task a metrics endpoint on a free loopback port (see the module docs).
    pub metrics: bool,
    /// The tasks log JSON (`COHORT_LOG_FORMAT=json`): their log lines (stderr) are forwarded
    /// as one JSON object per line with the task in a `task` field, not `[task] line`, so that
    /// the launcher's stderr stays JSON lines. Their standard output (the program's own
    /// prints) is forwarded as `[task] line` either way.
    pub json_logs: bool,
}

/// How a launched job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchOutcome {
    /// The chief exited with this code (0 is success).
    ChiefExited(i32),
    /// Every task other than the chief finished while the chief, a peer, was away after a
    /// preemption ([`LaunchConfig::peer_chief`]): the job is done.
    WorkersFinished,
    /// A stop was requested (Ctrl-C / SIGTERM); the children were stopped. `chief` is the
    /// code the chief exited with while stopping (143 after its preemption checkpoint, or
    /// whatever else it returned), `None` if it was killed by a signal or had already gone.
    Stopped {
        /// The chief's exit code, when it exited by itself.
        chief: Option<i32>,
    },
}

/// One exit of a task the launcher saw while supervising (see [`Launcher::exits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExit {
    /// The task.
    pub task: TaskId,
    /// The incarnation that exited.
    pub incarnation: u64,
    /// Its exit code, if it exited by itself.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

impl TaskExit {
    /// Whether the task ended by a panic (crash-only: exit [`PANIC_EXIT_CODE`]).
    pub fn panicked(&self) -> bool {
        self.code == Some(PANIC_EXIT_CODE)
    }
}

/// Why the launcher failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Certificates could not be generated or written.
    #[error("certificates: {0}")]
    Certs(String),
    /// A file of the run directory could not be written.
    #[error("run directory: {0}")]
    RunDir(String),
    /// No free loopback port could be found.
    #[error("no free port on 127.0.0.1: {0}")]
    Ports(std::io::Error),
    /// The cluster spec is invalid (e.g. zero workers).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// A child process could not be started.
    #[error("starting {task}: {source}")]
    Spawn {
        /// The task.
        task: TaskId,
        /// The OS error.
        source: std::io::Error,
    },
    /// A task failed more often than its restart budget allows.
    #[error(
        "{task} failed {failures} times within {window:?}; giving up (restart budget exhausted)"
    )]
    RestartBudget {
        /// The task.
        task: TaskId,
        /// Failures within the window.
        failures: u32,
        /// The window.
        window: Duration,
    },
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// The folder in the run directory where [`request_scale`] and [`request_scale_servers`]
/// queue their requests, one file each, named so that they sort in the order they were made;
/// the launcher takes them in that order (each read and removed) every tick.
pub const SCALE_REQUESTS_DIR: &str = "scale.requests";
/// Most scale requests waiting for the launcher; one more is refused (the launcher takes all
/// waiting ones every tick, so a full queue means it is not taking them).
pub const SCALE_REQUESTS_QUEUED_MAX: usize = 64;
/// The file in the run directory where an elastic launcher says how many workers its job may
/// have (`<min> <max>`) and, on a second line, how many parameter servers (`ps <min> <max>`),
/// so that a scale request can be checked before it is made.
pub const ELASTIC_FILE: &str = "elastic";

/// Why a scale request was refused (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// The number of workers (or servers) is outside what the job may have.
    #[error("{flag} {requested}: {reason}")]
    OutOfRange {
        /// The flag: `--workers` or `--ps`.
        flag: &'static str,
        /// The number asked for.
        requested: u32,
        /// Why it is refused.
        reason: String,
    },
    /// The launcher has not taken the requests already queued
    /// ([`SCALE_REQUESTS_QUEUED_MAX`]).
    #[error("--run-dir {dir}: {queued} scale requests are waiting for the launcher, which is not taking them")]
    QueueFull {
        /// The run directory.
        dir: String,
        /// How many wait.
        queued: usize,
    },
    /// The run directory has no running elastic launcher.
    #[error("--run-dir {dir}: {reason}")]
    NoLauncher {
        /// The run directory.
        dir: String,
        /// What is missing.
        reason: String,
    },
}

/// Asks the launcher running in `run_dir` for `workers` workers: it starts or drains workers
/// until that many run (see the module docs). Refused, with nothing changed, below 1 worker,
/// above the job's `workers_max`, or when `run_dir` has no elastic launcher.
pub fn request_scale(run_dir: &std::path::Path, workers: u32) -> Result<(), ScaleError> {
    request_scale_of(run_dir, TaskType::Worker, workers)
}

/// Asks the launcher running in `run_dir` for `servers` parameter servers: it starts the
/// lowest free indices (each joins the running job at a checkpoint cut) or drains the highest
/// running ones (SIGUSR1: each leaves once its variables moved onto the others). Refused, with
/// nothing changed, below 1 server, above the job's `ps_max`, or when `run_dir` has no
/// launcher whose servers are elastic.
pub fn request_scale_servers(run_dir: &std::path::Path, servers: u32) -> Result<(), ScaleError> {
    request_scale_of(run_dir, TaskType::Ps, servers)
}

/// The flag, the noun and the elastic file's line of a scaled role.
fn scaled(role: TaskType) -> (&'static str, &'static str, usize) {
    match role {
        TaskType::Ps => ("--ps", "parameter server", 1),
        _ => ("--workers", "worker", 0),
    }
}

fn request_scale_of(
    run_dir: &std::path::Path,
    role: TaskType,
    count: u32,
) -> Result<(), ScaleError> {
    let (flag, noun, line) = scaled(role);
    let out_of_range = |reason: String| ScaleError::OutOfRange {
        flag,
        requested: count,
        reason,
    };
    if count < 1 {
        return Err(out_of_range(format!(
            "a job needs at least 1 {noun}; to end it, stop the launcher (Ctrl-C or SIGTERM)"
        )));
    }
    let no_launcher = |reason: String| ScaleError::NoLauncher {
        dir: run_dir.display().to_string(),
        reason,
    };
    let state = run_dir.join(ELASTIC_FILE);
    let text = std::fs::read_to_string(&state).map_err(|e| {
        no_launcher(format!(
            "no elastic launcher runs there ({}: {e}); start one with `cohort launch {flag} \
             MIN:MAX --run-dir DIR`",
            state.display()
        ))
    })?;
    // Line 0: `<min> <max>` workers; line 1: `ps <min> <max>` servers.
    let max = text
        .lines()
        .nth(line)
        .and_then(|l| l.split_whitespace().last())
        .and_then(|m| m.parse::<u32>().ok())
        .ok_or_else(|| {
            no_launcher(format!(
                "{} does not say how many {noun}s the job may have: {text:?}",
                state.display()
            ))
        })?;
    if count > max {
        return Err(out_of_range(format!(
            "the job may have at most {max} {noun}s (launch {flag} MIN:{max})"
        )));
    }
    let queue = run_dir.join(SCALE_REQUESTS_DIR);
    std::fs::create_dir_all(&queue)
        .map_err(|e| no_launcher(format!("creating {}: {e}", queue.display())))?;
    let queued = queued_scale_requests(&queue).len();
    if queued >= SCALE_REQUESTS_QUEUED_MAX {
        return Err(ScaleError::QueueFull {
            dir: run_dir.display().to_string(),
            queued,
        });
    }
    // Named by the time it was made (zero-padded, so that names sort as times do) and this
    // process (two requests in the same nanosecond); written beside the queue and renamed
    // into it, so that the launcher never reads half a request.
    let made = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("{made:020}-{:010}", std::process::id());
    let request = queue.join(&name);
    let tmp = run_dir.join(format!("{SCALE_REQUESTS_DIR}.tmp-{name}"));
    let text = match role {
        TaskType::Ps => format!("ps {count}"),
        _ => count.to_string(),
    };
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &request))
        .map_err(|e| no_launcher(format!("writing {}: {e}", request.display())))
}

/// The requests waiting in `queue` ([`SCALE_REQUESTS_DIR`]), oldest first.
fn queued_scale_requests(queue: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(queue) else {
        return Vec::new();
    };
    let mut requests: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    requests.sort();
    requests
}

/// A running local cluster.
///
/// Calling protocol:
/// 1. [`Launcher::start`] creates certificates, picks ports and starts every task;
/// 2. [`Launcher::supervise`] restarts failed tasks until the chief exits or `stop` is set;
///    it stops every child before returning, on every path.
pub struct Launcher {
    config: LaunchConfig,
    cluster: ClusterSpec,
    /// The most workers the job may have (elastic workers).
    workers_max: u32,
    /// The most parameter servers the job may have (elastic servers).
    ps_max: u32,
    /// The cluster with every worker and server the job may have: what a task past the
    /// initial ones is started with.
    full_cluster: ClusterSpec,
    certs_dir: PathBuf,
    tasks: BTreeMap<TaskId, Supervised>,
    started_at: Instant,
    killed_once: bool,
    /// Set by the chief's output forwarder when it sees [`CHAOS_MARKER`].
    chaos_point: Arc<AtomicBool>,
    /// The last [`EXITS_KEPT_MAX`] exits seen while supervising, oldest first.
    exits: VecDeque<TaskExit>,
    /// Where each task serves its metrics, when [`LaunchConfig::metrics`] is on.
    metrics_addrs: BTreeMap<TaskId, std::net::SocketAddr>,
    /// The directory of the tasks' network fault rules, when [`NET_FAULTS_DIR_ENV`] names one.
    net_faults_dir: Option<PathBuf>,
}

struct Supervised {
    child: Option<Child>,
    policy: RestartPolicy,
    restart_at: Option<Instant>,
    incarnation: u64,
    /// Processes started for this task so far (the first is its only one to get failpoints).
    spawns: u32,
    /// Drained (scaled down): never restarted, whatever its exit.
    drained: bool,
    /// Scaled up again while its drained process was still leaving: started again (as a new
    /// incarnation, which joins the job) once that process has exited.
    start_after_drain: bool,
    /// Exited 0: finished with the job, not restarted.
    finished: bool,
    /// Its latest process exited other than with 0, and no process of it finished since.
    away: bool,
}

impl Launcher {
    /// Generates an ephemeral CA, picks free ports and starts every task.
    pub fn start(config: LaunchConfig) -> Result<Self, LaunchError> {
        let workers = config.num_workers;
        Self::start_elastic(config, workers)
    }

    /// As [`Launcher::start`], for a job that may grow to `workers_max` workers (see the
    /// module docs): [`Launcher::scale`] or a [`request_scale`] changes how many run.
    pub fn start_elastic(config: LaunchConfig, workers_max: u32) -> Result<Self, LaunchError> {
        let servers = config.num_ps;
        Self::start_elastic_servers(config, workers_max, servers)
    }

    /// As [`Launcher::start_elastic`], for a job that may also grow to `ps_max` parameter
    /// servers: [`Launcher::scale_servers`] or a [`request_scale_servers`] changes how many
    /// run (each joins or leaves the running job at a checkpoint cut).
    pub fn start_elastic_servers(
        config: LaunchConfig,
        workers_max: u32,
        ps_max: u32,
    ) -> Result<Self, LaunchError> {
        check_sizes(&config, workers_max, ps_max)?;
        let full_cluster = local_cluster(workers_max, ps_max, config.num_evaluators)?;
        let cluster = with_tasks(&full_cluster, config.num_workers, config.num_ps)?;
        let certs_dir = config.run_dir.join("certs");
        issue_local_certs(&full_cluster, &certs_dir)?;
        let metrics_addrs = if config.metrics {
            metrics_ports(&full_cluster, &config.run_dir)?
        } else {
            BTreeMap::new()
        };
        let net_faults_dir = net_faults_dir(&config.env);
        if let Some(dir) = &net_faults_dir {
            record_net_addrs(&full_cluster, dir)?;
        }
        let mut launcher = Self {
            metrics_addrs,
            net_faults_dir,
            tasks: cluster
                .tasks()
                .map(|t| {
                    let supervised = Supervised {
                        child: None,
                        policy: RestartPolicy::new(config.restart.clone()),
                        restart_at: None,
                        incarnation: 0,
                        spawns: 0,
                        drained: false,
                        start_after_drain: false,
                        finished: false,
                        away: false,
                    };
                    (t, supervised)
                })
                .collect(),
            config,
            cluster,
            workers_max,
            ps_max,
            full_cluster,
            certs_dir,
            started_at: Instant::now(),
            killed_once: false,
            chaos_point: Arc::new(AtomicBool::new(false)),
            exits: VecDeque::new(),
        };
        let tasks: Vec<TaskId> = launcher.tasks.keys().copied().collect();
        for task in tasks {
            if let Err(err) = launcher.spawn(task) {
                launcher.stop_all();
                return Err(err);
            }
        }
        if launcher.is_elastic() {
            let state = launcher.config.run_dir.join(ELASTIC_FILE);
            // Requests left by an earlier launcher of this run directory are not this job's.
            let _ = std::fs::remove_dir_all(launcher.config.run_dir.join(SCALE_REQUESTS_DIR));
            let text = format!(
                "{} {workers_max}\nps {} {ps_max}\n",
                launcher.config.num_workers, launcher.config.num_ps
            );
            if let Err(e) = std::fs::write(&state, text) {
                launcher.stop_all();
                return Err(LaunchError::Certs(format!("{}: {e}", state.display())));
            }
        }
        Ok(launcher)
    }

    /// Where each task serves its metrics (empty unless [`LaunchConfig::metrics`] is on).
    pub fn metrics_addrs(&self) -> &BTreeMap<TaskId, std::net::SocketAddr> {
        &self.metrics_addrs
    }

    /// Whether workers or servers may be scaled.
    fn is_elastic(&self) -> bool {
        self.workers_max > self.config.num_workers || self.ps_max > self.config.num_ps
    }

    /// Workers that run now or are to be restarted (not drained), by index.
    pub fn active_workers(&self) -> Vec<u32> {
        self.active(TaskType::Worker)
    }

    /// Parameter servers that run now or are to be restarted (not drained), by index.
    pub fn active_servers(&self) -> Vec<u32> {
        self.active(TaskType::Ps)
    }

    /// How many of the initial workers are still in the job, for the specs of the tasks
    /// started from now on: all but those drained and gone (a draining worker still runs, may
    /// hold the job's state, and must be asked before anyone starts the job afresh). Scaling
    /// drains the highest first and starts the lowest free, so those are the first ones (where
    /// they are not, all the initial ones).
    fn spec_workers(&self) -> u32 {
        let initial = self.config.num_workers;
        let active: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(t, e)| t.task_type == TaskType::Worker && (!e.drained || e.child.is_some()))
            .map(|(t, _)| t.index)
            .collect();
        let kept = active.iter().filter(|i| **i < initial).count() as u32;
        if kept > 0 && (0..kept).all(|i| active.contains(&i)) {
            kept
        } else {
            initial
        }
    }

    fn active(&self, role: TaskType) -> Vec<u32> {
        self.tasks
            .iter()
            .filter(|(t, e)| t.task_type == role && !e.drained)
            .map(|(t, _)| t.index)
            .collect()
    }

    /// Runs `workers` workers from now on: starts the lowest indices not running (each joins
    /// the running job), or drains the highest running ones (SIGUSR1: each finishes its
    /// closure and exits 0, and is not restarted). Refused, with nothing changed, below 1 or
    /// above the job's `workers_max`.
    pub fn scale(&mut self, workers: u32) -> Result<(), ScaleError> {
        self.scale_role(TaskType::Worker, workers, self.workers_max)
    }

    /// Runs `servers` parameter servers from now on: starts the lowest indices not running
    /// (each joins the running job, which moves its share of the variables onto it at a
    /// checkpoint cut), or drains the highest running ones (SIGUSR1: each leaves once its
    /// variables are on the others, exits 0, and is not restarted). Refused, with nothing
    /// changed, below 1 or above the job's `ps_max`. The job needs a checkpoint directory.
    pub fn scale_servers(&mut self, servers: u32) -> Result<(), ScaleError> {
        self.scale_role(TaskType::Ps, servers, self.ps_max)
    }

    fn scale_role(&mut self, role: TaskType, count: u32, max: u32) -> Result<(), ScaleError> {
        let (flag, noun, _) = scaled(role);
        if count < 1 || count > max {
            return Err(ScaleError::OutOfRange {
                flag,
                requested: count,
                reason: format!("the job may have 1 to {max} {noun}s"),
            });
        }
        let active = self.active(role);
        let now = active.len() as u32;
        if count > now {
            let free: Vec<u32> = (0..max)
                .filter(|i| !active.contains(i))
                .take((count - now) as usize)
                .collect();
            for index in free {
                let task = TaskId::new(role, index);
                let entry = self.tasks.entry(task).or_insert_with(|| Supervised {
                    child: None,
                    policy: RestartPolicy::new(self.config.restart.clone()),
                    restart_at: None,
                    incarnation: 0,
                    spawns: 0,
                    drained: false,
                    start_after_drain: false,
                    finished: false,
                    away: false,
                });
                let was_drained = std::mem::replace(&mut entry.drained, false);
                entry.restart_at = None;
                if entry.child.is_none() {
                    tracing::info!("scaling up: starting {task}");
                    if let Err(e) = self.spawn(task) {
                        tracing::warn!("cannot start {task}: {e}");
                    }
                } else if was_drained {
                    tracing::info!(
                        "scaling up: {task} is still draining; it starts again once \
                         it has left"
                    );
                    entry.start_after_drain = true;
                }
            }
        }
        for index in active.iter().rev().take(now.saturating_sub(count) as usize) {
            let task = TaskId::new(role, *index);
            let Some(entry) = self.tasks.get_mut(&task) else {
                continue;
            };
            entry.drained = true;
            entry.start_after_drain = false;
            entry.restart_at = None;
            if let Some(child) = entry.child.as_ref() {
                tracing::info!("scaling down: draining {task} (SIGUSR1)");
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGUSR1);
            }
        }
        Ok(())
    }

    /// Carries out the scale requests queued in the run directory ([`request_scale`]), oldest
    /// first.
    fn take_scale_requests(&mut self) {
        if !self.is_elastic() {
            return;
        }
        for path in queued_scale_requests(&self.config.run_dir.join(SCALE_REQUESTS_DIR)) {
            self.take_scale_request(&path);
        }
    }

    /// Carries out the scale request in `path` and removes it.
    fn take_scale_request(&mut self, path: &std::path::Path) {
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let _ = std::fs::remove_file(path);
        // `N` asks for N workers, `ps N` for N parameter servers.
        let (role, number) = match text.trim().strip_prefix("ps ") {
            Some(rest) => (TaskType::Ps, rest.trim()),
            None => (TaskType::Worker, text.trim()),
        };
        let (_, noun, _) = scaled(role);
        match number.parse::<u32>() {
            Ok(count) => {
                let scaled = match role {
                    TaskType::Ps => self.scale_servers(count),
                    _ => self.scale(count),
                };
                match scaled {
                    Ok(()) => tracing::info!("scale request: {count} {noun}(s)"),
                    Err(e) => tracing::warn!("scale request refused: {e}"),
                }
            }
            Err(_) => tracing::warn!(
                "scale request refused: {} holds {text:?}, not a number of {noun}s",
                path.display()
            ),
        }
    }

    /// The cluster being run.
    pub fn cluster(&self) -> &ClusterSpec {
        &self.cluster
    }

    /// The PID of a task's current process, if it is running.
    pub fn pid(&self, task: TaskId) -> Option<u32> {
        self.tasks.get(&task)?.child.as_ref().map(Child::id)
    }

    /// The exits of tasks seen while supervising, oldest first: every failure and restart
    /// cause, the chief's own exit included (the last [`EXITS_KEPT_MAX`]; not the exits of the
    /// final stop).
    pub fn exits(&self) -> impl Iterator<Item = &TaskExit> {
        self.exits.iter()
    }

    /// Supervises until the chief exits or `stop` becomes true; stops every child before
    /// returning.
    pub fn supervise(&mut self, stop: &AtomicBool) -> Result<LaunchOutcome, LaunchError> {
        let outcome = self.supervise_loop(stop);
        let chief = self.stop_all();
        // No launcher takes scale requests here any more.
        let _ = std::fs::remove_file(self.config.run_dir.join(ELASTIC_FILE));
        match outcome {
            Ok(LaunchOutcome::Stopped { .. }) => Ok(LaunchOutcome::Stopped { chief }),
            other => other,
        }
    }

    fn supervise_loop(&mut self, stop: &AtomicBool) -> Result<LaunchOutcome, LaunchError> {
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(LaunchOutcome::Stopped { chief: None });
            }
            let now = Instant::now();
            self.take_scale_requests();
            self.maybe_kill_once(now);
            let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
            for task in ids {
                if let Some(code) = self.check_task(task, now)? {
                    return Ok(LaunchOutcome::ChiefExited(code));
                }
            }
            if self.finished_without_the_chief() {
                tracing::info!(
                    "every worker finished while the chief was away after its preemption: the \
                     job is done"
                );
                return Ok(LaunchOutcome::WorkersFinished);
            }
            std::thread::sleep(SUPERVISE_TICK);
        }
    }

    /// Whether a peer chief ([`LaunchConfig::peer_chief`]) is away (its latest process exited
    /// other than with 0: it is down, or a process started since has not finished) while
    /// every other task finished.
    fn finished_without_the_chief(&self) -> bool {
        let chief = TaskId::new(TaskType::Chief, 0);
        self.config.peer_chief
            && self.tasks.get(&chief).is_some_and(|c| c.away)
            && self
                .tasks
                .iter()
                .filter(|(task, _)| task.task_type != TaskType::Chief)
                .all(|(_, t)| t.finished || t.drained)
    }

    /// Looks at one task: reaps it if it exited, restarts it when its backoff has passed.
    /// Returns the chief's exit code when the chief has exited.
    fn check_task(&mut self, task: TaskId, now: Instant) -> Result<Option<i32>, LaunchError> {
        let entry = self.tasks.get_mut(&task).expect("task is known");
        if let Some(at) = entry.restart_at {
            if now >= at {
                entry.restart_at = None;
                self.spawn(task)?;
            }
            return Ok(None);
        }
        let Some(child) = entry.child.as_mut() else {
            return Ok(None);
        };
        let status = match child.try_wait() {
            Ok(Some(status)) => status,
            Ok(None) => return Ok(None),
            Err(err) => {
                tracing::warn!("cannot poll {task}: {err}");
                return Ok(None);
            }
        };
        entry.child = None;
        {
            use std::os::unix::process::ExitStatusExt;
            if self.exits.len() >= EXITS_KEPT_MAX {
                self.exits.pop_front();
            }
            self.exits.push_back(TaskExit {
                task,
                incarnation: entry.incarnation,
                code: status.code(),
                signal: status.signal(),
            });
        }
        let code = exit_code(status);
        if code != 0 && task.task_type != TaskType::Chief {
            report_exit(&self.config.run_dir, task, entry.incarnation);
        }
        self.follow_exit(task, status, code, now)
    }

    /// What follows `task`'s exit with `status` (`code`) at `now`: started again after a drain
    /// that a scale-up undid, left down after a drain, the job ended (the chief's exit),
    /// restarted after its backoff (after a preemption outside the restart budget), or the
    /// restart budget spent. Returns the chief's exit code when the chief has exited.
    fn follow_exit(
        &mut self,
        task: TaskId,
        status: std::process::ExitStatus,
        code: i32,
        now: Instant,
    ) -> Result<Option<i32>, LaunchError> {
        let entry = self.tasks.get_mut(&task).expect("task is known");
        if std::mem::take(&mut entry.start_after_drain) {
            tracing::info!(
                "{task} (incarnation {}) drained: {}; starting it again, as scaled up",
                entry.incarnation,
                describe(status)
            );
            self.spawn(task)?;
            return Ok(None);
        }
        if entry.drained {
            tracing::info!(
                "{task} (incarnation {}) drained: {}; not restarted",
                entry.incarnation,
                describe(status)
            );
            return Ok(None);
        }
        match after_exit(
            task.task_type,
            code,
            self.config.restart_chief,
            self.config.peer_chief,
        ) {
            AfterExit::EndJob => return Ok(Some(code)),
            AfterExit::Finished => {
                entry.finished = true;
                entry.away = false;
                tracing::info!(
                    "{task} (incarnation {}) finished: the job is done",
                    entry.incarnation
                );
                return Ok(None);
            }
            AfterExit::Preempted => {
                entry.away = true;
                let after = entry.policy.after_preemption();
                tracing::info!(
                    "{task} (incarnation {}) left on a preemption notice ({}): restarting it in \
                     {after:?}, outside the restart budget",
                    entry.incarnation,
                    describe(status)
                );
                entry.restart_at = Some(now + after);
                return Ok(None);
            }
            AfterExit::Restart => {
                entry.away = true;
                tracing::info!(
                    "{task} (incarnation {}) exited: {}",
                    entry.incarnation,
                    describe(status)
                );
            }
            AfterExit::RetryFailure => {
                entry.away = true;
                tracing::info!(
                    "{task} (incarnation {}) exited: {} (a permanent failure, which \
                     Kubernetes' ExitCode restart policy would not retry; retried here within \
                     the restart budget)",
                    entry.incarnation,
                    describe(status)
                );
            }
        }
        match entry.policy.handle_failure(now) {
            RestartDecision::Restart { after, attempt } => {
                tracing::info!("restarting {task} in {after:?} (restart {attempt} in this window)");
                entry.restart_at = Some(now + after);
                Ok(None)
            }
            RestartDecision::Escalate { failures_in_window } => Err(LaunchError::RestartBudget {
                task,
                failures: failures_in_window,
                window: self.config.restart.window,
            }),
        }
    }

    fn maybe_kill_once(&mut self, now: Instant) {
        let Some((task, after)) = self.config.kill_once else {
            return;
        };
        let due = now >= self.started_at + after || self.chaos_point.load(Ordering::SeqCst);
        if self.killed_once || !due {
            return;
        }
        if let Some(pid) = self.pid(task) {
            tracing::info!("chaos: SIGKILL {task} (pid {pid}) to show recovery");
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            self.killed_once = true;
        }
    }

    fn spawn(&mut self, task: TaskId) -> Result<(), LaunchError> {
        // A worker or server past the initial ones is not in the chief's spec: it gets one
        // naming it. A (re)started chief's spec names the servers in the job now (servers
        // scaled up joined the job, and those drained left it: its restore from the last
        // checkpoint places the variables onto them). A (re)started task's spec leaves out the
        // initial workers drained for good once they exited: they left the job, and a
        // MultiWorkerMirrored process would otherwise wait for them to answer its ask to
        // enter, or to form its first generation, and never would (found by `chaos/sweep.py
        // --job mwms`, seed 1002: a scale-down, then every member lost).
        let servers = if task.task_type == TaskType::Chief && self.ps_max > self.config.num_ps {
            self.active_servers().len() as u32
        } else {
            self.config.num_ps
        };
        let spec = task_spec(
            task,
            (&self.cluster, &self.full_cluster),
            self.spec_workers(),
            servers,
        )?;
        let config = ClusterConfig::new(spec, task)?;
        let supervisor_socket = (task.task_type == TaskType::Chief)
            .then(|| self.supervisor_socket())
            .flatten();
        let entry = self.tasks.get_mut(&task).expect("task is known");
        // Incarnations grow across restarts and across launcher runs (wall-clock based), so a
        // relaunched task is always newer than anything fenced before (FENCE-1).
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        entry.incarnation = wall_ms.max(entry.incarnation + 1);
        // Failpoints reach the first incarnation only (see the module docs).
        let restart = entry.spawns > 0;
        entry.spawns = entry.spawns.saturating_add(1);
        let mut command = Command::new(&self.config.program);
        crate::process::with_system_huge_pages(&mut command);
        if restart {
            command.env_remove(FAILPOINT_ENV);
        }
        command
            .args(&self.config.args)
            .env(crate::cluster::TF_CONFIG_ENV, config.to_tf_config())
            .env(CERTS_ENV, &self.certs_dir)
            .env(INCARNATION_ENV, entry.incarnation.to_string())
            .env(ConfigKey::WORKERS_MAX.env, self.workers_max.to_string())
            .env(RUN_DIR_ENV, &self.config.run_dir)
            .envs(
                self.config
                    .env
                    .iter()
                    .filter(|(k, _)| !(restart && k == FAILPOINT_ENV))
                    .map(|(k, v)| (k, v)),
            )
            // After the job's environment: two tasks must never share an address.
            .envs(
                self.metrics_addrs
                    .get(&task)
                    .map(|addr| (ConfigKey::METRICS_ADDR.env, addr.to_string())),
            )
            .envs(supervisor_socket.map(|path| (ConfigKey::SUPERVISOR_SOCKET.env, path)))
            .envs(self.net_faults_dir.as_ref().map(|dir| {
                (
                    cohort_chaos::rules::NET_FAULTS_ENV,
                    net_rules_file(dir, task).into_os_string(),
                )
            }))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|source| LaunchError::Spawn { task, source })?;
        let marker = (task.task_type == TaskType::Chief).then(|| Arc::clone(&self.chaos_point));
        if let Some(out) = child.stdout.take() {
            forward_lines(out, task, Forward::Stdout, marker.clone());
        }
        // The chief reports through its log (stderr): the marker may come on either stream.
        if let Some(err) = child.stderr.take() {
            let forward = if self.config.json_logs {
                Forward::StderrJson
            } else {
                Forward::StderrText
            };
            forward_lines(err, task, forward, marker);
        }
        write_pid_file(&self.config.run_dir, task, child.id(), entry.incarnation);
        entry.child = Some(child);
        Ok(())
    }

    /// The chief's [`ConfigKey::SUPERVISOR_SOCKET`], `<run_dir>/supervisor.sock`: `None`
    /// where that path is too long for a Unix socket (the chief then learns of deaths from
    /// new incarnations and silence only).
    fn supervisor_socket(&self) -> Option<PathBuf> {
        let path = supervisor_socket_path(&self.config.run_dir);
        (path.as_os_str().len() <= crate::process::SOCKET_PATH_BYTES_MAX).then_some(path)
    }

    /// Stops every child: SIGTERM to the chief, and once it has exited (or after the grace)
    /// SIGTERM to every other task; SIGKILL to those still running after the grace. Returns
    /// the chief's exit code if it exited by itself meanwhile.
    ///
    /// The chief goes first, alone: its program takes its own preemption checkpoint, which
    /// needs every parameter server serving. A server told to stop at the same moment would
    /// give notice to a chief that may not know yet that it stops too; the chief would take
    /// a preemption cut and let the server go, and its own checkpoint would then wait for a
    /// restart that never comes (see `crate::roles::coordinator::machine::preempt`).
    fn stop_all(&mut self) -> Option<i32> {
        let mut chief_code = None;
        for entry in self.tasks.values_mut() {
            entry.restart_at = None;
        }
        let chief_first = |task: &TaskId| task.task_type == TaskType::Chief;
        let others = |task: &TaskId| task.task_type != TaskType::Chief;
        for wanted in [chief_first, others] {
            for (task, entry) in self.tasks.iter() {
                if let Some(child) = entry.child.as_ref().filter(|_| wanted(task)) {
                    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
                }
            }
            let deadline = Instant::now() + self.config.stop_grace;
            loop {
                let mut running = 0;
                for (task, entry) in self.tasks.iter_mut() {
                    if let Some(child) = entry.child.as_mut() {
                        match child.try_wait() {
                            Ok(Some(status)) => {
                                if task.task_type == TaskType::Chief {
                                    chief_code = status.code();
                                }
                                entry.child = None;
                            }
                            Err(_) => entry.child = None,
                            Ok(None) if wanted(task) => running += 1,
                            Ok(None) => {}
                        }
                    }
                }
                if running == 0 || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(SUPERVISE_TICK);
            }
        }
        for entry in self.tasks.values_mut() {
            if let Some(mut child) = entry.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        chief_code
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The file where the launcher records the process of `task`: `<run_dir>/pids/<role>-<index>.pid`.
pub fn pid_file(run_dir: &std::path::Path, task: TaskId) -> PathBuf {
    run_dir
        .join("pids")
        .join(format!("{}-{}.pid", task.task_type, task.index))
}

/// Where a launched chief hears the launcher's exit reports
/// ([`crate::process::ExitReport`]).
pub fn supervisor_socket_path(run_dir: &std::path::Path) -> PathBuf {
    run_dir.join("supervisor.sock")
}

/// Tells the chief at once that `task`'s process of `incarnation` exited (a failure: it did
/// not exit 0), so that it is declared dead now rather than after the detection budget. A
/// chief not listening (starting, or restarting itself) misses it: nothing else depends on
/// it.
fn report_exit(run_dir: &std::path::Path, task: TaskId, incarnation: u64) {
    let report = crate::process::ExitReport { task, incarnation };
    if let Err(e) = crate::process::send_exit_report(&supervisor_socket_path(run_dir), &report) {
        tracing::debug!("could not report {task}'s exit to the chief: {e}");
    }
}

/// The file where the launcher records where `task` serves its metrics (`ip:port` and a
/// newline): `<run_dir>/metrics/<role>-<index>.addr`.
pub fn metrics_addr_file(run_dir: &std::path::Path, task: TaskId) -> PathBuf {
    run_dir
        .join("metrics")
        .join(format!("{}-{}.addr", task.task_type, task.index))
}

/// Environment variable naming the directory of the tasks' network fault rules (see the
/// module docs); unset or empty, the tasks' sockets are the plain ones.
pub const NET_FAULTS_DIR_ENV: &str = "COHORT_NET_FAULTS_DIR";

/// The rules file of `task` in the network fault directory `dir`: `<dir>/<role>-<index>.rules`.
pub fn net_rules_file(dir: &std::path::Path, task: TaskId) -> PathBuf {
    dir.join(format!("{}-{}.rules", task.task_type, task.index))
}

/// Where the launcher records the transport address (`ip:port` and a newline) of `task` in
/// the network fault directory `dir`: `<dir>/<role>-<index>.addr`.
pub fn net_addr_file(dir: &std::path::Path, task: TaskId) -> PathBuf {
    dir.join(format!("{}-{}.addr", task.task_type, task.index))
}

/// The network fault directory: [`NET_FAULTS_DIR_ENV`] from the job's environment `env`, else
/// from this process's.
fn net_faults_dir(env: &[(String, String)]) -> Option<PathBuf> {
    env.iter()
        .rev()
        .find(|(k, _)| k == NET_FAULTS_DIR_ENV)
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os(NET_FAULTS_DIR_ENV))
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Records the transport address of every task of `cluster` in `dir` ([`net_addr_file`]).
fn record_net_addrs(cluster: &ClusterSpec, dir: &std::path::Path) -> Result<(), LaunchError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| LaunchError::RunDir(format!("{}: {e}", dir.display())))?;
    for task in cluster.tasks() {
        let path = net_addr_file(dir, task);
        std::fs::write(&path, format!("{}\n", cluster.address(task)?))
            .map_err(|e| LaunchError::RunDir(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// A free loopback TCP port for the metrics endpoint of every task of `cluster`, each recorded
/// in its [`metrics_addr_file`]. The sockets are held until every port is chosen, so no two
/// tasks get the same one.
fn metrics_ports(
    cluster: &ClusterSpec,
    run_dir: &std::path::Path,
) -> Result<BTreeMap<TaskId, std::net::SocketAddr>, LaunchError> {
    let tasks: Vec<TaskId> = cluster.tasks().collect();
    let sockets = tasks
        .iter()
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(LaunchError::Ports)?;
    let mut addrs = BTreeMap::new();
    for (task, socket) in tasks.into_iter().zip(&sockets) {
        let addr = socket.local_addr().map_err(LaunchError::Ports)?;
        let path = metrics_addr_file(run_dir, task);
        write_whole(&path, &format!("{addr}\n"))
            .map_err(|e| LaunchError::RunDir(format!("{}: {e}", path.display())))?;
        addrs.insert(task, addr);
    }
    Ok(addrs)
}

/// Writes `text` to `path` (its folder created) through a file beside it renamed into place:
/// a reader that finds the file finds all of it (a reader polling for a task's address or pid
/// read an empty file once, between the creation and the write).
fn write_whole(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Records the process `pid` running incarnation `incarnation` of `task` ([`pid_file`]:
/// `"<pid> <incarnation>"`), replaced at every restart, so that an operator (or a chaos or
/// recovery benchmark) can signal a task. Best effort: a failure is logged.
fn write_pid_file(run_dir: &std::path::Path, task: TaskId, pid: u32, incarnation: u64) {
    let path = pid_file(run_dir, task);
    if let Err(e) = write_whole(&path, &format!("{pid} {incarnation}\n")) {
        tracing::warn!("cannot record {task}'s pid in {}: {e}", path.display());
    }
}

/// Sets `flag` when SIGINT or SIGTERM arrives (the launcher then stops its children).
pub use crate::process::stop_on_signals;

pub use crate::cluster::node_id;

/// Exits kept for [`Launcher::exits`]: a restart budget spends far fewer.
pub const EXITS_KEPT_MAX: usize = 1024;

/// How often the supervisor looks at its children.
const SUPERVISE_TICK: Duration = Duration::from_millis(20);

fn local_cluster(
    num_workers: u32,
    num_ps: u32,
    num_evaluators: u32,
) -> Result<ClusterSpec, LaunchError> {
    let count = 1 + num_workers as usize + num_ps as usize + num_evaluators as usize;
    // Hold every socket until all ports are chosen so no two tasks get the same one.
    let sockets = (0..count)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(LaunchError::Ports)?;
    let mut ports = sockets
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(LaunchError::Ports)?
        .into_iter();
    let mut jobs = BTreeMap::new();
    for (task_type, n) in [
        (TaskType::Chief, 1),
        (TaskType::Ps, num_ps),
        (TaskType::Worker, num_workers),
        (TaskType::Evaluator, num_evaluators),
    ] {
        if n == 0 && task_type == TaskType::Evaluator {
            continue;
        }
        let addrs = (0..n)
            .filter_map(|_| ports.next())
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        jobs.insert(task_type, addrs);
    }
    Ok(ClusterSpec::new(jobs)?)
}

/// `full` with only its first `workers` workers.
/// `full` with its first `workers` workers and first `servers` parameter servers.
/// The cluster spec `task` is started with, given the job's initial spec and the full one
/// (every task up to the most workers and servers), and the workers and servers of the
/// initial spec still in the job (see [`Launcher::spawn`]).
fn task_spec(
    task: TaskId,
    (initial, full): (&ClusterSpec, &ClusterSpec),
    workers: u32,
    servers: u32,
) -> Result<ClusterSpec, LaunchError> {
    let beyond_spec = matches!(task.task_type, TaskType::Worker | TaskType::Ps)
        && task.index >= initial.num_tasks(task.task_type) as u32;
    if beyond_spec {
        return Ok(full.clone());
    }
    let in_initial = |role| initial.num_tasks(role) as u32;
    if workers != in_initial(TaskType::Worker) || servers != in_initial(TaskType::Ps) {
        return with_tasks(full, workers, servers);
    }
    Ok(initial.clone())
}

fn with_tasks(full: &ClusterSpec, workers: u32, servers: u32) -> Result<ClusterSpec, LaunchError> {
    let mut jobs = BTreeMap::new();
    for task in full.tasks() {
        let kept = match task.task_type {
            TaskType::Worker => task.index < workers,
            TaskType::Ps => task.index < servers,
            _ => true,
        };
        if !kept {
            continue;
        }
        let addr = full.address(task)?.to_string();
        jobs.entry(task.task_type)
            .or_insert_with(Vec::new)
            .push(addr);
    }
    Ok(ClusterSpec::new(jobs)?)
}

/// Where a task's output goes (see [`forward_lines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forward {
    /// Standard output: `[task] line`.
    Stdout,
    /// Standard error, as text: `[task] line`.
    StderrText,
    /// Standard error, one JSON object per line ([`LaunchConfig::json_logs`]).
    StderrJson,
}

/// Forwards every line of a task's output as `forward` says, on a thread of its own.
fn forward_lines<R: Read + Send + 'static>(
    reader: R,
    task: TaskId,
    forward: Forward,
    marker: Option<Arc<AtomicBool>>,
) {
    let name = task.to_string();
    std::thread::spawn(move || {
        pump_lines(reader, marker.as_deref(), |line| {
            // The whole line in one write: standard error is unbuffered, so a line written
            // in pieces (prefix, name, text) could be split by another task's line on a
            // shared terminal or pipe (both streams are often one).
            let text = match forward {
                Forward::Stdout | Forward::StderrText => format!("[{name}] {line}\n"),
                Forward::StderrJson => format!("{}\n", json_log_line(&name, line)),
            };
            // A closed terminal must not kill the launcher: write errors are ignored.
            let _ = match forward {
                Forward::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
                Forward::StderrText | Forward::StderrJson => {
                    std::io::stderr().lock().write_all(text.as_bytes())
                }
            };
        });
    });
}

/// A task's log line as one JSON object with the task in a `task` field: the task's own
/// JSON event with the field added, or any other line (a panic's message, a library's print)
/// wrapped as `{"ts_ms", "task", "stream": "stderr", "message"}`.
fn json_log_line(task: &str, line: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(mut event)) => {
            event.insert("task".into(), task.into());
            serde_json::Value::Object(event).to_string()
        }
        _ => {
            let ts_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            serde_json::json!({
                "ts_ms": ts_ms,
                "task": task,
                "stream": "stderr",
                "message": line,
            })
            .to_string()
        }
    }
}

/// Reads a child's output to its end and hands every line to `emit`, decoded lossily; a line
/// longer than [`OUTPUT_LINE_BYTES_MAX`] comes in pieces of at most that length. It never stops
/// early on odd bytes: a child whose pipe is no longer drained blocks on its next write.
fn pump_lines<R: Read>(reader: R, marker: Option<&AtomicBool>, mut emit: impl FnMut(&str)) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader)
            .take(OUTPUT_LINE_BYTES_MAX as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        let line = String::from_utf8_lossy(&buf);
        if let Some(flag) = marker {
            if line.contains(CHAOS_MARKER) {
                flag.store(true, Ordering::SeqCst);
            }
        }
        emit(&line);
    }
}

/// Longest piece of a child's output line forwarded at once (bytes), so that a child printing
/// without newlines cannot make the launcher buffer without bound.
const OUTPUT_LINE_BYTES_MAX: usize = 64 * 1024;

/// What the launcher does after a task exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterExit {
    /// The chief exited, with any code: the job ends with it.
    EndJob,
    /// A task other than the chief exited 0 (after the chief's goodbye): it has finished and
    /// is not restarted.
    Finished,
    /// A task other than the chief asked for a restart ([`restart_wanted`]): restarted as a
    /// new incarnation, within the restart budget.
    Restart,
    /// A task other than the chief left on a preemption notice ([`PREEMPTED_EXIT_CODE`]):
    /// restarted after the first backoff delay, outside the restart budget
    /// ([`RestartPolicy::after_preemption`]).
    Preempted,
    /// A task other than the chief failed permanently (1–127): restarted all the same, within
    /// the restart budget, as the launcher has always done (`restartPolicy: OnFailure`).
    RetryFailure,
}

/// The launcher's decision for a task of `task_type` that exited with `code` (128 + N after
/// death by signal N, see [`exit_code`]); `restart_chief` and `peer_chief`: see
/// [`LaunchConfig::restart_chief`] and [`LaunchConfig::peer_chief`].
fn after_exit(task_type: TaskType, code: i32, restart_chief: bool, peer_chief: bool) -> AfterExit {
    // A peer chief's exits other than with 0 are read as a worker's: the launcher is not
    // stopping (it would not be looking), so only the chief was.
    if task_type == TaskType::Chief && (!peer_chief || code == JOB_DONE_EXIT_CODE) {
        let stopped = code == PREEMPTED_EXIT_CODE || code == 128 + Signal::SIGINT as i32;
        if restart_chief && restart_wanted(code) && !stopped {
            AfterExit::Restart
        } else {
            AfterExit::EndJob
        }
    } else if code == JOB_DONE_EXIT_CODE {
        AfterExit::Finished
    } else if code == PREEMPTED_EXIT_CODE {
        AfterExit::Preempted
    } else if restart_wanted(code) {
        AfterExit::Restart
    } else {
        AfterExit::RetryFailure
    }
}

/// A child's exit status as one code: its own, or 128 + N after death by signal N (as a shell
/// and Kubernetes report it).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(PANIC_EXIT_CODE), _) => format!("panicked (exit code {PANIC_EXIT_CODE})"),
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "unknown status".into(),
    }
}

/// Refuses sizes a launch cannot start: fewer most servers (`ps_max`) than servers to start,
/// no worker, or fewer most workers (`workers_max`) than workers to start.
fn check_sizes(config: &LaunchConfig, workers_max: u32, ps_max: u32) -> Result<(), LaunchError> {
    if ps_max < config.num_ps {
        return Err(crate::cluster::ClusterError::BadValue {
            key: "--ps".into(),
            detail: format!(
                "MAX ({ps_max}) is below the {} servers to start",
                config.num_ps
            ),
        }
        .into());
    }
    if config.num_workers == 0 {
        return Err(crate::cluster::ClusterError::BadValue {
            key: "--workers".into(),
            detail: "at least one worker is needed".into(),
        }
        .into());
    }
    if workers_max < config.num_workers {
        return Err(crate::cluster::ClusterError::BadValue {
            key: "--workers".into(),
            detail: format!(
                "the most workers ({workers_max}) is below the workers to start ({})",
                config.num_workers
            ),
        }
        .into());
    }
    Ok(())
}

/// A fresh CA for a local cluster, and a certificate of every task of `full_cluster` (the most
/// it may grow to) saved under `certs_dir`, the CA's key beside them.
fn issue_local_certs(
    full_cluster: &ClusterSpec,
    certs_dir: &std::path::Path,
) -> Result<(), LaunchError> {
    let ca = ClusterCa::generate("cohort-local").map_err(|e| LaunchError::Certs(e.to_string()))?;
    for task in full_cluster.tasks() {
        ca.issue(&node_id(task))
            .and_then(|creds| creds.save(certs_dir))
            .map_err(|e| LaunchError::Certs(e.to_string()))?;
    }
    // The CA's key stays beside them (the run directory is the launcher's own), so that
    // `cohort certs --add --out <run_dir>/certs` can sign a node that joins the running
    // job later (a parameter server added to it, say).
    write_private(&certs_dir.join("ca.key"), ca.key_pem())
        .map_err(|e| LaunchError::Certs(format!("writing ca.key: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::FAILPOINT_EXIT_CODE;
    use crate::process::{
        BAD_CONFIG_EXIT_CODE, PREEMPTED_EXIT_CODE, PS_LOST_EXIT_CODE, RETIRED_EXIT_CODE,
        TRAINING_ERROR_EXIT_CODE,
    };

    /// Every task other than the chief is restarted unless it exited 0, whatever its code
    /// (permanent failures included, as before the codes followed Kubernetes' ExitCode
    /// policy); the chief's exit ends the job.
    #[test]
    fn the_launcher_restarts_every_failure_of_a_task_other_than_the_chief() {
        use AfterExit::{EndJob, Finished, Preempted, Restart, RetryFailure};
        let cases = [
            (JOB_DONE_EXIT_CODE, Finished),
            (TRAINING_ERROR_EXIT_CODE, RetryFailure),
            (BAD_CONFIG_EXIT_CODE, RetryFailure),
            (3, RetryFailure),
            (127, RetryFailure),
            (128 + 9, Restart),
            (PREEMPTED_EXIT_CODE, Preempted),
            (PANIC_EXIT_CODE, Restart),
            (RETIRED_EXIT_CODE, Restart),
            (PS_LOST_EXIT_CODE, Restart),
            (FAILPOINT_EXIT_CODE, Restart),
        ];
        for task_type in [TaskType::Worker, TaskType::Ps, TaskType::Evaluator] {
            for (code, expected) in cases {
                for (restart_chief, peer_chief) in [(false, false), (true, false), (true, true)] {
                    assert_eq!(
                        after_exit(task_type, code, restart_chief, peer_chief),
                        expected,
                        "{task_type} exit {code}"
                    );
                }
            }
        }
        for (code, _) in cases {
            assert_eq!(
                after_exit(TaskType::Chief, code, false, false),
                EndJob,
                "chief exit {code}"
            );
        }
        // Restarting chiefs: every restart-me code but a stop request's.
        for (code, expected) in [
            (JOB_DONE_EXIT_CODE, EndJob),
            (TRAINING_ERROR_EXIT_CODE, EndJob),
            (BAD_CONFIG_EXIT_CODE, EndJob),
            (PREEMPTED_EXIT_CODE, EndJob),
            (128 + 2, EndJob),
            (128 + 9, Restart),
            (PANIC_EXIT_CODE, Restart),
            (RETIRED_EXIT_CODE, Restart),
            (PS_LOST_EXIT_CODE, Restart),
            (FAILPOINT_EXIT_CODE, Restart),
        ] {
            assert_eq!(
                after_exit(TaskType::Chief, code, true, false),
                expected,
                "chief exit {code}"
            );
        }
        // A peer chief (MultiWorkerMirrored) is read as a worker, except that its exit with
        // 0 ends the job.
        for (code, expected) in cases {
            let peer = if code == JOB_DONE_EXIT_CODE {
                EndJob
            } else {
                expected
            };
            assert_eq!(
                after_exit(TaskType::Chief, code, true, true),
                peer,
                "peer chief exit {code}"
            );
        }
    }

    /// A task (re)started after initial workers were drained for good gets a spec without
    /// them (a MultiWorkerMirrored process would wait for them to enter or form, and never
    /// could); a worker past the initial ones gets the full spec; nothing drained, the initial
    /// one.
    #[test]
    fn a_task_started_after_a_drain_is_not_told_of_the_drained_workers() {
        let full = local_cluster(4, 2, 0).unwrap();
        let initial = with_tasks(&full, 3, 1).unwrap();
        let specs = (&initial, &full);
        let workers_of = |spec: &ClusterSpec| spec.num_tasks(TaskType::Worker);
        let chief = TaskId::new(TaskType::Chief, 0);
        let worker = |i| TaskId::new(TaskType::Worker, i);
        assert_eq!(task_spec(chief, specs, 3, 1).unwrap(), initial);
        let after_drain = task_spec(chief, specs, 2, 1).unwrap();
        assert_eq!(workers_of(&after_drain), 2);
        assert_eq!(after_drain.num_tasks(TaskType::Ps), 1);
        assert_eq!(workers_of(&task_spec(worker(1), specs, 2, 1).unwrap()), 2);
        assert_eq!(task_spec(worker(3), specs, 2, 1).unwrap(), full);
        // A chief of elastic servers: the servers in the job now.
        assert_eq!(
            task_spec(chief, specs, 3, 2)
                .unwrap()
                .num_tasks(TaskType::Ps),
            2
        );
    }

    #[test]
    fn a_scale_request_out_of_range_or_without_a_launcher_is_refused_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("cohort-scale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let queue = dir.join(SCALE_REQUESTS_DIR);
        let err = request_scale(&dir, 0).unwrap_err().to_string();
        assert!(
            err.starts_with("--workers 0: a job needs at least 1 worker"),
            "{err}"
        );
        let err = request_scale(&dir, 2).unwrap_err().to_string();
        assert!(err.contains("no elastic launcher runs there"), "{err}");
        std::fs::write(dir.join(ELASTIC_FILE), "2 4\nps 1 3\n").unwrap();
        let err = request_scale(&dir, 5).unwrap_err().to_string();
        assert_eq!(
            err,
            "--workers 5: the job may have at most 4 workers (launch --workers MIN:4)"
        );
        let err = request_scale_servers(&dir, 4).unwrap_err().to_string();
        assert!(
            err.starts_with("--ps 4: the job may have at most 3"),
            "{err}"
        );
        assert!(
            queued_scale_requests(&queue).is_empty(),
            "nothing was asked"
        );

        // Requests made one after the other all wait, in the order they were made.
        request_scale_servers(&dir, 3).unwrap();
        request_scale(&dir, 4).unwrap();
        request_scale(&dir, 2).unwrap();
        let texts: Vec<String> = queued_scale_requests(&queue)
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        assert_eq!(texts, ["ps 3", "4", "2"]);

        // A launcher that takes none: the queue is bounded.
        while queued_scale_requests(&queue).len() < SCALE_REQUESTS_QUEUED_MAX {
            request_scale(&dir, 3).unwrap();
        }
        let err = request_scale(&dir, 3).unwrap_err();
        assert!(
            matches!(err, ScaleError::QueueFull { queued, .. } if queued == SCALE_REQUESTS_QUEUED_MAX),
            "{err}"
        );
        assert_eq!(
            queued_scale_requests(&queue).len(),
            SCALE_REQUESTS_QUEUED_MAX
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_death_by_signal_is_128_plus_the_signal() {
        use std::os::unix::process::ExitStatusExt;
        // A wait status: the signal in the low 7 bits; an exit code in the next byte.
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(
            exit_code(ExitStatus::from_raw(RETIRED_EXIT_CODE << 8)),
            RETIRED_EXIT_CODE
        );
    }

    fn pump(input: &[u8]) -> (Vec<String>, bool) {
        let flag = AtomicBool::new(false);
        let mut lines = Vec::new();
        pump_lines(input, Some(&flag), |line| lines.push(line.to_string()));
        (lines, flag.load(Ordering::SeqCst))
    }

    #[test]
    fn output_with_invalid_utf8_is_forwarded_to_its_end() {
        // A line of non-UTF-8 bytes used to stop the forwarder, leaving the child's pipe
        // undrained (the child then blocks) and the chaos marker unseen.
        let (lines, marked) = pump(b"ok\r\n\xff\xfe raw\n[chaos-point] now\nlast");
        assert_eq!(
            lines,
            ["ok", "\u{fffd}\u{fffd} raw", "[chaos-point] now", "last"]
        );
        assert!(marked, "the marker after the bad bytes is seen");
    }

    #[test]
    fn a_line_without_newline_is_forwarded_in_bounded_pieces() {
        let long = vec![b'x'; OUTPUT_LINE_BYTES_MAX * 2 + 5];
        let (lines, marked) = pump(&long);
        let lens: Vec<usize> = lines.iter().map(String::len).collect();
        assert_eq!(lens, [OUTPUT_LINE_BYTES_MAX, OUTPUT_LINE_BYTES_MAX, 5]);
        assert!(!marked);
    }
}
