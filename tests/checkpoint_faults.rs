//! Crashes during a save and corrupt checkpoints (CKPT-1): restore never picks a partial or
//! corrupt checkpoint (the manifest included: it carries its own checksum), and says which
//! file made it skip one.

mod checkpoint_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use checkpoint_support::{
    edit_sealed_manifest, entries, sample_checkpoint, seal_manifest, temp_entries, TempRoot,
};
use cohort::checkpoint::{
    read_checkpoint, CheckpointManager, CheckpointPolicy, FailAction, FailSite, LoadError,
    Manifest, ManifestError, RestoreOutcome, SaveError, FAILPOINT_ENV, FAILPOINT_EXIT_CODE,
    FORMAT_VERSION, MANIFEST_CHECKSUM_FIELD, MANIFEST_TRAILER_BYTES,
};
use sha2::{Digest, Sha256};

/// Set in the child process: the checkpoint root it saves into.
const CHILD_ROOT_ENV: &str = "COHORT_TEST_CKPT_CRASH_ROOT";
/// Set in the child process: the step it saves.
const CHILD_STEP_ENV: &str = "COHORT_TEST_CKPT_CRASH_STEP";
/// Bound on the child process's run time.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

fn policy(keep_last: usize) -> CheckpointPolicy {
    CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last,
    }
}

/// Not a test on its own: when re-executed by the crash test with [`CHILD_ROOT_ENV`] set, it
/// saves a checkpoint with a failpoint in the environment and the process dies mid-save.
#[test]
fn crash_child_entry() {
    let Ok(root) = std::env::var(CHILD_ROOT_ENV) else {
        return;
    };
    let step: u64 = std::env::var(CHILD_STEP_ENV).unwrap().parse().unwrap();
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(&root, policy(1), t0).unwrap();
    let result = manager.save(&sample_checkpoint(step), t0);
    panic!("the failpoint should have ended the process; save returned {result:?}");
}

#[test]
fn ckpt1_process_crash_mid_save_leaves_previous_checkpoint_restored() {
    for site in [
        FailSite::MidShard,
        FailSite::BeforeManifest,
        FailSite::BeforePublish,
    ] {
        let root = TempRoot::new("ckpt-child-crash");
        let t0 = Instant::now();
        let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
        manager.save(&sample_checkpoint(100), t0).unwrap();

        let status = run_crashing_child(root.path(), 200, site);
        assert_eq!(
            status.code(),
            Some(FAILPOINT_EXIT_CODE),
            "child must die at failpoint {site}: {status:?}"
        );
        // The child really got into the save: its temporary directory holds shard bytes.
        let temps = temp_entries(root.path());
        assert_eq!(temps.len(), 1, "{site}: {:?}", entries(root.path()));
        let temp_dir = root.path().join(&temps[0]);
        assert!(
            temp_dir.join("shard-0-of-2.safetensors").is_file(),
            "{site}"
        );
        assert_eq!(
            temp_dir.join("manifest.json").exists(),
            site == FailSite::BeforePublish,
            "{site}"
        );

        let mut fresh = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
        let outcome = fresh.restore_latest().unwrap();
        let restored = outcome.restored.expect("previous checkpoint");
        assert_eq!(restored.checkpoint, sample_checkpoint(100), "{site}");
        assert!(outcome.skipped.is_empty(), "{site}");
        assert_eq!(outcome.removed_temp, vec![temp_dir], "{site}");
        assert_eq!(entries(root.path()), vec!["ckpt-100"], "{site}");
    }
}

#[test]
fn ckpt1_injected_crash_at_every_site_in_process() {
    for site in FailSite::ALL {
        let root = TempRoot::new("ckpt-hook-crash");
        let t0 = Instant::now();
        let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
        manager.save(&sample_checkpoint(100), t0).unwrap();
        manager.set_failpoint_hook(Some(Arc::new(move |at| {
            if at == site {
                FailAction::Crash
            } else {
                FailAction::Continue
            }
        })));
        let err = manager.save(&sample_checkpoint(200), t0).unwrap_err();
        assert!(
            matches!(err, SaveError::InjectedCrash { site: s } if s == site),
            "{err}"
        );

        let mut fresh = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
        let outcome = fresh.restore_latest().unwrap();
        let expected_step = if site == FailSite::BeforeRetention {
            200
        } else {
            100
        };
        let restored = outcome.restored.expect("a checkpoint");
        assert_eq!(
            restored.checkpoint,
            sample_checkpoint(expected_step),
            "{site}"
        );
        assert!(outcome.skipped.is_empty(), "{site}");
        assert_eq!(
            outcome.removed_temp.len(),
            usize::from(site != FailSite::BeforeRetention)
        );
        assert!(temp_entries(root.path()).is_empty());
    }
}

#[test]
fn ckpt1_flipped_byte_in_shard_is_detected_and_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-flip");
    let shard = root.path().join("ckpt-200/shard-1-of-2.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();

    let outcome = manager.restore_latest().unwrap();
    let message = only_skip(&outcome, 200);
    assert!(
        message.starts_with("ckpt-200/shard-1-of-2.safetensors: checksum mismatch"),
        "{message}"
    );
    assert!(matches!(
        outcome.skipped[0].error,
        LoadError::ChecksumMismatch { .. }
    ));
    assert_eq!(restored_step(&outcome), Some(100));
}

#[test]
fn ckpt1_truncated_shard_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-truncate");
    let shard = root.path().join("ckpt-200/shard-0-of-2.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();

    let outcome = manager.restore_latest().unwrap();
    let message = only_skip(&outcome, 200);
    assert!(
        message.starts_with("ckpt-200/shard-0-of-2.safetensors: size mismatch"),
        "{message}"
    );
    assert_eq!(restored_step(&outcome), Some(100));
}

#[test]
fn ckpt1_deleted_shard_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-delete");
    std::fs::remove_file(root.path().join("ckpt-200/shard-1-of-2.safetensors")).unwrap();

    let outcome = manager.restore_latest().unwrap();
    let message = only_skip(&outcome, 200);
    assert!(
        message.starts_with("ckpt-200/shard-1-of-2.safetensors: missing"),
        "{message}"
    );
    assert_eq!(restored_step(&outcome), Some(100));
}

#[test]
fn ckpt1_garbage_or_missing_manifest_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-manifest");
    let manifest = root.path().join("ckpt-200/manifest.json");
    for garbage in [
        &b"\x00\xffnot json"[..],
        b"",
        b"{\"format\": \"cohort-checkpoint\"}",
        b"[1, 2",
    ] {
        std::fs::write(&manifest, garbage).unwrap();
        let outcome = manager.restore_latest().unwrap();
        let message = only_skip(&outcome, 200);
        assert!(
            message.starts_with("ckpt-200/manifest.json: no manifest checksum"),
            "{message}"
        );
        assert_eq!(restored_step(&outcome), Some(100));
    }
    std::fs::remove_file(&manifest).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert!(only_skip(&outcome, 200).starts_with("ckpt-200/manifest.json: missing"));
    assert_eq!(restored_step(&outcome), Some(100));
}

/// CKPT-1: every single-bit flip of a real manifest is refused by the manifest reader that
/// restore uses; one flip per byte (the bit drawn from a fixed seed) goes through the disk and
/// a whole restore, which skips the manifest, names it, and restores the previous checkpoint.
#[test]
fn ckpt1_every_bit_flip_in_the_manifest_falls_back_to_the_previous_checkpoint() {
    const SEED: u64 = 0x5eed_c4b1;
    let (root, mut manager) = two_checkpoints("ckpt-manifest-flip");
    let path = root.path().join("ckpt-200/manifest.json");
    let original = std::fs::read(&path).unwrap();
    // The sample's manifest carries layout, slots, positions and a ledger: every field kind.
    assert!(original.len() > 1000, "{} bytes", original.len());
    Manifest::from_file_bytes(&original).unwrap();
    let mut mismatches = 0;
    for at in 0..original.len() {
        let restored_bit = splitmix64(SEED ^ at as u64) % 8;
        for bit in 0..8 {
            let what = format!("byte {at} bit {bit} (seed {SEED:#x})");
            let mut flipped = original.clone();
            flipped[at] ^= 1 << bit;
            match Manifest::from_file_bytes(&flipped) {
                Err(ManifestError::ChecksumMismatch { .. }) => mismatches += 1,
                Err(ManifestError::ChecksumMissing(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
            if bit == restored_bit {
                std::fs::write(&path, &flipped).unwrap();
                assert_manifest_skipped(&manager.restore_latest().unwrap(), &what);
            }
        }
    }
    // Flips in the covered bytes are caught by the digest itself, not by their form only.
    let covered_bits = 8 * (original.len() - MANIFEST_TRAILER_BYTES);
    assert!(mismatches >= covered_bits, "{mismatches} of {covered_bits}");
    std::fs::write(&path, &original).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert!(outcome.skipped.is_empty());
    assert_eq!(restored_step(&outcome), Some(200));
}

/// CKPT-1: a manifest cut short at any length (a torn write) is refused by the manifest
/// reader; every 16th length and every cut inside the checksum trailer go through the disk
/// and a whole restore, which falls back to the previous checkpoint.
#[test]
fn ckpt1_truncated_manifest_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-manifest-truncate");
    let path = root.path().join("ckpt-200/manifest.json");
    let original = std::fs::read(&path).unwrap();
    let trailer_start = original.len() - MANIFEST_TRAILER_BYTES;
    for len in 0..original.len() {
        let what = format!("truncated to {len} bytes");
        assert!(
            matches!(
                Manifest::from_file_bytes(&original[..len]),
                Err(ManifestError::ChecksumMissing(_) | ManifestError::ChecksumMismatch { .. })
            ),
            "{what}"
        );
        if len % 16 == 0 || len >= trailer_start {
            std::fs::write(&path, &original[..len]).unwrap();
            assert_manifest_skipped(&manager.restore_latest().unwrap(), &what);
        }
    }
    // A cut inside the trailer reads as no checksum at all.
    std::fs::write(&path, &original[..original.len() - 4]).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert!(
        only_skip(&outcome, 200).starts_with("ckpt-200/manifest.json: no manifest checksum"),
        "{}",
        outcome.skipped[0]
    );
}

/// CKPT-1: a manifest that is valid JSON but whose checksum field was changed, removed or
/// renamed is skipped, whatever the rest says; the reason names the manifest and the digests.
#[test]
fn ckpt1_manifest_with_valid_json_but_altered_checksum_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-manifest-checksum");
    let path = root.path().join("ckpt-200/manifest.json");
    let original = std::fs::read(&path).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let digest = json[MANIFEST_CHECKSUM_FIELD].as_str().unwrap().to_string();
    let text = String::from_utf8(original.clone()).unwrap();

    // Another well-formed digest: that of the checkpoint at 100's manifest.
    let other: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.path().join("ckpt-100/manifest.json")).unwrap())
            .unwrap();
    let other_digest = other[MANIFEST_CHECKSUM_FIELD].as_str().unwrap();
    let altered = text.replace(&digest, other_digest);
    let reparsed: serde_json::Value = serde_json::from_str(&altered).unwrap();
    assert_eq!(reparsed[MANIFEST_CHECKSUM_FIELD], other_digest);
    std::fs::write(&path, &altered).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert_manifest_skipped(&outcome, "another digest");
    let message = outcome.skipped[0].to_string();
    assert!(
        message.starts_with("ckpt-200/manifest.json: manifest checksum mismatch")
            && message.contains(other_digest)
            && message.contains(&digest),
        "{message}"
    );

    // The right digest in upper case: the same number to a case-blind reader.
    std::fs::write(&path, text.replace(&digest, &digest.to_uppercase())).unwrap();
    assert_manifest_skipped(&manager.restore_latest().unwrap(), "upper case");

    // The checksum field removed, or renamed: it looks like a manifest without one.
    let mut removed = json.clone();
    removed
        .as_object_mut()
        .unwrap()
        .remove(MANIFEST_CHECKSUM_FIELD);
    std::fs::write(&path, serde_json::to_vec_pretty(&removed).unwrap()).unwrap();
    assert_manifest_skipped(&manager.restore_latest().unwrap(), "removed");
    std::fs::write(
        &path,
        text.replace("\"manifest_sha256\"", "\"manifest_sha257\""),
    )
    .unwrap();
    assert_manifest_skipped(&manager.restore_latest().unwrap(), "renamed");

    // A field changed under an untouched checksum.
    std::fs::write(&path, text.replace("\"step\": 200", "\"step\": 201")).unwrap();
    assert_manifest_skipped(&manager.restore_latest().unwrap(), "step edited");

    // The same content sealed again verifies: the checksum is all that was wrong.
    std::fs::write(&path, seal_manifest(&json)).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert!(outcome.skipped.is_empty(), "{:?}", outcome.skipped);
    assert_eq!(restored_step(&outcome), Some(200));
}

/// A manifest of format version 1 (written before manifests carried a checksum) is skipped,
/// and the reason says so; the previous checkpoint is restored.
#[test]
fn ckpt1_version_1_manifest_without_checksum_is_skipped_with_its_reason() {
    let (root, mut manager) = two_checkpoints("ckpt-manifest-v1");
    let path = root.path().join("ckpt-200/manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json.as_object_mut()
        .unwrap()
        .remove(MANIFEST_CHECKSUM_FIELD);
    json["format_version"] = 1.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert_manifest_skipped(&outcome, "version 1");
    let message = outcome.skipped[0].to_string();
    assert!(
        message.starts_with(
            "ckpt-200/manifest.json: no manifest checksum: format version 1 manifest, written \
             before manifests carried a checksum"
        ),
        "{message}"
    );
}

#[test]
fn manifest_of_another_step_or_version_is_skipped() {
    let (root, mut manager) = two_checkpoints("ckpt-manifest-fields");
    edit_manifest(root.path(), 200, |m| m["step"] = 300.into());
    let outcome = manager.restore_latest().unwrap();
    let message = only_skip(&outcome, 200);
    assert!(message.contains("manifest says step 300"), "{message}");

    edit_manifest(root.path(), 200, |m| {
        m["step"] = 200.into();
        m["format_version"] = 99.into();
    });
    let outcome = manager.restore_latest().unwrap();
    assert!(only_skip(&outcome, 200).contains("version 99"));

    // A manifest pointing outside its directory is refused, not followed.
    edit_manifest(root.path(), 200, |m| {
        m["format_version"] = FORMAT_VERSION.into();
        m["files"][0]["name"] = "../ckpt-100/shard-0-of-2.safetensors".into();
    });
    let outcome = manager.restore_latest().unwrap();
    assert!(only_skip(&outcome, 200).contains("expected \"shard-0-of-2.safetensors\""));
    assert_eq!(restored_step(&outcome), Some(100));
}

#[test]
fn ckpt1_shard_with_wrong_dtype_is_skipped_even_with_matching_checksum() {
    let (root, mut manager) = two_checkpoints("ckpt-dtype");
    // Rewrite shard 0 with `dense/kernel` as I32 (same bytes), and make the manifest's
    // checksum agree, so that only the layout check can catch it.
    let path = root.path().join("ckpt-200/shard-0-of-2.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            if name == "dense/kernel" {
                let retyped = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::I32,
                    view.shape().to_vec(),
                    view.data(),
                )
                .unwrap();
                (name, retyped)
            } else {
                (name, view)
            }
        })
        .collect();
    let mut meta = std::collections::HashMap::new();
    meta.insert("step".to_string(), "200".to_string());
    let rewritten = safetensors::serialize(tensors, Some(meta)).unwrap();
    replace_file_and_fix_manifest(root.path(), 200, 0, &rewritten);

    let outcome = manager.restore_latest().unwrap();
    let message = only_skip(&outcome, 200);
    assert!(
        message.starts_with("ckpt-200/shard-0-of-2.safetensors: "),
        "{message}"
    );
    assert!(
        message.contains("\"dense/kernel\" is I32, layout says F32"),
        "{message}"
    );
    assert_eq!(restored_step(&outcome), Some(100));
}

#[test]
fn every_checkpoint_corrupt_restores_nothing_and_names_each() {
    let (root, mut manager) = two_checkpoints("ckpt-all-corrupt");
    for step in [100, 200] {
        let shard = root
            .path()
            .join(format!("ckpt-{step}/shard-0-of-2.safetensors"));
        let mut bytes = std::fs::read(&shard).unwrap();
        bytes[20] ^= 0x80;
        std::fs::write(&shard, &bytes).unwrap();
    }
    let outcome = manager.restore_latest().unwrap();
    assert!(outcome.restored.is_none());
    let messages: Vec<String> = outcome.skipped.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        outcome.skipped.iter().map(|s| s.step).collect::<Vec<_>>(),
        vec![200, 100]
    );
    assert!(messages[0].starts_with("ckpt-200/shard-0-of-2.safetensors: checksum mismatch"));
    assert!(messages[1].starts_with("ckpt-100/shard-0-of-2.safetensors: checksum mismatch"));
    assert_eq!(
        manager.last_saved_step(),
        Some(200),
        "set by the earlier save, unchanged"
    );
}

/// Every truncation and many byte flips of a shard, with the manifest fixed up to match, so
/// the safetensors parser and the layout checks see the damage: errors, never a panic.
#[test]
fn damaged_shards_with_matching_manifest_never_panic() {
    let root = TempRoot::new("ckpt-damage");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
    let dir = manager.save(&sample_checkpoint(200), t0).unwrap();
    let original = std::fs::read(dir.join("shard-1-of-2.safetensors")).unwrap();
    let header_len = 8 + u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;

    let mut rejected = 0;
    let mut cases: Vec<Vec<u8>> = (0..original.len())
        .step_by(7)
        .map(|n| original[..n].to_vec())
        .collect();
    for at in (0..header_len).step_by(3) {
        for flip in [0x01u8, 0x20, 0x80] {
            let mut bytes = original.clone();
            bytes[at] ^= flip;
            cases.push(bytes);
        }
    }
    let mut extended = original.clone();
    extended.extend_from_slice(&[0u8; 16]);
    cases.push(extended);
    for bytes in &cases {
        replace_file_and_fix_manifest(root.path(), 200, 1, bytes);
        match read_checkpoint(&dir) {
            Ok(loaded) => assert_eq!(loaded.checkpoint.num_ps(), 2),
            Err(e) => {
                rejected += 1;
                assert!(e.to_string().starts_with("ckpt-200/"), "{e}");
            }
        }
    }
    assert!(
        rejected > cases.len() / 2,
        "only {rejected} of {} damaged files rejected",
        cases.len()
    );
}

// ---- helpers ----

/// A root holding valid checkpoints at steps 100 and 200, and a manager over it.
fn two_checkpoints(tag: &str) -> (TempRoot, CheckpointManager) {
    let root = TempRoot::new(tag);
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(5), t0).unwrap();
    manager.save(&sample_checkpoint(100), t0).unwrap();
    manager.save(&sample_checkpoint(200), t0).unwrap();
    (root, manager)
}

/// SplitMix64: a fixed, seedable choice without a RNG dependency.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn restored_step(outcome: &RestoreOutcome) -> Option<u64> {
    outcome.restored.as_ref().map(|l| l.checkpoint.step)
}

/// Asserts that exactly the checkpoint at `step` was skipped; returns its message.
fn only_skip(outcome: &RestoreOutcome, step: u64) -> String {
    assert_eq!(outcome.skipped.len(), 1, "{:?}", outcome.skipped);
    assert_eq!(outcome.skipped[0].step, step);
    outcome.skipped[0].to_string()
}

/// Edits checkpoint `step`'s manifest and seals it again, so that the checks behind the
/// manifest's checksum see the edit.
fn edit_manifest(root: &Path, step: u64, edit: impl FnOnce(&mut serde_json::Value)) {
    edit_sealed_manifest(&root.join(format!("ckpt-{step}/manifest.json")), edit);
}

/// Asserts that the checkpoint at 200 was skipped because of its manifest's checksum (the
/// reason names the manifest), and that the one at 100 was restored, whole.
fn assert_manifest_skipped(outcome: &RestoreOutcome, what: &str) {
    let message = only_skip(outcome, 200);
    assert!(
        message.starts_with("ckpt-200/manifest.json: "),
        "{what}: {message}"
    );
    assert!(
        matches!(
            &outcome.skipped[0].error,
            LoadError::Manifest {
                source: ManifestError::ChecksumMissing(_) | ManifestError::ChecksumMismatch { .. },
                ..
            }
        ),
        "{what}: {message}"
    );
    let restored = outcome.restored.as_ref().expect("the previous checkpoint");
    assert_eq!(restored.checkpoint, sample_checkpoint(100), "{what}");
}

/// Replaces shard `ps` of checkpoint `step` and records its new size and SHA-256.
fn replace_file_and_fix_manifest(root: &Path, step: u64, ps: usize, bytes: &[u8]) {
    let path = root.join(format!("ckpt-{step}/shard-{ps}-of-2.safetensors"));
    std::fs::write(&path, bytes).unwrap();
    let sha = hex::encode(Sha256::digest(bytes));
    edit_manifest(root, step, |m| {
        m["files"][ps]["bytes"] = bytes.len().into();
        m["files"][ps]["sha256"] = sha.into();
    });
}

/// Re-executes this test binary as a child that saves `step` under `root` with the
/// failpoint `site` set, and waits (bounded) for it to die.
fn run_crashing_child(root: &Path, step: u64, site: FailSite) -> std::process::ExitStatus {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "crash_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROOT_ENV, root)
        .env(CHILD_STEP_ENV, step.to_string())
        .env(FAILPOINT_ENV, site.as_str())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                use std::io::Read;
                let _ = pipe.read_to_string(&mut stderr);
            }
            assert!(stderr.contains(site.as_str()), "child stderr: {stderr}");
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("crash child did not exit within {CHILD_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A checkpoint that is published but does not read back whole (here a shard's byte flipped
/// on its way to disk) is refused by the save itself: it is removed, the save reports why, and
/// retention deletes nothing, so with `keep_last = 1` the previous checkpoint still restores.
#[test]
fn ckpt1_a_save_that_does_not_read_back_keeps_the_previous_checkpoint() {
    let root = TempRoot::new("ckpt-unverified");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
    manager.save(&sample_checkpoint(10), t0).unwrap();
    // Just before the rename into place, flip one byte of a shard in the temporary directory.
    let temp_root = root.path().to_path_buf();
    manager.set_failpoint_hook(Some(Arc::new(move |site| {
        if site == FailSite::BeforePublish {
            for temp in temp_entries(&temp_root) {
                let shard = temp_root.join(&temp).join("shard-0-of-2.safetensors");
                let mut bytes = std::fs::read(&shard).unwrap();
                let last = bytes.len() - 1;
                bytes[last] ^= 0x01;
                std::fs::write(&shard, bytes).unwrap();
            }
        }
        FailAction::Continue
    })));
    let err = manager.save(&sample_checkpoint(20), t0).unwrap_err();
    assert!(
        matches!(err, SaveError::Unverified { step: 20, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("does not read back whole"),
        "{err}"
    );
    manager.set_failpoint_hook(None);
    assert_eq!(entries(root.path()), vec!["ckpt-10".to_string()]);
    let outcome = manager.restore_latest().unwrap();
    assert_eq!(outcome.restored.unwrap().checkpoint.step, 10);
    // The next save goes through, and only then does retention remove step 10.
    manager.save(&sample_checkpoint(30), t0).unwrap();
    assert_eq!(entries(root.path()), vec!["ckpt-30".to_string()]);
}
