"""What the tests of cohort's Python package share: running a job as a user runs it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
JOBS = TESTS / "jobs"
EXAMPLES = TESTS.parent / "examples"
REPOSITORY = TESTS.parent.parent
# A job on a busy 2-core machine: its start, training and end, with room.
JOB_TIMEOUT_S = 150


class Job:
    """A finished ``python -m cohort launch`` run: its exit code and everything it printed."""

    def __init__(self, code: int, output: str) -> None:
        self.code = code
        self.output = output

    def chief_lines(self) -> list[str]:
        """What the chief's script printed (not its log lines)."""
        lines = []
        for line in self.output.splitlines():
            if line.startswith("[chief/0] ") and " INFO " not in line and " WARN " not in line:
                lines.append(line[len("[chief/0] ") :])
        return lines

    def line(self, prefix: str) -> str:
        """The chief's one printed line starting with ``prefix``."""
        found = [line for line in self.chief_lines() if line.startswith(prefix)]
        assert len(found) == 1, f"no single line {prefix!r} from the chief:\n{self.output}"
        return found[0]


def launch_command(
    script: pathlib.Path,
    *script_args: str,
    workers: int = 2,
    ps: int = 2,
    flags: tuple[str, ...] = (),
) -> list[str]:
    """``python -m cohort launch`` of ``script``, as a user types it (``ps=0``: no ``--ps``
    flag, as a MultiWorkerMirrored job takes none)."""
    servers = ["--ps", str(ps)] if ps else []
    return [
        sys.executable,
        "-m",
        "cohort",
        "launch",
        "--workers",
        str(workers),
        *servers,
        "--no-metrics",
        *flags,
        str(script),
        *script_args,
    ]


def launch(
    script: pathlib.Path,
    *script_args: str,
    workers: int = 2,
    ps: int = 2,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Job:
    """Runs ``script`` as a local cluster (:func:`launch_command`) and waits for its end."""
    command = launch_command(script, *script_args, workers=workers, ps=ps, flags=flags)
    full_env = dict(os.environ)
    full_env.update(env or {})
    # The tests' own checkpoint directory only, never one of the caller's.
    if env is None or "COHORT_CHECKPOINT_DIR" not in env:
        full_env.pop("COHORT_CHECKPOINT_DIR", None)
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=JOB_TIMEOUT_S,
            env=full_env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script.name} ran past {JOB_TIMEOUT_S} s:\n{e.output}")
    return Job(done.returncode, done.stdout)
