//! The worker: runs scheduled closures (registered step functions) against the parameter
//! servers, one at a time, on a compute thread of its own so that heavy math never delays the
//! node's heartbeats.
//!
//! A step reads variables with [`StepContext::pull`] / [`StepContext::pull_many`] /
//! [`StepContext::pull_rows`] and records gradients with [`StepContext::push_dense`] /
//! [`StepContext::push_rows`]. The gradients are sent when the step function returns `Ok`, as exactly one push per parameter server, keyed
//! by the closure's id and attempt: that single push is the closure's whole effect on that
//! server, which is what lets the server apply it at most once (PS-1).

mod actor;
mod machine;

use std::collections::BTreeMap;

use crate::data::DatasetIterator;
use crate::layout::Layout;
use crate::roles::ps_client::PsClient;
use crate::roles::push::{Gradient, PushPlanError};
use crate::roles::step::DatasetHandle;
pub use crate::roles::step::{PsFailure, StepError};

/// A step: runs on a worker with its context and encoded arguments, returns an encoded value.
pub type StepFn =
    std::sync::Arc<dyn Fn(&mut StepContext<'_>, &[u8]) -> Result<Vec<u8>, StepError> + Send + Sync>;

/// The functions a worker runs by name: the steps the chief schedules and the datasets of its
/// input pipelines. A job's [`Program`](crate::program::Program) is them; the worker names
/// only this trait, so that the registry depends on the worker and not the other way round.
pub trait WorkerFunctions: Send + Sync {
    /// The dataset function `name`.
    fn dataset_fn(&self, name: &str) -> Option<&crate::roles::step::DatasetFn>;
    /// The step function `name`.
    fn step_fn(&self, name: &str) -> Option<&StepFn>;
}

pub use actor::{job_queue, run_worker_thread, SharedMachine, WorkerActor, WorkerJob};
pub use machine::{
    Computed, DatasetPlan, Exit, Request, SetupPlan, StepAction, WorkerMachine, JOBS_MAX, SKIP_MAX,
};

impl From<PushPlanError> for StepError {
    fn from(e: PushPlanError) -> Self {
        match e {
            PushPlanError::UnknownVariable(name) => StepError::UnknownVariable(name),
            e => StepError::Step(e.to_string()),
        }
    }
}

impl From<crate::nn::NnError> for StepError {
    fn from(e: crate::nn::NnError) -> Self {
        StepError::Step(e.to_string())
    }
}

impl From<candle_core::Error> for StepError {
    fn from(e: candle_core::Error) -> Self {
        StepError::Step(e.to_string())
    }
}

/// How a batch of `examples` is shared by `replicas` local replicas: contiguous ranges in
/// order, the first ones one example longer when it does not divide, never empty; one range
/// (the whole batch, even an empty one) for one replica or fewer than two examples.
pub fn replica_ranges(examples: usize, replicas: usize) -> Vec<std::ops::Range<usize>> {
    let parts = replicas.min(examples);
    if parts < 2 {
        return std::iter::once(0..examples).collect();
    }
    let (base, extra) = (examples / parts, examples % parts);
    let mut start = 0;
    (0..parts)
        .map(|part| {
            let len = base + usize::from(part < extra);
            start += len;
            start - len..start
        })
        .collect()
}

/// A per-worker dataset and how many elements this worker has read from it (counting the
/// ones skipped to resume from a checkpoint).
pub struct WorkerDataset {
    pub(crate) iter: DatasetIterator,
    pub(crate) position: u64,
}

/// What a step function sees: the worker, the closure, the variables and this worker's
/// datasets.
pub struct StepContext<'a> {
    worker: u32,
    num_workers: u32,
    closure: u64,
    client: &'a PsClient,
    /// Local replicas a step runs on (the worker's `replicas` key).
    replicas: usize,
    layouts: &'a BTreeMap<String, Layout>,
    datasets: &'a mut BTreeMap<String, WorkerDataset>,
    /// The gradients recorded, sent when the step succeeds (or by
    /// [`StepContext::apply_gradients`]).
    pending: Vec<(String, Gradient<'static>)>,
    /// The worker's machine, which plans and settles the updates applied inside the step.
    machine: &'a actor::SharedMachine,
}

impl<'a> StepContext<'a> {
    /// This worker's index.
    pub fn worker_index(&self) -> u32 {
        self.worker
    }

    /// Workers in the cluster.
    pub fn num_workers(&self) -> u32 {
        self.num_workers
    }

    /// Local replicas this worker runs each step on (its `replicas` key, at least 1):
    /// [`crate::roles::server_model::ServerModel::train_step`] splits a batch over them and pushes their summed gradients
    /// once.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Runs `f` once per local replica, each on its share of a batch of `examples`: the
    /// contiguous ranges of [`replica_ranges`], on threads (the calling one alone for one
    /// replica). Returns each share with its result, in replica order, or the first
    /// replica's error. A hand-written step sums what its replicas return before its one
    /// push, as [`crate::roles::server_model::ServerModel::train_step`] does for a model.
    pub fn on_replicas<T: Send>(
        &self,
        examples: usize,
        f: impl Fn(std::ops::Range<usize>) -> Result<T, StepError> + Sync,
    ) -> Result<Vec<(std::ops::Range<usize>, T)>, StepError> {
        let ranges = replica_ranges(examples, self.replicas);
        if ranges.len() == 1 {
            let range = ranges[0].clone();
            return Ok(vec![(range.clone(), f(range)?)]);
        }
        let f = &f;
        std::thread::scope(|scope| {
            let replicas: Vec<_> = ranges
                .iter()
                .cloned()
                .map(|range| scope.spawn(move || f(range)))
                .collect();
            ranges
                .into_iter()
                .zip(replicas)
                .map(|(range, replica)| {
                    let result = replica.join().map_err(|panic| {
                        StepError::Step(format!(
                            "a replica panicked: {}",
                            cohort_actors::panic_message(panic.as_ref())
                        ))
                    })??;
                    Ok((range, result))
                })
                .collect()
        })
    }

    /// Every variable the chief created, with its layout (for
    /// [`crate::program::ParameterServerStrategy::in_step`]'s variable placement).
    pub(crate) fn layouts(&self) -> impl Iterator<Item = &Layout> {
        self.layouts.values()
    }

    /// The closure being run.
    pub fn closure_id(&self) -> u64 {
        self.closure
    }

    /// Which of the closure's updates the gradients recorded now will be: 0 until the first
    /// [`StepContext::apply_gradients`], then 1, and so on.
    pub fn update_part(&self) -> u32 {
        actor::lock(self.machine)
            .current_origin()
            .map_or(0, |origin| origin.part)
    }

    /// The layout of variable `name`.
    pub fn layout(&self, name: &str) -> Result<&Layout, StepError> {
        self.layouts
            .get(name)
            .ok_or_else(|| StepError::UnknownVariable(name.into()))
    }

    /// The whole value of variable `name`, gathered from its shards.
    pub fn pull(&self, name: &str) -> Result<Vec<f32>, StepError> {
        let layout = self.layout(name)?;
        self.client.pull(layout)
    }

    /// The whole values of several variables, in the order of `names`: one request per
    /// parameter server, all at once, instead of one round trip per variable.
    pub fn pull_many(&self, names: &[&str]) -> Result<Vec<Vec<f32>>, StepError> {
        let layouts = names
            .iter()
            .map(|name| self.layout(name))
            .collect::<Result<Vec<_>, _>>()?;
        self.client.pull_many(&layouts)
    }

    /// Rows `ids` of the `[rows, width]` variable `name`, concatenated in the order of `ids`.
    pub fn pull_rows(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, StepError> {
        let layout = self.layout(name)?;
        self.client.pull_rows(layout, ids)
    }

    /// Records a gradient for the whole variable `name`.
    pub fn push_dense(&mut self, name: &str, grad: Vec<f32>) -> Result<(), StepError> {
        self.layout(name)?;
        self.pending
            .push((name.into(), Gradient::Dense(grad.into())));
        Ok(())
    }

    /// Records row gradients for rows `ids` of variable `name`.
    pub fn push_rows(
        &mut self,
        name: &str,
        ids: Vec<u64>,
        values: Vec<f32>,
    ) -> Result<(), StepError> {
        self.layout(name)?;
        self.pending.push((
            name.into(),
            Gradient::Rows {
                ids: ids.into(),
                values: values.into(),
            },
        ));
        Ok(())
    }

    /// Applies the gradients recorded so far now, as one update of this closure, and starts
    /// the next (Keras' `optimizer.apply_gradients` in each step of a closure running
    /// `steps_per_execution` steps): the next steps pull the values it produced. Each of a
    /// closure's updates is applied at most once (PS-1): an attempt run again after a failure
    /// has the updates an earlier attempt applied refused as duplicates, and applies the rest.
    /// What is recorded after the last call is the closure's last update, pushed when the step
    /// function returns. Nothing recorded: nothing sent.
    pub fn apply_gradients(&mut self) -> Result<(), StepError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let gradients = std::mem::take(&mut self.pending);
        let plan = actor::lock(self.machine).plan_update(gradients)?;
        let outcomes = self.client.push(plan);
        actor::lock(self.machine).handle_update_pushed(std::time::Instant::now(), outcomes)
    }

    /// The next element of this worker's dataset `dataset`: by its registered name, the
    /// element's tensors; by a [`WorkerData<T>`](crate::program::WorkerData) handle, a `T`
    /// (an element of another structure is [`StepError::Element`], naming the dataset).
    pub fn next<D: DatasetHandle>(&mut self, dataset: D) -> Result<D::Element, StepError> {
        let name = dataset.dataset_name();
        let data = self
            .datasets
            .get_mut(name)
            .ok_or_else(|| StepError::UnknownDataset(name.into()))?;
        let element = match data.iter.next() {
            Some(element) => {
                data.position += 1;
                element?
            }
            None => return Err(StepError::EndOfData(name.into())),
        };
        dataset
            .element(element)
            .map_err(|reason| StepError::Element {
                dataset: name.into(),
                reason,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::replica_ranges;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // a list of one range is what is meant
    fn a_batch_is_shared_by_replicas_in_contiguous_ranges_differing_by_at_most_one() {
        assert_eq!(replica_ranges(10, 3), [0..4, 4..7, 7..10]);
        assert_eq!(replica_ranges(4, 4), [0..1, 1..2, 2..3, 3..4]);
        assert_eq!(replica_ranges(2, 8), [0..1, 1..2]);
        assert_eq!(replica_ranges(10, 1), [0..10]);
        assert_eq!(replica_ranges(1, 4), [0..1]);
        assert_eq!(replica_ranges(0, 4), [0..0]);
    }
}
