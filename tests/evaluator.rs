//! The evaluator role end to end: this test binary, re-executed as an `evaluator` task of a
//! user program, watches a checkpoint directory that the test fills with the checkpoint
//! manager, and prints one line per checkpoint it evaluates.
//!
//! - a valid checkpoint is evaluated, and the printed metrics are exactly what the evaluation
//!   function computes from the saved variables (put back together from their shards);
//! - a corrupted newer checkpoint is skipped with a message naming the file (CKPT-1), and the
//!   evaluator goes on to the next one;
//! - it stops by itself after `eval_until_step`, or after `eval_idle_timeout` with nothing new
//!   (exit 0), on SIGTERM (exit 143); without an evaluation function or a checkpoint directory
//!   it refuses to start (exit 2).
//!
//! Every wait is bounded by [`WAIT_MAX`]; nothing asserts on timing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort::checkpoint::{
    shard_file_name, Checkpoint, CheckpointManager, CheckpointPolicy, Dtype, TensorBytes,
};
use cohort::layout::{Layout, Shard};
use cohort::program::{CheckpointVariables, EvalError, Metrics, Program};

const CHILD_ENV: &str = "COHORT_EVALUATOR_TEST_CHILD";
/// Bound on every wait on the evaluator process.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// As TensorFlow's sidecar evaluator is configured: the training cluster (without an evaluator
/// entry, and no certificates given), the task an evaluator.
const TF_CONFIG: &str = r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3", "127.0.0.1:4"]}, "task": {"type": "evaluator", "index": 0}}"#;

/// The evaluation function under test: a few numbers every variable contributes to.
fn metrics(vars: &CheckpointVariables) -> Result<Metrics, EvalError> {
    let w = vars.f32("w")?;
    let b = vars.f32("b")?;
    let w_sum: f64 = w.iter().map(|v| f64::from(*v)).sum();
    let w_last_row: f64 = w[w.len() - 2..].iter().map(|v| f64::from(*v)).sum();
    let b_norm = b.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    Ok(vec![
        ("w_sum".into(), w_sum),
        ("w_last_row".into(), w_last_row),
        ("b_norm".into(), b_norm),
        ("step".into(), vars.step() as f64),
    ])
}

/// Child mode: a user program's `main`, run as the evaluator.
#[test]
fn evaluator_task() {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("with-evaluator") => {
            let program = Program::new("evaluator-test")
                .chief(|_| Ok(()))
                .evaluator(metrics);
            std::process::exit(cohort::program::main(program));
        }
        Ok(_) => {
            let program = Program::new("evaluator-test").chief(|_| Ok(()));
            std::process::exit(cohort::program::main(program));
        }
        Err(_) => {}
    }
}

#[test]
fn evaluates_each_new_checkpoint_skips_a_corrupt_one_and_stops_at_the_until_step() {
    let scratch = Scratch::new("main");
    let root = scratch.0.join("ckpt");
    let staging = scratch.0.join("staging");
    let mut manager = manager_for(&root);
    let first = checkpoint(10);
    manager.save(&first, Instant::now()).unwrap();

    let mut evaluator = Evaluator::start(
        &scratch.0,
        "with-evaluator",
        &[
            ("COHORT_CHECKPOINT_DIR", root.to_str().unwrap()),
            ("COHORT_EVAL_UNTIL_STEP", "30"),
            ("COHORT_EVAL_IDLE_TIMEOUT", "60s"),
            ("COHORT_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    let serving = evaluator.wait_for_stderr("/metrics (health");
    let metrics_addr: std::net::SocketAddr = serving
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in {serving:?}"));
    let line = evaluator.wait_for_stderr("evaluator/0: step 10:");
    assert_eq!(report(&line), expected_line(&first));

    // CKPT-1: a newer checkpoint with a flipped byte in one shard appears (complete, by a
    // rename, as the manager publishes them); it must be skipped, naming the file.
    let corrupt = checkpoint(20);
    let mut stage = manager_for(&staging);
    let staged = stage.save(&corrupt, Instant::now()).unwrap();
    let bad_file = shard_file_name(1, 2);
    flip_a_byte(&staged.join(&bad_file));
    std::fs::rename(&staged, root.join("ckpt-20")).unwrap();
    let skipped = evaluator.wait_for_stderr("skipped checkpoint");
    assert!(
        skipped.contains(&format!("ckpt-20/{bad_file}")),
        "the message names the file: {skipped}"
    );
    // Its metrics say as much: one evaluated (step 10, timed), one skipped.
    let scraped = scrape(metrics_addr);
    for expected in [
        "cohort_evaluator_evaluations_total 1",
        "cohort_evaluator_skipped_total 1",
        "cohort_evaluator_step 10",
        "cohort_evaluator_evaluation_seconds_count 1",
    ] {
        assert!(
            scraped.lines().any(|l| l == expected),
            "no {expected:?} in the evaluator's metrics:\n{scraped}"
        );
    }

    // A valid newer one is evaluated, and its step reaches eval_until_step: exit 0.
    let last = checkpoint(30);
    manager.save(&last, Instant::now()).unwrap();
    let line = evaluator.wait_for_stderr("evaluator/0: step 30:");
    assert_eq!(report(&line), expected_line(&last));
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.contains("eval_until_step 30"), "stderr: {stderr}");
    let evaluated: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("evaluator/0: step "))
        .map(report)
        .collect();
    assert_eq!(
        evaluated,
        [expected_line(&first), expected_line(&last)],
        "one line per evaluated checkpoint, the corrupt one never"
    );
}

#[test]
fn stops_when_idle_and_on_sigterm() {
    let scratch = Scratch::new("idle");
    let root = scratch.0.join("ckpt");
    // Newest first: at start only the newest checkpoint is evaluated.
    let mut manager = manager_for(&root);
    manager.save(&checkpoint(1), Instant::now()).unwrap();
    manager.save(&checkpoint(2), Instant::now()).unwrap();
    let mut evaluator = Evaluator::start(
        &scratch.0,
        "with-evaluator",
        &[
            ("COHORT_CHECKPOINT_DIR", root.to_str().unwrap()),
            ("COHORT_EVAL_IDLE_TIMEOUT", "1s"),
        ],
    );
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.contains("no new checkpoint for"), "stderr: {stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("evaluator/0: step "))
            .map(report)
            .collect::<Vec<_>>(),
        [expected_line(&checkpoint(2))]
    );

    // SIGTERM while it waits (for a directory that does not exist yet): exit 143.
    let mut evaluator = Evaluator::start(
        &scratch.0,
        "with-evaluator",
        &[(
            "COHORT_CHECKPOINT_DIR",
            scratch.0.join("absent").to_str().unwrap(),
        )],
    );
    evaluator.wait_for_stderr("evaluator/0: watching");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(evaluator.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(143), "stderr: {stderr}");
}

/// With `COHORT_LOG_FORMAT=json` every line is one JSON object naming the task, and the
/// evaluation's event carries the checkpoint's step as a field.
#[test]
fn json_logs_name_the_task_on_every_line_and_the_step_of_each_evaluation() {
    let scratch = Scratch::new("json");
    let root = scratch.0.join("ckpt");
    manager_for(&root)
        .save(&checkpoint(10), Instant::now())
        .unwrap();
    let mut evaluator = Evaluator::start(
        &scratch.0,
        "with-evaluator",
        &[
            ("COHORT_CHECKPOINT_DIR", root.to_str().unwrap()),
            ("COHORT_EVAL_UNTIL_STEP", "10"),
            ("COHORT_LOG_FORMAT", "json"),
        ],
    );
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(0), "stderr: {stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.len() >= 2,
        "a start and an evaluation at least: {stderr}"
    );
    for line in &lines {
        assert_eq!(line["role"], "evaluator", "{line}");
        assert_eq!(line["index"], 0, "{line}");
        assert!(
            line["incarnation"].as_u64().is_some_and(|i| i > 0),
            "{line}"
        );
    }
    let evaluated = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("step 10: "))
        })
        .unwrap_or_else(|| panic!("no evaluation event: {stderr}"));
    assert_eq!(evaluated["level"], "INFO", "{evaluated}");
    assert_eq!(evaluated["step"], 10, "{evaluated}");
}

#[test]
fn refuses_to_start_without_an_evaluation_function_or_a_checkpoint_dir() {
    let scratch = Scratch::new("refused");
    let root = scratch.0.join("ckpt");
    let mut evaluator = Evaluator::start(
        &scratch.0,
        "without-evaluator",
        &[("COHORT_CHECKPOINT_DIR", root.to_str().unwrap())],
    );
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("registers no evaluation function"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");

    let mut evaluator = Evaluator::start(&scratch.0, "with-evaluator", &[]);
    let (code, _, stderr) = evaluator.wait_for_exit();
    assert_eq!(code, Some(2), "stderr: {stderr}");
    assert!(stderr.contains("checkpoint_dir"), "stderr: {stderr}");
}

/// A checkpoint of a 2-PS job at `step`: `w` (3 × 2) split over both PS, `b` whole on PS 1,
/// with an optimizer slot that the evaluator must leave out; values depend on the step.
fn checkpoint(step: u64) -> Checkpoint {
    let s = step as f32;
    let mut ckpt = Checkpoint::new(step, 2);
    ckpt.layout.push(Layout {
        name: "w".into(),
        dtype: Dtype::F32,
        shape: vec![3, 2],
        shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..3 }],
    });
    ckpt.layout
        .push(Layout::unsharded("b", Dtype::F32, vec![2], 1));
    let tensor = |shape, values: &[f32]| TensorBytes::from_f32(shape, values).unwrap();
    ckpt.shards[0].tensors.insert(
        "w/part_0".into(),
        tensor(vec![2, 2], &[0.1 * s, -0.3, 1.7, 2.0 / (s + 1.0)]),
    );
    ckpt.shards[0].tensors.insert(
        "w/part_0/slot/accumulator".into(),
        tensor(vec![2, 2], &[100.0; 4]),
    );
    ckpt.shards[1]
        .tensors
        .insert("w/part_1".into(), tensor(vec![1, 2], &[s / 7.0, -0.25]));
    ckpt.shards[1]
        .tensors
        .insert("b".into(), tensor(vec![2], &[0.5, s / 3.0]));
    ckpt
}

/// The line the evaluator must print for `ckpt`: what the evaluation function computes from
/// its variables, assembled here independently of the evaluator (rows of `w` in order).
fn expected_line(ckpt: &Checkpoint) -> String {
    let part = |ps: usize, name: &str| ckpt.tensor(ps, name).unwrap().to_f32().unwrap();
    let mut w = part(0, "w/part_0");
    w.extend(part(1, "w/part_1"));
    let w = TensorBytes::from_f32(vec![3, 2], &w).unwrap();
    let mut whole = Checkpoint::new(ckpt.step, 1);
    whole
        .layout
        .push(Layout::unsharded("w", Dtype::F32, vec![3, 2], 0));
    whole
        .layout
        .push(Layout::unsharded("b", Dtype::F32, vec![2], 0));
    whole.shards[0].tensors.insert("w".into(), w);
    whole.shards[0]
        .tensors
        .insert("b".into(), ckpt.tensor(1, "b").unwrap().clone());
    let vars = CheckpointVariables::from_checkpoint(&whole, "unused").unwrap();
    let values = metrics(&vars).unwrap();
    // The log line's message, then its `step` field.
    format!(
        "evaluator/0: step {}: {} step={}",
        ckpt.step,
        values
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" "),
        ckpt.step
    )
}

/// What a text log line reports: the part after its time and level (`evaluator/0: step …`).
fn report(line: &str) -> &str {
    line.split_once(" INFO ")
        .map_or(line, |(_, rest)| rest)
        .trim_end()
}

fn manager_for(root: &Path) -> CheckpointManager {
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 10,
    };
    CheckpointManager::new(root, policy, Instant::now()).unwrap()
}

fn flip_a_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// The body of `GET /metrics` at `addr` (bounded).
fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").expect("send the request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// A running evaluator process whose stdout and stderr lines arrive on channels.
struct Evaluator {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    seen_stdout: Vec<String>,
    seen_stderr: Vec<String>,
}

impl Evaluator {
    fn start(dir: &Path, mode: &str, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", "evaluator_task", "--nocapture"]);
        for key in cohort::cluster::ConfigKey::ALL {
            command.env_remove(key.env);
        }
        command
            .env(CHILD_ENV, mode)
            .env("TF_CONFIG", TF_CONFIG)
            .current_dir(dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Self {
            child,
            stdout,
            stderr,
            seen_stdout: Vec::new(),
            seen_stderr: Vec::new(),
        }
    }

    /// The first stderr line (from the start) that contains `needle`.
    fn wait_for_stderr(&mut self, needle: &str) -> String {
        let found = self
            .seen_stderr
            .iter()
            .find(|l| l.contains(needle))
            .cloned();
        if let Some(line) = found {
            return line;
        }
        let deadline = Instant::now() + WAIT_MAX;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen_stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no stderr line with {needle:?}: {:#?}", self.seen_stderr)
    }

    /// Waits (bounded) for the process to exit; its code and all of its stdout and stderr.
    fn wait_for_exit(&mut self) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + WAIT_MAX;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the evaluator did not exit within {WAIT_MAX:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipes close with the process: read to their ends.
        self.seen_stdout.extend(drain(&self.stdout));
        self.seen_stderr.extend(drain(&self.stderr));
        (
            status.code(),
            self.seen_stdout.join("\n"),
            self.seen_stderr.join("\n"),
        )
    }
}

impl Drop for Evaluator {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Every line still to come on `rx`, until its sender closes (bounded).
fn drain(rx: &mpsc::Receiver<String>) -> Vec<String> {
    let deadline = Instant::now() + WAIT_MAX;
    let mut out = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => out.push(line),
            Err(_) => break,
        }
    }
    out
}

fn lines(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("cohort-evaluator-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
