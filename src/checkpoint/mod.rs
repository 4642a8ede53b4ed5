//! Checkpoints (DESIGN.md §5, CKPT-1): what a checkpoint holds, the safetensors shard files
//! and the manifest written last, the atomic commit with fsyncs, retention, and restore of the
//! newest checkpoint that verifies.
//!
//! A checkpoint is a directory `ckpt-<step>` under the checkpoint root:
//!
//! ```text
//! ckpt-200/
//!   shard-0-of-2.safetensors   tensors of PS 0: variable parts and their optimizer slots
//!   shard-1-of-2.safetensors   tensors of PS 1
//!   manifest.json              written last: step, layout, sizes and SHA-256 of the shards,
//!                              slot names, dataset positions, the coordinator's ledger, and
//!                              last its own SHA-256 (see `manifest`)
//! ```
//!
//! The shard files are plain safetensors files (with `format`, `step`, `ps`, `num_ps` in their
//! `__metadata__`) and load unchanged in Python's `safetensors` package.
//!
//! This module owns the on-disk format and its protocol; it knows nothing of the roles that
//! produce or consume the content, and it never restores a partial or corrupt checkpoint.
//! It also owns the ways in and out of the format: a summary of a checkpoint root
//! (`inspect`), a checkpoint as one safetensors file of whole variables (`export`), and the
//! initial values of a job's variables from another framework's safetensors file
//! (`warm_start`).

mod content;
mod export;
mod failpoint;
mod inspect;
mod manager;
mod manifest;
mod regular_file;
mod store;
mod tensor;
mod warm_start;

pub use content::{
    shard_file_name, slot_tensor_name, update_count_key, Checkpoint, Ledger, ShardTensors,
    ValidationError, UPDATE_COUNT_PREFIX,
};
pub use export::{export_safetensors, whole_tensors, ExportError, EXPORT_FORMAT};
pub use failpoint::{FailAction, FailSite, FailpointHook, FAILPOINT_ENV, FAILPOINT_EXIT_CODE};
pub use inspect::{is_checkpoint_dir, summarize, summarize_root, CheckpointSummary};
pub use manager::{
    list_checkpoints, CheckpointEntry, CheckpointManager, CheckpointPolicy, ListError, PolicyError,
    RestoreOutcome, Skipped,
};
pub use manifest::{
    FileEntry, Manifest, ManifestError, FORMAT_NAME, FORMAT_VERSION, MANIFEST_CHECKSUM_FIELD,
    MANIFEST_FILE, MANIFEST_TRAILER_BYTES,
};
pub use store::{
    checkpoint_dir_name, decode_checkpoint, decode_manifest, encode_checkpoint,
    encode_checkpoint_at, parse_checkpoint_dir_name, read_checkpoint, read_manifest,
    write_checkpoint, LoadError, LoadedCheckpoint, ManifestInconsistency, SaveError,
    CHECKPOINT_DIR_PREFIX, TEMP_DIR_PREFIX,
};
pub use tensor::{TensorBytes, TensorError};
pub use warm_start::{parse_name_map, WarmStart, WarmStartError};

pub use crate::layout::{Dtype, SLOT_INFIX};
