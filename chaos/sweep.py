#!/usr/bin/env python3
"""A random sweep of chaos plans over the demo job: each seed draws a plan of 2 to 4 faults
(kill, term, pause and scale; a partition too for a parameter-server job), 0.5 to 2.5 s apart
after the first checkpoint (with --from-start: from the job's start, the first within 1.5 s, so
that faults land while the job starts: the chief probing and restoring the servers, the workers
entering their first group, before any checkpoint exists), and runs it under `cohort chaos run`, whose checks (exit code,
faults applied, every closure committed once, one model...) judge it: what the fixed plans of
examples/chaos/ do, over plans nobody wrote.

    python3 chaos/sweep.py --runs 10 --first-seed 7200            # MultiWorkerMirrored
    python3 chaos/sweep.py --job ps --runs 10 --first-seed 100    # parameter servers
    python3 chaos/sweep.py --job ps --runs 10 --from-start         # faults while the job starts
    python3 chaos/sweep.py --job python-ps --runs 10               # a Python script's job

`--job python-ps` runs TensorFlow's parameter-server tutorial with its PyTorch model
(python/examples/ps_tutorial_torch.py, checkpointing each epoch) with the Python that runs
this script: it needs cohort's package (`pip install ./python`) and torch there.

Prints one line per seed and, for a seed that failed, its plan and the report's checks; the run
directory of a failed seed is kept (under --keep). Exits 1 if any seed failed. A seed replays
its plan exactly (the job's own timing still varies from run to run).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

KINDS = {
    "mwms": ["kill", "term", "pause", "scale"],
    "ps": ["kill", "term", "pause", "scale", "partition"],
    "python-ps": ["kill", "term", "pause", "scale", "partition"],
}
# The jobs with parameter servers (ps:0 and ps:1 are targets; the chief is not SIGTERMed).
WITH_SERVERS = ("ps", "python-ps")


def plan(seed: int, job: str, from_start: bool = False) -> str:
    """The plan of `seed` for `job` (the chaos runner's TOML), its faults counted from the
    first checkpoint, or from the job's start with `from_start`."""
    rng = random.Random(seed)
    # The job starts with 3 workers; a fault only targets a worker the plan's own scales left
    # in the job (a drained worker has no process to hit).
    workers = 3
    faults, at = [], 0.3
    anchor = "start" if from_start else "first_checkpoint"
    for n in range(rng.randint(2, 4)):
        kind = rng.choice(KINDS[job])
        at = rng.uniform(0.1, 1.5) if from_start and n == 0 else at + rng.uniform(0.5, 2.5)
        lines = [f'kind = "{kind}"']
        in_job = [f"worker:{i}" for i in range(workers)]
        targets = in_job + ["chief"] + (["ps:0", "ps:1"] if job in WITH_SERVERS else [])
        if kind == "scale":
            workers = rng.choice([2, 3, 4])
            lines.append(f"workers = {workers}")
        elif kind == "partition":
            lines.append(f'target = "{rng.choice(in_job)}"')
            lines.append(f'for = "{rng.choice(["500ms", "1s", "2s"])}"')
        else:
            # A parameter-server job's chief stopped by SIGTERM checkpoints and ends the job
            # (exit 143; a relaunch resumes it, as tests/preemption.rs shows): the plan's
            # other faults and its exit 0 would not hold, so a term there hits another task.
            if kind == "term" and job in WITH_SERVERS:
                targets = [t for t in targets if t != "chief"]
            lines.append(f'target = "{rng.choice(targets)}"')
            if kind == "pause":
                lines.append(f'for = "{rng.choice(["300ms", "1s", "2s"])}"')
        lines += [f'at = "{int(at * 1000)}ms"', f'after = "{anchor}"']
        faults.append("[[fault]]\n" + "\n".join(lines) + "\n")
    return f"seed = {seed}\n\n" + "\n".join(faults)


def job_command(cohort: str, job: str, run_dir: pathlib.Path) -> list[str]:
    """The demo job the plan hits: long enough for every fault to land (a plan's last fault
    comes at most 10.3 s after the first checkpoint; on a quiet 2-core machine three workers
    train the digits at about 800 steps/s, 12 steps an epoch, so 1,500 epochs last about 22 s)."""
    common = ["--no-chaos", "--run-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ckpt")]
    if job == "mwms":
        return [cohort, "demo", "--strategy", "multi-worker-mirrored", "--workers", "3:4",
                "--digits-epochs", "1500", *common]
    if job == "python-ps":
        script = pathlib.Path(__file__).resolve().parent.parent / "python/examples/ps_tutorial_torch.py"
        return [sys.executable, "-m", "cohort", "launch", "--workers", "3:4", "--ps", "2",
                "--run-dir", str(run_dir), str(script), "--epochs", "20",
                "--steps-per-epoch", "30", "--checkpoints"]
    return [cohort, "demo", "--workers", "3:4", "--digits-epochs", "40", "--ctr-epochs", "12",
            *common]


def job_env(job: str, run_dir: pathlib.Path) -> dict[str, str]:
    """The job's environment: a Python script's checkpoint directory (the demo takes a flag)."""
    env = dict(os.environ)
    if job == "python-ps":
        env["COHORT_CHECKPOINT_DIR"] = str(run_dir / "ckpt")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(KINDS), default="mwms")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--from-start", action="store_true",
                        help="count the faults from the job's start, not its first checkpoint")
    parser.add_argument("--cohort", default="target/release/cohort", help="the cohort binary")
    parser.add_argument("--keep", default=tempfile.gettempdir(), help="where failed runs stay")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not pathlib.Path(args.cohort).is_file():
        parser.error(f"--cohort {args.cohort}: no such file (cargo build --release)")
    try:
        pathlib.Path(args.keep).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--keep {args.keep}: cannot make it: {err.strerror}")
    failed = []
    for seed in range(args.first_seed, args.first_seed + args.runs):
        run = pathlib.Path(tempfile.mkdtemp(prefix=f"cohort-sweep-{seed}-", dir=args.keep))
        (run / "plan.toml").write_text(plan(seed, args.job, args.from_start))
        command = [args.cohort, "chaos", "run", "--plan", str(run / "plan.toml"),
                   "--out", str(run / "report"), "--timeout", "240s", "--",
                   *job_command(args.cohort, args.job, run / "job")]
        done = subprocess.run(command, capture_output=True, text=True, env=job_env(args.job, run / "job"))
        print(f"seed {seed}: exit {done.returncode}", flush=True)
        if done.returncode == 0:
            shutil.rmtree(run, ignore_errors=True)
            continue
        failed.append(seed)
        print((run / "plan.toml").read_text())
        checks = [line for line in done.stdout.splitlines()
                  if line.strip().startswith(("[failed]", "[passed]", "job:", "verdict"))]
        print("\n".join(checks) or done.stderr[-3000:])
        print(f"(kept in {run})", flush=True)
    print(f"{len(failed)} of {args.runs} failed{': seeds ' + str(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
