//! `cohort ckpt ls|show|verify|export` on checkpoints saved through the public API, run as the
//! real binary: the text and JSON they print, the exported safetensors file read back by
//! Python (numpy + safetensors, which reassembles the variables from the shards by itself),
//! and bad input — a missing manifest, a truncated shard, a bit-flipped shard — each a clear
//! error naming the file, never a panic.

mod checkpoint_support;

use std::path::{Path, PathBuf};
use std::time::Instant;

use checkpoint_support::{
    cohort, python_has_safetensors, run_python, sample_checkpoint, Output, TempRoot,
};
use cohort::checkpoint::{CheckpointManager, CheckpointPolicy};

/// Saves `sample_checkpoint` at each of `steps` under a fresh root.
fn saved(tag: &str, steps: &[u64]) -> (TempRoot, Vec<PathBuf>) {
    let root = TempRoot::new(tag);
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 10,
    };
    let t0 = Instant::now();
    let mut manager = CheckpointManager::new(root.path(), policy, t0).unwrap();
    let dirs = steps
        .iter()
        .map(|&step| manager.save(&sample_checkpoint(step), t0).unwrap())
        .collect();
    (root, dirs)
}

fn ok(out: &Output) -> &str {
    out.expect_no_panic();
    assert_eq!(
        out.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    &out.stdout
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(ok(out)).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", out.stdout))
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn ckpt_ls_show_verify_describe_a_real_checkpoint() {
    let (root, dirs) = saved("ckpt-tools-ls", &[200, 300]);
    // A save that never finished: listed, never counted complete.
    std::fs::create_dir(root.path().join(".tmp-ckpt-400-1-2-3")).unwrap();

    let text = cohort(&["ckpt", "ls", s(root.path())]);
    let text = ok(&text);
    println!("{text}");
    for want in [
        "STEP",
        "ckpt-200",
        "ckpt-300",
        "complete",
        ".tmp-ckpt-400",
        "INCOMPLETE",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    let listed = json(&cohort(&["ckpt", "ls", s(root.path()), "--json"]));
    let list = listed["checkpoints"].as_array().unwrap();
    assert_eq!(list.len(), 3, "{listed}");
    assert_eq!(list[0]["step"], 200);
    assert_eq!(list[0]["complete"], true);
    assert_eq!(list[1]["step"], 300);
    assert_eq!(list[2]["step"], serde_json::Value::Null);
    assert_eq!(list[2]["complete"], false);
    let on_disk: u64 = std::fs::read_dir(&dirs[0])
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(list[0]["bytes"], on_disk);

    // Show: variables with dtypes, shapes, shards and slots; files with checksums; ledger.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dirs[0].join("manifest.json")).unwrap()).unwrap();
    let shown = cohort(&["ckpt", "show", s(&dirs[0])]);
    let shown = ok(&shown);
    println!("{shown}");
    for want in [
        "step 200",
        "emb/table",
        "[10, 4]",
        "emb/table/part_0 on ps/0 rows 0..6, emb/table/part_1 on ps/1 rows 6..10",
        "accumulator",
        "m, v",
        "F64",
        "I64",
        "shard-1-of-2.safetensors",
        manifest["files"][1]["sha256"].as_str().unwrap(),
        "committed_ids: 200 id(s) [[0,199]]",
        "pending_ids: 2 id(s)",
        "scheduled 202",
        "worker 1: 2003",
    ] {
        assert!(shown.contains(want), "{want:?} missing:\n{shown}");
    }
    // The root shows its newest checkpoint.
    let newest = json(&cohort(&["ckpt", "show", s(root.path()), "--json"]));
    assert_eq!(newest["manifest"]["step"], 300);
    assert_eq!(newest["manifest"]["layout"].as_array().unwrap().len(), 4);
    assert_eq!(newest["manifest"]["slots"]["emb/table"][0], "accumulator");

    let verified = cohort(&["ckpt", "verify", s(root.path())]);
    let verified = ok(&verified);
    assert_eq!(verified.matches("OK ").count(), 2, "{verified}");
    let verified = json(&cohort(&["ckpt", "verify", s(&dirs[1]), "--json"]));
    assert_eq!(verified["ok"], true);
    assert_eq!(verified["checkpoints"][0]["step"], 300);
}

/// `cohort ckpt show --json DIR | head`: the reader closes the pipe before cohort writes. The
/// command stops quietly with 141 (as a tool killed by SIGPIPE), never a panic.
#[test]
fn ckpt_commands_stop_quietly_when_their_reader_closes_the_pipe() {
    let (root, dirs) = saved("ckpt-tools-pipe", &[100]);
    for args in [
        vec!["ckpt", "show", "--json", s(&dirs[0])],
        vec!["ckpt", "show", s(&dirs[0])],
        vec!["ckpt", "ls", s(root.path())],
        vec!["ckpt", "verify", s(root.path())],
    ] {
        // The read end is closed before cohort starts, so its first write meets a closed pipe
        // whatever the timing.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cohort"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run cohort");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
        assert_eq!(
            out.status.code(),
            Some(cohort::process::STDOUT_CLOSED_EXIT_CODE),
            "{args:?}: {stderr}"
        );
        assert!(stderr.trim().is_empty(), "{args:?} said: {stderr}");
    }
}

#[test]
fn ckpt_verify_names_the_file_at_fault() {
    let (root, dirs) = saved("ckpt-tools-bad", &[100, 200, 300]);
    let shard = |dir: &Path| dir.join("shard-1-of-2.safetensors");

    // A missing manifest.
    std::fs::remove_file(dirs[0].join("manifest.json")).unwrap();
    // A truncated shard.
    let bytes = std::fs::read(shard(&dirs[1])).unwrap();
    std::fs::write(shard(&dirs[1]), &bytes[..bytes.len() - 10]).unwrap();
    // A bit-flipped shard (same size: only the checksum tells).
    let mut bytes = std::fs::read(shard(&dirs[2])).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(shard(&dirs[2]), &bytes).unwrap();

    let cases = [
        (&dirs[0], "ckpt-100/manifest.json: missing"),
        (&dirs[1], "ckpt-200/shard-1-of-2.safetensors: size mismatch"),
        (
            &dirs[2],
            "ckpt-300/shard-1-of-2.safetensors: checksum mismatch",
        ),
    ];
    for (dir, want) in cases {
        let out = cohort(&["ckpt", "verify", s(dir)]);
        out.expect_no_panic();
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(
            out.stdout.contains(&format!("FAILED {}", dir.display())),
            "{out:?}"
        );
        assert!(out.stdout.contains(want), "{want:?} missing: {out:?}");
        // The error names the file by its full path.
        let file = root.path().join(want.split(": ").next().unwrap());
        assert!(
            out.stderr.contains("error: ") && out.stderr.contains(s(&file)),
            "{} missing: {out:?}",
            file.display()
        );
        let out = cohort(&["ckpt", "verify", s(dir), "--json"]);
        assert_eq!(out.code, Some(1), "{out:?}");
        let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(report["ok"], false);
        assert_eq!(report["checkpoints"][0]["file"], s(&file));
    }
    // The root: every checkpoint checked, all three reported.
    let out = cohort(&["ckpt", "verify", s(root.path())]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("3 of 3 checkpoint(s) do not verify"),
        "{out:?}"
    );

    // ls says which are incomplete (a bit flip needs `verify`: ls reads no shard).
    let listed = cohort(&["ckpt", "ls", s(root.path())]);
    let listed = ok(&listed);
    assert!(
        listed.contains("INCOMPLETE: ckpt-100/manifest.json: missing"),
        "{listed}"
    );
    assert!(
        listed.contains("INCOMPLETE: ckpt-200/shard-1-of-2.safetensors: size mismatch"),
        "{listed}"
    );

    // show and export refuse what they cannot read, naming the file.
    let out = cohort(&["ckpt", "show", s(&dirs[0])]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("ckpt-100/manifest.json"), "{out:?}");
    let target = root.path().join("out.safetensors");
    let out = cohort(&["ckpt", "export", s(&dirs[2]), "--out", s(&target)]);
    out.expect_no_panic();
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("ckpt-300/shard-1-of-2.safetensors: checksum mismatch"),
        "{out:?}"
    );
    assert!(
        !target.exists(),
        "no file from a checkpoint that does not verify"
    );
    let out = cohort(&["ckpt", "export", s(root.path()), "--out", s(&target)]);
    assert_eq!(out.code, Some(1), "no valid checkpoint to export: {out:?}");
    assert!(out.stderr.contains("no usable checkpoint"), "{out:?}");

    // Paths that are no checkpoint at all: usage errors (exit 2).
    let missing = root.path().join("nowhere");
    let out = cohort(&["ckpt", "ls", s(&missing)]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains(s(&missing)), "{out:?}");
    let empty = TempRoot::new("ckpt-tools-empty");
    let out = cohort(&["ckpt", "verify", s(empty.path())]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("no checkpoint here"), "{out:?}");
}

#[test]
fn ckpt_export_joins_the_parts_and_python_reads_it() {
    let (root, dirs) = saved("ckpt-tools-export", &[200, 300]);
    let plain = root.path().join("model.safetensors");
    let with_slots = root.path().join("model-slots.safetensors");
    // From the root: its newest valid checkpoint.
    let out = cohort(&["ckpt", "export", s(root.path()), "--out", s(&plain)]);
    assert!(ok(&out).contains("step 300"), "{out:?}");
    let out = cohort(&[
        "ckpt",
        "export",
        s(&dirs[0]),
        "--out",
        s(&with_slots),
        "--with-slots",
    ]);
    assert!(ok(&out).contains("4 optimizer slot(s)"), "{out:?}");

    // In Rust, independently of the exporter: the embedding's parts joined in row order.
    let bytes = std::fs::read(&plain).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["step"], "300");
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(
        names,
        ["dense/bias", "dense/kernel", "emb/table", "global_step"]
    );
    let emb = file.tensor("emb/table").unwrap();
    assert_eq!(emb.shape(), [10, 4]);
    let values: Vec<f32> = emb
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 + 300.0).collect();
    assert_eq!(values, want);

    if !python_has_safetensors() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_export.py");
    let newest = &dirs[1];
    let (passed, output) =
        run_python(&[s(&script), s(&plain), s(newest)]).expect("python3 ran for the probe");
    println!("{output}");
    assert!(passed && output.contains("OK: 4 tensors"), "{output}");
    let (passed, output) = run_python(&[s(&script), s(&with_slots), s(&dirs[0]), "--with-slots"])
        .expect("python3 ran");
    println!("{output}");
    assert!(passed && output.contains("OK: 8 tensors"), "{output}");
    // The check can fail: the plain export is not the older checkpoint's.
    let (passed, output) = run_python(&[s(&script), s(&plain), s(&dirs[0])]).expect("python3 ran");
    assert!(!passed && output.contains("MISMATCH"), "{output}");
}
