//! The state an optimizer keeps beside the variables it trains, as it travels between the
//! workers of a synchronous group (elastic re-forming: the survivor that completed the most
//! steps gives its slots and step count to the others). The arithmetic stays in the kernels;
//! this is only export and import.

use super::{Optimizer, Slots};
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
}
