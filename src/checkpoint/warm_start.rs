//! Checkpoints in: a job's variables initialised from a safetensors file written by another
//! framework (PyTorch, JAX, numpy, `cohort ckpt export`) — TensorFlow's `warm_start`.
//!
//! The file holds whole tensors by name. A variable takes the tensor of its own name, or the
//! name a name map gives it: a TOML file of `cohort name = "file name"` lines, e.g.
//!
//! ```toml
//! "dense/kernel" = "encoder.layer0.weight"
//! "dense/bias" = "encoder.layer0.bias"
//! ```
//!
//! Shapes must match exactly; F32, F64, F16 and BF16 tensors are read (as F32, the dtype of a
//! job's variables). A partitioned variable gets each parameter server's rows. Optimizer state
//! is not read: it starts fresh. Every refusal names the variable and the file.
//!
//! This module only reads and checks; the coordinator decides when to use it (a variable is
//! warm-started when created, and a checkpoint to resume from, if any, overrides it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::regular_file::{self, OpenRefused};
use super::tensor::{TensorBytes, TensorError};
use crate::layout::{Dtype, Layout};

/// Why a warm start cannot be used. Every message names the file (and the variable where one
/// is at fault).
#[derive(Debug, thiserror::Error)]
pub enum WarmStartError {
    /// The file (safetensors or name map) could not be read.
    #[error("warm start: cannot read {}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file (safetensors or name map) is not a regular file: nothing was read from it.
    #[error("warm start: {} is not a regular file but {kind}", file.display())]
    NotAFile {
        /// The file.
        file: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The name map is larger than any name map needs to be.
    #[error("warm start: the name map {} is over {max} bytes", file.display())]
    MapTooLarge {
        /// The name map.
        file: PathBuf,
        /// The limit.
        max: u64,
    },
    /// The safetensors file is not one.
    #[error("warm start: {} is not a valid safetensors file: {source}", file.display())]
    NotSafetensors {
        /// The file.
        file: PathBuf,
        /// What safetensors said.
        source: safetensors::SafeTensorError,
    },
    /// A shard's rows of a tensor do not make a tensor (its shape was checked against the
    /// layout, so this is not expected).
    #[error(
        "warm start: {} is not a valid safetensors file: tensor {tensor:?}: {source}",
        file.display()
    )]
    Rows {
        /// The safetensors file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why the rows are not a tensor.
        source: TensorError,
    },
    /// The name map is not TOML.
    #[error("warm start: name map {}: {source}", file.display())]
    MapNotToml {
        /// The map file.
        file: PathBuf,
        /// What the TOML parser said.
        source: toml::de::Error,
    },
    /// A name map entry that is not a non-empty string.
    #[error(
        "warm start: name map {}: {variable:?} must map to a tensor name (a non-empty string, \
         e.g. \"{variable}\" = \"model.weight\"), got {value}",
        file.display()
    )]
    MapValue {
        /// The map file.
        file: PathBuf,
        /// The variable the entry is for.
        variable: String,
        /// The value it gives.
        value: toml::Value,
    },
    /// The name map names a tensor the file does not hold.
    #[error(
        "warm start: name map {}: variable {variable:?} maps to {tensor:?}, which {} does not \
         hold (it holds {})",
        map.display(), file.display(), list(available)
    )]
    MappedTensorMissing {
        /// The map file.
        map: PathBuf,
        /// The safetensors file.
        file: PathBuf,
        /// The variable.
        variable: String,
        /// The tensor name the map gives.
        tensor: String,
        /// The names the file holds.
        available: Vec<String>,
    },
    /// The name map names a variable the job does not create.
    #[error(
        "warm start: name map {}: variable {variable:?} is not a variable of this job (it has {})",
        map.display(), list(variables)
    )]
    UnknownVariable {
        /// The map file.
        map: PathBuf,
        /// The variable named.
        variable: String,
        /// The job's variables.
        variables: Vec<String>,
    },
    /// A variable has no tensor in the file (under its own name, with no map entry).
    #[error(
        "warm start: variable {variable:?}: {} holds no tensor {variable:?} and no name map \
         entry gives it another name (it holds {}; map names with --warm-start-map: \
         \"{variable}\" = \"<name in the file>\")",
        file.display(), list(available)
    )]
    NotInFile {
        /// The safetensors file.
        file: PathBuf,
        /// The variable.
        variable: String,
        /// The names the file holds.
        available: Vec<String>,
    },
    /// The tensor's shape differs from the variable's.
    #[error(
        "warm start: variable {variable:?} has shape {expected:?}, but tensor {tensor:?} of {} \
         has shape {found:?}",
        file.display()
    )]
    ShapeMismatch {
        /// The safetensors file.
        file: PathBuf,
        /// The variable.
        variable: String,
        /// The tensor.
        tensor: String,
        /// The variable's shape.
        expected: Vec<usize>,
        /// The tensor's shape.
        found: Vec<usize>,
    },
    /// The tensor's dtype cannot be read as the variable's.
    #[error(
        "warm start: variable {variable:?} is {expected}, but tensor {tensor:?} of {} is {found} \
         (F32, F64, F16 and BF16 are read)",
        file.display()
    )]
    Dtype {
        /// The safetensors file.
        file: PathBuf,
        /// The variable.
        variable: String,
        /// The tensor.
        tensor: String,
        /// The variable's dtype.
        expected: Dtype,
        /// The tensor's dtype, as safetensors names it.
        found: String,
    },
}

/// A safetensors file to initialise variables from, with its name map.
#[derive(Clone)]
pub struct WarmStart {
    file: PathBuf,
    bytes: Vec<u8>,
    names: Vec<String>,
    map_file: Option<PathBuf>,
    map: BTreeMap<String, String>,
}

impl std::fmt::Debug for WarmStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmStart")
            .field("file", &self.file)
            .field("tensors", &self.names.len())
            .field("map_file", &self.map_file)
            .field("map", &self.map)
            .finish()
    }
}

/// The largest name map read (bytes): a line per tensor, far below this for any model.
const MAP_BYTES_MAX: u64 = 64 << 20;

impl WarmStart {
    /// Reads the safetensors `file` and the name map `map_file` (if any), and checks that the
    /// file is valid and that every name the map gives is in it.
    pub fn open(file: &Path, map_file: Option<&Path>) -> Result<Self, WarmStartError> {
        let refused = |path: &Path| {
            let path = path.to_path_buf();
            move |refused| match refused {
                OpenRefused::Io(source) => WarmStartError::Io { file: path, source },
                OpenRefused::NotAFile(kind) => WarmStartError::NotAFile { file: path, kind },
            }
        };
        let bytes = regular_file::read_regular(file, u64::MAX).map_err(refused(file))?;
        let map = match map_file {
            Some(path) => {
                let bytes =
                    regular_file::read_regular(path, MAP_BYTES_MAX + 1).map_err(refused(path))?;
                if bytes.len() as u64 > MAP_BYTES_MAX {
                    return Err(WarmStartError::MapTooLarge {
                        file: path.to_path_buf(),
                        max: MAP_BYTES_MAX,
                    });
                }
                let text = String::from_utf8(bytes).map_err(|e| WarmStartError::Io {
                    file: path.to_path_buf(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
                })?;
                parse_name_map(&text, path)?
            }
            None => BTreeMap::new(),
        };
        Self::from_bytes(file, bytes, map_file, map)
    }

    /// As [`WarmStart::open`], with the file's bytes and the parsed map given (`file` and
    /// `map_file` name them in errors).
    pub fn from_bytes(
        file: &Path,
        bytes: Vec<u8>,
        map_file: Option<&Path>,
        map: BTreeMap<String, String>,
    ) -> Result<Self, WarmStartError> {
        let names = {
            let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|source| {
                WarmStartError::NotSafetensors {
                    file: file.to_path_buf(),
                    source,
                }
            })?;
            let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
            names.sort();
            names
        };
        let map_path = map_file.map_or_else(|| PathBuf::from("(name map)"), Path::to_path_buf);
        for (variable, tensor) in &map {
            if names.binary_search(tensor).is_err() {
                return Err(WarmStartError::MappedTensorMissing {
                    map: map_path,
                    file: file.to_path_buf(),
                    variable: variable.clone(),
                    tensor: tensor.clone(),
                    available: names,
                });
            }
        }
        Ok(Self {
            file: file.to_path_buf(),
            bytes,
            names,
            map_file: map_file.map(Path::to_path_buf),
            map,
        })
    }

    /// The safetensors file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The name of the tensor in the file that `variable` starts from.
    pub fn tensor_name<'a>(&'a self, variable: &'a str) -> &'a str {
        self.map.get(variable).map_or(variable, String::as_str)
    }

    /// The initial values of `layout`'s variable, one F32 tensor per shard (its rows), from
    /// the file. Fails, naming the variable and the file, when the file has no tensor for it
    /// or its shape differs.
    pub fn shard_values(&self, layout: &Layout) -> Result<Vec<TensorBytes>, WarmStartError> {
        let variable = layout.name.clone();
        let tensor = self.tensor_name(&layout.name).to_string();
        let not_safetensors = |source| WarmStartError::NotSafetensors {
            file: self.file.clone(),
            source,
        };
        let st = safetensors::SafeTensors::deserialize(&self.bytes).map_err(not_safetensors)?;
        let view = st.tensor(&tensor).map_err(|_| WarmStartError::NotInFile {
            file: self.file.clone(),
            variable: variable.clone(),
            available: self.names.clone(),
        })?;
        if view.shape() != layout.shape.as_slice() {
            return Err(WarmStartError::ShapeMismatch {
                file: self.file.clone(),
                variable,
                tensor,
                expected: layout.shape.clone(),
                found: view.shape().to_vec(),
            });
        }
        let values = to_f32(view.dtype(), view.data()).ok_or_else(|| WarmStartError::Dtype {
            file: self.file.clone(),
            variable: variable.clone(),
            tensor: tensor.clone(),
            expected: layout.dtype,
            found: view.dtype().to_string(),
        })?;
        let row_len = layout.row_len();
        layout
            .shards
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let rows = &values[shard.rows.start * row_len..shard.rows.end * row_len];
                // The shape was checked against the layout, so the lengths agree.
                TensorBytes::from_f32(layout.shard_shape(i), rows).map_err(|source| {
                    WarmStartError::Rows {
                        file: self.file.clone(),
                        tensor: tensor.clone(),
                        source,
                    }
                })
            })
            .collect()
    }

    /// Checks that every variable the name map names is one of `variables` (the job's).
    pub fn check_map_names(&self, variables: &[&str]) -> Result<(), WarmStartError> {
        for variable in self.map.keys() {
            if !variables.contains(&variable.as_str()) {
                return Err(WarmStartError::UnknownVariable {
                    map: self
                        .map_file
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("(name map)")),
                    variable: variable.clone(),
                    variables: variables.iter().map(|v| v.to_string()).collect(),
                });
            }
        }
        Ok(())
    }
}

/// Parses a name map: a TOML table of `cohort name = "file name"`.
pub fn parse_name_map(text: &str, file: &Path) -> Result<BTreeMap<String, String>, WarmStartError> {
    let table: toml::Table = text.parse().map_err(|source| WarmStartError::MapNotToml {
        file: file.to_path_buf(),
        source,
    })?;
    table
        .into_iter()
        .map(|(variable, value)| match value {
            toml::Value::String(tensor) if !tensor.is_empty() => Ok((variable, tensor)),
            value => Err(WarmStartError::MapValue {
                file: file.to_path_buf(),
                variable,
                value,
            }),
        })
        .collect()
}

/// Little-endian `data` of `dtype` as F32 values; `None` for a dtype not read.
fn to_f32(dtype: safetensors::Dtype, data: &[u8]) -> Option<Vec<f32>> {
    use safetensors::Dtype as S;
    Some(match dtype {
        S::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        S::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        S::BF16 => data
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        S::F16 => data
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => return None,
    })
}

/// IEEE half precision to single, exactly (every half is a single).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    match exp {
        0 => {
            // Zero or subnormal: mant × 2^-24.
            let magnitude = mant as f32 * f32::from_bits(0x3380_0000);
            if sign != 0 {
                -magnitude
            } else {
                magnitude
            }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mant << 13)),
        _ => f32::from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13)),
    }
}

/// Names for an error message: the first few, then how many more.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 8;
    if names.is_empty() {
        return "none".into();
    }
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Shard;

    fn file(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
        let owned: Vec<(String, TensorBytes)> = tensors
            .iter()
            .map(|(n, s, v)| (n.to_string(), TensorBytes::from_f32(s.clone(), v).unwrap()))
            .collect();
        safetensors::serialize(owned.iter().map(|(n, t)| (n.as_str(), t)), None).unwrap()
    }

    fn split_layout() -> Layout {
        Layout {
            name: "emb".into(),
            dtype: Dtype::F32,
            shape: vec![3, 2],
            shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..3 }],
        }
    }

    #[test]
    fn a_mapped_tensor_is_split_onto_the_shards() {
        let bytes = file(&[("table", vec![3, 2], vec![1., 2., 3., 4., 5., 6.])]);
        let map = BTreeMap::from([("emb".to_string(), "table".to_string())]);
        let ws = WarmStart::from_bytes(Path::new("m.safetensors"), bytes, None, map).unwrap();
        let shards = ws.shard_values(&split_layout()).unwrap();
        assert_eq!(shards[0].to_f32().unwrap(), [1., 2., 3., 4.]);
        assert_eq!(shards[1].shape(), [1, 2]);
        assert_eq!(shards[1].to_f32().unwrap(), [5., 6.]);
    }

    #[test]
    fn refusals_name_the_variable_and_the_file() {
        let bytes = file(&[("emb", vec![2, 3], vec![0.; 6])]);
        let ws = WarmStart::from_bytes(
            Path::new("m.safetensors"),
            bytes.clone(),
            None,
            BTreeMap::new(),
        )
        .unwrap();
        let err = ws.shard_values(&split_layout()).unwrap_err().to_string();
        assert!(
            err.contains("\"emb\"") && err.contains("m.safetensors") && err.contains("[2, 3]"),
            "{err}"
        );
        let other = Layout::unsharded("dense", Dtype::F32, vec![2], 0);
        let err = ws.shard_values(&other).unwrap_err().to_string();
        assert!(
            err.contains("\"dense\"") && err.contains("m.safetensors"),
            "{err}"
        );
        let map = BTreeMap::from([("emb".to_string(), "nope".to_string())]);
        let err = WarmStart::from_bytes(Path::new("m.safetensors"), bytes, None, map)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"nope\"") && err.contains("\"emb\""), "{err}");
        let err = WarmStart::from_bytes(
            Path::new("bad.safetensors"),
            vec![1, 2],
            None,
            BTreeMap::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("bad.safetensors"), "{err}");
    }

    /// A device or a named pipe given as the file or the map is refused naming it, at once,
    /// and a map too large for any model is refused without being read whole.
    #[test]
    fn a_file_or_map_that_is_no_regular_file_or_too_large_is_refused_naming_it() {
        let err = WarmStart::open(Path::new("/dev/zero"), None).unwrap_err();
        assert!(
            matches!(
                err,
                WarmStartError::NotAFile {
                    kind: "a device",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        let dir = std::env::temp_dir().join(format!("cohort-warm-pipe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.safetensors");
        std::fs::write(&model, file(&[("w", vec![2], vec![1., 2.])])).unwrap();
        let pipe = dir.join("map.toml");
        assert!(std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success());
        let err = WarmStart::open(&model, Some(&pipe)).unwrap_err();
        assert!(
            matches!(
                err,
                WarmStartError::NotAFile {
                    kind: "a named pipe",
                    ..
                }
            ),
            "{err}"
        );
        std::fs::remove_file(&pipe).unwrap();
        let big = std::fs::File::create(&pipe).unwrap();
        big.set_len(MAP_BYTES_MAX + 1).unwrap();
        let err = WarmStart::open(&model, Some(&pipe)).unwrap_err();
        assert!(matches!(err, WarmStartError::MapTooLarge { .. }), "{err}");
        std::fs::write(&pipe, "w = \"w\"\n").unwrap();
        WarmStart::open(&model, Some(&pipe)).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_name_map_is_a_table_of_strings() {
        let map = parse_name_map(
            "\"dense/kernel\" = \"w\"\nb = \"bias\"\n",
            Path::new("map.toml"),
        )
        .unwrap();
        assert_eq!(map["dense/kernel"], "w");
        let err = parse_name_map("w = 3\n", Path::new("map.toml")).unwrap_err();
        assert!(
            matches!(&err, WarmStartError::MapValue { variable, .. } if variable == "w"),
            "{err}"
        );
        let err = err.to_string();
        assert!(err.contains("map.toml") && err.contains("\"w\""), "{err}");
        assert!(matches!(
            parse_name_map("w = \n", Path::new("map.toml")),
            Err(WarmStartError::MapNotToml { .. })
        ));
    }

    #[test]
    fn halves_convert_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }
}
