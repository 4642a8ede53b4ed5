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
//! timeout, the transport's idle timeout for a lost member), and the span's [`NcclWaits`]
//! bound NCCL's, so they never hang. The call runs
//! as a task on the span's runtime and is awaited through a channel, so calling from inside
//! another async runtime is no error either.
//!
//! With the feature `nccl`, a span made `ProcessSpan::with_nccl` sums f32 and f64 tensors
//! on a GPU of this process with NCCL instead of the group's ring (TensorFlow's
//! `CommunicationImplementation.NCCL`); everything else (broadcasts, gathers, barriers, other
//! dtypes) stays on the group. NCCL gives every rank the same bits too (its algorithms reduce
//! each element once and pass the result on). The span is one membership generation: its communicator is made at
//! its first NCCL sum, bootstrapped over the group (`NcclComm::new`; every member reaches
//! that sum at the same point of its sequence of calls, as every collective does), and
//! aborted when the group breaks; a re-formed group gets a new span and so a new
//! communicator. Each NCCL sum first all-reduces a fingerprint of the call (tensor count,
//! elements, shapes and dtypes, bucket size) so that members passing different tensors fail
//! alike instead of NCCL waiting out its timeout or summing mismatched buffers (the group's
//! own calls check the same in their headers).
//!
//! A failed NCCL call breaks the group, so that every member's call fails and
//! [`CollectiveError`] says whether re-forming can mend it:
//! - an error this member's call raised (CUDA, its arguments, out of memory): the group is
//!   aborted at once with it ([`CollectiveError::Application`]: not mended by re-forming);
//! - a failure seen through NCCL (an asynchronous or remote error, NCCL's wait timed out):
//!   the group's own error if the group breaks within the settle bound (a lost member the
//!   transport detects after NCCL did); else the members are probed: one that does not
//!   answer is lost ([`CollectiveError::MemberLost`]); when all answer, the communicator
//!   itself failed ([`CollectiveError::Communicator`]). Both are mended by re-forming, which
//!   makes a new communicator.

use std::future::Future;
#[cfg(feature = "nccl")]
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "nccl")]
use std::time::Instant;

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
    /// The GPU sums of this generation, when the span was made [`ProcessSpan::with_nccl`].
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

    /// This span sums f32 and f64 tensors with NCCL on GPU `device`, within `waits` (see the
    /// module doc).
    #[cfg(feature = "nccl")]
    pub fn with_nccl(mut self, device: usize, waits: NcclWaits) -> Self {
        self.nccl = Some(Arc::new(GpuSums {
            device,
            waits,
            comm: tokio::sync::Mutex::new(None),
        }));
        self
    }

    /// Aborts this span's NCCL communicator, if it made one: its group was replaced by a later
    /// generation's (which makes its own), and the GPU memory and threads go now rather than when
    /// the last clone of this span does. Does nothing while a sum holds it (none does once the
    /// group is replaced: every sum of this span has returned).
    pub fn close_nccl(&self) {
        #[cfg(feature = "nccl")]
        if let Some(gpu) = &self.nccl {
            if let Ok(mut held) = gpu.comm.try_lock() {
                held.take();
            }
        }
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
            let (group, tensors, bucket) = (
                self.group.clone(),
                vec![tensor.clone()],
                self.bucket_bytes_max,
            );
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
                generation: self.group.generation(),
            })
        })
    }
}

/// The bounds of a span's NCCL calls (`ProcessSpan::with_nccl`, feature `nccl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclWaits {
    /// Every NCCL wait: the communicator's init and each all-reduce.
    pub timeout: Duration,
    /// How long a call that failed through NCCL waits for the group to report a lost member
    /// (the transport's detection budget) before it probes the members.
    pub settle: Duration,
    /// How long that probe waits for each member's answer.
    pub probe: Duration,
}

/// One generation's NCCL sums on one GPU (see the module doc).
#[cfg(feature = "nccl")]
#[derive(Debug)]
struct GpuSums {
    device: usize,
    waits: NcclWaits,
    /// Made at the first sum; the lock also keeps this process's NCCL calls in one order.
    comm: tokio::sync::Mutex<Option<NcclComm>>,
}

/// How often a failed NCCL call looks whether the group broke.
#[cfg(feature = "nccl")]
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// Values of a call's fingerprint: each below 2^52, so exact in f64.
#[cfg(feature = "nccl")]
const FINGERPRINT_MASK: u64 = (1 << 52) - 1;

/// What every member's call must agree on: the number of tensors, their elements, the
/// group's digest of their shapes and dtypes, and the bucket size; each value below 2^52.
#[cfg(feature = "nccl")]
fn fingerprint(tensors: &[Tensor], bucket_bytes_max: usize) -> [u64; 4] {
    let elements: usize = tensors.iter().map(Tensor::elem_count).sum();
    [
        tensors.len() as u64,
        elements as u64,
        super::ops::shapes_digest(tensors),
        bucket_bytes_max as u64,
    ]
    .map(|v| v & FINGERPRINT_MASK)
}

#[cfg(feature = "nccl")]
impl GpuSums {
    /// Sums `tensors` (f32/f64, buckets of at most `bucket` bytes) with every member's, making
    /// the communicator first if this generation has none.
    async fn sum(
        &self,
        group: ProcessGroup,
        tensors: Vec<Tensor>,
        bucket: usize,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let mut held = self.comm.lock().await;
        let comm = match &mut *held {
            Some(comm) => comm,
            slot @ None => {
                let made = NcclComm::new(&group, self.device, self.waits.timeout).await;
                match made {
                    Ok(comm) => slot.insert(comm),
                    Err(err) => return Err(self.failure(&group, err).await),
                }
            }
        };
        let mine = fingerprint(&tensors, bucket);
        // Max of the values and of their negatives: every member's equal iff max == -min.
        let probe: Vec<f64> = mine
            .iter()
            .map(|&v| v as f64)
            .chain(mine.iter().map(|&v| -(v as f64)))
            .collect();
        let probe = Tensor::new(probe.as_slice(), &candle_core::Device::Cpu)
            .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
        let agreed = match comm.all_reduce(Reduction::Max, &[probe], 64).await {
            Ok(out) => out,
            Err(err) => return Err(self.failure(&group, err).await),
        };
        let seen = agreed
            .first()
            .and_then(|t| t.to_vec1::<f64>().ok())
            .unwrap_or_default();
        let n = mine.len();
        let alike = seen.len() == 2 * n && (0..n).all(|i| seen[i] == -seen[n + i]);
        if !alike {
            let message = format!(
                "NCCL sum: the members' tensors differ in number, elements, shapes or dtypes, \
                 or their bucket size (this member: {} tensor(s) of {} element(s), buckets of \
                 {bucket} bytes)",
                tensors.len(),
                tensors.iter().map(Tensor::elem_count).sum::<usize>()
            );
            return Err(group.abort(message).await);
        }
        match comm.all_reduce(Reduction::Sum, &tensors, bucket).await {
            Ok(summed) => Ok(summed),
            Err(err) => Err(self.failure(&group, err).await),
        }
    }

    /// The error a failed NCCL call breaks the group with (see the module doc).
    async fn failure(&self, group: &ProcessGroup, err: NcclError) -> CollectiveError {
        if let Some(broken) = group.broken() {
            return broken;
        }
        if err.raised_here() {
            return group
                .abort(format!("NCCL on GPU {}: {err}", self.device))
                .await;
        }
        let deadline = Instant::now() + self.waits.settle;
        while Instant::now() < deadline {
            tokio::time::sleep(SETTLE_POLL).await;
            if let Some(broken) = group.broken() {
                return broken;
            }
        }
        let generation = group.generation();
        let verdict = match group.reachable(self.waits.probe).await {
            Ok(reached) => match group.members().iter().find(|m| !reached.contains(m)) {
                Some(lost) => CollectiveError::MemberLost {
                    node: lost.clone(),
                    generation,
                    reason: format!("no answer to a probe after NCCL failed: {err}"),
                },
                None => CollectiveError::Communicator {
                    node: group.members()[group.rank()].clone(),
                    generation,
                    reason: err.to_string(),
                },
            },
            Err(refused) => refused,
        };
        group.fail_with(verdict).await
    }
}

#[cfg(all(test, feature = "nccl"))]
mod tests {
    use super::*;
    use crate::collective::{loopback_group, GroupConfig};
    use cohort_transport::{Endpoint, TransportConfig};

    const SETTLE: Duration = Duration::from_millis(300);

    fn sums() -> GpuSums {
        GpuSums {
            device: 0,
            waits: NcclWaits {
                timeout: Duration::from_secs(5),
                settle: SETTLE,
                probe: Duration::from_secs(1),
            },
            comm: tokio::sync::Mutex::new(None),
        }
    }

    async fn group(n: u32) -> (Vec<Endpoint>, Vec<ProcessGroup>) {
        loopback_group(n, TransportConfig::for_tests(), GroupConfig::for_tests())
            .await
            .unwrap()
    }

    /// The error `group` broke with, waiting (bounded) for a peer's word to reach it.
    async fn heard(group: &ProcessGroup) -> Option<CollectiveError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while group.broken().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        group.broken()
    }

    fn timed_out(generation: u64) -> NcclError {
        NcclError::Timeout {
            generation,
            what: "all-reduce",
            timeout_ms: 5000,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_raised_here_aborts_the_group_at_once_with_it() {
        let (_endpoints, groups) = group(2).await;
        let started = Instant::now();
        let err = NcclError::Cuda {
            during: "copying a bucket to the device".into(),
            reason: "out of memory".into(),
        };
        assert!(err.raised_here());
        let got = sums().failure(&groups[0], err).await;
        assert!(started.elapsed() < SETTLE, "{:?}", started.elapsed());
        match &got {
            CollectiveError::Application { node, message, .. } => {
                assert_eq!(node, &groups[0].members()[0]);
                assert!(message.contains("NCCL on GPU 0"), "{message}");
                assert!(message.contains("out of memory"), "{message}");
            }
            other => panic!("expected an application error, got {other}"),
        }
        // The other member hears it.
        assert_eq!(heard(&groups[1]).await, Some(got));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failure_through_nccl_with_every_member_answering_is_the_communicators() {
        let (_endpoints, groups) = group(2).await;
        let err = timed_out(1);
        assert!(!err.raised_here());
        let started = Instant::now();
        let got = sums().failure(&groups[0], err).await;
        // It waited for the group to report a lost member first.
        assert!(started.elapsed() >= SETTLE, "{:?}", started.elapsed());
        match &got {
            CollectiveError::Communicator {
                node,
                generation: 1,
                reason,
            } => {
                assert_eq!(node, &groups[0].members()[0]);
                assert!(reason.contains("did not finish within 5000 ms"), "{reason}");
            }
            other => panic!("expected the communicator's failure, got {other}"),
        }
        assert_eq!(heard(&groups[1]).await, Some(got));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failure_through_nccl_names_a_member_gone_without_breaking_the_group() {
        // Member 2 closes its endpoint while no group call waits on it: the group stands
        // (a peer that leaves on purpose is lost only to a call waiting for it), so the probe
        // finds it gone.
        let (endpoints, groups) = group(3).await;
        endpoints[2].close();
        let got = sums().failure(&groups[0], timed_out(1)).await;
        // Found by the probe, or by the group during the settle wait: member 2, either way.
        match &got {
            CollectiveError::MemberLost {
                node,
                generation: 1,
                ..
            }
            | CollectiveError::Link {
                node,
                generation: 1,
                ..
            } => {
                assert_eq!(node, &groups[0].members()[2], "{got}");
            }
            other => panic!("expected member 2 lost, got {other}"),
        }
        assert_eq!(groups[0].broken(), Some(got));
    }

    #[test]
    fn fingerprints_differ_where_the_calls_do_and_are_exact_in_f64() {
        let cpu = &candle_core::Device::Cpu;
        let t = |dims: &[usize], dtype| Tensor::zeros(dims, dtype, cpu).unwrap();
        let a = [t(&[2, 3], DType::F32), t(&[5], DType::F64)];
        let base = fingerprint(&a, 1 << 20);
        assert_eq!(base, fingerprint(&a.clone(), 1 << 20));
        for other in [
            fingerprint(&a[..1], 1 << 20),
            fingerprint(&[t(&[3, 2], DType::F32), t(&[5], DType::F64)], 1 << 20),
            fingerprint(&[t(&[2, 3], DType::F32), t(&[5], DType::F32)], 1 << 20),
            fingerprint(&[t(&[2, 3], DType::F32), t(&[6], DType::F64)], 1 << 20),
            fingerprint(&a, 1 << 19),
        ] {
            assert_ne!(other, base);
        }
        for v in base {
            assert!(v <= FINGERPRINT_MASK);
            assert_eq!((v as f64) as u64, v);
        }
    }
}
