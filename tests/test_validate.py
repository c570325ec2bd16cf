"""``shardprep validate`` end to end: datasets built by the real preprocess job, then damaged one way at a time.

Most runs use Beam's FnApiRunner in-process (one worker) to stay fast; the CLI test runs the default local mode
(one worker process per core).
"""

from __future__ import annotations

import json
import os
import shutil

import image_factory
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import validate_helpers as helpers
from shardprep.pipelines.validate_job import driver as validate
from shardprep.pipelines.validate_job.options import ValidateOptions, default
from shardprep.pipelines.validate_job import pictures
from shardprep.pipelines.validate_job import report as report_lib
from shardprep.pipelines.validate_job.checks import rejects_problems, sample_rank

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def run_validate(data, progress=None, **options) -> dict:
    return validate.run(ValidateOptions(str(data), **options), IN_PROCESS, progress=progress or (lambda *_: None))


def problems_of(report: dict, check: str) -> list[dict]:
    return [found for found in report["problems"] if found["check"] == check]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A prepared dataset: 3 classes, 6 train and 2 validation images each (every image format in turn), 32x32 raw,
    2 shards per split."""
    root = tmp_path_factory.mktemp("clean")
    image_factory.write_image_folder(root / "source", {"train": 18, "validation": 6})
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


@pytest.fixture
def dataset(clean, tmp_path):
    """A private copy of the clean dataset, to damage."""
    return helpers.copy_dataset(clean, tmp_path / "data")


def test_untouched_dataset_passes_with_report_and_pictures_in_default_multiprocess_mode(clean, tmp_path):
    from shardprep.cli import main

    report_path, pictures_dir = tmp_path / "report.json", tmp_path / "pictures"
    result = CliRunner().invoke(main, ["validate", str(clean), "--json", str(report_path), "--pictures",
                                       str(pictures_dir), "--samples-per-class", "4", "--quiet"])

    assert result.exit_code == 0, result.output
    assert "OK: every check passed" in result.output
    report = json.loads(report_path.read_text())
    manifest = helpers.load_manifest(clean)
    assert report["ok"] is True and report["problems"] == [] and report["problem_counts"] == {}
    for split, info in manifest["splits"].items():
        assert report["splits"][split]["num_examples"] == info["num_examples"]
        assert report["splits"][split]["class_counts"] == info["class_counts"]
        assert report["splits"][split]["num_shards"] == info["num_shards"]
    assert report["mean_std_tolerance"] == 0.05
    np.testing.assert_allclose(report["mean_rgb"], manifest["mean_rgb"], atol=1e-5)
    np.testing.assert_allclose(report["std_rgb"], manifest["std_rgb"], atol=1e-5)

    # Contact sheet: 3 class rows of 4 cells of 32 px, each image pixel for pixel as stored.
    with Image.open(pictures_dir / pictures.CONTACT_SHEET_NAME) as sheet:
        assert sheet.size == (pictures.LABEL_WIDTH + pictures.PAD + 4 * (32 + pictures.PAD),
                              pictures.PAD + 3 * (32 + pictures.PAD))
        sheet_pixels = np.asarray(sheet.convert("RGB"))
    train = [record for shard in sorted((clean / "train").glob("*.tfrecord")) for record in helpers.read_shard(shard)]
    for label in range(3):
        first = min((r for r in train if r.label == label), key=lambda r: sample_rank(r.filename))
        x, y = pictures.cell_origin(label, 0, 32)
        np.testing.assert_array_equal(sheet_pixels[y:y + 32, x:x + 32],
                                      np.frombuffer(first.encoded, np.uint8).reshape(32, 32, 3))
    with Image.open(pictures_dir / pictures.CLASS_COUNTS_NAME) as chart:
        assert chart.size == pictures.class_chart_size(3)
        chart.load()


def test_flipped_byte_inside_a_record_names_shard_and_record(dataset):
    shard = "train/train-00000-of-00002.tfrecord"
    helpers.flip_byte_in_record(dataset / shard, 3)

    report = run_validate(dataset)

    assert report["ok"] is False
    [corrupt] = problems_of(report, "record_corrupt")
    assert (corrupt["file"], corrupt["index"]) == (shard, 3)
    assert [p["file"] for p in problems_of(report, "shard_sha256")] == [shard]
    # The framing survives a data-CRC error, so the records after it are still read and counted.
    assert problems_of(report, "shard_count") == []
    assert report["splits"]["train"]["num_examples"] == helpers.load_manifest(dataset)["splits"]["train"][
        "num_examples"] - 1


def test_truncated_shard_names_shard_and_record(dataset):
    shard = "validation/validation-00001-of-00002.tfrecord"
    helpers.truncate_inside_record(dataset / shard, 1)

    report = run_validate(dataset)

    assert report["ok"] is False
    [corrupt] = problems_of(report, "record_corrupt")
    assert (corrupt["file"], corrupt["index"]) == (shard, 1)
    for check in ("shard_count", "shard_size", "shard_sha256"):
        assert [p["file"] for p in problems_of(report, check)] == [shard], check


def test_deleted_shard_is_missing_and_progress_counts_the_shards_read(dataset):
    shard = "validation/validation-00000-of-00002.tfrecord"
    (dataset / shard).unlink()
    updates = []

    report = run_validate(dataset, progress=updates.append)

    assert report["ok"] is False
    assert [p["file"] for p in problems_of(report, "shard_missing")] == [shard]
    [split_count] = problems_of(report, "split_count")
    assert split_count["split"] == "validation"
    last = updates[-1]  # a typed event (StageProgress)
    assert (last.done, last.total, last.records) == (3, 3, report["num_examples"])


def test_extra_shard_is_unlisted(dataset):
    extra = "train/train-00002-of-00002.tfrecord"
    shutil.copy(dataset / "train/train-00000-of-00002.tfrecord", dataset / extra)

    report = run_validate(dataset)

    assert report["ok"] is False
    assert [p["file"] for p in problems_of(report, "shard_unlisted")] == [extra]
    assert set(report["problem_counts"]) == {"shard_unlisted"}


def test_edited_shard_count_in_manifest_names_the_shard(dataset):
    shard = "train/train-00001-of-00002.tfrecord"
    manifest = helpers.load_manifest(dataset)
    [entry] = [e for e in manifest["splits"]["train"]["shards"] if e["file"] == shard]
    entry["num_examples"] += 1
    helpers.save_manifest(dataset, manifest)

    report = run_validate(dataset)

    assert report["ok"] is False
    [count] = problems_of(report, "shard_count")
    assert count["file"] == shard and count["num_records"] == entry["num_examples"] - 1
    assert problems_of(report, "manifest_inconsistent")  # the split total no longer adds up either


def test_edited_class_count_in_manifest_names_split_and_class(dataset):
    manifest = helpers.load_manifest(dataset)
    manifest["splits"]["train"]["class_counts"]["green"] -= 1
    manifest["splits"]["train"]["num_examples"] -= 1
    helpers.save_manifest(dataset, manifest)

    report = run_validate(dataset)

    assert report["ok"] is False
    [class_count] = problems_of(report, "class_count")
    assert (class_count["split"], class_count["class_name"], class_count["count"],
            class_count["expected_count"]) == ("train", "green", 6, 5)
    assert [p["split"] for p in problems_of(report, "split_count")] == ["train"]


def test_class_names_swapped_in_the_manifest_are_caught_by_the_records_folders(dataset):
    # Hashes, counts and statistics all still match (classes are balanced): only the records' source paths
    # (train/red/...) say that label 0 is no longer the class the manifest names.
    manifest = helpers.load_manifest(dataset)
    first, second = manifest["classes"][:2]
    manifest["classes"][:2] = second, first
    helpers.save_manifest(dataset, manifest)

    report = run_validate(dataset)

    assert report["ok"] is False
    found = problems_of(report, "record_class")
    assert {p["split"] for p in found} == {"train", "validation"}
    assert {p["message"] for p in found} == {f"in class folder {first!r}, but label 0 is {second!r} in the manifest",
                                             f"in class folder {second!r}, but label 1 is {first!r} in the manifest"}
    assert report["problem_counts"]["record_class"] == 16  # 6 + 2 images of each of the two classes


def test_a_class_renamed_in_the_manifest_is_not_a_record_class_problem(dataset):
    manifest = helpers.load_manifest(dataset)
    manifest["classes"][0] = "crimson"  # a name no folder has: a person's relabelling, not a lie
    for info in manifest["splits"].values():
        info["class_counts"]["crimson"] = info["class_counts"].pop("red")
    helpers.save_manifest(dataset, manifest)

    assert problems_of(run_validate(dataset), "record_class") == []


def test_manifest_mean_off_by_more_than_the_tolerance_fails_and_std_within_it_passes(dataset):
    manifest = helpers.load_manifest(dataset)
    manifest["mean_rgb"][2] += 0.06
    manifest["std_rgb"][0] -= 0.04
    helpers.save_manifest(dataset, manifest)

    report = run_validate(dataset)

    assert set(report["problem_counts"]) == {"mean_rgb"}
    [mean] = problems_of(report, "mean_rgb")
    assert mean["split"] == "train" and mean["tolerance"] == 0.05


def test_image_in_train_and_validation_is_leakage_with_both_keys(tmp_path):
    written = image_factory.write_image_folder(tmp_path / "source", {"train": 9, "validation": 3})
    original = next(image for image in written if image.split == "train" and image.path.endswith(".png"))
    copy = tmp_path / "source" / "validation" / original.class_name / "copy.png"
    shutil.copy(original.path, copy)
    helpers.preprocess(tmp_path / "source", tmp_path / "data")
    keys = [r.filename for s in sorted((tmp_path / "data").glob("*/*.tfrecord")) for r in helpers.read_shard(s)]
    [train_key] = [key for key in keys if key.endswith(original.path.rsplit("/", 1)[-1])]
    [validation_key] = [key for key in keys if key.endswith("copy.png")]

    report = run_validate(tmp_path / "data")

    assert report["ok"] is False
    assert set(report["problem_counts"]) == {"leakage"}
    [leak] = problems_of(report, "leakage")
    assert leak["keys"] == [train_key, validation_key]
    assert (leak["file"], leak["index"]) == helpers.locate(tmp_path / "data", validation_key)
    assert [(o["file"], o["index"]) for o in leak["occurrences"]] == [
        helpers.locate(tmp_path / "data", train_key), helpers.locate(tmp_path / "data", validation_key)]


def test_label_out_of_range_and_duplicate_filename_name_their_records(dataset):
    shard = "train/train-00000-of-00002.tfrecord"
    import dataclasses

    def damage(records):
        records[2] = dataclasses.replace(records[2], label=99)
        records[5] = dataclasses.replace(records[5], filename=records[0].filename)
        return records

    helpers.rewrite_shard(dataset, shard, damage)

    report = run_validate(dataset)

    [label] = problems_of(report, "record_label")
    assert (label["file"], label["index"]) == (shard, 2)
    [duplicate] = problems_of(report, "filename_duplicate")
    assert (duplicate["file"], duplicate["index"], duplicate["num_occurrences"]) == (shard, 5, 2)
    assert [(o["file"], o["index"]) for o in duplicate["occurrences"]] == [(shard, 0), (shard, 5)]
    assert report["splits"]["train"]["out_of_range_labels"] == {"99": 1}
    assert problems_of(report, "shard_sha256") == []  # the helper kept the manifest's shard entry true


def test_records_out_of_the_fixed_layout_name_their_shard_and_records(dataset):
    # The same records as plain Examples (lengths vary with the filename, no padding): sound TFRecords, CRCs and
    # sha256 right, but not where the train reader looks for them.
    shard = "validation/validation-00001-of-00002.tfrecord"
    helpers.rewrite_shard(dataset, shard, lambda records: records, keep_layout=False)

    report = run_validate(dataset)

    assert not report["ok"]
    found = problems_of(report, "record_layout")
    assert found and {p["file"] for p in found} == {shard}
    num_records = helpers.load_manifest(dataset)["splits"]["validation"]["shards"][1]["num_examples"]
    assert {p["index"] for p in found} == set(range(num_records))  # every record is shorter, pixels misplaced
    assert problems_of(report, "shard_sha256") == [] and problems_of(report, "record_corrupt") == []


def test_jpeg_uncropped_dataset_passes_within_jpeg_tolerance(tmp_path):
    image_factory.write_image_folder(tmp_path / "source", {"train": 6, "validation": 3})
    helpers.preprocess(tmp_path / "source", tmp_path / "data", "--encoding", "jpeg", "--crop", "none")

    report = run_validate(tmp_path / "data", pictures=str(tmp_path / "pictures"))

    assert report["ok"] is True, report["problems"]
    assert report["mean_std_tolerance"] == 1.0
    sizes = report["splits"]["train"]["image_sizes"]
    assert sizes["num_distinct"] > 1 and min(sizes["min_height"], sizes["min_width"]) == 32
    # Every train image is a sample here (2 per class); the cell fits the longest side of any of them.
    cell = max(sizes["max_height"], sizes["max_width"])
    with Image.open(tmp_path / "pictures" / pictures.CONTACT_SHEET_NAME) as sheet:
        assert sheet.size == pictures.contact_sheet_size(3, default("samples_per_class"), cell)


def test_folder_without_manifest_is_reported_incomplete_without_crashing(dataset, tmp_path):
    from shardprep.cli import main

    (dataset / "manifest.json").unlink()
    leftovers = [".tmp/spill-0", "train/.tmp-5f3a-train-00001-of-00002.tfrecord"]
    for leftover in leftovers:
        (dataset / leftover).parent.mkdir(exist_ok=True)
        (dataset / leftover).write_bytes(b"partial")
    report_path = tmp_path / "report.json"

    result = CliRunner().invoke(main, ["validate", str(dataset), "--json", str(report_path), "--quiet"])

    assert result.exit_code == 1, result.output
    assert "dataset is incomplete" in result.output
    report = json.loads(report_path.read_text())
    [missing] = report["problems"]
    assert missing["check"] == "manifest_missing"
    assert set(leftovers) | {"train/train-00000-of-00002.tfrecord"} <= set(missing["found_files"])
    assert (missing["num_found_shards"], missing["num_found_temporary"]) == (4, 2)
    assert "4 shards, 2 temporary files" in missing["message"]
    one = report_lib.manifest_missing_problem(["train/train-00000-of-00001.tfrecord", "notes.txt"])["message"]
    assert "Found 2 files: 1 shard, 0 temporary files, 1 other;" in one  # was "1 shards", "1 others"


def jpeg(height: int, width: int, seed: int) -> bytes:
    return image_factory.encode(Image.fromarray(image_factory.smooth_photo(width, height, seed)), "JPEG")


def test_foreign_tfrecords_report_counts_labels_sizes_and_bad_records(tmp_path):
    def example(label, height, width, seed):
        return helpers.foreign_example({"image": jpeg(height, width, seed), "label": label})

    train_0 = tmp_path / "in/foo-train.tfrecord-00000-of-00002"
    train_1 = tmp_path / "in/foo-train.tfrecord-00001-of-00002"
    test_0 = tmp_path / "in/foo-test.tfrecord-00000-of-00001"
    helpers.write_foreign_tfrecord(train_0, [example(0, 20, 30, 1), example(1, 20, 30, 2), example(1, 25, 20, 3)])
    helpers.write_foreign_tfrecord(train_1, [
        example(0, 20, 30, 4),
        helpers.foreign_example({"image": b"not an image", "label": 2}),
        helpers.foreign_example({"image": jpeg(8, 8, 5)}),
        example(2, 20, 30, 6),
        example(2, 20, 30, 7),
    ])
    helpers.flip_byte_in_record(train_1, 3)
    helpers.write_foreign_tfrecord(test_0, [example(0, 16, 16, 8)])

    report = run_validate(f"tfrecord:{tmp_path}/in/*.tfrecord-*")

    assert report["ok"] is False and report["kind"] == "tfrecord" and report["num_files"] == 3
    train = report["splits"]["train"]
    assert train["num_examples"] == 8 and train["num_readable_images"] == 6
    assert train["file_records"] == {str(train_0): 3, str(train_1): 5}
    assert train["label_counts"] == {"0": 2, "1": 2, "2": 2}  # the corrupt record's label is unknown
    assert train["image_sizes"]["most_common"] == {"20x30": 4, "25x20": 1, "8x8": 1}
    assert train["image_formats"] == {"JPEG": 6}
    assert report["splits"]["test"]["label_counts"] == {"0": 1}
    found = {(p["check"], p["file"], p["index"]) for p in report["problems"]}
    assert found == {("image_decode", str(train_1), 1), ("label_missing", str(train_1), 2),
                     ("record_corrupt", str(train_1), 3)}


def test_foreign_tfrecords_with_other_keys_pass_and_chart_is_written(tmp_path):
    records = [helpers.foreign_example({"jpeg": jpeg(12, 10, i), "class": i % 2}) for i in range(4)]
    helpers.write_foreign_tfrecord(tmp_path / "records.tfrecord", records)

    report = run_validate(f"tfrecord:{tmp_path}/*.tfrecord", image_key="jpeg", label_key="class",
                          pictures=str(tmp_path / "pictures"))

    assert report["ok"] is True, report["problems"]
    assert report["splits"]["all"]["label_counts"] == {"0": 2, "1": 2}
    assert set(report["pictures"]) == {"class_counts"}
    with Image.open(tmp_path / "pictures" / pictures.CLASS_COUNTS_NAME) as chart:
        assert chart.size == pictures.class_chart_size(2)


def test_tfrecord_pattern_matching_nothing_fails(tmp_path):
    report = run_validate(f"tfrecord:{tmp_path}/*.tfrecord")

    assert report["ok"] is False
    assert [p["check"] for p in report["problems"]] == ["no_files"]


def test_foreign_tfrecords_show_the_class_names_beside_them(tmp_path):
    """`validate tfrecord:` names classes as preprocess would: from the label.labels.txt TFDS writes beside its files."""
    records = [helpers.foreign_example({"image": jpeg(12, 10, i), "label": i % 2}) for i in range(4)]
    helpers.write_foreign_tfrecord(tmp_path / "cats-train.tfrecord-00000-of-00001", records)
    (tmp_path / "label.labels.txt").write_text("tabby\nsiamese\n")
    report = run_validate(f"tfrecord:{tmp_path}/*.tfrecord-*")
    assert report["ok"] is True, report["problems"]
    assert report["classes"] == ["tabby", "siamese"]
    assert report_lib.chart_counts(report) == (["tabby", "siamese"], {"train": [2, 2]})
    (tmp_path / "label.labels.txt").write_text("tabby\n../escape\n")
    report = run_validate(f"tfrecord:{tmp_path}/*.tfrecord-*")
    assert "classes" not in report and [p["check"] for p in report["problems"]] == ["class_names"]


@pytest.mark.parametrize("name", ["café", "Ærø", "Жук"])
def test_class_names_beyond_ascii_are_drawn_not_boxed(name):
    """A letter the labels' font lacks is drawn as the same empty box as any missing glyph (a private-use character):
    the sheets' font draws Latin and Cyrillic letters."""
    def drawn(text: str) -> bytes:
        return pictures.contact_sheet([(text, [])], 1).tobytes()

    missing = "\ue000"
    assert drawn(name[:-1] + missing) != drawn(name)
    sheet = pictures.near_duplicate_sheet([], lambda file, index: None, name)
    assert sheet.tobytes() != pictures.near_duplicate_sheet([], lambda file, index: None, name[:-1] + missing).tobytes()


def test_rejects_file_must_list_the_rejects_the_manifest_counts(dataset):
    """rejects.jsonl is part of the dataset's accounting: missing, garbled, or listing other rejects (by split and
    reason) than the manifest counts, it is a ``rejects_file`` problem; a line that matches an edited count is not."""
    rejects = dataset / "rejects.jsonl"
    assert rejects.read_text() == "" and problems_of(run_validate(dataset), "rejects_file") == []
    rejects.unlink()  # none counted, none lost
    assert problems_of(run_validate(dataset), "rejects_file") == []
    line = json.dumps({"key": "train/red/x.png", "split": "train", "reason": "empty_file", "detail": "zero bytes"})
    rejects.write_text(line + "\n")
    [found] = problems_of(run_validate(dataset), "rejects_file")
    assert (found["split"], found["message"]) == (
        "train", "rejects.jsonl lists 1 reject (empty_file 1), the manifest counts none")
    manifest = helpers.load_manifest(dataset)
    manifest["splits"]["train"]["rejected_by_reason"] = {"empty_file": 1}
    helpers.save_manifest(dataset, manifest)
    assert problems_of(run_validate(dataset), "rejects_file") == []
    document = helpers.load_manifest(dataset)  # a garbled line: the check alone (the run reads the file as is)
    for hostile in (b"{not json", b"[" * 100_000, b"\xff\xfe", b'{"split": ["train"], "reason": 1}', b"null", b"[]"):
        assert [p["message"] for p in rejects_problems(document, line.encode() + b"\n" + hostile + b"\n")] == [
            "rejects.jsonl line 2 is not a reject (a JSON object with a split and a reason)"]
    rejects.unlink()
    report = run_validate(dataset)
    assert [p["message"] for p in problems_of(report, "rejects_file")] == [
        "rejects.jsonl is missing; the manifest counts 1 rejected input"] and report["ok"] is False
    older = {key: value for key, value in manifest.items() if key != "rejects_file"}
    helpers.save_manifest(dataset, older)  # a manifest that names no rejects file: nothing to compare
    assert problems_of(run_validate(dataset), "rejects_file") == []
    helpers.save_manifest(dataset, manifest)
    os.mkfifo(rejects)  # never waited on
    assert [p["message"] for p in problems_of(run_validate(dataset), "rejects_file")] == [
        "cannot read rejects.jsonl: it is a FIFO (named pipe), not a regular file"]
    rejects.unlink()
    rejects.mkdir()
    assert [p["message"] for p in problems_of(run_validate(dataset), "rejects_file")] == [
        "cannot read rejects.jsonl: it is a folder, not a regular file"]
