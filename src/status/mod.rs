//! The status page: its schema ([`StatusReport`], served as `/status.json`), the page itself
//! (`/status`: one HTML document with inline CSS and JS that draws the task table, the
//! group's generations and the loss curve from the JSON and polls it again), and the
//! process-wide records a program feeds it: the loss history ([`record_loss`], a bounded ring
//! of the newest [`LOSS_HISTORY_MAX`] points), the newest checkpoint ([`record_checkpoint`])
//! and, under MultiWorkerMirrored, the group ([`record_group`]). At the end of a run the loss
//! history is also drawn as a PNG ([`write_loss_png`]).
//!
//! Served by a metrics endpoint ([`crate::metrics`]): the parameter-server chief's, whose
//! cluster part (tasks, ledger, cut) the bootstrap reads from the coordinator actor, and every
//! MultiWorkerMirrored worker's, whose group part the strategy records (each worker's page is
//! its own view of the group; `ledger` is null there).
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
//!               "ps_restores": integer } | null,       // null under MultiWorkerMirrored
//!   "tasks": [ { "role": "chief"|"ps"|"worker", "index": integer, "address": string,
//!                "incarnation": integer|null,
//!                "state": "waiting"|"alive"|"suspected"|"dead"|"draining"|"retired",
//!                "heartbeat_age_ms": integer|null } ],
//!   "checkpoint": { "path": string, "step": integer, "cut": integer|null } | null,
//!   "loss": [ { "step": integer, "loss": number|null } ],  // oldest first, at most 1000
//!   "group": { "generation", "workers", "replicas_per_worker": integer,  // MultiWorkerMirrored,
//!              "communication": string,                              // else null
//!              "changes": [ { "generation", "workers", "from_step": integer,
//!                             "what": string } ] } | null   // oldest first, at most 64
//! }
//! ```

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// Its newest incarnation seen, if any.
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
    /// The ledger (LEDGER-1); `None` under MultiWorkerMirrored, which has none.
    pub ledger: Option<Ledger>,
    /// The cluster's tasks.
    pub tasks: Vec<TaskStatus>,
    /// The newest checkpoint, if one was written.
    pub checkpoint: Option<CheckpointStatus>,
    /// The loss history, oldest first.
    pub loss: Vec<LossPoint>,
    /// The workers' group, under MultiWorkerMirrored.
    pub group: Option<GroupStatus>,
}

/// A MultiWorkerMirrored worker's view of its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupStatus {
    /// The group's generation (one per formation).
    pub generation: u64,
    /// Workers in it.
    pub workers: usize,
    /// Replicas each worker runs.
    pub replicas_per_worker: usize,
    /// What sums the gradients across workers (`ring`, or `nccl:GPU`).
    pub communication: String,
    /// The membership changes this process saw, oldest first (at most [`MARKERS_MAX`]).
    pub changes: Vec<GroupChange>,
}

/// One generation of the group as it began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupChange {
    /// Its generation.
    pub generation: u64,
    /// Its workers.
    pub workers: usize,
    /// The step it trained from.
    pub from_step: u64,
    /// What made it: formed, lost ..., admitted ..., ... left.
    pub what: String,
}

impl StatusReport {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail (NaN becomes null).
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// What the program recorded.
#[derive(Debug, Default)]
struct Records {
    loss: VecDeque<LossPoint>,
    markers: VecDeque<Marker>,
    checkpoint: Option<(PathBuf, u64)>,
    group: Option<GroupStatus>,
    tasks: Vec<TaskStatus>,
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

/// Records the group of a MultiWorkerMirrored worker as it is now (its `changes` are kept
/// from the records: add one with [`record_group_change`]) and the cluster's tasks as it sees
/// them.
pub fn record_group(mut group: GroupStatus, tasks: Vec<TaskStatus>) {
    let mut records = records();
    group.changes = records.group.take().map(|g| g.changes).unwrap_or_default();
    records.group = Some(group);
    records.tasks = tasks;
}

/// Adds a membership change to the recorded group (the newest [`MARKERS_MAX`] are kept).
pub fn record_group_change(change: GroupChange) {
    let mut records = records();
    let group = records.group.get_or_insert_with(|| GroupStatus {
        generation: change.generation,
        workers: change.workers,
        replicas_per_worker: 0,
        communication: String::new(),
        changes: Vec::new(),
    });
    if group.changes.len() == MARKERS_MAX {
        group.changes.remove(0);
    }
    group.changes.push(change);
}

/// The recorded group and tasks, if a MultiWorkerMirrored worker recorded them.
pub fn group_status() -> Option<(GroupStatus, Vec<TaskStatus>)> {
    let records = records();
    records
        .group
        .clone()
        .map(|group| (group, records.tasks.clone()))
}

/// How far back the status page's rate looks.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// How often a sampler fed by a clock ([`RateSampler::current`]'s readers) takes a sample.
pub const RATE_TICK: Duration = Duration::from_secs(1);
/// Most samples of the step count kept for the rate.
const RATE_SAMPLES_MAX: usize = 256;

/// The status page's rate of steps and mean step time over the last [`RATE_WINDOW`] of
/// requests: each request samples the step count and the step-time totals
/// ([`crate::metrics::Instruments::step_totals`]).
#[derive(Debug, Default)]
pub struct RateSampler {
    // (when, steps, (total step microseconds, steps timed)) per request.
    samples: VecDeque<(Instant, u64, (u64, u64))>,
}

impl RateSampler {
    /// Samples `steps` and `totals` at `now`: the steps per second since the oldest sample
    /// kept, and the mean time of the steps timed since then (`None` when none was).
    pub fn sample(&mut self, now: Instant, steps: u64, totals: (u64, u64)) -> (f64, Option<f64>) {
        let samples = &mut self.samples;
        while samples.len() >= RATE_SAMPLES_MAX
            || (samples.len() > 1
                && samples
                    .front()
                    .is_some_and(|(t, _, _)| now.duration_since(*t) > RATE_WINDOW))
        {
            samples.pop_front();
        }
        samples.push_back((now, steps, totals));
        self.current()
    }

    /// The steps per second and mean step time between the oldest and the newest sample kept,
    /// changing nothing: a sampler fed by a clock every [`RATE_TICK`] gives every reader (two
    /// Prometheus scrapers at different intervals, the status page) the same rate.
    pub fn current(&self) -> (f64, Option<f64>) {
        let (Some(&(then, before, (micros, count))), Some(&(now, steps, totals))) =
            (self.samples.front(), self.samples.back())
        else {
            return (0.0, None);
        };
        let step_seconds = totals
            .1
            .checked_sub(count)
            .filter(|n| *n > 0)
            .map(|n| totals.0.saturating_sub(micros) as f64 / 1e6 / n as f64);
        let rate = if now > then {
            steps.saturating_sub(before) as f64 / now.duration_since(then).as_secs_f64()
        } else {
            0.0
        };
        (rate, step_seconds)
    }
}

/// Milliseconds since 1970, now.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
            ledger: Some(Ledger::default()),
            tasks: vec![TaskStatus {
                role: "worker".into(),
                index: 0,
                address: "</script><b>x</b>".into(),
                incarnation: Some(7),
                state: TaskState::Suspected,
                heartbeat_age_ms: Some(2000),
            }],
            checkpoint: None,
            group: None,
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
    fn the_rate_counts_steps_and_their_mean_time_over_the_window() {
        let mut rate = RateSampler::default();
        let t0 = Instant::now();
        assert_eq!(rate.sample(t0, 100, (0, 0)), (0.0, None));
        // 50 steps in 2 s, timed at 40 ms each.
        let (per_second, mean) = rate.sample(t0 + Duration::from_secs(2), 150, (2_000_000, 50));
        assert!((per_second - 25.0).abs() < 1e-9, "{per_second}");
        assert!((mean.unwrap() - 0.04).abs() < 1e-9, "{mean:?}");
        // Past the window the oldest samples go: the rate is that of the newer ones.
        let later = t0 + RATE_WINDOW + Duration::from_secs(3);
        let (per_second, _) = rate.sample(later, 150, (2_000_000, 50));
        assert_eq!(per_second, 0.0);
    }

    #[test]
    fn a_group_keeps_its_changes_when_recorded_again() {
        let group = |generation| GroupStatus {
            generation,
            workers: 3,
            replicas_per_worker: 2,
            communication: "ring".into(),
            changes: Vec::new(),
        };
        record_group(group(1), Vec::new());
        for generation in 1..=(MARKERS_MAX as u64 + 2) {
            record_group_change(GroupChange {
                generation,
                workers: 3,
                from_step: generation * 10,
                what: "formed".into(),
            });
        }
        record_group(group(7), Vec::new());
        let (recorded, _) = group_status().expect("recorded");
        assert_eq!(recorded.generation, 7);
        assert_eq!(recorded.changes.len(), MARKERS_MAX);
        assert_eq!(recorded.changes[0].generation, 3);
        let mut report = report();
        report.group = Some(recorded);
        report.ledger = None;
        let value: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert!(value["ledger"].is_null());
        assert_eq!(value["group"]["changes"][0]["from_step"], 30);
        assert_eq!(value["group"]["communication"], "ring");
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
