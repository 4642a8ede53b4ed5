//! The Keras progress bar as a callback (what `fit` shows unless told otherwise).

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};
use crate::train::{Progbar, ProgbarMode};

/// Shows Keras 3's progress bar ([`Progbar`]): a bar per epoch on a terminal, one line per
/// epoch otherwise; `fit` adds one on standard error unless `Fit::verbose(false)`.
#[derive(Debug)]
pub struct ProgbarLogger {
    bar: Progbar,
}

impl ProgbarLogger {
    /// A progress bar on standard error.
    pub fn stderr() -> Self {
        Self::new(Progbar::stderr(ProgbarMode::Auto))
    }

    /// A progress bar written where `bar` writes.
    pub fn new(bar: Progbar) -> Self {
        Self { bar }
    }
}

fn pairs(logs: &Logs) -> Vec<(&str, f64)> {
    logs.iter().collect()
}

impl Callback for ProgbarLogger {
    fn on_epoch_begin(
        &mut self,
        epoch: usize,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        self.bar
            .begin_epoch(epoch + 1, ctx.epochs(), ctx.steps_per_epoch())?;
        Ok(())
    }

    fn on_train_batch_end(
        &mut self,
        _step: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        self.bar.update(ctx.step_in_epoch(), &pairs(logs))?;
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        _epoch: usize,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        self.bar.end_epoch(ctx.step_in_epoch(), &pairs(logs))?;
        Ok(())
    }
}
