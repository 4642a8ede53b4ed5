//! A build without the feature `nccl`: `cohort nccl info` and `cohort bench nccl` say the build
//! has no NCCL and how to get it, with exit code 1, and MultiWorkerMirrored on NCCL is refused
//! by key saying the same (tests/nccl.rs covers the feature on).
#![cfg(not(feature = "nccl"))]

use std::process::Command;

use cohort::cluster::ClusterConfig;
use cohort::strategy::{Communication, MultiWorkerConfig, MultiWorkerMirrored, StrategyError};

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

#[test]
fn without_the_feature_nccl_multi_worker_mirrored_on_nccl_is_refused_by_key() {
    let tf_config =
        r#"{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}"#;
    let cluster = ClusterConfig::from_tf_config(tf_config).unwrap();
    let mut config = MultiWorkerConfig::new(cluster, "no-certs-needed");
    config.communication = Communication::Nccl { device: 0 };
    match MultiWorkerMirrored::new(config) {
        Err(StrategyError::Config { key, detail }) => {
            assert_eq!(key, "communication", "{detail}");
            assert!(
                detail.contains("this build of cohort has no NCCL"),
                "{detail}"
            );
            assert!(detail.contains("--features nccl"), "{detail}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["mwms-member", "--certs", "no-certs-needed"])
        .args(["--communication", "nccl"])
        .env("TF_CONFIG", tf_config)
        .output()
        .expect("run the cohort binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("communication: nccl:0: this build of cohort has no NCCL"),
        "{stderr}"
    );
}
