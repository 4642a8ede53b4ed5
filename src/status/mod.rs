//! The chief's status page: its schema ([`StatusReport`], served as `/status.json`), the page
//! itself (`/status`: one HTML document with inline CSS and JS that draws the task table and
//! the loss curve from the JSON and polls it again), and the process-wide records the chief's
//! program feeds it: the loss history ([`record_loss`], a bounded ring of the newest
//! [`LOSS_HISTORY_MAX`] points) and the newest checkpoint ([`record_checkpoint`]). At the end
//! of a run the loss history is also drawn as a PNG ([`write_loss_png`]).
//!
//! Served by the chief's metrics endpoint ([`crate::metrics`]); the cluster's part of a report
//! (tasks, ledger, cut) is read from the coordinator actor by the bootstrap.
//!
//! # `/status.json` schema
//!
//! ```text
//! {
//!   "job": string,                      // the program's name
//!   "unix_ms": integer,                 // when the report was made
//!   "step": integer,                    // closures committed (the ledger's count)
//!   "steps_per_second": number,         // committed per second over the last ~10 s
//!   "step_seconds": number|null,        // mean dispatch-to-commit time of those closures
//!   "ledger": { "scheduled", "committed", "failed", "cancelled", "unavailable",
//!               "redispatched", "rejected_stale", "pending", "rolled_back",
//!               "ps_restores": integer },
//!   "tasks": [ { "role": "chief"|"ps"|"worker", "index": integer, "address": string,
//!                "incarnation": integer|null,
//!                "state": "waiting"|"alive"|"suspected"|"dead"|"draining"|"retired",
//!                "heartbeat_age_ms": integer|null } ],
//!   "checkpoint": { "path": string, "step": integer, "cut": integer|null } | null,
//!   "loss": [ { "step": integer, "loss": number|null } ]   // oldest first, at most 1000
//! }
//! ```

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};

use serde::Serialize;

use crate::ledger::Ledger;
use crate::plot::{Chart, Marker, PlotError, Series};

/// Most loss points kept (the oldest are dropped first).
pub const LOSS_HISTORY_MAX: usize = 1000;
/// Most markers kept for the loss curve.
pub const MARKERS_MAX: usize = 64;

/// A task's state on the status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// No incarnation seen yet.
    Waiting,
    /// Up, and heard from recently.
    Alive,
    /// Up as far as the coordinator knows, but silent for more than half the detection
    /// timeout: it is declared dead if the silence lasts.
    Suspected,
    /// Lost, no newer incarnation up.
    Dead,
    /// A worker being drained.
    Draining,
    /// Out of the job.
    Retired,
}

/// One task of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskStatus {
    /// `chief`, `ps` or `worker`.
    pub role: String,
    /// Its index.
    pub index: u32,
    /// Where it is dialled (host:port).
    pub address: String,
    /// Its newest incarnation seen (epoch), if any.
    pub incarnation: Option<u64>,
    /// What the coordinator makes of it.
    pub state: TaskState,
    /// Time since the failure detector last heard from it, if it watches it.
    pub heartbeat_age_ms: Option<u64>,
}

/// The newest checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointStatus {
    /// Its directory.
    pub path: String,
    /// The program's step it holds.
    pub step: u64,
    /// The coordinator's cut (a closure id: every closure below it had finished), if known.
    pub cut: Option<u64>,
}

/// One point of the loss curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossPoint {
    /// The program's step.
    pub step: u64,
    /// The loss (`null` in JSON when not finite).
    pub loss: f64,
}

/// The whole report (see the module docs for its JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    /// The program's name.
    pub job: String,
    /// When it was made, in milliseconds since 1970.
    pub unix_ms: u64,
    /// Closures committed.
    pub step: u64,
    /// Closures committed per second, lately.
    pub steps_per_second: f64,
    /// The mean time from dispatch to commit of the closures committed lately, in seconds
    /// (`None` when none was).
    pub step_seconds: Option<f64>,
    /// The ledger (LEDGER-1).
    pub ledger: Ledger,
    /// The cluster's tasks.
    pub tasks: Vec<TaskStatus>,
    /// The newest checkpoint, if one was written.
    pub checkpoint: Option<CheckpointStatus>,
    /// The loss history, oldest first.
    pub loss: Vec<LossPoint>,
}

impl StatusReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail (NaN becomes null).
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// What the chief's program recorded.
#[derive(Debug, Default)]
struct Records {
    loss: VecDeque<LossPoint>,
    markers: VecDeque<Marker>,
    checkpoint: Option<(PathBuf, u64)>,
}

static RECORDS: LazyLock<Mutex<Records>> = LazyLock::new(Mutex::default);

fn records() -> std::sync::MutexGuard<'static, Records> {
    RECORDS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records the loss at `step` (the newest [`LOSS_HISTORY_MAX`] are kept).
pub fn record_loss(step: u64, loss: f64) {
    let mut records = records();
    if records.loss.len() == LOSS_HISTORY_MAX {
        records.loss.pop_front();
    }
    records.loss.push_back(LossPoint { step, loss });
}

/// Marks `step` on the loss curve with `label` (a phase change, a restore).
pub fn record_marker(step: u64, label: &str) {
    let mut records = records();
    if records.markers.len() == MARKERS_MAX {
        records.markers.pop_front();
    }
    records.markers.push_back(Marker {
        x: step as f64,
        label: label.to_string(),
    });
}

/// Records the newest checkpoint: its directory and the step it holds.
pub fn record_checkpoint(path: &Path, step: u64) {
    records().checkpoint = Some((path.to_path_buf(), step));
}

/// The loss history, oldest first.
pub fn loss_history() -> Vec<LossPoint> {
    records().loss.iter().copied().collect()
}

/// The newest checkpoint recorded, with the coordinator's `cut`.
pub fn newest_checkpoint(cut: Option<u64>) -> Option<CheckpointStatus> {
    records()
        .checkpoint
        .as_ref()
        .map(|(path, step)| CheckpointStatus {
            path: path.display().to_string(),
            step: *step,
            cut,
        })
}

/// Draws the loss history (with its markers) as a PNG at `path`, titled `title`.
pub fn write_loss_png(path: &Path, title: &str) -> Result<(), PlotError> {
    let (points, markers) = {
        let records = records();
        (
            records
                .loss
                .iter()
                .map(|p| (p.step as f64, p.loss))
                .collect(),
            records.markers.iter().cloned().collect(),
        )
    };
    let chart = Chart {
        title: title.to_string(),
        x_label: "step".into(),
        y_label: "loss".into(),
        series: vec![Series {
            name: "train loss".into(),
            points,
        }],
        markers,
    };
    crate::plot::write_png(&chart, path, 1000, 600)
}

/// `text` with the characters that mean something in HTML escaped.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The status page for `report`: the report is embedded (so the page shows without a second
/// request) and the page's script polls `/status.json` every 2 s. Every string from the
/// report reaches the document as text (escaped here, or `textContent` in the script).
pub fn html(report: &StatusReport) -> String {
    // In a <script> element only "</" could end it early: '<' is escaped as JSON allows.
    let json = report.to_json().replace('<', "\\u003c");
    PAGE.replace("{{TITLE}}", &escape_html(&report.job))
        .replace("{{JSON}}", &json)
}

const PAGE: &str = include_str!("page.html");

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> StatusReport {
        StatusReport {
            job: "<job> & \"co\"".into(),
            unix_ms: 1,
            step: 3,
            steps_per_second: 1.5,
            step_seconds: Some(0.02),
            ledger: Ledger::default(),
            tasks: vec![TaskStatus {
                role: "worker".into(),
                index: 0,
                address: "</script><b>x</b>".into(),
                incarnation: Some(7),
                state: TaskState::Suspected,
                heartbeat_age_ms: Some(2000),
            }],
            checkpoint: None,
            loss: vec![
                LossPoint { step: 1, loss: 2.0 },
                LossPoint {
                    step: 2,
                    loss: f64::NAN,
                },
            ],
        }
    }

    #[test]
    fn the_json_follows_the_schema() {
        let value: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(value["tasks"][0]["state"], "suspected");
        assert_eq!(value["tasks"][0]["incarnation"], 7);
        assert_eq!(value["loss"][1]["loss"], serde_json::Value::Null);
        assert_eq!(value["ledger"]["committed"], 0);
        assert!(value["checkpoint"].is_null());
    }

    #[test]
    fn the_page_escapes_every_string_from_the_report() {
        let page = html(&report());
        assert!(page.contains("&lt;job&gt; &amp; &quot;co&quot;"), "{page}");
        assert!(!page.contains("<b>x</b>"), "{page}");
        assert!(!page.contains("</script><b>"), "{page}");
        assert_eq!(page.matches("</script>").count(), 2, "{page}");
    }

    #[test]
    fn the_loss_history_keeps_the_newest_points_and_draws_them() {
        // The only test that records: the history is this process's.
        for step in 0..(LOSS_HISTORY_MAX as u64 + 5) {
            record_loss(step, 1.0 / (step + 1) as f64);
        }
        record_marker(500, "half way");
        let history = loss_history();
        assert_eq!(history.len(), LOSS_HISTORY_MAX);
        assert_eq!(history[0].step, 5);
        assert_eq!(history.last().unwrap().step, LOSS_HISTORY_MAX as u64 + 4);
        let path = std::env::temp_dir().join(format!("cohort-loss-{}.png", std::process::id()));
        write_loss_png(&path, "loss").expect("drawn");
        assert!(std::fs::read(&path).unwrap().starts_with(b"\x89PNG"));
        let _ = std::fs::remove_file(&path);
    }
}
