"""Reading TFRecord framing the way validate needs it: every byte counted and hashed, and reading resumed after a
record whose data checksum fails (its framing is intact), so one bad record does not hide the rest of a shard."""

from __future__ import annotations

import hashlib
import struct
from typing import Iterator

from shardprep.preprocess import tfrecord_io


class MeasuredReader:
    """Wraps a binary stream and counts (and optionally hashes) every byte read through it.

    With ``limit``, it reads no further than ``limit`` bytes: a read asking for more gets what is left, so a record
    length read from the file (which may be anything) never asks for more bytes than the file can give, and a file
    far larger than it should be is read only as far as the limit (:meth:`beyond_limit` says whether it goes on).
    """

    def __init__(self, stream, hash_bytes: bool, limit: int | None = None):
        self._stream = stream
        self.sha256 = hashlib.sha256() if hash_bytes else None
        self.num_bytes = 0
        self.limit = limit

    def read(self, size: int = -1) -> bytes:
        if self.limit is not None:
            left = self.limit - self.num_bytes
            size = left if size is None or size < 0 else min(size, left)
            if size <= 0:
                return b""
        data = self._stream.read(size)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def beyond_limit(self) -> bool:
        """Whether the stream holds bytes past ``limit`` (reads one of them, uncounted)."""
        return self.limit is not None and self.num_bytes >= self.limit and bool(self._stream.read(1))

    def drain(self) -> int:
        """Reads to the end (so the hash covers the whole file); returns how many bytes that was."""
        start = self.num_bytes
        while self.read(1 << 20):
            pass
        return self.num_bytes - start


def iter_framed_records(reader: MeasuredReader) -> Iterator[tuple[int, bytes | None, str | None]]:
    """Yields ``(index, record, None)`` per good record and ``(index, None, message)`` per corrupt one.

    A data-checksum error leaves the framing intact (the length had its own valid CRC and the reader stands at the
    next record), so reading resumes there; after a bad length or a truncation the rest cannot be framed and is
    drained unread.
    """
    base_index = 0
    while True:
        start = reader.num_bytes
        index = base_index
        try:
            for data in tfrecord_io.read_records(reader):
                yield index, data, None
                index += 1
            return
        except tfrecord_io.CorruptRecordError as e:
            record_index, record_offset = base_index + e.index, start + e.offset
            framing_intact = reader.num_bytes > record_offset + tfrecord_io.HEADER_BYTES
            unread = 0 if framing_intact else reader.drain()
            message = f"byte offset {record_offset}: {str(e).split(': ', 1)[-1]}"
            if unread:
                message += f"; the {unread} bytes after it cannot be framed and were not read"
            yield record_index, None, message
            if not framing_intact:
                return
            base_index = record_index + 1


RECORD_AT_MAX_BYTES = 1 << 30  # a longer record length is a broken header, not read


def record_at(stream, index: int) -> bytes:
    """Record ``index`` (0-based) of a TFRecord stream: the headers before it read and their records skipped
    (sought past where the stream can seek), its data read whole; ``tfrecord_io.CorruptRecordError`` if the
    stream ends or its framing breaks first."""
    for number in range(index + 1):
        header = stream.read(tfrecord_io.HEADER_BYTES)
        if len(header) < tfrecord_io.HEADER_BYTES:
            raise tfrecord_io.CorruptRecordError(f"the file ends before record {index}", number, 0)
        (length,) = struct.unpack("<Q", header[:8])
        if length > RECORD_AT_MAX_BYTES:
            raise tfrecord_io.CorruptRecordError(f"a record length of {length} bytes", number, 0)
        if number == index:
            data = stream.read(length)
            if len(data) < length:
                raise tfrecord_io.CorruptRecordError(f"record {index} is truncated", number, 0)
            return data
        if stream.seekable():
            stream.seek(length + 4, 1)
        else:
            while length + 4 > 0:
                skipped = len(stream.read(min(length + 4, 1 << 20)))
                if not skipped:
                    raise tfrecord_io.CorruptRecordError(f"the file ends before record {index}", number, 0)
                length -= skipped
    raise AssertionError("unreachable")
