//! Bad configuration refuses to start (DESIGN §7): the `cohort` binary, run as a role process
//! (`cohort role --job demo`) with a bad `cohort.toml`, a bad `TF_CONFIG`, a bad flag or an
//! unknown flag, exits with code 2 and a message naming the key. Also the same for a user
//! program (`cohort::program::main`), by re-executing this test binary as one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COHORT_CONFIG_TEST_CHILD";

const TF_CONFIG: &str = r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "ps", "index": 0}}"#;

/// Child mode: a user program's `main`.
#[test]
fn program_main() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let program = cohort::program::Program::new("config-test").chief(|_| Ok(()));
    std::process::exit(cohort::program::main(program));
}

#[test]
fn a_bad_cohort_toml_exits_2_naming_the_key() {
    let dir = Scratch::new("toml");
    std::fs::write(dir.0.join("cohort.toml"), "detection_budgte = \"3s\"\n").unwrap();
    let out = run(cohort(&dir.0).args(["role", "--job", "demo"]));
    expect_refused(&out, &["cohort.toml", "detection_budgte", "unknown key"]);

    std::fs::write(dir.0.join("cohort.toml"), "worker_wait = \"0s\"\n").unwrap();
    let out = run(cohort(&dir.0).args(["role", "--job", "demo"]));
    expect_refused(
        &out,
        &["cohort.toml: worker_wait", "must be more than zero"],
    );

    std::fs::write(dir.0.join("other.toml"), "[task]\ntype = \"boss\"\n").unwrap();
    let out = run(cohort(&dir.0).args(["role", "--job", "demo", "--config", "other.toml"]));
    expect_refused(&out, &["other.toml: task.type", "boss"]);
}

#[test]
fn a_bad_tf_config_exits_2_naming_the_key() {
    let dir = Scratch::new("tf");
    let bad = TF_CONFIG.replace("\"ps\", \"index\"", "\"boss\", \"index\"");
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo"])
        .env("TF_CONFIG", bad));
    expect_refused(&out, &["TF_CONFIG.task.type", "boss"]);
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo"])
        .env("TF_CONFIG", "{\"cluster\": "));
    expect_refused(&out, &["TF_CONFIG: malformed"]);
}

#[test]
fn a_bad_flag_or_environment_value_exits_2_naming_the_key() {
    let dir = Scratch::new("flag");
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo", "--detection-budget", "fast"])
        .env("TF_CONFIG", TF_CONFIG));
    expect_refused(&out, &["--detection-budget", "\"fast\" is not a duration"]);
    // One fault at a time: a server or a worker killed, not both.
    let out = run(cohort(&dir.0).args([
        "launch",
        "--kill-ps-after",
        "5s",
        "--kill-worker-after",
        "5s",
    ]));
    expect_refused(&out, &["--kill-ps-after", "--kill-worker-after"]);
    let out = run(cohort(&dir.0).args(["launch", "--kill-ps-after", "soon"]));
    expect_refused(&out, &["--kill-ps-after", "\"soon\" is not a duration"]);
    // Epoch counts of the demo past their range (one that overflowed its step count, or none).
    let out = run(cohort(&dir.0).args(["demo", "--ctr-epochs", "18446744073709551615"]));
    expect_refused(&out, &["--ctr-epochs", "18446744073709551615"]);
    let out = run(cohort(&dir.0).args(["demo", "--digits-epochs", "0"]));
    expect_refused(&out, &["--digits-epochs", "1..=10000"]);
    // A benchmark of no timed step would print a rate over none; evaluators past the bound
    // would run the machine out of ports before saying why.
    let out = run(cohort(&dir.0).args(["bench", "ps", "--steps", "0"]));
    expect_refused(&out, &["--steps", "1..=10000000"]);
    let out = run(cohort(&dir.0).args(["bench", "ps", "--warmup", "2000000"]));
    expect_refused(&out, &["--warmup", "0..=1000000"]);
    let out = run(cohort(&dir.0).args(["launch", "--evaluators", "100000"]));
    expect_refused(
        &out,
        &["--evaluators", "evaluators (a whole number from 0 to 16)"],
    );
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo", "--task-index", "4"])
        .env("TF_CONFIG", TF_CONFIG));
    expect_refused(&out, &["task: ps/4 does not exist"]);
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo"])
        .env("TF_CONFIG", TF_CONFIG)
        .env("COHORT_INCARNATION", "x"));
    expect_refused(&out, &["COHORT_INCARNATION", "not a whole number"]);
    // A setting that is not text is refused, not taken as unset.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let not_utf8 = std::ffi::OsStr::from_bytes(b"ps\xff");
        let out = run(cohort(&dir.0)
            .args(["role", "--job", "demo"])
            .env("TF_CONFIG", TF_CONFIG)
            .env("COHORT_TASK_TYPE", not_utf8));
        expect_refused(&out, &["COHORT_TASK_TYPE", "not valid UTF-8"]);
        let out = run(cohort(&dir.0)
            .args(["role", "--job", "demo"])
            .env("TF_CONFIG", not_utf8));
        expect_refused(&out, &["TF_CONFIG", "not valid UTF-8"]);
    }
    // Unknown flags are usage errors (clap), also exit 2.
    let out = run(cohort(&dir.0).args(["role", "--job", "demo", "--task-tpye", "ps"]));
    expect_refused(&out, &["--task-tpye"]);
    // A cluster without the parameter servers this strategy needs.
    let no_ps = r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker"}}"#;
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo"])
        .env("TF_CONFIG", no_ps));
    expect_refused(&out, &["TF_CONFIG: cluster:", "needs at least 1 ps"]);
    // No cluster at all.
    let out = run(cohort(&dir.0).args(["role", "--job", "demo"]));
    expect_refused(&out, &["cluster: no cluster given"]);
}

/// An absurd duration (here a detection budget of 5124095576030 h, which used to reach the
/// transport and be refused as an idle timeout) is refused where it is read, for every
/// duration key and from every layer: exit 2, naming the key as spelled, where it came from,
/// the value and the allowed range; never a panic.
#[test]
fn an_out_of_range_duration_exits_2_naming_key_origin_value_and_range() {
    let dir = Scratch::new("range");
    const HUGE: &str = "5124095576030h";
    let keys: Vec<cohort::cluster::ConfigKey> = cohort::cluster::ConfigKey::ALL
        .into_iter()
        .filter(|k| k.duration_range().is_some())
        .collect();
    assert!(!keys.is_empty());
    for key in keys {
        let range = key.duration_range().unwrap().to_string();
        let out_of_range = format!("\"{HUGE}\" is out of range (allowed: {range})");
        let out = run(cohort(&dir.0)
            .args(["role", "--job", "demo", key.flag, HUGE])
            .env("TF_CONFIG", TF_CONFIG));
        expect_refused(
            &out,
            &[&format!("command line: {}: {out_of_range}", key.flag)],
        );
        expect_no_panic(&out);
        let out = run(cohort(&dir.0)
            .args(["role", "--job", "demo"])
            .env("TF_CONFIG", TF_CONFIG)
            .env(key.env, HUGE));
        expect_refused(
            &out,
            &[&format!("environment: {}: {out_of_range}", key.env)],
        );
        expect_no_panic(&out);
        std::fs::write(
            dir.0.join("cohort.toml"),
            format!("{} = \"{HUGE}\"\n", key.file),
        )
        .unwrap();
        let out = run(cohort(&dir.0)
            .args(["role", "--job", "demo"])
            .env("TF_CONFIG", TF_CONFIG));
        expect_refused(
            &out,
            &[&format!("cohort.toml: {}: {out_of_range}", key.file)],
        );
        expect_no_panic(&out);
        std::fs::remove_file(dir.0.join("cohort.toml")).unwrap();
    }
    // `launch --detection-budget` sets the same key in every task: refused the same way.
    let out = run(cohort(&dir.0).args(["launch", "--job", "demo", "--detection-budget", HUGE]));
    expect_refused(
        &out,
        &[
            "--detection-budget",
            "is out of range (allowed: 10ms to 1h)",
        ],
    );
    expect_no_panic(&out);
}

fn expect_no_panic(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(!stderr.contains("idle timeout"), "stderr: {stderr}");
}

#[test]
fn a_user_program_refuses_bad_config_the_same_way() {
    let dir = Scratch::new("program");
    let me = std::env::current_exe().unwrap();
    let program = |args: &[&str]| {
        let mut command = Command::new(&me);
        // After `--` libtest takes the rest as name filters (matching nothing with --exact).
        command
            .args(["--exact", "program_main", "--nocapture", "--"])
            .args(args);
        clean(&mut command, &dir.0).env(CHILD_ENV, "1");
        command
    };
    let out = run(program(&["--worker-wait"]).env("TF_CONFIG", TF_CONFIG));
    expect_refused(&out, &["--worker-wait: missing value"]);
    let out = run(program(&["--worker-wait=soon"]).env("TF_CONFIG", TF_CONFIG));
    expect_refused(&out, &["--worker-wait", "\"soon\" is not a duration"]);
    let out = run(program(&[]).env(
        "TF_CONFIG",
        TF_CONFIG.replace("\"cluster\"", "\"clusters\""),
    ));
    expect_refused(&out, &["TF_CONFIG.clusters", "unknown key"]);
    std::fs::write(dir.0.join("cohort.toml"), "incarnation = \"7\"\n").unwrap();
    let out = run(program(&["--certs-dir", "certs"]).env("TF_CONFIG", TF_CONFIG));
    expect_refused(&out, &["cohort.toml: incarnation", "expected an integer"]);
}

fn cohort(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cohort"));
    clean(&mut command, dir);
    command
}

/// No configuration inherited from the test's own environment; runs in `dir`.
fn clean<'a>(command: &'a mut Command, dir: &Path) -> &'a mut Command {
    for key in cohort::cluster::ConfigKey::ALL {
        command.env_remove(key.env);
    }
    command
        .env_remove("TF_CONFIG")
        .env("COHORT_CERTS", dir.join("certs"))
        .current_dir(dir)
}

/// Runs a command that must end by itself quickly (it refuses to start); killed past a bound.
fn run(command: &mut Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within 30s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn expect_refused(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cohort-config-{name}-{}", std::process::id()));
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

/// `COHORT_LOG_FORMAT=json`: every event a role reports is one JSON object per line, with its
/// role, index and incarnation; an unknown format is refused naming the variable.
#[test]
fn json_logs_are_one_object_per_line_with_the_task_and_a_bad_format_is_refused() {
    let dir = Scratch::new("json-logs");
    // The role starts (its start is logged at info), then stops: no certificates there.
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo", "--incarnation", "42"])
        .env("TF_CONFIG", TF_CONFIG)
        .env("RUST_LOG", "info")
        .env("COHORT_LOG_FORMAT", "json"));
    expect_no_panic(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = lines
        .iter()
        .find(|l| l["message"].as_str().is_some_and(|m| m.contains("ps/0 of")))
        .unwrap_or_else(|| panic!("no JSON line for the role's start: {stderr}"));
    assert_eq!(start["level"], "INFO", "{start}");
    assert_eq!(start["role"], "ps", "{start}");
    assert_eq!(start["index"], 0, "{start}");
    assert_eq!(start["incarnation"], 42, "{start}");
    assert!(start["ts_ms"].as_u64().is_some_and(|t| t > 0), "{start}");

    // The default: text, cohort's events from info, the task named after the time and level.
    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo", "--incarnation", "42"])
        .env("TF_CONFIG", TF_CONFIG)
        .env_remove("COHORT_LOG_FORMAT")
        .env_remove("RUST_LOG"));
    expect_no_panic(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let start = stderr
        .lines()
        .find(|l| l.contains("ps/0 of"))
        .unwrap_or_else(|| panic!("no text line for the role's start: {stderr}"));
    let (time, rest) = start.split_once(' ').expect("time first");
    assert!(time.ends_with('Z') && time.contains('T'), "{start}");
    assert!(
        rest.trim_start().starts_with("INFO ps/0: ps/0 of"),
        "{start}"
    );

    let out = run(cohort(&dir.0)
        .args(["role", "--job", "demo"])
        .env("TF_CONFIG", TF_CONFIG)
        .env("COHORT_LOG_FORMAT", "xml"));
    expect_refused(&out, &["COHORT_LOG_FORMAT", "\"xml\"", "text or json"]);
}

/// `COHORT_LOG_FORMAT=json` under `launch`: the launcher's stderr is JSON lines, every one an
/// object. The tasks' events carry the task (`task`, and `role`, `index` and `incarnation`),
/// a MultiWorkerMirrored task's as a parameter-server role's do; the launcher's own say
/// `"role": "launcher"`.
#[test]
fn json_logs_under_launch_are_one_object_per_line_naming_the_task() {
    let dir = Scratch::new("json-launch");
    for (job, args, env) in [
        (
            "multi-worker-mirrored",
            vec!["launch", "--job", "multi-worker-mirrored", "--workers", "1"],
            ("COHORT_DEMO_DIGITS_EPOCHS", "5"),
        ),
        (
            "demo",
            vec!["launch", "--job", "demo", "--workers", "1", "--ps", "1"],
            ("COHORT_DEMO_DIGITS_EPOCHS", "5"),
        ),
    ] {
        let (stdout_path, stderr_path) = (dir.0.join("stdout"), dir.0.join("stderr"));
        let run_dir = dir.0.join(format!("run-{job}"));
        let mut child = cohort(&dir.0)
            .args(&args)
            .args(["--no-metrics", "--run-dir"])
            .arg(&run_dir)
            .env("COHORT_LOG_FORMAT", "json")
            // The tasks' debug events too: a MultiWorkerMirrored task logs little at info.
            .env("RUST_LOG", "cohort=debug")
            .env("COHORT_DEMO_CTR_EPOCHS", "3")
            .env("COHORT_CHECKPOINT_DIR", dir.0.join(format!("ckpt-{job}")))
            .env(env.0, env.1)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).unwrap())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{job}: the job did not end within 180 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stderr = std::fs::read_to_string(&stderr_path).unwrap();
        assert!(status.success(), "{job}: {status}\n{stderr}");
        let events: Vec<serde_json::Value> = stderr
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .filter(serde_json::Value::is_object)
                    .unwrap_or_else(|| panic!("{job}: not a JSON object: {l:?}"))
            })
            .collect();
        let from = |task: &str| -> Vec<&serde_json::Value> {
            events.iter().filter(|e| e["task"] == task).collect()
        };
        for (task, role, index) in [("chief/0", "chief", 0), ("worker/0", "worker", 0)] {
            let lines = from(task);
            assert!(!lines.is_empty(), "{job}: no event of {task}:\n{stderr}");
            for event in lines.iter().filter(|e| e.get("level").is_some()) {
                assert_eq!(event["role"], role, "{job}: {event}");
                assert_eq!(event["index"], index, "{job}: {event}");
                assert!(event["incarnation"].as_u64().is_some(), "{job}: {event}");
            }
        }
        assert!(
            events
                .iter()
                .any(|e| e["role"] == "launcher" && e.get("task").is_none()),
            "{job}: no event of the launcher's own:\n{stderr}"
        );
    }
}

/// A directory a command must create and cannot (under /proc, which takes no new entry even
/// from root) is bad usage: exit 2 naming it, before anything starts.
#[test]
fn a_directory_that_cannot_be_created_exits_2_naming_it() {
    let dir = Scratch::new("uncreatable");
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "certs",
                "--out",
                "/proc/cohort-nope/certs",
                "--cluster",
                "chief=1",
            ],
            "--out /proc/cohort-nope/certs",
        ),
        (
            &[
                "launch",
                "--no-metrics",
                "--run-dir",
                "/proc/cohort-nope/run",
            ],
            "--run-dir /proc/cohort-nope/run",
        ),
        (
            &[
                "demo",
                "--no-chaos",
                "--no-metrics",
                "--checkpoint-dir",
                "/proc/cohort-nope/ckpt",
            ],
            "/proc/cohort-nope/ckpt",
        ),
        (
            &[
                "demo",
                "--strategy",
                "multi-worker-mirrored",
                "--no-metrics",
                "--checkpoint-dir",
                "/proc/cohort-nope/ckpt",
            ],
            "/proc/cohort-nope/ckpt",
        ),
    ];
    for (args, named) in cases {
        let out = run(cohort(&dir.0).args(args));
        expect_no_panic(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} does not name {named}: {stderr}"
        );
        assert!(stderr.contains("cannot create it"), "{args:?}: {stderr}");
        assert!(!stderr.contains("launcher: started"), "{args:?}: {stderr}");
    }
}

/// A role's compute threads follow the CPUs it may use (here its affinity, one CPU; a
/// container's CPU quota counts the same way) unless RAYON_NUM_THREADS says otherwise, and its
/// start-up line says which.
#[test]
fn compute_threads_follow_the_cpus_a_role_may_use() {
    let dir = Scratch::new("threads");
    let role = |taskset: bool, threads: Option<&str>| {
        let mut command = if taskset {
            let mut command = Command::new("taskset");
            command.args(["-c", "0", env!("CARGO_BIN_EXE_cohort")]);
            clean(&mut command, &dir.0);
            command
        } else {
            cohort(&dir.0)
        };
        command
            .args(["role", "--job", "demo", "--incarnation", "42"])
            .env("TF_CONFIG", TF_CONFIG)
            .env_remove("RAYON_NUM_THREADS")
            .env_remove("CANDLE_NUM_THREADS")
            .env_remove("COHORT_LOG_FORMAT");
        if let Some(threads) = threads {
            command.env("RAYON_NUM_THREADS", threads);
        }
        let out = run(&mut command);
        expect_no_panic(&out);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr
            .lines()
            .find(|l| l.contains("ps/0 of"))
            .unwrap_or_else(|| panic!("no start line: {stderr}"))
            .to_string()
    };
    let pinned = role(true, None);
    assert!(
        pinned.contains("1 compute threads (the CPUs this process may use)"),
        "{pinned}"
    );
    let given = role(true, Some("3"));
    assert!(
        given.contains("3 compute threads (RAYON_NUM_THREADS)"),
        "{given}"
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let free = role(false, None);
    assert!(
        free.contains(&format!("{cpus} compute threads (the CPUs")),
        "{free}"
    );
}

/// `bench ps --peers` reads the Rust job's computation alone from this command's line, as it
/// reads the peers' figures: one JSON line with a positive `candle_ms` and a `version`.
#[test]
fn the_dense_computation_alone_prints_its_figure_as_the_peers_do() {
    let output = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["bench-dense-compute", "--steps", "2"])
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("run cohort");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON line");
    assert!(
        line["candle_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{line}"
    );
    assert!(
        line["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("cohort ")),
        "{line}"
    );
}
