//! A MultiWorkerMirrored worker's endpoint: serving its metrics and status page
//! ([`serve_group`]), its group's generation and size in the metrics ([`record_group`]), the group
//! as the worker sees it on its status page ([`publish_group_status`], recorded in
//! [`crate::status`]), and the address to serve on from the environment ([`addr_from_env`]).
//!
//! The strategy calls these with plain values (its task's role, index and incarnation, its
//! group's generation, size and members): this module names no strategy, cluster or collective
//! type, so that `metrics` stays below them.

use std::collections::BTreeMap;
use std::net::{AddrParseError, SocketAddr};
use std::sync::Arc;

use cohort_transport::NodeId;

use super::{serve, Exposition, MetricsServer, Role, StatusFormat};
use crate::status::{GroupStatus, RateSampler, StatusReport, TaskState, TaskStatus};

/// Why a worker's metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GroupEndpointError {
    /// The listener could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Serve {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// The address variable does not parse.
    #[error(
        "{text:?} is not an address to serve metrics on (ip:port, e.g. 127.0.0.1:9100, or \
         port 0 for any free port): {source}"
    )]
    Addr {
        /// The variable's text.
        text: String,
        /// Why it does not parse.
        source: AddrParseError,
    },
    /// The address variable is not valid UTF-8.
    #[error("not valid UTF-8")]
    NotUnicode,
}

/// Serves a worker's metrics ([`Exposition::for_group`] of `role`, `index` and
/// `incarnation`) on `addr` for the rest of the process, with the status page of `task` (its
/// name, e.g. `worker/1`); why not, if it cannot.
pub(crate) fn serve_group(
    addr: SocketAddr,
    role: Role,
    index: u32,
    incarnation: u64,
    task: &str,
) -> Result<MetricsServer, GroupEndpointError> {
    // The status page: this worker's view of the group, the step and its rate, the loss and
    // the newest checkpoint the program recorded.
    let job = format!("MultiWorkerMirrored ({task})");
    let rate = Arc::new(std::sync::Mutex::new(RateSampler::default()));
    let status: crate::metrics::StatusSource = Arc::new(move |format| {
        let (job, rate) = (job.clone(), Arc::clone(&rate));
        Box::pin(async move {
            let m = crate::metrics::instruments();
            let step = u64::try_from(m.group_step.get()).unwrap_or(0);
            let (steps_per_second, step_seconds) = rate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .sample(std::time::Instant::now(), step, m.step_totals());
            let (group, tasks) = match crate::status::group_status() {
                Some((group, tasks)) => (Some(group), tasks),
                None => (None, Vec::new()),
            };
            let report = StatusReport {
                job,
                unix_ms: crate::status::unix_ms_now(),
                step,
                steps_per_second,
                step_seconds,
                ledger: None,
                tasks,
                checkpoint: crate::status::newest_checkpoint(None),
                loss: crate::status::loss_history(),
                group,
            };
            Some(match format {
                StatusFormat::Json => report.to_json(),
                StatusFormat::Html => crate::status::html(&report),
            })
        })
    });
    let exposition = Arc::new(Exposition::for_group(role, index, incarnation).with_status(status));
    serve(addr, exposition).map_err(|source| GroupEndpointError::Serve { addr, source })
}

/// The address to serve metrics on from the environment variable `key`
/// (`COHORT_METRICS_ADDR`, which `cohort launch` sets for every task), if set; why not, if
/// it does not parse.
pub(crate) fn addr_from_env(key: &str) -> Result<Option<SocketAddr>, GroupEndpointError> {
    match std::env::var(key) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|source| GroupEndpointError::Addr { text, source }),
        Err(std::env::VarError::NotUnicode(_)) => Err(GroupEndpointError::NotUnicode),
    }
}

/// The group's generation and size (`workers`), in this worker's metrics.
pub(crate) fn record_group(generation: u64, workers: usize) {
    let m = crate::metrics::instruments();
    m.group_generation
        .set(i64::try_from(generation).unwrap_or(i64::MAX));
    m.group_workers.set(workers as i64);
}

/// Records the group as a worker sees it now, for its status page: the group of `generation`
/// (`workers` of `replicas_per_worker` replicas, summing with `communication`) and each task
/// of `tasks` (every chief and worker, node and address, in rank order): up where it is one of
/// `members`, else as `states` has it (waiting where it has it up or not at all).
pub(crate) fn publish_group_status(
    generation: u64,
    workers: usize,
    members: &[NodeId],
    tasks: &[(NodeId, String)],
    states: &BTreeMap<NodeId, TaskState>,
    replicas_per_worker: usize,
    communication: String,
) {
    let tasks = tasks
        .iter()
        .map(|(node, address)| {
            let member = members.contains(node);
            let state = match states.get(node) {
                _ if member => TaskState::Alive,
                Some(TaskState::Alive) | None => TaskState::Waiting,
                Some(state) => *state,
            };
            TaskStatus {
                role: node.role.clone(),
                index: node.index,
                address: address.clone(),
                incarnation: None,
                state,
                heartbeat_age_ms: None,
            }
        })
        .collect();
    crate::status::record_group(
        GroupStatus {
            generation,
            workers,
            replicas_per_worker,
            communication,
            changes: Vec::new(),
        },
        tasks,
    );
}
