//! Backing training up and resuming it at the exact step (Keras' `BackupAndRestore`).

use std::path::PathBuf;

use super::Callback;
use crate::keras::KerasError;
use crate::train::StateCheckpoints;

/// When [`BackupAndRestore`] saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveFreq {
    /// At the end of every epoch (Keras' `save_freq="epoch"`).
    Epoch,
    /// Every `n` steps, counted from the start of the job (Keras' `save_freq=n`).
    Steps(u64),
}

/// Backs up the whole training state (every variable, the optimizer's slots and step count,
/// the epoch and the input position) under a directory, in cohort's checkpoint format (atomic,
/// verified, the newest few kept; `cohort ckpt` reads it), and makes `fit` resume from the
/// newest backup at the exact step where one exists: a job killed and started again goes on as
/// if it had not stopped, and the data it sees is the data it would have seen (DATA-1).
///
/// Under MultiWorkerMirrored the chief saves and, at a fresh start of the job, restores and
/// gives the state to every worker; a worker restarted alone rejoins and takes the live state
/// from the others. By default the backup is deleted when training ends normally (as Keras
/// does); keep it with [`BackupAndRestore::delete_checkpoint`]`(false)`.
#[derive(Debug)]
pub struct BackupAndRestore {
    dir: PathBuf,
    save_freq: SaveFreq,
    delete_checkpoint: bool,
    checkpoints: Option<StateCheckpoints>,
}

impl BackupAndRestore {
    /// Backups under `dir`, at the end of every epoch.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            save_freq: SaveFreq::Epoch,
            delete_checkpoint: true,
            checkpoints: None,
        }
    }

    /// When to save.
    pub fn save_freq(mut self, save_freq: SaveFreq) -> Self {
        self.save_freq = save_freq;
        self
    }

    /// Whether to delete the backup when training ends normally (default `true`).
    pub fn delete_checkpoint(mut self, delete: bool) -> Self {
        self.delete_checkpoint = delete;
        self
    }

    /// The directory of the backups.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// When it saves.
    pub fn frequency(&self) -> SaveFreq {
        self.save_freq
    }

    /// The checkpoints, opened on first use.
    pub(crate) fn checkpoints(&mut self) -> Result<&mut StateCheckpoints, KerasError> {
        if self.checkpoints.is_none() {
            let every = match self.save_freq {
                SaveFreq::Steps(n) => Some(n.max(1)),
                SaveFreq::Epoch => None,
            };
            let opened = StateCheckpoints::open(&self.dir, every, 2).map_err(|source| {
                KerasError::Backup {
                    dir: self.dir.clone(),
                    source: Box::new(source),
                }
            })?;
            self.checkpoints = Some(opened);
        }
        Ok(self.checkpoints.as_mut().expect("opened above"))
    }

    /// After training ended normally: removes the backups unless told to keep them.
    pub(crate) fn finish(&mut self, is_chief: bool) -> Result<(), KerasError> {
        self.checkpoints = None;
        if self.delete_checkpoint && is_chief && self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .map_err(|e| KerasError::io(&self.dir, "delete the backup", e))?;
        }
        Ok(())
    }
}

impl Callback for BackupAndRestore {
    fn as_backup(&mut self) -> Option<&mut BackupAndRestore> {
        Some(self)
    }
}
