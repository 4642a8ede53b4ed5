//! The manifest: the JSON file written last into a checkpoint directory, which makes the
//! directory a checkpoint (CKPT-1). It names every shard file with its size and SHA-256, and
//! carries its own SHA-256 so that no damage to it goes unnoticed.
//!
//! On disk, `manifest.json` is one JSON object whose last field is its own checksum:
//!
//! ```text
//! {
//!   "format": "cohort-checkpoint",
//!   "format_version": 2,
//!   ...
//!   "extra": null,
//!   "manifest_sha256": "<64 lowercase hex>"
//! }
//! ```
//!
//! The checksum is the SHA-256 of the file's exact bytes from the opening `{` up to, not
//! including, the `,` that ends the field before it. Those covered bytes are followed by a
//! trailer of [`MANIFEST_TRAILER_BYTES`] bytes: `,\n  "manifest_sha256": "`, the 64 lowercase
//! hex digits, then `"\n}\n`. The reader checks the trailer byte for byte and the digest
//! before it parses anything, so every byte of the file is verified: a flipped bit in the
//! covered bytes changes their digest; one in the trailer breaks its exact form or names
//! another digest (upper-case hex is refused, so a flipped case bit is caught too). A manifest
//! without the trailer, such as one written before format version 2, is never trusted. The
//! file stays plain JSON (Python's `json.load` reads it as before).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::content::Ledger;
use crate::layout::Layout;

/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Value of [`Manifest::format`].
pub const FORMAT_NAME: &str = "cohort-checkpoint";

/// Manifest format version this build writes and reads. Version 2 added the manifest's own
/// checksum; version 1 manifests have none and are not restored.
pub const FORMAT_VERSION: u32 = 2;

/// Name of the manifest's last field, its own SHA-256.
pub const MANIFEST_CHECKSUM_FIELD: &str = "manifest_sha256";

/// Length of the manifest's trailer: `,\n  "manifest_sha256": "`, 64 hex digits, `"\n}\n`.
pub const MANIFEST_TRAILER_BYTES: usize = TRAILER_HEAD.len() + SHA256_HEX_LEN + TRAILER_TAIL.len();

/// Contents of `manifest.json` (its checksum field aside, see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written by this build.
    pub format_version: u32,
    /// Global training step.
    pub step: u64,
    /// Wall-clock time of the save, milliseconds since the Unix epoch (informational).
    pub created_unix_ms: u64,
    /// Number of parameter-server shards (one file each).
    pub num_ps: u32,
    /// Where every variable lives.
    pub layout: Vec<Layout>,
    /// One entry per shard file, in PS order.
    pub files: Vec<FileEntry>,
    /// Optimizer slot names per variable (`dense/kernel` → `["m", "v"]`).
    pub slots: BTreeMap<String, Vec<String>>,
    /// Per-worker dataset position: worker index → elements consumed.
    pub dataset_positions: BTreeMap<u32, u64>,
    /// The coordinator's ledger at the cut.
    pub ledger: Ledger,
    /// Caller-defined extra state.
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// A shard file as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint directory, `shard-<ps>-of-<n>.safetensors`.
    pub name: String,
    /// Parameter server whose tensors the file holds.
    pub ps: u32,
    /// File size in bytes.
    pub bytes: u64,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
    /// Names of the tensors in the file, sorted.
    pub tensors: Vec<String>,
}

/// Why the bytes of a `manifest.json` are not a manifest this build trusts.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The bytes do not end with the checksum trailer (see the module doc): damaged,
    /// truncated, or written before manifests carried a checksum.
    #[error("no manifest checksum: {0}")]
    ChecksumMissing(String),
    /// The covered bytes do not hash to the checksum the trailer holds.
    #[error(
        "manifest checksum mismatch (manifest says sha256 {expected}, its bytes hash to {found})"
    )]
    ChecksumMismatch {
        /// Digest in the trailer.
        expected: String,
        /// Digest of the covered bytes.
        found: String,
    },
    /// The checksum verifies but the JSON is not a manifest (only a writer bug gets here).
    #[error("not a valid manifest: {0}")]
    Parse(#[source] serde_json::Error),
}

impl Manifest {
    /// The bytes of `manifest.json` for this manifest, its checksum trailer included.
    pub fn to_file_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let pretty = serde_json::to_vec_pretty(self)?;
        // A struct serializes pretty as `{\n ... \n}`; the checksum field goes before the `}`.
        let covered = pretty
            .strip_suffix(b"\n}")
            .expect("serde_json writes a pretty struct as `{...\\n}`");
        let mut bytes = Vec::with_capacity(covered.len() + MANIFEST_TRAILER_BYTES);
        bytes.extend_from_slice(covered);
        bytes.extend_from_slice(TRAILER_HEAD);
        bytes.extend_from_slice(hex::encode(Sha256::digest(covered)).as_bytes());
        bytes.extend_from_slice(TRAILER_TAIL);
        debug_assert_eq!(bytes.len(), covered.len() + MANIFEST_TRAILER_BYTES);
        Ok(bytes)
    }

    /// Verifies the checksum of `bytes` (a whole `manifest.json`), then parses them. Nothing
    /// is parsed before the checksum verifies. Never panics on bad input.
    pub fn from_file_bytes(bytes: &[u8]) -> Result<Self, ManifestError> {
        let Some(at) = bytes.len().checked_sub(MANIFEST_TRAILER_BYTES) else {
            return Err(missing(
                bytes,
                "the file is shorter than the checksum trailer",
            ));
        };
        let (covered, trailer) = bytes.split_at(at);
        let (head, rest) = trailer.split_at(TRAILER_HEAD.len());
        let (digest, tail) = rest.split_at(SHA256_HEX_LEN);
        if head != TRAILER_HEAD || tail != TRAILER_TAIL {
            return Err(missing(
                bytes,
                "the file does not end with `\"manifest_sha256\": \"<64 hex digits>\"` as its \
                 last field",
            ));
        }
        // Lower case only: a flipped case bit must not name the same digest.
        if !digest
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return Err(ManifestError::ChecksumMissing(format!(
                "{MANIFEST_CHECKSUM_FIELD} {:?} is not 64 lowercase hex digits",
                String::from_utf8_lossy(digest)
            )));
        }
        let found = hex::encode(Sha256::digest(covered));
        if found.as_bytes() != digest {
            return Err(ManifestError::ChecksumMismatch {
                // ASCII hex digits, checked above.
                expected: String::from_utf8_lossy(digest).into_owned(),
                found,
            });
        }
        serde_json::from_slice(bytes).map_err(ManifestError::Parse)
    }
}

/// A [`ManifestError::ChecksumMissing`] saying `why`, and naming the format version when the
/// bytes are an older manifest, which never had a checksum.
fn missing(bytes: &[u8], why: &str) -> ManifestError {
    #[derive(Deserialize)]
    struct Version {
        format: String,
        format_version: u32,
    }
    // Only to word the reason: nothing from these unverified bytes is used.
    match serde_json::from_slice::<Version>(bytes) {
        Ok(v) if v.format == FORMAT_NAME && v.format_version < FORMAT_VERSION => {
            ManifestError::ChecksumMissing(format!(
                "format version {} manifest, written before manifests carried a checksum; this \
                 build restores only checksummed manifests (version {FORMAT_VERSION})",
                v.format_version
            ))
        }
        _ => ManifestError::ChecksumMissing(format!("{why} (damaged or truncated)")),
    }
}

/// The trailer before the digest: closes the last covered field, opens the checksum field.
const TRAILER_HEAD: &[u8] = b",\n  \"manifest_sha256\": \"";

/// The trailer after the digest.
const TRAILER_TAIL: &[u8] = b"\"\n}\n";

/// Hex digits of a SHA-256 digest.
const SHA256_HEX_LEN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let mut ledger = Ledger::default();
        ledger.committed_ids.extend(0..40);
        ledger.pending_ids.insert(40);
        Manifest {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            step: 40,
            created_unix_ms: 1_700_000_000_000,
            num_ps: 1,
            layout: Vec::new(),
            files: vec![FileEntry {
                name: "shard-0-of-1.safetensors".into(),
                ps: 0,
                bytes: 8,
                sha256: "ab".repeat(32),
                tensors: Vec::new(),
            }],
            slots: BTreeMap::new(),
            dataset_positions: BTreeMap::from([(0, 400)]),
            ledger,
            extra: serde_json::json!({ "note": "é" }),
        }
    }

    #[test]
    fn ckpt1_manifest_round_trips_and_is_plain_json_ending_with_its_checksum() {
        let m = manifest();
        let bytes = m.to_file_bytes().unwrap();
        assert_eq!(Manifest::from_file_bytes(&bytes).unwrap(), m);
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let covered = &bytes[..bytes.len() - MANIFEST_TRAILER_BYTES];
        assert_eq!(
            json[MANIFEST_CHECKSUM_FIELD],
            hex::encode(Sha256::digest(covered))
        );
        assert_eq!(json["step"], 40);
    }

    /// CKPT-1: no single bit flip anywhere in the file yields a manifest that is accepted.
    #[test]
    fn ckpt1_every_single_bit_flip_is_refused() {
        let bytes = manifest().to_file_bytes().unwrap();
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << bit;
                match Manifest::from_file_bytes(&flipped) {
                    Err(
                        ManifestError::ChecksumMissing(_) | ManifestError::ChecksumMismatch { .. },
                    ) => {}
                    other => panic!("byte {at} bit {bit}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn ckpt1_every_truncation_is_refused() {
        let bytes = manifest().to_file_bytes().unwrap();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Manifest::from_file_bytes(&bytes[..len]),
                    Err(ManifestError::ChecksumMissing(_) | ManifestError::ChecksumMismatch { .. })
                ),
                "truncated to {len} bytes"
            );
        }
    }

    #[test]
    fn a_version_1_manifest_without_checksum_is_refused_and_named() {
        let mut json = serde_json::to_value(manifest()).unwrap();
        json["format_version"] = 1.into();
        let err = Manifest::from_file_bytes(&serde_json::to_vec_pretty(&json).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("no manifest checksum: format version 1 manifest"),
            "{err}"
        );
    }

    #[test]
    fn an_upper_case_checksum_is_refused() {
        let bytes = manifest().to_file_bytes().unwrap();
        let at = bytes.len() - TRAILER_TAIL.len() - SHA256_HEX_LEN;
        let mut upper = bytes.clone();
        upper[at..at + SHA256_HEX_LEN].make_ascii_uppercase();
        assert_ne!(upper, bytes, "the digest has letters");
        let err = Manifest::from_file_bytes(&upper).unwrap_err().to_string();
        assert!(err.contains("not 64 lowercase hex digits"), "{err}");
    }
}
