"""Pointers to spilled records (sort keys and places in uint64 arrays, 32 bytes a record): what the preprocess job's
shuffles carry instead of images, cut by bucket or shard with array arithmetic."""

from __future__ import annotations

import bisect
import copy
from array import array
from collections.abc import Iterable

import numpy as np


class _KeyedRows:
    """Rows of one split, each a 128-bit sort key ``(high, low)`` and ``WIDTH - 2`` more uint64 columns: a growable
    ``array`` while appended, an (N, WIDTH) numpy array once cut or unpickled."""
    __slots__ = ("split", "_columns")
    WIDTH = 2

    def __init__(self, split: str, columns: np.ndarray | None = None):
        self.split = split
        self._columns: array | np.ndarray = array("Q") if columns is None else columns

    def _extend(self, values: tuple) -> None:
        if not isinstance(self._columns, array):
            self._columns = array("Q", self._columns.tobytes())
        self._columns.extend(values)

    def __len__(self) -> int:
        return len(self._columns) // self.WIDTH if isinstance(self._columns, array) else len(self._columns)

    @property
    def columns(self) -> np.ndarray:
        if isinstance(self._columns, array):
            return np.array(self._columns, dtype=np.uint64).reshape(-1, self.WIDTH)
        return self._columns

    def by_bucket(self, buckets: int) -> dict:
        """The rows cut by hash-range bucket (:func:`bucket_indices` of the high half), order kept."""
        columns = self.columns
        return self._partition(columns, bucket_indices(columns[:, 0], buckets))

    def by_shard(self, boundaries: tuple) -> dict:
        """The rows cut by shard (``bisect_right(boundaries, sort key)``), order kept."""
        columns = self.columns
        boundary_highs = np.array([high for high, _ in boundaries], dtype=np.uint64)
        shards = np.searchsorted(boundary_highs, columns[:, 0], side="right")
        # Where a high half equals a boundary's, the low half decides, as the full sort key compares.
        for i in np.flatnonzero(np.isin(columns[:, 0], boundary_highs)):
            shards[i] = bisect.bisect_right(boundaries, (int(columns[i, 0]), int(columns[i, 1])))
        return self._partition(columns, shards)

    def _partition(self, columns: np.ndarray, groups: np.ndarray) -> dict:
        return {int(group): self._with_columns(columns[groups == group]) for group in np.unique(groups)}

    def _with_columns(self, columns: np.ndarray):
        part = copy.copy(self)
        part._columns = columns
        return part

    _FIELDS: tuple[str, ...] = ()  # attributes besides the split and the rows: compared, shown and pickled
    _NOUN = "rows"

    def _identity(self) -> tuple:
        return (self.split, *(getattr(self, name) for name in self._FIELDS))

    def __eq__(self, other) -> bool:
        return (type(other) is type(self) and self._identity() == other._identity()
                and np.array_equal(self.columns, other.columns))

    def __repr__(self) -> str:
        shown = ", ".join(repr(value) for value in self._identity() if value is not None)
        return f"{type(self).__name__}({shown}, {len(self)} {self._NOUN})"


class SortKeys(_KeyedRows):
    """The sort keys of one split's listed inputs, each with the input's index in its batch."""
    __slots__ = ()
    WIDTH = 3

    def append(self, sort_key: tuple[int, int], index: int) -> None:
        self._extend((sort_key[0], sort_key[1], index))

    def indices(self) -> list[int]:
        return [int(index) for index in self.columns[:, 2]]

    _NOUN = "keys"


class RecordPointers(_KeyedRows):
    """Records of one split in one spill file: sort keys ``(high, low)`` and ``(offset, size)`` in the file."""
    __slots__ = ("spill_path", "file_info")
    WIDTH = 4
    _FIELDS, _NOUN = ("spill_path", "file_info"), "records"

    def __init__(self, split: str, spill_path: str, columns: np.ndarray | None = None, file_info=None):
        super().__init__(split, columns)
        self.spill_path = spill_path
        # (records, bytes, sha256) of a decode group's sorted spill file, which a shard can take whole; else None.
        self.file_info: tuple[int, int, str] | None = file_info

    def append(self, sort_key: tuple[int, int], offset: int, size: int) -> None:
        self._extend((sort_key[0], sort_key[1], offset, size))

    def is_whole_sorted_file(self) -> bool:
        """True when these are all of their spill file's records, which is in sort-key order."""
        return self.file_info is not None and self.file_info[0] == len(self)


def bucket_indices(hashes: np.ndarray, buckets: int) -> np.ndarray:
    """Each 64-bit hash's bucket ``(h * B) >> 64`` (a range partition: bucket order is sort order), exact as ``(hi *
    B + ((lo * B) >> 32)) >> 32``, every product below 2**64 while B < 2**32."""
    if not 0 < buckets < 2**31:
        raise ValueError(f"bucket count {buckets} out of range")
    b = np.uint64(buckets)
    high, low = hashes >> np.uint64(32), hashes & np.uint64(0xFFFFFFFF)
    return (high * b + ((low * b) >> np.uint64(32))) >> np.uint64(32)


def sorted_sort_keys(parts: Iterable[_KeyedRows]) -> np.ndarray:
    """The sort keys of every row in ``parts`` as a sorted (N, 2) array: one bucket's."""
    keys = np.concatenate([part.columns[:, :2] for part in parts] or [np.empty((0, 2), np.uint64)])
    return keys[np.lexsort((keys[:, 1], keys[:, 0]))]


def merge_sorted_pointers(parts: Iterable[RecordPointers]) -> list[tuple[str, int, int]]:
    """(spill file, offset, size) of every record in ``parts``, in sort-key order: one shard's contents."""
    parts = list(parts)
    if not parts:
        return []
    columns = np.concatenate([part.columns for part in parts])
    paths = np.concatenate([np.full(len(part), i) for i, part in enumerate(parts)])
    order = np.lexsort((columns[:, 1], columns[:, 0]))
    return [(parts[paths[i]].spill_path, int(columns[i, 2]), int(columns[i, 3])) for i in order]
