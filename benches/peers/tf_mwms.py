#!/usr/bin/env python3
"""TensorFlow's MultiWorkerMirroredStrategy on the workload of `cohort bench mwms`, as the peer
that command measures in the same run (`cohort bench mwms --peers`).

The workload is cohort's (src/workloads/mwms_bench.rs): a dense MLP 784-256-256-10 (relu, SGD
at 0.1, softmax cross-entropy), 256 examples per worker and step, one replica per worker, the
workers as processes on 127.0.0.1, their gradients all-reduced with TensorFlow's ring
collectives (CommunicationImplementation.RING, gRPC) in a custom training loop, as
TensorFlow's own MultiWorkerMirroredStrategy tutorial writes it. Each worker uses
cores / workers threads for its ops, as cohort's workers do.

    python3 tf_mwms.py --workers 2 --steps 200 --warmup 20

starts the workers itself (each this script with --task), waits for them (bounded), and prints
one JSON line: {"peer": "tensorflow-mwms", "version": ..., "workers": N, "steps_per_second": R},
R being the slowest worker's timed steps over their time. Exit 1 with a message on stderr when a
worker fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from workload import (CLASSES, FEATURES, free_ports, model_and_optimizer,
                      per_example_loss)

BATCH_PER_WORKER = 256
RUN_MAX_S = 600




def launch(args):
    ports = free_ports(args.workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.workers)
    children = []
    for task in range(args.workers):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": task}})
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["CUDA_VISIBLE_DEVICES"] = ""
        children.append(subprocess.Popen(
            [sys.executable, __file__, "--task", str(task), "--threads", str(threads),
             "--steps", str(args.steps), "--warmup", str(args.warmup)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    deadline = time.monotonic() + RUN_MAX_S
    rates = []
    for task, child in enumerate(children):
        try:
            out, err = child.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for c in children:
                c.kill()
            sys.exit(f"tf_mwms: worker {task} ran past {RUN_MAX_S}s")
        if child.returncode != 0:
            for c in children:
                c.kill()
            sys.exit(f"tf_mwms: worker {task} failed ({child.returncode}):\n{err[-4000:]}")
        rate = json.loads(out.strip().splitlines()[-1])
        if rate["replicas"] != args.workers:
            sys.exit(f"tf_mwms: worker {task} trained with {rate['replicas']} replicas, "
                     f"not {args.workers}")
        rates.append(rate)
    print(json.dumps({
        "peer": "tensorflow-mwms",
        "version": rates[0]["version"],
        "workers": args.workers,
        "steps_per_second": min(r["steps_per_second"] for r in rates),
    }))


def worker(args):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    workers = strategy.num_replicas_in_sync
    global_batch = BATCH_PER_WORKER * workers
    with strategy.scope():
        model, optimizer = model_and_optimizer(tf)
    loss_fn = per_example_loss(tf)
    x = tf.random.stateless_normal([BATCH_PER_WORKER, FEATURES], seed=[1, args.task])
    y = tf.random.stateless_uniform([BATCH_PER_WORKER], seed=[2, args.task], maxval=CLASSES,
                                    dtype=tf.int32)

    @tf.function
    def train_step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per_replica = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for _ in range(args.warmup):
        train_step(x, y).numpy()
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(x, y)
    loss.numpy()
    took = time.perf_counter() - started
    print(json.dumps({"version": tf.__version__, "replicas": workers,
                      "steps_per_second": args.steps / took}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--task", type=int)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.steps < 1 or args.workers < 1:
        sys.exit("tf_mwms: --steps and --workers must be at least 1")
    if args.task is None:
        launch(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
