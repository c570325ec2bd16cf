"""Refusals of ``validate``, ``train`` and ``demo-data``: each is one clear line and exit 1, never a traceback, and
nothing is written outside the paths the command owns."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from train_helpers import random_images, write_dataset

IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "data"
    write_dataset(root, {"train": random_images(8, 8, 8), "validation": random_images(4, 8, 8, seed=1)},
                  classes=["a", "b"])
    return root


@pytest.fixture
def data(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "data")


def edit_manifest(data, change):
    path = data / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files + _)


def refused(args, *expected):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    for text in expected:
        assert text in lines[0], lines[0]
    return result


# ---- validate: the manifest's shape -------------------------------------------------------------------------

SHAPE_CASES = {
    "record_layout removed": (lambda m: m["splits"]["train"].pop("record_layout"), "record_layout: missing"),
    "num_examples a string": (lambda m: m["splits"]["train"].update(num_examples="8"), "num_examples"),
    "classes a string": (lambda m: m.update(classes="ab"), "classes: must be a list"),
    "classes a dict": (lambda m: m.update(classes={"a": 0}), "classes: must be a list"),
    "negative count": (lambda m: m["splits"]["validation"].update(num_examples=-4), "must be at least 0"),
    "shards a dict": (lambda m: m["splits"]["train"].update(shards={}), "shards: must be a list"),
    "splits missing": (lambda m: m.pop("splits"), "splits: missing"),
    "record_layout wrong types": (lambda m: m["splits"]["train"]["record_layout"].update(image_offset=[1]),
                                  "image_offset: must be an integer"),
    "shard outside the folder": (lambda m: m["splits"]["train"]["shards"][0].update(file="../../etc/passwd"),
                                 "contains '..'"),
}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_validate_reports_manifest_shape_problems_and_exits_1(data, tmp_path, case):
    change, expected = SHAPE_CASES[case]
    edit_manifest(data, change)
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["validate", str(data), "--json", str(report_path), "--quiet", *IN_PROCESS])
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    assert not report["ok"] and set(report["problem_counts"]) == {"manifest_shape"}
    assert any(expected in found["message"] for found in report["problems"]), report["problems"]
    assert "shards were not read" in report["skipped_checks"]
    assert "FAILED" in result.output and "Traceback" not in result.output


# ---- validate: --json and --pictures ------------------------------------------------------------------------

def test_validate_json_into_a_missing_folder(data, tmp_path):
    refused(["validate", data, "--json", tmp_path / "nope" / "r.json", "--quiet"], "does not exist")
    assert not (tmp_path / "nope").exists()


def test_validate_json_into_a_folder(data, tmp_path):
    refused(["validate", data, "--json", tmp_path, "--quiet"], "is a folder")


def test_validate_pictures_into_a_file(data, tmp_path):
    (tmp_path / "file").write_text("x")
    refused(["validate", data, "--pictures", tmp_path / "file", "--quiet"], "is a file")
    assert (tmp_path / "file").read_text() == "x"


def test_validate_pictures_under_a_file(data, tmp_path):
    (tmp_path / "file").write_text("x")
    refused(["validate", data, "--pictures", tmp_path / "file" / "pics", "--quiet"], "does not exist")


def test_validate_json_write_failing_at_the_end_prints_the_report_then_one_line(data, tmp_path, monkeypatch):
    from shardprep.pipelines.runtime import storage

    def fail(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    edit_manifest(data, lambda m: m.update(classes="ab"))  # a quick run: the shape check stops it
    monkeypatch.setattr(storage, "atomic_write", fail)  # shardprep's own writer, not Beam's FileSystems
    result = refused(["validate", data, "--json", tmp_path / "r.json", "--quiet"], "writing the report to",
                     "No space left")
    assert "FAILED" in result.output.split("Error: ")[0]


# ---- train ----------------------------------------------------------------------------------------------------

def train(data, tmp_path, *options):
    return ["train", data, "--output-dir", tmp_path / "run", "--epochs", "1", "--batch-size", "2", "--image-size",
            "8", *options]


def empty_split(m, split):
    m["splits"][split].update(num_inputs=0, num_examples=0, class_counts={"a": 0, "b": 0}, num_shards=0, shards=[])


@pytest.mark.parametrize("split, option", [("validation", "--val-split"), ("train", "--train-split")])
def test_train_refuses_an_empty_split(data, tmp_path, split, option):
    edit_manifest(data, lambda m: empty_split(m, split))
    refused(train(data, tmp_path), option, f"'{split}'", "0 examples", "splits: ")
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_dataset_without_examples_or_classes(data, tmp_path):
    def nothing(m):
        empty_split(m, "train")
        empty_split(m, "validation")
    edit_manifest(data, nothing)
    refused(train(data, tmp_path), "0 examples")
    edit_manifest(data, lambda m: m.update(classes=[], num_classes=0))
    refused(train(data, tmp_path), "no classes")


@pytest.mark.parametrize("option, value", [("--val-split", "val"), ("--train-split", "training")])
def test_train_names_the_splits_present_for_an_unknown_split(data, tmp_path, option, value):
    refused(train(data, tmp_path, option, value), option, "splits: train, validation; examples: train 8, validation 4")


def test_train_refuses_a_deleted_shard(data, tmp_path):
    (data / "validation" / "validation-00001-of-00002.tfrecord").unlink()
    refused(train(data, tmp_path), "validation-00001-of-00002.tfrecord", "is missing", "shardprep validate")


@pytest.mark.parametrize("cut", [1, "all"])
def test_train_refuses_a_truncated_shard(data, tmp_path, cut):
    shard = data / "train" / "train-00000-of-00002.tfrecord"
    content = shard.read_bytes()
    shard.write_bytes(content[:-1] if cut == 1 else b"")
    refused(train(data, tmp_path), "train-00000-of-00002.tfrecord", "truncated", "rerun preprocess")


def test_train_refuses_a_bad_manifest_shape(data, tmp_path):
    edit_manifest(data, lambda m: m["splits"]["train"].update(num_examples="8"))
    refused(train(data, tmp_path), "wrong shape", "splits.train.num_examples", "shardprep validate")


def test_train_refuses_a_folder_without_manifest_or_a_missing_folder(data, tmp_path):
    (data / "manifest.json").unlink()
    refused(train(data, tmp_path), "not a complete shardprep dataset")
    refused(train(tmp_path / "missing", tmp_path), "does not exist")


def test_train_refuses_an_output_dir_that_is_a_file(data, tmp_path):
    (tmp_path / "run").write_text("x")
    refused(train(data, tmp_path), "--output-dir", "is a file")
    assert (tmp_path / "run").read_text() == "x"
    (tmp_path / "run").unlink()
    (tmp_path / "f").write_text("x")
    refused(["train", data, "--output-dir", tmp_path / "f" / "run"], "is a file")


# ---- demo-data --------------------------------------------------------------------------------------------------

def test_demo_data_into_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    refused(["demo-data", tmp_path / "file"], "is a file")
    refused(["demo-data", tmp_path / "file" / "sub"], "is a file")
    assert (tmp_path / "file").read_text() == "x" and listing(tmp_path) == ["file"]


def test_read_only_places_are_refused_even_when_run_as_root(data, tmp_path, monkeypatch):
    """The permission checks, with os.access made to say no (root can write anywhere, so chmod cannot show it)."""
    (tmp_path / "locked").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if "locked" in str(path) else real_access(path, mode))
    refused(["validate", data, "--json", tmp_path / "locked" / "r.json", "--quiet"], "permission denied")
    refused(["validate", data, "--pictures", tmp_path / "locked" / "pics", "--quiet"], "permission denied")
    refused(train(data, tmp_path, "--output-dir", tmp_path / "locked" / "run"), "--output-dir", "permission denied")
    refused(["demo-data", tmp_path / "locked" / "demo"], "permission denied")
    assert listing(tmp_path / "locked") == []


def rename_split(m, old, new):
    m["splits"][new] = m["splits"].pop(old)


@pytest.mark.parametrize("name", ["val", "valid", "test"])
def test_train_finds_the_validation_split_without_a_flag(data, name):
    """A DIR/train + DIR/val dataset trains with no split flags (test when it is the only split besides train)."""
    from shardprep.train.run import preflight
    from shardprep.train.data.split_roles import resolve_split

    edit_manifest(data, lambda m: rename_split(m, "validation", name))
    manifest = preflight.check(str(data), "train", None)
    assert resolve_split(manifest.splits, "validation", train_split="train").name == name
    assert preflight.check(str(data), "train", "train") is not None  # --val-split still decides


def test_train_without_a_validation_split_names_the_flag(data, tmp_path):
    edit_manifest(data, lambda m: rename_split(m, "validation", "holdout"))
    refused(train(data, tmp_path), f"'validation' is not a split of {data}, nor is any split named like a validation "
            "split (valid, val) or a test split that is the only one besides the training split (splits: train, "
            "holdout; examples: train 8, holdout 4); pass --val-split with the split to evaluate on")


def test_train_on_a_dataset_of_one_split_says_how_to_hold_images_out(tmp_path):
    """A source without split folders is all ``train``: the error says how to give it a held-out split."""
    data = tmp_path / "one-split"
    write_dataset(data, {"train": random_images(8, 8, 8)}, classes=["a", "b"])
    refused(train(data, tmp_path), f"{data} holds one split, 'train' (8 examples): no images are held out to evaluate "
            "on; put some in a split folder beside the training one (SOURCE/train/<class>/, SOURCE/val/<class>/) and "
            "preprocess again, or pass --val-split train to evaluate on the training images themselves")


def test_validating_on_the_training_split_is_warned():
    from shardprep.train.data.split_roles import resolve_split
    from shardprep.train.run.messages import split_lines

    train_split = resolve_split(["train"], "train")
    assert split_lines(train_split, resolve_split(["train"], "train")) == [
        "Validating on split 'train' after each epoch (the split named 'train').",
        "Warning: that is the training split: its accuracy says how well the model fits the images it trains on, "
        "not how it does on images it has not seen."]
    assert len(split_lines(train_split, resolve_split(["train", "val"], "validation"))) == 1


def test_train_refuses_an_ambiguous_validation_split_listing_the_splits(data, tmp_path):
    edit_manifest(data, lambda m: (rename_split(m, "validation", "val"),
                                   m["splits"].__setitem__("valid", m["splits"]["val"])))
    refused(train(data, tmp_path), f"Error: 'validation' is ambiguous in {data}: 'val' and 'valid' are both named "
            "like a validation split (splits: train, val, valid; examples: train 8, val 4, valid 4); pass --val-split "
            "with the split to evaluate on")
    refused(train(data, tmp_path, "--val-split", "validation"), "Error: --val-split 'validation' is ambiguous in",
            "valid 4); pass --val-split with one of them")


@pytest.mark.parametrize("value", ["x", "10,20,30", "-1", "5,"])
def test_train_checks_profile_batch_before_tensorflow_starts(data, tmp_path, value):
    result = CliRunner().invoke(main, [str(arg) for arg in train(data, tmp_path, "--profile-batch", value)])
    assert result.exit_code == 2 and "--profile-batch" in result.output
    assert not (tmp_path / "run").exists()


def test_validate_names_a_source_kind_it_does_not_read(tmp_path):
    """validate reads prepared datasets, tfrecord: and tfds:; a parquet: SOURCE is preprocess's input, and is said so
    (it used to be taken as a dataset folder and reported as not existing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"label": [0]}), tmp_path / "train.parquet")
    result = CliRunner().invoke(main, ["validate", f"parquet:{tmp_path}/*.parquet"])
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.output
    assert "does not exist" not in error[0]
    assert "parquet" in error[0] and "shardprep preprocess" in error[0]
    assert "tfrecord:GLOB" in error[0]


# ---- train: what a run did not write, one file or several ------------------------------------------------------

@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_train_names_what_it_did_not_write_one_file_as_it_several_as_them(data, tmp_path, flag):
    """"holds notes.txt, which ... did not write; move them away": one file is "it"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    if flag == "--resume":  # a run's folder (its record), with a file of the user's
        (run / ".shardprep-train.json").write_text(json.dumps(
            {"format": 1, "written_by": "shardprep train", "files": [], "folders": []}))
    line = refused(train(data, tmp_path, flag)).output
    assert "notes.txt" in line and "move it away" in line and "move them" not in line and "wrote them" not in line
    (run / "todo.txt").write_text("mine too")
    line = refused(train(data, tmp_path, flag)).output
    assert "notes.txt, todo.txt" in line and "move them away" in line
