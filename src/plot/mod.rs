//! PNG charts: line series against one x axis, with labelled vertical markers (the loss curve
//! the demo's chief writes beside its checkpoints; a timeline of faults against step rate).
//!
//! Drawn with `plotters`' bitmap backend into a pixel buffer, written by the `png` encoder (not
//! plotters' own encoder, which brings the `image` crate and its JPEG decoder into the
//! build); text with a font compiled into the binary
//! (`assets/fonts/DejaVuSans-subset.ttf`, printable ASCII), so that no system font,
//! fontconfig or freetype is needed. Points that are not finite are left out; an empty chart
//! is drawn with unit axes and says "no data".
//!
//! A leaf module: it names no other part of cohort.

use std::path::Path;
use std::sync::Once;

use plotters::backend::DrawingBackend;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// The font of every chart's text (see the module docs and `assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");
/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";

/// Largest chart drawn, each side, in pixels (a bound on the memory a chart takes).
pub const SIDE_MAX: u32 = 8192;
/// Smallest chart drawn, each side, in pixels (room for the axes and their labels).
pub const SIDE_MIN: u32 = 64;

/// One line of a chart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Its name, in the legend.
    pub name: String,
    /// Its points `(x, y)`, in the order drawn; those not finite are left out.
    pub points: Vec<(f64, f64)>,
}

/// A vertical line across the chart at `x`, with a label at its top.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marker {
    /// Where.
    pub x: f64,
    /// What it marks.
    pub label: String,
}

/// A chart: titled axes, line series, markers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chart {
    /// Above the plot.
    pub title: String,
    /// Under the x axis.
    pub x_label: String,
    /// Beside the y axis.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// The vertical markers.
    pub markers: Vec<Marker>,
}

/// Why a chart was not written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The size asked for is outside [`SIDE_MIN`]..=[`SIDE_MAX`].
    #[error("chart size {width}x{height}: each side must be {SIDE_MIN} to {SIDE_MAX} pixels")]
    Size {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// Drawing or writing the PNG failed (an IO error most often).
    #[error("{path}: cannot write the chart: {reason}")]
    Draw {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        reason: DrawError,
    },
}

/// What failed while a chart was drawn or written ([`PlotError::Draw`]).
#[derive(Debug, thiserror::Error)]
pub enum DrawError {
    /// plotters could not draw into the pixel buffer (a font or layout error).
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The file could not be created.
    #[error(transparent)]
    Create(#[from] std::io::Error),
    /// The PNG encoder failed (writing the file, most often).
    #[error(transparent)]
    Encode(#[from] png::EncodingError),
}

/// What plotters' bitmap backend fails with.
pub type RenderError = DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;

/// Line colours, in series order (then again).
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and known to parse; a failure would leave text undrawn
        // (plotters then reports a font error, returned as `PlotError::Draw`).
        for style in [FontStyle::Normal, FontStyle::Bold] {
            let _ = register_font(FAMILY, style, FONT);
        }
    });
}

/// The range `[lo, hi]` of `values`, widened when empty or flat, with a margin.
fn range(values: impl Iterator<Item = f64>, margin: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < f64::EPSILON * lo.abs().max(1.0) {
        let pad = (lo.abs() * 0.1).max(0.5);
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * margin;
    (lo - pad, hi + pad)
}

/// An axis label: whole numbers without decimals (steps), others with up to 4 decimals.
fn tick(value: &f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.4}");
        let text = text.trim_end_matches('0');
        text.trim_end_matches('.').to_string()
    }
}

/// Writes `chart` as a `width` x `height` PNG to `path` (replaced if it exists).
pub fn write_png(chart: &Chart, path: &Path, width: u32, height: u32) -> Result<(), PlotError> {
    if !(SIDE_MIN..=SIDE_MAX).contains(&width) || !(SIDE_MIN..=SIDE_MAX).contains(&height) {
        return Err(PlotError::Size { width, height });
    }
    register_fonts();
    let fail = |reason: DrawError| PlotError::Draw {
        path: path.display().to_string(),
        reason,
    };
    draw(chart, path, width, height).map_err(fail)
}

fn draw(chart: &Chart, path: &Path, width: u32, height: u32) -> Result<(), DrawError> {
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    draw_pixels(chart, &mut pixels, width, height)?;
    let file = std::fs::File::create(path)?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&pixels)?;
    Ok(writer.finish()?)
}

/// Draws `chart` into `pixels`, `width` x `height` RGB bytes, row by row.
fn draw_pixels(chart: &Chart, pixels: &mut [u8], width: u32, height: u32) -> Result<(), DrawError> {
    let finite: Vec<Vec<(f64, f64)>> = chart
        .series
        .iter()
        .map(|s| {
            s.points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect()
        })
        .collect();
    let markers: Vec<&Marker> = chart.markers.iter().filter(|m| m.x.is_finite()).collect();
    let empty = finite.iter().all(Vec::is_empty);
    let (x_lo, x_hi) = range(
        finite
            .iter()
            .flatten()
            .map(|p| p.0)
            .chain(markers.iter().map(|m| m.x)),
        0.0,
    );
    let (y_lo, y_hi) = range(finite.iter().flatten().map(|p| p.1), 0.05);

    let root = BitMapBackend::with_buffer(pixels, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let title_size = (height / 25).clamp(10, 28);
    let text_size = (height / 40).clamp(8, 18);
    let mut ctx = ChartBuilder::on(&root)
        .caption(&chart.title, (FAMILY, title_size))
        .margin(12)
        .x_label_area_size(text_size * 3)
        .y_label_area_size(text_size * 5)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    ctx.configure_mesh()
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .label_style((FAMILY, text_size))
        .axis_desc_style((FAMILY, text_size))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;

    for (i, (series, points)) in chart.series.iter().zip(&finite).enumerate() {
        if points.is_empty() {
            continue;
        }
        let colour = PALETTE[i % PALETTE.len()];
        ctx.draw_series(LineSeries::new(
            points.iter().copied(),
            colour.stroke_width(2),
        ))?
        .label(series.name.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    let grey = RGBColor(120, 120, 120);
    for marker in &markers {
        ctx.draw_series(LineSeries::new(
            [(marker.x, y_lo), (marker.x, y_hi)],
            grey.stroke_width(1),
        ))?;
        ctx.draw_series(std::iter::once(Text::new(
            format!(" {}", marker.label),
            (marker.x, y_hi),
            (FAMILY, text_size).into_font().color(&grey),
        )))?;
    }
    if empty {
        ctx.draw_series(std::iter::once(Text::new(
            "no data",
            ((x_lo + x_hi) / 2.0, (y_lo + y_hi) / 2.0),
            (FAMILY, title_size).into_font().color(&grey),
        )))?;
    } else if chart.series.iter().any(|s| !s.name.is_empty()) {
        ctx.configure_series_labels()
            .label_font((FAMILY, text_size))
            .background_style(WHITE.mix(0.8))
            .border_style(grey)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The width and height in a PNG's IHDR chunk.
    fn png_size(bytes: &[u8]) -> (u32, u32) {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        (be(16), be(20))
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cohort-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn a_chart_is_written_as_a_png_of_the_size_asked() {
        let path = temp("loss.png");
        let chart = Chart {
            title: "loss".into(),
            x_label: "step".into(),
            y_label: "loss".into(),
            series: vec![
                Series {
                    name: "train".into(),
                    points: (0..200)
                        .map(|i| (f64::from(i), 2.0 / (1.0 + f64::from(i) / 20.0)))
                        .collect(),
                },
                Series {
                    name: "with holes".into(),
                    points: vec![(0.0, 1.0), (50.0, f64::NAN), (100.0, f64::INFINITY)],
                },
            ],
            markers: vec![Marker {
                x: 100.0,
                label: "phase 2".into(),
            }],
        };
        write_png(&chart, &path, 640, 400).expect("write");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(png_size(&bytes), (640, 400));
        // Text was drawn: more than the few colours of lines on white.
        assert!(bytes.len() > 4000, "{} bytes", bytes.len());
    }

    #[test]
    fn empty_and_non_finite_charts_are_drawn_without_panic() {
        let path = temp("empty.png");
        write_png(&Chart::default(), &path, 300, 200).expect("empty chart");
        assert_eq!(png_size(&std::fs::read(&path).unwrap()), (300, 200));
        let flat = Chart {
            series: vec![Series {
                name: String::new(),
                points: vec![(f64::NAN, 1.0), (3.0, 5.0)],
            }],
            markers: vec![Marker {
                x: f64::NAN,
                label: "nowhere".into(),
            }],
            ..Chart::default()
        };
        write_png(&flat, &path, 300, 200).expect("one point");
    }

    #[test]
    fn bad_sizes_and_paths_are_errors_naming_them() {
        let e = write_png(&Chart::default(), &temp("x.png"), 0, 10).unwrap_err();
        assert!(e.to_string().contains("0x10"), "{e}");
        let missing = Path::new("/nonexistent-dir/cohort/loss.png");
        let e = write_png(&Chart::default(), missing, 100, 100).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent-dir/cohort/loss.png"),
            "{e}"
        );
    }
}
