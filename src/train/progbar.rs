//! Keras 3's progress bar ([`Progbar`]): what training shows while it runs.
//!
//! On a terminal, a bar redrawn in place after each step (Keras' `verbose=1`):
//!
//! ```text
//! Epoch 1/5
//!  12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 8ms/step - loss: 0.4321 - accuracy: 0.9100
//! ```
//!
//! with the time left (ETA) while the epoch runs and the time the epoch took once it ends.
//! Elsewhere (a pipe, a log file), one line per epoch (Keras' `verbose=2`):
//! `100/100 - 3s - 30ms/step - loss: 0.4321`, written to the output, or, when a `tracing`
//! subscriber is installed (every cohort process has one), as an event so that JSON logs stay
//! one object per line. The formatting follows Keras 3's `keras/src/utils/progbar.py`: a bar
//! of 20 cells, the step count right-aligned to the target's width, time per step in `s`, `ms`
//! or `us` as the duration asks, metrics in the order first given, four decimals (or four
//! significant digits in exponent form below 1e-3).

use std::fmt::{self, Write as _};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How [`Progbar`] shows itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgbarMode {
    /// A bar when the output is a terminal, one line per epoch otherwise.
    #[default]
    Auto,
    /// A bar redrawn in place after each step (Keras' `verbose=1`).
    Bar,
    /// One line per epoch (Keras' `verbose=2`).
    Lines,
    /// Nothing (Keras' `verbose=0`).
    Silent,
}

/// Cells of the bar (Keras' default `width`).
pub const BAR_WIDTH: usize = 20;

/// Keras' minimum time between two redraws of the bar (`interval`).
const REDRAW_INTERVAL: Duration = Duration::from_millis(50);

/// Where the epoch lines and the bar go.
enum Output {
    /// Written as text (the bar always is).
    Writer(Box<dyn Write + Send>),
    /// Epoch lines as `tracing` events (info, with `epoch`, `epochs` and `steps`: the epoch's).
    Tracing,
}

/// Training progress, Keras 3 style (see the module doc).
///
/// Calling protocol, per epoch: [`Progbar::begin_epoch`], then [`Progbar::update`] after each
/// step, then [`Progbar::end_epoch`]. Metric values are shown as given (pass running means).
/// Writing errors are returned, never panics.
pub struct Progbar {
    out: Output,
    bar: bool,
    silent: bool,
    color: bool,
    epoch: usize,
    epochs: usize,
    target: Option<usize>,
    timing: StepTiming,
    last_draw: Option<Instant>,
    prev_width: usize,
}

impl Progbar {
    /// Progress on standard error: a bar when it is a terminal; otherwise epoch lines, as
    /// `tracing` events when a subscriber is installed, as text on standard error if not.
    pub fn stderr(mode: ProgbarMode) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let mut progbar = Self::to_writer(Box::new(std::io::stderr()), mode, terminal);
        progbar.color = terminal;
        if !progbar.bar && tracing::dispatcher::has_been_set() {
            progbar.out = Output::Tracing;
        }
        progbar
    }

    /// Progress written to `out` (no colours); `is_terminal` tells `Auto` which form to take.
    pub fn to_writer(out: Box<dyn Write + Send>, mode: ProgbarMode, is_terminal: bool) -> Self {
        let (bar, silent) = match mode {
            ProgbarMode::Auto => (is_terminal, false),
            ProgbarMode::Bar => (true, false),
            ProgbarMode::Lines => (false, false),
            ProgbarMode::Silent => (false, true),
        };
        Self {
            out: Output::Writer(out),
            bar,
            silent,
            color: false,
            epoch: 0,
            epochs: 0,
            target: None,
            timing: StepTiming::new(Instant::now()),
            last_draw: None,
            prev_width: 0,
        }
    }

    /// Whether steps redraw a bar.
    pub fn is_bar(&self) -> bool {
        self.bar && !self.silent
    }

    /// Starts epoch `epoch` (1-based) of `epochs`; `target` is its step count if known. Prints
    /// `Epoch 2/5` (as Keras does when there is more than one epoch).
    pub fn begin_epoch(
        &mut self,
        epoch: usize,
        epochs: usize,
        target: Option<usize>,
    ) -> std::io::Result<()> {
        self.epoch = epoch;
        self.epochs = epochs;
        self.target = target;
        self.timing = StepTiming::new(Instant::now());
        self.last_draw = None;
        self.prev_width = 0;
        if self.silent || epochs <= 1 {
            return Ok(());
        }
        match &mut self.out {
            Output::Writer(out) => {
                writeln!(out, "Epoch {epoch}/{epochs}")?;
                out.flush()
            }
            // The epoch's one event names the epoch itself.
            Output::Tracing => Ok(()),
        }
    }

    /// After step `current` (1-based) of the epoch, with the metrics so far (e.g.
    /// `[("loss", 0.43)]`). Redraws the bar at most every 50 ms; nothing in line mode.
    pub fn update(&mut self, current: usize, metrics: &[(&str, f64)]) -> std::io::Result<()> {
        self.update_at(current, metrics, Instant::now())
    }

    fn update_at(
        &mut self,
        current: usize,
        metrics: &[(&str, f64)],
        now: Instant,
    ) -> std::io::Result<()> {
        let per_step = self.timing.observe(current, now);
        if !self.is_bar() {
            return Ok(());
        }
        // As Keras' ProgbarLogger: steps never finalize the bar, the epoch's end does.
        if self
            .last_draw
            .is_some_and(|at| now.duration_since(at) < REDRAW_INTERVAL)
        {
            return Ok(());
        }
        let elapsed = now.duration_since(self.timing.started);
        self.draw(current, per_step, elapsed, metrics, false, now)
    }

    /// Ends the epoch after `steps` steps with its final metrics: the bar's last redraw (full,
    /// with the time the epoch took) and a newline, or the epoch's line.
    pub fn end_epoch(&mut self, steps: usize, metrics: &[(&str, f64)]) -> std::io::Result<()> {
        self.end_epoch_at(steps, metrics, Instant::now())
    }

    fn end_epoch_at(
        &mut self,
        steps: usize,
        metrics: &[(&str, f64)],
        now: Instant,
    ) -> std::io::Result<()> {
        if self.silent {
            return Ok(());
        }
        // As Keras' ProgbarLogger: an epoch of unknown length ends as a full bar of its steps.
        self.target = Some(steps);
        let per_step = self.timing.observe(steps, now);
        let elapsed = now.duration_since(self.timing.started);
        if self.bar {
            return self.draw(steps, per_step, elapsed, metrics, true, now);
        }
        let line = epoch_line(steps, steps, elapsed, per_step, metrics);
        match &mut self.out {
            Output::Writer(out) => {
                writeln!(out, "{line}")?;
                out.flush()
            }
            Output::Tracing => {
                tracing::info!(
                    epoch = self.epoch,
                    epochs = self.epochs,
                    steps,
                    "Epoch {}/{}: {line}",
                    self.epoch,
                    self.epochs
                );
                Ok(())
            }
        }
    }

    fn draw(
        &mut self,
        current: usize,
        per_step: Duration,
        elapsed: Duration,
        metrics: &[(&str, f64)],
        finished: bool,
        now: Instant,
    ) -> std::io::Result<()> {
        let Output::Writer(out) = &mut self.out else {
            return Ok(());
        };
        let line = BarLine {
            current,
            target: self.target,
            per_step,
            elapsed,
            finished,
            metrics,
        };
        let plain = line.render(false);
        let width = plain.chars().count();
        let mut text = String::with_capacity(plain.len() + 64);
        text.push('\r');
        text.push_str(&if self.color { line.render(true) } else { plain });
        // Blank what a longer previous line left behind.
        text.push_str(&" ".repeat(self.prev_width.saturating_sub(width)));
        if finished {
            text.push('\n');
        }
        out.write_all(text.as_bytes())?;
        out.flush()?;
        self.prev_width = width;
        self.last_draw = Some(now);
        Ok(())
    }
}

impl fmt::Debug for Progbar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progbar")
            .field("bar", &self.bar)
            .field("silent", &self.silent)
            .field("epoch", &self.epoch)
            .field("epochs", &self.epochs)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Keras' estimate of the time per step: the first step (compilation, warm-up) is left out
/// once there are more.
#[derive(Debug, Clone, Copy)]
struct StepTiming {
    started: Instant,
    after_first_step: Option<Instant>,
}

impl StepTiming {
    fn new(started: Instant) -> Self {
        Self {
            started,
            after_first_step: None,
        }
    }

    fn observe(&mut self, current: usize, now: Instant) -> Duration {
        if current == 0 {
            return Duration::ZERO;
        }
        let per_step = match self.after_first_step {
            Some(first) if current > 1 => {
                now.duration_since(first) / ((current - 1).min(u32::MAX as usize) as u32)
            }
            _ => now.duration_since(self.started) / (current.min(u32::MAX as usize) as u32),
        };
        if current == 1 {
            self.after_first_step = Some(now);
        }
        per_step
    }
}

/// ` 12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 8ms/step - loss: 0.4321`.
struct BarLine<'a> {
    current: usize,
    target: Option<usize>,
    per_step: Duration,
    elapsed: Duration,
    finished: bool,
    metrics: &'a [(&'a str, f64)],
}

impl BarLine<'_> {
    /// The line, with Keras' colours (bold count and time, green done cells) if `color`.
    fn render(&self, color: bool) -> String {
        let (bold, green, white, reset) = if color {
            ("\x1b[1m", "\x1b[32m", "\x1b[37m", "\x1b[0m")
        } else {
            ("", "", "", "")
        };
        let mut s = String::new();
        match self.target {
            Some(target) if target > 0 => {
                let digits = target.to_string().len();
                let done = done_cells(self.current, target);
                let _ = write!(s, "{bold}{:>digits$}/{target}{reset} ", self.current);
                if done > 0 {
                    let _ = write!(s, "{green}{}{reset}", "━".repeat(done));
                }
                let _ = write!(s, "{white}{}{reset}", "━".repeat(BAR_WIDTH - done));
            }
            _ => {
                let _ = write!(s, "{:>7}/Unknown", self.current);
            }
        }
        let time = match self.target {
            Some(target) if target > 0 && !self.finished => {
                let left = self.per_step.as_secs_f64() * target.saturating_sub(self.current) as f64;
                format_eta(left)
            }
            _ => format!("{:.0}s", self.elapsed.as_secs_f64()),
        };
        let _ = write!(
            s,
            " {bold}{time}{reset} {}",
            format_per_step(self.per_step.as_secs_f64(), "step")
        );
        push_metrics(&mut s, self.metrics);
        s
    }
}

/// Filled cells of the bar after `current` of `target` steps (never more than the bar).
fn done_cells(current: usize, target: usize) -> usize {
    // In u128: `current * BAR_WIDTH` must not overflow for any step count.
    let done = current as u128 * BAR_WIDTH as u128 / target as u128;
    done.min(BAR_WIDTH as u128) as usize
}

/// The epoch's line off a terminal (Keras' `verbose=2`):
/// `100/100 - 3s - 30ms/step - loss: 0.4321`.
fn epoch_line(
    current: usize,
    target: usize,
    elapsed: Duration,
    per_step: Duration,
    metrics: &[(&str, f64)],
) -> String {
    let digits = target.max(1).to_string().len();
    let mut s = format!(
        "{current:>digits$}/{target} - {:.0}s - {}",
        elapsed.as_secs_f64(),
        format_per_step(per_step.as_secs_f64(), "step")
    );
    push_metrics(&mut s, metrics);
    s
}

/// ` - loss: 0.4321 - accuracy: 0.9100`, in the order given.
fn push_metrics(s: &mut String, metrics: &[(&str, f64)]) {
    for (name, value) in metrics {
        let _ = write!(s, " - {name}: {}", format_metric(*value));
    }
}

/// Keras' `_format_time`: whole seconds from 1 s (and for 0), else milliseconds from 1 ms,
/// else microseconds.
fn format_per_step(secs: f64, unit: &str) -> String {
    if secs >= 1.0 || secs == 0.0 {
        format!("{secs:.0}s/{unit}")
    } else if secs >= 1e-3 {
        format!("{:.0}ms/{unit}", secs * 1e3)
    } else {
        format!("{:.0}us/{unit}", secs * 1e6)
    }
}

/// Keras' ETA: `1:02:03` past an hour, `2:03` past a minute, `42s` otherwise (truncated).
fn format_eta(secs: f64) -> String {
    let whole = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    if secs > 3600.0 {
        format!(
            "{}:{:02}:{:02}",
            whole / 3600,
            whole % 3600 / 60,
            whole % 60
        )
    } else if secs > 60.0 {
        format!("{}:{:02}", whole / 60, whole % 60)
    } else {
        format!("{whole}s")
    }
}

/// Four decimals, or Python's `.4e` (`1.2345e-05`) for magnitudes at or below 1e-3.
fn format_metric(value: f64) -> String {
    if value.abs() > 1e-3 || !value.is_finite() {
        return format!("{value:.4}");
    }
    let rust = format!("{value:.4e}");
    // Rust writes `1.2345e-5`; Python a signed exponent of at least two digits.
    match rust.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => rust,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn bar(current: usize, target: Option<usize>, per_step: Duration, finished: bool) -> String {
        BarLine {
            current,
            target,
            per_step,
            elapsed: ms(1_300),
            finished,
            metrics: &[("loss", 0.43214), ("accuracy", 0.91)],
        }
        .render(false)
    }

    #[test]
    fn the_bar_has_twenty_cells_an_eta_the_time_per_step_and_the_metrics_in_order() {
        assert_eq!(
            bar(12, Some(100), ms(8), false),
            format!(
                " 12/100 {} 0s 8ms/step - loss: 0.4321 - accuracy: 0.9100",
                "━".repeat(20)
            )
        );
        assert_eq!(done_cells(12, 100), 2);
        assert_eq!(done_cells(50, 100), 10);
        assert_eq!(done_cells(100, 100), 20);
        assert_eq!(done_cells(150, 100), 20, "never past the bar");
        assert_eq!(done_cells(usize::MAX, usize::MAX), 20, "no overflow");
    }

    #[test]
    fn the_eta_while_running_and_the_elapsed_time_once_finished() {
        // 88 steps left at 80 ms: 7.04 s, truncated as Keras' `%d`.
        assert!(bar(12, Some(100), ms(80), false).contains(" 7s 80ms/step"));
        assert!(bar(100, Some(100), ms(80), true).contains(" 1s 80ms/step"));
        assert_eq!(format_eta(42.9), "42s");
        assert_eq!(format_eta(61.0), "1:01");
        assert_eq!(format_eta(3725.0), "1:02:05");
        assert_eq!(format_eta(f64::NAN), "0s");
    }

    #[test]
    fn time_per_step_picks_seconds_milliseconds_or_microseconds_as_keras_does() {
        assert_eq!(format_per_step(0.0, "step"), "0s/step");
        assert_eq!(format_per_step(2.4, "step"), "2s/step");
        assert_eq!(format_per_step(1.0, "step"), "1s/step");
        assert_eq!(format_per_step(0.0301, "step"), "30ms/step");
        assert_eq!(format_per_step(0.001, "step"), "1ms/step");
        assert_eq!(format_per_step(0.000_25, "step"), "250us/step");
    }

    #[test]
    fn metrics_show_four_decimals_or_python_exponent_form_when_tiny() {
        assert_eq!(format_metric(0.43216), "0.4322");
        assert_eq!(format_metric(12.0), "12.0000");
        assert_eq!(format_metric(1.2345e-5), "1.2345e-05");
        assert_eq!(format_metric(-0.0005), "-5.0000e-04");
        assert_eq!(format_metric(0.0), "0.0000e+00");
        assert_eq!(format_metric(f64::NAN), "NaN");
    }

    #[test]
    fn an_unknown_target_shows_the_count_alone() {
        let line = bar(7, None, ms(8), false);
        assert!(
            line.starts_with("      7/Unknown 1s 8ms/step - loss:"),
            "{line:?}"
        );
    }

    #[test]
    fn the_line_off_a_terminal_matches_keras_verbose_2() {
        assert_eq!(
            epoch_line(100, 100, ms(3_000), ms(30), &[("loss", 0.4321)]),
            "100/100 - 3s - 30ms/step - loss: 0.4321"
        );
        assert_eq!(
            epoch_line(5, 5, ms(200), ms(40), &[]),
            "5/5 - 0s - 40ms/step"
        );
    }

    #[test]
    fn the_first_step_is_left_out_of_the_time_per_step() {
        let t0 = Instant::now();
        let mut timing = StepTiming::new(t0);
        assert_eq!(timing.observe(0, t0), Duration::ZERO);
        // A slow first step (1 s), then 10 ms steps.
        assert_eq!(timing.observe(1, t0 + ms(1_000)), ms(1_000));
        assert_eq!(timing.observe(3, t0 + ms(1_020)), ms(10));
    }

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn off_a_terminal_each_epoch_is_one_line_and_steps_write_nothing() {
        let out = Captured::default();
        let mut p = Progbar::to_writer(Box::new(out.clone()), ProgbarMode::Auto, false);
        assert!(!p.is_bar());
        let t0 = Instant::now();
        p.begin_epoch(1, 2, Some(4)).unwrap();
        p.timing = StepTiming::new(t0);
        for step in 1..=4 {
            p.update_at(step, &[("loss", 0.5)], t0 + ms(100 * step as u64))
                .unwrap();
        }
        p.end_epoch_at(4, &[("loss", 0.5)], t0 + ms(400)).unwrap();
        assert_eq!(
            out.text(),
            "Epoch 1/2\n4/4 - 0s - 100ms/step - loss: 0.5000\n"
        );
    }

    #[test]
    fn on_a_terminal_the_bar_is_redrawn_in_place_and_padded_over_a_longer_line() {
        let out = Captured::default();
        let mut p = Progbar::to_writer(Box::new(out.clone()), ProgbarMode::Auto, true);
        assert!(p.is_bar());
        let t0 = Instant::now();
        p.begin_epoch(1, 1, Some(2)).unwrap();
        p.timing = StepTiming::new(t0);
        p.update_at(1, &[("loss", 10.0), ("accuracy", 0.5)], t0 + ms(100))
            .unwrap();
        // Within the redraw interval: not drawn; the epoch's end always is.
        p.update_at(2, &[("loss", 1.0)], t0 + ms(110)).unwrap();
        p.end_epoch_at(2, &[("loss", 1.0)], t0 + ms(120)).unwrap();
        let text = out.text();
        let draws: Vec<&str> = text.split('\r').filter(|d| !d.is_empty()).collect();
        assert_eq!(draws.len(), 2, "{text:?}");
        assert!(!text.contains("Epoch"), "one epoch: no header, as Keras");
        assert_eq!(
            draws[0],
            format!(
                "1/2 {} 0s 100ms/step - loss: 10.0000 - accuracy: 0.5000",
                "━".repeat(BAR_WIDTH)
            )
        );
        // The shorter final line blanks what the longer first one left.
        let last = format!("2/2 {} 0s 20ms/step - loss: 1.0000", "━".repeat(BAR_WIDTH));
        assert!(draws[1].starts_with(&last), "{:?}", draws[1]);
        assert_eq!(draws[1].chars().count(), draws[0].chars().count() + 1);
        assert!(draws[1].ends_with(" \n"), "{:?}", draws[1]);
    }

    #[test]
    fn silent_writes_nothing() {
        let out = Captured::default();
        let mut p = Progbar::to_writer(Box::new(out.clone()), ProgbarMode::Silent, true);
        assert!(!p.is_bar());
        p.begin_epoch(1, 3, Some(1)).unwrap();
        p.update(1, &[("loss", 0.1)]).unwrap();
        p.end_epoch(1, &[("loss", 0.1)]).unwrap();
        assert_eq!(out.text(), "");
    }
}
