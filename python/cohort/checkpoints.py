"""Checkpoints of a ``MultiWorkerMirroredStrategy``'s training state: TensorFlow's
``tf.train.CheckpointManager`` and ``PreemptionCheckpointHandler`` for a synchronous job.

A checkpoint holds every variable made in the strategy's scope, the optimizer's slots and step
count, the step and the input's position, in cohort's checkpoint format (atomic, verified on
restore; ``cohort ckpt`` and a sidecar evaluator read it). The first worker writes it; every
worker runs the same calls::

    strategy = cohort.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = cohort.Variable(np.zeros((8, 1)), name="w")
        optimizer = cohort.optimizers.Adam(0.05)
    checkpoints = cohort.CheckpointManager(strategy, checkpoint_interval=100)
    state = cohort.TrainingState()
    checkpoints.restore_or_initialize(state)     # a job started again goes on from its newest
    while state.step < steps:
        if strategy.at_step_boundary(state) == "leaving":  # preempted: saved first
            break
        ...                                       # the step
        state.step += 1
        state.position += global_batch
        checkpoints.save(state)                   # when the interval says so

With checkpoints open, a preemption notice (SIGTERM) is answered as TensorFlow's
``PreemptionCheckpointHandler`` does: at the next step boundary every worker learns it, the
first worker saves the agreed step, then the preempted worker leaves (and, if every worker was
preempted, the job stops at that checkpoint and resumes from it when started again).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from . import _native
from .mirrored import MultiWorkerMirroredStrategy, TrainingState


class CheckpointManager:
    """The checkpoints of ``strategy``'s training state under ``directory`` (default: the
    task's configured checkpoint directory: ``--checkpoint-dir``, ``COHORT_CHECKPOINT_DIR`` or
    ``checkpoint_dir`` in ``cohort.toml``), the newest ``max_to_keep`` kept. With
    ``checkpoint_interval``, :meth:`save` writes one every that many steps; without, only where
    called with ``check_interval=False`` and before a preempted worker leaves. Make it after
    the variables and the optimizer, one per strategy.

    Raises ``ValueError`` where no directory is given or configured, or ``max_to_keep`` or
    ``checkpoint_interval`` is below 1; ``CheckpointError`` where the directory cannot be
    listed."""

    def __init__(
        self,
        strategy: MultiWorkerMirroredStrategy,
        directory: str | os.PathLike[str] | None = None,
        max_to_keep: int = 3,
        checkpoint_interval: int | None = None,
    ) -> None:
        if not isinstance(strategy, MultiWorkerMirroredStrategy):
            raise TypeError(
                f"CheckpointManager keeps a MultiWorkerMirroredStrategy's state, not a "
                f"{type(strategy).__name__}'s (a parameter-server chief saves with "
                f"coordinator.save_checkpoint)"
            )
        if directory is None:
            resolver: Any = strategy.cluster_resolver
            args = resolver.args if resolver is not None else sys.argv[1:]
            directory = _native.checkpoint_dir(args)
            if directory is None:
                raise ValueError(
                    "checkpoint_dir: no checkpoint directory given (directory=) or configured "
                    "(--checkpoint-dir, COHORT_CHECKPOINT_DIR, or checkpoint_dir in cohort.toml)"
                )
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be at least 1, got {max_to_keep}")
        if checkpoint_interval is not None and checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be at least 1, got {checkpoint_interval}")
        self.directory = os.fspath(directory)
        self.max_to_keep = max_to_keep
        self.checkpoint_interval = checkpoint_interval
        self._native = strategy._native
        self._native.open_checkpoints(self.directory, checkpoint_interval, max_to_keep)

    def restore_or_initialize(self, state: TrainingState) -> int | None:
        """On a fresh start, on every worker together: the first worker restores the newest
        checkpoint that verifies (variables, optimizer slots, step and position) and every
        worker takes its state. Returns the step training goes on from, or ``None`` where
        there was no checkpoint (``state`` unchanged). A worker admitted to a live group
        restores nothing: its first ``at_step_boundary`` gives it the group's state.

        A checkpoint of another model (a variable missing, another shape) raises
        ``CheckpointError`` naming it before any variable changes, and stays as it was.
        Raises ``GroupError`` where a worker was lost while the state was handed out."""
        step, position = self._native.restore_checkpoint(state.step, state.position)
        restored = (step, position) != (state.step, state.position)
        state.step, state.position = step, position
        return step if restored else None

    def save(self, state: TrainingState, check_interval: bool = True) -> str | None:
        """Saves ``state`` (with the variables and the optimizer's slots) on the first worker;
        with ``check_interval``, only where ``checkpoint_interval`` says a save is due at
        ``state.step``. Call it on every worker (the others save nothing). Returns the
        checkpoint's directory where this worker saved one. A failed write raises
        ``CheckpointError`` naming the step; the earlier checkpoints stay."""
        return self._native.save_checkpoint(state.step, state.position, check_interval)

    @property
    def latest_step(self) -> int | None:
        """The step of the newest checkpoint saved or restored by this worker."""
        return self._native.last_checkpoint_step()

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({self.directory!r}, max_to_keep={self.max_to_keep}, "
            f"checkpoint_interval={self.checkpoint_interval})"
        )
