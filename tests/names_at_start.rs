//! A real `cohort role` process started as a pod would be before DNS knows its peers, or
//! itself: every address in its `TF_CONFIG` is a name that does not resolve, and no
//! incarnation is given. It must not refuse to start (no exit 2): it binds its own port without
//! resolving its own name, serves there, and runs as an incarnation it derived from the clock.
//! The test reaches it over real QUIC on 127.0.0.1 at that port.
//!
//! Started by hand (no launcher), a worker or parameter server never waits for a chief
//! forever: with no chief at all it exits 171 once its wait (`worker_wait` /
//! `ps_restart_wait`) is over, and so it does when its chief is SIGKILLed and never comes back.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cohort_actors::{Gateway, GatewayConfig, IncarnationId};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "cohort-names-at-start-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The role process, killed (by its own PID) when the test ends either way.
struct Role(Child);

impl Role {
    /// `cohort role --job demo` from `tf_config` and `certs` (and `env`), with no incarnation
    /// and no config file given, its stderr in `<scratch>/stderr`.
    fn start(
        scratch: &Scratch,
        tf_config: &serde_json::Value,
        certs: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Self {
        let stderr = std::fs::File::create(scratch.0.join("stderr")).unwrap();
        Role(
            Command::new(env!("CARGO_BIN_EXE_cohort"))
                .args(["role", "--job", "demo"])
                .env("TF_CONFIG", tf_config.to_string())
                .env("COHORT_CERTS", certs)
                .envs(env.iter().copied())
                .env_remove("COHORT_INCARNATION")
                .env_remove("COHORT_CONFIG")
                .current_dir(&scratch.0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("start cohort role"),
        )
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn a_process_whose_peers_and_own_name_do_not_resolve_yet_starts_and_serves_on_its_port() {
    let scratch = Scratch::new();
    let certs = scratch.0.join("certs");
    let ca = ClusterCa::generate("test").unwrap();
    let (chief_id, ps_id) = (NodeId::new("chief", 0), NodeId::new("ps", 0));
    for node in [&chief_id, &ps_id] {
        ca.issue(node).unwrap().save(&certs).unwrap();
    }
    let port = free_udp_port();
    let tf_config = serde_json::json!({
        "cluster": {
            "chief": ["chief-0.not-yet.invalid:2222"],
            "worker": ["worker-0.not-yet.invalid:2222"],
            "ps": [format!("ps-0.not-yet.invalid:{port}")],
        },
        "task": {"type": "ps", "index": 0},
    });
    let mut role = Role::start(&scratch, &tf_config, &certs, &[]);
    let started_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    let answered = actix::System::new().block_on(async {
        let endpoint = Endpoint::bind(
            "127.0.0.1:0".parse().unwrap(),
            ca.issue(&chief_id).unwrap(),
            TransportConfig::for_tests(),
        )
        .unwrap();
        let chief = Gateway::start(
            endpoint,
            GatewayConfig {
                incarnation: IncarnationId(1),
                call_timeout: Duration::from_secs(2),
                ..GatewayConfig::default()
            },
        );
        let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = role.0.try_wait() {
                let log = std::fs::read_to_string(scratch.0.join("stderr")).unwrap_or_default();
                panic!("the role exited ({status}) instead of serving; its stderr:\n{log}");
            }
            match chief.connect(at, &ps_id).await {
                Ok(incarnation) => break incarnation,
                Err(e) if Instant::now() >= deadline => {
                    panic!("the role never answered on port {port}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    // Serving, and as an incarnation from the clock (milliseconds since the Unix epoch, taken
    // when it started), not the old fixed 1.
    assert_eq!(answered.node, ps_id);
    let incarnation = answered.incarnation.0;
    assert!(
        incarnation + 60_000 >= started_ms && incarnation <= started_ms + 60_000,
        "incarnation {incarnation} is not the clock at start ({started_ms} ms)"
    );
    assert!(
        role.0.try_wait().unwrap().is_none(),
        "the role keeps running while its peers do not resolve"
    );
}

/// A chief whose parameter server's name never resolves: it keeps trying within
/// `ps_restart_wait`, then fails with an error naming the server and the name that does not
/// resolve (exit 1, a training error: the job cannot start), never a panic, never a hang.
#[test]
fn a_chief_whose_server_name_never_resolves_fails_naming_it_within_the_wait() {
    let scratch = Scratch::new();
    let certs = scratch.0.join("certs");
    let ca = ClusterCa::generate("test").unwrap();
    ca.issue(&NodeId::new("chief", 0))
        .unwrap()
        .save(&certs)
        .unwrap();
    let port = free_udp_port();
    let tf_config = serde_json::json!({
        "cluster": {
            "chief": [format!("127.0.0.1:{port}")],
            "worker": ["worker-0.never.invalid:2222"],
            "ps": ["ps-0.never.invalid:2222"],
        },
        "task": {"type": "chief", "index": 0},
    });
    let ckpt = scratch.0.join("ckpt").display().to_string();
    let mut role = Role::start(
        &scratch,
        &tf_config,
        &certs,
        &[
            ("COHORT_PS_RESTART_WAIT", "2s"),
            ("COHORT_WORKER_WAIT", "2s"),
            ("COHORT_CHECKPOINT_DIR", &ckpt),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = role.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the chief neither started nor failed within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(scratch.0.join("stderr")).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("ps/0")
            && log.contains("ps-0.never.invalid")
            && log.contains("does not resolve"),
        "the error names the server and its name: {log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// The certificates of a chief, a worker and a parameter server, under `<scratch>/certs`.
fn job_certs(scratch: &Scratch) -> std::path::PathBuf {
    let certs = scratch.0.join("certs");
    let ca = ClusterCa::generate("test").unwrap();
    for (role, index) in [("chief", 0), ("worker", 0), ("ps", 0)] {
        ca.issue(&NodeId::new(role, index))
            .unwrap()
            .save(&certs)
            .unwrap();
    }
    certs
}

/// The `TF_CONFIG` of `task` in a job of a chief, a worker and a server on loopback `ports`.
fn job_tf_config(ports: [u16; 3], task: &str) -> serde_json::Value {
    serde_json::json!({
        "cluster": {
            "chief": [format!("127.0.0.1:{}", ports[0])],
            "worker": [format!("127.0.0.1:{}", ports[1])],
            "ps": [format!("127.0.0.1:{}", ports[2])],
        },
        "task": {"type": task, "index": 0},
    })
}

/// Waits (at most `bound`) for `role` to exit; its status and stderr (`<dir>/stderr`).
fn exit_within(
    role: &mut Role,
    dir: &Scratch,
    bound: Duration,
) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = role.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.0.join("stderr")).unwrap_or_default();
            return (status, log);
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.0.join("stderr")).unwrap_or_default();
            panic!("still running {bound:?} on; its stderr:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A worker and a parameter server whose chief never starts: each exits 171 (restart me) once
/// its wait is over, saying why, instead of waiting forever.
#[test]
fn a_worker_and_a_server_whose_chief_never_starts_exit_171_after_their_wait() {
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    for (task, wait_key) in [
        ("worker", "COHORT_WORKER_WAIT"),
        ("ps", "COHORT_PS_RESTART_WAIT"),
    ] {
        let scratch = Scratch::new();
        let certs = job_certs(&scratch);
        let started = Instant::now();
        let mut role = Role::start(
            &scratch,
            &job_tf_config(ports, task),
            &certs,
            &[(wait_key, "2s"), ("COHORT_DETECTION_BUDGET", "1s")],
        );
        let (status, log) = exit_within(&mut role, &scratch, Duration::from_secs(60));
        assert_eq!(status.code(), Some(171), "{task}: {log}");
        assert!(log.contains("no chief answered within 2s"), "{task}: {log}");
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "{task} left before its wait"
        );
        assert!(!log.contains("panicked"), "{log}");
    }
}

/// A worker and a parameter server whose chief is SIGKILLed (its address then refuses
/// connections) and never comes back: each waits its wait for a new chief, then exits 171.
#[test]
fn a_worker_and_a_server_whose_chief_is_killed_for_good_exit_171_after_their_wait() {
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let dirs = [Scratch::new(), Scratch::new(), Scratch::new()];
    let certs = job_certs(&dirs[0]);
    let ckpt = dirs[0].0.join("ckpt").display().to_string();
    // Waits long enough for the chief to reach the server from its start on a busy machine
    // (a server the chief never reached has lost no chief, and says so instead).
    let env = [
        ("COHORT_WORKER_WAIT", "6s"),
        ("COHORT_PS_RESTART_WAIT", "6s"),
        ("COHORT_DETECTION_BUDGET", "1s"),
        ("COHORT_CHECKPOINT_DIR", ckpt.as_str()),
    ];
    let mut ps = Role::start(&dirs[2], &job_tf_config(ports, "ps"), &certs, &env);
    let mut worker = Role::start(&dirs[1], &job_tf_config(ports, "worker"), &certs, &env);
    let mut chief = Role::start(&dirs[0], &job_tf_config(ports, "chief"), &certs, &env);
    // Training: the worker registered with the chief and ran a step.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = std::fs::read_to_string(dirs[1].0.join("stderr")).unwrap_or_default();
        if log.contains("registered with chief/0") {
            break;
        }
        if let Ok(Some(status)) = chief.0.try_wait() {
            let chief_log = std::fs::read_to_string(dirs[0].0.join("stderr")).unwrap_or_default();
            panic!("the chief exited ({status}) before the worker registered:\n{chief_log}");
        }
        assert!(
            Instant::now() < deadline,
            "the worker never registered with the chief:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    chief.0.kill().unwrap();
    let _ = chief.0.wait();
    let killed = Instant::now();
    for (role, dir, task) in [(&mut worker, &dirs[1], "worker"), (&mut ps, &dirs[2], "ps")] {
        let (status, log) = exit_within(role, dir, Duration::from_secs(60));
        assert_eq!(status.code(), Some(171), "{task}: {log}");
        assert!(log.contains("no new chief"), "{task}: {log}");
        assert!(!log.contains("panicked"), "{log}");
    }
    assert!(
        killed.elapsed() >= Duration::from_secs(6),
        "left before the wait"
    );
}
