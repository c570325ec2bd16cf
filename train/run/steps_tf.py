"""The steps on TensorFlow (:class:`TFSteps`): a ``tf.distribute`` strategy, the precision, ``tf.data`` input and
``tf.function`` steps (XLA when asked); nothing here waits for the device, so the loop's timed ``next()`` measures
input wait only.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf

from shardprep.preprocess.format.dataset import Manifest
from shardprep.train.data import reader
from shardprep.train.run.config import TrainConfig, gpu_precision
from shardprep.train.model.keras_model import smoothed_crossentropy


# A Python exception quoted in a tf.data error ("OSError: shard: record 3 ... mismatch"), a line of its own.
_RAISED = re.compile(r"^\w*(?:Error|Exception): (.+)$", re.MULTILINE)


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
    return gpu_precision(tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0)))


class TFSteps:
    """Strategy, precision, input and compiled steps for one run on TensorFlow."""

    backend = "tensorflow"

    def __init__(self, config: TrainConfig, manifest: Manifest, strategy: tf.distribute.Strategy | None = None):
        self.config, self.manifest = config, manifest
        self.strategy = strategy or choose_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        self.precision = resolve_precision(config.precision)
        self.jit_compile = config.jit_compile
        if self.jit_compile is None:  # XLA on one GPU
            self.jit_compile = len(tf.config.list_logical_devices("GPU")) == 1
        self._val = None

    def describe(self) -> str:
        if isinstance(self.strategy, tf.distribute.MirroredStrategy):
            return f"MirroredStrategy over {self.replicas} devices"
        gpus = tf.config.list_logical_devices("GPU")
        return f"one GPU ({gpus[0].name})" if gpus else "CPU"

    def scope(self):
        """Variables (model, optimizer, metrics) are created inside this scope."""
        return self.strategy.scope()

    def compile(self, model: keras.Model, optimizer, num_classes: int) -> None:
        """Attaches the optimizer and builds the compiled steps; call inside :meth:`scope`."""
        model.compile(optimizer=optimizer)
        # The epoch's running metrics: device variables, read once an epoch.
        self.loss, self.val_loss = keras.metrics.Mean(name="loss"), keras.metrics.Mean(name="val_loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.val_accuracy = keras.metrics.SparseCategoricalAccuracy(name="val_accuracy")
        self._step_functions(model, optimizer, num_classes)

    def streamed(self) -> bool:
        """Shards streamed in tf.data's shuffled order (``--sequential-reads``, URLs), which no step addresses."""
        return self.config.streamed()

    def train_batches(self, seed: int | None, start_step: int, steps_per_epoch: int):
        """The endless training input from step ``start_step`` (streamed: an epoch boundary, reseeded)."""
        if self.streamed() and self.config.seed is None:
            seed = None  # the run's drawn order seed would only make streamed reads deterministic, and slower
        if self.streamed() and start_step:
            if start_step % steps_per_epoch:
                raise ValueError(f"--resume: the checkpoint is mid-epoch (step {start_step}), and "
                                 f"{'--sequential-reads' if self.config.sequential_reads else 'a URL'} streams the "
                                 "shards in an order no step addresses; resume reading local shards by random "
                                 "access (no --sequential-reads), or from an epoch-end checkpoint")
            seed = None if seed is None else seed + start_step // steps_per_epoch
            start_step = 0
        return iter(self._distributed(self.config.train_split, True, seed, start_step))

    @staticmethod
    def input_error(error: Exception) -> str | None:
        """A tf.data error as one line: the Python exception a reading function raised (it says what to do), else
        TF's first line and where to look."""
        if not isinstance(error, tf.errors.OpError):
            return None
        if raised := [match.group(1) for match in _RAISED.finditer(error.message)]:
            return raised[-1]
        first = error.message.strip().splitlines()[0] if error.message.strip() else type(error).__name__
        return re.sub(r"^\{\{[^}]*\}\}\s*", "", first) + (" (the shards are not what the manifest says: check them "
                                                          "with shardprep validate)")

    def val_batches(self):
        """One pass over the validation split; the same dataset every epoch (one traced evaluation step)."""
        if self._val is None:
            self._val = self._distributed(self.config.val_split, False, None, 0)
            # Traced once for the dataset's batches of any size: else a short last batch traces it again.
            self.eval_step = tf.function(self.eval_step, input_signature=(self._val.element_spec,))
        return self._val

    def _distributed(self, split: str, training: bool, seed: int | None, start_step: int):
        """One input pipeline per worker (``distribute_datasets_from_function``)."""
        config = self.config

        def dataset_fn(context):
            # An input pipeline yields per-replica batches and feeds each of its replicas one per step, so a
            # global step is that many of its batches: a resumed pipeline starts after all the steps' batches.
            per_step = context.num_replicas_in_sync // context.num_input_pipelines
            return reader.make_dataset(
                config.data_dir, split, config.batch_size, training, seed=seed, input_context=context,
                shuffle_buffer=config.shuffle_buffer, manifest=self.manifest, verify_records=config.verify_records,
                random_access=False if config.sequential_reads else None, start_step=start_step * per_step)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def reset(self) -> None:
        for metric in (self.loss, self.accuracy, self.val_loss, self.val_accuracy):
            metric.reset_state()

    def metric_state(self) -> dict:
        """The training metrics' sums as exact floats, over the replicas and (``<name>/replicas``) each replica's own:
        a resume on as many replicas continues those, as their total spread again would round otherwise."""
        state: dict[str, list] = {}
        for metric in (self.loss, self.accuracy):
            state[metric.name] = [float(tf.convert_to_tensor(variable)) for variable in metric.variables]
            if self.replicas > 1:
                state[f"{metric.name}/replicas"] = [[float(part) for part in self.strategy.experimental_local_results(
                    variable.value)] for variable in metric.variables]
        return state

    def restore_metric_state(self, state: dict) -> bool:
        """Continues the training metrics from :meth:`metric_state`; False, changing nothing, for another form."""
        metrics = (self.loss, self.accuracy)
        if not all(isinstance(state.get(metric.name), list) and len(state[metric.name]) == len(metric.variables)
                   and all(isinstance(value, (int, float)) for value in state[metric.name]) for metric in metrics):
            return False
        for metric in metrics:
            kept = state.get(f"{metric.name}/replicas")
            for index, (variable, value) in enumerate(zip(metric.variables, state[metric.name])):
                parts = self.strategy.experimental_local_results(variable.value)
                own = kept[index] if isinstance(kept, list) and index < len(kept) else None
                if isinstance(own, list) and len(own) == len(parts) > 1 and all(
                        isinstance(number, (int, float)) for number in own):
                    for part, number in zip(parts, own):
                        part.assign(number)
                else:  # one replica, or saved on another count: the total (assigning spreads it)
                    variable.assign(value)
        return True

    def train_results(self) -> dict:
        """The epoch's training loss and accuracy so far (waits for the device)."""
        return {"loss": float(self.loss.result()), "accuracy": float(self.accuracy.result())}

    def val_results(self) -> dict:
        return {"val_loss": float(self.val_loss.result()), "val_accuracy": float(self.val_accuracy.result())}

    def _step_functions(self, model, optimizer, num_classes: int) -> None:
        """``train_step`` and ``eval_step``: one distributed batch on every replica, updating the metrics;
        ``eval_step`` is traced by :meth:`val_batches`, for its dataset's element spec."""
        strategy, replicas = self.strategy, self.strategy.num_replicas_in_sync

        def smoothed_loss(labels, logits):
            return smoothed_crossentropy(labels, logits, num_classes, self.config.label_smoothing)

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
            self.loss.update_state(per_example)
            self.accuracy.update_state(labels, logits)

        def replica_eval_step(images, labels):
            logits = model(images, training=False)
            self.val_loss.update_state(smoothed_loss(labels, logits))
            self.val_accuracy.update_state(labels, logits)

        compiled_replica_step = tf.function(replica_train_step, jit_compile=self.jit_compile)

        @tf.function
        def train_step(batch):
            strategy.run(compiled_replica_step, args=batch)

        def eval_step(batch):
            strategy.run(replica_eval_step, args=batch)

        self.train_step, self.eval_step = train_step, eval_step
