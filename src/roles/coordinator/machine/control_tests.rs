//! The worker control plane driven through the scheduler over the orderings the shell used to
//! decide: whom to dial and when, a fenced or dead-declared incarnation that answers, a setup
//! that a restore or a new configuration made outdated, a configuration that a worker refuses,
//! (a worker lost while a save collects dataset positions is in `save_tests`).

use std::sync::Arc;

use super::control::{SetUpDisposition, WorkerDial};
use super::recovery::{CallFault, RestoreCall, RestoreReport, DATASET_POSITIONS_KEY};
use super::*;

pub(super) fn drain(s: &mut Scheduler) -> Vec<SchedulerAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

pub(super) fn setup(datasets: &[(&str, u64)]) -> SetupWorker {
    SetupWorker {
        num_workers: 2,
        layouts: Vec::new(),
        servers: Vec::new(),
        datasets: datasets.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
        version: 0,
        generation: 0,
    }
}

/// The workers dialled by `actions`, in order.
fn dials(actions: &[SchedulerAction]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::DialWorker { worker } => Some(*worker),
            _ => None,
        })
        .collect()
}

/// A setup asked for: (worker, incarnation, datasets, version).
type SetUpAsked = (u32, u64, Vec<(String, u64)>, u64);

/// The one setup among `actions`.
pub(super) fn set_up(actions: &[SchedulerAction]) -> Option<SetUpAsked> {
    actions.iter().find_map(|a| match a {
        SchedulerAction::SetUpWorker {
            worker,
            incarnation,
            setup,
            version,
        } => Some((*worker, *incarnation, setup.datasets.clone(), *version)),
        _ => None,
    })
}

/// Dials, answers and sets up worker `worker` as incarnation `incarnation`.
pub(super) fn bring_up(s: &mut Scheduler, worker: u32, incarnation: u64) {
    let t = Instant::now();
    s.handle_reconnect_tick();
    drain(s);
    assert!(s.workers_dialling().contains(&worker));
    s.handle_worker_dialled(t, worker, WorkerDial::Answered { incarnation });
    let (_, _, _, version) = set_up(&drain(s)).expect("a newer incarnation is set up");
    assert_eq!(
        s.handle_worker_set_up(t, worker, incarnation, version, Ok(())),
        SetUpDisposition::Up
    );
    assert_eq!(s.worker_incarnation(worker), Some(incarnation));
}

/// Every worker with no live incarnation is dialled, one dial (and its setup) at a time each;
/// no answer waits for the next tick; a set-up incarnation is up and gets work.
#[test]
fn workers_are_dialled_one_at_a_time_and_a_new_incarnation_is_set_up_then_up() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_workers(2);
    s.handle_configure(setup(&[("ids", 0)]));
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![0, 1]);
    s.handle_reconnect_tick();
    assert!(drain(&mut s).is_empty(), "one dial each at a time");
    s.handle_worker_dialled(t, 1, WorkerDial::Unreachable);
    s.handle_worker_dialled(t, 0, WorkerDial::Answered { incarnation: 4 });
    let (worker, incarnation, datasets, version) = set_up(&drain(&mut s)).unwrap();
    assert_eq!((worker, incarnation), (0, 4));
    assert_eq!(datasets, vec![("ids".to_string(), 0)]);
    s.handle_reconnect_tick();
    assert_eq!(
        dials(&drain(&mut s)),
        vec![1],
        "worker/0's setup is still under way"
    );
    assert_eq!(
        s.worker_incarnation(0),
        None,
        "not up before its setup answered"
    );
    let id = s.handle_schedule(t, "step", vec![]).unwrap();
    assert!(
        drain(&mut s).is_empty(),
        "nothing runs on a worker not set up"
    );
    assert_eq!(
        s.handle_worker_set_up(t, 0, 4, version, Ok(())),
        SetUpDisposition::Up
    );
    assert!(matches!(
        drain(&mut s).as_slice(),
        [SchedulerAction::Dispatch { worker: 0, incarnation: 4, closure, .. }] if *closure == id
    ));
    s.handle_reconnect_tick();
    assert!(dials(&drain(&mut s)).is_empty(), "worker/0 is live");
}

/// FENCE-1: a fenced incarnation that still answers a dial (a step past the step timeout, a
/// refused job), or one the failure detector declared dead, is retired, never set up again; a
/// newer incarnation is set up.
#[test]
fn fence_1_a_fenced_or_dead_declared_incarnation_that_answers_is_retired() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_workers(1);
    bring_up(&mut s, 0, 1);
    s.handle_worker_lost(t, 0, 1);
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::Fence {
            worker: 0,
            incarnation: 1
        }]
    );
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![0]);
    s.handle_worker_dialled(t, 0, WorkerDial::Answered { incarnation: 1 });
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::RetireWorker {
            worker: 0,
            incarnation: 1
        }]
    );
    s.handle_worker_retired(0, 1, Ok(()));
    s.handle_reconnect_tick();
    assert_eq!(
        dials(&drain(&mut s)),
        vec![0],
        "dialled again after retiring"
    );
    s.handle_worker_dialled(t, 0, WorkerDial::DeclaredDead { incarnation: 2 });
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::RetireWorker {
            worker: 0,
            incarnation: 2
        }]
    );
    s.handle_worker_retired(0, 2, Err(CallFault::Unreachable("gone".into())));
    let counters = s.control_counters();
    assert_eq!((counters.workers_retired, counters.retires_failed), (1, 1));
    bring_up(&mut s, 0, 3);
    // A late dial answer for a worker not being dialled changes nothing.
    s.handle_worker_dialled(t, 0, WorkerDial::Answered { incarnation: 9 });
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.worker_incarnation(0), Some(3));
}

/// A checkpoint at `cut` whose positions put worker 0's dataset `ids` at `position`.
pub(super) fn checkpoint(cut: u64, position: u64) -> Arc<Checkpoint> {
    let mut ckpt = Checkpoint::new(3, 1);
    ckpt.ledger.next_closure_id = cut;
    ckpt.ledger.counts.scheduled = cut;
    ckpt.ledger.counts.committed = cut;
    ckpt.extra = serde_json::json!({ DATASET_POSITIONS_KEY: {
        "0": { "ids": position },
        "1": { "ids": position + 1 },
    } });
    Arc::new(ckpt)
}

/// Starts the restore at start-up of `checkpoint(5, 7)` onto one untouched server (ps/0,
/// incarnation 1).
pub(super) fn start_restore(s: &mut Scheduler, t: Instant) {
    let probe = ServerProbe {
        ps: 0,
        incarnation: 1,
        generation: 0,
        next_free_closure_id: 0,
        serving: false,
        restoring: false,
    };
    s.handle_restore_at_start(t, checkpoint(5, 7), PathBuf::from("ckpt"), &[probe], 1)
        .unwrap();
}

/// Answers every restore call successfully until none is left; returns the other actions.
pub(super) fn finish_restore(s: &mut Scheduler) -> Vec<SchedulerAction> {
    let t = Instant::now();
    let mut others = Vec::new();
    loop {
        let actions = drain(s);
        if actions.is_empty() {
            return others;
        }
        for action in actions {
            let SchedulerAction::Restore(call) = action else {
                others.push(action);
                continue;
            };
            let (generation, report) = match call {
                RestoreCall::Begin { ps, generation, .. } => {
                    (generation, RestoreReport::Begun { ps, result: Ok(()) })
                }
                RestoreCall::Shards { ps, generation, .. } => (
                    generation,
                    RestoreReport::ShardsRestored { ps, result: Ok(()) },
                ),
                RestoreCall::RollBack { ps, generation, .. } => {
                    (generation, RestoreReport::RolledBack { ps, result: Ok(()) })
                }
                RestoreCall::Rewind {
                    worker,
                    incarnation,
                    generation,
                    ..
                } => (
                    generation,
                    RestoreReport::Rewound {
                        worker,
                        incarnation,
                        result: Ok(()),
                    },
                ),
                RestoreCall::Load { .. } => unreachable!("the checkpoint is given"),
            };
            s.handle_restore_report(t, generation, report);
        }
    }
}

/// No worker is dialled or set up while a restore runs: a setup handed out before it (at the
/// old positions) is discarded, and the worker is set up again at the restored positions once
/// the restore is over.
#[test]
fn a_worker_set_up_across_a_restore_is_set_up_again_at_the_restored_positions() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default())
        .with_workers(2)
        .with_servers(1);
    s.handle_configure(setup(&[("ids", 0)]));
    s.handle_reconnect_tick();
    drain(&mut s);
    s.handle_worker_dialled(t, 0, WorkerDial::Answered { incarnation: 1 });
    let (_, _, datasets, version) = set_up(&drain(&mut s)).unwrap();
    assert_eq!(datasets, vec![("ids".to_string(), 0)]);
    start_restore(&mut s, t);
    assert!(s.is_restoring());
    // Worker 1's dial, answered while the restore runs, sets nothing up.
    s.handle_worker_dialled(t, 1, WorkerDial::Answered { incarnation: 1 });
    assert_eq!(
        s.handle_worker_set_up(t, 0, 1, version, Ok(())),
        SetUpDisposition::Outdated
    );
    assert_eq!(s.worker_incarnation(0), None);
    s.handle_reconnect_tick();
    let during = finish_restore(&mut s);
    assert!(
        dials(&during).is_empty(),
        "no dial while restoring: {during:?}"
    );
    assert!(set_up(&during).is_none(), "{during:?}");
    assert!(during.iter().any(|a| matches!(
        a,
        SchedulerAction::RestoreFinished {
            result: Ok(Some(3)),
            ..
        }
    )));
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), vec![0, 1]);
    s.handle_worker_dialled(t, 0, WorkerDial::Answered { incarnation: 1 });
    let (_, _, datasets, version) = set_up(&drain(&mut s)).unwrap();
    assert_eq!(datasets, vec![("ids".to_string(), 7)]);
    assert_eq!(
        s.handle_worker_set_up(t, 0, 1, version, Ok(())),
        SetUpDisposition::Up
    );
    // A new configuration outdates a setup under way.
    s.handle_worker_dialled(t, 1, WorkerDial::Answered { incarnation: 1 });
    let (_, _, datasets, version) = set_up(&drain(&mut s)).unwrap();
    assert_eq!(datasets, vec![("ids".to_string(), 8)]);
    let ticket = s
        .handle_reconfigure(t, setup(&[("ids", 0), ("extra", 0)]))
        .unwrap();
    assert_eq!(
        s.handle_worker_set_up(t, 1, 1, version, Ok(())),
        SetUpDisposition::Outdated
    );
    assert_eq!(s.control_counters().setups_outdated, 2);
    // Worker 0, live, gets the new configuration at its restored positions.
    let actions = drain(&mut s);
    assert!(
        matches!(
            actions.as_slice(),
            [SchedulerAction::Reconfigure { ticket: k, worker: 0, incarnation: 1, setup }]
                if *k == ticket && setup.datasets == vec![("ids".to_string(), 7), ("extra".to_string(), 0)]
        ),
        "{actions:?}"
    );
}

/// A configuration reaches every live worker; the answer comes once each answered, with the
/// first refusal; a worker that refused or could not be reached is lost (fenced), and answers
/// from incarnations never asked, or given twice, change nothing.
#[test]
fn a_configuration_waits_for_every_live_worker_and_reports_the_first_refusal() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_workers(3);
    for worker in 0..3 {
        bring_up(&mut s, worker, 1);
    }
    let ticket = s.handle_reconfigure(t, setup(&[("missing", 0)])).unwrap();
    let asked: Vec<u32> = drain(&mut s)
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Reconfigure { worker, .. } => Some(*worker),
            _ => None,
        })
        .collect();
    assert_eq!(asked, vec![0, 1, 2]);
    s.handle_reconfigured(t, ticket, 0, 1, Ok(()));
    s.handle_reconfigured(t, ticket, 0, 1, Err(CallFault::Refused("late".into())));
    s.handle_reconfigured(
        t,
        ticket,
        1,
        7,
        Err(CallFault::Refused("never asked".into())),
    );
    assert!(
        drain(&mut s).is_empty(),
        "worker/1 and worker/2 have not answered"
    );
    assert_eq!(s.live_workers(), 3);
    s.handle_reconfigured(
        t,
        ticket,
        2,
        1,
        Err(CallFault::Unreachable("no reply".into())),
    );
    s.handle_reconfigured(
        t,
        ticket,
        1,
        1,
        Err(CallFault::Refused("no dataset function \"missing\"".into())),
    );
    let actions = drain(&mut s);
    assert_eq!(
        actions,
        vec![
            SchedulerAction::Fence {
                worker: 2,
                incarnation: 1
            },
            SchedulerAction::Fence {
                worker: 1,
                incarnation: 1
            },
            SchedulerAction::ConfigureFinished {
                ticket,
                result: Err(ConfigureError::Refused {
                    worker: 1,
                    reason: "no dataset function \"missing\"".into()
                }),
            },
        ]
    );
    assert_eq!(s.live_workers(), 1);
    // With no live worker the configuration is answered at once.
    let mut empty = Scheduler::new(SchedulerConfig::default()).with_workers(1);
    let ticket = empty.handle_reconfigure(t, setup(&[])).unwrap();
    assert_eq!(
        drain(&mut empty),
        vec![SchedulerAction::ConfigureFinished {
            ticket,
            result: Ok(())
        }]
    );
}

/// CKPT-1: a cut read in a restore generation that has ended since is refused; the cut state a
/// save compares before and after reading the servers names the generation and the holding.
#[test]
fn ckpt_1_a_cut_read_before_a_restore_is_refused() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_servers(1);
    let before = s.cut_state();
    assert_eq!(
        before,
        CutState {
            next_closure_id: 0,
            generation: 0,
            holding: false
        }
    );
    start_restore(&mut s, t);
    assert!(s.cut_state().holding);
    finish_restore(&mut s);
    assert_ne!(s.cut_state(), before);
    let err = s
        .handle_mark_cut(ClosureId(5), PathBuf::from("ckpt"), Some(before.generation))
        .unwrap_err();
    assert!(matches!(err, MarkCutError::RestoreSince { .. }), "{err}");
    let now = s.cut_state();
    s.handle_mark_cut(ClosureId(5), PathBuf::from("ckpt"), Some(now.generation))
        .unwrap();
    assert_eq!(s.ledger_state().next_closure_id, 5);
}

/// A worker that got a preemption notice leaves at once while the chief trains on: its
/// incarnation is fenced and its closure runs on another worker now (not after the failure
/// detector's budget); while the chief is stopping too, it stays (the chief's preemption
/// checkpoint needs it); an incarnation not live may go with nothing to do.
#[test]
fn a_worker_leaving_after_a_notice_hands_its_closure_back_unless_the_chief_stops_too() {
    use crate::roles::protocol::LeaveAnswer;
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default()).with_workers(2);
    s.handle_configure(setup(&[("ids", 0)]));
    bring_up(&mut s, 0, 1);
    s.handle_schedule(t, "step", Vec::new()).unwrap();
    let dispatched = drain(&mut s);
    assert!(
        matches!(
            dispatched.as_slice(),
            [SchedulerAction::Dispatch { worker: 0, .. }]
        ),
        "{dispatched:?}"
    );
    bring_up(&mut s, 1, 1);
    assert_eq!(s.handle_worker_leaving(t, 0, 1, true), LeaveAnswer::Stay);
    assert!(drain(&mut s).is_empty(), "staying changes nothing");
    assert_eq!(s.worker_incarnation(0), Some(1));
    assert_eq!(s.handle_worker_leaving(t, 0, 1, false), LeaveAnswer::Go);
    let actions = drain(&mut s);
    assert!(
        actions.contains(&SchedulerAction::Fence {
            worker: 0,
            incarnation: 1
        }),
        "{actions:?}"
    );
    let again = actions.iter().find_map(|a| match a {
        SchedulerAction::Dispatch {
            worker,
            closure,
            attempt,
            ..
        } => Some((*worker, *closure, *attempt)),
        _ => None,
    });
    assert_eq!(again, Some((1, ClosureId(0), 2)), "{actions:?}");
    assert_eq!(s.ledger().redispatched, 1);
    assert_eq!(s.control_counters().workers_left, 1);
    // Its old incarnation again, or one never seen: nothing more to do.
    assert_eq!(s.handle_worker_leaving(t, 0, 1, false), LeaveAnswer::Go);
    assert_eq!(s.handle_worker_leaving(t, 0, 9, false), LeaveAnswer::Go);
    assert!(!drain(&mut s).iter().any(|a| matches!(
        a,
        SchedulerAction::Fence { .. } | SchedulerAction::Dispatch { .. }
    )));
    assert_eq!(s.control_counters().workers_left, 1);
}
