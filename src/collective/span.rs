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
//!
//! With the feature `nccl`, a span made `ProcessSpan::with_nccl` sums f32 and f64 tensors
//! on a GPU of this process with NCCL instead of the group's ring (TensorFlow's
//! `CommunicationImplementation.NCCL`); everything else (broadcasts, gathers, barriers, other
//! dtypes) stays on the group. The span is one membership epoch: its communicator is made at
//! its first NCCL sum, bootstrapped over the group (`NcclComm::new`; every member reaches
//! that sum at the same point of its sequence of calls, as every collective does), and
//! aborted when the group breaks; a re-formed group gets a new span and so a new
//! communicator. An NCCL failure reports the group's error when the group broke (a lost
//! member, which the transport may detect after NCCL did: the span waits for it up to its
//! settle bound); otherwise it aborts the group with NCCL's message, so that every member's
//! call fails alike.

use std::future::Future;
#[cfg(feature = "nccl")]
use std::sync::Arc;
#[cfg(feature = "nccl")]
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use tokio::runtime::Handle;

use super::{CollectiveError, ProcessGroup, Reduction};
#[cfg(feature = "nccl")]
use super::{NcclComm, NcclError};

/// The processes a local group's rounds span (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProcessSpan {
    group: ProcessGroup,
    runtime: Handle,
    local_replicas: usize,
    bucket_bytes_max: usize,
    /// The GPU sums of this epoch, when the span was made [`ProcessSpan::with_nccl`].
    #[cfg(feature = "nccl")]
    nccl: Option<Arc<GpuSums>>,
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
            #[cfg(feature = "nccl")]
            nccl: None,
        }
    }

    /// This span sums f32 and f64 tensors with NCCL on GPU `device` (see the module doc):
    /// `timeout` bounds every NCCL wait (the communicator's init and each all-reduce), and
    /// `settle` how long a failed NCCL call waits for the group to report a lost member
    /// (the transport's detection budget) before it takes the failure for NCCL's own.
    #[cfg(feature = "nccl")]
    pub fn with_nccl(mut self, device: usize, timeout: Duration, settle: Duration) -> Self {
        self.nccl = Some(Arc::new(GpuSums {
            device,
            timeout,
            settle,
            comm: tokio::sync::Mutex::new(None),
        }));
        self
    }

    /// The GPU this span's sums run on, if NCCL does them.
    pub fn nccl_device(&self) -> Option<usize> {
        #[cfg(feature = "nccl")]
        if let Some(gpu) = &self.nccl {
            return Some(gpu.device);
        }
        None
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
        #[cfg(feature = "nccl")]
        if let Some(gpu) = self.gpu_for(std::slice::from_ref(tensor)) {
            let (group, tensors, bucket) = (self.group.clone(), vec![tensor.clone()], 0);
            let mut summed = self.block(async move { gpu.sum(group, tensors, bucket).await })?;
            return summed
                .pop()
                .ok_or_else(|| CollectiveError::Tensor("NCCL returned no tensor".into()));
        }
        let (group, tensor) = (self.group.clone(), tensor.clone());
        self.block(async move { group.all_reduce(Reduction::Sum, &tensor).await })
    }

    /// Sums each of `tensors` across the processes, fused into buckets.
    pub fn sum_many(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let (group, tensors, bucket) =
            (self.group.clone(), tensors.to_vec(), self.bucket_bytes_max);
        #[cfg(feature = "nccl")]
        if let Some(gpu) = self.gpu_for(&tensors) {
            return self.block(async move { gpu.sum(group, tensors, bucket).await });
        }
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

    /// The GPU sums, when NCCL takes `tensors`: the span has them and every tensor is f32 or
    /// f64 (every member passes the same dtypes, so every member decides alike). An empty list
    /// moves nothing and makes no communicator.
    #[cfg(feature = "nccl")]
    fn gpu_for(&self, tensors: &[Tensor]) -> Option<Arc<GpuSums>> {
        let gpu = self.nccl.as_ref()?;
        let floats = !tensors.is_empty()
            && tensors
                .iter()
                .all(|t| matches!(t.dtype(), DType::F32 | DType::F64));
        floats.then(|| gpu.clone())
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

/// One epoch's NCCL sums on one GPU (see the module doc).
#[cfg(feature = "nccl")]
#[derive(Debug)]
struct GpuSums {
    device: usize,
    timeout: Duration,
    settle: Duration,
    /// Made at the first sum; the lock also keeps this process's NCCL calls in one order.
    comm: tokio::sync::Mutex<Option<NcclComm>>,
}

/// How often a failed NCCL call looks whether the group broke.
#[cfg(feature = "nccl")]
const SETTLE_POLL: Duration = Duration::from_millis(20);

#[cfg(feature = "nccl")]
impl GpuSums {
    /// Sums `tensors` (f32/f64, buckets of `bucket_bytes_max`; 0: one bucket per tensor's
    /// bytes) with every member's, making the communicator first if this epoch has none.
    async fn sum(
        &self,
        group: ProcessGroup,
        tensors: Vec<Tensor>,
        bucket_bytes_max: usize,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let mut held = self.comm.lock().await;
        let comm = match &mut *held {
            Some(comm) => comm,
            slot @ None => {
                let made = NcclComm::new(&group, self.device, self.timeout).await;
                match made {
                    Ok(comm) => slot.insert(comm),
                    Err(err) => return Err(self.failure(&group, err).await),
                }
            }
        };
        let bucket = if bucket_bytes_max == 0 {
            tensors
                .iter()
                .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                .sum::<usize>()
                .max(1)
        } else {
            bucket_bytes_max
        };
        match comm.all_reduce(Reduction::Sum, &tensors, bucket).await {
            Ok(summed) => Ok(summed),
            Err(err) => Err(self.failure(&group, err).await),
        }
    }

    /// The error a failed NCCL call reports: the group's, if it broke or breaks within the
    /// settle bound (a lost member the transport has not detected yet); else NCCL's own,
    /// after aborting the group with it so that every member's call fails alike.
    async fn failure(&self, group: &ProcessGroup, err: NcclError) -> CollectiveError {
        let deadline = Instant::now() + self.settle;
        loop {
            if let Some(broken) = group.broken() {
                return broken;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        group
            .abort(format!("NCCL on GPU {}: {err}", self.device))
            .await
    }
}
