//! `cohort mwms-member` (hidden): one worker process training the dense workload
//! (`workloads::dense_sync`) under MultiWorkerMirrored, for the multi-worker tests.
//!
//! The cluster and this worker's task come from `TF_CONFIG`. Each worker seeds its
//! initializers differently (`7 + 1000 × rank`): only the strategy's broadcast of the first
//! worker's values makes them start alike. It prints one line per event on stdout:
//! `formed generation=E rank=R workers=W replicas=N communication=C` (`ring`, or `nccl:GPU` with
//! `--communication nccl`), `step K loss=L`, `recovered generation=E step=S
//! position=P workers=W lost=N,.. source=N attempts=A` (an elastic run re-formed),
//! `admitted generation=E step=S position=P workers=W joined=N,.. source=N` (workers joined: a
//! process started while the others train joins them, and prints it too), `departed generation=E
//! step=S position=P workers=W left=N,.. drained=N,.. saved=B` (workers with a notice left: a
//! worker sent SIGTERM leaves at the next step boundary, prints `left` and exits 143; one sent
//! SIGUSR1 is drained: it leaves the same way without the chief's save, prints `left drained`
//! and exits 0),
//! `saved step=S dir=D` (the chief saved a checkpoint, `--checkpoint-dir`), `restored step=S
//! dir=D` (a fresh start resumed from one), `done`, or `error kind=K node=N detail=..` (then
//! exit code 3), and writes the final variables and losses as JSON to `--out`. `--fail-worker W --fail-step K` makes worker W's first replica
//! fail its step K with an application error (`--fail-panics`: a panic); `--elastic` trains
//! with re-forming. Logs go to stderr as every role's do (`RUST_LOG`, `COHORT_LOG_FORMAT`).
//! `--bench-batch B` runs `cohort bench mwms`'s workload instead
//! ([`crate::workloads::mwms_bench`]: the MLP 784-256-256-10 on B examples per worker,
//! `--bench-warmup` steps, then `--steps` timed) and prints `bench steps=N seconds=S loss=L`.

use crate::process::stdout::outln;
use std::path::PathBuf;
use std::time::Duration;

use super::CliError;
use crate::cluster::ClusterConfig;
use crate::collective::{CollectiveError, GroupConfig};
use crate::strategy::{
    Communication, MultiWorkerConfig, MultiWorkerMirrored, Strategy, StrategyError,
};
use crate::train::StateCheckpoints;
use crate::train::TrainError;
use crate::variable::VariableError;
use crate::workloads::dense_sync::{self, collective_cause, ElasticEvent};

/// Flags of `cohort mwms-member`.
#[derive(Debug, clap::Args)]
pub(crate) struct MwmsArgs {
    /// Directory with ca.pem and this task's certificate and key (`cohort certs` layout).
    #[arg(long)]
    certs: PathBuf,
    /// Local replicas of this worker.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Training steps (global batches), at most ten million.
    #[arg(long, default_value_t = 8,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=10_000_000))]
    steps: usize,
    /// Examples per global batch, over every replica of every worker.
    #[arg(long, default_value_t = 16)]
    global_batch: usize,
    /// Pause after each step (so that a test can act mid-training).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=DAY_MS))]
    step_pause_ms: u64,
    /// The transport's idle timeout: the detection budget of a lost worker.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    idle_timeout_ms: u64,
    /// Where the final variables and losses go (JSON).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The worker (its rank among the workers) whose first replica fails with an application
    /// error at `--fail-step`.
    #[arg(long, requires = "fail_step")]
    fail_worker: Option<usize>,
    /// The step at which `--fail-worker` fails.
    #[arg(long, requires = "fail_worker")]
    fail_step: Option<usize>,
    /// `--fail-worker`'s replica panics instead of returning an error.
    #[arg(long, requires = "fail_worker")]
    fail_panics: bool,
    /// The worker (its rank among the workers) that SIGKILLs itself right after the group
    /// formed, before making its model: the others lose it while they set up.
    #[arg(long)]
    vanish_worker: Option<usize>,
    /// Train elastically: when a worker is lost, the survivors re-form and go on with the
    /// global batch of the same per-replica batch over fewer replicas.
    #[arg(long)]
    elastic: bool,
    /// Re-forming: how long a survivor waits for a member's answer to its probe.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    probe_timeout_ms: u64,
    /// How long forming a group (at start, and each re-forming attempt) waits for every member.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=DAY_MS))]
    form_timeout_ms: u64,
    /// Run the throughput workload of `cohort bench mwms` on this many examples per worker
    /// and step (then `--steps` is the number of timed steps).
    #[arg(long)]
    bench_batch: Option<usize>,
    /// Chunks over the plaintext data plane (TCP set up over QUIC) instead of QUIC.
    #[arg(long)]
    plaintext: bool,
    /// What sums the gradients across the workers: `ring` (the group's collectives) or `nccl`
    /// / `nccl:GPU` (NCCL on that GPU of this process; a build with the feature `nccl`).
    #[arg(long, default_value = "ring")]
    communication: Communication,
    /// Untimed steps before the timed ones (`--bench-batch`).
    #[arg(long, default_value_t = 10)]
    bench_warmup: usize,
    /// Elastic runs: the job's checkpoint directory (the chief saves there; a fresh start
    /// resumes from its newest checkpoint).
    #[arg(long, requires = "elastic")]
    checkpoint_dir: Option<PathBuf>,
    /// Elastic runs with --checkpoint-dir: the chief saves every this many steps (and at every
    /// departure; without it, only then).
    #[arg(long, requires = "checkpoint_dir")]
    checkpoint_every: Option<u64>,
}

/// The longest duration a flag of this command takes, in milliseconds (a day): a longer one
/// would overflow a deadline.
const DAY_MS: u64 = 86_400_000;

/// Runs the worker (see the module doc).
pub(crate) fn run(args: MwmsArgs) -> Result<u8, CliError> {
    crate::bootstrap::logging::init().map_err(|e| CliError::Usage(e.to_string()))?;
    let cluster = ClusterConfig::from_env()
        .map_err(|e| CliError::Usage(e.to_string()))?
        .ok_or_else(|| CliError::Usage("TF_CONFIG: missing".into()))?;
    let mut strategy = match MultiWorkerMirrored::new(strategy_config(&args, cluster)) {
        Ok(strategy) => strategy,
        Err(StrategyError::Config { key, detail }) => {
            return Err(CliError::Usage(format!("{key}: {detail}")))
        }
        Err(err) => {
            report(&err.to_string(), collective_of_strategy(&err));
            return Ok(3);
        }
    };
    let group = strategy.process_group();
    outln!(
        "formed generation={} rank={} workers={} replicas={} communication={}",
        group.generation(),
        group.rank(),
        group.size(),
        args.replicas,
        strategy.communication()
    );
    if args.vanish_worker == Some(strategy.worker_index()) {
        // As a SIGKILL from outside: no goodbye on any link.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| CliError::Failed(format!("--vanish-worker: cannot raise SIGKILL: {e}")))?;
    }
    let seed = 7 + 1000 * strategy.worker_index() as u64;
    if let Some(batch) = args.bench_batch {
        return match crate::workloads::mwms_bench::run(
            &strategy,
            batch,
            args.bench_warmup,
            args.steps,
            seed,
        ) {
            Ok(timed) => {
                outln!(
                    "bench steps={} seconds={} loss={}",
                    timed.steps, timed.seconds, timed.last_loss
                );
                outln!("done");
                Ok(0)
            }
            Err(err) => {
                report(&err.to_string(), collective_cause(&err));
                Ok(3)
            }
        };
    }
    let pause = Duration::from_millis(args.step_pause_ms);
    let outcome = if args.elastic {
        train_elastic_member(&mut strategy, &args, seed, pause)?
    } else {
        let fault = if args.fail_panics {
            dense_sync::Fault::Panic
        } else {
            dense_sync::Fault::Error
        };
        let fail_at = args
            .fail_step
            .filter(|_| args.fail_worker == Some(strategy.worker_index()))
            .map(|step| (step, fault));
        dense_sync::train_failing(
            &strategy,
            args.steps,
            args.global_batch,
            seed,
            fail_at,
            &mut |step, loss| {
                outln!("step {step} loss={loss}");
                std::thread::sleep(pause);
            },
        )
        .map(|outcome| (outcome, Left::Stayed))
    };
    let (outcome, left) = match outcome {
        Ok(outcome) => outcome,
        Err(TrainError::Strategy(StrategyError::Recovery { reason })) => {
            outln!("error kind=recovery node= detail={reason}");
            return Ok(3);
        }
        Err(err) => {
            report(&err.to_string(), collective_cause(&err));
            return Ok(3);
        }
    };
    if let Some(out) = &args.out {
        let json = serde_json::to_string(&outcome).map_err(|e| CliError::Failed(e.to_string()))?;
        std::fs::write(out, json)
            .map_err(|e| CliError::Failed(format!("--out {}: {e}", out.display())))?;
    }
    Ok(left.exit())
}

/// The strategy's settings from the flags: the transport's idle timeout (the detection
/// budget), the form and probe timeouts, the data plane and the communication.
fn strategy_config(args: &MwmsArgs, cluster: ClusterConfig) -> MultiWorkerConfig {
    let idle = Duration::from_millis(args.idle_timeout_ms.max(200));
    let mut config =
        MultiWorkerConfig::new(cluster, &args.certs).with_local_replicas(args.replicas);
    config.transport.idle_timeout = idle;
    config.transport.keep_alive_interval = idle / 4;
    config.group = GroupConfig {
        form_timeout: Duration::from_millis(args.form_timeout_ms.max(1)),
        plaintext: args.plaintext,
        ..GroupConfig::default()
    };
    config.probe_timeout = Duration::from_millis(args.probe_timeout_ms.max(1));
    config.communication = args.communication;
    config
}

/// Prints one event of an elastic run (a step pauses for `pause` after it), in the lines the
/// tests read.
fn print_event(event: ElasticEvent<'_>, pause: Duration) {
    match event {
        ElasticEvent::Step { step, loss } => {
            outln!("step {step} loss={loss}");
            std::thread::sleep(pause);
        }
        ElasticEvent::Recovered(r) => {
            let lost: Vec<String> = r.lost.iter().map(ToString::to_string).collect();
            outln!(
                "recovered generation={} step={} position={} workers={} lost={} source={} \
                 attempts={}",
                r.generation,
                r.step,
                r.position,
                r.members.len(),
                lost.join(","),
                r.source,
                r.attempts
            );
        }
        ElasticEvent::Departed(d) => {
            let left: Vec<String> = d.left.iter().map(ToString::to_string).collect();
            let drained: Vec<String> = d.drained.iter().map(ToString::to_string).collect();
            outln!(
                "departed generation={} step={} position={} workers={} left={} drained={} \
                 saved={}",
                d.generation,
                d.step,
                d.position,
                d.members.len(),
                left.join(","),
                drained.join(","),
                d.saved
            );
        }
        ElasticEvent::Saved { step, dir } => {
            outln!("saved step={step} dir={}", dir.display());
        }
        ElasticEvent::Restored { step, dir } => {
            outln!("restored step={step} dir={}", dir.display());
        }
        ElasticEvent::Admitted(a) => {
            let joined: Vec<String> = a.joined.iter().map(ToString::to_string).collect();
            outln!(
                "admitted generation={} step={} position={} workers={} joined={} source={}",
                a.generation,
                a.step,
                a.position,
                a.members.len(),
                joined.join(","),
                a.source
            );
    }
}
}

/// The elastic run of this member: a preemption notice (SIGTERM) or a drain (SIGUSR1) makes
/// it leave at the next step boundary; with `--checkpoint-dir` the chief saves there. `Err`:
/// bad flags, or the signals cannot be watched; else the run's outcome.
fn train_elastic_member(
    strategy: &mut MultiWorkerMirrored,
    args: &MwmsArgs,
    seed: u64,
    pause: Duration,
) -> Result<Result<(dense_sync::DenseOutcome, Left), TrainError>, CliError> {
    let replicas = strategy.num_replicas_in_sync();
    if args.global_batch % replicas != 0 || args.global_batch == 0 {
        return Err(CliError::Usage(format!(
            "--global-batch: {} does not divide into {replicas} replicas (elastic runs \
             keep the per-replica batch)",
            args.global_batch
        )));
    }
    // SIGTERM is a preemption notice: this worker leaves at the next step boundary.
    let notice = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::process::stop_on_signals(&notice)
        .map_err(|e| CliError::Failed(format!("cannot watch for SIGTERM: {e}")))?;
    // SIGUSR1 drains it: it leaves at the next step boundary for good, exit 0.
    let drain = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::process::drain_on_signal(&drain)
        .map_err(|e| CliError::Failed(format!("cannot watch for SIGUSR1: {e}")))?;
    let mut checkpoints = match &args.checkpoint_dir {
        Some(dir) => Some(
            StateCheckpoints::open(dir, args.checkpoint_every, 3)
                .map_err(|e| CliError::Usage(format!("--checkpoint-dir: {e}")))?,
        ),
        None => None,
    };
    let options = dense_sync::ElasticOptions {
        notice: Some(&notice),
        drain: Some(&drain),
        checkpoints: checkpoints.as_mut(),
    };
    Ok(dense_sync::train_elastic(
        strategy,
        args.steps,
        args.global_batch / replicas,
        seed,
        options,
        &mut |event| print_event(event, pause),
    )
    .map(|run| {
        let left = match (&run.left, run.drained) {
            (None, _) => Left::Stayed,
            (Some(_), true) => Left::Drained,
            (Some(_), false) => Left::Preempted,
        };
        (run.outcome, left)
    })
    )
}

/// Whether and why an elastic member left the group before the last step.
enum Left {
    Stayed,
    Preempted,
    Drained,
}

impl Left {
    /// Says how the member ended; its exit code.
    fn exit(self) -> u8 {
        match self {
            Left::Preempted => {
                // It left the group at the agreed step; its supervisor may start it again.
                outln!("left");
                crate::process::PREEMPTED_EXIT_CODE as u8
            }
            Left::Drained => {
                // It left the group for good at the agreed step.
                outln!("left drained");
                crate::process::JOB_DONE_EXIT_CODE as u8
            }
            Left::Stayed => {
                outln!("done");
                0
            }
        }
    }
}

fn collective_of_strategy(err: &StrategyError) -> Option<&CollectiveError> {
    match err {
        StrategyError::Collective(e) => Some(e),
        StrategyError::Variable(VariableError::Collective { source, .. }) => Some(source),
        _ => None,
    }
}

fn report(detail: &str, err: Option<&CollectiveError>) {
    let (kind, node) = match err {
        Some(CollectiveError::MemberLost { node, .. }) => ("member-lost", node.to_string()),
        Some(CollectiveError::PeerTimeout { node, .. }) => ("peer-timeout", node.to_string()),
        Some(CollectiveError::GenerationRefused { node, .. }) => ("generation-refused", node.to_string()),
        Some(CollectiveError::Form { .. }) => ("form", String::new()),
        Some(CollectiveError::Application { node, .. }) => ("application", node.to_string()),
        Some(_) => ("collective", String::new()),
        None => ("other", String::new()),
    };
    outln!("error kind={kind} node={node} detail={detail}");
}
