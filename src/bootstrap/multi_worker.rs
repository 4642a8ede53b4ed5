//! A MultiWorkerMirrored program's process entry: `launch` runs it as a local cluster (the
//! chief and the workers are peers of one group, no parameter server), and each task builds
//! its strategy from what the launcher (or Kubernetes) put in its environment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{parse_duration_in, ClusterConfig, ClusterError, ConfigKey, TaskType};
use crate::process::{BAD_CONFIG_EXIT_CODE, TRAINING_ERROR_EXIT_CODE};
use crate::strategy::{
    Communication, CommunicationError, MultiWorkerConfig, MultiWorkerMirrored, StrategyError,
};

/// The environment variable that picks what all-reduces across the workers (`ring`, `nccl`,
/// `nccl:N`) for [`multi_worker_main`]'s tasks.
pub const COMMUNICATION_ENV: &str = "COHORT_COMMUNICATION";

/// A MultiWorkerMirrored task's environment that cannot configure it; every message names the
/// environment variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum TaskConfigError {
    /// A variable the task needs is unset.
    #[error("{variable}: unset")]
    Unset {
        /// The variable.
        variable: &'static str,
    },
    /// `TF_CONFIG` does not describe a cluster that holds this task.
    #[error("{}", TfConfigMessage(.0))]
    Cluster(#[source] ClusterError),
    /// `COHORT_REPLICAS` is not a count (the message names the variable).
    #[error(transparent)]
    Replicas(Box<dyn std::error::Error + Send + Sync>),
    /// The detection budget's key has no range to check it against.
    #[error("{variable}: has no range")]
    NoBudgetRange {
        /// The variable.
        variable: &'static str,
    },
    /// The detection budget is not a duration in its range (the message names the variable).
    #[error(transparent)]
    DetectionBudget(ClusterError),
    /// The communication named is not one there is.
    #[error("{variable}: {detail}")]
    Communication {
        /// The variable.
        variable: String,
        /// What is wrong with its value.
        detail: CommunicationError,
    },
    /// The metrics address is not one to serve on (the message names the variable).
    #[error(transparent)]
    MetricsAddr(StrategyError),
}

/// A `TF_CONFIG` error as [`TaskConfigError::Cluster`] says it: the JSON parser's errors name
/// the variable already (their source or key is spelled under `TF_CONFIG`), the cluster's own
/// checks (an address, a task that is not in the cluster) do not, and get it in front.
struct TfConfigMessage<'a>(&'a ClusterError);

impl std::fmt::Display for TfConfigMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            ClusterError::Malformed { .. }
            | ClusterError::UnknownTaskType { .. }
            | ClusterError::MissingKey { .. }
            | ClusterError::BadValue { .. } => write!(f, "{}", self.0),
            ClusterError::BadAddress { .. }
            | ClusterError::DuplicateAddress { .. }
            | ClusterError::NoSuchTask { .. }
            | ClusterError::MissingRole { .. } => {
                write!(f, "{}: {}", crate::cluster::TF_CONFIG_ENV, self.0)
            }
        }
    }
}

/// One task of a MultiWorkerMirrored program, as [`multi_worker_main`] gives it to the
/// program.
#[derive(Debug)]
pub struct MultiWorkerTask {
    /// The strategy, its group joined (or about to be formed with the other tasks).
    pub strategy: MultiWorkerMirrored,
    /// Set by SIGTERM or SIGINT: a preemption notice (give it to `Fit::preemption_notice`).
    pub notice: Arc<AtomicBool>,
    /// Set by SIGUSR1: a drain, the job scaled down (give it to `Fit::drain`).
    pub drain: Arc<AtomicBool>,
}

/// The whole process of a MultiWorkerMirrored program (call it from `main` and exit with its
/// code): with `launch` as the first argument it runs the program as a local cluster
/// (`launch --workers N`: the chief and N workers, every flag of `cohort launch` but `--ps`,
/// restarting a task that dies); otherwise it is one task: the strategy is made from
/// `TF_CONFIG`, `COHORT_CERTS`, `COHORT_REPLICAS`, the detection budget and
/// [`COMMUNICATION_ENV`], SIGTERM/SIGINT and SIGUSR1 are watched, and `run` trains.
///
/// Exit codes: 0 when `run` returns `Ok` (also after a drain: the supervisor does not restart
/// it), 143 when it returns after a preemption notice (it is restarted and rejoins), 1 when it
/// fails, 2 for bad configuration.
pub fn multi_worker_main<F, E>(run: F) -> i32
where
    F: FnOnce(MultiWorkerTask) -> Result<(), E>,
    E: std::fmt::Display,
{
    // First, before any thread starts (it sets the environment).
    crate::process::follow_cpu_quota();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("launch") {
        return launch(&args[1..]);
    }
    if let Err(e) = super::logging::init() {
        eprintln!("error: bad config: {e}");
        return BAD_CONFIG_EXIT_CODE;
    }
    let config = match multi_worker_config_from_env(COMMUNICATION_ENV) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("bad config: {e}");
            return BAD_CONFIG_EXIT_CODE;
        }
    };
    let notice = Arc::new(AtomicBool::new(false));
    let drain = Arc::new(AtomicBool::new(false));
    let watched = crate::process::stop_on_signals(&notice)
        .and_then(|()| crate::process::drain_on_signal(&drain));
    if let Err(e) = watched {
        tracing::error!("cannot watch for signals: {e}");
        return TRAINING_ERROR_EXIT_CODE;
    }
    let strategy = match MultiWorkerMirrored::new(config) {
        Ok(strategy) => strategy,
        Err(e) => {
            tracing::error!("{e}");
            return TRAINING_ERROR_EXIT_CODE;
        }
    };
    let task = MultiWorkerTask {
        strategy,
        notice: Arc::clone(&notice),
        drain: Arc::clone(&drain),
    };
    match run(task) {
        Ok(()) if notice.load(Ordering::SeqCst) && !drain.load(Ordering::SeqCst) => {
            crate::process::PREEMPTED_EXIT_CODE
        }
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("error: {e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// `launch` for a MultiWorkerMirrored program: the chief is a peer of the group, there is no
/// parameter server.
fn launch(args: &[String]) -> i32 {
    match std::env::current_exe() {
        Ok(program) => launch_multi_worker_program(program, args, Vec::new()),
        Err(e) => {
            eprintln!("error: cannot find this executable to launch its tasks: {e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// `launch` (its flags `args`) of a MultiWorkerMirrored job whose every task runs `program`
/// with `task_args` (cohort's Python package: the interpreter, the script and its arguments):
/// the chief is a peer of the group, there is no parameter server.
pub fn launch_multi_worker_program(
    program: std::path::PathBuf,
    args: &[String],
    task_args: Vec<String>,
) -> i32 {
    use clap::Parser;
    if args.iter().any(|a| a == "--ps" || a.starts_with("--ps=")) {
        eprintln!(
            "error: --ps: a MultiWorkerMirrored job has no parameter server (its workers \
             all-reduce their gradients)"
        );
        return BAD_CONFIG_EXIT_CODE;
    }
    let parsed = match super::LaunchArgs::try_parse_from(
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
    let mut flags = parsed.flags;
    if flags.kill_ps_after.is_some() {
        eprintln!("error: --kill-ps-after: a MultiWorkerMirrored job has no parameter server");
        return BAD_CONFIG_EXIT_CODE;
    }
    flags.ps = super::WorkerCount::from(0);
    flags.peer_chief = true;
    super::launch_program(program, &flags, task_args, Vec::new())
}

/// A MultiWorkerMirrored task's settings from its environment: the cluster (`TF_CONFIG`),
/// certificates (`COHORT_CERTS`), replicas (`COHORT_REPLICAS`), the detection budget as the
/// transport's idle timeout and the probe timeout, the metrics address, and the
/// communication named by `communication_env` (NCCL on the GPU of the task's place in the
/// cluster). An error names the variable at fault.
pub fn multi_worker_config_from_env(
    communication_env: &str,
) -> Result<MultiWorkerConfig, TaskConfigError> {
    let tf_config = crate::cluster::TF_CONFIG_ENV;
    let cluster = ClusterConfig::from_env()
        .map_err(TaskConfigError::Cluster)?
        .ok_or(TaskConfigError::Unset {
            variable: tf_config,
        })?;
    // Every log line from here on names the task (its role, index and incarnation), as a
    // parameter-server role's do; the incarnation is the launcher's, else the clock's.
    let given = std::env::var(ConfigKey::INCARNATION.env)
        .ok()
        .and_then(|text| text.trim().parse().ok());
    super::logging::set_task(
        cluster.task.task_type.as_str(),
        cluster.task.index,
        crate::process::incarnation_number(given, std::time::SystemTime::now()),
    );
    tracing::info!(
        "{}: {}",
        cluster.task,
        crate::process::describe_compute_threads()
    );
    let certs_key = ConfigKey::CERTS_DIR.env;
    let certs = std::env::var_os(certs_key).ok_or(TaskConfigError::Unset {
        variable: certs_key,
    })?;
    let replicas = match std::env::var(ConfigKey::REPLICAS.env) {
        Ok(text) => crate::cluster::parse_count(
            &text,
            ConfigKey::REPLICAS.env,
            crate::cluster::REPLICAS_LIMIT,
        )
        .map_err(|e| TaskConfigError::Replicas(Box::new(e)))? as usize,
        Err(_) => 1,
    };
    let budget = match std::env::var(ConfigKey::DETECTION_BUDGET.env) {
        Ok(text) => {
            let range = ConfigKey::DETECTION_BUDGET.duration_range().ok_or(
                TaskConfigError::NoBudgetRange {
                    variable: ConfigKey::DETECTION_BUDGET.env,
                },
            )?;
            parse_duration_in(ConfigKey::DETECTION_BUDGET.env, &text, range)
                .map_err(TaskConfigError::DetectionBudget)?
        }
        Err(_) => Duration::from_secs(3),
    };
    let communication = match std::env::var(communication_env) {
        Ok(text) => match text.parse::<Communication>().map_err(|detail| {
            TaskConfigError::Communication {
                variable: communication_env.to_owned(),
                detail,
            }
        })? {
            // A device named (`nccl:N`) is taken as given.
            explicit @ Communication::Nccl { .. } if text.trim() != "nccl" => explicit,
            // Plain `nccl` on a machine of several tasks: one GPU per task, by its place.
            Communication::Nccl { .. } => {
                let chiefs = cluster.cluster.num_tasks(TaskType::Chief);
                let place = match cluster.task.task_type {
                    TaskType::Chief => 0,
                    _ => chiefs + cluster.task.index as usize,
                };
                Communication::Nccl { device: place }
            }
            Communication::Ring => Communication::Ring,
        },
        Err(_) => Communication::Ring,
    };
    let mut config = MultiWorkerConfig::new(cluster, certs).with_local_replicas(replicas);
    config.communication = communication;
    config.metrics_addr =
        crate::strategy::metrics_addr_from_env().map_err(TaskConfigError::MetricsAddr)?;
    config.transport.idle_timeout = budget;
    config.transport.keep_alive_interval = budget / 4;
    config.probe_timeout = budget;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message names its variable once: a `TF_CONFIG` error the parser spelled under the
    /// variable as it is, one of the cluster's own checks with the variable in front.
    #[test]
    fn a_task_config_error_names_its_variable_once() {
        let cluster = |json: &str| {
            let error = ClusterConfig::from_tf_config(json).unwrap_err();
            TaskConfigError::Cluster(error).to_string()
        };
        assert!(cluster("{").starts_with("TF_CONFIG: malformed: "));
        assert_eq!(
            cluster(r#"{"cluster": {"worker": ["a:1"]}}"#),
            "TF_CONFIG.task: missing"
        );
        assert_eq!(
            cluster(r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}"#),
            "TF_CONFIG.task.index: expected a non-negative integer"
        );
        let missing =
            cluster(r#"{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}"#);
        assert!(missing.starts_with("TF_CONFIG: task: "), "{missing}");
        let shared =
            cluster(r#"{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker"}}"#);
        assert!(
            shared.starts_with("TF_CONFIG: cluster.worker[0] and "),
            "{shared}"
        );
        assert_eq!(
            TaskConfigError::Unset {
                variable: "COHORT_CERTS"
            }
            .to_string(),
            "COHORT_CERTS: unset"
        );
        let replicas = crate::cluster::parse_count("0", "COHORT_REPLICAS", 256).unwrap_err();
        assert_eq!(
            TaskConfigError::Replicas(Box::new(replicas)).to_string(),
            "\"0\" is not a number of COHORT_REPLICAS (a whole number from 1 to 256)"
        );
        let communication = TaskConfigError::Communication {
            variable: COMMUNICATION_ENV.into(),
            detail: CommunicationError::Unknown {
                text: "gloo".into(),
            },
        };
        assert_eq!(
            communication.to_string(),
            "COHORT_COMMUNICATION: \"gloo\": expected \"ring\", \"nccl\" or \"nccl:GPU\""
        );
    }
}
