//! Running a program's role in this process: which role (resolved from flags, environment,
//! `TF_CONFIG` and `cohort.toml` by [`crate::cluster::load_role_config`]), its node, its
//! actors, and how the process ends. Also `launch`, which runs a whole local cluster of the
//! same program.
//!
//! Exit codes (DESIGN §7): 0 success; 1 training error; 2 bad config, with a message naming
//! the key; 143 after SIGTERM; [`PANIC_EXIT_CODE`] (170) after a panic. A worker also exits
//! [`LOST_CHIEF_EXIT_CODE`] (75) to be
//! restarted as a new incarnation: when its chief has gone silent past the detection budget,
//! or when the chief retires it ([`Retire`]: the chief fenced that incarnation while it was
//! alive). A parameter server the chief declared dead that wakes up is retired the same way,
//! so that it comes back as a new incarnation the chief restores.
//!
//! End of a job: when the chief's program returns successfully (and no stop was requested),
//! the chief says goodbye ([`Shutdown`]) to every worker and parameter server, waiting at most
//! [`GOODBYE_WAIT`]; they exit 0 at once, which their supervisor does not restart, instead of
//! waiting out the detection budget to notice that the chief is gone. A chief that fails or
//! is preempted says nothing: its successor may reconnect to the live roles.
//!
//! Crash-only: [`run_role`] installs a panic hook (`cohort_actors::install_crash_hook`) before
//! anything else, so that a panic on any thread of a role process (an actix arbiter, a tokio
//! worker, a compute thread) logs the thread, message, location and a backtrace and ends the
//! process at once with [`PANIC_EXIT_CODE`]. actix alone would close the panicking actor's
//! mailbox and keep the process running: heartbeating and connected, refusing every call, until
//! the chief gave up on it. Its supervisor (the launcher, Kubernetes) restarts it instead as a
//! new incarnation, which the chief takes back (a parameter server is restored from the last
//! checkpoint). Panics in the user's code where the contract makes them values stay values
//! (`cohort_actors::contain_panic`): a step function's panic is that closure's error, a chief
//! program's panic exits 1, an evaluation function's panic exits 1.
//!
//! Preemption (DESIGN §5): SIGTERM (or SIGINT) is a notice, not a kill.
//! - On the chief, it sets [`preemption_requested`] (also
//!   `ClusterCoordinator::preemption_requested`); the chief's program is expected to stop
//!   scheduling, save a checkpoint and return. The process then exits 143. If the program has
//!   not returned within `preemption_grace` (default 10s), the process exits 143 without it.
//! - A parameter server or worker keeps serving after the notice while the chief is alive (so
//!   that the chief's checkpoint can read the variables and finish in-flight steps), and exits
//!   143 once the chief is gone or `preemption_grace` has passed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::System;
use cohort_actors::{DeathCause, Gateway, PeerEvent, RefusedReason, RegisterError, Remote};
use cohort_transport::NodeId;
use tokio::runtime::Handle;

use crate::roles::coordinator::{ClusterCoordinator, CoordinatorActor, Scheduler, SchedulerConfig};
use crate::roles::node::{peer, resolve, start_gateway, NodeConfig};
use crate::roles::protocol::{Retire, Shutdown, PS_ACTOR, WORKER_ACTOR};
use crate::roles::ps::{ParameterStore, PsActor, PushPanic};
use crate::roles::worker::{job_queue, run_worker_thread, PsClient, WorkerActor};
use crate::cluster::{
    load_role_config, parse_duration_in, ConfigFlags, ConfigKey, DurationRange, RoleConfig,
    StrategyKind, TaskId, TaskType, CERTS_DIR_MISSING, DEFAULT_PREEMPTION_GRACE,
};
use crate::launch::{self, LaunchConfig, LaunchOutcome, Launcher, RestartLimits};
use crate::program::Program;

/// Environment variable: failure-detection budget, e.g. `"3s"`.
pub const DETECTION_BUDGET_ENV: &str = ConfigKey::DETECTION_BUDGET.env;
/// Environment variable: how long pending work may wait with no live worker, e.g. `"60s"`.
pub const WORKER_WAIT_ENV: &str = ConfigKey::WORKER_WAIT.env;
/// Exit code after a stop request (SIGTERM/SIGINT): 128 + SIGTERM, as a shell reports it.
pub const PREEMPTED_EXIT_CODE: i32 = 143;

/// True once this process got SIGTERM or SIGINT while running a role (a preemption notice).
pub fn preemption_requested() -> bool {
    PREEMPTED.load(Ordering::SeqCst)
}

/// The configuration of the role this process runs, once [`run_role`] has resolved it.
pub fn role_config() -> Option<&'static RoleConfig> {
    ROLE_CONFIG.get()
}

/// Runs this process's role of `program`; returns the exit code (0 success, 1 training error,
/// 2 bad config, 143 stopped by SIGTERM). The role's configuration comes from `flags`, the
/// environment, `TF_CONFIG` and the config file, in that order.
///
/// This is a process entry: it first installs the crash-only panic hook, after which a panic
/// anywhere in the process (outside the user code whose panics are values) ends it with
/// [`PANIC_EXIT_CODE`]. Call it only to make this process the role, never from a test that
/// goes on afterwards.
pub fn run_role(program: Arc<Program>, flags: &ConfigFlags) -> i32 {
    cohort_actors::install_crash_hook(PANIC_EXIT_CODE);
    init_logging();
    // A setting that is present but not text is an error, not an unset value.
    if let Some(key) = non_unicode_setting() {
        eprintln!("error: bad config: {key}: the environment variable is not valid UTF-8");
        return 2;
    }
    let env = |key: &str| std::env::var(key).ok();
    let config = match load_role_config(flags, &env) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: bad config: {e}");
            return 2;
        }
    };
    if let Err(e) = config
        .cluster
        .cluster
        .require(StrategyKind::ParameterServer)
    {
        // The message starts with the key (`cluster`); say which layer the cluster came from.
        eprintln!("error: bad config: {}: {e}", config.origin("cluster"));
        return 2;
    }
    let config = ROLE_CONFIG.get_or_init(|| config);
    tracing::info!(
        "{} of {} (task from {}, cluster from {})",
        config.cluster.task,
        program.name(),
        config.origin("task.type"),
        config.origin("cluster")
    );
    let result = match (config.cluster.task.task_type, &config.certs_dir) {
        // The evaluator reads checkpoints only: no node, no certificates.
        (TaskType::Evaluator, _) => {
            crate::roles::evaluator::run_evaluator(&program, config).map_err(|e| {
                use crate::roles::evaluator::EvaluatorError;
                match e {
                    EvaluatorError::Config(e) => RoleFailure::Config(e),
                    EvaluatorError::Failed(e) => RoleFailure::Training(e),
                }
            })
        }
        // `load_role_config` requires it of every other role; kept as an error, not a panic.
        (_, None) => Err(RoleFailure::Config(format!(
            "bad config: certs_dir: {CERTS_DIR_MISSING}"
        ))),
        (task_type, Some(certs_dir)) => {
            let node = NodeConfig {
                cluster: config.cluster.clone(),
                certs_dir: certs_dir.clone(),
                epoch: config.incarnation,
                detection_budget: config.detection_budget,
            };
            match task_type {
                TaskType::Ps => run_ps(&program, &node, config),
                TaskType::Worker => run_worker(&program, &node, config),
                // The chief (the evaluator went its own way above).
                _ => run_chief(&program, &node, config),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(RoleFailure::Config(e)) => {
            eprintln!("error: {e}");
            2
        }
        Err(RoleFailure::Training(e)) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// `launch --workers N --ps M [--kill-worker-after DURATION] [--run-dir DIR]`: a local cluster
/// of this same executable; `extra_args` go to every task.
pub fn launch_from_args(args: &[String], extra_args: Vec<String>) -> i32 {
    use clap::Parser;
    let parsed = match LaunchArgs::try_parse_from(
        std::iter::once("launch".to_string()).chain(args.iter().cloned()),
    ) {
        Ok(parsed) => parsed,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() { 2 } else { 0 };
        }
    };
    launch_local(&parsed.flags, extra_args, Vec::new())
}

/// Flags of `launch`.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchFlags {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Parameter-server processes.
    #[arg(long, default_value_t = 2)]
    pub ps: u32,
    /// Evaluator processes: each evaluates every new checkpoint with the program's evaluation
    /// function (the demo's reports held-out digits accuracy).
    #[arg(long, default_value_t = 0)]
    pub evaluators: u32,
    /// SIGKILL worker 1 (or 0 with one worker) once, this long after launch, to show recovery
    /// (e.g. "20s").
    #[arg(long, value_parser = |s: &str| parse_duration_in("--kill-worker-after", s, KILL_AFTER_RANGE))]
    pub kill_worker_after: Option<Duration>,
    /// Directory for the run's certificates (default: a new temporary directory).
    #[arg(long)]
    pub run_dir: Option<std::path::PathBuf>,
    /// Failure-detection budget of every task.
    #[arg(long, default_value = "3s", value_parser = |s: &str| parse_duration_in("--detection-budget", s, detection_budget_range()))]
    pub detection_budget: Duration,
}

/// The range of `launch --detection-budget`: that of the key it sets in every task.
fn detection_budget_range() -> DurationRange {
    ConfigKey::DETECTION_BUDGET
        .duration_range()
        .unwrap_or(KILL_AFTER_RANGE)
}

#[derive(Debug, clap::Parser)]
struct LaunchArgs {
    #[command(flatten)]
    flags: LaunchFlags,
}

/// Runs a local cluster per `flags`; every task runs this executable with `task_args`.
pub fn launch_local(
    flags: &LaunchFlags,
    task_args: Vec<String>,
    mut env: Vec<(String, String)>,
) -> i32 {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot find this executable to launch its tasks: {e}");
            return 1;
        }
    };
    let run_dir = flags.run_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cohort-run-{}-{}", std::process::id(), unix_ms()))
    });
    env.push((
        DETECTION_BUDGET_ENV.into(),
        crate::cluster::format_duration(flags.detection_budget),
    ));
    // Every task shares this machine's cores: one compute thread per task beats several
    // tasks each spreading a matrix product over all cores and fighting for them.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        env.push(("RAYON_NUM_THREADS".into(), "1".into()));
    }
    let victim = TaskId::new(TaskType::Worker, u32::from(flags.workers > 1));
    let stop_grace = launched_preemption_grace(&env) + STOP_GRACE_MARGIN;
    let config = LaunchConfig {
        num_workers: flags.workers,
        num_ps: flags.ps,
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
        kill_once: flags.kill_worker_after.map(|after| (victim, after)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = launch::stop_on_signals(&stop) {
        eprintln!("warning: cannot watch for Ctrl-C/SIGTERM: {e}");
    }
    let mut launcher = match Launcher::start(config) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return if matches!(e, launch::LaunchError::Cluster(_)) {
                2
            } else {
                1
            };
        }
    };
    eprintln!(
        "[launcher] started {} parameter server(s) and {} worker(s) and the chief on 127.0.0.1 (certificates in {})",
        flags.ps,
        flags.workers,
        run_dir.join("certs").display()
    );
    let outcome = launcher.supervise(&stop);
    drop(launcher);
    if flags.run_dir.is_none() {
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    match outcome {
        Ok(LaunchOutcome::ChiefExited(code)) => code,
        // The chief's own code when it exited while stopping (143 after its preemption
        // checkpoint, anything else it returned); 143 when it had to be killed.
        Ok(LaunchOutcome::Stopped { chief }) => chief.unwrap_or(143),
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

enum RoleFailure {
    Config(String),
    Training(String),
}

fn run_ps(program: &Program, node: &NodeConfig, config: &RoleConfig) -> Result<i32, RoleFailure> {
    let system = System::new();
    let optimizer = *program.ps_optimizer();
    let epoch = node.epoch;
    let node = node.clone();
    let grace = config.preemption_grace;
    // Test-only, inert unless COHORT_FAILPOINT names it (see `PushPanic`).
    let push_panic = PushPanic::from_env().map_err(|e| RoleFailure::Config(e.to_string()))?;
    system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        let store =
            ParameterStore::new(optimizer).map_err(|e| RoleFailure::Config(e.to_string()))?;
        PsActor::start_with_failpoint(store, gateway.clone(), push_panic)
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        exit_on_goodbye(&gateway, PS_ACTOR)
            .and_then(|()| exit_when_retired(&gateway, PS_ACTOR, epoch))
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        serve_chief_then_stop(gateway, grace);
        Ok::<_, RoleFailure>(())
    })?;
    // Every stop sets its code: 75 when retired by the chief, 0 after its goodbye, 143 after
    // a stop request.
    system
        .run_with_code()
        .map_err(|e| RoleFailure::Training(e.to_string()))
}

fn run_worker(
    program: &Arc<Program>,
    node: &NodeConfig,
    config: &RoleConfig,
) -> Result<i32, RoleFailure> {
    let system = System::new();
    let servers = servers(node)?;
    let index = node.cluster.task.index;
    let epoch = node.epoch;
    let program = Arc::clone(program);
    let node = node.clone();
    let grace = config.preemption_grace;
    system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        let client = PsClient::new(gateway.clone(), Handle::current(), servers);
        let (jobs, queue) = job_queue();
        std::thread::Builder::new()
            .name(format!("worker-{index}-compute"))
            .spawn(move || run_worker_thread(program, index, epoch, client, queue))
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        WorkerActor::start(jobs, &gateway).map_err(|e| RoleFailure::Training(e.to_string()))?;
        exit_on_goodbye(&gateway, WORKER_ACTOR)
            .and_then(|()| exit_when_retired(&gateway, WORKER_ACTOR, epoch))
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        exit_when_chief_is_lost(&gateway);
        serve_chief_then_stop(gateway, grace);
        Ok::<_, RoleFailure>(())
    })?;
    // Every stop sets its code: 75 to be restarted (chief lost, or retired by it), 0 after the
    // chief's goodbye, 143 after a stop request.
    system
        .run_with_code()
        .map_err(|e| RoleFailure::Training(e.to_string()))
}

/// Ends this process with code 0 when the chief says the job is done ([`Shutdown`] to
/// `actor`). Only the chief may say so.
fn exit_on_goodbye(gateway: &Gateway, actor: &str) -> Result<(), RegisterError> {
    let chief = peer(TaskId::new(TaskType::Chief, 0));
    let system = System::current();
    gateway.register_fn::<Shutdown, _, _>(actor, move |m: Remote<Shutdown>| {
        let answer = obey_chief(&chief, &m.from.node).map(|()| {
            tracing::info!("the chief finished the job: exiting");
            exit_after_answering(system.clone(), JOB_DONE_EXIT_CODE);
        });
        async move { answer }
    })
}

/// Ends this worker or parameter server (`actor`) with [`LOST_CHIEF_EXIT_CODE`] when the chief
/// retires its incarnation `epoch` ([`Retire`]): the chief fenced it, or declared it dead,
/// while it was alive (FENCE-1), so it can do nothing useful any more, and its supervisor
/// restarts it as a new incarnation that the chief takes back (a parameter server is then
/// restored). A retirement of another incarnation is ignored.
fn exit_when_retired(gateway: &Gateway, actor: &str, epoch: u64) -> Result<(), RegisterError> {
    let chief = peer(TaskId::new(TaskType::Chief, 0));
    let system = System::current();
    gateway.register_fn::<Retire, _, _>(actor, move |m: Remote<Retire>| {
        let answer = obey_chief(&chief, &m.from.node).map(|()| {
            if m.msg.epoch == epoch {
                tracing::warn!(
                    "the chief fenced this incarnation (epoch {epoch}) while it was alive: \
                     exiting so that it restarts as a new incarnation"
                );
                exit_after_answering(system.clone(), LOST_CHIEF_EXIT_CODE);
            }
        });
        async move { answer }
    })
}

/// Whether a message that ends this process comes from the chief: no other role may end it.
fn obey_chief(chief: &NodeId, from: &NodeId) -> Result<(), RefusedReason> {
    if from == chief {
        Ok(())
    } else {
        Err(RefusedReason::NotAuthenticated(format!(
            "only {chief} may end this process, not {from}"
        )))
    }
}

/// Stops the node with `code` once its answer to the message that asked for it has had
/// [`EXIT_LINGER`] to leave.
fn exit_after_answering(system: System, code: i32) {
    tokio::spawn(async move {
        tokio::time::sleep(EXIT_LINGER).await;
        system.stop_with_code(code);
    });
}

/// A worker whose chief went silent past the detection budget exits (code
/// [`LOST_CHIEF_EXIT_CODE`]) so that its supervisor restarts it as a new incarnation. The chief
/// has fenced it meanwhile (FENCE-1): a worker that was frozen (SIGSTOP, a long pause) and
/// woke up would otherwise idle until the job ends, refused by everyone.
fn exit_when_chief_is_lost(gateway: &Gateway) {
    let mut events = gateway.subscribe();
    let chief = peer(TaskId::new(TaskType::Chief, 0));
    actix::spawn(async move {
        while let Some(event) = events.recv().await {
            if let PeerEvent::Dead {
                incarnation,
                cause: DeathCause::Silent { silent_for },
            } = event
            {
                if incarnation.node == chief {
                    if preemption_requested() {
                        // The job is ending (we were told to stop): the chief's exit is expected.
                        tracing::info!("the chief has exited: stopping");
                    } else {
                        tracing::warn!(
                            "the chief has been silent for {silent_for:?}: exiting so this worker restarts as a new incarnation"
                        );
                    }
                    System::current().stop_with_code(LOST_CHIEF_EXIT_CODE);
                    return;
                }
            }
        }
    });
}

fn run_chief(
    program: &Program,
    node: &NodeConfig,
    config: &RoleConfig,
) -> Result<i32, RoleFailure> {
    let chief = program.chief_fn().cloned().ok_or_else(|| {
        RoleFailure::Config(format!(
            "program {:?} registers no chief function",
            program.name()
        ))
    })?;
    let servers = servers(node)?;
    let workers = (0..node.cluster.cluster.num_tasks(TaskType::Worker) as u32)
        .map(|i| {
            let task = TaskId::new(TaskType::Worker, i);
            Ok((
                peer(task),
                resolve(node, task).map_err(|e| RoleFailure::Config(e.to_string()))?,
            ))
        })
        .collect::<Result<Vec<_>, RoleFailure>>()?;
    let num_workers = workers.len() as u32;
    let system = System::new();
    let scheduler_config = SchedulerConfig {
        no_worker_wait_max: config.worker_wait,
        step_timeout: config.step_timeout,
        ps_restart_wait_max: config.ps_restart_wait,
        ..SchedulerConfig::default()
    };
    let mut peers: Vec<(NodeId, std::net::SocketAddr, &'static str)> = workers
        .iter()
        .map(|(node, addr)| (node.clone(), *addr, WORKER_ACTOR))
        .collect();
    peers.extend(
        servers
            .iter()
            .map(|(node, addr)| (node.clone(), *addr, PS_ACTOR)),
    );
    let node = node.clone();
    let actor_servers = servers.clone();
    let grace = config.preemption_grace;
    let (actor, gateway, runtime, system_handle) = system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        let actor = actix::Actor::start(CoordinatorActor::new(
            gateway.clone(),
            Scheduler::new(scheduler_config),
            workers,
            actor_servers,
        ));
        on_stop_signal(move || async move {
            eprintln!(
                "[chief] stop requested (SIGTERM): the program may checkpoint for up to {}, then the process exits {PREEMPTED_EXIT_CODE}",
                crate::cluster::format_duration(grace)
            );
            tokio::time::sleep(grace).await;
            eprintln!("[chief] the program did not finish within the preemption grace; exiting without waiting for it");
            System::current().stop();
        });
        Ok::<_, RoleFailure>((actor, gateway, Handle::current(), System::current()))
    })?;
    // The chief's program runs on its own thread and blocks on the coordinator; the node's
    // actors keep running on this one until the program is done (or the grace after a stop
    // request has passed).
    let finished = Arc::new(AtomicBool::new(false));
    let program_finished = Arc::clone(&finished);
    let program_thread = std::thread::Builder::new()
        .name("chief-program".into())
        .spawn(move || {
            let mut coordinator = ClusterCoordinator::new(
                actor,
                runtime.clone(),
                gateway.clone(),
                servers,
                num_workers,
                JOIN_WAIT_MAX,
            );
            // The user's program: its panic is a training error (exit 1), not a crash.
            let outcome = cohort_actors::contain_panic(std::panic::AssertUnwindSafe(|| {
                chief(&mut coordinator)
            }));
            if matches!(outcome, Ok(Ok(()))) && !preemption_requested() {
                say_goodbye(&runtime, &gateway, peers);
            }
            program_finished.store(true, Ordering::SeqCst);
            system_handle.stop();
            outcome
        })
        .map_err(|e| RoleFailure::Training(e.to_string()))?;
    system
        .run()
        .map_err(|e| RoleFailure::Training(e.to_string()))?;
    if !finished.load(Ordering::SeqCst) {
        // Stopped by the grace timer; the program thread dies with the process.
        return Ok(PREEMPTED_EXIT_CODE);
    }
    let outcome = match program_thread.join() {
        Ok(Ok(Ok(()))) => Ok(0),
        Ok(Ok(Err(e))) => Err(RoleFailure::Training(e.to_string())),
        Ok(Err(_)) | Err(_) => Err(RoleFailure::Training("the chief's program panicked".into())),
    };
    if preemption_requested() {
        // Preempted: the exit code says so whether or not the program managed to checkpoint;
        // a failure is still reported.
        if let Err(RoleFailure::Training(e) | RoleFailure::Config(e)) = outcome {
            eprintln!("error: after the stop request: {e}");
        }
        return Ok(PREEMPTED_EXIT_CODE);
    }
    outcome
}

/// The end of a job that succeeded: tells every worker and parameter server to exit with
/// success ([`Shutdown`]), waiting at most [`GOODBYE_WAIT`] for them all. One that cannot be
/// told (down, restarting) is stopped by its supervisor with the chief, as before.
fn say_goodbye(
    runtime: &Handle,
    gateway: &Gateway,
    peers: Vec<(NodeId, std::net::SocketAddr, &'static str)>,
) {
    let calls = peers.into_iter().map(|(node, addr, actor)| {
        let gateway = gateway.clone();
        async move {
            let told = match gateway.resolve::<Shutdown>(addr, &node, actor).await {
                Ok(r) => r.call(&Shutdown).await,
                Err(e) => Err(e),
            };
            if let Err(e) = told {
                tracing::info!("could not say goodbye to {node}: {e}");
            }
        }
    });
    let all = futures::future::join_all(calls);
    if runtime
        .block_on(async { tokio::time::timeout(GOODBYE_WAIT, all).await })
        .is_err()
    {
        tracing::info!("not every task answered the goodbye within {GOODBYE_WAIT:?}");
    }
}

fn servers(
    node: &NodeConfig,
) -> Result<Vec<(cohort_transport::NodeId, std::net::SocketAddr)>, RoleFailure> {
    (0..node.cluster.cluster.num_tasks(TaskType::Ps) as u32)
        .map(|i| {
            let task = TaskId::new(TaskType::Ps, i);
            Ok((
                peer(task),
                resolve(node, task).map_err(|e| RoleFailure::Config(e.to_string()))?,
            ))
        })
        .collect()
}

/// After SIGTERM/SIGINT, sets [`preemption_requested`] and runs `then` (on the node's
/// runtime).
fn on_stop_signal<F, Fut>(then: F)
where
    F: FnOnce() -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    use tokio::signal::unix::{signal, SignalKind};
    actix::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!(
                "cannot watch for SIGTERM/SIGINT; a stop request will kill this process at once"
            );
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        PREEMPTED.store(true, Ordering::SeqCst);
        then().await;
    });
}

/// A parameter server's or worker's stop: after the notice it keeps serving while the chief is
/// alive, so that the chief can finish in-flight steps and read the variables for its
/// preemption checkpoint; it stops once the chief is gone or `grace` has passed.
fn serve_chief_then_stop(gateway: Gateway, grace: Duration) {
    on_stop_signal(move || async move {
        let chief = peer(TaskId::new(TaskType::Chief, 0));
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline
            && matches!(gateway.peer_status(&chief), Some((_, true)))
        {
            tokio::time::sleep(CHIEF_POLL).await;
        }
        tracing::info!("stop requested: stopping");
        System::current().stop_with_code(PREEMPTED_EXIT_CODE);
    });
}

/// The first configuration variable of the environment (`COHORT_*`, `TF_CONFIG`) that is set
/// but is not valid UTF-8, if any.
fn non_unicode_setting() -> Option<&'static str> {
    ConfigKey::ALL
        .iter()
        .map(|key| key.env)
        .chain([crate::cluster::TF_CONFIG_ENV])
        .find(|key| matches!(std::env::var(key), Err(std::env::VarError::NotUnicode(_))))
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

static PREEMPTED: AtomicBool = AtomicBool::new(false);
static ROLE_CONFIG: OnceLock<RoleConfig> = OnceLock::new();

/// Range of `launch --kill-worker-after`: a demo's failure comes within a day of its start.
const KILL_AFTER_RANGE: DurationRange =
    DurationRange::new(Duration::ZERO, Duration::from_secs(24 * 3600));
/// How often a stopping PS or worker looks whether the chief is still alive.
const CHIEF_POLL: Duration = Duration::from_millis(20);
/// What the launcher adds to the preemption grace before it SIGKILLs a stopping task.
const STOP_GRACE_MARGIN: Duration = Duration::from_secs(5);

/// A worker's exit code when it lost its chief or the chief retired it (its supervisor
/// restarts it as a new incarnation).
pub const LOST_CHIEF_EXIT_CODE: i32 = 75;
/// A role process's exit code after a panic (crash-only: its supervisor restarts it as a new
/// incarnation). Above 128 like a death by signal, but not 128 + any common signal (130
/// SIGINT, 134 SIGABRT, 137 SIGKILL, 139 SIGSEGV, 143 SIGTERM), so a panic is never mistaken
/// for one.
pub const PANIC_EXIT_CODE: i32 = 170;
/// A worker's or parameter server's exit code after the chief's goodbye: the job is done
/// (its supervisor does not restart it).
const JOB_DONE_EXIT_CODE: i32 = 0;
/// Bound on the chief's goodbye to every task at the end of a job.
const GOODBYE_WAIT: Duration = Duration::from_secs(2);
/// Time between answering the message that ends a process and stopping it, so that the
/// answer leaves before the endpoint closes.
const EXIT_LINGER: Duration = Duration::from_millis(100);

/// Bound on any single `join`/`fetch` wait on the chief.
const JOIN_WAIT_MAX: Duration = Duration::from_secs(3600);
