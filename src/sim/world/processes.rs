//! The processes' lifecycle, as their supervisors and the launcher drive it: a kill (and the
//! restart after `restart_delay`, with the supervisor's exit report), a pause, a preemption
//! notice and its grace, a worker's drain and rejoin, a server joining or leaving as the job is
//! scaled, and the chief's death and its new incarnation. The faults the scenario injects
//! arrive here ([`FaultEvent`]); what a process does while it runs is its own room's.

use std::time::Duration;

use rand::Rng;

use super::super::{Fault, Node, EXTRA_SERVERS_MAX};
use super::job::{new_coordinator, new_store};
use super::network::Msg;
use super::{ChiefPhase, Event, World};
use crate::roles::worker::WorkerMachine;

/// A fault the scenario injects into a process (or its links), at its time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum FaultEvent {
    Kill(Node),
    Pause(Node, u64),
    Partition(Node, u64, bool),
    Preempt(Node),
    Drain(u32),
    Rejoin(u32),
    WorkerJoin,
    PsJoin,
    PsLeave,
}

/// Whether a process runs, is paused (its messages and timers wait), or is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProcState {
    Up,
    Paused,
    Down,
}

impl World<'_> {
    /// Queues the scenario's faults at their times (a storage fault acts on its save, when
    /// that save is written).
    pub(super) fn schedule_faults(&mut self) {
        let scenario = self.scenario;
        for fault in &scenario.faults {
            let (at_ms, event) = match *fault {
                Fault::Kill { at_ms, node } => (at_ms, FaultEvent::Kill(node)),
                Fault::Pause {
                    at_ms,
                    node,
                    for_ms,
                } => (at_ms, FaultEvent::Pause(node, for_ms)),
                Fault::Partition {
                    at_ms,
                    node,
                    for_ms,
                    one_way,
                } => (at_ms, FaultEvent::Partition(node, for_ms, one_way)),
                Fault::Preempt { at_ms, node } => (at_ms, FaultEvent::Preempt(node)),
                Fault::Drain { at_ms, worker } => (at_ms, FaultEvent::Drain(worker)),
                Fault::Rejoin { at_ms, worker } => (at_ms, FaultEvent::Rejoin(worker)),
                Fault::WorkerJoin { at_ms } => (at_ms, FaultEvent::WorkerJoin),
                Fault::PsJoin { at_ms } => (at_ms, FaultEvent::PsJoin),
                Fault::PsLeave { at_ms } => (at_ms, FaultEvent::PsLeave),
                Fault::Storage { .. } => continue,
            };
            self.at(Duration::from_millis(at_ms), Event::Inject(event));
        }
    }

    /// A fault the scenario injects now.
    ///
    /// Longer than most functions here on purpose: one arm per fault kind, each what it does to
    /// the simulated processes and network, so that the fault model reads in one place.
    pub(super) fn inject(&mut self, fault: FaultEvent) {
        match fault {
            FaultEvent::Kill(node) => self.kill(node),
            FaultEvent::Pause(node, for_ms) => {
                let (state, incarnation) = self.state(node);
                if state == ProcState::Up && node != Node::Chief {
                    self.set_state(node, ProcState::Paused);
                    let at = self.now + Duration::from_millis(for_ms);
                    self.at(at, Event::Resume { node, incarnation });
                }
            }
            FaultEvent::Partition(node, for_ms, one_way) => {
                let until = self.now + Duration::from_millis(for_ms);
                self.partitions.insert(node, (until, one_way));
            }
            FaultEvent::Drain(worker) => {
                let node = Node::Worker(worker);
                if self.state(node).0 != ProcState::Down {
                    // SIGUSR1: it tells the chief and runs on until it is let go.
                    let incarnation = self.state(node).1;
                    let chief = self.chief_incarnation;
                    self.send(
                        node,
                        Node::Chief,
                        chief,
                        Msg::Draining {
                            worker,
                            incarnation,
                        },
                    );
                }
            }
            FaultEvent::Rejoin(worker) => {
                if self.workers[worker as usize].drained {
                    // Its supervisor starts it again; it registers with the chief.
                    self.start_worker(worker);
                }
            }
            FaultEvent::WorkerJoin => {
                // As the launcher scales up: the lowest index past the spec not running
                // starts (and registers with the chief).
                let spec = self.config.num_workers;
                let free = (spec..self.workers.len() as u32).find(|w| self.workers[*w as usize].drained);
                if let Some(worker) = free {
                    self.workers_joined += 1;
                    self.start_worker(worker);
                }
            }
            FaultEvent::PsJoin => {
                // As the launcher scales up: the lowest index not running starts (none
                // while a server is leaving, so that the running ones stay `0..n`).
                let leaving = self.servers.iter().any(|p| p.leaving);
                let free = (0..self.servers.len() as u32).find(|ps| self.servers[*ps as usize].out);
                if let (false, Some(ps)) = (leaving, free) {
                    self.ps_joined += 1;
                    self.start_server(ps);
                }
            }
            FaultEvent::PsLeave => {
                // As the launcher scales down: the highest running server is asked to
                // leave (SIGUSR1), if it is up and no other is leaving.
                let leaving = self.servers.iter().any(|p| p.leaving);
                if let (false, Some(&ps)) = (leaving, self.running_servers().last()) {
                    let node = Node::Ps(ps);
                    if self.state(node).0 == ProcState::Up {
                        let p = &mut self.servers[ps as usize];
                        p.leaving = true;
                        let (incarnation, chief) = (p.incarnation, self.chief_incarnation);
                        self.send(
                            node,
                            Node::Chief,
                            chief,
                            Msg::PsDraining { ps, incarnation },
                        );
                    }
                }
            }
            FaultEvent::Preempt(node) => {
                if self.state(node).0 != ProcState::Down {
                    // Every task tells the chief: a worker is let go at once, a server once
                    // the chief took its cut; unanswered, either serves through its grace.
                    let chief = self.chief_incarnation;
                    match node {
                        Node::Worker(i) => {
                            let now = self.instant();
                            let worker = &mut self.workers[i as usize];
                            worker.machine.handle_preemption_notice(now);
                            let incarnation = worker.incarnation;
                            let msg = Msg::Leaving {
                                worker: i,
                                incarnation,
                            };
                            self.send(node, Node::Chief, chief, msg);
                        }
                        Node::Ps(ps) => {
                            let incarnation = self.state(node).1;
                            let msg = Msg::PsLeaving { ps, incarnation };
                            self.send(node, Node::Chief, chief, msg);
                        }
                        Node::Chief => {}
                    }
                    // The incarnation noticed exits at the end of its grace (not a newer
                    // one, if it left and was restarted already).
                    let at = self.now + self.config.preemption_grace;
                    let incarnation = self.state(node).1;
                    self.at(at, Event::GraceOver { node, incarnation });
                }
            }
        }
    }

    /// `node`'s process: its state and its incarnation.
    pub(super) fn state(&self, node: Node) -> (ProcState, u64) {
        match node {
            Node::Chief => (self.chief_state, self.chief_incarnation),
            Node::Ps(i) => (
                self.servers[i as usize].state,
                self.servers[i as usize].incarnation,
            ),
            Node::Worker(i) => (
                self.workers[i as usize].state,
                self.workers[i as usize].incarnation,
            ),
        }
    }

    /// Sets the state of `node`'s process.
    pub(super) fn set_state(&mut self, node: Node, state: ProcState) {
        match node {
            Node::Chief => self.chief_state = state,
            Node::Ps(i) => self.servers[i as usize].state = state,
            Node::Worker(i) => self.workers[i as usize].state = state,
        }
    }

    /// The process dies; its supervisor starts a new incarnation after the restart delay.
    pub(super) fn kill(&mut self, node: Node) {
        if self.state(node).0 == ProcState::Down {
            return;
        }
        self.set_state(node, ProcState::Down);
        match node {
            Node::Worker(i) => {
                let w = &mut self.workers[i as usize];
                w.run = None;
                w.waiting.clear();
            }
            Node::Chief => self.kill_chief(),
            Node::Ps(_) => {
                let writing = matches!(self.chief.phase, ChiefPhase::Writing(_))
                    || self.chief.background.is_some();
                if writing && self.coord.cut().is_none() {
                    self.ps_lost_before_first_cut += 1;
                }
            }
        }
        // Every other chief comes back only after its workers' detectors declared it dead, so
        // that their wait for a new chief is driven too (a supervisor slow to reschedule it).
        let slow_chief = node == Node::Chief && self.chief_incarnation % 2 == 1;
        let delay = if slow_chief {
            self.config.detection_budget + self.config.restart_delay
        } else {
            self.config.restart_delay
        };
        let at = self.now + delay;
        self.at(at, Event::Restart { node });
        self.report_exit(node);
    }

    /// The workers' failure detectors declare chief incarnation `incarnation` dead, if it is still
    /// the one that died (not back yet): each worker's machine decides (it waits for a new
    /// chief to set it up, as the real one does, within `ps_restart_wait` here, standing for
    /// its `worker_wait`).
    pub(super) fn chief_silent(&mut self, incarnation: u64) {
        if self.chief_incarnation != incarnation || self.chief_state != ProcState::Down {
            return;
        }
        let now = self.instant();
        for w in 0..self.workers.len() as u32 {
            let worker = &mut self.workers[w as usize];
            if worker.state == ProcState::Down {
                continue;
            }
            let budget = self.config.detection_budget;
            let cause = cohort_actors::DeathCause::Silent { silent_for: budget };
            if worker.machine.handle_chief_lost(now, cause).is_some() {
                self.kill(Node::Worker(w));
            } else {
                let at = self.now + self.config.ps_restart_wait;
                let incarnation = worker.incarnation;
                self.at(
                    at,
                    Event::ChiefWaitOver {
                        worker: w,
                        incarnation,
                    },
                );
            }
        }
    }

    /// The supervisor restarts `node` as a new incarnation (unless it is out of the job for
    /// good).
    pub(super) fn restart(&mut self, node: Node) {
        match node {
            Node::Chief => self.restart_chief(),
            Node::Ps(i) => {
                if self.servers[i as usize].out {
                    // Let go for good: its supervisor does not restart it.
                    return;
                }
                self.start_server(i);
            }
            Node::Worker(i) => {
                let w = &mut self.workers[i as usize];
                if w.drained {
                    // Out of the job for good: its supervisor does not restart it.
                    return;
                }
                w.incarnation += 1;
                w.state = ProcState::Up;
                w.machine =
                    WorkerMachine::new(i, w.incarnation, self.config.num_ps + EXTRA_SERVERS_MAX);
                w.run = None;
                w.waiting.clear();
                w.position = 0;
                w.fresh = false;
                if i >= self.config.num_workers {
                    // The chief's spec does not name it: it registers, as at its first start.
                    self.register_worker(i);
                }
            }
        }
    }

    /// Worker `worker`, out of the job (drained, or past the spec and never started), starts
    /// as a new incarnation and registers with the chief.
    fn start_worker(&mut self, worker: u32) {
        self.workers[worker as usize].drained = false;
        self.restart(Node::Worker(worker));
        if worker < self.config.num_workers {
            self.register_worker(worker);
        }
    }

    /// Worker `worker`'s live incarnation tells the live chief it is one of the job's
    /// (`Joining`): at its start, and with each new chief where the spec does not name it
    /// (production's `join_every_new_chief`).
    fn register_worker(&mut self, worker: u32) {
        let incarnation = self.workers[worker as usize].incarnation;
        let chief = self.chief_incarnation;
        self.send(
            Node::Worker(worker),
            Node::Chief,
            chief,
            Msg::Joining {
                worker,
                incarnation,
            },
        );
    }

    /// Server `ps` exits for good (let go after it left the job): nothing of it remains.
    pub(super) fn end_server(&mut self, ps: u32) {
        let p = &mut self.servers[ps as usize];
        p.state = ProcState::Down;
        p.out = true;
        p.leaving = false;
        p.store = new_store();
        p.rows.clear();
        p.history.clear();
        p.effective_set.clear();
        self.ps_left += 1;
    }

    /// Servers running or to be restarted by their supervisors (not out), in index order.
    pub(super) fn running_servers(&self) -> Vec<u32> {
        (0..self.servers.len() as u32)
            .filter(|ps| !self.servers[*ps as usize].out)
            .collect()
    }

    /// The supervisor saw `node`'s process exit (a failure: every `kill` is one) and may
    /// tell the chief ([`crate::process::ExitReport`]): two times in three, after up to two
    /// restart delays, so that a report may also come after the new incarnation's hello
    /// (which must not be declared dead by it) or not at all (a supervisor that does not
    /// report, as Kubernetes).
    fn report_exit(&mut self, node: Node) {
        if node == Node::Chief || self.reports.gen_range(0..3) == 0 {
            return;
        }
        let incarnation = self.state(node).1;
        let most = 2 * self.config.restart_delay.as_millis() as u64;
        let after = Duration::from_millis(self.reports.gen_range(0..=most));
        self.at(self.now + after, Event::ExitReported { node, incarnation });
    }

    /// The chief process dies: its coordinator's state (closures, ledger, calls, what it
    /// dialled and set up) and its program's progress are gone. Servers keep their state;
    /// workers notice the silence after the detection budget and exit to be restarted.
    fn kill_chief(&mut self) {
        self.calls.clear();
        self.detector.clear();
        self.fenced.clear();
        self.chief.read.clear();
        // A write in the background dies with its process.
        self.chief.background = None;
        self.dispatched.clear();
        let incarnation = self.chief_incarnation;
        let at = self.now + self.config.detection_budget;
        self.at(at, Event::ChiefSilent { incarnation });
    }

    /// A new chief incarnation starts as the real one does: a fresh coordinator, which probes
    /// every server and restores them from the newest checkpoint that verifies before its
    /// program goes on from that checkpoint's step.
    ///
    /// Its cluster spec names the servers running now (as the launcher gives a restarted
    /// chief: they are `0..n`, joins taking the lowest free index and leaves the highest);
    /// every running server registers with it again, and one waiting to leave asks again, and
    /// so does every running worker past the spec.
    fn restart_chief(&mut self) {
        self.chief_incarnation += 1;
        self.chief_state = ProcState::Up;
        let servers = self.running_servers().len() as u32;
        self.coord = new_coordinator(self.config, servers);
        self.chief.spec_servers = servers;
        self.committed_before.clear();
        self.chief.phase = ChiefPhase::Starting(self.now);
        let chief = self.chief_incarnation;
        for ps in self.running_servers() {
            let p = &self.servers[ps as usize];
            let (incarnation, leaving) = (p.incarnation, p.leaving);
            self.send(
                Node::Ps(ps),
                Node::Chief,
                chief,
                Msg::PsJoining { ps, incarnation },
            );
            if leaving {
                self.send(
                    Node::Ps(ps),
                    Node::Chief,
                    chief,
                    Msg::PsDraining { ps, incarnation },
                );
            }
        }
        // Every running worker registers with the new chief too; only those past the spec
        // matter (the spec names the others).
        for w in self.config.num_workers..self.workers.len() as u32 {
            let worker = &self.workers[w as usize];
            if worker.state != ProcState::Down && !worker.drained {
                self.register_worker(w);
            }
        }
    }

    /// Starts a new incarnation of server `ps`: it holds nothing until it is restored, and
    /// registers with the chief ([`Msg::PsJoining`]), as every server does at its start.
    fn start_server(&mut self, ps: u32) {
        let p = &mut self.servers[ps as usize];
        p.incarnation += 1;
        p.state = ProcState::Up;
        p.out = false;
        p.leaving = false;
        p.store = new_store().with_incarnation(p.incarnation);
        p.rows.clear();
        p.history.clear();
        p.effective_set.clear();
        let incarnation = p.incarnation;
        let chief = self.chief_incarnation;
        self.send(
            Node::Ps(ps),
            Node::Chief,
            chief,
            Msg::PsJoining { ps, incarnation },
        );
    }
}
