"""The parameter servers' optimizers.

cohort's parameter servers apply the gradients a step pushes with the job's optimizer, given to
``ParameterServerStrategy(optimizer=...)`` (every process is given the same). Inside a step,
``optimizer.apply_gradients(zip(grads, variables))`` records the gradients as one update of the
step, which each server applies once (PS-1), however often the step runs after a failure. An
optimizer's rate is a constant or a schedule of the update count (``schedules``, Keras'
``keras.optimizers.schedules``: ``Adam(learning_rate=schedules.CosineDecay(0.01, 1000))``).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from . import _steps, schedules
from .schedules import LearningRateSchedule


class Optimizer:
    """An optimizer cohort's runtime runs; see the subclasses. Under a
    ``ParameterServerStrategy`` the parameter servers run it (give it to the strategy); under a
    ``MultiWorkerMirroredStrategy`` every worker runs it on its copy of the variables: make it
    in ``strategy.scope()``, so that its slots (momentum, Adam's moments) and step count follow
    the variables whenever the group changes."""

    _kind = ""

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule,
        kind: str | None = None,
        **hyperparameters: float,
    ):
        # A schedule of the update count (``cohort.schedules``), or a constant rate.
        self.learning_rate: float | LearningRateSchedule = (
            learning_rate
            if isinstance(learning_rate, LearningRateSchedule)
            else float(learning_rate)
        )
        self._hyperparameters = {k: float(v) for k, v in hyperparameters.items()}
        self._kind = kind or type(self)._kind
        from .strategy import current_scope

        bind = getattr(current_scope(), "_bind_optimizer", None)
        if bind is not None:
            bind(self)

    def spec(self) -> tuple[str, float | str, dict[str, float]]:
        """What the runtime is given: ``(kind, learning_rate, hyperparameters)``, the rate a
        number or a schedule's JSON, the others by Keras' names (``momentum``,
        ``weight_decay``, ``rho``, ``l1``, ``l2``)."""
        rate = self.learning_rate
        if isinstance(rate, LearningRateSchedule):
            return (self._kind, rate.spec(), dict(self._hyperparameters))
        return (self._kind, rate, dict(self._hyperparameters))

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> None:
        """Inside a step: pushes ``(gradient, variable)`` pairs as one update of the step,
        applied now. A gradient is an array of the variable's shape (NumPy, PyTorch, ...) or
        :class:`IndexedSlices` for rows of an embedding; ``None`` is skipped.

        With the variables of a ``MultiWorkerMirroredStrategy`` (outside any step): the
        gradients are summed over the workers (one all-reduce, as TensorFlow's optimizer does
        under the strategy: scale the loss by the global batch), then every worker applies the
        same update to its copy."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        mirrored = next((v._mirrored for _, v in pairs if hasattr(v, "_mirrored")), None)
        if mirrored is not None and not _steps.in_step():
            mirrored._apply_gradients(self, pairs)
            return
        context = _steps.current_context()
        for grad, variable in pairs:
            if isinstance(grad, IndexedSlices):
                ids = np.ascontiguousarray(grad.indices, dtype=np.uint64).ravel()
                values = _f32(grad.values)
                context.push_rows(variable.name, ids, values.ravel())
            else:
                context.push_dense(variable.name, _f32(grad).ravel())
        context.apply_gradients()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learning_rate={self.learning_rate})"


class IndexedSlices:
    """Gradients of some rows of a variable: ``values[i]`` is row ``indices[i]``'s."""

    def __init__(self, values: Any, indices: Any) -> None:
        self.values = values
        self.indices = indices


def _f32(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a PyTorch tensor
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value, dtype=np.float32)


class SGD(Optimizer):
    """Stochastic gradient descent; with ``momentum`` (``nesterov``) the momentum method."""

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
    ):
        if momentum:
            super().__init__(
                learning_rate, kind="nesterov" if nesterov else "momentum", momentum=momentum
            )
        else:
            super().__init__(learning_rate, kind="sgd")


class Adagrad(Optimizer):
    """Adagrad."""

    _kind = "adagrad"

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001):
        super().__init__(learning_rate)


class Adam(Optimizer):
    """Adam."""

    _kind = "adam"

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001):
        super().__init__(learning_rate)


class AdamW(Optimizer):
    """Adam with decoupled weight decay."""

    _kind = "adamw"

    def __init__(
        self, learning_rate: float | LearningRateSchedule = 0.001, weight_decay: float = 0.004
    ):
        super().__init__(learning_rate, weight_decay=weight_decay)


class RMSprop(Optimizer):
    """RMSprop (Keras' formulation; epsilon 1e-7, not centered)."""

    _kind = "rmsprop"

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
    ):
        super().__init__(learning_rate, rho=rho, momentum=momentum)


class Ftrl(Optimizer):
    """FTRL-proximal (Keras' formulation; rate power -0.5, initial accumulator 0.1), with L1
    and L2 regularization strengths: the optimizer of wide (linear) models over sparse
    features."""

    _kind = "ftrl"

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.001,
        l1_regularization_strength: float = 0.0,
        l2_regularization_strength: float = 0.0,
    ):
        super().__init__(
            learning_rate, l1=l1_regularization_strength, l2=l2_regularization_strength
        )
