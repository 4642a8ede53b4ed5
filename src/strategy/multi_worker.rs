//! MultiWorkerMirrored: synchronous data parallelism across worker processes, each running
//! several local replicas, variables mirrored on every replica of every worker.
//!
//! This module owns the strategy value ([`MultiWorkerMirrored`]), its configuration
//! ([`MultiWorkerConfig`]), the placement of its variables, re-forming after a lost worker
//! ([`MultiWorkerMirrored::recover`]) with its quorum rule (`has_quorum`: the one place that
//! decides which survivors may go on), and the group's changes at a step boundary
//! ([`MultiWorkerMirrored::at_step_boundary`]: workers admitted after they asked to join,
//! workers leaving after a preemption notice once the chief saved). The collectives it rests on live
//! in [`crate::collective`]: a process group over QUIC between the workers (formed here at
//! epoch 1), and the local group of each step's replicas spanning it
//! ([`crate::collective::ProcessSpan`]), whose sums go over the group's ring or, with
//! [`Communication::Nccl`], over NCCL on a GPU of each worker.

use std::any::Any;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use cohort_transport::{NodeCredentials, TransportConfig};

use super::replicas::{ReplicaFn, Replicas};
use super::{
    divide_by, parse_replica_devices, reduce_per_replica, DeviceSpec, PerReplica, ReduceOp,
    Strategy, StrategyError, StrategyId, DEFAULT_COLLECTIVE_TIMEOUT_MS,
};
use crate::cluster::{node_id, ClusterConfig, StrategyKind, TaskId, TaskType};
use crate::collective::{
    CollectiveError, Entry, GroupConfig, GroupMember, Mesh, NcclWaits, ProcessGroup, ProcessSpan,
};
use crate::optim::{OptimizerState, Slots};
use crate::status::{GroupStatus, TaskState, TaskStatus};
use crate::variable::{
    MirroredPlacement, Placement, Variable, VariableError, VariablePlacement, VariableRequest,
};
use cohort_transport::NodeId;

/// How a [`MultiWorkerMirrored`] is made: the cluster (workers and an optional chief, as
/// TensorFlow's `TF_CONFIG` gives them) and this process's part in it.
#[derive(Debug, Clone)]
pub struct MultiWorkerConfig {
    /// Every worker (and the chief, if any) with the UDP address its collective endpoint
    /// listens on, and this process's task among them.
    pub cluster: ClusterConfig,
    /// Directory with `ca.pem` and this task's certificate and key (`cohort certs` layout).
    pub certs_dir: PathBuf,
    /// Replicas in this process, on threads (`cpu:0..N`); every worker must run as many.
    pub local_replicas: usize,
    /// The process group's settings (ring chunking, operation and forming timeouts).
    pub group: GroupConfig,
    /// The transport's settings: its idle timeout is the detection budget of a lost worker.
    pub transport: TransportConfig,
    /// Most bytes of one bucket when a list of tensors is all-reduced across workers.
    pub bucket_bytes_max: usize,
    /// How long a collective round among this process's replicas waits for all of them.
    pub collective_timeout: Duration,
    /// Re-forming after a lost worker ([`MultiWorkerMirrored::recover`]): how long a survivor
    /// waits for each other member to answer its probe (a member that does not is left out).
    pub probe_timeout: Duration,
    /// Re-forming: attempts (probe, form, agree on the state) before giving up.
    pub recover_attempts: usize,
    /// Starting: how long this process waits for the other workers to say whether they formed
    /// a group already (then it joins it) before it takes the job to be starting (then it
    /// forms the first epoch with them).
    pub enter_timeout: Duration,
    /// Joining a live group: how long this process waits to be admitted (the members admit
    /// joiners at a step boundary, [`MultiWorkerMirrored::at_step_boundary`]).
    pub join_timeout: Duration,
    /// What all-reduces the gradients across the workers: the group's ring (the default) or
    /// NCCL on a GPU of this process.
    pub communication: Communication,
    /// Where to serve this worker's Prometheus metrics and `/healthz` (`metrics_addr`,
    /// `COHORT_METRICS_ADDR`; `None`: not served): its group's epoch, workers and step, the
    /// time between step boundaries, and the re-formings, admissions and departures.
    pub metrics_addr: Option<SocketAddr>,
}

/// What sums the workers' tensors across processes: TensorFlow's
/// `CommunicationImplementation` (`RING`, `NCCL`). Every worker must choose alike.
///
/// Parses from `ring`, `nccl` (GPU 0) and `nccl:N` (GPU `N` of this process, as CUDA numbers
/// the visible ones: give each worker on a host its own, or its own `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Communication {
    /// cohort's collectives over the process group: a ring for large tensors, a direct
    /// exchange for small ones, over QUIC or the plaintext plane.
    #[default]
    Ring,
    /// NCCL (feature `nccl`) on GPU `device`: f32 and f64 sums (gradients, `reduce`) are
    /// copied to the GPU, all-reduced there and copied back; broadcasts, gathers and other
    /// dtypes stay on the group. One communicator per membership epoch, bootstrapped over the
    /// group and aborted when it breaks (`ProcessSpan::with_nccl`). Making the strategy
    /// fails with [`StrategyError::Config`] (key `communication`) when this build has no
    /// NCCL, libnccl or the CUDA driver cannot be loaded, or the GPU is not there.
    Nccl {
        /// The GPU's ordinal among this process's visible ones.
        device: usize,
    },
}

impl std::fmt::Display for Communication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Communication::Ring => write!(f, "ring"),
            Communication::Nccl { device } => write!(f, "nccl:{device}"),
        }
    }
}

impl std::str::FromStr for Communication {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?}: expected \"ring\", \"nccl\" or \"nccl:GPU\"");
        match text.split_once(':') {
            None if text == "ring" => Ok(Communication::Ring),
            None if text == "nccl" => Ok(Communication::Nccl { device: 0 }),
            Some(("nccl", device)) => device
                .parse()
                .map(|device| Communication::Nccl { device })
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl Communication {
    /// Whether this process can use it: for NCCL, a build with the feature, libnccl and the
    /// CUDA driver loaded, and the GPU visible. The error says what is missing.
    pub fn check(&self) -> Result<(), String> {
        let Communication::Nccl { device } = *self else {
            return Ok(());
        };
        #[cfg(not(feature = "nccl"))]
        {
            Err(format!(
                "nccl:{device}: this build of cohort has no NCCL: build it with \
                 `cargo build --features nccl`"
            ))
        }
        #[cfg(feature = "nccl")]
        {
            let version =
                crate::collective::nccl_version().map_err(|e| format!("nccl:{device}: {e}"))?;
            // Counted, not opened: another worker may hold its GPU in exclusive mode.
            let gpus = crate::collective::gpu_count()
                .map_err(|e| format!("nccl:{device}: no GPU ({e})"))?;
            if device >= gpus {
                return Err(format!(
                    "nccl:{device}: no GPU {device}: this process sees {gpus} GPU(s) (NCCL \
                     {version})"
                ));
            }
            Ok(())
        }
    }
}

impl MultiWorkerConfig {
    /// The defaults for `cluster`, with certificates from `certs_dir` and one local replica.
    pub fn new(cluster: ClusterConfig, certs_dir: impl Into<PathBuf>) -> Self {
        Self {
            cluster,
            certs_dir: certs_dir.into(),
            local_replicas: 1,
            group: GroupConfig::default(),
            transport: TransportConfig::default(),
            bucket_bytes_max: DEFAULT_BUCKET_BYTES_MAX,
            collective_timeout: Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            recover_attempts: DEFAULT_RECOVER_ATTEMPTS,
            enter_timeout: DEFAULT_ENTER_TIMEOUT,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            communication: Communication::Ring,
            metrics_addr: None,
        }
    }

    /// `local_replicas` replicas in this process.
    pub fn with_local_replicas(mut self, local_replicas: usize) -> Self {
        self.local_replicas = local_replicas;
        self
    }
}

/// The default bucket of a list all-reduced across workers.
pub const DEFAULT_BUCKET_BYTES_MAX: usize = 4 * 1024 * 1024;
/// The default time a re-forming survivor waits for a member's answer to its probe.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The default number of re-forming attempts.
pub const DEFAULT_RECOVER_ATTEMPTS: usize = 6;
/// The default time a starting worker waits for the others to say whether a group lives.
pub const DEFAULT_ENTER_TIMEOUT: Duration = Duration::from_secs(2);
/// The default time a joining worker waits to be admitted.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// TensorFlow's `MultiWorkerMirroredStrategy`: every worker runs the same program; each runs
/// `N` local replicas on threads (as [`Mirrored`](super::Mirrored) does), and the replicas of
/// every worker are in sync (`num_replicas_in_sync` = workers × `N`).
///
/// - Making it forms the process group of every worker at epoch 1 over QUIC (mutual TLS with
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
    /// Whether the status page's membership changes hold one yet (the first epoch is noted
    /// at the first step boundary, which knows its step).
    change_noted: bool,
    runtime: Option<tokio::runtime::Runtime>,
}

impl MultiWorkerMirrored {
    /// Forms the group of every worker of `config.cluster` and starts this process's replicas
    /// (see the type's doc). Fails with [`StrategyError::Config`] naming the key of a bad
    /// cluster, task, certificate directory or replica count, and with
    /// [`StrategyError::Collective`] when the group cannot be formed in time.
    pub fn new(config: MultiWorkerConfig) -> Result<Self, StrategyError> {
        let cluster = &config.cluster;
        let bad = |key: &str, detail: String| StrategyError::Config {
            key: key.to_string(),
            detail,
        };
        cluster
            .cluster
            .require(StrategyKind::MultiWorkerMirrored)
            .map_err(|e| bad("cluster", e.to_string()))?;
        for job in [TaskType::Ps, TaskType::Evaluator] {
            let count = cluster.cluster.num_tasks(job);
            if count > 0 {
                return Err(bad(
                    &format!("cluster.{job}"),
                    format!(
                        "MultiWorkerMirrored takes workers and an optional chief only, \
                         not {count} {job} task(s)"
                    ),
                ));
            }
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
            .map_err(|detail| bad("communication", detail))?;
        if let Some(addr) = config.metrics_addr {
            serve_metrics(addr, task).map_err(|detail| bad("metrics_addr", detail))?;
        }
        // Chief first, then workers: the group's ranks (sorted node ids) in TensorFlow's order.
        let mut members = Vec::new();
        let mut own_addr = None;
        for job in [TaskType::Chief, TaskType::Worker] {
            for (i, text) in cluster.cluster.addresses(job).iter().enumerate() {
                let key = format!("cluster.{job}[{i}]");
                let addr = resolve(text).map_err(|detail| bad(&key, detail))?;
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
        let own_addr =
            own_addr.ok_or_else(|| bad("task", format!("{task} is not in the cluster")))?;
        let me = node_id(task);
        let peers: Vec<GroupMember> = members.iter().filter(|m| m.node != me).cloned().collect();
        let creds = NodeCredentials::load(&config.certs_dir, &me)
            .map_err(|e| bad("certs_dir", format!("{}: {e}", config.certs_dir.display())))?;
        let names: Vec<String> = (0..config.local_replicas)
            .map(|i| format!("cpu:{i}"))
            .collect();
        let devices = parse_replica_devices(&names)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cohort-mwms")
            .enable_all()
            .build()
            .map_err(|e| {
                bad(
                    "runtime",
                    format!("cannot start the collective runtime: {e}"),
                )
            })?;
        let (transport, group_config) = (config.transport.clone(), config.group.clone());
        let (enter_timeout, join_timeout) = (config.enter_timeout, config.join_timeout);
        let certs_dir = config.certs_dir.clone();
        let formed = block_on(&runtime, async move {
            // Under network fault rules (COHORT_NET_FAULTS) as every role's endpoint is.
            let endpoint =
                cohort_chaos::rules::bind_endpoint(own_addr, creds, transport).map_err(|e| {
                    CollectiveError::Form {
                        epoch: 1,
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
            // Forms the first epoch with the others (a fresh start). A member still waiting
            // to be admitted to a group that is gone (its process entered while the group
            // lived, and every member left or was lost since) refuses it until it sees that
            // no one has a live group, and then forms it too: the refused attempt is
            // forgotten and tried again, within the join timeout, this process answering
            // meanwhile that it has no group (rather than exiting and being restarted, which
            // a waiting member may never see).
            let fresh_start = |mesh: Mesh, members: Vec<GroupMember>| async move {
                let until = tokio::time::Instant::now() + join_timeout;
                loop {
                    match mesh.form(1, members.clone()).await {
                        Err(err @ CollectiveError::EpochRefused { current: 0, .. })
                            if tokio::time::Instant::now() < until
                                && mesh.forget_failed_start() =>
                        {
                            tracing::info!(%err, "a member waits to be admitted to a group that is gone: forming the first epoch again once it starts too");
                            tokio::time::sleep(FRESH_START_RETRY).await;
                        }
                        formed => return formed,
                    }
                }
            };
            // Joins the live group; where none lives any more (every worker lost its group,
            // and they start again), forms the first epoch with the others after all.
            let join = |mesh: Mesh, members: Vec<GroupMember>| {
                let peers = peers.clone();
                async move {
                    match mesh.join_live(own_addr, &peers, join_timeout).await {
                        Ok(group) => Ok(group),
                        Err(err) if mesh.epoch() == 0 => {
                            match mesh.enter(own_addr, &peers, enter_timeout).await {
                                Entry::Start => {
                                    tracing::info!(%err, "no live group to join: forming the first epoch with the others");
                                    fresh_start(mesh, members).await
                                }
                                Entry::Join => Err(err),
                            }
                        }
                        Err(err) => Err(err),
                    }
                }
            };
            // A restarted (or added) worker finds the others training: it joins them.
            let group = match mesh.enter(own_addr, &peers, enter_timeout).await {
                Entry::Start => match fresh_start(mesh.clone(), members.clone()).await {
                    Ok(group) => group,
                    // The others formed the first epoch without this process (with its
                    // old one, lost since: this is a restart) while it formed: join them.
                    Err(err) => match mesh.enter(own_addr, &peers, enter_timeout).await {
                        Entry::Join => {
                            tracing::info!(%err, "forming the first epoch failed and the others formed a group: joining it");
                            join(mesh.clone(), members).await?
                        }
                        Entry::Start => return Err(err),
                    },
                },
                Entry::Join => {
                    tracing::info!("the others formed a group: joining it");
                    join(mesh.clone(), members).await?
                }
            };
            Ok((mesh, group))
        });
        let (mesh, group) = match formed {
            Ok(formed) => formed,
            Err(err) => {
                runtime.shutdown_background();
                return Err(err.into());
            }
        };
        record_group(&group);
        let communication = (
            config.communication,
            NcclWaits {
                timeout: config.group.op_timeout,
                // A lost member is detected within the idle timeout, after NCCL may have seen it.
                settle: config.transport.idle_timeout + Duration::from_millis(500),
                probe: config.probe_timeout,
            },
        );
        let span = span_of(
            group,
            &runtime,
            config.local_replicas,
            config.bucket_bytes_max,
            communication,
        );
        // Joined a live group (formed at an epoch above 1): its state comes with `admit`.
        let awaiting_state = Arc::new(AtomicBool::new(span.group().epoch() > 1));
        let strategy = (|| -> Result<_, StrategyError> {
            // A worker lost right after forming breaks the group here: the training loop's
            // first call fails with that loss and `recover` re-forms, then checks again.
            unless_mendable(
                check_same_settings(
                    &span,
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
        })();
        let (id, replicas) = match strategy {
            Ok(made) => made,
            Err(err) => {
                shut_down(runtime, span.group());
                return Err(err);
            }
        };
        let status_tasks: Vec<(NodeId, String)> = [TaskType::Chief, TaskType::Worker]
            .into_iter()
            .flat_map(|job| {
                cluster
                    .cluster
                    .addresses(job)
                    .iter()
                    .enumerate()
                    .map(move |(i, addr)| (node_id(TaskId::new(job, i as u32)), addr.clone()))
            })
            .collect();
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

    /// The process group of the workers (its epoch, members, and the error that broke it).
    pub fn process_group(&self) -> &ProcessGroup {
        self.span.group()
    }

    /// Re-forms the workers' group with the survivors after a step failed because a worker
    /// was lost (elastic training, as Horovod Elastic and torchft do: no checkpoint is read,
    /// the survivors hold the model), and makes every survivor's training `state` identical.
    /// Call it on every survivor, in cross-replica context, once `run` (or `reduce`) failed
    /// with a collective error; then go on training from `state.step` and `state.position`
    /// with the new [`Strategy::num_replicas_in_sync`] and input pipelines.
    ///
    /// Each attempt, bounded in time:
    /// 1. *Who survives*: this worker probes every member of the broken group
    ///    ([`ProcessGroup::reachable`]); the members that answer within `probe_timeout` (and
    ///    itself) are its survivors (each attempt probes the members of the group that broke,
    ///    not of a group an earlier attempt formed). Every survivor probes every member, so
    ///    the dead ones (one, two, any number at once) are left out by all. A live member that
    ///    does not answer in time (stopped, or starved) is left out too: the others go on
    ///    without it.
    /// 2. *Quorum*: a survivor forms the next epoch only if its survivors are a quorum of the
    ///    members of the group that broke (`has_quorum`: more than half of them, or exactly
    ///    half with its lowest-ranked member, the chief or worker 0). Under a partition only
    ///    one side can have one: a survivor on the other side does not train on alone; its
    ///    attempt fails (another one follows, the partition may heal), and after
    ///    `recover_attempts` attempts `recover` fails with [`StrategyError::Recovery`] saying
    ///    "no quorum" and whom it reached: the process is to be restarted. A member whose
    ///    address answered the probe as a new process waiting to be admitted is not counted:
    ///    its old process is gone and is on no side. So survivors whose lost peers all came
    ///    back so go on, however few (a worker alone whose two peers were killed and
    ///    restarted), from their own state, and admit the new processes at the next step
    ///    boundary, instead of the job starting again from its checkpoint.
    /// 3. *Agreeing on them*: the survivors form the next epoch with that list; forming
    ///    succeeds only where every member formed the same epoch with the same members (each
    ///    link's join compares the lists), so survivors whose views differ (a member died
    ///    while being probed) all fail the attempt instead of splitting (a member refusing a
    ///    join whose list differs from its own fails its forming too, at once), and try again,
    ///    each attempt spanning at least the probe timeout, with a new probe at the next
    ///    epoch. A member never mixes epochs: a late message of the old group is refused by
    ///    its epoch.
    ///
    ///    Each survivor decides the quorum on its own probes, and views may differ (under an
    ///    asymmetric partition A hears B while B does not hear A): that is safe because any
    ///    two lists that pass share a member of the broken group, and forming needs every
    ///    member of the list to form that same list at that epoch; a member forms one group
    ///    at a time (forming a later one supersedes the earlier, whose collectives then fail
    ///    for want of it), so two groups never train side by side.
    /// 4. *Agreeing on the state*: the survivors gather their completed steps; the one with
    ///    the highest (ties: the lowest rank) is the source, since with a ring one survivor
    ///    may have applied a step's full all-reduce that another never got. Its step, input
    ///    position, optimizer step count, every variable of `state` and every optimizer slot
    ///    are broadcast to the others, which install them on every local replica: every
    ///    survivor holds the same bits again.
    ///
    /// A failure during the attempt (another worker lost while re-forming) starts the next
    /// attempt from the group reached so far; after `recover_attempts` attempts it fails with
    /// [`StrategyError::Recovery`] naming the last error. A group broken by an error that
    /// re-forming cannot mend ([`CollectiveError::Application`], mismatched calls, this
    /// worker stopping) fails with [`StrategyError::Recovery`] at once, and so does a worker
    /// that was left out (it comes back, say from SIGSTOP, after the others re-formed
    /// without it: a member's answer to its probe says so).
    pub fn recover(&mut self, state: &mut ElasticState<'_>) -> Result<Recovery, StrategyError> {
        let recovery = self.re_form(state)?;
        let lost: Vec<String> = recovery.lost.iter().map(ToString::to_string).collect();
        let what = if lost.is_empty() {
            "re-formed, no worker lost".to_string()
        } else {
            format!("lost {}", lost.join(", "))
        };
        self.note_change(recovery.step, &recovery.lost, TaskState::Dead, what);
        Ok(recovery)
    }

    /// The body of [`MultiWorkerMirrored::recover`], which also records the change for the
    /// status page.
    fn re_form(&mut self, state: &mut ElasticState<'_>) -> Result<Recovery, StrategyError> {
        let before = self.span.group().clone();
        let Some(cause) = before.broken() else {
            return Err(StrategyError::Recovery {
                reason: format!(
                    "the group of epoch {} is not broken: there is nothing to recover from",
                    before.epoch()
                ),
            });
        };
        if !recoverable(&cause) {
            return Err(StrategyError::Recovery {
                reason: format!("the group broke by an error re-forming cannot mend: {cause}"),
            });
        }
        let mut last = cause.to_string();
        // Whether the last attempt ended for want of a quorum (the error then says so).
        let mut no_quorum = false;
        for attempt in 1..=self.recover_attempts {
            let started = std::time::Instant::now();
            // Every attempt probes the members of the group that broke (the last one that
            // trained) and measures the quorum on them, not on a group an earlier attempt
            // formed here: a group formed at one member and failed at another would otherwise
            // give them different measures.
            let broken = before.clone();
            let probe = self.probe_timeout;
            let previous = before.members().to_vec();
            // Inner error: why this worker forms nothing this attempt.
            let formed = self.block(async move {
                let (alive, replaced) = match broken.probe_members(probe).await {
                    Ok(probed) => (probed.alive, probed.joining),
                    Err(left_out) => return Ok(Err(Unformed::LeftOut(left_out))),
                };
                if !has_quorum(&previous, &replaced, &alive) {
                    return Ok(Err(Unformed::NoQuorum {
                        reached: alive,
                        replaced,
                    }));
                }
                tracing::info!(
                    attempt,
                    ?alive,
                    ?replaced,
                    "re-forming: forming the next epoch with the members that answered"
                );
                broken.reform(&alive).await.map(Ok)
            });
            let formed = match formed {
                // No later attempt can bring it back: the others go on without it.
                Ok(Err(Unformed::LeftOut(left_out))) => {
                    return Err(StrategyError::Recovery {
                        reason: format!("this worker was left out: {left_out}"),
                    })
                }
                Ok(Err(Unformed::NoQuorum { reached, replaced })) => {
                    last = no_quorum_detail(before.members(), before.epoch(), &replaced, &reached);
                    tracing::info!(attempt, "re-forming: {last}");
                    no_quorum = true;
                    // The probes took about this long where the others are unreachable; where
                    // they answered at once (and still too few), the next attempt waits as
                    // long, so that the attempts span the probe timeout each.
                    if attempt < self.recover_attempts {
                        let next = started + self.probe_timeout;
                        let left = next.saturating_duration_since(std::time::Instant::now());
                        std::thread::sleep(left);
                    }
                    continue;
                }
                Ok(Ok(group)) => Ok(group),
                Err(err) => Err(err),
            };
            no_quorum = false;
            match formed {
                Ok(group) => {
                    self.install(group);
                    // A group broken before its settings were compared (a worker lost right
                    // after the first forming) is checked now; a mismatch is not mended by
                    // another attempt.
                    let agreed = check_same_settings(
                        &self.span,
                        self.local_replicas,
                        self.bucket_bytes_max,
                        self.communication.0,
                    )
                    .and_then(|()| self.agree_state(state));
                    match agreed {
                        Ok(source) => {
                            let group = self.span.group();
                            let m = crate::metrics::instruments();
                            m.group_reformed.inc();
                            // The lost members: peers this worker declared dead.
                            m.detections
                                .inc_by((before.size().saturating_sub(group.size())) as u64);
                            return Ok(Recovery {
                                epoch: group.epoch(),
                                members: group.members().to_vec(),
                                lost: before
                                    .members()
                                    .iter()
                                    .filter(|n| !group.members().contains(n))
                                    .cloned()
                                    .collect(),
                                cause,
                                source,
                                step: state.step,
                                position: state.position,
                                attempts: attempt,
                            });
                        }
                        Err(err @ StrategyError::Config { .. }) => return Err(err),
                        Err(err) => {
                            tracing::info!(attempt, %err, "re-forming: agreeing on the state failed");
                            last = err.to_string();
                        }
                    }
                }
                Err(err) => {
                    tracing::info!(attempt, %err, "re-forming: forming the next epoch failed");
                    last = err.to_string();
                    // Each attempt spans at least the probe timeout, as one without a quorum
                    // does: survivors whose attempt failed at different moments start the
                    // next one about as far apart as they started this one, and forming
                    // waits for the later ones (up to the form timeout).
                    let next = started + self.probe_timeout;
                    std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
                }
            }
        }
        let reason = if no_quorum {
            format!("{last} (after {} attempt(s))", self.recover_attempts)
        } else {
            format!(
                "gave up after {} attempt(s); the last failed with: {last}",
                self.recover_attempts
            )
        };
        Err(StrategyError::Recovery { reason })
    }

    /// The membership changes of a step boundary (elastic training): call it on every worker
    /// before each step, in cross-replica context, with the training `state` as for
    /// [`MultiWorkerMirrored::recover`], whether this worker is to leave and why (`leaving`:
    /// [`Leave::Preempted`] on a preemption notice, e.g. SIGTERM; [`Leave::Drained`] when it
    /// is scaled down, e.g. SIGUSR1), and how the chief saves a checkpoint of `state` (`save`,
    /// called on the chief only, when a preempted worker leaves). `Ok(None)` where nothing
    /// changes: one small all-gather (every worker's notice, and the leader's count of joiners).
    ///
    /// - **Preemption**: where any worker has a notice, every worker learns it at the same
    ///   step (the all-gather): the chief (rank 0) saves the agreed step with `save`, and says
    ///   whether it saved; then the leavers get [`GroupChange::Leaving`] (stop training and
    ///   exit, e.g. with 143, within the notice's grace), and the others re-form without them at
    ///   the next epoch, by agreement (no probe, no failure to detect), and get
    ///   [`GroupChange::Departed`]. Every stayer holds the same state already. If the chief
    ///   leaves, it saves first; if everyone leaves, the job stops at a checkpoint (as
    ///   TensorFlow's `PreemptionCheckpointHandler` does).
    /// - **Drain**: the same agreement, without the checkpoint where every leaver was drained
    ///   (it leaves for good, and the stayers hold the state): [`Departure::drained`] names
    ///   them.
    /// - **Joining**: a worker made while the others were training (its strategy found a live
    ///   group and was admitted to it when made) calls it first, after creating its model: it
    ///   receives the step, input position, variables and optimizer state of the member with
    ///   the most completed steps, and gets [`GroupChange::Admitted`]; until then its `run` is
    ///   refused. On the members, the leader (rank 0) offers the joiners that asked it, every
    ///   member forms the next epoch with them ([`ProcessGroup::admit`]), and the state goes to
    ///   them as `recover` sends it to survivors. Where the leader could not tell every joiner
    ///   its admission, nothing changes (`Ok(None)`) and the joiners ask again.
    ///
    /// Training goes on from the returned step with the new
    /// [`Strategy::num_replicas_in_sync`] and input pipelines (the global batch follows the
    /// replicas; the input goes on from the agreed position). A failure (a joiner that went
    /// away before forming, a member lost meanwhile) fails it with the collective error: the
    /// group of the attempt is broken, and [`MultiWorkerMirrored::recover`] re-forms with the
    /// survivors as after a failed step.
    pub fn at_step_boundary(
        &mut self,
        state: &mut ElasticState<'_>,
        leaving: Option<Leave>,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        if !self.change_noted && !self.awaiting_state.load(Ordering::SeqCst) {
            self.note_change(state.step, &[], TaskState::Alive, "formed".into());
        }
        let change = self.boundary_change(state, leaving, save)?;
        match &change {
            Some(GroupChange::Admitted(a)) => {
                let what = format!("admitted {}", node_list(&a.joined));
                self.note_change(a.step, &a.joined, TaskState::Alive, what);
            }
            Some(GroupChange::Departed(d) | GroupChange::Leaving(d)) => {
                let what = d.describe();
                self.note_change(d.step, &d.left, TaskState::Retired, what);
            }
            None => {}
        }
        Ok(change)
    }

    /// The body of [`MultiWorkerMirrored::at_step_boundary`], which also records the change
    /// for the status page.
    fn boundary_change(
        &mut self,
        state: &mut ElasticState<'_>,
        leaving: Option<Leave>,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        let me = node_id(self.task);
        self.boundary_reached(state.step);
        if self.awaiting_state.load(Ordering::SeqCst) {
            let source = self.agree_state(state)?;
            crate::metrics::instruments().group_admitted.inc();
            let group = self.span.group();
            return Ok(Some(GroupChange::Admitted(Admission {
                epoch: group.epoch(),
                members: group.members().to_vec(),
                joined: vec![me],
                source,
                step: state.step,
                position: state.position,
            })));
        }
        self.broken()?;
        let group = self.span.group().clone();
        let cpu = &Device::Cpu;
        // The leader's pending joiners, the same list on every member.
        let offer = if group.rank() == 0 {
            let joiners: Vec<(NodeId, String)> = group
                .pending_joiners()
                .into_iter()
                .map(|j| (j.node, j.addr.to_string()))
                .collect();
            if joiners.is_empty() {
                Vec::new()
            } else {
                bincode::encode_to_vec(&joiners, bincode::config::standard()).map_err(|e| {
                    StrategyError::Recovery {
                        reason: format!("encoding the joiners: {e}"),
                    }
                })?
            }
        } else {
            Vec::new()
        };
        // Every worker's notice and offer, in rank order.
        let votes = self
            .span
            .all_gather(&Tensor::new(
                &[Leave::vote(leaving), offer.len() as i64],
                cpu,
            )?)?
            .to_vec1::<i64>()?;
        let leavers: Vec<(usize, Leave)> = (0..group.size())
            .filter_map(|r| Some((r, Leave::of_vote(*votes.get(2 * r)?)?)))
            .collect();
        if !leavers.is_empty() {
            return self.depart(state, &leavers, save).map(Some);
        }
        let len = votes.get(1).copied().unwrap_or(0);
        if len <= 0 {
            return Ok(None);
        }
        let len = len as usize;
        let bytes = if offer.len() == len {
            offer
        } else {
            vec![0u8; len]
        };
        let bytes = self
            .span
            .broadcast(0, &Tensor::from_vec(bytes, len, cpu)?)?
            .to_vec1::<u8>()?;
        let joiners = decode_joiners(&bytes)?;
        let joined: Vec<NodeId> = joiners.iter().map(|j| j.node.clone()).collect();
        let Some(admitted) = self.block(async move { group.admit(&joiners).await })? else {
            // The leader could not tell every joiner its admission: nobody formed the next
            // epoch, the group goes on as it was, and the joiners ask again.
            return Ok(None);
        };
        crate::metrics::instruments()
            .group_admitted
            .inc_by(joined.len() as u64);
        self.install(admitted);
        check_same_settings(
            &self.span,
            self.local_replicas,
            self.bucket_bytes_max,
            self.communication.0,
        )?;
        let source = self.agree_state(state)?;
        let group = self.span.group();
        Ok(Some(GroupChange::Admitted(Admission {
            epoch: group.epoch(),
            members: group.members().to_vec(),
            joined,
            source,
            step: state.step,
            position: state.position,
        })))
    }

    /// Makes every worker's training `state` that of the worker with the most completed
    /// steps (ties: the lowest rank), as re-forming does: call it on every worker together,
    /// e.g. at a fresh start where the chief restored a checkpoint. Returns the source.
    pub fn agree(&mut self, state: &mut ElasticState<'_>) -> Result<NodeId, StrategyError> {
        self.broken()?;
        self.agree_state(state)
    }

    /// The leaving part of [`MultiWorkerMirrored::at_step_boundary`]: the workers of
    /// `leavers` (ranks, and why each leaves) leave at this step.
    fn depart(
        &mut self,
        state: &mut ElasticState<'_>,
        leavers: &[(usize, Leave)],
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<GroupChange, StrategyError> {
        let group = self.span.group().clone();
        let members = group.members().to_vec();
        let left: Vec<NodeId> = leavers.iter().map(|&(r, _)| members[r].clone()).collect();
        let drained: Vec<NodeId> = leavers
            .iter()
            .filter(|(_, why)| *why == Leave::Drained)
            .map(|&(r, _)| members[r].clone())
            .collect();
        crate::metrics::instruments()
            .group_departed
            .inc_by(left.len() as u64);
        let stayers: Vec<NodeId> = members
            .iter()
            .enumerate()
            .filter(|(r, _)| !leavers.iter().any(|(l, _)| l == r))
            .map(|(_, n)| n.clone())
            .collect();
        // The chief saves the agreed step before anyone leaves, and says whether it did. Only
        // a preemption needs it: a drained worker leaves for good, and the stayers hold the
        // state (every worker knows both lists, so all skip the save together).
        let preempted = drained.len() < left.len();
        let saved_here = if group.rank() == 0 && preempted {
            match save(state) {
                Ok(()) => 1u8,
                Err(error) => {
                    tracing::warn!(%error, step = state.step, "the chief could not save the checkpoint of a departure");
                    0
                }
            }
        } else {
            0
        };
        let saved = self
            .span
            .broadcast(0, &Tensor::new(&[saved_here], &Device::Cpu)?)?
            .to_vec1::<u8>()?
            .first()
            == Some(&1);
        let mut departure = Departure {
            epoch: group.epoch(),
            members: stayers.clone(),
            left,
            drained,
            step: state.step,
            position: state.position,
            saved,
        };
        if leavers.iter().any(|&(r, _)| r == group.rank()) {
            // Every message of this worker taken before it goes: the others must not take
            // its leaving for a loss.
            let flushed = group.clone();
            let _ = self.block(async move {
                flushed.flush(FLUSH_MAX).await;
                Ok(())
            });
            return Ok(GroupChange::Leaving(departure));
        }
        let formed = self.block(async move { group.reform(&stayers).await })?;
        self.install(formed);
        departure.epoch = self.span.group().epoch();
        Ok(GroupChange::Departed(departure))
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

    /// Whether this worker joined a live group and waits for its state (the first
    /// [`MultiWorkerMirrored::at_step_boundary`] gives it).
    pub fn awaits_state(&self) -> bool {
        self.awaiting_state.load(Ordering::SeqCst)
    }

    /// A step boundary at `step` completed steps, in this worker's metrics: the step, and the
    /// time since the previous boundary.
    fn boundary_reached(&mut self, step: u64) {
        let m = crate::metrics::instruments();
        m.group_step.set(i64::try_from(step).unwrap_or(i64::MAX));
        let now = std::time::Instant::now();
        if let Some(previous) = self.last_boundary.replace(now) {
            m.observe_group_step(now.duration_since(previous));
        }
    }

    /// A membership change for the status page: the current group's members are up, the
    /// `changed` ones (lost, left, or admitted) are `state`, and the change is listed as
    /// starting at `step`.
    fn note_change(&mut self, step: u64, changed: &[NodeId], state: TaskState, what: String) {
        let group = self.span.group();
        for member in group.members() {
            self.task_states.insert(member.clone(), TaskState::Alive);
        }
        for node in changed {
            if state != TaskState::Alive || group.members().contains(node) {
                self.task_states.insert(node.clone(), state);
            }
        }
        crate::status::record_group_change(crate::status::GroupChange {
            epoch: group.epoch(),
            workers: group.size(),
            from_step: step,
            what,
        });
        self.change_noted = true;
        self.publish_status();
    }

    /// Records the group as this worker sees it now, for its status page.
    fn publish_status(&self) {
        let group = self.span.group();
        let tasks = self
            .status_tasks
            .iter()
            .map(|(node, address)| {
                let member = group.members().contains(node);
                let state = match self.task_states.get(node) {
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
                epoch: group.epoch(),
                workers: group.size(),
                replicas_per_worker: self.local_replicas,
                communication: self.communication.0.to_string(),
                changes: Vec::new(),
            },
            tasks,
        );
    }

    /// Makes `group` the one every later step's collectives span.
    fn install(&mut self, group: ProcessGroup) {
        record_group(&group);
        let Some(runtime) = &self.runtime else { return };
        let span = span_of(
            group,
            runtime,
            self.local_replicas,
            self.bucket_bytes_max,
            self.communication,
        );
        self.replicas.set_span(span.clone());
        // The old epoch's communicator goes now, not with the last clone of its span.
        std::mem::replace(&mut self.span, span).close_nccl();
    }

    /// Step 3 of [`MultiWorkerMirrored::recover`] over the freshly formed group; returns the
    /// source's node.
    fn agree_state(&self, state: &mut ElasticState<'_>) -> Result<NodeId, StrategyError> {
        let cpu = &Device::Cpu;
        let span = &self.span;
        let steps = span
            .all_gather(&Tensor::new(&[state.step as i64], cpu)?)?
            .to_vec1::<i64>()?;
        let highest = steps.iter().copied().max().unwrap_or(0);
        // The first of the highest: the lowest rank.
        let source = steps.iter().position(|s| *s == highest).unwrap_or(0);
        let iterations = state.optimizer.map_or(0, |o| o.steps());
        let header = span
            .broadcast(
                source,
                &Tensor::new(
                    &[state.step as i64, state.position as i64, iterations as i64],
                    cpu,
                )?,
            )?
            .to_vec1::<i64>()?;
        for variable in state.variables {
            let value = span.broadcast(source, &variable.try_read_value()?)?;
            variable.assign(&value)?;
        }
        if let Some(optimizer) = state.optimizer {
            let names = optimizer.kernel().slot_names();
            for variable in state.variables.iter().filter(|_| !names.is_empty()) {
                let len: usize = variable.shape().iter().product();
                let own = optimizer.export_slots(variable, 0);
                // Whether the source has slots for it: if not, no survivor ever updated it.
                let has = u8::from(own.is_some());
                let has = span
                    .broadcast(source, &Tensor::new(&[has], cpu)?)?
                    .to_vec1::<u8>()?;
                if has.first() != Some(&1) {
                    continue;
                }
                let mut flat = Vec::with_capacity(len * names.len());
                for name in names {
                    match own.as_ref().and_then(|o| o.get(name)) {
                        Some(buffer) => flat.extend_from_slice(buffer),
                        None => flat.extend(std::iter::repeat_n(0.0f32, len)),
                    }
                }
                let flat = Tensor::from_vec(flat, len * names.len(), cpu)?;
                let got = span.broadcast(source, &flat)?.to_vec1::<f32>()?;
                let named = names
                    .iter()
                    .enumerate()
                    .map(|(k, name)| (*name, got[k * len..(k + 1) * len].to_vec()));
                let skipped = own.as_ref().map_or(0, |o| o.skipped_non_finite());
                let slots =
                    Slots::restore(optimizer.kernel(), variable.name(), len, named, skipped)
                        .map_err(|e| StrategyError::Recovery {
                            reason: format!("the source's optimizer slots: {e}"),
                        })?;
                for component in 0..self.local_replicas {
                    optimizer.import_slots(variable, component, slots.clone());
                }
            }
            optimizer.set_steps(header[2].max(0) as u64, self.local_replicas);
        }
        state.step = header[0].max(0) as u64;
        state.position = header[1].max(0) as u64;
        // A joiner whose admission broke and that re-formed as a survivor holds it now too.
        self.awaiting_state.store(false, Ordering::SeqCst);
        crate::metrics::instruments()
            .group_step
            .set(i64::try_from(state.step).unwrap_or(i64::MAX));
        Ok(span.group().members()[source].clone())
    }

    /// Runs `call` on the collective runtime and waits for it here.
    fn block<T: Send + 'static>(
        &self,
        call: impl std::future::Future<Output = Result<T, CollectiveError>> + Send + 'static,
    ) -> Result<T, CollectiveError> {
        match &self.runtime {
            Some(runtime) => block_on(runtime, call),
            None => Err(CollectiveError::Stopped {
                epoch: self.span.group().epoch(),
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
/// How long a fresh start refused by a member still waiting to be admitted waits before it
/// forms the first epoch again (that member asks the others each second whether a group
/// lives, and starts once none does).
const FRESH_START_RETRY: Duration = Duration::from_millis(500);

/// Serves this worker's metrics ([`Exposition::for_group`](crate::metrics::Exposition::for_group))
/// on `addr` for the rest of the process; why not, if it cannot.
fn serve_metrics(addr: SocketAddr, task: TaskId) -> Result<(), String> {
    use crate::metrics::{serve, Exposition, Role, StatusFormat};
    use crate::status::{RateSampler, StatusReport};
    let role = match task.task_type {
        TaskType::Chief => Role::Chief,
        _ => Role::Worker,
    };
    // The launcher's incarnation epoch for this task, as a role process reads it.
    let given = std::env::var(crate::cluster::ConfigKey::INCARNATION.env)
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let incarnation = crate::process::incarnation_epoch(given, std::time::SystemTime::now());
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
    let exposition =
        Arc::new(Exposition::for_group(role, task.index, incarnation).with_status(status));
    let server =
        serve(addr, exposition).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    tracing::info!(
        "{task}: metrics on http://{}/metrics (health: /healthz, status: /status)",
        server.addr
    );
    Ok(())
}

/// `COHORT_METRICS_ADDR`, if set (`cohort launch` sets it for every task).
pub(crate) fn metrics_addr_from_env() -> Result<Option<SocketAddr>, StrategyError> {
    let key = crate::cluster::ConfigKey::METRICS_ADDR.env;
    match std::env::var(key) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| StrategyError::Config {
                key: key.into(),
                detail: format!(
                    "{text:?} is not an address to serve metrics on (ip:port, e.g. \
                     127.0.0.1:9100, or port 0 for any free port): {e}"
                ),
            }),
        Err(std::env::VarError::NotUnicode(_)) => Err(StrategyError::Config {
            key: key.into(),
            detail: "not valid UTF-8".into(),
        }),
    }
}

/// The group's epoch and size, in this worker's metrics.
fn record_group(group: &ProcessGroup) {
    let m = crate::metrics::instruments();
    m.group_epoch
        .set(i64::try_from(group.epoch()).unwrap_or(i64::MAX));
    m.group_workers.set(group.size() as i64);
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

/// Why the save a departure asks of [`MultiWorkerMirrored::at_step_boundary`] failed: the
/// caller's own error, kept whole (a [`crate::train::StateCheckpointError`], say). The chief
/// logs it and the departing workers leave without that save.
pub type SaveStateError = Box<dyn std::error::Error + Send + Sync>;

/// What a training loop carries over a re-forming of the workers' group
/// ([`MultiWorkerMirrored::recover`]): the survivor with the most completed steps gives its
/// own to the others.
#[derive(Debug)]
pub struct ElasticState<'a> {
    /// Steps this worker completed (its optimizer applied them); after recovery, the source's.
    pub step: u64,
    /// Examples of the (global, unsharded) input consumed by those steps; after recovery, the
    /// source's. Training goes on from here: the input is rebuilt to start at this example
    /// and batched to the new global batch, so that no example is skipped or seen twice.
    pub position: u64,
    /// The variables to make identical (every trainable and non-trainable variable of the
    /// model), in the same order on every worker.
    pub variables: &'a [Variable],
    /// The optimizer whose slots and step count follow the variables (e.g. a
    /// `train::DistributedOptimizer`).
    pub optimizer: Option<&'a dyn OptimizerState>,
}

/// What [`MultiWorkerMirrored::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The new group's membership epoch.
    pub epoch: u64,
    /// Its members (the survivors), in rank order.
    pub members: Vec<NodeId>,
    /// The members of the broken group left out.
    pub lost: Vec<NodeId>,
    /// The error that broke the old group here.
    pub cause: CollectiveError,
    /// The survivor whose state every survivor took.
    pub source: NodeId,
    /// The agreed completed step: training goes on with the next.
    pub step: u64,
    /// The agreed input position (examples consumed).
    pub position: u64,
    /// Attempts it took.
    pub attempts: usize,
}

/// A change of the workers' group at a step boundary
/// ([`MultiWorkerMirrored::at_step_boundary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupChange {
    /// Workers joined (on a joiner: itself, which received the state).
    Admitted(Admission),
    /// Workers with a notice (preempted or drained) left at this step; the others re-formed
    /// without them.
    Departed(Departure),
    /// This worker had a notice and leaves at this step: stop training.
    Leaving(Departure),
}

/// Why a worker leaves the group at a step boundary
/// ([`MultiWorkerMirrored::at_step_boundary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// A preemption notice (SIGTERM): the chief saves the agreed step first, and the worker's
    /// supervisor may start it again (it rejoins).
    Preempted,
    /// Scaled down for good (SIGUSR1, `cohort scale`): no checkpoint is needed, the stayers
    /// hold the state.
    Drained,
}

impl Leave {
    /// This worker's notice in the step boundary's all-gather: 0 stays, 1 preempted, 2 drained.
    fn vote(leaving: Option<Leave>) -> i64 {
        match leaving {
            None => 0,
            Some(Leave::Preempted) => 1,
            Some(Leave::Drained) => 2,
        }
    }

    /// A worker's notice from its vote. Any other non-zero value (a newer peer's notice
    /// this build does not know) is taken as a preemption: the worker leaves, after a save.
    fn of_vote(vote: i64) -> Option<Leave> {
        match vote {
            0 => None,
            2 => Some(Leave::Drained),
            _ => Some(Leave::Preempted),
        }
    }
}

/// What [`MultiWorkerMirrored::at_step_boundary`] did when workers left after a notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    /// The group's epoch after it (a leaver: the epoch it left).
    pub epoch: u64,
    /// The workers that go on, in rank order (empty when every worker left).
    pub members: Vec<NodeId>,
    /// The workers that left.
    pub left: Vec<NodeId>,
    /// Those of `left` that were drained (scaled down for good); the others were preempted.
    pub drained: Vec<NodeId>,
    /// The step every worker agreed on (completed by all): the chief's checkpoint holds it
    /// where a worker was preempted.
    pub step: u64,
    /// The input position at that step.
    pub position: u64,
    /// Whether the chief saved the checkpoint of that step (never where every leaver was
    /// drained: none is needed).
    pub saved: bool,
}

impl Departure {
    /// Who left and why, e.g. "worker/2 left after a preemption notice; worker/3 drained".
    pub fn describe(&self) -> String {
        let preempted: Vec<&NodeId> = self
            .left
            .iter()
            .filter(|n| !self.drained.contains(n))
            .collect();
        let mut parts = Vec::new();
        if !preempted.is_empty() {
            parts.push(format!(
                "{} left after a preemption notice",
                node_list(preempted)
            ));
        }
        if !self.drained.is_empty() {
            parts.push(format!(
                "{} drained (scaled down)",
                node_list(&self.drained)
            ));
        }
        parts.join("; ")
    }

    /// Whether `node` was drained here (rather than preempted).
    pub fn was_drained(&self, node: &NodeId) -> bool {
        self.drained.contains(node)
    }
}

/// What [`MultiWorkerMirrored::at_step_boundary`] did when it admitted workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The new group's membership epoch.
    pub epoch: u64,
    /// Its members, in rank order.
    pub members: Vec<NodeId>,
    /// The workers admitted (on a joiner: itself).
    pub joined: Vec<NodeId>,
    /// The member whose state every worker took.
    pub source: NodeId,
    /// The agreed completed step: training goes on with the next.
    pub step: u64,
    /// The agreed input position (examples consumed).
    pub position: u64,
}

/// The joiners the leader offered (`(node, host:port)` pairs, bincode), as group members.
fn decode_joiners(bytes: &[u8]) -> Result<Vec<GroupMember>, StrategyError> {
    let bad = |detail: String| StrategyError::Recovery {
        reason: format!("the leader's list of joiners: {detail}"),
    };
    let config = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let (pairs, _): (Vec<(NodeId, String)>, usize) =
        bincode::decode_from_slice(bytes, config).map_err(|e| bad(e.to_string()))?;
    pairs
        .into_iter()
        .map(|(node, addr)| {
            let addr = addr
                .parse()
                .map_err(|_| bad(format!("the address {addr:?} of {node} does not parse")))?;
            Ok(GroupMember { node, addr })
        })
        .collect()
}

/// Why a re-forming attempt formed no group here.
enum Unformed {
    /// A member re-formed a later epoch without this worker: it was taken for lost.
    LeftOut(CollectiveError),
    /// The members this worker reached (itself among them) are no quorum of the members not
    /// `replaced` (those answered as new processes).
    NoQuorum {
        reached: Vec<NodeId>,
        replaced: Vec<NodeId>,
    },
}

/// The quorum rule of re-forming: whether the members of the previous epoch that `reached`
/// holds (those that answered a survivor's probe, the survivor among them) may form the next
/// epoch. They may if they are more than half of `previous`, or exactly half of it and hold
/// its lowest-ranked member (`previous[0]`, `previous` being in rank order: the chief, or
/// worker 0). So of two disjoint sets at most one passes (two majorities intersect; of two
/// halves only one holds the lowest), and of a group split in two, exactly one side goes on:
/// a 2-worker group survives the loss of worker 1 (worker 0 goes on alone) but not that of
/// worker 0 (worker 1 stops). Nodes of `reached` outside `previous` do not count, nor does a
/// node twice.
///
/// Members of `previous` in `replaced` are not counted at all (nor is the lowest-ranked one
/// taken among them): a probe of their address was answered by a new process waiting to be
/// admitted, so their old process is gone and is on no side. Such knowledge only removes
/// members that can be on no side, so two disjoint sets still never both pass, whatever each
/// knows of who was replaced (the unit tests check every case up to 6 members); and survivors
/// whose lost peers all came back as new processes go on, however few, to admit them at the
/// next step boundary, instead of stopping for a quorum that can no longer be reached.
pub(crate) fn has_quorum(previous: &[NodeId], replaced: &[NodeId], reached: &[NodeId]) -> bool {
    let counted: Vec<&NodeId> = previous.iter().filter(|n| !replaced.contains(n)).collect();
    let Some(lowest) = counted.first() else {
        return false;
    };
    let held = counted.iter().filter(|n| reached.contains(n)).count();
    2 * held > counted.len() || (2 * held == counted.len() && reached.contains(lowest))
}

/// Nodes as a report names them: "worker/0, worker/2".
fn node_list<'a>(nodes: impl IntoIterator<Item = &'a NodeId>) -> String {
    nodes
        .into_iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a survivor without quorum says: whom of the broken group it reached, out of how many
/// counted (the `replaced` members, answered as new processes, are not).
fn no_quorum_detail(
    members: &[NodeId],
    epoch: u64,
    replaced: &[NodeId],
    reached: &[NodeId],
) -> String {
    let counted: Vec<&NodeId> = members.iter().filter(|n| !replaced.contains(n)).collect();
    let held: Vec<&NodeId> = counted
        .iter()
        .copied()
        .filter(|n| reached.contains(n))
        .collect();
    let lowest = counted
        .first()
        .map_or_else(String::new, ToString::to_string);
    let not_counted = if counted.len() == members.len() {
        String::new()
    } else {
        let gone: Vec<&NodeId> = members.iter().filter(|n| replaced.contains(n)).collect();
        format!(
            " ({} not counted: answered as new processes, their old ones are gone)",
            node_list(gone)
        )
    };
    format!(
        "no quorum: this worker reached {} of the {} members of epoch {}{not_counted} ({}); \
         re-forming needs more than half of them, or exactly half with {lowest}",
        held.len(),
        counted.len(),
        epoch,
        node_list(held),
    )
}

/// Whether re-forming with the survivors can mend a group broken by `err`: a lost, silent or
/// refusing member can be left out; a failed step, disagreeing calls or this worker stopping
/// cannot.
fn recoverable(err: &CollectiveError) -> bool {
    matches!(
        err,
        CollectiveError::MemberLost { .. }
            | CollectiveError::PeerTimeout { .. }
            | CollectiveError::EpochRefused { .. }
            | CollectiveError::Link { .. }
            | CollectiveError::Superseded { .. }
            | CollectiveError::Form { .. }
            | CollectiveError::Communicator { .. }
    )
}

/// Whether `group` broke by an error re-forming mends (see [`recoverable`]).
fn broken_mendably(group: &ProcessGroup) -> bool {
    group.broken().is_some_and(|cause| recoverable(&cause))
}

/// `result` of a collective call made before training starts, or `Ok` where it failed because
/// `group` broke by an error re-forming mends (a lost worker): the loop's next call then
/// fails with it, and [`MultiWorkerMirrored::recover`] re-forms and settles the state. So a
/// worker lost between forming and the first step costs a recovery, not the job.
fn unless_mendable(
    result: Result<(), StrategyError>,
    group: &ProcessGroup,
) -> Result<(), StrategyError> {
    match result {
        Err(StrategyError::Collective(_)) if broken_mendably(group) => Ok(()),
        other => other,
    }
}

/// Mirrors a variable on the local replicas and makes every worker's copies start from the
/// first worker's initial value (a broadcast right after creation).
#[derive(Debug)]
struct MultiWorkerPlacement {
    local: MirroredPlacement,
    span: ProcessSpan,
    /// Set while this worker joined a live group and waits for its state: then the members
    /// are past creating their variables, and `admit` gives this worker their values.
    awaiting_state: Arc<AtomicBool>,
}

impl VariablePlacement for MultiWorkerPlacement {
    fn place(&self, request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        self.local.place(request)
    }

    fn created(&self, variable: &Variable) -> Result<(), VariableError> {
        if !variable.has_local_copy() || self.awaiting_state.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.check_same_as_others(variable.name(), Some(variable))?;
        match self.span.broadcast(0, &variable.try_read_value()?) {
            Ok(first) => variable.assign(&first),
            // A worker lost while the model is made: the variable keeps its own initial value
            // for now. The group is broken, so the training loop's next call fails with that
            // loss, and `recover` makes every survivor's variables those of one survivor.
            Err(_) if broken_mendably(self.span.group()) => Ok(()),
            Err(source) => Err(VariableError::Collective {
                name: variable.name().to_string(),
                source,
            }),
        }
    }

    fn model_built(&self) -> Result<(), VariableError> {
        if self.awaiting_state.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.check_same_as_others("(the model's end)", None)
    }
}

impl MultiWorkerPlacement {
    /// Compares what this worker's model creates next (`variable`, or its end: `None`) with
    /// what every other worker's creates, by a header of its name's and shape's hashes, and
    /// fails naming the variable and the first worker that differs. Headers are all one size,
    /// so a worker whose model differs meets the others' call instead of waiting on it.
    fn check_same_as_others(
        &self,
        name: &str,
        variable: Option<&Variable>,
    ) -> Result<(), VariableError> {
        let header = |variable: Option<&Variable>| -> [i64; 5] {
            match variable {
                None => [0; 5],
                Some(v) => [
                    1,
                    fnv(v.name().as_bytes()) as i64,
                    v.shape().len() as i64,
                    v.shape().iter().product::<usize>() as i64,
                    fnv(format!("{:?} {:?}", v.shape(), v.dtype()).as_bytes()) as i64,
                ],
            }
        };
        let mine = header(variable);
        let gathered = Tensor::new(&mine, &Device::Cpu)
            .map_err(VariableError::from)
            .and_then(|t| {
                self.span
                    .all_gather(&t)
                    .map_err(|source| VariableError::Collective {
                        name: name.to_string(),
                        source,
                    })
            });
        let all = match gathered {
            Ok(all) => all.to_vec1::<i64>().map_err(VariableError::from)?,
            // A worker lost while the model is made: the recovery settles it (see `created`).
            Err(_) if broken_mendably(self.span.group()) => return Ok(()),
            Err(e) => return Err(e),
        };
        let members = self.span.group().members();
        for (w, theirs) in all.chunks(mine.len()).enumerate() {
            if theirs == mine {
                continue;
            }
            let other = &members[w];
            let detail = match (variable, theirs[0]) {
                (None, _) => format!(
                    "{other}'s model creates more variables than this worker's, whose model ends before it: every worker must build the same model"
                ),
                (Some(_), 0) => format!(
                    "this worker's model creates it, {other}'s model ends before it: every worker must build the same model"
                ),
                (Some(v), _) if theirs[1] != mine[1] => format!(
                    "{other}'s model creates a variable of another name at this point (this worker's is {:?} of shape {:?}): every worker must build the same model",
                    v.name(),
                    v.shape()
                ),
                (Some(v), _) => format!(
                    "{other}'s model creates it with another shape or type ({} dimensions, {} values; here {:?} {:?}): every worker must build the same model",
                    theirs[2],
                    theirs[3],
                    v.shape(),
                    v.dtype()
                ),
            };
            return Err(VariableError::DiffersAcrossWorkers {
                name: name.to_string(),
                detail,
            });
        }
        Ok(())
    }
}

/// FNV-1a of `bytes`: the same on every worker and build.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Fails naming a worker whose local replica count, bucket size or kind of communication
/// differs from this one's (by the key of the setting): the group's calls and NCCL's need
/// them alike.
fn check_same_settings(
    span: &ProcessSpan,
    local: usize,
    bucket_bytes_max: usize,
    communication: Communication,
) -> Result<(), StrategyError> {
    // The kind of communication only: each worker names its own GPU.
    let nccl = i64::from(matches!(communication, Communication::Nccl { .. }));
    let mine = [local as i64, bucket_bytes_max as i64, nccl];
    let all = span
        .all_gather(&Tensor::new(&mine, &Device::Cpu)?)?
        .to_vec1::<i64>()?;
    let members = span.group().members();
    let me = &members[span.group().rank()];
    for (w, theirs) in all.chunks(mine.len()).enumerate() {
        let (key, detail) = if theirs[0] != mine[0] {
            let n = theirs[0];
            (
                "local_replicas",
                format!(
                    "{} runs {n} replica(s), {me} runs {local}: every worker must run as many",
                    members[w]
                ),
            )
        } else if theirs[1] != mine[1] {
            let b = theirs[1];
            (
                "bucket_bytes_max",
                format!(
                    "{} fuses buckets of {b} bytes, {me} of {bucket_bytes_max}: every worker \
                     must choose alike",
                    members[w]
                ),
            )
        } else if theirs[2] != mine[2] {
            let kind = |nccl: i64| if nccl == 1 { "NCCL" } else { "the ring" };
            (
                "communication",
                format!(
                    "{} sums with {}, {me} with {}: every worker must choose alike",
                    members[w],
                    kind(theirs[2]),
                    kind(nccl)
                ),
            )
        } else {
            continue;
        };
        return Err(StrategyError::Config {
            key: key.into(),
            detail,
        });
    }
    Ok(())
}

/// The first address `text` (`host:port`) resolves to.
fn resolve(text: &str) -> Result<SocketAddr, String> {
    text.to_socket_addrs()
        .map_err(|e| format!("{text:?} does not resolve: {e}"))?
        .next()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// Runs `call` on `runtime` and waits for it on this thread (which may itself be inside
/// another runtime).
/// The span of `group`'s epoch, summing with `communication` (NCCL: within its waits, a new
/// communicator for the epoch).
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

fn block_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    call: impl std::future::Future<Output = Result<T, CollectiveError>> + Send + 'static,
) -> Result<T, CollectiveError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(call.await);
    });
    rx.recv()
        .unwrap_or(Err(CollectiveError::Stopped { epoch: 1 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u32) -> Vec<NodeId> {
        (0..n).map(|i| NodeId::new("worker", i)).collect()
    }

    /// The members of `all` whose bit is set in `mask`.
    fn subset(all: &[NodeId], mask: u32) -> Vec<NodeId> {
        all.iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, n)| n.clone())
            .collect()
    }

    #[test]
    fn a_strict_majority_has_quorum_and_a_minority_has_not() {
        let five = workers(5);
        assert!(has_quorum(&five, &[], &five[2..]));
        assert!(has_quorum(&five, &[], &five));
        assert!(!has_quorum(&five, &[], &five[3..]));
        assert!(
            !has_quorum(&five, &[], &five[..2]),
            "the lowest does not make 2 of 5 enough"
        );
        let three = workers(3);
        assert!(
            has_quorum(&three, &[], &three[1..]),
            "2 of 3 without worker 0"
        );
        assert!(
            !has_quorum(&three, &[], &three[2..]),
            "a worker cut off from the other two"
        );
    }

    #[test]
    fn exactly_half_has_quorum_only_with_the_lowest_ranked_member() {
        let two = workers(2);
        assert!(
            has_quorum(&two, &[], &two[..1]),
            "worker 0 goes on without worker 1"
        );
        assert!(
            !has_quorum(&two, &[], &two[1..]),
            "worker 1 stops without worker 0"
        );
        let four = workers(4);
        let with_lowest = [four[0].clone(), four[3].clone()];
        let without = [four[1].clone(), four[2].clone()];
        assert!(has_quorum(&four, &[], &with_lowest));
        assert!(!has_quorum(&four, &[], &without));
        // The chief ranks first: it is the lowest.
        let chief = vec![NodeId::new("chief", 0), NodeId::new("worker", 0)];
        assert!(has_quorum(&chief, &[], &chief[..1]));
        assert!(!has_quorum(&chief, &[], &chief[1..]));
    }

    #[test]
    fn strangers_and_repeats_do_not_count() {
        let three = workers(3);
        let padded = [
            three[2].clone(),
            three[2].clone(),
            NodeId::new("worker", 7),
            NodeId::new("worker", 8),
        ];
        assert!(!has_quorum(&three, &[], &padded));
        assert!(
            !has_quorum(&[], &[], &three),
            "an empty previous epoch has no quorum"
        );
    }

    #[test]
    fn two_disjoint_sets_never_both_have_quorum_and_a_split_leaves_exactly_one_side() {
        for n in 1..=7u32 {
            let all = workers(n);
            for a in 0..(1u32 << n) {
                let side = subset(&all, a);
                let other = subset(&all, !a & ((1 << n) - 1));
                // A clean split: exactly one side goes on.
                assert_ne!(
                    has_quorum(&all, &[], &side),
                    has_quorum(&all, &[], &other),
                    "{n} members split into {side:?} and {other:?}"
                );
                // Any set disjoint from this one (a subset of the rest): never both.
                for b in 0..(1u32 << n) {
                    if a & b == 0 && has_quorum(&all, &[], &side) {
                        let disjoint = subset(&all, b);
                        assert!(
                            !has_quorum(&all, &[], &disjoint),
                            "{n} members: {side:?} and {disjoint:?} both passed"
                        );
                    }
                }
            }
        }
    }

    /// Every way `n` members can end up: each one dead (its address answering as a new
    /// process), or alive on side 1, side 2 or neither; each side knowing any subset of the
    /// dead as replaced. Two disjoint sides of live members never both pass, and a clean
    /// split of the live members with both sides knowing every dead one leaves exactly one.
    #[test]
    fn members_replaced_by_new_processes_do_not_count_and_two_sides_still_never_both_pass() {
        for n in 1..=6u32 {
            let all = workers(n);
            // Per member: 0..4 dead (which sides know it), 4 side 1, 5 side 2, 6 neither.
            let cases = 7u64.pow(n);
            for case in 0..cases {
                let (mut one, mut two, mut knows_one, mut knows_two, mut dead) =
                    (vec![], vec![], vec![], vec![], vec![]);
                let mut c = case;
                for node in &all {
                    match c % 7 {
                        k @ 0..=3 => {
                            dead.push(node.clone());
                            if k & 1 != 0 {
                                knows_one.push(node.clone());
                            }
                            if k & 2 != 0 {
                                knows_two.push(node.clone());
                            }
                        }
                        4 => one.push(node.clone()),
                        5 => two.push(node.clone()),
                        _ => {}
                    }
                    c /= 7;
                }
                assert!(
                    !(has_quorum(&all, &knows_one, &one) && has_quorum(&all, &knows_two, &two)),
                    "{n} members, dead {dead:?}: {one:?} (knowing {knows_one:?}) and {two:?} \
                     (knowing {knows_two:?}) both passed"
                );
                let split = one.len() + two.len() + dead.len() == all.len();
                if split
                    && knows_one == dead
                    && knows_two == dead
                    && !(one.is_empty() && two.is_empty())
                {
                    assert_ne!(
                        has_quorum(&all, &dead, &one),
                        has_quorum(&all, &dead, &two),
                        "{n} members, dead {dead:?}, split into {one:?} and {two:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn survivors_whose_lost_peers_all_came_back_as_new_processes_go_on() {
        let chief_and_three = [
            NodeId::new("chief", 0),
            NodeId::new("worker", 0),
            NodeId::new("worker", 1),
            NodeId::new("worker", 2),
        ];
        let [chief, w0, w1, w2] = chief_and_three.clone();
        let (only_chief, only_w1) = ([chief.clone()], [w1.clone()]);
        // Two of four without the chief: no quorum while the other two may be alive.
        let survivors = [w0.clone(), w2];
        assert!(!has_quorum(&chief_and_three, &[], &survivors));
        // Worker 1 answered as a new process: two of the three others are a majority, and
        // the chief alone is not.
        assert!(has_quorum(&chief_and_three, &only_w1, &survivors));
        assert!(!has_quorum(&chief_and_three, &only_w1, &only_chief));
        // Both answered so: nobody else can go on.
        let replaced = [chief.clone(), w1];
        assert!(has_quorum(&chief_and_three, &replaced, &survivors));
        // A worker alone whose every peer came back so goes on too.
        let three = workers(3);
        assert!(has_quorum(&three, &three[..2], &three[2..]));
        // A replaced member answering as alive (it cannot) does not count either.
        assert!(!has_quorum(&[chief, w0], &only_chief, &only_chief));
    }

    #[test]
    fn communications_parse_from_their_names_and_print_back() {
        for (text, want) in [
            ("ring", Communication::Ring),
            ("nccl", Communication::Nccl { device: 0 }),
            ("nccl:3", Communication::Nccl { device: 3 }),
        ] {
            let got: Communication = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<Communication>().unwrap(), want);
        }
        for bad in ["", "gloo", "ring:1", "nccl:", "nccl:-1", "nccl:x", "NCCL"] {
            let err = bad.parse::<Communication>().unwrap_err();
            assert!(err.contains("expected \"ring\""), "{bad}: {err}");
        }
        assert_eq!(Communication::default(), Communication::Ring);
        assert_eq!(Communication::Ring.check(), Ok(()));
    }

    #[test]
    fn the_no_quorum_detail_names_whom_it_reached_out_of_how_many() {
        let three = workers(3);
        let text = no_quorum_detail(&three, 1, &[], &three[2..]);
        assert!(
            text.starts_with(
                "no quorum: this worker reached 1 of the 3 members of epoch 1 (worker/2)"
            ) && text.contains("exactly half with worker/0"),
            "{text}"
        );
        let text = no_quorum_detail(&three, 2, &three[..1], &three[2..]);
        assert!(
            text.starts_with(
                "no quorum: this worker reached 1 of the 2 members of epoch 2 (worker/0 not \
                 counted: answered as new processes, their old ones are gone) (worker/2)"
            ) && text.contains("exactly half with worker/1"),
            "{text}"
        );
    }
}
