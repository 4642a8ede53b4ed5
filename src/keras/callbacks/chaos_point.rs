//! Placing a local cluster's planned failure at a point of training (`launch
//! --kill-worker-after` / `--kill-ps-after`), rather than at a wall-clock time.

use std::fmt;
use std::io::Write;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};
use crate::launch::CHAOS_MARKER;

/// At the end of epoch `epoch` (counted from 1), the chief prints the launcher's chaos marker,
/// and a local cluster launched with `--kill-worker-after` or `--kill-ps-after` SIGKILLs that
/// task then (or at the flag's time, whichever comes first): the failure lands at the same
/// point of training on a fast machine and a slow one. Elsewhere the line is only printed.
pub struct ChaosPoint {
    after_epoch: usize,
    out: Box<dyn Write + Send>,
}

impl ChaosPoint {
    /// The point after epoch `epoch` (from 1), printed on standard output (which the launcher
    /// reads).
    pub fn after_epoch(epoch: usize) -> Self {
        Self {
            after_epoch: epoch,
            out: Box::new(std::io::stdout()),
        }
    }

    /// The same, printed to `out`.
    pub fn to_writer(mut self, out: Box<dyn Write + Send>) -> Self {
        self.out = out;
        self
    }
}

impl fmt::Debug for ChaosPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosPoint")
            .field("after_epoch", &self.after_epoch)
            .finish_non_exhaustive()
    }
}

impl Callback for ChaosPoint {
    fn on_epoch_end(
        &mut self,
        epoch: usize,
        _logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if ctx.is_chief() && epoch + 1 == self.after_epoch {
            writeln!(
                self.out,
                "{CHAOS_MARKER} after epoch {} (step {})",
                epoch + 1,
                ctx.step()
            )?;
            self.out.flush()?;
        }
        Ok(())
    }
}
