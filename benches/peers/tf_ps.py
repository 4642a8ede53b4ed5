#!/usr/bin/env python3
"""TensorFlow's ParameterServerStrategy on the dense and sparse workloads of `cohort bench ps`,
as the peer that command measures in the same run (`cohort bench ps --peers`).

The workloads are cohort's (src/workloads/bench.rs): `dense`, an MLP 784-256-256-10 (relu, SGD
at 0.1, softmax cross-entropy), batch 256 of synthetic examples per closure; `sparse`, a
1,000,000 x 16 embedding summed over 26 random ids per example and a logistic head (log loss),
batch 512 (the embedding split over the servers, updated by rows); 1 chief + 2
parameter servers + 2 workers as processes on 127.0.0.1 (gRPC); the variables of 256 KiB and
more split over the servers (MinSizePartitioner, as cohort's bench does and TensorFlow's guide
sets it up); the chief's ClusterCoordinator schedules one closure per step (a custom training
loop, as TensorFlow's parameter-server tutorial writes it). Every process gets one op thread
per core / processes for its kernels, at least 1 (cohort's tasks get one compute thread each
here), and TensorFlow's default inter-op pool (one inter-op thread deadlocks a worker).

    python3 tf_ps.py --workload dense --steps 1000 --warmup 30

starts the servers and workers (each this script with --task), runs the chief itself, stops
the others, and prints one JSON line: {"peer": "tensorflow-ps", "version": ...,
"steps_per_second": R}. Exit 1 with a message on stderr when a task fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from workload import (CLASSES, FEATURES, SPARSE_BATCH, SPARSE_FIELDS, SPARSE_VOCAB,
                      free_ports, model_and_optimizer, per_example_loss,
                      sparse_model_and_optimizer)

BATCH = 256
SERVERS, WORKERS = 2, 2
MIN_SHARD_BYTES = 256 << 10




def threads():
    return max(1, (os.cpu_count() or 1) // (1 + SERVERS + WORKERS))


def serve(task_type, index):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # One inter-op thread deadlocks a worker (a remote function waiting on its own input);
    # TensorFlow's default inter-op pool stays.
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads())
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task_type, task_index=index,
                                  protocol="grpc", config=config, start=True)
    server.join()


def chief(args):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads())
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=SERVERS)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    sparse = args.workload == "sparse"
    batch_size = SPARSE_BATCH if sparse else BATCH
    with strategy.scope():
        model, optimizer = (sparse_model_and_optimizer if sparse else model_and_optimizer)(tf)
    if sparse:
        def loss_fn(labels, logits):
            return tf.squeeze(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=logits), axis=1)
    else:
        loss_fn = per_example_loss(tf)

    def dataset_fn(_input_context):
        if sparse:
            x = tf.random.stateless_uniform([batch_size * 4, SPARSE_FIELDS], seed=[1, 0],
                                            maxval=SPARSE_VOCAB, dtype=tf.int64)
            y = tf.cast(tf.random.stateless_uniform([batch_size * 4, 1], seed=[2, 0]) < 0.3,
                        tf.float32)
        else:
            x = tf.random.stateless_normal([batch_size * 4, FEATURES], seed=[1, 0])
            y = tf.random.stateless_uniform([batch_size * 4], seed=[2, 0], maxval=CLASSES,
                                            dtype=tf.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size, drop_remainder=True)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(iterator):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        losses = strategy.run(replica_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    for _ in range(args.warmup):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    started = time.perf_counter()
    for _ in range(args.steps):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    took = time.perf_counter() - started
    print(json.dumps({"peer": "tensorflow-ps", "version": tf.__version__,
                      "workload": args.workload, "servers": SERVERS, "workers": WORKERS,
                      "steps_per_second": args.steps / took}))


def launch(args):
    ports = free_ports(1 + SERVERS + WORKERS)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "ps": [f"127.0.0.1:{p}" for p in ports[1:1 + SERVERS]],
        "worker": [f"127.0.0.1:{p}" for p in ports[1 + SERVERS:]],
    }
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    children = []
    try:
        for task_type, count in [("ps", SERVERS), ("worker", WORKERS)]:
            for index in range(count):
                env = dict(base, TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": task_type, "index": index}}))
                children.append(subprocess.Popen(
                    [sys.executable, __file__, "--task", f"{task_type}:{index}",
                     "--workload", args.workload], env=env,
                    stdout=subprocess.DEVNULL, stderr=open(os.devnull, "w") if not os.environ.get("TF_PS_DEBUG") else None))
        os.environ.update(base)
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "chief", "index": 0}})
        chief(args)
    finally:
        for child in children:
            child.kill()
            child.wait()


def main():
    if os.environ.get("TF_PS_DEBUG"):
        import faulthandler
        faulthandler.dump_traceback_later(40, exit=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--task")
    parser.add_argument("--workload", choices=["dense", "sparse"], default="dense")
    args = parser.parse_args()
    if args.steps < 1:
        sys.exit("tf_ps: --steps must be at least 1")
    if args.task is None:
        launch(args)
    else:
        task_type, index = args.task.split(":")
        serve(task_type, int(index))


if __name__ == "__main__":
    main()
