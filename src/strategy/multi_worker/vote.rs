//! A step boundary's vote, cast before the step and counted in the step's all-reduce: the
//! protocol is [`CastVote`]'s.

use candle_core::{Device, Tensor};

use super::elastic::encode_joiners;
use super::MultiWorkerMirrored;
use crate::collective::Leave;
use crate::collective::ProcessGroup;
use crate::strategy::StrategyError;

/// The largest offer length a vote carries in `f32` (every integer up to 2^24 is exact).
const OFFER_LEN_MAX: usize = 1 << 24;
/// What the leader sums for an offer too long to count ([`OFFER_LEN_MAX`]): not a whole
/// number, so the sum fits no group and the boundary votes by its all-gather.
const UNCOUNTABLE: f32 = 0.5;

/// A step boundary's vote, cast before the step and counted in the step's all-reduce.
///
/// At each step boundary every worker votes (its notice to leave, if any; the leader, rank 0,
/// adds the length of its offer of joiners), and every worker decides the same from the same
/// votes (`collective::boundary::decide`). Gathered by a collective of its own
/// ([`MultiWorkerMirrored::at_step_boundary`]), the vote is a second point in every step where
/// each worker waits for the slowest one's tail of the gradients' all-reduce. A training loop
/// that sums values beside its gradients
/// ([`ReplicatedModel::train_step_summing`](crate::train::ReplicatedModel::train_step_summing))
/// carries the vote in its step instead:
///
/// 1. [`MultiWorkerMirrored::cast_vote`] before the step, with this worker's notice;
/// 2. the step sums [`CastVote::values`] beside its gradients: each worker's vote in a slot of
///    its own and zeros in the others', so the sum holds every vote, exactly (small integers
///    in `f32`);
/// 3. [`CastVote::counted`] with those sums, then
///    [`MultiWorkerMirrored::at_step_boundary_counted`] decides without a collective where
///    nothing changes.
///
/// A notice that comes during the step is voted at the next boundary. The closing boundary,
/// after the last step, is voted by the collective of its own: it is where a worker that
/// applied the last step meets those whose all-reduce failed it, and gives them its state. A
/// counted vote that does not fit the group (another generation, sums of another length or
/// not whole numbers) is voted again the same way; every member sees the same sums, so every
/// member falls back alike.
#[derive(Debug, Clone, PartialEq)]
pub struct CastVote {
    generation: u64,
    rank: usize,
    size: usize,
    leaving: Option<Leave>,
    /// The leader's offer of joiners, as it will broadcast it (empty elsewhere).
    offer: Vec<u8>,
}

impl CastVote {
    /// How many values the step sums for the vote (one per member, and the offer's length).
    #[allow(clippy::len_without_is_empty)] // never empty: a group has a member
    pub fn len(&self) -> usize {
        self.size + 1
    }

    /// The values local replica `local_replica` of this worker sums beside its gradients: on
    /// the first, this worker's vote in its rank's slot (and, on the leader, the offer's length
    /// in the last); zeros on the others, so that a worker's vote is counted once.
    pub fn values(&self, local_replica: usize) -> Vec<f32> {
        let mut values = vec![0.0; self.len()];
        if local_replica == 0 {
            values[self.rank] = Leave::vote(self.leaving) as f32;
            if self.rank == 0 {
                values[self.size] = if self.offer.len() < OFFER_LEN_MAX {
                    self.offer.len() as f32
                } else {
                    // Not countable exactly in f32: a sum no member reads as a length, so that
                    // every member votes again by the all-gather, which carries it whole.
                    UNCOUNTABLE
                };
            }
        }
        values
    }

    /// The vote with `summed`, its values summed across every replica in sync by the step.
    pub fn counted(self, summed: &[f32]) -> CountedVote {
        CountedVote {
            cast: self,
            summed: summed.to_vec(),
        }
    }
}

/// Every worker's vote, counted in a step's all-reduce ([`CastVote::counted`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CountedVote {
    cast: CastVote,
    summed: Vec<f32>,
}

/// How a step boundary is voted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ballot {
    /// By a collective of its own, with this worker's notice.
    Now(Option<Leave>),
    /// In the step before it.
    Counted(CountedVote),
}

/// Every member's vote, in rank order, and the leader's offer of joiners.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tally {
    pub(super) notices: Vec<Option<Leave>>,
    /// The offer's length, in bytes: the same on every member.
    pub(super) offer_len: usize,
    /// The offer itself, on the leader (empty elsewhere).
    pub(super) offer: Vec<u8>,
}

impl CountedVote {
    /// The votes, where they fit the group of `generation` with `n` members: cast in that
    /// generation, one whole vote per member and a whole offer length.
    fn tally(&self, generation: u64, n: usize) -> Option<Tally> {
        if self.cast.generation != generation || self.summed.len() != n + 1 {
            return None;
        }
        let whole = |v: f32| v >= 0.0 && v.fract() == 0.0 && v < OFFER_LEN_MAX as f32;
        if !self.summed.iter().all(|v| whole(*v)) {
            return None;
        }
        Some(Tally {
            notices: self.summed[..n]
                .iter()
                .map(|v| Leave::of_vote(*v as i64))
                .collect(),
            offer_len: self.summed[n] as usize,
            offer: self.cast.offer.clone(),
        })
    }
}

impl MultiWorkerMirrored {
    /// This worker's vote at the next step boundary, to be counted in the step before it:
    /// `leaving` is its notice (see [`MultiWorkerMirrored::at_step_boundary`]), and the
    /// leader adds the joiners waiting now. See [`CastVote`] for the protocol.
    pub fn cast_vote(&self, leaving: Option<Leave>) -> Result<CastVote, StrategyError> {
        let group = self.span.group();
        let offer = if group.rank() == 0 {
            encode_joiners(&group.pending_joiners())?
        } else {
            Vec::new()
        };
        Ok(CastVote {
            generation: group.generation(),
            rank: group.rank(),
            size: group.size(),
            leaving,
            offer,
        })
    }

    /// Every member's vote at this boundary, by `ballot`.
    pub(super) fn tally(
        &self,
        group: &ProcessGroup,
        ballot: Ballot,
    ) -> Result<Tally, StrategyError> {
        let leaving = match ballot {
            Ballot::Now(leaving) => leaving,
            Ballot::Counted(counted) => match counted.tally(group.generation(), group.size()) {
                Some(tally) => return Ok(tally),
                None => counted.cast.leaving,
            },
        };
        let offer = if group.rank() == 0 {
            encode_joiners(&group.pending_joiners())?
        } else {
            Vec::new()
        };
        // Every worker's notice and offer length, in rank order.
        let votes = self
            .span
            .all_gather(&Tensor::new(
                &[Leave::vote(leaving), offer.len() as i64],
                &Device::Cpu,
            )?)?
            .to_vec1::<i64>()?;
        let notices = (0..group.size())
            .map(|r| votes.get(2 * r).and_then(|vote| Leave::of_vote(*vote)))
            .collect();
        let offer_len = votes.get(1).copied().unwrap_or(0).max(0) as usize;
        Ok(Tally {
            notices,
            offer_len,
            offer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cast(rank: usize, size: usize, leaving: Option<Leave>, offer: &[u8]) -> CastVote {
        CastVote {
            generation: 4,
            rank,
            size,
            leaving,
            offer: offer.to_vec(),
        }
    }

    /// What the step's all-reduce gives: every worker's values summed, each over its local
    /// replicas.
    fn summed(votes: &[CastVote], local_replicas: usize) -> Vec<f32> {
        let mut sum = vec![0.0; votes[0].len()];
        for vote in votes {
            for replica in 0..local_replicas {
                for (s, v) in sum.iter_mut().zip(vote.values(replica)) {
                    *s += v;
                }
            }
        }
        sum
    }

    #[test]
    fn every_workers_vote_and_the_leaders_offer_come_back_from_the_sum() {
        let votes = [
            cast(0, 3, None, &[7; 41]),
            cast(1, 3, Some(Leave::Drained), &[]),
            cast(2, 3, Some(Leave::Preempted), &[]),
        ];
        // Two local replicas per worker: each worker's vote is counted once.
        let sums = summed(&votes, 2);
        let tally = votes[0].clone().counted(&sums).tally(4, 3).unwrap();
        assert_eq!(
            tally.notices,
            [None, Some(Leave::Drained), Some(Leave::Preempted)]
        );
        assert_eq!(tally.offer_len, 41);
        assert_eq!(tally.offer, [7; 41]);
        // A member other than the leader knows the offer's length, not its bytes.
        let theirs = votes[1].clone().counted(&sums).tally(4, 3).unwrap();
        assert_eq!((theirs.offer_len, theirs.offer.len()), (41, 0));
        assert_eq!(theirs.notices, tally.notices);
    }

    #[test]
    fn a_counted_vote_that_does_not_fit_the_group_is_voted_again() {
        let votes = [cast(0, 2, None, &[]), cast(1, 2, None, &[])];
        let sums = summed(&votes, 1);
        let counted = votes[0].clone().counted(&sums);
        assert!(counted.tally(4, 2).is_some());
        // Another generation (the group changed since the vote was cast), another size.
        assert_eq!(counted.tally(5, 2), None);
        assert_eq!(counted.tally(4, 3), None);
        // An offer too long to count in f32 makes the sum unreadable on every member, so
        // the boundary votes again by its all-gather rather than admit no one.
        let long = [
            cast(0, 2, None, &vec![1; OFFER_LEN_MAX]),
            cast(1, 2, None, &[]),
        ];
        let sums = summed(&long, 1);
        assert_eq!(long[0].clone().counted(&sums).tally(4, 2), None);
        assert_eq!(long[1].clone().counted(&sums).tally(4, 2), None);
        // Sums that are no whole votes.
        for bad in [0.5, -1.0, f32::NAN, f32::INFINITY] {
            let counted = votes[0].clone().counted(&[0.0, bad, 0.0]);
            assert_eq!(counted.tally(4, 2), None, "{bad}");
        }
    }
}
