"""Compact lists of pointers to spilled records: what the preprocess job's shuffles carry instead of images.

The decode stage appends each record to its bundle's spill file and notes the record's sort key (two 64-bit
integers, :func:`preprocess.sharding.sort_key`) and where it lies. One :class:`RecordPointers` holds those notes
for a bundle (one split, one spill file) in four integer arrays; bucketing and shard assignment cut it into smaller
ones with array arithmetic. So the runner moves a few elements per bundle instead of one per image, and no stage
makes Python objects per record: on Beam's local runner a bundle is a worker's whole share of the dataset, and
per-record objects (paths, keys, tuples) made a run's memory grow with its number of inputs. A record costs 32 bytes.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable

import numpy as np


class RecordPointers:
    """Records of one split in one spill file: sort keys ``(high, low)`` and ``(offset, size)`` in the file."""

    __slots__ = ("split", "spill_path", "_columns", "file_info")

    def __init__(self, split: str, spill_path: str, columns: np.ndarray | None = None, file_info=None):
        self.split, self.spill_path = split, spill_path
        # (records, bytes, sha256) of the whole spill file when its records were written in sort-key order and
        # are all of one split (a decode group's file); None for a bundle's file. Lets a shard that is exactly
        # this file take it as it is.
        self.file_info: tuple[int, int, str] | None = file_info
        # Four uint64 per record: high and low halves of the sort key, offset, size. A flat growable array while a
        # bundle is decoded, an (N, 4) numpy array once cut or unpickled.
        self._columns: array | np.ndarray = array("Q") if columns is None else columns

    def append(self, sort_key: tuple[int, int], offset: int, size: int) -> None:
        if not isinstance(self._columns, array):
            self._columns = array("Q", self._columns.tobytes())
        self._columns.extend((sort_key[0], sort_key[1], offset, size))

    def __len__(self) -> int:
        return len(self._columns) // 4 if isinstance(self._columns, array) else len(self._columns)

    @property
    def columns(self) -> np.ndarray:
        """The records as an (N, 4) uint64 array: high, low, offset, size."""
        if isinstance(self._columns, array):
            return np.array(self._columns, dtype=np.uint64).reshape(-1, 4)
        return self._columns

    def sort_keys(self) -> list[tuple[int, int]]:
        return [(int(high), int(low)) for high, low in self.columns[:, :2]]

    def pointers(self) -> list[tuple[str, int, int]]:
        """(spill file, offset, size) per record, in insertion order."""
        return [(self.spill_path, int(offset), int(size)) for offset, size in self.columns[:, 2:]]

    def total_bytes(self) -> int:
        return int(self.columns[:, 3].sum())

    def by_bucket(self, buckets: int) -> dict[int, RecordPointers]:
        """The records cut by hash-range bucket (``preprocess.sharding.bucket_of`` of the high half), order kept."""
        columns = self.columns
        return self._partition(columns, bucket_indices(columns[:, 0], buckets))

    def by_shard(self, boundaries: tuple) -> dict[int, RecordPointers]:
        """The records cut by shard (``preprocess.sharding.shard_of`` of each sort key), order kept."""
        columns = self.columns
        boundary_highs = np.array([high for high, _ in boundaries], dtype=np.uint64)
        shards = np.searchsorted(boundary_highs, columns[:, 0], side="right")
        # Where a high half equals a boundary's, the low half decides, as the full sort key compares.
        for i in np.flatnonzero(np.isin(columns[:, 0], boundary_highs)):
            shards[i] = bisect.bisect_right(boundaries, (int(columns[i, 0]), int(columns[i, 1])))
        return self._partition(columns, shards)

    def _partition(self, columns: np.ndarray, groups: np.ndarray) -> dict[int, RecordPointers]:
        return {int(group): RecordPointers(self.split, self.spill_path, columns[groups == group], self.file_info)
                for group in np.unique(groups)}

    def is_whole_sorted_file(self) -> bool:
        """True when these records are all of their spill file's records, which is in sort-key order."""
        return self.file_info is not None and self.file_info[0] == len(self)

    def __eq__(self, other) -> bool:
        return (isinstance(other, RecordPointers)
                and (self.split, self.spill_path, self.file_info) == (other.split, other.spill_path, other.file_info)
                and np.array_equal(self.columns, other.columns))

    def __repr__(self) -> str:
        return f"RecordPointers({self.split!r}, {self.spill_path!r}, {len(self)} records)"

    def __getstate__(self):
        return self.split, self.spill_path, self.columns.tobytes(), self.file_info

    def __setstate__(self, state) -> None:
        self.split, self.spill_path, data, self.file_info = state
        self._columns = np.frombuffer(data, dtype=np.uint64).reshape(-1, 4)


def bucket_indices(hashes: np.ndarray, buckets: int) -> np.ndarray:
    """``preprocess.sharding.bucket_of`` for an array of 64-bit hashes, exactly, in 64-bit arithmetic.

    ``(h * B) >> 64`` with ``h = hi * 2**32 + lo`` is ``(hi * B + ((lo * B) >> 32)) >> 32``; every product stays
    below 2**64 while ``B`` < 2**32.
    """
    if not 0 < buckets < 2**31:
        raise ValueError(f"bucket count {buckets} out of range")
    b = np.uint64(buckets)
    high, low = hashes >> np.uint64(32), hashes & np.uint64(0xFFFFFFFF)
    return (high * b + ((low * b) >> np.uint64(32))) >> np.uint64(32)


def sorted_sort_keys(parts: Iterable[RecordPointers]) -> np.ndarray:
    """The sort keys of every record in ``parts`` as a sorted (N, 2) array: one bucket's keys."""
    keys = np.concatenate([part.columns[:, :2] for part in parts] or [np.empty((0, 2), np.uint64)])
    return keys[np.lexsort((keys[:, 1], keys[:, 0]))]


def merge_sorted_pointers(parts: Iterable[RecordPointers]) -> list[tuple[str, int, int]]:
    """The (spill file, offset, size) of every record in ``parts``, in sort-key order: one shard's contents."""
    parts = list(parts)
    if not parts:
        return []
    columns = np.concatenate([part.columns for part in parts])
    paths = np.concatenate([np.full(len(part), i) for i, part in enumerate(parts)])
    order = np.lexsort((columns[:, 1], columns[:, 0]))
    return [(parts[paths[i]].spill_path, int(columns[i, 2]), int(columns[i, 3])) for i in order]
