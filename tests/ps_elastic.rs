//! Elastic parameter servers across real processes (real QUIC on 127.0.0.1): a job launched
//! on 2 servers gets a third while it trains (a server the cluster spec does not name, started
//! by hand from its own TF_CONFIG with a certificate signed by the job's CA, joins the running
//! job), then loses ps/0 for good (SIGUSR1: it asks to leave, the chief moves its variables
//! onto the others, and it exits 0 and is not restarted). Each change happens at a checkpoint
//! cut: the job finishes with the ledger whole, nothing run again or handed back, every
//! closure's push applied exactly once (each row of a variable spread over the servers counts
//! every committed closure), and the variables spread over the servers in the job at the end.

mod ps_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cohort::data::Dataset;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use nix::sys::signal::Signal;
use ps_support::{child_dir, ledger_and_stats, marker, wait_for_file, write_report, Run, WAIT_MAX};

/// Rows of the variable spread over every server.
const ROWS: usize = 6;
/// Closures kept scheduled ahead of the one being fetched.
const AHEAD: usize = 4;
/// Steps trained in each phase once its servers are in the job.
const STEPS_PER_PHASE: usize = 30;
/// Bound on the chief's wait for a phase's servers.
const PHASE_WAIT_MAX: Duration = Duration::from_secs(60);
/// Steps of the job whose chief is killed after a server joined it.
const RESTART_STEPS: u64 = 150;
/// A checkpoint every this many steps there.
const RESTART_SAVE_EVERY: u64 = 10;
/// The first chief offers itself to be killed at this step (a checkpoint behind it).
const KILL_CHIEF_AT: u64 = 75;
/// The first chief's PID file.
const CHIEF_PID: &str = "chief.pid";
/// Marker files the chief writes when it is ready for the next change.
const GROW: &str = "grow";
const SHRINK: &str = "shrink";
/// The chief's TF_CONFIG, for the test to make the joining server's from.
const TF_CONFIG_FILE: &str = "tf_config.json";

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Every closure adds 1 to every row of `spread` (split over every server) and of `whole`
/// (on one server), with SGD at learning rate 1.
fn program() -> Program {
    Program::new("ps-elastic-test")
        .optimizer(cohort::optim::Optimizer::sgd(1.0))
        .dataset("ids", |ctx| {
            Ok(Dataset::range(0, 1_000_000, 1)
                .shard(ctx.num_input_pipelines, ctx.input_pipeline_id))
        })
        .step_encoded("add", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            ctx.next("ids")?;
            ctx.push_dense("spread", vec![-1.0; ROWS])?;
            ctx.push_dense("whole", vec![-1.0; 2])?;
            std::thread::sleep(Duration::from_millis(10));
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("spread", vec![ROWS])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_variable(VariableSpec::zeros("whole", vec![2]))?;
            coordinator.create_per_worker_dataset("ids")?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            let tf_config = std::env::var("TF_CONFIG").unwrap_or_default();
            write(&child_dir().join(TF_CONFIG_FILE), tf_config.as_bytes())?;
            if ps_support::scenario() == "chief-restart" {
                return chief_restart(coordinator);
            }
            // By hand: ps/2 joins, then ps/0 leaves. Through the launcher: 2 -> 3 -> 1.
            let shrunk_to: &[u32] = match ps_support::scenario().as_str() {
                "launcher" => &[0],
                _ => &[1, 2],
            };
            let mut trainer = Trainer::default();
            trainer.train(coordinator, STEPS_PER_PHASE)?;
            marker(GROW)?;
            let grown = trainer.train_until(coordinator, &[0, 1, 2])?;
            trainer.train(coordinator, STEPS_PER_PHASE)?;
            marker(SHRINK)?;
            let shrunk = trainer.train_until(coordinator, shrunk_to)?;
            trainer.train(coordinator, STEPS_PER_PHASE)?;
            trainer.finish(coordinator, grown, shrunk)
        })
}

/// ps/2 joins by hand; once a checkpoint holds its share, the chief is killed. The restarted
/// chief knows only its spec's two servers: it restores the checkpoint onto them, ps/2
/// registers with it again and gets its share back at a cut, and the job finishes.
fn chief_restart(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    use cohort::checkpoint::{CheckpointManager, CheckpointPolicy};
    let dir = coordinator
        .checkpoint_dir()
        .ok_or_else(|| CoordinatorError::other("no checkpoint_dir"))?;
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 3,
    };
    let mut manager = CheckpointManager::new(dir, policy, Instant::now())
        .map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
    let restored = coordinator.restore_checkpoint(&mut manager)?;
    let mut step = restored.unwrap_or(0);
    if restored.is_none() {
        let tf_config = std::env::var("TF_CONFIG").unwrap_or_default();
        write(&child_dir().join(TF_CONFIG_FILE), tf_config.as_bytes())?;
        marker(GROW)?;
    }
    // ps/2 is in the job (again, after a restart) before the chief trains on.
    let deadline = Instant::now() + PHASE_WAIT_MAX;
    let in_job = |c: &ClusterCoordinator| c.topology().servers.keys().copied().eq([0, 1, 2]);
    while !in_job(coordinator) && Instant::now() < deadline {
        let value = coordinator.schedule_encoded("add", Vec::new())?;
        coordinator.fetch_encoded(&value)?;
        step += 1;
    }
    let grown = in_job(coordinator);
    while step < RESTART_STEPS {
        let value = coordinator.schedule_encoded("add", Vec::new())?;
        coordinator.fetch_encoded(&value)?;
        step += 1;
        if step % RESTART_SAVE_EVERY == 0 {
            coordinator.save_checkpoint(&mut manager, step)?;
            if restored.is_none() && step >= KILL_CHIEF_AT {
                ps_support::claim_pid_file(CHIEF_PID, "");
            }
        }
    }
    coordinator.join()?;
    let mut report = ledger_and_stats(coordinator)?;
    report["restored_step"] = serde_json::json!(restored);
    report["final_step"] = serde_json::json!(step);
    report["grown"] = serde_json::json!(grown);
    report["spread"] = serde_json::json!(coordinator.read_variable("spread")?);
    report["whole"] = serde_json::json!(coordinator.read_variable("whole")?);
    report["servers"] =
        serde_json::json!(coordinator.topology().servers.keys().collect::<Vec<_>>());
    write_report(&report)
}

#[derive(Default)]
struct Trainer {
    in_flight: std::collections::VecDeque<cohort::program::RemoteValue<cohort::program::Encoded>>,
}

impl Trainer {
    fn train(
        &mut self,
        coordinator: &ClusterCoordinator,
        steps: usize,
    ) -> Result<(), CoordinatorError> {
        for _ in 0..steps {
            while self.in_flight.len() < AHEAD {
                self.in_flight
                    .push_back(coordinator.schedule_encoded("add", Vec::new())?);
            }
            let value = self.in_flight.pop_front().expect("scheduled above");
            coordinator.fetch_encoded(&value)?;
        }
        Ok(())
    }

    /// Trains until the job's servers are `servers`, at most [`PHASE_WAIT_MAX`]; whether they
    /// came to be.
    fn train_until(
        &mut self,
        coordinator: &ClusterCoordinator,
        servers: &[u32],
    ) -> Result<bool, CoordinatorError> {
        let deadline = Instant::now() + PHASE_WAIT_MAX;
        while Instant::now() < deadline {
            let now: Vec<u32> = coordinator.topology().servers.keys().copied().collect();
            if now == servers {
                return Ok(true);
            }
            self.train(coordinator, 1)?;
        }
        Ok(false)
    }

    fn finish(
        mut self,
        coordinator: &ClusterCoordinator,
        grown: bool,
        shrunk: bool,
    ) -> Result<(), CoordinatorError> {
        while let Some(value) = self.in_flight.pop_front() {
            coordinator.fetch_encoded(&value)?;
        }
        coordinator.join()?;
        let mut report = ledger_and_stats(coordinator)?;
        report["grown"] = serde_json::json!(grown);
        report["shrunk"] = serde_json::json!(shrunk);
        report["spread"] = serde_json::json!(coordinator.read_variable("spread")?);
        report["whole"] = serde_json::json!(coordinator.read_variable("whole")?);
        report["servers"] =
            serde_json::json!(coordinator.topology().servers.keys().collect::<Vec<_>>());
        report["layouts"] =
            serde_json::to_value(coordinator.layouts()).map_err(CoordinatorError::other)?;
        write_report(&report)
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), CoordinatorError> {
    ps_support::write_atomic(path, bytes).map_err(CoordinatorError::other)
}

/// Starts ps/2 by hand: the job's TF_CONFIG with its own address added, and a certificate
/// signed by the job's CA (the launcher keeps the CA's key in its certificates directory).
fn start_joining_server(dir: &Path, launch_dir: &Path, checkpoints: &Path) -> Child {
    use cohort_transport::{ClusterCa, NodeId, CA_FILE};

    let tf_text = std::fs::read_to_string(dir.join(TF_CONFIG_FILE)).expect("the TF_CONFIG");
    let mut tf: serde_json::Value = serde_json::from_str(&tf_text).expect("TF_CONFIG is JSON");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let servers = tf["cluster"]["ps"].as_array_mut().expect("a ps list");
    servers.push(serde_json::json!(format!("127.0.0.1:{port}")));
    let index = servers.len() - 1;
    assert_eq!(index, 2);
    tf["task"] = serde_json::json!({ "type": "ps", "index": index });
    let certs = launch_dir.join("certs");
    let ca = ClusterCa::from_pem(
        &std::fs::read_to_string(certs.join(CA_FILE)).unwrap(),
        &std::fs::read_to_string(certs.join("ca.key")).expect("the launcher keeps ca.key"),
    )
    .unwrap();
    ca.issue(&NodeId::new("ps", index as u32))
        .unwrap()
        .save(&certs)
        .unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cluster_task", "--nocapture"])
        .env(ps_support::CHILD_ENV, "1")
        .env(ps_support::DIR_ENV, dir)
        .env("TF_CONFIG", tf.to_string())
        .env("COHORT_CERTS", &certs)
        .env("COHORT_CHECKPOINT_DIR", checkpoints)
        .env("COHORT_DETECTION_BUDGET", "3s")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ps/2")
}

/// The joining server's exit code, waiting at most [`WAIT_MAX`] (killed past it).
fn exit_code(mut child: Child) -> Option<i32> {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_server_joins_and_another_leaves_a_running_job_at_cuts_with_nothing_lost() {
    let run = Run::new("ps-elastic", "elastic", &[]);
    let dir = run.dir.clone();
    let launch_dir = run.path("launch");
    let checkpoints = run.path("checkpoints");
    let (grow, shrink) = (run.path(GROW), run.path(SHRINK));
    let joined = std::sync::Arc::new(std::sync::Mutex::new(None));
    let joiner = std::sync::Arc::clone(&joined);
    let ckpt_dir = checkpoints.clone();
    let changes = ps_support::beside(move |cancel| {
        if !wait_for_file(&grow, &cancel) {
            return;
        }
        eprintln!("[test] starting ps/2, which joins the running job");
        *joiner.lock().unwrap() = Some(start_joining_server(&dir, &launch_dir, &ckpt_dir));
        if !wait_for_file(&shrink, &cancel) {
            return;
        }
        let pid_file = cohort::launch::pid_file(
            &launch_dir,
            cohort::cluster::TaskId::new(cohort::cluster::TaskType::Ps, 0),
        );
        let (pid, _) = ps_support::read_pid_file(&pid_file).expect("ps/0's pid file");
        eprintln!("[test] asking ps/0 to leave the job (SIGUSR1)");
        ps_support::signal(pid, Signal::SIGUSR1);
    });
    let checkpoints_env = checkpoints.display().to_string();
    let (code, exits) = run.launch_with_exits(&[
        ("COHORT_CHECKPOINT_DIR", checkpoints_env.as_str()),
        ("COHORT_DETECTION_BUDGET", "3s"),
    ]);
    changes.finish();
    let joined_code = joined.lock().unwrap().take().map(exit_code);
    assert_eq!(code, 0, "the job failed; its log is above");
    assert_eq!(
        joined_code,
        Some(Some(0)),
        "ps/2 ran and exited 0 at the chief's goodbye"
    );

    let report = run.report();
    assert_eq!(report["grown"], true, "ps/2 joined: {report}");
    assert_eq!(report["shrunk"], true, "ps/0 left: {report}");
    assert_eq!(report["servers"], serde_json::json!([1, 2]), "{report}");

    // LEDGER-1: whole; the moves ran nothing again and handed nothing back.
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], ledger["committed"], "{ledger}");
    assert_eq!(ledger["pending"], 0, "{ledger}");
    assert_eq!(ledger["failed"], 0, "{ledger}");
    assert_eq!(ledger["rolled_back"], 0, "{ledger}");
    assert_eq!(ledger["redispatched"], 0, "{ledger}");
    assert_eq!(ledger["ps_restores"], 2, "one restore per move: {ledger}");

    // PS-1 across both moves: every row holds every committed closure's push exactly once.
    let committed = ledger["committed"].as_u64().unwrap() as f64;
    let spread: Vec<f64> = serde_json::from_value(report["spread"].clone()).unwrap();
    assert_eq!(spread, vec![committed; ROWS], "{report}");
    let whole: Vec<f64> = serde_json::from_value(report["whole"].clone()).unwrap();
    assert_eq!(whole, vec![committed; 2], "{report}");

    // The variables are on the servers in the job, spread over both, and ps/2 took pushes.
    let layouts = report["layouts"].as_array().unwrap();
    let spread_on: Vec<u64> = layouts[0]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ps"].as_u64().unwrap())
        .collect();
    assert_eq!(spread_on, [1, 2], "{report}");
    let applied = ps_support::ps_counter(&report, "applied");
    assert_eq!(applied.len(), 2, "{report}");
    assert!(applied.iter().all(|n| *n > 0), "{applied:?}");

    // ps/0 left with exit 0 and was not restarted.
    let ps0: Vec<_> = exits
        .iter()
        .filter(|e| e.task.to_string() == "ps/0")
        .collect();
    assert_eq!(ps0.len(), 1, "{exits:?}");
    assert_eq!(ps0[0].code, Some(0), "{exits:?}");
}

/// `cohort scale --ps`: the launcher starts ps/2 (it joins the running job), then drains
/// ps/2 and ps/1 (each leaves once its variables moved, exits 0, and is not restarted).
#[test]
fn the_launcher_scales_servers_from_2_to_3_and_down_to_1_with_nothing_lost() {
    let mut run = Run::new("ps-elastic-launcher", "launcher", &[]);
    run.ps_max = 3;
    let launch_dir = run.path("launch");
    let checkpoints = run.path("checkpoints");
    let (grow, shrink) = (run.path(GROW), run.path(SHRINK));
    let refused = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&refused);
    let scaler = ps_support::beside(move |cancel| {
        if !wait_for_file(&grow, &cancel) {
            return;
        }
        // Refused, nothing changed: below 1, above the maximum.
        for servers in [0, 4] {
            let err = cohort::launch::request_scale_servers(&launch_dir, servers).unwrap_err();
            seen.lock().unwrap().push(err.to_string());
        }
        eprintln!("[test] scaling to 3 parameter servers");
        cohort::launch::request_scale_servers(&launch_dir, 3).expect("a request for 3");
        if !wait_for_file(&shrink, &cancel) {
            return;
        }
        eprintln!("[test] scaling to 1 parameter server");
        cohort::launch::request_scale_servers(&launch_dir, 1).expect("a request for 1");
    });
    let checkpoints_env = checkpoints.display().to_string();
    let (code, exits) = run.launch_with_exits(&[
        ("COHORT_CHECKPOINT_DIR", checkpoints_env.as_str()),
        ("COHORT_DETECTION_BUDGET", "3s"),
    ]);
    scaler.finish();
    assert_eq!(code, 0, "the job failed; its log is above");
    let refused = refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].contains("--ps 0: a job needs at least 1 parameter server"),
        "{refused:?}"
    );
    assert!(
        refused[1].contains("--ps 4: the job may have at most 3 parameter servers"),
        "{refused:?}"
    );

    let report = run.report();
    assert_eq!(report["grown"], true, "{report}");
    assert_eq!(report["shrunk"], true, "{report}");
    assert_eq!(report["servers"], serde_json::json!([0]), "{report}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], ledger["committed"], "{ledger}");
    assert_eq!(ledger["failed"], 0, "{ledger}");
    assert_eq!(ledger["rolled_back"], 0, "{ledger}");
    assert_eq!(ledger["redispatched"], 0, "{ledger}");
    let committed = ledger["committed"].as_u64().unwrap() as f64;
    let spread: Vec<f64> = serde_json::from_value(report["spread"].clone()).unwrap();
    assert_eq!(spread, vec![committed; ROWS], "{report}");
    let whole: Vec<f64> = serde_json::from_value(report["whole"].clone()).unwrap();
    assert_eq!(whole, vec![committed; 2], "{report}");
    // The drained servers exited 0 once each and were not restarted.
    for task in ["ps/1", "ps/2"] {
        let seen: Vec<_> = exits
            .iter()
            .filter(|e| e.task.to_string() == task)
            .collect();
        assert_eq!(seen.len(), 1, "{task}: {exits:?}");
        assert_eq!(seen[0].code, Some(0), "{task}: {exits:?}");
    }
}

/// A chief SIGKILLed after a server joined by hand: the restarted chief (its spec names two
/// servers) restores the last checkpoint onto them, the joined server registers with it again
/// and gets its share back at a cut, and the job finishes with every row holding each of its
/// steps exactly once.
#[test]
fn a_chief_killed_after_a_server_joined_resumes_and_the_server_joins_again() {
    let mut run = Run::new("ps-elastic-chief", "chief-restart", &[]);
    run.restart_chief = true;
    let dir = run.dir.clone();
    let launch_dir = run.path("launch");
    let checkpoints = run.path("checkpoints");
    let grow = run.path(GROW);
    let chief_pid = run.path(CHIEF_PID);
    let joined = std::sync::Arc::new(std::sync::Mutex::new(None));
    let joiner = std::sync::Arc::clone(&joined);
    let ckpt_dir = checkpoints.clone();
    let faults = ps_support::beside(move |cancel| {
        if !wait_for_file(&grow, &cancel) {
            return;
        }
        eprintln!("[test] starting ps/2, which joins the running job");
        *joiner.lock().unwrap() = Some(start_joining_server(&dir, &launch_dir, &ckpt_dir));
        let Some(pid) = ps_support::wait_for_pid(&chief_pid, &cancel) else {
            return;
        };
        eprintln!("[test] killing the chief (SIGKILL)");
        ps_support::signal(pid, Signal::SIGKILL);
    });
    let checkpoints_env = checkpoints.display().to_string();
    let code = run.launch_code_with(&[
        ("COHORT_CHECKPOINT_DIR", checkpoints_env.as_str()),
        ("COHORT_DETECTION_BUDGET", "3s"),
    ]);
    faults.finish();
    let joined_code = joined.lock().unwrap().take().map(exit_code);
    assert_eq!(code, 0, "the job failed; its log is above");
    assert_eq!(joined_code, Some(Some(0)), "ps/2 ran to the goodbye");
    let report = run.report();
    let restored = report["restored_step"]
        .as_u64()
        .expect("the chief restarted");
    assert!(restored >= KILL_CHIEF_AT, "{report}");
    assert_eq!(report["grown"], true, "ps/2 joined the new chief: {report}");
    assert_eq!(report["servers"], serde_json::json!([0, 1, 2]), "{report}");
    let steps = report["final_step"].as_u64().unwrap();
    assert!(steps >= RESTART_STEPS, "{report}");
    // Every step's push is in every row exactly once: what the checkpoint held, then each
    // step the new chief ran.
    let spread: Vec<f64> = serde_json::from_value(report["spread"].clone()).unwrap();
    assert_eq!(spread, vec![steps as f64; ROWS], "{report}");
    let whole: Vec<f64> = serde_json::from_value(report["whole"].clone()).unwrap();
    assert_eq!(whole, vec![steps as f64; 2], "{report}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], ledger["committed"], "{ledger}");
    assert_eq!(ledger["failed"], 0, "{ledger}");
}
