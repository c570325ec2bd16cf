"""Fixed-layout gathers that check every record's CRCs (``verify_records=True``) and still read the pixels straight
into the batch.

A framed record is ``length | CRC(length) | data | CRC(data)``, its pixels inside the data at ``image_offset``. One
``preadv`` per record puts the bytes before the pixels into a scratch row, the pixels into the image's slot in the
batch and the bytes after them into a second scratch row; the data's CRC is then extended over the three pieces in
place (``google_crc32c.extend``), so checking costs no copy. A shard's last record is ``image_offset`` bytes longer
(:class:`shardprep.preprocess.fixed_layout.FixedLayout`), which only lengthens its last piece. Plain NumPy and ``os``.
"""

from __future__ import annotations

import os
import struct

import google_crc32c
import numpy as np

from shardprep.preprocess import tfrecord_io
from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.train.record_gather import MAX_VARINT_BYTES, RECORD_INDEX_BITS, FixedLayoutGather, ReusedBuffers, \
    decode_varints, open_shards

_HEADER, _FOOTER = tfrecord_io.HEADER_BYTES, tfrecord_io.FOOTER_BYTES


class VerifiedGather(FixedLayoutGather):
    """:class:`FixedLayoutGather` that raises ``OSError`` naming the shard, record and byte offset of a record whose
    length or data CRC is wrong. ``counts``: records per shard (a shard's last record is longer)."""

    def __init__(self, paths, counts, layout: FixedLayout, buffers: ReusedBuffers | None = None, snapshot=None):
        super().__init__(paths, layout, buffers, snapshot)
        self.counts = [int(count) for count in counts]
        self.label_at = layout.label_offset - self.image_offset - self.image_bytes  # in the piece after the pixels
        self.after_bytes = self.record_bytes - self.image_offset - self.image_bytes  # a shard's last: + image_offset

    def _gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count = len(ids)
        images = self.buffers.take(count * self.image_bytes)
        before = np.empty(self.image_offset, np.uint8)
        after = np.empty(self.after_bytes + self.image_offset, np.uint8)
        label_rows = np.empty((count, MAX_VARINT_BYTES), np.uint8)
        shards, records = ids >> RECORD_INDEX_BITS, ids & ((1 << RECORD_INDEX_BITS) - 1)
        with open_shards(self.paths, shards, self.snapshot) as descriptors:
            for j, (shard, record) in enumerate(zip(shards.tolist(), records.tolist())):
                slot = images[j * self.image_bytes:(j + 1) * self.image_bytes]
                tail = after[:self.after_bytes + (self.image_offset if record == self.counts[shard] - 1 else 0)]
                self._read_checked(descriptors[shard], shard, record, before, slot, tail)
                label_rows[j] = tail[self.label_at:self.label_at + MAX_VARINT_BYTES]
        labels = decode_varints(label_rows)
        return images.reshape((count,) + self.image_shape), labels.astype(np.int32)

    def _read_checked(self, fd: int, shard: int, record: int, before: np.ndarray, slot: np.ndarray,
                      tail: np.ndarray) -> None:
        offset = record * self.record_bytes
        wanted = len(before) + len(slot) + len(tail)
        got = os.preadv(fd, [before, slot, tail], offset)
        problem = None
        if got != wanted:
            problem = f"ends {wanted - got} bytes early: the shard is shorter than its manifest says"
        else:
            length_bytes = before[:8].tobytes()
            (length,) = struct.unpack("<Q", length_bytes)
            (length_crc,) = struct.unpack("<I", before[8:_HEADER].tobytes())
            (data_crc,) = struct.unpack("<I", tail[-_FOOTER:].tobytes())
            crc = google_crc32c.extend(google_crc32c.value(before[_HEADER:].tobytes()), slot)
            crc = google_crc32c.extend(crc, tail[:-_FOOTER])
            if tfrecord_io.masked_crc32c(length_bytes) != length_crc or length != wanted - _HEADER - _FOOTER:
                problem = "has a wrong length or length checksum"
            elif tfrecord_io.mask_crc(crc) != data_crc:
                problem = "data checksum mismatch"
        if problem:
            raise OSError(f"{self.paths[shard]}: record {record} (byte {offset}) {problem} "
                          "(run `shardprep validate` on the dataset)")
