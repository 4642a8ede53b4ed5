//! A parameter server's preemption notice driven through the scheduler: the cut taken while
//! dispatch is held, the restore after the server went rolling nothing back, notices that
//! join a cut under way, and every way the cut is given up (no checkpoint directory, a loss
//! first, a failed write, too long) with the servers then leaving as if lost.

use std::sync::Arc;

use super::control_tests::{bring_up, drain, setup};
use super::recovery::CallFault;
use super::recovery_tests::{dispatched, drive_restore, Step};
use super::save::ShardRead;
use super::*;
use crate::layout::{Dtype, Layout, Shard};
use crate::roles::protocol::{f32_blob, LeaveAnswer, ShardState};

pub(super) fn ckpt_dir() -> PathBuf {
    PathBuf::from("ckpt")
}

/// A scheduler over 2 servers (incarnation 1, up) and 2 workers (incarnation 1, up), variable `w` split
/// over both servers, the chief started afresh, the program's first save marked at closure
/// 0, and `n` closures scheduled: the first two are in flight.
pub(super) fn training(n: u8) -> (Scheduler, Vec<ClosureId>) {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default())
        .with_workers(2)
        .with_servers(2);
    let mut setup = setup(&[("ids", 0)]);
    setup.layouts = vec![Layout {
        name: "w".into(),
        dtype: Dtype::F32,
        shape: vec![4, 2],
        shards: vec![Shard { ps: 0, rows: 0..2 }, Shard { ps: 1, rows: 2..4 }],
    }];
    s.handle_configure(setup);
    for ps in 0..2 {
        s.handle_ps_up(t, ps, 1);
    }
    bring_up(&mut s, 0, 1);
    bring_up(&mut s, 1, 1);
    let ticket = s.handle_start(t, None, ckpt_dir()).unwrap();
    for ps in 0..2 {
        let probe = ServerProbe {
            ps,
            incarnation: 1,
            generation: 0,
            next_free_closure_id: 0,
            serving: false,
            restoring: false,
        };
        s.handle_server_probed(t, ticket, ps, Ok(probe));
    }
    let started = std::iter::from_fn(|| s.poll_action()).any(|a| {
        matches!(
            a,
            SchedulerAction::RestoreFinished {
                result: Ok(None),
                ..
            }
        )
    });
    assert!(started, "the chief starts afresh");
    s.mark_cut(ClosureId(0), ckpt_dir()).unwrap();
    let ids = (0..n)
        .map(|i| s.handle_schedule(t, "step", vec![i]).unwrap())
        .collect();
    (s, ids)
}

fn shard_answer() -> ShardRead {
    ShardRead {
        state: ShardState {
            shape: vec![2, 2],
            slots: vec![],
            steps: 3,
        },
        blobs: vec![f32_blob(&[1.0, 2.0, 3.0, 4.0])],
    }
}

/// Answers every shard read and positions request in `actions`; returns the rest.
pub(super) fn answer_reads(
    s: &mut Scheduler,
    actions: Vec<SchedulerAction>,
) -> Vec<SchedulerAction> {
    let t = Instant::now();
    let mut rest = Vec::new();
    for action in actions {
        match action {
            SchedulerAction::SnapshotShard {
                ticket,
                attempt,
                ps,
                shard,
            } => s.handle_shard_read(t, ticket, attempt, ps, &shard, Ok(shard_answer())),
            SchedulerAction::AskPositions {
                ticket,
                worker,
                incarnation,
            } => s.handle_positions(t, ticket, worker, incarnation, Ok(vec![("ids".into(), 5)])),
            other => rest.push(other),
        }
    }
    rest.extend(drain(s));
    rest
}

pub(super) type Written = (CutTicket, ClosureId, PathBuf, Vec<u32>, Box<CutReading>);

pub(super) fn written(actions: &[SchedulerAction]) -> Option<Written> {
    actions.iter().find_map(|a| match a {
        SchedulerAction::WritePreemptionCut {
            ticket,
            cut,
            root,
            leaving,
            reading,
        } => Some((
            *ticket,
            *cut,
            root.clone(),
            leaving.clone(),
            reading.clone(),
        )),
        _ => None,
    })
}

fn answers(actions: &[SchedulerAction]) -> Vec<(u32, u64, LeaveAnswer)> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::AnswerPsLeaving {
                ps,
                incarnation,
                answer,
            } => Some((*ps, *incarnation, *answer)),
            _ => None,
        })
        .collect()
}

/// Commits every closure dispatched in `actions`.
pub(super) fn commit_all(s: &mut Scheduler, actions: &[SchedulerAction]) {
    let t = Instant::now();
    for (worker, closure, attempt) in dispatched(actions) {
        s.handle_result(t, worker, 1, closure, attempt, Ok(vec![]));
    }
}

/// The whole path: a notice holds dispatch while the closures in flight finish, the cut is
/// read at the first closure not finished (new work scheduled meanwhile neither runs nor
/// disturbs it) and written beside the program's checkpoints; once durable it is the cut, the
/// server leaves and counts as lost, and when its new incarnation is up the restore loads that
/// cut and runs nothing again (`rolled_back` 0) before dispatch resumes where it stopped.
#[test]
fn a_ps_notice_takes_a_cut_and_its_restore_runs_nothing_again() {
    let t = Instant::now();
    let (mut s, ids) = training(6);
    let first = drain(&mut s);
    assert_eq!(dispatched(&first).len(), 2, "one closure per worker");
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None, "answered later");
    // The closures in flight finish; nothing new starts.
    commit_all(&mut s, &first);
    let _late = s.handle_schedule(t, "step", vec![9]).unwrap();
    let reading = drain(&mut s);
    assert!(dispatched(&reading).is_empty(), "dispatch is held");
    let rest = answer_reads(&mut s, reading);
    let (ticket, cut, root, leaving, cut_reading) = written(&rest).expect("the cut is written");
    assert_eq!(cut, ids[2], "the first closure not finished");
    assert_eq!(root, ckpt_dir().join(PREEMPTION_CUTS_DIR));
    assert_eq!(leaving, vec![1]);
    assert_eq!(cut_reading.ledger.next_closure_id, cut.0);
    assert!(answers(&rest).is_empty(), "not before it is durable");
    s.handle_preemption_cut_written(t, ticket, Ok(()));
    let gone = drain(&mut s);
    assert_eq!(answers(&gone), vec![(1, 1, LeaveAnswer::Go)]);
    assert!(dispatched(&gone).is_empty(), "held for the lost server");
    assert_eq!(s.ps_down(), vec![1]);
    assert_eq!(s.control_counters().preemption_cuts, 1);
    // Its new incarnation is up: every server is restored from the preemption cut.
    s.handle_ps_up(t, 1, 2);
    let ckpt = Arc::new(cut_reading.into_checkpoint().unwrap());
    let (others, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    assert!(seen.iter().any(|(step, _, _)| *step == Step::Load));
    assert_eq!(s.ledger().rolled_back, 0);
    assert_eq!(s.ledger().ps_restores, 1);
    assert_eq!(
        dispatched(&others)
            .iter()
            .map(|(_, c, _)| *c)
            .collect::<Vec<_>>(),
        vec![ids[2], ids[3]],
        "dispatch resumes at the cut"
    );
}

/// The recovery's loader is asked for the preemption cut under its own directory.
#[test]
fn the_restore_after_a_preemption_loads_the_preemption_cut() {
    let t = Instant::now();
    let (mut s, _) = training(0);
    drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 0, 1, false), None);
    let actions = drain(&mut s);
    let rest = answer_reads(&mut s, actions);
    let (ticket, cut, ..) = written(&rest).unwrap();
    assert_eq!(
        cut,
        ClosureId(0),
        "nothing was scheduled: the next closure id"
    );
    s.handle_preemption_cut_written(t, ticket, Ok(()));
    drain(&mut s);
    s.handle_ps_up(t, 0, 2);
    let loads: Vec<_> = drain(&mut s)
        .into_iter()
        .filter_map(|a| match a {
            SchedulerAction::Restore(recovery::RestoreCall::Load { root, cut, .. }) => {
                Some((root, cut))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        loads,
        vec![(ckpt_dir().join(PREEMPTION_CUTS_DIR), ClosureId(0))]
    );
}

/// A second notice while the cut is read joins it: one cut, both servers leave with it.
#[test]
fn notices_during_a_cut_join_it() {
    let t = Instant::now();
    let (mut s, _) = training(3);
    let first = drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 0, 1, false), None);
    commit_all(&mut s, &first);
    let reading = drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    let rest = answer_reads(&mut s, reading);
    let (ticket, _, _, leaving, _) = written(&rest).unwrap();
    assert_eq!(leaving, vec![0, 1]);
    s.handle_preemption_cut_written(t, ticket, Ok(()));
    let gone = drain(&mut s);
    assert_eq!(
        answers(&gone),
        vec![(0, 1, LeaveAnswer::Go), (1, 1, LeaveAnswer::Go)]
    );
    assert_eq!(s.ps_down(), vec![0, 1]);
}

/// A chief that is stopping keeps its servers (Stay); an incarnation not serving, or a notice
/// with no checkpoint directory known, leaves at once (Go), counted lost.
#[test]
fn a_notice_is_answered_at_once_when_no_cut_can_or_need_be_taken() {
    let t = Instant::now();
    let (mut s, _) = training(2);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, true), Some(LeaveAnswer::Stay));
    assert_eq!(
        s.handle_ps_leaving(t, 1, 7, false),
        Some(LeaveAnswer::Go),
        "not the incarnation serving"
    );
    assert!(s.ps_down().is_empty());

    let mut bare = Scheduler::new(SchedulerConfig::default()).with_servers(1);
    bare.handle_ps_up(t, 0, 1);
    assert_eq!(
        bare.handle_ps_leaving(t, 0, 1, false),
        Some(LeaveAnswer::Go)
    );
    assert_eq!(bare.ps_down(), vec![0]);
    assert_eq!(bare.control_counters().servers_left, 1);

    // A configured checkpoint directory serves before the program's first save.
    let mut configured = Scheduler::new(SchedulerConfig::default())
        .with_servers(1)
        .with_checkpoint_dir(Some(PathBuf::from("dir")));
    configured.handle_ps_up(t, 0, 1);
    // Work scheduled: what the server holds is this chief's to cut.
    configured.handle_schedule(t, "step", vec![]).unwrap();
    assert_eq!(configured.handle_ps_leaving(t, 0, 1, false), None);
    let asked = drain(&mut configured);
    let rest = answer_reads(&mut configured, asked);
    let (_, _, root, ..) = written(&rest).unwrap();
    assert_eq!(root, PathBuf::from("dir").join(PREEMPTION_CUTS_DIR));
}

/// A server lost before the cut was read: its recovery holds dispatch and restores every
/// server from the last cut, so the preemption is given up and the server that gave notice
/// leaves at once.
#[test]
fn a_loss_before_the_cut_was_read_gives_the_cut_up() {
    let t = Instant::now();
    let (mut s, _) = training(3);
    let first = drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    s.handle_ps_lost(t, 0, 1);
    let actions = drain(&mut s);
    assert_eq!(answers(&actions), vec![(1, 1, LeaveAnswer::Go)]);
    assert!(written(&actions).is_none());
    assert_eq!(s.control_counters().preemption_cuts_given_up, 1);
    // The closures in flight finish; no read follows.
    commit_all(&mut s, &first);
    let after = drain(&mut s);
    assert!(written(&answer_reads(&mut s, after)).is_none());
    assert_eq!(s.ps_down(), vec![0, 1]);
}

/// The shell's answer for a preemption cut that found no room on disk.
pub(super) fn disk_full() -> CutWriteError {
    let root = std::path::PathBuf::from("ckpt").join(PREEMPTION_CUTS_DIR);
    CutWriteError::Save {
        root: root.clone(),
        source: crate::checkpoint::SaveError::Io {
            op: "write",
            path: root,
            source: std::io::Error::other("no space left on device"),
        },
    }
}

/// A cut that could not be written is given up: the server leaves and its loss rolls back to
/// the program's last checkpoint (the closures committed since run again).
#[test]
fn a_failed_write_gives_the_cut_up_and_the_loss_rolls_back_to_the_last_checkpoint() {
    let t = Instant::now();
    let (mut s, _) = training(2);
    let first = drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    commit_all(&mut s, &first);
    let asked = drain(&mut s);
    let rest = answer_reads(&mut s, asked);
    let (ticket, ..) = written(&rest).unwrap();
    s.handle_preemption_cut_written(t, ticket, Err(disk_full()));
    assert_eq!(answers(&drain(&mut s)), vec![(1, 1, LeaveAnswer::Go)]);
    assert_eq!(s.control_counters().preemption_cuts_given_up, 1);
    s.handle_ps_up(t, 1, 2);
    let ckpt = super::recovery_tests::checkpoint(1, 0, 0);
    drive_restore(&mut s, &ckpt, |_, _| None);
    assert_eq!(
        s.ledger().rolled_back,
        2,
        "both committed closures run again"
    );
}

/// A cut that cannot be read (a server refuses) or takes too long is given up.
#[test]
fn a_refused_read_or_a_cut_past_its_bound_is_given_up() {
    let t = Instant::now();
    let (mut s, _) = training(0);
    drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    for action in drain(&mut s) {
        if let SchedulerAction::SnapshotShard {
            ticket,
            attempt,
            ps,
            shard,
        } = action
        {
            let refusal = Err(CallFault::Refused("no such shard".into()));
            s.handle_shard_read(t, ticket, attempt, ps, &shard, refusal);
        }
    }
    assert_eq!(answers(&drain(&mut s)), vec![(1, 1, LeaveAnswer::Go)]);

    let (mut slow, _) = training(0);
    drain(&mut slow);
    assert_eq!(slow.handle_ps_leaving(t, 0, 1, false), None);
    drain(&mut slow); // the reads go out and are never answered
    assert_eq!(slow.poll_timeout(), Some(t + PREEMPTION_CUT_MAX));
    slow.handle_timeout(t + PREEMPTION_CUT_MAX);
    assert_eq!(answers(&drain(&mut slow)), vec![(0, 1, LeaveAnswer::Go)]);
    assert_eq!(slow.ps_down(), vec![0]);
}

/// A program save asked for while a preemption cut is read is not refused: it waits for it
/// and is read afterwards.
#[test]
fn a_save_asked_for_during_a_preemption_cut_is_read_after_it() {
    let t = Instant::now();
    let (mut s, _) = training(0);
    drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    let preemption_reads = drain(&mut s);
    let save = s.handle_read_cut(t, 10).expect("queued, not refused");
    let rest = answer_reads(&mut s, preemption_reads);
    let (ticket, ..) = written(&rest).unwrap();
    // The save's read began once the preemption's ended.
    let rest = answer_reads(&mut s, rest);
    let read = rest.iter().find_map(|a| match a {
        SchedulerAction::CutRead { ticket, result } => Some((*ticket, result.clone())),
        _ => None,
    });
    let (read_ticket, result) = read.expect("the save was read");
    assert_eq!(read_ticket, save);
    assert_eq!(result.unwrap().step, 10);
    s.handle_preemption_cut_written(t, ticket, Ok(()));
    assert_eq!(answers(&drain(&mut s)), vec![(1, 1, LeaveAnswer::Go)]);
}

/// The chief's own stop request while a server's cut is taken: the cut is given up, the
/// server stays (the program's own checkpoint needs it) and is not counted lost; later
/// notices stay too.
#[test]
fn a_chief_that_stops_during_a_cut_keeps_its_servers() {
    let t = Instant::now();
    let (mut s, _) = training(3);
    let first = drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None);
    s.handle_chief_stopping(t);
    let actions = drain(&mut s);
    assert_eq!(answers(&actions), vec![(1, 1, LeaveAnswer::Stay)]);
    assert!(s.ps_down().is_empty());
    commit_all(&mut s, &first);
    let next = drain(&mut s);
    assert!(written(&next).is_none(), "no cut is read any more");
    assert_eq!(dispatched(&next).len(), 1, "dispatch is no longer held");
    assert_eq!(s.handle_ps_leaving(t, 0, 1, false), Some(LeaveAnswer::Stay));
}

/// A notice while the chief's start still probes the servers: what they hold may be a dead
/// chief's work (its restore at start-up rolls it back), not a cut of this chief's: no cut is
/// taken, the server leaves at once and counts as lost.
#[test]
fn a_notice_during_the_chiefs_start_takes_no_cut() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default())
        .with_servers(2)
        .with_checkpoint_dir(Some(ckpt_dir()));
    for ps in 0..2 {
        s.handle_ps_up(t, ps, 1);
    }
    s.handle_start(t, None, ckpt_dir()).unwrap();
    drain(&mut s);
    assert_eq!(s.handle_ps_leaving(t, 1, 1, false), Some(LeaveAnswer::Go));
    let actions = drain(&mut s);
    assert!(written(&actions).is_none());
    assert!(!actions
        .iter()
        .any(|a| matches!(a, SchedulerAction::SnapshotShard { .. })));
    assert_eq!(s.ps_down(), vec![1]);
}

/// A notice that comes before the chief's start (a restarted chief's servers may hold a dead
/// chief's work) waits for it: no cut is read meanwhile. A start that begins lets it leave at
/// once (as a notice during the start does); work scheduled without a start (the program
/// chose not to restore) makes the servers' state this chief's, and the cut is read then.
#[test]
fn a_notice_before_the_chiefs_start_waits_for_it() {
    let t = Instant::now();
    let reads = |actions: &[SchedulerAction]| {
        actions
            .iter()
            .filter(|a| matches!(a, SchedulerAction::SnapshotShard { .. }))
            .count()
    };
    for start in [true, false] {
        let mut s = Scheduler::new(SchedulerConfig::default())
            .with_workers(2)
            .with_servers(2)
            .with_checkpoint_dir(Some(ckpt_dir()));
        s.handle_configure(training(0).0.setup_for(0));
        for ps in 0..2 {
            s.handle_ps_up(t, ps, 1);
        }
        assert_eq!(s.handle_ps_leaving(t, 1, 1, false), None, "it waits");
        assert_eq!(reads(&drain(&mut s)), 0, "no cut before the start");
        if start {
            s.handle_start(t, None, ckpt_dir()).unwrap();
            let during = drain(&mut s);
            assert_eq!(reads(&during), 0);
            assert_eq!(answers(&during), vec![(1, 1, LeaveAnswer::Go)]);
        } else {
            s.handle_schedule(t, "step", vec![]).unwrap();
            assert!(
                reads(&drain(&mut s)) > 0,
                "the cut is read once work is scheduled"
            );
        }
    }
}
