"""Reads cohort's TensorBoard event files back with the `tensorboard` package's own reader.

    check_tensorboard.py probe                 exit 0 if `tensorboard` imports
    check_tensorboard.py scalars DIR EXPECTED  the one event file in DIR holds exactly the
                                               scalars EXPECTED (JSON [[tag, step, value], ...])
    check_tensorboard.py corrupt DIR           a copy with record 2 corrupted: the reader stops
                                               there without an error, records before it intact
    check_tensorboard.py job LOGS STEPS EVAL   LOGS/train and LOGS/eval of a demo run of STEPS
                                               steps; EVAL: JSON [[tag, step, value], ...] the
                                               evaluator printed

Prints what is wrong and exits 1 on a mismatch.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def event_file(directory):
    files = [f for f in os.listdir(directory) if "tfevents" in f]
    if len(files) != 1:
        fail(f"expected one event file in {directory}, found {files}")
    return os.path.join(directory, files[0])


def load(path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return list(EventFileLoader(path).Load())


def scalars(events, path):
    if not events or events[0].file_version != "brain.Event:2":
        fail(f"{path}: the first event is not file_version brain.Event:2: {events[:1]}")
    out, seen = [], set()
    for event in events[1:]:
        if len(event.summary.value) != 1:
            fail(f"{path}: an event without exactly one value: {event}")
        value = event.summary.value[0]
        # The reader's compat layer turns a `simple_value` into a scalar tensor of the scalars
        # plugin (its metadata on the first value of each tag): what TensorBoard plots.
        if value.tag not in seen and value.metadata.plugin_data.plugin_name != "scalars":
            fail(f"{path}: {value.tag} is not read as a scalar: {value}")
        seen.add(value.tag)
        if len(value.tensor.float_val) != 1:
            fail(f"{path}: {value.tag} holds no single float: {value}")
        out.append((value.tag, event.step, value.tensor.float_val[0]))
    return out


def same(expected, got, what):
    expected = [(t, s, float(np.float32(v))) for t, s, v in expected]
    if expected != got:
        fail(f"{what}: expected {expected}, read {got}")


def records(data):
    """Offsets (start, data start, data end) of each TFRecord in data."""
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append((at, at + 12, at + 12 + length))
        at += 12 + length + 4
    return out


def main():
    mode = sys.argv[1]
    if mode == "probe":
        import tensorboard  # noqa: F401

        return
    if mode == "scalars":
        path = event_file(sys.argv[2])
        same(json.loads(sys.argv[3]), scalars(load(path), path), path)
    elif mode == "corrupt":
        path = event_file(sys.argv[2])
        data = bytearray(open(path, "rb").read())
        spans = records(data)
        if len(spans) < 4:
            fail(f"{path}: only {len(spans)} records")
        whole = load(path)
        # One byte of record 2's data flipped: its CRC no longer matches.
        _, start, _ = spans[2]
        data[start] ^= 0xFF
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, os.path.basename(path))
            open(copy, "wb").write(data)
            try:
                read = load(copy)
            except Exception as e:  # noqa: BLE001
                fail(f"the reader failed on the corrupted copy: {e!r}")
        # TensorBoard's reader treats a record that fails its CRC as the end of what is
        # readable for now (a DataLossError it swallows): the records before it come back, the
        # corrupted one never does.
        if [e.SerializeToString() for e in read] != [e.SerializeToString() for e in whole[:2]]:
            fail(f"corrupted copy: expected the 2 records before the corrupted one, read {read}")
        print(f"corrupted record skipped: {len(read)} of {len(whole)} records read, no error")
    elif mode == "job":
        logs, steps = sys.argv[2], int(sys.argv[3])
        train_path = event_file(os.path.join(logs, "train"))
        train = scalars(load(train_path), train_path)
        tags = {t for t, _, _ in train}
        if tags != {"loss", "steps_per_second", "ledger/committed"}:
            fail(f"{train_path}: tags {sorted(tags)}")
        for tag in tags:
            points = [(s, v) for t, s, v in train if t == tag]
            at = [s for s, _ in points]
            if at != sorted(set(at)) or at[-1] != steps:
                fail(f"{train_path}: {tag} at steps {at}, expected increasing up to {steps}")
            for step, value in points:
                if not np.isfinite(value) or value <= 0:
                    fail(f"{train_path}: {tag} = {value} at step {step}")
                # Without faults every step is one committed closure.
                if tag == "ledger/committed" and value != step:
                    fail(f"{train_path}: {value} committed at step {step}")
        eval_path = event_file(os.path.join(logs, "eval"))
        same(json.loads(sys.argv[4]), scalars(load(eval_path), eval_path), eval_path)
        print(f"train: {len(train)} scalars {sorted(tags)}; eval: {sys.argv[4]}")
    else:
        fail(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
