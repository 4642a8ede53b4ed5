//! Stopping when a monitored figure stops improving (Keras' `EarlyStopping`).

use candle_core::Tensor;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};

/// Whether a monitored figure improves by going down or up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Lower is better (losses).
    Min,
    /// Higher is better (accuracy, AUC).
    Max,
}

/// Stops training once `monitor` has not improved by more than `min_delta` for `patience`
/// epochs in a row (at least one), optionally restoring the weights of the best epoch
/// (Keras' `EarlyStopping`).
///
/// Under MultiWorkerMirrored every worker must decide alike: monitor a validation figure
/// (`val_...`, evaluated over every worker), not a training one, whose running figures a
/// worker that joined or re-formed mid-epoch counts from then on.
#[derive(Debug)]
pub struct EarlyStopping {
    monitor: String,
    mode: Mode,
    min_delta: f64,
    patience: usize,
    restore_best_weights: bool,
    best: Option<f64>,
    wait: usize,
    best_weights: Option<Vec<(String, Tensor)>>,
    stopped_epoch: Option<usize>,
}

impl EarlyStopping {
    /// Monitors `monitor` (`val_loss`, `val_accuracy`, ...): lower is better when its name
    /// ends in `loss` or `error`, higher otherwise (Keras' `mode="auto"`), patience 0.
    pub fn new(monitor: impl Into<String>) -> Self {
        let monitor = monitor.into();
        let mode = if monitor.ends_with("loss") || monitor.ends_with("error") {
            Mode::Min
        } else {
            Mode::Max
        };
        Self {
            monitor,
            mode,
            min_delta: 0.0,
            patience: 0,
            restore_best_weights: false,
            best: None,
            wait: 0,
            best_weights: None,
            stopped_epoch: None,
        }
    }

    /// Epochs without improvement before stopping.
    pub fn patience(mut self, epochs: usize) -> Self {
        self.patience = epochs;
        self
    }

    /// The smallest change that counts as an improvement.
    pub fn min_delta(mut self, delta: f64) -> Self {
        self.min_delta = delta.abs();
        self
    }

    /// Whether lower or higher is better.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Restores the best epoch's weights when stopping (or at the end).
    pub fn restore_best_weights(mut self, restore: bool) -> Self {
        self.restore_best_weights = restore;
        self
    }

    /// The epoch (from 0) after which it stopped training, if it did.
    pub fn stopped_epoch(&self) -> Option<usize> {
        self.stopped_epoch
    }

    fn improves(&self, value: f64) -> bool {
        match (self.best, self.mode) {
            (None, _) => true,
            (Some(best), Mode::Min) => value < best - self.min_delta,
            (Some(best), Mode::Max) => value > best + self.min_delta,
        }
    }
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, _ctx: &mut TrainingContext<'_>) -> Result<(), KerasError> {
        self.best = None;
        self.wait = 0;
        self.best_weights = None;
        self.stopped_epoch = None;
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        epoch: usize,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        let Some(value) = logs.get(&self.monitor).filter(|v| !v.is_nan()) else {
            let names: Vec<&str> = logs.iter().map(|(n, _)| n).collect();
            tracing::warn!(monitor = %self.monitor, available = ?names, "EarlyStopping: the monitored figure is not in the logs");
            return Ok(());
        };
        if self.improves(value) {
            self.best = Some(value);
            self.wait = 0;
            if self.restore_best_weights {
                self.best_weights = Some(ctx.weights()?);
            }
            return Ok(());
        }
        self.wait += 1;
        if self.wait >= self.patience.max(1) {
            self.stopped_epoch = Some(epoch);
            ctx.stop_training();
            if let Some(best) = self.best_weights.take() {
                ctx.set_weights(&best)?;
            }
        }
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        // Training ran to its end: the best epoch's weights all the same (Keras 3).
        if let Some(best) = self.best_weights.take() {
            ctx.set_weights(&best)?;
        }
        Ok(())
    }
}
