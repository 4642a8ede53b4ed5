//! Both built-in workloads converge on a real 2 PS × 2 worker cluster of processes: the digits
//! classifier to at least 95 % held-out accuracy, and the CTR model to within a stated margin
//! of its planted floor. This runs the `cohort demo` binary itself (fewer steps than the demo's
//! defaults) and reads the summary the chief prints.
//!
//! The MultiWorkerMirrored demo (`--strategy multi-worker-mirrored`): 3 worker processes
//! train the digits classifier to at least 95 % while worker 1 is SIGKILLed midway; the
//! survivors re-form at epoch 2 and admit worker 1's restarted process at epoch 3.

mod skip_support;
use skip_support::Part;
use std::process::Command;
use std::time::Duration;

/// How far above the planted floor the CTR model's held-out log loss may end, after the
/// shortened run below (the full demo ends within about 0.002).
const CTR_MARGIN: f64 = 0.02;

#[test]
fn digits_and_ctr_converge_on_a_two_ps_two_worker_cluster() {
    let checkpoints = std::env::temp_dir().join(format!("cohort-demo-test-{}", std::process::id()));
    let output = run_with_timeout(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args([
                "demo",
                "--digits-epochs",
                "5",
                "--ctr-epochs",
                "3",
                "--no-chaos",
                "--detection-budget",
                "5s",
            ])
            .arg("--checkpoint-dir")
            .arg(&checkpoints),
        Duration::from_secs(240),
    );
    // A checkpoint directory the user named keeps its checkpoints.
    let kept = checkpoint_dirs(&checkpoints);
    let _ = std::fs::remove_dir_all(&checkpoints);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );

    let summary = &stdout[stdout
        .find("== summary")
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"))..];
    let accuracy: f64 = number_after(summary, "digits: held-out accuracy ").expect("accuracy line");
    assert!(
        accuracy >= 95.0,
        "digits held-out accuracy {accuracy}%\n{stdout}"
    );

    let loss: f64 = number_after(summary, "ctr: held-out log loss ").expect("ctr loss line");
    let floor: f64 = number_after(summary, "planted floor ").expect("floor");
    assert!(
        loss - floor < CTR_MARGIN,
        "CTR held-out loss {loss} vs floor {floor} (margin {CTR_MARGIN})\n{stdout}"
    );

    // LEDGER-1 and PS-1 as the summary reports them.
    let committed: u64 = number_after(summary, "closures scheduled, ").expect("ledger line");
    let scheduled: u64 = number_after(summary, "ledger: ").expect("ledger line");
    assert_eq!(committed, scheduled, "{summary}");
    assert!(summary.contains("0 duplicates refused"), "{summary}");
    assert!(
        kept > 0,
        "no checkpoint kept in --checkpoint-dir:\n{stderr}"
    );
    assert!(!stderr.contains("removed the run's"), "{stderr}");
}

/// The checkpoints (`ckpt-*` directories) directly under `dir`.
fn checkpoint_dirs(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("ckpt-"))
            .count()
    })
}

#[test]
fn the_multi_worker_mirrored_demo_loses_a_worker_midway_re_forms_readmits_it_and_converges() {
    // The default checkpoint directory goes under TMPDIR: a fresh one, to find it.
    let tmp = std::env::temp_dir().join(format!("cohort-demo-tmpdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let output = run_with_timeout(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args([
                "demo",
                "--strategy",
                "multi-worker-mirrored",
                "--digits-epochs",
                "20",
                "--no-metrics",
            ])
            .env("TMPDIR", &tmp),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    // A successful run removes the checkpoints of its default directory, and the directory
    // with them when nothing else is in it, and says so.
    let left: Vec<std::path::PathBuf> = std::fs::read_dir(&tmp)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("cohort-demo-")
        })
        .collect();
    assert_eq!(left, Vec::<std::path::PathBuf>::new(), "left behind");
    assert!(stderr.contains("removed the run's"), "{stderr}");
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        stderr.contains("chaos: SIGKILL worker/1"),
        "no kill:\n{stderr}"
    );
    let summary = &stdout[stdout
        .find("== summary")
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"))..];
    // The group's generations: all three, the survivors without worker 1, all three again.
    let epochs: Vec<&str> = summary
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, rest)| rest.trim()))
        .filter(|l| l.starts_with("generation "))
        .collect();
    assert!(epochs.len() >= 3, "{summary}");
    assert!(
        epochs[0].starts_with("generation 1: 3 workers"),
        "{summary}"
    );
    assert!(
        epochs[1].contains("2 workers") && epochs[1].contains("lost worker/1"),
        "{summary}"
    );
    let last = epochs[epochs.len() - 1];
    assert!(
        last.contains("3 workers") && last.contains("admitted worker/1"),
        "{summary}"
    );
    assert!(
        stdout.contains("[worker/1] worker/1: received step"),
        "the restarted worker did not say it received the state:\n{stdout}"
    );
    let accuracy: f64 = number_after(summary, "digits: held-out accuracy ").expect("accuracy line");
    assert!(
        accuracy >= 95.0,
        "digits held-out accuracy {accuracy}%\n{stdout}"
    );
}

/// `cohort launch --job multi-worker-mirrored` runs the MultiWorkerMirrored demo's tasks with
/// nothing killed: one membership epoch of every task, the same final model on each, and the
/// accuracy target met (the settings reach the tasks through the environment).
#[test]
fn the_multi_worker_mirrored_job_launches_with_no_kill_and_converges() {
    let output = run_with_timeout(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args([
                "launch",
                "--job",
                "multi-worker-mirrored",
                "--workers",
                "2",
                "--no-metrics",
            ])
            .env("COHORT_DEMO_DIGITS_EPOCHS", "20"),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "launch failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(!stderr.contains("SIGKILL"), "nothing is killed:\n{stderr}");
    let summary = &stdout[stdout
        .find("== summary")
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"))..];
    assert!(
        summary.contains("generation 1: 3 workers from step 0"),
        "{summary}"
    );
    assert_one_model_and_accurate(&stdout, summary, 3);
}

/// `cohort launch --job multi-worker-mirrored --workers 2:4 --run-dir DIR` is elastic:
/// `cohort scale` to 4 starts workers 2 and 3 past the others' cluster spec, and each joins
/// the group at a step boundary (receiving the state from a live member; the global batch
/// grows); `cohort scale` back to 2 drains them (SIGUSR1): each leaves at an agreed step
/// boundary without a checkpoint, exits 0 and is not restarted. The job then ends with one
/// model on every task left and the accuracy target met.
#[test]
fn the_multi_worker_mirrored_job_grows_and_shrinks_with_cohort_scale() {
    let run_dir = std::env::temp_dir().join(format!("cohort-mwms-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    let mut job = LiveRun::start(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args([
                "launch",
                "--job",
                "multi-worker-mirrored",
                "--workers",
                "2:4",
                "--no-metrics",
            ])
            .arg("--run-dir")
            .arg(&run_dir)
            .env("COHORT_DEMO_DIGITS_EPOCHS", MWMS_SCALE_EPOCHS),
    );
    // Training has begun (the chief's first epoch line) before the job grows.
    job.wait_for(|l| l.starts_with("[chief/0] epoch 1/"));
    scale(&run_dir, 4);
    // Both added workers are in the group: the chief, workers 0 to 3.
    let grew = job.wait_for(|l| l.contains("group grew") && l.contains("with 5 workers"));
    assert!(grew.contains("going on from step"), "{grew}");
    job.wait_for(|l| l.starts_with("[worker/2] worker/2: received step"));
    job.wait_for(|l| l.starts_with("[worker/3] worker/3: received step"));
    scale(&run_dir, 2);
    let shrank = job.wait_for(|l| l.contains("group shrank") && l.contains("with 3 workers"));
    assert!(shrank.contains("no checkpoint needed"), "{shrank}");
    let (status, lines) = job.finish(Duration::from_secs(240));
    let _ = std::fs::remove_dir_all(&run_dir);
    let all = lines.join("\n");
    assert!(status.success(), "launch failed: {status:?}\n{all}");
    for worker in [2, 3] {
        assert!(
            all.contains(&format!(
                "[worker/{worker}] worker/{worker}: drained: left the group"
            )),
            "worker/{worker} did not leave drained:\n{all}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("worker/{worker} (incarnation"))
                    && l.contains("drained: exit code 0; not restarted")),
            "worker/{worker} was restarted or not drained:\n{all}"
        );
    }
    // One summary, from the group's first member at the end.
    assert_eq!(all.matches("== summary").count(), 1, "{all}");
    let summary = &all[all
        .find("== summary")
        .unwrap_or_else(|| panic!("no summary in:\n{all}"))..];
    assert!(
        summary.contains("generation 1: 3 workers from step 0"),
        "{summary}"
    );
    for worker in [2, 3] {
        let name = format!("worker/{worker}");
        assert!(
            summary
                .lines()
                .any(|l| l.contains("admitted") && l.contains(&name)),
            "{name} never admitted:\n{summary}"
        );
        assert!(
            summary
                .lines()
                .any(|l| l.contains("drained (scaled down)") && l.contains(&name)),
            "{name} never drained:\n{summary}"
        );
    }
    assert_one_model_and_accurate(&all, summary, 3);
}

/// Epochs of the scaled MultiWorkerMirrored job: long enough for both scale requests to be
/// carried out while it trains, on a busy machine.
const MWMS_SCALE_EPOCHS: &str = "200";

/// `cohort scale --run-dir DIR --workers N`, which must succeed.
fn scale(run_dir: &std::path::Path, workers: u32) {
    let output = run_with_timeout(
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .arg("scale")
            .arg("--run-dir")
            .arg(run_dir)
            .args(["--workers", &workers.to_string()]),
        Duration::from_secs(30),
    );
    assert!(
        output.status.success(),
        "scale to {workers}: {:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A launcher whose output (stdout and stderr, line by line) is read while it runs; stopped
/// (SIGTERM: it stops its cluster) if dropped before it ended.
struct LiveRun {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl LiveRun {
    /// How long one awaited line may take.
    const LINE_WAIT: Duration = Duration::from_secs(120);

    fn start(command: &mut Command) -> Self {
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for stream in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stream)
                    .lines()
                    .map_while(Result::ok)
                {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line so far that `wanted` matches (the tasks' lines interleave: one may come
    /// before another it follows), else the next; panics with what came after
    /// [`Self::LINE_WAIT`] or once the output ended.
    fn wait_for(&mut self, wanted: impl Fn(&str) -> bool) -> String {
        if let Some(line) = self.seen.iter().find(|l| wanted(l)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + Self::LINE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "the awaited line did not come; the output so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the launcher's exit (at most `limit`) and the rest of its output.
    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the job did not end within {limit:?}:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        // The readers end with the pipes.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, std::mem::take(&mut self.seen))
    }
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }
}

/// A MultiWorkerMirrored job's output: `tasks` tasks printed their final model, all the same
/// one, and the chief's `summary` says the held-out accuracy reached 95 %.
fn assert_one_model_and_accurate(output: &str, summary: &str, tasks: usize) {
    let digests: Vec<&str> = output
        .lines()
        .filter_map(|l| l.split_once("final model: ").map(|(_, d)| d.trim()))
        .collect();
    assert_eq!(digests.len(), tasks, "one final model per task:\n{output}");
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let accuracy: f64 = number_after(summary, "digits: held-out accuracy ").expect("accuracy line");
    assert!(
        accuracy >= 95.0,
        "digits held-out accuracy {accuracy}%\n{output}"
    );
}

/// The number that follows the first occurrence of `prefix` in `text` (digits and a dot).
fn number_after<T: std::str::FromStr>(text: &str, prefix: &str) -> Option<T> {
    let start = text.find(prefix)? + prefix.len();
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

fn run_with_timeout(command: &mut Command, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // The launcher stops its whole cluster on SIGTERM.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let output = rx
                .recv_timeout(Duration::from_secs(30))
                .ok()
                .and_then(Result::ok);
            panic!(
                "demo did not finish within {limit:?}: {:?}",
                output.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            );
        }
    }
}

/// `--communication` belongs to the MultiWorkerMirrored demo, and NCCL there is refused at
/// once, naming the flag and what is missing, where this machine cannot run it (no GPU, no
/// libnccl, or a build without the feature), before any task starts; so are `--evaluators`
/// and `--ps`, which its group cannot take (by the demo and by `launch --job
/// multi-worker-mirrored` alike).
#[test]
fn the_demos_flags_are_refused_where_they_cannot_be_used() {
    let run = |args: &[&str]| {
        run_with_timeout(
            Command::new(env!("CARGO_BIN_EXE_cohort")).args(args),
            Duration::from_secs(60),
        )
    };
    let output = run(&["demo", "--communication", "ring", "--no-metrics"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--communication: only with --strategy multi-worker-mirrored"),
        "{stderr}"
    );
    // What the group cannot take is refused too, before any task starts, by the demo and by
    // `launch --job multi-worker-mirrored` alike.
    for (flags, expected) in [
        (
            ["--evaluators", "1"],
            "--evaluators 1: the MultiWorkerMirrored demo has no evaluator",
        ),
        (
            ["--ps", "2"],
            "--ps 2: a MultiWorkerMirrored job has no parameter server",
        ),
    ] {
        let mut args = vec![
            "demo",
            "--strategy",
            "multi-worker-mirrored",
            "--no-metrics",
        ];
        args.extend(flags);
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        let mut args = vec!["launch", "--job", "multi-worker-mirrored", "--no-metrics"];
        args.extend(flags);
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!stderr.contains("launcher: started"), "{flags:?}: {stderr}");
    }
    let nccl = cohort::strategy::Communication::Nccl { device: 0 };
    if nccl.check().is_ok() {
        skip_support::skip(
            Part::NoGpu,
            "the refused NCCL demo: a GPU with NCCL is here, the demo would run",
        );
        return;
    }
    let output = run(&[
        "demo",
        "--strategy",
        "multi-worker-mirrored",
        "--communication",
        "nccl",
        "--no-metrics",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--communication: nccl:0: "), "{stderr}");
    assert!(
        !stderr.contains("launcher: started"),
        "no task started: {stderr}"
    );
}
