//! `cohort._native`: the part of cohort's Python package written in Rust.
//!
//! It owns the bridge between a Python script and cohort's runtime, and nothing else: the
//! Python API (`cohort/*.py`) decides what a user sees. The ways into the runtime:
//! - `launch`: a local cluster of a script, as `cohort launch` starts one of a program;
//! - `serve`: this process becomes its task (a worker or a parameter server) and runs the
//!   Python steps the chief schedules, until the job ends (module `worker`);
//! - `Chief`: the chief's coordinator, driven by the script that goes on (module `chief`);
//! - `MultiWorker`: a MultiWorkerMirrored task's strategy (module `mirrored`);
//! - `evaluate`: this process becomes the job's evaluator task, evaluating each new checkpoint
//!   with the script's function (module `evaluator`).
//!
//! The runtime's threads never wait for the interpreter on their own: every call from Python
//! that blocks (a fetch, a join, a whole role) lets the interpreter go first, and a worker
//! thread takes the interpreter only to run the step it was given.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;

mod chief;
mod evaluator;
mod mirrored;
mod optimizers;
mod values;
mod worker;

/// mimalloc for every allocation of the runtime in this process, as in the `cohort` binary
/// (see `cohort::process::keep_freed_memory`); Python's own allocations keep the interpreter's
/// allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(
    _native,
    CohortError,
    PyException,
    "An error of cohort's runtime."
);
create_exception!(
    _native,
    ClosureError,
    CohortError,
    "A scheduled function failed, was cancelled, or could not run."
);
create_exception!(
    _native,
    VariableError,
    CohortError,
    "A variable could not be created, read or placed."
);
create_exception!(
    _native,
    CheckpointError,
    CohortError,
    "A checkpoint could not be written, read or restored."
);

/// Runs a local cluster of `interpreter` (the script's `sys.executable`) running `task_args`
/// (the script and its arguments) in every task, one process per task, supervised, as
/// `cohort launch` does; `args` are `launch`'s flags (`--workers`, `--ps`,
/// `--kill-worker-after`...). With `multi_worker`, a MultiWorkerMirrored job: the chief is a
/// peer of the workers and there is no parameter server. Returns the chief's exit code.
#[pyfunction]
fn launch(
    py: Python<'_>,
    interpreter: PathBuf,
    args: Vec<String>,
    task_args: Vec<String>,
    multi_worker: bool,
) -> i32 {
    py.detach(move || {
        if multi_worker {
            cohort::bootstrap::launch_multi_worker_program(interpreter, &args, task_args)
        } else {
            cohort::bootstrap::launch_program_from_args(interpreter, &args, task_args)
        }
    })
}

/// The help of `launch`'s flags under `usage` and `about` (what `python -m cohort launch
/// --help` prints).
#[pyfunction]
fn launch_help(usage: &str, about: &str) -> String {
    cohort::bootstrap::launch_help(usage, about)
}

/// The process's task, as its configuration gives it (flags in `args`, the environment,
/// `TF_CONFIG`, `cohort.toml`): `(type, index, number of workers, number of parameter
/// servers)`, e.g. `("worker", 1, 2, 2)`. A missing or bad configuration is a `ValueError`
/// naming the key.
#[pyfunction]
fn task(args: Vec<String>) -> PyResult<(String, u32, usize, usize)> {
    use cohort::cluster::TaskType;
    let config = role_config(&args)?;
    let cluster = &config.cluster;
    Ok((
        cluster.task.task_type.as_str().to_string(),
        cluster.task.index,
        cluster.cluster.num_tasks(TaskType::Worker),
        cluster.cluster.num_tasks(TaskType::Ps),
    ))
}

/// The checkpoint directory the process's configuration names (`--checkpoint-dir` in `args`,
/// `COHORT_CHECKPOINT_DIR`, `checkpoint_dir` in `cohort.toml`), if any; a bad configuration is
/// a `ValueError` naming the key.
#[pyfunction]
fn checkpoint_dir(args: Vec<String>) -> PyResult<Option<std::path::PathBuf>> {
    Ok(role_config(&args)?.checkpoint_dir)
}

/// The process's configuration (flags in `args`, the environment, `TF_CONFIG`,
/// `cohort.toml`), as its role reads it; a missing or bad one is a `ValueError` naming the key.
pub(crate) fn role_config(args: &[String]) -> PyResult<cohort::cluster::RoleConfig> {
    let (flags, _) = cohort::cluster::ConfigFlags::extract(args)
        .map_err(|e| PyValueError::new_err(format!("bad config: {e}")))?;
    let env = |key: &str| std::env::var(key).ok();
    cohort::cluster::load_role_config(&flags, &env)
        .map_err(|e| PyValueError::new_err(format!("bad config: {e}")))
}

/// `cohort._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    cohort::process::keep_freed_memory();
    let py = m.py();
    let cohort_error = py.get_type::<CohortError>();
    // Every error says whether it asks for the chief's restart (see `chief::raised`): no, but
    // where the chief sets it on the one it raises.
    cohort_error.setattr("restarts_chief", false)?;
    m.add("CohortError", cohort_error)?;
    m.add("ClosureError", py.get_type::<ClosureError>())?;
    m.add("VariableError", py.get_type::<VariableError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(optimizers::schedule_rate, m)?)?;
    m.add_function(wrap_pyfunction!(launch_help, m)?)?;
    m.add_function(wrap_pyfunction!(task, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint_dir, m)?)?;
    m.add_function(wrap_pyfunction!(worker::serve, m)?)?;
    m.add_function(wrap_pyfunction!(evaluator::evaluate, m)?)?;
    m.add("StepInterrupted", py.get_type::<worker::StepInterrupted>())?;
    m.add_class::<worker::StepContext>()?;
    m.add_class::<chief::Chief>()?;
    m.add("GroupError", py.get_type::<mirrored::GroupError>())?;
    m.add_class::<mirrored::MultiWorker>()?;
    m.add_class::<values::F32Values>()?;
    m.add_class::<values::ByteValues>()?;
    Ok(())
}
