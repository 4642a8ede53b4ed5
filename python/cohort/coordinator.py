"""``ClusterCoordinator``: schedules steps on the workers from the chief (TensorFlow's
``tf.distribute.coordinator.ClusterCoordinator``).

A step is a function the workers import (module and name; see :mod:`cohort._steps`). Its
arguments travel pickled (NumPy arrays and PyTorch tensors included; variables and per-worker
iterators by name). cohort's guarantees hold unchanged: each step's update is applied once by
every parameter server (PS-1), a step lost with its worker runs again on another, a lost
parameter server is restored from the newest checkpoint and the steps since run again.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from . import _steps
from .schedules import LearningRateSchedule
from .strategy import ParameterServerStrategy


class RemoteValue:
    """A scheduled step's future value."""

    def __init__(self, chief: Any, closure_id: int) -> None:
        self._chief = chief
        self.closure_id = closure_id
        self._value: Any = None
        self._fetched = False

    def fetch(self) -> Any:
        """Waits for the value; raises ``ClosureError`` if the step failed."""
        if not self._fetched:
            self._value = _steps.decode_value(self._chief.fetch(self.closure_id))
            self._fetched = True
        return self._value

    def get(self) -> Any:
        """The value (:meth:`fetch`)."""
        return self.fetch()

    def __repr__(self) -> str:
        return f"<RemoteValue of closure {self.closure_id}>"


class PerWorkerDataset:
    """A dataset made on every worker by its own call of the dataset function."""

    _ids = itertools.count()

    def __init__(self, ref: tuple[str, str]) -> None:
        self._ref = ref
        self._id = next(PerWorkerDataset._ids)

    def __iter__(self) -> PerWorkerIterator:
        return PerWorkerIterator(self._id, self._ref)


class PerWorkerIterator:
    """Each worker's iterator of a :class:`PerWorkerDataset`: ``next(it)`` inside a step gives
    that worker's next element."""

    def __init__(self, dataset_id: int, ref: tuple[str, str]) -> None:
        self._id = dataset_id
        self._ref = ref

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        return next(_steps.worker_iterator(self._id, self._ref))

    def __reduce__(self) -> tuple[Any, ...]:
        return (PerWorkerIterator, (self._id, self._ref))


class ClusterCoordinator:
    """Schedules steps on the workers of ``strategy``'s job (on the chief)."""

    def __init__(self, strategy: ParameterServerStrategy) -> None:
        self.strategy = strategy
        self._chief = strategy._chief

    def schedule(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> RemoteValue:
        """Queues ``fn(*args, **kwargs)`` on whichever worker is free. A function the workers
        cannot import raises ``StepNotImportableError`` and arguments that cannot be pickled
        ``ArgumentsError``, both naming it; nothing is scheduled then."""
        ref = _steps.reference(fn)
        payload = _steps.encode(ref, tuple(args), kwargs or {})
        return RemoteValue(self._chief, self._chief.schedule(payload))

    def join(self) -> None:
        """Waits until every scheduled step has finished; raises the first error since the
        last ``join`` (``ClosureError``)."""
        self._chief.join()

    def done(self) -> bool:
        """True when nothing is queued or running."""
        return self._chief.done()

    def fetch(self, values: Any) -> Any:
        """The values of a :class:`RemoteValue`, or of a list, tuple or dict of them."""
        if isinstance(values, RemoteValue):
            return values.fetch()
        if isinstance(values, (list, tuple)):
            return type(values)(self.fetch(v) for v in values)
        if isinstance(values, dict):
            return {k: self.fetch(v) for k, v in values.items()}
        return values

    def create_per_worker_dataset(self, dataset_fn: Callable[..., Any]) -> PerWorkerDataset:
        """A dataset each worker makes by calling ``dataset_fn`` (with an ``InputContext`` if
        it takes an argument) on its first use; iterate it for a per-worker iterator."""
        return PerWorkerDataset(_steps.reference(dataset_fn, what="dataset function"))

    def set_learning_rate(self, rate: float) -> None:
        """Sets the rate the parameter servers apply the steps scheduled from now on at, in
        place of the optimizer's (what ``optimizer.learning_rate.assign`` does between epochs
        under TensorFlow). Each step carries the rate it was scheduled with: one run again after
        a worker or a server was lost applies at it, the steps already scheduled keep theirs,
        and a checkpoint records it, so a chief restarted from one goes on at it. A rate that is
        negative or not finite raises ``ValueError`` and changes nothing."""
        self._chief.set_learning_rate(float(rate))

    @property
    def learning_rate(self) -> float | LearningRateSchedule:
        """The rate the steps scheduled from now on are applied at: the one
        :meth:`set_learning_rate` set last (or a restored checkpoint recorded), else the
        optimizer's (its schedule, where it has one: the servers apply each variable's update
        ``n`` at ``schedule(n)``)."""
        rate = self._chief.learning_rate()
        return self.strategy.optimizer.learning_rate if rate is None else rate

    # -- cohort's own ----------------------------------------------------------------------

    def ledger(self) -> dict[str, int]:
        """The ledger (LEDGER-1): steps scheduled, committed, failed, re-dispatched..."""
        return dict(self._chief.ledger())

    def ps_stats(self) -> list[dict[str, int]]:
        """Each parameter server's pushes applied and refused (PS-1, FENCE-1)."""
        return [dict(s) for s in self._chief.ps_stats()]

    def save_checkpoint(self, step: int) -> str:
        """Saves every variable at ``step`` in the configured checkpoint directory
        (``COHORT_CHECKPOINT_DIR``); returns its path. A lost parameter server is restored
        from the newest one."""
        return self._chief.save_checkpoint(step)

    def restore_checkpoint(self) -> int | None:
        """Restores every variable from the newest valid checkpoint; returns its step, or
        ``None`` when there is none. Call it once every variable exists, before training."""
        return self._chief.restore_checkpoint()

    def preemption_requested(self) -> bool:
        """True once this process was asked to stop (SIGTERM): save and end the script."""
        return self._chief.preemption_requested()
