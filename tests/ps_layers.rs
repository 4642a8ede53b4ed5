//! One model definition, two ways to train it: in process under `Mirrored` (with
//! `keras::Model::fit`), and on a parameter-server cluster of real processes (1 chief, 2 PS,
//! 2 workers over QUIC on 127.0.0.1) with `ServerModel`. Both converge, from the same candle-nn
//! model functions ([`classifier`], [`click_model`]).
//!
//! The click model's embedding table is split over both parameter servers; a step pulls only
//! its batch's rows and pushes row gradients: the steps report how many rows they pushed, and
//! the rows no batch uses (the odd ids, on both shards) keep their initial values bit for bit.

mod ps_support;

use anyhow::Result;
use cohort::candle::{DType, Device, Module, Tensor};
use cohort::candle_nn::{Embedding, Init, VarBuilder};
use cohort::data::Dataset;
use cohort::keras::{Fit, Loss, Model};
use cohort::nn::{dense, losses, Activation, Dense, ModelVariables};
use cohort::optim::Optimizer;
use cohort::program::{
    CoordinatorError, Program, RowRead, ServerModel, Step, StepContext, StepError, WeightAccess,
};
use cohort::strategy::Mirrored;
use cohort::train::DistributedOptimizer;
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
/// The seed of both models' initial values, in process and on the servers.
const SEED: u64 = 1;
/// The click model's table.
const TABLE: &str = "ctr.emb.weight";

/// The classifier: 2 → 8 (ReLU) → 1 logit.
#[derive(Debug)]
struct Classifier {
    hidden: Dense,
    out: Dense,
}

fn classifier(vb: VarBuilder<'static>) -> cohort::candle::Result<Classifier> {
    Ok(Classifier {
        hidden: dense(2, 8, Activation::Relu, vb.pp("clf.hidden"))?,
        out: dense(8, 1, Activation::Linear, vb.pp("clf.out"))?,
    })
}

impl Module for Classifier {
    fn forward(&self, x: &Tensor) -> cohort::candle::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?)
    }
}

/// The click model: an id's embedding row (Keras' uniform ±0.05 start), then a 1-logit head.
#[derive(Debug)]
struct ClickModel {
    emb: Embedding,
    head: Dense,
}

fn click_model(vb: VarBuilder<'static>) -> cohort::candle::Result<ClickModel> {
    let table = vb.pp("ctr.emb").get_with_hints(
        (TABLE_ROWS, WIDTH),
        "weight",
        Init::Uniform {
            lo: -0.05,
            up: 0.05,
        },
    )?;
    Ok(ClickModel {
        emb: Embedding::new(table, WIDTH),
        head: dense(WIDTH, 1, Activation::Linear, vb.pp("ctr.head"))?,
    })
}

impl Module for ClickModel {
    fn forward(&self, ids: &Tensor) -> cohort::candle::Result<Tensor> {
        self.head.forward(&self.emb.forward(ids)?)
    }
}

/// Per-example binary cross-entropy of a model's logits.
fn per_example(model: &impl Module, x: &Tensor, y: &Tensor) -> cohort::candle::Result<Tensor> {
    losses::binary_cross_entropy_from_logits(&model.forward(x)?, y)
        .map_err(cohort::candle::Error::wrap)
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

/// Mean loss and accuracy of `model` on `(x, y)`.
fn evaluate(model: &impl Module, (x, y): &(Tensor, Tensor)) -> cohort::candle::Result<(f32, f32)> {
    let logits = model.forward(x)?;
    let loss = per_example(model, x, y)?.mean_all()?.to_scalar::<f32>()?;
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

/// Trains `build`'s model under `Mirrored(2)` for `epochs` and returns its loss and accuracy
/// on all of `data`, with the model.
fn train_in_process<N: Module + Send + Sync + 'static>(
    build: fn(VarBuilder<'static>) -> cohort::candle::Result<N>,
    data: (Tensor, Tensor),
    epochs: usize,
) -> Result<(f32, f32, Model<N>)> {
    let mut model = Model::new(Mirrored::new(2)?, SEED, build)?;
    model.compile(
        DistributedOptimizer::new(optimizer()),
        Loss::binary_crossentropy(),
        Vec::new(),
    );
    let history = model.fit(&dataset(data.clone())?, Fit::epochs(epochs).verbose(false))?;
    let loss = history.get("loss");
    assert!(loss.last() < loss.first(), "{loss:?}");
    let (loss, accuracy) = evaluate(model.network(), &data)?;
    Ok((loss, accuracy, model))
}

#[test]
fn the_models_converge_in_process_under_mirrored() -> Result<()> {
    let (loss, accuracy, _) = train_in_process(classifier, points(), 30)?;
    assert!(
        accuracy >= 0.95 && loss < 0.3,
        "classifier: loss {loss}, accuracy {accuracy}"
    );

    let initial = {
        let variables = ModelVariables::new(SEED);
        click_model(variables.var_builder(0))?;
        variables.get(TABLE).expect("the table").read_value()
    };
    let (loss, accuracy, model) = train_in_process(click_model, clicks(), 10)?;
    assert!(
        accuracy == 1.0 && loss < 0.2,
        "click model: loss {loss}, accuracy {accuracy}"
    );
    // Rows no batch used (odd ids) are untouched (their gradient is zero); used ones moved.
    let table = model
        .variables()
        .into_iter()
        .find(|v| v.name() == TABLE)
        .expect("the table")
        .read_value();
    let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
    for (id, (end, start)) in rows(&table).iter().zip(rows(&initial)).enumerate() {
        assert_eq!(id % 2 == 1, *end == start, "row {id}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// On a parameter-server cluster: the same model functions, through `ServerModel`.

/// What a training step reports.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StepReport {
    loss: f32,
    /// Rows pushed to the table (0 for a model without one).
    table_rows: u32,
    examples: u32,
    replicas: u32,
}

static CLF: Step<(), StepReport> = Step::new("clf");
static CTR: Step<(), StepReport> = Step::new("ctr");
static EVAL_CLF: Step<(), (f32, f32)> = Step::new("eval_clf");
static EVAL_CTR: Step<(), (f32, f32)> = Step::new("eval_ctr");

#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// What a step's [`cohort::program::TrainReport`] says, for the report.
fn step_report(report: cohort::program::TrainReport) -> StepReport {
    let table_rows = report
        .pushes
        .iter()
        .find(|p| p.access == WeightAccess::Rows)
        .map_or(0, |p| p.rows as u32);
    StepReport {
        loss: report.loss,
        table_rows,
        examples: report.examples as u32,
        replicas: report.replicas as u32,
    }
}

/// A step of the classifier: every variable read whole.
fn clf_step(ctx: &mut StepContext<'_>) -> Result<StepReport, StepError> {
    let batch = ctx.next("points")?;
    let model = ServerModel::build(ctx, classifier)?;
    let report = model.train_step(ctx, &batch, SEED, |m, b| per_example(m, &b[0], &b[1]))?;
    Ok(step_report(report))
}

/// A step of the click model: its table read by the batch's rows.
fn ctr_step(ctx: &mut StepContext<'_>) -> Result<StepReport, StepError> {
    let batch = ctx.next("clicks")?;
    let rows = RowRead {
        variable: TABLE,
        ids: &batch[0],
    };
    let (model, ids) = ServerModel::build_reading_rows(ctx, click_model, &[rows])?;
    let batch = [ids[0].clone(), batch[1].clone()];
    let report = model.train_step(ctx, &batch, SEED, |m, b| per_example(m, &b[0], &b[1]))?;
    Ok(step_report(report))
}

fn program() -> Program {
    Program::new("ps-layers")
        .optimizer(optimizer())
        .dataset("points", |_ctx| Ok(dataset(points())?.repeat(None)))
        .dataset("clicks", |_ctx| {
            Ok(dataset(clicks())?.shuffle(CLICKS, 5).repeat(None))
        })
        .step(&CLF, |ctx: &mut StepContext<'_>, ()| clf_step(ctx))
        .step(&CTR, |ctx: &mut StepContext<'_>, ()| ctr_step(ctx))
        .step(&EVAL_CLF, |ctx: &mut StepContext<'_>, ()| {
            let model = ServerModel::build(ctx, classifier)?;
            Ok::<_, StepError>(evaluate(model.model(), &points())?)
        })
        .step(&EVAL_CTR, |ctx: &mut StepContext<'_>, ()| {
            let (ids, y) = clicks();
            let rows = RowRead {
                variable: TABLE,
                ids: &ids,
            };
            let (model, ids) = ServerModel::build_reading_rows(ctx, click_model, &[rows])?;
            Ok::<_, StepError>(evaluate(model.model(), &(ids[0].clone(), y))?)
        })
        .chief(|coordinator| {
            // The chief creates both models' variables on the servers; the table is split
            // over both.
            ServerModel::create_variables(coordinator, SEED, classifier, |_, _| None)?;
            ServerModel::create_variables(coordinator, SEED, click_model, |name, _| {
                (name == TABLE).then_some(Partitioner::FixedShards { num_shards: 2 })
            })?;
            let table_at_start = coordinator.read_variable(TABLE)?;
            coordinator.create_per_worker_dataset("points")?;
            coordinator.create_per_worker_dataset("clicks")?;
            coordinator.wait_for_workers(
                coordinator.num_workers() as usize,
                std::time::Duration::from_secs(30),
            )?;

            let mut report = serde_json::json!({});
            for (model, step, eval) in [("clf", &CLF, &EVAL_CLF), ("ctr", &CTR, &EVAL_CTR)] {
                let values: Vec<_> = (0..STEPS)
                    .map(|_| coordinator.schedule(step, ()))
                    .collect::<Result<_, _>>()?;
                coordinator.join()?;
                let steps = values
                    .iter()
                    .map(|v| coordinator.fetch(v))
                    .collect::<Result<Vec<StepReport>, _>>()?;
                let result = coordinator.schedule(eval, ())?;
                coordinator.join()?;
                let (loss, accuracy) = coordinator.fetch(&result)?;
                report[model] =
                    serde_json::json!({ "steps": steps, "loss": loss, "accuracy": accuracy });
            }
            report["table_at_start"] = serde_json::json!(table_at_start);
            report["table_at_end"] = serde_json::json!(coordinator.read_variable(TABLE)?);
            report["layouts"] =
                serde_json::to_value(coordinator.layouts()).map_err(CoordinatorError::other)?;
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
    let table = layouts.iter().find(|l| l["name"] == TABLE).unwrap();
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
