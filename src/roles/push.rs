//! The vocabulary of a push, shared by the worker, the wire protocol, the parameter server and
//! the simulator: who sent it, for which closure attempt and at which learning rate
//! ([`PushOrigin`], [`LearningRate`]), what it carries
//! ([`Gradient`]), what became of it at a server ([`PushOutcome`]); and the pure planning of a
//! closure's gradients into one [`Push`] message per parameter server ([`plan_push`]).
//!
//! Planning is the whole routing decision of a push: a dense gradient is cut along its
//! variable's shards, a row-sparse one is grouped by the shard that holds each row (with
//! shard-local row ids), and every server that holds any part gets exactly one message naming
//! its parts, with their numbers as blobs in order. Nothing is dropped or sent twice, except
//! by the all-or-nothing rule for non-finite gradients (see [`plan_push`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use bincode::{Decode, Encode};
use bytes::Bytes;

use crate::layout::Layout;
use crate::ledger::{ClosureId, WorkerIncarnation};
use crate::optim::first_non_finite;
use crate::roles::blob::{blob, f32_vec_blob, f32_view, u64_vec_blob, u64_view, BlobError};

/// The kind of one gradient of a push; its numbers travel as blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub enum WireGradient {
    /// For the whole shard: one blob of little-endian f32.
    Dense,
    /// For some rows of the shard: a blob of row indices (little-endian u64), then a blob of
    /// `ids * width` gradients (little-endian f32).
    Rows,
}

/// Apply one closure's gradients (PS-1: at most once per closure). Blobs: each gradient's, in
/// the order of `gradients` ([`Push::decode_gradients`] reads them back). Planned by
/// [`plan_push`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct Push {
    /// The pushing worker incarnation, and the closure attempt whose step produced the
    /// gradients.
    pub origin: PushOrigin,
    /// Gradients by shard name.
    pub gradients: Vec<(String, WireGradient)>,
}

/// Who sent a push, and for which attempt of which closure. PS-1 keys on the closure's update
/// (the closure and the update's `part`), FENCE-1 on the worker incarnation, and a restore on
/// the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct PushOrigin {
    /// The worker index.
    pub worker: u32,
    /// The worker's incarnation.
    pub incarnation: WorkerIncarnation,
    /// The closure whose step produced the gradients.
    pub closure: ClosureId,
    /// The attempt of that closure.
    pub attempt: u32,
    /// Which of the closure's updates this is: 0 for a closure that pushes once (at its
    /// end); a closure of several steps (Keras' `steps_per_execution`) pushes part 0, 1, …
    /// in order, each applied at most once (PS-1), so that an attempt run again after a
    /// failure skips the updates an earlier attempt already applied.
    pub part: u32,
    /// The coordinator's restore generation the closure was dispatched in
    /// ([`crate::roles::protocol::RunClosure::generation`]): a server refuses a push from an
    /// older generation as stale (PS-1 across a restore).
    pub generation: u64,
    /// The learning rate the chief scheduled the closure with
    /// ([`crate::program::ClusterCoordinator::set_learning_rate`]), which the server applies
    /// its update at; `None`: the server's own rate (its optimizer's, or its schedule's at the
    /// variable's step). A closure run again after a restore carries the same rate.
    pub learning_rate: Option<LearningRate>,
    /// The incarnation of the push's server that the chief named serving when it dispatched
    /// the closure ([`crate::roles::protocol::RunClosure::servers`]; 0: none named). A server
    /// refuses a push named for an older incarnation of itself as stale: it was computed
    /// against state this process never held. Its restore generation cannot tell where a
    /// restarted chief found neither a checkpoint nor a live server and began again at the
    /// generation its predecessor had used (PS-1; found by the simulator, seed 13008610 of 2
    /// workers, 1 server and up to 12 faults).
    pub server: u64,
}

/// A learning rate as it travels with a closure and its pushes: an `f32` kept as its bits, so
/// that the messages that carry it stay `Eq`, `Ord` and `Hash`. Only finite, non-negative
/// rates are made ([`LearningRate::new`]); one decoded from the wire is checked again by the
/// server's optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct LearningRate(u32);

impl LearningRate {
    /// `rate`, if it is finite and non-negative (what every optimizer accepts).
    pub fn new(rate: f32) -> Option<Self> {
        (rate.is_finite() && rate >= 0.0).then(|| Self(rate.to_bits()))
    }

    /// The rate.
    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }
}

/// One variable's gradient: borrowed from a received message where it can be (a push of
/// megabytes is applied straight from the bytes that arrived), owned while a step's gradients
/// wait to be sent (`Gradient<'static>`).
#[derive(Debug, Clone, PartialEq)]
pub enum Gradient<'a> {
    /// A gradient for the whole variable (row-major, as long as the variable).
    Dense(Cow<'a, [f32]>),
    /// Gradients for some rows of a `[rows, width]` variable (an embedding table).
    Rows {
        /// The rows, in the order of `values`.
        ids: Cow<'a, [u64]>,
        /// `ids.len() * width` gradients.
        values: Cow<'a, [f32]>,
    },
}

/// What became of a push at one parameter server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub enum PushOutcome {
    /// Applied to every variable named.
    Applied,
    /// The closure's update was applied before (PS-1): nothing changed.
    Duplicate,
    /// From an older restore generation, or sent while a restore is under way (PS-1):
    /// nothing changed.
    Stale,
    /// A gradient held NaN or Inf and the policy is to skip: nothing changed, counted.
    SkippedNonFinite,
    /// From a worker incarnation this server fenced (FENCE-1): nothing changed, and nothing
    /// from that incarnation ever will; it should exit to come back as a new one (a chief
    /// that restarted may not know the fence its predecessor set).
    Fenced,
}

impl PushOutcome {
    /// Whether the closure's effect on that server is in place (applied now or before, or
    /// skipped by the server's policy): a push refused as stale is not.
    pub fn took_effect(self) -> bool {
        !matches!(self, PushOutcome::Stale | PushOutcome::Fenced)
    }
}

/// One server's part of a closure's push: the message and its blobs, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedPush {
    /// The parameter server's index.
    pub ps: u32,
    /// The message.
    pub push: Push,
    /// Each gradient's blobs, in the order of `push.gradients` (a dense gradient one, a
    /// row-sparse one two: ids, then values).
    pub blobs: Vec<Bytes>,
}

/// Why a closure's gradients cannot be planned into pushes. Nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushPlanError {
    /// The gradient names a variable with no layout.
    #[error("unknown variable {0:?}")]
    UnknownVariable(String),
    /// A dense gradient is not as long as its variable.
    #[error(
        "gradient for {variable:?} has {got} values, the variable has {expected} (shape {shape:?})"
    )]
    DenseLength {
        /// The variable.
        variable: String,
        /// Values given.
        got: usize,
        /// Values the variable has.
        expected: usize,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A row gradient's values are not `rows * width`.
    #[error("row gradient for {variable:?}: {got} values for {rows} rows of width {width}")]
    RowsLength {
        /// The variable.
        variable: String,
        /// Values given.
        got: usize,
        /// Rows named.
        rows: usize,
        /// The variable's row width.
        width: usize,
    },
    /// A row id beyond the variable's rows.
    #[error("row {row} outside {variable} (shape {shape:?})")]
    RowOutOfRange {
        /// The variable.
        variable: String,
        /// The row asked for.
        row: u64,
        /// The variable's shape.
        shape: Vec<usize>,
    },
}

/// A closure's gradients as the pushes that carry them: one [`PlannedPush`] per parameter
/// server holding any part of them, in server order, each naming its shards in the order the
/// gradients came. A dense gradient's parts are views of one buffer (no copy); a row-sparse
/// one's rows are grouped per shard with shard-local ids, in their original order.
///
/// All or nothing across servers: when some server's part holds a NaN or Inf, only the
/// servers holding a non-finite part get their push (each server screens only its own part,
/// so the finite parts must not go out alone, or a sharded variable would be half updated;
/// those servers apply their non-finite policy to the whole closure).
pub fn plan_push(
    layouts: &BTreeMap<String, Layout>,
    origin: PushOrigin,
    gradients: Vec<(String, Gradient<'_>)>,
) -> Result<Vec<PlannedPush>, PushPlanError> {
    // Per server: shard names and kinds, and their blobs in order.
    type Parts = (Vec<(String, WireGradient)>, Vec<Bytes>);
    let mut per_ps: BTreeMap<u32, Parts> = BTreeMap::new();
    // Servers whose part of the push holds a NaN or Inf.
    let mut non_finite: BTreeSet<u32> = BTreeSet::new();
    for (name, gradient) in gradients {
        let layout = layouts
            .get(&name)
            .ok_or_else(|| PushPlanError::UnknownVariable(name.clone()))?;
        let width = layout.row_len();
        match gradient {
            Gradient::Dense(values) => {
                let expected: usize = layout.shape.iter().product();
                if values.len() != expected {
                    return Err(PushPlanError::DenseLength {
                        variable: name,
                        got: values.len(),
                        expected,
                        shape: layout.shape.clone(),
                    });
                }
                for shard in &layout.shards {
                    let part = &values[shard.rows.start * width..shard.rows.end * width];
                    if first_non_finite(part).is_some() {
                        non_finite.insert(shard.ps);
                    }
                }
                // One buffer for the whole gradient; each shard's blob is a view of it.
                let whole = f32_vec_blob(values.into_owned());
                for (i, shard) in layout.shards.iter().enumerate() {
                    let part =
                        whole.slice(shard.rows.start * width * 4..shard.rows.end * width * 4);
                    let entry = per_ps.entry(shard.ps).or_default();
                    entry.0.push((layout.shard_name(i), WireGradient::Dense));
                    entry.1.push(part);
                }
            }
            Gradient::Rows { ids, values } => {
                if Some(values.len()) != ids.len().checked_mul(width) {
                    return Err(PushPlanError::RowsLength {
                        variable: name,
                        got: values.len(),
                        rows: ids.len(),
                        width,
                    });
                }
                for (shard, (local_ids, positions)) in route_rows(layout, &ids)? {
                    let mut part = Vec::with_capacity(positions.len() * width);
                    for pos in positions {
                        part.extend_from_slice(&values[pos * width..(pos + 1) * width]);
                    }
                    let ps = layout.shards[shard].ps;
                    if first_non_finite(&part).is_some() {
                        non_finite.insert(ps);
                    }
                    let entry = per_ps.entry(ps).or_default();
                    entry.0.push((layout.shard_name(shard), WireGradient::Rows));
                    entry
                        .1
                        .extend([u64_vec_blob(local_ids), f32_vec_blob(part)]);
                }
            }
        }
    }
    if !non_finite.is_empty() {
        per_ps.retain(|ps, _| non_finite.contains(ps));
    }
    Ok(per_ps
        .into_iter()
        .map(|(ps, (gradients, blobs))| PlannedPush {
            ps,
            push: Push { origin, gradients },
            blobs,
        })
        .collect())
}

/// For one shard: shard-local row ids, and where each came from in the caller's id list.
pub type RoutedRows = (Vec<u64>, Vec<usize>);

/// Groups full-variable row ids by shard: for each shard that holds any of them (in shard
/// order), the shard-local ids and the positions in `ids` they came from. A row beyond the
/// variable is an error naming it.
pub fn route_rows(layout: &Layout, ids: &[u64]) -> Result<Vec<(usize, RoutedRows)>, PushPlanError> {
    let mut routed: Vec<RoutedRows> = vec![Default::default(); layout.shards.len()];
    let per_shard = ids.len() / layout.shards.len().max(1) + 1;
    for entry in &mut routed {
        entry.0.reserve(per_shard);
        entry.1.reserve(per_shard);
    }
    for (pos, &id) in ids.iter().enumerate() {
        let (shard, local) = usize::try_from(id)
            .ok()
            .and_then(|row| layout.locate(row))
            .ok_or_else(|| PushPlanError::RowOutOfRange {
                variable: layout.name.clone(),
                row: id,
                shape: layout.shape.clone(),
            })?;
        let entry = &mut routed[shard];
        entry.0.push(local as u64);
        entry.1.push(pos);
    }
    Ok(routed
        .into_iter()
        .enumerate()
        .filter(|(_, (local, _))| !local.is_empty())
        .collect())
}

impl Push {
    /// The gradients of this push, read from its `blobs` (borrowed where the buffers are
    /// aligned): an error names the gradient whose blob is missing or malformed.
    pub fn decode_gradients<'a>(
        &self,
        blobs: &'a [Bytes],
    ) -> Result<Vec<(String, Gradient<'a>)>, BlobError> {
        let mut next = 0;
        let mut take = |what: &str| {
            let b = blob(blobs, next, what);
            next += 1;
            b
        };
        self.gradients
            .iter()
            .map(|(name, kind)| {
                let g = match kind {
                    WireGradient::Dense => Gradient::Dense(f32_view(take(name)?, name)?),
                    WireGradient::Rows => {
                        let ids = u64_view(take(name)?, name)?;
                        Gradient::Rows {
                            ids,
                            values: f32_view(take(name)?, name)?,
                        }
                    }
                };
                Ok((name.clone(), g))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Dtype, Shard};
    use rand::{Rng, SeedableRng};

    fn origin() -> PushOrigin {
        PushOrigin {
            worker: 2,
            incarnation: 5,
            closure: ClosureId(11),
            attempt: 3,
            part: 0,
            generation: 1,
            learning_rate: None,
            server: 0,
        }
    }

    fn layout(name: &str, shape: &[usize], shards: &[(u32, usize, usize)]) -> Layout {
        Layout {
            name: name.into(),
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            shards: shards
                .iter()
                .map(|&(ps, start, end)| Shard {
                    ps,
                    rows: start..end,
                })
                .collect(),
        }
    }

    fn layouts(list: Vec<Layout>) -> BTreeMap<String, Layout> {
        list.into_iter().map(|l| (l.name.clone(), l)).collect()
    }

    fn dense(values: Vec<f32>) -> Gradient<'static> {
        Gradient::Dense(values.into())
    }

    fn rows(ids: Vec<u64>, values: Vec<f32>) -> Gradient<'static> {
        Gradient::Rows {
            ids: ids.into(),
            values: values.into(),
        }
    }

    /// Every (server, shard name, gradient) the plan sends, decoded back from its blobs.
    fn sent(plan: &[PlannedPush]) -> Vec<(u32, String, Gradient<'static>)> {
        plan.iter()
            .flat_map(|p| {
                assert_eq!(p.push.origin, origin());
                p.push
                    .decode_gradients(&p.blobs)
                    .unwrap()
                    .into_iter()
                    .map(move |(name, g)| {
                        let owned = match g {
                            Gradient::Dense(v) => dense(v.into_owned()),
                            Gradient::Rows { ids, values } => {
                                rows(ids.into_owned(), values.into_owned())
                            }
                        };
                        (p.ps, name, owned)
                    })
            })
            .collect()
    }

    #[test]
    fn a_dense_gradient_is_split_along_its_shards_one_push_per_server() {
        let l = layouts(vec![
            layout("w", &[3, 2], &[(0, 0, 1), (1, 1, 3)]),
            layout("b", &[2], &[(1, 0, 2)]),
        ]);
        let plan = plan_push(
            &l,
            origin(),
            vec![
                ("w".into(), dense(vec![1., 2., 3., 4., 5., 6.])),
                ("b".into(), dense(vec![7., 8.])),
            ],
        )
        .unwrap();
        assert_eq!(plan.iter().map(|p| p.ps).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(
            plan[1].push.gradients,
            vec![
                ("w/part_1".to_string(), WireGradient::Dense),
                ("b".to_string(), WireGradient::Dense)
            ]
        );
        assert_eq!(
            sent(&plan),
            vec![
                (0, "w/part_0".into(), dense(vec![1., 2.])),
                (1, "w/part_1".into(), dense(vec![3., 4., 5., 6.])),
                (1, "b".into(), dense(vec![7., 8.])),
            ]
        );
    }

    #[test]
    fn a_row_sparse_gradient_is_routed_by_row_range_with_shard_local_ids() {
        let l = layouts(vec![layout(
            "emb",
            &[10, 2],
            &[(0, 0, 4), (1, 4, 7), (2, 7, 10)],
        )]);
        let plan = plan_push(
            &l,
            origin(),
            vec![(
                "emb".into(),
                rows(
                    vec![8, 1, 9, 2],
                    vec![80., 81., 10., 11., 90., 91., 20., 21.],
                ),
            )],
        )
        .unwrap();
        // ps/1 holds none of the rows: it gets no push.
        assert_eq!(
            sent(&plan),
            vec![
                (
                    0,
                    "emb/part_0".into(),
                    rows(vec![1, 2], vec![10., 11., 20., 21.])
                ),
                (
                    2,
                    "emb/part_2".into(),
                    rows(vec![1, 2], vec![80., 81., 90., 91.])
                ),
            ]
        );
    }

    #[test]
    fn a_row_out_of_range_or_a_bad_length_is_a_clear_error_and_nothing_is_planned() {
        let l = layouts(vec![layout("emb", &[4, 2], &[(0, 0, 2), (1, 2, 4)])]);
        let err = plan_push(
            &l,
            origin(),
            vec![("emb".into(), rows(vec![1, 4], vec![0.; 4]))],
        )
        .unwrap_err();
        assert_eq!(
            err,
            PushPlanError::RowOutOfRange {
                variable: "emb".into(),
                row: 4,
                shape: vec![4, 2]
            }
        );
        assert_eq!(err.to_string(), "row 4 outside emb (shape [4, 2])");
        let err = plan_push(
            &l,
            origin(),
            vec![("emb".into(), rows(vec![u64::MAX], vec![0.; 2]))],
        )
        .unwrap_err();
        assert!(err.to_string().contains(&u64::MAX.to_string()), "{err}");
        let err = plan_push(
            &l,
            origin(),
            vec![("emb".into(), rows(vec![1], vec![0.; 3]))],
        )
        .unwrap_err();
        assert!(matches!(
            err,
            PushPlanError::RowsLength {
                got: 3,
                rows: 1,
                width: 2,
                ..
            }
        ));
        let err = plan_push(&l, origin(), vec![("emb".into(), dense(vec![0.; 7]))]).unwrap_err();
        assert!(
            err.to_string().contains("has 7 values, the variable has 8"),
            "{err}"
        );
        let err = plan_push(&l, origin(), vec![("nope".into(), dense(vec![]))]).unwrap_err();
        assert_eq!(err, PushPlanError::UnknownVariable("nope".into()));
    }

    #[test]
    fn a_non_finite_part_holds_back_the_finite_parts_on_other_servers() {
        let l = layouts(vec![layout("w", &[2], &[(0, 0, 1), (1, 1, 2)])]);
        let plan = plan_push(&l, origin(), vec![("w".into(), dense(vec![1.0, f32::NAN]))]).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].ps, 1);
    }

    /// Over random layouts and gradients: every value of every gradient reaches exactly the
    /// server that holds its row, once, at its shard-local row; each server gets one push.
    #[test]
    fn nothing_is_dropped_or_duplicated_over_random_layouts() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for _ in 0..300 {
            let servers = rng.gen_range(1..5u32);
            let mut list = Vec::new();
            let mut expected: BTreeMap<(u32, String, u64), Vec<f32>> = BTreeMap::new();
            let mut gradients = Vec::new();
            for v in 0..rng.gen_range(1..4) {
                let name = format!("v{v}");
                let total = rng.gen_range(1..12usize);
                let width = rng.gen_range(1..4usize);
                let mut cuts: Vec<usize> = (1..total).filter(|_| rng.gen_bool(0.4)).collect();
                cuts.insert(0, 0);
                cuts.push(total);
                let shards: Vec<(u32, usize, usize)> = cuts
                    .windows(2)
                    .map(|w| (rng.gen_range(0..servers), w[0], w[1]))
                    .collect();
                let l = layout(&name, &[total, width], &shards);
                l.validate().unwrap();
                let value = |row: u64, k: usize| (v * 1000 + row as usize * 10 + k) as f32;
                let ids: Vec<u64> = if rng.gen_bool(0.5) {
                    (0..total as u64).collect()
                } else {
                    (0..rng.gen_range(0..2 * total))
                        .map(|_| rng.gen_range(0..total as u64))
                        .collect()
                };
                let values: Vec<f32> = ids
                    .iter()
                    .flat_map(|&row| (0..width).map(move |k| value(row, k)))
                    .collect();
                for &row in &ids {
                    let (shard, local) = l.locate(row as usize).unwrap();
                    expected
                        .entry((shards[shard].0, l.shard_name(shard), local as u64))
                        .or_default()
                        .extend((0..width).map(|k| value(row, k)));
                }
                let g = if ids.len() == total && ids.iter().enumerate().all(|(i, &r)| i as u64 == r)
                {
                    dense(values)
                } else {
                    rows(ids, values)
                };
                gradients.push((name, g));
                list.push(l);
            }
            let l = layouts(list);
            let plan = plan_push(&l, origin(), gradients).unwrap();
            let targets: Vec<u32> = plan.iter().map(|p| p.ps).collect();
            let mut unique = targets.clone();
            unique.dedup();
            assert_eq!(targets, unique, "one push per server");
            let mut got: BTreeMap<(u32, String, u64), Vec<f32>> = BTreeMap::new();
            for (ps, name, g) in sent(&plan) {
                let layout = &l[name.split('/').next().unwrap()];
                let width = layout.row_len();
                match g {
                    Gradient::Dense(values) => {
                        for (row, chunk) in values.chunks(width).enumerate() {
                            got.entry((ps, name.clone(), row as u64))
                                .or_default()
                                .extend_from_slice(chunk);
                        }
                    }
                    Gradient::Rows { ids, values } => {
                        assert_eq!(values.len(), ids.len() * width);
                        for (id, chunk) in ids.iter().zip(values.chunks(width)) {
                            got.entry((ps, name.clone(), *id))
                                .or_default()
                                .extend_from_slice(chunk);
                        }
                    }
                }
            }
            assert_eq!(got, expected);
        }
    }
}
