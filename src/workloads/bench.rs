//! The parameter-server benchmark job (`cohort bench ps`): the two standard workloads on a
//! local cluster, timed after a warm-up.
//!
//! - dense: MLP 784-256-256-10 (≈ 270k parameters), SGD, batch 256, seeded synthetic inputs;
//! - sparse: a 1,000,000 × 16 embedding split over the parameter servers and a logistic head,
//!   batch 512 with 26 random ids per example, SGD;
//! - goodput: no compute; each closure pulls and pushes a 4 MiB variable split over the
//!   parameter servers, measuring push+pull goodput through the whole PS path.
//!
//! The chief writes its measurements as JSON to the file named by `COHORT_BENCH_REPORT`. The
//! same job runs the recovery benchmark's workload ([`super::recovery`]).

use crate::process::stdout::outln;
use std::time::Instant;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use super::models::{self, ParamSpec};
use crate::data::{DataError, Dataset, InputContext};
use crate::optim::Optimizer;
use crate::program::{
    ClusterCoordinator, CoordinatorError, Program, StepContext, StepError, VariableSpec,
};
use crate::variable::Partitioner;

/// Layer widths of the dense workload.
pub const DENSE_LAYERS: [usize; 4] = [784, 256, 256, 10];
/// Examples per dense step.
pub const DENSE_BATCH: usize = 256;
/// Examples per sparse step.
pub const SPARSE_BATCH: usize = 512;
/// Ids per sparse example.
pub const SPARSE_FIELDS: usize = 26;
/// Rows of the sparse workload's embedding.
pub const SPARSE_VOCAB: usize = 1_000_000;
/// Embedding width of the sparse workload.
pub const SPARSE_DIM: usize = 16;

/// What one benchmark run measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    /// `dense` or `sparse`.
    pub workload: String,
    /// Timed steps (after warm-up).
    pub steps: usize,
    /// Seconds the timed steps took.
    pub seconds: f64,
    /// Steps per second.
    pub steps_per_s: f64,
    /// Examples per second.
    pub examples_per_s: f64,
    /// Bytes pulled and pushed per step (all workers' traffic to the parameter servers).
    pub ps_bytes_per_step: u64,
    /// Parameter-server push+pull goodput during the timed steps, MiB/s.
    pub ps_goodput_mib_s: f64,
}

/// The benchmark job: both workloads' datasets and steps; the chief runs the workload named by
/// `COHORT_BENCH_WORKLOAD` for `COHORT_BENCH_STEPS` steps after `COHORT_BENCH_WARMUP`.
pub fn bench_program() -> Program {
    Program::new("cohort-bench")
        .optimizer(Optimizer::sgd(0.01))
        .dataset("dense", dense_dataset)
        .dataset("sparse", sparse_dataset)
        .step_encoded("dense_step", dense_step)
        .step_encoded("sparse_step", sparse_step)
        .step_encoded("goodput_step", goodput_step)
        .step_encoded(super::recovery::STEP, super::recovery::step)
        .chief(run_chief)
}

fn dense_dataset(ctx: &InputContext) -> Result<Dataset, DataError> {
    // A few seeded batches, repeated: input generation must not be what is measured.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(100 + ctx.input_pipeline_id as u64);
    let n = DENSE_BATCH * 4;
    let features: Vec<f32> = (0..n * DENSE_LAYERS[0])
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let labels: Vec<i64> = (0..n).map(|_| rng.gen_range(0..10)).collect();
    let features = Tensor::from_vec(features, (n, DENSE_LAYERS[0]), &Device::Cpu)?;
    let labels = Tensor::from_vec(labels, n, &Device::Cpu)?;
    Ok(Dataset::from_tensor_slices(vec![features, labels])?
        .repeat(None)
        .batch(DENSE_BATCH, true))
}

fn sparse_dataset(ctx: &InputContext) -> Result<Dataset, DataError> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(200 + ctx.input_pipeline_id as u64);
    let n = SPARSE_BATCH * 4;
    let ids: Vec<i64> = (0..n * SPARSE_FIELDS)
        .map(|_| rng.gen_range(0..SPARSE_VOCAB as i64))
        .collect();
    let labels: Vec<f32> = (0..n).map(|_| f32::from(rng.gen_bool(0.3))).collect();
    let ids = Tensor::from_vec(ids, (n, SPARSE_FIELDS), &Device::Cpu)?;
    let labels = Tensor::from_vec(labels, n, &Device::Cpu)?;
    Ok(Dataset::from_tensor_slices(vec![ids, labels])?
        .repeat(None)
        .batch(SPARSE_BATCH, true))
}

fn dense_step(ctx: &mut StepContext<'_>, _args: &[u8]) -> Result<Vec<u8>, StepError> {
    let t0 = Instant::now();
    let batch = ctx.next("dense")?;
    // The batch's tensors are read in place and the pulled buffers become the variables:
    // no copy of either on the way into the model.
    let features = batch[0].reshape(((), DENSE_LAYERS[0]))?;
    let labels = batch[1].flatten_all()?;
    let t1 = Instant::now();
    let specs = dense_params();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let params = ctx.pull_many(&names)?;
    let t2 = Instant::now();
    let out = models::mlp_step_owned(&DENSE_LAYERS, params, &features, &labels)?;
    tracing::debug!(
        "dense step: input {:?} pull {:?} compute {:?}",
        t1 - t0,
        t2 - t1,
        t2.elapsed()
    );
    for (spec, grad) in specs.iter().zip(out.grads) {
        ctx.push_dense(&spec.name, grad)?;
    }
    Ok(Vec::new())
}

/// The dense workload's step computation alone, on this process's compute threads with no
/// distribution: the median milliseconds of `steps` timed steps (forward and backward of a
/// batch of [`DENSE_BATCH`], as each worker of the dense job computes) after 30 untimed ones,
/// as `benches/peers/dense_step_compute.py` times the Python jobs' computation.
pub fn dense_compute_alone_ms(steps: usize) -> Result<f64, crate::nn::NnError> {
    let specs = dense_params();
    let params = specs
        .iter()
        .map(|spec| -> Result<Vec<f32>, crate::nn::NnError> {
            Ok(spec.init.init(&spec.shape)?.flatten_all()?.to_vec1::<f32>()?)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(100);
    let features: Vec<f32> = (0..DENSE_BATCH * DENSE_LAYERS[0])
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let labels: Vec<i64> = (0..DENSE_BATCH).map(|_| rng.gen_range(0..10)).collect();
    for _ in 0..30 {
        models::mlp_step(&DENSE_LAYERS, &views, &features, &labels)?;
    }
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps.max(1) {
        let started = Instant::now();
        models::mlp_step(&DENSE_LAYERS, &views, &features, &labels)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn sparse_step(ctx: &mut StepContext<'_>, _args: &[u8]) -> Result<Vec<u8>, StepError> {
    let batch = ctx.next("sparse")?;
    let ids: Vec<u64> = batch[0]
        .flatten_all()?
        .to_vec1::<i64>()?
        .into_iter()
        .map(|id| id as u64)
        .collect();
    let labels = batch[1].to_vec1::<f32>()?;
    let (unique, positions) = models::unique_rows(&ids);
    let rows = ctx.pull_rows(EMBEDDING, &unique)?;
    let head_specs = head_params();
    let head_names: Vec<&str> = head_specs.iter().map(|s| s.name.as_str()).collect();
    let head = ctx.pull_many(&head_names)?;
    let out = models::ctr_step(
        &rows,
        SPARSE_DIM,
        &positions,
        SPARSE_FIELDS,
        [&head[0], &head[1]],
        &labels,
    )?;
    let mut grads = out.grads.into_iter();
    ctx.push_rows(EMBEDDING, unique, grads.next().unwrap_or_default())?;
    for (spec, grad) in head_params().iter().zip(grads) {
        ctx.push_dense(&spec.name, grad)?;
    }
    Ok(Vec::new())
}

fn goodput_step(ctx: &mut StepContext<'_>, _args: &[u8]) -> Result<Vec<u8>, StepError> {
    let values = ctx.pull(GOODPUT_BLOB)?;
    // The pulled values go back as the gradient: the variable starts at zero, so the full
    // 4 MiB travels both ways while SGD keeps it at zero, and no step-side work is timed.
    ctx.push_dense(GOODPUT_BLOB, values)?;
    Ok(Vec::new())
}

/// Creates the variables of `workload` on the servers; returns its step function, its batch
/// (examples per step) and the bytes a step pulls and pushes.
fn create_variables_of(
    coordinator: &mut ClusterCoordinator,
    workload: &str,
) -> Result<(&'static str, usize, u64), CoordinatorError> {
    Ok(match workload {
        "dense" => {
            // As TensorFlow's guide sets up ParameterServerStrategy: variables of 256 KiB and
            // more are split over the servers, so that the first kernel (800 KiB) does not
            // leave one server carrying most of every step's traffic.
            let partitioner = Partitioner::MinSize {
                min_shard_bytes: 256 << 10,
                max_shards: coordinator.num_ps() as usize,
            };
            for spec in dense_params() {
                coordinator.create_variable(
                    VariableSpec::new(spec.name, spec.shape, spec.init).partitioned(partitioner),
                )?;
            }
            let params: usize = dense_params()
                .iter()
                .map(|s| s.shape.iter().product::<usize>())
                .sum();
            ("dense_step", DENSE_BATCH, 2 * 4 * params as u64)
        }
        "sparse" => {
            let table = VariableSpec::new(
                EMBEDDING,
                vec![SPARSE_VOCAB, SPARSE_DIM],
                crate::nn::Initializer::RandomUniform {
                    min: -0.05,
                    max: 0.05,
                    seed: 1,
                },
            )
            .partitioned(Partitioner::FixedShards {
                num_shards: coordinator.num_ps() as usize,
            });
            coordinator.create_variable(table)?;
            for spec in head_params() {
                coordinator.create_variable(VariableSpec::new(spec.name, spec.shape, spec.init))?;
            }
            // Nearly every id of a batch is distinct among 1,000,000 rows.
            let rows = (SPARSE_BATCH * SPARSE_FIELDS) as u64;
            (
                "sparse_step",
                SPARSE_BATCH,
                2 * 4 * (rows * SPARSE_DIM as u64 + SPARSE_DIM as u64 + 1),
            )
        }
        "goodput" => {
            let blob = VariableSpec::zeros(GOODPUT_BLOB, vec![GOODPUT_FLOATS]).partitioned(
                Partitioner::FixedShards {
                    num_shards: coordinator.num_ps() as usize,
                },
            );
            coordinator.create_variable(blob)?;
            ("goodput_step", 0, 2 * 4 * GOODPUT_FLOATS as u64)
        }
        _ => return Err(BenchError::UnknownWorkload(workload.to_string()).into()),
    })
}

fn run_chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    let env = |key: &str, default: usize| {
        std::env::var(key)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let workload = std::env::var("COHORT_BENCH_WORKLOAD").unwrap_or_else(|_| "dense".into());
    let steps = env("COHORT_BENCH_STEPS", 300);
    let warmup = env("COHORT_BENCH_WARMUP", 30);
    if workload == "recovery" {
        return super::recovery::run_chief(coordinator, steps);
    }
    let (function, batch, bytes_per_step) = create_variables_of(coordinator, &workload)?;
    if workload != "goodput" {
        coordinator.create_per_worker_dataset(&workload)?;
    }
    coordinator.wait_for_workers(
        coordinator.num_workers() as usize,
        std::time::Duration::from_secs(60),
    )?;
    for _ in 0..warmup {
        coordinator.schedule_encoded(function, Vec::new())?;
    }
    coordinator.join()?;
    let started = Instant::now();
    for _ in 0..steps {
        coordinator.schedule_encoded(function, Vec::new())?;
    }
    coordinator.join()?;
    let seconds = started.elapsed().as_secs_f64();
    let report = BenchReport {
        workload: workload.clone(),
        steps,
        seconds,
        steps_per_s: steps as f64 / seconds,
        examples_per_s: (steps * batch) as f64 / seconds,
        ps_bytes_per_step: bytes_per_step,
        ps_goodput_mib_s: (bytes_per_step as f64 * steps as f64) / seconds / (1024.0 * 1024.0),
    };
    outln!(
        "{workload}: {steps} steps in {seconds:.2}s: {:.1} steps/s, {:.0} examples/s, PS push+pull {:.1} MiB/s",
        report.steps_per_s, report.examples_per_s, report.ps_goodput_mib_s
    );
    if let Ok(path) = std::env::var("COHORT_BENCH_REPORT") {
        let json = serde_json::to_string(&report).map_err(BenchError::Encode)?;
        std::fs::write(&path, json).map_err(|source| BenchError::Write { path, source })?;
    }
    Ok(())
}

/// Why the benchmark's chief failed, apart from the coordinator's own errors (carried as
/// [`CoordinatorError::Other`]).
#[derive(Debug, thiserror::Error)]
enum BenchError {
    /// `COHORT_BENCH_WORKLOAD` names no workload.
    #[error("COHORT_BENCH_WORKLOAD: unknown workload {0:?} (dense, sparse, goodput)")]
    UnknownWorkload(String),
    /// The report could not be encoded.
    #[error("encoding the report: {0}")]
    Encode(#[source] serde_json::Error),
    /// The report could not be written to `COHORT_BENCH_REPORT`.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<BenchError> for CoordinatorError {
    fn from(e: BenchError) -> Self {
        CoordinatorError::other(e)
    }
}

fn dense_params() -> Vec<ParamSpec> {
    models::mlp_params("mlp", &DENSE_LAYERS, 1)
}

fn head_params() -> Vec<ParamSpec> {
    models::ctr_head_params(SPARSE_DIM, 2)
}

const EMBEDDING: &str = "sparse/embedding";
const GOODPUT_BLOB: &str = "goodput/blob";
/// Elements of the goodput variable (4 MiB of f32).
pub const GOODPUT_FLOATS: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense step's computation alone runs the workload's model and gives a median time.
    #[test]
    fn the_dense_computation_alone_is_timed() {
        let ms = dense_compute_alone_ms(3).unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{ms}");
    }
}
