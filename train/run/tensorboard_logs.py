"""TensorBoard's logs that cannot be written (a full disk, a read-only ``logs/``): :class:`TensorBoardLogs` keeps the
first failure instead of a traceback; the epoch loop ends the run once its work is saved, with one line saying what
is saved and how to go on.
"""

from __future__ import annotations

import errno
import re
import sys
from typing import NamedTuple

import keras

from shardprep.train.run.checkpoints import RunFileError


class LogsFailure(NamedTuple):
    """A write of TensorBoard's logs that failed: the path, the cause, and what to do before running again."""

    where: str
    cause: str
    fix: str


class LogsError(RunFileError):
    """TensorBoard's logs could not be written; the message is one line for the user."""


def write_failure(error: BaseException, logs: str) -> LogsFailure | None:
    """The write failure ``error`` is (an OSError, or TensorFlow's ``{{op}} PATH; CAUSE [Op:NAME]``), else None."""
    tf = sys.modules.get("tensorflow")  # loaded when the callback wrote: tf.summary is TensorFlow's
    if isinstance(error, OSError):
        where, cause = str(error.filename or logs), error.strerror or str(error)
        space = error.errno in (errno.ENOSPC, errno.EDQUOT)
        denied = error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    elif tf is not None and isinstance(error, tf.errors.OpError):
        line = (error.message or "").split("\n", 1)[0]
        line = re.sub(r"\s*\[Op:.*$", "", re.sub(r"^\{\{.*?\}\}\s*", "", line)).strip()
        where, _, cause = line.rpartition("; ")
        where, cause = (where, cause) if where and cause else (logs, line or type(error).__name__)
        space = isinstance(error, tf.errors.ResourceExhaustedError)
        denied = isinstance(error, tf.errors.PermissionDeniedError)
    else:
        return None
    fix = "free some space" if space else f"make {logs} writable" if denied else f"check that {logs} can be written"
    return LogsFailure(where, cause, fix)


def _writes(name: str):
    """Keras's TensorBoard hook ``name``, writing until the first failure (:meth:`TensorBoardLogs._guarded`)."""
    hook = getattr(keras.callbacks.TensorBoard, name)

    def writing(self, *args, **kwargs):
        if self.failure is None:
            self._guarded(hook, self, *args, **kwargs)

    return writing


class TensorBoardLogs(keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback into ``logs``, its first failure to write kept in ``failure``, not raised."""

    def __init__(self, logs: str, **options):
        super().__init__(log_dir=logs, write_graph=False, **options)
        self.logs = logs
        self.failure: LogsFailure | None = None

    def _guarded(self, hook, *args, **kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - TensorFlow's errors; any other is raised again
            failure = write_failure(error, self.logs)
            if failure is None:
                raise
            self.failure = self.failure or failure

    on_train_begin, on_epoch_begin, on_epoch_end = _writes("on_train_begin"), _writes("on_epoch_begin"), \
        _writes("on_epoch_end")
    on_train_batch_begin, on_train_batch_end = _writes("on_train_batch_begin"), _writes("on_train_batch_end")
    on_test_begin, on_test_end = _writes("on_test_begin"), _writes("on_test_end")
    on_test_batch_begin = _writes("on_test_batch_begin")

    def on_train_end(self, logs=None):
        self._guarded(super().on_train_end, logs)  # after a failure too: its writers closed, its profiler stopped


def failure(callbacks) -> LogsFailure | None:
    """The failure of the run's :class:`TensorBoardLogs` among ``callbacks``, if any."""
    return next((callback.failure for callback in callbacks if isinstance(callback, TensorBoardLogs)), None)


def _failed(failure: LogsFailure) -> str:
    return f"writing TensorBoard's logs failed: {failure.where}: {failure.cause}"


def stopped_message(failure: LogsFailure, saved: dict | None, steps_per_epoch: int, checkpoint: str | None) -> str:
    """The run stopped with epochs left: ``saved`` (the last checkpoint's state) says where --resume goes on."""
    if saved is not None and checkpoint is not None:
        epoch, step = divmod(int(saved["global_step"]), steps_per_epoch)
        at = f"after epoch {epoch}" if step == 0 else f"in epoch {epoch + 1} after step {step} of {steps_per_epoch}"
        return (f"{_failed(failure)}; the run is saved {at} in {checkpoint}: {failure.fix}, then rerun with --resume "
                "(add --no-tensorboard to train on without TensorBoard's logs)")
    why = "no checkpoint yet" if checkpoint is not None else "--no-checkpoint"
    return (f"{_failed(failure)}; nothing is saved to resume from ({why}): {failure.fix}, then start again with "
            "--overwrite (add --no-tensorboard to train without TensorBoard's logs)")


def complete_message(failure: LogsFailure, output_dir: str) -> str:
    """The run trained to its end and wrote its files: only the logs are incomplete, which no rerun writes."""
    return f"{_failed(failure)}; the training run is otherwise complete, its files in {output_dir}"
