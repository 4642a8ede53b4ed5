#!/usr/bin/env python3
"""cohort from Python on the dense workload of `cohort bench ps`, measured in the same run as
the Rust job and its peers (`cohort bench ps --peers`): the same job written as a Python script
(cohort_python_dense.py), its gradients computed by PyTorch (--compute torch) or by NumPy
(--compute numpy), 1 chief + 2 parameter servers + 2 workers as
processes on 127.0.0.1 started by `python -m cohort launch`. The Python that runs it needs the
`cohort` package (benches/peers/setup.sh installs it) and torch.

    python3 cohort_python_ps.py --steps 1000 --warmup 30

prints one JSON line: {"peer": "cohort-python-torch", "version": ..., "steps_per_second": R}. Exit 1
with a message on stderr when the job fails.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from dense_compute import blas_env

RUN_MAX_S = 900


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--workload", choices=["dense"], default="dense",
                        help="the dense workload only")
    parser.add_argument("--compute", choices=["torch", "numpy"], default="torch",
                        help="the step's gradients by PyTorch's autograd, or by hand in NumPy")
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit("cohort_python_ps: --steps must be at least 1")
    try:
        import cohort
        import numpy
        import torch
    except ImportError as e:
        sys.exit(f"cohort_python_ps: {e} (benches/peers/setup.sh installs cohort and torch)")
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cohort_python_dense.py")
    with tempfile.TemporaryDirectory(prefix="cohort-python-bench-") as scratch:
        report = os.path.join(scratch, "report.json")
        command = [sys.executable, "-m", "cohort", "launch", "--workers", "2", "--ps", "2",
                   "--no-metrics", "--run-dir", os.path.join(scratch, "run"), job,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--report", report,
                   "--compute", args.compute]
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=RUN_MAX_S, env=blas_env())
        except subprocess.TimeoutExpired:
            sys.exit(f"cohort_python_ps: the job ran past {RUN_MAX_S}s")
        if done.returncode != 0:
            sys.exit(f"cohort_python_ps: the job failed ({done.returncode}):\n{done.stdout[-4000:]}")
        with open(report) as f:
            measured = json.load(f)
    engine = (f"torch {torch.__version__}" if args.compute == "torch"
              else f"numpy {numpy.__version__}")
    print(json.dumps({"peer": f"cohort-python-{args.compute}",
                      "version": f"cohort {cohort.__version__}, {engine}",
                      "servers": 2, "workers": 2,
                      "steps_per_second": measured["steps"] / measured["seconds"]}))


if __name__ == "__main__":
    main()
