//! Every role's Prometheus endpoint in a real local job (processes, QUIC on 127.0.0.1): the
//! test scrapes each task's `/metrics` while the job runs, and Python's `prometheus_client`
//! parser (`tests/python/check_metrics.py`) checks that the counters match the run's own
//! summary (the chief's ledger, every server's `ps_stats`); `/healthz` answers 200. The parse
//! says SKIPPED when python3 lacks `prometheus_client` (CI installs it). A bad metrics address
//! is refused at start, naming the key, with exit 2.

mod ps_support;
mod skip_support;
use skip_support::Part;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cohort::cluster::{TaskId, TaskType};
use cohort::program::{Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{fit_gradient, ledger_and_stats, write_report, Run, REPORT_FILE, WAIT_MAX};

/// The file the test writes once it has scraped every task; the chief waits for it.
const SCRAPED_FILE: &str = "scraped";
/// Closures the chief runs.
const STEPS: usize = 40;
/// The file the rate test writes once its scrapers are done; the chief trains until then.
const RATE_DONE_FILE: &str = "rate-done";

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

fn program() -> Program {
    Program::new("metrics-test")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let w = ctx.pull("w")?;
            ctx.push_dense("w", fit_gradient(&w))?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator
                .wait_for_workers(coordinator.num_workers() as usize, Duration::from_secs(30))?;
            if ps_support::scenario() == "rate" {
                // Steady training while the test's two scrapers read the rate (bounded: the
                // test may have failed already).
                let done = ps_support::child_dir().join(RATE_DONE_FILE);
                let deadline = Instant::now() + WAIT_MAX;
                while !done.exists() && Instant::now() < deadline {
                    for _ in 0..4 {
                        coordinator.schedule_encoded("fit", Vec::new())?;
                    }
                    coordinator.join()?;
                }
                return Ok(());
            }
            for _ in 0..STEPS {
                coordinator.schedule_encoded("fit", Vec::new())?;
            }
            coordinator.join()?;
            write_report(&ledger_and_stats(coordinator)?)?;
            // Every task serves on while the test scrapes it (bounded: the test may have
            // failed already).
            let scraped = ps_support::child_dir().join(SCRAPED_FILE);
            let deadline = Instant::now() + WAIT_MAX;
            while !scraped.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
}

/// One HTTP GET on 127.0.0.1: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").expect("send the request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// Waits (bounded) for `path` to exist.
fn wait_for(path: &Path) -> bool {
    let deadline = Instant::now() + WAIT_MAX * 2;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Runs python3 with `args`, bounded; `None` if it could not be started.
fn python(args: &[&str]) -> Option<(bool, String)> {
    let mut child = Command::new("python3")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().ok()?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Some((false, "python3 timed out".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some((output.status.success(), text))
}

#[test]
fn every_role_serves_metrics_that_match_the_run() {
    let mut run = Run::new("metrics", "metrics", &[]);
    run.metrics = true;
    let launch_dir = run.path("launch");
    let scrape_dir = run.path("scrapes");
    std::fs::create_dir_all(&scrape_dir).unwrap();
    let tasks: Vec<TaskId> = [
        TaskId::new(TaskType::Chief, 0),
        TaskId::new(TaskType::Ps, 0),
        TaskId::new(TaskType::Ps, 1),
        TaskId::new(TaskType::Worker, 0),
        TaskId::new(TaskType::Worker, 1),
    ]
    .into();
    // Beside the job: once the chief has reported, scrape every task, then let it finish.
    let report = run.path(REPORT_FILE);
    let scraped = run.path(SCRAPED_FILE);
    let (dir, scrapes) = (launch_dir.clone(), scrape_dir.clone());
    let scraper = ps_support::beside(move |cancel| {
        if !wait_for(&report) || cancel.load(Ordering::SeqCst) {
            return;
        }
        for task in &tasks {
            let file = cohort::launch::metrics_addr_file(&dir, *task);
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let addr: SocketAddr = text.trim().parse().expect("an address");
            let (status, body) = get(addr, "/healthz");
            assert_eq!(status, "HTTP/1.1 200 OK", "{task} /healthz: {body}");
            let (status, body) = get(addr, "/metrics");
            assert_eq!(status, "HTTP/1.1 200 OK", "{task} /metrics: {body}");
            let name = format!("{}-{}.txt", task.task_type, task.index);
            std::fs::write(scrapes.join(name), body).unwrap();
        }
        std::fs::write(&scraped, b"1").unwrap();
    });
    let code = run.launch_code();
    scraper.finish();
    assert_eq!(code, 0, "the chief failed; its log is above");
    assert!(
        run.path(SCRAPED_FILE).exists(),
        "the scraper did not finish; its panic is above"
    );
    let mut expected = run.report();
    let mut incarnations = serde_json::Map::new();
    for entry in std::fs::read_dir(launch_dir.join("pids")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let incarnation: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        incarnations.insert(stem, incarnation.into());
    }
    expected["incarnations"] = incarnations.into();
    let expected_path = run.path("expected.json");
    std::fs::write(&expected_path, expected.to_string()).unwrap();

    let probe = python(&["-c", "import prometheus_client.parser"]);
    if !matches!(&probe, Some((true, _))) {
        skip_support::skip(
            Part::Python,
            &format!(
                "the parse: python3 with the `prometheus_client` package is not available (pip \
                 install prometheus_client): {probe:?}"
            ),
        );
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_metrics.py");
    let args = [
        script.to_str().unwrap(),
        scrape_dir.to_str().unwrap(),
        expected_path.to_str().unwrap(),
    ];
    let (ok, output) = python(&args).expect("python3 ran for the probe");
    println!("{output}");
    assert!(ok, "the metrics do not match the run:\n{output}");
    assert!(
        output.contains(&format!("cohort_ledger_committed_total = {STEPS}")),
        "{output}"
    );

    // The check can fail: a summary that disagrees with the scrape is caught.
    expected["ledger"]["committed"] = (STEPS as u64 + 1).into();
    std::fs::write(&expected_path, expected.to_string()).unwrap();
    let (ok, output) = python(&args).expect("python3 ran");
    assert!(!ok, "a wrong summary must fail the check:\n{output}");
    assert!(
        output.contains("FAIL: chief-0: cohort_ledger_committed_total"),
        "{output}"
    );
}

#[test]
fn a_bad_metrics_address_is_refused_naming_the_key() {
    let exe = std::env::current_exe().unwrap();
    let scratch = std::env::temp_dir().join(format!("cohort-metrics-bad-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for (value, origin) in [
        ("not-an-address", "environment"),
        ("127.0.0.1:99999", "environment"),
    ] {
        let output = Command::new(&exe)
            .args(["--exact", "cluster_task", "--nocapture"])
            .env(ps_support::CHILD_ENV, "1")
            .env(ps_support::DIR_ENV, &scratch)
            .env("COHORT_TASK_TYPE", "evaluator")
            .env("COHORT_CHECKPOINT_DIR", &scratch)
            .env(
                "TF_CONFIG",
                r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}}"#,
            )
            .env("COHORT_METRICS_ADDR", value)
            .stdin(Stdio::null())
            .output()
            .expect("run the child");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("COHORT_METRICS_ADDR"), "{value}: {stderr}");
        assert!(stderr.contains(origin), "{value}: {stderr}");
    }
    // An address that parses but cannot be served (in use) is refused the same way.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let output = Command::new(&exe)
        .args(["--exact", "cluster_task", "--nocapture"])
        .env(ps_support::CHILD_ENV, "1")
        .env(ps_support::DIR_ENV, &scratch)
        .env("COHORT_TASK_TYPE", "evaluator")
        .env("COHORT_CHECKPOINT_DIR", &scratch)
        .env(
            "TF_CONFIG",
            r#"{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}}"#,
        )
        .env("COHORT_METRICS_ADDR", &addr)
        .stdin(Stdio::null())
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{addr}: {stderr}");
    assert!(
        stderr.contains("metrics_addr") && stderr.contains(&addr),
        "{addr}: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The value of the unlabelled-or-labelled sample `name` in a Prometheus text exposition.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Two scrapers of the chief at different intervals (one every 20 ms, one every 700 ms) while
/// it trains: `cohort_steps_per_second` is the chief's own rate over a window no scrape moves,
/// so the slow scraper reads what the fast one read beside it (not the rate since the other's
/// last scrape), and a training job's rate is above zero.
#[test]
fn two_scrapers_at_different_rates_read_the_same_step_rate() {
    let mut run = Run::new("metrics-rate", "rate", &[]);
    run.metrics = true;
    let chief_addr =
        cohort::launch::metrics_addr_file(&run.path("launch"), TaskId::new(TaskType::Chief, 0));
    let done = run.path(RATE_DONE_FILE);
    let readings = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(bool, f64)>::new()));
    let kept = std::sync::Arc::clone(&readings);
    let scraper = ps_support::beside(move |cancel| {
        let finish = || std::fs::write(&done, b"1").unwrap();
        if !wait_for(&chief_addr) || cancel.load(Ordering::SeqCst) {
            return finish();
        }
        let text = std::fs::read_to_string(&chief_addr).unwrap();
        let addr: SocketAddr = text.trim().parse().expect("an address");
        let rate = move || sample(&get(addr, "/metrics").1, "cohort_steps_per_second");
        // Past the first ticks: the rate has a window to look at.
        std::thread::sleep(Duration::from_millis(2500));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (fast_stop, fast_kept) = (std::sync::Arc::clone(&stop), std::sync::Arc::clone(&kept));
        let fast = std::thread::spawn(move || {
            while !fast_stop.load(Ordering::SeqCst) {
                if let Some(value) = rate() {
                    fast_kept.lock().unwrap().push((false, value));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(700));
            if let Some(value) = rate() {
                kept.lock().unwrap().push((true, value));
            }
        }
        stop.store(true, Ordering::SeqCst);
        let _ = fast.join();
        finish();
    });
    let code = run.launch_code();
    scraper.finish();
    assert_eq!(code, 0, "the chief failed; its log is above");
    let readings = readings.lock().unwrap().clone();
    let slow: Vec<usize> = (0..readings.len()).filter(|&i| readings[i].0).collect();
    assert_eq!(slow.len(), 5, "the slow scraper's readings: {readings:?}");
    // Each slow reading against the fast ones right before and right after it: the same value
    // as one of them (the chief's sampler ticks once a second; a tick while the slow scrape was
    // answered puts it with one side or the other).
    let same = slow
        .iter()
        .filter(|&&i| {
            let before = readings[..i].iter().rev().find(|(slow, _)| !slow);
            let after = readings[i + 1..].iter().find(|(slow, _)| !slow);
            [before, after]
                .into_iter()
                .flatten()
                .any(|(_, fast)| *fast == readings[i].1)
        })
        .count();
    assert!(same >= 4, "the scrapers disagree: {readings:?}");
    assert!(
        slow.iter().filter(|&&i| readings[i].1 > 0.0).count() >= 4,
        "a training job's rate read as zero: {readings:?}"
    );
}
