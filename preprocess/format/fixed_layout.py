"""The fixed layout of raw, centre-cropped splits: every record of a split the same length, ``image/padding``
absorbing the differences, so readers take fixed-length chunks (``FixedLengthRecordDataset``) without parsing."""

from __future__ import annotations

import dataclasses

from shardprep.preprocess.format import tfrecord_io
from shardprep.preprocess.format.encodings import RAW
from shardprep.preprocess.format.record_format import (CHANNELS, ENCODED, FILENAME, FORMAT, HEIGHT, LABEL, WIDTH,
                                                       ImageRecord, RecordFormatError, bytes_entry_parts, bytes_feature,
                                                       decode_example, feature_entry, field_parts, int64_feature,
                                                       small_features, varint)

PADDING = "image/padding"
# Entries in the order ENCODED, LABEL, FILENAME, FORMAT, HEIGHT, WIDTH (small_features' order), PADDING.
# Varint sizes change at these; within one range each padding byte more makes the record one byte longer.
_PADDING_STARTS = (0, 1 << 7, 1 << 14, 1 << 21, 1 << 28)


def _length_delimited_size(number: int, payload_length: int) -> int:
    return len(varint((number << 3) | 2)) + len(varint(payload_length)) + payload_length


def _entry_size(key: str, feature_length: int) -> int:
    return _length_delimited_size(1, _length_delimited_size(1, len(key.encode())) + _length_delimited_size(2, feature_length))


def _bytes_feature_size(length: int) -> int:
    return _length_delimited_size(1, _length_delimited_size(1, length))


def _padding_entry_size(padding: int) -> int:
    return _entry_size(PADDING, _bytes_feature_size(padding))


@dataclasses.dataclass(frozen=True)
class FixedLayout:
    """The fixed record layout of one split of raw, centre-cropped ``height`` x ``width`` images."""
    height: int
    width: int
    entries_bytes: int  # the Features message's length in every record but a shard's last

    @classmethod
    def for_records(cls, height: int, width: int, filename_bytes: tuple[int, int], max_label: int) -> "FixedLayout":
        """The layout for records whose filenames are (shortest, longest) UTF-8 bytes long and labels in
        ``0..max_label``."""
        image_bytes = height * width * CHANNELS
        shortest = _unpadded_entries_size(image_bytes, height, width, filename_bytes[0], 0)
        longest = _unpadded_entries_size(image_bytes, height, width, filename_bytes[1], max_label)
        for start in _PADDING_STARTS:
            layout = cls(height, width, longest + _padding_entry_size(start))
            growth = layout._shard_end_growth()
            span = longest - shortest + (growth or 0)  # the most padding beyond ``start`` a record gets
            if growth is not None and _padding_entry_size(start + span) - _padding_entry_size(start) == span:
                return layout
        raise RecordFormatError(f"filenames of {filename_bytes[0]} to {filename_bytes[1]} bytes are too different "
                                "in length for one fixed record length")

    @classmethod
    def from_json(cls, record_layout: dict, height: int, width: int) -> "FixedLayout":
        for varint_bytes in range(1, 11):
            entries_bytes = int(record_layout["record_bytes"]) - tfrecord_io.framed_size(1 + varint_bytes)
            layout = cls(height, width, entries_bytes)
            if entries_bytes > 0 and layout.to_json() == {k: int(record_layout[k]) for k in layout.to_json()}:
                return layout
        raise RecordFormatError(f"record_layout {record_layout} does not fit {height}x{width} images")

    @property
    def image_bytes(self) -> int:
        return self.height * self.width * CHANNELS

    @property
    def record_bytes(self) -> int:
        return tfrecord_io.framed_size(_length_delimited_size(1, self.entries_bytes))

    @property
    def image_offset(self) -> int:
        example_header = _length_delimited_size(1, self.entries_bytes) - self.entries_bytes
        encoded_entry = _entry_size(ENCODED, _bytes_feature_size(self.image_bytes))
        return tfrecord_io.HEADER_BYTES + example_header + encoded_entry - self.image_bytes  # the pixels end the entry

    @property
    def label_offset(self) -> int:
        label_entry = len(feature_entry(LABEL, int64_feature(0)))
        return self.image_offset + self.image_bytes + label_entry - 1  # label 0 is a 1-byte varint, the entry's end

    def to_json(self) -> dict:
        """The manifest's ``record_layout`` of the split."""
        return {"record_bytes": self.record_bytes, "image_offset": self.image_offset,
                "label_offset": self.label_offset}

    def encode(self, record: ImageRecord, shard_end: bool = False) -> bytes:
        """The framed record: ``record_bytes`` long, or ``record_bytes + image_offset`` if it ends its shard."""
        if record.format != RAW.name or (record.height, record.width) != (self.height, self.width):
            raise RecordFormatError(f"a {record.format} {record.height}x{record.width} image does not fit the fixed "
                                    f"layout of raw {self.height}x{self.width} records")
        if len(record.encoded) != self.image_bytes:
            raise RecordFormatError(f"raw image holds {len(record.encoded)} bytes, expected {self.image_bytes}")
        entries = [*bytes_entry_parts(ENCODED, record.encoded),
                   b"".join(feature_entry(key, feature) for key, feature in small_features(record).items())]
        target = self.record_bytes + (self.image_offset if shard_end else 0)
        padding_entry = (self.entries_bytes + (self._shard_end_growth() if shard_end else 0)
                         - sum(len(part) for part in entries))
        padding = _padding_for_entry_size(padding_entry)
        if padding is None:
            raise RecordFormatError(f"record {record.filename!r} (label {record.label}) does not fit its split's "
                                    "fixed layout: filename or label longer than the layout was made for")
        framed = tfrecord_io.frame_parts(field_parts(1, [*entries, feature_entry(PADDING, bytes_feature(bytes(padding)))]))
        if len(framed) != target:
            raise RecordFormatError(f"fixed layout error: record of {len(framed)} bytes, expected {target}")
        return framed

    def _shard_end_growth(self) -> int | None:
        """Padding to add to a shard's last record to make it ``image_offset`` bytes longer (one less where the
        length varint grows); None if no padding hits it exactly."""
        target = self.record_bytes + self.image_offset
        return next((grown for grown in (self.image_offset, self.image_offset - 1)
                     if tfrecord_io.framed_size(_length_delimited_size(1, self.entries_bytes + grown)) == target), None)

    def shard_records(self, framed_records):
        """Yields ``framed_records`` (in shard order) re-padded so that only the last is a shard's end."""
        previous = None
        for framed in framed_records:
            if previous is not None:
                yield self.reframe(previous, shard_end=False)
            previous = framed
        if previous is not None:
            yield self.reframe(previous, shard_end=True)

    def reframe(self, framed: bytes, shard_end: bool) -> bytes:
        target = self.record_bytes + (self.image_offset if shard_end else 0)
        if len(framed) == target:
            return framed
        return self.encode(decode_example(framed[tfrecord_io.HEADER_BYTES:-tfrecord_io.FOOTER_BYTES]), shard_end)


def _padding_for_entry_size(size: int) -> int | None:
    """The padding length whose ``image/padding`` entry is exactly ``size`` bytes, if there is one."""
    padding = size - _padding_entry_size(0)
    for _ in range(8):  # each step corrects for the length varints; they settle in a few
        if padding < 0:
            return None
        found = _padding_entry_size(padding)
        if found == size:
            return padding
        padding -= found - size
    return None


def _unpadded_entries_size(image_bytes: int, height: int, width: int, filename_bytes: int, label: int) -> int:
    sizes = {ENCODED: _bytes_feature_size(image_bytes), LABEL: len(int64_feature(label)),
             FILENAME: _bytes_feature_size(filename_bytes), FORMAT: _bytes_feature_size(len(RAW.name.encode())),
             HEIGHT: len(int64_feature(height)), WIDTH: len(int64_feature(width))}
    return sum(_entry_size(key, size) for key, size in sizes.items())
