//! Checkpoint directories on disk: the atomic write protocol and the verifying reader.
//!
//! Write protocol (CKPT-1), for a checkpoint at step `s` under `root`:
//! 1. create `root/.tmp-ckpt-<s>-<unique>`;
//! 2. write every shard as `shard-<ps>-of-<n>.safetensors`, each fsynced;
//! 3. write `manifest.json` (checksums and sizes of the shards, and its own checksum) LAST,
//!    fsynced, then fsync the temporary directory;
//! 4. rename it to `root/ckpt-<s>` and fsync `root`.
//!
//! A crash before step 4 leaves only a `.tmp-` directory, which restore ignores; a crash after
//! it leaves a complete, durable checkpoint. The reader trusts nothing: it checks the manifest's own
//! checksum before parsing it, its format, every file's size and SHA-256, the safetensors framing, and that the tensors agree
//! with the layout, and its errors name the file at fault (`ckpt-200/shard-1-of-2.safetensors:
//! checksum mismatch ...`).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::content::{shard_file_name, Checkpoint, ShardTensors, ValidationError};
use super::failpoint::{self, FailAction, FailSite, FailpointHook};
use super::manifest::{
    FileEntry, Manifest, ManifestError, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE,
};
use super::regular_file::{self, OpenRefused};
use super::tensor::{TensorBytes, TensorError};
use crate::layout::Dtype;

/// Prefix of a checkpoint directory's name: `ckpt-<step>`.
pub const CHECKPOINT_DIR_PREFIX: &str = "ckpt-";

/// Prefix of directories that are not (yet, or any more) checkpoints: saves in progress,
/// checkpoints being deleted. Restore ignores them and removes them.
pub const TEMP_DIR_PREFIX: &str = ".tmp-";

/// A checkpoint read back from disk and verified.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest as stored.
    pub manifest: Manifest,
    /// Its content, tensors included.
    pub checkpoint: Checkpoint,
}

/// Why a save failed. A failed save never leaves anything restore would pick.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The content is inconsistent (layout vs tensors, ledger); nothing was written.
    #[error("checkpoint at step {step} is inconsistent: {source}")]
    Invalid {
        /// Step of the rejected checkpoint.
        step: u64,
        /// What is inconsistent.
        source: ValidationError,
    },
    /// A filesystem operation failed.
    #[error("checkpoint save: cannot {op} {}: {source}", path.display())]
    Io {
        /// Operation, e.g. "write", "fsync", "rename".
        op: &'static str,
        /// Path it was applied to.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// safetensors refused to serialize a shard.
    #[error("checkpoint save: cannot serialize {file}: {source}")]
    Serialize {
        /// Shard file name.
        file: String,
        /// The safetensors error.
        source: safetensors::SafeTensorError,
    },
    /// The manifest could not be serialized.
    #[error("checkpoint save: cannot serialize the manifest: {0}")]
    Manifest(#[source] serde_json::Error),
    /// A valid checkpoint for this step exists; CKPT-1 forbids replacing it.
    #[error("a valid checkpoint for step {step} already exists at {}; not replacing it", dir.display())]
    AlreadyExists {
        /// The step.
        step: u64,
        /// The existing checkpoint.
        dir: PathBuf,
    },
    /// A failpoint hook stopped the save at `site`, leaving the disk as a crash would.
    #[error("failpoint {site} injected a crash into the checkpoint save")]
    InjectedCrash {
        /// Where the save stopped.
        site: FailSite,
    },
    /// The checkpoint was written but does not read back whole (a torn or corrupted file
    /// under it): it was removed, and no older checkpoint was (CKPT-1).
    #[error(
        "the checkpoint at step {step} was written to {} but does not read back whole ({source}); \
         it was removed and the older checkpoints kept",
        dir.display()
    )]
    Unverified {
        /// Step of the checkpoint.
        step: u64,
        /// Where it was written.
        dir: PathBuf,
        /// Why it does not verify.
        source: Box<LoadError>,
    },
}

/// Why a checkpoint directory cannot be restored. Every message starts with the file at
/// fault, relative to the checkpoint root (`ckpt-200/shard-1-of-2.safetensors: ...`).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file the checkpoint needs does not exist.
    #[error("{file}: missing ({source})")]
    Missing {
        /// The file.
        file: String,
        /// The OS error.
        source: io::Error,
    },
    /// A file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: String,
        /// The OS error.
        source: io::Error,
    },
    /// The manifest is larger than any manifest this build writes.
    #[error("{file}: {found} bytes, over the {max}-byte manifest limit")]
    TooLarge {
        /// The file.
        file: String,
        /// Its size.
        found: u64,
        /// The limit.
        max: u64,
    },
    /// The manifest's own checksum is missing or does not verify, or its JSON is not a
    /// manifest (CKPT-1: nothing in it is trusted).
    #[error("{file}: {source}")]
    Manifest {
        /// The file.
        file: String,
        /// What is wrong.
        source: ManifestError,
    },
    /// The manifest is of another format or version.
    #[error("{file}: format {found:?} version {version}; this build reads {FORMAT_NAME:?} version {FORMAT_VERSION}")]
    UnsupportedFormat {
        /// The file.
        file: String,
        /// Format name found.
        found: String,
        /// Version found.
        version: u32,
    },
    /// The manifest parses but contradicts itself or its directory (or a shard file
    /// contradicts the manifest).
    #[error("{file}: {reason}")]
    ManifestInvalid {
        /// The file.
        file: String,
        /// What is wrong.
        #[source]
        reason: ManifestInconsistency,
    },
    /// A file the checkpoint needs is not a regular file (a named pipe, a device, a
    /// directory): nothing is read from it.
    #[error("{file}: not a regular file but {kind}")]
    NotAFile {
        /// The file.
        file: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// A shard is longer than the manifest records: it is read only up to one byte over
    /// that size, so a file that never ends (or a huge one) costs no more memory than its
    /// checkpoint.
    #[error("{file}: longer than the {expected} bytes its manifest records")]
    LongerThanRecorded {
        /// The file.
        file: String,
        /// Size recorded in the manifest.
        expected: u64,
    },
    /// A shard's size differs from the manifest's (e.g. a truncated file).
    #[error("{file}: size mismatch (manifest says {expected} bytes, file has {found})")]
    SizeMismatch {
        /// The file.
        file: String,
        /// Size recorded in the manifest.
        expected: u64,
        /// Size on disk.
        found: u64,
    },
    /// A shard's SHA-256 differs from the manifest's (corruption).
    #[error("{file}: checksum mismatch (manifest sha256 {expected}, file sha256 {found})")]
    ChecksumMismatch {
        /// The file.
        file: String,
        /// Checksum recorded in the manifest.
        expected: String,
        /// Checksum of the bytes on disk.
        found: String,
    },
    /// A shard is not a valid safetensors file.
    #[error("{file}: not a valid safetensors file: {source}")]
    ShardParse {
        /// The file.
        file: String,
        /// The safetensors error.
        source: safetensors::SafeTensorError,
    },
    /// A shard holds a tensor of a dtype checkpoints do not carry.
    #[error("{file}: tensor {tensor:?} has dtype {dtype}, which checkpoints do not carry")]
    UnsupportedDtype {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// The dtype's safetensors name.
        dtype: String,
    },
    /// A shard's tensor has bytes that do not fit its dtype and shape.
    #[error("{file}: tensor {tensor:?}: {source}")]
    BadTensor {
        /// The file.
        file: String,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        source: TensorError,
    },
    /// The tensors disagree with the layout (missing part, wrong dtype or shape, ...).
    #[error("{file}: {source}")]
    Inconsistent {
        /// The file.
        file: String,
        /// What is inconsistent.
        source: ValidationError,
    },
}

impl LoadError {
    /// The file at fault, relative to the checkpoint root.
    pub fn file(&self) -> &str {
        match self {
            LoadError::Missing { file, .. }
            | LoadError::Io { file, .. }
            | LoadError::TooLarge { file, .. }
            | LoadError::NotAFile { file, .. }
            | LoadError::LongerThanRecorded { file, .. }
            | LoadError::Manifest { file, .. }
            | LoadError::UnsupportedFormat { file, .. }
            | LoadError::ManifestInvalid { file, .. }
            | LoadError::SizeMismatch { file, .. }
            | LoadError::ChecksumMismatch { file, .. }
            | LoadError::ShardParse { file, .. }
            | LoadError::UnsupportedDtype { file, .. }
            | LoadError::BadTensor { file, .. }
            | LoadError::Inconsistent { file, .. } => file,
        }
    }
}

/// What a manifest that parses says wrong about itself, its directory or its shard files
/// ([`LoadError::ManifestInvalid`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestInconsistency {
    /// The directory's name is for another step than the manifest's.
    #[error("directory is for step {dir_step}, manifest says step {manifest_step}")]
    StepMismatch {
        /// The step in the directory's name.
        dir_step: u64,
        /// The manifest's step.
        manifest_step: u64,
    },
    /// The manifest names no parameter server.
    #[error("num_ps is 0")]
    NoServers,
    /// Not one shard file per parameter server.
    #[error("{files} shard files listed for {num_ps} PS")]
    FileCount {
        /// Shard files listed.
        files: usize,
        /// Parameter servers.
        num_ps: usize,
    },
    /// A file entry other than the one this build writes at its place.
    #[error("file entry {index} is {name:?} for PS {ps}, expected {expected:?} for PS {index}")]
    FileEntry {
        /// The entry's place in the list (the server it must be for).
        index: usize,
        /// The file name it gives.
        name: String,
        /// The server it names.
        ps: u32,
        /// The file name expected at its place.
        expected: String,
    },
    /// A file's checksum is not a SHA-256 in hex.
    #[error("{name}: sha256 {sha256:?} is not 64 hex digits")]
    BadSha256 {
        /// The file.
        name: String,
        /// The checksum given.
        sha256: String,
    },
    /// A shard file's metadata names another step than the manifest.
    #[error("file says step {found}, manifest says {step}")]
    ShardStep {
        /// The step the file's metadata gives.
        found: String,
        /// The manifest's step.
        step: u64,
    },
    /// A shard file holds other tensors than the manifest lists for it.
    #[error("file holds tensors {found:?}, manifest lists {listed:?}")]
    ShardTensors {
        /// The tensors the file holds.
        found: Vec<String>,
        /// The tensors the manifest lists.
        listed: Vec<String>,
    },
}

/// Name of the directory of the checkpoint at `step`: `ckpt-<step>`.
pub fn checkpoint_dir_name(step: u64) -> String {
    format!("{CHECKPOINT_DIR_PREFIX}{step}")
}

/// The step of a checkpoint directory name (`ckpt-200` → 200); `None` for any other name,
/// including non-canonical ones such as `ckpt-0200`.
pub fn parse_checkpoint_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(CHECKPOINT_DIR_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: u64 = digits.parse().ok()?;
    (step.to_string() == digits).then_some(step)
}

/// Encodes `ckpt` as the files of its checkpoint directory, exactly as
/// [`write_checkpoint`] writes them: every shard file (`shard-<ps>-of-<n>.safetensors`, in PS
/// order), then the manifest ([`MANIFEST_FILE`], with the shards' sizes and SHA-256 and its
/// own checksum) last. The manifest's creation time is now.
pub fn encode_checkpoint(ckpt: &Checkpoint) -> Result<Vec<(String, Vec<u8>)>, SaveError> {
    let created_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    encode_checkpoint_at(ckpt, created_unix_ms)
}

/// [`encode_checkpoint`] with the manifest's creation time given (milliseconds since the Unix
/// epoch), so that equal checkpoints encode to equal bytes. Fails with
/// [`SaveError::Invalid`] if the content is inconsistent.
pub fn encode_checkpoint_at(
    ckpt: &Checkpoint,
    created_unix_ms: u64,
) -> Result<Vec<(String, Vec<u8>)>, SaveError> {
    ckpt.validate().map_err(|source| SaveError::Invalid {
        step: ckpt.step,
        source,
    })?;
    let num_ps = ckpt.num_ps();
    let mut files = Vec::with_capacity(num_ps + 1);
    let mut entries = Vec::with_capacity(num_ps);
    for (ps, shard) in ckpt.shards.iter().enumerate() {
        let name = shard_file_name(ps, num_ps);
        let bytes = serialize_shard(ckpt.step, ps, num_ps, shard).map_err(|source| {
            SaveError::Serialize {
                file: name.clone(),
                source,
            }
        })?;
        entries.push(FileEntry {
            name: name.clone(),
            ps: ps as u32,
            bytes: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            tensors: shard.tensors.keys().cloned().collect(),
        });
        files.push((name, bytes));
    }
    let manifest = Manifest {
        format: FORMAT_NAME.to_string(),
        format_version: FORMAT_VERSION,
        step: ckpt.step,
        created_unix_ms,
        num_ps: num_ps as u32,
        layout: ckpt.layout.clone(),
        files: entries,
        slots: ckpt
            .slot_names()
            .into_iter()
            .map(|(var, slots)| (var, slots.into_iter().collect()))
            .collect(),
        dataset_positions: ckpt.dataset_positions.clone(),
        ledger: ckpt.ledger.clone(),
        extra: ckpt.extra.clone(),
    };
    let manifest_bytes = manifest.to_file_bytes().map_err(SaveError::Manifest)?;
    files.push((MANIFEST_FILE.to_string(), manifest_bytes));
    Ok(files)
}

/// Writes `ckpt` as `root/ckpt-<step>` with the protocol in the module doc (the files
/// [`encode_checkpoint`] makes), and returns that directory once it is durable. `hook` is
/// consulted at every [`FailSite`] but [`FailSite::BeforeRetention`] (retention belongs to the
/// manager).
///
/// If `ckpt-<step>` exists and verifies, fails with [`SaveError::AlreadyExists`]; if it exists
/// but does not verify (a corrupt leftover), the new checkpoint replaces it.
pub fn write_checkpoint(
    root: &Path,
    ckpt: &Checkpoint,
    hook: Option<&FailpointHook>,
) -> Result<PathBuf, SaveError> {
    let files = encode_checkpoint(ckpt)?;
    ensure_root(root)?;
    let final_dir = root.join(checkpoint_dir_name(ckpt.step));
    let replace_existing = match fs::symlink_metadata(&final_dir) {
        Ok(_) => match read_checkpoint(&final_dir) {
            Ok(_) => {
                return Err(SaveError::AlreadyExists {
                    step: ckpt.step,
                    dir: final_dir,
                })
            }
            Err(_) => true,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_err("stat", &final_dir, e)),
    };

    let tmp = root.join(unique_temp_name(&format!("ckpt-{}", ckpt.step)));
    fs::create_dir(&tmp).map_err(|e| io_err("create directory", &tmp, e))?;
    match write_and_publish(
        root,
        &tmp,
        &final_dir,
        replace_existing,
        ckpt.step,
        &files,
        hook,
    ) {
        Ok(()) => Ok(final_dir),
        // An injected crash leaves the disk as a real crash would.
        Err(e @ SaveError::InjectedCrash { .. }) => Err(e),
        Err(e) => {
            // Best effort: restore removes `.tmp-` leftovers anyway.
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Steps 2 to 4 of the protocol: `files` (the shards, then the manifest) into the already
/// created `tmp`, then the rename.
fn write_and_publish(
    root: &Path,
    tmp: &Path,
    final_dir: &Path,
    replace_existing: bool,
    step: u64,
    files: &[(String, Vec<u8>)],
    hook: Option<&FailpointHook>,
) -> Result<(), SaveError> {
    crash_point(FailSite::BeforeShards, hook)?;
    for (index, (name, bytes)) in files.iter().enumerate() {
        if name == MANIFEST_FILE {
            crash_point(FailSite::BeforeManifest, hook)?;
        }
        // The first shard is written in two halves so a torn write can be injected.
        let torn = (index == 0).then_some(FailSite::MidShard);
        write_file_synced(&tmp.join(name), bytes, torn, hook)?;
    }
    fsync_dir(tmp)?;
    crash_point(FailSite::BeforePublish, hook)?;

    // A corrupt leftover under the final name is moved aside first: rename cannot replace a
    // non-empty directory. It is a `.tmp-` name, so a crash here leaves it to be cleaned.
    let aside = if replace_existing {
        let aside = root.join(unique_temp_name(&format!("replaced-ckpt-{step}")));
        fs::rename(final_dir, &aside).map_err(|e| io_err("rename", final_dir, e))?;
        Some(aside)
    } else {
        None
    };
    fs::rename(tmp, final_dir).map_err(|e| io_err("rename", tmp, e))?;
    fsync_dir(root)?;
    if let Some(aside) = aside {
        if let Err(e) = fs::remove_dir_all(&aside) {
            tracing::warn!(
                "checkpoint: cannot remove replaced {}: {e}",
                aside.display()
            );
        }
    }
    Ok(())
}

/// Reads and verifies the checkpoint in `dir` (manifest, sizes, checksums, safetensors
/// framing, layout agreement): [`decode_checkpoint`] over the files on disk. Never panics on
/// bad input.
pub fn read_checkpoint(dir: &Path) -> Result<LoadedCheckpoint, LoadError> {
    let dir_label = dir_label(dir);
    let read = |name: &str, read_max: u64| {
        read_file(&dir.join(name), &file_label(&dir_label, name), read_max)
    };
    let mut loaded = decode_checkpoint(&dir_label, read)?;
    loaded.dir = dir.to_path_buf();
    Ok(loaded)
}

/// Verifies and parses the checkpoint whose files `read` returns (by name within the
/// checkpoint's directory, e.g. `manifest.json`), as [`read_checkpoint`] does for a directory:
/// the manifest's own checksum before anything in it is used, its format, every shard's size
/// and SHA-256, the safetensors framing, and that the tensors agree with the layout.
/// `dir_label` names the directory in errors (`ckpt-200/shard-1-of-2.safetensors: ...`; when it
/// is a `ckpt-<step>` name, the manifest's step must match it), and `read`'s own errors should
/// name the file as `<dir_label>/<name>`. `read` is given, with each name, the most bytes worth
/// reading of it (one over the most it may have: a longer file is refused either way), so that
/// a file that never ends costs no more than its checkpoint. The result's `dir` is
/// `dir_label`. Never panics on bad input.
pub fn decode_checkpoint(
    dir_label: &str,
    read: impl Fn(&str, u64) -> Result<Vec<u8>, LoadError>,
) -> Result<LoadedCheckpoint, LoadError> {
    let label = |file: &str| file_label(dir_label, file);
    let manifest_label = label(MANIFEST_FILE);

    let manifest = decode_manifest(dir_label, &read(MANIFEST_FILE, MANIFEST_BYTES_MAX + 1)?)?;

    let num_ps = manifest.num_ps as usize;
    let mut shards = Vec::with_capacity(num_ps);
    for entry in &manifest.files {
        let file = label(&entry.name);
        let bytes = read(&entry.name, entry.bytes.saturating_add(1))?;
        verify_file(&bytes, entry, &file)?;
        shards.push(parse_shard(&bytes, entry, manifest.step, &file)?);
    }
    let checkpoint = Checkpoint {
        step: manifest.step,
        layout: manifest.layout.clone(),
        shards,
        dataset_positions: manifest.dataset_positions.clone(),
        ledger: manifest.ledger.clone(),
        extra: manifest.extra.clone(),
    };
    checkpoint.validate().map_err(|source| {
        let file = match source.ps() {
            Some(ps) if ps < num_ps => label(&manifest.files[ps].name),
            _ => manifest_label.clone(),
        };
        LoadError::Inconsistent { file, source }
    })?;
    Ok(LoadedCheckpoint {
        dir: PathBuf::from(dir_label),
        manifest,
        checkpoint,
    })
}

/// Verifies and parses the bytes of a checkpoint's `manifest.json` as [`decode_checkpoint`]
/// does before it reads any shard: its size, its own checksum (before anything in it is used),
/// its format, and what it says about itself and its directory (`dir_label`, as there).
pub fn decode_manifest(dir_label: &str, manifest_bytes: &[u8]) -> Result<Manifest, LoadError> {
    let manifest_label = file_label(dir_label, MANIFEST_FILE);
    if manifest_bytes.len() as u64 > MANIFEST_BYTES_MAX {
        return Err(LoadError::TooLarge {
            file: manifest_label,
            found: manifest_bytes.len() as u64,
            max: MANIFEST_BYTES_MAX,
        });
    }
    // CKPT-1: the checksum verifies before anything in the manifest is used.
    let manifest =
        Manifest::from_file_bytes(manifest_bytes).map_err(|source| LoadError::Manifest {
            file: manifest_label.clone(),
            source,
        })?;
    if manifest.format != FORMAT_NAME || manifest.format_version != FORMAT_VERSION {
        return Err(LoadError::UnsupportedFormat {
            file: manifest_label,
            found: manifest.format,
            version: manifest.format_version,
        });
    }
    check_manifest(&manifest, dir_label).map_err(|reason| LoadError::ManifestInvalid {
        file: manifest_label.clone(),
        reason,
    })?;
    Ok(manifest)
}

/// Reads and verifies only the manifest of the checkpoint in `dir` ([`decode_manifest`]); the
/// shards are not read. Errors name the file as [`read_checkpoint`]'s do.
pub fn read_manifest(dir: &Path) -> Result<Manifest, LoadError> {
    let dir_label = dir_label(dir);
    let bytes = read_file(
        &dir.join(MANIFEST_FILE),
        &file_label(&dir_label, MANIFEST_FILE),
        MANIFEST_BYTES_MAX + 1,
    )?;
    decode_manifest(&dir_label, &bytes)
}

/// How errors name a checkpoint directory: its last component.
fn dir_label(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// How errors name a file of a checkpoint: `<dir_label>/<name>`.
fn file_label(dir_label: &str, name: &str) -> String {
    format!("{dir_label}/{name}")
}

impl ValidationError {
    /// The PS shard the error is about, if it is about one.
    pub fn ps(&self) -> Option<usize> {
        match self {
            ValidationError::MissingTensor { ps, .. }
            | ValidationError::WrongDtype { ps, .. }
            | ValidationError::WrongShape { ps, .. }
            | ValidationError::UnknownTensor { ps, .. } => Some(*ps),
            _ => None,
        }
    }
}

/// A fresh name for a temporary directory under the root: `.tmp-<what>-<pid>-<n>`.
pub(crate) fn unique_temp_name(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{TEMP_DIR_PREFIX}{what}-{}-{nanos}-{n}", std::process::id())
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), SaveError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync directory", dir, e))
}

pub(crate) fn io_err(op: &'static str, path: &Path, source: io::Error) -> SaveError {
    SaveError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn crash_point(site: FailSite, hook: Option<&FailpointHook>) -> Result<(), SaveError> {
    match failpoint::check(site, hook) {
        FailAction::Continue => Ok(()),
        FailAction::Crash => Err(SaveError::InjectedCrash { site }),
    }
}

/// Creates the root if needed, making its own entry durable in its parent.
fn ensure_root(root: &Path) -> Result<(), SaveError> {
    if root.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(root).map_err(|e| io_err("create directory", root, e))?;
    match root.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fsync_dir(parent),
        _ => Ok(()),
    }
}

/// safetensors' own file writer does not fsync, so shards are serialized to memory here and
/// written by [`write_file_synced`].
fn serialize_shard(
    step: u64,
    ps: usize,
    num_ps: usize,
    shard: &ShardTensors,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT_NAME.to_string()),
        ("step".to_string(), step.to_string()),
        ("ps".to_string(), ps.to_string()),
        ("num_ps".to_string(), num_ps.to_string()),
    ]);
    safetensors::serialize(
        shard.tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
    )
}

fn write_file_synced(
    path: &Path,
    bytes: &[u8],
    torn: Option<FailSite>,
    hook: Option<&FailpointHook>,
) -> Result<(), SaveError> {
    let mut file = File::create_new(path).map_err(|e| io_err("create", path, e))?;
    let (first, rest) = match torn {
        Some(_) => bytes.split_at(bytes.len() / 2),
        None => (bytes, &[][..]),
    };
    file.write_all(first)
        .map_err(|e| io_err("write", path, e))?;
    if let Some(site) = torn {
        crash_point(site, hook)?;
    }
    file.write_all(rest).map_err(|e| io_err("write", path, e))?;
    file.sync_all().map_err(|e| io_err("fsync", path, e))
}

/// Reads the file at `path` (named `file` in errors), at most `read_max` bytes; only a
/// regular file ([`regular_file::read_regular`]).
fn read_file(path: &Path, file: &str, read_max: u64) -> Result<Vec<u8>, LoadError> {
    regular_file::read_regular(path, read_max).map_err(|refused| match refused {
        OpenRefused::Io(source) if source.kind() == io::ErrorKind::NotFound => LoadError::Missing {
            file: file.to_string(),
            source,
        },
        OpenRefused::Io(source) => LoadError::Io {
            file: file.to_string(),
            source,
        },
        OpenRefused::NotAFile(kind) => LoadError::NotAFile {
            file: file.to_string(),
            kind,
        },
    })
}

/// Checks what the manifest says about itself and its directory; `Err` is the reason.
fn check_manifest(m: &Manifest, dir_label: &str) -> Result<(), ManifestInconsistency> {
    if let Some(step) = parse_checkpoint_dir_name(dir_label) {
        if step != m.step {
            return Err(ManifestInconsistency::StepMismatch {
                dir_step: step,
                manifest_step: m.step,
            });
        }
    }
    let num_ps = m.num_ps as usize;
    if num_ps == 0 {
        return Err(ManifestInconsistency::NoServers);
    }
    if m.files.len() != num_ps {
        return Err(ManifestInconsistency::FileCount {
            files: m.files.len(),
            num_ps,
        });
    }
    for (ps, entry) in m.files.iter().enumerate() {
        // Only names this build writes: a manifest cannot point outside its directory.
        let expected = shard_file_name(ps, num_ps);
        if entry.ps as usize != ps || entry.name != expected {
            return Err(ManifestInconsistency::FileEntry {
                index: ps,
                name: entry.name.clone(),
                ps: entry.ps,
                expected,
            });
        }
        if entry.sha256.len() != 64 || !entry.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ManifestInconsistency::BadSha256 {
                name: entry.name.clone(),
                sha256: entry.sha256.clone(),
            });
        }
    }
    Ok(())
}

/// Checks a shard's bytes against the size and SHA-256 its manifest `entry` records.
fn verify_file(bytes: &[u8], entry: &FileEntry, file: &str) -> Result<(), LoadError> {
    if bytes.len() as u64 > entry.bytes {
        return Err(LoadError::LongerThanRecorded {
            file: file.to_string(),
            expected: entry.bytes,
        });
    }
    if bytes.len() as u64 != entry.bytes {
        return Err(LoadError::SizeMismatch {
            file: file.to_string(),
            expected: entry.bytes,
            found: bytes.len() as u64,
        });
    }
    let sha = hex::encode(Sha256::digest(bytes));
    if !sha.eq_ignore_ascii_case(&entry.sha256) {
        return Err(LoadError::ChecksumMismatch {
            file: file.to_string(),
            expected: entry.sha256.clone(),
            found: sha,
        });
    }
    Ok(())
}

fn parse_shard(
    bytes: &[u8],
    entry: &FileEntry,
    step: u64,
    file: &str,
) -> Result<ShardTensors, LoadError> {
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|source| LoadError::ShardParse {
            file: file.to_string(),
            source,
        })?;
    let st =
        safetensors::SafeTensors::deserialize(bytes).map_err(|source| LoadError::ShardParse {
            file: file.to_string(),
            source,
        })?;
    let invalid = |reason: ManifestInconsistency| LoadError::ManifestInvalid {
        file: file.to_string(),
        reason,
    };
    if let Some(found) = meta.metadata().as_ref().and_then(|m| m.get("step")) {
        if *found != step.to_string() {
            return Err(invalid(ManifestInconsistency::ShardStep {
                found: found.clone(),
                step,
            }));
        }
    }
    let mut tensors = BTreeMap::new();
    for (name, view) in st.iter() {
        let dtype =
            Dtype::from_safetensors(view.dtype()).ok_or_else(|| LoadError::UnsupportedDtype {
                file: file.to_string(),
                tensor: name.to_string(),
                dtype: view.dtype().to_string(),
            })?;
        let tensor = TensorBytes::new(dtype, view.shape().to_vec(), view.data().to_vec()).map_err(
            |source| LoadError::BadTensor {
                file: file.to_string(),
                tensor: name.to_string(),
                source,
            },
        )?;
        tensors.insert(name.to_string(), tensor);
    }
    if !tensors.keys().eq(entry.tensors.iter()) {
        return Err(invalid(ManifestInconsistency::ShardTensors {
            found: tensors.keys().cloned().collect(),
            listed: entry.tensors.clone(),
        }));
    }
    Ok(ShardTensors { tensors })
}

/// Largest manifest read; ledger id sets are range-compressed, so real ones stay far below.
const MANIFEST_BYTES_MAX: u64 = 256 * 1024 * 1024;
