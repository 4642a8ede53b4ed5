//! Callbacks: code the user's `fit` runs at the start and end of training, of each epoch and
//! after each step (Keras' `keras.callbacks`), with the ones Keras ships: the progress bar,
//! [`EarlyStopping`], [`LearningRateScheduler`], [`CsvLogger`], [`TensorBoard`],
//! [`ModelCheckpoint`] and [`BackupAndRestore`]; and two of cohort's: [`PlotHistory`] (a PNG
//! chart of the figures), [`ScaleWorkers`] (a local cluster scaled on a schedule) and
//! [`ChaosPoint`] (a local cluster's planned failure placed at an epoch's end).
//!
//! Every worker of a job runs its callbacks with the same logs (the figures are reduced over
//! every replica); the ones that write files write them on the chief only.

mod backup;
mod chaos_point;
mod csv_logger;
mod early_stopping;
mod list;
mod lr_scheduler;
mod model_checkpoint;
mod plot_history;
mod progbar;
mod scale_workers;
mod tensorboard;

pub use backup::{BackupAndRestore, SaveFreq};
pub use chaos_point::ChaosPoint;
pub use csv_logger::CsvLogger;
pub use early_stopping::{EarlyStopping, Mode};
pub(crate) use list::CallbackList;
pub use lr_scheduler::LearningRateScheduler;
pub use model_checkpoint::ModelCheckpoint;
pub use plot_history::PlotHistory;
pub use progbar::ProgbarLogger;
pub use scale_workers::ScaleWorkers;
pub use tensorboard::TensorBoard;

use std::path::Path;

use candle_core::Tensor;

use super::{save, KerasError, Logs};
use crate::train::DistributedOptimizer;
use crate::variable::Variable;

/// Code run at points of `fit` (Keras' `Callback`); every method does nothing by default.
///
/// Epochs are numbered from 0 as in Keras' callbacks (the progress bar shows them from 1);
/// `step` is the global step count (updates applied since the job began).
pub trait Callback: Send {
    /// Before the first step (after a [`BackupAndRestore`] restored its state).
    fn on_train_begin(&mut self, _ctx: &mut TrainingContext<'_>) -> Result<(), KerasError> {
        Ok(())
    }
    /// Before epoch `epoch`'s first step.
    fn on_epoch_begin(
        &mut self,
        _epoch: usize,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        Ok(())
    }
    /// After each step: `logs` holds the epoch's running figures.
    fn on_train_batch_end(
        &mut self,
        _step: u64,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        Ok(())
    }
    /// After epoch `epoch` and its validation: `logs` holds the epoch's figures and the
    /// validation's (`val_` names).
    fn on_epoch_end(
        &mut self,
        _epoch: usize,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        Ok(())
    }
    /// After the last epoch (or an early stop), with the last epoch's logs.
    fn on_train_end(
        &mut self,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        Ok(())
    }
    /// `Some` for the callback that backs training up and restores it: `fit` saves through it
    /// at its frequency and resumes from its newest backup. Only [`BackupAndRestore`] is one.
    fn as_backup(&mut self) -> Option<&mut BackupAndRestore> {
        None
    }
}

/// What a callback can see and change of the training it runs in.
pub struct TrainingContext<'a> {
    pub(crate) optimizer: &'a DistributedOptimizer,
    pub(crate) variables: &'a [Variable],
    pub(crate) is_chief: bool,
    pub(crate) stop_training: bool,
    pub(crate) step: u64,
    pub(crate) step_in_epoch: usize,
    pub(crate) epochs: usize,
    pub(crate) steps_per_epoch: Option<usize>,
    /// Whether a callback set the weights ([`TrainingContext::set_weights`]): under
    /// ParameterServerStrategy `fit` then writes the chief's copy to the servers.
    pub(crate) weights_set: bool,
}

impl TrainingContext<'_> {
    /// Asks `fit` to stop after this epoch (Keras' `model.stop_training = True`).
    pub fn stop_training(&mut self) {
        self.stop_training = true;
    }

    /// Whether a callback asked to stop.
    pub fn stopping(&self) -> bool {
        self.stop_training
    }

    /// Whether this worker is the chief (the one that writes files).
    pub fn is_chief(&self) -> bool {
        self.is_chief
    }

    /// Updates applied since the job began.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Steps of the current epoch done.
    pub fn step_in_epoch(&self) -> usize {
        self.step_in_epoch
    }

    /// The epochs `fit` was asked for.
    pub fn epochs(&self) -> usize {
        self.epochs
    }

    /// Steps per epoch, where known (given to `fit`, or counted in the first epoch).
    pub fn steps_per_epoch(&self) -> Option<usize> {
        self.steps_per_epoch
    }

    /// The learning rate of the next update.
    pub fn learning_rate(&self) -> f32 {
        self.optimizer.learning_rate()
    }

    /// Sets a constant learning rate from the next update on, replacing any schedule (every
    /// worker does the same). Under ParameterServerStrategy `fit` hands it to the coordinator
    /// once the callbacks of that moment ran: the closures scheduled from then on carry it
    /// and the servers apply their updates at it (`ClusterCoordinator::set_learning_rate`),
    /// so a rate set at an epoch's beginning governs exactly that epoch's steps, whatever
    /// fails. A rate that is not finite and non-negative is refused, changing nothing.
    pub fn set_learning_rate(&mut self, learning_rate: f32) -> Result<(), KerasError> {
        Ok(self.optimizer.set_learning_rate(learning_rate)?)
    }

    /// The model's variables by name (trainable and statistics), as their values now (under
    /// ParameterServerStrategy, as the chief last read them from the servers: at the end of
    /// each epoch and of training).
    pub fn weights(&self) -> Result<Vec<(String, Tensor)>, KerasError> {
        save::read_weights(self.variables)
    }

    /// Sets every variable from `weights` (as [`TrainingContext::weights`] gave them): a name
    /// missing or a shape that differs is refused before any variable changes. Under
    /// ParameterServerStrategy `fit` writes them to the servers once the callbacks of that
    /// moment ran (after the closures in flight finished).
    pub fn set_weights(&mut self, weights: &[(String, Tensor)]) -> Result<(), KerasError> {
        save::assign_weights(self.variables, weights, "the weights given")?;
        self.weights_set = true;
        Ok(())
    }

    /// Writes the model's weights to a safetensors file at `path` (as `Model::save`).
    pub fn save_weights(&self, path: &Path) -> Result<(), KerasError> {
        save::save_variables(self.variables, path)
    }
}
