//! TensorBoard scalar summaries: an event-file writer with no dependency beyond the standard
//! library (a leaf module).
//!
//! It owns the on-disk format TensorBoard reads: TFRecord framing ([`frame_record`]: the
//! length as u64 LE, the masked CRC-32C of the length, the data, the masked CRC-32C of the data)
//! around hand-encoded `tensorflow.Event` protobufs ([`encode_event`]). A file starts with the
//! `file_version: "brain.Event:2"` event; each [`SummaryWriter::scalar`] adds one event holding
//! one `Summary.Value { tag, simple_value }`.
//!
//! Files are named `events.out.tfevents.<unix seconds>.<hostname>.<pid>.cohort` (TensorBoard
//! picks up any file with `tfevents` in its name), one per writer, under the directory given
//! to [`SummaryWriter::create`]; `tensorboard --logdir <dir>` shows them.
//!
//! Writes are buffered and bounded: the buffer goes to the file once it holds
//! [`FLUSH_BYTES`] or [`FLUSH_EVERY`] has passed since the last flush, on [`SummaryWriter::flush`],
//! and on drop. Every IO error is returned as a [`SummaryError`] naming the file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The buffered bytes that trigger a write to the file.
pub const FLUSH_BYTES: usize = 64 * 1024;
/// The time since the last flush that triggers one (checked on each scalar).
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// The `file_version` of the first event of every file (TensorBoard's current format).
pub const FILE_VERSION: &str = "brain.Event:2";

/// Why a summary could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// Creating, writing or flushing the event file (or its directory) failed.
    #[error("summary event file {path}: cannot {action}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The error.
        source: io::Error,
    },
    /// A scalar was given an empty tag.
    #[error("summary event file {path}: a scalar's tag must not be empty (step {step})")]
    EmptyTag {
        /// The file.
        path: PathBuf,
        /// The scalar's step.
        step: u64,
    },
}

/// Writes scalar summaries to one TensorBoard event file (see the module doc).
#[derive(Debug)]
pub struct SummaryWriter {
    path: PathBuf,
    file: File,
    buffer: Vec<u8>,
    last_flush: Instant,
}

impl SummaryWriter {
    /// Creates `dir` (and its parents) and a new event file in it, and writes the file's first
    /// event (`file_version`) to disk.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self, SummaryError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| SummaryError::Io {
            path: dir.to_path_buf(),
            action: "create the directory",
            source,
        })?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let base = format!(
            "events.out.tfevents.{}.{}.{}.cohort",
            now.as_secs(),
            hostname(),
            std::process::id()
        );
        // Two writers of one process in one directory within a second get distinct names.
        let mut attempt = 0u32;
        let (path, file) = loop {
            let name = if attempt == 0 {
                base.clone()
            } else {
                format!("{base}.{attempt}")
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(source) => {
                    return Err(SummaryError::Io {
                        path,
                        action: "create",
                        source,
                    })
                }
            }
        };
        let mut writer = Self {
            path,
            file,
            buffer: Vec::with_capacity(1024),
            last_flush: Instant::now(),
        };
        let event = encode_event(wall_time(), 0, &EventBody::FileVersion(FILE_VERSION));
        writer.buffer.extend_from_slice(&frame_record(&event));
        writer.flush()?;
        Ok(writer)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds the scalar `tag` = `value` at `step` (stored as a 32-bit float, as TensorBoard's
    /// `simple_value` is).
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> Result<(), SummaryError> {
        if tag.is_empty() {
            return Err(SummaryError::EmptyTag {
                path: self.path.clone(),
                step,
            });
        }
        let event = encode_event(
            wall_time(),
            step,
            &EventBody::Scalar {
                tag,
                value: value as f32,
            },
        );
        self.buffer.extend_from_slice(&frame_record(&event));
        if self.buffer.len() >= FLUSH_BYTES || self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> Result<(), SummaryError> {
        self.last_flush = Instant::now();
        if self.buffer.is_empty() {
            return Ok(());
        }
        // The buffer is dropped even when the write fails: a full disk must not grow it.
        let bytes = std::mem::take(&mut self.buffer);
        self.file
            .write_all(&bytes)
            .and_then(|()| self.file.flush())
            .map_err(|source| SummaryError::Io {
                path: self.path.clone(),
                action: "write",
                source,
            })
    }
}

impl Drop for SummaryWriter {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("{e}");
        }
    }
}

/// Where a job's summaries of `run` (`train` for the chief, `eval` for the evaluator) go:
/// `<checkpoint_dir>/logs/<run>`, so that `tensorboard --logdir <checkpoint_dir>/logs` shows
/// both runs side by side.
pub fn logs_dir(checkpoint_dir: &Path, run: &str) -> PathBuf {
    checkpoint_dir.join("logs").join(run)
}

/// A job's summaries, which must never stop training or evaluation: the first failure (to
/// create the file or to write it) is logged as a warning naming the file, and no more is
/// written after it.
#[derive(Debug)]
pub struct JobSummaries {
    writer: Option<SummaryWriter>,
}

impl JobSummaries {
    /// A new event file under `dir` (see [`SummaryWriter::create`]), or none after a warning.
    pub fn create(dir: &Path) -> Self {
        match SummaryWriter::create(dir) {
            Ok(writer) => Self {
                writer: Some(writer),
            },
            Err(e) => {
                tracing::warn!("TensorBoard summaries off: {e}");
                Self { writer: None }
            }
        }
    }

    /// The event file, while it is being written.
    pub fn path(&self) -> Option<&Path> {
        self.writer.as_ref().map(SummaryWriter::path)
    }

    /// Writes `scalars` at `step` and flushes them to the file (so TensorBoard sees them now).
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) {
        let Some(writer) = self.writer.as_mut() else {
            return;
        };
        let written = scalars
            .iter()
            .try_for_each(|(tag, value)| writer.scalar(tag, step, *value))
            .and_then(|()| writer.flush());
        if let Err(e) = written {
            tracing::warn!("TensorBoard summaries off: {e}");
            self.writer = None;
        }
    }
}

/// What an event carries besides its wall time and step.
#[derive(Debug, Clone, Copy)]
pub enum EventBody<'a> {
    /// `file_version` (field 3): the first event of a file.
    FileVersion(&'a str),
    /// `summary` (field 5) with one value: `tag` (1) and `simple_value` (2).
    Scalar {
        /// The value's tag.
        tag: &'a str,
        /// The value.
        value: f32,
    },
}

/// The protobuf bytes of a `tensorflow.Event`: `wall_time` (1, double), `step` (2, int64) and
/// the body.
pub fn encode_event(wall_time: f64, step: u64, body: &EventBody<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(0x09); // field 1, 64-bit
    out.extend_from_slice(&wall_time.to_le_bytes());
    out.push(0x10); // field 2, varint
    put_varint(&mut out, step.min(i64::MAX as u64));
    match body {
        EventBody::FileVersion(version) => {
            out.push(0x1a); // field 3, length-delimited
            put_bytes(&mut out, version.as_bytes());
        }
        EventBody::Scalar { tag, value } => {
            let mut val = Vec::with_capacity(tag.len() + 8);
            val.push(0x0a); // Value.tag (1)
            put_bytes(&mut val, tag.as_bytes());
            val.push(0x15); // Value.simple_value (2), 32-bit
            val.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::with_capacity(val.len() + 4);
            summary.push(0x0a); // Summary.value (1)
            put_bytes(&mut summary, &val);
            out.push(0x2a); // Event.summary (5)
            put_bytes(&mut out, &summary);
        }
    }
    out
}

/// One TFRecord: length (u64 LE), masked CRC-32C of the length, data, masked CRC-32C of the data.
pub fn frame_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// TFRecord's masked CRC: the CRC-32C rotated right by 15 bits plus a constant (so that a CRC
/// of data that holds CRCs is not itself trivially related to them).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name for the file name (`HOSTNAME`, else the kernel's, else `localhost`),
/// with anything but ASCII letters, digits, `-` and `_` replaced by `_`.
fn hostname() -> String {
    let name = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".into());
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // The CRC catalogue's check value of CRC-32C, and RFC 3720's 32 zero bytes.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn the_mask_rotates_and_adds_the_constant() {
        // The CRC-32C of "123456789" is 0xe306_9283; rotated right by 15 bits and added to
        // 0xa282_ead8 (TensorFlow's mask) it is:
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn a_record_is_length_crc_data_crc() {
        let record = frame_record(b"abc");
        assert_eq!(record.len(), 8 + 4 + 3 + 4);
        assert_eq!(&record[..8], &3u64.to_le_bytes());
        assert_eq!(
            &record[8..12],
            &masked_crc32c(&3u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&record[12..15], b"abc");
        assert_eq!(&record[15..], &masked_crc32c(b"abc").to_le_bytes());
        // An empty record, with the CRCs that TensorBoard's own `masked_crc32c` gives.
        let empty = frame_record(b"");
        assert_eq!(
            empty,
            [0, 0, 0, 0, 0, 0, 0, 0, 0x29, 0x03, 0x98, 0x07, 0xd8, 0xea, 0x82, 0xa2]
        );
    }

    #[test]
    fn the_file_version_event_is_encoded_field_by_field() {
        let bytes = encode_event(1.5, 0, &EventBody::FileVersion(FILE_VERSION));
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 0x00, 0x1a, 13]);
        expected.extend_from_slice(b"brain.Event:2");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_scalar_event_nests_summary_and_value() {
        let bytes = encode_event(
            2.0,
            300,
            &EventBody::Scalar {
                tag: "loss",
                value: 0.25,
            },
        );
        let mut expected = vec![0x09];
        expected.extend_from_slice(&2.0f64.to_le_bytes());
        // step 300 as a varint: 0xac 0x02.
        expected.extend_from_slice(&[0x10, 0xac, 0x02]);
        // summary (5): 13 bytes = value (1): 11 bytes = tag "loss" (6) + simple_value (5).
        expected.extend_from_slice(&[0x2a, 13, 0x0a, 11, 0x0a, 4]);
        expected.extend_from_slice(b"loss");
        expected.push(0x15);
        expected.extend_from_slice(&0.25f32.to_le_bytes());
        assert_eq!(bytes, expected);
    }

    #[test]
    fn an_empty_tag_is_an_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("cohort-summary-unit-{}", std::process::id()));
        let mut writer = SummaryWriter::create(&dir).unwrap();
        let err = writer.scalar("", 3, 1.0).unwrap_err().to_string();
        assert!(err.contains("tag") && err.contains("step 3"), "{err}");
        assert!(err.contains(&writer.path().display().to_string()), "{err}");
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
