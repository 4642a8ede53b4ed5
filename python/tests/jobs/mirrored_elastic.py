"""Elastic MultiWorkerMirrored from Python: the loop calls `at_step_boundary` before each step
and `recover` after a lost worker, so a worker killed mid-training is left out by the
survivors, which go on, and its restarted process is admitted and receives their state. Each
task prints every group change and, at the end, the digest of its weights: the same on every
worker. Arguments: --steps N, --pause SECONDS (each step's extra work; --pause-while-short
SECONDS instead while the group lacks a worker it had), --die-at STEP with
--marker FILE (worker/1's first process SIGKILLs itself before that step, or with --signal
term sends itself SIGTERM, whatever the machine's speed: the marker says it did). --optimizer adam
trains with cohort's Adam on a cosine decay, made in the strategy's scope
(its moments must follow the weights to a joiner, or the joiner's model drifts from the
others'); the default is a hand-written SGD step on all-reduced gradients. --checkpoints
keeps the training state's checkpoints in the configured directory (COHORT_CHECKPOINT_DIR),
one every --checkpoint-every steps (0: only before a preempted worker leaves), and a job started
again resumes from the newest; --features N makes the model's weights N×1 (8 by default). An
evaluator task (launch --evaluators 1) evaluates each checkpoint (the distance of `w` from the
true weights, and its sum); with --wait-for-evaluator the chief ends only once the evaluator
evaluated one (at most a minute)."""

import argparse
import hashlib
import os
import signal
import sys
import time

import numpy as np

import cohort

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--pause", type=float, default=0.01)
parser.add_argument("--pause-while-short", type=float, default=None)
parser.add_argument("--die-at", type=int, default=-1)
parser.add_argument("--marker", default="")
parser.add_argument("--signal", choices=["kill", "term"], default="kill")
parser.add_argument("--optimizer", choices=["hand", "adam"], default="hand")
parser.add_argument("--checkpoints", action="store_true")
parser.add_argument("--checkpoint-every", type=int, default=0)
parser.add_argument("--features", type=int, default=8)
parser.add_argument("--wait-for-evaluator", action="store_true")
args, _ = parser.parse_known_args()
resolver = cohort.cluster_resolver.TFConfigClusterResolver()
true_w = np.arange(1, args.features + 1, dtype=np.float32).reshape(args.features, 1)


def evaluated_marker():
    return os.path.join(os.environ["COHORT_CHECKPOINT_DIR"], "..", "evaluated")


def evaluate(step, variables):
    w = variables["w"]
    open(evaluated_marker(), "w").close()
    return {"distance": float(np.abs(w - true_w).max()), "w_sum": float(w.sum())}


if resolver.task_type == "evaluator":
    cohort.SidecarEvaluator(evaluate, resolver).start()
    sys.exit(0)
dies = (resolver.task_type, resolver.task_id) == ("worker", 1) and args.marker != ""

strategy = cohort.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = cohort.Variable(np.zeros((args.features, 1)), name="w")
    # Adam on a cosine decay: its step count, which the rate follows, goes with the weights.
    # The same schedule whatever --steps says, so that a job resumed for more steps trains
    # what one run straight through does.
    decay = cohort.schedules.CosineDecay(0.05, 1000, alpha=0.1)
    optimizer = cohort.optimizers.Adam(decay) if args.optimizer == "adam" else None
state = cohort.TrainingState()
checkpoints = None
if args.checkpoints:
    checkpoints = cohort.CheckpointManager(
        strategy, checkpoint_interval=args.checkpoint_every or None
    )
    resumed = checkpoints.restore_or_initialize(state)
    if resumed is not None:
        print(f"resumed from step {resumed}", flush=True)
full = strategy.num_workers
while True:
    try:
        # A worker lost at the boundary's own collective raises here as in the step.
        change = strategy.at_step_boundary(state)
        if change is not None:
            print(f"group {change} at step {state.step}: {state.detail}", flush=True)
        if change == "leaving" or state.step >= args.steps:
            break
        if dies and state.step == args.die_at and not os.path.exists(args.marker):
            open(args.marker, "w").close()
            # SIGKILL: lost mid-step; SIGTERM: a preemption notice, answered at the next boundary.
            os.kill(os.getpid(), signal.SIGKILL if args.signal == "kill" else signal.SIGTERM)
        # Every worker's batch of this step, from the step alone: a re-run step reads the same.
        rng = np.random.default_rng([state.step, strategy.worker_index])
        x = rng.normal(size=(16, args.features)).astype(np.float32)
        y = x @ true_w
        value = w.read_value()
        local = 2 * x.T @ (x @ value - y) / len(y)
        if optimizer is not None:
            # The optimizer sums over the workers: each gives its share of the mean.
            optimizer.apply_gradients([(local / strategy.num_workers, w)])
        else:
            grad = strategy.all_reduce("MEAN", local)
    except cohort.GroupError as lost:
        print(f"step {state.step} failed: {lost}", flush=True)
        print(f"recovered: {strategy.recover(state)}", flush=True)
        continue
    if optimizer is None:
        w.assign(value - 0.02 * grad)
    state.step += 1
    state.position += 16 * strategy.num_workers
    if checkpoints is not None and checkpoints.save(state) is not None:
        print(f"saved step {state.step}: w_sum={float(w.read_value().sum())!r}", flush=True)
    # A group short of a worker it had (lost or departed, not admitted again yet) may train
    # slower on request, so that a test asserting the rejoin leaves the restarted process time
    # to come back however busy the machine is.
    full = max(full, strategy.num_workers)
    short = strategy.num_workers < full and args.pause_while_short is not None
    time.sleep(args.pause_while_short if short else args.pause)
if args.wait_for_evaluator and strategy.worker_index == 0:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(evaluated_marker()):
        time.sleep(0.2)
digest = hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
print(f"final model: step {state.step}, digest {digest}", flush=True)
