//! Shared harness of the MultiWorkerMirrored tests that run several workers of a test's own
//! code: each worker a thread of the test process ([`in_process_pair`]) or a process of the
//! test binary re-executed ([`process_pair`]), with its own strategy, over real QUIC on
//! loopback.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::cluster::ClusterConfig;
use cohort::strategy::MultiWorkerConfig;
use cohort_transport::{ClusterCa, NodeId};

/// Set in a worker process of [`process_pair`]: the file its result goes to.
pub const CHILD_OUT_ENV: &str = "COHORT_MWMS_TEST_OUT";
/// Set in a worker process of [`process_pair`]: the certificates' directory.
const CHILD_CERTS_ENV: &str = "COHORT_MWMS_TEST_CERTS";
/// The most a worker process of [`process_pair`] may run.
pub const PROCESS_WAIT_MAX: Duration = Duration::from_secs(120);

/// Two workers' cluster: certificates in `dir`, endpoints on free loopback ports; each
/// worker's `TF_CONFIG`.
fn pair_cluster(name: &str, dir: &Path) -> Vec<String> {
    cluster_of(name, 2, dir)
}

/// `workers` workers' cluster: certificates in `dir`, endpoints on free loopback ports; each
/// worker's `TF_CONFIG`.
fn cluster_of(name: &str, workers: usize, dir: &Path) -> Vec<String> {
    let ca = ClusterCa::generate(name).unwrap();
    let mut addrs = Vec::new();
    // Held until all are picked: a port released at once could be picked twice.
    let mut held = Vec::new();
    for i in 0..workers {
        ca.issue(&NodeId::new("worker", i as u32))
            .unwrap()
            .save(dir)
            .unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        addrs.push(format!("\"{}\"", socket.local_addr().unwrap()));
        held.push(socket);
    }
    drop(held);
    (0..workers)
        .map(|i| {
            format!(
                r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {i}}}}}"#,
                addrs.join(", ")
            )
        })
        .collect()
}

/// In a worker process of [`process_pair`]: runs `worker(config)` with this process's
/// cluster and writes what it returns where the parent reads it, then exits. Elsewhere (the
/// test itself): returns at once.
pub fn run_if_worker_process<T: serde::Serialize>(worker: impl FnOnce(MultiWorkerConfig) -> T) {
    let Ok(out) = std::env::var(CHILD_OUT_ENV) else {
        return;
    };
    let cluster = ClusterConfig::from_env()
        .expect("the worker's TF_CONFIG")
        .expect("TF_CONFIG is set");
    let certs = std::env::var(CHILD_CERTS_ENV).expect("the certificates' directory");
    let result = worker(MultiWorkerConfig::new(cluster, certs));
    std::fs::write(&out, serde_json::to_vec(&result).unwrap()).expect("write the result");
    std::process::exit(0);
}

/// Runs two workers as processes of this test binary (`--exact child_test`, whose body calls
/// [`run_if_worker_process`]), their certificates in a fresh directory; waits for both (at
/// most [`PROCESS_WAIT_MAX`], then kills them) and returns what each wrote, in worker order.
pub fn process_pair<T: serde::de::DeserializeOwned>(name: &str, child_test: &str) -> Vec<T> {
    process_pair_reporting(name, child_test, None)
}

/// [`process_pair`], the workers writing their run reports (`cohort::run_report`, what
/// `cohort chaos run` reads) in `reports` where given.
pub fn process_pair_reporting<T: serde::de::DeserializeOwned>(
    name: &str,
    child_test: &str,
    reports: Option<&Path>,
) -> Vec<T> {
    let dir = std::env::temp_dir().join(format!("cohort-mwms-proc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let outs: Vec<PathBuf> = (0..2)
        .map(|i| dir.join(format!("worker-{i}.json")))
        .collect();
    let mut children: Vec<_> = pair_cluster(name, &dir)
        .into_iter()
        .zip(&outs)
        .map(|(tf_config, out)| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", child_test, "--nocapture"])
                .env("TF_CONFIG", tf_config)
                .env(CHILD_OUT_ENV, out)
                .env(CHILD_CERTS_ENV, &dir)
                .stdin(Stdio::null());
            if let Some(reports) = reports {
                command.env(cohort::run_report::RUN_REPORT_DIR_ENV, reports);
            }
            command.spawn().expect("start a worker process")
        })
        .collect();
    let deadline = Instant::now() + PROCESS_WAIT_MAX;
    let mut codes = vec![None; children.len()];
    while codes.iter().any(Option::is_none) && Instant::now() < deadline {
        for (child, code) in children.iter_mut().zip(&mut codes) {
            if code.is_none() {
                *code = child.try_wait().unwrap().map(|status| status.code());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (child, code) in children.iter_mut().zip(&codes) {
        if code.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    assert!(
        codes.iter().all(|c| *c == Some(Some(0))),
        "the worker processes ended with {codes:?} (None: still running after {PROCESS_WAIT_MAX:?}, killed); their logs are above"
    );
    let results = outs
        .iter()
        .map(|out| serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    results
}

/// Runs `worker(i, config)` on a thread for each of two workers in this process (their
/// certificates in a fresh directory, their endpoints on free loopback ports); their results.
pub fn in_process_pair<T: Send + 'static>(
    name: &str,
    worker: fn(usize, MultiWorkerConfig) -> T,
) -> Vec<T> {
    let dir = std::env::temp_dir().join(format!("cohort-mwms-{name}-{}", std::process::id()));
    let tf_configs = pair_cluster(name, &dir);
    let threads: Vec<_> = tf_configs
        .into_iter()
        .enumerate()
        .map(|(i, tf_config)| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let cluster = ClusterConfig::from_tf_config(&tf_config).unwrap();
                worker(i, MultiWorkerConfig::new(cluster, dir))
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Worker processes of this test binary (`--exact child_test`, whose body calls
/// [`run_if_worker_process`]) that a test can kill and start again: each is killed (by its own
/// PID) when the group is dropped.
pub struct WorkerProcesses {
    dir: PathBuf,
    child_test: String,
    tf_configs: Vec<String>,
    children: Vec<Option<std::process::Child>>,
}

impl WorkerProcesses {
    /// Starts `workers` workers, their certificates in a fresh directory.
    pub fn start(name: &str, workers: usize, child_test: &str) -> Self {
        Self::start_with(name, workers, child_test, |_| {})
    }

    /// As [`WorkerProcesses::start`], calling `prepare(dir)` first (to leave files the
    /// workers read).
    pub fn start_with(
        name: &str,
        workers: usize,
        child_test: &str,
        prepare: impl FnOnce(&Path),
    ) -> Self {
        let dir =
            std::env::temp_dir().join(format!("cohort-mwms-group-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tf_configs = cluster_of(name, workers, &dir);
        prepare(&dir);
        let mut group = Self {
            dir,
            child_test: child_test.to_owned(),
            tf_configs,
            children: (0..workers).map(|_| None).collect(),
        };
        for i in 0..workers {
            group.spawn(i);
        }
        group
    }

    /// The directory of the certificates and results (worker `i` writes `worker-<i>.json`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts worker `i` (again).
    pub fn spawn(&mut self, i: usize) {
        let out = self.dir.join(format!("worker-{i}.json"));
        let _ = std::fs::remove_file(&out);
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &self.child_test, "--nocapture"])
            .env("TF_CONFIG", &self.tf_configs[i])
            .env(CHILD_OUT_ENV, &out)
            .env(CHILD_CERTS_ENV, &self.dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("start a worker process");
        self.children[i] = Some(child);
    }

    /// SIGKILLs worker `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for every running worker (at most [`PROCESS_WAIT_MAX`]) and returns what each
    /// wrote, in worker order; asserts that each exited with 0.
    pub fn wait<T: serde::de::DeserializeOwned>(&mut self) -> Vec<T> {
        let deadline = Instant::now() + PROCESS_WAIT_MAX;
        let mut codes = vec![None; self.children.len()];
        while Instant::now() < deadline {
            for (child, code) in self.children.iter_mut().zip(&mut codes) {
                if let (Some(c), None) = (child.as_mut(), code.as_ref()) {
                    *code = c.try_wait().unwrap().map(|status| status.code());
                }
            }
            let running = self
                .children
                .iter()
                .zip(&codes)
                .any(|(c, code)| c.is_some() && code.is_none());
            if !running {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let unfinished: Vec<usize> = (0..codes.len()).filter(|&i| codes[i].is_none()).collect();
        for i in unfinished {
            self.kill(i);
        }
        assert!(
            codes.iter().all(|c| *c == Some(Some(0))),
            "the worker processes ended with {codes:?} (None: still running after {PROCESS_WAIT_MAX:?}, killed); their logs are above"
        );
        (0..self.children.len())
            .map(|i| {
                let out = self.dir.join(format!("worker-{i}.json"));
                serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
            })
            .collect()
    }
}

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
