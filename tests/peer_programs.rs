//! The comparison programs of `benches/peers/` (what `cohort bench ... --peers` runs beside
//! cohort) start, run a few steps and print the one JSON line the benchmarks read, with a
//! positive figure and their framework's version. They need the Python that
//! `bash benches/peers/setup.sh` makes (TensorFlow and PyTorch, about 5 GB): where it is
//! missing (`target/peers-venv`, or `COHORT_PEERS_PYTHON`), the test says so as a skip.

mod skip_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use skip_support::{skip, Part};

/// Bound on one program's run.
const RUN_MAX: Duration = Duration::from_secs(300);

fn peers_python() -> PathBuf {
    std::env::var_os("COHORT_PEERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/peers-venv/bin/python")
        })
}

/// Runs `script` with `args`; its last line, parsed.
fn run(python: &PathBuf, script: &str, args: &[&str]) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("benches/peers")
        .join(script);
    let mut child = Command::new(python)
        .arg(&path)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{script}: cannot start {}: {e}", python.display()));
    let deadline = Instant::now() + RUN_MAX;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{script} ran past {RUN_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{script} failed: {stderr}");
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{script}: {line:?}: {e}"))
}

#[test]
fn every_peer_program_runs_and_prints_its_figure() {
    let python = peers_python();
    if !python.exists() {
        skip(
            Part::Peers,
            &format!(
                "{} does not exist (bash benches/peers/setup.sh makes it)",
                python.display()
            ),
        );
        return;
    }
    // `COHORT_PEERS=tensorflow bash benches/peers/setup.sh` makes a Python with one framework:
    // the programs of the other are a skip, not a failure.
    let modules = ["tensorflow", "torch", "cohort", "numpy"];
    let present: Vec<&str> = modules
        .into_iter()
        .filter(|module| imports(&python, module))
        .collect();
    let needs = |script: &str| -> &[&str] {
        match script {
            s if s.starts_with("tf_") => &["tensorflow"],
            "cohort_python_ps.py" => &["torch", "cohort", "numpy"],
            "dense_step_compute.py" => &["torch", "numpy"],
            _ => &["torch"],
        }
    };
    let mut not_run = Vec::new();
    let programs: [(&str, &[&str], &str); 10] = [
        (
            "tf_mwms.py",
            &["--workers=2", "--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        (
            "torch_ddp.py",
            &["--workers=2", "--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        ("tf_ps.py", &["--steps=5", "--warmup=1"], "steps_per_second"),
        (
            "tf_ps.py",
            &["--workload=sparse", "--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        (
            "torch_ps.py",
            &["--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        ("gloo_allreduce.py", &["--members=2", "--mib=1"], "seconds"),
        (
            "cohort_python_ps.py",
            &["--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        (
            "cohort_python_ps.py",
            &["--compute=numpy", "--steps=5", "--warmup=1"],
            "steps_per_second",
        ),
        ("dense_step_compute.py", &["--steps=5"], "torch_ms"),
        ("dense_step_compute.py", &["--steps=5"], "numpy_ms"),
    ];
    for (script, args, key) in programs {
        if let Some(missing) = needs(script).iter().find(|m| !present.contains(m)) {
            not_run.push(format!("{script} {} (no {missing})", args.join(" ")));
            continue;
        }
        let line = run(&python, script, args);
        let figure = line[key].as_f64().unwrap_or(f64::NAN);
        assert!(figure > 0.0, "{script}: {key} in {line}");
        assert!(line["version"].is_string(), "{script}: {line}");
    }
    if !not_run.is_empty() {
        skip(
            Part::Peers,
            &format!(
                "{} lacks what these need: {}",
                python.display(),
                not_run.join("; ")
            ),
        );
    }
}

/// Whether `python` imports `module`.
fn imports(python: &PathBuf, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
