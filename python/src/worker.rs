//! A worker's or a parameter server's process, and what a Python step sees of its worker.
//!
//! [`serve`] makes this process its task until the job ends. Every process of a Python job
//! registers one step, [`PYTHON_STEP`]: its argument names the Python function (module and
//! qualified name) and carries its pickled arguments; the script's handler
//! (`cohort._steps.run`) imports the function, calls it and pickles its value. Code never
//! travels: each worker imports the function itself.
//!
//! Inside the step the function reaches its worker through a [`StepContext`], which lends the
//! runtime's `cohort::program::StepContext` to Python for the length of the call only.

// The step context is lent to Python by pointer for the length of one call (see
// `StepContext::lend`); the pointer is cleared before the call's borrow ends.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

use cohort::program::{Program, StepError};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::optimizers::{server_optimizers, OptimizerSpec, ServerOptimizers};
use crate::values::{concat, ByteValues, F32Values};
use crate::CohortError;

/// The one step every process of a Python job registers: the chief schedules every Python
/// function under it.
pub(crate) const PYTHON_STEP: &str = "python";

pyo3::create_exception!(
    _native,
    StepInterrupted,
    CohortError,
    "The runtime failed a request of the step (a parameter server lost, an unknown variable): \
     the step ends with the runtime's error, which decides whether it runs again elsewhere."
);

/// The program of a Python job's process named `name`: the Python step, run by `handler`
/// (called with a [`StepContext`] and the step's payload, it returns the value's bytes), and
/// the parameter servers' optimizers (the job's, and those of name scopes).
pub(crate) fn program(name: String, handler: Py<PyAny>, optimizers: ServerOptimizers) -> Program {
    let ServerOptimizers { default, scopes } = optimizers;
    let program = Program::new(name).optimizer(default.optimizer);
    let program = match default.schedule {
        Some(schedule) => program.learning_rate_schedule(schedule),
        None => program,
    };
    program
        .optimizer_scopes(&scopes)
        .step_encoded(PYTHON_STEP, move |ctx, payload| {
            run_step(&handler, ctx, payload)
        })
}

/// Makes this process its task (a worker or a parameter server) of the job `name` until the
/// job ends, and returns the exit code (0 done, 1 training error, 2 bad config, 143 stopped;
/// see `cohort::process`). `handler` runs each step (`cohort._steps.run`); `args` are the
/// script's arguments (configuration flags among them are taken); `optimizer` is the parameter
/// servers' (`(kind, learning_rate or schedule, hyperparameters)`), `scoped` those of name
/// scopes.
#[pyfunction]
#[pyo3(signature = (handler, name, args, optimizer, scoped = Vec::new()))]
pub(crate) fn serve(
    py: Python<'_>,
    handler: Py<PyAny>,
    name: String,
    args: Vec<String>,
    optimizer: OptimizerSpec,
    scoped: Vec<(String, OptimizerSpec)>,
) -> PyResult<i32> {
    let program = program(name, handler, server_optimizers(optimizer, scoped)?);
    Ok(py.detach(move || cohort::program::run_role_with_args(program, &args)))
}

/// Runs one Python step on this worker's thread: takes the interpreter, lends the context,
/// calls the handler. A request of the runtime's that failed inside the step is the step's
/// error as the runtime gave it (so that a lost parameter server re-runs the closure instead
/// of failing it), whatever the Python code made of it; any other exception is the step's own
/// failure, its message the handler's.
fn run_step(
    handler: &Py<PyAny>,
    ctx: &mut cohort::program::StepContext<'_>,
    payload: &[u8],
) -> Result<Vec<u8>, StepError> {
    Python::attach(|py| {
        let context = Py::new(py, StepContext::lend(ctx))
            .map_err(|e| StepError::Step(format!("cannot lend the step context: {e}")))?;
        // The step's arguments view this copy of the message (theirs to keep and change).
        let payload = ByteValues::into_py(py, payload.to_vec())
            .map_err(|e| StepError::Step(format!("cannot lend the step's payload: {e}")))?;
        let outcome = handler.bind(py).call1((context.clone_ref(py), payload));
        let failure = context.get().give_back();
        if let Some(failure) = failure {
            return Err(failure);
        }
        let value = outcome.map_err(|e| StepError::Step(e.value(py).to_string()))?;
        let parts = value.extract::<Vec<PyBuffer<u8>>>().map_err(|e| {
            StepError::Step(format!("the step handler returned no payload parts: {e}"))
        })?;
        concat(py, &parts)
            .map_err(|e| StepError::Step(format!("the step's value: {}", e.value(py))))
    })
}

/// What a Python step sees of its worker: the variables (read whole or by rows), the gradients
/// it records (pushed once when the step succeeds, PS-1), the worker and the closure. Valid
/// only during its step and on the step's thread: afterwards, or from another thread, every
/// method raises `CohortError` saying so.
#[pyclass(frozen, module = "cohort._native")]
pub(crate) struct StepContext {
    /// The runtime's context, lent for the step's call; null once the call has returned.
    lent: AtomicPtr<cohort::program::StepContext<'static>>,
    /// The thread running the step: the only one that may use the lent context.
    step_thread: ThreadId,
    /// The first error of a runtime request made in the step.
    failure: Mutex<Option<StepError>>,
}

/// The lent pointer, carried across [`Python::detach`] on the same thread.
struct Lent(*mut cohort::program::StepContext<'static>);

// SAFETY: a `Lent` only crosses into a `detach` closure, which runs on the calling thread
// before `detach` returns; no other thread ever sees it.
unsafe impl Send for Lent {}

impl StepContext {
    /// Lends `ctx` for one call on this thread; [`Self::give_back`] must be called before
    /// `ctx`'s borrow ends (`run_step` does, right after the call).
    fn lend(ctx: &mut cohort::program::StepContext<'_>) -> Self {
        let pointer: *mut cohort::program::StepContext<'_> = ctx;
        Self {
            lent: AtomicPtr::new(pointer.cast()),
            step_thread: std::thread::current().id(),
            failure: Mutex::new(None),
        }
    }

    /// Ends the loan; returns the first runtime error the step met, if any.
    fn give_back(&self) -> Option<StepError> {
        self.lent.store(std::ptr::null_mut(), Ordering::SeqCst);
        self.failure
            .lock()
            .map_or(None, |mut failure| failure.take())
    }

    /// Runs `request` on the lent context without holding the interpreter (it may wait on the
    /// network); a runtime error is kept as the step's failure and raised as
    /// `StepInterrupted`. From another thread than the step's, or after the step, it raises
    /// `CohortError` and touches nothing.
    fn request<R: Send>(
        &self,
        py: Python<'_>,
        request: impl FnOnce(&mut cohort::program::StepContext<'static>) -> Result<R, StepError> + Send,
    ) -> PyResult<R> {
        if std::thread::current().id() != self.step_thread {
            return Err(CohortError::new_err(
                "this step context belongs to its step's thread: a thread the step starts \
                 cannot read or push through it (hand the thread's results back to the step)",
            ));
        }
        let pointer = self.lent.load(Ordering::SeqCst);
        if pointer.is_null() {
            return Err(CohortError::new_err(
                "this step context has ended: use it only inside its step",
            ));
        }
        let lent = Lent(pointer);
        let result = py.detach(move || {
            let lent = lent;
            // SAFETY: this is the step's thread and the pointer is not null, so the step's
            // call is still running here and `run_step` holds the only other path to the
            // context, unused until the call returns; no reference made here outlives this
            // closure.
            let ctx = unsafe { &mut *lent.0 };
            request(ctx)
        });
        result.map_err(|error| {
            let message = error.to_string();
            if let Ok(mut failure) = self.failure.lock() {
                failure.get_or_insert(error);
            }
            StepInterrupted::new_err(message)
        })
    }
}

#[pymethods]
impl StepContext {
    /// This worker's index.
    fn worker_index(&self, py: Python<'_>) -> PyResult<u32> {
        self.request(py, |ctx| Ok(ctx.worker_index()))
    }

    /// Workers in the job.
    fn num_workers(&self, py: Python<'_>) -> PyResult<u32> {
        self.request(py, |ctx| Ok(ctx.num_workers()))
    }

    /// The closure being run (its id in the chief's ledger).
    fn closure_id(&self, py: Python<'_>) -> PyResult<u64> {
        self.request(py, |ctx| Ok(ctx.closure_id()))
    }

    /// The full shape of variable `name`.
    fn shape(&self, py: Python<'_>, name: String) -> PyResult<Vec<usize>> {
        self.request(py, move |ctx| Ok(ctx.layout(&name)?.shape.clone()))
    }

    /// The whole value of variable `name` (float32, row-major, as [`F32Values`]), gathered from its shards.
    fn pull<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, F32Values>> {
        let values = self.request(py, move |ctx| ctx.pull(&name))?;
        F32Values::into_py(py, values)
    }

    /// The whole values of `names`, one request per parameter server for all of them.
    fn pull_many<'py>(
        &self,
        py: Python<'py>,
        names: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, F32Values>>> {
        let values = self.request(py, move |ctx| {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            ctx.pull_many(&names)
        })?;
        values
            .into_iter()
            .map(|v| F32Values::into_py(py, v))
            .collect()
    }

    /// Rows `ids` (a buffer of uint64) of the `[rows, width]` variable `name`, in the order of
    /// `ids` (float32, as [`F32Values`]).
    fn pull_rows<'py>(
        &self,
        py: Python<'py>,
        name: String,
        ids: PyBuffer<u64>,
    ) -> PyResult<Bound<'py, F32Values>> {
        let ids = ids.to_vec(py)?;
        let values = self.request(py, move |ctx| ctx.pull_rows(&name, &ids))?;
        F32Values::into_py(py, values)
    }

    /// Records a gradient for the whole variable `name` (a buffer of float32, row-major).
    fn push_dense(&self, py: Python<'_>, name: String, grad: PyBuffer<f32>) -> PyResult<()> {
        let grad = grad.to_vec(py)?;
        self.request(py, move |ctx| ctx.push_dense(&name, grad))
    }

    /// Records gradients for rows `ids` (uint64) of variable `name` (float32, one row each).
    fn push_rows(
        &self,
        py: Python<'_>,
        name: String,
        ids: PyBuffer<u64>,
        values: PyBuffer<f32>,
    ) -> PyResult<()> {
        let ids = ids.to_vec(py)?;
        let values = values.to_vec(py)?;
        self.request(py, move |ctx| ctx.push_rows(&name, ids, values))
    }

    /// Applies the gradients recorded so far now, as one update of this closure (each update
    /// of a closure is applied at most once, PS-1).
    fn apply_gradients(&self, py: Python<'_>) -> PyResult<()> {
        self.request(py, |ctx| ctx.apply_gradients())
    }
}
