//! Warm start of a real job (chief, 2 parameter servers, a worker, each a process over QUIC on
//! 127.0.0.1) from a safetensors file written by another framework: numpy writes the file,
//! a name map gives the job's names, a partitioned variable gets each server's rows, the
//! optimizer state starts fresh, and the job trains from there. Bad input — a map entry for a
//! tensor the file lacks, a variable the file does not hold, a shape mismatch, a map entry for
//! a variable the job lacks — stops the chief before training with exit 2 and an error naming
//! the variable and the file.
//!
//! The processes are this test binary re-executed in child mode (`cluster_task`).

mod checkpoint_support;
mod ps_support;

use std::path::Path;

use checkpoint_support::{cohort, python_has_safetensors, run_python, TempRoot};
use cohort::checkpoint::{read_checkpoint, CheckpointManager, CheckpointPolicy, TensorBytes};
use cohort::program::{Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{write_report, Run};

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// Training steps after the warm start.
const STEPS: usize = 3;
/// Adam's learning rate: each step with a constant gradient moves a value by about this.
const LEARNING_RATE: f32 = 0.1;

/// Variables `w` [4, 3] (split over both servers) and `b` [3], both zeros unless warm-started;
/// the chief checkpoints step 0, trains `b` down for [`STEPS`] steps and reports the values.
fn program() -> Program {
    Program::new("warm-start")
        .optimizer(cohort::optim::Optimizer::adam(LEARNING_RATE))
        .step_encoded("nudge", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let b = ctx.pull("b")?;
            ctx.push_dense("b", vec![1.0; b.len()])?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            let result: Result<serde_json::Value, cohort::program::CoordinatorError> = (|| {
                coordinator.create_variable(
                    VariableSpec::zeros("w", vec![4, 3])
                        .partitioned(Partitioner::FixedShards { num_shards: 2 }),
                )?;
                coordinator.create_variable(VariableSpec::zeros("b", vec![3]))?;
                let dir = coordinator.checkpoint_dir().expect("COHORT_CHECKPOINT_DIR");
                let policy = CheckpointPolicy::default();
                let mut manager = CheckpointManager::new(dir, policy, std::time::Instant::now())
                    .map_err(cohort::program::CoordinatorError::other)?;
                let resumed = coordinator.restore_checkpoint(&mut manager)?;
                let w0 = coordinator.read_variable("w")?;
                let b0 = coordinator.read_variable("b")?;
                let saved = coordinator.save_checkpoint(&mut manager, 0)?;
                coordinator.wait_for_workers(1, std::time::Duration::from_secs(30))?;
                for _ in 0..STEPS {
                    coordinator.schedule_encoded("nudge", Vec::new())?;
                }
                coordinator.join()?;
                Ok(serde_json::json!({
                    "resumed": resumed,
                    "w0": w0,
                    "b0": b0,
                    "b": coordinator.read_variable("b")?,
                    "w": coordinator.read_variable("w")?,
                    "checkpoint": saved,
                    "layouts": coordinator.layouts().iter().map(|l| l.shards.iter()
                        .map(|s| [s.ps as usize, s.rows.start, s.rows.end]).collect::<Vec<_>>())
                        .collect::<Vec<_>>(),
                }))
            })(
            );
            match result {
                Ok(report) => write_report(&report),
                Err(e) => {
                    write_report(&serde_json::json!({ "error": e.to_string() }))?;
                    Err(e)
                }
            }
        })
}

/// A run on 2 servers and 1 worker, its checkpoints in its scratch directory.
fn run(name: &str) -> Run {
    let mut run = Run::new(name, "warm-start", &[]);
    run.num_workers = 1;
    run.workers_max = 1;
    let ckpt = run.path("ckpt").display().to_string();
    run.env.push(("COHORT_CHECKPOINT_DIR".into(), ckpt));
    run
}

/// What `write_safetensors.py` writes: `model.w` (F32 [4, 3]) and `model.b` (F64 [3]).
fn model_w() -> Vec<f32> {
    (0..12).map(|i| i as f32 * 0.5 - 1.0).collect()
}
const MODEL_B: [f32; 3] = [0.25, -0.5, 2.0];

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_job_warm_starts_from_a_file_numpy_wrote() {
    if !python_has_safetensors() {
        return;
    }
    let scratch = TempRoot::new("warm-start-file");
    let file = scratch.path().join("model.safetensors");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/write_safetensors.py");
    let (written, output) = run_python(&[s(&script), s(&file)]).expect("python3 ran");
    assert!(written, "{output}");
    let map = scratch.path().join("names.toml");
    std::fs::write(&map, "w = \"model.w\"\nb = \"model.b\"\n").unwrap();

    let run = run("warm-start-ok");
    let code = run.launch_code_with(&[
        ("COHORT_WARM_START", s(&file)),
        ("COHORT_WARM_START_MAP", s(&map)),
    ]);
    let report = run.report();
    assert_eq!(code, 0, "the chief failed: {report}");
    assert_eq!(report["resumed"], serde_json::Value::Null);
    // The variables start as the file says (the F64 bias read as F32), whatever their
    // initializers (zeros) say.
    assert_eq!(floats(&report["w0"]), model_w(), "{report}");
    assert_eq!(floats(&report["b0"]), MODEL_B, "{report}");
    // `w` is split over both servers, rows 0..2 and 2..4: each got its rows.
    assert_eq!(
        report["layouts"][0],
        serde_json::json!([[0, 0, 2], [1, 2, 4]])
    );

    // The checkpoint of step 0: each server's rows, and fresh optimizer state (Adam's m and v
    // all zero).
    let loaded = read_checkpoint(Path::new(report["checkpoint"].as_str().unwrap())).unwrap();
    let ckpt = &loaded.checkpoint;
    let part = |ps: usize, name: &str| -> &TensorBytes {
        ckpt.tensor(ps, name)
            .unwrap_or_else(|| panic!("{name} on ps/{ps}"))
    };
    assert_eq!(part(0, "w/part_0").to_f32().unwrap(), model_w()[..6]);
    assert_eq!(part(1, "w/part_1").to_f32().unwrap(), model_w()[6..]);
    let mut slots = 0;
    for shard in &ckpt.shards {
        for (name, tensor) in &shard.tensors {
            if name.contains("/slot/") {
                slots += 1;
                assert!(
                    tensor.to_f32().unwrap().iter().all(|v| *v == 0.0),
                    "{name} is fresh optimizer state"
                );
            }
        }
    }
    assert!(slots >= 4, "Adam's m and v of every part: {slots}");

    // It trains from there: Adam moves each value of `b` by about the learning rate per step.
    let b = floats(&report["b"]);
    for (got, start) in b.iter().zip(MODEL_B) {
        let want = start - STEPS as f32 * LEARNING_RATE;
        assert!((got - want).abs() < 1e-3, "b {b:?} from {MODEL_B:?}");
    }
    assert_eq!(floats(&report["w"]), model_w(), "w is not trained");

    // Full circle: the checkpoint exported is the file's model under cohort's names.
    let exported = scratch.path().join("exported.safetensors");
    let dir = report["checkpoint"].as_str().unwrap();
    let out = cohort(&["ckpt", "export", dir, "--out", s(&exported)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let bytes = std::fs::read(&exported).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = file.tensor("w").unwrap();
    assert_eq!(w.shape(), [4, 3]);
    let values: Vec<f32> = w
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(values, model_w());
}

/// Writes a safetensors file of F32 tensors (as any framework would; no Python needed here).
fn write_file(path: &Path, tensors: &[(&str, Vec<usize>)]) {
    let owned: Vec<(String, TensorBytes)> = tensors
        .iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            (
                name.to_string(),
                TensorBytes::from_f32(shape.clone(), &vec![1.5; n]).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(owned.iter().map(|(n, t)| (n.as_str(), t)), None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_warm_start_that_does_not_fit_stops_the_chief_before_training_naming_variable_and_file() {
    let scratch = TempRoot::new("warm-start-bad");
    let file = scratch.path().join("other.safetensors");
    write_file(
        &file,
        &[
            ("model.w", vec![4, 3]),
            ("model.b", vec![2]),
            ("model.b3", vec![3]),
        ],
    );
    let map = scratch.path().join("names.toml");
    let file_name = s(&file).to_string();
    let map_name = s(&map).to_string();
    let cases: [(&str, Option<&str>, Vec<&str>); 4] = [
        // A map entry for a tensor the file does not hold.
        (
            "nope",
            Some("w = \"model.nope\"\n"),
            vec![&map_name, "\"w\"", "\"model.nope\"", &file_name],
        ),
        // No map: the file has no tensor named `w`.
        (
            "unmapped",
            None,
            vec!["variable \"w\"", &file_name, "\"model.w\""],
        ),
        // A shape mismatch: `b` is [3], the file's tensor [2].
        (
            "shape",
            Some("w = \"model.w\"\nb = \"model.b\"\n"),
            vec!["variable \"b\"", "[3]", "[2]", &file_name],
        ),
        // A map entry for a variable the job never creates.
        (
            "unknown",
            Some("w = \"model.w\"\nb = \"model.b3\"\nc = \"model.b\"\n"),
            vec![&map_name, "variable \"c\"", "not a variable of this job"],
        ),
    ];
    for (tag, map_text, wants) in cases {
        let mut env = vec![("COHORT_WARM_START", file_name.as_str())];
        if let Some(text) = map_text {
            std::fs::write(&map, text).unwrap();
            env.push(("COHORT_WARM_START_MAP", map_name.as_str()));
        }
        let run = run(&format!("warm-start-{tag}"));
        let code = run.launch_code_with(&env);
        let report = run.report();
        assert_eq!(code, 2, "{tag}: bad input exits 2: {report}");
        let error = report["error"].as_str().unwrap_or_default();
        for want in wants {
            assert!(
                error.contains(want),
                "{tag}: {want:?} missing from {error:?}"
            );
        }
        assert!(
            !run.path("ckpt").exists()
                || std::fs::read_dir(run.path("ckpt"))
                    .unwrap()
                    .next()
                    .is_none(),
            "{tag}: nothing was checkpointed"
        );
    }
}
