//! Variables created inside `run`, through the public API: a layer that creates its variables
//! on its first call (as a Keras layer builds itself) gets them by the policy of the strategy
//! running it, as in TensorFlow, instead of being refused.
//!
//! - A variable made inside a replica function is one variable for the process's replicas:
//!   plain under the default strategy and `OneDevice`, mirrored under `Mirrored`, one host copy
//!   under `CentralStorage`; updates from the replicas follow its aggregation.
//! - Under MultiWorkerMirrored every worker checks that the others create the same variable
//!   (a name or shape that differs fails on every worker, naming it) and starts it from the
//!   first worker's value.
//! - A candle-nn model whose layers are built on their first call trains to the same losses
//!   and variables (1e-5) under the default strategy, `Mirrored(2)`, `CentralStorage(2)` and
//!   MultiWorkerMirrored (2 processes × 2 replicas, QUIC), and under `keras::Model::fit`,
//!   which builds it on its first batch.

mod mwms_support;

use std::sync::{Arc, Mutex, OnceLock};

use cohort::candle::{Device, Module, ModuleT, Tensor, D};
use cohort::candle_nn::{self, Linear, VarBuilder};
use cohort::data::Dataset;
use cohort::keras::{Fit, Loss, Model, ModelStrategy};
use cohort::optim::Optimizer;
use cohort::strategy::{
    CentralStorage, DefaultStrategy, Mirrored, MultiWorkerMirrored, OneDevice, PerReplica,
    ReduceOp, Strategy, StrategyExt,
};
use cohort::train::{DistributedOptimizer, ReplicatedModel, StepOutput, StepSpec};
use cohort::variable::{Placement, Variable, VariableAggregation, VariableError};

const SEED: u64 = 5;
const FEATURES: usize = 6;
const CLASSES: usize = 3;
const GLOBAL_BATCH: usize = 8;
const STEPS: u64 = 6;

/// A dense layer that creates its variables on its first call, sized by its input (Keras'
/// `Dense(units)` given no input shape).
struct LazyDense {
    units: usize,
    vb: VarBuilder<'static>,
    layer: OnceLock<Linear>,
}

impl LazyDense {
    fn new(units: usize, vb: VarBuilder<'static>) -> Self {
        Self {
            units,
            vb,
            layer: OnceLock::new(),
        }
    }

    fn forward(&self, x: &Tensor) -> cohort::candle::Result<Tensor> {
        if self.layer.get().is_none() {
            let built = candle_nn::linear(x.dim(D::Minus1)?, self.units, self.vb.clone())?;
            let _ = self.layer.set(built);
        }
        self.layer.get().expect("built above").forward(x)
    }
}

/// Two lazy dense layers: nothing exists until the first batch goes through.
struct LazyNet {
    hidden: LazyDense,
    out: LazyDense,
}

impl LazyNet {
    fn new(vb: VarBuilder<'static>) -> cohort::candle::Result<Self> {
        Ok(Self {
            hidden: LazyDense::new(16, vb.pp("hidden")),
            out: LazyDense::new(CLASSES, vb.pp("out")),
        })
    }
}

impl ModuleT for LazyNet {
    fn forward_t(&self, x: &Tensor, _train: bool) -> cohort::candle::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.relu()?)
    }
}

/// Features and labels of `rows` examples from `step` (the label is the largest of the first
/// three features, so there is something to learn).
fn examples(rows: usize, step: u64) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..rows * FEATURES)
        .map(|i| ((i as u64 * 7 + step * 11) % 13) as f32 / 13.0 - 0.5)
        .collect();
    let y: Vec<u32> = x
        .chunks(FEATURES)
        .map(|row| {
            (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0) as u32
        })
        .collect();
    (
        Tensor::from_vec(x, (rows, FEATURES), &Device::Cpu).unwrap(),
        Tensor::from_vec(y, rows, &Device::Cpu).unwrap(),
    )
}

/// Each step's global loss, and every variable's final value by name.
type Trained = (Vec<f32>, Vec<(String, Vec<f32>)>);

/// Trains the lazy network `STEPS` steps under `strategy` (each global batch split evenly over
/// its replicas), checking that nothing exists before the first step and that every variable
/// then has one copy per local replica under a mirrored strategy, all equal.
fn train(strategy: &dyn Strategy) -> Trained {
    let model = Arc::new(ReplicatedModel::build(strategy, SEED, LazyNet::new).unwrap());
    assert!(
        model.variables().is_empty(),
        "created before the first call"
    );
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::adam(0.02)));
    let replicas = strategy.num_replicas_in_sync();
    let rows = GLOBAL_BATCH / replicas;
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = examples(GLOBAL_BATCH, step);
        let inputs = strategy.experimental_distribute_values_from_function(move |ctx| {
            let first = ctx.replica_id_in_sync_group * rows;
            (
                x.narrow(0, first, rows).unwrap(),
                y.narrow(0, first, rows).unwrap(),
            )
        });
        let (m, o) = (Arc::clone(&model), Arc::clone(&optimizer));
        let outputs: PerReplica<StepOutput> = strategy
            .run(
                move |ctx, (x, y): (Tensor, Tensor)| {
                    m.train_step(ctx, &o, StepSpec::new(step), |net| {
                        let logits = net.forward_t(&x, true)?;
                        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
                        log_probs.gather(&y.unsqueeze(1)?, 1)?.squeeze(1)?.neg()
                    })
                },
                inputs,
            )
            .unwrap()
            .transpose()
            .unwrap();
        let loss = strategy
            .reduce(ReduceOp::Sum, &outputs.map(|o| o.loss.clone()), None)
            .unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
    }
    let local = strategy.local_replicas().len();
    let variables = model.variables().variables();
    assert_eq!(
        variables.iter().map(|v| v.name()).collect::<Vec<_>>(),
        ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    );
    let values = variables
        .iter()
        .map(|v| {
            let copies = v.components();
            if v.is_mirrored() {
                assert_eq!(copies.len(), local, "{} has a copy per replica", v.name());
            }
            let first = copies[0].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for copy in &copies[1..] {
                assert_eq!(
                    copy.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    first,
                    "the replicas' copies of {} differ",
                    v.name()
                );
            }
            (v.name().to_owned(), first)
        })
        .collect();
    (losses, values)
}

/// `other`'s losses and variables are `reference`'s, step by step and variable by variable
/// (to 1e-5).
fn assert_same_run(reference: &Trained, other: &Trained, what: &str) {
    assert_eq!(reference.0.len(), other.0.len());
    for (step, (a, b)) in reference.0.iter().zip(&other.0).enumerate() {
        assert!((a - b).abs() < 1e-5, "step {step}: default {a}, {what} {b}");
    }
    assert_eq!(reference.1.len(), other.1.len());
    for ((name, a), (other_name, b)) in reference.1.iter().zip(&other.1) {
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
fn a_model_built_on_its_first_call_trains_the_same_under_every_local_strategy() {
    let reference = train(&DefaultStrategy::new());
    assert!(
        reference.0.last() < reference.0.first(),
        "the model does not learn: {:?}",
        reference.0
    );
    assert_same_run(&reference, &train(&Mirrored::new(2).unwrap()), "mirrored");
    assert_same_run(
        &reference,
        &train(&CentralStorage::new(2).unwrap()),
        "central storage",
    );
    assert_same_run(
        &reference,
        &train(&OneDevice::new("cpu:0").unwrap()),
        "one device",
    );
}

/// A worker process of the MultiWorkerMirrored test: 2 local replicas of 4.
#[test]
fn lazy_mwms_worker_process() {
    mwms_support::run_if_worker_process(|config| {
        let strategy = MultiWorkerMirrored::new(config.with_local_replicas(2)).unwrap();
        train(&strategy)
    });
}

#[test]
fn a_model_built_on_its_first_call_trains_the_same_under_multi_worker_mirrored() {
    let reference = train(&DefaultStrategy::new());
    let workers: Vec<Trained> =
        mwms_support::process_pair("lazy-model", "lazy_mwms_worker_process");
    for (worker, trained) in workers.iter().enumerate() {
        assert_same_run(&reference, trained, &format!("worker {worker}"));
    }
}

/// Creates `make()` once, on the first replica to ask: what a lazily built layer does.
fn once(slot: &Mutex<Option<Variable>>, make: impl FnOnce() -> Variable) -> Variable {
    slot.lock().unwrap().get_or_insert_with(make).clone()
}

fn t(values: &[f32]) -> Tensor {
    Tensor::new(values, &Device::Cpu).unwrap()
}

#[test]
fn a_variable_created_inside_run_follows_the_strategys_placement() {
    // Per strategy: what the placement is, and the value after every replica added 1 from
    // its replica function (summed over the replicas).
    let cases: Vec<(Box<dyn Strategy>, &str, f32)> = vec![
        (Box::new(DefaultStrategy::new()), "local", 1.0),
        (Box::new(OneDevice::new("cpu:0").unwrap()), "local", 1.0),
        (Box::new(Mirrored::new(2).unwrap()), "mirrored", 2.0),
        (Box::new(CentralStorage::new(2).unwrap()), "central", 2.0),
    ];
    for (strategy, kind, after) in cases {
        let slot = Arc::new(Mutex::new(None));
        let shared = Arc::clone(&slot);
        let ids = strategy
            .run(
                move |_ctx, ()| -> Result<u64, VariableError> {
                    let w = once(&shared, || {
                        Variable::builder("w", t(&[0.0, 0.0]))
                            .aggregation(VariableAggregation::Sum)
                            .build()
                            .unwrap()
                    });
                    w.assign_add(&t(&[1.0, 1.0]))?;
                    Ok(w.id().0)
                },
                (),
            )
            .unwrap()
            .into_values()
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert!(
            ids.iter().all(|id| *id == ids[0]),
            "{}: the replicas got different variables",
            strategy.name()
        );
        let w = slot.lock().unwrap().clone().unwrap();
        let placed = match w.placement() {
            Placement::Local { .. } => "local",
            Placement::Mirrored { .. } => "mirrored",
            Placement::Central { .. } => "central",
            other => panic!("{other:?}"),
        };
        assert_eq!(placed, kind, "{}", strategy.name());
        for copy in w.components() {
            assert_eq!(copy.to_vec1::<f32>().unwrap(), [after, after]);
        }
    }
}

#[test]
fn a_replica_function_not_started_by_run_cannot_create_variables() {
    let strategy = Mirrored::new(2).unwrap();
    let outs = strategy
        .run_replicas(Arc::new(|_ctx| {
            Box::new(Variable::new("w", t(&[0.0])).err().map(|e| e.to_string()))
        }))
        .unwrap();
    for out in outs {
        let error = out.downcast::<Option<String>>().unwrap().unwrap();
        assert!(
            error.contains("\"w\"") && error.contains("placement"),
            "{error}"
        );
    }
}

#[test]
fn a_variable_created_inside_run_starts_as_the_first_workers_on_every_worker() {
    // Each worker draws another initial value: both end with worker 0's.
    let values = mwms_support::in_process_pair("lazy-broadcast", |worker, config| {
        let strategy = MultiWorkerMirrored::new(config).unwrap();
        let slot = Arc::new(Mutex::new(None));
        let shared = Arc::clone(&slot);
        strategy
            .run(
                move |_ctx, ()| {
                    once(&shared, || {
                        Variable::new("w", t(&[worker as f32 + 1.0; 3])).unwrap()
                    });
                },
                (),
            )
            .unwrap();
        let w = slot.lock().unwrap().clone().unwrap();
        assert!(w.is_mirrored());
        w.read_value().to_vec1::<f32>().unwrap()
    });
    assert_eq!(values, [[1.0; 3], [1.0; 3]]);
}

#[test]
fn a_variable_created_differently_inside_run_is_refused_on_every_worker() {
    // Worker 1's `w` is wider: both say so, naming it, instead of training apart.
    let errors = mwms_support::in_process_pair("lazy-differs", |worker, config| {
        let strategy = MultiWorkerMirrored::new(config).unwrap();
        strategy
            .run(
                move |_ctx, ()| {
                    Variable::new("w", t(&vec![0.0; 2 + worker]))
                        .err()
                        .map(|e| e.to_string())
                },
                (),
            )
            .map(|out| out.into_values().remove(0))
            .unwrap_or_else(|e| Some(e.to_string()))
    });
    for (worker, error) in errors.iter().enumerate() {
        let error = error
            .as_deref()
            .unwrap_or_else(|| panic!("worker {worker} created a variable that differs"));
        assert!(error.contains("\"w\""), "worker {worker}: {error}");
    }
}

#[test]
fn keras_fit_builds_a_lazy_model_on_its_first_batch() {
    let (x, y) = examples(96, 0);
    let data = Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .batch(GLOBAL_BATCH, true);
    let fit = |strategy: Box<dyn Fn() -> Model<LazyNet>>| {
        let mut model = strategy();
        assert!(model.variables().is_empty());
        model.compile(
            Optimizer::adam(0.02),
            Loss::sparse_categorical_crossentropy(),
            Vec::new(),
        );
        let history = model.fit(&data, Fit::epochs(2).verbose(false)).unwrap();
        let weights: Vec<Vec<f32>> = model
            .variables()
            .iter()
            .map(|v| v.read_value().flatten_all().unwrap().to_vec1().unwrap())
            .collect();
        (history.get("loss"), weights)
    };
    let (default_loss, default_weights) = fit(Box::new(|| {
        Model::new(DefaultStrategy::new(), SEED, LazyNet::new).unwrap()
    }));
    let (mirrored_loss, mirrored_weights) = fit(Box::new(|| {
        Model::new(Mirrored::new(2).unwrap(), SEED, LazyNet::new).unwrap()
    }));
    assert_eq!(default_weights.len(), 4);
    assert!(default_loss[1] < default_loss[0], "{default_loss:?}");
    for (a, b) in default_loss.iter().zip(&mirrored_loss) {
        assert!(
            (a - b).abs() < 1e-5,
            "{default_loss:?} vs {mirrored_loss:?}"
        );
    }
    for (a, b) in default_weights.iter().zip(&mirrored_weights) {
        let worst = a
            .iter()
            .zip(b)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "the weights differ by {worst}");
    }
}

/// The lazy network's weights after 2 epochs of `fit` under `strategy` (one global batch
/// order, plain SGD).
fn lazy_fit(strategy: ModelStrategy) -> Vec<Vec<f32>> {
    let (x, y) = examples(96, 0);
    let data = Dataset::from_tensor_slices(vec![x, y])
        .unwrap()
        .batch(GLOBAL_BATCH, true);
    let mut model = Model::new(strategy, SEED, LazyNet::new).unwrap();
    assert!(model.variables().is_empty());
    model.compile(
        Optimizer::sgd(0.1),
        Loss::sparse_categorical_crossentropy(),
        Vec::new(),
    );
    model.fit(&data, Fit::epochs(2).verbose(false)).unwrap();
    model
        .variables()
        .iter()
        .map(|v| {
            v.read_value()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// `fit` of the lazy network under MultiWorkerMirrored (two workers of one replica, in one
/// process): each builds it on its first batch, every worker's variables are checked against
/// the others' and start from the first worker's, and both end with the same weights as one
/// process training the same global batches.
#[test]
fn keras_fit_builds_a_lazy_model_on_every_worker() {
    let reference = lazy_fit(DefaultStrategy::new().into());
    let workers = mwms_support::in_process_pair("lazy-keras", |_, config| {
        lazy_fit(MultiWorkerMirrored::new(config).unwrap().into())
    });
    for (worker, weights) in workers.iter().enumerate() {
        assert_eq!(weights.len(), 4, "worker {worker}");
        for (a, b) in reference.iter().zip(weights) {
            let worst = a
                .iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-5,
                "worker {worker}: the weights differ by {worst}"
            );
        }
    }
}
