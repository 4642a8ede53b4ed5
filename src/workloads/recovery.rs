//! The recovery benchmark's job (`cohort bench recovery`): steady parameter-server training
//! whose chief records, for every closure it commits in order, when it committed, which worker
//! incarnation ran it and the ledger's recovery counts. The benchmark injects faults into the
//! running job and reads those records to time each recovery (see `crate::cli`'s bench).
//!
//! Each step pulls a 256 KiB variable split over the parameter servers, pushes a gradient to
//! it and computes for [`STEP_COMPUTE`]; the chief keeps [`AHEAD`] closures scheduled, fetches
//! them in order (a lost closure stalls the stream until it is re-run, as a training loop that
//! consumes every step's result does) and saves a checkpoint every [`SAVE_EVERY`], as a job
//! that wants to lose little does.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::checkpoint::{CheckpointManager, CheckpointPolicy};
use crate::launch::INCARNATION_ENV;
use crate::program::{ClusterCoordinator, CoordinatorError, StepContext, StepError, VariableSpec};
use crate::variable::Partitioner;

/// The step function's name.
pub const STEP: &str = "recovery_step";
/// Environment variable naming the file the chief appends one [`Commit`] line to per closure.
pub const EVENTS_ENV: &str = "COHORT_BENCH_EVENTS";
/// Closures kept scheduled ahead of the one fetched.
pub const AHEAD: usize = 4;
/// Simulated computation per step.
pub const STEP_COMPUTE: Duration = Duration::from_millis(5);
/// Checkpoint cadence.
pub const SAVE_EVERY: Duration = Duration::from_secs(2);
const VARIABLE: &str = "recovery/w";
/// Elements of the trained variable (256 KiB of f32).
const FLOATS: usize = 1 << 16;

/// One committed closure, as the chief recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// When it was fetched, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its position in the stream.
    pub step: u64,
    /// The worker that ran it.
    pub worker: u32,
    /// That worker's incarnation.
    pub incarnation: u64,
    /// The ledger's re-dispatches, closures rolled back and parameter-server restores then.
    pub redispatched: u64,
    /// See `redispatched`.
    pub rolled_back: u64,
    /// See `redispatched`.
    pub ps_restores: u64,
}

impl Commit {
    /// The record as one line.
    pub fn to_line(self) -> String {
        format!(
            "{} {} {} {} {} {} {}",
            self.at_ms,
            self.step,
            self.worker,
            self.incarnation,
            self.redispatched,
            self.rolled_back,
            self.ps_restores
        )
    }

    /// Reads a line written by [`Self::to_line`]; `None` if it is not one (a line cut short
    /// while it is written).
    pub fn parse(line: &str) -> Option<Self> {
        let f: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [at_ms, step, worker, incarnation, redispatched, rolled_back, ps_restores] = f[..]
        else {
            return None;
        };
        Some(Self {
            at_ms,
            step,
            worker: u32::try_from(worker).ok()?,
            incarnation,
            redispatched,
            rolled_back,
            ps_restores,
        })
    }
}

/// The ledger as the chief's sampler saw it every [`SAMPLE_EVERY`] (appended to the events
/// file's path with `.ledger`): when training resumed shows here, not only in the program's
/// in-order fetches (which wait for the closures run again first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerSample {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Closures committed.
    pub committed: u64,
    /// Parameter-server restores.
    pub ps_restores: u64,
}

impl LedgerSample {
    /// Reads a line `"<at_ms> <committed> <ps_restores>"`.
    pub fn parse(line: &str) -> Option<Self> {
        let mut f = line.split_whitespace().map(str::parse::<u64>);
        let sample = Self {
            at_ms: f.next()?.ok()?,
            committed: f.next()?.ok()?,
            ps_restores: f.next()?.ok()?,
        };
        f.next().is_none().then_some(sample)
    }
}

/// How often the chief's sampler reads the ledger.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// The sampler's file beside the events file.
pub fn samples_path(events: &std::path::Path) -> std::path::PathBuf {
    let mut name = events.as_os_str().to_owned();
    name.push(".ledger");
    name.into()
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The step: pull, push, compute; returns which worker incarnation ran it.
pub fn step(ctx: &mut StepContext<'_>, _args: &[u8]) -> Result<Vec<u8>, StepError> {
    let w = ctx.pull(VARIABLE)?;
    ctx.push_dense(VARIABLE, vec![1e-6; w.len()])?;
    std::thread::sleep(STEP_COMPUTE);
    let incarnation = std::env::var(INCARNATION_ENV).unwrap_or_default();
    Ok(format!("{} {incarnation}", ctx.worker_index()).into_bytes())
}

/// The chief: `steps` closures in order, a checkpoint every [`SAVE_EVERY`], one record per
/// commit appended to the file named by [`EVENTS_ENV`].
pub fn run_chief(
    coordinator: &mut ClusterCoordinator,
    steps: usize,
) -> Result<(), CoordinatorError> {
    let events_path = std::env::var(EVENTS_ENV).map_err(|_| RecoveryJobError::NoEventsFile)?;
    let mut events = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&events_path)
        .map_err(|source| RecoveryJobError::Open {
            path: events_path.clone().into(),
            source,
        })?;
    let dir = coordinator
        .checkpoint_dir()
        .ok_or(RecoveryJobError::NoCheckpointDir)?;
    coordinator.create_variable(VariableSpec::zeros(VARIABLE, vec![FLOATS]).partitioned(
        Partitioner::FixedShards {
            num_shards: coordinator.num_ps() as usize,
        },
    ))?;
    coordinator.wait_for_workers(coordinator.num_workers() as usize, Duration::from_secs(60))?;
    let policy = CheckpointPolicy {
        save_every_steps: None,
        save_every: None,
        keep_last: 2,
    };
    let mut manager = CheckpointManager::new(dir, policy, Instant::now())?;
    coordinator.save_checkpoint(&mut manager, 0)?;
    let coordinator: &ClusterCoordinator = coordinator;
    let samples_file = samples_path(std::path::Path::new(&events_path));
    let mut samples =
        std::fs::File::create(&samples_file).map_err(|source| RecoveryJobError::Open {
            path: samples_file,
            source,
        })?;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(ledger) = coordinator.ledger() {
                    let line = format!("{} {} {}", unix_ms(), ledger.committed, ledger.ps_restores);
                    let _ = writeln!(samples, "{line}");
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        let trained = train(coordinator, &mut manager, &mut events, steps);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        trained
    })
}

/// The chief's loop: `steps` closures fetched in order, [`AHEAD`] scheduled, a checkpoint every
/// [`SAVE_EVERY`], one [`Commit`] per fetch appended to `events`.
fn train(
    coordinator: &ClusterCoordinator,
    manager: &mut CheckpointManager,
    events: &mut std::fs::File,
    steps: usize,
) -> Result<(), CoordinatorError> {
    let mut last_save = Instant::now();
    let mut ahead = std::collections::VecDeque::new();
    let (mut scheduled, mut committed) = (0usize, 0u64);
    loop {
        // When a save is due, nothing more is scheduled until what is ahead has drained: a
        // checkpoint is taken with nothing pending.
        let save_due = last_save.elapsed() >= SAVE_EVERY;
        while !save_due && scheduled < steps && ahead.len() < AHEAD {
            ahead.push_back(coordinator.schedule_encoded(STEP, Vec::new())?);
            scheduled += 1;
        }
        let Some(value) = ahead.pop_front() else {
            if save_due && scheduled < steps {
                coordinator.join()?;
                coordinator.save_checkpoint(manager, committed)?;
                last_save = Instant::now();
                continue;
            }
            break;
        };
        let ran = coordinator.fetch_encoded(&value)?;
        committed += 1;
        let ran = String::from_utf8_lossy(&ran).to_string();
        let mut fields = ran
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0));
        let ledger = coordinator.ledger()?;
        let commit = Commit {
            at_ms: unix_ms(),
            step: committed,
            worker: fields.next().unwrap_or(0) as u32,
            incarnation: fields.next().unwrap_or(0),
            redispatched: ledger.redispatched,
            rolled_back: ledger.rolled_back,
            ps_restores: ledger.ps_restores,
        };
        writeln!(events, "{}", commit.to_line()).map_err(RecoveryJobError::Record)?;
    }
    coordinator.join()?;
    Ok(())
}

/// Why the recovery benchmark's chief failed, apart from the coordinator's own errors (carried
/// as [`CoordinatorError::Other`]).
#[derive(Debug, thiserror::Error)]
enum RecoveryJobError {
    /// The benchmark did not name the file to record commits in.
    #[error("{EVENTS_ENV} is not set")]
    NoEventsFile,
    /// The job has no checkpoint directory to save in.
    #[error("no checkpoint_dir configured")]
    NoCheckpointDir,
    /// A file the chief records in could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A commit could not be recorded.
    #[error("recording a commit: {0}")]
    Record(#[source] std::io::Error),
}

impl From<RecoveryJobError> for CoordinatorError {
    fn from(e: RecoveryJobError) -> Self {
        CoordinatorError::other(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_reads_back_as_written_and_a_torn_line_is_skipped() {
        let commit = Commit {
            at_ms: 1_800_000_000_123,
            step: 42,
            worker: 1,
            incarnation: 1_800_000_000_000,
            redispatched: 2,
            rolled_back: 7,
            ps_restores: 1,
        };
        assert_eq!(Commit::parse(&commit.to_line()), Some(commit));
        let line = commit.to_line();
        assert_eq!(Commit::parse(&line[..line.len() - 4]), None);
        assert_eq!(Commit::parse("1 2 x 4 5 6 7"), None);
        assert_eq!(Commit::parse(""), None);
    }
}
