//! The simulated network: the messages the processes send one another ([`Msg`], with the
//! coordinator's requests and their answers), and their links: every message takes a drawn
//! latency (so messages reorder), a lost datagram costs a retransmission delay, a request may
//! be delivered twice, and a partition or a paused receiver holds a message until its
//! connection idles out. Delivery hands a message to its receiver's handler; what the message
//! means is the receiver's business, never this module's.

use std::time::Duration;

use rand::Rng;

use super::super::Node;
use super::shell::NoReply;
use super::{Event, ProcState, World};
use crate::layout::Layout;
use crate::roles::protocol::LeaveAnswer;
use crate::roles::ps::PushOutcome;

/// A message between two processes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Msg {
    /// A coordinator call.
    Request {
        call: u64,
        req: Req,
    },
    /// Its answer.
    Reply {
        call: u64,
        resp: Resp,
    },
    /// Worker to server (the planned push, blobs and all), and back.
    Push {
        run: u64,
        push: crate::roles::protocol::Push,
        blobs: Vec<bytes::Bytes>,
    },
    PushReply {
        ps: u32,
        run: u64,
        /// `None`: the server was unavailable (not serving, or refused the push).
        result: Option<PushOutcome>,
    },
    /// A worker's preemption notice to the chief ([`crate::roles::protocol::Leaving`]), and
    /// the chief's answer.
    Leaving {
        worker: u32,
        incarnation: u64,
    },
    /// A parameter server's preemption notice to the chief (the same message).
    PsLeaving {
        ps: u32,
        incarnation: u64,
    },
    LeaveAnswer(LeaveAnswer),
    /// A worker's drain request to the chief ([`crate::roles::protocol::Draining`]), and the
    /// chief's answer once it is drained.
    Draining {
        worker: u32,
        incarnation: u64,
    },
    Drained,
    /// A drained worker's new incarnation registers with the chief
    /// ([`crate::roles::protocol::Joining`]).
    Joining {
        worker: u32,
        incarnation: u64,
    },
    /// A parameter server registers with the chief ([`crate::roles::protocol::Joining`]):
    /// at every start and with every new chief.
    PsJoining {
        ps: u32,
        incarnation: u64,
    },
    /// A server asks to leave the job for good ([`crate::roles::protocol::Draining`]), and
    /// the chief's answer: go (its variables are elsewhere), or stay.
    PsDraining {
        ps: u32,
        incarnation: u64,
    },
    PsDrainAnswer {
        go: bool,
    },
}

/// A coordinator call's request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Req {
    Run {
        closure: u64,
        attempt: u32,
        generation: u64,
        /// The sending chief's incarnation.
        chief: u64,
        /// Per server, the incarnation the chief names serving (`RunClosure::servers`).
        servers: Vec<u64>,
    },
    /// A dial: whichever incarnation listens at the address answers with its incarnation.
    Hello,
    /// Set a new incarnation up with the dataset starting at `skip` (setup `version` of
    /// restore `generation`, from chief incarnation `chief`, with the layouts of set
    /// `layouts`).
    SetUp {
        version: u64,
        generation: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// Rebuild the dataset at `skip`.
    Rewind {
        version: u64,
        generation: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// A new setup for a live worker, the dataset (if new to it) at `skip`.
    Configure {
        version: u64,
        generation: u64,
        chief: u64,
        skip: u64,
        layouts: usize,
    },
    /// Where its datasets are.
    Positions,
    Probe,
    Retire,
    Fence {
        worker: u32,
        incarnation: u64,
    },
    Watermark {
        below: u64,
        generation: u64,
    },
    Begin {
        generation: u64,
        fences: Vec<(u32, u64)>,
        afresh: bool,
    },
    Shards {
        stored: usize,
        layouts: usize,
    },
    RollBack {
        below: u64,
        generation: u64,
    },
    /// Read one shard for a save.
    Snapshot {
        shard: String,
    },
    /// Create a variable shard (`CreateVariable`) with its initial values (the bits of each
    /// f32, so that a request stays comparable).
    Create {
        shard: String,
        shape: Vec<u64>,
        values: Vec<u32>,
    },
}

/// A coordinator call's answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Resp {
    Done,
    Refused(String),
    /// The serving gate refused: the actor is not serving (yet), as the gateway answers
    /// `ActorUnavailable` (calling again may succeed).
    Unavailable(String),
    Run(RunResult),
    Probe {
        incarnation: u64,
        serving: bool,
        generation: u64,
        restoring: bool,
        next_free: u64,
    },
    Hello {
        incarnation: u64,
    },
    Positions(Vec<(String, u64)>),
    Snapshot(usize),
}

/// A closure's outcome, as its worker answers the call that ran it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum RunResult {
    Committed,
    PsUnavailable(u32),
    /// The closure's own error.
    Failed(String),
}

impl World<'_> {
    /// Sends `msg` from `from` to incarnation `to_incarnation` of `to`. Under QUIC a lost datagram
    /// is sent again: loss costs a retransmission delay; duplication is a request sent again
    /// after a reconnect. Across a partition or to a paused process a message waits; past the
    /// detection budget its connection idled out and it is gone.
    pub(super) fn send(&mut self, from: Node, to: Node, to_incarnation: u64, msg: Msg) {
        if self.state(from).0 == ProcState::Down {
            return;
        }
        let net = self.scenario.net;
        let copies = if self.rng.gen_bool(net.duplicate.clamp(0.0, 1.0)) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = Duration::from_micros(
                self.rng
                    .gen_range(net.latency_min_us..=net.latency_max_us.max(net.latency_min_us)),
            );
            while self.rng.gen_bool(net.loss.clamp(0.0, 0.9)) {
                delay += RETRANSMIT_DELAY;
            }
            let event = Event::Deliver {
                from,
                to,
                to_incarnation,
                sent: self.now,
                msg: Box::new(msg.clone()),
            };
            self.at(self.now + delay, event);
        }
    }

    /// A message arrives: to the incarnation it was sent to (a dial to whichever listens),
    /// held while a partition or a pause stands in the way, else handed to its receiver.
    pub(super) fn deliver(
        &mut self,
        from: Node,
        to: Node,
        to_incarnation: u64,
        sent: Duration,
        msg: Msg,
    ) {
        let (state, incarnation) = self.state(to);
        // A dial connects to whichever incarnation listens at the address.
        let dial = matches!(
            msg,
            Msg::Request {
                req: Req::Hello,
                ..
            }
        );
        if (incarnation != to_incarnation && !dial) || state == ProcState::Down {
            return;
        }
        let held = state == ProcState::Paused
            || self.partitioned(to, false)
            || self.partitioned(from, true);
        if held {
            if self.now >= sent + self.config.detection_budget {
                // The connection idled out: the call it carried (or answered) fails, as the
                // gateway's does when its connection is lost.
                if let Msg::Request { call, .. } | Msg::Reply { call, .. } = msg {
                    self.on_reply(call, Err(NoReply::IdledOut));
                }
                return;
            }
            // Retried until the node can take it, or the connection idles out.
            let event = Event::Deliver {
                from,
                to,
                to_incarnation,
                sent,
                msg: Box::new(msg),
            };
            self.at(self.now + HOLD_RETRY, event);
            return;
        }
        match (to, msg) {
            (Node::Chief, msg) => self.chief_receive(msg),
            (Node::Ps(ps), msg) => self.ps_receive(ps, msg),
            (Node::Worker(w), msg) => self.worker_receive(w, msg),
        }
    }

    /// Whether a partition cuts `node` off now: its outgoing messages (`outgoing`), or its
    /// incoming ones (a one-way partition cuts only the outgoing).
    pub(super) fn partitioned(&self, node: Node, outgoing: bool) -> bool {
        self.partitions
            .get(&node)
            .is_some_and(|(until, one_way)| self.now < *until && (outgoing || !*one_way))
    }

    /// Whether the coordinator hears `node`'s heartbeats now.
    pub(super) fn heard(&self, node: Node) -> bool {
        self.state(node).0 == ProcState::Up && !self.partitioned(node, true)
    }

    /// The index of `layouts` among the sets messages carry (added if new).
    pub(super) fn intern_layouts(&mut self, layouts: &[Layout]) -> usize {
        if let Some(i) = self.layout_sets.iter().rposition(|l| l == layouts) {
            return i;
        }
        self.layout_sets.push(layouts.to_vec());
        self.layout_sets.len() - 1
    }
}

/// What one lost datagram costs a message (QUIC sends it again).
const RETRANSMIT_DELAY: Duration = Duration::from_millis(200);
/// How often a message held by a partition or a pause is tried again.
pub(super) const HOLD_RETRY: Duration = Duration::from_millis(50);
