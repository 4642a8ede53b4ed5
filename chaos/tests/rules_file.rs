//! A process's transport socket under a rules file (`COHORT_NET_FAULTS`), over real QUIC on
//! 127.0.0.1: a partition written into the file cuts the peer off, a file that does not parse
//! leaves the partition in force, and the healed file lets a new connection through.
//!
//! One test in its own binary: it sets the process's environment before any socket is bound.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cohort_chaos::rules::{socket_from_env, NET_FAULTS_ENV, POLL_INTERVAL};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};

fn config() -> TransportConfig {
    TransportConfig {
        connect_timeout: Duration::from_secs(1),
        ..TransportConfig::for_tests()
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Replaces the rules file whole, as the chaos runner does.
fn write_rules(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_rules_file_cuts_and_heals_a_real_connection_and_a_bad_one_is_ignored() {
    let dir = std::env::temp_dir().join(format!("cohort-rules-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("worker-0.rules");
    // No file yet: no faults.
    std::env::set_var(NET_FAULTS_ENV, &rules);
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let ca = ClusterCa::generate("rules").unwrap();
        let ps = NodeId::new("ps", 0);
        let server = Endpoint::bind(loopback(), ca.issue(&ps).unwrap(), config()).unwrap();
        let server_addr = server.local_addr().unwrap();
        tokio::spawn({
            let server = server.clone();
            async move { while server.accept().await.is_some() {} }
        });
        let socket = socket_from_env(loopback(), &config())
            .unwrap()
            .expect("the variable is set: a faulty socket");
        let client_addr = socket.local_addr().unwrap();
        let client = Endpoint::bind_with_socket(
            socket,
            ca.issue(&NodeId::new("worker", 0)).unwrap(),
            config(),
        )
        .unwrap();
        client
            .connect(server_addr, &ps)
            .await
            .expect("no rules: the connection is made");

        // Partitioned: within a few polls of the file, a new connection cannot be made.
        write_rules(
            &rules,
            &format!("seed 3\npartition {client_addr} {server_addr}\n"),
        );
        let mut cut = false;
        for _ in 0..50 {
            if client.connect(server_addr, &ps).await.is_err() {
                cut = true;
                break;
            }
            tokio::time::sleep(POLL_INTERVAL / 2).await;
        }
        assert!(cut, "the partition in the rules file never took effect");

        // A file that does not parse is ignored: the partition holds. The first attempt
        // outlasts several polls (its connect timeout), so the second is made after the
        // watcher has read the bad file.
        write_rules(&rules, "seed 3\npartition nowhere\n");
        for attempt in 0..2 {
            assert!(
                client.connect(server_addr, &ps).await.is_err(),
                "attempt {attempt}: a bad rules file lifted the partition"
            );
        }

        // Healed: a new connection is made again.
        write_rules(&rules, "seed 3\n");
        let mut healed = false;
        for _ in 0..50 {
            if client.connect(server_addr, &ps).await.is_ok() {
                healed = true;
                break;
            }
            tokio::time::sleep(POLL_INTERVAL / 2).await;
        }
        assert!(
            healed,
            "the healed rules file never let a connection through"
        );
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome.expect("the test exceeded its time limit");
}
