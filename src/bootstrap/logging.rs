//! How a cohort process reports: `tracing` events on stderr, one line each, as text (the
//! default) or, with `COHORT_LOG_FORMAT=json`, one JSON object per line for a log collector.
//! This module owns the format and the process's identity on every line: once the task is
//! known ([`set_task`], or [`set_launcher`] for `launch`), each event carries its role, index
//! and incarnation, whatever thread or actor reports it. Events that know the training step
//! carry a `step` field. `RUST_LOG` filters as usual; by default the `cohort` crate's events
//! from info up and every other crate's warnings.
//!
//! A text line: `2026-11-25T23:50:01.123Z  INFO ps/0: restore generation 2 begins`
//! (`launcher:` for the launcher; fields after the message as `step=300`).
//!
//! A JSON line: `{"ts_ms": <unix ms>, "level": "INFO", "role": "ps", "index": 0,
//! "incarnation": 1795…, "message": "…", <the event's other fields>}` (`role` alone for the
//! launcher; none of the three before the task is known).

use std::fmt;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime as WallClock};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Environment variable choosing the log format: `text` (default) or `json`.
pub const LOG_FORMAT_ENV: &str = "COHORT_LOG_FORMAT";

/// The default filter: the `cohort` crate's events from info (what a process reports), other
/// crates' warnings. A directive matches every target it starts, so the runtime's and the
/// transport's crates (`cohort_actors`, `cohort_transport`: their info is per-peer detail) are
/// held back to warnings by name.
const DEFAULT_FILTER: &str = "warn,cohort=info,cohort_actors=warn,cohort_transport=warn";

/// Who this process is, stamped on every line once known.
struct Task {
    role: String,
    /// The task's index and incarnation (none for the launcher).
    task: Option<(u32, u64)>,
}

static TASK: OnceLock<Task> = OnceLock::new();

/// Records the task (role, index, incarnation) for every line from now on.
pub(crate) fn set_task(role: &str, index: u32, incarnation: u64) {
    let _ = TASK.set(Task {
        role: role.to_string(),
        task: Some((index, incarnation)),
    });
}

/// Records that this process is the launcher of a local cluster.
pub(crate) fn set_launcher() {
    let _ = TASK.set(Task {
        role: "launcher".to_string(),
        task: None,
    });
}

/// Whether `COHORT_LOG_FORMAT` asks for JSON lines (what the launcher's children then log).
pub(crate) fn json_format() -> bool {
    std::env::var(LOG_FORMAT_ENV).is_ok_and(|format| format.trim() == "json")
}

/// Installs the subscriber in the format `COHORT_LOG_FORMAT` asks for; an unknown format is
/// an error naming the variable (nothing is installed). Once one is installed, later calls
/// change nothing.
pub(crate) fn init() -> Result<(), LogFormatError> {
    let format = match std::env::var(LOG_FORMAT_ENV) {
        Ok(value) => value,
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(std::env::VarError::NotUnicode(_)) => return Err(LogFormatError::NotUnicode),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    match format.trim() {
        "" | "text" => {
            use std::io::IsTerminal;
            // Colours only on a terminal: the fields' styling follows `with_ansi`.
            let ansi = std::io::stderr().is_terminal();
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(ansi)
                .event_format(TextLines { ansi })
                .with_writer(std::io::stderr)
                .try_init();
        }
        "json" => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .event_format(JsonLines)
                .with_writer(std::io::stderr)
                .try_init();
        }
        other => {
            return Err(LogFormatError::Unknown {
                format: other.to_string(),
            })
        }
    }
    Ok(())
}

/// Why [`init`] installed no subscriber: `COHORT_LOG_FORMAT` names no format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LogFormatError {
    /// The variable is not valid UTF-8.
    #[error("{LOG_FORMAT_ENV}: not valid UTF-8")]
    NotUnicode,
    /// The variable names a format other than `text` or `json`.
    #[error("{LOG_FORMAT_ENV}: {format:?} is not a log format (expected text or json)")]
    Unknown {
        /// The variable's value, trimmed.
        format: String,
    },
}

/// One JSON object per event (see the module doc).
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = serde_json::Map::new();
        let ts_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        line.insert("ts_ms".into(), ts_ms.into());
        line.insert("level".into(), event.metadata().level().to_string().into());
        if let Some(task) = TASK.get() {
            line.insert("role".into(), task.role.clone().into());
            if let Some((index, incarnation)) = task.task {
                line.insert("index".into(), index.into());
                line.insert("incarnation".into(), incarnation.into());
            }
        }
        event.record(&mut Fields(&mut line));
        let text = serde_json::Value::Object(line).to_string();
        writeln!(writer, "{text}")
    }
}

/// A readable line per event: time, level, the task, the message and its fields.
struct TextLines {
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for TextLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        WallClock.format_time(&mut writer)?;
        let level = *event.metadata().level();
        let colour = match level {
            tracing::Level::ERROR => "\x1b[31m",
            tracing::Level::WARN => "\x1b[33m",
            tracing::Level::INFO => "\x1b[32m",
            _ => "\x1b[34m",
        };
        if self.ansi {
            write!(writer, " {colour}{level:>5}\x1b[0m ")?;
        } else {
            write!(writer, " {level:>5} ")?;
        }
        match TASK.get() {
            Some(Task {
                role,
                task: Some((index, _)),
            }) => write!(writer, "{role}/{index}: ")?,
            Some(Task { role, task: None }) => write!(writer, "{role}: ")?,
            None => {}
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Collects an event's fields into the line (`message` included).
struct Fields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}
