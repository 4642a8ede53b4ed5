//! A cluster of "machines" without the launcher: every task of a 1 chief + 2 PS + 2 worker
//! job runs the built `cohort` binary (`cohort role --job demo`) in its own network namespace
//! with its own IP ([`netns`]), found by its host name (`ps-1.cohort-test`, never an IP), from
//! its own environment (`TF_CONFIG` with host names, `COHORT_CERTS` from `cohort certs`, a
//! checkpoint directory shared on disk, no incarnation), and supervised by a kubelet-like
//! restarter ([`kubelet`]). The job is the demo, made small: a few epochs of digits and of a
//! CTR model with a 10,000-row embedding, so that it trains for a few seconds.
//!
//! What a test checks at the end ([`Cluster::assert_whole`]): the chief exited 0 and its
//! final checkpoint's manifest accounts for every closure exactly once (LEDGER-1: every
//! scheduled closure committed, none pending or failed; every variable's optimizer step count
//! equals the closures that push to it, so no push was applied twice or lost, across restores
//! too), and the summary the chief printed agrees.

#![allow(dead_code)]

pub mod kubelet;
pub mod netns;
/// Skips, counted (`tests/skip_support`).
#[path = "../skip_support/mod.rs"]
pub mod skip;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kubelet::{Kubelet, Outcome, TaskSpec};
use netns::Network;

/// The hosts of the job, one per task.
pub const HOSTS: [&str; 5] = ["chief-0", "ps-0", "ps-1", "worker-0", "worker-1"];
/// The port every task listens on (each host has its own IP).
pub const PORT: u16 = 2222;
/// Steps per epoch, and the demo's epochs (a CTR epoch has twice as many steps).
pub const STEPS_PER_EPOCH: u64 = 50;
pub const DIGITS_EPOCHS: u64 = 2;
pub const CTR_EPOCHS: u64 = 3;
/// Closures of each phase, and of the whole job.
pub const DIGITS_CLOSURES: u64 = DIGITS_EPOCHS * STEPS_PER_EPOCH;
pub const CTR_CLOSURES: u64 = CTR_EPOCHS * 2 * STEPS_PER_EPOCH;
pub const TOTAL_CLOSURES: u64 = DIGITS_CLOSURES + CTR_CLOSURES;
/// The line the demo's chief prints midway through the CTR phase (its chaos marker).
pub const MIDWAY: &str = "[chaos-point]";
/// Bound on a whole job, faults included, on a slow, busy machine.
pub const JOB_LIMIT: Duration = Duration::from_secs(100);

/// A running job: its hosts, its tasks' kubelets and its scratch directory (certificates,
/// checkpoints, logs). Dropping it stops every task (SIGKILL to what still runs), removes the
/// namespaces and the directory; on a panic it first prints every task's log.
pub struct Cluster {
    /// Kubelets, in [`HOSTS`] order (stopped before the network goes).
    kubelets: Vec<Kubelet>,
    pub net: Network,
    dir: PathBuf,
}

/// The scratch directory of one job.
fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "cohort-ns-cluster-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(dir.join("logs")).expect("scratch dir");
    dir
}

impl Cluster {
    /// Makes the hosts and starts every task except those in `held` (started by
    /// [`Cluster::kubelet`]`.release()`; their names are not published until then either).
    /// `None` where namespaces cannot be made (the reason is printed): skip the test.
    pub fn start(tag: &str, held: &[&str]) -> Option<Cluster> {
        let mut net = Network::create(&HOSTS)?;
        let dir = scratch(tag);
        let certs = dir.join("certs");
        let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args(["certs", "--cluster", "chief=1,ps=2,worker=2", "--out"])
            .arg(&certs)
            .output()
            .expect("run cohort certs");
        assert!(
            out.status.success(),
            "cohort certs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for short in held {
            net.unpublish(short);
        }
        let addr = |short: &str| format!("{}:{PORT}", Network::name(short));
        let cluster = serde_json::json!({
            "chief": [addr("chief-0")],
            "ps": [addr("ps-0"), addr("ps-1")],
            "worker": [addr("worker-0"), addr("worker-1")],
        });
        let kubelets = HOSTS
            .iter()
            .map(|short| {
                let (kind, index) = short.split_once('-').expect("type-index");
                let tf_config = serde_json::json!({
                    "cluster": cluster,
                    "task": {"type": kind, "index": index.parse::<u32>().expect("index")},
                });
                let env = [
                    ("TF_CONFIG", tf_config.to_string()),
                    ("COHORT_CERTS", certs.display().to_string()),
                    (
                        "COHORT_CHECKPOINT_DIR",
                        dir.join("ckpt").display().to_string(),
                    ),
                    ("COHORT_DETECTION_BUDGET", "1s".into()),
                    ("COHORT_PREEMPTION_GRACE", "2s".into()),
                    ("COHORT_DEMO_DIGITS_EPOCHS", DIGITS_EPOCHS.to_string()),
                    ("COHORT_DEMO_CTR_EPOCHS", CTR_EPOCHS.to_string()),
                    ("COHORT_DEMO_STEPS_PER_EPOCH", STEPS_PER_EPOCH.to_string()),
                    ("COHORT_DEMO_CTR_VOCAB", "10000".into()),
                    // The chief prints its midway marker (nobody acts on it but the test).
                    ("COHORT_DEMO_CHAOS", "true".into()),
                ];
                Kubelet::start(TaskSpec {
                    name: short.to_string(),
                    netns: net.netns(short).to_string(),
                    command: vec![
                        env!("CARGO_BIN_EXE_cohort").into(),
                        "role".into(),
                        "--job".into(),
                        "demo".into(),
                    ],
                    env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                    log: dir.join("logs").join(format!("{short}.log")),
                    held: held.contains(short),
                })
            })
            .collect();
        Some(Cluster { kubelets, net, dir })
    }

    /// The kubelet of `short`.
    pub fn kubelet(&self, short: &str) -> &Kubelet {
        let i = HOSTS
            .iter()
            .position(|h| *h == short)
            .unwrap_or_else(|| panic!("no task {short}"));
        &self.kubelets[i]
    }

    /// Waits (bounded) until the chief's output contains `needle`; panics if it never does.
    pub fn wait_for_chief_line(&self, needle: &str) {
        let deadline = Instant::now() + JOB_LIMIT;
        while !self.kubelet("chief-0").log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "the chief never printed {needle:?}"
            );
            assert!(
                self.kubelet("chief-0")
                    .wait_outcome(Duration::ZERO)
                    .is_none(),
                "the chief ended before printing {needle:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills `short` (kill -9) and keeps it down until the kubelet is released.
    pub fn kill_and_hold(&self, short: &str) {
        let kubelet = self.kubelet(short);
        let exits = kubelet.exits().len();
        kubelet.hold();
        assert!(kubelet.kill(), "{short} was running");
        assert!(
            kubelet.wait_exits(exits + 1, Duration::from_secs(10)),
            "{short} did not die"
        );
    }

    /// Waits for the chief to finish and checks that it exited 0 and that every other task was
    /// told the job is done (exit 0, not restarted again).
    pub fn assert_finished(&self) {
        let chief = self.kubelet("chief-0").wait_outcome(JOB_LIMIT);
        assert_eq!(
            chief,
            Some(Outcome::Done),
            "the chief did not finish with exit 0 within {JOB_LIMIT:?}"
        );
        for short in &HOSTS[1..] {
            let outcome = self.kubelet(short).wait_outcome(Duration::from_secs(20));
            assert_eq!(
                outcome,
                Some(Outcome::Done),
                "{short} ends with exit 0 after the chief's goodbye (exits {:?})",
                self.kubelet(short).exits()
            );
        }
    }

    /// The final checkpoint's manifest (JSON).
    pub fn final_manifest(&self) -> serde_json::Value {
        let dir = self.dir.join("ckpt").join(format!("ckpt-{TOTAL_CLOSURES}"));
        let text = std::fs::read_to_string(dir.join("manifest.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        serde_json::from_str(&text).expect("manifest is JSON")
    }

    /// The job finished, every closure accounted for and applied exactly once (see the module
    /// doc). Returns the final manifest's ledger for the scenario's own checks.
    pub fn assert_whole(&self) -> serde_json::Value {
        self.assert_finished();
        let manifest = self.final_manifest();
        let ledger = manifest["ledger"].clone();
        assert_eq!(manifest["step"], TOTAL_CLOSURES, "final step");
        assert_eq!(ledger["scheduled"], TOTAL_CLOSURES, "LEDGER-1: {ledger}");
        assert_eq!(ledger["committed"], TOTAL_CLOSURES, "LEDGER-1: {ledger}");
        for key in ["pending", "failed", "cancelled", "unavailable"] {
            assert_eq!(ledger[key], 0, "{key}: {ledger}");
        }
        // PS-1: every variable's optimizer took one step per closure of its phase, so each
        // closure's push was applied exactly once on whichever server holds it (a restored
        // server's count comes from the checkpoint and goes on from there).
        let extra = manifest["extra"].as_object().expect("manifest extra");
        let mut seen = 0;
        for (key, value) in extra {
            let Some(var) = key.strip_prefix("steps/") else {
                continue;
            };
            let want = if var.starts_with("digits/") {
                DIGITS_CLOSURES
            } else {
                CTR_CLOSURES
            };
            assert_eq!(value.as_u64(), Some(want), "{var}: optimizer steps");
            seen += 1;
        }
        assert!(seen >= 8, "step counts of every variable: {extra:?}");
        // The summary the chief printed says the same.
        let summary = self.summary();
        let ledger_line = line_after(&summary, "ledger: ");
        let scheduled: u64 = number_before(&ledger_line, " closures scheduled");
        let committed: u64 = number_before(&ledger_line, " committed");
        assert_eq!(
            (scheduled, committed),
            (TOTAL_CLOSURES, TOTAL_CLOSURES),
            "{summary}"
        );
        assert_eq!(
            number_before::<u64>(&ledger_line, " failed"),
            0,
            "{summary}"
        );
        assert_eq!(
            number_before::<u64>(&ledger_line, " pending"),
            0,
            "{summary}"
        );
        ledger
    }

    /// The chief's last `== summary` block.
    pub fn summary(&self) -> String {
        let log = self.kubelet("chief-0").log();
        let at = log
            .rfind("== summary")
            .unwrap_or_else(|| panic!("no summary in the chief's output:\n{log}"));
        log[at..].to_string()
    }

    /// Every parameter server's `pushes applied` from the summary.
    pub fn ps_applied(&self) -> Vec<u64> {
        let summary = self.summary();
        (0..2)
            .map(|ps| {
                let line = line_after(&summary, &format!("ps/{ps}: "));
                number_before(&line, " pushes applied")
            })
            .collect()
    }

    /// Every task's log, for a failed test.
    fn dump_logs(&self) {
        for short in HOSTS {
            eprintln!(
                "===== {short} (exits {:?}) =====\n{}",
                self.kubelet(short).exits(),
                self.kubelet(short).log()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for kubelet in &mut self.kubelets {
            kubelet.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        // `net` drops after this: no process is left in its namespaces.
    }
}

/// The rest of the line that follows `prefix` in `text`.
fn line_after(text: &str, prefix: &str) -> String {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"));
    text[at + prefix.len()..]
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The number written just before `suffix` in `line`.
fn number_before<T: std::str::FromStr>(line: &str, suffix: &str) -> T {
    let end = line
        .find(suffix)
        .unwrap_or_else(|| panic!("no {suffix:?} in {line:?}"));
    let start = line[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    line[start..end]
        .parse()
        .unwrap_or_else(|_| panic!("no number before {suffix:?} in {line:?}"))
}
