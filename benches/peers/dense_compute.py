"""The dense workload's step computation in Python, without any distribution: the MLP
784-256-256-10 (relu, softmax cross-entropy) of src/workloads/bench.rs as a PyTorch module,
its gradients by PyTorch's autograd or by hand in NumPy. cohort_python_dense.py runs them in
its steps; dense_step_compute.py times them alone. blas_env() is the environment both run
NumPy's BLAS in."""

import os

import numpy as np

from workload import CLASSES, FEATURES, HIDDEN


def torch_mlp():
    """The MLP as a PyTorch module (torch.nn.Linear's layout: weight [out, in], bias [out])."""
    import torch

    sizes = [FEATURES, *HIDDEN, CLASSES]
    layers = []
    for n_in, n_out in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def numpy_gradients(values, x, y):
    """The gradients of the mean cross-entropy of batch `x` (float32 [batch, 784]) and labels
    `y` with respect to `values` (weight [out, in], bias [out], layer by layer), by hand."""
    weights, biases = values[0::2], values[1::2]
    activations = [x]
    h = x
    for layer, (w, b) in enumerate(zip(weights, biases)):
        h = h @ w.T + b
        if layer < len(weights) - 1:
            h = np.maximum(h, 0)
        activations.append(h)
    z = h - h.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    d = p / len(y)
    grads = [None] * len(values)
    for layer in range(len(weights) - 1, -1, -1):
        grads[2 * layer] = d.T @ activations[layer]
        grads[2 * layer + 1] = d.sum(axis=0)
        if layer > 0:
            d = (d @ weights[layer]) * (activations[layer] > 0)
    return grads


def blas_env():
    """The job's environment: NumPy's BLAS on one thread per process of the five (as the
    other peers' ops), and on the machine's AVX-512 kernels where it has them. candle's gemm,
    which the Rust job runs, picks AVX-512 at run time; NumPy's OpenBLAS picks AVX2 ones on
    AMD's Zen 4 by itself, and a machine may set OPENBLAS_CORETYPE for every program (this one
    sets Haswell, AVX2): on an AVX-512 machine the comparison sets SkylakeX whatever was
    inherited, so that both jobs' matrix products use the same instructions."""
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 5)))
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            avx512 = " avx512f " in cpuinfo.read().replace("\n", " ")
    except OSError:
        avx512 = False
    if avx512:
        env["OPENBLAS_CORETYPE"] = "SkylakeX"
    return env
