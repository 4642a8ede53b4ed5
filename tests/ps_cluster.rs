//! Parameter-server training across real processes over QUIC on 127.0.0.1: a chief, parameter
//! servers and workers, launched and supervised by the local launcher. The processes are this
//! test binary re-executed in child mode (`cluster_task`), running the program of `program()`.
//!
//! Each scenario's chief writes a JSON report (ledger, PS counters, final variables) that the
//! test checks.

mod ps_support;

use ps_support::{fit_gradient, TARGET};

use std::time::Duration;

use cohort::cluster::{TaskId, TaskType};
use cohort::launch::RestartLimits;
use cohort::program::{CoordinatorError, Program, StepContext, StepError, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{ledger_and_stats, ps_counter, write_report, Run};

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Linear regression toward `TARGET`: each step pulls `w` (split over both parameter servers)
/// and a row-sparse table, pushes the gradient of `|w - TARGET|²`, and touches two rows of the
/// table so sparse pushes go through as well.
fn program() -> Program {
    Program::new("ps-test")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, args: &[u8]| {
            let w = ctx.pull("w")?;
            let grad = fit_gradient(&w);
            ctx.push_dense("w", grad)?;
            let ids = vec![u64::from(ctx.worker_index()), 7];
            let _rows = ctx.pull_rows("table", &ids)?;
            ctx.push_rows("table", ids, vec![1.0; 4])?;
            if args.first() == Some(&1) {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(ctx.worker_index().to_le_bytes().to_vec())
        })
        .step_encoded("fail", |_ctx: &mut StepContext<'_>, _args: &[u8]| {
            Err(StepError::Step("bad batch: label 11 out of range".into()))
        })
        .chief(|coordinator| {
            let scenario = ps_support::scenario();
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_variable(VariableSpec::zeros("table", vec![10, 2]))?;
            coordinator
                .wait_for_workers(coordinator.num_workers() as usize, Duration::from_secs(30))?;
            let mut report = serde_json::json!({});
            match scenario.as_str() {
                "error" => {
                    for _ in 0..3 {
                        coordinator.schedule_encoded("fit", vec![1])?;
                    }
                    coordinator.schedule_encoded("fail", vec![])?;
                    for _ in 0..20 {
                        coordinator.schedule_encoded("fit", vec![1])?;
                    }
                    let err = coordinator
                        .join()
                        .expect_err("join reports the step's error");
                    report["join_error"] = serde_json::json!(err.to_string());
                    // The coordinator stays usable.
                    let value = coordinator.schedule_encoded("fit", vec![])?;
                    coordinator.join()?;
                    report["after_error_fetch"] =
                        serde_json::json!(coordinator.fetch_encoded(&value)?.len());
                }
                _ => {
                    let steps: usize = std::env::var("STEPS")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(60);
                    let mut values = Vec::new();
                    for _ in 0..steps {
                        values.push(coordinator.schedule_encoded("fit", vec![1])?);
                    }
                    coordinator.join()?;
                    let mut by_worker = [0u32; 8];
                    for v in &values {
                        let bytes = coordinator.fetch_encoded(v)?;
                        let worker = u32::from_le_bytes(
                            bytes
                                .try_into()
                                .map_err(|_| CoordinatorError::other("bad value"))?,
                        );
                        by_worker[worker as usize] += 1;
                    }
                    report["by_worker"] = serde_json::json!(by_worker);
                    if scenario == "goodbye" {
                        // The low watermark reaches the parameter servers within a second or
                        // so of the last commit.
                        let deadline = std::time::Instant::now() + Duration::from_secs(20);
                        while coordinator
                            .ps_stats()?
                            .iter()
                            .any(|s| s.finished_below < steps as u64)
                            && std::time::Instant::now() < deadline
                        {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            }
            let w = coordinator.read_variable("w")?;
            let table = coordinator.read_variable("table")?;
            let state = ledger_and_stats(coordinator)?;
            report["w"] = serde_json::json!(w);
            report["table"] = serde_json::json!(table);
            report["ledger"] = state["ledger"].clone();
            report["ps"] = state["ps"].clone();
            write_report(&report)?;
            Ok(())
        })
}

#[test]
fn training_converges_and_every_closure_commits_exactly_once() {
    let run = Run::new("ps-converge", "train", &[("STEPS", "60")]);
    let report = run.launch();
    let w: Vec<f32> = serde_json::from_value(report["w"].clone()).unwrap();
    for (w, t) in w.iter().zip(TARGET) {
        assert!((w - t).abs() < 1e-3, "w {w} vs target {t}");
    }
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], 60);
    assert_eq!(ledger["committed"], 60, "{ledger}");
    assert_eq!(ledger["balances"], true);
    // PS-1: each closure's single push to each PS (w has a shard on both) applied once.
    let applied = ps_counter(&report, "applied");
    assert_eq!(applied, [60, 60], "applied per PS");
    // Both workers took work.
    let by_worker: Vec<u32> = serde_json::from_value(report["by_worker"].clone()).unwrap();
    assert!(by_worker[0] > 0 && by_worker[1] > 0, "{by_worker:?}");
}

/// The end of a job: the chief says goodbye and every worker and parameter server exits 0 on
/// it (not 143 after the launcher's SIGTERM once the chief is gone, nor killed), once each:
/// the launcher restarts none of them. Meanwhile the low watermark has let every parameter
/// server forget the closure ids it kept for PS-1.
#[test]
fn at_the_end_of_a_job_the_chief_says_goodbye_and_every_task_exits_0_once() {
    let run = Run::new("ps-goodbye", "goodbye", &[("STEPS", "12")]);
    let report = run.launch();
    assert_eq!(report["ledger"]["committed"], 12, "{report}");
    let exits = run.exits();
    for task in ["chief/0", "ps/0", "ps/1", "worker/0", "worker/1"] {
        let codes: Vec<i32> = exits
            .iter()
            .filter(|e| e.task == task)
            .map(|e| e.code)
            .collect();
        assert_eq!(codes, [0], "{task}: {exits:?}");
    }
    // PS-1 with bounded memory: every closure is finished, so no id is kept any more.
    assert_eq!(ps_counter(&report, "finished_below"), [12, 12], "{report}");
    assert_eq!(ps_counter(&report, "applied_ids_held"), [0, 0], "{report}");
    assert_eq!(ps_counter(&report, "applied"), [12, 12], "{report}");
    assert_eq!(
        ps_counter(&report, "next_free_closure_id"),
        [12, 12],
        "{report}"
    );
}

#[test]
fn a_step_error_surfaces_at_join_cancels_the_queue_and_the_coordinator_stays_usable() {
    let run = Run::new("ps-error", "error", &[]);
    let report = run.launch();
    let err = report["join_error"].as_str().unwrap();
    assert!(err.contains("bad batch: label 11 out of range"), "{err}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["failed"], 1, "{ledger}");
    assert!(ledger["cancelled"].as_u64().unwrap() > 0, "{ledger}");
    assert_eq!(ledger["balances"], true);
    assert_eq!(report["after_error_fetch"], 4);
}

/// The launcher reaps a killed worker at once and reports its exit to the chief, which
/// declares that incarnation dead and re-dispatches its closure then. Here neither the
/// detection budget (300 s) nor a restart (none within 300 s) could tell the chief in the
/// test's lifetime (nextest ends it after 180 s): the job finishes only through the report.
#[test]
fn a_killed_worker_is_known_dead_from_its_supervisors_report_not_its_silence() {
    let mut run = Run::new("ps-reported", "train", &[("STEPS", "150")]);
    run.kill_once = Some((
        TaskId::new(TaskType::Worker, 1),
        Duration::from_millis(2500),
    ));
    run.restart = RestartLimits {
        restarts_max: 3,
        window: Duration::from_secs(600),
        backoff_base: Duration::from_secs(300),
        backoff_max: Duration::from_secs(300),
    };
    let (code, exits) = run.launch_with_exits(&[("COHORT_DETECTION_BUDGET", "300s")]);
    assert_eq!(code, 0, "the chief failed; its log is above");
    assert!(
        exits
            .iter()
            .any(|e| e.task == TaskId::new(TaskType::Worker, 1) && e.signal == Some(9)),
        "worker/1 was killed: {exits:?}"
    );
    let report = run.report();
    let ledger = &report["ledger"];
    assert_eq!(ledger["committed"], 150, "LEDGER-1: {ledger}");
    assert_eq!(ledger["balances"], true);
    assert_eq!(ps_counter(&report, "applied"), [150, 150], "{report}");
}

#[test]
fn a_worker_killed_mid_training_is_replaced_and_no_closure_is_lost_or_applied_twice() {
    let mut run = Run::new("ps-kill", "train", &[("STEPS", "150")]);
    run.kill_once = Some((
        TaskId::new(TaskType::Worker, 1),
        Duration::from_millis(2500),
    ));
    let report = run.launch();
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], 150, "{ledger}");
    assert_eq!(ledger["committed"], 150, "LEDGER-1: {ledger}");
    assert_eq!(ledger["balances"], true);
    // PS-1: every committed closure took effect exactly once on each PS, whether or not an
    // earlier attempt of it had pushed before its worker died.
    let applied = ps_counter(&report, "applied");
    assert_eq!(applied, [150, 150], "applied per PS; report: {report}");
    assert!(ledger["redispatched"].as_u64().unwrap() <= 1, "{ledger}");
    let w: Vec<f32> = serde_json::from_value(report["w"].clone()).unwrap();
    for (w, t) in w.iter().zip(TARGET) {
        assert!((w - t).abs() < 1e-3, "w {w} vs target {t}");
    }
}
