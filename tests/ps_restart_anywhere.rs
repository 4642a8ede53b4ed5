//! Restarts without the launcher's help, across real processes over QUIC on 127.0.0.1: every
//! task runs with an empty `COHORT_INCARNATION`, as a pod that Kubernetes restarts with the
//! same environment, so each process derives its own incarnation. A worker SIGKILLed mid
//! training comes back, rejoins as a newer incarnation, and the job finishes with the ledger
//! whole and every closure applied exactly once.
//!
//! The processes are this test binary re-executed in child mode (`cluster_task`).

mod ps_support;

use std::time::Duration;

use cohort::cluster::{TaskId, TaskType};
use cohort::launch::CHAOS_MARKER;
use cohort::program::{Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{fit_gradient, ledger_and_stats, ps_counter, write_report, Run, EXITS_FILE};

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

const FIRST: usize = 40;
const SECOND: usize = 80;

/// Linear regression toward `TARGET`, in two batches; between them the chief prints the chaos
/// marker, at which the launcher SIGKILLs worker/1.
fn program() -> Program {
    Program::new("restart-anywhere")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let w = ctx.pull("w")?;
            ctx.push_dense("w", fit_gradient(&w))?;
            std::thread::sleep(Duration::from_millis(20));
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator
                .wait_for_workers(coordinator.num_workers() as usize, Duration::from_secs(30))?;
            for _ in 0..FIRST {
                coordinator.schedule_encoded("fit", Vec::new())?;
            }
            coordinator.join()?;
            println!("{CHAOS_MARKER} kill worker/1");
            for _ in 0..SECOND {
                coordinator.schedule_encoded("fit", Vec::new())?;
            }
            coordinator.join()?;
            let mut report = ledger_and_stats(coordinator)?;
            report["w"] = serde_json::json!(coordinator.read_variable("w")?);
            write_report(&report)?;
            Ok(())
        })
}

#[test]
fn a_worker_restarted_with_the_same_environment_rejoins_and_nothing_is_lost() {
    let mut run = Run::new("restart-anywhere", "train", &[]);
    // The environment of every process, first and restarted alike, names no incarnation.
    run.env
        .push((cohort::launch::INCARNATION_ENV.to_string(), String::new()));
    run.kill_once = Some((
        TaskId::new(TaskType::Worker, 1),
        // The chief's marker comes long before this.
        Duration::from_secs(600),
    ));
    let (code, exits) = run.launch_with_exits(&[]);
    assert_eq!(code, 0, "the chief failed; its log is above");
    let worker1 = TaskId::new(TaskType::Worker, 1);
    assert!(
        exits
            .iter()
            .any(|e| e.task == worker1 && e.signal == Some(9)),
        "worker/1 was killed: {exits:?}"
    );
    let report = run.report();
    let ledger = &report["ledger"];
    let total = (FIRST + SECOND) as u64;
    assert_eq!(ledger["scheduled"], total, "{ledger}");
    assert_eq!(ledger["committed"], total, "LEDGER-1: {ledger}");
    assert_eq!(ledger["balances"], true, "{ledger}");
    assert_eq!(ps_counter(&report, "applied"), [total, total], "{report}");
    // The restarted worker/1 was taken back: the chief's goodbye reached it at the end (exit
    // 0), which it would not have as a refused incarnation (retired, 171, until the restart
    // budget ran out and the launch failed).
    let journal = std::fs::read_to_string(run.path(EXITS_FILE)).unwrap_or_default();
    assert!(
        journal
            .lines()
            .any(|l| l.starts_with("worker/1 ") && l.ends_with(" 0")),
        "the restarted worker/1 exits 0 after the chief's goodbye; exit journal:\n{journal}"
    );
    assert!(
        !journal.lines().any(|l| l.ends_with(" 171")),
        "no incarnation was retired; exit journal:\n{journal}"
    );
}
