"""What a step and the chief get when they read variables: float32 NumPy arrays of the
variable's shape, lent without a copy from the runtime's memory, writable, theirs alone (a
change made to one never reaches the servers or another read), and usable by PyTorch as they
are. And what a step gets as its arguments and the chief as its value: NumPy arrays (and
PyTorch tensors) unpickled as views of the runtime's message, with no copy, writable, the
receiver's own. The chief prints one line per check."""

import warnings

import numpy as np

import cohort


def lent_by_the_runtime(array, lender="F32Values"):
    """True when ``array`` views memory the runtime lent (its chain of bases ends at an
    object of type ``lender``)."""
    while array is not None:
        if type(array).__name__ == lender:
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


def payload_step(array, matrix, small, tensor):
    """Receives arrays of 4 KiB (out of the pickle stream), a small one (in it) and a tensor,
    where PyTorch is installed, changes them in place, and sends an array back."""
    checks = {
        "argument lent": all(lent_by_the_runtime(a, "ByteValues") for a in (array, matrix)),
        "argument writable": array.flags.writeable and matrix.flags.writeable,
        "argument values": array.tolist() == list(range(512))
        and matrix.dtype == np.float64
        and small.tolist() == [7, 8],
    }
    array *= 2
    matrix[0, 0] = -1.0
    if tensor is not None:
        import torch

        checks["tensor values"] = type(tensor) is torch.Tensor and tensor.tolist() == [1.5, 2.5]
        tensor.add_(1.0)
    return checks, array


strategy = cohort.ParameterServerStrategy()
coordinator = cohort.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = cohort.Variable(np.arange(12, dtype=np.float32).reshape(3, 4), name="w")
    b = cohort.Variable(np.ones(4, dtype=np.float32), name="b")
for name, passed in sorted(coordinator.schedule(read_step, args=(w, b)).fetch().items()):
    print(f"step {name}: {passed}")
array = np.arange(512, dtype=np.int64)
matrix = np.ones((64, 8), dtype=np.float64)
small = np.array([7, 8], dtype=np.int32)
try:
    import torch

    tensor = torch.tensor([1.5, 2.5])
except ImportError:
    tensor = None
checks, back = coordinator.schedule(payload_step, args=(array, matrix, small, tensor)).fetch()
for name, passed in sorted(checks.items()):
    print(f"payload {name}: {passed}")
print(f"payload value lent: {lent_by_the_runtime(back, 'ByteValues')}")
print(f"payload value: {back.tolist() == [2 * i for i in range(512)]}")
print(f"payload value writable: {back.flags.writeable}")
unchanged = array.tolist() == list(range(512)) and matrix[0, 0] == 1.0
print(f"payload sent unchanged: {unchanged and (tensor is None or tensor.tolist() == [1.5, 2.5])}")
on_chief = w.numpy()
on_chief[0, 0] = 42.0
print(f"chief writable: {on_chief.flags.writeable}")
print(f"chief private: {w.numpy()[0, 0] == 0.0}")
print(f"servers unchanged: {w.numpy().tolist() == np.arange(12).reshape(3, 4).tolist()}")
