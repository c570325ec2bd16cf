"""The training loop: strategy, precision, optimizer and schedule, callbacks, checkpoints and the input-bound report.

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

import dataclasses
import json
import math
import os
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from preprocess import manifest as manifest_lib
from train import reader
from train.augment import AUGMENTATIONS
from train.model import build_model

PRECISIONS = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
LR_SCHEDULES = ("cosine", "step", "plateau")
# An epoch that waits for input more than this share of its time is reported as input-bound.
INPUT_BOUND_THRESHOLD = 0.05
HISTORY_KEYS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec", "input_wait_fraction",
                "learning_rate")


@dataclasses.dataclass
class TrainConfig:
    """Every option of a training run; the CLI (``shardprep train``) fills it from its flags."""

    data_dir: str
    output_dir: str = "shardprep_train"
    epochs: int = 90
    batch_size: int = 256
    image_size: int = 224
    precision: str = "auto"
    augment: str = "crop"
    learning_rate: float | None = None  # None: 0.1 * batch_size / 256 (Goyal et al.)
    lr_schedule: str = "cosine"
    warmup_epochs: float = 5.0
    lr_step_epochs: tuple[float, ...] | None = None  # None: at 1/3, 2/3 and 8/9 of the run (30, 60, 80 of 90)
    lr_decay: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    width_multiplier: float = 1.0
    train_split: str = "train"
    val_split: str = "validation"
    steps_per_epoch: int | None = None  # None: one pass over the training split
    shuffle_buffer: int | None = None
    verify_records: bool = False
    sequential_reads: bool = False  # stream fixed-layout shards instead of gathering each batch's records
    seed: int | None = None
    jit_compile: bool | None = None  # None: XLA with exactly one GPU
    tensorboard: bool = True
    profile_batch: str = "0"
    checkpoint: bool = True
    reduce_lr_patience: int = 5
    reduce_lr_factor: float = 0.1
    reduce_lr_min: float = 1e-6
    early_stopping: bool = True
    early_stopping_patience: int = 10
    resume: bool = False

    def validate(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}")
        if self.epochs < 1 or self.batch_size < 1 or self.image_size < 1:
            raise ValueError("epochs, batch_size and image_size must be positive")


@keras.saving.register_keras_serializable(package="shardprep")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps``, or step decay
    (``* decay`` at each of ``boundaries``), or constant (``kind="constant"``)."""

    def __init__(self, base_lr: float, warmup_steps: int, total_steps: int, kind: str = "cosine",
                 boundaries=(), decay: float = 0.1):
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.kind = kind
        self.boundaries = [int(b) for b in boundaries]
        self.decay = float(decay)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = float(self.warmup_steps)
        if self.kind == "cosine":
            progress = tf.clip_by_value((step - warmup) / max(1.0, self.total_steps - warmup), 0.0, 1.0)
            lr = 0.5 * self.base_lr * (1.0 + tf.cos(math.pi * progress))
        elif self.kind == "step":
            passed = tf.add_n([tf.cast(step >= b, tf.float32) for b in self.boundaries]) if self.boundaries else 0.0
            lr = self.base_lr * tf.pow(self.decay, passed)
        else:
            lr = tf.constant(self.base_lr)
        if self.warmup_steps:
            lr = tf.where(step < warmup, self.base_lr * (step + 1.0) / warmup, lr)
        return lr

    def get_config(self):
        return dict(base_lr=self.base_lr, warmup_steps=self.warmup_steps, total_steps=self.total_steps,
                    kind=self.kind, boundaries=self.boundaries, decay=self.decay)


class _PlateauWarmup(keras.callbacks.Callback):
    """Linear warm-up for ``--lr-schedule plateau``, where the rate must stay a plain variable that
    ReduceLROnPlateau can lower; it sets the rate only during the warm-up steps.

    The step is counted here, not read from the optimizer: reading a device variable every step would make the
    loop wait for the device each step."""

    def __init__(self, base_lr: float, warmup_steps: int, steps_per_epoch: int):
        super().__init__()
        self.base_lr, self.warmup_steps, self.steps_per_epoch = base_lr, warmup_steps, steps_per_epoch
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        step = self.epoch * self.steps_per_epoch + batch
        if step < self.warmup_steps:
            self.model.optimizer.learning_rate = self.base_lr * (step + 1) / self.warmup_steps
        elif step == self.warmup_steps:
            self.model.optimizer.learning_rate = self.base_lr


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


def _paths(output_dir: str) -> dict:
    checkpoints = os.path.join(output_dir, "checkpoints")
    return {
        "checkpoints": checkpoints,
        "best": os.path.join(checkpoints, "best.keras"),
        "last": os.path.join(checkpoints, "last.keras"),
        "state": os.path.join(checkpoints, "state.json"),
        "history": os.path.join(output_dir, "history.json"),
        "summary": os.path.join(output_dir, "summary.json"),
        "model": os.path.join(output_dir, "model.keras"),
        "logs": os.path.join(output_dir, "logs"),
    }


def _write_json(path: str, value) -> None:
    temporary = path + ".tmp"
    with tf.io.gfile.GFile(temporary, "w") as f:
        f.write(json.dumps(value, indent=2) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def _read_json(path: str):
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def _make_optimizer(config: TrainConfig, base_lr: float, steps_per_epoch: int, precision: str):
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
    total_steps = config.epochs * steps_per_epoch
    if config.lr_schedule == "plateau":
        learning_rate = base_lr / warmup_steps if warmup_steps else base_lr
    else:
        step_epochs = config.lr_step_epochs or (config.epochs / 3, 2 * config.epochs / 3, 8 * config.epochs / 9)
        learning_rate = WarmupSchedule(base_lr, warmup_steps, total_steps, kind=config.lr_schedule,
                                       boundaries=[round(e * steps_per_epoch) for e in step_epochs],
                                       decay=config.lr_decay)
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate, momentum=config.momentum, nesterov=False)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


# Callback state that a resumed run carries on with (Keras resets it in on_train_begin).
_CALLBACK_STATE = {
    keras.callbacks.ModelCheckpoint: ("best",),
    keras.callbacks.ReduceLROnPlateau: ("best", "wait", "cooldown_counter"),
    keras.callbacks.EarlyStopping: ("best", "wait", "best_epoch"),
}


def _callback_state(callbacks) -> dict:
    state = {}
    for callback in callbacks:
        for kind, attributes in _CALLBACK_STATE.items():
            if isinstance(callback, kind):
                state[kind.__name__] = {a: _plain(getattr(callback, a, None)) for a in attributes}
    return state


def _restore_callback_state(callbacks, state: dict) -> None:
    for callback in callbacks:
        for kind, attributes in _CALLBACK_STATE.items():
            if isinstance(callback, kind) and kind.__name__ in state:
                for attribute in attributes:
                    value = state[kind.__name__].get(attribute)
                    if value is not None:
                        setattr(callback, attribute, value)


def _plain(value):
    if value is None:
        return None
    value = float(value) if isinstance(value, (np.floating, float)) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value.item() if isinstance(value, np.generic) else value


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
    manifest = reader.load_manifest(config.data_dir)
    stored_height, stored_width = reader.stored_image_shape(manifest)
    if config.image_size > min(stored_height, stored_width):
        raise ValueError(f"--image-size {config.image_size} is larger than the stored images "
                         f"({stored_height}x{stored_width})")
    for split in (config.train_split, config.val_split):
        manifest_lib.shard_files(manifest, split)  # a KeyError naming the splits there are
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


def _train(config: TrainConfig, strategy, precision: str, manifest: dict, report) -> dict:
    replicas = strategy.num_replicas_in_sync
    jit_compile = config.jit_compile
    if jit_compile is None:
        jit_compile = len(tf.config.list_logical_devices("GPU")) == 1
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)

    paths = _paths(config.output_dir)
    tf.io.gfile.makedirs(paths["checkpoints"])
    train_examples = reader.split_size(manifest, config.train_split)
    steps_per_epoch = config.steps_per_epoch or max(1, train_examples // config.batch_size)
    base_lr = config.learning_rate if config.learning_rate is not None else 0.1 * config.batch_size / 256
    num_classes = len(manifest["classes"])

    history = {key: [] for key in HISTORY_KEYS}
    state = {}
    start_epoch = 0
    with strategy.scope():
        model = build_model(num_classes, config.image_size, manifest["mean_rgb"], manifest["std_rgb"],
                            augment=config.augment, seed=config.seed,
                            width_multiplier=config.width_multiplier, weight_decay=config.weight_decay)
        optimizer = _make_optimizer(config, base_lr, steps_per_epoch, precision)
        model.compile(optimizer=optimizer)
        optimizer.build(model.trainable_variables)
        if config.resume and tf.io.gfile.exists(paths["state"]) and tf.io.gfile.exists(paths["last"]):
            state = _read_json(paths["state"])
            start_epoch = int(state["epochs_done"])
            history = state["history"]
            _restore_checkpoint(model, paths["last"])
            report(f"Resuming from {paths['last']} after epoch {start_epoch} "
                   f"(optimizer step {int(optimizer.iterations.numpy())}).")
        elif config.resume:
            report(f"--resume: no checkpoint in {paths['checkpoints']}; starting from scratch.")
        train_loss = keras.metrics.Mean(name="loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        val_loss = keras.metrics.Mean(name="val_loss")
        val_accuracy = keras.metrics.SparseCategoricalAccuracy(name="val_accuracy")

    data_seed = None if config.seed is None else config.seed + start_epoch  # a resumed run does not replay epoch 1

    def dataset_fn(split, training):
        return lambda context: reader.make_dataset(
            config.data_dir, split, config.batch_size, training, seed=data_seed, input_context=context,
            shuffle_buffer=config.shuffle_buffer, manifest=manifest, verify_records=config.verify_records,
            random_access=False if config.sequential_reads else None)

    train_data = strategy.distribute_datasets_from_function(dataset_fn(config.train_split, True))
    val_data = strategy.distribute_datasets_from_function(dataset_fn(config.val_split, False))

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
        train_loss.update_state(per_example)
        train_accuracy.update_state(labels, logits)

    def replica_eval_step(images, labels):
        logits = model(images, training=False)
        val_loss.update_state(smoothed_loss(labels, logits))
        val_accuracy.update_state(labels, logits)

    compiled_replica_step = tf.function(replica_train_step, jit_compile=jit_compile)

    @tf.function
    def train_step(batch):
        strategy.run(compiled_replica_step, args=batch)

    @tf.function(reduce_retracing=True)
    def eval_step(batch):
        strategy.run(replica_eval_step, args=batch)

    callbacks = _make_callbacks(config, paths, base_lr, steps_per_epoch, report)
    callback_list = keras.callbacks.CallbackList(callbacks, model=model, epochs=config.epochs,
                                                 steps=steps_per_epoch, verbose=0)
    report(f"Training ResNet-18 (width x{config.width_multiplier:g}, {model.count_params():,} parameters) on "
           f"{_device_kind(strategy)}, {precision}{', XLA' if jit_compile else ''}: {train_examples:,} training "
           f"images, {steps_per_epoch} steps of {config.batch_size} per epoch, epochs {start_epoch + 1}-"
           f"{config.epochs}.")
    model.stop_training = False
    callback_list.on_train_begin()
    _restore_callback_state(callbacks, state.get("callbacks", {}))
    train_iterator = iter(train_data)
    for epoch in range(start_epoch, config.epochs):
        for metric in (train_loss, train_accuracy, val_loss, val_accuracy):
            metric.reset_state()
        callback_list.on_epoch_begin(epoch)
        wait_seconds = 0.0
        started = time.perf_counter()
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            before_next = time.perf_counter()
            batch = next(train_iterator)
            wait_seconds += time.perf_counter() - before_next
            train_step(batch)
            callback_list.on_train_batch_end(step)
        logs = {"loss": float(train_loss.result()), "accuracy": float(train_accuracy.result())}  # waits for the
        train_seconds = time.perf_counter() - started                                             # device
        for batch in val_data:
            eval_step(batch)
        logs.update(val_loss=float(val_loss.result()), val_accuracy=float(val_accuracy.result()),
                    images_per_sec=steps_per_epoch * config.batch_size / train_seconds,
                    input_wait_fraction=wait_seconds / train_seconds,
                    learning_rate=float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
        callback_list.on_epoch_end(epoch, logs)
        history["epoch"].append(epoch + 1)
        for key in HISTORY_KEYS[1:]:
            history[key].append(float(logs[key]))
        report(f"epoch {epoch + 1}/{config.epochs}: loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}, "
               f"val_loss {logs['val_loss']:.4f}, val_accuracy {logs['val_accuracy']:.4f} | "
               f"{logs['images_per_sec']:,.0f} images/s, waiting for input "
               f"{100 * logs['input_wait_fraction']:.1f}% of step time")
        _write_json(paths["history"], history)
        if config.checkpoint:
            model.save(paths["last"])
            _write_json(paths["state"], {"epochs_done": epoch + 1, "history": history,
                                         "callbacks": _callback_state(callbacks)})
        if model.stop_training:
            report(f"Early stopping after epoch {epoch + 1}: val_loss has not improved for "
                   f"{config.early_stopping_patience} epochs.")
            break
    callback_list.on_train_end()

    _save_inference_model(model, paths["model"])
    summary = summarize(history, first_epoch_of_run=start_epoch + 1)
    _write_json(paths["summary"], summary)
    report(
        f"Summary: {summary['epochs']} epochs, best val_accuracy {summary['best_val_accuracy']:.4f} (epoch "
        f"{summary['best_epoch']}), final {summary['final_val_accuracy']:.4f}. Throughput "
        f"{summary['images_per_sec']:,.0f} images/s, waiting for input {100 * summary['input_wait_fraction']:.1f}% "
        f"of step time (epochs {summary['throughput_epochs']}): {summary['verdict']}. "
        f"Model: {paths['model']}")
    return summary


def tensorboard_installed() -> bool:
    """tf.summary needs the tensorboard package, which TensorFlow no longer installs."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _make_callbacks(config: TrainConfig, paths: dict, base_lr: float, steps_per_epoch: int,
                    report: Callable[[str], None] = print) -> list:
    callbacks = []
    if config.lr_schedule == "plateau":
        warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
        if warmup_steps:
            callbacks.append(_PlateauWarmup(base_lr, warmup_steps, steps_per_epoch))
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


def _restore_checkpoint(model: keras.Model, path: str) -> None:
    """Loads weights and optimizer state (step, momentum) saved by a previous run into ``model``.

    The model and optimizer are rebuilt from this run's flags first, so a resumed run may change e.g. ``--epochs``
    (the schedule is recomputed and continues from the saved step); the architecture must be the same.
    """
    saved = keras.models.load_model(path)
    try:
        model.set_weights(saved.get_weights())
    except ValueError as error:
        raise ValueError(f"{path} holds another architecture (was --width-multiplier changed?): {error}") from error
    saved_state, state = saved.optimizer.variables, model.optimizer.variables
    if [tuple(v.shape) for v in saved_state] != [tuple(v.shape) for v in state]:
        raise ValueError(f"the optimizer state in {path} does not match this run's optimizer "
                         "(was --precision changed between mixed_float16 and another precision?)")
    for variable, value in zip(state, saved_state):
        variable.assign(value)


def _save_inference_model(model: keras.Model, path: str) -> None:
    """Saves the model without optimizer state: uint8 images of any size >= the train size in, logits out."""
    inference = keras.Model.from_config(model.get_config())  # uncompiled: no optimizer in the file
    inference.set_weights(model.get_weights())
    inference.save(path)
