//! The ledger (LEDGER-1): the coordinator's account of every scheduled closure, one type for
//! the coordinator's machine, its reports and the checkpoint manifest, which stores it whole;
//! and the names it accounts by, which the coordinator, the parameter servers and the workers
//! share: a closure's id and the incarnation of the worker that ran it.
//!
//! A leaf module: it names no other part of cohort.

/// Identifies a scheduled closure for its whole life, across re-dispatches.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
pub struct ClosureId(pub u64);

/// The incarnation of a worker process (FENCE-1): a restarted worker has a larger one.
pub type WorkerIncarnation = u64;

/// The coordinator's account of every scheduled closure (LEDGER-1).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    /// Closures ever scheduled.
    pub scheduled: u64,
    /// Closures that committed a value.
    pub committed: u64,
    /// Closures that failed with their own error.
    pub failed: u64,
    /// Closures cancelled because another failed.
    pub cancelled: u64,
    /// Closures that could not run (no worker within the bound, attempts exhausted).
    pub unavailable: u64,
    /// Re-dispatches after the worker running the closure was lost.
    pub redispatched: u64,
    /// Results rejected because they came from a fenced incarnation or a superseded attempt.
    pub rejected_stale: u64,
    /// Closures queued or in flight now.
    pub pending: u64,
    /// Committed closures queued again because a parameter-server recovery rolled every server
    /// back to a checkpoint taken before they committed (each is committed again later).
    pub rolled_back: u64,
    /// Parameter-server recoveries: every server restored from a checkpoint.
    pub ps_restores: u64,
}

impl Ledger {
    /// LEDGER-1: every scheduled closure is committed, pending, or ended with an error.
    pub fn balances(&self) -> bool {
        self.scheduled
            == self.committed + self.failed + self.cancelled + self.unavailable + self.pending
    }
}
