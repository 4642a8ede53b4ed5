"""The sidecar evaluator from Python: an evaluator task evaluates each new checkpoint with the
script's function, as cohort's evaluator role does for a Rust program."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

from conftest import EXAMPLES, JOB_TIMEOUT_S, JOBS, launch

SCRIPT = JOBS / "evaluated.py"
CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}


def evaluator(
    *script_args: str,
    env: dict[str, str],
    task_type: str = "evaluator",
    command: list[str] | None = None,
    script: pathlib.Path = SCRIPT,
) -> subprocess.CompletedProcess:
    """The script (or ``command``, Python's arguments) run as a cluster manager runs an
    evaluator task: its role in ``TF_CONFIG``."""
    full_env = dict(os.environ)
    full_env.pop("COHORT_CHECKPOINT_DIR", None)
    full_env.update(env)
    full_env["TF_CONFIG"] = json.dumps(
        {"cluster": CLUSTER, "task": {"type": task_type, "index": 0}}
    )
    return subprocess.run(
        [sys.executable, *(command or [str(script), *script_args])],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env=full_env,
    )


def metrics_by_step(log: str) -> dict[int, dict[str, float]]:
    """The evaluator's log lines ``step N: name=value ...``, by step."""
    found: dict[int, dict[str, float]] = {}
    for match in re.finditer(r"step (\d+): ((?:\S+=\S+ ?)+)", log):
        pairs = dict(pair.split("=", 1) for pair in match.group(2).split())
        found[int(match.group(1))] = {k: float(v) for k, v in pairs.items()}
    return found


def trained_checkpoints(tmp_path: pathlib.Path) -> tuple[dict[str, str], dict[int, dict[str, float]]]:
    """Trains the job (2 workers, 2 servers), saving at steps 10 and 20; returns the
    evaluator's settings for its checkpoint directory and what the chief saved, by step."""
    checkpoints = tmp_path / "checkpoints"
    env = {"COHORT_CHECKPOINT_DIR": str(checkpoints)}
    job = launch(SCRIPT, "--steps", "20", "--checkpoint-every", "10", env=env)
    assert job.code == 0, job.output
    saved = {}
    for line in job.chief_lines():
        match = re.match(r"saved step (\d+): distance=(\S+) w_sum=(\S+)", line)
        if match:
            saved[int(match.group(1))] = {
                "distance": float(match.group(2)),
                "w_sum": float(match.group(3)),
            }
    assert sorted(saved) == [10, 20], job.output
    return env, saved


def test_a_sidecar_evaluator_evaluates_each_checkpoint_with_the_scripts_function(tmp_path):
    env, saved = trained_checkpoints(tmp_path)
    done = evaluator(env=dict(env, COHORT_EVAL_UNTIL_STEP="20", COHORT_EVAL_IDLE_TIMEOUT="20s"))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "evaluator: stopped by itself" in done.stdout, log
    evaluated = metrics_by_step(log)
    # The newest checkpoint first (step 20 reaches the until-step: the evaluator stops there).
    assert 20 in evaluated, log
    for step, metrics in evaluated.items():
        assert metrics["distance"] == saved[step]["distance"], log
        assert metrics["w_sum"] == saved[step]["w_sum"], log
        # `w` whole (its two parts put together) in its shape and dtype.
        assert metrics["shape"] == 64 and metrics["dtype_is_f32"] == 1, log
    assert (pathlib.Path(env["COHORT_CHECKPOINT_DIR"]) / "logs" / "eval").is_dir(), log


def test_an_evaluation_that_raises_is_the_scripts_own_exception_naming_the_checkpoint(tmp_path):
    env, _ = trained_checkpoints(tmp_path)
    done = evaluator("--fail-at-step", "20", env=env)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "ValueError: no model to judge at step 20" in done.stderr, log
    assert "ckpt-20" in log, log
    assert "stopped by itself" not in done.stdout, log
    # A metric that is no number is a TypeError naming it.
    done = evaluator("--bad-metric", env=env)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "TypeError: evaluate's metric 'distance' is 'far', not a number" in done.stderr, log


def test_a_sidecar_evaluator_names_a_missing_directory_and_a_task_that_is_no_evaluator(tmp_path):
    done = evaluator(env={})
    assert done.returncode == 1, done.stderr
    assert "ValueError: checkpoint_dir: the evaluator needs the checkpoint directory" in done.stderr
    # On a worker's task (as a script that forgot to look at its task type would).
    done = evaluator(
        env={"COHORT_CHECKPOINT_DIR": str(tmp_path), "COHORT_CERTS": str(tmp_path)},
        task_type="worker",
        command=[
            "-c",
            "import cohort; cohort.SidecarEvaluator(lambda step, v: {}).start()",
        ],
    )
    assert done.returncode == 1, done.stderr
    assert "ValueError: task.type: this process is a worker task" in done.stderr, done.stderr
    done = evaluator(env={"COHORT_CHECKPOINT_DIR": str(tmp_path)}, command=["-c", NOT_CALLABLE])
    assert "TypeError: evaluate: 3 is not callable" in done.stderr, done.stderr


NOT_CALLABLE = "import cohort; cohort.SidecarEvaluator(3)"


def test_an_evaluator_stops_when_no_new_checkpoint_comes(tmp_path):
    done = evaluator(
        env={"COHORT_CHECKPOINT_DIR": str(tmp_path), "COHORT_EVAL_IDLE_TIMEOUT": "1s"}
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "no new checkpoint for" in log, log
    assert "evaluator: stopped by itself" in done.stdout, log


def test_the_tutorials_sidecar_evaluator_finds_the_trained_model_accurate(tmp_path):
    env = {"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    tutorial = EXAMPLES / "ps_tutorial.py"
    job = launch(tutorial, "--save-checkpoints", env=env)
    assert job.code == 0, job.output
    done = evaluator(script=tutorial, env=dict(env, COHORT_EVAL_UNTIL_STEP="20"))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    evaluated = metrics_by_step(log)
    # The newest checkpoint, the end of the fourth epoch, on the held-out rows.
    assert evaluated[20]["accuracy"] >= 0.9, log


def test_launch_starts_an_evaluator_task_beside_the_job(tmp_path):
    env = {"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    job = launch(
        SCRIPT,
        "--steps",
        "40",
        "--checkpoint-every",
        "10",
        "--wait-for-evaluator",
        flags=("--evaluators", "1"),
        env=env,
    )
    assert job.code == 0, job.output
    # The evaluator task ran the script's function on a checkpoint while the job trained (its
    # marker; the job ended once it was there, and the launcher stopped the evaluator).
    assert (tmp_path / "evaluated").is_file(), job.output
    assert any(
        line.startswith("[evaluator/0]") and "watching" in line
        for line in job.output.splitlines()
    ), job.output
