//! Per-worker dataset positions travel in checkpoints: after a relaunch that restores a
//! checkpoint, every worker's dataset resumes after the last element it had read, instead of
//! starting its stream again.
//!
//! Worker `w` reads the stream `w, w + 2, w + 4, …` (a range sharded by worker); each closure
//! returns the element it read.

mod ps_support;

use cohort::checkpoint::{list_checkpoints, read_checkpoint, CheckpointManager, CheckpointPolicy};
use cohort::data::Dataset;
use cohort::program::{CoordinatorError, Program, StepContext, VariableSpec};
use ps_support::{child_dir, scenario, write_report, Run};

const STEPS: usize = 12;

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

fn program() -> Program {
    Program::new("ps-positions")
        .dataset("ids", |ctx| {
            Ok(Dataset::range(0, 1_000_000, 1)
                .shard(ctx.num_input_pipelines, ctx.input_pipeline_id))
        })
        .step_encoded("read", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let element = ctx.next("ids")?;
            let value = element[0].to_scalar::<i64>()?;
            Ok(value.to_le_bytes().to_vec())
        })
        .chief(|coordinator| {
            let policy = CheckpointPolicy {
                save_every_steps: None,
                save_every: None,
                keep_last: 2,
            };
            let mut manager =
                CheckpointManager::new(child_dir().join("ckpt"), policy, std::time::Instant::now())
                    .map_err(CoordinatorError::other)?;
            coordinator.create_variable(VariableSpec::zeros("unused", vec![1]))?;
            // Restore before the datasets exist, so they are built at the restored positions.
            let resumed = coordinator.restore_checkpoint(&mut manager)?;
            coordinator.create_per_worker_dataset("ids")?;
            coordinator.wait_for_workers(2, std::time::Duration::from_secs(30))?;
            let values = (0..STEPS)
                .map(|_| coordinator.schedule_encoded("read", Vec::new()))
                .collect::<Result<Vec<_>, _>>()?;
            coordinator.join()?;
            let mut read = Vec::new();
            for v in &values {
                let bytes = coordinator.fetch_encoded(v)?;
                read.push(i64::from_le_bytes(
                    bytes
                        .try_into()
                        .map_err(|_| CoordinatorError::other("bad value"))?,
                ));
            }
            if scenario() == "first" {
                coordinator.save_checkpoint(&mut manager, STEPS as u64)?;
            }
            write_report(&serde_json::json!({ "resumed": resumed, "read": read }))
        })
}

#[test]
fn each_worker_resumes_its_dataset_after_the_last_element_it_read() {
    let run = Run::new("positions", "first", &[]);
    let first = run.launch();
    assert_eq!(first["resumed"], serde_json::Value::Null);
    let first_read: Vec<i64> = serde_json::from_value(first["read"].clone()).unwrap();

    // The manifest holds each worker's position: together, every element read.
    let root = run.path("ckpt");
    let newest = list_checkpoints(&root)
        .unwrap()
        .pop()
        .expect("a checkpoint");
    let loaded = read_checkpoint(&newest.dir).unwrap();
    let total: u64 = loaded.checkpoint.dataset_positions.values().sum();
    assert_eq!(
        total, STEPS as u64,
        "{:?}",
        loaded.checkpoint.dataset_positions
    );

    let mut resumed_run = run;
    resumed_run.scenario = "resume".into();
    let second = resumed_run.launch();
    assert_eq!(second["resumed"], STEPS as u64);
    let second_read: Vec<i64> = serde_json::from_value(second["read"].clone()).unwrap();
    for worker in 0..2 {
        let last_before = first_read
            .iter()
            .filter(|v| *v % 2 == worker)
            .max()
            .copied()
            .unwrap_or(worker - 2);
        let after: Vec<i64> = second_read
            .iter()
            .copied()
            .filter(|v| v % 2 == worker)
            .collect();
        assert!(
            after.iter().all(|v| *v > last_before),
            "worker {worker} re-read elements: before {first_read:?}, after {second_read:?}"
        );
        if let Some(first_after) = after.iter().min() {
            assert_eq!(
                *first_after,
                last_before + 2,
                "worker {worker} skipped elements: {first_read:?} then {second_read:?}"
            );
        }
    }
}
