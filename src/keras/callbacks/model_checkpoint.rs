//! Saving the model's weights during training (Keras' `ModelCheckpoint` with
//! `save_weights_only=True`).

use std::path::PathBuf;

use super::{Callback, Mode, TrainingContext};
use crate::keras::{KerasError, Logs};

/// Saves the weights as a safetensors file (as `Model::save`) after every epoch, or only when
/// `monitor` improved (`save_best_only`), on the chief. `{epoch}` in the path becomes the
/// epoch's number from 1 (Keras' `filepath="ckpt-{epoch}.safetensors"`).
#[derive(Debug)]
pub struct ModelCheckpoint {
    path: String,
    best_only: Option<(String, Mode)>,
    best: Option<f64>,
    saved: Vec<PathBuf>,
}

impl ModelCheckpoint {
    /// Saves after every epoch to `path` (`{epoch}` replaced by the epoch from 1).
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            best_only: None,
            best: None,
            saved: Vec::new(),
        }
    }

    /// Saves only when `monitor` improved on the best so far (lower is better for a name
    /// ending in `loss`, higher otherwise).
    pub fn save_best_only(mut self, monitor: impl Into<String>) -> Self {
        let monitor = monitor.into();
        let mode = if monitor.ends_with("loss") || monitor.ends_with("error") {
            Mode::Min
        } else {
            Mode::Max
        };
        self.best_only = Some((monitor, mode));
        self
    }

    /// The files written so far, in order.
    pub fn saved(&self) -> &[PathBuf] {
        &self.saved
    }
}

impl Callback for ModelCheckpoint {
    fn on_epoch_end(
        &mut self,
        epoch: usize,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if let Some((monitor, mode)) = &self.best_only {
            let Some(value) = logs.get(monitor).filter(|v| !v.is_nan()) else {
                tracing::warn!(monitor = %monitor, "ModelCheckpoint: the monitored figure is not in the logs; nothing saved");
                return Ok(());
            };
            let better = match (self.best, mode) {
                (None, _) => true,
                (Some(best), Mode::Min) => value < best,
                (Some(best), Mode::Max) => value > best,
            };
            if !better {
                return Ok(());
            }
            self.best = Some(value);
        }
        if !ctx.is_chief() {
            return Ok(());
        }
        let path = PathBuf::from(self.path.replace("{epoch}", &(epoch + 1).to_string()));
        ctx.save_weights(&path)?;
        self.saved.push(path);
        Ok(())
    }
}
