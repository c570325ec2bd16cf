"""The steps on JAX and PyTorch (:class:`KerasSteps`, :class:`~shardprep.train.run.steps_tf.TFSteps`' interface):
``train_on_batch``/``test_on_batch`` compiled by Keras (``jax.jit``; ``torch.compile`` with ``--jit-compile``), fed by
``NumpyReader``; JAX over every local device (``DataParallel``), PyTorch on one.
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np

from shardprep.preprocess.format.dataset import Manifest
from shardprep.train.run.config import TrainConfig, gpu_precision
from shardprep.train.model.keras_model import SmoothedCrossentropy, SmoothedCrossentropyMean


def _jax_devices():
    """This process's devices; several JAX processes (multi-host) are refused: the loop gives them no input shares."""
    import jax

    if jax.process_count() > 1:
        raise ValueError(f"--backend jax runs in one process over its local devices; this is one of "
                         f"{jax.process_count()} JAX processes (multi-host), which shardprep train does not support "
                         "yet; run it on one host")
    return jax.local_devices()


def resolve_precision(precision: str, backend: str) -> str:
    """``auto``: bfloat16 on GPUs of compute capability 8.0+ and TPUs, float16 on older GPUs, float32 on CPU."""
    if precision != "auto":
        return precision
    if backend == "jax":
        device = _jax_devices()[0]
        if device.platform == "tpu":
            return "mixed_bfloat16"
        if device.platform != "gpu":
            return "float32"
        return gpu_precision(tuple(int(part) for part in str(getattr(device, "compute_capability", "0.0")).split(".")))
    import torch

    return gpu_precision(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else "float32"


@dataclasses.dataclass
class _Sums:
    """Example-weighted sums of per-batch metrics (``train_on_batch`` reports each batch's own); JSON as it is."""

    totals: dict = dataclasses.field(default_factory=dict)
    examples: int = 0

    def add(self, logs: dict, examples: int) -> None:
        for key, value in logs.items():
            self.totals[key] = self.totals.get(key, 0.0) + float(value) * examples
        self.examples += examples

    def mean(self, key: str) -> float:
        return self.totals.get(key, float("nan")) / self.examples if self.examples else float("nan")


class KerasSteps:
    """Devices, precision, NumPy input and Keras's compiled steps for one run on JAX or PyTorch."""

    def __init__(self, config: TrainConfig, manifest: Manifest, backend: str):
        self.config, self.manifest, self.backend = config, manifest, backend
        self.precision = resolve_precision(config.precision, backend)
        self.devices = _jax_devices() if backend == "jax" else None
        several = self.devices is not None and len(self.devices) > 1
        self.distribution = keras.distribution.DataParallel(devices=self.devices) if several else None
        self.replicas = len(self.devices) if self.distribution is not None else 1
        # JAX always compiles its step (XLA); PyTorch runs eagerly unless --jit-compile asks for torch.compile.
        self.jit_compile = backend == "jax" or bool(config.jit_compile)
        self.model = None
        self._train, self._val = _Sums(), _Sums()

    def describe(self) -> str:
        if self.backend == "jax":
            platform = self.devices[0].platform.upper()
            if self.distribution is not None:
                return f"JAX DataParallel over {self.replicas} {platform} devices"
            return f"JAX on one {platform} device"
        import torch

        return f"PyTorch on {'one GPU (' + torch.cuda.get_device_name(0) + ')' if torch.cuda.is_available() else 'CPU'}"

    def scope(self):
        """Variables are laid out over the devices inside this scope (the distribution, when there is one)."""
        return self.distribution.scope() if self.distribution is not None else contextlib.nullcontext()

    def compile(self, model: keras.Model, optimizer, num_classes: int) -> None:
        smoothing = self.config.label_smoothing
        # Weighted: the copies padding a validation batch over the devices weigh nothing (Keras applies sample
        # weights to weighted_metrics only); without weights they are the same metrics, to the bit.
        model.compile(optimizer=optimizer, loss=SmoothedCrossentropy(num_classes, smoothing),
                      weighted_metrics=[SmoothedCrossentropyMean(num_classes, smoothing), "accuracy"],
                      jit_compile=self.jit_compile)
        self.model = model

    def _reader(self, split: str, training: bool, seed: int | None, start_step: int):
        from shardprep.train.data.numpy_reader import NumpyReader

        return NumpyReader(self.config.data_dir, split, self.config.batch_size, training, seed,
                           start_step=start_step, manifest=self.manifest, verify_records=self.config.verify_records)

    def streamed(self) -> bool:
        """Never: NumpyReader reads local shards by random access, in an order addressed by step."""
        return False

    @staticmethod
    def input_error(error: Exception) -> str | None:
        """What a reading error raised by ``next()`` says, for one error line (a bad or short record)."""
        from shardprep.preprocess.format.record_format import RecordFormatError

        return str(error) if isinstance(error, (OSError, RecordFormatError)) else None

    def train_batches(self, seed: int | None, start_step: int, steps_per_epoch: int):
        """The endless training input from global step ``start_step`` of the seeded order."""
        return iter(self._reader(self.config.train_split, True, seed, start_step))

    def val_batches(self):
        """One pass over the validation split."""
        return self._reader(self.config.val_split, False, None, 0)

    def train_step(self, batch) -> None:
        images, labels = batch
        logs = self.model.train_on_batch(images, labels, return_dict=True)
        self._train.add({"loss": logs["data_loss"], "accuracy": logs["accuracy"]}, len(labels))

    def eval_step(self, batch) -> None:
        images, labels = batch
        examples, weights = len(labels), None
        padding = self._eval_rows(examples) - examples
        if padding:
            images = np.concatenate([images, np.repeat(images[-1:], padding, axis=0)])
            labels = np.concatenate([labels, np.repeat(labels[-1:], padding, axis=0)])
        if padding or self.jit_compile:
            # Weights on every batch of a compiled step: a batch with them is another input than one without.
            weights = np.concatenate([np.ones(examples, np.float32), np.zeros(padding, np.float32)])
        logs = self.model.test_on_batch(images, labels, sample_weight=weights, return_dict=True)
        self._val.add({"val_loss": logs["data_loss"], "val_accuracy": logs["accuracy"]}, examples)

    def _eval_rows(self, examples: int) -> int:
        """The rows a validation batch is evaluated as, padded with copies weighing nothing: a multiple of the devices
        and, compiled, the full batch (XLA would compile a second step for a short one)."""
        rows = max(examples, self.config.batch_size) if self.jit_compile else examples
        return -(-rows // self.replicas) * self.replicas

    def reset(self) -> None:
        self._train, self._val = _Sums(), _Sums()

    def metric_state(self) -> dict:
        """The epoch's training sums so far (Python floats: JSON keeps them exactly)."""
        return dataclasses.asdict(self._train)

    def restore_metric_state(self, state: dict) -> bool:
        """Continues the epoch's sums from :meth:`metric_state`; False, changing nothing, for another form."""
        totals, examples = state.get("totals"), state.get("examples")
        if not (isinstance(totals, dict) and isinstance(examples, int)
                and all(isinstance(value, (int, float)) for value in totals.values())):
            return False
        self._train = _Sums({key: float(value) for key, value in totals.items()}, examples)
        return True

    def train_results(self) -> dict:
        return {"loss": self._train.mean("loss"), "accuracy": self._train.mean("accuracy")}

    def val_results(self) -> dict:
        return {"val_loss": self._val.mean("val_loss"), "val_accuracy": self._val.mean("val_accuracy")}
