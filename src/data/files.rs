//! The file-backed source: CSV records, one element per line.
//!
//! Format: UTF-8 text, one record per line (`\n` or `\r\n`), fields separated by a one-byte
//! delimiter (`,` by default), numbers only. A [`CsvFormat`] lists the components of an
//! element; component `k` of shape `s` takes the next `product(s)` fields, in row-major order
//! (a scalar component takes one field). Blank lines are skipped; an optional header line is
//! skipped. A line longer than `line_bytes_max` or with the wrong number of fields is an error
//! naming the file and line, and reading goes on with the next line.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};

use super::spec::{Element, TensorSpec};
use super::DataError;

/// How a CSV line becomes an element (see the module docs for the format).
///
/// ```
/// use candle_core::DType;
/// use cohort::data::{CsvComponent, CsvFormat, Dataset};
///
/// let dir = std::env::temp_dir().join(format!("cohort-csv-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("a.csv");
/// std::fs::write(&path, "x0,x1,label\n1.5,2.5,1\n3.5,4.5,0\n")?;
/// // features: two f32 columns as one [2] tensor; label: an i64 scalar.
/// let format = CsvFormat::new(vec![
///     CsvComponent::new(vec![2], DType::F32),
///     CsvComponent::new(vec![], DType::I64),
/// ])
/// .with_header(true);
/// let ds = Dataset::csv_files(vec![path], format);
/// let rows: Vec<_> = ds.iter().collect::<Result<_, _>>()?;
/// assert_eq!(rows.len(), 2);
/// assert_eq!(rows[1][0].to_vec1::<f32>()?, vec![3.5, 4.5]);
/// assert_eq!(rows[1][1].to_scalar::<i64>()?, 0);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CsvFormat {
    /// The components of an element, in column order.
    pub components: Vec<CsvComponent>,
    /// The field separator (one byte, e.g. `b','` or `b'\t'`).
    pub delimiter: u8,
    /// Whether each file's first line is a header to skip.
    pub header: bool,
    /// Longest line accepted, in bytes (without its line ending).
    pub line_bytes_max: usize,
}

/// One component of a CSV record: its shape and element type (`F32`, `F64` or `I64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvComponent {
    /// The component's shape; `vec![]` for a scalar.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
}

impl CsvComponent {
    /// A component of the given shape and dtype.
    pub fn new(shape: Vec<usize>, dtype: DType) -> Self {
        Self { shape, dtype }
    }

    fn fields(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }
}

impl CsvFormat {
    /// A comma-separated format without header, lines up to [`CsvFormat::LINE_BYTES_MAX`].
    pub fn new(components: Vec<CsvComponent>) -> Self {
        Self {
            components,
            delimiter: b',',
            header: false,
            line_bytes_max: Self::LINE_BYTES_MAX,
        }
    }

    /// One scalar component per column, of the given dtypes (like TF's `CsvDataset` with
    /// `record_defaults`).
    pub fn scalars(dtypes: &[DType]) -> Self {
        Self::new(
            dtypes
                .iter()
                .map(|&d| CsvComponent::new(vec![], d))
                .collect(),
        )
    }

    /// The same format with another delimiter.
    pub fn with_delimiter(mut self, delimiter: u8) -> Self {
        self.delimiter = delimiter;
        self
    }

    /// The same format, skipping (or not) a header line in each file.
    pub fn with_header(mut self, header: bool) -> Self {
        self.header = header;
        self
    }

    /// The element spec of the records (every dimension known).
    pub fn element_spec(&self) -> Vec<TensorSpec> {
        self.components
            .iter()
            .map(|c| TensorSpec::new(c.shape.iter().map(|&d| Some(d)).collect(), c.dtype))
            .collect()
    }

    /// Parses one record (a line without its ending) into an element.
    pub fn parse_record(&self, line: &str) -> Result<Element, CsvRecordError> {
        let delimiter = char::from(self.delimiter);
        let mut fields = line.split(delimiter).map(str::trim);
        let mut element = Vec::with_capacity(self.components.len());
        let expected = self.total_fields().unwrap_or(usize::MAX);
        let mut seen = 0usize;
        for component in &self.components {
            let n = component.fields().unwrap_or(usize::MAX);
            let mut take = |seen: &mut usize| -> Result<&str, CsvRecordError> {
                *seen += 1;
                fields.next().ok_or(CsvRecordError::FieldCount {
                    found: *seen - 1,
                    expected,
                })
            };
            let tensor = match component.dtype {
                DType::F32 => {
                    let v = (0..n)
                        .map(|_| parse_field::<f32>(take(&mut seen)?))
                        .collect::<Result<Vec<_>, _>>()?;
                    Tensor::from_vec(v, component.shape.clone(), &Device::Cpu)
                }
                DType::F64 => {
                    let v = (0..n)
                        .map(|_| parse_field::<f64>(take(&mut seen)?))
                        .collect::<Result<Vec<_>, _>>()?;
                    Tensor::from_vec(v, component.shape.clone(), &Device::Cpu)
                }
                DType::I64 => {
                    let v = (0..n)
                        .map(|_| parse_field::<i64>(take(&mut seen)?))
                        .collect::<Result<Vec<_>, _>>()?;
                    Tensor::from_vec(v, component.shape.clone(), &Device::Cpu)
                }
                other => return Err(CsvRecordError::UnsupportedDtype(other)),
            }?;
            element.push(tensor);
        }
        let extra = fields.count();
        if extra > 0 {
            return Err(CsvRecordError::FieldCount {
                found: seen + extra,
                expected,
            });
        }
        Ok(element)
    }

    /// Longest line accepted by default: 1 MiB.
    pub const LINE_BYTES_MAX: usize = 1 << 20;

    pub(crate) fn validate(&self) -> Result<(), DataError> {
        let op = "csv_files";
        if self.components.is_empty() {
            return Err(DataError::invalid(op, "the format has no components"));
        }
        if self.line_bytes_max == 0 {
            return Err(DataError::invalid(op, "line_bytes_max must be at least 1"));
        }
        if !self.delimiter.is_ascii() || matches!(self.delimiter, b'\n' | b'\r') {
            return Err(DataError::invalid(
                op,
                "the delimiter must be an ASCII byte other than a line ending",
            ));
        }
        for (i, c) in self.components.iter().enumerate() {
            if !matches!(c.dtype, DType::F32 | DType::F64 | DType::I64) {
                return Err(DataError::invalid(
                    op,
                    format!(
                        "component {i} has dtype {:?}; CSV reads f32, f64, i64",
                        c.dtype
                    ),
                ));
            }
        }
        match self.total_fields() {
            // Every field takes at least one byte plus a delimiter.
            Some(n) if n <= self.line_bytes_max => Ok(()),
            _ => Err(DataError::invalid(
                op,
                "the components need more fields than a line of line_bytes_max can hold",
            )),
        }
    }

    fn total_fields(&self) -> Option<usize> {
        self.components
            .iter()
            .try_fold(0usize, |acc, c| acc.checked_add(c.fields()?))
    }
}

/// Why a CSV line is not a record of its [`CsvFormat`] ([`DataError::Parse`] carries it, with
/// the file and the line).
#[derive(Debug, thiserror::Error)]
pub enum CsvRecordError {
    /// The line has more or fewer fields than the format's components take.
    #[error("{found} field(s), expected {expected}")]
    FieldCount {
        /// Fields found (up to the first one missing).
        found: usize,
        /// Fields the format takes.
        expected: usize,
    },
    /// A field is not a number of its component's type.
    #[error("field {field:?} is not a {type_name}")]
    BadField {
        /// The field, trimmed.
        field: String,
        /// The type it should be.
        type_name: &'static str,
    },
    /// A component's dtype is not one CSV reads (`validate` refuses such a format).
    #[error("unsupported dtype {0:?}")]
    UnsupportedDtype(DType),
    /// The values do not make a tensor of the component's shape.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    /// The line is not UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
    /// The line is longer than the format's `line_bytes_max`.
    #[error("line longer than line_bytes_max ({line_bytes_max} bytes); rest of file skipped")]
    LineTooLong {
        /// The limit.
        line_bytes_max: usize,
    },
}

/// Reads the records of a list of files, in order, lazily.
pub(crate) struct CsvIter {
    files: Vec<PathBuf>,
    format: CsvFormat,
    next_file: usize,
    reader: Option<BufReader<File>>,
    line: u64,
    buf: Vec<u8>,
}

impl CsvIter {
    pub(crate) fn new(files: Vec<PathBuf>, format: CsvFormat) -> Self {
        Self {
            files,
            format,
            next_file: 0,
            reader: None,
            line: 0,
            buf: Vec::new(),
        }
    }

    fn path(&self) -> PathBuf {
        self.files
            .get(self.next_file.saturating_sub(1))
            .cloned()
            .unwrap_or_default()
    }
}

impl Iterator for CsvIter {
    type Item = Result<Element, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(reader) = self.reader.as_mut() else {
                let path = self.files.get(self.next_file)?.clone();
                self.next_file += 1;
                self.line = 0;
                match File::open(&path) {
                    Ok(f) => self.reader = Some(BufReader::new(f)),
                    Err(source) => return Some(Err(DataError::Io { path, source })),
                }
                continue;
            };
            self.buf.clear();
            // Bounded read: never buffer more than one line of line_bytes_max (SEC-1).
            let limit = (self.format.line_bytes_max as u64).saturating_add(2);
            let read = reader.by_ref().take(limit).read_until(b'\n', &mut self.buf);
            let n = match read {
                Ok(n) => n,
                Err(source) => {
                    self.reader = None;
                    return Some(Err(DataError::Io {
                        path: self.path(),
                        source,
                    }));
                }
            };
            if n == 0 {
                self.reader = None;
                continue;
            }
            self.line += 1;
            let ended = self.buf.last() == Some(&b'\n');
            if ended {
                self.buf.pop();
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
            }
            if self.buf.len() > self.format.line_bytes_max {
                // The rest of this line cannot be found reliably: give up on the file.
                self.reader = None;
                return Some(Err(DataError::Parse {
                    path: self.path(),
                    line: self.line,
                    reason: CsvRecordError::LineTooLong {
                        line_bytes_max: self.format.line_bytes_max,
                    }
                    .to_string(),
                }));
            }
            if self.format.header && self.line == 1 {
                continue;
            }
            let parsed = std::str::from_utf8(&self.buf)
                .map_err(|_| CsvRecordError::NotUtf8)
                .and_then(|text| {
                    if text.trim().is_empty() {
                        Ok(None)
                    } else {
                        self.format.parse_record(text).map(Some)
                    }
                });
            match parsed {
                Ok(None) => continue,
                Ok(Some(element)) => return Some(Ok(element)),
                Err(reason) => {
                    return Some(Err(DataError::Parse {
                        path: self.path(),
                        line: self.line,
                        reason: reason.to_string(),
                    }))
                }
            }
        }
    }
}

fn parse_field<T: std::str::FromStr>(field: &str) -> Result<T, CsvRecordError> {
    field.parse().map_err(|_| CsvRecordError::BadField {
        field: field.to_string(),
        type_name: std::any::type_name::<T>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_components_in_column_order() {
        let format = CsvFormat::new(vec![
            CsvComponent::new(vec![2, 2], DType::F64),
            CsvComponent::new(vec![], DType::I64),
        ]);
        let e = format.parse_record("1, 2, 3, 4, 7").unwrap();
        assert_eq!(e[0].dims(), &[2, 2]);
        assert_eq!(
            e[0].to_vec2::<f64>().unwrap(),
            vec![vec![1., 2.], vec![3., 4.]]
        );
        assert_eq!(e[1].to_scalar::<i64>().unwrap(), 7);
    }

    #[test]
    fn wrong_field_counts_and_bad_numbers_are_errors() {
        let format = CsvFormat::scalars(&[DType::F32, DType::I64]);
        let err = format.parse_record("1.0").unwrap_err();
        assert!(
            matches!(
                err,
                CsvRecordError::FieldCount {
                    found: 1,
                    expected: 2
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("expected 2"), "{err}");
        let err = format.parse_record("1.0,2,3").unwrap_err();
        assert!(
            matches!(
                err,
                CsvRecordError::FieldCount {
                    found: 3,
                    expected: 2
                }
            ),
            "{err}"
        );
        let err = format.parse_record("1.0,x").unwrap_err();
        assert!(
            matches!(&err, CsvRecordError::BadField { field, .. } if field == "x"),
            "{err}"
        );
        assert!(err.to_string().contains("\"x\""), "{err}");
        assert!(format.parse_record("1.0,2.5").is_err());
    }

    #[test]
    fn largest_line_limit_reads_without_overflow() {
        // `line_bytes_max + 2` used to overflow (a panic in debug builds) for the largest
        // limit a caller may configure.
        let dir = std::env::temp_dir().join(format!("cohort-csv-max-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.csv");
        std::fs::write(&path, "1,2\n3,4\n").unwrap();
        let mut format = CsvFormat::scalars(&[DType::I64, DType::I64]);
        format.line_bytes_max = usize::MAX;
        format.validate().unwrap();
        let rows: Vec<_> = CsvIter::new(vec![path], format)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1][0].to_scalar::<i64>().unwrap(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unsupported_dtype_is_rejected_by_validate() {
        let format = CsvFormat::scalars(&[DType::U8]);
        assert!(matches!(
            format.validate(),
            Err(DataError::InvalidArgument { .. })
        ));
    }
}
