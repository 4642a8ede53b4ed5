#!/usr/bin/env python3
"""gloo's all-reduce (through torch.distributed) as the peer `cohort bench allreduce --peers`
measures in the same run, on the rows where cohort's members are processes on 127.0.0.1.

Each member is a process (torchrun's shape) with a tensor of its own of `--mib` MiB of f32,
all-reduced (SUM) by gloo's default algorithm over its TCP transport; as cohort's member
processes do, a fresh process warms up with as many calls as it times, 1 GiB of each (at least
3 and at most 40 calls).

    python3 gloo_allreduce.py --members 2 --mib 64

starts the members itself (each this script with --rank), waits for them (bounded), and prints
one JSON line: {"peer": "gloo", "version": ..., "members": N, "mib": M, "seconds": S}, S being
the slowest member's mean seconds per call. Exit 1 with a message on stderr when a member fails.
"""

import argparse
import json
import sys
import time

from workload import free_ports, run_children

RUN_MAX_S = 120
PROCESS_BYTES = 1 << 30


def launch(args):
    (port,) = free_ports(1)
    results = run_children(
        "gloo_allreduce",
        [[__file__, "--rank", str(rank), "--members", str(args.members), "--mib", str(args.mib),
          "--port", str(port)] for rank in range(args.members)],
        RUN_MAX_S, "member")
    print(json.dumps({
        "peer": "gloo",
        "version": results[0]["version"],
        "members": args.members,
        "mib": args.mib,
        "seconds": max(r["seconds"] for r in results),
    }))


def member(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # Reduction is gloo's own code on its own threads; one op thread as cohort's members.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.members,
                            timeout=timedelta(seconds=60))
    tensor = torch.ones(args.mib * (1 << 20) // 4, dtype=torch.float32)
    rounds = max(3, min(40, PROCESS_BYTES // (args.mib << 20)))
    for _ in range(rounds):
        dist.all_reduce(tensor)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(tensor)
    took = time.perf_counter() - started
    dist.destroy_process_group()
    print(json.dumps({"version": torch.__version__, "seconds": took / rounds}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.members < 2 or args.mib < 1:
        sys.exit("gloo_allreduce: --members must be at least 2 and --mib at least 1")
    if args.rank is None:
        launch(args)
    else:
        member(args)


if __name__ == "__main__":
    main()
