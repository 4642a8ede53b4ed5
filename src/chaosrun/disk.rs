//! The disk-full fault, on a real filesystem. For a plan that has one, the job runs in a mount
//! namespace of its own (`unshare`; this user is mapped to root there when the runner is not
//! root) in which its checkpoint directory is a tmpfs of the plan's `disk_size_mib`, seeded
//! with what the directory held. When the fault is due, the runner fills that filesystem
//! (reached through `/proc/<pid>/root`, the namespace as the job sees it) until a write fails
//! with ENOSPC, so that every write of the job there fails as on a full disk; `for` later it
//! deletes its filler. When the job ends, the wrapper copies the tmpfs's content back into the
//! real directory (through a bind mount of it made before the tmpfs hid it), for the runner's
//! checks and for the user.
//!
//! Nothing else of the machine is touched: the tmpfs exists only in the job's namespace and
//! is gone with its last process.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The filler's name in the checkpoint directory (a dot name: no checkpoint reader lists it).
const FILLER: &str = ".cohort-chaos-disk-full";
/// The filler is written in pieces of this size.
const FILL_CHUNK: usize = 1 << 20;

/// The script the job runs under: `$1` the checkpoint directory, `$2` the bind mount of the
/// real one, `$3` the tmpfs size in MiB, then the launch command. SIGTERM and SIGINT are
/// passed on to the job; its exit code is the script's.
const WRAPPER: &str = r#"set -e
ckpt="$1"; real="$2"; size="$3"; shift 3
mkdir -p "$ckpt" "$real"
mount --bind "$ckpt" "$real"
mount -t tmpfs -o "size=${size}m,mode=0700" cohort-chaos-disk "$ckpt"
cp -a "$real/." "$ckpt/"
set +e
"$@" &
job=$!
trap 'kill -TERM "$job" 2>/dev/null' TERM
trap 'kill -INT "$job" 2>/dev/null' INT
wait "$job"
code=$?
# A trapped signal ends `wait` early (status above 128): wait again while the job runs.
while kill -0 "$job" 2>/dev/null; do
  wait "$job"
  code=$?
done
rm -f "$ckpt/.cohort-chaos-disk-full"
find "$real" -mindepth 1 -delete
cp -a "$ckpt/." "$real/"
exit "$code"
"#;

/// The job's checkpoint filesystem and the fills in force.
#[derive(Debug)]
pub struct DiskFaults {
    /// The checkpoint directory, absolute, as the job names it.
    checkpoint_dir: PathBuf,
    /// The wrapper's process (the launch command runs as its child), once started.
    wrapper_pid: Option<u32>,
    /// When the fill in force ends, and when the plan said it would (seconds after the job's
    /// start).
    filled_until: Option<(Instant, f64)>,
}

/// A fill that ended.
#[derive(Debug)]
pub struct Freed {
    /// When the plan said it would end, seconds after the job's start.
    pub planned_s: f64,
    /// Whether the filler was deleted.
    pub freed: bool,
    /// What was freed, or why not.
    pub detail: String,
}

impl DiskFaults {
    /// The command that runs `command` over a tmpfs of `size_mib` at `checkpoint_dir` (an
    /// absolute path), copying the directory's content in first and back at the end through
    /// `real_dir` (an empty directory this creates). Errors name what the machine lacks.
    pub fn wrap(
        command: &[String],
        checkpoint_dir: &Path,
        real_dir: &Path,
        size_mib: u64,
    ) -> Result<(Command, DiskFaults), DiskFaultError> {
        if !checkpoint_dir.is_absolute() {
            return Err(DiskFaultError::NotAbsolute {
                dir: checkpoint_dir.to_path_buf(),
            });
        }
        probe_namespaces()?;
        let mut wrapped = Command::new("unshare");
        wrapped.arg("--mount");
        if !nix::unistd::geteuid().is_root() {
            wrapped.arg("--map-root-user");
        }
        wrapped
            .args(["--", "sh", "-c", WRAPPER, "cohort-chaos-disk"])
            .arg(checkpoint_dir)
            .arg(real_dir)
            .arg(size_mib.to_string())
            .args(command);
        Ok((
            wrapped,
            DiskFaults {
                checkpoint_dir: checkpoint_dir.to_path_buf(),
                wrapper_pid: None,
                filled_until: None,
            },
        ))
    }

    /// The wrapper's process, once spawned.
    pub fn started(&mut self, pid: u32) {
        self.wrapper_pid = Some(pid);
    }

    /// The checkpoint directory as the job sees it, from outside its namespace.
    pub fn job_view(&self) -> Result<PathBuf, DiskFaultError> {
        let pid = self.wrapper_pid.ok_or(DiskFaultError::NotStarted)?;
        let relative = self
            .checkpoint_dir
            .strip_prefix("/")
            .unwrap_or(&self.checkpoint_dir);
        Ok(PathBuf::from(format!("/proc/{pid}/root")).join(relative))
    }

    /// Fills the job's checkpoint filesystem until a write fails with ENOSPC, for `lasts`
    /// (planned to end `planned_end_s` after the job's start). Returns what it did.
    pub fn fill(
        &mut self,
        now: Instant,
        lasts: Duration,
        planned_end_s: f64,
    ) -> Result<String, DiskFaultError> {
        let path = self.job_view()?.join(FILLER);
        let mut file = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(source) => return Err(DiskFaultError::CreateFiller { path, source }),
        };
        let chunk = vec![0u8; FILL_CHUNK];
        let mut written: u64 = 0;
        let full = loop {
            match file.write(&chunk) {
                Ok(0) => break None,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break Some(e),
                Err(source) => return Err(DiskFaultError::WriteFiller { path, source }),
            }
        };
        let Some(full) = full else {
            return Err(DiskFaultError::NoEnospc { path, written });
        };
        self.filled_until = Some((now + lasts, planned_end_s));
        Ok(format!(
            "filled the checkpoint filesystem with {:.1} MiB until writes failed ({full}), for \
             {}",
            written as f64 / (1 << 20) as f64,
            crate::cluster::format_duration(lasts)
        ))
    }

    /// Frees the fill whose time is over.
    pub fn free_due(&mut self, now: Instant) -> Option<Freed> {
        let (until, planned_s) = self.filled_until?;
        if now < until {
            return None;
        }
        self.filled_until = None;
        let freed = self.job_view().and_then(|view| {
            let path = view.join(FILLER);
            std::fs::remove_file(&path)
                .map_err(|source| DiskFaultError::RemoveFiller { path, source })
        });
        Some(Freed {
            planned_s,
            freed: freed.is_ok(),
            detail: match freed {
                Ok(()) => "freed the checkpoint filesystem".to_string(),
                Err(e) => format!("could not free the checkpoint filesystem: {e}"),
            },
        })
    }
}

/// Whether this machine lets the runner make a mount namespace with a tmpfs in it: an error
/// naming what failed otherwise.
pub fn probe_namespaces() -> Result<(), DiskFaultError> {
    let mut probe = Command::new("unshare");
    probe.arg("--mount");
    if !nix::unistd::geteuid().is_root() {
        probe.arg("--map-root-user");
    }
    let output = probe
        .args([
            "--",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m cohort-chaos-probe /tmp",
        ])
        .output()
        .map_err(DiskFaultError::NoUnshare)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(DiskFaultError::NamespaceRefused {
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// Why the disk-full fault cannot be set up or carried out.
#[derive(Debug, thiserror::Error)]
pub enum DiskFaultError {
    /// The job's checkpoint directory was given relative.
    #[error("disk_full: the checkpoint directory {} is not an absolute path", dir.display())]
    NotAbsolute {
        /// The directory.
        dir: PathBuf,
    },
    /// `unshare` could not be run.
    #[error("disk_full needs util-linux's `unshare`: {0}")]
    NoUnshare(#[source] std::io::Error),
    /// This machine refuses a mount namespace with a tmpfs in it.
    #[error(
        "disk_full needs a mount namespace with a tmpfs of its own, which this machine \
         refuses: {stderr}"
    )]
    NamespaceRefused {
        /// What `unshare` said.
        stderr: String,
    },
    /// The job (its wrapper) has not been started, so its namespace is not there yet.
    #[error("the job has not started")]
    NotStarted,
    /// The filler file could not be created.
    #[error("cannot create {}: {source}", path.display())]
    CreateFiller {
        /// The filler file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// Writing the filler failed otherwise than with ENOSPC.
    #[error("writing {}: {source}", path.display())]
    WriteFiller {
        /// The filler file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The filesystem took writes until they stopped, without ever being full.
    #[error("writing {} stopped without ENOSPC after {written} bytes", path.display())]
    NoEnospc {
        /// The filler file.
        path: PathBuf,
        /// Bytes written.
        written: u64,
    },
    /// The filler could not be deleted.
    #[error("cannot delete {}: {source}", path.display())]
    RemoveFiller {
        /// The filler file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
}
