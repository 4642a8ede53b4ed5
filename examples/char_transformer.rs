//! A character-level decoder-only transformer on *Moby Dick* under MultiWorkerMirrored, each
//! worker with 2 replicas, the job scaled from 2 to 3 workers and back to 2 while it trains.
//!
//! ```sh
//! cargo run --release --example char_transformer -- launch --workers 1:2 --replicas 2
//! ```
//!
//! starts the chief and one worker (4 replicas); at step 400 the chief asks the launcher for a
//! second worker (6 replicas: the group admits it at a step boundary), at step 1000 for one
//! worker again (the newest is drained and leaves at a step boundary). The global batch stays
//! 48 sequences of 64 characters throughout. Loss and perplexity go to TensorBoard
//! (`$TMPDIR/cohort-char-transformer/tb`) and, at the end, to a PNG beside it.

use cohort::candle::{Device, Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Embedding, Init, Linear, VarBuilder};
use cohort::data::{datasets::gutenberg, Dataset};
use cohort::keras::callbacks::{PlotHistory, ScaleWorkers, TensorBoard};
use cohort::keras::{metrics, Fit, Loss, Model};
use cohort::nn::{layer_norm, multi_head_attention, LayerNorm, MultiHeadAttention};
use cohort::optim::Optimizer;
use cohort::program::{multi_worker_main, MultiWorkerTask};
use cohort::train::{DistributedOptimizer, LearningRateSchedule};

const CONTEXT: usize = 64;
const WIDTH: usize = 64;
const HEADS: usize = 4;
const LAYERS: usize = 2;
const GLOBAL_BATCH: usize = 48;
const STEPS_PER_EPOCH: usize = 150;
const EPOCHS: usize = 10;
/// Workers besides the chief asked for at a step: 2 (3 in the group) at 400, 1 at 1000.
const SCALE_PLAN: [(u64, u32); 2] = [(400, 2), (1000, 1)];

struct Block {
    norm1: LayerNorm,
    attention: MultiHeadAttention,
    norm2: LayerNorm,
    up: Linear,
    down: Linear,
}

struct Gpt {
    tokens: Embedding,
    positions: Tensor,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
}

impl Gpt {
    fn new(vocabulary: usize, vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        let block = |vb: VarBuilder<'static>| -> cohort::candle::Result<Block> {
            Ok(Block {
                norm1: layer_norm(WIDTH, 1e-5, vb.pp("norm1"))?,
                attention: multi_head_attention(WIDTH, HEADS, vb.clone())?.causal(),
                norm2: layer_norm(WIDTH, 1e-5, vb.pp("norm2"))?,
                up: candle_nn::linear(WIDTH, 4 * WIDTH, vb.pp("up"))?,
                down: candle_nn::linear(4 * WIDTH, WIDTH, vb.pp("down"))?,
            })
        };
        let init = Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        Ok(Self {
            tokens: candle_nn::embedding(vocabulary, WIDTH, vb.pp("tokens"))?,
            positions: vb.get_with_hints((CONTEXT, WIDTH), "positions", init)?,
            blocks: (0..LAYERS)
                .map(|i| block(vb.pp(format!("block{i}"))))
                .collect::<Result<_, _>>()?,
            norm: layer_norm(WIDTH, 1e-5, vb.pp("norm"))?,
            head: candle_nn::linear(WIDTH, vocabulary, vb.pp("head"))?,
        })
    }
}

impl ModuleT for Gpt {
    fn forward_t(&self, ids: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let mut x = self.tokens.forward(ids)?.broadcast_add(&self.positions)?;
        for b in &self.blocks {
            x = (&x + b.attention.forward(&b.norm1.forward(&x)?)?)?;
            let mlp = b
                .down
                .forward(&b.up.forward(&b.norm2.forward(&x)?)?.gelu()?)?;
            x = (&x + mlp)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

/// Sequences of `CONTEXT` characters and the same shifted by one.
fn sequences(ids: &[u32]) -> Result<Dataset, Box<dyn std::error::Error>> {
    let n = (ids.len() - 1) / CONTEXT;
    let window = |shift: usize| {
        Tensor::from_vec(
            ids[shift..shift + n * CONTEXT].to_vec(),
            (n, CONTEXT),
            &Device::Cpu,
        )
    };
    Ok(Dataset::from_tensor_slices(vec![window(0)?, window(1)?])?)
}

fn train(task: MultiWorkerTask) -> Result<(), Box<dyn std::error::Error>> {
    let text = gutenberg::moby_dick()?;
    let mut vocabulary: Vec<char> = text.chars().collect();
    vocabulary.sort_unstable();
    vocabulary.dedup();
    let ids: Vec<u32> = text
        .chars()
        .map(|c| vocabulary.binary_search(&c).unwrap() as u32)
        .collect();
    let split = ids.len() * 95 / 100;
    let train = sequences(&ids[..split])?
        .shuffle(20_000, 3)
        .repeat(None)
        .batch(GLOBAL_BATCH, true);
    let held_out = sequences(&ids[split..])?.batch(GLOBAL_BATCH, true);

    let chief = task.strategy.is_chief();
    let v = vocabulary.len();
    let mut model = Model::new(task.strategy, 5, move |vb| Gpt::new(v, vb))?;
    let steps = (EPOCHS * STEPS_PER_EPOCH) as u64;
    model.compile(
        DistributedOptimizer::new(Optimizer::adamw(0.0, 0.01))
            .with_schedule(
                LearningRateSchedule::cosine_decay(0.0, steps - 100).with_warmup(3e-3, 100),
            )?
            .with_global_clipnorm(1.0)?,
        Loss::sparse_categorical_crossentropy(),
        vec![Box::new(metrics::Perplexity)],
    );
    let out = std::env::temp_dir().join("cohort-char-transformer");
    let history = model.fit(
        &train,
        Fit::epochs(EPOCHS)
            .steps_per_epoch(STEPS_PER_EPOCH)
            .validation_data(held_out)
            .callback(TensorBoard::new(out.join("tb")).update_freq_steps(10))
            .callback(ScaleWorkers::at(&SCALE_PLAN))
            .callback(
                PlotHistory::new(
                    out.join("perplexity.png"),
                    &["perplexity", "val_perplexity"],
                )
                .marker(400.0 / STEPS_PER_EPOCH as f64, "3 workers")
                .marker(1000.0 / STEPS_PER_EPOCH as f64, "2 workers"),
            )
            .preemption_notice(task.notice)
            .drain(task.drain),
    )?;
    if history.left.is_some() || !chief {
        return Ok(());
    }
    println!(
        "char_transformer: held-out perplexity {:.2} (loss {:.3}) after {} steps, {} re-formings; charts in {}",
        history.get("val_perplexity").last().unwrap_or(&f64::NAN),
        history.get("val_loss").last().unwrap_or(&f64::NAN),
        history.step,
        history.recoveries,
        out.display()
    );
    Ok(())
}

fn main() {
    std::process::exit(multi_worker_main(train));
}
