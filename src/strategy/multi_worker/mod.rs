//! MultiWorkerMirrored: synchronous data parallelism across worker processes, each running
//! several local replicas, variables mirrored on every replica of every worker.
//!
//! This module owns the strategy value ([`MultiWorkerMirrored`]), its configuration
//! ([`MultiWorkerConfig`]), the placement of its variables, re-forming after a lost worker
//! ([`MultiWorkerMirrored::recover`], whose decisions, the quorum rule among them, are
//! `collective::reforming`'s, which the membership simulator's member machine takes alike), and the group's changes at a step boundary
//! ([`MultiWorkerMirrored::at_step_boundary`]: workers admitted after they asked to join,
//! workers leaving after a preemption notice once the chief saved). The collectives it rests on live
//! in [`crate::collective`]: a process group over QUIC between the workers (formed here at
//! generation 1), and the local group of each step's replicas spanning it
//! ([`crate::collective::ProcessSpan`]), whose sums go over the group's ring or, with
//! [`Communication::Nccl`], over NCCL on a GPU of each worker.
//!
//! The files of this folder, one concern each:
//! - `mod.rs` (here): the strategy value: making it (forming or joining the group of every
//!   worker and starting the local replicas), its accessors, the [`Strategy`] calls across the
//!   workers, and stopping it;
//! - `config`: its configuration ([`MultiWorkerConfig`], [`Communication`], the defaults), and
//!   the check that every worker of a group chose the same settings;
//! - `elastic`: the group's changes: re-forming after a lost worker, admissions and departures
//!   at a step boundary, agreeing on the training state, the status page's record of each
//!   change, and what they report ([`ElasticState`], [`Recovery`], [`GroupChange`], ...);
//! - `quorum`: what a survivor without quorum says;
//! - `placement`: where the variables live (mirrored on the local replicas, starting from the
//!   first worker's initial value, the same model on every worker).
//!
//! The metrics endpoint and status page a worker serves are [`crate::metrics`]'s
//! (`metrics::group_status`), given plain values from here.

use std::any::Any;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use cohort_transport::{NodeCredentials, NodeId};

use super::replicas::{ReplicaFn, Replicas};
use super::{
    divide_by, parse_replica_devices, reduce_per_replica, DeviceSpec, PerReplica, ReduceOp,
    Strategy, StrategyError, StrategyId,
};
use crate::cluster::{node_id, ClusterConfig, StrategyKind, TaskId, TaskType};
use crate::collective::entry::{self, AfterFailedStart, EnterAfter, EntryStep};
use crate::collective::{
    CollectiveError, Entry, GroupMember, Mesh, NcclWaits, ProcessGroup, ProcessSpan,
};
use crate::status::TaskState;
use crate::variable::{MirroredPlacement, VariablePlacement};

mod config;
mod elastic;
mod placement;
mod quorum;
mod report;
mod vote;

pub(crate) use self::config::metrics_addr_from_env;
pub use self::config::{
    Communication, CommunicationError, MultiWorkerConfig, DEFAULT_BUCKET_BYTES_MAX,
    DEFAULT_ENTER_TIMEOUT, DEFAULT_JOIN_TIMEOUT, DEFAULT_PROBE_TIMEOUT, DEFAULT_RECOVER_ATTEMPTS,
};
pub use self::elastic::{
    Admission, Departure, ElasticState, EpochProgress, GroupChange, Leave, Recovery, SaveStateError,
};
pub(crate) use self::vote::Ballot;
pub use self::vote::{CastVote, CountedVote};

use self::config::check_same_settings;
use self::elastic::unless_mendable;
use self::placement::MultiWorkerPlacement;

/// TensorFlow's `MultiWorkerMirroredStrategy`: every worker runs the same program; each runs
/// `N` local replicas on threads (as [`Mirrored`](super::Mirrored) does), and the replicas of
/// every worker are in sync (`num_replicas_in_sync` = workers × `N`).
///
/// - Making it forms the process group of every worker at generation 1 over QUIC (mutual TLS with
///   the certificates of `certs_dir`), bounded by the group's form timeout: every worker must
///   make its strategy. Workers are ranked chief first, then workers by index (TensorFlow's
///   order); a worker's replicas have the ids `rank × N .. rank × N + N`.
/// - Variables created in [`Strategy::scope`] are mirrored on the local replicas, and start
///   identical on every worker: right after its creation, each variable takes the first
///   worker's (the chief's) initial value, broadcast to every worker. Every worker must create
///   the same variables in the same order (as in TensorFlow). A worker lost before that
///   broadcast completes leaves the variable its own initial value and the group broken: the
///   next call fails with the loss, and [`MultiWorkerMirrored::recover`] makes every
///   survivor's state one survivor's (so does a loss while comparing settings, right after
///   forming: making the strategy does not fail for it).
/// - `ctx.all_reduce(op, t)` inside [`run`](super::StrategyExt::run) sums the local replicas'
///   values in process, then across the workers with one group call, and gives every replica
///   the result, bit-identical on every worker;
///   [`ReplicaContext::all_reduce_many`](super::ReplicaContext::all_reduce_many) reduces a
///   list in buckets. Variable aggregation and the optimizers' gradient sums go the same way.
/// - [`Strategy::reduce`] reduces across every worker's replicas; `gather` concatenates them.
/// - `experimental_distribute_dataset` auto-shards across workers (one input pipeline per
///   worker, the worker's rank as its id) and rebatches each global batch into per-replica
///   batches; `distribute_datasets_from_function` gets an `InputContext` with one pipeline per
///   worker.
///
/// Failures: when a worker is lost (its process dies, or it goes silent past the transport's
/// idle timeout), every survivor's pending collective fails with
/// [`CollectiveError::MemberLost`] naming it, and `run` fails with
/// [`StrategyError::Collective`] (this step and every later one, until
/// [`MultiWorkerMirrored::recover`] re-forms the group with the survivors, if they are a
/// quorum of it, and makes their
/// training state identical: elastic training). A replica whose step fails in the
/// application (it panics, or returns an error under
/// [`StrategyExt::try_run`](super::StrategyExt::try_run)) aborts the group: every other
/// worker's `run` fails at once with [`CollectiveError::Application`] naming the worker and
/// the error's message, and that worker gets its own error.
#[derive(Debug)]
pub struct MultiWorkerMirrored {
    id: StrategyId,
    replicas: Replicas,
    span: ProcessSpan,
    task: TaskId,
    local_replicas: usize,
    bucket_bytes_max: usize,
    probe_timeout: Duration,
    recover_attempts: usize,
    /// What sums across the workers, and the bounds of NCCL's calls; each re-formed group's
    /// span gets them too.
    communication: (Communication, NcclWaits),
    /// Keeps this worker's collective endpoint accepting while the strategy lives.
    _mesh: Mesh,
    /// Whether this worker joined a live group and has not received its training state yet
    /// ([`MultiWorkerMirrored::at_step_boundary`]); its variables skip the first worker's
    /// broadcast meanwhile (the members are past it).
    awaiting_state: Arc<AtomicBool>,
    /// When this worker last reached a step boundary ([`MultiWorkerMirrored::at_step_boundary`]):
    /// its metrics' step time.
    last_boundary: Option<std::time::Instant>,
    /// The status page's view of the cluster: every chief and worker task (node, address, in
    /// rank order) and what this worker makes of each.
    status_tasks: Vec<(NodeId, String)>,
    task_states: std::collections::BTreeMap<NodeId, TaskState>,
    /// Whether the status page's membership changes hold one yet (the first generation is noted
    /// at the first step boundary, which knows its step).
    change_noted: bool,
    /// This worker's run report for `cohort chaos run` (`report`).
    report: report::GroupReport,
    runtime: Option<tokio::runtime::Runtime>,
}

impl MultiWorkerMirrored {
    /// Forms the group of every worker of `config.cluster` and starts this process's replicas
    /// (see the type's doc). Fails with [`StrategyError::Config`] naming the key of a bad
    /// cluster, task, certificate directory or replica count, and with
    /// [`StrategyError::Collective`] when the group cannot be formed in time.
    pub fn new(config: MultiWorkerConfig) -> Result<Self, StrategyError> {
        let task = check_config(&config)?;
        if let Some(addr) = config.metrics_addr {
            serve_metrics(addr, task).map_err(|e| bad("metrics_addr", e.to_string()))?;
        }
        let (members, own_addr) = cluster_members(&config.cluster, task)?;
        let me = node_id(task);
        let peers: Vec<GroupMember> = members.iter().filter(|m| m.node != me).cloned().collect();
        let creds = NodeCredentials::load(&config.certs_dir, &me)
            .map_err(|e| bad("certs_dir", format!("{}: {e}", config.certs_dir.display())))?;
        let names: Vec<String> = (0..config.local_replicas)
            .map(|i| format!("cpu:{i}"))
            .collect();
        let devices = parse_replica_devices(&names)?;
        let runtime = collective_runtime()?;
        let formed = form_or_join(&runtime, &config, own_addr, creds, members, peers);
        let (mesh, group) = match formed {
            Ok(formed) => formed,
            Err(err) => {
                runtime.shutdown_background();
                return Err(err.into());
            }
        };
        crate::metrics::record_group(group.generation(), group.size());
        let communication = communication_of(&config);
        let span = span_of(
            group,
            &runtime,
            config.local_replicas,
            config.bucket_bytes_max,
            communication,
        );
        // Joined a live group (formed at a generation above 1): its state comes with `admit`.
        let awaiting_state = Arc::new(AtomicBool::new(span.group().generation() > 1));
        let (id, replicas) = match start_replicas(&config, &span, devices) {
            Ok(made) => made,
            Err(err) => {
                shut_down(runtime, span.group());
                return Err(err);
            }
        };
        let status_tasks = status_tasks(&config.cluster);
        let group = span.group();
        let report = report::GroupReport::start(task.to_string(), group.generation(), group.size());
        let strategy = Self {
            id,
            replicas,
            span,
            task,
            local_replicas: config.local_replicas,
            bucket_bytes_max: config.bucket_bytes_max,
            probe_timeout: config.probe_timeout,
            recover_attempts: config.recover_attempts.max(1),
            communication,
            _mesh: mesh,
            awaiting_state,
            last_boundary: None,
            status_tasks,
            task_states: std::collections::BTreeMap::new(),
            change_noted: false,
            report,
            runtime: Some(runtime),
        };
        strategy.publish_status();
        Ok(strategy)
    }

    /// Reads the cluster from `TF_CONFIG` and makes the strategy with `local_replicas`
    /// replicas here and the other settings' defaults.
    pub fn from_env(
        certs_dir: impl Into<PathBuf>,
        local_replicas: usize,
    ) -> Result<Self, StrategyError> {
        let cluster = ClusterConfig::from_env()
            .map_err(|e| StrategyError::Config {
                key: crate::cluster::TF_CONFIG_ENV.into(),
                detail: e.to_string(),
            })?
            .ok_or_else(|| StrategyError::Config {
                key: crate::cluster::TF_CONFIG_ENV.into(),
                detail: "unset: MultiWorkerMirrored needs the cluster".into(),
            })?;
        let mut config =
            MultiWorkerConfig::new(cluster, certs_dir).with_local_replicas(local_replicas);
        config.metrics_addr = metrics_addr_from_env()?;
        Self::new(config)
    }

    /// This process's task.
    pub fn task(&self) -> TaskId {
        self.task
    }

    /// What sums this worker's tensors across the workers.
    pub fn communication(&self) -> Communication {
        self.communication.0
    }

    /// This worker's rank among the workers (the chief, if any, is 0): its input pipeline id.
    pub fn worker_index(&self) -> usize {
        self.span.group().rank()
    }

    /// Number of workers (the chief included).
    pub fn num_workers(&self) -> usize {
        self.span.group().size()
    }

    /// Whether this worker is the first (the chief, or worker 0 without one): the one that
    /// writes checkpoints and summaries.
    pub fn is_chief(&self) -> bool {
        self.worker_index() == 0
    }

    /// Writes this worker's final `model` into its run report, once training ended here
    /// (`FinalModel::of_variables` of its variables at the last step): `cohort chaos run`
    /// checks that every member reports the same model (DATA-1), and reads the group's
    /// generations from the chief's, which this strategy recorded as they changed. Keras'
    /// `fit` calls it; a custom training loop calls it at its end. Nothing is written where no
    /// report is asked for, or where this worker left the group at a step boundary.
    pub fn report_final_model(&mut self, model: crate::run_report::FinalModel) {
        let chief = self.is_chief();
        self.report.final_model(model, chief);
    }

    /// The process group of the workers (its generation, members, and the error that broke it).
    pub fn process_group(&self) -> &ProcessGroup {
        self.span.group()
    }

    /// Refuses `method` on a worker that joined a live group and has not received its state.
    fn joined_without_state(&self, method: &'static str) -> Result<(), StrategyError> {
        if self.awaiting_state.load(Ordering::SeqCst) {
            return Err(StrategyError::NotAvailable {
                strategy: "MultiWorkerMirroredStrategy",
                method,
                side: "worker",
                reason: "this worker joined a live group and holds none of its training state \
                         yet: call `at_step_boundary` with the state first"
                    .into(),
            });
        }
        Ok(())
    }

    /// Records the group as this worker sees it now, for its status page.
    fn publish_status(&self) {
        let group = self.span.group();
        crate::metrics::publish_group_status(
            group.generation(),
            group.size(),
            group.members(),
            &self.status_tasks,
            &self.task_states,
            self.local_replicas,
            self.communication.0.to_string(),
        );
    }

    /// Runs `call` on the collective runtime and waits for it here.
    fn block<T: Send + 'static>(
        &self,
        call: impl std::future::Future<Output = Result<T, CollectiveError>> + Send + 'static,
    ) -> Result<T, CollectiveError> {
        match &self.runtime {
            Some(runtime) => block_on(runtime, call),
            None => Err(CollectiveError::Stopped {
                generation: self.span.group().generation(),
            }),
        }
    }

    fn broken(&self) -> Result<(), StrategyError> {
        match self.span.group().broken() {
            Some(err) => Err(StrategyError::Collective(err)),
            None => Ok(()),
        }
    }

    fn check_local(&self, value: &PerReplica<Tensor>) -> Result<(), StrategyError> {
        let expected = self.replicas.devices().len();
        if value.num_replicas() != expected {
            return Err(StrategyError::ReplicaCountMismatch {
                expected,
                got: value.num_replicas(),
            });
        }
        Ok(())
    }
}

impl Drop for MultiWorkerMirrored {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            shut_down(runtime, self.span.group());
        }
    }
}

/// Stops the collective runtime once this worker's last messages were taken: they may still
/// be on their way to a worker finishing its last call (bounded by [`FLUSH_MAX`]). Never
/// blocks longer (a strategy may be dropped inside another runtime); a replica still waiting
/// on a group call gets `CollectiveError::Stopped`.
fn shut_down(runtime: tokio::runtime::Runtime, group: &ProcessGroup) {
    let group = group.clone();
    let _ = block_on(&runtime, async move {
        group.flush(FLUSH_MAX).await;
        Ok(())
    });
    runtime.shutdown_background();
}

/// Bound on waiting, when the strategy is dropped, for this worker's last messages to be taken.
const FLUSH_MAX: Duration = Duration::from_secs(5);
/// A configuration error naming `key`.
fn bad(key: &str, detail: String) -> StrategyError {
    StrategyError::Config {
        key: key.to_string(),
        detail,
    }
}

/// Refuses what this strategy cannot run, before anything starts: a cluster with parameter
/// servers, a task that is neither a worker nor the chief, no local replica, or a
/// communication this process cannot use. Returns this process's task. Evaluator tasks in the
/// cluster are no members of the group (as in TensorFlow: a sidecar evaluator reads the
/// chief's checkpoints and trains nothing).
fn check_config(config: &MultiWorkerConfig) -> Result<TaskId, StrategyError> {
    let cluster = &config.cluster;
    cluster
        .cluster
        .require(StrategyKind::MultiWorkerMirrored)
        .map_err(|e| bad("cluster", e.to_string()))?;
    let servers = cluster.cluster.num_tasks(TaskType::Ps);
    if servers > 0 {
        return Err(bad(
            "cluster.ps",
            format!(
                "MultiWorkerMirrored takes workers, an optional chief and evaluators, not \
                 {servers} ps task(s) (its workers all-reduce their gradients)"
            ),
        ));
    }
    let task = cluster.task;
    if !matches!(task.task_type, TaskType::Chief | TaskType::Worker) {
        return Err(bad(
            "task.type",
            format!("{} is not a worker or the chief", task.task_type),
        ));
    }
    if config.local_replicas == 0 {
        return Err(bad(
            "local_replicas",
            "at least one replica per worker".into(),
        ));
    }
    // Before forming: a worker that cannot use its communication never joins the group.
    config
        .communication
        .check()
        .map_err(|e| bad("communication", e.to_string()))?;
    Ok(task)
}

/// Serves this worker's metrics and status page ([`crate::metrics::serve_group`]) on `addr`
/// for the rest of the process, as `task` of its launcher's incarnation; why not, if it
/// cannot.
fn serve_metrics(addr: SocketAddr, task: TaskId) -> Result<(), crate::metrics::GroupEndpointError> {
    use crate::metrics::Role;
    let role = match task.task_type {
        TaskType::Chief => Role::Chief,
        _ => Role::Worker,
    };
    // The launcher's incarnation epoch for this task, as a role process reads it.
    let given = std::env::var(crate::cluster::ConfigKey::INCARNATION.env)
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let incarnation = crate::process::incarnation_number(given, std::time::SystemTime::now());
    let server =
        crate::metrics::serve_group(addr, role, task.index, incarnation, &task.to_string())?;
    tracing::info!(
        "{task}: metrics on http://{}/metrics (health: /healthz, status: /status)",
        server.addr
    );
    Ok(())
}

/// Every chief and worker of `cluster` as a member of the group, in rank order, and the
/// address `task` listens on.
fn cluster_members(
    cluster: &ClusterConfig,
    task: TaskId,
) -> Result<(Vec<GroupMember>, SocketAddr), StrategyError> {
    // Chief first, then workers: the group's ranks (sorted node ids) in TensorFlow's order.
    let mut members = Vec::new();
    let mut own_addr = None;
    for job in [TaskType::Chief, TaskType::Worker] {
        for (i, text) in cluster.cluster.addresses(job).iter().enumerate() {
            let key = format!("cluster.{job}[{i}]");
            let addr = resolve(text).map_err(|e| bad(&key, e.to_string()))?;
            let member = TaskId::new(job, i as u32);
            if member == task {
                own_addr = Some(addr);
            }
            members.push(GroupMember {
                node: node_id(member),
                addr,
            });
        }
    }
    let own_addr = own_addr.ok_or_else(|| bad("task", format!("{task} is not in the cluster")))?;
    Ok((members, own_addr))
}

/// Why a member's address (`host:port`) gives no socket address.
#[derive(Debug, thiserror::Error)]
enum AddrError {
    /// The name does not resolve.
    #[error("{text:?} does not resolve: {source}")]
    DoesNotResolve {
        text: String,
        source: std::io::Error,
    },
    /// It resolves to no address.
    #[error("{text:?} resolves to no address")]
    NoAddress { text: String },
}

/// The first address `text` (`host:port`) resolves to.
fn resolve(text: &str) -> Result<SocketAddr, AddrError> {
    text.to_socket_addrs()
        .map_err(|source| AddrError::DoesNotResolve {
            text: text.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| AddrError::NoAddress {
            text: text.to_string(),
        })
}

/// Starts the runtime of this worker's collectives (two threads).
fn collective_runtime() -> Result<tokio::runtime::Runtime, StrategyError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cohort-mwms")
        .enable_all()
        .build()
        .map_err(|e| {
            bad(
                "runtime",
                format!("cannot start the collective runtime: {e}"),
            )
        })
}

/// Makes this worker's collective endpoint on `runtime` (listening on `own_addr` with
/// `creds`) and with it enters the group of `members` (`peers`: the others, see
/// [`enter_group`]). Fails with the collective error when it cannot, in time.
fn form_or_join(
    runtime: &tokio::runtime::Runtime,
    config: &MultiWorkerConfig,
    own_addr: SocketAddr,
    creds: NodeCredentials,
    members: Vec<GroupMember>,
    peers: Vec<GroupMember>,
) -> Result<(Mesh, ProcessGroup), CollectiveError> {
    let (transport, group_config) = (config.transport.clone(), config.group.clone());
    let (enter_timeout, join_timeout) = (config.enter_timeout, config.join_timeout);
    let certs_dir = config.certs_dir.clone();
    block_on(runtime, async move {
        // Under network fault rules (COHORT_NET_FAULTS) as every role's endpoint is.
        let endpoint =
            cohort_chaos::rules::bind_endpoint(own_addr, creds, transport).map_err(|e| {
                CollectiveError::Form {
                    generation: 1,
                    reason: format!("cannot listen on {own_addr}: {e}"),
                }
            })?;
        // Certificates rotated in the directory serve the handshakes that follow.
        cohort_transport::reload::watch_credentials(
            &endpoint,
            certs_dir,
            cohort_transport::reload::RELOAD_EVERY,
        );
        let mesh = Mesh::new(endpoint, group_config);
        let group =
            enter_group(&mesh, own_addr, peers, members, enter_timeout, join_timeout).await?;
        Ok((mesh, group))
    })
}

/// Enters the group of `members` through `mesh` (this worker's endpoint, on `own_addr`):
/// forms the first generation with the others (`peers`) where they start too, or joins the
/// group they formed already, as their answers within `enter_timeout` say; `join_timeout`
/// bounds the wait to be admitted. Each step is the one the member machine takes (the
/// decisions of [`entry`], which the membership simulator drives); this function only carries
/// them out on the mesh.
async fn enter_group(
    mesh: &Mesh,
    own_addr: SocketAddr,
    peers: Vec<GroupMember>,
    members: Vec<GroupMember>,
    enter_timeout: Duration,
    join_timeout: Duration,
) -> Result<ProcessGroup, CollectiveError> {
    let mut after = EnterAfter::First;
    let mut last_err = None;
    // Each try ends in a group, or in a step that waits (the others' answers, forming, an
    // admission); the table cycles only through such waits, and this bounds it anyway.
    for _ in 0..ENTRY_STEPS_MAX {
        let live = mesh.enter(own_addr, &peers, enter_timeout).await == Entry::Join;
        match after.next(live, std::time::Instant::now(), join_timeout) {
            EntryStep::Exit => break,
            EntryStep::Join => {
                tracing::info!("the others formed a group: joining it");
                match mesh.join_live(own_addr, &peers, join_timeout).await {
                    Ok(group) => return Ok(group),
                    Err(err) => {
                        // A process whose only forming was a first generation that failed is
                        // no member of any group: it starts again as one that never formed.
                        let never_formed = mesh.generation() == 0 || mesh.forget_failed_start();
                        match entry::after_not_admitted(never_formed) {
                            Some(next) => {
                                tracing::info!(%err, "not admitted: asking again whether a group lives, else forming the first generation with the others");
                                after = next;
                            }
                            None => return Err(err),
                        }
                        last_err = Some(err);
                    }
                }
            }
            EntryStep::FreshStart { until } => match mesh.form(1, members.clone()).await {
                Ok(group) => return Ok(group),
                Err(err) => {
                    let now = std::time::Instant::now();
                    let forget = || mesh.forget_failed_start();
                    match entry::after_failed_start(now, until, forget) {
                        AfterFailedStart::RetryAt { at, until } => {
                            tracing::info!(%err, "forming the first generation failed: asking again whether a group lives, else forming it again");
                            tokio::time::sleep(at.saturating_duration_since(now)).await;
                            after = EnterAfter::StartAgain { until };
                        }
                        AfterFailedStart::AskAgain => {
                            tracing::info!(%err, "forming the first generation failed: joining the others if they formed a group");
                            after = EnterAfter::FailedStart;
                        }
                    }
                    last_err = Some(err);
                }
            },
        }
    }
    Err(last_err.unwrap_or_else(|| CollectiveError::Form {
        generation: 1,
        reason: "no group to join, and none could be started".into(),
    }))
}

/// Steps of entering the job before a process gives up (its supervisor restarts it): every
/// step waits (for the others' answers, a forming or an admission), so this is only reached
/// by a process that cycles between joining and starting for minutes.
const ENTRY_STEPS_MAX: usize = 64;

/// What sums across the workers, with the bounds of NCCL's calls (each re-formed group's
/// span gets them too).
fn communication_of(config: &MultiWorkerConfig) -> (Communication, NcclWaits) {
    (
        config.communication,
        NcclWaits {
            timeout: config.group.op_timeout,
            // A lost member is detected within the idle timeout, after NCCL may have seen it.
            settle: config.transport.idle_timeout + Duration::from_millis(500),
            probe: config.probe_timeout,
        },
    )
}

/// Checks that every worker of `span`'s group runs the same settings, then starts this
/// process's replicas on `devices`, spanning the group.
fn start_replicas(
    config: &MultiWorkerConfig,
    span: &ProcessSpan,
    devices: Vec<DeviceSpec>,
) -> Result<(StrategyId, Replicas), StrategyError> {
    // A worker lost right after forming breaks the group here: the training loop's
    // first call fails with that loss and `recover` re-forms, then checks again.
    unless_mendable(
        check_same_settings(
            span,
            config.local_replicas,
            config.bucket_bytes_max,
            config.communication,
        ),
        span.group(),
    )?;
    let id = StrategyId::next();
    let mut replicas = Replicas::threaded(devices, id, config.collective_timeout)?;
    replicas.set_span(span.clone());
    Ok((id, replicas))
}

/// The status page's view of `cluster`: every chief and worker task (node, address), in rank
/// order.
fn status_tasks(cluster: &ClusterConfig) -> Vec<(NodeId, String)> {
    [TaskType::Chief, TaskType::Worker]
        .into_iter()
        .flat_map(|job| {
            cluster
                .cluster
                .addresses(job)
                .iter()
                .enumerate()
                .map(move |(i, addr)| (node_id(TaskId::new(job, i as u32)), addr.clone()))
        })
        .collect()
}

/// The span of `group`'s generation, summing with `communication` (NCCL: within its waits, a new
/// communicator for the generation).
fn span_of(
    group: ProcessGroup,
    runtime: &tokio::runtime::Runtime,
    local_replicas: usize,
    bucket_bytes_max: usize,
    (communication, _waits): (Communication, NcclWaits),
) -> ProcessSpan {
    let span = ProcessSpan::new(
        group,
        runtime.handle().clone(),
        local_replicas,
        bucket_bytes_max,
    );
    match communication {
        Communication::Ring => span,
        // `Communication::check` refused it before the group formed.
        #[cfg(not(feature = "nccl"))]
        Communication::Nccl { .. } => span,
        #[cfg(feature = "nccl")]
        Communication::Nccl { device } => span.with_nccl(device, _waits),
    }
}

/// Runs `call` on `runtime` and waits for it on this thread (which may itself be inside
/// another runtime).
fn block_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    call: impl std::future::Future<Output = Result<T, CollectiveError>> + Send + 'static,
) -> Result<T, CollectiveError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(call.await);
    });
    rx.recv()
        .unwrap_or(Err(CollectiveError::Stopped { generation: 1 }))
}

impl Strategy for MultiWorkerMirrored {
    fn name(&self) -> &'static str {
        "MultiWorkerMirroredStrategy"
    }

    fn id(&self) -> StrategyId {
        self.id
    }

    fn num_replicas_in_sync(&self) -> usize {
        self.span.total_replicas()
    }

    fn local_replicas(&self) -> Range<usize> {
        let first = self.span.first_replica();
        first..first + self.replicas.devices().len()
    }

    fn replica_devices(&self) -> Vec<DeviceSpec> {
        self.replicas.devices().to_vec()
    }

    fn variable_placement(&self) -> Arc<dyn VariablePlacement> {
        Arc::new(MultiWorkerPlacement {
            local: MirroredPlacement {
                strategy: self.id,
                devices: self.replicas.devices().to_vec(),
            },
            span: self.span.clone(),
            awaiting_state: self.awaiting_state.clone(),
        })
    }

    /// Runs the step on the local replicas. Fails with the group's error when the workers'
    /// group is broken, before the step or by it, even if the replica function swallowed the
    /// error of its collective.
    fn run_replicas(&self, f: ReplicaFn) -> Result<Vec<Box<dyn Any + Send>>, StrategyError> {
        self.joined_without_state("run")?;
        self.broken()?;
        let out = self.replicas.run(f);
        if let Err(own @ StrategyError::ReplicaPanicked { .. }) = out {
            // This worker's own failure (it aborted the group with it): its error, not the
            // group's report of it.
            return Err(own);
        }
        self.broken()?;
        out
    }

    /// Reduces across every replica of every worker: `Sum` adds them all; `Mean` divides by
    /// the replicas in sync (without `axis`) or by the elements along `axis` of every worker
    /// (partial batches count what they hold). The result is the same on every worker.
    fn reduce(
        &self,
        op: ReduceOp,
        value: &PerReplica<Tensor>,
        axis: Option<usize>,
    ) -> Result<Tensor, StrategyError> {
        self.joined_without_state("reduce")?;
        self.check_local(value)?;
        let local = reduce_per_replica(ReduceOp::Sum, value, axis)?;
        let count = match axis {
            None => self.replicas.devices().len(),
            Some(axis) => value.values().iter().map(|t| t.dims()[axis]).sum(),
        };
        let count = Tensor::new(&[count as f64], &Device::Cpu)?;
        let summed = self.span.sum_many(&[local, count])?;
        match op {
            ReduceOp::Sum => Ok(summed[0].clone()),
            ReduceOp::Mean => {
                let count = summed[1].to_vec1::<f64>()?[0];
                Ok(divide_by(&summed[0], count)?)
            }
        }
    }

    /// Concatenates every replica's tensor of every worker along `axis`, in replica order;
    /// workers may hold different lengths along `axis` (partial batches).
    fn gather(&self, value: &PerReplica<Tensor>, axis: usize) -> Result<Tensor, StrategyError> {
        self.joined_without_state("gather")?;
        self.check_local(value)?;
        let local = super::gather_per_replica(value, axis)?;
        // Along the first dimension, padded to the longest worker's length.
        let front = local.transpose(0, axis)?.contiguous()?;
        let len = front.dims()[0];
        let lens = self
            .span
            .all_gather(&Tensor::new(&[len as i64], &Device::Cpu)?)?
            .to_vec1::<i64>()?;
        let longest = lens.iter().copied().max().unwrap_or(0) as usize;
        let padded = if longest > len {
            let mut pad_dims = front.dims().to_vec();
            pad_dims[0] = longest - len;
            let pad = Tensor::zeros(pad_dims, front.dtype(), front.device())?;
            Tensor::cat(&[&front, &pad], 0)?
        } else {
            front
        };
        let all = self.span.all_gather(&padded)?;
        let parts = lens
            .iter()
            .enumerate()
            .map(|(w, &l)| all.narrow(0, w * longest, l as usize))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?.transpose(0, axis)?.contiguous()?)
    }

    fn input_pipelines(&self) -> usize {
        self.num_workers()
    }

    fn input_pipeline_id(&self) -> usize {
        self.worker_index()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;

    fn config(cluster: &str, task: &str) -> MultiWorkerConfig {
        let json = format!(r#"{{"cluster": {cluster}, "task": {{"type": "{task}", "index": 0}}}}"#);
        MultiWorkerConfig::new(ClusterConfig::from_tf_config(&json).unwrap(), "/nowhere")
    }

    #[test]
    fn evaluators_beside_the_workers_are_no_members_and_servers_are_refused() {
        let with_evaluator = r#"{"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]}"#;
        assert_eq!(
            check_config(&config(with_evaluator, "worker")).unwrap(),
            TaskId::new(TaskType::Worker, 0)
        );
        // The evaluator itself runs no MultiWorkerMirrored.
        let err = check_config(&config(with_evaluator, "evaluator")).unwrap_err();
        assert!(err.to_string().contains("task.type"), "{err}");
        let with_servers = r#"{"worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:4"]}"#;
        let err = check_config(&config(with_servers, "worker")).unwrap_err();
        assert!(err.to_string().contains("cluster.ps"), "{err}");
        // The group's members are the chief and the workers only.
        let worker = config(with_evaluator, "worker");
        let (members, own) = cluster_members(&worker.cluster, worker.cluster.task).unwrap();
        let nodes: Vec<String> = members.iter().map(|m| m.node.to_string()).collect();
        assert_eq!(nodes, ["chief/0", "worker/0"]);
        assert_eq!(own.port(), 2);
    }
}
