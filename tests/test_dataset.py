"""The typed manifest: real job outputs round-trip through ``Manifest`` key for key, in order, byte for byte."""

from __future__ import annotations

import copy
import json
import os

import image_factory
import pytest
from click.testing import CliRunner

from shardprep.cli import main as cli
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.dataset import Manifest, ShardEntry, SplitInfo, typed


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("typed-source")
    image_factory.write_image_folder(root, {"train": 8, "validation": 4}, seed=4, kinds=("png", "bmp"))
    with open(os.path.join(root, "train", "red", "notes.jpg"), "wb") as f:
        f.write(image_factory.text_file())
    return root


# The two shapes a manifest takes: raw centre crops (image size and a record layout per split), and the other
# encoding without a crop (no image size, no layout; several shards).
OPTIONS = {
    "raw-center": ["--shorter-side", "16"],
    "jpeg-none": ["--shorter-side", "12", "--crop", "none", "--num-shards", "2", "--encoding", "jpeg"],
}


@pytest.fixture(scope="module")
def outputs(source, tmp_path_factory):
    written = {}
    for name, options in OPTIONS.items():
        out = tmp_path_factory.mktemp("typed-out") / name
        result = CliRunner().invoke(cli, ["preprocess", str(source), str(out), "--quiet", *options, "--",
                                          "--direct_running_mode=in_memory"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        with open(out / manifest_lib.MANIFEST_NAME) as f:
            written[name] = f.read()
    return written


@pytest.mark.parametrize("name", list(OPTIONS))
def test_a_written_manifest_round_trips_key_for_key_and_byte_for_byte(outputs, name):
    document = json.loads(outputs[name])
    typed_manifest = Manifest.from_json(document)
    again = typed_manifest.to_json()
    assert again == document
    assert json.dumps(again) == json.dumps(document)  # same key order, same value types (1 vs 1.0)
    assert manifest_lib.document_text(again) == outputs[name]


def test_typed_fields(outputs):
    m = Manifest.from_json(json.loads(outputs["raw-center"]))
    assert m.classes and isinstance(m.classes, tuple) and m.num_classes == len(m.classes)
    assert m.stored_shape == (16, 16)
    train = m.split("train")
    assert isinstance(train, SplitInfo) and all(isinstance(s, ShardEntry) for s in train.shards)
    assert train.num_examples == sum(s.num_examples for s in train.shards) == 8
    assert train.num_rejected == 1 and train.rejected_by_reason == {"not_an_image": 1}
    assert isinstance(train.record_layout, FixedLayout) and (train.record_layout.height, train.record_layout.width) == (16, 16)
    assert m.shard_files("validation") == ["validation/validation-00000-of-00001.tfrecord"]
    assert set(m.fixed_layout_splits) == {"train", "validation"}
    assert typed(m) is m and typed(m.to_json()) == m
    none = Manifest.from_json(json.loads(outputs["jpeg-none"]))
    assert none.encoding == "jpeg" and none.image_height is None
    assert none.stored_shape == (12, 12) and none.split("train").record_layout is None
    assert none.split("train").num_shards == 2 and none.fixed_layout_splits == {}


def test_an_empty_split_round_trips_without_a_layout(outputs):
    document = json.loads(outputs["raw-center"])
    empty = document["splits"]["validation"]
    empty.update(num_inputs=0, num_examples=0, class_counts={k: 0 for k in empty["class_counts"]}, num_shards=1,
                 shards=[{"file": "validation/validation-00000-of-00001.tfrecord", "num_examples": 0,
                          "num_bytes": 0, "sha256": empty["shards"][0]["sha256"]}])
    del empty["record_layout"]
    m = Manifest.from_json(document)
    assert m.split("validation").record_layout is None
    assert json.dumps(m.to_json()) == json.dumps(document)


def test_an_unknown_split_names_the_splits(outputs):
    m = Manifest.from_json(json.loads(outputs["raw-center"]))
    with pytest.raises(KeyError, match="'test' not in dataset \\(splits: train, validation\\)"):
        m.split("test")


def test_a_malformed_manifest_lists_its_problems(outputs):
    document = json.loads(outputs["raw-center"])
    broken = copy.deepcopy(document)
    broken["splits"]["train"]["shards"][0]["num_examples"] = "8"
    del broken["crop"]
    with pytest.raises(manifest_lib.ManifestError, match="crop: missing.*num_examples: must be an integer"):
        Manifest.from_json(broken)
    unfit = copy.deepcopy(document)
    unfit["splits"]["train"]["record_layout"] = FixedLayout.for_records(4, 4, (5, 9), 3).to_json()
    with pytest.raises(manifest_lib.ManifestError, match="split 'train'.*does not fit 16x16 images"):
        Manifest.from_json(unfit)


def test_a_hand_made_manifest_with_only_the_required_keys_is_read():
    document = {"format_version": 1, "classes": ["a"], "encoding": "jpeg", "crop": "none", "shorter_side": 8,
                "splits": {"train": {"num_examples": 1, "class_counts": {"a": 1},
                                     "shards": [{"file": "train/x.tfrecord", "num_examples": 1, "num_bytes": 100}]}}}
    m = Manifest.from_json(document)
    assert m.num_classes == 1 and m.split("train").num_shards == 1 and m.split("train").shards[0].sha256 is None
    assert m.mean_rgb is None and m.stored_shape == (8, 8)


def test_preflight_refuses_a_layout_that_does_not_fit_before_tensorflow(outputs, tmp_path):
    from shardprep.train.run import preflight

    document = json.loads(outputs["raw-center"])
    document["splits"]["train"]["record_layout"] = FixedLayout.for_records(4, 4, (5, 9), 3).to_json()
    (tmp_path / manifest_lib.MANIFEST_NAME).write_text(manifest_lib.document_text(document))
    with pytest.raises(preflight.PreflightError, match="split 'train'.*does not fit 16x16 images"):
        preflight.check(str(tmp_path), "train", None)


def test_a_gs_manifest_without_the_gcp_extra_is_one_error_naming_the_extra(monkeypatch):
    """``load_manifest`` is also the library's loader (``make_dataset``, ``NumpyReader``): without the gcp extra a
    ``gs://`` DATA is a ManifestError saying what to install, not Beam's "no file system" from deep inside."""
    from shardprep.preprocess.checks import install_extras
    from shardprep.preprocess.format.dataset import load_manifest

    monkeypatch.setattr(install_extras, "gcp_installed", lambda: False)
    with pytest.raises(manifest_lib.ManifestError) as error:
        load_manifest("gs://bucket/shards")
    assert str(error.value).startswith("gs://bucket/shards/manifest.json needs shardprep's gcp extra")


def test_a_dataset_file_at_a_url_is_read_with_the_same_limit_and_words_as_a_local_one():
    """manifest.read_file: one reader for a dataset's files (manifest.json, rejects.jsonl), local or a URL."""
    def served(path, at_most):
        return {"gs://b/d/manifest.json": b"x" * at_most}.get(path)

    with pytest.raises(manifest_lib.ManifestError, match=r"^gs://b/d/manifest\.json is more than the 67,108,864 "
                                                         r"bytes allowed: a manifest is a small regular file$"):
        manifest_lib.read_document("gs://b/d", read_url=served)
    assert manifest_lib.read_file("gs://b/other/rejects.jsonl", 10, read_url=served) is None
