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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use actix::prelude::*;
use cohort_actors::{contain_panic, Gateway, RegisterError, Remote};
use tokio::sync::oneshot;

use super::machine::{Computed, DatasetPlan, Request, StepAction, WorkerMachine, JOBS_MAX};
use super::{StepContext, StepError, WorkerDataset, WorkerFunctions};
use crate::data::InputContext;
use crate::roles::protocol::{
    DatasetPositions, PositionsError, RewindWorker, RunClosure, RunClosureError, SetupError,
    SetupWorker, WorkerRefusal, WORKER_ACTOR,
};
use crate::roles::ps_client::PsClient;

/// The worker's machine, shared by the actor (admission, ending) and the compute thread
/// (setups, steps). Every call on it is short and does no IO.
pub type SharedMachine = Arc<Mutex<WorkerMachine>>;

/// The machine, even if a thread panicked while holding it (its calls leave it consistent).
pub(crate) fn lock(machine: &SharedMachine) -> MutexGuard<'_, WorkerMachine> {
    machine.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Work for the compute thread.
pub enum WorkerJob {
    /// Set up layouts and datasets; a rewind rebuilds every dataset from the start (skipping
    /// to the positions given), after a parameter-server recovery rolled the variables back
    /// to a checkpoint.
    Setup {
        /// The setup.
        setup: SetupWorker,
        /// Whether every dataset is rebuilt.
        rewind: bool,
        /// The incarnation of the chief that sent it (setups are ordered by it first).
        from_chief: u64,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<(), SetupError>>,
    },
    /// Run one closure (sent by the chief incarnation given): its value, or why there is
    /// none.
    Run(
        RunClosure,
        u64,
        oneshot::Sender<Result<Vec<u8>, RunClosureError>>,
    ),
    /// Report how far each dataset has been read.
    Positions(oneshot::Sender<Result<Vec<(String, u64)>, PositionsError>>),
}

/// The worker actor: admits requests (its machine decides) and forwards them to the compute
/// thread.
pub struct WorkerActor {
    jobs: SyncSender<WorkerJob>,
    machine: SharedMachine,
}

impl WorkerActor {
    /// Starts the actor, registered with `gateway` under [`WORKER_ACTOR`].
    pub fn start(
        jobs: SyncSender<WorkerJob>,
        machine: SharedMachine,
        gateway: &Gateway,
    ) -> Result<Addr<WorkerActor>, RegisterError> {
        let addr = WorkerActor { jobs, machine }.start();
        gateway.register::<SetupWorker>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<RunClosure>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<DatasetPositions>(WORKER_ACTOR, addr.clone().recipient())?;
        gateway.register::<RewindWorker>(WORKER_ACTOR, addr.clone().recipient())?;
        Ok(addr)
    }

    /// Queues a job for the compute thread if the machine admits it: the job's own answer,
    /// or why the worker could not take it.
    fn submit<T: Send + 'static, E: From<WorkerRefusal> + Send + 'static>(
        &self,
        request: Request,
        job: impl FnOnce(oneshot::Sender<Result<T, E>>) -> WorkerJob,
    ) -> ResponseFuture<Result<T, E>> {
        let (tx, rx) = oneshot::channel();
        let mut machine = lock(&self.machine);
        let queued = machine.admit(Instant::now(), request).and_then(|()| {
            let sent = match self.jobs.try_send(job(tx)) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(_)) => WorkerRefusal::Busy {
                    queued: JOBS_MAX as u32,
                },
                Err(TrySendError::Disconnected(_)) => WorkerRefusal::ComputeStopped,
            };
            // Admitted but not queued: the admission is taken back.
            machine.handle_job_dropped();
            Err(sent)
        });
        drop(machine);
        let machine = Arc::clone(&self.machine);
        Box::pin(async move {
            queued?;
            match rx.await {
                Ok(answer) => answer,
                Err(_) => {
                    // The compute thread went away with the job: it will never finish it.
                    lock(&machine).handle_job_dropped();
                    Err(WorkerRefusal::JobDropped.into())
                }
            }
        })
    }
}

impl Actor for WorkerActor {
    type Context = Context<Self>;
}

impl Handler<Remote<SetupWorker>> for WorkerActor {
    type Result = ResponseFuture<Result<(), SetupError>>;

    fn handle(&mut self, msg: Remote<SetupWorker>, _: &mut Context<Self>) -> Self::Result {
        let from_chief = msg.from.incarnation.0;
        self.submit(Request::Setup, |reply| WorkerJob::Setup {
            setup: msg.msg,
            rewind: false,
            from_chief,
            reply,
        })
    }
}

impl Handler<Remote<RewindWorker>> for WorkerActor {
    type Result = ResponseFuture<Result<(), SetupError>>;

    fn handle(&mut self, msg: Remote<RewindWorker>, _: &mut Context<Self>) -> Self::Result {
        let from_chief = msg.from.incarnation.0;
        self.submit(Request::Setup, |reply| WorkerJob::Setup {
            setup: msg.msg.setup,
            rewind: true,
            from_chief,
            reply,
        })
    }
}

impl Handler<Remote<DatasetPositions>> for WorkerActor {
    type Result = ResponseFuture<Result<Vec<(String, u64)>, PositionsError>>;

    fn handle(&mut self, _: Remote<DatasetPositions>, _: &mut Context<Self>) -> Self::Result {
        self.submit(Request::Positions, WorkerJob::Positions)
    }
}

impl Handler<Remote<RunClosure>> for WorkerActor {
    type Result = ResponseFuture<Result<Vec<u8>, RunClosureError>>;

    fn handle(&mut self, msg: Remote<RunClosure>, _: &mut Context<Self>) -> Self::Result {
        let from_chief = msg.from.incarnation.0;
        let answer = self.submit(Request::Run, |reply| {
            WorkerJob::Run(msg.msg, from_chief, reply)
        });
        let machine = Arc::clone(&self.machine);
        Box::pin(async move {
            let answer = answer.await;
            if matches!(answer, Err(RunClosureError::Refused(WorkerRefusal::Fenced))) {
                // A server fenced this incarnation (the machine decided to exit): the chief
                // hears the refusal and runs the closure elsewhere, then the process ends.
                let exit = lock(&machine).exit().cloned();
                if let Some(exit) = exit {
                    tracing::warn!("{}", exit.reason);
                    let system = actix::System::current();
                    actix::spawn(async move {
                        tokio::time::sleep(FENCED_EXIT_LINGER).await;
                        system.stop_with_code(exit.code);
                    });
                }
            }
            answer
        })
    }
}

/// How long a worker a server fenced lingers after answering the chief, so that the
/// refusal reaches it before the process ends.
const FENCED_EXIT_LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// A bounded job queue for [`run_worker_thread`].
pub fn job_queue() -> (SyncSender<WorkerJob>, Receiver<WorkerJob>) {
    sync_channel(JOBS_MAX)
}

/// The compute thread's loop: carries out the machine's decisions for each job until the
/// queue closes. The datasets (what a step reads) live here, so they need no lock.
pub fn run_worker_thread(
    program: Arc<dyn WorkerFunctions>,
    machine: SharedMachine,
    client: PsClient,
    replicas: usize,
    jobs: Receiver<WorkerJob>,
) {
    let mut compute = Compute {
        program,
        machine,
        client,
        replicas: replicas.max(1),
        datasets: BTreeMap::new(),
    };
    while let Ok(job) = jobs.recv() {
        match job {
            WorkerJob::Setup {
                setup,
                rewind,
                from_chief,
                reply,
            } => {
                let _ = reply.send(compute.setup(&setup, rewind, from_chief));
            }
            WorkerJob::Run(run, from_chief, reply) => {
                let _ = reply.send(compute.run(run, from_chief));
            }
            WorkerJob::Positions(reply) => {
                let _ = reply.send(Ok(lock(&compute.machine).handle_positions(Instant::now())));
            }
        }
    }
}

/// The compute thread's executor.
struct Compute {
    program: Arc<dyn WorkerFunctions>,
    machine: SharedMachine,
    client: PsClient,
    /// Local replicas each step runs on (the `replicas` key).
    replicas: usize,
    datasets: BTreeMap<String, WorkerDataset>,
}

impl Compute {
    /// Carries out a setup as the machine plans it: kept datasets stay where they are, the
    /// others are built and skipped to their positions; only a setup built whole takes
    /// effect (the datasets held before stay otherwise).
    fn setup(
        &mut self,
        setup: &SetupWorker,
        rewind: bool,
        from_chief: u64,
    ) -> Result<(), SetupError> {
        let plan = lock(&self.machine).handle_setup(Instant::now(), setup, rewind, from_chief)?;
        let worker = lock(&self.machine).worker();
        let mut built = BTreeMap::new();
        let mut result = Ok(());
        for dataset in &plan.datasets {
            match dataset {
                DatasetPlan::Keep { function } => {
                    if let Some(existing) = self.datasets.remove(function) {
                        built.insert(function.clone(), existing);
                    }
                }
                DatasetPlan::Build { function, skip } => {
                    match self.build(function, *skip, plan.num_workers, worker) {
                        Ok(dataset) => {
                            built.insert(function.clone(), dataset);
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
            }
        }
        let outcome = match result {
            Ok(()) => {
                let positions = built.iter().map(|(n, d)| (n.clone(), d.position)).collect();
                self.datasets = built;
                Ok(positions)
            }
            Err(e) => {
                // Nothing changes: the kept datasets go back where they were.
                for (name, dataset) in built {
                    if plan.datasets.contains(&DatasetPlan::Keep {
                        function: name.clone(),
                    }) {
                        self.datasets.insert(name, dataset);
                    }
                }
                Err(e)
            }
        };
        lock(&self.machine).handle_setup_built(Instant::now(), outcome)
    }

    /// Builds dataset `function` for this worker and reads `skip` elements of it (fewer if
    /// it ends first).
    fn build(
        &self,
        function: &str,
        skip: u64,
        num_workers: u32,
        worker: u32,
    ) -> Result<WorkerDataset, SetupError> {
        let build = self
            .program
            .dataset_fn(function)
            .ok_or_else(|| SetupError::UnknownDataset(function.into()))?;
        // One element per worker and step, split among the local replicas by the step
        // (`StepContext::on_replicas`): in sync, per element, are the workers (`Program::dataset`).
        let context =
            InputContext::new(num_workers as usize, worker as usize, num_workers as usize);
        let dataset = build(&context).map_err(|e| SetupError::Build {
            dataset: function.into(),
            reason: e.to_string(),
        })?;
        let mut iter = dataset.iter();
        let mut position = 0;
        while position < skip {
            match iter.next() {
                Some(Ok(_)) => position += 1,
                Some(Err(e)) => {
                    return Err(SetupError::Resume {
                        dataset: function.into(),
                        skip,
                        reason: e.to_string(),
                    })
                }
                None => break,
            }
        }
        Ok(WorkerDataset { iter, position })
    }

    /// Carries out a closure's steps as the machine decides them: compute, push, reply.
    fn run(&mut self, run: RunClosure, from_chief: u64) -> Result<Vec<u8>, RunClosureError> {
        self.client.expect_incarnations(&run.servers);
        let servers = lock(&self.machine).job_servers();
        self.client.learn_servers(&servers);
        let mut action = lock(&self.machine).handle_start(Instant::now(), &run, from_chief);
        loop {
            action = match action {
                StepAction::Compute => {
                    let outcome = self.compute(&run);
                    let positions: Vec<(String, u64)> = self
                        .datasets
                        .iter()
                        .map(|(name, d)| (name.clone(), d.position))
                        .collect();
                    lock(&self.machine).handle_computed(Instant::now(), outcome, positions)
                }
                StepAction::Push(plan) => {
                    let pushed = self.client.push(plan);
                    lock(&self.machine).handle_pushed(Instant::now(), pushed)
                }
                StepAction::Reply { result, timing } => {
                    if let Some((computing, pushing)) = timing.filter(|_| result.is_ok()) {
                        let metrics = crate::metrics::instruments();
                        metrics.closures_run.inc();
                        metrics
                            .step_seconds
                            .observe((computing + pushing).as_secs_f64());
                    }
                    if let Some((computing, pushing)) = timing {
                        tracing::debug!(
                            "closure {} ({}): step {:.2} ms, push {:.2} ms",
                            run.closure,
                            run.function,
                            computing.as_secs_f64() * 1e3,
                            pushing.as_secs_f64() * 1e3
                        );
                    }
                    return result;
                }
            }
        }
    }

    /// Runs the step function: its value and the gradients it recorded, or its error.
    fn compute(&mut self, run: &RunClosure) -> Result<Computed, StepError> {
        let step = self
            .program
            .step_fn(&run.function)
            .ok_or_else(|| StepError::UnknownStep(run.function.clone()))?
            .clone();
        let (layouts, worker, num_workers) = {
            let machine = lock(&self.machine);
            (machine.layouts(), machine.worker(), machine.num_workers())
        };
        let mut ctx = StepContext {
            worker,
            num_workers,
            closure: run.closure,
            client: &self.client,
            replicas: self.replicas,
            layouts: &layouts,
            datasets: &mut self.datasets,
            pending: Vec::new(),
            machine: &self.machine,
        };
        // A panicking step is that step's error, not the worker's death (nor a crash: see
        // `cohort_actors::contain_panic`).
        let value = contain_panic(AssertUnwindSafe(|| step(&mut ctx, &run.args))).unwrap_or_else(
            |panic| {
                Err(StepError::Step(format!(
                    "step panicked: {}",
                    cohort_actors::panic_message(panic.as_ref())
                )))
            },
        )?;
        Ok((value, std::mem::take(&mut ctx.pending)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_actors::{Incarnation, IncarnationId};
    use cohort_transport::NodeId;

    fn run_closure(closure: u64) -> Remote<RunClosure> {
        Remote {
            from: Incarnation::new(NodeId::new("chief", 0), IncarnationId(1)),
            msg: RunClosure {
                closure,
                attempt: 1,
                generation: 0,
                function: "step".into(),
                args: Vec::new(),
                servers: Vec::new(),
                learning_rate: None,
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
            let machine = Arc::new(Mutex::new(WorkerMachine::new(0, 1, 1)));
            let worker = WorkerActor { jobs, machine }.start();
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
