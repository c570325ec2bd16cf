"""TFRecord framing (``uint64 length | masked crc32c | data | masked crc32c``) without TensorFlow, so Beam workers
stay light; works on any binary file object and reports the index of a bad record."""

from __future__ import annotations

import struct
from typing import BinaryIO, Iterator

import google_crc32c

_MASK_DELTA = 0xA282EAD8
HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of it, before a record's data
FOOTER_BYTES = 4  # uint32 masked CRC of the data, after it


class CorruptRecordError(IOError):
    """A record's framing or checksum is wrong; ``index`` is its 0-based number within its file."""
    def __init__(self, message: str, index: int, offset: int):
        super().__init__(f"record {index} (byte offset {offset}): {message}")
        self.index = index
        self.offset = offset


def masked_crc32c(data: bytes) -> int:
    return mask_crc(google_crc32c.value(data))


def mask_crc(crc: int) -> int:
    """TFRecord's masked form of a CRC32C."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    return frame_parts((data,))


def frame_parts(parts) -> bytes:
    """The framed record of ``b"".join(parts)``, joined once: the CRC is extended part by part."""
    length = struct.pack("<Q", sum(len(part) for part in parts))
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return b"".join((length, struct.pack("<I", masked_crc32c(length)), *parts, struct.pack("<I", mask_crc(crc))))


def framed_size(data_length: int) -> int:
    return HEADER_BYTES + data_length + FOOTER_BYTES


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """Yields the records of a TFRecord stream; raises CorruptRecordError at the first bad one."""
    index = offset = 0
    while True:
        header = stream.read(HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise CorruptRecordError("truncated record header", index, offset)
        length, length_crc = struct.unpack("<QI", header)
        if masked_crc32c(header[:8]) != length_crc:
            raise CorruptRecordError("length checksum mismatch", index, offset)
        data = stream.read(length)
        footer = stream.read(FOOTER_BYTES)
        if len(data) < length or len(footer) < FOOTER_BYTES:
            raise CorruptRecordError("truncated record data", index, offset)
        if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
            raise CorruptRecordError("data checksum mismatch", index, offset)
        yield data
        index += 1
        offset += framed_size(length)
