"""Every update applied once, through faults: each step adds exactly 1 to one counter per
parameter server (SGD at rate 1, gradient -1), so each counter ends at the number of steps
scheduled exactly when every step's update was applied once.

Arguments: --steps N (in all, a resumed run counting its checkpoint's), --pause SECONDS (each step's work), --checkpoint-every K (needs
COHORT_CHECKPOINT_DIR; the first checkpoint is saved before training, and a run resumes
from the newest), --chaos-point-at created|first-checkpoint|STEP (prints the launcher's chaos marker, and waits 2 s
after the variables are created, before the chief's start; or waits 4 s for the kill to be known,
before the first checkpoint is saved; or prints it before step STEP is scheduled: a local cluster launched with --kill-worker-after or --kill-ps-after kills its task
then). On a stop request (SIGTERM)
it saves and ends: the chief exits 143.
"""

import argparse
import sys
import time

import numpy as np

import cohort


EPOCH_STEPS = 20
# What the launcher watches the chief's output for (`cohort::launch::CHAOS_MARKER`).
CHAOS_MARKER = "[chaos-point]"


def chaos_point(here: str, wait: float = 0.0) -> None:
    if args.chaos_point_at == here:
        print(f"{CHAOS_MARKER} {here}", flush=True)
        time.sleep(wait)


def count_step(counters, pause):
    values = cohort.read_variables(counters)
    time.sleep(pause)
    optimizer.apply_gradients([(np.full(1, -1.0), c) for c in counters])
    return [float(v[0]) for v in values]


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--pause", type=float, default=0.0)
parser.add_argument("--checkpoint-every", type=int, default=0)
parser.add_argument("--chaos-point-at", default=None)
args, _ = parser.parse_known_args()

optimizer = cohort.optimizers.SGD(1.0)
strategy = cohort.ParameterServerStrategy(
    cohort.cluster_resolver.TFConfigClusterResolver(), optimizer=optimizer
)
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    # Whole variables go round-robin: one counter on each server.
    counters = [cohort.Variable(np.zeros(1), name=f"count{i}") for i in range(strategy.num_ps)]
restored = None
if args.checkpoint_every:
    # The variables are created, the start (restore_checkpoint) not begun: a server lost here
    # is given them again, and the start goes on.
    chaos_point("created", wait=2.0)
    restored = coordinator.restore_checkpoint()
    print(f"restored: {restored}")
    if restored is None:
        # Past the detection budget (3 s): the server is known lost before the save.
        chaos_point("first-checkpoint", wait=4.0)
        coordinator.save_checkpoint(0)
start = restored or 0
# To --steps in all: a resumed run (a restarted chief) goes on from its checkpoint's step.
for step in range(start, args.steps):
    if coordinator.preemption_requested():
        # A stop request (SIGTERM): save what was done, end; the next run resumes here.
        coordinator.join()
        coordinator.save_checkpoint(step)
        print(f"stopped at step {step}")
        sys.exit(0)
    chaos_point(str(step))
    coordinator.schedule(count_step, args=(counters, args.pause))
    if (step + 1) % EPOCH_STEPS == 0:
        # An epoch's end: what is queued stays short, so a stop request is answered soon.
        coordinator.join()
    if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
        coordinator.save_checkpoint(step + 1)
coordinator.join()
values = [int(c.numpy()[0]) for c in counters]
ledger = coordinator.ledger()
print(f"counters {values} after {args.steps} steps")
print(
    "ledger: scheduled={scheduled} committed={committed} failed={failed} "
    "redispatched={redispatched} rolled_back={rolled_back} ps_restores={ps_restores}".format(
        **ledger
    )
)
for index, stats in enumerate(coordinator.ps_stats()):
    print(
        f"ps/{index}: applied={stats['applied']} duplicates={stats['rejected_duplicate']} "
        f"stale={stats['rejected_stale']}"
    )
