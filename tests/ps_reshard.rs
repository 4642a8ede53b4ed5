//! A checkpoint saved on M parameter servers restores onto M' servers, across real processes
//! over QUIC. One checkpoint root outlives three launches of a 1-worker cluster:
//!
//! 1. 2 PS: train (Adam, so every shard has two optimizer slots and a step count; the sparse
//!    pushes reach the two shards of `emb` unequally often, so their step counts differ), save;
//! 2. 3 PS: `emb`, split into one shard per server, now has 3 shards over other boundaries;
//!    restore, read every variable, save that state at once into a second root, train on;
//! 3. 1 PS: the same, with every variable whole on ps/0 (`head` was on ps/1).
//!
//! Each restore's variables are bit-identical to what the 2-PS job read after its save, and
//! the state the restored job saves again holds every variable's values and optimizer slots,
//! reassembled over its shards, bit-identical to the first checkpoint's, with each shard's step
//! count the largest of the saved shards its rows came from.

mod ps_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cohort::checkpoint::{
    list_checkpoints, read_checkpoint, slot_tensor_name, update_count_key, Checkpoint,
    CheckpointManager, CheckpointPolicy,
};
use cohort::layout::Layout;
use cohort::nn::Initializer;
use cohort::program::{ClusterCoordinator, CoordinatorError, Program, StepContext, VariableSpec};
use cohort::variable::Partitioner;
use ps_support::{child_dir, scenario, write_report, Run};

/// Closures the 2-PS job trains before it saves (also the checkpoint's step).
const STEPS: u64 = 6;
/// Every variable the program creates.
const VARIABLES: [&str; 3] = ["emb", "bias", "head"];

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// `emb` ([10, 3]) is split into one shard per server; `bias` and `head` are whole, placed
/// round-robin (ps/0 and ps/1 when there are two servers).
fn program() -> Program {
    Program::new("ps-reshard-test")
        .optimizer(cohort::optim::Optimizer::adam(0.05))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, args: &[u8]| {
            let i = u64::from(args.first().copied().unwrap_or(0));
            // Row 7 (in emb's last shard on 2 servers) only every other step.
            let ids = if i % 2 == 0 {
                vec![i % 5, 7]
            } else {
                vec![i % 5]
            };
            let rows = ctx.pull_rows("emb", &ids)?;
            ctx.push_rows("emb", ids, rows.iter().map(|r| r - 0.25).collect())?;
            for name in ["bias", "head"] {
                let w = ctx.pull(name)?;
                ctx.push_dense(name, w.iter().map(|w| w - 1.0).collect())?;
            }
            Ok(Vec::new())
        })
        .chief(|coordinator| {
            let num_ps = coordinator.num_ps() as usize;
            coordinator.create_variable(
                VariableSpec::new(
                    "emb",
                    vec![10, 3],
                    Initializer::RandomUniform {
                        min: -1.0,
                        max: 1.0,
                        seed: 11,
                    },
                )
                .partitioned(Partitioner::FixedShards { num_shards: num_ps }),
            )?;
            coordinator.create_variable(VariableSpec::zeros("bias", vec![3]))?;
            coordinator.create_variable(VariableSpec::zeros("head", vec![4]))?;
            coordinator.wait_for_workers(1, Duration::from_secs(30))?;
            let mut manager = manager_at(&child_dir().join("ckpt"))?;
            let restored = coordinator.restore_checkpoint(&mut manager)?;
            let mut report = serde_json::json!({
                "layouts": serde_json::to_value(coordinator.layouts()).map_err(CoordinatorError::other)?,
                "restored_step": restored,
                "restored": variables(coordinator)?,
            });
            match (scenario().as_str(), restored) {
                ("save", None) => {
                    train(coordinator, 0..STEPS)?;
                    coordinator.save_checkpoint(&mut manager, STEPS)?;
                    report["saved"] = variables(coordinator)?;
                }
                ("restore", Some(step)) => {
                    // What the servers hold right after the restore, slots and steps too.
                    let mut again = manager_at(&child_dir().join(format!("resaved-{num_ps}")))?;
                    coordinator.save_checkpoint(&mut again, step)?;
                    train(coordinator, STEPS..STEPS + 2)?;
                    report["trained"] = variables(coordinator)?;
                }
                (scenario, restored) => {
                    return Err(CoordinatorError::other(format!(
                        "scenario {scenario:?} with restored step {restored:?}"
                    )))
                }
            }
            write_report(&report)
        })
}

fn manager_at(root: &Path) -> Result<CheckpointManager, CoordinatorError> {
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 3,
    };
    CheckpointManager::new(root, policy, Instant::now())
        .map_err(|e| CoordinatorError::Checkpoint(e.into()))
}

fn train(
    coordinator: &ClusterCoordinator,
    steps: std::ops::Range<u64>,
) -> Result<(), CoordinatorError> {
    for i in steps {
        coordinator.schedule_encoded("fit", vec![i as u8])?;
    }
    coordinator.join()
}

/// Every variable's value as raw f32 bits, so "bit-identical" is compared exactly.
fn variables(coordinator: &ClusterCoordinator) -> Result<serde_json::Value, CoordinatorError> {
    let mut out = serde_json::json!({});
    for name in VARIABLES {
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
fn a_checkpoint_saved_on_two_servers_restores_onto_three_and_onto_one() {
    let mut run = Run::new("ps-reshard", "save", &[]);
    run.num_workers = 1;

    // 1. Two servers: train and save.
    let first = run.launch();
    assert!(first["restored_step"].is_null(), "{first}");
    let saved = first["saved"].clone();
    assert_ne!(
        saved, first["restored"],
        "training changed nothing: {first}"
    );
    let original = only_checkpoint(&run.path("ckpt"));
    assert_eq!(original.num_ps(), 2);
    let emb = layout_of(&original, "emb");
    assert_eq!(emb.shards.len(), 2, "{emb:?}");
    assert_ne!(
        steps_of(&original, emb, 0),
        steps_of(&original, emb, 1),
        "emb's shards were to be updated unequally often"
    );
    assert_eq!(layout_of(&original, "head").shards[0].ps, 1);

    // 2. and 3. Three servers, then one: restored bit for bit, then training goes on.
    for num_ps in [3u32, 1] {
        run.num_ps = num_ps;
        run.scenario = "restore".into();
        let report = run.launch();
        assert_eq!(report["restored_step"], STEPS, "{num_ps} PS: {report}");
        assert_eq!(
            report["restored"], saved,
            "{num_ps} PS: the restored variables differ from the saved ones"
        );
        assert_ne!(
            report["trained"], saved,
            "{num_ps} PS: training did not go on after the restore"
        );
        let layouts: Vec<Layout> = serde_json::from_value(report["layouts"].clone()).unwrap();
        let emb = layouts.iter().find(|l| l.name == "emb").unwrap();
        assert_eq!(emb.shards.len(), num_ps as usize, "{emb:?}");

        let resaved = only_checkpoint(&run.path(&format!("resaved-{num_ps}")));
        assert_eq!(resaved.num_ps(), num_ps as usize);
        assert_eq!(resaved.layout, layouts, "{num_ps} PS");
        let slots = original.slot_names();
        assert_eq!(resaved.slot_names(), slots, "{num_ps} PS");
        for name in VARIABLES {
            assert_eq!(slots[name].len(), 2, "Adam's m and v for {name}");
            for slot in std::iter::once(None).chain(slots[name].iter().map(Some)) {
                assert_eq!(
                    whole(&resaved, name, slot),
                    whole(&original, name, slot),
                    "{num_ps} PS: {name} {slot:?} is not bit-identical to the saved one"
                );
            }
            let saved_layout = layout_of(&original, name);
            let layout = layout_of(&resaved, name);
            for (i, shard) in layout.shards.iter().enumerate() {
                let expected = saved_layout
                    .shards
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.rows.start < shard.rows.end && shard.rows.start < s.rows.end)
                    .map(|(j, _)| steps_of(&original, saved_layout, j))
                    .max()
                    .unwrap();
                assert_eq!(
                    steps_of(&resaved, layout, i),
                    expected,
                    "{num_ps} PS: step count of {}",
                    layout.shard_name(i)
                );
            }
        }
    }
}

/// The one checkpoint under `root`, read and verified.
fn only_checkpoint(root: &Path) -> Checkpoint {
    let entries = list_checkpoints(root).unwrap();
    assert_eq!(entries.len(), 1, "checkpoints under {}", root.display());
    let dir: PathBuf = entries[0].dir.clone();
    read_checkpoint(&dir).unwrap().checkpoint
}

fn layout_of<'a>(ckpt: &'a Checkpoint, name: &str) -> &'a Layout {
    ckpt.layout
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no variable {name} in the checkpoint"))
}

/// The step count `ckpt` holds for shard `index` of `layout`.
fn steps_of(ckpt: &Checkpoint, layout: &Layout, index: usize) -> u64 {
    let part = layout.shard_name(index);
    assert!(
        ckpt.extra.get(update_count_key(&part)).is_some(),
        "no step count for {part}"
    );
    ckpt.update_count(&part).unwrap()
}

/// Variable `name`'s values (`slot` None) or one optimizer slot, whole: its shards' bytes in
/// row order.
fn whole(ckpt: &Checkpoint, name: &str, slot: Option<&String>) -> Vec<u8> {
    let layout = layout_of(ckpt, name);
    let mut bytes = Vec::new();
    for (i, shard) in layout.shards.iter().enumerate() {
        let part = layout.shard_name(i);
        let tensor = match slot {
            None => part.clone(),
            Some(slot) => slot_tensor_name(&part, slot),
        };
        let t = ckpt
            .tensor(shard.ps as usize, &tensor)
            .unwrap_or_else(|| panic!("no tensor {tensor} on ps {}", shard.ps));
        bytes.extend_from_slice(t.data());
    }
    bytes
}
