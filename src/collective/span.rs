//! The processes a local group's rounds span: the cross-process stage of
//! `MultiWorkerMirrored`'s collectives.
//!
//! This module owns [`ProcessSpan`]: a [`ProcessGroup`] of one member per process (worker),
//! the tokio runtime that drives it, and where this process's replicas sit among every
//! worker's (their global replica ids). A [`LocalGroup`](super::LocalGroup) made with a span
//! combines its members' values in process first, then hands the combined value to the span,
//! which reduces it across the processes with one group call per round (a list of tensors:
//! one bucketed call), and gives the result back to every local replica. The group's result
//! is bit-identical on every member (DATA-1), so every replica of every worker gets the same
//! bits.
//!
//! The span's calls block the calling thread (a replica's thread, or the thread that creates
//! a variable) until the group's call ends; the group bounds every wait (its operation
//! timeout, the transport's idle timeout for a lost member), so they never hang. The call runs
//! as a task on the span's runtime and is awaited through a channel, so calling from inside
//! another async runtime is no error either.

use std::future::Future;

use candle_core::{DType, Device, Tensor};
use tokio::runtime::Handle;

use super::{CollectiveError, ProcessGroup, Reduction};

/// The processes a local group's rounds span (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProcessSpan {
    group: ProcessGroup,
    runtime: Handle,
    local_replicas: usize,
    bucket_bytes_max: usize,
}

impl ProcessSpan {
    /// A span over `group` (one member per process, each with `local_replicas` replicas),
    /// driven by `runtime`; lists of tensors go in buckets of at most `bucket_bytes_max`.
    pub fn new(
        group: ProcessGroup,
        runtime: Handle,
        local_replicas: usize,
        bucket_bytes_max: usize,
    ) -> Self {
        Self {
            group,
            runtime,
            local_replicas,
            bucket_bytes_max: bucket_bytes_max.max(1),
        }
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The global replica id of this process's first replica (workers in rank order, each
    /// with its local replicas in order).
    pub fn first_replica(&self) -> usize {
        self.group.rank() * self.local_replicas
    }

    /// Replicas in sync across every process.
    pub fn total_replicas(&self) -> usize {
        self.group.size() * self.local_replicas
    }

    /// Sums `tensor` across the processes.
    pub fn sum(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let (group, tensor) = (self.group.clone(), tensor.clone());
        self.block(async move { group.all_reduce(Reduction::Sum, &tensor).await })
    }

    /// Sums each of `tensors` across the processes, fused into buckets.
    pub fn sum_many(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let (group, tensors, bucket) =
            (self.group.clone(), tensors.to_vec(), self.bucket_bytes_max);
        self.block(async move {
            group
                .all_reduce_bucketed(Reduction::Sum, &tensors, bucket)
                .await
        })
    }

    /// The tensor of the process of rank `root`, on every process.
    pub fn broadcast(&self, root: usize, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let (group, tensor) = (self.group.clone(), tensor.clone());
        self.block(async move { group.broadcast(root, &tensor).await })
    }

    /// Every process's `tensor` concatenated along the first dimension, in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let (group, tensor) = (self.group.clone(), tensor.clone());
        self.block(async move { group.all_gather(&tensor).await })
    }

    /// Waits until every process reaches this point.
    pub fn barrier(&self) -> Result<(), CollectiveError> {
        let token = Tensor::zeros(1, DType::U8, &Device::Cpu)
            .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
        self.sum(&token).map(|_| ())
    }

    /// Aborts the process group with this process's application error `message` (see
    /// [`ProcessGroup::abort`]); returns the error the group is broken with.
    pub fn abort(&self, message: &str) -> CollectiveError {
        let (group, message) = (self.group.clone(), message.to_string());
        match self.block(async move { Ok(group.abort(message).await) }) {
            Ok(err) | Err(err) => err,
        }
    }

    /// Runs `call` on the span's runtime and waits for it on this thread.
    pub fn block<T: Send + 'static>(
        &self,
        call: impl Future<Output = Result<T, CollectiveError>> + Send + 'static,
    ) -> Result<T, CollectiveError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = tx.send(call.await);
        });
        // The call is bounded by the group's timeouts; a closed channel means the runtime
        // dropped the task (it is shutting down).
        rx.recv().unwrap_or_else(|_| {
            Err(CollectiveError::Stopped {
                epoch: self.group.epoch(),
            })
        })
    }
}
