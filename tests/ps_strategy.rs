//! `ParameterServerStrategy` as a `Strategy` value: one replica function, written once
//! against `ReplicaContext`, runs under `Mirrored::new(2)` in this process and inside the
//! scheduled steps of a parameter-server cluster of real processes (1 chief, PS, workers with
//! `replicas = 2`, QUIC on 127.0.0.1), and computes the same losses and gradients step by
//! step; the worker all-reduces across its replicas and pushes once per step. On the chief,
//! the strategy's scope declares the model's variables, which it creates on the servers, its
//! registered per-worker dataset feeds the steps, and what cannot apply there (`run`, a
//! dataset made on the chief) is a typed `StrategyError::NotAvailable`.

mod ps_support;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use cohort::candle_nn::{Init, VarBuilder};
use cohort::data::{DataError, Dataset, DistributeOptions};
use cohort::optim::Optimizer;
use cohort::program::{CoordinatorError, ParameterServerStrategy, Program, StepContext, StepError};
use cohort::strategy::{
    Mirrored, PerReplica, ReduceOp, ReplicaContext, Strategy, StrategyError, StrategyExt,
};
use cohort::variable::{Partitioner, Variable, VariableBuilder, VariableError};
use ps_support::{ledger_and_stats, write_report, Run};
use serde_json::{json, Value};

const FEATURES: usize = 3;
const EXAMPLES: usize = 42;
/// Odd, so that 2 replicas get uneven shares (4 and 3).
const BATCH: usize = 7;
const EPOCHS: usize = 2;
/// Steps the chief schedules: every batch of the data set once.
const STEPS: usize = EPOCHS * EXAMPLES / BATCH;
const LEARNING_RATE: f32 = 0.05;
const KERNEL: &str = "lin.kernel";
/// The seed of the kernel's initial value.
const SEED: u64 = 3;
/// How far the two runs may differ (float rounding: partial sums added in another order).
const TOLERANCE: f32 = 1e-5;

/// The model: one linear map without bias, `[FEATURES] -> 1`, its kernel `[FEATURES, 1]`
/// (rows that can be split over two servers), Glorot-uniform.
fn kernel(vb: VarBuilder<'static>) -> cohort::candle::Result<Tensor> {
    let bound = (6.0 / (FEATURES + 1) as f64).sqrt();
    vb.pp("lin").get_with_hints(
        (FEATURES, 1),
        "kernel",
        Init::Uniform {
            lo: -bound,
            up: bound,
        },
    )
}

/// A variable named `KERNEL` created under the active scope (its value never drawn where the
/// scope keeps no local copy).
fn kernel_in_scope() -> Result<Variable, VariableError> {
    VariableBuilder::deferred(KERNEL, vec![FEATURES, 1], DType::F32, |shape| {
        Tensor::zeros(shape, DType::F32, &Device::Cpu)
    })
    .build()
}

/// A planted linear problem: `y = x·[1, -2, 0.5] + 0.3`.
fn data() -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(EXAMPLES * FEATURES);
    let mut y = Vec::with_capacity(EXAMPLES);
    for i in 0..EXAMPLES {
        let row = [
            ((i * 5) % 11) as f32 / 5.5 - 1.0,
            ((i * 3) % 7) as f32 / 3.5 - 1.0,
            ((i * 7) % 13) as f32 / 6.5 - 1.0,
        ];
        y.push(row[0] - 2.0 * row[1] + 0.5 * row[2] + 0.3);
        x.extend(row);
    }
    let cpu = &Device::Cpu;
    (
        Tensor::from_vec(x, (EXAMPLES, FEATURES), cpu).unwrap(),
        Tensor::from_vec(y, (EXAMPLES, 1), cpu).unwrap(),
    )
}

fn dataset() -> Result<Dataset, DataError> {
    let (x, y) = data();
    Ok(Dataset::from_tensor_slices(vec![x, y])?
        .repeat(Some(EPOCHS))
        .batch(BATCH, false))
}

/// What one replica gives back.
#[derive(Debug, Clone)]
struct ReplicaOut {
    /// This replica's part of the batch's mean loss (summed over replicas: the loss).
    part: Tensor,
    /// Its examples.
    examples: f32,
    /// The batch's mean squared error, all-reduced.
    loss: f32,
    /// Its gradient with respect to the kernel, all-reduced.
    grad: Vec<f32>,
}

/// The model code, written once against the replica context: this replica's share of the
/// batch's mean squared error and its gradient, summed across the replicas in sync.
fn replica_step(
    ctx: &ReplicaContext,
    (w, batch): (Tensor, Vec<Tensor>),
) -> Result<ReplicaOut, StrategyError> {
    let (x, y) = (&batch[0], &batch[1]);
    let examples = x.dims()[0] as f32;
    let global = ctx
        .all_reduce(ReduceOp::Sum, &Tensor::new(examples, &Device::Cpu)?)?
        .to_scalar::<f32>()?;
    let w = Var::from_tensor(&w)?;
    let err = (x.matmul(w.as_tensor())? - y)?;
    let part = (err.sqr()?.sum_all()? / f64::from(global))?;
    let grads = part.backward()?;
    let grad = grads
        .get(w.as_tensor())
        .cloned()
        .unwrap_or(w.as_tensor().zeros_like()?);
    let summed = ctx.all_reduce_many(ReduceOp::Sum, &[part.detach(), grad])?;
    Ok(ReplicaOut {
        part: part.detach(),
        examples,
        loss: summed[0].to_scalar::<f32>()?,
        grad: summed[1].flatten_all()?.to_vec1::<f32>()?,
    })
}

/// What a step computed, on every replica.
struct StepOut {
    /// Each replica's result.
    outs: Vec<ReplicaOut>,
    /// SUM over the replicas of their loss parts (`Strategy::reduce`).
    reduced_loss: f32,
    /// MEAN over the replicas of their example counts.
    mean_examples: f32,
}

/// The step above the replicas, written once against `&dyn Strategy`: runs `replica_step` on
/// every replica and reduces what they give back.
fn distributed_step(
    strategy: &dyn Strategy,
    w: &Tensor,
    batch: PerReplica<Vec<Tensor>>,
) -> Result<StepOut, StrategyError> {
    let outs = strategy
        .run(replica_step, (w.clone(), batch))?
        .transpose()?
        .into_values();
    let parts = PerReplica::new(outs.iter().map(|o| o.part.clone()).collect());
    let reduced_loss = strategy.reduce(ReduceOp::Sum, &parts, None)?;
    let counts = PerReplica::new(
        outs.iter()
            .map(|o| Tensor::new(o.examples, &Device::Cpu))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let mean_examples = strategy.reduce(ReduceOp::Mean, &counts, None)?;
    Ok(StepOut {
        outs,
        reduced_loss: reduced_loss.to_scalar::<f32>()?,
        mean_examples: mean_examples.to_scalar::<f32>()?,
    })
}

#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// The registered step: the replica function under the step's strategy, one push.
fn train_step(ctx: &mut StepContext<'_>, args: &[u8]) -> Result<Vec<u8>, StepError> {
    let strategy = ParameterServerStrategy::in_step(ctx)?;
    // Variables created in the step's scope are the servers' variables.
    let kernel = {
        let _scope = strategy.try_scope()?;
        kernel_in_scope().map_err(|e| StepError::Step(e.to_string()))?
    };
    let placed_on_servers = kernel.ps_layout().is_some() && !kernel.has_local_copy();
    let w = Tensor::from_vec(ctx.pull(KERNEL)?, (FEATURES, 1), &Device::Cpu)?;
    let dataset = std::str::from_utf8(args).map_err(|e| StepError::Step(e.to_string()))?;
    let batch = ctx.next(dataset)?;
    let shares = strategy.distribute_batch(&batch)?;
    let StepOut {
        outs,
        reduced_loss,
        mean_examples,
    } = distributed_step(&strategy, &w, shares)?;
    let wrong_count = strategy.reduce(ReduceOp::Sum, &PerReplica::new(vec![w.clone()]), None);
    // Every replica holds the all-reduced gradient: the worker pushes it once.
    ctx.push_dense(KERNEL, outs[0].grad.clone())?;
    let agree = outs
        .iter()
        .all(|o| o.loss == outs[0].loss && o.grad == outs[0].grad);
    let step = json!({
        "w": w.flatten_all()?.to_vec1::<f32>()?,
        "loss": outs[0].loss,
        "grad": outs[0].grad,
        "replicas_agree": agree,
        "reduced_loss": reduced_loss,
        "examples": outs.iter().map(|o| o.examples).collect::<Vec<_>>(),
        "mean_examples": mean_examples,
        "wrong_count_refused": matches!(
            wrong_count,
            Err(StrategyError::ReplicaCountMismatch { expected: 2, got: 1 })
        ),
        "num_replicas_in_sync": strategy.num_replicas_in_sync(),
        "local_replicas": strategy.local_replicas().len(),
        "worker_index": strategy.worker_index(),
        "num_workers": strategy.num_workers(),
        "placed_on_servers": placed_on_servers,
    });
    serde_json::to_vec(&step).map_err(|e| StepError::Step(e.to_string()))
}

/// A refusal as the report records it: whether it is `NotAvailable` for `method` on the
/// coordinator, and its message.
fn refusal<T>(result: Result<T, StrategyError>, method: &str) -> Value {
    match result {
        Ok(_) => json!({ "typed": false, "message": "accepted" }),
        Err(e) => json!({
            "typed": matches!(
                &e,
                StrategyError::NotAvailable { method: m, side: "coordinator", .. } if *m == method
            ),
            "message": e.to_string(),
        }),
    }
}

fn program() -> Program {
    Program::new("ps-strategy")
        .optimizer(Optimizer::sgd(LEARNING_RATE))
        .dataset("data", |_ctx| dataset())
        .step_encoded("train", train_step)
        .chief(|coordinator| {
            let strategy = ParameterServerStrategy::on_coordinator(coordinator).map_err(CoordinatorError::other)?;
            // What cannot apply on the coordinator.
            let run = refusal(strategy.run(|_ctx, ()| (), ()), "run");
            let distribute = refusal(
                dataset()
                    .map_err(StrategyError::from)
                    .and_then(|ds| {
                        strategy.experimental_distribute_dataset(ds, DistributeOptions::default())
                    }),
                "experimental_distribute_dataset",
            );
            let from_function = refusal(
                strategy.distribute_datasets_from_function(
                    |_ctx| dataset(),
                    DistributeOptions::default(),
                ),
                "distribute_datasets_from_function",
            );
            // The scope declares variables without drawing them; the strategy creates the
            // model's on the servers (split over two when there are two).
            let declared_without_values = {
                let _scope = strategy.try_scope().map_err(CoordinatorError::other)?;
                !kernel_in_scope().map_err(CoordinatorError::other)?.has_local_copy()
            };
            let split = coordinator.num_ps() > 1;
            strategy
                .create_variables(coordinator, SEED, kernel, |_, _| {
                    split.then_some(Partitioner::FixedShards { num_shards: 2 })
                })
                .map_err(CoordinatorError::other)?;
            let data = strategy
                .distribute_datasets_from_registered_function(coordinator, "data")
                .map_err(CoordinatorError::other)?;
            coordinator.wait_for_workers(
                coordinator.num_workers() as usize,
                std::time::Duration::from_secs(30),
            )?;
            // One step at a time: with one worker the steps run in this order.
            let mut steps = Vec::with_capacity(STEPS);
            for _ in 0..STEPS {
                let value = coordinator.schedule_encoded("train", data.name().as_bytes().to_vec())?;
                let bytes = coordinator.fetch_encoded(&value)?;
                steps.push(serde_json::from_slice::<Value>(&bytes).map_err(CoordinatorError::other)?);
            }
            coordinator.join()?;
            let mut report = json!({
                "steps": steps,
                "num_replicas_in_sync": strategy.num_replicas_in_sync(),
                "num_workers": strategy.num_workers(),
                "refusals": { "run": run, "distribute": distribute, "from_function": from_function },
                "declared_without_values": declared_without_values,
                "kernel_at_end": coordinator.read_variable(KERNEL)?,
            });
            let counters = ledger_and_stats(coordinator)?;
            report["ledger"] = counters["ledger"].clone();
            report["ps"] = counters["ps"].clone();
            write_report(&report)
        })
}

fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).expect("a list of numbers")
}

fn assert_close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() <= TOLERANCE * x.abs().max(1.0),
            "{what}: {a:?} vs {b:?}"
        );
    }
}

/// A cluster of `workers` workers and `ps` servers, each worker with 2 local replicas.
fn launch(name: &str, workers: u32, ps: u32) -> Value {
    let mut run = Run::new(name, "train", &[("COHORT_REPLICAS", "2")]);
    run.num_workers = workers;
    run.workers_max = workers;
    run.num_ps = ps;
    run.ps_max = ps;
    run.launch()
}

/// Every step: 2 replicas in sync on its worker, both with the same all-reduced values, the
/// reductions as TensorFlow defines them, the variables on the servers; every step pushed
/// once to every server it touched (PS-1) and committed once.
fn assert_steps_and_pushes(report: &Value, workers: u64, ps: usize) {
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), STEPS);
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["num_replicas_in_sync"], 2, "step {i}: {step}");
        assert_eq!(step["local_replicas"], 2, "step {i}: {step}");
        assert_eq!(step["num_workers"], workers, "step {i}: {step}");
        assert!(step["worker_index"].as_u64().unwrap() < workers, "{step}");
        assert_eq!(step["replicas_agree"], true, "step {i}: {step}");
        assert_eq!(step["placed_on_servers"], true, "step {i}: {step}");
        assert_eq!(step["wrong_count_refused"], true, "step {i}: {step}");
        // The batch of 7 split 4/3 over the replicas; MEAN of their counts is 3.5.
        assert_eq!(floats(&step["examples"]), [4.0, 3.0], "step {i}");
        assert_eq!(step["mean_examples"].as_f64().unwrap(), 3.5, "step {i}");
        // SUM of the replicas' parts is the all-reduced loss.
        let (loss, reduced) = (
            step["loss"].as_f64().unwrap() as f32,
            step["reduced_loss"].as_f64().unwrap() as f32,
        );
        assert_close(&format!("step {i} reduce(SUM)"), &[reduced], &[loss]);
    }
    assert_eq!(report["num_replicas_in_sync"], 2);
    assert_eq!(report["num_workers"], workers);
    let ledger = &report["ledger"];
    assert_eq!(ledger["scheduled"], STEPS as u64, "{ledger}");
    assert_eq!(ledger["committed"], STEPS as u64, "{ledger}");
    assert_eq!(ledger["balances"], true, "{ledger}");
    // One push per step to every server holding part of the kernel, applied once.
    assert_eq!(
        ps_support::ps_counter(report, "applied"),
        vec![STEPS as u64; ps],
        "applied per PS"
    );
}

/// One worker applies its steps in order, so the cluster's run is a sequence that the same
/// replica function under `Mirrored::new(2)` replays from the same start: same losses, same
/// gradients, same variable after every update (to 1e-5).
#[test]
fn one_replica_function_computes_the_same_steps_under_mirrored_and_on_a_ps_cluster() -> Result<()> {
    let report = launch("ps-strategy-1w", 1, 1);
    assert_steps_and_pushes(&report, 1, 1);
    let steps = report["steps"].as_array().unwrap();

    let strategy = Mirrored::new(2)?;
    let dist =
        strategy.experimental_distribute_dataset(dataset()?, DistributeOptions::default())?;
    // The servers drew the kernel; the replay starts from what the first step pulled.
    let mut w = Tensor::from_vec(floats(&steps[0]["w"]), (FEATURES, 1), &Device::Cpu)?;
    let mut replayed = 0;
    for (i, batch) in dist.iter().enumerate() {
        let ps = &steps[i];
        assert_close(
            &format!("step {i} variable"),
            &w.flatten_all()?.to_vec1::<f32>()?,
            &floats(&ps["w"]),
        );
        let step = distributed_step(&strategy, &w, batch?)?;
        let out = &step.outs[0];
        assert_eq!(step.mean_examples, 3.5, "step {i}");
        assert_close(
            &format!("step {i} reduce(SUM)"),
            &[step.reduced_loss],
            &[ps["reduced_loss"].as_f64().unwrap() as f32],
        );
        assert_close(
            &format!("step {i} loss"),
            &[out.loss],
            &[ps["loss"].as_f64().unwrap() as f32],
        );
        assert_close(
            &format!("step {i} gradient"),
            &out.grad,
            &floats(&ps["grad"]),
        );
        let grad = Tensor::from_vec(out.grad.clone(), (FEATURES, 1), &Device::Cpu)?;
        w = (w - (grad * f64::from(LEARNING_RATE))?)?;
        replayed += 1;
    }
    assert_eq!(replayed, STEPS);
    assert_close(
        "variable at the end",
        &w.flatten_all()?.to_vec1::<f32>()?,
        &floats(&report["kernel_at_end"]),
    );
    // Training did something: each batch's loss fell from the first epoch to the second.
    let losses: Vec<f64> = steps.iter().map(|s| s["loss"].as_f64().unwrap()).collect();
    let per_epoch = STEPS / EPOCHS;
    for batch in 0..per_epoch {
        assert!(
            losses[per_epoch + batch] < losses[batch],
            "batch {batch}: {losses:?}"
        );
    }

    // On the coordinator: the scope declared without drawing; run and a dataset made there
    // are refused with a typed error saying why.
    assert_eq!(report["declared_without_values"], true);
    for (method, refusal) in report["refusals"].as_object().unwrap() {
        assert_eq!(refusal["typed"], true, "{method}: {refusal}");
    }
    let message = |m: &str| {
        report["refusals"][m]["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        message("run").contains("runs no replicas"),
        "{}",
        message("run")
    );
    assert!(
        message("distribute").contains("code never travels"),
        "{}",
        message("distribute")
    );
    Ok(())
}

/// Two workers of 2 replicas each over 2 servers (the kernel split over both): every step
/// runs on its worker's 2 replicas and pushes once to each server.
#[test]
fn two_workers_of_two_replicas_each_push_once_per_step_to_each_server() {
    let report = launch("ps-strategy-2w", 2, 2);
    assert_steps_and_pushes(&report, 2, 2);
}
