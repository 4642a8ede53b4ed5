//! The restore sub-machine driven through the scheduler over the orderings the shell used to
//! decide: a server that fails at each step of a restore, a worker that comes up while one
//! runs, a watermark racing it, two servers lost one after the other, the restore at start-up
//! with live servers ahead of the checkpoint.

use std::sync::Arc;

use super::recovery::{CallFault, RestoreCall, RestoreReport, DATASET_POSITIONS_KEY};
use super::*;

fn root() -> PathBuf {
    PathBuf::from("checkpoints")
}

fn drain(s: &mut Scheduler) -> Vec<SchedulerAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

/// A checkpoint at `step`, cut at closure `cut`, with worker 0's dataset `ids` at `position`.
pub(super) fn checkpoint(step: u64, cut: u64, position: u64) -> Arc<Checkpoint> {
    let mut ckpt = Checkpoint::new(step, 2);
    ckpt.ledger.next_closure_id = cut;
    ckpt.ledger.counts.scheduled = cut;
    ckpt.ledger.counts.committed = cut;
    ckpt.extra = serde_json::json!({ DATASET_POSITIONS_KEY: { "0": { "ids": position } } });
    Arc::new(ckpt)
}

/// Where a restore call goes, to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Begin,
    Load,
    Shards,
    RollBack,
    Rewind,
}

pub(super) fn step_of(call: &RestoreCall) -> (Step, u32, u64) {
    match call {
        RestoreCall::Begin { ps, generation, .. } => (Step::Begin, *ps, *generation),
        RestoreCall::Load { generation, .. } => (Step::Load, 0, *generation),
        RestoreCall::Shards { ps, generation, .. } => (Step::Shards, *ps, *generation),
        RestoreCall::RollBack { ps, generation, .. } => (Step::RollBack, *ps, *generation),
        RestoreCall::Rewind {
            worker, generation, ..
        } => (Step::Rewind, *worker, *generation),
    }
}

/// The successful answer to `call` (`fault` replaces the result of a server call).
pub(super) fn answer(
    call: &RestoreCall,
    ckpt: &Arc<Checkpoint>,
    fault: Option<CallFault>,
) -> RestoreReport {
    let result = fault.map_or(Ok(()), Err);
    match call {
        RestoreCall::Begin { ps, .. } => RestoreReport::Begun { ps: *ps, result },
        RestoreCall::Load { .. } => RestoreReport::Loaded {
            result: Ok(Some(CheckpointRef(Arc::clone(ckpt)))),
        },
        RestoreCall::Shards { ps, .. } => RestoreReport::ShardsRestored { ps: *ps, result },
        RestoreCall::RollBack { ps, .. } => RestoreReport::RolledBack { ps: *ps, result },
        RestoreCall::Rewind {
            worker,
            incarnation,
            ..
        } => RestoreReport::Rewound {
            worker: *worker,
            incarnation: *incarnation,
            result,
        },
    }
}

/// Answers every restore call as it comes out, `fail(step, target)` deciding a fault, until
/// no call is left; returns every other action, and the calls seen in order.
pub(super) fn drive_restore(
    s: &mut Scheduler,
    ckpt: &Arc<Checkpoint>,
    mut fail: impl FnMut(Step, u32) -> Option<CallFault>,
) -> (Vec<SchedulerAction>, Vec<(Step, u32, u64)>) {
    let t = Instant::now();
    let mut others = Vec::new();
    let mut seen = Vec::new();
    loop {
        let actions = drain(s);
        if actions.is_empty() {
            return (others, seen);
        }
        for action in actions {
            match action {
                SchedulerAction::Restore(call) => {
                    let (step, target, generation) = step_of(&call);
                    seen.push((step, target, generation));
                    let report = answer(&call, ckpt, fail(step, target));
                    s.handle_restore_report(t, generation, report);
                }
                other => others.push(other),
            }
        }
    }
}

pub(super) fn dispatched(actions: &[SchedulerAction]) -> Vec<(u32, ClosureId, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch {
                worker,
                closure,
                attempt,
                ..
            } => Some((*worker, *closure, *attempt)),
            _ => None,
        })
        .collect()
}

/// Two workers and two servers up (incarnation 1 each), set up with dataset `ids` and no
/// variable, under `config`.
fn two_by_two(config: SchedulerConfig) -> Scheduler {
    let t = Instant::now();
    let mut s = Scheduler::new(config);
    for w in 0..2 {
        s.handle_worker_up(t, w, 1);
        s.handle_ps_up(t, w, 1);
    }
    s.handle_configure(SetupWorker {
        num_workers: 2,
        layouts: Vec::new(),
        servers: Vec::new(),
        datasets: vec![("ids".into(), 0)],
        version: 0,
        generation: 0,
    });
    s
}

/// Two workers, two servers, `before` closures committed before a cut at the next id, then
/// `after` closures dispatched and committed: a loss now rolls those back.
fn committed_past_cut(before: usize, after: usize) -> (Scheduler, Vec<ClosureId>) {
    let t = Instant::now();
    let mut s = two_by_two(SchedulerConfig::default());
    let mut ids = Vec::new();
    for n in 0..before + after {
        if n == before {
            s.mark_cut(ClosureId(s.next_closure_id()), root()).unwrap();
        }
        ids.push(s.handle_schedule(t, "step", vec![n as u8]).unwrap());
        super::scheduler_tests::run_all(&mut s);
    }
    (s, ids)
}

/// A server that cannot be reached at any step of the restore (or whose checkpoint read
/// fails as unreachable) interrupts it; once it answers again the restore runs again in a new
/// generation from the start, and what committed since the cut runs once more (LEDGER-1).
#[test]
fn a_ps_lost_during_each_step_of_a_restore_interrupts_it_and_it_runs_again() {
    for failing in [Step::Begin, Step::Shards, Step::RollBack] {
        let t = Instant::now();
        let ckpt = checkpoint(7, 2, 3);
        let (mut s, ids) = committed_past_cut(2, 2);
        s.handle_ps_lost(t, 0, 1);
        s.handle_ps_up(t, 0, 2);
        let mut failed = false;
        let (_, seen) = drive_restore(&mut s, &ckpt, |step, target| {
            (step == failing && target == 1 && !std::mem::replace(&mut failed, true))
                .then(|| CallFault::Unreachable("peer lost".into()))
        });
        assert!(seen.contains(&(failing, 1, 1)), "{failing:?}: {seen:?}");
        assert!(
            s.is_holding() && !s.is_restoring(),
            "{failing:?}: waits for ps/1"
        );
        assert_eq!(s.ps_down(), vec![1], "{failing:?}");
        // ps/1 restarted meanwhile: the next restore pins its new incarnation.
        s.handle_ps_answered(t, 1, 2, false);
        let (others, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
        assert!(
            seen.iter().all(|(_, _, g)| *g == 2),
            "{failing:?}: a new generation: {seen:?}"
        );
        assert!(!s.is_holding(), "{failing:?}");
        assert_eq!(
            dispatched(&others),
            vec![(0, ids[2], 2), (1, ids[3], 2)],
            "{failing:?}: the closures past the cut run again"
        );
        let l = s.ledger();
        assert_eq!((l.ps_restores, l.rolled_back, l.pending), (1, 2, 2));
        assert!(l.balances(), "{failing:?}: {l:?}");
        assert!(s.take_error().is_none());
    }
}

/// A server that refuses a step (the checkpoint does not fit it), or a checkpoint that is
/// gone, fails the recovery: `join` raises it naming the server, never a hang.
#[test]
fn a_refused_step_or_a_missing_checkpoint_fails_the_recovery() {
    for refused in [Step::Begin, Step::Shards, Step::RollBack, Step::Load] {
        let t = Instant::now();
        let ckpt = checkpoint(7, 2, 3);
        let (mut s, _) = committed_past_cut(2, 1);
        s.handle_ps_up(t, 1, 2);
        let mut calls = drain(&mut s);
        let mut guard = 0;
        while let Some(SchedulerAction::Restore(call)) = calls.pop() {
            guard += 1;
            assert!(guard < 100);
            let (step, _, generation) = step_of(&call);
            let report = match (step == refused, &call) {
                (true, RestoreCall::Load { .. }) => RestoreReport::Loaded { result: Ok(None) },
                (true, _) => answer(&call, &ckpt, Some(CallFault::Refused("shape".into()))),
                (false, _) => answer(&call, &ckpt, None),
            };
            s.handle_restore_report(t, generation, report);
            calls.extend(drain(&mut s));
        }
        assert!(!s.is_holding(), "{refused:?}");
        let err = s.take_error().expect("the loss is raised").to_string();
        assert!(err.contains("ps/1"), "{refused:?}: {err}");
        assert!(s.ledger().balances());
    }
}

/// Two workers, two servers, closures committed in three runs with a cut before the second
/// and before the third (`runs[0]`, `runs[1]`, `runs[2]` closures), under `config`.
fn committed_past_two_cuts(runs: [usize; 3], config: SchedulerConfig) -> Scheduler {
    let t = Instant::now();
    let mut s = two_by_two(config);
    for (i, n) in runs.into_iter().enumerate() {
        if i > 0 {
            s.mark_cut(ClosureId(s.next_closure_id()), root()).unwrap();
        }
        for _ in 0..n {
            s.handle_schedule(t, "step", Vec::new()).unwrap();
            super::scheduler_tests::run_all(&mut s);
        }
    }
    s
}

/// The last cut's checkpoint no longer verifies when a server is lost (damaged on disk after
/// its save read it back): the recovery rolls back to the cut before it and runs again
/// everything committed since that one, instead of failing the job.
#[test]
fn a_recovery_whose_checkpoint_cannot_be_read_rolls_back_to_the_cut_before() {
    let t = Instant::now();
    let mut s = committed_past_two_cuts([2, 3, 2], SchedulerConfig::default());
    s.handle_ps_lost(t, 0, 1);
    s.handle_ps_up(t, 0, 2);
    let older = checkpoint(4, 2, 2);
    let mut loads = Vec::new();
    let mut others = Vec::new();
    loop {
        let actions = drain(&mut s);
        if actions.is_empty() {
            break;
        }
        for action in actions {
            let SchedulerAction::Restore(call) = action else {
                others.push(action);
                continue;
            };
            let (_, _, generation) = step_of(&call);
            let report = match &call {
                RestoreCall::Load { cut, .. } => {
                    loads.push(cut.0);
                    // The newer checkpoint (cut 5) does not verify; the older one (cut 2) does.
                    RestoreReport::Loaded {
                        result: Ok((cut.0 == 2).then(|| CheckpointRef(Arc::clone(&older)))),
                    }
                }
                _ => answer(&call, &older, None),
            };
            s.handle_restore_report(t, generation, report);
        }
    }
    assert_eq!(loads, [5, 2], "the last cut, then the one before it");
    assert!(s.take_error().is_none(), "the job goes on");
    assert!(!s.is_holding());
    assert_eq!(s.cut(), Some(ClosureId(2)));
    let l = s.ledger().clone();
    assert_eq!((l.ps_restores, l.rolled_back), (1, 5), "{l:?}");
    assert!(l.balances(), "{l:?}");
    assert_eq!((l.committed, l.pending), (2, 5), "{l:?}");
    assert_eq!(
        dispatched(&others).len(),
        2,
        "dispatch resumed on both workers"
    );
}

/// Keeping what committed since the cut before the last one never costs a rollback to the
/// last cut: past `rollback_retained_max` the fallback is given up first (its checkpoint can
/// then no longer be rolled back to, and an unreadable last cut fails the recovery).
#[test]
fn the_fallback_cut_gives_way_to_the_retention_bound() {
    let t = Instant::now();
    let config = || SchedulerConfig {
        rollback_retained_max: 3,
        ..SchedulerConfig::default()
    };
    let mut s = committed_past_two_cuts([2, 2, 2], config());
    s.handle_ps_lost(t, 0, 1);
    s.handle_ps_up(t, 0, 2);
    let ckpt = checkpoint(4, 4, 2);
    let (_, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    assert!(seen.iter().any(|(step, _, _)| *step == Step::Load));
    assert!(s.take_error().is_none());
    assert_eq!(
        s.ledger().rolled_back,
        2,
        "only what committed since the last cut"
    );
    // The same job with an unreadable last cut has nothing to fall back to.
    let mut s = committed_past_two_cuts([2, 2, 2], config());
    s.handle_ps_lost(t, 1, 1);
    s.handle_ps_up(t, 1, 2);
    let mut calls = drain(&mut s);
    let mut guard = 0;
    while let Some(SchedulerAction::Restore(call)) = calls.pop() {
        guard += 1;
        assert!(guard < 100);
        let (_, _, generation) = step_of(&call);
        let report = match &call {
            RestoreCall::Load { .. } => RestoreReport::Loaded { result: Ok(None) },
            _ => answer(&call, &ckpt, None),
        };
        s.handle_restore_report(t, generation, report);
        calls.extend(drain(&mut s));
    }
    let err = s.take_error().expect("the loss is raised").to_string();
    assert!(err.contains("no valid checkpoint cut"), "{err}");
}

/// A worker that comes up while a restore runs is rewound with the others (the machine
/// counts it live when the Rewind phase starts), at the checkpoint's positions; setups handed
/// out before the restore ended are outdated, and a later incarnation starts there too.
#[test]
fn a_worker_that_returns_during_a_restore_is_rewound_at_the_restored_positions() {
    let t = Instant::now();
    let ckpt = checkpoint(7, 2, 5);
    let (mut s, _) = committed_past_cut(2, 1);
    s.handle_worker_lost(t, 0, 1);
    s.handle_ps_up(t, 1, 2);
    let version = s.setup_version();
    let mut came_up = false;
    let mut rewound = Vec::new();
    loop {
        let actions = drain(&mut s);
        if actions.is_empty() {
            break;
        }
        for action in actions {
            if let SchedulerAction::Restore(call) = action {
                let (step, _, generation) = step_of(&call);
                if step == Step::Shards && !came_up {
                    came_up = true;
                    s.handle_worker_up(t, 0, 2);
                }
                if let RestoreCall::Rewind { worker, setup, .. } = &call {
                    rewound.push((*worker, setup.datasets.clone()));
                }
                s.handle_restore_report(t, generation, answer(&call, &ckpt, None));
            }
        }
    }
    assert_eq!(
        rewound,
        vec![
            (0, vec![("ids".to_string(), 5)]),
            (1, vec![("ids".to_string(), 0)])
        ]
    );
    assert_ne!(
        s.setup_version(),
        version,
        "setups from before are outdated"
    );
    assert_eq!(s.setup_for(0).datasets, vec![("ids".to_string(), 5)]);
    assert!(!s.is_holding());
}

/// A worker whose datasets cannot be rewound is lost (fenced, its next incarnation set up at
/// the restored positions); the restore itself succeeds.
#[test]
fn a_worker_that_cannot_be_rewound_is_lost_and_the_restore_succeeds() {
    let t = Instant::now();
    let ckpt = checkpoint(7, 2, 5);
    let (mut s, _) = committed_past_cut(2, 1);
    s.handle_ps_up(t, 0, 2);
    let (others, _) = drive_restore(&mut s, &ckpt, |step, target| {
        (step == Step::Rewind && target == 1).then(|| CallFault::Unreachable("gone".into()))
    });
    assert!(others.contains(&SchedulerAction::Fence {
        worker: 1,
        incarnation: 1
    }));
    assert_eq!(s.live_workers(), 1);
    assert!(!s.is_holding() && s.take_error().is_none());
    assert_eq!(s.ledger().ps_restores, 1);
}

/// The watermark never goes out while a recovery holds dispatch (the closures committed since
/// the cut run again and must not be refused), and after the restore it starts from the cut.
#[test]
fn ps_1_a_watermark_tick_racing_a_restore_sends_nothing_until_it_ended() {
    let t = Instant::now();
    let ckpt = checkpoint(7, 2, 0);
    let (mut s, ids) = committed_past_cut(2, 2);
    s.handle_watermark_tick();
    let sent = |actions: &[SchedulerAction]| -> Vec<(ClosureId, u64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                SchedulerAction::Watermark {
                    finished_below,
                    generation,
                } => Some((*finished_below, *generation)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(sent(&drain(&mut s)), vec![(ClosureId(4), 0)]);
    s.handle_ps_up(t, 0, 2);
    let mut ticks = Vec::new();
    loop {
        let actions = drain(&mut s);
        if actions.is_empty() {
            break;
        }
        for action in actions {
            if let SchedulerAction::Restore(call) = action {
                s.handle_watermark_tick();
                ticks.extend(sent(&drain(&mut s)));
                let (_, _, generation) = step_of(&call);
                s.handle_restore_report(t, generation, answer(&call, &ckpt, None));
            }
        }
    }
    assert!(
        ticks.is_empty(),
        "a watermark went out during the restore: {ticks:?}"
    );
    // The rolled-back closures are in flight again: the watermark is the cut, not above.
    assert_eq!(s.low_watermark(), ids[2]);
    s.handle_watermark_tick();
    assert!(sent(&drain(&mut s)).is_empty());
}

/// Two servers lost one after the other: the second, lost while the first one's restore
/// runs, interrupts it; the next restore covers both, and the job goes on with each closure's
/// effect present once (LEDGER-1).
#[test]
fn two_servers_lost_one_after_the_other_are_restored_together() {
    let t = Instant::now();
    let ckpt = checkpoint(7, 2, 0);
    let (mut s, ids) = committed_past_cut(2, 2);
    s.handle_ps_lost(t, 0, 1);
    s.handle_ps_up(t, 0, 2);
    let mut lost_second = false;
    let (_, seen) = drive_restore(&mut s, &ckpt, |step, target| {
        if step == Step::Shards && target == 1 && !lost_second {
            lost_second = true;
            return Some(CallFault::Unreachable("peer lost".into()));
        }
        None
    });
    assert!(seen.iter().all(|(_, _, g)| *g == 1));
    s.handle_ps_lost(t, 1, 1);
    assert!(s.is_holding() && !s.is_restoring());
    s.handle_ps_up(t, 1, 2);
    let (others, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    let begun: Vec<u32> = seen
        .iter()
        .filter(|(step, _, g)| *step == Step::Begin && *g == 2)
        .map(|(_, ps, _)| *ps)
        .collect();
    assert_eq!(begun, vec![0, 1]);
    assert_eq!(dispatched(&others), vec![(0, ids[2], 2), (1, ids[3], 2)]);
    assert!(s.ledger().balances() && s.take_error().is_none());
}

/// The chief's restore at start-up onto servers that outlived the checkpoint (a restarted
/// coordinator): the generation opens above every server's, PS-1's state is rolled back to
/// above every id any server applied, and the ledger and ids carry on from there, so no
/// closure id is ever reused.
#[test]
fn a_restore_at_start_with_live_servers_ahead_of_the_checkpoint() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    let ckpt = checkpoint(9, 10, 4);
    let probes = [
        ServerProbe {
            ps: 0,
            incarnation: 3,
            generation: 2,
            next_free_closure_id: 14,
            serving: false,
            restoring: false,
        },
        ServerProbe {
            ps: 1,
            incarnation: 1,
            generation: 1,
            next_free_closure_id: 12,
            serving: false,
            restoring: false,
        },
    ];
    let ticket = s
        .handle_restore_at_start(t, Arc::clone(&ckpt), root(), &probes, 2)
        .unwrap();
    assert!(s.is_holding());
    // Scheduling meanwhile is held, not dispatched.
    let (others, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    assert!(seen.iter().all(|(_, _, g)| *g == 3), "{seen:?}");
    assert!(!seen.iter().any(|(step, ..)| *step == Step::Load));
    assert!(others.contains(&SchedulerAction::RestoreFinished {
        ticket,
        result: Ok(Some(9))
    }));
    assert_eq!(s.generation(), 3);
    assert_eq!(s.next_closure_id(), 14);
    assert_eq!(s.cut(), Some(ClosureId(14)));
    assert_eq!(s.setup_for(0).datasets, Vec::<(String, u64)>::new());
    assert_eq!(s.ledger().scheduled, 10);
    let id = s.handle_schedule(t, "step", vec![]).unwrap();
    assert_eq!(id, ClosureId(14));
    assert!(!s.is_holding());
}

/// The servers a restore at start-up probed are servers seen: a recovery right after it (here
/// one of them restarted) restores every one of them, also one the failure detector has not
/// heard yet. Its restore once pinned only the servers heard, none here, and waited forever
/// for answers from nobody (seed 13014266 of the simulator, where the move of the variables
/// off a leaving server followed the start while the other was cut off).
#[test]
fn a_recovery_after_the_restore_at_start_restores_every_server_it_probed() {
    let t = Instant::now();
    let ckpt = checkpoint(9, 10, 0);
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    s.handle_restore_at_start(t, Arc::clone(&ckpt), root(), &[probe(0), probe(1)], 2)
        .unwrap();
    drive_restore(&mut s, &ckpt, |_, _| None);
    assert_eq!(s.ps_incarnation(0), Some((1, true)));
    assert_eq!(s.ps_incarnation(1), Some((1, true)));
    s.handle_ps_lost(t, 1, 1);
    s.handle_ps_up(t, 1, 2);
    let (_, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    let begun: Vec<u32> = seen
        .iter()
        .filter(|(step, ..)| *step == Step::Begin)
        .map(|(_, ps, _)| *ps)
        .collect();
    assert_eq!(begun, vec![0, 1]);
    assert!(seen.iter().any(|(step, ..)| *step == Step::Rewind));
    assert!(!s.is_holding() && s.take_error().is_none());
}

/// A restore with nothing to await in a phase passes it at once rather than waiting for an
/// answer nobody was asked for: here a run of no server (read from its cut) goes from the
/// checkpoint's reading straight to rewinding the workers.
#[test]
fn a_restore_phase_with_nothing_to_await_is_passed_at_once() {
    let ckpt = checkpoint(9, 10, 3);
    let (mut run, calls) = super::recovery::RestoreRun::start(
        4,
        BTreeMap::new(),
        Vec::new(),
        ClosureId(10),
        super::recovery::CheckpointSource::AtCut {
            root: root(),
            cut: ClosureId(10),
        },
        Vec::new(),
    );
    assert!(
        matches!(calls.as_slice(), [RestoreCall::Load { .. }]),
        "{calls:?}"
    );
    let workers = [(0, 1)];
    let setup = super::control_tests::setup(&[("ids", 0)]);
    let targets = super::recovery::RewindTargets {
        workers: &workers,
        setup: &setup,
    };
    let (calls, end) = run.handle(answer(&calls[0], &ckpt, None), targets);
    assert!(end.is_none());
    assert!(
        matches!(calls.as_slice(), [RestoreCall::Rewind { worker: 0, .. }]),
        "{calls:?}"
    );
    let (calls, end) = run.handle(answer(&calls[0], &ckpt, None), targets);
    assert!(calls.is_empty());
    assert!(
        matches!(end, Some(super::recovery::RunEnd::Done { step: 9, .. })),
        "{end:?}"
    );
}

/// Server `ps`'s answer to the start's probe: incarnation 1, nothing applied yet.
fn probe(ps: u32) -> ServerProbe {
    ServerProbe {
        ps,
        incarnation: 1,
        generation: 0,
        next_free_closure_id: 0,
        serving: false,
        restoring: false,
    }
}

/// A restore at start-up that a server cannot take ends with the reason, and leaves the
/// scheduler usable; one asked for with a server missing, or after scheduling, is refused.
#[test]
fn a_failed_restore_at_start_is_reported_and_bad_requests_are_refused() {
    let t = Instant::now();
    let ckpt = checkpoint(9, 10, 0);
    let mut s = Scheduler::new(SchedulerConfig::default());
    let err = s
        .handle_restore_at_start(t, Arc::clone(&ckpt), root(), &[probe(0)], 2)
        .unwrap_err();
    assert_eq!(err, StartFailure::ServerMissing { ps: 1 });
    let ticket = s
        .handle_restore_at_start(t, Arc::clone(&ckpt), root(), &[probe(0), probe(1)], 2)
        .unwrap();
    let (others, _) = drive_restore(&mut s, &ckpt, |step, _| {
        (step == Step::Shards).then(|| CallFault::Refused("shape [3] vs [4]".into()))
    });
    let finished = others.iter().find_map(|a| match a {
        SchedulerAction::RestoreFinished { ticket: t, result } if *t == ticket => Some(result),
        _ => None,
    });
    assert!(
        matches!(finished, Some(Err(e)) if e.to_string().contains("shape")),
        "{others:?}"
    );
    assert!(!s.is_holding());
    s.handle_schedule(t, "step", vec![]).unwrap();
    assert!(s
        .handle_restore_at_start(t, ckpt, root(), &[probe(0), probe(1)], 2)
        .is_err());
}

/// A server lost while the start's restore runs (it cannot be reached at some step) ends the
/// start as `ServerLost`, naming the server: not a failure of the checkpoint or the program,
/// so the chief exits asking for a restart, and its next incarnation probes and restores again.
#[test]
fn a_server_lost_during_the_restore_at_start_ends_it_as_a_server_loss() {
    let t = Instant::now();
    let ckpt = checkpoint(9, 10, 0);
    for failing in [Step::Begin, Step::Shards, Step::RollBack] {
        let mut s = Scheduler::new(SchedulerConfig::default());
        let ticket = s
            .handle_restore_at_start(t, Arc::clone(&ckpt), root(), &[probe(0), probe(1)], 2)
            .unwrap();
        let (others, _) = drive_restore(&mut s, &ckpt, |step, target| {
            (step == failing && target == 1).then(|| CallFault::Unreachable("peer lost".into()))
        });
        let finished = others.iter().find_map(|a| match a {
            SchedulerAction::RestoreFinished { ticket: t, result } if *t == ticket => {
                Some(result.clone())
            }
            _ => None,
        });
        assert!(
            matches!(&finished, Some(Err(StartFailure::ServerLost { ps: 1, .. }))),
            "{failing:?}: {finished:?}"
        );
        assert!(!s.is_holding(), "{failing:?}");
    }
}

/// Answers of another generation, duplicates, and answers for calls never made change
/// nothing (a restore given up since must not move the current one on).
#[test]
fn stale_or_duplicate_restore_answers_change_nothing() {
    let t = Instant::now();
    let ckpt = checkpoint(7, 2, 0);
    let (mut s, _) = committed_past_cut(2, 1);
    s.handle_ps_up(t, 0, 2);
    let calls = drain(&mut s);
    let begins: Vec<RestoreCall> = calls
        .into_iter()
        .filter_map(|a| match a {
            SchedulerAction::Restore(c @ RestoreCall::Begin { .. }) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(begins.len(), 2);
    // Another generation: ignored.
    s.handle_restore_report(t, 7, answer(&begins[0], &ckpt, None));
    // A roll-back nobody asked for yet: ignored.
    s.handle_restore_report(
        t,
        1,
        RestoreReport::RolledBack {
            ps: 0,
            result: Ok(()),
        },
    );
    s.handle_restore_report(t, 1, answer(&begins[0], &ckpt, None));
    s.handle_restore_report(t, 1, answer(&begins[0], &ckpt, None));
    assert!(
        drain(&mut s).is_empty(),
        "ps/1 has not begun, the checkpoint is not read"
    );
    assert!(s.is_restoring());
}

/// The machine decides whom to dial: every server never seen or not reachable, one dial each
/// at a time; an answer from an incarnation declared dead retires it; no answer waits for the
/// next tick.
#[test]
fn servers_are_dialled_until_they_answer_and_a_declared_dead_one_is_retired() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_servers(2);
    let dials = |actions: &[SchedulerAction]| -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                SchedulerAction::DialPs { ps } => Some(*ps),
                _ => None,
            })
            .collect()
    };
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![0, 1]);
    s.handle_reconnect_tick();
    assert!(dials(&drain(&mut s)).is_empty(), "one dial each at a time");
    s.handle_ps_dialled(
        t,
        0,
        PsDial::Answered {
            incarnation: 1,
            serving: true,
        },
    );
    s.handle_ps_dialled(t, 1, PsDial::Unreachable);
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![1]);
    assert_eq!(s.ps_incarnation(0), Some((1, true)));
    s.handle_ps_lost(t, 0, 1);
    s.handle_ps_dialled(
        t,
        1,
        PsDial::Answered {
            incarnation: 1,
            serving: true,
        },
    );
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![0]);
    s.handle_ps_dialled(t, 0, PsDial::DeclaredDead { incarnation: 1 });
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::RetirePs {
            ps: 0,
            incarnation: 1
        }]
    );
}

/// Two workers and two servers (no variable: a read asks only the workers' positions) with
/// `before` closures committed, then the program's first save read: the cut handed out to be
/// written, none marked yet.
fn first_cut_read(before: usize) -> (Scheduler, CutReading) {
    let t = Instant::now();
    let mut s = two_by_two(SchedulerConfig::default());
    for n in 0..before {
        s.handle_schedule(t, "step", vec![n as u8]).unwrap();
        super::scheduler_tests::run_all(&mut s);
    }
    s.handle_read_cut(t, 1).unwrap();
    let mut reading = None;
    while reading.is_none() {
        let actions = drain(&mut s);
        assert!(!actions.is_empty(), "the read stalled");
        for action in actions {
            match action {
                SchedulerAction::AskPositions {
                    ticket,
                    worker,
                    incarnation,
                } => {
                    s.handle_positions(t, ticket, worker, incarnation, Ok(vec![("ids".into(), 3)]))
                }
                SchedulerAction::CutRead { result, .. } => reading = Some(result.unwrap()),
                _ => {}
            }
        }
    }
    assert_eq!(s.cut(), None);
    (s, reading.unwrap())
}

/// Regression: a server lost after the first checkpoint was read, while it was written, failed
/// the job at once with "no checkpoint to restore it from" (the cut is marked only once the
/// checkpoint reads back whole). The recovery now waits for that mark and restores from it;
/// what committed meanwhile (a save written in the background) runs again (LEDGER-1).
#[test]
fn a_server_lost_while_the_first_checkpoint_is_written_is_restored_from_it_once_marked() {
    let t = Instant::now();
    let (mut s, reading) = first_cut_read(2);
    let cut = reading.ledger.next_closure_id;
    let meanwhile = s.handle_schedule(t, "step", vec![9]).unwrap();
    super::scheduler_tests::run_all(&mut s);
    s.handle_ps_lost(t, 1, 1);
    s.handle_ps_up(t, 1, 2);
    assert!(s.take_error().is_none(), "the recovery waits for the mark");
    assert!(s.is_holding() && !s.is_restoring());
    assert!(drain(&mut s).is_empty(), "nothing to restore from yet");
    assert_eq!(
        s.low_watermark(),
        ClosureId(cut),
        "what committed since the cut may run again"
    );
    s.handle_mark_cut(ClosureId(cut), root(), Some(reading.generation))
        .unwrap();
    let ckpt = checkpoint(1, cut, 3);
    let (others, seen) = drive_restore(&mut s, &ckpt, |_, _| None);
    assert!(!seen.is_empty(), "the restore runs from the marked cut");
    assert_eq!(
        dispatched(&others),
        vec![(0, meanwhile, 2)],
        "the closure committed while it was written runs again"
    );
    assert!(!s.is_holding());
    let l = s.ledger();
    assert_eq!((l.ps_restores, l.rolled_back), (1, 1));
    assert!(l.balances(), "{l:?}");
    assert!(s.take_error().is_none());
}

/// A save overtaken by a newer cut (a server's preemption cut marked while it was written) is
/// not marked when it ends: going back to it would roll back past closures that only the newer
/// cut accounts for, no longer kept to run again. The newer cut stays.
#[test]
fn a_save_overtaken_by_a_newer_cut_is_not_marked() {
    let (mut s, reading) = first_cut_read(2);
    let older = reading.ledger.next_closure_id;
    let t = Instant::now();
    s.handle_schedule(t, "step", vec![7]).unwrap();
    super::scheduler_tests::run_all(&mut s);
    let newer = ClosureId(s.next_closure_id());
    s.mark_cut(newer, root()).unwrap();
    let refused = s
        .handle_mark_cut(ClosureId(older), root(), Some(reading.generation))
        .unwrap_err();
    assert!(matches!(refused, MarkCutError::Older { .. }), "{refused}");
    assert_eq!(s.cut(), Some(newer));
}

/// A first checkpoint that a recovery waits for and that is never marked fails the recovery
/// naming why: its write failed (the shell abandons it), or it was not marked within
/// `ps_restart_wait_max`.
#[test]
fn a_first_checkpoint_that_never_becomes_the_cut_fails_the_recovery_waiting_for_it() {
    let t = Instant::now();
    let (mut s, reading) = first_cut_read(1);
    s.handle_ps_lost(t, 1, 1);
    assert!(s.take_error().is_none());
    s.handle_cut_abandoned(ClosureId(reading.ledger.next_closure_id), "disk full");
    let err = s.take_error().expect("the loss is raised").to_string();
    assert!(
        err.contains("no checkpoint to restore it from") && err.contains("disk full"),
        "{err}"
    );
    assert!(!s.is_holding());

    let (mut s, _) = first_cut_read(1);
    s.handle_ps_lost(t, 0, 1);
    let deadline = s.poll_timeout().expect("the wait is bounded");
    assert!(deadline <= t + s.config().ps_restart_wait_max + Duration::from_secs(1));
    s.handle_timeout(deadline);
    let err = s.take_error().expect("the loss is raised").to_string();
    assert!(err.contains("not marked durable"), "{err}");

    // Abandoned before any loss: a server lost later fails at once, as with no save, naming
    // why there is no checkpoint.
    let (mut s, reading) = first_cut_read(1);
    s.handle_cut_abandoned(ClosureId(reading.ledger.next_closure_id), "torn");
    s.handle_ps_lost(t, 0, 1);
    let err = s.take_error().expect("failed at once").to_string();
    assert!(
        err.contains("no checkpoint to restore it from") && err.contains("torn"),
        "{err}"
    );
}

/// The rate the closures after a checkpoint's cut carried (set by Keras'
/// `LearningRateScheduler`) is in the checkpoint, and a chief that restores it at its start
/// schedules at it; a recorded rate no optimizer accepts fails the start, naming it.
#[test]
fn a_restore_at_start_carries_on_at_the_rate_the_checkpoint_recorded() {
    let t = Instant::now();
    let rate = LearningRate::new(0.25);
    let mut ckpt = (*checkpoint(9, 10, 0)).clone();
    ckpt.extra[save::LEARNING_RATE_KEY] = serde_json::json!(0.25);
    let ckpt = Arc::new(ckpt);
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    assert_eq!(s.status().learning_rate, None);
    s.handle_restore_at_start(t, Arc::clone(&ckpt), root(), &[probe(0), probe(1)], 2)
        .unwrap();
    drive_restore(&mut s, &ckpt, |_, _| None);
    assert_eq!(s.status().learning_rate, rate);
    s.handle_schedule(t, "step", vec![]).unwrap();
    let carried: Vec<Option<LearningRate>> = drain(&mut s)
        .into_iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch { learning_rate, .. } => Some(learning_rate),
            _ => None,
        })
        .collect();
    assert_eq!(carried, vec![rate]);

    // Unreadable: the start fails before it restores anything.
    for bad in [serde_json::json!(-1.0), serde_json::json!("fast")] {
        let mut ckpt = (*checkpoint(9, 10, 0)).clone();
        ckpt.extra[save::LEARNING_RATE_KEY] = bad.clone();
        let mut s = Scheduler::new(SchedulerConfig::default());
        let err = s
            .handle_restore_at_start(t, Arc::new(ckpt), root(), &[probe(0), probe(1)], 2)
            .unwrap_err();
        let why = err.to_string();
        assert!(
            why.contains("learning_rate") && why.contains(&bad.to_string()),
            "{why}"
        );
        assert!(!s.is_holding());
    }
}

/// A checkpoint's recorded rate: none (a checkpoint from before it was kept) and `null` are the
/// servers' own; a number is that rate.
#[test]
fn a_checkpoint_without_a_recorded_rate_is_at_the_servers_own() {
    let mut ckpt = Checkpoint::new(1, 1);
    assert_eq!(save::recorded_learning_rate(&ckpt), Ok(None));
    ckpt.extra[save::LEARNING_RATE_KEY] = serde_json::Value::Null;
    assert_eq!(save::recorded_learning_rate(&ckpt), Ok(None));
    ckpt.extra[save::LEARNING_RATE_KEY] = serde_json::json!(0.5);
    assert_eq!(
        save::recorded_learning_rate(&ckpt),
        Ok(LearningRate::new(0.5))
    );
}
