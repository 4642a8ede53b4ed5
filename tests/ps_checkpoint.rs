//! Checkpoints across real processes (CKPT-1). One checkpoint root outlives four launches of a
//! 2 PS × 2 worker cluster:
//!
//! 1. train, save at steps 10 and 20 (the chief reports the variables read right after each
//!    save), then the chief crashes (SIGKILL) and the launcher takes every other process down;
//! 2. relaunch: restore gives step 20 with variables bit-identical to what was saved; training
//!    resumes, and a crash injected in the next save before its manifest ends the chief (`FAILPOINT_EXIT_CODE`);
//! 3. relaunch: the half-written save is never picked: step 20 is restored, bit-identical;
//! 4. a byte of a step-20 shard file is flipped; relaunch: that checkpoint is skipped with a
//!    message naming the file, and step 10 is restored, bit-identical.
//!
//! Between 1 and 2, Python's `safetensors` loads the step-10 shard files and they must hold the
//! very bits the chief reported (skipped with a note when python3 lacks safetensors/numpy).

mod ps_support;
mod skip_support;
use skip_support::Part;

use ps_support::fit_gradient;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::checkpoint::{
    list_checkpoints, shard_file_name, CheckpointManager, CheckpointPolicy, FAILPOINT_ENV,
    FAILPOINT_EXIT_CODE,
};
use cohort::layout::Layout;
use cohort::nn::Initializer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{child_dir, ledger_and_stats, scenario, write_report, Run};

/// Closures between two saves.
const STEPS_PER_SAVE: u64 = 10;

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// `w` is split over both PS, `table` (a seeded random 10 × 2 embedding) lives on one; Adagrad
/// gives every shard an optimizer slot that the checkpoint must carry too.
fn program() -> Program {
    Program::new("ps-checkpoint-test")
        .optimizer(cohort::optim::Optimizer::adagrad(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let w = ctx.pull("w")?;
            let grad = fit_gradient(&w);
            ctx.push_dense("w", grad)?;
            let ids = vec![u64::from(ctx.worker_index()), 7];
            let rows = ctx.pull_rows("table", &ids)?;
            ctx.push_rows("table", ids, rows.iter().map(|r| r - 0.5).collect())?;
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_variable(VariableSpec::new(
                "table",
                vec![10, 2],
                Initializer::RandomUniform {
                    min: -1.0,
                    max: 1.0,
                    seed: 7,
                },
            ))?;
            coordinator.wait_for_workers(2, Duration::from_secs(30))?;
            let policy = CheckpointPolicy {
                save_every_steps: None,
                save_every: None,
                keep_last: 3,
            };
            let mut manager =
                CheckpointManager::new(child_dir().join("ckpt"), policy, Instant::now())
                    .map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
            let mut report = serde_json::json!({
                "layouts": serde_json::to_value(coordinator.layouts()).map_err(CoordinatorError::other)?,
            });
            // What restore would skip, and why (the coordinator logs the same).
            let outcome = CheckpointManager::new(
                child_dir().join("ckpt"),
                CheckpointPolicy::default(),
                Instant::now(),
            )
            .map_err(|e| CoordinatorError::Checkpoint(e.into()))?
            .restore_latest()
            .map_err(|e| CoordinatorError::Checkpoint(e.into()))?;
            report["skipped"] = outcome
                .skipped
                .iter()
                .map(|s| serde_json::json!({ "step": s.step, "error": s.error.to_string() }))
                .collect();
            report["removed_temp"] = serde_json::json!(outcome.removed_temp.len());
            let restored = coordinator.restore_checkpoint(&mut manager)?;
            report["restored_step"] = serde_json::json!(restored);
            report["restored"] = variables(coordinator)?;
            match scenario().as_str() {
                "save" => {
                    for step in [STEPS_PER_SAVE, 2 * STEPS_PER_SAVE] {
                        train(coordinator, STEPS_PER_SAVE)?;
                        coordinator.save_checkpoint(&mut manager, step)?;
                        report["saved"][step.to_string()] = variables(coordinator)?;
                    }
                    write_report(&report)?;
                    // Crash: no clean shutdown of anything. The launcher then stops the rest.
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::this(),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    Err(CoordinatorError::other("still alive after SIGKILL"))
                }
                "resume" => {
                    let step = restored
                        .ok_or_else(|| CoordinatorError::other("nothing to resume from"))?;
                    train(coordinator, STEPS_PER_SAVE)?;
                    report["trained"] = variables(coordinator)?;
                    report["after_training"] = ledger_and_stats(coordinator)?;
                    write_report(&report)?;
                    // With COHORT_FAILPOINT=checkpoint.before_manifest this exits mid-save.
                    coordinator.save_checkpoint(&mut manager, step + STEPS_PER_SAVE)?;
                    Err(CoordinatorError::other(
                        "the save was expected to crash",
                    ))
                }
                _ => write_report(&report),
            }
        })
}

fn train(coordinator: &ClusterCoordinator, steps: u64) -> Result<(), CoordinatorError> {
    for _ in 0..steps {
        coordinator.schedule_encoded("fit", Vec::new())?;
    }
    coordinator.join()
}

/// Every variable's value as raw f32 bits, so "bit-identical" is compared exactly.
fn variables(coordinator: &ClusterCoordinator) -> Result<serde_json::Value, CoordinatorError> {
    let mut out = serde_json::json!({});
    for name in ["w", "table"] {
        let bits: Vec<u32> = coordinator
            .read_variable(name)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        out[name] = serde_json::json!(bits);
    }
    Ok(out)
}

#[test]
fn ckpt_1_restore_after_killing_every_process_a_crashed_save_and_a_corrupt_shard() {
    let mut run = Run::new("ps-ckpt", "save", &[]);
    let root = run.path("ckpt");

    // 1. Train and save twice, then the chief crashes and the rest is taken down.
    let code = run.launch_code();
    assert_eq!(
        code,
        128 + 9,
        "the chief was to kill itself after saving; its log is above"
    );
    let first = run.report();
    assert!(
        first["restored_step"].is_null(),
        "nothing to restore on a fresh root: {first}"
    );
    let saved_10 = first["saved"]["10"].clone();
    let saved_20 = first["saved"]["20"].clone();
    assert_ne!(
        saved_10, saved_20,
        "training between the saves changed nothing: {first}"
    );
    let steps: Vec<u64> = list_checkpoints(&root)
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(steps, [10, 20], "checkpoints on disk");

    // The shard files load in Python's safetensors with the very bits the chief read.
    let layouts: Vec<Layout> = serde_json::from_value(first["layouts"].clone()).unwrap();
    python_check(&checkpoint_dir(&root, 10), &layouts, &saved_10);

    // 2. Relaunch: restored bit-identical; training resumes; the next save crashes before its
    // manifest.
    run.scenario = "resume".into();
    let code = run.launch_code_with(&[(FAILPOINT_ENV, "checkpoint.before_manifest")]);
    assert_eq!(
        code, FAILPOINT_EXIT_CODE,
        "the save was to crash at the failpoint; the log is above"
    );
    let second = run.report();
    assert_eq!(second["restored_step"], 20, "{second}");
    assert_eq!(
        second["restored"], saved_20,
        "restored variables differ from the saved ones"
    );
    assert_eq!(second["skipped"], serde_json::json!([]), "{second}");
    assert_ne!(
        second["trained"], saved_20,
        "training did not resume: {second}"
    );
    // The ledger carries on from the checkpoint (20 committed) through this run's 10.
    assert_eq!(
        second["after_training"]["ledger"]["committed"],
        2 * STEPS_PER_SAVE + STEPS_PER_SAVE,
        "{second}"
    );
    assert_eq!(
        second["after_training"]["ledger"]["balances"], true,
        "{second}"
    );
    let steps: Vec<u64> = list_checkpoints(&root)
        .unwrap()
        .iter()
        .map(|e| e.step)
        .collect();
    assert_eq!(
        steps,
        [10, 20],
        "the crashed save must not publish a checkpoint"
    );

    // 3. Relaunch: the previous checkpoint (20) is the one restored; the crashed save's
    // leftovers are cleared away.
    run.scenario = "restore".into();
    let third = run.launch();
    assert_eq!(third["restored_step"], 20, "{third}");
    assert_eq!(
        third["restored"], saved_20,
        "restored variables differ from the saved ones"
    );
    assert!(
        third["removed_temp"].as_u64().unwrap() >= 1,
        "the crashed save left no temporary directory: {third}"
    );

    // 4. Flip one byte of a step-20 shard: that checkpoint is skipped, naming the file.
    let shard = checkpoint_dir(&root, 20).join(shard_file_name(0, 2));
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    let fourth = run.launch();
    assert_eq!(fourth["restored_step"], 10, "{fourth}");
    assert_eq!(
        fourth["restored"], saved_10,
        "restored variables differ from the saved ones"
    );
    let skipped = fourth["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{fourth}");
    assert_eq!(skipped[0]["step"], 20, "{fourth}");
    let why = skipped[0]["error"].as_str().unwrap();
    assert!(
        why.contains(&shard_file_name(0, 2)),
        "the skip must name the file: {why}"
    );
}

fn checkpoint_dir(root: &Path, step: u64) -> std::path::PathBuf {
    list_checkpoints(root)
        .unwrap()
        .into_iter()
        .find(|e| e.step == step)
        .unwrap_or_else(|| panic!("no checkpoint of step {step}"))
        .dir
}

/// Loads every shard file of `dir` with Python's safetensors and compares each variable shard
/// with the bits the chief read for that variable (rows per the layout).
fn python_check(dir: &Path, layouts: &[Layout], saved: &serde_json::Value) {
    let probe = run_python(&["-c", "import safetensors, numpy"]);
    if !matches!(&probe, Some((true, _))) {
        skip_support::skip(
            Part::Python,
            &format!(
                "the Python part: python3 with the `safetensors` and `numpy` packages is not \
                 available (pip install safetensors numpy): {probe:?}"
            ),
        );
        return;
    }
    let script = r#"
import json, sys
import numpy as np
from safetensors.numpy import load_file
out = {}
for path in sys.argv[1:]:
    arrays = load_file(path)
    out[path.rsplit("/", 1)[-1]] = {
        name: {"dtype": str(a.dtype), "shape": list(a.shape),
               "bits": np.ascontiguousarray(a, dtype="<f4").view("<u4").reshape(-1).tolist()}
        for name, a in arrays.items()
    }
print(json.dumps(out))
"#;
    let files: Vec<String> = (0..2)
        .map(|ps| dir.join(shard_file_name(ps, 2)).display().to_string())
        .collect();
    let mut args = vec!["-c", script];
    args.extend(files.iter().map(String::as_str));
    let (ok, output) = run_python(&args).expect("python3 ran for the probe");
    assert!(ok, "Python could not load the shard files:\n{output}");
    let json = output
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON from Python: {output}"));
    let loaded: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {output}"));
    let mut compared = 0;
    for layout in layouts {
        let bits: Vec<u32> = serde_json::from_value(saved[&layout.name].clone()).unwrap();
        let width = layout.row_len();
        for (i, shard) in layout.shards.iter().enumerate() {
            let file = shard_file_name(shard.ps as usize, 2);
            let tensor = &loaded[&file][layout.shard_name(i)];
            assert_eq!(tensor["dtype"], "float32", "{file}: {tensor}");
            let shape: Vec<usize> = serde_json::from_value(tensor["shape"].clone()).unwrap();
            assert_eq!(
                shape,
                layout.shard_shape(i),
                "{file}: {}",
                layout.shard_name(i)
            );
            let got: Vec<u32> = serde_json::from_value(tensor["bits"].clone()).unwrap();
            assert_eq!(
                got,
                bits[shard.rows.start * width..shard.rows.end * width],
                "{file}: {}",
                layout.shard_name(i)
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 3, "w's two shards and table");
    // The optimizer's slots are in the files too.
    let names: Vec<String> = ["shard-0-of-2.safetensors", "shard-1-of-2.safetensors"]
        .iter()
        .flat_map(|f| {
            loaded[*f]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        names.len() > compared,
        "no optimizer slot in the shard files: {names:?}"
    );
    println!("Python safetensors loaded {} tensors; the {compared} variable shards match the chief's values bit for bit", names.len());
}

/// Runs python3 with `args`, bounded in time; `None` if python3 cannot be started.
fn run_python(args: &[&str]) -> Option<(bool, String)> {
    let mut child = Command::new("python3")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    loop {
        if child.try_wait().expect("wait for python3").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("python3 ran past {PYTHON_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("python3 output");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Some((output.status.success(), text))
}

/// Bound on each Python run.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(120);
