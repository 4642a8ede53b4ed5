//! NCCL inside a worker (feature `nccl`).
//!
//! Without a GPU: the `cohort nccl info` binary loads libnccl from the `nvidia-nccl-cu12`/`-cu13`
//! Python wheel (LD_LIBRARY_PATH at its lib directory) and prints a real 2.x.y version; with no
//! library on the path it fails with an error naming the library; `cohort bench nccl` says
//! "skipped: no GPU". SKIPPED when the wheel is not installed (CI installs it).
//!
//! With a GPU (found at run time; else each test prints "skipped: no GPU"; this process needs
//! libnccl on LD_LIBRARY_PATH): communicators bootstrapped over a real process group on
//! 127.0.0.1 (1 rank, and 2 when there are 2 GPUs), all-reduce against a reference for every
//! reduction, sizes that do not divide evenly, zero length and several buckets; the replicas
//! of one process on every GPU; a broken group aborting a pending init, a pending all-reduce
//! (2 GPUs) and the next call, and a new generation needing a new communicator.
//!
//! MultiWorkerMirrored on NCCL (`Communication::Nccl`): without its GPU (any machine: a GPU
//! past every visible one) the strategy is refused by key, naming what is missing, before a
//! group forms, and so is `cohort mwms-member --communication nccl:N`. With a GPU: workers (1,
//! or 2 with 2 GPUs) train the dense workload summing their gradients with NCCL and end where
//! the ring ends (to 1e-5), every worker with the same bits; with 2 GPUs, an application error
//! on one worker fails the other with it.
#![cfg(feature = "nccl")]

mod skip_support;
use skip_support::Part;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use cohort::cluster::ClusterConfig;
use cohort::collective::{
    loopback_group, nccl_version, visible_gpus, CollectiveError, GroupConfig, NcclComm, NcclError,
    NcclId, NcclLocal, NcclWaits, ProcessGroup, ProcessSpan, Reduction,
};
use cohort::strategy::{Communication, MultiWorkerConfig, MultiWorkerMirrored, StrategyError};
use cohort::workloads::dense_sync::{self, collective_cause, DenseOutcome, Fault};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};
use futures::future::join_all;

/// Bound on any one scenario: a hang fails the test instead of stalling it.
const SCENARIO_MAX: Duration = Duration::from_secs(120);
/// The communicators' bound on every wait.
const NCCL_TIMEOUT: Duration = Duration::from_secs(60);
const ALL_OPS: [Reduction; 4] = [
    Reduction::Sum,
    Reduction::Mean,
    Reduction::Max,
    Reduction::Min,
];

// ---------------------------------------------------------------------------------------
// Loading, without a GPU.

/// The lib directory of the installed nvidia-nccl wheel, or None (with why).
fn wheel_lib_dir() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if dir.join("libnccl.so.2").is_file() {
        Ok(dir)
    } else {
        Err(format!("{} has no libnccl.so.2", dir.display()))
    }
}

fn cohort(args: &[&str], ld_library_path: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(args)
        .env("LD_LIBRARY_PATH", ld_library_path)
        .output()
        .expect("run the cohort binary")
}

#[test]
fn info_loads_nccl_from_the_python_wheel_without_a_gpu() {
    let dir = match wheel_lib_dir() {
        Ok(dir) => dir,
        Err(why) => {
            skip_support::skip(
                Part::NcclWheel,
                &format!(
                    "the nvidia-nccl wheel is not installed (pip install nvidia-nccl-cu12): {why}"
                ),
            );
            return;
        }
    };
    let out = cohort(&["nccl", "info"], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nccl info failed: {stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("NCCL "))
        .unwrap_or_else(|| panic!("no version line in: {stdout}"));
    let version = line.split_whitespace().nth(1).unwrap();
    let parts: Vec<u32> = version
        .split('.')
        .map(|p| p.parse().unwrap_or_else(|_| panic!("version {version:?}")))
        .collect();
    assert_eq!(parts.len(), 3, "version {version:?}");
    assert_eq!(parts[0], 2, "NCCL major version in {line:?}");
    assert!(parts[1] >= 10, "an NCCL older than 2.10 in {line:?}");
    assert!(line.contains("libnccl.so.2"), "{line:?}");
    assert!(stdout.contains("GPUs: "), "{stdout}");
}

#[test]
fn info_without_the_library_names_it() {
    let empty = std::env::temp_dir().join(format!("cohort-nccl-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = cohort(&["nccl", "info"], &empty);
    let _ = std::fs::remove_dir(&empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        skip_support::skip(
            Part::NoSystemNccl,
            "this machine has libnccl installed outside LD_LIBRARY_PATH",
        );
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot load libnccl.so.2"), "{stderr}");
    assert!(stderr.contains("LD_LIBRARY_PATH"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_runs_or_says_skipped_without_a_gpu() {
    let Ok(dir) = wheel_lib_dir() else {
        skip_support::skip(Part::NcclWheel, "no nvidia-nccl wheel");
        return;
    };
    let out = cohort(&["bench", "nccl"], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench nccl failed: {stdout}\n{stderr}"
    );
    if stdout.contains("skipped: no GPU") {
        return;
    }
    for size in ["1 MiB", "16 MiB", "64 MiB"] {
        assert!(stdout.contains(size), "no {size} row in: {stdout}");
    }
}

// ---------------------------------------------------------------------------------------
// The bootstrap and a span's NCCL sums, without a GPU (libnccl loaded in this process).

/// Set in a test run again by [`nccl_loaded_here`].
const RERUN_ENV: &str = "COHORT_TEST_NCCL_RERUN";

/// Whether this process loads libnccl, so that `test`'s body can run here. If it does not and
/// the nvidia-nccl wheel is installed, runs `test` again in a child of this test binary with
/// `LD_LIBRARY_PATH` at the wheel (the loader reads it only when a process starts), asserts
/// that it ran and passed, and returns false; without the wheel, says SKIPPED.
fn nccl_loaded_here(test: &str) -> bool {
    let err = match nccl_version() {
        Ok(_) => return true,
        Err(e) => e,
    };
    assert!(
        std::env::var_os(RERUN_ENV).is_none(),
        "{test}: run again with the wheel on LD_LIBRARY_PATH, libnccl still does not load: {err}"
    );
    let dir = match wheel_lib_dir() {
        Ok(dir) => dir,
        Err(why) => {
            skip_support::skip(
                Part::NcclWheel,
                &format!("{err}; and no nvidia-nccl wheel: {why}"),
            );
            return false;
        }
    };
    let mut path = std::ffi::OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", path)
        .env(RERUN_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} with libnccl from {}:\n{stdout}\n{stderr}",
        dir.display()
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_gets_rank_0s_id_over_the_group() {
    if !nccl_loaded_here("every_member_gets_rank_0s_id_over_the_group") {
        return;
    }
    let (_endpoints, groups) = group(3).await;
    let ids = bounded("id exchange", join_all(groups.iter().map(NcclId::exchange))).await;
    let ids: Vec<NcclId> = ids.into_iter().map(Result::unwrap).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    // A second exchange makes a new id.
    let again = bounded("second exchange", NcclId::exchange(&groups[0]));
    let others = join_all(groups[1..].iter().map(NcclId::exchange));
    let (again, others) = futures::future::join(again, others).await;
    assert_ne!(again.unwrap(), ids[0]);
    assert!(others.into_iter().all(|o| o.is_ok()));
}

#[test]
fn a_span_sums_floats_on_nccl_and_fails_every_member_alike_when_it_cannot() {
    if !nccl_loaded_here("a_span_sums_floats_on_nccl_and_fails_every_member_alike_when_it_cannot") {
        return;
    }
    // A GPU past every visible one: on any machine, every member's communicator fails to
    // start (no driver, or no such device) after the id went round the group.
    let device = visible_gpus().map_or(0, |g| g.len());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (endpoints, groups) = runtime.block_on(group(2));
    let spans: Vec<ProcessSpan> = groups
        .iter()
        .map(|g| {
            ProcessSpan::new(g.clone(), runtime.handle().clone(), 1, 1 << 20).with_nccl(
                device,
                NcclWaits {
                    timeout: NCCL_TIMEOUT,
                    settle: Duration::from_secs(2),
                    probe: Duration::from_secs(2),
                },
            )
        })
        .collect();
    assert_eq!(spans[0].nccl_device(), Some(device));
    let on_each = |call: fn(&ProcessSpan, usize) -> Result<Vec<Tensor>, CollectiveError>| {
        let threads: Vec<_> = spans
            .iter()
            .enumerate()
            .map(|(r, span)| {
                let span = span.clone();
                std::thread::spawn(move || call(&span, r))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    };
    // Integers and empty lists are the group's: no communicator is made for them.
    for out in on_each(|span, r| {
        let ints = Tensor::new(&[r as i64 + 1, 10], &Device::Cpu).unwrap();
        let mut summed = span.sum_many(&[ints])?;
        assert!(span.sum_many(&[])?.is_empty());
        summed.push(span.sum(&Tensor::new(&[2u8], &Device::Cpu).unwrap())?);
        Ok(summed)
    }) {
        let out = out.unwrap();
        assert_eq!(out[0].to_vec1::<i64>().unwrap(), vec![3, 20]);
        assert_eq!(out[1].to_vec1::<u8>().unwrap(), vec![4]);
    }
    // f32 goes to NCCL, whose communicator cannot start: every member fails with an
    // application error naming NCCL and the device, and the group is broken with it. (Here
    // every member's init fails at once: each may report its own, as two workers whose steps
    // fail together do.)
    let started = std::time::Instant::now();
    let outs = on_each(|span, _| {
        let x = Tensor::new(&[1.5f32, 2.5], &Device::Cpu).unwrap();
        span.sum(&x).map(|t| vec![t])
    });
    assert!(started.elapsed() < SCENARIO_MAX, "{:?}", started.elapsed());
    let errors: Vec<CollectiveError> = outs.into_iter().map(Result::unwrap_err).collect();
    for (r, err) in errors.iter().enumerate() {
        match err {
            CollectiveError::Application {
                message,
                generation,
                ..
            } => {
                assert_eq!(*generation, 1, "member {r}: {err}");
                assert!(message.contains("NCCL"), "member {r}: {message}");
                assert!(
                    message.contains(&format!("device {device}")) || message.contains("libcuda"),
                    "member {r}: {message}"
                );
            }
            other => panic!("member {r}: expected an application error, got {other}"),
        }
        assert_eq!(groups[r].broken().as_ref(), Some(err), "member {r}");
    }
    // And every later call fails with it, on the group's path too.
    let token = Tensor::new(&[1u8], &Device::Cpu).unwrap();
    assert_eq!(spans[0].sum(&token).unwrap_err(), errors[0]);
    drop(spans);
    drop(groups);
    drop(endpoints);
    runtime.shutdown_background();
}

// ---------------------------------------------------------------------------------------
// With a GPU.

/// The number of GPUs, or None after recording why the running test is skipped.
fn gpus() -> Option<usize> {
    match visible_gpus() {
        Ok(g) if !g.is_empty() => {}
        Ok(_) => {
            skip_support::skip(Part::Gpu, "no GPU");
            return None;
        }
        Err(e) => {
            skip_support::skip(Part::Gpu, &format!("no GPU ({e})"));
            return None;
        }
    }
    if let Err(e) = nccl_version() {
        skip_support::skip(Part::Gpu, &e.to_string());
        return None;
    }
    visible_gpus().ok().map(|g| g.len())
}

/// `n` members on their own endpoints, formed at generation 1.
async fn group(n: u32) -> (Vec<Endpoint>, Vec<ProcessGroup>) {
    loopback_group(n, TransportConfig::for_tests(), GroupConfig::for_tests())
        .await
        .unwrap()
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(SCENARIO_MAX, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {SCENARIO_MAX:?}"))
}

/// Rank `rank`'s gradients: f32 tensors of lengths that do not divide evenly, a zero-length
/// one, a matrix, and an f64 one; values with fractional bits.
fn gradients(rank: usize) -> Vec<Tensor> {
    let value = |i: usize, salt: usize| {
        let h = ((i * 2654435761) ^ ((rank + 1) * 40503) ^ salt) % 1000;
        (h as f64 - 500.0) / 64.0 + rank as f64 * 0.25
    };
    let f32s = |len: usize, salt: usize| {
        let v: Vec<f32> = (0..len).map(|i| value(i, salt) as f32).collect();
        Tensor::from_vec(v, len, &Device::Cpu).unwrap()
    };
    let matrix: Vec<f32> = (0..3 * 7).map(|i| value(i, 9) as f32).collect();
    let f64s: Vec<f64> = (0..1001).map(|i| value(i, 11)).collect();
    vec![
        f32s(7, 1),
        f32s(0, 2),
        f32s(100_003, 3),
        Tensor::from_vec(matrix, (3, 7), &Device::Cpu).unwrap(),
        f32s(1, 4),
        Tensor::from_vec(f64s, 1001, &Device::Cpu).unwrap(),
    ]
}

/// The reduction of every rank's tensors, in f64.
fn reference(inputs: &[Vec<Tensor>], op: Reduction) -> Vec<Vec<f64>> {
    (0..inputs[0].len())
        .map(|t| {
            let columns: Vec<Vec<f64>> = inputs
                .iter()
                .map(|r| {
                    r[t].flatten_all()
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_vec1::<f64>()
                        .unwrap()
                })
                .collect();
            (0..columns[0].len())
                .map(|i| {
                    let xs = columns.iter().map(|c| c[i]);
                    match op {
                        Reduction::Sum => xs.sum(),
                        Reduction::Mean => xs.sum::<f64>() / inputs.len() as f64,
                        Reduction::Max => xs.fold(f64::MIN, f64::max),
                        Reduction::Min => xs.fold(f64::MAX, f64::min),
                    }
                })
                .collect()
        })
        .collect()
}

fn assert_matches(got: &[Tensor], like: &[Tensor], want: &[Vec<f64>], what: &str) {
    assert_eq!(got.len(), like.len(), "{what}: tensor count");
    for (t, ((g, l), w)) in got.iter().zip(like).zip(want).enumerate() {
        assert_eq!(g.dims(), l.dims(), "{what}: tensor {t} shape");
        assert_eq!(g.dtype(), l.dtype(), "{what}: tensor {t} dtype");
        let g = g
            .flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{what}: tensor {t} element {i}: {a} vs {b}"
            );
        }
    }
}

/// Small buckets, so that the gradients span several.
const BUCKET_BYTES: usize = 64 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn communicators_over_a_process_group_all_reduce_like_the_reference() {
    let Some(n_gpus) = gpus() else {
        return;
    };
    for n in [1usize, 2] {
        if n > n_gpus {
            skip_support::skip(
                Part::Gpu,
                &format!("its {n} ranks: needs {n} GPUs, this machine has {n_gpus}"),
            );
            continue;
        }
        let (_endpoints, groups) = group(n as u32).await;
        let comms = bounded(
            "communicator init",
            join_all(
                groups
                    .iter()
                    .enumerate()
                    .map(|(r, g)| NcclComm::new(g, r, NCCL_TIMEOUT)),
            ),
        )
        .await;
        let comms: Vec<NcclComm> = comms.into_iter().map(Result::unwrap).collect();
        for (r, c) in comms.iter().enumerate() {
            assert_eq!(
                (c.rank(), c.size(), c.generation(), c.device()),
                (r, n, 1, r)
            );
        }
        let inputs: Vec<Vec<Tensor>> = (0..n).map(gradients).collect();
        for op in ALL_OPS {
            let want = reference(&inputs, op);
            let outs = bounded(
                "all-reduce",
                join_all(
                    comms
                        .iter()
                        .zip(&inputs)
                        .map(|(c, x)| c.all_reduce(op, x, BUCKET_BYTES)),
                ),
            )
            .await;
            for (r, out) in outs.into_iter().enumerate() {
                let out = out.unwrap();
                assert_matches(
                    &out,
                    &inputs[r],
                    &want,
                    &format!("{n} ranks, {op}, rank {r}"),
                );
            }
        }
        // Every tensor zero-length: nothing moves, shapes come back.
        let empty = vec![Tensor::zeros(0, DType::F32, &Device::Cpu).unwrap()];
        let outs = bounded(
            "empty all-reduce",
            join_all(
                comms
                    .iter()
                    .map(|c| c.all_reduce(Reduction::Sum, &empty, BUCKET_BYTES)),
            ),
        )
        .await;
        for out in outs {
            assert_eq!(out.unwrap()[0].dims(), &[0]);
        }
        // Integers are refused with a typed error, before anything is sent.
        let ints = vec![Tensor::zeros(4, DType::U32, &Device::Cpu).unwrap()];
        let refused = comms[0]
            .all_reduce(Reduction::Sum, &ints, BUCKET_BYTES)
            .await;
        assert!(
            matches!(refused, Err(NcclError::InvalidArgument(_))),
            "{refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replicas_on_every_gpu_all_reduce_like_the_reference() {
    let Some(n) = gpus() else {
        return;
    };
    let devices: Vec<usize> = (0..n).collect();
    let local = NcclLocal::new(&devices, NCCL_TIMEOUT).unwrap();
    assert_eq!(local.devices(), devices);
    let inputs: Vec<Vec<Tensor>> = (0..n).map(gradients).collect();
    for op in ALL_OPS {
        let want = reference(&inputs, op);
        let outs = bounded(
            "local all-reduce",
            local.all_reduce(op, &inputs, BUCKET_BYTES),
        )
        .await
        .unwrap();
        for (r, out) in outs.iter().enumerate() {
            assert_matches(
                out,
                &inputs[r],
                &want,
                &format!("{n} local ranks, {op}, rank {r}"),
            );
        }
    }
    // Two ranks on one GPU are refused here, not by a hang in NCCL.
    let refused = NcclLocal::new(&[0, 0], NCCL_TIMEOUT);
    assert!(
        matches!(refused, Err(NcclError::InvalidArgument(_))),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_group_aborts_a_pending_init() {
    if gpus().is_none() {
        return;
    }
    // Two members; rank 1 gets the id but never inits (its step failed): rank 0's init waits
    // for it until the group breaks, then fails naming the generation.
    let (_endpoints, groups) = group(2).await;
    let (g0, g1) = (groups[0].clone(), groups[1].clone());
    let rank1 = async move {
        NcclId::exchange(&g1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        g1.abort("worker 1 failed before its NCCL init").await;
    };
    let (init, ()) = bounded(
        "aborted init",
        futures::future::join(NcclComm::new(&g0, 0, NCCL_TIMEOUT), rank1),
    )
    .await;
    match init {
        Err(NcclError::Aborted {
            generation: 1,
            reason,
        }) => {
            assert!(reason.contains("worker 1 failed"), "{reason}")
        }
        other => panic!("expected the init aborted at generation 1, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_group_fails_the_next_call_and_a_new_generation_needs_a_new_communicator() {
    if gpus().is_none() {
        return;
    }
    let (endpoints, groups) = group(1).await;
    let g = &groups[0];
    let comm = bounded("init", NcclComm::new(g, 0, NCCL_TIMEOUT))
        .await
        .unwrap();
    let x = gradients(0);
    bounded(
        "all-reduce",
        comm.all_reduce(Reduction::Sum, &x, BUCKET_BYTES),
    )
    .await
    .unwrap();
    g.abort("the step failed").await;
    let refused = bounded(
        "refused call",
        comm.all_reduce(Reduction::Sum, &x, BUCKET_BYTES),
    )
    .await;
    match refused {
        Err(NcclError::Aborted {
            generation: 1,
            reason,
        }) => {
            assert!(reason.contains("the step failed"), "{reason}")
        }
        other => panic!("expected the call refused at generation 1, got {other:?}"),
    }
    assert!(comm.aborted().is_some());
    // The group of the next generation, and its own communicator.
    let me = vec![NodeId::new("worker", 0)];
    let g2 = bounded("reform", g.reform(&me)).await.unwrap();
    assert_eq!(g2.generation(), 2);
    let comm2 = bounded("init at generation 2", NcclComm::new(&g2, 0, NCCL_TIMEOUT))
        .await
        .unwrap();
    assert_eq!(comm2.generation(), 2);
    let out = bounded(
        "all-reduce at generation 2",
        comm2.all_reduce(Reduction::Max, &x, BUCKET_BYTES),
    )
    .await
    .unwrap();
    assert_matches(
        &out,
        &x,
        &reference(std::slice::from_ref(&x), Reduction::Max),
        "generation 2",
    );
    // The old communicator still refuses.
    assert!(matches!(
        comm.all_reduce(Reduction::Sum, &x, BUCKET_BYTES).await,
        Err(NcclError::Aborted { generation: 1, .. })
    ));
    drop(endpoints);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_peer_aborts_a_pending_all_reduce() {
    let Some(n_gpus) = gpus() else {
        return;
    };
    if n_gpus < 2 {
        skip_support::skip(
            Part::Gpu,
            &format!("needs 2 GPUs, this machine has {n_gpus}"),
        );
        return;
    }
    let (endpoints, groups) = group(2).await;
    let comms = bounded(
        "init",
        join_all(
            groups
                .iter()
                .enumerate()
                .map(|(r, g)| NcclComm::new(g, r, NCCL_TIMEOUT)),
        ),
    )
    .await;
    let mut comms: Vec<NcclComm> = comms.into_iter().map(Result::unwrap).collect();
    let comm1 = comms.pop().unwrap();
    let comm0 = comms.pop().unwrap();
    // Rank 0 all-reduces; rank 1 never joins, its process goes away (its endpoint closes).
    let x = gradients(0);
    let lose = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(comm1);
        endpoints[1].close();
    };
    let (pending, ()) = bounded(
        "aborted all-reduce",
        futures::future::join(comm0.all_reduce(Reduction::Sum, &x, BUCKET_BYTES), lose),
    )
    .await;
    assert!(
        matches!(pending, Err(NcclError::Aborted { generation: 1, .. })),
        "expected the pending all-reduce aborted at generation 1, got {pending:?}"
    );
}

// ---------------------------------------------------------------------------------------
// MultiWorkerMirrored on NCCL.

/// `n` workers on free loopback ports, their certificates in a fresh directory: the
/// directory and each worker's cluster.
fn mwms_cluster(name: &str, n: usize) -> (PathBuf, Vec<ClusterConfig>) {
    let dir = std::env::temp_dir().join(format!("cohort-nccl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = ClusterCa::generate(name).unwrap();
    let mut addrs = Vec::new();
    // Held until all are picked: a port released at once could be picked twice.
    let mut held = Vec::new();
    for i in 0..n {
        ca.issue(&NodeId::new("worker", i as u32))
            .unwrap()
            .save(&dir)
            .unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        addrs.push(format!("\"{}\"", socket.local_addr().unwrap()));
        held.push(socket);
    }
    drop(held);
    let clusters = (0..n)
        .map(|i| {
            ClusterConfig::from_tf_config(&format!(
                r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {i}}}}}"#,
                addrs.join(", ")
            ))
            .unwrap()
        })
        .collect();
    (dir, clusters)
}

#[test]
fn multi_worker_mirrored_on_nccl_without_its_gpu_is_refused_by_key() {
    let (dir, clusters) = mwms_cluster("refused", 1);
    let visible = visible_gpus().map_or(0, |g| g.len());
    // GPUs past every visible one: refused on any machine, before a group forms.
    for device in [visible, visible + 63] {
        let mut config = MultiWorkerConfig::new(clusters[0].clone(), &dir);
        config.communication = Communication::Nccl { device };
        match MultiWorkerMirrored::new(config) {
            Err(StrategyError::Config { key, detail }) => {
                assert_eq!(key, "communication", "{detail}");
                assert!(detail.starts_with(&format!("nccl:{device}: ")), "{detail}");
                assert!(
                    detail.contains("no GPU") || detail.contains("cannot load"),
                    "{detail}"
                );
            }
            other => panic!("nccl:{device}: expected a config error, got {other:?}"),
        }
    }
    // The worker process says it and exits 2 (a usage error).
    let tf_config =
        r#"{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}"#;
    let device = (visible + 63).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["mwms-member", "--certs"])
        .arg(&dir)
        .args(["--communication", &format!("nccl:{device}")])
        .env("TF_CONFIG", tf_config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("communication: nccl:{device}: ")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

const MWMS_STEPS: usize = 8;
const MWMS_GLOBAL_BATCH: usize = 16;

/// `workers` worker threads, 2 replicas each, train the dense workload with the communication
/// `of(worker)`; worker `fails` (if any) fails its step 3 with an application error. Each
/// worker's outcome.
fn train_workers(
    name: &str,
    workers: usize,
    of: fn(usize) -> Communication,
    fails: Option<usize>,
) -> Vec<Result<DenseOutcome, String>> {
    let (dir, clusters) = mwms_cluster(name, workers);
    let threads: Vec<_> = clusters
        .into_iter()
        .enumerate()
        .map(|(i, cluster)| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut config = MultiWorkerConfig::new(cluster, dir).with_local_replicas(2);
                config.communication = of(i);
                let strategy = MultiWorkerMirrored::new(config).map_err(|e| e.to_string())?;
                assert_eq!(strategy.communication(), of(i));
                let fail_at = (fails == Some(i)).then_some((3, Fault::Error));
                dense_sync::train_failing(
                    &strategy,
                    MWMS_STEPS,
                    MWMS_GLOBAL_BATCH,
                    7 + 1000 * i as u64,
                    fail_at,
                    &mut |_, _| {},
                )
                .map_err(|e| match collective_cause(&e) {
                    Some(CollectiveError::Application { node, message, .. }) => {
                        format!("application node={node} message={message}")
                    }
                    _ => e.to_string(),
                })
            })
        })
        .collect();
    let outs = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    outs
}

#[test]
fn multi_worker_mirrored_sums_on_nccl_as_on_the_ring() {
    let Some(n_gpus) = gpus() else {
        return;
    };
    let workers = n_gpus.min(2);
    let ring = train_workers("ring", workers, |_| Communication::Ring, None);
    let nccl = train_workers("nccl", workers, |i| Communication::Nccl { device: i }, None);
    let ring: Vec<DenseOutcome> = ring.into_iter().map(Result::unwrap).collect();
    let nccl: Vec<DenseOutcome> = nccl.into_iter().map(Result::unwrap).collect();
    for (w, out) in nccl.iter().enumerate() {
        assert_eq!(out.variables, nccl[0].variables, "worker {w}'s bits");
        assert_eq!(out.losses.len(), MWMS_STEPS);
        for (name, want) in &ring[0].variables {
            let got = &out.variables[name];
            for (k, (a, b)) in got.iter().zip(want).enumerate() {
                assert!((a - b).abs() <= 1e-5, "worker {w}: {name}[{k}] {a} vs {b}");
            }
        }
    }
}

#[test]
fn an_application_error_on_one_worker_fails_the_other_on_nccl() {
    let Some(n_gpus) = gpus() else {
        return;
    };
    if n_gpus < 2 {
        skip_support::skip(
            Part::Gpu,
            &format!("needs 2 GPUs, this machine has {n_gpus}"),
        );
        return;
    }
    let outs = train_workers(
        "nccl-fail",
        2,
        |i| Communication::Nccl { device: i },
        Some(1),
    );
    let own = outs[1].as_ref().unwrap_err();
    assert!(own.contains("injected failure"), "{own}");
    let other = outs[0].as_ref().unwrap_err();
    assert!(
        other.starts_with("application node=worker:1") && other.contains("injected failure"),
        "{other}"
    );
}
