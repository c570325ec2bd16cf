"""The shard record format: one ``tf.train.Example`` per image.

This module is the single definition of what a shardprep record holds. The Beam writer and every reader
(the tf.data training reader, the validate pipeline) import their keys, encoders and parsers from here.

Keys follow TensorFlow's official vision loaders:

=====================  =======  ==========================================================
key                    type     value
=====================  =======  ==========================================================
``image/encoded``      bytes    ``raw``: H*W*3 uint8 RGB bytes, row-major; ``jpeg``: a JPEG
``image/format``       bytes    ``raw`` or ``jpeg``
``image/height``       int64    H
``image/width``        int64    W
``image/class/label``  int64    0-based index into the manifest's ``classes``
``image/filename``     bytes    the source key (unique within the dataset)
=====================  =======  ==========================================================

Raw centre crops add ``image/padding`` (zero bytes) and have a fixed layout: see :class:`FixedLayout`.

Writers and the validate pipeline encode and decode Examples with the small protobuf codec below instead of
importing TensorFlow: workers start faster, and the byte layout is fixed (features sorted by key, or the fixed
layout's order), which keeps shards byte-identical from run to run. The codec is cross-checked against ``tf.train.Example`` in the tests.
"""

from __future__ import annotations

import dataclasses
import struct

from shardprep.preprocess import tfrecord_io

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
LABEL = "image/class/label"
FILENAME = "image/filename"

ENCODINGS = ("raw", "jpeg")
CHANNELS = 3

_BYTES_KEYS = (ENCODED, FORMAT, FILENAME)
_INT_KEYS = (HEIGHT, WIDTH, LABEL)


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """One stored image and its metadata, as the record format holds it."""

    encoded: bytes
    format: str
    height: int
    width: int
    label: int
    filename: str


class RecordFormatError(ValueError):
    """A serialized record is not a valid shardprep Example."""


# --- protobuf wire format (just what tf.train.Example needs) -------------------------------------------------

def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))  # Feature.bytes_list = 1 { BytesList.value = 1 }


def _int64_feature(value: int) -> bytes:
    return _field(3, _field(1, _varint(value)))  # Feature.int64_list = 3 { packed Int64List.value = 1 }


def _serialize_features(features: dict[str, bytes]) -> bytes:
    entries = b"".join(_entry(key, feature) for key, feature in sorted(features.items()))
    return _field(1, entries)  # Example.features = 1 { Features.feature = 1 (map) }


def encode_example(record: ImageRecord) -> bytes:
    """Serializes ``record`` as a ``tf.train.Example`` (features in sorted key order, so bytes are stable)."""
    if record.format not in ENCODINGS:
        raise RecordFormatError(f"unknown image format {record.format!r}")
    return _serialize_features({
        ENCODED: _bytes_feature(record.encoded),
        FORMAT: _bytes_feature(record.format.encode()),
        FILENAME: _bytes_feature(record.filename.encode("utf-8")),
        HEIGHT: _int64_feature(record.height),
        WIDTH: _int64_feature(record.width),
        LABEL: _int64_feature(record.label),
    })


# --- the fixed layout of raw, centre-cropped splits ------------------------------------------------------------
#
# Every image of such a split has the same number of bytes, so its records are made the same length too: each is
# still a complete Example with the keys above, serialized in the order image/encoded, image/class/label, the
# other keys sorted, and last ``image/padding``, zero bytes that absorb the differences in filename and label
# length. The pixels then sit at the same offset in every record, the label varint right after them. The last record
# of a shard is ``image_offset`` bytes longer, so that a shard file is ``image_offset + N * record_bytes`` bytes
# (a shard without records is an empty file):
# a reader can take it as N fixed-length chunks, each starting at a record's pixels and holding its label
# (tf.data.FixedLengthRecordDataset with header_bytes=image_offset), and skip the framing, the CRCs and protobuf
# parsing. Ordinary TFRecord readers still see ordinary Examples.

PADDING = "image/padding"
_FIXED_ORDER = (ENCODED, LABEL, FILENAME, FORMAT, HEIGHT, WIDTH)  # then PADDING
# Varint sizes change at 128, 16384, ...; a padding length is chosen in one of these ranges, where each padding byte
# more makes the record exactly one byte longer.
_PADDING_STARTS = (0, 1 << 7, 1 << 14, 1 << 21, 1 << 28)


def _length_delimited_size(number: int, payload_length: int) -> int:
    return len(_varint((number << 3) | 2)) + len(_varint(payload_length)) + payload_length


def _entry_size(key: str, feature_length: int) -> int:
    """Bytes of one ``Features.feature`` map entry (within the Features message)."""
    return _length_delimited_size(1, _length_delimited_size(1, len(key.encode())) + _length_delimited_size(2, feature_length))


def _bytes_feature_size(length: int) -> int:
    return _length_delimited_size(1, _length_delimited_size(1, length))


def _padding_entry_size(padding: int) -> int:
    return _entry_size(PADDING, _bytes_feature_size(padding))


@dataclasses.dataclass(frozen=True)
class FixedLayout:
    """The fixed record layout of one split of raw, centre-cropped ``height`` x ``width`` images.

    ``record_bytes``: framed bytes of every record (a shard's last: ``record_bytes + image_offset``);
    ``image_offset`` and ``label_offset``: where the pixels and the label's varint start in a framed record.
    """

    height: int
    width: int
    entries_bytes: int  # the Features message's length in every record but a shard's last

    @classmethod
    def for_records(cls, height: int, width: int, filename_bytes: tuple[int, int], max_label: int) -> "FixedLayout":
        """The layout for records whose filenames are ``filename_bytes = (shortest, longest)`` UTF-8 bytes long and
        whose labels are in ``0..max_label``."""
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
        """The layout a manifest's ``record_layout`` describes, for ``height`` x ``width`` images."""
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
        label_entry = len(_entry(LABEL, _int64_feature(0)))
        return self.image_offset + self.image_bytes + label_entry - 1  # label 0 is a 1-byte varint, the entry's end

    def to_json(self) -> dict:
        """The manifest's ``record_layout`` of the split: what a reader needs."""
        return {"record_bytes": self.record_bytes, "image_offset": self.image_offset,
                "label_offset": self.label_offset}

    def encode(self, record: ImageRecord, shard_end: bool = False) -> bytes:
        """The framed record: ``record_bytes`` long, or ``record_bytes + image_offset`` if it ends its shard."""
        if record.format != "raw" or (record.height, record.width) != (self.height, self.width):
            raise RecordFormatError(f"a {record.format} {record.height}x{record.width} image does not fit the fixed "
                                    f"layout of raw {self.height}x{self.width} records")
        if len(record.encoded) != self.image_bytes:
            raise RecordFormatError(f"raw image holds {len(record.encoded)} bytes, expected {self.image_bytes}")
        entries = b"".join(_entry(key, feature) for key, feature in _fixed_features(record))
        target = self.record_bytes + (self.image_offset if shard_end else 0)
        padding_entry = self.entries_bytes + (self._shard_end_growth() if shard_end else 0) - len(entries)
        padding = _padding_for_entry_size(padding_entry)
        if padding is None:
            raise RecordFormatError(f"record {record.filename!r} (label {record.label}) does not fit its split's "
                                    "fixed layout: filename or label longer than the layout was made for")
        framed = tfrecord_io.frame(_field(1, entries + _entry(PADDING, _bytes_feature(bytes(padding)))))
        if len(framed) != target:
            raise RecordFormatError(f"fixed layout error: record of {len(framed)} bytes, expected {target}")
        return framed

    def _shard_end_growth(self) -> int | None:
        """Padding bytes to add to a shard's last record to make it ``image_offset`` bytes longer: ``image_offset``,
        or one less where the Example's length varint grows a byte; None if no padding hits it exactly."""
        for grown in (self.image_offset, self.image_offset - 1):
            grown_record = tfrecord_io.framed_size(_length_delimited_size(1, self.entries_bytes + grown))
            if grown_record == self.record_bytes + self.image_offset:
                return grown
        return None

    def shard_records(self, framed_records):
        """Yields ``framed_records`` (records of this layout, in shard order) re-padded where needed so that only the
        last one is a shard's end."""
        previous = None
        for framed in framed_records:
            if previous is not None:
                yield self.reframe(previous, shard_end=False)
            previous = framed
        if previous is not None:
            yield self.reframe(previous, shard_end=True)

    def reframe(self, framed: bytes, shard_end: bool) -> bytes:
        """``framed`` (a record of this layout) as a shard's last record or as any other, re-encoded if needed."""
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


def _entry(key: str, feature: bytes) -> bytes:
    return _field(1, _field(1, key.encode()) + _field(2, feature))  # map entry: key = 1, value = 2


def _fixed_features(record: ImageRecord) -> list[tuple[str, bytes]]:
    features = {
        ENCODED: _bytes_feature(record.encoded),
        LABEL: _int64_feature(record.label),
        FILENAME: _bytes_feature(record.filename.encode("utf-8")),
        FORMAT: _bytes_feature(record.format.encode()),
        HEIGHT: _int64_feature(record.height),
        WIDTH: _int64_feature(record.width),
    }
    return [(key, features[key]) for key in _FIXED_ORDER]


def _unpadded_entries_size(image_bytes: int, height: int, width: int, filename_bytes: int, label: int) -> int:
    sizes = {
        ENCODED: _bytes_feature_size(image_bytes),
        LABEL: len(_int64_feature(label)),
        FILENAME: _bytes_feature_size(filename_bytes),
        FORMAT: _bytes_feature_size(len(b"raw")),
        HEIGHT: len(_int64_feature(height)),
        WIDTH: len(_int64_feature(width)),
    }
    return sum(_entry_size(key, sizes[key]) for key in _FIXED_ORDER)


def read_varint(buf, pos: int) -> tuple[int, int]:
    """(value, position after it) of the protobuf varint at ``pos`` of ``buf`` (bytes or a memoryview), signed as
    int64; raises :class:`RecordFormatError` if it is truncated."""
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise RecordFormatError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            result &= (1 << 64) - 1  # a 10th byte carries bits past 64: protobuf drops them
            if result >= 1 << 63:
                result -= 1 << 64
            return result, pos
        shift += 7


def _iter_fields(buf: memoryview):
    """Yields (field number, wire type, value) where value is a memoryview (type 2) or an int (types 0, 1, 5)."""
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = read_varint(buf, pos)
        elif wire_type == 2:
            length, pos = read_varint(buf, pos)
            if length < 0 or pos + length > len(buf):
                raise RecordFormatError("length-delimited field runs past the end of the record")
            value, pos = buf[pos:pos + length], pos + length
        elif wire_type == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire_type == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise RecordFormatError(f"unsupported protobuf wire type {wire_type}")
        if pos > len(buf):
            raise RecordFormatError("field runs past the end of the record")
        yield number, wire_type, value


def parse_features(serialized: bytes) -> dict[str, list]:
    """Parses any serialized ``tf.train.Example`` into ``{key: [values]}`` (bytes, floats or ints).

    Used for foreign records (``tfrecord:`` sources) as well as shardprep's own.
    """
    features: dict[str, list] = {}
    try:
        for number, wire_type, example_field in _iter_fields(memoryview(serialized)):
            if number != 1 or wire_type != 2:
                continue
            for entry_number, entry_type, entry in _iter_fields(example_field):
                if entry_number != 1 or entry_type != 2:
                    continue
                key, feature_parts = "", []  # protobuf defaults for a map entry's missing key or value
                for n, t, v in _iter_fields(entry):
                    if n == 1 and t == 2:
                        key = bytes(v).decode("utf-8")
                    elif n == 2 and t == 2:
                        feature_parts.append(v)  # a repeated message field merges, as concatenation does
                features[key] = _parse_feature(memoryview(b"".join(feature_parts)))
    except RecordFormatError:
        raise
    except (UnicodeDecodeError, ValueError, IndexError, struct.error) as e:
        raise RecordFormatError(f"not a tf.train.Example: {e}") from e
    return features


def _parse_feature(feature: memoryview) -> list:
    values: list = []
    kind = None
    for number, wire_type, payload in _iter_fields(feature):
        if number not in (1, 2, 3) or wire_type != 2:
            continue  # an unknown field: protobuf keeps it aside, TensorFlow ignores it
        if number != kind:
            values, kind = [], number  # bytes_list, float_list and int64_list are a oneof: the last one wins
        for n, t, v in _iter_fields(payload):
            if n != 1:
                continue
            # A value of another wire type than its field's is an unknown field to protobuf, so it is skipped.
            if kind == 1:  # BytesList
                if t == 2:
                    values.append(bytes(v))
            elif kind == 2:  # FloatList: packed or not
                if t == 2:
                    if len(v) % 4:
                        raise RecordFormatError("packed float list is not a whole number of floats")
                    values.extend(struct.unpack(f"<{len(v) // 4}f", v))
                elif t == 5:
                    values.append(struct.unpack("<f", v.to_bytes(4, "little"))[0])
            else:  # Int64List: packed or not
                if t == 2:
                    pos = 0
                    while pos < len(v):
                        item, pos = read_varint(v, pos)
                        values.append(item)
                elif t == 0:
                    values.append(v)  # read_varint already made it signed
    return values


def decode_example(serialized: bytes) -> ImageRecord:
    """Parses a shardprep record; raises :class:`RecordFormatError` if a key is missing or malformed."""
    features = parse_features(serialized)

    def single(key: str, kind: type):
        values = features.get(key)
        if not values or len(values) != 1:
            raise RecordFormatError(f"record has no single value for {key!r}")
        if type(values[0]) is not kind:  # e.g. int(b"12") would quietly accept a bytes height
            raise RecordFormatError(f"record has a {type(values[0]).__name__} for {key!r}, not {kind.__name__}")
        return values[0]

    try:
        record = ImageRecord(
            encoded=single(ENCODED, bytes),
            format=single(FORMAT, bytes).decode(),
            height=single(HEIGHT, int),
            width=single(WIDTH, int),
            label=single(LABEL, int),
            filename=single(FILENAME, bytes).decode("utf-8"),
        )
    except UnicodeDecodeError as e:
        raise RecordFormatError(f"record has text that is not UTF-8: {e}") from e
    if record.height < 1 or record.width < 1:
        raise RecordFormatError(f"image size {record.height}x{record.width} is not positive")
    if record.format not in ENCODINGS:
        raise RecordFormatError(f"unknown image format {record.format!r}")
    if record.format == "raw" and len(record.encoded) != record.height * record.width * CHANNELS:
        raise RecordFormatError(
            f"raw image holds {len(record.encoded)} bytes, expected {record.height}x{record.width}x{CHANNELS}")
    return record


def decode_pixels(record: ImageRecord):
    """The record's image as a uint8 numpy array of shape (H, W, 3)."""
    import io

    import numpy as np
    from PIL import Image

    if record.format == "raw":
        return np.frombuffer(record.encoded, dtype=np.uint8).reshape(record.height, record.width, CHANNELS)
    with Image.open(io.BytesIO(record.encoded)) as image:
        return np.asarray(image.convert("RGB"))


def tf_feature_spec(with_metadata: bool = False) -> dict:
    """The ``tf.io.parse_example`` spec for the keys a reader needs (TensorFlow is imported lazily)."""
    import tensorflow as tf

    spec = {
        ENCODED: tf.io.FixedLenFeature([], tf.string),
        LABEL: tf.io.FixedLenFeature([], tf.int64),
    }
    if with_metadata:
        spec.update({
            FORMAT: tf.io.FixedLenFeature([], tf.string),
            HEIGHT: tf.io.FixedLenFeature([], tf.int64),
            WIDTH: tf.io.FixedLenFeature([], tf.int64),
            FILENAME: tf.io.FixedLenFeature([], tf.string),
        })
    return spec
