//! A cluster of "machines" without the launcher: each task of the demo job (1 chief, 2
//! parameter servers, 2 workers) runs the built `cohort` binary in its own network namespace
//! with its own IP, reaches its peers by host name through its own hosts file, and is
//! restarted with the same environment by a kubelet-like supervisor when it exits with 128 or
//! more (Kubeflow's `restartPolicy: ExitCode`); nothing gives it an incarnation. Each test
//! injects one fault mid-training and checks that the job finishes with the ledger whole and
//! every closure's effect applied exactly once (`ns_support`).
//!
//! Needs root and iproute2 (network namespaces); elsewhere each test prints SKIPPED and passes.

mod ns_support;

use std::time::Duration;

use ns_support::{Cluster, MIDWAY, TOTAL_CLOSURES};

#[test]
fn a_worker_killed_mid_training_is_restarted_and_nothing_is_lost() {
    let Some(cluster) = Cluster::start("worker-kill", &[]) else {
        return;
    };
    cluster.wait_for_chief_line(MIDWAY);
    let worker = cluster.kubelet("worker-1");
    assert!(worker.kill(), "worker-1 was running");
    assert!(
        worker.wait_starts(2, Duration::from_secs(20)),
        "the kubelet restarts worker-1"
    );
    cluster.assert_whole();
    assert_eq!(worker.exits().first(), Some(&137), "{:?}", worker.exits());
    // No server was lost: each applied every closure's push once.
    assert_eq!(cluster.ps_applied(), [TOTAL_CLOSURES, TOTAL_CLOSURES]);
}

#[test]
fn a_parameter_server_killed_mid_training_is_restored_and_nothing_is_lost() {
    let Some(cluster) = Cluster::start("ps-kill", &[]) else {
        return;
    };
    cluster.wait_for_chief_line(MIDWAY);
    let ps = cluster.kubelet("ps-1");
    assert!(ps.kill(), "ps-1 was running");
    let ledger = cluster.assert_whole();
    assert_eq!(ps.exits().first(), Some(&137), "{:?}", ps.exits());
    assert!(
        ledger["ps_restores"].as_u64().unwrap() >= 1,
        "the servers were restored from a checkpoint: {ledger}"
    );
}

#[test]
fn the_chief_killed_mid_training_comes_back_from_its_checkpoint_and_the_job_finishes() {
    let Some(cluster) = Cluster::start("chief-kill", &[]) else {
        return;
    };
    cluster.wait_for_chief_line(MIDWAY);
    let chief = cluster.kubelet("chief-0");
    assert!(chief.kill(), "the chief was running");
    cluster.assert_whole();
    assert_eq!(chief.exits().first(), Some(&137), "{:?}", chief.exits());
    assert!(
        cluster.summary().contains("steps: "),
        "the restarted chief printed the summary"
    );
    assert!(
        chief.log().contains("resumed from checkpoint"),
        "the restarted chief resumed from its checkpoint"
    );
}

#[test]
fn a_parameter_server_moved_to_a_new_ip_under_its_name_is_reached_there() {
    let Some(mut cluster) = Cluster::start("ps-move", &[]) else {
        return;
    };
    cluster.wait_for_chief_line(MIDWAY);
    // As a pod rescheduled on another node: it dies, comes back with another IP under the
    // same name, and every host's resolver says so.
    cluster.kill_and_hold("ps-1");
    cluster
        .net
        .move_host("ps-1", &ns_support::netns::address(40));
    cluster.kubelet("ps-1").release();
    let ledger = cluster.assert_whole();
    assert!(
        ledger["ps_restores"].as_u64().unwrap() >= 1,
        "the moved server was restored at its new address: {ledger}"
    );
}

/// Starts `short` 10 s after the others, its name unpublished until then (as DNS before its
/// pod exists), and checks that the job waits for it and finishes whole.
fn started_10s_late(short: &str) {
    let Some(mut cluster) = Cluster::start(&format!("{short}-late"), &[short]) else {
        return;
    };
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        !cluster.kubelet("chief-0").log().contains("== summary"),
        "nothing finished without {short}"
    );
    cluster.net.publish(short);
    cluster.kubelet(short).release();
    cluster.assert_whole();
    assert_eq!(cluster.ps_applied(), [TOTAL_CLOSURES, TOTAL_CLOSURES]);
}

#[test]
fn a_worker_started_10s_late_joins_and_the_job_finishes() {
    started_10s_late("worker-1");
}

#[test]
fn a_parameter_server_started_10s_late_joins_and_the_job_finishes() {
    started_10s_late("ps-1");
}
