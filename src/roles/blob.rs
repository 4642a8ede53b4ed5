//! Blobs: the raw little-endian buffers that travel beside a message (gradients, pulled
//! values, row ids), how they are made without copying where the machine allows, and how a
//! receiver reads them back, checked, with an error naming the buffer.
//!
//! A leaf of `roles`: the messages (`protocol`) and a push's planning (`push`) both use it.

use std::borrow::Cow;

use bincode::{Decode, Encode};
use bytes::Bytes;

/// A blob (a raw little-endian buffer beside a message) that is missing or not what the
/// message says it is; `what` names the buffer (usually the variable).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, thiserror::Error)]
pub enum BlobError {
    /// The message carries fewer blobs than it needs.
    #[error("{what}: missing blob {index} (message carries {carried})")]
    Missing {
        /// The buffer expected.
        what: String,
        /// Its index among the blobs.
        index: u64,
        /// Blobs the message carries.
        carried: u64,
    },
    /// A length that is not a whole number of elements.
    #[error("{what}: {bytes} bytes is not a whole number of {element} values")]
    Ragged {
        /// The buffer.
        what: String,
        /// Its length.
        bytes: u64,
        /// The element type it holds.
        element: Element,
    },
    /// A length other than the one expected.
    #[error("{what}: {bytes} bytes where {expected} {element} values were expected")]
    Length {
        /// The buffer.
        what: String,
        /// Its length.
        bytes: u64,
        /// Values expected.
        expected: u64,
        /// The element type it holds.
        element: Element,
    },
}

/// The element type of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum Element {
    /// Little-endian f32.
    F32,
    /// Little-endian u64.
    U64,
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Element::F32 => "f32",
            Element::U64 => "u64",
        })
    }
}

/// A blob of little-endian f32 (one copy).
pub fn f32_blob(values: &[f32]) -> Bytes {
    Bytes::from(f32_to_bytes(values))
}

/// A blob of little-endian f32 that takes `values` over without copying them (on
/// little-endian machines): gradients and pulled rows are megabytes per step.
pub fn f32_vec_blob(values: Vec<f32>) -> Bytes {
    if cfg!(target_endian = "little") {
        return Bytes::from_owner(PodOwner(values));
    }
    f32_blob(&values)
}

/// A blob of little-endian f32 that shares `values` without copying them (on little-endian
/// machines): a parameter server's reply to a pull of a whole shard.
pub fn f32_shared_blob(values: std::sync::Arc<Vec<f32>>) -> Bytes {
    if cfg!(target_endian = "little") {
        return Bytes::from_owner(SharedF32(values));
    }
    f32_blob(&values)
}

/// Shared f32 values seen as their bytes, so that a [`Bytes`] can hold them.
struct SharedF32(std::sync::Arc<Vec<f32>>);

impl AsRef<[u8]> for SharedF32 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

/// A blob of little-endian u64 that takes `values` over without copying them (on
/// little-endian machines).
pub fn u64_vec_blob(values: Vec<u64>) -> Bytes {
    if cfg!(target_endian = "little") {
        return Bytes::from_owner(PodOwner(values));
    }
    u64_blob(&values)
}

/// A vector of plain numbers seen as its bytes, so that a [`Bytes`] can own it.
struct PodOwner<T>(Vec<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for PodOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// The little-endian f32 `bytes` as values: borrowed when the buffer is aligned for f32 (a
/// received blob almost always is), copied otherwise. `what` names the buffer in the error.
pub fn f32_view<'a>(bytes: &'a [u8], what: &str) -> Result<Cow<'a, [f32]>, BlobError> {
    if cfg!(target_endian = "little") {
        if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
            return Ok(Cow::Borrowed(values));
        }
    }
    bytes_to_f32(bytes, what).map(Cow::Owned)
}

/// The little-endian u64 `bytes` as values, borrowed when aligned (see [`f32_view`]).
pub fn u64_view<'a>(bytes: &'a [u8], what: &str) -> Result<Cow<'a, [u64]>, BlobError> {
    if cfg!(target_endian = "little") {
        if let Ok(values) = bytemuck::try_cast_slice::<u8, u64>(bytes) {
            return Ok(Cow::Borrowed(values));
        }
    }
    blob_u64(bytes, what).map(Cow::Owned)
}

/// Decodes the little-endian f32 `bytes` into `out` (exactly as long); `what` names the
/// buffer in the error. One copy, straight into where the values are needed.
pub fn decode_f32_into(out: &mut [f32], bytes: &[u8], what: &str) -> Result<(), BlobError> {
    if bytes.len() != out.len() * 4 {
        return Err(BlobError::Length {
            what: what.into(),
            bytes: bytes.len() as u64,
            expected: out.len() as u64,
            element: Element::F32,
        });
    }
    if cfg!(target_endian = "little") {
        bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes);
    } else {
        for (v, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    Ok(())
}

/// A blob of little-endian u64.
pub fn u64_blob(values: &[u64]) -> Bytes {
    if cfg!(target_endian = "little") {
        return Bytes::copy_from_slice(bytemuck::cast_slice::<u64, u8>(values));
    }
    Bytes::from(
        values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
}

/// The u64 values of a little-endian blob; `what` names it in the error.
pub fn blob_u64(bytes: &[u8], what: &str) -> Result<Vec<u64>, BlobError> {
    if bytes.len() % 8 != 0 {
        return Err(BlobError::Ragged {
            what: what.into(),
            bytes: bytes.len() as u64,
            element: Element::U64,
        });
    }
    if cfg!(target_endian = "little") {
        let mut values = vec![0u64; bytes.len() / 8];
        bytemuck::cast_slice_mut::<u64, u8>(&mut values).copy_from_slice(bytes);
        return Ok(values);
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// Blob `index` of a message, or an error naming what was expected there.
pub fn blob<'a>(blobs: &'a [Bytes], index: usize, what: &str) -> Result<&'a Bytes, BlobError> {
    blobs.get(index).ok_or_else(|| BlobError::Missing {
        what: what.into(),
        index: index as u64,
        carried: blobs.len() as u64,
    })
}

/// The f32 values of little-endian `bytes`; `what` names the buffer in the error.
pub fn bytes_to_f32(bytes: &[u8], what: &str) -> Result<Vec<f32>, BlobError> {
    if bytes.len() % 4 != 0 {
        return Err(BlobError::Ragged {
            what: what.into(),
            bytes: bytes.len() as u64,
            element: Element::F32,
        });
    }
    if cfg!(target_endian = "little") {
        // Copies into an aligned buffer: the received bytes need not be 4-byte aligned.
        let mut values = vec![0f32; bytes.len() / 4];
        bytemuck::cast_slice_mut::<f32, u8>(&mut values).copy_from_slice(bytes);
        return Ok(values);
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Little-endian bytes of `values` (one copy on little-endian machines).
pub fn f32_to_bytes(values: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        return bytemuck::cast_slice::<f32, u8>(values).to_vec();
    }
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
