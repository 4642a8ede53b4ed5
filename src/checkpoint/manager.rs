//! The checkpoint manager: when to save, keeping the last K, restoring the newest valid one.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::content::Checkpoint;
use super::failpoint::{self, FailAction, FailSite, FailpointHook};
use super::store::{
    self, fsync_dir, parse_checkpoint_dir_name, read_checkpoint, unique_temp_name,
    write_checkpoint, LoadError, LoadedCheckpoint, SaveError, TEMP_DIR_PREFIX,
};

/// When to save and how many checkpoints to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Save once this many steps have passed since the last save (`None`: not by steps).
    pub save_every_steps: Option<u64>,
    /// Save once this much time has passed since the last save, or since the manager was
    /// created (`None`: not by time).
    pub save_every: Option<Duration>,
    /// Number of newest checkpoints kept; at least 1.
    pub keep_last: usize,
}

impl Default for CheckpointPolicy {
    /// No automatic saves, keep the last 5 (TensorFlow's `max_to_keep` default).
    fn default() -> Self {
        Self {
            save_every_steps: None,
            save_every: None,
            keep_last: 5,
        }
    }
}

/// A policy the manager cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `keep_last` is 0: nothing could ever be restored.
    #[error("checkpoint keep_last must be at least 1")]
    ZeroKeepLast,
    /// `save_every_steps` is 0.
    #[error("checkpoint save_every_steps must be at least 1")]
    ZeroSaveEverySteps,
    /// `save_every` is zero.
    #[error("checkpoint save_every must be longer than zero")]
    ZeroSaveEvery,
}

/// Listing the checkpoint root failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The root could not be read.
    #[error("cannot list checkpoint root {}: {source}", path.display())]
    Io {
        /// The root.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// A checkpoint directory found under the root (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// Step, from the directory name.
    pub step: u64,
    /// The directory.
    pub dir: PathBuf,
}

/// A checkpoint restore passed over, and why.
#[derive(Debug)]
pub struct Skipped {
    /// Step, from the directory name.
    pub step: u64,
    /// The directory.
    pub dir: PathBuf,
    /// Why it cannot be restored; its message names the file.
    pub error: LoadError,
}

/// What [`CheckpointManager::restore_latest`] found.
#[derive(Debug)]
pub struct RestoreOutcome {
    /// The newest checkpoint that verified, if any.
    pub restored: Option<LoadedCheckpoint>,
    /// Newer checkpoints that did not verify, newest first.
    pub skipped: Vec<Skipped>,
    /// Leftover temporary directories (crashed saves) that were removed.
    pub removed_temp: Vec<PathBuf>,
}

/// Saves checkpoints on a schedule, keeps the newest `keep_last`, and restores the newest one
/// that verifies (CKPT-1).
///
/// Calling protocol, for the one process that checkpoints a job (the chief):
/// 1. [`new`](Self::new) with the root directory, the policy and the current time;
/// 2. [`restore_latest`](Self::restore_latest) once at start: it removes leftovers of crashed
///    saves, returns the newest valid checkpoint and reports every newer one it skipped;
/// 3. each step, [`should_save`](Self::should_save); when true, gather a [`Checkpoint`] and
///    [`save`](Self::save) it. Older checkpoints beyond `keep_last` are removed only after the
///    new one is durable.
///
/// One manager per root: two processes saving into the same root are not supported.
///
/// ```
/// use std::time::Instant;
/// use cohort::checkpoint::{Checkpoint, CheckpointManager, CheckpointPolicy, Dtype, TensorBytes};
/// use cohort::layout::Layout;
///
/// let root = std::env::temp_dir().join(format!("cohort-doc-ckpt-{}", std::process::id()));
/// let policy = CheckpointPolicy { save_every_steps: Some(100), save_every: None, keep_last: 2 };
/// let start = Instant::now();
/// let mut manager = CheckpointManager::new(&root, policy, start)?;
/// assert!(manager.restore_latest()?.restored.is_none());
///
/// // One 2x2 variable on PS 0 of a single-PS job.
/// let mut ckpt = Checkpoint::new(100, 1);
/// ckpt.layout.push(Layout::unsharded("dense/kernel", Dtype::F32, vec![2, 2], 0));
/// ckpt.shards[0].tensors.insert(
///     "dense/kernel".into(),
///     TensorBytes::from_f32(vec![2, 2], &[1.0, 2.0, 3.0, 4.0])?,
/// );
/// assert!(manager.should_save(100, start));
/// let dir = manager.save(&ckpt, start)?;
/// assert!(dir.ends_with("ckpt-100"));
/// assert!(!manager.should_save(150, start));
///
/// let restored = manager.restore_latest()?.restored.expect("a checkpoint");
/// assert_eq!(restored.checkpoint, ckpt);
/// std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CheckpointManager {
    root: PathBuf,
    policy: CheckpointPolicy,
    started_at: Instant,
    last_saved_step: Option<u64>,
    last_saved_at: Option<Instant>,
    hook: Option<FailpointHook>,
}

impl fmt::Debug for CheckpointManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointManager")
            .field("root", &self.root)
            .field("policy", &self.policy)
            .field("last_saved_step", &self.last_saved_step)
            .field("failpoint_hook", &self.hook.is_some())
            .finish()
    }
}

impl CheckpointManager {
    /// A manager for checkpoints under `root` (created on the first save). `now` starts the
    /// clock of [`CheckpointPolicy::save_every`].
    pub fn new(
        root: impl Into<PathBuf>,
        policy: CheckpointPolicy,
        now: Instant,
    ) -> Result<Self, PolicyError> {
        if policy.keep_last == 0 {
            return Err(PolicyError::ZeroKeepLast);
        }
        if policy.save_every_steps == Some(0) {
            return Err(PolicyError::ZeroSaveEverySteps);
        }
        if policy.save_every == Some(Duration::ZERO) {
            return Err(PolicyError::ZeroSaveEvery);
        }
        Ok(Self {
            root: root.into(),
            policy,
            started_at: now,
            last_saved_step: None,
            last_saved_at: None,
            hook: None,
        })
    }

    /// The checkpoint root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The policy.
    pub fn policy(&self) -> &CheckpointPolicy {
        &self.policy
    }

    /// Records a checkpoint of `step` saved under this root by another writer (a save in the
    /// background), begun at `at`: the cadence ([`Self::should_save`]) counts from it.
    pub fn record_saved(&mut self, step: u64, at: Instant) {
        if self.last_saved_step.is_none_or(|last| step > last) {
            self.last_saved_step = Some(step);
            self.last_saved_at = Some(at);
            crate::status::record_checkpoint(
                &self.root.join(store::checkpoint_dir_name(step)),
                step,
            );
        }
    }

    /// Step of the last checkpoint saved or restored by this manager.
    pub fn last_saved_step(&self) -> Option<u64> {
        self.last_saved_step
    }

    /// Installs (or removes) an in-process failpoint hook, called at every [`FailSite`].
    pub fn set_failpoint_hook(&mut self, hook: Option<FailpointHook>) {
        self.hook = hook;
    }

    /// Whether the policy asks for a checkpoint at `step`, at time `now`. Never true for a
    /// step at or below the last one saved or restored.
    pub fn should_save(&self, step: u64, now: Instant) -> bool {
        if self.last_saved_step.is_some_and(|last| step <= last) {
            return false;
        }
        let by_steps = self
            .policy
            .save_every_steps
            .is_some_and(|every| step >= self.last_saved_step.unwrap_or(0).saturating_add(every));
        let by_time = self.policy.save_every.is_some_and(|every| {
            let since = self.last_saved_at.unwrap_or(self.started_at);
            now.saturating_duration_since(since) >= every
        });
        by_steps || by_time
    }

    /// Saves `ckpt` durably as `root/ckpt-<step>` and returns its directory, then removes the
    /// checkpoints beyond `keep_last` (never the one just saved). A failure of that removal is
    /// logged, not returned: the new checkpoint is already durable.
    pub fn save(&mut self, ckpt: &Checkpoint, now: Instant) -> Result<PathBuf, SaveError> {
        let started = Instant::now();
        let dir = write_checkpoint(&self.root, ckpt, self.hook.as_ref())?;
        // CKPT-1: a checkpoint counts (and older ones may go) only once it reads back whole; a
        // torn or flipped file under it would otherwise leave no checkpoint to restore.
        if let Err(source) = read_checkpoint(&dir) {
            if let Err(e) = fs::remove_dir_all(&dir) {
                tracing::warn!("removing the unverified checkpoint {}: {e}", dir.display());
            }
            return Err(SaveError::Unverified {
                step: ckpt.step,
                dir,
                source: Box::new(source),
            });
        }
        self.last_saved_step = Some(ckpt.step);
        self.last_saved_at = Some(now);
        // The metrics endpoint's save time and size (written and verified).
        let metrics = crate::metrics::instruments();
        metrics
            .checkpoint_save_seconds
            .observe(started.elapsed().as_secs_f64());
        let bytes: u64 = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        metrics
            .checkpoint_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        // The status page's newest checkpoint.
        crate::status::record_checkpoint(&dir, ckpt.step);
        // Older checkpoints go only now that the new one is published, fsynced and verified.
        if failpoint::check(FailSite::BeforeRetention, self.hook.as_ref()) == FailAction::Crash {
            return Err(SaveError::InjectedCrash {
                site: FailSite::BeforeRetention,
            });
        }
        if let Err(e) = self.apply_retention(ckpt.step) {
            tracing::warn!("checkpoint retention under {}: {e}", self.root.display());
        }
        Ok(dir)
    }

    /// Checkpoint directories under the root, oldest step first (not verified).
    pub fn list(&self) -> Result<Vec<CheckpointEntry>, ListError> {
        list_checkpoints(&self.root)
    }

    /// Removes leftover temporary directories, then returns the newest checkpoint that
    /// verifies, with every newer one it skipped and why. Later [`should_save`](Self::should_save)
    /// calls count steps from the restored step.
    pub fn restore_latest(&mut self) -> Result<RestoreOutcome, ListError> {
        let removed_temp = remove_temp_dirs(&self.root)?;
        let mut skipped = Vec::new();
        let mut restored = None;
        for entry in list_checkpoints(&self.root)?.into_iter().rev() {
            match read_checkpoint(&entry.dir) {
                Ok(loaded) => {
                    restored = Some(loaded);
                    break;
                }
                Err(error) => {
                    tracing::warn!("checkpoint skipped: {error}");
                    skipped.push(Skipped {
                        step: entry.step,
                        dir: entry.dir,
                        error,
                    });
                }
            }
        }
        if let Some(loaded) = &restored {
            self.last_saved_step = Some(loaded.checkpoint.step);
        }
        Ok(RestoreOutcome {
            restored,
            skipped,
            removed_temp,
        })
    }

    fn apply_retention(&self, saved_step: u64) -> Result<(), SaveError> {
        let entries = list_checkpoints(&self.root)
            .map_err(|ListError::Io { path, source }| store::io_err("list", &path, source))?;
        // Newest first; the one just saved is kept whatever its rank.
        let doomed: Vec<CheckpointEntry> = entries
            .into_iter()
            .rev()
            .enumerate()
            .filter(|(rank, e)| *rank >= self.policy.keep_last && e.step != saved_step)
            .map(|(_, e)| e)
            .collect();
        for entry in doomed {
            // Renamed out of the checkpoint namespace first, so that a crash in the middle of
            // the removal leaves a `.tmp-` directory, not a half-deleted checkpoint.
            let trash = self
                .root
                .join(unique_temp_name(&format!("deleted-ckpt-{}", entry.step)));
            fs::rename(&entry.dir, &trash).map_err(|e| store::io_err("rename", &entry.dir, e))?;
            fsync_dir(&self.root)?;
            fs::remove_dir_all(&trash).map_err(|e| store::io_err("remove", &trash, e))?;
        }
        Ok(())
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)
    }
}

/// Checkpoint directories (`ckpt-<step>`) under `root`, oldest step first; empty if `root`
/// does not exist. Temporary directories and other files are ignored.
pub fn list_checkpoints(root: &Path) -> Result<Vec<CheckpointEntry>, ListError> {
    let mut entries = Vec::new();
    for dirent in read_root(root)? {
        let name = dirent.file_name();
        let Some(step) = name.to_str().and_then(parse_checkpoint_dir_name) else {
            continue;
        };
        if dirent.file_type().is_ok_and(|t| t.is_dir()) {
            entries.push(CheckpointEntry {
                step,
                dir: dirent.path(),
            });
        }
    }
    entries.sort_by_key(|e| e.step);
    Ok(entries)
}

/// Removes the `.tmp-` directories under `root` (crashed saves, interrupted deletions).
fn remove_temp_dirs(root: &Path) -> Result<Vec<PathBuf>, ListError> {
    let mut removed = Vec::new();
    for dirent in read_root(root)? {
        let is_temp = dirent
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_DIR_PREFIX));
        if !is_temp || !dirent.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = dirent.path();
        match fs::remove_dir_all(&path) {
            Ok(()) => removed.push(path),
            Err(e) => tracing::warn!("checkpoint: cannot remove leftover {}: {e}", path.display()),
        }
    }
    removed.sort();
    Ok(removed)
}

fn read_root(root: &Path) -> Result<Vec<fs::DirEntry>, ListError> {
    let io = |source| ListError::Io {
        path: root.to_path_buf(),
        source,
    };
    match fs::read_dir(root) {
        Ok(dir) => dir.collect::<Result<Vec<_>, _>>().map_err(io),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(policy: CheckpointPolicy, now: Instant) -> CheckpointManager {
        CheckpointManager::new("/nonexistent/cohort-ckpt-unit", policy, now).unwrap()
    }

    #[test]
    fn zero_limits_are_rejected() {
        let now = Instant::now();
        let bad = |p: CheckpointPolicy| CheckpointManager::new("x", p, now).unwrap_err();
        assert_eq!(
            bad(CheckpointPolicy {
                keep_last: 0,
                ..Default::default()
            }),
            PolicyError::ZeroKeepLast
        );
        assert_eq!(
            bad(CheckpointPolicy {
                save_every_steps: Some(0),
                ..Default::default()
            }),
            PolicyError::ZeroSaveEverySteps
        );
        assert_eq!(
            bad(CheckpointPolicy {
                save_every: Some(Duration::ZERO),
                ..Default::default()
            }),
            PolicyError::ZeroSaveEvery
        );
    }

    #[test]
    fn no_schedule_never_saves() {
        let t0 = Instant::now();
        let m = manager(CheckpointPolicy::default(), t0);
        assert!(!m.should_save(1_000_000, t0 + Duration::from_secs(86_400)));
    }
}
