"""Datasets as they are downloaded, and the names and links in them.

* A README, licence, CSV, synset list, ``.DS_Store`` or ``.git/`` beside the split or class folders (CIFAR-10 as
  JPEGs cloned as is, imagenette2-320, Kaggle's ImageNet) is listed as not used (the manifest's ``not_used``, one
  summary line), never a refusal; an image loose beside split folders is still refused, naming it.
* Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``) is a labels file as it is, and the unlabelled
  ``test/`` beside it is not used.
* Links that loop back into SOURCE (or to a folder holding it) are rejects with a reason, never classes.
* Split names that would collide with OUTPUT's own files, blank names and bidi or control characters are refused
  before anything runs; class names are compared in NFC (``Café`` in NFC and NFD is one class).
"""

from __future__ import annotations

import json
import os
import unicodedata

import image_factory
import pytest
from click.testing import CliRunner
from file_trees import tree

from shardprep.cli import main as cli
from shardprep.preprocess.format import manifest as manifest_lib

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]


def preprocess(*args):
    return CliRunner().invoke(cli, ["preprocess", *map(str, args)])


def ok(source, out, *options) -> dict:
    result = preprocess(source, out, "--shorter-side", 8, *options, *IN_PROCESS)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return manifest_lib.read_document(str(out)) | {"_output": result.output}


def refused(workspace, *args, expect=(), status: int = 2) -> str:
    """A refusal: exit ``status`` (2: SOURCE or its options refused while planning; 1: an output path)."""
    before = tree(workspace)
    result = preprocess(*args, "--quiet", *IN_PROCESS)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == status, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in expect:
        assert fragment in lines[0], lines[0]
    assert tree(workspace) == before, "a refused run changes nothing"
    return lines[0]


def rejects(out) -> list[tuple[str, str, str]]:
    with open(os.path.join(out, manifest_lib.REJECTS_NAME)) as f:
        return sorted((line["split"], line["key"], line["reason"]) for line in map(json.loads, f))


def images(root, splits, classes=("cat", "dog"), kinds=("png",)):
    image_factory.write_image_folder(root, splits, classes=classes, min_side=12, max_side=20, kinds=kinds)


def not_used(manifest) -> list[tuple[str, str]]:
    return [(entry["path"], entry["reason"]) for entry in manifest.get("not_used", [])]


# --- files that are not images beside the folders ------------------------------------------------------------------

def test_cifar10_as_cloned_runs_and_lists_what_it_does_not_use(tmp_path):
    source = tmp_path / "cifar10"
    images(source, {"train": 6, "test": 4}, classes=("airplane", "bird", "cat"))
    (source / "README.md").write_text("# CIFAR-10 as PNGs\n")
    (source / "LICENSE").write_text("MIT\n")
    (source / ".DS_Store").write_bytes(b"mac")
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (source / "train" / "synsets.txt").write_text("airplane\nbird\ncat\n")
    (source / "train" / ".DS_Store").write_bytes(b"mac")
    manifest = ok(source, tmp_path / "out")
    assert manifest["classes"] == ["airplane", "bird", "cat"] and list(manifest["splits"]) == ["test", "train"]
    assert manifest["num_inputs"] == 10 and manifest["num_rejected"] == 0
    listed = not_used(manifest)
    assert [path for path, _ in listed] == [".DS_Store", ".git/", "LICENSE", "README.md", "train/.DS_Store",
                                            "train/synsets.txt"]
    reasons = dict(listed)
    assert "hidden" in reasons[".git/"] and "not an image" in reasons["README.md"]
    summary = [line for line in manifest["_output"].splitlines() if line.startswith("not used")]
    assert len(summary) == 1 and "6 files" in summary[0] and "manifest.json" in summary[0], manifest["_output"]
    assert len(summary[0]) <= 80


def test_an_empty_class_folder_is_told_and_still_a_class(tmp_path):
    """``SOURCE/train/bird/`` with no files got no word at all. It stays a class, as it always was (the label map
    and the output's bytes do not change: classes are the class folders' names), and the run says so: a note per
    empty folder, and for a class without an image in any split, that the model gets an output nothing trains."""
    source = tmp_path / "src"
    images(source, {"train": 4, "validation": 2})
    (source / "train" / "bird").mkdir()  # no files; validation/bird/ does not exist at all
    (source / "validation" / "eel").mkdir()
    (source / "train" / "eel").mkdir()
    manifest = ok(source, tmp_path / "out")
    assert manifest["classes"] == ["bird", "cat", "dog", "eel"]  # as before: labels 0 and 3 hold no images
    output = manifest["_output"]
    notes = output[output.index("note: "):].splitlines()  # the last lines, each note wrapped to 80 columns
    assert notes == [
        "note: class folder train/bird holds no images; bird has none in any split, yet",
        "  it is class 0 of the dataset (a model trained on it has an output",
        "  nothing trains): remove the folder and rerun to leave it out",
        "note: class folders train/eel and validation/eel hold no images; eel has none in",
        "  any split, yet it is class 3 of the dataset (a model trained on it has",
        "  an output nothing trains): remove the folders and rerun to leave it out",
    ], output
    assert max(map(len, notes)) <= 80


def test_a_class_folder_empty_in_one_split_only_is_told(tmp_path):
    source = tmp_path / "src"
    images(source, {"train": 4, "validation": 2})
    (source / "validation" / "dog").rename(tmp_path / "dogs")
    (source / "validation" / "dog").mkdir()
    manifest = ok(source, tmp_path / "out")
    assert manifest["splits"]["validation"]["class_counts"] == {"cat": 1, "dog": 0}
    notes = [line for line in manifest["_output"].splitlines() if line.startswith("note:")]
    assert notes == ["note: class folder validation/dog holds no images"], manifest["_output"]


def test_imagenette2_as_downloaded_runs(tmp_path):
    source = tmp_path / "imagenette2-320"
    images(source, {"train": 4, "val": 2}, classes=("n01440764", "n02102040"), kinds=("jpeg",))
    (source / "noisy_imagenette.csv").write_text("path,noisy_labels_0,is_valid\ntrain/n01440764/a.JPEG,n01,False\n")
    manifest = ok(source, tmp_path / "out")
    assert list(manifest["splits"]) == ["train", "val"] and manifest["num_examples"] == 6
    assert not_used(manifest) == [("noisy_imagenette.csv", "not an image (by its name), beside the folders: not read")]


def test_a_readme_beside_class_folders_of_one_split_is_not_used_an_image_there_is_a_reject(tmp_path):
    source = tmp_path / "src"
    images(source, {"all": 4})
    os.rename(source / "all", tmp_path / "flat")
    (tmp_path / "flat" / "README.txt").write_text("about these\n")
    (tmp_path / "flat" / "stray.png").write_bytes(image_factory.tiny_png())
    manifest = ok(tmp_path / "flat", tmp_path / "out")
    assert not_used(manifest) == [("README.txt", "not an image (by its name), beside the folders: not read")]
    assert rejects(tmp_path / "out") == [("train", "stray.png", "no_label")]


def test_an_image_loose_beside_split_folders_is_still_refused_naming_it(tmp_path):
    source = tmp_path / "src"
    images(source, {"train": 2, "val": 2})
    (source / "README.md").write_text("fine\n")
    (source / "cover.jpg").write_bytes(image_factory.rgb_jpeg())
    refused(tmp_path, source, tmp_path / "out", expect=("cover.jpg), which is in no split: move it into",
                                                        "split folders (train, val)"))
    (source / "back.jpg").write_bytes(image_factory.rgb_jpeg())
    refused(tmp_path, source, tmp_path / "out", expect=("(back.jpg, cover.jpg), which are in no split: move them",))


@pytest.mark.parametrize("beside", [(), ("README.md",)])
def test_the_folder_that_holds_a_download_is_refused_naming_the_one_to_give(tmp_path, beside):
    """SOURCE/imagenette2/{train,val}/<class>/ (the folder a .tgz was extracted into) was read as one class named
    imagenette2, the val images training images of it, exit 0. It is refused, naming the folder to give."""
    holder = tmp_path / "downloads"
    images(holder / "imagenette2", {"train": 2, "val": 2}, classes=("n01440764", "n02102040"), kinds=("jpeg",))
    for name in beside:
        (holder / name).write_text("about\n")
    line = refused(tmp_path, holder, tmp_path / "out")
    assert line == (f"Error: {holder} holds one folder, imagenette2, which holds split folders (train, val): give "
                    f"{holder / 'imagenette2'} as SOURCE (as given, imagenette2 would be one class holding every "
                    "split's images)")
    if not beside:  # what lies beside it is outside the folder named: the run that folder gives is one run
        ok(holder / "imagenette2", tmp_path / "out")


# --- Kaggle's ImageNet ---------------------------------------------------------------------------------------------

def kaggle_imagenet(root):
    """ILSVRC/Data/CLS-LOC as Kaggle ships it: train/<wnid>/, flat val/ and an unlabelled flat test/; and
    LOC_val_solution.csv (ImageId without extension, the class the first word of PredictionString)."""
    cls_loc = root / "ILSVRC" / "Data" / "CLS-LOC"
    images(cls_loc, {"train": 4}, classes=("n01440764", "n01443537"), kinds=("jpeg",))
    rows = []
    for split, count in (("val", 3), ("test", 2)):
        (cls_loc / split).mkdir()
        for i in range(1, count + 1):
            image_id = f"ILSVRC2012_{split}_{i:08d}"
            (cls_loc / split / f"{image_id}.JPEG").write_bytes(image_factory.rgb_jpeg())
            wnid = ("n01440764", "n01443537")[i % 2]
            if split == "val":
                rows.append(f"{image_id},{wnid} 12 30 200 180 {wnid} 1 2 3 4 ")
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    (root / "LOC_synset_mapping.txt").write_text("n01440764 tench\nn01443537 goldfish\n")
    return cls_loc


def test_kaggle_imagenet_is_one_command_with_loc_val_solution_as_is(tmp_path):
    cls_loc = kaggle_imagenet(tmp_path / "imagenet")
    manifest = ok(cls_loc, tmp_path / "out", "--labels-file", tmp_path / "imagenet" / "LOC_val_solution.csv")
    assert manifest["classes"] == ["n01440764", "n01443537"] and list(manifest["splits"]) == ["train", "val"]
    val = manifest["splits"]["val"]
    assert (val["num_inputs"], val["num_examples"], val["num_rejected"]) == (3, 3, 0)
    assert val["class_counts"] == {"n01440764": 1, "n01443537": 2}
    [(path, reason)] = not_used(manifest)
    assert path == "test/" and "no --labels-file row names" in reason and "2 files" in reason


def test_a_split_of_images_not_in_class_folders_without_a_labels_file_is_refused_before_decoding(tmp_path):
    """train/ and val/ of class folders beside a flat, unlabelled test/ (Kaggle's layout without its CSV): every
    image was decoded, then the whole job failed ("split test: all 2 inputs were rejected (no_label: 2)"), leaving a
    shard, the rejects and .tmp. It is refused before anything runs, with the hint."""
    source = tmp_path / "src"
    images(source, {"train": 4, "val": 2})
    (source / "test").mkdir()
    for i in range(2):
        (source / "test" / f"t{i}.jpg").write_bytes(image_factory.rgb_jpeg())
    line = refused(tmp_path, source, tmp_path / "out")
    assert line.startswith("Error: split test (2 files) holds images not in class folders, and no --labels-file "
                           "names their classes: did you forget --labels-file?"), line


def test_a_kaggle_row_without_a_prediction_is_an_error_naming_the_line(tmp_path):
    cls_loc = kaggle_imagenet(tmp_path / "imagenet")
    labels = tmp_path / "imagenet" / "LOC_val_solution.csv"
    labels.write_text(labels.read_text() + "ILSVRC2012_val_00000009,\n")
    refused(tmp_path, cls_loc, tmp_path / "out", "--labels-file", labels, expect=(f"labels file {labels} line 5",))


# --- links back into SOURCE ----------------------------------------------------------------------------------------

def test_links_that_loop_back_into_source_are_rejects_not_classes(tmp_path):
    source = tmp_path / "src"
    images(source, {"train": 4, "val": 2})
    outside = tmp_path / "elsewhere" / "bird"
    outside.mkdir(parents=True)
    (outside / "b.png").write_bytes(image_factory.tiny_png())
    os.symlink("..", source / "train" / "up")  # SOURCE itself, again
    os.symlink("../train/cat", source / "val" / "again")  # a class folder of SOURCE
    os.symlink("/", source / "train" / "root")  # a folder holding SOURCE
    os.symlink(tmp_path / "back", source / "train" / "chain")  # a chain of links that ends at SOURCE
    os.symlink(source, tmp_path / "back")
    cat_image = sorted(os.listdir(source / "train" / "cat"))[0]
    os.symlink(f"../cat/{cat_image}", source / "train" / "dog" / "copy.png")  # an image of SOURCE, twice
    os.symlink(outside, source / "train" / "bird")  # a folder outside SOURCE: a class, as before
    manifest = ok(source, tmp_path / "out")
    assert manifest["classes"] == ["bird", "cat", "dog"]
    assert {(split, key, reason) for split, key, reason in rejects(tmp_path / "out")} == {
        ("train", "train/up", "looping_link"), ("val", "val/again", "looping_link"),
        ("train", "train/root", "looping_link"), ("train", "train/chain", "looping_link"),
        ("train", "train/dog/copy.png", "looping_link")}
    assert (manifest["splits"]["train"]["num_inputs"], manifest["splits"]["train"]["num_examples"]) == (9, 5)
    assert (manifest["splits"]["val"]["num_inputs"], manifest["splits"]["val"]["num_examples"]) == (3, 2)


def test_a_split_folder_linked_to_another_split_is_a_reject(tmp_path):
    source = tmp_path / "src"
    images(source, {"train": 4})
    os.symlink("train", source / "val")
    manifest = ok(source, tmp_path / "out")
    assert list(manifest["splits"]) == ["train"]
    assert rejects(tmp_path / "out") == [("train", "val", "looping_link")]


# --- split and class names -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("split, why", [
    ("manifest.json", "manifest.json"), ("rejects.jsonl", "rejects.jsonl"), ("Manifest.JSON", "manifest.json"),
    ("train-00000-of-00001.tfrecord", "shard"), (" ", "blank"), ("   ", "blank"), (" cat", "space"),
    ("cat ", "space"), ("a\u202eb", "U+202E"), ("\u200fx", "U+200F"), ("a\u2066b", "U+2066"), ("\ufeffx", "U+FEFF"),
    ("a\u200bb", "U+200B")])
def test_split_names_colliding_with_output_or_invisible_are_refused_up_front(tmp_path, split, why):
    source = tmp_path / "src"
    images(source, {"all": 2})
    refused(tmp_path, source / "all", tmp_path / "out", "--split", split, expect=("split name", "--split", why))
    assert not os.path.exists(tmp_path / "out")


def test_labels_split_follows_the_same_rule(tmp_path):
    source = tmp_path / "src"
    images(source, {"train": 2})
    labels = tmp_path / "labels.csv"
    labels.write_text("x.png,cat\n")
    refused(tmp_path, source, tmp_path / "out", "--labels-file", labels, "--labels-split", "rejects.jsonl",
            expect=("split name 'rejects.jsonl' from --labels-split",))


@pytest.mark.parametrize("name, why", [(" ", "blank"), ("ev\u202eil", "U+202E"), ("cat ", "space")])
def test_class_folder_names_follow_the_same_rule(tmp_path, name, why):
    source = tmp_path / "src"
    images(source, {"train": 2})
    (source / "train" / name).mkdir()
    (source / "train" / name / "x.png").write_bytes(image_factory.tiny_png())
    refused(tmp_path, source, tmp_path / "out", expect=("class name", "rename the folder", why))


def test_a_class_stored_in_nfd_is_named_in_nfc_and_joiners_in_a_class_name_are_kept(tmp_path):
    """Also: a run without files beside the folders writes no ``not_used`` key and prints no "not used" line. (One
    class stored in both forms is refused: tests/test_class_order.py.)"""
    nfc, nfd = unicodedata.normalize("NFC", "Café"), unicodedata.normalize("NFD", "Café")
    assert nfc != nfd
    persian = "\u0645\u06cc\u200c\u0631\u0648\u062f"  # a ZWNJ inside: kept, not a refused invisible character
    source = tmp_path / "src"
    images(source, {"train": 6}, classes=(nfd, "dog", persian))  # copied from a Mac
    images(tmp_path / "other", {"validation": 2}, classes=(nfd, "dog"))
    os.rename(tmp_path / "other" / "validation", source / "validation")
    manifest = ok(source, tmp_path / "out")
    assert manifest["classes"] == [nfc, "dog", persian]
    assert manifest["splits"]["train"]["class_counts"] == {nfc: 2, "dog": 2, persian: 2}
    assert manifest["splits"]["validation"]["class_counts"] == {nfc: 1, "dog": 1, persian: 0}
    assert "not_used" not in manifest and "not used" not in manifest["_output"]


def test_labels_file_names_match_files_in_either_normal_form(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / unicodedata.normalize("NFD", "café.png")).write_bytes(image_factory.tiny_png())
    labels = tmp_path / "labels.csv"
    labels.write_text(unicodedata.normalize("NFC", "filename,label\ncafé.png,Crème\n"))
    manifest = ok(flat, tmp_path / "out", "--labels-file", labels, "--allow-upscale")  # a 1x1 image
    assert manifest["num_examples"] == 1 and manifest["classes"] == [unicodedata.normalize("NFC", "Crème")]


def test_os_litter_in_a_remote_folder_is_listed_once_as_litter_never_also_as_a_file():
    """A remote store (TensorFlow's ``ram://`` here) lists a folder by names: ``Thumbs.db`` there is OS litter,
    as in a local folder, not also a file beside the classes (which listed it twice in ``not_used``)."""
    tf = pytest.importorskip("tensorflow")
    from shardprep.pipelines.sources.folder import list_children

    for name in ("ram://litter_src/cat/a.jpg", "ram://litter_src/Thumbs.db"):
        tf.io.gfile.makedirs(name.rsplit("/", 1)[0])
        with tf.io.gfile.GFile(name, "wb") as f:
            f.write(b"x")
    children = list_children("ram://litter_src")
    assert (children.dirs, children.files, children.litter) == (["cat"], [], [("Thumbs.db", False)])
