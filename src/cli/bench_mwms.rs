//! `cohort bench mwms`: MultiWorkerMirrored's training throughput with 2 and 3 worker
//! processes on 127.0.0.1 ([`crate::workloads::mwms_bench`]: the dense MLP 784-256-256-10,
//! 256 examples per worker and step). With `--peers`, TensorFlow's MultiWorkerMirroredStrategy
//! and PyTorch's DistributedDataParallel run the same workload in the same invocation
//! (`benches/peers/tf_mwms.py` and `torch_ddp.py`, from the Python `benches/peers/setup.sh`
//! makes) and the table gives the ratios of what was measured then; without it, or where a
//! peer cannot run, its column says "not measured".
//!
//! Each worker is this binary's hidden `mwms-member --bench-batch 256`, with its own
//! certificate from a CA made for the run and a `TF_CONFIG` naming every worker; the steps are
//! synchronous, so a run's rate is its slowest worker's timed steps over their time.

use crate::process::stdout::outln;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort_transport::{ClusterCa, NodeId, TlsError};

use super::CliError;

/// Examples per worker and step.
const BATCH_PER_WORKER: usize = 256;
/// Worker counts measured.
const WORKER_COUNTS: [usize; 2] = [2, 3];
/// Bound on one run, warm-up and forming included.
const RUN_MAX: Duration = Duration::from_secs(600);
/// The peers measured with `--peers`: their column's name, what they are, their program.
const PEERS: [(&str, &str, &str); 2] = [
    (
        "TF MWMS",
        "TensorFlow's MultiWorkerMirroredStrategy",
        "tf_mwms.py",
    ),
    (
        "PyTorch DDP",
        "PyTorch's DistributedDataParallel (gloo)",
        "torch_ddp.py",
    ),
];

/// Runs the benchmark (`steps` timed steps, `warmup` before them) and prints its table.
pub fn run(steps: usize, warmup: usize, peers: Option<&Path>) -> Result<(), CliError> {
    if steps == 0 {
        return Err(CliError::Usage("--steps: at least 1 timed step".into()));
    }
    let dir = crate::process::new_temp_dir("cohort-bench-mwms-")
        .map_err(|e| CliError::Failed(format!("a scratch directory: {e}")))?;
    let mut rows = Vec::new();
    for plaintext in [false, true] {
        for workers in WORKER_COUNTS {
            let rate = run_workers(&dir, workers, steps, warmup, plaintext)?;
            let plane = if plaintext { "plaintext (TCP)" } else { "QUIC" };
            outln!("{workers} workers over {plane}: {rate:.1} steps/s");
            rows.push((workers, plane, rate));
        }
    }
    // The peers, on the same workload and machine, in this invocation.
    let mut peer: BTreeMap<(usize, usize), Result<(f64, String), super::peers::PeerError>> =
        BTreeMap::new();
    for (index, (_, what, program)) in PEERS.iter().enumerate() {
        for workers in WORKER_COUNTS {
            let measured = super::peers::run_peer(
                peers,
                program,
                &[
                    format!("--workers={workers}"),
                    format!("--steps={steps}"),
                    format!("--warmup={warmup}"),
                ],
            );
            match &measured {
                Ok((rate, version)) => {
                    outln!("{what} ({version}), {workers} workers: {rate:.1} steps/s")
                }
                Err(super::peers::PeerError::NotAsked) => {}
                Err(why) => outln!("{what}, {workers} workers: not measured: {why}"),
            }
            peer.insert((index, workers), measured);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outln!(
        "\ncohort bench mwms: MultiWorkerMirrored, dense MLP {}-{}-{}-{} (relu, SGD), {BATCH_PER_WORKER} \
         examples per worker and step, 1 replica per worker, workers as processes on 127.0.0.1 \
         ({} cores, split among the workers' compute threads); {warmup} warm-up steps, then \
         {steps} timed",
        crate::workloads::mwms_bench::FEATURES,
        crate::workloads::mwms_bench::HIDDEN[0],
        crate::workloads::mwms_bench::HIDDEN[1],
        crate::workloads::mwms_bench::CLASSES,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let mut header = format!("{:<8} {:<16} {:>12}", "workers", "data plane", "steps/s");
    for (name, _, _) in PEERS {
        header.push_str(&format!(" {:>20} {:>8}", format!("{name} steps/s"), "ratio"));
    }
    outln!("{header}");
    for (workers, plane, rate) in rows {
        let mut line = format!("{workers:<8} {plane:<16} {rate:>12.1}");
        for index in 0..PEERS.len() {
            let (theirs, ratio) = match peer.get(&(index, workers)) {
                Some(Ok((theirs, _))) => {
                    (format!("{theirs:.1}"), format!("{:.2}x", rate / theirs))
                }
                _ => ("not measured".to_string(), "-".to_string()),
            };
            line.push_str(&format!(" {theirs:>20} {ratio:>8}"));
        }
        outln!("{line}");
    }
    if peers.is_none() {
        outln!(
            "peers: not measured (--peers runs TensorFlow's MultiWorkerMirroredStrategy and \
             PyTorch's DDP on this workload in the same run; bash benches/peers/setup.sh makes \
             their Python)"
        );
    }
    Ok(())
}

/// One run of `workers` processes: its rate in steps per second.
fn run_workers(
    dir: &Path,
    workers: usize,
    steps: usize,
    warmup: usize,
    plaintext: bool,
) -> Result<f64, CliError> {
    let failed = |what: &dyn std::fmt::Display| {
        CliError::Failed(format!("bench mwms, {workers} workers: {what}"))
    };
    let certs = dir.join(format!("certs-{workers}-{plaintext}"));
    let addrs = bench_nodes(&certs, workers).map_err(|e| failed(&e))?;
    let cluster =
        serde_json::to_string(&BTreeMap::from([("worker", &addrs)])).map_err(|e| failed(&e))?;
    let exe = std::env::current_exe().map_err(|e| failed(&e))?;
    // The workers share this machine's cores, as `cohort launch`'s tasks do: each gets its
    // share of compute threads (unless RAYON_NUM_THREADS says otherwise), rather than every
    // worker spreading each matrix product over all cores and fighting for them (2.2 to 2.6
    // times slower here).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match std::env::var(crate::process::COMPUTE_THREADS_ENV) {
        Ok(given) if crate::process::compute_threads_given() => given,
        _ => (cores / workers).max(1).to_string(),
    };
    let timed = run_bench_processes(
        workers,
        |index| {
            let tf_config = format!(
                r#"{{"cluster": {cluster}, "task": {{"type": "worker", "index": {index}}}}}"#
            );
            let mut command = Command::new(&exe);
            command
                .arg("mwms-member")
                .args(plaintext.then_some("--plaintext"))
                .arg("--certs")
                .arg(&certs)
                .args(["--bench-batch", &BATCH_PER_WORKER.to_string()])
                .args(["--bench-warmup", &warmup.to_string()])
                .args(["--steps", &steps.to_string()])
                .env("TF_CONFIG", tf_config)
                .env("RAYON_NUM_THREADS", &threads);
            command
        },
        parse_timed,
        RUN_MAX,
    )
    .map_err(|e| failed(&e))?;
    let slowest = timed
        .values()
        .map(|&(steps, seconds)| seconds / steps.max(1) as f64)
        .fold(0.0, f64::max);
    Ok(1.0 / slowest)
}

/// Certificates for `worker/0..count` under `certs` (a CA made for the run) and a free
/// 127.0.0.1 port for each (bound, then released for the process to bind right after).
pub(super) fn bench_nodes(certs: &Path, count: usize) -> Result<Vec<String>, BenchRunError> {
    std::fs::create_dir_all(certs).map_err(|source| BenchRunError::CertsDir {
        dir: certs.to_path_buf(),
        source,
    })?;
    let ca = ClusterCa::generate("bench")?;
    let mut addrs = Vec::new();
    for index in 0..count {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(BenchRunError::Port)?;
        addrs.push(
            socket
                .local_addr()
                .map_err(BenchRunError::Port)?
                .to_string(),
        );
        ca.issue(&NodeId::new("worker", index as u32))
            .and_then(|creds| creds.save(certs))?;
    }
    Ok(addrs)
}

/// Why a run of benchmark processes ([`bench_nodes`], [`run_bench_processes`]) failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum BenchRunError {
    /// The certificates directory could not be made.
    #[error("{}: {source}", dir.display())]
    CertsDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The run's CA or a process's certificate could not be made or saved.
    #[error(transparent)]
    Credentials(#[from] TlsError),
    /// No free 127.0.0.1 port could be found for a process.
    #[error("cannot find a free 127.0.0.1 port: {0}")]
    Port(#[source] std::io::Error),
    /// A process could not be started.
    #[error("cannot start process {index}: {source}")]
    Spawn {
        /// The process's index.
        index: usize,
        /// Why not.
        source: std::io::Error,
    },
    /// Not every process printed its result in time.
    #[error("no result within {bound:?}{}", Ended(ended))]
    NoResult {
        /// How long the run was waited for.
        bound: Duration,
        /// The processes that had ended by then.
        ended: Vec<EndedProcess>,
    },
    /// A process printed a result line that does not parse.
    #[error("process {index} said {line:?}")]
    BadResult {
        /// The process's index.
        index: usize,
        /// The line.
        line: String,
    },
    /// A process reported an error (a line starting `error `).
    #[error("process {index}: {line}{}", Ended(ended))]
    Failed {
        /// The process's index.
        index: usize,
        /// The line.
        line: String,
        /// The processes that had ended by then (the cause, where one died first).
        ended: Vec<EndedProcess>,
    },
    /// The processes exited before each printed its result.
    #[error("the processes exited with {results} of {count} results{}", Ended(ended))]
    Exited {
        /// Results printed.
        results: usize,
        /// Processes run.
        count: usize,
        /// How each ended.
        ended: Vec<EndedProcess>,
    },
}

/// A benchmark process that had ended when its run failed: how, and the last lines it wrote
/// to stderr (a panic's message, say), so that a failed run names its cause.
#[derive(Debug)]
pub(super) struct EndedProcess {
    /// The process's index.
    pub(super) index: usize,
    /// How it ended.
    pub(super) status: std::process::ExitStatus,
    /// Its last lines on stderr, oldest first.
    pub(super) stderr_tail: Vec<String>,
}

/// Lines of a process's stderr kept for [`EndedProcess::stderr_tail`].
const STDERR_TAIL_LINES: usize = 6;

/// The ended processes of a failed run, as a suffix of its error message (empty for none).
struct Ended<'a>(&'a [EndedProcess]);

impl std::fmt::Display for Ended<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for ended in self.0 {
            write!(f, "; process {} had ended ({})", ended.index, ended.status)?;
            if !ended.stderr_tail.is_empty() {
                write!(f, ", its last words: {}", ended.stderr_tail.join(" | "))?;
            }
        }
        Ok(())
    }
}

/// Starts `count` processes (`command(index)`, stdin closed, stdout read, the tail of stderr
/// kept) and waits, at most `bound`, until each printed a `bench ...` line that `parse` takes
/// (the text after `bench `); a line starting `error `, a line `parse` refuses, or a process
/// that exits without its line fails the run (and stops the others), naming the processes that
/// had ended by then. Results by process index.
pub(super) fn run_bench_processes<T>(
    count: usize,
    mut command: impl FnMut(usize) -> Command,
    parse: impl Fn(&str) -> Option<T>,
    bound: Duration,
) -> Result<BTreeMap<usize, T>, BenchRunError> {
    let (tx, lines) = mpsc::channel();
    let mut children: Vec<Child> = Vec::new();
    let mut tails: Vec<StderrTail> = Vec::new();
    for index in 0..count {
        let spawned = command(index)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(source) => {
                stop(&mut children);
                return Err(BenchRunError::Spawn { index, source });
            }
        };
        tails.push(StderrTail::follow(child.stderr.take()));
        if let Some(stdout) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((index, line)).is_err() {
                        break;
                    }
                }
            });
        }
        children.push(child);
    }
    drop(tx);
    let deadline = Instant::now() + bound;
    let mut results: BTreeMap<usize, T> = BTreeMap::new();
    let outcome = loop {
        if results.len() == count {
            break Ok(());
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break Err(BenchRunError::NoResult {
                bound,
                ended: Vec::new(),
            });
        };
        match lines.recv_timeout(left) {
            Ok((index, line)) => {
                if let Some(rest) = line.strip_prefix("bench ") {
                    match parse(rest) {
                        Some(t) => {
                            results.insert(index, t);
                        }
                        None => break Err(BenchRunError::BadResult { index, line }),
                    }
                } else if line.starts_with("error ") {
                    break Err(BenchRunError::Failed {
                        index,
                        line,
                        ended: Vec::new(),
                    });
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                break Err(BenchRunError::NoResult {
                    bound,
                    ended: Vec::new(),
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err(BenchRunError::Exited {
                    results: results.len(),
                    count,
                    ended: Vec::new(),
                })
            }
        }
    };
    let outcome = outcome.map_err(|mut error| {
        // Which processes had ended before the others are stopped: where one died first (a
        // panic, a signal), that is the run's cause, whatever another then reported.
        let now_ended = ended_processes(&mut children, &tails);
        if let BenchRunError::NoResult { ended, .. }
        | BenchRunError::Failed { ended, .. }
        | BenchRunError::Exited { ended, .. } = &mut error
        {
            *ended = now_ended;
        }
        stop(&mut children);
        error
    });
    for child in &mut children {
        let _ = child.wait();
    }
    outcome.map(|()| results)
}

/// `steps=N seconds=S loss=L`: the steps and their seconds.
fn parse_timed(text: &str) -> Option<(usize, f64)> {
    let steps = bench_field(text, "steps")?.parse().ok()?;
    let seconds: f64 = bench_field(text, "seconds")?.parse().ok()?;
    let loss: f32 = bench_field(text, "loss")?.parse().ok()?;
    (seconds > 0.0 && loss.is_finite()).then_some((steps, seconds))
}

/// The value of `key=value` among the space-separated fields of a process's `bench` line.
pub(super) fn bench_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Ends the workers of a failed run (this run's own children only).
/// The last lines a process wrote to stderr, read on a thread of their own (a pipe nobody
/// reads would block the process once full).
struct StderrTail(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl StderrTail {
    fn follow(stderr: Option<std::process::ChildStderr>) -> Self {
        let tail = Self(Default::default());
        if let Some(stderr) = stderr {
            let lines = std::sync::Arc::clone(&tail.0);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut kept = lines.lock().unwrap_or_else(|e| e.into_inner());
                    if kept.len() == STDERR_TAIL_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            });
        }
        tail
    }

    fn lines(&self) -> Vec<String> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().cloned().collect()
    }
}

/// The processes of `children` that have ended, with how and their stderr's tail (one that
/// exited 0 too: one that left before a peer took its last chunks is a cause as well). A
/// process that ended a moment ago may not have had its last lines read yet: a short wait lets
/// them in.
fn ended_processes(children: &mut [Child], tails: &[StderrTail]) -> Vec<EndedProcess> {
    let ended: Vec<(usize, std::process::ExitStatus)> = children
        .iter_mut()
        .enumerate()
        .filter_map(|(index, child)| Some((index, child.try_wait().ok()??)))
        .collect();
    if !ended.is_empty() {
        std::thread::sleep(Duration::from_millis(100));
    }
    ended
        .into_iter()
        .map(|(index, status)| EndedProcess {
            index,
            status,
            stderr_tail: tails.get(index).map(StderrTail::lines).unwrap_or_default(),
        })
        .collect()
}

fn stop(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_result_line_is_read_and_a_broken_one_refused() {
        assert_eq!(
            parse_timed("steps=100 seconds=2.5 loss=2.1"),
            Some((100, 2.5))
        );
        assert_eq!(parse_timed("steps=100 seconds=2.5 loss=NaN"), None);
        assert_eq!(parse_timed("steps=x seconds=2.5 loss=1"), None);
        assert_eq!(parse_timed("seconds=2.5 loss=1"), None);
    }

    /// A process that dies without a word on stdout (a panic, a signal) is named with how it
    /// ended and its last stderr lines, although another reported the run's error first.
    #[cfg(unix)]
    #[test]
    fn a_failed_run_names_the_process_that_died_first_and_its_last_words() {
        let scripts = [
            "echo 'thread main panicked: boom' >&2; kill -9 $$",
            "sleep 3; echo 'error lost the member of process 0'; exec sleep 30",
        ];
        let error = run_bench_processes(
            scripts.len(),
            |index| {
                let mut command = Command::new("sh");
                command.args(["-c", scripts[index]]);
                command
            },
            |_| Some(()),
            Duration::from_secs(60),
        )
        .expect_err("the run failed");
        let BenchRunError::Failed { index, ended, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*index, 1);
        assert_eq!(ended.len(), 1, "{error}");
        assert_eq!(ended[0].index, 0);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&ended[0].status),
            Some(9)
        );
        let text = error.to_string();
        assert!(
            text.contains("process 0 had ended") && text.contains("panicked: boom"),
            "{text}"
        );
    }

}
