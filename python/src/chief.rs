//! The chief's coordinator, driven by the script that goes on.
//!
//! A Rust program hands cohort its chief function; a Python script is the chief function, and
//! it runs on the interpreter's thread. So the chief's role runs on a thread of its own
//! (`run_role`, the same as any Rust chief's) with a chief function that serves orders: each
//! call of the script's coordinator is one [`Order`], run on the coordinator there, its answer
//! sent back. The script's end is the last order ([`Order::Finish`]): the chief function
//! returns, the job ends as a Rust program's does, and [`Chief::finish`] gives the exit code.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cohort::checkpoint::{CheckpointManager, CheckpointPolicy};
use cohort::program::{ClusterCoordinator, CoordinatorError, Encoded, RemoteValue, VariableSpec};
use cohort::variable::Partitioner;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::values::{concat, ByteValues, F32Values};
use crate::worker::PYTHON_STEP;
use crate::{CheckpointError, ClosureError, CohortError, VariableError};

/// What the chief function keeps between orders.
struct Desk<'c> {
    coordinator: &'c mut ClusterCoordinator,
    /// Every closure scheduled, by id, for `fetch`.
    values: HashMap<u64, RemoteValue<Encoded>>,
    /// The checkpoints, once the script saves or restores one.
    checkpoints: Option<CheckpointManager>,
    /// The last error raised to the script that asks for the chief's restart
    /// ([`CoordinatorError::restart_wanted`]): the script's end with it uncaught ends the
    /// role with it, so the chief exits as a Rust chief does (172, restart me).
    restart: Option<CoordinatorError>,
}

impl Desk<'_> {
    /// Runs `f` with the manager of the configured checkpoint directory (made on first use).
    fn with_checkpoints<R>(
        &mut self,
        f: impl FnOnce(&ClusterCoordinator, &mut CheckpointManager) -> Result<R, CoordinatorError>,
    ) -> Result<R, CoordinatorError> {
        let Desk {
            coordinator,
            checkpoints,
            ..
        } = self;
        let manager = match checkpoints {
            Some(manager) => manager,
            None => {
                let dir = coordinator.checkpoint_dir().ok_or_else(|| {
                    CoordinatorError::other(
                        "no checkpoint directory is configured (COHORT_CHECKPOINT_DIR, \
                         --checkpoint-dir or checkpoint_dir in cohort.toml)",
                    )
                })?;
                let manager =
                    CheckpointManager::new(dir, CheckpointPolicy::default(), Instant::now())
                        .map_err(CoordinatorError::other)?;
                checkpoints.insert(manager)
            }
        };
        f(coordinator, manager)
    }
}

/// One call of the script's coordinator, run by the chief function.
type Work = Box<dyn FnOnce(&mut Desk<'_>) + Send>;

/// What the script sends the chief function.
enum Order {
    /// Run this on the coordinator.
    Work(Work),
    /// The script is done.
    Finish {
        /// `None`: it ended well; else the exception it raised and did not catch.
        failure: Option<String>,
        /// That exception was one the runtime raised asking for the chief's restart
        /// (its `restarts_chief` attribute).
        restart: bool,
    },
}

/// How often a wait for an answer looks whether the chief's role has ended meanwhile.
const ROLE_LOOK_EVERY: Duration = Duration::from_millis(50);

/// The chief's coordinator for a script (`cohort.coordinator.ClusterCoordinator` wraps it).
#[pyclass(module = "cohort._native")]
pub(crate) struct Chief {
    orders: Mutex<Option<mpsc::Sender<Order>>>,
    role: Mutex<Option<JoinHandle<i32>>>,
    /// The role's exit code once its thread has been joined.
    exit_code: Mutex<Option<i32>>,
}

/// The chief function of a Python job: serves the script's orders until it finishes.
fn serve_orders(
    orders: &Mutex<Option<mpsc::Receiver<Order>>>,
    coordinator: &mut ClusterCoordinator,
) -> Result<(), CoordinatorError> {
    let Some(orders) = orders.lock().map(|mut o| o.take()).unwrap_or(None) else {
        return Err(CoordinatorError::other(
            "the chief function of a Python job runs once per process",
        ));
    };
    let mut desk = Desk {
        coordinator,
        values: HashMap::new(),
        checkpoints: None,
        restart: None,
    };
    loop {
        match orders.recv() {
            Ok(Order::Work(work)) => work(&mut desk),
            Ok(Order::Finish { failure: None, .. }) => return Ok(()),
            Ok(Order::Finish {
                failure: Some(failure),
                restart,
            }) => {
                return Err(match desk.restart.take() {
                    Some(lost) if restart => lost,
                    _ => CoordinatorError::other(failure),
                })
            }
            Err(mpsc::RecvError) => {
                return Err(CoordinatorError::other(
                    "the script's coordinator was dropped before the script finished",
                ))
            }
        }
    }
}

/// The exception a coordinator error is raised as: its class says what failed; one that asks
/// for the chief's restart ([`CoordinatorError::restart_wanted`]) carries
/// `restarts_chief = True`.
fn raised(py: Python<'_>, error: CoordinatorError) -> PyErr {
    let restart = error.restart_wanted().is_some();
    let exception = exception_of(error);
    if restart {
        // An instance of a class of this module always takes an attribute.
        let _ = exception.value(py).setattr("restarts_chief", true);
    }
    exception
}

/// The exception class a coordinator error is raised as.
fn exception_of(error: CoordinatorError) -> PyErr {
    let message = error.to_string();
    match error {
        CoordinatorError::Closure(_) => ClosureError::new_err(message),
        CoordinatorError::Variable { .. }
        | CoordinatorError::Partition(_)
        | CoordinatorError::CreateVariable(_) => VariableError::new_err(message),
        CoordinatorError::LearningRate(_) => PyValueError::new_err(message),
        CoordinatorError::Checkpoint(_)
        | CoordinatorError::Start(_)
        | CoordinatorError::CutRead(_)
        | CoordinatorError::WarmStart(_) => CheckpointError::new_err(message),
        _ => CohortError::new_err(message),
    }
}

/// A partitioner from `(kind, a, b)`: `("fixed", shards, 0)`, `("min_size", min_shard_bytes,
/// max_shards)`, `("max_size", max_shard_bytes, max_shards)`.
fn partitioner(kind: &str, a: usize, b: usize) -> PyResult<Partitioner> {
    Ok(match kind {
        "fixed" => Partitioner::FixedShards { num_shards: a },
        "min_size" => Partitioner::MinSize {
            min_shard_bytes: a,
            max_shards: b,
        },
        "max_size" => Partitioner::MaxSize {
            max_shard_bytes: a,
            max_shards: b,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "partitioner {other:?}: not one of fixed, min_size, max_size"
            )))
        }
    })
}

impl Chief {
    /// Runs `work` on the coordinator and returns its answer, without holding the
    /// interpreter; raises if the chief's role has ended (its exit code named).
    fn call<R: Send + 'static>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut Desk<'_>) -> Result<R, CoordinatorError> + Send + 'static,
    ) -> PyResult<R> {
        let (answer, answered) = mpsc::channel();
        let order = Order::Work(Box::new(move |desk| {
            let outcome = work(desk);
            if let Some(lost) = outcome.as_ref().err().and_then(|e| e.restart_wanted()) {
                desk.restart = Some(lost);
            }
            let _ = answer.send(outcome);
        }));
        let sent = match self.orders.lock() {
            Ok(orders) => orders.as_ref().map(|o| o.send(order).is_ok()),
            Err(_) => None,
        };
        if sent != Some(true) {
            return Err(self.ended(py));
        }
        let outcome = py.detach(move || loop {
            match answered.recv_timeout(ROLE_LOOK_EVERY) {
                Ok(outcome) => return Some(outcome),
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(mpsc::RecvTimeoutError::Timeout) if self.role_ended() => {
                    // One more look: the answer may have come just before the end.
                    return answered.try_recv().ok();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        });
        match outcome {
            Some(outcome) => outcome.map_err(|e| raised(py, e)),
            None => Err(self.ended(py)),
        }
    }

    fn role_ended(&self) -> bool {
        match self.role.lock() {
            Ok(role) => role.as_ref().is_none_or(JoinHandle::is_finished),
            Err(_) => true,
        }
    }

    /// Joins the role's thread once it has ended (or now, waiting for it) and keeps its code.
    fn exit_code(&self, py: Python<'_>) -> i32 {
        let handle = self.role.lock().ok().and_then(|mut role| role.take());
        if let Some(handle) = handle {
            let code = py.detach(|| handle.join().unwrap_or(cohort::process::PANIC_EXIT_CODE));
            if let Ok(mut kept) = self.exit_code.lock() {
                *kept = Some(code);
            }
        }
        self.exit_code
            .lock()
            .ok()
            .and_then(|code| *code)
            .unwrap_or(cohort::process::PANIC_EXIT_CODE)
    }

    /// The error of a call made after the role ended.
    fn ended(&self, py: Python<'_>) -> PyErr {
        let code = self.exit_code(py);
        CohortError::new_err(format!(
            "the chief's role has ended (exit code {code}; the log above says why)"
        ))
    }
}

#[pymethods]
impl Chief {
    /// Starts the chief's role of the job `name` on a thread of its own; `args` are the
    /// script's arguments (configuration flags among them are taken), `optimizer` the
    /// parameter servers' (`(kind, learning_rate or schedule, hyperparameters)`), `scoped` those
    /// of name scopes. Calls wait for the coordinator to be ready.
    #[new]
    #[pyo3(signature = (handler, name, args, optimizer, scoped = Vec::new()))]
    fn new(
        handler: Py<PyAny>,
        name: String,
        args: Vec<String>,
        optimizer: crate::optimizers::OptimizerSpec,
        scoped: Vec<(String, crate::optimizers::OptimizerSpec)>,
    ) -> PyResult<Self> {
        let optimizers = crate::optimizers::server_optimizers(optimizer, scoped)?;
        let (orders, received) = mpsc::channel();
        let received = Arc::new(Mutex::new(Some(received)));
        let program = crate::worker::program(name, handler, optimizers)
            .chief(move |coordinator| serve_orders(&received, coordinator));
        let role = std::thread::Builder::new()
            .name("chief-role".into())
            .spawn(move || cohort::program::run_role_with_args(program, &args))
            .map_err(|e| CohortError::new_err(format!("cannot start the chief's role: {e}")))?;
        Ok(Self {
            orders: Mutex::new(Some(orders)),
            role: Mutex::new(Some(role)),
            exit_code: Mutex::new(None),
        })
    }

    /// Workers in the job.
    fn num_workers(&self, py: Python<'_>) -> PyResult<u32> {
        self.call(py, |desk| Ok(desk.coordinator.num_workers()))
    }

    /// Parameter servers in the job.
    fn num_ps(&self, py: Python<'_>) -> PyResult<u32> {
        self.call(py, |desk| Ok(desk.coordinator.num_ps()))
    }

    /// True once a stop was asked of this process (SIGTERM, Ctrl-C): the script should save
    /// a checkpoint and end.
    fn preemption_requested(&self) -> bool {
        cohort::process::preemption_requested()
    }

    /// Creates variable `name` of `shape` on the parameter servers from `values` (a buffer of
    /// float32, row-major), split by `partitioner` (`(kind, a, b)`, see `partitioner`) if
    /// given.
    #[pyo3(signature = (name, shape, values, partitioner=None))]
    fn create_variable(
        &self,
        py: Python<'_>,
        name: String,
        shape: Vec<usize>,
        values: PyBuffer<f32>,
        partitioner: Option<(String, usize, usize)>,
    ) -> PyResult<()> {
        let values = values.to_vec(py)?;
        let mut spec = VariableSpec::from_values(name, shape, values);
        if let Some((kind, a, b)) = partitioner {
            spec = spec.partitioned(self::partitioner(&kind, a, b)?);
        }
        self.call(py, move |desk| {
            desk.coordinator.create_variable(spec).map(drop)
        })
    }

    /// Queues the Python step whose payload is `parts` (what `cohort._steps` encodes: the
    /// function's module and name, its pickled arguments and their out-of-band buffers, each
    /// copied once into the message); returns the closure's id.
    fn schedule(&self, py: Python<'_>, parts: Vec<PyBuffer<u8>>) -> PyResult<u64> {
        let payload = concat(py, &parts)?;
        drop(parts);
        self.call(py, move |desk| {
            let value = desk.coordinator.schedule_encoded(PYTHON_STEP, payload)?;
            let id = value.closure_id().0;
            desk.values.insert(id, value);
            Ok(id)
        })
    }

    /// Waits for closure `closure`'s value (the payload its step returned, lent without a
    /// copy) or raises its error.
    fn fetch<'py>(&self, py: Python<'py>, closure: u64) -> PyResult<Bound<'py, ByteValues>> {
        let bytes = self.call(py, move |desk| {
            let value = desk.values.get(&closure).copied().ok_or_else(|| {
                CoordinatorError::other(format!("no closure {closure} was scheduled here"))
            })?;
            desk.coordinator.fetch_encoded(&value)
        })?;
        ByteValues::into_py(py, bytes)
    }

    /// Waits until every scheduled closure has finished; raises the first error since the last
    /// `join`.
    fn join(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |desk| desk.coordinator.join())
    }

    /// Sets the rate the servers apply the steps scheduled from now on at (every attempt of
    /// each); raises `ValueError`, changing nothing, for a rate that is negative or not finite.
    fn set_learning_rate(&self, py: Python<'_>, rate: f32) -> PyResult<()> {
        self.call(py, move |desk| desk.coordinator.set_learning_rate(rate))
    }

    /// The rate the steps scheduled from now on carry; `None`: the servers' optimizer's own.
    fn learning_rate(&self, py: Python<'_>) -> PyResult<Option<f32>> {
        self.call(py, |desk| desk.coordinator.learning_rate())
    }

    /// True when nothing is queued or in flight.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |desk| desk.coordinator.done())
    }

    /// The whole value of variable `name` (float32, row-major).
    fn read_variable<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, F32Values>> {
        let values = self.call(py, move |desk| desk.coordinator.read_variable(&name))?;
        F32Values::into_py(py, values)
    }

    /// Sets variable `name`'s whole value (float32, row-major) on the servers.
    fn assign_variable(&self, py: Python<'_>, name: String, values: PyBuffer<f32>) -> PyResult<()> {
        let values = values.to_vec(py)?;
        self.call(py, move |desk| {
            desk.coordinator.assign_variable(&name, &values)
        })
    }

    /// The ledger: closures scheduled, committed, failed, re-dispatched... (LEDGER-1).
    fn ledger<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let ledger = self.call(py, |desk| desk.coordinator.ledger())?;
        let dict = PyDict::new(py);
        for (key, value) in [
            ("scheduled", ledger.scheduled),
            ("committed", ledger.committed),
            ("failed", ledger.failed),
            ("cancelled", ledger.cancelled),
            ("unavailable", ledger.unavailable),
            ("redispatched", ledger.redispatched),
            ("rejected_stale", ledger.rejected_stale),
            ("pending", ledger.pending),
            ("rolled_back", ledger.rolled_back),
            ("ps_restores", ledger.ps_restores),
        ] {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }

    /// Each parameter server's counters, in index order: pushes applied, duplicates refused
    /// (PS-1), stale pushes refused (FENCE-1), non-finite pushes skipped.
    fn ps_stats<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let stats = self.call(py, |desk| desk.coordinator.ps_stats())?;
        stats
            .into_iter()
            .map(|s| {
                let dict = PyDict::new(py);
                dict.set_item("applied", s.applied)?;
                dict.set_item("rejected_duplicate", s.rejected_duplicate)?;
                dict.set_item("rejected_stale", s.rejected_stale)?;
                dict.set_item("skipped_non_finite", s.skipped_non_finite)?;
                Ok(dict)
            })
            .collect()
    }

    /// Saves a checkpoint of every variable at `step` in the configured checkpoint directory
    /// (a consistent cut, CKPT-1); returns its path.
    fn save_checkpoint(&self, py: Python<'_>, step: u64) -> PyResult<String> {
        self.call(py, move |desk| {
            desk.with_checkpoints(|coordinator, manager| {
                let saved = coordinator.save_checkpoint(manager, step)?;
                Ok(saved.display().to_string())
            })
        })
    }

    /// Restores every variable created so far from the newest valid checkpoint in the
    /// configured directory; returns its step, or `None` when there is none.
    fn restore_checkpoint(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.call(py, |desk| {
            desk.with_checkpoints(|coordinator, manager| coordinator.restore_checkpoint(manager))
        })
    }

    /// Ends the chief's role: `error` is `None` when the script ended well, else why it did
    /// not; `restart`: the exception it did not catch carried `restarts_chief` (a parameter
    /// server lost past recovery), so the chief exits asking for its restart (172) as a Rust
    /// chief does. Waits for the job's end (the workers and servers told to stop) and returns
    /// the process's exit code. Later calls return the same code.
    #[pyo3(signature = (error=None, restart=false))]
    fn finish(&self, py: Python<'_>, error: Option<String>, restart: bool) -> i32 {
        if let Some(orders) = self.orders.lock().ok().and_then(|mut o| o.take()) {
            let _ = orders.send(Order::Finish {
                failure: error,
                restart,
            });
        }
        self.exit_code(py)
    }
}
