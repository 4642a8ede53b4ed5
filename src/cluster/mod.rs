//! Cluster specs and where a process learns its role: `TF_CONFIG`, `cohort.toml`, flags.
//!
//! This module owns the *description* of a cluster (which tasks exist, at which addresses) and
//! the resolution of "who am I" for a process. It parses and validates; it never opens a socket.
//! Precedence (DESIGN §7): flags > environment > `TF_CONFIG` > config file > defaults; the
//! caller passes each layer in, so the resolution itself ([`resolve_config`]) is pure and
//! testable. The keys and their three spellings are [`ConfigKey::ALL`].
//!
//! Every error names the key or field that is wrong, so that a bad config refuses to start with
//! a message a user can act on (exit code 2 in the binary).

mod config;
mod duration;
mod spec;
mod tf_config;

pub(crate) use config::count as parse_count;
pub use config::{
    load_files, load_role_config, ps_restart_wait_for, resolve_config, ConfigError, ConfigFiles,
    ConfigFlags, ConfigKey, CountError, Origin, RoleConfig, CERTS_DIR_MISSING, DEFAULT_CONFIG_FILE,
    DEFAULT_DETECTION_BUDGET, DEFAULT_EVAL_IDLE_TIMEOUT, DEFAULT_PREEMPTION_GRACE,
    DEFAULT_STEP_TIMEOUT, DEFAULT_WORKER_WAIT, REPLICAS_LIMIT, WORKERS_MAX_LIMIT,
};
pub use duration::{format_duration, parse_duration, parse_duration_in, DurationRange};
pub use spec::{node_id, ClusterSpec, StrategyKind, TaskId, TaskType};
pub use tf_config::{ClusterConfig, TF_CONFIG_ENV};

/// Why a cluster description was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ClusterError {
    /// The text is not valid JSON/TOML, or a field has the wrong type.
    #[error("{source_name}: malformed: {detail}")]
    Malformed {
        /// Where the text came from (`TF_CONFIG`, a file path).
        source_name: String,
        /// The parser's message, which names the position or field.
        detail: String,
    },
    /// A job name other than chief (or master), worker, ps, evaluator.
    #[error(
        "{key}: unknown task type {value:?} (expected one of chief, master, worker, ps, evaluator)"
    )]
    UnknownTaskType {
        /// The key holding the bad value.
        key: String,
        /// The value given.
        value: String,
    },
    /// An address that is not `host:port` with a valid port.
    #[error("{key}: {value:?} is not a host:port address")]
    BadAddress {
        /// The key holding the bad value, e.g. `cluster.worker[1]`.
        key: String,
        /// The value given.
        value: String,
    },
    /// The same address is given to two tasks.
    #[error("{first} and {second} share the address {address}")]
    DuplicateAddress {
        /// The first task with that address.
        first: String,
        /// The second task with that address.
        second: String,
        /// The shared address.
        address: String,
    },
    /// The task's index is outside its job's list.
    #[error("task: {task} does not exist in the cluster ({job} has {count} task(s))")]
    NoSuchTask {
        /// The task named by `task`.
        task: String,
        /// Its job name.
        job: String,
        /// How many tasks that job has.
        count: usize,
    },
    /// The cluster lacks a role the chosen strategy needs.
    #[error("cluster: {strategy} needs at least {needed} {job} task(s), the cluster has {count}")]
    MissingRole {
        /// The strategy that was asked for.
        strategy: String,
        /// The job that is missing or too small.
        job: String,
        /// How many are needed.
        needed: usize,
        /// How many there are.
        count: usize,
    },
    /// A required key is absent.
    #[error("{key}: missing")]
    MissingKey {
        /// The key that is absent.
        key: String,
    },
    /// A value outside what the key accepts.
    #[error("{key}: {detail}")]
    BadValue {
        /// The key holding the bad value.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
}

/// Largest configuration or cluster file read (config files are small; this bounds a path
/// that points at something else, such as `/dev/zero`).
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;

/// Reads a configuration file of at most [`CONFIG_FILE_BYTES_MAX`] bytes as UTF-8 text.
pub fn read_config_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(CONFIG_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > CONFIG_FILE_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {CONFIG_FILE_BYTES_MAX} bytes"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_path_to_an_endless_file_is_refused_not_read_whole() {
        let err = read_config_file(std::path::Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }
}
