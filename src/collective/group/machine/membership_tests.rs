//! The membership machine's tests: how it answers an ask to enter, a join, a probe and a
//! question whether it still forms a generation, and how it admits and skips generations.

use super::*;

fn node(i: u32) -> NodeId {
    NodeId::new("worker", i)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A member of a formed group of `generation` with worker/0..n, linked with each peer's
/// process `incarnations[i]`.
fn member_of(generation: u64, incarnations: &[Incarnation]) -> (Membership, Vec<NodeId>) {
    let nodes: Vec<NodeId> = (0..incarnations.len() as u32).map(node).collect();
    let mut m = Membership::default();
    m.begin_forming(generation).unwrap();
    for (n, inc) in nodes.iter().zip(incarnations).skip(1) {
        m.linked_with(n, generation, *inc);
    }
    m.member = true;
    (m, nodes)
}

fn formed(generation: u64, nodes: &[NodeId]) -> GroupView<'_> {
    GroupView {
        generation,
        nodes,
        formed: true,
        broken: false,
        trained: true,
    }
}

#[test]
fn an_enter_from_the_linked_process_is_stale_and_from_another_a_restart() {
    let old = Incarnation::from_raw(1);
    let (mut m, nodes) = member_of(3, &[Incarnation::from_raw(9), old]);
    let now = Instant::now();
    let late = now + Duration::from_secs(3600);
    let answer = m.handle_enter(&node(1), addr(1), old, Some(formed(3, &nodes)), late);
    assert_eq!(answer, EnterAnswer::Stale { generation: 3 });
    assert!(m.pending.is_empty());
    let new = Incarnation::from_raw(2);
    let answer = m.handle_enter(&node(1), addr(1), new, Some(formed(3, &nodes)), late);
    assert_eq!(
        answer,
        EnterAnswer::Pending {
            generation: 3,
            restarted: true
        }
    );
    assert_eq!(m.pending[&node(1)].incarnation, new);
}

#[test]
fn a_first_generation_broken_before_any_collective_is_no_group_to_wait_for() {
    let processes = [9, 1, 7].map(Incarnation::from_raw);
    let (mut m, nodes) = member_of(1, &processes);
    let asker = Incarnation::from_raw(4);
    let now = Instant::now();
    let untrained = |broken| GroupView {
        broken,
        trained: false,
        ..formed(1, &nodes)
    };
    // Broken before its first collective: the asker is to start the job again.
    let answer = m.handle_enter(&node(2), addr(2), asker, Some(untrained(true)), now);
    assert_eq!(answer, EnterAnswer::NoGroup { generation: 1 });
    assert!(m.pending.is_empty());
    // Not broken, or broken after a collective, it lives: the asker waits to be admitted.
    for view in [
        untrained(false),
        GroupView {
            broken: true,
            ..formed(1, &nodes)
        },
    ] {
        let answer = m.handle_enter(&node(2), addr(2), asker, Some(view), now);
        assert!(matches!(answer, EnterAnswer::Pending { .. }), "{view:?}");
    }
    // A later generation broken before its first collective is still a job.
    let (mut later, nodes) = member_of(2, &processes);
    let view = GroupView {
        broken: true,
        trained: false,
        ..formed(2, &nodes)
    };
    let answer = later.handle_enter(&node(2), addr(2), asker, Some(view), now);
    assert!(matches!(answer, EnterAnswer::Pending { .. }));
}

#[test]
fn an_admitted_joiners_late_ask_is_stale_once_the_members_agreed_to_admit_it() {
    let (mut m, nodes) = member_of(2, &[Incarnation::from_raw(9), Incarnation::from_raw(1)]);
    let joiner_process = Incarnation::from_raw(5);
    let now = Instant::now();
    let answer = m.handle_enter(
        &node(2),
        addr(2),
        joiner_process,
        Some(formed(2, &nodes)),
        now,
    );
    assert_eq!(
        answer,
        EnterAnswer::Pending {
            generation: 2,
            restarted: false
        }
    );
    let joiners = m.pending_joiners(&nodes, now, Duration::from_secs(3));
    assert_eq!(joiners.len(), 1);
    m.offered(&joiners);
    m.admitting(&joiners);
    m.begin_forming(3).unwrap();
    let grown: Vec<NodeId> = (0..3).map(node).collect();
    let answer = m.handle_enter(
        &node(2),
        addr(2),
        joiner_process,
        Some(formed(3, &grown)),
        now,
    );
    assert_eq!(answer, EnterAnswer::Stale { generation: 3 });
}

#[test]
fn a_joiner_or_a_mesh_with_no_group_has_none_to_offer() {
    let mut m = Membership::default();
    let inc = Incarnation::from_raw(1);
    let now = Instant::now();
    assert_eq!(
        m.handle_enter(&node(1), addr(1), inc, None, now),
        EnterAnswer::NoGroup { generation: 0 }
    );
    let (mut m, nodes) = member_of(2, &[inc, inc]);
    m.joining = true;
    assert_eq!(
        m.handle_enter(&node(1), addr(1), inc, Some(formed(2, &nodes)), now),
        EnterAnswer::NoGroup { generation: 2 }
    );
}

#[test]
fn pending_joiners_expire_and_exclude_members() {
    let (mut m, nodes) = member_of(2, &[Incarnation::from_raw(1), Incarnation::from_raw(2)]);
    let t0 = Instant::now();
    m.handle_enter(
        &node(3),
        addr(3),
        Incarnation::from_raw(3),
        Some(formed(2, &nodes)),
        t0,
    );
    m.handle_enter(
        &node(2),
        addr(2),
        Incarnation::from_raw(4),
        Some(formed(2, &nodes)),
        t0,
    );
    let fresh = Duration::from_secs(3);
    let offered = m.pending_joiners(&nodes, t0 + Duration::from_secs(1), fresh);
    let offered: Vec<NodeId> = offered.into_iter().map(|j| j.member.node).collect();
    assert_eq!(offered, vec![node(2), node(3)]);
    assert!(m.pending_joiners(&nodes, t0 + fresh, fresh).is_empty());
}

#[test]
fn probes_are_answered_by_role() {
    let (mut m, nodes) = member_of(2, &[Incarnation::from_raw(1), Incarnation::from_raw(2)]);
    assert_eq!(
        m.handle_probe(&node(1), 2, Some(formed(2, &nodes)), true),
        ProbeAnswerHere::Alive
    );
    // A later live group without the prober: it was left out.
    let (mut m, later) = member_of(4, &[Incarnation::from_raw(1)]);
    assert_eq!(
        m.handle_probe(&node(1), 3, Some(formed(4, &later)), false),
        ProbeAnswerHere::LeftOut { current: 4 }
    );
    // Still forming the first generation, linked with the prober: survives with it.
    let mut first = Membership::default();
    first.begin_forming(1).unwrap();
    let forming = GroupView {
        formed: false,
        ..formed(1, &nodes)
    };
    assert_eq!(
        first.handle_probe(&node(1), 1, Some(forming), true),
        ProbeAnswerHere::CutShort
    );
    assert_eq!(
        first.handle_probe(&node(1), 1, Some(forming), false),
        ProbeAnswerHere::EndForming
    );
    first.joining = true;
    first.hear_from(vec![node(1)]);
    first.heard_from(&node(1), 1);
    // A joiner forming the generation the prober re-forms from (or an earlier one) ends
    // that forming: the prober counts it out, so it must not complete it.
    assert_eq!(
        first.handle_probe(&node(1), 1, Some(forming), true),
        ProbeAnswerHere::EndForming
    );
    assert_eq!(
        first.handle_probe(&node(1), 2, Some(forming), false),
        ProbeAnswerHere::EndForming
    );
    // Forming none: it answers as a joiner.
    assert_eq!(
        first.handle_probe(&node(1), 1, Some(formed(1, &nodes)), true),
        ProbeAnswerHere::Joining
    );
    assert_eq!(
        first.handle_probe(&node(1), 1, None, false),
        ProbeAnswerHere::Joining
    );
    // Told a prober of generation 1 that it is no survivor, it no longer survives a forming
    // of that generation (above, linked with the prober, it did): the prober went on without
    // it. So even when it no longer waits to be admitted and forms the first generation again.
    assert_eq!(first.counted_out, 1);
    first.joining = false;
    assert_eq!(
        first.handle_probe(&node(1), 1, Some(forming), true),
        ProbeAnswerHere::EndForming
    );
}

/// A process no survivor of any group is counted out of a prober's quorum (`Joining`)
/// only once every peer it asks to enter answered and none was a member of a group later
/// than the prober's generation (its node's old process may have been in that group); until
/// then, or otherwise, it is unsettled: counted as a member that did not answer.
#[test]
fn a_new_process_is_counted_out_only_once_it_heard_every_peer_and_none_went_further() {
    let mut joiner = Membership {
        joining: true,
        ..Membership::default()
    };
    // It has not said whom it asks: it cannot tell.
    assert_eq!(joiner.no_survivor(5), ProbeAnswerHere::Unsettled);
    assert_eq!(joiner.counted_out, 0);
    joiner.hear_from(vec![node(0), node(2)]);
    joiner.heard_from(&node(0), 3);
    assert_eq!(
        joiner.handle_probe(&node(0), 3, None, false),
        ProbeAnswerHere::Unsettled,
        "worker/2 has not answered"
    );
    joiner.heard_from(&node(2), 5);
    // worker/2 was a member of generation 5: a prober of generation 3 is behind the old process.
    assert_eq!(
        joiner.handle_probe(&node(0), 3, None, false),
        ProbeAnswerHere::Unsettled
    );
    assert_eq!(
        joiner.counted_out, 0,
        "no prober was told it is no survivor yet"
    );
    assert_eq!(
        joiner.handle_probe(&node(2), 5, None, false),
        ProbeAnswerHere::Joining
    );
    // Told so, the prober may go on without it.
    assert_eq!(joiner.counted_out, 5);
    // An earlier answer does not lower what it heard.
    joiner.heard_from(&node(2), 1);
    assert_eq!(joiner.no_survivor(4), ProbeAnswerHere::Unsettled);
    // Its own membership counts too (a process that was a member and now waits).
    let mut again = Membership::default();
    again.formed(7);
    again.joining = true;
    again.hear_from(vec![node(0)]);
    again.heard_from(&node(0), 6);
    assert_eq!(again.no_survivor(6), ProbeAnswerHere::Unsettled);
    assert_eq!(again.no_survivor(7), ProbeAnswerHere::Joining);
}

#[test]
fn an_admission_is_taken_only_by_a_joiner_and_only_forward() {
    let mut m = Membership::default();
    assert_eq!(m.handle_admit(2, Vec::new()), Err(0));
    m.joining = true;
    m.begin_forming(1).unwrap();
    assert_eq!(m.handle_admit(1, Vec::new()), Err(1));
    assert!(m.unadmitted(3));
    assert_eq!(m.handle_admit(3, Vec::new()), Ok(()));
    assert!(!m.unadmitted(3));
    assert!(m.unadmitted(4));
    assert_eq!(m.admission.as_ref().map(|(e, _)| *e), Some(3));
}

fn join_context(incarnation: u64) -> JoinContext {
    JoinContext {
        incarnation: Incarnation::from_raw(incarnation),
        by_admission: false,
        later_join: false,
        closed: false,
    }
}

#[test]
fn joins_are_waited_for_taken_or_refused_by_what_this_mesh_formed() {
    let nodes: Vec<NodeId> = (0..3).map(node).collect();
    let mut m = Membership::default();
    // Not there yet: wait (a member forms a generation once all its links are up).
    assert_eq!(
        m.handle_join(&node(2), 1, &nodes, None, join_context(7)),
        JoinAnswer::Wait
    );
    m.begin_forming(1).unwrap();
    let forming = GroupView {
        formed: false,
        ..formed(1, &nodes)
    };
    assert_eq!(
        m.handle_join(&node(2), 1, &nodes, Some(forming), join_context(7)),
        JoinAnswer::Take
    );
    // Its link up: the same process's join again, and another process's.
    m.linked_with(&node(2), 1, Incarnation::from_raw(7));
    let refusal = |m: &Membership, inc| match m.handle_join(
        &node(2),
        1,
        &nodes,
        Some(forming),
        join_context(inc),
    ) {
        JoinAnswer::Refused { why, .. } => why,
        other => panic!("{other:?}"),
    };
    assert_eq!(refusal(&m, 7), JoinRefusal::LinkedAlready);
    assert_eq!(refusal(&m, 8), JoinRefusal::LinkedWithAnotherProcess);
    // Another list from one of our members: both formings fail now.
    let two = &nodes[..2];
    assert_eq!(
        m.handle_join(&node(1), 1, two, Some(forming), join_context(5)),
        JoinAnswer::ViewsDiffer {
            theirs: two.to_vec(),
            ours: nodes.clone()
        }
    );
    // Formed: any later join is a new process's.
    assert_eq!(
        m.handle_join(
            &node(1),
            1,
            &nodes,
            Some(formed(1, &nodes)),
            join_context(5)
        ),
        JoinAnswer::Refused {
            current: 1,
            why: JoinRefusal::FormedAlready
        }
    );
    // A joiner not admitted to a later generation refuses it at once.
    let mut joiner = Membership {
        joining: true,
        ..Membership::default()
    };
    assert_eq!(
        joiner.handle_join(&node(0), 4, &nodes, None, join_context(1)),
        JoinAnswer::Refused {
            current: 0,
            why: JoinRefusal::Unadmitted
        }
    );
    joiner.handle_admit(4, Vec::new()).unwrap();
    assert_eq!(
        joiner.handle_join(&node(0), 4, &nodes, None, join_context(1)),
        JoinAnswer::Wait
    );
}

#[test]
fn a_lost_connection_of_an_old_process_is_not_the_link_with_its_successor() {
    let (old, new) = (Incarnation::from_raw(3), Incarnation::from_raw(4));
    let (mut m, nodes) = member_of(2, &[Incarnation::from_raw(9), old]);
    // The link is with the old process: its connection is the link.
    assert!(!m.linked_with_another_process(&nodes[1], old));
    // The node came back and linked again in the next generation: the old connection's
    // death says nothing of the new link.
    m.begin_forming(3).unwrap();
    m.linked_with(&nodes[1], 3, new);
    assert!(m.linked_with_another_process(&nodes[1], old));
    assert!(!m.linked_with_another_process(&nodes[1], new));
    // A node this mesh never linked with: whatever connection died is taken as its link.
    assert!(!m.linked_with_another_process(&node(7), old));
}
