//! The optimizers a Python script gives (`cohort.optimizers`), made into cohort's: the kind,
//! the learning rate (a constant, or a schedule of the update count: `cohort.schedules`), and
//! the other hyperparameters by Keras' names. A bad one is a `ValueError` naming it.

use std::collections::BTreeMap;

use cohort::optim::{LearningRateSchedule, Optimizer, OptimizerKind, OptimizerScopes};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// An optimizer as Python gives it (`Optimizer.spec()`): its kind, its learning rate, and its
/// other hyperparameters by Keras' names (`momentum`, `weight_decay`, `rho`, `l1`, `l2`).
pub(crate) type OptimizerSpec = (String, RateSpec, BTreeMap<String, f32>);

/// An optimizer's learning rate as Python gives it.
#[derive(Debug, FromPyObject)]
pub(crate) enum RateSpec {
    /// The same rate at every update.
    Constant(f32),
    /// A schedule of the update count, as its JSON (`LearningRateSchedule.spec()`).
    Schedule(String),
}

/// An optimizer made from its spec, and the schedule its rate follows, if any.
pub(crate) struct Scheduled {
    pub(crate) optimizer: Optimizer,
    pub(crate) schedule: Option<LearningRateSchedule>,
}

/// The parameter servers' optimizers: the job's and those of name scopes.
pub(crate) struct ServerOptimizers {
    pub(crate) default: Scheduled,
    pub(crate) scopes: OptimizerScopes,
}

/// The schedule of `spec` (its JSON), checked: a `ValueError` naming what is wrong.
fn schedule(spec: &str) -> PyResult<LearningRateSchedule> {
    let schedule: LearningRateSchedule = serde_json::from_str(spec)
        .map_err(|e| PyValueError::new_err(format!("learning-rate schedule {spec}: {e}")))?;
    schedule
        .validate()
        .map_err(|e| PyValueError::new_err(format!("{e} ({spec})")))?;
    Ok(schedule)
}

/// The rate of the schedule `spec` (its JSON) at update count `step` (0 for the first
/// update): what `LearningRateSchedule.__call__` returns.
#[pyfunction]
pub(crate) fn schedule_rate(spec: &str, step: u64) -> PyResult<f32> {
    Ok(schedule(spec)?.at(step))
}

/// The optimizer `spec` names: `sgd`, `momentum`, `nesterov`, `adagrad`, `adam`, `adamw`,
/// `rmsprop`, `ftrl`, and its schedule. A bad kind, a hyperparameter the kind has not, a bad
/// value or a bad schedule is a `ValueError` naming it. Under a schedule the optimizer's own
/// rate is the schedule's first (what it is checked with).
pub(crate) fn optimizer(spec: &OptimizerSpec) -> PyResult<Scheduled> {
    let (name, rate, params) = spec;
    let (learning_rate, schedule) = match rate {
        RateSpec::Constant(rate) => (*rate, None),
        RateSpec::Schedule(spec) => {
            let schedule = schedule(spec)
                .map_err(|e| PyValueError::new_err(format!("optimizer {name:?}: {e}")))?;
            (schedule.at(0), Some(schedule))
        }
    };
    let known: &[&str] = match name.as_str() {
        "momentum" | "nesterov" => &["momentum"],
        "adamw" => &["weight_decay"],
        "rmsprop" => &["rho", "momentum"],
        "ftrl" => &["l1", "l2"],
        _ => &[],
    };
    if let Some(unknown) = params.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(PyValueError::new_err(format!(
            "optimizer {name:?} has no hyperparameter {unknown:?}"
        )));
    }
    let param = |key: &str, default: f32| params.get(key).copied().unwrap_or(default);
    let optimizer = match name.as_str() {
        "sgd" => Optimizer::sgd(learning_rate),
        "momentum" => Optimizer::momentum(learning_rate, param("momentum", 0.0)),
        "nesterov" => Optimizer::nesterov(learning_rate, param("momentum", 0.0)),
        "adagrad" => Optimizer::adagrad(learning_rate),
        "adam" => Optimizer::adam(learning_rate),
        "adamw" => Optimizer::adamw(learning_rate, param("weight_decay", 0.004)),
        "rmsprop" => Optimizer::new(OptimizerKind::RmsProp {
            learning_rate,
            rho: param("rho", 0.9),
            momentum: param("momentum", 0.0),
            epsilon: 1e-7,
            centered: false,
        }),
        "ftrl" => Optimizer::ftrl(learning_rate, param("l1", 0.0), param("l2", 0.0)),
        other => {
            return Err(PyValueError::new_err(format!(
                "optimizer {other:?}: not one of sgd, momentum, nesterov, adagrad, adam, adamw, \
                 rmsprop, ftrl"
            )))
        }
    };
    optimizer
        .validate()
        .map_err(|e| PyValueError::new_err(format!("optimizer {name:?}: {e}")))?;
    Ok(Scheduled {
        optimizer,
        schedule,
    })
}

/// The parameter servers' optimizers: the job's (`default`) and those given for name scopes
/// (`scoped`, `(scope, spec)`; see `Program::optimizer_for`), each with its schedule. A bad
/// optimizer, schedule or scope is a `ValueError` naming it.
pub(crate) fn server_optimizers(
    default: OptimizerSpec,
    scoped: Vec<(String, OptimizerSpec)>,
) -> PyResult<ServerOptimizers> {
    let default = optimizer(&default)?;
    let mut scopes = OptimizerScopes::new();
    for (scope, spec) in scoped {
        let Scheduled {
            optimizer,
            schedule,
        } = optimizer(&spec).map_err(|e| PyValueError::new_err(format!("scope {scope:?}: {e}")))?;
        scopes.insert_scoped(scope, optimizer, schedule);
    }
    scopes
        .validate()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(ServerOptimizers { default, scopes })
}
