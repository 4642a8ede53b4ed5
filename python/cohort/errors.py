"""The exceptions cohort raises.

Every error of cohort's runtime is a :class:`CohortError`; the subclasses say what failed.

One that is no fault of the script but asks for the chief's restart (a parameter server lost
and not recoverable in this run: none checkpointed yet, or lost while the start restored the
servers) carries ``restarts_chief = True`` (every other, ``False``). Left uncaught, it ends the chief with exit code 172
(as a Rust chief's does): its supervisor (``python -m cohort launch``, Kubernetes) restarts it,
and the restarted script resumes from the last checkpoint.
"""

from ._native import (
    CheckpointError,
    ClosureError,
    CohortError,
    StepInterrupted,
    VariableError,
)


class StepNotImportableError(CohortError, ValueError):
    """A function the workers cannot import was given to ``schedule`` (or as a dataset
    function): nothing was scheduled. Workers import a step by its module and name; code never
    travels."""


class ArgumentsError(CohortError, TypeError):
    """A step's arguments (or its value) cannot be pickled: nothing was scheduled."""


class NotInStepError(CohortError, RuntimeError):
    """A worker-side call (reading a variable on a worker, ``next`` on a per-worker iterator)
    was made outside a scheduled step."""


__all__ = [
    "ArgumentsError",
    "CheckpointError",
    "ClosureError",
    "CohortError",
    "NotInStepError",
    "StepInterrupted",
    "StepNotImportableError",
    "VariableError",
]
