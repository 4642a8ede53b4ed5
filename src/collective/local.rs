//! The in-process collective group: a real rendezvous of `size` members, one per replica thread.
//!
//! Calling protocol, per member:
//! 1. [`LocalGroup::create`] makes the members; each is moved to its replica's thread.
//! 2. Each member calls [`LocalMember::all_reduce`] / [`LocalMember::barrier`]; the `k`-th call
//!    of every member meets the `k`-th call of every other member (a *round*).
//! 3. When a member is done with the step, it calls [`LocalMember::leave`]: a peer still
//!    waiting in a round this member will never join gets [`CollectiveError::PeerLeft`] at once.
//!
//! A round that is not complete within the group's timeout breaks the group: the waiting
//! members and every later call get the error. A group serves one step; the strategies make a
//! fresh one per `run`, so one broken step never poisons the next.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};

use super::CollectiveError;
use crate::distribute::{divide_by, ReduceOp};

/// A group of `size` members that meet in rounds (see the module doc for the protocol).
#[derive(Debug)]
pub struct LocalGroup;

impl LocalGroup {
    /// Makes the `size` members of a new group; a round waits at most `timeout` for all of them.
    pub fn create(size: usize, timeout: Duration) -> Vec<LocalMember> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State {
                rounds: BTreeMap::new(),
                left_after: vec![None; size],
                broken: None,
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalMember {
                shared: Arc::clone(&shared),
                rank,
                next_round: AtomicU64::new(0),
            })
            .collect()
    }
}

/// One member of a [`LocalGroup`], used from its replica's thread.
#[derive(Debug)]
pub struct LocalMember {
    shared: Arc<Shared>,
    rank: usize,
    next_round: AtomicU64,
}

impl LocalMember {
    /// This member's rank in the group (the replica id in sync group).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of members in the group.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Reduces `value` with every member's value of this round; every member gets the result.
    ///
    /// `Mean` divides the sum by the group size; integer tensors are averaged in f64 and the
    /// result is f64 (as TensorFlow's true division does).
    pub fn all_reduce(&self, op: ReduceOp, value: &Tensor) -> Result<Tensor, CollectiveError> {
        self.rendezvous(Contribution::Reduce(op, value.clone()))
            .map(|out| out.expect("a reduce round always yields a tensor"))
    }

    /// Waits until every member reaches this barrier.
    pub fn barrier(&self) -> Result<(), CollectiveError> {
        self.rendezvous(Contribution::Barrier).map(|_| ())
    }

    /// Marks this member done with the step (see the module doc); later calls fail.
    pub fn leave(&self) {
        let calls = self.next_round.load(Ordering::SeqCst);
        let mut state = self.shared.lock();
        if state.left_after[self.rank].is_none() {
            state.left_after[self.rank] = Some(calls);
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    fn rendezvous(&self, contribution: Contribution) -> Result<Option<Tensor>, CollectiveError> {
        let shared = &self.shared;
        let mut state = shared.lock();
        if state.left_after[self.rank].is_some() {
            return Err(CollectiveError::AlreadyLeft { rank: self.rank });
        }
        let round = self.next_round.fetch_add(1, Ordering::SeqCst);
        if let Some(err) = &state.broken {
            return Err(err.clone());
        }
        let size = shared.size;
        let entry = state.rounds.entry(round).or_insert_with(|| Round {
            kind: contribution.kind(),
            slots: vec![None; size],
            arrived: 0,
            result: None,
            taken: 0,
        });
        if entry.result.is_none() {
            let kind = contribution.kind();
            if entry.kind != kind {
                let err = CollectiveError::OpMismatch {
                    round,
                    first: entry.kind.to_string(),
                    other: kind.to_string(),
                };
                return Err(shared.break_group(&mut state, err));
            }
            entry.slots[self.rank] = contribution.into_tensor();
            entry.arrived += 1;
            if entry.arrived == size {
                let result = combine(round, entry.kind, &mut entry.slots);
                entry.result = Some(result);
                shared.changed.notify_all();
            }
        }
        let deadline = Instant::now() + shared.timeout;
        loop {
            if let Some(round_state) = state.rounds.get_mut(&round) {
                if let Some(result) = round_state.result.clone() {
                    round_state.taken += 1;
                    if round_state.taken == size {
                        state.rounds.remove(&round);
                    }
                    return result;
                }
            }
            if let Some(err) = &state.broken {
                return Err(err.clone());
            }
            if let Some(err) = peer_left_before(&state, round) {
                return Err(shared.break_group(&mut state, err));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = state
                    .rounds
                    .get(&round)
                    .map(|r| {
                        r.slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(rank, _)| rank)
                            .collect()
                    })
                    .unwrap_or_default();
                let err = CollectiveError::Timeout {
                    round,
                    timeout_ms: u64::try_from(shared.timeout.as_millis()).unwrap_or(u64::MAX),
                    missing,
                };
                return Err(shared.break_group(&mut state, err));
            }
            state = shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }
}

#[derive(Debug)]
struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking replica cannot leave the state half-updated in a way that matters: every
        // update below is a single assignment, so poisoning is safe to ignore.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn break_group(&self, state: &mut State, err: CollectiveError) -> CollectiveError {
        if state.broken.is_none() {
            state.broken = Some(err.clone());
        }
        self.changed.notify_all();
        err
    }
}

#[derive(Debug)]
struct State {
    rounds: BTreeMap<u64, Round>,
    /// For each member that left: how many rounds it joined.
    left_after: Vec<Option<u64>>,
    broken: Option<CollectiveError>,
}

#[derive(Debug)]
struct Round {
    kind: RoundKind,
    slots: Vec<Option<Tensor>>,
    arrived: usize,
    result: Option<Result<Option<Tensor>, CollectiveError>>,
    taken: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundKind {
    Reduce(ReduceOp),
    Barrier,
}

impl std::fmt::Display for RoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RoundKind::Reduce(ReduceOp::Sum) => f.write_str("all_reduce(SUM)"),
            RoundKind::Reduce(ReduceOp::Mean) => f.write_str("all_reduce(MEAN)"),
            RoundKind::Barrier => f.write_str("barrier"),
        }
    }
}

enum Contribution {
    Reduce(ReduceOp, Tensor),
    Barrier,
}

impl Contribution {
    fn kind(&self) -> RoundKind {
        match self {
            Contribution::Reduce(op, _) => RoundKind::Reduce(*op),
            Contribution::Barrier => RoundKind::Barrier,
        }
    }

    fn into_tensor(self) -> Option<Tensor> {
        match self {
            Contribution::Reduce(_, t) => Some(t),
            Contribution::Barrier => None,
        }
    }
}

fn peer_left_before(state: &State, round: u64) -> Option<CollectiveError> {
    let slots = state.rounds.get(&round).map(|r| &r.slots);
    state
        .left_after
        .iter()
        .enumerate()
        .find_map(|(rank, left)| match left {
            Some(calls) if *calls <= round && slots.is_none_or(|s| s[rank].is_none()) => {
                Some(CollectiveError::PeerLeft {
                    round,
                    rank,
                    calls: *calls,
                })
            }
            _ => None,
        })
}

fn combine(
    round: u64,
    kind: RoundKind,
    slots: &mut [Option<Tensor>],
) -> Result<Option<Tensor>, CollectiveError> {
    let op = match kind {
        RoundKind::Barrier => return Ok(None),
        RoundKind::Reduce(op) => op,
    };
    let tensors: Vec<Tensor> = slots.iter_mut().filter_map(Option::take).collect();
    let first = &tensors[0];
    for (rank, t) in tensors.iter().enumerate().skip(1) {
        if t.dims() != first.dims() || t.dtype() != first.dtype() {
            return Err(CollectiveError::TensorMismatch {
                round,
                rank,
                expected: describe(first),
                got: describe(t),
            });
        }
    }
    let tensor_err = |e: candle_core::Error| CollectiveError::Tensor(e.to_string());
    let mut sum = first.clone();
    for t in &tensors[1..] {
        sum = sum.add(t).map_err(tensor_err)?;
    }
    let out = match op {
        ReduceOp::Sum => sum,
        ReduceOp::Mean => divide_by(&sum, tensors.len() as f64).map_err(tensor_err)?,
    };
    Ok(Some(out))
}

fn describe(t: &Tensor) -> String {
    let dtype: DType = t.dtype();
    format!("{:?} {:?}", t.dims(), dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn all_reduce_sums_across_threads() {
        let members = LocalGroup::create(3, Duration::from_secs(10));
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| {
                std::thread::spawn(move || {
                    let t = Tensor::new(&[m.rank() as f32, 1.0], &Device::Cpu).unwrap();
                    let a = m.all_reduce(ReduceOp::Sum, &t).unwrap();
                    let b = m.all_reduce(ReduceOp::Mean, &t).unwrap();
                    m.barrier().unwrap();
                    m.leave();
                    (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap())
                })
            })
            .collect();
        for h in handles {
            let (a, b) = h.join().unwrap();
            assert_eq!(a, vec![3.0, 3.0]);
            assert_eq!(b, vec![1.0, 1.0]);
        }
    }

    #[test]
    fn peer_that_leaves_fails_the_waiting_round_at_once() {
        let mut members = LocalGroup::create(2, Duration::from_secs(30));
        let m1 = members.pop().unwrap();
        let m0 = members.pop().unwrap();
        let waiter = std::thread::spawn(move || {
            let t = Tensor::new(1f32, &Device::Cpu).unwrap();
            m0.all_reduce(ReduceOp::Sum, &t)
        });
        m1.leave();
        let err = waiter.join().unwrap().unwrap_err();
        assert!(
            matches!(err, CollectiveError::PeerLeft { rank: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_peer_times_out() {
        let members = LocalGroup::create(2, Duration::from_millis(50));
        let t = Tensor::new(1f32, &Device::Cpu).unwrap();
        let err = members[0].all_reduce(ReduceOp::Sum, &t).unwrap_err();
        assert!(
            matches!(err, CollectiveError::Timeout { ref missing, .. } if missing == &[1]),
            "{err}"
        );
        // The group stays broken for the late member too.
        assert_eq!(members[1].barrier().unwrap_err(), err);
    }

    #[test]
    fn mismatched_shapes_are_an_error_for_everyone() {
        let members = LocalGroup::create(2, Duration::from_secs(10));
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| {
                std::thread::spawn(move || {
                    let t = Tensor::zeros(m.rank() + 1, DType::F32, &Device::Cpu).unwrap();
                    m.all_reduce(ReduceOp::Sum, &t)
                })
            })
            .collect();
        for h in handles {
            let err = h.join().unwrap().unwrap_err();
            assert!(
                matches!(err, CollectiveError::TensorMismatch { .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn many_rounds_of_mixed_collectives_stay_in_step() {
        const SIZE: usize = 4;
        const ROUNDS: usize = 200;
        let members = LocalGroup::create(SIZE, Duration::from_secs(30));
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| {
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        if round % 3 == 2 {
                            m.barrier().unwrap();
                            continue;
                        }
                        let v = (m.rank() * 1000 + round) as f64;
                        let t = Tensor::new(&[v, 1.0], &Device::Cpu).unwrap();
                        let op = if round % 2 == 0 {
                            ReduceOp::Sum
                        } else {
                            ReduceOp::Mean
                        };
                        let out = m.all_reduce(op, &t).unwrap().to_vec1::<f64>().unwrap();
                        let sum = (0..SIZE).map(|r| (r * 1000 + round) as f64).sum::<f64>();
                        let expected = match op {
                            ReduceOp::Sum => vec![sum, SIZE as f64],
                            ReduceOp::Mean => vec![sum / SIZE as f64, 1.0],
                        };
                        assert_eq!(out, expected, "rank {} round {round}", m.rank());
                    }
                    m.leave();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn members_disagreeing_on_the_operation_all_fail() {
        let members = LocalGroup::create(2, Duration::from_secs(10));
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| {
                std::thread::spawn(move || {
                    let t = Tensor::new(1f32, &Device::Cpu).unwrap();
                    if m.rank() == 0 {
                        m.all_reduce(ReduceOp::Sum, &t).map(|_| ())
                    } else {
                        m.barrier()
                    }
                })
            })
            .collect();
        for h in handles {
            let err = h.join().unwrap().unwrap_err();
            assert!(matches!(err, CollectiveError::OpMismatch { .. }), "{err}");
        }
    }

    #[test]
    fn a_member_that_left_cannot_join_again() {
        let members = LocalGroup::create(1, Duration::from_secs(1));
        members[0].leave();
        assert_eq!(
            members[0].barrier().unwrap_err(),
            CollectiveError::AlreadyLeft { rank: 0 }
        );
    }
}
