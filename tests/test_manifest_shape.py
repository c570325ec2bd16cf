"""The manifest's shape check (preprocess/format/dataset.py): what every manifest the writer produces passes, and
the damaged ones it must report (path in the document + what is wrong), never crash on."""

from __future__ import annotations

import copy

import image_factory
import pytest

import validate_helpers as helpers
from shardprep.preprocess.format.dataset import shape_problems
from shardprep.preprocess.format.manifest_schema import unsafe_relative_path
from train_helpers import random_images, write_dataset


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("good"), {"train": random_images(4, 8, 8), "validation":
                         random_images(2, 8, 8, seed=1)}, classes=["a", "b"])


def test_manifests_the_real_preprocess_job_writes_pass(tmp_path):
    image_factory.write_image_folder(tmp_path / "source", {"train": 6, "validation": 3})
    assert shape_problems(helpers.preprocess(tmp_path / "source", tmp_path / "raw")) == []
    assert shape_problems(helpers.preprocess(tmp_path / "source", tmp_path / "jpeg", "--encoding", "jpeg",
                                             "--crop", "none")) == []


@pytest.mark.parametrize("options", [dict(encoding="jpeg"), dict(encoding="raw", crop="none"),
                                     dict(fixed_layout=True)])
def test_hand_written_manifests_pass(tmp_path, options):
    manifest = write_dataset(tmp_path, {"train": random_images(3, 8, 8)}, classes=["a", "b"], **options)
    assert shape_problems(manifest) == []


def damaged(manifest, change):
    manifest = copy.deepcopy(manifest)
    change(manifest)
    return shape_problems(manifest)


CASES = {
    "record_layout removed": (lambda m: m["splits"]["train"].pop("record_layout"),
                              "splits.train.record_layout: missing"),
    "record_layout a list": (lambda m: m["splits"]["train"].update(record_layout=[1, 2, 3]),
                             "splits.train.record_layout: must be an object"),
    "record_bytes a string": (lambda m: m["splits"]["train"]["record_layout"].update(record_bytes="100"),
                              "splits.train.record_layout.record_bytes: must be an integer"),
    "label_offset missing": (lambda m: m["splits"]["train"]["record_layout"].pop("label_offset"),
                             "splits.train.record_layout.label_offset: missing"),
    "num_examples a string": (lambda m: m["splits"]["train"].update(num_examples="4"),
                              "splits.train.num_examples: must be an integer, is a string"),
    "num_examples negative": (lambda m: m["splits"]["train"].update(num_examples=-1),
                              "splits.train.num_examples: must be at least 0, is -1"),
    "num_rejected a float": (lambda m: m["splits"]["train"].update(num_rejected=1.5),
                             "splits.train.num_rejected: must be an integer"),
    "classes a string": (lambda m: m.update(classes="ab"), "classes: must be a list of class names, is a string"),
    "classes of ints": (lambda m: m.update(classes=[0, 1]), "classes[0]: must be a string"),
    "num_classes disagrees": (lambda m: m.update(num_classes=3), "num_classes: is 3 but classes lists 2"),
    "splits a list": (lambda m: m.update(splits=[{"train": {}}]), "splits: must be an object"),
    "split a list": (lambda m: m["splits"].update(train=[]), "splits.train: must be an object, is a list"),
    "class_counts a list": (lambda m: m["splits"]["train"].update(class_counts=[2, 2]),
                            "splits.train.class_counts: must be an object"),
    "shards a dict": (lambda m: m["splits"]["train"].update(shards={"file": "x"}),
                      "splits.train.shards: must be a list, is an object"),
    "shard a string": (lambda m: m["splits"]["train"].update(shards=["train/x.tfrecord"]),
                       "splits.train.shards[0]: must be an object, is a string"),
    "shard file missing": (lambda m: m["splits"]["train"]["shards"][0].pop("file"),
                           "splits.train.shards[0].file: missing"),
    "shard file absolute": (lambda m: m["splits"]["train"]["shards"][0].update(file="/etc/passwd"),
                            "splits.train.shards[0].file: '/etc/passwd' must be relative"),
    "shard file escapes": (lambda m: m["splits"]["train"]["shards"][0].update(file="../other/x.tfrecord"),
                           "contains '..'"),
    "shard bytes negative": (lambda m: m["splits"]["train"]["shards"][1].update(num_bytes=-5),
                             "splits.train.shards[1].num_bytes: must be at least 0"),
    "sha256 not hex": (lambda m: m["splits"]["train"]["shards"][0].update(sha256="xyz"),
                       "splits.train.shards[0].sha256: must be 64 lowercase hex digits"),
    "encoding unknown": (lambda m: m.update(encoding="webp2"), "encoding: must be one of raw, jpeg"),
    "crop unknown": (lambda m: m.update(crop="centre"), "crop: must be one of center, none"),
    "shorter_side zero": (lambda m: m.update(shorter_side=0), "shorter_side: must be at least 1"),
    "shorter_side a bool": (lambda m: m.update(shorter_side=True), "shorter_side: must be an integer, is a boolean"),
    "image_height null": (lambda m: m.update(image_height=None), "image_height: must be an integer for centre crops"),
    "shorter_side not the crop's": (lambda m: m.update(shorter_side=m["shorter_side"] + 1),
                                    "shorter_side: is 9 but the centre crops are 8x8"),
    "options a list": (lambda m: m.update(options=[1, 2]), "options: must be an object, is a list"),
    "mean_rgb two numbers": (lambda m: m.update(mean_rgb=[1, 2]), "mean_rgb: must be a list of 3 numbers or null"),
    "std_rgb a dict": (lambda m: m.update(std_rgb={"r": 1}), "std_rgb: must be a list of 3 numbers or null"),
    "splits missing": (lambda m: m.pop("splits"), "splits: missing"),
    "stats_split unknown": (lambda m: m.update(stats_split="nope"), "stats_split: 'nope' is not one of the splits"),
    "format_version a string": (lambda m: m.update(format_version="1"), "format_version: must be an integer"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_manifest_is_reported_with_its_path(good, case):
    change, expected = CASES[case]
    problems = damaged(good, change)
    assert any(expected in found for found in problems), problems


def test_not_an_object_and_null_layout_and_empty_split():
    assert shape_problems([1, 2]) == ["manifest: must be a JSON object, is a list ([1, 2])"]
    assert shape_problems({}) and all(p.endswith("missing") for p in shape_problems({}))


def test_empty_raw_split_needs_no_layout(good):
    def empty_validation(m):
        m["splits"]["validation"] = {"num_inputs": 0, "num_examples": 0, "num_rejected": 0, "class_counts": {},
                                     "num_shards": 1, "shards": [{"file": "validation/v.tfrecord", "num_examples": 0,
                                                                  "num_bytes": 0, "sha256": None}]}
    assert damaged(good, empty_validation) == []


@pytest.mark.parametrize("path, ok", [("train/a.tfrecord", True), ("a.tfrecord", True), ("", False),
                                      ("/abs/a", False), ("gs://b/a", False), ("a/../../b", False),
                                      ("..\\b", False), ("C:/x", False)])
def test_unsafe_relative_path(path, ok):
    assert (unsafe_relative_path(path) is None) is ok


def test_the_docs_table_is_the_schemas_rendering():
    from pathlib import Path

    from shardprep.preprocess.format.dataset import docs_table

    text = (Path(__file__).resolve().parent.parent / "docs" / "manifest.md").read_text()
    start = text.index("-->\n", text.index("<!-- schema:")) + len("-->\n")
    assert text[start:text.index("<!-- /schema -->")] == docs_table()


def test_the_typed_manifest_has_the_schemas_keys_in_order():
    import dataclasses

    from shardprep.preprocess.format.dataset import MANIFEST_KEYS, Manifest

    fields = [field.name for field in dataclasses.fields(Manifest) if field.name != "layout_problems"]
    assert fields == [key.name for key in MANIFEST_KEYS]
