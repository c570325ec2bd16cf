"""The resize method a dataset was made with: recorded in the manifest as ``resize_method``; a manifest from before the
key (none recorded) was made by ``pillow-bicubic``, and every reader, validate and predict say and use so."""

from __future__ import annotations

import json
import shutil

import image_factory
import pytest

import validate_helpers as helpers
from shardprep.pipelines.validate_job import driver as validate
from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.preprocess.format import config
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.dataset import Manifest, ManifestShapeError, load_manifest
from shardprep.train.model import predict

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A dataset made by the job: 2 classes, 4 train images (PNG), 32x32 raw centre crops."""
    root = tmp_path_factory.mktemp("made")
    image_factory.write_image_folder(root / "source", {"train": 4}, kinds=("png",))
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


def with_manifest(made, tmp_path, change) -> str:
    """A copy of ``made`` whose manifest document is ``change(document)``."""
    data = tmp_path / "data"
    shutil.copytree(made, data)
    document = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps(change(document), indent=2))
    return str(data)


def without_key(document: dict) -> dict:
    document.pop("resize_method", None)
    return document


def test_manifest_without_the_key_reads_as_pillow_bicubic_and_keeps_its_keys(made, tmp_path):
    data = with_manifest(made, tmp_path, without_key)
    manifest = load_manifest(data)
    assert manifest.resize_method is None
    assert manifest.resize_method_used == resize.PILLOW_BICUBIC
    assert "resize_method" not in manifest.to_json()  # an old dataset's document round-trips key for key
    assert predict.process_options(manifest).resize_method == resize.PILLOW_BICUBIC


def test_recorded_method_is_read_and_written_back(made, tmp_path):
    data = with_manifest(made, tmp_path, lambda d: {**d, "resize_method": resize.LANCZOS2_CUBIC})
    manifest = load_manifest(data)
    assert manifest.resize_method_used == resize.LANCZOS2_CUBIC
    assert manifest.to_json()["resize_method"] == resize.LANCZOS2_CUBIC
    assert predict.process_options(manifest).resize_method == resize.LANCZOS2_CUBIC


@pytest.mark.parametrize("value", ["nearest", 3, ["lanczos2-cubic"]])
def test_unknown_method_is_a_shape_problem(made, value):
    document = {**load_manifest(made).to_json(), "resize_method": value}
    with pytest.raises(ManifestShapeError) as raised:
        Manifest.from_json(document)
    assert [p for p in raised.value.problems if p.startswith("resize_method: must be one of pillow-bicubic")]


def test_validate_reports_the_method_of_an_old_dataset(made, tmp_path):
    data = with_manifest(made, tmp_path, without_key)
    report = validate.run(ValidateOptions(data), IN_PROCESS, progress=lambda *_: None)
    assert report["ok"], report["problems"]
    assert report["resize_method"] == resize.PILLOW_BICUBIC


def test_recorded_is_none_only_for_the_method_without_key():
    assert resize.recorded(resize.PILLOW_BICUBIC) is None
    assert resize.recorded(resize.LANCZOS2_CUBIC) == resize.LANCZOS2_CUBIC
    assert resize.method_of({}) == resize.method_of({"resize_method": None}) == resize.PILLOW_BICUBIC


def test_the_job_records_its_method(made):
    document = json.loads((made / "manifest.json").read_text())
    assert document["resize_method"] == resize.LANCZOS2_CUBIC == config.DEFAULT_RESIZE_METHOD
    keys = list(document)
    assert keys.index("resize_method") == keys.index("crop") + 1


def test_resume_refuses_a_run_stopped_while_another_method_resized():
    # A run stopped by a version that resized with pillow-bicubic (its journal's options have no resize_method)
    # must not be finished with lanczos2-cubic: the dataset would mix the two.
    from shardprep.preprocess.format import fingerprint
    from shardprep.preprocess.format.config import PreprocessConfig

    now = fingerprint.fingerprinted_options(PreprocessConfig(source="s", output="o"), "")
    before = {name: value for name, value in now.items() if name != "resize_method"}
    assert fingerprint.options_difference(before, now) == (
        "the resize method was 'pillow-bicubic', is now 'lanczos2-cubic'")
    assert fingerprint.options_difference(now, dict(now)) is None
