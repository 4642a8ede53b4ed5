//! A program of your own on cohort: a candle-nn model trained under ParameterServerStrategy.
//! The same binary is every process of the job; `launch` runs it as a local cluster:
//!
//!     cargo run --release -- launch --workers 2 --ps 1
//!
//! The model learns y = sin(x0) + x1² from batches each worker reads from its own dataset
//! (a per-worker dataset: every worker builds it from the same registered function).

use cohort::candle::{Device, Module, Tensor};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::data::{DataError, Dataset, InputContext};
use cohort::optim::Optimizer;
use cohort::program::{Program, ServerModel, Step, StepContext, StepError, WorkerData};

const SEED: u64 = 42;
const BATCH: usize = 64;
const STEPS: u64 = 400;

/// The model: any candle-nn model built from a `VarBuilder`.
struct Mlp {
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    fn new(vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        Ok(Self {
            hidden: candle_nn::linear(2, 32, vb.pp("hidden"))?,
            out: candle_nn::linear(32, 1, vb.pp("out"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> cohort::candle::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.tanh()?)
    }
}

/// What a step is asked to do and what it answers: any serde types.
#[derive(serde::Serialize, serde::Deserialize)]
struct Batch {
    step: u64,
}

/// The step, registered once and scheduled by this handle.
static TRAIN: Step<Batch, f32> = Step::new("train");

/// Each worker's batches of inputs and targets, registered, created and read by this handle.
static SAMPLES: WorkerData<(Tensor, Tensor)> = WorkerData::new("samples");

/// A worker's dataset: its own samples in [-1, 1)² with their targets, shuffled, in batches.
fn samples(ctx: &InputContext) -> Result<Dataset, DataError> {
    let (x, y) = draw(4096, ctx.input_pipeline_id as u64)?;
    Ok(Dataset::from_tensor_slices(vec![x, y])?
        .shuffle(4096, 7)
        .repeat(None)
        .batch(BATCH, true))
}

/// `n` inputs and targets from stream `seed`.
fn draw(n: usize, seed: u64) -> cohort::candle::Result<(Tensor, Tensor)> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let x: Vec<f32> = (0..n * 2).map(|_| next()).collect();
    let y: Vec<f32> = x.chunks(2).map(|p| p[0].sin() + p[1] * p[1]).collect();
    Ok((
        Tensor::from_vec(x, (n, 2), &Device::Cpu)?,
        Tensor::from_vec(y, (n, 1), &Device::Cpu)?,
    ))
}

fn main() {
    let program = Program::new("template")
        .optimizer(Optimizer::adam(0.01))
        .dataset(&SAMPLES, samples)
        .step(&TRAIN, |ctx: &mut StepContext<'_>, _args: Batch| {
            let (x, y) = ctx.next(&SAMPLES)?;
            let model = ServerModel::build(ctx, Mlp::new)?;
            let report = model.train_step(ctx, &[x, y], SEED, |mlp, batch| {
                (mlp.forward(&batch[0])? - &batch[1])?.sqr()?.flatten_all()
            })?;
            Ok::<_, StepError>(report.loss)
        })
        .chief(|coordinator| {
            ServerModel::create_variables(coordinator, SEED, Mlp::new, |_name, _shape| None)?;
            coordinator.create_per_worker_dataset(&SAMPLES)?;
            let values = (0..STEPS)
                .map(|step| coordinator.schedule(&TRAIN, Batch { step }))
                .collect::<Result<Vec<_>, _>>()?;
            let losses = values
                .iter()
                .map(|value| coordinator.fetch(value))
                .collect::<Result<Vec<f32>, _>>()?;
            let mean = |part: &[f32]| part.iter().sum::<f32>() / part.len() as f32;
            println!(
                "mean squared error: first 20 steps {:.4}, last 20 steps {:.4}",
                mean(&losses[..20]),
                mean(&losses[losses.len() - 20..])
            );
            Ok(())
        });
    std::process::exit(cohort::program::main(program));
}
