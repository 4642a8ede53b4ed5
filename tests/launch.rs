//! The local launcher runs every task as its own process, restarts a task that dies with a
//! newer incarnation, ends the job when the chief exits (a peer chief that was preempted is
//! restarted instead, and the workers finishing end the job), and stops everything on request.
//!
//! The children are this test binary re-executed in "child mode" (see `child_task`).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use cohort::cluster::{ClusterConfig, TaskId, TaskType};
use cohort::launch::{
    LaunchConfig, LaunchOutcome, Launcher, RestartLimits, CERTS_ENV, INCARNATION_ENV,
};

const CHILD_ENV: &str = "COHORT_LAUNCH_TEST_CHILD";

/// Child mode: record "task incarnation" in the journal; the chief exits after a while with the
/// code it was told (a restarted chief, with `CHIEF_AGAIN_RUN_MS`, runs that long instead), the
/// others run until they are killed (or, with `TASKS_EXIT_0_MS`, exit 0 after that long, as
/// after the chief's goodbye).
#[test]
fn child_task() {
    let Ok(journal) = std::env::var(CHILD_ENV) else {
        return;
    };
    let config = ClusterConfig::from_env()
        .expect("valid TF_CONFIG")
        .expect("TF_CONFIG set");
    let incarnation = std::env::var(INCARNATION_ENV).expect("incarnation set");
    let certs = PathBuf::from(std::env::var(CERTS_ENV).expect("certs dir set"));
    assert!(certs.join("ca.pem").is_file(), "launcher wrote the CA");
    let restarted = std::fs::read_to_string(&journal).is_ok_and(|lines| {
        lines
            .lines()
            .any(|l| l.starts_with(&format!("{} ", config.task)))
    });
    let line = format!("{} {incarnation}\n", config.task);
    append(Path::new(&journal), &line);
    if config.task.task_type == TaskType::Chief {
        let again = std::env::var("CHIEF_AGAIN_RUN_MS")
            .ok()
            .filter(|_| restarted);
        let run_ms: u64 = again
            .or_else(|| std::env::var("CHIEF_RUN_MS").ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500);
        std::thread::sleep(Duration::from_millis(run_ms));
        let code: i32 = std::env::var("CHIEF_EXIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        std::process::exit(code);
    }
    if let Some(ms) = std::env::var("TASKS_EXIT_0_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
        std::process::exit(0);
    }
    loop {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn killed_worker_is_restarted_with_a_newer_incarnation_and_chief_exit_ends_the_job() {
    let dir = temp_dir("restart");
    let journal = dir.join("journal");
    let mut config = config(
        &dir,
        &journal,
        &[("CHIEF_RUN_MS", "2500"), ("CHIEF_EXIT", "0")],
    );
    config.kill_once = Some((TaskId::new(TaskType::Worker, 1), Duration::from_millis(600)));
    let started = Instant::now();
    let mut launcher = Launcher::start(config).unwrap();
    assert!(launcher.pid(TaskId::new(TaskType::Ps, 0)).is_some());
    let outcome = launcher.supervise(&AtomicBool::new(false)).unwrap();
    assert_eq!(outcome, LaunchOutcome::ChiefExited(0));
    assert!(started.elapsed() < Duration::from_secs(60));
    let lines = std::fs::read_to_string(&journal).unwrap();
    let worker1: Vec<u64> = lines
        .lines()
        .filter_map(|l| l.strip_prefix("worker/1 "))
        .map(|e| e.parse().unwrap())
        .collect();
    assert_eq!(worker1.len(), 2, "worker/1 started twice: {lines}");
    assert!(
        worker1[1] > worker1[0],
        "FENCE-1: restart has a newer incarnation: {worker1:?}"
    );
    for task in ["chief/0", "ps/0", "worker/0"] {
        assert_eq!(
            lines.lines().filter(|l| l.starts_with(task)).count(),
            1,
            "{task}: {lines}"
        );
    }
    assert_eq!(
        launcher.pid(TaskId::new(TaskType::Worker, 0)),
        None,
        "children stopped"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer chief (MultiWorkerMirrored) that leaves on a preemption notice is restarted, the job
/// going on; when every other task finishes while it is away, the job is done, its restart
/// stopped. A coordinator chief's preemption ends the job.
#[test]
fn a_preempted_peer_chief_is_restarted_and_the_workers_finishing_end_the_job() {
    let dir = temp_dir("peer-chief");
    let journal = dir.join("journal");
    let env = [
        ("CHIEF_RUN_MS", "300"),
        ("CHIEF_EXIT", "143"),
        ("CHIEF_AGAIN_RUN_MS", "60000"),
        ("TASKS_EXIT_0_MS", "2500"),
    ];
    let mut launch = config(&dir, &journal, &env);
    launch.num_ps = 0;
    launch.peer_chief = true;
    let started = Instant::now();
    let mut launcher = Launcher::start(launch).unwrap();
    let outcome = launcher.supervise(&AtomicBool::new(false)).unwrap();
    assert_eq!(outcome, LaunchOutcome::WorkersFinished);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the restart was stopped"
    );
    let lines = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(
        lines.lines().filter(|l| l.starts_with("chief/0 ")).count(),
        2,
        "the preempted chief started again: {lines}"
    );
    assert_eq!(launcher.pid(TaskId::new(TaskType::Chief, 0)), None);
    let _ = std::fs::remove_dir_all(&dir);

    let dir = temp_dir("coordinator-chief");
    let journal = dir.join("journal");
    let mut launch = config(&dir, &journal, &env);
    launch.num_ps = 0;
    let mut launcher = Launcher::start(launch).unwrap();
    let outcome = launcher.supervise(&AtomicBool::new(false)).unwrap();
    assert_eq!(outcome, LaunchOutcome::ChiefExited(143));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_task_that_exits_0_has_finished_and_is_not_restarted() {
    let dir = temp_dir("finished");
    let journal = dir.join("journal");
    let config = config(
        &dir,
        &journal,
        &[("CHIEF_RUN_MS", "2000"), ("TASKS_EXIT_0_MS", "200")],
    );
    let mut launcher = Launcher::start(config).unwrap();
    let outcome = launcher.supervise(&AtomicBool::new(false)).unwrap();
    assert_eq!(outcome, LaunchOutcome::ChiefExited(0));
    let lines = std::fs::read_to_string(&journal).unwrap();
    for task in ["chief/0", "ps/0", "worker/0", "worker/1"] {
        assert_eq!(
            lines.lines().filter(|l| l.starts_with(task)).count(),
            1,
            "{task} started once: {lines}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chief_exit_code_is_reported() {
    let dir = temp_dir("exitcode");
    let journal = dir.join("journal");
    let mut launcher = Launcher::start(config(
        &dir,
        &journal,
        &[("CHIEF_RUN_MS", "300"), ("CHIEF_EXIT", "3")],
    ))
    .unwrap();
    assert_eq!(
        launcher.supervise(&AtomicBool::new(false)).unwrap(),
        LaunchOutcome::ChiefExited(3)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stop_request_stops_every_child() {
    let dir = temp_dir("stop");
    let journal = dir.join("journal");
    let mut launcher =
        Launcher::start(config(&dir, &journal, &[("CHIEF_RUN_MS", "60000")])).unwrap();
    let pids: Vec<u32> = launcher
        .cluster()
        .tasks()
        .filter_map(|t| launcher.pid(t))
        .collect();
    assert_eq!(pids.len(), 4);
    assert!(matches!(
        launcher.supervise(&AtomicBool::new(true)).unwrap(),
        LaunchOutcome::Stopped { .. }
    ));
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || is_zombie_or_gone(pid),
            "pid {pid} still running"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_evaluator_task_is_launched_with_its_own_certificate_beside_the_cluster() {
    let dir = temp_dir("evaluator");
    let journal = dir.join("journal");
    let mut config = config(
        &dir,
        &journal,
        &[("CHIEF_RUN_MS", "1500"), ("CHIEF_EXIT", "0")],
    );
    config.num_evaluators = 1;
    let mut launcher = Launcher::start(config).unwrap();
    let evaluator = TaskId::new(TaskType::Evaluator, 0);
    assert!(launcher.cluster().tasks().any(|t| t == evaluator));
    assert!(dir.join("certs").join("evaluator-0.pem").is_file());
    assert_eq!(
        launcher.supervise(&AtomicBool::new(false)).unwrap(),
        LaunchOutcome::ChiefExited(0)
    );
    let lines = std::fs::read_to_string(&journal).unwrap();
    assert!(
        lines.lines().any(|l| l.starts_with("evaluator/0 ")),
        "the evaluator ran with its task from TF_CONFIG: {lines}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zero_workers_is_a_clear_error() {
    let dir = temp_dir("zero");
    let mut config = config(&dir, &dir.join("journal"), &[]);
    config.num_workers = 0;
    let err = Launcher::start(config).err().expect("refused");
    assert!(err.to_string().contains("--workers"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn config(dir: &Path, journal: &Path, env: &[(&str, &str)]) -> LaunchConfig {
    let mut vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.push((CHILD_ENV.into(), journal.display().to_string()));
    LaunchConfig {
        num_workers: 2,
        num_ps: 1,
        num_evaluators: 0,
        program: std::env::current_exe().unwrap(),
        args: vec!["--exact".into(), "child_task".into(), "--nocapture".into()],
        env: vars,
        run_dir: dir.to_path_buf(),
        restart: RestartLimits {
            restarts_max: 3,
            window: Duration::from_secs(30),
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
        },
        stop_grace: Duration::from_secs(2),
        kill_once: None,
        restart_chief: false,
        peer_chief: false,
        json_logs: false,
        metrics: false,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn append(path: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(line.as_bytes()).unwrap();
}

fn is_zombie_or_gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) == Some("Z"))
        .unwrap_or(true)
}
