"""What the peer programs share: cohort's benchmark models (src/workloads/bench.rs: the dense
MLP 784-256-256-10 with relu, SGD at 0.1, softmax cross-entropy; the sparse model, a
1,000,000 x 16 embedding summed over 26 ids per example and a logistic head, log loss) in
TensorFlow, and free ports on 127.0.0.1 for their tasks."""

import socket
import subprocess
import sys
import time

FEATURES, HIDDEN, CLASSES = 784, (256, 256), 10
LEARNING_RATE = 0.1
SPARSE_VOCAB, SPARSE_DIM, SPARSE_FIELDS, SPARSE_BATCH = 1_000_000, 16, 26, 512


def run_children(program, commands, limit_s, what="process"):
    """Starts one child per command (each a list of arguments to this Python), waits for all of
    them within `limit_s` seconds in all, and returns each one's last stdout line, parsed as
    JSON. Exits with a message naming `program` and the child when one fails or runs past the
    limit, after killing the others."""
    import json

    children = [subprocess.Popen([sys.executable, *command], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for command in commands]
    deadline = time.monotonic() + limit_s
    lines = []
    for index, child in enumerate(children):
        try:
            out, err = child.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for c in children:
                c.kill()
            sys.exit(f"{program}: {what} {index} ran past {limit_s}s")
        if child.returncode != 0:
            for c in children:
                c.kill()
            sys.exit(f"{program}: {what} {index} failed ({child.returncode}):\n{err[-4000:]}")
        lines.append(json.loads(out.strip().splitlines()[-1]) if out.strip() else None)
    return lines


def free_ports(n):
    """`n` TCP ports free on 127.0.0.1 now (held together, so that none repeats)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def model_and_optimizer(tf):
    """The MLP and its SGD optimizer; call it inside the strategy's scope."""
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(HIDDEN[0], activation="relu", input_shape=(FEATURES,)),
        tf.keras.layers.Dense(HIDDEN[1], activation="relu"),
        tf.keras.layers.Dense(CLASSES),
    ])
    return model, tf.keras.optimizers.SGD(LEARNING_RATE)


def per_example_loss(tf):
    """Softmax cross-entropy per example (reduced by the caller over the global batch)."""
    return tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def sparse_model_and_optimizer(tf):
    """The sparse model (ids [batch, 26] -> a click logit [batch, 1]) and its SGD optimizer; call
    it inside the strategy's scope. The embedding's gradient is row-sparse (IndexedSlices), so
    the servers update only the rows a batch touched, as cohort's do."""
    ids = tf.keras.Input((SPARSE_FIELDS,), dtype=tf.int64)
    rows = tf.keras.layers.Embedding(
        SPARSE_VOCAB, SPARSE_DIM,
        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05))(ids)
    pooled = tf.keras.layers.Lambda(lambda r: tf.reduce_sum(r, axis=1))(rows)
    logit = tf.keras.layers.Dense(1)(pooled)
    return tf.keras.Model(ids, logit), tf.keras.optimizers.SGD(LEARNING_RATE)
