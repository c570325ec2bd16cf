"""Reading TFRecord framing the way validate needs it: every byte counted and hashed, and reading resumed after a
record whose data checksum fails (its framing is intact), so one bad record does not hide the rest of a shard."""

from __future__ import annotations

import hashlib
from typing import Iterator

from shardprep.preprocess import tfrecord_io


class MeasuredReader:
    """Wraps a binary stream and counts (and optionally hashes) every byte read through it."""

    def __init__(self, stream, hash_bytes: bool):
        self._stream = stream
        self.sha256 = hashlib.sha256() if hash_bytes else None
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.num_bytes += len(data)
        return data

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
