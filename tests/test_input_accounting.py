"""Every input accounted for (issue #12): names that could escape OUTPUT, entries the listing used to skip silently,
layouts that were reinterpreted, labels CSVs in any encoding, options past the limits, and runs that write nothing.

A refused run exits 1 with one ``Error:`` line and no traceback, leaves SOURCE byte-for-byte intact and writes
nothing outside OUTPUT.
"""

from __future__ import annotations

import hashlib
import json
import os

import image_factory
import pytest
from click.testing import CliRunner

from preprocess import manifest as manifest_lib
from shardprep.cli import main as cli

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]


def run_cli(*args):
    return CliRunner().invoke(cli, ["preprocess", *map(str, args)], catch_exceptions=False)


def tree(path) -> dict:
    """{relative path: sha256 (files) or "link -> target" or "dir"} under ``path``, links not followed."""
    found = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                found[rel] = "link -> " + os.readlink(full)
            elif os.path.isdir(full):
                found[rel] = "dir"
            elif os.path.isfile(full):
                found[rel] = hashlib.sha256(open(full, "rb").read()).hexdigest()
            else:
                found[rel] = "special"
    return found


def ok(*args):
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    return result


def refused(workspace, *args, expect: str | tuple[str, ...]):
    """Runs the CLI (OUTPUT is ``workspace/out``) and checks the refusal: exit 1, one Error line naming ``expect``,
    no traceback, ``workspace`` unchanged outside OUTPUT."""
    before = {k: v for k, v in tree(workspace).items() if not k.startswith("out")}
    result = run_cli(*args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    for text in (expect,) if isinstance(expect, str) else expect:
        assert text in errors[0], errors[0]
    after = {k: v for k, v in tree(workspace).items() if not k.startswith("out")}
    assert after == before, "SOURCE intact and nothing written outside OUTPUT"
    assert not os.path.exists(os.path.join(workspace, "out", manifest_lib.MANIFEST_NAME))
    return errors[0]


def rejects(out) -> list[tuple[str, str, str]]:
    with open(os.path.join(out, manifest_lib.REJECTS_NAME)) as f:
        return sorted((line["split"], line["key"], line["reason"]) for line in map(json.loads, f))


def folder(root, splits=None, classes=("a", "b")):
    return image_factory.write_image_folder(root, splits or {"train": 4}, classes=classes, min_side=16, max_side=24)


# --- 2. split names cannot escape OUTPUT -------------------------------------------------------------------------

@pytest.mark.parametrize("split, why", [
    ("", "is empty"), ("../escaped", "path separator"), ("a/b", "path separator"), ("a\\b", "path separator"),
    ("..", "path step"), (".", "path step"), (".hidden", "starts with '.'"), ("a\nb", "control character"),
    ("tab\there", "control character"), ("x" * 200, "bytes long")])
def test_split_option_that_is_not_a_plain_name_is_refused(tmp_path, split, why):
    source = tmp_path / "src"
    folder(source / "tmp")
    os.rename(source / "tmp" / "train", source / "flat")
    refused(tmp_path, source / "flat", tmp_path / "out", "--split", split, *IN_PROCESS,
            expect=("split name", "--split", why))
    assert not os.path.exists("/-00000-of-00001.tfrecord")
    assert not os.path.exists(tmp_path / "escaped")


def test_labels_split_option_is_checked_too(tmp_path):
    source = tmp_path / "src"
    folder(source)
    labels = tmp_path / "labels.csv"
    labels.write_text("x.jpg,a\n")
    refused(tmp_path, source, tmp_path / "out", "--labels-file", labels, "--labels-split", "../up", *IN_PROCESS,
            expect=("split name '../up' from --labels-split", "path separator"))


def test_class_names_from_folders_labels_csv_and_labels_txt_follow_the_same_rule(tmp_path):
    source = tmp_path / "src"
    folder(source)
    (source / "train" / "bad\nname").mkdir()
    (source / "train" / "bad\nname" / "x.png").write_bytes(image_factory.tiny_png())
    refused(tmp_path, source, tmp_path / "out", *IN_PROCESS,
            expect=("class name 'bad\\nname' from the folder", "control character", "rename the folder"))

    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "x.png").write_bytes(image_factory.tiny_png())
    labels = tmp_path / "labels.csv"
    labels.write_text("filename,label\nx.png,../n01\n")
    refused(tmp_path, flat, tmp_path / "out", "--labels-file", labels, *IN_PROCESS,
            expect=("class name '../n01'", f"labels file {labels} line 2", "path separator"))

    from test_preprocess_job import write_tfds_style_tfrecords

    records = tmp_path / "records"
    write_tfds_style_tfrecords(records, "train", [(image_factory.rgb_jpeg(), 0)], num_files=1)
    (records / "label.labels.txt").write_text("cat\n..\n")
    refused(tmp_path, f"tfrecord:{records}/*.tfrecord*", tmp_path / "out", *IN_PROCESS,
            expect=("class name '..'", "label.labels.txt line 2", "path step"))


# --- 4. nothing skipped silently, no layout reinterpreted --------------------------------------------------------

def test_hidden_entries_and_linked_folders_become_rejects_at_every_depth(tmp_path):
    source = tmp_path / "src"
    folder(source, {"train": 4, "val": 2})
    (source / ".DS_Store").write_bytes(b"mac")  # top level beside split folders: counted in train
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref")
    (source / "train" / ".DS_Store").write_bytes(b"mac")
    (source / "train" / ".cache").mkdir()  # a hidden class folder: one reject, its files not read
    (source / "train" / ".cache" / "x.png").write_bytes(image_factory.tiny_png())
    (source / "train" / "a" / ".hidden.png").write_bytes(image_factory.tiny_png())
    (source / "train" / "a" / "deeper").mkdir()
    (source / "train" / "a" / "deeper" / "._x.png").write_bytes(b"resource fork")
    (source / "train" / "a" / "deeper" / ".thumbs").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "y.png").write_bytes(image_factory.tiny_png())
    os.symlink(outside, source / "train" / "b" / "linked")
    os.symlink(outside, source / "train" / "a" / "deeper" / "linked_deeper")
    (source / "val" / "b" / ".DS_Store").write_bytes(b"mac")
    out = tmp_path / "out"
    ok(source, out, "--shorter-side", 8, *IN_PROCESS)
    assert rejects(out) == [
        ("train", ".DS_Store", "hidden_file"),
        ("train", ".git", "hidden_folder"),
        ("train", "train/.DS_Store", "hidden_file"),
        ("train", "train/.cache", "hidden_folder"),
        ("train", "train/a/.hidden.png", "hidden_file"),
        ("train", "train/a/deeper/._x.png", "hidden_file"),
        ("train", "train/a/deeper/.thumbs", "hidden_folder"),
        ("train", "train/a/deeper/linked_deeper", "symlinked_folder"),
        ("train", "train/b/linked", "symlinked_folder"),
        ("val", "val/b/.DS_Store", "hidden_file"),
    ]
    manifest = manifest_lib.load(str(out))
    assert manifest["classes"] == ["a", "b"]
    assert [(manifest["splits"][s]["num_inputs"], manifest["splits"][s]["num_examples"]) for s in ("train", "val")] \
        == [(13, 4), (3, 2)]


def test_hidden_entries_of_a_single_split_source_count_in_its_split(tmp_path):
    source = tmp_path / "src"
    folder(source / "tmp")
    os.rename(source / "tmp" / "train", source / "flat")
    (source / "flat" / ".DS_Store").write_bytes(b"mac")
    (source / "flat" / ".secret_class").mkdir()
    out = tmp_path / "out"
    ok(source / "flat", out, "--shorter-side", 8, "--split", "all", *IN_PROCESS)
    assert rejects(out) == [("all", ".DS_Store", "hidden_file"), ("all", ".secret_class", "hidden_folder")]


@pytest.mark.parametrize("split_folder, other", [("train", "cat"), ("val", "misc"), ("Test", "extra")])
def test_split_folder_of_classes_beside_a_folder_not_named_like_a_split_is_refused(tmp_path, split_folder, other):
    source = tmp_path / "src"
    folder(source, {split_folder: 2})
    (source / other).mkdir()
    (source / other / "x.png").write_bytes(image_factory.tiny_png())
    refused(tmp_path, source, tmp_path / "out", *IN_PROCESS,
            expect=(f"mixes split folders holding class folders ({split_folder})",
                    f"not named like a split ({other})", "SOURCE/<split>/<class>/<file>"))


def test_a_class_named_like_a_split_without_class_folders_inside_is_still_a_class(tmp_path):
    source = tmp_path / "src"
    for name in ("test", "cat"):
        (source / name).mkdir(parents=True)
        (source / name / "x.png").write_bytes(image_factory.tiny_png())
    out = tmp_path / "out"
    ok(source, out, "--shorter-side", 8, *IN_PROCESS)
    assert manifest_lib.load(str(out))["classes"] == ["cat", "test"]
