"""The typed values validate's stages pass: the shards to read, where a record is, and contact-sheet candidates."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from shardprep.preprocess.dataset import ShardEntry


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One listed shard to read: its split, path relative to the dataset, full path and manifest entry."""

    split: str
    file: str
    path: str
    expected: ShardEntry


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """Which records become contact-sheet candidates, and how big their thumbnails may be."""

    split: str
    fraction: float
    cell_cap: int


class RecordLocation(NamedTuple):
    """Where one record is: its split, shard (relative to the dataset), 0-based index in it, and image/filename.

    Ordered as a tuple, so the lowest location is the first record in shard order."""

    split: str
    file: str
    index: int
    filename: str

    def to_json(self) -> dict:
        return {"split": self.split, "file": self.file, "index": self.index, "filename": self.filename}


class Sample(NamedTuple):
    """A contact-sheet candidate: its sample rank (the lowest ranks per class are shown), key and thumbnail."""

    rank: float
    filename: str
    height: int
    width: int
    pixels: bytes  # height x width x 3 uint8


@dataclasses.dataclass(frozen=True)
class NearDuplicateOptions:
    """The near-duplicate search's threshold (bits of the perceptual hash) and the closest pairs listed per split
    pair."""

    max_distance: int
    pairs_listed: int
