//! The parameter servers: each one's real machine ([`ParameterStore`], with the real
//! optimizer), the simulator standing in for its actor: it applies pushes (checking PS-1 as it
//! does), answers the coordinator's requests, and restores its shards from a stored checkpoint
//! through the same [`RestoreVariable`] messages the coordinator sends.

use std::collections::{BTreeMap, BTreeSet};

use super::super::Node;
use super::job::new_store;
use super::network::{Msg, Req, Resp};
use super::storage::PsSnapshot;
use super::{ProcState, World};
use crate::optim::{OptimError, Slots};
use crate::roles::coordinator::{shard_restores, ClosureId, ShardRead};
use crate::roles::protocol::{bytes_to_f32, BlobError, LeaveAnswer, RestoreVariable};
use crate::roles::ps::{ParameterStore, PsError, PushOrigin, PushOutcome};

/// A parameter server process: its real machine, and the harness's records of what its
/// state holds.
pub(super) struct PsProc {
    pub(super) incarnation: u64,
    pub(super) state: ProcState,
    pub(super) store: ParameterStore,
    /// The rows of each variable it holds a shard of.
    pub(super) rows: BTreeMap<String, std::ops::Range<usize>>,
    /// Per row it holds, the closures whose effect the row holds, in the order applied
    /// (PS-1, and the end-to-end replay: rows moved from different servers keep their own
    /// orders).
    pub(super) history: Histories,
    /// Every closure id whose effect it holds, to check PS-1 against.
    pub(super) effective_set: BTreeSet<u64>,
    /// Not running and not restarted by its supervisor: not started yet (a server that may
    /// join), or let go for good.
    pub(super) out: bool,
    /// Asked to leave the job for good, and not answered yet.
    pub(super) leaving: bool,
}

impl PsProc {
    /// Server `ps` at the job's start: the spec's first `num_ps` servers run, each holding its
    /// own variable; the others are out until the job is scaled up.
    pub(super) fn new(ps: u32, num_ps: u32) -> Self {
        let mut p = PsProc {
            incarnation: 0,
            state: ProcState::Down,
            store: new_store(),
            rows: BTreeMap::new(),
            history: BTreeMap::new(),
            effective_set: BTreeSet::new(),
            out: true,
            leaving: false,
        };
        if ps < num_ps {
            // The spec's servers start with the job, holding nothing until the chief
            // program creates its variables on them.
            p.incarnation = 1;
            p.store = new_store().with_incarnation(1);
            p.state = ProcState::Up;
            p.out = false;
        }
        p
    }

    /// Creates shard `name` of `shape` here with its initial `values`, as the chief program's
    /// creation asks ([`Req::Create`]); one this server holds already is left as it is (a real
    /// server's creation of a shard it holds with the same shape changes nothing).
    fn create_shard(&mut self, name: &str, shape: &[u64], values: &[u32]) -> Resp {
        if self.rows.contains_key(name) {
            return Resp::Done;
        }
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let values = values.iter().map(|&bits| f32::from_bits(bits)).collect();
        if let Err(e) = self.store.handle_create(name, shape.clone(), values) {
            return Resp::Refused(e.to_string());
        }
        let rows = shape.first().copied().unwrap_or(1);
        for row in 0..rows {
            self.history.insert((name.to_string(), row), Vec::new());
        }
        self.rows.insert(name.to_string(), 0..rows);
        Resp::Done
    }
}

/// Per (variable, row), the closures whose effect the row holds, in the order applied.
pub(super) type Histories = BTreeMap<(String, usize), Vec<u64>>;

impl World<'_> {
    /// A message reaches server `ps`, as its actor takes it.
    pub(super) fn ps_receive(&mut self, ps: u32, msg: Msg) {
        let node = Node::Ps(ps);
        match msg {
            // Let go after its preemption notice: it exits now and is restarted.
            Msg::LeaveAnswer(LeaveAnswer::Go) => self.kill(node),
            // Let go after it asked to leave: it exits 0 and is not restarted.
            Msg::PsDrainAnswer { go: true } if self.servers[ps as usize].leaving => {
                self.end_server(ps)
            }
            Msg::PsDrainAnswer { .. } => self.servers[ps as usize].leaving = false,
            Msg::Push { run, push, blobs } => {
                let PushOrigin {
                    worker,
                    incarnation,
                    ..
                } = push.origin;
                let result = self.apply_push(ps, &push, &blobs);
                self.send(
                    node,
                    Node::Worker(worker),
                    incarnation,
                    Msg::PushReply { ps, run, result },
                );
            }
            Msg::Request {
                call,
                req: Req::Retire,
            } => {
                // It answers, then exits (its supervisor restarts it as a new incarnation).
                let resp = Resp::Done;
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call, resp },
                );
                self.kill(node);
            }
            Msg::Request { call, req } => {
                let resp = self.ps_request(ps, req);
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call, resp },
                );
            }
            _ => {}
        }
    }

    /// Server `ps` applies a push, as its actor does (PS-1: never a closure's effect twice);
    /// `None` when it is not serving or refuses the push.
    fn apply_push(
        &mut self,
        ps: u32,
        push: &crate::roles::protocol::Push,
        blobs: &[bytes::Bytes],
    ) -> Option<PushOutcome> {
        let p = &mut self.servers[ps as usize];
        // The serving gate: an empty (restarted, not restored) server refuses.
        if !p.store.serving() {
            return None;
        }
        let origin = push.origin;
        let gradients = push.decode_gradients(blobs).ok()?;
        let outcome = p.store.handle_push(origin, &gradients).ok()?;
        if outcome == PushOutcome::Applied {
            self.servers_trained = true;
            let closure = origin.closure.0;
            let now_at = (p.incarnation, p.store.generation().0);
            let key = (origin.worker, origin.incarnation, closure, origin.attempt);
            let read = self.reads.get(&key).and_then(|r| r.get(&ps)).copied();
            if read != Some(now_at) {
                let detail = format!(
                    "ps/{ps} (process, restore generation {now_at:?}) applied closure {closure} \
                     (attempt {}, worker/{}) whose step read it at {read:?}",
                    origin.attempt, origin.worker
                );
                self.violate("READ-1", detail);
            }
            let p = &mut self.servers[ps as usize];
            let again = !p.effective_set.insert(closure);
            for (name, _) in &gradients {
                for row in p.rows.get(name).cloned().unwrap_or_default() {
                    p.history
                        .entry((name.clone(), row))
                        .or_default()
                        .push(closure);
                }
            }
            if again {
                let detail = format!(
                    "ps/{ps} applied closure {closure} a second time (attempt {}, worker/{} \
                     incarnation {})",
                    origin.attempt, origin.worker, origin.incarnation
                );
                self.violate("PS-1", detail);
            }
        }
        (outcome != PushOutcome::SkippedNonFinite).then_some(outcome)
    }

    /// Server `ps` answers a coordinator call.
    fn ps_request(&mut self, ps: u32, req: Req) -> Resp {
        let p = &mut self.servers[ps as usize];
        match req {
            Req::Probe => Resp::Probe {
                incarnation: p.incarnation,
                serving: p.store.serving(),
                generation: p.store.generation().0,
                restoring: p.store.restoring_shards(),
                next_free: p.store.next_free_closure_id(),
            },
            Req::Fence {
                worker,
                incarnation,
            } => {
                p.store.handle_fence(worker, incarnation);
                Resp::Done
            }
            Req::Watermark { below, generation } => {
                p.store.handle_finished_below(ClosureId(below), generation);
                // Closure ids below it were given out: a new chief must not give them out again.
                self.servers_trained |= below > 0;
                Resp::Done
            }
            Req::Hello => Resp::Hello {
                incarnation: p.incarnation,
            },
            Req::Begin {
                generation,
                fences,
                afresh,
            } => {
                p.store.handle_begin_restore(generation, &fences, afresh);
                // A restore of a checkpoint's shards that began here may have written some:
                // a new chief without that checkpoint cannot tell, and counts it as trained.
                self.servers_trained |= !afresh;
                Resp::Done
            }
            Req::Shards { stored, layouts } => self.restore_shards(ps, stored, layouts),
            Req::RollBack { below, generation } => {
                p.store.handle_roll_back(ClosureId(below), generation);
                Resp::Done
            }
            Req::Snapshot { shard } => {
                // The serving gate: a server restarted and not restored is not read.
                if !p.store.serving() {
                    return Resp::Unavailable("not serving".into());
                }
                let (state, blobs) = match p.store.snapshot(&shard) {
                    Ok(read) => read,
                    Err(e) => return Resp::Refused(e.to_string()),
                };
                let rows = p
                    .rows
                    .get(&shard)
                    .cloned()
                    .unwrap_or_default()
                    .map(|row| {
                        let held = p.history.get(&(shard.clone(), row)).cloned();
                        (row, held.unwrap_or_default())
                    })
                    .collect();
                let snapshot = PsSnapshot {
                    read: ShardRead { state, blobs },
                    shard,
                    rows,
                };
                self.snapshots.push(snapshot);
                Resp::Snapshot(self.snapshots.len() - 1)
            }
            Req::Create {
                shard,
                shape,
                values,
            } => p.create_shard(&shard, &shape, &values),
            Req::Run { .. }
            | Req::SetUp { .. }
            | Req::Configure { .. }
            | Req::Positions
            | Req::Rewind { .. }
            | Req::Retire => Resp::Refused("not a worker".into()),
        }
    }

    /// Restores server `ps` from stored checkpoint `stored` (as its restore read it): its
    /// shards under layout set `layouts`, with the closures each saved row held.
    fn restore_shards(&mut self, ps: u32, stored: usize, layouts: usize) -> Resp {
        let (Some(checkpoint), Some(saved)) =
            (self.restoring.get(&stored), self.storage.get(stored))
        else {
            return Resp::Refused("no such checkpoint".into());
        };
        let layouts = &self.layout_sets[layouts];
        let restores = match shard_restores(ps, layouts, checkpoint) {
            Ok(restores) => restores,
            Err(e) => return Resp::Refused(e.to_string()),
        };
        // The rows it holds now, each with the closures the saved row held.
        let mut rows = BTreeMap::new();
        let mut history = BTreeMap::new();
        for layout in layouts {
            for shard in layout.shards.iter().filter(|s| s.ps == ps) {
                rows.insert(layout.name.clone(), shard.rows.clone());
                for row in shard.rows.clone() {
                    let key = (layout.name.clone(), row);
                    let held = saved.history.get(&key).cloned().unwrap_or_default();
                    history.insert(key, held);
                }
            }
        }
        let p = &mut self.servers[ps as usize];
        for (msg, blobs) in restores {
            if let Err(e) = restore_variable(&mut p.store, msg, &blobs) {
                return Resp::Refused(e.to_string());
            }
        }
        p.effective_set = history.values().flatten().copied().collect();
        p.rows = rows;
        p.history = history;
        Resp::Done
    }
}

/// Why a simulated server refuses a [`RestoreVariable`] (its answer carries the text, as the
/// real server's does).
#[derive(Debug, thiserror::Error)]
enum RestoreRefusal {
    /// A blob the message names is not there.
    #[error("{what}: blob {index} missing")]
    BlobMissing {
        /// The buffer.
        what: String,
        /// Its index among the blobs.
        index: usize,
    },
    /// A blob is not a whole number of f32 values.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The slots do not fit the optimizer.
    #[error(transparent)]
    Slots(#[from] OptimError),
    /// The store refused the restore.
    #[error(transparent)]
    Store(#[from] PsError),
}

/// Restores one variable into `store` from a [`RestoreVariable`] and its blobs (the values,
/// then its slots), as the parameter server's actor does; `Err` is its refusal.
fn restore_variable(
    store: &mut ParameterStore,
    msg: RestoreVariable,
    blobs: &[bytes::Bytes],
) -> Result<(), RestoreRefusal> {
    let blob = |i: usize, what: &str| {
        let bytes = blobs.get(i).ok_or_else(|| RestoreRefusal::BlobMissing {
            what: what.to_string(),
            index: i,
        })?;
        Ok::<_, RestoreRefusal>(bytes_to_f32(bytes, what)?)
    };
    let values = blob(0, &msg.name)?;
    let mut buffers = Vec::with_capacity(msg.slots.len());
    for (i, slot) in msg.slots.iter().enumerate() {
        buffers.push((slot.clone(), blob(i + 1, &format!("{}/{slot}", msg.name))?));
    }
    let slots = Slots::restore(store.optimizer_for(&msg.name), &msg.name, values.len(), buffers, 0)?;
    let shape = msg.shape.iter().map(|&d| d as usize).collect();
    Ok(store.handle_restore(&msg.name, shape, values, slots, msg.steps)?)
}
