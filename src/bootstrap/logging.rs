//! How a role process reports: `tracing` events on stderr, as text (the default) or, with
//! `COHORT_LOG_FORMAT=json`, one JSON object per line carrying the task's role, index and
//! incarnation, for a log collector. `RUST_LOG` filters as usual (default: warnings).
//!
//! A JSON line: `{"ts_ms": <unix ms>, "level": "INFO", "role": "ps", "index": 0,
//! "incarnation": 1795…, "message": "…", <the event's other fields>}` (role, index and
//! incarnation once the task is known, [`set_task`]).

use std::fmt;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Environment variable choosing the log format: `text` (default) or `json`.
pub const LOG_FORMAT_ENV: &str = "COHORT_LOG_FORMAT";

/// The task this process runs, stamped on every JSON line once known.
static TASK: OnceLock<(String, u32, u64)> = OnceLock::new();

/// Records the task (role, index, incarnation) for the JSON lines from now on.
pub(crate) fn set_task(role: &str, index: u32, incarnation: u64) {
    let _ = TASK.set((role.to_string(), index, incarnation));
}

/// Installs the subscriber in the format `COHORT_LOG_FORMAT` asks for; an unknown format is
/// an error naming the variable (nothing is installed).
pub(crate) fn init() -> Result<(), String> {
    let format = match std::env::var(LOG_FORMAT_ENV) {
        Ok(value) => value,
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(format!("{LOG_FORMAT_ENV}: not valid UTF-8"))
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    match format.trim() {
        "" | "text" => {
            use std::io::IsTerminal;
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_target(false)
                .with_ansi(std::io::stderr().is_terminal())
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
            return Err(format!(
                "{LOG_FORMAT_ENV}: {other:?} is not a log format (expected text or json)"
            ))
        }
    }
    Ok(())
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
        if let Some((role, index, incarnation)) = TASK.get() {
            line.insert("role".into(), role.clone().into());
            line.insert("index".into(), (*index).into());
            line.insert("incarnation".into(), (*incarnation).into());
        }
        event.record(&mut Fields(&mut line));
        let text = serde_json::Value::Object(line).to_string();
        writeln!(writer, "{text}")
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
