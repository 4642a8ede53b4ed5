//! A worker's decisions as a pure machine: whether it takes a request, what a setup keeps and
//! rebuilds, the order of a closure's step (compute, push, reply), what a parameter server's
//! unavailability becomes, what the chief's silence, a retirement, the goodbye and a
//! preemption notice mean, and how far each dataset has been read. No IO, no clock (time is
//! passed in), no actix: the actor and the compute thread are executors of its decisions, and
//! the simulator drives the same machine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort_actors::DeathCause;

use crate::layout::Layout;
use crate::ledger::ClosureId;
use crate::process::{JOB_DONE_EXIT_CODE, PREEMPTED_EXIT_CODE, RETIRED_EXIT_CODE};
use crate::roles::protocol::{
    LeaveAnswer, PsUnavailable, RunClosure, RunClosureError, SetupError, SetupWorker, WorkerRefusal,
};
use crate::roles::push::{plan_push, Gradient, PlannedPush, PushOrigin, PushOutcome};
use crate::roles::worker::StepError;

/// Most elements a worker skips to resume a dataset from a checkpoint position.
pub const SKIP_MAX: u64 = 10_000_000;
/// Jobs that may wait for the compute thread (one closure in flight plus a setup).
pub const JOBS_MAX: usize = 4;

/// The order of setups: (the sending chief's incarnation, the setup's version).
type SetupKey = (u64, u64);

/// A worker incarnation's decisions.
///
/// Calling protocol (the actor and the compute thread share one machine; every call is short
/// and does no IO):
/// 1. [`WorkerMachine::new`] with the worker's index and incarnation.
/// 2. **Admission**, as each request arrives (actor): [`WorkerMachine::admit`]. A refusal is
///    the reply; an admitted job is queued for the compute thread. If the queue turns out to
///    be gone, [`WorkerMachine::handle_job_dropped`] takes the admission back.
/// 3. **Setup or rewind** (compute thread, in queue order): [`WorkerMachine::handle_setup`]
///    validates it and says, per dataset, whether the one held is kept or a new one is built
///    (and how many elements to skip); the executor builds them and calls
///    [`WorkerMachine::handle_setup_built`] with the positions reached, or the error. Only a
///    setup built whole takes effect.
/// 4. **Positions** (compute thread): [`WorkerMachine::handle_positions`].
/// 5. **A closure** (compute thread): [`WorkerMachine::handle_start`] says
///    [`StepAction::Compute`] (run the step function with [`WorkerMachine::layouts`]) or
///    [`StepAction::Reply`]. After the step, [`WorkerMachine::handle_computed`] with its
///    outcome and the datasets' positions says [`StepAction::Push`] (send these planned
///    pushes, all at once, waiting until every one has settled: PS-1) or
///    [`StepAction::Reply`]; after the pushes, [`WorkerMachine::handle_pushed`] with every
///    server's outcome says [`StepAction::Reply`]. The reply ends the job.
/// 6. **Ending** (actor): [`WorkerMachine::handle_retire`], [`WorkerMachine::handle_goodbye`],
///    [`WorkerMachine::handle_chief_lost`], [`WorkerMachine::handle_preemption_notice`] then
///    [`WorkerMachine::handle_leave_answer`] (the chief's answer to the notice) and
///    [`WorkerMachine::handle_preemption_over`]; an [`Exit`] they return is carried out (the
///    process exits with its code), and the first one decided is the only one.
#[derive(Debug)]
pub struct WorkerMachine {
    worker: u32,
    incarnation: u64,
    /// Parameter servers in the cluster: a layout naming another is refused.
    num_servers: u32,
    num_workers: u32,
    layouts: Arc<Layouts>,
    /// The datasets held, with how far each has been read.
    positions: BTreeMap<String, u64>,
    /// A setup took effect.
    set_up: bool,
    /// A setup being built: its workers and layouts, its order key and its restore
    /// generation.
    building: Option<(u32, Layouts, SetupKey, u64)>,
    /// The restore generation of the setup taken: a closure of an earlier one from the same
    /// chief is refused ([`WorkerRefusal::FromOldGeneration`]).
    setup_generation: u64,
    /// The servers (with addresses) the setup being built names.
    building_servers: Vec<(u32, String)>,
    /// Every parameter server of the job with its address, as the last setup taken named
    /// them.
    job_servers: Arc<Vec<(u32, String)>>,
    /// The newest setup taken: a setup ordered before it is refused as outdated.
    setup_taken: Option<SetupKey>,
    /// Jobs admitted and not finished.
    queued: usize,
    step: Option<Step>,
    preempted: bool,
    /// The chief incarnation whose setup this worker took went silent (its failure detector
    /// declared it dead): the worker waits for a newer one to set it up.
    chief_lost: bool,
    exit: Option<Exit>,
}

/// What a step function returned: its encoded value and the gradients it recorded.
pub type Computed = (Vec<u8>, Vec<(String, Gradient<'static>)>);

/// Every variable's layout, by name.
pub type Layouts = BTreeMap<String, Layout>;

/// The closure being run.
#[derive(Debug)]
struct Step {
    origin: PushOrigin,
    /// Per server index, the incarnation the chief named serving ([`RunClosure::servers`]):
    /// each push names its server's ([`PushOrigin::server`]).
    servers: Vec<u64>,
    function: String,
    started: Instant,
    /// When the step function returned, and its value (held while its pushes are out).
    computed: Option<(Instant, Vec<u8>)>,
}

/// A request a worker may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A setup or a rewind.
    Setup,
    /// A closure.
    Run,
    /// Dataset positions.
    Positions,
}

/// What a setup does with one dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetPlan {
    /// Keep the one held, where it is.
    Keep {
        /// The registered dataset function.
        function: String,
    },
    /// Build it afresh and skip `skip` elements (a restored position).
    Build {
        /// The registered dataset function.
        function: String,
        /// Elements to skip.
        skip: u64,
    },
}

/// A setup to carry out: the datasets, in the order named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupPlan {
    /// Workers in the cluster (the number of input pipelines).
    pub num_workers: u32,
    /// Per dataset, kept or built.
    pub datasets: Vec<DatasetPlan>,
}

/// What the compute thread does next for a closure.
#[derive(Debug)]
pub enum StepAction {
    /// Run the step function.
    Compute,
    /// Send these pushes, all at once, and wait for every one to settle.
    Push(Vec<PlannedPush>),
    /// Answer the chief; the job is over. `timing` is (computing, pushing) when the step ran.
    Reply {
        /// The answer.
        result: Result<Vec<u8>, RunClosureError>,
        /// How long the step computed and how long its pushes took.
        timing: Option<(Duration, Duration)>,
    },
}

/// The process ends: its exit code and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The exit code ([`RETIRED_EXIT_CODE`], [`JOB_DONE_EXIT_CODE`] or
    /// [`PREEMPTED_EXIT_CODE`]).
    pub code: i32,
    /// Why, for the log.
    pub reason: String,
}

impl Exit {
    /// The chief retired incarnation `incarnation` while it was alive: exit to be restarted as a
    /// new incarnation ([`RETIRED_EXIT_CODE`]).
    pub fn retired(incarnation: u64) -> Self {
        Exit {
            code: RETIRED_EXIT_CODE,
            reason: format!(
                "the chief fenced this incarnation ({incarnation}) while it was alive: \
                 exiting so that it restarts as a new incarnation"
            ),
        }
    }

    /// The chief said the job is done ([`JOB_DONE_EXIT_CODE`]: not restarted).
    pub fn job_done() -> Self {
        Exit {
            code: JOB_DONE_EXIT_CODE,
            reason: "the chief finished the job: exiting".into(),
        }
    }

    /// Parameter server `ps` refused incarnation `incarnation`'s push as fenced (FENCE-1): exit to
    /// be restarted as a new incarnation ([`RETIRED_EXIT_CODE`]), as when the chief retires
    /// it (a chief that restarted may not know the fence its predecessor set).
    pub fn fenced_by(ps: u32, incarnation: u64) -> Self {
        Exit {
            code: RETIRED_EXIT_CODE,
            reason: format!(
                "ps/{ps} refused a push of this incarnation ({incarnation}) as fenced: \
                 exiting so that it restarts as a new incarnation"
            ),
        }
    }

    /// Incarnation `incarnation` is cut off from parameter server `ps` ([`StepError::CutOff`]):
    /// exit to be restarted as a new incarnation ([`RETIRED_EXIT_CODE`]).
    pub fn cut_off_from(ps: u32, incarnation: u64, reason: &str) -> Self {
        Exit {
            code: RETIRED_EXIT_CODE,
            reason: format!(
                "this incarnation ({incarnation}) is cut off from ps/{ps} ({reason}): exiting so \
                 that it restarts as a new incarnation"
            ),
        }
    }

    /// A stop was requested and the preemption grace is over ([`PREEMPTED_EXIT_CODE`]).
    pub fn preempted() -> Self {
        Exit {
            code: PREEMPTED_EXIT_CODE,
            reason: "stop requested: stopping".into(),
        }
    }
}

impl WorkerMachine {
    /// The machine of worker `worker`'s incarnation `incarnation`, not set up yet.
    pub fn new(worker: u32, incarnation: u64, num_servers: u32) -> Self {
        Self {
            worker,
            incarnation,
            num_servers,
            num_workers: 1,
            layouts: Arc::default(),
            positions: BTreeMap::new(),
            set_up: false,
            building: None,
            setup_generation: 0,
            building_servers: Vec::new(),
            job_servers: Arc::default(),
            setup_taken: None,
            queued: 0,
            step: None,
            preempted: false,
            chief_lost: false,
            exit: None,
        }
    }

    /// Whether to queue `request` for the compute thread. A closure is refused once this
    /// incarnation is ending (retired, or its exit decided); anything is refused when
    /// [`JOBS_MAX`] jobs wait already. A preemption notice refuses nothing: through its grace
    /// the worker still runs the chief's closures (a chief stopping with it finishes its
    /// steps and checkpoints them).
    pub fn admit(&mut self, _now: Instant, request: Request) -> Result<(), WorkerRefusal> {
        if request == Request::Run && self.exit.is_some() {
            return Err(WorkerRefusal::Retired);
        }
        if self.queued >= JOBS_MAX {
            return Err(WorkerRefusal::Busy {
                queued: JOBS_MAX as u32,
            });
        }
        self.queued += 1;
        Ok(())
    }

    /// An admitted job never reached the compute thread (its queue is gone).
    pub fn handle_job_dropped(&mut self) {
        self.queued = self.queued.saturating_sub(1);
    }

    /// Step 3: validates a setup (or a rewind, which rebuilds every dataset) and plans its
    /// datasets. A dataset held already keeps its place unless this is a rewind: a new setup
    /// (another variable, another dataset) must not restart the streams. On an error the job
    /// is over and nothing changed.
    ///
    /// Setups are ordered by the chief incarnation `from_chief` that sent them, then by their
    /// version ([`SetupWorker::version`]): one ordered before the newest taken is refused as
    /// [`SetupError::Outdated`], and the newest taken arriving again (a request sent again)
    /// keeps every dataset where it is instead of rebuilding it.
    pub fn handle_setup(
        &mut self,
        _now: Instant,
        setup: &SetupWorker,
        rewind: bool,
        from_chief: u64,
    ) -> Result<SetupPlan, SetupError> {
        let key = (from_chief, setup.version);
        if let Some(taken) = self.setup_taken.filter(|taken| key < *taken) {
            self.job_done();
            return Err(SetupError::Outdated {
                version: setup.version,
                taken: taken.1,
            });
        }
        // A newer chief than the one lost took this worker back.
        if self.setup_taken.is_none_or(|(chief, _)| from_chief > chief) {
            self.chief_lost = false;
        }
        let rewind = rewind && self.setup_taken != Some(key);
        let num_workers = setup.num_workers;
        let datasets = &setup.datasets;
        // Every server of the job is named with its address (some may have joined since this
        // worker's cluster spec); a layout may place shards on any of them.
        let known_servers = setup
            .servers
            .iter()
            .map(|(ps, _)| ps.saturating_add(1))
            .fold(self.num_servers, u32::max);
        let planned = (|| {
            let layouts = &setup.layouts;
            for layout in layouts {
                layout
                    .validate()
                    .and_then(|()| layout.check_servers(known_servers as usize))
                    .map_err(|e| SetupError::Layouts(e.to_string()))?;
            }
            let datasets = datasets
                .iter()
                .map(|(function, skip)| {
                    if !rewind && self.positions.contains_key(function) {
                        return Ok(DatasetPlan::Keep {
                            function: function.clone(),
                        });
                    }
                    if *skip > SKIP_MAX {
                        return Err(SetupError::SkipTooFar {
                            dataset: function.clone(),
                            skip: *skip,
                            max: SKIP_MAX,
                        });
                    }
                    Ok(DatasetPlan::Build {
                        function: function.clone(),
                        skip: *skip,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let layouts = layouts
                .iter()
                .map(|l| (l.name.clone(), l.clone()))
                .collect();
            Ok((
                SetupPlan {
                    num_workers,
                    datasets,
                },
                layouts,
            ))
        })();
        match planned {
            Ok((plan, layouts)) => {
                self.building = Some((num_workers, layouts, key, setup.generation));
                self.building_servers = setup.servers.clone();
                Ok(plan)
            }
            Err(e) => {
                self.job_done();
                Err(e)
            }
        }
    }

    /// Step 3, after the executor built the plan's datasets: `built` gives every dataset's
    /// position (kept ones where they were), in any order. The setup takes effect only whole;
    /// the datasets held before and not named are dropped. The job is over.
    pub fn handle_setup_built(
        &mut self,
        _now: Instant,
        built: Result<Vec<(String, u64)>, SetupError>,
    ) -> Result<(), SetupError> {
        self.job_done();
        let (num_workers, layouts, key, generation) = self
            .building
            .take()
            .ok_or_else(|| SetupError::Layouts("no setup was being built".into()))?;
        let positions = built?;
        self.setup_taken = Some(key);
        self.setup_generation = generation;
        self.num_workers = num_workers;
        self.layouts = Arc::new(layouts);
        self.job_servers = Arc::new(std::mem::take(&mut self.building_servers));
        self.positions = positions.into_iter().collect();
        self.set_up = true;
        Ok(())
    }

    /// Step 4: how far each dataset has been read (elements, counting those skipped to
    /// resume), for a checkpoint. The job is over.
    pub fn handle_positions(&mut self, _now: Instant) -> Vec<(String, u64)> {
        self.job_done();
        self.positions
            .iter()
            .map(|(name, p)| (name.clone(), *p))
            .collect()
    }

    /// Step 5: a closure reached the compute thread. It runs only on a worker set up and
    /// not retired since it was admitted.
    ///
    /// A closure from an older chief incarnation than the one whose setup this worker took
    /// (sent before that chief died) is refused: it can never commit, and reading its data
    /// would skip that data for the closures that do.
    pub fn handle_start(&mut self, now: Instant, run: &RunClosure, from_chief: u64) -> StepAction {
        let current = self.setup_taken.map_or(0, |(chief, _)| chief);
        let refusal = if self.exit.is_some() {
            Some(WorkerRefusal::Retired)
        } else if !self.set_up {
            Some(WorkerRefusal::NotSetUp)
        } else if from_chief < current {
            Some(WorkerRefusal::FromOldChief {
                chief: from_chief,
                current,
            })
        } else if from_chief == current && run.generation < self.setup_generation {
            // Found by the simulator (seed 5070044 of 5 workers, 3 servers, 10 faults): a
            // closure sent again by the network arrived after a restore's rewind and read data.
            Some(WorkerRefusal::FromOldGeneration {
                generation: run.generation,
                current: self.setup_generation,
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.job_done();
            return StepAction::Reply {
                result: Err(RunClosureError::Refused(refusal)),
                timing: None,
            };
        }
        self.step = Some(Step {
            origin: PushOrigin {
                worker: self.worker,
                incarnation: self.incarnation,
                closure: ClosureId(run.closure),
                attempt: run.attempt,
                part: 0,
                generation: run.generation,
                learning_rate: run.learning_rate,
                server: 0,
            },
            servers: run.servers.clone(),
            function: run.function.clone(),
            started: now,
            computed: None,
        });
        StepAction::Compute
    }

    /// Step 5, after the step function: its value and recorded gradients, or its error, and
    /// every dataset's position now. A parameter server's unavailability is the server's
    /// failure (retryable); any other error is the closure's own. Gradients are planned into
    /// one push per server.
    pub fn handle_computed(
        &mut self,
        now: Instant,
        outcome: Result<Computed, StepError>,
        positions: impl IntoIterator<Item = (String, u64)>,
    ) -> StepAction {
        self.positions.extend(positions);
        let Some(step) = self.step.as_mut() else {
            return self.reply(Err(RunClosureError::Step(
                "no closure is being computed".into(),
            )));
        };
        let (value, gradients) = match outcome {
            Ok(done) => done,
            Err(e) => return self.fail(e),
        };
        step.computed = Some((now, value));
        if gradients.is_empty() {
            return self.handle_pushed(now, Ok(Vec::new()));
        }
        match plan_push(&self.layouts, step.origin, gradients) {
            Ok(plan) if plan.is_empty() => self.handle_pushed(now, Ok(Vec::new())),
            Ok(plan) => StepAction::Push(name_servers(plan, &step.servers)),
            Err(e) => self.fail(e.into()),
        }
    }

    /// Step 5, inside the step function: one of the closure's updates before its last (a
    /// closure of several steps applies each step's gradients as it goes, Keras'
    /// `steps_per_execution`), planned as [`Self::handle_computed`] plans the last, into one
    /// push per server, as the closure's current part.
    pub fn plan_update(
        &self,
        gradients: Vec<(String, Gradient<'static>)>,
    ) -> Result<Vec<PlannedPush>, StepError> {
        let step = self
            .step
            .as_ref()
            .ok_or_else(|| StepError::Step("no closure is being computed".into()))?;
        Ok(name_servers(
            plan_push(&self.layouts, step.origin, gradients)?,
            &step.servers,
        ))
    }

    /// Step 5, inside the step function: the update planned by [`Self::plan_update`] settled
    /// with `outcomes`. Once it took effect at every server (applied, or applied already by
    /// an earlier attempt: PS-1), the closure's next update is the next part. A server that
    /// refused it as fenced cuts this incarnation off (the step's error says so and the
    /// process exits, FENCE-1); one that refused it as stale is that server's failure,
    /// retryable, as for the last push.
    pub fn handle_update_pushed(
        &mut self,
        _now: Instant,
        outcomes: Result<Vec<(u32, PushOutcome)>, StepError>,
    ) -> Result<(), StepError> {
        match push_refusal(&outcomes?) {
            Some(PushRefusal::Fenced(ps)) => {
                // As for the last push: the incarnation is done for (the step fails with it).
                self.decide(Exit::fenced_by(ps, self.incarnation));
                return Err(StepError::CutOff {
                    ps,
                    reason: "it refused an update of this closure as fenced".into(),
                });
            }
            Some(PushRefusal::Stale(ps)) => return Err(stale_push(ps)),
            None => {}
        }
        let step = self
            .step
            .as_mut()
            .ok_or_else(|| StepError::Step("no closure is being computed".into()))?;
        step.origin.part = step.origin.part.saturating_add(1);
        Ok(())
    }

    /// Step 5, once every push sent has settled: each server's outcome, or the calls'
    /// failure. A push refused as stale did not take effect (a fenced incarnation, or a
    /// restore began since the closure was dispatched): never a silent success, but the
    /// server's failure, retryable.
    pub fn handle_pushed(
        &mut self,
        now: Instant,
        outcomes: Result<Vec<(u32, PushOutcome)>, StepError>,
    ) -> StepAction {
        let outcomes = match outcomes {
            Ok(outcomes) => outcomes,
            Err(e) => return self.fail(e),
        };
        match push_refusal(&outcomes) {
            Some(PushRefusal::Fenced(ps)) => {
                // This incarnation is dead to the servers (FENCE-1): the closure runs
                // elsewhere, and the process comes back as a new incarnation.
                self.decide(Exit::fenced_by(ps, self.incarnation));
                return self.reply(Err(RunClosureError::Refused(WorkerRefusal::Fenced)));
            }
            Some(PushRefusal::Stale(ps)) => return self.fail(stale_push(ps)),
            None => {}
        }
        let Some(Step {
            started,
            computed: Some((computed, value)),
            ..
        }) = self.step.take()
        else {
            return self.reply(Err(RunClosureError::Step("no closure was pushing".into())));
        };
        let timing = Some((computed - started, now.saturating_duration_since(computed)));
        self.job_done();
        StepAction::Reply {
            result: Ok(value),
            timing,
        }
    }

    /// Step 6: the chief retired incarnation `incarnation` (it fenced it, or declared it dead,
    /// while it was alive: FENCE-1). This incarnation can do nothing useful any more: it
    /// exits so that its supervisor restarts it as a new one. Another incarnation's
    /// retirement is ignored.
    pub fn handle_retire(&mut self, _now: Instant, incarnation: u64) -> Option<Exit> {
        if incarnation != self.incarnation {
            return None;
        }
        self.decide(Exit::retired(incarnation))
    }

    /// Step 6: the chief says the job is done: exit with success (not restarted).
    pub fn handle_goodbye(&mut self, _now: Instant) -> Option<Exit> {
        self.decide(Exit::job_done())
    }

    /// Step 6: the chief incarnation was declared dead (`cause`: silent past the detection
    /// budget, which this worker's detector tells from its own freeze; its address refusing
    /// connections, as after a SIGKILL; its exit reported by its supervisor). One superseded
    /// by a newer chief is not lost: that chief sets this worker up. A worker told to stop
    /// exits now (the chief's exit is expected). Otherwise it keeps its incarnation and waits
    /// for a new chief incarnation (restarted by its supervisor) to set it up: that chief
    /// restores the servers from its checkpoint and takes this worker back as it is, and
    /// closures of the lost chief are refused from then on (a new chief's setup orders before
    /// them). [`Self::handle_chief_wait_over`] ends the wait.
    pub fn handle_chief_lost(&mut self, _now: Instant, cause: DeathCause) -> Option<Exit> {
        if cause == DeathCause::Superseded {
            return None;
        }
        if self.preempted {
            return self.decide(Exit {
                code: RETIRED_EXIT_CODE,
                reason: "the chief has exited: stopping".into(),
            });
        }
        let how = match cause {
            DeathCause::Silent { silent_for } => format!("has been silent for {silent_for:?}"),
            DeathCause::Refused => "is gone (its address refuses connections)".to_string(),
            DeathCause::Reported => "has exited, as its supervisor reported".to_string(),
            DeathCause::Superseded => "was superseded".to_string(),
        };
        tracing::warn!("the chief {how}: waiting for a new chief incarnation");
        self.chief_lost = true;
        None
    }

    /// Step 6: no chief has answered this worker within `waited` (its `worker_wait`) of its
    /// start, so none set it up: it exits to be restarted as a new incarnation (code
    /// [`RETIRED_EXIT_CODE`]) rather than wait for a chief that may never start.
    pub fn handle_no_chief(&mut self, _now: Instant, waited: Duration) -> Option<Exit> {
        if self.setup_taken.is_some() || self.building.is_some() {
            return None;
        }
        self.decide(Exit {
            code: RETIRED_EXIT_CODE,
            reason: format!(
                "no chief answered within {waited:?} of this worker's start: exiting so that it \
                 restarts as a new incarnation"
            ),
        })
    }

    /// Step 6: the wait for a new chief that began with [`Self::handle_chief_lost`] is over
    /// (`waited`: the worker's `worker_wait`). If no newer chief set this worker up meanwhile,
    /// exit to be restarted as a new incarnation, which registers with whichever chief comes.
    pub fn handle_chief_wait_over(&mut self, _now: Instant, waited: Duration) -> Option<Exit> {
        if !self.chief_lost {
            return None;
        }
        self.decide(Exit {
            code: RETIRED_EXIT_CODE,
            reason: format!(
                "no new chief set this worker up within {waited:?} of losing its chief: exiting \
                 so that it restarts as a new incarnation"
            ),
        })
    }

    /// Step 6: a preemption notice (SIGTERM). The worker keeps serving the chief through its
    /// grace (closures included, so that a chief stopping with it can finish its steps and
    /// checkpoint them); the chief's loss then reads as expected.
    pub fn handle_preemption_notice(&mut self, _now: Instant) {
        self.preempted = true;
    }

    /// Step 6: the chief's answer to this incarnation's preemption notice
    /// ([`crate::roles::protocol::Leaving`]): told to go, it stops now (the chief fenced it and
    /// runs its closures elsewhere); told to stay, it serves on through its grace.
    pub fn handle_leave_answer(&mut self, _now: Instant, answer: LeaveAnswer) -> Option<Exit> {
        match answer {
            LeaveAnswer::Go => self.decide(Exit {
                code: PREEMPTED_EXIT_CODE,
                reason: "preempted: left at once; the chief runs this worker's closures \
                         elsewhere"
                    .into(),
            }),
            LeaveAnswer::Stay => None,
        }
    }

    /// Step 6: this worker was drained out of the job (scaled down): its last closure
    /// finished and the chief kept its dataset positions (or the chief could not be asked):
    /// exit with success, which its supervisor does not restart; the datasets close with it.
    pub fn handle_drained(&mut self, _now: Instant, chief_answered: bool) -> Option<Exit> {
        let reason = if chief_answered {
            "drained: the chief let this worker's last closure finish and kept its dataset \
             positions; leaving the job"
        } else {
            "drained without the chief's answer (its closure, if any, runs elsewhere); \
             leaving the job"
        };
        self.decide(Exit {
            code: JOB_DONE_EXIT_CODE,
            reason: reason.into(),
        })
    }

    /// Step 6: the chief is gone or the preemption grace has passed: stop.
    pub fn handle_preemption_over(&mut self, _now: Instant) -> Option<Exit> {
        self.decide(Exit::preempted())
    }

    /// Every parameter server of the job with the `host:port` it serves on, as the last setup
    /// taken named them (servers may have joined since this worker's cluster spec).
    pub fn job_servers(&self) -> Arc<Vec<(u32, String)>> {
        Arc::clone(&self.job_servers)
    }

    /// Every variable's layout, as the last setup gave them (what a step reads and pushes),
    /// shared: a step holds them while the machine goes on deciding.
    pub fn layouts(&self) -> Arc<Layouts> {
        Arc::clone(&self.layouts)
    }

    /// Workers in the cluster, as the last setup said.
    pub fn num_workers(&self) -> u32 {
        self.num_workers
    }

    /// The worker's index.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// Who pushes for the closure being run, and for which attempt (none between closures).
    pub fn current_origin(&self) -> Option<PushOrigin> {
        self.step.as_ref().map(|s| s.origin)
    }

    /// Whether a preemption notice came.
    pub fn preempted(&self) -> bool {
        self.preempted
    }

    /// The exit decided, if any.
    pub fn exit(&self) -> Option<&Exit> {
        self.exit.as_ref()
    }

    fn decide(&mut self, exit: Exit) -> Option<Exit> {
        if self.exit.is_some() {
            return None;
        }
        // After a notice, an incarnation the chief fenced or retired (it took the notice and
        // runs this worker's closures elsewhere, and a push in flight meanwhile is refused)
        // or whose chief went away leaves as preempted, not as a failure: its supervisor
        // restarts it without counting a crash.
        let exit = if self.preempted && exit.code == RETIRED_EXIT_CODE {
            Exit {
                code: PREEMPTED_EXIT_CODE,
                reason: format!("preempted, and {}", exit.reason),
            }
        } else {
            exit
        };
        self.exit = Some(exit.clone());
        Some(exit)
    }

    fn job_done(&mut self) {
        self.queued = self.queued.saturating_sub(1);
    }

    /// The closure failed: the server's failure when one was unavailable, else its own.
    fn fail(&mut self, error: StepError) -> StepAction {
        let function = self
            .step
            .as_ref()
            .map(|s| s.function.clone())
            .unwrap_or_default();
        if let StepError::CutOff { ps, reason } = &error {
            // As when a server refuses a push as fenced: the closure runs elsewhere, and the
            // process comes back as a new incarnation.
            self.decide(Exit::cut_off_from(*ps, self.incarnation, reason));
            return self.reply(Err(RunClosureError::Refused(WorkerRefusal::Fenced)));
        }
        self.reply(Err(match error {
            StepError::PsUnavailable(unavailable) => RunClosureError::PsUnavailable(unavailable),
            e => RunClosureError::Step(format!("{function}: {e}")),
        }))
    }

    fn reply(&mut self, result: Result<Vec<u8>, RunClosureError>) -> StepAction {
        self.step = None;
        self.job_done();
        StepAction::Reply {
            result,
            timing: None,
        }
    }
}

/// Why a push did not take effect at every server it went to.
enum PushRefusal {
    /// A server refused it as coming from a fenced incarnation (FENCE-1).
    Fenced(u32),
    /// A server refused it as stale: a restore began since the closure was dispatched.
    Stale(u32),
}

/// The refusal among a push's settled `outcomes`, fenced ones first; `None` if it took effect
/// everywhere (applied, or applied already by an earlier attempt: PS-1).
fn push_refusal(outcomes: &[(u32, PushOutcome)]) -> Option<PushRefusal> {
    if let Some((ps, _)) = outcomes.iter().find(|(_, o)| *o == PushOutcome::Fenced) {
        return Some(PushRefusal::Fenced(*ps));
    }
    outcomes
        .iter()
        .find(|(_, o)| !o.took_effect())
        .map(|(ps, _)| PushRefusal::Stale(*ps))
}

/// A push refused as stale by server `ps`: that server's failure, retryable.
fn stale_push(ps: u32) -> StepError {
    StepError::PsUnavailable(PsUnavailable {
        ps,
        reason: "the push was refused as stale (a fenced incarnation, or a parameter-server \
                 restore began since the closure was dispatched)"
            .into(),
    })
}

/// `plan` with each push naming the incarnation of its server that the chief named serving
/// (`servers`, by server index; 0 where it named none).
fn name_servers(mut plan: Vec<PlannedPush>, servers: &[u64]) -> Vec<PlannedPush> {
    for planned in &mut plan {
        planned.push.origin.server = servers.get(planned.ps as usize).copied().unwrap_or(0);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Dtype, Shard};
    use crate::roles::push::LearningRate;

    /// A chief declared dead after `secs` seconds of silence.
    fn silent(secs: u64) -> DeathCause {
        DeathCause::Silent {
            silent_for: Duration::from_secs(secs),
        }
    }

    fn now() -> Instant {
        Instant::now()
    }

    fn setup(datasets: &[(&str, u64)]) -> SetupWorker {
        let layouts = vec![Layout {
            name: "w".into(),
            dtype: Dtype::F32,
            shape: vec![4],
            shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..4 }],
        }];
        // Each setup a test builds is newer than the one before.
        static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SetupWorker {
            num_workers: 2,
            version: VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            layouts,
            servers: Vec::new(),
            datasets: datasets.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            generation: 3,
        }
    }

    fn run(closure: u64) -> RunClosure {
        RunClosure {
            closure,
            attempt: 2,
            generation: 3,
            function: "train".into(),
            args: Vec::new(),
            servers: Vec::new(),
            learning_rate: LearningRate::new(0.5),
        }
    }

    /// A machine set up with `datasets` built at their skips.
    fn ready(datasets: &[(&str, u64)]) -> WorkerMachine {
        let mut m = WorkerMachine::new(1, 7, 2);
        m.admit(now(), Request::Setup).unwrap();
        let plan = m.handle_setup(now(), &setup(datasets), false, 1).unwrap();
        let built = plan
            .datasets
            .iter()
            .map(|d| match d {
                DatasetPlan::Build { function, skip } => (function.clone(), *skip),
                DatasetPlan::Keep { .. } => panic!("nothing is held yet"),
            })
            .collect();
        m.handle_setup_built(now(), Ok(built)).unwrap();
        m
    }

    fn started(m: &mut WorkerMachine, closure: u64) {
        m.admit(now(), Request::Run).unwrap();
        assert!(matches!(
            m.handle_start(now(), &run(closure), 1),
            StepAction::Compute
        ));
    }

    fn reply(action: StepAction) -> Result<Vec<u8>, RunClosureError> {
        match action {
            StepAction::Reply { result, .. } => result,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn admission_is_bounded_and_a_job_taken_back_frees_its_place() {
        let mut m = WorkerMachine::new(0, 1, 2);
        for _ in 0..JOBS_MAX {
            m.admit(now(), Request::Run).unwrap();
        }
        assert_eq!(
            m.admit(now(), Request::Setup),
            Err(WorkerRefusal::Busy {
                queued: JOBS_MAX as u32
            })
        );
        m.handle_job_dropped();
        assert_eq!(m.admit(now(), Request::Positions), Ok(()));
    }

    #[test]
    fn a_closure_before_any_setup_is_refused_as_not_set_up() {
        let mut m = WorkerMachine::new(0, 1, 2);
        m.admit(now(), Request::Run).unwrap();
        assert_eq!(
            reply(m.handle_start(now(), &run(1), 1)),
            Err(RunClosureError::Refused(WorkerRefusal::NotSetUp))
        );
        // The refusal ended the job: the queue is empty again.
        for _ in 0..JOBS_MAX {
            m.admit(now(), Request::Run).unwrap();
        }
    }

    #[test]
    fn a_setup_keeps_the_datasets_held_and_a_rewind_rebuilds_them() {
        let mut m = ready(&[("a", 5)]);
        m.admit(now(), Request::Setup).unwrap();
        let plan = m
            .handle_setup(now(), &setup(&[("a", 0), ("b", 3)]), false, 1)
            .unwrap();
        assert_eq!(
            plan.datasets,
            vec![
                DatasetPlan::Keep {
                    function: "a".into()
                },
                DatasetPlan::Build {
                    function: "b".into(),
                    skip: 3
                }
            ]
        );
        m.handle_setup_built(now(), Ok(vec![("a".into(), 5), ("b".into(), 3)]))
            .unwrap();
        m.admit(now(), Request::Setup).unwrap();
        let plan = m.handle_setup(now(), &setup(&[("a", 2)]), true, 1).unwrap();
        assert_eq!(
            plan.datasets,
            vec![DatasetPlan::Build {
                function: "a".into(),
                skip: 2
            }]
        );
        m.handle_setup_built(now(), Ok(vec![("a".into(), 2)]))
            .unwrap();
        m.admit(now(), Request::Positions).unwrap();
        // "b" was not named: dropped.
        assert_eq!(m.handle_positions(now()), vec![("a".to_string(), 2)]);
    }

    #[test]
    fn a_bad_setup_is_a_typed_error_and_the_previous_setup_stays() {
        let mut m = ready(&[("a", 1)]);
        m.admit(now(), Request::Setup).unwrap();
        let err = m
            .handle_setup(now(), &setup(&[("b", SKIP_MAX + 1)]), false, 1)
            .unwrap_err();
        assert_eq!(
            err,
            SetupError::SkipTooFar {
                dataset: "b".into(),
                skip: SKIP_MAX + 1,
                max: SKIP_MAX
            }
        );
        assert!(err.to_string().contains("cannot resume"), "{err}");
        let mut bad = setup(&[]);
        // A shard on a server the cluster does not have.
        bad.layouts[0].shards[1].ps = 2;
        m.admit(now(), Request::Setup).unwrap();
        assert!(matches!(
            m.handle_setup(now(), &bad, false, 1),
            Err(SetupError::Layouts(_))
        ));
        // A build that fails changes nothing either.
        m.admit(now(), Request::Setup).unwrap();
        m.handle_setup(now(), &setup(&[("c", 0)]), false, 1)
            .unwrap();
        let failed = SetupError::UnknownDataset("c".into());
        assert_eq!(
            m.handle_setup_built(now(), Err(failed.clone())),
            Err(failed)
        );
        m.admit(now(), Request::Positions).unwrap();
        assert_eq!(m.handle_positions(now()), vec![("a".to_string(), 1)]);
        assert_eq!(m.layouts().len(), 1);
    }

    /// A closure of several steps: each update inside the step is planned as the closure's
    /// current part and, once it took effect everywhere (applied, or applied already by an
    /// earlier attempt), the next is the next part; the last push at the end is the last part.
    /// A stale refusal fails the step as that server's failure; a fenced one cuts it off.
    #[test]
    fn updates_inside_a_step_are_the_closures_parts_in_order() {
        let mut m = ready(&[("a", 0)]);
        started(&mut m, 9);
        let gradients = || vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let plan = m.plan_update(gradients()).unwrap();
        assert!(plan.iter().all(|p| p.push.origin.part == 0));
        m.handle_update_pushed(
            now(),
            Ok(vec![(0, PushOutcome::Applied), (1, PushOutcome::Duplicate)]),
        )
        .unwrap();
        assert_eq!(m.current_origin().map(|o| o.part), Some(1));
        let stale = m.handle_update_pushed(now(), Ok(vec![(0, PushOutcome::Stale)]));
        assert!(
            matches!(stale, Err(StepError::PsUnavailable(_))),
            "{stale:?}"
        );
        assert_eq!(m.current_origin().map(|o| o.part), Some(1));
        let fenced = m.handle_update_pushed(now(), Ok(vec![(1, PushOutcome::Fenced)]));
        assert!(
            matches!(fenced, Err(StepError::CutOff { ps: 1, .. })),
            "{fenced:?}"
        );
        let action = m.handle_computed(now(), Ok((Vec::new(), gradients())), []);
        let StepAction::Push(plan) = action else {
            panic!("expected pushes, got {action:?}");
        };
        assert!(plan.iter().all(|p| p.push.origin.part == 1));
    }

    #[test]
    fn a_step_computes_pushes_one_message_per_server_then_replies_its_value() {
        let mut m = ready(&[("a", 0)]);
        started(&mut m, 9);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let action = m.handle_computed(
            now(),
            Ok((b"value".to_vec(), gradients)),
            [("a".to_string(), 4)],
        );
        let StepAction::Push(plan) = action else {
            panic!("expected pushes, got {action:?}");
        };
        assert_eq!(plan.iter().map(|p| p.ps).collect::<Vec<_>>(), [0, 1]);
        let origin = plan[0].push.origin;
        assert_eq!(
            origin,
            PushOrigin {
                worker: 1,
                incarnation: 7,
                closure: ClosureId(9),
                attempt: 2,
                part: 0,
                generation: 3,
                learning_rate: LearningRate::new(0.5),
                server: 0,
            }
        );
        let action = m.handle_pushed(
            now(),
            Ok(vec![(0, PushOutcome::Applied), (1, PushOutcome::Duplicate)]),
        );
        let StepAction::Reply { result, timing } = action else {
            panic!("expected a reply, got {action:?}");
        };
        assert_eq!(result, Ok(b"value".to_vec()));
        assert!(timing.is_some());
        m.admit(now(), Request::Positions).unwrap();
        assert_eq!(m.handle_positions(now()), vec![("a".to_string(), 4)]);
    }

    #[test]
    fn ledger_1_a_push_refused_as_stale_is_the_servers_unavailability_never_a_success() {
        let mut m = ready(&[]);
        started(&mut m, 1);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let action = m.handle_computed(now(), Ok((Vec::new(), gradients)), []);
        assert!(matches!(action, StepAction::Push(_)));
        let result = reply(m.handle_pushed(
            now(),
            Ok(vec![(0, PushOutcome::Applied), (1, PushOutcome::Stale)]),
        ));
        assert!(
            matches!(result, Err(RunClosureError::PsUnavailable(ref u)) if u.ps == 1),
            "{result:?}"
        );
    }

    /// A worker cut off from a server (its gateway declared the incarnation the chief names
    /// dead) answers as a fenced worker does, and exits to come back as a new incarnation.
    #[test]
    fn a_worker_cut_off_from_a_server_ends_its_incarnation() {
        let mut m = ready(&[]);
        started(&mut m, 1);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let action = m.handle_computed(now(), Ok((Vec::new(), gradients)), []);
        assert!(matches!(action, StepAction::Push(_)));
        let cut = StepError::CutOff {
            ps: 1,
            reason: "declared dead here".into(),
        };
        let result = reply(m.handle_pushed(now(), Err(cut)));
        assert_eq!(result, Err(RunClosureError::Refused(WorkerRefusal::Fenced)));
        let exit = m.exit().expect("it exits");
        assert_eq!(exit.code, RETIRED_EXIT_CODE);
        assert!(exit.reason.contains("cut off from ps/1"), "{}", exit.reason);
    }

    /// FENCE-1 across a chief restart: a server that fenced this incarnation refuses its
    /// push as fenced (the new chief may not know that fence); the worker answers with a
    /// refusal the chief treats as a lost worker (the closure runs elsewhere) and exits to
    /// come back as a new incarnation.
    #[test]
    fn fence_1_a_push_refused_as_fenced_ends_the_incarnation() {
        let mut m = ready(&[]);
        started(&mut m, 1);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let action = m.handle_computed(now(), Ok((Vec::new(), gradients)), []);
        assert!(matches!(action, StepAction::Push(_)));
        let result = reply(m.handle_pushed(
            now(),
            Ok(vec![(0, PushOutcome::Applied), (1, PushOutcome::Fenced)]),
        ));
        assert_eq!(result, Err(RunClosureError::Refused(WorkerRefusal::Fenced)));
        let exit = m.exit().expect("it exits");
        assert_eq!(exit.code, RETIRED_EXIT_CODE);
        assert!(exit.reason.contains("ps/1"), "{}", exit.reason);

        // The same refusal after a preemption notice (the chief fenced the worker on its
        // notice while a push was in flight): it leaves as preempted.
        let mut m = ready(&[]);
        started(&mut m, 1);
        m.handle_preemption_notice(now());
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        let _ = m.handle_computed(now(), Ok((Vec::new(), gradients)), []);
        let result = reply(m.handle_pushed(now(), Ok(vec![(0, PushOutcome::Fenced)])));
        assert_eq!(result, Err(RunClosureError::Refused(WorkerRefusal::Fenced)));
        let exit = m.exit().expect("it exits");
        assert_eq!(exit.code, PREEMPTED_EXIT_CODE);
        assert!(
            exit.reason.starts_with("preempted, and ps/0"),
            "{}",
            exit.reason
        );
    }

    #[test]
    fn a_servers_unavailability_is_retryable_and_any_other_error_is_the_closures() {
        let mut m = ready(&[]);
        started(&mut m, 1);
        let unavailable = PsUnavailable {
            ps: 1,
            reason: "timeout".into(),
        };
        assert_eq!(
            reply(m.handle_computed(
                now(),
                Err(StepError::PsUnavailable(unavailable.clone())),
                []
            )),
            Err(RunClosureError::PsUnavailable(unavailable.clone()))
        );
        started(&mut m, 2);
        assert_eq!(
            reply(m.handle_computed(now(), Err(StepError::Step("bad batch".into())), [])),
            Err(RunClosureError::Step("train: bad batch".into()))
        );
        // A gradient the layouts cannot route is the closure's error; nothing is pushed.
        started(&mut m, 3);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 3].into()))];
        let result = reply(m.handle_computed(now(), Ok((Vec::new(), gradients)), []));
        assert!(
            matches!(result, Err(RunClosureError::Step(ref e)) if e.contains("has 3 values")),
            "{result:?}"
        );
        // A push the servers could not all take.
        started(&mut m, 4);
        let gradients = vec![("w".to_string(), Gradient::Dense(vec![1.0; 4].into()))];
        assert!(matches!(
            m.handle_computed(now(), Ok((Vec::new(), gradients)), []),
            StepAction::Push(_)
        ));
        assert_eq!(
            reply(m.handle_pushed(now(), Err(StepError::PsUnavailable(unavailable.clone())))),
            Err(RunClosureError::PsUnavailable(unavailable))
        );
        // A step with no gradient replies at once.
        started(&mut m, 5);
        assert_eq!(
            reply(m.handle_computed(now(), Ok((vec![1], Vec::new())), [])),
            Ok(vec![1])
        );
    }

    #[test]
    fn exits_keep_their_codes_and_only_the_first_is_decided() {
        let mut m = WorkerMachine::new(0, 4, 2);
        assert_eq!(m.handle_retire(now(), 3), None);
        let exit = m.handle_retire(now(), 4).unwrap();
        assert_eq!(exit.code, RETIRED_EXIT_CODE);
        assert!(exit.reason.contains("incarnation (4)"), "{}", exit.reason);
        assert_eq!(m.handle_goodbye(now()), None);
        // Retired: a closure is refused, at admission and at the compute thread alike.
        assert_eq!(m.admit(now(), Request::Run), Err(WorkerRefusal::Retired));

        let mut m = WorkerMachine::new(0, 1, 2);
        assert_eq!(m.handle_goodbye(now()).unwrap().code, JOB_DONE_EXIT_CODE);

        // A lost chief is waited for: a newer chief's setup takes the worker back; with none
        // within the wait, it exits to be restarted.
        let mut m = ready(&[]);
        assert_eq!(m.handle_chief_lost(now(), silent(3)), None);
        let exit = m
            .handle_chief_wait_over(now(), Duration::from_secs(60))
            .unwrap();
        assert_eq!(exit.code, RETIRED_EXIT_CODE);
        assert!(exit.reason.contains("no new chief"), "{}", exit.reason);
        // SIGKILLed (its address refuses) or its exit reported: lost the same way. Superseded
        // by a newer chief: not lost.
        for cause in [DeathCause::Refused, DeathCause::Reported] {
            let mut m = ready(&[]);
            assert_eq!(m.handle_chief_lost(now(), cause), None);
            let exit = m.handle_chief_wait_over(now(), Duration::from_secs(60));
            assert_eq!(exit.map(|e| e.code), Some(RETIRED_EXIT_CODE), "{cause:?}");
        }
        let mut m = ready(&[]);
        assert_eq!(m.handle_chief_lost(now(), DeathCause::Superseded), None);
        assert_eq!(
            m.handle_chief_wait_over(now(), Duration::from_secs(60)),
            None
        );
        // No chief at all within the wait: exit to be restarted; once set up, never.
        let mut fresh = WorkerMachine::new(0, 1, 2);
        let exit = fresh
            .handle_no_chief(now(), Duration::from_secs(3))
            .unwrap();
        assert_eq!(exit.code, RETIRED_EXIT_CODE);
        assert!(exit.reason.contains("no chief answered"), "{}", exit.reason);
        assert_eq!(
            ready(&[]).handle_no_chief(now(), Duration::from_secs(3)),
            None
        );

        let mut m = ready(&[]);
        assert_eq!(m.handle_chief_lost(now(), silent(3)), None);
        let newer_chief = 2;
        m.handle_setup(now(), &setup(&[]), true, newer_chief)
            .unwrap();
        assert_eq!(
            m.handle_chief_wait_over(now(), Duration::from_secs(60)),
            None
        );

        let mut m = ready(&[]);
        m.handle_preemption_notice(now());
        // It keeps serving the chief through its grace: closures and positions are taken.
        assert_eq!(m.admit(now(), Request::Run), Ok(()));
        assert_eq!(m.admit(now(), Request::Positions), Ok(()));
        let mut lost = WorkerMachine::new(0, 1, 2);
        lost.handle_preemption_notice(now());
        let exit = lost.handle_chief_lost(now(), silent(1)).unwrap();
        assert!(
            exit.reason.contains("the chief has exited"),
            "{}",
            exit.reason
        );
        assert_eq!(exit.code, PREEMPTED_EXIT_CODE);
        // Told to stay (the chief stops too), it serves on; the grace's end stops it.
        assert_eq!(m.handle_leave_answer(now(), LeaveAnswer::Stay), None);
        assert_eq!(
            m.handle_preemption_over(now()).unwrap().code,
            PREEMPTED_EXIT_CODE
        );
        // Told to go, it stops at once, with the preemption's code.
        let mut leaving = ready(&[]);
        leaving.handle_preemption_notice(now());
        let exit = leaving.handle_leave_answer(now(), LeaveAnswer::Go).unwrap();
        assert_eq!(exit.code, PREEMPTED_EXIT_CODE);
        assert!(exit.reason.contains("left at once"), "{}", exit.reason);
        assert_eq!(leaving.handle_preemption_over(now()), None, "decided once");
    }

    /// A setup overtaken by a newer one (a delayed request on another stream) never undoes
    /// it: an older version from the same chief is refused as outdated, the newest taken
    /// arriving again keeps every dataset where it is, and a newer chief incarnation's setup
    /// is taken whatever its version.
    #[test]
    fn a_delayed_older_setup_never_undoes_a_newer_one() {
        let mut m = WorkerMachine::new(0, 1, 2);
        let mut old = setup(&[("a", 0)]);
        old.version = 4;
        let mut rewind = setup(&[("a", 12)]);
        rewind.version = 5;
        m.admit(now(), Request::Setup).unwrap();
        let plan = m.handle_setup(now(), &rewind, true, 1).unwrap();
        assert_eq!(
            plan.datasets,
            vec![DatasetPlan::Build {
                function: "a".into(),
                skip: 12
            }]
        );
        m.handle_setup_built(now(), Ok(vec![("a".into(), 12)]))
            .unwrap();
        // The older setup, delivered late: refused, nothing changes.
        m.admit(now(), Request::Setup).unwrap();
        let err = m.handle_setup(now(), &old, true, 1).unwrap_err();
        assert_eq!(
            err,
            SetupError::Outdated {
                version: 4,
                taken: 5
            }
        );
        assert!(err.to_string().contains("older than version 5"), "{err}");
        // The same rewind again: kept where it is (reads since are not undone).
        m.admit(now(), Request::Setup).unwrap();
        let plan = m.handle_setup(now(), &rewind, true, 1).unwrap();
        assert_eq!(
            plan.datasets,
            vec![DatasetPlan::Keep {
                function: "a".into()
            }]
        );
        m.handle_setup_built(now(), Ok(vec![("a".into(), 15)]))
            .unwrap();
        // A new chief incarnation counts its versions afresh: its setup is taken.
        m.admit(now(), Request::Setup).unwrap();
        let plan = m.handle_setup(now(), &old, true, 2).unwrap();
        assert_eq!(
            plan.datasets,
            vec![DatasetPlan::Build {
                function: "a".into(),
                skip: 0
            }]
        );
    }

    /// A closure sent by a chief incarnation older than the one whose setup the worker took
    /// (in flight when that chief died) is refused without reading any data: it can never
    /// commit, and the new chief's closures must find the data where its setup put it.
    #[test]
    fn a_closure_from_an_older_chief_is_refused_without_reading() {
        let mut m = WorkerMachine::new(0, 1, 2);
        m.admit(now(), Request::Setup).unwrap();
        m.handle_setup(now(), &setup(&[("a", 26)]), true, 2)
            .unwrap();
        m.handle_setup_built(now(), Ok(vec![("a".into(), 26)]))
            .unwrap();
        m.admit(now(), Request::Run).unwrap();
        assert_eq!(
            reply(m.handle_start(now(), &run(112), 1)),
            Err(RunClosureError::Refused(WorkerRefusal::FromOldChief {
                chief: 1,
                current: 2
            }))
        );
        m.admit(now(), Request::Run).unwrap();
        assert!(matches!(
            m.handle_start(now(), &run(113), 2),
            StepAction::Compute
        ));
    }

    /// A closure of an earlier restore generation (sent before a restore, delivered again
    /// after its rewind) reads nothing: it can never commit.
    #[test]
    fn a_closure_of_an_earlier_restore_generation_is_refused_without_reading() {
        let mut m = ready(&[("a", 26)]);
        let before = m.handle_positions(now());
        m.admit(now(), Request::Run).unwrap();
        let stale = RunClosure {
            generation: 2,
            ..run(114)
        };
        assert_eq!(
            reply(m.handle_start(now(), &stale, 1)),
            Err(RunClosureError::Refused(WorkerRefusal::FromOldGeneration {
                generation: 2,
                current: 3
            }))
        );
        m.admit(now(), Request::Positions).unwrap();
        assert_eq!(m.handle_positions(now()), before);
        // Of the setup's generation, or from a newer chief, it runs.
        m.admit(now(), Request::Run).unwrap();
        assert!(matches!(
            m.handle_start(now(), &run(115), 1),
            StepAction::Compute
        ));
    }
}
