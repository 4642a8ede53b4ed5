//! Each epoch's figures as a row of a CSV file (Keras' `CSVLogger`).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};

/// Appends `epoch,<figure>,...` per epoch to a CSV file, on the chief. The header comes from
/// the first epoch's figures; with `append` (the default when training resumes from a backup)
/// an existing file is continued rather than replaced.
#[derive(Debug)]
pub struct CsvLogger {
    path: PathBuf,
    append: bool,
    columns: Option<Vec<String>>,
}

impl CsvLogger {
    /// Writes to `path`, replacing an existing file when training begins.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            append: false,
            columns: None,
        }
    }

    /// Continues an existing file instead of replacing it.
    pub fn append(mut self, append: bool) -> Self {
        self.append = append;
        self
    }
}

impl Callback for CsvLogger {
    fn on_train_begin(&mut self, ctx: &mut TrainingContext<'_>) -> Result<(), KerasError> {
        self.columns = None;
        // A resumed run continues the file it wrote before.
        let continuing = self.append || ctx.step() > 0;
        if ctx.is_chief() && !continuing && self.path.exists() {
            std::fs::remove_file(&self.path)
                .map_err(|e| KerasError::io(&self.path, "replace the file", e))?;
        }
        if continuing {
            if let Ok(text) = std::fs::read_to_string(&self.path) {
                self.columns = text
                    .lines()
                    .next()
                    .map(|header| header.split(',').skip(1).map(str::to_owned).collect());
            }
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
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| KerasError::io(dir, "create the directory", e))?;
        }
        let mut text = String::new();
        let columns = match &self.columns {
            Some(columns) => columns.clone(),
            None => {
                let columns: Vec<String> = logs.iter().map(|(n, _)| n.to_owned()).collect();
                text.push_str("epoch");
                for name in &columns {
                    text.push(',');
                    text.push_str(name);
                }
                text.push('\n');
                self.columns = Some(columns.clone());
                columns
            }
        };
        text.push_str(&epoch.to_string());
        for name in &columns {
            text.push(',');
            if let Some(value) = logs.get(name) {
                text.push_str(&value.to_string());
            }
        }
        text.push('\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| KerasError::io(&self.path, "open", e))?;
        file.write_all(text.as_bytes())
            .map_err(|e| KerasError::io(&self.path, "write", e))
    }
}
