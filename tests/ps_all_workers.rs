//! Every worker killed at once, across real processes. The coordinator holds the work and waits
//! for workers within its bound (`COHORT_WORKER_WAIT`): when the launcher brings them back in
//! time, training resumes and `join` returns only once everything committed (LEDGER-1, PS-1);
//! when they do not come back in time, `join` fails with the unavailable error, not before the
//! bound and not long after it.

mod ps_support;

use ps_support::fit_gradient;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::program::{Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use nix::sys::signal::Signal;
use ps_support::{
    beside, claim_pid_file, ledger_and_stats, ps_counter, signal, sleep_unless, unix_ms,
    wait_for_pid, write_report, Run,
};

/// Closures the chief schedules.
const STEPS: usize = 60;
/// How long after both workers started their first closure the test kills them.
const KILL_AFTER: Duration = Duration::from_millis(250);

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Each closure pulls `w` (split over both PS), takes 40 ms, and pushes its gradient. The first
/// incarnation of each worker publishes its PID when it starts its first closure.
fn program() -> Program {
    Program::new("ps-all-workers-test")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            claim_pid_file(&format!("worker-{}.pid", ctx.worker_index()), "");
            let w = ctx.pull("w")?;
            std::thread::sleep(Duration::from_millis(40));
            let grad = fit_gradient(&w);
            ctx.push_dense("w", grad)?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            for _ in 0..STEPS {
                coordinator.schedule_encoded("fit", Vec::new())?;
            }
            let joined = coordinator.join();
            let join_returned_ms = unix_ms();
            let mut report = ledger_and_stats(coordinator)?;
            report["join_returned_ms"] = serde_json::json!(join_returned_ms);
            report["join_error"] = match &joined {
                Ok(()) => serde_json::Value::Null,
                Err(e) => serde_json::json!(e.to_string()),
            };
            report["live_workers"] = serde_json::json!(coordinator.live_workers()?);
            write_report(&report)
        })
}

#[test]
fn all_workers_killed_the_coordinator_waits_and_resumes_when_they_return() {
    let run = Run::new("ps-all-back", "resume", &[("COHORT_WORKER_WAIT", "20s")]);
    let killed_ms = kill_both_workers(&run);
    let report = run.launch();
    let killed_ms = killed_ms.finish();
    println!("report: {report}");
    let ledger = &report["ledger"];
    assert!(report["join_error"].is_null(), "{report}");
    // Not early: join returned after the kill, with every closure committed and none pending.
    assert!(
        report["join_returned_ms"].as_u64().unwrap() > killed_ms,
        "{report} (killed at {killed_ms})"
    );
    assert_eq!(ledger["scheduled"], STEPS as u64, "{report}");
    assert_eq!(ledger["committed"], STEPS as u64, "LEDGER-1: {report}");
    assert_eq!(ledger["pending"], 0, "{report}");
    assert_eq!(ledger["balances"], true, "{report}");
    // The closures the killed workers were running were run again by their successors.
    assert!(ledger["redispatched"].as_u64().unwrap() >= 1, "{report}");
    // PS-1: each closure's single push to each PS applied once, re-dispatched or not.
    assert_eq!(
        ps_counter(&report, "applied"),
        [STEPS as u64, STEPS as u64],
        "{report}"
    );
    // Not past the bound: the wait for workers is 20 s.
    let waited_ms = report["join_returned_ms"].as_u64().unwrap() - killed_ms;
    assert!(
        waited_ms < 20_000,
        "join took {waited_ms} ms after the kill: {report}"
    );
    assert_eq!(report["live_workers"], 2, "{report}");
}

#[test]
fn all_workers_killed_and_not_back_in_time_join_fails_unavailable_within_the_bound() {
    let mut run = Run::new("ps-all-gone", "gone", &[("COHORT_WORKER_WAIT", "2s")]);
    // The launcher would restart them only after a minute: far past the coordinator's bound.
    run.restart.backoff_base = Duration::from_secs(60);
    run.restart.backoff_max = Duration::from_secs(60);
    let killed_ms = kill_both_workers(&run);
    let report = run.launch();
    let killed_ms = killed_ms.finish();
    println!("report: {report}");
    let ledger = &report["ledger"];
    let error = report["join_error"]
        .as_str()
        .unwrap_or_else(|| panic!("join succeeded with no worker: {report}"));
    assert!(
        error.contains("unavailable") && error.contains("no live worker"),
        "{error}"
    );
    // Not before the bound (2 s of no live worker, counted from when the loss was detected,
    // which is after the kill) and not long after it (detection budget 1 s, plus slack for a
    // loaded machine).
    let waited_ms = report["join_returned_ms"].as_u64().unwrap() - killed_ms;
    assert!(
        waited_ms >= 2_000,
        "join failed {waited_ms} ms after the kill, before the bound: {report}"
    );
    assert!(
        waited_ms < 8_000,
        "join failed {waited_ms} ms after the kill, long past the bound: {report}"
    );
    // LEDGER-1: what did not commit is accounted for as unavailable.
    assert_eq!(ledger["balances"], true, "{report}");
    assert_eq!(ledger["pending"], 0, "{report}");
    assert!(ledger["unavailable"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(
        ledger["committed"].as_u64().unwrap() + ledger["unavailable"].as_u64().unwrap(),
        STEPS as u64,
        "{report}"
    );
    // PS-1: nothing applied beyond the committed closures.
    let committed = ledger["committed"].as_u64().unwrap();
    for applied in ps_counter(&report, "applied") {
        assert!(
            applied <= committed + 2,
            "applied {applied} > committed {committed} + the 2 killed in flight: {report}"
        );
    }
    assert_eq!(report["live_workers"], 0, "{report}");
}

/// Kills both workers of `run` with SIGKILL together, soon after both started working; the
/// guard gives the kill time (Unix ms).
fn kill_both_workers(run: &Run) -> KillGuard {
    let pid_files = [run.path("worker-0.pid"), run.path("worker-1.pid")];
    let killed_ms = Arc::new(AtomicU64::new(0));
    let killed = Arc::clone(&killed_ms);
    let thread = beside(move |cancel| {
        let Some(first) = wait_for_pid(&pid_files[0], &cancel) else {
            return;
        };
        let Some(second) = wait_for_pid(&pid_files[1], &cancel) else {
            return;
        };
        if !sleep_unless(&cancel, KILL_AFTER) {
            return;
        }
        signal(first, Signal::SIGKILL);
        signal(second, Signal::SIGKILL);
        killed.store(unix_ms(), Ordering::SeqCst);
        eprintln!("[test] SIGKILL both workers (pids {first}, {second})");
    });
    KillGuard { thread, killed_ms }
}

struct KillGuard {
    thread: ps_support::Beside,
    killed_ms: Arc<AtomicU64>,
}

impl KillGuard {
    fn finish(self) -> u64 {
        self.thread.finish();
        let killed = self.killed_ms.load(Ordering::SeqCst);
        assert!(killed > 0, "the workers were never killed");
        killed
    }
}
