//! The state an optimizer keeps beside the variables it trains, as it travels between the
//! workers of a synchronous group (elastic re-forming: the survivor that completed the most
//! steps gives its slots and step count to the others). The arithmetic stays in the kernels;
//! this is only export and import.

use super::{LearningRateSchedule, Optimizer, ScheduleError, Slots};
use crate::variable::Variable;

/// An optimizer whose per-variable [`Slots`] and step count can be exported and imported
/// between steps (in cross-replica context).
pub trait OptimizerState: Send + Sync + std::fmt::Debug {
    /// The kernel and its hyperparameters (which slots each variable has).
    fn kernel(&self) -> &Optimizer;

    /// A copy of the slots of `variable`'s copy `component` (a replica's index for a mirrored
    /// variable, else 0), if the optimizer has updated it.
    fn export_slots(&self, variable: &Variable, component: usize) -> Option<Slots>;

    /// Installs `slots` for `variable`'s copy `component`.
    fn import_slots(&self, variable: &Variable, component: usize, slots: Slots);

    /// Steps applied so far (the bias correction's step).
    fn steps(&self) -> u64;

    /// Sets the step count of every one of `components` copies.
    fn set_steps(&self, steps: u64, components: usize);

    /// The learning-rate schedule in force, where this optimizer has one to carry: the one it
    /// was built with, or the constant rate a callback set since (Keras'
    /// `LearningRateScheduler`). A worker that takes the state takes it too, so that every
    /// worker goes on at the same rate. `None` (the default): nothing to carry.
    fn learning_rate_schedule(&self) -> Option<LearningRateSchedule> {
        None
    }

    /// Puts `schedule` in force (one carried with a state this worker took); a schedule no
    /// optimizer accepts (a rate that is negative or not finite) is refused and the one in
    /// force stays. The default, for an optimizer without a schedule, ignores it.
    fn set_learning_rate_schedule(
        &self,
        schedule: LearningRateSchedule,
    ) -> Result<(), ScheduleError> {
        schedule.validate()
    }
}
