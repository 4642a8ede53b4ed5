"""``MultiWorkerMirroredStrategy``: synchronous training, every worker running the whole
script.

Every task (the chief and each worker) runs the same script to its end: the strategy's
constructor joins the workers' group, variables made under ``strategy.scope()`` start as the
first worker's (a broadcast), and ``strategy.reduce`` / ``strategy.all_reduce`` combine values
over every worker with the same bits on all of them (DATA-1). Start a local job with
``python -m cohort launch --strategy multi-worker-mirrored --workers 2 train.py``.

Elastic training, as a Rust program's loop does it: call ``strategy.at_step_boundary(state)``
before each step (it admits restarted and added workers, and lets preempted or drained ones
leave, at an agreed step), and after a collective raised ``cohort.GroupError`` (a worker lost)
``strategy.recover(state)``, which re-forms the group with the survivors from the state of the
one with the most steps. No checkpoint is read for either; a job started again resumes from its
checkpoints (``cohort.CheckpointManager``, which also saves before a preempted worker leaves).
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Any, Callable

import numpy as np

from . import _native
from .errors import CohortError
from ._script import ScriptEnd, exit_now
from .strategy import Variable, _as_f32, _scope, entered

_REDUCE_OPS = ("SUM", "MEAN")


class MultiWorkerMirroredStrategy:
    """TensorFlow's ``tf.distribute.MultiWorkerMirroredStrategy`` over cohort's process group
    (QUIC with mutual TLS by default; ``COHORT_COMMUNICATION`` chooses plaintext TCP)."""

    @staticmethod
    def _variable_class() -> type:
        return MirroredVariable

    def __init__(self, cluster_resolver: Any = None) -> None:
        self.cluster_resolver = cluster_resolver
        self._native = _native.MultiWorker()
        self._variables: list[MirroredVariable] = []
        self._optimizer: Any = None
        ScriptEnd.watch()
        atexit.register(self._close)

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas across every worker (one per worker)."""
        return self._native.num_replicas_in_sync()

    @property
    def worker_index(self) -> int:
        """This worker's rank in the group (the chief is 0)."""
        return self._native.worker_index()

    @property
    def num_workers(self) -> int:
        """Workers in the group."""
        return self._native.num_workers()

    def scope(self) -> contextlib.AbstractContextManager[MultiWorkerMirroredStrategy]:
        """Variables made in this scope are mirrored on every worker."""
        return entered(self)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict | None = None):
        """Runs ``fn`` on this worker's replica (one per worker)."""
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: str, value: Any, axis: int | None = None) -> np.ndarray:
        """``value`` combined over every replica: ``"SUM"`` adds them, ``"MEAN"`` divides by the
        replicas in sync, or, with ``axis``, by the elements along ``axis`` of every worker."""
        op = _op(reduce_op)
        array = _as_f32(value)
        if axis is None:
            return self.all_reduce(op, array)
        local = array.sum(axis=axis)
        combined = self.all_reduce("SUM", [local, np.array([array.shape[axis]], np.float32)])
        total, count = combined
        return total / count[0] if op == "MEAN" else total

    def all_reduce(self, reduce_op: str, values: Any) -> Any:
        """One array, or a list of arrays (gradients), combined over every worker in one
        collective: ``"SUM"`` or ``"MEAN"`` (over the replicas in sync)."""
        op = _op(reduce_op)
        arrays = values if isinstance(values, (list, tuple)) else [values]
        arrays = [_as_f32(a) for a in arrays]
        flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0, np.float32)
        reduced = np.frombuffer(self._native.all_reduce(flat, op == "MEAN"), dtype=np.float32)
        out, start = [], 0
        for a in arrays:
            out.append(reduced[start : start + a.size].reshape(a.shape))
            start += a.size
        return out if isinstance(values, (list, tuple)) else out[0]

    def _bind_optimizer(self, optimizer: Any) -> None:
        """Makes ``optimizer`` (made in this strategy's scope) the one every worker runs."""
        self._native.set_optimizer(optimizer.spec())
        self._optimizer = optimizer

    def _apply_gradients(self, optimizer: Any, pairs: list[tuple[Any, Any]]) -> None:
        """``optimizer.apply_gradients`` of mirrored variables: the gradients summed over the
        workers in one all-reduce, then the same update on every worker's copy."""
        if optimizer is not self._optimizer:
            raise CohortError(
                f"{optimizer!r} was not made in this strategy's scope: make the optimizer in "
                "`strategy.scope()`, so that its slots follow the variables when the group "
                "changes"
            )
        variables = [v for _, v in pairs]
        for v in variables:
            if getattr(v, "_mirrored", None) is not self:
                raise CohortError(f"variable {v.name!r} is not a variable of this strategy")
        grads = [_dense(g, v) for g, v in pairs]
        summed = self.all_reduce("SUM", grads)
        self._native.apply_gradients([v._index for v in variables], [g.ravel() for g in summed])

    def preemption_requested(self) -> bool:
        """True once this process was asked to stop (SIGTERM)."""
        return self._native.preemption_requested()

    # -- elastic training ------------------------------------------------------------------

    @property
    def awaits_state(self) -> bool:
        """True on a worker that joined a live group (a restarted or added one) until its first
        :meth:`at_step_boundary` gives it the group's state."""
        return self._native.awaits_state()

    def at_step_boundary(
        self, state: TrainingState, save: Callable[[int, int], None] | None = None
    ) -> str | None:
        """Call before every step (and once after the last): admits the workers waiting to
        join (they receive the variables, step and position of the member with the most
        steps), lets a preempted (SIGTERM) or drained (SIGUSR1) worker leave, and on a joiner
        receives the state. ``save(step, position)`` runs on the first worker before a preempted
        worker leaves; without it, a :class:`cohort.CheckpointManager` made for this strategy
        saves there. Returns ``None`` (nothing changed), ``"admitted"``, ``"departed"`` or
        ``"leaving"`` (this worker leaves: end the script); ``state`` then holds the step and
        position to go on from, and ``state.detail`` says what happened. Raises ``GroupError``
        when a worker was lost meanwhile: call :meth:`recover`."""
        change, step, position, detail = self._native.at_step_boundary(
            state.step, state.position, save
        )
        state.step, state.position, state.detail = step, position, detail
        return change

    def recover(self, state: TrainingState) -> str:
        """After a collective raised ``GroupError`` (a worker lost): re-forms the group with the
        survivors, every one taking the variables, step and position of the survivor with the
        most steps (no checkpoint read). Returns what happened; ``state`` holds where training
        goes on. Raises ``GroupError`` when no group can re-form (no quorum, or this worker was
        left out): end the script, and its supervisor restarts it to join again."""
        step, position, detail = self._native.recover(state.step, state.position)
        state.step, state.position, state.detail = step, position, detail
        return detail

    def _close(self) -> None:
        # The final model is reported only by a script that ran to its end.
        code = self._native.close(not ScriptEnd.raised())
        if code != 0:
            exit_now(code)


def _dense(grad: Any, variable: Any) -> np.ndarray:
    """``grad`` as a dense float32 array of ``variable``'s shape (rows of an
    ``IndexedSlices`` added into zeros)."""
    from .optimizers import IndexedSlices

    if isinstance(grad, IndexedSlices):
        dense = np.zeros(variable.shape, np.float32)
        np.add.at(dense, np.asarray(grad.indices, dtype=np.int64), _as_f32(grad.values))
        return dense
    value = _as_f32(grad)
    if tuple(value.shape) != tuple(variable.shape):
        raise ValueError(
            f"variable {variable.name!r}: shape {variable.shape}; its gradient's is "
            f"{tuple(value.shape)}"
        )
    return value


def _op(reduce_op: str) -> str:
    op = str(getattr(reduce_op, "name", reduce_op)).upper()
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce op {reduce_op!r}: not one of SUM, MEAN")
    return op


class TrainingState:
    """Where elastic training stands: steps completed and examples consumed (the input's
    position), which :meth:`MultiWorkerMirroredStrategy.at_step_boundary` and
    :meth:`MultiWorkerMirroredStrategy.recover` carry over a change of the group."""

    def __init__(self, step: int = 0, position: int = 0) -> None:
        self.step = step
        self.position = position
        self.detail = ""

    def __repr__(self) -> str:
        return f"TrainingState(step={self.step}, position={self.position})"


class MirroredVariable(Variable):
    """A variable of a ``MultiWorkerMirroredStrategy``: a copy on every worker, starting as the
    first worker's; the script keeps the copies in sync by applying the same all-reduced
    updates everywhere."""

    def __init__(self, initial_value: Any, name: str | None = None, trainable: bool = True):
        strategy = _scope.strategy
        value = _as_f32(initial_value)
        self.shape = tuple(value.shape)
        self.trainable = trainable
        self.name = name or (
            "Variable" if not strategy._variables else f"Variable_{len(strategy._variables)}"
        )
        self._index = strategy._native.create_variable(self.name, list(self.shape), value.ravel())
        self._mirrored = strategy
        self._strategy = None
        strategy._variables.append(self)

    def read_value(self) -> np.ndarray:
        return np.frombuffer(
            self._mirrored._native.read_variable(self._index), dtype=np.float32
        ).reshape(self.shape)

    def assign(self, value: Any) -> None:
        value = _as_f32(value)
        if tuple(value.shape) != self.shape:
            raise ValueError(
                f"variable {self.name!r}: shape {self.shape}; the assignment's is "
                f"{tuple(value.shape)}"
            )
        self._mirrored._native.assign_variable(self._index, value.ravel())

    def assign_sub(self, delta: Any) -> None:
        self.assign(self.read_value() - _as_f32(delta))

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("a mirrored variable stays in its worker's process")

    def __repr__(self) -> str:
        return f"<cohort.MirroredVariable {self.name!r} shape={self.shape} dtype=float32>"
