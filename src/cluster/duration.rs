//! Human durations in config: `"30s"`, `"500ms"`, `"2m"`, `"1h"`, `"1m30s"` (the `humantime`
//! crate's syntax: also `"1day"`, `"2h 30m"`, ...), and the range each duration key accepts
//! ([`DurationRange`]).
//!
//! A duration is parsed exactly (whole milliseconds: a finer one is refused, no overflow) and
//! then checked against its key's range, so that an absurd value (`"5124095576030h"`) is refused where it is read, with
//! the key and the allowed range, instead of overflowing a deadline or a transport setting
//! later on.

use std::fmt;
use std::time::Duration;

use super::ClusterError;

/// The durations a key accepts, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DurationRange {
    /// The shortest accepted value.
    pub min: Duration,
    /// The longest accepted value.
    pub max: Duration,
}

impl DurationRange {
    /// From `min` to `max`, both included.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// Whether `d` is in the range.
    pub fn contains(&self, d: Duration) -> bool {
        self.min <= d && d <= self.max
    }
}

impl fmt::Display for DurationRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} to {}", human(self.min), human(self.max))
    }
}

/// Parses a duration such as `"30s"`, `"250ms"`, `"1m30s"`; `key` names the config key in errors.
/// Any value up to `u64::MAX` milliseconds is accepted: a key with a range uses
/// [`parse_duration_in`].
pub fn parse_duration(key: &str, text: &str) -> Result<Duration, ClusterError> {
    parse_duration_in(
        key,
        text,
        DurationRange::new(Duration::ZERO, Duration::from_millis(u64::MAX)),
    )
}

/// Parses a duration as [`parse_duration`] does and checks it against `range`. An error names
/// `key`, the value as given and the range; a value too large to represent is out of range
/// too, never an overflow.
pub fn parse_duration_in(
    key: &str,
    text: &str,
    range: DurationRange,
) -> Result<Duration, ClusterError> {
    let bad = |detail: String| ClusterError::BadValue {
        key: key.to_string(),
        detail,
    };
    let out_of_range = || bad(format!("{text:?} is out of range (allowed: {range})"));
    let total_ms = match parse_ms(text) {
        Ok(ms) => ms,
        Err(Unparsed::TooLarge) => return Err(out_of_range()),
        Err(Unparsed::Syntax(why)) => {
            return Err(bad(format!(
                "{text:?} is not a duration ({why}; e.g. \"30s\", \"500ms\", \"1m30s\")"
            )))
        }
    };
    let duration = u64::try_from(total_ms)
        .map(Duration::from_millis)
        .map_err(|_| out_of_range())?;
    if duration.is_zero() && !range.min.is_zero() {
        return Err(bad(format!(
            "{text:?} must be more than zero (allowed: {range})"
        )));
    }
    if !range.contains(duration) {
        return Err(out_of_range());
    }
    Ok(duration)
}

/// Formats a duration the way [`parse_duration`] reads it (`"1500ms"`, `"30s"`).
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Why a text is not a number of milliseconds.
enum Unparsed {
    /// Not a duration at all.
    Syntax(NotADuration),
    /// A duration, but more milliseconds than any range allows.
    TooLarge,
}

/// Why a text is not a duration at all.
#[derive(Debug, thiserror::Error)]
enum NotADuration {
    /// Nothing but blanks.
    #[error("empty")]
    Empty,
    /// `humantime` refused it (a unit missing or unknown, a stray character).
    #[error(transparent)]
    Humantime(humantime::DurationError),
    /// Finer than a whole millisecond.
    #[error("finer than a millisecond, the finest a setting takes")]
    SubMillisecond,
}

/// The milliseconds `text` spells, exactly (`humantime`'s syntax; a unit is required).
fn parse_ms(text: &str) -> Result<u128, Unparsed> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(Unparsed::Syntax(NotADuration::Empty));
    }
    let duration = humantime::parse_duration(trimmed).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => Unparsed::TooLarge,
        other => Unparsed::Syntax(NotADuration::Humantime(other)),
    })?;
    if duration.subsec_nanos() % 1_000_000 != 0 {
        return Err(Unparsed::Syntax(NotADuration::SubMillisecond));
    }
    Ok(duration.as_millis())
}

/// `d` in its largest whole unit (`"720h"`, `"90s"`, `"10ms"`), for messages.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_string(),
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!(parse_duration("k", "30s").unwrap(), Duration::from_secs(30));
        assert_eq!(
            parse_duration("k", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_duration("k", "1m30s").unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            parse_duration("k", "2h").unwrap(),
            Duration::from_secs(7200)
        );
    }

    #[test]
    fn rejects_with_key_named() {
        for text in ["", "30", "s", "3x", "-1s", "99999999999999999999999h"] {
            let err = parse_duration("checkpoint.every", text).unwrap_err();
            assert!(err.to_string().starts_with("checkpoint.every:"), "{err}");
        }
    }

    #[test]
    fn format_round_trips() {
        for ms in [0u64, 1, 999, 1000, 30_000, 90_500] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration("k", &format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn a_range_refuses_values_outside_it_naming_key_value_and_range() {
        let range = DurationRange::new(Duration::from_millis(10), Duration::from_secs(3600));
        assert_eq!(
            parse_duration_in("k", "1h", range).unwrap(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            parse_duration_in("k", "10ms", range).unwrap(),
            Duration::from_millis(10)
        );
        for text in [
            "1h1ms",
            "9ms",
            "5124095576030h",
            "18446744073709551616ms",
            "99999999999999999999999999999999999999999999h",
        ] {
            let err = parse_duration_in("COHORT_X", text, range)
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!("COHORT_X: {text:?} is out of range (allowed: 10ms to 1h)")
            );
        }
        let err = parse_duration_in("k", "0s", range).unwrap_err().to_string();
        assert!(
            err.contains("must be more than zero (allowed: 10ms to 1h)"),
            "{err}"
        );
    }
}
