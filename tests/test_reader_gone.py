"""preprocess and validate whose output's reader went away (``| head``, a closed pipe): the run's result is its
exit status, as without the pipe (click's own handling exited 1 after a complete dataset, and 1 for a dataset that
passed every check: ``validate DATA | head`` read as failed), with no traceback or "Exception ignored"."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from small_sources import two_class_photos as source  # noqa: F401 - a fixture
from validate_helpers import preprocess, run_on_streams


def run_with_gone_reader(*args, stderr_too: bool = False) -> tuple[int, str]:
    """Runs ``shardprep ARGS`` with stdout (and with ``stderr_too`` stderr: ``2>&1 | head``) a pipe whose read end
    is closed before anything is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "shardprep.cli", *map(str, args)], stdout=write_end,
                              stderr=write_end if stderr_too else subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    return done.returncode, done.stderr or ""


def in_process_with_gone_reader(tmp_path, *args) -> tuple[int, str]:
    """``run_with_gone_reader``'s stdout, in this process (stderr to a file): where the process's own exit is
    another test's (``2>&1 | head`` below, a real process for each command)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as gone, open(tmp_path / "err", "w+", encoding="utf-8") as err:
        status = run_on_streams(args, gone, err)
        err.seek(0)
        return status, err.read()


def test_preprocess_whose_reader_went_away_exits_0_after_a_complete_dataset(source, tmp_path):
    status, stderr = in_process_with_gone_reader(tmp_path, "preprocess", source, tmp_path / "out", "--quiet",
                                                 "--shorter-side", "16")
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert status == 0, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def test_validate_whose_reader_went_away_still_tells_the_verdict(source, tmp_path):
    preprocess(source, tmp_path / "out", "--shorter-side", "16")  # in this process: the dataset is not what is tested
    status, stderr = run_with_gone_reader("validate", tmp_path / "out", "--quiet")
    assert status == 0, stderr  # every check passed
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    shards = sorted((tmp_path / "out" / "train").glob("*.tfrecord"))
    shards[0].write_bytes(b"damaged")
    status, stderr = in_process_with_gone_reader(tmp_path, "validate", tmp_path / "out", "--quiet")
    assert status == 1, stderr  # a problem found: 1, as without the pipe


@pytest.mark.parametrize("beam", [[], ["--", "--direct_num_workers=2"]], ids=["in-process", "two-workers"])
def test_preprocess_whose_stderr_reader_went_away_too_exits_0(source, tmp_path, beam):
    """``2>&1 | head``: the progress lines and the workers' held-back stderr (passed on after a run that succeeds)
    meet the closed pipe too; neither fails the finished run (the second became "Error: [Errno 32] Broken pipe")."""
    status, _ = run_with_gone_reader("preprocess", source, tmp_path / "out", "--shorter-side", "16", *beam,
                                     stderr_too=True)
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert status == 0


class _HungUpTerminal:
    """A terminal whose window closed: every write fails with EIO (it has no file descriptor to silence)."""

    def isatty(self):
        return True

    def write(self, text):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def flush(self):
        pass


def test_a_terminal_that_hung_up_is_a_reader_gone_and_ends_nothing(monkeypatch, capsys):
    """EIO from a terminal is its reader gone (its window closed, its ssh connection dropped), as EPIPE from a pipe:
    a run stops printing and ends with its own status. From a file, EIO stays a failed write (a disk's I/O error)."""
    import click

    from shardprep import output as cli_output

    report = cli_output.Reporter("on")
    monkeypatch.setattr(sys, "stdout", _HungUpTerminal())
    report("epoch 1")
    report("epoch 2")
    assert capsys.readouterr().err == "note: the reader of this output went away (the terminal hung up); on\n"
    report.raise_failure("done")  # nothing to raise: the reader went away
    cli_output.say("a line after the work is done")  # silenced, not an error

    class DiskError(_HungUpTerminal):
        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stdout", DiskError())
    report = cli_output.Reporter("on")
    report("epoch 1")
    said = f"note: cannot write to standard output ({OSError(errno.EIO, os.strerror(errno.EIO))}); on\n"
    assert capsys.readouterr().err == said
    with pytest.raises(click.ClickException):
        report.raise_failure("done")
