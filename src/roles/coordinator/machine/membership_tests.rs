//! Tests of the elastic workers' decisions ([`super::membership`]): joining, draining, and
//! what each leaves of the ledger and the dataset positions.

use std::time::Instant;

use super::recovery::CallFault;
use super::*;
use crate::roles::protocol::{JoinRefusal, SetupWorker};

fn drain(s: &mut Scheduler) -> Vec<SchedulerAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

/// A scheduler over `spec` spec workers (allowing `max`), each up as incarnation 1.
fn cluster(spec: u32, max: u32) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig::default())
        .with_workers(spec)
        .with_workers_max(max);
    s.handle_configure(SetupWorker {
        num_workers: spec,
        layouts: Vec::new(),
        servers: Vec::new(),
        datasets: Vec::new(),
        version: 0,
        generation: 0,
    });
    let now = Instant::now();
    for w in 0..spec {
        s.handle_worker_up(now, w, 1);
    }
    drain(&mut s);
    s
}

fn dials(actions: &[SchedulerAction]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::DialWorker { worker } => Some(*worker),
            _ => None,
        })
        .collect()
}

/// Brings a dialled worker up through the ordinary dial and setup path.
fn set_up(s: &mut Scheduler, worker: u32, incarnation: u64) -> SetUpDisposition {
    let now = Instant::now();
    s.handle_worker_dialled(now, worker, WorkerDial::Answered { incarnation });
    let version = drain(s)
        .into_iter()
        .find_map(|a| match a {
            SchedulerAction::SetUpWorker {
                worker: w,
                version,
                setup,
                ..
            } if w == worker => {
                // Its datasets are built for its own pipeline of `workers_max`.
                assert_eq!(setup.num_workers, s.workers_max());
                Some(version)
            }
            _ => None,
        })
        .expect("a setup");
    s.handle_worker_set_up(now, worker, incarnation, version, Ok(()))
}

#[test]
fn a_worker_past_the_spec_joins_is_set_up_then_gets_work() {
    let mut s = cluster(2, 4);
    let now = Instant::now();
    assert_eq!(s.members(), [0, 1]);
    s.handle_worker_joining(now, 2, 7).unwrap();
    assert_eq!(s.members(), [0, 1, 2]);
    // Dialled at once, not at the next tick.
    assert_eq!(dials(&drain(&mut s)), [2]);
    // Joined but not set up yet: no work for it.
    for _ in 0..3 {
        s.handle_schedule(now, "f", Vec::new()).unwrap();
    }
    let before: Vec<u32> = drain(&mut s)
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch { worker, .. } => Some(*worker),
            _ => None,
        })
        .collect();
    assert_eq!(before, [0, 1]);
    assert_eq!(set_up(&mut s, 2, 7), SetUpDisposition::Up);
    let after: Vec<u32> = drain(&mut s)
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch { worker, .. } => Some(*worker),
            _ => None,
        })
        .collect();
    assert_eq!(
        after,
        [2],
        "the joiner takes the queued closure once set up"
    );
    // A second hello of the same incarnation changes nothing.
    s.handle_worker_joining(now, 2, 7).unwrap();
    assert!(dials(&drain(&mut s)).is_empty());
    assert_eq!(s.live_workers(), 3);
}

#[test]
fn a_join_past_workers_max_is_refused_and_changes_nothing() {
    let mut s = cluster(2, 3);
    let err = s.handle_worker_joining(Instant::now(), 3, 1).unwrap_err();
    assert_eq!(
        err,
        JoinRefusal::BeyondMax {
            worker: 3,
            workers_max: 3
        }
    );
    assert!(
        err.to_string().contains("at most 3 workers (workers_max)"),
        "{err}"
    );
    assert_eq!(s.members(), [0, 1]);
    assert!(drain(&mut s).is_empty());
    // workers_max is never below the spec's workers.
    let s = Scheduler::new(SchedulerConfig::default())
        .with_workers(3)
        .with_workers_max(1);
    assert_eq!(s.workers_max(), 3);
}

#[test]
fn ledger_1_a_drained_worker_finishes_its_closure_keeps_its_positions_and_leaves() {
    let mut s = cluster(2, 2);
    let now = Instant::now();
    let a = s.handle_schedule(now, "f", Vec::new()).unwrap();
    let b = s.handle_schedule(now, "f", Vec::new()).unwrap();
    let c = s.handle_schedule(now, "f", Vec::new()).unwrap();
    drain(&mut s);
    assert_eq!(
        s.handle_worker_draining(now, 1, 1),
        DrainDisposition::Pending
    );
    // Busy: nothing asked yet, and it gets no new work.
    assert!(drain(&mut s).is_empty());
    // Its closure finishes normally (not handed back: nothing runs twice).
    assert_eq!(
        s.handle_result(now, 1, 1, b, 1, Ok(vec![])),
        ResultDisposition::Committed
    );
    let actions = drain(&mut s);
    assert!(
        actions.contains(&SchedulerAction::AskDrainPositions {
            worker: 1,
            incarnation: 1
        }),
        "{actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, SchedulerAction::Dispatch { worker: 1, .. })),
        "a draining worker gets no new work: {actions:?}"
    );
    s.handle_drain_positions(now, 1, 1, Ok(vec![("train".into(), 42)]));
    let actions = drain(&mut s);
    assert!(actions.contains(&SchedulerAction::Fence {
        worker: 1,
        incarnation: 1
    }));
    assert!(actions.contains(&SchedulerAction::DrainFinished {
        worker: 1,
        incarnation: 1
    }));
    assert_eq!(s.members(), [0]);
    assert_eq!(s.live_workers(), 1);
    assert_eq!(s.positions()[&1]["train"], 42, "kept for its index");
    assert_eq!(s.setup_for(1).datasets, Vec::<(String, u64)>::new());
    // Not dialled again.
    s.handle_reconnect_tick();
    assert!(dials(&drain(&mut s)).is_empty());
    // The rest runs on worker 0; the ledger is whole, nothing re-dispatched.
    s.handle_result(now, 0, 1, a, 1, Ok(vec![]));
    let next = drain(&mut s).into_iter().find_map(|a| match a {
        SchedulerAction::Dispatch {
            worker, closure, ..
        } => Some((worker, closure)),
        _ => None,
    });
    assert_eq!(next, Some((0, c)));
    s.handle_result(now, 0, 1, c, 1, Ok(vec![]));
    let ledger = s.ledger();
    assert_eq!((ledger.scheduled, ledger.committed), (3, 3));
    assert_eq!(ledger.redispatched, 0);
    assert!(ledger.balances() && s.is_idle());
    // Joining again (a new incarnation) resumes at the kept positions.
    s.handle_worker_joining(now, 1, 2).unwrap();
    assert_eq!(dials(&drain(&mut s)), [1]);
    assert_eq!(set_up(&mut s, 1, 2), SetUpDisposition::Up);
    assert_eq!(s.members(), [0, 1]);
}

#[test]
fn a_drain_from_an_older_incarnation_leaves_the_newer_one_a_member() {
    let mut s = cluster(2, 2);
    let now = Instant::now();
    s.handle_worker_up(now, 1, 2);
    drain(&mut s);
    assert_eq!(s.handle_worker_draining(now, 1, 1), DrainDisposition::Done);
    assert!(s.is_member(1));
    assert_eq!(s.worker_incarnation(1), Some(2));
    assert!(drain(&mut s).is_empty());
}

#[test]
fn a_draining_worker_that_dies_is_a_lost_worker_and_its_drain_ends() {
    let mut s = cluster(2, 2);
    let now = Instant::now();
    let _a = s.handle_schedule(now, "f", Vec::new()).unwrap();
    let b = s.handle_schedule(now, "f", Vec::new()).unwrap();
    drain(&mut s);
    s.handle_worker_draining(now, 1, 1);
    s.handle_worker_lost(now, 1, 1);
    let actions = drain(&mut s);
    assert!(actions.contains(&SchedulerAction::DrainFinished {
        worker: 1,
        incarnation: 1
    }));
    assert_eq!(s.members(), [0]);
    assert_eq!(s.ledger().redispatched, 1);
    assert_eq!(s.state(b), Some(&ClosureState::Queued));
}

#[test]
fn a_drain_waits_for_a_running_restore_and_positions_read_across_one_are_asked_again() {
    let mut s = cluster(1, 2);
    let now = Instant::now();
    s.handle_worker_joining(now, 1, 5).unwrap();
    drain(&mut s);
    assert_eq!(set_up(&mut s, 1, 5), SetUpDisposition::Up);
    drain(&mut s);
    assert_eq!(
        s.handle_worker_draining(now, 1, 5),
        DrainDisposition::Pending
    );
    assert!(drain(&mut s).contains(&SchedulerAction::AskDrainPositions {
        worker: 1,
        incarnation: 5
    }));
    // A restore generation passed meanwhile (a parameter-server recovery rewound the
    // datasets): the answer is stale and the positions are asked for again.
    s.resume_generation(s.generation() + 1);
    s.handle_drain_positions(now, 1, 5, Ok(vec![("d".into(), 3)]));
    assert!(drain(&mut s).contains(&SchedulerAction::AskDrainPositions {
        worker: 1,
        incarnation: 5
    }));
    assert!(s.is_member(1));
    s.handle_drain_positions(now, 1, 5, Err(CallFault::Unreachable("gone".into())));
    assert!(drain(&mut s).contains(&SchedulerAction::DrainFinished {
        worker: 1,
        incarnation: 5
    }));
    assert!(!s.is_member(1));
    assert!(
        !s.positions().contains_key(&1),
        "no answer: its last setup's positions stay"
    );
}

#[test]
fn a_drain_of_an_incarnation_not_live_is_done_at_once_and_its_setup_does_not_bring_it_up() {
    let mut s = cluster(1, 2);
    let now = Instant::now();
    s.handle_worker_joining(now, 1, 5).unwrap();
    drain(&mut s);
    s.handle_worker_dialled(now, 1, WorkerDial::Answered { incarnation: 5 });
    let version = s.setup_version();
    drain(&mut s);
    assert_eq!(s.handle_worker_draining(now, 1, 5), DrainDisposition::Done);
    assert_eq!(
        s.handle_worker_set_up(now, 1, 5, version, Ok(())),
        SetUpDisposition::Outdated
    );
    assert_eq!(s.live_workers(), 1);
    assert_eq!(s.members(), [0]);
}

#[test]
fn a_new_incarnation_that_joins_while_the_old_one_drains_stays_a_member() {
    let mut s = cluster(2, 2);
    let now = Instant::now();
    assert_eq!(
        s.handle_worker_draining(now, 1, 1),
        DrainDisposition::Pending
    );
    assert!(drain(&mut s).contains(&SchedulerAction::AskDrainPositions {
        worker: 1,
        incarnation: 1
    }));
    s.handle_worker_joining(now, 1, 2).unwrap();
    s.handle_drain_positions(now, 1, 1, Ok(vec![]));
    assert!(drain(&mut s).contains(&SchedulerAction::DrainFinished {
        worker: 1,
        incarnation: 1
    }));
    assert!(s.is_member(1), "the newer incarnation joined");
    s.handle_reconnect_tick();
    assert_eq!(dials(&drain(&mut s)), [1]);
    assert_eq!(set_up(&mut s, 1, 2), SetUpDisposition::Up);
}

/// LEDGER-1 over random orders of joins, drains, results, losses and dial outcomes: the
/// ledger balances, a draining or non-member worker never gets work, its positions are asked
/// only once it runs nothing, a drained worker is dialled again only after it joined again,
/// and once the faults stop every closure finishes.
#[test]
fn ledger_1_holds_over_random_joins_and_drains() {
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeMap, BTreeSet};
    const MAX: u32 = 4;
    for seed in 0..300u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let t = Instant::now();
        let mut s = cluster(2, MAX);
        let mut incarnations = [1u64; 6];
        let mut in_flight: Vec<(u32, u64, ClosureId, u32)> = Vec::new();
        // Workers whose drain is under way (the incarnation drained), asked for positions.
        let mut draining: BTreeMap<u32, u64> = BTreeMap::new();
        let mut asked: BTreeSet<(u32, u64)> = BTreeSet::new();
        let mut dialled: Vec<u32> = Vec::new();
        let mut setups: Vec<(u32, u64, u64)> = Vec::new();
        for step in 0..400 {
            let faults = step < 300;
            match rng.gen_range(0..9) {
                0 | 1 if faults || s.next_closure_id() < 50 => {
                    let _ = s.handle_schedule(t, "f", vec![]);
                }
                2 if faults => {
                    let w = rng.gen_range(0..MAX + 2);
                    incarnations[w as usize] += u64::from(rng.gen_bool(0.5));
                    let joined = s.handle_worker_joining(t, w, incarnations[w as usize]);
                    assert_eq!(joined.is_err(), w >= MAX, "seed {seed}");
                }
                3 if faults => {
                    let w = rng.gen_range(0..MAX);
                    if let Some(incarnation) = s.worker_incarnation(w) {
                        if s.handle_worker_draining(t, w, incarnation) == DrainDisposition::Pending
                        {
                            draining.insert(w, incarnation);
                        }
                    }
                }
                4 if faults => {
                    let w = rng.gen_range(0..MAX);
                    if let Some(incarnation) = s.worker_incarnation(w) {
                        s.handle_worker_lost(t, w, incarnation);
                    }
                }
                5 if !dialled.is_empty() => {
                    let w = dialled.swap_remove(rng.gen_range(0..dialled.len()));
                    incarnations[w as usize] += u64::from(rng.gen_bool(0.3));
                    let dial = if rng.gen_bool(0.85) || !faults {
                        WorkerDial::Answered {
                            incarnation: incarnations[w as usize],
                        }
                    } else {
                        WorkerDial::Unreachable
                    };
                    s.handle_worker_dialled(t, w, dial);
                }
                6 if !setups.is_empty() => {
                    let (w, e, v) = setups.swap_remove(rng.gen_range(0..setups.len()));
                    s.handle_worker_set_up(t, w, e, v, Ok(()));
                }
                7 if !asked.is_empty() => {
                    let (w, e) = *asked.iter().next().expect("not empty");
                    asked.remove(&(w, e));
                    let answer = if rng.gen_bool(0.8) {
                        Ok(vec![("d".to_string(), step)])
                    } else {
                        Err(CallFault::Unreachable("gone".into()))
                    };
                    s.handle_drain_positions(t, w, e, answer);
                }
                8 if faults && rng.gen_bool(0.3) => s.handle_reconnect_tick(),
                _ if !in_flight.is_empty() => {
                    let (w, e, c, a) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    s.handle_result(t, w, e, c, a, Ok(vec![]));
                }
                _ => s.handle_reconnect_tick(),
            }
            while let Some(action) = s.poll_action() {
                match action {
                    SchedulerAction::Dispatch {
                        worker,
                        incarnation,
                        closure,
                        attempt,
                        ..
                    } => {
                        assert!(s.is_member(worker), "seed {seed}: work for a non-member");
                        assert!(
                            !draining.contains_key(&worker),
                            "seed {seed}: work for draining worker/{worker}"
                        );
                        in_flight.push((worker, incarnation, closure, attempt));
                    }
                    SchedulerAction::AskDrainPositions {
                        worker,
                        incarnation,
                    } => {
                        assert!(
                            !in_flight
                                .iter()
                                .any(|(w, e, ..)| (*w, *e) == (worker, incarnation)),
                            "seed {seed}: positions asked while worker/{worker} runs a closure"
                        );
                        asked.insert((worker, incarnation));
                    }
                    SchedulerAction::DrainFinished {
                        worker,
                        incarnation,
                    } => {
                        assert_eq!(draining.remove(&worker), Some(incarnation), "seed {seed}");
                        asked.remove(&(worker, incarnation));
                    }
                    SchedulerAction::DialWorker { worker } => {
                        assert!(s.is_member(worker), "seed {seed}: dialled non-member");
                        dialled.push(worker);
                    }
                    SchedulerAction::SetUpWorker {
                        worker,
                        incarnation,
                        version,
                        ..
                    } => setups.push((worker, incarnation, version)),
                    _ => {}
                }
            }
            // Results of fenced incarnations are refused: drop them, as a real worker's
            // call would fail or be refused.
            in_flight.retain(|(w, e, ..)| s.worker_incarnation(*w) == Some(*e));
            assert!(s.ledger().balances(), "seed {seed}: {:?}", s.ledger());
        }
        // Quiet: a member comes up, and everything still pending finishes.
        for _ in 0..2_000 {
            if s.is_idle() {
                break;
            }
            s.handle_reconnect_tick();
            if let Some(w) = dialled.pop() {
                incarnations[w as usize] += 1;
                s.handle_worker_dialled(
                    t,
                    w,
                    WorkerDial::Answered {
                        incarnation: incarnations[w as usize],
                    },
                );
            } else if let Some((w, e, v)) = setups.pop() {
                s.handle_worker_set_up(t, w, e, v, Ok(()));
            } else if let Some((w, e)) = asked.pop_first() {
                s.handle_drain_positions(t, w, e, Ok(vec![]));
            } else if let Some((w, e, c, a)) = in_flight.pop() {
                s.handle_result(t, w, e, c, a, Ok(vec![]));
            } else if s.members().is_empty() {
                s.handle_worker_joining(t, 0, incarnations[0] + 1).unwrap();
            }
            while let Some(action) = s.poll_action() {
                match action {
                    SchedulerAction::Dispatch {
                        worker,
                        incarnation,
                        closure,
                        attempt,
                        ..
                    } => in_flight.push((worker, incarnation, closure, attempt)),
                    SchedulerAction::AskDrainPositions {
                        worker,
                        incarnation,
                    } => {
                        asked.insert((worker, incarnation));
                    }
                    SchedulerAction::DialWorker { worker } => dialled.push(worker),
                    SchedulerAction::SetUpWorker {
                        worker,
                        incarnation,
                        version,
                        ..
                    } => setups.push((worker, incarnation, version)),
                    _ => {}
                }
            }
            in_flight.retain(|(w, e, ..)| s.worker_incarnation(*w) == Some(*e));
        }
        assert!(s.is_idle(), "seed {seed}: {:?}", s.ledger());
        let ledger = s.ledger();
        assert_eq!(
            ledger.scheduled,
            ledger.committed + ledger.unavailable,
            "seed {seed}: {ledger:?}"
        );
    }
}
