//! Failure detection: a pure heartbeat machine that tells, for every watched peer, when to send it
//! a heartbeat and when it has been silent for too long and is dead.
//!
//! It owns per-peer liveness only: no clock, no socket, no timer. The
//! [`Gateway`](crate::gateway::Gateway) drives it with the time passed in and carries heartbeats
//! over the transport.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::fencing::{Incarnation, IncarnationId};

/// Heartbeat period and silence budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// How often a heartbeat is sent to each live peer.
    pub interval: Duration,
    /// How long a peer may stay silent before it is declared dead; should span several
    /// intervals so one lost heartbeat is not fatal.
    pub timeout: Duration,
}

impl Default for HeartbeatConfig {
    /// 500 ms interval, 3 s timeout.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(3),
        }
    }
}

/// Something the caller must do or know, drained with [`HeartbeatMachine::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeartbeatEvent<P> {
    /// Send a heartbeat to this peer now.
    SendHeartbeat {
        /// The peer to send to.
        peer: P,
    },
    /// This incarnation of the peer is dead; nothing from it is accepted any more.
    PeerDead {
        /// The incarnation declared dead.
        incarnation: Incarnation<P>,
        /// Why it was declared dead.
        cause: DeathCause,
    },
    /// A new incarnation of the peer is alive (first contact, or back with a newer incarnation).
    PeerAlive {
        /// The incarnation now alive.
        incarnation: Incarnation<P>,
    },
    /// This live incarnation has been silent for [`SUSPECT_AFTER_INTERVALS`] intervals: look
    /// for evidence that its process is gone (nothing listens at its address any more), and
    /// report it with [`HeartbeatMachine::handle_refused`]. Asked again every
    /// [`SUSPECT_AFTER_INTERVALS`] intervals while the silence lasts.
    Probe {
        /// The incarnation to look for.
        incarnation: Incarnation<P>,
    },
}

/// A live peer silent for this many heartbeat intervals is probed ([`HeartbeatEvent::Probe`]).
/// Two: a single lost or late heartbeat is not worth a probe.
pub const SUSPECT_AFTER_INTERVALS: u32 = 2;

/// Why a peer incarnation was declared dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeathCause {
    /// Nothing heard from it for `silent_for`, which reached the timeout.
    Silent {
        /// Time since it was last heard from.
        silent_for: Duration,
    },
    /// A newer incarnation of the same node was heard from.
    Superseded,
    /// Its supervisor reported that the process of this incarnation exited (the launcher
    /// reaps its children at once): known before any silence budget runs out.
    Reported,
    /// Silent, and a probe of the address it was reached at was refused: no process listens
    /// there any more (a frozen or partitioned process still holds its socket, so this is
    /// never said of one).
    Refused,
}

/// What one call to [`HeartbeatMachine::handle_heartbeat`] made of the heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// From the live, current incarnation: its silence timer restarts.
    Alive,
    /// From an incarnation seen for the first time (a [`HeartbeatEvent::PeerAlive`] is queued).
    NewIncarnation,
    /// From an incarnation that is older than the current one or already declared dead: ignored
    /// (FENCE-1).
    Stale,
}

/// Per-peer heartbeat failure detector in the handle/poll style.
///
/// Calling protocol:
/// 1. Whenever anything is heard from a peer (a heartbeat, or any authenticated message), call
///    [`handle_heartbeat`](Self::handle_heartbeat)`(now, peer, incarnation)`. The first call for a peer
///    starts watching it. A [`Heard::Stale`] answer means the message comes from a dead or
///    superseded incarnation and must be dropped.
/// 2. Drain [`poll_event`](Self::poll_event) until `None` and act on each event: send the
///    heartbeat, report the death or the new life.
/// 3. Arm a timer for [`poll_timeout`](Self::poll_timeout); when it fires (or any time later),
///    call [`handle_timeout`](Self::handle_timeout)`(now)` and go to 2.
/// 4. Call [`forget`](Self::forget) to stop watching a peer that left on purpose.
///
/// `now` must not go backwards between calls. A peer is declared dead once `timeout` has passed
/// since it was last heard from, at the first `handle_timeout` at or after that instant; with
/// timers armed as asked, that is within `timeout` plus timer slack. A dead incarnation stays
/// dead: only a newer incarnation of the peer brings it back. The event queue holds at most two events
/// per watched peer between drains (three with a probe).
///
/// While a live peer is watched, `handle_timeout` is due at least every `interval`. When two
/// calls are more than `timeout` apart, it was this process that did not run (SIGSTOP, a
/// frozen VM, a starved runtime): the peers' silence was ours, so every live peer gets a fresh
/// `timeout` instead of being declared dead. A peer that really died is then declared dead one
/// budget later.
#[derive(Clone, Debug)]
pub struct HeartbeatMachine<P> {
    config: HeartbeatConfig,
    peers: BTreeMap<P, PeerLiveness>,
    events: VecDeque<HeartbeatEvent<P>>,
    last_tick: Option<Instant>,
}

impl<P: Clone + Ord> HeartbeatMachine<P> {
    /// A machine watching no peer yet.
    pub fn new(config: HeartbeatConfig) -> Self {
        Self {
            config,
            peers: BTreeMap::new(),
            events: VecDeque::new(),
            last_tick: None,
        }
    }

    /// The interval and timeout in use.
    pub fn config(&self) -> HeartbeatConfig {
        self.config
    }

    /// Records that `peer` in incarnation `incarnation` was heard from at `now`.
    pub fn handle_heartbeat(&mut self, now: Instant, peer: P, incarnation: IncarnationId) -> Heard {
        let fresh = PeerLiveness {
            incarnation,
            last_heard: now,
            next_send: now + self.config.interval,
            dead: false,
            probed: None,
        };
        let Some(state) = self.peers.get_mut(&peer) else {
            self.peers.insert(peer.clone(), fresh);
            self.events.push_back(HeartbeatEvent::PeerAlive {
                incarnation: Incarnation::new(peer, incarnation),
            });
            return Heard::NewIncarnation;
        };
        if incarnation < state.incarnation || (incarnation == state.incarnation && state.dead) {
            return Heard::Stale;
        }
        if incarnation == state.incarnation {
            state.last_heard = state.last_heard.max(now);
            return Heard::Alive;
        }
        let old = std::mem::replace(state, fresh);
        if !old.dead {
            self.events.push_back(HeartbeatEvent::PeerDead {
                incarnation: Incarnation::new(peer.clone(), old.incarnation),
                cause: DeathCause::Superseded,
            });
        }
        self.events.push_back(HeartbeatEvent::PeerAlive {
            incarnation: Incarnation::new(peer, incarnation),
        });
        Heard::NewIncarnation
    }

    /// Declares `peer`'s incarnation `incarnation` dead on outside evidence (its supervisor saw the
    /// process exit): only when it is the live incarnation watched now. A report of an older
    /// incarnation, of one already dead, or of one never heard from changes nothing (a late
    /// report must never kill the incarnation that replaced it). Returns whether it was
    /// declared dead; the [`HeartbeatEvent::PeerDead`] follows from [`poll_event`](Self::poll_event).
    pub fn handle_reported_dead(&mut self, peer: &P, incarnation: IncarnationId) -> bool {
        self.declare_dead(peer, incarnation, DeathCause::Reported)
    }

    /// Declares `peer`'s incarnation `incarnation` dead because a [`HeartbeatEvent::Probe`] of it
    /// was refused (nothing listens where it was reached), under the same rule as
    /// [`handle_reported_dead`](Self::handle_reported_dead): only the live incarnation watched
    /// now, and only while it is still silent (a probe answered late, after the peer was heard
    /// from again, changes nothing). Returns whether it was declared dead.
    pub fn handle_refused(&mut self, now: Instant, peer: &P, incarnation: IncarnationId) -> bool {
        let interval = self.config.interval;
        let still_silent = self.peers.get(peer).is_some_and(|s| {
            now.saturating_duration_since(s.last_heard) >= interval * SUSPECT_AFTER_INTERVALS
        });
        still_silent && self.declare_dead(peer, incarnation, DeathCause::Refused)
    }

    fn declare_dead(&mut self, peer: &P, incarnation: IncarnationId, cause: DeathCause) -> bool {
        let Some(state) = self.peers.get_mut(peer) else {
            return false;
        };
        if state.dead || state.incarnation != incarnation {
            return false;
        }
        state.dead = true;
        self.events.push_back(HeartbeatEvent::PeerDead {
            incarnation: Incarnation::new(peer.clone(), incarnation),
            cause,
        });
        true
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work to do, or
    /// `None` when no live peer is watched.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.peers
            .values()
            .filter(|s| !s.dead)
            .map(|s| {
                s.next_send
                    .min(s.last_heard + self.config.timeout)
                    .min(self.next_probe(s))
            })
            .min()
    }

    /// When `state`'s silence next asks for a probe: [`SUSPECT_AFTER_INTERVALS`] intervals
    /// after it was last heard from, then as often again after each probe.
    fn next_probe(&self, state: &PeerLiveness) -> Instant {
        let every = self.config.interval * SUSPECT_AFTER_INTERVALS;
        let suspect = state.last_heard + every;
        match state.probed {
            Some(at) if at >= suspect => at + every,
            _ => suspect,
        }
    }

    /// Declares dead every live peer silent for `timeout` or more, and asks for heartbeats to
    /// every live peer whose send time has come.
    pub fn handle_timeout(&mut self, now: Instant) {
        let paused = self
            .last_tick
            .is_some_and(|last| now.saturating_duration_since(last) > self.config.timeout);
        self.last_tick = Some(now);
        if paused {
            for state in self.peers.values_mut().filter(|s| !s.dead) {
                state.last_heard = state.last_heard.max(now);
            }
        }
        let probes_due: Vec<P> = self
            .peers
            .iter()
            .filter(|(_, s)| {
                !s.dead
                    && now.saturating_duration_since(s.last_heard) < self.config.timeout
                    && now >= self.next_probe(s)
            })
            .map(|(peer, _)| peer.clone())
            .collect();
        for (peer, state) in self.peers.iter_mut().filter(|(_, s)| !s.dead) {
            let silent_for = now.saturating_duration_since(state.last_heard);
            if silent_for >= self.config.timeout {
                state.dead = true;
                self.events.push_back(HeartbeatEvent::PeerDead {
                    incarnation: Incarnation::new(peer.clone(), state.incarnation),
                    cause: DeathCause::Silent { silent_for },
                });
            } else if now >= state.next_send {
                state.next_send = now + self.config.interval;
                self.events
                    .push_back(HeartbeatEvent::SendHeartbeat { peer: peer.clone() });
            }
        }
        for peer in probes_due {
            if let Some(state) = self.peers.get_mut(&peer) {
                state.probed = Some(now);
                self.events.push_back(HeartbeatEvent::Probe {
                    incarnation: Incarnation::new(peer, state.incarnation),
                });
            }
        }
    }

    /// The next thing to do, oldest first.
    pub fn poll_event(&mut self) -> Option<HeartbeatEvent<P>> {
        self.events.pop_front()
    }

    /// Stops watching `peer`; its incarnation is forgotten, so a later heartbeat starts afresh.
    pub fn forget(&mut self, peer: &P) {
        self.peers.remove(peer);
    }

    /// The current incarnation of `peer` and whether it is alive, if watched.
    pub fn peer(&self, peer: &P) -> Option<(IncarnationId, bool)> {
        self.peers.get(peer).map(|s| (s.incarnation, !s.dead))
    }

    /// When `peer` was last heard from, if watched.
    pub fn last_heard(&self, peer: &P) -> Option<Instant> {
        self.peers.get(peer).map(|s| s.last_heard)
    }

    /// Peers currently watched, dead or alive.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }
}

#[derive(Clone, Copy, Debug)]
struct PeerLiveness {
    incarnation: IncarnationId,
    last_heard: Instant,
    next_send: Instant,
    dead: bool,
    /// When it was last asked to be probed.
    probed: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INTERVAL: Duration = Duration::from_millis(100);
    const TIMEOUT: Duration = Duration::from_millis(350);

    fn machine<P: Clone + Ord>() -> HeartbeatMachine<P> {
        HeartbeatMachine::new(HeartbeatConfig {
            interval: INTERVAL,
            timeout: TIMEOUT,
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn drain<P: Clone + Ord>(m: &mut HeartbeatMachine<P>) -> Vec<HeartbeatEvent<P>> {
        std::iter::from_fn(|| m.poll_event()).collect()
    }

    #[test]
    fn first_contact_reports_alive_and_schedules_heartbeat() {
        let t0 = Instant::now();
        let mut m = machine();
        assert_eq!(m.poll_timeout(), None);
        assert_eq!(
            m.handle_heartbeat(t0, "a", IncarnationId(1)),
            Heard::NewIncarnation
        );
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::PeerAlive {
                incarnation: Incarnation::new("a", IncarnationId(1))
            }]
        );
        assert_eq!(m.poll_timeout(), Some(t0 + INTERVAL));
        m.handle_timeout(t0 + INTERVAL);
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::SendHeartbeat { peer: "a" }]
        );
        assert_eq!(m.poll_timeout(), Some(t0 + 2 * INTERVAL));
    }

    #[test]
    fn a_pause_of_this_process_gives_peers_a_fresh_budget_instead_of_killing_them() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(1));
        m.handle_timeout(t0 + INTERVAL);
        drain(&mut m);
        // Nothing ran for ten budgets (we were SIGSTOPped): the silence was ours.
        let woke = t0 + TIMEOUT * 10;
        m.handle_timeout(woke);
        assert!(drain(&mut m)
            .iter()
            .all(|e| matches!(e, HeartbeatEvent::SendHeartbeat { .. })));
        assert_eq!(m.peer(&"a"), Some((IncarnationId(1), true)));
        // Still silent a whole budget after waking, ticking as due: now it is dead.
        let mut t = woke;
        while t < woke + TIMEOUT {
            t += INTERVAL;
            m.handle_timeout(t);
        }
        assert!(drain(&mut m)
            .iter()
            .any(|e| matches!(e, HeartbeatEvent::PeerDead { .. })));
    }

    #[test]
    fn a_reported_exit_kills_only_the_live_incarnation_it_names() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(2));
        drain(&mut m);
        // Reports of an older incarnation, of one never heard from, or of another peer.
        assert!(!m.handle_reported_dead(&"a", IncarnationId(1)));
        assert!(!m.handle_reported_dead(&"a", IncarnationId(3)));
        assert!(!m.handle_reported_dead(&"b", IncarnationId(2)));
        assert_eq!(drain(&mut m), vec![]);
        assert_eq!(m.peer(&"a"), Some((IncarnationId(2), true)));
        // The live one: dead at once, long before its silence budget.
        assert!(m.handle_reported_dead(&"a", IncarnationId(2)));
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::PeerDead {
                incarnation: Incarnation::new("a", IncarnationId(2)),
                cause: DeathCause::Reported,
            }]
        );
        assert_eq!(m.peer(&"a"), Some((IncarnationId(2), false)));
        // Reported twice, or later found silent: declared dead once.
        assert!(!m.handle_reported_dead(&"a", IncarnationId(2)));
        m.handle_timeout(t0 + TIMEOUT * 2);
        assert_eq!(drain(&mut m), vec![]);
        // Its successor is admitted as ever.
        assert_eq!(
            m.handle_heartbeat(t0, "a", IncarnationId(3)),
            Heard::NewIncarnation
        );
    }

    /// A live peer silent for two intervals is to be probed, again two intervals later while
    /// the silence lasts, never once heard from again; a refused probe kills only the live,
    /// still silent incarnation it names.
    #[test]
    fn a_silent_peer_is_probed_and_a_refused_probe_kills_only_the_live_silent_one() {
        let t0 = Instant::now();
        // A budget of ten intervals: room for two probes before it runs out.
        let mut m = HeartbeatMachine::new(HeartbeatConfig {
            interval: INTERVAL,
            timeout: INTERVAL * 10,
        });
        m.handle_heartbeat(t0, "a", IncarnationId(2));
        drain(&mut m);
        let suspect = INTERVAL * SUSPECT_AFTER_INTERVALS;
        let probes = |events: Vec<HeartbeatEvent<&'static str>>| {
            events
                .into_iter()
                .filter(|e| matches!(e, HeartbeatEvent::Probe { .. }))
                .count()
        };
        m.handle_timeout(t0 + suspect - ms(1));
        assert_eq!(probes(drain(&mut m)), 0);
        assert!(m.poll_timeout().is_some_and(|t| t <= t0 + suspect));
        m.handle_timeout(t0 + suspect);
        assert_eq!(
            drain(&mut m)
                .into_iter()
                .filter(|e| matches!(e, HeartbeatEvent::Probe { .. }))
                .collect::<Vec<_>>(),
            vec![HeartbeatEvent::Probe {
                incarnation: Incarnation::new("a", IncarnationId(2))
            }]
        );
        // Not again before as long once more.
        m.handle_timeout(t0 + suspect + ms(1));
        assert_eq!(probes(drain(&mut m)), 0);
        m.handle_timeout(t0 + suspect * 2);
        assert_eq!(probes(drain(&mut m)), 1);
        // Heard from: a late refusal changes nothing, and no probe is asked.
        let heard = t0 + suspect * 2 + ms(1);
        m.handle_heartbeat(heard, "a", IncarnationId(2));
        assert!(!m.handle_refused(heard + ms(1), &"a", IncarnationId(2)));
        m.handle_timeout(heard + suspect - ms(1));
        assert_eq!(probes(drain(&mut m)), 0);
        // Silent again: a refusal of another incarnation or peer changes nothing; of the live
        // one, dead at once.
        let later = heard + suspect;
        assert!(!m.handle_refused(later, &"a", IncarnationId(1)));
        assert!(!m.handle_refused(later, &"b", IncarnationId(2)));
        assert!(m.handle_refused(later, &"a", IncarnationId(2)));
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::PeerDead {
                incarnation: Incarnation::new("a", IncarnationId(2)),
                cause: DeathCause::Refused,
            }]
        );
        assert!(
            !m.handle_refused(later, &"a", IncarnationId(2)),
            "declared once"
        );
    }

    #[test]
    fn silent_peer_is_declared_dead_at_timeout_not_before() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(1));
        drain(&mut m);
        m.handle_timeout(t0 + TIMEOUT - ms(1));
        assert!(drain(&mut m).iter().all(|e| matches!(
            e,
            HeartbeatEvent::SendHeartbeat { .. } | HeartbeatEvent::Probe { .. }
        )));
        assert_eq!(m.peer(&"a"), Some((IncarnationId(1), true)));
        m.handle_timeout(t0 + TIMEOUT);
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::PeerDead {
                incarnation: Incarnation::new("a", IncarnationId(1)),
                cause: DeathCause::Silent {
                    silent_for: TIMEOUT
                }
            }]
        );
        assert_eq!(m.poll_timeout(), None);
        // No heartbeats are sent to a dead peer.
        m.handle_timeout(t0 + TIMEOUT * 3);
        assert_eq!(drain(&mut m), vec![]);
    }

    #[test]
    fn heartbeats_keep_a_peer_alive() {
        let t0 = Instant::now();
        let mut m = machine();
        for i in 0..50 {
            let now = t0 + ms(i * 100);
            assert_ne!(m.handle_heartbeat(now, "a", IncarnationId(1)), Heard::Stale);
            m.handle_timeout(now);
        }
        assert!(drain(&mut m)
            .iter()
            .all(|e| !matches!(e, HeartbeatEvent::PeerDead { .. })));
    }

    #[test]
    fn fence1_dead_incarnation_stays_dead_newer_incarnation_revives() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(1));
        m.handle_timeout(t0 + TIMEOUT);
        drain(&mut m);
        // The frozen process wakes up and speaks again with its old incarnation: ignored.
        assert_eq!(
            m.handle_heartbeat(t0 + ms(500), "a", IncarnationId(1)),
            Heard::Stale
        );
        assert_eq!(
            m.handle_heartbeat(t0 + ms(500), "a", IncarnationId(0)),
            Heard::Stale
        );
        assert_eq!(drain(&mut m), vec![]);
        // Its restarted successor is welcome.
        assert_eq!(
            m.handle_heartbeat(t0 + ms(600), "a", IncarnationId(2)),
            Heard::NewIncarnation
        );
        assert_eq!(
            drain(&mut m),
            vec![HeartbeatEvent::PeerAlive {
                incarnation: Incarnation::new("a", IncarnationId(2))
            }]
        );
        assert_eq!(m.peer(&"a"), Some((IncarnationId(2), true)));
    }

    #[test]
    fn newer_incarnation_while_alive_reports_old_dead_then_new_alive() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(1));
        drain(&mut m);
        assert_eq!(
            m.handle_heartbeat(t0, "a", IncarnationId(3)),
            Heard::NewIncarnation
        );
        assert_eq!(
            drain(&mut m),
            vec![
                HeartbeatEvent::PeerDead {
                    incarnation: Incarnation::new("a", IncarnationId(1)),
                    cause: DeathCause::Superseded
                },
                HeartbeatEvent::PeerAlive {
                    incarnation: Incarnation::new("a", IncarnationId(3))
                },
            ]
        );
        assert_eq!(m.handle_heartbeat(t0, "a", IncarnationId(1)), Heard::Stale);
    }

    #[test]
    fn peers_are_independent_and_forget_starts_afresh() {
        let t0 = Instant::now();
        let mut m = machine();
        m.handle_heartbeat(t0, "a", IncarnationId(1));
        m.handle_heartbeat(t0, "b", IncarnationId(1));
        drain(&mut m);
        m.handle_heartbeat(t0 + ms(300), "b", IncarnationId(1));
        m.handle_timeout(t0 + TIMEOUT);
        let dead: Vec<_> = drain(&mut m)
            .into_iter()
            .filter_map(|e| match e {
                HeartbeatEvent::PeerDead { incarnation, .. } => Some(incarnation.node),
                _ => None,
            })
            .collect();
        assert_eq!(dead, vec!["a"]);
        m.forget(&"a");
        assert_eq!(m.peer_count(), 1);
        assert_eq!(
            m.handle_heartbeat(t0 + ms(400), "a", IncarnationId(1)),
            Heard::NewIncarnation
        );
    }

    proptest! {
        /// Over any order of heartbeats and timer firings: a peer is declared dead exactly when it
        /// has been silent for the timeout, at most once per incarnation, and never while heard
        /// from within the timeout. A gap between firings longer than the timeout is a pause of
        /// this process: it counts as hearing from every live peer.
        #[test]
        fn dead_exactly_when_silent_for_timeout(
            steps in proptest::collection::vec((0u64..200, any::<bool>(), 0u8..3, 0u64..3), 1..200),
        ) {
            let t0 = Instant::now();
            let mut m = machine::<u8>();
            let mut now = t0;
            let mut last: BTreeMap<u8, (u64, Instant, bool)> = BTreeMap::new();
            let mut last_tick: Option<Instant> = None;
            for (gap, is_heartbeat, peer, incarnation) in steps {
                now += ms(gap);
                if is_heartbeat {
                    let heard = m.handle_heartbeat(now, peer, IncarnationId(incarnation));
                    let expected = match last.get(&peer) {
                        None => Heard::NewIncarnation,
                        Some(&(e, _, dead)) if incarnation < e || (incarnation == e && dead) => Heard::Stale,
                        Some(&(e, _, _)) if incarnation == e => Heard::Alive,
                        Some(_) => Heard::NewIncarnation,
                    };
                    prop_assert_eq!(heard, expected);
                    if heard != Heard::Stale {
                        last.insert(peer, (incarnation, now, false));
                    }
                } else {
                    if last_tick.is_some_and(|t| now.duration_since(t) > TIMEOUT) {
                        for state in last.values_mut().filter(|s| !s.2) {
                            state.1 = state.1.max(now);
                        }
                    }
                    last_tick = Some(now);
                    m.handle_timeout(now);
                }
                while let Some(event) = m.poll_event() {
                    if let HeartbeatEvent::PeerDead { incarnation, cause: DeathCause::Silent { silent_for } } = event {
                        let state = last.get_mut(&incarnation.node).expect("dead peer was watched");
                        prop_assert!(!state.2, "declared dead twice");
                        prop_assert_eq!(state.0, incarnation.incarnation.0);
                        prop_assert!(silent_for >= TIMEOUT);
                        prop_assert_eq!(now.duration_since(state.1), silent_for);
                        state.2 = true;
                    }
                }
                if !is_heartbeat {
                    for (_, &(_, heard_at, dead)) in last.iter() {
                        prop_assert_eq!(dead, now.duration_since(heard_at) >= TIMEOUT);
                    }
                }
            }
        }
    }
}
