//! Tensors as a checkpoint sees them: a dtype, a shape and little-endian bytes.
//!
//! The checkpoint never interprets values, so bit patterns (NaN payloads, signed zeros)
//! survive a save and a restore unchanged.

use std::borrow::Cow;

use crate::layout::Dtype;

/// Why a tensor could not be built or read as the requested type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// The byte length does not match dtype × shape.
    #[error("{dtype} tensor of shape {shape:?} needs {expected} bytes, got {found}")]
    LengthMismatch {
        /// Element type.
        dtype: Dtype,
        /// Shape given.
        shape: Vec<usize>,
        /// Bytes dtype × shape needs.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// The element count or byte size overflows `usize`.
    #[error("{dtype} tensor of shape {shape:?} is too large to address")]
    Overflow {
        /// Element type.
        dtype: Dtype,
        /// Shape given.
        shape: Vec<usize>,
    },
    /// The tensor holds another dtype than the accessor reads.
    #[error("tensor is {found}, not {expected}")]
    DtypeMismatch {
        /// Dtype the accessor reads.
        expected: Dtype,
        /// Dtype the tensor holds.
        found: Dtype,
    },
}

/// A dense tensor as raw little-endian bytes, row-major ('C' order).
///
/// The length of `data` always equals `dtype.size_bytes() × product(shape)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorBytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl TensorBytes {
    /// Wraps `data` (little-endian, row-major), checking its length against dtype and shape.
    pub fn new(dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) -> Result<Self, TensorError> {
        let expected = byte_len(dtype, &shape)?;
        if data.len() != expected {
            return Err(TensorError::LengthMismatch {
                dtype,
                shape,
                expected,
                found: data.len(),
            });
        }
        Ok(Self { dtype, shape, data })
    }

    /// An `F32` tensor from values; bit patterns (NaN payloads) are kept.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Self, TensorError> {
        Self::new(
            Dtype::F32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// An `F64` tensor from values; bit patterns (NaN payloads) are kept.
    pub fn from_f64(shape: Vec<usize>, values: &[f64]) -> Result<Self, TensorError> {
        Self::new(
            Dtype::F64,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// An `I64` tensor from values.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Result<Self, TensorError> {
        Self::new(
            Dtype::I64,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// An `I32` tensor from values.
    pub fn from_i32(shape: Vec<usize>, values: &[i32]) -> Result<Self, TensorError> {
        Self::new(
            Dtype::I32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Shape (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The little-endian bytes, row-major.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.data.len() / self.dtype.size_bytes()
    }

    /// Consumes the tensor, giving its bytes.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// The values of an `F32` tensor, bit for bit.
    pub fn to_f32(&self) -> Result<Vec<f32>, TensorError> {
        self.expect(Dtype::F32)?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The values of an `F64` tensor, bit for bit.
    pub fn to_f64(&self) -> Result<Vec<f64>, TensorError> {
        self.expect(Dtype::F64)?;
        Ok(self
            .data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(le8(c)))
            .collect())
    }

    /// The values of an `I64` tensor.
    pub fn to_i64(&self) -> Result<Vec<i64>, TensorError> {
        self.expect(Dtype::I64)?;
        Ok(self
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(le8(c)))
            .collect())
    }

    /// The values of an `I32` tensor.
    pub fn to_i32(&self) -> Result<Vec<i32>, TensorError> {
        self.expect(Dtype::I32)?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn expect(&self, expected: Dtype) -> Result<(), TensorError> {
        if self.dtype == expected {
            Ok(())
        } else {
            Err(TensorError::DtypeMismatch {
                expected,
                found: self.dtype,
            })
        }
    }
}

impl safetensors::View for &TensorBytes {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype.to_safetensors()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Bytes that `dtype` × `shape` occupies, or an overflow error.
pub(crate) fn byte_len(dtype: Dtype, shape: &[usize]) -> Result<usize, TensorError> {
    shape
        .iter()
        .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TensorError::Overflow {
            dtype,
            shape: shape.to_vec(),
        })
}

fn le8(c: &[u8]) -> [u8; 8] {
    [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_is_checked() {
        let err = TensorBytes::new(Dtype::F32, vec![2, 3], vec![0; 23]).unwrap_err();
        assert!(matches!(
            err,
            TensorError::LengthMismatch {
                expected: 24,
                found: 23,
                ..
            }
        ));
    }

    #[test]
    fn overflow_is_an_error() {
        let err = TensorBytes::new(Dtype::F64, vec![usize::MAX, 2], vec![]).unwrap_err();
        assert!(matches!(err, TensorError::Overflow { .. }));
    }

    #[test]
    fn nan_payload_survives_f32_round_trip() {
        let nan = f32::from_bits(0x7fc0_1234);
        let t = TensorBytes::from_f32(vec![2], &[nan, -0.0]).unwrap();
        let back = t.to_f32().unwrap();
        assert_eq!(back[0].to_bits(), 0x7fc0_1234);
        assert_eq!(back[1].to_bits(), (-0.0f32).to_bits());
        assert!(matches!(t.to_f64(), Err(TensorError::DtypeMismatch { .. })));
    }

    #[test]
    fn scalar_has_one_element() {
        let t = TensorBytes::from_i64(vec![], &[7]).unwrap();
        assert_eq!(t.num_elements(), 1);
        assert_eq!(t.to_i64().unwrap(), vec![7]);
    }
}
