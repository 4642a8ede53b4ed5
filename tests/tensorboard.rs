//! TensorBoard event files read back with the `tensorboard` Python package's own reader
//! (`tests/python/check_tensorboard.py`): scalars written with [`SummaryWriter`] come back with
//! their tags, steps and values; a copy with one record corrupted is read up to that record
//! without an error; and a short `cohort demo` run (real processes, QUIC on 127.0.0.1) followed
//! by the demo's evaluator leaves `loss`, `steps_per_second` and `ledger/committed` under
//! `<checkpoint_dir>/logs/train` and the evaluator's metrics under `logs/eval`. The Python
//! checks say SKIPPED when python3 lacks `tensorboard` (CI installs it).
//!
//! Every wait is bounded; nothing asserts on timing.

mod skip_support;
use skip_support::Part;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cohort::summary::SummaryWriter;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/check_tensorboard.py"
);

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-tb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `command` with its output captured, SIGKILLed after `limit`.
fn run(command: &mut Command, limit: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let output = rx
                .recv_timeout(Duration::from_secs(30))
                .ok()
                .and_then(Result::ok);
            panic!(
                "{command:?} did not finish within {limit:?}: {:?}",
                output.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            );
        }
    }
}

/// The check script with `args`, or `None` (after saying SKIPPED) when python3 or its
/// `tensorboard` package is missing.
fn check(test: &str, args: &[&str]) -> Option<String> {
    let probe = Command::new("python3")
        .args([SCRIPT, "probe"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        skip_support::skip(
            Part::Python,
            &format!(
                "{test}'s read-back: python3 with the `tensorboard` package is not available \
                 (pip install tensorboard)"
            ),
        );
        return None;
    }
    let output = run(
        Command::new("python3").arg(SCRIPT).args(args),
        Duration::from_secs(120),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{SCRIPT} {args:?}:\n{text}");
    Some(text)
}

#[test]
fn written_scalars_read_back_and_a_corrupt_record_is_skipped() {
    let dir = temp_dir("writer");
    let mut writer = SummaryWriter::create(&dir).unwrap();
    let mut expected = Vec::new();
    for step in 0..5u64 {
        let value = step as f64 * 0.5 - 1.0;
        writer.scalar("loss", step * 10, value).unwrap();
        expected.push(serde_json::json!(["loss", step * 10, value]));
    }
    writer.scalar("eval/accuracy", 40, 0.9375).unwrap();
    expected.push(serde_json::json!(["eval/accuracy", 40, 0.9375]));
    writer.flush().unwrap();
    let expected = serde_json::to_string(&expected).unwrap();
    let dir_arg = dir.to_str().unwrap();
    let test = "written_scalars_read_back_and_a_corrupt_record_is_skipped";
    if check(test, &["scalars", dir_arg, &expected]).is_some() {
        let said = check(test, &["corrupt", dir_arg]).unwrap();
        assert!(said.contains("corrupted record skipped"), "{said}");
    }
    drop(writer);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_writer_that_cannot_create_its_directory_says_which() {
    let file = temp_dir("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let err = SummaryWriter::create(file.join("logs"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&file.join("logs").display().to_string()) && err.contains("directory"),
        "{err}"
    );
    let _ = std::fs::remove_file(&file);
}

/// The demo's steps: 10 per epoch, digits 2 epochs, CTR 2 epochs of 20.
const DEMO_STEPS: u64 = 2 * 10 + 2 * 20;

#[test]
fn the_demo_chief_and_evaluator_write_train_and_eval_events() {
    let checkpoints = temp_dir("demo");
    let demo = run(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args([
                "demo",
                "--digits-epochs",
                "2",
                "--ctr-epochs",
                "2",
                "--no-chaos",
            ])
            .arg("--checkpoint-dir")
            .arg(&checkpoints)
            .env("COHORT_DEMO_STEPS_PER_EPOCH", "10")
            .env("COHORT_DEMO_CTR_VOCAB", "1000"),
        Duration::from_secs(240),
    );
    let stdout = String::from_utf8_lossy(&demo.stdout);
    assert!(
        demo.status.success(),
        "demo failed: {:?}\n{stdout}\n{}",
        demo.status,
        String::from_utf8_lossy(&demo.stderr)
    );
    assert!(stdout.contains("TensorBoard: "), "{stdout}");

    // The demo's evaluator on the same directory, until the last checkpoint.
    let evaluator = run(
        evaluator_command(&checkpoints).env("COHORT_EVAL_UNTIL_STEP", DEMO_STEPS.to_string()),
        Duration::from_secs(120),
    );
    // Its reports are log lines on stderr: `… INFO evaluator/0: step 10: loss=… step=10`.
    let said = String::from_utf8_lossy(&evaluator.stderr);
    assert!(
        evaluator.status.success(),
        "evaluator failed: {:?}\n{said}\n{}",
        evaluator.status,
        String::from_utf8_lossy(&evaluator.stdout)
    );
    let printed: Vec<serde_json::Value> = said
        .lines()
        .filter_map(|line| line.split_once("evaluator/0: step ").map(|(_, rest)| rest))
        .flat_map(|rest| {
            let (step, metrics) = rest.split_once(": ").expect("step N: metrics");
            let step: u64 = step.parse().expect("step");
            metrics
                .split(' ')
                // The event's own `step` field, not a metric.
                .filter(|kv| !kv.starts_with("step="))
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("name=value");
                    serde_json::json!([k, step, v.parse::<f64>().expect("value")])
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !printed.is_empty(),
        "the evaluator printed no metrics:\n{said}"
    );

    let logs = checkpoints.join("logs");
    check(
        "the_demo_chief_and_evaluator_write_train_and_eval_events",
        &[
            "job",
            logs.to_str().unwrap(),
            &DEMO_STEPS.to_string(),
            &serde_json::to_string(&printed).unwrap(),
        ],
    );
    let _ = std::fs::remove_dir_all(&checkpoints);
}

/// `cohort role --job demo` as an evaluator of the demo's (finished) cluster, watching `dir`.
fn evaluator_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cohort"));
    command.args(["role", "--job", "demo"]);
    for key in cohort::cluster::ConfigKey::ALL {
        command.env_remove(key.env);
    }
    command
        .env(
            "TF_CONFIG",
            r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "evaluator", "index": 0}}"#,
        )
        .env("COHORT_CHECKPOINT_DIR", dir)
        .env("COHORT_EVAL_IDLE_TIMEOUT", "60s");
    command
}
