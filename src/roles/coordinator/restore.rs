//! Restoring the parameter servers from a checkpoint: one mechanism ([`RestoreVariable`] for
//! every shard: values, optimizer slots, step count) for the chief program's
//! `restore_checkpoint` at start-up and for the coordinator's parameter-server recovery.
//!
//! Only reads checkpoints and calls parameter servers; it never decides anything (the
//! scheduler does) and never writes a checkpoint.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use cohort_actors::Gateway;
use cohort_transport::NodeId;

use crate::checkpoint::{self, Checkpoint, CheckpointManager, CheckpointPolicy, TensorBytes};
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
}

/// Restores every shard of `layouts` on its parameter server from `ckpt`.
pub(crate) async fn restore_servers(
    gateway: &Gateway,
    servers: &[(NodeId, SocketAddr)],
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
            let reply = async {
                let r = gateway
                    .resolve::<RestoreVariable>(addr, &node, PS_ACTOR)
                    .await?;
                r.call_with_blobs(&msg, blobs).await
            };
            reply
                .await
                .map_err(|e| RestoreError::Ps(format!("ps/{}: {e}", shard.ps)))?
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

/// The newest checkpoint under `root` that verifies (CKPT-1), if any; every newer one it
/// skipped is logged with the reason. Blocking file IO: run it off the actor's thread.
pub(crate) fn load_newest(root: &Path) -> Result<Option<Checkpoint>, RestoreError> {
    let mut manager = CheckpointManager::new(root, CheckpointPolicy::default(), Instant::now())
        .map_err(|e| RestoreError::Checkpoint(e.to_string()))?;
    let outcome = manager
        .restore_latest()
        .map_err(|e| RestoreError::Checkpoint(e.to_string()))?;
    for skipped in &outcome.skipped {
        tracing::warn!(
            "skipped checkpoint {}: {}",
            skipped.dir.display(),
            skipped.error
        );
    }
    Ok(outcome.restored.map(|loaded| loaded.checkpoint))
}

/// Where a checkpoint's manifest keeps per-worker, per-dataset positions (the
/// `dataset_positions` field holds each worker's total).
pub(crate) const DATASET_POSITIONS_KEY: &str = "dataset_positions_by_name";
