//! A seeded fault plan for datagrams, and the shared handle that changes it at run time.
//!
//! The decision for each datagram is a pure function of the plan, the two addresses and the
//! RNG state ([`FaultState::decide`]): no IO, no clock. The same seed and the same sequence of
//! datagrams give the same decisions, so a failing chaos run can be replayed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What to do to datagrams. Probabilities are in `0.0..=1.0` and are clamped to it.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    /// Seed of the decision RNG.
    pub seed: u64,
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Extra delay for every delivered datagram, uniform in this range.
    pub delay: RangeInclusive<Duration>,
    /// Probability that a delivered datagram is sent twice.
    pub duplicate: f64,
    /// Probability that a delivered datagram is held back by `reorder_hold`, so that later
    /// ones overtake it.
    pub reorder: f64,
    /// How long a reordered datagram is held back.
    pub reorder_hold: Duration,
    /// Address pairs that cannot reach each other, in either direction.
    pub partitions: BTreeSet<(SocketAddr, SocketAddr)>,
    /// Addresses cut off from everyone.
    pub isolated: BTreeSet<SocketAddr>,
    /// Loss probability between an address pair, either direction, where it exceeds `loss`
    /// (keys ordered: the smaller address first).
    pub pair_loss: BTreeMap<(SocketAddr, SocketAddr), f64>,
}

/// The fate of one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Do not deliver it.
    Drop(DropCause),
    /// Deliver it `copies` times (1 or 2) after `delay`.
    Deliver {
        /// How long to hold it before sending.
        delay: Duration,
        /// How many copies to send.
        copies: u8,
    },
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropCause {
    /// The two addresses are partitioned (or one is isolated).
    Partition,
    /// Random loss.
    Loss,
}

/// Counts of decisions taken so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Datagrams decided on.
    pub seen: u64,
    /// Dropped by a partition.
    pub partitioned: u64,
    /// Dropped by random loss.
    pub lost: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Held back to be reordered.
    pub reordered: u64,
}

/// A plan plus its RNG: the pure decision machine.
#[derive(Debug, Clone)]
pub struct FaultState {
    plan: FaultPlan,
    rng: ChaCha8Rng,
    stats: FaultStats,
}

/// A cloneable handle to one shared [`FaultState`]; every chaos socket built from it follows
/// changes made through any clone.
#[derive(Debug, Clone)]
pub struct FaultControl {
    state: Arc<Mutex<FaultState>>,
}

impl FaultPlan {
    /// A plan that lets everything through untouched.
    pub fn none(seed: u64) -> Self {
        Self {
            seed,
            loss: 0.0,
            delay: Duration::ZERO..=Duration::ZERO,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_hold: Duration::from_millis(5),
            partitions: BTreeSet::new(),
            isolated: BTreeSet::new(),
            pair_loss: BTreeMap::new(),
        }
    }

    /// Whether datagrams between `a` and `b` are cut, in either direction.
    pub fn is_partitioned(&self, a: SocketAddr, b: SocketAddr) -> bool {
        self.isolated.contains(&a)
            || self.isolated.contains(&b)
            || self.partitions.contains(&ordered(a, b))
    }

    /// The loss probability between `a` and `b`: the larger of `loss` and the pair's own.
    pub fn loss_between(&self, a: SocketAddr, b: SocketAddr) -> f64 {
        let pair = self
            .pair_loss
            .get(&ordered(a, b))
            .copied()
            .map_or(0.0, clamp);
        clamp(self.loss).max(pair)
    }
}

impl FaultState {
    /// A machine for `plan`, its RNG seeded from `plan.seed`.
    pub fn new(plan: FaultPlan) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(plan.seed),
            plan,
            stats: FaultStats::default(),
        }
    }

    /// Decides the fate of one datagram from `from` to `to`.
    ///
    /// Always draws the same number of random values, whatever the outcome, so that changing
    /// one probability does not shift every later decision.
    pub fn decide(&mut self, from: SocketAddr, to: SocketAddr) -> Decision {
        let loss_roll: f64 = self.rng.gen();
        let delay_roll: f64 = self.rng.gen();
        let duplicate_roll: f64 = self.rng.gen();
        let reorder_roll: f64 = self.rng.gen();
        self.stats.seen += 1;
        if self.plan.is_partitioned(from, to) {
            self.stats.partitioned += 1;
            return Decision::Drop(DropCause::Partition);
        }
        if loss_roll < self.plan.loss_between(from, to) {
            self.stats.lost += 1;
            return Decision::Drop(DropCause::Loss);
        }
        let (low, high) = (*self.plan.delay.start(), *self.plan.delay.end());
        let mut delay = if high > low {
            low + (high - low).mul_f64(delay_roll)
        } else {
            low
        };
        if reorder_roll < clamp(self.plan.reorder) {
            self.stats.reordered += 1;
            delay = delay.saturating_add(self.plan.reorder_hold);
        }
        let copies = if duplicate_roll < clamp(self.plan.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        Decision::Deliver { delay, copies }
    }

    /// The plan in force.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// Changes the plan, keeping the RNG stream going.
    pub fn plan_mut(&mut self) -> &mut FaultPlan {
        &mut self.plan
    }

    /// Puts `plan` in force: the RNG stream goes on under the same seed, and starts again
    /// from `plan.seed` when the seed changed (so a plan's seed alone fixes its draws).
    pub fn replace_plan(&mut self, plan: FaultPlan) {
        if plan.seed != self.plan.seed {
            self.rng = ChaCha8Rng::seed_from_u64(plan.seed);
        }
        self.plan = plan;
    }

    /// Decisions taken so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }
}

impl FaultControl {
    /// A shared handle over a fresh machine for `plan`.
    pub fn new(plan: FaultPlan) -> Self {
        Self {
            state: Arc::new(Mutex::new(FaultState::new(plan))),
        }
    }

    /// Decides the fate of one datagram (see [`FaultState::decide`]).
    pub fn decide(&self, from: SocketAddr, to: SocketAddr) -> Decision {
        self.lock().decide(from, to)
    }

    /// Whether `a` and `b` are cut from each other now.
    pub fn is_partitioned(&self, a: SocketAddr, b: SocketAddr) -> bool {
        self.lock().plan.is_partitioned(a, b)
    }

    /// Cuts `a` and `b` from each other, both directions.
    pub fn partition(&self, a: SocketAddr, b: SocketAddr) {
        self.lock().plan.partitions.insert(ordered(a, b));
    }

    /// Cuts `addr` from everyone.
    pub fn isolate(&self, addr: SocketAddr) {
        self.lock().plan.isolated.insert(addr);
    }

    /// Removes every partition and isolation.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.plan.partitions.clear();
        state.plan.isolated.clear();
    }

    /// Puts `plan` in force in every socket sharing this handle (see
    /// [`FaultState::replace_plan`]).
    pub fn replace_plan(&self, plan: FaultPlan) {
        self.lock().replace_plan(plan);
    }

    /// Sets the loss probability between `a` and `b` (both directions), where it exceeds the
    /// loss of every datagram.
    pub fn set_pair_loss(&self, a: SocketAddr, b: SocketAddr, loss: f64) {
        self.lock().plan.pair_loss.insert(ordered(a, b), loss);
    }

    /// Sets the loss probability.
    pub fn set_loss(&self, loss: f64) {
        self.lock().plan.loss = loss;
    }

    /// Sets the duplicate probability.
    pub fn set_duplicate(&self, duplicate: f64) {
        self.lock().plan.duplicate = duplicate;
    }

    /// Sets the reorder probability.
    pub fn set_reorder(&self, reorder: f64) {
        self.lock().plan.reorder = reorder;
    }

    /// Sets the delay range.
    pub fn set_delay(&self, delay: RangeInclusive<Duration>) {
        self.lock().plan.delay = delay;
    }

    /// A copy of the plan in force.
    pub fn plan(&self) -> FaultPlan {
        self.lock().plan.clone()
    }

    /// Decisions taken so far, across every socket sharing this handle.
    pub fn stats(&self) -> FaultStats {
        self.lock().stats
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding this lock cannot leave the plan half-updated: every update is
        // one assignment. So a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn ordered(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

fn clamp(p: f64) -> f64 {
    if p.is_nan() {
        0.0
    } else {
        p.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_longest_delay_plus_a_reorder_hold_saturates() {
        // `delay + reorder_hold` used to overflow (a panic) for the longest delays.
        let mut state = FaultState::new(FaultPlan {
            delay: Duration::MAX..=Duration::MAX,
            reorder: 1.0,
            ..FaultPlan::none(9)
        });
        let decision = state.decide(addr(1), addr(2));
        assert_eq!(
            decision,
            Decision::Deliver {
                delay: Duration::MAX,
                copies: 1
            }
        );
    }

    #[test]
    fn no_faults_delivers_everything_once_without_delay() {
        let mut state = FaultState::new(FaultPlan::none(1));
        for _ in 0..1000 {
            assert_eq!(
                state.decide(addr(1), addr(2)),
                Decision::Deliver {
                    delay: Duration::ZERO,
                    copies: 1
                }
            );
        }
    }

    #[test]
    fn same_seed_same_decisions_different_seed_different() {
        let plan = FaultPlan {
            loss: 0.3,
            duplicate: 0.2,
            reorder: 0.2,
            delay: Duration::from_millis(1)..=Duration::from_millis(9),
            ..FaultPlan::none(42)
        };
        let run = |plan: FaultPlan| {
            let mut state = FaultState::new(plan);
            (0..500)
                .map(|_| state.decide(addr(1), addr(2)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(plan.clone()), run(plan.clone()));
        assert_ne!(run(plan.clone()), run(FaultPlan { seed: 43, ..plan }));
    }

    #[test]
    fn rates_are_close_to_the_plan() {
        let mut state = FaultState::new(FaultPlan {
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.05,
            ..FaultPlan::none(7)
        });
        for _ in 0..20_000 {
            state.decide(addr(1), addr(2));
        }
        let stats = state.stats();
        let rate = |n: u64| n as f64 / stats.seen as f64;
        assert!((rate(stats.lost) - 0.1).abs() < 0.015, "{stats:?}");
        // Duplicates and reorders only among delivered datagrams (90%).
        assert!((rate(stats.duplicated) - 0.045).abs() < 0.01, "{stats:?}");
        assert!((rate(stats.reordered) - 0.045).abs() < 0.01, "{stats:?}");
    }

    #[test]
    fn partition_cuts_both_directions_only_between_the_pair_and_heals() {
        let control = FaultControl::new(FaultPlan::none(3));
        control.partition(addr(1), addr(2));
        assert_eq!(
            control.decide(addr(1), addr(2)),
            Decision::Drop(DropCause::Partition)
        );
        assert_eq!(
            control.decide(addr(2), addr(1)),
            Decision::Drop(DropCause::Partition)
        );
        assert!(matches!(
            control.decide(addr(1), addr(3)),
            Decision::Deliver { .. }
        ));
        control.isolate(addr(3));
        assert_eq!(
            control.decide(addr(4), addr(3)),
            Decision::Drop(DropCause::Partition)
        );
        control.heal();
        assert!(matches!(
            control.decide(addr(1), addr(2)),
            Decision::Deliver { .. }
        ));
        assert!(matches!(
            control.decide(addr(4), addr(3)),
            Decision::Deliver { .. }
        ));
        assert_eq!(control.stats().partitioned, 3);
    }

    #[test]
    fn pair_loss_hits_only_its_pair_and_a_new_seed_restarts_the_draws() {
        let control = FaultControl::new(FaultPlan::none(6));
        control.set_pair_loss(addr(2), addr(1), 1.0);
        for _ in 0..100 {
            assert_eq!(
                control.decide(addr(1), addr(2)),
                Decision::Drop(DropCause::Loss)
            );
            assert!(matches!(
                control.decide(addr(1), addr(3)),
                Decision::Deliver { .. }
            ));
        }
        let draws = |control: &FaultControl| {
            (0..200)
                .map(|_| control.decide(addr(1), addr(3)))
                .collect::<Vec<_>>()
        };
        let lossy = FaultPlan {
            loss: 0.5,
            ..FaultPlan::none(8)
        };
        control.replace_plan(lossy.clone());
        assert!(control.plan().pair_loss.is_empty());
        let first = draws(&control);
        control.replace_plan(FaultPlan::none(9));
        control.replace_plan(lossy.clone());
        assert_eq!(draws(&control), first);
        // The same seed again: the stream goes on rather than repeating.
        control.replace_plan(lossy);
        assert_ne!(draws(&control), first);
    }

    #[test]
    fn full_loss_drops_all_and_delay_stays_in_range() {
        let control = FaultControl::new(FaultPlan {
            delay: Duration::from_millis(2)..=Duration::from_millis(4),
            ..FaultPlan::none(5)
        });
        for _ in 0..200 {
            match control.decide(addr(1), addr(2)) {
                Decision::Deliver { delay, copies: 1 } => {
                    assert!(delay >= Duration::from_millis(2) && delay <= Duration::from_millis(4))
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        control.set_loss(1.0);
        for _ in 0..200 {
            assert_eq!(
                control.decide(addr(1), addr(2)),
                Decision::Drop(DropCause::Loss)
            );
        }
        control.set_loss(f64::NAN);
        assert!(matches!(
            control.decide(addr(1), addr(2)),
            Decision::Deliver { .. }
        ));
    }
}
