"""The epochs of a run (:class:`Epochs`, driven by :func:`shardprep.train.run.loop.train`): timed steps, validation,
callbacks, history, checkpoints (mid-epoch: metrics, ``timing``, ``validation_pending``, ``rng``), progress and a
clean stop on Ctrl-C; TensorBoard's logs that cannot be written stop the run where it is saved.
"""

from __future__ import annotations

import errno
import re
import sys
import time
from typing import NamedTuple, NoReturn

import keras

from shardprep.preprocess.checks.events import Listener, Message, TrainingSteps, ValidationBatches
from shardprep.preprocess.checks.text import clock, count
from shardprep.train.run import checkpoints
from shardprep.train.run.checkpoint_state import HISTORY_KEYS  # the keys a checkpoint's history is checked for
from shardprep.train.run.config import TrainConfig
from shardprep.train.run.stop_requests import StopRequests, TrainingInterrupted


class InputError(ValueError):
    """The training or validation input failed; the message names the shard and the record."""


def combined(earlier: dict | None, later: dict, examples: int) -> dict:
    """The epoch's ``loss`` and ``accuracy`` over ``earlier`` (a partial epoch saved without accumulators) and
    ``later`` (this process's ``examples`` images), weighted by examples, with the total."""
    if not earlier:
        return {**later, "examples": examples}
    if not examples:  # nothing ran here (a resume whose epoch had only its validation left)
        return {key: earlier[key] for key in ("loss", "accuracy", "examples")}
    total = earlier["examples"] + examples
    return {key: (earlier[key] * earlier["examples"] + later[key] * examples) / total for key in ("loss", "accuracy")
            } | {"examples": total}


class _Timing:
    """An epoch's training time: steps timed, their seconds (checkpoints excluded) and the seconds in ``next()``."""

    def __init__(self, saved: dict | None = None):
        saved = saved or {}
        self.steps, self.seconds, self.wait = saved.get("steps", 0), saved.get("seconds", 0.0), saved.get("wait", 0.0)

    def to_json(self) -> dict:
        return {"steps": self.steps, "seconds": self.seconds, "wait": self.wait}


class Epochs:
    """The epochs of a run: timed training steps, validation, callbacks, history, checkpoints and reports."""

    def __init__(self, config: TrainConfig, model, steps, callbacks: list, steps_per_epoch: int, paths: dict,
                 history: dict, events: Listener, val_steps: int | None, options: dict, on_batch=None):
        self.config, self.model, self.steps, self.callbacks = config, model, steps, callbacks
        self.steps_per_epoch, self.paths, self.history, self.events = steps_per_epoch, paths, history, events
        self.val_steps, self.options, self.on_batch = val_steps, options, on_batch
        self.callback_list = keras.callbacks.CallbackList(callbacks, model=model, epochs=config.epochs,
                                                          steps=steps_per_epoch, verbose=0)
        self.saved_state = None  # the last checkpoint's state: the fallback entry of the next state.json
        self.stop: StopRequests | None = None

    def say(self, text: str) -> None:
        self.events(Message(text))

    def run(self, start_step: int, state: dict) -> None:
        """Epochs from ``start_step`` (``state``: the checkpoint resumed from) to the last."""
        # The run's own seed at every start: the reader's order is addressed by step, not reseeded per resume.
        train_iterator = self.steps.train_batches(self.options["data_seed"], start_step, self.steps_per_epoch)
        self.model.stop_training = False
        self.callback_list.on_train_begin()
        checkpoints.restore_callback_state(self.callbacks, state.get("callbacks", {}))
        if state.get("rng") is not None:
            checkpoints.restore_rng(self.model, state["rng"], self.paths["state"])
        elif state and self.config.seed is not None:
            self.say("Note: this checkpoint was saved without the random generators' state, so augmentation goes "
                     "on with other draws than the uninterrupted run's.")
        self.saved_state = state or None
        start_epoch, first_step = divmod(start_step, self.steps_per_epoch)
        partial = state.get("partial_epoch")
        if partial and partial.get("validation_pending"):
            start_epoch, first_step = start_epoch - 1, self.steps_per_epoch  # the epoch's steps are done
        with StopRequests(self._stopping) as self.stop:
            try:
                self._stop_if_logs_failed()  # at the start: nothing trained since the last checkpoint
                for epoch in range(start_epoch, self.config.epochs):
                    first = first_step if epoch == start_epoch else 0
                    if self._epoch(epoch, first, train_iterator, partial if first else None):
                        break
                    if epoch + 1 < self.config.epochs:  # the last epoch's run finishes first (loop.train)
                        self._stop_if_logs_failed()
            except (TrainingInterrupted, LogsError):
                self.callback_list.on_train_end()  # TensorBoard's writers flush and close
                raise
        self.callback_list.on_train_end()

    def _stop_if_logs_failed(self) -> None:
        """TensorBoard's logs could not be written: the run ends here, saying where --resume goes on."""
        failed = logs_failure(self.callbacks)
        if failed is None:
            return
        saved, checkpoint = self.saved_state, self.paths["last"] if self.config.checkpoint else None
        if saved is not None and checkpoint is not None:
            epoch, step = divmod(int(saved["global_step"]), self.steps_per_epoch)
            at = (f"after epoch {epoch}" if step == 0
                  else f"in epoch {epoch + 1} after step {step} of {self.steps_per_epoch}")
            raise LogsError(f"{failed}; the run is saved {at} in {checkpoint}: {failed.fix}, then rerun with "
                            "--resume (add --no-tensorboard to train on without TensorBoard's logs)")
        why = "no checkpoint yet" if checkpoint is not None else "--no-checkpoint"
        raise LogsError(f"{failed}; nothing is saved to resume from ({why}): {failed.fix}, then start again with "
                        "--overwrite (add --no-tensorboard to train without TensorBoard's logs)")

    def _stopping(self, by: str = "Ctrl-C") -> None:
        """Says at once what the first Ctrl-C (or SIGTERM: ``by``) does (from the signal handler: ``immediate``)."""
        saves = "and saving a checkpoint there" if self.config.checkpoint else "(--no-checkpoint: nothing is saved)"
        again = "Ctrl-C again" if by == "Ctrl-C" else f"another {by} or Ctrl-C"
        self.events(Message(f"{by}: stopping after this step {saves}; {again} stops at once, without saving.",
                            immediate=True))

    def _epoch(self, epoch: int, first: int, train_iterator, carried: dict | None) -> bool:
        """One epoch from step ``first``; True when early stopping ends the run."""
        started = time.perf_counter()
        self.steps.reset()
        self.callback_list.on_epoch_begin(epoch)
        logs, timing = self._train_epoch(epoch, first, train_iterator, carried)
        self._validate(epoch, logs, timing)
        logs.update(self.steps.val_results(),
                    images_per_sec=timing.steps * self.config.batch_size / timing.seconds if timing.seconds else 0.0,
                    input_wait_fraction=timing.wait / timing.seconds if timing.seconds else 0.0,
                    learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
        best = [callback.best for callback in self._best_checkpoints()]
        if self.config.checkpoint:  # Keras opens the name itself: whatever was put there meanwhile is not followed
            checkpoints.discard_best_writing(self.paths)
        self.callback_list.on_epoch_end(epoch, logs)
        # A ModelCheckpoint sets `best` only when it saves: then best.keras holds the model the epoch end checkpoints
        # (the callbacks that change the optimizer come before it, and nothing after it changes the model).
        written = any(callback.best is not before for callback, before in zip(self._best_checkpoints(), best))
        if written:
            checkpoints.commit_best(self.paths)
        self._record(epoch, logs, time.perf_counter() - started, self.paths["best"] if written else None)
        if self.stop.requested:
            self._stop(epoch, self.steps_per_epoch, "epoch end")  # saved just now (_record)
        if self.model.stop_training:
            self.say(f"Early stopping after epoch {epoch + 1}: val_loss has not improved for "
                     f"{count(self.config.early_stopping_patience, 'epoch')}.")
            return True
        return False

    def _train_epoch(self, epoch: int, first_step: int, train_iterator, carried: dict | None):
        """The epoch's training logs and :class:`_Timing` from step ``first_step`` on."""
        timing = _Timing(carried.get("timing") if carried else None)
        if carried and carried.get("metrics") is not None and self.steps.restore_metric_state(carried["metrics"]):
            # The saved accumulators go on as in one process; checkpoints without them (or another backend's) are
            # combined as weighted means.
            carried = None
        checkpoint_seconds = 0.0
        started = time.perf_counter()
        every = self.config.checkpoint_every_steps if self.config.checkpoint else None
        for step in range(first_step, self.steps_per_epoch):
            self.callback_list.on_train_batch_begin(step)
            before_next = time.perf_counter()
            batch = self._next(train_iterator, "training")
            timing.wait += time.perf_counter() - before_next
            global_step = epoch * self.steps_per_epoch + step
            if self.on_batch is not None:
                self.on_batch(global_step, batch)
            self.steps.train_step(batch)
            self.stop.armed = True
            timing.steps += 1
            self.callback_list.on_train_batch_end(step)
            running = lambda done=step + 1: self._running(carried, done - first_step)  # noqa: E731
            self.events(TrainingSteps(step + 1, self.steps_per_epoch, first_step, self.config.batch_size,
                                      time.perf_counter() - started, running))
            if step + 1 < self.steps_per_epoch and (self.stop.requested or every and (global_step + 1) % every == 0):
                before_save = time.perf_counter()
                partial = self._partial(carried, step + 1 - (first_step if carried else 0), timing,
                                        time.perf_counter() - started - checkpoint_seconds)
                if self.stop.requested:
                    self._stop(epoch, step + 1, "training", partial)
                self._save(global_step + 1, partial)
                checkpoint_seconds += time.perf_counter() - before_save
        # Reading the metrics waits for the device, so the epoch's time is taken after it.
        logs = self._running(carried, self.steps_per_epoch - first_step)
        timing.seconds += time.perf_counter() - started - checkpoint_seconds
        shown = {"loss": logs["loss"], "accuracy": logs["accuracy"]}
        self.events(TrainingSteps(self.steps_per_epoch, self.steps_per_epoch, first_step, self.config.batch_size,
                                  time.perf_counter() - started, lambda: shown, finished=True))
        return logs, timing

    def _running(self, carried: dict | None, steps_run: int) -> dict:
        logs = combined(carried, self.steps.train_results(), steps_run * self.config.batch_size)
        return {key: value for key, value in logs.items() if key != "examples"}

    def _partial(self, carried: dict | None, steps: int, timing: _Timing, seconds: float) -> dict:
        """The ``partial_epoch`` entry after ``steps`` steps of the epoch."""
        partial = combined(carried, self.steps.train_results(), steps * self.config.batch_size)
        timed = {**timing.to_json(), "seconds": timing.seconds + seconds}
        return {**partial, "metrics": self.steps.metric_state(), "timing": timed}

    def _next(self, iterator, split: str):
        """The iterator's next batch; a reading error becomes one :class:`InputError` line."""
        try:
            return next(iterator)
        except StopIteration:
            raise
        except Exception as error:  # noqa: BLE001 - only the steps know their input's errors; others re-raised
            message = self.steps.input_error(error)
            if message is None:
                raise
            raise InputError(f"reading the {split} split: {message}") from error

    def _validate(self, epoch: int, logs: dict, timing: _Timing) -> None:
        batches, number = iter(self.steps.val_batches()), 0
        while True:
            if self.stop.requested:  # the epoch's steps are saved as done, its validation left for the resume
                examples = self.steps_per_epoch * self.config.batch_size
                self._stop(epoch, self.steps_per_epoch, "validation", {
                    "loss": logs["loss"], "accuracy": logs["accuracy"], "examples": examples,
                    "metrics": self.steps.metric_state(), "timing": timing.to_json(), "validation_pending": True})
            try:
                batch = self._next(batches, "validation")
            except StopIteration:
                break
            self.steps.eval_step(batch)
            number += 1
            self.events(ValidationBatches(number, self.val_steps))
        self.events(ValidationBatches(number, self.val_steps, finished=True))

    def _stop(self, epoch: int, step: int, stage: str, partial: dict | None = None) -> NoReturn:
        """Ctrl-C after ``step`` steps of ``epoch`` at ``stage``: ``partial`` saved there when the order can resume
        from it (streamed reads resume from the last checkpoint)."""
        at = epoch * self.steps_per_epoch + step
        resumes_at, unsaved = at, ""
        if not self.config.checkpoint:
            resumes_at, unsaved = None, "--no-checkpoint"
        elif stage == "training" and self.steps.streamed():
            resumes_at, unsaved = self.saved_state.get("global_step") if self.saved_state else None, "streamed"
        elif partial is not None:
            self._save(at, partial)
        raise TrainingInterrupted(at, epoch + 1, step, self.steps_per_epoch, stage,
                                  self.paths["last"] if resumes_at is not None else None, resumes_at, unsaved)

    def _best_checkpoints(self) -> list:
        return [callback for callback in self.callbacks if isinstance(callback, keras.callbacks.ModelCheckpoint)]

    def _save(self, global_step: int, partial_epoch: dict | None, saved_as: str | None = None) -> None:
        """A checkpoint after ``global_step`` steps; ``saved_as``: best.keras, just written in this very state."""
        state = checkpoints.run_state(global_step, self.steps_per_epoch, self.history, self.callbacks, self.options,
                                      checkpoints.optimizer_iterations(self.model), partial_epoch)
        state["rng"] = checkpoints.capture_rng(self.model)  # the draws the next step makes
        checkpoints.save_checkpoint(self.model, self.paths, state, self.saved_state, saved_as)
        self.saved_state = state

    def _record(self, epoch: int, logs: dict, seconds: float, saved_as: str | None = None) -> None:
        history, config = self.history, self.config
        history["epoch"].append(epoch + 1)
        for key in HISTORY_KEYS[1:]:
            history[key].append(float(logs[key]))
        self.say(f"epoch {epoch + 1}/{config.epochs}: loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}, "
                 f"val_loss {logs['val_loss']:.4f}, val_accuracy {logs['val_accuracy']:.4f}")
        self.say(f"  took {clock(seconds)}, {logs['images_per_sec']:,.0f} images/s, waiting for input "
                 f"{100 * logs['input_wait_fraction']:.1f}% of step time")
        checkpoints.write_json(self.paths["history"], history)
        if config.checkpoint:
            self._save((epoch + 1) * self.steps_per_epoch, None, saved_as)


# --- TensorBoard's logs that cannot be written (a full disk, a read-only logs/): the first failure is kept instead
# of a traceback; the epoch loop ends the run once its work is saved, with one line saying what is saved and how to
# go on.

class LogsFailure(NamedTuple):
    """A write of TensorBoard's logs that failed: the path, the cause, and what to do before running again."""

    where: str
    cause: str
    fix: str

    def __str__(self) -> str:
        return f"writing TensorBoard's logs failed: {self.where}: {self.cause}"


class LogsError(checkpoints.RunFileError):
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
    """Keras's TensorBoard hook ``name``, writing until the first failure (``TensorBoardLogs._guarded``)."""
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

    on_train_begin, on_epoch_begin, on_epoch_end, on_test_begin, on_test_end = map(_writes, (
        "on_train_begin", "on_epoch_begin", "on_epoch_end", "on_test_begin", "on_test_end"))
    on_train_batch_begin, on_train_batch_end, on_test_batch_begin = map(_writes, (
        "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin"))

    def on_train_end(self, logs=None):
        self._guarded(super().on_train_end, logs)  # after a failure too: its writers closed, its profiler stopped


def logs_failure(callbacks) -> LogsFailure | None:
    """The failure of the run's :class:`TensorBoardLogs` among ``callbacks``, if any."""
    return next((callback.failure for callback in callbacks if isinstance(callback, TensorBoardLogs)), None)
