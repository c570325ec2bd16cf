"""Sharding and statistics arithmetic of the preprocess job (pure): shard ``k`` holds the records whose rank ``r`` in
a seeded order has ``r * S // N == k``; shard starts are found by hash-range buckets, not a sort of the split."""

from __future__ import annotations

import dataclasses
import hashlib
import math

from shardprep.preprocess.format.config import TARGET_SHARD_BYTES

BUCKET_TARGET = 8192  # sort keys per bucket when finding shard boundaries: bounds the work of one worker


def num_shards_for(num_examples: int, total_bytes: int, requested: int | None) -> int:
    """``--num-shards``, or the smallest power of two giving shards of at most 200 MB; never more than records."""
    if requested:
        shards = requested
    else:
        shards = 1
        while total_bytes / shards > TARGET_SHARD_BYTES:
            shards *= 2
    return max(1, min(shards, num_examples))


def decode_groups(num_inputs: int, predicted_bytes: int | None, requested: int | None, min_groups: int) -> int:
    """How many groups of consecutive ranks a split is decoded in: the shards when known before decoding (cut in
    equal pieces to reach ``min_groups``), else ``min_groups``."""
    known = requested or predicted_bytes is not None
    shards = num_shards_for(num_inputs, predicted_bytes or 0, requested) if known else 1
    groups = shards * -(-max(1, min_groups) // shards)
    return max(1, min(groups, num_inputs))


def sort_key(seed: int, split: str, key: str) -> tuple[int, int]:
    """A record's place in the seeded order: the first 128 bits of SHA-256(seed, split, key) as two 64-bit halves."""
    digest = hashlib.sha256(f"{seed}\0{split}\0{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


def num_buckets(num_examples: int) -> int:
    return max(1, math.ceil(num_examples / BUCKET_TARGET))


def boundary_ranks(num_examples: int, shards: int) -> list[int]:
    """First rank of shards 1..S-1, for shard(rank) = rank * S // N."""
    return [-(-k * num_examples // shards) for k in range(1, shards)]


def collect_boundaries(pairs) -> dict[str, tuple]:
    """{split: sort keys starting shards 1..S-1} from (split, (shard, sort key)) pairs."""
    by_split: dict[str, list] = {}
    for split, (shard, key) in pairs:
        by_split.setdefault(split, []).append((shard, key))
    return {split: tuple(key for _, key in sorted(items)) for split, items in by_split.items()}


def pixel_statistics(pixel_sums) -> tuple[list[float] | None, list[float] | None]:
    """Per-channel mean and standard deviation (0-255) from (pixels, 3 sums, 3 sums of squares)."""
    if not pixel_sums or not pixel_sums[0]:
        return None, None
    pixels, sums, squares = pixel_sums[0], pixel_sums[1:4], pixel_sums[4:7]
    mean = [s / pixels for s in sums]
    std = [math.sqrt(max(0.0, q / pixels - m * m)) for q, m in zip(squares, mean)]
    return [round(m, 6) for m in mean], [round(s, 6) for s in std]


@dataclasses.dataclass(slots=True)
class RecordSummary:
    """Per-split records and bytes, per-(split, label) records, the largest label and exact pixel sums of written
    records: one per bundle, merged."""
    examples: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    classes: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    pixel_sums: tuple[int, ...] = ()
    max_label: int = -1

    def add(self, split: str, label: int, num_bytes: int) -> None:
        self.examples[split] = self.examples.get(split, 0) + 1
        self.bytes[split] = self.bytes.get(split, 0) + num_bytes
        self.classes[(split, label)] = self.classes.get((split, label), 0) + 1
        self.max_label = max(self.max_label, label)

    def add_pixels(self, sums: tuple[int, ...]) -> None:
        """Adds (pixels, 3 sums, 3 sums of squares), exactly."""
        self.pixel_sums = tuple(a + b for a, b in zip(self.pixel_sums, sums)) if self.pixel_sums else tuple(sums)

    @classmethod
    def merge(cls, summaries) -> RecordSummary:
        total = cls()
        for part in summaries:
            for counts, more in ((total.examples, part.examples), (total.bytes, part.bytes),
                                 (total.classes, part.classes)):
                for key, n in more.items():
                    counts[key] = counts.get(key, 0) + n
            if part.pixel_sums:
                total.add_pixels(part.pixel_sums)
            total.max_label = max(total.max_label, part.max_label)
        return total
