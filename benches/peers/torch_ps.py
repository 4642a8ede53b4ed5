#!/usr/bin/env python3
"""A parameter server in PyTorch's RPC framework (torch.distributed.rpc, TensorPipe) on the
dense workload of `cohort bench ps`, as a peer that command measures in the same run
(`cohort bench ps --peers`).

The workload is cohort's (src/workloads/bench.rs, `dense`): an MLP 784-256-256-10 (relu, SGD
at 0.1, softmax cross-entropy), batch 256 of synthetic examples per step; 2 parameter servers
and 2 workers as processes on 127.0.0.1, plus a driver that starts the workers' loops and
times them. The weights of 256 KiB and more are split by rows over both servers, the others
placed round-robin (as cohort's bench partitions them); each step a worker pulls every shard
from both servers at once (rpc_async), computes the gradients locally and pushes each shard's
gradient to its server, which applies SGD under a lock (asynchronous training, as the
parameter-server pattern of PyTorch's RPC tutorials and TensorFlow's strategy run it). Every
process gets one op thread per core / processes, at least 1.

    python3 torch_ps.py --steps 1000 --warmup 30

prints one JSON line: {"peer": "pytorch-rpc-ps", "version": ..., "steps_per_second": R}, R
being the steps of both workers over the time they took. Exit 1 with a message on stderr when
a process fails.
"""

import argparse
import json
import os
import sys
import threading
import time

from workload import CLASSES, FEATURES, HIDDEN, LEARNING_RATE, free_ports, run_children

BATCH = 256
SERVERS, WORKERS = 2, 2
MIN_SHARD_BYTES = 256 << 10
RUN_MAX_S = 900


def threads():
    return max(1, (os.cpu_count() or 1) // (1 + SERVERS + WORKERS))


def shapes():
    """Each parameter of the MLP (torch.nn.Linear's layout: weight [out, in], bias [out])."""
    sizes = [FEATURES, *HIDDEN, CLASSES]
    out = []
    for layer, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        out.append((f"layer{layer}.weight", (n_out, n_in)))
        out.append((f"layer{layer}.bias", (n_out,)))
    return out


def placement():
    """(name, server, first row, rows) of every shard: large weights split by rows over both
    servers, the rest round-robin."""
    shards, next_server = [], 0
    for name, shape in shapes():
        rows = shape[0]
        size = 4
        for d in shape:
            size *= d
        if size >= MIN_SHARD_BYTES:
            half = (rows + 1) // 2
            shards.append((name, 0, 0, half))
            shards.append((name, 1, half, rows - half))
        else:
            shards.append((name, next_server, 0, rows))
            next_server = (next_server + 1) % SERVERS
    return shards


class Server:
    """A server's shards, pulled whole and updated by SGD under one lock."""

    store = None

    def __init__(self, index):
        import torch

        torch.manual_seed(index)
        self.lock = threading.Lock()
        self.shards = {}
        full = dict(shapes())
        for name, server, first, rows in placement():
            if server == index:
                shape = (rows, *full[name][1:])
                bound = 1.0 / (full[name][-1] ** 0.5) if len(shape) > 1 else 0.0
                self.shards[(name, first)] = torch.empty(shape).uniform_(-bound, bound)


def pull():
    server = Server.store
    with server.lock:
        return {key: value.clone() for key, value in server.shards.items()}


def push(gradients):
    server = Server.store
    with server.lock:
        for key, grad in gradients.items():
            server.shards[key].add_(grad, alpha=-LEARNING_RATE)
    return True


def train(steps):
    """A worker's loop of `steps` steps; the seconds it took."""
    import torch
    from torch.distributed import rpc

    generator = torch.Generator().manual_seed(rpc.get_worker_info().id)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()
    full = dict(shapes())
    started = time.perf_counter()
    for _ in range(steps):
        pulls = [rpc.rpc_async(f"ps{s}", pull) for s in range(SERVERS)]
        shards = {}
        for s, future in enumerate(pulls):
            for key, value in future.wait().items():
                shards[key] = (s, value)
        params = {}
        for name, _ in shapes():
            parts = sorted((first, value) for (n, first), (_, value) in shards.items() if n == name)
            params[name] = torch.cat([v for _, v in parts]).reshape(full[name]).requires_grad_()
        h = x
        for layer in range(len(HIDDEN) + 1):
            h = torch.nn.functional.linear(h, params[f"layer{layer}.weight"],
                                           params[f"layer{layer}.bias"])
            if layer < len(HIDDEN):
                h = torch.relu(h)
        loss_fn(h, y).backward()
        per_server = [{} for _ in range(SERVERS)]
        for (name, first), (s, value) in shards.items():
            # A copy: a view would carry its whole storage over the wire.
            per_server[s][(name, first)] = params[name].grad[first:first + value.shape[0]].clone()
        pushes = [rpc.rpc_async(f"ps{s}", push, args=(grads,)) for s, grads in enumerate(per_server)]
        for future in pushes:
            future.wait()
    return time.perf_counter() - started


def run(rank, world, port, args):
    import torch
    from torch.distributed import rpc

    torch.set_num_threads(threads())
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                              num_worker_threads=8, rpc_timeout=120)
    if rank == 0:
        rpc.init_rpc("driver", rank=0, world_size=world, rpc_backend_options=options)
        workers = [f"worker{w}" for w in range(WORKERS)]
        # A worker's loop is one call: no RPC timeout on it (the launcher bounds the run).
        for future in [rpc.rpc_async(w, train, args=(args.warmup,), timeout=0) for w in workers]:
            future.wait()
        started = time.perf_counter()
        for future in [rpc.rpc_async(w, train, args=(args.steps,), timeout=0) for w in workers]:
            future.wait()
        took = time.perf_counter() - started
        print(json.dumps({"peer": "pytorch-rpc-ps", "version": torch.__version__,
                          "servers": SERVERS, "workers": WORKERS,
                          "steps_per_second": WORKERS * args.steps / took}))
    elif rank <= SERVERS:
        Server.store = Server(rank - 1)
        rpc.init_rpc(f"ps{rank - 1}", rank=rank, world_size=world, rpc_backend_options=options)
    else:
        rpc.init_rpc(f"worker{rank - 1 - SERVERS}", rank=rank, world_size=world,
                     rpc_backend_options=options)
    rpc.shutdown()


def launch(args):
    (port,) = free_ports(1)
    world = 1 + SERVERS + WORKERS
    lines = run_children(
        "torch_ps",
        [[__file__, "--rank", str(rank), "--port", str(port), "--steps", str(args.steps),
          "--warmup", str(args.warmup)] for rank in range(world)],
        RUN_MAX_S)
    print(json.dumps(lines[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--workload", choices=["dense"], default="dense",
                        help="the dense workload only (the sparse one has no PyTorch peer here)")
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit("torch_ps: --steps must be at least 1")
    if args.rank is None:
        launch(args)
    else:
        run(args.rank, 1 + SERVERS + WORKERS, args.port, args)


if __name__ == "__main__":
    main()
