"""What a reader saw when it opened a dataset (:class:`DatasetSnapshot`: device, inode, size, mtime of the manifest
and each shard), checked on every descriptor read and at each epoch, and :func:`check_labels`: a dataset changed
under a reader is a :class:`DatasetChangedError` naming the file, not garbage batches. Plain ``os``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from shardprep.preprocess.format import manifest as manifest_lib


class DatasetChangedError(ValueError):
    """The files a reader reads are not the ones it opened, or hold what their manifest does not allow."""


class FileIdentity(NamedTuple):
    """Which file a path named (device, inode) and its state (size, modification time)."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> "FileIdentity":
        return cls(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def _difference(before: FileIdentity, after: FileIdentity | None) -> str:
    if after is None:
        return "it was removed"
    if (before.device, before.inode) != (after.device, after.inode):
        return "another file is in its place"
    if before.size != after.size:
        return f"{before.size:,} bytes then, {after.size:,} now"
    return "it was modified"


def _identity(path: str) -> FileIdentity | None:
    try:
        return FileIdentity.of(os.stat(path))
    except FileNotFoundError:
        return None


class DatasetSnapshot:
    """Identities of ``manifest.json`` and a split's shards; ``ValueError`` for a size unlike ``sizes``."""

    def __init__(self, data_dir: str, paths, sizes):
        self.data_dir = data_dir
        self.manifest_path = os.path.join(data_dir, manifest_lib.MANIFEST_NAME)
        self.manifest = _identity(self.manifest_path)
        self.paths = [os.fspath(path) for path in paths]
        self.shards = []
        wrong = []
        for path, size in zip(self.paths, sizes):
            identity = FileIdentity.of(os.stat(path))
            if size is not None and identity.size != int(size):
                wrong.append(f"{path}: {identity.size:,} bytes, the manifest says {int(size):,}")
            self.shards.append(identity)
        if wrong:
            raise ValueError("shards that disagree with the manifest (run `shardprep validate` on the dataset): "
                             + "; ".join(wrong))

    def changed(self, path: str, before: FileIdentity, after: FileIdentity | None) -> DatasetChangedError:
        return DatasetChangedError(
            f"{path} changed since the reader opened it ({_difference(before, after)}): {self.data_dir} was rebuilt "
            "or modified while being read; open the dataset again (a new reader) once it is complete, and run "
            f"`shardprep validate {self.data_dir}` if nothing was meant to rebuild it")

    def check_descriptor(self, shard: int, descriptor: int) -> None:
        """:class:`DatasetChangedError` if ``descriptor``, opened on shard ``shard``, is not the file as it was."""
        now = FileIdentity.of(os.fstat(descriptor))
        if now != self.shards[shard]:
            raise self.changed(self.paths[shard], self.shards[shard], now)

    def check(self) -> None:
        """Raises :class:`DatasetChangedError` if the manifest or any shard is not the file it was."""
        if self.manifest is not None:
            now = _identity(self.manifest_path)
            if now != self.manifest:
                raise self.changed(self.manifest_path, self.manifest, now)
        for path, before in zip(self.paths, self.shards):
            now = _identity(path)
            if now != before:
                raise self.changed(path, before, now)

    def check_path(self, path) -> bytes:
        """:meth:`check` for one shard, by path (bytes or str, as tf.data passes it); returns the path as bytes."""
        text = path.decode("utf-8") if isinstance(path, bytes) else str(path)
        before = self.shards[self.paths.index(text)]
        now = _identity(text)
        if now != before:
            raise self.changed(text, before, now)
        return text.encode("utf-8")


def check_labels(labels: np.ndarray, num_classes: int, ids: np.ndarray, starts: np.ndarray, paths,
                 data_dir: str) -> None:
    """:class:`DatasetChangedError` naming the shard and record of the first label outside ``0..num_classes-1``."""
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if not len(bad):
        return
    record_id = int(np.asarray(ids, np.int64)[bad[0]])
    shard = int(np.searchsorted(starts, record_id, side="right") - 1)
    raise DatasetChangedError(
        f"label {int(labels[bad[0]])} is outside 0..{num_classes - 1} (the manifest's {num_classes} classes) in "
        f"{paths[shard]} record {record_id - int(starts[shard])}: {data_dir} changed since the reader opened it, "
        f"or is damaged; run `shardprep validate {data_dir}`")
