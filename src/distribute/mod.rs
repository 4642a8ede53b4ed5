//! The vocabulary of `tf.distribute` that strategies, variables, collectives and datasets all
//! speak: devices ([`DeviceSpec`]), strategy identities ([`StrategyId`]), values that differ per
//! replica ([`PerReplica`]) and how they combine ([`ReduceOp`], [`divide_by`]).
//!
//! A leaf: it depends on no other module of the crate, so that any of them may use it without
//! a cycle (the strategies in [`crate::strategy`] re-export it under their own path, as
//! TensorFlow's `tf.distribute` does).

mod device;
mod values;

use std::sync::atomic::{AtomicU64, Ordering};

pub use device::{DeviceError, DeviceKind, DeviceSpec};
pub use values::{divide_by, PerReplica, ReduceOp, UnknownReduceOp};

/// A process-unique strategy id; variables remember the strategy that keeps them in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrategyId(pub u64);

impl StrategyId {
    /// A fresh id.
    pub fn next() -> Self {
        StrategyId(NEXT_STRATEGY_ID.fetch_add(1, Ordering::Relaxed))
    }
}

static NEXT_STRATEGY_ID: AtomicU64 = AtomicU64::new(1);
