//! What a checkpoint holds, independent of how it is stored: the step, the variable layout,
//! the tensors of every parameter-server shard, dataset positions and the ledger.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::tensor::TensorBytes;
use crate::layout::{Dtype, Layout, LayoutError, SLOT_INFIX};

/// Everything a checkpoint captures at one step (CKPT-1).
///
/// Tensor naming inside a shard: a variable with a single shard is stored under its own name
/// (`dense/kernel`); a variable split over several shards stores part `i` as
/// `<name>/part_<i>`. An optimizer slot of a stored tensor is `<tensor>/slot/<slot>`
/// (`dense/kernel/slot/m`). [`Layout::shard_name`] and [`slot_tensor_name`] build these.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Global training step the checkpoint was taken at.
    pub step: u64,
    /// Where every variable lives.
    pub layout: Vec<Layout>,
    /// Tensors held by each parameter server, indexed by PS index; its length is the number
    /// of PS.
    pub shards: Vec<ShardTensors>,
    /// Per-worker dataset position: worker index → elements consumed.
    pub dataset_positions: BTreeMap<u32, u64>,
    /// The coordinator's ledger at the cut.
    pub ledger: Ledger,
    /// Caller-defined extra state, stored in the manifest as is (`null` when unused). A
    /// parameter-server checkpoint keeps there each variable part's update count, under
    /// [`update_count_key`] (see [`Checkpoint::update_count`]).
    pub extra: serde_json::Value,
}

/// The prefix of the keys of [`Checkpoint::extra`] that hold variable parts' update counts.
pub const UPDATE_COUNT_PREFIX: &str = "steps/";

/// The key of [`Checkpoint::extra`] holding the update count of variable part `part` (a
/// tensor name of the layout, e.g. `dense/kernel/part_0`): how many updates its server had
/// applied at the cut, what Adam's bias correction reads after a restore.
pub fn update_count_key(part: &str) -> String {
    format!("{UPDATE_COUNT_PREFIX}{part}")
}

/// The tensors (variable parts and their optimizer slots) one parameter server holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardTensors {
    /// Tensor name → tensor.
    pub tensors: BTreeMap<String, TensorBytes>,
}

/// The coordinator's closure accounting at the checkpoint's cut (LEDGER-1).
///
/// The id sets are stored as sorted ranges, so a long run of committed ids stays small.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Next closure id the coordinator will hand out.
    pub next_closure_id: u64,
    /// The coordinator's counts, whole (LEDGER-1 holds for them: nothing is folded into
    /// another count).
    #[serde(flatten)]
    pub counts: crate::ledger::Ledger,
    /// Ids of committed closures.
    #[serde(with = "id_ranges")]
    pub committed_ids: BTreeSet<u64>,
    /// Ids of closures scheduled but not committed at the cut.
    #[serde(with = "id_ranges")]
    pub pending_ids: BTreeSet<u64>,
    /// Ids of closures cancelled with an error.
    #[serde(with = "id_ranges")]
    pub cancelled_ids: BTreeSet<u64>,
}

/// Why a checkpoint's content is inconsistent; names the variable or tensor at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// There is not a single parameter-server shard.
    #[error("a checkpoint needs at least one parameter-server shard")]
    NoShards,
    /// A variable's layout is unusable (its name, its shape, its shards, or a shard on a
    /// parameter server the checkpoint has no shard file for).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Two variables (or variable parts) map to the same tensor name.
    #[error("tensor name {name:?} is used twice in the layout")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A variable part is missing from its PS shard.
    #[error("shard of PS {ps}: tensor {tensor:?} (part of variable {variable:?}) is missing")]
    MissingTensor {
        /// PS index.
        ps: usize,
        /// Expected tensor name.
        tensor: String,
        /// Variable name.
        variable: String,
    },
    /// A tensor's dtype differs from its variable's.
    #[error("shard of PS {ps}: tensor {tensor:?} is {found}, layout says {expected}")]
    WrongDtype {
        /// PS index.
        ps: usize,
        /// Tensor name.
        tensor: String,
        /// Dtype in the layout.
        expected: Dtype,
        /// Dtype of the tensor.
        found: Dtype,
    },
    /// A tensor's shape differs from its part's.
    #[error("shard of PS {ps}: tensor {tensor:?} has shape {found:?}, layout says {expected:?}")]
    WrongShape {
        /// PS index.
        ps: usize,
        /// Tensor name.
        tensor: String,
        /// Shape the layout implies.
        expected: Vec<usize>,
        /// Shape of the tensor.
        found: Vec<usize>,
    },
    /// A tensor is neither a variable part placed on that PS nor a slot of one.
    #[error(
        "shard of PS {ps}: tensor {tensor:?} is neither a variable part placed on this PS nor a \
         slot (\"<part>{SLOT_INFIX}<slot>\") of one"
    )]
    UnknownTensor {
        /// PS index.
        ps: usize,
        /// Tensor name.
        tensor: String,
    },
    /// The ledger's counts do not add up (LEDGER-1: every scheduled closure is committed,
    /// failed, cancelled, unavailable or pending).
    #[error("ledger: the counts do not balance: {counts}")]
    LedgerUnbalanced {
        /// The counts as stored.
        counts: String,
    },
    /// A closure id appears in two ledger sets (LEDGER-1: one state per closure).
    #[error("ledger: closure {id} is both {first} and {second}")]
    LedgerOverlap {
        /// Closure id.
        id: u64,
        /// First set it is in.
        first: &'static str,
        /// Second set it is in.
        second: &'static str,
    },
    /// The next closure id is the largest `u64`: no closure could be scheduled after it.
    #[error("ledger: next closure id {next}, the largest id: no closure could follow")]
    LedgerExhausted {
        /// The id recorded.
        next: u64,
    },
    /// A variable part's update count is not a count its server could go on from: not an
    /// integer, or the largest `u64` (no update could follow it).
    #[error(
        "update count of {part:?} (extra {UPDATE_COUNT_PREFIX:?} entry) is {found}, not an \
         integer below {}",
        u64::MAX
    )]
    BadUpdateCount {
        /// The variable part.
        part: String,
        /// The value recorded, as JSON.
        found: String,
    },
}

impl Checkpoint {
    /// An empty checkpoint at `step` over `num_ps` parameter servers.
    pub fn new(step: u64, num_ps: usize) -> Self {
        Self {
            step,
            layout: Vec::new(),
            shards: vec![ShardTensors::default(); num_ps],
            dataset_positions: BTreeMap::new(),
            ledger: Ledger::default(),
            extra: serde_json::Value::Null,
        }
    }

    /// Number of parameter-server shards.
    pub fn num_ps(&self) -> usize {
        self.shards.len()
    }

    /// The tensor stored under `name` on PS `ps`, if any.
    pub fn tensor(&self, ps: usize, name: &str) -> Option<&TensorBytes> {
        self.shards.get(ps)?.tensors.get(name)
    }

    /// The update count recorded for variable part `part` (0 when none is: a checkpoint
    /// written without counts restores its parts as never updated). A recorded value that is
    /// not an integer below `u64::MAX` is refused, naming the part: a server restored with it
    /// would overflow at its next update, or restart Adam's bias correction from 0.
    pub fn update_count(&self, part: &str) -> Result<u64, ValidationError> {
        match self.extra.get(update_count_key(part)) {
            None => Ok(0),
            Some(value) => match value.as_u64() {
                Some(count) if count < u64::MAX => Ok(count),
                _ => Err(ValidationError::BadUpdateCount {
                    part: part.to_string(),
                    found: value.to_string(),
                }),
            },
        }
    }

    /// Records `count` as variable part `part`'s update count ([`Checkpoint::update_count`]).
    /// An `extra` that is not a JSON object becomes one (its value is lost).
    pub fn set_update_count(&mut self, part: &str, count: u64) {
        if !self.extra.is_object() {
            self.extra = serde_json::Value::Object(serde_json::Map::new());
        }
        self.extra[update_count_key(part)] = serde_json::json!(count);
    }

    /// Checks that the layout, the shard tensors and the ledger agree; see [`ValidationError`].
    pub fn validate(&self) -> Result<(), ValidationError> {
        let num_ps = self.shards.len();
        if num_ps == 0 {
            return Err(ValidationError::NoShards);
        }
        // Tensor name → PS holding it, for every variable part.
        let mut parts: BTreeMap<String, usize> = BTreeMap::new();
        for var in &self.layout {
            var.validate()?;
            var.check_servers(num_ps)?;
            for (i, spec) in var.shards.iter().enumerate() {
                let tensor = var.shard_name(i);
                let ps = spec.ps as usize;
                if parts.insert(tensor.clone(), ps).is_some() {
                    return Err(ValidationError::DuplicateName { name: tensor });
                }
                self.update_count(&tensor)?;
                let found = self.shards[ps].tensors.get(&tensor).ok_or_else(|| {
                    ValidationError::MissingTensor {
                        ps,
                        tensor: tensor.clone(),
                        variable: var.name.clone(),
                    }
                })?;
                if found.dtype() != var.dtype {
                    return Err(ValidationError::WrongDtype {
                        ps,
                        tensor,
                        expected: var.dtype,
                        found: found.dtype(),
                    });
                }
                let expected = var.shard_shape(i);
                if found.shape() != expected.as_slice() {
                    return Err(ValidationError::WrongShape {
                        ps,
                        tensor,
                        expected,
                        found: found.shape().to_vec(),
                    });
                }
            }
        }
        for (ps, shard) in self.shards.iter().enumerate() {
            for name in shard.tensors.keys() {
                let owner = match name.find(SLOT_INFIX) {
                    Some(at) if at + SLOT_INFIX.len() < name.len() => &name[..at],
                    _ => name.as_str(),
                };
                if parts.get(owner) != Some(&ps) {
                    return Err(ValidationError::UnknownTensor {
                        ps,
                        tensor: name.clone(),
                    });
                }
            }
        }
        self.ledger.validate()
    }

    /// Slot names present per variable (`dense/kernel` → `["m", "v"]`), sorted.
    pub fn slot_names(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut part_owner: BTreeMap<String, &str> = BTreeMap::new();
        for var in &self.layout {
            for i in 0..var.shards.len() {
                part_owner.insert(var.shard_name(i), &var.name);
            }
        }
        let mut slots: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for shard in &self.shards {
            for name in shard.tensors.keys() {
                if let Some(at) = name.find(SLOT_INFIX) {
                    if let Some(var) = part_owner.get(&name[..at]) {
                        slots
                            .entry((*var).to_string())
                            .or_default()
                            .insert(name[at + SLOT_INFIX.len()..].to_string());
                    }
                }
            }
        }
        slots
    }

    /// A JSON description of every shard file's tensors (dtype, shape, bytes as hex), keyed by
    /// file name then tensor name: what `tests/python/check_safetensors.py` compares against.
    pub fn tensor_report(&self) -> serde_json::Value {
        let num_ps = self.shards.len();
        let mut files = serde_json::Map::new();
        for (ps, shard) in self.shards.iter().enumerate() {
            let mut tensors = serde_json::Map::new();
            for (name, t) in &shard.tensors {
                tensors.insert(
                    name.clone(),
                    serde_json::json!({
                        "dtype": t.dtype().as_str(),
                        "shape": t.shape(),
                        "data_hex": hex::encode(t.data()),
                    }),
                );
            }
            files.insert(
                shard_file_name(ps, num_ps),
                serde_json::Value::Object(tensors),
            );
        }
        serde_json::json!({ "step": self.step, "files": files })
    }
}

impl Ledger {
    /// Checks that the counts balance and that no closure id is in two sets (LEDGER-1).
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.next_closure_id == u64::MAX {
            return Err(ValidationError::LedgerExhausted {
                next: self.next_closure_id,
            });
        }
        if !self.counts.balances() {
            return Err(ValidationError::LedgerUnbalanced {
                counts: format!("{:?}", self.counts),
            });
        }
        let sets = [
            ("committed", &self.committed_ids),
            ("pending", &self.pending_ids),
            ("cancelled", &self.cancelled_ids),
        ];
        for (i, (first, a)) in sets.iter().enumerate() {
            for (second, b) in &sets[i + 1..] {
                if let Some(&id) = a.intersection(b).next() {
                    return Err(ValidationError::LedgerOverlap { id, first, second });
                }
            }
        }
        Ok(())
    }
}

/// Tensor name of optimizer slot `slot` of the stored tensor `tensor`.
pub fn slot_tensor_name(tensor: &str, slot: &str) -> String {
    format!("{tensor}{SLOT_INFIX}{slot}")
}

/// File name of PS `ps`'s shard in a checkpoint over `num_ps` PS.
pub fn shard_file_name(ps: usize, num_ps: usize) -> String {
    format!("shard-{ps}-of-{num_ps}.safetensors")
}

/// Serializes a set of ids as sorted inclusive ranges `[[first, last], ...]`.
mod id_ranges {
    use std::collections::BTreeSet;

    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(ids: &BTreeSet<u64>, s: S) -> Result<S::Ok, S::Error> {
        let mut ranges: Vec<[u64; 2]> = Vec::new();
        for &id in ids {
            match ranges.last_mut() {
                Some(last) if last[1].checked_add(1) == Some(id) => last[1] = id,
                _ => ranges.push([id, id]),
            }
        }
        ranges.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<u64>, D::Error> {
        let ranges = Vec::<[u64; 2]>::deserialize(d)?;
        let mut ids = BTreeSet::new();
        let mut prev: Option<u64> = None;
        for [first, last] in ranges {
            // Sorted, disjoint ranges only; also bounds the work to what the ranges say.
            if last < first || prev.is_some_and(|p| first <= p) {
                return Err(D::Error::custom(format!(
                    "id range [{first}, {last}] is empty or out of order"
                )));
            }
            if last - first >= IDS_PER_SET_MAX
                || ids.len() as u64 + (last - first) >= IDS_PER_SET_MAX
            {
                return Err(D::Error::custom("more ids than a ledger set may hold"));
            }
            ids.extend(first..=last);
            prev = Some(last);
        }
        Ok(ids)
    }

    /// Cap on ids per ledger set when reading (about 0.5 GB of set at most), so a tiny
    /// manifest cannot make the reader allocate without bound (SEC-1).
    const IDS_PER_SET_MAX: u64 = 10_000_000;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Shard;

    fn two_ps() -> Checkpoint {
        let mut c = Checkpoint::new(5, 2);
        c.layout.push(Layout {
            name: "emb".into(),
            dtype: Dtype::F32,
            shape: vec![3, 2],
            shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..3 }],
        });
        c.shards[0].tensors.insert(
            "emb/part_0".into(),
            TensorBytes::from_f32(vec![2, 2], &[0.0; 4]).unwrap(),
        );
        c.shards[1].tensors.insert(
            "emb/part_1".into(),
            TensorBytes::from_f32(vec![1, 2], &[0.0; 2]).unwrap(),
        );
        c.shards[1].tensors.insert(
            slot_tensor_name("emb/part_1", "accumulator"),
            TensorBytes::from_f32(vec![1, 2], &[0.0; 2]).unwrap(),
        );
        c
    }

    #[test]
    fn consistent_checkpoint_validates() {
        let c = two_ps();
        c.validate().unwrap();
        let slots = c.slot_names();
        assert_eq!(slots["emb"].iter().collect::<Vec<_>>(), vec!["accumulator"]);
    }

    #[test]
    fn gap_between_parts_is_rejected() {
        let mut c = two_ps();
        c.layout[0].shards[1].rows = 3..3;
        assert!(matches!(
            c.validate(),
            Err(ValidationError::Layout(LayoutError::ShardOutOfOrder { .. }))
        ));
    }

    #[test]
    fn slot_on_wrong_ps_is_rejected() {
        let mut c = two_ps();
        c.shards[0].tensors.insert(
            slot_tensor_name("emb/part_1", "m"),
            TensorBytes::from_f32(vec![1, 2], &[0.0; 2]).unwrap(),
        );
        assert!(matches!(
            c.validate(),
            Err(ValidationError::UnknownTensor { ps: 0, .. })
        ));
    }

    #[test]
    fn ledger_sets_round_trip_as_ranges() {
        let mut l = Ledger::default();
        l.committed_ids.extend([1, 2, 3, 7, 9, 10]);
        l.pending_ids.insert(u64::MAX);
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(
            json["committed_ids"],
            serde_json::json!([[1, 3], [7, 7], [9, 10]])
        );
        let back: Ledger = serde_json::from_value(json).unwrap();
        assert_eq!(back, l);
    }

    #[test]
    fn ledger_ranges_out_of_order_are_rejected() {
        let mut json = serde_json::to_value(Ledger::default()).unwrap();
        json["pending_ids"] = serde_json::json!([[5, 9], [3, 4]]);
        assert!(serde_json::from_value::<Ledger>(json.clone()).is_err());
        json["pending_ids"] = serde_json::json!([[0, u64::MAX]]);
        assert!(serde_json::from_value::<Ledger>(json).is_err());
    }

    #[test]
    fn ledger_overlap_is_rejected() {
        let mut c = two_ps();
        c.ledger.committed_ids.insert(4);
        c.ledger.pending_ids.insert(4);
        assert!(matches!(
            c.validate(),
            Err(ValidationError::LedgerOverlap { id: 4, .. })
        ));
    }

    /// A ledger whose next closure id is the largest `u64` is refused: the coordinator that
    /// restored it would overflow at its first schedule (or, wrapped, hand out ids again).
    #[test]
    fn a_ledger_with_no_id_left_is_rejected() {
        let mut c = two_ps();
        c.ledger.next_closure_id = u64::MAX;
        assert!(matches!(
            c.validate(),
            Err(ValidationError::LedgerExhausted { next: u64::MAX })
        ));
        c.ledger.next_closure_id = u64::MAX - 1;
        c.validate().unwrap();
    }

    /// A variable part's update count must be an integer a server can go on from: a checkpoint
    /// recording the largest `u64`, a negative number or text is refused naming the part (and
    /// so is skipped by a recovery before any server is restored from it); one recording none
    /// reads as 0, and an entry naming no part of the layout is left alone.
    #[test]
    fn an_update_count_no_server_could_go_on_from_is_rejected() {
        let mut c = two_ps();
        let part = c.layout[0].shard_name(0);
        assert_eq!(c.update_count(&part), Ok(0));
        c.set_update_count(&part, u64::MAX - 1);
        c.validate().unwrap();
        assert_eq!(c.update_count(&part), Ok(u64::MAX - 1));
        for bad in [
            serde_json::json!(u64::MAX),
            serde_json::json!(-1),
            serde_json::json!(2.5),
            serde_json::json!("7"),
        ] {
            c.extra[update_count_key(&part)] = bad.clone();
            let err = c.validate().unwrap_err();
            assert_eq!(
                err,
                ValidationError::BadUpdateCount {
                    part: part.clone(),
                    found: bad.to_string()
                }
            );
            assert!(err.to_string().contains(&part), "{err}");
        }
        c.set_update_count(&part, 3);
        c.extra[update_count_key("no/such/part")] = serde_json::json!("anything");
        c.validate().unwrap();
    }
}
