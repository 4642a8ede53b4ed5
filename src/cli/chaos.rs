//! `cohort chaos sim`: the deterministic cluster simulator ([`crate::sim`]) over many seeds,
//! with a summary, and the failing seeds shrunk to scenarios a test can paste.

use std::time::Instant;

use super::CliError;
use crate::sim::{self, FaultKinds, SimConfig};

/// Flags of `cohort chaos sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// How many seeds to run (from --first-seed on).
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed of the range.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Run only this seed, and print its event trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Fault kinds to draw from: comma-separated kill, pause, partition, preempt, net,
    /// storage, chief (kill the chief), drain (a worker scaled down), reshard (servers
    /// joining and leaving), or all / none.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Most faults in one schedule.
    #[arg(long, default_value_t = 6)]
    faults_max: usize,
    /// Parameter servers in the simulated job.
    #[arg(long, default_value_t = 2)]
    ps: u32,
    /// Workers in the simulated job.
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Closures the simulated chief schedules.
    #[arg(long, default_value_t = 200)]
    closures: u64,
}

/// Runs the simulator as the flags say; a broken invariant is a failure (exit 1).
pub fn run(args: SimArgs) -> Result<(), CliError> {
    let kinds =
        FaultKinds::parse(&args.faults).map_err(|e| CliError::Usage(format!("--faults: {e}")))?;
    if args.ps == 0 || args.workers == 0 || args.closures == 0 {
        return Err(CliError::Usage(
            "--ps, --workers and --closures must each be at least 1".into(),
        ));
    }
    if args.ps > 64 || args.workers > 256 || args.closures > 1_000_000 {
        return Err(CliError::Usage(
            "the simulated job is bounded: --ps at most 64, --workers at most 256, \
             --closures at most 1000000"
                .into(),
        ));
    }
    let config = SimConfig {
        num_ps: args.ps,
        num_workers: args.workers,
        closures: args.closures,
        faults_max: args.faults_max.min(64),
        kinds,
        record_trace: args.seed.is_some(),
        ..SimConfig::default()
    };
    if let Some(seed) = args.seed {
        let scenario = sim::Scenario::draw(&config, seed);
        let report = sim::run_scenario(&config, &scenario);
        for line in &report.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}: {} events, {} ms simulated",
            report.events, report.sim_ms
        );
        println!("{scenario}");
        return match (&report.violation, &report.failure) {
            (Some(v), _) => Err(CliError::Failed(format!("seed {seed}: {v}"))),
            (None, Some(f)) => {
                println!("the job failed (allowed): {f}");
                Ok(())
            }
            (None, None) => {
                println!("the job finished; every invariant held");
                Ok(())
            }
        };
    }
    let last = args.first_seed.saturating_add(args.seeds);
    println!(
        "simulating seeds {}..{last}: {} ps, {} workers, {} closures, faults: {}",
        args.first_seed, args.ps, args.workers, args.closures, args.faults
    );
    let started = Instant::now();
    let summary = sim::run_seeds(&config, args.first_seed..last);
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{} schedules, {} events in {seconds:.2} s ({:.0} schedules/s, {:.0} events/s)",
        summary.schedules,
        summary.events,
        summary.schedules as f64 / seconds,
        summary.events as f64 / seconds
    );
    println!(
        "jobs finished: {}, failed with an error (allowed): {}",
        summary.finished, summary.failed
    );
    for (seed, error) in &summary.failures {
        println!("  seed {seed} failed: {error}");
    }
    let faults: Vec<String> = summary
        .faults
        .iter()
        .map(|(kind, n)| format!("{kind}: {n}"))
        .collect();
    println!("faults injected: {}", faults.join(", "));
    if summary.violations.is_empty() {
        println!("violations: none");
        return Ok(());
    }
    println!("violations: {}", summary.violations.len());
    for (seed, violation) in summary.violations.iter().take(20) {
        println!("  seed {seed}: {violation}");
    }
    let (seed, _) = &summary.violations[0];
    let shrunk = sim::shrink(&config, &sim::Scenario::draw(&config, *seed));
    println!("seed {seed} shrunk to:\n{shrunk}");
    Err(CliError::Failed(format!(
        "{} of {} schedules broke an invariant (replay one with --seed)",
        summary.violations.len(),
        summary.schedules
    )))
}
