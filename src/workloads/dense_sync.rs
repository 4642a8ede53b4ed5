//! A small dense classifier trained for a fixed number of steps under any strategy, over the
//! same fixed global batches: the workload showing that a strategy's replicas (in one process
//! or across workers) compute what one process computes.
//!
//! The model is `FEATURES → HIDDEN (relu) → CLASSES`, trained with Adam on a deterministic
//! dataset (no randomness but the initializers' seed) with the loss averaged over the global
//! batch (`compute_average_loss`), so that the replicas' summed gradients are the gradient of
//! the global batch whatever the number of replicas and workers.
//!
//! It also runs elastically under MultiWorkerMirrored ([`train_elastic`]: the survivors of a
//! lost worker re-form and go on with a smaller global batch), and replays such a run in one
//! process ([`train_schedule`]) to check it.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use candle_core::{Device, Module, Tensor};
use candle_nn::VarBuilder;

use crate::strategy::SaveStateError;
use crate::collective::CollectiveError;
use crate::data::{Dataset, DistributeOptions, DistributedIterator};
use crate::distribute::PerReplica;
use crate::nn::{dense, losses, Activation, Dense};
use crate::optim::{Optimizer, OptimizerState};
use crate::strategy::{
    Admission, Ballot, CastVote, CountedVote, Departure, ElasticState, GroupChange, Leave,
    MultiWorkerMirrored, Recovery, ReplicaContext, Strategy, StrategyExt,
};
use crate::train::StateCheckpoints;
use crate::train::{DistributedOptimizer, ReplicatedModel, StepSpec, TrainError};

/// Input features per example.
pub const FEATURES: usize = 8;
/// Hidden units.
pub const HIDDEN: usize = 16;
/// Classes.
pub const CLASSES: usize = 3;
/// Examples of the dataset (it repeats).
pub const EXAMPLES: usize = 96;
/// Adam's learning rate.
pub const LEARNING_RATE: f32 = 0.01;

/// What a run ends with: every trainable variable (flattened, by name) and each step's global
/// loss (NaN for a step of an elastic run whose loss reduction a failure cut; `null` in JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DenseOutcome {
    /// The variables after the last step, by name.
    pub variables: BTreeMap<String, Vec<f32>>,
    /// The global loss of each step (reduced across every replica).
    #[serde(with = "nan_as_null")]
    pub losses: Vec<f32>,
}

impl DenseOutcome {
    /// The first 16 hex digits of a SHA-256 of the variables (each name and its f32 bits,
    /// little-endian, in name order): two workers print the same only when they hold the
    /// same model, bit for bit (DATA-1).
    pub fn digest(&self) -> String {
        let variables = self
            .variables
            .iter()
            .map(|(name, values)| (name.as_str(), values.as_slice()));
        crate::run_report::FinalModel::of(0, variables).digest
    }
}

/// JSON has no NaN: a missing loss goes as `null`.
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(losses: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let values: Vec<Option<f32>> = losses.iter().map(|l| (!l.is_nan()).then_some(*l)).collect();
        values.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let values = Vec::<Option<f32>>::deserialize(d)?;
        Ok(values.into_iter().map(|l| l.unwrap_or(f32::NAN)).collect())
    }
}

/// The dataset: `EXAMPLES` examples of `FEATURES` features and an integer class, repeated,
/// batched to `global_batch`.
pub fn dataset(global_batch: usize) -> Result<Dataset, TrainError> {
    dataset_from(0, global_batch)
}

/// The dataset from its `position`-th example on (counted over the repetitions), batched to
/// `global_batch`: where training goes on after the global batch changed (elastic
/// re-forming), so that every example is seen once in order whatever the batch sizes.
pub fn dataset_from(position: usize, global_batch: usize) -> Result<Dataset, TrainError> {
    DenseProblem::synthetic().dataset_from(position, global_batch)
}

/// What the dense classifier learns: its layer widths, Adam's learning rate, and the training
/// examples (repeated, in order).
#[derive(Debug, Clone)]
pub struct DenseProblem {
    /// Input features per example.
    pub features: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
    /// Adam's learning rate.
    pub learning_rate: f32,
    /// The examples' features, `features` per example.
    pub x: Vec<f32>,
    /// Their classes.
    pub y: Vec<i64>,
}

impl DenseProblem {
    /// The deterministic `EXAMPLES × FEATURES` problem of this module's tests.
    pub fn synthetic() -> Self {
        Self {
            features: FEATURES,
            hidden: HIDDEN,
            classes: CLASSES,
            learning_rate: LEARNING_RATE,
            x: (0..EXAMPLES * FEATURES)
                .map(|i| ((i * 37 + 11) % 29) as f32 / 14.0 - 1.0)
                .collect(),
            y: (0..EXAMPLES)
                .map(|i| ((i * 7 + i / 5) % CLASSES) as i64)
                .collect(),
        }
    }

    /// Examples in one repetition.
    pub fn examples(&self) -> usize {
        self.y.len()
    }

    /// The examples from the `position`-th on (counted over the repetitions), batched to
    /// `global_batch`.
    pub fn dataset_from(
        &self,
        position: usize,
        global_batch: usize,
    ) -> Result<Dataset, TrainError> {
        let cpu = &Device::Cpu;
        let n = self.examples();
        if n == 0 || self.x.len() != n * self.features {
            return Err(TrainError::Tensor(candle_core::Error::Msg(format!(
                "a dense problem of {n} example(s) holds {} feature value(s), not {} per example",
                self.x.len(),
                self.features
            ))));
        }
        let examples = Dataset::from_tensor_slices(vec![
            Tensor::from_vec(self.x.clone(), (n, self.features), cpu)?,
            Tensor::from_vec(self.y.clone(), n, cpu)?,
        ])?
        .repeat(None);
        // Whole repetitions are skipped without reading them.
        Ok(examples.skip(position % n).batch(global_batch, false))
    }
}

/// Trains the model under `strategy` for `steps` global batches of `global_batch` examples.
/// `seed` seeds the initializers: under MultiWorkerMirrored each worker may pass its own, the
/// strategy makes every worker start from the first worker's values.
pub fn train(
    strategy: &dyn Strategy,
    steps: usize,
    global_batch: usize,
    seed: u64,
) -> Result<DenseOutcome, TrainError> {
    train_with(strategy, steps, global_batch, seed, &mut |_, _| {})
}

/// As [`train`], calling `after_step(step, global_loss)` after each step.
pub fn train_with(
    strategy: &dyn Strategy,
    steps: usize,
    global_batch: usize,
    seed: u64,
    after_step: &mut dyn FnMut(usize, f32),
) -> Result<DenseOutcome, TrainError> {
    train_failing(strategy, steps, global_batch, seed, None, after_step)
}

/// How an injected fault makes a replica's step fail ([`train_failing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The step returns an error ("injected failure at step k").
    Error,
    /// The step panics with that message.
    Panic,
}

/// As [`train_with`]; with `fail_at = Some((k, fault))`, the first local replica's step `k`
/// fails with `fault` instead of computing: the fault that shows how a replica's error
/// reaches every worker.
pub fn train_failing(
    strategy: &dyn Strategy,
    steps: usize,
    global_batch: usize,
    seed: u64,
    fail_at: Option<(usize, Fault)>,
    after_step: &mut dyn FnMut(usize, f32),
) -> Result<DenseOutcome, TrainError> {
    let problem = DenseProblem::synthetic();
    let trainer = Trainer::build(strategy, &problem, seed)?;
    let mut iter = input(strategy, &problem, 0, global_batch)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let batch = iter.get_next()?;
        let fault = fail_at.filter(|(k, _)| *k == step).map(|(_, f)| f);
        let loss = trainer.step(strategy, batch, global_batch, fault)?;
        after_step(step, loss);
        losses.push(loss);
    }
    trainer.outcome(losses)
}

/// Trains in segments of `(steps, global_batch)`, each going on with the examples where the
/// previous one stopped: in one process, what an elastic run computes whose group shrank
/// (or grew) between segments.
pub fn train_schedule(
    strategy: &dyn Strategy,
    schedule: &[(usize, usize)],
    seed: u64,
) -> Result<DenseOutcome, TrainError> {
    let problem = DenseProblem::synthetic();
    let trainer = Trainer::build(strategy, &problem, seed)?;
    let (mut position, mut losses) = (0, Vec::new());
    for &(steps, global_batch) in schedule {
        let mut iter = input(strategy, &problem, position, global_batch)?;
        for _ in 0..steps {
            let batch = iter.get_next()?;
            losses.push(trainer.step(strategy, batch, global_batch, None)?);
        }
        position += steps * global_batch;
    }
    trainer.outcome(losses)
}

/// What an elastic run reports as it goes.
#[derive(Debug)]
pub enum ElasticEvent<'a> {
    /// A step completed with this global loss.
    Step {
        /// The step (0-based).
        step: usize,
        /// Its global loss.
        loss: f32,
    },
    /// The group re-formed with the survivors; training goes on from `recovery.step`.
    Recovered(&'a Recovery),
    /// Workers were admitted to the group (on a joiner: itself); training goes on from
    /// `admission.step`.
    Admitted(&'a Admission),
    /// Workers left after a preemption notice (this one, if it is among `departure.left`:
    /// then the run ends).
    Departed(&'a Departure),
    /// The chief saved a checkpoint of this step (completed steps) in `dir`.
    Saved {
        /// The step.
        step: usize,
        /// The checkpoint's directory.
        dir: &'a std::path::Path,
    },
    /// A fresh start resumed from the checkpoint of this step, from the checkpoint root `dir`.
    Restored {
        /// The step.
        step: usize,
        /// The checkpoint root.
        dir: &'a std::path::Path,
    },
}

/// Trains for `steps` steps under MultiWorkerMirrored, elastically: when a step fails because
/// a worker was lost, the survivors re-form ([`MultiWorkerMirrored::recover`]: they agree on
/// the survivors, and take the variables, optimizer slots, step and input position of the
/// survivor that completed the most steps) and go on from the agreed step with the global
/// batch `per_replica_batch × num_replicas_in_sync` of the new group, from the agreed
/// position of the input (so no example is skipped or seen twice). Before each step the
/// workers handle the group's changes ([`MultiWorkerMirrored::at_step_boundary`]): they admit
/// those waiting to join (a restarted or added worker; a worker that joined receives the state
/// first), and let those with a preemption notice or a drain leave (see [`ElasticOptions`]).
///
/// The outcome's losses are by step; a step whose loss reduction was cut by the failure has
/// NaN (on a joiner, so have the steps before it joined). A failure re-forming cannot mend
/// (an application error, a failed recovery) ends the run with it.
pub fn train_elastic(
    strategy: &mut MultiWorkerMirrored,
    steps: usize,
    per_replica_batch: usize,
    seed: u64,
    options: ElasticOptions<'_>,
    on_event: &mut dyn FnMut(ElasticEvent<'_>),
) -> Result<ElasticRun, TrainError> {
    let problem = DenseProblem::synthetic();
    train_elastic_on(
        strategy,
        &problem,
        steps,
        per_replica_batch,
        seed,
        options,
        on_event,
    )
}

/// What an elastic run may do beyond training.
#[derive(Debug, Default)]
pub struct ElasticOptions<'a> {
    /// This worker's preemption notice (e.g. set on SIGTERM by
    /// [`crate::process::stop_on_signals`]): at the next step boundary every worker agrees on
    /// that step, the chief saves a checkpoint of it (where `checkpoints` is given), and this
    /// worker leaves (the run ends with [`ElasticRun::left`]) while the others go on.
    pub notice: Option<&'a AtomicBool>,
    /// This worker's drain (scaled down for good, e.g. set on SIGUSR1 by
    /// [`crate::process::drain_on_signal`]): it leaves at the next step boundary as after a
    /// notice, without the checkpoint (the others hold the state), and the run ends with
    /// [`ElasticRun::left`] and [`ElasticRun::drained`]. A notice set too makes it a
    /// preemption.
    pub drain: Option<&'a AtomicBool>,
    /// The job's checkpoints: the chief saves on their schedule and at every departure; a
    /// fresh start (every worker forming the first epoch) restores the newest on the chief and
    /// gives it to every worker, training going on from its step. Every worker of a job must
    /// be given checkpoints, or none.
    pub checkpoints: Option<&'a mut StateCheckpoints>,
}

/// How an elastic run ended.
#[derive(Debug)]
pub struct ElasticRun {
    /// The variables and losses.
    pub outcome: DenseOutcome,
    /// The re-formings after lost workers.
    pub recoveries: Vec<Recovery>,
    /// Where this worker left after its preemption notice or drain (then the run stopped at
    /// that step); `None` when it trained every step.
    pub left: Option<Departure>,
    /// Whether it left on a drain (for good: its supervisor should not start it again).
    pub drained: bool,
}

/// As [`train_elastic`], on `problem`.
pub fn train_elastic_on(
    strategy: &mut MultiWorkerMirrored,
    problem: &DenseProblem,
    steps: usize,
    per_replica_batch: usize,
    seed: u64,
    options: ElasticOptions<'_>,
    on_event: &mut dyn FnMut(ElasticEvent<'_>),
) -> Result<ElasticRun, TrainError> {
    let ElasticOptions {
        notice,
        drain,
        mut checkpoints,
    } = options;
    let me = crate::cluster::node_id(strategy.task());
    let trainer = Trainer::build(&*strategy, problem, seed)?;
    let variables = trainer.model.trainable_variables()?;
    let optimizer = Some(trainer.optimizer.as_ref() as &dyn OptimizerState);
    let mut progress = Progress::new(steps, &variables, optimizer);
    let mut recoveries = Vec::new();
    // A fresh start resumes from the chief's newest checkpoint, given to every worker (a
    // joiner gets the live state at its first step boundary instead).
    if let Some(checkpoints) = checkpoints.as_deref_mut().filter(|_| !strategy.awaits_state()) {
        let mut state = progress.state();
        resume(strategy, checkpoints, &mut state, on_event)?;
        progress.go_to(state.step, state.position);
    }
    // Each pass of 'group trains with one group; the last boundary comes after the last
    // step (the closing boundary): a worker that applied the last step while the others
    // failed it (a ring delivers a step to some members and not to others) meets them there
    // and gives them its state, instead of ending with a model they do not hold.
    'group: loop {
        let global_batch = per_replica_batch * strategy.num_replicas_in_sync();
        // Made at the first step of this group (none where only the closing boundary is left).
        let mut iter = None;
        // The next boundary's votes, counted in the step before it (none after a group
        // change, or before the closing boundary: those boundaries vote on their own).
        let mut counted: Option<CountedVote> = None;
        loop {
            let mut state = progress.state();
            let ballot = match counted.take() {
                Some(counted) => Ballot::Counted(counted),
                None => Ballot::Now(Leave::noticed(notice, drain)),
            };
            let change = step_boundary(
                strategy,
                checkpoints.as_deref_mut(),
                &mut state,
                ballot,
                on_event,
            );
            let result = match change {
                Ok(None) if progress.step >= steps => break 'group,
                Ok(None) => {
                    let iter = match &mut iter {
                        Some(iter) => iter,
                        None => iter.insert(input(
                            &*strategy,
                            problem,
                            progress.position,
                            global_batch,
                        )?),
                    };
                    let leaving = Leave::noticed(notice, drain);
                    let sizes = (steps, global_batch);
                    let result = elastic_step(strategy, &trainer, iter, &mut progress, sizes, leaving);
                    result.map(|(loss, votes)| {
                        counted = votes;
                        loss
                    })
                }
                Ok(Some(GroupChange::Admitted(admission))) => {
                    progress.go_to(admission.step, admission.position);
                    on_event(ElasticEvent::Admitted(&admission));
                    continue 'group;
                }
                Ok(Some(GroupChange::Departed(departure))) => {
                    on_event(ElasticEvent::Departed(&departure));
                    continue 'group;
                }
                Ok(Some(GroupChange::Leaving(departure))) => {
                    on_event(ElasticEvent::Departed(&departure));
                    let drained = departure.was_drained(&me);
                    let left = Some(departure);
                    return trainer.run_ended(progress.losses, recoveries, left, drained);
                }
                Err(err) => Err(err.into()),
            };
            let checkpoints = checkpoints.as_deref_mut();
            if let Some(recovery) = progress.settle(strategy, result, checkpoints, on_event)? {
                recoveries.push(recovery);
                continue 'group;
            }
        }
    }
    trainer.run_ended(progress.losses, recoveries, None, false)
}

/// The next step of an elastic run on `iter`, `(steps, global_batch)` its length and batch:
/// its loss, and the next boundary's votes counted in it (this worker's with `leaving`; none
/// where the closing boundary comes next, which votes on its own). `progress` moves on where
/// the update was applied here, even if the step failed after it.
fn elastic_step(
    strategy: &MultiWorkerMirrored,
    trainer: &Trainer,
    iter: &mut DistributedIterator,
    progress: &mut Progress<'_>,
    (steps, global_batch): (usize, usize),
    leaving: Option<Leave>,
) -> Result<(f32, Option<CountedVote>), TrainError> {
    let vote = if progress.step + 1 < steps {
        Some(strategy.cast_vote(leaving)?)
    } else {
        None
    };
    let (result, applied) = trainer.next_step(strategy, iter, global_batch, vote);
    if applied {
        progress.step += 1;
        progress.position += global_batch;
    }
    result
}

/// Where an elastic run stands: steps completed, examples read, each step's global loss (NaN
/// for the steps this process did not train itself: resumed from a checkpoint, or taken over
/// with another member's state), and what a group change carries (the variables and the
/// optimizer's slots).
struct Progress<'a> {
    step: usize,
    position: usize,
    losses: Vec<f32>,
    variables: &'a [crate::variable::Variable],
    optimizer: Option<&'a dyn OptimizerState>,
}

impl<'a> Progress<'a> {
    /// Nothing trained yet, room for `steps` losses.
    fn new(
        steps: usize,
        variables: &'a [crate::variable::Variable],
        optimizer: Option<&'a dyn OptimizerState>,
    ) -> Self {
        Self {
            step: 0,
            position: 0,
            losses: Vec::with_capacity(steps),
            variables,
            optimizer,
        }
    }

    /// The state a step boundary, a recovery or a checkpoint takes.
    fn state(&self) -> ElasticState<'a> {
        ElasticState {
            step: self.step as u64,
            position: self.position as u64,
            variables: self.variables,
            optimizer: self.optimizer,
            epochs: Default::default(),
        }
    }

    /// Training goes on from `step` and `position` (a checkpoint's, or another member's).
    fn go_to(&mut self, step: u64, position: u64) {
        self.step = step as usize;
        self.position = position as usize;
        self.losses.resize(self.step, f32::NAN);
    }

    /// Settles a step's `result`: its loss recorded (and a checkpoint saved when one is due),
    /// or, when a collective failed it, the group re-formed with the survivors, going on from
    /// the state of the one with the most steps (the re-forming returned). Any other failure
    /// is the run's.
    fn settle(
        &mut self,
        strategy: &mut MultiWorkerMirrored,
        result: Result<f32, TrainError>,
        checkpoints: Option<&mut StateCheckpoints>,
        on_event: &mut dyn FnMut(ElasticEvent<'_>),
    ) -> Result<Option<Recovery>, TrainError> {
        match result {
            Ok(loss) => {
                self.losses.push(loss);
                on_event(ElasticEvent::Step {
                    step: self.step - 1,
                    loss,
                });
                if let Some(checkpoints) = checkpoints {
                    save_if_due(&*strategy, checkpoints, &self.state(), on_event)?;
                }
                Ok(None)
            }
            Err(err) => {
                let mut state = self.state();
                let recovery = recover_from(strategy, err, &mut state)?;
                self.go_to(state.step, state.position);
                on_event(ElasticEvent::Recovered(&recovery));
                Ok(Some(recovery))
            }
        }
    }
}

/// A step boundary of the elastic run at `state`: the group's changes
/// ([`MultiWorkerMirrored::at_step_boundary`]), the chief saving `state` into `checkpoints`
/// first where a preempted worker leaves (said through `on_event`).
fn step_boundary(
    strategy: &mut MultiWorkerMirrored,
    mut checkpoints: Option<&mut StateCheckpoints>,
    state: &mut ElasticState<'_>,
    ballot: Ballot,
    on_event: &mut dyn FnMut(ElasticEvent<'_>),
) -> Result<Option<GroupChange>, crate::strategy::StrategyError> {
    let at = state.step as usize;
    let mut saved_dir = None;
    let mut save = |state: &ElasticState<'_>| -> Result<(), SaveStateError> {
        if let Some(checkpoints) = checkpoints.as_deref_mut() {
            saved_dir = Some(checkpoints.save(state)?);
        }
        Ok(())
    };
    let change = strategy.at_boundary(state, ballot, &mut save);
    if let Some(dir) = saved_dir {
        on_event(ElasticEvent::Saved {
            step: at,
            dir: dir.as_path(),
        });
    }
    change
}

/// Re-forms the group after a step failed with `err` and agrees on `state`, where a lost
/// worker broke the group; any other failure (the application's, or no collective's) is the
/// run's error.
fn recover_from(
    strategy: &mut MultiWorkerMirrored,
    err: TrainError,
    state: &mut ElasticState<'_>,
) -> Result<Recovery, TrainError> {
    match collective_cause(&err) {
        Some(CollectiveError::Application { .. }) | None => Err(err),
        Some(_) => Ok(strategy.recover(state)?),
    }
}

/// Gives every worker the chief's newest checkpoint in `state` (the chief restores it, and
/// says so through `on_event`; the workers agree on it). A worker lost meanwhile is no error
/// here: the loop's first step boundary fails with that loss, and `recover` agrees on the
/// state instead (the chief's restored step is the highest, unless the chief is the one lost).
fn resume(
    strategy: &mut MultiWorkerMirrored,
    checkpoints: &mut StateCheckpoints,
    state: &mut ElasticState<'_>,
    on_event: &mut dyn FnMut(ElasticEvent<'_>),
) -> Result<(), TrainError> {
    let local_copies = strategy.local_replicas().len();
    if strategy.is_chief() {
        if let Some(restored) = checkpoints.restore_into(state, local_copies)? {
            on_event(ElasticEvent::Restored {
                step: restored as usize,
                dir: checkpoints.root(),
            });
        }
    }
    if let Err(err) = strategy.agree(state) {
        let err = TrainError::from(err);
        if matches!(
            collective_cause(&err),
            Some(CollectiveError::Application { .. }) | None
        ) {
            return Err(err);
        }
    }
    Ok(())
}

/// The chief's periodic checkpoint of `state`, where `checkpoints` says one is due at its
/// step.
fn save_if_due(
    strategy: &MultiWorkerMirrored,
    checkpoints: &mut StateCheckpoints,
    state: &ElasticState<'_>,
    on_event: &mut dyn FnMut(ElasticEvent<'_>),
) -> Result<(), TrainError> {
    if strategy.is_chief() && checkpoints.should_save(state.step) {
        let dir = checkpoints.save(state)?;
        on_event(ElasticEvent::Saved {
            step: state.step as usize,
            dir: dir.as_path(),
        });
    }
    Ok(())
}

/// A multilayer perceptron: relu [`Dense`] layers, then linear logits (cohort's candle-nn
/// `Dense`, the fused node on the CPU).
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Dense>,
}

impl Mlp {
    /// The perceptron mapping `widths[0]` features through the hidden widths to
    /// `widths.last()` logits; its variables are `hidden{i}.weight`/`.bias` and
    /// `logits.weight`/`.bias`.
    pub fn build(widths: &[usize], vb: VarBuilder<'_>) -> candle_core::Result<Self> {
        let Some(last) = widths.len().checked_sub(1).filter(|l| *l > 0) else {
            candle_core::bail!("a perceptron needs at least its inputs and outputs, got {widths:?}");
        };
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, pair)| {
                if i + 1 == last {
                    dense(pair[0], pair[1], Activation::Linear, vb.pp("logits"))
                } else {
                    dense(pair[0], pair[1], Activation::Relu, vb.pp(format!("hidden{i}")))
                }
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { layers })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.layers.iter().try_fold(x.clone(), |x, layer| layer.forward(&x))
    }
}

/// One replica's part of a classifier's training step, inside `run`: `model` on the
/// features `inputs[0]`, sparse softmax cross-entropy against the classes `inputs[1]`
/// averaged over the `global_batch` (so that the replicas' summed gradients are the global
/// batch's), and `optimizer`'s update (which all-reduces the gradients across the replicas).
/// `step` seeds the step's randomness. Returns the global batch's loss, summed across the
/// replicas in the gradients' all-reduce ([`crate::train::StepOutput::global_loss`]): the
/// same on every replica.
pub fn replica_train_step(
    ctx: &ReplicaContext,
    model: &ReplicatedModel<Mlp>,
    optimizer: &DistributedOptimizer,
    inputs: &[Tensor],
    global_batch: usize,
    step: u64,
) -> Result<f32, TrainError> {
    let (loss, _) =
        replica_train_step_voting(ctx, model, optimizer, inputs, global_batch, step, None)?;
    Ok(loss)
}

/// [`replica_train_step`], counting `vote` (this worker's vote at the next step boundary,
/// cast before the step: [`crate::strategy::CastVote`]) in the gradients' all-reduce; returns
/// the vote's sums beside the loss (none without a vote).
pub fn replica_train_step_voting(
    ctx: &ReplicaContext,
    model: &ReplicatedModel<Mlp>,
    optimizer: &DistributedOptimizer,
    inputs: &[Tensor],
    global_batch: usize,
    step: u64,
    vote: Option<&CastVote>,
) -> Result<(f32, Vec<f32>), TrainError> {
    let (Some(features), Some(classes)) = (inputs.first(), inputs.get(1)) else {
        return Err(TrainError::BatchComponents {
            needed: 2,
            got: inputs.len(),
        });
    };
    let spec = StepSpec::new(step).global_batch_size(global_batch);
    let ballot = vote.map_or_else(Vec::new, |v| v.values(ctx.local_replica_id()));
    let output = model.train_step_summing(ctx, optimizer, spec, |mlp| {
        let loss = losses::sparse_softmax_cross_entropy(&mlp.forward(features)?, classes)
            .map_err(candle_core::Error::wrap)?;
        Ok((loss, ballot))
    })?;
    Ok((output.global_loss(), output.sums().to_vec()))
}

/// The collective error under a training error, if that is what it is.
pub fn collective_cause(err: &TrainError) -> Option<&CollectiveError> {
    err.collective_cause()
}

/// The model and its optimizer, built under a strategy.
struct Trainer {
    model: Arc<ReplicatedModel<Mlp>>,
    optimizer: Arc<DistributedOptimizer>,
}

impl Trainer {
    fn build(
        strategy: &dyn Strategy,
        problem: &DenseProblem,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let widths = [problem.features, problem.hidden, problem.classes];
        let model = Arc::new(ReplicatedModel::build(strategy, seed, |vb| {
            Mlp::build(&widths, vb)
        })?);
        let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::adam(
            problem.learning_rate,
        )));
        Ok(Self { model, optimizer })
    }

    /// Updates the optimizer went through (applied or skipped).
    fn optimizer_steps(&self) -> u64 {
        self.optimizer.iterations() + self.optimizer.skipped_steps()
    }

    /// One step over `batch` (this process's per-replica batches of a global batch of
    /// `global_batch`): its global loss. With a `fault`, the first local replica fails with
    /// it instead.
    /// One step on the next global batch of `iter`: its loss, and whether the update was
    /// applied here. A step counts once it was, even if the group broke right after (with a
    /// ring, some survivors may have applied it and others not).
    fn next_step(
        &self,
        strategy: &dyn Strategy,
        iter: &mut DistributedIterator,
        global_batch: usize,
        vote: Option<CastVote>,
    ) -> (Result<(f32, Option<CountedVote>), TrainError>, bool) {
        let before = self.optimizer_steps();
        let result = iter
            .get_next()
            .map_err(TrainError::from)
            .and_then(|batch| self.step_voting(strategy, batch, global_batch, None, vote));
        (result, self.optimizer_steps() > before)
    }

    fn step(
        &self,
        strategy: &dyn Strategy,
        batch: PerReplica<Vec<Tensor>>,
        global_batch: usize,
        fault: Option<Fault>,
    ) -> Result<f32, TrainError> {
        Ok(self.step_voting(strategy, batch, global_batch, fault, None)?.0)
    }

    /// One step; with a `vote`, counted in the step's all-reduce.
    fn step_voting(
        &self,
        strategy: &dyn Strategy,
        batch: PerReplica<Vec<Tensor>>,
        global_batch: usize,
        fault: Option<Fault>,
        vote: Option<CastVote>,
    ) -> Result<(f32, Option<CountedVote>), TrainError> {
        let (model, optimizer) = (Arc::clone(&self.model), Arc::clone(&self.optimizer));
        let step = self.optimizer_steps();
        let ballot = vote.clone();
        let outputs = strategy.try_run(
            move |ctx, inputs: Vec<Tensor>| -> Result<(f32, Vec<f32>), TrainError> {
                if let Some(fault) = fault.filter(|_| ctx.local_replica_id() == 0) {
                    let message = format!("injected failure at step {step}");
                    match fault {
                        Fault::Error => {
                            return Err(TrainError::Tensor(candle_core::Error::Msg(message)))
                        }
                        Fault::Panic => panic!("{message}"),
                    }
                }
                let vote = ballot.as_ref();
                replica_train_step_voting(ctx, &model, &optimizer, &inputs, global_batch, step, vote)
            },
            batch,
        )?;
        // Every replica holds the same global loss and sums (they rode in the gradients'
        // all-reduce).
        let Some((loss, sums)) = outputs.values().first() else {
            return Ok((f32::NAN, None));
        };
        Ok((*loss, vote.map(|v| v.counted(sums))))
    }

    /// How an elastic run ended: its outcome after `losses`, the `recoveries`, and where this
    /// worker `left` (and whether `drained`).
    fn run_ended(
        &self,
        losses: Vec<f32>,
        recoveries: Vec<Recovery>,
        left: Option<Departure>,
        drained: bool,
    ) -> Result<ElasticRun, TrainError> {
        Ok(ElasticRun {
            outcome: self.outcome(losses)?,
            recoveries,
            left,
            drained,
        })
    }

    fn outcome(&self, losses: Vec<f32>) -> Result<DenseOutcome, TrainError> {
        let variables = self
            .model
            .trainable_variables()?
            .iter()
            .map(|v| {
                Ok((
                    v.name().to_string(),
                    v.read_value().flatten_all()?.to_vec1::<f32>()?,
                ))
            })
            .collect::<Result<BTreeMap<_, _>, TrainError>>()?;
        Ok(DenseOutcome { variables, losses })
    }
}

/// This process's iterator over the dataset from `position`, batched to `global_batch`.
fn input(
    strategy: &dyn Strategy,
    problem: &DenseProblem,
    position: usize,
    global_batch: usize,
) -> Result<DistributedIterator, TrainError> {
    Ok(strategy
        .experimental_distribute_dataset(
            problem.dataset_from(position, global_batch)?,
            DistributeOptions::default(),
        )?
        .iter())
}
