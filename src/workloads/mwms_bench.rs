//! The MultiWorkerMirrored throughput workload of `cohort bench mwms`: the dense MLP
//! 784-256-256-10 (relu) with SGD, over a fixed synthetic batch per replica (generated once,
//! so that the timed loop is the step alone: forward, backward, the gradients' all-reduce
//! across every replica of every worker, the update), as TensorFlow's comparison run does with
//! its MultiWorkerMirroredStrategy.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor};

use super::dense_sync::{replica_train_step, Mlp};
use crate::distribute::PerReplica;
use crate::optim::Optimizer;
use crate::strategy::{Strategy, StrategyExt};
use crate::train::{DistributedOptimizer, ReplicatedModel, TrainError};

/// Input features (a 28×28 image).
pub const FEATURES: usize = 784;
/// Units of each hidden layer.
pub const HIDDEN: [usize; 2] = [256, 256];
/// Classes.
pub const CLASSES: usize = 10;
/// SGD's learning rate.
const LEARNING_RATE: f32 = 0.01;

/// What a timed run measured on this worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Steps timed (after the warm-up).
    pub steps: usize,
    /// Their wall time, seconds.
    pub seconds: f64,
    /// The global loss of the last step (a finite number: the run trained).
    pub last_loss: f32,
}

/// Trains the MLP under `strategy` on `per_worker_batch` examples per worker and step
/// (split evenly over the local replicas): `warmup` steps, then `steps` timed ones.
pub fn run(
    strategy: &dyn Strategy,
    per_worker_batch: usize,
    warmup: usize,
    steps: usize,
    seed: u64,
) -> Result<Timed, TrainError> {
    let local = strategy.local_replicas().len().max(1);
    if per_worker_batch == 0 || per_worker_batch % local != 0 {
        return Err(TrainError::Tensor(candle_core::Error::Msg(format!(
            "a batch of {per_worker_batch} per worker does not split over {local} local replicas"
        ))));
    }
    let per_replica = per_worker_batch / local;
    let replicas = strategy.num_replicas_in_sync();
    let global_batch = per_replica * replicas;
    let widths = [FEATURES, HIDDEN[0], HIDDEN[1], CLASSES];
    let model = Arc::new(ReplicatedModel::build(strategy, seed, |vb| {
        Mlp::build(&widths, vb)
    })?);
    let optimizer = Arc::new(DistributedOptimizer::new(Optimizer::sgd(LEARNING_RATE)));
    let batch = synthetic_batches(strategy, per_replica)?;
    let step = |batch: PerReplica<Vec<Tensor>>| -> Result<f32, TrainError> {
        let (model, optimizer) = (Arc::clone(&model), Arc::clone(&optimizer));
        let step = optimizer.iterations();
        // The global loss rides in the gradients' all-reduce (as in the MultiWorkerMirrored
        // demo's step): one collective a step.
        let losses = strategy.try_run(
            move |ctx, inputs: Vec<Tensor>| -> Result<f32, TrainError> {
                replica_train_step(ctx, &model, &optimizer, &inputs, global_batch, step)
            },
            batch,
        )?;
        Ok(losses.values().first().copied().unwrap_or(f32::NAN))
    };
    for _ in 0..warmup {
        step(batch.clone())?;
    }
    let started = Instant::now();
    let mut last_loss = f32::NAN;
    for _ in 0..steps {
        last_loss = step(batch.clone())?;
    }
    Ok(Timed {
        steps,
        seconds: started.elapsed().as_secs_f64(),
        last_loss,
    })
}

/// One fixed batch per local replica: features in [-1, 1) and labels drawn from a
/// deterministic sequence, different on every replica.
fn synthetic_batches(
    strategy: &dyn Strategy,
    per_replica: usize,
) -> Result<PerReplica<Vec<Tensor>>, TrainError> {
    let local = strategy.local_replicas();
    let mut values = Vec::with_capacity(local.len());
    for replica in local {
        let offset = replica * per_replica;
        let x: Vec<f32> = (0..per_replica * FEATURES)
            .map(|i| (((offset * FEATURES + i) * 7919 + 13) % 2003) as f32 / 1001.5 - 1.0)
            .collect();
        let y: Vec<i64> = (0..per_replica)
            .map(|i| ((offset + i) * 31 % CLASSES) as i64)
            .collect();
        values.push(vec![
            Tensor::from_vec(x, (per_replica, FEATURES), &Device::Cpu)?,
            Tensor::from_vec(y, per_replica, &Device::Cpu)?,
        ]);
    }
    Ok(PerReplica::new(values))
}
