"""``shardprep demo-data``: regenerating a demo folder deletes only the demo's own files, and the demo carries no
file of shardprep's that the job would have to reject."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardprep.cli import main as cli
from shardprep.demo import KINDS, draw_shape, encode


def demo_data(*args):
    return CliRunner().invoke(cli, ["demo-data", *map(str, args), "--train-per-class", "2",
                                    "--validation-per-class", "1"])


def tree(root) -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One demo written by the command: (its folder, the command's result). Tests that start from an existing demo
    copy it (generating the images is most of the command's time)."""
    folder = tmp_path_factory.mktemp("written") / "demo"
    return folder, demo_data(folder)


@pytest.fixture
def demo(written, tmp_path):
    """A copy of the written demo at ``tmp_path/demo``, as if demo-data had written it there."""
    shutil.copytree(written[0], tmp_path / "demo", symlinks=True)
    return tmp_path / "demo"


def test_the_demo_holds_only_images_and_the_three_broken_files(written):
    folder, result = written
    assert result.exit_code == 0, result.output
    files = tree(folder)
    assert len(files) == 4 * 3 + 3 and "wrote 15 files" in result.output
    assert not any(os.path.basename(path).startswith(".") for path in files)  # nothing the listing must reject


def test_regenerating_replaces_an_earlier_demo_with_the_same_files_and_keeps_an_empty_folder_of_the_user(demo):
    first = tree(demo)
    (demo / ".shardprep-demo").write_text("an earlier version's marker\n")
    (demo / "notes").mkdir()
    result = demo_data(demo)
    assert result.exit_code == 0, result.output
    assert tree(demo) == first
    assert os.path.isdir(demo / "notes")


def test_a_folder_holding_other_files_is_refused_and_kept(tmp_path, demo):
    (tmp_path / "demo" / "train" / "circle" / "my_photo.jpg").write_bytes(b"mine")
    before = tree(tmp_path / "demo")
    result = demo_data(tmp_path / "demo")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: {tmp_path / 'demo'} holds train/circle/my_photo.jpg, which demo-data did not write; choose a new or "
        "empty folder for the demo dataset"]
    assert tree(tmp_path / "demo") == before


def test_a_folder_of_someone_elses_files_is_refused_and_kept(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "mine" / ".hidden").write_text("me too")
    result = demo_data(tmp_path / "mine")
    assert result.exit_code == 1 and "holds .hidden and 1 more files" in result.output
    assert tree(tmp_path / "mine") == {"notes.txt": hashlib.sha256(b"keep me").hexdigest(),
                                        ".hidden": hashlib.sha256(b"me too").hexdigest()}


def assert_one_error(result, *fragments):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_folder_under_a_dangling_link_is_one_error_line(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for target in (tmp_path / "dangling", tmp_path / "dangling" / "demo"):
        assert_one_error(demo_data(target), f"{tmp_path / 'dangling'} is a dangling link (to {tmp_path / 'nowhere'}",
                         "does not exist")
    assert not os.path.lexists(tmp_path / "nowhere")


def test_a_file_where_the_folder_goes_or_above_it_is_one_error_line_and_kept(tmp_path):
    (tmp_path / "afile").write_text("mine")
    assert_one_error(demo_data(tmp_path / "afile"), "afile is a file, not a folder", "demo dataset")
    assert_one_error(demo_data(tmp_path / "afile" / "demo"), "cannot be created: ", "afile is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "mine"


def test_links_fifos_and_folders_named_like_demo_files_are_refused_and_kept(tmp_path, demo):
    victim = tmp_path / "victim.jpg"
    victim.write_bytes(b"mine")
    circle = tmp_path / "demo" / "train" / "circle"
    names = sorted(os.listdir(circle))
    os.remove(circle / names[0])
    os.symlink(victim, circle / names[0])  # a link where a demo image was
    for plant in ("fifo", "folder"):
        os.remove(circle / names[1])
        (os.mkfifo if plant == "fifo" else os.mkdir)(circle / names[1])
        before = {path: os.lstat(path).st_mode for path in (circle / names[0], circle / names[1])}
        assert_one_error(demo_data(tmp_path / "demo"), "which demo-data did not write")
        assert {path: os.lstat(path).st_mode for path in before} == before
        assert victim.read_bytes() == b"mine" and os.path.islink(circle / names[0])
        (os.remove if plant == "fifo" else os.rmdir)(circle / names[1])
        (circle / names[1]).write_bytes(b"demo")


def test_a_linked_split_folder_is_refused_and_what_it_points_to_kept(tmp_path, demo):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "circle_000.jpg").write_bytes(b"mine")
    os.rename(tmp_path / "demo" / "validation", tmp_path / "old-validation")
    os.symlink(mine, tmp_path / "demo" / "validation")
    assert_one_error(demo_data(tmp_path / "demo"), "validation/", "which demo-data did not write")
    assert (mine / "circle_000.jpg").read_bytes() == b"mine" and os.listdir(mine) == ["circle_000.jpg"]


def test_most_demo_images_are_at_least_the_default_shorter_side(tmp_path):
    """README's first command preprocesses the demo at the default --shorter-side: no small-input stop."""
    from shardprep import demo
    from shardprep.preprocess.format.config import default
    from shardprep.preprocess.image.input_sizes import median_size
    from PIL import Image

    demo.write_demo_dataset(str(tmp_path), train_per_class=20, validation_per_class=5)
    sizes = []
    for folder, _, files in os.walk(tmp_path):
        for name in files:
            try:
                with Image.open(os.path.join(folder, name)) as image:
                    sizes.append(image.size)
            except Exception:  # noqa: BLE001 - the demo's three broken files
                pass
    assert min(median_size(sizes)) >= default("shorter_side") > min(min(size) for size in sizes)  # some upscaled


def test_demo_data_says_how_far_it_is_while_it_writes(tmp_path, monkeypatch):
    """~15 s of drawing images: a progress line (a spinner in a terminal), not silence."""
    from click.testing import CliRunner

    from shardprep.cli import main

    monkeypatch.setenv("SHARDPREP_PROGRESS_SECONDS", "0")
    result = CliRunner().invoke(main, ["demo-data", str(tmp_path / "d"), "--train-per-class", "2",
                                       "--validation-per-class", "1"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("writing the demo images")]
    assert lines and lines[0].startswith("writing the demo images 1/15"), result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_every_demo_kind_encodes_without_a_deprecation_warning(kind):
    """Pillow 12 deprecates fromarray's mode argument for a change of data type (gone in Pillow 13): no kind uses it."""
    image = draw_shape("circle", 40, 30, np.random.default_rng(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = encode(image, kind)
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.size in ((40, 30), (30, 40))  # the EXIF-rotated kind is stored on its side


def test_a_write_that_fails_midway_is_one_error_line(tmp_path, monkeypatch):
    """A full disk, or a path too long for the system once a class folder is added: an Error line naming the path,
    not a traceback; a rerun into a roomier place replaces what was written (demo files only)."""
    import errno
    import pathlib

    long_path = tmp_path.joinpath(*["a" * 200] * 19)
    long_path = long_path / ("b" * (4090 - len(str(long_path / "train"))))  # DIR/train fits, DIR/train/circle not
    assert_one_error(demo_data(long_path), "cannot write the demo dataset: ", "train", "File name too long")

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(pathlib.Path, "write_bytes", disk_full)
    assert_one_error(demo_data(tmp_path / "full"), "No space left on device", "circle_000", "demo dataset")
    monkeypatch.undo()
    assert demo_data(tmp_path / "full").exit_code == 0
