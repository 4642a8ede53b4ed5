"""The data of TensorFlow's parameter-server tutorial: which heroes a row names, and whether
one of them is "avenger" (the label). Shared by ``ps_tutorial.py`` and ``ps_tutorial_torch.py``;
the workers import it beside the script."""

from __future__ import annotations

import random
from typing import Iterator

import numpy as np

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
# Row 0 is the out-of-vocabulary row, as Keras' StringLookup makes it.
VOCAB_ROWS = len(FEATURE_VOCAB) + 1
BATCH_SIZE = 32


def lookup(word: str) -> int:
    """A word's row (StringLookup: 0 for a word outside the vocabulary)."""
    return FEATURE_VOCAB.index(word) + 1 if word in FEATURE_VOCAB else 0


def examples(num_examples: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The tutorial's ``feature_and_label_gen``: 3 distinct heroes per row, label 1 when one
    is "avenger"; as row ids and float labels."""
    rng = random.Random(seed)
    features, labels = [], []
    for _ in range(num_examples):
        heroes = rng.sample(FEATURE_VOCAB, 3)
        features.append([lookup(h) for h in heroes])
        labels.append(1.0 if "avenger" in heroes else 0.0)
    return np.array(features, dtype=np.int64), np.array(labels, dtype=np.float32)


def batches(input_context) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A worker's dataset: ``shuffle(200).batch(32).repeat()`` of the examples, shuffled by a
    seed of the worker's own."""
    ids, labels = examples()
    rng = np.random.default_rng(1000 + input_context.input_pipeline_id)
    while True:
        order = rng.permutation(len(ids))
        for start in range(0, len(ids), BATCH_SIZE):
            chosen = order[start : start + BATCH_SIZE]
            yield ids[chosen], labels[chosen]
