//! Shared harness of the MultiWorkerMirrored tests that run several workers inside the test
//! process: each worker a thread with its own strategy, over real QUIC on loopback.

use cohort::cluster::ClusterConfig;
use cohort::strategy::MultiWorkerConfig;
use cohort_transport::{ClusterCa, NodeId};

/// Runs `worker(i, config)` on a thread for each of two workers in this process (their
/// certificates in a fresh directory, their endpoints on free loopback ports); their results.
pub fn in_process_pair<T: Send + 'static>(
    name: &str,
    worker: fn(usize, MultiWorkerConfig) -> T,
) -> Vec<T> {
    let dir = std::env::temp_dir().join(format!("cohort-mwms-{name}-{}", std::process::id()));
    let ca = ClusterCa::generate(name).unwrap();
    let mut addrs = Vec::new();
    // Held until both are picked: a port released at once could be picked twice.
    let mut held = Vec::new();
    for i in 0..2 {
        ca.issue(&NodeId::new("worker", i))
            .unwrap()
            .save(&dir)
            .unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        addrs.push(format!("\"{}\"", socket.local_addr().unwrap()));
        held.push(socket);
    }
    drop(held);
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let tf_config = format!(
                r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {i}}}}}"#,
                addrs.join(", ")
            );
            let dir = dir.clone();
            std::thread::spawn(move || {
                let cluster = ClusterConfig::from_tf_config(&tf_config).unwrap();
                worker(i, MultiWorkerConfig::new(cluster, dir))
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    out
}
