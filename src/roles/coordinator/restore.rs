//! Restoring the parameter servers from a checkpoint: one mechanism ([`RestoreVariable`] for
//! every shard: values, optimizer slots, step count) for the chief program's
//! `restore_checkpoint` at start-up and for the coordinator's parameter-server recovery.
//!
//! Only reads checkpoints and calls parameter servers; it never decides anything (the
//! scheduler does), never writes a checkpoint, and the recovery's loader ([`load_at_cut`])
//! never removes anything either: a save may be under way beside it (CKPT-1).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use cohort_actors::{Epoch, Gateway, Incarnation, RemoteError};
use cohort_transport::NodeId;

use crate::checkpoint::{self, Checkpoint, TensorBytes};
use crate::roles::protocol::{f32_blob, RestoreVariable, PS_ACTOR};
use crate::variable::ShardLayout;

/// Per worker, its datasets' positions (worker → dataset → elements read).
pub type WorkerPositions = BTreeMap<u32, BTreeMap<String, u64>>;

/// Why restoring from a checkpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RestoreError {
    /// The checkpoint does not fit this job (a missing tensor, another shape) or is unreadable.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A parameter server refused the restore or could not be reached.
    #[error("parameter server: {0}")]
    Ps(String),
    /// Parameter server `ps` could not be reached as the incarnation the restore is for (it
    /// is gone, restarted, or did not answer in time): the restore can be tried again.
    #[error("parameter server ps/{ps}: {reason}")]
    Unreachable {
        /// The server's index.
        ps: u32,
        /// What the call ran into.
        reason: String,
    },
}

/// What a failed call to parameter server `ps` means for a restore.
pub(crate) fn ps_call_error(ps: u32, error: RemoteError) -> RestoreError {
    match error {
        RemoteError::Refused { .. } => RestoreError::Ps(format!("ps/{ps}: {error}")),
        _ => RestoreError::Unreachable {
            ps,
            reason: error.to_string(),
        },
    }
}

/// Restores every shard of `layouts` on its parameter server from `ckpt`. With `pinned`
/// (server index → epoch), every call goes to that incarnation and fails if the server is now
/// another one (a recovery must never restore a newer, empty incarnation and call it done);
/// without, to whichever incarnation answers (the chief's restore at start-up).
pub(crate) async fn restore_servers(
    gateway: &Gateway,
    servers: &[(NodeId, SocketAddr)],
    pinned: Option<&BTreeMap<u32, u64>>,
    layouts: &[ShardLayout],
    ckpt: &Checkpoint,
) -> Result<(), RestoreError> {
    for layout in layouts {
        for (i, shard) in layout.shards.iter().enumerate() {
            let name = layout.shard_name(i);
            let values = ckpt.tensor(shard.ps as usize, &name).ok_or_else(|| {
                RestoreError::Checkpoint(format!(
                    "step {}: no tensor {name:?} on ps {}",
                    ckpt.step, shard.ps
                ))
            })?;
            if values.shape() != layout.shard_shape(i).as_slice() {
                return Err(RestoreError::Checkpoint(format!(
                    "step {}: tensor {name:?} has shape {:?}, this job's variable shard has {:?}",
                    ckpt.step,
                    values.shape(),
                    layout.shard_shape(i)
                )));
            }
            let prefix = format!("{name}{}", checkpoint::SLOT_INFIX);
            let as_blob = |t: &TensorBytes| {
                t.to_f32()
                    .map(|v| f32_blob(&v))
                    .map_err(|e| RestoreError::Checkpoint(e.to_string()))
            };
            let mut slots = Vec::new();
            let mut blobs = vec![as_blob(values)?];
            for (key, t) in &ckpt.shards[shard.ps as usize].tensors {
                if let Some(slot) = key.strip_prefix(&prefix) {
                    slots.push(slot.to_string());
                    blobs.push(as_blob(t)?);
                }
            }
            let steps = ckpt
                .extra
                .get(format!("steps/{name}"))
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            let msg = RestoreVariable {
                name: name.clone(),
                shape: values.shape().iter().map(|&d| d as u64).collect(),
                slots,
                steps,
            };
            let (node, addr) = servers
                .get(shard.ps as usize)
                .cloned()
                .ok_or_else(|| RestoreError::Ps(format!("no ps {}", shard.ps)))?;
            let epoch = match pinned {
                Some(pinned) => {
                    Some(
                        *pinned
                            .get(&shard.ps)
                            .ok_or_else(|| RestoreError::Unreachable {
                                ps: shard.ps,
                                reason: "its incarnation was not known when the restore began"
                                    .into(),
                            })?,
                    )
                }
                None => None,
            };
            let reply = async {
                let r = match epoch {
                    Some(epoch) => gateway.remote_ref::<RestoreVariable>(
                        Incarnation::new(node.clone(), Epoch(epoch)),
                        PS_ACTOR,
                    ),
                    None => {
                        gateway
                            .resolve::<RestoreVariable>(addr, &node, PS_ACTOR)
                            .await?
                    }
                };
                r.call_with_blobs(&msg, blobs).await
            };
            reply
                .await
                .map_err(|e| ps_call_error(shard.ps, e))?
                .0
                .map_err(|e| RestoreError::Ps(format!("ps/{}: {e}", shard.ps)))?;
        }
    }
    Ok(())
}

/// The per-worker, per-dataset positions a checkpoint keeps (none in a checkpoint without
/// them: datasets start over).
pub(crate) fn dataset_positions(ckpt: &Checkpoint) -> Result<WorkerPositions, RestoreError> {
    match ckpt.extra.get(DATASET_POSITIONS_KEY) {
        Some(value) => serde_json::from_value(value.clone()).map_err(|e| {
            RestoreError::Checkpoint(format!("step {}: {DATASET_POSITIONS_KEY}: {e}", ckpt.step))
        }),
        None => Ok(WorkerPositions::new()),
    }
}

/// The newest checkpoint under `root` that verifies (CKPT-1) and was taken at `cut` (its
/// ledger's next closure id), if any; every newer one it skipped is logged with the reason.
/// Read only: it lists and reads, and removes nothing (a `.tmp-` directory may be a save in
/// progress). Blocking file IO: run it off the actor's thread.
pub(crate) fn load_at_cut(root: &Path, cut: u64) -> Result<Option<Checkpoint>, RestoreError> {
    let entries =
        checkpoint::list_checkpoints(root).map_err(|e| RestoreError::Checkpoint(e.to_string()))?;
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

/// Where a checkpoint's manifest keeps per-worker, per-dataset positions (the
/// `dataset_positions` field holds each worker's total).
pub(crate) const DATASET_POSITIONS_KEY: &str = "dataset_positions_by_name";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointManager, CheckpointPolicy, TEMP_DIR_PREFIX};
    use std::time::Instant;

    /// CKPT-1: the recovery's loader takes the newest checkpoint taken at the cut (not a newer
    /// one at another cut) and removes nothing: a `.tmp-` directory may be a save under way.
    #[test]
    fn ckpt_1_the_recovery_loader_reads_the_cut_and_leaves_a_save_in_progress_alone() {
        let root = std::env::temp_dir().join(format!(
            "cohort-load-at-cut-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let policy = CheckpointPolicy {
            keep_last: 3,
            ..CheckpointPolicy::default()
        };
        let mut manager = CheckpointManager::new(&root, policy, Instant::now()).unwrap();
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
}
