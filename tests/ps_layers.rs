//! One model definition, two ways to train it: in process under `Mirrored` (with `fit`), and
//! on a parameter-server cluster of real processes (1 chief, 2 PS, 2 workers over QUIC on
//! 127.0.0.1) through the worker's bridge `PsModel`. Both converge, from the same builder
//! functions ([`classifier`], [`click_model`]).
//!
//! The click model's embedding table is split over both parameter servers; a step pulls only
//! its batch's rows and pushes row gradients: the steps report how many rows they pushed, and
//! the rows no batch uses (the odd ids, on both shards) keep their initial values bit for bit.

mod ps_support;

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use cohort::data::{Dataset, DistributeOptions};
use cohort::nn::{
    declare, losses, Activation, Dense, Embedding, GradientTape, Initializer, Layer, NnError,
    Sequential, WeightAccess,
};
use cohort::optim::Optimizer;
use cohort::program::{CoordinatorError, Program, StepContext, StepError};
use cohort::roles::worker::PsModel;
use cohort::strategy::{Mirrored, Strategy};
use cohort::train::{
    fit_with_options, DistributedOptimizer, FitOptions, Progbar, ProgbarMode, Supervised,
};
use cohort::variable::Partitioner;
use ps_support::{ledger_and_stats, write_report, Run};

/// Points in the separable problem.
const POINTS: usize = 64;
/// Rows of the click model's table; the data uses the even ids only.
const TABLE_ROWS: usize = 100;
const WIDTH: usize = 4;
/// Examples in the click data set.
const CLICKS: usize = 200;
const BATCH: usize = 16;
/// Steps the chief schedules per model.
const STEPS: usize = 120;

type Model = Supervised<Sequential>;

/// The classifier, written once: 2 → 8 (ReLU) → 1 logit.
fn classifier() -> Result<Model, NnError> {
    let net = Sequential::new("clf")
        .push(
            Dense::builder("clf/hidden", 2, 8)
                .activation(Activation::Relu)
                .kernel_initializer(Initializer::GlorotUniform { seed: 1 })
                .build()?,
        )
        .push(
            Dense::builder("clf/out", 8, 1)
                .kernel_initializer(Initializer::GlorotUniform { seed: 2 })
                .build()?,
        );
    Ok(Supervised::new(
        net,
        losses::binary_cross_entropy_from_logits,
    ))
}

/// The click model, written once: an id's embedding row, then a 1-logit head.
fn click_model() -> Result<Model, NnError> {
    let net = Sequential::new("ctr")
        .push(Embedding::new(
            "ctr/emb",
            TABLE_ROWS,
            WIDTH,
            Initializer::RandomUniform {
                min: -0.05,
                max: 0.05,
                seed: 7,
            },
        )?)
        .push(
            Dense::builder("ctr/head", WIDTH, 1)
                .kernel_initializer(Initializer::GlorotUniform { seed: 3 })
                .build()?,
        );
    Ok(Supervised::new(
        net,
        losses::binary_cross_entropy_from_logits,
    ))
}

/// The optimizer both runs use (in process, and on the parameter servers).
fn optimizer() -> Optimizer {
    Optimizer::adam(0.05)
}

/// Points in the square labelled by the sign of x0 + x1: `([n, 2] f32, [n, 1] f32)`.
fn points() -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(POINTS * 2);
    let mut y = Vec::with_capacity(POINTS);
    for i in 0..POINTS {
        let a = ((i * 17) % 19) as f32 / 9.5 - 1.0 + 0.01;
        let b = ((i * 7) % 13) as f32 / 6.5 - 1.0;
        x.extend([a, b]);
        y.push(if a + b > 0.0 { 1f32 } else { 0.0 });
    }
    let cpu = &Device::Cpu;
    (
        Tensor::from_vec(x, (POINTS, 2), cpu).unwrap(),
        Tensor::from_vec(y, (POINTS, 1), cpu).unwrap(),
    )
}

/// Clicks on even ids only, planted by id (multiples of 4 click): `([n] i64, [n, 1] f32)`.
fn clicks() -> (Tensor, Tensor) {
    let ids: Vec<i64> = (0..CLICKS)
        .map(|i| (2 * ((i * 7) % (TABLE_ROWS / 2))) as i64)
        .collect();
    let y: Vec<f32> = ids
        .iter()
        .map(|id| if id % 4 == 0 { 1.0 } else { 0.0 })
        .collect();
    let cpu = &Device::Cpu;
    (
        Tensor::from_vec(ids, CLICKS, cpu).unwrap(),
        Tensor::from_vec(y, (CLICKS, 1), cpu).unwrap(),
    )
}

fn dataset((x, y): (Tensor, Tensor)) -> Result<Dataset, cohort::data::DataError> {
    Ok(Dataset::from_tensor_slices(vec![x, y])?.batch(BATCH, false))
}

/// Mean loss and accuracy of `model` on `(x, y)`, reading variables through `tape`.
fn evaluate(
    model: &Model,
    tape: &GradientTape,
    (x, y): &(Tensor, Tensor),
) -> Result<(f32, f32), NnError> {
    let logits = model.network().forward(tape, x)?;
    let loss = losses::binary_cross_entropy_from_logits(&logits, y)?
        .mean_all()?
        .to_scalar::<f32>()?;
    let predicted = logits.ge(0f64)?.to_dtype(DType::F32)?;
    let right = predicted
        .eq(y)?
        .to_dtype(DType::F32)?
        .mean_all()?
        .to_scalar::<f32>()?;
    Ok((loss, right))
}

// ---------------------------------------------------------------------------------------
// In process, under Mirrored.

fn train_in_process(
    build: fn() -> Result<Model, NnError>,
    data: (Tensor, Tensor),
    epochs: usize,
) -> Result<(f32, f32, Arc<Model>)> {
    let strategy = Mirrored::new(2)?;
    let model = {
        let _scope = strategy.scope();
        Arc::new(build()?)
    };
    let optimizer = Arc::new(DistributedOptimizer::new(optimizer()));
    let options = FitOptions {
        progress: Progbar::stderr(ProgbarMode::Silent),
        distribute: DistributeOptions::default(),
    };
    let history = fit_with_options(
        &strategy,
        Arc::clone(&model),
        optimizer,
        dataset(data.clone())?,
        epochs,
        options,
    )?;
    assert!(
        history.loss.last() < history.loss.first(),
        "{:?}",
        history.loss
    );
    let (loss, accuracy) = evaluate(&model, &GradientTape::new(), &data)?;
    Ok((loss, accuracy, model))
}

#[test]
fn the_models_converge_in_process_under_mirrored() -> Result<()> {
    let (loss, accuracy, _) = train_in_process(classifier, points(), 30)?;
    assert!(
        accuracy >= 0.95 && loss < 0.3,
        "classifier: loss {loss}, accuracy {accuracy}"
    );

    let initial = click_model()?.network().trainable_variables()[0].read_value();
    let (loss, accuracy, model) = train_in_process(click_model, clicks(), 10)?;
    assert!(
        accuracy == 1.0 && loss < 0.2,
        "click model: loss {loss}, accuracy {accuracy}"
    );
    // Rows no batch used (odd ids) are untouched (their gradient is zero); used ones moved.
    let table = model.network().trainable_variables()[0].read_value();
    let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
    for (id, (end, start)) in rows(&table).iter().zip(rows(&initial)).enumerate() {
        assert_eq!(id % 2 == 1, *end == start, "row {id}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// On a parameter-server cluster: the same builders, through `PsModel`.

/// Child mode: run this process's role of the test program.
#[test]
fn the_click_model_reads_its_head_whole_and_its_table_by_rows() -> Result<()> {
    use cohort::train::Model as _;
    let mut whole = click_model()?.whole_read_variables().unwrap_or_default();
    whole.sort();
    assert_eq!(whole, vec!["ctr/head/bias", "ctr/head/kernel"]);
    Ok(())
}

#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// A step of `build` on its dataset: returns the loss (f32) and the rows pushed to the table
/// of a row-read variable, or the dense rows (u32 each).
fn train_step(
    ctx: &mut StepContext<'_>,
    build: fn() -> Result<Model, NnError>,
    data: &str,
) -> Result<Vec<u8>, StepError> {
    let model = PsModel::build(ctx, build)?;
    let batch = ctx.next(data)?;
    let report = model.train_step(ctx, &batch)?;
    let table_rows = report
        .pushes
        .iter()
        .find(|p| p.access == WeightAccess::Rows)
        .map_or(0, |p| p.rows as u32);
    let mut out = report.loss.to_le_bytes().to_vec();
    out.extend(table_rows.to_le_bytes());
    out.extend((report.examples as u32).to_le_bytes());
    out.extend((report.replicas as u32).to_le_bytes());
    Ok(out)
}

/// Loss and accuracy of `build` on all of `data`, reading the servers' values.
fn eval_step(
    ctx: &mut StepContext<'_>,
    build: fn() -> Result<Model, NnError>,
    data: (Tensor, Tensor),
) -> Result<Vec<u8>, StepError> {
    let model = PsModel::build(ctx, build)?;
    let (loss, accuracy) = model.run(ctx, |tape, m| evaluate(m, tape, &data))?;
    Ok([loss.to_le_bytes(), accuracy.to_le_bytes()].concat())
}

fn program() -> Program {
    Program::new("ps-layers")
        .optimizer(optimizer())
        .dataset("points", |_ctx| Ok(dataset(points())?.repeat(None)))
        .dataset("clicks", |_ctx| {
            Ok(dataset(clicks())?.shuffle(CLICKS, 5).repeat(None))
        })
        .step_encoded("clf", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            train_step(ctx, classifier, "points")
        })
        .step_encoded("ctr", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            train_step(ctx, click_model, "clicks")
        })
        .step_encoded("eval_clf", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            eval_step(ctx, classifier, points())
        })
        .step_encoded("eval_ctr", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            eval_step(ctx, click_model, clicks())
        })
        .chief(|coordinator| {
            let other = |e: &dyn std::fmt::Display| CoordinatorError::Other(e.to_string());
            // The chief lists both models' variables without drawing them, and creates them on
            // the servers; the table is split over both.
            for build in [classifier as fn() -> Result<Model, NnError>, click_model] {
                let specs = declare(build)
                    .map_err(|e| other(&e))?
                    .network()
                    .weight_specs();
                PsModel::create_variables(coordinator, &specs, |spec| {
                    (spec.access == WeightAccess::Rows)
                        .then_some(Partitioner::FixedShards { num_shards: 2 })
                })?;
            }
            let table_at_start = coordinator.read_variable("ctr/emb/embeddings")?;
            coordinator.create_per_worker_dataset("points")?;
            coordinator.create_per_worker_dataset("clicks")?;
            coordinator.wait_for_workers(
                coordinator.num_workers() as usize,
                std::time::Duration::from_secs(30),
            )?;

            let mut report = serde_json::json!({});
            for (model, eval) in [("clf", "eval_clf"), ("ctr", "eval_ctr")] {
                let values: Vec<_> = (0..STEPS)
                    .map(|_| coordinator.schedule_encoded(model, Vec::new()))
                    .collect::<Result<_, _>>()?;
                coordinator.join()?;
                let mut steps = Vec::new();
                for v in &values {
                    let bytes = coordinator.fetch_encoded(v)?;
                    let word = |i: usize| {
                        [
                            bytes[4 * i],
                            bytes[4 * i + 1],
                            bytes[4 * i + 2],
                            bytes[4 * i + 3],
                        ]
                    };
                    steps.push(serde_json::json!({
                        "loss": f32::from_le_bytes(word(0)),
                        "table_rows": u32::from_le_bytes(word(1)),
                        "examples": u32::from_le_bytes(word(2)),
                        "replicas": u32::from_le_bytes(word(3)),
                    }));
                }
                let result = coordinator.schedule_encoded(eval, Vec::new())?;
                coordinator.join()?;
                let bytes = coordinator.fetch_encoded(&result)?;
                let loss = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                let accuracy = f32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                report[model] =
                    serde_json::json!({ "steps": steps, "loss": loss, "accuracy": accuracy });
            }
            report["table_at_start"] = serde_json::json!(table_at_start);
            report["table_at_end"] =
                serde_json::json!(coordinator.read_variable("ctr/emb/embeddings")?);
            report["layouts"] =
                serde_json::to_value(coordinator.layouts()).map_err(|e| other(&e))?;
            let counters = ledger_and_stats(coordinator)?;
            report["ledger"] = counters["ledger"].clone();
            report["ps"] = counters["ps"].clone();
            write_report(&report)
        })
}

#[test]
fn the_same_models_converge_on_a_parameter_server_cluster_with_row_sparse_table_pushes() {
    let report = Run::new("ps-layers", "train", &[]).launch();
    assert_converged_whole(&report, 1);
}

/// Each worker runs every step on 2 local replicas (`replicas`): the batch is split, their
/// gradients summed in the worker, one push (PS-1 unchanged); training converges as with 1.
#[test]
fn the_same_models_converge_with_two_replicas_in_each_worker() {
    let report = Run::new("ps-layers-2r", "train", &[("COHORT_REPLICAS", "2")]).launch();
    assert_converged_whole(&report, 2);
}

/// With one worker the servers apply the steps in order, so a run is deterministic: 2
/// replicas per worker compute what 1 computes, step by step (to float rounding: the
/// replicas' partial sums are added in another order).
#[test]
fn two_replicas_in_a_worker_compute_what_one_computes() {
    let mut one = Run::new("ps-layers-1w1r", "train", &[]);
    one.num_workers = 1;
    let mut two = Run::new("ps-layers-1w2r", "train", &[("COHORT_REPLICAS", "2")]);
    two.num_workers = 1;
    let (one, two) = (one.launch(), two.launch());
    for model in ["clf", "ctr"] {
        let steps = |r: &serde_json::Value| -> Vec<(f64, u64)> {
            r[model]["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s["loss"].as_f64().unwrap(), s["replicas"].as_u64().unwrap()))
                .collect()
        };
        let (a, b) = (steps(&one), steps(&two));
        assert_eq!(a.len(), b.len());
        for (step, ((la, ra), (lb, rb))) in a.iter().zip(&b).enumerate() {
            assert_eq!((*ra, *rb), (1, 2), "{model} step {step}");
            assert!(
                (la - lb).abs() <= 1e-4 * la.abs().max(1.0),
                "{model} step {step}: loss {la} with 1 replica, {lb} with 2"
            );
        }
    }
    let table = |r: &serde_json::Value| -> Vec<f32> {
        serde_json::from_value(r["table_at_end"].clone()).unwrap()
    };
    for (i, (a, b)) in table(&one).iter().zip(table(&two)).enumerate() {
        assert!((a - b).abs() <= 1e-4, "table value {i}: {a} vs {b}");
    }
}

/// Both models converged on the cluster, with row-sparse table pushes, every closure committed
/// and applied once, each step run on `replicas` local replicas.
fn assert_converged_whole(report: &serde_json::Value, replicas: u64) {
    for model in ["clf", "ctr"] {
        for step in report[model]["steps"].as_array().unwrap() {
            assert_eq!(step["replicas"], replicas, "{model}: {step}");
        }
    }

    let clf = &report["clf"];
    let (loss, accuracy) = (
        clf["loss"].as_f64().unwrap(),
        clf["accuracy"].as_f64().unwrap(),
    );
    assert!(
        accuracy >= 0.95 && loss < 0.3,
        "classifier on the cluster: loss {loss}, accuracy {accuracy}"
    );
    let first_loss = clf["steps"][0]["loss"].as_f64().unwrap();
    assert!(loss < first_loss, "loss {first_loss} -> {loss}");

    let ctr = &report["ctr"];
    let (loss, accuracy) = (
        ctr["loss"].as_f64().unwrap(),
        ctr["accuracy"].as_f64().unwrap(),
    );
    assert!(
        accuracy == 1.0 && loss < 0.2,
        "click model on the cluster: loss {loss}, accuracy {accuracy}"
    );

    // Row-sparse pushes: each step pushed at most its batch's distinct ids, never the table.
    for step in ctr["steps"].as_array().unwrap() {
        let rows = step["table_rows"].as_u64().unwrap();
        let examples = step["examples"].as_u64().unwrap();
        assert!(
            rows >= 1 && rows <= examples && rows < TABLE_ROWS as u64,
            "{step}"
        );
    }
    // The dense model pushes no rows.
    assert!(clf["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["table_rows"] == 0));
    // Rows no batch used (odd ids, on both shards) keep their initial values bit for bit;
    // used ones moved.
    let start: Vec<f32> = serde_json::from_value(report["table_at_start"].clone()).unwrap();
    let end: Vec<f32> = serde_json::from_value(report["table_at_end"].clone()).unwrap();
    assert_eq!(start.len(), TABLE_ROWS * WIDTH);
    for (id, (start, end)) in start.chunks(WIDTH).zip(end.chunks(WIDTH)).enumerate() {
        assert_eq!(id % 2 == 1, start == end, "row {id}: {start:?} -> {end:?}");
    }
    // The table really is split over both servers (so row pushes were routed to each).
    let layouts = report["layouts"].as_array().unwrap();
    let table = layouts
        .iter()
        .find(|l| l["name"] == "ctr/emb/embeddings")
        .unwrap();
    assert_eq!(table["shards"].as_array().unwrap().len(), 2);

    // Every closure committed exactly once (LEDGER-1); each PS applied each training closure's
    // single push exactly once (PS-1): every training step touches both servers (the
    // classifier's four variables go round-robin, the click head too), evaluations push
    // nothing.
    let ledger = &report["ledger"];
    let scheduled = (2 * STEPS + 2) as u64;
    assert_eq!(ledger["scheduled"], scheduled, "{ledger}");
    assert_eq!(ledger["committed"], scheduled, "{ledger}");
    assert_eq!(ledger["balances"], true);
    let applied = ps_support::ps_counter(report, "applied");
    assert_eq!(applied, [2 * STEPS as u64; 2], "applied per PS");
}
