//! The simulator's collectives: what carries out a member machine's rounds
//! ([`MemberAction::RunRound`](crate::collective::MemberAction)) over the simulated network,
//! as production's group runs them over its links. Each process keeps the pieces of its
//! group's collectives that came ([`Rounds`]), each with the process that sent it; a round
//! takes a member's piece only from the process of it the group linked with (as production's
//! links are connections of one process), and a piece of a generation that is not its group's
//! is refused (EPOCH-1), the refusal ending the sender's group.

use std::collections::BTreeMap;

use cohort_transport::NodeId;

use crate::collective::Piece;
use crate::process::Incarnation;

/// A message of the simulated collectives' plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RoundMessage {
    /// A member's piece of collective `seq` of the group of `generation`, sent by its
    /// `process`.
    Piece {
        generation: u64,
        seq: u64,
        piece: Piece,
        process: Incarnation,
    },
    /// A piece of `generation` reached a process whose group is of another generation.
    Refused { generation: u64 },
}

/// The round a machine awaits.
#[derive(Debug, Clone)]
struct Awaited {
    generation: u64,
    seq: u64,
    /// Each member whose piece the round awaits, with the process of it the group linked with.
    from: Vec<(NodeId, Option<Incarnation>)>,
}

/// A round that ended: its generation, number, and every awaited member's piece in rank order.
pub(super) type RoundDone = (u64, u64, Vec<Piece>);

/// What became of a piece that arrived ([`Rounds::received`]).
#[derive(Debug)]
pub(super) enum Received {
    /// The receiver's group is of another generation: the sender is told.
    Refuse,
    /// Kept until its round is run, or its round still awaits others.
    Kept,
    /// It completed the awaited round.
    Done(RoundDone),
}

/// One process's collectives: the pieces that came, and the round its machine awaits.
#[derive(Debug, Default)]
pub(super) struct Rounds {
    /// Pieces by (generation, collective, sender), of the process's group's generation only,
    /// with the sender's process (the latest piece of each key).
    pieces: BTreeMap<(u64, u64, NodeId), (Incarnation, Piece)>,
    awaited: Option<Awaited>,
}

impl Rounds {
    /// The machine of process `me` runs collective `seq` of `generation`, with its `piece`
    /// where it sends one, awaiting the pieces of `from`: the round's end if they all came.
    pub(super) fn run(
        &mut self,
        me: (&NodeId, Incarnation),
        generation: u64,
        seq: u64,
        piece: Option<Piece>,
        from: Vec<(NodeId, Option<Incarnation>)>,
    ) -> Option<RoundDone> {
        self.keep_generation(generation);
        if let Some(piece) = piece {
            self.pieces
                .insert((generation, seq, me.0.clone()), (me.1, piece));
        }
        self.awaited = Some(Awaited {
            generation,
            seq,
            from,
        });
        self.complete()
    }

    /// `piece` of collective `seq` of `generation` came from `from`'s `process` while the
    /// machine's group is of generation `current` (none: it has no group).
    pub(super) fn received(
        &mut self,
        current: Option<u64>,
        (from, process): (NodeId, Incarnation),
        generation: u64,
        seq: u64,
        piece: Piece,
    ) -> Received {
        if current != Some(generation) {
            return Received::Refuse;
        }
        self.keep_generation(generation);
        self.pieces.insert((generation, seq, from), (process, piece));
        match self.complete() {
            Some(done) => Received::Done(done),
            None => Received::Kept,
        }
    }

    /// Drops the pieces of every generation but `generation` (a new group's collectives start
    /// afresh).
    fn keep_generation(&mut self, generation: u64) {
        self.pieces.retain(|(g, _, _), _| *g == generation);
        if self
            .awaited
            .as_ref()
            .is_some_and(|a| a.generation != generation)
        {
            self.awaited = None;
        }
    }

    /// The awaited round, once every piece of it came; its pieces and the earlier rounds' are
    /// dropped.
    fn complete(&mut self) -> Option<RoundDone> {
        let awaited = self.awaited.as_ref()?;
        let (generation, seq) = (awaited.generation, awaited.seq);
        let piece_of = |(node, linked): &(NodeId, Option<Incarnation>)| {
            let (process, piece) = self.pieces.get(&(generation, seq, node.clone()))?;
            (Some(*process) == *linked).then(|| piece.clone())
        };
        let pieces = awaited
            .from
            .iter()
            .map(piece_of)
            .collect::<Option<Vec<Piece>>>()?;
        self.awaited = None;
        self.pieces.retain(|(_, s, _), _| *s > seq);
        Some((generation, seq, pieces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(all: bool) -> Piece {
        Piece::Told(all)
    }

    #[test]
    fn a_round_ends_with_every_awaited_piece_in_rank_order_and_other_generations_are_refused() {
        let w = |i| NodeId::new("worker", i);
        let p = Incarnation::from_raw;
        let mut rounds = Rounds::default();
        // A faster peer's piece of the next round comes first, and is kept for it.
        assert!(matches!(
            rounds.received(Some(3), (w(1), p(11)), 3, 0, told(false)),
            Received::Kept
        ));
        assert!(matches!(
            rounds.received(Some(3), (w(1), p(11)), 3, 1, told(true)),
            Received::Kept
        ));
        // Another generation's piece is refused (EPOCH-1).
        assert!(matches!(
            rounds.received(Some(3), (w(2), p(12)), 2, 0, told(true)),
            Received::Refuse
        ));
        assert!(matches!(
            rounds.received(None, (w(2), p(12)), 3, 0, told(true)),
            Received::Refuse
        ));
        // Round 0 awaits worker 2 still; its piece ends it, pieces in rank order.
        let from = vec![(w(0), Some(p(10))), (w(1), Some(p(11))), (w(2), Some(p(12)))];
        let me = (&w(0), p(10));
        assert!(rounds.run(me, 3, 0, Some(told(true)), from.clone()).is_none());
        match rounds.received(Some(3), (w(2), p(12)), 3, 0, told(true)) {
            Received::Done((3, 0, pieces)) => {
                assert_eq!(pieces, [told(true), told(false), told(true)])
            }
            other => panic!("{other:?}"),
        }
        // Round 1's early piece was kept; a broadcast awaits the leader's alone.
        assert_eq!(
            rounds.run(me, 3, 1, None, vec![(w(1), Some(p(11)))]),
            Some((3, 1, vec![told(true)]))
        );
        // A new generation's collectives start afresh.
        assert!(rounds.run(me, 4, 0, Some(told(true)), from).is_none());
        assert!(rounds.pieces.keys().all(|(g, _, _)| *g == 4));
    }

    /// A piece an earlier process of a member sent (before it died) is never taken for its
    /// new process's, though both are of the same generation: the round waits for the new one.
    #[test]
    fn a_piece_of_an_earlier_process_of_a_member_is_not_the_groups() {
        let w = |i| NodeId::new("worker", i);
        let p = Incarnation::from_raw;
        let mut rounds = Rounds::default();
        assert!(matches!(
            rounds.received(Some(1), (w(0), p(1)), 1, 0, told(false)),
            Received::Kept
        ));
        let from = vec![(w(0), Some(p(2))), (w(1), Some(p(5)))];
        assert!(rounds
            .run((&w(1), p(5)), 1, 0, Some(told(true)), from)
            .is_none());
        match rounds.received(Some(1), (w(0), p(2)), 1, 0, told(true)) {
            Received::Done((1, 0, pieces)) => assert_eq!(pieces, [told(true), told(true)]),
            other => panic!("{other:?}"),
        }
        // A member of no known process: none of its pieces is taken.
        assert!(rounds
            .run((&w(1), p(5)), 1, 1, Some(told(true)), vec![(w(0), None)])
            .is_none());
        assert!(matches!(
            rounds.received(Some(1), (w(0), p(2)), 1, 1, told(true)),
            Received::Kept
        ));
    }
}
