//! The shard files load unchanged in Python's `safetensors` (DESIGN.md §5): runs
//! `tests/python/check_safetensors.py` on a saved checkpoint when python3 has `safetensors` and
//! `numpy`, and says plainly that it skipped otherwise (CI installs both).

mod checkpoint_support;
use checkpoint_support::skip::{self as skip_support, Part};

use std::path::Path;
use std::time::Instant;

use checkpoint_support::{run_python, sample_checkpoint, TempRoot};
use cohort::checkpoint::{CheckpointManager, CheckpointPolicy};

#[test]
fn checkpoint_python_interop() {
    let probe = run_python(&["-c", "import safetensors, numpy"]);
    if !matches!(&probe, Some((true, _))) {
        skip_support::skip(
            Part::Python,
            &format!(
                "python3 with the `safetensors` and `numpy` packages is not available (pip \
                 install safetensors numpy): {probe:?}"
            ),
        );
        return;
    }
    let root = TempRoot::new("ckpt-python");
    let t0 = Instant::now();
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 1,
    };
    let mut manager = CheckpointManager::new(root.path(), policy, t0).unwrap();
    let saved = sample_checkpoint(200);
    let dir = manager.save(&saved, t0).unwrap();
    let expected = root.path().join("expected.json");
    std::fs::write(
        &expected,
        serde_json::to_vec_pretty(&saved.tensor_report()).unwrap(),
    )
    .unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_safetensors.py");
    let args = [
        script.to_str().unwrap(),
        dir.to_str().unwrap(),
        expected.to_str().unwrap(),
    ];
    let (ok, output) = run_python(&args).expect("python3 ran for the probe");
    println!("{output}");
    assert!(ok, "Python check failed:\n{output}");
    let tensors: usize = saved.shards.iter().map(|s| s.tensors.len()).sum();
    assert!(
        output.contains(&format!("OK: {tensors} tensors")),
        "{output}"
    );

    // The check can fail: a value that differs from the report is caught.
    let mut report = saved.tensor_report();
    report["files"]["shard-1-of-2.safetensors"]["global_step"]["data_hex"] =
        serde_json::Value::String(hex::encode(201i64.to_le_bytes()));
    std::fs::write(&expected, serde_json::to_vec(&report).unwrap()).unwrap();
    let (ok, output) = run_python(&args).expect("python3 ran");
    assert!(!ok, "a wrong expected value must fail the check:\n{output}");
    assert!(output.contains("global_step: values differ"), "{output}");
}
