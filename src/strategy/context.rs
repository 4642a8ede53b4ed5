//! Replica and cross-replica contexts: what code inside `run` knows about its replica.
//!
//! The calling thread's replica itself is kept by [`crate::collective`] (a variable reads it
//! too); this module presents it as TensorFlow's `ReplicaContext`.

use std::sync::Arc;

use candle_core::Tensor;

use super::{DeviceSpec, ReduceOp, StrategyError, StrategyId};
use crate::collective::{
    current_replica, in_replica, with_current_replica, CurrentReplica, LocalMember,
};

/// The context of one replica inside [`StrategyExt::run`](super::StrategyExt::run)
/// (TensorFlow's `tf.distribute.ReplicaContext`).
///
/// It is passed to the replica function and is also reachable with [`get_replica_context`] on
/// the replica's thread while the function runs.
#[derive(Debug, Clone)]
pub struct ReplicaContext {
    replica: CurrentReplica,
}

impl ReplicaContext {
    pub(crate) fn new(
        device: DeviceSpec,
        strategy_id: StrategyId,
        member: Arc<LocalMember>,
    ) -> Self {
        Self {
            replica: CurrentReplica::new(device, strategy_id, member),
        }
    }

    /// This replica's index, `0..num_replicas_in_sync`.
    pub fn replica_id_in_sync_group(&self) -> usize {
        self.replica.replica_id_in_sync_group()
    }

    /// Number of replicas taking part in this step (in every worker, for a multi-worker
    /// strategy).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.replica.num_replicas_in_sync()
    }

    /// This replica's index among this process's replicas, `0..` the local replica count:
    /// the copy of a mirrored variable it holds. Equal to
    /// [`ReplicaContext::replica_id_in_sync_group`] in a single-process strategy.
    pub fn local_replica_id(&self) -> usize {
        self.replica.local_replica()
    }

    /// The device this replica runs on.
    pub fn device(&self) -> DeviceSpec {
        self.replica.device()
    }

    /// The strategy running this replica.
    pub fn strategy_id(&self) -> StrategyId {
        self.replica.strategy_id()
    }

    /// Reduces `value` across every replica of this step; each replica gets the result.
    ///
    /// Every replica must call it (in the same order as its other collectives); a replica that
    /// finishes its function without calling it makes the others fail at once, and a replica
    /// that never arrives makes them fail after the strategy's collective timeout.
    pub fn all_reduce(&self, op: ReduceOp, value: &Tensor) -> Result<Tensor, StrategyError> {
        Ok(self.replica.member().all_reduce(op, value)?)
    }

    /// Reduces each of `values` across every replica in one collective (TensorFlow's
    /// `all_reduce` of a nested structure): every replica must pass the same number of
    /// tensors, position by position of one shape and dtype. Across workers the list goes as
    /// buckets of fused tensors (a few large calls, not one per tensor).
    pub fn all_reduce_many(
        &self,
        op: ReduceOp,
        values: &[Tensor],
    ) -> Result<Vec<Tensor>, StrategyError> {
        Ok(self.replica.member().all_reduce_many(op, values)?)
    }

    /// Waits until every replica of this step reaches this point.
    pub fn barrier(&self) -> Result<(), StrategyError> {
        Ok(self.replica.member().barrier()?)
    }

    /// Tells every replica of this step that this replica's step failed with `message` (an
    /// application error): under a multi-worker strategy every other worker's pending and
    /// later collectives fail at once with
    /// [`CollectiveError::Application`](crate::collective::CollectiveError::Application)
    /// naming this worker and `message`.
    /// [`StrategyExt::try_run`](super::StrategyExt::try_run) calls it for a replica function
    /// that returns an error, and a panicking replica calls it too.
    pub fn abort_step(&self, message: &str) {
        self.replica.member().abort_step(message);
    }

    /// Marks this replica done with its step's collectives.
    pub(crate) fn leave(&self) {
        self.replica.member().leave();
    }
}

/// What [`StrategyExt::experimental_distribute_values_from_function`](super::StrategyExt::experimental_distribute_values_from_function)
/// passes to the value function (TensorFlow's `tf.distribute.experimental.ValueContext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueContext {
    /// The replica the value is for.
    pub replica_id_in_sync_group: usize,
    /// Number of replicas in sync.
    pub num_replicas_in_sync: usize,
}

/// The replica context of the calling thread: `Some` inside a replica function run by a
/// strategy, `None` in cross-replica context (anywhere else).
pub fn get_replica_context() -> Option<ReplicaContext> {
    current_replica().map(|replica| ReplicaContext { replica })
}

/// Whether the calling thread is in cross-replica context (not inside a replica function).
pub fn in_cross_replica_context() -> bool {
    !in_replica()
}

/// Runs `f` with `ctx` as the calling thread's replica context, restoring the previous one after,
/// even if `f` panics.
pub(crate) fn with_replica_context<R>(ctx: &ReplicaContext, f: impl FnOnce() -> R) -> R {
    with_current_replica(&ctx.replica, f)
}
