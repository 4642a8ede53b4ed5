//! The invariants: LEDGER-1 after every event, PS-1 across chief restarts as ids are given
//! out, DATA-1 at a worker's first read after a setup, and the end-to-end check when the job
//! finishes (every row holds exactly the committed closures, equal to a fault-free replay).
//! The checks made where a fault would act (PS-1 as a push applies, CKPT-1 as a checkpoint is
//! read, FENCE-1 as a result commits) stay with the code they watch.

use std::collections::{BTreeMap, BTreeSet};

use super::job::{gradient, initial, new_store, variable, WIDTH};
use super::World;
use crate::optim::Slots;
use crate::roles::coordinator::ClosureId;
use crate::roles::ps::{Gradient, ParameterStore, PushOrigin, PushOutcome};

impl World<'_> {
    /// The closures committed: those the live chief incarnation committed, and those
    /// committed before the checkpoint it resumed from (the ones its predecessors committed
    /// after that checkpoint were rolled back with the servers, and ran again as new ones).
    pub(super) fn committed_ids(&self) -> BTreeSet<u64> {
        let mut committed = self.committed_before.clone();
        committed.extend((0..self.coord.next_closure_id()).filter(|id| {
            matches!(
                self.coord.state(ClosureId(*id)),
                Some(crate::roles::coordinator::ClosureState::Committed(_))
            )
        }));
        committed
    }

    pub(super) fn check(&mut self) {
        let ledger = self.coord.ledger().clone();
        if !ledger.balances() {
            self.violate(
                "LEDGER-1",
                format!("the ledger does not balance: {ledger:?}"),
            );
        }
    }

    /// Every row of every variable holds the effect of exactly the committed closures, and
    /// its value and slots equal a fault-free replay of them in the order its server (or the
    /// servers it moved from) applied them.
    pub(super) fn check_end_to_end(&mut self) {
        let committed = self.committed_ids();
        let ledger = self.coord.ledger().clone();
        if ledger.committed != self.config.closures || committed.len() as u64 != ledger.committed {
            self.violate(
                "END-TO-END",
                format!(
                    "{} closures committed of {} scheduled ({ledger:?})",
                    committed.len(),
                    self.config.closures
                ),
            );
            return;
        }
        let mut replays: BTreeMap<(String, Vec<u64>), ParameterStore> = BTreeMap::new();
        for layout in self.coord.layouts() {
            let name = layout.name.clone();
            let Some(v) = (0..self.config.num_ps).find(|v| variable(*v) == name) else {
                self.violate("END-TO-END", format!("unknown variable {name}"));
                return;
            };
            for shard in &layout.shards {
                let p = &self.servers[shard.ps as usize];
                let Ok(live) = p.store.variable(&name) else {
                    let detail = format!("ps/{} lost its shard of {name}", shard.ps);
                    self.violate("END-TO-END", detail);
                    return;
                };
                for row in shard.rows.clone() {
                    let held = p.history.get(&(name.clone(), row)).cloned();
                    let held = held.unwrap_or_default();
                    let effective: BTreeSet<u64> = held.iter().copied().collect();
                    if effective != committed || effective.len() != held.len() {
                        let missing: Vec<_> = committed.difference(&effective).take(5).collect();
                        let extra: Vec<_> = effective.difference(&committed).take(5).collect();
                        let detail = format!(
                            "row {row} of {name} on ps/{} holds the effect of {} closures ({} \
                             distinct) for {} committed; missing {missing:?}, not committed \
                             {extra:?}",
                            shard.ps,
                            held.len(),
                            effective.len(),
                            committed.len()
                        );
                        self.violate("END-TO-END", detail);
                        return;
                    }
                    let replay = replays
                        .entry((name.clone(), held.clone()))
                        .or_insert_with(|| replay_variable(v, &held));
                    let Ok(expected) = replay.variable(&name) else {
                        self.violate("END-TO-END", format!("the replay of {name} failed"));
                        return;
                    };
                    let at = row - shard.rows.start;
                    let slot_rows = |slots: &Slots, i: usize| -> Vec<u32> {
                        slots.iter().map(|(_, buf)| buf[i].to_bits()).collect()
                    };
                    let same = live.values()[at].to_bits() == expected.values()[row].to_bits()
                        && slot_rows(live.slots(), at) == slot_rows(expected.slots(), row)
                        && live.steps() == expected.steps();
                    if !same {
                        let detail = format!(
                            "row {row} of {name} on ps/{} differs from a fault-free replay of its \
                             {} closures: {} (steps {}) against {} (steps {})",
                            shard.ps,
                            held.len(),
                            live.values()[at],
                            live.steps(),
                            expected.values()[row],
                            expected.steps()
                        );
                        self.violate("END-TO-END", detail);
                        return;
                    }
                }
            }
        }
    }

    /// DATA-1: worker `w`'s first read since its setup or rewind, in a closure dispatched in
    /// restore generation `generation`, is at `read`.
    pub(super) fn check_first_read(&mut self, w: u32, read: u64, generation: u64) {
        let restore = self.restored_from.range(..=generation).next_back();
        // Drained since the newest restore (a restore clears what a drain kept): where it
        // was drained.
        let kept = self.workers[w as usize].kept;
        let expected = kept
            .or_else(|| {
                restore.and_then(|(_, stored)| {
                    stored.and_then(|stored| self.storage[stored].positions.get(&w).copied())
                })
            })
            .unwrap_or(0);
        if read != expected {
            let detail = format!(
                "worker/{w} read element {read} first after its setup in generation \
                 {generation}, where the restored checkpoint (or its drain, since) puts it at \
                 {expected}"
            );
            self.violate("DATA-1", detail);
        }
    }

    /// PS-1 across chief restarts: a closure id the live chief incarnation gives out for the
    /// first time must not be one whose effect a server holds.
    pub(super) fn check_fresh_id(&mut self, closure: u64) {
        if let Some(ps) = self
            .servers
            .iter()
            .position(|p| p.effective_set.contains(&closure))
        {
            let detail = format!(
                "chief incarnation {} gave out closure id {closure}, whose effect ps/{ps} holds",
                self.chief_incarnation
            );
            self.violate("PS-1", detail);
        }
    }
}

/// Variable `v` (all of it) after applying `closures` once each, in order, from its initial
/// value: what a fault-free server would hold.
fn replay_variable(v: u32, closures: &[u64]) -> ParameterStore {
    let mut replay = new_store();
    replay
        .handle_create(&variable(v), vec![WIDTH], initial(v))
        .expect("a fresh store takes a new variable");
    for closure in closures {
        let origin = PushOrigin {
            worker: 0,
            incarnation: 1,
            closure: ClosureId(*closure),
            attempt: 1,
            part: 0,
            generation: 0,
            learning_rate: None,
            server: 0,
        };
        let grad = [(variable(v), Gradient::Dense(gradient(*closure).into()))];
        let applied = replay.handle_push(origin, &grad);
        debug_assert_eq!(applied, Ok(PushOutcome::Applied));
    }
    replay
}
