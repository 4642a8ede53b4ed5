"""The runtime's threads never wait for the interpreter: while the chief's script holds it
(a pure-Python loop that calls nothing of cohort's), the steps it scheduled are dispatched,
run on the workers and committed all the same. The chief prints whether every step was done
when its loop ended, before it called into cohort again."""

import argparse
import time

import numpy as np

import cohort

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--hold", type=float, default=5.0)
args, _ = parser.parse_known_args()

optimizer = cohort.optimizers.SGD(1.0)


def add_one(v):
    """One step: a gradient of -1 (SGD at rate 1 adds one to each element)."""
    optimizer.apply_gradients([(np.full(4, -1.0, dtype=np.float32), v)])
    return 1


strategy = cohort.ParameterServerStrategy(
    cohort.cluster_resolver.TFConfigClusterResolver(), optimizer=optimizer
)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    v = cohort.Variable(np.zeros(4, dtype=np.float32), name="v")
# One round trip first, so that the workers are up before the script holds the interpreter.
coordinator.schedule(add_one, args=(v,)).fetch()
results = [coordinator.schedule(add_one, args=(v,)) for _ in range(args.steps)]
# Holds the interpreter: nothing in this loop lets it go until the loop ends.
end = time.monotonic() + args.hold
while time.monotonic() < end:
    pass
print(f"done while the script held the interpreter: {coordinator.done()}")
print(f"results: {sum(r.fetch() for r in results)}")
print(f"values: {v.numpy().tolist()}")
