"""Every command whose output cannot be written for another reason than a reader that went away (a full disk:
``> /dev/full``, an I/O error): one line on stderr that says so, and what was done, and exit status 1 (as
coreutils' ``echo hi > /dev/full``); never a traceback or "Exception ignored", and a training run goes on to its end.
A stderr that cannot be written either never turns a good run into a failed one (test_reader_gone.py: ``| head``)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import click
import pytest

from small_sources import two_class_photos as source  # noqa: F401 - a fixture
from validate_helpers import preprocess, run_on_streams
from shardprep import output as cli_output

FULL = "Error: cannot write to standard output: [Errno 28] No space left on device"

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")




@pytest.fixture(scope="module")
def dataset(source, tmp_path_factory):
    output = tmp_path_factory.mktemp("output-full-data") / "out"
    preprocess(source, output, "--shorter-side", "16")  # in this process: the dataset is not what is tested
    return output


def run_shardprep(*args, stdout: str | None = "/dev/full", stderr: str | None = None, env=None) -> tuple[int, str]:
    """Runs ``shardprep ARGS`` with stdout (and, when given, stderr) written to that file; returns the exit status
    and what stderr said (nothing when it is a file)."""
    with open(stdout or os.devnull, "w") as out, open(stderr or os.devnull, "w") as err:
        done = subprocess.run([sys.executable, "-m", "shardprep.cli", *map(str, args)], stdout=out,
                              stderr=err if stderr else subprocess.PIPE, text=True, timeout=300, env=env)
    return done.returncode, done.stderr or ""


def assert_one_error_line(stderr: str, ending: str = "") -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.splitlines()[-1:] == [FULL + ending], stderr


def test_preprocess_to_a_full_disk_says_so_and_that_the_dataset_is_complete(source, tmp_path):
    output = tmp_path / "out"
    status, stderr = run_shardprep("preprocess", source, output, "--quiet", "--shorter-side", "16")
    assert (output / "manifest.json").is_file()
    assert_one_error_line(stderr, f"; the dataset is complete ({output}/manifest.json)")
    assert status == 1


def test_validate_to_a_full_disk_still_tells_the_verdict(dataset):
    status, stderr = run_shardprep("validate", dataset, "--quiet")
    assert_one_error_line(stderr, "; the dataset passed every check")
    assert status == 1


@pytest.mark.parametrize("args", [["--help"], ["preprocess", "--help"], ["--version"]], ids=" ".join)
def test_help_and_version_to_a_full_disk(args):
    status, stderr = run_shardprep(*args)
    assert_one_error_line(stderr)
    assert stderr.count("\n") == 1, stderr
    assert status == 1


def test_demo_data_to_a_full_disk_says_its_files_are_complete(tmp_path):
    status, stderr = run_shardprep("demo-data", tmp_path / "demo", "--train-per-class", "1",
                                   "--validation-per-class", "1")
    assert (tmp_path / "demo" / "train").is_dir()
    assert_one_error_line(stderr, f"; the demo dataset is complete in {tmp_path / 'demo'}")
    assert status == 1


def test_a_stderr_that_cannot_be_written_fails_no_good_run(source, dataset, tmp_path, monkeypatch):
    """``2>/dev/full``: the progress lines (every 0.1 s here) go nowhere; the result is the exit status. One real
    process (its status at exit; each command's ``>/dev/full`` process is above), the other cases in this process
    on real ``/dev/full`` descriptors."""
    env = {**os.environ, "SHARDPREP_PROGRESS_SECONDS": "0.1"}
    summary = tmp_path / "summary.txt"
    status, _ = run_shardprep("preprocess", source, tmp_path / "out", "--shorter-side", "16", stdout=str(summary),
                              stderr="/dev/full", env=env)
    assert status == 0
    assert f"manifest {tmp_path / 'out'}/manifest.json" in summary.read_text()

    def in_process(*args, stdout="/dev/null") -> int:
        with open(stdout, "w", encoding="utf-8") as out, open("/dev/full", "w", encoding="utf-8") as err:
            return run_on_streams(args, out, err)

    monkeypatch.setenv("SHARDPREP_PROGRESS_SECONDS", "0.1")
    assert in_process("validate", dataset) == 0
    assert in_process("validate", tmp_path / "missing") == 1  # its error
    assert in_process("validate", "--no-such-option") == 2  # a usage error
    # Neither stream writable: the work is done, the output lost: 1.
    assert in_process("validate", dataset, stdout="/dev/full") == 1
    assert in_process("preprocess", source, tmp_path / "again", "--shorter-side", "16", stdout="/dev/full") == 1
    assert (tmp_path / "again" / "manifest.json").is_file()


class _FullStream:
    """A stream whose every write fails as a full disk's does (it has no file descriptor to silence)."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        pass


def test_a_reporter_whose_output_fails_goes_on_silently_then_ends_the_command(monkeypatch, capsys):
    report = cli_output.Reporter("on")
    monkeypatch.setattr(sys, "stdout", _FullStream())
    report("epoch 1")
    report("epoch 2")  # not tried again: one note
    assert capsys.readouterr().err == "note: cannot write to standard output ([Errno 28] No space left on device); on\n"
    with pytest.raises(click.ClickException) as raised:
        report.raise_failure("its files are complete")
    assert raised.value.exit_code == 1
    assert raised.value.format_message() == ("cannot write to standard output: [Errno 28] No space left on device; "
                                             "its files are complete")


def test_say_on_a_stderr_that_cannot_be_written_raises_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _FullStream())
    cli_output.say("a note nobody can read", err=True)


def test_train_to_a_full_disk_trains_to_the_end_then_says_so_and_predict_too(colour_dataset, tmp_path, monkeypatch):
    """``train ... > log`` on a full disk: one note when the first line fails, the run goes on to its end and writes
    every file, then the error line and status 1 (it ended with a traceback, the training lost). With stderr full
    too, nothing is said and the status is still 1. ``predict`` answers nothing and says why (a real process: its
    status at exit); to a reader gone, it says nothing and exits 0. The trainings and the reader gone run in this
    process, on real ``/dev/full`` and pipe descriptors: the process is not what they test."""
    import json

    from finished_runs import TINY
    from PIL import Image
    from train_runs import environment

    monkeypatch.chdir(tmp_path)
    statuses = {}
    for run, stderr in (("apart", "apart.err"), ("both", "/dev/full")):
        with open("/dev/full", "w", encoding="utf-8") as out, open(stderr, "w", encoding="utf-8") as err:
            statuses[run] = run_on_streams(["train", colour_dataset, *TINY, "--no-tensorboard", "--output-dir", run],
                                           out, err)
    said = (tmp_path / "apart.err").read_text()
    assert statuses == {"apart": 1, "both": 1}, said
    assert " ".join(said.split()) == (
        "note: cannot write to standard output ([Errno 28] No space left on device); training goes on to the end "
        f"without printing, its files in apart {FULL}; the training run is complete, its files in apart"), said
    for run in ("apart", "both"):
        folder = tmp_path / run
        assert json.loads((folder / "history.json").read_text())["epoch"] == [1], run
        for name in ("summary.json", "model.keras", "checkpoints/last.keras"):
            assert (folder / name).is_file(), (run, name)

    Image.new("RGB", (20, 20), (220, 40, 40)).save(tmp_path / "red.png")
    predict = ["predict", tmp_path / "apart" / "model.keras", colour_dataset, tmp_path / "red.png"]
    status, stderr = run_shardprep(*predict, env=environment("tensorflow"))
    assert_one_error_line(stderr)
    assert status == 1
    # A reader that went away before predict wrote (`predict ... | head -0`): nothing to say, and predict's own status.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", encoding="utf-8") as gone, open(tmp_path / "gone.err", "w+", encoding="utf-8") as err:
        status = run_on_streams(predict, gone, err)
        err.seek(0)
        said = err.read()
    assert "Traceback" not in said and "Exception ignored" not in said, said
    assert status == 0, said
