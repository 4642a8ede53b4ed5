//! The chief's status page in a real `cohort demo` run (processes, QUIC on 127.0.0.1): while
//! the job runs the test polls `/status.json` (the tasks with their roles, the ledger only
//! growing, the loss history), checks its end state against the demo's own summary, renders
//! `/status` in headless Chromium (`--dump-dom`: the script drew a row per task and the loss
//! curve; `--screenshot`: `status.png` in the directory the test prints), and checks the
//! `loss.png` the demo wrote beside its checkpoints. The demo holds at its end (the
//! `COHORT_DEMO_HOLD_UNTIL` file) so that the page is looked at before the job exits.
//!
//! Without Chromium the browser part says SKIPPED (CI installs the distribution's package).
//! Every wait is bounded; nothing asserts on timing.

mod skip_support;
use skip_support::Part;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cohort::cluster::{TaskId, TaskType};

/// Steps per epoch, and epochs of each phase (the demo's CTR epochs are twice as long).
const STEPS_PER_EPOCH: u64 = 10;
const DIGITS_EPOCHS: u64 = 3;
const CTR_EPOCHS: u64 = 2;
const DEMO_STEPS: u64 = DIGITS_EPOCHS * STEPS_PER_EPOCH + CTR_EPOCHS * 2 * STEPS_PER_EPOCH;
const WORKERS: usize = 2;
const SERVERS: usize = 2;
/// Bound on the demo's run and on each wait of the test.
const WAIT_MAX: Duration = Duration::from_secs(300);
const CHROMIUM: &str = "/usr/bin/chromium";

/// The test's directory (kept: the screenshot is looked at after the run).
fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's directory");
    dir
}

/// The demo process: released and reaped (SIGTERM, then SIGKILL, bounded) when dropped.
struct Demo {
    child: Child,
    release: PathBuf,
}

impl Demo {
    /// Waits for the demo to exit, at most `limit`; its exit status.
    fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.release, b"");
        if self.wait(Duration::from_secs(30)).is_some() {
            return;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if self.wait(Duration::from_secs(30)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP GET on 127.0.0.1: the status line, the head, and the body.
fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String, String)> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        head.to_string(),
        body.to_string(),
    ))
}

fn get(addr: SocketAddr, path: &str) -> (String, String, String) {
    try_get(addr, path).unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// `/status.json` parsed; `None` while the endpoint does not take connections yet.
fn status_json(addr: SocketAddr) -> Option<serde_json::Value> {
    let (status, _, body) = try_get(addr, "/status.json").ok()?;
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    Some(serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status.json: {e}: {body}")))
}

/// Waits (bounded) for `path` to exist.
fn wait_for(path: &Path) -> bool {
    let deadline = Instant::now() + WAIT_MAX;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn u(value: &serde_json::Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key}: not a count in {value}"))
}

/// A PNG's width and height (its IHDR chunk).
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 24 && bytes.starts_with(b"\x89PNG\r\n\x1a\n") && &bytes[12..16] == b"IHDR",
        "{}: not a PNG",
        path.display()
    );
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// Headless Chromium on `url` with `args` (bounded); its stdout, or `None` after saying
/// SKIPPED when there is no Chromium.
fn chromium(out: &Path, name: &str, url: &str, args: &[String]) -> Option<String> {
    if !Path::new(CHROMIUM).exists() {
        skip_support::skip(
            Part::Chromium,
            &format!("the browser check: {CHROMIUM} is not installed (apt-get install chromium)"),
        );
        return None;
    }
    let profile = out.join(format!("chromium-profile-{name}"));
    let stdout = std::fs::File::create(out.join(format!("chromium-{name}.out"))).unwrap();
    let stderr = std::fs::File::create(out.join(format!("chromium-{name}.err"))).unwrap();
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {args:?} {url} did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(out.join(format!("chromium-{name}.out"))).unwrap();
    let err = std::fs::read_to_string(out.join(format!("chromium-{name}.err"))).unwrap();
    assert!(
        status.success(),
        "chromium {args:?}: {status}\n{said}\n{err}"
    );
    let _ = std::fs::remove_dir_all(&profile);
    Some(said)
}

#[test]
fn the_chief_serves_a_status_page_that_matches_the_run() {
    let out = out_dir();
    eprintln!(
        "status page test output (screenshot, logs): {}",
        out.display()
    );
    let run_dir = out.join("run");
    let checkpoints = out.join("checkpoints");
    let release = out.join("release");
    let demo_out = out.join("demo.out");
    let demo_err = out.join("demo.err");
    let child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args([
            "demo",
            "--digits-epochs",
            &DIGITS_EPOCHS.to_string(),
            "--ctr-epochs",
            &CTR_EPOCHS.to_string(),
            "--no-chaos",
            "--workers",
            &WORKERS.to_string(),
            "--ps",
            &SERVERS.to_string(),
        ])
        .arg("--checkpoint-dir")
        .arg(&checkpoints)
        .arg("--run-dir")
        .arg(&run_dir)
        .env("COHORT_DEMO_STEPS_PER_EPOCH", STEPS_PER_EPOCH.to_string())
        .env("COHORT_DEMO_CTR_VOCAB", "1000")
        .env(cohort::workloads::demo::HOLD_ENV, &release)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&demo_out).unwrap())
        .stderr(std::fs::File::create(&demo_err).unwrap())
        .spawn()
        .expect("start cohort demo");
    let mut demo = Demo { child, release };
    let said = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(&demo_out).unwrap_or_default(),
            std::fs::read_to_string(&demo_err).unwrap_or_default()
        )
    };

    let chief_file = cohort::launch::metrics_addr_file(&run_dir, TaskId::new(TaskType::Chief, 0));
    assert!(wait_for(&chief_file), "no chief address file:\n{}", said());
    let chief: SocketAddr = std::fs::read_to_string(&chief_file)
        .unwrap()
        .trim()
        .parse()
        .expect("an address");

    // While the job runs: the counts only grow; until every step committed and the curve is
    // written (the demo then holds).
    let loss_png = checkpoints.join("loss.png");
    let deadline = Instant::now() + WAIT_MAX;
    let mut reports = 0usize;
    let mut last: Option<serde_json::Value> = None;
    // The first report read, and when: closures committed since, within the page's 10 s rate
    // window and past a tick or two of its sampler (once a second), have a mean step time.
    let mut first: Option<(Instant, u64)> = None;
    let report = loop {
        assert!(
            Instant::now() < deadline,
            "the demo did not finish within {WAIT_MAX:?}; last status {last:?}:\n{}",
            said()
        );
        if let Ok(Some(status)) = demo.child.try_wait() {
            panic!(
                "the demo exited before it was released: {status}\n{}",
                said()
            );
        }
        let Some(report) = status_json(chief) else {
            assert!(
                reports == 0,
                "the chief's endpoint stopped answering:\n{}",
                said()
            );
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        reports += 1;
        let committed = u(&report["ledger"], "committed");
        match first {
            None => first = Some((Instant::now(), committed)),
            Some((at, before))
                if committed >= before + 4
                    && at.elapsed() >= Duration::from_millis(2500)
                    && at.elapsed() < Duration::from_secs(8) =>
            {
                assert!(
                    report["step_seconds"].as_f64().is_some_and(|t| t > 0.0),
                    "{} closures committed since the first report, but no step time: {report}",
                    committed - before
                );
            }
            Some(_) => {}
        }
        if let Some(before) = &last {
            for key in ["scheduled", "committed"] {
                assert!(
                    u(&report["ledger"], key) >= u(&before["ledger"], key),
                    "ledger.{key} went down: {before} then {report}"
                );
            }
            assert!(
                u(&report, "step") >= u(before, "step"),
                "{before} then {report}"
            );
            assert!(
                report["loss"].as_array().unwrap().len()
                    >= before["loss"].as_array().unwrap().len(),
                "the loss history shrank: {before} then {report}"
            );
        }
        let done = u(&report["ledger"], "committed") == DEMO_STEPS
            && u(&report["ledger"], "pending") == 0
            && loss_png.exists();
        last = Some(report.clone());
        if done {
            break report;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("{reports} status reports read while the demo ran");
    std::fs::write(out.join("status.json"), report.to_string()).unwrap();
    // The steps just committed are within the page's rate window once its sampler has ticked
    // (once a second): a rate and a mean step time, read again within a few ticks.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = status_json(chief).expect("the chief's status while the demo holds");
        let rate = now["steps_per_second"].as_f64().unwrap_or(0.0);
        let step = now["step_seconds"].as_f64().unwrap_or(0.0);
        if rate > 0.0 && step > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no step rate or step time on the page after the run: {now}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The end state: every task with its role, alive; the ledger; the checkpoint; the loss.
    let tasks = report["tasks"].as_array().expect("tasks");
    let count = |role: &str| tasks.iter().filter(|t| t["role"] == role).count();
    assert_eq!(
        (count("chief"), count("ps"), count("worker"), tasks.len()),
        (1, SERVERS, WORKERS, 1 + SERVERS + WORKERS),
        "{report}"
    );
    for task in tasks {
        assert_eq!(task["state"], "alive", "{task}");
        assert!(task["incarnation"].as_u64().is_some(), "{task}");
        assert!(
            task["address"].as_str().is_some_and(|a| a.contains(':')),
            "{task}"
        );
    }
    let ledger = &report["ledger"];
    assert_eq!(u(ledger, "scheduled"), DEMO_STEPS, "{report}");
    assert_eq!(u(&report, "step"), DEMO_STEPS, "{report}");
    assert_eq!(report["job"], "cohort-demo", "{report}");
    let checkpoint = &report["checkpoint"];
    assert_eq!(u(checkpoint, "step"), DEMO_STEPS, "{report}");
    assert!(
        Path::new(checkpoint["path"].as_str().unwrap()).starts_with(&checkpoints),
        "{report}"
    );
    let loss = report["loss"].as_array().expect("loss");
    assert_eq!(loss.len() as u64, DIGITS_EPOCHS + CTR_EPOCHS, "{report}");
    assert_eq!(u(loss.last().unwrap(), "step"), DEMO_STEPS, "{report}");
    assert!(loss
        .iter()
        .all(|p| p["loss"].as_f64().is_some_and(f64::is_finite)));

    // The page itself, and no page on other roles.
    let (status, head, page) = get(chief, "/status");
    assert_eq!(status, "HTTP/1.1 200 OK", "{page}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/html"),
        "{head}"
    );
    assert!(page.contains("<title>cohort-demo"), "{page}");
    let worker_file = cohort::launch::metrics_addr_file(&run_dir, TaskId::new(TaskType::Worker, 0));
    let worker: SocketAddr = std::fs::read_to_string(worker_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (status, _, body) = get(worker, "/status.json");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}: {body}");

    // In a browser: the script drew a row per task and the curve; a screenshot to look at.
    let url = format!("http://{chief}/status");
    if let Some(dom) = chromium(&out, "dom", &url, &["--dump-dom".into()]) {
        std::fs::write(out.join("status.dom.html"), &dom).unwrap();
        assert_eq!(
            dom.matches("<tr class=\"task\">").count(),
            tasks.len(),
            "{dom}"
        );
        assert!(
            dom.contains("id=\"loss-line\""),
            "no loss curve drawn:\n{dom}"
        );
        assert_eq!(
            dom.matches("class=\"loss-point\"").count(),
            loss.len(),
            "{dom}"
        );
        let shot = out.join("status.png");
        chromium(
            &out,
            "screenshot",
            &url,
            &[
                format!("--screenshot={}", shot.display()),
                "--window-size=1200,900".into(),
            ],
        );
        assert_eq!(png_size(&shot), (1200, 900));
        eprintln!("status page screenshot: {}", shot.display());
    }

    // Released, the demo ends well; its summary agrees with the page.
    std::fs::write(&demo.release, b"").unwrap();
    let exit = demo.wait(WAIT_MAX);
    let text = said();
    assert!(exit.is_some_and(|s| s.success()), "demo: {exit:?}\n{text}");
    let summary = format!(
        "ledger: {} closures scheduled, {} committed,",
        u(ledger, "scheduled"),
        u(ledger, "committed")
    );
    assert!(text.contains(&summary), "no {summary:?} in:\n{text}");
    assert!(
        text.contains(&format!("loss curve: {}", loss_png.display())),
        "{text}"
    );
    assert_eq!(png_size(&loss_png), (1000, 600));
    std::fs::copy(&loss_png, out.join("loss.png")).unwrap();
}

/// Every MultiWorkerMirrored worker serves a status page too, its own view of the group: in
/// `cohort demo --strategy multi-worker-mirrored` (a worker killed midway and restarted) the
/// chief's `/status.json` shows the group's epoch and workers, every task, the membership
/// changes (formed, the loss, the admission) as they happen, the step rate, the loss and the
/// newest checkpoint, with no ledger; `/status` draws the membership table.
#[test]
fn a_multi_worker_mirrored_worker_serves_its_view_of_the_group() {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page-mwms");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let run_dir = out.join("run");
    let demo_out = out.join("demo.out");
    let child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args([
            "demo",
            "--strategy",
            "multi-worker-mirrored",
            "--digits-epochs",
            "150",
        ])
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("--checkpoint-dir")
        .arg(out.join("checkpoints"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&demo_out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cohort demo");
    let mut demo = Demo {
        child,
        release: out.join("release"),
    };
    let said = || std::fs::read_to_string(&demo_out).unwrap_or_default();
    let chief_file = cohort::launch::metrics_addr_file(&run_dir, TaskId::new(TaskType::Chief, 0));
    assert!(wait_for(&chief_file), "no chief address file:\n{}", said());
    let chief: SocketAddr = std::fs::read_to_string(&chief_file)
        .unwrap()
        .trim()
        .parse()
        .expect("an address");
    let deadline = Instant::now() + WAIT_MAX;
    let (mut rated, mut page_drawn) = (false, false);
    let mut last: Option<serde_json::Value> = None;
    // Until the chief's page shows the restarted worker admitted and a checkpoint (or the job
    // ends): on a busy machine the worker may be lost and admitted again before the first
    // checkpoint is saved.
    while Instant::now() < deadline && demo.child.try_wait().ok().flatten().is_none() {
        std::thread::sleep(Duration::from_millis(100));
        let Some(report) = status_json(chief) else {
            continue;
        };
        assert!(report["ledger"].is_null(), "{report}");
        if report["group"].is_null() {
            continue;
        }
        rated |= report["steps_per_second"].as_f64().unwrap_or(0.0) > 0.0;
        if !page_drawn {
            let (_, _, page) = get(chief, "/status");
            assert!(page.contains("Group generations"), "{page}");
            page_drawn = true;
        }
        let admitted = report["group"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["what"].as_str().unwrap().starts_with("admitted"));
        let saved = report["checkpoint"]["step"].as_u64().is_some();
        last = Some(report);
        if admitted && saved {
            break;
        }
    }
    let report = last.unwrap_or_else(|| panic!("no status with a group:\n{}", said()));
    assert!(
        report["job"]
            .as_str()
            .unwrap()
            .contains("MultiWorkerMirrored"),
        "{report}"
    );
    let group = &report["group"];
    assert_eq!(u(group, "workers"), 3, "{report}");
    assert_eq!(u(group, "replicas_per_worker"), 1, "{report}");
    assert_eq!(group["communication"], "ring", "{report}");
    let changes: Vec<(u64, String)> = group["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (u(c, "generation"), c["what"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(changes[0], (1, "formed".to_string()), "{report}");
    assert!(
        changes.iter().any(|(_, w)| w.starts_with("lost worker/"))
            && changes
                .iter()
                .any(|(_, w)| w.starts_with("admitted worker/")),
        "{report}\n{}",
        said()
    );
    assert!(
        changes.windows(2).all(|w| w[0].0 < w[1].0),
        "generations go forward: {report}"
    );
    assert_eq!(
        u(group, "generation"),
        changes.last().unwrap().0,
        "{report}"
    );
    let tasks = report["tasks"].as_array().unwrap();
    let roles: Vec<(String, u64, String)> = tasks
        .iter()
        .map(|t| {
            (
                t["role"].as_str().unwrap().to_string(),
                u(t, "index"),
                t["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [("chief", 0), ("worker", 0), ("worker", 1)]
            .map(|(r, i)| (r.to_string(), i, "alive".to_string()))
            .to_vec(),
        "{report}"
    );
    assert!(u(&report, "step") > 0, "{report}");
    assert!(rated, "no report had a step rate: {report}");
    assert!(!report["loss"].as_array().unwrap().is_empty(), "{report}");
    assert!(report["checkpoint"]["step"].as_u64().is_some(), "{report}");
    let status = demo.wait(WAIT_MAX);
    assert!(
        status.is_some_and(|s| s.success()),
        "the demo: {status:?}\n{}",
        said()
    );
}
