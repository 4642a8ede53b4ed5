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
//!
//! A group made with [`LocalGroup::spanning`] also spans processes: once every local member
//! arrived, the last one sums the members' values in process and hands the sum to the
//! [`ProcessSpan`], which sums it across the processes (one group call per round) before every
//! member gets the result; `Mean` divides by the replicas of every process. While the span's
//! call runs, the local members wait without the local timeout (the process group bounds it).
//! Members then number their replicas globally ([`LocalMember::replica_id`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};

use super::{CollectiveError, ProcessSpan};
use crate::distribute::{divide_by, ReduceOp};

/// A group of `size` members that meet in rounds (see the module doc for the protocol).
#[derive(Debug)]
pub struct LocalGroup;

impl LocalGroup {
    /// Makes the `size` members of a new group; a round waits at most `timeout` for all of them.
    pub fn create(size: usize, timeout: Duration) -> Vec<LocalMember> {
        Self::build(size, timeout, None)
    }

    /// Makes the `size` members of a new group whose rounds go on across the processes of
    /// `span` (see the module doc); every process must have `size` members.
    pub fn spanning(size: usize, timeout: Duration, span: ProcessSpan) -> Vec<LocalMember> {
        Self::build(size, timeout, Some(span))
    }

    fn build(size: usize, timeout: Duration, span: Option<ProcessSpan>) -> Vec<LocalMember> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            span,
            state: Mutex::new(State {
                rounds: BTreeMap::new(),
                left_after: vec![None; size],
                broken: None,
            }),
            changed: Condvar::new(),
            exclusive: Mutex::new(()),
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

    /// This member's replica id across every process of the span (its rank without one).
    pub fn replica_id(&self) -> usize {
        match &self.shared.span {
            Some(span) => span.first_replica() + self.rank,
            None => self.rank,
        }
    }

    /// Replicas in sync across every process of the span (the group size without one).
    pub fn num_replicas(&self) -> usize {
        match &self.shared.span {
            Some(span) => span.total_replicas(),
            None => self.shared.size,
        }
    }

    /// The processes this group's rounds span, if any.
    pub fn span(&self) -> Option<&ProcessSpan> {
        self.shared.span.as_ref()
    }

    /// Reduces `value` with every member's value of this round; every member gets the result.
    ///
    /// `Mean` divides the sum by the group size; integer tensors are averaged in f64 and the
    /// result is f64 (as TensorFlow's true division does).
    pub fn all_reduce(&self, op: ReduceOp, value: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.rendezvous(Contribution::Reduce(op, vec![value.clone()]))?;
        out.pop()
            .ok_or_else(|| CollectiveError::Tensor("a reduce round gave no tensor".into()))
    }

    /// Reduces each of `values` with the same-position value of every member, in one round
    /// (across processes: one bucketed call); every member gets the results in order.
    pub fn all_reduce_many(
        &self,
        op: ReduceOp,
        values: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        self.rendezvous(Contribution::Reduce(op, values.to_vec()))
    }

    /// Waits until every member reaches this barrier.
    pub fn barrier(&self) -> Result<(), CollectiveError> {
        self.rendezvous(Contribution::Barrier).map(|_| ())
    }

    /// Reports that this member's step failed in the application with `message`: across a
    /// span, the process group is aborted with it so that every other process's pending call
    /// fails at once ([`CollectiveError::Application`]) instead of waiting for this one until
    /// its timeout. In process, nothing is needed: the peers fail when this member leaves.
    pub fn abort_step(&self, message: &str) {
        if let Some(span) = &self.shared.span {
            span.abort(message);
        }
    }

    /// Holds off every other member of this group from work that must be done by one member
    /// at a time for all of them (creating a variable inside `run`), until the guard drops.
    /// Not a round: members that never ask are not waited for.
    pub(crate) fn exclusive(&self) -> MutexGuard<'_, ()> {
        self.shared
            .exclusive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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

    fn rendezvous(&self, contribution: Contribution) -> Result<Vec<Tensor>, CollectiveError> {
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
            spanning: false,
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
            entry.slots[self.rank] = contribution.into_tensors();
            entry.arrived += 1;
            if entry.arrived == size {
                let kind = entry.kind;
                match &shared.span {
                    None => {
                        entry.result = Some(combine(round, kind, &mut entry.slots, size));
                    }
                    Some(span) => {
                        // The span's call may take long: run it without the lock, the other
                        // members waiting for its result (see the module doc).
                        entry.spanning = true;
                        let mut slots = std::mem::take(&mut entry.slots);
                        drop(state);
                        let result = combine_spanning(round, kind, &mut slots, span);
                        state = shared.lock();
                        if let Some(entry) = state.rounds.get_mut(&round) {
                            entry.result = Some(result);
                        }
                    }
                }
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
            let spanning = state.rounds.get(&round).is_some_and(|r| r.spanning);
            if spanning {
                // Bounded by the process group; wake now and then to look again.
                state = shared
                    .changed
                    .wait_timeout(state, SPAN_POLL)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
                continue;
            }
            if let Some(err) = peer_left_before(&state, round) {
                return Err(shared.break_group(&mut state, err));
            }
            let now = Instant::now();
            if now >= deadline {
                let err = CollectiveError::Timeout {
                    round,
                    timeout_ms: u64::try_from(shared.timeout.as_millis()).unwrap_or(u64::MAX),
                    missing: missing_ranks(&state, round),
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

/// The ranks whose contribution to `round` has not arrived.
fn missing_ranks(state: &State, round: u64) -> Vec<usize> {
    state
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
        .unwrap_or_default()
}

/// How often a member waiting for a span's call looks at its round again.
const SPAN_POLL: Duration = Duration::from_millis(200);

#[derive(Debug)]
struct Shared {
    size: usize,
    timeout: Duration,
    span: Option<ProcessSpan>,
    state: Mutex<State>,
    changed: Condvar,
    /// See [`LocalMember::exclusive`].
    exclusive: Mutex<()>,
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
    slots: Vec<Option<Vec<Tensor>>>,
    arrived: usize,
    /// Every member arrived and the span's call is under way.
    spanning: bool,
    result: Option<Result<Vec<Tensor>, CollectiveError>>,
    taken: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundKind {
    /// A reduction of this many tensors.
    Reduce(ReduceOp, usize),
    Barrier,
}

impl std::fmt::Display for RoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = |op: &ReduceOp| match op {
            ReduceOp::Sum => "SUM",
            ReduceOp::Mean => "MEAN",
        };
        match self {
            RoundKind::Reduce(o, 1) => write!(f, "all_reduce({})", op(o)),
            RoundKind::Reduce(o, n) => write!(f, "all_reduce_many({}, {n} tensors)", op(o)),
            RoundKind::Barrier => f.write_str("barrier"),
        }
    }
}

enum Contribution {
    Reduce(ReduceOp, Vec<Tensor>),
    Barrier,
}

impl Contribution {
    fn kind(&self) -> RoundKind {
        match self {
            Contribution::Reduce(op, t) => RoundKind::Reduce(*op, t.len()),
            Contribution::Barrier => RoundKind::Barrier,
        }
    }

    fn into_tensors(self) -> Option<Vec<Tensor>> {
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
            Some(calls)
                if *calls <= round
                    && slots.is_none_or(|s| s.get(rank).is_none_or(Option::is_none)) =>
            {
                Some(CollectiveError::PeerLeft {
                    round,
                    rank,
                    calls: *calls,
                })
            }
            _ => None,
        })
}

/// The round's result in process: each position's tensors summed in rank order, divided by
/// `replicas` for `Mean`.
fn combine(
    round: u64,
    kind: RoundKind,
    slots: &mut [Option<Vec<Tensor>>],
    replicas: usize,
) -> Result<Vec<Tensor>, CollectiveError> {
    let op = match kind {
        RoundKind::Barrier => return Ok(Vec::new()),
        RoundKind::Reduce(op, _) => op,
    };
    sums(round, slots)?
        .iter()
        .map(|sum| finish(op, sum, replicas))
        .collect()
}

/// The round's result across the span's processes: the in-process sums, summed across the
/// processes (one call), divided by every process's replicas for `Mean`.
fn combine_spanning(
    round: u64,
    kind: RoundKind,
    slots: &mut [Option<Vec<Tensor>>],
    span: &ProcessSpan,
) -> Result<Vec<Tensor>, CollectiveError> {
    let op = match kind {
        RoundKind::Barrier => return span.barrier().map(|()| Vec::new()),
        RoundKind::Reduce(op, _) => op,
    };
    let local = sums(round, slots)?;
    let across = match local.len() {
        0 => Vec::new(),
        1 => vec![span.sum(&local[0])?],
        _ => span.sum_many(&local)?,
    };
    across
        .iter()
        .map(|sum| finish(op, sum, span.total_replicas()))
        .collect()
}

/// Each position's tensors of every member, summed in rank order; members must agree on
/// shapes and dtypes.
fn sums(round: u64, slots: &mut [Option<Vec<Tensor>>]) -> Result<Vec<Tensor>, CollectiveError> {
    let members: Vec<Vec<Tensor>> = slots.iter_mut().filter_map(Option::take).collect();
    let Some(first) = members.first() else {
        return Ok(Vec::new());
    };
    for (rank, tensors) in members.iter().enumerate().skip(1) {
        for (t, f) in tensors.iter().zip(first) {
            if t.dims() != f.dims() || t.dtype() != f.dtype() {
                return Err(CollectiveError::TensorMismatch {
                    round,
                    rank,
                    expected: describe(f),
                    got: describe(t),
                });
            }
        }
    }
    let tensor_err = |e: candle_core::Error| CollectiveError::Tensor(e.to_string());
    (0..first.len())
        .map(|i| {
            let mut sum = first[i].clone();
            for tensors in &members[1..] {
                sum = sum.add(&tensors[i]).map_err(tensor_err)?;
            }
            Ok(sum)
        })
        .collect()
}

fn finish(op: ReduceOp, sum: &Tensor, replicas: usize) -> Result<Tensor, CollectiveError> {
    match op {
        ReduceOp::Sum => Ok(sum.clone()),
        ReduceOp::Mean => {
            divide_by(sum, replicas as f64).map_err(|e| CollectiveError::Tensor(e.to_string()))
        }
    }
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
