//! Crash-only parameter servers across real processes (DESIGN §5, PS-1, LEDGER-1): ps/1's push
//! handler panics once, by the test-only failpoint `COHORT_FAILPOINT=ps.push.panic=N`.
//!
//! The panic ends ps/1's process at once with `PANIC_EXIT_CODE` (170) instead of leaving it
//! half alive (heartbeating, refusing every call); the launcher restarts it like any crash, and
//! without the failpoint (failpoints reach a task's first incarnation only); the chief holds
//! dispatch, restores every server from the last checkpoint, runs again what committed since,
//! and the job ends as a fault-free run of the same job does: every closure committed once,
//! nothing failed, the same model.
//!
//! The model: every closure pushes -1 to `a` (on ps/0) and `b` (on ps/1) under SGD with
//! learning rate 1, so each ends at the number of closures whose effect is present, and a step
//! of gradient descent to `w` (on ps/0), which converges to [`ps_support::TARGET`].

mod ps_support;

use std::time::{Duration, Instant};

use cohort::checkpoint::{CheckpointManager, CheckpointPolicy, FAILPOINT_ENV};
use cohort::launch::TaskExit;
use cohort::process::PANIC_EXIT_CODE;
use cohort::program::{CoordinatorError, Program, StepContext, VariableSpec};
use ps_support::{child_dir, fit_gradient, ledger_and_stats, write_report, Run, TARGET};

/// Closures between two checkpoints.
const CHUNK: usize = 6;
/// Chunks scheduled in all.
const CHUNKS: usize = 5;
/// Pushes ps/1 handles before the one that panics: one per closure, so a closure of the second
/// chunk, after the first checkpoint.
const PANIC_AFTER_PUSHES: u64 = 8;
/// How far `w` may be from the fault-free run's (and from the target) at the end.
const W_TOLERANCE: f32 = 1e-3;

/// Child mode: run this process's role of the test program. The failpoint is meant for ps/1:
/// every other task drops it before it starts.
#[test]
fn cluster_task() {
    if ps_support::is_child() {
        let task = cohort::cluster::ClusterConfig::from_env()
            .ok()
            .flatten()
            .map(|c| c.task.to_string());
        if task.as_deref() != Some("ps/1") {
            std::env::remove_var(FAILPOINT_ENV);
        }
    }
    ps_support::run_if_child(program);
}

fn program() -> Program {
    Program::new("ps-panic-test")
        .optimizer(cohort::optim::Optimizer::sgd(1.0))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let pulled = ctx.pull_many(&["a", "b", "w"])?;
            let w = pulled
                .into_iter()
                .nth(2)
                .ok_or_else(|| cohort::program::StepError::Step("no w pulled".into()))?;
            // Half of the gradient: with learning rate 1 each step halves the distance.
            let grad: Vec<f32> = fit_gradient(&w).iter().map(|g| 0.25 * g).collect();
            ctx.push_dense("a", vec![-1.0])?;
            ctx.push_dense("b", vec![-1.0])?;
            ctx.push_dense("w", grad)?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            // Round-robin placement: a on ps/0, b on ps/1, w on ps/0.
            coordinator.create_variable(VariableSpec::zeros("a", vec![1]))?;
            coordinator.create_variable(VariableSpec::zeros("b", vec![1]))?;
            coordinator.create_variable(VariableSpec::zeros("w", vec![TARGET.len()]))?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            let policy = CheckpointPolicy {
                save_every_steps: None,
                save_every: None,
                keep_last: 2,
            };
            let mut manager =
                CheckpointManager::new(child_dir().join("ckpt"), policy, Instant::now())
                    .map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
            let mut scheduled = 0u64;
            for _ in 0..CHUNKS {
                for _ in 0..CHUNK {
                    coordinator.schedule_encoded("fit", Vec::new())?;
                }
                scheduled += CHUNK as u64;
                coordinator.join()?;
                coordinator.save_checkpoint(&mut manager, scheduled)?;
            }
            write_report(&serde_json::json!({
                "scheduled": scheduled,
                "a": coordinator.read_variable("a")?[0],
                "b": coordinator.read_variable("b")?[0],
                "w": coordinator.read_variable("w")?,
                "after": ledger_and_stats(coordinator)?,
            }))
        })
}

#[test]
fn ps_1_ledger_1_a_ps_that_panics_exits_170_is_restarted_restored_and_the_job_ends_as_without_the_fault(
) {
    let baseline = Run::new("ps-panic-baseline", "fit", &[]);
    let (code, exits) = launch(&baseline, &[]);
    assert_eq!(code, 0, "the fault-free chief failed; its log is above");
    assert!(
        exits.iter().all(|e| !e.panicked()),
        "no panic without the failpoint: {exits:?}"
    );
    let expected = baseline.report();

    let run = Run::new("ps-panic", "fit", &[]);
    let failpoint = format!("ps.push.panic={PANIC_AFTER_PUSHES}");
    let (code, exits) = launch(&run, &[(FAILPOINT_ENV, &failpoint)]);
    assert_eq!(code, 0, "the chief failed; its log is above");
    let report = run.report();

    // ps/1 died of its panic, once, with the panic's own exit code; nothing else crashed.
    let panicked: Vec<&TaskExit> = exits.iter().filter(|e| e.panicked()).collect();
    assert_eq!(panicked.len(), 1, "{exits:?}");
    assert_eq!(panicked[0].task.to_string(), "ps/1", "{exits:?}");
    assert_eq!(panicked[0].code, Some(PANIC_EXIT_CODE));
    // Its restart (a newer incarnation, without the failpoint) served to the end of the job
    // and returned from its role.
    let restarted = run
        .exits()
        .into_iter()
        .any(|e| e.task == "ps/1" && e.incarnation > panicked[0].incarnation);
    assert!(restarted, "ps/1 came back: {:?}", run.exits());

    // LEDGER-1: every closure committed, none failed, pending or cancelled; the recovery
    // is on record.
    let ledger = &report["after"]["ledger"];
    assert_eq!(ledger["balances"], true, "{report}");
    assert_eq!(ledger["committed"], ledger["scheduled"], "{report}");
    assert_eq!(ledger["scheduled"], (CHUNK * CHUNKS) as u64, "{report}");
    for key in ["failed", "cancelled", "pending"] {
        assert_eq!(ledger[key], 0, "{key}: {report}");
    }
    assert!(ledger["ps_restores"].as_u64() >= Some(1), "{report}");
    for stats in report["after"]["ps"].as_array().expect("ps stats") {
        assert!(stats["generation"].as_u64() >= Some(1), "{report}");
        assert_eq!(stats["serving"], true, "{report}");
    }

    // PS-1: every closure's effect exactly once on both servers, as in the fault-free run,
    // and the same model.
    let scheduled = (CHUNK * CHUNKS) as f64;
    for name in ["a", "b"] {
        assert_eq!(expected[name].as_f64(), Some(scheduled), "{expected}");
        assert_eq!(report[name], expected[name], "{name}: {report}");
    }
    let w = floats(&report["w"]);
    let w_expected = floats(&expected["w"]);
    for ((got, free), target) in w.iter().zip(&w_expected).zip(TARGET) {
        assert!(
            (got - free).abs() <= W_TOLERANCE,
            "w {w:?} vs {w_expected:?}"
        );
        assert!((got - target).abs() <= W_TOLERANCE, "w {w:?} vs {TARGET:?}");
    }
    assert_eq!(w.len(), TARGET.len());
}

/// Launches `run` with `extra_env` and supervises it to the chief's exit; the chief's code and
/// every exit the launcher saw.
fn launch(run: &Run, extra_env: &[(&str, &str)]) -> (i32, Vec<TaskExit>) {
    run.launch_with_exits(extra_env)
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}
