//! `cohort collective-member` (hidden): one member of a process group as its own process, for
//! the fault tests of the collectives (a member SIGKILLed or SIGSTOPped mid-collective).
//!
//! It forms generation 1 with the members given, then all-reduces a tensor round after round until
//! its stdin closes, checking every result, and prints one line per event on stdout:
//! `formed generation=E rank=R members=[..]`, `ok generation=E round=K`, `error generation=E kind=K node=N
//! detail=..`, `stopped`. When a member is lost it re-forms with the others at the next generation
//! and goes on; any other error ends it with exit code 3. With `--bench-mib` it times
//! all-reduces instead, for `cohort bench allreduce`'s members as processes.

use crate::process::stdout::outln;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use cohort_transport::{Endpoint, NodeCredentials, NodeId, TransportConfig};

use super::CliError;
use crate::collective::{CollectiveError, GroupConfig, GroupMember, Mesh, ProcessGroup, Reduction};

/// Flags of `cohort collective-member`.
#[derive(Debug, clap::Args)]
pub(crate) struct MemberArgs {
    /// This member's node, `role/index`.
    #[arg(long)]
    node: String,
    /// Directory with ca.pem and this node's certificate and key (`cohort certs` layout).
    #[arg(long)]
    certs: PathBuf,
    /// UDP address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// Every member as `role/index=host:port`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    members: Vec<String>,
    /// Elements of the f32 tensor all-reduced each round, at most 2^30 (4 GiB).
    #[arg(long, default_value_t = 1 << 20,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 30))]
    elements: usize,
    /// The transport's idle timeout: the detection budget of a lost member.
    #[arg(long, default_value_t = 800)]
    idle_timeout_ms: u64,
    /// The plaintext data plane (`GroupConfig::plaintext`).
    #[arg(long)]
    plaintext: bool,
    /// On the plaintext plane, keep every chunk on TCP: no shared memory between members on
    /// this host (`GroupConfig::shared_memory`).
    #[arg(long)]
    no_shared_memory: bool,
    /// Benchmark mode (`cohort bench allreduce`): after forming, all-reduce an f32 tensor of
    /// this many MiB `--bench-warmup` times, then `--bench-rounds` times, print `bench
    /// rounds=N seconds=S` and exit.
    #[arg(long)]
    bench_mib: Option<usize>,
    /// Untimed all-reduces first in benchmark mode (a fresh process faults in its buffers'
    /// pages during the first few).
    #[arg(long, default_value_t = 2)]
    bench_warmup: usize,
    /// Timed all-reduces in benchmark mode.
    #[arg(long, default_value_t = 10)]
    bench_rounds: usize,
}

/// Bound on a benchmark member's wait, before it exits, for its last chunks to be taken.
const BENCH_FLUSH_MAX: Duration = Duration::from_secs(60);

/// Runs the member (see the module doc).
pub(crate) fn run(args: MemberArgs) -> Result<u8, CliError> {
    let usage = |what: &str, e: &dyn std::fmt::Display| CliError::Usage(format!("{what}: {e}"));
    let node: NodeId = args.node.parse().map_err(|e| usage("--node", &e))?;
    let mut members = Vec::new();
    for spec in &args.members {
        let (name, addr) = spec.split_once('=').ok_or_else(|| {
            CliError::Usage(format!("--members: {spec:?} is not role/index=host:port"))
        })?;
        members.push(GroupMember {
            node: name.parse().map_err(|e| usage("--members", &e))?,
            addr: addr.parse().map_err(|e| usage("--members", &e))?,
        });
    }
    let creds = NodeCredentials::load(&args.certs, &node).map_err(|e| usage("--certs", &e))?;
    let idle = Duration::from_millis(args.idle_timeout_ms.max(200));
    let config = TransportConfig {
        idle_timeout: idle,
        keep_alive_interval: idle / 4,
        ..TransportConfig::for_tests()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop_reader = stop.clone();
    // stdin closing is the test's "stop": no signal needed, and a test that dies stops us.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        stop_reader.store(true, Ordering::SeqCst);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(e.to_string()))?;
    runtime.block_on(async move {
        let endpoint =
            Endpoint::bind(args.listen, creds, config).map_err(|e| usage("--listen", &e))?;
        let config = GroupConfig {
            plaintext: args.plaintext,
            shared_memory: !args.no_shared_memory,
            ..GroupConfig::default()
        };
        let mesh = Mesh::new(endpoint, config);
        let group = match mesh.form(1, members).await {
            Ok(group) => group,
            Err(err) => {
                report(1, &err);
                return Ok(3);
            }
        };
        formed(&group);
        if let Some(mib) = args.bench_mib {
            return match time_all_reduce(&group, mib, args.bench_warmup, args.bench_rounds).await {
                Ok(seconds) => {
                    outln!(
                        "bench rounds={} seconds={seconds} shared-memory-peers={}",
                        args.bench_rounds,
                        group.shared_memory_peers().len()
                    );
                    // Every chunk taken before this process goes (a peer may be finishing):
                    // the chunks of the last round wait in this member's queue until the
                    // peer makes room, which on a busy machine with 64 MiB rounds took more
                    // than 5 s (the peer then lost this member mid-round). The wait ends as
                    // soon as they are taken.
                    group.flush(BENCH_FLUSH_MAX).await;
                    Ok(0)
                }
                Err(err) => {
                    report(group.generation(), &err);
                    Ok(3)
                }
            };
        }
        all_reduce_until_stopped(group, &node, args.elements, &stop).await
    })
}

/// All-reduces round after round until `stop` (stdin closed); after a member is lost,
/// re-forms with the others and goes on. The process's exit code.
async fn all_reduce_until_stopped(
    mut group: ProcessGroup,
    node: &NodeId,
    elements: usize,
    stop: &AtomicBool,
) -> Result<u8, CliError> {
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match one_round(&group, node, elements).await {
            Ok(()) => {
                round += 1;
                outln!(
                    "ok generation={} round={round} shared-memory-peers={}",
                    group.generation(),
                    group.shared_memory_peers().len()
                );
            }
            Err(err) => {
                report(group.generation(), &err);
                let CollectiveError::MemberLost { node: lost, .. } = &err else {
                    return Ok(3);
                };
                let survivors: Vec<NodeId> = group
                    .members()
                    .iter()
                    .filter(|n| *n != lost)
                    .cloned()
                    .collect();
                group = match group.reform(&survivors).await {
                    Ok(group) => group,
                    Err(err) => {
                        report(group.generation() + 1, &err);
                        return Ok(3);
                    }
                };
                formed(&group);
                round = 0;
            }
        }
    }
    outln!("stopped");
    Ok(0)
}

/// All-reduces `elements` small integers weighted by this node's index + 1 and checks the sum
/// (exact in f32 whatever the order).
async fn one_round(
    group: &ProcessGroup,
    node: &NodeId,
    elements: usize,
) -> Result<(), CollectiveError> {
    let weight = (node.index + 1) as f32;
    let values: Vec<f32> = (0..elements).map(|i| (i % 13) as f32 * weight).collect();
    let tensor = Tensor::from_vec(values, elements, &Device::Cpu)
        .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
    let out = group.all_reduce(Reduction::Sum, &tensor).await?;
    let total: f32 = group.members().iter().map(|n| (n.index + 1) as f32).sum();
    let out = out
        .to_vec1::<f32>()
        .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
    if let Some(i) = (0..elements).find(|&i| out[i] != (i % 13) as f32 * total) {
        return Err(CollectiveError::Tensor(format!(
            "wrong sum at {i}: {} where the members {:?} give {}",
            out[i],
            group.members(),
            (i % 13) as f32 * total
        )));
    }
    Ok(())
}

/// Seconds of `rounds` all-reduces of `mib` MiB of f32 ones (after `warmup` untimed ones),
/// the last checked.
async fn time_all_reduce(
    group: &ProcessGroup,
    mib: usize,
    warmup: usize,
    rounds: usize,
) -> Result<f64, CollectiveError> {
    let tensor = Tensor::ones((mib << 20) / 4, candle_core::DType::F32, &Device::Cpu)
        .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
    for _ in 0..warmup {
        group.all_reduce(Reduction::Sum, &tensor).await?;
    }
    let started = std::time::Instant::now();
    let mut last = None;
    for _ in 0..rounds {
        last = Some(group.all_reduce(Reduction::Sum, &tensor).await?);
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(out) = last {
        let first = out
            .flatten_all()
            .and_then(|t| t.get(0))
            .and_then(|v| v.to_scalar::<f32>())
            .map_err(|e| CollectiveError::Tensor(e.to_string()))?;
        if first != group.size() as f32 {
            return Err(CollectiveError::Tensor(format!(
                "the sum of {} ones came out {first}",
                group.size()
            )));
        }
    }
    Ok(seconds)
}

fn formed(group: &ProcessGroup) {
    let members: Vec<String> = group.members().iter().map(ToString::to_string).collect();
    outln!(
        "formed generation={} rank={} members=[{}]",
        group.generation(),
        group.rank(),
        members.join(",")
    );
}

fn report(generation: u64, err: &CollectiveError) {
    let (kind, node) = match err {
        CollectiveError::MemberLost { node, .. } => ("member-lost", node.to_string()),
        CollectiveError::GenerationRefused { node, .. } => ("generation-refused", node.to_string()),
        CollectiveError::Mismatch { node, .. } => ("mismatch", node.to_string()),
        CollectiveError::PeerTimeout { node, .. } => ("peer-timeout", node.to_string()),
        CollectiveError::Link { node, .. } => ("link", node.to_string()),
        CollectiveError::Form { .. } => ("form", String::new()),
        _ => ("other", String::new()),
    };
    outln!("error generation={generation} kind={kind} node={node} detail={err}");
}
