"""One batch of a local split by record ids as NumPy arrays (no TensorFlow): :class:`FixedLayoutSource` (``preadv``
gathers) or :class:`ExampleSource` (records found by their TFRecord framing, read with one ``pread`` each, decoded
as TensorFlow decodes them); shards checked against the ``DatasetSnapshot``, labels against the classes.
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
from shardprep.train.data.record_identity import DatasetSnapshot, check_labels

CHANNELS = record_format.CHANNELS
_HEADER, _FOOTER = tfrecord_io.HEADER_BYTES, tfrecord_io.FOOTER_BYTES


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
            problem = _header_problem(header, size - position)
            if problem:
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
        self._starts = np.concatenate([[0], np.cumsum([int(count) for count in counts])]).astype(np.int64)

    def __call__(self, ids) -> list[bytes]:
        ids = np.asarray(ids, np.int64)
        shards = np.searchsorted(self._starts, ids, side="right") - 1
        records = ids - self._starts[shards]
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


class ParsedRecord(NamedTuple):
    """What a reader needs of one of our Examples."""

    encoded: bytes
    label: int
    height: int
    width: int


def parse_record(serialized: bytes) -> ParsedRecord:
    """The image bytes, label and stored size of a serialized shardprep Example (``RecordFormatError`` if not)."""
    features = record_format.parse_features(serialized)
    try:
        return ParsedRecord(features[record_format.ENCODED][0], int(features[record_format.LABEL][0]),
                            int(features[record_format.HEIGHT][0]), int(features[record_format.WIDTH][0]))
    except (KeyError, IndexError, TypeError) as e:
        raise record_format.RecordFormatError(f"record lacks {e}: not a shardprep record") from e


def crop_window(height: int, width: int, side: int, draws, training: bool) -> tuple[int, int]:
    """(top, left) of the ``side`` square cut from a ``height`` x ``width`` image."""
    spare_h, spare_w = height - side, width - side
    if spare_h < 0 or spare_w < 0:
        raise record_format.RecordFormatError(f"a {height}x{width} image is smaller than the {side} square crop")
    if training:
        return int(draws[0]) % (spare_h + 1), int(draws[1]) % (spare_w + 1)
    return spare_h // 2, spare_w // 2


class FixedLayoutSource:
    """``(global ids, draws) -> (images, labels)`` of fixed-layout shards, shards and labels checked."""

    def __init__(self, paths, counts, layout, buffers: ReusedBuffers | None = None, verify: bool = False,
                 snapshot: DatasetSnapshot | None = None, num_classes: int | None = None):
        record_gather.check_shard_sizes(paths, counts, layout)
        if verify:
            self.gather = record_gather.VerifiedGather(paths, counts, layout, buffers, snapshot)
        else:
            self.gather = record_gather.FixedLayoutGather(paths, layout, buffers, snapshot)
        self.snapshot, self.num_classes = snapshot, num_classes
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
        self.image_shape = self.gather.image_shape

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        images, labels = self.gather(gather_ids(self.starts, ids))
        if self.num_classes is not None:
            check_labels(labels, self.num_classes, ids, self.starts, self.gather.paths, _where(self.snapshot,
                                                                                               self.gather.paths))
        return images, labels


def _where(snapshot: DatasetSnapshot | None, paths) -> str:
    """The dataset folder an error names."""
    return snapshot.data_dir if snapshot is not None else os.path.dirname(os.path.dirname(paths[0]))


def gather_ids(starts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Global indices as :class:`FixedLayoutGather`'s ids (shard in the high bits, record in shard in the low)."""
    ids = np.asarray(ids, np.int64)
    shards = np.searchsorted(starts, ids, side="right") - 1
    return (shards << RECORD_INDEX_BITS) | (ids - starts[shards])


class ExampleSource:
    """Batches of Examples decoded one by one into a reused buffer, shards and labels checked."""

    def __init__(self, paths, counts, manifest: Manifest, training: bool, verify: bool = False,
                 buffers: ReusedBuffers | None = None, snapshot: DatasetSnapshot | None = None):
        self.records = ExampleGather(paths, counts, verify=verify, snapshot=snapshot)
        self.snapshot, self.num_classes = snapshot, manifest.num_classes
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
        self.encoding = encodings.get(manifest.encoding)  # UnknownEncodingError for a name this version lacks
        self.crop, self.side = manifest.crop, manifest.shorter_side
        height, width = manifest.stored_shape
        self.image_shape = (height, width, CHANNELS)
        self.training = training
        self.buffers = buffers if buffers is not None else ReusedBuffers()

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        serialized = self.records(ids)
        count = len(serialized)
        images = self.buffers.take(count * int(np.prod(self.image_shape))).reshape((count,) + self.image_shape)
        labels = np.empty(count, np.int32)
        for j, data in enumerate(serialized):
            images[j], labels[j] = self.decode(data, draws[j] if draws is not None else (0, 0))
        check_labels(labels, self.num_classes, ids, self.starts, self.records.paths,
                     _where(self.snapshot, self.records.paths))
        return images, labels

    def decode(self, serialized: bytes, draws) -> tuple[np.ndarray, int]:
        record = parse_record(serialized)
        image = self.encoding.decode(record.encoded, record.height, record.width)
        if self.crop == "none":
            top, left = crop_window(record.height, record.width, self.side, draws, self.training)
            image = image[top:top + self.side, left:left + self.side]
        if image.shape != self.image_shape:
            raise record_format.RecordFormatError(f"an image of {image.shape} in a dataset of {self.image_shape}")
        return image, record.label


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
