"""``ParameterServerStrategy``: the same script in every role, cohort's runtime underneath.

As in TensorFlow, every task runs the same script. On a worker or a parameter server the
strategy's constructor makes the process its task and never returns: the process serves until
the job ends, then exits with the role's exit code (0 done, 1 training error, 143 stopped).
On the chief the constructor starts the coordinator and the script goes on: it creates
variables under ``strategy.scope()`` and schedules steps with a
:class:`cohort.coordinator.ClusterCoordinator`. When the script ends, the job ends.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
from typing import Any, Iterator, Mapping

import numpy as np

from . import _native, _steps
from ._script import ScriptEnd, exit_now, take_stop_requests
from .cluster_resolver import TFConfigClusterResolver
from .errors import CohortError, VariableError
from .optimizers import SGD, Optimizer
from .partitioners import Partitioner

_scope = threading.local()


@contextlib.contextmanager
def entered(strategy: Any) -> Iterator[Any]:
    """``strategy``'s scope on this thread: the strategy whose kind of variable
    ``cohort.Variable`` makes, until the scope ends (scopes nest)."""
    previous = getattr(_scope, "strategy", None)
    _scope.strategy = strategy
    try:
        yield strategy
    finally:
        _scope.strategy = previous


def current_scope() -> Any:
    """The strategy whose scope this thread is in, or ``None``."""
    return getattr(_scope, "strategy", None)


def _job_name() -> str:
    script = os.path.basename(sys.argv[0] or "") or "python"
    return os.path.splitext(script)[0] or "python"


class ParameterServerStrategy:
    """TensorFlow's ``tf.distribute.ParameterServerStrategy`` over cohort's runtime.

    ``optimizer`` is what the parameter servers apply pushed gradients with (cohort's servers
    run the optimizer; every process is given the same). ``scoped_optimizers`` maps name
    scopes to their own optimizers: a variable named ``scope``, ``scope/...`` or ``scope.…``
    (a partitioned variable's shards among them) is updated by the optimizer of the longest
    scope it is in, at that optimizer's own rate or schedule, as wide-and-deep models train
    their linear part with one optimizer and their deep part with another.
    ``variable_partitioner`` splits variables over the servers, as in TensorFlow.
    """

    def __init__(
        self,
        cluster_resolver: TFConfigClusterResolver | None = None,
        variable_partitioner: Partitioner | None = None,
        optimizer: Optimizer | None = None,
        scoped_optimizers: Mapping[str, Optimizer] | None = None,
    ) -> None:
        self.scoped_optimizers = dict(scoped_optimizers or {})
        scoped = []
        for scope, scoped_optimizer in self.scoped_optimizers.items():
            if not isinstance(scoped_optimizer, Optimizer):
                raise TypeError(
                    f"scoped_optimizers[{scope!r}]: an optimizer of cohort.optimizers, not "
                    f"{type(scoped_optimizer).__name__}"
                )
            scoped.append((str(scope), scoped_optimizer.spec()))
        self.cluster_resolver = cluster_resolver or TFConfigClusterResolver()
        self.variable_partitioner = variable_partitioner
        self.optimizer = optimizer or SGD(0.01)
        self._names = itertools.count()
        self._variables: dict[str, Variable] = {}
        _steps.note_main_names()
        task = self.cluster_resolver.task_type
        args = self.cluster_resolver.args
        take_stop_requests()
        if task in ("worker", "ps"):
            code = _native.serve(_steps.run, _job_name(), args, self.optimizer.spec(), scoped)
            exit_now(code)
        if task != "chief":
            raise ValueError(
                f"task type {task!r}: a ParameterServerStrategy job runs chief, worker and ps "
                "tasks"
            )
        self._chief = _native.Chief(
            _steps.run, _job_name(), args, self.optimizer.spec(), scoped
        )
        _ChiefExit.watch(self._chief)

    # -- TensorFlow's API ----------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """Workers in the job."""
        return self._chief.num_workers()

    @property
    def num_ps(self) -> int:
        """Parameter servers in the job."""
        return self._chief.num_ps()

    def scope(self) -> contextlib.AbstractContextManager[ParameterServerStrategy]:
        """Variables made in this scope are created on the parameter servers."""
        return entered(self)

    # -- cohort's own ----------------------------------------------------------------------

    @property
    def variables(self) -> list[Variable]:
        """Every variable created in this strategy's scope, in creation order."""
        return list(self._variables.values())

    def _create(self, name: str | None, value: np.ndarray) -> str:
        while name is None or (name in self._variables and name.startswith("Variable")):
            # TensorFlow's names: Variable, Variable_1, Variable_2...
            n = next(self._names)
            name = "Variable" if n == 0 else f"Variable_{n}"
        if name in self._variables:
            raise VariableError(f"variable {name!r} already exists in this strategy")
        partitioner = (
            self.variable_partitioner.spec() if self.variable_partitioner is not None else None
        )
        self._chief.create_variable(name, list(value.shape), value.ravel(), partitioner)
        return name


class Variable:
    """A variable on the parameter servers.

    Made under ``strategy.scope()`` on the chief from a NumPy array, a PyTorch tensor or
    anything ``numpy.asarray`` takes (float32). It travels to steps by name (pickling it sends
    no value). Inside a step, :meth:`read_value` pulls its current value; on the chief,
    :meth:`numpy` reads it from the servers and :meth:`assign` sets it.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Variable:
        # Under a MultiWorkerMirroredStrategy's scope a variable is that strategy's kind.
        kind = getattr(getattr(_scope, "strategy", None), "_variable_class", None)
        if cls is Variable and kind is not None:
            return super().__new__(kind())
        return super().__new__(cls)

    def __init__(self, initial_value: Any, name: str | None = None, trainable: bool = True):
        strategy = getattr(_scope, "strategy", None)
        if strategy is None:
            raise CohortError(
                "cohort.Variable is made under `strategy.scope()` on the chief (the workers "
                "read variables the chief made)"
            )
        value = _as_f32(initial_value)
        self.shape: tuple[int, ...] = tuple(value.shape)
        self.trainable = trainable
        self.name = strategy._create(name, value)
        strategy._variables[self.name] = self
        self._strategy: ParameterServerStrategy | None = strategy

    @classmethod
    def _handle(cls, name: str, shape: tuple[int, ...], trainable: bool) -> Variable:
        variable = cls.__new__(cls)
        variable.name = name
        variable.shape = shape
        variable.trainable = trainable
        variable._strategy = None
        return variable

    def __reduce__(self) -> tuple[Any, ...]:
        return (Variable._handle, (self.name, self.shape, self.trainable))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def read_value(self) -> np.ndarray:
        """The variable's value: pulled from the servers inside a step, read on the chief."""
        if _steps.in_step():
            data = _steps.current_context().pull(self.name)
        else:
            data = self._chief().read_variable(self.name)
        return np.frombuffer(data, dtype=np.float32).reshape(self.shape)

    def numpy(self) -> np.ndarray:
        """The variable's value as a NumPy array (:meth:`read_value`)."""
        return self.read_value()

    def gather(self, ids: Any) -> np.ndarray:
        """Rows ``ids`` of a ``[rows, width]`` variable, inside a step (an embedding lookup)."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
        data = _steps.current_context().pull_rows(self.name, ids)
        return np.frombuffer(data, dtype=np.float32).reshape((len(ids),) + self.shape[1:])

    def assign(self, value: Any) -> None:
        """Sets the whole value on the servers (on the chief, with nothing in flight)."""
        value = _as_f32(value)
        if tuple(value.shape) != self.shape:
            raise VariableError(
                f"variable {self.name!r}: shape {self.shape}; the assignment's is "
                f"{tuple(value.shape)}"
            )
        self._chief().assign_variable(self.name, value.ravel())

    def _chief(self) -> Any:
        if self._strategy is None:
            raise CohortError(
                f"variable {self.name!r}: read it inside a step on a worker, or on the chief "
                "through the variable its strategy made"
            )
        return self._strategy._chief

    def __repr__(self) -> str:
        return f"<cohort.Variable {self.name!r} shape={self.shape} dtype=float32>"


def read_variables(variables: list[Variable]) -> list[np.ndarray]:
    """Several variables' values inside a step: one request per parameter server for all."""
    data = _steps.current_context().pull_many([v.name for v in variables])
    return [
        np.frombuffer(d, dtype=np.float32).reshape(v.shape) for d, v in zip(data, variables)
    ]


def _as_f32(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a PyTorch tensor
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value, dtype=np.float32)


class _ChiefExit:
    """Ends the chief's role when the script ends. The job's end decides the exit code when it
    is not 0 (1 after a failure, 143 after a stop request, 170-173 restart me); else the
    script's own (``sys.exit(3)`` exits 3)."""

    @classmethod
    def watch(cls, chief: Any) -> None:
        ScriptEnd.watch()
        atexit.register(cls._finish, chief)

    @classmethod
    def _finish(cls, chief: Any) -> None:
        code = chief.finish(ScriptEnd.failure, ScriptEnd.restart)
        if code != 0:
            exit_now(code)
