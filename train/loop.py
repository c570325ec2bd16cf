"""The training loop, the same on every Keras backend: timed input, callbacks, history, checkpoints, progress and the
input-bound report.

Its options are :class:`shardprep.train.config.TrainConfig`; the per-backend part is the steps: the strategy or
devices, the precision policy, the input pipeline and the compiled training and evaluation steps, in
:mod:`shardprep.train.steps_tf` (TensorFlow: ``tf.distribute``, ``tf.data``, ``tf.function``) and
:mod:`shardprep.train.steps_keras` (JAX and PyTorch: NumPy input, ``train_on_batch``). Learning-rate schedules live
in :mod:`shardprep.train.schedules`, checkpoints and the files a run writes in :mod:`shardprep.train.checkpoints`.
This module imports no backend itself: Keras runs on whichever backend it was imported with.

A custom loop rather than ``model.fit``: ``fit`` fetches each batch inside its compiled step, so the time spent
waiting for input cannot be told apart from compute. Here the loop takes each batch from the input iterator itself
(``next()``, timed) and then runs the step on it. Batches are read ahead, so ``next()`` returns at once while the
input pipeline keeps up; the time it blocks is time the accelerator had no batch to work on. Each epoch reports

* ``images_per_sec``: training images / wall time of the epoch's training steps (validation and checkpoints
  excluded; the first epoch includes compiling the step and filling the shuffle buffer);
* ``input_wait_fraction``: time blocked in ``next()`` / that same wall time.

Keras callbacks (TensorBoard, ModelCheckpoint, ReduceLROnPlateau, EarlyStopping) are driven through a
``CallbackList`` exactly as ``fit`` would, with the epoch's logs.

Mid-epoch resume: training step ``s`` (counted over the whole run) reads batch ``s % steps_per_epoch`` of epoch
``s // steps_per_epoch`` of the seeded order, so a run resumed after ``s`` steps builds its reader at ``start_step=s``
and sees exactly the batches an uninterrupted run would have seen from there, without reading the ones before.
"""

from __future__ import annotations

import math
import secrets
import sys
import time
from typing import Callable

import keras
import numpy as np

from shardprep.preprocess.manifest_types import Manifest, typed
from shardprep.train import checkpoints, preflight, run_files
from shardprep.train.config import LR_SCHEDULES, PRECISIONS, TrainConfig  # noqa: F401  (TrainConfig: public here too)
from shardprep.train.model import build_model
from shardprep.train.schedules import PlateauWarmup, WarmupSchedule, make_optimizer, warmup_steps  # noqa: F401

# An epoch that waits for input more than this share of its time is reported as input-bound.
INPUT_BOUND_THRESHOLD = 0.05
# Seconds between progress lines within an epoch when stdout is not a terminal (logs, pipes).
PROGRESS_INTERVAL = 10.0
HISTORY_KEYS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec", "input_wait_fraction",
                "learning_rate")


def _verdict(wait_fraction: float) -> str:
    if wait_fraction < INPUT_BOUND_THRESHOLD:
        return "not input-bound: the input pipeline kept up"
    if wait_fraction < 0.2:
        return "partly input-bound"
    return "input-bound: the accelerator waited for input a large share of the time"


def summarize(history: dict, first_epoch_of_run: int = 1) -> dict:
    """The end-of-run summary: best and last accuracy, and throughput and input wait over the epochs this process
    ran, without its first epoch when it ran more than one (that one includes compiling the step and filling the
    shuffle buffer)."""
    epochs = len(history["epoch"])
    run_start = history["epoch"].index(first_epoch_of_run) if first_epoch_of_run in history["epoch"] else 0
    steady = slice(run_start + 1 if epochs - run_start > 1 else run_start, None)
    images_per_sec = float(np.mean(history["images_per_sec"][steady]))
    wait = float(np.mean(history["input_wait_fraction"][steady]))
    val_accuracy = history["val_accuracy"]
    best = int(np.nanargmax(val_accuracy)) if val_accuracy else 0
    return {
        "epochs": epochs,
        "best_val_accuracy": val_accuracy[best], "best_epoch": history["epoch"][best],
        "final_val_accuracy": val_accuracy[-1], "final_val_loss": history["val_loss"][-1],
        "images_per_sec": images_per_sec, "input_wait_fraction": wait,
        "throughput_epochs": f"{history['epoch'][steady][0]}-{history['epoch'][-1]}",
        "verdict": _verdict(wait),
    }


def make_steps(config: TrainConfig, manifest: Manifest, backend: str, strategy=None):
    """The steps of ``backend``: :class:`~shardprep.train.steps_tf.TFSteps` on TensorFlow (``strategy``: a
    ``tf.distribute`` strategy, default chosen from the GPUs), else :class:`~shardprep.train.steps_keras.KerasSteps`."""
    if backend == "tensorflow":
        from shardprep.train.steps_tf import TFSteps

        return TFSteps(config, manifest, strategy)
    if strategy is not None:
        raise ValueError(f"a tf.distribute strategy needs the tensorflow backend; Keras runs on {backend}")
    from shardprep.train.steps_keras import KerasSteps

    return KerasSteps(config, manifest, backend)


def train(config: TrainConfig, strategy=None, report: Callable[[str], None] = print,
          on_batch: Callable[[int, object], None] | None = None) -> dict:
    """Trains ResNet-18 on ``config.data_dir`` and writes ``history.json``, ``summary.json`` and ``model.keras`` to
    ``config.output_dir``; returns the summary.

    Runs on the backend Keras was imported with (``config.backend``, when given, must be that one: see
    :func:`shardprep.train.config.activate_backend`). ``strategy``: TensorFlow only, default chosen from the GPUs.
    ``on_batch(global_step, batch)``, if given, sees each training batch before its step (e.g. to record which
    records a run trained on)."""
    config.validate()
    backend = keras.backend.backend()
    if config.backend is not None and config.backend != backend:
        raise ValueError(f"backend {config.backend} was asked for, but Keras is imported with the {backend} backend "
                         f"in this process and cannot change it: set KERAS_BACKEND={config.backend} before importing "
                         "keras")
    manifest = typed(preflight.load_manifest(config.data_dir))
    stored_height, stored_width = manifest.stored_shape
    if config.image_size > min(stored_height, stored_width):
        raise ValueError(f"--image-size {config.image_size} is larger than the stored images "
                         f"({stored_height}x{stored_width})")
    for option, split in (("--train-split", config.train_split), ("--val-split", config.val_split)):
        if split not in manifest.splits:
            raise ValueError(f"{option} {split!r} is not a split of {config.data_dir} (splits: "
                             f"{', '.join(manifest.splits) or 'none'}); pass {option} with one of them")
    steps = make_steps(config, manifest, backend, strategy)
    if config.batch_size % steps.replicas:
        raise ValueError(f"--batch-size {config.batch_size} does not divide over {steps.replicas} replicas")
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(steps.precision)
    try:
        return _train(config, steps, manifest, report, on_batch)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def _train(config: TrainConfig, steps, manifest: Manifest, report, on_batch) -> dict:
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    paths = checkpoints.run_paths(config.output_dir)
    checkpoints.make_dirs(paths["checkpoints"])
    train_examples = manifest.split(config.train_split).num_examples
    steps_per_epoch = config.steps_per_epoch or max(1, train_examples // config.batch_size)
    base_lr = config.learning_rate if config.learning_rate is not None else 0.1 * config.batch_size / 256
    num_classes = manifest.num_classes
    options = checkpoints.run_options(config, manifest, steps_per_epoch)
    if config.checkpoint_every_steps and steps.streamed():
        raise ValueError("--checkpoint-every-steps needs local shards read by random access: with "
                         "--sequential-reads or a URL the order cannot be resumed mid-epoch; drop one of them")

    with steps.scope():
        model = build_model(num_classes, config.image_size, manifest.mean_rgb, manifest.std_rgb,
                            augment=config.augment, seed=config.seed,
                            width_multiplier=config.width_multiplier, weight_decay=config.weight_decay)
        optimizer = make_optimizer(config, base_lr, steps_per_epoch, steps.precision)
        steps.compile(model, optimizer, num_classes)
        optimizer.build(model.trainable_variables)
        state = (checkpoints.resume(model, paths, options, steps_per_epoch, report) if config.resume else None) or {}
    start_step = int(state.get("global_step", 0))
    start_epoch = start_step // steps_per_epoch
    # The record order's seed: --seed, else one drawn for the run and kept in its checkpoints, so that a resumed
    # run without --seed still continues the same order.
    data_seed = config.seed if config.seed is not None else (state.get("options") or {}).get("data_seed")
    options["data_seed"] = data_seed if data_seed is not None else secrets.randbelow(2**31)
    history = state["history"] if state else {key: [] for key in HISTORY_KEYS}

    callbacks = _make_callbacks(config, paths, base_lr, steps_per_epoch, report)
    if config.warmup_epochs >= config.epochs:
        # Kept as asked rather than shortened: the run is what the flags say, and the note says what that means.
        report(f"Note: the warm-up ({config.warmup_epochs:g} {_plural(config.warmup_epochs, 'epoch')}, "
               f"--warmup-epochs) is as long as the run ({_plural(config.epochs, 'epoch', True)}), so the learning "
               f"rate never reaches its peak {base_lr:g}; pass a smaller --warmup-epochs for short runs.")
    report(f"Training ResNet-18 (width x{config.width_multiplier:g}, {model.count_params():,} parameters) with "
           f"Keras on {steps.backend}, {steps.describe()}, {steps.precision}{', XLA' if steps.jit_compile else ''}: "
           f"{train_examples:,} training images, {steps_per_epoch} steps of {config.batch_size} per epoch, epochs "
           f"{start_epoch + 1}-{config.epochs}.")
    if state:
        report(_resume_line(paths["last"], start_step, steps_per_epoch, config.epochs))
    epochs = _Epochs(config, model, steps, callbacks, steps_per_epoch, paths, history, report)
    epochs.options, epochs.on_batch = options, on_batch
    # The run's own seed at every start: the reader's order is addressed by step, not reseeded per resume.
    train_batches = steps.train_batches(options["data_seed"], start_step, steps_per_epoch)
    epochs.run(start_step, state, train_batches, steps.val_batches)

    checkpoints.save_inference_model(model, paths["model"])
    summary = {**summarize(history, first_epoch_of_run=start_epoch + 1), "backend": steps.backend}
    checkpoints.write_json(paths["summary"], summary)
    report(
        f"Summary: {_plural(summary['epochs'], 'epoch', True)}, best val_accuracy "
        f"{summary['best_val_accuracy']:.4f} (epoch "
        f"{summary['best_epoch']}), final {summary['final_val_accuracy']:.4f}. Throughput "
        f"{summary['images_per_sec']:,.0f} images/s, waiting for input {100 * summary['input_wait_fraction']:.1f}% "
        f"of step time (epochs {summary['throughput_epochs']}): {summary['verdict']}. "
        f"Model: {paths['model']}")
    return summary


def _resume_line(checkpoint: str, start_step: int, steps_per_epoch: int, epochs: int) -> str:
    epoch, step = divmod(start_step, steps_per_epoch)
    done = f"after epoch {epoch}" if step == 0 else f"in epoch {epoch + 1}"
    if epoch >= epochs:
        return (f"Resuming from {checkpoint} {done}: nothing left to train ({_plural(epochs, 'epoch', True)} "
                "asked for); pass a larger --epochs to train on.")
    return (f"Resuming from {checkpoint} {done}: resumed at epoch {epoch + 1}, step {step} of {steps_per_epoch} "
            f"({_plural(step, 'step', True)} kept); the reader starts at step {start_step} of the run without "
            "reading the records before it.")


def _combined(earlier: dict | None, later: dict, examples: int) -> dict:
    """The epoch's training ``loss`` and ``accuracy`` over ``earlier`` (a checkpoint's partial epoch) and ``later``
    (this process's ``examples`` images), weighted by examples; with the total ``examples``."""
    if not earlier:
        return {**later, "examples": examples}
    total = earlier["examples"] + examples
    return {key: (earlier[key] * earlier["examples"] + later[key] * examples) / total for key in ("loss", "accuracy")
            } | {"examples": total}


class _Epochs:
    """The epochs of a run: timed training steps, validation, callbacks, history, checkpoints and reports."""

    def __init__(self, config: TrainConfig, model, steps, callbacks: list, steps_per_epoch: int,
                 paths: dict, history: dict, report: Callable[[str], None]):
        self.config, self.model, self.steps, self.callbacks = config, model, steps, callbacks
        self.steps_per_epoch, self.paths, self.history, self.report = steps_per_epoch, paths, history, report
        self.callback_list = keras.callbacks.CallbackList(callbacks, model=model, epochs=config.epochs,
                                                          steps=steps_per_epoch, verbose=0)
        self.progress_factory = lambda steps, batch_size, first_step=0: EpochProgress(
            steps, batch_size, report, first_step=first_step)
        self.options: dict = {}
        self.on_batch = None
        self.saved_state = None  # the last checkpoint's state: the fallback entry of the next state.json

    def run(self, start_step: int, state: dict, train_iterator, val_batches: Callable) -> None:
        self.model.stop_training = False
        self.callback_list.on_train_begin()
        checkpoints.restore_callback_state(self.callbacks, state.get("callbacks", {}))
        self.saved_state = state or None
        start_epoch, first_step = divmod(start_step, self.steps_per_epoch)
        carried = state.get("partial_epoch") if first_step else None
        for epoch in range(start_epoch, self.config.epochs):
            first = first_step if epoch == start_epoch else 0
            self.steps.reset()
            self.callback_list.on_epoch_begin(epoch)
            logs, wait_seconds, train_seconds = self._train_epoch(epoch, first, train_iterator,
                                                                  carried if first else None)
            for batch in val_batches():
                self.steps.eval_step(batch)
            logs.update(self.steps.val_results(),
                        images_per_sec=(self.steps_per_epoch - first) * self.config.batch_size / train_seconds,
                        input_wait_fraction=wait_seconds / train_seconds,
                        learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
            self.callback_list.on_epoch_end(epoch, logs)
            self._record(epoch, logs)
            if self.model.stop_training:
                self.report(f"Early stopping after epoch {epoch + 1}: val_loss has not improved for "
                            f"{_plural(self.config.early_stopping_patience, 'epoch', True)}.")
                break
        self.callback_list.on_train_end()

    def _train_epoch(self, epoch: int, first_step: int, train_iterator, carried: dict | None):
        """The epoch's training logs, the seconds spent waiting in ``next()`` and the epoch's training seconds
        (checkpoints excluded), from step ``first_step`` on; ``carried``: the partial epoch a checkpoint kept."""
        wait_seconds = checkpoint_seconds = 0.0
        started = time.perf_counter()
        progress = self.progress_factory(self.steps_per_epoch, self.config.batch_size, first_step)
        every = self.config.checkpoint_every_steps if self.config.checkpoint else None
        for step in range(first_step, self.steps_per_epoch):
            self.callback_list.on_train_batch_begin(step)
            before_next = time.perf_counter()
            batch = next(train_iterator)
            wait_seconds += time.perf_counter() - before_next
            global_step = epoch * self.steps_per_epoch + step
            if self.on_batch is not None:
                self.on_batch(global_step, batch)
            self.steps.train_step(batch)
            self.callback_list.on_train_batch_end(step)
            progress.update(step + 1)
            if every and (global_step + 1) % every == 0 and step + 1 < self.steps_per_epoch:
                before_save = time.perf_counter()
                partial = _combined(carried, self.steps.train_results(),
                                    (step + 1 - first_step) * self.config.batch_size)
                self._save(global_step + 1, partial)
                checkpoint_seconds += time.perf_counter() - before_save
        progress.done()
        # Reading the metrics waits for the device, so the epoch's time is taken after it.
        logs = _combined(carried, self.steps.train_results(),
                         (self.steps_per_epoch - first_step) * self.config.batch_size)
        del logs["examples"]
        return logs, wait_seconds, time.perf_counter() - started - checkpoint_seconds

    def _save(self, global_step: int, partial_epoch: dict | None) -> None:
        state = checkpoints.run_state(global_step, self.steps_per_epoch, self.history, self.callbacks, self.options,
                                      checkpoints.optimizer_iterations(self.model), partial_epoch)
        checkpoints.save_checkpoint(self.model, self.paths, state, self.saved_state)
        self.saved_state = state

    def _record(self, epoch: int, logs: dict) -> None:
        history, config = self.history, self.config
        history["epoch"].append(epoch + 1)
        for key in HISTORY_KEYS[1:]:
            history[key].append(float(logs[key]))
        self.report(f"epoch {epoch + 1}/{config.epochs}: loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}, "
                    f"val_loss {logs['val_loss']:.4f}, val_accuracy {logs['val_accuracy']:.4f} | "
                    f"{logs['images_per_sec']:,.0f} images/s, waiting for input "
                    f"{100 * logs['input_wait_fraction']:.1f}% of step time")
        checkpoints.write_json(self.paths["history"], history)
        if config.checkpoint:
            self._save((epoch + 1) * self.steps_per_epoch, None)


def _plural(count, word: str, with_count: bool = False) -> str:
    """``word`` or ``word + "s"`` for ``count`` (``"1 epoch"``, ``"2 epochs"`` with ``with_count``)."""
    text = word if count == 1 else word + "s"
    return f"{count:g} {text}" if with_count else text


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


class EpochProgress:
    """Progress within an epoch: steps done, images/s and the ETA.

    On a terminal, one line rewritten in place (carriage return) at most every ``interval_tty`` seconds; otherwise
    (a log file, a pipe, a notebook's captured output) a plain line through ``report`` every ``interval`` seconds,
    so logs stay readable. Images/s counts steps launched, not finished: the device may lag a step behind.
    """

    def __init__(self, steps: int, batch_size: int, report: Callable[[str], None] = print, *,
                 stream=None, interval: float | None = None, interval_tty: float = 0.5, first_step: int = 0):
        self.steps, self.batch_size, self.report = steps, batch_size, report
        self.first_step = first_step  # a resumed epoch starts here: rates count the steps this process ran
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval_tty if self.tty else (PROGRESS_INTERVAL if interval is None else interval)
        self.started = time.perf_counter()
        self.last_shown = self.started
        self.shown = False

    def line(self, step: int, elapsed: float) -> str:
        ran = step - self.first_step
        rate = ran * self.batch_size / elapsed if elapsed > 0 else math.nan
        remaining = (self.steps - step) * elapsed / ran if ran else math.nan
        eta = _duration(remaining) if math.isfinite(remaining) else "?"
        return (f"  step {step}/{self.steps} ({100 * step / self.steps:.0f}%), "
                f"{rate:,.0f} images/s, ETA {eta}")

    def update(self, step: int) -> None:
        now = time.perf_counter()
        if now - self.last_shown < self.interval or step >= self.steps:
            return
        self.last_shown = now
        self.shown = True
        text = self.line(step, now - self.started)
        if self.tty:
            self.stream.write("\r" + text.ljust(72))
            self.stream.flush()
        else:
            self.report(text)

    def done(self) -> None:
        """Clears the terminal's progress line before the epoch's report."""
        if self.tty and self.shown:
            self.stream.write("\r" + " " * 72 + "\r")
            self.stream.flush()


def tensorboard_installed() -> bool:
    """tf.summary needs the tensorboard package, which TensorFlow no longer installs."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _make_callbacks(config: TrainConfig, paths: dict, base_lr: float, steps_per_epoch: int,
                    report: Callable[[str], None] = print) -> list:
    callbacks = []
    if config.lr_schedule == "plateau":
        warmup = warmup_steps(config, steps_per_epoch)
        if warmup:
            callbacks.append(PlateauWarmup(base_lr, warmup, steps_per_epoch))
        callbacks.append(keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=config.reduce_lr_factor, patience=config.reduce_lr_patience,
            min_lr=config.reduce_lr_min))
    if config.tensorboard and not tensorboard_installed():
        report("TensorBoard logs skipped: the tensorboard package is not installed (pip install tensorboard).")
    elif config.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=paths["logs"], write_graph=False,
                                                     profile_batch=_profile_batches(config.profile_batch)))
        callbacks.append(run_files.event_file_recorder(config.output_dir))  # lists TensorBoard's files in the record
    if config.checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(paths["best"], monitor="val_loss", save_best_only=True))
    if config.early_stopping:
        callbacks.append(keras.callbacks.EarlyStopping(monitor="val_loss",
                                                       patience=config.early_stopping_patience))
    return callbacks


def _profile_batches(value: str | int):
    """``"10,20"`` -> (10, 20); ``"5"`` -> 5; ``"0"`` -> 0 (no profiling)."""
    parts = [int(part) for part in str(value).split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)
