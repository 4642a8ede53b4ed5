//! Preemption across real processes (DESIGN §5 Recovery, §7 exit codes): SIGTERM to the chief
//! of a 2 PS × 2 worker cluster in the middle of training makes its program stop scheduling,
//! finish what is in flight, save a checkpoint (CKPT-1) and return; the chief exits 143 and
//! `launch_local` returns that 143. A relaunch on the same checkpoint directory (given through
//! the configuration, `COHORT_CHECKPOINT_DIR`) restores the preemption checkpoint with every
//! variable and optimizer slot bit-identical to what was saved, and trains on.

mod ps_support;

use ps_support::fit_gradient;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::checkpoint::{list_checkpoints, CheckpointManager, CheckpointPolicy};
use cohort::nn::Initializer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use nix::sys::signal::Signal;
use ps_support::{
    beside, claim_pid_file, scenario, signal, wait_for_pid, write_report, Run, CHILD_ENV, DIR_ENV,
    SCENARIO_ENV,
};

/// Steps before the chief offers itself to be preempted (writes its PID file).
const STEPS_BEFORE_PREEMPTION: u64 = 20;
/// Bound on the first run's steps: reached only if the SIGTERM never comes.
const STEPS_MAX: u64 = 2_000;
/// Steps the resumed run trains.
const RESUMED_STEPS: u64 = 10;
/// Closures kept scheduled ahead of the one being fetched.
const AHEAD: usize = 4;
/// The chief's PID file.
const CHIEF_PID: &str = "chief.pid";
/// The PID file of worker 1, in the scenario where it is preempted alone.
const WORKER_PID: &str = "worker.pid";
/// The longest worker/1 holds its closure once it offered itself to be preempted.
const HOLD_MAX: Duration = Duration::from_secs(20);
/// Steps worker 1 runs before it offers itself to be preempted.
const WORKER_STEPS_BEFORE_PREEMPTION: u64 = 5;
/// Steps the job trains in the scenario where a worker is preempted alone.
const STEPS_WITH_A_WORKER_PREEMPTED: u64 = 80;
/// Steps the job trains in the scenario where the chief is frozen past the detection budget.
const STEPS_WITH_CHIEF_FROZEN: u64 = 120;
/// Steps between two checkpoints in that scenario.
const CHECKPOINT_EVERY: u64 = 10;
/// Step at which the chief offers itself to be frozen.
const FREEZE_AT_STEP: u64 = 35;
/// Notices worker 1 gets in the scenario where it is preempted again and again: more than the
/// launcher's restart budget (3 a minute in these tests), which a preemption must not spend.
const REPEATED_PREEMPTIONS: u32 = 6;
/// The file the test writes once it has sent every one of those notices and worker 1 is back.
const PREEMPTIONS_SENT: &str = "preemptions-sent";
/// Steps the job trains after that.
const STEPS_AFTER_PREEMPTIONS: u64 = 20;
/// Steps this process's worker has run (in the worker processes).
static WORKER_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// `w` split over both PS and a random `table`, trained with Adagrad (so the checkpoint carries
/// optimizer slots); each step sleeps a little so that training is still going when the
/// SIGTERM comes.
fn program() -> Program {
    Program::new("preemption-test")
        .optimizer(cohort::optim::Optimizer::adagrad(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let w = ctx.pull("w")?;
            let grad = fit_gradient(&w);
            ctx.push_dense("w", grad)?;
            let ids = vec![u64::from(ctx.worker_index()), 7];
            let rows = ctx.pull_rows("table", &ids)?;
            ctx.push_rows("table", ids, rows.iter().map(|r| r - 0.5).collect())?;
            std::thread::sleep(Duration::from_millis(10));
            if ctx.worker_index() == 1 && scenario() == "worker-preempted-often" {
                let ran = WORKER_STEPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                if ran == WORKER_STEPS_BEFORE_PREEMPTION {
                    // Each incarnation offers itself once, under the next free number.
                    for n in 0..=REPEATED_PREEMPTIONS {
                        if claim_pid_file(&format!("worker-{n}.pid"), "") {
                            break;
                        }
                    }
                }
            }
            if ctx.worker_index() == 1 && scenario() == "worker-leaves" {
                let ran = WORKER_STEPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                if ran == WORKER_STEPS_BEFORE_PREEMPTION {
                    // Ready to be preempted: the test sends SIGTERM to this worker's PID. This
                    // incarnation then holds its closure (bounded by HOLD_MAX) until it leaves:
                    // the job cannot finish before the worker's notice has run its course
                    // (the settle, the leave asked and granted), however fast the other steps
                    // go. A worker that does not leave at once lets go after HOLD_MAX, the job
                    // finishes with it still serving, and the exit code below says so.
                    if claim_pid_file(WORKER_PID, "") {
                        std::thread::sleep(HOLD_MAX);
                    }
                }
            }
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4]).partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_variable(VariableSpec::new(
                "table",
                vec![10, 2],
                Initializer::RandomUniform { min: -1.0, max: 1.0, seed: 7 },
            ))?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            let dir = coordinator
                .checkpoint_dir()
                .ok_or_else(|| CoordinatorError::other("no checkpoint_dir configured"))?;
            let policy = CheckpointPolicy { save_every_steps: None, save_every: None, keep_last: 3 };
            let mut manager =
                CheckpointManager::new(dir, policy, Instant::now()).map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
            let restored = coordinator.restore_checkpoint(&mut manager)?;
            let mut report = serde_json::json!({ "restored_step": restored, "restored": variables(coordinator)? });
            let mut step = restored.unwrap_or(0);
            match scenario().as_str() {
                "preempt" => {
                    let stopped = train(coordinator, &mut step, STEPS_MAX)?;
                    report["stopped_by_sigterm"] = serde_json::json!(stopped);
                    report["saved_step"] = serde_json::json!(step);
                    coordinator.save_checkpoint(&mut manager, step)?;
                    report["saved"] = variables(coordinator)?;
                }
                "chief-freeze" => {
                    // A checkpoint every CHECKPOINT_EVERY steps; the first incarnation offers
                    // itself to be frozen (its PID file) once a few are saved.
                    while step < STEPS_WITH_CHIEF_FROZEN {
                        let value = coordinator.schedule_encoded("fit", Vec::new())?;
                        coordinator.fetch_encoded(&value)?;
                        step += 1;
                        if step % CHECKPOINT_EVERY == 0 {
                            coordinator.save_checkpoint(&mut manager, step)?;
                        }
                        if step == FREEZE_AT_STEP {
                            claim_pid_file(CHIEF_PID, "");
                        }
                    }
                    report["final_step"] = serde_json::json!(step);
                    report["ledger"] = serde_json::to_value(coordinator.ledger()?)
                        .map_err(CoordinatorError::other)?;
                }
                "worker-leaves" => {
                    train(coordinator, &mut step, STEPS_WITH_A_WORKER_PREEMPTED)?;
                    report["final_step"] = serde_json::json!(step);
                    report["ledger"] = serde_json::to_value(coordinator.ledger()?)
                        .map_err(CoordinatorError::other)?;
                }
                "worker-preempted-often" => {
                    // Trains until the test has sent its last notice, then a little more.
                    let sent = ps_support::child_dir().join(PREEMPTIONS_SENT);
                    while !sent.exists() && step < STEPS_MAX {
                        train(coordinator, &mut step, 10)?;
                    }
                    train(coordinator, &mut step, STEPS_AFTER_PREEMPTIONS)?;
                    report["final_step"] = serde_json::json!(step);
                    report["ledger"] = serde_json::to_value(coordinator.ledger()?)
                        .map_err(CoordinatorError::other)?;
                }
                "ignore" => {
                    // A program that never looks at the stop request: the process must end
                    // after the preemption grace anyway, without this report.
                    for _ in 0..STEPS_MAX {
                        coordinator.schedule_encoded("fit", Vec::new())?;
                        claim_pid_file(CHIEF_PID, "");
                    }
                    coordinator.join()?;
                }
                _ => {
                    train(coordinator, &mut step, RESUMED_STEPS)?;
                    report["final_step"] = serde_json::json!(step);
                    report["trained"] = variables(coordinator)?;
                }
            }
            write_report(&report)
        })
}

/// Trains up to `steps` more steps, a few scheduled ahead; stops early (after what is in
/// flight) when a stop is requested. Returns whether it stopped early.
fn train(
    coordinator: &ClusterCoordinator,
    step: &mut u64,
    steps: u64,
) -> Result<bool, CoordinatorError> {
    let mut in_flight = std::collections::VecDeque::new();
    let mut scheduled = 0;
    let mut this_run = 0;
    loop {
        let stopping = coordinator.preemption_requested();
        while !stopping && scheduled < steps && in_flight.len() < AHEAD {
            in_flight.push_back(coordinator.schedule_encoded("fit", Vec::new())?);
            scheduled += 1;
        }
        let Some(value) = in_flight.pop_front() else {
            break;
        };
        coordinator.fetch_encoded(&value)?;
        *step += 1;
        this_run += 1;
        if this_run == STEPS_BEFORE_PREEMPTION {
            // Ready to be preempted: the test sends SIGTERM to this PID.
            claim_pid_file(CHIEF_PID, "");
        }
    }
    coordinator.join()?;
    Ok(this_run < steps)
}

/// Every variable and its Adagrad slot, as raw f32 bits (compared exactly).
fn variables(coordinator: &ClusterCoordinator) -> Result<serde_json::Value, CoordinatorError> {
    let mut out = serde_json::json!({});
    for name in ["w", "table"] {
        let bits: Vec<u32> = coordinator
            .read_variable(name)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        out[name] = serde_json::json!(bits);
    }
    out["ps"] = serde_json::to_value(coordinator.ps_stats()?).map_err(CoordinatorError::other)?;
    Ok(out)
}

#[test]
fn sigterm_to_the_chief_saves_a_checkpoint_exits_143_and_a_relaunch_resumes_from_it() {
    let mut run = Run::new("preempt", "preempt", &[]);
    let root = run.path("ckpt");
    run.env
        .push(("COHORT_CHECKPOINT_DIR".into(), root.display().to_string()));

    // 1. Launch through `launch_local`; SIGTERM the chief once it has trained a while.
    let pid_file = run.path(CHIEF_PID);
    let preempter = beside(move |cancel| {
        if let Some(pid) = wait_for_pid(&pid_file, &cancel) {
            eprintln!("[test] SIGTERM to the chief (pid {pid})");
            signal(pid, Signal::SIGTERM);
        }
    });
    let mut env = run.env.clone();
    env.extend([
        (CHILD_ENV.to_string(), "1".to_string()),
        (DIR_ENV.to_string(), run.dir.display().to_string()),
        (SCENARIO_ENV.to_string(), run.scenario.clone()),
    ]);
    let flags = cohort::bootstrap::LaunchFlags {
        workers: 2.into(),
        ps: 2.into(),
        evaluators: 0,
        kill_worker_after: None,
        kill_ps_after: None,
        run_dir: Some(run.path("launch")),
        detection_budget: Duration::from_secs(1),
        replicas: 1,
        no_metrics: true,
        peer_chief: false,
    };
    let task_args = vec![
        "--exact".into(),
        "cluster_task".into(),
        "--nocapture".into(),
    ];
    let code = cohort::bootstrap::launch_local(&flags, task_args, env);
    preempter.finish();
    assert_eq!(
        code, 143,
        "the chief was to checkpoint and exit 143 after SIGTERM; its log is above"
    );
    let first = run.report();
    assert!(
        first["restored_step"].is_null(),
        "nothing to restore on a fresh root: {first}"
    );
    assert_eq!(
        first["stopped_by_sigterm"], true,
        "the program saw the stop request: {first}"
    );
    let saved_step = first["saved_step"].as_u64().unwrap();
    assert!(
        (STEPS_BEFORE_PREEMPTION..STEPS_MAX).contains(&saved_step),
        "{first}"
    );
    let on_disk: Vec<u64> = list_checkpoints(&root)
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(
        on_disk,
        [saved_step],
        "CKPT-1: the preemption checkpoint is on disk"
    );

    // 2. Relaunch on the same root: restored bit-identical, then trains on.
    run.scenario = "resume".into();
    let code = run.launch_code();
    assert_eq!(code, 0, "the resumed run failed; its log is above");
    let second = run.report();
    assert_eq!(second["restored_step"], saved_step, "{second}");
    for name in ["w", "table"] {
        assert_eq!(
            second["restored"][name], first["saved"][name],
            "{name}: restored bits differ from the saved ones"
        );
    }
    assert_eq!(second["final_step"], saved_step + RESUMED_STEPS);
    assert_ne!(
        second["trained"]["w"], second["restored"]["w"],
        "training went on after the restore"
    );
}

#[test]
fn the_launcher_stopped_by_sigterm_returns_143_and_the_chief_checkpoints_in_its_grace() {
    // SIGTERM to every task at once (what the launcher forwards on Ctrl-C/SIGTERM): the PS and
    // workers keep serving the chief until its checkpoint is saved.
    let run = Run::new("preempt-all", "preempt", &[]);
    let root = run.path("ckpt");
    let pid_file = run.path(CHIEF_PID);
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let stopper = beside(move |cancel| {
        if wait_for_pid(&pid_file, &cancel).is_some() {
            eprintln!("[test] stopping the launcher: SIGTERM to every task");
            stop_flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut env = run.env.clone();
    env.extend([
        (
            "COHORT_CHECKPOINT_DIR".to_string(),
            root.display().to_string(),
        ),
        (CHILD_ENV.to_string(), "1".to_string()),
        (DIR_ENV.to_string(), run.dir.display().to_string()),
        (SCENARIO_ENV.to_string(), run.scenario.clone()),
        ("COHORT_DETECTION_BUDGET".to_string(), "1s".to_string()),
    ]);
    let config = cohort::launch::LaunchConfig {
        num_workers: 2,
        num_ps: 2,
        num_evaluators: 0,
        program: std::env::current_exe().unwrap(),
        args: vec![
            "--exact".into(),
            "cluster_task".into(),
            "--nocapture".into(),
        ],
        env,
        run_dir: run.path("launch"),
        metrics: false,
        restart: run.restart.clone(),
        stop_grace: Duration::from_secs(15),
        kill_once: None,
        restart_chief: false,
        peer_chief: false,
        json_logs: false,
    };
    let mut launcher = cohort::launch::Launcher::start(config).unwrap();
    let outcome = launcher.supervise(&stop).unwrap();
    drop(launcher);
    stopper.finish();
    assert_eq!(
        outcome,
        cohort::launch::LaunchOutcome::Stopped { chief: Some(143) },
        "the chief saved its preemption checkpoint and exited 143 by itself"
    );
    let report = run.report();
    assert_eq!(report["stopped_by_sigterm"], true, "{report}");
    let saved_step = report["saved_step"].as_u64().unwrap();
    let on_disk: Vec<u64> = list_checkpoints(&root)
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(
        on_disk,
        [saved_step],
        "CKPT-1: the chief checkpointed while every task had SIGTERM"
    );
}

#[test]
fn a_chief_program_that_ignores_the_stop_request_exits_143_after_the_grace() {
    let run = Run::new("preempt-ignore", "ignore", &[]);
    let pid_file = run.path(CHIEF_PID);
    let preempter = beside(move |cancel| {
        if let Some(pid) = wait_for_pid(&pid_file, &cancel) {
            signal(pid, Signal::SIGTERM);
        }
    });
    let root = run.path("ckpt").display().to_string();
    let code = run.launch_code_with(&[
        ("COHORT_CHECKPOINT_DIR", &root),
        ("COHORT_PREEMPTION_GRACE", "500ms"),
    ]);
    preempter.finish();
    assert_eq!(
        code, 143,
        "the chief was to exit 143 once the grace had passed; its log is above"
    );
    assert!(
        !run.path(ps_support::REPORT_FILE).exists(),
        "the program was cut short, so it wrote no report"
    );
}

/// A worker preempted alone (SIGTERM while the chief trains on) tells the chief and leaves at
/// once: the chief fences it and runs its closures elsewhere, so the worker exits 143 right
/// away instead of serving through its grace (60 s here, longer than the job) and the job does
/// not wait for the failure detector (30 s here); its supervisor restarts it as a new
/// incarnation, and the job finishes with the ledger whole and nothing rolled back.
#[test]
fn a_worker_preempted_alone_leaves_at_once_and_the_job_finishes_whole() {
    let run = Run::new("preempt-worker", "worker-leaves", &[]);
    let pid_file = run.path(WORKER_PID);
    let preempter = beside(move |cancel| {
        if let Some(pid) = wait_for_pid(&pid_file, &cancel) {
            eprintln!("[test] SIGTERM to worker/1 (pid {pid})");
            signal(pid, Signal::SIGTERM);
        }
    });
    let root = run.path("ckpt").display().to_string();
    let code = run.launch_code_with(&[
        ("COHORT_CHECKPOINT_DIR", &root),
        ("COHORT_PREEMPTION_GRACE", "60s"),
        ("COHORT_DETECTION_BUDGET", "30s"),
    ]);
    preempter.finish();
    assert_eq!(code, 0, "the job failed; its log is above");
    let report = run.report();
    assert_eq!(
        report["final_step"], STEPS_WITH_A_WORKER_PREEMPTED,
        "{report}"
    );
    let ledger = &report["ledger"];
    assert_eq!(
        ledger["scheduled"], ledger["committed"],
        "LEDGER-1: {ledger}"
    );
    assert_eq!(ledger["pending"], 0, "{ledger}");
    assert_eq!(ledger["rolled_back"], 0, "{ledger}");
    let exits = run.exits();
    let first = exits
        .iter()
        .filter(|e| e.task == "worker/1")
        .min_by_key(|e| e.incarnation)
        .unwrap_or_else(|| panic!("worker/1 never exited: {exits:?}"));
    assert_eq!(
        first.code, 143,
        "worker/1 was to leave at once after its notice, not serve on: {exits:?}"
    );
}

/// A worker preempted twice as often as the launcher's restart budget allows crashes: each
/// time it leaves at once (exit 143) and the launcher starts it again outside that budget (a
/// preemption is not a crash); the job finishes with the ledger whole and nothing rolled back.
#[test]
fn a_worker_preempted_again_and_again_is_restarted_each_time_outside_the_restart_budget() {
    let run = Run::new("preempt-often", "worker-preempted-often", &[]);
    assert!(REPEATED_PREEMPTIONS > run.restart.restarts_max);
    let dir = run.dir.clone();
    let preempter = beside(move |cancel| {
        for n in 0..REPEATED_PREEMPTIONS {
            let Some(pid) = wait_for_pid(&dir.join(format!("worker-{n}.pid")), &cancel) else {
                return;
            };
            eprintln!("[test] SIGTERM {} to worker/1 (pid {pid})", n + 1);
            signal(pid, Signal::SIGTERM);
        }
        // The incarnation after the last notice is up and training.
        let last = dir.join(format!("worker-{REPEATED_PREEMPTIONS}.pid"));
        if wait_for_pid(&last, &cancel).is_some() {
            let _ = std::fs::write(dir.join(PREEMPTIONS_SENT), b"");
        }
    });
    let root = run.path("ckpt").display().to_string();
    let code = run.launch_code_with(&[
        ("COHORT_CHECKPOINT_DIR", &root),
        ("COHORT_PREEMPTION_GRACE", "60s"),
        ("COHORT_DETECTION_BUDGET", "30s"),
    ]);
    preempter.finish();
    assert_eq!(code, 0, "the job failed; its log is above");
    assert!(
        run.path(PREEMPTIONS_SENT).exists(),
        "worker/1 did not come back after every notice"
    );
    let report = run.report();
    let ledger = &report["ledger"];
    assert_eq!(
        ledger["scheduled"], ledger["committed"],
        "LEDGER-1: {ledger}"
    );
    assert_eq!(ledger["pending"], 0, "{ledger}");
    assert_eq!(ledger["rolled_back"], 0, "{ledger}");
    let exits = run.exits();
    let preempted: Vec<&ps_support::Exit> = exits
        .iter()
        .filter(|e| e.task == "worker/1" && e.code == 143)
        .collect();
    assert_eq!(
        preempted.len(),
        REPEATED_PREEMPTIONS as usize,
        "each notice ends one incarnation of worker/1: {exits:?}"
    );
}

/// A chief frozen past the detection budget (SIGSTOP, a paused VM) wakes to find itself
/// declared dead: a parameter server refuses its incarnation, and it exits 171 (restart me)
/// instead of failing the job. Its supervisor (the launcher here, restarting a chief as
/// Kubernetes' ExitCode policy does) restarts it; the new incarnation restores its newest
/// checkpoint over the live servers (rolling back what they applied past it) and trains to the
/// end, with the ledger whole across the restart.
#[test]
fn a_chief_frozen_past_the_budget_restarts_and_the_job_finishes_from_its_checkpoint() {
    let mut run = Run::new("chief-freeze", "chief-freeze", &[]);
    run.restart_chief = true;
    let pid_file = run.path(CHIEF_PID);
    let freezer = beside(move |cancel| {
        if let Some(pid) = wait_for_pid(&pid_file, &cancel) {
            eprintln!("[test] SIGSTOP to the chief (pid {pid}) for 3 s, past its 1 s budget");
            signal(pid, Signal::SIGSTOP);
            ps_support::sleep_unless(&cancel, Duration::from_secs(3));
            signal(pid, Signal::SIGCONT);
        }
    });
    let root = run.path("ckpt").display().to_string();
    let code = run.launch_code_with(&[("COHORT_CHECKPOINT_DIR", &root)]);
    freezer.finish();
    assert_eq!(code, 0, "the job failed; its log is above");
    let report = run.report();
    assert_eq!(report["final_step"], STEPS_WITH_CHIEF_FROZEN, "{report}");
    let restored = report["restored_step"].as_u64().unwrap_or(0);
    assert!(
        restored >= CHECKPOINT_EVERY,
        "the restarted chief resumed from a checkpoint: {report}"
    );
    let ledger = &report["ledger"];
    assert_eq!(
        ledger["scheduled"], ledger["committed"],
        "LEDGER-1: {ledger}"
    );
    assert_eq!(ledger["committed"], STEPS_WITH_CHIEF_FROZEN, "{ledger}");
    assert_eq!(ledger["pending"], 0, "{ledger}");
    let exits = run.exits();
    let first = exits
        .iter()
        .filter(|e| e.task == "chief/0")
        .min_by_key(|e| e.incarnation)
        .unwrap_or_else(|| panic!("the chief never exited: {exits:?}"));
    assert_eq!(
        first.code, 171,
        "the woken chief was to ask for a restart: {exits:?}"
    );
}

/// The whole job stopped at once (its supervisor deleting every pod together: SIGTERM to
/// every process within a moment, the chief last): servers and workers wait a moment before
/// telling the chief, whose own notice comes meanwhile, so the chief keeps them all and writes its
/// preemption checkpoint (no server leaves with a cut of its own, no worker hands back a
/// closure nobody is left to run).
#[test]
fn a_whole_job_stopped_at_once_still_writes_the_chiefs_checkpoint() {
    let mut run = Run::new("preempt-all", "preempt", &[]);
    let root = run.path("ckpt");
    run.env
        .push(("COHORT_CHECKPOINT_DIR".into(), root.display().to_string()));
    let pid_file = run.path(CHIEF_PID);
    let pids_dir = run.path("launch").join("pids");
    let preempter = beside(move |cancel| {
        if wait_for_pid(&pid_file, &cancel).is_none() {
            return;
        }
        let pid_of = |name: &str| ps_support::read_pid_file(&pids_dir.join(name)).map(|(p, _)| p);
        // The chief's notice comes last, a moment after the others' (pods are not deleted in
        // any order): the worst case for servers and workers that would leave at once.
        let others: Vec<u32> = ["ps-0.pid", "ps-1.pid", "worker-0.pid", "worker-1.pid"]
            .into_iter()
            .filter_map(pid_of)
            .collect();
        let chief = pid_of("chief-0.pid").expect("the chief's pid file");
        eprintln!("[test] SIGTERM to every task, the chief last: {others:?}, {chief}");
        for pid in others {
            signal(pid, Signal::SIGTERM);
        }
        std::thread::sleep(Duration::from_millis(50));
        signal(chief, Signal::SIGTERM);
    });
    let (code, exits) = run.launch_with_exits(&[]);
    preempter.finish();
    assert_eq!(
        code, 143,
        "the chief was to checkpoint and exit 143; its log is above"
    );
    // No server or worker left before the chief: each was kept for its checkpoint (under a
    // supervisor that does not restart them, one that left would be missing from it).
    let before_chief: Vec<_> = exits
        .iter()
        .take_while(|e| e.task.to_string() != "chief/0")
        .collect();
    assert!(
        before_chief.is_empty(),
        "left before the chief: {before_chief:?}"
    );
    let report = run.report();
    assert_eq!(report["stopped_by_sigterm"], true, "{report}");
    let saved_step = report["saved_step"].as_u64().unwrap();
    let on_disk: Vec<u64> = list_checkpoints(&root)
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(on_disk, [saved_step], "the chief's checkpoint is on disk");
}
