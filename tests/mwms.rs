//! MultiWorkerMirrored with real worker processes (`cohort mwms-member`) over QUIC on
//! 127.0.0.1, training the dense workload (`workloads::dense_sync`).
//!
//! - 2 workers × 2 replicas, a chief and a worker × 2 replicas, and 1 worker × 4 replicas end
//!   with the variables that 4 mirrored replicas and one replica in one process reach over the
//!   same global batches (to 1e-5), every worker of a run holding the same bits. Each worker
//!   seeds its initializers differently, so this also shows the first worker's initial values
//!   broadcast to all.
//! - A worker SIGKILLed mid-training: every survivor's step fails with `member-lost` naming it
//!   (the transport's idle timeout, 800 ms here, detects it), and exits; nothing hangs.
//! - An application error on one worker's replica (`--fail-worker 1 --fail-step 3`, an error
//!   or a panic): that worker exits with its own error, every other one with `kind=application` naming it and
//!   the message, before any worker's op timeout could end its wait.
//! - Elastic (`--elastic`): 3 workers × 2 replicas lose one to SIGKILL, 4 × 1 lose two at
//!   once; the survivors agree on the lost, the generation (2) and the completed step, re-form,
//!   finish the run with the same bits, and match a one-process replay whose global batch
//!   shrinks at that step (to 1e-5); so do the survivors of a second worker killed while they
//!   re-form (a later generation if it cut an attempt short). A worker SIGSTOPped past the budget is left out; back
//!   (SIGCONT), it learns the others re-formed without it and exits with a typed error.
//! - A worker lost while the job starts costs one re-forming at step 0: one that vanishes
//!   right after forming (worker 1 of 3 × 2 replicas, or worker 0, the broadcasts' root), and
//!   one killed while the others still form generation 1, its links with them cut (3 × 2 with one
//!   of them still forming, 4 × 1 with two).
//! - Quorum: of 2 workers, worker 0 trains on alone once worker 1 is killed (half of the group
//!   with the lowest rank). A partition in the network rules file (`COHORT_NET_FAULTS`) that
//!   cuts worker 0 off from the other two of 3, or worker 1 off from worker 0 of 2: the side
//!   with the quorum re-forms, finishes and matches the replay; the other fails with "no
//!   quorum" (exit 3), never re-forms, and completes no step beyond those the others agreed on.
//!   A cut between worker 0 and worker 2 of 3 (both still hear worker 1: every view has a
//!   quorum, and they differ) never makes two groups: one group per generation at most, the
//!   finishers (if any) are one group, every other worker fails with a typed error.
//! - A bad cluster or mismatched replica counts: exit code 2 naming the key; workers fusing
//!   different buckets are refused by key too.
//! - Two workers in one process (threads), 2 replicas each: global replica ids, all-reduce
//!   (one tensor, a list, MEAN), `reduce` and `gather` of uneven per-replica batches across the
//!   workers, one input pipeline per worker (auto-sharded, or from a function), and a
//!   variable created with a different initial value on each worker starting from the first
//!   worker's.

mod mwms_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use cohort::data::{Dataset, DistributeOptions};
use cohort::strategy::{
    DefaultStrategy, Mirrored, MultiWorkerMirrored, ReduceOp, Strategy, StrategyError, StrategyExt,
};
use cohort::variable::Variable;
use cohort::workloads::dense_sync::{self, DenseOutcome};
use cohort_transport::{ClusterCa, NodeId};
use mwms_support::in_process_pair;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Bound on every wait for a worker's line or exit.
const WAIT_MAX: Duration = Duration::from_secs(120);
const STEPS: usize = 8;
const GLOBAL_BATCH: usize = 16;

/// One worker process; killed (by its own PID) when the test ends either way.
struct Worker {
    child: Child,
}

impl Worker {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for the exit code, bounded.
    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {WAIT_MAX:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster of worker processes and the lines they print.
struct Cluster {
    workers: Vec<Worker>,
    lines: mpsc::Receiver<(usize, String)>,
    seen: Vec<Vec<String>>,
    dir: PathBuf,
    /// Each worker's collective endpoint address.
    addrs: Vec<String>,
    /// The network fault rules file every worker follows (`COHORT_NET_FAULTS`), if any.
    rules: Option<PathBuf>,
    /// Where each worker's output lines go.
    tx: mpsc::Sender<(usize, String)>,
    /// Each worker's `TF_CONFIG` and replicas.
    specs: Vec<(String, usize)>,
    /// The flags every worker gets.
    extra: Vec<String>,
    /// The cluster's CA (a worker added later gets its certificate from it).
    ca: ClusterCa,
    /// Every worker's `RUST_LOG`: none by default, so that what a worker prints is its
    /// event lines and errors alone.
    log: String,
}

impl Cluster {
    /// Starts one process per entry of `tasks` (`("chief" | "worker", replicas)`), each with
    /// `extra` flags.
    fn start(name: &str, tasks: &[(&str, usize)], extra: &[&str]) -> Cluster {
        Self::start_with(name, tasks, extra, false)
    }

    /// As [`Cluster::start`]; with `net_rules`, every worker binds its endpoint under one
    /// network fault rules file (none in it yet: see [`Cluster::cut_links`]).
    fn start_with(name: &str, tasks: &[(&str, usize)], extra: &[&str], net_rules: bool) -> Cluster {
        let mut cluster = Self::prepare(name, tasks, extra, net_rules);
        cluster.spawn_all();
        cluster
    }

    /// As [`Cluster::start_with`], without starting the workers yet ([`Cluster::spawn_all`]):
    /// so that network rules are in force from their first datagram.
    fn prepare(name: &str, tasks: &[(&str, usize)], extra: &[&str], net_rules: bool) -> Cluster {
        let dir = std::env::temp_dir().join(format!("cohort-mwms-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = ClusterCa::generate(name).unwrap();
        let mut jobs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut ids = Vec::new();
        let mut addrs = Vec::new();
        // Free ports: bound then released once all are picked (a port released at once
        // could be picked twice); the workers bind them right after.
        let mut held = Vec::new();
        for &(job, _) in tasks {
            let list = jobs.entry(job).or_default();
            let index = list.len();
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            list.push(socket.local_addr().unwrap().to_string());
            addrs.push(socket.local_addr().unwrap().to_string());
            held.push(socket);
            ca.issue(&NodeId::new(job, index as u32))
                .unwrap()
                .save(&dir)
                .unwrap();
            ids.push((job.to_string(), index));
        }
        drop(held);
        let cluster = serde_json::to_string(&jobs).unwrap();
        let rules = net_rules.then(|| dir.join("net-faults.rules"));
        let (tx, lines) = mpsc::channel();
        let specs = ids
            .iter()
            .zip(tasks)
            .map(|((job, index), (_, replicas))| {
                let tf_config = format!(
                    r#"{{"cluster": {cluster}, "task": {{"type": "{job}", "index": {index}}}}}"#
                );
                (tf_config, *replicas)
            })
            .collect();
        Cluster {
            workers: Vec::new(),
            lines,
            tx,
            seen: vec![Vec::new(); tasks.len()],
            dir,
            addrs,
            rules,
            specs,
            extra: extra.iter().map(ToString::to_string).collect(),
            ca,
            log: "off".into(),
        }
    }

    /// Starts every worker of the cluster's tasks.
    fn spawn_all(&mut self) {
        for i in self.workers.len()..self.specs.len() {
            let worker = self.spawn(i);
            self.workers.push(worker);
        }
    }

    /// Starts worker `i`'s process (its task, replicas and flags as at the start).
    fn spawn(&self, i: usize) -> Worker {
        let (tf_config, replicas) = &self.specs[i];
        let mut command = Command::new(env!("CARGO_BIN_EXE_cohort"));
        if let Some(rules) = &self.rules {
            command.env("COHORT_NET_FAULTS", rules);
        }
        let mut child = command
            .arg("mwms-member")
            .arg("--certs")
            .arg(&self.dir)
            .args(["--replicas", &replicas.to_string()])
            .arg("--out")
            .arg(self.dir.join(format!("out-{i}.json")))
            .args(&self.extra)
            .env("TF_CONFIG", tf_config)
            .env("RUST_LOG", &self.log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send((i, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Worker { child }
    }

    /// Starts a worker the others' cluster does not name (index `workers`, all-`"worker"`
    /// clusters only): its own `TF_CONFIG` lists every worker and itself, on a new port. It
    /// joins the live group. Returns its slot.
    fn add_worker(&mut self) -> usize {
        let index = self.addrs.len();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap().to_string();
        drop(socket);
        self.ca
            .issue(&NodeId::new("worker", index as u32))
            .unwrap()
            .save(&self.dir)
            .unwrap();
        self.addrs.push(addr);
        let cluster = serde_json::to_string(&BTreeMap::from([("worker", &self.addrs)])).unwrap();
        let tf_config =
            format!(r#"{{"cluster": {cluster}, "task": {{"type": "worker", "index": {index}}}}}"#);
        let replicas = self.specs[0].1;
        let slot = self.specs.len();
        self.specs.push((tf_config, replicas));
        self.seen.push(Vec::new());
        let worker = self.spawn(slot);
        self.workers.push(worker);
        slot
    }

    /// Starts worker `i` again (its old process gone): a new process of the same task, its
    /// replicas and flags, in a new slot (returned) so that its lines and output file are
    /// not mixed with the old process's.
    fn restart(&mut self, i: usize) -> usize {
        let slot = self.specs.len();
        self.specs.push(self.specs[i].clone());
        self.seen.push(Vec::new());
        let worker = self.spawn(slot);
        self.workers.push(worker);
        slot
    }

    /// Cuts the workers of `cut` off from every other worker (see [`Cluster::cut_links`]).
    fn partition(&self, cut: &[usize]) {
        let pairs: Vec<(usize, usize)> = cut
            .iter()
            .flat_map(|&c| {
                (0..self.addrs.len())
                    .filter(|o| !cut.contains(o))
                    .map(move |o| (c, o))
            })
            .collect();
        self.cut_links(&pairs);
    }

    /// Cuts the link of each pair of workers: a partition between them in the rules file
    /// (replaced at once: the workers see the new file whole, within the watcher's poll
    /// interval).
    fn cut_links(&self, pairs: &[(usize, usize)]) {
        let path = self.rules.as_ref().expect("started without network rules");
        let mut text = String::from("seed 1\n");
        for &(a, b) in pairs {
            text.push_str(&format!("partition {} {}\n", self.addrs[a], self.addrs[b]));
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// Waits until worker `i` prints a line containing `text`; returns it.
    fn wait_for(&mut self, i: usize, text: &str) -> String {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(line) = self.seen[i].iter().find(|l| l.contains(text)) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((from, line)) => self.seen[from].push(line),
                Err(_) => panic!(
                    "worker {i} printed no {text:?} within {WAIT_MAX:?}; it printed {:#?}",
                    self.seen[i]
                ),
            }
        }
    }

    /// Waits for every worker to exit with 0 and reads what each wrote.
    fn outcomes(&mut self) -> Vec<DenseOutcome> {
        let all: Vec<usize> = (0..self.workers.len()).collect();
        self.finish(&all)
    }

    /// Waits for each worker of `slots` to say "done" and exit with 0; reads what each wrote,
    /// in that order.
    /// Sends worker `i` `signal` (SIGTERM: preempted; SIGUSR1: drained), waits for it to
    /// print its departure and `left` and to exit with `code`; returns the departure line.
    fn signal_to_leave(&mut self, i: usize, signal: Signal, left: &str, code: i32) -> String {
        kill(self.workers[i].pid(), signal).unwrap();
        let departed = self.wait_for(i, "departed");
        self.wait_for(i, left);
        assert_eq!(self.workers[i].wait_exit(), code, "{:#?}", self.seen[i]);
        departed
    }

    fn finish(&mut self, slots: &[usize]) -> Vec<DenseOutcome> {
        for &i in slots {
            self.wait_for(i, "done");
            let code = self.workers[i].wait_exit();
            assert_eq!(code, 0, "worker {i}: {:#?}", self.seen[i]);
        }
        slots
            .iter()
            .map(|i| read_outcome(&self.dir.join(format!("out-{i}.json"))))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.workers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_outcome(path: &Path) -> DenseOutcome {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn assert_close(a: &DenseOutcome, b: &DenseOutcome, what: &str) {
    assert_eq!(
        a.variables.keys().collect::<Vec<_>>(),
        b.variables.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (name, va) in &a.variables {
        let vb = &b.variables[name];
        assert_eq!(va.len(), vb.len(), "{what}: {name}");
        for (k, (x, y)) in va.iter().zip(vb).enumerate() {
            assert!((x - y).abs() <= 1e-5, "{what}: {name}[{k}] is {x} vs {y}");
        }
    }
    for (k, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5,
            "{what}: loss of step {k} is {x} vs {y}"
        );
    }
}

#[test]
fn two_workers_of_two_replicas_train_what_four_replicas_in_one_process_do() {
    let steps = STEPS.to_string();
    let batch = GLOBAL_BATCH.to_string();
    let flags = ["--steps", steps.as_str(), "--global-batch", batch.as_str()];
    // In process: 4 mirrored replicas, and one replica, over the same global batches.
    let mirrored = dense_sync::train(&Mirrored::new(4).unwrap(), STEPS, GLOBAL_BATCH, 7).unwrap();
    let single = dense_sync::train(&DefaultStrategy::new(), STEPS, GLOBAL_BATCH, 7).unwrap();
    assert_close(&mirrored, &single, "Mirrored(4) vs one replica");
    assert!(
        single.losses.last().unwrap() < &single.losses[0],
        "the loss falls: {:?}",
        single.losses
    );
    let plain_flags = [flags.as_slice(), &["--plaintext"]].concat();
    for (name, tasks, flags) in [
        ("2x2", vec![("worker", 2), ("worker", 2)], flags.as_slice()),
        ("chief", vec![("chief", 2), ("worker", 2)], flags.as_slice()),
        ("1x4", vec![("worker", 4)], flags.as_slice()),
        // The same over the plaintext data plane (TCP): the same bits.
        (
            "2x2-tcp",
            vec![("worker", 2), ("worker", 2)],
            plain_flags.as_slice(),
        ),
    ] {
        let mut cluster = Cluster::start(name, &tasks, flags);
        let workers = tasks.len().to_string();
        for i in 0..tasks.len() {
            let formed = cluster.wait_for(i, "formed");
            assert!(
                formed.contains("generation=1") && formed.contains(&format!("workers={workers}")),
                "{name}: {formed}"
            );
        }
        let outs = cluster.outcomes();
        // Every worker of a run holds the same bits.
        for (i, out) in outs.iter().enumerate().skip(1) {
            assert_eq!(out, &outs[0], "{name}: worker {i} differs from worker 0");
        }
        assert_close(&outs[0], &mirrored, &format!("{name} vs Mirrored(4)"));
        assert_close(&outs[0], &single, &format!("{name} vs one replica"));
    }
}

/// The workload of `cohort bench mwms` (the MLP 784-256-256-10) trains across two worker
/// processes (a chief and a worker, 2 replicas each): each times its steps and ends with a
/// finite loss; a batch that does not split over the local replicas is refused.
#[test]
fn the_mwms_benchmark_workload_trains_across_processes() {
    let flags = ["--bench-batch", "8", "--bench-warmup", "1", "--steps", "3"];
    let mut cluster = Cluster::start("bench", &[("chief", 2), ("worker", 2)], &flags);
    for i in 0..2 {
        let line = cluster.wait_for(i, "bench ");
        assert!(line.starts_with("bench steps=3 seconds="), "{line}");
        let loss: f32 = line
            .rsplit("loss=")
            .next()
            .and_then(|l| l.parse().ok())
            .unwrap_or(f32::NAN);
        assert!(loss.is_finite() && loss > 0.0, "{line}");
        cluster.wait_for(i, "done");
        assert_eq!(cluster.workers[i].wait_exit(), 0, "{:#?}", cluster.seen[i]);
    }
    let odd = ["--bench-batch", "7", "--steps", "1"];
    let mut cluster = Cluster::start("bench-odd", &[("worker", 2)], &odd);
    let line = cluster.wait_for(0, "error ");
    assert!(
        line.contains("does not split over 2 local replicas"),
        "{line}"
    );
    assert_eq!(cluster.workers[0].wait_exit(), 3);
}

#[test]
fn a_worker_killed_mid_training_fails_every_survivor_naming_it() {
    let flags = [
        "--steps",
        "100000",
        "--step-pause-ms",
        "20",
        "--idle-timeout-ms",
        "800",
    ];
    let mut cluster = Cluster::start(
        "kill",
        &[("worker", 1), ("worker", 1), ("worker", 1)],
        &flags,
    );
    for i in 0..3 {
        cluster.wait_for(i, "step 3 ");
    }
    kill(cluster.workers[2].pid(), Signal::SIGKILL).unwrap();
    for i in 0..2 {
        let line = cluster.wait_for(i, "error");
        assert!(
            line.contains("kind=member-lost") && line.contains("node=worker/2"),
            "worker {i}: {line}"
        );
        assert_eq!(cluster.workers[i].wait_exit(), 3, "worker {i}");
    }
}

#[test]
fn an_application_error_on_one_worker_fails_every_worker_with_its_message() {
    application_error_case("apperr", &[]);
}

#[test]
fn a_panic_on_one_worker_fails_every_worker_with_its_message() {
    application_error_case("apppanic", &["--fail-panics"]);
}

/// Worker 1's first replica fails its step 3 (an error, or a panic with `extra`); the op
/// timeout (60 s) is far off, so only the failing worker's abort can end the others' step
/// with its message.
fn application_error_case(name: &str, extra: &[&str]) {
    let mut flags = vec![
        "--steps",
        "100000",
        "--step-pause-ms",
        "20",
        "--fail-worker",
        "1",
        "--fail-step",
        "3",
    ];
    flags.extend_from_slice(extra);
    let mut cluster = Cluster::start(name, &[("worker", 2), ("worker", 2), ("worker", 2)], &flags);
    for i in 0..3 {
        let line = cluster.wait_for(i, "error");
        assert!(
            line.contains("injected failure at step 3"),
            "worker {i}: {line}"
        );
        if i == 1 {
            // Its own error, not the group's report of it.
            assert!(line.contains("kind=other"), "worker {i}: {line}");
        } else {
            assert!(
                line.contains("kind=application") && line.contains("node=worker/1"),
                "worker {i}: {line}"
            );
        }
        assert_eq!(cluster.workers[i].wait_exit(), 3, "worker {i}");
        // No worker got past the failed step.
        assert!(
            !cluster.seen[i].iter().any(|l| l.starts_with("step 3 ")),
            "worker {i}: {:#?}",
            cluster.seen[i]
        );
    }
}

/// `name`: `workers` workers of `replicas` replicas train elastically with a global batch of
/// `per_replica` × every replica; the workers of `kill` are SIGKILLed at once mid-training;
/// the survivors must re-form, finish, hold the same bits, and match a one-process replay
/// with the global batch shrunk at the step they agreed on.
fn elastic_case(name: &str, workers: usize, replicas: usize, kill: &[usize]) {
    elastic_case_with(
        name,
        workers,
        replicas,
        kill,
        Duration::ZERO,
        Loss::Kill,
        &[],
    );
}

/// How the workers of an elastic case are lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// SIGKILL.
    Kill,
    /// Cut off from every other worker by a partition in the network rules file (all at
    /// once, the cut ones still hearing each other): alive, they must not go on as a group
    /// of their own. Each must fail with no quorum and complete no step beyond those the
    /// others agreed on.
    Partition,
}

/// As [`elastic_case`], the workers of `kill` lost by `how`, `apart` one after the other.
fn elastic_case_with(
    name: &str,
    workers: usize,
    replicas: usize,
    kill: &[usize],
    apart: Duration,
    how: Loss,
    extra: &[&str],
) {
    const STEPS: usize = 30;
    let per_replica = 2;
    let global = per_replica * replicas * workers;
    let (steps, batch) = (STEPS.to_string(), global.to_string());
    let flags = elastic_flags(&steps, &batch, extra);
    let tasks = vec![("worker", replicas); workers];
    let mut cluster = Cluster::start_with(name, &tasks, &flags, how == Loss::Partition);
    for i in 0..workers {
        cluster.wait_for(i, "step 4 ");
    }
    match how {
        Loss::Kill => {
            for (n, &k) in kill.iter().enumerate() {
                if n > 0 {
                    std::thread::sleep(apart);
                }
                kill_worker(&cluster, k);
            }
        }
        Loss::Partition => cluster.partition(kill),
    }
    let survivors: Vec<usize> = (0..workers).filter(|i| !kill.contains(i)).collect();
    let outs = cluster.finish(&survivors);
    // Every survivor went through the same re-formings: (generation, step, position, workers).
    let recoveries = |i: usize| -> Vec<(usize, usize, usize, usize, String)> {
        cluster.seen[i]
            .iter()
            .filter(|l| l.starts_with("recovered"))
            .map(|l| {
                let lost = l.split_whitespace().find_map(|w| w.strip_prefix("lost="));
                let fields = ["generation", "step", "position", "workers"].map(|k| field(l, k));
                (
                    fields[0],
                    fields[1],
                    fields[2],
                    fields[3],
                    lost.unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    let seen = recoveries(survivors[0]);
    for &i in &survivors[1..] {
        assert_eq!(
            recoveries(i),
            seen,
            "{name}: worker {i} re-formed otherwise"
        );
    }
    // Killed at once: one re-forming at generation 2; apart, maybe more, or a later generation where a
    // second loss cut an attempt short. Either way every lost worker is left out, once.
    eprintln!("{name}: re-formings (generation, step, position, workers, lost): {seen:?}");
    assert!(!seen.is_empty(), "{name}: no re-forming");
    if apart.is_zero() {
        assert_eq!((seen.len(), seen[0].0), (1, 2), "{name}: {seen:?}");
    }
    let mut lost: Vec<&str> = seen.iter().flat_map(|r| r.4.split(',')).collect();
    lost.sort_unstable();
    let mut expected: Vec<String> = kill.iter().map(|k| format!("worker/{k}")).collect();
    expected.sort_unstable();
    assert_eq!(lost, expected, "{name}: {seen:?}");
    assert_eq!(seen.last().unwrap().3, survivors.len(), "{name}: {seen:?}");
    // The replay: the global batch of each group from the step it re-formed at, the input
    // going on where the previous group stopped.
    let mut schedule = Vec::new();
    let (mut from, mut batch, mut position) = (0, global, 0);
    for &(_, step, at, group, _) in &seen {
        assert!(step >= from && step >= 4, "{name}: {seen:?}");
        position += (step - from) * batch;
        assert_eq!(at, position, "{name}: {seen:?}");
        schedule.push((step - from, batch));
        (from, batch) = (step, per_replica * replicas * group);
    }
    assert!(from < STEPS, "{name}: {seen:?}");
    schedule.push((STEPS - from, batch));
    for (k, out) in outs.iter().enumerate().skip(1) {
        assert_eq!(
            out.variables, outs[0].variables,
            "{name}: survivor {k} holds other bits than survivor 0"
        );
    }
    let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
    assert_eq!(outs[0].losses.len(), STEPS, "{name}");
    let missing = outs[0].losses.iter().filter(|l| l.is_nan()).count();
    assert!(missing <= seen.len(), "{name}: losses {:?}", outs[0].losses);
    let mut known = outs[0].clone();
    let mut reference = replay.clone();
    let kept: Vec<usize> = (0..STEPS).filter(|&k| !known.losses[k].is_nan()).collect();
    known.losses = kept.iter().map(|&k| known.losses[k]).collect();
    reference.losses = kept.iter().map(|&k| reference.losses[k]).collect();
    assert_close(&known, &reference, &format!("{name} vs the replay"));
    if how == Loss::Partition {
        // The first re-forming's step: what the others had completed when they lost it.
        let agreed = seen[0].1;
        let mut side = kill.to_vec();
        side.sort_unstable();
        let side: Vec<String> = side.iter().map(|c| format!("worker/{c}")).collect();
        for &c in kill {
            let line = cluster.wait_for(c, "error");
            let reached = format!(
                "reached {} of the {workers} members of generation 1 ({})",
                side.len(),
                side.join(", ")
            );
            assert!(
                line.contains("kind=recovery")
                    && line.contains("no quorum")
                    && line.contains(&reached),
                "{name}: worker {c}: {line}"
            );
            assert_eq!(cluster.workers[c].wait_exit(), 3, "{name}: worker {c}");
            let lines = &cluster.seen[c];
            assert!(
                !lines
                    .iter()
                    .any(|l| l.starts_with("recovered") || l.starts_with("done")),
                "{name}: worker {c} went on alone: {lines:#?}"
            );
            // Step lines count from 0: the step the others agreed on is the first they did
            // not all complete, which a ring may have completed here (and no later one).
            let last = lines
                .iter()
                .filter_map(|l| l.strip_prefix("step "))
                .filter_map(|l| l.split_whitespace().next()?.parse::<usize>().ok())
                .max();
            assert!(
                last.is_some_and(|k| k <= agreed),
                "{name}: worker {c} completed steps after the cut (the others agreed on \
                 {agreed}): {lines:#?}"
            );
        }
    }
}

/// A fresh checkpoint directory for the test `name`, and its path as a flag value.
fn checkpoint_dir(name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("cohort-mwms-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = dir.display().to_string();
    (dir, text)
}

/// The flags of an elastic run of `steps` steps of `batch` examples (one step each 60 ms, the
/// idle and form timeouts the elastic tests share), then `more`.
fn elastic_flags<'a>(steps: &'a str, batch: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec![
        "--elastic",
        "--steps",
        steps,
        "--global-batch",
        batch,
        "--step-pause-ms",
        "60",
        "--idle-timeout-ms",
        "800",
        "--form-timeout-ms",
        "5000",
    ];
    flags.extend_from_slice(more);
    flags
}

fn kill_worker(cluster: &Cluster, k: usize) {
    kill(cluster.workers[k].pid(), Signal::SIGKILL).unwrap();
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> usize {
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

/// A change of the group an elastic worker printed: `recovered` or `admitted`, with the
/// generation, the agreed step and position, and the workers of the new group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    kind: String,
    generation: usize,
    step: usize,
    position: usize,
    workers: usize,
}

/// The group changes worker `i` printed, in order.
fn changes(cluster: &Cluster, i: usize) -> Vec<Change> {
    cluster.seen[i]
        .iter()
        .filter(|l| {
            l.starts_with("recovered") || l.starts_with("admitted") || l.starts_with("departed")
        })
        .map(|l| Change {
            kind: l.split_whitespace().next().unwrap_or("").to_string(),
            generation: field(l, "generation"),
            step: field(l, "step"),
            position: field(l, "position"),
            workers: field(l, "workers"),
        })
        .collect()
}

/// A worker killed mid-training and started again (after `restart_after`) joins the live
/// group: the survivors re-form without it, admit it at a step boundary, and all finish with
/// the same bits, matching a one-process replay whose global batch shrinks and grows back
/// at the steps they agreed on.
fn rejoin_case(name: &str, workers: usize, killed: usize, restart_after: Duration) {
    const STEPS: usize = 40;
    let (replicas, per_replica) = (1, 2);
    let global = per_replica * replicas * workers;
    let (steps, batch) = (STEPS.to_string(), global.to_string());
    let flags = elastic_flags(&steps, &batch, &[]);
    let tasks = vec![("worker", replicas); workers];
    let mut cluster = Cluster::start(name, &tasks, &flags);
    for i in 0..workers {
        cluster.wait_for(i, "step 4 ");
    }
    kill_worker(&cluster, killed);
    assert_eq!(cluster.workers[killed].wait_exit(), -1, "{name}: killed");
    std::thread::sleep(restart_after);
    let joiner = cluster.restart(killed);
    let admitted = cluster.wait_for(joiner, "admitted");
    assert!(
        admitted.contains(&format!("joined=worker/{killed}")),
        "{name}: {admitted}"
    );
    let finishers: Vec<usize> = (0..workers)
        .filter(|&i| i != killed)
        .chain([joiner])
        .collect();
    let outs = cluster.finish(&finishers);
    let seen = changes(&cluster, finishers[0]);
    eprintln!("{name}: group changes {seen:?}");
    for &i in &finishers[1..workers - 1] {
        assert_eq!(
            changes(&cluster, i),
            seen,
            "{name}: survivor {i} changed otherwise"
        );
    }
    // The survivors re-formed without the killed worker, then admitted it back.
    let first_admission = seen
        .iter()
        .position(|c| c.kind == "admitted")
        .unwrap_or_else(|| panic!("{name}: the survivors admitted nobody: {seen:?}"));
    assert!(
        seen[..first_admission]
            .iter()
            .any(|c| c.kind == "recovered" && c.workers == workers - 1),
        "{name}: {seen:?}"
    );
    let last = seen.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.workers),
        ("admitted", workers),
        "{name}: {seen:?}"
    );
    // The joiner's own admission is the survivors' last change, and it saw no other.
    assert_eq!(changes(&cluster, joiner), vec![last.clone()], "{name}");
    for (k, out) in outs.iter().enumerate().skip(1) {
        assert_eq!(
            out.variables, outs[0].variables,
            "{name}: finisher {k} holds other bits than finisher 0"
        );
    }
    // The replay: each group's global batch from the step it formed at.
    let mut schedule = Vec::new();
    let (mut from, mut batch, mut position) = (0, global, 0);
    for change in &seen {
        assert!(change.step >= from, "{name}: {seen:?}");
        position += (change.step - from) * batch;
        assert_eq!(change.position, position, "{name}: {seen:?}");
        schedule.push((change.step - from, batch));
        (from, batch) = (change.step, per_replica * replicas * change.workers);
    }
    schedule.push((STEPS - from, batch));
    let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
    let mut known = outs[0].clone();
    let mut reference = replay;
    let kept: Vec<usize> = (0..STEPS).filter(|&k| !known.losses[k].is_nan()).collect();
    known.losses = kept.iter().map(|&k| known.losses[k]).collect();
    reference.losses = kept.iter().map(|&k| reference.losses[k]).collect();
    assert_close(&known, &reference, &format!("{name} vs the replay"));
    // The joiner computed the steps after it joined, with everyone.
    let joined_losses = &outs[outs.len() - 1].losses;
    assert!(
        joined_losses[last.step..].iter().all(|l| !l.is_nan()),
        "{name}: {joined_losses:?}"
    );
}

/// A worker the job was not started with (the others' cluster does not name it) joins the
/// live group at a step boundary: the global batch grows from there, every worker ends with
/// the same bits, matching a one-process replay of the two batch sizes.
#[test]
fn a_worker_added_to_a_running_job_is_admitted_and_the_global_batch_grows() {
    const STEPS: usize = 40;
    let (workers, per_replica) = (2, 2);
    let global = per_replica * workers;
    let (steps, batch) = (STEPS.to_string(), global.to_string());
    let flags = elastic_flags(&steps, &batch, &[]);
    let mut cluster = Cluster::start("grow", &[("worker", 1), ("worker", 1)], &flags);
    for i in 0..workers {
        cluster.wait_for(i, "step 4 ");
    }
    // Its --global-batch (the starting one of 2 workers) divides over its admitted 3 replicas
    // only by the per-replica batch: it is given the 3-worker batch.
    let grown = (per_replica * 3).to_string();
    cluster.extra = flags
        .iter()
        .map(|f| {
            if *f == batch.as_str() {
                grown.clone()
            } else {
                f.to_string()
            }
        })
        .collect();
    let added = cluster.add_worker();
    let admitted = cluster.wait_for(added, "admitted");
    assert!(
        admitted.contains("joined=worker/2") && admitted.contains("workers=3"),
        "{admitted}"
    );
    let outs = cluster.finish(&[0, 1, added]);
    let seen = changes(&cluster, 0);
    assert_eq!(changes(&cluster, 1), seen);
    assert_eq!(seen.len(), 1, "{seen:?}");
    let grew = &seen[0];
    assert_eq!(
        (grew.kind.as_str(), grew.generation, grew.workers),
        ("admitted", 2, 3)
    );
    assert_eq!(changes(&cluster, added), seen);
    for out in &outs[1..] {
        assert_eq!(out.variables, outs[0].variables);
    }
    let schedule = [(grew.step, global), (STEPS - grew.step, per_replica * 3)];
    assert_eq!(grew.position, grew.step * global);
    let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
    assert_close(&outs[0], &replay, "grown vs the replay");
}

#[test]
fn a_killed_worker_started_again_at_once_rejoins_the_survivors() {
    // Its new process asks to join before the others noticed the old one's death: that ask
    // is the evidence that fails their group at once.
    rejoin_case("rejoin-now", 3, 2, Duration::ZERO);
}

#[test]
fn a_killed_leader_started_again_after_the_survivors_re_formed_rejoins_them() {
    // Worker 0 (the leader) is lost: worker 1 leads the survivors, and admits it back.
    rejoin_case("rejoin-late", 3, 0, Duration::from_secs(3));
}

/// A worker sent SIGTERM (a preemption notice) mid-training: every worker agrees on one
/// step, the chief saves its checkpoint, the preempted worker leaves (exit 143) and the
/// others re-form without it at once and go on; started again, it is admitted back. All
/// finish with the same bits, matching a one-process replay of the batch sizes they agreed
/// on, and the checkpoint of the agreed step holds what training had reached there.
fn preemption_case(name: &str, workers: usize, preempted: usize) {
    const STEPS: usize = 40;
    let per_replica = 2;
    let global = per_replica * workers;
    let (steps, batch) = (STEPS.to_string(), global.to_string());
    let (dir, checkpoints) = checkpoint_dir(name);
    let flags = elastic_flags(&steps, &batch, &["--checkpoint-dir", checkpoints.as_str()]);
    let tasks = vec![("worker", 1); workers];
    let mut cluster = Cluster::start(name, &tasks, &flags);
    for i in 0..workers {
        cluster.wait_for(i, "step 4 ");
    }
    let departed = cluster.signal_to_leave(preempted, Signal::SIGTERM, "left", 143);
    assert!(
        departed.contains(&format!("left=worker/{preempted}")) && departed.contains("saved=true"),
        "{name}: {departed}"
    );
    let agreed = field(&departed, "step");
    // The preempted worker completed exactly the agreed steps: none after its notice's step.
    let last_step = cluster.seen[preempted]
        .iter()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split_whitespace().next()?.parse::<usize>().ok())
        .max();
    assert_eq!(last_step, Some(agreed - 1), "{name}: {departed}");
    let ckpt = dir.join(format!("ckpt-{agreed}"));
    assert!(
        ckpt.join("manifest.json").exists(),
        "{name}: no {}",
        ckpt.display()
    );
    let joiner = cluster.restart(preempted);
    cluster.wait_for(joiner, "admitted");
    let finishers: Vec<usize> = (0..workers)
        .filter(|&i| i != preempted)
        .chain([joiner])
        .collect();
    let outs = cluster.finish(&finishers);
    let seen = changes(&cluster, finishers[0]);
    eprintln!("{name}: group changes {seen:?}");
    for &i in &finishers[1..workers - 1] {
        assert_eq!(
            changes(&cluster, i),
            seen,
            "{name}: worker {i} changed otherwise"
        );
    }
    assert_eq!(seen[0].kind, "departed", "{name}: {seen:?}");
    assert_eq!(
        (seen[0].generation, seen[0].step, seen[0].workers),
        (2, agreed, workers - 1)
    );
    assert!(
        !seen.iter().any(|c| c.kind == "recovered"),
        "{name}: a departure is no failure: {seen:?}"
    );
    for out in &outs[1..] {
        assert_eq!(out.variables, outs[0].variables, "{name}");
    }
    let mut schedule = Vec::new();
    let (mut from, mut batch, mut position) = (0, global, 0);
    for change in &seen {
        position += (change.step - from) * batch;
        assert_eq!(change.position, position, "{name}: {seen:?}");
        schedule.push((change.step - from, batch));
        (from, batch) = (change.step, per_replica * change.workers);
    }
    schedule.push((STEPS - from, batch));
    let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
    let mut known = outs[0].clone();
    let mut reference = replay;
    let kept: Vec<usize> = (0..STEPS).filter(|&k| !known.losses[k].is_nan()).collect();
    known.losses = kept.iter().map(|&k| known.losses[k]).collect();
    reference.losses = kept.iter().map(|&k| reference.losses[k]).collect();
    assert_close(&known, &reference, &format!("{name} vs the replay"));
    // The checkpoint holds the variables of the agreed step (the replay stopped there), its
    // position, and the optimizer's slots.
    let at_cut = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule[..1], 7).unwrap();
    let loaded = cohort::checkpoint::read_checkpoint(&ckpt).unwrap();
    assert_eq!(loaded.checkpoint.step, agreed as u64);
    assert_eq!(
        loaded.checkpoint.dataset_positions[&0],
        (agreed * global) as u64
    );
    let tensors = cohort::checkpoint::whole_tensors(&loaded.checkpoint, true).unwrap();
    for (name, expected) in &at_cut.variables {
        let got = tensors[name.as_str()].to_f32().unwrap();
        for (k, (x, y)) in got.iter().zip(expected).enumerate() {
            assert!((x - y).abs() <= 1e-5, "{name}: checkpoint [{k}] {x} vs {y}");
        }
        assert!(
            tensors
                .keys()
                .any(|t| t.starts_with(name.as_str()) && t != name),
            "{name}: no slot"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_preempted_worker_leaves_at_an_agreed_step_after_the_chief_saves_and_comes_back() {
    preemption_case("preempt-w2", 3, 2);
}

#[test]
fn a_preempted_chief_saves_and_leaves_and_the_others_go_on() {
    // Worker 0 ranks first: it is the one that saves, then it leaves; worker 1 leads on.
    preemption_case("preempt-w0", 3, 0);
}

/// A worker sent SIGUSR1 (drained: what `cohort scale` sends to scale a job down) leaves at
/// an agreed step boundary for good: the chief writes no checkpoint for it (the others hold
/// the state), it exits 0, and the others re-form without it by agreement (no failure to
/// detect) and finish with the same bits, matching a one-process replay whose global batch
/// shrinks at the agreed step.
#[test]
fn a_drained_worker_leaves_at_an_agreed_step_without_a_checkpoint_and_exits_0() {
    const STEPS: usize = 40;
    let (name, workers, drained, per_replica) = ("drain-w1", 3, 1, 2);
    let global = per_replica * workers;
    let (steps, batch) = (STEPS.to_string(), global.to_string());
    let (dir, checkpoints) = checkpoint_dir(name);
    let flags = elastic_flags(&steps, &batch, &["--checkpoint-dir", checkpoints.as_str()]);
    let tasks = vec![("worker", 1); workers];
    let mut cluster = Cluster::start(name, &tasks, &flags);
    for i in 0..workers {
        cluster.wait_for(i, "step 4 ");
    }
    let departed = cluster.signal_to_leave(drained, Signal::SIGUSR1, "left drained", 0);
    assert!(
        departed.contains(&format!("left=worker/{drained} "))
            && departed.contains(&format!("drained=worker/{drained} "))
            && departed.contains("saved=false"),
        "{name}: {departed}"
    );
    let agreed = field(&departed, "step");
    let last_step = cluster.seen[drained]
        .iter()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split_whitespace().next()?.parse::<usize>().ok())
        .max();
    assert_eq!(last_step, Some(agreed - 1), "{name}: {departed}");
    let finishers: Vec<usize> = (0..workers).filter(|&i| i != drained).collect();
    let outs = cluster.finish(&finishers);
    let seen = changes(&cluster, finishers[0]);
    assert_eq!(changes(&cluster, finishers[1]), seen, "{name}");
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    assert_eq!(
        (
            seen[0].kind.as_str(),
            seen[0].generation,
            seen[0].step,
            seen[0].workers
        ),
        ("departed", 2, agreed, workers - 1),
        "{name}"
    );
    assert_eq!(seen[0].position, agreed * global, "{name}");
    assert_eq!(outs[1].variables, outs[0].variables, "{name}");
    let schedule = [
        (agreed, global),
        (STEPS - agreed, per_replica * (workers - 1)),
    ];
    let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
    assert_close(&outs[0], &replay, &format!("{name} vs the replay"));
    // Nothing was saved: a drain needs no checkpoint.
    let written: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ckpt-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(written.is_empty(), "{name}: {written:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every member gone while a restarted process waits to be admitted: worker 0 is killed and
/// started again at once (its new process finds the group live and waits to be admitted)
/// while workers 1 and 2 are preempted together (they re-form without worker 0, then both
/// leave at one step, after the chief saves it: no group lives any more). Worker 1 started
/// again finds no live group and forms the first generation; the waiting worker 0 refuses that
/// (it was not admitted to it) until it sees that no one has a live group, so worker 1
/// tries again rather than failing, and once worker 2 is back all three start afresh from
/// the checkpoint and finish with one model.
#[test]
fn a_fresh_start_refused_by_a_process_still_waiting_to_be_admitted_is_tried_again() {
    const STEPS: usize = 60;
    let name = "fresh-after-waiter";
    let (dir, checkpoints) = checkpoint_dir(name);
    let steps = STEPS.to_string();
    let flags = elastic_flags(&steps, "6", &["--checkpoint-dir", checkpoints.as_str()]);
    let mut cluster = Cluster::start(name, &[("worker", 1); 3], &flags);
    for i in 0..3 {
        cluster.wait_for(i, "step 4 ");
    }
    kill(cluster.workers[0].pid(), Signal::SIGKILL).unwrap();
    kill(cluster.workers[1].pid(), Signal::SIGTERM).unwrap();
    kill(cluster.workers[2].pid(), Signal::SIGTERM).unwrap();
    let waiter = cluster.restart(0);
    for i in [1, 2] {
        cluster.wait_for(i, "left");
        assert_eq!(
            cluster.workers[i].wait_exit(),
            143,
            "{:#?}",
            cluster.seen[i]
        );
    }
    let first = cluster.restart(1);
    // Long enough for worker 1's fresh start to be refused by the waiting worker 0.
    std::thread::sleep(Duration::from_millis(1500));
    let last = cluster.restart(2);
    let outs = cluster.finish(&[waiter, first, last]);
    for out in &outs[1..] {
        assert_eq!(out.variables, outs[0].variables);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job stopped whole (every worker SIGKILLed) and started again from its checkpoint
/// directory: the chief restores the newest checkpoint, every worker takes it, and the run
/// ends with the variables of a run never stopped.
#[test]
fn a_job_started_again_resumes_every_worker_from_the_chiefs_newest_checkpoint() {
    resume_case("resume", None);
}

#[test]
fn a_worker_lost_while_a_started_job_agrees_on_its_checkpoint_leaves_the_others_resuming() {
    resume_case("resume-lost", Some(1));
}

/// 2 workers train with checkpoints and are killed after step 10; the job starts again from
/// the chief's newest checkpoint, every worker resuming there. With `vanish`, it starts again
/// with a third worker, and that worker SIGKILLs itself right after forming: the others lose
/// it while the chief gives them the restored state, re-form, and still resume from it.
fn resume_case(name: &str, vanish: Option<usize>) {
    const STEPS: usize = 30;
    let workers = 2;
    let global = 2 * workers;
    let dir = std::env::temp_dir().join(format!("cohort-mwms-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (steps, batch, checkpoints) = (
        STEPS.to_string(),
        global.to_string(),
        dir.display().to_string(),
    );
    let flags = [
        "--elastic",
        "--steps",
        steps.as_str(),
        "--global-batch",
        batch.as_str(),
        "--step-pause-ms",
        "60",
        "--checkpoint-dir",
        checkpoints.as_str(),
        "--checkpoint-every",
        "5",
    ];
    let tasks = vec![("worker", 1); workers];
    let mut first = Cluster::start(&format!("{name}-a"), &tasks, &flags);
    first.wait_for(0, "saved step=10 ");
    for i in 0..workers {
        kill_worker(&first, i);
    }
    drop(first);
    let outs = match vanish {
        None => {
            let mut second = Cluster::start(&format!("{name}-b"), &tasks, &flags);
            let outs = second.outcomes();
            (second.seen[0].clone(), outs)
        }
        Some(k) => {
            // The same per-replica batch: the survivors' global batch is the first job's.
            let (k_flag, three) = (k.to_string(), (2 * (workers + 1)).to_string());
            let mut flags = flags.to_vec();
            flags[4] = three.as_str();
            flags.extend([
                "--idle-timeout-ms",
                "800",
                "--vanish-worker",
                k_flag.as_str(),
            ]);
            let tasks = vec![("worker", 1); workers + 1];
            let mut second = Cluster::start(&format!("{name}-b"), &tasks, &flags);
            let survivors: Vec<usize> = (0..=workers).filter(|&i| i != k).collect();
            let outs = second.finish(&survivors);
            for &i in &survivors {
                let recovered = second.wait_for(i, "recovered");
                assert!(
                    recovered.contains(&format!("lost=worker/{k} ")),
                    "{recovered}"
                );
            }
            (second.seen[0].clone(), outs)
        }
    };
    let (chief_lines, outs) = outs;
    let restored = chief_lines
        .iter()
        .find(|l| l.starts_with("restored"))
        .unwrap_or_else(|| panic!("{name}: worker 0 restored nothing: {chief_lines:#?}"));
    let from = field(restored, "step");
    assert!((10..STEPS).contains(&from), "{restored}");
    assert_eq!(outs[0].variables, outs[1].variables);
    // No step before the checkpoint was trained again: their losses are unknown here.
    assert!(outs[0].losses[..from].iter().all(|l| l.is_nan()));
    assert!(outs[0].losses[from..].iter().all(|l| !l.is_nan()));
    let replay =
        dense_sync::train_schedule(&DefaultStrategy::new(), &[(STEPS, global)], 7).unwrap();
    let mut known = outs[0].clone();
    let mut reference = replay;
    known.losses = known.losses[from..].to_vec();
    reference.losses = reference.losses[from..].to_vec();
    assert_close(
        &known,
        &reference,
        &format!("{name}: resumed vs a run never stopped"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn survivors_of_a_killed_worker_re_form_and_train_on_to_the_replayed_variables() {
    elastic_case("elastic1", 3, 2, &[2]);
}

#[test]
fn survivors_of_two_workers_killed_at_once_re_form_and_train_on() {
    elastic_case("elastic2", 4, 1, &[1, 3]);
}

#[test]
fn a_second_worker_lost_while_the_survivors_re_form_is_left_out_too() {
    // Killed about when the others have noticed the first loss and probe or form: wherever
    // it lands, the survivors end at one agreed group, state and result.
    elastic_case_with(
        "elastic3",
        4,
        1,
        &[3, 2],
        Duration::from_millis(1200),
        Loss::Kill,
        &[],
    );
}

/// How a worker is lost while the job starts ([`setup_loss_case`]).
#[derive(Debug, Clone, Copy)]
enum SetupLoss {
    /// It SIGKILLs itself right after the group formed, before making its model
    /// (`--vanish-worker`): the others lose it while they compare settings, broadcast the
    /// first worker's initial variables or take the first step.
    AfterForming,
    /// Its links with the workers of `cut` never come up (a partition from its first
    /// datagram), and it is SIGKILLed once worker 0 formed the group (their link up): the
    /// workers of `cut` lose it while still forming.
    WhileForming { cut: &'static [usize] },
}

/// Worker `vanish` of `workers` (of `replicas` each) is lost while the job starts (`how`).
/// That costs one re-forming at step 0, not the job: every survivor finishes with the same
/// bits, and, where worker 0 survives (its initial values are the model's), with a run of
/// the survivors' global batch from the start.
fn setup_loss_case(name: &str, workers: usize, replicas: usize, vanish: usize, how: SetupLoss) {
    const STEPS: usize = 12;
    let per_replica = 2;
    let global = per_replica * replicas * workers;
    let (steps, batch, vanish_flag) = (STEPS.to_string(), global.to_string(), vanish.to_string());
    let flags = [
        "--elastic",
        "--steps",
        steps.as_str(),
        "--global-batch",
        batch.as_str(),
        "--idle-timeout-ms",
        "800",
        "--form-timeout-ms",
        "5000",
        "--vanish-worker",
        vanish_flag.as_str(),
    ];
    let tasks = vec![("worker", replicas); workers];
    let mut cluster = match how {
        SetupLoss::AfterForming => {
            let mut cluster = Cluster::start(name, &tasks, &flags);
            cluster.wait_for(vanish, "formed");
            cluster
        }
        SetupLoss::WhileForming { cut } => {
            // Never formed, it never vanishes by itself: it is killed.
            let flags = &flags[..flags.len() - 2];
            let mut cluster = Cluster::prepare(name, &tasks, flags, true);
            let pairs: Vec<(usize, usize)> = cut.iter().map(|&c| (vanish, c)).collect();
            cluster.cut_links(&pairs);
            cluster.log = "warn,cohort::collective::group=debug".into();
            cluster.spawn_all();
            cluster.wait_for(0, "formed a group");
            kill_worker(&cluster, vanish);
            cluster
        }
    };
    assert_ne!(
        cluster.workers[vanish].wait_exit(),
        0,
        "{name}: worker {vanish} lived"
    );
    let survivors: Vec<usize> = (0..workers).filter(|&i| i != vanish).collect();
    let outs = cluster.finish(&survivors);
    for &i in &survivors {
        let recovered: Vec<&String> = cluster.seen[i]
            .iter()
            .filter(|l| l.starts_with("recovered"))
            .collect();
        let expected = format!(
            "recovered generation=2 step=0 position=0 workers={} lost=worker/{vanish} ",
            survivors.len()
        );
        assert!(
            recovered.len() == 1 && recovered[0].starts_with(&expected),
            "{name}: worker {i}: {:#?}",
            cluster.seen[i]
        );
    }
    for (k, out) in outs.iter().enumerate().skip(1) {
        assert_eq!(
            out.variables, outs[0].variables,
            "{name}: survivor {} holds other bits than survivor {}",
            survivors[k], survivors[0]
        );
    }
    assert_eq!(outs[0].losses.len(), STEPS, "{name}");
    if vanish != 0 {
        let schedule = [(STEPS, per_replica * replicas * survivors.len())];
        let replay = dense_sync::train_schedule(&DefaultStrategy::new(), &schedule, 7).unwrap();
        assert_close(&outs[0], &replay, &format!("{name} vs the replay"));
    }
}

#[test]
fn a_worker_lost_before_the_first_step_costs_a_re_forming_not_the_job() {
    setup_loss_case("setup-loss", 3, 2, 1, SetupLoss::AfterForming);
}

#[test]
fn the_first_worker_lost_before_the_first_step_leaves_the_others_one_model() {
    setup_loss_case("setup-loss0", 3, 1, 0, SetupLoss::AfterForming);
}

#[test]
fn a_worker_lost_while_the_others_still_form_leaves_them_re_forming_together() {
    let how = SetupLoss::WhileForming { cut: &[1] };
    setup_loss_case("forming-loss", 3, 2, 2, how);
}

#[test]
fn two_workers_cut_short_while_forming_re_form_with_the_one_that_formed() {
    let how = SetupLoss::WhileForming { cut: &[1, 2] };
    setup_loss_case("forming-loss4", 4, 1, 3, how);
}

#[test]
fn survivors_of_a_killed_worker_re_form_over_the_plaintext_plane() {
    // The killed worker's TCP links end with its process: the survivors learn it from them.
    elastic_case_with(
        "elastic-tcp",
        3,
        1,
        &[1],
        Duration::ZERO,
        Loss::Kill,
        &["--plaintext"],
    );
}

#[test]
fn of_two_workers_worker_0_trains_on_alone_when_worker_1_is_killed() {
    // Exactly half of the group is left, and it holds the lowest rank: the tie-break.
    elastic_case("pair-kill", 2, 1, &[1]);
}

#[test]
fn a_worker_cut_off_from_the_other_two_stops_while_they_re_form_and_finish() {
    // Worker 0, the lowest rank, alone against two: the majority goes on without it.
    elastic_case_with("cut3", 3, 1, &[0], Duration::ZERO, Loss::Partition, &[]);
}

#[test]
fn of_two_workers_split_by_a_partition_worker_0_goes_on_and_worker_1_stops() {
    elastic_case_with("cut2", 2, 1, &[1], Duration::ZERO, Loss::Partition, &[]);
}

#[test]
fn a_cut_between_two_of_three_workers_never_makes_two_groups() {
    // Worker 0 and worker 2 no longer hear each other; worker 1 hears both. Each view has a
    // quorum (0: {0, 1}; 2: {1, 2}; 1: all three), so only forming's agreement on the list
    // keeps them from splitting: whatever group forms, it is one, and no worker outside it
    // trains on.
    let flags = [
        "--elastic",
        "--steps",
        "30",
        "--global-batch",
        "6",
        "--step-pause-ms",
        "60",
        "--idle-timeout-ms",
        "800",
        "--form-timeout-ms",
        "3000",
    ];
    let tasks = [("worker", 1); 3];
    let mut cluster = Cluster::start_with("cut-link", &tasks, &flags, true);
    for i in 0..3 {
        cluster.wait_for(i, "step 4 ");
    }
    cluster.cut_links(&[(0, 2)]);
    let mut codes = Vec::new();
    for i in 0..3 {
        let code = cluster.workers[i].wait_exit();
        // Its last line.
        let end = if code == 0 { "done" } else { "error" };
        cluster.wait_for(i, end);
        codes.push(code);
    }
    // Each worker's re-formings as (generation, workers, lost).
    let groups: Vec<Vec<(usize, usize, String)>> = (0..3)
        .map(|i| {
            cluster.seen[i]
                .iter()
                .filter(|l| l.starts_with("recovered"))
                .map(|l| {
                    let lost = l.split_whitespace().find_map(|w| w.strip_prefix("lost="));
                    (
                        field(l, "generation"),
                        field(l, "workers"),
                        lost.unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .collect();
    eprintln!("exit codes {codes:?}, re-formings {groups:?}");
    // One group per generation: workers that re-formed at the same generation did so with one list.
    let all: Vec<&(usize, usize, String)> = groups.iter().flatten().collect();
    for a in &all {
        for b in &all {
            assert!(
                a.0 != b.0 || a == b,
                "two groups at one generation: {groups:?}"
            );
        }
    }
    // The finishers are one group: they went through the same re-formings, and it holds as
    // many workers as finished. Every other worker failed with a typed error.
    let finished: Vec<usize> = (0..3).filter(|&i| codes[i] == 0).collect();
    if let Some(&first) = finished.first() {
        for &i in &finished {
            assert_eq!(groups[i], groups[first], "worker {i}: {groups:?}");
        }
        let last = groups[first].last().expect("finished without re-forming");
        assert_eq!(last.1, finished.len(), "{groups:?}, finished: {finished:?}");
    }
    for i in (0..3).filter(|&i| codes[i] != 0) {
        assert_eq!(codes[i], 3, "worker {i}: {:#?}", cluster.seen[i]);
        let line = cluster.wait_for(i, "error");
        assert!(line.contains("kind=recovery"), "worker {i}: {line}");
    }
}

#[test]
fn a_worker_stopped_past_the_budget_is_left_out_and_refused_when_it_comes_back() {
    let flags = [
        "--elastic",
        "--steps",
        "100000",
        "--global-batch",
        "12",
        "--step-pause-ms",
        "40",
        "--idle-timeout-ms",
        "800",
    ];
    let mut cluster = Cluster::start(
        "stopped",
        &[("worker", 1), ("worker", 1), ("worker", 1)],
        &flags,
    );
    for i in 0..3 {
        cluster.wait_for(i, "step 3 ");
    }
    let late = cluster.workers[2].pid();
    kill(late, Signal::SIGSTOP).unwrap();
    for i in 0..2 {
        let line = cluster.wait_for(i, "recovered");
        assert!(
            line.contains("generation=2") && line.contains("lost=worker/2"),
            "worker {i}: {line}"
        );
    }
    kill(late, Signal::SIGCONT).unwrap();
    // Back, it finds the others at generation 2 without it: a typed error, no group of its own.
    let line = cluster.wait_for(2, "error");
    assert!(
        line.contains("kind=recovery")
            && line.contains("left out")
            && line.contains("at generation 2"),
        "{line}"
    );
    assert_eq!(cluster.workers[2].wait_exit(), 3);
    // The survivors trained on meanwhile, undisturbed.
    for i in 0..2 {
        let step = field(&cluster.wait_for(i, "recovered"), "step");
        cluster.wait_for(i, &format!("step {} ", step + 5));
        assert!(
            !cluster.seen[i].iter().any(|l| l.starts_with("error")),
            "worker {i}: {:#?}",
            cluster.seen[i]
        );
    }
}

#[test]
fn bad_clusters_and_uneven_replicas_are_refused_by_key() {
    // A parameter server has no place in a MultiWorkerMirrored cluster.
    let mut cluster = Cluster::start("ps", &[("worker", 1), ("ps", 1)], &[]);
    assert_eq!(cluster.workers[0].wait_exit(), 2);
    let line = cluster.wait_for(0, "cluster.ps");
    assert!(
        line.contains("workers, an optional chief and evaluators"),
        "{line}"
    );
    drop(cluster);
    // Every worker must run as many replicas.
    let mut cluster = Cluster::start("uneven", &[("worker", 2), ("worker", 1)], &[]);
    for i in 0..2 {
        let code = cluster.workers[i].wait_exit();
        let line = cluster.wait_for(i, "local_replicas");
        assert_eq!(code, 2, "worker {i}: {line}");
        assert!(line.contains("every worker must run as many"), "{line}");
    }
}

/// What one worker of the in-process pair saw.
#[derive(Debug, PartialEq)]
struct Seen {
    in_sync: usize,
    local: std::ops::Range<usize>,
    ids: Vec<usize>,
    summed: Vec<f32>,
    many: Vec<Vec<f32>>,
    mean: Vec<f32>,
    reduced_sum: f32,
    reduced_mean: f32,
    gathered: Vec<f32>,
    pipeline: (usize, usize),
    from_function: (usize, usize, Vec<Vec<i64>>),
    variable: Vec<f32>,
}

/// The collectives of one worker; both workers call the same ones in the same order.
fn exercise(strategy: &MultiWorkerMirrored) -> anyhow::Result<Seen> {
    let cpu = &Device::Cpu;
    let variable = {
        let _scope = strategy.scope();
        // A different initial value on each worker: creation takes the first worker's.
        let own = Tensor::new(&[strategy.worker_index() as f32 + 10.0, 1.0], cpu)?;
        Variable::new("v", own)?
    };
    let ids = strategy.run(|ctx, ()| ctx.replica_id_in_sync_group(), ())?;
    let summed = strategy
        .run(
            |ctx, ()| -> anyhow::Result<f32> {
                let id = Tensor::new(ctx.replica_id_in_sync_group() as f32, &Device::Cpu)?;
                Ok(ctx.all_reduce(ReduceOp::Sum, &id)?.to_scalar::<f32>()?)
            },
            (),
        )?
        .transpose()?;
    let many = strategy
        .run(
            |ctx, ()| -> anyhow::Result<Vec<f32>> {
                let id = ctx.replica_id_in_sync_group() as f32;
                let cpu = &Device::Cpu;
                let out = ctx.all_reduce_many(
                    ReduceOp::Sum,
                    &[Tensor::new(&[id, 1.0], cpu)?, Tensor::new(2.0 * id, cpu)?],
                )?;
                let mut flat = out[0].to_vec1::<f32>()?;
                flat.push(out[1].to_scalar::<f32>()?);
                Ok(flat)
            },
            (),
        )?
        .transpose()?;
    let mean = strategy
        .run(
            |ctx, ()| -> anyhow::Result<f32> {
                let id = Tensor::new(ctx.replica_id_in_sync_group() as f32, &Device::Cpu)?;
                Ok(ctx.all_reduce(ReduceOp::Mean, &id)?.to_scalar::<f32>()?)
            },
            (),
        )?
        .transpose()?;
    // Per-replica batches of uneven lengths: worker 0's replicas hold [0], [1]; worker 1's
    // [2, 3], [4].
    let batches = strategy.experimental_distribute_values_from_function(|ctx| {
        let id = ctx.replica_id_in_sync_group;
        let values: Vec<f32> = match id {
            0 => vec![0.0],
            1 => vec![1.0],
            2 => vec![2.0, 3.0],
            _ => vec![4.0],
        };
        Tensor::new(values.as_slice(), &Device::Cpu).unwrap()
    });
    let reduced_sum = strategy
        .reduce(ReduceOp::Sum, &batches, Some(0))?
        .to_scalar::<f32>()?;
    let reduced_mean = strategy
        .reduce(ReduceOp::Mean, &batches, Some(0))?
        .to_scalar::<f32>()?;
    let gathered = strategy.gather(&batches, 0)?.to_vec1::<f32>()?;
    let dist = strategy.experimental_distribute_dataset(
        Dataset::range(0, 16, 1).batch(8, false),
        DistributeOptions::default(),
    )?;
    let ctx = dist.input_context();
    // Each worker's function shards by its pipeline and batches per replica (4 per global
    // batch of 4 replicas: 1 each); its replicas take the elements in turn.
    let from_function = strategy.distribute_datasets_from_function(
        |ctx| {
            let per_replica = ctx.get_per_replica_batch_size(4)?;
            Ok(Dataset::range(0, 8, 1)
                .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
                .batch(per_replica, false))
        },
        DistributeOptions::default(),
    )?;
    let fctx = from_function.input_context();
    let first = from_function
        .iter()
        .get_next()?
        .values()
        .iter()
        .map(|e| e[0].to_vec1::<i64>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Seen {
        in_sync: strategy.num_replicas_in_sync(),
        local: strategy.local_replicas(),
        ids: ids.into_values(),
        summed: summed.into_values(),
        many: many.into_values(),
        mean: mean.into_values(),
        reduced_sum,
        reduced_mean,
        gathered,
        pipeline: (ctx.num_input_pipelines, ctx.input_pipeline_id),
        from_function: (fctx.num_input_pipelines, fctx.input_pipeline_id, first),
        variable: variable
            .components()
            .iter()
            .flat_map(|c| c.to_vec1::<f32>().unwrap())
            .collect(),
    })
}

#[test]
fn workers_fusing_different_buckets_are_refused_by_key() {
    let refused = in_process_pair("buckets", |i, mut config| {
        config.bucket_bytes_max = 1 << (20 + i);
        MultiWorkerMirrored::new(config).map(|_| ())
    });
    for (i, result) in refused.into_iter().enumerate() {
        match result {
            Err(StrategyError::Config { key, detail }) => {
                assert_eq!(key, "bucket_bytes_max", "worker {i}: {detail}");
                assert!(
                    detail.contains("1048576") && detail.contains("2097152"),
                    "{detail}"
                );
                assert!(
                    detail.contains("every worker must choose alike"),
                    "{detail}"
                );
            }
            other => panic!("worker {i}: expected a config error, got {other:?}"),
        }
    }
}

#[test]
fn replicas_ids_collectives_reduce_gather_and_inputs_span_two_workers() {
    let seen: Vec<Seen> = in_process_pair("pair", |i, config| {
        let strategy = MultiWorkerMirrored::new(config.with_local_replicas(2)).unwrap();
        assert_eq!(strategy.worker_index(), i);
        exercise(&strategy).unwrap()
    });
    for (w, s) in seen.iter().enumerate() {
        assert_eq!(s.in_sync, 4);
        assert_eq!(s.local, 2 * w..2 * w + 2);
        assert_eq!(s.ids, vec![2 * w, 2 * w + 1]);
        assert_eq!(s.summed, vec![6.0; 2], "worker {w}");
        assert_eq!(s.many, vec![vec![6.0, 4.0, 12.0]; 2], "worker {w}");
        assert_eq!(s.mean, vec![1.5; 2], "worker {w}");
        assert_eq!(s.reduced_sum, 10.0, "worker {w}");
        assert_eq!(s.reduced_mean, 2.0, "worker {w}");
        assert_eq!(s.gathered, vec![0.0, 1.0, 2.0, 3.0, 4.0], "worker {w}");
        assert_eq!(s.pipeline, (2, w));
        // Pipeline w holds w, w+2, w+4, ...: its two replicas take the first two.
        let first = w as i64;
        assert_eq!(
            s.from_function,
            (2, w, vec![vec![first], vec![first + 2]]),
            "worker {w}"
        );
        // Both local copies hold worker 0's initial value.
        assert_eq!(s.variable, vec![10.0, 1.0, 10.0, 1.0], "worker {w}");
    }
}

#[test]
fn workers_whose_views_differ_for_a_while_re_form_soon_after_the_link_heals() {
    // Workers 0 and 1 no longer hear each other for a while; 2 and 3 hear everyone. Every
    // view holds a quorum and no two agree, so each re-forming attempt fails everywhere:
    // at once (a member refusing a join whose list differs fails its own forming too), and
    // the next attempt follows a probe timeout later, not a form timeout (a minute here).
    // The group is whole again soon after the link heals.
    let flags = [
        "--elastic",
        "--steps",
        "40",
        "--global-batch",
        "8",
        "--step-pause-ms",
        "60",
        "--idle-timeout-ms",
        "800",
        "--probe-timeout-ms",
        "800",
        "--form-timeout-ms",
        "60000",
    ];
    let tasks = [("worker", 1); 4];
    let mut cluster = Cluster::start_with("views", &tasks, &flags, true);
    for i in 0..4 {
        cluster.wait_for(i, "step 4 ");
    }
    cluster.cut_links(&[(0, 1)]);
    std::thread::sleep(Duration::from_secs(2));
    cluster.cut_links(&[]);
    let healed = Instant::now();
    for i in 0..4 {
        let line = cluster.wait_for(i, "recovered");
        assert!(line.contains("workers=4 lost= "), "worker {i}: {line}");
    }
    let waited = healed.elapsed();
    assert!(
        waited < Duration::from_secs(30),
        "re-formed {waited:?} after the link healed: an attempt waited out the form timeout"
    );
    for i in 0..4 {
        assert_eq!(
            cluster.workers[i].wait_exit(),
            0,
            "worker {i}: {:#?}",
            cluster.seen[i]
        );
    }
}

#[test]
fn a_worker_whose_peers_all_came_back_as_new_processes_goes_on_alone_and_admits_them() {
    // Workers 1 and 2 of 3 are killed and started again at once: their new processes wait
    // to be admitted, and answer worker 0's probes so. Worker 0 alone would be no quorum of
    // three, but their old processes are gone (no other side can exist): it goes on alone
    // from its own state (no checkpoint), instead of stopping the job, and admits them at
    // the next step boundary. All three end with the same bits.
    let flags = [
        "--elastic",
        "--steps",
        "80",
        "--global-batch",
        "6",
        "--step-pause-ms",
        "60",
        "--idle-timeout-ms",
        "800",
        "--probe-timeout-ms",
        "1500",
        "--form-timeout-ms",
        "5000",
    ];
    let tasks = [("worker", 1); 3];
    let mut cluster = Cluster::start_with("replaced", &tasks, &flags, false);
    for i in 0..3 {
        cluster.wait_for(i, "step 4 ");
    }
    kill_worker(&cluster, 1);
    kill_worker(&cluster, 2);
    assert_eq!(cluster.workers[1].wait_exit(), -1);
    assert_eq!(cluster.workers[2].wait_exit(), -1);
    let joiners = [cluster.restart(1), cluster.restart(2)];
    let recovered = cluster.wait_for(0, "recovered");
    assert!(recovered.contains("workers=1 "), "{recovered}");
    for &j in &joiners {
        cluster.wait_for(j, "admitted");
    }
    let outs = cluster.finish(&[0, joiners[0], joiners[1]]);
    let seen = changes(&cluster, 0);
    assert_eq!(seen[0].kind, "recovered", "{seen:?}");
    assert_eq!(seen.last().map(|c| c.workers), Some(3), "{seen:?}");
    assert!(
        cluster.seen[0].iter().all(|l| !l.starts_with("error")),
        "{:#?}",
        cluster.seen[0]
    );
    for (k, out) in outs.iter().enumerate().skip(1) {
        assert_eq!(
            out.variables, outs[0].variables,
            "finisher {k} holds other bits than worker 0"
        );
    }
}

/// The source's learning rate (one a callback set) and where it stood in its epochs come with
/// its state: a worker that took the state at its own rate would apply every later update at
/// another rate than the others, and its model would drift from theirs. Two workers over
/// loopback QUIC; worker 1 is ahead.
#[test]
fn the_sources_learning_rate_and_epochs_come_with_its_state() {
    use cohort::optim::Optimizer;
    use cohort::strategy::{ElasticState, EpochProgress};
    use cohort::train::DistributedOptimizer;
    /// What worker `i` holds before the agreement: its step, epochs and rate.
    fn held(worker: usize) -> (u64, EpochProgress, f32) {
        let epochs = |begun, figures| EpochProgress { begun, figures };
        match worker {
            0 => (20, epochs(1, vec![9.5, 640.0]), 0.1),
            _ => (24, epochs(3, vec![1.25, 0.1, 1e300]), 0.025),
        }
    }
    let got = in_process_pair("agree-rate", |i, config| {
        let (step, epochs, rate) = held(i);
        let mut strategy = MultiWorkerMirrored::new(config).unwrap();
        let optimizer = DistributedOptimizer::new(Optimizer::sgd(rate));
        let mut state = ElasticState {
            step,
            position: 0,
            variables: &[],
            optimizer: Some(&optimizer),
            epochs,
        };
        strategy.agree(&mut state).unwrap();
        (state.step, state.epochs, optimizer.learning_rate())
    });
    let (step, epochs, rate) = held(1);
    assert_eq!(
        got,
        vec![(step, epochs.clone(), rate), (step, epochs, rate)]
    );
}
