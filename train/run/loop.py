"""The training loop, the same on every Keras backend: model, optimizer, resume, the epochs over
:mod:`~shardprep.train.run.steps_tf` or :mod:`~shardprep.train.run.steps_keras`, and the summary. ``next()`` is timed
alone (``input_wait_fraction``); step ``s`` reads the batch the seeded order addresses by ``s``, so a resume is exact.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import secrets
from typing import Callable

import keras
import numpy as np

from shardprep.preprocess.format.dataset import Manifest, load_manifest, typed
from shardprep.preprocess.checks.events import Listener, Message, text_only
from shardprep.train.run import checkpoints, messages, preflight, run_files
from shardprep.train.run.config import TrainConfig
from shardprep.train.run.epochs import HISTORY_KEYS, Epochs, LogsError, TensorBoardLogs, logs_failure
from shardprep.train.model.keras_model import PlateauWarmup, build_model, make_optimizer, warmup_steps

# An epoch that waits for input more than this share of its time is reported as input-bound.
INPUT_BOUND_THRESHOLD = 0.05
# The metric that picks checkpoints/best.keras (and that early stopping and --lr-schedule plateau watch).
BEST_METRIC = "val_loss"


def _verdict(wait_fraction: float) -> str:
    if wait_fraction < INPUT_BOUND_THRESHOLD:
        return "not input-bound: the input pipeline kept up"
    if wait_fraction < 0.2:
        return "partly input-bound"
    return "input-bound: the accelerator waited for input a large share of the time"


def summarize(history: dict, first_epoch_of_run: int = 1) -> dict:
    """The end-of-run summary: the best epoch by val_loss (``best.keras``'s) and the last, throughput and input wait
    over the epochs this process ran, its first left out when it ran more (compiling, filling buffers)."""
    epochs = len(history["epoch"])
    run_start = history["epoch"].index(first_epoch_of_run) if first_epoch_of_run in history["epoch"] else 0
    steady = slice(run_start + 1 if epochs - run_start > 1 else run_start, None)
    images_per_sec = float(np.mean(history["images_per_sec"][steady]))
    wait = float(np.mean(history["input_wait_fraction"][steady]))
    val_loss = history["val_loss"]
    finite = [value for value in val_loss if math.isfinite(value)]
    best = val_loss.index(min(finite)) if finite else epochs - 1
    return {
        "epochs": epochs, "best_metric": BEST_METRIC, "best_epoch": history["epoch"][best],
        "best_val_loss": val_loss[best], "best_val_accuracy": history["val_accuracy"][best],
        "final_val_accuracy": history["val_accuracy"][-1], "final_val_loss": val_loss[-1],
        "images_per_sec": images_per_sec, "input_wait_fraction": wait,
        "throughput_epochs": f"{history['epoch'][steady][0]}-{history['epoch'][-1]}", "verdict": _verdict(wait)}


def make_steps(config: TrainConfig, manifest: Manifest, backend: str, strategy=None):
    """``TFSteps`` on TensorFlow (``strategy``: default from the GPUs), else ``KerasSteps``."""
    if backend == "tensorflow":
        from shardprep.train.run.steps_tf import TFSteps

        return TFSteps(config, manifest, strategy)
    if strategy is not None:
        raise ValueError(f"a tf.distribute strategy needs the tensorflow backend; Keras runs on {backend}")
    from shardprep.train.run.steps_keras import KerasSteps

    return KerasSteps(config, manifest, backend)


def train(config: TrainConfig, strategy=None, report: Callable[[str], None] = print,
          on_batch: Callable[[int, object], None] | None = None, manifest: Manifest | None = None,
          events: Listener | None = None) -> dict:
    """Trains ResNet-18 on ``config.data_dir``; writes ``history.json``, ``summary.json`` and ``model.keras``; returns
    the summary. ``on_batch(global_step, batch)`` sees each batch; ``events`` the run's typed events (messages and
    progress: ``shardprep.preprocess.checks.events``), else ``report`` each message's text; ``manifest``: as
    ``preflight.check`` returned it. Ctrl-C saves a checkpoint and raises ``TrainingInterrupted``."""
    config.validate()
    backend = keras.backend.backend()
    if config.backend is not None and config.backend != backend:
        raise ValueError(f"backend {config.backend} was asked for, but Keras is imported with the {backend} backend "
                         f"in this process and cannot change it: set KERAS_BACKEND={config.backend} before importing "
                         "keras")
    config.check_backend(backend)
    manifest = typed(manifest) if manifest is not None else load_manifest(config.data_dir)
    stored_height, stored_width = manifest.stored_shape
    if config.image_size > min(stored_height, stored_width):
        raise ValueError(f"--image-size {config.image_size} is larger than the stored images "
                         f"({stored_height}x{stored_width})")
    splits = preflight.training_splits(manifest, config.train_split, config.val_split, config.data_dir)
    config = dataclasses.replace(config, train_split=splits.train.name, val_split=splits.validation.name)
    notes = (*messages.split_lines(splits.train, splits.validation),
             *messages.crop_warnings(config.image_size, manifest.stored_shape))
    steps = make_steps(config, manifest, backend, strategy)
    if config.batch_size % steps.replicas:
        raise ValueError(f"--batch-size {config.batch_size} does not divide over {steps.replicas} replicas")
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(steps.precision)
    try:
        return _train(config, steps, manifest, events or text_only(report), on_batch, notes)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def _train(config: TrainConfig, steps, manifest: Manifest, events: Listener, on_batch, notes: tuple[str, ...] = ()
           ) -> dict:
    def say(text: str) -> None:
        events(Message(text))

    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    paths = checkpoints.run_paths(config.output_dir)
    checkpoints.make_dirs(paths["checkpoints"])
    train_examples = manifest.split(config.train_split).num_examples
    steps_per_epoch = config.steps_per_epoch or max(1, train_examples // config.batch_size)
    base_lr = config.learning_rate if config.learning_rate is not None else 0.1 * config.batch_size / 256
    options = checkpoints.run_options(config, manifest, steps_per_epoch)
    if config.checkpoint_every_steps and steps.streamed():
        raise ValueError("--checkpoint-every-steps needs local shards read by random access: with "
                         "--sequential-reads or a URL the order cannot be resumed mid-epoch; drop one of them")

    # A checkpoint of other options is refused before the model is built (ResNet-18: ~1.2 s of CPU).
    located = checkpoints.resumable(paths, options, say) if config.resume else None
    with steps.scope():
        model = build_model(manifest.num_classes, config.image_size, manifest.mean_rgb, manifest.std_rgb,
                            augment=config.augment, seed=config.seed,
                            width_multiplier=config.width_multiplier, weight_decay=config.weight_decay,
                            classes=manifest.classes)
        optimizer = make_optimizer(config, base_lr, steps_per_epoch, steps.precision)
        steps.compile(model, optimizer, manifest.num_classes)
        optimizer.build(model.trainable_variables)
        state = (checkpoints.resume(model, paths, options, steps_per_epoch, say, located) if located else None) or {}
    start_step = int(state.get("global_step", 0))
    start_epoch = start_step // steps_per_epoch
    # The record order's seed: --seed, else one drawn for the run and kept in its checkpoints, so that a resumed
    # run without --seed still continues the same order.
    data_seed = config.seed if config.seed is not None else (state.get("options") or {}).get("data_seed")
    options["data_seed"] = data_seed if data_seed is not None else secrets.randbelow(2**31)
    history = state["history"] if state else {key: [] for key in HISTORY_KEYS}

    if config.checkpoint:
        checkpoints.discard_best_writing(paths)  # half a model a killed run was writing: Keras writes it anew
    callbacks = _make_callbacks(config, paths, base_lr, steps_per_epoch, say)
    for message in messages.start_messages(config, steps, model.count_params(), train_examples, steps_per_epoch,
                                           base_lr, start_epoch) + list(notes):
        say(message)
    if state:
        say(messages.resume_message(paths["last"], state, steps_per_epoch, config.epochs))
    val_steps = -(-manifest.split(config.val_split).num_examples // config.batch_size)
    Epochs(config, model, steps, callbacks, steps_per_epoch, paths, history, events, val_steps, options,
           on_batch).run(start_step, state)

    checkpoints.save_inference_model(model, paths["model"])
    summary = {**summarize(history, first_epoch_of_run=start_epoch + 1), "backend": steps.backend}
    checkpoints.write_json(paths["summary"], summary)
    for message in messages.summary_messages(summary, paths, config.checkpoint):
        say(message)
    failed_logs = logs_failure(callbacks)
    if failed_logs is not None:  # in the last epoch, or at the end: the run's files are all written by now
        raise LogsError(f"{failed_logs}; the training run is otherwise complete, its files in {config.output_dir}")
    return summary


def tensorboard_installed() -> bool:
    """tf.summary needs the tensorboard package, which TensorFlow no longer installs."""
    return importlib.util.find_spec("tensorboard") is not None


def _make_callbacks(config: TrainConfig, paths: dict, base_lr: float, steps_per_epoch: int,
                    report: Callable[[str], None] = print) -> list:
    callbacks = []
    if config.lr_schedule == "plateau":
        if warmup := warmup_steps(config, steps_per_epoch):
            callbacks.append(PlateauWarmup(base_lr, warmup, steps_per_epoch))
        callbacks.append(keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=config.reduce_lr_factor, patience=config.reduce_lr_patience,
            min_lr=config.reduce_lr_min))
    if config.tensorboard and not tensorboard_installed():
        report("TensorBoard logs skipped: the tensorboard package is not installed (pip install tensorboard).")
    elif config.tensorboard:
        # A failure to write the logs is kept, and the epoch loop stops where the run is saved.
        callbacks.append(TensorBoardLogs(paths["logs"], profile_batch=_profile_batches(config.profile_batch)))
        callbacks.append(run_files.event_file_recorder(config.output_dir))  # lists TensorBoard's files in the record
    if config.checkpoint:
        # Keras writes the file in place: under its own name, a kill while it writes would leave half of the model a
        # user keeps. The epoch loop renames it to best.keras (checkpoints.commit_best).
        callbacks.append(checkpoints.BestCheckpoint(paths))  # a failure to write it names best.keras
    if config.early_stopping:
        callbacks.append(keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.early_stopping_patience))
    return callbacks


def _profile_batches(value: str | int):
    """``"10,20"`` -> (10, 20); ``"5"`` -> 5; ``"0"`` -> 0 (no profiling)."""
    parts = [int(part) for part in str(value).split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)
