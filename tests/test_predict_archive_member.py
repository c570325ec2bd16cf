"""predict reads photo files and a dataset folder, not archive members: ``photos.tar/cat.png`` (or a DATA inside a
.zip) was answered with the system's "Not a directory"; it now says what is wrong and what to do."""

from __future__ import annotations

import tarfile

from test_predict_trust import error_lines, invoke, png, trained  # noqa: F401 - trained: a fixture
from train_helpers import predict_entries


def test_a_photo_inside_an_archive_is_told_as_such(trained, tmp_path):
    data, model, _, _ = trained
    (tmp_path / "cat.png").write_bytes(png(3))
    archive = tmp_path / "photos.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "cat.png", arcname="cat.png")
    member = archive / "cat.png"
    result = invoke(model, data, member)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert predict_entries(result.output) == [
        f"{member}: not classified: {archive} is a file (an archive?), not a folder: predict reads photo files, not "
        "members of an archive; extract it first"]


def test_a_dataset_inside_an_archive_is_told_as_such(trained, tmp_path):
    _, model, _, _ = trained
    archive = tmp_path / "data.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    result = invoke(model, archive / "dataset", tmp_path / "cat.png")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert error_lines(result) == [
        f"Error: DATA {archive / 'dataset'}: {archive} is a file (an archive?), not a folder: predict reads a "
        "prepared dataset's folder, not members of an archive; extract it first"]
