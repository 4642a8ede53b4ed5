//! Checkpoints of a synchronous job's training state ([`ElasticState`]: the step, the input
//! position, every variable and the optimizer's slots and step count), in cohort's checkpoint
//! format (`crate::checkpoint`: CKPT-1's atomic commit, retention, and restore of the newest
//! checkpoint that verifies; `cohort ckpt` reads them).
//!
//! Under MultiWorkerMirrored every worker holds the whole state, so a checkpoint is one shard:
//! every variable whole, its slots beside it (`<variable>/.OPTIMIZER_SLOT/<slot>`), the input
//! position as dataset position 0, and the optimizer's step count in the manifest's `extra`.
//! The chief writes them ([`StateCheckpoints::save`]); a job started again restores the
//! newest ([`StateCheckpoints::restore_into`]) on the chief, which then gives it to every
//! worker (`MultiWorkerMirrored::agree`).
//!
//! This module owns that mapping between the state and the format, and nothing of when to save.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Deserialize;

use crate::checkpoint::{
    slot_tensor_name, Checkpoint, CheckpointManager, CheckpointPolicy, Dtype, ListError,
    PolicyError, SaveError, ShardTensors, TensorBytes, TensorError,
};
use crate::layout::Layout;
use crate::optim::{LearningRateSchedule, OptimError, OptimizerState, ScheduleError, Slots};
use crate::strategy::{ElasticState, EpochProgress};
use crate::variable::{Variable, VariableError};

/// Why the training state could not be saved to or restored from its checkpoints; each names
/// the directory, the step or the variable.
#[derive(Debug, thiserror::Error)]
pub enum StateCheckpointError {
    /// The checkpoint policy asked for is impossible (no checkpoint kept, a save every 0
    /// steps).
    #[error("checkpoint directory {}: {source}", dir.display())]
    Policy {
        /// The root directory.
        dir: PathBuf,
        /// What is wrong.
        source: PolicyError,
    },
    /// The checkpoints under the root could not be listed.
    #[error("checkpoint directory {}: {source}", dir.display())]
    List {
        /// The root directory.
        dir: PathBuf,
        /// What failed.
        source: ListError,
    },
    /// Writing the checkpoint of a step failed.
    #[error("saving step {step}: {source}")]
    Save {
        /// The step.
        step: u64,
        /// What failed.
        source: SaveError,
    },
    /// A variable could not be read or set.
    #[error("variable {name:?}: {source}")]
    Variable {
        /// The variable.
        name: String,
        /// What failed.
        source: VariableError,
    },
    /// A tensor of the checkpoint (a variable or one of its optimizer slots) could not be
    /// converted.
    #[error("{name}: {source}")]
    Tensor {
        /// The tensor's name in the checkpoint.
        name: String,
        /// What failed.
        source: TensorError,
    },
    /// The checkpoint lacks a tensor the model has.
    #[error("{}: no tensor {name:?} (a checkpoint of another model?)", dir.display())]
    MissingTensor {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// The tensor.
        name: String,
    },
    /// The checkpoint holds no shard.
    #[error("{}: the checkpoint holds no shard", dir.display())]
    NoShard {
        /// The checkpoint's directory.
        dir: PathBuf,
    },
    /// A variable has another shape in the checkpoint than in the model.
    #[error("{}: {name} has shape {there:?} there, {here:?} here", dir.display())]
    Shape {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// The variable.
        name: String,
        /// Its shape in the checkpoint.
        there: Vec<usize>,
        /// Its shape in the model.
        here: Vec<usize>,
    },
    /// A variable's optimizer slots in the checkpoint do not fit the optimizer.
    #[error("{}: {source}", dir.display())]
    Slots {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// What does not fit.
        source: OptimError,
    },
    /// The learning-rate schedule recorded in the checkpoint does not read as one.
    #[error("{}: the recorded learning-rate schedule ({LEARNING_RATE_SCHEDULE_KEY:?}) does not read: {source}", dir.display())]
    ScheduleUnreadable {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// What does not read.
        source: serde_json::Error,
    },
    /// The learning-rate schedule recorded in the checkpoint is one no optimizer accepts.
    #[error("{}: the recorded learning-rate schedule ({LEARNING_RATE_SCHEDULE_KEY:?}): {source}", dir.display())]
    ScheduleRefused {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// Why it is refused.
        source: ScheduleError,
    },
    /// A count the checkpoint records (its step, the optimizer's steps) is not a count a step
    /// can follow: not a whole number, or not below `i64::MAX` (the next step's count
    /// would not fit what recovery hands the other members).
    #[error("{}: the recorded {key} is {found}, not a count below {COUNT_LIMIT}", dir.display())]
    Count {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// What the count is.
        key: &'static str,
        /// What is there.
        found: serde_json::Value,
    },
    /// What the checkpoint records of the epochs (the count begun, the running figures) is
    /// not what it should be.
    #[error("{}: the recorded {key:?} is {found}, not {}", dir.display(), if *key == EPOCHS_BEGUN_KEY { "a count" } else { "a list of f64 bit patterns" })]
    Epochs {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// The key of the checkpoint's extra state.
        key: &'static str,
        /// What is there.
        found: serde_json::Value,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// The checkpoints of one job's training state under a root directory (see the module doc).
#[derive(Debug)]
pub struct StateCheckpoints {
    manager: CheckpointManager,
}

/// A checkpoint's `extra` key holding the optimizer's step count.
const OPTIMIZER_STEPS_KEY: &str = "optimizer_steps";
/// A checkpoint's `extra` key holding the optimizer's learning-rate schedule in force (absent
/// in checkpoints written before it was recorded: the optimizer's own stays).
const LEARNING_RATE_SCHEDULE_KEY: &str = "learning_rate_schedule";
/// A checkpoint's `extra` key holding the training epochs begun
/// ([`EpochProgress::begun`]; absent: 0).
const EPOCHS_BEGUN_KEY: &str = "epochs_begun";
/// A checkpoint's `extra` key holding the running figures of the epoch in progress
/// ([`EpochProgress::figures`]; absent: none), each as the bits of its `f64` (exact, and a
/// figure that is not finite is kept too).
const EPOCH_FIGURES_KEY: &str = "epoch_figures";

impl StateCheckpoints {
    /// Checkpoints under `root` (created if missing), a save due every `every_steps` steps
    /// (never on a schedule with `None`: then only where asked, e.g. at a departure), the
    /// newest `keep_last` kept.
    pub fn open(
        root: &Path,
        every_steps: Option<u64>,
        keep_last: usize,
    ) -> Result<Self, StateCheckpointError> {
        let policy = CheckpointPolicy {
            save_every_steps: every_steps,
            save_every: None,
            keep_last: keep_last.max(1),
        };
        let manager = CheckpointManager::new(root, policy, Instant::now()).map_err(|source| {
            StateCheckpointError::Policy {
                dir: root.to_path_buf(),
                source,
            }
        })?;
        Ok(Self { manager })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        self.manager.root()
    }

    /// Whether a scheduled save is due at `step`.
    pub fn should_save(&self, step: u64) -> bool {
        self.manager.should_save(step, Instant::now())
    }

    /// The step of the last checkpoint saved or restored here.
    pub fn last_saved_step(&self) -> Option<u64> {
        self.manager.last_saved_step()
    }

    /// Saves `state` (see the module doc); its directory. Where a checkpoint of that step is
    /// there already (a departure at a step the schedule saved), CKPT-1 keeps it and its
    /// directory is returned.
    pub fn save(&mut self, state: &ElasticState<'_>) -> Result<PathBuf, StateCheckpointError> {
        let mut ckpt = Checkpoint::new(state.step, 1);
        for variable in state.variables {
            let name = variable.name().to_string();
            let shape = variable.shape().to_vec();
            let value = variable
                .try_read_value()
                .map_err(|source| StateCheckpointError::Variable {
                    name: name.clone(),
                    source,
                })?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let tensor = TensorBytes::from_f32(shape.clone(), &value).map_err(|source| {
                StateCheckpointError::Tensor {
                    name: name.clone(),
                    source,
                }
            })?;
            ckpt.layout.push(Layout::unsharded(
                name.clone(),
                Dtype::F32,
                shape.clone(),
                0,
            ));
            ckpt.shards[0].tensors.insert(name.clone(), tensor);
            let Some(optimizer) = state.optimizer else {
                continue;
            };
            let Some(slots) = optimizer.export_slots(variable, 0) else {
                continue;
            };
            for slot in optimizer.kernel().slot_names() {
                if let Some(values) = slots.get(slot) {
                    let tensor =
                        TensorBytes::from_f32(shape.clone(), values).map_err(|source| {
                            StateCheckpointError::Tensor {
                                name: slot_tensor_name(&name, slot),
                                source,
                            }
                        })?;
                    ckpt.shards[0]
                        .tensors
                        .insert(slot_tensor_name(&name, slot), tensor);
                }
            }
        }
        ckpt.dataset_positions.insert(0, state.position);
        ckpt.extra = serde_json::json!({
            OPTIMIZER_STEPS_KEY: state.optimizer.map_or(0, |o| o.steps()),
            EPOCHS_BEGUN_KEY: state.epochs.begun,
            EPOCH_FIGURES_KEY: figures_to_json(&state.epochs.figures),
        });
        if let Some(schedule) = state.optimizer.and_then(|o| o.learning_rate_schedule()) {
            // A schedule is plain numbers: it always encodes.
            if let Ok(value) = serde_json::to_value(&schedule) {
                ckpt.extra[LEARNING_RATE_SCHEDULE_KEY] = value;
            }
        }
        match self.manager.save(&ckpt, Instant::now()) {
            Ok(dir) => Ok(dir),
            // This step is saved already (a departure at a step the schedule saved): CKPT-1
            // keeps that one, which holds this state.
            Err(SaveError::AlreadyExists { dir, .. }) => Ok(dir),
            Err(source) => Err(StateCheckpointError::Save {
                step: state.step,
                source,
            }),
        }
    }

    /// Restores the newest checkpoint that verifies into `state` (variables on every local
    /// copy, optimizer slots and step count, step and position); its step, or `None` where
    /// there is none. A checkpoint of another model (a variable missing, another shape) is an
    /// error naming it, found before any variable changes: restore before training, and fail
    /// the task on an error.
    pub fn restore_into(
        &mut self,
        state: &mut ElasticState<'_>,
        local_copies: usize,
    ) -> Result<Option<u64>, StateCheckpointError> {
        let root = self.root().to_path_buf();
        let outcome = self
            .manager
            .restore_latest()
            .map_err(|source| StateCheckpointError::List { dir: root, source })?;
        for skipped in &outcome.skipped {
            tracing::warn!(dir = %skipped.dir.display(), error = %skipped.error, "skipped a checkpoint that does not verify");
        }
        let Some(loaded) = outcome.restored else {
            return Ok(None);
        };
        let ckpt = &loaded.checkpoint;
        let dir = loaded.dir.clone();
        let shard = ckpt
            .shards
            .first()
            .ok_or_else(|| StateCheckpointError::NoShard { dir: dir.clone() })?;
        let read = |name: &str| read_tensor(shard, &dir, name);
        // Check every variable, the counts and the recorded schedule first: a mismatch
        // changes nothing.
        let (steps, optimizer_steps) = recorded_counts(ckpt, &dir)?;
        let schedule = recorded_schedule(&ckpt.extra, &dir)?;
        let epochs = recorded_epochs(&ckpt.extra, &dir)?;
        let mut values = Vec::with_capacity(state.variables.len());
        for variable in state.variables {
            let (shape, value) = read(variable.name())?;
            if shape != variable.shape() {
                return Err(StateCheckpointError::Shape {
                    dir: dir.clone(),
                    name: variable.name().to_owned(),
                    there: shape,
                    here: variable.shape().to_vec(),
                });
            }
            values.push(value);
        }
        for (variable, value) in state.variables.iter().zip(values) {
            let tensor = Tensor::from_vec(value, variable.shape(), &Device::Cpu)?;
            variable
                .assign(&tensor)
                .map_err(|source| StateCheckpointError::Variable {
                    name: variable.name().to_owned(),
                    source,
                })?;
        }
        if let Some(optimizer) = state.optimizer {
            restore_slots(optimizer, state.variables, shard, &dir, local_copies)?;
            optimizer.set_steps(optimizer_steps, local_copies);
            if let Some(schedule) = schedule {
                optimizer
                    .set_learning_rate_schedule(schedule)
                    .map_err(|source| StateCheckpointError::ScheduleRefused { dir, source })?;
            }
        }
        state.epochs = epochs;
        state.step = steps;
        state.position = ckpt.dataset_positions.get(&0).copied().unwrap_or(0);
        Ok(Some(steps))
    }
}

/// Tensor `name` of `shard` (a checkpoint's, in `dir`): its shape and values.
fn read_tensor(
    shard: &ShardTensors,
    dir: &Path,
    name: &str,
) -> Result<(Vec<usize>, Vec<f32>), StateCheckpointError> {
    let tensor = shard
        .tensors
        .get(name)
        .ok_or_else(|| StateCheckpointError::MissingTensor {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        })?;
    let values = tensor
        .to_f32()
        .map_err(|source| StateCheckpointError::Tensor {
            name: name.to_owned(),
            source,
        })?;
    Ok((tensor.shape().to_vec(), values))
}

/// The optimizer slots `shard` holds for `variables` (in `dir`), installed on `local_copies`
/// copies of each; a variable without slots there was never updated before the checkpoint.
fn restore_slots(
    optimizer: &dyn OptimizerState,
    variables: &[Variable],
    shard: &ShardTensors,
    dir: &Path,
    local_copies: usize,
) -> Result<(), StateCheckpointError> {
    let names = optimizer.kernel().slot_names();
    for variable in variables.iter().filter(|_| !names.is_empty()) {
        let name = variable.name();
        if !shard
            .tensors
            .contains_key(&slot_tensor_name(name, names[0]))
        {
            continue;
        }
        let mut named = Vec::with_capacity(names.len());
        for slot in names {
            named.push((
                *slot,
                read_tensor(shard, dir, &slot_tensor_name(name, slot))?.1,
            ));
        }
        let len = variable.shape().iter().product();
        let slots = Slots::restore(optimizer.kernel(), name, len, named, 0).map_err(|source| {
            StateCheckpointError::Slots {
                dir: dir.to_path_buf(),
                source,
            }
        })?;
        for component in 0..local_copies {
            optimizer.import_slots(variable, component, slots.clone());
        }
    }
    Ok(())
}

/// An epoch's running figures as JSON: each the bits of its `f64` (exact, where JSON numbers
/// need not read back to the last bit, and kept where a figure is not finite).
pub(crate) fn figures_to_json(figures: &[f64]) -> serde_json::Value {
    serde_json::json!(figures.iter().map(|f| f.to_bits()).collect::<Vec<u64>>())
}

/// The figures [`figures_to_json`] wrote; `None` where `value` is no list of bit patterns.
pub(crate) fn figures_from_json(value: &serde_json::Value) -> Option<Vec<f64>> {
    value
        .as_array()?
        .iter()
        .map(|bits| bits.as_u64().map(f64::from_bits))
        .collect()
}

/// Where the training loop stood in its epochs, as a checkpoint's `extra` records it
/// (nothing recorded: the default), checked.
fn recorded_epochs(
    extra: &serde_json::Value,
    dir: &Path,
) -> Result<EpochProgress, StateCheckpointError> {
    let wrong = |key: &'static str, found: &serde_json::Value| StateCheckpointError::Epochs {
        dir: dir.to_path_buf(),
        key,
        found: found.clone(),
    };
    let begun = match extra.get(EPOCHS_BEGUN_KEY) {
        None => 0,
        Some(value) => value
            .as_u64()
            .ok_or_else(|| wrong(EPOCHS_BEGUN_KEY, value))?,
    };
    let figures = match extra.get(EPOCH_FIGURES_KEY) {
        None => Vec::new(),
        Some(value) => figures_from_json(value).ok_or_else(|| wrong(EPOCH_FIGURES_KEY, value))?,
    };
    Ok(EpochProgress { begun, figures })
}

/// The bound below which a checkpoint's counts must lie: `i64::MAX`.
const COUNT_LIMIT: u64 = i64::MAX as u64;

/// The steps a checkpoint records and its optimizer's steps (the steps where it records none),
/// each one a step can follow.
fn recorded_counts(ckpt: &Checkpoint, dir: &Path) -> Result<(u64, u64), StateCheckpointError> {
    // Recovery hands the counts to the other members as i64 (`strategy::multi_worker`): one
    // a step can follow fits there with the next.
    let count = |key: &'static str, value: &serde_json::Value| match value.as_u64() {
        Some(count) if count < COUNT_LIMIT => Ok(count),
        _ => Err(StateCheckpointError::Count {
            dir: dir.to_path_buf(),
            key,
            found: value.clone(),
        }),
    };
    let steps = count("step", &serde_json::Value::from(ckpt.step))?;
    let optimizer_steps = match ckpt.extra.get(OPTIMIZER_STEPS_KEY) {
        None => steps,
        Some(value) => count(OPTIMIZER_STEPS_KEY, value)?,
    };
    Ok((steps, optimizer_steps))
}

/// The learning-rate schedule a checkpoint's `extra` records (none where it records none),
/// checked.
fn recorded_schedule(
    extra: &serde_json::Value,
    dir: &Path,
) -> Result<Option<LearningRateSchedule>, StateCheckpointError> {
    let schedule = match extra.get(LEARNING_RATE_SCHEDULE_KEY) {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => {
            let schedule = LearningRateSchedule::deserialize(value).map_err(|source| {
                StateCheckpointError::ScheduleUnreadable {
                    dir: dir.to_path_buf(),
                    source,
                }
            })?;
            schedule
                .validate()
                .map_err(|source| StateCheckpointError::ScheduleRefused {
                    dir: dir.to_path_buf(),
                    source,
                })?;
            Some(schedule)
        }
    };
    Ok(schedule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saving_a_step_saved_already_keeps_that_checkpoint() {
        let root =
            std::env::temp_dir().join(format!("cohort-state-ckpt-twice-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut checkpoints = StateCheckpoints::open(&root, Some(5), 3).unwrap();
        let state = ElasticState {
            step: 5,
            position: 40,
            variables: &[],
            optimizer: None,
            epochs: EpochProgress::default(),
        };
        let first = checkpoints.save(&state).unwrap();
        let again = checkpoints.save(&state).expect("the step is saved already");
        assert_eq!(again, first);
        assert_eq!(checkpoints.last_saved_step(), Some(5));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The rate a callback set and where the loop stood in its epochs come back with the
    /// state, onto an optimizer built at another rate.
    #[test]
    fn the_learning_rate_in_force_and_the_epochs_round_trip() {
        use crate::optim::Optimizer;
        use crate::train::DistributedOptimizer;
        let root =
            std::env::temp_dir().join(format!("cohort-state-ckpt-rate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut checkpoints = StateCheckpoints::open(&root, Some(5), 3).unwrap();
        let trained = DistributedOptimizer::new(Optimizer::sgd(0.1));
        trained.set_learning_rate(0.025).unwrap();
        let epochs = EpochProgress {
            begun: 3,
            // Exact bits, and a figure that is not finite, come back as they were.
            figures: vec![0.1 + 0.2, 192.0, f64::NAN],
        };
        let state = ElasticState {
            step: 30,
            position: 30,
            variables: &[],
            optimizer: Some(&trained),
            epochs: epochs.clone(),
        };
        checkpoints.save(&state).unwrap();
        let fresh = DistributedOptimizer::new(Optimizer::sgd(0.1));
        let mut state = ElasticState {
            step: 0,
            position: 0,
            variables: &[],
            optimizer: Some(&fresh),
            epochs: EpochProgress::default(),
        };
        assert_eq!(checkpoints.restore_into(&mut state, 1).unwrap(), Some(30));
        assert_eq!(state.epochs.begun, 3);
        let bits = |f: &[f64]| f.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&state.epochs.figures), bits(&epochs.figures));
        assert!((fresh.learning_rate() - 0.025).abs() < 1e-9);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// What a checkpoint records of the schedule and the epochs is checked before anything is
    /// restored: a schedule that does not read, one no optimizer takes, epochs begun that are
    /// no count and figures that are no bit patterns are errors naming the key; a checkpoint
    /// from before they were recorded has none.
    #[test]
    fn a_recorded_schedule_or_epoch_that_is_wrong_is_named() {
        let dir = Path::new("/ckpt/step-30");
        let old = serde_json::json!({"optimizer_steps": 3});
        assert!(matches!(recorded_schedule(&old, dir), Ok(None)));
        assert_eq!(
            recorded_epochs(&old, dir).unwrap(),
            EpochProgress::default()
        );
        let err = recorded_schedule(
            &serde_json::json!({"learning_rate_schedule": {"Constant": -1.0}}),
            dir,
        )
        .unwrap_err();
        assert!(
            matches!(err, StateCheckpointError::ScheduleRefused { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("learning_rate_schedule"), "{err}");
        let err = recorded_schedule(
            &serde_json::json!({"learning_rate_schedule": {"Sometimes": 2}}),
            dir,
        )
        .unwrap_err();
        assert!(
            matches!(err, StateCheckpointError::ScheduleUnreadable { .. }),
            "{err}"
        );
        let err = recorded_epochs(&serde_json::json!({"epochs_begun": "three"}), dir).unwrap_err();
        assert!(err.to_string().contains("epochs_begun"), "{err}");
        assert!(err.to_string().contains("/ckpt/step-30"), "{err}");
        let err =
            recorded_epochs(&serde_json::json!({"epoch_figures": [1, -2.5]}), dir).unwrap_err();
        assert!(err.to_string().contains("epoch_figures"), "{err}");
        assert!(err.to_string().contains("bit patterns"), "{err}");
    }

    /// A checkpoint whose step or optimizer steps are at the largest count is refused before
    /// anything is restored: the next step's count would overflow.
    #[test]
    fn a_recorded_count_no_step_can_follow_is_refused_and_restores_nothing() {
        use crate::optim::Optimizer;
        use crate::train::DistributedOptimizer;
        let root =
            std::env::temp_dir().join(format!("cohort-state-ckpt-counts-{}", std::process::id()));
        for (step, optimizer_steps, key) in
            [(u64::MAX, 3, "step"), (30, u64::MAX, OPTIMIZER_STEPS_KEY)]
        {
            let _ = std::fs::remove_dir_all(&root);
            let mut checkpoints = StateCheckpoints::open(&root, Some(5), 3).unwrap();
            let trained = DistributedOptimizer::new(Optimizer::sgd(0.1));
            trained.set_steps(optimizer_steps, 1);
            let state = ElasticState {
                step,
                position: 30,
                variables: &[],
                optimizer: Some(&trained),
                epochs: EpochProgress::default(),
            };
            checkpoints.save(&state).unwrap();
            let fresh = DistributedOptimizer::new(Optimizer::sgd(0.1));
            let mut state = ElasticState {
                step: 0,
                position: 0,
                variables: &[],
                optimizer: Some(&fresh),
                epochs: EpochProgress::default(),
            };
            let err = checkpoints.restore_into(&mut state, 1).unwrap_err();
            assert!(
                matches!(&err, StateCheckpointError::Count { key: k, .. } if *k == key),
                "{err}"
            );
            assert!(err.to_string().contains(&COUNT_LIMIT.to_string()), "{err}");
            assert_eq!((state.step, state.position, fresh.steps()), (0, 0, 0));
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
