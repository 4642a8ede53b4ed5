//! Shared harness for the parameter-server end-to-end tests (`tests/ps_*.rs`): a local cluster
//! of real processes, each the test binary re-executed in child mode (`cluster_task`), a
//! scratch directory the processes and the test share (reports, markers, PID files), and
//! helpers to signal the test's own worker processes.
//!
//! The chief of each scenario writes a JSON report into the scratch directory; the test reads
//! it after the launcher returns. Every child that returns from its role records its task,
//! incarnation and exit code in an exit journal there too ([`Run::exits`]).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cohort::cluster::TaskId;
use cohort::launch::{LaunchConfig, LaunchOutcome, Launcher, RestartLimits, TaskExit};
use cohort::program::{ClusterCoordinator, CoordinatorError};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Set in every child: run the role instead of the test.
pub const CHILD_ENV: &str = "COHORT_PS_TEST_CHILD";
/// The scratch directory shared by the test and its processes.
pub const DIR_ENV: &str = "COHORT_PS_TEST_DIR";
/// Which scenario the chief runs.
pub const SCENARIO_ENV: &str = "COHORT_PS_TEST_SCENARIO";
/// The report the chief writes, inside the scratch directory.
pub const REPORT_FILE: &str = "report.json";
/// The exit journal, inside the scratch directory: a line `task incarnation code` for every
/// child that returned from its role (one killed by a signal writes none).
pub const EXITS_FILE: &str = "exits.log";

/// Bound on every wait a test does on a file or a condition.
pub const WAIT_MAX: Duration = Duration::from_secs(30);

/// True in a child process (the test binary re-executed as a task).
pub fn is_child() -> bool {
    std::env::var(CHILD_ENV).is_ok()
}

/// Child mode of a test binary: in a child, runs this process's role of `program()` and exits
/// with its code; in the test itself, returns at once.
pub fn run_if_child(program: impl FnOnce() -> cohort::program::Program) {
    if is_child() {
        let code = cohort::program::main(program());
        record_exit(code);
        std::process::exit(code);
    }
}

/// Appends this child's task, incarnation and exit `code` to the exit journal.
fn record_exit(code: i32) {
    use std::io::Write;
    let task = cohort::cluster::ClusterConfig::from_env()
        .ok()
        .flatten()
        .map_or_else(|| "?".to_string(), |c| c.task.to_string());
    let incarnation = std::env::var(cohort::launch::INCARNATION_ENV).unwrap_or_default();
    let line = format!("{task} {incarnation} {code}\n");
    // One small append-mode write per process: lines never interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(child_dir().join(EXITS_FILE))
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// One line of the exit journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The task, e.g. `worker/1`.
    pub task: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// Its exit code.
    pub code: i32,
}

/// Where the scenarios' linear regression drives the variable `w`.
pub const TARGET: [f32; 4] = [1.0, -2.0, 3.0, 0.5];

/// The gradient of `|w - TARGET|²` at `w`.
pub fn fit_gradient(w: &[f32]) -> Vec<f32> {
    w.iter().zip(TARGET).map(|(w, t)| 2.0 * (w - t)).collect()
}

/// The scratch directory, as a child sees it.
pub fn child_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// The scenario, as the chief sees it.
pub fn scenario() -> String {
    std::env::var(SCENARIO_ENV).unwrap_or_default()
}

/// Writes the chief's report (atomically: a reader never sees half of it).
pub fn write_report(report: &serde_json::Value) -> Result<(), CoordinatorError> {
    write_atomic(
        &child_dir().join(REPORT_FILE),
        report.to_string().as_bytes(),
    )
    .map_err(CoordinatorError::other)
}

/// The ledger and every PS's counters, as JSON for a report.
pub fn ledger_and_stats(
    coordinator: &ClusterCoordinator,
) -> Result<serde_json::Value, CoordinatorError> {
    let ledger = coordinator.ledger()?;
    let stats = coordinator.ps_stats()?;
    Ok(serde_json::json!({
        "ledger": {
            "scheduled": ledger.scheduled, "committed": ledger.committed, "failed": ledger.failed,
            "cancelled": ledger.cancelled, "unavailable": ledger.unavailable,
            "redispatched": ledger.redispatched, "rejected_stale": ledger.rejected_stale,
            "pending": ledger.pending, "balances": ledger.balances(),
            "rolled_back": ledger.rolled_back, "ps_restores": ledger.ps_restores,
        },
        "ps": serde_json::to_value(&stats).map_err(CoordinatorError::other)?,
    }))
}

/// In the chief: writes the marker file `name` (the test waits for it with
/// [`wait_for_file`] before its next move).
pub fn marker(name: &str) -> Result<(), CoordinatorError> {
    write_atomic(&child_dir().join(name), b"1").map_err(CoordinatorError::other)
}

/// Waits (bounded by twice [`WAIT_MAX`]) for a file the chief writes; false if it never came
/// or `cancel` was set.
pub fn wait_for_file(path: &Path, cancel: &AtomicBool) -> bool {
    let deadline = Instant::now() + WAIT_MAX * 2;
    while Instant::now() < deadline && !cancel.load(Ordering::SeqCst) {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Milliseconds since the Unix epoch (comparable across the test's processes).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// In a worker: records this process's PID (then `note`) under `name` once (the first caller
/// wins), so the test can signal it. Returns true for the caller that wrote it.
pub fn claim_pid_file(name: &str, note: &str) -> bool {
    let path = child_dir().join(name);
    let claim = path.with_extension("claim");
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&claim)
    {
        Ok(_) => write_atomic(&path, format!("{} {note}", std::process::id()).as_bytes()).is_ok(),
        Err(_) => false,
    }
}

/// One end-to-end run: a scratch directory (removed on drop) and the launch settings.
pub struct Run {
    pub dir: PathBuf,
    pub scenario: String,
    pub env: Vec<(String, String)>,
    pub num_workers: u32,
    /// The most workers the job may have (elastic workers); at least `num_workers`.
    pub workers_max: u32,
    pub num_ps: u32,
    /// The most parameter servers the job may have (elastic servers); at least `num_ps`.
    pub ps_max: u32,
    pub restart: RestartLimits,
    /// A task the launcher SIGKILLs once, this long after launch (none by default).
    pub kill_once: Option<(TaskId, Duration)>,
    /// Restart a chief that asks for it (see `LaunchConfig::restart_chief`); off by default,
    /// so that a test sees the chief's own exit code.
    pub restart_chief: bool,
    /// Give every task a metrics endpoint (`LaunchConfig::metrics`); off by default.
    pub metrics: bool,
}

impl Run {
    /// A run of `scenario` on 2 PS × 2 workers with a 1 s detection budget and quick restarts.
    pub fn new(name: &str, scenario: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "cohort-{name}-{}-{}",
            std::process::id(),
            unix_ms()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the run's scratch directory");
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            dir,
            scenario: scenario.into(),
            env,
            num_workers: 2,
            workers_max: 2,
            num_ps: 2,
            ps_max: 2,
            restart: RestartLimits {
                restarts_max: 3,
                window: Duration::from_secs(60),
                backoff_base: Duration::from_millis(100),
                backoff_max: Duration::from_secs(1),
            },
            kill_once: None,
            restart_chief: false,
            metrics: false,
        }
    }

    /// Launches the cluster and supervises it until the chief exits; returns the chief's
    /// exit code. Every child is stopped before this returns.
    pub fn launch_code(&self) -> i32 {
        self.launch_code_with(&[])
    }

    /// As [`Run::launch_code`], with extra environment for this launch only.
    pub fn launch_code_with(&self, extra_env: &[(&str, &str)]) -> i32 {
        self.launch_with_exits(extra_env).0
    }

    /// Launches with extra environment for this launch only and supervises the cluster to the
    /// chief's exit: the chief's code, and every task exit the launcher saw.
    pub fn launch_with_exits(&self, extra_env: &[(&str, &str)]) -> (i32, Vec<TaskExit>) {
        let _ = std::fs::remove_file(self.dir.join(REPORT_FILE));
        let _ = std::fs::remove_file(self.dir.join(EXITS_FILE));
        let mut env = self.env.clone();
        env.extend([
            (CHILD_ENV.to_string(), "1".to_string()),
            (DIR_ENV.to_string(), self.dir.display().to_string()),
            (SCENARIO_ENV.to_string(), self.scenario.clone()),
            ("COHORT_DETECTION_BUDGET".to_string(), "1s".to_string()),
        ]);
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let config = LaunchConfig {
            num_workers: self.num_workers,
            num_ps: self.num_ps,
            num_evaluators: 0,
            program: std::env::current_exe().expect("the test binary's path"),
            args: vec![
                "--exact".into(),
                "cluster_task".into(),
                "--nocapture".into(),
            ],
            env,
            run_dir: self.dir.join("launch"),
            restart: self.restart.clone(),
            stop_grace: Duration::from_secs(3),
            kill_once: self.kill_once,
            restart_chief: self.restart_chief,
            peer_chief: false,
            json_logs: false,
            metrics: self.metrics,
        };
        let workers_max = self.workers_max.max(self.num_workers);
        let ps_max = self.ps_max.max(self.num_ps);
        let mut launcher = Launcher::start_elastic_servers(config, workers_max, ps_max)
            .expect("start the local cluster");
        let code = match launcher
            .supervise(&AtomicBool::new(false))
            .expect("supervise the local cluster")
        {
            LaunchOutcome::ChiefExited(code) => code,
            LaunchOutcome::Stopped { .. } => panic!("the launcher was stopped"),
            // A parameter-server job's chief is no peer (`peer_chief` is off here).
            LaunchOutcome::WorkersFinished => panic!("the workers finished without the chief"),
        };
        (code, launcher.exits().cloned().collect())
    }

    /// Launches, expects the chief to succeed, and returns its report.
    pub fn launch(&self) -> serde_json::Value {
        let code = self.launch_code();
        assert_eq!(code, 0, "the chief failed; its log is above");
        self.report()
    }

    /// The chief's report of the last launch.
    pub fn report(&self) -> serde_json::Value {
        let path = self.dir.join(REPORT_FILE);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
        serde_json::from_str(&text).expect("the report is JSON")
    }

    /// A path inside the scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The exit journal of the last launch, in the order the children exited.
    pub fn exits(&self) -> Vec<Exit> {
        let text = std::fs::read_to_string(self.dir.join(EXITS_FILE)).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some(Exit {
                    task: parts.next()?.to_string(),
                    incarnation: parts.next()?.parse().ok()?,
                    code: parts.next()?.parse().ok()?,
                })
            })
            .collect()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded by [`WAIT_MAX`] or until `cancel`) for a PID file the test's own worker
/// wrote with [`claim_pid_file`].
pub fn wait_for_pid(path: &Path, cancel: &AtomicBool) -> Option<u32> {
    let deadline = Instant::now() + WAIT_MAX;
    while Instant::now() < deadline && !cancel.load(Ordering::SeqCst) {
        if let Some((pid, _)) = read_pid_file(path) {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// A PID file's PID and note.
pub fn read_pid_file(path: &Path) -> Option<(u32, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (pid, note) = text.split_once(' ')?;
    Some((pid.parse().ok()?, note.to_string()))
}

/// Sends `signal` to one of the test's own worker processes (a child of its launcher).
pub fn signal(pid: u32, signal: Signal) {
    let raw = i32::try_from(pid).expect("pid fits pid_t");
    if let Err(e) = nix::sys::signal::kill(Pid::from_raw(raw), signal) {
        eprintln!("[test] {signal} to pid {pid}: {e}");
    }
}

/// Runs `fault` on a thread beside the launcher; the returned guard cancels it and joins it.
pub fn beside(fault: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Beside {
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let handle = std::thread::spawn(move || fault(flag));
    Beside {
        cancel,
        handle: Some(handle),
    }
}

/// Beside the launcher: waits for the worker PID in `pid_file`, SIGSTOPs that worker for
/// `stopped_for` (past the detection budget: it is declared dead and fenced), SIGCONTs it and
/// then writes `continued_file`, which the frozen step waits for before it pushes.
pub fn freeze_then_continue(
    pid_file: PathBuf,
    continued_file: PathBuf,
    stopped_for: Duration,
) -> Beside {
    beside(move |cancel| {
        let Some(pid) = wait_for_pid(&pid_file, &cancel) else {
            return;
        };
        signal(pid, Signal::SIGSTOP);
        eprintln!("[test] SIGSTOP worker pid {pid} for {stopped_for:?}");
        sleep_unless(&cancel, stopped_for);
        signal(pid, Signal::SIGCONT);
        eprintln!("[test] SIGCONT worker pid {pid}");
        let _ = std::fs::write(&continued_file, b"1");
    })
}

/// A fault-injecting thread running beside the launcher.
pub struct Beside {
    cancel: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Beside {
    /// Cancels the thread (if still waiting) and waits for it; panics if it panicked.
    pub fn finish(mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().expect("the fault thread panicked");
        }
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Sleeps `d` unless cancelled first; false if cancelled.
pub fn sleep_unless(cancel: &AtomicBool, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if cancel.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// A JSON array of u64 counters from every PS in a report, e.g. `ps_counter(r, "applied")`.
pub fn ps_counter(report: &serde_json::Value, key: &str) -> Vec<u64> {
    report["ps"]
        .as_array()
        .expect("report has ps stats")
        .iter()
        .map(|p| p[key].as_u64().expect("counter is a number"))
        .collect()
}
