//! The invariants the membership simulator checks after every event:
//! - `EPOCH`: a process's latest generation only moves forward (a first forming that failed is
//!   forgotten, 1 back to 0, and nothing else goes back);
//! - `STEP`: every step a process applies follows its last state (one more step, from its
//!   model), so each step is applied once and none skipped; a state installed by agreement
//!   is one some process held;
//! - `SPLIT`: no two groups train apart: where two groups applied different updates to the
//!   same model, the two branches are never trained on at the same time (see
//!   `Checks::extend`);
//! - `MIX`: every member applying a step in a group of a generation applied the same update, with
//!   as many members (no member mixes two groups);
//! - `DIGEST`: every process that finishes holds the same model.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cohort_transport::NodeId;

use super::MembershipViolation;
use crate::collective::{MemberMachine, INITIAL_DIGEST};

#[derive(Debug, Default)]
pub(super) struct Checks {
    /// Each running process's (life, latest generation, steps, digest).
    procs: BTreeMap<usize, Proc>,
    /// Each model's parent (the model one step before).
    parent: BTreeMap<u64, u64>,
    /// Each model's children, with when each first appeared.
    children: BTreeMap<u64, BTreeMap<u64, Duration>>,
    /// Each branch (a model whose parent has two children or more): when steps were first
    /// and last applied on top of it.
    trained: BTreeMap<u64, (Duration, Duration)>,
    /// The branches no running process holds a model of any more: the next training on one
    /// is the job started again from its start (every holder gone, no checkpoint), which
    /// makes the same models again, not the old branch trained on ([`Checks::extend`]).
    gone: BTreeSet<u64>,
    /// The update applied to each model (parent) in each group (generation, members): its step
    /// and the model it made.
    updates: BTreeMap<(u64, u64, Vec<NodeId>), (u64, u64)>,
    finished: Option<(usize, u64, u64)>,
    violation: Option<MembershipViolation>,
}

#[derive(Debug, Clone, Copy)]
struct Proc {
    life: u64,
    generation: u64,
    step: u64,
    digest: u64,
}

impl Checks {
    pub(super) fn take_violation(&mut self) -> Option<MembershipViolation> {
        self.violation.take()
    }

    fn violate(&mut self, invariant: &'static str, detail: String, at: Duration) {
        self.violation.get_or_insert(MembershipViolation {
            invariant,
            detail,
            at,
        });
    }

    pub(super) fn started(&mut self, worker: usize, life: u64) {
        self.procs.insert(
            worker,
            Proc {
                life,
                generation: 0,
                step: 0,
                digest: INITIAL_DIGEST,
            },
        );
    }

    pub(super) fn stopped(&mut self, worker: usize) {
        self.procs.remove(&worker);
        self.bury_branches_without_holders();
    }

    /// Marks as gone every branch that no running process holds a model of (its own or one
    /// grown from it).
    fn bury_branches_without_holders(&mut self) {
        let held: BTreeSet<u64> = self
            .procs
            .values()
            .flat_map(|p| self.lineage(p.digest))
            .collect();
        let buried: Vec<u64> = (self.trained.keys())
            .filter(|b| !held.contains(b) && !self.gone.contains(b))
            .copied()
            .collect();
        self.gone.extend(buried);
    }

    /// `digest` and every model it grew from.
    fn lineage(&self, digest: u64) -> Vec<u64> {
        let mut models = vec![digest];
        let mut d = digest;
        while let Some(&up) = self.parent.get(&d) {
            if models.contains(&up) {
                break;
            }
            models.push(up);
            d = up;
        }
        models
    }

    /// After each event of `worker`'s process `life`.
    pub(super) fn observe(&mut self, worker: usize, life: u64, m: &MemberMachine, at: Duration) {
        let Some(p) = self.procs.get_mut(&worker).filter(|p| p.life == life) else {
            return;
        };
        let generation = m.generation();
        let before = p.generation;
        p.generation = generation;
        if generation < before && !(before == 1 && generation == 0) {
            self.violate(
                "EPOCH",
                format!("worker/{worker} went back from generation {before} to {generation}"),
                at,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn applied(
        &mut self,
        worker: usize,
        life: u64,
        generation: u64,
        members: Vec<NodeId>,
        step: u64,
        parent: u64,
        digest: u64,
        at: Duration,
    ) {
        let Some(p) = self.procs.get_mut(&worker).filter(|p| p.life == life) else {
            return;
        };
        let (last_step, last_digest) = (p.step, p.digest);
        p.step = step;
        p.digest = digest;
        if step != last_step + 1 || parent != last_digest {
            self.violate(
                "STEP",
                format!(
                    "worker/{worker} applied step {step} in generation {generation} over its state of step \
                     {last_step} (model {last_digest:x}, the update's parent {parent:x})"
                ),
                at,
            );
            return;
        }
        let group = (parent, generation, members);
        match self.updates.get(&group) {
            Some(&(s, d)) if s == step && d != digest => self.violate(
                "MIX",
                format!(
                    "worker/{worker} applied step {step} in generation {generation} with {:?} as \
                     {digest:x}, another member as {d:x}",
                    group.2
                ),
                at,
            ),
            _ => {
                self.updates.insert(group, (step, digest));
            }
        }
        self.extend(worker, step, parent, digest, at);
    }

    /// The model `digest` of `step` grew from `parent`. Where a model has two children (two
    /// groups applied different updates to it), each child is a branch; training on a branch
    /// (applying a step on top of any model of it) is recorded as an interval of time. Two
    /// branches of one model trained on in overlapping intervals are two groups training
    /// apart. A branch that is never trained on (a member that applied the step in flight
    /// after the others re-formed without it, from messages it held) is no group; nor are
    /// branches trained one after the other (the job started again once every holder of the
    /// old one was gone: its branches are [`Checks::gone`], and training on one again begins
    /// its interval anew).
    fn extend(&mut self, worker: usize, step: u64, parent: u64, digest: u64, at: Duration) {
        let mut d = parent;
        let mut seen = BTreeSet::new();
        while let Some(&up) = self.parent.get(&d) {
            if !seen.insert(d) {
                break;
            }
            let siblings = self.children.get(&up).map_or(0, BTreeMap::len);
            if siblings > 1 {
                let span = self.trained.entry(d).or_insert((at, at));
                if self.gone.remove(&d) {
                    // Every holder of this branch was gone: the job started again and made
                    // the same models anew (found by a sweep of up to 4 workers and 20
                    // faults, seed 10065751: the check took the new job for the old branch,
                    // trained on across another that lived and died in between).
                    *span = (at, at);
                }
                span.1 = at;
                let (first, last) = *span;
                let apart = self.children[&up].keys().find(|c| {
                    **c != d
                        && self
                            .trained
                            .get(c)
                            .is_some_and(|&(f, l)| f.max(first) <= l.min(last))
                });
                if let Some(other) = apart {
                    let (f, l) = self.trained[other];
                    self.violate(
                        "SPLIT",
                        format!(
                            "worker/{worker} applied step {step} on a branch of the model trained on \
                             from {first:?}, while another branch of the same model was trained \
                             on from {f:?} to {l:?}: two groups trained apart"
                        ),
                        at,
                    );
                    return;
                }
            }
            d = up;
        }
        self.parent.insert(digest, parent);
        self.children
            .entry(parent)
            .or_default()
            .entry(digest)
            .or_insert(at);
    }

    pub(super) fn adopted(
        &mut self,
        worker: usize,
        life: u64,
        step: u64,
        digest: u64,
        at: Duration,
    ) {
        if digest != INITIAL_DIGEST && !self.parent.contains_key(&digest) {
            self.violate(
                "STEP",
                format!("worker/{worker} installed a model of step {step} no process applied"),
                at,
            );
        }
        if let Some(p) = self.procs.get_mut(&worker).filter(|p| p.life == life) {
            p.step = step;
            p.digest = digest;
        }
        self.bury_branches_without_holders();
    }

    pub(super) fn finished(&mut self, worker: usize, step: u64, digest: u64, at: Duration) {
        match self.finished {
            Some((first, s, d)) if (s, d) != (step, digest) => self.violate(
                "DIGEST",
                format!(
                    "worker/{worker} finished at step {step} with model {digest:x}, worker/{first} \
                     at step {s} with {d:x}"
                ),
                at,
            ),
            Some(_) => {}
            None => self.finished = Some((worker, step, digest)),
        }
        self.procs.remove(&worker);
        self.bury_branches_without_holders();
    }

    /// Checks at the end of the run.
    pub(super) fn at_end(&mut self, _at: Duration) -> Option<MembershipViolation> {
        self.violation.take()
    }
}
