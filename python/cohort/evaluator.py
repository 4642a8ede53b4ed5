"""The job's evaluator task: TensorFlow's sidecar evaluator over cohort's checkpoints.

An evaluator task does not train. It watches the job's checkpoint directory and evaluates every
newer checkpoint that verifies, with the script's function, while the chief and the workers
train on::

    def evaluate(step, variables):          # variables: name -> NumPy array, whole
        w = variables["w"]
        return {"distance": float(np.abs(w - TARGET).max())}

    resolver = cohort.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type == "evaluator":
        cohort.SidecarEvaluator(evaluate, resolver).start()
    else:
        strategy = cohort.ParameterServerStrategy(resolver)
        ...

``python -m cohort launch --workers 2 --ps 2 --evaluators 1 train.py`` starts one beside the job
(on a cluster, an ``evaluator`` task in ``TF_CONFIG``); the chief saves the checkpoints
(``coordinator.save_checkpoint``) in the directory the task's configuration names
(``--checkpoint-dir``, ``COHORT_CHECKPOINT_DIR``, or ``checkpoint_dir`` in ``cohort.toml``).
Each evaluation is one log line (``evaluator/0: step 200: distance=0.01 step=200``) and a
TensorBoard scalar per metric under ``<checkpoint_dir>/logs/eval``, as for a Rust program.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import _native
from ._script import exit_now, take_stop_requests
from .cluster_resolver import TFConfigClusterResolver
from .errors import CohortError
from .strategy import _job_name

# What a checkpoint's dtypes are in NumPy (little-endian, as checkpoints store them). BF16 has
# no NumPy dtype: its values are given as float32, exactly.
_NUMPY_DTYPES = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}

EvaluateFn = Callable[[int, dict[str, np.ndarray]], Mapping[str, float]]


class SidecarEvaluator:
    """Evaluates the job's checkpoints with ``evaluate`` as they appear (see the module doc).

    ``evaluate(step, variables)`` gets a checkpoint's global step and its variables by name,
    each whole (its parts on the parameter servers put back together) as a NumPy array of its
    shape; optimizer slots are left out. It returns the metrics, a mapping of names to numbers,
    logged in its order. ``cluster_resolver`` is the task's (default: a new
    :class:`~cohort.cluster_resolver.TFConfigClusterResolver`).
    """

    def __init__(
        self,
        evaluate: EvaluateFn,
        cluster_resolver: TFConfigClusterResolver | None = None,
    ) -> None:
        if not callable(evaluate):
            raise TypeError(f"evaluate: {evaluate!r} is not callable")
        self.evaluate = evaluate
        self.cluster_resolver = cluster_resolver or TFConfigClusterResolver()

    def start(self) -> None:
        """Evaluates until the evaluator stops (TensorFlow's ``SidecarEvaluator.start``):

        - it returns after a checkpoint at ``eval_until_step`` or later
          (``COHORT_EVAL_UNTIL_STEP``), or when no new checkpoint appeared for
          ``eval_idle_timeout`` (``COHORT_EVAL_IDLE_TIMEOUT``);
        - on SIGTERM or SIGINT the process exits with 143 at once, as cohort's tasks do;
        - an exception ``evaluate`` raised is raised here, after the log named the checkpoint;
          a checkpoint that does not verify is skipped (logged), never evaluated.

        Raises ``ValueError`` naming the setting where this task is no evaluator or no
        checkpoint directory is configured, and :class:`~cohort.CohortError` where the
        evaluator failed otherwise (its log says why).
        """
        take_stop_requests()
        code = _native.evaluate(
            self._evaluate_checkpoint, _job_name(), self.cluster_resolver.args
        )
        if code == 143:
            exit_now(code)
        if code != 0:
            raise CohortError(
                f"the evaluator failed (exit code {code}); its log above says why"
            )

    def _evaluate_checkpoint(
        self, step: int, variables: list[tuple[str, str, list[int], Any]]
    ) -> list[tuple[str, float]]:
        """The runtime's call for one checkpoint: arrays in, named numbers out."""
        arrays = {
            name: _array(name, dtype, shape, values) for name, dtype, shape, values in variables
        }
        metrics = self.evaluate(step, arrays)
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"evaluate returned {type(metrics).__name__}; it returns a mapping of metric "
                "names to numbers"
            )
        named = []
        for key, value in metrics.items():
            try:
                named.append((str(key), float(value)))
            except (TypeError, ValueError):
                raise TypeError(
                    f"evaluate's metric {key!r} is {value!r}, not a number"
                ) from None
        return named


def _array(name: str, dtype: str, shape: list[int], values: Any) -> np.ndarray:
    """One variable's values as a NumPy array of its shape."""
    if dtype == "BF16":
        bits = np.frombuffer(values, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    numpy_dtype = _NUMPY_DTYPES.get(dtype)
    if numpy_dtype is None:
        raise CohortError(f"variable {name!r}: dtype {dtype} has no NumPy counterpart")
    return np.frombuffer(values, dtype=numpy_dtype).reshape(shape)
