//! The template runs as a local cluster of its own processes and its model learns.

use std::process::Command;

#[test]
fn the_template_trains_as_a_local_cluster() {
    let output = Command::new(env!("CARGO_BIN_EXE_cohort-template"))
        .args(["launch", "--workers", "2", "--ps", "1"])
        .output()
        .expect("run the template");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("mean squared error"))
        .unwrap_or_else(|| panic!("no result line:\n{stdout}\n{stderr}"));
    let numbers: Vec<f32> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    let (first, last) = (numbers[numbers.len() - 3], numbers[numbers.len() - 1]);
    assert!(
        last < first / 4.0,
        "the error fell from {first} to {last} only: {line}"
    );
}
