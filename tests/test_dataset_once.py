"""The dataset module is where a prepared dataset's manifest is read and checked, and where the shard file name is
spelled: a train run and a validate run read and check manifest.json once, and every module that tells a shard's
name from another file's asks the one template."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.preprocess.format import dataset
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.checks import untrusted
from shardprep.preprocess.format.fixed_layout import FixedLayout

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def manifest_reads(monkeypatch):
    """Counts, while a test runs, the manifest.json documents parsed, their shape checks (every module's
    ``shape_problems``, however it was imported) and the fixed layouts rebuilt from ``record_layout``."""
    counts = {"parsed": 0, "shape_checked": 0, "layouts_rebuilt": 0}
    json_loads, shape_problems, layout_from_json = untrusted.json_loads, dataset.shape_problems, \
        FixedLayout.from_json.__func__

    def counting_json_loads(data, *, source, **kwargs):
        counts["parsed"] += str(source).endswith(manifest_lib.MANIFEST_NAME)
        return json_loads(data, source=source, **kwargs)

    def counting_shape_problems(*args, **kwargs):
        counts["shape_checked"] += 1
        return shape_problems(*args, **kwargs)

    counting_shape_problems.counts_calls = True  # a module imported while an earlier test counted holds one

    def counting_layout_from_json(cls, *args, **kwargs):
        counts["layouts_rebuilt"] += 1
        return layout_from_json(cls, *args, **kwargs)

    monkeypatch.setattr(untrusted, "json_loads", counting_json_loads)
    for name, module in list(sys.modules.items()):
        found = getattr(module, "shape_problems", None)
        if name.startswith("shardprep.") and (found is shape_problems or hasattr(found, "counts_calls")):
            monkeypatch.setattr(module, "shape_problems", counting_shape_problems)
    monkeypatch.setattr(FixedLayout, "from_json", classmethod(counting_layout_from_json))
    return counts


def test_a_train_run_reads_and_checks_the_manifest_once(colour_dataset, tmp_path, manifest_reads):
    # colour_dataset (conftest.py): raw centre crops, so each of its two splits has a fixed layout
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--epochs", "1", "--batch-size", "32", "--image-size", "16",
                                       "--width-multiplier", "0.125", "--no-tensorboard", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert manifest_reads == {"parsed": 1, "shape_checked": 1, "layouts_rebuilt": 2}  # train and validation


def test_a_validate_run_reads_and_checks_the_manifest_once(colour_dataset, manifest_reads):
    from shardprep.pipelines.validate_job import driver as validate

    report = validate.run(validate.ValidateOptions(colour_dataset), ["--direct_running_mode=in_memory",
                                                                    "--direct_num_workers=1"], progress=lambda *_: None)
    # The shards were read against the manifest (the helper writes no real sha256 or mean/std: those are said).
    assert set(report["problem_counts"]) <= {"mean_rgb", "std_rgb", "shard_sha256"}, report["problems"]
    assert manifest_reads == {"parsed": 1, "shape_checked": 1, "layouts_rebuilt": 2}


def test_the_dataset_module_offers_the_one_loader_and_the_one_shard_template():
    from shardprep.preprocess.format import dataset
    from shardprep.train.data import reader

    assert dataset.SHARD_FILES is manifest_lib.SHARD_FILES
    assert reader.load_manifest is dataset.load_manifest  # the README's import
    for module in ("train/run/preflight.py", "train/model/predict.py", "train/data/numpy_reader.py",
                   "pipelines/runtime/journal.py", "pipelines/validate_job/driver.py"):
        assert re.search(r"^def load_manifest\b", (REPO / module).read_text(), re.MULTILINE) is None, module


def test_the_shard_name_is_spelled_in_one_place():
    """No module spells ``<split>-00000-of-000NN`` as a pattern or a format of its own: ``SHARD_FILES`` does (TFDS's
    own file names, ``<name>-<split>.tfrecord-00000-of-000NN``, are another spelling: ``preprocess/sources``)."""
    spelled = [str(path.relative_to(REPO)) for folder in ("preprocess", "pipelines", "train", "shardprep")
               for path in sorted((REPO / folder).rglob("*.py"))
               if re.search(r"\\d\{5\}-of-|:05d\}-of-", path.read_text())]
    assert spelled == []
    assert manifest_lib.SHARD_FILES.path("val", 3, 12) == "val/val-00003-of-00012.tfrecord"
    assert manifest_lib.SHARD_FILES.parse_path("val/val-00003-of-00012.tfrecord") == ("val", 3, 12)


def test_every_module_that_recognises_shard_names_asks_the_one_template(monkeypatch):
    """With the template changed (six digits), what each module takes for a shard's name changes with it."""
    from shardprep.pipelines.runtime import storage
    from shardprep.pipelines.validate_job.checks import classify_files
    from shardprep.preprocess.checks import names

    monkeypatch.setattr(manifest_lib, "SHARD_FILES", manifest_lib.ShardFileTemplate(".tfrecord", digits=6))
    six, five = "train/train-000000-of-000002.tfrecord", "train/train-00000-of-00002.tfrecord"
    assert storage.deletable(six) and not storage.deletable(five)
    assert classify_files([six, five]) == {"temporary": [], "shards": [six], "other": [five]}
    assert manifest_lib._looks_like_output(six) and not manifest_lib._looks_like_output(five)
    assert "named like a shard file" in (names.problem(six.split("/")[1], "split") or "")
    assert names.problem(five.split("/")[1], "split") is None
