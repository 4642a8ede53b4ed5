"""A variable whose shape differs from the checkpoint's: `--size N` makes `w` of N values,
restores the newest checkpoint (COHORT_CHECKPOINT_DIR) or saves the first one."""

import argparse
import sys

import numpy as np

import cohort

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, required=True)
args, _ = parser.parse_known_args()

strategy = cohort.ParameterServerStrategy()
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = cohort.Variable(np.arange(args.size, dtype=np.float32), name="w")
try:
    restored = coordinator.restore_checkpoint()
except cohort.CheckpointError as e:
    print(f"CheckpointError: {e}")
    print(f"w still reads {w.numpy().tolist()}")
    sys.exit(3)
if restored is None:
    print(f"saved {coordinator.save_checkpoint(0)}")
else:
    print(f"restored step {restored}: w = {w.numpy().tolist()}")
