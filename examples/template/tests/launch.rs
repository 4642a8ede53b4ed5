//! The template runs as a local cluster of its own processes and its model learns.

use std::process::Command;

mod support;

#[test]
fn the_template_trains_as_a_local_cluster() {
    let output = Command::new(env!("CARGO_BIN_EXE_cohort-template"))
        .args(["launch", "--workers", "2", "--ps", "1"])
        .output()
        .expect("run the template");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    support::assert_the_model_learned(&stdout);
}
