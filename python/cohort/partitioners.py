"""How variables are split over the parameter servers: TensorFlow's partitioners
(``tf.distribute.experimental.partitioners``). A variable is split by rows."""

from __future__ import annotations

import abc

_NO_LIMIT = 2**31 - 1


class Partitioner(abc.ABC):
    """A partitioner; see the subclasses."""

    @abc.abstractmethod
    def spec(self) -> tuple[str, int, int]:
        """What the runtime is given: ``(kind, a, b)``."""


class FixedShardsPartitioner(Partitioner):
    """Exactly ``num_shards`` shards (fewer if the variable has fewer rows)."""

    def __init__(self, num_shards: int) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, not {num_shards}")
        self.num_shards = num_shards

    def spec(self) -> tuple[str, int, int]:
        return ("fixed", self.num_shards, 0)


class MinSizePartitioner(Partitioner):
    """As many shards as possible, each at least ``min_shard_bytes``, at most ``max_shards``."""

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1) -> None:
        if min_shard_bytes < 1 or max_shards < 1:
            raise ValueError("min_shard_bytes and max_shards must be at least 1")
        self.min_shard_bytes = min_shard_bytes
        self.max_shards = max_shards

    def spec(self) -> tuple[str, int, int]:
        return ("min_size", self.min_shard_bytes, self.max_shards)


class MaxSizePartitioner(Partitioner):
    """As few shards as possible, each at most ``max_shard_bytes``, at most ``max_shards``."""

    def __init__(self, max_shard_bytes: int, max_shards: int | None = None) -> None:
        if max_shard_bytes < 1 or (max_shards is not None and max_shards < 1):
            raise ValueError("max_shard_bytes and max_shards must be at least 1")
        self.max_shard_bytes = max_shard_bytes
        self.max_shards = max_shards

    def spec(self) -> tuple[str, int, int]:
        return ("max_size", self.max_shard_bytes, self.max_shards or _NO_LIMIT)
