//! The IO of a restore, as the coordinator shell carries out the calls of the machine's
//! restore sub-machine ([`super::machine::recovery`]): sending one server's shards from a
//! checkpoint ([`RestoreVariable`] for every shard: values, optimizer slots, step count) and
//! reading the checkpoint taken at a cut.
//!
//! It never decides anything (the machine orders the calls), never writes a checkpoint, and
//! the loader ([`load_at_cut`]) never removes anything either: a save may be under way beside
//! it (CKPT-1).

use std::path::Path;

use bytes::Bytes;
use cohort_actors::{Gateway, Incarnation, RefusedReason, RemoteError};
use cohort_transport::NodeId;

use super::machine::recovery::CallFault;
use crate::checkpoint::{self, Checkpoint, TensorBytes};
use crate::layout::Layout;
use crate::roles::protocol::{f32_blob, RestoreVariable, PS_ACTOR};

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
/// fit the job (a missing tensor, another shape) is a refusal.
pub(crate) async fn restore_shards(
    gateway: &Gateway,
    target: Incarnation<NodeId>,
    ps: u32,
    layouts: &[Layout],
    ckpt: &Checkpoint,
) -> Result<(), CallFault> {
    let reference = gateway.remote_ref::<RestoreVariable>(target, PS_ACTOR);
    for (msg, blobs) in shard_restores(ps, layouts, ckpt)? {
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
/// in the message's order) that restore server `ps`'s shards of `layouts` from `ckpt`. A
/// checkpoint that does not fit the job (a missing tensor, another shape) is a refusal.
pub(crate) fn shard_restores(
    ps: u32,
    layouts: &[Layout],
    ckpt: &Checkpoint,
) -> Result<Vec<(RestoreVariable, Vec<Bytes>)>, CallFault> {
    let unfit =
        |detail: String| CallFault::Refused(format!("checkpoint at step {}: {detail}", ckpt.step));
    let mut restores = Vec::new();
    for layout in layouts {
        for (i, shard) in layout.shards.iter().enumerate() {
            if shard.ps != ps {
                continue;
            }
            let name = layout.shard_name(i);
            let values = ckpt
                .tensor(ps as usize, &name)
                .ok_or_else(|| unfit(format!("no tensor {name:?} on ps {ps}")))?;
            if values.shape() != layout.shard_shape(i).as_slice() {
                return Err(unfit(format!(
                    "tensor {name:?} has shape {:?}, this job's variable shard has {:?}",
                    values.shape(),
                    layout.shard_shape(i)
                )));
            }
            let prefix = format!("{name}{}", checkpoint::SLOT_INFIX);
            let as_blob = |t: &TensorBytes| {
                t.to_f32()
                    .map(|v| f32_blob(&v))
                    .map_err(|e| unfit(e.to_string()))
            };
            let mut slots = Vec::new();
            let mut blobs = vec![as_blob(values)?];
            let tensors = ckpt
                .shards
                .get(ps as usize)
                .map(|s| &s.tensors)
                .ok_or_else(|| unfit(format!("no shard file for ps {ps}")))?;
            for (key, t) in tensors {
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
            restores.push((msg, blobs));
        }
    }
    Ok(restores)
}

/// The newest checkpoint under `root` that verifies (CKPT-1) and was taken at `cut` (its
/// ledger's next closure id), if any; every newer one it skipped is logged with the reason.
/// Read only: it lists and reads, and removes nothing (a `.tmp-` directory may be a save in
/// progress). Blocking file IO: run it off the actor's thread.
pub(crate) fn load_at_cut(root: &Path, cut: u64) -> Result<Option<Checkpoint>, String> {
    let entries = checkpoint::list_checkpoints(root).map_err(|e| e.to_string())?;
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
