//! Which parameter servers and workers the job has, and the coordinator's dials to them: the
//! servers of the job (the cluster spec's, changed as servers join and leave, `reshard`), the
//! workers the cluster spec names, and which of either have a dial under way (one at a time
//! each). The Scheduler's reconnect tick, its reshard and its start consult them.

use std::collections::BTreeSet;

/// The parameter servers of the job, and the dials to them under way.
#[derive(Debug, Default)]
pub(super) struct ServerSet {
    /// Their indexes: the cluster spec's at first, then as servers join and leave.
    indexes: BTreeSet<u32>,
    /// How many servers the cluster spec names (indexes below it need no address).
    spec: u32,
    /// Servers with a dial under way.
    dialling: BTreeSet<u32>,
}

impl ServerSet {
    /// The `count` servers a cluster spec names, indexed from 0.
    pub(super) fn of_spec(count: u32) -> Self {
        Self {
            indexes: (0..count).collect(),
            spec: count,
            dialling: BTreeSet::new(),
        }
    }

    /// The servers of the job now, by index.
    pub(super) fn indexes(&self) -> &BTreeSet<u32> {
        &self.indexes
    }

    /// Whether `ps` is a server of the job now.
    pub(super) fn contains(&self, ps: u32) -> bool {
        self.indexes.contains(&ps)
    }

    /// Whether the cluster spec names server `ps`.
    pub(super) fn is_spec_server(&self, ps: u32) -> bool {
        ps < self.spec
    }

    /// Whether the job was given a cluster spec with servers (a machine given none learns its
    /// servers from their hellos).
    pub(super) fn has_spec(&self) -> bool {
        self.spec > 0
    }

    /// Server `ps` joins the job.
    pub(super) fn join(&mut self, ps: u32) {
        self.indexes.insert(ps);
    }

    /// Server `ps` leaves the job.
    pub(super) fn leave(&mut self, ps: u32) {
        self.indexes.remove(&ps);
    }

    /// The servers of the job to dial now: those `wanted` says need a dial and that have none
    /// under way, each counted as dialled from now on.
    pub(super) fn dials_due(&mut self, wanted: impl Fn(u32) -> bool) -> Vec<u32> {
        let due: Vec<u32> = self
            .indexes
            .iter()
            .copied()
            .filter(|&ps| wanted(ps) && !self.dialling.contains(&ps))
            .collect();
        self.dialling.extend(&due);
        due
    }

    /// The dial to `ps` ended (whatever it got).
    pub(super) fn dial_ended(&mut self, ps: u32) {
        self.dialling.remove(&ps);
    }
}

/// The workers the cluster spec names, and the dials to workers under way.
#[derive(Debug, Default)]
pub(super) struct WorkerSet {
    /// Workers in the cluster spec, indexed from 0.
    spec: u32,
    /// Workers with a dial (or the setup that follows it) under way.
    dialling: BTreeSet<u32>,
}

impl WorkerSet {
    /// The `count` workers a cluster spec names, indexed from 0.
    pub(super) fn of_spec(count: u32) -> Self {
        Self {
            spec: count,
            dialling: BTreeSet::new(),
        }
    }

    /// How many workers the cluster spec names.
    pub(super) fn spec(&self) -> u32 {
        self.spec
    }

    /// Whether the cluster spec names `worker`.
    pub(super) fn is_spec_worker(&self, worker: u32) -> bool {
        worker < self.spec
    }

    /// Counts a dial to `worker` as under way; `false` if one already was.
    pub(super) fn start_dial(&mut self, worker: u32) -> bool {
        self.dialling.insert(worker)
    }

    /// Whether a dial to `worker` (or its setup) is under way.
    pub(super) fn is_dialling(&self, worker: u32) -> bool {
        self.dialling.contains(&worker)
    }

    /// The dial to `worker` (or its setup) ended.
    pub(super) fn dial_ended(&mut self, worker: u32) {
        self.dialling.remove(&worker);
    }

    /// The workers with a dial under way, by index.
    pub(super) fn dialling(&self) -> impl Iterator<Item = u32> + '_ {
        self.dialling.iter().copied()
    }
}
