//! `cohort bench ps`: runs each parameter-server workload on its own local cluster and prints
//! the measurements side by side. Each workload runs twice in the same invocation: with
//! metrics off, then with every task serving metrics and this process scraping all of them
//! every [`SCRAPE_EVERY`] (much more often than Prometheus' default 15 s), so that the cost
//! of metrics is read from two rows measured under the same conditions.

use crate::process::stdout::outln;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::CliError;
use crate::bootstrap::{launch_local, LaunchFlags};
use crate::workloads::bench::BenchReport;

/// Runs the benchmark `target` (`ps`).
pub fn run(
    target: &str,
    steps: usize,
    warmup: usize,
    workloads: &str,
    peers: Option<&std::path::Path>,
) -> Result<(), CliError> {
    if target != "ps" {
        return Err(CliError::Usage(format!(
            "bench: unknown target {target:?} (available: ps, recovery, allreduce, mwms)"
        )));
    }
    let workloads: Vec<&str> = workloads
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    if let Some(bad) = workloads
        .iter()
        .find(|w| !matches!(**w, "dense" | "sparse" | "goodput"))
    {
        return Err(CliError::Usage(format!(
            "--workloads: unknown workload {bad:?} (dense, sparse, goodput)"
        )));
    }
    let dir = crate::process::new_temp_dir("cohort-bench-")
        .map_err(|e| CliError::Failed(format!("a scratch directory: {e}")))?;
    let mut reports = Vec::new();
    // The bare stream is measured right before and right after the goodput cluster run, so
    // that both figures of the ratio share the machine's conditions as closely as they can.
    let mut bare_samples = Vec::new();
    for (workload, metrics) in workloads.iter().flat_map(|w| [(*w, false), (*w, true)]) {
        if workload == "goodput" && !metrics {
            bare_samples.push(bare_quinn_goodput()?);
        }
        let (report, scrapes) = run_cluster(&dir, workload, metrics, steps, warmup)?;
        reports.push((report, metrics, scrapes));
        if workload == "goodput" && metrics {
            bare_samples.push(bare_quinn_goodput()?);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let goodput = reports
        .iter()
        .find(|(r, metrics, _)| r.workload == "goodput" && !metrics)
        .map(|(r, _, _)| r.ps_goodput_mib_s);
    let bare = (!bare_samples.is_empty())
        .then(|| bare_samples.iter().sum::<f64>() / bare_samples.len() as f64);
    print_reports(&reports, warmup);
    compare_with_peers(&reports, peers, steps, warmup);
    if let (Some(ours), Some(base)) = (goodput, bare) {
        outln!(
            "\nPS push+pull goodput {ours:.1} MiB/s vs a bare quinn stream {base:.1} MiB/s in the same run \
             (2 MiB messages, 1 GiB samples; mean of {:.1} before and {:.1} after the cluster run): ratio {:.2} (target >= 0.95)",
            bare_samples[0],
            bare_samples[bare_samples.len() - 1],
            ours / base
        );
    }
    Ok(())
}

/// One run of `workload` on a local cluster (every task serving and scraped for metrics
/// where `metrics`): the chief's report, and how many scrapes there were.
fn run_cluster(
    dir: &std::path::Path,
    workload: &str,
    metrics: bool,
    steps: usize,
    warmup: usize,
) -> Result<(BenchReport, u64), CliError> {
    let report_path = dir.join(format!("{workload}-{metrics}.json"));
    let run_dir = dir.join(format!("{workload}-{metrics}-run"));
    let flags = LaunchFlags::bench_cluster(run_dir.clone(), metrics);
    let env = vec![
        ("COHORT_BENCH_WORKLOAD".to_string(), workload.to_string()),
        ("COHORT_BENCH_STEPS".to_string(), steps.to_string()),
        ("COHORT_BENCH_WARMUP".to_string(), warmup.to_string()),
        (
            "COHORT_BENCH_REPORT".to_string(),
            report_path.display().to_string(),
        ),
    ];
    let done = Arc::new(AtomicBool::new(false));
    let scraper = metrics.then(|| {
        let done = Arc::clone(&done);
        let run_dir = run_dir.clone();
        std::thread::spawn(move || scrape_until(&run_dir, &done))
    });
    let code = launch_local(
        &flags,
        vec!["role".into(), "--job".into(), "bench".into()],
        env,
    );
    done.store(true, Ordering::SeqCst);
    let scrapes = scraper.map_or(0, |s| s.join().unwrap_or(0));
    if code != 0 {
        return Err(CliError::Failed(format!(
            "the {workload} benchmark's chief exited with code {code}"
        )));
    }
    let text = std::fs::read_to_string(&report_path)
        .map_err(|e| CliError::Failed(format!("{}: {e}", report_path.display())))?;
    let report: BenchReport = serde_json::from_str(&text)
        .map_err(|e| CliError::Failed(format!("{}: {e}", report_path.display())))?;
    if metrics && scrapes == 0 {
        return Err(CliError::Failed(format!(
            "the {workload} benchmark with metrics on was never scraped"
        )));
    }
    Ok((report, scrapes))
}

/// The table of every run's figures, and what metrics cost each workload.
fn print_reports(reports: &[(BenchReport, bool, u64)], warmup: usize) {
    outln!("\ncohort bench ps: 1 chief + 2 PS + 2 workers as processes on 127.0.0.1, after {warmup} warm-up steps");
    outln!(
        "{:<8} {:>8} {:>7} {:>10} {:>12} {:>14} {:>16}",
        "workload",
        "metrics",
        "steps",
        "steps/s",
        "examples/s",
        "PS MiB/step",
        "PS push+pull MiB/s"
    );
    for (r, metrics, scrapes) in reports {
        let metrics = if *metrics {
            format!("on/{scrapes}")
        } else {
            "off".to_string()
        };
        outln!(
            "{:<8} {:>8} {:>7} {:>10.1} {:>12.0} {:>14.2} {:>16.1}",
            r.workload,
            metrics,
            r.steps,
            r.steps_per_s,
            r.examples_per_s,
            r.ps_bytes_per_step as f64 / (1024.0 * 1024.0),
            r.ps_goodput_mib_s
        );
    }
    outln!("(metrics on/N: every task served metrics, scraped N times in all, each task every {SCRAPE_EVERY:?})");
    for (workload, off, on) in reports
        .iter()
        .filter(|(_, m, _)| !m)
        .filter_map(|(off, _, _)| {
            reports
                .iter()
                .find(|(r, m, _)| *m && r.workload == off.workload)
                .map(|(on, _, _)| (&off.workload, off.steps_per_s, on.steps_per_s))
        })
    {
        outln!(
            "{workload}: metrics on costs {:+.1}% of steps/s (target: less than 2%)",
            (off - on) / off * 100.0
        );
    }
}

/// Runs the peers of the dense and sparse workloads, on the same machine, in this invocation,
/// and prints cohort's ratio to each (or why a peer was not measured); then what cohort from
/// Python gives against the PyTorch RPC parameter server and against cohort from Rust.
fn compare_with_peers(
    reports: &[(BenchReport, bool, u64)],
    peers: Option<&std::path::Path>,
    steps: usize,
    warmup: usize,
) {
    let mut dense_figures = std::collections::BTreeMap::new();
    for (workload, what, program, own, key) in PEER_PROGRAMS {
        let Some(ours) = reports
            .iter()
            .find(|(r, metrics, _)| r.workload == workload && !metrics)
            .map(|(r, _, _)| r.steps_per_s)
        else {
            continue;
        };
        let mut args = vec![
            format!("--workload={workload}"),
            format!("--steps={steps}"),
            format!("--warmup={warmup}"),
        ];
        args.extend((!own.is_empty()).then(|| own.to_string()));
        let measured = super::peers::run_peer(peers, program, &args);
        match measured {
            Ok((theirs, version)) => {
                outln!(
                    "\n{workload}: {what}, {version}, the same workload: {theirs:.1} steps/s in \
                     the same run; cohort {ours:.1}: ratio {:.2}x",
                    ours / theirs
                );
                if workload == "dense" {
                    dense_figures.insert(key, (theirs, ours));
                }
            }
            Err(why) => outln!(
                "\n{workload}: {what} not measured: {why} (bash benches/peers/setup.sh, then \
                 --peers)"
            ),
        }
    }
    print_python_figures(&dense_figures);
    if dense_figures.contains_key(PYTHON_TORCH) || dense_figures.contains_key(PYTHON_NUMPY) {
        print_compute_alone(peers);
    }
}

/// The Python jobs' step computation alone (`dense_step_compute.py`: one thread, no
/// distribution) and the Rust job's (candle, one thread: [`dense_compute_alone`]), measured
/// in the same invocation: how much of their gap to the Rust job is the computation rather
/// than the bridge.
fn print_compute_alone(peers: Option<&std::path::Path>) {
    let args = ["--steps=300".to_string()];
    let figure = |key| super::peers::run_peer_figure(peers, "dense_step_compute.py", &args, key);
    let rust = match dense_compute_alone(300) {
        Ok(ms) => format!("candle (the Rust job's) {ms:.2} ms"),
        Err(why) => format!("candle's not measured ({why})"),
    };
    match (figure("torch_ms"), figure("numpy_ms")) {
        (Ok((torch_ms, version)), Ok((numpy_ms, _))) => outln!(
            "dense: the step's computation alone (forward and backward of a batch of 256, one \
             thread, no distribution; dense_step_compute.py, {version}), in the same run: \
             PyTorch {torch_ms:.2} ms, NumPy {numpy_ms:.2} ms, {rust} a step"
        ),
        (Err(why), _) | (_, Err(why)) => {
            outln!("dense: the Python step's computation alone not measured: {why}; {rust} a step")
        }
    }
}

/// The Rust job's step computation alone, in a process of its own with one compute thread
/// (as each worker of the benchmark's job on this machine, and as the Python figures): the
/// median milliseconds of `steps` timed steps, or why it was not measured.
fn dense_compute_alone(steps: usize) -> Result<f64, super::peers::PeerError> {
    let exe = std::env::current_exe().map_err(|e| super::peers::PeerError::Start {
        program: "cohort".into(),
        reason: e.to_string(),
    })?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["bench-dense-compute", "--steps", &steps.to_string()])
        .env(crate::process::COMPUTE_THREADS_ENV, "1");
    super::peers::run_figure(command, "candle_ms").map(|(ms, _)| ms)
}

/// `cohort bench-dense-compute`: the dense step's computation alone on this process's
/// compute threads, printed as the peers print their figures (one JSON line).
pub fn dense_compute(steps: usize) -> Result<(), CliError> {
    let ms = crate::workloads::bench::dense_compute_alone_ms(steps)
        .map_err(|e| CliError::Failed(format!("the dense step's computation: {e}")))?;
    let line = serde_json::json!({
        "candle_ms": ms,
        "version": format!("cohort {}", env!("CARGO_PKG_VERSION")),
    });
    outln!("{line}");
    Ok(())
}

/// What cohort from Python gives against cohort from Rust and the PyTorch RPC parameter
/// server, from the dense workload's `(peer's steps/s, cohort's)` by peer key.
fn print_python_figures(dense_figures: &std::collections::BTreeMap<&str, (f64, f64)>) {
    for (key, how) in [
        (PYTHON_TORCH, "PyTorch's autograd"),
        (PYTHON_NUMPY, "NumPy by hand"),
    ] {
        let Some(&(python, rust)) = dense_figures.get(key) else {
            continue;
        };
        outln!(
            "dense, gradients by {how}: the Python layer costs {:.1}% of cohort's steps/s \
             ({python:.1} from Python, {rust:.1} from Rust; target: at most 15%)",
            (1.0 - python / rust) * 100.0
        );
        if let Some(&(torch, _)) = dense_figures.get(TORCH_RPC) {
            outln!(
                "dense, gradients by {how}: cohort from Python {python:.1} steps/s against the \
                 PyTorch RPC parameter server's {torch:.1}: ratio {:.2}x (target: at least \
                 1.25x)",
                python / torch
            );
        }
    }
}

/// The peers of `bench ps`: (workload, what the peer is, its program in `benches/peers/`, its
/// own arguments, its key in the figures).
const PEER_PROGRAMS: [(&str, &str, &str, &str, &str); 5] = [
    (
        "dense",
        "TensorFlow's ParameterServerStrategy (1 chief + 2 PS + 2 workers)",
        "tf_ps.py",
        "",
        "tf",
    ),
    (
        "dense",
        "a PyTorch RPC parameter server (2 PS + 2 workers + a driver)",
        "torch_ps.py",
        "",
        TORCH_RPC,
    ),
    (
        "dense",
        "cohort from Python (the same job as a Python script, gradients by PyTorch's \
         autograd, 1 chief + 2 PS + 2 workers)",
        "cohort_python_ps.py",
        "--compute=torch",
        PYTHON_TORCH,
    ),
    (
        "dense",
        "cohort from Python (the same job as a Python script, gradients by hand in NumPy, \
         1 chief + 2 PS + 2 workers)",
        "cohort_python_ps.py",
        "--compute=numpy",
        PYTHON_NUMPY,
    ),
    (
        "sparse",
        "TensorFlow's ParameterServerStrategy (1 chief + 2 PS + 2 workers, the embedding \
         split over the servers and updated by rows)",
        "tf_ps.py",
        "",
        "tf",
    ),
];

/// The figures' keys of the PyTorch RPC parameter server and of cohort from Python.
const TORCH_RPC: &str = "torch-rpc";
const PYTHON_TORCH: &str = "python-torch";
const PYTHON_NUMPY: &str = "python-numpy";

/// How often the bench scrapes every task's metrics while metrics are on.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// Scrapes every task's `/metrics` (addresses from the run directory's `metrics/*.addr`)
/// every [`SCRAPE_EVERY`] until `done`; returns how many scrapes answered 200.
fn scrape_until(run_dir: &std::path::Path, done: &AtomicBool) -> u64 {
    let mut answered = 0;
    while !done.load(Ordering::SeqCst) {
        let addrs = std::fs::read_dir(run_dir.join("metrics"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|text| text.trim().parse::<std::net::SocketAddr>().ok());
        for addr in addrs {
            if crate::metrics::http_get(addr, "/metrics", SCRAPE_EVERY * 5).is_some() {
                answered += 1;
            }
        }
        std::thread::sleep(SCRAPE_EVERY);
    }
    answered
}

/// Message size of the bare stream: the size of one server's share of the goodput variable.
const BARE_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// Messages per bare-stream sample: 1 GiB, most of a second here. The cluster figure is
/// sustained over seconds; a sample of a tenth of a second (64 messages, as before) swung by
/// ±25 % from one sample to the next and measured bursts instead of a sustained stream.
const BARE_SAMPLE_MESSAGES: usize = 512;

/// Goodput of a bare quinn stream on 127.0.0.1 (2 MiB messages, median of 3 samples of 1 GiB
/// after a warm-up), measured now so that it shares the machine's conditions with the cluster
/// runs.
pub(super) fn bare_quinn_goodput() -> Result<f64, CliError> {
    use cohort_transport::{baseline::BarePair, ClusterCa, NodeId, TransportConfig};
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(format!("bare quinn baseline: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    runtime.block_on(async {
        let ca = ClusterCa::generate("bench").map_err(|e| failed(&e))?;
        let server = NodeId::new("ps", 0);
        let creds = ca.issue(&server).map_err(|e| failed(&e))?;
        let pair = BarePair::new(&server, &creds, &TransportConfig::default())
            .await
            .map_err(|e| failed(&e))?;
        // A first transfer lets path-MTU discovery and congestion control settle, as they
        // have in the cluster runs after their warm-up steps; it is not counted.
        pair.goodput(BARE_MESSAGE_BYTES, 64)
            .await
            .map_err(|e| failed(&e))?;
        let mut samples = Vec::with_capacity(3);
        for _ in 0..3 {
            samples.push(
                pair.goodput(BARE_MESSAGE_BYTES, BARE_SAMPLE_MESSAGES)
                    .await
                    .map_err(|e| failed(&e))?,
            );
        }
        samples.sort_by(f64::total_cmp);
        Ok(samples[1])
    })
}
