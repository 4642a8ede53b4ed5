//! The scheduler's own tests: dispatch, LEDGER-1 over random orders of events, retention,
//! the low watermark and marked cuts (each sub-machine's tests sit beside it).

use super::*;

fn root() -> PathBuf {
    PathBuf::from("checkpoints")
}

fn drain(s: &mut Scheduler) -> Vec<SchedulerAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

/// The cuts of the restores asked for, in order (any other action is dropped).
fn restores(actions: &[SchedulerAction]) -> Vec<ClosureId> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Restore(RestoreCall::Load { cut, .. }) => Some(*cut),
            _ => None,
        })
        .collect()
}

fn dispatched(actions: &[SchedulerAction]) -> Vec<(u32, ClosureId, u32)> {
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

#[test]
fn one_closure_in_flight_per_worker_and_free_worker_takes_next() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    s.handle_worker_up(t, 1, 1);
    let ids: Vec<_> = (0..3)
        .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
        .collect();
    assert_eq!(
        dispatched(&drain(&mut s)),
        vec![(0, ids[0], 1), (1, ids[1], 1)]
    );
    assert_eq!(
        s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![7])),
        ResultDisposition::Committed
    );
    assert_eq!(dispatched(&drain(&mut s)), vec![(1, ids[2], 1)]);
    assert!(s.ledger().balances());
}

#[test]
fn ledger_1_lost_worker_closure_is_redispatched_and_stale_result_rejected() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    let id = s.handle_schedule(t, "step", vec![1]).unwrap();
    drain(&mut s);
    s.handle_worker_lost(t, 0, 1);
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::Fence {
            worker: 0,
            incarnation: 1
        }]
    );
    assert_eq!(s.state(id), Some(&ClosureState::Queued));
    s.handle_worker_up(t, 1, 1);
    assert_eq!(dispatched(&drain(&mut s)), vec![(1, id, 2)]);
    // FENCE-1: the old incarnation's late result changes nothing.
    assert_eq!(
        s.handle_result(t, 0, 1, id, 1, Ok(vec![])),
        ResultDisposition::RejectedStale
    );
    assert_eq!(
        s.handle_result(t, 1, 1, id, 2, Ok(vec![9])),
        ResultDisposition::Committed
    );
    let l = s.ledger();
    assert_eq!(
        (l.scheduled, l.committed, l.redispatched, l.rejected_stale),
        (1, 1, 1, 1)
    );
    assert!(l.balances() && s.is_idle());
}

#[test]
fn restarted_worker_supersedes_its_old_incarnation() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    let id = s.handle_schedule(t, "step", vec![]).unwrap();
    drain(&mut s);
    s.handle_worker_up(t, 0, 2);
    let actions = drain(&mut s);
    assert_eq!(
        actions[0],
        SchedulerAction::Fence {
            worker: 0,
            incarnation: 1
        }
    );
    assert_eq!(dispatched(&actions), vec![(0, id, 2)]);
    // An older incarnation announcing itself later is ignored.
    s.handle_worker_up(t, 0, 1);
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.worker_incarnation(0), Some(2));
    // FENCE-1: a lost incarnation that wakes up (SIGCONT) is not taken back.
    s.handle_worker_lost(t, 0, 2);
    drain(&mut s);
    s.handle_worker_up(t, 0, 2);
    assert_eq!(s.worker_incarnation(0), None);
}

#[test]
fn error_surfaces_once_cancels_queued_and_scheduler_stays_usable() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    let a = s.handle_schedule(t, "step", vec![]).unwrap();
    let b = s.handle_schedule(t, "step", vec![]).unwrap();
    drain(&mut s);
    let bad_input = Err(ClosureOutcomeError::Step("bad input".into()));
    assert_eq!(
        s.handle_result(t, 0, 1, a, 1, bad_input),
        ResultDisposition::Failed
    );
    assert_eq!(
        s.state(b),
        Some(&ClosureState::Failed(ClosureFailure::Cancelled(b)))
    );
    assert!(s.is_idle());
    let err = s.take_error().unwrap();
    assert!(err.to_string().contains("bad input"), "{err}");
    assert_eq!(s.take_error(), None);
    let c = s.handle_schedule(t, "step", vec![]).unwrap();
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, c, 1)]);
    assert_eq!(
        s.handle_result(t, 0, 1, c, 1, Ok(vec![])),
        ResultDisposition::Committed
    );
    assert!(s.ledger().balances());
    assert_eq!(s.ledger().cancelled, 1);
}

#[test]
fn all_workers_lost_waits_within_bound_then_resumes_or_fails() {
    let t = Instant::now();
    let bound = Duration::from_secs(10);
    let mut s = Scheduler::new(SchedulerConfig {
        no_worker_wait_max: bound,
        ..Default::default()
    });
    s.handle_worker_up(t, 0, 1);
    let a = s.handle_schedule(t, "step", vec![]).unwrap();
    drain(&mut s);
    s.handle_worker_lost(t, 0, 1);
    assert_eq!(s.poll_timeout(), Some(t + bound));
    // Before the bound nothing fails; the worker returns and the closure runs again.
    s.handle_timeout(t + bound / 2);
    assert!(!s.is_idle());
    s.handle_worker_up(t + bound / 2, 0, 2);
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, a, 2)]);
    // Lost again and never back: past the bound the work fails as unavailable.
    s.handle_worker_lost(t + bound, 0, 2);
    s.handle_timeout(t + bound + bound);
    assert!(s.is_idle());
    assert!(matches!(
        s.take_error(),
        Some(ClosureFailure::Unavailable { .. })
    ));
    assert!(s.ledger().balances());
}

#[test]
fn finished_closures_are_retained_up_to_the_bound() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        finished_retained_max: 2,
        ..Default::default()
    });
    s.handle_worker_up(t, 0, 1);
    let ids: Vec<_> = (0..3)
        .map(|_| {
            let id = s.handle_schedule(t, "f", vec![]).unwrap();
            drain(&mut s);
            s.handle_result(t, 0, 1, id, 1, Ok(vec![1]));
            id
        })
        .collect();
    assert!(s.is_forgotten(ids[0]) && s.state(ids[0]).is_none());
    assert_eq!(s.state(ids[2]), Some(&ClosureState::Committed(vec![1])));
    assert!(!s.is_forgotten(ClosureId(99)));
    assert_eq!(s.ledger().committed, 3);
}

#[test]
fn a_resumed_ledger_carries_on_counts_and_ids() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    let earlier = Ledger {
        scheduled: 10,
        committed: 9,
        cancelled: 1,
        ..Default::default()
    };
    s.resume(earlier, 10).unwrap();
    s.handle_worker_up(t, 0, 1);
    let id = s.handle_schedule(t, "f", vec![]).unwrap();
    assert_eq!(id, ClosureId(10));
    drain(&mut s);
    s.handle_result(t, 0, 1, id, 1, Ok(vec![]));
    assert_eq!((s.ledger().scheduled, s.ledger().committed), (11, 10));
    assert!(s.ledger().balances());
    assert_eq!(
        s.resume(Ledger::default(), 0),
        Err(StartFailure::AfterScheduling),
        "only before scheduling"
    );
    let unbalanced = Ledger {
        scheduled: 3,
        ..Default::default()
    };
    assert!(matches!(
        Scheduler::new(SchedulerConfig::default()).resume(unbalanced, 3),
        Err(StartFailure::LedgerUnbalanced(_))
    ));
}

#[test]
fn attempts_are_bounded() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        attempts_max: 2,
        ..Default::default()
    });
    let id = s.handle_schedule(t, "step", vec![]).unwrap();
    for incarnation in 1..=3 {
        s.handle_worker_up(t, 0, incarnation);
        s.handle_worker_lost(t, 0, incarnation);
    }
    assert!(matches!(
        s.state(id),
        Some(ClosureState::Failed(ClosureFailure::Unavailable { .. }))
    ));
    assert!(s.ledger().balances());
}

#[test]
fn ledger_1_holds_over_random_event_orders() {
    use rand::{Rng, SeedableRng};
    for seed in 0..300u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let t = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig {
            attempts_max: 4,
            ..Default::default()
        });
        let mut incarnations = [0u64; 3];
        let mut ps_incarnations = [1u64; 2];
        for (ps, incarnation) in ps_incarnations.iter().enumerate() {
            s.handle_ps_up(t, ps as u32, *incarnation);
        }
        let mut in_flight: Vec<(u32, u64, ClosureId, u32)> = Vec::new();
        let mut last_attempt: BTreeMap<ClosureId, u32> = BTreeMap::new();
        for _ in 0..200 {
            match rng.gen_range(0..10) {
                // Parameter servers: lost, back (maybe as a new incarnation), a restore
                // answered, a checkpoint cut, a reported unavailability, the hold's bound.
                6 => {
                    let ps = rng.gen_range(0..2);
                    if rng.gen_bool(0.4) {
                        s.handle_ps_lost(t, ps as u32, ps_incarnations[ps]);
                    } else if rng.gen_bool(0.5) {
                        ps_incarnations[ps] += u64::from(rng.gen_bool(0.5));
                        s.handle_ps_up(t, ps as u32, ps_incarnations[ps]);
                    } else {
                        ps_incarnations[ps] += u64::from(rng.gen_bool(0.3));
                        let serving = rng.gen_bool(0.8);
                        s.handle_ps_answered(t, ps as u32, ps_incarnations[ps], serving);
                    }
                }
                7 => {
                    if let Some(cut) = s.cut() {
                        if rng.gen_bool(0.7) {
                            let _ = s.handle_restored(t, cut);
                        } else if rng.gen_bool(0.5) {
                            let ps = rng.gen_range(0..2);
                            s.handle_restore_interrupted(t, Some(ps), "lost".into());
                        } else {
                            s.handle_restore_failed(t, "disk".into());
                        }
                    }
                }
                8 => {
                    let _ = s.mark_cut(s.low_watermark(), root());
                }
                9 if !in_flight.is_empty() => {
                    let (w, e, c, a) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    s.handle_ps_unavailable(t, w, e, c, a, rng.gen_range(0..2));
                }
                _ if rng.gen_bool(0.02) => {
                    s.handle_timeout(t + Duration::from_secs(3600));
                }
                0 => {
                    let _ = s.handle_schedule(t, "f", vec![]);
                }
                1 => {
                    let w = rng.gen_range(0..3);
                    incarnations[w] += 1;
                    s.handle_worker_up(t, w as u32, incarnations[w]);
                }
                2 => {
                    let w = rng.gen_range(0..3);
                    s.handle_worker_lost(t, w as u32, incarnations[w]);
                }
                _ if !in_flight.is_empty() => {
                    let (w, e, c, a) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    if rng.gen_bool(0.05) {
                        s.handle_refused(t, w, e, c, a);
                    } else {
                        let outcome = if rng.gen_bool(0.05) {
                            Err(ClosureOutcomeError::Step("boom".into()))
                        } else {
                            Ok(vec![])
                        };
                        s.handle_result(t, w, e, c, a, outcome);
                    }
                }
                _ => {}
            }
            // Below the low watermark every closure is finished for good, and while a
            // recovery holds dispatch it never passes the cut (LEDGER-1).
            let watermark = s.low_watermark();
            assert!(watermark.0 <= s.next_closure_id(), "seed {seed}");
            if let (true, Some(cut)) = (s.is_holding(), s.cut()) {
                assert!(watermark <= cut, "seed {seed}: watermark above the cut");
            }
            for id in 0..watermark.0 {
                assert!(
                    matches!(
                        s.state(ClosureId(id)),
                        None | Some(ClosureState::Committed(_) | ClosureState::Failed(_))
                    ),
                    "seed {seed}: closure {id} below the watermark {watermark:?} is unfinished"
                );
            }
            while let Some(a) = s.poll_action() {
                if let SchedulerAction::Dispatch {
                    worker,
                    incarnation,
                    closure,
                    attempt,
                    generation,
                    ..
                } = a
                {
                    assert_eq!(generation, s.generation(), "seed {seed}");
                    // Attempt numbers never restart, even across a rollback.
                    let last = last_attempt.insert(closure, attempt).unwrap_or(0);
                    assert!(attempt > last, "seed {seed}: closure {closure:?} attempt");
                    in_flight.push((worker, incarnation, closure, attempt));
                }
            }
            assert!(s.ledger().balances(), "seed {seed}: {:?}", s.ledger());
            // Nothing is dispatched while dispatch is held.
            if s.is_holding() {
                assert!(s.poll_action().is_none(), "seed {seed}");
            }
        }
    }
}

#[test]
fn ledger_1_a_worker_refusal_redispatches_the_closure_and_fences_the_incarnation() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    s.handle_worker_up(t, 1, 1);
    let ids: Vec<_> = (0..3)
        .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
        .collect();
    assert_eq!(
        dispatched(&drain(&mut s)),
        vec![(0, ids[0], 1), (1, ids[1], 1)]
    );
    // Worker 0 could not take the closure: the worker's failure, not the closure's.
    assert_eq!(
        s.handle_refused(t, 0, 1, ids[0], 1),
        ResultDisposition::WorkerLost
    );
    assert_eq!(
        drain(&mut s),
        vec![SchedulerAction::Fence {
            worker: 0,
            incarnation: 1
        }]
    );
    assert_eq!(s.state(ids[0]), Some(&ClosureState::Queued));
    assert_eq!(s.worker_incarnation(0), None);
    assert_eq!(s.take_error(), None, "a refusal is not the closure's error");
    // FENCE-1: the fenced incarnation's late refusal or result changes nothing.
    assert_eq!(
        s.handle_refused(t, 0, 1, ids[0], 1),
        ResultDisposition::RejectedStale
    );
    // The refused closure runs next, ahead of what was queued after it.
    assert_eq!(
        s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![])),
        ResultDisposition::Committed
    );
    assert_eq!(dispatched(&drain(&mut s)), vec![(1, ids[0], 2)]);
    // The worker's next incarnation takes work again.
    s.handle_worker_up(t, 0, 2);
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[2], 1)]);
    s.handle_result(t, 1, 1, ids[0], 2, Ok(vec![]));
    s.handle_result(t, 0, 2, ids[2], 1, Ok(vec![]));
    let l = s.ledger();
    assert_eq!(
        (
            l.scheduled,
            l.committed,
            l.failed,
            l.cancelled,
            l.redispatched
        ),
        (3, 3, 0, 0, 1)
    );
    assert!(l.balances() && s.is_idle());
}

#[test]
fn low_watermark_is_the_oldest_unfinished_closure() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    assert_eq!(s.low_watermark(), ClosureId(0));
    s.handle_worker_up(t, 0, 1);
    s.handle_worker_up(t, 1, 1);
    let ids: Vec<_> = (0..3)
        .map(|_| s.handle_schedule(t, "step", vec![]).unwrap())
        .collect();
    drain(&mut s);
    s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![]));
    drain(&mut s);
    // Closure 1 finished, but 0 has not: nothing below 0 is known finished.
    assert_eq!(s.low_watermark(), ids[0]);
    s.handle_result(t, 0, 1, ids[0], 1, Ok(vec![]));
    assert_eq!(s.low_watermark(), ids[2]);
    // A closure waiting to be re-dispatched is unfinished.
    s.handle_worker_lost(t, 0, 1);
    s.handle_worker_lost(t, 1, 1);
    assert_eq!(s.state(ids[2]), Some(&ClosureState::Queued));
    assert_eq!(s.low_watermark(), ids[2]);
    s.handle_worker_up(t, 0, 2);
    drain(&mut s);
    s.handle_result(t, 0, 2, ids[2], 2, Ok(vec![]));
    // Everything finished: the next id to be scheduled.
    assert_eq!(s.low_watermark(), ClosureId(3));
    // A resumed scheduler starts at the ids it resumes from.
    let mut resumed = Scheduler::new(SchedulerConfig::default());
    let earlier = Ledger {
        scheduled: 10,
        committed: 10,
        ..Default::default()
    };
    resumed.resume(earlier, 10).unwrap();
    assert_eq!(resumed.low_watermark(), ClosureId(10));
}

/// A scheduler with workers 0 and 1 and parameter servers 0 and 1 (incarnation 1 each), a cut
/// taken after `before` committed closures, then `after` more scheduled.
fn with_cut(before: usize, after: usize) -> (Scheduler, Vec<ClosureId>) {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    s.handle_worker_up(t, 1, 1);
    s.handle_ps_up(t, 0, 1);
    s.handle_ps_up(t, 1, 1);
    let mut ids = Vec::new();
    for _ in 0..before {
        let id = s.handle_schedule(t, "step", vec![ids.len() as u8]).unwrap();
        run_all(&mut s);
        ids.push(id);
    }
    s.mark_cut(ClosureId(s.next_closure_id()), root()).unwrap();
    for _ in 0..after {
        ids.push(s.handle_schedule(t, "step", vec![ids.len() as u8]).unwrap());
    }
    (s, ids)
}

/// Commits everything dispatched so far.
/// Answers every dispatch drained from `s` as committed.
pub(super) fn run_all(s: &mut Scheduler) {
    let t = Instant::now();
    for a in drain(s) {
        if let SchedulerAction::Dispatch {
            worker,
            incarnation,
            closure,
            attempt,
            ..
        } = a
        {
            s.handle_result(t, worker, incarnation, closure, attempt, Ok(vec![]));
        }
    }
}

#[test]
fn ledger_1_ps_lost_holds_dispatch_lets_in_flight_finish_then_restores_and_requeues() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(2, 4);
    let actions = drain(&mut s);
    assert_eq!(dispatched(&actions), vec![(0, ids[2], 1), (1, ids[3], 1)]);
    s.handle_result(t, 0, 1, ids[2], 1, Ok(vec![]));
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[4], 1)]);
    // ps/1 is declared dead: hold.
    s.handle_ps_lost(t, 1, 1);
    assert!(s.is_holding());
    assert_eq!(s.ps_down(), vec![1]);
    // In flight: ids[3] commits (its effect is rolled back later); ids[4] could not reach
    // the server: queued again, counted as re-dispatched; nothing goes out.
    s.handle_result(t, 1, 1, ids[3], 1, Ok(vec![]));
    assert_eq!(
        s.handle_ps_unavailable(t, 0, 1, ids[4], 1, 1),
        ResultDisposition::PsUnavailable
    );
    assert!(drain(&mut s).is_empty(), "dispatch is held");
    assert_eq!(s.state(ids[4]), Some(&ClosureState::Queued));
    // The dead incarnation cannot come back (FENCE-1); the new one does.
    s.handle_ps_up(t, 1, 1);
    assert!(drain(&mut s).is_empty());
    s.handle_ps_up(t, 1, 2);
    let cut = ids[2];
    assert_eq!(restores(&drain(&mut s)), vec![cut]);
    assert!(s.is_holding());
    // Restored: the closures committed since the cut run again, lowest first.
    assert_eq!(s.handle_restored(t, cut), Ok(2));
    assert!(s.handle_restored(t, cut).is_err(), "only once");
    assert_eq!(
        dispatched(&drain(&mut s)),
        vec![(0, ids[2], 2), (1, ids[3], 2)]
    );
    assert_eq!(s.low_watermark(), ids[2]);
    let l = s.ledger().clone();
    assert_eq!(
        (l.committed, l.rolled_back, l.redispatched, l.ps_restores),
        (2, 2, 1, 1)
    );
    assert!(l.balances());
    s.handle_result(t, 0, 1, ids[2], 2, Ok(vec![]));
    s.handle_result(t, 1, 1, ids[3], 2, Ok(vec![]));
    for _ in 0..4 {
        run_all(&mut s);
    }
    assert!(s.is_idle() && s.take_error().is_none());
    let l = s.ledger();
    assert_eq!((l.scheduled, l.committed), (6, 6));
    assert!(l.balances());
}

#[test]
fn a_ps_back_as_a_new_incarnation_unnoticed_is_a_loss_too() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(1, 1);
    drain(&mut s);
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    // No death was declared, but ps/0 answers as a newer incarnation: its state is gone.
    s.handle_ps_up(t, 0, 5);
    assert_eq!(restores(&drain(&mut s)), vec![ids[1]]);
    assert_eq!(s.handle_restored(t, ids[1]), Ok(1));
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[1], 2)]);
}

/// The learning rate each dispatch carries, by closure, in order.
fn dispatched_rates(actions: &[SchedulerAction]) -> Vec<(ClosureId, Option<f32>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch {
                closure,
                learning_rate,
                ..
            } => Some((*closure, learning_rate.map(LearningRate::get))),
            _ => None,
        })
        .collect()
}

/// A rate is stamped on the closures scheduled after it is set and stays theirs: on a
/// retry after their worker is lost and on a run again after a restore, whatever the rate
/// in force by then.
#[test]
fn a_closure_keeps_the_learning_rate_it_was_scheduled_with_through_retries_and_restores() {
    let t = Instant::now();
    let (mut s, mut ids) = with_cut(1, 1);
    s.handle_set_learning_rate(LearningRate::new(0.5));
    ids.push(s.handle_schedule(t, "step", vec![]).unwrap());
    s.handle_set_learning_rate(LearningRate::new(0.0));
    ids.push(s.handle_schedule(t, "step", vec![]).unwrap());
    assert_eq!(
        dispatched_rates(&drain(&mut s)),
        vec![(ids[1], None), (ids[2], Some(0.5))]
    );
    // worker/1 dies with ids[2] in flight: its retry keeps 0.5, not the 0 now in force.
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    assert_eq!(dispatched_rates(&drain(&mut s)), vec![(ids[3], Some(0.0))]);
    s.handle_worker_lost(t, 1, 1);
    s.handle_result(t, 0, 1, ids[3], 1, Ok(vec![]));
    assert_eq!(dispatched_rates(&drain(&mut s)), vec![(ids[2], Some(0.5))]);
    s.handle_result(t, 0, 1, ids[2], 2, Ok(vec![]));
    // ps/0 is lost: everything since the cut runs again, each at its own rate.
    s.handle_set_learning_rate(LearningRate::new(0.25));
    s.handle_ps_lost(t, 0, 1);
    s.handle_ps_up(t, 0, 2);
    assert_eq!(restores(&drain(&mut s)), vec![ids[1]]);
    assert_eq!(s.handle_restored(t, ids[1]), Ok(3));
    let mut again = Vec::new();
    run_all_rates(&mut s, &mut again);
    again.sort_by_key(|(id, _)| *id);
    assert_eq!(
        again,
        vec![(ids[1], None), (ids[2], Some(0.5)), (ids[3], Some(0.0))]
    );
    assert!(s.is_idle() && s.take_error().is_none());
}

/// Commits every dispatch until `s` is idle, adding the rates dispatched to `seen`.
fn run_all_rates(s: &mut Scheduler, seen: &mut Vec<(ClosureId, Option<f32>)>) {
    let t = Instant::now();
    for _ in 0..8 {
        for a in drain(s) {
            if let SchedulerAction::Dispatch {
                worker,
                incarnation,
                closure,
                attempt,
                learning_rate,
                ..
            } = a
            {
                seen.push((closure, learning_rate.map(LearningRate::get)));
                s.handle_result(t, worker, incarnation, closure, attempt, Ok(vec![]));
            }
        }
    }
}

#[test]
fn a_worker_reported_ps_unavailability_that_was_transient_resumes_without_restore() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(0, 2);
    drain(&mut s);
    s.handle_ps_unavailable(t, 0, 1, ids[0], 1, 0);
    assert_eq!(s.ps_down(), vec![0]);
    s.handle_result(t, 1, 1, ids[1], 1, Ok(vec![]));
    assert!(drain(&mut s).is_empty(), "held until ps/0 answers");
    // The same incarnation answers: nothing was lost; PS-1 dedupes a partial push.
    s.handle_ps_up(t, 0, 1);
    assert!(!s.is_holding());
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[0], 2)]);
    assert_eq!(s.ledger().ps_restores, 0);
}

#[test]
fn ps_lost_without_a_checkpoint_fails_join_naming_the_server_and_stays_usable() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    s.handle_ps_up(t, 0, 1);
    s.handle_ps_up(t, 1, 1);
    let a = s.handle_schedule(t, "step", vec![]).unwrap();
    let b = s.handle_schedule(t, "step", vec![]).unwrap();
    drain(&mut s);
    s.handle_ps_lost(t, 1, 1);
    assert!(
        !s.is_holding(),
        "nothing to wait for: it cannot be recovered"
    );
    assert!(matches!(
        s.state(b),
        Some(ClosureState::Failed(ClosureFailure::Unavailable { .. }))
    ));
    // The closure in flight fails for the server: unavailable, not run again.
    assert_eq!(
        s.handle_ps_unavailable(t, 0, 1, a, 1, 1),
        ResultDisposition::Failed
    );
    assert!(s.is_idle());
    let err = s.take_error().unwrap().to_string();
    assert!(err.contains("ps/1") && err.contains("checkpoint"), "{err}");
    assert!(s.ledger().balances());
    // Usable: later work runs.
    let c = s.handle_schedule(t, "step", vec![]).unwrap();
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, c, 1)]);
}

#[test]
fn a_ps_not_back_within_the_bound_fails_join_and_never_hangs() {
    let t = Instant::now();
    let bound = Duration::from_secs(30);
    let (mut s, ids) = with_cut(1, 1);
    s.config.ps_restart_wait_max = bound;
    drain(&mut s);
    s.handle_ps_lost(t, 0, 1);
    assert_eq!(s.poll_timeout(), Some(t + bound));
    s.handle_timeout(t + bound / 2);
    assert!(s.is_holding());
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    let late = s.handle_schedule(t, "step", vec![]).unwrap();
    s.handle_timeout(t + bound);
    assert!(!s.is_holding() && s.is_idle());
    assert!(matches!(
        s.state(late),
        Some(ClosureState::Failed(ClosureFailure::Unavailable { .. }))
    ));
    let err = s.take_error().unwrap().to_string();
    assert!(err.contains("ps/0") && err.contains("within"), "{err}");
    assert!(s.ledger().balances());
}

#[test]
fn a_failed_restore_or_an_overflowed_retention_fails_join() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(0, 1);
    drain(&mut s);
    s.handle_ps_lost(t, 0, 1);
    s.handle_result(t, 0, 1, ids[0], 1, Ok(vec![]));
    s.handle_ps_up(t, 0, 2);
    assert_eq!(restores(&drain(&mut s)), vec![ids[0]]);
    s.handle_restore_failed(t, "no valid checkpoint".into());
    let err = s.take_error().unwrap().to_string();
    assert!(err.contains("no valid checkpoint"), "{err}");
    assert!(s.ledger().balances());

    let mut s = Scheduler::new(SchedulerConfig {
        rollback_retained_max: 1,
        ..Default::default()
    });
    s.handle_worker_up(t, 0, 1);
    s.handle_ps_up(t, 0, 1);
    s.mark_cut(ClosureId(0), root()).unwrap();
    for _ in 0..2 {
        s.handle_schedule(t, "step", vec![]).unwrap();
        run_all(&mut s);
    }
    s.handle_ps_lost(t, 0, 1);
    assert!(!s.is_holding());
    let err = s.take_error().unwrap().to_string();
    assert!(err.contains("rollback_retained_max"), "{err}");
}

#[test]
fn a_cut_needs_nothing_pending_below_it() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.handle_worker_up(t, 0, 1);
    let a = s.handle_schedule(t, "step", vec![]).unwrap();
    assert!(s.mark_cut(ClosureId(1), root()).is_err());
    assert!(
        s.mark_cut(ClosureId(2), root()).is_err(),
        "beyond the ids given out"
    );
    drain(&mut s);
    s.handle_result(t, 0, 1, a, 1, Ok(vec![]));
    s.mark_cut(ClosureId(1), root()).unwrap();
    assert_eq!(s.cut(), Some(ClosureId(1)));
}

#[test]
fn a_rolled_back_closure_that_was_forgotten_is_known_again_and_its_attempts_go_on() {
    let t = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        finished_retained_max: 1,
        ..Default::default()
    });
    s.handle_worker_up(t, 0, 1);
    s.handle_ps_up(t, 0, 1);
    s.mark_cut(ClosureId(0), root()).unwrap();
    let ids: Vec<_> = (0..3u8)
        .map(|i| {
            let id = s.handle_schedule(t, "step", vec![i]).unwrap();
            run_all(&mut s);
            id
        })
        .collect();
    assert!(s.is_forgotten(ids[0]));
    s.handle_ps_up(t, 0, 2);
    drain(&mut s);
    assert_eq!(s.handle_restored(t, ClosureId(0)), Ok(3));
    let again: Vec<_> = drain(&mut s)
        .into_iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch {
                closure,
                args,
                attempt,
                ..
            } => Some((closure, args, attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(again, vec![(ids[0], vec![0], 2)]);
    assert!(s.ledger().balances());
}

/// The restore asked for: (cut, generation, pinned servers, fences).
type RestoreAsked = (
    ClosureId,
    u64,
    Vec<(u32, u64)>,
    Vec<(u32, WorkerIncarnation)>,
);

/// The restore a batch of actions started, from its first calls (a Begin per server and
/// the checkpoint's Load).
fn restore_asked(actions: &[SchedulerAction]) -> Option<RestoreAsked> {
    let mut asked: Option<RestoreAsked> = None;
    for a in actions {
        match a {
            SchedulerAction::Restore(RestoreCall::Begin {
                ps,
                incarnation,
                generation,
                fences,
                ..
            }) => {
                let entry = asked.get_or_insert((ClosureId(u64::MAX), *generation, vec![], vec![]));
                entry.2.push((*ps, *incarnation));
                entry.3 = fences.clone();
            }
            SchedulerAction::Restore(RestoreCall::Load { cut, .. }) => {
                if let Some(entry) = asked.as_mut() {
                    entry.0 = *cut;
                }
            }
            _ => {}
        }
    }
    asked
}

fn dispatched_generations(actions: &[SchedulerAction]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::Dispatch { generation, .. } => Some(*generation),
            _ => None,
        })
        .collect()
}

/// LEDGER-1: while a recovery holds dispatch the low watermark never passes the cut (a
/// watermark above it would make the servers refuse the closures run again), and each
/// restore starts a new generation that every later dispatch carries.
#[test]
fn ledger_1_the_watermark_stays_at_the_cut_while_holding_and_restores_bump_the_generation() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(2, 2);
    assert_eq!(dispatched_generations(&drain(&mut s)), vec![0, 0]);
    s.handle_result(t, 0, 1, ids[2], 1, Ok(vec![]));
    s.handle_result(t, 1, 1, ids[3], 1, Ok(vec![]));
    assert_eq!(s.low_watermark(), ClosureId(4));
    s.handle_ps_lost(t, 1, 1);
    assert!(s.is_holding());
    assert_eq!(s.low_watermark(), ids[2], "capped at the cut");
    s.handle_ps_up(t, 1, 2);
    let (cut, generation, servers, _) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!(
        (cut, generation, servers),
        (ids[2], 1, vec![(0, 1), (1, 2)])
    );
    assert_eq!(s.generation(), 1);
    assert!(s.is_restoring());
    assert_eq!(s.low_watermark(), ids[2]);
    assert_eq!(s.handle_restored(t, cut), Ok(2));
    assert_eq!(dispatched_generations(&drain(&mut s)), vec![1, 1]);
    assert_eq!(s.low_watermark(), ids[2]);
}

/// FENCE-1: the scheduler remembers the newest fenced incarnation of every worker, and a
/// restore carries them all to the (possibly restarted) servers.
#[test]
fn fence_1_a_restore_replays_every_fence() {
    let t = Instant::now();
    let (mut s, _) = with_cut(1, 1);
    s.handle_worker_lost(t, 0, 1);
    s.handle_worker_up(t, 0, 2);
    s.handle_worker_up(t, 0, 3);
    run_all(&mut s);
    assert!(s.is_idle());
    s.handle_ps_up(t, 0, 2);
    let (_, _, _, fences) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!(fences, vec![(0, 2)]);
}

/// A server that restarts while the restore runs is not the incarnation restored: the
/// scheduler starts a new restore (new generation) instead of resuming dispatch.
#[test]
fn a_ps_that_restarts_during_the_restore_is_restored_again() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(1, 2);
    drain(&mut s);
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    s.handle_result(t, 1, 1, ids[2], 1, Ok(vec![]));
    s.handle_ps_up(t, 0, 2);
    let (cut, generation, servers, _) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!((generation, servers), (1, vec![(0, 2), (1, 1)]));
    // ps/1 restarts while the restore runs; the restore (to the old ps/1) completes.
    s.handle_ps_up(t, 1, 2);
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.handle_restored(t, cut), Ok(2));
    assert!(s.is_holding(), "ps/1's new incarnation is empty");
    let (again, generation, servers, _) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!((again, generation, servers), (cut, 2, vec![(0, 2), (1, 2)]));
    assert_eq!(s.handle_restored(t, cut), Ok(0));
    assert_eq!(
        dispatched(&drain(&mut s)),
        vec![(0, ids[1], 2), (1, ids[2], 2)]
    );
    let l = s.ledger();
    assert_eq!((l.ps_restores, l.rolled_back), (2, 2));
    assert!(l.balances());
}

/// A restore that could not reach a server is tried again once the server answers (the
/// same incarnation, or a new one), not failed; a server that answers holding no variable
/// while a cut exists has lost its state.
#[test]
fn an_interrupted_restore_is_tried_again_and_an_empty_server_is_a_loss() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(1, 1);
    drain(&mut s);
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    // ps/0 answers the dial at its known incarnation but empty: it lost its state.
    s.handle_ps_answered(t, 0, 1, false);
    let (cut, generation, _, _) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!(generation, 1);
    s.handle_restore_interrupted(t, Some(1), "ps/1: peer lost".into());
    assert!(s.is_holding() && !s.is_restoring());
    assert_eq!(s.ps_down(), vec![1]);
    assert!(drain(&mut s).is_empty(), "waits for ps/1 to answer");
    s.handle_ps_answered(t, 1, 1, true);
    let (again, generation, _, _) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!((again, generation), (cut, 2));
    assert_eq!(s.handle_restored(t, cut), Ok(1));
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[1], 2)]);
    assert!(s.take_error().is_none());
    // Interrupted again and again: unrecoverable, never a spin.
    s.handle_ps_lost(t, 0, 1);
    s.handle_result(t, 0, 1, ids[1], 2, Ok(vec![]));
    for incarnation in 2..2 + u64::from(RESTORE_ATTEMPTS_MAX) {
        s.handle_ps_up(t, 0, incarnation);
        assert!(restore_asked(&drain(&mut s)).is_some());
        s.handle_restore_interrupted(t, Some(0), "peer lost".into());
    }
    assert!(!s.is_holding());
    let err = s.take_error().unwrap().to_string();
    assert!(err.contains("interrupted"), "{err}");
    assert!(s.ledger().balances());
}

/// The recovery bound does not cut a restore that is running (its calls have their own
/// bounds): the closures committed since the cut would be left without their effect.
#[test]
fn ledger_1_a_running_restore_is_never_timed_out() {
    let t = Instant::now();
    let bound = Duration::from_secs(30);
    let (mut s, ids) = with_cut(1, 1);
    s.config.ps_restart_wait_max = bound;
    drain(&mut s);
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    s.handle_ps_up(t, 0, 2);
    let (cut, ..) = restore_asked(&drain(&mut s)).unwrap();
    assert_eq!(s.poll_timeout(), None);
    s.handle_timeout(t + bound * 10);
    assert!(s.is_restoring() && s.take_error().is_none());
    assert_eq!(s.handle_restored(t + bound * 10, cut), Ok(1));
    assert_eq!(dispatched(&drain(&mut s)), vec![(0, ids[1], 2)]);
}

/// CKPT-1: no cut is marked while a restore runs (a checkpoint read then mixes two cuts).
#[test]
fn ckpt_1_no_cut_is_marked_while_a_restore_runs() {
    let t = Instant::now();
    let (mut s, ids) = with_cut(1, 1);
    drain(&mut s);
    s.handle_result(t, 0, 1, ids[1], 1, Ok(vec![]));
    s.handle_ps_up(t, 0, 2);
    let (cut, ..) = restore_asked(&drain(&mut s)).unwrap();
    assert!(s.mark_cut(ClosureId(2), root()).is_err());
    s.handle_restored(t, cut).unwrap();
    assert_eq!(s.cut(), Some(cut));
}
