"""The preprocess job end to end, as a user runs it: every source kind, rejects, sharding, determinism, safety."""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os

import image_factory
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.preprocess.format import sharding
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.cli import main as cli

# Fast for tests that don't exercise multi-processing: one worker in this process, as a small run chooses by itself
# (in_memory alone gives a worker thread a core).
IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


def run_cli(*args, expect_ok=True):
    result = CliRunner().invoke(cli, ["preprocess", *map(str, args)], catch_exceptions=False)
    if expect_ok:
        assert result.exit_code == 0, result.output
    return result


def read_records(path: str) -> list[record_format.ImageRecord]:
    with open(path, "rb") as f:
        return [record_format.decode_example(r) for r in tfrecord_io.read_records(f)]


def all_records(out, split) -> list[record_format.ImageRecord]:
    manifest = manifest_lib.read_document(str(out))
    return [r for rel in Manifest.from_json(manifest).shard_files(split) for r in read_records(os.path.join(out, rel))]


def assert_fixed_layout(out, manifest: dict) -> None:
    """Raw centre crops: every shard is image_offset + N * record_bytes bytes, and each chunk of record_bytes from
    image_offset holds a record's pixels and then its label at the manifest's offsets."""
    for split, info in manifest["splits"].items():
        layout = info["record_layout"]
        start, label_start = layout["image_offset"], layout["label_offset"] - layout["image_offset"]
        for shard in info["shards"]:
            data = open(os.path.join(out, shard["file"]), "rb").read()
            assert len(data) == start + shard["num_examples"] * layout["record_bytes"]
            records = read_records(os.path.join(out, shard["file"]))
            chunks = [data[start + i * layout["record_bytes"]:][:layout["record_bytes"]] for i in range(len(records))]
            assert [c[:len(r.encoded)] for c, r in zip(chunks, records)] == [r.encoded for r in records]
            assert [record_format.read_varint(memoryview(c), label_start)[0] for c in chunks] == [
                r.label for r in records]


def read_rejects(out) -> list[dict]:
    with open(os.path.join(out, "rejects.jsonl")) as f:
        return [json.loads(line) for line in f]


def pillow_reference(path: str, shorter_side: int) -> np.ndarray:
    """The same resize done plainly with Pillow: full decode, RGB on white, BICUBIC shorter side, centre crop."""
    with Image.open(path) as image:
        image.seek(0)
        from PIL import ImageOps

        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA", "P") and (image.mode != "P" or "transparency" in image.info):
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        image = image.convert("RGB")
        width, height = image.size
        size = job.image_ops.target_size(width, height, shorter_side)
        image = image.resize(size, Image.Resampling.BICUBIC)
        left, top = (size[0] - shorter_side) // 2, (size[1] - shorter_side) // 2
        return np.asarray(image.crop((left, top, left + shorter_side, top + shorter_side)))


FOLDER_OPTIONS = ("--shorter-side", 32, "--num-shards", 3)


def shard_digests(out) -> dict[str, str]:
    """{shard file: sha256} of every split of the dataset in ``out``."""
    manifest = manifest_lib.read_document(str(out))
    return {s["file"]: s["sha256"] for info in manifest["splits"].values() for s in info["shards"]}


@pytest.fixture(scope="module")
def folder_dataset(tmp_path_factory):
    """An ImageFolder source (train + validation, 3 classes, every format) with bad files, preprocessed once."""
    root = tmp_path_factory.mktemp("source")
    images = image_factory.write_image_folder(root, {"train": 30, "validation": 9})
    bad = image_factory.bad_inputs()
    for i, (name, (data, _)) in enumerate(sorted(bad.items())):
        split = "train" if i % 2 == 0 else "validation"
        with open(root / split / "red" / f"bad_{i:02d}.jpg", "wb") as f:
            f.write(data)
    out = tmp_path_factory.mktemp("out") / "dataset"
    # Two worker processes, named so that a change of the default runner keeps this run multi-process: the one-worker
    # run of test_same_inputs_give_identical_shards_with_one_or_two_workers_and_any_bucket_size is compared with it.
    result = run_cli(root, out, *FOLDER_OPTIONS, "--", "--direct_running_mode=multi_processing",
                     "--direct_num_workers=2")
    return root, out, images, bad, result


def test_folder_source_manifest_accounts_for_every_input(folder_dataset):
    root, out, images, bad, result = folder_dataset
    manifest = manifest_lib.read_document(str(out))
    assert manifest["classes"] == ["blue", "green", "red"]
    assert manifest["encoding"] == "raw" and manifest["crop"] == "center" and manifest["shorter_side"] == 32
    for split in ("train", "validation"):
        info = manifest["splits"][split]
        inputs = len(glob.glob(str(root / split / "*" / "*")))
        assert info["num_inputs"] == inputs
        assert info["num_examples"] + info["num_rejected"] == inputs
        assert info["num_examples"] == sum(1 for im in images if im.split == split)
        expected_counts = {c: sum(1 for im in images if im.split == split and im.class_name == c)
                           for c in manifest["classes"]}
        assert info["class_counts"] == expected_counts
    assert manifest["num_rejected"] == len(bad)
    # The summary table is printed at the end.
    assert "rejected by reason" in result.output and "wall time" in result.output


def test_rejects_name_input_and_reason(folder_dataset):
    root, out, _, bad, _ = folder_dataset
    rejects = read_rejects(out)
    assert len(rejects) == len(bad)
    expected = {f"{'train' if i % 2 == 0 else 'validation'}/red/bad_{i:02d}.jpg": reason
                for i, (_, (_, reason)) in enumerate(sorted(bad.items()))}
    assert {r["key"]: r["reason"] for r in rejects} == expected
    assert all(r["detail"] for r in rejects)


def test_shards_are_uniform_listed_and_hashed(folder_dataset):
    _, out, _, _, _ = folder_dataset
    manifest = manifest_lib.read_document(str(out))
    for split, info in manifest["splits"].items():
        counts = [s["num_examples"] for s in info["shards"]]
        assert len(counts) == 3 and max(counts) - min(counts) <= 1
        for shard in info["shards"]:
            path = os.path.join(out, shard["file"])
            data = open(path, "rb").read()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["num_bytes"]
            labels = {r.label for r in read_records(path)}
            assert len(labels) > 1, "classes are mixed through every shard"
        assert sorted(os.listdir(os.path.join(out, split))) == sorted(
            os.path.basename(s["file"]) for s in info["shards"]), "no temporary or stray files"
    assert not os.path.exists(os.path.join(out, ".tmp"))
    assert_fixed_layout(out, manifest)


def test_records_read_back_with_tf_data_match_pillow_reference(folder_dataset):
    import tensorflow as tf
    spec = {record_format.ENCODED: tf.io.FixedLenFeature([], tf.string),
            record_format.FILENAME: tf.io.FixedLenFeature([], tf.string),
            record_format.LABEL: tf.io.FixedLenFeature([], tf.int64)}

    root, out, images, _, _ = folder_dataset
    manifest = manifest_lib.read_document(str(out))
    files = [os.path.join(out, f) for f in Manifest.from_json(manifest).shard_files("train")]
    parsed = tf.io.parse_example(
        tf.constant([r.numpy() for r in tf.data.TFRecordDataset(files)]), spec)
    pixels = tf.reshape(tf.io.decode_raw(parsed[record_format.ENCODED], tf.uint8), [-1, 32, 32, 3]).numpy()
    assert len(pixels) == manifest["splits"]["train"]["num_examples"]
    by_path = {im.path: im for im in images}
    for stored, name, label in zip(pixels, parsed[record_format.FILENAME].numpy(), parsed[record_format.LABEL].numpy()):
        path = os.path.join(root, name.decode())
        assert label == by_path[path].label
        difference = np.abs(stored.astype(int) - pillow_reference(path, 32).astype(int))
        # Small differences come from JPEG draft decoding (DCT scaling) of the larger noisy images; a crop off by
        # one pixel would differ by the noise itself (mean > 10).
        assert difference.mean() < 2.5 and np.percentile(difference, 99) <= 16, (name, by_path[path].kind)


def test_mean_std_match_stored_train_pixels(folder_dataset):
    _, out, _, _, _ = folder_dataset
    manifest = manifest_lib.read_document(str(out))
    pixels = np.concatenate([record_format.decode_pixels(r).reshape(-1, 3) for r in all_records(out, "train")])
    np.testing.assert_allclose(manifest["mean_rgb"], pixels.mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(manifest["std_rgb"], pixels.std(axis=0), atol=1e-4)


def test_single_split_folder_and_overwrite_refusal(tmp_path):
    root = tmp_path / "src"
    image_factory.write_image_folder(root / "tmp", {"x": 6}, classes=("cat", "dog"))
    os.rename(root / "tmp" / "x", root / "flat")  # SOURCE/<class>/<file>
    source = root / "flat"
    out = tmp_path / "out"
    run_cli(source, out, "--shorter-side", 16, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert list(manifest["splits"]) == ["train"] and manifest["classes"] == ["cat", "dog"]
    assert manifest["splits"]["train"]["num_examples"] == 6

    refused = run_cli(source, out, "--shorter-side", 16, *IN_PROCESS, expect_ok=False)
    assert refused.exit_code != 0 and "not empty" in refused.output and "--overwrite" in refused.output
    assert manifest_lib.read_document(str(out))["created"] == manifest["created"], "refusal leaves the dataset alone"

    run_cli(source, out, "--shorter-side", 16, "--overwrite", "--split", "all", *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert list(manifest["splits"]) == ["all"]
    assert sorted(os.listdir(out)) == ["all", "manifest.json", "rejects.jsonl"], \
        "old split folder removed, and no lock file left by the finished run"


def test_labels_file_source_with_missing_and_unlabelled_files(tmp_path):
    images = tmp_path / "val"
    images.mkdir()
    rows = []
    for i in range(6):
        name = f"ILSVRC2012_val_{i:08d}.JPEG"
        color = image_factory.RED if i % 2 else image_factory.BLUE
        (images / name).write_bytes(image_factory.rgb_jpeg(color, 50 + i, 40))
        if i != 5:
            rows.append((name, "n02" if i % 2 else "n01"))
    rows.append(("ILSVRC2012_val_00009999.JPEG", "n01"))  # no such file
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as f:
        csv.writer(f).writerows([("filename", "label"), *rows])
    out = tmp_path / "out"
    run_cli(images, out, "--labels-file", labels, "--split", "validation", "--shorter-side", 16, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    info = manifest["splits"]["validation"]
    assert manifest["classes"] == ["n01", "n02"]
    assert (info["num_inputs"], info["num_examples"], info["num_rejected"]) == (7, 5, 2)
    assert {r["reason"] for r in read_rejects(out)} == {"no_label", "missing_file"}
    records = {r.filename: r for r in all_records(out, "validation")}
    assert records["ILSVRC2012_val_00000001.JPEG"].label == 1
    assert records["ILSVRC2012_val_00000002.JPEG"].label == 0
    # Pixels: red images are labelled n02.
    assert record_format.decode_pixels(records["ILSVRC2012_val_00000001.JPEG"])[..., 0].mean() > 150


def test_imagenet_layout_and_file_names_that_are_not_utf8_are_rejects_and_folder_names_a_clear_error(tmp_path):
    """ImageNet's layout: train class folders beside a flat validation folder labelled by a CSV. Linux file names are
    bytes; records, the manifest and the runner's coders need text."""
    root = tmp_path / "imagenet"
    image_factory.write_image_folder(root, {"train": 4}, classes=("n01", "n02"))
    (root / "val").mkdir()
    (root / "val" / "a.JPEG").write_bytes(image_factory.rgb_jpeg(image_factory.RED))
    (root / "val" / "b.JPEG").write_bytes(image_factory.rgb_jpeg(image_factory.BLUE))
    bad_name = os.fsdecode(b"b\xff.JPEG")
    (root / "val" / bad_name).write_bytes(image_factory.rgb_jpeg(image_factory.BLUE))
    (root / "train" / "n01" / bad_name).write_bytes(image_factory.rgb_jpeg(image_factory.BLUE))
    labels = tmp_path / "val.csv"
    labels.write_text("a.JPEG,n02\nb.JPEG,n01\n")
    out = tmp_path / "out"
    run_cli(root, out, "--labels-file", labels, "--shorter-side", 16, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert manifest["classes"] == ["n01", "n02"]
    assert manifest["splits"]["val"]["class_counts"] == {"n01": 1, "n02": 1}
    with open(out / manifest_lib.REJECTS_NAME) as f:
        rejects = sorted((line["split"], line["key"], line["reason"]) for line in map(json.loads, f))
    assert rejects == [("train", "train/n01/b\\xff.JPEG", "bad_file_name"), ("val", "val/b\\xff.JPEG", "bad_file_name")]
    assert [(manifest["splits"][s]["num_inputs"], manifest["splits"][s]["num_examples"]) for s in ("train", "val")] == [
        (5, 4), (3, 2)]

    (root / "train" / os.fsdecode(b"n\xfe")).mkdir()
    result = run_cli(root, tmp_path / "out2", "--labels-file", labels, *IN_PROCESS, expect_ok=False)
    assert result.exit_code != 0 and "n\\xfe is not valid UTF-8" in result.output and "rename the folder" in result.output


def write_tfds_style_tfrecords(directory, split: str, images: list[tuple[bytes, int]], num_files: int = 2):
    """TFRecords as TFDS writes them: ``tf.train.Example``s of ``image`` (encoded bytes) and ``label`` (int64),
    serialized as protobuf does with sorted keys (tests/test_record_format.py checks that encoding against
    TensorFlow's; test_tfrecord_source_reads_tfds_style_records_and_rejects_corrupt_ones reads these back with
    TensorFlow), without importing TensorFlow."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for file_index in range(num_files):
        path = os.path.join(directory, f"seed-{split}.tfrecord-{file_index:05d}-of-{num_files:05d}")
        with open(path, "wb") as f:
            for data, label in images[file_index::num_files]:
                f.write(tfrecord_io.frame(record_format._field(1, (  # Example.features, its entries by key
                    record_format.feature_entry("image", record_format.bytes_feature(data))
                    + record_format.feature_entry("label", record_format.int64_feature(label))))))
        paths.append(path)
    return paths


def read_with_tensorflow(paths) -> list[tuple[bytes, int]]:
    """(image, label) of every record of ``paths``, as TensorFlow's own reader and protobuf parser find them."""
    import tensorflow as tf

    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset([str(p) for p in paths])]
    return [(e.features.feature["image"].bytes_list.value[0], e.features.feature["label"].int64_list.value[0])
            for e in examples]


def test_tfrecord_source_reads_tfds_style_records_and_rejects_corrupt_ones(tmp_path):
    colors = [image_factory.RED, image_factory.GREEN, image_factory.BLUE]
    train = [(image_factory.rgb_jpeg(colors[i % 3], 40 + i, 30), i % 3) for i in range(9)]
    train.append((b"not an image", 1))
    paths = write_tfds_style_tfrecords(tmp_path / "tfrecords", "train", train)
    write_tfds_style_tfrecords(tmp_path / "tfrecords", "test", [(image_factory.rgb_jpeg(colors[0]), 0)], num_files=1)
    assert read_with_tensorflow(paths) == train[0::2] + train[1::2]  # TensorFlow reads what was written
    # Flip one byte inside the last record of the first train file: its data CRC fails.
    data = bytearray(open(paths[0], "rb").read())
    data[-10] ^= 0xFF
    open(paths[0], "wb").write(bytes(data))
    out = tmp_path / "out"
    run_cli(f"tfrecord:{tmp_path}/tfrecords/*", out, "--shorter-side", 16, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert set(manifest["splits"]) == {"train", "test"}
    assert manifest["classes"] == ["0", "1", "2"]
    train_info = manifest["splits"]["train"]
    assert train_info["num_examples"] + train_info["num_rejected"] == train_info["num_inputs"]
    reasons = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert reasons["seed-train.tfrecord-00000-of-00002:4"] == "corrupt_record"
    assert reasons["seed-train.tfrecord-00001-of-00002:4"] == "not_an_image"
    labels = {r.filename: r.label for r in all_records(out, "train")}
    assert labels["seed-train.tfrecord-00000-of-00002:1"] == 2  # record 1 of file 0 is input 2: label 2
    assert_fixed_layout(out, manifest)


def test_tfds_source_reads_a_prepared_dataset_without_downloading(tmp_path):
    import tensorflow_datasets as tfds

    class ShardprepTinyColors(tfds.core.GeneratorBasedBuilder):
        """Two colours, generated: a prepared TFDS dataset for the tfds: source."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(),
                "label": tfds.features.ClassLabel(names=["red", "blue"]),
            }))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(6), "test": self._generate_examples(2)}

        def _generate_examples(self, n):
            for i in range(n):
                color = (200, 20, 20) if i % 2 == 0 else (20, 20, 200)
                yield i, {"image": np.full((20 + i, 30, 3), color, np.uint8), "label": i % 2}

    data_dir = tmp_path / "tfds"
    missing = run_cli("tfds:shardprep_tiny_colors", tmp_path / "out0", "--tfds-data-dir", data_dir, *IN_PROCESS,
                      expect_ok=False)
    assert missing.exit_code != 0 and "--tfds-download" in missing.output

    ShardprepTinyColors(data_dir=str(data_dir)).download_and_prepare()
    out = tmp_path / "out"
    run_cli("tfds:shardprep_tiny_colors", out, "--tfds-data-dir", data_dir, "--shorter-side", 16, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert manifest["classes"] == ["red", "blue"]
    assert manifest["splits"]["train"]["class_counts"] == {"red": 3, "blue": 3}
    for record in all_records(out, "train"):
        pixels = record_format.decode_pixels(record)
        assert (pixels[..., 0].mean() > pixels[..., 2].mean()) == (record.label == 0)


def test_crop_none_and_jpeg_encoding(tmp_path):
    root = tmp_path / "src"
    images = image_factory.write_image_folder(root, {"train": 8}, classes=("a", "b"), min_side=30, max_side=80)
    out = tmp_path / "out"
    run_cli(root, out, "--shorter-side", 24, "--crop", "none", "--encoding", "jpeg", "--jpeg-quality", 95, *IN_PROCESS)
    manifest = manifest_lib.read_document(str(out))
    assert manifest["image_height"] is None and manifest["encoding"] == "jpeg"
    assert "record_layout" not in manifest["splits"]["train"]  # records of varied lengths
    for record in all_records(out, "train"):
        assert record.format == "jpeg" and min(record.height, record.width) == 24
        image = next(im for im in images if im.path.endswith(record.filename))
        assert (record.width, record.height) == job.image_ops.target_size(image.width, image.height, 24)
        assert record_format.decode_pixels(record).shape == (record.height, record.width, 3)


def test_same_inputs_give_identical_shards_with_one_or_two_workers_and_any_bucket_size(folder_dataset, tmp_path,
                                                                                       monkeypatch):
    """The fixture's run had two worker processes, and its splits of 30 and 9 records were one bucket each. One
    in-process worker with tiny buckets (as a big dataset has many; shard starts then fall inside buckets of 3)
    writes the same shards and rejects; another seed writes other shards."""
    root, out, _, _, _ = folder_dataset
    monkeypatch.setattr(sharding, "BUCKET_TARGET", 3)
    run_cli(root, tmp_path / "one", *FOLDER_OPTIONS, *IN_PROCESS)
    two, one = manifest_lib.read_document(str(out)), manifest_lib.read_document(str(tmp_path / "one"))
    assert shard_digests(tmp_path / "one") == shard_digests(out)
    assert read_rejects(tmp_path / "one") == read_rejects(out)
    for split, info in one["splits"].items():
        assert sharding.num_buckets(info["num_examples"]) > 1
        assert two["splits"][split]["shards"] == info["shards"]
        assert [s["num_examples"] for s in info["shards"]] == list(
            np.diff([0, *sharding.boundary_ranks(info["num_examples"], 3), info["num_examples"]]))
    monkeypatch.undo()
    run_cli(root, tmp_path / "seed1", *FOLDER_OPTIONS, "--seed", 1, *IN_PROCESS)
    reseeded = shard_digests(tmp_path / "seed1")
    assert reseeded.keys() == shard_digests(out).keys() and reseeded != shard_digests(out)


def test_strict_fails_without_manifest(tmp_path):
    root = tmp_path / "src"
    image_factory.write_image_folder(root, {"train": 4}, classes=("a", "b"))
    (root / "train" / "a" / "broken.jpg").write_bytes(image_factory.truncated_jpeg())
    out = tmp_path / "out"
    result = run_cli(root, out, "--strict", "--shorter-side", 8, *IN_PROCESS, expect_ok=False)
    assert result.exit_code != 0
    assert "--strict: 1 inputs rejected (truncated: 1)" in result.output
    assert not os.path.exists(out / "manifest.json")
    assert read_rejects(out)[0]["key"] == "train/a/broken.jpg"


def test_source_errors_are_clear(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli(empty, tmp_path / "out", *IN_PROCESS, expect_ok=False)
    assert result.exit_code != 0 and "no classes found" in result.output
    result = run_cli(f"tfrecord:{tmp_path}/nothing-*", tmp_path / "out2", *IN_PROCESS, expect_ok=False)
    assert result.exit_code != 0 and "no files match" in result.output


def test_nested_folders_and_special_files_are_inputs_too(tmp_path):
    """Nothing in a class folder vanishes unseen: nested images belong to the class, a pipe is a reject."""
    root = tmp_path / "src"
    image_factory.write_image_folder(root, {"train": 4}, classes=("a", "b"))
    (root / "train" / "a" / "more").mkdir()
    (root / "train" / "a" / "more" / "nested.png").write_bytes(image_factory.tiny_png())
    os.mkfifo(root / "train" / "b" / "pipe.jpg")
    out = tmp_path / "out"
    run_cli(root, out, "--shorter-side", 8, *IN_PROCESS)
    info = manifest_lib.read_document(str(out))["splits"]["train"]
    assert (info["num_inputs"], info["num_examples"], info["num_rejected"]) == (6, 5, 1)
    assert "train/a/more/nested.png" in {r.filename for r in all_records(out, "train")}
    assert [(r["key"], r["reason"]) for r in read_rejects(out)] == [("train/b/pipe.jpg", "unreadable")]


def _run_in_process(source, output, min_decode_groups: int, **options) -> tuple[dict, int]:
    """(manifest, shards renamed from decode groups) of an in-process run with the given decode-group floor."""
    from apache_beam.metrics.metric import MetricsFilter

    from shardprep.pipelines.runtime import runner as runners

    config = job.PreprocessConfig(source=str(source), output=str(output), shorter_side=16, **options)
    pipeline = runners.make_pipeline(IN_PROCESS[1:])
    job.prepare_output(config.output, overwrite=False)
    job.build_pipeline(pipeline, config, job.plan_source(config), min_decode_groups=min_decode_groups)
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("shards_renamed_from_decode_groups"))["counters"]
    return manifest_lib.read_document(config.output), sum(c.committed for c in counters)


def _shard_hashes(manifest: dict) -> dict:
    return {split: [shard["sha256"] for shard in info["shards"]] for split, info in manifest["splits"].items()}


def test_shards_that_are_whole_decode_groups_are_renamed_and_equal_copied_ones(tmp_path):
    """Decoded in as many groups as shards, a split without rejects is written once: each group's file, already in
    seeded order and hashed, becomes its shard (validation here). In a split where a reject moves every later
    boundary (train: its first input in the seeded order is not an image), every shard is copied from its groups.
    Cut into more groups than shards, every shard of both splits is copied; all give the same bytes."""
    source = tmp_path / "source"
    image_factory.write_image_folder(source, {"train": 24, "validation": 13}, min_side=20, max_side=40)
    train_keys = [os.path.relpath(path, source) for path in glob.glob(str(source / "train" / "*" / "*"))]
    first = min(train_keys, key=lambda key: sharding.sort_key(0, "train", key))
    with open(source / first, "wb") as f:
        f.write(b"not an image")
    once, renamed = _run_in_process(source, tmp_path / "once", min_decode_groups=4, num_shards=4)
    copied, renamed_when_cut = _run_in_process(source, tmp_path / "copied", min_decode_groups=12, num_shards=4)
    assert (renamed, renamed_when_cut) == (4, 0)  # validation's 4 shards; train's, whose boundaries moved, copied
    assert _shard_hashes(once) == _shard_hashes(copied)
    for split in ("train", "validation"):
        for shard in Manifest.from_json(once).shard_files(split):
            with open(tmp_path / "once" / shard, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() in _shard_hashes(once)[split]
    assert not glob.glob(str(tmp_path / "once" / ".tmp" / "*")), "no decode-group file is left behind"
    assert once["splits"]["train"]["num_rejected"] == 1
    sizes = [s["num_examples"] for s in once["splits"]["train"]["shards"]]
    assert sum(sizes) == 23 and max(sizes) - min(sizes) <= 1
    for out, manifest in (("once", once), ("copied", copied)):
        assert_fixed_layout(tmp_path / out, manifest)
