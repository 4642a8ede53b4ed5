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
    /// LEDGER-1: every scheduled closure is committed, pending, or ended with an error. Counts
    /// whose sum overflows (a corrupt checkpoint's) do not balance.
    pub fn balances(&self) -> bool {
        [self.failed, self.cancelled, self.unavailable, self.pending]
            .into_iter()
            .try_fold(self.committed, u64::checked_add)
            == Some(self.scheduled)
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    #[test]
    fn counts_balance_only_when_they_sum_to_the_scheduled_closures() {
        let mut ledger = Ledger {
            scheduled: 10,
            committed: 6,
            failed: 1,
            cancelled: 1,
            unavailable: 1,
            pending: 1,
            ..Ledger::default()
        };
        assert!(ledger.balances());
        ledger.pending = 0;
        assert!(!ledger.balances());
    }

    #[test]
    fn counts_whose_sum_overflows_do_not_balance() {
        // A corrupt checkpoint's counts: their sum wraps to the scheduled count.
        let ledger = Ledger {
            scheduled: 0,
            committed: u64::MAX,
            failed: 1,
            ..Ledger::default()
        };
        assert!(!ledger.balances());
    }
}
