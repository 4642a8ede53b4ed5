"""Bad input is a clear Python exception naming what is wrong, and nothing is lost."""

from __future__ import annotations

import re

from conftest import JOBS, launch


def test_refused_steps_and_arguments_name_what_is_wrong_and_lose_nothing():
    job = launch(JOBS / "bad_input.py", workers=2, ps=1)
    assert job.code == 0, job.output
    oks = [line for line in job.chief_lines() if line.startswith("ok: ")]
    assert len(oks) == 10, job.output
    assert oks[-1] == "ok: nothing lost (counter 54 after 52 steps, one at rate 3)", job.output


def test_a_variable_shaped_unlike_the_checkpoint_is_refused_naming_it(tmp_path):
    env = {"COHORT_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    first = launch(JOBS / "shapes.py", "--size", "4", workers=1, ps=1, env=env)
    assert first.code == 0, first.output
    assert first.line("saved ").startswith("saved "), first.output
    again = launch(JOBS / "shapes.py", "--size", "4", workers=1, ps=1, env=env)
    assert again.line("restored step 0") == "restored step 0: w = [0.0, 1.0, 2.0, 3.0]"
    other = launch(JOBS / "shapes.py", "--size", "5", workers=1, ps=1, env=env)
    assert other.code == 3, other.output
    error = other.line("CheckpointError: ")
    assert re.search(r'variable "w" was saved as F32 \[4\], this job\'s is F32 \[5\]', error), error
    # The checkpoint is untouched: the job of the first shape still restores it.
    last = launch(JOBS / "shapes.py", "--size", "4", workers=1, ps=1, env=env)
    assert last.line("restored step 0") == "restored step 0: w = [0.0, 1.0, 2.0, 3.0]"
