//! Checkpoints out: a verified checkpoint as one plain safetensors file of whole variables,
//! for tools and frameworks that know nothing of parameter servers (`cohort ckpt export`).
//!
//! A variable split over several parameter servers is stored as parts (`emb/part_0`,
//! `emb/part_1`, each a range of rows); the export joins them in row order under the
//! variable's own name (`emb`). Optimizer slots are left out unless asked for; then each is
//! joined the same way and named `<variable>/slot/<slot>` (`emb/slot/accumulator`). The file's
//! `__metadata__` carries the step and the checkpoint it came from ([`EXPORT_FORMAT`] under
//! `format`).

use std::collections::{BTreeMap, HashMap};

use super::content::{slot_tensor_name, Checkpoint};
use super::tensor::TensorBytes;
use crate::layout::Layout;

/// Value of `format` in an exported file's `__metadata__`.
pub const EXPORT_FORMAT: &str = "cohort-export";

/// Why a checkpoint could not be exported; names the variable or slot at fault.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A part of a variable, or of one of its slots, is missing or does not line up with the
    /// other parts (a checkpoint that verified never has a variable part missing).
    #[error("variable {variable:?}: cannot join {what}: {detail}")]
    Join {
        /// The variable.
        variable: String,
        /// The variable itself or `slot <name>`.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// safetensors refused to serialize the tensors.
    #[error("cannot serialize the export: {0}")]
    Serialize(#[source] safetensors::SafeTensorError),
}

/// Every variable of `ckpt` whole (its parts joined in row order), by variable name; with
/// `with_slots`, also every optimizer slot whole, as `<variable>/slot/<slot>`.
pub fn whole_tensors(
    ckpt: &Checkpoint,
    with_slots: bool,
) -> Result<BTreeMap<String, TensorBytes>, ExportError> {
    let slots = ckpt.slot_names();
    let mut out = BTreeMap::new();
    for layout in &ckpt.layout {
        out.insert(layout.name.clone(), join(ckpt, layout, None)?);
        if !with_slots {
            continue;
        }
        for slot in slots.get(&layout.name).into_iter().flatten() {
            out.insert(
                slot_tensor_name(&layout.name, slot),
                join(ckpt, layout, Some(slot))?,
            );
        }
    }
    Ok(out)
}

/// `ckpt` as the bytes of one safetensors file: [`whole_tensors`], with `format`, `step` and
/// `source` (`source`: which checkpoint, e.g. its directory) in the `__metadata__`.
pub fn export_safetensors(
    ckpt: &Checkpoint,
    with_slots: bool,
    source: &str,
) -> Result<Vec<u8>, ExportError> {
    let tensors = whole_tensors(ckpt, with_slots)?;
    let metadata = HashMap::from([
        ("format".to_string(), EXPORT_FORMAT.to_string()),
        ("step".to_string(), ckpt.step.to_string()),
        ("source".to_string(), source.to_string()),
        ("with_slots".to_string(), with_slots.to_string()),
    ]);
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))
        .map_err(ExportError::Serialize)
}

/// The whole variable `layout` (or its slot `slot`): its parts' bytes one after the other,
/// which is the row-major whole since every part is a range of rows.
fn join(
    ckpt: &Checkpoint,
    layout: &Layout,
    slot: Option<&str>,
) -> Result<TensorBytes, ExportError> {
    let what = slot.map_or_else(|| "its parts".to_string(), |s| format!("slot {s:?}"));
    let error = |detail: String| ExportError::Join {
        variable: layout.name.clone(),
        what: what.clone(),
        detail,
    };
    let mut dtype = None;
    let mut data = Vec::new();
    for (i, shard) in layout.shards.iter().enumerate() {
        let part = layout.shard_name(i);
        let name = slot.map_or_else(|| part.clone(), |s| slot_tensor_name(&part, s));
        let tensor = ckpt
            .tensor(shard.ps as usize, &name)
            .ok_or_else(|| error(format!("tensor {name:?} is not on ps/{}", shard.ps)))?;
        // A slot may have any shape when the variable is whole; parts must line up as rows.
        if layout.shards.len() > 1 && tensor.shape() != layout.shard_shape(i).as_slice() {
            return Err(error(format!(
                "tensor {name:?} has shape {:?}, its rows need {:?}",
                tensor.shape(),
                layout.shard_shape(i)
            )));
        }
        if *dtype.get_or_insert(tensor.dtype()) != tensor.dtype() {
            return Err(error(format!(
                "tensor {name:?} is {}, the parts before it are {}",
                tensor.dtype(),
                dtype.unwrap_or(tensor.dtype())
            )));
        }
        if layout.shards.len() == 1 {
            return Ok(tensor.clone());
        }
        data.extend_from_slice(tensor.data());
    }
    let dtype = dtype.unwrap_or(layout.dtype);
    TensorBytes::new(dtype, layout.shape.clone(), data).map_err(|e| error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Dtype, Shard};

    fn split() -> Checkpoint {
        let mut c = Checkpoint::new(7, 2);
        c.layout.push(Layout {
            name: "emb".into(),
            dtype: Dtype::F32,
            shape: vec![3, 2],
            shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..3 }],
        });
        for (ps, part, values) in [
            (0, "emb/part_0", vec![1.0, 2.0, 3.0, 4.0]),
            (1, "emb/part_1", vec![5.0, 6.0]),
        ] {
            let rows = values.len() / 2;
            c.shards[ps].tensors.insert(
                part.into(),
                TensorBytes::from_f32(vec![rows, 2], &values).unwrap(),
            );
            c.shards[ps].tensors.insert(
                slot_tensor_name(part, "m"),
                TensorBytes::from_f32(vec![rows, 2], &vec![-1.0; values.len()]).unwrap(),
            );
        }
        c
    }

    #[test]
    fn parts_are_joined_in_row_order_and_slots_only_when_asked() {
        let c = split();
        let plain = whole_tensors(&c, false).unwrap();
        assert_eq!(plain.keys().collect::<Vec<_>>(), ["emb"]);
        assert_eq!(plain["emb"].shape(), [3, 2]);
        assert_eq!(
            plain["emb"].to_f32().unwrap(),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        let with = whole_tensors(&c, true).unwrap();
        assert_eq!(with["emb/slot/m"].to_f32().unwrap(), [-1.0; 6]);
    }

    #[test]
    fn a_slot_missing_on_one_part_is_an_error_naming_it() {
        let mut c = split();
        c.shards[1]
            .tensors
            .remove(&slot_tensor_name("emb/part_1", "m"));
        assert!(whole_tensors(&c, false).is_ok());
        let err = whole_tensors(&c, true).unwrap_err().to_string();
        assert!(
            err.contains("\"emb\"") && err.contains("emb/part_1/slot/m"),
            "{err}"
        );
    }
}
