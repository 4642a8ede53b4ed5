//! `cohort bench recovery`: what a failure costs a running job. One local cluster (1 chief +
//! 2 PS + 2 workers, as processes on 127.0.0.1) per scenario runs the recovery workload
//! ([`crate::workloads::recovery`]); the benchmark injects the scenario's faults by signalling
//! the task's process (its PID from the launcher's PID file) and reads the chief's record of
//! every commit to time the recovery:
//! - worker SIGKILL: kill → its closure re-dispatched (the ledger's count rose), and its
//!   restart (the new process's start) → serving again (its first closure committed);
//! - PS SIGKILL / SIGTERM: the new server process's start → training resumed (the first commit
//!   after the restore), and the closures run again (the ledger's `rolled_back`);
//! - spot: SIGTERM to a random worker or server at seeded times (exponential intervals of
//!   mean [`SPOT_MEAN_INTERVAL`]) through a run four times as long: goodput as its steps per
//!   second over the fault-free run's.

use crate::process::stdout::outln;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};

use super::CliError;
use crate::bootstrap::{launch_local, LaunchFlags};
use crate::cluster::{TaskId, TaskType};
use crate::launch::pid_file;
use crate::workloads::recovery::{samples_path, unix_ms, Commit, LedgerSample, EVENTS_ENV};

/// Mean interval between two preemptions of the spot scenario.
pub const SPOT_MEAN_INTERVAL: Duration = Duration::from_secs(3);
/// The spot scenario runs this many times the steps of the others.
const SPOT_STEPS_FACTOR: usize = 4;
/// Bound on one scenario's run.
const SCENARIO_MAX: Duration = Duration::from_secs(300);
/// How often the injector looks at the job's progress.
const POLL: Duration = Duration::from_millis(5);

/// A fault to inject.
#[derive(Debug, Clone, Copy)]
struct Injection {
    task: TaskId,
    signal: Signal,
}

/// One scenario: its name and what it injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    FaultFree,
    WorkerKill,
    PsKill,
    PsTerm,
    Spot,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::FaultFree => "fault-free",
            Scenario::WorkerKill => "worker SIGKILL",
            Scenario::PsKill => "PS SIGKILL",
            Scenario::PsTerm => "PS SIGTERM",
            Scenario::Spot => "spot",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Scenario::FaultFree => "fault-free",
            Scenario::WorkerKill => "worker-kill",
            Scenario::PsKill => "ps-kill",
            Scenario::PsTerm => "ps-term",
            Scenario::Spot => "spot",
        }
    }
}

/// What one scenario's run recorded.
struct Run {
    commits: Vec<Commit>,
    /// The chief's ledger samples.
    samples: Vec<LedgerSample>,
    /// When each fault was injected (ms since the epoch), and at which it aimed.
    injected: Vec<(u64, Injection)>,
    /// Per task signalled once, the incarnation that was signalled (its process's start).
    victim_incarnation: Option<u64>,
    run_dir: PathBuf,
}

/// Runs every scenario with `steps` steps each (the single faults at a third of them) and
/// prints the figures; `seed` draws the spot schedule.
pub fn run(steps: usize, seed: u64) -> Result<(), CliError> {
    if steps < 30 {
        return Err(CliError::Usage(format!(
            "--steps {steps}: the recovery benchmark needs at least 30 steps"
        )));
    }
    let dir = crate::process::new_temp_dir("cohort-bench-recovery-")
        .map_err(|e| CliError::Failed(format!("a scratch directory: {e}")))?;
    let mut rows = Vec::new();
    let mut fault_free_rate = None;
    for scenario in [
        Scenario::FaultFree,
        Scenario::WorkerKill,
        Scenario::PsKill,
        Scenario::PsTerm,
        Scenario::Spot,
    ] {
        let run = run_scenario(&dir, scenario, steps, seed)?;
        let row = measure(scenario, &run, fault_free_rate)?;
        if scenario == Scenario::FaultFree {
            fault_free_rate = Some(rate(&run.commits));
        }
        outln!("{}: {}", scenario.name(), row);
        rows.push((scenario, row));
    }
    let _ = std::fs::remove_dir_all(&dir);
    outln!(
        "\ncohort bench recovery: 1 chief + 2 PS + 2 workers as processes on 127.0.0.1, {steps} \
         steps per scenario, a checkpoint every 2 s, detection budget 3 s"
    );
    for (scenario, row) in rows {
        outln!("{:<15} {row}", scenario.name());
    }
    outln!(
        "targets: worker restart -> serving <= 0.5 s; re-dispatch <= 0.2 s after the death is \
         known; PS SIGKILL -> resumed <= 1 s after the server is back; PS SIGTERM -> 0 \
         closures re-run; spot goodput >= 0.9 of fault-free"
    );
    Ok(())
}

/// Launches the job for `scenario` on a thread and injects its faults from this one.
fn run_scenario(dir: &Path, scenario: Scenario, steps: usize, seed: u64) -> Result<Run, CliError> {
    let slug = scenario.slug();
    let events = dir.join(format!("{slug}.events"));
    let run_dir = dir.join(format!("{slug}-run"));
    let flags = LaunchFlags::bench_cluster(run_dir.clone(), false);
    // The spot schedule needs a longer run to see several preemptions.
    let steps = if scenario == Scenario::Spot {
        steps * SPOT_STEPS_FACTOR
    } else {
        steps
    };
    let env = vec![
        ("COHORT_BENCH_WORKLOAD".to_string(), "recovery".to_string()),
        ("COHORT_BENCH_STEPS".to_string(), steps.to_string()),
        (EVENTS_ENV.to_string(), events.display().to_string()),
        (
            "COHORT_CHECKPOINT_DIR".to_string(),
            dir.join(format!("{slug}-ckpt")).display().to_string(),
        ),
    ];
    let job = std::thread::spawn(move || {
        launch_local(
            &flags,
            vec!["role".into(), "--job".into(), "bench".into()],
            env,
        )
    });
    let started = Instant::now();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let single = single_injection(scenario);
    let mut injected = Vec::new();
    let mut victim_incarnation = None;
    let mut next_spot: Option<u64> = None;
    while !job.is_finished() && started.elapsed() < SCENARIO_MAX {
        std::thread::sleep(POLL);
        let committed = read_commits(&events).len();
        if let Some(injection) = single.filter(|_| injected.is_empty()) {
            if committed >= steps / 3 {
                victim_incarnation = read_pid(&run_dir, injection.task).map(|(_, i)| i);
                if signal(&run_dir, injection) {
                    injected.push((unix_ms(), injection));
                }
            }
        }
        if scenario == Scenario::Spot && committed >= steps / 10 && committed < steps * 9 / 10 {
            let now = unix_ms();
            let due = *next_spot.get_or_insert_with(|| now + exponential(&mut rng));
            if now >= due {
                let injection = Injection {
                    task: spot_victim(&mut rng),
                    signal: Signal::SIGTERM,
                };
                if signal(&run_dir, injection) {
                    injected.push((now, injection));
                }
                next_spot = Some(now + exponential(&mut rng));
            }
        }
    }
    if !job.is_finished() {
        return Err(CliError::Failed(format!(
            "the {} scenario did not finish within {SCENARIO_MAX:?}",
            scenario.name()
        )));
    }
    let code = job.join().map_err(|_| {
        CliError::Failed(format!(
            "the {} scenario's launcher panicked",
            scenario.name()
        ))
    })?;
    if code != 0 {
        return Err(CliError::Failed(format!(
            "the {} scenario's chief exited with code {code}",
            scenario.name()
        )));
    }
    let samples = std::fs::read_to_string(samples_path(&events))
        .map(|text| text.lines().filter_map(LedgerSample::parse).collect())
        .unwrap_or_default();
    Ok(Run {
        commits: read_commits(&events),
        samples,
        injected,
        victim_incarnation,
        run_dir,
    })
}

/// The one fault of `scenario`, injected a third of the way in (none for the fault-free run
/// and the spot schedule, whose preemptions are drawn as it goes).
fn single_injection(scenario: Scenario) -> Option<Injection> {
    let (task, signal) = match scenario {
        Scenario::WorkerKill => (TaskId::new(TaskType::Worker, 1), Signal::SIGKILL),
        Scenario::PsKill => (TaskId::new(TaskType::Ps, 1), Signal::SIGKILL),
        Scenario::PsTerm => (TaskId::new(TaskType::Ps, 1), Signal::SIGTERM),
        Scenario::FaultFree | Scenario::Spot => return None,
    };
    Some(Injection { task, signal })
}

/// The task a spot preemption hits: any of the two workers and two servers, alike.
fn spot_victim(rng: &mut rand_chacha::ChaCha8Rng) -> TaskId {
    match rng.gen_range(0..4) {
        0 => TaskId::new(TaskType::Worker, 0),
        1 => TaskId::new(TaskType::Worker, 1),
        2 => TaskId::new(TaskType::Ps, 0),
        _ => TaskId::new(TaskType::Ps, 1),
    }
}

/// The scenario's figures, as one line.
fn measure(
    scenario: Scenario,
    run: &Run,
    fault_free_rate: Option<f64>,
) -> Result<String, CliError> {
    let commits = &run.commits;
    let missing = |what: &str| CliError::Failed(format!("{}: {what}", scenario.name()));
    let span = span_ms(commits);
    let rate = rate(commits);
    let last = commits
        .last()
        .ok_or_else(|| missing("no closure committed"))?;
    match scenario {
        Scenario::FaultFree => Ok(format!(
            "{} steps in {:.2} s ({rate:.0} steps/s)",
            commits.len(),
            span as f64 / 1e3
        )),
        Scenario::WorkerKill => {
            let (at, injection) = *run
                .injected
                .first()
                .ok_or_else(|| missing("no fault injected"))?;
            let before = commits.iter().take_while(|c| c.at_ms <= at).last();
            let redispatched_before = before.map_or(0, |c| c.redispatched);
            let redispatch = commits
                .iter()
                .find(|c| c.at_ms >= at && c.redispatched > redispatched_before)
                .map(|c| c.at_ms - at);
            let old = run.victim_incarnation.unwrap_or(0);
            let restarted = read_pid(&run.run_dir, injection.task).map(|(_, i)| i);
            let serving = restarted.filter(|i| *i > old).and_then(|restart| {
                commits
                    .iter()
                    .find(|c| c.worker == injection.task.index && c.incarnation >= restart)
                    .map(|c| c.at_ms.saturating_sub(restart))
            });
            Ok(format!(
                "kill -> closure re-dispatched {} (the death known from the launcher's exit report); \
                 restart -> serving {}; longest stall {:.2} s",
                seconds(redispatch),
                seconds(serving),
                longest_gap_ms(commits, at) as f64 / 1e3
            ))
        }
        Scenario::PsKill | Scenario::PsTerm => {
            let (at, injection) = *run
                .injected
                .first()
                .ok_or_else(|| missing("no fault injected"))?;
            let before = commits.iter().take_while(|c| c.at_ms <= at).last();
            let restores_before = before.map_or(0, |c| c.ps_restores);
            let old = run.victim_incarnation.unwrap_or(0);
            let back = read_pid(&run.run_dir, injection.task)
                .map(|(_, i)| i)
                .filter(|i| *i > old);
            // Resumed: the first closure committed after the restore (the sampler's view);
            // caught up: the program's in-order stream moving again, once what was rolled
            // back has run again.
            let restored = run.samples.iter().find(|x| x.ps_restores > restores_before);
            let resumed = back.zip(restored).and_then(|(back, restored)| {
                run.samples
                    .iter()
                    .find(|x| x.at_ms >= restored.at_ms && x.committed > restored.committed)
                    .map(|x| x.at_ms.saturating_sub(back))
            });
            let caught_up = back.and_then(|back| {
                commits
                    .iter()
                    .find(|c| c.ps_restores > restores_before)
                    .map(|c| c.at_ms.saturating_sub(back))
            });
            Ok(format!(
                "server back -> training resumed {}; closures re-run {} (stream caught up {}); \
                 longest stall {:.2} s",
                seconds(resumed),
                last.rolled_back,
                seconds(caught_up),
                longest_gap_ms(commits, at) as f64 / 1e3
            ))
        }
        Scenario::Spot => {
            let goodput = fault_free_rate.map(|free| rate / free);
            Ok(format!(
                "{} preemptions (mean interval {:?}), {} steps in {:.2} s: goodput {} of \
                 fault-free; closures re-run {}, re-dispatched {}",
                run.injected.len(),
                SPOT_MEAN_INTERVAL,
                commits.len(),
                span as f64 / 1e3,
                goodput.map_or("n/a".into(), |g| format!("{g:.2}")),
                last.rolled_back,
                last.redispatched
            ))
        }
    }
}

/// Sends the injection's signal to its task's current process; false if none is known.
fn signal(run_dir: &Path, injection: Injection) -> bool {
    let Some((pid, _)) = read_pid(run_dir, injection.task) else {
        return false;
    };
    eprintln!(
        "[bench] {:?} to {} (pid {pid})",
        injection.signal, injection.task
    );
    kill(Pid::from_raw(pid as i32), injection.signal).is_ok()
}

/// The launcher's record of `task`'s process: its PID and incarnation.
fn read_pid(run_dir: &Path, task: TaskId) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(pid_file(run_dir, task)).ok()?;
    let mut fields = text.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// Every complete record in the chief's events file.
fn read_commits(path: &Path) -> Vec<Commit> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().filter_map(Commit::parse).collect())
        .unwrap_or_default()
}

/// Milliseconds from the first commit to the last.
fn span_ms(commits: &[Commit]) -> u64 {
    match (commits.first(), commits.last()) {
        (Some(a), Some(b)) => b.at_ms - a.at_ms,
        _ => 0,
    }
}

/// Commits per second from the first commit to the last.
fn rate(commits: &[Commit]) -> f64 {
    commits.len() as f64 * 1e3 / span_ms(commits).max(1) as f64
}

/// The longest pause between two commits from `from_ms` on.
fn longest_gap_ms(commits: &[Commit], from_ms: u64) -> u64 {
    commits
        .windows(2)
        .filter(|w| w[1].at_ms >= from_ms)
        .map(|w| w[1].at_ms - w[0].at_ms)
        .max()
        .unwrap_or(0)
}

/// A draw from the exponential distribution of mean [`SPOT_MEAN_INTERVAL`], in ms.
fn exponential(rng: &mut impl Rng) -> u64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    (-u.ln() * SPOT_MEAN_INTERVAL.as_millis() as f64) as u64
}

fn seconds(ms: Option<u64>) -> String {
    ms.map_or("n/a".into(), |ms| format!("{:.3} s", ms as f64 / 1e3))
}
