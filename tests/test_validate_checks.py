"""The pure parts of validate: statistics, checks, record framing recovery, problem capping, pictures (no Beam run)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from shardprep.pipelines.validate_job import graph as validate_graph
from shardprep.pipelines.validate_job import pictures
from shardprep.pipelines.validate_job.checks import (classify_files, unfit_layout_problems,
                                                   layout_problems, manifest_problems, mean_std_problems, problem,
                                                   record_layout_length_problems, record_problems, split_problems)
from shardprep.pipelines.validate_job.read import MeasuredReader, iter_framed_records
from shardprep.pipelines.validate_job.report import merge_problems
from shardprep.pipelines.validate_job.checks import (SplitStats, channel_sums, foreign_split, sample_fraction,
                                                  sample_rank, size_summary)
from shardprep.preprocess.format import sharding
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.record_format import ImageRecord
from shardprep.preprocess.format.tfrecord_io import frame


def random_images(count: int, seed: int = 0, size=(5, 7)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(*size, 3), dtype=np.uint8) for _ in range(count)]


def stats_of(images, labels) -> SplitStats:
    stats = SplitStats()
    for image, label in zip(images, labels):
        stats.add_image(label, image.shape[0], image.shape[1], *channel_sums(image))
    return stats


def test_mean_std_from_exact_sums_equal_numpy_and_do_not_depend_on_how_work_was_split():
    images = random_images(10)
    labels = [i % 3 for i in range(10)]
    whole = stats_of(images, labels)
    parts = [stats_of(images[i:i + 3], labels[i:i + 3]) for i in (9, 0, 6, 3)]  # any order, uneven parts
    merged = SplitStats()
    for part in parts:
        merged.merge(part)

    wide = images[0].reshape(-1, 3).astype(np.int64)
    assert channel_sums(images[0]) == ([int(v) for v in wide.sum(axis=0)], [int(v) for v in (wide * wide).sum(axis=0)])
    pixels = np.concatenate([image.reshape(-1, 3) for image in images]).astype(np.float64)
    mean, std = whole.mean_std()
    # The preprocess job's own computation (one implementation), which the manifest stores to 6 decimals.
    assert (mean, std) == sharding.pixel_statistics((whole.num_pixels, *whole.channel_sums,
                                                     *whole.channel_square_sums))
    np.testing.assert_array_equal(mean, np.round(pixels.mean(axis=0), 6))
    np.testing.assert_array_equal(std, np.round(pixels.std(axis=0), 6))
    assert merged == whole
    assert whole.label_counts == {0: 4, 1: 3, 2: 3} and whole.image_sizes == {"5x7": 10}
    assert SplitStats().mean_std() is None


def _framed(records: list[bytes]) -> io.BytesIO:
    return io.BytesIO(b"".join(frame(record) for record in records))


def test_framed_records_resume_after_a_data_checksum_error():
    stream = _framed([b"zero", b"one!", b"two.", b"three"])
    data = bytearray(stream.getvalue())
    data[len(frame(b"zero")) + 12 + 1] ^= 0x01  # inside record 1's data
    reader = MeasuredReader(io.BytesIO(bytes(data)), hash_bytes=True)

    results = list(iter_framed_records(reader))

    assert [(index, record) for index, record, _ in results] == [(0, b"zero"), (1, None), (2, b"two."), (3, b"three")]
    assert "data checksum" in results[1][2]
    assert reader.num_bytes == len(data)


def test_framed_records_stop_at_a_bad_length_and_still_hash_the_whole_file():
    import hashlib

    data = bytearray(_framed([b"zero", b"one!", b"two."]).getvalue())
    data[len(frame(b"zero"))] ^= 0x01  # record 1's length field
    reader = MeasuredReader(io.BytesIO(bytes(data)), hash_bytes=True)

    results = list(iter_framed_records(reader))

    assert [(index, record) for index, record, _ in results] == [(0, b"zero"), (1, None)]
    assert "cannot be framed" in results[1][2]
    assert reader.sha256.hexdigest() == hashlib.sha256(bytes(data)).hexdigest()


MANIFEST = {
    "format_version": 1,
    "classes": ["cat", "dog"],
    "encoding": "raw",
    "crop": "center",
    "shorter_side": 4,
    "image_height": 4,
    "image_width": 4,
    "stats_split": "train",
    "mean_rgb": [100.0, 110.0, 120.0],
    "std_rgb": [50.0, 50.0, 50.0],
    "splits": {"train": {"num_examples": 3, "num_shards": 2, "class_counts": {"cat": 2, "dog": 1},
                         "shards": [{"file": "train/train-00000-of-00002.tfrecord", "num_examples": 2, "num_bytes": 200},
                                    {"file": "train/train-00001-of-00002.tfrecord", "num_examples": 1,
                                     "num_bytes": 100}]}},
}


def test_record_problems_against_manifest_options():
    expected = Manifest.from_json(MANIFEST, layouts_required=False)
    good = ImageRecord(b"", "raw", 4, 4, 1, "a.png")
    assert record_problems(good, expected) == []
    bad = ImageRecord(b"", "jpeg", 4, 5, 2, "a.png")
    assert [check for check, _ in record_problems(bad, expected)] == ["record_format", "record_size", "record_label"]
    uncropped = Manifest.from_json({**MANIFEST, "crop": "none", "image_height": None, "image_width": None})
    assert record_problems(ImageRecord(b"", "raw", 4, 9, 0, "a"), uncropped) == []
    assert [c for c, _ in record_problems(ImageRecord(b"", "raw", 5, 9, 0, "a"), uncropped)] == ["record_size"]


def test_shards_more_than_one_record_apart_are_not_uniform():
    stats = SplitStats(num_examples=3, label_counts={0: 2, 1: 1})
    stats.shard_records = {"train/a": 2, "train/b": 1}
    assert split_problems("train", stats, MANIFEST) == []
    stats.shard_records = {"train/a": 3, "train/b": 1, "train/c": 2}
    [uneven] = split_problems("train", stats, MANIFEST)[-1:]
    assert uneven["check"] == "shards_not_uniform"
    assert (uneven["file"], uneven["smallest_file"]) == ("train/a", "train/b")


def test_mean_std_within_tolerance_passes_and_outside_fails():
    images = [np.full((4, 4, 3), value, np.uint8) for value in (50, 150)]  # mean 100, std 50 per channel
    stats = stats_of(images, [0, 1])
    manifest = {**MANIFEST, "mean_rgb": [100.0, 100.04, 99.96], "std_rgb": [50.0, 50.0, 50.0]}
    assert mean_std_problems("train", stats, manifest, tolerance=0.05) == []
    manifest["mean_rgb"] = [100.0, 100.2, 100.0]
    [mean] = mean_std_problems("train", stats, manifest, tolerance=0.05)
    assert mean["check"] == "mean_rgb" and mean["tolerance"] == 0.05 and mean["split"] == "train"


def test_layout_problems_name_missing_and_unlisted_shards_only():
    found = ["manifest.json", "rejects.jsonl", "train/train-00000-of-00002.tfrecord",
             "train/train-00000-of-00002.tfrecord.bak", "validation/stray.tfrecord"]
    assert [(p["check"], p["file"]) for p in layout_problems(MANIFEST, found)] == [
        ("shard_missing", "train/train-00001-of-00002.tfrecord"), ("shard_unlisted", "validation/stray.tfrecord")]


def test_leftovers_of_an_interrupted_run_are_told_apart_from_shards():
    found = [".tmp/spill-1", "manifest.json", "train/.tmp-ab12-train-00000-of-00002.tfrecord",
             "train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord"]
    assert classify_files(found) == {
        "shards": ["train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord"],
        "temporary": [".tmp/spill-1", "train/.tmp-ab12-train-00000-of-00002.tfrecord"],
        "other": ["manifest.json"]}
    [unlisted] = [p for p in layout_problems(MANIFEST, found) if p["check"] == "shard_unlisted"]
    assert unlisted["file"] == "train/.tmp-ab12-train-00000-of-00002.tfrecord" and "temporary" in unlisted["message"]


def test_manifest_problems():
    assert manifest_problems(MANIFEST) == []
    inconsistent = {**MANIFEST, "splits": {"train": {**MANIFEST["splits"]["train"], "num_examples": 4}}}
    assert [p["check"] for p in manifest_problems(inconsistent)] == ["manifest_inconsistent"] * 2
    counted = {**MANIFEST, "splits": {"train": {**MANIFEST["splits"]["train"], "num_inputs": 4, "num_rejected": 1}}}
    assert manifest_problems({**counted, "num_examples": 3, "num_inputs": 4, "num_rejected": 1}) == []
    for key in ("num_examples", "num_rejected", "num_inputs"):  # the totals over the splits, where given
        [found] = manifest_problems({**counted, key: 10 ** 6})
        assert found["message"].startswith(f"{key} 1000000 but the splits' add up to ")


def test_problems_are_capped_per_check_but_all_counted():
    driver = [problem("shard_missing", "gone", file=f"train/{i}") for i in range(3)]
    results = {"problem": {"record_corrupt": [problem("record_corrupt", "bad", file="train/0", index=7)]},
               "problem_count": {"record_corrupt": 40}}

    kept, counts, truncated = merge_problems(driver, results, max_per_check=2)

    assert counts == {"record_corrupt": 40, "shard_missing": 3}
    assert [(p["check"], p["file"]) for p in kept] == [("record_corrupt", "train/0"), ("shard_missing", "train/0"),
                                                       ("shard_missing", "train/1")]
    assert truncated is True


def test_unknown_check_names_are_refused():
    with pytest.raises(ValueError):
        problem("looks_fine", "")


def test_sampling_is_deterministic_and_oversamples_the_smallest_class():
    assert sample_rank("train/cat/1.png") == sample_rank("train/cat/1.png")
    assert 0 <= sample_rank("x") < 1
    assert sample_fraction({"cat": 1000, "dog": 96}, 6) == pytest.approx(0.5)
    assert sample_fraction({"cat": 10}, 6) == 1.0
    assert sample_fraction({}, 6) == 1.0


def test_foreign_split_from_tfds_file_names():
    assert foreign_split("gs://b/imagenet2012/5.0.0/imagenet2012-train.tfrecord-00012-of-01024") == "train"
    assert foreign_split("/d/cifar10-test.tfrecord-00000-of-00001") == "test"
    assert foreign_split("/d/records.tfrecord") == "all"
    assert foreign_split("/out/validation/validation-00001-of-00004.tfrecord") == "validation"  # shardprep's own


def test_size_summary():
    summary = size_summary({"10x20": 3, "30x5": 1})
    assert (summary["min_height"], summary["max_height"], summary["min_width"], summary["max_width"]) == (10, 30, 5, 20)
    assert summary["mean_height"] == 15.0 and summary["most_common"] == {"10x20": 3, "30x5": 1}


def test_contact_sheet_grid_thumbnails_and_empty_cells():
    big = random_images(1, size=(300, 200))[0]
    small = pictures.thumbnail(big, cap=128)
    assert small.shape == (128, 85, 3)
    assert pictures.thumbnail(small, cap=128) is small

    rows = [("cat", [small, small]), ("a very long class name that cannot fit in the label column", [])]
    sheet = pictures.contact_sheet(rows, samples_per_class=3)

    assert sheet.size == pictures.contact_sheet_size(2, 3, 128) == (
        pictures.LABEL_WIDTH + pictures.PAD + 3 * 130, pictures.PAD + 2 * 130)
    pixels = np.asarray(sheet)
    x, y = pictures.cell_origin(0, 1, 128)
    np.testing.assert_array_equal(pixels[y:y + 128, x:x + 85], small)
    x, y = pictures.cell_origin(1, 0, 128)
    assert tuple(pixels[y + 5, x + 5]) == pictures.EMPTY_CELL


def test_class_chart_size_for_many_classes():
    chart = pictures.class_count_chart([str(i) for i in range(200)], {"train": list(range(200))}, "t")
    assert chart.size == pictures.class_chart_size(200) == (pictures.CHART_WIDTH, 600)


def test_help_states_the_tolerances_the_checks_use():
    from shardprep.preprocess.format import encodings
    from shardprep.commands import validate as command

    flat_help = " ".join(command.HELP.split())
    assert "within 0.05 (raw), " in flat_help or "within 0.05 (raw) or " in flat_help
    assert "1.0 (jpeg: lossy against the pre-encode pixels the manifest used)" in flat_help
    for encoding in encodings.REGISTERED:
        assert f"{encoding.mean_std_tolerance} ({encoding.name}" in flat_help
        assert validate_graph.mean_std_tolerance({"encoding": encoding.name}) == encoding.mean_std_tolerance
    assert validate_graph.mean_std_tolerance({"encoding": "webp2"}) == 1.0  # unknown: the loosest


def test_record_layout_lengths_allow_the_longer_record_only_at_the_shard_end():
    layout = FixedLayout.for_records(4, 4, (5, 9), max_label=3)
    data = layout.record_bytes - 16  # a record's data between its 12-byte header and 4-byte CRC
    assert record_layout_length_problems([data, data, data + layout.image_offset], layout) == []
    found = record_layout_length_problems([data + layout.image_offset, data, data], layout)
    assert [index for index, _ in found] == [0, 2]
    assert "shard's last record" in found[1][1]


def test_fixed_layouts_are_rebuilt_as_the_train_reader_does_and_an_unfit_one_is_a_problem():
    layout = FixedLayout.for_records(4, 4, (5, 9), max_label=1)
    document = {**MANIFEST, "splits": {"train": {**MANIFEST["splits"]["train"], "record_layout": layout.to_json()}}}
    manifest = Manifest.from_json(document, lenient_layouts=True)  # as validate loads it
    assert (manifest.fixed_layout_splits, unfit_layout_problems(manifest)) == ({"train": layout}, [])
    document["splits"]["train"]["record_layout"] = {**layout.to_json(), "image_offset": layout.image_offset + 1}
    manifest = Manifest.from_json(document, lenient_layouts=True)
    layouts, [unfit] = manifest.fixed_layout_splits, unfit_layout_problems(manifest)
    assert layouts == {} and (unfit["check"], unfit["split"]) == ("record_layout", "train")
    assert "does not fit 4x4 images" in unfit["message"]
