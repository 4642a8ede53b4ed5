//! The worker's actix shell and its compute thread.
//!
//! The actor takes `SetupWorker` and `RunClosure` from the gateway and hands them, in order, to
//! the compute thread through a bounded queue; the reply travels back on a oneshot. Everything
//! a step touches (datasets, layouts) lives on the compute thread, so it needs no lock.
//!
//! A job the worker cannot take (queue full, compute thread gone) is refused with a typed
//! [`WorkerRefusal`], never reported as the closure's own error: the coordinator then runs the
//! closure elsewhere and retires this incarnation. A closure that failed because a parameter
//! server was unavailable is reported as [`RunClosureError::PsUnavailable`] (retryable), not
//! as the closure's error.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use actix::prelude::*;
use cohort_actors::{contain_panic, Gateway, RegisterError, Remote};
use tokio::sync::oneshot;

use super::client::PsClient;
use super::{StepContext, StepError, WorkerDataset};
use crate::data::InputContext;
use crate::roles::protocol::{
    DatasetPositions, PsUnavailable, RewindWorker, RunClosure, RunClosureError, SetupWorker,
    WorkerRefusal, WORKER_ACTOR,
};
use crate::roles::registry::Program;
use crate::variable::ShardLayout;

/// Work for the compute thread.
pub enum WorkerJob {
    /// Rebuild layouts and datasets.
    Setup(SetupWorker, oneshot::Sender<Result<(), String>>),
    /// Run one closure: its value, or the parameter server it could not reach, or its error.
    Run(
        RunClosure,
        oneshot::Sender<Result<Result<Vec<u8>, PsUnavailable>, String>>,
    ),
    /// Rebuild every dataset from the start (skipping to the positions given): after a
    /// parameter-server recovery rolled the variables back to a checkpoint.
    Rewind(SetupWorker, oneshot::Sender<Result<(), String>>),
    /// Report how far each dataset has been read.
    Positions(oneshot::Sender<Result<Vec<(String, u64)>, String>>),
}

/// The worker actor: forwards jobs to the compute thread.
pub struct WorkerActor {
    jobs: SyncSender<WorkerJob>,
}

impl WorkerActor {
    /// Starts the actor, registered with `gateway` under [`WORKER_ACTOR`].
    pub fn start(
        jobs: SyncSender<WorkerJob>,
        gateway: &Gateway,
    ) -> Result<Addr<WorkerActor>, RegisterError> {
        let addr = WorkerActor { jobs }.start();
        gateway.register::<SetupWorker>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<RunClosure>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<DatasetPositions>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<RewindWorker>(WORKER_ACTOR, addr.clone().recipient())?;
        Ok(addr)
    }

    /// Queues a job for the compute thread: its own result, or why the worker could not
    /// take it.
    fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, String>>) -> WorkerJob,
    ) -> ResponseFuture<Result<Result<T, String>, WorkerRefusal>> {
        let (tx, rx) = oneshot::channel();
        let queued = match self.jobs.try_send(job(tx)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(WorkerRefusal::Busy {
                queued: JOBS_MAX as u32,
            }),
            Err(TrySendError::Disconnected(_)) => Err(WorkerRefusal::ComputeStopped),
        };
        Box::pin(async move {
            queued?;
            rx.await.map_err(|_| WorkerRefusal::JobDropped)
        })
    }

    /// As [`Self::submit`], for a reply whose error is text: a refusal reads as its message.
    fn submit_as_text<T: Send + 'static>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, String>>) -> WorkerJob,
    ) -> ResponseFuture<Result<T, String>> {
        let reply = self.submit(job);
        Box::pin(async move {
            reply
                .await
                .unwrap_or_else(|refusal| Err(refusal.to_string()))
        })
    }
}

impl Actor for WorkerActor {
    type Context = Context<Self>;
}

impl Handler<Remote<SetupWorker>> for WorkerActor {
    type Result = ResponseFuture<Result<(), String>>;

    fn handle(&mut self, msg: Remote<SetupWorker>, _: &mut Context<Self>) -> Self::Result {
        self.submit_as_text(|tx| WorkerJob::Setup(msg.msg, tx))
    }
}

impl Handler<Remote<RewindWorker>> for WorkerActor {
    type Result = ResponseFuture<Result<(), String>>;

    fn handle(&mut self, msg: Remote<RewindWorker>, _: &mut Context<Self>) -> Self::Result {
        self.submit_as_text(|tx| WorkerJob::Rewind(msg.msg.setup, tx))
    }
}

impl Handler<Remote<DatasetPositions>> for WorkerActor {
    type Result = ResponseFuture<Result<Vec<(String, u64)>, String>>;

    fn handle(&mut self, _: Remote<DatasetPositions>, _: &mut Context<Self>) -> Self::Result {
        self.submit_as_text(WorkerJob::Positions)
    }
}

impl Handler<Remote<RunClosure>> for WorkerActor {
    type Result = ResponseFuture<Result<Vec<u8>, RunClosureError>>;

    fn handle(&mut self, msg: Remote<RunClosure>, _: &mut Context<Self>) -> Self::Result {
        let reply = self.submit(|tx| WorkerJob::Run(msg.msg, tx));
        Box::pin(async move {
            match reply.await {
                Ok(Ok(Ok(value))) => Ok(value),
                Ok(Ok(Err(unavailable))) => Err(RunClosureError::PsUnavailable(unavailable)),
                Ok(Err(message)) => Err(RunClosureError::Step(message)),
                Err(refusal) => Err(RunClosureError::Refused(refusal)),
            }
        })
    }
}

/// A bounded job queue for [`run_worker_thread`].
pub fn job_queue() -> (SyncSender<WorkerJob>, Receiver<WorkerJob>) {
    sync_channel(JOBS_MAX)
}

/// The compute thread's loop: runs jobs until the queue closes.
pub fn run_worker_thread(
    program: Arc<Program>,
    worker: u32,
    epoch: u64,
    client: PsClient,
    jobs: Receiver<WorkerJob>,
) {
    let mut state = ComputeState {
        program,
        worker,
        epoch,
        num_workers: 1,
        client,
        layouts: BTreeMap::new(),
        datasets: BTreeMap::new(),
    };
    while let Ok(job) = jobs.recv() {
        match job {
            WorkerJob::Setup(setup, reply) => {
                let _ = reply.send(state.setup(setup));
            }
            WorkerJob::Run(run, reply) => {
                let _ = reply.send(state.run(run));
            }
            WorkerJob::Rewind(setup, reply) => {
                state.datasets.clear();
                let _ = reply.send(state.setup(setup));
            }
            WorkerJob::Positions(reply) => {
                let positions = state
                    .datasets
                    .iter()
                    .map(|(name, d)| (name.clone(), d.position))
                    .collect();
                let _ = reply.send(Ok(positions));
            }
        }
    }
}

struct ComputeState {
    program: Arc<Program>,
    worker: u32,
    epoch: u64,
    num_workers: u32,
    client: PsClient,
    layouts: BTreeMap<String, ShardLayout>,
    datasets: BTreeMap<String, WorkerDataset>,
}

impl ComputeState {
    fn setup(&mut self, setup: SetupWorker) -> Result<(), String> {
        let layouts: Vec<ShardLayout> = serde_json::from_str(&setup.layouts_json)
            .map_err(|e| format!("variable layouts: {e}"))?;
        for layout in &layouts {
            layout
                .validate()
                .map_err(|e| format!("variable layouts: {e}"))?;
        }
        let mut datasets = BTreeMap::new();
        for (function, skip) in &setup.datasets {
            // A dataset this incarnation already reads keeps its place: a new setup (another
            // variable, another dataset) must not restart the streams.
            if let Some(existing) = self.datasets.remove(function) {
                datasets.insert(function.clone(), existing);
                continue;
            }
            if *skip > SKIP_MAX {
                return Err(format!(
                    "dataset {function:?}: cannot resume {skip} elements in (at most {SKIP_MAX})"
                ));
            }
            let build = self
                .program
                .dataset_fn(function)
                .ok_or_else(|| format!("no dataset function {function:?} registered"))?;
            let context = InputContext::new(
                setup.num_workers as usize,
                self.worker as usize,
                setup.num_workers as usize,
            );
            let dataset = build(&context).map_err(|e| format!("dataset {function:?}: {e}"))?;
            let mut iter = dataset.iter();
            let mut position = 0;
            while position < *skip {
                match iter.next() {
                    Some(Ok(_)) => position += 1,
                    Some(Err(e)) => {
                        return Err(format!(
                            "dataset {function:?}: resuming at element {skip}: {e}"
                        ))
                    }
                    None => break,
                }
            }
            datasets.insert(function.clone(), WorkerDataset { iter, position });
        }
        self.num_workers = setup.num_workers;
        self.layouts = layouts.into_iter().map(|l| (l.name.clone(), l)).collect();
        self.datasets = datasets;
        Ok(())
    }

    fn run(&mut self, run: RunClosure) -> Result<Result<Vec<u8>, PsUnavailable>, String> {
        let step = self
            .program
            .step_fn(&run.function)
            .ok_or_else(|| format!("no step function {:?} registered", run.function))?
            .clone();
        let mut ctx = StepContext {
            worker: self.worker,
            num_workers: self.num_workers,
            closure: run.closure,
            client: &self.client,
            layouts: &self.layouts,
            datasets: &mut self.datasets,
            pending: Vec::new(),
        };
        let started = std::time::Instant::now();
        // A panicking step is that step's error, not the worker's death (nor a crash: see
        // `cohort_actors::contain_panic`).
        let outcome =
            contain_panic(AssertUnwindSafe(|| step(&mut ctx, &run.args))).unwrap_or_else(|panic| {
                Err(StepError::Step(format!(
                    "step panicked: {}",
                    panic_message(&panic)
                )))
            });
        let value = match outcome {
            Ok(value) => value,
            Err(StepError::PsUnavailable(unavailable)) => return Ok(Err(unavailable)),
            Err(e) => return Err(format!("{}: {e}", run.function)),
        };
        let pending = std::mem::take(&mut ctx.pending);
        let computed = started.elapsed();
        if !pending.is_empty() {
            let pushed = self.client.push(
                &self.layouts,
                (
                    self.worker,
                    self.epoch,
                    run.closure,
                    run.attempt,
                    run.generation,
                ),
                pending,
            );
            match pushed {
                Ok(_) => {}
                Err(StepError::PsUnavailable(unavailable)) => return Ok(Err(unavailable)),
                Err(e) => return Err(format!("{}: {e}", run.function)),
            }
        }
        tracing::debug!(
            "closure {} ({}): step {:.2} ms, push {:.2} ms",
            run.closure,
            run.function,
            computed.as_secs_f64() * 1e3,
            (started.elapsed() - computed).as_secs_f64() * 1e3
        );
        Ok(Ok(value))
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Most elements a worker skips to resume a dataset from a checkpoint position.
const SKIP_MAX: u64 = 10_000_000;
/// Jobs that may wait for the compute thread (one closure in flight plus a setup).
const JOBS_MAX: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_actors::{Epoch, Incarnation};
    use cohort_transport::NodeId;

    fn run_closure(closure: u64) -> Remote<RunClosure> {
        Remote {
            from: Incarnation::new(NodeId::new("chief", 0), Epoch(1)),
            msg: RunClosure {
                closure,
                attempt: 1,
                generation: 0,
                function: "step".into(),
                args: Vec::new(),
            },
            blobs: Vec::new(),
        }
    }

    /// A job the worker cannot take is refused with a typed reason, never reported as the
    /// closure's own (non-retryable) error.
    #[test]
    fn a_job_the_worker_cannot_take_is_a_typed_refusal_not_a_step_error() {
        System::new().block_on(async {
            let (jobs, queue) = job_queue();
            let worker = WorkerActor { jobs }.start();
            // Nobody runs the jobs: fill the queue, then one more.
            let mut waiting = Vec::new();
            for closure in 0..JOBS_MAX as u64 {
                waiting.push(worker.send(run_closure(closure)));
            }
            let busy = worker.send(run_closure(99)).await.unwrap();
            assert_eq!(
                busy,
                Err(RunClosureError::Refused(WorkerRefusal::Busy {
                    queued: JOBS_MAX as u32
                }))
            );
            // The compute thread goes away: what it held was dropped, and nothing more fits.
            drop(queue);
            for reply in waiting {
                assert_eq!(
                    reply.await.unwrap(),
                    Err(RunClosureError::Refused(WorkerRefusal::JobDropped))
                );
            }
            assert_eq!(
                worker.send(run_closure(100)).await.unwrap(),
                Err(RunClosureError::Refused(WorkerRefusal::ComputeStopped))
            );
        });
    }
}
