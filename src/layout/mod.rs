//! Where the rows of a variable live: the one [`Layout`] type that the coordinator places
//! variables with, that a worker is set up with ([`crate::roles::protocol::SetupWorker`]
//! carries it in bincode) and that a checkpoint's manifest stores (as JSON), so a restored
//! checkpoint puts every row back where it was.
//!
//! This module owns the layout's arithmetic (which rows of which variable live on which
//! parameter server, what a shard is called and what shape it has) and its validation, once,
//! for layouts from anywhere (a message, a file). It is a leaf: it depends on no other module
//! of the crate, so the variables, the checkpoints and the roles can all use it.

mod dtype;

use std::ops::Range;

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

pub use dtype::Dtype;

/// Infix between a stored tensor's name and an optimizer slot's name: `dense/kernel/slot/m`.
/// Reserved: no variable name may contain it.
pub const SLOT_INFIX: &str = "/slot/";

/// Where every row of one variable lives: its shards in row order, each a range of rows held
/// by one parameter server.
///
/// On disk (a checkpoint's manifest) it is the JSON object
/// `{"name", "dtype", "shape", "shards": [{"ps", "row_start", "row_end"}, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
pub struct Layout {
    /// The variable's name, e.g. `dense/kernel`; shard `i` is stored under
    /// [`Layout::shard_name`].
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// The full (unsplit) shape.
    pub shape: Vec<usize>,
    /// The shards in row order; together they cover rows `0..shape[0]` (`0..1` for a scalar)
    /// exactly once ([`Layout::validate`]).
    pub shards: Vec<Shard>,
}

/// One shard of a variable: a range of its rows (along dimension 0), held by one parameter
/// server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Encode, Decode)]
#[serde(into = "ShardRecord", try_from = "ShardRecord")]
pub struct Shard {
    /// The parameter server's index.
    pub ps: u32,
    /// Rows `[start, end)` of the full variable.
    pub rows: Range<usize>,
}

/// Why a layout (from a message or a file) cannot be used; names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// An empty or reserved variable name.
    #[error(
        "variable name {name:?} is empty, reserved (starts with \"__\"), or contains \
         \"{SLOT_INFIX}\""
    )]
    BadName {
        /// The name.
        name: String,
    },
    /// A shape whose element count does not fit in memory arithmetic.
    #[error("variable {name:?}: shape {shape:?} has more elements than can be counted")]
    ShapeOverflow {
        /// The variable.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A layout without a single shard.
    #[error("variable {name:?}: the layout has no shards")]
    NoShards {
        /// The variable.
        name: String,
    },
    /// A scalar split in several shards.
    #[error("variable {name:?}: a scalar has exactly one shard, the layout has {shards}")]
    ScalarSplit {
        /// The variable.
        name: String,
        /// Shards in the layout.
        shards: usize,
    },
    /// A shard that does not start where the previous one ended (a gap or an overlap), or
    /// ends before it starts.
    #[error(
        "variable {name:?}: shard {shard} holds rows {start}..{end}, but the shards before it \
         end at row {expected}"
    )]
    ShardOutOfOrder {
        /// The variable.
        name: String,
        /// The shard's index.
        shard: usize,
        /// Its first row.
        start: usize,
        /// Its end row.
        end: usize,
        /// The row it had to start at.
        expected: usize,
    },
    /// The shards end before or after the last row.
    #[error("variable {name:?}: the shards cover {covered} rows, the shape {shape:?} has {rows}")]
    RowsNotCovered {
        /// The variable.
        name: String,
        /// The shape.
        shape: Vec<usize>,
        /// Rows the shape has.
        rows: usize,
        /// Rows the shards cover.
        covered: usize,
    },
    /// A shard on a parameter server the cluster does not have.
    #[error("variable {name:?}: a shard is on ps/{ps}, but there are {num_ps} parameter servers")]
    NoSuchPs {
        /// The variable.
        name: String,
        /// The server named.
        ps: u32,
        /// Servers there are.
        num_ps: usize,
    },
}

impl Layout {
    /// A variable held whole by parameter server `ps`.
    pub fn unsharded(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>, ps: u32) -> Self {
        let rows = shape.first().copied().unwrap_or(1);
        Self {
            name: name.into(),
            dtype,
            shape,
            shards: vec![Shard { ps, rows: 0..rows }],
        }
    }

    /// Rows along dimension 0 that the shards cover (1 for a scalar).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements in one row (the product of every dimension after the first; 1 for a vector
    /// or a scalar).
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// The name shard `index` is stored under, on its parameter server and in a checkpoint's
    /// shard file: the variable's name when it has one shard, `"{name}/part_{index}"` when it
    /// has several.
    pub fn shard_name(&self, index: usize) -> String {
        if self.shards.len() == 1 {
            self.name.clone()
        } else {
            format!("{}/part_{index}", self.name)
        }
    }

    /// The shape of shard `index` (the full shape with its rows in place of the first
    /// dimension). Panics if there is no shard `index`.
    pub fn shard_shape(&self, index: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = self.shards[index].rows.len();
        }
        shape
    }

    /// The shard holding `row` and the row's index inside it.
    pub fn locate(&self, row: usize) -> Option<(usize, usize)> {
        let i = self.shards.partition_point(|s| s.rows.end <= row);
        let shard = self.shards.get(i)?;
        shard
            .rows
            .contains(&row)
            .then(|| (i, row - shard.rows.start))
    }

    /// Checks what a layout from elsewhere (a message, a file) must satisfy: a usable name, an
    /// element count that can be counted, and shards that cover rows `0..shape[0]` (`0..1` for
    /// a scalar) in order, each row exactly once (a shard may be empty).
    pub fn validate(&self) -> Result<(), LayoutError> {
        let name = || self.name.clone();
        if self.name.is_empty() || self.name.starts_with("__") || self.name.contains(SLOT_INFIX) {
            return Err(LayoutError::BadName { name: name() });
        }
        if self
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(LayoutError::ShapeOverflow {
                name: name(),
                shape: self.shape.clone(),
            });
        }
        if self.shards.is_empty() {
            return Err(LayoutError::NoShards { name: name() });
        }
        if self.shape.is_empty() && self.shards.len() != 1 {
            return Err(LayoutError::ScalarSplit {
                name: name(),
                shards: self.shards.len(),
            });
        }
        let mut next = 0;
        for (shard, s) in self.shards.iter().enumerate() {
            if s.rows.start != next || s.rows.end < s.rows.start {
                return Err(LayoutError::ShardOutOfOrder {
                    name: name(),
                    shard,
                    start: s.rows.start,
                    end: s.rows.end,
                    expected: next,
                });
            }
            next = s.rows.end;
        }
        if next != self.rows() {
            return Err(LayoutError::RowsNotCovered {
                name: name(),
                shape: self.shape.clone(),
                rows: self.rows(),
                covered: next,
            });
        }
        Ok(())
    }

    /// Checks that every shard is on one of `num_ps` parameter servers.
    pub fn check_servers(&self, num_ps: usize) -> Result<(), LayoutError> {
        match self.shards.iter().find(|s| s.ps as usize >= num_ps) {
            Some(s) => Err(LayoutError::NoSuchPs {
                name: self.name.clone(),
                ps: s.ps,
                num_ps,
            }),
            None => Ok(()),
        }
    }
}

/// A [`Shard`] as the manifest stores it: `{"ps", "row_start", "row_end"}`.
#[derive(Serialize, Deserialize)]
struct ShardRecord {
    ps: u32,
    row_start: u64,
    row_end: u64,
}

impl From<Shard> for ShardRecord {
    fn from(shard: Shard) -> Self {
        Self {
            ps: shard.ps,
            row_start: shard.rows.start as u64,
            row_end: shard.rows.end as u64,
        }
    }
}

impl TryFrom<ShardRecord> for Shard {
    type Error = ShardRecordError;

    fn try_from(record: ShardRecord) -> Result<Self, ShardRecordError> {
        let row =
            |row: u64| usize::try_from(row).map_err(|_| ShardRecordError::RowTooLarge { row });
        Ok(Self {
            ps: record.ps,
            rows: row(record.row_start)?..row(record.row_end)?,
        })
    }
}

/// Why a stored [`ShardRecord`] is not a [`Shard`] on this machine (serde reports it as the
/// message of the manifest's parse error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ShardRecordError {
    /// A row number beyond this machine's `usize`.
    #[error("row {row} does not fit this machine's usize")]
    RowTooLarge {
        /// The row.
        row: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(shards: &[(u32, Range<usize>)]) -> Layout {
        Layout {
            name: "emb".into(),
            dtype: Dtype::F32,
            shape: vec![10, 4],
            shards: shards
                .iter()
                .map(|(ps, rows)| Shard {
                    ps: *ps,
                    rows: rows.clone(),
                })
                .collect(),
        }
    }

    #[test]
    fn shards_are_named_shaped_and_located() {
        let layout = split(&[(0, 0..4), (1, 4..7), (0, 7..10)]);
        layout.validate().unwrap();
        assert_eq!(layout.shard_name(1), "emb/part_1");
        assert_eq!(layout.shard_shape(2), [3, 4]);
        assert_eq!(layout.row_len(), 4);
        assert_eq!(layout.locate(6), Some((1, 2)));
        assert_eq!(layout.locate(10), None);
        let whole = Layout::unsharded("b", Dtype::F64, vec![3], 1);
        whole.validate().unwrap();
        assert_eq!(whole.shard_name(0), "b");
        assert_eq!(whole.shards, [Shard { ps: 1, rows: 0..3 }]);
        let scalar = Layout::unsharded("step", Dtype::I64, vec![], 0);
        scalar.validate().unwrap();
        assert_eq!(scalar.rows(), 1);
        assert_eq!(scalar.shard_shape(0), Vec::<usize>::new());
    }

    #[test]
    fn a_layout_that_does_not_cover_every_row_once_is_refused_by_name() {
        let err = split(&[(0, 0..5), (1, 5..12)]).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "variable \"emb\": the shards cover 12 rows, the shape [10, 4] has 10"
        );
        let err = split(&[(0, 0..5), (1, 6..10)]).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "variable \"emb\": shard 1 holds rows 6..10, but the shards before it end at row 5"
        );
        assert!(matches!(
            split(&[(0, 0..5), (1, 4..10)]).validate(),
            Err(LayoutError::ShardOutOfOrder { shard: 1, .. })
        ));
        assert!(matches!(
            split(&[]).validate(),
            Err(LayoutError::NoShards { .. })
        ));
        // An empty shard is allowed: it holds nothing.
        split(&[(0, 0..0), (1, 0..10)]).validate().unwrap();
        let mut scalar = Layout::unsharded("s", Dtype::F32, vec![], 0);
        scalar.shards.push(Shard { ps: 1, rows: 1..1 });
        assert!(matches!(
            scalar.validate(),
            Err(LayoutError::ScalarSplit { shards: 2, .. })
        ));
        let mut huge = split(&[(0, 0..10)]);
        huge.shape = vec![10, usize::MAX, 2];
        assert!(matches!(
            huge.validate(),
            Err(LayoutError::ShapeOverflow { .. })
        ));
        for name in ["", "__metadata__", "w/slot/m"] {
            let err = Layout::unsharded(name, Dtype::F32, vec![2], 0)
                .validate()
                .unwrap_err();
            assert_eq!(err, LayoutError::BadName { name: name.into() });
        }
    }

    #[test]
    fn a_shard_on_a_missing_server_is_named() {
        let layout = split(&[(0, 0..4), (2, 4..10)]);
        layout.check_servers(3).unwrap();
        assert_eq!(
            layout.check_servers(2).unwrap_err().to_string(),
            "variable \"emb\": a shard is on ps/2, but there are 2 parameter servers"
        );
    }

    /// The manifest's JSON shape (format version 2) is kept: a v2 manifest's layout reads.
    #[test]
    fn the_json_form_is_the_manifest_v2_shape() {
        let layout = split(&[(0, 0..6), (1, 6..10)]);
        let json = serde_json::to_value(&layout).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "emb",
                "dtype": "F32",
                "shape": [10, 4],
                "shards": [
                    {"ps": 0, "row_start": 0, "row_end": 6},
                    {"ps": 1, "row_start": 6, "row_end": 10},
                ],
            })
        );
        assert_eq!(serde_json::from_value::<Layout>(json).unwrap(), layout);
    }

    #[test]
    fn the_wire_form_round_trips() {
        let layout = split(&[(0, 0..6), (1, 6..10)]);
        let config = bincode::config::standard().with_limit::<4096>();
        let bytes = bincode::encode_to_vec(&layout, config).unwrap();
        let (back, _): (Layout, usize) = bincode::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(back, layout);
    }
}
