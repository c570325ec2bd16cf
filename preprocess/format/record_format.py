"""The shard record format, one ``tf.train.Example`` per image, for the writer and every reader. The small protobuf
codec keeps TensorFlow off workers and fixes the byte layout (features sorted by key): shards are byte-identical."""

from __future__ import annotations

import dataclasses
import struct

from shardprep.preprocess.format import encodings

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
LABEL = "image/class/label"
FILENAME = "image/filename"

CHANNELS = encodings.CHANNELS


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


_SMALL_VARINTS = tuple(bytes((value,)) for value in range(128))  # every tag and most lengths: one byte, made once


def varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    if value < 0:
        value += 1 << 64  # int64 negatives are 10-byte varints
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def field_parts(number: int, parts: list[bytes]) -> list[bytes]:
    """:func:`_field` of ``b"".join(parts)`` as parts, so a record's pixels are joined once, at its framing."""
    return [varint((number << 3) | 2) + varint(sum(len(part) for part in parts)), *parts]


def bytes_entry_parts(key: str, value: bytes) -> list[bytes]:
    """:func:`feature_entry` of ``key`` and ``bytes_feature(value)``, as parts: ``value`` itself is the last."""
    return field_parts(1, [_field(1, key.encode()), *field_parts(2, field_parts(1, field_parts(1, [value])))])


def bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))  # Feature.bytes_list = 1 { BytesList.value = 1 }


def int64_feature(value: int) -> bytes:
    return _field(3, _field(1, varint(value)))  # Feature.int64_list = 3 { packed Int64List.value = 1 }


def feature_entry(key: str, feature: bytes) -> bytes:
    return _field(1, _field(1, key.encode()) + _field(2, feature))  # map entry: key = 1, value = 2


def small_features(record: ImageRecord) -> dict[str, bytes]:
    """Every feature but ``image/encoded``, serialized."""
    return {LABEL: int64_feature(record.label), FILENAME: bytes_feature(record.filename.encode("utf-8")),
            FORMAT: bytes_feature(record.format.encode()), HEIGHT: int64_feature(record.height),
            WIDTH: int64_feature(record.width)}


def encode_example(record: ImageRecord) -> bytes:
    """``record`` as a ``tf.train.Example`` (features in sorted key order, so bytes are stable)."""
    return b"".join(example_parts(record))


def example_parts(record: ImageRecord) -> list[bytes]:
    """:func:`encode_example`'s bytes as parts to join (``record.encoded`` one of them, not copied)."""
    if record.format not in encodings.NAMES:
        raise RecordFormatError(f"unknown image format {record.format!r}")
    features = small_features(record)
    entries = []
    for key in sorted([ENCODED, *features]):
        entries += bytes_entry_parts(key, record.encoded) if key == ENCODED else [feature_entry(key, features[key])]
    return field_parts(1, entries)  # Example.features = 1 { Features.feature = 1 (map) }


def read_varint(buf, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``, signed as int64; RecordFormatError if truncated."""
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
    """Yields (field number, wire type, value): a memoryview (type 2) or an int (types 0, 1, 5)."""
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
    """Any serialized ``tf.train.Example`` (foreign ones too) as ``{key: [values]}``."""
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
            if kind == 1 and t == 2:  # BytesList
                values.append(bytes(v))
            elif kind == 2 and t == 2:  # FloatList, packed
                if len(v) % 4:
                    raise RecordFormatError("packed float list is not a whole number of floats")
                values.extend(struct.unpack(f"<{len(v) // 4}f", v))
            elif kind == 2 and t == 5:  # FloatList, one value
                values.append(struct.unpack("<f", v.to_bytes(4, "little"))[0])
            elif kind == 3 and t == 2:  # Int64List, packed
                pos = 0
                while pos < len(v):
                    item, pos = read_varint(v, pos)
                    values.append(item)
            elif kind == 3 and t == 0:  # Int64List, one value
                values.append(v)  # read_varint already made it signed
    return values


def decode_example(serialized: bytes) -> ImageRecord:
    """Parses a shardprep record; raises RecordFormatError if a key is missing or malformed."""
    features = parse_features(serialized)

    def single(key: str, kind: type):
        values = features.get(key)
        if not values or len(values) != 1:
            raise RecordFormatError(f"record has no single value for {key!r}")
        if type(values[0]) is not kind:  # e.g. int(b"12") would quietly accept a bytes height
            raise RecordFormatError(f"record has a {type(values[0]).__name__} for {key!r}, not {kind.__name__}")
        return values[0]

    try:
        record = ImageRecord(single(ENCODED, bytes), single(FORMAT, bytes).decode(), single(HEIGHT, int),
                             single(WIDTH, int), single(LABEL, int), single(FILENAME, bytes).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordFormatError(f"record has text that is not UTF-8: {e}") from e
    if record.height < 1 or record.width < 1:
        raise RecordFormatError(f"image size {record.height}x{record.width} is not positive")
    if record.format not in encodings.NAMES:
        raise RecordFormatError(f"unknown image format {record.format!r}")
    stored = encodings.get(record.format)
    stored_bytes = stored.stored_bytes(record.width, record.height)
    if stored_bytes is not None and len(record.encoded) != stored_bytes:
        raise RecordFormatError(f"{stored.label} image holds {len(record.encoded)} bytes, expected "
                                f"{record.height}x{record.width}x{CHANNELS}")
    return record


def decode_pixels(record: ImageRecord):
    """The record's image as a uint8 (H, W, 3) array."""
    return encodings.get(record.format).decode(record.encoded, record.height, record.width)
