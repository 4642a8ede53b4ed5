"""The dense workload of `cohort bench ps` as a cohort job written in Python (the Python
package; the step's gradients computed by PyTorch's autograd, or with --compute numpy by hand
in NumPy): what `cohort_python_ps.py` runs as a local cluster. The model,
batch, optimizer and placement are those of src/workloads/bench.rs's `dense` and of
torch_ps.py: an MLP 784-256-256-10 (relu, SGD at 0.1, softmax cross-entropy), batch 256 of a
few seeded synthetic batches per worker, variables of 256 KiB and more split over the servers.

The chief schedules --warmup steps, joins, then times --steps steps to their join and writes
{"steps": N, "seconds": S} to --report."""

import argparse
import json
import os
import time

import numpy as np
import torch

import cohort
from dense_compute import numpy_gradients, torch_mlp
from workload import CLASSES, FEATURES, LEARNING_RATE

BATCH = 256


def dataset_fn(input_context):
    """A few seeded batches, repeated: input generation must not be what is measured."""
    rng = np.random.default_rng(input_context.input_pipeline_id)
    batches = [
        (
            rng.standard_normal((BATCH, FEATURES), dtype=np.float32),
            rng.integers(0, CLASSES, BATCH, dtype=np.int64),
        )
        for _ in range(4)
    ]
    while True:
        yield from batches


# This worker's module, made on its first step.
_module = None


def dense_step(variables, iterator):
    global _module
    if _module is None:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // 5))
        _module = torch_mlp()
    x, y = next(iterator)
    values = cohort.read_variables(variables)
    with torch.no_grad():
        for parameter, value in zip(_module.parameters(), values):
            parameter.copy_(torch.from_numpy(value))
    _module.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(_module(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    optimizer.apply_gradients([(p.grad, v) for p, v in zip(_module.parameters(), variables)])


def numpy_dense_step(variables, iterator):
    """The same step with NumPy computing the gradients by hand (its BLAS, one thread)."""
    x, y = next(iterator)
    grads = numpy_gradients(cohort.read_variables(variables), x, y)
    optimizer.apply_gradients(zip(grads, variables))


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--compute", choices=["torch", "numpy"], default="torch")
parser.add_argument("--warmup", type=int, default=30)
parser.add_argument("--report", required=True)
args, _ = parser.parse_known_args()

optimizer = cohort.optimizers.SGD(LEARNING_RATE)
resolver = cohort.cluster_resolver.TFConfigClusterResolver()
strategy = cohort.ParameterServerStrategy(
    resolver,
    variable_partitioner=cohort.partitioners.MinSizePartitioner(256 << 10, resolver.num_ps),
    optimizer=optimizer,
)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    variables = [cohort.Variable(p, name=n) for n, p in torch_mlp().named_parameters()]
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
step = dense_step if args.compute == "torch" else numpy_dense_step
for _ in range(args.warmup):
    coordinator.schedule(step, args=(variables, iterator))
coordinator.join()
started = time.perf_counter()
for _ in range(args.steps):
    coordinator.schedule(step, args=(variables, iterator))
coordinator.join()
seconds = time.perf_counter() - started
with open(args.report, "w") as report:
    json.dump({"steps": args.steps, "seconds": seconds}, report)
print(f"dense from Python ({args.compute}): {args.steps} steps in {seconds:.2f}s: {args.steps / seconds:.1f} steps/s")
