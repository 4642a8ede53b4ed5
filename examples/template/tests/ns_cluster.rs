//! The template, a program of a user's own, on "machines" as a platform runs it: each task (a
//! chief, a parameter server, two workers) runs the template's binary in its own network
//! namespace with its own IP, finds its peers by host name (`TF_CONFIG` with host names, as
//! Kubernetes gives them), loads its certificate from a shared directory (`COHORT_CERTS`), and
//! is restarted by a kubelet-like supervisor when it exits with 128 or more. A worker is
//! SIGKILLed as the job starts; the job finishes and the model learns.
//!
//! Needs root and iproute2 (network namespaces); elsewhere the test says so as a skip.

#[allow(dead_code)] // the supervisor's whole API; this test uses part of it
#[path = "../../../tests/ns_support/kubelet.rs"]
mod kubelet;
#[allow(dead_code)]
#[path = "../../../tests/ns_support/netns.rs"]
mod netns;
#[path = "../../../tests/skip_support/mod.rs"]
mod skip;
mod support;

use std::time::{Duration, Instant};

use cohort_transport::{ClusterCa, NodeId};
use kubelet::{Kubelet, Outcome, TaskSpec};
use netns::Network;

const HOSTS: [&str; 4] = ["chief-0", "ps-0", "worker-0", "worker-1"];
const PORT: u16 = 2222;
/// Bound on the whole job.
const JOB_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn the_template_trains_across_hosts_with_a_worker_killed() {
    let Some(net) = Network::create(&HOSTS) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("cohort-template-ns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).expect("scratch dir");
    let certs = dir.join("certs");
    let ca = ClusterCa::generate("template").expect("a CA");
    let task = |short: &str| {
        let (kind, index) = short.split_once('-').expect("type-index");
        (kind.to_string(), index.parse::<u32>().expect("index"))
    };
    for short in HOSTS {
        let (kind, index) = task(short);
        ca.issue(&NodeId::new(kind, index))
            .and_then(|creds| creds.save(&certs))
            .expect("a node certificate");
    }
    let addr = |short: &str| format!("{}:{PORT}", Network::name(short));
    let cluster = serde_json::json!({
        "chief": [addr("chief-0")],
        "ps": [addr("ps-0")],
        "worker": [addr("worker-0"), addr("worker-1")],
    });
    let kubelets: Vec<Kubelet> = HOSTS
        .iter()
        .map(|short| {
            let (kind, index) = task(short);
            let tf_config = serde_json::json!({
                "cluster": cluster,
                "task": {"type": kind, "index": index},
            });
            Kubelet::start(TaskSpec {
                name: short.to_string(),
                netns: net.netns(short).to_string(),
                command: vec![env!("CARGO_BIN_EXE_cohort-template").into()],
                env: vec![
                    ("TF_CONFIG".into(), tf_config.to_string()),
                    ("COHORT_CERTS".into(), certs.display().to_string()),
                    ("COHORT_DETECTION_BUDGET".into(), "1s".into()),
                ],
                log: dir.join("logs").join(format!("{short}.log")),
                held: false,
            })
        })
        .collect();
    let kubelet = |short: &str| &kubelets[HOSTS.iter().position(|h| *h == short).unwrap()];

    // A worker lost as the job starts: the kubelet restarts it, and the job goes on.
    let started = Instant::now();
    while kubelet("worker-1").exits().is_empty() && started.elapsed() < Duration::from_secs(10) {
        if kubelet("worker-1").kill() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let chief = kubelet("chief-0").wait_outcome(JOB_LIMIT);
    let log = kubelet("chief-0").log();
    assert_eq!(
        chief,
        Some(Outcome::Done),
        "the chief did not finish:\n{log}"
    );
    for short in &HOSTS[1..] {
        assert_eq!(
            kubelet(short).wait_outcome(Duration::from_secs(20)),
            Some(Outcome::Done),
            "{short} ends with exit 0 after the chief's goodbye (exits {:?}):\n{}",
            kubelet(short).exits(),
            kubelet(short).log()
        );
    }
    assert_eq!(
        kubelet("worker-1").exits().first(),
        Some(&137),
        "worker-1 was SIGKILLed once: {:?}",
        kubelet("worker-1").exits()
    );
    support::assert_the_model_learned(&log);
    drop(kubelets);
    let _ = std::fs::remove_dir_all(&dir);
}
