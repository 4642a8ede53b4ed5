"""The quick start: four weights pulled toward a target by 100 steps on 2 workers."""

import numpy as np

import cohort


def train_step(w, target):
    value = w.read_value()
    optimizer.apply_gradients([(2.0 * (value - target), w)])
    return float(((value - target) ** 2).sum())


optimizer = cohort.optimizers.SGD(0.1)
strategy = cohort.ParameterServerStrategy(
    cohort.cluster_resolver.TFConfigClusterResolver(), optimizer=optimizer
)
# Only the chief gets here: workers and parameter servers serve inside the constructor.
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = cohort.Variable(np.zeros(4, np.float32), name="w")
losses = [coordinator.schedule(train_step, args=(w, 1.0)) for _ in range(100)]
coordinator.join()
print(f"first loss {losses[0].fetch():.3f}, last loss {losses[-1].fetch():.6f}")
print(f"w = {w.numpy().tolist()}")
print(f"ledger {coordinator.ledger()}")
