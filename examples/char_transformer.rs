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

use cohort::candle::{Module, ModuleT, Tensor};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::data::datasets::gutenberg;
use cohort::data::text::{shifted_windows, CharVocabulary};
use cohort::keras::callbacks::{PlotHistory, ScaleWorkers, TensorBoard};
use cohort::keras::{metrics, Fit, Loss, Model};
use cohort::nn::{layer_norm, token_and_position_embedding, transformer_decoder, LayerNorm};
use cohort::nn::{TokenAndPositionEmbedding, TransformerDecoder};
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

struct Gpt {
    embed: TokenAndPositionEmbedding,
    blocks: Vec<TransformerDecoder>,
    norm: LayerNorm,
    head: Linear,
}

impl Gpt {
    fn new(vocabulary: usize, vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        Ok(Self {
            embed: token_and_position_embedding(vocabulary, CONTEXT, WIDTH, vb.clone())?,
            blocks: (0..LAYERS)
                .map(|i| transformer_decoder(WIDTH, HEADS, 4 * WIDTH, vb.pp(format!("block{i}"))))
                .collect::<Result<_, _>>()?,
            norm: layer_norm(WIDTH, 1e-5, vb.pp("norm"))?,
            head: candle_nn::linear(WIDTH, vocabulary, vb.pp("head"))?,
        })
    }
}

impl ModuleT for Gpt {
    fn forward_t(&self, ids: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

fn train(task: MultiWorkerTask) -> Result<(), Box<dyn std::error::Error>> {
    let text = gutenberg::moby_dick()?;
    let vocabulary = CharVocabulary::of(&text);
    let ids = vocabulary.encode(&text)?;
    let split = ids.len() * 95 / 100;
    let train = shifted_windows(&ids[..split], CONTEXT)?
        .shuffle(20_000, 3)
        .repeat(None)
        .batch(GLOBAL_BATCH, true);
    let held_out = shifted_windows(&ids[split..], CONTEXT)?.batch(GLOBAL_BATCH, true);

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
