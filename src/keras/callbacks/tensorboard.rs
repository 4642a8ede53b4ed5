//! Figures as TensorBoard scalars (Keras' `TensorBoard`): `<log_dir>/train` and
//! `<log_dir>/validation`, tags `epoch_<figure>`, and `batch_<figure>` per step when asked.

use std::path::PathBuf;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};
use crate::summary::SummaryWriter;

/// Writes each epoch's figures (and, with [`TensorBoard::update_freq_steps`], the running
/// figures every `n` steps) as TensorBoard event files under `log_dir`, on the chief:
/// training figures in `train/`, validation figures (`val_` names) in `validation/`, as Keras
/// lays them out.
#[derive(Debug)]
pub struct TensorBoard {
    log_dir: PathBuf,
    update_freq_steps: Option<u64>,
    writers: Option<(SummaryWriter, SummaryWriter)>,
}

impl TensorBoard {
    /// Event files under `log_dir`, written once per epoch.
    pub fn new(log_dir: impl Into<PathBuf>) -> Self {
        Self {
            log_dir: log_dir.into(),
            update_freq_steps: None,
            writers: None,
        }
    }

    /// Also writes the running figures every `steps` steps (Keras' `update_freq=N`).
    pub fn update_freq_steps(mut self, steps: u64) -> Self {
        self.update_freq_steps = Some(steps.max(1));
        self
    }

    fn writers(&mut self) -> Result<&mut (SummaryWriter, SummaryWriter), KerasError> {
        if self.writers.is_none() {
            let train = SummaryWriter::create(self.log_dir.join("train"))?;
            let validation = SummaryWriter::create(self.log_dir.join("validation"))?;
            self.writers = Some((train, validation));
        }
        Ok(self.writers.as_mut().expect("created above"))
    }
}

impl Callback for TensorBoard {
    fn on_train_batch_end(
        &mut self,
        step: u64,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        let Some(every) = self.update_freq_steps else {
            return Ok(());
        };
        if !ctx.is_chief() || step % every != 0 {
            return Ok(());
        }
        let (train, _) = self.writers()?;
        for (name, value) in logs.iter() {
            train.scalar(&format!("batch_{name}"), step, value)?;
        }
        Ok(())
    }

    fn on_epoch_end(
        &mut self,
        epoch: usize,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if !ctx.is_chief() {
            return Ok(());
        }
        let (train, validation) = self.writers()?;
        for (name, value) in logs.iter() {
            match name.strip_prefix("val_") {
                Some(base) => validation.scalar(&format!("epoch_{base}"), epoch as u64, value)?,
                None => train.scalar(&format!("epoch_{name}"), epoch as u64, value)?,
            }
        }
        train.flush()?;
        validation.flush()?;
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _logs: &Logs,
        _ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if let Some((train, validation)) = self.writers.as_mut() {
            train.flush()?;
            validation.flush()?;
        }
        Ok(())
    }
}
