"""pipelines/storage.atomic_write: a file appears whole under its name, or not at all."""

from __future__ import annotations

import hashlib
import os

import pytest

from shardprep.pipelines.runtime import progress, storage


def test_bytes_and_chunks_are_written_whole_and_counted(tmp_path):
    path = str(tmp_path / "folder" / "file.bin")
    assert storage.atomic_write(path, b"abc") == (3, 1, hashlib.sha256(b"abc").hexdigest())
    assert open(path, "rb").read() == b"abc"
    written = storage.atomic_write(path, (chunk for chunk in [b"12", b"", b"345"]))  # replaces the old file
    assert written == storage.Written(5, 3, hashlib.sha256(b"12345").hexdigest())
    assert open(path, "rb").read() == b"12345"
    assert os.listdir(tmp_path / "folder") == ["file.bin"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_bytes(b"old")

    def chunks():
        yield b"new, but"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        storage.atomic_write(str(path), chunks())
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_the_temporary_name_sits_beside_the_final_one_and_counts_as_deletable(tmp_path):
    temporary = storage.temporary_path("gs://bucket/out/train/train-00000-of-00001.tfrecord")
    folder, name = temporary.rsplit("/", 1)
    assert folder == "gs://bucket/out/train"
    assert name.startswith(storage.TEMPORARY_PREFIX) and name.endswith("-train-00000-of-00001.tfrecord")
    assert storage.deletable("train/" + name)


def test_progress_files_are_written_whole_and_temporaries_are_not_counted(tmp_path):
    reporter = progress.ProgressReporter(str(tmp_path), "processed")
    reporter.add(7)
    reporter.flush()
    (tmp_path / f"{storage.TEMPORARY_PREFIX}0123-processed-1-x").write_text("99")  # a write still going
    assert progress.read_progress(str(tmp_path)) == {"processed": 7}
