//! A minimal kubelet: one thread per task that runs it in its host's network namespace and
//! restarts it with the SAME environment as Kubernetes' `restartPolicy: ExitCode` does (the
//! policy Kubeflow's training operator uses): an exit of 128 or more (a death by signal N
//! counts as 128 + N) is restarted after a small backoff, up to a restart limit; 0 means the
//! task is done; 1 to 127 is a permanent failure. No incarnation is ever given: the process
//! derives its own.
//!
//! The test kills a task only through [`Kubelet::kill`] (SIGKILL to the child it started, by
//! the handle that still owns it, so never to a reused PID), and [`Kubelet::hold`] keeps a
//! dead task down while its host is changed (as a pod rescheduled elsewhere).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Restarts allowed per task before it counts as failed (`backoffLimit`-like).
const RESTART_LIMIT: u32 = 8;
/// First restart backoff; doubled after each restart, at most [`BACKOFF_MAX`].
const BACKOFF: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_millis(800);
/// How often the kubelet looks at its child.
const POLL: Duration = Duration::from_millis(20);

/// How a task's supervision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0: the task is done.
    Done,
    /// An exit below 128: a permanent failure, not restarted.
    Failed(i32),
    /// Restart-me exits past the restart limit.
    RestartLimit,
    /// The test stopped supervising it.
    Stopped,
}

/// What the kubelet thread shares with the test.
#[derive(Default)]
struct State {
    child: Option<Child>,
    /// Every exit so far, as Kubernetes reports it (128 + N for signal N).
    exits: Vec<i32>,
    starts: u32,
    held: bool,
    stopping: bool,
    outcome: Option<Outcome>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What to run for one task.
pub struct TaskSpec {
    /// Its short name (`worker-1`), for logs.
    pub name: String,
    /// Its host's namespace.
    pub netns: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Its whole environment (nothing is inherited but `PATH`).
    pub env: Vec<(String, String)>,
    /// Where its stdout and stderr go (every start appends).
    pub log: PathBuf,
    /// Kept down until [`Kubelet::release`].
    pub held: bool,
}

/// Supervises one task; stops it (SIGKILL if still running) on drop.
pub struct Kubelet {
    name: String,
    log: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Kubelet {
    /// Starts supervising `spec` (the first start is at once unless it is held).
    pub fn start(spec: TaskSpec) -> Kubelet {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                held: spec.held,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let name = spec.name.clone();
        let log = spec.log.clone();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("kubelet-{name}"))
            .spawn(move || supervise(&spec, &thread_shared))
            .expect("kubelet thread");
        Kubelet {
            name,
            log,
            shared,
            thread: Some(thread),
        }
    }

    /// SIGKILLs the running process (kill -9); false when none is running.
    pub fn kill(&self) -> bool {
        let mut state = self.shared.lock();
        let Some(child) = state.child.as_mut() else {
            return false;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        eprintln!("[kubelet] kill -9 {} (pid {})", self.name, child.id());
        child.kill().is_ok()
    }

    /// Keeps the task down after its next exit until [`Kubelet::release`].
    pub fn hold(&self) {
        self.shared.lock().held = true;
    }

    /// Lets a held task start again.
    pub fn release(&self) {
        self.shared.lock().held = false;
        self.shared.changed.notify_all();
    }

    /// Waits (at most `limit`) until the task has exited `n` times; false on timeout.
    pub fn wait_exits(&self, n: usize, limit: Duration) -> bool {
        self.wait_until(limit, |s| s.exits.len() >= n)
    }

    /// Waits (at most `limit`) until the task has been started `n` times; false on timeout.
    pub fn wait_starts(&self, n: u32, limit: Duration) -> bool {
        self.wait_until(limit, |s| s.starts >= n)
    }

    /// Waits (at most `limit`) for the end of supervision: `None` on timeout.
    pub fn wait_outcome(&self, limit: Duration) -> Option<Outcome> {
        self.wait_until(limit, |s| s.outcome.is_some());
        self.shared.lock().outcome
    }

    fn wait_until(&self, limit: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut state = self.shared.lock();
        while !done(&state) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Every exit so far (128 + N for signal N).
    pub fn exits(&self) -> Vec<i32> {
        self.shared.lock().exits.clone()
    }

    /// Every start's output.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops supervising: no more restarts, the running process (if any) is SIGKILLed.
    pub fn stop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            if let Some(child) = state.child.as_mut() {
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                }
            }
        }
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The kubelet's loop: start, watch, decide.
fn supervise(spec: &TaskSpec, shared: &Shared) {
    let mut restarts = 0u32;
    let outcome = loop {
        // Held (or stopping): wait for the release.
        {
            let mut state = shared.lock();
            while state.held && !state.stopping {
                state = shared
                    .changed
                    .wait_timeout(state, Duration::from_millis(100))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            if state.stopping {
                break Outcome::Stopped;
            }
            match spawn(spec, state.starts + 1) {
                Ok(child) => {
                    state.child = Some(child);
                    state.starts += 1;
                }
                Err(e) => {
                    eprintln!("[kubelet] {}: could not start: {e}", spec.name);
                    break Outcome::Failed(-1);
                }
            }
        }
        shared.changed.notify_all();
        let code = loop {
            std::thread::sleep(POLL);
            let mut state = shared.lock();
            let Some(child) = state.child.as_mut() else {
                break -1;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    use std::os::unix::process::ExitStatusExt;
                    let code = status
                        .code()
                        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                    state.exits.push(code);
                    break code;
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("[kubelet] {}: wait failed: {e}", spec.name);
                    break -1;
                }
            }
        };
        shared.changed.notify_all();
        let _ = append(&spec.log, &format!("--- [kubelet] exited {code}\n"));
        if shared.lock().stopping {
            break Outcome::Stopped;
        }
        match code {
            0 => break Outcome::Done,
            c if c < 128 => {
                eprintln!("[kubelet] {} failed for good: exit {c}", spec.name);
                break Outcome::Failed(c);
            }
            c => {
                restarts += 1;
                if restarts > RESTART_LIMIT {
                    eprintln!("[kubelet] {}: restart limit reached", spec.name);
                    break Outcome::RestartLimit;
                }
                let backoff = (BACKOFF * 2u32.pow(restarts - 1)).min(BACKOFF_MAX);
                eprintln!(
                    "[kubelet] {} exited {c}: restart {restarts} in {backoff:?}",
                    spec.name
                );
                std::thread::sleep(backoff);
            }
        }
    };
    shared.lock().outcome = Some(outcome);
    shared.changed.notify_all();
}

/// Starts the task in its namespace: `ip netns exec NS COMMAND`, with exactly its environment.
fn spawn(spec: &TaskSpec, start: u32) -> std::io::Result<Child> {
    append(
        &spec.log,
        &format!("--- [kubelet] start {start} of {}\n", spec.name),
    )?;
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let err = out.try_clone()?;
    Command::new("ip")
        .args(["netns", "exec", &spec.netns])
        .args(&spec.command)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
}

fn append(path: &PathBuf, text: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}
