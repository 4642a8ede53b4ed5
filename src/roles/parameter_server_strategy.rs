//! ParameterServerStrategy: the parameter-server training of [`crate::program`] seen as a
//! [`Strategy`] value, so that replica functions written against `&dyn Strategy` and
//! [`ReplicaContext`](crate::strategy::ReplicaContext) run under it as under
//! [`crate::strategy::Mirrored`].
//!
//! This module owns the strategy value only; the training itself is the existing mechanism
//! (no second path): the chief's [`ClusterCoordinator`] creates variables on the servers and
//! the per-worker datasets and schedules registered steps; a worker runs each step with its
//! [`StepContext`], whose pushes go once per server when the step returns (PS-1). The value
//! has two sides, as in TensorFlow, where the same `ParameterServerStrategy` object is used on
//! the coordinator and inside the functions it schedules:
//!
//! - **in a step** ([`ParameterServerStrategy::in_step`]): `run` runs the replica function on
//!   the worker's local replicas (its `replicas` key) through the replica threads every local
//!   strategy uses, [`ReplicaContext::all_reduce`](crate::strategy::ReplicaContext::all_reduce)
//!   sums across them inside the worker, and `reduce` reduces their per-replica values; the
//!   step then records its one push. Variables created in `scope()` are the servers' variables
//!   (by the layouts the chief created: no local copy, a step reads them with
//!   `StepContext::pull`); a candle-nn model is built over the servers' values with
//!   [`crate::roles::server_model::ServerModel::build`].
//! - **on the coordinator** ([`ParameterServerStrategy::on_coordinator`]): `scope()` declares
//!   variables without drawing them ([`crate::variable::DeclaredPlacement`]), and
//!   [`ParameterServerStrategy::create_variables`] creates a candle-nn model's variables on
//!   the servers (`ServerModel::create_variables`);
//!   [`ParameterServerStrategy::distribute_datasets_from_registered_function`] is
//!   `create_per_worker_dataset` (one input pipeline per worker). What cannot apply there
//!   (`run`: the coordinator runs no replicas; a dataset or dataset function made on the
//!   coordinator: code never travels to the workers) is a [`StrategyError::NotAvailable`]
//!   naming why and what to call instead.
//!
//! `num_replicas_in_sync` is the replicas whose gradients are aggregated into one update: a
//! worker's local replicas (TensorFlow's definition for this strategy: each worker computes
//! one gradient update synchronously across its replicas, and workers update the servers
//! asynchronously). It is not workers × replicas: no collective spans workers here, and a
//! replica function that scales its loss by `num_replicas_in_sync` (or all-reduces its
//! example count) must compute the step's mean over the worker's batch, which is what
//! the worker pushes. [`ParameterServerStrategy::num_workers`] gives the workers, and the job
//! runs `num_workers × num_replicas_in_sync` replicas in all.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::data::{
    batch_sizes_for_pipeline, DataError, Dataset, DistributeOptions, DistributedDataset,
};
use crate::layout::Layout;
use crate::roles::coordinator::ClusterCoordinator;
use crate::roles::server_model::ServerModel;
use crate::roles::worker::StepContext;
use crate::strategy::replicas::Replicas;
use crate::strategy::{
    DatasetFn, DeviceSpec, PerReplica, ReplicaFn, Strategy, StrategyError, StrategyId,
    DEFAULT_COLLECTIVE_TIMEOUT_MS,
};
use crate::variable::{
    DeclaredPlacement, ParameterServerPlacement, Partitioner, VariablePlacement,
};

/// TensorFlow's `ParameterServerStrategy` over cohort's parameter-server training (see the
/// module docs for its two sides and what `num_replicas_in_sync` counts).
///
/// In a step, the same replica function as under [`crate::strategy::Mirrored`]:
///
/// ```no_run
/// use candle_core::{Device, Tensor};
/// use cohort::program::{Program, Step, StepContext, StepError, VariableSpec};
/// use cohort::program::ParameterServerStrategy;
/// use cohort::strategy::{ReduceOp, ReplicaContext, Strategy, StrategyExt};
///
/// // Written once: a replica's gradient of |w - 1|², summed over the replicas.
/// fn replica_grad(ctx: &ReplicaContext, w: Tensor) -> Result<Tensor, cohort::strategy::StrategyError> {
///     let share = ((w - 1.0)? * (2.0 / ctx.num_replicas_in_sync() as f64))?;
///     ctx.all_reduce(ReduceOp::Sum, &share)
/// }
///
/// static TRAIN: Step<(), ()> = Step::new("train");
///
/// let program = Program::new("ps-strategy")
///     .step(&TRAIN, |ctx: &mut StepContext<'_>, ()| {
///         let strategy = ParameterServerStrategy::in_step(ctx)?;
///         let w = Tensor::new(ctx.pull("w")?, &Device::Cpu)?;
///         let grads = strategy.run(replica_grad, w)?.transpose()?;
///         // Every replica holds the all-reduced gradient: the worker pushes it once.
///         ctx.push_dense("w", grads.values()[0].to_vec1::<f32>()?)?;
///         Ok::<_, StepError>(())
///     })
///     .chief(|coordinator| {
///         coordinator.create_variable(VariableSpec::zeros("w", vec![4]))?;
///         coordinator.schedule(&TRAIN, ())?;
///         coordinator.join()
///     });
/// std::process::exit(cohort::program::main(program));
/// ```
#[derive(Debug)]
pub struct ParameterServerStrategy {
    id: StrategyId,
    devices: Vec<DeviceSpec>,
    num_workers: usize,
    side: Side,
}

#[derive(Debug)]
enum Side {
    /// Inside a scheduled step on worker `worker`.
    Worker {
        worker: usize,
        placement: ParameterServerPlacement,
        replicas: Replicas,
    },
    /// On the chief, beside its `ClusterCoordinator`.
    Coordinator,
}

/// A per-worker dataset made by
/// [`ParameterServerStrategy::distribute_datasets_from_registered_function`] (TensorFlow's
/// `PerWorkerDataset`): every worker built its own from the registered function; a step
/// reads this worker's with `StepContext::next(dataset.name())` and splits each batch over
/// its replicas with [`ParameterServerStrategy::distribute_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerWorkerDataset {
    name: String,
}

impl PerWorkerDataset {
    /// The registered dataset function's name, which steps read it by.
    pub fn name(&self) -> &str {
        &self.name
    }
}

const NAME: &str = "ParameterServerStrategy";

impl ParameterServerStrategy {
    /// The strategy inside a scheduled step: this worker's local replicas (its `replicas`
    /// key), the variables the chief created, this worker's index among the job's workers.
    /// Each call starts the step's replica threads (none for one replica); they end when the
    /// value is dropped.
    pub fn in_step(ctx: &StepContext<'_>) -> Result<Self, StrategyError> {
        Self::worker(
            ctx.worker_index() as usize,
            ctx.num_workers() as usize,
            ctx.replicas(),
            ctx.layouts().cloned(),
        )
    }

    /// The worker side, from what a step context says.
    fn worker(
        worker: usize,
        num_workers: usize,
        replicas: usize,
        layouts: impl IntoIterator<Item = Layout>,
    ) -> Result<Self, StrategyError> {
        let devices = cpu_devices(replicas)?;
        let id = StrategyId::next();
        let replicas = match devices.as_slice() {
            [one] => Replicas::inline(*one, id),
            _ => Replicas::threaded(
                devices.clone(),
                id,
                Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS),
            )?,
        };
        Ok(Self {
            id,
            devices,
            num_workers: num_workers.max(1),
            side: Side::Worker {
                worker,
                placement: ParameterServerPlacement::new(layouts),
                replicas,
            },
        })
    }

    /// The strategy on the chief, for the job of `coordinator`. Its replicas per worker are
    /// the `replicas` key of the chief's own configuration (`launch --replicas N` sets it for
    /// every task; 1 when the chief has no configuration).
    pub fn on_coordinator(coordinator: &ClusterCoordinator) -> Result<Self, StrategyError> {
        let replicas = crate::process::role_config().map_or(1, |c| c.replicas as usize);
        Self::coordinator(coordinator.num_workers() as usize, replicas)
    }

    fn coordinator(num_workers: usize, replicas: usize) -> Result<Self, StrategyError> {
        Ok(Self {
            id: StrategyId::next(),
            devices: cpu_devices(replicas)?,
            num_workers: num_workers.max(1),
            side: Side::Coordinator,
        })
    }

    /// Workers in the job (asynchronous updaters of the servers).
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// This worker's index inside a step; `None` on the coordinator.
    pub fn worker_index(&self) -> Option<usize> {
        match &self.side {
            Side::Worker { worker, .. } => Some(*worker),
            Side::Coordinator => None,
        }
    }

    /// Whether this is the coordinator's side (no replicas run here).
    pub fn is_coordinator(&self) -> bool {
        matches!(self.side, Side::Coordinator)
    }

    /// On the coordinator: creates the variables of the candle-nn model `build` makes on the
    /// parameter servers, from `seed`, each split by `partitioner(name, shape)` (None: whole,
    /// round-robin), and returns their names. What [`ServerModel::create_variables`] does;
    /// inside a step it is [`StrategyError::NotAvailable`] (only the chief creates
    /// variables).
    pub fn create_variables<M>(
        &self,
        coordinator: &mut ClusterCoordinator,
        seed: u64,
        build: impl FnOnce(VarBuilder<'static>) -> candle_core::Result<M>,
        partitioner: impl Fn(&str, &[usize]) -> Option<Partitioner>,
    ) -> Result<Vec<String>, StrategyError> {
        self.coordinator_only(
            "create_variables",
            "variables are created by the chief, before it schedules steps",
        )?;
        Ok(ServerModel::create_variables(
            coordinator,
            seed,
            build,
            partitioner,
        )?)
    }

    /// On the coordinator: every worker builds its own dataset with the dataset function
    /// registered as `name` (`Program::dataset`), given its [`crate::data::InputContext`]
    /// (one input pipeline per worker), as `ClusterCoordinator::create_per_worker_dataset`
    /// does. TensorFlow's `distribute_datasets_from_function` inside
    /// `create_per_worker_dataset`; a function is named rather than passed because code never
    /// travels to the workers. Inside a step it is [`StrategyError::NotAvailable`].
    pub fn distribute_datasets_from_registered_function(
        &self,
        coordinator: &mut ClusterCoordinator,
        name: &str,
    ) -> Result<PerWorkerDataset, StrategyError> {
        self.coordinator_only(
            "distribute_datasets_from_registered_function",
            "per-worker datasets are made by the chief",
        )?;
        coordinator.create_per_worker_dataset(name)?;
        Ok(PerWorkerDataset { name: name.into() })
    }

    /// Splits one batch of this worker (e.g. `StepContext::next`'s element) over the local
    /// replicas: contiguous shares along the first dimension, the first ones one example
    /// larger when it does not divide, one share per replica (empty ones when there are fewer
    /// examples than replicas), as `experimental_distribute_dataset` splits a global batch of
    /// that size. Every component must have the same first dimension (with more than one
    /// replica).
    pub fn distribute_batch(
        &self,
        batch: &[Tensor],
    ) -> Result<PerReplica<Vec<Tensor>>, StrategyError> {
        let n = self.devices.len();
        if n == 1 {
            return Ok(PerReplica::new(vec![batch.to_vec()]));
        }
        let op = "distribute_batch";
        let first = batch
            .first()
            .ok_or_else(|| DataError::invalid(op, "the batch has no components"))?;
        let mut examples = None;
        for (component, t) in batch.iter().enumerate() {
            let Some(&rows) = t.dims().first() else {
                return Err(DataError::NotBatched {
                    num_replicas: n,
                    component,
                }
                .into());
            };
            match examples {
                None => examples = Some(rows),
                Some(e) if e != rows => {
                    return Err(DataError::invalid(
                        op,
                        format!(
                            "component {component} has {rows} examples, component 0 has {e} ({:?})",
                            first.dims()
                        ),
                    )
                    .into())
                }
                Some(_) => {}
            }
        }
        let sizes = batch_sizes_for_pipeline(examples.unwrap_or(0), 1, n, 0);
        let mut start = 0;
        let mut shares = Vec::with_capacity(n);
        for size in sizes {
            shares.push(
                batch
                    .iter()
                    .map(|t| t.narrow(0, start, size))
                    .collect::<Result<Vec<_>, _>>()?,
            );
            start += size;
        }
        Ok(PerReplica::new(shares))
    }

    fn coordinator_only(&self, method: &'static str, reason: &str) -> Result<(), StrategyError> {
        match self.side {
            Side::Coordinator => Ok(()),
            Side::Worker { .. } => Err(StrategyError::NotAvailable {
                strategy: NAME,
                method,
                side: "worker",
                reason: reason.into(),
            }),
        }
    }

    fn not_on_coordinator(method: &'static str, reason: &str) -> StrategyError {
        StrategyError::NotAvailable {
            strategy: NAME,
            method,
            side: "coordinator",
            reason: reason.into(),
        }
    }
}

/// The dataset methods' refusal on the coordinator.
const DATASET_ON_COORDINATOR: &str = "a dataset made on the coordinator cannot reach the \
     workers (code never travels): register a dataset function with Program::dataset and call \
     distribute_datasets_from_registered_function(coordinator, name); inside a step, \
     experimental_distribute_dataset and distribute_batch split this worker's data over its \
     replicas";

fn cpu_devices(replicas: usize) -> Result<Vec<DeviceSpec>, StrategyError> {
    if replicas == 0 {
        return Err(StrategyError::NoReplicas);
    }
    Ok((0..replicas).map(DeviceSpec::cpu).collect())
}

impl Strategy for ParameterServerStrategy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn id(&self) -> StrategyId {
        self.id
    }

    /// A worker's local replicas: those whose gradients make one update (module docs).
    fn num_replicas_in_sync(&self) -> usize {
        self.devices.len()
    }

    fn local_replicas(&self) -> Range<usize> {
        0..self.devices.len()
    }

    fn replica_devices(&self) -> Vec<DeviceSpec> {
        self.devices.clone()
    }

    /// In a step, the servers' variables by the chief's layouts; on the coordinator,
    /// declared only (listed for [`ParameterServerStrategy::create_variables`]).
    fn variable_placement(&self) -> Arc<dyn VariablePlacement> {
        match &self.side {
            Side::Worker { placement, .. } => Arc::new(placement.clone()),
            Side::Coordinator => Arc::new(DeclaredPlacement),
        }
    }

    fn run_replicas(&self, f: ReplicaFn) -> Result<Vec<Box<dyn Any + Send>>, StrategyError> {
        match &self.side {
            Side::Worker { replicas, .. } => replicas.run(f),
            Side::Coordinator => Err(Self::not_on_coordinator(
                "run",
                "the coordinator runs no replicas: schedule a registered step \
                 (ClusterCoordinator::schedule) and call run there, on \
                 ParameterServerStrategy::in_step(ctx)",
            )),
        }
    }

    fn experimental_distribute_dataset(
        &self,
        dataset: Dataset,
        options: DistributeOptions,
    ) -> Result<DistributedDataset, StrategyError> {
        match self.side {
            Side::Worker { .. } => Ok(DistributedDataset::from_dataset(
                dataset,
                options,
                self.num_replicas_in_sync(),
                self.input_pipelines(),
                self.input_pipeline_id(),
            )?),
            Side::Coordinator => Err(Self::not_on_coordinator(
                "experimental_distribute_dataset",
                DATASET_ON_COORDINATOR,
            )),
        }
    }

    /// Inside a step the worker's data is already its own (per-worker datasets are built for
    /// one input pipeline per worker): the step's distribution is one pipeline over the local
    /// replicas.
    fn input_pipelines(&self) -> usize {
        1
    }

    fn input_pipeline_id(&self) -> usize {
        0
    }

    fn distribute_datasets_from_boxed_function(
        &self,
        dataset_fn: Box<DatasetFn>,
        options: DistributeOptions,
    ) -> Result<DistributedDataset, StrategyError> {
        match self.side {
            Side::Worker { .. } => Ok(DistributedDataset::from_function(
                dataset_fn,
                options,
                self.num_replicas_in_sync(),
                self.input_pipelines(),
                self.input_pipeline_id(),
            )?),
            Side::Coordinator => Err(Self::not_on_coordinator(
                "distribute_datasets_from_function",
                DATASET_ON_COORDINATOR,
            )),
        }
    }
}

/// A coordinator call the strategy makes on the chief failed.
impl From<crate::roles::coordinator::CoordinatorError> for StrategyError {
    fn from(e: crate::roles::coordinator::CoordinatorError) -> Self {
        StrategyError::Coordinator(Box::new(e))
    }
}

/// A strategy call that failed inside a scheduled step fails the step (`?` in a step
/// function).
impl From<StrategyError> for crate::roles::worker::StepError {
    fn from(e: StrategyError) -> Self {
        crate::roles::worker::StepError::Step(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::strategy::{ReduceOp, StrategyExt};

    fn column(values: &[f32]) -> Tensor {
        Tensor::from_vec(values.to_vec(), (values.len(), 1), &Device::Cpu).unwrap()
    }

    #[test]
    fn in_a_step_run_all_reduces_across_the_local_replicas_and_reduce_sums_them() {
        let s = ParameterServerStrategy::worker(1, 3, 2, Vec::new()).unwrap();
        assert_eq!(
            (
                s.num_replicas_in_sync(),
                s.local_replicas(),
                s.num_workers()
            ),
            (2, 0..2, 3)
        );
        assert_eq!(s.worker_index(), Some(1));
        let out = s
            .run(
                |ctx, ()| {
                    let id =
                        Tensor::new(ctx.replica_id_in_sync_group() as f32 + 1.0, &Device::Cpu)?;
                    let sum = ctx.all_reduce(ReduceOp::Sum, &id)?;
                    Ok::<_, StrategyError>((id, sum.to_scalar::<f32>()?))
                },
                (),
            )
            .unwrap()
            .transpose()
            .unwrap();
        let (ids, sums): (Vec<_>, Vec<_>) = out.into_values().into_iter().unzip();
        assert_eq!(sums, [3.0, 3.0]);
        let total = s
            .reduce(ReduceOp::Sum, &PerReplica::new(ids.clone()), None)
            .unwrap();
        assert_eq!(total.to_scalar::<f32>().unwrap(), 3.0);
        let mean = s
            .reduce(ReduceOp::Mean, &PerReplica::new(ids), None)
            .unwrap();
        assert_eq!(mean.to_scalar::<f32>().unwrap(), 1.5);
    }

    #[test]
    fn a_batch_splits_over_the_replicas_as_a_distributed_dataset_splits_it() {
        let s = ParameterServerStrategy::worker(0, 1, 2, Vec::new()).unwrap();
        let x = column(&[0., 1., 2., 3., 4.]);
        let split = s.distribute_batch(&[x.clone(), x.clone()]).unwrap();
        let firsts: Vec<Vec<f32>> = split
            .values()
            .iter()
            .map(|share| share[0].flatten_all().unwrap().to_vec1().unwrap())
            .collect();
        assert_eq!(firsts, [vec![0., 1., 2.], vec![3., 4.]]);
        let one = s.distribute_batch(&[column(&[7.])]).unwrap();
        assert_eq!(one.values()[1][0].dims(), &[0, 1]);
        let err = s.distribute_batch(&[x, column(&[1.])]).unwrap_err();
        assert!(
            err.to_string().contains("component 1 has 1 examples"),
            "{err}"
        );
        let scalar = Tensor::new(1f32, &Device::Cpu).unwrap();
        assert!(matches!(
            s.distribute_batch(&[scalar]),
            Err(StrategyError::Data(DataError::NotBatched {
                component: 0,
                ..
            }))
        ));
    }

    #[test]
    fn the_coordinator_runs_no_replicas_and_takes_no_local_dataset() {
        let s = ParameterServerStrategy::coordinator(2, 2).unwrap();
        assert!(s.is_coordinator());
        let err = s.run(|_ctx, ()| (), ()).unwrap_err();
        assert!(
            matches!(
                &err,
                StrategyError::NotAvailable {
                    method: "run",
                    side: "coordinator",
                    ..
                }
            ),
            "{err}"
        );
        let ds = Dataset::range(0, 4, 1).batch(2, false);
        let err = s
            .experimental_distribute_dataset(ds, DistributeOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("code never travels"), "{err}");
        let err = s
            .distribute_datasets_from_function(
                |_ctx| Ok(Dataset::range(0, 4, 1)),
                DistributeOptions::default(),
            )
            .unwrap_err();
        assert!(
            matches!(
                &err,
                StrategyError::NotAvailable {
                    method: "distribute_datasets_from_function",
                    ..
                }
            ),
            "{err}"
        );
        // Variables made in its scope are declared, not drawn.
        let _scope = s.scope();
        let v = crate::variable::Variable::new(
            "w",
            Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap();
        assert!(!v.has_local_copy());
    }
}
