//! The quorum rule of re-forming (`has_quorum`): the one place that decides which survivors
//! of a broken group may go on. Re-forming's verdict on the probes ([`super::reforming`])
//! asks it, for the strategy's recovery and the member machine alike.

use cohort_transport::NodeId;

/// The quorum rule of re-forming: whether the members of the previous generation that `reached`
/// holds (those that answered a survivor's probe, the survivor among them) may form the next
/// generation. They may if they are more than half of `previous`, or exactly half of it and hold
/// its lowest-ranked member (`previous[0]`, `previous` being in rank order: the chief, or
/// worker 0). So of two disjoint sets at most one passes (two majorities intersect; of two
/// halves only one holds the lowest), and of a group split in two, exactly one side goes on:
/// a 2-worker group survives the loss of worker 1 (worker 0 goes on alone) but not that of
/// worker 0 (worker 1 stops). Nodes of `reached` outside `previous` do not count, nor does a
/// node twice.
///
/// Members of `previous` in `replaced` are not counted at all (nor is the lowest-ranked one
/// taken among them): a probe of their address was answered by a new process waiting to be
/// admitted, so their old process is gone and is on no side. Such knowledge only removes
/// members that can be on no side, so two disjoint sets still never both pass, whatever each
/// knows of who was replaced (the unit tests check every case up to 6 members); and survivors
/// whose lost peers all came back as new processes go on, however few, to admit them at the
/// next step boundary, instead of stopping for a quorum that can no longer be reached.
pub(crate) fn has_quorum(previous: &[NodeId], replaced: &[NodeId], reached: &[NodeId]) -> bool {
    let counted: Vec<&NodeId> = previous.iter().filter(|n| !replaced.contains(n)).collect();
    let Some(lowest) = counted.first() else {
        return false;
    };
    let held = counted.iter().filter(|n| reached.contains(n)).count();
    2 * held > counted.len() || (2 * held == counted.len() && reached.contains(lowest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u32) -> Vec<NodeId> {
        (0..n).map(|i| NodeId::new("worker", i)).collect()
    }

    /// The members of `all` whose bit is set in `mask`.
    fn subset(all: &[NodeId], mask: u32) -> Vec<NodeId> {
        all.iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, n)| n.clone())
            .collect()
    }

    #[test]
    fn a_strict_majority_has_quorum_and_a_minority_has_not() {
        let five = workers(5);
        assert!(has_quorum(&five, &[], &five[2..]));
        assert!(has_quorum(&five, &[], &five));
        assert!(!has_quorum(&five, &[], &five[3..]));
        assert!(
            !has_quorum(&five, &[], &five[..2]),
            "the lowest does not make 2 of 5 enough"
        );
        let three = workers(3);
        assert!(
            has_quorum(&three, &[], &three[1..]),
            "2 of 3 without worker 0"
        );
        assert!(
            !has_quorum(&three, &[], &three[2..]),
            "a worker cut off from the other two"
        );
    }

    #[test]
    fn exactly_half_has_quorum_only_with_the_lowest_ranked_member() {
        let two = workers(2);
        assert!(
            has_quorum(&two, &[], &two[..1]),
            "worker 0 goes on without worker 1"
        );
        assert!(
            !has_quorum(&two, &[], &two[1..]),
            "worker 1 stops without worker 0"
        );
        let four = workers(4);
        let with_lowest = [four[0].clone(), four[3].clone()];
        let without = [four[1].clone(), four[2].clone()];
        assert!(has_quorum(&four, &[], &with_lowest));
        assert!(!has_quorum(&four, &[], &without));
        // The chief ranks first: it is the lowest.
        let chief = vec![NodeId::new("chief", 0), NodeId::new("worker", 0)];
        assert!(has_quorum(&chief, &[], &chief[..1]));
        assert!(!has_quorum(&chief, &[], &chief[1..]));
    }

    #[test]
    fn strangers_and_repeats_do_not_count() {
        let three = workers(3);
        let padded = [
            three[2].clone(),
            three[2].clone(),
            NodeId::new("worker", 7),
            NodeId::new("worker", 8),
        ];
        assert!(!has_quorum(&three, &[], &padded));
        assert!(
            !has_quorum(&[], &[], &three),
            "an empty previous generation has no quorum"
        );
    }

    #[test]
    fn two_disjoint_sets_never_both_have_quorum_and_a_split_leaves_exactly_one_side() {
        for n in 1..=7u32 {
            let all = workers(n);
            for a in 0..(1u32 << n) {
                let side = subset(&all, a);
                let other = subset(&all, !a & ((1 << n) - 1));
                // A clean split: exactly one side goes on.
                assert_ne!(
                    has_quorum(&all, &[], &side),
                    has_quorum(&all, &[], &other),
                    "{n} members split into {side:?} and {other:?}"
                );
                // Any set disjoint from this one (a subset of the rest): never both.
                for b in 0..(1u32 << n) {
                    if a & b == 0 && has_quorum(&all, &[], &side) {
                        let disjoint = subset(&all, b);
                        assert!(
                            !has_quorum(&all, &[], &disjoint),
                            "{n} members: {side:?} and {disjoint:?} both passed"
                        );
                    }
                }
            }
        }
    }

    /// Every way `n` members can end up: each one dead (its address answering as a new
    /// process), or alive on side 1, side 2 or neither; each side knowing any subset of the
    /// dead as replaced. Two disjoint sides of live members never both pass, and a clean
    /// split of the live members with both sides knowing every dead one leaves exactly one.
    #[test]
    fn members_replaced_by_new_processes_do_not_count_and_two_sides_still_never_both_pass() {
        for n in 1..=6u32 {
            let all = workers(n);
            // Per member: 0..4 dead (which sides know it), 4 side 1, 5 side 2, 6 neither.
            let cases = 7u64.pow(n);
            for case in 0..cases {
                let (mut one, mut two, mut knows_one, mut knows_two, mut dead) =
                    (vec![], vec![], vec![], vec![], vec![]);
                let mut c = case;
                for node in &all {
                    match c % 7 {
                        k @ 0..=3 => {
                            dead.push(node.clone());
                            if k & 1 != 0 {
                                knows_one.push(node.clone());
                            }
                            if k & 2 != 0 {
                                knows_two.push(node.clone());
                            }
                        }
                        4 => one.push(node.clone()),
                        5 => two.push(node.clone()),
                        _ => {}
                    }
                    c /= 7;
                }
                assert!(
                    !(has_quorum(&all, &knows_one, &one) && has_quorum(&all, &knows_two, &two)),
                    "{n} members, dead {dead:?}: {one:?} (knowing {knows_one:?}) and {two:?} \
                     (knowing {knows_two:?}) both passed"
                );
                let split = one.len() + two.len() + dead.len() == all.len();
                if split
                    && knows_one == dead
                    && knows_two == dead
                    && !(one.is_empty() && two.is_empty())
                {
                    assert_ne!(
                        has_quorum(&all, &dead, &one),
                        has_quorum(&all, &dead, &two),
                        "{n} members, dead {dead:?}, split into {one:?} and {two:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn survivors_whose_lost_peers_all_came_back_as_new_processes_go_on() {
        let chief_and_three = [
            NodeId::new("chief", 0),
            NodeId::new("worker", 0),
            NodeId::new("worker", 1),
            NodeId::new("worker", 2),
        ];
        let [chief, w0, w1, w2] = chief_and_three.clone();
        let (only_chief, only_w1) = ([chief.clone()], [w1.clone()]);
        // Two of four without the chief: no quorum while the other two may be alive.
        let survivors = [w0.clone(), w2];
        assert!(!has_quorum(&chief_and_three, &[], &survivors));
        // Worker 1 answered as a new process: two of the three others are a majority, and
        // the chief alone is not.
        assert!(has_quorum(&chief_and_three, &only_w1, &survivors));
        assert!(!has_quorum(&chief_and_three, &only_w1, &only_chief));
        // Both answered so: nobody else can go on.
        let replaced = [chief.clone(), w1];
        assert!(has_quorum(&chief_and_three, &replaced, &survivors));
        // A worker alone whose every peer came back so goes on too.
        let three = workers(3);
        assert!(has_quorum(&three, &three[..2], &three[2..]));
        // A replaced member answering as alive (it cannot) does not count either.
        assert!(!has_quorum(&[chief, w0], &only_chief, &only_chief));
    }
}
