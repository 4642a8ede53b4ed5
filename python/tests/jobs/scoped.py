"""Optimizers by name scope: the parameter servers update ``wide/...`` with SGD at rate 1,
``wide/bias`` (a longer scope) at rate 0.5, and every other variable with the job's SGD at
rate 0.1. Each of three steps pushes a gradient of -1 to every variable (one at a time), so
each variable ends at 3 times its optimizer's rate; the chief prints them."""

import numpy as np

import cohort
from cohort.optimizers import SGD


def step(variables):
    optimizer.apply_gradients([(np.full(v.shape, -1.0, dtype=np.float32), v) for v in variables])
    return 0


optimizer = SGD(0.1)
strategy = cohort.ParameterServerStrategy(
    optimizer=optimizer,
    scoped_optimizers={"wide": SGD(1.0), "wide/bias": SGD(0.5)},
)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    variables = [
        cohort.Variable(np.zeros(2, dtype=np.float32), name="wide/kernel"),
        cohort.Variable(np.zeros(1, dtype=np.float32), name="wide/bias"),
        cohort.Variable(np.zeros(2, dtype=np.float32), name="deep"),
        cohort.Variable(np.zeros(1, dtype=np.float32), name="wider"),
    ]
for _ in range(3):
    coordinator.schedule(step, args=(variables,)).fetch()
coordinator.join()
for variable in variables:
    print(f"{variable.name} = {[round(float(x), 5) for x in variable.numpy()]}")
