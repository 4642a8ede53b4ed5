//! The membership simulator: N MultiWorkerMirrored worker processes, each the collective's
//! member machine (`collective::MemberMachine`), over a simulated network, under the chaos
//! plans' faults (kill, pause, preemption, drain and scale back, non-transitive cuts and
//! splits, slow links, lossy links), with a supervisor that starts a lost process again as a new
//! incarnation. Deterministic: a seed draws the scenario and every delay, so a violation
//! replays exactly.
//!
//! After every event it checks the invariants of elastic training (see `checks.rs`): generations
//! only move forward in a process; every step a process applies follows its last one (each
//! step applied once, none skipped); no split brain (once two groups applied different updates
//! to the same model, the older branch is never extended again); every process that finishes
//! holds the same model; and the job finishes within a stated bound once the faults end
//! (liveness).

mod checks;
mod rounds;
mod world;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use world::MembershipReport;

/// The seed stream of a scenario's lossy links ([`MembershipConfig::lossy`]).
const LOSSY_STREAM: u64 = 0x6c6f_7373_7920_6c6b;
/// The seed stream that makes drains for good ([`MembershipConfig::drains_for_good`]).
const FOR_GOOD_STREAM: u64 = 0x666f_7220_676f_6f64;

/// What a membership simulation runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipConfig {
    /// Worker processes (drawn from 2 up to this).
    pub workers_max: usize,
    /// Steps the job trains.
    pub steps: u64,
    /// Faults begin within this window from the start.
    pub fault_window: Duration,
    /// Faults per schedule, at most.
    pub faults_max: usize,
    /// Once the last fault ended, the job must finish within this (liveness).
    pub liveness_bound: Duration,
    /// Whether a schedule may also make a worker's links lossy for a while
    /// ([`MembershipFaultKind::Lossy`], drawn from a stream of its own, so that the other faults
    /// of a seed are the same either way).
    pub lossy: bool,
    /// Whether a drain may be for good ([`MembershipFaultKind::Drain`]'s `for_good`, drawn
    /// from a stream of its own, so that the other faults of a seed are the same either way).
    pub drains_for_good: bool,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self {
            workers_max: 4,
            steps: 40,
            fault_window: Duration::from_secs(20),
            faults_max: 5,
            liveness_bound: Duration::from_secs(240),
            lossy: true,
            drains_for_good: true,
        }
    }
}

/// One fault of a membership scenario, at `at` from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipFault {
    /// When it begins.
    pub at: Duration,
    /// What it does.
    pub kind: MembershipFaultKind,
}

/// The faults a membership scenario injects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipFaultKind {
    /// SIGKILL: the process is gone; its supervisor starts a new one after `restart_after`.
    Kill {
        worker: usize,
        restart_after: Duration,
    },
    /// SIGSTOP for `lasting`, then SIGCONT.
    Pause { worker: usize, lasting: Duration },
    /// A preemption notice (SIGTERM): it leaves at the next step boundary (killed if not
    /// within the grace), and its supervisor starts it again.
    Preempt { worker: usize },
    /// Scaled down (it leaves at a boundary, and is not restarted), and a new process of it is
    /// added `add_after` later, unless `for_good`: then it leaves the job, and the processes
    /// started once its process is gone are not told of it (the launcher's specs leave it out
    /// once it exited) while the processes that run still list it.
    Drain {
        worker: usize,
        add_after: Duration,
        for_good: bool,
    },
    /// The path between two workers alone is cut for `lasting` (non-transitive: each still
    /// reaches the others).
    Cut {
        a: usize,
        b: usize,
        lasting: Duration,
    },
    /// The workers of `side` are cut off from the others for `lasting`.
    Split { side: Vec<usize>, lasting: Duration },
    /// Every message from `worker` takes `extra` longer for `lasting`.
    Slow {
        worker: usize,
        extra: Duration,
        lasting: Duration,
    },
    /// For `lasting`, every datagram to or from `worker` is lost with probability
    /// `percent` / 100. QUIC sends a lost one again after a probe timeout that doubles each
    /// time: a message comes late (and out of order with the others), and where its sends
    /// again pass the detection budget the connection idles out (both ends lose the link).
    Lossy {
        worker: usize,
        percent: u32,
        lasting: Duration,
    },
}

impl MembershipFaultKind {
    /// Its kind, as summaries count them.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Kill { .. } => "kill",
            Self::Pause { .. } => "pause",
            Self::Preempt { .. } => "preempt",
            Self::Drain { .. } => "drain",
            Self::Cut { .. } => "cut",
            Self::Split { .. } => "split",
            Self::Slow { .. } => "slow",
            Self::Lossy { .. } => "lossy",
        }
    }

    /// How long it lasts (zero for an instant fault).
    fn lasting(&self) -> Duration {
        match self {
            Self::Kill { restart_after, .. } => *restart_after,
            Self::Pause { lasting, .. }
            | Self::Cut { lasting, .. }
            | Self::Split { lasting, .. }
            | Self::Slow { lasting, .. }
            | Self::Lossy { lasting, .. } => *lasting,
            Self::Preempt { .. } => Duration::from_secs(10),
            Self::Drain { add_after, .. } => *add_after,
        }
    }
}

/// Everything one membership run injects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipScenario {
    /// The seed of the network's and the supervisor's draws.
    pub seed: u64,
    /// Worker processes.
    pub workers: usize,
    /// The faults, in time order.
    pub faults: Vec<MembershipFault>,
}

impl MembershipScenario {
    /// Draws the scenario of `seed`.
    pub fn draw(config: &MembershipConfig, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d65_6d62_6572_7321);
        let workers = rng.gen_range(2..=config.workers_max.max(2));
        let count = rng.gen_range(0..=config.faults_max);
        let window = config.fault_window.as_millis() as u64;
        let ms =
            |rng: &mut ChaCha8Rng, lo: u64, hi: u64| Duration::from_millis(rng.gen_range(lo..hi));
        let mut faults: Vec<MembershipFault> = (0..count)
            .map(|_| {
                let at = Duration::from_millis(rng.gen_range(0..window.max(1)));
                let worker = rng.gen_range(0..workers);
                let kind = match rng.gen_range(0..7) {
                    0 => MembershipFaultKind::Kill {
                        worker,
                        restart_after: ms(&mut rng, 100, 4_000),
                    },
                    1 => MembershipFaultKind::Pause {
                        worker,
                        lasting: ms(&mut rng, 100, 8_000),
                    },
                    2 => MembershipFaultKind::Preempt { worker },
                    3 => MembershipFaultKind::Drain {
                        worker,
                        add_after: ms(&mut rng, 500, 8_000),
                        for_good: false,
                    },
                    4 => {
                        let b = (worker + rng.gen_range(1..workers)) % workers;
                        MembershipFaultKind::Cut {
                            a: worker,
                            b,
                            lasting: ms(&mut rng, 100, 8_000),
                        }
                    }
                    5 => {
                        let side: Vec<usize> = (0..workers).filter(|_| rng.gen_bool(0.5)).collect();
                        MembershipFaultKind::Split {
                            side,
                            lasting: ms(&mut rng, 100, 8_000),
                        }
                    }
                    _ => MembershipFaultKind::Slow {
                        worker,
                        extra: ms(&mut rng, 10, 800),
                        lasting: ms(&mut rng, 100, 8_000),
                    },
                };
                MembershipFault { at, kind }
            })
            .collect();
        if config.lossy {
            // A stream of its own: the faults above are the same with or without it.
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ LOSSY_STREAM);
            if rng.gen_ratio(1, 3) {
                faults.push(MembershipFault {
                    at: Duration::from_millis(rng.gen_range(0..window.max(1))),
                    kind: MembershipFaultKind::Lossy {
                        worker: rng.gen_range(0..workers),
                        percent: [2, 10, 30, 50][rng.gen_range(0..4)],
                        lasting: ms(&mut rng, 100, 8_000),
                    },
                });
            }
        }
        if config.drains_for_good {
            // A stream of its own: the faults above are drawn the same with or without it.
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ FOR_GOOD_STREAM);
            for fault in &mut faults {
                if let MembershipFaultKind::Drain { for_good, .. } = &mut fault.kind {
                    *for_good = rng.gen_ratio(1, 3);
                }
            }
        }
        faults.sort_by_key(|f| f.at);
        Self {
            seed,
            workers,
            faults,
        }
    }

    /// When the last fault ends.
    fn faults_end(&self) -> Duration {
        self.faults
            .iter()
            .map(|f| f.at + f.kind.lasting())
            .max()
            .unwrap_or_default()
    }
}

/// A broken invariant, with what shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipViolation {
    /// Which invariant (`EPOCH`, `STEP`, `SPLIT`, `DIGEST`, `LIVENESS`).
    pub invariant: &'static str,
    /// What broke it.
    pub detail: String,
    /// When, from the start.
    pub at: Duration,
}

/// Runs the scenario of `seed`.
pub fn run_membership_seed(config: &MembershipConfig, seed: u64) -> MembershipReport {
    let scenario = MembershipScenario::draw(config, seed);
    run_membership_scenario(config, &scenario)
}

/// Runs the scenario of `seed`, recording every event and every machine's report in the
/// report's `trace` (what `cohort chaos sim --membership --seed` prints).
pub fn trace_membership_seed(
    config: &MembershipConfig,
    seed: u64,
) -> (MembershipScenario, MembershipReport) {
    let scenario = MembershipScenario::draw(config, seed);
    let report = world::World::new(config, &scenario).traced().run();
    (scenario, report)
}

/// Runs `scenario`.
pub fn run_membership_scenario(
    config: &MembershipConfig,
    scenario: &MembershipScenario,
) -> MembershipReport {
    world::World::new(config, scenario).run()
}

/// What many membership seeds found.
#[derive(Debug, Clone, Default)]
pub struct MembershipSummary {
    /// Schedules run.
    pub schedules: u64,
    /// Events processed in all.
    pub events: u64,
    /// Jobs that finished.
    pub finished: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Process exits, by why.
    pub exits: BTreeMap<&'static str, u64>,
    /// Groups formed in all.
    pub groups_formed: u64,
    /// Messages lossy links made late.
    pub late_on_lossy: u64,
    /// Connections lossy links idled out.
    pub idled_out: u64,
    /// Violations, with their seeds.
    pub violations: Vec<(u64, MembershipViolation)>,
}

/// Runs `seeds` and sums up what they found.
pub fn run_membership_seeds(
    config: &MembershipConfig,
    seeds: impl IntoIterator<Item = u64>,
) -> MembershipSummary {
    let mut summary = MembershipSummary::default();
    for seed in seeds {
        let scenario = MembershipScenario::draw(config, seed);
        for fault in &scenario.faults {
            *summary.faults.entry(fault.kind.name()).or_default() += 1;
        }
        let report = run_membership_scenario(config, &scenario);
        summary.schedules += 1;
        summary.events += report.events;
        summary.groups_formed += report.groups_formed;
        summary.late_on_lossy += report.late_on_lossy;
        summary.idled_out += report.idled_out;
        for (why, n) in &report.exits {
            *summary.exits.entry(why).or_default() += n;
        }
        match report.violation {
            Some(v) => summary.violations.push((seed, v)),
            None => summary.finished += u64::from(report.finished),
        }
    }
    summary
}

#[cfg(test)]
mod tests;
