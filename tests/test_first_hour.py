"""A new user's first hour (issue #16), the output side: no third-party log lines on our commands, errors that say
what a path is, reject details that fit the case, tables that fit 80 columns, and progress lines in a log file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import image_factory
from shardprep.preprocess.checks import streams as quiet_logs
from shardprep.cli import main
from shardprep.preprocess.checks.events import RunCounts
from shardprep.preprocess.sources import labels
from shardprep.preprocess.format import manifest as manifest_lib
from train_helpers import random_images, write_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE_LOG = re.compile(r"I0000|E0000|W0000|oneDNN|cuInit|absl::InitializeLog|cuda drivers")


def user_env(**extra) -> dict:
    """The environment a user's shell has: none of the test suite's TensorFlow quieting."""
    env = {k: v for k, v in os.environ.items() if k not in quiet_logs.ENVIRONMENT}
    env.update(extra)
    return env


def shardprep(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardprep.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=user_env(), timeout=300, **kwargs)


# ---- no TensorFlow or absl log lines -----------------------------------------------------------------------------

def test_train_help_prints_no_tensorflow_log_lines():
    """``train --help`` in a user's environment. (A whole train run in a user's environment, in a real terminal that
    shows its stderr too: test_train_terminal.py's 80-column run asserts the same of everything it prints.)"""
    helped = shardprep("train", "--help")
    assert helped.returncode == 0 and "--epochs" in helped.stdout
    assert not NATIVE_LOG.search(helped.stderr), helped.stderr


def test_verbose_leaves_tensorflow_logging_alone(monkeypatch):
    for name in quiet_logs.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    try:
        assert CliRunner().invoke(main, ["--verbose", "train", "--help"]).exit_code == 0
        assert not any(name in os.environ for name in quiet_logs.ENVIRONMENT)
        assert not any(isinstance(f, quiet_logs._QuietImport) for f in sys.meta_path)
        assert CliRunner().invoke(main, ["train", "--help"]).exit_code == 0
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # a user's own setting wins
        assert CliRunner().invoke(main, ["train", "--help"]).exit_code == 0
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    finally:
        quiet_logs.restore()


def test_a_library_probing_for_tensorflow_does_not_let_its_log_lines_through(tensorflow_child):
    """Other libraries (PyTorch, Keras) ask ``importlib.util.find_spec("tensorflow")`` before any import: the quiet
    import must still catch the real one that follows. (The child, in a user's environment, is shared with
    test_train_reader.py: tensorflow_child.py.)"""
    done = tensorflow_child
    assert done.returncode == 0 and done.stdout_lines[:1] == ["42"], done.stderr
    assert not NATIVE_LOG.search(done.stderr), done.stderr


def test_only_native_log_lines_are_filtered_from_the_import():
    captured = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                "I0000 00:00:1796063803.991698   11321 port.cc:153] oneDNN custom operations are on.\n"
                "E0000 00:00:1796063806.212487   11321 cuda_platform.cc:52] failed call to cuInit: UNKNOWN (303)\n"
                "W0630 12:01:02.000001 99 x.cc:1] something\n"
                "/x/y.py:3: DeprecationWarning: a Python warning stays\n")
    assert quiet_logs.native_log_free(captured) == "/x/y.py:3: DeprecationWarning: a Python warning stays\n"


# ---- a DATA path without a manifest: what is it? ---------------------------------------------------------------

def test_missing_manifest_error_says_what_the_path_is(tmp_path):
    def error(path):
        return manifest_lib.missing_manifest_error(str(path))

    assert error(tmp_path / "nope").kind == "missing" and "does not exist" in str(error(tmp_path / "nope"))
    (tmp_path / "file.txt").write_text("x")
    assert error(tmp_path / "file.txt").kind == "file" and "is a file, not a prepared dataset" in str(
        error(tmp_path / "file.txt"))
    (tmp_path / "empty").mkdir()
    assert error(tmp_path / "empty").kind == "empty" and "empty folder" in str(error(tmp_path / "empty"))

    images = tmp_path / "images"
    image_factory.write_image_folder(images, {"train": 3}, classes=("a", "b"))
    message = str(error(images))
    assert error(images).kind == "image_folder"
    assert f"{images} is an image folder" in message and f"run shardprep preprocess {images} OUTPUT first" in message
    assert "--overwrite" not in message

    leftovers = tmp_path / "leftovers"
    (leftovers / "train").mkdir(parents=True)
    (leftovers / "train" / "train-00000-of-00002.tfrecord").write_bytes(b"x")
    assert error(leftovers).kind == "incomplete" and "not a complete shardprep dataset" in str(error(leftovers))
    spill = tmp_path / "spill"
    (spill / ".tmp").mkdir(parents=True)
    assert error(spill).kind == "incomplete"

    dataset = tmp_path / "dataset"
    write_dataset(dataset, {"train": random_images(2, 4, 4)}, classes=["a", "b"])
    assert error(dataset / "train").kind == "inside_dataset" and f"give {dataset}" in str(error(dataset / "train"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    assert error(other).kind == "other" and "not a prepared dataset" in str(error(other))


def test_train_on_an_image_folder_says_run_preprocess_first(tmp_path):
    images = tmp_path / "images"
    image_factory.write_image_folder(images, {"train": 2}, classes=("a", "b"))
    result = CliRunner().invoke(main, ["train", str(images), "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(error_lines) == 1 and "is an image folder" in error_lines[0], result.output
    assert "run shardprep preprocess" in error_lines[0] and "--overwrite" not in error_lines[0]


# ---- rejects without --labels-file --------------------------------------------------------------------------------

def test_no_label_reject_says_whether_a_labels_file_was_given():
    files = [("val", "val/a.JPEG", "/src/val/a.JPEG")]
    (_, (_, _, reason, detail)), = labels.join(files, [], "val", labels_file_given=False)
    assert reason == "no_label" and "no --labels-file was given" in detail and "labels file" not in detail.replace(
        "--labels-file", "")
    (_, (_, _, reason, detail)), = labels.join(files, [], "val", labels_file_given=True)
    assert reason == "no_label" and detail == "a.JPEG is not in the labels file"


# ---- tables that fit 80 columns -----------------------------------------------------------------------------------

def _console():
    from rich.console import Console

    return Console(width=80, record=True, force_terminal=False)


def _assert_fits(text: str, *whole: str):
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    for word in whole:
        assert word in text, (word, text)


def test_preprocess_summary_fits_80_columns_and_names_every_reason_whole():
    from shardprep.commands.preprocess import print_summary

    def split(inputs, written, shards, reasons):
        return {"num_inputs": inputs, "num_examples": written, "num_rejected": inputs - written,
                "rejected_by_reason": reasons, "num_shards": shards,
                "shards": [{"num_examples": 1251, "num_bytes": 150_123_456},
                           {"num_examples": 1252, "num_bytes": 150_223_456}]}

    reasons = {"empty_file": 1, "truncated": 2, "too_many_pixels": 3, "record_too_large": 1, "hidden_folder": 1,
               "symlinked_folder": 1, "case_mismatch": 1, "not_an_image": 3_000}
    manifest = {"splits": {"train": split(1_281_167, 1_278_157, 1024, reasons),
                           "validation": split(50_000, 49_999, 32, {"no_label": 1})},
                "num_inputs": 1_331_167, "num_examples": 1_328_156, "num_rejected": 3_011, "classes": ["a"] * 1000,
                "encoding": "raw", "crop": "center", "shorter_side": 256, "mean_rgb": [1.0, 2.0, 3.0],
                "std_rgb": [4.0, 5.0, 6.0]}
    out = _console()
    output = "/data/imagenet/shards-256-raw-center-crops/with/a/long/path/that/does/not/fit/in/one/row/x"
    print_summary(manifest, 3600.0, output, out=out)
    text = out.export_text()
    assert f"manifest {output}/manifest.json" in text  # a path is never broken by the console
    _assert_fits("\n".join(line for line in text.splitlines() if output not in line),
                 "validation", "1,281,167", "1,278,157", "3,010", "1,024", "1,251–1,252", "150.1–150.2",
                 "1,331,167", *(f"{reason} {n:,}" for reason, n in reasons.items()), "no_label 1")


def _foreign_report(classes):
    summary = {"num_examples": 12, "num_files": 2, "num_readable_images": 12, "num_labels": 3,
               "image_sizes": {"num_distinct": 1, "min_height": 8, "max_height": 8, "min_width": 8, "max_width": 8},
               "image_formats": {"JPEG": 12}, "image_modes": {"RGB": 12}, "label_counts": {"0": 4, "1": 4, "2": 4}}
    report = {"kind": "tfrecord", "data": "tfrecord:/x/*.tfrecord", "ok": True, "splits": {"train": summary},
              "problems": [], "problem_counts": {}, "elapsed_seconds": 1.0}
    if classes:
        report["classes"] = classes
    return report


def test_validate_report_fits_80_columns():
    from shardprep.commands import validate

    long_class = "n02085620-Chihuahua_and_other_small_dogs_of_mexico_and_beyond"
    summary = {"num_examples": 3, "expected_num_examples": 3, "num_shards": 1, "expected_num_shards": 1,
               "image_sizes": {"most_common": {"8x8": 3}}, "mean_rgb": [1, 2, 3], "std_rgb": [1, 2, 3],
               "class_counts": {"cat": 1, long_class: 2}, "expected_class_counts": {"cat": 1, long_class: 1}}
    path = "/data/a/long/dataset/path/train/train-00000-of-00001.tfrecord"
    report = {"kind": "dataset", "data": "/data/x", "ok": False, "splits": {"train": summary},
              "problems": [{"check": "class_count_mismatch", "split": "train", "file": path, "index": 1_234_567,
                            "message": "the manifest says 1 record of class " + long_class + ", the shards hold 2"}],
              "problem_counts": {"class_count_mismatch": 1}, "elapsed_seconds": 1.0}
    out = _console()
    original = validate.make_console
    validate.make_console = lambda: out
    try:
        validate.print_report(report, None)
        validate.print_report(_foreign_report(["cat", "dog", "bird"]), None)
    finally:
        validate.make_console = original
    text = out.export_text()
    _assert_fits(text, "class_count_mismatch", "1234567", "FAILED")
    assert long_class[:20] in text  # folded onto the next line where it does not fit, never cut
    for name in ("cat", "dog", "bird"):
        assert f" {name} " in text


def test_foreign_report_without_class_names_shows_labels_only():
    from shardprep.commands import validate

    out = _console()
    original = validate.make_console
    validate.make_console = lambda: out
    try:
        validate.print_report(_foreign_report(None), None)
    finally:
        validate.make_console = original
    assert "class" not in out.export_text().split("┏", 1)[1].split("\n", 2)[1]


# ---- progress in a log file ---------------------------------------------------------------------------------------

def test_preprocess_writes_plain_progress_lines_to_a_log_file_while_it_runs(tmp_path):
    source = tmp_path / "images"
    image_factory.write_image_folder(source, {"train": 40, "validation": 8}, classes=("a", "b"))
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        process = subprocess.Popen(
            [sys.executable, "-m", "shardprep.cli", "preprocess", str(source), str(tmp_path / "out"),
             "--shorter-side", "16", "--", "--direct_running_mode=in_memory", "--direct_num_workers=1"],
            cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=user_env(SHARDPREP_PROGRESS_SECONDS="0.2"))
        try:
            deadline = time.monotonic() + 120
            seen_while_running = False
            while process.poll() is None and time.monotonic() < deadline:
                if re.search(r"^(listing|images) ", log.read_text(), re.M):
                    seen_while_running = process.poll() is None
                    break
                time.sleep(0.05)
            assert process.wait(timeout=300) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text()
    assert seen_while_running, text
    assert re.search(r"^images 48/48 \(100%\), [\d,]+ img/s, \d+:\d\d:\d\d$", text, re.M), text
    assert "###" not in text and "\r" not in text and "\x1b[" not in text  # no bar drawn at the end
    assert text.index("images 48/48") < text.index("shardprep preprocess →")


def test_plain_progress_lines_come_every_interval(monkeypatch, capsys):
    from shardprep import output as display
    from shardprep.commands.preprocess import _ProgressDisplay

    monkeypatch.setenv(display.PROGRESS_SECONDS_ENV, "1000")
    progress = _ProgressDisplay(enabled=True)
    with progress:
        progress.update(RunCounts(listed=303, processed=0))
        progress.update(RunCounts(listed=303, processed=120))  # within the interval: no line
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) in (2, 3) and lines[0].startswith("listing, 303 listed")  # (3: the last at the end)
    assert re.fullmatch(r"images 120/303 \(40%\), [\d,]+ img/s, \d+:\d\d:\d\d", lines[1]), lines  # no ETA yet
