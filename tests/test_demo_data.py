"""``shardprep demo-data``: regenerating a demo folder deletes only the demo's own files, and the demo carries no
file of shardprep's that the job would have to reject."""

from __future__ import annotations

import hashlib
import os

from click.testing import CliRunner

from shardprep.cli import main as cli


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


def test_the_demo_holds_only_images_and_the_three_broken_files(tmp_path):
    result = demo_data(tmp_path / "demo")
    assert result.exit_code == 0, result.output
    files = tree(tmp_path / "demo")
    assert len(files) == 4 * 3 + 3 and "wrote 15 files" in result.output
    assert not any(os.path.basename(path).startswith(".") for path in files)  # nothing the listing must reject


def test_regenerating_replaces_an_earlier_demo_with_the_same_files(tmp_path):
    assert demo_data(tmp_path / "demo").exit_code == 0
    first = tree(tmp_path / "demo")
    (tmp_path / "demo" / ".shardprep-demo").write_text("an earlier version's marker\n")
    result = demo_data(tmp_path / "demo")
    assert result.exit_code == 0, result.output
    assert tree(tmp_path / "demo") == first


def test_a_folder_holding_other_files_is_refused_and_kept(tmp_path):
    assert demo_data(tmp_path / "demo").exit_code == 0
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
