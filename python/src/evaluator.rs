//! A Python job's evaluator task (TensorFlow's sidecar evaluator): cohort's evaluator role
//! (`cohort::roles::evaluator`) with the script's evaluation function.
//!
//! The role watches the checkpoint directory and reads every newer checkpoint that verifies
//! (CKPT-1), as it does for a Rust program; here its evaluation function is the script's. The
//! function is called through a Python adapter (`cohort.evaluator._evaluate`), which turns the
//! checkpoint's variables into NumPy arrays and the function's value into named numbers; the
//! role logs them, writes them to TensorBoard and stops as the role's documentation says.
//! An exception the function raised is kept and raised again from [`evaluate`] once the role has
//! stopped, so the script sees its own exception, not a message.

use std::sync::{Arc, Mutex};

use cohort::checkpoint::TensorBytes;
use cohort::cluster::TaskType;
use cohort::program::{CheckpointVariables, EvalError, Metrics, Program};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::values::F32Values;

/// The first exception the script's evaluation function raised.
type Raised = Arc<Mutex<Option<PyErr>>>;

/// Makes this process the evaluator task of the job `name` and runs it until it stops: each
/// checkpoint's variables go to `adapter` (`cohort.evaluator._evaluate`) as
/// `(step, [(name, dtype, shape, values)])`, and it returns `[(metric, value)]`. `args` are the
/// script's arguments (configuration flags among them are taken). Returns the role's exit code:
/// 0 stopped by itself, 143 stopped by SIGTERM or SIGINT, 1 or 2 failed (the log says why).
/// Raises the function's own exception where it raised one, and a `ValueError` naming the
/// setting where this process is no evaluator or no checkpoint directory is configured.
#[pyfunction]
pub(crate) fn evaluate(
    py: Python<'_>,
    adapter: Py<PyAny>,
    name: String,
    args: Vec<String>,
) -> PyResult<i32> {
    let config = crate::role_config(&args)?;
    let task = config.cluster.task.task_type;
    if task != TaskType::Evaluator {
        return Err(PyValueError::new_err(format!(
            "task.type: this process is a {task} task; a sidecar evaluator runs as an evaluator \
             task (`python -m cohort launch --evaluators 1`, or `evaluator` in TF_CONFIG)"
        )));
    }
    if config.checkpoint_dir.is_none() {
        return Err(PyValueError::new_err(
            "checkpoint_dir: the evaluator needs the checkpoint directory to watch: pass \
             --checkpoint-dir, set COHORT_CHECKPOINT_DIR, or set checkpoint_dir in cohort.toml",
        ));
    }
    let raised: Raised = Arc::default();
    let kept = Arc::clone(&raised);
    let program = Program::new(name).evaluator(move |variables| {
        Python::attach(|py| call_adapter(py, &adapter, variables, &kept))
    });
    let code = py.detach(move || cohort::program::run_role_with_args(program, &args));
    let raised = raised.lock().ok().and_then(|mut raised| raised.take());
    match raised {
        Some(err) => Err(err),
        None => Ok(code),
    }
}

/// Calls the adapter with one checkpoint's variables; an exception is kept in `raised` (the
/// first one) and fails the evaluation with its text.
fn call_adapter(
    py: Python<'_>,
    adapter: &Py<PyAny>,
    variables: &CheckpointVariables,
    raised: &Raised,
) -> Result<Metrics, EvalError> {
    let outcome = variables_for_python(py, variables).and_then(|list| {
        adapter
            .bind(py)
            .call1((variables.step(), list))?
            .extract::<Vec<(String, f64)>>()
    });
    outcome.map_err(|err| {
        let text = format!(
            "{}: {}",
            err.get_type(py)
                .name()
                .map_or_else(|_| "exception".into(), |n| n.to_string()),
            err.value(py)
        );
        if let Ok(mut slot) = raised.lock() {
            slot.get_or_insert(err);
        }
        EvalError::other(text)
    })
}

/// `[(name, dtype, shape, values)]` of every variable, by name: an `F32` variable's values lent
/// without a copy ([`F32Values`]), any other dtype's as little-endian bytes, `dtype` its
/// safetensors name (`"F32"`, `"I64"`...).
fn variables_for_python<'py>(
    py: Python<'py>,
    variables: &CheckpointVariables,
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for name in variables.names() {
        let Some(tensor) = variables.get(name) else {
            continue;
        };
        let values = values_for_python(py, tensor)?;
        list.append((
            name,
            tensor.dtype().as_str(),
            tensor.shape().to_vec(),
            values,
        ))?;
    }
    Ok(list)
}

fn values_for_python<'py>(py: Python<'py>, tensor: &TensorBytes) -> PyResult<Bound<'py, PyAny>> {
    match tensor.to_f32() {
        Ok(values) => Ok(F32Values::into_py(py, values)?.into_any()),
        Err(_) => Ok(PyBytes::new(py, tensor.data()).into_any()),
    }
}
