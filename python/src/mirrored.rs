//! A MultiWorkerMirrored worker for a Python script: every task runs the whole script, its
//! variables mirrored (they start as the first worker's) and its gradients all-reduced among
//! the workers over cohort's process group.
//!
//! The strategy is `cohort::strategy::MultiWorkerMirrored`, made from the task's environment
//! as a Rust program's (`TF_CONFIG`, `COHORT_CERTS`, `COHORT_COMMUNICATION`...). Values cross
//! as float32 buffers; every collective lets the interpreter go while it waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cohort::candle::{Device, Tensor};
use cohort::run_report::FinalModel;
use cohort::strategy::{
    ElasticState, GroupChange, Leave, MultiWorkerMirrored, PerReplica, ReduceOp, SaveStateError,
    Strategy,
};
use cohort::train::{DistributedOptimizer, StateCheckpointError, StateCheckpoints};
use cohort::variable::Variable;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::optimizers::Scheduled;
use crate::values::F32Values;
use crate::{CheckpointError, CohortError};

pyo3::create_exception!(
    _native,
    GroupError,
    CohortError,
    "The workers' group failed a collective (a worker lost, or one failed its step)."
);

/// The strategy, the variables made in its scope (in creation order), and the optimizer made
/// in its scope, whose slots and step count travel with the variables when the group changes.
struct Mirrored {
    strategy: MultiWorkerMirrored,
    variables: Vec<Variable>,
    optimizer: Option<DistributedOptimizer>,
    /// The step training stands at, as the loop last said (`at_step_boundary`, `recover`).
    step: u64,
    /// This worker left the group (preempted, drained, or left out): it has no final model.
    left: bool,
    /// The training state's checkpoints, once the script opened them
    /// (`cohort.CheckpointManager`): the first worker saves them, and saves one before a
    /// preempted worker leaves.
    checkpoints: Option<StateCheckpoints>,
}

impl Mirrored {
    /// Writes this worker's final model into its run report (`cohort::run_report`, which
    /// `cohort chaos run` reads; the strategy wrote that the job is a MultiWorkerMirrored one
    /// as it was made, and keeps the group's generations), unless it left the group.
    fn report_the_end(&mut self) -> PyResult<()> {
        if self.left || !cohort::run_report::asked() {
            return Ok(());
        }
        let model = FinalModel::of_variables(self.step, &self.variables)
            .map_err(|e| CohortError::new_err(e.to_string()))?;
        self.strategy.report_final_model(model);
        Ok(())
    }
}

/// This task's MultiWorkerMirrored strategy (`cohort.MultiWorkerMirroredStrategy` wraps it).
#[pyclass(module = "cohort._native")]
pub(crate) struct MultiWorker {
    mirrored: Mutex<Option<Mirrored>>,
    /// Set by SIGTERM or SIGINT: a preemption notice.
    notice: Arc<AtomicBool>,
    /// Set by SIGUSR1: the job scaled down (this worker drained).
    drain: Arc<AtomicBool>,
}

/// The training state the strategy's elastic calls and checkpoints take: `variables` and
/// `optimizer`'s slots at `step` and `position`.
fn elastic_state<'a>(
    step: u64,
    position: u64,
    variables: &'a [Variable],
    optimizer: Option<&'a DistributedOptimizer>,
) -> ElasticState<'a> {
    ElasticState {
        step,
        position,
        variables,
        optimizer: optimizer.map(|o| o as _),
        epochs: Default::default(),
    }
}

/// A checkpoint error as Python's: an impossible policy is a `ValueError`, the rest a
/// `CheckpointError`; each names the directory, the step or the variable.
fn checkpoint_error(error: &StateCheckpointError) -> PyErr {
    match error {
        StateCheckpointError::Policy { .. } => PyValueError::new_err(error.to_string()),
        _ => CheckpointError::new_err(error.to_string()),
    }
}

fn no_checkpoints() -> PyErr {
    CohortError::new_err(
        "this strategy has no checkpoints: make a cohort.CheckpointManager(strategy) first",
    )
}

/// A tensor's values, flat, for Python.
fn tensor_values<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, F32Values>> {
    let values = tensor
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| CohortError::new_err(e.to_string()))?;
    F32Values::into_py(py, values)
}

fn tensor(values: Vec<f32>, shape: &[usize]) -> PyResult<Tensor> {
    // candle multiplies the dimensions unchecked: a product that overflows would wrap and
    // pass its length check.
    shape
        .iter()
        .try_fold(1usize, |n, dim| n.checked_mul(*dim))
        .ok_or_else(|| PyValueError::new_err(format!("shape {shape:?}: too many elements")))?;
    Tensor::from_vec(values, shape, &Device::Cpu)
        .map_err(|e| PyValueError::new_err(format!("shape {shape:?}: {e}")))
}

impl MultiWorker {
    fn lock(&self) -> PyResult<MutexGuard<'_, Option<Mirrored>>> {
        self.mirrored
            .lock()
            .map_err(|_| CohortError::new_err("the strategy was poisoned by a panic"))
    }

    /// Runs `f` on the strategy, raising if it was closed.
    fn with<R>(&self, f: impl FnOnce(&mut Mirrored) -> PyResult<R>) -> PyResult<R> {
        let mut guard = self.lock()?;
        match guard.as_mut() {
            Some(mirrored) => f(mirrored),
            None => Err(CohortError::new_err("the strategy is closed")),
        }
    }

    fn variable(mirrored: &Mirrored, index: usize) -> PyResult<&Variable> {
        mirrored
            .variables
            .get(index)
            .ok_or_else(|| PyValueError::new_err(format!("no variable {index}")))
    }
}

#[pymethods]
impl MultiWorker {
    /// Makes the strategy from this task's environment and joins the workers' group (waits for
    /// the others, bounded by the form timeout). A bad setting is a `ValueError` naming it.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        let config =
            cohort::bootstrap::multi_worker_config_from_env(cohort::bootstrap::COMMUNICATION_ENV)
                .map_err(|e| PyValueError::new_err(format!("bad config: {e}")))?;
        let notice = Arc::new(AtomicBool::new(false));
        let drain = Arc::new(AtomicBool::new(false));
        cohort::process::stop_on_signals(&notice)
            .and_then(|()| cohort::process::drain_on_signal(&drain))
            .map_err(|e| CohortError::new_err(format!("cannot watch for signals: {e}")))?;
        let strategy = py
            .detach(move || MultiWorkerMirrored::new(config).map_err(|e| e.to_string()))
            .map_err(GroupError::new_err)?;
        Ok(Self {
            mirrored: Mutex::new(Some(Mirrored {
                strategy,
                variables: Vec::new(),
                optimizer: None,
                step: 0,
                left: false,
                checkpoints: None,
            })),
            notice,
            drain,
        })
    }

    /// Workers in the group now.
    fn num_workers(&self) -> PyResult<usize> {
        self.with(|m| Ok(m.strategy.num_workers()))
    }

    /// This worker's rank in the group (the chief is 0).
    fn worker_index(&self) -> PyResult<usize> {
        self.with(|m| Ok(m.strategy.worker_index()))
    }

    /// Replicas in sync across the group.
    fn num_replicas_in_sync(&self) -> PyResult<usize> {
        self.with(|m| Ok(m.strategy.num_replicas_in_sync()))
    }

    /// True once SIGTERM or SIGINT asked this process to stop.
    fn preemption_requested(&self) -> bool {
        self.notice.load(Ordering::SeqCst) && !self.drain.load(Ordering::SeqCst)
    }

    /// Makes a mirrored variable from `values` (float32, row-major, `shape`): every worker
    /// makes the same variables in the same order, and each starts as the first worker's.
    /// Returns its index.
    fn create_variable(
        &self,
        py: Python<'_>,
        name: String,
        shape: Vec<usize>,
        values: PyBuffer<f32>,
    ) -> PyResult<usize> {
        let values = values.to_vec(py)?;
        let initial = tensor(values, &shape)?;
        self.with(|m| {
            let variable = {
                let _scope = m
                    .strategy
                    .try_scope()
                    .map_err(|e| CohortError::new_err(e.to_string()))?;
                Variable::new(name.clone(), initial)
                    .map_err(|e| GroupError::new_err(format!("variable {name:?}: {e}")))?
            };
            m.variables.push(variable);
            Ok(m.variables.len() - 1)
        })
    }

    /// Variable `index`'s value (float32, row-major).
    fn read_variable<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, F32Values>> {
        let value = self.with(|m| Ok(Self::variable(m, index)?.read_value()))?;
        tensor_values(py, &value)
    }

    /// Sets variable `index` to `values` (float32, row-major, its shape) on this worker.
    fn assign_variable(&self, py: Python<'_>, index: usize, values: PyBuffer<f32>) -> PyResult<()> {
        let values = values.to_vec(py)?;
        self.with(|m| {
            let variable = Self::variable(m, index)?;
            let value = tensor(values, variable.shape())?;
            variable
                .assign(&value)
                .map_err(|e| PyValueError::new_err(format!("variable {:?}: {e}", variable.name())))
        })
    }

    /// The sum (or with `mean`, the mean over the replicas in sync) of `values` (float32,
    /// row-major) over every worker: the same bits on all of them. Raises `GroupError` when
    /// the group failed it.
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        values: PyBuffer<f32>,
        mean: bool,
    ) -> PyResult<Bound<'py, F32Values>> {
        let len = values.item_count();
        let local = tensor(values.to_vec(py)?, &[len])?;
        let op = if mean { ReduceOp::Mean } else { ReduceOp::Sum };
        let reduced = self.with(|m| {
            let strategy = &m.strategy;
            py.detach(|| strategy.reduce(op, &PerReplica::new(vec![local]), None))
                .map_err(|e| GroupError::new_err(e.to_string()))
        })?;
        tensor_values(py, &reduced)
    }

    /// Makes the strategy's optimizer (`(kind, learning_rate or schedule, hyperparameters)`, as the
    /// parameter servers' is given): the one `apply_gradients` runs, whose slots and step
    /// count every group change carries with the variables. One per strategy; a second is a
    /// `ValueError`.
    fn set_optimizer(&self, optimizer: crate::optimizers::OptimizerSpec) -> PyResult<()> {
        let Scheduled {
            optimizer,
            schedule,
        } = crate::optimizers::optimizer(&optimizer)?;
        let mut optimizer = DistributedOptimizer::new(optimizer);
        if let Some(schedule) = schedule {
            optimizer = optimizer
                .with_schedule(schedule)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        self.with(|m| {
            if m.optimizer.is_some() {
                return Err(PyValueError::new_err(
                    "this strategy has an optimizer already: make one optimizer in its scope \
                     (its slots follow the variables when the group changes)",
                ));
            }
            m.optimizer = Some(optimizer);
            Ok(())
        })
    }

    /// Applies `grads` (float32, row-major, one per variable of `indices`: the gradients
    /// already summed over the workers, the same on every one) with the strategy's optimizer to
    /// this worker's copy of each variable: every worker makes the same update. Nothing changes
    /// when a gradient does not fit its variable (a `ValueError` naming it).
    fn apply_gradients(
        &self,
        py: Python<'_>,
        indices: Vec<usize>,
        grads: Vec<PyBuffer<f32>>,
    ) -> PyResult<()> {
        if indices.len() != grads.len() {
            return Err(PyValueError::new_err(format!(
                "{} variables and {} gradients",
                indices.len(),
                grads.len()
            )));
        }
        let values = grads
            .iter()
            .map(|g| g.to_vec(py))
            .collect::<PyResult<Vec<_>>>()?;
        self.with(|m| {
            let optimizer = m.optimizer.as_ref().ok_or_else(|| {
                CohortError::new_err(
                    "this strategy has no optimizer: make it in `strategy.scope()`",
                )
            })?;
            let mut pairs = Vec::with_capacity(indices.len());
            for (&index, values) in indices.iter().zip(values) {
                let variable = Self::variable(m, index)?;
                let grad = tensor(values, variable.shape()).map_err(|_| {
                    PyValueError::new_err(format!(
                        "variable {:?}: shape {:?}; its gradient does not fit it",
                        variable.name(),
                        variable.shape()
                    ))
                })?;
                pairs.push((grad, variable.clone()));
            }
            py.detach(|| optimizer.apply_gradients(pairs))
                .map(drop)
                .map_err(|e| CohortError::new_err(e.to_string()))
        })
    }

    /// True on a worker that joined a live group and has not received its state yet (its
    /// first `at_step_boundary` gives it).
    fn awaits_state(&self) -> PyResult<bool> {
        self.with(|m| Ok(m.strategy.awaits_state()))
    }

    /// The step boundary before each step (`MultiWorkerMirrored::at_step_boundary`): admits
    /// the workers waiting to join, lets a preempted or drained worker leave (this one, after
    /// SIGTERM or SIGUSR1), and on a joiner receives the state. `save(step, position)` is
    /// called on the chief before a preempted worker leaves (a checkpoint). Returns
    /// `(change, step, position, detail)`: `change` is `None`, `"admitted"`, `"departed"` or
    /// `"leaving"` (this worker leaves: end the script), and training goes on from `step` and
    /// `position`. Raises `GroupError` when the group failed it (then `recover`).
    #[pyo3(signature = (step, position, save=None))]
    fn at_step_boundary(
        &self,
        py: Python<'_>,
        step: u64,
        position: u64,
        save: Option<Py<PyAny>>,
    ) -> PyResult<(Option<&'static str>, u64, u64, String)> {
        let leaving = Leave::noticed(Some(&self.notice), Some(&self.drain));
        self.with(|m| {
            let Mirrored {
                strategy,
                variables,
                optimizer,
                checkpoints,
                ..
            } = &mut *m;
            let (change, step, position) = py.detach(|| {
                let mut state = elastic_state(step, position, variables, optimizer.as_ref());
                // The script's own save, else the checkpoints it opened (a preemption
                // checkpoint, as TensorFlow's PreemptionCheckpointHandler saves).
                let mut save_state = |state: &ElasticState<'_>| -> Result<(), SaveStateError> {
                    if let Some(save) = &save {
                        return Python::attach(|py| {
                            save.call1(py, (state.step, state.position))
                                .map(drop)
                                .map_err(|e| SaveStateError::from(e.to_string()))
                        });
                    }
                    let Some(checkpoints) = checkpoints.as_mut() else {
                        return Ok(());
                    };
                    let dir = checkpoints
                        .save(state)
                        .map_err(|e| SaveStateError::from(e.to_string()))?;
                    tracing::info!(step = state.step, dir = %dir.display(), "saved the checkpoint of a departure");
                    Ok(())
                };
                let change = strategy.at_step_boundary(&mut state, leaving, &mut save_state);
                (change, state.step, state.position)
            });
            let change = change.map_err(|e| GroupError::new_err(e.to_string()))?;
            m.step = step;
            match &change {
                Some(GroupChange::Leaving(_)) => m.left = true,
                Some(GroupChange::Admitted(_) | GroupChange::Departed(_)) | None => {}
            }
            Ok(match change {
                None => (None, step, position, String::new()),
                Some(GroupChange::Admitted(a)) => {
                    let joined: Vec<String> = a.joined.iter().map(ToString::to_string).collect();
                    let detail = format!(
                        "generation {}: admitted {} (the state of {})",
                        a.generation,
                        joined.join(", "),
                        a.source
                    );
                    (Some("admitted"), a.step, a.position, detail)
                }
                Some(GroupChange::Departed(d)) => {
                    let detail = format!("generation {}: {}", d.generation, d.describe());
                    (Some("departed"), d.step, d.position, detail)
                }
                Some(GroupChange::Leaving(d)) => {
                    (Some("leaving"), d.step, d.position, d.describe())
                }
            })
        })
    }

    /// Opens the training state's checkpoints under `dir` (created if missing): a save due
    /// every `every_steps` steps (`None`: only where asked, and before a preempted worker
    /// leaves), the newest `keep_last` kept. One set per strategy; a second is a `ValueError`,
    /// as is an impossible policy.
    fn open_checkpoints(
        &self,
        dir: std::path::PathBuf,
        every_steps: Option<u64>,
        keep_last: usize,
    ) -> PyResult<()> {
        if keep_last == 0 || every_steps == Some(0) {
            return Err(PyValueError::new_err(format!(
                "checkpoints under {}: keep at least one (max_to_keep) and save every 1 step or \
                 more (checkpoint_interval)",
                dir.display()
            )));
        }
        self.with(|m| {
            if m.checkpoints.is_some() {
                return Err(PyValueError::new_err(
                    "this strategy's checkpoints are open already: make one CheckpointManager",
                ));
            }
            let opened = StateCheckpoints::open(&dir, every_steps, keep_last)
                .map_err(|e| checkpoint_error(&e))?;
            m.checkpoints = Some(opened);
            Ok(())
        })
    }

    /// On a fresh start, gives every worker the newest checkpoint that verifies: the first
    /// worker restores it (variables, optimizer slots and step count, step and position),
    /// and every worker takes the state of the one with the most steps
    /// (`MultiWorkerMirrored::agree`). Call it on every worker together, after the variables
    /// and the optimizer were made. A worker admitted to a live group restores nothing (its
    /// first `at_step_boundary` gives it the state). Returns `(step, position)`. A checkpoint of
    /// another model (a variable missing, another shape) is a `CheckpointError` naming it,
    /// raised before any variable changes; the checkpoint stays as it was.
    fn restore_checkpoint(&self, py: Python<'_>, step: u64, position: u64) -> PyResult<(u64, u64)> {
        self.with(|m| {
            if m.strategy.awaits_state() {
                return Ok((step, position));
            }
            let Mirrored {
                strategy,
                variables,
                optimizer,
                checkpoints,
                ..
            } = &mut *m;
            let checkpoints = checkpoints.as_mut().ok_or_else(no_checkpoints)?;
            let local_copies = strategy.local_replicas().len();
            let restored = py.detach(|| {
                let mut state = elastic_state(step, position, variables, optimizer.as_ref());
                if strategy.is_chief() {
                    match checkpoints.restore_into(&mut state, local_copies) {
                        Ok(Some(restored)) => tracing::info!(step = restored, dir = %checkpoints.root().display(), "restored the newest checkpoint"),
                        Ok(None) => {}
                        Err(e) => return Err(checkpoint_error(&e)),
                    }
                }
                strategy
                    .agree(&mut state)
                    .map_err(|e| GroupError::new_err(e.to_string()))?;
                Ok((state.step, state.position))
            })?;
            m.step = restored.0;
            Ok(restored)
        })
    }

    /// Saves the training state at `step` and `position` on the first worker (the others save
    /// nothing): with `check_interval`, only where a save is due at that step. Returns the
    /// checkpoint's directory where this worker saved one. A failed write is a
    /// `CheckpointError` naming the step; nothing of the earlier checkpoints is lost.
    fn save_checkpoint(
        &self,
        py: Python<'_>,
        step: u64,
        position: u64,
        check_interval: bool,
    ) -> PyResult<Option<String>> {
        self.with(|m| {
            let Mirrored {
                strategy,
                variables,
                optimizer,
                checkpoints,
                ..
            } = &mut *m;
            let checkpoints = checkpoints.as_mut().ok_or_else(no_checkpoints)?;
            if !strategy.is_chief() || (check_interval && !checkpoints.should_save(step)) {
                return Ok(None);
            }
            let state = elastic_state(step, position, variables, optimizer.as_ref());
            py.detach(|| checkpoints.save(&state).map_err(|e| checkpoint_error(&e)))
                .map(|dir| Some(dir.display().to_string()))
        })
    }

    /// The step of the newest checkpoint saved or restored here (none: nothing yet).
    fn last_checkpoint_step(&self) -> PyResult<Option<u64>> {
        self.with(|m| {
            let checkpoints = m.checkpoints.as_ref().ok_or_else(no_checkpoints)?;
            Ok(checkpoints.last_saved_step())
        })
    }

    /// Re-forms the group with the survivors after a collective failed
    /// (`MultiWorkerMirrored::recover`): every survivor takes the variables, step and position
    /// of the one with the most completed steps. Returns `(step, position, detail)`; raises
    /// `GroupError` when no group could re-form (no quorum, or this worker was left out): end
    /// the script, and the supervisor restarts it as a joiner.
    fn recover(&self, py: Python<'_>, step: u64, position: u64) -> PyResult<(u64, u64, String)> {
        self.with(|m| {
            let Mirrored {
                strategy,
                variables,
                optimizer,
                ..
            } = &mut *m;
            let recovered = py.detach(|| {
                let mut state = elastic_state(step, position, variables, optimizer.as_ref());
                strategy.recover(&mut state)
            });
            let r = match recovered {
                Ok(r) => r,
                Err(e) => {
                    // Left out (or no quorum): this process ends and a new one joins.
                    m.left = true;
                    return Err(GroupError::new_err(e.to_string()));
                }
            };
            m.step = r.step;
            let lost: Vec<String> = r.lost.iter().map(ToString::to_string).collect();
            let detail = format!(
                "generation {} with {} workers (lost {}: {}); going on from step {} with the state \
                 of {}",
                r.generation,
                r.members.len(),
                lost.join(", "),
                r.cause,
                r.step,
                r.source
            );
            Ok((r.step, r.position, detail))
        })
    }

    /// Leaves the group and stops the strategy's runtime (at the script's end); returns the
    /// exit code the task should end with: 143 after a stop request, else 0. With `finished`
    /// (the script ran to its end), this worker's final model goes into its run report first,
    /// unless it left the group.
    #[pyo3(signature = (finished=true))]
    fn close(&self, py: Python<'_>, finished: bool) -> PyResult<i32> {
        let taken = self.lock()?.take();
        if let Some(mut mirrored) = taken {
            let reported = if finished {
                mirrored.report_the_end()
            } else {
                Ok(())
            };
            py.detach(move || drop(mirrored));
            reported?;
        }
        Ok(if self.preemption_requested() {
            cohort::process::PREEMPTED_EXIT_CODE
        } else {
            0
        })
    }
}
