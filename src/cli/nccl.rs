//! `cohort nccl info` and `cohort bench nccl`: the NCCL this build loads, the GPUs it sees,
//! and the NCCL all-reduce's bandwidth on them (feature `nccl`; without it both say so and
//! fail).

#[cfg(feature = "nccl")]
use crate::process::stdout::outln;
use super::CliError;

/// What `cohort nccl` runs.
#[derive(Debug, clap::Subcommand)]
pub enum NcclCommand {
    /// Print the NCCL version this process loads (libnccl.so.2 from LD_LIBRARY_PATH) and the
    /// GPUs it sees. Exit 1 when NCCL cannot be loaded (the message says what is missing).
    Info,
}

#[cfg(not(feature = "nccl"))]
fn no_nccl() -> CliError {
    CliError::Failed(
        "this build of cohort has no NCCL: build it with `cargo build --features nccl`".into(),
    )
}

/// Runs `cohort nccl ...`.
#[cfg(not(feature = "nccl"))]
pub fn run(_command: NcclCommand) -> Result<(), CliError> {
    Err(no_nccl())
}

/// Runs `cohort bench nccl`.
#[cfg(not(feature = "nccl"))]
pub fn bench() -> Result<(), CliError> {
    Err(no_nccl())
}

/// Runs `cohort nccl ...`.
#[cfg(feature = "nccl")]
pub fn run(command: NcclCommand) -> Result<(), CliError> {
    match command {
        NcclCommand::Info => {
            let version = crate::collective::nccl_version()
                .map_err(|e| CliError::Failed(format!("nccl info: {e}")))?;
            outln!("NCCL {version} ({})", version.library);
            match crate::collective::visible_gpus() {
                Ok(gpus) => {
                    outln!("GPUs: {}", gpus.len());
                    for gpu in gpus {
                        outln!("  {}: {}", gpu.ordinal, gpu.name);
                    }
                }
                Err(e) => outln!("GPUs: none ({e})"),
            }
            Ok(())
        }
    }
}

/// Runs `cohort bench nccl`: the NCCL all-reduce (f32, SUM, out of place) over every visible
/// GPU of this process (one rank per GPU), at 1, 16 and 64 MiB, with nccl-tests' definitions:
/// algbw = bytes / time, busbw = algbw * 2(n-1)/n (0 with one GPU: nothing crosses a link);
/// then the same sizes as host tensors through the GPU and back.
#[cfg(feature = "nccl")]
pub fn bench() -> Result<(), CliError> {
    use std::time::{Duration, Instant};

    use crate::collective::{NcclLocal, Reduction};

    let failed = |e: &dyn std::fmt::Display| CliError::Failed(format!("bench nccl: {e}"));
    let version = crate::collective::nccl_version().map_err(|e| failed(&e))?;
    let gpus = match crate::collective::visible_gpus() {
        Ok(gpus) if !gpus.is_empty() => gpus,
        Ok(_) => {
            outln!("cohort bench nccl: skipped: no GPU");
            return Ok(());
        }
        Err(e) => {
            outln!("cohort bench nccl: skipped: no GPU ({e})");
            return Ok(());
        }
    };
    let devices: Vec<usize> = gpus.iter().map(|g| g.ordinal).collect();
    let local = NcclLocal::new(&devices, Duration::from_secs(60)).map_err(|e| failed(&e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    let n = devices.len();
    outln!(
        "\ncohort bench nccl: f32 all-reduce (SUM, out of place) with NCCL {version}, {n} rank(s), \
         one per GPU in this process: {}",
        gpus.iter()
            .map(|g| format!("{}: {}", g.ordinal, g.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    outln!(
        "{:>5} {:>8} {:>10} {:>12} {:>12}",
        "ranks", "size", "time us", "algbw GB/s", "busbw GB/s"
    );
    let alloc = |stream: &std::sync::Arc<cudarc::driver::CudaStream>, elements: usize| {
        stream
            .alloc_zeros::<f32>(elements)
            .map_err(|e| failed(&format!("device memory: {e:?}")))
    };
    for mib in SIZES_MIB {
        let elements = mib * (1 << 20) / 4;
        let (mut send, mut recv) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for stream in local.streams() {
            send.push(alloc(&stream, elements)?);
            recv.push(alloc(&stream, elements)?);
        }
        runtime
            .block_on(local.all_reduce_device(Reduction::Sum, &send, &mut recv, WARMUP))
            .map_err(|e| failed(&e))?;
        let started = Instant::now();
        runtime
            .block_on(local.all_reduce_device(Reduction::Sum, &send, &mut recv, ITERATIONS))
            .map_err(|e| failed(&e))?;
        let seconds = started.elapsed().as_secs_f64() / ITERATIONS as f64;
        let algbw = (mib << 20) as f64 / seconds / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        outln!(
            "{n:>5} {:>8} {:>10.1} {algbw:>12.2} {busbw:>12.2}",
            format!("{mib} MiB"),
            seconds * 1e6
        );
    }
    // What a parameter-server push pays: host tensors in, through the GPU, back to the host.
    outln!(
        "\nhost tensors through the GPU and back (NcclLocal::all_reduce: copy in, all-reduce, \
         copy out; pageable host memory):"
    );
    outln!(
        "{:>5} {:>8} {:>10} {:>14}",
        "ranks", "size", "time ms", "size/time GB/s"
    );
    for mib in SIZES_MIB {
        let elements = mib * (1 << 20) / 4;
        let tensor =
            candle_core::Tensor::ones(elements, candle_core::DType::F32, &candle_core::Device::Cpu)
                .map_err(|e| failed(&e))?;
        let replicas = vec![vec![tensor]; n];
        let bucket = (mib << 20).max(1);
        runtime
            .block_on(local.all_reduce(Reduction::Sum, &replicas, bucket))
            .map_err(|e| failed(&e))?;
        let started = Instant::now();
        for _ in 0..HOST_ITERATIONS {
            runtime
                .block_on(local.all_reduce(Reduction::Sum, &replicas, bucket))
                .map_err(|e| failed(&e))?;
        }
        let seconds = started.elapsed().as_secs_f64() / HOST_ITERATIONS as f64;
        outln!(
            "{n:>5} {:>8} {:>10.2} {:>14.2}",
            format!("{mib} MiB"),
            seconds * 1e3,
            (mib << 20) as f64 / seconds / 1e9
        );
    }
    Ok(())
}

#[cfg(feature = "nccl")]
const SIZES_MIB: [usize; 3] = [1, 16, 64];
#[cfg(feature = "nccl")]
const WARMUP: usize = 5;
/// All-reduces timed per size, enqueued back to back and waited for once (as nccl-tests).
#[cfg(feature = "nccl")]
const ITERATIONS: usize = 50;
/// Host round trips timed per size.
#[cfg(feature = "nccl")]
const HOST_ITERATIONS: usize = 5;
