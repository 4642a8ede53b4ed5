"""A Python job survives what a Rust job survives: a worker or a parameter server SIGKILLed
mid-training, with every step's update applied once (each counter ends at the steps
scheduled; TensorFlow's tutorial with a PyTorch model, under `cohort chaos run`, to its target
with the runner's exactly-once checks), a stop request (SIGTERM) ends the chief with its
checkpoint and exit 143, and `cohort chaos run` drives a Python job as it drives a Rust one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import EXAMPLES, JOBS, JOB_TIMEOUT_S, chaos_run, launch, launch_command

STEPS = 300


def counters(job) -> list[int]:
    line = job.line("counters")
    return [int(c) for c in re.findall(r"\d+", line.split("]")[0])]


def ledger(job) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", job.line("ledger:"))}


def test_a_worker_sigkilled_mid_training_loses_nothing_and_repeats_nothing():
    job = launch(
        JOBS / "counter.py",
        "--steps",
        str(STEPS),
        "--pause",
        "0.02",
        flags=("--kill-worker-after", "2s"),
    )
    assert job.code == 0, job.output
    assert "chaos: SIGKILL worker/1" in job.output, job.output
    assert counters(job) == [STEPS, STEPS], job.output
    book = ledger(job)
    assert book["scheduled"] == book["committed"] == STEPS, job.output
    assert book["failed"] == 0, job.output


def counter_with_ps_killed(tmp_path, chaos_point: str):
    """The counter job, checkpointing every 50 steps, with ps/0 SIGKILLed at ``chaos_point``
    (the kill's time is only a fallback far past the job's end)."""
    return launch(
        JOBS / "counter.py",
        "--steps",
        str(STEPS),
        "--pause",
        "0.02",
        "--checkpoint-every",
        "50",
        "--chaos-point-at",
        chaos_point,
        flags=("--kill-ps-after", "10m"),
        env={"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")},
    )


def test_a_parameter_server_sigkilled_is_restored_and_every_update_applied_once(tmp_path):
    # Past the checkpoints at steps 0, 50 and 100: the server comes back restored from the one
    # at 100, and the steps committed since run again.
    job = counter_with_ps_killed(tmp_path, "120")
    assert job.code == 0, job.output
    assert "chaos: SIGKILL ps/0" in job.output, job.output
    assert counters(job) == [STEPS, STEPS], job.output
    book = ledger(job)
    assert book["scheduled"] == book["committed"] == STEPS, job.output
    assert book["failed"] == 0 and book["ps_restores"] >= 1, job.output


def test_a_parameter_server_sigkilled_before_the_first_checkpoint_loses_nothing(tmp_path):
    # With no checkpoint yet the server cannot be restored in this run: the chief's script gets
    # an error that asks for its restart and, leaving it uncaught, ends with 172; the launcher
    # restarts the chief, whose start finds nothing applied and begins afresh. Every update
    # is applied once.
    job = counter_with_ps_killed(tmp_path, "first-checkpoint")
    assert job.code == 0, job.output
    assert "chaos: SIGKILL ps/0" in job.output, job.output
    assert "exiting 172" in job.output, job.output
    assert "restarting chief/0" in job.output, job.output
    assert counters(job) == [STEPS, STEPS], job.output
    book = ledger(job)
    assert book["scheduled"] == book["committed"] == STEPS, job.output
    assert book["failed"] == 0, job.output


def test_a_parameter_server_sigkilled_before_the_start_gets_its_variables_again(tmp_path):
    # Killed after the script created its variables and before its start (restore_checkpoint):
    # the chief creates them again on the new process and starts; no chief restart. Every
    # update is applied once.
    job = counter_with_ps_killed(tmp_path, "created")
    assert job.code == 0, job.output
    assert "chaos: SIGKILL ps/0" in job.output, job.output
    assert "lost before the chief's start: creating its 1 variable shard(s) again" in job.output
    assert "exiting 172" not in job.output, job.output
    assert "restarting chief/0" not in job.output, job.output
    assert counters(job) == [STEPS, STEPS], job.output
    book = ledger(job)
    assert book["scheduled"] == book["committed"] == STEPS, job.output
    assert book["failed"] == 0, job.output


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_request_saves_and_exits_143_and_the_next_run_resumes(tmp_path, stop):
    # SIGTERM (a preemption notice) and Ctrl-C (SIGINT, to the whole foreground group as a
    # terminal sends it) alike: the chief's script saves and every task stops, exit 143.
    checkpoints = tmp_path / "checkpoints"
    env = dict(os.environ, COHORT_CHECKPOINT_DIR=str(checkpoints))
    command = launch_command(
        JOBS / "counter.py",
        "--steps",
        "100000",
        "--pause",
        "0.005",
        "--checkpoint-every",
        "100000",
        ps=1,
    )
    job = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    output = []
    try:
        assert job.stdout is not None
        for line in job.stdout:
            output.append(line)
            if "restored: None" in line:
                break
        time.sleep(1.0)
        if stop == signal.SIGINT:
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(stop)
        rest, _ = job.communicate(timeout=JOB_TIMEOUT_S)
        output.append(rest)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    text = "".join(output)
    assert job.returncode == 143, text
    assert "stopped at step" in text, text
    resumed = launch(
        JOBS / "counter.py",
        "--steps",
        "10",
        "--checkpoint-every",
        "100000",
        ps=1,
        env={"COHORT_CHECKPOINT_DIR": str(checkpoints)},
    )
    assert resumed.code == 0, resumed.output
    step = int(re.search(r"stopped at step (\d+)", text).group(1))
    assert resumed.line("restored:") == f"restored: {step}", resumed.output


def test_the_chaos_runner_drives_a_python_job_and_finds_no_violation(tmp_path):
    # `cohort chaos run` launches the Python job as it launches a Rust one, kills a worker, a
    # parameter server and the chief (the script) as the plan says, and checks the runtime's
    # report of the chief that finished.
    plan = (
        "seed = 5\n\n"
        '[[fault]]\nkind = "kill"\ntarget = "worker:1"\nat = "500ms..1s"\n'
        'after = "first_checkpoint"\n\n'
        '[[fault]]\nkind = "kill"\ntarget = "ps:0"\nat = "2s"\nafter = "first_checkpoint"\n\n'
        # The script itself: its restarted process resumes from the newest checkpoint.
        '[[fault]]\nkind = "kill"\ntarget = "chief"\nat = "3500ms"\nafter = "first_checkpoint"\n'
    )
    job = launch_command(
        JOBS / "counter.py",
        "--steps",
        "1200",
        "--pause",
        "0.01",
        "--checkpoint-every",
        "40",
        flags=("--run-dir", str(tmp_path / "job")),
    )
    run = chaos_run(
        tmp_path, plan, job, env={"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    )
    assert run.report["verdict"] == "passed", run.explained()
    assert run.code == 0, run.output
    assert "counters [1200, 1200] after 1200 steps" in run.log, run.log[-6000:]
    assert re.search(r"\[chief/0\] restored: [1-9]\d*", run.log), run.log[-6000:]


def tutorial_under_plan(tmp_path, plan: str, epochs: int, workers: int | str = 2):
    """TensorFlow's parameter-server tutorial with its PyTorch model, checkpointing each epoch
    (30 steps), under ``cohort chaos run`` with ``plan``: the run, once the runner's checks
    (exit code, faults applied, every closure committed once, PS-1) passed and the model
    reached the tutorial's target."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    job = launch_command(
        EXAMPLES / "ps_tutorial_torch.py",
        "--epochs",
        str(epochs),
        "--steps-per-epoch",
        "30",
        "--checkpoints",
        workers=workers,
        flags=("--run-dir", str(tmp_path / "job")),
    )
    run = chaos_run(
        tmp_path, plan, job, env={"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    )
    assert run.report["verdict"] == "passed", run.explained()
    assert run.code == 0, run.output
    final = re.search(r"\[chief/0\] Final loss is [\d.]+, final accuracy is ([\d.]+)", run.log)
    assert final and float(final.group(1)) >= 0.9, run.explained()
    return run


@pytest.mark.parametrize("target", ["worker:1", "ps:0"])
def test_the_pytorch_tutorial_survives_a_kill_with_every_update_applied_once(tmp_path, target):
    # A worker SIGKILLed (its step runs again on the other) or a parameter server SIGKILLed
    # (restored from the newest checkpoint, the steps since run again) mid-training.
    plan = (
        "seed = 7\n\n"
        f'[[fault]]\nkind = "kill"\ntarget = "{target}"\nat = "1s..2s"\n'
        'after = "first_checkpoint"\n'
    )
    run = tutorial_under_plan(tmp_path, plan, epochs=8)
    if target.startswith("ps"):
        counts = run.check("ps applied counts")["detail"]
        assert re.search(r"[1-9]\d* parameter-server restore", counts), run.explained()


def test_the_pytorch_tutorial_scaled_up_and_down_applies_every_update_once(tmp_path):
    # Elastic workers: the launcher asked for a third worker mid-training (it joins and takes
    # steps) and then for two again (the newest is drained: the chief lets its last step
    # finish and keeps its dataset's position; it exits 0).
    plan = (
        "seed = 9\n\n"
        '[[fault]]\nkind = "scale"\nworkers = 3\nat = "300ms"\nafter = "first_checkpoint"\n\n'
        # At the 7th checkpoint (an epoch's end): time for the new worker's script to start,
        # however busy the machine (its steps slow down as much).
        '[[fault]]\nkind = "scale"\nworkers = 2\nat = "0ms"\nafter = "checkpoint:7"\n'
    )
    run = tutorial_under_plan(tmp_path, plan, epochs=12, workers="2:3")
    assert re.search(r"worker/2 up \(incarnation", run.log), run.explained()
    assert re.search(r"worker/2 \(incarnation \d+\) drained: exit code 0", run.log), run.log
