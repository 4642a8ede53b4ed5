//! Parameter-server recovery across real processes (DESIGN §5, PS-1, LEDGER-1): the chief
//! SIGKILLs ps/1 while closures are in flight; the launcher restarts it empty.
//!
//! - With checkpoints every few closures, the coordinator holds dispatch, restores every
//!   server from the last checkpoint, runs again what committed since, and training completes.
//!   The model counts: every closure pushes a gradient of -1 to a scalar on each server under
//!   SGD with learning rate 1, so each final value must equal the number of closures scheduled:
//!   every closure's effect present exactly once after the rollback.
//! - With no checkpoint, `join` fails with an error naming the server and checkpointing, the
//!   coordinator stays usable, and nothing hangs. A chief program that gives up on that error
//!   (returns it) exits `PS_LOST_EXIT_CODE`, a code that asks its supervisor for a restart.
//! - A false death: ps/1 is frozen (SIGSTOP) past the detection budget, declared dead, then
//!   woken (SIGCONT). The coordinator retires it (it exits `RETIRED_EXIT_CODE`), the launcher
//!   restarts it, and the recovery completes as after a kill.
//! - A preemption notice: ps/1 gets SIGTERM. The chief takes a checkpoint cut with dispatch
//!   held before it lets the server go, so the restore after it runs nothing again.

mod ps_support;

use std::time::{Duration, Instant};

use cohort::checkpoint::{list_checkpoints, CheckpointManager, CheckpointPolicy};
use cohort::process::{restart_wanted, PS_LOST_EXIT_CODE, RETIRED_EXIT_CODE};
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use nix::sys::signal::Signal;
use ps_support::{child_dir, ledger_and_stats, scenario, write_report, Run};

/// Closures between two checkpoints.
const CHUNK: usize = 6;
/// Chunks scheduled in all; ps/1 is killed during chunk [`KILL_CHUNK`].
const CHUNKS: usize = 5;
const KILL_CHUNK: usize = 2;
/// The PID file ps/1's first incarnation writes.
const PS_PID_FILE: &str = "ps1.pid";
/// How long ps/1 stays frozen in the false-death scenario: well past the 1 s budget.
const FROZEN_FOR: Duration = Duration::from_secs(3);

/// Child mode: run this process's role of the test program (ps/1 first records its PID, once).
#[test]
fn cluster_task() {
    if ps_support::is_child() {
        let task = cohort::cluster::ClusterConfig::from_env()
            .ok()
            .flatten()
            .map(|c| c.task.to_string());
        if task.as_deref() == Some("ps/1") {
            ps_support::claim_pid_file(PS_PID_FILE, "ps/1");
        }
        // Every task's first incarnation, for the rolling preemption.
        if let Some(task) = task.filter(|t| !t.starts_with("chief")) {
            ps_support::claim_pid_file(&first_pid_file(&task), &task);
        }
    }
    ps_support::run_if_child(program);
}

/// `a` lives on ps/0 and `b` on ps/1 (round-robin); every closure reads both and pushes -1 to
/// each, so under SGD(1) each counts the closures whose effect is present.
fn program() -> Program {
    Program::new("ps-recovery-test")
        .optimizer(cohort::optim::Optimizer::sgd(1.0))
        .step_encoded("count", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            ctx.pull_many(&["a", "b"])?;
            ctx.push_dense("a", vec![-1.0])?;
            ctx.push_dense("b", vec![-1.0])?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(VariableSpec::zeros("a", vec![1]))?;
            coordinator.create_variable(VariableSpec::zeros("b", vec![1]))?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            let checkpointing = !matches!(scenario().as_str(), "no-checkpoint" | "give-up");
            let policy = CheckpointPolicy {
                save_every_steps: None,
                save_every: None,
                keep_last: 2,
            };
            let mut manager =
                CheckpointManager::new(child_dir().join("ckpt"), policy, Instant::now())
                    .map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
            let mut report = serde_json::json!({});
            let mut scheduled = 0u64;
            let mut in_background = None;
            for chunk in 0..CHUNKS {
                let values = (0..CHUNK)
                    .map(|_| coordinator.schedule_encoded("count", Vec::new()))
                    .collect::<Result<Vec<_>, _>>()?;
                scheduled += CHUNK as u64;
                if scenario() == "rolling" && (1..=ROLLING.len()).contains(&chunk) {
                    // One task preempted per chunk, each after the one before has come back.
                    coordinator.fetch_encoded(&values[1])?;
                    let task = ROLLING[chunk - 1];
                    let pid = first_pid(task)?;
                    ps_support::signal(pid, Signal::SIGTERM);
                    // It tells the chief after a moment (a whole job stopped at once has the
                    // chief's notice arrive meanwhile); the chunk goes on once it has left.
                    wait_until_gone(pid)?;
                }
                if chunk == KILL_CHUNK {
                    // Some closures committed past the last checkpoint, others in flight or
                    // queued: now ps/1 dies.
                    coordinator.fetch_encoded(&values[1])?;
                    match scenario().as_str() {
                        "freeze" => freeze_ps1()?,
                        "preempt" => {
                            let pid = ps1_pid()?;
                            ps_support::signal(pid, Signal::SIGTERM);
                            wait_until_gone(pid)?;
                        }
                        "rolling" => {}
                        _ => kill_ps1()?,
                    }
                    report["killed_after"] = serde_json::json!(scheduled);
                }
                let joined = coordinator.join();
                if let Err(e) = joined {
                    report["join_error"] = serde_json::json!(e.to_string());
                    report["done_after_error"] = serde_json::json!(coordinator.done()?);
                    report["after"] = ledger_and_stats(coordinator)?;
                    write_report(&report)?;
                    return match scenario().as_str() {
                        "give-up" => Err(e),
                        _ => Ok(()),
                    };
                }
                if checkpointing && scenario() == "background" {
                    // The previous save ends first: one in the background at a time.
                    if let Some(pending) = in_background.take() {
                        cohort::program::PendingSave::wait(pending, &mut manager)?;
                    }
                    in_background =
                        Some(coordinator.save_checkpoint_in_background(&manager, scheduled)?);
                } else if checkpointing {
                    coordinator.save_checkpoint(&mut manager, scheduled)?;
                }
            }
            if let Some(pending) = in_background.take() {
                let saved = cohort::program::PendingSave::wait(pending, &mut manager)?;
                report["last_saved_step"] = serde_json::json!(saved.step);
            }
            report["scheduled"] = serde_json::json!(scheduled);
            report["a"] = serde_json::json!(value(coordinator, "a")?);
            report["b"] = serde_json::json!(value(coordinator, "b")?);
            report["after"] = ledger_and_stats(coordinator)?;
            write_report(&report)
        })
}

/// PS-1 and LEDGER-1 at the end of a run: every scheduled closure's effect is present exactly
/// once on both servers (each counts the closures applied: -lr * -1 per closure), and the
/// ledger balances with every closure committed. Returns the ledger.
fn every_effect_once(report: &serde_json::Value) -> &serde_json::Value {
    let ledger = &report["after"]["ledger"];
    let scheduled = (CHUNK * CHUNKS) as f64;
    assert_eq!(report["a"].as_f64(), Some(scheduled), "{report}");
    assert_eq!(report["b"].as_f64(), Some(scheduled), "{report}");
    assert_eq!(ledger["balances"], true, "{report}");
    assert_eq!(ledger["committed"], ledger["scheduled"], "{report}");
    ledger
}

fn value(coordinator: &ClusterCoordinator, name: &str) -> Result<f32, CoordinatorError> {
    Ok(coordinator.read_variable(name)?[0])
}

/// SIGKILLs ps/1's first incarnation (its PID file is written before it serves anything).
fn kill_ps1() -> Result<(), CoordinatorError> {
    ps_support::signal(ps1_pid()?, Signal::SIGKILL);
    Ok(())
}

/// SIGSTOPs ps/1's first incarnation and SIGCONTs it [`FROZEN_FOR`] later, from a thread of
/// its own (the chief goes on meanwhile).
fn freeze_ps1() -> Result<(), CoordinatorError> {
    let pid = ps1_pid()?;
    ps_support::signal(pid, Signal::SIGSTOP);
    std::thread::spawn(move || {
        std::thread::sleep(FROZEN_FOR);
        ps_support::signal(pid, Signal::SIGCONT);
    });
    Ok(())
}

/// The tasks preempted one after the other in the rolling scenario, one per chunk from the
/// second on.
const ROLLING: [&str; 4] = ["ps/0", "worker/0", "ps/1", "worker/1"];

/// Waits (bounded) until process `pid` has exited.
fn wait_until_gone(pid: u32) -> Result<(), CoordinatorError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    while nix::sys::signal::kill(pid, None).is_ok() {
        if Instant::now() >= deadline {
            return Err(CoordinatorError::other(format!(
                "{pid} did not leave within 30 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Where task `task`'s first incarnation records its PID.
fn first_pid_file(task: &str) -> String {
    format!("{}.first.pid", task.replace('/', "-"))
}

fn first_pid(task: &str) -> Result<u32, CoordinatorError> {
    let path = child_dir().join(first_pid_file(task));
    let never = std::sync::atomic::AtomicBool::new(false);
    ps_support::wait_for_pid(&path, &never)
        .ok_or_else(|| CoordinatorError::other(format!("{task} wrote no PID file")))
}

fn ps1_pid() -> Result<u32, CoordinatorError> {
    let path = child_dir().join(PS_PID_FILE);
    let never = std::sync::atomic::AtomicBool::new(false);
    ps_support::wait_for_pid(&path, &never)
        .ok_or_else(|| CoordinatorError::other("ps/1 wrote no PID file"))
}

#[test]
fn ps_1_ledger_1_a_killed_ps_is_restored_with_the_others_and_every_effect_is_present_once() {
    let run = Run::new("ps-recovery", "recover", &[]);
    let report = run.launch();
    let ledger = &report["after"]["ledger"];
    let scheduled = (CHUNK * CHUNKS) as f32;
    assert_eq!(
        report["scheduled"].as_f64(),
        Some(f64::from(scheduled)),
        "{report}"
    );
    // Every scheduled closure's effect, exactly once, on the restarted server and the
    // survivor alike (-lr * -1 per closure).
    assert_eq!(report["a"].as_f64(), Some(f64::from(scheduled)), "{report}");
    assert_eq!(report["b"].as_f64(), Some(f64::from(scheduled)), "{report}");
    assert_eq!(ledger["balances"], true, "{report}");
    assert_eq!(ledger["committed"], ledger["scheduled"], "{report}");
    assert_eq!(ledger["pending"], 0, "{report}");
    assert!(
        ledger["ps_restores"].as_u64() >= Some(1),
        "the recovery is reported: {report}"
    );
    assert!(
        ledger["rolled_back"].as_u64() >= Some(1),
        "a closure committed after the checkpoint was run again: {report}"
    );
    // Every server, the restarted one and the survivor, went through the restore generation
    // (PS-1: pushes from before it refused) and serves again.
    let servers = report["after"]["ps"].as_array().expect("ps stats");
    assert_eq!(servers.len(), 2, "{report}");
    for stats in servers {
        assert!(stats["generation"].as_u64() >= Some(1), "{report}");
        assert_eq!(stats["serving"], true, "{report}");
    }
}

#[test]
fn a_killed_ps_without_a_checkpoint_fails_join_clearly_and_nothing_hangs() {
    let run = Run::new("ps-recovery-none", "no-checkpoint", &[]);
    let report = run.launch();
    let error = report["join_error"]
        .as_str()
        .unwrap_or_else(|| panic!("join was to fail: {report}"));
    assert!(
        error.contains("ps/1") && error.contains("checkpoint"),
        "the error names the server and checkpointing: {error}"
    );
    assert_eq!(report["done_after_error"], true, "{report}");
    assert_eq!(report["after"]["ledger"]["balances"], true, "{report}");
}

/// Giving up on a server that cannot be recovered is no training error: the chief exits with
/// a code of 128 or more, which Kubernetes' `restartPolicy: ExitCode` restarts (1 would be
/// permanent), so that a restarted chief can resume from its checkpoint.
#[test]
fn a_chief_that_gives_up_on_a_lost_ps_exits_asking_for_a_restart() {
    let run = Run::new("ps-recovery-give-up", "give-up", &[]);
    let code = run.launch_code();
    assert_eq!(code, PS_LOST_EXIT_CODE, "the chief's log is above");
    assert!(restart_wanted(code));
    let report = run.report();
    let error = report["join_error"].as_str().unwrap_or_default();
    assert!(error.contains("ps/1"), "the lost server is named: {report}");
    let exits = run.exits();
    assert!(
        exits
            .iter()
            .any(|e| e.task == "chief/0" && e.code == PS_LOST_EXIT_CODE),
        "the chief's own exit: {exits:?}"
    );
}

#[test]
fn fence_1_a_ps_falsely_declared_dead_is_retired_restarted_and_restored() {
    let run = Run::new("ps-recovery-freeze", "freeze", &[]);
    let report = run.launch();
    let ledger = every_effect_once(&report);
    assert!(ledger["ps_restores"].as_u64() >= Some(1), "{report}");
    let retired = run
        .exits()
        .into_iter()
        .any(|e| e.task == "ps/1" && e.code == RETIRED_EXIT_CODE);
    assert!(
        retired,
        "the woken ps/1 was retired (exit {RETIRED_EXIT_CODE}): {:?}",
        run.exits()
    );
}

/// A preemption notice (SIGTERM) to a parameter server mid-chunk: the chief holds dispatch,
/// lets what ran finish, takes a checkpoint cut and only then lets the server go; it exits 143
/// at once (not at the end of its 60 s grace), its restart is restored from that cut, and
/// nothing runs again: every effect present exactly once with `rolled_back` 0.
#[test]
fn a_preempted_ps_leaves_after_a_cut_and_its_restore_runs_nothing_again() {
    let run = Run::new(
        "ps-recovery-preempt",
        "preempt",
        &[("COHORT_PREEMPTION_GRACE", "60s")],
    );
    let report = run.launch();
    let ledger = every_effect_once(&report);
    assert_eq!(ledger["pending"], 0, "{report}");
    assert!(ledger["ps_restores"].as_u64() >= Some(1), "{report}");
    assert_eq!(
        ledger["rolled_back"], 0,
        "the restore was from the preemption cut: {report}"
    );
    // Nothing was in flight at the cut, and after the restore the workers call ps/1's new
    // incarnation at once (the chief names it with each closure), not its predecessor's
    // connection until that idles out.
    assert_eq!(ledger["redispatched"], 0, "{report}");
    let exits = run.exits();
    let first = exits
        .iter()
        .filter(|e| e.task == "ps/1")
        .min_by_key(|e| e.incarnation)
        .unwrap_or_else(|| panic!("ps/1 never exited: {exits:?}"));
    assert_eq!(
        first.code, 143,
        "ps/1 was to leave once the cut was taken: {exits:?}"
    );
    let cuts = run
        .path("ckpt")
        .join(cohort::roles::coordinator::PREEMPTION_CUTS_DIR);
    assert!(
        list_checkpoints(&cuts)
            .map(|c| !c.is_empty())
            .unwrap_or(false),
        "the preemption cut is under {}",
        cuts.display()
    );
}

/// Checkpoints written in the background: training waits only for each cut to be read, and
/// goes on while the checkpoint is written; a cut becomes the recovery's only once durable.
/// ps/1 killed while closures run (and a save may still be writing): every effect is present
/// exactly once, whichever checkpoint the recovery found marked.
#[test]
fn ps_1_a_killed_ps_is_restored_exactly_once_with_checkpoints_written_in_the_background() {
    let run = Run::new("ps-recovery-background", "background", &[]);
    let report = run.launch();
    let ledger = every_effect_once(&report);
    let scheduled = (CHUNK * CHUNKS) as f64;
    assert!(ledger["ps_restores"].as_u64() >= Some(1), "{report}");
    assert!(ledger["rolled_back"].as_u64() >= Some(1), "{report}");
    assert_eq!(
        report["last_saved_step"].as_f64(),
        Some(scheduled),
        "{report}"
    );
    let steps: Vec<u64> = list_checkpoints(&run.path("ckpt"))
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(
        steps.last().copied(),
        Some(scheduled as u64),
        "the last save in the background is on disk"
    );
}

/// A rolling preemption: SIGTERM to every parameter server and worker, one after the other
/// while the job trains (each once the one before has come back). Each server's notice makes
/// the chief take a cut before it goes, each worker hands its closure back and goes; every
/// task leaves at once (143) and is restarted. The job finishes with every effect present
/// exactly once and nothing run again. (The chief's own notice is
/// `preemption::sigterm_to_the_chief_saves_a_checkpoint_exits_143_and_a_relaunch_resumes_from_it`.)
#[test]
fn a_rolling_preemption_of_every_server_and_worker_loses_nothing_and_reruns_nothing() {
    let run = Run::new(
        "ps-recovery-rolling",
        "rolling",
        &[("COHORT_PREEMPTION_GRACE", "60s")],
    );
    let report = run.launch();
    let ledger = every_effect_once(&report);
    assert_eq!(ledger["pending"], 0, "{report}");
    assert_eq!(ledger["rolled_back"], 0, "{report}");
    assert!(ledger["ps_restores"].as_u64() >= Some(2), "{report}");
    let exits = run.exits();
    for task in ROLLING {
        let first = exits
            .iter()
            .filter(|e| e.task == task)
            .min_by_key(|e| e.incarnation)
            .unwrap_or_else(|| panic!("{task} never exited: {exits:?}"));
        assert_eq!(first.code, 143, "{task} was to leave at once: {exits:?}");
    }
}
