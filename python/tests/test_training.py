"""Jobs that train: the quick start, TensorFlow's parameter-server tutorial in NumPy and in
PyTorch, each reaching its target, and the documents' examples as written."""

from __future__ import annotations

import pathlib
import re

import pytest

from conftest import EXAMPLES, JOBS, REPOSITORY, launch


def test_the_quick_start_pulls_every_weight_to_its_target():
    job = launch(JOBS / "quickstart.py", workers=2, ps=1)
    assert job.code == 0, job.output
    first, last = re.fullmatch(r"first loss (\S+), last loss (\S+)", job.line("first loss")).groups()
    # w starts at zeros (loss 4); training is asynchronous, so the first closure may read a w
    # that later ones moved already: never a larger loss than at the start, though.
    assert 0.0 < float(first) <= 4.0 + 1e-6
    assert float(last) < 1e-4
    weights = [float(w) for w in re.findall(r"[-\d.e]+", job.line("w = ")[4:])]
    assert weights == pytest.approx([1.0] * 4, abs=1e-3)


def tutorial_accuracy(job) -> float:
    assert job.code == 0, job.output
    final = job.line("Final loss is")
    ledger = job.line("ledger:")
    assert ledger == "ledger: 21 scheduled, 21 committed, 0 failed", job.output
    return float(final.rsplit(" ", 1)[1])


def test_the_tensorflow_tutorial_in_numpy_trains_to_its_target():
    job = launch(EXAMPLES / "ps_tutorial.py", workers=2, ps=2)
    assert tutorial_accuracy(job) >= 0.9, job.output


def test_the_tensorflow_tutorial_with_a_pytorch_model_trains_to_its_target():
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    job = launch(EXAMPLES / "ps_tutorial_torch.py", workers=2, ps=2)
    assert tutorial_accuracy(job) >= 0.9, job.output


def python_blocks(document: pathlib.Path) -> list[str]:
    """The ```python blocks of a document, in order."""
    return re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.S)


@pytest.mark.parametrize("document", ["README.md", "docs/python.md"])
def test_the_documents_first_python_example_runs_as_written(document, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(python_blocks(REPOSITORY / document)[0])
    job = launch(script, workers=2, ps=1)
    assert job.code == 0, job.output
    assert job.chief_lines(), job.output


def test_the_benchmark_job_from_python_runs_and_reports_its_rate():
    # What `cohort bench ps --peers` runs for cohort from Python (benches/peers/).
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    import json
    import subprocess
    import sys

    program = REPOSITORY / "benches" / "peers" / "cohort_python_ps.py"
    for compute in ("torch", "numpy"):
        done = subprocess.run(
            [sys.executable, str(program), "--steps", "5", "--warmup", "1", "--compute", compute],
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        line = json.loads(done.stdout.strip().splitlines()[-1])
        assert line["peer"] == f"cohort-python-{compute}", line
        assert line["steps_per_second"] > 0, line


def test_values_read_from_the_servers_and_a_steps_arguments_and_value_are_lent_without_a_copy():
    job = launch(JOBS / "values.py")
    assert job.code == 0, job.output
    lines = job.chief_lines()
    checks = [
        line for line in lines if line.startswith(("step ", "chief ", "servers ", "payload "))
    ]
    assert checks, job.output
    failed = [line for line in checks if not line.endswith(": True")]
    assert not failed, job.output
    for check in ("shape", "dtype", "rows", "lent", "writable", "private"):
        assert f"step {check}: True" in lines, job.output
    # A step's arguments and its value: unpickled as views of the runtime's message.
    for check in ("argument lent", "argument writable", "argument values", "value lent"):
        assert f"payload {check}: True" in lines, job.output
    for check in ("value", "value writable", "sent unchanged"):
        assert f"payload {check}: True" in lines, job.output


def test_each_name_scope_is_updated_by_its_own_optimizer():
    job = launch(JOBS / "scoped.py", workers=1, ps=2)
    assert job.code == 0, job.output
    lines = job.chief_lines()
    # 3 updates each: the longest scope's rate (1, 0.5) or schedule (1 + 0.5 + 0.25), else the
    # job's schedule (0.1 + 0.05 + 0.025); `wider` is in no scope though it begins like `wide`.
    for expected in (
        "wide/kernel = [3.0, 3.0]",
        "wide/bias = [1.5]",
        "deep = [0.175, 0.175]",
        "wider = [0.175]",
        "decayed/kernel = [1.75, 1.75]",
    ):
        assert expected in lines, job.output


def test_the_runtime_goes_on_while_the_script_holds_the_interpreter():
    # The chief's script spins in pure Python for 5 s after scheduling 30 steps: the runtime's
    # threads dispatch, run and commit them all meanwhile (none waits for the interpreter).
    job = launch(JOBS / "gil.py", ps=1)
    assert job.code == 0, job.output
    assert job.line("done while") == "done while the script held the interpreter: True", job.output
    assert job.line("results:") == "results: 30", job.output
    assert job.line("values:") == "values: [31.0, 31.0, 31.0, 31.0]", job.output
