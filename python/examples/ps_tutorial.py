"""TensorFlow's parameter-server training tutorial (its custom training loop) on cohort, with
the model's gradients written in NumPy; ``ps_tutorial_torch.py`` is the same with PyTorch.

    python -m cohort launch --workers 2 --ps 2 python/examples/ps_tutorial.py

With the tutorial's sidecar evaluation: the chief saves a checkpoint at each epoch's end
(``--save-checkpoints``, in the job's checkpoint directory) and an evaluator task reports the
accuracy of each on held-out rows::

    COHORT_CHECKPOINT_DIR=/tmp/tutorial/ckpt python -m cohort launch --workers 2 --ps 2 \
      --evaluators 1 python/examples/ps_tutorial.py --save-checkpoints

The model averages a 16,384-wide embedding of the three heroes of a row and predicts with a
sigmoid unit whether one is "avenger". Its variables live on the parameter servers; the step
gets them with its arguments (a ``Model`` travels as the names of its variables), since a
worker never runs the script past the strategy's constructor. The embedding is split over the parameter servers
(``MinSizePartitioner``); each step gathers only the rows it uses and pushes their gradients
as rows (``IndexedSlices``). The chief prints each epoch's accuracy, then the final one.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import cohort
import tutorial_data

EMBEDDING_DIM = 16384
L2 = 1e-4


def per_worker_dataset_fn(input_context):
    return tutorial_data.batches(input_context)


class Model:
    """The tutorial's model: its variables, made on the parameter servers by the chief."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.embedding = cohort.Variable(
            rng.uniform(-0.05, 0.05, (tutorial_data.VOCAB_ROWS, EMBEDDING_DIM)),
            name="embedding",
        )
        self.kernel = cohort.Variable(
            rng.uniform(-0.02, 0.02, (EMBEDDING_DIM, 1)), name="dense/kernel"
        )
        self.bias = cohort.Variable(np.zeros(1), name="dense/bias")


def step_fn(model, iterator):
    """One step on a worker: the batch's loss, and how many of its rows it got right."""
    ids, labels = next(iterator)
    unique, inverse = np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(ids.shape)
    rows = model.embedding.gather(unique)
    kernel, bias = cohort.read_variables([model.kernel, model.bias])
    hidden = rows[inverse].mean(axis=1)
    logits = (hidden @ kernel + bias)[:, 0]
    pred = 1.0 / (1.0 + np.exp(-logits))
    eps = 1e-7
    per_example = -(labels * np.log(pred + eps) + (1 - labels) * np.log(1 - pred + eps))
    loss = per_example.mean() + L2 * float((kernel**2).sum())
    # Backward, by hand.
    d_logits = ((pred - labels) / len(labels))[:, None]
    d_kernel = hidden.T @ d_logits + 2 * L2 * kernel
    d_bias = d_logits.sum(axis=0)
    d_hidden = d_logits @ kernel.T
    d_rows = np.zeros_like(rows)
    np.add.at(d_rows, inverse, np.repeat(d_hidden[:, None, :] / ids.shape[1], ids.shape[1], 1))
    optimizer.apply_gradients(
        [
            (cohort.IndexedSlices(d_rows, unique), model.embedding),
            (d_kernel, model.kernel),
            (d_bias, model.bias),
        ]
    )
    correct = int(((pred > 0.5) == (labels > 0.5)).sum())
    return float(loss), correct, len(labels)


def evaluate(step, variables):
    """The sidecar evaluator's function: the model of one checkpoint on held-out rows."""
    ids, labels = tutorial_data.examples(seed=1)
    hidden = variables["embedding"][ids].mean(axis=1)
    logits = (hidden @ variables["dense/kernel"] + variables["dense/bias"])[:, 0]
    pred = 1.0 / (1.0 + np.exp(-logits))
    eps = 1e-7
    loss = -(labels * np.log(pred + eps) + (1 - labels) * np.log(1 - pred + eps)).mean()
    return {"accuracy": float(((pred > 0.5) == (labels > 0.5)).mean()), "loss": float(loss)}


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=5)
parser.add_argument("--save-checkpoints", action="store_true")
args, _ = parser.parse_known_args()

resolver = cohort.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type == "evaluator":
    # Until no new checkpoint came for a while (COHORT_EVAL_IDLE_TIMEOUT), or the launcher
    # stops it with the job.
    cohort.SidecarEvaluator(evaluate, resolver).start()
    sys.exit(0)

optimizer = cohort.optimizers.Adagrad(learning_rate=0.1)
strategy = cohort.ParameterServerStrategy(
    resolver,
    variable_partitioner=cohort.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=resolver.num_ps
    ),
    optimizer=optimizer,
)
# The chief from here on: the workers and parameter servers serve inside the constructor.
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    model = Model()

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

for epoch in range(args.epochs):
    results = [
        coordinator.schedule(step_fn, args=(model, per_worker_iterator))
        for _ in range(args.steps_per_epoch)
    ]
    coordinator.join()
    correct = sum(r.fetch()[1] for r in results)
    seen = sum(r.fetch()[2] for r in results)
    print(f"Finished epoch {epoch}, accuracy is {correct / seen:.6f}.")
    if args.save_checkpoints:
        coordinator.save_checkpoint((epoch + 1) * args.steps_per_epoch)

final = coordinator.schedule(step_fn, args=(model, per_worker_iterator))
loss, correct, seen = final.fetch()
print(f"Final loss is {loss:.6f}, final accuracy is {correct / seen:.6f}")
ledger = coordinator.ledger()
print(
    f"ledger: {ledger['scheduled']} scheduled, {ledger['committed']} committed, "
    f"{ledger['failed']} failed"
)
if correct / seen < 0.9:
    # Says why the job fails, for whoever reads its log.
    print(f"final accuracy {correct / seen:.6f} is below the target 0.9", file=sys.stderr)
    sys.exit(1)
