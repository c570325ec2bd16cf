"""Random access to TFRecord shards of any layout: each record's offset, found by walking the framing's headers.

A TFRecord file is ``uint64 length | uint32 masked CRC of it | data | uint32 masked CRC of the data`` per record,
so the records' offsets follow from the headers alone: :func:`record_offsets` reads 12 bytes per record
(``os.pread``), never the data. :class:`ExampleGather` then reads the serialized Examples of any set of records,
one ``pread`` each, and with ``verify=True`` checks both CRCs of every record it reads. This is how JPEG, ``crop:
none`` and ``verify_records=True`` reads follow the same global order (:mod:`shardprep.train.record_order`) as the
fixed-layout gather. Plain NumPy and ``os``; no TensorFlow.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from shardprep.preprocess import tfrecord_io
from shardprep.train.record_gather import OPEN_FLAGS, open_shards

_HEADER = tfrecord_io.HEADER_BYTES
_FOOTER = tfrecord_io.FOOTER_BYTES


class ShardIndex:
    """``offsets[i]`` and ``lengths[i]``: where the data of record ``i`` of one shard starts and how long it is."""

    def __init__(self, path: str, offsets: np.ndarray, lengths: np.ndarray):
        self.path, self.offsets, self.lengths = path, offsets, lengths

    def __len__(self) -> int:
        return len(self.offsets)


def record_offsets(path: str, expected: int | None = None) -> ShardIndex:
    """Walks ``path``'s framing: the data offset and length of each record. Raises ``ValueError`` naming the file
    if a header's CRC is wrong, the last record is cut short, or the count is not ``expected``."""
    offsets, lengths = [], []
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
    """``global ids -> serialized Examples`` (a list of ``bytes``) read from indexed shards.

    Args:
      paths, counts: the split's shard files (local paths) and their records, in manifest order.
      verify: check every record's data CRC as it is read (``verify_records=True``); header CRCs are checked
        when the index is built.
      snapshot: a :class:`~shardprep.train.record_identity.DatasetSnapshot` of ``paths``: every shard a read
        opens is checked to be the file that was indexed (else ``DatasetChangedError``).
    """

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

