//! One certificates directory for every node, as a Kubernetes Secret mounts it in every pod of
//! a job: the `cohort` binary writes the Secret (`cohort certs --k8s-secret`); the test lays it
//! out as the kubelet does (each file a link through `..data` into a timestamped directory);
//! two nodes load their own pairs from that one directory and talk over real QUIC on
//! 127.0.0.1, each knowing the other by the task its certificate names (SEC-2). The check is as
//! strict as with a directory per node: a dialer that expects another task is refused, and a
//! directory whose pair for a task names another task does not load.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use cohort_actors::{Gateway, GatewayConfig, HeartbeatConfig, IncarnationId};
use cohort_transport::{Endpoint, NodeCredentials, NodeId, TransportConfig};

#[test]
fn two_nodes_start_from_one_secret_mounted_certs_dir() {
    let scratch = Scratch::new();
    let generated = scratch.0.join("generated");
    let output = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["certs", "--out"])
        .arg(&generated)
        .args(["--cluster", "chief=1,worker=2", "--k8s-secret", "job-certs"])
        .args(["--namespace", "ml"])
        .output()
        .expect("run cohort certs");
    assert!(
        output.status.success(),
        "cohort certs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = std::fs::read_to_string(generated.join("job-certs.secret.yaml")).unwrap();
    let mount = scratch.0.join("mount");
    mount_secret(&manifest, &mount);
    // The nodes read the mounted Secret only.
    std::fs::remove_dir_all(&generated).unwrap();
    assert!(
        !mount.join("ca.key").exists(),
        "the Secret never holds the CA key"
    );

    let chief_id = NodeId::new("chief", 0);
    let worker_id = NodeId::new("worker", 1);
    run(async {
        let chief = start(&mount, &chief_id);
        let worker = start(&mount, &worker_id);
        let chief_addr = chief.local_addr().unwrap();

        let seen = worker
            .connect(chief_addr, &chief_id)
            .await
            .expect("the worker reaches the chief");
        assert_eq!(
            (seen.node, seen.incarnation),
            (chief_id.clone(), IncarnationId(1))
        );
        // The chief knows its peer as the task the peer's certificate names.
        let deadline = Instant::now() + Duration::from_secs(10);
        while chief.peer_status(&worker_id) != Some((IncarnationId(1), true)) {
            assert!(
                Instant::now() < deadline,
                "the chief never saw worker/1: {:?}",
                chief.peer_status(&worker_id)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(chief.peer_status(&NodeId::new("worker", 0)), None);

        // A dialer that means to reach another task is refused: the certificate names chief-0.
        let other = start(&mount, &NodeId::new("worker", 0));
        let refused = other.connect(chief_addr, &NodeId::new("worker", 1)).await;
        assert!(
            refused.is_err(),
            "a peer whose certificate names chief/0 passed as worker/1: {refused:?}"
        );
        for gateway in [chief, worker, other] {
            gateway.shutdown();
        }
    });

    // A directory whose pair for worker 0 is worker 1's does not load as worker 0.
    let swapped = scratch.0.join("swapped");
    std::fs::create_dir(&swapped).unwrap();
    for name in ["ca.pem", "worker-1.pem", "worker-1.key"] {
        std::fs::copy(mount.join(name), swapped.join(name)).unwrap();
    }
    std::fs::copy(mount.join("worker-1.pem"), swapped.join("worker-0.pem")).unwrap();
    std::fs::copy(mount.join("worker-1.key"), swapped.join("worker-0.key")).unwrap();
    let err = NodeCredentials::load(&swapped, &NodeId::new("worker", 0)).unwrap_err();
    assert!(
        err.to_string().contains("names worker/1, not worker/0"),
        "{err}"
    );
}

/// Lays the Secret `manifest` out in `dir` as the kubelet mounts a Secret volume: the files in
/// a timestamped directory, `..data` linking to it, and each file name a link through `..data`.
fn mount_secret(manifest: &str, dir: &Path) {
    let data = manifest
        .split_once("\ndata:\n")
        .expect("the manifest has a data: section")
        .1;
    let files = dir.join("..2026_01_01_00_00_00.000000000");
    std::fs::create_dir_all(&files).unwrap();
    std::os::unix::fs::symlink(files.file_name().unwrap(), dir.join("..data")).unwrap();
    for line in data.lines() {
        let (key, value) = line
            .trim()
            .split_once(": ")
            .unwrap_or_else(|| panic!("not a data entry: {line:?}"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .unwrap_or_else(|e| panic!("{key}: not base64: {e}"));
        std::fs::write(files.join(key), bytes).unwrap();
        std::os::unix::fs::symlink(Path::new("..data").join(key), dir.join(key)).unwrap();
    }
}

/// A node as a role process starts one: its own pair from the shared directory.
fn start(certs_dir: &Path, node: &NodeId) -> Gateway {
    let creds = NodeCredentials::load(certs_dir, node)
        .unwrap_or_else(|e| panic!("{node} from {}: {e}", certs_dir.display()));
    let endpoint = Endpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        creds,
        TransportConfig::for_tests(),
    )
    .unwrap();
    Gateway::start(
        endpoint,
        GatewayConfig {
            incarnation: IncarnationId(1),
            heartbeat: HeartbeatConfig {
                interval: Duration::from_millis(100),
                timeout: Duration::from_secs(5),
            },
            call_timeout: Duration::from_secs(5),
            ..GatewayConfig::default()
        },
    )
}

fn run<F: std::future::Future<Output = ()>>(test: F) {
    actix::System::new().block_on(async move {
        tokio::time::timeout(Duration::from_secs(30), test)
            .await
            .expect("test timed out");
    });
}

/// A scratch directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("cohort-certs-dir-{}", std::process::id()));
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

/// `--valid-days` bounds the node certificates (the CA's by `--ca-valid-days`); out of range,
/// or longer than the CA's, is refused with exit 2 naming the flag, and nothing is written.
#[test]
fn certificate_validity_is_a_flag_with_bounds() {
    let scratch = Scratch::new();
    let out = scratch.0.join("certs");
    let certs = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args(["certs", "--out"])
            .arg(&out)
            .args(["--cluster", "chief=1,worker=1"])
            .args(extra)
            .output()
            .expect("run cohort certs")
    };
    for (extra, named) in [
        (&["--valid-days", "0"][..], "--valid-days"),
        (&["--valid-days", "40000"][..], "--valid-days"),
        (
            &["--valid-days", "400", "--ca-valid-days", "100"][..],
            "--valid-days 400",
        ),
    ] {
        let output = certs(extra);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(named), "{extra:?}: {stderr}");
        assert!(!out.join("ca.pem").exists(), "{extra:?} wrote certificates");
    }
    let output = certs(&["--valid-days", "30"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.join("worker-0.pem").exists());
}
