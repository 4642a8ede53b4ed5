#!/usr/bin/env python3
"""The dense workload's step computation alone, on one thread, with no distribution: what a
cohort-from-Python worker computes in each step of `cohort bench ps --peers`' Python jobs
(dense_compute.py), timed here to tell the compute's share of their gap to the Rust job from
the bridge's. The Rust job's computation is timed the same way, on one thread, by
`cohort bench-dense-compute`, which `cohort bench ps --peers` runs beside this program.

    python3 dense_step_compute.py --steps 300

prints one JSON line: {"torch_ms": T, "numpy_ms": N, "version": ...}, each the median of
--steps timed steps (forward and backward of a batch of 256) after 30 untimed ones. NumPy's
OpenBLAS runs as in the benchmark's job (dense_compute.blas_env), on one thread: the program
starts itself again in that environment (OpenBLAS reads it when it loads). `cohort bench ps
--peers` runs it in the same invocation as the jobs it explains.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from dense_compute import blas_env, numpy_gradients, torch_mlp
from workload import CLASSES, FEATURES

BATCH = 256
UNTIMED = 30


def median_ms(step, steps):
    for _ in range(UNTIMED):
        step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


# Set in the environment of the program started again in the benchmark's BLAS environment.
_IN_BLAS_ENV = "COHORT_DENSE_STEP_COMPUTE_BLAS"


def main():
    if os.environ.get(_IN_BLAS_ENV) != "1":
        env = blas_env()
        env["OPENBLAS_NUM_THREADS"] = "1"
        env[_IN_BLAS_ENV] = "1"
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit("dense_step_compute: --steps must be at least 1")
    try:
        import torch
    except ImportError as e:
        sys.exit(f"dense_step_compute: {e} (benches/peers/setup.sh installs torch)")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH, dtype=np.int64)
    module = torch_mlp()
    values = [p.detach().numpy().copy() for p in module.parameters()]
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        module.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(tx), ty).backward()

    def numpy_step():
        numpy_gradients(values, x, y)

    print(json.dumps({
        "torch_ms": median_ms(torch_step, args.steps),
        "numpy_ms": median_ms(numpy_step, args.steps),
        "version": f"torch {torch.__version__}, numpy {np.__version__}",
    }))


if __name__ == "__main__":
    main()
