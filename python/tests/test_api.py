"""The package's checks that need no cluster: launch's arguments, step references, the
partitioners and the resolver's message without a cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cohort
from cohort import _steps
from cohort.__main__ import split_launch_args, strategy_of
from conftest import JOBS


def module_level_step(x):
    return x


def test_launch_flags_end_at_the_script():
    assert split_launch_args(["--workers", "2", "--ps", "1", "train.py", "--epochs", "3"]) == (
        ["--workers", "2", "--ps", "1"],
        ["train.py", "--epochs", "3"],
    )
    assert split_launch_args(["--no-metrics", "--workers=3", "t.py"]) == (
        ["--no-metrics", "--workers=3"],
        ["t.py"],
    )
    assert split_launch_args(["--workers", "2", "--", "-weird.py"]) == (
        ["--workers", "2"],
        ["-weird.py"],
    )


def test_the_strategy_flag_chooses_the_job_and_goes_no_further():
    assert strategy_of(["--strategy", "multi-worker-mirrored", "--workers", "2"]) == (
        True,
        ["--workers", "2"],
    )
    assert strategy_of(["--strategy=parameter-server"]) == (False, [])
    with pytest.raises(ValueError, match="not one of"):
        strategy_of(["--strategy", "ring"])


def test_a_step_is_referenced_by_module_and_name():
    assert _steps.reference(module_level_step) == (__name__, "module_level_step")
    assert _steps.resolve((__name__, "module_level_step")) is module_level_step


def test_steps_the_workers_cannot_import_are_refused_naming_them():
    with pytest.raises(cohort.StepNotImportableError, match="lambda"):
        _steps.reference(lambda x: x)

    def nested(x):
        return x

    with pytest.raises(cohort.StepNotImportableError, match="nested.*inside a function"):
        _steps.reference(nested)
    with pytest.raises(cohort.StepNotImportableError, match="no_such_module"):
        _steps.resolve(("no_such_module", "f"))
    with pytest.raises(cohort.StepNotImportableError, match="has no 'missing'"):
        _steps.resolve((__name__, "missing"))


def test_arguments_that_cannot_be_pickled_are_named():
    with pytest.raises(cohort.ArgumentsError, match="argument 1 \\(generator\\)"):
        _steps.encode((__name__, "module_level_step"), (1, (i for i in range(3))), {})
    with pytest.raises(cohort.ArgumentsError, match="argument 'fn'"):
        _steps.encode((__name__, "module_level_step"), (), {"fn": lambda: 1})


def test_partitioners_refuse_bad_sizes():
    assert cohort.partitioners.FixedShardsPartitioner(2).spec() == ("fixed", 2, 0)
    assert cohort.partitioners.MinSizePartitioner(1024, 4).spec() == ("min_size", 1024, 4)
    with pytest.raises(ValueError, match="num_shards"):
        cohort.partitioners.FixedShardsPartitioner(0)
    with pytest.raises(ValueError):
        cohort.partitioners.MaxSizePartitioner(0)


def test_variables_are_made_under_a_scope_only():
    with pytest.raises(cohort.CohortError, match="strategy.scope"):
        cohort.Variable([1.0, 2.0])


def test_checkpoints_keep_a_mirrored_strategys_state_only():
    with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy.*coordinator.save_checkpoint"):
        cohort.CheckpointManager(object())


def test_outside_a_step_a_worker_call_says_where_it_belongs():
    with pytest.raises(cohort.NotInStepError, match="coordinator.schedule"):
        cohort.read_variables([])


def test_without_a_cluster_the_resolver_says_how_to_start_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "COHORT_"))}
    done = subprocess.run(
        [sys.executable, "-c", "import cohort; cohort.cluster_resolver.TFConfigClusterResolver()"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    assert "no cluster given" in done.stderr and "python -m cohort launch" in done.stderr


def test_launch_refuses_a_missing_script_and_bad_flags():
    missing = subprocess.run(
        [sys.executable, "-m", "cohort", "launch", "--workers", "2", "nowhere.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "nowhere.py" in missing.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "cohort", "launch", "--workers", "zero", __file__],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--workers" in bad.stderr + bad.stdout
    strategy = subprocess.run(
        [sys.executable, "-m", "cohort", "launch", "--strategy", "mirrored", __file__],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert strategy.returncode == 2 and "--strategy 'mirrored'" in strategy.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "cohort"], capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_launch_help_speaks_of_the_python_launcher_and_lists_the_flags():
    for flag in ("--help", "-h"):
        done = subprocess.run(
            [sys.executable, "-m", "cohort", "launch", flag],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("python -m cohort launch") == 1, done.stdout
        for named in ("--strategy", "--workers", "--ps", "--run-dir", "SCRIPT"):
            assert named in done.stdout, done.stdout
        assert "Usage: launch" not in done.stdout, done.stdout


def test_the_optimizers_name_their_kind():
    assert cohort.optimizers.SGD(0.1).spec() == ("sgd", 0.1, {})
    assert cohort.optimizers.RMSprop(0.01, momentum=0.5).spec() == (
        "rmsprop",
        0.01,
        {"rho": 0.9, "momentum": 0.5},
    )
    assert cohort.optimizers.Ftrl(0.1, l1_regularization_strength=0.01).spec() == (
        "ftrl",
        0.1,
        {"l1": 0.01, "l2": 0.0},
    )
    assert cohort.optimizers.SGD(0.1, momentum=0.9).spec()[0] == "momentum"
    assert cohort.optimizers.SGD(0.1, momentum=0.9, nesterov=True).spec()[0] == "nesterov"
    assert cohort.optimizers.Adam(0.01).spec()[0] == "adam"


def test_schedules_give_keras_rates_and_a_bad_one_is_named():
    schedules = cohort.optimizers.schedules
    assert schedules.ExponentialDecay(0.1, 10, 0.5)(10) == pytest.approx(0.05)
    assert schedules.ExponentialDecay(0.1, 10, 0.5)(5) == pytest.approx(0.1 * 0.5**0.5)
    assert schedules.ExponentialDecay(0.1, 10, 0.5, staircase=True)(19) == pytest.approx(0.05)
    piecewise = schedules.PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    rates = [piecewise(t) for t in (0, 10, 11, 20, 21)]
    assert rates == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.1])
    cosine = schedules.CosineDecay(0.0, 90, warmup_target=0.1, warmup_steps=10)
    rates = [cosine(t) for t in (0, 5, 10, 55, 100)]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.05, 0.0], abs=1e-6)
    assert "CosineDecay(" in repr(cosine) and "warmup_steps=10" in repr(cosine)
    # An optimizer given a schedule hands the runtime its JSON in place of a rate.
    assert cohort.optimizers.Adam(cosine).spec() == ("adam", cosine.spec(), {})
    assert cohort.optimizers.Adam(cosine).learning_rate is cosine
    with pytest.raises(ValueError, match="1 values for 1 boundaries"):
        schedules.PiecewiseConstantDecay([10], [1.0])(0)
    with pytest.raises(ValueError, match="decay_steps"):
        schedules.ExponentialDecay(0.1, -1, 0.5)(0)
    with pytest.raises(ValueError, match="decay_rate"):
        schedules.ExponentialDecay(0.1, 10, 2.0)(0)


def test_every_task_runs_the_interpreter_of_the_virtual_environment_it_was_launched_from(
    tmp_path,
):
    # In a virtual environment `sys.executable` is not the file the process runs from: the
    # tasks must run the former, or they do not see the packages installed there.
    import shutil

    import cohort as package

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    # The package copied in, its native module followed (the tests link it).
    shutil.copytree(os.path.dirname(package.__file__), os.path.join(site, "cohort"), symlinks=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    job = subprocess.run(
        [
            str(python),
            "-m",
            "cohort",
            "launch",
            "--workers",
            "1",
            "--ps",
            "1",
            "--no-metrics",
            str(JOBS / "quickstart.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=150,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert "last loss" in job.stdout + job.stderr


def test_a_scopes_optimizer_must_be_one_of_cohorts():
    with pytest.raises(TypeError, match=r"scoped_optimizers\['wide'\].*str"):
        cohort.ParameterServerStrategy(scoped_optimizers={"wide": "adagrad"})


def _stubbed_parameters(function):
    """The parameters a stub declares (name, whether it has a default), ``self`` left out."""
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    named = [(a.arg, d) for a, d in zip(positional, defaults)]
    named += [(a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return [p for p in named if p[0] != "self"]


def _runtime_parameters(obj):
    """The parameters the native module declares (its text signature), or None where it
    declares none (a getter, a slot)."""
    import inspect

    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [
        (p.name, p.default is not inspect.Parameter.empty)
        for p in signature.parameters.values()
        if p.name != "self"
    ]


def test_the_native_modules_stubs_name_what_it_has_with_its_parameters():
    """``_native.pyi`` is what a type checker and an editor read: every function, class and
    method it names exists in the built module with the same parameters in the same order
    (and defaults where it shows them), and every public one the module has is in it."""
    import ast
    from pathlib import Path

    from cohort import _native

    stubs = ast.parse((Path(cohort.__file__).parent / "_native.pyi").read_text())
    problems = []

    def check(where, stub, runtime):
        declared = _runtime_parameters(runtime)
        stubbed = _stubbed_parameters(stub)
        if declared is not None and declared != stubbed:
            problems.append(f"{where}: the stub says {stubbed}, the module {declared}")

    # Each stubbed class's members (methods and annotated fields), by class name: a subclass's
    # stub inherits its bases' as the module's class does.
    members = {
        node.name: {
            m.name if isinstance(m, ast.FunctionDef) else m.target.id
            for m in node.body
            if isinstance(m, ast.FunctionDef)
            or (isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name))
        }
        for node in stubs.body
        if isinstance(node, ast.ClassDef)
    }
    stubbed_names = set()
    for node in stubs.body:
        if isinstance(node, ast.FunctionDef):
            stubbed_names.add(node.name)
            if not hasattr(_native, node.name):
                problems.append(f"{node.name}: stubbed, not in the module")
                continue
            check(node.name, node, getattr(_native, node.name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed_names.add(node.target.id)
            if not hasattr(_native, node.target.id):
                problems.append(f"{node.target.id}: stubbed, not in the module")
        elif isinstance(node, ast.ClassDef):
            stubbed_names.add(node.name)
            cls = getattr(_native, node.name, None)
            if cls is None:
                problems.append(f"{node.name}: stubbed, not in the module")
                continue
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            for name, method in methods.items():
                if name.startswith("__") and name != "__init__":
                    continue
                where = f"{node.name}.{name}"
                if name == "__init__":
                    check(where, method, cls)
                elif not hasattr(cls, name):
                    problems.append(f"{where}: stubbed, not in the module")
                else:
                    check(where, method, getattr(cls, name))
            for name in dir(cls):
                if name.startswith("_"):
                    continue
                if any(name in members.get(base.__name__, ()) for base in cls.__mro__):
                    continue
                # Exceptions inherit ``args`` and ``with_traceback`` from Python's own.
                if issubclass(cls, BaseException) and hasattr(BaseException, name):
                    continue
                problems.append(f"{node.name}.{name}: in the module, not stubbed")
    for name in dir(_native):
        if not name.startswith("_") and name not in stubbed_names:
            problems.append(f"{name}: in the module, not stubbed")
    assert not problems, "\n".join(problems)
