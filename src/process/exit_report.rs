//! A supervisor's report that a task's process exited: the evidence that lets the chief know
//! a task is dead at once, instead of after the detection budget (DESIGN §4: the supervisor
//! reaps its children the moment they exit; the budget stays the bound for a frozen or
//! partitioned task, which no supervisor sees die).
//!
//! The channel is a Unix datagram socket that the chief binds (the `supervisor_socket` key;
//! `cohort launch` sets it to `<run_dir>/supervisor.sock`) and on which any local supervisor
//! sends one datagram per exit: `exited <task type> <index> <incarnation>`, e.g.
//! `exited worker 1 1764112233445`. The incarnation is the one the supervisor started the
//! process with (`COHORT_INCARNATION`), so a late report can never kill the incarnation that
//! replaced it: the chief's gateway declares dead only the live incarnation the report names
//! ([`cohort_actors::Gateway::report_dead`]). The socket is made readable and writable by its
//! owner only: a process that may report exits could as well have sent the signal.
//!
//! Only failures are reported (an exit with a code other than 0, or a death by a signal): a
//! task exiting 0 has finished or was drained, which the chief knows already.

use std::io;
use std::path::{Path, PathBuf};

use crate::cluster::{ClusterError, TaskId, TaskType};

/// The longest report: a report past it is not one.
const REPORT_BYTES_MAX: usize = 128;

/// The longest path a Unix socket can bind on Linux (`sun_path` less its terminating NUL).
pub const SOCKET_PATH_BYTES_MAX: usize = 107;

/// One task's process exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    /// The task.
    pub task: TaskId,
    /// The incarnation the process ran as.
    pub incarnation: u64,
}

impl ExitReport {
    /// The datagram that carries it.
    pub fn encode(&self) -> String {
        format!(
            "exited {} {} {}",
            self.task.task_type, self.task.index, self.incarnation
        )
    }

    /// Reads a datagram; the error says what is wrong with it.
    pub fn decode(datagram: &[u8]) -> Result<Self, ExitReportError> {
        if datagram.len() > REPORT_BYTES_MAX {
            return Err(ExitReportError::TooLong {
                bytes: datagram.len(),
            });
        }
        let text = std::str::from_utf8(datagram).map_err(|_| ExitReportError::NotUtf8)?;
        let words: Vec<&str> = text.split_whitespace().collect();
        let [verb, task_type, index, incarnation] = words[..] else {
            return Err(ExitReportError::NotAReport {
                text: text.to_string(),
            });
        };
        if verb != "exited" {
            return Err(ExitReportError::UnknownVerb {
                text: text.to_string(),
                verb: verb.to_string(),
            });
        }
        let task_type = TaskType::parse("task type", task_type)?;
        let index = index
            .parse::<u32>()
            .map_err(|_| ExitReportError::BadIndex {
                text: text.to_string(),
                index: index.to_string(),
            })?;
        let incarnation = incarnation
            .parse::<u64>()
            .ok()
            .filter(|&e| e > 0)
            .ok_or_else(|| ExitReportError::BadIncarnation {
                text: text.to_string(),
                incarnation: incarnation.to_string(),
            })?;
        Ok(Self {
            task: TaskId::new(task_type, index),
            incarnation,
        })
    }
}

/// Why a datagram is not an exit report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExitReportError {
    /// Longer than any report.
    #[error("a report of {bytes} bytes (at most {REPORT_BYTES_MAX})")]
    TooLong {
        /// The datagram's length.
        bytes: usize,
    },
    /// Not UTF-8 text.
    #[error("a report that is not UTF-8")]
    NotUtf8,
    /// Not four words.
    #[error("{text:?} is not `exited <task type> <index> <incarnation>`")]
    NotAReport {
        /// The datagram.
        text: String,
    },
    /// A first word other than `exited`.
    #[error("{text:?}: unknown report {verb:?} (only `exited`)")]
    UnknownVerb {
        /// The datagram.
        text: String,
        /// Its first word.
        verb: String,
    },
    /// The task type is not one.
    #[error(transparent)]
    TaskType(#[from] ClusterError),
    /// The task index is not a whole number.
    #[error("{text:?}: {index:?} is not a task index")]
    BadIndex {
        /// The datagram.
        text: String,
        /// The index word.
        index: String,
    },
    /// The incarnation is not a whole number from 1 up.
    #[error("{text:?}: {incarnation:?} is not an incarnation (≥ 1)")]
    BadIncarnation {
        /// The datagram.
        text: String,
        /// The incarnation word.
        incarnation: String,
    },
}

/// Why [`ExitReports::bind`] could not listen at its path.
#[derive(Debug, thiserror::Error)]
pub enum ExitSocketError {
    /// The path is longer than a Unix socket path may be.
    #[error("{}: a Unix socket path may have at most {SOCKET_PATH_BYTES_MAX} bytes", path.display())]
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// Something other than a socket is at the path.
    #[error("{} exists and is not a socket (refusing to replace it)", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A predecessor's socket could not be removed.
    #[error("{}: cannot replace the old socket: {source}", path.display())]
    ReplaceOld {
        /// The path.
        path: PathBuf,
        /// Why the removal failed.
        source: io::Error,
    },
    /// The socket could not be bound.
    #[error("{}: cannot bind: {source}", path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why binding failed.
        source: io::Error,
    },
    /// The socket's permissions could not be set to owner-only.
    #[error("{}: cannot make it owner-only: {source}", path.display())]
    Permissions {
        /// The path.
        path: PathBuf,
        /// Why setting them failed.
        source: io::Error,
    },
}

/// Sends `report` to the chief's socket at `socket`, without waiting: a chief that is not
/// listening (not started yet, or itself restarting) just misses it, and the detection budget
/// or the new incarnation's hello then tells it instead.
pub fn send_exit_report(socket: &Path, report: &ExitReport) -> io::Result<()> {
    let sender = std::os::unix::net::UnixDatagram::unbound()?;
    sender.set_nonblocking(true)?;
    sender.send_to(report.encode().as_bytes(), socket)?;
    Ok(())
}

/// A bound socket on which a chief hears exit reports.
#[derive(Debug)]
pub struct ExitReports {
    socket: tokio::net::UnixDatagram,
    path: PathBuf,
}

impl ExitReports {
    /// Binds `path` (a socket left there by a predecessor is replaced; anything else there is
    /// refused), owner-only. Must be called inside a tokio runtime.
    pub fn bind(path: &Path) -> Result<Self, ExitSocketError> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let path_buf = || path.to_path_buf();
        if path.as_os_str().len() > SOCKET_PATH_BYTES_MAX {
            return Err(ExitSocketError::PathTooLong { path: path_buf() });
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(path).map_err(|source| ExitSocketError::ReplaceOld {
                    path: path_buf(),
                    source,
                })?
            }
            Ok(_) => return Err(ExitSocketError::NotASocket { path: path_buf() }),
            Err(_) => {}
        }
        let socket =
            tokio::net::UnixDatagram::bind(path).map_err(|source| ExitSocketError::Bind {
                path: path_buf(),
                source,
            })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
            |source| ExitSocketError::Permissions {
                path: path_buf(),
                source,
            },
        )?;
        Ok(Self {
            socket,
            path: path.to_path_buf(),
        })
    }

    /// The next report; a datagram that is not one is logged (naming the socket) and skipped.
    pub async fn next(&self) -> io::Result<ExitReport> {
        let mut buf = [0u8; REPORT_BYTES_MAX + 1];
        loop {
            let n = self.socket.recv(&mut buf).await?;
            match ExitReport::decode(&buf[..n]) {
                Ok(report) => return Ok(report),
                Err(e) => {
                    tracing::warn!("{}: ignoring a bad exit report: {e}", self.path.display())
                }
            }
        }
    }
}

impl Drop for ExitReports {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cohort-exit-report-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_report_round_trips_and_bad_ones_say_what_is_wrong() {
        let report = ExitReport {
            task: TaskId::new(TaskType::Ps, 3),
            incarnation: 1_764_112_233_445,
        };
        assert_eq!(report.encode(), "exited ps 3 1764112233445");
        assert_eq!(ExitReport::decode(report.encode().as_bytes()), Ok(report));
        for (bad, says) in [
            ("exited ps 3", "is not `exited"),
            ("died worker 1 5", "unknown report"),
            ("exited gardener 1 5", "gardener"),
            ("exited worker -1 5", "is not a task index"),
            ("exited worker 1 0", "is not an incarnation"),
            ("exited worker 1 x", "is not an incarnation"),
        ] {
            let err = ExitReport::decode(bad.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(matches!(
            ExitReport::decode(b"exited worker 1 0"),
            Err(ExitReportError::BadIncarnation { .. })
        ));
        assert_eq!(
            ExitReport::decode(&[0xff, 0xfe]),
            Err(ExitReportError::NotUtf8)
        );
        let err = ExitReport::decode(&[b'x'; 200]).unwrap_err();
        assert_eq!(err, ExitReportError::TooLong { bytes: 200 });
        assert!(err.to_string().contains("200 bytes"));
    }

    #[tokio::test]
    async fn a_sent_report_is_heard_and_garbage_is_skipped() {
        let dir = scratch("heard");
        let path = dir.join("s.sock");
        // A stale socket from a predecessor is replaced.
        drop(std::os::unix::net::UnixDatagram::bind(&path).unwrap());
        let reports = ExitReports::bind(&path).unwrap();
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        sender.send_to(b"nonsense", &path).unwrap();
        let report = ExitReport {
            task: TaskId::new(TaskType::Worker, 1),
            incarnation: 7,
        };
        send_exit_report(&path, &report).unwrap();
        let heard = tokio::time::timeout(std::time::Duration::from_secs(10), reports.next())
            .await
            .expect("heard within 10 s")
            .unwrap();
        assert_eq!(heard, report);
        drop(reports);
        assert!(!path.exists(), "the socket is removed with its listener");
        // Nobody listening: the send fails, and that is all.
        assert!(send_exit_report(&path, &report).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_in_the_sockets_place_is_not_replaced() {
        let dir = scratch("file");
        let path = dir.join("precious");
        std::fs::write(&path, b"data").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(async { ExitReports::bind(&path).unwrap_err() });
        assert!(matches!(err, ExitSocketError::NotASocket { .. }), "{err}");
        assert!(err.to_string().contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
        let long = dir.join("x".repeat(120));
        let err = rt.block_on(async { ExitReports::bind(&long).unwrap_err() });
        assert!(matches!(err, ExitSocketError::PathTooLong { .. }), "{err}");
        assert!(err.to_string().contains("at most 107 bytes"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
