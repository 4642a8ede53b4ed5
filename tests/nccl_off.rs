//! A build without the feature `nccl`: `cohort nccl info` and `cohort bench nccl` say the build
//! has no NCCL and how to get it, with exit code 1 (tests/nccl.rs covers the feature on).
#![cfg(not(feature = "nccl"))]

use std::process::Command;

#[test]
fn without_the_feature_nccl_commands_say_the_build_has_none() {
    for args in [&["nccl", "info"][..], &["bench", "nccl"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args(args)
            .output()
            .expect("run the cohort binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("this build of cohort has no NCCL"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("--features nccl"), "{args:?}: {stderr}");
    }
}
