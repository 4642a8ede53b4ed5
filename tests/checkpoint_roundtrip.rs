//! Checkpoint round trips, retention and the save schedule, through the public API (CKPT-1).

mod checkpoint_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkpoint_support::{
    entries, sample_checkpoint, seal_manifest, temp_entries, TempRoot, F32_SPECIAL_BITS,
};
use cohort::checkpoint::{
    decode_checkpoint, encode_checkpoint, encode_checkpoint_at, list_checkpoints, read_checkpoint,
    write_checkpoint, CheckpointManager, CheckpointPolicy, Dtype, FailAction, FailSite, LoadError,
    SaveError, TensorBytes, ValidationError, FORMAT_VERSION, MANIFEST_CHECKSUM_FIELD,
    MANIFEST_FILE, MANIFEST_TRAILER_BYTES,
};
use cohort::layout::LayoutError;
use sha2::{Digest, Sha256};

fn policy(keep_last: usize) -> CheckpointPolicy {
    CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last,
    }
}

#[test]
fn ckpt1_round_trip_is_bit_identical() {
    let root = TempRoot::new("ckpt-roundtrip");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(3), t0).unwrap();
    let saved = sample_checkpoint(200);
    let dir = manager.save(&saved, t0).unwrap();
    assert_eq!(dir, root.path().join("ckpt-200"));

    let outcome = manager.restore_latest().unwrap();
    assert!(outcome.skipped.is_empty());
    assert!(outcome.removed_temp.is_empty());
    let loaded = outcome.restored.expect("the saved checkpoint");
    assert_eq!(loaded.dir, dir);
    // TensorBytes compares bytes, so equality is bit identity (NaN payloads included).
    assert_eq!(loaded.checkpoint, saved);

    let kernel = loaded
        .checkpoint
        .tensor(0, "dense/kernel")
        .unwrap()
        .to_f32()
        .unwrap();
    let bits: Vec<u32> = kernel.iter().map(|v| v.to_bits()).collect();
    assert_eq!(&bits[..F32_SPECIAL_BITS.len()], &F32_SPECIAL_BITS);
    let bias = loaded
        .checkpoint
        .tensor(1, "dense/bias")
        .unwrap()
        .to_f64()
        .unwrap();
    assert_eq!(bias[0].to_bits(), 0x7ff8_0000_dead_beef);
    assert_eq!(bias[1].to_bits(), (-0.0f64).to_bits());
    let step = loaded.checkpoint.tensor(1, "global_step").unwrap();
    assert_eq!(step.shape(), &[] as &[usize]);
    assert_eq!(step.to_i64().unwrap(), vec![200]);

    let m = &loaded.manifest;
    assert_eq!(m.format_version, FORMAT_VERSION);
    assert_eq!(m.step, 200);
    assert_eq!(m.num_ps, 2);
    assert_eq!(m.files.len(), 2);
    for entry in &m.files {
        let len = std::fs::metadata(dir.join(&entry.name)).unwrap().len();
        assert_eq!(len, entry.bytes, "{}", entry.name);
    }
    assert_eq!(m.slots["dense/kernel"], vec!["m", "v"]);
    assert_eq!(m.slots["dense/bias"], vec!["m"]);
    assert_eq!(m.slots["emb/table"], vec!["accumulator"]);
    assert_eq!(m.dataset_positions[&1], 2003);
    assert_eq!(m.ledger.committed_ids.len(), 200);
    assert!(m.ledger.pending_ids.contains(&201));
    assert_eq!(loaded.checkpoint.extra["optimizer"], "adam");

    // The same directory read directly, and listed.
    let again = read_checkpoint(&dir).unwrap();
    assert_eq!(again.checkpoint, saved);
    let listed = list_checkpoints(root.path()).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].step, &listed[0].dir), (200, &dir));
    // The ledger's committed ids are stored as one range, not 200 numbers.
    let manifest_text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let manifest_json: serde_json::Value = serde_json::from_str(&manifest_text).unwrap();
    assert_eq!(
        manifest_json["ledger"]["committed_ids"],
        serde_json::json!([[0, 199]])
    );
    assert_eq!(
        (m.ledger.counts.rolled_back, m.ledger.counts.ps_restores),
        (2, 1),
        "the parameter-server recovery counts travel in the manifest"
    );
}

/// CKPT-1: the manifest on disk is plain JSON whose last field is the SHA-256 of every byte
/// before that field, as the format says; its content sealed again the same way reads back
/// as the same manifest.
#[test]
fn ckpt1_manifest_on_disk_ends_with_its_own_checksum() {
    let root = TempRoot::new("ckpt-manifest-sealed");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
    let dir = manager.save(&sample_checkpoint(7), t0).unwrap();
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let (covered, trailer) = bytes.split_at(bytes.len() - MANIFEST_TRAILER_BYTES);
    let digest = hex::encode(Sha256::digest(covered));
    assert_eq!(json[MANIFEST_CHECKSUM_FIELD], digest.as_str());
    assert_eq!(
        trailer,
        format!(",\n  \"{MANIFEST_CHECKSUM_FIELD}\": \"{digest}\"\n}}\n").as_bytes()
    );
    assert_eq!(json["format_version"], FORMAT_VERSION);

    let before = read_checkpoint(&dir).unwrap().manifest;
    std::fs::write(&path, seal_manifest(&json)).unwrap();
    assert_eq!(read_checkpoint(&dir).unwrap().manifest, before);
}

/// A shard that is not a regular file (a named pipe, a link to a device that never ends) or
/// that is longer than its manifest records is refused naming the file, at once and without
/// reading more than the checkpoint's size: nothing waits for a writer or fills memory.
#[test]
fn a_shard_that_is_no_regular_file_or_longer_than_recorded_is_refused_without_reading_it_whole() {
    let root = TempRoot::new("ckpt-shard-not-a-file");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
    let dir = manager.save(&sample_checkpoint(9), t0).unwrap();
    let manifest = read_checkpoint(&dir).unwrap().manifest;
    let shard = dir.join(&manifest.files[0].name);
    let expected_file = format!("ckpt-9/{}", manifest.files[0].name);
    let recorded = manifest.files[0].bytes;

    std::fs::remove_file(&shard).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&shard)
        .status()
        .unwrap()
        .success());
    let err = read_checkpoint(&dir).expect_err("a named pipe is no shard");
    assert!(matches!(err, LoadError::NotAFile { .. }), "{err}");
    assert_eq!(err.file(), expected_file);
    assert!(err.to_string().contains("named pipe"), "{err}");

    std::fs::remove_file(&shard).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &shard).unwrap();
    let err = read_checkpoint(&dir).expect_err("a device is no shard");
    assert!(matches!(err, LoadError::NotAFile { .. }), "{err}");
    assert!(err.to_string().contains("device"), "{err}");

    std::fs::remove_file(&shard).unwrap();
    let long = vec![0u8; usize::try_from(recorded).unwrap() + 4096];
    std::fs::write(&shard, long).unwrap();
    let err = read_checkpoint(&dir).expect_err("a longer shard does not verify");
    match &err {
        LoadError::LongerThanRecorded { file, expected } => {
            assert_eq!(
                (file.as_str(), *expected),
                (expected_file.as_str(), recorded)
            );
        }
        other => panic!("expected LongerThanRecorded, got {other}"),
    }
}

#[test]
fn restore_from_empty_or_missing_root_finds_nothing() {
    let root = TempRoot::new("ckpt-empty");
    let t0 = Instant::now();
    let missing = root.path().join("not-yet");
    let mut manager = CheckpointManager::new(&missing, policy(1), t0).unwrap();
    let outcome = manager.restore_latest().unwrap();
    assert!(outcome.restored.is_none() && outcome.skipped.is_empty());
    assert!(manager.list().unwrap().is_empty());
    // The first save creates the root.
    manager.save(&sample_checkpoint(1), t0).unwrap();
    assert_eq!(entries(&missing), vec!["ckpt-1"]);
}

#[test]
fn inconsistent_content_is_rejected_before_anything_is_written() {
    let root = TempRoot::new("ckpt-invalid");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();

    let mut wrong_dtype = sample_checkpoint(10);
    wrong_dtype.shards[0].tensors.insert(
        "dense/kernel".into(),
        TensorBytes::from_i32(vec![4, 3], &[0; 12]).unwrap(),
    );
    let err = manager.save(&wrong_dtype, t0).unwrap_err();
    assert!(
        matches!(
            &err,
            SaveError::Invalid {
                source: ValidationError::WrongDtype {
                    expected: Dtype::F32,
                    found: Dtype::I32,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("dense/kernel"), "{err}");

    let mut missing_part = sample_checkpoint(10);
    missing_part.shards[1].tensors.remove("emb/table/part_1");
    let err = manager.save(&missing_part, t0).unwrap_err();
    assert!(err.to_string().contains("emb/table/part_1"), "{err}");

    let mut stray = sample_checkpoint(10);
    stray.shards[1].tensors.insert(
        "not/in/layout".into(),
        TensorBytes::from_i64(vec![1], &[1]).unwrap(),
    );
    let err = manager.save(&stray, t0).unwrap_err();
    assert!(err.to_string().contains("not/in/layout"), "{err}");

    let mut no_such_ps = sample_checkpoint(10);
    no_such_ps.layout[0].shards[0].ps = 7;
    assert!(matches!(
        manager.save(&no_such_ps, t0),
        Err(SaveError::Invalid {
            source: ValidationError::Layout(LayoutError::NoSuchPs { ps: 7, .. }),
            ..
        })
    ));

    assert!(
        entries(root.path()).is_empty(),
        "nothing written: {:?}",
        entries(root.path())
    );
    assert_eq!(manager.last_saved_step(), None);
}

#[test]
fn ckpt1_valid_checkpoint_of_same_step_is_never_replaced() {
    let root = TempRoot::new("ckpt-same-step");
    write_checkpoint(root.path(), &sample_checkpoint(5), None).unwrap();
    let mut other = sample_checkpoint(5);
    other.dataset_positions.insert(9, 9);
    let err = write_checkpoint(root.path(), &other, None).unwrap_err();
    assert!(
        matches!(err, SaveError::AlreadyExists { step: 5, .. }),
        "{err}"
    );
    assert_eq!(
        read_checkpoint(&root.path().join("ckpt-5"))
            .unwrap()
            .checkpoint,
        sample_checkpoint(5)
    );

    // A corrupt leftover under that name is replaced.
    std::fs::write(root.path().join("ckpt-5").join("manifest.json"), b"{oops").unwrap();
    write_checkpoint(root.path(), &other, None).unwrap();
    assert_eq!(
        read_checkpoint(&root.path().join("ckpt-5"))
            .unwrap()
            .checkpoint,
        other
    );
    assert_eq!(entries(root.path()), vec!["ckpt-5"]);
}

#[test]
fn ckpt1_retention_keeps_the_last_k() {
    let root = TempRoot::new("ckpt-retention");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(2), t0).unwrap();
    for step in [100, 200, 300, 400, 500] {
        manager.save(&sample_checkpoint(step), t0).unwrap();
        let steps: Vec<u64> = manager.list().unwrap().iter().map(|e| e.step).collect();
        let expected: Vec<u64> = [100, 200, 300, 400, 500]
            .into_iter()
            .filter(|&s| s <= step && s + 200 > step)
            .collect();
        assert_eq!(steps, expected);
    }
    assert_eq!(entries(root.path()), vec!["ckpt-400", "ckpt-500"]);
    let restored = manager.restore_latest().unwrap().restored.unwrap();
    assert_eq!(restored.checkpoint, sample_checkpoint(500));
}

#[test]
fn ckpt1_previous_checkpoint_survives_until_the_new_one_is_durable() {
    let root = TempRoot::new("ckpt-retention-order");
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy(1), t0).unwrap();
    manager.save(&sample_checkpoint(100), t0).unwrap();

    // At every point of the next save, check what a restore would find on disk.
    let seen: Arc<Mutex<Vec<(FailSite, bool, bool)>>> = Arc::default();
    let (seen_in_hook, root_in_hook) = (seen.clone(), root.path().to_path_buf());
    manager.set_failpoint_hook(Some(Arc::new(move |site| {
        let old_ok = read_checkpoint(&root_in_hook.join("ckpt-100")).is_ok();
        let new_ok = read_checkpoint(&root_in_hook.join("ckpt-200")).is_ok();
        seen_in_hook.lock().unwrap().push((site, old_ok, new_ok));
        FailAction::Continue
    })));
    manager.save(&sample_checkpoint(200), t0).unwrap();

    let seen = seen.lock().unwrap().clone();
    let sites: Vec<FailSite> = seen.iter().map(|s| s.0).collect();
    assert_eq!(sites, FailSite::ALL.to_vec());
    for (site, old_ok, new_ok) in seen {
        assert!(old_ok, "ckpt-100 must still verify at {site}");
        // The new one becomes visible only once published.
        assert_eq!(
            new_ok,
            site == FailSite::BeforeRetention,
            "ckpt-200 at {site}"
        );
    }
    assert_eq!(entries(root.path()), vec!["ckpt-200"]);

    // A crash between publishing and retention keeps both; the next save cleans up.
    manager.set_failpoint_hook(Some(Arc::new(|site| {
        if site == FailSite::BeforeRetention {
            FailAction::Crash
        } else {
            FailAction::Continue
        }
    })));
    let err = manager.save(&sample_checkpoint(300), t0).unwrap_err();
    assert!(matches!(
        err,
        SaveError::InjectedCrash {
            site: FailSite::BeforeRetention
        }
    ));
    assert_eq!(entries(root.path()), vec!["ckpt-200", "ckpt-300"]);
    manager.set_failpoint_hook(None);
    let restored = manager.restore_latest().unwrap().restored.unwrap();
    assert_eq!(restored.checkpoint.step, 300);
    manager.save(&sample_checkpoint(400), t0).unwrap();
    assert_eq!(entries(root.path()), vec!["ckpt-400"]);
    assert!(temp_entries(root.path()).is_empty());
}

#[test]
fn should_save_by_steps() {
    let t0 = Instant::now();
    let p = CheckpointPolicy {
        save_every_steps: Some(100),
        save_every: None,
        keep_last: 1,
    };
    let root = TempRoot::new("ckpt-steps");
    let mut manager = CheckpointManager::new(root.path(), p, t0).unwrap();
    let late = t0 + Duration::from_secs(3600);
    assert!(!manager.should_save(0, t0));
    assert!(
        !manager.should_save(99, late),
        "time does not count without save_every"
    );
    assert!(manager.should_save(100, t0));
    assert!(manager.should_save(150, t0));
    manager.save(&sample_checkpoint(150), t0).unwrap();
    assert!(!manager.should_save(150, t0), "never the same step twice");
    assert!(!manager.should_save(249, t0));
    assert!(manager.should_save(250, t0));
}

#[test]
fn should_save_by_duration_with_time_passed_in() {
    let t0 = Instant::now();
    let p = CheckpointPolicy {
        save_every_steps: None,
        save_every: Some(Duration::from_secs(60)),
        keep_last: 1,
    };
    let root = TempRoot::new("ckpt-duration");
    let mut manager = CheckpointManager::new(root.path(), p.clone(), t0).unwrap();
    assert!(!manager.should_save(1, t0 + Duration::from_secs(59)));
    assert!(manager.should_save(1, t0 + Duration::from_secs(60)));
    // A `now` before the manager's start (clocks of different origins) is not a reason to save.
    let later_start = CheckpointManager::new(root.path(), p.clone(), t0 + Duration::from_secs(600));
    assert!(!later_start
        .unwrap()
        .should_save(1, t0 + Duration::from_secs(60)));
    let t_save = t0 + Duration::from_secs(61);
    manager.save(&sample_checkpoint(7), t_save).unwrap();
    assert!(!manager.should_save(8, t_save + Duration::from_secs(59)));
    assert!(manager.should_save(8, t_save + Duration::from_secs(60)));
    assert!(!manager.should_save(7, t_save + Duration::from_secs(600)));
}

#[test]
fn should_save_counts_steps_from_the_restored_checkpoint() {
    let t0 = Instant::now();
    let root = TempRoot::new("ckpt-restore-schedule");
    write_checkpoint(root.path(), &sample_checkpoint(300), None).unwrap();
    let p = CheckpointPolicy {
        save_every_steps: Some(100),
        save_every: None,
        keep_last: 2,
    };
    let mut manager = CheckpointManager::new(root.path(), p, t0).unwrap();
    assert!(manager.should_save(300, t0));
    manager.restore_latest().unwrap().restored.unwrap();
    assert_eq!(manager.last_saved_step(), Some(300));
    assert!(!manager.should_save(300, t0));
    assert!(!manager.should_save(399, t0));
    assert!(manager.should_save(400, t0));
}

/// Any bit pattern of any supported dtype, any shapes and split points, survive a save and a
/// restore unchanged (CKPT-1 round trip, property-tested).
mod properties {
    use super::*;
    use cohort::checkpoint::{slot_tensor_name, Checkpoint};
    use cohort::layout::{Layout, Shard};
    use proptest::prelude::*;

    const DTYPES: [Dtype; 6] = [
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::I32,
        Dtype::U8,
        Dtype::BF16,
    ];

    /// (dtype index, rows, columns, split row, seed bytes)
    fn variable() -> impl Strategy<Value = (usize, usize, usize, usize, Vec<u8>)> {
        (
            0..DTYPES.len(),
            0usize..6,
            1usize..4,
            0usize..6,
            proptest::collection::vec(any::<u8>(), 1..64),
        )
    }

    fn build(vars: &[(usize, usize, usize, usize, Vec<u8>)], step: u64) -> Checkpoint {
        let mut c = Checkpoint::new(step, 2);
        for (i, (dt, rows, cols, split, seed)) in vars.iter().enumerate() {
            let dtype = DTYPES[*dt];
            let split = (*split).min(*rows);
            let name = format!("var{i}");
            let layout = Layout {
                name: name.clone(),
                dtype,
                shape: vec![*rows, *cols],
                shards: vec![
                    Shard {
                        ps: 0,
                        rows: 0..split,
                    },
                    Shard {
                        ps: 1,
                        rows: split..*rows,
                    },
                ],
            };
            for (part, spec) in layout.shards.iter().enumerate() {
                let shape = layout.shard_shape(part);
                let len = shape.iter().product::<usize>() * dtype.size_bytes();
                let bytes: Vec<u8> = seed.iter().copied().cycle().take(len).collect();
                let tensor = TensorBytes::new(dtype, shape.clone(), bytes.clone()).unwrap();
                let tensors = &mut c.shards[spec.ps as usize].tensors;
                let part_name = layout.shard_name(part);
                tensors.insert(
                    slot_tensor_name(&part_name, "m"),
                    TensorBytes::new(dtype, shape, bytes).unwrap(),
                );
                tensors.insert(part_name, tensor);
            }
            c.layout.push(layout);
            c.dataset_positions.insert(i as u32, seed.len() as u64);
            c.ledger
                .committed_ids
                .extend(seed.iter().map(|&b| u64::from(b) * 3));
        }
        c
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn any_checkpoint_round_trips(vars in proptest::collection::vec(variable(), 0..5), step in any::<u64>()) {
            let root = TempRoot::new("ckpt-prop");
            let saved = build(&vars, step);
            let dir = write_checkpoint(root.path(), &saved, None).unwrap();
            let loaded = read_checkpoint(&dir).unwrap();
            prop_assert_eq!(loaded.checkpoint, saved);
        }

        #[test]
        fn arbitrary_manifest_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let root = TempRoot::new("ckpt-prop-manifest");
            let dir = write_checkpoint(root.path(), &build(&[], 1), None).unwrap();
            std::fs::write(dir.join("manifest.json"), &bytes).unwrap();
            let err = read_checkpoint(&dir).unwrap_err();
            prop_assert!(err.to_string().starts_with("ckpt-1/manifest.json: "), "{}", err);
        }
    }
}

/// The pure encoder makes the files `write_checkpoint` writes (the manifest's creation time
/// given): the same names, the manifest last, the same sizes and contents (a shard's
/// `__metadata__` order, and so its checksum, may differ between two encodings), and the
/// decoder over those bytes loads what was encoded.
#[test]
fn ckpt1_encoded_files_are_the_files_written_and_decode_whole() {
    let root = TempRoot::new("ckpt-encode");
    let ckpt = sample_checkpoint(12);
    let dir = write_checkpoint(root.path(), &ckpt, None).expect("save");
    let on_disk = read_checkpoint(&dir).expect("read back");
    let files = encode_checkpoint_at(&ckpt, on_disk.manifest.created_unix_ms).expect("encode");

    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.last().map(String::as_str), Some(MANIFEST_FILE));
    let mut encoded = names.clone();
    encoded.sort();
    assert_eq!(entries(&dir), encoded);
    for (name, bytes) in &files {
        let disk = std::fs::read(dir.join(name)).expect("read file");
        assert_eq!(disk.len(), bytes.len(), "{name}");
    }

    let map: BTreeMap<String, Vec<u8>> = files.into_iter().collect();
    let loaded = decode_checkpoint("ckpt-12", read_from(&map, "ckpt-12")).expect("decode");
    assert_eq!(loaded.checkpoint, ckpt);
    let without_checksums = |mut m: cohort::checkpoint::Manifest| {
        for f in &mut m.files {
            f.sha256.clear();
        }
        m
    };
    assert_eq!(
        without_checksums(loaded.manifest),
        without_checksums(on_disk.manifest)
    );
}

/// CKPT-1 over in-memory files: one flipped bit in any file, a torn file or a missing one
/// fails the decode with an error naming that file.
#[test]
fn ckpt1_decode_refuses_damaged_bytes_naming_the_file() {
    let ckpt = sample_checkpoint(3);
    let files: BTreeMap<String, Vec<u8>> = encode_checkpoint(&ckpt)
        .expect("encode")
        .into_iter()
        .collect();
    for name in files.keys() {
        let expected_file = format!("ckpt-3/{name}");
        for at in [0, files[name].len() / 2, files[name].len() - 1] {
            let mut damaged = files.clone();
            damaged.get_mut(name).expect("file")[at] ^= 0x20;
            let err = decode_checkpoint("ckpt-3", read_from(&damaged, "ckpt-3"))
                .expect_err("a flipped bit must not verify");
            assert_eq!(err.file(), expected_file, "{err}");
        }
        let mut torn = files.clone();
        let len = torn[name].len();
        torn.get_mut(name).expect("file").truncate(len / 2);
        let err = decode_checkpoint("ckpt-3", read_from(&torn, "ckpt-3"))
            .expect_err("a torn file must not verify");
        assert_eq!(err.file(), expected_file, "{err}");
        let mut missing = files.clone();
        missing.remove(name);
        let err = decode_checkpoint("ckpt-3", read_from(&missing, "ckpt-3"))
            .expect_err("a missing file must not verify");
        assert!(matches!(err, LoadError::Missing { .. }), "{err}");
        assert_eq!(err.file(), expected_file, "{err}");
    }
    // The directory's step must be the manifest's.
    let err = decode_checkpoint("ckpt-4", read_from(&files, "ckpt-4")).expect_err("wrong step");
    assert!(matches!(err, LoadError::ManifestInvalid { .. }), "{err}");
}

/// A reader over in-memory files, as the decoder wants it.
fn read_from<'a>(
    files: &'a BTreeMap<String, Vec<u8>>,
    dir_label: &'a str,
) -> impl Fn(&str, u64) -> Result<Vec<u8>, LoadError> + 'a {
    move |name, _read_max| {
        files.get(name).cloned().ok_or_else(|| LoadError::Missing {
            file: format!("{dir_label}/{name}"),
            source: std::io::ErrorKind::NotFound.into(),
        })
    }
}
