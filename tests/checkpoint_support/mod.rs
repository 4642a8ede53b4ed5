//! Shared helpers for the checkpoint tests: a self-removing temporary root, a checkpoint with
//! every feature the format carries (sharded variables, slots, NaN payloads, ledger), and the
//! manifest's checksum written as its format says, apart from the crate's writer.

#![allow(dead_code)]

/// Skips, counted (`tests/skip_support`).
#[path = "../skip_support/mod.rs"]
pub mod skip;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::checkpoint::{
    slot_tensor_name, Checkpoint, Dtype, Ledger, TensorBytes, MANIFEST_CHECKSUM_FIELD,
    MANIFEST_TRAILER_BYTES,
};
use cohort::layout::{Layout, Shard};
use sha2::{Digest, Sha256};

/// A unique directory under the system temp dir, removed on drop.
pub struct TempRoot {
    path: PathBuf,
}

impl TempRoot {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "cohort-test-{tag}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp root");
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// F32 bit patterns that must survive unchanged: NaNs with payloads (quiet, signalling,
/// negative), signed zero, infinities, a subnormal.
pub const F32_SPECIAL_BITS: [u32; 8] = [
    0x7fc0_0001,
    0xffc1_2345,
    0x7f80_0001,
    0x8000_0000,
    0x7f80_0000,
    0xff80_0000,
    0x0000_0001,
    0x3f80_0000,
];

/// A two-PS checkpoint at `step`:
/// - `dense/kernel` F32 [4, 3] on PS 0 with Adam slots `m`, `v` (holds the special bits);
/// - `dense/bias` F64 [3] on PS 1 with slot `m`;
/// - `emb/table` F32 [10, 4] split rows 0..6 on PS 0 and 6..10 on PS 1, slot `accumulator`;
/// - `global_step` I64 scalar on PS 1.
pub fn sample_checkpoint(step: u64) -> Checkpoint {
    let s = step as f32;
    let mut c = Checkpoint::new(step, 2);
    c.layout = vec![
        Layout::unsharded("dense/kernel", Dtype::F32, vec![4, 3], 0),
        Layout::unsharded("dense/bias", Dtype::F64, vec![3], 1),
        Layout {
            name: "emb/table".into(),
            dtype: Dtype::F32,
            shape: vec![10, 4],
            shards: vec![Shard { ps: 0, rows: 0..6 }, Shard { ps: 1, rows: 6..10 }],
        },
        Layout::unsharded("global_step", Dtype::I64, vec![], 1),
    ];
    let mut kernel: Vec<f32> = F32_SPECIAL_BITS
        .iter()
        .map(|&b| f32::from_bits(b))
        .collect();
    kernel.extend([s, -s, 0.5 * s, 1e-3 * s]);
    let f32s = |shape: Vec<usize>, v: &[f32]| TensorBytes::from_f32(shape, v).unwrap();
    let ps0 = &mut c.shards[0].tensors;
    ps0.insert("dense/kernel".into(), f32s(vec![4, 3], &kernel));
    ps0.insert(
        slot_tensor_name("dense/kernel", "m"),
        f32s(vec![4, 3], &[0.1 * s; 12]),
    );
    ps0.insert(
        slot_tensor_name("dense/kernel", "v"),
        f32s(vec![4, 3], &[0.2 * s; 12]),
    );
    let emb: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 + s).collect();
    ps0.insert("emb/table/part_0".into(), f32s(vec![6, 4], &emb[..24]));
    ps0.insert(
        slot_tensor_name("emb/table/part_0", "accumulator"),
        f32s(vec![6, 4], &[0.1; 24]),
    );
    let ps1 = &mut c.shards[1].tensors;
    let bias = [
        f64::from_bits(0x7ff8_0000_dead_beef),
        -0.0,
        step as f64 / 3.0,
    ];
    ps1.insert(
        "dense/bias".into(),
        TensorBytes::from_f64(vec![3], &bias).unwrap(),
    );
    ps1.insert(
        slot_tensor_name("dense/bias", "m"),
        TensorBytes::from_f64(vec![3], &[1e-300, f64::MIN_POSITIVE, f64::MAX]).unwrap(),
    );
    ps1.insert("emb/table/part_1".into(), f32s(vec![4, 4], &emb[24..]));
    ps1.insert(
        slot_tensor_name("emb/table/part_1", "accumulator"),
        f32s(vec![4, 4], &[0.1; 16]),
    );
    ps1.insert(
        "global_step".into(),
        TensorBytes::from_i64(vec![], &[step as i64]).unwrap(),
    );
    c.dataset_positions = BTreeMap::from([(0, 10 * step), (1, 10 * step + 3)]);
    let mut ledger = Ledger {
        next_closure_id: step + 2,
        counts: cohort::ledger::Ledger {
            scheduled: step + 2,
            committed: step,
            redispatched: 3,
            rejected_stale: 1,
            rolled_back: 2,
            ps_restores: 1,
            pending: 2,
            ..Default::default()
        },
        ..Ledger::default()
    };
    ledger.committed_ids.extend(0..step);
    ledger.pending_ids.extend([step, step + 1]);
    c.ledger = ledger;
    c.extra = serde_json::json!({ "optimizer": "adam", "learning_rate": 0.001 });
    c
}

/// Names of the entries directly under `root`, sorted.
pub fn entries(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Temporary (`.tmp-`) entries directly under `root`.
pub fn temp_entries(root: &Path) -> Vec<String> {
    entries(root)
        .into_iter()
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

/// The bytes of a `manifest.json` holding `manifest` (any JSON object; a checksum field in it
/// is dropped) with its checksum as the format defines it: the last field, the SHA-256 of the
/// pretty-printed bytes before it. Lets a test change a manifest and still get past the
/// checksum to the checks behind it.
pub fn seal_manifest(manifest: &serde_json::Value) -> Vec<u8> {
    let mut manifest = manifest.clone();
    manifest
        .as_object_mut()
        .expect("a manifest is a JSON object")
        .remove(MANIFEST_CHECKSUM_FIELD);
    let pretty = serde_json::to_vec_pretty(&manifest).unwrap();
    let covered = pretty.strip_suffix(b"\n}").expect("pretty JSON object");
    let mut bytes = covered.to_vec();
    bytes.extend_from_slice(b",\n  \"manifest_sha256\": \"");
    bytes.extend_from_slice(hex::encode(Sha256::digest(covered)).as_bytes());
    bytes.extend_from_slice(b"\"\n}\n");
    assert_eq!(bytes.len(), covered.len() + MANIFEST_TRAILER_BYTES);
    bytes
}

/// Reads `manifest.json` at `path`, applies `edit` to its JSON, and writes it back sealed.
pub fn edit_sealed_manifest(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(path, seal_manifest(&manifest)).unwrap();
}

/// Bound on each Python run.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs python3 with `args`, bounded in time; `None` if python3 cannot be started.
pub fn run_python(args: &[&str]) -> Option<(bool, String)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let out_path =
        std::env::temp_dir().join(format!("cohort-python-out-{}-{nanos}", std::process::id()));
    let spawned = std::fs::File::create(&out_path).and_then(|out| {
        Command::new("python3")
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
    });
    let Ok(mut child) = spawned else {
        let _ = std::fs::remove_file(&out_path);
        return None;
    };
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python3") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&out_path);
            panic!("python3 {args:?} ran past {PYTHON_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    Some((status.success(), output))
}

/// Whether python3 has the `safetensors` and `numpy` packages; when not, records that the
/// running test skips its Python part (`skip_support`).
pub fn python_has_safetensors() -> bool {
    let probe = run_python(&["-c", "import safetensors, numpy"]);
    if matches!(&probe, Some((true, _))) {
        return true;
    }
    skip::skip(
        skip::Part::Python,
        &format!(
            "its Python part: python3 with the `safetensors` and `numpy` packages is not \
             available (pip install safetensors numpy): {probe:?}"
        ),
    );
    false
}

/// Bound on one `cohort` command.
pub const COHORT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a `cohort` command did.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Fails the test if the process panicked.
    pub fn expect_no_panic(&self) {
        assert!(
            !self.stderr.contains("panicked"),
            "cohort panicked:\n{}",
            self.stderr
        );
    }
}

/// Runs the `cohort` binary with `args`, bounded in time.
pub fn cohort(args: &[&str]) -> Output {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let base = std::env::temp_dir().join(format!("cohort-cli-out-{}-{nanos}", std::process::id()));
    let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("start cohort");
    let deadline = Instant::now() + COHORT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for cohort") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cohort {args:?} ran past {COHORT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        text
    };
    Output {
        code: status.code(),
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}
