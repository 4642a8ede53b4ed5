//! Element types of the tensors a layout describes; names match safetensors' (`"F32"`,
//! `"I64"`, ...), so a manifest and a shard file name a dtype the same way.

use std::fmt;

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

/// Element type of a variable or a stored tensor; names match safetensors' (`"F32"`, `"I64"`, ...).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Encode, Decode,
)]
pub enum Dtype {
    /// Boolean, one byte per element.
    #[serde(rename = "BOOL")]
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// IEEE single precision.
    F32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE double precision.
    F64,
}

impl Dtype {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// The safetensors name of the dtype (`"F32"`, `"BOOL"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::F32 => "F32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F64 => "F64",
        }
    }

    /// Maps a safetensors dtype to ours; `None` for the ones checkpoints do not carry.
    pub fn from_safetensors(dtype: safetensors::Dtype) -> Option<Self> {
        use safetensors::Dtype as S;
        Some(match dtype {
            S::BOOL => Dtype::Bool,
            S::U8 => Dtype::U8,
            S::I8 => Dtype::I8,
            S::U16 => Dtype::U16,
            S::I16 => Dtype::I16,
            S::F16 => Dtype::F16,
            S::BF16 => Dtype::BF16,
            S::U32 => Dtype::U32,
            S::I32 => Dtype::I32,
            S::F32 => Dtype::F32,
            S::U64 => Dtype::U64,
            S::I64 => Dtype::I64,
            S::F64 => Dtype::F64,
            _ => return None,
        })
    }

    /// The safetensors dtype with the same layout.
    pub fn to_safetensors(self) -> safetensors::Dtype {
        use safetensors::Dtype as S;
        match self {
            Dtype::Bool => S::BOOL,
            Dtype::U8 => S::U8,
            Dtype::I8 => S::I8,
            Dtype::U16 => S::U16,
            Dtype::I16 => S::I16,
            Dtype::F16 => S::F16,
            Dtype::BF16 => S::BF16,
            Dtype::U32 => S::U32,
            Dtype::I32 => S::I32,
            Dtype::F32 => S::F32,
            Dtype::U64 => S::U64,
            Dtype::I64 => S::I64,
            Dtype::F64 => S::F64,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
