"""What the tests of cohort's Python package share: running a job as a user runs it."""

from __future__ import annotations

import json
import os
import pathlib
import re
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
    workers: int | str = 2,
    ps: int = 2,
    flags: tuple[str, ...] = (),
) -> list[str]:
    """``python -m cohort launch`` of ``script``, as a user types it (``workers``: a count, or
    ``"MIN:MAX"`` for a job that scales; ``ps=0``: no ``--ps`` flag, as a MultiWorkerMirrored
    job takes none)."""
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


class ChaosRun:
    """A finished ``cohort chaos run``: its exit code and output, its report (JSON) and the
    job's log."""

    def __init__(self, done: subprocess.CompletedProcess, out: pathlib.Path) -> None:
        self.code = done.returncode
        self.output = done.stdout + done.stderr
        report_file = out / "report.json"
        assert report_file.is_file(), self.output
        self.report = json.loads(report_file.read_text())
        log = out / "job.log"
        self.log = log.read_text() if log.is_file() else ""

    def check(self, name: str) -> dict:
        """The report's check ``name``."""
        found = [c for c in self.report["checks"] if c["name"] == name]
        assert len(found) == 1, json.dumps(self.report, indent=1)
        return found[0]

    def explained(self) -> str:
        """Why the run failed, for an assertion's message: first the failed checks and the
        job's telling lines (a traceback, a warning or error, what the chief's script printed),
        then the whole report and the end of the log. A CI log keeps only the head and tail
        of a long message: the telling part comes first."""
        failed = [
            f"{c['name']}: {c['detail']}" for c in self.report["checks"] if c["status"] != "passed"
        ]
        return "\n".join(
            [
                "failed checks: " + ("; ".join(failed) or "none"),
                f"exit code {self.report.get('exit_code')}",
                "the job's telling lines:",
                *self.telling_lines()[-60:],
                "the report:",
                json.dumps(self.report, indent=1),
                "the end of the job's log:",
                self.log[-6000:],
            ]
        )

    def telling_lines(self) -> list[str]:
        """The log's lines that say why a job ended as it did: a traceback's, a warning's or
        an error's, and the chief's printed lines (those without a log level)."""
        telling = []
        in_traceback = False
        for line in self.log.splitlines():
            body = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
            if body.startswith("Traceback"):
                in_traceback = True
            elif in_traceback and not body.startswith((" ", "\t")):
                in_traceback = False
                telling.append(line)
                continue
            level = re.search(r"Z\s+(INFO|WARN|ERROR|DEBUG)\s", body)
            chief_print = line.startswith("[chief/") and level is None
            if in_traceback or chief_print or (level and level.group(1) in ("WARN", "ERROR")):
                telling.append(line)
        return telling


def chaos_run(
    tmp_path: pathlib.Path,
    plan: str,
    job: list[str],
    env: dict[str, str] | None = None,
) -> ChaosRun:
    """Runs ``job`` (a launch command) under ``cohort chaos run`` with the fault plan ``plan``
    (TOML), as a user runs it; skips where the cohort binary was not built (``COHORT_BIN``)."""
    cohort_bin = os.environ.get("COHORT_BIN")
    if not cohort_bin or not os.path.isfile(cohort_bin):
        pytest.skip("the cohort binary was not built here (cargo build): COHORT_BIN unset")
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(plan)
    out = tmp_path / "chaos"
    command = [cohort_bin, "chaos", "run", "--plan", str(plan_file), "--out", str(out)]
    command += ["--timeout", "150s", "--", *job]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=JOB_TIMEOUT_S + 60,
    )
    return ChaosRun(done, out)
