//! The `cohort` binary's commands: argument parsing and dispatch. Each command's work lives in
//! the module that owns the concept; this module only turns flags into calls and errors into
//! exit codes (0 success, 1 training error, 2 bad config or usage — DESIGN §7).

mod bench;
mod bench_allreduce;
mod bench_mwms;
mod bench_recovery;
mod certs;
mod chaos;
mod ckpt;
mod collective_member;
mod mwms_member;
mod nccl;
mod peers;

use crate::process::stdout::outln;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// cohort: fault-tolerant distributed training — TensorFlow's tf.distribute model (strategies,
/// distributed datasets, parameter-server training) on actors that talk over QUIC with mutual
/// TLS.
///
/// Exit codes: 0 success, 1 training error, 2 bad config or usage (the message names the key),
/// 143 stopped by Ctrl-C or SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "cohort", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a cluster CA and one certificate per node of a cluster spec.
    ///
    /// Each node certificate names the node's role and index (e.g. worker-1.cohort); nodes
    /// refuse peers whose certificate is not signed by this CA or does not match the role they
    /// claim. Writes ca.pem, ca.key and <role>-<index>.pem/.key into --out; a process finds
    /// them through COHORT_CERTS, --certs-dir or certs_dir in cohort.toml, and loads the pair
    /// of its own task, so that one directory (one Kubernetes Secret: --k8s-secret) serves
    /// every node.
    #[command(after_help = "Example: cohort certs --out certs --cluster chief=1,worker=2,ps=2")]
    Certs(certs::CertsArgs),
    /// The main job: a local cluster (chief, 2 parameter servers, 2 workers, each a process)
    /// trains a digits classifier and a CTR model with a 1,000,000-row embedding, with a worker
    /// killed midway to show recovery.
    ///
    /// Ctrl-C or SIGTERM saves a checkpoint and exits 143; run again with the printed
    /// --checkpoint-dir to resume.
    #[command(after_help = concat!(
        "Environment: the flags have no environment variable of their own; every task the demo \
         starts reads the variables `cohort role --help` lists (COHORT_LOG_FORMAT=json for JSON \
         logs, one object per line, the task in a field; RAYON_NUM_THREADS for the compute threads), and the demo's \
         tasks read COHORT_DEMO_DIGITS_EPOCHS, COHORT_DEMO_CTR_EPOCHS and \
         COHORT_DEMO_COMMUNICATION, which the flags set for them.\n\n",
        "Example: cohort demo --strategy multi-worker-mirrored --workers 2 --run-dir /tmp/job"
    ))]
    Demo(DemoArgs),
    /// Start a local cluster of a built-in job as separate processes on 127.0.0.1, with an
    /// ephemeral CA; restarts tasks that die; Ctrl-C or SIGTERM stops everything (exit 143).
    ///
    /// Unlike `demo`, no worker is killed unless --kill-worker-after is given. Settings other
    /// than these flags reach the tasks through the environment (e.g. COHORT_CHECKPOINT_DIR).
    #[command(after_help = concat!(
        "Environment: the flags have no environment variable of their own (--replicas and \
         --detection-budget set COHORT_REPLICAS and COHORT_DETECTION_BUDGET for the tasks); \
         every task reads the variables `cohort role --help` lists, from this process's \
         environment: COHORT_CHECKPOINT_DIR, COHORT_LOG_FORMAT=json (one JSON object per line, \
         the task in a field), RAYON_NUM_THREADS (compute threads), COHORT_WORKER_WAIT and the others.\n\n",
        "Example: COHORT_CHECKPOINT_DIR=/tmp/ckpt cohort launch --workers 2:4 --ps 2 --run-dir /tmp/job"
    ))]
    Launch(LaunchArgs),
    /// Grow or shrink the workers of a job started with `launch --workers MIN:MAX --run-dir
    /// DIR`: the launcher starts workers (each joins the running job, its datasets built
    /// before it gets work) or drains the highest-indexed ones (each finishes its closure,
    /// exits 0 and is not restarted). A number below 1 or above MAX is refused (exit 2) and
    /// nothing changes. Requests made one after another are queued and carried out in order.
    #[command(after_help = "Example: cohort scale --run-dir /tmp/job --workers 3 --ps 3")]
    Scale(ScaleArgs),
    /// Benchmarks: `bench ps` runs the dense, sparse and goodput parameter-server workloads,
    /// each on its own local cluster (1 chief, 2 PS, 2 workers, as processes), and prints
    /// steps/s, examples/s and PS push+pull goodput beside a bare quinn stream's; `bench
    /// allreduce` prints the process group's all-reduce algbw and busbw (2 and 4 members, 1, 16
    /// and 64 MiB) beside the bare QUIC ceiling; `bench mwms` prints MultiWorkerMirrored's
    /// steps/s on the MLP 784-256-256-10 with 2 and 3 worker processes;
    /// `bench nccl` (feature `nccl`) prints the NCCL all-reduce's algbw and busbw on the
    /// visible GPUs (1, 16 and 64 MiB), or "skipped: no GPU".
    #[command(after_help = "Example: cohort bench ps --workloads dense,sparse")]
    Bench(BenchArgs),
    /// Chaos testing: `chaos sim` runs the deterministic cluster simulator (the coordinator
    /// and parameter-server machines under simulated faults) over many seeds and checks
    /// PS-1, LEDGER-1, FENCE-1, CKPT-1 and the end-to-end result after every event; `chaos
    /// run --plan plan.toml -- <launch command>` applies a fault plan to a real local job.
    #[command(
        subcommand,
        after_help = "Example: cohort chaos run --plan examples/chaos/kill-worker-and-ps.toml --out /tmp/report -- cohort demo --no-chaos --run-dir /tmp/job --checkpoint-dir /tmp/job/ckpt"
    )]
    Chaos(ChaosCommand),
    /// Checkpoint tools: `ls` a checkpoint directory, `show` a checkpoint's variables and
    /// ledger, `verify` its files against the manifest, `export` whole variables to one
    /// safetensors file. Text by default, --json for machines.
    #[command(subcommand, after_help = "Example: cohort ckpt show --json /tmp/job/ckpt")]
    Ckpt(ckpt::CkptCommand),
    /// NCCL (builds with the feature `nccl`): `nccl info` prints the NCCL version this process
    /// loads and the GPUs it sees.
    #[command(subcommand, after_help = "Example: LD_LIBRARY_PATH=/path/to/nccl/lib cohort nccl info")]
    Nccl(nccl::NcclCommand),
    /// One member of a collective process group (used by the collective fault tests).
    #[command(hide = true)]
    CollectiveMember(collective_member::MemberArgs),
    /// One worker training under MultiWorkerMirrored (used by the multi-worker tests).
    #[command(hide = true)]
    MwmsMember(mwms_member::MwmsArgs),
    /// One task of `demo --strategy multi-worker-mirrored` (used by the launcher).
    #[command(hide = true)]
    MwmsDemoTask,
    /// The dense workload's step computation alone, timed (used by `bench ps --peers`, which
    /// runs it with one compute thread): prints `{"candle_ms": M, "version": V}`.
    #[command(hide = true)]
    BenchDenseCompute {
        /// Timed steps (after 30 untimed ones).
        #[arg(long, default_value_t = 300, value_parser = bench_steps())]
        steps: usize,
    },
    /// Run one task of a built-in job: what `launch` starts, and what a Kubernetes manifest
    /// runs in each pod (deploy/). Its role comes from the flags, the environment, TF_CONFIG
    /// or cohort.toml, in that order; each flag's environment variable and cohort.toml key are
    /// named in its help.
    #[command(
        after_help = "Example: TF_CONFIG='{\"cluster\": {\"chief\": [\"chief-0:2222\"], \"worker\": [\"worker-0:2222\"], \"ps\": [\"ps-0:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}' COHORT_CERTS=/etc/cohort/certs cohort role --job demo"
    )]
    // Boxed: the configuration flags make it several times larger than the other commands.
    Role(Box<RoleArgs>),
}

/// Flags of `cohort demo`.
#[derive(Debug, clap::Args)]
struct DemoArgs {
    #[command(flatten)]
    launch: crate::bootstrap::LaunchFlags,
    /// The strategy: `parameter-server` (the chief, --ps servers and --workers workers train
    /// the digits classifier and a CTR model) or `multi-worker-mirrored` (the chief and
    /// --workers workers, 3 in all by default, train the digits classifier synchronously,
    /// elastically: a killed worker's group re-forms and its restarted process rejoins).
    #[arg(long, value_enum, default_value_t = DemoStrategy::ParameterServer)]
    strategy: DemoStrategy,
    /// Digits epochs (parameter-server: 100 steps each, default 8; multi-worker-mirrored:
    /// passes over the training split, default 30).
    #[arg(long, value_parser = demo_epochs())]
    digits_epochs: Option<usize>,
    /// CTR epochs (200 steps each).
    #[arg(long, default_value_t = 8, value_parser = demo_epochs())]
    ctr_epochs: usize,
    /// Don't kill a worker. By default worker 1 (0 if it is the only one) is SIGKILLed once,
    /// when the chief reaches the middle of the CTR phase or 12s after launch (change it with
    /// --kill-worker-after), whichever comes first.
    #[arg(long)]
    no_chaos: bool,
    /// Checkpoint directory, kept after the run. Give the directory of an earlier run to
    /// resume from its newest valid checkpoint (e.g. after Ctrl-C/SIGTERM, which saves one and
    /// exits 143). Default: a new directory under the system's temporary directory, whose
    /// checkpoints are removed when the job succeeds (a loss curve and TensorBoard logs stay)
    /// unless --keep-checkpoints; kept, and named, when it does not.
    #[arg(long)]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Keep the checkpoints of the default checkpoint directory after a successful run.
    #[arg(long)]
    keep_checkpoints: bool,
    /// Start the variables from this safetensors file (written by another framework, or by
    /// `cohort ckpt export`) instead of their initializers, when there is no checkpoint to
    /// resume. Shapes must match; optimizer state starts fresh.
    #[arg(long)]
    warm_start: Option<std::path::PathBuf>,
    /// The name map of --warm-start: a TOML file of `"cohort name" = "name in the file"`.
    #[arg(long, requires = "warm_start")]
    warm_start_map: Option<std::path::PathBuf>,
    /// multi-worker-mirrored only: what sums the gradients across the tasks, `ring` (the
    /// group's collectives, the default) or `nccl` (NCCL, each task on the GPU of its place
    /// in the cluster: the chief GPU 0, worker i GPU i + 1; a build with the feature `nccl`,
    /// libnccl, the CUDA driver and a GPU per task).
    #[arg(long)]
    communication: Option<crate::strategy::Communication>,
}

/// `bench --steps`: at least one timed step (a rate over none is no figure), at most ten
/// million.
fn bench_steps() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000)
}

/// `bench --warmup`: none to a million.
fn bench_warmup() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1_000_000)
}

/// `cohort demo`'s epoch counts: whole numbers from 1 to 10,000 (as the MultiWorkerMirrored
/// demo's tasks take them), refused by the parser otherwise.
fn demo_epochs() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000)
}

/// The demo's checkpoint directory: the one given (made absolute, so that the tasks find it
/// whatever their working directory), else a new one under the temporary directory.
fn demo_checkpoint_dir(
    given: &Option<std::path::PathBuf>,
) -> Result<std::path::PathBuf, CliError> {
    match given {
        Some(dir) => Ok(std::path::absolute(dir).unwrap_or_else(|_| dir.clone())),
        None => crate::process::new_temp_dir("cohort-demo-").map_err(|e| {
            CliError::Failed(format!(
                "cannot make a checkpoint directory under {}: {e}",
                std::env::temp_dir().display()
            ))
        }),
    }
}

/// Runs the demo's local cluster, then settles its checkpoints ([`finish_demo_checkpoints`]
/// with `kept`: `--checkpoint-dir` given, `--keep-checkpoints`); exits with the chief's code.
fn launch_demo(
    launch: &crate::bootstrap::LaunchFlags,
    task_args: Vec<String>,
    env: Vec<(String, String)>,
    kept: (bool, bool),
    checkpoint_dir: &std::path::Path,
) -> ExitCode {
    let code = crate::bootstrap::launch_local(launch, task_args, env);
    finish_demo_checkpoints(kept.0, kept.1, checkpoint_dir, code);
    exit(code)
}

/// After a demo run that exited with `code`: the checkpoints of the default (temporary)
/// checkpoint directory `dir` are removed when the job succeeded and the user did not ask to
/// keep them (`--keep-checkpoints`); a directory the user named (`--checkpoint-dir`), or a run
/// that did not succeed (its checkpoints resume it), keeps them. Says which.
fn finish_demo_checkpoints(named: bool, keep: bool, dir: &std::path::Path, code: i32) {
    if named {
        return;
    }
    if code != 0 || keep {
        eprintln!(
            "cohort demo: checkpoints kept in {} (resume with --checkpoint-dir {0})",
            dir.display()
        );
        return;
    }
    let (removed, bytes) = remove_checkpoints(dir);
    // Gone too when nothing else was written there; else its loss curve and logs stay.
    let emptied = std::fs::remove_dir(dir).is_ok();
    if removed > 0 {
        eprintln!(
            "cohort demo: removed the run's {removed} checkpoint(s) ({:.1} MB) from {}{} \
             (--keep-checkpoints keeps them, --checkpoint-dir DIR writes them where you say)",
            bytes as f64 / 1e6,
            dir.display(),
            if emptied {
                ""
            } else {
                "; its loss curve and TensorBoard logs stay there"
            }
        );
    }
}

/// Removes the checkpoints (and unfinished saves) directly under `dir`: how many, and their
/// bytes. Anything else there stays; a failure to remove one is said and skipped.
fn remove_checkpoints(dir: &std::path::Path) -> (usize, u64) {
    use crate::checkpoint::{CHECKPOINT_DIR_PREFIX, TEMP_DIR_PREFIX};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let mut removed = (0, 0);
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !(name.starts_with(CHECKPOINT_DIR_PREFIX) || name.starts_with(TEMP_DIR_PREFIX)) {
            continue;
        }
        let bytes = dir_bytes(&entry.path());
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed = (removed.0 + 1, removed.1 + bytes),
            Err(e) => eprintln!("cohort demo: cannot remove {}: {e}", entry.path().display()),
        }
    }
    removed
}

/// The bytes of the files under `dir` (one level of subdirectories: a checkpoint's layout).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .map(|m| if m.is_dir() { 0 } else { m.len() })
        .sum()
}

/// The strategies `cohort demo` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DemoStrategy {
    /// Parameter-server training driven by the chief's coordinator.
    ParameterServer,
    /// Synchronous training, the gradients all-reduced among the workers.
    MultiWorkerMirrored,
}

/// Flags of `cohort launch`.
#[derive(Debug, clap::Args)]
struct LaunchArgs {
    /// The built-in job to run: `demo` (the parameter-server demo's tasks) or
    /// `multi-worker-mirrored` (the MultiWorkerMirrored demo's: the chief and --workers
    /// workers, no parameter server).
    #[arg(long, default_value = "demo")]
    job: String,
    #[command(flatten)]
    launch: crate::bootstrap::LaunchFlags,
}

/// Flags of `cohort scale`.
#[derive(Debug, clap::Args)]
struct ScaleArgs {
    /// The run directory the launcher was given (`launch --run-dir DIR`).
    #[arg(long)]
    run_dir: std::path::PathBuf,
    /// How many workers the job runs from now on (1 to the launch's MAX).
    #[arg(long, required_unless_present = "ps")]
    workers: Option<u32>,
    /// How many parameter servers the job runs from now on (1 to the launch's `--ps` MAX):
    /// each added one joins at a checkpoint cut, each removed one leaves once its variables
    /// moved onto the others.
    #[arg(long)]
    ps: Option<u32>,
}

/// `cohort scale`: one request per role given, workers first, queued for the launcher, which
/// takes them in the order they were made; a refused request changes nothing (and stops
/// before the next).
fn scale(args: &ScaleArgs) -> Result<(), CliError> {
    let dir = &args.run_dir;
    let usage = |e: crate::launch::ScaleError| CliError::Usage(e.to_string());
    if let Some(workers) = args.workers {
        crate::launch::request_scale(dir, workers).map_err(usage)?;
        outln!(
            "asked the launcher in {} for {workers} worker(s)",
            dir.display()
        );
    }
    if let Some(servers) = args.ps {
        crate::launch::request_scale_servers(dir, servers).map_err(usage)?;
        outln!(
            "asked the launcher in {} for {servers} parameter server(s)",
            dir.display()
        );
    }
    Ok(())
}

/// Flags of `cohort bench`.
#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// What to benchmark: `ps` (throughput), `recovery` (what each failure costs),
    /// `allreduce` (the process group's collectives), `mwms` (MultiWorkerMirrored training) or
    /// `nccl` (the NCCL all-reduce on this machine's GPUs).
    target: String,
    /// Timed steps per workload (after warm-up).
    #[arg(long, default_value_t = 1000, value_parser = bench_steps())]
    steps: usize,
    /// Warm-up steps per workload.
    #[arg(long, default_value_t = 30, value_parser = bench_warmup())]
    warmup: usize,
    /// Workloads to run (comma-separated: dense, sparse, goodput).
    #[arg(long, default_value = "dense,sparse,goodput")]
    workloads: String,
    /// `recovery`: seed of the spot scenario's preemption schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `ps`, `mwms` and `allreduce`: measure the peers in the same run (TensorFlow's
    /// ParameterServerStrategy and a PyTorch RPC parameter server on the dense workload;
    /// TensorFlow's MultiWorkerMirroredStrategy and PyTorch's DDP; gloo's all-reduce;
    /// benches/peers/) and print the ratios; their Python comes from --python.
    #[arg(long)]
    peers: bool,
    /// The Python that runs the peers (made by `bash benches/peers/setup.sh`).
    #[arg(long, default_value = "target/peers-venv/bin/python")]
    python: std::path::PathBuf,
}

/// What `cohort chaos` runs.
#[derive(Debug, Subcommand)]
enum ChaosCommand {
    /// Run the cluster simulator over a range of seeds (or one seed, with its trace) and
    /// print a summary: schedules, events, faults by kind, violations with their seeds (the
    /// first one shrunk to a scenario a test can paste). Exit 1 if an invariant broke.
    Sim(chaos::SimArgs),
    /// Run a job's launch command under a seeded fault plan (kill, pause, term, delete or
    /// corrupt a checkpoint, at seeded times), then check the job's invariants (exit code,
    /// every closure committed once, servers applying pushes, no panic) and write
    /// report.txt and report.json. Exit 0 when every check passed, 1 on a violation, 2 for
    /// bad usage (the message names the plan file and key).
    Run(chaos::RunArgs),
}

/// Flags of `cohort role`.
#[derive(Debug, clap::Args)]
struct RoleArgs {
    /// The built-in job.
    #[arg(long)]
    job: String,
    #[command(flatten)]
    config: crate::cluster::ConfigFlags,
}

/// `cohort role`'s help with each configuration flag's environment variable and cohort.toml
/// key. Named in the help only, not given to clap as `env`: the configuration layers
/// ([`crate::cluster::ConfigFlags`]) read the environment themselves, so that an error names
/// the layer a value came from.
fn with_config_sources(cli: clap::Command) -> clap::Command {
    cli.mut_subcommand("role", |mut role| {
        for key in crate::cluster::ConfigKey::ALL {
            let long = key.flag.trim_start_matches("--");
            let Some(id) = role
                .get_arguments()
                .find(|arg| arg.get_long() == Some(long))
                .map(|arg| arg.get_id().clone())
            else {
                continue;
            };
            role = role.mut_arg(id, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [env: {}] [cohort.toml: {}]", key.env, key.file))
            });
        }
        role
    })
}

/// Parses the process arguments and runs the command.
///
/// Longer than most functions here on purpose: one arm per subcommand, each handing its
/// arguments to the code that runs it.
pub fn run() -> ExitCode {
    // First, before any thread starts (it sets the environment).
    crate::process::follow_cpu_quota();
    let parsed = with_config_sources(Cli::command())
        .try_get_matches()
        .and_then(|matches| Ok((Cli::from_arg_matches(&matches)?, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => {
            // clap prints help/version to stdout with exit 0 and usage errors with exit 2.
            let _ = err.print();
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
        }
    };
    // Whether `--ps` was on the command line of a command that launches a job (a
    // MultiWorkerMirrored job has no server to take it).
    let ps_given = ["demo", "launch"]
        .iter()
        .filter_map(|name| matches.subcommand_matches(name))
        .any(|sub| sub.value_source("ps") == Some(ValueSource::CommandLine));
    let result = match cli.command {
        Command::Certs(args) => certs::run(args),
        Command::Demo(args) if args.strategy == DemoStrategy::MultiWorkerMirrored => {
            let mut launch = args.launch;
            // Refused here, before any task starts: the launcher would start tasks the group
            // cannot take, and restart each as it failed.
            if let Err(detail) = mwms_launch_check(&launch, ps_given) {
                eprintln!("error: {detail}");
                return ExitCode::from(2);
            }
            let mut env = mwms_launch(&mut launch);
            if !args.no_chaos && launch.kill_worker_after.is_none() {
                // The chief marks the middle of training; this is the fallback.
                launch.kill_worker_after = Some(std::time::Duration::from_secs(60));
            }
            let checkpoint_dir = match demo_checkpoint_dir(&args.checkpoint_dir) {
                Ok(dir) => dir,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(e.exit_code());
                }
            };
            let communication = args.communication.unwrap_or_default();
            // Refused here, at once, rather than by every task in turn as the launcher
            // restarts it. The tasks check their own GPU again.
            if let crate::strategy::Communication::Nccl { .. } = communication {
                let first = crate::strategy::Communication::Nccl { device: 0 };
                if let Err(detail) = first.check() {
                    eprintln!("error: --communication: {detail}");
                    return ExitCode::from(2);
                }
            }
            env.extend([
                (
                    crate::workloads::mwms_demo::COMMUNICATION_ENV.to_string(),
                    // Plain `nccl`: each task takes the GPU of its place in the cluster.
                    match communication {
                        crate::strategy::Communication::Nccl { .. } => "nccl".to_string(),
                        ring => ring.to_string(),
                    },
                ),
                (
                    crate::workloads::mwms_demo::EPOCHS_ENV.to_string(),
                    args.digits_epochs
                        .unwrap_or(crate::workloads::mwms_demo::DEFAULT_EPOCHS)
                        .to_string(),
                ),
                (
                    crate::cluster::ConfigKey::CHECKPOINT_DIR.env.to_string(),
                    checkpoint_dir.display().to_string(),
                ),
            ]);
            let kept = (args.checkpoint_dir.is_some(), args.keep_checkpoints);
            let task = vec!["mwms-demo-task".to_string()];
            return launch_demo(&launch, task, env, kept, &checkpoint_dir);
        }
        Command::MwmsDemoTask => {
            if let Err(e) = crate::bootstrap::logging::init() {
                eprintln!("error: bad config: {e}");
                return ExitCode::from(2);
            }
            match crate::workloads::mwms_demo::run_task() {
                Ok(()) => return ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(err.exit_code());
                }
            }
        }
        Command::Demo(args) if args.communication.is_some() => Err(CliError::Usage(
            "--communication: only with --strategy multi-worker-mirrored (the parameter-server \
             demo's workers push their gradients to the servers)"
                .into(),
        )),
        Command::Demo(args) => {
            let mut launch = args.launch;
            if !args.no_chaos && launch.kill_worker_after.is_none() {
                launch.kill_worker_after = Some(std::time::Duration::from_secs(12));
            }
            let checkpoint_dir = match demo_checkpoint_dir(&args.checkpoint_dir) {
                Ok(dir) => dir,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(e.exit_code());
                }
            };
            let mut env = vec![
                (
                    "COHORT_DEMO_DIGITS_EPOCHS".to_string(),
                    args.digits_epochs.unwrap_or(8).to_string(),
                ),
                (
                    "COHORT_DEMO_CTR_EPOCHS".to_string(),
                    args.ctr_epochs.to_string(),
                ),
                (
                    crate::cluster::ConfigKey::CHECKPOINT_DIR.env.to_string(),
                    checkpoint_dir.display().to_string(),
                ),
                (
                    crate::workloads::demo::CHAOS_ENV.to_string(),
                    launch.kill_worker_after.is_some().to_string(),
                ),
            ];
            let keys = [
                crate::cluster::ConfigKey::WARM_START,
                crate::cluster::ConfigKey::WARM_START_MAP,
            ];
            for (key, path) in keys.iter().zip([&args.warm_start, &args.warm_start_map]) {
                if let Some(path) = path {
                    // Absolute, as the checkpoint directory.
                    let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                    env.push((key.env.to_string(), path.display().to_string()));
                }
            }
            let kept = (args.checkpoint_dir.is_some(), args.keep_checkpoints);
            return launch_demo(&launch, role_args("demo"), env, kept, &checkpoint_dir);
        }
        Command::Launch(args) if args.job == MWMS_JOB => {
            let mut launch = args.launch;
            if let Err(detail) = mwms_launch_check(&launch, ps_given) {
                eprintln!("error: {detail}");
                return ExitCode::from(2);
            }
            let env = mwms_launch(&mut launch);
            // Its settings (COHORT_DEMO_DIGITS_EPOCHS, COHORT_DEMO_COMMUNICATION,
            // COHORT_CHECKPOINT_DIR) reach the tasks through the environment.
            return exit(crate::bootstrap::launch_local(
                &launch,
                vec!["mwms-demo-task".to_string()],
                env,
            ));
        }
        Command::Launch(args) => {
            if builtin_job(&args.job).is_none() {
                Err(CliError::Usage(format!(
                    "--job: unknown job {:?} (built-in jobs: demo, {MWMS_JOB})",
                    args.job
                )))
            } else {
                return exit(crate::bootstrap::launch_local(
                    &args.launch,
                    role_args(&args.job),
                    Vec::new(),
                ));
            }
        }
        Command::Scale(args) => scale(&args),
        Command::Bench(args) if args.target == "recovery" => {
            bench_recovery::run(args.steps, args.seed)
        }
        Command::Bench(args) if args.target == "allreduce" => {
            bench_allreduce::run(args.peers.then_some(args.python.as_path()))
        }
        Command::Bench(args) if args.target == "mwms" => bench_mwms::run(
            args.steps,
            args.warmup,
            args.peers.then_some(args.python.as_path()),
        ),
        Command::Bench(args) if args.target == "nccl" => nccl::bench(),
        Command::Nccl(command) => nccl::run(command),
        Command::CollectiveMember(args) => match collective_member::run(args) {
            Ok(code) => return ExitCode::from(code),
            Err(err) => Err(err),
        },
        Command::MwmsMember(args) => match mwms_member::run(args) {
            Ok(code) => return ExitCode::from(code),
            Err(err) => Err(err),
        },
        Command::BenchDenseCompute { steps } => bench::dense_compute(steps),
        Command::Bench(args) => bench::run(
            &args.target,
            args.steps,
            args.warmup,
            &args.workloads,
            args.peers.then_some(args.python.as_path()),
        ),
        Command::Chaos(ChaosCommand::Sim(args)) => chaos::run(args),
        Command::Chaos(ChaosCommand::Run(args)) => chaos::run_plan(args),
        Command::Ckpt(command) => ckpt::run(command),
        Command::Role(args) => match builtin_job(&args.job) {
            Some(program) => {
                return exit(crate::bootstrap::run_role(
                    std::sync::Arc::new(program),
                    &args.config,
                ))
            }
            None => Err(CliError::Usage(format!(
                "--job: unknown job {:?} (built-in jobs: demo)",
                args.job
            ))),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// `cohort launch --job` of the MultiWorkerMirrored demo's tasks.
const MWMS_JOB: &str = "multi-worker-mirrored";

/// What a MultiWorkerMirrored job cannot be launched with: it has no parameter server
/// (`ps_given`: `--ps` was on the command line) and no evaluator (the chief evaluates the
/// held-out digits at the end). `--workers MIN:MAX` is elastic, as for the parameter-server
/// job: `cohort scale` adds workers (each joins the group at a step boundary) or drains them
/// (each leaves at one, for good).
fn mwms_launch_check(
    launch: &crate::bootstrap::LaunchFlags,
    ps_given: bool,
) -> Result<(), MwmsLaunchError> {
    if ps_given {
        return Err(MwmsLaunchError::ParameterServers { ps: launch.ps.min });
    }
    if launch.evaluators > 0 {
        return Err(MwmsLaunchError::Evaluators {
            evaluators: launch.evaluators,
        });
    }
    Ok(())
}

/// What a MultiWorkerMirrored job was launched with that it cannot have
/// ([`mwms_launch_check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum MwmsLaunchError {
    /// `--ps` was given.
    #[error(
        "--ps {ps}: a MultiWorkerMirrored job has no parameter server (its workers all-reduce \
         their gradients)"
    )]
    ParameterServers {
        /// The servers asked for.
        ps: u32,
    },
    /// `--evaluators` was above 0.
    #[error(
        "--evaluators {evaluators}: the MultiWorkerMirrored demo has no evaluator (its chief \
         evaluates the held-out digits once training ends)"
    )]
    Evaluators {
        /// The evaluators asked for.
        evaluators: u32,
    },
}

/// A MultiWorkerMirrored job's launch: the chief and the workers are the group, with no
/// parameter server; the chief is rank 0 of it, so preempted it leaves and rejoins as a worker
/// does. Returns the tasks' environment: the workers the job starts with (the chief and the
/// first `--workers`), which sets the plan of steps in every task alike, those added later
/// included.
fn mwms_launch(launch: &mut crate::bootstrap::LaunchFlags) -> Vec<(String, String)> {
    launch.ps = crate::bootstrap::WorkerCount::from(0);
    launch.peer_chief = true;
    vec![(
        crate::workloads::mwms_demo::PLANNED_WORKERS_ENV.to_string(),
        (launch.workers.min + 1).to_string(),
    )]
}

fn role_args(job: &str) -> Vec<String> {
    vec!["role".into(), "--job".into(), job.into()]
}

fn builtin_job(name: &str) -> Option<crate::program::Program> {
    match name {
        "demo" => Some(crate::workloads::demo::demo_program()),
        "bench" => Some(crate::workloads::bench::bench_program()),
        _ => None,
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// A command's failure, classified by exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad flags, config or input files (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The command ran and failed (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}
