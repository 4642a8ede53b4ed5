//! The IO of a restore, as the coordinator shell carries out the calls of the machine's
//! restore sub-machine ([`super::machine::recovery`]): sending one server's shards from a
//! checkpoint ([`RestoreVariable`] for every shard: values, optimizer slots, step count) and
//! reading the checkpoint taken at a cut.
//!
//! It also owns reading a checkpoint into the job's layouts when they are not the
//! checkpoint's (another number of servers, other shard boundaries): the resharding
//! ([`shard_restores`]), so a checkpoint saved on M parameter servers restores onto M'.
//!
//! It never decides anything (the machine orders the calls), never writes a checkpoint, and
//! the loader ([`load_at_cut`]) never removes anything either: a save may be under way beside
//! it (CKPT-1).

use std::ops::Range;
use std::path::Path;

use bytes::Bytes;
use cohort_actors::{Gateway, Incarnation, RefusedReason, RemoteError};
use cohort_transport::NodeId;

use super::machine::recovery::CallFault;
use crate::checkpoint::{self, Checkpoint, ListError};
use crate::layout::{Dtype, Layout};
use crate::roles::protocol::{RestoreVariable, PS_ACTOR};

/// What a failed call means to the machine: a refusal of the request itself, or a reply that
/// does not decode, cannot be helped by calling again; anything else can (the peer is gone,
/// restarted, busy, did not answer in time, or is up but not serving that actor yet).
pub(crate) fn call_fault(error: RemoteError) -> CallFault {
    let retryable = match &error {
        RemoteError::Refused { reason, .. } => matches!(
            reason,
            RefusedReason::ActorUnavailable(_)
                | RefusedReason::NoSuchActor(_)
                | RefusedReason::TooManyPeers
        ),
        RemoteError::Codec { .. } => false,
        RemoteError::Timeout { .. }
        | RemoteError::PeerLost { .. }
        | RemoteError::Stale { .. }
        // This process is outdated and exits to come back as a newer incarnation.
        | RemoteError::Outdated { .. }
        | RemoteError::Busy { .. } => true,
    };
    if retryable {
        CallFault::Unreachable(error.to_string())
    } else {
        CallFault::Refused(error.to_string())
    }
}

/// Restores every shard of `layouts` placed on server `ps` from `ckpt`, each call to the
/// incarnation `target` (never a newer one, which would be empty). A checkpoint that does not
/// fit the job (a missing tensor, another shape) is a refusal. The messages are built on a
/// blocking thread: they copy every tensor of the server's shards (hundreds of megabytes for
/// a large embedding), and the caller runs on the coordinator's actor, whose thread also
/// serves the node's heartbeats.
pub(crate) async fn restore_shards(
    gateway: &Gateway,
    target: Incarnation<NodeId>,
    ps: u32,
    layouts: Vec<Layout>,
    ckpt: std::sync::Arc<Checkpoint>,
) -> Result<(), CallFault> {
    let reference = gateway.remote_ref::<RestoreVariable>(target, PS_ACTOR);
    let messages = tokio::task::spawn_blocking(move || shard_restores(ps, &layouts, &ckpt))
        .await
        .map_err(|e| CallFault::Refused(format!("building ps/{ps}'s restore failed: {e}")))??;
    for (msg, blobs) in messages {
        reference
            .call_with_blobs(&msg, blobs)
            .await
            .map_err(call_fault)?
            .0
            .map_err(|refusal| CallFault::Refused(format!("ps/{ps}: {refusal}")))?;
    }
    Ok(())
}

/// The [`RestoreVariable`] messages (with their blobs: the values, then every optimizer slot
/// in the message's order) that restore server `ps`'s shards of `layouts` from `ckpt`.
///
/// The job's layouts need not be the checkpoint's: a checkpoint saved on M servers restores
/// onto M' (see [`SavedVariable`]). A variable of the job that the checkpoint lacks, or that it
/// saved with another full shape or dtype, is a refusal naming it; variables the checkpoint
/// has and the job does not are left alone.
pub(crate) fn shard_restores(
    ps: u32,
    layouts: &[Layout],
    ckpt: &Checkpoint,
) -> Result<Vec<(RestoreVariable, Vec<Bytes>)>, CallFault> {
    // The refusal crosses into the machine's `CallFault`, which carries it as text.
    let unfit = |detail: UnfitVariable| {
        CallFault::Refused(format!("checkpoint at step {}: {detail}", ckpt.step))
    };
    let mut restores = Vec::new();
    for layout in layouts {
        if !layout.shards.iter().any(|s| s.ps == ps) {
            continue;
        }
        let saved = SavedVariable::find(ckpt, layout).map_err(unfit)?;
        if saved.layout.shards != layout.shards {
            tracing::info!(
                "variable {:?}: the checkpoint holds it in {} shards on its {} servers; \
                 resharding it into this job's {} shards (restoring ps/{ps}'s)",
                layout.name,
                saved.layout.shards.len(),
                ckpt.num_ps(),
                layout.shards.len()
            );
        }
        for (i, shard) in layout.shards.iter().enumerate() {
            if shard.ps == ps {
                restores.push(saved.restore(layout, i).map_err(unfit)?);
            }
        }
    }
    Ok(restores)
}

/// Why a checkpoint does not fit a variable of the job (a restore refuses it, naming it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnfitVariable {
    /// The checkpoint has no variable of that name.
    #[error("variable {name:?} is not in the checkpoint")]
    NotSaved {
        /// The variable.
        name: String,
    },
    /// The checkpoint saved it with another dtype or full shape.
    #[error(
        "variable {name:?} was saved as {saved_dtype} {saved_shape:?}, this job's is {dtype} \
         {shape:?}"
    )]
    SavedOtherwise {
        /// The variable.
        name: String,
        /// Its dtype in the checkpoint.
        saved_dtype: Dtype,
        /// Its full shape in the checkpoint.
        saved_shape: Vec<usize>,
        /// Its dtype in the job.
        dtype: Dtype,
        /// Its full shape in the job.
        shape: Vec<usize>,
    },
    /// The checkpoint records something of it no restore can use (an update count no server
    /// could go on from).
    #[error(transparent)]
    Invalid(crate::checkpoint::ValidationError),
    /// A tensor of one of its saved shards (the values or a slot) is missing.
    #[error("variable {name:?}: no tensor {tensor:?} on ps {ps}")]
    NoTensor {
        /// The variable.
        name: String,
        /// The tensor.
        tensor: String,
        /// The server whose shard file should hold it.
        ps: usize,
    },
    /// A tensor of one of its saved shards is not its shard's F32 shape.
    #[error(
        "variable {name:?}: tensor {tensor:?} on ps {ps} is {dtype} {shape:?}, its shard is F32 \
         {shard_shape:?}"
    )]
    TensorOtherwise {
        /// The variable.
        name: String,
        /// The tensor.
        tensor: String,
        /// The server whose shard file holds it.
        ps: usize,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape of its shard.
        shard_shape: Vec<usize>,
    },
}

/// One variable as a checkpoint saved it (its layout there, the tensors of its shards, their
/// optimizer slots and step counts), read into any layout of the same full shape and dtype:
/// the resharding of a restore onto another number of servers or other shard boundaries.
///
/// Each target shard's rows are copied, as bytes, from the saved shards that hold them (a row
/// range may span several), for the values and for every optimizer slot alike, so values and
/// slots arrive bit-identical (NaN payloads and signed zeros included). A whole variable that
/// moved to another server is the case of one shard over the same rows.
///
/// The step count (Adam's bias correction reads it) is kept per shard: a target shard takes
/// the largest count among the saved shards its rows come from (the whole variable's largest
/// for a shard with no rows). Dense updates reach every shard of a variable, so their counts
/// are equal and this is exact. A sparse update counts only on the shards it touched; there the
/// largest count never moves a row's count back (a smaller one would correct its slots' bias
/// as if they were younger, enlarging its next updates), and a shard cut out of a single saved
/// shard keeps that shard's count exactly.
struct SavedVariable<'a> {
    ckpt: &'a Checkpoint,
    /// The variable's layout in the checkpoint.
    layout: &'a Layout,
    /// Every optimizer slot the checkpoint holds for it, sorted.
    slots: Vec<String>,
}

impl<'a> SavedVariable<'a> {
    /// The checkpoint's record of the job's variable `job`, if it fits it (same full shape and
    /// dtype); otherwise why not, naming the variable.
    fn find(ckpt: &'a Checkpoint, job: &Layout) -> Result<Self, UnfitVariable> {
        let name = &job.name;
        let layout = ckpt
            .layout
            .iter()
            .find(|l| &l.name == name)
            .ok_or_else(|| UnfitVariable::NotSaved { name: name.clone() })?;
        if layout.shape != job.shape || layout.dtype != job.dtype {
            return Err(UnfitVariable::SavedOtherwise {
                name: name.clone(),
                saved_dtype: layout.dtype,
                saved_shape: layout.shape.clone(),
                dtype: job.dtype,
                shape: job.shape.clone(),
            });
        }
        let mut slots = std::collections::BTreeSet::new();
        for (j, shard) in layout.shards.iter().enumerate() {
            let prefix = format!("{}{}", layout.shard_name(j), checkpoint::SLOT_INFIX);
            if let Some(saved) = ckpt.shards.get(shard.ps as usize) {
                slots.extend(
                    saved
                        .tensors
                        .range(prefix.clone()..)
                        .map(|(key, _)| key)
                        .take_while(|key| key.starts_with(&prefix))
                        .map(|key| key[prefix.len()..].to_string()),
                );
            }
        }
        Ok(Self {
            ckpt,
            layout,
            slots: slots.into_iter().collect(),
        })
    }

    /// The [`RestoreVariable`] and its blobs for shard `index` of `job` (this variable in the
    /// job's layout).
    fn restore(
        &self,
        job: &Layout,
        index: usize,
    ) -> Result<(RestoreVariable, Vec<Bytes>), UnfitVariable> {
        let pieces = self.pieces(&job.shards[index].rows);
        let mut blobs = vec![self.gather(&pieces, None)?];
        for slot in &self.slots {
            blobs.push(self.gather(&pieces, Some(slot))?);
        }
        let steps = if pieces.is_empty() {
            (0..self.layout.shards.len())
                .map(|j| self.steps(j))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            pieces
                .iter()
                .map(|(j, _)| self.steps(*j))
                .collect::<Result<Vec<_>, _>>()?
        }
        .into_iter()
        .max()
        .unwrap_or(0);
        let msg = RestoreVariable {
            name: job.shard_name(index),
            shape: job.shard_shape(index).iter().map(|&d| d as u64).collect(),
            slots: self.slots.clone(),
            steps,
        };
        Ok((msg, blobs))
    }

    /// The saved shards holding `rows` of the variable, in row order, each with the rows (in
    /// that shard's own numbering) it gives. A saved shard over exactly these rows is taken
    /// whole, empty or not (so a restore onto the saved layout is shard for shard).
    fn pieces(&self, rows: &Range<usize>) -> Vec<(usize, Range<usize>)> {
        let saved = &self.layout.shards;
        if let Some(j) = saved.iter().position(|s| &s.rows == rows) {
            return vec![(j, 0..rows.len())];
        }
        saved
            .iter()
            .enumerate()
            .filter_map(|(j, s)| {
                let start = rows.start.max(s.rows.start);
                let end = rows.end.min(s.rows.end);
                (start < end).then(|| (j, start - s.rows.start..end - s.rows.start))
            })
            .collect()
    }

    /// The bytes of `pieces` of the values (`slot` None) or of one optimizer slot, in order.
    fn gather(
        &self,
        pieces: &[(usize, Range<usize>)],
        slot: Option<&str>,
    ) -> Result<Bytes, UnfitVariable> {
        let mut bytes = Vec::new();
        for (j, rows) in pieces {
            let ps = self.layout.shards[*j].ps as usize;
            let part = self.layout.shard_name(*j);
            let tensor_name = match slot {
                None => part.clone(),
                Some(slot) => checkpoint::slot_tensor_name(&part, slot),
            };
            let tensor =
                self.ckpt
                    .tensor(ps, &tensor_name)
                    .ok_or_else(|| UnfitVariable::NoTensor {
                        name: self.layout.name.clone(),
                        tensor: tensor_name.clone(),
                        ps,
                    })?;
            let shape = self.layout.shard_shape(*j);
            if tensor.dtype() != Dtype::F32 || tensor.shape() != shape.as_slice() {
                return Err(UnfitVariable::TensorOtherwise {
                    name: self.layout.name.clone(),
                    tensor: tensor_name,
                    ps,
                    dtype: tensor.dtype(),
                    shape: tensor.shape().to_vec(),
                    shard_shape: shape,
                });
            }
            // The shape matched, so every row is `row_len` f32 and the slice is in bounds.
            let row_bytes = self.layout.row_len() * Dtype::F32.size_bytes();
            bytes.extend_from_slice(&tensor.data()[rows.start * row_bytes..rows.end * row_bytes]);
        }
        Ok(Bytes::from(bytes))
    }

    /// The update count the checkpoint holds for saved shard `j` (0 if none); one no server
    /// could go on from is a refusal naming the part (a checkpoint that was read verified its
    /// counts already; one built in memory is checked here).
    fn steps(&self, j: usize) -> Result<u64, UnfitVariable> {
        self.ckpt
            .update_count(&self.layout.shard_name(j))
            .map_err(UnfitVariable::Invalid)
    }
}

/// The newest checkpoint under `root` that verifies (CKPT-1) and was taken at `cut` (its
/// ledger's next closure id), if any; every newer one it skipped is logged with the reason.
/// Read only: it lists and reads, and removes nothing (a `.tmp-` directory may be a save in
/// progress). Blocking file IO: run it off the actor's thread.
pub(crate) fn load_at_cut(root: &Path, cut: u64) -> Result<Option<Checkpoint>, ListError> {
    let entries = checkpoint::list_checkpoints(root)?;
    for entry in entries.into_iter().rev() {
        match checkpoint::read_checkpoint(&entry.dir) {
            Ok(loaded) if loaded.checkpoint.ledger.next_closure_id == cut => {
                return Ok(Some(loaded.checkpoint))
            }
            Ok(loaded) => tracing::warn!(
                "skipped checkpoint {}: taken at closure {}, the recovery rolls back to {cut}",
                entry.dir.display(),
                loaded.checkpoint.ledger.next_closure_id
            ),
            Err(error) => tracing::warn!("skipped checkpoint {}: {error}", entry.dir.display()),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointManager, CheckpointPolicy, TEMP_DIR_PREFIX};
    use std::time::Instant;

    mod reshard {
        use std::collections::BTreeMap;

        use super::super::shard_restores;
        use crate::checkpoint::{slot_tensor_name, Checkpoint, TensorBytes};
        use crate::layout::{Dtype, Layout, Shard};
        use crate::roles::coordinator::machine::recovery::CallFault;

        /// The optimizer slots every saved shard carries.
        const SLOTS: [&str; 2] = ["m", "v"];

        fn layout(name: &str, shape: &[usize], shards: &[(u32, std::ops::Range<usize>)]) -> Layout {
            Layout {
                name: name.into(),
                dtype: Dtype::F32,
                shape: shape.to_vec(),
                shards: shards
                    .iter()
                    .map(|(ps, rows)| Shard {
                        ps: *ps,
                        rows: rows.clone(),
                    })
                    .collect(),
            }
        }

        /// `n` distinct bit patterns for tensor `tag`: NaNs with payloads and a negative zero
        /// among them, so any element converted, moved or lost shows.
        fn bits(tag: u32, n: usize) -> Vec<u32> {
            (0..n as u32)
                .map(|i| match i % 3 {
                    0 => 0x7f80_0001 + tag * 1000 + i,
                    1 if i == 1 => (-0.0f32).to_bits(),
                    _ => ((tag * 100 + i) as f32).to_bits(),
                })
                .collect()
        }

        /// The whole variable's values (`None`) and slots, as the test saved them.
        type Full = BTreeMap<(String, Option<String>), Vec<u32>>;

        /// A checkpoint on `num_ps` servers of `vars` (each layout with its shards' step
        /// counts), every value and slot distinct; and what it holds, whole.
        fn saved(num_ps: usize, vars: &[(Layout, Vec<u64>)]) -> (Checkpoint, Full) {
            let mut ckpt = Checkpoint::new(3, num_ps);
            let mut full = Full::new();
            for (tag, (var, steps)) in vars.iter().enumerate() {
                ckpt.layout.push(var.clone());
                let len = var.rows() * var.row_len();
                let mut tensors = vec![(None, bits(tag as u32 * 10, len))];
                for (k, slot) in SLOTS.iter().enumerate() {
                    tensors.push((
                        Some(slot.to_string()),
                        bits(tag as u32 * 10 + 1 + k as u32, len),
                    ));
                }
                for (j, shard) in var.shards.iter().enumerate() {
                    let part = var.shard_name(j);
                    let rows = shard.rows.start * var.row_len()..shard.rows.end * var.row_len();
                    for (slot, values) in &tensors {
                        let name = match slot {
                            None => part.clone(),
                            Some(slot) => slot_tensor_name(&part, slot),
                        };
                        let values: Vec<f32> = values[rows.clone()]
                            .iter()
                            .map(|&b| f32::from_bits(b))
                            .collect();
                        ckpt.shards[shard.ps as usize].tensors.insert(
                            name,
                            TensorBytes::from_f32(var.shard_shape(j), &values).unwrap(),
                        );
                    }
                    ckpt.set_update_count(&part, steps[j]);
                }
                for (slot, values) in tensors {
                    full.insert((var.name.clone(), slot), values);
                }
            }
            ckpt.validate().unwrap();
            (ckpt, full)
        }

        /// Restores `job` on its `num_ps` servers from `ckpt`: every variable reassembled from
        /// the restore messages in row order (values and slots), and each shard's step count.
        fn restore(job: &[Layout], num_ps: u32, ckpt: &Checkpoint) -> (Full, Vec<Vec<u64>>) {
            let mut by_shard = BTreeMap::new();
            for ps in 0..num_ps {
                for (msg, blobs) in shard_restores(ps, job, ckpt).unwrap() {
                    assert_eq!(msg.slots, SLOTS, "{}", msg.name);
                    assert_eq!(blobs.len(), 1 + SLOTS.len(), "{}", msg.name);
                    by_shard.insert(msg.name.clone(), (msg, blobs));
                }
            }
            let mut full = Full::new();
            let mut steps = Vec::new();
            for var in job {
                let mut var_steps = Vec::new();
                for (j, shard) in var.shards.iter().enumerate() {
                    let (msg, blobs) = &by_shard[&var.shard_name(j)];
                    let shape: Vec<u64> = var.shard_shape(j).iter().map(|&d| d as u64).collect();
                    assert_eq!(msg.shape, shape, "{}", msg.name);
                    var_steps.push(msg.steps);
                    let slots = std::iter::once(None).chain(SLOTS.map(|s| Some(s.to_string())));
                    for (slot, blob) in slots.zip(blobs) {
                        assert_eq!(
                            blob.len(),
                            shard.rows.len() * var.row_len() * 4,
                            "{} {slot:?}",
                            msg.name
                        );
                        full.entry((var.name.clone(), slot)).or_default().extend(
                            blob.chunks_exact(4)
                                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                        );
                    }
                }
                steps.push(var_steps);
            }
            assert_eq!(
                by_shard.len(),
                job.iter().map(|l| l.shards.len()).sum::<usize>()
            );
            (full, steps)
        }

        /// A [10, 3] variable saved on 2 servers (rows 0..5, 5..10) restores onto 3 servers
        /// (0..4, 4..7, 7..10: the middle shard spans both saved ones), onto 1, and onto its
        /// own layout, values and both slots bit for bit; each shard's step count is the
        /// largest of the saved shards its rows come from.
        #[test]
        fn a_split_variable_restores_onto_three_servers_onto_one_and_onto_its_own_layout() {
            let two = layout("emb", &[10, 3], &[(0, 0..5), (1, 5..10)]);
            let (ckpt, full) = saved(2, &[(two.clone(), vec![7, 9])]);

            let three = layout("emb", &[10, 3], &[(0, 0..4), (1, 4..7), (2, 7..10)]);
            let (restored, steps) = restore(&[three], 3, &ckpt);
            assert_eq!(restored, full);
            assert_eq!(steps, [[7, 9, 9]]);

            let one = layout("emb", &[10, 3], &[(0, 0..10)]);
            let (restored, steps) = restore(&[one], 1, &ckpt);
            assert_eq!(restored, full);
            assert_eq!(steps, [[9]]);

            let (restored, steps) = restore(&[two], 2, &ckpt);
            assert_eq!(restored, full);
            assert_eq!(steps, [[7, 9]]);
        }

        /// A whole variable placed on ps/1 of 2 restores onto ps/0 of 1, beside one that stays
        /// on ps/0; a job whose variable is split where the checkpoint's was whole reads it too.
        #[test]
        fn whole_variables_are_placed_again_and_may_be_split() {
            let bias = layout("bias", &[3], &[(1, 0..3)]);
            let head = layout("head", &[4, 2], &[(0, 0..4)]);
            let (ckpt, full) = saved(2, &[(head.clone(), vec![5]), (bias, vec![4])]);

            let onto_one = [head, layout("bias", &[3], &[(0, 0..3)])];
            let (restored, steps) = restore(&onto_one, 1, &ckpt);
            assert_eq!(restored, full);
            assert_eq!(steps, [[5], [4]]);

            let split = [
                layout("head", &[4, 2], &[(1, 0..1), (0, 1..4)]),
                layout("bias", &[3], &[(0, 0..3)]),
            ];
            let (restored, steps) = restore(&split, 2, &ckpt);
            assert_eq!(restored, full);
            assert_eq!(steps, [vec![5, 5], vec![4]]);
        }

        fn refusal(job: &[Layout], ps: u32, ckpt: &Checkpoint) -> String {
            match shard_restores(ps, job, ckpt) {
                Err(CallFault::Refused(why)) => why,
                other => panic!("expected a refusal, got {other:?}"),
            }
        }

        /// A variable the checkpoint lacks, one saved with another shape or dtype, and a saved
        /// shard missing a slot that the target rows need are refused, naming what is wrong.
        #[test]
        fn a_variable_that_does_not_fit_is_refused_by_name() {
            let two = layout("emb", &[10, 3], &[(0, 0..5), (1, 5..10)]);
            let (mut ckpt, _) = saved(2, &[(two, vec![1, 1])]);

            let why = refusal(&[layout("emb", &[10, 4], &[(0, 0..10)])], 0, &ckpt);
            assert_eq!(
                why,
                "checkpoint at step 3: variable \"emb\" was saved as F32 [10, 3], this job's is \
                 F32 [10, 4]"
            );
            let mut other_dtype = layout("emb", &[10, 3], &[(0, 0..10)]);
            other_dtype.dtype = Dtype::F64;
            assert!(refusal(&[other_dtype], 0, &ckpt).contains("variable \"emb\" was saved as F32"));
            let why = refusal(&[layout("extra", &[2], &[(0, 0..2)])], 0, &ckpt);
            assert_eq!(
                why,
                "checkpoint at step 3: variable \"extra\" is not in the checkpoint"
            );

            ckpt.shards[1]
                .tensors
                .remove(&slot_tensor_name("emb/part_1", "v"));
            let three = [layout("emb", &[10, 3], &[(0, 0..4), (1, 4..7), (2, 7..10)])];
            // ps/0's rows all come from the saved shard that is whole.
            assert_eq!(shard_restores(0, &three, &ckpt).unwrap().len(), 1);
            let why = refusal(&three, 1, &ckpt);
            assert_eq!(
                why,
                "checkpoint at step 3: variable \"emb\": no tensor \"emb/part_1/slot/v\" on ps 1"
            );

            // An update count no server could go on from, in a checkpoint built in memory
            // (never read, so never verified), is refused naming the part, not read as 0.
            ckpt.extra[crate::checkpoint::update_count_key("emb/part_0")] =
                serde_json::json!(u64::MAX);
            let why = refusal(&three, 0, &ckpt);
            assert!(why.contains("update count of \"emb/part_0\""), "{why}");
        }
    }

    /// An empty checkpoint root named after `name`, this process and thread, and a manager
    /// over it that keeps three checkpoints.
    fn scratch_store(name: &str) -> (std::path::PathBuf, CheckpointManager) {
        let root = std::env::temp_dir().join(format!(
            "cohort-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let policy = CheckpointPolicy {
            keep_last: 3,
            ..CheckpointPolicy::default()
        };
        let manager = CheckpointManager::new(&root, policy, Instant::now()).unwrap();
        (root, manager)
    }

    /// CKPT-1: the recovery's loader takes the newest checkpoint taken at the cut (not a newer
    /// one at another cut) and removes nothing: a `.tmp-` directory may be a save under way.
    #[test]
    fn ckpt_1_the_recovery_loader_reads_the_cut_and_leaves_a_save_in_progress_alone() {
        let (root, mut manager) = scratch_store("load-at-cut");
        for (step, cut) in [(1, 4), (2, 9)] {
            let mut ckpt = Checkpoint::new(step, 1);
            ckpt.ledger.next_closure_id = cut;
            manager.save(&ckpt, Instant::now()).unwrap();
        }
        let in_progress = root.join(format!("{TEMP_DIR_PREFIX}save-in-progress"));
        std::fs::create_dir_all(&in_progress).unwrap();
        assert_eq!(load_at_cut(&root, 4).unwrap().map(|c| c.step), Some(1));
        assert_eq!(load_at_cut(&root, 9).unwrap().map(|c| c.step), Some(2));
        assert!(load_at_cut(&root, 5).unwrap().is_none());
        assert!(
            in_progress.exists(),
            "the loader removed a save in progress"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A checkpoint recording an update count no server could go on from (edited by hand:
    /// the largest `u64`) is skipped by the recovery's loader, naming the part, before any
    /// server is restored from it: the loader takes the newest one at the cut that verifies.
    #[test]
    fn the_recovery_loader_skips_a_checkpoint_whose_update_count_leaves_no_room() {
        use crate::checkpoint::{read_manifest, update_count_key, TensorBytes, MANIFEST_FILE};
        use crate::layout::Shard;

        let (root, mut manager) = scratch_store("load-bad-count");
        for step in [1, 2] {
            let mut ckpt = Checkpoint::new(step, 1);
            ckpt.ledger.next_closure_id = 9;
            ckpt.layout.push(Layout {
                name: "w".into(),
                dtype: Dtype::F32,
                shape: vec![2],
                shards: vec![Shard { ps: 0, rows: 0..2 }],
            });
            ckpt.shards[0].tensors.insert(
                "w".into(),
                TensorBytes::from_f32(vec![2], &[1.0, 2.0]).unwrap(),
            );
            ckpt.set_update_count("w", step * 10);
            manager.save(&ckpt, Instant::now()).unwrap();
        }
        let newest = checkpoint::list_checkpoints(&root).unwrap().pop().unwrap();
        let mut manifest = read_manifest(&newest.dir).unwrap();
        manifest.extra[update_count_key("w")] = serde_json::json!(u64::MAX);
        std::fs::write(
            newest.dir.join(MANIFEST_FILE),
            manifest.to_file_bytes().unwrap(),
        )
        .unwrap();
        let err = checkpoint::read_checkpoint(&newest.dir).unwrap_err();
        assert!(err.to_string().contains("update count of \"w\""), "{err}");
        let loaded = load_at_cut(&root, 9).unwrap().unwrap();
        assert_eq!((loaded.step, loaded.update_count("w")), (1, Ok(10)));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Faults that calling again can cure are `Unreachable` (a save or a restore waits them
    /// out); the rest are refusals.
    #[test]
    fn only_faults_that_calling_again_can_cure_are_unreachable() {
        let peer = NodeId::new("ps", 0);
        let retryable = [
            RemoteError::Timeout {
                peer: peer.clone(),
                timeout_ms: 5,
            },
            RemoteError::PeerLost {
                peer: peer.clone(),
                reason: "gone".into(),
            },
            RemoteError::Stale {
                peer: peer.clone(),
                reason: "restarted".into(),
            },
            RemoteError::Refused {
                peer: peer.clone(),
                reason: RefusedReason::ActorUnavailable("not serving".into()),
            },
        ];
        for e in retryable {
            assert!(
                matches!(call_fault(e.clone()), CallFault::Unreachable(_)),
                "{e}"
            );
        }
        let permanent = [
            RemoteError::Refused {
                peer: peer.clone(),
                reason: RefusedReason::BadMessage("too large".into()),
            },
            RemoteError::Codec {
                peer: peer.clone(),
                reason: "bad reply".into(),
            },
        ];
        for e in permanent {
            assert!(
                matches!(call_fault(e.clone()), CallFault::Refused(_)),
                "{e}"
            );
        }
    }
}
