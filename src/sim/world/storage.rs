//! The simulated checkpoint storage: checkpoints encoded with the real encoder into an
//! in-memory map of file name to bytes, where the scenario's storage faults act on those bytes
//! (a torn write, a flipped bit, a full disk, a crash before or after publish, rot after the
//! cut), and every read goes through the real verifying decoder (CKPT-1: what verifies is what
//! was saved). It also keeps the harness's records of what each save holds (PS-1, DATA-1, the
//! end-to-end replay).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::super::{Fault, Node, StorageFault};
use super::job::{variable, WIDTH};
use super::server::Histories;
use super::{Event, World};
use crate::checkpoint::{
    checkpoint_dir_name, decode_checkpoint, encode_checkpoint_at, Checkpoint, LoadError,
};
use crate::roles::coordinator::executor::{Reply, RestoreStep, Route};
use crate::roles::coordinator::{
    CheckpointRef, ClosureId, CutReading, CutTicket, CutWriteError, ShardRead,
};

/// A checkpoint being written: the cut read (in restore `generation`), and the harness's
/// records of it taken when it was read.
pub(super) struct PendingWrite {
    pub(super) checkpoint: Checkpoint,
    pub(super) generation: u64,
    pub(super) history: Histories,
    pub(super) committed: BTreeSet<u64>,
    pub(super) scheduled: u64,
    pub(super) batches: u64,
}

/// A server's answer to a shard read for a save, and the closures whose effect its state held
/// then (the harness's record, PS-1).
#[derive(Debug, Clone)]
pub(super) struct PsSnapshot {
    pub(super) read: ShardRead,
    /// The variable the shard is of.
    pub(super) shard: String,
    /// The shard's rows, each with the closures whose effect it held.
    pub(super) rows: Vec<(usize, Vec<u64>)>,
}

/// A checkpoint in the simulated storage: its files as the real encoder wrote them (and the
/// save's storage fault left them), and what the harness knows of the save.
pub(super) struct Stored {
    /// File name → bytes: every shard and the manifest ([`encode_checkpoint_at`]).
    pub(super) files: BTreeMap<String, Vec<u8>>,
    /// The checkpoint as saved: a restore that reads this one must load exactly it (CKPT-1).
    pub(super) saved: Checkpoint,
    /// Per row of every variable, the closures whose effect its saved state holds (PS-1 and
    /// the replay after a restore).
    pub(super) history: Histories,
    /// Per worker, its dataset's position (DATA-1).
    pub(super) positions: BTreeMap<u32, u64>,
    /// The closures committed at the cut (the end-to-end check after a chief restart).
    pub(super) committed: BTreeSet<u64>,
    /// A parameter server's preemption cut: only the recovery's loader reads it (it lives
    /// apart from the program's checkpoints, which a new chief starts from).
    pub(super) preemption: bool,
    /// The chief program's progress: closures scheduled and batches run.
    pub(super) scheduled: u64,
    pub(super) batches: u64,
}

/// Snapshots taken and not yet saved, by id (each server's reply to `Snapshot`).
pub(super) type Snapshots = Vec<PsSnapshot>;

impl World<'_> {
    /// Per row of every variable, the closures whose effect it held when read `ticket` read
    /// its shard; the harness's records of that read (and of older ones, given up) are
    /// dropped. `None`, a violation, if a row was not read.
    pub(super) fn take_read(&mut self, ticket: CutTicket) -> Option<Histories> {
        let read: Vec<usize> = self
            .chief
            .read
            .iter()
            .filter(|((t, _, _), _)| *t == ticket)
            .map(|(_, (_, id))| *id)
            .collect();
        self.chief.read.retain(|(t, _, _), _| *t > ticket);
        let mut history = Histories::new();
        for id in read {
            let snapshot = &self.snapshots[id];
            for (row, held) in &snapshot.rows {
                history.insert((snapshot.shard.clone(), *row), held.clone());
            }
        }
        let complete = (0..self.config.num_ps)
            .all(|v| (0..WIDTH).all(|row| history.contains_key(&(variable(v), row))));
        if !complete {
            self.violate(
                "CKPT-1",
                "a cut was read without reading every shard".into(),
            );
            return None;
        }
        Some(history)
    }

    /// The coordinator read a parameter server's preemption cut: write it as the real shell
    /// does (the real encoder, into the simulated storage, read back), apart from the program's
    /// checkpoints; the coordinator hears that it is durable after a write's time.
    pub(super) fn write_preemption_cut(
        &mut self,
        ticket: CutTicket,
        root: std::path::PathBuf,
        reading: CutReading,
    ) {
        let Some(history) = self.take_read(ticket) else {
            return;
        };
        let result = reading
            .into_checkpoint()
            .map_err(CutWriteError::from)
            .and_then(|mut checkpoint| {
                // The simulated storage names a checkpoint by its index.
                checkpoint.step = self.storage.len() as u64;
                let stored = self.storage.len();
                let positions = checkpoint.dataset_positions.clone();
                let encoded = encode_checkpoint_at(&checkpoint, self.now.as_millis() as u64)
                    .map_err(|source| CutWriteError::Save { root, source })?;
                self.storage.push(Stored {
                    files: encoded.into_iter().collect(),
                    saved: checkpoint,
                    history,
                    positions,
                    committed: self.committed_ids(),
                    scheduled: self.chief.scheduled,
                    batches: self.chief.batches,
                    preemption: true,
                });
                self.read_stored(stored)
                    .map(|_| ())
                    .ok_or(CutWriteError::Unverified)
            });
        self.cut_writes
            .insert((self.chief_incarnation, ticket.0), result);
        let event = Event::PreemptionCutWritten {
            chief: self.chief_incarnation,
            ticket: ticket.0,
        };
        self.at(self.now + LOAD_DELAY, event);
    }

    /// Saves a checkpoint at `cut` as the real save does: builds it from the servers'
    /// snapshots, the workers' positions and the coordinator's ledger, encodes it with the
    /// real encoder into the simulated storage (where the scenario's storage fault for this
    /// save, if any, acts on its bytes), and reads it back: only one that verifies, with the
    /// contents saved, becomes the cut (as `CheckpointManager::save` and
    /// `ClusterCoordinator::save_checkpoint` do). One that does not leaves the previous cut in
    /// place, so that a recovery restores the previous valid checkpoint and runs again
    /// everything committed since; its files stay in storage (as if the chief had crashed
    /// before removing them), and every restore must skip them.
    pub(super) fn save(&mut self, write: PendingWrite) {
        let PendingWrite {
            checkpoint,
            generation,
            history,
            committed,
            scheduled,
            batches,
        } = write;
        let cut = checkpoint.ledger.next_closure_id;
        let positions = checkpoint.dataset_positions.clone();
        let index = self.chief.saves;
        self.chief.saves += 1;
        let fault = self.scenario.faults.iter().find_map(|f| match f {
            Fault::Storage { save, fault } if *save == index => Some(*fault),
            _ => None,
        });
        let stored = self.storage.len();
        let created_ms = self.now.as_millis() as u64;
        let encoded = match encode_checkpoint_at(&checkpoint, created_ms) {
            Ok(encoded) => encoded,
            Err(e) => {
                self.violate(
                    "CKPT-1",
                    format!("the save at cut {cut} cannot encode: {e}"),
                );
                return;
            }
        };
        let mut files: BTreeMap<String, Vec<u8>> = encoded.into_iter().collect();
        match fault {
            // The write fails before the manifest is published: nothing is stored, and the
            // job goes on from the previous cut (the program tells the coordinator).
            Some(StorageFault::FullDisk) => {
                self.coord
                    .handle_cut_abandoned(ClosureId(cut), "no space left on device");
                return;
            }
            // The chief dies while it writes: nothing is published.
            Some(StorageFault::CrashBeforePublish) => {
                self.kill(Node::Chief);
                return;
            }
            Some(StorageFault::Torn) => tear(&mut self.rng, &mut files),
            Some(StorageFault::BitFlip) => flip_bit(&mut self.rng, &mut files),
            Some(StorageFault::CrashAfterPublish | StorageFault::RotAfterCut) | None => {}
        }
        self.storage.push(Stored {
            files,
            saved: checkpoint,
            history,
            positions,
            committed,
            scheduled,
            batches,
            preemption: false,
        });
        if fault == Some(StorageFault::CrashAfterPublish) {
            // The chief dies once the checkpoint is durable, before it becomes the cut: the
            // next incarnation restores from it.
            self.kill(Node::Chief);
            return;
        }
        if self.read_stored(stored).is_none() {
            // It does not verify: the job goes on from the previous cut.
            self.coord
                .handle_cut_abandoned(ClosureId(cut), "it does not read back whole");
            return;
        }
        let root = std::path::PathBuf::from("sim-checkpoints");
        // As the real shell: refused if a restore began since the servers were read.
        let marked = self
            .coord
            .handle_mark_cut(ClosureId(cut), root, Some(generation))
            .is_ok();
        if marked && fault == Some(StorageFault::RotAfterCut) {
            // It verified and is the cut now; then a bit of one of its files flips on disk.
            flip_bit(&mut self.rng, &mut self.storage[stored].files);
        }
    }

    /// Reads stored checkpoint `stored` with the real decoder: `None` if it does not verify
    /// (a restore skips it). One that verifies must hold exactly what was saved (CKPT-1).
    pub(super) fn read_stored(&mut self, stored: usize) -> Option<Arc<Checkpoint>> {
        let s = self.storage.get(stored)?;
        let label = checkpoint_dir_name(stored as u64);
        let read = |name: &str, _read_max: u64| {
            s.files
                .get(name)
                .cloned()
                .ok_or_else(|| LoadError::Missing {
                    file: format!("{label}/{name}"),
                    source: std::io::ErrorKind::NotFound.into(),
                })
        };
        let loaded = decode_checkpoint(&label, read).ok()?.checkpoint;
        if loaded != s.saved {
            let detail = format!("{label} verifies but does not hold what was saved");
            self.violate("CKPT-1", detail);
            return None;
        }
        Some(Arc::new(loaded))
    }

    /// The newest checkpoint taken at `cut` (its ledger's next closure id) that verifies
    /// (CKPT-1), as the recovery's loader reads it: corrupt ones are skipped.
    pub(super) fn load(&mut self, generation: u64, cut: u64) {
        let mut found = None;
        for stored in (0..self.storage.len()).rev() {
            match self.read_stored(stored) {
                Some(checkpoint) if checkpoint.ledger.next_closure_id == cut => {
                    found = Some(CheckpointRef(checkpoint));
                    break;
                }
                _ => {}
            }
        }
        self.unreadable_cuts += u64::from(found.is_none());
        let route = Route::Restore {
            generation,
            step: RestoreStep::Load,
        };
        self.hand_to_machine(route, Ok(Reply::Loaded(Ok(found))));
    }
}

/// A torn write: one of `files` (drawn) cut short at a drawn length.
fn tear(rng: &mut ChaCha8Rng, files: &mut BTreeMap<String, Vec<u8>>) {
    let file = rng.gen_range(0..files.len());
    if let Some(bytes) = files.values_mut().nth(file) {
        let keep = rng.gen_range(0..bytes.len().max(1));
        bytes.truncate(keep);
    }
}

/// A flipped bit: one drawn bit of one of `files` (drawn), if that file is not empty.
fn flip_bit(rng: &mut ChaCha8Rng, files: &mut BTreeMap<String, Vec<u8>>) {
    let file = rng.gen_range(0..files.len());
    if let Some(bytes) = files.values_mut().nth(file) {
        if !bytes.is_empty() {
            let bit = rng.gen_range(0..bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
    }
}

/// Reading a checkpoint from the simulated storage.
pub(super) const LOAD_DELAY: Duration = Duration::from_millis(20);
