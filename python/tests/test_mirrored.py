"""MultiWorkerMirrored from Python: every worker ends with the same weights, and an elastic
loop survives a worker SIGKILLed mid-training (the survivors re-form, its new process is
admitted with their state) and a preempted worker (it leaves at an agreed step, exits 143 and
comes back), saving a checkpoint first where checkpoints are open."""

from __future__ import annotations

import re

import pytest

from conftest import JOBS, chaos_run, launch, launch_command


def test_a_multi_worker_mirrored_script_ends_with_the_same_weights_on_every_worker():
    job = launch(
        JOBS / "mirrored.py",
        "--steps",
        "60",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored"),
    )
    assert job.code == 0, job.output
    digests = {}
    for kind in ("start", "final"):
        digests[kind] = {
            line.split("]")[0]: line.rsplit(" ", 1)[1]
            for line in job.output.splitlines()
            if f"] {kind} digest " in line
        }
        # The chief and both workers, each with the same weights.
        assert len(digests[kind]) == 3, job.output
        assert len(set(digests[kind].values())) == 1, job.output
    assert digests["start"] != digests["final"], job.output
    losses = re.findall(r"final loss (\S+) on 3 workers", job.output)
    assert len(losses) == 3 and float(losses[0]) < 0.01, job.output


@pytest.mark.parametrize("optimizer", ["hand", "adam"])
def test_a_mirrored_worker_killed_mid_training_is_left_out_then_admitted_with_the_state(
    tmp_path, optimizer
):
    job = launch(
        JOBS / "mirrored_elastic.py",
        "--optimizer",
        optimizer,
        "--steps",
        "150",
        "--pause",
        "0.005",
        # Until the restarted worker is back: time for its new process to start and be
        # admitted before the others reach the last step, however busy the machine.
        "--pause-while-short",
        "0.1",
        "--die-at",
        "40",
        "--marker",
        str(tmp_path / "died"),
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored"),
    )
    assert job.code == 0, job.output
    assert (tmp_path / "died").exists(), job.output
    # The survivors re-formed without it, from step 40 (no checkpoint read)...
    assert re.search(r"\[chief/0\] recovered: generation \d+ with 2 workers", job.output), job.output
    # ...and its new process joined them and took their state.
    assert re.search(r"\[worker/1\] group admitted at step \d+", job.output), job.output
    finals = dict(re.findall(r"\[(\S+)\] final model: step 150, digest (\w+)", job.output))
    assert sorted(finals) == ["chief/0", "worker/0", "worker/1"], job.output
    assert len(set(finals.values())) == 1, job.output


def test_a_preempted_mirrored_worker_leaves_at_a_boundary_exits_143_and_comes_back(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = launch(
        JOBS / "mirrored_elastic.py",
        "--steps",
        "150",
        "--pause",
        "0.005",
        # Until the restarted worker is back: time for its new process to start and be
        # admitted before the others reach the last step, however busy the machine.
        "--pause-while-short",
        "0.1",
        "--die-at",
        "40",
        "--marker",
        str(tmp_path / "noticed"),
        "--signal",
        "term",
        "--checkpoints",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored"),
        env={"COHORT_CHECKPOINT_DIR": str(ckpt)},
    )
    assert job.code == 0, job.output
    # It left at an agreed step, the others went on without it (nothing to detect)...
    leaving = re.search(r"\[worker/1\] group leaving at step (\d+)", job.output)
    assert leaving, job.output
    # ...after the first worker saved that step (the checkpoints are open, and none is due on
    # a schedule: this is the preemption's own)...
    assert (ckpt / f"ckpt-{leaving.group(1)}").is_dir(), (sorted(ckpt.iterdir()), job.output)
    assert re.search(r"\[chief/0\] group departed at step \d+", job.output), job.output
    assert re.search(r"worker/1 .*left on a preemption notice \(exit code 143\)", job.output), job.output
    # ...and its restarted process was admitted with their state.
    assert re.search(r"\[worker/1\] group admitted at step \d+", job.output), job.output
    finals = dict(re.findall(r"\[(\S+)\] final model: step 150, digest (\w+)", job.output))
    assert sorted(finals) == ["chief/0", "worker/0", "worker/1"], job.output
    assert len(set(finals.values())) == 1, job.output


def test_the_chaos_runner_drives_a_mirrored_python_job_to_one_model(tmp_path):
    # `cohort chaos run` kills one worker and preempts another of a MultiWorkerMirrored script
    # (with cohort's Adam, whose moments must follow the weights): the runtime writes each
    # task's final model and the chief's group generations, and the runner finds one model.
    plan = (
        "seed = 9\n\n"
        '[[fault]]\nkind = "kill"\ntarget = "worker:1"\nat = "1500ms..2s"\n\n'
        '[[fault]]\nkind = "term"\ntarget = "worker:0"\nat = "4s..4500ms"\n'
    )
    job = launch_command(
        JOBS / "mirrored_elastic.py",
        "--optimizer",
        "adam",
        "--steps",
        "900",
        "--pause",
        "0.01",
        workers=2,
        ps=0,
        flags=("--strategy", "multi-worker-mirrored", "--run-dir", str(tmp_path / "job")),
    )
    run = chaos_run(tmp_path, plan, job)
    assert run.report["verdict"] == "passed", run.explained()
    assert run.check("one model")["status"] == "passed", run.explained()
    assert "3 worker(s) ended at step 900" in run.check("one model")["detail"], run.explained()
    assert run.check("group generations")["status"] == "passed", run.explained()
    assert run.code == 0, run.output
