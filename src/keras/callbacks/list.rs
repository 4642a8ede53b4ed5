//! The callbacks of one `fit` (under any strategy, and `PsFit::fit`): the progress bar first
//! where it is shown, then the user's in the order given, and the backup among them.

use super::{BackupAndRestore, Callback, ProgbarLogger, SaveFreq, TrainingContext};
use crate::keras::KerasError;

/// The callbacks `fit` runs, in order (see the module docs).
pub(crate) struct CallbackList {
    callbacks: Vec<Box<dyn Callback>>,
    /// Which one is the [`BackupAndRestore`], if one is (the first, where several are).
    backup: Option<usize>,
}

impl CallbackList {
    /// The progress bar on standard error where `verbose`, then `user`'s.
    pub(crate) fn new(user: Vec<Box<dyn Callback>>, verbose: bool) -> Self {
        let mut callbacks: Vec<Box<dyn Callback>> = Vec::with_capacity(user.len() + 1);
        if verbose {
            callbacks.push(Box::new(ProgbarLogger::stderr()));
        }
        callbacks.extend(user);
        let backup = callbacks.iter_mut().position(|c| c.as_backup().is_some());
        Self { callbacks, backup }
    }

    /// The backup, if one was given.
    pub(crate) fn backup(&mut self) -> Option<&mut BackupAndRestore> {
        let index = self.backup?;
        self.callbacks[index].as_backup()
    }

    /// The cadence of step backups, if the backup saves by steps.
    pub(crate) fn backup_every_steps(&mut self) -> Option<u64> {
        match self.backup()?.frequency() {
            SaveFreq::Steps(n) => Some(n.max(1)),
            SaveFreq::Epoch => None,
        }
    }

    /// Runs `hook` on every callback in order with `ctx`; the first error ends it.
    pub(crate) fn each(
        &mut self,
        ctx: &mut TrainingContext<'_>,
        mut hook: impl FnMut(&mut dyn Callback, &mut TrainingContext<'_>) -> Result<(), KerasError>,
    ) -> Result<(), KerasError> {
        for callback in &mut self.callbacks {
            hook(callback.as_mut(), ctx)?;
        }
        Ok(())
    }
}
