//! A worker incarnation the coordinator fenced while its process was still alive is retired
//! (`Retire`): it exits with the restart code (171, `RETIRED_EXIT_CODE`), the launcher restarts it as a new
//! incarnation, and the coordinator takes it back, so it runs closures again instead of idling
//! until the job ends. Two ways to be fenced while alive, across real processes:
//!
//! - a step that runs past the step timeout (`COHORT_STEP_TIMEOUT`) while its worker keeps
//!   heartbeating: the coordinator gives up on the call, fences the incarnation and runs the
//!   closure elsewhere;
//! - a false death: the worker is frozen (SIGSTOP) past the detection budget, declared dead and
//!   fenced by the chief's failure detector, then woken (SIGCONT).
//!
//! In both, every closure still commits exactly once and takes effect exactly once on every
//! parameter server (LEDGER-1, PS-1).

mod ps_support;

use ps_support::fit_gradient;

use std::time::{Duration, Instant};

use cohort::process::RETIRED_EXIT_CODE;
use cohort::program::{CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{
    child_dir, claim_pid_file, freeze_then_continue, ledger_and_stats, ps_counter, read_pid_file,
    scenario, write_report, Run,
};

/// Closures the chief schedules first; the victim is one of them.
const STEPS: usize = 16;
/// The closure whose first attempt hangs or freezes its worker.
const VICTIM: usize = 4;
/// The victim's PID file: `pid worker-index incarnation`.
const VICTIM_PID: &str = "victim.pid";
/// Every closure run: a line `worker-index incarnation closure` per run.
const RUNS: &str = "runs.log";
/// Written by the test once the frozen worker was continued.
const CONTINUED: &str = "continued";
/// The step timeout of the hung-step scenario.
const STEP_TIMEOUT: &str = "3s";
/// How long the hung step would run if nothing cut it: far past the step timeout.
const HANG: Duration = Duration::from_secs(20);
/// How long the frozen worker stays stopped: well past the 1 s detection budget.
const STOPPED_FOR: Duration = Duration::from_secs(3);
/// Bound on the chief's wait for the victim's next incarnation to run a closure.
const REJOIN_WAIT_MAX: Duration = Duration::from_secs(40);

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Each closure pulls `w` (split over both PS), records who ran it, and pushes the gradient of
/// `|w - TARGET|²`. The victim closure's first attempt publishes its worker's PID and then
/// either hangs (scenario "hang") or waits, frozen by the test, until it is continued
/// (scenario "freeze"). The chief then schedules more closures until the victim's worker has
/// come back as a new incarnation and run one.
fn program() -> Program {
    Program::new("ps-retire-test")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, args: &[u8]| {
            let incarnation = std::env::var(cohort::launch::INCARNATION_ENV).unwrap_or_default();
            record_run(ctx.worker_index(), &incarnation, ctx.closure_id());
            let w = ctx.pull("w")?;
            let note = format!("{} {incarnation}", ctx.worker_index());
            if args.first() == Some(&1) && claim_pid_file(VICTIM_PID, &note) {
                if scenario() == "hang" {
                    // Alive and heartbeating, but the step does not end in time.
                    std::thread::sleep(HANG);
                } else {
                    let continued = child_dir().join(CONTINUED);
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while !continued.exists() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            } else {
                std::thread::sleep(Duration::from_millis(40));
            }
            ctx.push_dense("w", fit_gradient(&w))?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            for i in 0..STEPS {
                coordinator.schedule_encoded("fit", vec![u8::from(i == VICTIM)])?;
            }
            coordinator.join()?;
            let (_, victim) = read_pid_file(&child_dir().join(VICTIM_PID))
                .ok_or_else(|| CoordinatorError::other("the victim never started"))?;
            let deadline = Instant::now() + REJOIN_WAIT_MAX;
            while !ran_again(&victim) {
                if Instant::now() > deadline {
                    return Err(CoordinatorError::other(format!(
                        "worker {victim} never came back as a new incarnation"
                    )));
                }
                for _ in 0..4 {
                    coordinator.schedule_encoded("fit", vec![0])?;
                }
                coordinator.join()?;
            }
            write_report(&ledger_and_stats(coordinator)?)
        })
}

/// Appends one run to the runs journal.
fn record_run(worker: u32, incarnation: &str, closure: u64) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(child_dir().join(RUNS))
    {
        let _ = f.write_all(format!("{worker} {incarnation} {closure}\n").as_bytes());
    }
}

/// The runs journal: (worker index, incarnation, closure).
fn runs(dir: &std::path::Path) -> Vec<(u32, u64, u64)> {
    std::fs::read_to_string(dir.join(RUNS))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace().map(|v| v.parse::<u64>().ok());
            Some((p.next()?? as u32, p.next()??, p.next()??))
        })
        .collect()
}

/// Whether the victim (`"index incarnation"`) has run a closure as a newer incarnation.
fn ran_again(victim: &str) -> bool {
    let Some((index, incarnation)) = victim.split_once(' ') else {
        return false;
    };
    let (Ok(index), Ok(incarnation)) = (index.parse::<u32>(), incarnation.parse::<u64>()) else {
        return false;
    };
    runs(&child_dir())
        .iter()
        .any(|&(w, e, _)| w == index && e > incarnation)
}

#[test]
fn fence_1_a_worker_whose_step_outlives_the_step_timeout_is_retired_and_rejoins() {
    let run = Run::new(
        "ps-retire-hang",
        "hang",
        &[("COHORT_STEP_TIMEOUT", STEP_TIMEOUT)],
    );
    let report = run.launch();
    check_retired_and_rejoined(&run, &report);
}

#[test]
fn fence_1_a_falsely_declared_dead_worker_is_retired_when_it_wakes_and_rejoins() {
    let run = Run::new("ps-retire-freeze", "freeze", &[]);
    let fault = freeze_then_continue(run.path(VICTIM_PID), run.path(CONTINUED), STOPPED_FOR);
    let report = run.launch();
    fault.finish();
    check_retired_and_rejoined(&run, &report);
}

/// The victim's first incarnation exited `RETIRED_EXIT_CODE` (retired), a newer incarnation of it ran closures,
/// and every closure committed and took effect exactly once.
fn check_retired_and_rejoined(run: &Run, report: &serde_json::Value) {
    println!("report: {report}");
    let (_, victim) = read_pid_file(&run.path(VICTIM_PID)).expect("the victim's PID file");
    let (index, incarnation) = victim.split_once(' ').expect("index and incarnation");
    let (index, incarnation): (u32, u64) = (index.parse().unwrap(), incarnation.parse().unwrap());
    let task = format!("worker/{index}");
    let exits = run.exits();
    assert!(
        exits
            .iter()
            .any(|e| e.task == task && e.incarnation == incarnation && e.code == RETIRED_EXIT_CODE),
        "the fenced incarnation {incarnation} of {task} did not exit {RETIRED_EXIT_CODE} \
         (retired): {exits:?}"
    );
    let runs = runs(&run.dir);
    assert!(
        runs.iter().any(|&(w, e, _)| w == index && e > incarnation),
        "{task} never ran a closure as a new incarnation: {runs:?}"
    );
    let ledger = &report["ledger"];
    let scheduled = ledger["scheduled"].as_u64().unwrap();
    assert!(scheduled > STEPS as u64, "{report}");
    // LEDGER-1: every closure committed, none failed or pending; the victim's was re-run.
    assert_eq!(ledger["committed"], scheduled, "{report}");
    assert_eq!(ledger["failed"], 0, "{report}");
    assert_eq!(ledger["pending"], 0, "{report}");
    assert_eq!(ledger["balances"], true, "{report}");
    assert!(ledger["redispatched"].as_u64().unwrap() >= 1, "{report}");
    // PS-1: each closure's single push to each PS (w has a shard on both) applied once.
    assert_eq!(
        ps_counter(report, "applied"),
        [scheduled, scheduled],
        "{report}"
    );
}
