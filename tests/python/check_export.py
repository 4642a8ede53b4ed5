#!/usr/bin/env python3
"""Check a `cohort ckpt export` file against the checkpoint it came from, in numpy alone.

usage: check_export.py EXPORT.safetensors CKPT_DIR [--with-slots]

Reassembles every variable of CKPT_DIR from its shard files and manifest.json by hand (the
parts of a partitioned variable concatenated along rows, as the layout says), and checks that
`safetensors.numpy.load_file(EXPORT)` holds exactly those variables (and, with --with-slots,
their optimizer slots as `<variable>/slot/<slot>`), each with the same dtype, shape and bytes,
and that the file's `__metadata__` carries the checkpoint's step.
Exit status 0 when everything matches, 1 otherwise (each mismatch printed), 2 on bad usage.
"""

import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def expected_tensors(ckpt_dir, with_slots):
    with open(os.path.join(ckpt_dir, "manifest.json"), "rb") as f:
        manifest = json.load(f)
    shards = [load_file(os.path.join(ckpt_dir, e["name"])) for e in manifest["files"]]
    out = {}
    for var in manifest["layout"]:
        parts = var["shards"]

        def part_name(i):
            return var["name"] if len(parts) == 1 else f"{var['name']}/part_{i}"

        def whole(suffix):
            arrays = [shards[p["ps"]][part_name(i) + suffix] for i, p in enumerate(parts)]
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)

        out[var["name"]] = whole("")
        if with_slots:
            for slot in manifest["slots"].get(var["name"], []):
                out[f"{var['name']}/slot/{slot}"] = whole(f"/slot/{slot}")
    return manifest["step"], out


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--with-slots"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    export_path, ckpt_dir = argv[1], argv[2]
    step, expected = expected_tensors(ckpt_dir, len(argv) == 4)
    got = load_file(export_path)
    with safe_open(export_path, framework="np") as f:
        metadata = f.metadata() or {}
    errors = []
    if metadata.get("step") != str(step):
        errors.append(f"__metadata__ step {metadata.get('step')!r}, checkpoint step {step}")
    if sorted(got) != sorted(expected):
        errors.append(f"tensors {sorted(got)}, expected {sorted(expected)}")
    checked = 0
    for name, want in sorted(expected.items()):
        if name not in got:
            continue
        array = got[name]
        if array.dtype != want.dtype or array.shape != want.shape:
            errors.append(f"{name}: {array.dtype} {array.shape}, expected {want.dtype} {want.shape}")
            continue
        if np.ascontiguousarray(array).tobytes() != np.ascontiguousarray(want).tobytes():
            errors.append(f"{name}: values differ from the checkpoint's")
            continue
        checked += 1
        print(f"  {name}: {array.dtype} {list(array.shape)} ok")
    for error in errors:
        print(f"MISMATCH {error}")
    if errors or checked == 0:
        print(f"FAILED: {len(errors)} mismatch(es), {checked} tensors compared")
        return 1
    print(f"OK: {checked} tensors of {export_path} match {ckpt_dir} at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
