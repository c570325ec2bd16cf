"""The hand-written tf.train.Example codec and TFRecord framing, cross-checked against TensorFlow itself."""

import dataclasses
import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardprep.preprocess.format import encodings, fixed_layout, record_format, tfrecord_io
from shardprep.preprocess.format.record_format import ImageRecord, RecordFormatError
from shardprep.preprocess.format.tfrecord_io import CorruptRecordError

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                             suppress_health_check=[HealthCheck.too_slow])
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def record(**changes) -> ImageRecord:
    fields = dict(encoded=bytes(range(12)), format="raw", height=2, width=2, label=7, filename="train/cat/ü 1.jpg")
    fields.update(changes)
    return ImageRecord(**fields)


def tf_parse_spec() -> dict:
    """A ``tf.io.parse_example`` spec for every key a record holds (the readers build their own, for what they use)."""
    strings = (record_format.ENCODED, record_format.FORMAT, record_format.FILENAME)
    numbers = (record_format.HEIGHT, record_format.WIDTH, record_format.LABEL)
    return {**{key: tf.io.FixedLenFeature([], tf.string) for key in strings},
            **{key: tf.io.FixedLenFeature([], tf.int64) for key in numbers}}


def tf_features(serialized: bytes) -> dict:
    """What TensorFlow's protobuf parser finds: {key: (kind, [values])}."""
    example = tf.train.Example.FromString(serialized)
    result = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        result[key] = (kind, list(getattr(feature, kind).value) if kind else [])
    return result


# --- encode_example against tf.train.Example --------------------------------------------------------------------

image_records = st.builds(
    ImageRecord,
    encoded=st.binary(max_size=300),
    format=st.sampled_from(encodings.NAMES),
    height=INT64,
    width=INT64,
    label=INT64,
    filename=st.text(max_size=40),
)


@PROPERTY_SETTINGS
@given(image=image_records)
def test_encode_example_is_what_tensorflow_serializes(image):
    serialized = record_format.encode_example(image)
    assert tf_features(serialized) == {
        record_format.ENCODED: ("bytes_list", [image.encoded]),
        record_format.FORMAT: ("bytes_list", [image.format.encode()]),
        record_format.FILENAME: ("bytes_list", [image.filename.encode("utf-8")]),
        record_format.HEIGHT: ("int64_list", [image.height]),
        record_format.WIDTH: ("int64_list", [image.width]),
        record_format.LABEL: ("int64_list", [image.label]),
    }
    # Byte for byte what protobuf writes with sorted map keys: the layout the docs promise is stable.
    assert serialized == tf.train.Example.FromString(serialized).SerializeToString(deterministic=True)


def test_encode_decode_round_trip():
    for image in (record(), record(format="jpeg", encoded=b"\xff\xd8 not checked", height=300, width=200),
                  record(label=-1, filename="")):
        assert record_format.decode_example(record_format.encode_example(image)) == image


def test_encode_rejects_unknown_format():
    with pytest.raises(RecordFormatError):
        record_format.encode_example(record(format="webp2"))


def test_decode_reads_what_tensorflow_writes():
    example = tf.train.Example(features=tf.train.Features(feature={
        record_format.ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(range(6))])),
        record_format.FORMAT: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"raw"])),
        record_format.HEIGHT: tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        record_format.WIDTH: tf.train.Feature(int64_list=tf.train.Int64List(value=[2])),
        record_format.LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
        record_format.FILENAME: tf.train.Feature(bytes_list=tf.train.BytesList(value=["é.png".encode()])),
        "extra/float": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5])),  # unknown keys are ignored
    }))
    decoded = record_format.decode_example(example.SerializeToString())
    assert decoded == ImageRecord(bytes(range(6)), "raw", 1, 2, 3, "é.png")
    assert record_format.decode_pixels(decoded).tolist() == [[[0, 1, 2], [3, 4, 5]]]


def test_tf_parse_example_reads_our_records():
    images = [record(), record(label=2, encoded=bytes(range(100, 112)))]
    parsed = tf.io.parse_example(tf.constant([record_format.encode_example(r) for r in images]),
                                 tf_parse_spec())
    assert parsed[record_format.LABEL].numpy().tolist() == [7, 2]
    assert parsed[record_format.ENCODED].numpy().tolist() == [r.encoded for r in images]
    assert parsed[record_format.FILENAME].numpy()[0].decode() == "train/cat/ü 1.jpg"


# --- parse_features against tf.train.Example.SerializeToString --------------------------------------------------

float32s = st.floats(width=32, allow_nan=False)
features = st.dictionaries(
    st.text(max_size=12),
    st.one_of(
        st.tuples(st.just("bytes_list"), st.lists(st.binary(max_size=20), max_size=4)),
        st.tuples(st.just("float_list"), st.lists(float32s, max_size=4)),
        st.tuples(st.just("int64_list"), st.lists(INT64, max_size=4)),
        st.tuples(st.none(), st.just([])),
    ),
    max_size=6,
)


def tf_example(spec: dict) -> tf.train.Example:
    example = tf.train.Example()
    for key, (kind, values) in spec.items():
        feature = example.features.feature[key]
        if kind is None:
            feature.SetInParent()  # an empty Feature: no list at all
        else:
            getattr(feature, kind).value.extend(values)
    return example


@PROPERTY_SETTINGS
@given(spec=features)
def test_parse_features_reads_any_tensorflow_example(spec):
    serialized = tf_example(spec).SerializeToString()
    assert record_format.parse_features(serialized) == {key: values for key, (_, values) in spec.items()}


def _varint(value: int) -> bytes:
    return record_format.varint(value)


def _field(number: int, payload: bytes) -> bytes:
    return record_format._field(number, payload)


def _example_with_feature(key: str, feature: bytes) -> bytes:
    return _field(1, _field(1, _field(1, key.encode()) + _field(2, feature)))


@pytest.mark.parametrize("values", [[0], [1, -1, 300], [(1 << 63) - 1, -(1 << 63), -2]])
def test_unpacked_int64_list(values):
    # proto2 writers (and some other libraries) write one tagged varint per value instead of a packed run.
    unpacked = b"".join(_varint(1 << 3 | 0) + _varint(v) for v in values)
    serialized = _example_with_feature("k", _field(3, unpacked))
    assert tf_features(serialized)["k"] == ("int64_list", values)
    assert record_format.parse_features(serialized) == {"k": values}


def test_unpacked_float_list():
    values = [0.5, -2.0, 3.25]
    unpacked = b"".join(_varint(1 << 3 | 5) + struct.pack("<f", v) for v in values)
    serialized = _example_with_feature("k", _field(2, unpacked))
    assert tf_features(serialized)["k"] == ("float_list", values)
    assert record_format.parse_features(serialized) == {"k": values}


def _entry_with_value_twice() -> bytes:
    entry = _field(1, b"k") + _field(2, _field(1, _field(1, b"ab"))) + _field(2, _field(1, _field(1, b"cd")))
    return _field(1, _field(1, entry))


PROTOBUF_EDGE_CASES = dict([
    # oneof: the last list kind parsed wins
    ("bytes then int64", _example_with_feature("k", _field(1, _field(1, b"ab")) + _field(3, _field(1, _varint(5))))),
    # the same list twice: protobuf merges (concatenates) them
    ("bytes twice", _example_with_feature("k", _field(1, _field(1, b"ab")) + _field(1, _field(1, b"cd")))),
    # a map entry's value twice: protobuf merges the two Features
    ("value twice", _entry_with_value_twice()),
    # unknown field numbers are skipped whatever their payload
    ("unknown field", _example_with_feature("k", _field(7, b"\xff\xff\xff") + _field(1, _field(1, b"ab")))),
    # a value with the wrong wire type is an unknown field, not a value
    ("int64 as fixed64", _example_with_feature("k", _field(3, _varint(1 << 3 | 1) + (7).to_bytes(8, "little")))),
    ("bytes as varint", _example_with_feature("k", _field(1, _varint(1 << 3 | 0) + _varint(10 ** 12)))),
    ("float as varint", _example_with_feature("k", _field(2, _varint(1 << 3 | 0) + _varint(1 << 40)))),
    # a 10-byte varint whose last byte has bits beyond 64: protobuf keeps the low 64 bits
    ("overlong varint", _example_with_feature("k", _field(3, _field(1, bytes([0x81] + [0x80] * 8 + [0x7F]))))),
    # a map entry without a key: protobuf's default, the empty string
    ("no key", _field(1, _field(1, _field(2, _field(1, _field(1, b"v")))))),
])


@pytest.mark.parametrize("name", list(PROTOBUF_EDGE_CASES))
def test_protobuf_edge_cases_parse_as_tensorflow_does(name):
    serialized = PROTOBUF_EDGE_CASES[name]
    expected = {key: values for key, (_, values) in tf_features(serialized).items()}
    assert record_format.parse_features(serialized) == expected


# --- malformed records --------------------------------------------------------------------------------------------

MALFORMED = dict([
    ("truncated", record_format.encode_example(record())[:-3]),
    ("length past the end", _field(1, b"")[:-1] + b"\x05"),
    ("overlong varint", b"\x08" + b"\xff" * 11),
    ("group wire type", b"\x0b\x0c"),
    ("packed floats not a multiple of 4", _example_with_feature("k", _field(2, _field(1, b"\x00\x00\x00")))),
    ("key not utf-8", _field(1, _field(1, _field(1, b"\xff") + _field(2, b"")))),
])


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bytes_raise_record_format_error(name):
    serialized = MALFORMED[name]
    with pytest.raises(RecordFormatError):
        record_format.parse_features(serialized)
    with pytest.raises(RecordFormatError):
        record_format.decode_example(serialized)


def _with(key: str, feature: bytes) -> bytes:
    """Our record with one feature replaced (the later map entry wins)."""
    return record_format.encode_example(record()) + _example_with_feature(key, feature)


INVALID_RECORDS = dict([
    ("missing key", _example_with_feature(record_format.ENCODED, record_format.bytes_feature(b""))),
    ("height as bytes", _with(record_format.HEIGHT, record_format.bytes_feature(b"2"))),
    ("label as float", _with(record_format.LABEL, _field(2, _field(1, struct.pack("<f", 7.0))))),
    ("two labels", _with(record_format.LABEL, _field(3, _field(1, _varint(1) + _varint(2))))),
    ("negative size", record_format.encode_example(record(height=-2, width=-2))),
    ("zero width", record_format.encode_example(record(width=0, encoded=b""))),
    ("raw length mismatch", record_format.encode_example(record(encoded=bytes(11)))),
    ("unknown format", _with(record_format.FORMAT, record_format.bytes_feature(b"webp2"))),
    ("filename not utf-8", _with(record_format.FILENAME, record_format.bytes_feature(b"\xff"))),
])


@pytest.mark.parametrize("name", list(INVALID_RECORDS))
def test_invalid_shardprep_records_raise_record_format_error(name):
    serialized = INVALID_RECORDS[name]
    record_format.parse_features(serialized)  # a well-formed Example ...
    with pytest.raises(RecordFormatError):
        record_format.decode_example(serialized)  # ... but not a valid shardprep record


VALID_RECORD = record_format.encode_example(record(encoded=bytes(range(48)), height=4, width=4))


@st.composite
def mutated_records(draw) -> bytes:
    data = bytearray(VALID_RECORD)
    for _ in range(draw(st.integers(1, 5))):
        if not data:
            break
        position = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["set", "truncate", "insert", "delete"]))
        if kind == "set":
            data[position] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=12))
        else:
            del data[position: position + draw(st.integers(1, 16))]
    return bytes(data)


def protobuf_messages(depth: int):
    """Random protobuf-shaped bytes: fields 1-4 of every wire type, length-delimited ones holding random bytes or a
    nested message. Five levels reach the value lists inside Example > Features > entry > Feature > list."""
    payload = st.binary(max_size=12) if depth == 0 else st.one_of(st.binary(max_size=12), protobuf_messages(depth - 1))
    field = st.one_of(
        st.builds(lambda n, v: _varint(n << 3 | 0) + _varint(v), st.integers(1, 4), INT64),
        st.builds(lambda n, v: _varint(n << 3 | 1) + v, st.integers(1, 4), st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, v: _varint(n << 3 | 5) + v, st.integers(1, 4), st.binary(min_size=4, max_size=4)),
        st.builds(_field, st.integers(1, 4), payload),
    )
    return st.lists(field, max_size=4).map(b"".join)


def _list_values():
    """The inside of a BytesList/FloatList/Int64List: values of any wire type, mostly as field 1."""
    number = st.sampled_from([1, 1, 1, 2])
    value = st.one_of(
        st.builds(lambda n, v: _varint(n << 3 | 0) + _varint(v), number, INT64),
        st.builds(lambda n, v: _varint(n << 3 | 1) + v, number, st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, v: _varint(n << 3 | 5) + v, number, st.binary(min_size=4, max_size=4)),
        st.builds(_field, number, st.binary(max_size=10)),
    )
    return st.lists(value, max_size=3).map(b"".join)


# Feature: any of the three lists (and an unknown field 4), any number of times.
example_features = st.lists(st.builds(_field, st.integers(1, 4), _list_values()), max_size=3).map(b"".join)
# Example bytes with well-formed keys around hostile Features, where the list parsing is.
example_shaped = st.lists(
    st.builds(lambda key, feature: _field(1, _field(1, key.encode()) + _field(2, feature)),
              st.sampled_from(["a", "b", record_format.LABEL]), example_features),
    max_size=3,
).map(lambda entries: _field(1, b"".join(entries)))

hostile_records = st.one_of(st.binary(max_size=400), mutated_records(), protobuf_messages(5), example_shaped)


@PROPERTY_SETTINGS
@given(serialized=hostile_records)
def test_decode_example_raises_only_record_format_error(serialized):
    try:
        decoded = record_format.decode_example(serialized)
    except RecordFormatError:
        return
    assert isinstance(decoded, ImageRecord)
    if decoded.format == "raw":
        assert record_format.decode_pixels(decoded).shape == (decoded.height, decoded.width, 3)


@PROPERTY_SETTINGS
@given(serialized=example_shaped)
def test_parse_features_agrees_with_tensorflow_on_hostile_features(serialized):
    # Keys are well-formed here (protobuf's parser drops a map entry whose key has the wrong wire type, a quirk not
    # worth copying); whatever is inside Feature must be read as TensorFlow reads it, or rejected when it rejects.
    try:
        expected = {key: values for key, (_, values) in tf_features(serialized).items()}
    except DecodeError:
        expected = "rejected"
    try:
        parsed = record_format.parse_features(serialized)
    except RecordFormatError:
        parsed = "rejected"
    assert comparable(parsed) == comparable(expected)


def comparable(features):
    """NaN != NaN, so floats are compared by their float32 bytes."""
    if not isinstance(features, dict):
        return features
    return {key: [struct.pack("<f", v) if isinstance(v, float) else v for v in values]
            for key, values in features.items()}


# --- TFRecord framing -------------------------------------------------------------------------------------------

PAYLOADS = [b"", b"a", bytes(range(256)) * 40, record_format.encode_example(record())]


def write_framed(path, payloads) -> bytes:
    data = b"".join(tfrecord_io.frame(p) for p in payloads)
    path.write_bytes(data)
    return data


def test_tensorflow_reads_framed_records(tmp_path):
    path = tmp_path / "ours.tfrecord"
    data = write_framed(path, PAYLOADS)
    assert len(data) == sum(tfrecord_io.framed_size(len(p)) for p in PAYLOADS)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == PAYLOADS


def test_read_records_reads_what_tensorflow_writes(tmp_path):
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in PAYLOADS:
            writer.write(payload)
    assert path.read_bytes() == b"".join(tfrecord_io.frame(p) for p in PAYLOADS)
    with open(path, "rb") as f:
        assert list(tfrecord_io.read_records(f)) == PAYLOADS


def test_masked_crc32c_known_value():
    # TensorFlow's crc32c_test: crc32c("123456789") is 0xE3069283; masked as TFRecord does.
    crc = 0xE3069283
    assert tfrecord_io.masked_crc32c(b"123456789") == ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


FRAMING_PAYLOADS = [b"first record", b"", b"third, the one that gets damaged", b"fourth"]
OFFSETS = np.cumsum([0] + [tfrecord_io.framed_size(len(p)) for p in FRAMING_PAYLOADS]).tolist()


def read_all(data: bytes) -> list[bytes]:
    return list(tfrecord_io.read_records(io.BytesIO(data)))


@pytest.mark.parametrize("region, offset_in_record", [
    ("length", 0), ("length", 7), ("length checksum", 9), ("data", 12), ("data", 20), ("data checksum", -1),
])
def test_flipped_byte_names_the_damaged_record(region, offset_in_record):
    data = bytearray(b"".join(tfrecord_io.frame(p) for p in FRAMING_PAYLOADS))
    damaged = 2
    position = (OFFSETS[damaged + 1] if offset_in_record < 0 else OFFSETS[damaged]) + offset_in_record
    data[position] ^= 0x10
    records = tfrecord_io.read_records(io.BytesIO(bytes(data)))
    assert [next(records), next(records)] == FRAMING_PAYLOADS[:2]
    with pytest.raises(CorruptRecordError) as raised:
        next(records)
    assert (raised.value.index, raised.value.offset) == (damaged, OFFSETS[damaged])
    assert "checksum" in str(raised.value)


def test_truncation_anywhere_names_the_cut_record():
    data = b"".join(tfrecord_io.frame(p) for p in FRAMING_PAYLOADS)
    for end in range(len(data) + 1):
        complete = sum(1 for offset in OFFSETS[1:] if offset <= end)
        if end in OFFSETS:  # cut exactly between records: a shorter, valid file
            assert read_all(data[:end]) == FRAMING_PAYLOADS[:complete]
            continue
        with pytest.raises(CorruptRecordError) as raised:
            read_all(data[:end])
        assert (raised.value.index, raised.value.offset) == (complete, OFFSETS[complete]), end
        assert "truncated" in str(raised.value)


def test_tensorflow_agrees_that_the_damaged_files_are_damaged(tmp_path):
    # The same damage our reader reports, TensorFlow's reader reports too (so ours is not stricter than the format).
    data = bytearray(b"".join(tfrecord_io.frame(p) for p in FRAMING_PAYLOADS))
    data[OFFSETS[2] + 14] ^= 0x10
    path = tmp_path / "damaged.tfrecord"
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))
    path.write_bytes(bytes(data[: OFFSETS[3] - 2]))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


# --- the fixed layout of raw centre crops ---------------------------------------------------------------------

@PROPERTY_SETTINGS
@given(height=st.integers(1, 9), width=st.integers(1, 9), max_label=st.sampled_from([0, 5, 127, 128, 20000, 2**63 - 1]),
       filenames=st.lists(st.text(max_size=60), min_size=1, max_size=6), data=st.data())
def test_fixed_layout_records_are_one_length_with_pixels_and_label_in_place(height, width, max_label, filenames,
                                                                         data):
    lengths = [len(name.encode()) for name in filenames]
    layout = fixed_layout.FixedLayout.for_records(height, width, (min(lengths), max(lengths)), max_label)
    for name in filenames:
        pixels = data.draw(st.binary(min_size=height * width * 3, max_size=height * width * 3))
        label = data.draw(st.integers(0, max_label))
        image = ImageRecord(encoded=pixels, format="raw", height=height, width=width, label=label, filename=name)
        for shard_end in (False, True):
            framed = layout.encode(image, shard_end)
            assert len(framed) == layout.record_bytes + (layout.image_offset if shard_end else 0)
            assert framed[layout.image_offset:layout.image_offset + len(pixels)] == pixels
            assert record_format.read_varint(memoryview(framed), layout.label_offset)[0] == label
            example = read_all(framed)[0]
            assert record_format.decode_example(example) == image
            features = tf_features(example)
            assert features.pop(fixed_layout.PADDING)[0] == "bytes_list"
            assert features == tf_features(record_format.encode_example(image))
            assert layout.reframe(framed, not shard_end) == layout.encode(image, not shard_end)
    assert fixed_layout.FixedLayout.from_json(layout.to_json(), height, width) == layout


def test_a_fixed_layout_shard_reads_as_tfrecords_and_as_fixed_length_chunks(tmp_path):
    layout = fixed_layout.FixedLayout.for_records(3, 2, (1, 40), 300)
    images = [ImageRecord(encoded=bytes([i]) * 18, format="raw", height=3, width=2, label=i * 50, filename="x" * i)
              for i in range(1, 7)]
    # Records as decode groups leave them: each group's last one is a shard end, here the 2nd and the 6th.
    spilled = [layout.encode(image, shard_end=i in (1, 5)) for i, image in enumerate(images)]
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(b"".join(layout.shard_records(spilled)))
    assert path.stat().st_size == layout.image_offset + len(images) * layout.record_bytes
    assert [record_format.decode_example(r.numpy()) for r in tf.data.TFRecordDataset(str(path))] == images
    chunks = [c.numpy() for c in tf.data.FixedLengthRecordDataset(str(path), layout.record_bytes,
                                                                  header_bytes=layout.image_offset)]
    assert [c[:18] for c in chunks] == [image.encoded for image in images]
    label_start = layout.label_offset - layout.image_offset
    assert [record_format.read_varint(memoryview(c), label_start)[0] for c in chunks] == [i * 50 for i in range(1, 7)]


def test_records_outside_the_fixed_layout_are_refused():
    layout = fixed_layout.FixedLayout.for_records(2, 2, (3, 5), 9)
    fits = ImageRecord(encoded=bytes(12), format="raw", height=2, width=2, label=9, filename="abcde")
    layout.encode(fits)
    for changes in (dict(filename="abcdef"), dict(label=10**6), dict(encoded=bytes(11)), dict(height=3),
                    dict(format="jpeg")):
        with pytest.raises(RecordFormatError):
            layout.encode(dataclasses.replace(fits, **changes))
    with pytest.raises(RecordFormatError, match="too different in length"):
        fixed_layout.FixedLayout.for_records(2, 2, (0, 1 << 36), 9)
