//! The runner: starts the job's launch command as a child in its own process group, applies
//! the plan's faults at their times to the tasks the launcher records in its run directory
//! (`<run_dir>/pids/<role>-<index>.pid`, [`crate::launch::pid_file`]), samples the chief's
//! `/metrics` every second (closures committed, and their step time from dispatch to commit), and ends the job when it outlives `--timeout` or the runner gets
//! Ctrl-C/SIGTERM (SIGTERM to the launcher, which stops its tasks in order; SIGKILL to the
//! whole group after a grace).
//!
//! A signal only ever reaches a process of the job: the pid in a pid file must be in the job's
//! process group (as `/proc` says), or the fault is recorded as not applied.
//!
//! Network faults (partition, loss) go through files: for a plan that has any, the launch
//! command gets `COHORT_NET_FAULTS_DIR=<run_dir>/net` ([`crate::launch::NET_FAULTS_DIR_ENV`]),
//! so the launcher records every task's transport address there and starts each task under
//! its own rules file (`cohort_chaos::rules`). When a network fault starts or ends, the
//! runner rewrites every task's rules file with the faults in force ([`NetFaults`]); each
//! task applies its file within a tenth of a second. A heal is in the timeline as `heal`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort_chaos::plan::FaultPlan;
use cohort_chaos::rules::Rules;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::disk::{DiskFaultError, DiskFaults};
use super::plan::{After, FaultKind, Plan, ScaleTo, Scheduled, Target, Which};
use crate::checkpoint::{list_checkpoints, ListError};
use crate::launch::ScaleError;
use crate::run_report::{
    read_reports, FinalModel, LedgerCounts, GroupGeneration, RunReportError, ServerCounts,
    TaskReport, RUN_REPORT_DIR_ENV,
};
use crate::cluster::{TaskId, TaskType};

/// How often the runner looks at the job, its clock and its faults.
const TICK: Duration = Duration::from_millis(20);
/// Most a kill, pause or term due while its task is being restarted waits for the task's next
/// process (the launcher restarts a task within its backoff).
pub const RESTART_WAIT_MAX: Duration = Duration::from_secs(10);
/// How often the runner looks for the job's first checkpoint.
const CHECKPOINT_LOOK: Duration = Duration::from_millis(100);
/// How long the launcher has to stop its tasks after SIGTERM before the group is SIGKILLed.
pub const STOP_GRACE: Duration = Duration::from_secs(60);
/// Bound on one scrape of the chief's metrics.
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(800);
/// Most panic lines kept for the report (all are counted).
const PANICS_KEPT_MAX: usize = 20;

/// What the runner needs besides the plan.
#[derive(Debug, Clone)]
pub struct RunSetup {
    /// The launch command and its arguments.
    pub command: Vec<String>,
    /// The launcher's run directory (pid files, metrics addresses).
    pub run_dir: PathBuf,
    /// The job's checkpoint directory, when known.
    pub checkpoint_dir: Option<PathBuf>,
    /// Where the job's output is copied (`job.log`).
    pub out_dir: PathBuf,
    /// The job is ended past this.
    pub timeout: Duration,
}

/// A fault as it was applied (or why it was not).
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppliedFault {
    /// Seconds after the job's start.
    pub t_s: f64,
    /// The planned time, seconds.
    pub planned_s: f64,
    /// The kind.
    pub kind: String,
    /// The target as the plan gives it (empty for checkpoint faults).
    pub target: String,
    /// The task it hit (`worker/1`), when it hit one.
    pub task: Option<String>,
    /// The process signalled.
    pub pid: Option<u32>,
    /// Whether it was carried out.
    pub applied: bool,
    /// What was done, or why not.
    pub detail: String,
}

impl AppliedFault {
    /// `fault`, not carried out (yet) at `t_s` seconds, for the reason `detail`.
    fn not_applied(fault: &Scheduled, t_s: f64, detail: String) -> Self {
        Self {
            t_s,
            planned_s: fault.at.as_secs_f64(),
            kind: fault.spec.kind.to_string(),
            target: fault.spec.subject(),
            task: None,
            pid: None,
            applied: false,
            detail,
        }
    }
}

/// One reading of the chief's metrics.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds after the job's start.
    pub t_s: f64,
    /// `cohort_ledger_committed_total` (a MultiWorkerMirrored chief: `cohort_group_step`, its
    /// group's completed steps, here and in `scheduled`).
    pub committed: f64,
    /// `cohort_ledger_scheduled_total`.
    pub scheduled: f64,
    /// Committed closures per second since the previous sample (0 after a chief restart).
    pub steps_per_second: f64,
    /// The mean time from dispatch to commit of the closures committed since the previous
    /// sample (`cohort_chief_step_seconds`), when some were.
    pub step_seconds: Option<f64>,
}

/// What the job's tasks reported at their end (their run reports,
/// [`crate::run_report`]), gathered.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReportedSummary {
    /// The parameter-server chief's ledger.
    pub ledger: Option<LedgerCounts>,
    /// The parameter-server chief's counts, by server.
    pub servers: Vec<ServerCounts>,
    /// Parameter-server restores from a checkpoint (reported only when there was one).
    pub ps_restores: Option<u64>,
    /// Committed closures those restores rolled back and ran again.
    pub rolled_back: Option<u64>,
    /// The chief that reported resumed from a checkpoint (it restarted), restoring the
    /// servers there, so closures after that checkpoint were pushed again.
    pub resumed: bool,
    /// What a MultiWorkerMirrored job's tasks reported (empty for a parameter-server job).
    pub group: ReportedGroup,
    /// Report files that could not be read, each with why.
    pub unreadable: Vec<String>,
}

impl ReportedSummary {
    /// Gathers the tasks' `reports` (by task) and the errors met reading them.
    pub fn gather(reports: &BTreeMap<String, TaskReport>, errors: &[RunReportError]) -> Self {
        let mut summary = Self {
            unreadable: errors.iter().map(ToString::to_string).collect(),
            ..Self::default()
        };
        // The chief's figures; another task's only where the chief reported none.
        let mut ordered: Vec<&TaskReport> = reports.values().collect();
        ordered.sort_by_key(|r| !r.task.starts_with("chief/"));
        for report in ordered {
            if summary.ledger.is_none() && report.ledger.is_some() {
                summary.ledger = report.ledger;
                summary.servers = report.servers.clone();
                summary.servers.sort_unstable();
                summary.ps_restores = report.ps_restores;
                summary.rolled_back = report.rolled_back;
                summary.resumed = report.resumed;
            }
            let group = &mut summary.group;
            group.started |= report.collective;
            if let Some(model) = &report.final_model {
                group.models.insert(report.task.clone(), model.clone());
            }
            if group.generations.is_empty() {
                group.generations = report.group_generations.clone();
            }
        }
        summary
    }
}

/// A MultiWorkerMirrored job as its tasks reported it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReportedGroup {
    /// A task reported the job as a MultiWorkerMirrored one as it started.
    pub started: bool,
    /// Each task's final model, by task (`worker/1`): its latest process's.
    pub models: BTreeMap<String, FinalModel>,
    /// The chief's group generations, in its order.
    pub generations: Vec<GroupGeneration>,
}

impl ReportedGroup {
    /// Whether the job is a MultiWorkerMirrored one.
    pub fn is_collective(&self) -> bool {
        self.started || !self.models.is_empty() || !self.generations.is_empty()
    }
}

/// Everything the run observed.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The launch command's exit code (128 + the signal for a death by signal).
    pub exit_code: Option<i32>,
    /// Why the runner ended the job, if it did.
    pub ended_by_runner: Option<String>,
    /// Seconds the job ran.
    pub duration_s: f64,
    /// The faults, in the order they were due.
    pub faults: Vec<AppliedFault>,
    /// The chief's metrics, once a second.
    pub samples: Vec<Sample>,
    /// Panic lines (`[task] ... panicked at ...`), at most `PANICS_KEPT_MAX`.
    pub panics: Vec<String>,
    /// How many panic lines there were.
    pub panic_count: usize,
    /// What the tasks reported at their end.
    pub summary: ReportedSummary,
}

/// What reading the job's output collects.
#[derive(Debug, Default)]
struct OutputScan {
    panics: Vec<String>,
    panic_count: usize,
}

/// Runs the job under the plan; `stop` is set by Ctrl-C/SIGTERM. An error is a job that
/// could not be started (bad usage).
pub fn run_job(
    plan: &Plan,
    setup: &RunSetup,
    stop: &AtomicBool,
) -> Result<Observed, ChaosRunError> {
    let mut job = Job::launch(plan, setup)?;
    let mut watch = Watch::new(plan, job.started);
    let status = loop {
        if let Some(status) = job.child.try_wait().ok().flatten() {
            break Some(status);
        }
        let now = Instant::now();
        if let Some(status) = watch.stop_when_asked(&mut job, stop, now) {
            break status;
        }
        watch.heal_due(&mut job, now);
        watch.resume_due(now);
        watch.look_for_checkpoints(&job, now);
        watch.apply_due(&mut job, now);
        watch.sample(&job, now);
        std::thread::sleep(TICK);
    };
    Ok(watch.finish(job, status))
}

/// The job the runner launched: its launcher process (the leader of the job's process group),
/// the setup as the job sees it, the faults it can carry out on the network and the disk, and
/// the threads copying its output.
struct Job {
    child: std::process::Child,
    /// The launcher's pid, the job's process group.
    launcher: u32,
    started: Instant,
    /// The setup as the job sees it (under a disk_full fault, its checkpoints are in its own
    /// namespace).
    setup: RunSetup,
    network: NetFaults,
    disk: Option<DiskFaults>,
    readers: Vec<std::thread::JoinHandle<()>>,
    scan: Arc<Mutex<OutputScan>>,
    /// Where every task writes its run report.
    report_dir: PathBuf,
}

impl Job {
    /// Starts `setup`'s command as a process group of its own, its output copied to
    /// `job.log` in the out directory (and to the runner's own), with what the plan's faults
    /// need (a disk of its own for disk_full, the network faults' directory).
    fn launch(plan: &Plan, setup: &RunSetup) -> Result<Self, ChaosRunError> {
        let program = setup.command.first().ok_or(ChaosRunError::NoCommand)?;
        std::fs::create_dir_all(&setup.out_dir).map_err(|source| ChaosRunError::OutDir {
            dir: setup.out_dir.clone(),
            source,
        })?;
        let log_path = setup.out_dir.join("job.log");
        let log = match std::fs::File::create(&log_path) {
            Ok(log) => log,
            Err(source) => {
                return Err(ChaosRunError::CreateLog {
                    path: log_path,
                    source,
                })
            }
        };
        // Pid files of an earlier run in the same directory would name processes long gone.
        let _ = std::fs::remove_dir_all(setup.run_dir.join("pids"));
        let _ = std::fs::remove_dir_all(setup.run_dir.join("metrics"));
        let network = NetFaults::new(&setup.run_dir, plan.seed);
        let (mut command, mut disk) = job_command(plan, setup, program)?;
        // Every task writes its run report here; an earlier run's would be read as this one's.
        let report_dir = setup.out_dir.join("reports");
        let _ = std::fs::remove_dir_all(&report_dir);
        command.env(RUN_REPORT_DIR_ENV, &report_dir);
        if plan.faults.iter().any(|f| f.kind.is_network()) {
            let _ = std::fs::remove_dir_all(&network.dir);
            command.env(crate::launch::NET_FAULTS_DIR_ENV, &network.dir);
        }
        let mut child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ChaosRunError::Spawn {
                program: program.clone(),
                source,
            })?;
        let started = Instant::now();
        let launcher = child.id();
        // Under a disk_full fault the checkpoints the job writes are in its own namespace: the
        // runner watches them, and deletes or corrupts them, there.
        let live = match &mut disk {
            Some(disk) => {
                disk.started(launcher);
                let mut live = setup.clone();
                live.checkpoint_dir = Some(disk.job_view()?);
                live
            }
            None => setup.clone(),
        };
        let scan = Arc::new(Mutex::new(OutputScan::default()));
        let log = Arc::new(Mutex::new(log));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(read_output(out, false, Arc::clone(&scan), Arc::clone(&log)));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(read_output(err, true, Arc::clone(&scan), Arc::clone(&log)));
        }
        Ok(Self {
            child,
            launcher,
            started,
            setup: live,
            network,
            disk,
            readers,
            scan,
            report_dir,
        })
    }
}

/// The job's command: as given, or under a disk_full fault wrapped to run with a checkpoint
/// disk of the plan's size (then the disk's faults too).
fn job_command(
    plan: &Plan,
    setup: &RunSetup,
    program: &str,
) -> Result<(Command, Option<DiskFaults>), ChaosRunError> {
    if !plan.faults.iter().any(|f| f.kind == FaultKind::DiskFull) {
        let mut command = Command::new(program);
        crate::process::with_system_huge_pages(&mut command);
        command.args(&setup.command[1..]);
        return Ok((command, None));
    }
    let checkpoint_dir = setup
        .checkpoint_dir
        .as_ref()
        .ok_or(ChaosRunError::DiskFullNoCheckpointDir)?;
    let absolute = |path: &Path| {
        std::path::absolute(path).map_err(|source| ChaosRunError::DiskFullPath {
            path: path.to_path_buf(),
            source,
        })
    };
    let checkpoint_dir = absolute(checkpoint_dir)?;
    let real = absolute(&setup.run_dir.join("chaos-disk"))?;
    let (mut command, disk) =
        DiskFaults::wrap(&setup.command, &checkpoint_dir, &real, plan.disk_size_mib)?;
    crate::process::with_system_huge_pages(&mut command);
    Ok((command, Some(disk)))
}

/// What the runner keeps while the job runs: the faults still to carry out, the checkpoints
/// seen (faults wait for them), the tasks paused, the chief's samples, whether it is stopping
/// the job, and what it observed.
struct Watch {
    observed: Observed,
    pending: Vec<Scheduled>,
    /// The most checkpoints a fault waits for.
    checkpoints_awaited: usize,
    /// When the runner saw the 1st, 2nd, ... distinct checkpoint, up to `checkpoints_awaited`.
    checkpoints_seen: Vec<Instant>,
    checkpoint_names: std::collections::BTreeSet<u64>,
    next_checkpoint_look: Instant,
    /// Paused tasks: until when, their pid, their name.
    paused: Vec<(Instant, u32, String)>,
    next_sample: Instant,
    last_sample: Option<(Instant, f64, (f64, f64))>,
    /// Since when the runner is stopping the job (interrupted, or past the timeout).
    stopping: Option<Instant>,
    /// Signal faults due while their task was between processes: since when they wait.
    awaiting_restart: std::collections::HashMap<usize, Instant>,
}

impl Watch {
    fn new(plan: &Plan, started: Instant) -> Self {
        let pending = plan.schedule();
        let checkpoints_awaited = pending
            .iter()
            .map(|f| f.spec.after.checkpoints())
            .max()
            .unwrap_or(0) as usize;
        Self {
            observed: Observed::default(),
            pending,
            checkpoints_awaited,
            checkpoints_seen: Vec::new(),
            checkpoint_names: std::collections::BTreeSet::new(),
            next_checkpoint_look: started,
            paused: Vec::new(),
            next_sample: started,
            last_sample: None,
            stopping: None,
            awaiting_restart: std::collections::HashMap::new(),
        }
    }

    /// Stops the job when the runner was interrupted or the job outlived the timeout (SIGTERM
    /// to the launcher, paused tasks resumed); once the stop's grace is over, SIGKILLs the
    /// job's group and returns how it ended, for the caller to stop watching.
    fn stop_when_asked(
        &mut self,
        job: &mut Job,
        stop: &AtomicBool,
        now: Instant,
    ) -> Option<Option<std::process::ExitStatus>> {
        let Some(since) = self.stopping else {
            let why = if stop.load(Ordering::SeqCst) {
                Some("the runner was interrupted (Ctrl-C or SIGTERM)".to_string())
            } else if now.duration_since(job.started) > job.setup.timeout {
                Some(format!(
                    "the job outlived --timeout {}",
                    crate::cluster::format_duration(job.setup.timeout)
                ))
            } else {
                None
            };
            if let Some(why) = why {
                eprintln!("[chaos] {why}: stopping the job");
                resume_all(&mut self.paused);
                let _ = kill(Pid::from_raw(job.launcher as i32), Signal::SIGTERM);
                self.observed.ended_by_runner = Some(why);
                self.stopping = Some(now);
            }
            return None;
        };
        if now.duration_since(since) > STOP_GRACE {
            let _ = killpg(Pid::from_raw(job.launcher as i32), Signal::SIGKILL);
            return Some(job.child.wait().ok());
        }
        None
    }

    /// Lifts the network faults, and frees a full disk, whose time is over.
    fn heal_due(&mut self, job: &mut Job, now: Instant) {
        for healed in job.network.heal_due(now, job.started) {
            eprintln!(
                "[chaos] {:.2}s heal {}: {}",
                healed.t_s, healed.target, healed.detail
            );
            self.observed.faults.push(healed);
        }
        if let Some(freed) = job.disk.as_mut().and_then(|d| d.free_due(now)) {
            eprintln!(
                "[chaos] {:.2}s heal checkpoints: {}",
                now.duration_since(job.started).as_secs_f64(),
                freed.detail
            );
            self.observed.faults.push(AppliedFault {
                t_s: now.duration_since(job.started).as_secs_f64(),
                planned_s: freed.planned_s,
                kind: "heal".into(),
                target: "checkpoints".into(),
                task: None,
                pid: None,
                applied: freed.freed,
                detail: freed.detail,
            });
        }
    }

    /// Resumes what a pause stopped, when its time comes.
    fn resume_due(&mut self, now: Instant) {
        self.paused.retain(|(until, pid, task)| {
            if now >= *until {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGCONT);
                eprintln!("[chaos] SIGCONT {task} (pid {pid})");
                false
            } else {
                true
            }
        });
    }

    /// Records the checkpoints the job wrote since the last look (faults wait for them).
    fn look_for_checkpoints(&mut self, job: &Job, now: Instant) {
        if self.checkpoints_seen.len() >= self.checkpoints_awaited
            || now < self.next_checkpoint_look
        {
            return;
        }
        self.next_checkpoint_look = now + CHECKPOINT_LOOK;
        let Some(root) = &job.setup.checkpoint_dir else {
            return;
        };
        for entry in list_checkpoints(root).unwrap_or_default() {
            if self.checkpoints_seen.len() < self.checkpoints_awaited
                && self.checkpoint_names.insert(entry.step)
            {
                self.checkpoints_seen.push(now);
                eprintln!(
                    "[chaos] {:.2}s checkpoint {} seen ({})",
                    now.duration_since(job.started).as_secs_f64(),
                    self.checkpoints_seen.len(),
                    entry.dir.display()
                );
            }
        }
    }

    /// Carries out every fault now due. A signal for a task between two processes (killed,
    /// the launcher restarting it) is for its next process: it waits for it, a while.
    fn apply_due(&mut self, job: &mut Job, now: Instant) {
        // Faults put back this tick: their task is being restarted.
        let mut put_back: Vec<usize> = Vec::new();
        while self.stopping.is_none() {
            let due = self.pending.iter().position(|f| {
                let base = match f.spec.after {
                    After::Start => Some(job.started),
                    After::Checkpoint(n) => self.checkpoints_seen.get(n as usize - 1).copied(),
                };
                !put_back.contains(&f.index) && base.is_some_and(|base| now >= base + f.at)
            });
            let Some(position) = due else { break };
            let fault = self.pending.remove(position);
            let signals = matches!(
                fault.spec.kind,
                FaultKind::Kill | FaultKind::Pause | FaultKind::Term
            );
            if signals && !task_running(&fault, &job.setup, job.launcher) {
                let since = *self.awaiting_restart.entry(fault.index).or_insert(now);
                if now.duration_since(since) < RESTART_WAIT_MAX {
                    put_back.push(fault.index);
                    self.pending.insert(position, fault);
                    continue;
                }
            }
            let mut applied = apply(
                &fault,
                &job.setup,
                job.launcher,
                job.started,
                &mut self.paused,
                &mut job.network,
                &mut job.disk,
            );
            if let Some(since) = self.awaiting_restart.remove(&fault.index) {
                applied.detail = format!(
                    "{} (after waiting {:.2}s for the task's next process)",
                    applied.detail,
                    now.duration_since(since).as_secs_f64()
                );
            }
            eprintln!(
                "[chaos] {:.2}s {} {}: {}",
                applied.t_s,
                applied.kind,
                applied.task.as_deref().unwrap_or(&applied.target),
                applied.detail
            );
            self.observed.faults.push(applied);
        }
    }

    /// Scrapes the chief's metrics once a second.
    fn sample(&mut self, job: &Job, now: Instant) {
        if now >= self.next_sample {
            self.next_sample = now + Duration::from_secs(1);
            if let Some(sample) = scrape_chief(&job.setup.run_dir, job.started, &mut self.last_sample)
            {
                self.observed.samples.push(sample);
            }
        }
    }

    /// What was observed once the job ended (`status`): the faults never carried out, what
    /// the job printed of panics, and what its tasks reported. Ends any task still running.
    fn finish(mut self, job: Job, status: Option<std::process::ExitStatus>) -> Observed {
        resume_all(&mut self.paused);
        let mut observed = self.observed;
        observed.duration_s = job.started.elapsed().as_secs_f64();
        observed.exit_code = status.map(exit_code);
        // Faults never due before the job ended.
        for fault in self.pending {
            let detail = match fault.spec.after {
                After::Checkpoint(n) if self.checkpoints_seen.len() < n as usize => format!(
                    "not applied: the job ended after {} of the {n} checkpoint(s) it waited for",
                    self.checkpoints_seen.len()
                ),
                _ => "not applied: the job had ended".into(),
            };
            let unapplied = AppliedFault::not_applied(&fault, observed.duration_s, detail);
            observed.faults.push(unapplied);
        }
        // Tasks still running (the launcher died alone) are ended with it.
        let _ = killpg(Pid::from_raw(job.launcher as i32), Signal::SIGKILL);
        for reader in job.readers {
            let _ = reader.join();
        }
        let scan = std::mem::take(&mut *job.scan.lock().unwrap_or_else(|p| p.into_inner()));
        observed.panics = scan.panics;
        observed.panic_count = scan.panic_count;
        let (reports, errors) = read_reports(&job.report_dir);
        observed.summary = ReportedSummary::gather(&reports, &errors);
        observed
    }
}

/// Why a job could not be started under a plan (bad usage: nothing ran).
#[derive(Debug, thiserror::Error)]
pub enum ChaosRunError {
    /// Nothing after `--`.
    #[error("no launch command given after `--`")]
    NoCommand,
    /// The output directory could not be made.
    #[error("--out {}: {source}", dir.display())]
    OutDir {
        /// The directory.
        dir: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// `job.log` could not be created.
    #[error("cannot write {}: {source}", path.display())]
    CreateLog {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// A disk_full fault, but the launch command names no checkpoint directory.
    #[error(
        "disk_full: the job's checkpoint directory is not known (give --checkpoint-dir in the \
         launch command)"
    )]
    DiskFullNoCheckpointDir,
    /// A directory of the disk_full fault has no absolute path.
    #[error("disk_full: {}: {source}", path.display())]
    DiskFullPath {
        /// The directory.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The job cannot run over a filesystem of its own (the disk_full fault).
    #[error(transparent)]
    Disk(#[from] DiskFaultError),
    /// The launch command could not be started.
    #[error("cannot start the launch command {program:?}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why not.
        source: std::io::Error,
    },
}

/// Why a fault was not carried out (the timeline says so; the run goes on).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A scale fault without a number of tasks (the plan's parser refuses one).
    #[error("no number of tasks to ask for")]
    NoScale,
    /// The launcher refused the scale.
    #[error(transparent)]
    Scale(#[from] ScaleError),
    /// A task fault without a target (the plan's parser refuses one).
    #[error("no target")]
    NoTarget,
    /// A role target with no task of that role recorded.
    #[error("no {role} task is recorded in the run directory")]
    NoTaskRecorded {
        /// The role.
        role: TaskType,
    },
    /// The task's pid file cannot be read.
    #[error("{task} has no pid file ({}: {source})", path.display())]
    NoPidFile {
        /// The task.
        task: TaskId,
        /// Its pid file.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The task's pid file holds no pid.
    #[error("{} holds no pid", path.display())]
    NoPid {
        /// The pid file.
        path: PathBuf,
    },
    /// The pid recorded is not a process of the job.
    #[error("{task} is not running (pid {pid} is not in the job's process group)")]
    NotRunning {
        /// The task.
        task: TaskId,
        /// The pid its file records.
        pid: u32,
    },
    /// The signal could not be sent.
    #[error("{signal} to pid {pid}: {source}")]
    Signal {
        /// The signal.
        signal: Signal,
        /// The process.
        pid: u32,
        /// Why not.
        source: nix::errno::Errno,
    },
    /// The peer drawn for a network fault is its target.
    #[error("the peer drawn is the target itself ({task})")]
    PeerIsTarget {
        /// The task.
        task: TaskId,
    },
    /// A task has no transport address recorded.
    #[error(
        "{task} has no transport address in {} (was the job started by `cohort launch` or \
         `cohort demo`?)",
        dir.display()
    )]
    NoAddress {
        /// The task.
        task: TaskId,
        /// Where the addresses are recorded.
        dir: PathBuf,
    },
    /// The directory of transport addresses cannot be read.
    #[error("no transport addresses in {}: {source}", dir.display())]
    NoAddresses {
        /// The directory.
        dir: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// An address file holds no address.
    #[error("{} holds no ip:port address", path.display())]
    BadAddress {
        /// The file.
        path: PathBuf,
    },
    /// A task's rules file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    WriteRules {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// A checkpoint fault, but the job's checkpoint directory is not known.
    #[error("the job's checkpoint directory is not known")]
    NoCheckpointDir,
    /// The checkpoints cannot be listed.
    #[error(transparent)]
    ListCheckpoints(#[from] ListError),
    /// A checkpoint could not be deleted.
    #[error("cannot delete {}: {source}", dir.display())]
    DeleteCheckpoint {
        /// Its directory.
        dir: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// No checkpoint to corrupt.
    #[error("no checkpoint under {}", root.display())]
    NoCheckpoint {
        /// The checkpoint directory.
        root: PathBuf,
    },
    /// A checkpoint's directory or shard file could not be read or written.
    #[error("{}: {source}", path.display())]
    Shard {
        /// The directory or file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The newest checkpoint has no shard file.
    #[error("{} has no shard file", dir.display())]
    NoShard {
        /// Its directory.
        dir: PathBuf,
    },
    /// The shard file drawn is empty.
    #[error("{} is empty", path.display())]
    EmptyShard {
        /// The file.
        path: PathBuf,
    },
    /// A disk_full fault, but the job was not started over a filesystem of its own.
    #[error("the job does not run over a checkpoint filesystem of its own")]
    NoCheckpointFilesystem,
    /// The disk-full fault failed.
    #[error(transparent)]
    Disk(#[from] DiskFaultError),
}

/// A child's exit status as one code: its own, or 128 + N after death by signal N.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn resume_all(paused: &mut Vec<(Instant, u32, String)>) {
    for (_, pid, _) in paused.drain(..) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
    }
}

/// Copies a stream of the job's output to ours and to `job.log`, and scans it.
fn read_output<R: Read + Send + 'static>(
    reader: R,
    to_stderr: bool,
    scan: Arc<Mutex<OutputScan>>,
    log: Arc<Mutex<std::fs::File>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match (&mut reader).take(64 * 1024).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            // The whole line in one write: standard error is unbuffered, and another reader's
            // line must not land inside this one.
            let text = format!("{line}\n");
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(text.as_bytes())
            } else {
                std::io::stdout().lock().write_all(text.as_bytes())
            };
            if let Ok(mut file) = log.lock() {
                let _ = writeln!(file, "{line}");
            }
            let mut scan = scan.lock().unwrap_or_else(|p| p.into_inner());
            scan_line(&mut scan, line);
        }
    })
}

fn scan_line(scan: &mut OutputScan, line: &str) {
    if line.contains("panicked at") {
        scan.panic_count += 1;
        if scan.panics.len() < PANICS_KEPT_MAX {
            scan.panics.push(line.to_string());
        }
    }
}

/// Carries out one fault.
fn apply(
    fault: &Scheduled,
    setup: &RunSetup,
    launcher: u32,
    started: Instant,
    paused: &mut Vec<(Instant, u32, String)>,
    network: &mut NetFaults,
    disk: &mut Option<DiskFaults>,
) -> AppliedFault {
    let mut out = AppliedFault::not_applied(fault, started.elapsed().as_secs_f64(), String::new());
    let result = match fault.spec.kind {
        FaultKind::Kill | FaultKind::Pause | FaultKind::Term => {
            signal_task(fault, setup, launcher, paused, &mut out)
        }
        FaultKind::DeleteCheckpoint => delete_checkpoint(fault, setup),
        FaultKind::CorruptCheckpoint => corrupt_checkpoint(fault, setup),
        FaultKind::Partition | FaultKind::Loss => network.start(fault, setup, &mut out),
        FaultKind::DiskFull => match (disk.as_mut(), fault.spec.lasts) {
            (Some(disk), Some(lasts)) => disk
                .fill(Instant::now(), lasts, (fault.at + lasts).as_secs_f64())
                .map_err(ApplyError::from),
            _ => Err(ApplyError::NoCheckpointFilesystem),
        },
        FaultKind::Scale => scale(fault, setup),
    };
    match result {
        Ok(detail) => {
            out.applied = true;
            out.detail = detail;
        }
        Err(why) => out.detail = format!("not applied: {why}"),
    }
    out
}

/// Asks the job's launcher for the scale fault's number of workers or servers, as `cohort
/// scale` does (refused where the job was not launched elastic, or the number is out of its
/// range).
fn scale(fault: &Scheduled, setup: &RunSetup) -> Result<String, ApplyError> {
    match fault.spec.scale {
        Some(ScaleTo::Workers(n)) => crate::launch::request_scale(&setup.run_dir, n)?,
        Some(ScaleTo::Ps(n)) => crate::launch::request_scale_servers(&setup.run_dir, n)?,
        None => return Err(ApplyError::NoScale),
    };
    Ok(format!("asked the launcher for {}", fault.spec.subject()))
}

/// The task a signal fault hits and its current process, from the launcher's pid file.
/// The inner `Err` is a task named but without a process recorded (between two of them).
fn task_pid(
    fault: &Scheduled,
    setup: &RunSetup,
) -> Result<(TaskId, Result<u32, ApplyError>), ApplyError> {
    let target = fault.spec.target.ok_or(ApplyError::NoTarget)?;
    let task = resolve(target, fault.pick, &setup.run_dir)?;
    let pid_path = crate::launch::pid_file(&setup.run_dir, task);
    let pid = match std::fs::read_to_string(&pid_path) {
        Err(source) => Err(ApplyError::NoPidFile {
            task,
            path: pid_path,
            source,
        }),
        Ok(text) => text
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or(ApplyError::NoPid { path: pid_path }),
    };
    Ok((task, pid))
}

/// Whether the task a signal fault hits has a process in the job now (not while the launcher
/// restarts it). A fault whose task cannot be named counts as running: it fails as it is.
fn task_running(fault: &Scheduled, setup: &RunSetup, job_group: u32) -> bool {
    match task_pid(fault, setup) {
        Ok((_, Ok(pid))) => group_of(pid) == Some(job_group),
        Ok((_, Err(_))) => false,
        Err(_) => true,
    }
}

fn signal_task(
    fault: &Scheduled,
    setup: &RunSetup,
    job_group: u32,
    paused: &mut Vec<(Instant, u32, String)>,
    out: &mut AppliedFault,
) -> Result<String, ApplyError> {
    let (task, pid) = task_pid(fault, setup)?;
    out.task = Some(task.to_string());
    let pid = pid?;
    out.pid = Some(pid);
    if group_of(pid) != Some(job_group) {
        return Err(ApplyError::NotRunning { task, pid });
    }
    let signal = match fault.spec.kind {
        FaultKind::Kill => Signal::SIGKILL,
        FaultKind::Pause => Signal::SIGSTOP,
        _ => Signal::SIGTERM,
    };
    kill(Pid::from_raw(pid as i32), signal).map_err(|source| ApplyError::Signal {
        signal,
        pid,
        source,
    })?;
    if fault.spec.kind == FaultKind::Pause {
        let pause = fault.spec.lasts.unwrap_or_default();
        paused.push((Instant::now() + pause, pid, task.to_string()));
        return Ok(format!(
            "SIGSTOP pid {pid}, SIGCONT in {}",
            crate::cluster::format_duration(pause)
        ));
    }
    Ok(format!("{signal} pid {pid}"))
}

/// The task `target` names: its index, or one drawn by `pick` among the tasks of its role with
/// a pid file.
fn resolve(target: Target, pick: u64, run_dir: &Path) -> Result<TaskId, ApplyError> {
    let index = match target.index {
        Some(i) => i,
        None => {
            let running = recorded_indices(run_dir, target.role);
            if running.is_empty() {
                return Err(ApplyError::NoTaskRecorded { role: target.role });
            }
            running[(pick % running.len() as u64) as usize]
        }
    };
    Ok(TaskId::new(target.role, index))
}

/// The network faults in force, and the tasks' rules files that say them (see the module
/// docs).
#[derive(Debug)]
pub struct NetFaults {
    /// `<run_dir>/net`: the launcher's address files and the tasks' rules files.
    pub dir: PathBuf,
    seed: u64,
    active: Vec<ActiveNet>,
}

/// One network fault in force.
#[derive(Debug, Clone)]
struct ActiveNet {
    kind: FaultKind,
    task: TaskId,
    /// The other end (`None`: every other task).
    peer: Option<TaskId>,
    probability: f64,
    started: Instant,
    until: Instant,
    planned_end_s: f64,
}

impl ActiveNet {
    fn describe(&self) -> String {
        let peer = self
            .peer
            .map_or_else(|| "every other task".to_string(), |p| p.to_string());
        match self.kind {
            FaultKind::Loss => {
                format!("loss {} between {} and {peer}", self.probability, self.task)
            }
            _ => format!("partition between {} and {peer}", self.task),
        }
    }
}

impl NetFaults {
    /// No fault in force; files under `<run_dir>/net`; per-task seeds from `seed`.
    pub fn new(run_dir: &Path, seed: u64) -> Self {
        Self {
            dir: run_dir.join("net"),
            seed,
            active: Vec::new(),
        }
    }

    /// Starts a partition or loss: its tasks resolved, every rules file rewritten.
    fn start(
        &mut self,
        fault: &Scheduled,
        setup: &RunSetup,
        out: &mut AppliedFault,
    ) -> Result<String, ApplyError> {
        let target = fault.spec.target.ok_or(ApplyError::NoTarget)?;
        let task = resolve(target, fault.pick, &setup.run_dir)?;
        out.task = Some(task.to_string());
        let peer = match fault.spec.peer {
            None => None,
            Some(peer) => {
                let peer = resolve(peer, fault.pick.rotate_left(32), &setup.run_dir)?;
                if peer == task {
                    return Err(ApplyError::PeerIsTarget { task });
                }
                Some(peer)
            }
        };
        let addrs = self.addresses()?;
        for t in std::iter::once(task).chain(peer) {
            if !addrs.contains_key(&t) {
                return Err(self.no_address(t));
            }
        }
        let lasts = fault.spec.lasts.unwrap_or_default();
        let now = Instant::now();
        let active = ActiveNet {
            kind: fault.spec.kind,
            task,
            peer,
            probability: fault.spec.probability.unwrap_or(0.0),
            started: now,
            until: now + lasts,
            planned_end_s: (fault.at + lasts).as_secs_f64(),
        };
        let what = active.describe();
        self.active.push(active);
        let written = self.write(&addrs)?;
        Ok(format!(
            "{what} for {} ({} rules files)",
            crate::cluster::format_duration(lasts),
            written
        ))
    }

    /// Ends the faults whose time is over, rewriting the rules files; one `heal` entry each.
    fn heal_due(&mut self, now: Instant, job_started: Instant) -> Vec<AppliedFault> {
        let (over, kept): (Vec<ActiveNet>, Vec<ActiveNet>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| now >= a.until);
        self.active = kept;
        if over.is_empty() {
            return Vec::new();
        }
        let written = self.addresses().and_then(|addrs| self.write(&addrs));
        over.into_iter()
            .map(|a| AppliedFault {
                t_s: now.duration_since(job_started).as_secs_f64(),
                planned_s: a.planned_end_s,
                kind: "heal".into(),
                target: a.task.to_string(),
                task: Some(a.task.to_string()),
                pid: None,
                applied: written.is_ok(),
                detail: match &written {
                    Ok(_) => format!(
                        "lifted the {} after {:.1}s",
                        a.describe(),
                        now.duration_since(a.started).as_secs_f64()
                    ),
                    Err(e) => format!("not applied: {e}"),
                },
            })
            .collect()
    }

    /// Every task's transport address, as the launcher recorded it.
    fn addresses(&self) -> Result<BTreeMap<TaskId, SocketAddr>, ApplyError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| ApplyError::NoAddresses {
            dir: self.dir.clone(),
            source,
        })?;
        let mut out = BTreeMap::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".addr") else {
                continue;
            };
            let Some((role, index)) = stem.rsplit_once('-') else {
                continue;
            };
            let (Ok(role), Ok(index)) = (role.parse::<TaskType>(), index.parse::<u32>()) else {
                continue;
            };
            let path = entry.path();
            let addr = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<SocketAddr>().ok())
                .ok_or(ApplyError::BadAddress { path })?;
            out.insert(TaskId::new(role, index), addr);
        }
        Ok(out)
    }

    /// Writes every task's rules file for the faults in force (each replaced whole, by a
    /// rename, so a task never reads half a file); returns how many.
    fn write(&self, addrs: &BTreeMap<TaskId, SocketAddr>) -> Result<usize, ApplyError> {
        let address = |task: TaskId| {
            addrs
                .get(&task)
                .copied()
                .ok_or_else(|| self.no_address(task))
        };
        let mut plan = FaultPlan::none(0);
        for a in &self.active {
            let here = address(a.task)?;
            let peers: Vec<SocketAddr> = match a.peer {
                Some(p) => vec![address(p)?],
                None => addrs
                    .iter()
                    .filter(|(t, _)| **t != a.task)
                    .map(|(_, addr)| *addr)
                    .collect(),
            };
            for peer in peers {
                let pair = if here <= peer {
                    (here, peer)
                } else {
                    (peer, here)
                };
                match a.kind {
                    FaultKind::Loss => {
                        let p = plan.pair_loss.entry(pair).or_insert(0.0);
                        *p = p.max(a.probability);
                    }
                    _ => {
                        plan.partitions.insert(pair);
                    }
                }
            }
        }
        for task in addrs.keys() {
            plan.seed = task_seed(self.seed, *task);
            let path = crate::launch::net_rules_file(&self.dir, *task);
            let tmp = path.with_extension("rules.tmp");
            if let Err(source) = std::fs::write(&tmp, Rules::render(&plan))
                .and_then(|()| std::fs::rename(&tmp, &path))
            {
                return Err(ApplyError::WriteRules { path, source });
            }
        }
        Ok(addrs.len())
    }

    /// `task` has no address in the launcher's files (an address file gone since the fault
    /// started, or a job not started by the launcher).
    fn no_address(&self, task: TaskId) -> ApplyError {
        ApplyError::NoAddress {
            task,
            dir: self.dir.clone(),
        }
    }
}

/// The seed of `task`'s loss draws: the plan's, mixed with the task (splitmix64).
fn task_seed(seed: u64, task: TaskId) -> u64 {
    let role = TaskType::ALL
        .iter()
        .position(|r| *r == task.task_type)
        .unwrap_or(0) as u64;
    let mut z = seed ^ (role << 32 | u64::from(task.index)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The indices of `role` with a pid file, ascending.
fn recorded_indices(run_dir: &Path, role: TaskType) -> Vec<u32> {
    let prefix = format!("{role}-");
    let mut out: Vec<u32> = std::fs::read_dir(run_dir.join("pids"))
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix(&prefix)?
                .strip_suffix(".pid")?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// The process group of `pid`, from `/proc/<pid>/stat`.
/// The process group of live process `pid`; `None` for a process that has exited, a zombie
/// not reaped yet among them (killed a moment ago, its task about to be restarted: a signal
/// for the task is for its next process).
fn group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(1)?.parse().ok()
}

fn checkpoint_root(setup: &RunSetup) -> Result<&Path, ApplyError> {
    setup
        .checkpoint_dir
        .as_deref()
        .ok_or(ApplyError::NoCheckpointDir)
}

fn delete_checkpoint(fault: &Scheduled, setup: &RunSetup) -> Result<String, ApplyError> {
    let root = checkpoint_root(setup)?;
    let entries = list_checkpoints(root)?;
    let chosen: Vec<_> = match fault.spec.which {
        Which::All => entries.iter().collect(),
        Which::Newest => entries.last().into_iter().collect(),
    };
    if chosen.is_empty() {
        return Ok(format!("no checkpoint under {} to delete", root.display()));
    }
    let mut steps = Vec::new();
    for entry in chosen {
        std::fs::remove_dir_all(&entry.dir).map_err(|source| ApplyError::DeleteCheckpoint {
            dir: entry.dir.clone(),
            source,
        })?;
        steps.push(entry.step.to_string());
    }
    Ok(format!(
        "deleted the checkpoint(s) of step {}",
        steps.join(", ")
    ))
}

fn corrupt_checkpoint(fault: &Scheduled, setup: &RunSetup) -> Result<String, ApplyError> {
    let root = checkpoint_root(setup)?;
    let entries = list_checkpoints(root)?;
    let newest = entries.last().ok_or_else(|| ApplyError::NoCheckpoint {
        root: root.to_path_buf(),
    })?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ApplyError::Shard { path, source }
    };
    let mut shards: Vec<PathBuf> = std::fs::read_dir(&newest.dir)
        .map_err(io(&newest.dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shard-") && n.ends_with(".safetensors"))
        })
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(ApplyError::NoShard {
            dir: newest.dir.clone(),
        });
    }
    let file = &shards[(fault.pick % shards.len() as u64) as usize];
    let mut handle = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(io(file))?;
    let len = handle.metadata().map_err(io(file))?.len();
    if len == 0 {
        return Err(ApplyError::EmptyShard { path: file.clone() });
    }
    // Another draw from the same number: the byte, and the bit within it.
    let offset = (fault.pick / shards.len() as u64) % len;
    let bit = 1u8 << ((fault.pick >> 56) % 8);
    let mut byte = [0u8];
    handle.seek(SeekFrom::Start(offset)).map_err(io(file))?;
    handle.read_exact(&mut byte).map_err(io(file))?;
    byte[0] ^= bit;
    handle.seek(SeekFrom::Start(offset)).map_err(io(file))?;
    handle.write_all(&byte).map_err(io(file))?;
    handle.sync_all().map_err(io(file))?;
    Ok(format!(
        "flipped bit {} of byte {offset} of {}",
        bit.trailing_zeros(),
        file.display()
    ))
}

/// One scrape of the chief's metrics, when it serves them.
fn scrape_chief(
    run_dir: &Path,
    started: Instant,
    last: &mut Option<(Instant, f64, (f64, f64))>,
) -> Option<Sample> {
    let addr_file = crate::launch::metrics_addr_file(run_dir, TaskId::new(TaskType::Chief, 0));
    let addr: SocketAddr = std::fs::read_to_string(addr_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let text = http_get(addr, "/metrics")?;
    // A parameter-server job's chief counts committed closures; a MultiWorkerMirrored one's
    // the steps its group completed.
    let (committed, scheduled, steps) = match metric(&text, "cohort_ledger_committed_total") {
        Some(committed) => (
            committed,
            metric(&text, "cohort_ledger_scheduled_total").unwrap_or(0.0),
            (
                metric(&text, "cohort_chief_step_seconds_sum").unwrap_or(0.0),
                metric(&text, "cohort_chief_step_seconds_count").unwrap_or(0.0),
            ),
        ),
        None => {
            let step = metric(&text, "cohort_group_step")?;
            (
                step,
                step,
                (
                    metric(&text, "cohort_group_step_seconds_sum").unwrap_or(0.0),
                    metric(&text, "cohort_group_step_seconds_count").unwrap_or(0.0),
                ),
            )
        }
    };
    let now = Instant::now();
    let (rate, step_seconds) = match *last {
        Some((at, before, (sum, count))) if committed >= before => (
            (committed - before) / now.duration_since(at).as_secs_f64().max(1e-3),
            (steps.1 > count).then(|| (steps.0 - sum) / (steps.1 - count)),
        ),
        _ => (0.0, None),
    };
    *last = Some((now, committed, steps));
    Some(Sample {
        t_s: now.duration_since(started).as_secs_f64(),
        committed,
        scheduled,
        steps_per_second: rate,
        step_seconds,
    })
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    crate::metrics::http_get(addr, path, SCRAPE_TIMEOUT)
}

/// The value of an unlabelled sample `name` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let rest = if rest.starts_with('{') {
            &rest[rest.find('}')? + 1..]
        } else {
            rest
        };
        rest.strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a task killed a moment ago stays a zombie until the launcher reaps it, and
    /// a second kill due 20 ms later hit that zombie instead of waiting for the task's next
    /// process. A zombie counts as gone.
    #[test]
    fn a_killed_process_not_reaped_yet_is_not_running() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let pid = child.id();
        let own_group = group_of(std::process::id()).expect("this process has a group");
        assert_eq!(
            group_of(pid),
            Some(own_group),
            "a live child is in our group"
        );
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL");
        let zombie = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, s)| s.starts_with('Z'))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !zombie(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            zombie(pid),
            "the killed child is a zombie until it is reaped"
        );
        assert_eq!(group_of(pid), None);
        child.wait().expect("reaped");
    }

    #[test]
    fn panic_lines_are_counted_from_the_output() {
        let mut scan = OutputScan::default();
        scan_line(&mut scan, "[worker/1] thread 'main' panicked at src/x.rs:1:1:");
        scan_line(&mut scan, "[chief/0]   ledger: 40 closures scheduled");
        assert_eq!(scan.panic_count, 1);
        assert_eq!(scan.panics.len(), 1);
    }

    #[test]
    fn a_parameter_server_chiefs_report_is_gathered() {
        let mut reports = BTreeMap::new();
        let chief = TaskReport {
            ledger: Some(LedgerCounts {
                scheduled: 40,
                committed: 39,
                redispatched: Some(2),
                failed: 0,
                pending: 1,
            }),
            servers: vec![
                ServerCounts {
                    ps: 1,
                    applied: 80,
                    duplicates: 3,
                },
                ServerCounts {
                    ps: 0,
                    applied: 79,
                    duplicates: 0,
                },
            ],
            ps_restores: Some(2),
            rolled_back: Some(17),
            resumed: true,
            ..TaskReport::of("chief/0")
        };
        reports.insert(chief.task.clone(), chief.clone());
        let summary = ReportedSummary::gather(&reports, &[]);
        assert_eq!(summary.ledger, chief.ledger);
        assert_eq!(
            summary.servers.iter().map(|s| s.ps).collect::<Vec<_>>(),
            [0, 1],
            "by server"
        );
        assert_eq!((summary.ps_restores, summary.rolled_back), (Some(2), Some(17)));
        assert!(summary.resumed);
        assert!(!summary.group.is_collective());
        assert!(summary.unreadable.is_empty());
    }

    #[test]
    fn a_multi_worker_mirrored_jobs_models_and_epochs_are_gathered() {
        let model = FinalModel {
            step: 450,
            digest: "d42fbeb0f86b2b8d".into(),
        };
        let started = TaskReport {
            collective: true,
            ..TaskReport::of("worker/2")
        };
        let worker = TaskReport {
            collective: true,
            final_model: Some(model.clone()),
            ..TaskReport::of("worker/1")
        };
        let chief = TaskReport {
            collective: true,
            final_model: Some(model.clone()),
            group_generations: vec![
                GroupGeneration {
                    generation: 1,
                    workers: 3,
                    from_step: 0,
                },
                GroupGeneration {
                    generation: 2,
                    workers: 2,
                    from_step: 12,
                },
            ],
            ..TaskReport::of("chief/0")
        };
        let reports: BTreeMap<String, TaskReport> = [started, worker, chief.clone()]
            .into_iter()
            .map(|r| (r.task.clone(), r))
            .collect();
        let summary = ReportedSummary::gather(&reports, &[]);
        let group = &summary.group;
        assert!(group.is_collective());
        assert_eq!(group.models.len(), 2, "worker/2 reported no model");
        assert_eq!(group.models["worker/1"], model);
        assert_eq!(group.generations, chief.group_generations);
        assert!(summary.ledger.is_none());
        // A job that failed as it started is still known as a MultiWorkerMirrored one.
        let only_started: BTreeMap<String, TaskReport> = [(
            "chief/0".to_string(),
            TaskReport {
                collective: true,
                ..TaskReport::of("chief/0")
            },
        )]
        .into_iter()
        .collect();
        assert!(ReportedSummary::gather(&only_started, &[]).group.is_collective());
    }

    #[test]
    fn a_metric_is_read_with_or_without_labels() {
        let text = "# HELP x\ncohort_ledger_committed_total 12\ncohort_x{role=\"chief\"} 3.5\n";
        assert_eq!(metric(text, "cohort_ledger_committed_total"), Some(12.0));
        assert_eq!(metric(text, "cohort_x"), Some(3.5));
        assert_eq!(metric(text, "cohort_ledger"), None);
    }
}
