"""The training loop: strategy, precision, the compiled steps, callbacks and the input-bound report.

Its options are :class:`shardprep.train.config.TrainConfig`; learning-rate schedules live in :mod:`shardprep.train.schedules`,
checkpoints and the files a run writes in :mod:`shardprep.train.checkpoints`.

A custom loop rather than ``model.fit``: ``fit`` fetches each batch inside its compiled step, so the time spent
waiting for input cannot be told apart from compute. Here the loop takes each batch from the distributed
iterator itself (``next()``, timed) and then runs the compiled step on it. Batches are prefetched (to the device
when there is one), so ``next()`` returns at once while the input pipeline keeps up; the time it blocks is time the
accelerator had no batch to work on. Each epoch reports

* ``images_per_sec``: training images / wall time of the epoch's training steps (validation excluded; the first
  epoch includes compiling the step and filling the shuffle buffer);
* ``input_wait_fraction``: time blocked in ``next()`` / that same wall time.

Keras callbacks (TensorBoard, ModelCheckpoint, ReduceLROnPlateau, EarlyStopping) are driven through a
``CallbackList`` exactly as ``fit`` would, with the epoch's logs.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from shardprep.preprocess.manifest_types import Manifest, typed
from shardprep.train import checkpoints, reader
from shardprep.train.config import LR_SCHEDULES, PRECISIONS, TrainConfig  # noqa: F401  (TrainConfig: public here too)
from shardprep.train.model import build_model
from shardprep.train.schedules import PlateauWarmup, WarmupSchedule, make_optimizer, warmup_steps  # noqa: F401

# An epoch that waits for input more than this share of its time is reported as input-bound.
INPUT_BOUND_THRESHOLD = 0.05
# Seconds between progress lines within an epoch when stdout is not a terminal (logs, pipes).
PROGRESS_INTERVAL = 10.0
HISTORY_KEYS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec", "input_wait_fraction",
                "learning_rate")


def choose_strategy() -> tf.distribute.Strategy:
    """MirroredStrategy over all GPUs when there are several, the one GPU when there is one, else the CPU."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    if len(gpus) == 1:
        return tf.distribute.OneDeviceStrategy(gpus[0].name)
    return tf.distribute.get_strategy()


def resolve_precision(precision: str) -> str:
    """``auto``: bfloat16 on GPUs that have it fast (compute capability 8.0+), float16 on older ones, float32 on CPU."""
    if precision != "auto":
        return precision
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "float32"
    capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
    return "mixed_bfloat16" if tuple(capability) >= (8, 0) else "mixed_float16"


def _device_kind(strategy) -> str:
    gpus = tf.config.list_logical_devices("GPU")
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return f"MirroredStrategy over {strategy.num_replicas_in_sync} devices"
    return f"one GPU ({gpus[0].name})" if gpus else "CPU"


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


def train(config: TrainConfig, strategy: tf.distribute.Strategy | None = None,
          report: Callable[[str], None] = print) -> dict:
    """Trains ResNet-18 on ``config.data_dir`` and writes ``history.json``, ``summary.json`` and ``model.keras`` to
    ``config.output_dir``; returns the summary. ``strategy`` defaults to :func:`choose_strategy`."""
    config.validate()
    manifest = typed(reader.load_manifest(config.data_dir))
    stored_height, stored_width = manifest.stored_shape
    if config.image_size > min(stored_height, stored_width):
        raise ValueError(f"--image-size {config.image_size} is larger than the stored images "
                         f"({stored_height}x{stored_width})")
    for option, split in (("--train-split", config.train_split), ("--val-split", config.val_split)):
        if split not in manifest.splits:
            raise ValueError(f"{option} {split!r} is not a split of {config.data_dir} (splits: "
                             f"{', '.join(manifest.splits) or 'none'}); pass {option} with one of them")
    strategy = strategy or choose_strategy()
    replicas = strategy.num_replicas_in_sync
    if config.batch_size % replicas:
        raise ValueError(f"--batch-size {config.batch_size} does not divide over {replicas} replicas")
    precision = resolve_precision(config.precision)
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        return _train(config, strategy, precision, manifest, report)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


class _Metrics:
    """The epoch's running training and validation loss and accuracy."""

    def __init__(self):
        self.loss = keras.metrics.Mean(name="loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.val_loss = keras.metrics.Mean(name="val_loss")
        self.val_accuracy = keras.metrics.SparseCategoricalAccuracy(name="val_accuracy")

    def reset(self) -> None:
        for metric in (self.loss, self.accuracy, self.val_loss, self.val_accuracy):
            metric.reset_state()


def _train(config: TrainConfig, strategy, precision: str, manifest: Manifest, report) -> dict:
    jit_compile = config.jit_compile
    if jit_compile is None:
        jit_compile = len(tf.config.list_logical_devices("GPU")) == 1
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)

    paths = checkpoints.run_paths(config.output_dir)
    tf.io.gfile.makedirs(paths["checkpoints"])
    train_examples = reader.split_size(manifest, config.train_split)
    steps_per_epoch = config.steps_per_epoch or max(1, train_examples // config.batch_size)
    base_lr = config.learning_rate if config.learning_rate is not None else 0.1 * config.batch_size / 256
    num_classes = manifest.num_classes

    with strategy.scope():
        model = build_model(num_classes, config.image_size, manifest.mean_rgb, manifest.std_rgb,
                            augment=config.augment, seed=config.seed,
                            width_multiplier=config.width_multiplier, weight_decay=config.weight_decay)
        optimizer = make_optimizer(config, base_lr, steps_per_epoch, precision)
        model.compile(optimizer=optimizer)
        optimizer.build(model.trainable_variables)
        state = (checkpoints.resume(model, paths, report) if config.resume else None) or {}
        metrics = _Metrics()
    start_epoch = int(state.get("epochs_done", 0))
    history = state["history"] if state else {key: [] for key in HISTORY_KEYS}

    data_seed = None if config.seed is None else config.seed + start_epoch  # a resumed run does not replay epoch 1
    train_data, val_data = _distributed_datasets(config, strategy, manifest, data_seed)
    steps = _step_functions(config, strategy, model, optimizer, metrics, num_classes, jit_compile)

    callbacks = _make_callbacks(config, paths, base_lr, steps_per_epoch, report)
    if config.warmup_epochs >= config.epochs:
        # Kept as asked rather than shortened: the run is what the flags say, and the note says what that means.
        report(f"Note: the warm-up ({config.warmup_epochs:g} {_plural(config.warmup_epochs, 'epoch')}, "
               f"--warmup-epochs) is as long as the run ({_plural(config.epochs, 'epoch', True)}), so the learning "
               f"rate never reaches its peak {base_lr:g}; pass a smaller --warmup-epochs for short runs.")
    report(f"Training ResNet-18 (width x{config.width_multiplier:g}, {model.count_params():,} parameters) on "
           f"{_device_kind(strategy)}, {precision}{', XLA' if jit_compile else ''}: {train_examples:,} training "
           f"images, {steps_per_epoch} steps of {config.batch_size} per epoch, epochs {start_epoch + 1}-"
           f"{config.epochs}.")
    epochs = _Epochs(config, model, metrics, callbacks, steps_per_epoch, paths, history, report)
    epochs.run(start_epoch, state.get("callbacks", {}), train_data, val_data, *steps)

    checkpoints.save_inference_model(model, paths["model"])
    summary = summarize(history, first_epoch_of_run=start_epoch + 1)
    checkpoints.write_json(paths["summary"], summary)
    report(
        f"Summary: {_plural(summary['epochs'], 'epoch', True)}, best val_accuracy "
        f"{summary['best_val_accuracy']:.4f} (epoch "
        f"{summary['best_epoch']}), final {summary['final_val_accuracy']:.4f}. Throughput "
        f"{summary['images_per_sec']:,.0f} images/s, waiting for input {100 * summary['input_wait_fraction']:.1f}% "
        f"of step time (epochs {summary['throughput_epochs']}): {summary['verdict']}. "
        f"Model: {paths['model']}")
    return summary


def _distributed_datasets(config: TrainConfig, strategy, manifest: Manifest, data_seed: int | None):
    """The training and validation splits, one input pipeline per worker (``distribute_datasets_from_function``)."""
    def dataset_fn(split, training):
        return lambda context: reader.make_dataset(
            config.data_dir, split, config.batch_size, training, seed=data_seed, input_context=context,
            shuffle_buffer=config.shuffle_buffer, manifest=manifest, verify_records=config.verify_records,
            random_access=False if config.sequential_reads else None)

    train_data = strategy.distribute_datasets_from_function(dataset_fn(config.train_split, True))
    val_data = strategy.distribute_datasets_from_function(dataset_fn(config.val_split, False))
    return train_data, val_data


def _step_functions(config: TrainConfig, strategy, model, optimizer, metrics: _Metrics, num_classes: int,
                    jit_compile: bool):
    """``(train_step, eval_step)``: each runs one distributed batch on every replica and updates ``metrics``."""
    replicas = strategy.num_replicas_in_sync

    def smoothed_loss(labels, logits):
        one_hot = tf.one_hot(labels, num_classes, dtype=tf.float32)
        return keras.losses.categorical_crossentropy(one_hot, tf.cast(logits, tf.float32), from_logits=True,
                                                     label_smoothing=config.label_smoothing)

    def replica_train_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = smoothed_loss(labels, logits)
            loss = tf.reduce_mean(per_example)
            if model.losses:
                loss += tf.add_n(model.losses)
            # Gradients are summed over replicas: scale so that they average.
            scaled = optimizer.scale_loss(loss / replicas)
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        metrics.loss.update_state(per_example)
        metrics.accuracy.update_state(labels, logits)

    def replica_eval_step(images, labels):
        logits = model(images, training=False)
        metrics.val_loss.update_state(smoothed_loss(labels, logits))
        metrics.val_accuracy.update_state(labels, logits)

    compiled_replica_step = tf.function(replica_train_step, jit_compile=jit_compile)

    @tf.function
    def train_step(batch):
        strategy.run(compiled_replica_step, args=batch)

    @tf.function(reduce_retracing=True)
    def eval_step(batch):
        strategy.run(replica_eval_step, args=batch)

    return train_step, eval_step


class _Epochs:
    """The epochs of a run: timed training steps, validation, callbacks, history, checkpoints and reports."""

    def __init__(self, config: TrainConfig, model, metrics: _Metrics, callbacks: list, steps_per_epoch: int,
                 paths: dict, history: dict, report: Callable[[str], None]):
        self.config, self.model, self.metrics, self.callbacks = config, model, metrics, callbacks
        self.steps_per_epoch, self.paths, self.history, self.report = steps_per_epoch, paths, history, report
        self.callback_list = keras.callbacks.CallbackList(callbacks, model=model, epochs=config.epochs,
                                                          steps=steps_per_epoch, verbose=0)
        self.progress_factory = lambda steps, batch_size: EpochProgress(steps, batch_size, report)

    def run(self, start_epoch: int, callback_state: dict, train_data, val_data, train_step, eval_step) -> None:
        self.model.stop_training = False
        self.callback_list.on_train_begin()
        checkpoints.restore_callback_state(self.callbacks, callback_state)
        train_iterator = iter(train_data)
        for epoch in range(start_epoch, self.config.epochs):
            self.metrics.reset()
            self.callback_list.on_epoch_begin(epoch)
            logs, wait_seconds, train_seconds = self._train_epoch(train_iterator, train_step)
            for batch in val_data:
                eval_step(batch)
            logs.update(val_loss=float(self.metrics.val_loss.result()),
                        val_accuracy=float(self.metrics.val_accuracy.result()),
                        images_per_sec=self.steps_per_epoch * self.config.batch_size / train_seconds,
                        input_wait_fraction=wait_seconds / train_seconds,
                        learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
            self.callback_list.on_epoch_end(epoch, logs)
            self._record(epoch, logs)
            if self.model.stop_training:
                self.report(f"Early stopping after epoch {epoch + 1}: val_loss has not improved for "
                            f"{_plural(self.config.early_stopping_patience, 'epoch', True)}.")
                break
        self.callback_list.on_train_end()

    def _train_epoch(self, train_iterator, train_step) -> tuple[dict, float, float]:
        """The epoch's training logs, the seconds spent waiting in ``next()`` and the epoch's training seconds."""
        wait_seconds = 0.0
        started = time.perf_counter()
        progress = self.progress_factory(self.steps_per_epoch, self.config.batch_size)
        for step in range(self.steps_per_epoch):
            self.callback_list.on_train_batch_begin(step)
            before_next = time.perf_counter()
            batch = next(train_iterator)
            wait_seconds += time.perf_counter() - before_next
            train_step(batch)
            self.callback_list.on_train_batch_end(step)
            progress.update(step + 1)
        progress.done()
        # Reading the metrics waits for the device, so the epoch's time is taken after it.
        logs = {"loss": float(self.metrics.loss.result()), "accuracy": float(self.metrics.accuracy.result())}
        return logs, wait_seconds, time.perf_counter() - started

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
            checkpoints.save_epoch(self.model, self.paths, epoch + 1, history, self.callbacks)


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
                 stream=None, interval: float | None = None, interval_tty: float = 0.5):
        self.steps, self.batch_size, self.report = steps, batch_size, report
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval_tty if self.tty else (PROGRESS_INTERVAL if interval is None else interval)
        self.started = time.perf_counter()
        self.last_shown = self.started
        self.shown = False

    def line(self, step: int, elapsed: float) -> str:
        rate = step * self.batch_size / elapsed if elapsed > 0 else math.nan
        remaining = (self.steps - step) * elapsed / step if step else math.nan
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
