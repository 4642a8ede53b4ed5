//! Starting a process as one role of a program: which role (resolved from flags, environment,
//! `TF_CONFIG` and `cohort.toml` by [`crate::cluster::load_role_config`]), its node, its
//! actors, and how the process ends. Also `launch` (`local.rs`), which runs a whole local
//! cluster of the same program.
//!
//! This module owns the wiring of a role process, not a role's behaviour (that is
//! [`crate::roles`]) nor the process's vocabulary (exit codes, stop signals: [`crate::process`]).
//!
//! Exit codes ([`crate::process`], DESIGN §7): 0 success; 1 training error; 2 bad config, with
//! a message naming the key; 143 after SIGTERM; [`PANIC_EXIT_CODE`] (170) after a panic. Every
//! code that asks for a restart is 128 or more ([`crate::process::restart_wanted`], as
//! Kubernetes' `restartPolicy: ExitCode` reads them). A worker also exits
//! [`RETIRED_EXIT_CODE`] (171) to be restarted as a new
//! incarnation: when its chief has gone silent past the detection budget, or when the chief
//! retires it ([`Retire`]: the chief fenced that incarnation while it was alive). A parameter
//! server the chief declared dead that wakes up is retired the same way, so that it comes back
//! as a new incarnation the chief restores. The chief exits [`PS_LOST_EXIT_CODE`] (172) when its program failed because a
//! parameter server was lost for good ([`crate::roles::coordinator::ClosureFailure::PsLost`]): restarted, it resumes from
//! its last checkpoint; and when a server was lost while its start restored the servers
//! ([`CoordinatorError::ServerLostAtStart`]): restarted, it probes them and restores again.
//!
//! End of a job: when the chief's program returns successfully (and no stop was requested),
//! the chief says goodbye ([`Shutdown`]) to every worker and parameter server, waiting at most
//! `GOODBYE_WAIT`; they exit 0 at once, which their supervisor does not restart, instead of
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
//! Incarnations (FENCE-1) only grow, with no help from the supervisor: a restarted process
//! must run as a newer incarnation than its predecessor, and Kubernetes restarts a pod with
//! the same environment. An explicit `incarnation` (flag, `COHORT_INCARNATION` as `launch`
//! sets it, `cohort.toml`) wins; without one the process derives its incarnation from the wall clock
//! when it starts: milliseconds since the Unix epoch ([`incarnation_number`]). A process starts
//! after its predecessor did, at least that predecessor's lifetime later, so its incarnation is
//! larger, on the same machine or another one, as long as clocks agree to better than that
//! lifetime (NTP keeps them within milliseconds; a process lives far longer). A clock that
//! steps back further than that cannot break FENCE-1 either: a peer that knows the
//! predecessor refuses the restarted process's hello as outdated, with the incarnation it knows
//! (`RemoteError::Outdated`); the process logs it and exits
//! [`RETIRED_EXIT_CODE`] (171) to be restarted, and is
//! admitted once its clock has passed that incarnation, a wait no longer than the step itself. It is
//! never admitted as, or mistaken for, the incarnation it replaces.
//!
//! Peers are dialed by the `host:port` the cluster spec gives ([`peer_addr`]): a name is
//! resolved again on every dial, bounded in time, so a peer recreated under its name with a
//! new IP is reached there; one that does not resolve yet is an unreachable peer, retried
//! within `worker_wait` / `ps_restart_wait` like any other, not a configuration error. A
//! process binds its own port without resolving its own name. A worker or parameter server
//! that starts dials the chief at once (`register_with_chief`): a newer incarnation's hello
//! is evidence that the old one is dead, and the chief's gateway reports it dead right away
//! (`DeathCause::Superseded`) instead of after the detection budget; its closure is
//! re-dispatched, or the server restored, at once.
//!
//! Elastic workers: every worker, once connected, tells the chief it is one of the job's
//! ([`Joining`], with the address it serves on); a worker the chief's cluster spec does not name
//! joins the running job that way, and exits 2 if the chief refuses it (an index past
//! `workers_max`) or if a certificate is refused at the TLS handshake (SEC-1: not signed by the
//! cluster CA). SIGUSR1 drains a worker out of the job ([`Draining`]): the chief lets its
//! closure finish and keeps its dataset positions, then the worker exits 0, which its
//! supervisor does not restart.
//!
//! Preemption (DESIGN §5): SIGTERM (or SIGINT) is a notice, not a kill.
//! - On the chief, it sets [`preemption_requested`] (also
//!   `ClusterCoordinator::preemption_requested`); the chief's program is expected to stop
//!   scheduling, save a checkpoint and return. The process then exits 143. If the program has
//!   not returned within `preemption_grace` (default 10s), the process exits 143 without it.
//! - A worker tells the chief it is leaving ([`Leaving`]). Unless the chief is stopping too,
//!   the chief fences it and runs its closures elsewhere at once (no wait for the failure
//!   detector), and the worker exits 143 right away.
//! - A parameter server tells the chief too, and waits for the answer within three quarters of
//!   its grace: the chief takes a checkpoint cut with dispatch held before it answers (its
//!   restore then runs nothing again), and the server exits 143 at once.
//! - A task the chief asks to stay (because the chief is stopping too and its checkpoint needs
//!   the workers and servers), or that gets no answer, keeps serving after the notice while
//!   the chief is alive (so that the chief's checkpoint can read the variables and finish
//!   in-flight steps), and exits 143 once the chief is gone or `preemption_grace` has passed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use actix::System;
use cohort_actors::{DeathCause, Gateway, PeerAddr, PeerEvent, RegisterError, Remote};
use cohort_transport::NodeId;
use tokio::runtime::Handle;

use crate::cluster::{
    load_role_config, ConfigFlags, ConfigKey, RoleConfig, StrategyKind, TaskId, TaskType,
    CERTS_DIR_MISSING,
};
use crate::process::{
    on_stop_signal, preemption_requested, set_role_config, BAD_CONFIG_EXIT_CODE,
    JOB_DONE_EXIT_CODE, PANIC_EXIT_CODE, PREEMPTED_EXIT_CODE, PS_LOST_EXIT_CODE, RETIRED_EXIT_CODE,
    TRAINING_ERROR_EXIT_CODE,
};
use crate::roles::coordinator::{
    ClusterCoordinator, CoordinatorActor, CoordinatorError, JoinedWorkers, Scheduler,
    SchedulerConfig, Topology,
};
use crate::roles::node::{peer, peer_addr, start_gateway, NodeConfig};
use crate::roles::protocol::{
    DrainRefusal, Draining, Joining, LeaveAnswer, Leaving, Retire, Shutdown, COORDINATOR_ACTOR,
    PS_ACTOR, WORKER_ACTOR,
};
use crate::roles::ps::{ParameterStore, PsActor, PushPanic};
use crate::roles::ps_client::PsClient;
use crate::roles::registry::Program;
use crate::roles::worker::{job_queue, run_worker_thread, Exit, WorkerActor, WorkerMachine};

mod local;
pub(crate) mod logging;
mod multi_worker;

pub(crate) use logging::init as init_logging;
pub use logging::LOG_FORMAT_ENV;
mod metrics;

pub(crate) use local::LaunchArgs;
pub use local::{
    launch_from_args, launch_help, launch_local, launch_program, launch_program_from_args,
    LaunchFlags, WorkerCount, WorkerCountError, DEFAULT_PS, DEFAULT_WORKERS, DETECTION_BUDGET_ENV,
    WORKER_WAIT_ENV,
};
pub use multi_worker::{
    launch_multi_worker_program, multi_worker_config_from_env, multi_worker_main, MultiWorkerTask,
    TaskConfigError, COMMUNICATION_ENV,
};

/// Runs this process's role of `program`; returns the exit code (0 success, 1 training error,
/// 2 bad config, 143 stopped by SIGTERM, 171 retired, 172 the chief lost a parameter server for
/// good; the table is in [`crate::process`]). The role's configuration comes from `flags`, the
/// environment, `TF_CONFIG` and the config file, in that order.
///
/// This is a process entry: it first installs the crash-only panic hook, after which a panic
/// anywhere in the process (outside the user code whose panics are values) ends it with
/// [`PANIC_EXIT_CODE`]. Call it only to make this process the role, never from a test that
/// goes on afterwards.
pub fn run_role(program: Arc<Program>, flags: &ConfigFlags) -> i32 {
    cohort_actors::install_crash_hook(PANIC_EXIT_CODE);
    if let Err(e) = logging::init() {
        // No subscriber to report through.
        eprintln!("error: bad config: {e}");
        return BAD_CONFIG_EXIT_CODE;
    }
    // A setting that is present but not text is an error, not an unset value.
    if let Some(key) = non_unicode_setting() {
        tracing::error!("bad config: {key}: the environment variable is not valid UTF-8");
        return BAD_CONFIG_EXIT_CODE;
    }
    let env = |key: &str| std::env::var(key).ok();
    let config = match load_role_config(flags, &env) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("bad config: {e}");
            return BAD_CONFIG_EXIT_CODE;
        }
    };
    if refuses_job(&program, &config) {
        return BAD_CONFIG_EXIT_CODE;
    }
    let config = set_role_config(config);
    let incarnation = incarnation_number(config.incarnation, SystemTime::now());
    logging::set_task(
        config.cluster.task.task_type.as_str(),
        config.cluster.task.index,
        incarnation,
    );
    tracing::info!(
        "{} of {} (task from {}, cluster from {}; {})",
        config.cluster.task,
        program.name(),
        config.origin("task.type"),
        config.origin("cluster"),
        crate::process::describe_compute_threads()
    );
    let result = match (config.cluster.task.task_type, &config.certs_dir) {
        // The evaluator reads checkpoints only: no node, no certificates.
        (TaskType::Evaluator, _) => {
            metrics::start(config, crate::metrics::Role::Evaluator, incarnation, None).and_then(
                |()| {
                    crate::roles::evaluator::run_evaluator(&program, config).map_err(|e| {
                        use crate::roles::evaluator::EvaluatorError;
                        match e {
                            EvaluatorError::Config(e) => RoleFailure::Config(e),
                            EvaluatorError::Failed(e) => RoleFailure::Training(e),
                        }
                    })
                },
            )
        }
        // `load_role_config` requires it of every other role; kept as an error, not a panic.
        (_, None) => Err(RoleFailure::Config(format!(
            "bad config: certs_dir: {CERTS_DIR_MISSING}"
        ))),
        (task_type, Some(certs_dir)) => {
            let node = NodeConfig {
                cluster: config.cluster.clone(),
                certs_dir: certs_dir.clone(),
                incarnation,
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
            tracing::error!("{e}");
            BAD_CONFIG_EXIT_CODE
        }
        Err(RoleFailure::Training(e)) => {
            tracing::error!("{e}");
            TRAINING_ERROR_EXIT_CODE
        }
    }
}

/// Whether this role refuses the job before it starts (logging why): a parameter-server job
/// needs servers in its cluster, and its program's server settings must serve. An evaluator
/// reads checkpoints only: it serves a MultiWorkerMirrored job (no parameter server) as well
/// as a parameter-server one, and needs neither.
fn refuses_job(program: &Program, config: &RoleConfig) -> bool {
    if config.cluster.task.task_type == TaskType::Evaluator {
        return false;
    }
    if let Err(e) = config
        .cluster
        .cluster
        .require(StrategyKind::ParameterServer)
    {
        // The message starts with the key (`cluster`); say which layer the cluster came from.
        tracing::error!("bad config: {}: {e}", config.origin("cluster"));
        return true;
    }
    // Every role, not the servers alone: a chief over servers that cannot start would wait.
    if let Err(e) = program.check_ps_settings() {
        tracing::error!("bad config: program {}: {e}", program.name());
        return true;
    }
    false
}

enum RoleFailure {
    Config(String),
    Training(String),
}

fn run_ps(program: &Program, node: &NodeConfig, config: &RoleConfig) -> Result<i32, RoleFailure> {
    let system = System::new();
    let optimizer = *program.ps_optimizer();
    let schedule = program.ps_learning_rate_schedule().cloned();
    let scopes = program.ps_optimizer_scopes().clone();
    let incarnation = node.incarnation;
    let node = node.clone();
    let grace = config.preemption_grace;
    let register_wait = config.ps_restart_wait;
    // Test-only, inert unless COHORT_FAILPOINT names it (see `PushPanic`).
    let push_panic = PushPanic::from_env().map_err(|e| RoleFailure::Config(e.to_string()))?;
    system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        let mut store = ParameterStore::new(optimizer)
            .map_err(|e| RoleFailure::Config(e.to_string()))?
            .with_incarnation(incarnation)
            .with_optimizer_scopes(scopes)
            .map_err(|e| RoleFailure::Config(e.to_string()))?;
        if let Some(schedule) = schedule {
            store = store
                .with_schedule(schedule)
                .map_err(|e| RoleFailure::Config(e.to_string()))?;
        }
        let ps = PsActor::start_with_failpoint(store, gateway.clone(), push_panic)
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        metrics::count_detections(&gateway);
        metrics::start(
            config,
            crate::metrics::Role::Ps,
            incarnation,
            Some(metrics::ps_refresh(ps)),
        )?;
        exit_on_goodbye(&gateway, PS_ACTOR, || Some(Exit::job_done()))
            .and_then(|()| {
                exit_when_retired(&gateway, PS_ACTOR, move |retired| {
                    (retired == incarnation).then(|| Exit::retired(incarnation))
                })
            })
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        exit_when_outdated(&gateway);
        join_the_job(&gateway, &node, register_wait)?;
        ps_exits_without_a_chief_or_when_drained(&gateway, register_wait, incarnation);
        // The workers too: those that called this server's predecessor (killed, its
        // connections left open) would otherwise wait for them to idle out before their
        // closures fail and the chief's recovery can restore this incarnation.
        for worker in 0..node.cluster.cluster.num_tasks(TaskType::Worker) as u32 {
            say_hello(
                &gateway,
                &node,
                TaskId::new(TaskType::Worker, worker),
                node.detection_budget,
                None,
            )?;
        }
        // The chief answers once it has taken a checkpoint cut with dispatch held (or gave up
        // on one): leaving then loses nothing. Asked within most of the grace, so that a
        // server not answered still serves the chief to its end.
        let leave = LeaveAsk {
            incarnation,
            settle: LEAVE_SETTLE.min(grace / 8),
            bound: grace.mul_f64(PS_LEAVE_ASK_SHARE),
            decide: Box::new(|answer| {
                (answer == LeaveAnswer::Go).then(|| Exit {
                    reason: "preemption notice: the chief took its checkpoint cut; leaving".into(),
                    ..Exit::preempted()
                })
            }),
        };
        serve_chief_then_stop(
            gateway,
            grace,
            || {},
            Some(leave),
            || Some(Exit::preempted()),
        );
        Ok::<_, RoleFailure>(())
    })?;
    // Every stop sets its code: 171 when retired by the chief, 0 after its goodbye, 143 after
    // a stop request.
    system
        .run_with_code()
        .map_err(|e| RoleFailure::Training(e.to_string()))
}

/// The chief's run report for `cohort chaos run` ([`crate::run_report`]), where one is asked
/// for and the program wrote none itself: the ledger and the servers' counts of any program,
/// a user's or a Python script's, read before the servers are told goodbye, and whether it
/// resumed from a checkpoint (a restarted chief, which restored the servers there).
fn report_the_end(coordinator: &ClusterCoordinator) {
    if !crate::run_report::asked() || crate::run_report::written() {
        return;
    }
    match (coordinator.ledger(), coordinator.ps_stats()) {
        (Ok(ledger), Ok(stats)) => {
            crate::run_report::write_report(&crate::run_report::TaskReport {
                resumed: coordinator.resumed(),
                ..crate::run_report::chief_report(
                    &ledger,
                    stats.iter().map(|s| (s.applied, s.rejected_duplicate)),
                )
            })
        }
        (Err(e), _) | (_, Err(e)) => tracing::warn!("run report not written: {e}"),
    }
}

/// A server's exits without a chief and on a drain: it keeps its variables through a chief's
/// restart (the new chief restores them from its checkpoint either way) and exits, to restart
/// as a new incarnation, with no chief for `register_wait`; drained (its variables moved onto
/// the other servers by the chief), it leaves the job, and refused or unanswered it serves on.
fn ps_exits_without_a_chief_or_when_drained(
    gateway: &Gateway,
    register_wait: Duration,
    incarnation: u64,
) {
    // A server keeps its variables through a chief's restart (the new chief restores them
    // from its checkpoint either way); with no chief for `ps_restart_wait` it exits.
    exit_without_a_chief(
        gateway,
        register_wait,
        |cause| {
            tracing::warn!(
                "the chief was declared dead ({cause:?}): waiting for a new chief incarnation"
            );
            None
        },
        |waited| {
            Some(Exit {
                code: RETIRED_EXIT_CODE,
                reason: format!(
                    "no new chief within {waited:?} of losing the chief: exiting so that \
                     this server restarts as a new incarnation"
                ),
            })
        },
        |waited| {
            Some(Exit {
                code: RETIRED_EXIT_CODE,
                reason: format!(
                    "no chief answered within {waited:?} of this server's start: exiting \
                     so that it restarts as a new incarnation"
                ),
            })
        },
    );
    drain_on_signal(gateway, incarnation, TaskType::Ps, |answer| match answer {
        Some(Ok(())) => Some(Exit {
            code: JOB_DONE_EXIT_CODE,
            reason: "drained: the chief moved this server's variables onto the other \
                     servers; leaving the job"
                .into(),
        }),
        Some(Err(refusal)) => {
            tracing::warn!("not drained, serving on: {refusal}");
            None
        }
        None => {
            tracing::warn!(
                "not drained (the chief did not answer), serving on: leaving now \
                 would lose the variables it holds"
            );
            None
        }
    });
}

fn run_worker(
    program: &Arc<Program>,
    node: &NodeConfig,
    config: &RoleConfig,
) -> Result<i32, RoleFailure> {
    let system = System::new();
    let servers = servers(node)?;
    let index = node.cluster.task.index;
    let incarnation = node.incarnation;
    let program = Arc::clone(program);
    let node = node.clone();
    let grace = config.preemption_grace;
    let register_wait = config.worker_wait;
    let replicas = config.replicas as usize;
    system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        let num_servers = servers.len() as u32;
        let client = PsClient::new(gateway.clone(), Handle::current(), servers);
        let (jobs, queue) = job_queue();
        // The worker's decisions; the compute thread, the actor and the handlers below carry
        // them out.
        let machine = Arc::new(Mutex::new(WorkerMachine::new(
            index,
            incarnation,
            num_servers,
        )));
        let compute_machine = Arc::clone(&machine);
        std::thread::Builder::new()
            .name(format!("worker-{index}-compute"))
            .spawn(move || run_worker_thread(program, compute_machine, client, replicas, queue))
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        WorkerActor::start(jobs, Arc::clone(&machine), &gateway)
            .map_err(|e| RoleFailure::Training(e.to_string()))?;
        metrics::count_detections(&gateway);
        metrics::start(config, crate::metrics::Role::Worker, incarnation, None)?;
        let decide = |f: fn(&mut WorkerMachine) -> Option<Exit>| {
            let machine = Arc::clone(&machine);
            move || f(&mut machine.lock().unwrap_or_else(PoisonError::into_inner))
        };
        let retiring = Arc::clone(&machine);
        exit_on_goodbye(
            &gateway,
            WORKER_ACTOR,
            decide(|m| m.handle_goodbye(Instant::now())),
        )
        .and_then(|()| {
            exit_when_retired(&gateway, WORKER_ACTOR, move |retired| {
                retiring
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .handle_retire(Instant::now(), retired)
            })
        })
        .map_err(|e| RoleFailure::Training(e.to_string()))?;
        exit_when_outdated(&gateway);
        join_the_job(&gateway, &node, register_wait)?;
        let draining = Arc::clone(&machine);
        drain_on_signal(&gateway, incarnation, TaskType::Worker, move |answer| {
            draining
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .handle_drained(Instant::now(), matches!(answer, Some(Ok(()))))
        });
        worker_exits_without_a_chief(&gateway, register_wait, &machine);
        let noticing = Arc::clone(&machine);
        let leaving = Arc::clone(&machine);
        serve_chief_then_stop(
            gateway,
            grace,
            move || {
                noticing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .handle_preemption_notice(Instant::now())
            },
            Some(LeaveAsk {
                incarnation,
                // As a server's: a chief stopping at the same moment keeps its workers to
                // finish its steps (it answers `Stay`); meanwhile the closure runs on.
                settle: LEAVE_SETTLE.min(grace / 8),
                bound: LEAVE_ASK_MAX.min(grace / 2),
                decide: Box::new(move |answer| {
                    leaving
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .handle_leave_answer(Instant::now(), answer)
                }),
            }),
            decide(|m| m.handle_preemption_over(Instant::now())),
        );
        Ok::<_, RoleFailure>(())
    })?;
    // Every stop sets its code: 171 to be restarted (chief lost, or retired by it), 0 after
    // the chief's goodbye, 143 after a stop request.
    system
        .run_with_code()
        .map_err(|e| RoleFailure::Training(e.to_string()))
}

/// A worker's exits without a chief, as its machine decides: when the chief is lost, when the
/// wait for a new one is over, and when none answered since the worker's start.
fn worker_exits_without_a_chief(
    gateway: &Gateway,
    register_wait: Duration,
    machine: &Arc<Mutex<WorkerMachine>>,
) {
    let losing = Arc::clone(machine);
    let waiting = Arc::clone(machine);
    let unanswered = Arc::clone(machine);
    exit_without_a_chief(
        gateway,
        register_wait,
        move |cause| {
            losing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .handle_chief_lost(Instant::now(), cause)
        },
        move |waited| {
            waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .handle_chief_wait_over(Instant::now(), waited)
        },
        move |waited| {
            unanswered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .handle_no_chief(Instant::now(), waited)
        },
    );
}

/// Ends this process when the chief says the job is done ([`Shutdown`] to `actor`), as
/// `decide` says (code 0; nothing when an exit is under way already). Only the chief may say
/// so: the gateway refuses the message from any other role before this handler runs (SEC-2,
/// [`Shutdown`]'s `SENDERS`).
fn exit_on_goodbye(
    gateway: &Gateway,
    actor: &str,
    decide: impl Fn() -> Option<Exit> + Send + Sync + 'static,
) -> Result<(), RegisterError> {
    let system = System::current();
    gateway.register_fn::<Shutdown, _, _>(actor, move |_: Remote<Shutdown>| {
        if let Some(exit) = decide() {
            tracing::info!("{}", exit.reason);
            exit_after_answering(system.clone(), exit.code);
        }
        async { Ok(()) }
    })
}

/// Ends this worker or parameter server (`actor`) as `decide` says when the chief retires an
/// incarnation ([`Retire`]): for its own,
/// [`RETIRED_EXIT_CODE`]. The chief fenced it, or
/// declared it dead, while it was alive (FENCE-1), so it can do nothing useful any more, and
/// its supervisor restarts it as a new incarnation that the chief takes back (a parameter
/// server is then restored). A retirement of another incarnation is ignored. Only the chief
/// may retire: the gateway refuses the message from any other role (SEC-2, [`Retire`]'s
/// `SENDERS`).
fn exit_when_retired(
    gateway: &Gateway,
    actor: &str,
    decide: impl Fn(u64) -> Option<Exit> + Send + Sync + 'static,
) -> Result<(), RegisterError> {
    let system = System::current();
    gateway.register_fn::<Retire, _, _>(actor, move |m: Remote<Retire>| {
        if let Some(exit) = decide(m.msg.incarnation) {
            tracing::warn!("{}", exit.reason);
            exit_after_answering(system.clone(), exit.code);
        }
        async { Ok(()) }
    })
}

/// Stops the node with `code` once its answer to the message that asked for it has had
/// [`EXIT_LINGER`] to leave.
fn exit_after_answering(system: System, code: i32) {
    tokio::spawn(async move {
        tokio::time::sleep(EXIT_LINGER).await;
        system.stop_with_code(code);
    });
}

/// A worker or parameter server without a chief: every wait for one is bounded, so that a
/// task whose chief is gone for good (or never started) exits to its supervisor instead of
/// waiting forever.
///
/// - Its chief incarnation declared dead (silent past the detection budget, its address
///   refusing connections as after a SIGKILL, or its exit reported; not superseded by a newer
///   one, which takes the task over): `lost` decides first (a worker told to stop exits at
///   once). Otherwise the task waits `wait` (`worker_wait` / `ps_restart_wait`) for a new
///   chief incarnation, and exits as `wait_over` says if none is alive by then.
/// - No chief heard from at all within `wait` of the task's start: it exits as `never` says.
///
/// The exits are code [`RETIRED_EXIT_CODE`], so that the
/// supervisor restarts the task as a new incarnation, which waits for a chief again. A worker
/// the chief fenced while the two could not hear each other is retired by the chief when it is
/// dialled again (FENCE-1).
fn exit_without_a_chief(
    gateway: &Gateway,
    wait: Duration,
    lost: impl Fn(DeathCause) -> Option<Exit> + 'static,
    wait_over: impl Fn(Duration) -> Option<Exit> + Clone + 'static,
    never: impl FnOnce(Duration) -> Option<Exit> + 'static,
) {
    let chief = peer(TaskId::new(TaskType::Chief, 0));
    let stop = |exit: Exit| {
        tracing::warn!("{}", exit.reason);
        System::current().stop_with_code(exit.code);
    };
    {
        let (gateway, chief) = (gateway.clone(), chief.clone());
        actix::spawn(async move {
            tokio::time::sleep(wait).await;
            if gateway.peer_status(&chief).is_none() {
                if let Some(exit) = never(wait) {
                    stop(exit);
                }
            }
        });
    }
    let mut events = gateway.subscribe();
    let gateway = gateway.clone();
    actix::spawn(async move {
        while let Some(event) = events.recv().await {
            let PeerEvent::Dead { incarnation, cause } = event else {
                continue;
            };
            if incarnation.node != chief || cause == DeathCause::Superseded {
                continue;
            }
            if let Some(exit) = lost(cause) {
                stop(exit);
                return;
            }
            // Waiting for a new chief incarnation to take this task back, within `wait`.
            let (wait_over, gateway, chief) = (wait_over.clone(), gateway.clone(), chief.clone());
            actix::spawn(async move {
                tokio::time::sleep(wait).await;
                let newer_alive = matches!(
                    gateway.peer_status(&chief),
                    Some((seen, true)) if seen > incarnation.incarnation
                );
                if !newer_alive {
                    if let Some(exit) = wait_over(wait) {
                        stop(exit);
                    }
                }
            });
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
    let step_names: Vec<String> = program.step_names().map(str::to_string).collect();
    let servers = servers(node)?;
    let workers = peers_of(node, TaskType::Worker)?;
    let num_workers = workers.len() as u32;
    // Elastic workers: the job's input pipelines, and the bound on a joiner's index.
    let workers_max = config.workers_max;
    let system = System::new();
    let scheduler_config = SchedulerConfig {
        no_worker_wait_max: config.worker_wait,
        step_timeout: config.step_timeout,
        ps_restart_wait_max: config.ps_restart_wait,
        ..SchedulerConfig::default()
    };
    let peers = spec_peers(&workers, &servers);
    let node = node.clone();
    let actor_servers = servers.clone();
    let grace = config.preemption_grace;
    let checkpoint_dir = config.checkpoint_dir.clone();
    let job = program.name().to_string();
    let (actor, gateway, runtime, system_handle) = system.block_on(async move {
        let gateway = start_gateway(&node).map_err(|e| RoleFailure::Config(e.to_string()))?;
        exit_when_outdated(&gateway);
        let actor = actix::Actor::start(CoordinatorActor::new(
            gateway.clone(),
            Scheduler::new(scheduler_config)
                .with_checkpoint_dir(checkpoint_dir)
                .with_workers_max(workers_max),
            workers,
            actor_servers,
        ));
        metrics::count_detections(&gateway);
        hear_exit_reports(config, &gateway)?;
        let rate = metrics::chief_rate(actor.clone());
        metrics::start_with_status(
            config,
            crate::metrics::Role::Chief,
            node.incarnation,
            Some(metrics::chief_refresh(actor.clone(), Arc::clone(&rate))),
            Some(metrics::chief_status(actor.clone(), job, rate)),
        )?;
        stop_after_grace(actor.clone(), grace);
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
            let members = actor.clone();
            let mut coordinator = ClusterCoordinator::new(
                actor,
                runtime.clone(),
                gateway.clone(),
                servers,
                num_workers,
                JOIN_WAIT_MAX,
            )
            .with_registered_steps(step_names.iter().map(String::as_str));
            // The user's program: its panic is a training error (exit 1), not a crash.
            let outcome = cohort_actors::contain_panic(std::panic::AssertUnwindSafe(|| {
                chief(&mut coordinator)
            }));
            if matches!(outcome, Ok(Ok(()))) {
                report_the_end(&coordinator);
                if !preemption_requested() {
                    say_goodbye(&runtime, &gateway, with_joined(&runtime, &members, peers));
                }
            }
            program_finished.store(true, Ordering::SeqCst);
            system_handle.stop();
            outcome
        })
        .map_err(|e| RoleFailure::Training(e.to_string()))?;
    let code = system
        .run_with_code()
        .map_err(|e| RoleFailure::Training(e.to_string()))?;
    chief_code(code, &finished, program_thread)
}

/// The chief's exit code once its node's system stopped with `code`: the program's outcome
/// where the program `finished`.
fn chief_code(
    code: i32,
    finished: &AtomicBool,
    program_thread: std::thread::JoinHandle<
        Result<Result<(), CoordinatorError>, Box<dyn std::any::Any + Send>>,
    >,
) -> Result<i32, RoleFailure> {
    if code != 0 {
        // The node ended itself (a peer refused this incarnation as outdated: declared dead
        // while it was frozen, say): restart me, as a newer incarnation that resumes from the
        // last checkpoint.
        return Ok(code);
    }
    if !finished.load(Ordering::SeqCst) {
        // Stopped by the grace timer; the program thread dies with the process.
        return Ok(PREEMPTED_EXIT_CODE);
    }
    chief_exit(program_thread.join())
}

/// The cluster spec's `workers` and `servers`, each with the actor it runs: whom the chief's
/// goodbye is for.
fn spec_peers(
    workers: &[(NodeId, PeerAddr)],
    servers: &[(NodeId, PeerAddr)],
) -> Vec<(NodeId, PeerAddr, &'static str)> {
    let workers = workers
        .iter()
        .map(|(node, addr)| (node.clone(), addr.clone(), WORKER_ACTOR));
    let servers = servers
        .iter()
        .map(|(node, addr)| (node.clone(), addr.clone(), PS_ACTOR));
    workers.chain(servers).collect()
}

/// `peers` (the cluster spec's workers and servers, with the actor each runs) and every
/// worker and server that joined the running job since: all that hear the chief's goodbye.
fn with_joined(
    runtime: &Handle,
    members: &actix::Addr<CoordinatorActor>,
    peers: Vec<(NodeId, PeerAddr, &'static str)>,
) -> Vec<(NodeId, PeerAddr, &'static str)> {
    // Workers that joined the running job hear it too.
    let mut peers = peers;
    if let Ok(joined) = runtime.block_on(members.send(JoinedWorkers)) {
        peers.extend(
            joined
                .into_iter()
                .map(|(node, addr)| (node, addr, WORKER_ACTOR)),
        );
    }
    // And servers that joined it.
    if let Ok(topology) = runtime.block_on(members.send(Topology)) {
        for (node, addr) in topology.servers.into_values() {
            if !peers.iter().any(|(known, _, _)| *known == node) {
                peers.push((node, addr, PS_ACTOR));
            }
        }
    }
    peers
}

/// The chief's exit code, or its failure, from how its program's thread ended (`joined`).
/// Preempted, the code says so whether or not the program managed to checkpoint (a failure
/// is still reported).
fn chief_exit(
    joined: std::thread::Result<
        Result<Result<(), CoordinatorError>, Box<dyn std::any::Any + Send>>,
    >,
) -> Result<i32, RoleFailure> {
    let outcome = match joined {
        Ok(Ok(Ok(()))) => Ok(JOB_DONE_EXIT_CODE),
        // Not the program's fault: a restarted chief resumes from its checkpoint (restart me).
        // So is a server lost while the start restored it: a restarted chief restores again.
        Ok(Ok(Err(e))) if e.restart_wanted().is_some() => {
            tracing::error!(
                "{e}; exiting {PS_LOST_EXIT_CODE} so that a restarted chief resumes from the last checkpoint"
            );
            Ok(PS_LOST_EXIT_CODE)
        }
        // Bad input (the warm-start file or its name map), found before training: exit 2.
        Ok(Ok(Err(e @ CoordinatorError::WarmStart(_)))) => Err(RoleFailure::Config(e.to_string())),
        Ok(Ok(Err(e))) => Err(RoleFailure::Training(e.to_string())),
        Ok(Err(_)) | Err(_) => Err(RoleFailure::Training("the chief's program panicked".into())),
    };
    if preemption_requested() {
        if let Err(RoleFailure::Training(e) | RoleFailure::Config(e)) = outcome {
            tracing::error!("after the stop request: {e}");
        }
        return Ok(PREEMPTED_EXIT_CODE);
    }
    outcome
}

/// On a stop request (SIGTERM): tells the coordinator (a server's preemption cut under way
/// gives way to the program's own checkpoint), and stops the node after `grace` if the
/// program has not finished by then.
fn stop_after_grace(stopping: actix::Addr<CoordinatorActor>, grace: Duration) {
    on_stop_signal(move || async move {
        tracing::info!(
            "stop requested (SIGTERM): the program may checkpoint for up to {}, then the process exits {PREEMPTED_EXIT_CODE}",
            crate::cluster::format_duration(grace)
        );
        // A server's preemption cut under way gives way to the program's own checkpoint.
        stopping.do_send(crate::roles::coordinator::ChiefStopping);
        tokio::time::sleep(grace).await;
        tracing::warn!("the program did not finish within the preemption grace; exiting without waiting for it");
        System::current().stop();
    });
}

/// The end of a job that succeeded: tells every worker and parameter server to exit with
/// success ([`Shutdown`]), waiting at most [`GOODBYE_WAIT`] for them all. One that cannot be
/// told (down, restarting) is stopped by its supervisor with the chief, as before.
fn say_goodbye(runtime: &Handle, gateway: &Gateway, peers: Vec<(NodeId, PeerAddr, &'static str)>) {
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

fn servers(node: &NodeConfig) -> Result<Vec<(NodeId, PeerAddr)>, RoleFailure> {
    peers_of(node, TaskType::Ps)
}

/// Every task of `task_type`, with where to dial it (names are resolved on every dial, not
/// here).
fn peers_of(
    node: &NodeConfig,
    task_type: TaskType,
) -> Result<Vec<(NodeId, PeerAddr)>, RoleFailure> {
    (0..node.cluster.cluster.num_tasks(task_type) as u32)
        .map(|i| {
            let task = TaskId::new(task_type, i);
            let addr = peer_addr(node, task).map_err(|e| RoleFailure::Config(e.to_string()))?;
            Ok((peer(task), addr))
        })
        .collect()
}

// A process's incarnation (here in `process`, below every role and strategy that
// needs it).
pub use crate::process::incarnation_number;

/// Chief: when `supervisor_socket` is set, binds it and declares dead at once each task
/// incarnation its supervisor reports exited ([`crate::process::ExitReports`]), as the
/// silence budget would later. A socket that cannot be bound is a configuration error
/// naming the key.
fn hear_exit_reports(config: &RoleConfig, gateway: &Gateway) -> Result<(), RoleFailure> {
    let Some(path) = &config.supervisor_socket else {
        return Ok(());
    };
    let reports = crate::process::ExitReports::bind(path).map_err(|e| {
        RoleFailure::Config(format!(
            "bad config: {}: supervisor_socket: {e}",
            config.origin("supervisor_socket")
        ))
    })?;
    let gateway = gateway.clone();
    tokio::spawn(async move {
        while let Ok(report) = reports.next().await {
            let incarnation = cohort_actors::Incarnation::new(
                crate::cluster::node_id(report.task),
                cohort_actors::IncarnationId(report.incarnation),
            );
            if gateway.report_dead(&incarnation) {
                tracing::info!(
                    "{} (incarnation {}) exited, as its supervisor reports: declared dead now",
                    report.task,
                    report.incarnation
                );
            } else {
                tracing::debug!(
                    "{} (incarnation {}) exited, as its supervisor reports (not the live incarnation: \
                     nothing to do)",
                    report.task,
                    report.incarnation
                );
            }
        }
    });
    Ok(())
}

/// Dials the chief from a worker or parameter server that just started, retrying until it
/// answers (at most `wait`: its `worker_wait` or `ps_restart_wait`, as long as the chief
/// would wait for it; the chief also dials every task of its cluster spec itself). The hello
/// tells the chief's gateway of this incarnation at once, which reports a predecessor still
/// believed alive dead then (superseded), not after the detection budget.
///
/// A worker then says it is one of the job's (`joining`, [`Joining`]): the chief dials a
/// worker its cluster spec does not name at the address given there (elastic workers).
/// Permanent refusals end the process with [`BAD_CONFIG_EXIT_CODE`] and a message saying what
/// is wrong: the chief refused this node's certificate at the TLS handshake, or it refused
/// this node's own (SEC-1: a certificate not signed by the cluster CA), or the chief refused
/// the worker's join (its index is past the job's `workers_max`).
fn register_with_chief(
    gateway: &Gateway,
    node: &NodeConfig,
    wait: Duration,
    joining: Option<Joining>,
) -> Result<(), RoleFailure> {
    say_hello(
        gateway,
        node,
        TaskId::new(TaskType::Chief, 0),
        wait,
        joining,
    )
}

/// A worker or parameter server says it is one of the job's ([`Joining`], with the address
/// it serves on) to the chief it finds at its start and to every chief after it: one the
/// chief's cluster spec does not name joins the running job this way (elastic workers and
/// servers); for one it names this changes nothing.
fn join_the_job(gateway: &Gateway, node: &NodeConfig, wait: Duration) -> Result<(), RoleFailure> {
    let addr = crate::roles::node::peer_addr(node, node.cluster.task)
        .map_err(|e| RoleFailure::Config(e.to_string()))?
        .to_string();
    let joining = Joining {
        incarnation: node.incarnation,
        addr,
    };
    register_with_chief(gateway, node, wait, Some(joining.clone()))?;
    join_every_new_chief(gateway, node, wait, joining);
    Ok(())
}

/// Says `joining` again to every newer chief incarnation (a chief restarted by its supervisor
/// knows only its own cluster spec, and dials only the tasks it names): once the chief this
/// node knew is declared dead, the node dials the chief's address until a new incarnation
/// answers (within `wait`, as at its start) and registers with it, so that a worker or server
/// that joined the running job is taken back at once. A task the new chief's spec names
/// changes nothing there. A refusal is logged (the task serves on; its supervisor or
/// operator decides).
fn join_every_new_chief(gateway: &Gateway, node: &NodeConfig, wait: Duration, joining: Joining) {
    let mut events = gateway.subscribe();
    let chief_task = TaskId::new(TaskType::Chief, 0);
    let chief = peer(chief_task);
    let gateway = gateway.clone();
    let node = node.clone();
    actix::spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                PeerEvent::Dead { incarnation, .. } if incarnation.node == chief => {
                    tracing::info!(
                        "{incarnation} is gone: registering with the next chief when it answers"
                    );
                    if let Err(RoleFailure::Config(e) | RoleFailure::Training(e)) =
                        say_hello(&gateway, &node, chief_task, wait, Some(joining.clone()))
                    {
                        tracing::warn!("cannot register with a new chief: {e}");
                    }
                }
                _ => continue,
            }
        }
    });
}

/// Says hello to `task` as this process starts, trying again within `wait` while it is not
/// reachable: a peer that knew this node's previous incarnation learns at once that it is
/// gone (its link to it is closed, and calls pending on it fail now rather than when the
/// connection idles out). With `joining` (a worker's hello to the chief), the hello is
/// followed by the worker's [`Joining`] (see [`register_with_chief`]).
fn say_hello(
    gateway: &Gateway,
    node: &NodeConfig,
    task: TaskId,
    wait: Duration,
    joining: Option<Joining>,
) -> Result<(), RoleFailure> {
    let addr = peer_addr(node, task).map_err(|e| RoleFailure::Config(e.to_string()))?;
    let target = peer(task);
    let gateway = gateway.clone();
    let pause = node.detection_budget / 4;
    actix::spawn(async move {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match gateway.connect(addr.clone(), &target).await {
                Ok(incarnation) => {
                    let Some(joining) = &joining else {
                        tracing::info!("said hello to {incarnation}");
                        return;
                    };
                    let reference = gateway.remote_ref::<Joining>(incarnation, COORDINATOR_ACTOR);
                    match reference.call(joining).await {
                        Ok(Ok(())) => {
                            tracing::info!(
                                "registered with {} as one of its tasks",
                                reference.target()
                            );
                            return;
                        }
                        Ok(Err(refusal)) => {
                            tracing::error!("bad config: the chief refused this task: {refusal}");
                            System::current().stop_with_code(BAD_CONFIG_EXIT_CODE);
                            return;
                        }
                        Err(e) if tokio::time::Instant::now() >= deadline => {
                            tracing::info!("could not register with the chief: {e}");
                            return;
                        }
                        Err(e) => tracing::debug!("chief did not take the registration yet: {e}"),
                    }
                }
                // Told by the peer that this incarnation is outdated: `exit_when_outdated`.
                Err(cohort_actors::RemoteError::Outdated { .. }) => return,
                Err(e) if certificate_refused(&e) => {
                    tracing::error!(
                        "bad config: certs_dir: the TLS handshake with {task} ({addr}) \
                         failed on a certificate: {e}; every node's certificate must be signed \
                         by the cluster CA whose ca.pem is in its certs directory (SEC-1)"
                    );
                    System::current().stop_with_code(BAD_CONFIG_EXIT_CODE);
                    return;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::info!("could not say hello to {task} (it will dial us): {e}");
                    return;
                }
                Err(e) => tracing::debug!("{task} not reachable yet: {e}"),
            }
            tokio::time::sleep(pause).await;
        }
    });
    Ok(())
}

/// Whether a dial failed because a certificate was refused at the TLS handshake (ours by the
/// peer, or the peer's by us): permanent, unlike a peer not reachable yet or a name that
/// answers as another node for a while.
fn certificate_refused(error: &cohort_actors::RemoteError) -> bool {
    matches!(
        error,
        cohort_actors::RemoteError::Refused {
            reason: cohort_actors::RefusedReason::CertificateRejected(_),
            ..
        }
    )
}

/// A worker or parameter server asked to leave the job for good (SIGUSR1: the launcher's or
/// an operator's scale-down) tells the chief it is draining ([`Draining`]) and waits, at most
/// [`drain_wait`], for the chief's answer: a worker once its last closure finished and
/// its dataset positions are kept, a server once its variables are on the other servers (a
/// checkpoint cut, see the coordinator machine's `reshard`). Then `decide` says what to do
/// with the answer (`None`: the chief did not answer): exit (code 0, which its supervisor does
/// not restart), or stay. A worker leaves all the same without an answer (its closure, if any,
/// runs elsewhere once the chief notices it gone, PS-1 keeps its effect exactly once); a
/// server stays, since leaving would lose what it holds.
fn drain_on_signal(
    gateway: &Gateway,
    incarnation: u64,
    role: TaskType,
    decide: impl Fn(Option<Result<(), DrainRefusal>>) -> Option<Exit> + 'static,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let gateway = gateway.clone();
    // Watched from now on (not from the task's first poll): SIGUSR1's default action would
    // kill the process.
    let Ok(mut drain) = signal(SignalKind::user_defined1()) else {
        tracing::warn!("cannot watch for SIGUSR1: this {role} cannot be drained");
        return;
    };
    actix::spawn(async move {
        // A server told to stay may be asked again later.
        while drain.recv().await.is_some() {
            tracing::info!("drain requested (SIGUSR1): leaving the job once the chief lets it go");
            let chief = peer(TaskId::new(TaskType::Chief, 0));
            let answer = match gateway.peer_status(&chief) {
                Some((chief_incarnation, true)) => {
                    let target = cohort_actors::Incarnation::new(chief, chief_incarnation);
                    let reference = gateway.remote_ref::<Draining>(target, COORDINATOR_ACTOR);
                    match reference
                        .call_within(&Draining { incarnation }, drain_wait(role))
                        .await
                    {
                        Ok(answer) => Some(answer),
                        Err(e) => {
                            tracing::warn!("the chief did not answer this {role}'s drain: {e}");
                            None
                        }
                    }
                }
                _ => None,
            };
            if let Some(exit) = decide(answer) {
                tracing::info!("{}", exit.reason);
                System::current().stop_with_code(exit.code);
                return;
            }
        }
    });
}

/// Ends this process with [`RETIRED_EXIT_CODE`] when a peer
/// refuses its incarnation as outdated (it knows an incarnation of this node at least as new: the
/// clock stepped back past a predecessor's incarnation). No peer that knew the predecessor would
/// ever admit this incarnation; restarted, the process derives a newer incarnation.
fn exit_when_outdated(gateway: &Gateway) {
    let mut events = gateway.subscribe();
    let me = gateway.incarnation().clone();
    actix::spawn(async move {
        while let Some(event) = events.recv().await {
            if let PeerEvent::Outdated { by, known } = event {
                tracing::error!(
                    "{by} refused this incarnation ({me}) as outdated: it knows {known} \
                     of this node (this process was declared dead, frozen past the detection \
                     budget; or the clock stepped back); exiting {} to be restarted as a \
                     newer one",
                    crate::process::RETIRED_EXIT_CODE
                );
                System::current().stop_with_code(crate::process::RETIRED_EXIT_CODE);
                return;
            }
        }
    });
}

/// How a parameter server or worker tells the chief it got a preemption notice ([`Leaving`]).
struct LeaveAsk {
    /// The leaving incarnation.
    incarnation: u64,
    /// How long to wait before asking: a notice that reaches the whole job at once (its
    /// supervisor deleting every pod together) reaches the chief too within it, and a chief
    /// that is stopping keeps its servers (it answers `Stay`) for its own checkpoint.
    settle: Duration,
    /// How long to wait for the answer.
    bound: Duration,
    /// What the process makes of the answer: an exit now, or serve on.
    decide: Box<dyn FnOnce(LeaveAnswer) -> Option<Exit>>,
}

/// A parameter server's or worker's stop: at the notice it runs `notice`, then tells the chief
/// it is leaving (`leave`). A worker is answered at once (if the chief lets it go, its
/// closures run elsewhere and it stops now); a parameter server once the chief has taken a
/// checkpoint cut for it (it stops then, and its restore runs nothing again). Otherwise (a
/// chief stopping too, or no answer within the ask's bound) it keeps serving while the chief
/// is alive, so that the chief can finish in-flight steps and read the variables for its
/// preemption checkpoint; once the chief is gone or `grace` has passed, it stops as `over`
/// says ([`PREEMPTED_EXIT_CODE`]; nothing when an exit is under way already).
fn serve_chief_then_stop(
    gateway: Gateway,
    grace: Duration,
    notice: impl FnOnce() + 'static,
    leave: Option<LeaveAsk>,
    over: impl FnOnce() -> Option<Exit> + 'static,
) {
    on_stop_signal(move || async move {
        notice();
        let chief = peer(TaskId::new(TaskType::Chief, 0));
        let deadline = tokio::time::Instant::now() + grace;
        if let Some(LeaveAsk {
            incarnation,
            settle,
            bound,
            decide,
        }) = leave
        {
            tokio::time::sleep(settle).await;
            let answer = ask_to_leave(&gateway, &chief, incarnation, bound).await;
            if let Some(exit) = answer.and_then(decide) {
                tracing::info!("{}", exit.reason);
                System::current().stop_with_code(exit.code);
                return;
            }
        }
        while tokio::time::Instant::now() < deadline
            && matches!(gateway.peer_status(&chief), Some((_, true)))
        {
            tokio::time::sleep(CHIEF_POLL).await;
        }
        if let Some(exit) = over() {
            tracing::info!("{}", exit.reason);
            System::current().stop_with_code(exit.code);
        }
    });
}

/// Tells the live chief that incarnation `incarnation` of this process is leaving, and returns its
/// answer; `None` when no chief is known alive or it does not answer within `bound`.
async fn ask_to_leave(
    gateway: &Gateway,
    chief: &NodeId,
    incarnation: u64,
    bound: Duration,
) -> Option<LeaveAnswer> {
    let (chief_incarnation, true) = gateway.peer_status(chief)? else {
        return None;
    };
    let target = cohort_actors::Incarnation::new(chief.clone(), chief_incarnation);
    let reference = gateway.remote_ref::<Leaving>(target, COORDINATOR_ACTOR);
    match tokio::time::timeout(
        bound,
        reference.call_within(&Leaving { incarnation }, bound),
    )
    .await
    {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(e)) => {
            tracing::warn!("the chief did not take this process's preemption notice: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the chief did not answer this process's preemption notice in {bound:?}"
            );
            None
        }
    }
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

/// Bound on a draining worker's wait for the chief to let its closure finish: a step longer
/// than this is handed back instead (run elsewhere once the worker is gone).
const DRAIN_WAIT_MAX: Duration = Duration::from_secs(60);
/// Bound on a draining parameter server's wait for the chief to move its variables: a cut
/// (at most `PREEMPTION_CUT_MAX`, 60 s) and a restore of every server, which for a large
/// model takes longer than a step.
const PS_DRAIN_WAIT_MAX: Duration = Duration::from_secs(300);

/// How long a task of `role` waits for the chief's answer to its drain.
fn drain_wait(role: TaskType) -> Duration {
    match role {
        TaskType::Ps => PS_DRAIN_WAIT_MAX,
        _ => DRAIN_WAIT_MAX,
    }
}
/// Bound on a worker's wait for the chief's answer to its preemption notice (at most half its
/// grace, so that serving on still fits in it).
const LEAVE_ASK_MAX: Duration = Duration::from_secs(2);
/// How long a parameter server or worker given notice waits before telling the chief (at most
/// an eighth of its grace): a whole job stopped at once (its supervisor deleting every pod
/// together) has the chief's own notice arrive within it, so the chief keeps its servers and
/// workers for its checkpoint rather than cutting them out (a server) or handing their
/// closures back with no worker left to run them (a worker).
const LEAVE_SETTLE: Duration = Duration::from_millis(500);
/// Share of its grace a parameter server waits for the chief's preemption cut: the rest is
/// for serving the chief (if it did not answer) and for exiting.
const PS_LEAVE_ASK_SHARE: f64 = 0.75;
/// How often a stopping PS or worker looks whether the chief is still alive.
const CHIEF_POLL: Duration = Duration::from_millis(20);
/// Bound on the chief's goodbye to every task at the end of a job.
const GOODBYE_WAIT: Duration = Duration::from_secs(2);
/// Time between answering the message that ends a process and stopping it, so that the
/// answer leaves before the endpoint closes.
const EXIT_LINGER: Duration = Duration::from_millis(100);

/// Bound on any single `join`/`fetch` wait on the chief.
const JOIN_WAIT_MAX: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn an_explicit_incarnation_wins_and_else_the_clock_gives_one_that_grows() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(incarnation_number(Some(7), at(1_800_000_000_000)), 7);
        let first = incarnation_number(None, at(1_800_000_000_000));
        assert_eq!(first, 1_800_000_000_000);
        // A restart, however soon, is a newer incarnation.
        assert!(incarnation_number(None, at(1_800_000_000_001)) > first);
        // A clock before 1970 still gives a valid incarnation (0 is not one).
        assert_eq!(
            incarnation_number(None, UNIX_EPOCH - Duration::from_secs(1)),
            1
        );
    }
}
