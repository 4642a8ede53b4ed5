//! Where replica functions execute: inline on the caller's thread (one replica), or on one
//! long-lived thread per replica that takes jobs from a bounded mailbox.
//!
//! Why threads with mailboxes rather than actix arbiters: an `actix::Arbiter` can only be made
//! from a thread where an actix `System` runs, which would force every user program and test
//! that calls `Mirrored::new` to start one, and DESIGN §2 keeps heavy compute off arbiters. A
//! replica here is still an actor in the plain sense: it owns its thread, receives work only as
//! messages, runs them one at a time in arrival order, and reports each result by message. The
//! role actors of the parameter-server issue wrap a strategy from an actix shell.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cohort_actors::contain_panic;

use super::context::with_replica_context;
use super::{get_replica_context, DeviceSpec, ReplicaContext, StrategyError, StrategyId};
use crate::collective::{LocalGroup, ProcessSpan};

/// A type-erased replica function: given its context, returns its boxed result.
pub type ReplicaFn = Arc<dyn Fn(&ReplicaContext) -> Box<dyn Any + Send> + Send + Sync>;

/// How replicas execute for a strategy.
#[derive(Debug)]
pub(crate) struct Replicas {
    devices: Vec<DeviceSpec>,
    strategy_id: StrategyId,
    collective_timeout: Duration,
    threads: Option<ReplicaThreads>,
    /// The processes every step's collectives span (MultiWorkerMirrored).
    span: Option<ProcessSpan>,
}

impl Replicas {
    /// One replica, run on the calling thread.
    pub(crate) fn inline(device: DeviceSpec, strategy_id: StrategyId) -> Self {
        Self {
            devices: vec![device],
            strategy_id,
            collective_timeout: Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS),
            threads: None,
            span: None,
        }
    }

    /// One thread per device.
    pub(crate) fn threaded(
        devices: Vec<DeviceSpec>,
        strategy_id: StrategyId,
        collective_timeout: Duration,
    ) -> Result<Self, StrategyError> {
        let threads = ReplicaThreads::spawn(&devices, strategy_id)?;
        Ok(Self {
            devices,
            strategy_id,
            collective_timeout,
            threads: Some(threads),
            span: None,
        })
    }

    pub(crate) fn devices(&self) -> &[DeviceSpec] {
        &self.devices
    }

    pub(crate) fn set_collective_timeout(&mut self, timeout: Duration) {
        self.collective_timeout = timeout;
    }

    /// Makes every step's collectives go on across the processes of `span`.
    pub(crate) fn set_span(&mut self, span: ProcessSpan) {
        self.span = Some(span);
    }

    /// Runs `f` once per replica and gives the results in replica order.
    pub(crate) fn run(&self, f: ReplicaFn) -> Result<Vec<Box<dyn Any + Send>>, StrategyError> {
        if get_replica_context().is_some() {
            return Err(StrategyError::NestedRun);
        }
        let (n, timeout) = (self.devices.len(), self.collective_timeout);
        let members = match &self.span {
            Some(span) => LocalGroup::spanning(n, timeout, span.clone()),
            None => LocalGroup::create(n, timeout),
        };
        let contexts: Vec<ReplicaContext> = members
            .into_iter()
            .zip(&self.devices)
            .map(|(m, d)| ReplicaContext::new(*d, self.strategy_id, Arc::new(m)))
            .collect();
        match &self.threads {
            None => {
                let outcomes: Vec<_> = contexts.iter().map(|ctx| run_one(ctx, &f)).collect();
                collect(outcomes.into_iter().enumerate().collect())
            }
            Some(threads) => threads.run(contexts, f),
        }
    }
}

/// The default time a collective round waits for every replica.
pub const DEFAULT_COLLECTIVE_TIMEOUT_MS: u64 = 60_000;

/// Jobs a replica's mailbox holds before a sender waits.
const MAILBOX_JOBS_MAX: usize = 64;

type Job = Box<dyn FnOnce() + Send>;
/// A replica's value, or its panic's text: a panic payload has no type to keep ([`panic_message`]).
type Outcome = Result<Box<dyn Any + Send>, String>;

#[derive(Debug)]
struct ReplicaThreads {
    mailboxes: Vec<SyncSender<Job>>,
    handles: Vec<JoinHandle<()>>,
    /// Jobs of one `run` enter every mailbox before those of another, so every replica thread
    /// sees steps in the same order and concurrent `run` calls cannot deadlock in collectives.
    dispatch: Mutex<()>,
}

impl ReplicaThreads {
    fn spawn(devices: &[DeviceSpec], strategy_id: StrategyId) -> Result<Self, StrategyError> {
        let mut mailboxes = Vec::with_capacity(devices.len());
        let mut handles = Vec::with_capacity(devices.len());
        for (replica, device) in devices.iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel::<Job>(MAILBOX_JOBS_MAX);
            let handle = std::thread::Builder::new()
                .name(format!(
                    "cohort-s{}-replica{replica}-{device}",
                    strategy_id.0
                ))
                .spawn(move || replica_loop(rx))
                .map_err(|e| StrategyError::ReplicaSpawn {
                    replica,
                    reason: e.to_string(),
                })?;
            mailboxes.push(tx);
            handles.push(handle);
        }
        Ok(Self {
            mailboxes,
            handles,
            dispatch: Mutex::new(()),
        })
    }

    fn run(
        &self,
        contexts: Vec<ReplicaContext>,
        f: ReplicaFn,
    ) -> Result<Vec<Box<dyn Any + Send>>, StrategyError> {
        let (tx, rx) = mpsc::channel::<(usize, Outcome)>();
        let n = contexts.len();
        {
            let _order = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
            for (replica, ctx) in contexts.iter().enumerate() {
                let f = Arc::clone(&f);
                let tx = tx.clone();
                let job_ctx = ctx.clone();
                let job: Job = Box::new(move || {
                    let outcome = run_one(&job_ctx, &f);
                    // The caller may have given up (it returned on a lost replica); fine.
                    let _ = tx.send((replica, outcome));
                });
                if self.mailboxes[replica].send(job).is_err() {
                    // Replicas already sent this step must not wait for the ones never sent.
                    for unsent in &contexts[replica..] {
                        unsent.leave();
                    }
                    return Err(StrategyError::ReplicaGone { replica });
                }
            }
        }
        drop(tx);
        let mut outcomes = Vec::with_capacity(n);
        while outcomes.len() < n {
            match rx.recv() {
                Ok(o) => outcomes.push(o),
                Err(_) => {
                    // Every job sends before it ends, so a closed channel means a thread died.
                    let missing = (0..n)
                        .find(|r| !outcomes.iter().any(|(done, _)| done == r))
                        .unwrap_or(0);
                    return Err(StrategyError::ReplicaGone { replica: missing });
                }
            }
        }
        collect(outcomes)
    }
}

impl Drop for ReplicaThreads {
    fn drop(&mut self) {
        // Closing the mailboxes ends each loop after its current job.
        self.mailboxes.clear();
        let me = std::thread::current().id();
        for handle in self.handles.drain(..) {
            // The last owner may be a replica's own job (a strategy captured by its function);
            // that thread ends by itself once its mailbox is closed.
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

fn replica_loop(rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        job();
    }
}

fn run_one(ctx: &ReplicaContext, f: &ReplicaFn) -> Outcome {
    // The replica's panic is its error (a value, even in a crash-only process).
    let result = with_replica_context(ctx, || contain_panic(AssertUnwindSafe(|| f(ctx))))
        .map_err(|payload| panic_message(payload.as_ref()));
    if let Err(message) = &result {
        // Other workers waiting for this step fail at once with the panic's message.
        ctx.abort_step(&format!(
            "replica {} panicked: {message}",
            ctx.replica_id_in_sync_group()
        ));
    }
    // Peers still waiting in a collective this replica will never join fail at once.
    ctx.leave();
    result
}

fn collect(mut outcomes: Vec<(usize, Outcome)>) -> Result<Vec<Box<dyn Any + Send>>, StrategyError> {
    outcomes.sort_by_key(|(replica, _)| *replica);
    let mut values = Vec::with_capacity(outcomes.len());
    for (replica, outcome) in outcomes {
        match outcome {
            Ok(v) => values.push(v),
            Err(message) => return Err(StrategyError::ReplicaPanicked { replica, message }),
        }
    }
    Ok(values)
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
