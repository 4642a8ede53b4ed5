//! The history of figures as a PNG chart, redrawn after every epoch.

use std::path::PathBuf;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};
use crate::plot::{write_png, Chart, Marker, Series};

/// Draws the named figures of every epoch so far (`loss` and `val_loss`, say) against the
/// epoch as a PNG at `path`, on the chief, after each epoch; vertical markers label moments
/// of the run (at fractional epochs).
#[derive(Debug)]
pub struct PlotHistory {
    path: PathBuf,
    figures: Vec<String>,
    markers: Vec<Marker>,
    points: Vec<Vec<(f64, f64)>>,
}

impl PlotHistory {
    /// A chart of `figures` written to `path`.
    pub fn new(path: impl Into<PathBuf>, figures: &[&str]) -> Self {
        Self {
            path: path.into(),
            figures: figures.iter().map(|f| (*f).to_owned()).collect(),
            markers: Vec::new(),
            points: vec![Vec::new(); figures.len()],
        }
    }

    /// A vertical line at `epoch` (counted from 1 at the end of the first) labelled `label`.
    pub fn marker(mut self, epoch: f64, label: impl Into<String>) -> Self {
        self.markers.push(Marker {
            x: epoch,
            label: label.into(),
        });
        self
    }
}

impl Callback for PlotHistory {
    fn on_epoch_end(
        &mut self,
        epoch: usize,
        logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        for (figure, points) in self.figures.iter().zip(&mut self.points) {
            if let Some(value) = logs.get(figure) {
                points.push(((epoch + 1) as f64, value));
            }
        }
        if !ctx.is_chief() {
            return Ok(());
        }
        let title = self
            .path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let chart = Chart {
            title,
            x_label: "epoch".into(),
            y_label: self.figures.first().cloned().unwrap_or_default(),
            series: self
                .figures
                .iter()
                .zip(&self.points)
                .map(|(name, points)| Series {
                    name: name.clone(),
                    points: points.clone(),
                })
                .collect(),
            markers: self.markers.clone(),
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| KerasError::io(dir, "create the directory", e))?;
        }
        Ok(write_png(&chart, &self.path, 800, 500)?)
    }
}
