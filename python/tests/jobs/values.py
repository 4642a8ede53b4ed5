"""What a step and the chief get when they read variables: float32 NumPy arrays of the
variable's shape, lent without a copy from the runtime's memory, writable, theirs alone (a
change made to one never reaches the servers or another read), and usable by PyTorch as they
are. The chief prints one line per check."""

import warnings

import numpy as np

import cohort


def lent_by_the_runtime(array):
    """True when ``array`` views memory the runtime lent (its chain of bases ends there)."""
    while array is not None:
        if type(array).__name__ == "F32Values":
            return True
        array = getattr(array, "base", getattr(array, "obj", None))
    return False


def read_step(w, b):
    whole = w.read_value()
    both = cohort.read_variables([w, b])
    rows = w.gather([2, 0])
    checks = {
        "shape": whole.shape == (3, 4) and both[0].shape == (3, 4) and both[1].shape == (4,),
        "dtype": all(a.dtype == np.float32 for a in (whole, *both, rows)),
        "rows": rows.tolist() == [whole[2].tolist(), whole[0].tolist()],
        "lent": all(lent_by_the_runtime(a) for a in (whole, *both, rows)),
        "writable": all(a.flags.writeable for a in (whole, *both, rows)),
    }
    whole += 100.0
    both[1][:] = -1.0
    checks["private"] = w.read_value().tolist() == (whole - 100.0).tolist()
    try:
        import torch
    except ImportError:
        return checks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a read-only array would warn here
        tensor = torch.from_numpy(both[0])
    checks["torch"] = float(tensor.sum()) == float(both[0].sum())
    return checks


strategy = cohort.ParameterServerStrategy()
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = cohort.Variable(np.arange(12, dtype=np.float32).reshape(3, 4), name="w")
    b = cohort.Variable(np.ones(4, dtype=np.float32), name="b")
for name, passed in sorted(coordinator.schedule(read_step, args=(w, b)).fetch().items()):
    print(f"step {name}: {passed}")
on_chief = w.numpy()
on_chief[0, 0] = 42.0
print(f"chief writable: {on_chief.flags.writeable}")
print(f"chief private: {w.numpy()[0, 0] == 0.0}")
print(f"servers unchanged: {w.numpy().tolist() == np.arange(12).reshape(3, 4).tolist()}")
