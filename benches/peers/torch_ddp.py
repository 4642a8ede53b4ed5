#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel (gloo) on the workload of `cohort bench mwms`, as a peer
that command measures in the same run (`cohort bench mwms --peers`).

The workload is cohort's (src/workloads/mwms_bench.rs): a dense MLP 784-256-256-10 (relu, SGD
at 0.1, softmax cross-entropy), 256 examples per worker and step, one replica per worker, the
workers as processes on 127.0.0.1 (torchrun's shape), their gradients all-reduced by DDP over
gloo's TCP transport (buckets overlapped with the backward pass, DDP's default). Each worker
uses cores / workers threads for its ops, as cohort's workers do.

    python3 torch_ddp.py --workers 2 --steps 200 --warmup 20

starts the workers itself (each this script with --rank), waits for them (bounded), and prints
one JSON line: {"peer": "pytorch-ddp", "version": ..., "workers": N, "steps_per_second": R},
R being the slowest worker's timed steps over their time. Exit 1 with a message on stderr when a
worker fails.
"""

import argparse
import json
import os
import sys
import time

from workload import CLASSES, FEATURES, HIDDEN, LEARNING_RATE, free_ports, run_children

BATCH_PER_WORKER = 256
RUN_MAX_S = 600


def torch_model(torch):
    """The benchmark MLP in PyTorch (the same layers as workload.model_and_optimizer)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN[0]), nn.ReLU(),
        nn.Linear(HIDDEN[0], HIDDEN[1]), nn.ReLU(),
        nn.Linear(HIDDEN[1], CLASSES),
    )


def launch(args):
    (port,) = free_ports(1)
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    rates = run_children(
        "torch_ddp",
        [[__file__, "--rank", str(rank), "--workers", str(args.workers), "--port", str(port),
          "--threads", str(threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
         for rank in range(args.workers)],
        RUN_MAX_S, "worker")
    print(json.dumps({
        "peer": "pytorch-ddp",
        "version": rates[0]["version"],
        "workers": args.workers,
        "steps_per_second": min(r["steps_per_second"] for r in rates),
    }))


def worker(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.workers,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch_model(torch))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.rank)
    x = torch.randn(BATCH_PER_WORKER, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (BATCH_PER_WORKER,), generator=generator)

    def step():
        optimizer.zero_grad(set_to_none=True)
        # The local mean; DDP averages the gradients over the workers: the global batch's mean.
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(args.warmup):
        step().item()
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    loss.item()
    took = time.perf_counter() - started
    dist.destroy_process_group()
    print(json.dumps({"version": torch.__version__, "steps_per_second": args.steps / took}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.steps < 1 or args.workers < 1:
        sys.exit("torch_ddp: --steps and --workers must be at least 1")
    if args.rank is None:
        launch(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
