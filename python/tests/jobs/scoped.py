"""Optimizers by name scope: the parameter servers update ``wide/...`` with SGD at rate 1,
``wide/bias`` (a longer scope) at rate 0.5, ``decayed`` with SGD on a piecewise-constant
schedule (1, then 0.5, then 0.25), and every other variable with the job's SGD, its rate on an
exponential decay (0.1, halved at each update). Each of three steps pushes a gradient of -1 to
every variable (one at a time), so each variable ends at the sum of its three rates; the chief
prints them."""

import numpy as np

import cohort
from cohort.optimizers import SGD
from cohort.schedules import ExponentialDecay, PiecewiseConstantDecay


def step(variables):
    optimizer.apply_gradients([(np.full(v.shape, -1.0, dtype=np.float32), v) for v in variables])
    return 0


optimizer = SGD(ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5, staircase=True))
strategy = cohort.ParameterServerStrategy(
    optimizer=optimizer,
    scoped_optimizers={
        "wide": SGD(1.0),
        "wide/bias": SGD(0.5),
        "decayed": SGD(PiecewiseConstantDecay([0, 1], [1.0, 0.5, 0.25])),
    },
)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    variables = [
        cohort.Variable(np.zeros(2, dtype=np.float32), name="wide/kernel"),
        cohort.Variable(np.zeros(1, dtype=np.float32), name="wide/bias"),
        cohort.Variable(np.zeros(2, dtype=np.float32), name="deep"),
        cohort.Variable(np.zeros(1, dtype=np.float32), name="wider"),
        cohort.Variable(np.zeros(2, dtype=np.float32), name="decayed/kernel"),
    ]
for _ in range(3):
    coordinator.schedule(step, args=(variables,)).fetch()
coordinator.join()
for variable in variables:
    print(f"{variable.name} = {[round(float(x), 5) for x in variable.numpy()]}")
