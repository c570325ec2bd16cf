"""One batch of a local split by record ids as NumPy arrays (no TensorFlow): :class:`FixedLayoutSource` (``preadv``
gathers) or :class:`ExampleSource` (records found by their TFRecord framing, read with one ``pread`` each, decoded
as TensorFlow decodes them). What a reader saw when it opened a dataset (:class:`DatasetSnapshot`: device, inode,
size, mtime of the manifest and each shard) is checked on every descriptor read and at each epoch, and labels against
the classes: a dataset changed under a reader is a :class:`DatasetChangedError` naming the file, not garbage batches.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import numpy as np

from shardprep.preprocess.format import encodings, record_format, tfrecord_io
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest
from shardprep.train.data import record_gather
from shardprep.train.data.record_gather import OPEN_FLAGS, RECORD_INDEX_BITS, ReusedBuffers, open_shards
from shardprep.train.data.record_order import locate, shard_starts

_HEADER, _FOOTER = tfrecord_io.HEADER_BYTES, tfrecord_io.FOOTER_BYTES


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
        self.shards = [FileIdentity.of(os.stat(path)) for path in self.paths]
        wrong = [f"{path}: {identity.size:,} bytes, the manifest says {int(size):,}"
                 for path, identity, size in zip(self.paths, self.shards, sizes)
                 if size is not None and identity.size != int(size)]
        if wrong:
            raise ValueError("shards that disagree with the manifest (run `shardprep validate` on the dataset): "
                             + "; ".join(wrong))

    def _unchanged(self, path: str, before: FileIdentity, now: FileIdentity | None) -> None:
        if now != before:
            raise DatasetChangedError(
                f"{path} changed since the reader opened it ({_difference(before, now)}): {self.data_dir} was rebuilt "
                "or modified while being read; open the dataset again (a new reader) once it is complete, and run "
                f"`shardprep validate {self.data_dir}` if nothing was meant to rebuild it")

    def check_descriptor(self, shard: int, descriptor: int) -> None:
        """:class:`DatasetChangedError` if ``descriptor``, opened on shard ``shard``, is not the file as it was."""
        self._unchanged(self.paths[shard], self.shards[shard], FileIdentity.of(os.fstat(descriptor)))

    def check(self) -> None:
        """Raises :class:`DatasetChangedError` if the manifest or any shard is not the file it was."""
        if self.manifest is not None:
            self._unchanged(self.manifest_path, self.manifest, _identity(self.manifest_path))
        for path, before in zip(self.paths, self.shards):
            self._unchanged(path, before, _identity(path))

    def check_path(self, path) -> bytes:
        """:meth:`check` for one shard, by path (bytes or str, as tf.data passes it); returns the path as bytes."""
        text = path.decode("utf-8") if isinstance(path, bytes) else str(path)
        self._unchanged(text, self.shards[self.paths.index(text)], _identity(text))
        return text.encode("utf-8")


class ShardIndex(NamedTuple):
    """Where the data of each record of one shard starts, and how long it is."""

    path: str
    offsets: np.ndarray
    lengths: np.ndarray


def record_offsets(path: str, expected: int | None = None) -> ShardIndex:
    """Each record's data offset and length from the framing; ``ValueError`` naming the file if wrong."""
    offsets: list[int] = []
    lengths: list[int] = []
    fd = os.open(path, OPEN_FLAGS)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            header = os.pread(fd, _HEADER, position)
            if problem := _header_problem(header, size - position):
                raise ValueError(f"{path}: record {len(offsets)} (byte {position}) {problem} "
                                 "(run `shardprep validate` on the dataset)")
            (length,) = struct.unpack("<Q", header[:8])
            offsets.append(position + _HEADER)
            lengths.append(length)
            position += _HEADER + length + _FOOTER
    finally:
        os.close(fd)
    if expected is not None and len(offsets) != expected:
        raise ValueError(f"{path}: {len(offsets)} records, the manifest says {expected} "
                         "(run `shardprep validate` on the dataset)")
    return ShardIndex(path, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64))


def _header_problem(header: bytes, left: int) -> str | None:
    if len(header) < _HEADER:
        return "has a truncated header"
    if tfrecord_io.masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
        return "has a wrong length checksum"
    (length,) = struct.unpack("<Q", header[:8])
    if _HEADER + length + _FOOTER > left:
        return "runs past the end of the file"
    return None


class ExampleGather:
    """``global ids -> serialized Examples`` from the split's shards; ``verify`` checks each record's data CRC."""

    def __init__(self, paths, counts, verify: bool = False, snapshot=None):
        self.paths = [os.fspath(path) for path in paths]
        self.snapshot = snapshot
        self.indexes = [record_offsets(path, int(count)) if count else ShardIndex(path, np.zeros(0, np.int64),
                                                                                    np.zeros(0, np.int64))
                        for path, count in zip(self.paths, counts)]
        self.verify = verify
        self.starts = shard_starts(counts)

    def __call__(self, ids) -> list[bytes]:
        shards, records = locate(self.starts, ids)
        with open_shards(self.paths, shards, self.snapshot) as descriptors:
            return [self._read(descriptors[shard], shard, record)
                    for shard, record in zip(shards.tolist(), records.tolist())]

    def _read(self, fd: int, shard: int, record: int) -> bytes:
        index = self.indexes[shard]
        offset, length = int(index.offsets[record]), int(index.lengths[record])
        wanted = length + _FOOTER if self.verify else length
        data = os.pread(fd, wanted, offset)
        if len(data) != wanted:
            raise OSError(f"{self.paths[shard]}: record {record} ends {wanted - len(data)} bytes early: the shard "
                          "changed since it was indexed (run `shardprep validate` on the dataset)")
        if self.verify:
            data, footer = data[:length], data[length:]
            if tfrecord_io.masked_crc32c(data) != struct.unpack("<I", footer)[0]:
                raise OSError(f"{self.paths[shard]}: record {record} (byte {offset - _HEADER}): data checksum "
                              "mismatch (run `shardprep validate` on the dataset)")
        return data


class _SplitSource:
    """What both sources share: the split's shards, where each one's ids start, the snapshot, the label check."""

    def __init__(self, paths, counts, snapshot: DatasetSnapshot | None, num_classes: int | None):
        self.paths = [os.fspath(path) for path in paths]
        self.starts = shard_starts(counts)
        self.snapshot, self.num_classes = snapshot, num_classes

    def check_labels(self, ids: np.ndarray, labels: np.ndarray) -> None:
        """:class:`DatasetChangedError` naming the shard and record of the first label outside the classes."""
        classes = self.num_classes
        if classes is None or not len(bad := np.flatnonzero((labels < 0) | (labels >= classes))):
            return
        shards, records = locate(self.starts, np.asarray(ids, np.int64)[bad[:1]])
        data_dir = (self.snapshot.data_dir if self.snapshot is not None
                    else os.path.dirname(os.path.dirname(self.paths[0])))
        raise DatasetChangedError(
            f"label {int(labels[bad[0]])} is outside 0..{classes - 1} (the manifest's {classes} classes) in "
            f"{self.paths[int(shards[0])]} record {int(records[0])}: {data_dir} changed since the reader opened it, "
            f"or is damaged; run `shardprep validate {data_dir}`")


class FixedLayoutSource(_SplitSource):
    """``(global ids, draws) -> (images, labels)`` of fixed-layout shards, shards and labels checked."""

    def __init__(self, paths, counts, layout, buffers: ReusedBuffers | None = None, verify: bool = False,
                 snapshot: DatasetSnapshot | None = None, num_classes: int | None = None):
        super().__init__(paths, counts, snapshot, num_classes)
        record_gather.check_shard_sizes(paths, counts, layout)
        if verify:
            self.gather = record_gather.VerifiedGather(paths, counts, layout, buffers, snapshot)
        else:
            self.gather = record_gather.FixedLayoutGather(paths, layout, buffers, snapshot)
        self.image_shape = self.gather.image_shape

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        shards, records = locate(self.starts, ids)
        images, labels = self.gather((shards << RECORD_INDEX_BITS) | records)
        self.check_labels(ids, labels)
        return images, labels


class ExampleSource(_SplitSource):
    """Batches of Examples decoded one by one into a reused buffer, shards and labels checked."""

    def __init__(self, paths, counts, manifest: Manifest, training: bool, verify: bool = False,
                 buffers: ReusedBuffers | None = None, snapshot: DatasetSnapshot | None = None):
        super().__init__(paths, counts, snapshot, manifest.num_classes)
        self.records = ExampleGather(paths, counts, verify=verify, snapshot=snapshot)
        self.encoding = encodings.get(manifest.encoding)  # UnknownEncodingError for a name this version lacks
        self.crop, self.side = manifest.crop, manifest.shorter_side
        self.image_shape = (*manifest.stored_shape, record_format.CHANNELS)
        self.training = training
        self.buffers = buffers if buffers is not None else ReusedBuffers()

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        serialized = self.records(ids)
        count = len(serialized)
        images = self.buffers.take(count * int(np.prod(self.image_shape))).reshape((count,) + self.image_shape)
        labels = np.empty(count, np.int32)
        for j, data in enumerate(serialized):
            images[j], labels[j] = self.decode(data, draws[j] if draws is not None else (0, 0))
        self.check_labels(ids, labels)
        return images, labels

    def decode(self, serialized: bytes, draws) -> tuple[np.ndarray, int]:
        """One of our Examples as (pixels, label) (``RecordFormatError`` if not ours, or of another shape)."""
        features = record_format.parse_features(serialized)
        try:
            encoded = features[record_format.ENCODED][0]
            label, height, width = (int(features[key][0]) for key in (record_format.LABEL, record_format.HEIGHT,
                                                                      record_format.WIDTH))
        except (KeyError, IndexError, TypeError) as e:
            raise record_format.RecordFormatError(f"record lacks {e}: not a shardprep record") from e
        image = self.encoding.decode(encoded, height, width)
        if self.crop == "none":  # a side x side square: random in training, central otherwise
            spare_h, spare_w = height - self.side, width - self.side
            if spare_h < 0 or spare_w < 0:
                raise record_format.RecordFormatError(f"a {height}x{width} image is smaller than the {self.side} "
                                                      "square crop")
            top, left = ((int(draws[0]) % (spare_h + 1), int(draws[1]) % (spare_w + 1)) if self.training
                         else (spare_h // 2, spare_w // 2))
            image = image[top:top + self.side, left:left + self.side]
        if image.shape != self.image_shape:
            raise record_format.RecordFormatError(f"an image of {image.shape} in a dataset of {self.image_shape}")
        return image, label


class SplitFiles(NamedTuple):
    """A split's shard paths, their record counts and the snapshot of them taken now (None for a URL)."""

    paths: list
    counts: list
    snapshot: DatasetSnapshot | None


def split_files(data_dir: str, manifest: Manifest, split: str) -> SplitFiles:
    shards = manifest.split(split).shards
    paths = [manifest_lib.join(data_dir, shard.file) for shard in shards]
    snapshot = None if "://" in data_dir else DatasetSnapshot(data_dir, paths, [shard.num_bytes for shard in shards])
    return SplitFiles(paths, [shard.num_examples for shard in shards], snapshot)


def batch_source(data_dir: str, manifest: Manifest, split: str, training: bool, verify: bool = False,
                 buffers: ReusedBuffers | None = None):
    """The source of ``split``'s batches (fixed-layout gathers, else decoded Examples); its snapshot taken now."""
    paths, counts, snapshot = split_files(data_dir, manifest, split)
    layout = manifest.split(split).record_layout
    if layout is not None and record_gather.AVAILABLE:
        return FixedLayoutSource(paths, counts, layout, buffers, verify, snapshot, manifest.num_classes)
    return ExampleSource(paths, counts, manifest, training, verify, buffers, snapshot)
