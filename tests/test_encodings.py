"""The encoding registry: lookup by name, an unknown name refused where it is read, and every registered encoding
round-tripped through its NumPy and tf.data decoders and through both readers."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from PIL import Image

from shardprep.preprocess.format import encodings, record_format
from shardprep.preprocess.format.encodings import UnknownEncodingError
from shardprep.preprocess.format.dataset import Manifest
from shardprep.train.data.batch_sources import ExampleSource
from shardprep.train.data.numpy_reader import NumpyReader
from train_helpers import read_json, write_dataset

ENCODINGS = [pytest.param(encoding, id=encoding.name) for encoding in encodings.REGISTERED]


def _image(height=9, width=13, seed=0) -> np.ndarray:
    """A smooth image with some texture, so lossy encodings stay close to it."""
    rows, cols = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    pixels = np.stack([rows * 255 // height, cols * 255 // width, (rows + cols) * 8 % 256], axis=-1)
    return np.clip(pixels + rng.integers(-6, 7, pixels.shape), 0, 255).astype(np.uint8)


def _assert_close(decoded: np.ndarray, original: np.ndarray, encoding: encodings.Encoding):
    assert decoded.dtype == np.uint8 and decoded.shape == original.shape
    error = np.abs(decoded.astype(np.int16) - original).mean()
    assert error <= (0 if encoding.stored_bytes(1, 1) is not None else 8), error  # size-fixed bytes: lossless


def test_lookup_by_name_gives_each_registered_encoding():
    assert encodings.NAMES == tuple(encoding.name for encoding in encodings.REGISTERED)
    assert encodings.NAMES[:2] == ("raw", "jpeg")
    assert len(set(encodings.NAMES)) == len(encodings.NAMES)
    for encoding in encodings.REGISTERED:
        assert encodings.get(encoding.name) is encoding and encoding.summary and encoding.label
    assert encodings.get("raw") is encodings.RAW
    assert encodings.has_fixed_layout("raw", "center") and not encodings.has_fixed_layout("raw", "none")
    assert not encodings.has_fixed_layout("jpeg", "center") and not encodings.has_fixed_layout("webp2", "center")


@pytest.mark.parametrize("name", ["webp2", "RAW", "", None, b"raw", 3])
def test_an_unknown_name_is_an_error_naming_it_and_the_known_ones(name):
    with pytest.raises(UnknownEncodingError) as caught:
        encodings.get(name)
    assert isinstance(caught.value, ValueError)
    assert repr(name) in str(caught.value) and ", ".join(encodings.NAMES) in str(caught.value)


def test_the_command_line_and_the_options_take_their_choices_from_the_registry():
    from shardprep.commands.preprocess import command
    from shardprep.preprocess.format import config
    from shardprep.preprocess.image.image_ops import ProcessOptions

    option = next(p for p in command.params if p.name == "encoding")
    assert tuple(option.type.choices) == encodings.NAMES and config.default("encoding") == encodings.NAMES[0]
    for encoding in encodings.REGISTERED:
        assert f"{encoding.name}: {encoding.summary}" in option.help
        assert ProcessOptions(encoding=encoding.name).stored is encoding
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'"):
        ProcessOptions(encoding="webp2")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_numpy_and_tf_decoders_give_the_same_pixels(encoding):
    import tensorflow as tf

    original = _image()
    encoded = encoding.encode(Image.fromarray(original, "RGB"), 90)
    assert encoded == encoding.encode(Image.fromarray(original, "RGB"), 90)  # the same bytes every time
    decoded = encoding.decode(encoded, *original.shape[:2])
    _assert_close(decoded, original, encoding)
    eager = encoding.decode_tf(tf.constant(encoded), tf.constant(9), tf.constant(13)).numpy()
    np.testing.assert_array_equal(eager, decoded)
    in_graph = tf.function(lambda data: encoding.decode_tf(data, tf.constant(9), tf.constant(13)))
    np.testing.assert_array_equal(in_graph(tf.constant(encoded)).numpy(), decoded)


def test_the_default_tf_decoder_hands_numpy_every_byte():
    """An encoding without a TensorFlow decoder of its own runs its NumPy one in ``tf.numpy_function``: the bytes
    must arrive whole, trailing NUL bytes included (a string tensor reaches NumPy as ``np.bytes_``, which drops
    them)."""
    import tensorflow as tf

    class TrailingZeros(encodings.PillowEncoding):
        def encode(self, image, quality):
            return super().encode(image, quality) + bytes(3)

        def decode(self, encoded, height, width):
            assert encoded.endswith(bytes(3)), "trailing bytes lost"
            return super().decode(encoded[:-3], height, width)

    stored = TrailingZeros(name="png-and-zeros", label="PNG", pillow_format="PNG")
    original = _image(seed=2)
    encoded = stored.encode(Image.fromarray(original, "RGB"), 90)
    decoded = stored.decode_tf(tf.constant(encoded), tf.constant(9), tf.constant(13))
    assert decoded.shape.rank == 3
    np.testing.assert_array_equal(decoded.numpy(), original)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_record_round_trips_through_the_record_format(encoding):
    original = _image(seed=1)
    record = record_format.ImageRecord(encoded=encoding.encode(Image.fromarray(original, "RGB"), 90),
                                       format=encoding.name, height=9, width=13, label=2, filename="a/b.png")
    parsed = record_format.decode_example(record_format.encode_example(record))
    assert parsed == record
    _assert_close(record_format.decode_pixels(parsed), original, encoding)


@pytest.mark.parametrize("crop", ["center", "none"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_both_readers_give_the_stored_pixels_of_every_encoding(tmp_path, encoding, crop):
    from shardprep.train.data import reader

    height, width = (8, 8) if crop == "center" else (8, 12)
    items = [(_image(height, width, seed=i), i % 2) for i in range(6)]
    write_dataset(tmp_path, {"train": items}, classes=["a", "b"], encoding=encoding.name, crop=crop, num_shards=2,
                  shorter_side=8)
    numpy_batches = list(itertools.islice(NumpyReader(str(tmp_path), "train", 3, training=False), 2))
    tf_batches = [(images.numpy(), labels.numpy())
                  for images, labels in reader.make_dataset(str(tmp_path), "train", 3, training=False)]
    streamed = [(images.numpy(), labels.numpy()) for images, labels in reader.make_dataset(
        str(tmp_path), "train", 3, training=False, random_access=False)]
    by_label = sorted(zip(*(np.concatenate(part) for part in zip(*numpy_batches))), key=lambda pair: pair[0].sum())
    for other in (tf_batches, streamed):
        assert len(other) == 2
        other_by_label = sorted(zip(*(np.concatenate(part) for part in zip(*other))), key=lambda pair: pair[0].sum())
        for (image, label), (other_image, other_label) in zip(by_label, other_by_label):
            np.testing.assert_array_equal(image, other_image)
            assert label == other_label
    left = (width - 8) // 2  # evaluation crops are central
    for image, label in zip(*(np.concatenate(part) for part in zip(*numpy_batches))):
        match = [original for original, item_label in items if item_label == label and np.abs(
            original[:, left:left + 8].astype(np.int16) - image).mean() <= 8]
        assert match, "a batch image is none of the stored images"


@pytest.fixture
def jpeg_dataset(tmp_path):
    write_dataset(tmp_path, {"train": [(_image(8, 8, seed=i), i % 2) for i in range(4)]}, classes=["a", "b"],
                  encoding="jpeg", num_shards=1)
    return str(tmp_path)


def test_an_unknown_encoding_is_a_clear_error_when_read_not_read_as_raw(jpeg_dataset):
    from shardprep.train.data import read_stream, reader

    manifest = dataclasses.replace(Manifest.from_json(read_json(f"{jpeg_dataset}/manifest.json")), encoding="webp2")
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'.*raw, jpeg"):
        reader.make_dataset(jpeg_dataset, "train", 2, training=False, manifest=manifest)
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'"):
        reader.make_dataset(jpeg_dataset, "train", 2, training=False, manifest=manifest, random_access=False)
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'"):
        NumpyReader(jpeg_dataset, "train", 2, training=False, manifest=manifest)
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'"):
        ExampleSource([], [], manifest, training=False)
    import tensorflow as tf

    serialized = tf.data.Dataset.from_tensors((tf.constant([b"x"]), tf.zeros([1, 2], tf.int64)))
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'webp2'"):
        read_stream.indexed_batches(serialized, "webp2", "center", 8, 8, 8, training=False)


def test_an_unknown_encoding_in_a_manifest_or_record_names_it(jpeg_dataset):
    document = read_json(f"{jpeg_dataset}/manifest.json")
    document["encoding"] = "webp2"
    with pytest.raises(ValueError, match="encoding: must be one of raw, jpeg.*'webp2'"):
        Manifest.from_json(document)
    record = record_format.ImageRecord(encoded=b"x", format="webp2", height=1, width=1, label=0, filename="f")
    with pytest.raises(record_format.RecordFormatError, match="unknown image format 'webp2'"):
        record_format.encode_example(record)
    good = record_format.encode_example(dataclasses.replace(record, format="jpeg"))
    with pytest.raises(record_format.RecordFormatError, match="unknown image format 'zzzz'"):
        record_format.decode_example(good.replace(b"jpeg", b"zzzz"))  # a name of the same length: a valid Example


def test_png_is_lossless_through_a_record():
    png = encodings.get("png")
    original = _image(seed=3)
    record = record_format.ImageRecord(encoded=png.encode(Image.fromarray(original, "RGB"), 90), format="png",
                                       height=9, width=13, label=0, filename="a.png")
    parsed = record_format.decode_example(record_format.encode_example(record))
    np.testing.assert_array_equal(record_format.decode_pixels(parsed), original)


@pytest.mark.parametrize("text, expected", [("raw", ("raw", None)), ("png", ("png", None)), ("jpeg", ("jpeg", None)),
                                            ("jpeg:75", ("jpeg", 75)), ("jpeg:100", ("jpeg", 100))])
def test_an_encoding_is_named_with_its_parameter(text, expected):
    spec = encodings.parse_spec(text)
    assert (spec.encoding.name, spec.quality) == expected


@pytest.mark.parametrize("text, message", [("jpeg:0", "within 1-100"), ("jpeg:x", "within 1-100"),
                                           ("jpeg:", "within 1-100"), ("raw:5", "raw takes no parameter"),
                                           ("webp2:3", "unknown encoding 'webp2'")])
def test_a_wrong_spec_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        encodings.parse_spec(text)


def test_the_command_line_takes_both_spellings(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from shardprep.commands.preprocess import command
    from shardprep.pipelines.preprocess_job import graph as job

    configs = []

    def stop(config, *args, **kwargs):
        configs.append(config)
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "execute_job", stop)
    (tmp_path / "src" / "a").mkdir(parents=True)
    for args in (["--encoding", "jpeg:75"], ["--encoding", "jpeg", "--jpeg-quality", "75"],
                 ["--encoding", "jpeg:75", "--jpeg-quality", "75"]):
        CliRunner().invoke(command, [str(tmp_path / "src"), str(tmp_path / "out"), "--quiet", *args])
    assert [(c.encoding, c.jpeg_quality) for c in configs] == [("jpeg", 75)] * 3
    for args, message in ((["--encoding", "jpeg:75", "--jpeg-quality", "80"], "disagree"),
                          (["--encoding", "jpeg:101"], "within 1-100"), (["--encoding", "gif"], "'gif'")):
        result = CliRunner().invoke(command, [str(tmp_path / "src"), str(tmp_path / "out"), *args])
        assert result.exit_code == 2 and message in result.output, result.output
