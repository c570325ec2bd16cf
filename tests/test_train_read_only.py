"""A run folder `shardprep train` cannot write into: refused before training starts (and before --overwrite
deletes anything), one `Error:` line naming the folder. A read-only checkpoints/ was found only after a whole epoch
("writing run/checkpoints/last.keras failed: Read-only file system"), a read-only logs/ folder was a 60-line
TensorFlow traceback, and --overwrite, stopped half way, named the file it could not delete without its folder."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
from click.testing import CliRunner

from file_trees import tree
from finished_runs import TINY
from shardprep.cli import main
from shardprep.train.run import loop


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(loop, "train", lambda *_, **__: pytest.fail("training started"))


def one_error_line(args) -> str:
    result = CliRunner().invoke(main, ["train", *map(str, args)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize("folder", ["checkpoints", "logs", "logs/train", "logs/validation"])
@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_a_folder_of_the_run_that_cannot_be_written_is_refused_before_anything_happens(
        colour_dataset, run_copy, monkeypatch, no_training, folder, flag):
    """os.access made to say no for the folder (root writes anywhere, so chmod cannot show it)."""
    locked = str(run_copy / folder)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path) == locked
                        else real_access(path, mode, **kw))
    before = tree(run_copy)
    line = one_error_line([colour_dataset, "--output-dir", run_copy, *TINY, flag])
    assert line == (f"Error: --output-dir {run_copy}: cannot write into {locked} (permission denied), where the run "
                    "writes its files; make it writable or choose another --output-dir"), line
    assert tree(run_copy) == before, "nothing deleted or written"


def test_a_read_only_checkpoints_folder_is_refused_before_the_first_epoch(colour_dataset, run_copy, no_training):
    """A real read-only mount (a bind mount of the folder, remounted read-only): the reason says so."""
    folder = run_copy / "checkpoints"
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        line = one_error_line([colour_dataset, "--output-dir", run_copy, *TINY, "--epochs", "2", "--resume"])
    finally:
        subprocess.run(["umount", str(folder)], check=True)
    assert f"cannot write into {folder} (read-only file system)" in line, line


def test_a_file_overwrite_cannot_delete_is_named_with_its_folder(colour_dataset, run_copy, monkeypatch, no_training):
    """It said "--overwrite: deleting best.keras failed", without the folder (the file is removed by name inside an
    open folder)."""
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path) == "best.keras":
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    line = one_error_line([colour_dataset, "--output-dir", run_copy, *TINY, "--overwrite"])
    assert line == (f"Error: --overwrite: deleting {run_copy / 'checkpoints' / 'best.keras'} failed: Read-only "
                    "file system"), line


def test_a_best_writing_keras_that_cannot_be_removed_is_named(colour_dataset, run_copy, monkeypatch):
    """A killed run's half-written best.writing.keras is removed before training; when that fails the error said
    "writing run/checkpoints/best.keras failed", a file nothing was writing."""
    from shardprep.train.run import checkpoints

    leftover = run_copy / "checkpoints" / "best.writing.keras"
    leftover.write_bytes(b"PK\x03\x04 half a zip")
    real_remove = os.remove

    def remove(path, *args, **kwargs):
        if str(path) == str(leftover):
            raise OSError(errno.EACCES, "Permission denied", str(path))
        return real_remove(path, *args, **kwargs)

    monkeypatch.setattr(checkpoints.os, "remove", remove)
    line = one_error_line([colour_dataset, "--output-dir", run_copy, *TINY, "--epochs", "2", "--resume"])
    assert line == (f"Error: deleting {leftover} (a half-written temporary file of the run) failed: Permission "
                    "denied"), line
