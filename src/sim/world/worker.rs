//! The workers: each one's real machine ([`WorkerMachine`], with the real push planner), the
//! simulator standing in for its actor and its compute thread: requests are admitted and
//! queued as the real worker queues them, a step computes for a drawn time and reads one
//! element of its dataset (DATA-1 checks the first read after a setup), and its pushes go to
//! the servers, bounded in time.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::Rng;

use super::super::{Node, SimConfig, EXTRA_SERVERS_MAX};
use super::job::{gradient, variable, DATASET};
use super::network::{Msg, Req, Resp, RunResult, HOLD_RETRY};
use super::{Event, ProcState, World};
use crate::roles::protocol::{
    PsUnavailable, RunClosure, RunClosureError, SetupWorker, WorkerRefusal,
};
use crate::roles::ps::{Gradient, PushOutcome};
use crate::roles::push::PlannedPush;
use crate::roles::worker::{DatasetPlan, Request, StepAction, StepError, WorkerMachine};

/// A worker process: its real machine ([`WorkerMachine`]), the simulator standing in for
/// its actor and compute thread.
pub(super) struct WorkerProc {
    pub(super) incarnation: u64,
    pub(super) state: ProcState,
    pub(super) machine: WorkerMachine,
    /// The closure on the compute thread.
    pub(super) run: Option<WorkerRun>,
    /// Jobs admitted and waiting for the compute thread, in order (a setup or a positions
    /// request queues behind the closures admitted before it, as on the real worker).
    pub(super) waiting: std::collections::VecDeque<(u64, Job)>,
    /// Its dataset's position: elements read (each closure it runs reads one).
    pub(super) position: u64,
    /// Set up or rewound and nothing read since (DATA-1 checks its first read).
    pub(super) fresh: bool,
    /// Drained out of the job: down until the job is scaled up again.
    pub(super) drained: bool,
    /// Its position at the last answer to the chief's drain read since the newest restore;
    /// kept once the drain finished (DATA-1 for a worker that rejoins).
    pub(super) drain_read: Option<u64>,
    /// The position the chief keeps for it since it was drained (none once a restore put
    /// every worker at a checkpoint's positions).
    pub(super) kept: Option<u64>,
}

impl WorkerProc {
    /// Worker `w` at the job's start: its first incarnation, up, at the start of its dataset.
    pub(super) fn new(w: u32, config: &SimConfig) -> Self {
        Self {
            incarnation: 1,
            state: ProcState::Up,
            machine: WorkerMachine::new(w, 1, config.num_ps + EXTRA_SERVERS_MAX),
            run: None,
            waiting: Default::default(),
            position: 0,
            fresh: false,
            drained: false,
            drain_read: None,
            kept: None,
        }
    }

    /// Worker `w` past the cluster spec at the job's start: not started, out of the job (as a
    /// drained one is) until it joins ([`super::super::Fault::WorkerJoin`]).
    pub(super) fn not_started(w: u32, config: &SimConfig) -> Self {
        Self {
            incarnation: 0,
            state: ProcState::Down,
            drained: true,
            ..Self::new(w, config)
        }
    }
}

/// A job for a worker's compute thread, as the real worker queues them (`WorkerJob`).
pub(super) enum Job {
    /// A closure, and the incarnation of the chief that sent it.
    Run(RunClosure, u64),
    /// A setup (a new incarnation's, or a rewind: `rewind`) or a new configuration.
    Setup {
        setup: SetupWorker,
        rewind: bool,
        from_chief: u64,
    },
    Positions,
}

/// The closure on the compute thread: computing, then its pushes out.
pub(super) struct WorkerRun {
    pub(super) call: u64,
    /// Servers whose push has not settled yet.
    pub(super) pending: BTreeSet<u32>,
    /// The servers' answers so far.
    pub(super) answered: Vec<(u32, PushOutcome)>,
    /// A server found unavailable (the first, by index).
    pub(super) unavailable: Option<u32>,
}

impl World<'_> {
    /// A message reaches worker `w`, as its actor takes it.
    pub(super) fn worker_receive(&mut self, w: u32, msg: Msg) {
        let node = Node::Worker(w);
        let now = self.instant();
        match msg {
            Msg::Drained
                if self.workers[w as usize]
                    .machine
                    .handle_drained(now, true)
                    .is_some() =>
            {
                // It exits 0 and is not restarted: out of the job for good.
                self.set_state(node, ProcState::Down);
                let worker = &mut self.workers[w as usize];
                worker.run = None;
                worker.waiting.clear();
                worker.drained = true;
                worker.kept = worker.drain_read;
            }
            Msg::LeaveAnswer(answer) => {
                let exit = self.workers[w as usize]
                    .machine
                    .handle_leave_answer(now, answer);
                if exit.is_some() {
                    // It exits (143); its supervisor restarts it as a new incarnation.
                    self.kill(node);
                }
            }
            Msg::Request { call, req } => self.worker_request(w, call, req),
            Msg::PushReply { ps, run, result } => {
                let incarnation = self.workers[w as usize].incarnation;
                self.push_answered(w, incarnation, run, ps, result)
            }
            _ => {}
        }
    }

    /// The step computed: its gradient for every server's variable goes to the machine, which
    /// plans the pushes; each goes out bounded in time.
    pub(super) fn computed(&mut self, w: u32, incarnation: u64, run: u64) {
        let worker = &self.workers[w as usize];
        if worker.incarnation != incarnation || worker.state == ProcState::Down {
            return;
        }
        if worker.state == ProcState::Paused {
            // A paused process computes nothing: its step goes on once it runs again.
            let event = Event::Computed {
                worker: w,
                incarnation,
                run,
            };
            self.at(self.now + HOLD_RETRY, event);
            return;
        }
        if worker.run.as_ref().is_none_or(|r| r.call != run) {
            return;
        }
        let Some(closure) = worker
            .machine
            .current_origin()
            .map(|origin| origin.closure.0)
        else {
            return;
        };
        let gradients = (0..self.config.num_ps)
            .map(|ps| (variable(ps), Gradient::Dense(gradient(closure).into())))
            .collect();
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        let positions = vec![(DATASET.to_string(), worker.position)];
        let action = worker
            .machine
            .handle_computed(now, Ok((Vec::new(), gradients)), positions);
        self.carry_out(w, run, action);
    }

    /// One server answered (or its push timed out: `None`); once every push settled, the
    /// machine says what the closure's outcome is (a server unreachable, refusing, or
    /// answering stale makes it `PsUnavailable`, retryable).
    pub(super) fn push_answered(
        &mut self,
        w: u32,
        incarnation: u64,
        run: u64,
        ps: u32,
        result: Option<PushOutcome>,
    ) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.incarnation != incarnation || worker.state != ProcState::Up {
            return;
        }
        let Some(current) = worker.run.as_mut().filter(|r| r.call == run) else {
            return;
        };
        if !current.pending.remove(&ps) {
            return;
        }
        match result {
            Some(outcome) => current.answered.push((ps, outcome)),
            None => {
                current.unavailable = Some(current.unavailable.map_or(ps, |u| u.min(ps)));
            }
        }
        if !current.pending.is_empty() {
            return;
        }
        let pushed = match current.unavailable {
            Some(ps) => Err(StepError::PsUnavailable(PsUnavailable {
                ps,
                reason: "unreachable, or not serving".into(),
            })),
            None => {
                let mut answered = std::mem::take(&mut current.answered);
                answered.sort();
                Ok(answered)
            }
        };
        let action = worker.machine.handle_pushed(now, pushed);
        // A server refused it as fenced: it answers, then exits to come back as a new
        // incarnation (its supervisor restarts it).
        let fenced = matches!(
            &action,
            StepAction::Reply {
                result: Err(RunClosureError::Refused(WorkerRefusal::Fenced)),
                ..
            }
        );
        self.carry_out(w, run, action);
        if fenced {
            self.kill(Node::Worker(w));
        }
    }

    /// A request of the chief's call `call` reaches worker `w`: a closure or a setup is
    /// admitted and queued for the compute thread, a dial or a retirement answered at once.
    fn worker_request(&mut self, w: u32, call: u64, req: Req) {
        let node = Node::Worker(w);
        let now = self.instant();
        match req {
            Req::Run {
                closure,
                attempt,
                generation,
                chief,
                servers,
            } => self.admit_run(w, call, (closure, attempt, generation), chief, servers),
            Req::Hello => {
                let incarnation = self.workers[w as usize].incarnation;
                let resp = Resp::Hello { incarnation };
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call, resp },
                );
            }
            Req::SetUp {
                version,
                generation,
                chief,
                skip,
                layouts,
            }
            | Req::Rewind {
                version,
                generation,
                chief,
                skip,
                layouts,
            }
            | Req::Configure {
                version,
                generation,
                chief,
                skip,
                layouts,
            } => {
                // A new incarnation is set up with a rewind (rebuilt from scratch), as the
                // coordinator does, so that a setup a restore made outdated (built at old
                // positions already) cannot stay; a live worker's new configuration keeps
                // the datasets it reads.
                let rewind = !matches!(req, Req::Configure { .. });
                // What the message carries: the job's layouts, the dataset at `skip`.
                let setup = SetupWorker {
                    num_workers: self.config.num_workers,
                    layouts: self.layout_sets[layouts].clone(),
                    servers: Vec::new(),
                    datasets: vec![(DATASET.into(), skip)],
                    version,
                    generation,
                };
                let job = Job::Setup {
                    setup,
                    rewind,
                    from_chief: chief,
                };
                self.enqueue(w, call, Request::Setup, job);
            }
            Req::Retire => {
                // It answers, then exits (its supervisor restarts it as a new incarnation).
                let incarnation = self.workers[w as usize].incarnation;
                let exit = self.workers[w as usize]
                    .machine
                    .handle_retire(now, incarnation);
                let resp = match exit {
                    Some(_) => Resp::Done,
                    None => Resp::Refused("retired already".into()),
                };
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call, resp },
                );
                if exit.is_some() {
                    self.kill(node);
                }
            }
            Req::Positions => self.enqueue(w, call, Request::Positions, Job::Positions),
            _ => {
                let resp = Resp::Refused("not a server".into());
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call, resp },
                );
            }
        }
    }

    /// Admits closure `closure` (attempt `attempt`, dispatched in restore generation
    /// `generation` by chief incarnation `chief`) for worker `w` and queues it; answered at
    /// once when the machine refuses it, ignored when delivered again.
    fn admit_run(
        &mut self,
        w: u32,
        call: u64,
        (closure, attempt, generation): (u64, u32, u64),
        chief: u64,
        servers: Vec<u64>,
    ) {
        let node = Node::Worker(w);
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        let known = worker.run.as_ref().is_some_and(|r| r.call == call)
            || worker.waiting.iter().any(|(c, _)| *c == call);
        if known {
            return; // the same request again
        }
        if let Err(refusal) = worker.machine.admit(now, Request::Run) {
            let resp = Resp::Refused(refusal.to_string());
            self.send(
                node,
                Node::Chief,
                self.chief_incarnation,
                Msg::Reply { call, resp },
            );
            return;
        }
        let run = RunClosure {
            closure,
            attempt,
            generation,
            function: "step".into(),
            args: Vec::new(),
            // The simulated worker reaches servers by index; its pushes name the incarnation
            // the chief named, as a real worker's do.
            servers,
            learning_rate: None,
        };
        worker.waiting.push_back((call, Job::Run(run, chief)));
        self.next_step(w);
    }

    /// Admits a setup or positions request `call` for worker `w` and queues it behind the jobs
    /// admitted before it (answered at once when the machine refuses it; a request delivered
    /// again is ignored).
    fn enqueue(&mut self, w: u32, call: u64, request: Request, job: Job) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.waiting.iter().any(|(c, _)| *c == call) {
            return; // the same request again
        }
        if let Err(refusal) = worker.machine.admit(now, request) {
            let resp = Resp::Refused(refusal.to_string());
            self.send(
                Node::Worker(w),
                Node::Chief,
                self.chief_incarnation,
                Msg::Reply { call, resp },
            );
            return;
        }
        worker.waiting.push_back((call, job));
        self.next_step(w);
    }

    /// The compute thread takes the next job waiting, if it is free: a closure runs if the
    /// machine says so (its step then computes for a drawn time) or is answered at once; a
    /// setup is carried out as the machine plans it, positions are reported.
    fn next_step(&mut self, w: u32) {
        let now = self.instant();
        let worker = &mut self.workers[w as usize];
        if worker.run.is_some() {
            return;
        }
        while let Some((call, job)) = self.workers[w as usize].waiting.pop_front() {
            let worker = &mut self.workers[w as usize];
            let (run, from_chief) = match job {
                Job::Run(run, chief) => (run, chief),
                Job::Setup {
                    setup,
                    rewind,
                    from_chief,
                } => {
                    // Building a dataset here is setting its position: done at once.
                    let built = worker
                        .machine
                        .handle_setup(now, &setup, rewind, from_chief)
                        .map(|plan| {
                            for dataset in &plan.datasets {
                                if let DatasetPlan::Build { skip, .. } = dataset {
                                    worker.position = *skip;
                                    worker.fresh = true;
                                }
                            }
                            vec![(DATASET.to_string(), worker.position)]
                        });
                    let resp = match worker.machine.handle_setup_built(now, built) {
                        Ok(()) => Resp::Done,
                        Err(e) => Resp::Refused(e.to_string()),
                    };
                    self.reply_from(w, call, resp);
                    continue;
                }
                Job::Positions => {
                    let resp = Resp::Positions(worker.machine.handle_positions(now));
                    self.reply_from(w, call, resp);
                    continue;
                }
            };
            match worker.machine.handle_start(now, &run, from_chief) {
                StepAction::Compute => {
                    // The step reads its dataset's next element.
                    let first = std::mem::replace(&mut worker.fresh, false);
                    let read = worker.position;
                    worker.position += 1;
                    if first {
                        self.check_first_read(w, read, run.generation);
                    }
                    // The step reads the variables now (its pulls): READ-1 checks that what
                    // its pushes change is what it read.
                    let incarnation = self.workers[w as usize].incarnation;
                    let read_key = (w, incarnation, run.closure, run.attempt);
                    let state = self
                        .running_servers()
                        .into_iter()
                        .map(|ps| {
                            let p = &self.servers[ps as usize];
                            (ps, (p.incarnation, p.store.generation().0))
                        })
                        .collect();
                    self.reads.insert(read_key, state);
                    let worker = &mut self.workers[w as usize];
                    worker.run = Some(WorkerRun {
                        call,
                        pending: BTreeSet::new(),
                        answered: Vec::new(),
                        unavailable: None,
                    });
                    let incarnation = worker.incarnation;
                    let step_ms = self.rng.gen_range(STEP_MS.0..=STEP_MS.1);
                    let event = Event::Computed {
                        worker: w,
                        incarnation,
                        run: call,
                    };
                    self.at(self.now + Duration::from_millis(step_ms), event);
                    return;
                }
                action => self.carry_out(w, call, action),
            }
        }
    }

    /// Worker `w` answers the chief's call `call`.
    fn reply_from(&mut self, w: u32, call: u64, resp: Resp) {
        let chief = self.chief_incarnation;
        self.send(
            Node::Worker(w),
            Node::Chief,
            chief,
            Msg::Reply { call, resp },
        );
    }

    /// Carries out the machine's next step for closure call `run` of worker `w`.
    fn carry_out(&mut self, w: u32, run: u64, action: StepAction) {
        let node = Node::Worker(w);
        let incarnation = self.workers[w as usize].incarnation;
        match action {
            StepAction::Compute => {}
            StepAction::Push(plan) => {
                if let Some(current) = self.workers[w as usize].run.as_mut() {
                    current.pending = plan.iter().map(|p| p.ps).collect();
                }
                for PlannedPush { ps, push, blobs } in plan {
                    let ps_incarnation = self.servers[ps as usize].incarnation;
                    self.send(
                        node,
                        Node::Ps(ps),
                        ps_incarnation,
                        Msg::Push { run, push, blobs },
                    );
                    let event = Event::PushTimeout {
                        worker: w,
                        incarnation,
                        run,
                        ps,
                    };
                    self.at(self.now + self.config.detection_budget, event);
                }
            }
            StepAction::Reply { result, .. } => {
                let worker = &mut self.workers[w as usize];
                if worker.run.as_ref().is_some_and(|r| r.call == run) {
                    worker.run = None;
                }
                let resp = match result {
                    Ok(_) => Resp::Run(RunResult::Committed),
                    Err(RunClosureError::PsUnavailable(u)) => {
                        Resp::Run(RunResult::PsUnavailable(u.ps))
                    }
                    Err(RunClosureError::Refused(refusal)) => Resp::Refused(refusal.to_string()),
                    Err(RunClosureError::Step(e)) => Resp::Run(RunResult::Failed(e)),
                };
                self.send(
                    node,
                    Node::Chief,
                    self.chief_incarnation,
                    Msg::Reply { call: run, resp },
                );
                self.next_step(w);
            }
        }
    }
}

/// How long a worker's step computes, milliseconds (drawn per step from the scenario's seed).
const STEP_MS: (u64, u64) = (10, 60);
