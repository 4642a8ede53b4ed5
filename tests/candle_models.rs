//! A model written for candle-nn, as a user already has it, trains under cohort's strategies
//! through the public API only: convolution, normalization, dropout, an embedding and
//! self-attention, built from a `VarBuilder` whose variables are the strategy's.
//!
//! Under the default strategy, `Mirrored(2)` and MultiWorkerMirrored (two worker processes of
//! two replicas each, talking QUIC), the same global batches give the same
//! losses and the same variables (to 1e-5): the variables start from the same seeded values,
//! dropout masks follow each example's row in the global batch, and the replicas' gradients sum
//! to the global batch's.
//!
//! Under ParameterServerStrategy (2 servers × 2 workers of 2 local replicas, real processes)
//! the same model, built by the same function, converges with its variables on the servers
//! (`ServerModel`); a worker whose model asks for a variable the chief did not create, and a
//! model with batch-norm statistics on the chief, are refused naming the variable; its
//! embedding table is updated by its own optimizer (Adagrad, by name scope), the rest by the
//! program's (Adam), each variable with its optimizer's slots.

mod mwms_support;
mod ps_support;

use std::sync::Arc;
use std::time::Instant;

use cohort::checkpoint::{read_checkpoint, slot_tensor_name, CheckpointManager, CheckpointPolicy};

use cohort::candle::{DType, Device, Module, ModuleT, Tensor, D};
use cohort::candle_nn::{self, Conv2d, Conv2dConfig, Embedding, Linear, VarBuilder};
use cohort::nn::{Dropout, LayerNorm, ModelVariables, NnError};
use cohort::optim::Optimizer;
use cohort::program::{
    ClusterCoordinator, CoordinatorError, Program, RowRead, ServerModel, Step, StepContext,
    StepError, WeightAccess,
};
use cohort::strategy::{
    CentralStorage, DefaultStrategy, Mirrored, MultiWorkerMirrored, PerReplica, ReduceOp, Strategy,
    StrategyExt,
};
use cohort::train::{DistributedOptimizer, ReplicatedModel, StepOutput, StepSpec, TrainError};
use cohort::variable::Partitioner;

const SEED: u64 = 11;
const GLOBAL_BATCH: usize = 8;
const STEPS: u64 = 6;
const VOCAB: usize = 12;
const TOKENS: usize = 3;
const WIDTH: usize = 8;
const CLASSES: usize = 3;

/// An image (1×6×6) and three token ids in, three classes out: the image becomes one token
/// beside the embedded ids, one self-attention layer mixes them, then a residual, layer
/// normalization, dropout and a linear head.
#[derive(Debug)]
struct Net {
    conv: Conv2d,
    image_token: Linear,
    embedding: Embedding,
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    norm: LayerNorm,
    dropout: Dropout,
    head: Linear,
}

impl Net {
    fn new(vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        let conv_config = Conv2dConfig::default();
        Ok(Self {
            conv: candle_nn::conv2d(1, 4, 3, conv_config, vb.pp("conv"))?,
            image_token: candle_nn::linear(4 * 4 * 4, WIDTH, vb.pp("image_token"))?,
            embedding: candle_nn::embedding(VOCAB, WIDTH, vb.pp("embedding"))?,
            query: candle_nn::linear(WIDTH, WIDTH, vb.pp("attention.query"))?,
            // No bias: a bias on the keys shifts every score of a query alike, which softmax ignores
            // (its gradient is zero up to rounding, which Adam would amplify).
            key: candle_nn::linear_no_bias(WIDTH, WIDTH, vb.pp("attention.key"))?,
            value: candle_nn::linear(WIDTH, WIDTH, vb.pp("attention.value"))?,
            attention_out: candle_nn::linear(WIDTH, WIDTH, vb.pp("attention.out"))?,
            norm: cohort::nn::layer_norm(WIDTH, 1e-5, vb.pp("norm"))?,
            dropout: Dropout::new(0.2).map_err(cohort::candle::Error::wrap)?,
            head: candle_nn::linear(WIDTH, CLASSES, vb.pp("head"))?,
        })
    }

    fn logits(&self, images: &Tensor, ids: &Tensor, train: bool) -> cohort::candle::Result<Tensor> {
        let batch = images.dim(0)?;
        let image = self
            .conv
            .forward(images)?
            .relu()?
            .reshape((batch, 4 * 4 * 4))?;
        let image = self.image_token.forward(&image)?.unsqueeze(1)?;
        let tokens = Tensor::cat(&[image, self.embedding.forward(ids)?], 1)?;
        let q = self.query.forward(&tokens)?;
        let k = self.key.forward(&tokens)?;
        let v = self.value.forward(&tokens)?;
        let scores = (q.matmul(&k.transpose(1, 2)?)? / (WIDTH as f64).sqrt())?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let attended = self.attention_out.forward(&weights.matmul(&v)?)?;
        let mixed = self.norm.forward(&(tokens + attended)?)?;
        let pooled = mixed.mean(1)?;
        self.head.forward(&self.dropout.forward_t(&pooled, train)?)
    }

    fn per_example_loss(
        &self,
        images: &Tensor,
        ids: &Tensor,
        labels: &Tensor,
    ) -> cohort::candle::Result<Tensor> {
        let logits = self.logits(images, ids, true)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        log_probs
            .gather(&labels.unsqueeze(1)?, 1)?
            .squeeze(1)?
            .neg()
    }
}

/// One global batch: images, token ids and labels, a function of the step (the labels follow
/// the ids, so there is something to learn).
fn global_batch(step: u64) -> (Tensor, Tensor, Tensor) {
    let cpu = &Device::Cpu;
    let pixels: Vec<f32> = (0..GLOBAL_BATCH * 36)
        .map(|i| ((i as u64 * 7 + step * 13) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let ids: Vec<u32> = (0..GLOBAL_BATCH * TOKENS)
        .map(|i| ((i as u64 * 5 + step * 3) % VOCAB as u64) as u32)
        .collect();
    let labels: Vec<u32> = (0..GLOBAL_BATCH)
        .map(|e| ids[e * TOKENS] % CLASSES as u32)
        .collect();
    (
        Tensor::from_vec(pixels, (GLOBAL_BATCH, 1, 6, 6), cpu).unwrap(),
        Tensor::from_vec(ids, (GLOBAL_BATCH, TOKENS), cpu).unwrap(),
        Tensor::from_vec(labels, GLOBAL_BATCH, cpu).unwrap(),
    )
}

/// Each step's global loss, and every variable's final value by name.
type Trained = (Vec<f32>, Vec<(String, Vec<f32>)>);

/// Trains `STEPS` steps of Adam under `strategy`, each global batch split evenly over its
/// replicas; gives the global mean loss of each step and every variable's final value.
fn train(strategy: &dyn Strategy) -> Trained {
    let model = Arc::new(ReplicatedModel::build(strategy, SEED, Net::new).unwrap());
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::adam(0.01)));
    let replicas = strategy.num_replicas_in_sync();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (images, ids, labels) = global_batch(step);
        let rows = GLOBAL_BATCH / replicas;
        let split = |t: &Tensor| -> Vec<Tensor> {
            (0..replicas)
                .map(|r| t.narrow(0, r * rows, rows).unwrap())
                .collect()
        };
        let per_replica: Vec<(Tensor, Tensor, Tensor)> = split(&images)
            .into_iter()
            .zip(split(&ids))
            .zip(split(&labels))
            .map(|((a, b), c)| (a, b, c))
            .collect();
        let inputs = strategy.experimental_distribute_values_from_function(move |ctx| {
            per_replica[ctx.replica_id_in_sync_group].clone()
        });
        let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
        let outputs = strategy
            .run(
                move |ctx, (images, ids, labels): (Tensor, Tensor, Tensor)| {
                    m.train_step(ctx, &o, StepSpec::new(step), |net| {
                        net.per_example_loss(&images, &ids, &labels)
                    })
                },
                inputs,
            )
            .unwrap()
            .transpose()
            .unwrap();
        losses.push(global_loss(strategy, &outputs));
    }
    let variables = model
        .variables()
        .variables()
        .into_iter()
        .map(|v| {
            let copies = v.components();
            for copy in &copies[1..] {
                assert_eq!(
                    copy.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    copies[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    "the replicas' copies of {} differ",
                    v.name()
                );
            }
            (
                v.name().to_owned(),
                copies[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            )
        })
        .collect();
    (losses, variables)
}

#[test]
fn a_candle_nn_model_trains_the_same_under_the_default_strategy_and_mirrored() {
    let (default_losses, default_vars) = train(&DefaultStrategy::new());
    let (mirrored_losses, mirrored_vars) = train(&Mirrored::new(2).unwrap());

    assert!(
        default_losses.last().unwrap() < default_losses.first().unwrap(),
        "the model does not learn: {default_losses:?}"
    );
    assert!(default_vars.len() >= 16, "{} variables", default_vars.len());
    assert_same_run(
        (&default_losses, &default_vars),
        (&mirrored_losses, &mirrored_vars),
        "mirrored",
    );
    // One copy of each variable on the host, updated once by replica 0 for both.
    let (central_losses, central_vars) = train(&CentralStorage::new(2).unwrap());
    assert_same_run(
        (&default_losses, &default_vars),
        (&central_losses, &central_vars),
        "central storage",
    );
}

/// A worker process of the MultiWorkerMirrored test: 2 local replicas of 4.
#[test]
fn mwms_worker_process() {
    mwms_support::run_if_worker_process(|config| {
        let strategy = MultiWorkerMirrored::new(config.with_local_replicas(2)).unwrap();
        assert_eq!(strategy.num_replicas_in_sync(), 4);
        train(&strategy)
    });
}

#[test]
fn a_candle_nn_model_trains_the_same_under_multi_worker_mirrored() {
    let (default_losses, default_vars) = train(&DefaultStrategy::new());
    let workers: Vec<Trained> = mwms_support::process_pair("candle-model", "mwms_worker_process");
    for (worker, (losses, vars)) in workers.iter().enumerate() {
        assert_same_run(
            (&default_losses, &default_vars),
            (losses, vars),
            &format!("multi-worker (worker {worker})"),
        );
    }
    assert_eq!(
        workers[0].1, workers[1].1,
        "the two workers end with different variables"
    );
}

/// The global batch's mean loss of one step: the replicas' scaled losses summed.
fn global_loss(strategy: &dyn Strategy, outputs: &PerReplica<StepOutput>) -> f32 {
    strategy
        .reduce(ReduceOp::Sum, &outputs.map(|o| o.loss.clone()), None)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The losses and variables of one run, as `train` gives them.
type Run<'a> = (&'a [f32], &'a [(String, Vec<f32>)]);

/// `other`'s losses and variables are the default strategy's, step by step and variable by
/// variable (to 1e-5).
fn assert_same_run(default: Run<'_>, other: Run<'_>, what: &str) {
    for (step, (a, b)) in default.0.iter().zip(other.0).enumerate() {
        assert!(
            (a - b).abs() < 1e-5,
            "step {step}: default loss {a}, {what} {b}"
        );
    }
    assert_eq!(default.1.len(), other.1.len());
    for ((name, a), (other_name, b)) in default.1.iter().zip(other.1) {
        assert_eq!(name, other_name);
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "{name}: default and {what} differ by {worst}");
    }
}

#[test]
fn every_trainable_variable_gets_a_gradient_through_the_model() {
    let strategy = DefaultStrategy::new();
    let model = ReplicatedModel::build(&strategy, SEED, Net::new).unwrap();
    let before: Vec<Vec<f32>> = model
        .trainable_variables()
        .unwrap()
        .iter()
        .map(|v| {
            v.read_value()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect();
    let model = Arc::new(model);
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.1)));
    let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
    let (images, ids, labels) = global_batch(0);
    strategy
        .run(
            move |ctx, ()| {
                m.train_step(ctx, &o, StepSpec::new(0), |net| {
                    net.per_example_loss(&images, &ids, &labels)
                })
            },
            (),
        )
        .unwrap()
        .transpose()
        .unwrap();
    for (variable, old) in model.trainable_variables().unwrap().iter().zip(before) {
        let new = variable
            .read_value()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_ne!(
            new,
            old,
            "{} did not move: no gradient reached it",
            variable.name()
        );
    }
}

/// candle-nn's recurrent layers build through the strategy's variables and train under
/// `Mirrored`, the replicas' copies kept equal.
#[test]
fn candle_nn_lstm_and_gru_train_under_mirrored() {
    use cohort::candle_nn::rnn::{GRUConfig, LSTMConfig, GRU, LSTM, RNN};

    #[derive(Debug)]
    struct Recurrent {
        lstm: LSTM,
        gru: GRU,
        head: Linear,
    }
    let strategy = Mirrored::new(2).unwrap();
    let model = Arc::new(
        ReplicatedModel::build(&strategy, 3, |vb| {
            Ok(Recurrent {
                lstm: candle_nn::lstm(2, 4, LSTMConfig::default(), vb.pp("lstm"))?,
                gru: candle_nn::gru(4, 4, GRUConfig::default(), vb.pp("gru"))?,
                head: candle_nn::linear(4, 1, vb.pp("head"))?,
            })
        })
        .unwrap(),
    );
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.05)));
    let mut losses = Vec::new();
    for step in 0..4 {
        let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
        let out = strategy
            .run(
                move |ctx, ()| {
                    let offset = ctx.replica_id_in_sync_group() as f32;
                    let xs =
                        Tensor::new(&[[[offset, 1.0], [0.5, -1.0], [1.0, 0.0]]], &Device::Cpu)?;
                    m.train_step(ctx, &o, StepSpec::new(step), |net| {
                        let states = net.lstm.seq(&xs)?;
                        let hidden = net.lstm.states_to_tensor(&states)?;
                        let states = net.gru.seq(&hidden)?;
                        let last = states.last().expect("three steps").h().clone();
                        net.head.forward(&last)?.sqr()?.flatten_all()
                    })
                },
                (),
            )
            .unwrap()
            .transpose()
            .unwrap();
        losses.push(global_loss(&strategy, &out));
    }
    assert!(losses[3] < losses[0], "{losses:?}");
    for variable in model.variables().variables() {
        let copies = variable.components();
        assert_eq!(copies.len(), 2);
        assert_eq!(
            copies[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            copies[1].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{}",
            variable.name()
        );
    }
}

/// Batch normalization's running statistics are not trained: each replica updates its copy
/// from its own half batch, and the step averages them across replicas (TensorFlow's MEAN
/// aggregation). The running mean is linear in the batch mean, so after one step of equal
/// halves it is the one-replica run's.
#[test]
fn batch_norm_statistics_are_averaged_across_replicas() {
    #[derive(Debug)]
    struct Normed {
        conv: Conv2d,
        norm: candle_nn::BatchNorm,
        head: Linear,
    }
    let build = |vb: VarBuilder<'static>| -> cohort::candle::Result<Normed> {
        Ok(Normed {
            conv: candle_nn::conv2d(1, 2, 3, Conv2dConfig::default(), vb.pp("conv"))?,
            norm: candle_nn::batch_norm(2, 1e-5, vb.pp("norm"))?,
            head: candle_nn::linear(2 * 4 * 4, 1, vb.pp("head"))?,
        })
    };
    let step = |strategy: &dyn Strategy| -> (Vec<f32>, Vec<Vec<f32>>) {
        let model = Arc::new(ReplicatedModel::build(strategy, 5, build).unwrap());
        let names = model.variables().names();
        assert!(names.contains(&"norm.running_mean".to_owned()), "{names:?}");
        let stats = model.variables().non_trainable_variables();
        assert_eq!(stats.len(), 2, "running mean and variance are not trained");
        let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(0.01)));
        let replicas = strategy.num_replicas_in_sync();
        let (images, _, _) = global_batch(1);
        let rows = GLOBAL_BATCH / replicas;
        let inputs = strategy.experimental_distribute_values_from_function(move |ctx| {
            images
                .narrow(0, ctx.replica_id_in_sync_group * rows, rows)
                .unwrap()
        });
        let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
        strategy
            .run(
                move |ctx, images: Tensor| {
                    m.train_step(ctx, &o, StepSpec::new(0), |net| {
                        let x = net.conv.forward(&images)?;
                        let x = net.norm.forward_t(&x, true)?.flatten_from(1)?;
                        net.head.forward(&x)?.sqr()?.flatten_all()
                    })
                },
                inputs,
            )
            .unwrap()
            .transpose()
            .unwrap();
        let mean = &stats[0];
        let copies: Vec<Vec<f32>> = mean
            .components()
            .iter()
            .map(|c| c.to_vec1::<f32>().unwrap())
            .collect();
        (copies[0].clone(), copies)
    };
    let (one_replica, _) = step(&DefaultStrategy::new());
    let (two_replicas, copies) = step(&Mirrored::new(2).unwrap());
    assert_eq!(copies.len(), 2);
    assert_eq!(copies[0], copies[1], "the replicas' running means differ");
    assert!(
        one_replica.iter().any(|m| m.abs() > 1e-4),
        "{one_replica:?}"
    );
    for (a, b) in one_replica.iter().zip(&two_replicas) {
        assert!(
            (a - b).abs() < 1e-5,
            "running mean {a} (one replica) vs {b} (two)"
        );
    }
}

/// Under CentralStorage every replica's batch normalization would update one shared copy of
/// its statistics in its forward pass: refused at build, naming the statistic.
#[test]
fn batch_norm_under_central_storage_is_refused_naming_the_statistic() {
    let strategy = CentralStorage::new(2).unwrap();
    let err = ReplicatedModel::build(&strategy, 1, |vb| {
        candle_nn::batch_norm(2, 1e-5, vb.pp("norm"))
    })
    .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("norm.running_mean"), "{message}");
    assert!(message.contains("CentralStorage"), "{message}");
}

/// Two replicas that build different models are refused before any step, naming the variable.
#[test]
fn a_model_built_differently_on_two_replicas_is_refused_naming_the_variable() {
    let strategy = Mirrored::new(2).unwrap();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let err = ReplicatedModel::build(&strategy, 1, |vb| {
        let replica = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        candle_nn::linear(3, 2 + replica, vb.pp("dense"))
    })
    .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("dense.weight"), "{message}");
    assert!(
        message.contains("[3, 3]") || message.contains("[3, 2]"),
        "{message}"
    );

    let counter = std::sync::atomic::AtomicUsize::new(0);
    let err = ReplicatedModel::build(&strategy, 1, |vb| {
        let replica = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = if replica == 0 { "a" } else { "b" };
        candle_nn::linear(3, 2, vb.pp(name))
    })
    .unwrap_err();
    assert!(
        matches!(err, TrainError::Nn(NnError::ModelMismatch { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("b.weight"), "{err}");
}

/// The same seed gives the same initial values in every set (every worker, every run), and
/// the values do not depend on the order layers are built in.
#[test]
fn initial_values_are_seeded_by_name() {
    let first = ModelVariables::new(9);
    let _ = candle_nn::linear(4, 4, first.var_builder(0).pp("a")).unwrap();
    let _ = candle_nn::linear(4, 4, first.var_builder(0).pp("b")).unwrap();
    let second = ModelVariables::new(9);
    let _ = candle_nn::linear(4, 4, second.var_builder(0).pp("b")).unwrap();
    let _ = candle_nn::linear(4, 4, second.var_builder(0).pp("a")).unwrap();
    let value = |vars: &ModelVariables, name: &str| {
        vars.get(name)
            .unwrap()
            .read_value()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(value(&first, "a.weight"), value(&second, "a.weight"));
    assert_eq!(value(&first, "b.weight"), value(&second, "b.weight"));
    assert_ne!(value(&first, "a.weight"), value(&first, "b.weight"));
    let other_seed = ModelVariables::new(10);
    let _ = candle_nn::linear(4, 4, other_seed.var_builder(0).pp("a")).unwrap();
    assert_ne!(value(&first, "a.weight"), value(&other_seed, "a.weight"));
    assert_eq!(first.var_builder(0).dtype(), DType::F32);
}

/// Child mode: this process's role of the parameter-server program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(ps_program);
}

/// Global batches the parameter-server job cycles through.
const PS_BATCHES: u64 = 4;
/// Closures the parameter-server job runs.
const PS_STEPS: u64 = 96;

/// One step of [`Net`] on global batch `step % PS_BATCHES`; its value is the batch's loss.
static PS_TRAIN: Step<u64, f32> = Step::new("train");
/// A step whose model has a head of another shape than the chief created.
static PS_WRONG_MODEL: Step<(), ()> = Step::new("wrong_model");
/// A step whose batch reads a row past the table's end.
static PS_BAD_ID: Step<(), ()> = Step::new("bad_id");

fn ps_program() -> Program {
    Program::new("candle-ps")
        .optimizer(Optimizer::adam(0.01))
        // The embedding table by Adagrad, as wide-and-deep models train their sparse part.
        .optimizer_for("embedding", Optimizer::adagrad(0.05))
        .step(&PS_TRAIN, |ctx: &mut StepContext<'_>, step: u64| {
            let (images, ids, labels) = global_batch(step % PS_BATCHES);
            // The embedding read by rows: only the batch's distinct ids are pulled and pushed.
            let table = RowRead {
                variable: "embedding.weight",
                ids: &ids,
            };
            let (model, renumbered) = ServerModel::build_reading_rows(ctx, Net::new, &[table])?;
            let report = model.train_step(
                ctx,
                &[images, renumbered[0].clone(), labels],
                SEED,
                |net, batch| net.per_example_loss(&batch[0], &batch[1], &batch[2]),
            )?;
            assert_eq!(report.replicas, 2, "the worker's 2 local replicas");
            let mut distinct = ids.flatten_all()?.to_vec1::<u32>()?;
            distinct.sort_unstable();
            distinct.dedup();
            let pushed = report
                .pushes
                .iter()
                .find(|p| p.variable == "embedding.weight")
                .expect("the table got a gradient");
            assert_eq!(
                (pushed.access, pushed.rows, pushed.values),
                (WeightAccess::Rows, distinct.len(), distinct.len() * WIDTH),
                "the table is pushed by its batch's rows"
            );
            Ok::<_, StepError>(report.loss)
        })
        .step(&PS_WRONG_MODEL, |ctx: &mut StepContext<'_>, ()| {
            ServerModel::build(ctx, |vb| {
                candle_nn::linear(WIDTH + 1, CLASSES, vb.pp("head"))
            })?;
            Ok::<_, StepError>(())
        })
        .step(&PS_BAD_ID, |ctx: &mut StepContext<'_>, ()| {
            let ids = Tensor::new(&[1u32, VOCAB as u32], &Device::Cpu)?;
            let table = RowRead {
                variable: "embedding.weight",
                ids: &ids,
            };
            ServerModel::build_reading_rows(ctx, Net::new, &[table])?;
            Ok::<_, StepError>(())
        })
        .chief(ps_chief)
}

fn ps_chief(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    let mut report = serde_json::json!({});
    let refused = ServerModel::create_variables(
        coordinator,
        SEED,
        |vb| candle_nn::batch_norm(4, 1e-5, vb.pp("bn")),
        |_, _| None,
    );
    report["batch_norm"] = serde_json::json!(refused.err().map(|e| e.to_string()));
    // The embedding table split over both servers by rows.
    let names = ServerModel::create_variables(coordinator, SEED, Net::new, |name, _| {
        name.starts_with("embedding")
            .then_some(Partitioner::FixedShards { num_shards: 2 })
    })?;
    report["variables"] = serde_json::json!(names);
    coordinator.wait_for_workers(2, std::time::Duration::from_secs(30))?;
    let values = (0..PS_STEPS)
        .map(|step| coordinator.schedule(&PS_TRAIN, step))
        .collect::<Result<Vec<_>, _>>()?;
    let losses = values
        .iter()
        .map(|v| coordinator.fetch(v))
        .collect::<Result<Vec<f32>, _>>()?;
    coordinator.join()?;
    report["losses"] = serde_json::json!(losses);
    report["checkpoint_tensors"] = serde_json::json!(checkpoint_tensors(coordinator)?);
    let wrong = coordinator.schedule(&PS_WRONG_MODEL, ())?;
    report["wrong_model"] =
        serde_json::json!(coordinator.fetch(&wrong).err().map(|e| e.to_string()));
    let _ = coordinator.join();
    let bad_id = coordinator.schedule(&PS_BAD_ID, ())?;
    report["bad_id"] = serde_json::json!(coordinator.fetch(&bad_id).err().map(|e| e.to_string()));
    let _ = coordinator.join();
    report["ledger"] = ps_support::ledger_and_stats(coordinator)?["ledger"].clone();
    ps_support::write_report(&report)
}

/// The names of the tensors (variables and optimizer slots) of a checkpoint the chief saves
/// now.
fn checkpoint_tensors(coordinator: &ClusterCoordinator) -> Result<Vec<String>, CoordinatorError> {
    let dir = ps_support::child_dir().join("ckpt");
    let mut manager = CheckpointManager::new(dir, CheckpointPolicy::default(), Instant::now())
        .map_err(CoordinatorError::other)?;
    let saved = coordinator.save_checkpoint(&mut manager, PS_STEPS)?;
    let loaded = read_checkpoint(&saved).map_err(CoordinatorError::other)?;
    let mut names: Vec<String> = loaded
        .checkpoint
        .shards
        .iter()
        .flat_map(|shard| shard.tensors.keys().cloned())
        .collect();
    names.sort();
    Ok(names)
}

#[test]
fn a_candle_nn_model_converges_under_parameter_server_strategy() {
    let run = ps_support::Run::new("candle-ps", "", &[("COHORT_REPLICAS", "2")]);
    let report = run.launch();
    let names: Vec<String> = serde_json::from_value(report["variables"].clone()).unwrap();
    let (_, default_vars) = train(&DefaultStrategy::new());
    assert_eq!(
        names,
        default_vars
            .iter()
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>(),
        "the same variables as under the local strategies"
    );
    let losses: Vec<f32> = serde_json::from_value(report["losses"].clone()).unwrap();
    let mean = |part: &[f32]| part.iter().sum::<f32>() / part.len() as f32;
    let (first, last) = (mean(&losses[..8]), mean(&losses[losses.len() - 8..]));
    assert!(
        last < 0.5 * first,
        "the loss fell from {first} to {last} only: {losses:?}"
    );
    assert_eq!(report["ledger"]["committed"], PS_STEPS, "{report}");
    // Each variable carries the slots of its optimizer: the table's shards Adagrad's (its
    // scope's), the rest Adam's (the program's).
    let tensors: Vec<String> = serde_json::from_value(report["checkpoint_tensors"].clone())
        .unwrap_or_else(|_| panic!("{report}"));
    for shard in ["embedding.weight/part_0", "embedding.weight/part_1"] {
        assert!(
            tensors.contains(&slot_tensor_name(shard, "accumulator")),
            "{tensors:?}"
        );
        assert!(
            !tensors.contains(&slot_tensor_name(shard, "m")),
            "{tensors:?}"
        );
    }
    for slot in ["m", "v"] {
        assert!(
            tensors.contains(&slot_tensor_name("head.weight", slot)),
            "{tensors:?}"
        );
    }
    assert!(
        !tensors.contains(&slot_tensor_name("head.weight", "accumulator")),
        "{tensors:?}"
    );

    let bn = report["batch_norm"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        bn.contains("bn.running_mean") && bn.contains("statistics"),
        "{bn}"
    );
    let wrong = report["wrong_model"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        wrong.contains("head.weight") && wrong.contains("[3, 9]"),
        "{wrong}"
    );
    let bad_id = report["bad_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        bad_id.contains("embedding.weight") && bad_id.contains(&format!("row {VOCAB}")),
        "{bad_id}"
    );
}

#[test]
fn a_model_built_differently_on_two_workers_is_refused_on_both_naming_the_variable() {
    // Worker 1's head is wider: both say which variable, before any step.
    let errors = mwms_support::in_process_pair("candle-reshaped", |i, config| {
        let strategy = MultiWorkerMirrored::new(config).unwrap();
        ReplicatedModel::build(&strategy, SEED, |vb| {
            let hidden = candle_nn::linear(4, 8, vb.pp("hidden"))?;
            let head = candle_nn::linear(8, 2 + i, vb.pp("head"))?;
            Ok((hidden, head))
        })
        .err()
        .map(|e| e.to_string())
    });
    for (worker, error) in errors.iter().enumerate() {
        let error = error
            .as_deref()
            .unwrap_or_else(|| panic!("worker {worker} built a model that differs"));
        assert!(
            error.contains("head.weight") && error.contains("another shape"),
            "worker {worker}: {error}"
        );
    }
    // Worker 1's model has one layer more: worker 0 hears its model ends early, worker 1
    // names the extra variable.
    let errors = mwms_support::in_process_pair("candle-extra", |i, config| {
        let strategy = MultiWorkerMirrored::new(config).unwrap();
        ReplicatedModel::build(&strategy, SEED, |vb| {
            let hidden = candle_nn::linear(4, 8, vb.pp("hidden"))?;
            let extra = (i == 1)
                .then(|| candle_nn::linear_no_bias(8, 8, vb.pp("extra")))
                .transpose()?;
            Ok((hidden, extra))
        })
        .err()
        .map(|e| e.to_string())
    });
    let (first, second) = (
        errors[0].as_deref().expect("worker 0 refused"),
        errors[1].as_deref().expect("worker 1 refused"),
    );
    assert!(first.contains("creates more variables"), "{first}");
    assert!(
        second.contains("extra.weight") && second.contains("ends before it"),
        "{second}"
    );
}
