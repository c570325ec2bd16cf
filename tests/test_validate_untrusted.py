"""``validate`` on shard files that are not what the manifest says they are: FIFOs, devices, files far larger than
listed, crafted record lengths. Each must end (no hang, no MemoryError) with a problem naming the file."""

from __future__ import annotations

import json
import os
import struct
import threading

import image_factory
import pytest

import validate_helpers as helpers
from shardprep.pipelines.validate_job import driver as validate
from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.preprocess.format import tfrecord_io

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
SHARD = "train/train-00000-of-00002.tfrecord"
TIMEOUT_S = 120


def validate_within_timeout(data, **options) -> dict:
    """validate.run in a thread that must finish within TIMEOUT_S (a hang fails the test instead of blocking it)."""
    outcome = {}

    def run():
        try:
            outcome["report"] = validate.run(ValidateOptions(str(data), **options), IN_PROCESS,
                                             progress=lambda *_: None)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever it was
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), f"validate did not finish within {TIMEOUT_S} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["report"]


def problems_of(report: dict, check: str) -> list[dict]:
    return [found for found in report["problems"] if found["check"] == check]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    image_factory.write_image_folder(root / "source", {"train": 8, "validation": 4}, classes=("a", "b"))
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


@pytest.fixture
def dataset(clean, tmp_path):
    return helpers.copy_dataset(clean, tmp_path / "data")


# One kind of file a shard: the dataset's four shards, each another kind, read in one run (each is checked on its own,
# by the same stat before the open; one validate run instead of four).
NOT_REGULAR = {"train/train-00000-of-00002.tfrecord": ("fifo", "is a FIFO (named pipe), not a regular file"),
               "train/train-00001-of-00002.tfrecord": ("dev_zero", "is a character device, not a regular file"),
               "validation/validation-00000-of-00002.tfrecord": ("folder", "is a folder, not a regular file"),
               "validation/validation-00001-of-00002.tfrecord": ("dangling_link", "No such file")}


def test_a_shard_that_is_not_a_regular_file_is_unreadable_without_hanging(dataset):
    for name, (kind, _) in NOT_REGULAR.items():
        shard = dataset / name
        shard.unlink()
        if kind == "fifo":
            os.mkfifo(shard)
        elif kind == "dev_zero":
            shard.symlink_to("/dev/zero")
        elif kind == "folder":
            shard.mkdir()
        else:
            shard.symlink_to(shard.parent / "gone.tfrecord")

    report = validate_within_timeout(dataset)

    assert report["ok"] is False
    unreadable = {found["file"]: found["message"] for found in problems_of(report, "shard_unreadable")}
    assert sorted(unreadable) == sorted(NOT_REGULAR) and len(problems_of(report, "shard_unreadable")) == 4
    for name, (kind, what) in NOT_REGULAR.items():
        assert what in unreadable[name], (kind, unreadable[name])


def test_a_shard_far_larger_than_the_manifest_says_is_read_only_as_far_as_the_manifest_says(dataset):
    shard = dataset / SHARD
    listed = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(1 << 40)  # a sparse terabyte: reading it would take hours

    report = validate_within_timeout(dataset)

    assert report["ok"] is False
    [size] = problems_of(report, "shard_size")
    assert size["file"] == SHARD
    assert size["message"] == (f"{1 << 40:,} bytes, manifest says {listed:,}: only the first {listed:,} bytes were "
                               "read")
    # The listed bytes are the original shard: its records and hash are those the manifest lists.
    assert problems_of(report, "shard_count") == [] and problems_of(report, "record_corrupt") == []


def test_a_crafted_record_length_is_a_corrupt_record_not_a_memory_error(dataset):
    shard = dataset / SHARD
    length = struct.pack("<Q", 1 << 40)  # a terabyte-long record, with a valid length checksum
    header = length + struct.pack("<I", tfrecord_io.masked_crc32c(length))
    data = shard.read_bytes()
    shard.write_bytes(header + data[len(header):])

    report = validate_within_timeout(dataset)

    assert report["ok"] is False
    [corrupt] = problems_of(report, "record_corrupt")
    assert (corrupt["file"], corrupt["index"]) == (SHARD, 0) and "truncated" in corrupt["message"]


def test_a_foreign_glob_matching_a_fifo_reports_it_without_hanging(tmp_path):
    records = tmp_path / "in"
    helpers.write_foreign_tfrecord(records / "x-train.tfrecord-00000-of-00002", [helpers.foreign_example(
        {"image": image_factory.encode(image_factory.solid((1, 2, 3)), "PNG"), "label": 0})])
    os.mkfifo(records / "x-train.tfrecord-00001-of-00002")

    report = validate_within_timeout(f"tfrecord:{records}/x-train.tfrecord-*")

    [unreadable] = problems_of(report, "shard_unreadable")
    assert unreadable["file"].endswith("x-train.tfrecord-00001-of-00002")
    assert "is a FIFO (named pipe), not a regular file" in unreadable["message"]
    assert report["splits"]["train"]["num_examples"] == 1


def test_a_json_report_path_that_is_a_fifo_is_refused_before_anything_runs(clean, tmp_path):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(validate.ValidateError, match=r"--json .*report\.json is a FIFO \(named pipe\), not a file"):
        validate_within_timeout(clean, json_path=str(fifo))


def test_validate_writes_nothing_inside_the_dataset_it_checks(dataset, tmp_path):
    """--json, --pictures and --leaked-keys inside DATA (its manifest, a shard, a new name there, through a link
    or ``..``) are refused before anything runs: the report must not replace the manifest it was read from."""
    link = tmp_path / "link.json"
    os.symlink(dataset / "manifest.json", link)
    files = {path: path.read_bytes() for path in dataset.rglob("*") if path.is_file()}
    inside = [dataset / "manifest.json", dataset / SHARD, dataset / "report.json", link,
              dataset / "train" / ".." / "report.json"]
    for given in inside:
        for flag, options in (("--json", {"json_path": str(given)}), ("--leaked-keys", {"leaked_keys": str(given)})):
            with pytest.raises(validate.ValidateError, match=f"{flag} .* is inside the dataset"):
                validate_within_timeout(dataset, **options)
    for given in (dataset, dataset / "train", dataset / "pictures"):
        with pytest.raises(validate.ValidateError, match="--pictures .* is inside the dataset"):
            validate_within_timeout(dataset, pictures=str(given))
    assert {path: path.read_bytes() for path in dataset.rglob("*") if path.is_file()} == files


@pytest.mark.parametrize("options, named", [({"image_key": "jpeg"}, "--image-key"),
                                            ({"label_key": "y"}, "--label-key"),
                                            ({"tfds_data_dir": "/tmp"}, "--tfds-data-dir"),
                                            ({"samples_per_class": 3}, "--samples-per-class")])
def test_a_flag_that_does_not_apply_to_a_prepared_dataset_is_refused_by_name(clean, options, named):
    """Options validate cannot honour on this DATA are refused by name, never ignored (the checklist's rule)."""
    with pytest.raises(validate.ValidateError, match=f"{named} does not apply"):
        validate_within_timeout(clean, **options)


def test_flags_that_do_not_apply_to_tfrecord_input_are_refused_by_name(tmp_path):
    data = f"tfrecord:{tmp_path}/*.tfrecord"
    for options, named in (({"tfds_data_dir": "/tmp"}, "--tfds-data-dir"),
                           ({"samples_per_class": 3, "pictures": str(tmp_path)}, "--samples-per-class")):
        with pytest.raises(validate.ValidateError, match=f"{named} does not apply"):
            validate_within_timeout(data, **options)


def test_validate_never_writes_through_a_link_or_into_a_hard_link_of_a_dataset_file(dataset, tmp_path):
    """A picture name that is a link into DATA, or a --json/--leaked-keys path that is a hard link to one of DATA's
    files: the file written replaces the name, so DATA's files stay as they were (they were overwritten)."""
    files = {path: path.read_bytes() for path in dataset.rglob("*") if path.is_file()}
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    os.symlink(dataset / "manifest.json", pictures / "class_counts.png")
    os.symlink(dataset / "rejects.jsonl", pictures / "contact_sheet.png")
    os.link(dataset / "manifest.json", tmp_path / "report.json")
    os.link(dataset / SHARD, tmp_path / "keys.txt")
    report = validate_within_timeout(dataset, pictures=str(pictures), json_path=str(tmp_path / "report.json"),
                                     leaked_keys=str(tmp_path / "keys.txt"))
    assert {path: path.read_bytes() for path in dataset.rglob("*") if path.is_file()} == files
    assert not (pictures / "class_counts.png").is_symlink()
    assert (pictures / "class_counts.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "report.json").read_text())["data"] == report["data"]
    assert os.stat(tmp_path / "keys.txt").st_nlink == 1


def test_a_pictures_folder_whose_picture_name_is_a_folder_is_refused_before_anything_runs(clean, tmp_path):
    """The rename into place would fail after the run, losing the --json report with it."""
    pictures = tmp_path / "pictures"
    (pictures / "contact_sheet.png").mkdir(parents=True)
    with pytest.raises(validate.ValidateError, match=r"--pictures .*contact_sheet\.png is a folder"):
        validate_within_timeout(clean, pictures=str(pictures), json_path=str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists() and os.listdir(pictures) == ["contact_sheet.png"]


def test_a_picture_that_cannot_be_written_still_leaves_the_json_report(clean, tmp_path, monkeypatch):
    """The error says the report is complete: --json must hold it, with the run's time."""
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(validate, "write_pictures", full_disk)
    with pytest.raises(validate.ReportWriteError, match="writing pictures to .* failed"):
        validate_within_timeout(clean, pictures=str(tmp_path), json_path=str(tmp_path / "r.json"))
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["ok"] is True and written["elapsed_seconds"] > 0


def test_a_json_report_never_replaces_a_file_a_tfrecord_glob_reads(tmp_path):
    shard = tmp_path / "in" / "x-train.tfrecord-00000-of-00001"
    helpers.write_foreign_tfrecord(shard, [helpers.foreign_example({"image": image_factory.rgb_jpeg(), "label": 0})])
    before = shard.read_bytes()
    with pytest.raises(validate.ValidateError, match="--json .* is a file that tfrecord:.* reads"):
        validate_within_timeout(f"tfrecord:{shard.parent}/*.tfrecord*", json_path=str(shard))
    assert shard.read_bytes() == before


@pytest.mark.parametrize("pattern, message", [("", "tfrecord: needs a glob of TFRecord files"),
                                              ("{folder}", "{folder} is a folder: give a glob of its files")])
def test_a_tfrecord_glob_that_is_empty_or_a_folder_says_so(tmp_path, pattern, message):
    folder = tmp_path / "records"
    folder.mkdir()
    pattern, message = pattern.format(folder=folder), message.format(folder=folder)
    if not pattern:
        with pytest.raises(validate.ValidateError, match=message):
            validate_within_timeout(f"tfrecord:{pattern}")
        return
    report = validate_within_timeout(f"tfrecord:{pattern}")
    [no_files] = problems_of(report, "no_files")
    assert message in no_files["message"] and problems_of(report, "shard_unreadable") == []
