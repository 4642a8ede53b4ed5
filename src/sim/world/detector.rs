//! The chief's failure detector, as its gateway's heartbeats and probes work: a node unheard
//! for the detection budget is declared dead, or sooner where a probe of its address is
//! refused (its process down, no partition between); a new incarnation's hello declares its
//! predecessor dead; and the supervisors' exit reports declare dead the incarnation they name,
//! if it is the one watched. A paused or partitioned node is never refused.

use std::time::{Duration, Instant};

use super::super::Node;
use super::{Event, ProcState, World};

/// What the detector knows of one node.
#[derive(Default)]
pub(super) struct Detect {
    pub(super) unheard_since: Option<Duration>,
    /// The incarnation last heard, and whether it was declared dead.
    pub(super) seen: Option<u64>,
    pub(super) declared: Option<u64>,
}

impl World<'_> {
    /// The failure detector: a node unheard for the budget is declared dead, or sooner where a
    /// probe of its address is refused; a server heard as a new incarnation is reported up.
    pub(super) fn detect(&mut self) {
        let now = self.instant();
        let nodes: Vec<Node> = self
            .running_servers()
            .into_iter()
            .map(Node::Ps)
            .chain((0..self.workers.len() as u32).map(Node::Worker))
            .collect();
        for node in nodes {
            let (_, incarnation) = self.state(node);
            let heard = self.heard(node);
            let budget = self.config.detection_budget;
            // The gateway knows every incarnation its node connected to (a dial's hello),
            // even one it has not heard a heartbeat from yet.
            let known = match node {
                Node::Worker(w) => self.coord.worker_incarnation(w),
                Node::Ps(ps) => self
                    .coord
                    .ps_incarnation(ps)
                    .map(|(incarnation, _)| incarnation),
                Node::Chief => None,
            };
            let entry = self.detector.entry(node).or_default();
            // A newer incarnation the coordinator dialled takes the node's link over, as a
            // hello on a new connection does: the gateway watches it from now on (silent, it
            // is declared dead in its turn), and the older one's connection is gone.
            if let Some(newer) = known.filter(|k| entry.seen.is_none_or(|seen| *k > seen)) {
                let previous = entry.seen.replace(newer);
                entry.unheard_since = None;
                if let Some(old) = previous.filter(|old| entry.declared != Some(*old)) {
                    entry.declared = Some(old);
                    self.declare_dead(now, node, old);
                }
            }
            let entry = self.detector.entry(node).or_default();
            if heard {
                entry.unheard_since = None;
                let previous = entry.seen.replace(incarnation);
                if previous == Some(incarnation) {
                    continue;
                }
                // A new incarnation says hello: the old one's connection is gone, and with it
                // every call to it (the gateway reports the old incarnation dead).
                if let Some(old) = previous.filter(|old| entry.declared != Some(*old)) {
                    entry.declared = Some(old);
                    self.declare_dead(now, node, old);
                }
                if let Node::Ps(ps) = node {
                    self.coord.handle_ps_up(now, ps, incarnation);
                }
                continue;
            }
            let since = *entry.unheard_since.get_or_insert(self.now);
            let Some(seen) = entry.seen else { continue };
            if entry.declared == Some(seen) {
                continue;
            }
            // The gateway probes a peer silent for two heartbeat intervals; the probe is
            // refused (ICMP port unreachable) only where nothing listens: the process is down
            // and its successor not started, and no partition stands between them.
            let refused = self.now >= since + budget / REFUSED_AFTER_BUDGET_DIVISOR
                && self.state(node).0 == ProcState::Down
                && !self.partitioned(node, true)
                && !self.partitioned(node, false);
            if self.now < since + budget && !refused {
                continue;
            }
            if self.now < since + budget {
                self.deaths_refused += 1;
            }
            let Some(entry) = self.detector.get_mut(&node) else {
                continue;
            };
            entry.declared = Some(seen);
            self.declare_dead(now, node, seen);
        }
    }

    /// The supervisor's report that incarnation `incarnation` of `node` exited: as the chief's
    /// gateway does, only the live incarnation it watches now is declared dead (a report of
    /// one replaced already, or never heard from, changes nothing). A chief that is down
    /// hears nothing; a paused one hears it when it runs again.
    pub(super) fn exit_reported(&mut self, node: Node, incarnation: u64) {
        match self.chief_state {
            ProcState::Up => {}
            // The datagram waits in the socket until the chief runs again.
            ProcState::Paused => {
                let later = self.now + Duration::from_millis(100);
                self.at(later, Event::ExitReported { node, incarnation });
                return;
            }
            ProcState::Down => return,
        }
        let Some(entry) = self
            .detector
            .get_mut(&node)
            .filter(|e| e.seen == Some(incarnation) && e.declared != Some(incarnation))
        else {
            self.reports_ignored += 1;
            return;
        };
        entry.declared = Some(incarnation);
        self.deaths_reported += 1;
        let now = self.instant();
        self.declare_dead(now, node, incarnation);
    }

    /// The chief's gateway declared incarnation `incarnation` of `node` dead: the coordinator hears
    /// it, and every call to that incarnation fails.
    fn declare_dead(&mut self, now: Instant, node: Node, incarnation: u64) {
        match node {
            Node::Ps(ps) => self.coord.handle_ps_lost(now, ps, incarnation),
            Node::Worker(w) => self.coord.handle_worker_lost(now, w, incarnation),
            Node::Chief => {}
        }
        self.fail_calls(node, incarnation);
    }
}

/// A silent node is probed after this fraction of the detection budget: two heartbeat
/// intervals, with the default 500 ms interval and 3 s budget.
const REFUSED_AFTER_BUDGET_DIVISOR: u32 = 3;
