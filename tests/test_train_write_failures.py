"""Files a training run writes that cannot be written mid-run (a full disk, a read-only folder): one `Error:` line
naming the file, never a traceback, and nothing half written left behind. (Checkpoints and history.json on a full
disk: test_train_checkpoint_crash.py.)"""

from __future__ import annotations

import errno
import json
import os

from click.testing import CliRunner

from file_trees import tree
from finished_runs import TINY
from shardprep.cli import main


def error_lines(result) -> list[str]:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return [line for line in result.output.splitlines() if line.startswith("Error")]


def test_a_full_disk_while_keras_writes_best_keras_leaves_no_half_written_file(colour_dataset, tmp_path,
                                                                               monkeypatch):
    """Keras writes best.keras under best.writing.keras; a disk that fills while it writes left half a zip there
    until the next --resume. It is removed at once (it is the run's own file, made by this save), nothing else in
    checkpoints/ is touched, and the error still names best.keras, the file the user knows."""
    import keras

    output = tmp_path / "run"
    save = keras.Model.save
    before: dict = {}

    def full_disk(model, path, *args, **kwargs):
        if os.path.basename(path) == "best.writing.keras":
            before.update(tree(output / "checkpoints"))  # the step-3 checkpoint: it must stay as it is
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 half a zip")  # Keras opened the file and wrote part of it
            raise OSError(errno.ENOSPC, "No space left on device")  # no filename, as a write() reports it
        return save(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", full_disk)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(output), *TINY,
                                       "--no-tensorboard", "--checkpoint-every-steps", "3"])
    assert error_lines(result) == [
        f"Error: writing {output / 'checkpoints' / 'best.keras'} failed: No space left on device; free some space, "
        "then rerun with --resume to continue from the last checkpoint (--overwrite when there is none)"
    ], result.output
    assert not (output / "checkpoints" / "best.writing.keras").exists()
    assert "last.keras" in before and tree(output / "checkpoints") == before


# TensorFlow's errors as a real read-only logs/ folder (a read-only bind mount) and a real full disk (a 16 KiB tmpfs)
# gave them, measured with TensorFlow 2.21: not OSErrors, and their message names the path before the cause.
OP = "{{function_node __wrapped__%s_device_/job:localhost/replica:0/task:0/device:CPU:0}} "


def tensorboard_summary():
    """The module Keras's TensorBoard callback writes through: ``import tensorflow.summary`` loads another module
    object than ``tf.summary`` gives before it, so that one is patched."""
    import tensorflow.summary as summary

    return summary


def read_only_logs(monkeypatch, folder: str = "validation"):
    """Creating TensorBoard's writer for logs/FOLDER fails as in a logs/ folder made read-only after the run
    started (the validation writer is made at the first epoch end)."""
    import tensorflow as tf

    summary = tensorboard_summary()
    create = summary.create_file_writer

    def writer(logdir, *args, **kwargs):
        if os.path.basename(str(logdir)) == folder:
            raise tf.errors.PermissionDeniedError(None, None, OP % "CreateSummaryFileWriter" + f"{logdir}; Read-only "
                                                  "file system [Op:CreateSummaryFileWriter] name: ")
        return create(logdir, *args, **kwargs)

    monkeypatch.setattr(summary, "create_file_writer", writer)


def test_tensorboard_logs_that_cannot_be_written_mid_run_stop_it_where_it_is_saved(colour_dataset, tmp_path,
                                                                                   monkeypatch):
    """logs/ made read-only after the run started was a TensorFlow traceback at the first epoch end, that epoch
    lost. The epoch is saved first, then one line names the folder, says what is saved and how to go on; --resume
    then goes on from there."""
    output = tmp_path / "run"
    args = ["train", colour_dataset, "--output-dir", str(output), *TINY, "--epochs", "2"]
    read_only_logs(monkeypatch)
    result = CliRunner().invoke(main, args)
    assert error_lines(result) == [
        f"Error: writing TensorBoard's logs failed: {output / 'logs' / 'validation'}: Read-only file system; the run "
        f"is saved after epoch 1 in {output / 'checkpoints' / 'last.keras'}: make {output / 'logs'} writable, then "
        "rerun with --resume (add --no-tensorboard to train on without TensorBoard's logs)"], result.output
    assert json.loads((output / "history.json").read_text())["epoch"] == [1]

    monkeypatch.undo()
    resumed = CliRunner().invoke(main, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((output / "history.json").read_text())["epoch"] == [1, 2]


def test_without_a_checkpoint_the_error_says_start_again_not_resume(colour_dataset, tmp_path, monkeypatch):
    """--resume helps only where a checkpoint is: with --no-checkpoint (or before the first one) it is not offered."""
    output = tmp_path / "run"
    read_only_logs(monkeypatch)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(output), *TINY, "--epochs", "2",
                                       "--no-checkpoint"])
    assert error_lines(result) == [
        f"Error: writing TensorBoard's logs failed: {output / 'logs' / 'validation'}: Read-only file system; nothing "
        f"is saved to resume from (--no-checkpoint): make {output / 'logs'} writable, then start again with "
        "--overwrite (add --no-tensorboard to train without TensorBoard's logs)"], result.output


def test_a_full_disk_for_tensorboard_logs_in_the_last_epoch_leaves_a_complete_run(colour_dataset, tmp_path,
                                                                                  monkeypatch):
    """Nothing is left to train: the run writes model.keras and summary.json, then says the logs are incomplete,
    exit 1, and no --resume (it would train nothing and write no logs)."""
    import tensorflow as tf

    output = tmp_path / "run"
    events = output / "logs" / "train" / "events.out.tfevents.1796248560.host.1.0.v2"

    def full_disk(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, OP % "WriteSummary" + f"{events}; No space left on device"
                                               f"\n\tFailed to flush 11 events to {events}\n\tCould not flush events "
                                               "file. [Op:WriteSummary]")

    monkeypatch.setattr(tensorboard_summary(), "scalar", full_disk)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(output), *TINY])
    assert error_lines(result) == [
        f"Error: writing TensorBoard's logs failed: {events}: No space left on device; the training run is otherwise "
        f"complete, its files in {output}"], result.output
    assert "Summary: 1 epoch" in result.output
    for name in ("model.keras", "summary.json", "checkpoints/last.keras"):
        assert (output / name).is_file(), name
