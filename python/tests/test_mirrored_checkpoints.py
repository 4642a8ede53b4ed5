"""Checkpoints of a MultiWorkerMirrored script's training state (``cohort.CheckpointManager``):
a job started again resumes from its newest checkpoint to the weights of a job never stopped; a
job whose every worker is preempted stops at a checkpoint and resumes from it; a checkpoint of
another model is refused by name and kept."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import threading

from conftest import JOB_TIMEOUT_S, JOBS, launch, launch_command


def _finals(job, steps: int) -> dict[str, str]:
    return dict(re.findall(rf"\[(\S+)\] final model: step {steps}, digest (\w+)", job.output))


def test_a_mirrored_job_started_again_resumes_from_its_checkpoint_to_the_weights_of_one_never_stopped(
    tmp_path,
):
    def run(steps: int, ckpt: pathlib.Path):
        return launch(
            JOBS / "mirrored_elastic.py",
            "--optimizer",
            "adam",
            "--steps",
            str(steps),
            "--pause",
            "0",
            "--checkpoints",
            "--checkpoint-every",
            "20",
            workers=2,
            ps=0,
            flags=("--strategy", "multi-worker-mirrored"),
            env={"COHORT_CHECKPOINT_DIR": str(ckpt)},
        )

    first = run(60, tmp_path / "ckpt")
    assert first.code == 0, first.output
    assert "resumed from step" not in first.output, first.output
    # The first worker alone saved, every 20 steps, the newest 3 kept.
    assert re.findall(r"\[chief/0\] saved step (\d+)", first.output) == ["20", "40", "60"], first.output
    assert "[worker/" not in " ".join(re.findall(r"\[\S+\] saved step", first.output))
    again = run(100, tmp_path / "ckpt")
    assert again.code == 0, again.output
    # Every worker goes on from step 60: the variables, Adam's moments and step count, the
    # input's position...
    for task in ("chief/0", "worker/0", "worker/1"):
        assert f"[{task}] resumed from step 60" in again.output, again.output
    # ...so it ends with the bits of a job that trained 100 steps at once.
    never_stopped = run(100, tmp_path / "fresh")
    assert never_stopped.code == 0, never_stopped.output
    resumed, straight = _finals(again, 100), _finals(never_stopped, 100)
    assert sorted(resumed) == ["chief/0", "worker/0", "worker/1"], again.output
    assert set(resumed.values()) == set(straight.values()), (again.output, never_stopped.output)
    assert len(set(resumed.values())) == 1, again.output


def test_a_job_whose_every_worker_is_preempted_stops_at_a_checkpoint_and_resumes_from_it(tmp_path):
    # As a node pool going away does: SIGTERM to the launcher reaches every task. At the next
    # step boundary every worker learns it, the first saves the agreed step, all leave, and
    # the job exits 143; started again, it goes on from that step.
    ckpt = tmp_path / "ckpt"
    command = launch_command(
        JOBS / "mirrored_elastic.py",
        "--steps",
        "100000",
        "--pause",
        "0.01",
        "--checkpoints",
        "--checkpoint-every",
        "25",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored"),
    )
    env = dict(os.environ, COHORT_CHECKPOINT_DIR=str(ckpt))
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    seen = []
    # A job that hangs silently is killed: the test fails on its output, never waits forever.
    watchdog = threading.Timer(JOB_TIMEOUT_S, job.kill)
    watchdog.start()
    try:
        # Training, with a scheduled checkpoint behind it: then the notice.
        for line in job.stdout:
            seen.append(line)
            if "[chief/0] saved step 50" in line:
                break
        job.send_signal(signal.SIGTERM)
        rest, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        watchdog.cancel()
        if job.poll() is None:
            job.kill()
            job.wait()
    output = "".join(seen) + rest
    assert job.returncode == 143, output
    left = set(re.findall(r"\[(\S+)\] group leaving at step (\d+)", output))
    assert {task for task, _ in left} == {"chief/0", "worker/0", "worker/1"}, output
    # The notice may reach the tasks a step apart: those that learn it first leave first (the
    # first worker saving their step), and the others train on to the next boundary, where the
    # new first worker saves again. The newest checkpoint holds the last step trained.
    step = max(int(step) for _, step in left)
    assert step >= 50 and (ckpt / f"ckpt-{step}").is_dir(), (sorted(ckpt.iterdir()), output)
    for at in {s for _, s in left}:
        assert len(set(re.findall(rf"final model: step {at}, digest (\w+)", output))) == 1, output
    again = launch(
        JOBS / "mirrored_elastic.py",
        "--steps",
        str(step + 10),
        "--pause",
        "0",
        "--checkpoints",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored"),
        env={"COHORT_CHECKPOINT_DIR": str(ckpt)},
    )
    assert again.code == 0, again.output
    for task in ("chief/0", "worker/0", "worker/1"):
        assert f"[{task}] resumed from step {step}" in again.output, again.output
    assert len(set(_finals(again, step + 10).values())) == 1, again.output


def test_a_checkpoint_of_another_model_is_refused_by_name_and_kept(tmp_path):
    ckpt = tmp_path / "ckpt"

    def run(features: int):
        return launch(
            JOBS / "mirrored_elastic.py",
            "--steps",
            "20",
            "--pause",
            "0",
            "--features",
            str(features),
            "--checkpoints",
            "--checkpoint-every",
            "10",
            workers=2,
            ps=0,
            flags=("--strategy", "multi-worker-mirrored"),
            env={"COHORT_CHECKPOINT_DIR": str(ckpt)},
        )

    saved = run(8)
    assert saved.code == 0, saved.output
    before = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-"))
    assert before == ["ckpt-10", "ckpt-20"], before
    other = run(4)
    assert other.code != 0, other.output
    assert "CheckpointError" in other.output, other.output
    assert re.search(r"w has shape \[8, 1\] there, \[4, 1\] here", other.output), other.output
    assert "final model" not in other.output, other.output
    # Nothing of the checkpoints was touched: the first model resumes from them.
    after = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-"))
    assert after == before, after
    resumed = run(8)
    assert resumed.code == 0, resumed.output
    assert "[chief/0] resumed from step 20" in resumed.output, resumed.output


def test_a_sidecar_evaluator_evaluates_a_mirrored_jobs_checkpoints_as_the_chief_saved_them(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = launch(
        JOBS / "mirrored_elastic.py",
        "--steps",
        "80",
        "--pause",
        "0.01",
        "--checkpoints",
        "--checkpoint-every",
        "20",
        "--wait-for-evaluator",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored", "--evaluators", "1"),
        env={"COHORT_CHECKPOINT_DIR": str(ckpt)},
    )
    assert job.code == 0, job.output
    saved = {
        int(step): float(w_sum)
        for step, w_sum in re.findall(r"\[chief/0\] saved step (\d+): w_sum=(\S+)", job.output)
    }
    assert sorted(saved) == [20, 40, 60, 80], job.output
    # What the evaluator task's function returned for a checkpoint is what the chief saved.
    evaluated = {
        int(step): float(w_sum)
        for step, w_sum in re.findall(
            r"\[evaluator/0\].*step (\d+): distance=\S+ w_sum=(\S+)", job.output
        )
    }
    assert evaluated, job.output
    for step, w_sum in evaluated.items():
        assert abs(w_sum - saved[step]) <= 1e-6 * max(1.0, abs(saved[step])), (step, job.output)
    # The evaluator is no member of the workers' group: three tasks trained to one model.
    finals = _finals(job, 80)
    assert sorted(finals) == ["chief/0", "worker/0", "worker/1"], job.output
    assert len(set(finals.values())) == 1, job.output
