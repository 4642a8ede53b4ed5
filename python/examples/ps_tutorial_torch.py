"""TensorFlow's parameter-server training tutorial (its custom training loop) on cohort, the
model written in PyTorch; ``ps_tutorial.py`` is the same with NumPy.

    python -m cohort launch --workers 2 --ps 2 python/examples/ps_tutorial_torch.py

Each step loads the values of the model's variables from the parameter servers into a
``torch.nn.Module``, computes the loss and its gradients with autograd, and pushes them; the
servers apply the optimizer. The module's parameters start the variables on the chief.
"""

from __future__ import annotations

import argparse
import sys

import torch

import cohort
import tutorial_data

EMBEDDING_DIM = 16384
L2 = 1e-4


class HeroClassifier(torch.nn.Module):
    """The tutorial's model: the mean of the row's embeddings, then a sigmoid unit."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(tutorial_data.VOCAB_ROWS, EMBEDDING_DIM)
        self.dense = torch.nn.Linear(EMBEDDING_DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.dense(self.embedding(ids).mean(dim=1))).squeeze(1)


def per_worker_dataset_fn(input_context):
    return tutorial_data.batches(input_context)


def step_fn(variables, iterator):
    """One step on a worker: the batch's loss, and how many of its rows it got right."""
    ids, labels = next(iterator)
    module = HeroClassifier()
    values = cohort.read_variables(variables)
    with torch.no_grad():
        for parameter, value in zip(module.parameters(), values):
            parameter.copy_(torch.from_numpy(value))
    ids_t = torch.from_numpy(ids)
    labels_t = torch.from_numpy(labels)
    pred = module(ids_t)
    loss = torch.nn.functional.binary_cross_entropy(pred, labels_t)
    loss = loss + L2 * (module.dense.weight**2).sum()
    loss.backward()
    optimizer.apply_gradients(
        [(parameter.grad, variable) for parameter, variable in zip(module.parameters(), variables)]
    )
    correct = int(((pred > 0.5) == (labels_t > 0.5)).sum())
    return float(loss), correct, len(labels)


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=5)
# Checkpoints in COHORT_CHECKPOINT_DIR: one before training and one after each epoch; a lost
# parameter server is restored from the newest, and a restarted chief resumes there.
parser.add_argument("--checkpoints", action="store_true")
args, _ = parser.parse_known_args()

optimizer = cohort.optimizers.Adagrad(learning_rate=0.1)
resolver = cohort.cluster_resolver.TFConfigClusterResolver()
strategy = cohort.ParameterServerStrategy(
    resolver,
    variable_partitioner=cohort.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=resolver.num_ps
    ),
    optimizer=optimizer,
)
# The chief from here on: the workers and parameter servers serve inside the constructor.
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
torch.manual_seed(0)
with strategy.scope():
    # One variable per parameter, in the module's order, started from its initial values.
    variables = [
        cohort.Variable(parameter, name=name) for name, parameter in HeroClassifier().named_parameters()
    ]

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

first_epoch = 0
if args.checkpoints:
    restored = coordinator.restore_checkpoint()
    if restored is None:
        coordinator.save_checkpoint(0)
    else:
        first_epoch = restored // args.steps_per_epoch
        print(f"Resumed at epoch {first_epoch}.")

for epoch in range(first_epoch, args.epochs):
    results = [
        coordinator.schedule(step_fn, args=(variables, per_worker_iterator))
        for _ in range(args.steps_per_epoch)
    ]
    coordinator.join()
    correct = sum(r.fetch()[1] for r in results)
    seen = sum(r.fetch()[2] for r in results)
    print(f"Finished epoch {epoch}, accuracy is {correct / seen:.6f}.")
    if args.checkpoints:
        coordinator.save_checkpoint((epoch + 1) * args.steps_per_epoch)

final = coordinator.schedule(step_fn, args=(variables, per_worker_iterator))
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
