"""cohort from Python: TensorFlow's ``tf.distribute`` API over cohort's fault-tolerant runtime.

The same script runs in every task (``python -m cohort launch --workers 2 --ps 2 train.py``
starts a local cluster of it)::

    import numpy as np
    import cohort

    def train_step(w, target):            # imported by each worker: defined before the strategy
        value = w.read_value()
        optimizer.apply_gradients([(2 * (value - target), w)])
        return float(((value - target) ** 2).sum())

    optimizer = cohort.optimizers.SGD(0.1)
    strategy = cohort.ParameterServerStrategy(
        cohort.cluster_resolver.TFConfigClusterResolver(), optimizer=optimizer)
    # Workers and parameter servers serve inside the constructor; the chief goes on.
    coordinator = cohort.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = cohort.Variable(np.zeros(4, np.float32), name="w")
    losses = [coordinator.schedule(train_step, args=(w, 1.0)) for _ in range(100)]
    coordinator.join()
    print(losses[-1].fetch(), w.numpy())
"""

from . import cluster_resolver, coordinator, optimizers, partitioners, schedules
from ._native import VERSION as __version__
from ._steps import InputContext
from .errors import (
    ArgumentsError,
    CheckpointError,
    ClosureError,
    CohortError,
    NotInStepError,
    StepInterrupted,
    StepNotImportableError,
    VariableError,
)
from ._native import GroupError
from .checkpoints import CheckpointManager
from .evaluator import SidecarEvaluator
from .mirrored import MirroredVariable, MultiWorkerMirroredStrategy, TrainingState
from .optimizers import IndexedSlices
from .strategy import ParameterServerStrategy, Variable, read_variables

__all__ = [
    "ArgumentsError",
    "CheckpointError",
    "CheckpointManager",
    "ClosureError",
    "CohortError",
    "GroupError",
    "IndexedSlices",
    "InputContext",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "NotInStepError",
    "ParameterServerStrategy",
    "SidecarEvaluator",
    "StepInterrupted",
    "StepNotImportableError",
    "TrainingState",
    "Variable",
    "VariableError",
    "__version__",
    "cluster_resolver",
    "coordinator",
    "optimizers",
    "partitioners",
    "read_variables",
    "schedules",
]
