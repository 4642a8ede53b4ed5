//! The replica the calling thread runs: set by a strategy around a replica function (and put
//! back after it, even on a panic), read by whoever must know where it runs.

use std::cell::RefCell;
use std::sync::Arc;

use super::LocalMember;
use crate::distribute::{DeviceSpec, StrategyId};

/// One replica of a step: its collective member (rank, group size), its device and the
/// strategy running it.
#[derive(Debug, Clone)]
pub(crate) struct CurrentReplica {
    device: DeviceSpec,
    strategy_id: StrategyId,
    member: Arc<LocalMember>,
}

impl CurrentReplica {
    pub(crate) fn new(
        device: DeviceSpec,
        strategy_id: StrategyId,
        member: Arc<LocalMember>,
    ) -> Self {
        Self {
            device,
            strategy_id,
            member,
        }
    }

    /// This replica's index, `0..num_replicas_in_sync` (across every process of a spanning
    /// group).
    pub(crate) fn replica_id_in_sync_group(&self) -> usize {
        self.member.replica_id()
    }

    /// Number of replicas taking part in this step, in every process.
    pub(crate) fn num_replicas_in_sync(&self) -> usize {
        self.member.num_replicas()
    }

    /// This replica's index among this process's replicas: the component of a mirrored
    /// variable it reads and writes.
    pub(crate) fn local_replica(&self) -> usize {
        self.member.rank()
    }

    /// The device this replica runs on.
    pub(crate) fn device(&self) -> DeviceSpec {
        self.device
    }

    /// The strategy running this replica.
    pub(crate) fn strategy_id(&self) -> StrategyId {
        self.strategy_id
    }

    /// The collective member of this replica.
    pub(crate) fn member(&self) -> &LocalMember {
        &self.member
    }
}

/// The replica of the calling thread: `Some` inside a replica function run by a strategy,
/// `None` anywhere else (cross-replica context).
pub(crate) fn current_replica() -> Option<CurrentReplica> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Whether the calling thread runs a replica function.
pub(crate) fn in_replica() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// Runs `f` with `replica` as the calling thread's replica, restoring the previous one after,
/// even if `f` panics.
pub(crate) fn with_current_replica<R>(replica: &CurrentReplica, f: impl FnOnce() -> R) -> R {
    with_replica_slot(Some(replica.clone()), f)
}

/// Runs `f` in cross-replica context on the calling thread (no current replica), restoring
/// the replica after, even if `f` panics: for work one replica does for all of them (creating
/// a variable inside `run`).
pub(crate) fn outside_replica<R>(f: impl FnOnce() -> R) -> R {
    with_replica_slot(None, f)
}

fn with_replica_slot<R>(replica: Option<CurrentReplica>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<CurrentReplica>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), replica));
    let _restore = Restore(prev);
    f()
}

thread_local! {
    static CURRENT: RefCell<Option<CurrentReplica>> = const { RefCell::new(None) };
}
