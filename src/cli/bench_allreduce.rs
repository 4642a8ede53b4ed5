//! `cohort bench allreduce`: the process group's all-reduce on 127.0.0.1 beside the bare QUIC
//! ceiling measured by the same program, with nccl-tests' definitions: algbw = bytes / time,
//! busbw = algbw * 2(n-1)/n, and each row's busbw as a fraction of the ring's bound (the
//! ceiling divided by the members: on one machine every member's bytes share its cores).
//! Then the same over the plaintext data plane (TCP links set up over QUIC): as tasks, and as
//! processes twice, with every chunk on TCP and with chunks passed through shared memory (all
//! members are on one host here). With `--peers`, gloo's all-reduce (through
//! torch.distributed, `benches/peers/gloo_allreduce.py`) runs with its members as processes in
//! the same invocation, and the member-process rows get its busbw and the ratios.

use crate::process::stdout::outln;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use cohort_transport::TransportConfig;

use super::bench_mwms::BenchRunError;
use super::CliError;
use crate::collective::{loopback_group, CollectiveError, GroupConfig, ProcessGroup, Reduction};

/// Runs the benchmark and prints its table; with `peers` (the Python that runs them), gloo's
/// all-reduce beside the member-process rows.
pub fn run(peers: Option<&std::path::Path>) -> Result<(), CliError> {
    let before = super::bench::bare_quinn_goodput()?;
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(format!("bench allreduce: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    let mut rows = Vec::new();
    let mut plain_rows = Vec::new();
    for (plaintext, out) in [(false, &mut rows), (true, &mut plain_rows)] {
        for members in MEMBERS {
            let groups = runtime
                .block_on(form(members, plaintext))
                .map_err(|e| failed(&e))?;
            for mib in SIZES_MIB {
                let seconds = runtime
                    .block_on(time_all_reduce(&groups, mib))
                    .map_err(|e| failed(&e))?;
                out.push((members, mib, seconds));
            }
        }
    }
    drop(runtime);
    // The plaintext plane again with every member a process of its own, as gloo runs:
    // TCP alone, then with shared memory.
    let mut process_rows = [Vec::new(), Vec::new()];
    for (shared, out) in [false, true].into_iter().zip(&mut process_rows) {
        for members in MEMBERS {
            for mib in SIZES_MIB {
                // Fresh processes vary more from run to run than tasks (where the scheduler
                // puts their threads on 2 cores): the median of a few runs.
                let mut runs = (0..PROCESS_RUNS)
                    .map(|_| time_member_processes(members, mib, shared))
                    .collect::<Result<Vec<f64>, _>>()
                    .map_err(|e| failed(&e))?;
                runs.sort_by(f64::total_cmp);
                out.push((members, mib, runs[runs.len() / 2]));
            }
        }
    }
    // gloo, its members processes too, on the same sizes, in this invocation.
    let gloo: Vec<_> = process_rows[0]
        .iter()
        .map(|&(members, mib, _)| {
            super::peers::run_peer_figure(
                peers,
                "gloo_allreduce.py",
                &[format!("--members={members}"), format!("--mib={mib}")],
                "seconds",
            )
        })
        .collect();
    let after = super::bench::bare_quinn_goodput()?;
    let ceiling = (before + after) / 2.0 * MIB / 1e9;
    outln!(
        "\ncohort bench allreduce: f32 all-reduce (SUM) over QUIC, members as tasks on 127.0.0.1 \
         ({} cores); bare QUIC ceiling (one stream, same program) {ceiling:.2} GB/s \
         ({:.2} before, {:.2} after the runs)",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        before * MIB / 1e9,
        after * MIB / 1e9
    );
    print_quic_rows(&rows, ceiling);
    outln!("target: busbw/bound >= 0.70 at 64 MiB");
    outln!(
        "\nplaintext data plane (GroupConfig::plaintext: TCP links set up over QUIC; trusted \
         networks only)"
    );
    print_plain_rows(
        "members as tasks of one process (shared memory between them)",
        &plain_rows,
    );
    let [tcp_rows, shared_rows] = &process_rows;
    print_plain_rows(
        &format!(
            "members as processes (cohort collective-member), every chunk on \
             TCP (GroupConfig::shared_memory off); median of {PROCESS_RUNS} runs"
        ),
        tcp_rows,
    );
    print_plain_rows(
        &format!(
            "members as processes, chunks passed through shared memory (GroupConfig::\
             shared_memory, the default: members on one host); median of {PROCESS_RUNS} runs"
        ),
        shared_rows,
    );
    outln!(
        "\ngloo (torch.distributed, members as processes on 127.0.0.1, TCP), measured in this \
         run, against cohort's member processes above:"
    );
    print_gloo_comparison(tcp_rows, shared_rows, &gloo);
    Ok(())
}

/// The QUIC rows (members, MiB, seconds per all-reduce) against the ring's bound on a link
/// of `ceiling` GB/s.
fn print_quic_rows(rows: &[(u32, usize, f64)], ceiling: f64) {
    outln!(
        "{:>7} {:>8} {:>10} {:>12} {:>12} {:>14} {:>10}",
        "members", "size", "time ms", "algbw GB/s", "busbw GB/s", "bound GB/s", "busbw/bound"
    );
    for &(members, mib, seconds) in rows {
        let n = members as f64;
        let algbw = mib as f64 * MIB / seconds / 1e9;
        let busbw = algbw * 2.0 * (n - 1.0) / n;
        let bound = ceiling / n;
        outln!(
            "{members:>7} {:>8} {:>10.2} {algbw:>12.3} {busbw:>12.3} {bound:>14.3} {:>10.2}",
            format!("{mib} MiB"),
            seconds * 1e3,
            busbw / bound
        );
    }
}

/// gloo's busbw beside cohort's member processes (every chunk on TCP, `tcp_rows`; through
/// shared memory, `shared_rows`), with the ratios; or why gloo was not measured.
fn print_gloo_comparison(
    tcp_rows: &[(u32, usize, f64)],
    shared_rows: &[(u32, usize, f64)],
    gloo: &[Result<(f64, String), super::peers::PeerError>],
) {
    outln!(
        "{:>7} {:>8} {:>16} {:>16} {:>12} {:>16} {:>12}",
        "members",
        "size",
        "gloo busbw GB/s",
        "cohort TCP GB/s",
        "ratio",
        "cohort shm GB/s",
        "ratio"
    );
    for (((members, mib, tcp), (_, _, shared)), gloo) in
        tcp_rows.iter().zip(shared_rows).zip(gloo)
    {
        let busbw = |seconds: f64| {
            let n = f64::from(*members);
            *mib as f64 * MIB / seconds / 1e9 * 2.0 * (n - 1.0) / n
        };
        let (theirs, tcp_ratio, shared_ratio) = match gloo {
            Ok((seconds, _)) => (
                format!("{:.3}", busbw(*seconds)),
                format!("{:.2}x", busbw(*tcp) / busbw(*seconds)),
                format!("{:.2}x", busbw(*shared) / busbw(*seconds)),
            ),
            Err(_) => ("not measured".into(), "-".into(), "-".into()),
        };
        outln!(
            "{members:>7} {:>8} {theirs:>16} {:>16.3} {tcp_ratio:>12} {:>16.3} {shared_ratio:>12}",
            format!("{mib} MiB"),
            busbw(*tcp),
            busbw(*shared),
        );
    }
    match gloo.iter().find_map(|g| g.as_ref().err()) {
        Some(why) => outln!("gloo: not measured: {why} (bash benches/peers/setup.sh, then --peers)"),
        None => {
            if let Some(Ok((_, version))) = gloo.first() {
                outln!("gloo: torch {version}");
            }
        }
    }
}

/// The plaintext plane's rows (members, MiB, seconds per all-reduce).
fn print_plain_rows(how: &str, rows: &[(u32, usize, f64)]) {
    outln!("{how}:");
    outln!(
        "{:>7} {:>8} {:>10} {:>12} {:>12}",
        "members", "size", "time ms", "algbw GB/s", "busbw GB/s"
    );
    for &(members, mib, seconds) in rows {
        let n = members as f64;
        let algbw = mib as f64 * MIB / seconds / 1e9;
        let busbw = algbw * 2.0 * (n - 1.0) / n;
        outln!(
            "{members:>7} {:>8} {:>10.2} {algbw:>12.3} {busbw:>12.3}",
            format!("{mib} MiB"),
            seconds * 1e3,
        );
    }
}

/// Seconds of one plaintext all-reduce of `mib` MiB among `members` processes of this binary
/// (`collective-member --bench-mib`), with or without shared memory between them: the slowest
/// member's mean. An error if `shared` and a member passed nothing through shared memory.
fn time_member_processes(
    members: u32,
    mib: usize,
    shared: bool,
) -> Result<f64, AllReduceBenchError> {
    let dir = crate::process::new_temp_dir("cohort-bench-allreduce-")
        .map_err(AllReduceBenchError::ScratchDir)?;
    let addrs = super::bench_mwms::bench_nodes(&dir, members as usize)?;
    let spec: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("worker/{i}={addr}"))
        .collect();
    // A fresh process faults in its buffers' pages during its first calls: a longer warm-up
    // and more timed calls than the tasks' (1 GiB of each: 16 calls at 64 MiB).
    let rounds = (PROCESS_BYTES / (mib << 20)).clamp(3, 40);
    let exe = std::env::current_exe().map_err(AllReduceBenchError::Executable)?;
    let timed = super::bench_mwms::run_bench_processes(
        members as usize,
        |index| {
            let mut command = std::process::Command::new(&exe);
            command
                .arg("collective-member")
                .args(["--node", &format!("worker/{index}")])
                .arg("--certs")
                .arg(&dir)
                .args(["--listen", &addrs[index], "--members", &spec.join(",")])
                .args(["--idle-timeout-ms", "10000", "--plaintext"])
                .args(["--bench-mib", &mib.to_string()])
                .args(["--bench-warmup", &rounds.to_string()])
                .args(["--bench-rounds", &rounds.to_string()])
                .args((!shared).then_some("--no-shared-memory"));
            command
        },
        |text| {
            let field = |key| super::bench_mwms::bench_field(text, key);
            let rounds: usize = field("rounds")?.parse().ok()?;
            let seconds: f64 = field("seconds")?.parse().ok()?;
            let sharing: usize = field("shared-memory-peers")?.parse().ok()?;
            // A row of shared memory is one only if every member passed chunks through it.
            (rounds > 0 && seconds > 0.0 && (sharing > 0) == shared)
                .then_some(seconds / rounds as f64)
        },
        PROCESS_RUN_MAX,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let timed = timed.map_err(|source| AllReduceBenchError::MemberProcesses {
        members,
        mib,
        source,
    })?;
    Ok(timed.values().copied().fold(0.0, f64::max))
}

/// Runs of fresh member processes per row (the row shows their median).
const PROCESS_RUNS: usize = 3;
/// Bytes all-reduced per member-process row, warm-up and timed each.
const PROCESS_BYTES: usize = 1 << 30;
/// Bound on one run of member processes, forming included.
const PROCESS_RUN_MAX: Duration = Duration::from_secs(120);

/// `n` members on their own endpoints in this process, formed at epoch 1 (over the
/// plaintext data plane if `plaintext`).
async fn form(n: u32, plaintext: bool) -> Result<Vec<ProcessGroup>, AllReduceBenchError> {
    let config = GroupConfig {
        plaintext,
        ..GroupConfig::default()
    };
    let (_, groups) = loopback_group(n, TransportConfig::default(), config).await?;
    Ok(groups)
}

/// Mean seconds of one all-reduce of `mib` MiB on every member at once, after warm-up.
async fn time_all_reduce(groups: &[ProcessGroup], mib: usize) -> Result<f64, AllReduceBenchError> {
    let elements = mib * (1 << 20) / 4;
    // A tensor of each member's own, as processes have (one shared input would be read from
    // the cache by every member after the first).
    let tensors = groups
        .iter()
        .map(|_| Tensor::ones(elements, DType::F32, &Device::Cpu))
        .collect::<Result<Vec<_>, _>>()?;
    let iterations = (TIMED_BYTES / (mib << 20)).clamp(3, 20);
    let mut timed = Duration::ZERO;
    for i in 0..WARMUP + iterations {
        let started = Instant::now();
        // Each member's call is a task of its own, so that members reduce and copy on the
        // runtime's threads side by side, as processes would (polled together in one future,
        // every member's share of the work ran on a single thread).
        let calls = groups.iter().zip(&tensors).map(|(g, t)| {
            let (group, tensor) = (g.clone(), t.clone());
            tokio::spawn(async move { group.all_reduce(Reduction::Sum, &tensor).await })
        });
        let outs = futures::future::join_all(calls.collect::<Vec<_>>()).await;
        let elapsed = started.elapsed();
        for out in outs {
            out??;
        }
        if i >= WARMUP {
            timed += elapsed;
        }
    }
    Ok(timed.as_secs_f64() / iterations as f64)
}

/// Why a row of the benchmark could not be measured.
#[derive(Debug, thiserror::Error)]
enum AllReduceBenchError {
    /// No scratch directory for the member processes' certificates.
    #[error("a scratch directory: {0}")]
    ScratchDir(#[source] std::io::Error),
    /// This program's executable, which the member processes run, cannot be found.
    #[error("cannot find this program's executable: {0}")]
    Executable(#[source] std::io::Error),
    /// The member processes' certificates or ports could not be made.
    #[error(transparent)]
    Nodes(#[from] BenchRunError),
    /// A run of member processes failed.
    #[error("{members} member processes, {mib} MiB: {source}")]
    MemberProcesses {
        /// Members run.
        members: u32,
        /// MiB all-reduced.
        mib: usize,
        /// What failed.
        source: BenchRunError,
    },
    /// The in-process group could not form, or an all-reduce failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A member's input tensor could not be made.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    /// A member's all-reduce task panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

const MEMBERS: [u32; 2] = [2, 4];
const SIZES_MIB: [usize; 3] = [1, 16, 64];
const WARMUP: usize = 2;
/// Bytes all-reduced per row (at least 3 and at most 20 calls).
const TIMED_BYTES: usize = 512 << 20;
const MIB: f64 = 1024.0 * 1024.0;
