#!/usr/bin/env python3
"""Write a safetensors file with numpy alone, as another framework would: a model to
warm-start a cohort job from.

usage: write_safetensors.py OUT.safetensors

Writes (values chosen so that every element differs):
  model.w  float32 [4, 3]  arange(12) * 0.5 - 1
  model.b  float64 [3]     [0.25, -0.5, 2.0]
  unused   float32 [2]     [7, 7]
"""

import sys

import numpy as np
from safetensors.numpy import save_file


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    tensors = {
        "model.w": (np.arange(12, dtype=np.float32) * 0.5 - 1.0).reshape(4, 3),
        "model.b": np.array([0.25, -0.5, 2.0], dtype=np.float64),
        "unused": np.array([7.0, 7.0], dtype=np.float32),
    }
    save_file(tensors, argv[1], metadata={"written_by": "numpy"})
    print(f"wrote {argv[1]}: {', '.join(sorted(tensors))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
