//! Placement on parameter servers: round-robin for whole variables, and partitioners that
//! split a large variable along its first axis into shards held by several parameter servers
//! (TensorFlow's `FixedShardsPartitioner`, `MinSizePartitioner`, `MaxSizePartitioner`).
//!
//! Pure placement arithmetic: which rows of which variable go to which parameter server. The
//! result is a [`Layout`], the one type the runtime and checkpoints both read.

use std::ops::Range;

use crate::layout::{Dtype, Layout, Shard};

/// How to split a variable across parameter servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Partitioner {
    /// Exactly `num_shards` shards (fewer if the variable has fewer rows).
    FixedShards {
        /// Shards wanted.
        num_shards: usize,
    },
    /// As many shards as possible with each at least `min_shard_bytes`, at most `max_shards`.
    MinSize {
        /// Smallest shard, in bytes.
        min_shard_bytes: usize,
        /// Most shards.
        max_shards: usize,
    },
    /// As few shards as possible with each at most `max_shard_bytes`, at most `max_shards`.
    MaxSize {
        /// Largest shard, in bytes.
        max_shard_bytes: usize,
        /// Most shards.
        max_shards: usize,
    },
}

/// Why a variable cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// No parameter server to place it on.
    #[error("variable {0:?}: the cluster has no parameter server")]
    NoParameterServer(String),
    /// A partitioner argument that cannot work.
    #[error("variable {name:?}: {detail}")]
    BadPartitioner {
        /// The variable.
        name: String,
        /// What is wrong.
        detail: String,
    },
}

/// Places variables on `num_ps` parameter servers: whole variables round-robin, partitioned
/// ones split per the partitioner with shards continuing the round-robin.
///
/// Calling protocol: one `place` call per variable, in creation order (the order decides the
/// round-robin, so the same program places the same way every run — DATA-1).
#[derive(Debug, Clone)]
pub struct PsPlacer {
    num_ps: u32,
    partitioner: Option<Partitioner>,
    next_ps: u32,
}

impl PsPlacer {
    /// A placer over `num_ps` parameter servers; `partitioner` applies to every variable
    /// placed (None: whole variables).
    pub fn new(num_ps: u32, partitioner: Option<Partitioner>) -> Self {
        Self {
            num_ps,
            partitioner,
            next_ps: 0,
        }
    }

    /// The layout of a variable of `shape` with elements of `dtype`.
    pub fn place(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: Dtype,
    ) -> Result<Layout, PartitionError> {
        if self.num_ps == 0 {
            return Err(PartitionError::NoParameterServer(name.into()));
        }
        if shape.first() == Some(&0) {
            return Err(PartitionError::BadPartitioner {
                name: name.into(),
                detail: format!("shape {shape:?} has no rows to place"),
            });
        }
        let rows = shape.first().copied().unwrap_or(1);
        // A row holding nothing (a zero width) counts as one element, as the rows of any
        // other shape count their elements.
        let row_elements = if shape.iter().skip(1).any(|dim| *dim == 0) {
            Some(1)
        } else {
            shape
                .iter()
                .skip(1)
                .try_fold(1usize, |n, dim| n.checked_mul(*dim))
        };
        let row_bytes = row_elements
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| PartitionError::BadPartitioner {
                name: name.into(),
                detail: format!("shape {shape:?}: a row has more bytes than memory can hold"),
            })?;
        let num_shards = match self.partitioner {
            None => 1,
            Some(p) => shards_for(name, p, rows, row_bytes)?,
        };
        let shards = split_rows(rows, num_shards)
            .into_iter()
            .map(|rows| {
                let ps = self.next_ps;
                self.next_ps = (self.next_ps + 1) % self.num_ps;
                Shard { ps, rows }
            })
            .collect();
        Ok(Layout {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            shards,
        })
    }
}

/// The layouts of a running job's variables placed again onto the parameter servers
/// `servers` (their indexes, in order; not empty) when servers join or leave the job
/// (elastic parameter servers). Placement stays a pure function of the variables in creation
/// order and the server set (DATA-1), as [`PsPlacer`]'s is:
/// - a whole variable (one shard) stays whole, continuing the round-robin over `servers`;
/// - a partitioned variable keeps its share of the servers: split in `k` shards over
///   `old_servers` servers, it is split again in `ceil(k * servers.len() / old_servers)`
///   shards (at most one per row), so a variable spread over every server stays spread
///   over every server, each shard continuing the round-robin.
///
/// Rows keep their values whatever the new shards are: a restore copies rows by their
/// ranges, whichever shards held them before.
pub fn place_again(layouts: &[Layout], old_servers: usize, servers: &[u32]) -> Vec<Layout> {
    let n = servers.len().max(1);
    let old = old_servers.max(1);
    let mut next = 0usize;
    let mut take = || {
        let ps = servers.get(next % n).copied().unwrap_or(0);
        next += 1;
        ps
    };
    layouts
        .iter()
        .map(|layout| {
            let k = layout.shards.len();
            let shards = if k <= 1 {
                vec![Shard {
                    ps: take(),
                    rows: 0..layout.rows(),
                }]
            } else {
                let wanted = (k * n).div_ceil(old).min(SHARDS_MAX);
                split_rows(layout.rows(), wanted)
                    .into_iter()
                    .map(|rows| Shard { ps: take(), rows })
                    .collect()
            };
            Layout {
                shards,
                ..layout.clone()
            }
        })
        .collect()
}

/// Splits `rows` into `n` contiguous ranges; the first `rows % n` get one row more (TF's rule).
fn split_rows(rows: usize, n: usize) -> Vec<Range<usize>> {
    let n = n.clamp(1, rows.max(1));
    let base = rows / n;
    let extra = rows % n;
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

fn shards_for(
    name: &str,
    partitioner: Partitioner,
    rows: usize,
    row_bytes: usize,
) -> Result<usize, PartitionError> {
    let bad = |detail: &str| PartitionError::BadPartitioner {
        name: name.into(),
        detail: detail.into(),
    };
    let total_bytes = rows.saturating_mul(row_bytes);
    let n = match partitioner {
        Partitioner::FixedShards { num_shards } => {
            if num_shards == 0 {
                return Err(bad("FixedShards needs num_shards >= 1"));
            }
            num_shards
        }
        Partitioner::MinSize {
            min_shard_bytes,
            max_shards,
        } => {
            if max_shards == 0 || min_shard_bytes == 0 {
                return Err(bad(
                    "MinSize needs min_shard_bytes >= 1 and max_shards >= 1",
                ));
            }
            (total_bytes / min_shard_bytes).clamp(1, max_shards)
        }
        Partitioner::MaxSize {
            max_shard_bytes,
            max_shards,
        } => {
            if max_shards == 0 || max_shard_bytes == 0 {
                return Err(bad(
                    "MaxSize needs max_shard_bytes >= 1 and max_shards >= 1",
                ));
            }
            let rows_per_shard = (max_shard_bytes / row_bytes).max(1);
            rows.div_ceil(rows_per_shard).clamp(1, max_shards)
        }
    };
    let n = n.min(rows);
    if n > SHARDS_MAX {
        return Err(bad(&format!(
            "{n} shards asked for, over the {SHARDS_MAX} a variable may be split into"
        )));
    }
    Ok(n)
}

/// The most shards a variable is split into: each is a variable of a server's with its own
/// entry in every checkpoint and every pull, so more would cost far more than they spread
/// (and a count taken from a huge shape would be allocated as a list of ranges).
pub const SHARDS_MAX: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_again_whole_variables_continue_the_round_robin_and_spread_ones_stay_spread() {
        let mut placer = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 2 }));
        let spread = placer.place("emb", &[10, 4], Dtype::F32).unwrap();
        let three = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 3 }))
            .place("three", &[7, 2], Dtype::F32)
            .unwrap();
        let whole = Layout::unsharded("bias", Dtype::F32, vec![4], 1);
        let layouts = [spread, three, whole];
        // Onto servers 0, 1 and 3 (ps/2 left, ps/3 joined).
        let again = place_again(&layouts, 2, &[0, 1, 3]);
        for (before, after) in layouts.iter().zip(&again) {
            after.validate().unwrap();
            assert_eq!((&before.name, &before.shape), (&after.name, &after.shape));
        }
        let ps = |l: &Layout| l.shards.iter().map(|s| s.ps).collect::<Vec<_>>();
        // Spread over both servers before: over all three now.
        assert_eq!(ps(&again[0]), [0, 1, 3]);
        assert_eq!(again[0].shards[0].rows, 0..4);
        // 3 shards over 2 servers: ceil(3 * 3 / 2) = 5 shards now.
        assert_eq!(ps(&again[1]), [0, 1, 3, 0, 1]);
        assert_eq!(ps(&again[2]), [3]);
        // Onto one server: everything there, a spread variable whole again.
        let one = place_again(&layouts, 2, &[1]);
        assert!(one.iter().all(|l| l.shards.iter().all(|s| s.ps == 1)));
        assert_eq!(one[0].shards.len(), 1);
        // The same inputs place the same way (DATA-1).
        assert_eq!(place_again(&layouts, 2, &[0, 1, 3]), again);
    }

    #[test]
    fn whole_variables_go_round_robin() {
        let mut placer = PsPlacer::new(2, None);
        let ps: Vec<u32> = (0..5)
            .map(|i| {
                placer
                    .place(&format!("v{i}"), &[3, 3], Dtype::F32)
                    .unwrap()
                    .shards[0]
                    .ps
            })
            .collect();
        assert_eq!(ps, [0, 1, 0, 1, 0]);
    }

    #[test]
    fn fixed_shards_split_rows_like_tensorflow() {
        let mut placer = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 3 }));
        let layout = placer.place("emb", &[10, 4], Dtype::F32).unwrap();
        let rows: Vec<_> = layout.shards.iter().map(|s| s.rows.clone()).collect();
        assert_eq!(rows, [0..4, 4..7, 7..10]);
        let ps: Vec<_> = layout.shards.iter().map(|s| s.ps).collect();
        assert_eq!(ps, [0, 1, 0]);
        assert_eq!(layout.shard_name(1), "emb/part_1");
        assert_eq!(layout.shard_shape(2), [3, 4]);
        assert_eq!(layout.locate(6), Some((1, 2)));
        assert_eq!(layout.locate(10), None);
        // More shards than rows: one row each.
        let layout = placer.place("tiny", &[2, 4], Dtype::F32).unwrap();
        assert_eq!(layout.shards.len(), 2);
    }

    #[test]
    fn size_partitioners_respect_their_bounds() {
        // 1,000,000 x 16 f32 = 64 MB.
        let mut placer = PsPlacer::new(
            2,
            Some(Partitioner::MaxSize {
                max_shard_bytes: 40 << 20,
                max_shards: 8,
            }),
        );
        assert_eq!(
            placer
                .place("emb", &[1_000_000, 16], Dtype::F32)
                .unwrap()
                .shards
                .len(),
            2
        );
        let mut placer = PsPlacer::new(
            2,
            Some(Partitioner::MinSize {
                min_shard_bytes: 1 << 20,
                max_shards: 4,
            }),
        );
        assert_eq!(
            placer
                .place("emb", &[1_000_000, 16], Dtype::F32)
                .unwrap()
                .shards
                .len(),
            4
        );
        assert_eq!(
            placer
                .place("small", &[10, 16], Dtype::F32)
                .unwrap()
                .shards
                .len(),
            1
        );
    }

    #[test]
    fn placed_layouts_validate_and_a_variable_without_rows_is_refused() {
        let mut placer = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 2 }));
        for shape in [&[10, 2][..], &[3], &[]] {
            let layout = placer.place("t", shape, Dtype::F32).unwrap();
            layout.validate().unwrap();
            layout.check_servers(2).unwrap();
        }
        let err = PsPlacer::new(1, None)
            .place("empty", &[0, 4], Dtype::F32)
            .unwrap_err();
        assert!(err.to_string().contains("no rows"), "{err}");
    }

    #[test]
    fn bad_arguments_are_named() {
        let err = PsPlacer::new(0, None)
            .place("w", &[1], Dtype::F32)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "variable \"w\": the cluster has no parameter server"
        );
        let err = PsPlacer::new(1, Some(Partitioner::FixedShards { num_shards: 0 }))
            .place("w", &[4], Dtype::F32)
            .unwrap_err();
        assert!(err.to_string().contains("num_shards"), "{err}");
    }

    /// A shape whose rows hold nothing (a zero width) passes any element count: its shard
    /// count is bounded all the same, and a row's size that overflows is refused, not wrapped.
    #[test]
    fn a_huge_shape_is_refused_by_its_shard_count_or_its_row_size() {
        for partitioner in [
            Partitioner::FixedShards {
                num_shards: 1 << 40,
            },
            Partitioner::MaxSize {
                max_shard_bytes: 1,
                max_shards: 1 << 40,
            },
        ] {
            let err = PsPlacer::new(2, Some(partitioner))
                .place("w", &[1 << 40, 0], Dtype::F32)
                .unwrap_err();
            assert!(err.to_string().contains(&SHARDS_MAX.to_string()), "{err}");
        }
        let at_most = PsPlacer::new(
            2,
            Some(Partitioner::FixedShards {
                num_shards: SHARDS_MAX,
            }),
        )
        .place("w", &[1 << 40, 0], Dtype::F32)
        .unwrap();
        assert_eq!(at_most.shards.len(), SHARDS_MAX);
        let err = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 2 }))
            .place("w", &[4, 1 << 32, 1 << 32], Dtype::F32)
            .unwrap_err();
        assert!(err.to_string().contains("more bytes than memory"), "{err}");
        // A row of no width holds one element's bytes however wide its other dimensions.
        let empty_rows = PsPlacer::new(2, Some(Partitioner::FixedShards { num_shards: 2 }))
            .place("w", &[4, 1 << 40, 1 << 40, 0], Dtype::F32)
            .unwrap();
        assert_eq!(empty_rows.shards.len(), 2);
        // Placed again onto more servers, a variable of the most shards keeps that many.
        let most = PsPlacer::new(
            2,
            Some(Partitioner::FixedShards {
                num_shards: SHARDS_MAX,
            }),
        )
        .place("w", &[1 << 40, 0], Dtype::F32)
        .unwrap();
        let again = place_again(&[most], 2, &[0, 1, 2, 3]);
        assert_eq!(again[0].shards.len(), SHARDS_MAX);
    }
}
