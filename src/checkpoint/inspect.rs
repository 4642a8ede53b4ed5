//! What a checkpoint root holds, at a glance (`cohort ckpt ls`): every checkpoint directory
//! with its step, time and size, and whether it is complete, without reading the shards'
//! contents. Full verification (checksums, framing, layout) is [`super::read_checkpoint`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::manager::{list_checkpoints, ListError};
use super::manifest::MANIFEST_FILE;
use super::store::{parse_checkpoint_dir_name, read_manifest, TEMP_DIR_PREFIX};

/// One directory under a checkpoint root, as [`summarize_root`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// The step, from the directory name (`None` for a `.tmp-` directory).
    pub step: Option<u64>,
    /// The directory.
    pub dir: PathBuf,
    /// When it was saved (the manifest's time, milliseconds since the Unix epoch), if its
    /// manifest reads.
    pub created_unix_ms: Option<u64>,
    /// Bytes of the files in it.
    pub bytes: u64,
    /// `None` when complete: the manifest verifies and every shard it lists is there with
    /// the size it records (checksums are not computed here). Otherwise why not, naming the
    /// file.
    pub incomplete: Option<String>,
}

/// Whether `path` is one checkpoint (a `ckpt-<step>` directory, or any directory with a
/// manifest) rather than a checkpoint root.
pub fn is_checkpoint_dir(path: &Path) -> bool {
    path.join(MANIFEST_FILE).exists()
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_checkpoint_dir_name)
            .is_some()
}

/// Every checkpoint directory under `root`, oldest step first, then the `.tmp-` directories
/// (saves in progress or interrupted; never restored).
pub fn summarize_root(root: &Path) -> Result<Vec<CheckpointSummary>, ListError> {
    let mut out: Vec<CheckpointSummary> = list_checkpoints(root)?
        .into_iter()
        .map(|entry| summarize(&entry.dir, Some(entry.step)))
        .collect();
    let mut temps = Vec::new();
    let entries = fs::read_dir(root).map_err(|source| ListError::Io {
        path: root.to_path_buf(),
        source,
    })?;
    for dirent in entries.flatten() {
        let is_temp = dirent
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_DIR_PREFIX));
        if is_temp && dirent.file_type().is_ok_and(|t| t.is_dir()) {
            let dir = dirent.path();
            temps.push(CheckpointSummary {
                step: None,
                bytes: dir_bytes(&dir),
                dir,
                created_unix_ms: None,
                incomplete: Some(
                    "a save in progress or interrupted (a .tmp- directory is never restored)"
                        .into(),
                ),
            });
        }
    }
    temps.sort_by(|a, b| a.dir.cmp(&b.dir));
    out.extend(temps);
    Ok(out)
}

/// [`CheckpointSummary`] of the checkpoint in `dir`.
pub fn summarize(dir: &Path, step: Option<u64>) -> CheckpointSummary {
    let bytes = dir_bytes(dir);
    let (created_unix_ms, incomplete) = match read_manifest(dir) {
        Err(e) => (None, Some(e.to_string())),
        Ok(manifest) => {
            let label = dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            let missing = manifest.files.iter().find_map(|entry| {
                let file = format!("{label}/{}", entry.name);
                match fs::metadata(dir.join(&entry.name)) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        Some(format!("{file}: missing"))
                    }
                    Err(e) => Some(format!("{file}: cannot read: {e}")),
                    Ok(m) if m.len() != entry.bytes => Some(format!(
                        "{file}: size mismatch (manifest says {} bytes, file has {})",
                        entry.bytes,
                        m.len()
                    )),
                    Ok(_) => None,
                }
            });
            (Some(manifest.created_unix_ms), missing)
        }
    };
    CheckpointSummary {
        step,
        dir: dir.to_path_buf(),
        created_unix_ms,
        bytes,
        incomplete,
    }
}

/// Bytes of the plain files directly in `dir` (0 if it cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
