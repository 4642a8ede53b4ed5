"""MultiWorkerMirrored from Python: every task fits a linear model to its own batches, the
gradients all-reduced each step; each prints the digest of its final weights, the same on
every worker. Arguments: --steps N."""

import argparse
import hashlib

import numpy as np

import cohort

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
args, _ = parser.parse_known_args()

strategy = cohort.MultiWorkerMirroredStrategy()
rank = strategy.worker_index
# A shape whose element count overflows is refused naming it (not wrapped), and nothing is made.
try:
    strategy._native.create_variable("huge", [2**32, 2**32], np.zeros(0, np.float32))
except ValueError as e:
    assert "too many elements" in str(e), e
else:
    raise AssertionError("a shape of 2**64 elements was taken")
rng = np.random.default_rng(rank)
true_w = np.arange(1, 9, dtype=np.float32).reshape(8, 1)
with strategy.scope():
    # Each worker draws its own start; every one begins from the first worker's.
    w = cohort.Variable(rng.normal(size=(8, 1)), name="w")
start = hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
print(f"start digest {start}")
for step in range(args.steps):
    x = rng.normal(size=(32, 8)).astype(np.float32)
    y = x @ true_w

    def replica_step(x, y):
        value = w.read_value()
        return 2 * x.T @ (x @ value - y) / len(y), float(((x @ value - y) ** 2).mean())

    grad, loss = strategy.run(replica_step, args=(x, y))
    grad = strategy.all_reduce("MEAN", grad)
    w.assign(w.read_value() - 0.05 * grad)
    mean_loss = strategy.reduce("MEAN", np.array([loss], np.float32))
print(f"final loss {float(mean_loss[0]):.6f} on {strategy.num_workers} workers")
print(f"final digest {hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]}")
