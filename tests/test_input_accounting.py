"""Every input accounted for (issue #12): names that could escape OUTPUT, entries the listing used to skip silently,
layouts that were reinterpreted, labels CSVs in any encoding, options past the limits, and runs that write nothing.

A refused run exits 1 with one ``Error:`` line and no traceback, leaves SOURCE byte-for-byte intact and writes
nothing outside OUTPUT.
"""

from __future__ import annotations

import json
import os

import image_factory
from file_trees import tree
import pytest
from click.testing import CliRunner

from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.cli import main as cli

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]


def run_cli(*args):
    return CliRunner().invoke(cli, ["preprocess", *map(str, args)], catch_exceptions=False)


def ok(*args):
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    return result


def refused(workspace, *args, expect: str | tuple[str, ...], status: int = 2):
    """Runs the CLI (OUTPUT is ``workspace/out``) and checks the refusal: exit ``status`` (2: SOURCE or its options
    refused while planning; 1: an output path), one Error line naming ``expect``, no traceback, ``workspace``
    unchanged outside OUTPUT."""
    before = {k: v for k, v in tree(workspace).items() if not k.startswith("out")}
    result = run_cli(*args)
    assert result.exit_code == status, result.output
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
    """Where classes are, a hidden folder is a reject (it could be a class), and so is anything hidden or linked
    inside a class folder; hidden files beside the split or class folders, and hidden folders beside split folders,
    are listed as not used."""
    source = tmp_path / "src"
    folder(source, {"train": 4, "val": 2})
    (source / ".DS_Store").write_bytes(b"mac")  # top level beside split folders: not used
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
        ("train", "train/.cache", "hidden_folder"),
        ("train", "train/a/.hidden.png", "hidden_file"),
        ("train", "train/a/deeper/._x.png", "hidden_file"),
        ("train", "train/a/deeper/.thumbs", "hidden_folder"),
        ("train", "train/a/deeper/linked_deeper", "symlinked_folder"),
        ("train", "train/b/linked", "symlinked_folder"),
        ("val", "val/b/.DS_Store", "hidden_file"),
    ]
    manifest = manifest_lib.read_document(str(out))
    assert manifest["classes"] == ["a", "b"]
    assert [(manifest["splits"][s]["num_inputs"], manifest["splits"][s]["num_examples"]) for s in ("train", "val")] \
        == [(10, 4), (3, 2)]
    assert [entry["path"] for entry in manifest["not_used"]] == [".DS_Store", ".git/", "train/.DS_Store"]


def test_hidden_entries_of_a_single_split_source_count_in_its_split(tmp_path):
    source = tmp_path / "src"
    folder(source / "tmp")
    os.rename(source / "tmp" / "train", source / "flat")
    (source / "flat" / ".DS_Store").write_bytes(b"mac")
    (source / "flat" / ".secret_class").mkdir()
    out = tmp_path / "out"
    ok(source / "flat", out, "--shorter-side", 8, "--split", "all", *IN_PROCESS)
    assert rejects(out) == [("all", ".secret_class", "hidden_folder")]
    assert [entry["path"] for entry in manifest_lib.read_document(str(out))["not_used"]] == [".DS_Store"]


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
    ok(source, out, "--shorter-side", 8, "--allow-upscale", *IN_PROCESS)  # 1x1 images
    assert manifest_lib.read_document(str(out))["classes"] == ["cat", "test"]


# --- 5. labels CSVs: one decoding, headers detected or refused -------------------------------------------------------

def flat_images(directory, names):
    directory.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (directory / name).write_bytes(image_factory.rgb_jpeg(image_factory.RED if i % 2 else image_factory.BLUE))


def bom_labels(tmp_path, header: str):
    flat_images(tmp_path / "val", ["img500.JPEG", "img501.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_bytes(b"\xef\xbb\xbf" + f"{header}img500.JPEG,n01\r\nimg501.JPEG,n02\r\n".encode())
    return labels


@pytest.mark.parametrize("header", ["", "filename,label\n", "image,class\n", "File_Name,Category\n"])
def test_a_utf8_bom_costs_no_row(tmp_path, header):
    """The labels file is read when the source is planned: each header (or none) behind a BOM gives both rows."""
    from shardprep.pipelines.sources.registry import plan_source
    from shardprep.preprocess.format.config import PreprocessConfig

    labels = bom_labels(tmp_path, header)
    plan = plan_source(PreprocessConfig(source=str(tmp_path / "val"), output=str(tmp_path / "out"),
                                        labels_file=str(labels)))
    assert [row for _, row in plan.label_rows] == [("img500.JPEG", "n01"), ("img501.JPEG", "n02")]
    assert plan.classes == ("n01", "n02")


def test_a_utf8_bom_costs_no_row_and_a_first_row_without_extension_naming_a_file_is_a_row_end_to_end(tmp_path):
    flat_images(tmp_path / "val", ["README", "img500.JPEG", "img501.JPEG"])
    labels = tmp_path / "labels.csv"  # no header: the BOM sits on the first row's file name, which has no extension
    labels.write_bytes(b"\xef\xbb\xbfREADME,n01\r\nimg500.JPEG,n01\r\nimg501.JPEG,n02\r\n")
    out = tmp_path / "out"
    ok(tmp_path / "val", out, "--labels-file", labels, "--shorter-side", 8, *IN_PROCESS)
    info = manifest_lib.read_document(str(out))["splits"]["train"]
    assert (info["num_inputs"], info["num_examples"], info["num_rejected"]) == (3, 3, 0)
    assert manifest_lib.read_document(str(out))["classes"] == ["n01", "n02"]


@pytest.mark.parametrize("content, expect", [
    ("img0.JPEG,n01\ncaf\u00e9.JPEG,n02\n".encode("latin-1"), ("line 2 is not valid UTF-8", "byte 0xe9 at column 4")),
    ("filename,label\nimg0.JPEG,n01\n".encode("utf-16"), ("is UTF-16", "save it as UTF-8")),
    ("img0.JPEG,n01\n".encode("utf-16-le"), ("line 1 has a NUL byte", "not a text CSV")),
    ("img0.JPEG,n01\n".encode("utf-32"), ("is UTF-32",)),
    (bytes(range(256)), ("line 1 has a NUL byte",)),
    (b"\x89PNG\r\n\x1a\n\xff\xfe", ("not valid UTF-8",)),
    (b"", ("has no rows",)),
    (b"filename,label\n", ("has no rows",)),
    (b"img0.JPEG\n", ("line 1: expected 'filename,label'",)),
])
def test_labels_files_that_are_not_utf8_csv_are_a_clear_error(tmp_path, content, expect):
    flat_images(tmp_path / "val", ["img0.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_bytes(content)
    refused(tmp_path, tmp_path / "val", tmp_path / "out", "--labels-file", labels, *IN_PROCESS,
            expect=(f"labels file {labels}", *expect))


def test_labels_file_that_is_a_folder_or_missing_is_a_clear_error(tmp_path):
    flat_images(tmp_path / "val", ["img0.JPEG"])
    (tmp_path / "labels_dir").mkdir()
    refused(tmp_path, tmp_path / "val", tmp_path / "out", "--labels-file", tmp_path / "labels_dir", *IN_PROCESS,
            expect="is not a file")
    refused(tmp_path, tmp_path / "val", tmp_path / "out", "--labels-file", tmp_path / "nope.csv", *IN_PROCESS,
            expect="does not exist")


@pytest.mark.parametrize("header", ["id,wnid", "img;label,x"])  # ImageId,PredictionString: Kaggle's, read
def test_an_unknown_header_is_refused_not_made_a_class(tmp_path, header):
    flat_images(tmp_path / "val", ["ILSVRC2012_val_00000001.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_text(f"{header}\nILSVRC2012_val_00000001.JPEG,n01\n")
    refused(tmp_path, tmp_path / "val", tmp_path / "out", "--labels-file", labels, *IN_PROCESS,
            expect=("line 1", "looks like a header", "filename,label"))


def test_a_first_row_without_extension_naming_a_file_is_a_row(tmp_path):
    """The labels file as planned (the end-to-end run with such a first row is the BOM test's above)."""
    from shardprep.pipelines.sources.registry import plan_source
    from shardprep.preprocess.format.config import PreprocessConfig

    flat_images(tmp_path / "val", ["README", "img1.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_text("README,n01\nimg1.JPEG,n02\n")
    plan = plan_source(PreprocessConfig(source=str(tmp_path / "val"), output=str(tmp_path / "out"),
                                        labels_file=str(labels)))
    assert [row for _, row in plan.label_rows] == [("README", "n01"), ("img1.JPEG", "n02")]


def test_names_that_differ_only_in_case_fail_with_that_hint(tmp_path):
    flat_images(tmp_path / "val", ["IMG1.JPEG", "IMG2.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_text("img1.jpeg,n01\nimg2.jpeg,n02\n")
    refused(tmp_path, tmp_path / "val", tmp_path / "out", "--labels-file", labels, "--shorter-side", 8, *IN_PROCESS,
            status=1, expect=("split train: all 4 inputs were rejected (case_mismatch: 4)", "differ only in case"))


def test_one_name_differing_in_case_is_a_reject_of_its_own(tmp_path):
    flat_images(tmp_path / "val", ["a.JPEG", "B.JPEG", "c.JPEG"])
    labels = tmp_path / "labels.csv"
    labels.write_text("a.JPEG,n01\nb.jpeg,n02\nc.JPEG,n02\n")
    out = tmp_path / "out"
    ok(tmp_path / "val", out, "--labels-file", labels, "--split", "val", "--shorter-side", 8, *IN_PROCESS)
    assert rejects(out) == [("val", "B.JPEG", "case_mismatch"), ("val", "labels-file:b.jpeg", "case_mismatch")]
    info = manifest_lib.read_document(str(out))["splits"]["val"]
    assert (info["num_inputs"], info["num_examples"], info["num_rejected"]) == (4, 2, 2)


# --- 6. options against the limits -------------------------------------------------------------------------------

@pytest.mark.parametrize("options, expect", [
    (["--shorter-side", 100000], ("--shorter-side 100000", "more than --max-pixels 178,956,970",
                                  "largest --shorter-side it allows is 13377")),
    (["--shorter-side", 100000, "--crop", "none"], ("largest --shorter-side it allows is 13377",)),
    (["--shorter-side", 300, "--max-pixels", 90000 - 1], ("largest --shorter-side it allows is 299",)),
    (["--max-pixels", 1], ("--shorter-side 256", "largest --shorter-side it allows is 1")),
    (["--shorter-side", 27000, "--max-pixels", 10 ** 10], ("2,187,000,000 bytes", "protobuf's 2 GiB limit",
                                                           "largest --shorter-side that fits is 26754")),
    (["--shorter-side", 27000, "--max-pixels", 10 ** 10, "--crop", "none"], ("largest --shorter-side that fits",)),
    (["--shorter-side", 70000, "--max-pixels", 10 ** 10, "--encoding", "jpeg"], ("JPEG", "65500")),
])
def test_options_past_the_limits_are_refused_before_the_run(tmp_path, options, expect):
    source = tmp_path / "src"
    folder(source)
    refused(tmp_path, source, tmp_path / "out", *options, *IN_PROCESS, expect=expect)
    assert not os.path.exists(tmp_path / "out"), "refused before anything is written"


def test_the_largest_side_that_fits_is_accepted():
    from shardprep.preprocess.format import config as limits

    limits.check_options(26754, "raw", 10 ** 10)
    limits.check_options(13377, "raw", 178_956_970)
    with pytest.raises(Exception, match="26754"):
        limits.check_options(26755, "raw", 10 ** 10)


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_an_image_whose_record_would_be_too_large_is_a_reject(monkeypatch, encoding):
    from shardprep.preprocess.format import config as limits
    from shardprep.preprocess.image import image_ops

    monkeypatch.setattr(limits, "MAX_RECORD_BYTES", 20_000)
    monkeypatch.setattr(limits, "RECORD_OVERHEAD", 100)
    options = image_ops.ProcessOptions(shorter_side=40, crop="none", encoding=encoding)
    image_ops.process_image(image_factory.rgb_jpeg(width=40, height=40), options)  # 4,800 raw bytes: fits
    strip = image_factory.encode(image_factory.solid(image_factory.RED, 40, 2000), "PNG")
    if encoding == "raw":
        with pytest.raises(image_ops.RejectError) as raised:
            image_ops.process_image(strip, options)  # 40 x 2000 x 3 = 240,000 bytes
    else:
        noise = image_factory.encode(image_factory.Image.fromarray(
            image_factory.np.random.default_rng(0).integers(0, 256, (2000, 40, 3), dtype="uint8")), "PNG")
        with pytest.raises(image_ops.RejectError) as raised:
            image_ops.process_image(noise, options)
    assert raised.value.reason == "record_too_large"


# --- 7. a run that writes nothing fails --------------------------------------------------------------------------

def test_tfrecord_glob_of_jpegs_fails_with_a_hint(tmp_path):
    flat_images(tmp_path / "jpegs", ["a.JPEG", "b.JPEG"])
    refused(tmp_path, f"tfrecord:{tmp_path}/jpegs/*", tmp_path / "out", *IN_PROCESS,
            status=1, expect=("split train: all 2 inputs were rejected", "not TFRecords of encoded images"))


def test_every_image_over_max_pixels_fails_with_a_hint(tmp_path):
    source = tmp_path / "src"
    folder(source)
    refused(tmp_path, source, tmp_path / "out", "--shorter-side", 4, "--max-pixels", 100, *IN_PROCESS,
            status=1, expect=("all 4 inputs were rejected (too_many_pixels: 4)", "--max-pixels (100)"))


def test_flat_images_without_labels_file_fail_with_a_hint(tmp_path):
    flat_images(tmp_path / "val", ["a.JPEG"])
    refused(tmp_path, tmp_path / "val", tmp_path / "out", *IN_PROCESS,
            expect=("no classes found", "did you forget --labels-file?"))
    root = tmp_path / "imagenet"
    folder(root)
    flat_images(root / "val", ["a.JPEG", "b.JPEG"])
    refused(tmp_path, root, tmp_path / "out", "--shorter-side", 8, "--overwrite", *IN_PROCESS,
            expect=("split val (2 files) holds images not in class folders", "did you forget --labels-file?"))


def test_class_folders_without_files_fail(tmp_path):
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    (source / "b").mkdir()
    refused(tmp_path, source, tmp_path / "out", *IN_PROCESS, status=1, expect="found no inputs")


def test_a_split_of_only_hidden_entries_fails_with_that_hint(tmp_path):
    source = tmp_path / "src"
    folder(source, {"train": 2})
    (source / "val" / "a").mkdir(parents=True)
    (source / "val" / "a" / ".DS_Store").write_bytes(b"mac")
    refused(tmp_path, source, tmp_path / "out", "--shorter-side", 8, *IN_PROCESS,
            status=1, expect=("split val: all 1 inputs were rejected (hidden_file: 1)", "only hidden entries"))


def test_tfrecord_split_names_from_file_names_and_split_option_follow_the_rule(tmp_path):
    from test_preprocess_job import write_tfds_style_tfrecords

    records = tmp_path / "records"
    write_tfds_style_tfrecords(records, "train", [(image_factory.rgb_jpeg(), 0)], num_files=1)
    os.rename(next(records.iterdir()), records / "plain.tfrecord")  # no split in the name: --split is used
    refused(tmp_path, f"tfrecord:{records}/*", tmp_path / "out", "--split", "../x", *IN_PROCESS,
            expect="split name '../x' from --split")
    out = tmp_path / "out"
    ok(f"tfrecord:{records}/*", out, "--split", "holdout", "--shorter-side", 8, *IN_PROCESS)
    assert list(manifest_lib.read_document(str(out))["splits"]) == ["holdout"]
