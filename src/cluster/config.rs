//! A role process's configuration, resolved from its layers (DESIGN §7).
//!
//! Every key has three spellings: a flag (`--detection-budget 3s`), an environment variable
//! (`COHORT_DETECTION_BUDGET=3s`) and a `cohort.toml` key (`detection_budget = "3s"`); see
//! [`ConfigKey::ALL`]. A value is taken from the first layer that has it:
//!
//! 1. flags (and the task of a `--cluster-file` given as a flag);
//! 2. environment (and the task of a cluster file named by `COHORT_CLUSTER_FILE`);
//! 3. `TF_CONFIG` (TensorFlow's format: its `cluster` and `task`);
//! 4. the config file: `--config`, else `COHORT_CONFIG`, else `./cohort.toml` if it exists;
//! 5. defaults (task index 0, no incarnation: the process derives one that only grows, see
//!    `crate::bootstrap`; detection budget 3s, worker wait 60s,
//!    step timeout 30m, preemption grace 10s, PS restart wait 20 detection budgets and at
//!    least 30s, evaluator idle timeout 10m, no evaluator step limit).
//!
//! ```toml
//! certs_dir = "certs"            # relative paths are relative to this file
//! checkpoint_dir = "ckpt"
//! # warm_start = "model.safetensors"  # chief: initial variable values from another framework
//! # warm_start_map = "names.toml"     # cohort name = "name in the file"
//! # supervisor_socket = "/run/cohort/supervisor.sock" # chief: exits reported by the supervisor
//! # replicas = 2                # worker: each scheduled step runs on 2 local replicas
//! detection_budget = "3s"
//! worker_wait = "60s"
//! ps_restart_wait = "60s"        # hold for a lost parameter server to come back, restored
//! step_timeout = "30m"
//! preemption_grace = "10s"
//! eval_idle_timeout = "10m"     # evaluator: stop after this long with no new checkpoint
//! eval_until_step = 1000         # evaluator: stop after evaluating a checkpoint at this step
//! workers_max = 4                # the most workers (elastic: joiners up to worker/3)
//! # metrics_addr = "0.0.0.0:9100" # serve Prometheus metrics and /healthz here (off by default)
//! # incarnation = 7           # only to override the incarnation the process derives
//!
//! [cluster]
//! chief = ["10.0.0.1:7000"]
//! worker = ["10.0.0.2:7000", "10.0.0.3:7000"]
//! ps = ["10.0.0.4:7000"]
//!
//! [task]
//! type = "worker"
//! index = 1
//! ```
//!
//! The task's type comes from the highest layer that gives one; its index from that layer or a
//! higher one (an index in a lower layer belongs to that layer's task), else 0. A cluster file
//! counts at the level of what named it, and only its cluster and task are read.
//!
//! Processes started by `cohort launch` get `TF_CONFIG`, `COHORT_CERTS`, `COHORT_INCARNATION`
//! and `COHORT_DETECTION_BUDGET` (from the launcher's `--detection-budget`) in their
//! environment, so those override a `cohort.toml` in their working directory.
//!
//! Every layer present is checked, even where a higher one overrides it: a bad value anywhere
//! refuses to start, with an error naming the key as that layer spells it and where it came
//! from. Unknown keys in `cohort.toml` are errors. An empty environment variable counts as
//! unset. [`resolve_config`] is pure (the caller passes flags, an environment lookup and the
//! files' text); [`load_role_config`] reads the files and calls it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tf_config::{parse_json_parts, parse_toml_cluster};
use super::{
    parse_duration_in, ClusterConfig, ClusterError, ClusterSpec, DurationRange, TaskId, TaskType,
    TF_CONFIG_ENV,
};

/// One configuration key in its three spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConfigKey {
    /// In `cohort.toml`, e.g. `detection_budget` or `task.type`; also the key's canonical name.
    pub file: &'static str,
    /// On the command line, e.g. `--detection-budget`.
    pub flag: &'static str,
    /// In the environment, e.g. `COHORT_DETECTION_BUDGET`.
    pub env: &'static str,
}

impl ConfigKey {
    /// This process's job: chief, worker, ps, evaluator.
    pub const TASK_TYPE: Self = Self {
        file: "task.type",
        flag: "--task-type",
        env: "COHORT_TASK_TYPE",
    };
    /// This process's index in its job.
    pub const TASK_INDEX: Self = Self {
        file: "task.index",
        flag: "--task-index",
        env: "COHORT_TASK_INDEX",
    };
    /// A file holding the cluster (TF_CONFIG-style JSON or a cohort.toml with `[cluster]`).
    pub const CLUSTER_FILE: Self = Self {
        file: "cluster_file",
        flag: "--cluster-file",
        env: "COHORT_CLUSTER_FILE",
    };
    /// The config file (not a key inside it).
    pub const CONFIG: Self = Self {
        file: "config",
        flag: "--config",
        env: "COHORT_CONFIG",
    };
    /// Directory with `ca.pem` and this node's certificate and key.
    pub const CERTS_DIR: Self = Self {
        file: "certs_dir",
        flag: "--certs-dir",
        env: "COHORT_CERTS",
    };
    /// This process's incarnation (FENCE-1).
    pub const INCARNATION: Self = Self {
        file: "incarnation",
        flag: "--incarnation",
        env: "COHORT_INCARNATION",
    };
    /// How long a silent peer may stay silent before it is declared dead.
    pub const DETECTION_BUDGET: Self = Self {
        file: "detection_budget",
        flag: "--detection-budget",
        env: "COHORT_DETECTION_BUDGET",
    };
    /// How long pending closures may wait with no live worker.
    pub const WORKER_WAIT: Self = Self {
        file: "worker_wait",
        flag: "--worker-wait",
        env: "COHORT_WORKER_WAIT",
    };
    /// How long the chief holds dispatch for a lost parameter server to come back and be
    /// restored before `join` fails naming it (default: 20 detection budgets, at least 30s).
    pub const PS_RESTART_WAIT: Self = Self {
        file: "ps_restart_wait",
        flag: "--ps-restart-wait",
        env: "COHORT_PS_RESTART_WAIT",
    };
    /// How long one closure may run on a worker before the step counts as hung.
    pub const STEP_TIMEOUT: Self = Self {
        file: "step_timeout",
        flag: "--step-timeout",
        env: "COHORT_STEP_TIMEOUT",
    };
    /// Where the chief's program keeps checkpoints.
    pub const CHECKPOINT_DIR: Self = Self {
        file: "checkpoint_dir",
        flag: "--checkpoint-dir",
        env: "COHORT_CHECKPOINT_DIR",
    };
    /// How long after SIGTERM the chief's program may take to checkpoint before the process
    /// exits 143 anyway (and how long the other roles keep serving it).
    pub const PREEMPTION_GRACE: Self = Self {
        file: "preemption_grace",
        flag: "--preemption-grace",
        env: "COHORT_PREEMPTION_GRACE",
    };
    /// Evaluator: how long it waits for a new checkpoint before it stops (exit 0).
    pub const EVAL_IDLE_TIMEOUT: Self = Self {
        file: "eval_idle_timeout",
        flag: "--eval-idle-timeout",
        env: "COHORT_EVAL_IDLE_TIMEOUT",
    };
    /// Evaluator: stop (exit 0) after evaluating a checkpoint at this step or later.
    pub const EVAL_UNTIL_STEP: Self = Self {
        file: "eval_until_step",
        flag: "--eval-until-step",
        env: "COHORT_EVAL_UNTIL_STEP",
    };
    /// Chief: a safetensors file the job's variables start from when there is no checkpoint
    /// to resume (`crate::checkpoint::WarmStart`).
    pub const WARM_START: Self = Self {
        file: "warm_start",
        flag: "--warm-start",
        env: "COHORT_WARM_START",
    };
    /// Chief: the name map of `warm_start`, a TOML table of `cohort name = "file name"`.
    pub const WARM_START_MAP: Self = Self {
        file: "warm_start_map",
        flag: "--warm-start-map",
        env: "COHORT_WARM_START_MAP",
    };
    /// Worker: local replicas each scheduled step runs on (threads on CPU), whose gradients
    /// are summed inside the worker before its one push (default 1).
    pub const REPLICAS: Self = Self {
        file: "replicas",
        flag: "--replicas",
        env: "COHORT_REPLICAS",
    };
    /// Chief: a Unix datagram socket it binds, on which the process supervisor reports the
    /// exits of the tasks it runs (`crate::process::ExitReports`), so a dead task is known at
    /// once rather than after the detection budget. `cohort launch` sets it.
    pub const SUPERVISOR_SOCKET: Self = Self {
        file: "supervisor_socket",
        flag: "--supervisor-socket",
        env: "COHORT_SUPERVISOR_SOCKET",
    };
    /// Where this process serves Prometheus metrics (`/metrics`) and `/healthz`, as `ip:port`
    /// (port 0: any free port); unset, no endpoint is served (`crate::metrics`).
    pub const METRICS_ADDR: Self = Self {
        file: "metrics_addr",
        flag: "--metrics-addr",
        env: "COHORT_METRICS_ADDR",
    };
    /// The most workers a parameter-server job may have (elastic workers): the number of
    /// input pipelines, and the bound on a joining worker's index (default: the workers the
    /// cluster spec names).
    pub const WORKERS_MAX: Self = Self {
        file: "workers_max",
        flag: "--workers-max",
        env: "COHORT_WORKERS_MAX",
    };

    /// The values a duration key accepts (`None` for a key that is not a duration). A value
    /// outside it is refused where it is read, naming the key, where it came from, the value
    /// and the range:
    ///
    /// | key | range | why the bounds |
    /// |---|---|---|
    /// | `detection_budget` | 10ms to 1h | heartbeats go every quarter budget; past an hour a dead peer is never noticed in time |
    /// | `worker_wait`, `ps_restart_wait`, `step_timeout`, `eval_idle_timeout` | 1ms to 720h | a wait of more than 30 days is a typo, and a deadline must not overflow |
    /// | `preemption_grace` | 0s to 24h | 0 exits at once; no scheduler waits a day after its notice |
    pub fn duration_range(self) -> Option<DurationRange> {
        match self.file {
            "detection_budget" => Some(DETECTION_BUDGET_RANGE),
            "worker_wait" | "ps_restart_wait" | "step_timeout" | "eval_idle_timeout" => {
                Some(WAIT_RANGE)
            }
            "preemption_grace" => Some(PREEMPTION_GRACE_RANGE),
            _ => None,
        }
    }

    /// Every key.
    pub const ALL: [ConfigKey; 20] = [
        Self::TASK_TYPE,
        Self::TASK_INDEX,
        Self::CLUSTER_FILE,
        Self::CONFIG,
        Self::CERTS_DIR,
        Self::INCARNATION,
        Self::DETECTION_BUDGET,
        Self::WORKER_WAIT,
        Self::PS_RESTART_WAIT,
        Self::STEP_TIMEOUT,
        Self::CHECKPOINT_DIR,
        Self::PREEMPTION_GRACE,
        Self::EVAL_IDLE_TIMEOUT,
        Self::EVAL_UNTIL_STEP,
        Self::WORKERS_MAX,
        Self::WARM_START,
        Self::WARM_START_MAP,
        Self::SUPERVISOR_SOCKET,
        Self::REPLICAS,
        Self::METRICS_ADDR,
    ];
}

/// The config file read when neither `--config` nor `COHORT_CONFIG` names one (if it exists).
pub const DEFAULT_CONFIG_FILE: &str = "cohort.toml";
/// Default failure-detection budget.
pub const DEFAULT_DETECTION_BUDGET: Duration = Duration::from_secs(3);
/// Default bound on waiting with no live worker.
pub const DEFAULT_WORKER_WAIT: Duration = Duration::from_secs(60);
/// Default bound on one closure's run on a worker (see `SchedulerConfig::step_timeout`): 30
/// minutes. Training steps take milliseconds to seconds and a step that evaluates a whole
/// dataset minutes, so a step still running after half an hour is almost surely hung; and it
/// is retried well before the chief's one-hour bound on a single `join` or `fetch` wait gives
/// up.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The default `ps_restart_wait` (`SchedulerConfig::ps_restart_wait_max`) for a
/// failure-detection budget: time for the loss to be detected, the supervisor to back off and
/// restart the process, and the restore to run, with room to spare: 20 budgets, at least 30
/// seconds.
pub fn ps_restart_wait_for(detection_budget: Duration) -> Duration {
    detection_budget
        .saturating_mul(20)
        .max(Duration::from_secs(30))
}

/// Default grace after SIGTERM.
pub const DEFAULT_PREEMPTION_GRACE: Duration = Duration::from_secs(10);
/// Default time an evaluator waits for a new checkpoint before it stops: long enough for a
/// chief that checkpoints every few minutes, short enough that a forgotten evaluator ends.
pub const DEFAULT_EVAL_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// What a role that needs certificates is told when none were configured.
pub const CERTS_DIR_MISSING: &str =
    "missing: pass --certs-dir, set COHORT_CERTS, or set certs_dir \
     in cohort.toml (the directory with ca.pem and this node's certificate; `cohort certs` makes \
     one)";

/// The configuration flags a role process accepts, as given (values are checked by
/// [`resolve_config`], so that a bad flag is reported like any other bad key).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ConfigFlags {
    /// This process's job: chief, worker, ps or evaluator.
    #[arg(long)]
    pub task_type: Option<String>,
    /// This process's index in its job (default 0).
    #[arg(long)]
    pub task_index: Option<String>,
    /// A file with the cluster: TF_CONFIG-style JSON, or a cohort.toml with a `[cluster]` table.
    #[arg(long)]
    pub cluster_file: Option<PathBuf>,
    /// The config file (default: ./cohort.toml if it exists).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory with ca.pem and this node's certificate and key.
    #[arg(long)]
    pub certs_dir: Option<PathBuf>,
    /// This process's incarnation (a restarted process must use a larger one).
    #[arg(long)]
    pub incarnation: Option<String>,
    /// Failure-detection budget, e.g. "3s".
    #[arg(long)]
    pub detection_budget: Option<String>,
    /// How long pending work may wait with no live worker, and a worker for a chief (one lost,
    /// or none yet at its start; then it exits 171), e.g. "60s".
    #[arg(long)]
    pub worker_wait: Option<String>,
    /// How long one closure may run on a worker before it counts as hung, e.g. "30m".
    #[arg(long)]
    pub step_timeout: Option<String>,
    /// How long the chief waits for a lost parameter server to come back and be restored, and
    /// a parameter server for a chief (then it exits 171), e.g. "60s" (default: 20 detection
    /// budgets, at least 30s).
    #[arg(long)]
    pub ps_restart_wait: Option<String>,
    /// Where the chief's program keeps checkpoints.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Time allowed after SIGTERM for a checkpoint before exiting 143, e.g. "10s".
    #[arg(long)]
    pub preemption_grace: Option<String>,
    /// Evaluator: stop after this long with no new checkpoint, e.g. "10m" (default 10m).
    #[arg(long)]
    pub eval_idle_timeout: Option<String>,
    /// Evaluator: stop after evaluating a checkpoint at this step or later.
    #[arg(long)]
    pub eval_until_step: Option<String>,
    /// The most workers the job may have (elastic workers; default: the cluster spec's).
    #[arg(long)]
    pub workers_max: Option<String>,
    /// Chief: a safetensors file the variables start from when there is no checkpoint.
    #[arg(long)]
    pub warm_start: Option<PathBuf>,
    /// Chief: the name map of --warm-start (TOML: cohort name = "name in the file").
    #[arg(long)]
    pub warm_start_map: Option<PathBuf>,
    /// Chief: bind this Unix datagram socket to hear the supervisor's reports of task exits.
    #[arg(long)]
    pub supervisor_socket: Option<PathBuf>,
    /// Worker: run each scheduled step on this many local replicas (default 1).
    #[arg(long)]
    pub replicas: Option<String>,
    /// Serve Prometheus metrics and /healthz on this address, e.g. "127.0.0.1:9100" (port 0:
    /// any free port; default: off).
    #[arg(long)]
    pub metrics_addr: Option<String>,
}

impl ConfigFlags {
    /// Takes the configuration flags out of `args` (`--key value` or `--key=value`) and
    /// returns them with the other arguments, untouched and in order: those belong to the
    /// user's program. A configuration flag without a value, or given twice, is an error.
    pub fn extract(args: &[String]) -> Result<(Self, Vec<String>), ConfigError> {
        let mut flags = Self::default();
        let mut seen = Vec::new();
        let mut rest = Vec::new();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            let Some(key) = ConfigKey::ALL.into_iter().find(|k| k.flag == name) else {
                rest.push(arg.clone());
                continue;
            };
            let error = |detail: &str| {
                ConfigError::new(
                    key.file,
                    Origin::Flag,
                    ClusterError::BadValue {
                        key: key.flag.into(),
                        detail: detail.into(),
                    },
                )
            };
            let value = match inline {
                Some(v) => v,
                None => match iter.next() {
                    Some(v) if !v.starts_with("--") => v.clone(),
                    _ => return Err(error("missing value")),
                },
            };
            if seen.contains(&key.flag) {
                return Err(error("given more than once"));
            }
            seen.push(key.flag);
            flags.set(key, value);
        }
        Ok((flags, rest))
    }

    fn set(&mut self, key: ConfigKey, value: String) {
        match key.file {
            "task.type" => self.task_type = Some(value),
            "task.index" => self.task_index = Some(value),
            "cluster_file" => self.cluster_file = Some(value.into()),
            "config" => self.config = Some(value.into()),
            "certs_dir" => self.certs_dir = Some(value.into()),
            "incarnation" => self.incarnation = Some(value),
            "detection_budget" => self.detection_budget = Some(value),
            "worker_wait" => self.worker_wait = Some(value),
            "ps_restart_wait" => self.ps_restart_wait = Some(value),
            "step_timeout" => self.step_timeout = Some(value),
            "checkpoint_dir" => self.checkpoint_dir = Some(value.into()),
            "eval_idle_timeout" => self.eval_idle_timeout = Some(value),
            "eval_until_step" => self.eval_until_step = Some(value),
            "workers_max" => self.workers_max = Some(value),
            "warm_start" => self.warm_start = Some(value.into()),
            "warm_start_map" => self.warm_start_map = Some(value.into()),
            "supervisor_socket" => self.supervisor_socket = Some(value.into()),
            "replicas" => self.replicas = Some(value),
            "metrics_addr" => self.metrics_addr = Some(value),
            _ => self.preemption_grace = Some(value),
        }
    }

    fn get(&self, key: ConfigKey) -> Option<String> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        match key.file {
            "task.type" => self.task_type.clone(),
            "task.index" => self.task_index.clone(),
            "cluster_file" => path(&self.cluster_file),
            "config" => path(&self.config),
            "certs_dir" => path(&self.certs_dir),
            "incarnation" => self.incarnation.clone(),
            "detection_budget" => self.detection_budget.clone(),
            "worker_wait" => self.worker_wait.clone(),
            "ps_restart_wait" => self.ps_restart_wait.clone(),
            "step_timeout" => self.step_timeout.clone(),
            "checkpoint_dir" => path(&self.checkpoint_dir),
            "eval_idle_timeout" => self.eval_idle_timeout.clone(),
            "eval_until_step" => self.eval_until_step.clone(),
            "workers_max" => self.workers_max.clone(),
            "warm_start" => path(&self.warm_start),
            "warm_start_map" => path(&self.warm_start_map),
            "supervisor_socket" => path(&self.supervisor_socket),
            "replicas" => self.replicas.clone(),
            "metrics_addr" => self.metrics_addr.clone(),
            _ => self.preemption_grace.clone(),
        }
    }
}

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env,
    /// The `TF_CONFIG` environment variable.
    TfConfig,
    /// The cluster file at this path.
    ClusterFile(PathBuf),
    /// The config file at this path.
    File(PathBuf),
    /// No layer had it: the default.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag => f.write_str("command line"),
            Origin::Env => f.write_str("environment"),
            Origin::TfConfig => f.write_str(TF_CONFIG_ENV),
            Origin::ClusterFile(path) | Origin::File(path) => write!(f, "{}", path.display()),
            Origin::Default => f.write_str("defaults"),
        }
    }
}

/// A configuration that was refused: the key, where it came from, and what is wrong. The
/// message names the key as its layer spells it (`--task-index`, `COHORT_WORKER_WAIT`,
/// `TF_CONFIG.task.type`, `detection_budget` in `cohort.toml`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The key's canonical name (its `cohort.toml` spelling, e.g. `task.type`, `cluster`).
    pub key: String,
    /// Where the bad value came from.
    pub origin: Origin,
    /// What is wrong; its message starts with the key as spelled in that layer.
    #[source]
    pub error: Box<ClusterError>,
}

impl ConfigError {
    fn new(key: &str, origin: Origin, error: ClusterError) -> Self {
        Self {
            key: key.into(),
            origin,
            error: Box::new(error),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.origin, self.error.as_ref()) {
            // These messages already say where they come from.
            (Origin::Default, _) | (_, ClusterError::Malformed { .. }) => {
                write!(f, "{}", self.error)
            }
            (origin, error) => write!(f, "{origin}: {error}"),
        }
    }
}

/// The text of the files a process reads, loaded by [`load_files`] (or given by a test).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFiles {
    /// The config file's path and text.
    pub config: Option<(PathBuf, String)>,
    /// The cluster file's path and text (named by `--cluster-file` or `COHORT_CLUSTER_FILE`).
    pub cluster_file: Option<(PathBuf, String)>,
}

/// A role process's resolved configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleConfig {
    /// The cluster and this process's task in it.
    pub cluster: ClusterConfig,
    /// Directory with `ca.pem` and this node's certificate and key; required of every task
    /// but an evaluator, which opens no connection.
    pub certs_dir: Option<PathBuf>,
    /// This process's incarnation (FENCE-1), if a layer gives one (a launcher does);
    /// else the process derives one from the clock (`crate::bootstrap::incarnation_number`).
    pub incarnation: Option<u64>,
    /// Failure-detection budget.
    pub detection_budget: Duration,
    /// How long pending closures may wait with no live worker before they fail.
    pub worker_wait: Duration,
    /// How long dispatch is held for a lost parameter server to come back and be restored
    /// (`SchedulerConfig::ps_restart_wait_max`); by default derived from the detection budget
    /// (`ps_restart_wait_for`).
    pub ps_restart_wait: Duration,
    /// How long one closure may run on a worker before the step counts as hung (its worker
    /// incarnation is then retired and the closure re-dispatched).
    pub step_timeout: Duration,
    /// Where the chief's program keeps checkpoints, if configured.
    pub checkpoint_dir: Option<PathBuf>,
    /// Time allowed after SIGTERM for a checkpoint.
    pub preemption_grace: Duration,
    /// Evaluator: how long it waits for a new checkpoint before it stops.
    pub eval_idle_timeout: Duration,
    /// Evaluator: stop after evaluating a checkpoint at this step or later (`None`: no limit).
    pub eval_until_step: Option<u64>,
    /// The most workers the job may have: its input pipelines, and the bound on a joining
    /// worker's index (at least the workers the cluster spec names).
    pub workers_max: u32,
    /// Chief: the safetensors file variables start from when there is no checkpoint.
    pub warm_start: Option<PathBuf>,
    /// Chief: the name map of `warm_start`.
    pub warm_start_map: Option<PathBuf>,
    /// Chief: the socket on which the supervisor reports task exits (`None`: none).
    pub supervisor_socket: Option<PathBuf>,
    /// Worker: local replicas each scheduled step runs on (at least 1).
    pub replicas: u32,
    /// Where to serve Prometheus metrics and `/healthz` (`None`: not served).
    pub metrics_addr: Option<SocketAddr>,
    origins: BTreeMap<&'static str, Origin>,
}

impl RoleConfig {
    /// Where the value of `key` (canonical name, e.g. `"task.type"`, `"cluster"`) came from.
    pub fn origin(&self, key: &str) -> &Origin {
        self.origins.get(key).unwrap_or(&Origin::Default)
    }
}

/// Resolves a role's configuration from its layers (pure: no file or environment access).
///
/// `env` looks up an environment variable (`TF_CONFIG` included); `files` holds the text of the
/// config file and cluster file, if any. Precedence: flags > environment > `TF_CONFIG` >
/// config file > defaults.
pub fn resolve_config(
    flags: &ConfigFlags,
    env: &dyn Fn(&str) -> Option<String>,
    files: &ConfigFiles,
) -> Result<RoleConfig, ConfigError> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let mut flag_layer = Layer::new(Origin::Flag);
    let mut env_layer = Layer::new(Origin::Env);
    for key in ConfigKey::ALL {
        if let Some(text) = flags.get(key) {
            flag_layer.set_text(key, key.flag, &text, None)?;
        }
        if let Some(text) = env(key.env) {
            env_layer.set_text(key, key.env, &text, None)?;
        }
    }
    let cluster_file_layer = files
        .cluster_file
        .as_ref()
        .map(|(path, text)| cluster_file_layer(path, text))
        .transpose()?;
    let tf_layer = env(TF_CONFIG_ENV)
        .map(|text| tf_config_layer(&text))
        .transpose()?;
    let file_layer = files
        .config
        .as_ref()
        .map(|(path, text)| config_file_layer(path, text))
        .transpose()?;

    // The cluster file sits at the level of whatever named it.
    let mut layers = vec![flag_layer];
    let named_by_flag = flags.cluster_file.is_some();
    let mut cluster_file_layer = cluster_file_layer;
    if named_by_flag {
        layers.extend(cluster_file_layer.take());
    }
    layers.push(env_layer);
    layers.extend(cluster_file_layer);
    layers.extend(tf_layer);
    layers.extend(file_layer);
    merge(layers)
}

/// Reads the config file and the cluster file that `flags` and `env` name.
///
/// The config file is `--config`, else `COHORT_CONFIG`, else `./cohort.toml` when it exists;
/// a file that is named but cannot be read is an error naming the key that named it.
pub fn load_files(
    flags: &ConfigFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConfigFiles, ConfigError> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let named = |key: ConfigKey, flag: &Option<PathBuf>| match flag {
        Some(path) => Some((path.clone(), Origin::Flag, key.flag)),
        None => env(key.env).map(|p| (PathBuf::from(p), Origin::Env, key.env)),
    };
    let read = |key: ConfigKey, (path, origin, spelled): (PathBuf, Origin, &str)| {
        super::read_config_file(&path)
            .map(|text| (path.clone(), text))
            .map_err(|e| {
                ConfigError::new(
                    key.file,
                    origin,
                    ClusterError::BadValue {
                        key: spelled.into(),
                        detail: format!("cannot read {}: {e}", path.display()),
                    },
                )
            })
    };
    let config = match named(ConfigKey::CONFIG, &flags.config) {
        Some(source) => Some(read(ConfigKey::CONFIG, source)?),
        None => {
            let path = PathBuf::from(DEFAULT_CONFIG_FILE);
            if path.is_file() {
                Some(read(
                    ConfigKey::CONFIG,
                    (path, Origin::Default, ConfigKey::CONFIG.file),
                )?)
            } else {
                None
            }
        }
    };
    let cluster_file = named(ConfigKey::CLUSTER_FILE, &flags.cluster_file)
        .map(|source| read(ConfigKey::CLUSTER_FILE, source))
        .transpose()?;
    Ok(ConfigFiles {
        config,
        cluster_file,
    })
}

/// Reads the files and resolves the configuration: [`load_files`] then [`resolve_config`].
pub fn load_role_config(
    flags: &ConfigFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<RoleConfig, ConfigError> {
    resolve_config(flags, env, &load_files(flags, env)?)
}

/// The values one layer gives.
#[derive(Debug, Clone)]
struct Layer {
    origin: Origin,
    cluster: Option<ClusterSpec>,
    task_type: Option<TaskType>,
    task_index: Option<u32>,
    certs_dir: Option<PathBuf>,
    incarnation: Option<u64>,
    detection_budget: Option<Duration>,
    worker_wait: Option<Duration>,
    ps_restart_wait: Option<Duration>,
    step_timeout: Option<Duration>,
    checkpoint_dir: Option<PathBuf>,
    preemption_grace: Option<Duration>,
    eval_idle_timeout: Option<Duration>,
    eval_until_step: Option<u64>,
    workers_max: Option<u32>,
    warm_start: Option<PathBuf>,
    warm_start_map: Option<PathBuf>,
    supervisor_socket: Option<PathBuf>,
    replicas: Option<u32>,
    metrics_addr: Option<SocketAddr>,
}

impl Layer {
    fn new(origin: Origin) -> Self {
        Self {
            origin,
            cluster: None,
            task_type: None,
            task_index: None,
            certs_dir: None,
            incarnation: None,
            detection_budget: None,
            worker_wait: None,
            ps_restart_wait: None,
            step_timeout: None,
            checkpoint_dir: None,
            preemption_grace: None,
            eval_idle_timeout: None,
            eval_until_step: None,
            workers_max: None,
            warm_start: None,
            warm_start_map: None,
            supervisor_socket: None,
            replicas: None,
            metrics_addr: None,
        }
    }

    fn error(&self, key: &str, error: ClusterError) -> ConfigError {
        ConfigError::new(key, self.origin.clone(), error)
    }

    /// Parses `text` as the value of `key` (spelled `spelled` in this layer); relative paths
    /// are taken relative to `base` when given (a config file's directory).
    fn set_text(
        &mut self,
        key: ConfigKey,
        spelled: &str,
        text: &str,
        base: Option<&Path>,
    ) -> Result<(), ConfigError> {
        let bad = |detail: String| {
            self.error(
                key.file,
                ClusterError::BadValue {
                    key: spelled.into(),
                    detail,
                },
            )
        };
        let path = || -> Result<PathBuf, ConfigError> {
            if text.trim().is_empty() {
                return Err(bad("expected a path, got an empty string".into()));
            }
            let path = PathBuf::from(text);
            Ok(match base {
                Some(base) if path.is_relative() => base.join(path),
                _ => path,
            })
        };
        // Every duration key has a range; the error names the key as spelled, the value and
        // the range, and the layer it came from is added by `self.error`.
        let duration = || {
            let range = key.duration_range().unwrap_or(UNBOUNDED);
            parse_duration_in(spelled, text, range).map_err(|e| self.error(key.file, e))
        };
        match key.file {
            "task.type" => {
                self.task_type =
                    Some(TaskType::parse(spelled, text).map_err(|e| self.error(key.file, e))?)
            }
            "task.index" => {
                let index = text.trim().parse::<u32>().map_err(|_| {
                    bad(format!("{text:?} is not a task index (a whole number ≥ 0)"))
                })?;
                self.task_index = Some(index);
            }
            "incarnation" => {
                let incarnation = text
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("{text:?} is not a whole number")))?;
                if incarnation == 0 {
                    return Err(bad("must be at least 1".into()));
                }
                self.incarnation = Some(incarnation);
            }
            "certs_dir" => self.certs_dir = Some(path()?),
            "checkpoint_dir" => self.checkpoint_dir = Some(path()?),
            "warm_start" => self.warm_start = Some(path()?),
            "warm_start_map" => self.warm_start_map = Some(path()?),
            "supervisor_socket" => self.supervisor_socket = Some(path()?),
            "detection_budget" => self.detection_budget = Some(duration()?),
            "worker_wait" => self.worker_wait = Some(duration()?),
            "ps_restart_wait" => self.ps_restart_wait = Some(duration()?),
            "step_timeout" => self.step_timeout = Some(duration()?),
            "preemption_grace" => self.preemption_grace = Some(duration()?),
            "eval_idle_timeout" => self.eval_idle_timeout = Some(duration()?),
            "eval_until_step" => {
                let step = text
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("{text:?} is not a step (a whole number ≥ 0)")))?;
                self.eval_until_step = Some(step);
            }
            "workers_max" => {
                self.workers_max = Some(
                    count(text, "workers", WORKERS_MAX_LIMIT).map_err(|e| bad(e.to_string()))?,
                )
            }
            "replicas" => {
                self.replicas =
                    Some(count(text, "replicas", REPLICAS_LIMIT).map_err(|e| bad(e.to_string()))?)
            }
            "metrics_addr" => {
                let addr = text.trim().parse::<SocketAddr>().map_err(|_| {
                    bad(format!(
                        "{text:?} is not an address to serve metrics on (ip:port, e.g. \
                         127.0.0.1:9100, or port 0 for any free port)"
                    ))
                })?;
                self.metrics_addr = Some(addr);
            }
            // cluster_file and config name files, which load_files has read already.
            _ => {
                path()?;
            }
        }
        Ok(())
    }
}

fn tf_config_layer(text: &str) -> Result<Layer, ConfigError> {
    let mut layer = Layer::new(Origin::TfConfig);
    let (cluster, task) = parse_json_parts(TF_CONFIG_ENV, TF_CONFIG_ENV, text)
        .map_err(|e| layer.error(key_of(TF_CONFIG_ENV, &e), e))?;
    layer.cluster = Some(cluster);
    if let Some(task) = task {
        layer.task_type = Some(task.task_type);
        layer.task_index = Some(task.index);
    }
    Ok(layer)
}

fn cluster_file_layer(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let origin = Origin::ClusterFile(path.to_path_buf());
    let name = path.display().to_string();
    let is_json =
        path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    let mut layer = if is_json {
        let mut layer = Layer::new(origin);
        let (cluster, task) =
            parse_json_parts(&name, "", text).map_err(|e| layer.error(key_of("", &e), e))?;
        layer.cluster = Some(cluster);
        if let Some(task) = task {
            layer.task_type = Some(task.task_type);
            layer.task_index = Some(task.index);
        }
        layer
    } else {
        // A cohort.toml given as the cluster file: only its cluster and task are used.
        let full = config_file_layer(path, text).map_err(|mut e| {
            e.origin = origin.clone();
            e
        })?;
        let mut layer = Layer::new(origin);
        layer.cluster = full.cluster;
        layer.task_type = full.task_type;
        layer.task_index = full.task_index;
        layer
    };
    if layer.cluster.is_none() {
        return Err(layer.error(
            ConfigKey::CLUSTER_FILE.file,
            ClusterError::MissingKey {
                key: "cluster".into(),
            },
        ));
    }
    layer.origin = Origin::ClusterFile(path.to_path_buf());
    Ok(layer)
}

fn config_file_layer(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let mut layer = Layer::new(Origin::File(path.to_path_buf()));
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let error = ClusterError::Malformed {
            source_name: path.display().to_string(),
            detail: e.to_string(),
        };
        layer.error(ConfigKey::CONFIG.file, error)
    })?;
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf);
    for (name, value) in &table {
        match name.as_str() {
            "cluster" => {
                let spec = parse_toml_cluster(value).map_err(|e| layer.error(key_of("", &e), e))?;
                layer.cluster = Some(spec);
            }
            "task" => file_task(&mut layer, value)?,
            "cluster_file" | "config" => {
                let key = if name == "config" {
                    ConfigKey::CONFIG
                } else {
                    ConfigKey::CLUSTER_FILE
                };
                return Err(layer.error(
                    key.file,
                    ClusterError::BadValue {
                        key: name.clone(),
                        detail:
                            "not allowed in a config file (put the cluster in a [cluster] table)"
                                .into(),
                    },
                ));
            }
            _ => {
                let Some(key) = ConfigKey::ALL.into_iter().find(|k| k.file == name) else {
                    return Err(layer.error(
                        ConfigKey::CONFIG.file,
                        ClusterError::BadValue {
                            key: name.clone(),
                            detail: format!("unknown key (expected one of {})", file_keys()),
                        },
                    ));
                };
                let text = toml_text(key, value).map_err(|e| layer.error(key.file, e))?;
                layer.set_text(key, key.file, &text, base.as_deref())?;
            }
        }
    }
    Ok(layer)
}

fn file_task(layer: &mut Layer, value: &toml::Value) -> Result<(), ConfigError> {
    let table = value.as_table().ok_or_else(|| {
        layer.error(
            "task",
            ClusterError::BadValue {
                key: "task".into(),
                detail: "expected a table with type and index".into(),
            },
        )
    })?;
    for (name, value) in table {
        let key = match name.as_str() {
            "type" => ConfigKey::TASK_TYPE,
            "index" => ConfigKey::TASK_INDEX,
            _ => {
                return Err(layer.error(
                    "task",
                    ClusterError::BadValue {
                        key: format!("task.{name}"),
                        detail: "unknown key (expected type, index)".into(),
                    },
                ))
            }
        };
        let text = toml_text(key, value).map_err(|e| layer.error(key.file, e))?;
        layer.set_text(key, key.file, &text, None)?;
    }
    Ok(())
}

/// A TOML value as the text `set_text` parses: integers for index and incarnation, strings
/// for everything else.
fn toml_text(key: ConfigKey, value: &toml::Value) -> Result<String, ClusterError> {
    let wants_integer = matches!(
        key.file,
        "task.index" | "incarnation" | "eval_until_step" | "workers_max" | "replicas"
    );
    match value {
        toml::Value::Integer(i) if wants_integer => Ok(i.to_string()),
        toml::Value::String(s) if !wants_integer => Ok(s.clone()),
        other => Err(ClusterError::BadValue {
            key: key.file.into(),
            detail: format!(
                "expected {}, got {}",
                if wants_integer {
                    "an integer"
                } else {
                    "a string"
                },
                other.type_str()
            ),
        }),
    }
}

fn file_keys() -> String {
    let mut keys: Vec<&str> = ConfigKey::ALL
        .iter()
        .map(|k| k.file)
        .filter(|k| !matches!(*k, "config" | "cluster_file" | "task.type" | "task.index"))
        .collect();
    keys.extend(["[cluster]", "[task]"]);
    keys.join(", ")
}

/// The canonical key a cluster/task parse error is about, from the key it names as the parser
/// spelled it under `prefix` (`TF_CONFIG`, or empty for a cluster file): the task's index
/// (`<prefix>.task.index`), its type (`<prefix>.task`, `.type`, or a key under the task the
/// parser does not know), or else the cluster.
fn key_of(prefix: &str, error: &ClusterError) -> &'static str {
    let spelled = match error {
        ClusterError::UnknownTaskType { key, .. }
        | ClusterError::BadAddress { key, .. }
        | ClusterError::MissingKey { key }
        | ClusterError::BadValue { key, .. } => key.as_str(),
        _ => return "cluster",
    };
    let under_prefix = if prefix.is_empty() {
        Some(spelled)
    } else {
        spelled
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('.'))
    };
    let mut path = under_prefix.into_iter().flat_map(|rest| rest.split('.'));
    match (path.next(), path.next()) {
        (Some("task"), Some("index")) => "task.index",
        (Some("task"), _) => "task.type",
        _ => "cluster",
    }
}

/// Longer than most functions here on purpose: one line per setting, each how a later layer
/// (file, environment, flag) overrides an earlier one, so that every setting's precedence reads
/// in one place.
fn merge(layers: Vec<Layer>) -> Result<RoleConfig, ConfigError> {
    let mut origins = BTreeMap::new();
    macro_rules! pick {
        ($field:ident, $key:expr) => {{
            let found = layers
                .iter()
                .find_map(|l| l.$field.clone().map(|v| (v, l.origin.clone())));
            found.map(|(value, origin)| {
                origins.insert($key, origin);
                value
            })
        }};
    }
    let cluster = pick!(cluster, "cluster");
    // The task's index comes from the layer of its type or a higher one: an index below the
    // type's layer belonged to another task.
    let type_layer = layers
        .iter()
        .position(|l| l.task_type.is_some())
        .unwrap_or(layers.len());
    let task_type = pick!(task_type, "task.type");
    let task_index = layers[..type_layer.min(layers.len() - 1) + 1]
        .iter()
        .find_map(|l| l.task_index.map(|i| (i, l.origin.clone())))
        .map(|(index, origin)| {
            origins.insert("task.index", origin);
            index
        });
    let certs_dir = pick!(certs_dir, "certs_dir");
    let incarnation = pick!(incarnation, "incarnation");
    let detection_budget = pick!(detection_budget, "detection_budget");
    let worker_wait = pick!(worker_wait, "worker_wait");
    let ps_restart_wait = pick!(ps_restart_wait, "ps_restart_wait");
    let step_timeout = pick!(step_timeout, "step_timeout");
    let checkpoint_dir = pick!(checkpoint_dir, "checkpoint_dir");
    let preemption_grace = pick!(preemption_grace, "preemption_grace");
    let eval_idle_timeout = pick!(eval_idle_timeout, "eval_idle_timeout");
    let eval_until_step = pick!(eval_until_step, "eval_until_step");
    let workers_max = pick!(workers_max, "workers_max");
    let warm_start = pick!(warm_start, "warm_start");
    let warm_start_map = pick!(warm_start_map, "warm_start_map");
    let supervisor_socket = pick!(supervisor_socket, "supervisor_socket");
    let replicas = pick!(replicas, "replicas");
    let metrics_addr = pick!(metrics_addr, "metrics_addr");

    let missing = |key: &str, detail: &str| ConfigError {
        key: key.into(),
        origin: Origin::Default,
        error: Box::new(ClusterError::BadValue {
            key: key.into(),
            detail: detail.into(),
        }),
    };
    let cluster = cluster.ok_or_else(|| {
        missing(
            "cluster",
            "no cluster given: set TF_CONFIG, pass --cluster-file, or add a [cluster] table to cohort.toml \
             (`cohort launch` starts a local cluster)",
        )
    })?;
    let task_type = task_type.ok_or_else(|| {
        missing(
            "task.type",
            "this process has no task: pass --task-type (and --task-index), set COHORT_TASK_TYPE, give TF_CONFIG a \
             \"task\", or add a [task] table to cohort.toml",
        )
    })?;
    if certs_dir.is_none() && task_type != TaskType::Evaluator {
        return Err(missing("certs_dir", CERTS_DIR_MISSING));
    }
    let spec_workers = cluster.num_tasks(TaskType::Worker) as u32;
    if let Some(max) = workers_max.filter(|max| *max < spec_workers) {
        let origin = origins
            .get("workers_max")
            .cloned()
            .unwrap_or(Origin::Default);
        // Named as the layer that gave it spells it.
        let spelled = match origin {
            Origin::Flag => ConfigKey::WORKERS_MAX.flag,
            Origin::Env => ConfigKey::WORKERS_MAX.env,
            _ => ConfigKey::WORKERS_MAX.file,
        };
        return Err(ConfigError {
            key: "workers_max".into(),
            origin,
            error: Box::new(ClusterError::BadValue {
                key: spelled.into(),
                detail: format!(
                    "{max} is fewer than the {spec_workers} workers the cluster spec names"
                ),
            }),
        });
    }
    if warm_start_map.is_some() && warm_start.is_none() {
        let origin = origins
            .get("warm_start_map")
            .cloned()
            .unwrap_or(Origin::Default);
        let spelled = match origin {
            Origin::Flag => ConfigKey::WARM_START_MAP.flag,
            Origin::Env => ConfigKey::WARM_START_MAP.env,
            _ => ConfigKey::WARM_START_MAP.file,
        };
        return Err(ConfigError {
            key: "warm_start_map".into(),
            origin,
            error: Box::new(ClusterError::BadValue {
                key: spelled.into(),
                detail: "a name map without a warm-start file: give warm_start (--warm-start,                          COHORT_WARM_START) too"
                    .into(),
            }),
        });
    }
    let task = TaskId::new(task_type, task_index.unwrap_or(0));
    let cluster = ClusterConfig::new(cluster, task).map_err(|error| {
        let key = if origins.contains_key("task.index") {
            "task.index"
        } else {
            "task.type"
        };
        ConfigError {
            key: key.into(),
            origin: origins.get(key).cloned().unwrap_or(Origin::Default),
            error: Box::new(error),
        }
    })?;
    Ok(RoleConfig {
        cluster,
        certs_dir,
        incarnation,
        detection_budget: detection_budget.unwrap_or(DEFAULT_DETECTION_BUDGET),
        worker_wait: worker_wait.unwrap_or(DEFAULT_WORKER_WAIT),
        ps_restart_wait: ps_restart_wait.unwrap_or_else(|| {
            ps_restart_wait_for(detection_budget.unwrap_or(DEFAULT_DETECTION_BUDGET))
        }),
        step_timeout: step_timeout.unwrap_or(DEFAULT_STEP_TIMEOUT),
        checkpoint_dir,
        preemption_grace: preemption_grace.unwrap_or(DEFAULT_PREEMPTION_GRACE),
        eval_idle_timeout: eval_idle_timeout.unwrap_or(DEFAULT_EVAL_IDLE_TIMEOUT),
        eval_until_step,
        workers_max: workers_max.unwrap_or(spec_workers).max(spec_workers),
        warm_start,
        warm_start_map,
        supervisor_socket,
        replicas: replicas.unwrap_or(1),
        metrics_addr,
        origins,
    })
}

/// A count from 1 to `limit` of `what` (workers, replicas), or why `text` is not one (the
/// configuration keys and `launch --replicas` read counts alike).
pub(crate) fn count(text: &str, what: &'static str, limit: u32) -> Result<u32, CountError> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=limit).contains(n))
        .ok_or_else(|| CountError {
            text: text.to_string(),
            what,
            limit,
        })
}

/// A count (of workers, replicas) that is not a whole number from 1 to its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a number of {what} (a whole number from 1 to {limit})")]
pub struct CountError {
    /// The text given.
    pub text: String,
    /// What it counts (`workers`, `replicas`, or the variable that gives the count).
    pub what: &'static str,
    /// The largest count allowed.
    pub limit: u32,
}

/// The most local replicas a worker may run.
pub const REPLICAS_LIMIT: u32 = 256;

/// The largest `workers_max` (as many as `cohort certs` issues per job).
pub const WORKERS_MAX_LIMIT: u32 = 10_000;

/// Range of `detection_budget` (see [`ConfigKey::duration_range`]).
const DETECTION_BUDGET_RANGE: DurationRange =
    DurationRange::new(Duration::from_millis(10), Duration::from_secs(3600));
/// Range of the waits and timeouts (see [`ConfigKey::duration_range`]): 30 days at most.
const WAIT_RANGE: DurationRange = DurationRange::new(
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
);
/// Range of `preemption_grace` (see [`ConfigKey::duration_range`]).
const PREEMPTION_GRACE_RANGE: DurationRange =
    DurationRange::new(Duration::ZERO, Duration::from_secs(24 * 3600));
/// For a key that is not a duration (never used by one: every duration key has a range).
const UNBOUNDED: DurationRange =
    DurationRange::new(Duration::ZERO, Duration::from_millis(u64::MAX));

#[cfg(test)]
mod tests {
    use super::*;

    const TF: &str = r#"{"cluster": {"chief": ["127.0.0.1:7000"], "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
        "ps": ["127.0.0.1:7003"]}, "task": {"type": "worker", "index": 1}}"#;

    const FILE: &str = r#"
        certs_dir = "certs"
        checkpoint_dir = "/var/ckpt"
        detection_budget = "7s"
        worker_wait = "70s"
        step_timeout = "5m"
        preemption_grace = "17s"
        incarnation = 7
        [cluster]
        chief = ["10.0.0.1:1"]
        worker = ["10.0.0.2:1"]
        ps = ["10.0.0.3:1", "10.0.0.4:1"]
        [task]
        type = "ps"
        index = 1
    "#;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key: &str| map.get(key).cloned()
    }

    fn file(text: &str) -> ConfigFiles {
        ConfigFiles {
            config: Some((PathBuf::from("conf/cohort.toml"), text.into())),
            cluster_file: None,
        }
    }

    fn flags(args: &[&str]) -> ConfigFlags {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        ConfigFlags::extract(&args).expect("flags parse").0
    }

    fn resolve(
        args: &[&str],
        env: &[(&str, &str)],
        files: &ConfigFiles,
    ) -> Result<RoleConfig, ConfigError> {
        resolve_config(&flags(args), &env_of(env), files)
    }

    fn error(args: &[&str], env: &[(&str, &str)], files: &ConfigFiles) -> ConfigError {
        resolve(args, env, files).expect_err("the config is refused")
    }

    #[test]
    fn the_file_alone_gives_every_key_relative_paths_from_its_directory() {
        let config = resolve(&[], &[], &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Ps, 1));
        assert_eq!(
            config.cluster.cluster.address(config.cluster.task).unwrap(),
            "10.0.0.4:1"
        );
        assert_eq!(config.certs_dir, Some(PathBuf::from("conf/certs")));
        assert_eq!(config.checkpoint_dir, Some(PathBuf::from("/var/ckpt")));
        assert_eq!(config.detection_budget, Duration::from_secs(7));
        assert_eq!(config.worker_wait, Duration::from_secs(70));
        assert_eq!(config.step_timeout, Duration::from_secs(300));
        assert_eq!(config.preemption_grace, Duration::from_secs(17));
        assert_eq!(config.incarnation, Some(7));
        assert_eq!(
            config.origin("cluster"),
            &Origin::File(PathBuf::from("conf/cohort.toml"))
        );
    }

    #[test]
    fn defaults_fill_what_no_layer_gives() {
        let config = resolve(
            &[],
            &[("TF_CONFIG", TF), ("COHORT_CERTS", "/certs")],
            &ConfigFiles::default(),
        )
        .unwrap();
        assert_eq!(config.incarnation, None);
        assert_eq!(config.detection_budget, DEFAULT_DETECTION_BUDGET);
        assert_eq!(config.worker_wait, DEFAULT_WORKER_WAIT);
        assert_eq!(config.step_timeout, DEFAULT_STEP_TIMEOUT);
        assert_eq!(config.preemption_grace, DEFAULT_PREEMPTION_GRACE);
        assert_eq!(config.checkpoint_dir, None);
        assert_eq!(config.origin("detection_budget"), &Origin::Default);
    }

    #[test]
    fn evaluator_keys_come_from_every_layer_and_bad_values_name_the_key() {
        let config = resolve(
            &[],
            &[("TF_CONFIG", TF), ("COHORT_CERTS", "/certs")],
            &ConfigFiles::default(),
        )
        .unwrap();
        assert_eq!(config.eval_idle_timeout, DEFAULT_EVAL_IDLE_TIMEOUT);
        assert_eq!(config.eval_until_step, None);
        let text = "eval_idle_timeout = \"30s\"\neval_until_step = 100\n";
        let config = resolve(&[], &[("TF_CONFIG", TF)], &file(&format!("{text}{FILE}"))).unwrap();
        assert_eq!(config.eval_idle_timeout, Duration::from_secs(30));
        assert_eq!(config.eval_until_step, Some(100));
        let config = resolve(
            &["--eval-until-step", "7"],
            &[("TF_CONFIG", TF), ("COHORT_EVAL_IDLE_TIMEOUT", "2s")],
            &file(FILE),
        )
        .unwrap();
        assert_eq!(config.eval_idle_timeout, Duration::from_secs(2));
        assert_eq!(config.eval_until_step, Some(7));
        let err = error(
            &["--eval-until-step", "-1"],
            &[("TF_CONFIG", TF)],
            &file(FILE),
        );
        assert_eq!(err.key, "eval_until_step");
        let err = error(&[], &[("COHORT_EVAL_IDLE_TIMEOUT", "0s")], &file(FILE));
        assert!(
            err.to_string().contains("COHORT_EVAL_IDLE_TIMEOUT"),
            "{err}"
        );
        let err = error(&[], &[], &file(&format!("eval_until_step = \"9\"\n{FILE}")));
        assert!(err.to_string().contains("expected an integer"), "{err}");
    }

    #[test]
    fn tf_config_beats_the_file() {
        let config = resolve(&[], &[("TF_CONFIG", TF)], &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Worker, 1));
        assert_eq!(
            config.cluster.cluster.address(config.cluster.task).unwrap(),
            "127.0.0.1:7002"
        );
        assert_eq!(config.origin("cluster"), &Origin::TfConfig);
        assert_eq!(config.origin("task.type"), &Origin::TfConfig);
        // Keys TF_CONFIG does not have still come from the file.
        assert_eq!(config.detection_budget, Duration::from_secs(7));
    }

    /// The warm-start file and its name map, from any layer (relative paths in cohort.toml
    /// relative to it); a map without a file is refused naming the key.
    #[test]
    fn warm_start_and_its_map() {
        let certs = ("COHORT_CERTS", "/certs");
        let config = resolve(
            &[
                "--warm-start",
                "/m.safetensors",
                "--warm-start-map",
                "/names.toml",
            ],
            &[("TF_CONFIG", TF), certs],
            &ConfigFiles::default(),
        )
        .unwrap();
        assert_eq!(config.warm_start, Some(PathBuf::from("/m.safetensors")));
        assert_eq!(config.warm_start_map, Some(PathBuf::from("/names.toml")));
        let toml = "warm_start = \"m.safetensors\"\n";
        let config = resolve(&[], &[("TF_CONFIG", TF), certs], &file(toml)).unwrap();
        assert_eq!(config.warm_start, Some(PathBuf::from("conf/m.safetensors")));
        assert_eq!(config.warm_start_map, None);
        let err = error(
            &[],
            &[
                ("TF_CONFIG", TF),
                certs,
                ("COHORT_WARM_START_MAP", "/n.toml"),
            ],
            &ConfigFiles::default(),
        );
        assert_eq!(err.key, "warm_start_map");
        assert!(
            err.to_string()
                .contains("COHORT_WARM_START_MAP: a name map without a warm-start file"),
            "{err}"
        );
    }

    /// Kubeflow's training operator names the chief `master`: every layer reads it as the
    /// chief (TF_CONFIG, a config file's tables, the environment), and the cluster it came
    /// from is still named when it is wrong.
    #[test]
    fn master_is_the_chief_in_every_layer() {
        let tf = r#"{"cluster": {"master": ["m:1"], "worker": ["w:1"], "ps": ["p:1"]},
                     "task": {"type": "master", "index": 0}, "environment": "cloud"}"#;
        let certs = [("COHORT_CERTS", "/certs")];
        let config = resolve(&[], &[("TF_CONFIG", tf), certs[0]], &ConfigFiles::default()).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Chief, 0));
        assert_eq!(
            config.cluster.cluster.address(config.cluster.task).unwrap(),
            "m:1"
        );

        let toml = "certs_dir = \"c\"\n[cluster]\nmaster = [\"m:1\"]\nworker = [\"w:1\"]\n[task]\ntype = \"master\"\n";
        let config = resolve(&[], &[], &file(toml)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Chief, 0));

        let env = [("TF_CONFIG", TF), ("COHORT_TASK_TYPE", "master"), certs[0]];
        let config = resolve(&[], &env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Chief, 0));

        let both =
            r#"{"cluster": {"chief": ["c:1"], "master": ["m:1"]}, "task": {"type": "master"}}"#;
        let err = error(&[], &[("TF_CONFIG", both)], &ConfigFiles::default());
        assert_eq!(err.key, "cluster", "{err}");
        assert!(
            err.to_string()
                .contains(r#"TF_CONFIG: TF_CONFIG.cluster: names both "chief" and "master""#),
            "{err}"
        );
    }

    /// TensorFlow's sidecar evaluator stands outside the training cluster and never connects:
    /// it needs neither an entry in the spec nor certificates. Every other task needs both.
    #[test]
    fn an_evaluator_needs_no_cluster_entry_and_no_certificates() {
        let tf = r#"{"cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]},
                     "task": {"type": "evaluator", "index": 0}}"#;
        let config = resolve(&[], &[("TF_CONFIG", tf)], &ConfigFiles::default()).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Evaluator, 0));
        assert_eq!(config.certs_dir, None);

        let worker = tf.replace("evaluator", "worker");
        let err = resolve(&[], &[("TF_CONFIG", &worker)], &ConfigFiles::default()).unwrap_err();
        assert_eq!(err.key, "certs_dir", "{err}");
        assert!(err.to_string().contains("--certs-dir"), "{err}");
    }

    #[test]
    fn environment_beats_tf_config_and_the_file() {
        let env = [
            ("TF_CONFIG", TF),
            ("COHORT_TASK_TYPE", "chief"),
            ("COHORT_TASK_INDEX", "0"),
            ("COHORT_CERTS", "/env/certs"),
            ("COHORT_INCARNATION", "8"),
            ("COHORT_DETECTION_BUDGET", "8s"),
            ("COHORT_WORKER_WAIT", "80s"),
            ("COHORT_STEP_TIMEOUT", "8m"),
            ("COHORT_CHECKPOINT_DIR", "/env/ckpt"),
            ("COHORT_PREEMPTION_GRACE", "18s"),
        ];
        let config = resolve(&[], &env, &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Chief, 0));
        assert_eq!(config.origin("task.type"), &Origin::Env);
        assert_eq!(config.origin("cluster"), &Origin::TfConfig);
        assert_eq!(config.certs_dir, Some(PathBuf::from("/env/certs")));
        assert_eq!(config.incarnation, Some(8));
        assert_eq!(config.detection_budget, Duration::from_secs(8));
        assert_eq!(config.worker_wait, Duration::from_secs(80));
        assert_eq!(config.step_timeout, Duration::from_secs(480));
        assert_eq!(config.checkpoint_dir, Some(PathBuf::from("/env/ckpt")));
        assert_eq!(config.preemption_grace, Duration::from_secs(18));
    }

    #[test]
    fn flags_beat_everything() {
        let env = [
            ("TF_CONFIG", TF),
            ("COHORT_TASK_TYPE", "chief"),
            ("COHORT_DETECTION_BUDGET", "8s"),
        ];
        let args = [
            "--task-type",
            "ps",
            "--task-index=0",
            "--certs-dir",
            "/flag/certs",
            "--incarnation",
            "9",
            "--detection-budget",
            "9s",
            "--worker-wait=90s",
            "--checkpoint-dir",
            "/flag/ckpt",
            "--preemption-grace",
            "19s",
        ];
        let config = resolve(&args, &env, &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Ps, 0));
        assert_eq!(config.origin("task.type"), &Origin::Flag);
        assert_eq!(config.origin("task.index"), &Origin::Flag);
        assert_eq!(config.certs_dir, Some(PathBuf::from("/flag/certs")));
        assert_eq!(config.incarnation, Some(9));
        assert_eq!(config.detection_budget, Duration::from_secs(9));
        assert_eq!(config.worker_wait, Duration::from_secs(90));
        assert_eq!(config.checkpoint_dir, Some(PathBuf::from("/flag/ckpt")));
        assert_eq!(config.preemption_grace, Duration::from_secs(19));
    }

    #[test]
    fn the_task_index_comes_from_the_layer_of_the_type_or_above() {
        // The file's index 1 belongs to its own task (ps/1), not to the flag's worker.
        let config = resolve(&["--task-type", "worker"], &[], &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Worker, 0));
        assert_eq!(config.origin("task.index"), &Origin::Default);
        // An index alone overrides the index of a lower layer's task.
        let config = resolve(&["--task-index", "0"], &[], &file(FILE)).unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Ps, 0));
        assert_eq!(config.origin("task.index"), &Origin::Flag);
    }

    #[test]
    fn a_cluster_file_sits_at_the_level_of_what_named_it() {
        let json = ConfigFiles {
            config: None,
            cluster_file: Some((PathBuf::from("c.json"), TF.into())),
        };
        let by_flag = resolve(
            &["--cluster-file", "c.json", "--certs-dir", "x"],
            &[("COHORT_TASK_TYPE", "ps")],
            &json,
        )
        .unwrap();
        // Named by a flag, its task beats the environment's.
        assert_eq!(by_flag.cluster.task, TaskId::new(TaskType::Worker, 1));
        assert_eq!(
            by_flag.origin("cluster"),
            &Origin::ClusterFile(PathBuf::from("c.json"))
        );
        let by_env = resolve(
            &["--certs-dir", "x"],
            &[
                ("COHORT_CLUSTER_FILE", "c.json"),
                ("COHORT_TASK_TYPE", "ps"),
            ],
            &json,
        )
        .unwrap();
        assert_eq!(by_env.cluster.task, TaskId::new(TaskType::Ps, 0));
        // A cohort.toml as the cluster file: its cluster and task are used.
        let toml = ConfigFiles {
            config: None,
            cluster_file: Some((PathBuf::from("c.toml"), FILE.into())),
        };
        let config = resolve(
            &["--cluster-file", "c.toml", "--certs-dir", "x"],
            &[],
            &toml,
        )
        .unwrap();
        assert_eq!(config.cluster.task, TaskId::new(TaskType::Ps, 1));
        assert_eq!(
            config.detection_budget, DEFAULT_DETECTION_BUDGET,
            "only cluster and task are taken from it"
        );
    }

    #[test]
    fn an_empty_environment_variable_is_unset() {
        let config = resolve(
            &[],
            &[
                ("TF_CONFIG", TF),
                ("COHORT_CERTS", "c"),
                ("COHORT_DETECTION_BUDGET", ""),
            ],
            &ConfigFiles::default(),
        )
        .unwrap();
        assert_eq!(config.detection_budget, DEFAULT_DETECTION_BUDGET);
    }

    #[test]
    fn replicas_default_to_one_and_a_bad_count_names_the_key() {
        let env = [("TF_CONFIG", TF), ("COHORT_CERTS", "/c")];
        let config = resolve(&[], &env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.replicas, 1);
        let config = resolve(&["--replicas", "4"], &env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.replicas, 4);
        let mut with_env = env.to_vec();
        with_env.push(("COHORT_REPLICAS", "3"));
        let config = resolve(&[], &with_env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.replicas, 3);
        for bad in ["0", "x", "257", "-1"] {
            let err = error(&["--replicas", bad], &env, &ConfigFiles::default());
            assert_eq!(err.key, "replicas");
            assert!(
                err.to_string()
                    .contains(&format!("--replicas: {bad:?} is not a number of replicas")),
                "{err}"
            );
        }
    }

    #[test]
    fn workers_max_defaults_to_the_spec_and_is_never_below_it() {
        let env = [("TF_CONFIG", TF), ("COHORT_CERTS", "/c")];
        let config = resolve(&[], &env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.workers_max, 2, "the spec's workers");
        let config = resolve(&["--workers-max", "5"], &env, &ConfigFiles::default()).unwrap();
        assert_eq!(config.workers_max, 5);
        let mut with_env = env.to_vec();
        with_env.push(("COHORT_WORKERS_MAX", "1"));
        let err = error(&[], &with_env, &ConfigFiles::default());
        assert_eq!(err.key, "workers_max");
        let text = err.to_string();
        assert!(
            text.contains("COHORT_WORKERS_MAX")
                && text.contains("1 is fewer than the 2 workers the cluster spec names"),
            "{text}"
        );
        for bad in ["0", "x", "10001", "-1"] {
            let err = error(&["--workers-max", bad], &env, &ConfigFiles::default());
            assert_eq!(err.key, "workers_max");
            assert!(
                err.to_string().contains(&format!(
                    "--workers-max: {bad:?} is not a number of workers"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn every_bad_value_names_its_key_and_layer() {
        let base_env = [("TF_CONFIG", TF), ("COHORT_CERTS", "/c")];
        // (flags, environment, key, message)
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case<'_>] = &[
            (
                &["--task-type", "boss"],
                &[],
                "task.type",
                "command line: --task-type: unknown task type \"boss\"",
            ),
            (
                &["--task-index", "-1"],
                &[],
                "task.index",
                "command line: --task-index: \"-1\" is not a task index",
            ),
            (&["--task-index", "x"], &[], "task.index", "--task-index"),
            (
                &["--incarnation", "0"],
                &[],
                "incarnation",
                "command line: --incarnation: must be at least 1",
            ),
            (
                &["--incarnation", "one"],
                &[],
                "incarnation",
                "--incarnation: \"one\" is not a whole number",
            ),
            (
                &["--detection-budget", "3"],
                &[],
                "detection_budget",
                "command line: --detection-budget: \"3\" is not a duration",
            ),
            (
                &["--detection-budget", "0s"],
                &[],
                "detection_budget",
                "--detection-budget: \"0s\" must be more than zero",
            ),
            (
                &["--worker-wait", "0ms"],
                &[],
                "worker_wait",
                "--worker-wait: \"0ms\" must be more than zero",
            ),
            (
                &["--preemption-grace", "soon"],
                &[],
                "preemption_grace",
                "--preemption-grace: \"soon\" is not a duration",
            ),
            (
                &["--certs-dir", ""],
                &[],
                "certs_dir",
                "--certs-dir: expected a path",
            ),
            (
                &[],
                &[("COHORT_TASK_TYPE", "boss")],
                "task.type",
                "environment: COHORT_TASK_TYPE: unknown task type",
            ),
            (
                &[],
                &[("COHORT_WORKER_WAIT", "1 lightyear")],
                "worker_wait",
                "environment: COHORT_WORKER_WAIT:",
            ),
            (
                &[],
                &[("COHORT_INCARNATION", "-3")],
                "incarnation",
                "environment: COHORT_INCARNATION:",
            ),
            (
                &[],
                &[("TF_CONFIG", "{")],
                "cluster",
                "TF_CONFIG: malformed",
            ),
            (
                &[],
                &[("TF_CONFIG", r#"{"cluster": {"wrker": ["h:1"]}}"#)],
                "cluster",
                "TF_CONFIG: TF_CONFIG.cluster.wrker: unknown task type",
            ),
            (
                &[],
                &[(
                    "TF_CONFIG",
                    r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "boss"}}"#,
                )],
                "task.type",
                "TF_CONFIG.task.type",
            ),
            (
                &[],
                &[(
                    "TF_CONFIG",
                    r#"{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": "1"}}"#,
                )],
                "task.index",
                "TF_CONFIG.task.index",
            ),
            (
                &["--task-index", "5"],
                &[],
                "task.index",
                "command line: task: worker/5 does not exist",
            ),
        ];
        for (args, env, key, message) in cases {
            let mut all_env: Vec<(&str, &str)> = base_env.to_vec();
            all_env.retain(|(k, _)| !env.iter().any(|(e, _)| e == k));
            all_env.extend(env.iter().copied());
            let err = error(args, &all_env, &ConfigFiles::default());
            assert_eq!(err.key, *key, "{args:?} {env:?}: {err}");
            assert!(
                err.to_string().contains(message),
                "{args:?} {env:?}: got {err:?}, want {message:?}"
            );
        }
    }

    #[test]
    fn a_bad_value_is_refused_even_where_a_higher_layer_overrides_it() {
        let err = error(
            &["--detection-budget", "1s"],
            &[("COHORT_DETECTION_BUDGET", "fast")],
            &file(FILE),
        );
        assert_eq!(err.origin, Origin::Env);
        assert!(err.to_string().contains("COHORT_DETECTION_BUDGET"), "{err}");
    }

    #[test]
    fn every_bad_file_names_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "detection_budget = \"3\"\n",
                "detection_budget",
                "conf/cohort.toml: detection_budget: \"3\" is not a duration",
            ),
            (
                "detection_budget = 3\n",
                "detection_budget",
                "detection_budget: expected a string, got integer",
            ),
            (
                "incarnation = \"3\"\n",
                "incarnation",
                "incarnation: expected an integer, got string",
            ),
            (
                "incarnation = -3\n",
                "incarnation",
                "incarnation: \"-3\" is not a whole number",
            ),
            (
                "detection_budgte = \"3s\"\n",
                "config",
                "conf/cohort.toml: detection_budgte: unknown key (expected one of",
            ),
            (
                "cluster_file = \"c.json\"\n",
                "cluster_file",
                "cluster_file: not allowed in a config file",
            ),
            (
                "[task]\ntype = \"boss\"\n",
                "task.type",
                "conf/cohort.toml: task.type: unknown task type",
            ),
            (
                "[task]\ntype = \"ps\"\nidx = 1\n",
                "task",
                "task.idx: unknown key",
            ),
            (
                "[task]\ntype = \"ps\"\nindex = \"1\"\n",
                "task.index",
                "task.index: expected an integer",
            ),
            ("task = 3\n", "task", "task: expected a table"),
            (
                "[cluster]\nworker = \"h:1\"\n",
                "cluster",
                "cluster.worker: expected a list",
            ),
            (
                "[cluster]\nworker = [\"h:1\", \"h:1\"]\n",
                "cluster",
                "share the address h:1",
            ),
            (
                "[cluster]\nworker = [\"nope\"]\n",
                "cluster",
                "cluster.worker[0]",
            ),
            (
                "detection_budget = \n",
                "config",
                "conf/cohort.toml: malformed",
            ),
            (
                "certs_dir = \"\"\n",
                "certs_dir",
                "certs_dir: expected a path",
            ),
        ];
        let env = [("TF_CONFIG", TF), ("COHORT_CERTS", "/c")];
        for (text, key, message) in cases {
            let err = error(&[], &env, &file(text));
            assert_eq!(err.key, *key, "{text:?}: {err}");
            assert!(
                err.to_string().contains(message),
                "{text:?}: got {err}, want {message:?}"
            );
        }
    }

    #[test]
    fn missing_cluster_task_or_certificates_say_how_to_give_them() {
        let err = error(&[], &[("COHORT_CERTS", "/c")], &ConfigFiles::default());
        assert_eq!(err.key, "cluster");
        assert!(
            err.to_string().starts_with("cluster: no cluster given"),
            "{err}"
        );
        let no_task = r#"{"cluster": {"worker": ["h:1"]}}"#;
        let err = error(
            &[],
            &[("COHORT_CERTS", "/c"), ("TF_CONFIG", no_task)],
            &ConfigFiles::default(),
        );
        assert_eq!(err.key, "task.type");
        assert!(err.to_string().contains("--task-type"), "{err}");
        let err = error(&[], &[("TF_CONFIG", TF)], &ConfigFiles::default());
        assert_eq!(err.key, "certs_dir");
        assert!(err.to_string().contains("--certs-dir"), "{err}");
    }

    #[test]
    fn a_cluster_file_without_a_cluster_is_refused() {
        let files = ConfigFiles {
            config: None,
            cluster_file: Some((
                PathBuf::from("c.toml"),
                "detection_budget = \"3s\"\n".into(),
            )),
        };
        let err = error(
            &["--cluster-file", "c.toml"],
            &[("COHORT_CERTS", "/c")],
            &files,
        );
        assert_eq!(err.key, "cluster_file");
        assert!(
            err.to_string().starts_with("c.toml: cluster: missing"),
            "{err}"
        );
        let files = ConfigFiles {
            config: None,
            cluster_file: Some((PathBuf::from("c.json"), "{\"task\": 1}".into())),
        };
        let err = error(
            &["--cluster-file", "c.json"],
            &[("COHORT_CERTS", "/c")],
            &files,
        );
        assert!(
            err.to_string().starts_with("c.json: cluster: missing"),
            "{err}"
        );
    }

    #[test]
    fn extract_takes_config_flags_and_leaves_the_rest_in_order() {
        let args: Vec<String> = [
            "--exact",
            "cluster_task",
            "--task-type",
            "ps",
            "--lr=0.1",
            "--task-index=2",
            "--nocapture",
        ]
        .map(String::from)
        .to_vec();
        let (flags, rest) = ConfigFlags::extract(&args).unwrap();
        assert_eq!(flags.task_type.as_deref(), Some("ps"));
        assert_eq!(flags.task_index.as_deref(), Some("2"));
        assert_eq!(rest, ["--exact", "cluster_task", "--lr=0.1", "--nocapture"]);

        for (args, message) in [
            (
                &["--task-type"][..],
                "command line: --task-type: missing value",
            ),
            (
                &["--task-type", "--task-index", "1"][..],
                "--task-type: missing value",
            ),
            (
                &["--worker-wait", "1s", "--worker-wait=2s"][..],
                "--worker-wait: given more than once",
            ),
        ] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let err = ConfigFlags::extract(&args).unwrap_err();
            assert!(err.to_string().contains(message), "{args:?}: {err}");
        }
    }

    #[test]
    fn load_files_reads_named_files_and_refuses_missing_ones() {
        let dir = std::env::temp_dir().join(format!("cohort-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("my.toml");
        std::fs::write(&path, FILE).unwrap();
        let flags = ConfigFlags {
            config: Some(path.clone()),
            ..ConfigFlags::default()
        };
        let config = load_role_config(&flags, &env_of(&[])).unwrap();
        assert_eq!(config.certs_dir, Some(dir.join("certs")));
        let missing = dir.join("absent.toml");
        let err = load_files(
            &ConfigFlags::default(),
            &env_of(&[("COHORT_CONFIG", missing.to_str().unwrap())]),
        )
        .unwrap_err();
        assert_eq!((err.key.as_str(), &err.origin), ("config", &Origin::Env));
        assert!(
            err.to_string().contains("COHORT_CONFIG: cannot read"),
            "{err}"
        );
        let flags = ConfigFlags {
            cluster_file: Some(missing),
            ..ConfigFlags::default()
        };
        let err = load_files(&flags, &env_of(&[])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("command line: --cluster-file: cannot read"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every duration key, in every layer that can set it: a huge value (one that used to
    /// reach the transport and come back as an idle-timeout error) and a value just past the
    /// range are refused naming the key as that layer spells it, the layer, the value and the
    /// range; never a panic, never a later failure.
    #[test]
    fn an_out_of_range_duration_is_refused_naming_key_origin_value_and_range() {
        let durations: Vec<ConfigKey> = ConfigKey::ALL
            .into_iter()
            .filter(|k| k.duration_range().is_some())
            .collect();
        assert_eq!(durations.len(), 6, "every duration key has a range");
        for key in durations {
            let range = key.duration_range().unwrap();
            let past_max = format!("{}ms", range.max.as_millis() + 1);
            for value in [
                "5124095576030h",
                "99999999999999999999999999999999999999999h",
                &past_max,
            ] {
                let expect = |spelled: &str, origin: &str| {
                    format!("{origin}: {spelled}: {value:?} is out of range (allowed: {range})")
                };
                let flag = resolve_config(&flags(&[key.flag, value]), &env_of(&[]), &file(FILE))
                    .unwrap_err();
                assert_eq!((flag.key.as_str(), &flag.origin), (key.file, &Origin::Flag));
                assert_eq!(flag.to_string(), expect(key.flag, "command line"));
                let env = resolve_config(
                    &ConfigFlags::default(),
                    &env_of(&[(key.env, value)]),
                    &file(FILE),
                )
                .unwrap_err();
                assert_eq!((env.key.as_str(), &env.origin), (key.file, &Origin::Env));
                assert_eq!(env.to_string(), expect(key.env, "environment"));
                // FILE sets some of these keys already: this value replaces that line.
                let rest: String = FILE
                    .lines()
                    .filter(|l| !l.trim_start().starts_with(key.file))
                    .map(|l| format!("{l}\n"))
                    .collect();
                let text = format!("{} = \"{value}\"\n{rest}", key.file);
                let in_file = resolve_config(&ConfigFlags::default(), &env_of(&[]), &file(&text))
                    .unwrap_err();
                assert_eq!(in_file.key, key.file);
                assert_eq!(in_file.to_string(), expect(key.file, "conf/cohort.toml"));
            }
            // Both ends of the range are accepted.
            for end in [range.min, range.max] {
                let text = format!("{}ms", end.as_millis());
                let config = resolve_config(&flags(&[key.flag, &text]), &env_of(&[]), &file(FILE))
                    .unwrap_or_else(|e| panic!("{} {text}: {e}", key.flag));
                let got = match key.file {
                    "detection_budget" => config.detection_budget,
                    "worker_wait" => config.worker_wait,
                    "ps_restart_wait" => config.ps_restart_wait,
                    "step_timeout" => config.step_timeout,
                    "preemption_grace" => config.preemption_grace,
                    _ => config.eval_idle_timeout,
                };
                assert_eq!(got, end, "{}", key.flag);
            }
        }
    }

    /// A cluster or task error is filed under the key its path names, read segment by
    /// segment under the layer's prefix (a job or an unknown key that merely starts with
    /// "task" is the cluster's).
    #[test]
    fn a_parse_error_is_filed_under_the_task_key_its_path_names() {
        let bad = |key: &str| ClusterError::BadValue {
            key: key.into(),
            detail: "bad".into(),
        };
        let cases = [
            ("TF_CONFIG", "TF_CONFIG.task.index", "task.index"),
            ("TF_CONFIG", "TF_CONFIG.task.type", "task.type"),
            ("TF_CONFIG", "TF_CONFIG.task", "task.type"),
            ("TF_CONFIG", "TF_CONFIG.task.extra", "task.type"),
            ("TF_CONFIG", "TF_CONFIG.cluster.worker[0]", "cluster"),
            ("TF_CONFIG", "TF_CONFIG.cluster.taskmaster", "cluster"),
            ("TF_CONFIG", "TF_CONFIG.tasks", "cluster"),
            ("", "task.index", "task.index"),
            ("", "task", "task.type"),
            ("", "cluster", "cluster"),
        ];
        for (prefix, key, want) in cases {
            assert_eq!(key_of(prefix, &bad(key)), want, "{key} under {prefix:?}");
        }
        let shared = ClusterError::DuplicateAddress {
            first: "cluster.worker[0]".into(),
            second: "cluster.worker[1]".into(),
            address: "a:1".into(),
        };
        assert_eq!(key_of("TF_CONFIG", &shared), "cluster");
        let config = resolve(
            &[],
            &[(
                "TF_CONFIG",
                r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}"#,
            )],
            &ConfigFiles::default(),
        );
        assert_eq!(config.unwrap_err().key, "task.index");
    }
}
