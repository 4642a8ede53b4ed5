//! Simulator throughput: simulated schedules and events per second on one thread, for the
//! cluster simulator's reference job (2 parameter servers, 3 workers, 200 closures) with every
//! fault kind (target: at least 500 schedules per second on one core), and for the membership
//! simulator (MultiWorkerMirrored's member machines, up to 4 workers and 5 faults of every
//! kind, as `cohort chaos sim --membership` runs them). `cargo bench --bench sim`.
//!
//! Each schedule is a whole job from its seed: the scenario is drawn, the job runs to its end,
//! and every invariant is checked after every event, as in `cohort chaos sim`.

use std::time::{Duration, Instant};

use cohort::sim::{run_membership_seeds, run_seeds, MembershipConfig, SimConfig};

fn main() {
    let config = SimConfig::default();
    measure(
        &format!(
            "sim: {} ps, {} workers, {} closures, all fault kinds, invariants checked after every \
             event",
            config.num_ps, config.num_workers, config.closures
        ),
        |seeds| {
            let summary = run_seeds(&config, seeds);
            (summary.events, summary.violations.len())
        },
    );
    let config = MembershipConfig::default();
    measure(
        &format!(
            "membership sim: up to {} workers, up to {} faults of every kind, invariants checked \
             after every event",
            config.workers_max, config.faults_max
        ),
        |seeds| {
            let summary = run_membership_seeds(&config, seeds);
            (summary.events, summary.violations.len())
        },
    );
}

/// Runs `run` (seeds in, events and violations out) on batches of seeds for [`RUN`] after a
/// warm-up, and prints `what` and the rates.
fn measure(what: &str, run: impl Fn(std::ops::Range<u64>) -> (u64, usize)) {
    let _ = run(0..20);
    let started = Instant::now();
    let (mut seeds, mut events, mut violations) = (0u64, 0u64, 0usize);
    while started.elapsed() < RUN {
        let (e, v) = run(seeds..seeds + BATCH);
        seeds += BATCH;
        events += e;
        violations += v;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("{what}");
    println!(
        "{seeds} schedules, {events} events in {seconds:.2} s: {:.0} schedules/s, {:.0} events/s \
         ({:.0} events per schedule); violations: {violations}",
        seeds as f64 / seconds,
        events as f64 / seconds,
        events as f64 / seeds.max(1) as f64
    );
}

/// How long the measured part runs.
const RUN: Duration = Duration::from_secs(10);
/// Seeds per round between clock reads.
const BATCH: u64 = 50;
