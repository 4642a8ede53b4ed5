//! Elastic workers across real processes (real QUIC on 127.0.0.1): a job launched with 2 of at
//! most 4 workers grows to 4 while it trains (workers past the cluster spec join the running
//! job, their per-worker datasets built before they get work), shrinks to 1 (workers are
//! drained: each finishes its closure, the chief keeps its dataset positions, it exits 0 and is
//! not restarted), and grows to 3 again (workers 1 and 2 join again and resume their input
//! pipelines where their drained incarnations stopped; the chief's goodbye reaches the joined
//! worker 2 at the end). The job finishes with the ledger whole, every closure's push applied
//! exactly once, and every input pipeline read without a gap or a repeat. Scale requests below 1 or
//! above the maximum are refused with nothing changed, and a worker whose certificate is not
//! signed by the cluster CA cannot join.

mod ps_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::data::Dataset;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{
    child_dir, ledger_and_stats, marker, scenario, wait_for_file, write_report, Run, WAIT_MAX,
};

/// The most workers of the elastic job: its input pipelines.
const WORKERS_MAX: u32 = 4;
/// Closures kept scheduled ahead of the one being fetched.
const AHEAD: usize = 6;
/// Steps trained in each phase once the workers it needs are live.
const STEPS_PER_PHASE: usize = 40;
/// Bound on the chief's wait for a phase's workers (the test fails if it passes).
const PHASE_WAIT_MAX: Duration = Duration::from_secs(60);
/// Marker files the chief writes when it is ready for the next scale request.
const GROW: &str = "grow";
const SHRINK: &str = "shrink";
const REGROW: &str = "regrow";
/// The chief's TF_CONFIG, for the test to make a joiner's from.
const TF_CONFIG_FILE: &str = "tf_config.json";
/// Written by the test once the foreign worker was refused.
const FOREIGN_DONE: &str = "foreign-done";

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Pipeline `p` of `WORKERS_MAX` reads `p, p + 4, p + 8, …`; each closure returns its worker
/// and the element it read, and adds 1 to both shards of `count` (SGD, learning rate 1).
fn program() -> Program {
    Program::new("elastic-test")
        .optimizer(cohort::optim::Optimizer::sgd(1.0))
        .dataset("ids", |ctx| {
            Ok(Dataset::range(0, 1_000_000, 1)
                .shard(ctx.num_input_pipelines, ctx.input_pipeline_id))
        })
        .step_encoded("read", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let element = ctx.next("ids")?;
            let value = element[0].to_scalar::<i64>()?;
            ctx.push_dense("count", vec![-1.0, -1.0])?;
            std::thread::sleep(Duration::from_millis(15));
            let mut out = u64::from(ctx.worker_index()).to_le_bytes().to_vec();
            out.extend_from_slice(&value.to_le_bytes());
            Ok(out)
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("count", vec![2])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_per_worker_dataset("ids")?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            match scenario().as_str() {
                "elastic" => elastic(coordinator),
                _ => foreign(coordinator),
            }
        })
}

/// Trains while the test grows the job to 4 workers and shrinks it to 1.
fn elastic(coordinator: &ClusterCoordinator) -> Result<(), CoordinatorError> {
    let mut trainer = Trainer::default();
    trainer.train(coordinator, STEPS_PER_PHASE)?;
    marker(GROW)?;
    let grown = trainer.train_until(coordinator, |live| live == WORKERS_MAX as usize)?;
    trainer.train(coordinator, STEPS_PER_PHASE)?;
    marker(SHRINK)?;
    let shrunk = trainer.train_until(coordinator, |live| live == 1)?;
    trainer.train(coordinator, STEPS_PER_PHASE)?;
    marker(REGROW)?;
    let regrown = trainer.train_until(coordinator, |live| live == 3)?;
    trainer.train(coordinator, STEPS_PER_PHASE)?;
    let phases = serde_json::json!({ "grown": grown, "shrunk": shrunk, "regrown": regrown });
    trainer.finish(coordinator, phases)
}

/// Trains while the test tries to join a worker with a foreign certificate.
fn foreign(coordinator: &ClusterCoordinator) -> Result<(), CoordinatorError> {
    let tf_config = std::env::var("TF_CONFIG").unwrap_or_default();
    ps_support::write_atomic(&child_dir().join(TF_CONFIG_FILE), tf_config.as_bytes())
        .map_err(CoordinatorError::other)?;
    let mut trainer = Trainer::default();
    let deadline = Instant::now() + PHASE_WAIT_MAX;
    while !child_dir().join(FOREIGN_DONE).exists() && Instant::now() < deadline {
        trainer.train(coordinator, 5)?;
    }
    let live = coordinator.live_workers()?;
    trainer.finish(coordinator, serde_json::json!({ "live_after": live }))
}

/// Schedules closures a few ahead and keeps what each returned.
#[derive(Default)]
struct Trainer {
    in_flight: std::collections::VecDeque<cohort::program::RemoteValue<cohort::program::Encoded>>,
    /// (worker, element) per committed closure.
    read: Vec<(u64, i64)>,
    max_live: usize,
}

impl Trainer {
    fn step(&mut self, coordinator: &ClusterCoordinator) -> Result<(), CoordinatorError> {
        while self.in_flight.len() < AHEAD {
            self.in_flight
                .push_back(coordinator.schedule_encoded("read", Vec::new())?);
        }
        let value = self.in_flight.pop_front().expect("scheduled above");
        let bytes = coordinator.fetch_encoded(&value)?;
        let bad = || CoordinatorError::other(format!("bad value {bytes:?}"));
        let worker = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| bad())?);
        let element = i64::from_le_bytes(bytes[8..].try_into().map_err(|_| bad())?);
        self.read.push((worker, element));
        self.max_live = self.max_live.max(coordinator.live_workers()?);
        Ok(())
    }

    fn train(
        &mut self,
        coordinator: &ClusterCoordinator,
        steps: usize,
    ) -> Result<(), CoordinatorError> {
        for _ in 0..steps {
            self.step(coordinator)?;
        }
        Ok(())
    }

    /// Trains until `done(live workers)`, at most [`PHASE_WAIT_MAX`]; whether it came.
    fn train_until(
        &mut self,
        coordinator: &ClusterCoordinator,
        done: impl Fn(usize) -> bool,
    ) -> Result<bool, CoordinatorError> {
        let deadline = Instant::now() + PHASE_WAIT_MAX;
        while Instant::now() < deadline {
            if done(coordinator.live_workers()?) {
                return Ok(true);
            }
            self.step(coordinator)?;
        }
        Ok(false)
    }

    fn finish(
        mut self,
        coordinator: &ClusterCoordinator,
        mut report: serde_json::Value,
    ) -> Result<(), CoordinatorError> {
        while !self.in_flight.is_empty() {
            self.step_without_scheduling(coordinator)?;
        }
        coordinator.join()?;
        let count: Vec<f32> = coordinator.read_variable("count")?;
        let stats = ledger_and_stats(coordinator)?;
        report["read"] = serde_json::json!(self.read);
        report["max_live"] = serde_json::json!(self.max_live);
        report["count"] = serde_json::json!(count);
        report["ledger"] = stats["ledger"].clone();
        report["ps"] = stats["ps"].clone();
        write_report(&report)
    }

    fn step_without_scheduling(
        &mut self,
        coordinator: &ClusterCoordinator,
    ) -> Result<(), CoordinatorError> {
        let value = self.in_flight.pop_front().expect("checked by the caller");
        let bytes = coordinator.fetch_encoded(&value)?;
        let worker = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
        let element = i64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
        self.read.push((worker, element));
        Ok(())
    }
}

/// `cohort scale --run-dir DIR --workers N`: its exit code and what it printed.
fn cohort_scale(run_dir: &Path, workers: &str) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["scale", "--run-dir"])
        .arg(run_dir)
        .args(["--workers", workers])
        .output()
        .expect("run cohort scale");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn a_job_grows_from_2_to_4_workers_and_shrinks_to_1_while_it_trains_with_nothing_lost() {
    let mut run = Run::new("elastic", "elastic", &[]);
    run.workers_max = WORKERS_MAX;
    let launch_dir = run.path("launch");
    let (grow, shrink, regrow) = (run.path(GROW), run.path(SHRINK), run.path(REGROW));
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&refusals);
    let scaler = ps_support::beside(move |cancel| {
        if !wait_for_file(&grow, &cancel) {
            return;
        }
        // Refused, and nothing changes: below 1 worker, above the maximum.
        let mut seen = seen.lock().unwrap();
        seen.push(cohort_scale(&launch_dir, "0"));
        seen.push(cohort_scale(&launch_dir, "5"));
        drop(seen);
        eprintln!("[test] scaling to 4 workers");
        let (code, text) = cohort_scale(&launch_dir, "4");
        assert_eq!(code, 0, "{text}");
        if !wait_for_file(&shrink, &cancel) {
            return;
        }
        eprintln!("[test] scaling to 1 worker");
        cohort::launch::request_scale(&launch_dir, 1).expect("a request for 1 worker");
        if !wait_for_file(&regrow, &cancel) {
            return;
        }
        eprintln!("[test] scaling to 3 workers again");
        cohort::launch::request_scale(&launch_dir, 3).expect("a request for 3 workers");
    });
    // A detection budget well above a step: no worker is taken for dead under load (a false
    // death would hand a closure back, which this test checks never happens with drains).
    let (code, exits) = run.launch_with_exits(&[
        ("COHORT_WORKER_WAIT", "60s"),
        ("COHORT_DETECTION_BUDGET", "3s"),
    ]);
    scaler.finish();
    assert_eq!(code, 0, "the job failed; its log is above");

    let refusals = refusals.lock().unwrap().clone();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    for (code, text) in &refusals {
        assert_eq!(*code, 2, "{text}");
    }
    assert!(
        refusals[0]
            .1
            .contains("--workers 0: a job needs at least 1 worker"),
        "{}",
        refusals[0].1
    );
    assert!(
        refusals[1]
            .1
            .contains("--workers 5: the job may have at most 4 workers"),
        "{}",
        refusals[1].1
    );

    let report = run.report();
    assert_eq!(
        report["grown"], true,
        "4 workers were live: {}",
        report["max_live"]
    );
    assert_eq!(report["shrunk"], true, "1 worker was left: {report}");
    assert_eq!(
        report["regrown"], true,
        "workers 1 and 2 joined again: {report}"
    );
    assert_eq!(report["max_live"], WORKERS_MAX, "{report}");

    // LEDGER-1: whole, nothing failed, nothing handed back or rolled back by the drains.
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], ledger["committed"], "{ledger}");
    assert_eq!(ledger["pending"], 0, "{ledger}");
    assert_eq!(ledger["failed"], 0, "{ledger}");
    assert_eq!(ledger["unavailable"], 0, "{ledger}");
    assert_eq!(
        ledger["redispatched"], 0,
        "a drain hands nothing back: {ledger}"
    );
    assert_eq!(ledger["rolled_back"], 0, "{ledger}");

    // PS-1: every closure's push applied exactly once on each server.
    let committed = ledger["committed"].as_u64().unwrap();
    let count: Vec<f64> = serde_json::from_value(report["count"].clone()).unwrap();
    assert_eq!(count, [committed as f64, committed as f64], "{report}");
    assert_eq!(
        ps_support::ps_counter(&report, "applied"),
        [committed, committed]
    );

    // Every pipeline read from its start without a gap or a repeat: a joiner's datasets were
    // built before it ran anything, and a drained worker read nothing after its last closure.
    let read: Vec<(u64, i64)> = serde_json::from_value(report["read"].clone()).unwrap();
    assert_eq!(read.len() as u64, committed);
    for pipeline in 0..i64::from(WORKERS_MAX) {
        let mut elements: Vec<i64> = read
            .iter()
            .filter(|(_, e)| e % i64::from(WORKERS_MAX) == pipeline)
            .map(|(_, e)| *e)
            .collect();
        elements.sort_unstable();
        let expected: Vec<i64> = (0..elements.len() as i64)
            .map(|k| pipeline + k * i64::from(WORKERS_MAX))
            .collect();
        assert_eq!(elements, expected, "pipeline {pipeline}");
        assert!(!elements.is_empty(), "worker/{pipeline} ran closures");
        // Pipeline p is read by worker p only.
        assert!(read
            .iter()
            .filter(|(_, e)| e % i64::from(WORKERS_MAX) == pipeline)
            .all(|(w, _)| *w as i64 == pipeline));
    }

    // Every worker process exited 0 by itself: a drained one once drained (never restarted),
    // one that stayed or joined again at the chief's goodbye, joined workers included.
    let journal = run.exits();
    let codes = |task: &str| -> Vec<i32> {
        journal
            .iter()
            .filter(|e| e.task == task)
            .map(|e| e.code)
            .collect()
    };
    assert_eq!(codes("worker/0"), [0], "stayed to the end: {journal:?}");
    assert_eq!(
        codes("worker/1"),
        [0, 0],
        "drained, joined again: {journal:?}"
    );
    assert_eq!(
        codes("worker/2"),
        [0, 0],
        "drained, joined again: {journal:?}"
    );
    assert_eq!(codes("worker/3"), [0], "drained: {journal:?}");
    // The launcher saw the drains and restarted none of them.
    for task in ["worker/2", "worker/3"] {
        let seen: Vec<_> = exits
            .iter()
            .filter(|e| e.task.to_string() == task)
            .collect();
        assert!(
            !seen.is_empty() && seen.iter().all(|e| e.code == Some(0)),
            "{task}: {exits:?}"
        );
    }
}

#[test]
fn a_worker_with_a_certificate_of_another_ca_cannot_join() {
    use cohort_transport::{ClusterCa, NodeId, CA_FILE};

    let run = Run::new("elastic-foreign", "foreign", &[]);
    let tf_config_file = run.path(TF_CONFIG_FILE);
    let done = run.path(FOREIGN_DONE);
    let foreign_dir = run.path("foreign-certs");
    let dir = run.dir.clone();
    let outcome = std::sync::Arc::new(std::sync::Mutex::new(None));
    let result = std::sync::Arc::clone(&outcome);
    let joiner = ps_support::beside(move |cancel| {
        if !wait_for_file(&tf_config_file, &cancel) {
            return;
        }
        // The job's TF_CONFIG, with this worker's address added as worker/2.
        let mut tf: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&tf_config_file).unwrap()).unwrap();
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let workers = tf["cluster"]["worker"].as_array_mut().unwrap();
        workers.push(serde_json::json!(format!("127.0.0.1:{port}")));
        let index = workers.len() - 1;
        tf["task"] = serde_json::json!({ "type": "worker", "index": index });
        // A certificate for that worker, from a CA the job does not know.
        let ca = ClusterCa::generate("foreign").unwrap();
        ca.issue(&NodeId::new("worker", index as u32))
            .unwrap()
            .save(&foreign_dir)
            .unwrap();
        std::fs::write(foreign_dir.join(CA_FILE), ca.cert_pem()).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "cluster_task", "--nocapture"])
            .env(ps_support::CHILD_ENV, "1")
            .env(ps_support::DIR_ENV, &dir)
            .env("TF_CONFIG", tf.to_string())
            .env("COHORT_CERTS", &foreign_dir)
            .env("COHORT_DETECTION_BUDGET", "1s")
            .env("COHORT_WORKER_WAIT", "20s")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + WAIT_MAX;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut stderr);
        }
        *result.lock().unwrap() = Some((status.and_then(|s| s.code()), stderr));
        std::fs::write(&done, b"1").unwrap();
    });
    let code = run.launch_code();
    joiner.finish();
    assert_eq!(code, 0, "the job failed; its log is above");
    let (status, stderr) = outcome
        .lock()
        .unwrap()
        .clone()
        .expect("the foreign worker was started");
    assert_eq!(status, Some(2), "refused as bad config: {stderr}");
    assert!(
        stderr.contains("failed on a certificate") && stderr.contains("signed by the cluster CA"),
        "{stderr}"
    );
    let report = run.report();
    assert_eq!(report["live_after"], 2, "{report}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], ledger["committed"], "{ledger}");
    assert_eq!(ledger["failed"], 0, "{ledger}");
}
