"""One class-order rule on every route: a class's label is its index among the names sorted as stored, by code
point (torchvision's ``ImageFolder``: ``sorted(entry.name for entry in os.scandir(root) if entry.is_dir())``), for a
folder, a tar, a zip, a ``.tgz`` and Parquet alike; a list the dataset or the user gives (``--classes FILE``) wins."""

from __future__ import annotations

import io
import os
import unicodedata

import pytest
from source_routes import write_archive, write_hub_parquet
from click.testing import CliRunner
from PIL import Image

from shardprep.cli import main as cli
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.checks import names
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.sources.common import SourceError

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]
# Integers ("10" before "2", "007" first), case ("B" before "a"), a leading underscore, a non-ASCII name.
INTEGER_NAMES = ("2", "10", "1", "007")
CLASS_NAMES = INTEGER_NAMES + ("a", "B", "Z", "_x", "é", "Ab")
# A Mac's spelling: "u" + combining diaeresis sorts before "v" as stored; in NFC ("\xfc") it would sort after "v".
# (Beside CLASS_NAMES' "é", stored in NFC: one tree holds both spellings of non-ASCII names.)
DECOMPOSED_NAMES = (unicodedata.normalize("NFD", "ü"), "v", "u")
SPLITS = ("train", "val")


def png(index: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (10 + index % 3, 12), (40 * index % 256, 90, 200)).save(out, "PNG")
    return out.getvalue()


def write_tree(root, class_names=CLASS_NAMES) -> dict[str, bytes]:
    """SPLIT/CLASS/CLASS_N.png for every split and class; {relative path: bytes}."""
    files = {}
    for split in SPLITS:
        for index, name in enumerate(class_names):
            for n in range(2):
                files[f"{split}/{name}/{name}_{n}.png"] = png(index + n)
    for relative, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, relative)), exist_ok=True)
        with open(os.path.join(root, relative), "wb") as f:
            f.write(data)
    return files


def torchvision_classes(root) -> list[str]:
    """torchvision's ``ImageFolder.find_classes``, per split (each split here holds every class)."""
    found = {split: sorted(entry.name for entry in os.scandir(os.path.join(root, split)) if entry.is_dir())
             for split in SPLITS}
    assert found["train"] == found["val"]
    return found["train"]


def preprocess(source: str, output: str, *options: str):
    return CliRunner().invoke(cli, ["preprocess", source, output, "--shorter-side", "8", *options, *IN_PROCESS],
                              catch_exceptions=False)


def labelled_pairs(output: str, class_of: dict[str, str] | None = None,
                   stored: dict[str, str] | None = None) -> set[tuple[str, str, int]]:
    """(split, the class folder a record's file came from, its label) for every record written; ``class_of``: the
    class of a record's file name where the name does not say it (a Parquet row's); ``stored``: a split's name in
    the output where the route renames it (a folder of archives: val.zip is ``validation``)."""
    document = Manifest.from_json(manifest_lib.read_document(output))
    pairs = set()
    for split in SPLITS:
        for relative in document.shard_files((stored or {}).get(split, split)):
            with open(os.path.join(output, relative), "rb") as f:
                for data in tfrecord_io.read_records(f):
                    record = record_format.decode_example(data)
                    name = (class_of[record.filename] if class_of is not None
                            else os.path.basename(record.filename).rsplit("_", 1)[0])
                    pairs.add((split, names.canonical(name), record.label))
    return pairs


ROUTES = ("folder", "tar", "zip", "tgz", "parquet")


# Each route lists its names its own way (NFD ones too), then one rule orders them: names of integers only (no
# numeric sort) take that rule on one route; the mixed names and the decomposed ones, in one tree that holds those
# integers too, take every route (one run a route: the rule is one path, whatever names it orders).
@pytest.mark.parametrize("class_names, routes", [(INTEGER_NAMES, ROUTES[:1]), (CLASS_NAMES + DECOMPOSED_NAMES, ROUTES)],
                         ids=["integers", "mixed-and-decomposed"])
def test_folder_tar_zip_tgz_and_parquet_give_torchvision_s_name_index_pairs(tmp_path, class_names, routes):
    files = write_tree(tmp_path / "folder", class_names)
    expected = torchvision_classes(tmp_path / "folder")
    assert expected.index("007") < expected.index("10") < expected.index("2")
    sources = {"folder": str(tmp_path / "folder")}
    for suffix in ("tar", "zip", "tgz"):
        sources[suffix] = str(tmp_path / f"photos.{suffix}")
        write_archive(sources[suffix], files)
    class_of = write_hub_parquet(tmp_path / "hub", files, expected)
    sources["parquet"] = f"parquet:{tmp_path / 'hub' / 'data' / '*.parquet'}"
    want = {(split, names.canonical(name), expected.index(name)) for split in SPLITS for name in class_names}
    for route in routes:
        source = sources[route]
        output = str(tmp_path / f"out-{route}")
        result = preprocess(source, output)
        assert result.exit_code == 0, (route, result.output)
        assert manifest_lib.read_document(output)["classes"] == [names.canonical(name) for name in expected], route
        assert labelled_pairs(output, class_of if route == "parquet" else None) == want, route


@pytest.mark.parametrize("suffix, macos", [("zip", False), ("tgz", False), ("zip", True)])
def test_a_folder_of_split_archives_each_wrapping_its_split_folder_gives_the_folder_s_pairs(tmp_path, suffix, macos):
    """``zip -r train.zip train/``: each split's archive holds its split's folder (a Mac's zip: __MACOSX/ and ._
    files beside). The split folder is looked through (it was made the one class of its split: classes train and
    val, exit 0)."""
    files = write_tree(tmp_path / "folder", INTEGER_NAMES)
    expected = torchvision_classes(tmp_path / "folder")
    os.makedirs(tmp_path / "download")
    for split in SPLITS:
        members = {name: data for name, data in files.items() if name.startswith(split + "/")}
        if macos:
            members.update({f"__MACOSX/{os.path.dirname(name)}/._{os.path.basename(name)}": b"\0\5\26\7"
                            for name in list(members)})
        write_archive(str(tmp_path / "download" / f"{split}.{suffix}"), members)
    result = preprocess(str(tmp_path / "download"), str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert manifest_lib.read_document(str(tmp_path / "out"))["classes"] == expected
    want = {(split, name, expected.index(name)) for split in SPLITS for name in INTEGER_NAMES}
    assert labelled_pairs(str(tmp_path / "out"), stored={"val": "validation"}) == want


def test_a_split_s_archive_holding_another_split_s_folder_is_refused(tmp_path):
    files = write_tree(tmp_path / "folder", ("a", "b"))
    os.makedirs(tmp_path / "download")
    write_archive(str(tmp_path / "download" / "train.zip"),
                  {name: data for name, data in files.items() if name.startswith("train/")})
    write_archive(str(tmp_path / "download" / "val.zip"),
                  {name.replace("val/", "train/", 1): data for name, data in files.items() if name.startswith("val/")})
    result = preprocess(str(tmp_path / "download"), str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "val.zip holds split validation's images, yet its folder train is named like another split" in " ".join(
        result.output.split())


@pytest.mark.parametrize("suffix", ["zip", "tgz"])
def test_an_archive_of_one_folder_holding_split_folders_and_a_licence_is_refused_as_the_folder_is(tmp_path, suffix):
    """mydata/{train,val}/<class>/ and LICENSE.txt at the top: as a folder, refused naming mydata; as an archive it
    was one class, mydata, holding every split's images (exit 0)."""
    files = write_tree(tmp_path / "folder", ("a", "b"))
    archive = tmp_path / f"lic.{suffix}"
    write_archive(str(archive), {**{f"mydata/{name}": data for name, data in files.items()}, "LICENSE.txt": b"MIT\n"})
    result = preprocess(str(archive), str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert (f"{archive} holds one folder, mydata, which holds split folders (train, val): give {archive}/mydata as "
            "SOURCE") in " ".join(result.output.split())
    result = preprocess(f"{archive}/mydata", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert manifest_lib.read_document(str(tmp_path / "out"))["classes"] == ["a", "b"]


def test_class_order_sorts_the_names_as_stored_by_code_point():
    assert names.class_order(["2", "10", "1", "10"], "here") == ["1", "10", "2"]
    decomposed = unicodedata.normalize("NFD", "é")  # e + combining accent: sorts with "e", before "f"
    assert names.class_order([decomposed, "f", "ea"], "here") == ["ea", "é", "f"]  # shown in NFC, stored order


def test_one_class_stored_in_two_unicode_forms_is_refused_naming_both(tmp_path):
    for spelling in (unicodedata.normalize("NFC", "Café"), unicodedata.normalize("NFD", "Café")):
        os.makedirs(tmp_path / "photos" / spelling)
        (tmp_path / "photos" / spelling / f"{len(spelling)}.png").write_bytes(png(len(spelling)))
    result = preprocess(str(tmp_path / "photos"), str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "stored twice" in result.output and "'Caf\\xe9'" in result.output and "'Cafe\\u0301'" in result.output
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_classes_file_gives_the_order_and_must_name_every_class(tmp_path):
    files = write_tree(tmp_path / "folder")
    order = list(reversed(CLASS_NAMES)) + ["unseen"]
    (tmp_path / "classes.txt").write_text("\ufeff" + "\r\n".join(order) + "\r\n", encoding="utf-8")
    write_archive(str(tmp_path / "photos.zip"), files)
    for source in (str(tmp_path / "folder"), str(tmp_path / "photos.zip")):
        output = str(tmp_path / f"out-{os.path.basename(source)}")
        result = preprocess(source, output, "--classes", str(tmp_path / "classes.txt"))
        assert result.exit_code == 0, result.output
        document = manifest_lib.read_document(output)
        assert document["classes"] == order and document["options"]["classes_file"] == str(tmp_path / "classes.txt")
        assert labelled_pairs(output) == {(split, name, order.index(name)) for split in SPLITS for name in CLASS_NAMES}
    (tmp_path / "short.txt").write_text("\n".join(CLASS_NAMES[:-2]) + "\n")
    result = preprocess(str(tmp_path / "folder"), str(tmp_path / "out-short"), "--classes", str(tmp_path / "short.txt"))
    assert result.exit_code == 2 and "does not name 2 classes found in the folder" in result.output
    assert "'é'" in result.output and "'Ab'" in result.output
    (tmp_path / "twice.txt").write_text("\n".join(CLASS_NAMES + ("a",)) + "\n")
    result = preprocess(str(tmp_path / "folder"), str(tmp_path / "out-twice"), "--classes", str(tmp_path / "twice.txt"))
    assert result.exit_code == 2 and "names the class 'a' twice" in result.output


def test_classes_file_is_refused_by_name_where_the_source_ships_its_list(tmp_path):
    files = write_tree(tmp_path / "folder")
    write_hub_parquet(tmp_path / "hub", files, sorted(CLASS_NAMES))
    (tmp_path / "classes.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    result = preprocess(f"parquet:{tmp_path / 'hub' / 'data' / '*.parquet'}", str(tmp_path / "out"),
                        "--classes", str(tmp_path / "classes.txt"))
    assert result.exit_code == 2 and "--classes is for folder and archive sources" in result.output
    result = preprocess(str(tmp_path / "folder"), str(tmp_path / "out"), "--classes", str(tmp_path / "missing.txt"))
    assert result.exit_code == 2 and "--classes" in result.output and "does not exist" in result.output


def test_a_class_listed_twice_is_refused():
    with pytest.raises(SourceError, match="names the class 'x' twice"):
        names.class_order(["x"], "here", ["x", "x"], "the list")

