"""Learning-rate schedules (Keras' ``keras.optimizers.schedules``), also reachable as
``cohort.optimizers.schedules``.

Give one to an optimizer in place of a constant rate (``Adam(learning_rate=CosineDecay(...))``):
update ``n`` of a variable (0 for its first, as Keras passes ``optimizer.iterations``) is applied
at ``schedule(n)``. Under a ``ParameterServerStrategy`` each parameter server counts each
variable's updates (the count is restored with the variable, so a server restarted from a
checkpoint goes on where the schedule was); under a ``MultiWorkerMirroredStrategy`` the
optimizer counts its updates, the same on every worker. The schedule is computed by cohort's
runtime, which applies the updates; calling one here asks the runtime too, so what Python sees
is what the servers apply.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from . import _native


class LearningRateSchedule:
    """A learning rate as a function of the update count; see the subclasses."""

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def spec(self) -> str:
        """What the runtime is given: the schedule as JSON (cohort's
        ``LearningRateSchedule``)."""
        return json.dumps(self._fields())

    def __call__(self, step: int) -> float:
        """The rate of update count ``step`` (0 for the first update). A schedule that cannot
        give a rate raises ``ValueError`` naming what is wrong."""
        return _native.schedule_rate(self.spec(), int(step))

    def __repr__(self) -> str:
        (fields,) = self._fields().values()
        args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        return f"{type(self).__name__}({args})"


class ExponentialDecay(LearningRateSchedule):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)``, the exponent floored with
    ``staircase`` (Keras' ``ExponentialDecay``)."""

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        decay_rate: float,
        staircase: bool = False,
    ) -> None:
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = int(decay_steps)
        self.decay_rate = float(decay_rate)
        self.staircase = bool(staircase)

    def _fields(self) -> dict[str, Any]:
        return {
            "ExponentialDecay": {
                "initial": self.initial_learning_rate,
                "decay_steps": self.decay_steps,
                "decay_rate": self.decay_rate,
                "staircase": self.staircase,
            }
        }


class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[0]`` while ``step <= boundaries[0]``, ``values[i]`` while ``boundaries[i - 1] <
    step <= boundaries[i]``, the last value after the last boundary (Keras'
    ``PiecewiseConstantDecay``): ``values`` has one more entry than ``boundaries``, which
    increase."""

    def __init__(self, boundaries: Sequence[int], values: Sequence[float]) -> None:
        self.boundaries = [int(b) for b in boundaries]
        self.values = [float(v) for v in values]

    def _fields(self) -> dict[str, Any]:
        return {"PiecewiseConstant": {"boundaries": self.boundaries, "values": self.values}}


class CosineDecay(LearningRateSchedule):
    """Keras' ``CosineDecay``: an optional linear warm-up from ``initial_learning_rate`` to
    ``warmup_target`` over ``warmup_steps``, then a cosine from the peak down to ``alpha`` times
    the peak over ``decay_steps``, and that floor after."""

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        alpha: float = 0.0,
        warmup_target: float | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = int(decay_steps)
        self.alpha = float(alpha)
        self.warmup_target = None if warmup_target is None else float(warmup_target)
        self.warmup_steps = int(warmup_steps)

    def _fields(self) -> dict[str, Any]:
        return {
            "CosineDecay": {
                "initial": self.initial_learning_rate,
                "decay_steps": self.decay_steps,
                "alpha": self.alpha,
                "warmup_target": self.warmup_target,
                "warmup_steps": self.warmup_steps,
            }
        }


__all__ = [
    "CosineDecay",
    "ExponentialDecay",
    "LearningRateSchedule",
    "PiecewiseConstantDecay",
]
