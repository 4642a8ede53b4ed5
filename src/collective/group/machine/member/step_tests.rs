//! The member machine at a step, driven by hand: when its vote at the next boundary is cast,
//! and what it does with a group that breaks while its step computes. (The membership
//! simulator drives it under faults; these pin the two moments production's training loop
//! fixes.)

use std::time::{Duration, Instant};

use super::*;

/// The only worker of a job of `steps` steps, started.
fn alone(steps: u64, now: Instant) -> MemberMachine {
    let me = GroupMember {
        node: NodeId::new("worker", 0),
        addr: "127.0.0.1:7000".parse().expect("an address"),
    };
    let mut machine = MemberMachine::new(
        me.clone(),
        Incarnation::from_raw(1),
        vec![me],
        MemberSettings::shortened(steps),
    );
    machine.handle_start(now);
    machine
}

/// Carries out what `machine` asks (a round of a group of one ends with its own piece) until
/// it asks for a step's computation, which it returns, or has nothing left to do; what else
/// it reported goes to `reports`.
fn until_compute(
    machine: &mut MemberMachine,
    now: Instant,
    reports: &mut Vec<MemberAction>,
) -> Option<(u64, u64, u64)> {
    let mut pieces = Vec::new();
    loop {
        match machine.poll_action() {
            Some(MemberAction::Compute {
                generation,
                seq,
                step,
            }) => return Some((generation, seq, step)),
            Some(MemberAction::RunRound {
                generation,
                seq,
                piece,
                ..
            }) => {
                pieces.push(piece.clone());
                machine.handle_round_done(now, generation, seq, piece.into_iter().collect());
            }
            Some(MemberAction::Send { .. }) => {}
            Some(report) => reports.push(report),
            None => return None,
        }
    }
}

/// A notice that comes while a step computes is voted at the boundary after the next step,
/// not this one: the step's vote was cast as it began (as production's
/// `MultiWorkerMirrored::cast_vote`, before the user's step runs).
#[test]
fn a_notice_that_comes_during_a_step_is_voted_at_the_next_boundary() {
    let now = Instant::now();
    let mut machine = alone(10, now);
    let mut reports = Vec::new();
    let (generation, seq, step) = until_compute(&mut machine, now, &mut reports).expect("a step");
    assert_eq!(step, 1);
    machine.handle_notice(now, Leave::Preempted);
    machine.handle_computed(now, generation, seq);
    // Step 1's boundary keeps the group: the next step is asked for.
    let (generation, seq, step) = until_compute(&mut machine, now, &mut reports).expect("step 2");
    assert_eq!(step, 2);
    assert!(
        !reports.iter().any(|r| matches!(r, MemberAction::Exit(_))),
        "{reports:?}"
    );
    machine.handle_computed(now, generation, seq);
    assert_eq!(until_compute(&mut machine, now, &mut reports), None);
    let applied: Vec<u64> = reports
        .iter()
        .filter_map(|r| match r {
            MemberAction::Applied { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(applied, [1, 2]);
    assert_eq!(
        reports.last(),
        Some(&MemberAction::Exit(MemberExit::Left(Leave::Preempted)))
    );
}

/// A group that breaks while a step computes is re-formed only once the computation is done
/// (production's training thread is inside the step, and its all-reduce then fails at once):
/// nothing is asked meanwhile.
#[test]
fn a_group_broken_during_a_step_is_re_formed_once_the_step_is_computed() {
    let now = Instant::now();
    let mut machine = alone(10, now);
    let mut reports = Vec::new();
    let (generation, seq, _) = until_compute(&mut machine, now, &mut reports).expect("a step");
    let abort = MemberMessage::Abort { generation };
    machine.handle_message(now, &NodeId::new("worker", 0), abort);
    let later = now + Duration::from_secs(30);
    machine.handle_timeout(later);
    assert_eq!(
        machine.poll_action(),
        None,
        "nothing while the step computes"
    );
    assert_eq!(machine.live_group(), None, "the group broke");
    assert_eq!(machine.generation(), generation);
    machine.handle_computed(later, generation, seq);
    // The step's all-reduce fails at once: the worker re-forms (alone, at the next
    // generation) and computes step 1 again there.
    let (again, _, step) = until_compute(&mut machine, later, &mut reports).expect("a step");
    assert!(again > generation, "re-formed at a later generation");
    assert_eq!(step, 1);
    assert!(
        !reports
            .iter()
            .any(|r| matches!(r, MemberAction::Applied { .. })),
        "{reports:?}"
    );
}
