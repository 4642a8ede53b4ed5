"""Where this process stands in its job: TensorFlow's ``TFConfigClusterResolver``.

cohort reads a task's configuration in layers: flags among the script's arguments
(``--task-type``, ``--task-index``...), the environment (``COHORT_TASK_TYPE``...), ``TF_CONFIG``
(TensorFlow's format, which ``python -m cohort launch`` and Kubernetes' TFJob set), then
``cohort.toml``. The resolver reports what those layers give; it changes nothing.
"""

from __future__ import annotations

import json
import os
import sys

from . import _native


class TFConfigClusterResolver:
    """The cluster and this process's task, from ``TF_CONFIG`` and cohort's other layers.

    ``args`` are the configuration flags to read (default: the script's arguments).
    A missing or bad configuration raises ``ValueError`` naming the key.
    """

    def __init__(self, args: list[str] | None = None) -> None:
        self._args = list(sys.argv[1:] if args is None else args)
        try:
            task_type, index, workers, ps = _native.task(self._args)
        except ValueError as e:
            raise ValueError(
                f"{e}\n(run the script with `python -m cohort launch --workers 2 --ps 2 "
                f"{os.path.basename(sys.argv[0]) or 'train.py'}`, or give it TF_CONFIG and "
                "COHORT_CERTS as a cluster manager does)"
            ) from None
        self.task_type: str = task_type
        self.task_id: int = index
        self._num_workers = workers
        self._num_ps = ps

    @property
    def args(self) -> list[str]:
        """The arguments the configuration was read from."""
        return list(self._args)

    @property
    def num_workers(self) -> int:
        """Workers the cluster names."""
        return self._num_workers

    @property
    def num_ps(self) -> int:
        """Parameter servers the cluster names."""
        return self._num_ps

    def cluster_spec(self) -> dict[str, list[str]]:
        """The cluster's jobs and addresses as ``TF_CONFIG`` gives them (empty without it)."""
        text = os.environ.get("TF_CONFIG", "").strip()
        if not text:
            return {}
        return dict(json.loads(text).get("cluster", {}))

    def __repr__(self) -> str:
        return (
            f"TFConfigClusterResolver(task_type={self.task_type!r}, task_id={self.task_id}, "
            f"workers={self._num_workers}, ps={self._num_ps})"
        )
