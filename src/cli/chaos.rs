//! `cohort chaos sim`: the deterministic cluster simulator ([`crate::sim`]) over many seeds,
//! with a summary, and the failing seeds shrunk to scenarios a test can paste; or over the
//! one scenario of a plan file (`--plan`). `cohort chaos run`: the same plan against a real
//! local job ([`crate::chaosrun`]).

use crate::process::stdout::outln;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::CliError;
use crate::chaosrun::{self, plan::Plan, run::RunSetup};
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
    /// Run the one scenario of this chaos plan (the file `chaos run` takes: its seed, and its
    /// kill, pause and term faults and its partitions of one task from all the others at
    /// their times as simulated time), and print its trace. What the simulator cannot model
    /// (checkpoint files, a partition between two given tasks, loss) is refused.
    #[arg(long, conflicts_with = "seed")]
    plan: Option<PathBuf>,
    /// Fault kinds to draw from: comma-separated kill, pause, partition, preempt, net,
    /// storage, chief (kill the chief), drain (a worker scaled down or up, past the cluster spec too), reshard (servers
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
    /// Simulate MultiWorkerMirrored's membership instead (the collective's member machines
    /// under kills, pauses, preemptions, drains, cuts, splits, slow and lossy links; `--workers` is
    /// then the most workers a schedule draws, from 2 up; with `--seed`, that seed's scenario
    /// and event trace).
    #[arg(long, conflicts_with = "plan")]
    membership: bool,
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
    if args.membership {
        return run_membership(&args);
    }
    let config = SimConfig {
        num_ps: args.ps,
        num_workers: args.workers,
        closures: args.closures,
        faults_max: args.faults_max.min(64),
        kinds,
        record_trace: args.seed.is_some() || args.plan.is_some(),
        ..SimConfig::default()
    };
    let chosen = match (&args.plan, args.seed) {
        (Some(path), _) => {
            let plan = Plan::load(path).map_err(|e| CliError::Usage(e.to_string()))?;
            let scenario = plan
                .to_scenario(&config)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            Some((plan.seed, scenario))
        }
        (None, Some(seed)) => Some((seed, sim::Scenario::draw(&config, seed))),
        (None, None) => None,
    };
    if let Some((seed, scenario)) = chosen {
        return run_one(&config, seed, &scenario);
    }
    let last = args.first_seed.saturating_add(args.seeds);
    outln!(
        "simulating seeds {}..{last}: {} ps, {} workers, {} closures, faults: {}",
        args.first_seed, args.ps, args.workers, args.closures, args.faults
    );
    let started = Instant::now();
    let summary = sim::run_seeds(&config, args.first_seed..last);
    report_sweep(&config, &summary, started.elapsed().as_secs_f64())
}

/// Runs one `scenario` (of `seed`, or of a plan) and prints its trace; a broken invariant is
/// a failure.
fn run_one(config: &SimConfig, seed: u64, scenario: &sim::Scenario) -> Result<(), CliError> {
    let report = sim::run_scenario(config, scenario);
    for line in &report.trace {
        outln!("{line}");
    }
    outln!(
        "seed {seed}: {} events, {} ms simulated",
        report.events, report.sim_ms
    );
    outln!("{scenario}");
    let late = scenario
        .faults
        .iter()
        .filter(|f| fault_time_ms(f).is_some_and(|at| at > report.sim_ms))
        .count();
    if late > 0 {
        outln!(
            "note: {late} fault(s) fell after the simulated job ended (more --closures \
             make it longer)"
        );
    }
    match (&report.violation, &report.failure) {
        (Some(v), _) => Err(CliError::Failed(format!("seed {seed}: {v}"))),
        (None, Some(f)) => {
            outln!("the job ended with an expected end ({}): {f}", f.kind());
            Ok(())
        }
        (None, None) => {
            outln!("the job finished; every invariant held");
            Ok(())
        }
    }
}

/// Prints what a sweep of seeds found (`seconds`: how long it ran); a broken invariant is a
/// failure, its first seed shrunk to a scenario.
fn report_sweep(config: &SimConfig, summary: &sim::Summary, seconds: f64) -> Result<(), CliError> {
    let seconds = seconds.max(1e-9);
    outln!(
        "{} schedules, {} events in {seconds:.2} s ({:.0} schedules/s, {:.0} events/s)",
        summary.schedules,
        summary.events,
        summary.schedules as f64 / seconds,
        summary.events as f64 / seconds
    );
    outln!(
        "jobs finished: {}, ended with an expected end (a fault beyond repair, its cause \
         borne out by the scenario): {}",
        summary.finished, summary.failed
    );
    for (kind, n) in &summary.ends {
        outln!("  {kind}: {n}");
    }
    for (seed, error) in &summary.failures {
        outln!("  seed {seed} failed: {error}");
    }
    let faults: Vec<String> = summary
        .faults
        .iter()
        .map(|(kind, n)| format!("{kind}: {n}"))
        .collect();
    outln!("faults injected: {}", faults.join(", "));
    if summary.violations.is_empty() {
        outln!("violations: none");
        return Ok(());
    }
    outln!("violations: {}", summary.violations.len());
    for (seed, violation) in summary.violations.iter().take(20) {
        outln!("  seed {seed}: {violation}");
    }
    let (seed, _) = &summary.violations[0];
    let shrunk = sim::shrink(config, &sim::Scenario::draw(config, *seed));
    outln!("seed {seed} shrunk to:\n{shrunk}");
    Err(CliError::Failed(format!(
        "{} of {} schedules broke an invariant (replay one with --seed)",
        summary.violations.len(),
        summary.schedules
    )))
}

/// Flags of `cohort chaos run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The chaos plan (TOML: seed, expect_exit, [[fault]] tables).
    #[arg(long)]
    plan: PathBuf,
    /// Where the report (report.txt, report.json) and the job's output (job.log) go.
    /// Default: <run-dir>/chaos.
    #[arg(long)]
    out: Option<PathBuf>,
    /// End the job (SIGTERM to its launcher, SIGKILL to all after a grace) past this; the
    /// exit code check then fails.
    #[arg(long, default_value = "10m", value_parser = |s: &str| crate::cluster::parse_duration_in(
        "--timeout", s, crate::cluster::DurationRange::new(Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600))
    ))]
    timeout: Duration,
    /// The job's launch command, after `--` (e.g. `-- cohort demo --run-dir DIR
    /// --checkpoint-dir DIR`). It must give --run-dir: the runner finds each task's process
    /// there. Checkpoint faults need the job's --checkpoint-dir (or COHORT_CHECKPOINT_DIR).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs a job under a chaos plan; exit 1 when a check failed, 2 for bad usage.
pub fn run_plan(args: RunArgs) -> Result<(), CliError> {
    let plan = Plan::load(&args.plan).map_err(|e| CliError::Usage(e.to_string()))?;
    chaosrun::check_targets(&plan, &args.command).map_err(|e| CliError::Usage(e.to_string()))?;
    let (run_dir, checkpoint_dir) = chaosrun::job_dirs(&args.command);
    let run_dir = run_dir.ok_or_else(|| {
        CliError::Usage(
            "the launch command gives no --run-dir: the runner finds each task's process in \
             <run-dir>/pids (e.g. `-- cohort demo --run-dir /tmp/job`)"
                .into(),
        )
    })?;
    if plan.touches_checkpoints() && checkpoint_dir.is_none() {
        return Err(CliError::Usage(format!(
            "{}: the plan acts on checkpoints, but the launch command gives no \
             --checkpoint-dir (nor is COHORT_CHECKPOINT_DIR set)",
            plan.source.display()
        )));
    }
    let setup = RunSetup {
        command: args.command,
        out_dir: args.out.unwrap_or_else(|| run_dir.join("chaos")),
        run_dir,
        checkpoint_dir,
        timeout: args.timeout,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| CliError::Failed(format!("cannot handle signal {signal}: {e}")))?;
    }
    let observed =
        chaosrun::run::run_job(&plan, &setup, &stop).map_err(|e| CliError::Usage(e.to_string()))?;
    let checks = chaosrun::check(&plan, &setup, &observed);
    let passed = chaosrun::write_report(&plan, &setup, &observed, &checks)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    if passed {
        outln!("report: {}", setup.out_dir.join("report.txt").display());
        Ok(())
    } else {
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| c.status == "failed")
            .map(|c| c.name)
            .collect();
        Err(CliError::Failed(format!(
            "violation: {} (report: {})",
            failed.join(", "),
            setup.out_dir.join("report.txt").display()
        )))
    }
}

/// When a simulated fault is due (none for a storage fault, which hits a numbered save).
fn fault_time_ms(fault: &sim::Fault) -> Option<u64> {
    use sim::Fault;
    match fault {
        Fault::Kill { at_ms, .. }
        | Fault::Pause { at_ms, .. }
        | Fault::Partition { at_ms, .. }
        | Fault::Preempt { at_ms, .. }
        | Fault::Drain { at_ms, .. }
        | Fault::Rejoin { at_ms, .. }
        | Fault::WorkerJoin { at_ms }
        | Fault::PsJoin { at_ms }
        | Fault::PsLeave { at_ms } => Some(*at_ms),
        Fault::Storage { .. } => None,
    }
}

/// `cohort chaos sim --membership --seed N`: the scenario of one seed, its event trace, and
/// what it found.
fn trace_membership(config: &sim::MembershipConfig, seed: u64) -> Result<(), CliError> {
    let (scenario, report) = sim::trace_membership_seed(config, seed);
    outln!(
        "seed {seed}: {} workers, {} steps",
        scenario.workers, config.steps
    );
    for fault in &scenario.faults {
        outln!("  fault at {:?}: {:?}", fault.at, fault.kind);
    }
    for line in &report.trace {
        outln!("{line}");
    }
    outln!(
        "{} events, {:?}; finished: {}",
        report.events, report.took, report.finished
    );
    match report.violation {
        None => {
            outln!("violations: none");
            Ok(())
        }
        Some(v) => Err(CliError::Failed(format!(
            "seed {seed}: {} at {:?}: {}",
            v.invariant, v.at, v.detail
        ))),
    }
}

/// `cohort chaos sim --membership`: the membership simulator over the seeds of `args`.
fn run_membership(args: &SimArgs) -> Result<(), CliError> {
    if !(2..=16).contains(&args.workers) {
        return Err(CliError::Usage(
            "--workers must be from 2 to 16 with --membership".into(),
        ));
    }
    let config = sim::MembershipConfig {
        workers_max: args.workers as usize,
        faults_max: args.faults_max.min(64),
        ..sim::MembershipConfig::default()
    };
    if let Some(seed) = args.seed {
        return trace_membership(&config, seed);
    }
    let last = args.first_seed.saturating_add(args.seeds);
    outln!(
        "simulating the membership of seeds {}..{last}: 2 to {} workers, {} steps, up to {} \
         faults",
        args.first_seed, config.workers_max, config.steps, config.faults_max
    );
    let started = Instant::now();
    let summary = sim::run_membership_seeds(&config, args.first_seed..last);
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    outln!(
        "{} schedules, {} events in {seconds:.2} s ({:.0} schedules/s, {:.0} events/s)",
        summary.schedules,
        summary.events,
        summary.schedules as f64 / seconds,
        summary.events as f64 / seconds
    );
    outln!(
        "jobs finished: {} of {}; groups formed: {}",
        summary.finished, summary.schedules, summary.groups_formed
    );
    let list = |map: &std::collections::BTreeMap<&'static str, u64>| {
        map.iter()
            .map(|(kind, n)| format!("{kind}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!("process exits: {}", list(&summary.exits));
    outln!("faults injected: {}", list(&summary.faults));
    outln!(
        "lossy links: {} messages late, {} connections idled out",
        summary.late_on_lossy, summary.idled_out
    );
    if summary.violations.is_empty() {
        outln!("violations: none");
        return Ok(());
    }
    outln!("violations: {}", summary.violations.len());
    for (seed, v) in summary.violations.iter().take(20) {
        outln!("  seed {seed}: {} at {:?}: {}", v.invariant, v.at, v.detail);
    }
    Err(CliError::Failed(format!(
        "{} membership schedule(s) broke an invariant",
        summary.violations.len()
    )))
}
