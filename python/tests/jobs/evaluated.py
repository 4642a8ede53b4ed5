"""A job with a sidecar evaluator. The chief pulls `w` (a 6×4 matrix split over the parameter
servers) toward a target, saving a checkpoint every `--checkpoint-every` steps
(COHORT_CHECKPOINT_DIR) and printing what it saved; the evaluator task evaluates each
checkpoint with `evaluate`, which reads `w` whole and `count` (an int64 the chief sets).

Arguments: --steps N, --checkpoint-every K, --wait-for-evaluator (the chief ends only once
the evaluator wrote its first metrics, at most a minute); on the evaluator --fail-at-step S
(the function raises at that checkpoint's step), --bad-metric (it returns a metric that is no
number).
"""

import argparse
import os
import time

import numpy as np

import cohort

TARGET = np.arange(24, dtype=np.float32).reshape(6, 4) / 10


def pull_step(w):
    value = w.read_value()
    optimizer.apply_gradients([(value - TARGET, w)])


def marker():
    """The file the evaluator leaves once it evaluated a checkpoint (--wait-for-evaluator)."""
    return os.path.join(os.environ["COHORT_CHECKPOINT_DIR"], "..", "evaluated")


def evaluate(step, variables):
    if step == args.fail_at_step:
        raise ValueError(f"no model to judge at step {step}")
    w = variables["w"]
    if args.wait_for_evaluator:
        # Tells the chief (--wait-for-evaluator) that a checkpoint was evaluated.
        open(marker(), "w").close()
    if args.bad_metric:
        return {"distance": "far"}
    return {
        "distance": float(np.abs(w - TARGET).max()),
        "w_sum": float(w.sum()),
        "shape": float(w.shape[0] * 10 + w.shape[1]),
        "dtype_is_f32": float(w.dtype == np.float32),
    }


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--checkpoint-every", type=int, default=10)
parser.add_argument("--fail-at-step", type=int, default=-1)
parser.add_argument("--bad-metric", action="store_true")
parser.add_argument("--wait-for-evaluator", action="store_true")
args, _ = parser.parse_known_args()

resolver = cohort.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type == "evaluator":
    cohort.SidecarEvaluator(evaluate, resolver).start()
    print("evaluator: stopped by itself")
else:
    optimizer = cohort.optimizers.SGD(0.2)
    strategy = cohort.ParameterServerStrategy(
        resolver,
        variable_partitioner=cohort.partitioners.FixedShardsPartitioner(2),
        optimizer=optimizer,
    )
    coordinator = cohort.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = cohort.Variable(np.zeros((6, 4), np.float32), name="w")
    for step in range(1, args.steps + 1):
        coordinator.schedule(pull_step, args=(w,))
        if step % args.checkpoint_every == 0:
            coordinator.join()
            value = w.numpy()
            coordinator.save_checkpoint(step)
            print(
                f"saved step {step}: distance={float(np.abs(value - TARGET).max())!r} "
                f"w_sum={float(value.sum())!r}"
            )
    coordinator.join()
    if args.wait_for_evaluator:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not os.path.exists(marker()):
            time.sleep(0.2)
