//! A deterministic cluster simulator: the coordinator's machine
//! ([`Scheduler`](crate::roles::coordinator::Scheduler), with its restore and control
//! sub-machines), the workers' machines
//! ([`WorkerMachine`](crate::roles::worker::WorkerMachine), with the real push planner) and
//! the parameter servers' machines
//! ([`ParameterStore`](crate::roles::ps::ParameterStore), with the real optimizer) of one job
//! run together on one thread, under a simulated clock, network, processes and checkpoint
//! storage, all driven by one seed (SIM-1).
//!
//! Only IO and time are simulated: every decision is made by the same machine code the actors
//! run. The harness plays the parts the actors and threads play (the coordinator's shell
//! carrying out actions and reporting outcomes; the failure detector; the worker's compute
//! thread, whose step computes for a drawn time and reads one element of its dataset; the
//! chief program's restore/schedule/join/save loop; the supervisor that restarts what dies).
//!
//! # Fault model
//! - **Network**: every message takes a latency drawn from `[latency_min, latency_max]`
//!   (so messages reorder); a lost datagram (probability `loss`) costs a retransmission delay,
//!   as under QUIC; a request is delivered twice with probability `duplicate` (a request sent
//!   again: every handler must be idempotent); a partition cuts one node off from every other
//!   (both ways) or only its outgoing messages (one-way) for a while. A message held by a
//!   partition or a paused receiver waits; past the detection budget its connection idled out:
//!   it is gone and the call it carried fails, as does a call with no reply within its bound.
//! - **Processes**: a parameter server or worker is killed (its supervisor restarts it as a
//!   new incarnation after `restart_delay`; a server comes back empty), paused and resumed
//!   (messages to it wait; a pause past the detection budget is a false death, and the
//!   incarnation is then retired and restarted), or given a preemption notice: it tells the
//!   chief (`Leaving`) and exits as soon as it is let go (unanswered, it serves through
//!   `preemption_grace`, then exits); either way it is restarted. The chief's machine lets a
//!   worker go at once (fenced, its closures run elsewhere) and a server once it has taken a
//!   preemption cut (written to the simulated storage apart from the program's checkpoints,
//!   read back, and marked after a write's time), so that its restore runs nothing again.
//! - **Drains**: a worker is drained out of the job (scaled down): it tells the chief
//!   (`Draining`) and runs on; the chief's machine gives it no new work, reads its positions
//!   once its closure finished (`crate::roles::coordinator::machine::membership`), and lets
//!   it go; it then exits and is not restarted, unless the job is scaled up again: then a new
//!   incarnation registers (`Joining`) and is set up at the positions kept for its index.
//!   Worker 0 is never drained.
//! - **Elastic workers**: a worker past the cluster spec joins (the lowest index past the spec
//!   not running starts and registers: `Joining`, again at each restart and with each new
//!   chief), is set up at its own pipeline and trains; some are killed or drained later.
//! - **Elastic servers**: as the launcher scales servers, a server joins (the lowest index
//!   not running starts empty and registers: `Joining`) or the highest running one asks to
//!   leave for good (`Draining`); the chief's machine moves the variables at a cut
//!   (`crate::roles::coordinator::machine`'s `reshard`: a cut, the variables placed again
//!   onto the new set, every server restored from the cut with its new shards), and lets the
//!   leaving one go, which exits and is not restarted. Every server registers again with each
//!   new chief (and one still waiting to leave asks again); a restarted chief's spec names
//!   the servers running then, and it places the variables over them.
//! - **The chief**: killed (coordinator and program together), its state is gone; after
//!   `restart_delay` (every other time also after the detection budget, as a supervisor slow to reschedule it, so that the workers' wait for a new chief is driven too) a new incarnation starts as the real one does: its program reads the
//!   newest checkpoint that verifies and a fresh coordinator's machine runs the start
//!   (`Scheduler::handle_start`): it probes every server (incarnation, restore generation,
//!   next free closure id) and restores them all from that checkpoint (servers that went on
//!   past it are rolled back, and ids resume above every one a server applied), then the
//!   program goes on from that checkpoint's step. With no checkpoint that verifies the
//!   machine starts afresh only if no server has applied anything, else the start fails
//!   naming why. A failed start exits the chief again (at most 3 times). Servers keep their
//!   state while the chief is gone; once it has been silent for the detection budget each
//!   worker's machine waits for a new chief to set it up (the new coordinator dials it and
//!   takes it back as it is), and exits to be restarted
//!   ([`crate::process::RETIRED_EXIT_CODE`]) if none did within `ps_restart_wait` (standing
//!   for its `worker_wait`), as `crate::bootstrap` does.
//! - **Datasets**: each worker reads one dataset; each closure it runs reads one element (its
//!   position goes up by one); the worker's machine plans every setup: a new incarnation's
//!   setup and a rewind rebuild the dataset at the skip the message carries, a live worker's
//!   new configuration keeps it where it is. A save's read of the cut collects every live
//!   worker's position through the coordinator's machine (a worker that does not answer is
//!   lost, and the checkpoint records the positions it was last set up from, where its next
//!   incarnation starts), in the manifest under `DATASET_POSITIONS_KEY`.
//! - **Failure detection**: a node the coordinator has not heard from (dead, paused,
//!   partitioned) for `detection_budget` is declared dead, as the gateway's heartbeats do;
//!   a new incarnation's hello declares its predecessor dead; and a process that exits is
//!   reported by its supervisor (two times in three, within two restart delays, so that a
//!   report may come after the new incarnation's hello): the live incarnation it names is
//!   declared dead then, as the chief's gateway does with the launcher's reports. A node
//!   silent for a third of the budget (two heartbeat intervals) whose process is down, not
//!   yet restarted, with no partition between, is declared dead then too: the gateway's
//!   probe of its address is refused (`DeathCause::Refused`); a paused or partitioned node
//!   never is.
//! - **Checkpoint storage**: a save is the coordinator machine's read of a cut
//!   (`Scheduler::handle_read_cut`: every shard read from the servers, waiting out those that
//!   cannot be read and reading again when a recovery or new work came in between), which
//!   builds a real [`Checkpoint`](crate::checkpoint::Checkpoint) (the layouts, every server's
//!   variables and optimizer slots as tensors with their step counts, the coordinator's
//!   ledger, the dataset positions); the harness encodes it with the real
//!   encoder ([`encode_checkpoint_at`](crate::checkpoint::encode_checkpoint_at): safetensors
//!   shards and the checksummed manifest) into an in-memory map of file name to bytes; only
//!   the files' IO is simulated. A fault acts on those bytes: a torn write (a file, shard or
//!   manifest, cut short) or a flipped bit (anywhere in one file) is stored, a full disk
//!   fails the save before publish (nothing stored), and the chief can crash before publish
//!   (nothing stored) or after it (stored, not yet the cut). Every read uses the real
//!   verifying decoder ([`decode_checkpoint`](crate::checkpoint::decode_checkpoint)): a save
//!   is read back before it becomes the cut (one that does not verify leaves the previous cut
//!   in place, and its files stay in storage), and a restore (the recovery's load at the cut,
//!   a new chief's start) reads the newest stored checkpoint that verifies, skipping the
//!   others as `CheckpointManager::restore_latest` does. The servers are restored from what
//!   was read, through the same `RestoreVariable` messages the coordinator sends.
//!
//! # Invariants, checked after every event
//! - LEDGER-1: the ledger balances;
//! - PS-1: no server applies a closure whose effect its state already holds;
//! - FENCE-1: no result from an incarnation the coordinator fenced commits;
//! - CKPT-1: whatever a read of a stored checkpoint loads (a save's read-back, a restore)
//!   equals what was saved: a damaged one must fail verification, never load other contents;
//! - PS-1 across chief restarts: a closure id a chief incarnation gives out for the first time
//!   is not one whose effect a server holds;
//! - READ-1: a closure's push is applied only by the server process, in the restore
//!   generation, that its step read as it began (the step's pulls, taken as that moment): no
//!   update computed from values that a restore or a restart has since replaced is applied;
//! - DATA-1: a worker's first read after a setup or a rewind, in a closure dispatched in
//!   restore generation `g`, is at the position recorded for that worker by the checkpoint
//!   the newest restore of generation at most `g` restored (0 if none was restored yet, or
//!   that checkpoint records none for it), or, for a worker drained since that restore, at
//!   the position it was drained at: a worker is never set up or rewound at positions from
//!   before a restore, nor does one that rejoins read again what it read before;
//! - end to end, when the job finishes (its last join waits for the servers to settle, as
//!   its final save would): every row of every variable, on whichever server holds it now,
//!   holds the effect of exactly the committed closures, and its value (and optimizer slots)
//!   equal a fault-free replay that applies each of them once, in the order the servers that
//!   held the row applied them (tracked per row, since rows moved from different servers
//!   keep their own orders). Across a chief
//!   restart, "committed" is what the checkpoint it resumed from held committed plus what
//!   the new incarnations committed: closures its predecessor committed after that
//!   checkpoint were rolled back with the servers and scheduled again under new ids;
//! - and the job ends within `time_max`: it finishes, or it ends with one of the documented
//!   expected ends ([`ExpectedEnd`]: a fault beyond repair, such as a server lost before any
//!   checkpoint became the cut), whose cause the scenario bears out; any other end is a
//!   violation (`END`).
//!
//! # Seeds and replay
//! [`run_seed`] draws a [`Scenario`] (the faults and the network's settings) from the seed
//! and runs it; the same seed gives the same scenario and the identical event trace
//! ([`SimReport::trace_hash`]). A failing scenario is shrunk by [`shrink`] to a shorter one
//! that still fails, and [`Scenario`]'s `Display` prints it as Rust a test can paste.
//! `cohort chaos sim --seeds N` runs many from the command line.

mod membership;
mod outcome;
mod world;

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[allow(unused_imports)] // the API of the membership simulator; the CLI uses a part
pub use membership::{
    run_membership_scenario, run_membership_seed, run_membership_seeds, trace_membership_seed,
    MembershipConfig,
    MembershipFault, MembershipFaultKind, MembershipReport, MembershipScenario, MembershipSummary,
    MembershipViolation,
};
pub use outcome::ExpectedEnd;
pub use world::SimReport;

/// The job a simulation runs, and the bounds of its fault model.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Parameter servers.
    pub num_ps: u32,
    /// Workers.
    pub num_workers: u32,
    /// Closures the chief program schedules in all.
    pub closures: u64,
    /// Closures it schedules between two joins.
    pub batch: u64,
    /// A checkpoint is saved after every this many batches.
    pub save_every_batches: u64,
    /// The failure detector's budget.
    pub detection_budget: Duration,
    /// How long a supervisor waits before restarting a process that died.
    pub restart_delay: Duration,
    /// How long a preempted process keeps serving after its notice.
    pub preemption_grace: Duration,
    /// Longest write of the program's checkpoint (and its read back): each takes a time
    /// drawn up to it, during which the cut is read and not marked.
    pub save_write_max: Duration,
    /// Bound on one remote call other than a closure's run.
    pub call_timeout: Duration,
    /// How long the coordinator waits for a lost server to be back (scheduler bound).
    pub ps_restart_wait: Duration,
    /// Simulated time after which a job still running counts as hung.
    pub time_max: Duration,
    /// Most faults a drawn scenario holds.
    pub faults_max: usize,
    /// Fault kinds a drawn scenario may hold.
    pub kinds: FaultKinds,
    /// Record every event's line in the report (for printing a failing trace).
    pub record_trace: bool,
}

impl Default for SimConfig {
    /// The reference job: 2 parameter servers, 3 workers, 200 closures.
    fn default() -> Self {
        Self {
            num_ps: 2,
            num_workers: 3,
            closures: 200,
            batch: 20,
            save_every_batches: 2,
            detection_budget: Duration::from_secs(3),
            restart_delay: Duration::from_millis(500),
            preemption_grace: Duration::from_secs(2),
            save_write_max: Duration::from_millis(500),
            call_timeout: Duration::from_secs(5),
            ps_restart_wait: Duration::from_secs(60),
            time_max: Duration::from_secs(30 * 60),
            faults_max: 6,
            kinds: FaultKinds::all(),
            record_trace: false,
        }
    }
}

/// Which kinds of fault a drawn scenario may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultKinds {
    /// Kill processes.
    pub kill: bool,
    /// Pause and resume processes.
    pub pause: bool,
    /// Partitions, both ways and one-way.
    pub partition: bool,
    /// Preemption notices.
    pub preempt: bool,
    /// Message loss, duplication and reordering.
    pub net: bool,
    /// Torn, bit-flipped and failed checkpoint writes, and (with `chief`) the chief's crash
    /// before or after a save's publish.
    pub storage: bool,
    /// Kill the chief (coordinator and program); a new incarnation resumes the job.
    pub chief: bool,
    /// Drain a worker out of the job (the scale-down: it finishes its closure, the chief
    /// keeps its positions, it exits 0 and is not restarted), and sometimes start it again
    /// (the scale-up: it joins and resumes at the kept positions).
    pub drain: bool,
    /// Parameter servers join and leave the running job (its variables move at a cut).
    pub reshard: bool,
}

impl FaultKinds {
    /// Every kind.
    pub fn all() -> Self {
        Self {
            kill: true,
            pause: true,
            partition: true,
            preempt: true,
            net: true,
            storage: true,
            chief: true,
            drain: true,
            reshard: true,
        }
    }

    /// None (a fault-free run).
    pub fn none() -> Self {
        Self {
            kill: false,
            pause: false,
            partition: false,
            preempt: false,
            net: false,
            storage: false,
            chief: false,
            drain: false,
            reshard: false,
        }
    }

    /// Parses a comma-separated list (`kill,pause,partition,preempt,net,storage,chief,drain,
    /// reshard`, or `all`, or `none`).
    pub fn parse(list: &str) -> Result<Self, UnknownFaultKind> {
        let mut kinds = Self::none();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "all" => kinds = Self::all(),
                "none" => {}
                "kill" => kinds.kill = true,
                "pause" => kinds.pause = true,
                "partition" => kinds.partition = true,
                "preempt" => kinds.preempt = true,
                "net" => kinds.net = true,
                "storage" => kinds.storage = true,
                "chief" => kinds.chief = true,
                "drain" => kinds.drain = true,
                "reshard" => kinds.reshard = true,
                other => {
                    return Err(UnknownFaultKind {
                        word: other.to_string(),
                    })
                }
            }
        }
        Ok(kinds)
    }
}

/// A word of a fault-kind list ([`FaultKinds::parse`]) that names no kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown fault kind {word:?} (expected kill, pause, partition, preempt, net, storage, chief, \
     drain, reshard, all or none)"
)]
pub struct UnknownFaultKind {
    /// The word.
    pub word: String,
}

/// A process of the simulated job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// The chief (coordinator).
    Chief,
    /// A parameter server, by index.
    Ps(u32),
    /// A worker, by index.
    Worker(u32),
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Chief => write!(f, "chief"),
            Node::Ps(i) => write!(f, "ps/{i}"),
            Node::Worker(i) => write!(f, "worker/{i}"),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Kill `node` at `at_ms`; its supervisor restarts it.
    Kill {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The victim (a server, a worker, or the chief).
        node: Node,
    },
    /// Pause `node` at `at_ms` for `for_ms`.
    Pause {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The victim.
        node: Node,
        /// How long it stays paused.
        for_ms: u64,
    },
    /// Cut `node` off at `at_ms` for `for_ms`: both ways, or only what it sends.
    Partition {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The node cut off.
        node: Node,
        /// How long.
        for_ms: u64,
        /// Only its outgoing messages are lost.
        one_way: bool,
    },
    /// A preemption notice to `node` at `at_ms`.
    Preempt {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The victim.
        node: Node,
    },
    /// Worker `worker` is drained out of the job at `at_ms` (scaled down; never restarted).
    Drain {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The worker.
        worker: u32,
    },
    /// Worker `worker`, if it was drained out of the job, joins it again at `at_ms` (scaled
    /// up: its supervisor starts a new incarnation, which registers with the chief and is set
    /// up at the positions kept for its index).
    Rejoin {
        /// Simulated milliseconds from the start.
        at_ms: u64,
        /// The worker.
        worker: u32,
    },
    /// A worker past the cluster spec joins the running job at `at_ms` (scaled up, as the
    /// launcher does: the lowest index past the spec not running starts and registers with the
    /// chief, and with every new chief after it; it is set up at pipeline `index` and trained
    /// on like any other). Skipped when [`EXTRA_WORKERS_MAX`] run already.
    WorkerJoin {
        /// Simulated milliseconds from the start.
        at_ms: u64,
    },
    /// A parameter server joins the running job at `at_ms` (scaled up, as the launcher does:
    /// the lowest index not running starts and registers; the chief moves variables onto it
    /// at a cut). Skipped while another server is leaving, or when [`EXTRA_SERVERS_MAX`]
    /// servers beyond the spec run already.
    PsJoin {
        /// Simulated milliseconds from the start.
        at_ms: u64,
    },
    /// The highest-indexed running parameter server asks to leave the job for good at
    /// `at_ms` (scaled down); it exits once the chief moved its variables elsewhere (or at
    /// once, if it held none), and stays if the chief refuses (the last server).
    PsLeave {
        /// Simulated milliseconds from the start.
        at_ms: u64,
    },
    /// The `save`-th checkpoint write (0-based) goes wrong.
    Storage {
        /// Which save.
        save: u32,
        /// How.
        fault: StorageFault,
    },
}

/// How a checkpoint write goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// Published, but a file is cut short: it fails its checksum.
    Torn,
    /// Published, but one bit of a file (a shard or the manifest) flipped.
    BitFlip,
    /// The write fails (a full disk) before the manifest is published: no checkpoint.
    FullDisk,
    /// The chief dies while it writes, before the manifest is published: no checkpoint, and
    /// a new chief incarnation resumes from the previous one.
    CrashBeforePublish,
    /// The chief dies once the checkpoint is published and durable, before it becomes the
    /// cut: a new chief incarnation resumes from it.
    CrashAfterPublish,
    /// Published, read back and made the cut; then one bit of one of its files flips on disk
    /// (rot, a bad sector, a chaos plan's `corrupt_checkpoint`): a later restore must skip it,
    /// and a recovery rolls back to the cut before it.
    RotAfterCut,
}

/// The network's behaviour for a whole run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetSettings {
    /// Shortest latency, microseconds.
    pub latency_min_us: u64,
    /// Longest latency, microseconds.
    pub latency_max_us: u64,
    /// Probability a message is lost.
    pub loss: f64,
    /// Probability a message is delivered twice.
    pub duplicate: f64,
}

impl NetSettings {
    /// A reliable network with a little reordering.
    pub fn reliable() -> Self {
        Self {
            latency_min_us: 100,
            latency_max_us: 2_000,
            loss: 0.0,
            duplicate: 0.0,
        }
    }
}

/// Everything a run injects: replaying the same scenario with the same seed gives the same
/// trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The seed of the network's draws (latency, loss, duplication).
    pub seed: u64,
    /// The network.
    pub net: NetSettings,
    /// The faults, in any order.
    pub faults: Vec<Fault>,
}

impl Scenario {
    /// A fault-free scenario.
    pub fn fault_free(seed: u64) -> Self {
        Self {
            seed,
            net: NetSettings::reliable(),
            faults: Vec::new(),
        }
    }

    /// Draws the scenario of `seed` within `config`'s fault model.
    ///
    /// Longer than most functions here on purpose: the draws in one fixed order. Every recorded
    /// seed (the regression scenarios among them) means the scenario these draws give, in this
    /// order.
    pub fn draw(config: &SimConfig, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SCENARIO_STREAM);
        let kinds = config.kinds;
        let mut net = NetSettings::reliable();
        if kinds.net {
            net.latency_max_us = rng.gen_range(500..20_000);
            net.loss = [0.0, 0.001, 0.01, 0.05][rng.gen_range(0..4)];
            net.duplicate = [0.0, 0.001, 0.01, 0.05][rng.gen_range(0..4)];
        }
        // Faults land while the job runs: its fault-free length is about one step (35 ms on
        // average) per closure per worker, plus the joins and saves between batches.
        let horizon_ms = config.closures * 40 / u64::from(config.num_workers.max(1))
            + config.closures / config.batch.max(1) * 150
            + 1_000;
        let count = rng.gen_range(0..=config.faults_max);
        let mut faults = Vec::new();
        let mut choices = Vec::new();
        for (on, kind) in [
            (kinds.kill, 0),
            (kinds.pause, 1),
            (kinds.partition, 2),
            (kinds.preempt, 3),
            (kinds.storage, 4),
            (kinds.chief, 5),
        ] {
            if on {
                choices.push(kind);
            }
        }
        for _ in 0..if choices.is_empty() { 0 } else { count } {
            let at_ms = rng.gen_range(0..horizon_ms);
            let node = if rng.gen_bool(0.5) {
                Node::Ps(rng.gen_range(0..config.num_ps.max(1)))
            } else {
                Node::Worker(rng.gen_range(0..config.num_workers.max(1)))
            };
            let budget_ms = config.detection_budget.as_millis() as u64;
            let fault = match choices[rng.gen_range(0..choices.len())] {
                0 => Fault::Kill { at_ms, node },
                1 => Fault::Pause {
                    at_ms,
                    node,
                    for_ms: rng.gen_range(1..budget_ms * 2),
                },
                2 => Fault::Partition {
                    at_ms,
                    node,
                    for_ms: rng.gen_range(1..budget_ms * 2),
                    one_way: rng.gen_bool(0.3),
                },
                3 => Fault::Preempt { at_ms, node },
                5 => Fault::Kill {
                    at_ms,
                    node: Node::Chief,
                },
                _ => {
                    // A crash in a save kills the chief: only with chief kills allowed.
                    let kinds_max = if kinds.chief { 5 } else { 3 };
                    Fault::Storage {
                        save: rng.gen_range(0..4),
                        fault: [
                            StorageFault::Torn,
                            StorageFault::BitFlip,
                            StorageFault::FullDisk,
                            StorageFault::CrashBeforePublish,
                            StorageFault::CrashAfterPublish,
                        ][rng.gen_range(0..kinds_max)],
                    }
                }
            };
            faults.push(fault);
        }
        // Drains come from a stream of their own, so that every other draw of a seed stays
        // what it was before drains existed (regression scenarios replay unchanged). Worker 0
        // is never drained: the job keeps a worker.
        if kinds.drain && config.num_workers >= 2 {
            let mut drains = ChaCha8Rng::seed_from_u64(seed ^ DRAIN_STREAM);
            if drains.gen_bool(0.3) {
                let at_ms = drains.gen_range(0..horizon_ms);
                let worker = drains.gen_range(1..config.num_workers);
                faults.push(Fault::Drain { at_ms, worker });
                // Scaled up again later, half the time.
                if drains.gen_bool(0.5) {
                    let at_ms = at_ms + drains.gen_range(100..horizon_ms);
                    faults.push(Fault::Rejoin { at_ms, worker });
                }
            }
        }
        // Workers past the spec join: a stream of its own too. Half of the joined ones are
        // killed (their supervisor starts them again, and they register again) or drained
        // later (the index they take is known: the lowest past the spec not running).
        if kinds.drain {
            let mut joins = ChaCha8Rng::seed_from_u64(seed ^ WORKER_JOIN_STREAM);
            if joins.gen_bool(0.3) {
                let drawn = worker_joins(&mut joins, config.num_workers, 0..horizon_ms, 100..horizon_ms);
                faults.extend(drawn);
            }
        }
        // A cut's checkpoint damaged on disk after it verified: a stream of its own too.
        if kinds.storage {
            let mut rot = ChaCha8Rng::seed_from_u64(seed ^ ROT_STREAM);
            if rot.gen_bool(0.3) {
                faults.push(Fault::Storage {
                    save: rot.gen_range(0..4),
                    fault: StorageFault::RotAfterCut,
                });
            }
        }
        // Server joins and leaves: a stream of their own too.
        if kinds.reshard {
            let mut reshards = ChaCha8Rng::seed_from_u64(seed ^ RESHARD_STREAM);
            if reshards.gen_bool(0.3) {
                for _ in 0..reshards.gen_range(1..=3) {
                    let at_ms = reshards.gen_range(0..horizon_ms);
                    faults.push(if reshards.gen_bool(0.5) {
                        Fault::PsJoin { at_ms }
                    } else {
                        Fault::PsLeave { at_ms }
                    });
                }
            }
        }
        Self { seed, net, faults }
    }
}

/// One to [`EXTRA_WORKERS_MAX`] workers past a spec of `num_workers` joining at times drawn
/// from `join_at`, each then killed or drained (half of them, a quarter each) a time drawn
/// from `after` later: the index a join takes is known, the lowest past the spec not running.
fn worker_joins(
    rng: &mut ChaCha8Rng,
    num_workers: u32,
    join_at: std::ops::Range<u64>,
    after: std::ops::Range<u64>,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    for extra in 0..rng.gen_range(1..=EXTRA_WORKERS_MAX) {
        let at_ms = rng.gen_range(join_at.clone());
        faults.push(Fault::WorkerJoin { at_ms });
        let worker = num_workers + extra;
        let later = at_ms + rng.gen_range(after.clone());
        match rng.gen_range(0..4) {
            0 => faults.push(Fault::Kill {
                at_ms: later,
                node: Node::Worker(worker),
            }),
            1 => faults.push(Fault::Drain {
                at_ms: later,
                worker,
            }),
            _ => {}
        }
    }
    faults
}

impl fmt::Display for Scenario {
    /// The scenario as Rust a regression test can paste.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Scenario {{")?;
        writeln!(f, "    seed: {},", self.seed)?;
        writeln!(
            f,
            "    net: NetSettings {{ latency_min_us: {}, latency_max_us: {}, loss: {:?}, duplicate: {:?} }},",
            self.net.latency_min_us, self.net.latency_max_us, self.net.loss, self.net.duplicate
        )?;
        writeln!(f, "    faults: vec![")?;
        for fault in &self.faults {
            writeln!(f, "        Fault::{fault:?},")?;
        }
        writeln!(f, "    ],")?;
        write!(f, "}}")
    }
}

/// A broken invariant, with where the run was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant (`LEDGER-1`, `PS-1`, `FENCE-1`, `CKPT-1`, `DATA-1`, `END-TO-END`,
    /// `LIVENESS`).
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
    /// Simulated time, milliseconds.
    pub at_ms: u64,
    /// Events processed until then.
    pub event: u64,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} broken at {} ms (event {}): {}",
            self.invariant, self.at_ms, self.event, self.detail
        )
    }
}

/// Runs the scenario drawn from `seed`.
pub fn run_seed(config: &SimConfig, seed: u64) -> SimReport {
    run_scenario(config, &Scenario::draw(config, seed))
}

/// Runs `scenario` to its end (or its first violation). The production code it drives (the
/// coordinator's machine and executor) logs for operators; here nothing is logged.
pub fn run_scenario(config: &SimConfig, scenario: &Scenario) -> SimReport {
    let quiet = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(quiet, || world::World::new(config, scenario).run())
}

/// A shorter scenario that still breaks an invariant (the first fault removal, then the
/// network simplification, that keeps it failing, until none does); `scenario` itself if it
/// does not fail. Bounded: at most [`SHRINK_RUNS_MAX`] runs.
pub fn shrink(config: &SimConfig, scenario: &Scenario) -> Scenario {
    let mut best = scenario.clone();
    let mut runs = 0;
    let fails = |s: &Scenario, runs: &mut usize| {
        *runs += 1;
        run_scenario(config, s).violation.is_some()
    };
    if !fails(&best, &mut runs) {
        return best;
    }
    let mut progress = true;
    while progress && runs < SHRINK_RUNS_MAX {
        progress = false;
        let mut i = 0;
        while i < best.faults.len() && runs < SHRINK_RUNS_MAX {
            let mut candidate = best.clone();
            candidate.faults.remove(i);
            if fails(&candidate, &mut runs) {
                best = candidate;
                progress = true;
            } else {
                i += 1;
            }
        }
        for simpler in [
            NetSettings {
                loss: 0.0,
                ..best.net
            },
            NetSettings {
                duplicate: 0.0,
                ..best.net
            },
            NetSettings {
                latency_max_us: best.net.latency_min_us.max(1),
                ..best.net
            },
        ] {
            if simpler != best.net && runs < SHRINK_RUNS_MAX {
                let candidate = Scenario {
                    net: simpler,
                    ..best.clone()
                };
                if fails(&candidate, &mut runs) {
                    best = candidate;
                    progress = true;
                }
            }
        }
    }
    best
}

/// What many seeds found.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Schedules run.
    pub schedules: u64,
    /// Events processed in all.
    pub events: u64,
    /// Jobs that finished every closure.
    pub finished: u64,
    /// Jobs that ended without finishing, with an expected end ([`ExpectedEnd`]: a fault
    /// beyond repair, its cause borne out by the scenario).
    pub failed: u64,
    /// Those, by kind ([`ExpectedEnd::kind`]).
    pub ends: std::collections::BTreeMap<&'static str, u64>,
    /// Faults injected, by kind.
    pub faults: std::collections::BTreeMap<&'static str, u64>,
    /// Violations, with their seeds.
    pub violations: Vec<(u64, Violation)>,
    /// The first [`FAILURES_KEPT`] jobs that ended without finishing, with their seeds.
    pub failures: Vec<(u64, ExpectedEnd)>,
}

/// Runs `seeds` one after the other and sums up what they found.
pub fn run_seeds(config: &SimConfig, seeds: impl IntoIterator<Item = u64>) -> Summary {
    let mut summary = Summary::default();
    for seed in seeds {
        let scenario = Scenario::draw(config, seed);
        for fault in &scenario.faults {
            *summary.faults.entry(fault_kind(fault)).or_default() += 1;
        }
        if scenario.net.loss > 0.0 || scenario.net.duplicate > 0.0 {
            *summary.faults.entry("lossy network").or_default() += 1;
        }
        let report = run_scenario(config, &scenario);
        summary.schedules += 1;
        summary.events += report.events;
        match (&report.violation, report.finished) {
            (Some(v), _) => summary.violations.push((seed, v.clone())),
            (None, true) => summary.finished += 1,
            (None, false) => {
                summary.failed += 1;
                if let Some(end) = report.failure {
                    *summary.ends.entry(end.kind()).or_default() += 1;
                    if summary.failures.len() < FAILURES_KEPT {
                        summary.failures.push((seed, end));
                    }
                }
            }
        }
    }
    summary
}

/// A fault's kind, as the summary counts it.
pub fn fault_kind(fault: &Fault) -> &'static str {
    match fault {
        Fault::Kill {
            node: Node::Chief, ..
        } => "chief kill",
        Fault::Kill { .. } => "kill",
        Fault::Pause { .. } => "pause",
        Fault::Partition { one_way: false, .. } => "partition",
        Fault::Partition { one_way: true, .. } => "one-way partition",
        Fault::Preempt { .. } => "preempt",
        Fault::Drain { .. } => "drain",
        Fault::Rejoin { .. } => "rejoin",
        Fault::WorkerJoin { .. } => "worker join",
        Fault::PsJoin { .. } => "ps join",
        Fault::PsLeave { .. } => "ps leave",
        Fault::Storage { .. } => "storage",
    }
}

/// Failed jobs a [`Summary`] keeps the error of.
pub const FAILURES_KEPT: usize = 10;

/// Most runs one [`shrink`] makes.
pub const SHRINK_RUNS_MAX: usize = 200;

/// Keeps the scenario's draws apart from the network's (both come from the seed).
const SCENARIO_STREAM: u64 = 0x5CE7_A210_0000_0001;
/// The stream of a seed's drains (apart from its other draws).
const DRAIN_STREAM: u64 = 0xD8A1_0000_0000_0002;
/// The stream of a seed's server joins and leaves.
const RESHARD_STREAM: u64 = 0x2E5A_4D00_0000_0003;
/// The stream of a seed's workers joining past the spec.
const WORKER_JOIN_STREAM: u64 = 0x3017_0000_0000_0006;
/// The stream of checkpoints damaged after they became the cut.
const ROT_STREAM: u64 = 0x207D_0000_0000_0005;
/// The stream of the supervisor's exit reports.
const REPORT_STREAM: u64 = 0xE817_2E90_0000_0004;

/// Servers beyond the cluster spec that may join a simulated job.
pub const EXTRA_SERVERS_MAX: u32 = 2;
/// Workers beyond the cluster spec that may join a simulated job (its `workers_max` is the
/// spec's workers and these).
pub const EXTRA_WORKERS_MAX: u32 = 2;

#[cfg(test)]
mod tests;
