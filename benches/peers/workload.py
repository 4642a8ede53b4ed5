"""What the peer programs share: cohort's dense benchmark model (src/workloads: an MLP
784-256-256-10 with relu, SGD at 0.1, softmax cross-entropy) in TensorFlow, and free ports on
127.0.0.1 for their tasks."""

import socket

FEATURES, HIDDEN, CLASSES = 784, (256, 256), 10
LEARNING_RATE = 0.1


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
