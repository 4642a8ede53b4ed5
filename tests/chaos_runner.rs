//! `cohort chaos run` against the real demo (a chief, 2 parameter servers and 2 workers, each
//! a process, QUIC on 127.0.0.1), with the plans shipped in `examples/chaos/`: the two the
//! demo survives pass, the one that deletes every checkpoint before a server dies is reported
//! as a violation; bad plans are refused before any job starts; and `chaos sim --plan` runs
//! a shipped plan. The MultiWorkerMirrored demo under a kill and a preemption passes its own
//! checks (one model, group generations going forward).

mod skip_support;
use skip_support::Part;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cohort::checkpoint::list_checkpoints;

const EXE: &str = env!("CARGO_BIN_EXE_cohort");

/// The most one runner call may take here (its own --timeout is shorter).
const RUN_BOUND: Duration = Duration::from_secs(420);

fn plan(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/chaos")
        .join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cohort-chaos-run-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `cohort` with `args` to its end, bounded by [`RUN_BOUND`] (then killed).
fn cohort(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut child = Command::new(EXE)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cohort");
    // Drain the pipes on threads so that a chatty child never blocks.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut buf);
        buf
    });
    let deadline = Instant::now() + RUN_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `chaos run` of a shipped plan over a small demo (1,800 closures, about 20 s on a busy
/// 2-core machine); returns the runner's output and the
/// report's JSON.
fn run_plan(name: &str) -> (Output, serde_json::Value, PathBuf) {
    let dir = temp_dir(name.trim_end_matches(".toml"));
    run_plan_file(&plan(name), dir)
}

fn run_plan_file(plan: &Path, dir: PathBuf) -> (Output, serde_json::Value, PathBuf) {
    let demo = [
        "--digits-epochs",
        "6",
        "--ctr-epochs",
        "6",
        "--detection-budget",
        "2s",
    ];
    let envs = [
        ("COHORT_DEMO_STEPS_PER_EPOCH", "100"),
        ("COHORT_DEMO_CTR_VOCAB", "1000"),
    ];
    run_demo(plan, dir, &demo, &envs)
}

/// `chaos run` of `plan` over `cohort demo --no-chaos` with `demo` flags and `envs`, its run
/// and checkpoint directories under `dir`.
fn run_demo(
    plan: &Path,
    dir: PathBuf,
    demo: &[&str],
    envs: &[(&str, &str)],
) -> (Output, serde_json::Value, PathBuf) {
    let run_dir = dir.join("run");
    let checkpoints = dir.join("ckpt");
    let out = dir.join("report");
    let mut args = vec![
        "chaos",
        "run",
        "--plan",
        plan.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--timeout",
        "300s",
        "--",
        EXE,
        "demo",
        "--no-chaos",
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--checkpoint-dir",
        checkpoints.to_str().unwrap(),
    ];
    args.extend_from_slice(demo);
    let output = cohort(&args, envs);
    let report = std::fs::read(out.join("report.json")).unwrap_or_else(|e| {
        panic!(
            "no report.json ({e}):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let report: serde_json::Value = serde_json::from_slice(&report).expect("report.json");
    assert!(out.join("report.txt").is_file());
    // The timeline picture: a PNG of the size drawn (its IHDR chunk).
    let png = std::fs::read(out.join("timeline.png")).expect("timeline.png");
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n") && &png[12..16] == b"IHDR",
        "timeline.png is a PNG"
    );
    let side = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert_eq!((side(16), side(20)), (1200, 500));
    (output, report, dir)
}

fn describe(output: &Output, report: &serde_json::Value) -> String {
    format!(
        "exit {:?}\nreport: {}\nstderr tail: {}",
        output.status.code(),
        serde_json::to_string_pretty(&report["checks"]).unwrap_or_default(),
        tail(&String::from_utf8_lossy(&output.stderr), 4000)
    )
}

fn tail(text: &str, n: usize) -> &str {
    let start = text.len().saturating_sub(n);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    &text[start..]
}

/// Every check of the report passed.
fn assert_every_check_passed(report: &serde_json::Value, why: &str) {
    for name in [
        "exit code",
        "faults applied",
        "every closure committed once",
        "ps applied counts",
        "no panic",
    ] {
        assert_eq!(check(report, name)["status"], "passed", "{name}: {why}");
    }
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?}"))
}

/// Every fault applied, at or after its planned time.
fn assert_faults_applied(report: &serde_json::Value, kinds: &[&str]) {
    let faults = report["timeline"]["faults"].as_array().expect("faults");
    let applied: Vec<&str> = faults
        .iter()
        .map(|f| {
            assert_eq!(f["applied"], true, "{f}");
            f["kind"].as_str().unwrap()
        })
        .collect();
    assert_eq!(applied, kinds);
}

#[test]
fn the_demo_survives_a_worker_and_a_server_killed() {
    let (output, report, dir) = run_plan("kill-worker-and-ps.toml");
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_eq!(report["plan"]["seed"], 11);
    assert_faults_applied(&report, &["kill", "kill"]);
    let faults = report["timeline"]["faults"].as_array().unwrap();
    assert_eq!(faults[0]["task"], "worker/1");
    assert!(
        faults[1]["task"]
            .as_str()
            .is_some_and(|t| t == "ps/0" || t == "ps/1"),
        "{why}"
    );
    assert_every_check_passed(&report, &why);
    // The chief's step rate was sampled from its metrics endpoint.
    assert!(
        !report["timeline"]["samples"].as_array().unwrap().is_empty(),
        "{why}"
    );
    // A plan without network faults leaves the tasks' sockets alone: no rules files, no
    // faulty socket.
    assert!(!dir.join("run/net").exists(), "{why}");
    let log = std::fs::read_to_string(dir.join("report/job.log")).expect("job.log");
    assert!(!log.contains("network faults"), "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The MultiWorkerMirrored demo under a worker killed and its chief preempted: the launcher
/// restarts both (the chief as a peer: the others go on meanwhile), and the runner knows the
/// job for a synchronous one (no closures, no servers: those checks are skipped) and checks
/// its own invariants: every member ends with one model, the epochs go forward.
#[test]
fn the_multi_worker_mirrored_demo_survives_a_kill_and_a_preemption_with_one_model() {
    let report = mwms_plan_passes("mwms-kill-and-preempt.toml", &["kill", "term"]);
    // Both came back: the chief's restart lists the epochs from its admission on.
    assert_last_generation_has(&report, 3);
    // The chief's metrics endpoint served its group's step: the step rate was sampled.
    let samples = report["timeline"]["samples"].as_array().unwrap();
    assert!(
        samples.iter().any(|s| s["committed"].as_f64() > Some(0.0)),
        "{samples:?}"
    );
}

/// Two of the demo's three workers killed at once: the chief alone is no quorum and fails,
/// the launcher restarts it (a peer chief), and the restarted workers, finding no live group
/// to join, form the first epoch with it again: the job resumes from the chief's checkpoint.
#[test]
fn the_multi_worker_mirrored_demo_survives_two_of_three_workers_killed_by_starting_again() {
    mwms_plan_passes("mwms-kill-two.toml", &["kill", "kill"]);
}

/// The MultiWorkerMirrored demo launched elastic (`--workers 2:4`) and scaled by the plan: to 4
/// workers (both added ones join), worker 3 killed (restarted, admitted again), back to 2
/// (both drained: they leave without a checkpoint and are not restarted). The 3 members left
/// end with one model, and the group's epochs go forward through every change.
#[test]
fn the_multi_worker_mirrored_demo_is_scaled_up_hit_and_scaled_down_with_one_model() {
    let report = mwms_plan_passes_with(
        "mwms-scale-and-kill.toml",
        &["scale", "kill", "scale"],
        &["--workers", "2:4", "--digits-epochs", "150"],
    );
    assert_last_generation_has(&report, 3);
}

/// The last group generation the report's check lists has `workers` workers.
fn assert_last_generation_has(report: &serde_json::Value, workers: usize) {
    let epochs = check(report, "group generations")["detail"]
        .as_str()
        .unwrap();
    let last = epochs.rsplit(", ").next().unwrap();
    assert!(
        last.contains(&format!("({workers} workers from step")),
        "the last generation has {workers}: {epochs}"
    );
}

/// `chaos run` of a shipped plan over the MultiWorkerMirrored demo: every check it makes
/// passed, the closure and server checks skipped, and 3 workers ended with one model. The
/// report.
fn mwms_plan_passes(name: &str, kinds: &[&str]) -> serde_json::Value {
    mwms_plan_passes_with(name, kinds, &["--digits-epochs", "60"])
}

/// As [`mwms_plan_passes`], with more flags of the demo (`extra`).
fn mwms_plan_passes_with(name: &str, kinds: &[&str], extra: &[&str]) -> serde_json::Value {
    let dir = temp_dir(name.trim_end_matches(".toml"));
    let mut demo = vec!["--strategy", "multi-worker-mirrored"];
    demo.extend_from_slice(extra);
    let (output, report, dir) = run_demo(&plan(name), dir, &demo, &[]);
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_faults_applied(&report, kinds);
    for name in ["exit code", "faults applied", "one model", "no panic"] {
        assert_eq!(check(&report, name)["status"], "passed", "{name}: {why}");
    }
    for name in ["every closure committed once", "ps applied counts"] {
        assert_eq!(check(&report, name)["status"], "skipped", "{name}: {why}");
    }
    // A preempted chief is restarted and rejoins; where the others finish the job while it
    // is away (a slow restart on a busy machine), the job ends 0 without it, as designed
    // (`LaunchOutcome::WorkersFinished`): the chief reports no group generations, and one
    // model counts the workers that finished.
    let membership = check(&report, "group generations");
    let chief_away = membership["status"] == "skipped"
        && membership["detail"]
            .as_str()
            .unwrap()
            .contains("the chief did not finish");
    if !chief_away {
        assert_eq!(membership["status"], "passed", "group generations: {why}");
    }
    let one_model = check(&report, "one model")["detail"].as_str().unwrap();
    let finished = if chief_away { "2" } else { "3" };
    assert!(
        one_model.starts_with(&format!("{finished} worker(s) ended at step")),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
    report
}

#[test]
fn the_demo_survives_a_server_preempted_and_a_worker_paused() {
    let (output, report, dir) = run_plan("term-ps-pause-worker.toml");
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_faults_applied(&report, &["term", "pause"]);
    assert_eq!(report["timeline"]["faults"][0]["task"], "ps/1", "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn deleting_every_checkpoint_before_a_server_dies_is_reported_as_a_violation() {
    let (output, report, dir) = run_plan("delete-checkpoint-then-kill-ps.toml");
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(1), "{why}");
    assert_eq!(report["verdict"], "violation", "{why}");
    // The job failed, as a server lost with no checkpoint makes it: the runner says so.
    assert_eq!(check(&report, "exit code")["status"], "failed", "{why}");
    assert_ne!(report["exit_code"], 0, "{why}");
    assert_eq!(
        check(&report, "every closure committed once")["status"],
        "failed",
        "{why}"
    );
    let faults = report["timeline"]["faults"].as_array().unwrap();
    assert_eq!(faults[0]["kind"], "delete_checkpoint");
    assert!(
        faults[0]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("deleted the checkpoint")),
        "{why}"
    );
    assert_eq!(faults[1]["task"], "ps/0", "{why}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("violation: "), "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A bit flipped in the newest checkpoint's shard just as a server dies: the servers must
/// roll back, and that checkpoint no longer verifies, so the chief rolls back to the
/// checkpoint before it (the demo keeps two) and runs again everything committed since; the
/// job finishes and every check passes.
#[test]
fn a_corrupted_newest_checkpoint_when_a_server_dies_rolls_back_to_the_one_before() {
    let dir = temp_dir("corrupt");
    let plan = dir.join("corrupt.toml");
    std::fs::write(
        &plan,
        "seed = 21\n\
         [[fault]]\nkind = \"corrupt_checkpoint\"\nat = \"1s\"\nafter = \"checkpoint:2\"\n\
         [[fault]]\nkind = \"kill\"\ntarget = \"ps:1\"\nat = \"1s\"\nafter = \"checkpoint:2\"\n",
    )
    .unwrap();
    let (output, report, dir) = run_plan_file(&plan, dir);
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_eq!(check(&report, "exit code")["status"], "passed", "{why}");
    assert_eq!(
        check(&report, "every closure committed once")["status"],
        "passed",
        "{why}"
    );
    assert_faults_applied(&report, &["corrupt_checkpoint", "kill"]);
    let detail = report["timeline"]["faults"][0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("flipped bit") && detail.contains("shard-"),
        "{detail}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The checkpoint disk full for a while: a real ENOSPC (the job's checkpoint directory is a
/// tmpfs in a mount namespace of its own, which the runner fills, then frees). The saves due
/// meanwhile fail and the job says so and trains on; the final save, if it comes while the disk
/// is full, is tried again until it is freed; every check passes against the checkpoints
/// written once it was.
#[test]
fn a_full_checkpoint_disk_for_a_while_costs_saves_not_the_job() {
    if let Err(why) = cohort::chaosrun::disk::probe_namespaces() {
        skip_support::skip(Part::Unshare, &why.to_string());
        return;
    }
    let (output, report, dir) = run_plan("disk-full.toml");
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_faults_applied(&report, &["disk_full", "heal"]);
    let filled = report["timeline"]["faults"][0]["detail"].as_str().unwrap();
    assert!(filled.contains("No space left on device"), "{filled}");
    let log = std::fs::read_to_string(dir.join("report/job.log")).expect("job.log");
    assert!(
        log.contains("not saved") && log.contains("No space left on device"),
        "no save failed while the disk was full: {why}"
    );
    // The tmpfs's checkpoints were copied back where the job was told to write them.
    assert!(
        list_checkpoints(&dir.join("ckpt")).is_ok_and(|c| !c.is_empty()),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The same partition healed while the job runs: the worker and the chief, which declared
/// each other dead, race to reach each other; whichever loses exits 171 and comes back as a
/// new incarnation (a worker the servers fenced exits when its push is refused as fenced), and
/// the job passes every check.
#[test]
fn a_partition_healed_while_the_job_runs_loses_nothing() {
    let dir = temp_dir("healed");
    let plan = dir.join("healed.toml");
    std::fs::write(
        &plan,
        "seed = 17\n\
         [[fault]]\nkind = \"partition\"\ntarget = \"worker:0\"\npeer = \"chief\"\n\
         at = \"1s\"\nafter = \"first_checkpoint\"\nfor = \"5s\"\n",
    )
    .unwrap();
    let (output, report, dir) = run_plan_file(&plan, dir);
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_every_check_passed(&report, &why);
    assert_faults_applied(&report, &["partition", "heal"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// A worker cut off from the chief (and only from it) for longer than the detection budget:
/// the chief declares it dead and fences it, its closure is dispatched again, and the job
/// finishes on the other worker with every check passing. Meanwhile a short loss between that
/// worker and a server, healed.
#[test]
fn the_demo_survives_a_worker_partitioned_from_the_chief() {
    let (output, report, dir) = run_plan("partition-worker-from-chief.toml");
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_every_check_passed(&report, &why);
    // The partition outlives the job; the loss is healed.
    assert_faults_applied(&report, &["partition", "loss", "heal"]);
    let faults = report["timeline"]["faults"].as_array().unwrap();
    assert_eq!(faults[0]["task"], "worker/0", "{why}");
    let detail = faults[0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("partition between worker/0 and chief/0 for 600s"),
        "{detail}"
    );
    assert!(
        faults[1]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("loss 0.1 between worker/1 and ps/0")),
        "{why}"
    );
    assert_eq!(faults[2]["task"], "worker/1", "{why}");
    let (lossy, healed) = (
        faults[1]["t_s"].as_f64().unwrap(),
        faults[2]["t_s"].as_f64().unwrap(),
    );
    assert!(healed - lossy >= 2.0, "{why}");
    // No server was restored and every demo closure pushes to both servers: each applied
    // exactly one push per committed closure (a retry of the partitioned worker's closure is
    // refused as a duplicate, not applied).
    let ps = check(&report, "ps applied counts")["detail"]
        .as_str()
        .unwrap();
    for server in ["ps/0", "ps/1"] {
        assert!(
            ps.contains(&format!("{server}: "))
                && ps.matches("(one per committed closure)").count() == 2,
            "{ps}"
        );
    }
    // The chief declared the worker lost (it fenced that incarnation on every server) and
    // dispatched what it ran again.
    let log = std::fs::read_to_string(dir.join("report/job.log")).expect("job.log");
    assert!(log.contains("fencing worker/0"), "{why}");
    let redispatched = report["summary"]["ledger"]["redispatched"].as_u64();
    assert!(redispatched.is_some_and(|n| n >= 1), "{why}");
    // The chief's step time (dispatch to commit) was sampled from its metrics.
    assert!(
        report["timeline"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_seconds"].as_f64().is_some_and(|t| t > 0.0)),
        "{why}"
    );
    // Every task ran under its rules file and applied the runner's partition.
    let rules = std::fs::read_to_string(dir.join("run/net/worker-0.rules")).expect("rules");
    assert!(
        rules.starts_with("seed ") && rules.contains("partition 127.0.0.1:"),
        "{rules}"
    );
    for task in ["chief/0", "worker/0", "worker/1", "ps/0", "ps/1"] {
        assert!(
            log.lines().any(|l| l.starts_with(&format!("[{task}]"))
                && l.contains("network fault rules from")
                && l.contains("partition 127.0.0.1:")),
            "{task} did not apply the partition: {why}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Loss for one task (every datagram between a server and any other task) and between two
/// tasks, for a few seconds: the job finishes, every check passes, and the report lists the
/// faults and their heals.
#[test]
fn the_demo_rides_out_a_short_loss() {
    let dir = temp_dir("loss");
    let plan = dir.join("loss.toml");
    std::fs::write(
        &plan,
        "seed = 9\n\
         [[fault]]\nkind = \"loss\"\ntarget = \"ps:1\"\nprobability = 0.05\nat = \"500ms\"\n\
         after = \"first_checkpoint\"\nfor = \"3s\"\n\
         [[fault]]\nkind = \"loss\"\ntarget = \"worker\"\npeer = \"chief\"\nprobability = 0.2\n\
         at = \"1s\"\nafter = \"first_checkpoint\"\nfor = \"1500ms\"\n",
    )
    .unwrap();
    let (output, report, dir) = run_plan_file(&plan, dir);
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_faults_applied(&report, &["loss", "loss", "heal", "heal"]);
    let faults = report["timeline"]["faults"].as_array().unwrap();
    assert!(
        faults[0]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("loss 0.05 between ps/1 and every other task")),
        "{why}"
    );
    assert_eq!(report["plan"]["faults"][0]["probability"], 0.05, "{why}");
    assert_eq!(report["plan"]["faults"][1]["peer"], "chief", "{why}");
    let text = std::fs::read_to_string(dir.join("report/report.txt")).expect("report.txt");
    assert!(
        text.contains("loss ps/1") && text.contains("heal"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_plans_and_commands_are_refused_before_the_job_starts() {
    let dir = temp_dir("bad");
    let run_dir = dir.join("run");
    let launch = [
        EXE,
        "demo",
        "--no-chaos",
        "--run-dir",
        run_dir.to_str().unwrap(),
    ];
    let cases: [(&str, &[&str], &[&str]); 8] = [
        (
            "seed = 1\n[[fault]]\nkind = \"explode\"\ntarget = \"chief\"\nat = \"1s\"\n",
            &launch,
            &["fault[0].kind", "explode"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"worker:1\"\nat = \"1s..\"\n",
            &launch,
            &["fault[0].at"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"worker:5\"\nat = \"1s\"\n",
            &[
                EXE,
                "demo",
                "--workers",
                "2",
                "--run-dir",
                run_dir.to_str().unwrap(),
            ],
            &["fault[0].target", "worker:5"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"chief\"\nat = \"1s\"\n",
            &[EXE, "demo", "--no-chaos"],
            &["--run-dir"],
        ),
        // With the command's defaults (2 workers, 2 servers; no server under
        // MultiWorkerMirrored) as with its flags spelled out.
        (
            "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"worker:2\"\nat = \"1s\"\n",
            &[EXE, "demo", "--run-dir", run_dir.to_str().unwrap()],
            &["fault[0].target", "worker:2", "not a task of the job"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"kill\"\ntarget = \"ps:0\"\nat = \"1s\"\n",
            &[
                EXE,
                "demo",
                "--strategy",
                "multi-worker-mirrored",
                "--run-dir",
                run_dir.to_str().unwrap(),
            ],
            &["fault[0].target", "ps:0", "not a task of the job"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"partition\"\ntarget = \"chief\"\npeer = \"ps:2\"\nat = \"1s\"\nfor = \"1s\"\n",
            &[
                EXE,
                "demo",
                "--ps",
                "2",
                "--run-dir",
                run_dir.to_str().unwrap(),
            ],
            &["fault[0].peer", "ps:2"],
        ),
        (
            "seed = 1\n[[fault]]\nkind = \"corrupt_checkpoint\"\nat = \"1s\"\n",
            &launch,
            &["--checkpoint-dir"],
        ),
    ];
    for (i, (text, command, expected)) in cases.into_iter().enumerate() {
        let plan = dir.join(format!("plan-{i}.toml"));
        std::fs::write(&plan, text).unwrap();
        let mut args = vec!["chaos", "run", "--plan", plan.to_str().unwrap(), "--"];
        args.extend_from_slice(command);
        let output = cohort(&args, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "case {i}: {stderr}");
        // The case that names no file (the command lacks --run-dir).
        if !expected.contains(&"--run-dir") {
            assert!(
                stderr.contains(plan.to_str().unwrap()),
                "case {i} should name the file: {stderr}"
            );
        }
        for word in expected {
            assert!(stderr.contains(word), "case {i}: {stderr:?} lacks {word:?}");
        }
        // Nothing started: the launcher would have made its run directory.
        assert!(!run_dir.exists(), "case {i} started the job");
    }
    // A plan file that is not there.
    let missing = dir.join("missing.toml");
    let output = cohort(
        &[
            "chaos",
            "run",
            "--plan",
            missing.to_str().unwrap(),
            "--",
            EXE,
            "demo",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("missing.toml"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn chaos_sim_runs_a_shipped_plan_and_refuses_what_it_cannot_model() {
    let shipped = plan("term-ps-pause-worker.toml");
    let output = cohort(
        &[
            "chaos",
            "sim",
            "--plan",
            shipped.to_str().unwrap(),
            "--closures",
            "1000",
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("seed 5:"), "{stdout}");
    // The plan's faults, at the times drawn from its seed, happened in the simulated job.
    assert!(stdout.contains("Inject(Preempt(Ps(1)))"), "{stdout}");
    assert!(stdout.contains("Inject(Pause(Worker("), "{stdout}");
    assert!(
        !stdout.contains("after the simulated job ended"),
        "{stdout}"
    );

    let violation = plan("delete-checkpoint-then-kill-ps.toml");
    let output = cohort(
        &["chaos", "sim", "--plan", violation.to_str().unwrap()],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("delete-checkpoint-then-kill-ps.toml")
            && stderr.contains("cannot")
            && stderr.contains("fault["),
        "{stderr}"
    );
    // A task cut off from every other is the simulator's partition; loss between tasks for a
    // while it cannot model.
    let dir = temp_dir("sim-net");
    let partition = dir.join("partition.toml");
    std::fs::write(
        &partition,
        "seed = 4\n[[fault]]\nkind = \"partition\"\ntarget = \"worker:1\"\nat = \"2s\"\nfor = \"3s\"\n",
    )
    .unwrap();
    let output = cohort(
        &[
            "chaos",
            "sim",
            "--plan",
            partition.to_str().unwrap(),
            "--closures",
            "1000",
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Inject(Partition(Worker(1)"), "{stdout}");
    let loss = dir.join("loss.toml");
    std::fs::write(
        &loss,
        "seed = 4\n[[fault]]\nkind = \"loss\"\ntarget = \"worker:1\"\nprobability = 0.1\nat = \"2s\"\nfor = \"3s\"\n",
    )
    .unwrap();
    let output = cohort(&["chaos", "sim", "--plan", loss.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("loss.toml: fault[0].kind: the simulator cannot model loss"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A kill due while its task is being restarted (the launcher has not started its next
/// process yet) hits that next process, as soon as it is up, instead of being reported as
/// not applied.
#[test]
fn a_kill_due_while_its_task_restarts_hits_the_next_process() {
    let dir = temp_dir("kill-restarting");
    std::fs::create_dir_all(&dir).unwrap();
    let plan_path = dir.join("plan.toml");
    std::fs::write(
        &plan_path,
        "seed = 5\n\
         [[fault]]\nkind = \"kill\"\ntarget = \"worker:1\"\nat = \"100ms\"\nafter = \"first_checkpoint\"\n\
         [[fault]]\nkind = \"kill\"\ntarget = \"worker:1\"\nat = \"120ms\"\nafter = \"first_checkpoint\"\n",
    )
    .unwrap();
    let demo = [
        "--strategy",
        "multi-worker-mirrored",
        "--digits-epochs",
        "60",
    ];
    let (output, report, dir) = run_demo(&plan_path, dir, &demo, &[]);
    let why = describe(&output, &report);
    assert_eq!(output.status.code(), Some(0), "{why}");
    assert_eq!(report["verdict"], "passed", "{why}");
    assert_faults_applied(&report, &["kill", "kill"]);
    let faults = report["timeline"]["faults"].as_array().unwrap();
    assert_ne!(faults[0]["pid"], faults[1]["pid"], "{why}");
    assert!(
        faults[1]["detail"]
            .as_str()
            .unwrap()
            .contains("for the task's next process"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
