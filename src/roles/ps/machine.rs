//! A parameter server's state as a pure machine: the variable shards it holds, their optimizer
//! slots, and the rules that make an update take effect exactly once.
//!
//! Invariants kept here:
//! - PS-1: each closure's update is applied at most once (keyed by closure id and, for a
//!   closure of several steps, the update's part; a re-dispatched attempt of a closure already
//!   applied is refused as a duplicate). The ids kept for this
//!   stay bounded: the coordinator's low watermark (`handle_finished_below`) says which
//!   closures are finished for good; their ids are dropped and any push of theirs refused;
//! - FENCE-1: a push from a worker incarnation the coordinator fenced changes nothing;
//! - PS-1 across a parameter-server recovery: the coordinator's restore generation
//!   (`handle_begin_restore`) closes the server to pushes until the roll-back of that
//!   generation re-opens it, and from then on a push, watermark or roll-back of an older
//!   generation changes nothing (it was sent before the restore and belongs to a closure the
//!   coordinator has already settled);
//! - a push is all-or-nothing: every gradient in it is checked (names, lengths, row ids,
//!   finiteness) before any variable changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::ledger::{ClosureId, WorkerIncarnation};
use crate::nn::Initializer;
use crate::optim::{
    first_non_finite, LearningRateSchedule, NonFinitePolicy, OptimError, Optimizer,
    OptimizerScopes, Screen, Slots, UpdateOutcome,
};
use crate::roles::protocol::{
    bytes_to_f32, f32_blob, InitProblem, InitSpec, PsRefusal, ShardState,
};

pub use crate::roles::protocol::PsError;
pub use crate::roles::push::{Gradient, PushOrigin, PushOutcome};

/// Counters a test or the run summary reads to prove PS-1 and FENCE-1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PsCounters {
    /// Pushes applied.
    pub applied: u64,
    /// Pushes refused because their closure was already applied (PS-1).
    pub rejected_duplicate: u64,
    /// Pushes refused because their worker incarnation was fenced (FENCE-1).
    pub rejected_stale: u64,
    /// Pushes skipped for non-finite gradients.
    pub skipped_non_finite: u64,
    /// Pushes refused as invalid (unknown variable, wrong shape).
    pub rejected_invalid: u64,
    /// Pushes refused for their restore generation (older than the server's, or sent while
    /// a restore was under way); counted in `rejected_stale` too.
    #[serde(default)]
    pub rejected_old_generation: u64,
}

/// A variable shard held by this parameter server.
#[derive(Debug, Clone)]
pub struct StoredVariable {
    shape: Vec<usize>,
    /// Shared with pull replies still in flight (zero-copy); an update copies it first only if
    /// one still holds it (`Arc::make_mut`), so a reply never sees a later update.
    values: Arc<Vec<f32>>,
    slots: Slots,
    steps: u64,
}

impl StoredVariable {
    /// The shape of this shard.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its values, row-major.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Its optimizer slots.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Updates applied to it so far (the optimizer's step count).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn row_width(&self, name: &str) -> Result<usize, PsError> {
        match self.shape.as_slice() {
            [_, width] if *width > 0 => Ok(*width),
            _ => Err(PsError::NotRowShaped {
                name: name.into(),
                shape: self.shape.clone(),
            }),
        }
    }
}

/// The parameter server's state machine.
///
/// Calling protocol (the actor shell, for each message in arrival order):
/// 1. `handle_create` for each variable shard placed here (idempotent for the same shape);
/// 2. `handle_fence(worker, incarnation)` when the coordinator declares a worker incarnation lost,
///    and `handle_finished_below(closure, generation)` when it says which closures are
///    finished for good;
/// 3. `pull`/`pull_rows` to read values, `handle_push` to apply gradients;
/// 4. `counters()`/`variables()` for checkpoints, tests and the run summary;
/// 5. a parameter-server recovery: `handle_begin_restore(generation, fences, afresh)` (pushes are
///    refused from then on), `handle_restore` for every shard, then
///    `handle_roll_back(cut, generation)` (pushes of that generation are accepted again).
#[derive(Debug)]
pub struct ParameterStore {
    /// The optimizer of every variable outside `scopes`.
    optimizer: Optimizer,
    /// Optimizers given for name scopes ([`OptimizerScopes`]): each applied at its own
    /// constant rate.
    scopes: OptimizerScopes,
    /// The learning rate as a function of each variable's update count, if not the
    /// optimizer's constant one.
    schedule: Option<LearningRateSchedule>,
    variables: BTreeMap<String, StoredVariable>,
    /// PS-1: the updates (closure, part) at or above `finished_below` that took effect here.
    applied_closures: BTreeSet<(ClosureId, u32)>,
    /// The coordinator's low watermark: every closure below it is finished for good, so a
    /// push of one of them can only be a late retry (PS-1 without keeping its id).
    finished_below: ClosureId,
    /// One past the highest id dropped from `applied_closures` (0 if none).
    pruned_next_free: u64,
    /// FENCE-1: per worker, the newest fenced incarnation.
    fenced: BTreeMap<u32, WorkerIncarnation>,
    /// The coordinator's restore generation this server is at.
    generation: u64,
    /// The incarnation of the process holding this store (0: not known, nothing is refused
    /// for it): see [`PushOrigin::server`].
    incarnation: u64,
    /// A restore of `generation` is under way: every push is refused until its roll-back.
    restoring: bool,
    /// That restore is a chief's start afresh: it writes no checkpoint's shard, only closes
    /// the server to an earlier chief's pushes ([`Self::restoring_shards`]).
    restoring_afresh: bool,
    counters: PsCounters,
}

impl ParameterStore {
    /// An empty store whose variables are updated by `optimizer` (refused if its
    /// hyperparameters are invalid).
    pub fn new(optimizer: Optimizer) -> Result<Self, PsError> {
        optimizer.validate()?;
        Ok(Self {
            optimizer,
            scopes: OptimizerScopes::new(),
            schedule: None,
            variables: BTreeMap::new(),
            applied_closures: BTreeSet::new(),
            finished_below: ClosureId(0),
            pruned_next_free: 0,
            fenced: BTreeMap::new(),
            generation: 0,
            restoring: false,
            restoring_afresh: false,
            incarnation: 0,
            counters: PsCounters::default(),
        })
    }

    /// The same store, knowing the incarnation of the process that holds it: a push named for
    /// an older incarnation of this server is refused as stale ([`PushOrigin::server`]).
    pub fn with_incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The same store with the learning rate following `schedule` (Keras' schedules under
    /// ParameterServerStrategy): update `n` of a variable (1-based, its step count, restored
    /// with it from a checkpoint) uses the rate `schedule.at(n - 1)`, as Keras passes
    /// `optimizer.iterations` before the update. Refused if the schedule cannot give a rate.
    pub fn with_schedule(mut self, schedule: LearningRateSchedule) -> Result<Self, PsError> {
        schedule.validate()?;
        self.schedule = Some(schedule);
        Ok(self)
    }

    /// The same store with the variables of `scopes` updated by their scope's optimizer, each
    /// at its own constant rate or following its own schedule (the store's schedule and a
    /// closure's rate are the default optimizer's). Refused, naming the scope, for a bad
    /// scope, optimizer or schedule.
    pub fn with_optimizer_scopes(mut self, scopes: OptimizerScopes) -> Result<Self, PsError> {
        scopes.validate().map_err(|err| PsError::OptimizerScope {
            reason: err.to_string(),
        })?;
        self.scopes = scopes;
        Ok(self)
    }

    /// The optimizer that updates the variable (shard) `name`: its scope's, else the default.
    pub fn optimizer_for(&self, name: &str) -> &Optimizer {
        self.scopes.of(name).unwrap_or(&self.optimizer)
    }

    /// `optimizer` for update `step` (1-based) of a variable under `schedule`.
    fn optimizer_at(
        optimizer: Optimizer,
        schedule: Option<&LearningRateSchedule>,
        step: u64,
    ) -> Optimizer {
        match schedule {
            Some(schedule) => optimizer.with_learning_rate(schedule.at(step.saturating_sub(1))),
            None => optimizer,
        }
    }

    /// Creates a variable shard with its initial value. Creating it again with the same shape
    /// is a no-op (a re-sent create after a reconnect). With another shape it replaces the
    /// shard held: only a chief that restarted asks for that (a live coordinator never creates
    /// a name twice), after servers joined or left the job and its variables were placed
    /// again; what this server held is then restored from the chief's checkpoint before any
    /// push, or the chief refuses to start over servers that trained (see the coordinator
    /// machine's start).
    pub fn handle_create(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        initial: Vec<f32>,
    ) -> Result<(), PsError> {
        let expected = shape.iter().product::<usize>();
        if initial.len() != expected {
            return Err(PsError::InitialValueLength {
                name: name.into(),
                shape,
                expected,
                got: initial.len(),
            });
        }
        if let Some(existing) = self.variables.get(name) {
            if existing.shape == shape {
                return Ok(());
            }
            tracing::warn!(
                "variable {name:?} is created again with shape {shape:?} (held: {:?}): the \
                 servers' placement changed; the shard held is replaced",
                existing.shape
            );
        }
        let slots = self.optimizer_for(name).new_slots(name, expected);
        self.variables.insert(
            name.into(),
            StoredVariable {
                shape,
                values: Arc::new(initial),
                slots,
                steps: 0,
            },
        );
        Ok(())
    }

    /// Creates a variable shard as a [`CreateVariable`](crate::roles::protocol::CreateVariable)
    /// asks: the shape checked against [`ELEMENTS_MAX`], the initial values drawn per `init`
    /// ([`initial_values`]), then [`handle_create`](Self::handle_create).
    pub fn handle_create_from(
        &mut self,
        name: &str,
        shape: &[u64],
        init: &InitSpec,
    ) -> Result<(), PsRefusal> {
        let shape = shape_of(shape)?;
        let values = initial_values(name, &shape, init)?;
        Ok(self.handle_create(name, shape, values)?)
    }

    /// The serving gate: a server answers reads and pushes only once it holds a variable. One
    /// that restarted holds none until the coordinator restores it; until then it refuses
    /// (the worker reports it unavailable, and the closure runs again after the restore).
    pub fn serving(&self) -> bool {
        !self.variables.is_empty()
    }

    /// Restores a shard from a checkpoint: values, slots and step count replace what is held.
    pub fn handle_restore(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        values: Vec<f32>,
        slots: Slots,
        steps: u64,
    ) -> Result<(), PsError> {
        if !self.restoring {
            return Err(PsError::NotRestoring { name: name.into() });
        }
        let expected = shape.iter().product::<usize>();
        if values.len() != expected {
            return Err(PsError::InitialValueLength {
                name: name.into(),
                shape,
                expected,
                got: values.len(),
            });
        }
        if slots.len() != expected
            || self
                .optimizer_for(name)
                .slot_names()
                .iter()
                .any(|slot| !slots.contains(slot))
        {
            return Err(PsError::SlotsMismatch { name: name.into() });
        }
        if steps == u64::MAX {
            return Err(PsError::BadStepCount {
                name: name.into(),
                steps,
            });
        }
        self.variables.insert(
            name.into(),
            StoredVariable {
                shape,
                values: Arc::new(values),
                slots,
                steps,
            },
        );
        Ok(())
    }

    /// FENCE-1: pushes from `worker` at `incarnation` or older change nothing from now on.
    pub fn handle_fence(&mut self, worker: u32, incarnation: WorkerIncarnation) {
        let fenced = self.fenced.entry(worker).or_insert(incarnation);
        *fenced = (*fenced).max(incarnation);
    }

    /// The whole value of a variable.
    pub fn pull(&self, name: &str) -> Result<&[f32], PsError> {
        self.variable(name).map(StoredVariable::values)
    }

    /// Sets a variable's values from the chief, its optimizer slots and step count kept
    /// (Keras' `set_weights`): refused for an unknown variable, a value of another length, or
    /// while a restore is under way (the roll-back would undo it); nothing changes then.
    pub fn handle_assign(&mut self, name: &str, values: Vec<f32>) -> Result<(), PsError> {
        if self.restoring {
            return Err(PsError::AssignDuringRestore { name: name.into() });
        }
        let var = self
            .variables
            .get_mut(name)
            .ok_or_else(|| PsError::UnknownVariable(name.into()))?;
        if values.len() != var.values.len() {
            return Err(PsError::AssignLength {
                name: name.into(),
                expected: var.values.len(),
                got: values.len(),
            });
        }
        var.values = Arc::new(values);
        Ok(())
    }

    /// The whole value of a shard, shared rather than copied: what a pull reply sends.
    pub fn pull_shared(&self, name: &str) -> Result<Arc<Vec<f32>>, PsError> {
        self.variable(name).map(|var| Arc::clone(&var.values))
    }

    /// Some rows of a `[rows, width]` variable, concatenated in the order of `ids`.
    pub fn pull_rows(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, PsError> {
        let var = self.variable(name)?;
        let width = var.row_width(name)?;
        let rows = var.shape[0];
        let len = ids
            .len()
            .checked_mul(width)
            .filter(|&n| n <= PULL_ELEMENTS_MAX)
            .ok_or(PsError::TooLarge {
                name: name.into(),
                elements_max: PULL_ELEMENTS_MAX,
            })?;
        if let Some(&row) = ids
            .iter()
            .find(|&&id| usize::try_from(id).map_or(true, |r| r >= rows))
        {
            return Err(PsError::RowOutOfRange {
                name: name.into(),
                row,
                rows,
            });
        }
        let mut out = vec![0.0f32; len];
        // Every id is in range (checked above). Rows are scattered over a large table, so
        // this loop waits on memory; copies of a width known at compile time keep more rows
        // in flight than a call to memcpy per row.
        match width {
            8 => gather_rows::<8>(&var.values, ids, &mut out),
            16 => gather_rows::<16>(&var.values, ids, &mut out),
            32 => gather_rows::<32>(&var.values, ids, &mut out),
            64 => gather_rows::<64>(&var.values, ids, &mut out),
            _ => {
                for (dst, &id) in out.chunks_exact_mut(width.max(1)).zip(ids) {
                    let start = id as usize * width;
                    dst.copy_from_slice(&var.values[start..start + width]);
                }
            }
        }
        Ok(out)
    }

    /// Why a push from `origin` changes nothing, counted (FENCE-1, PS-1), or `None`: it may
    /// apply.
    fn refusal_of(&mut self, origin: &PushOrigin) -> Option<PushOutcome> {
        if self
            .fenced
            .get(&origin.worker)
            .is_some_and(|fenced| origin.incarnation <= *fenced)
        {
            self.counters.rejected_stale += 1;
            return Some(PushOutcome::Fenced);
        }
        if origin.server != 0 && origin.server < self.incarnation {
            // PS-1: computed for an older process of this server, whose state this one
            // never held (see `PushOrigin::server`).
            self.counters.rejected_stale += 1;
            return Some(PushOutcome::Stale);
        }
        if self.restoring || origin.generation < self.generation {
            // PS-1: sent before the restore (or during it); its closure was settled by the
            // coordinator before the restore began and may run again after it.
            self.counters.rejected_stale += 1;
            self.counters.rejected_old_generation += 1;
            return Some(PushOutcome::Stale);
        }
        let update = (origin.closure, origin.part);
        if self.applied_closures.contains(&update) || origin.closure < self.finished_below {
            self.counters.rejected_duplicate += 1;
            return Some(PushOutcome::Duplicate);
        }
        None
    }

    /// Applies one closure's gradients, all or nothing, at most once (PS-1), never from a
    /// fenced incarnation (FENCE-1), at the closure's learning rate where the chief set one
    /// ([`PushOrigin::learning_rate`]; it replaces the schedule), else at the server's own.
    pub fn handle_push(
        &mut self,
        origin: PushOrigin,
        gradients: &[(String, Gradient<'_>)],
    ) -> Result<PushOutcome, PsError> {
        if let Some(refused) = self.refusal_of(&origin) {
            return Ok(refused);
        }
        let update = (origin.closure, origin.part);
        if let Err(err) = self.check_push(gradients) {
            self.counters.rejected_invalid += 1;
            return Err(err);
        }
        // The closure's rate (ClusterCoordinator::set_learning_rate), checked as the
        // optimizer's own is: a rate decoded from the wire may be anything.
        let scheduled_optimizer = match origin.learning_rate {
            Some(rate) => {
                let optimizer = self.optimizer.with_learning_rate(rate.get());
                if let Err(err) = optimizer.validate() {
                    self.counters.rejected_invalid += 1;
                    return Err(err.into());
                }
                Some(optimizer)
            }
            None => None,
        };
        if let Some(skipped) = self.screen_non_finite(update, gradients)? {
            return Ok(skipped);
        }
        for (name, gradient) in gradients {
            let var = self.variables.get_mut(name).expect("checked above");
            // Restores refuse u64::MAX, so a push always has a next step.
            let step = var.steps.saturating_add(1);
            let optimizer = match self.scopes.scoped(name) {
                // A scope's optimizer keeps its own rate, or follows its own schedule.
                Some((scoped, schedule)) => Self::optimizer_at(*scoped, schedule, step),
                None => scheduled_optimizer.unwrap_or_else(|| {
                    Self::optimizer_at(self.optimizer, self.schedule.as_ref(), step)
                }),
            };
            let outcome = match gradient {
                // Screened above, all gradients at once (all or nothing): not again here.
                Gradient::Dense(values) => optimizer.apply_dense_with(
                    Arc::make_mut(&mut var.values).as_mut_slice(),
                    values,
                    &mut var.slots,
                    step,
                    Screen::AlreadyDone,
                ),
                Gradient::Rows { ids, values } => {
                    let width = var.shape[1];
                    optimizer.apply_rows_with(
                        Arc::make_mut(&mut var.values).as_mut_slice(),
                        width,
                        ids,
                        values,
                        &mut var.slots,
                        step,
                        Screen::AlreadyDone,
                    )
                }
            };
            match outcome {
                Ok(UpdateOutcome::Applied) => var.steps = step,
                Ok(UpdateOutcome::SkippedNonFinite) => {}
                // check_push and the finiteness screen ran every check the kernel makes before
                // any variable changed, so this is not expected; if it happens anyway the push
                // is refused (possibly after earlier variables changed) rather than crashing
                // the server.
                Err(err) => {
                    self.counters.rejected_invalid += 1;
                    tracing::error!(
                        "push of closure {} refused after its checks passed: {err}",
                        origin.closure.0
                    );
                    return Err(err.into());
                }
            }
        }
        self.applied_closures.insert(update);
        self.counters.applied += 1;
        Ok(PushOutcome::Applied)
    }

    /// The finiteness screen of a push, over every gradient before any variable changes (all
    /// or nothing): with [`NonFinitePolicy::Skip`] a non-finite value consumes the closure
    /// unapplied (`Some`: a retry must not apply either, PS-1); with
    /// [`NonFinitePolicy::Error`] it refuses the push naming the variable and the value.
    fn screen_non_finite(
        &mut self,
        update: (ClosureId, u32),
        gradients: &[(String, Gradient<'_>)],
    ) -> Result<Option<PushOutcome>, PsError> {
        let first_non_finite = gradients.iter().find_map(|(name, g)| match g {
            Gradient::Dense(values) | Gradient::Rows { values, .. } => {
                first_non_finite(values).map(|index| (name, index, values[index]))
            }
        });
        let Some((name, index, value)) = first_non_finite else {
            return Ok(None);
        };
        match self.optimizer_for(name).non_finite_policy() {
            NonFinitePolicy::Skip => {
                // The closure is consumed: a retry of it must not apply either (PS-1).
                self.applied_closures.insert(update);
                self.counters.skipped_non_finite += 1;
                Ok(Some(PushOutcome::SkippedNonFinite))
            }
            NonFinitePolicy::Error => {
                self.counters.rejected_invalid += 1;
                Err(OptimError::NonFinite {
                    variable: name.clone(),
                    index,
                    value,
                }
                .into())
            }
        }
    }

    /// One variable shard.
    pub fn variable(&self, name: &str) -> Result<&StoredVariable, PsError> {
        self.variables
            .get(name)
            .ok_or_else(|| PsError::UnknownVariable(name.into()))
    }

    /// One variable shard as a checkpoint reads it ([`crate::roles::protocol::Snapshot`]):
    /// its shape, slot names and steps, and its blobs (the values, then every slot in the
    /// state's order, little-endian f32).
    pub fn snapshot(&self, name: &str) -> Result<(ShardState, Vec<bytes::Bytes>), PsError> {
        let var = self.variable(name)?;
        let mut blobs = vec![f32_blob(var.values())];
        let mut slots = Vec::new();
        for (slot, buffer) in var.slots().iter() {
            slots.push(slot.to_string());
            blobs.push(f32_blob(buffer));
        }
        let state = ShardState {
            shape: var.shape().iter().map(|&d| d as u64).collect(),
            slots,
            steps: var.steps(),
        };
        Ok((state, blobs))
    }

    /// Every variable shard, by name.
    pub fn variables(&self) -> impl Iterator<Item = (&str, &StoredVariable)> {
        self.variables.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The counters (PS-1, FENCE-1 evidence).
    pub fn counters(&self) -> PsCounters {
        self.counters
    }

    /// The first closure id a new closure may use without being refused here as a duplicate:
    /// one past the highest id whose update took effect here, and at least the low watermark
    /// (0 if neither). A restarted coordinator resumes its ids at or above this, so no new
    /// closure collides with an applied or finished one (PS-1 keys on closure ids).
    pub fn next_free_closure_id(&self) -> u64 {
        let applied = self
            .applied_closures
            .last()
            .map_or(0, |(c, _)| c.0.saturating_add(1));
        applied
            .max(self.pruned_next_free)
            .max(self.finished_below.0)
    }

    /// The coordinator's low watermark rose to `closure`: every closure below it is finished
    /// for good (committed, or ended with an error) and will never be dispatched again. Their
    /// ids are dropped from what PS-1 keeps, and a push of any of them is refused as a
    /// duplicate from now on. A watermark lower than one already known, or computed in a
    /// restore generation older than this server's (before a roll-back, so above the closures
    /// run again after it: LEDGER-1), changes nothing.
    pub fn handle_finished_below(&mut self, closure: ClosureId, generation: u64) {
        if generation < self.generation || closure <= self.finished_below {
            return;
        }
        self.finished_below = closure;
        let kept = self.applied_closures.split_off(&(closure, 0));
        let dropped = std::mem::replace(&mut self.applied_closures, kept);
        if let Some((last, _)) = dropped.last() {
            self.pruned_next_free = self.pruned_next_free.max(last.0.saturating_add(1));
        }
    }

    /// A parameter-server recovery's restore of `generation` starts: every push is refused
    /// from now until [`Self::handle_roll_back`] of that generation, and any push of an older
    /// generation after it (PS-1). `fences` (per worker, the newest fenced incarnation) are
    /// applied as by [`Self::handle_fence`]: a restarted server knows none (FENCE-1). `afresh`:
    /// the restore is a chief's start afresh, which writes no shard here (see
    /// [`Self::restoring_shards`]). Ignored if this server is at a newer generation already.
    pub fn handle_begin_restore(
        &mut self,
        generation: u64,
        fences: &[(u32, WorkerIncarnation)],
        afresh: bool,
    ) {
        // A begin delivered again (the same generation) changes nothing: once the roll-back
        // re-opened the server, closing it again would refuse every push of the generation.
        if generation <= self.generation {
            return;
        }
        for &(worker, incarnation) in fences {
            self.handle_fence(worker, incarnation);
        }
        self.generation = generation;
        self.restoring = true;
        self.restoring_afresh = afresh;
    }

    /// PS-1 back to a checkpoint's cut, after the coordinator restored every variable from
    /// it in restore `generation`: no closure at or above `cut` had applied then, so the ids
    /// kept as applied are dropped and the low watermark becomes `cut`, even if lower than the
    /// one known (the closures committed after the cut are run again and must apply once
    /// more), and pushes of `generation` are accepted again. Fences stay (FENCE-1), and
    /// [`Self::next_free_closure_id`] never goes down (ids above the cut were given out
    /// already). A roll-back of an older generation changes nothing.
    pub fn handle_roll_back(&mut self, cut: ClosureId, generation: u64) {
        // A roll-back delivered again after the first re-opened the server changes nothing:
        // forgetting the ids applied since would let a closure apply twice (PS-1).
        if generation < self.generation || (generation == self.generation && !self.restoring) {
            return;
        }
        self.pruned_next_free = self.next_free_closure_id();
        self.applied_closures.clear();
        self.finished_below = cut;
        self.generation = generation;
        self.restoring = false;
    }

    /// The restore generation this server is at, and whether its restore is under way.
    pub fn generation(&self) -> (u64, bool) {
        (self.generation, self.restoring)
    }

    /// Whether a restore that writes a checkpoint's shards began here and was not rolled back:
    /// what this server holds may be that checkpoint's, restored part way, so a new chief
    /// without the checkpoint must not start afresh over it. A chief's start afresh that was
    /// cut short (a server lost while it fenced them) left nothing of a checkpoint here: its
    /// restore is under way, but this says no, and the next chief may start afresh again.
    pub fn restoring_shards(&self) -> bool {
        self.restoring && !self.restoring_afresh
    }

    /// The low watermark known here (see [`Self::handle_finished_below`]).
    pub fn finished_below(&self) -> ClosureId {
        self.finished_below
    }

    /// How many updates are kept for PS-1 (those applied at or above the low watermark: one
    /// per closure, or one per part of a closure of several steps).
    pub fn applied_ids_held(&self) -> usize {
        self.applied_closures.len()
    }

    /// The default optimizer applied here (see [`Self::optimizer_for`]).
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    fn check_push(&self, gradients: &[(String, Gradient<'_>)]) -> Result<(), PsError> {
        for (name, gradient) in gradients {
            let var = self.variable(name)?;
            match gradient {
                Gradient::Dense(values) => {
                    if values.len() != var.values.len() {
                        return Err(OptimError::GradientLength {
                            variable: name.clone(),
                            expected: var.values.len(),
                            got: values.len(),
                        }
                        .into());
                    }
                }
                Gradient::Rows { ids, values } => {
                    let width = var.row_width(name)?;
                    if ids.len().checked_mul(width) != Some(values.len()) {
                        return Err(OptimError::RowGradientLength {
                            variable: name.clone(),
                            rows: ids.len(),
                            row_width: width,
                            got: values.len(),
                        }
                        .into());
                    }
                    let rows = var.shape[0];
                    if let Some(&row) = ids
                        .iter()
                        .find(|&&id| usize::try_from(id).map_or(true, |r| r >= rows))
                    {
                        return Err(PsError::RowOutOfRange {
                            name: name.clone(),
                            row,
                            rows,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Copies rows `ids` of the `W`-wide table `values` into `out`, in order.
fn gather_rows<const W: usize>(values: &[f32], ids: &[u64], out: &mut [f32]) {
    for (dst, &id) in out.chunks_exact_mut(W).zip(ids) {
        let start = id as usize * W;
        // Both sides are W long, a constant: the copy compiles to a few vector moves.
        dst.copy_from_slice(&values[start..start + W]);
    }
}

/// Most values one pull reply may carry (128 MiB of f32: the gateway's payload bound).
pub const PULL_ELEMENTS_MAX: usize = 32 << 20;

/// The values of a new shard per its [`InitSpec`]. Random initializers draw from their seed
/// for this shard alone, so the same layout and seeds always give the same bits (DATA-1).
pub fn initial_values(name: &str, shape: &[usize], init: &InitSpec) -> Result<Vec<f32>, PsRefusal> {
    let len: usize = shape.iter().product();
    let refuse = |problem| PsRefusal::Initializer {
        name: name.into(),
        problem,
    };
    match init {
        InitSpec::Values(bytes) => {
            let values = bytes_to_f32(bytes, name)?;
            if values.len() != len {
                return Err(PsError::InitialValueLength {
                    name: name.into(),
                    shape: shape.to_vec(),
                    expected: len,
                    got: values.len(),
                }
                .into());
            }
            Ok(values)
        }
        InitSpec::GlorotUniform {
            seed,
            fan_in,
            fan_out,
        } => {
            let fans = fan_in.saturating_add((*fan_out).max(1)).max(1);
            let limit = (6.0 / fans as f64).sqrt() as f32;
            draw(
                Initializer::RandomUniform {
                    min: -limit,
                    max: limit,
                    seed: *seed,
                },
                shape,
            )
            .map_err(refuse)
        }
        InitSpec::Zeros => draw(Initializer::Zeros, shape).map_err(refuse),
        InitSpec::Constant(c) if !c.is_finite() => Err(refuse(InitProblem::NonFiniteConstant(*c))),
        InitSpec::Constant(c) => draw(Initializer::Constant(*c), shape).map_err(refuse),
        InitSpec::Uniform { min, max, seed } => {
            if !(min.is_finite() && max.is_finite() && min <= max) {
                return Err(refuse(InitProblem::BadUniformRange {
                    min: *min,
                    max: *max,
                }));
            }
            draw(
                Initializer::RandomUniform {
                    min: *min,
                    max: *max,
                    seed: *seed,
                },
                shape,
            )
            .map_err(refuse)
        }
    }
}

fn draw(init: Initializer, shape: &[usize]) -> Result<Vec<f32>, InitProblem> {
    init.init(shape)
        .and_then(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
        .map_err(|e| InitProblem::Draw(e.to_string()))
}

/// A shard shape from the wire, refused when any dimension or the element count is beyond
/// [`ELEMENTS_MAX`].
pub(crate) fn shape_of(shape: &[u64]) -> Result<Vec<usize>, PsRefusal> {
    let too_large = || PsRefusal::ShapeTooLarge {
        shape: shape.to_vec(),
        elements_max: ELEMENTS_MAX as u64,
    };
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| too_large()))
        .collect::<Result<_, _>>()?;
    match dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) {
        Some(n) if n <= ELEMENTS_MAX => Ok(dims),
        _ => Err(too_large()),
    }
}

/// Largest shard a parameter server accepts (4 GiB of f32).
pub const ELEMENTS_MAX: usize = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roles::push::LearningRate;

    fn origin(worker: u32, incarnation: u64, closure: u64, attempt: u32) -> PushOrigin {
        PushOrigin {
            worker,
            incarnation,
            closure: ClosureId(closure),
            attempt,
            part: 0,
            generation: 0,
            learning_rate: None,
            server: 0,
        }
    }

    fn store() -> ParameterStore {
        let mut ps = ParameterStore::new(Optimizer::sgd(0.5)).unwrap();
        ps.handle_create("w", vec![2], vec![1.0, 1.0]).unwrap();
        ps.handle_create("emb", vec![3, 2], vec![0.0; 6]).unwrap();
        ps
    }

    /// PS-1 for a closure of several steps: each part applies once; an attempt run again
    /// after a failure has the parts applied already refused and applies the rest; the
    /// watermark drops every part of a finished closure, and the next free id is past it.
    #[test]
    fn each_part_of_a_closure_applies_once() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        let part = |worker, attempt, part| PushOrigin {
            part,
            ..origin(worker, 1, 7, attempt)
        };
        assert_eq!(
            ps.handle_push(part(0, 1, 0), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(
            ps.handle_push(part(0, 1, 1), &grads).unwrap(),
            PushOutcome::Applied
        );
        // Attempt 1 died after part 1; attempt 2 runs on worker 1.
        assert_eq!(
            ps.handle_push(part(1, 2, 0), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(
            ps.handle_push(part(1, 2, 1), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(
            ps.handle_push(part(1, 2, 2), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(ps.counters().applied, 3);
        assert_eq!(ps.counters().rejected_duplicate, 2);
        // 1.0 - 3 × 0.5 × 1.0
        assert_eq!(ps.pull("w").unwrap(), &[-0.5, -0.5]);
        assert_eq!(ps.applied_ids_held(), 3);
        assert_eq!(ps.next_free_closure_id(), 8);
        ps.handle_finished_below(ClosureId(8), 0);
        assert_eq!(ps.applied_ids_held(), 0);
        assert_eq!(
            ps.handle_push(part(0, 3, 3), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(ps.next_free_closure_id(), 8);
    }

    #[test]
    fn an_assignment_sets_the_values_and_keeps_slots_and_steps() {
        let mut ps = ParameterStore::new(Optimizer::adam(0.1)).unwrap();
        ps.handle_create("w", vec![2], vec![1.0, 1.0]).unwrap();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        ps.handle_push(origin(0, 1, 1, 1), &grads).unwrap();
        let held = |ps: &ParameterStore| {
            let (_, var) = ps.variables().find(|(name, _)| *name == "w").unwrap();
            (format!("{:?}", var.slots), var.steps)
        };
        let before = held(&ps);
        ps.handle_assign("w", vec![5.0, 6.0]).unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[5.0, 6.0]);
        assert_eq!(held(&ps), before);
        assert_eq!(before.1, 1);
        // Refused, nothing changed: an unknown name, another length, a restore under way.
        assert!(matches!(
            ps.handle_assign("v", vec![0.0]),
            Err(PsError::UnknownVariable(_))
        ));
        assert!(matches!(
            ps.handle_assign("w", vec![0.0; 3]),
            Err(PsError::AssignLength {
                expected: 2,
                got: 3,
                ..
            })
        ));
        ps.handle_begin_restore(1, &[], false);
        assert!(matches!(
            ps.handle_assign("w", vec![0.0; 2]),
            Err(PsError::AssignDuringRestore { .. })
        ));
        assert_eq!(ps.pull("w").unwrap(), &[5.0, 6.0]);
    }

    /// A closure's rate (the chief's `set_learning_rate`) replaces the server's schedule for
    /// its update; a push without one goes back to the schedule, which counted every update.
    #[test]
    fn a_closures_learning_rate_replaces_the_servers_own() {
        let schedule = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![1],
            values: vec![1.0, 0.1],
        };
        let mut ps = ParameterStore::new(Optimizer::sgd(0.5))
            .unwrap()
            .with_schedule(schedule)
            .unwrap();
        ps.handle_create("w", vec![1], vec![0.0]).unwrap();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0].into()))];
        let at = |closure, rate: Option<f32>| PushOrigin {
            learning_rate: rate.and_then(LearningRate::new),
            ..origin(0, 1, closure, 1)
        };
        // Update 1 at the closure's 0.25, update 2 at 0 (nothing moves), update 3 at the
        // schedule's rate for step 3 (0.1).
        ps.handle_push(at(1, Some(0.25)), &grads).unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[-0.25]);
        ps.handle_push(at(2, Some(0.0)), &grads).unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[-0.25]);
        ps.handle_push(at(3, None), &grads).unwrap();
        assert!(
            (ps.pull("w").unwrap()[0] + 0.35).abs() < 1e-6,
            "{:?}",
            ps.pull("w")
        );
        assert_eq!(ps.counters().applied, 3);
        assert!(LearningRate::new(f32::NAN).is_none());
        assert!(LearningRate::new(-1.0).is_none());
    }

    /// A variable in a scope given its own optimizer is updated by it, with its slots and at
    /// its own rate (the closure's rate and the schedule are the default optimizer's); a
    /// restore of slots another optimizer made is refused naming the variable; a bad scope
    /// fails the store's making, naming the scope.
    #[test]
    fn a_scope_s_variables_take_its_optimizer_slots_and_rate() {
        let schedule = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![1],
            values: vec![1.0, 0.1],
        };
        let adagrad = Optimizer::adagrad(0.1);
        let mut ps = ParameterStore::new(Optimizer::sgd(0.5))
            .unwrap()
            .with_schedule(schedule)
            .unwrap()
            .with_optimizer_scopes(OptimizerScopes::new().with("emb", adagrad))
            .unwrap();
        ps.handle_create("w", vec![2], vec![1.0, 1.0]).unwrap();
        ps.handle_create("emb/part_0", vec![2, 2], vec![1.0; 4])
            .unwrap();
        let slot_names = |ps: &ParameterStore, name: &str| -> Vec<String> {
            let var = ps.variable(name).unwrap();
            var.slots().iter().map(|(n, _)| n.to_string()).collect()
        };
        assert_eq!(slot_names(&ps, "w"), Vec::<String>::new());
        assert_eq!(slot_names(&ps, "emb/part_0"), ["accumulator"]);
        // Adagrad's own kernel on a copy: what the scope's variable must become.
        let mut expected = vec![1.0f32; 4];
        let mut slots = adagrad.new_slots("emb/part_0", 4);
        let grads = vec![
            ("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into())),
            (
                "emb/part_0".to_string(),
                Gradient::Dense(vec![0.5, -0.5, 1.0, 2.0].into()),
            ),
        ];
        // Update 1 at the closure's rate 0.25 (the default optimizer's variable only).
        let at_rate = PushOrigin {
            learning_rate: LearningRate::new(0.25),
            ..origin(0, 1, 1, 1)
        };
        ps.handle_push(at_rate, &grads).unwrap();
        adagrad
            .apply_dense(&mut expected, &[0.5, -0.5, 1.0, 2.0], &mut slots, 1)
            .unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[0.75, 0.75]);
        assert_eq!(ps.pull("emb/part_0").unwrap(), expected.as_slice());
        // Update 2 by the schedule (1.0 at step 1) for the default's, Adagrad's 0.1 for the
        // scope's.
        ps.handle_push(origin(0, 1, 2, 1), &grads).unwrap();
        adagrad
            .apply_dense(&mut expected, &[0.5, -0.5, 1.0, 2.0], &mut slots, 2)
            .unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[-0.25, -0.25]);
        assert_eq!(ps.pull("emb/part_0").unwrap(), expected.as_slice());
        // Adam's slots do not restore an Adagrad variable, nor Adagrad's the default's SGD one.
        let adam_slots = vec![("m", vec![0.0; 4]), ("v", vec![0.0; 4])];
        let err = Slots::restore(
            ps.optimizer_for("emb/part_0"),
            "emb/part_0",
            4,
            adam_slots,
            0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("emb/part_0"), "{err}");
        let accumulator = vec![("accumulator", vec![0.1; 2])];
        assert!(Slots::restore(ps.optimizer_for("w"), "w", 2, accumulator, 0).is_err());
        // A restore (a server restarted, or the chief's checkpoint) takes each variable's
        // slots by its own optimizer: the scope's Adagrad slots restore its variable, and a
        // variable restored with slots its optimizer does not keep is refused, nothing changed.
        let exported = ps.variable("emb/part_0").unwrap().slots().clone();
        ps.handle_begin_restore(1, &[], false);
        ps.handle_restore("emb/part_0", vec![2, 2], vec![0.5; 4], exported, 2)
            .unwrap();
        assert_eq!(ps.pull("emb/part_0").unwrap(), &[0.5; 4]);
        let adam_slots = Optimizer::adam(0.1).new_slots("emb/part_0", 4);
        let refused = ps.handle_restore("emb/part_0", vec![2, 2], vec![9.0; 4], adam_slots, 3);
        assert!(
            matches!(refused, Err(PsError::SlotsMismatch { .. })),
            "{refused:?}"
        );
        assert_eq!(ps.pull("emb/part_0").unwrap(), &[0.5; 4]);
        // A bad scope or scope optimizer is named.
        for (scopes, named) in [
            (OptimizerScopes::new().with("emb/", adagrad), "\"emb/\""),
            (
                OptimizerScopes::new().with("deep", Optimizer::adam(-1.0)),
                "\"deep\"",
            ),
        ] {
            let err = ParameterStore::new(Optimizer::sgd(0.5))
                .unwrap()
                .with_optimizer_scopes(scopes)
                .unwrap_err();
            assert!(matches!(err, PsError::OptimizerScope { .. }), "{err}");
            assert!(err.to_string().contains(named), "{err}");
        }
    }

    /// A scope's own schedule sets its variables' rate by their own update count, beside the
    /// default optimizer's schedule and a closure's rate (which stay the default's), and goes
    /// on from a restored variable's count.
    #[test]
    fn a_scope_s_schedule_sets_its_variables_rate_by_their_update_count() {
        let default_schedule = LearningRateSchedule::Constant(0.5);
        let scope_schedule = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![0, 1],
            values: vec![1.0, 0.5, 0.25],
        };
        let mut ps = ParameterStore::new(Optimizer::sgd(9.0))
            .unwrap()
            .with_schedule(default_schedule)
            .unwrap()
            .with_optimizer_scopes(OptimizerScopes::new().with_schedule(
                "wide",
                Optimizer::sgd(9.0),
                scope_schedule,
            ))
            .unwrap();
        ps.handle_create("deep", vec![1], vec![0.0]).unwrap();
        ps.handle_create("wide/part_0", vec![1], vec![0.0]).unwrap();
        let grads = vec![
            ("deep".to_string(), Gradient::Dense(vec![1.0].into())),
            ("wide/part_0".to_string(), Gradient::Dense(vec![1.0].into())),
        ];
        // Update 1 at the closure's rate 0.125: the default's variable alone takes it; the
        // scope's takes its schedule's rate at step 0 (1.0).
        let at_rate = PushOrigin {
            learning_rate: LearningRate::new(0.125),
            ..origin(0, 1, 1, 1)
        };
        ps.handle_push(at_rate, &grads).unwrap();
        assert_eq!(ps.pull("deep").unwrap(), &[-0.125]);
        assert_eq!(ps.pull("wide/part_0").unwrap(), &[-1.0]);
        // Updates 2 and 3: 0.5 then 0.25 for the scope's, 0.5 each for the default's.
        ps.handle_push(origin(0, 1, 2, 1), &grads).unwrap();
        ps.handle_push(origin(0, 1, 3, 1), &grads).unwrap();
        assert_eq!(ps.pull("deep").unwrap(), &[-1.125]);
        assert_eq!(ps.pull("wide/part_0").unwrap(), &[-1.75]);
        // Restored at update count 1, the scope's variable goes on at the rate of step 1.
        ps.handle_begin_restore(1, &[], false);
        let slots = Optimizer::sgd(9.0).new_slots("wide/part_0", 1);
        ps.handle_restore("wide/part_0", vec![1], vec![0.0], slots, 1)
            .unwrap();
        ps.handle_roll_back(ClosureId(3), 1);
        ps.handle_push(origin_in(0, 1, 4, 1), &grads[1..]).unwrap();
        assert_eq!(ps.pull("wide/part_0").unwrap(), &[-0.5]);
        // A schedule that cannot give a rate is refused, naming the scope.
        let growing = LearningRateSchedule::ExponentialDecay {
            initial: 0.1,
            decay_steps: 10,
            decay_rate: f32::INFINITY,
            staircase: false,
        };
        let err = ParameterStore::new(Optimizer::sgd(0.5))
            .unwrap()
            .with_optimizer_scopes(OptimizerScopes::new().with_schedule(
                "wide",
                Optimizer::sgd(0.5),
                growing,
            ))
            .unwrap_err();
        assert!(err.to_string().contains("\"wide\""), "{err}");
    }

    #[test]
    fn a_schedule_sets_each_updates_rate_by_the_variables_step_count() {
        // 1.0 for updates 1 and 2 (steps 0 and 1, up to the boundary), then 0.1.
        let schedule = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![1],
            values: vec![1.0, 0.1],
        };
        let mut ps = ParameterStore::new(Optimizer::sgd(0.5))
            .unwrap()
            .with_schedule(schedule)
            .unwrap();
        ps.handle_create("w", vec![1], vec![0.0]).unwrap();
        ps.handle_create("emb", vec![2, 1], vec![0.0; 2]).unwrap();
        for closure in 1..=3 {
            let grads = vec![
                ("w".to_string(), Gradient::Dense(vec![1.0].into())),
                (
                    "emb".to_string(),
                    Gradient::Rows {
                        ids: vec![1].into(),
                        values: vec![1.0].into(),
                    },
                ),
            ];
            ps.handle_push(origin(0, 1, closure, 1), &grads).unwrap();
        }
        let close =
            |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6);
        assert!(close(ps.pull("w").unwrap(), &[-2.1]), "{:?}", ps.pull("w"));
        assert!(
            close(ps.pull("emb").unwrap(), &[0.0, -2.1]),
            "{:?}",
            ps.pull("emb")
        );
        // A schedule that cannot give a rate is refused, naming why.
        let growing = LearningRateSchedule::ExponentialDecay {
            initial: 0.1,
            decay_steps: 10,
            decay_rate: 2.0,
            staircase: false,
        };
        let refused = ParameterStore::new(Optimizer::sgd(0.5))
            .unwrap()
            .with_schedule(growing)
            .unwrap_err();
        assert!(
            refused.to_string().contains("learning-rate schedule"),
            "{refused}"
        );
    }

    #[test]
    fn ps_1_a_closure_applies_at_most_once() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 2.0].into()))];
        assert_eq!(
            ps.handle_push(origin(0, 1, 7, 1), &grads).unwrap(),
            PushOutcome::Applied
        );
        // The re-dispatched attempt on another worker pushes again: refused.
        assert_eq!(
            ps.handle_push(origin(1, 1, 7, 2), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(ps.pull("w").unwrap(), &[0.5, 0.0]);
        assert_eq!(ps.counters().applied, 1);
        assert_eq!(ps.counters().rejected_duplicate, 1);
        assert_eq!(ps.next_free_closure_id(), 8);
    }

    #[test]
    fn fence_1_fenced_incarnation_changes_nothing() {
        let mut ps = store();
        ps.handle_fence(0, 1);
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 2.0].into()))];
        assert_eq!(
            ps.handle_push(origin(0, 1, 7, 1), &grads).unwrap(),
            PushOutcome::Fenced
        );
        assert_eq!(ps.pull("w").unwrap(), &[1.0, 1.0]);
        // The worker's next incarnation is accepted.
        assert_eq!(
            ps.handle_push(origin(0, 2, 7, 2), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(ps.counters().rejected_stale, 1);
    }

    #[test]
    fn push_is_all_or_nothing_and_names_the_variable() {
        let mut ps = store();
        let grads = vec![
            ("w".to_string(), Gradient::Dense(vec![1.0, 2.0].into())),
            ("emb".to_string(), Gradient::Dense(vec![1.0].into())),
        ];
        let err = ps.handle_push(origin(0, 1, 1, 1), &grads).unwrap_err();
        assert!(err.to_string().contains("emb"), "{err}");
        assert_eq!(ps.pull("w").unwrap(), &[1.0, 1.0]);
        let grads = vec![(
            "emb".to_string(),
            Gradient::Rows {
                ids: vec![3].into(),
                values: vec![1.0, 1.0].into(),
            },
        )];
        assert!(matches!(
            ps.handle_push(origin(0, 1, 2, 1), &grads),
            Err(PsError::RowOutOfRange { row: 3, .. })
        ));
        let grads = vec![("nope".to_string(), Gradient::Dense(vec![].into()))];
        assert_eq!(
            ps.handle_push(origin(0, 1, 3, 1), &grads),
            Err(PsError::UnknownVariable("nope".into()))
        );
        assert_eq!(ps.counters().rejected_invalid, 3);
        assert_eq!(ps.counters().applied, 0);
    }

    #[test]
    fn non_finite_gradient_is_skipped_and_counted_by_default() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![f32::NAN, 1.0].into()))];
        assert_eq!(
            ps.handle_push(origin(0, 1, 1, 1), &grads).unwrap(),
            PushOutcome::SkippedNonFinite
        );
        assert_eq!(ps.pull("w").unwrap(), &[1.0, 1.0]);
        assert_eq!(ps.counters().skipped_non_finite, 1);
    }

    #[test]
    fn sparse_rows_pull_and_push_touch_only_their_rows() {
        let mut ps = store();
        let grads = vec![(
            "emb".to_string(),
            Gradient::Rows {
                ids: vec![2, 0, 2].into(),
                values: vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0].into(),
            },
        )];
        assert_eq!(
            ps.handle_push(origin(0, 1, 1, 1), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(
            ps.pull_rows("emb", &[0, 1, 2]).unwrap(),
            vec![-1.0, -1.0, 0.0, 0.0, -1.0, -1.0]
        );
        assert!(matches!(
            ps.pull_rows("w", &[0]),
            Err(PsError::NotRowShaped { .. })
        ));
        assert!(matches!(
            ps.pull_rows("emb", &[9]),
            Err(PsError::RowOutOfRange { .. })
        ));
    }

    #[test]
    fn hostile_requests_are_refused_not_panicked_on() {
        let mut ps = store();
        ps.handle_create("flat", vec![4, 0], vec![]).unwrap();
        let grads = vec![(
            "flat".to_string(),
            Gradient::Rows {
                ids: vec![0].into(),
                values: vec![].into(),
            },
        )];
        assert!(matches!(
            ps.handle_push(origin(0, 1, 1, 1), &grads),
            Err(PsError::NotRowShaped { .. })
        ));
        let width = 1 << 20;
        ps.handle_create("wide", vec![1, width], vec![0.0; width])
            .unwrap();
        let ids = vec![0u64; PULL_ELEMENTS_MAX / width + 1];
        assert!(matches!(
            ps.pull_rows("wide", &ids),
            Err(PsError::TooLarge { .. })
        ));
        let slots = ps.optimizer().new_slots("w", 2);
        let err = ps
            .handle_restore("w", vec![2], vec![0.0; 2], slots.clone(), 0)
            .unwrap_err();
        assert!(matches!(err, PsError::NotRestoring { .. }), "{err}");
        ps.handle_begin_restore(1, &[], false);
        let err = ps
            .handle_restore("w", vec![2], vec![0.0; 2], slots, u64::MAX)
            .unwrap_err();
        assert!(matches!(err, PsError::BadStepCount { .. }), "{err}");
    }

    #[test]
    fn create_is_idempotent_for_the_same_shape_and_replaces_another() {
        let mut ps = store();
        ps.handle_create("w", vec![2], vec![9.0, 9.0]).unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[1.0, 1.0]);
        // A restarted chief placing the variable again (servers joined or left).
        ps.handle_create("w", vec![3], vec![5.0; 3]).unwrap();
        assert_eq!(ps.pull("w").unwrap(), &[5.0; 3]);
        assert!(matches!(
            ps.handle_create("x", vec![2, 2], vec![0.0; 3]),
            Err(PsError::InitialValueLength { .. })
        ));
    }

    #[test]
    fn ps_1_finished_below_drops_kept_ids_and_refuses_late_pushes() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![0.0, 0.0].into()))];
        for c in 0..10 {
            assert_eq!(
                ps.handle_push(origin(0, 1, c, 1), &grads).unwrap(),
                PushOutcome::Applied
            );
        }
        assert_eq!(ps.applied_ids_held(), 10);
        ps.handle_finished_below(ClosureId(5), 0);
        assert_eq!(ps.applied_ids_held(), 5);
        // A late retry of a finished closure, kept id or dropped one: a duplicate either way.
        for c in [3, 7] {
            assert_eq!(
                ps.handle_push(origin(1, 1, c, 2), &grads).unwrap(),
                PushOutcome::Duplicate
            );
        }
        // A closure below the watermark that never pushed here is finished too.
        ps.handle_finished_below(ClosureId(14), 0);
        assert_eq!(
            ps.handle_push(origin(1, 1, 12, 1), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(ps.applied_ids_held(), 0);
        // New ids start at the watermark, past every applied id.
        assert_eq!(ps.next_free_closure_id(), 14);
        assert_eq!(
            ps.handle_push(origin(1, 1, 14, 1), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(ps.next_free_closure_id(), 15);
        // A watermark lower than the one known changes nothing.
        ps.handle_finished_below(ClosureId(2), 0);
        assert_eq!(ps.finished_below(), ClosureId(14));
        assert_eq!(ps.applied_ids_held(), 1);
        let c = ps.counters();
        assert_eq!((c.applied, c.rejected_duplicate), (11, 3));
    }

    #[test]
    fn next_free_closure_id_survives_pruning() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![0.0, 0.0].into()))];
        ps.handle_push(origin(0, 1, 41, 1), &grads).unwrap();
        // The coordinator's watermark can pass the highest applied id only by one or more.
        ps.handle_finished_below(ClosureId(42), 0);
        assert_eq!(ps.applied_ids_held(), 0);
        assert_eq!(ps.next_free_closure_id(), 42);
    }

    /// PS-1 across a server's restart that a restarted chief did not see: a push computed for
    /// an older process of this server is refused, whatever its restore generation; one
    /// naming this process, or none, is taken.
    #[test]
    fn ps_1_a_push_named_for_an_older_process_of_this_server_is_stale() {
        let mut ps = store().with_incarnation(3);
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        let named = |server, closure| PushOrigin {
            server,
            ..origin(0, 1, closure, 1)
        };
        assert_eq!(ps.handle_push(named(2, 7), &grads), Ok(PushOutcome::Stale));
        assert_eq!(ps.applied_ids_held(), 0);
        assert_eq!(
            ps.handle_push(named(3, 7), &grads),
            Ok(PushOutcome::Applied)
        );
        assert_eq!(
            ps.handle_push(named(0, 8), &grads),
            Ok(PushOutcome::Applied)
        );
    }

    fn origin_in(worker: u32, incarnation: u64, closure: u64, generation: u64) -> PushOrigin {
        PushOrigin {
            generation,
            ..origin(worker, incarnation, closure, 1)
        }
    }

    /// LEDGER-1/PS-1: a watermark computed before a roll-back (above the cut) must not make
    /// the server refuse the closures run again after it.
    #[test]
    fn ledger_1_a_watermark_from_before_the_roll_back_is_ignored() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![0.0, 0.0].into()))];
        for c in 0..5 {
            ps.handle_push(origin(0, 1, c, 1), &grads).unwrap();
        }
        ps.handle_begin_restore(1, &[], false);
        // Sent before the restore began, arrives during it: ignored (older generation).
        ps.handle_finished_below(ClosureId(5), 0);
        ps.handle_roll_back(ClosureId(2), 1);
        assert_eq!(ps.finished_below(), ClosureId(2));
        // Sent before the restore, arrives after the roll-back: ignored too.
        ps.handle_finished_below(ClosureId(5), 0);
        assert_eq!(ps.finished_below(), ClosureId(2));
        for c in 2..5 {
            assert_eq!(
                ps.handle_push(origin_in(1, 1, c, 1), &grads).unwrap(),
                PushOutcome::Applied,
                "closure {c} run again after the roll-back"
            );
        }
        // A watermark of the current generation is taken.
        ps.handle_finished_below(ClosureId(5), 1);
        assert_eq!(ps.finished_below(), ClosureId(5));
        assert_eq!(ps.applied_ids_held(), 0);
    }

    /// A chief's start afresh closes the server to pushes as any restore does, but writes no
    /// checkpoint's shard: cut short (a server lost while the chief fenced them), it leaves
    /// nothing a later chief must take for a checkpoint restored part way. A checkpoint's
    /// restore under way does, until its roll-back.
    #[test]
    fn a_start_afresh_under_way_holds_no_checkpoints_shards() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        ps.handle_begin_restore(1, &[], true);
        assert_eq!(ps.generation(), (1, true));
        assert!(!ps.restoring_shards());
        assert_eq!(
            ps.handle_push(origin_in(0, 1, 0, 1), &grads).unwrap(),
            PushOutcome::Stale,
            "a start afresh under way refuses pushes"
        );
        ps.handle_begin_restore(2, &[], false);
        assert!(ps.restoring_shards());
        ps.handle_roll_back(ClosureId(0), 2);
        assert_eq!(ps.generation(), (2, false));
        assert!(!ps.restoring_shards());
        // A start afresh after a checkpoint's restore says so again.
        ps.handle_begin_restore(3, &[], true);
        assert!(!ps.restoring_shards());
    }

    /// PS-1 across a restore: nothing applies between the begin of a restore and its
    /// roll-back, and a push sent before the restore (older generation) never applies after
    /// it, though its closure's id was forgotten by the roll-back.
    #[test]
    fn ps_1_pushes_during_a_restore_or_from_an_older_generation_are_refused() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        assert_eq!(
            ps.handle_push(origin_in(0, 1, 3, 0), &grads).unwrap(),
            PushOutcome::Applied
        );
        ps.handle_begin_restore(1, &[], false);
        assert_eq!(ps.generation(), (1, true));
        for generation in [0, 1] {
            assert_eq!(
                ps.handle_push(origin_in(0, 1, 4, generation), &grads)
                    .unwrap(),
                PushOutcome::Stale,
                "generation {generation} while restoring"
            );
        }
        let slots = ps.optimizer().new_slots("w", 2);
        ps.handle_restore("w", vec![2], vec![1.0, 1.0], slots, 0)
            .unwrap();
        // Older generations change nothing.
        ps.handle_begin_restore(0, &[], false);
        ps.handle_roll_back(ClosureId(0), 0);
        assert_eq!(ps.generation(), (1, true));
        ps.handle_roll_back(ClosureId(3), 1);
        assert_eq!(ps.generation(), (1, false));
        // The push of closure 3 from before the restore arrives late: refused, although the
        // roll-back forgot that closure 3 had applied.
        assert_eq!(
            ps.handle_push(origin_in(0, 1, 3, 0), &grads).unwrap(),
            PushOutcome::Stale
        );
        assert_eq!(ps.pull("w").unwrap(), &[1.0, 1.0]);
        // Its re-run in the new generation applies once.
        assert_eq!(
            ps.handle_push(origin_in(1, 1, 3, 1), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(
            ps.handle_push(origin_in(1, 1, 3, 1), &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(ps.pull("w").unwrap(), &[0.5, 0.5]);
        let c = ps.counters();
        assert_eq!((c.rejected_old_generation, c.rejected_stale), (3, 3));
    }

    /// FENCE-1: a restarted server learns the fenced incarnations when its restore begins.
    #[test]
    fn fence_1_a_restored_server_knows_the_fences() {
        let mut ps = ParameterStore::new(Optimizer::sgd(0.5)).unwrap();
        ps.handle_begin_restore(2, &[(0, 3), (1, 1)], false);
        let slots = ps.optimizer().new_slots("w", 2);
        ps.handle_restore("w", vec![2], vec![1.0, 1.0], slots, 0)
            .unwrap();
        ps.handle_roll_back(ClosureId(10), 2);
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        for (worker, incarnation) in [(0, 3), (0, 2), (1, 1)] {
            assert_eq!(
                ps.handle_push(origin_in(worker, incarnation, 10, 2), &grads)
                    .unwrap(),
                PushOutcome::Fenced,
                "worker/{worker} incarnation {incarnation} is fenced"
            );
        }
        assert_eq!(
            ps.handle_push(origin_in(0, 4, 10, 2), &grads).unwrap(),
            PushOutcome::Applied
        );
        assert_eq!(ps.counters().rejected_old_generation, 0);
    }

    /// A roll-back never lowers the first free closure id: ids above the cut were given out.
    #[test]
    fn a_roll_back_never_lowers_the_next_free_closure_id() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![0.0, 0.0].into()))];
        ps.handle_push(origin(0, 1, 7, 1), &grads).unwrap();
        ps.handle_finished_below(ClosureId(9), 0);
        assert_eq!(ps.next_free_closure_id(), 9);
        ps.handle_begin_restore(1, &[], false);
        ps.handle_roll_back(ClosureId(4), 1);
        assert_eq!(ps.finished_below(), ClosureId(4));
        assert_eq!(ps.next_free_closure_id(), 9);
    }

    /// PS-1 with restore messages delivered again (found by the cluster simulator): a
    /// roll-back, a begin or a variable restore of the current generation arriving after the
    /// roll-back re-opened the server changes nothing, so a closure re-run after the restore
    /// applies once and keeps its effect.
    #[test]
    fn ps_1_restore_messages_delivered_again_change_nothing() {
        let mut ps = store();
        let grads = vec![("w".to_string(), Gradient::Dense(vec![1.0, 1.0].into()))];
        ps.handle_begin_restore(1, &[], false);
        let slots = ps.optimizer().new_slots("w", 2);
        ps.handle_restore("w", vec![2], vec![0.0, 0.0], slots.clone(), 0)
            .unwrap();
        ps.handle_roll_back(ClosureId(3), 1);
        let rerun = origin_in(0, 2, 3, 1);
        assert_eq!(ps.handle_push(rerun, &grads).unwrap(), PushOutcome::Applied);
        let after = ps.pull("w").unwrap().to_vec();
        // The same roll-back, begin and restore again.
        ps.handle_roll_back(ClosureId(3), 1);
        ps.handle_begin_restore(1, &[], false);
        assert!(matches!(
            ps.handle_restore("w", vec![2], vec![0.0, 0.0], slots, 0),
            Err(PsError::NotRestoring { .. })
        ));
        assert_eq!(ps.generation(), (1, false));
        assert_eq!(
            ps.handle_push(rerun, &grads).unwrap(),
            PushOutcome::Duplicate
        );
        assert_eq!(ps.pull("w").unwrap(), after.as_slice());
    }

    /// PS-1 over random interleavings of pushes (first attempts, re-dispatched attempts, late
    /// retries of finished closures) and watermarks a coordinator could send: no closure is
    /// applied twice, no unfinished closure's first push is refused, and the ids kept never
    /// exceed the applied closures that are still unfinished.
    #[test]
    fn ps_1_holds_with_watermarks_over_random_orders() {
        use rand::{Rng, SeedableRng};
        let grads = vec![("w".to_string(), Gradient::Dense(vec![0.0, 0.0].into()))];
        for seed in 0..200u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut ps = store();
            let mut next = 0u64;
            // Unfinished closures, and whether their update took effect here.
            let mut unfinished: BTreeMap<u64, bool> = BTreeMap::new();
            let mut applied_count: BTreeMap<u64, u32> = BTreeMap::new();
            for _ in 0..300 {
                match rng.gen_range(0..5) {
                    0 => {
                        unfinished.insert(next, false);
                        next += 1;
                    }
                    1 | 2 if next > 0 => {
                        let c = rng.gen_range(0..next);
                        let attempt = rng.gen_range(1..4);
                        let outcome = ps.handle_push(origin(0, 1, c, attempt), &grads).unwrap();
                        if outcome == PushOutcome::Applied {
                            *applied_count.entry(c).or_default() += 1;
                            if let Some(done) = unfinished.get_mut(&c) {
                                *done = true;
                            }
                        }
                        if unfinished.get(&c) == Some(&false) {
                            panic!("seed {seed}: first push of unfinished closure {c} refused");
                        }
                    }
                    3 if !unfinished.is_empty() => {
                        // Commit (or cancel) one unfinished closure.
                        let keys: Vec<u64> = unfinished.keys().copied().collect();
                        let c = keys[rng.gen_range(0..keys.len())];
                        unfinished.remove(&c);
                    }
                    _ => {
                        let watermark = unfinished.keys().next().copied().unwrap_or(next);
                        ps.handle_finished_below(ClosureId(watermark), 0);
                        let live_applied = unfinished.values().filter(|a| **a).count();
                        let above = applied_count.keys().filter(|c| **c >= watermark).count();
                        assert!(ps.applied_ids_held() <= above, "seed {seed}");
                        assert!(live_applied <= ps.applied_ids_held(), "seed {seed}");
                    }
                }
                assert!(
                    applied_count.values().all(|n| *n == 1),
                    "seed {seed}: PS-1 broken: {applied_count:?}"
                );
            }
        }
    }
}
