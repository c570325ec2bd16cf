"""The options of a training run (:class:`TrainConfig`) and their choices, without TensorFlow or Keras (the CLI's
``--help`` imports them), and the Keras backend's choice (:func:`activate_backend`), made before Keras is imported.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import os
import sys
from typing import NamedTuple

PRECISIONS = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
LR_SCHEDULES = ("cosine", "step", "plateau")
AUGMENTATIONS = ("crop", "rrc")


def gpu_precision(capability) -> str:
    """``--precision auto`` on a GPU of compute ``capability``: bfloat16 where it is fast (8.0+), else float16."""
    return "mixed_bfloat16" if tuple(capability) >= (8, 0) else "mixed_float16"


class BackendInfo(NamedTuple):
    """A Keras backend shardprep trains on: its package, how to install it, what a run on it uses."""

    module: str
    install: str
    summary: str


# In the order of preference when neither --backend nor KERAS_BACKEND chooses (the first installed).
BACKEND_INFO = {
    "tensorflow": BackendInfo("tensorflow", "pip install tensorflow",
                              "all GPUs (MirroredStrategy), tf.data input, XLA with one GPU"),
    "jax": BackendInfo("jax", "pip install jax, or 'jax[cuda12]' for NVIDIA GPUs",
                       "every device of one host (keras.distribution.DataParallel when several; one JAX process "
                       "only), XLA always, NumPy input (local datasets only)"),
    "torch": BackendInfo("torch", "pip install torch, the CUDA build for your GPU: see pytorch.org",
                         "one device (the GPU when there is one), NumPy input (local datasets only), torch.compile "
                         "with --jit-compile")}
BACKENDS = tuple(BACKEND_INFO)


class BackendError(ValueError):
    """The requested Keras backend cannot be used in this process; the message says why and what to do."""


def backend_installed(name: str) -> bool:
    """Whether the backend's package can be imported, asked of the path finder alone (``find_spec`` would also ask
    the CLI's quiet-import hook, which would take the question for the import)."""
    module = BACKEND_INFO[name].module
    return module in sys.modules or importlib.machinery.PathFinder.find_spec(module) is not None


def default_backend(environ=None) -> str:
    """``$KERAS_BACKEND`` when set, else tensorflow when it is installed, else jax, else torch."""
    environ = os.environ if environ is None else environ
    return environ.get("KERAS_BACKEND") or next((name for name in BACKENDS if backend_installed(name)), BACKENDS[0])


def activate_backend(name: str) -> str:
    """Makes ``name`` this process's Keras backend before Keras is imported (else :class:`BackendError`)."""
    if name not in BACKENDS:
        raise BackendError(f"backend {name!r} (--backend or KERAS_BACKEND) is not one shardprep trains on; choose "
                           f"one of {', '.join(BACKENDS)}")
    if not backend_installed(name):
        installed = [other for other in BACKENDS if backend_installed(other)]
        raise BackendError(f"--backend {name}: {BACKEND_INFO[name].module} is not installed: "
                           f"{BACKEND_INFO[name].install}; "
                           f"installed here: {', '.join(installed) or 'none'}")
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != name:
        raise BackendError(f"Keras is already imported with the {keras.backend.backend()} backend in this process, "
                           f"and it fixes its backend at its first import: set KERAS_BACKEND={name} before "
                           "anything imports keras (or run shardprep train in a new process)")
    os.environ["KERAS_BACKEND"] = name
    return name


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
    # Also every N training steps, a checkpoint (model, optimizer, callbacks, the reader's position) --resume can
    # continue from mid-epoch; None: at epoch ends only.
    checkpoint_every_steps: int | None = None
    backend: str | None = None  # None: the backend Keras was imported with (the CLI activates its choice first)

    def validate(self):
        for name, choices in (("precision", PRECISIONS), ("lr_schedule", LR_SCHEDULES), ("augment", AUGMENTATIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}")
        if self.epochs < 1 or self.batch_size < 1 or self.image_size < 1:
            raise ValueError("epochs, batch_size and image_size must be positive")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ValueError("checkpoint_every_steps must be positive")
        if self.backend is not None:
            if self.backend not in BACKENDS:
                raise ValueError(f"backend must be one of {BACKENDS}")
            self.check_backend(self.backend)

    def streamed(self) -> bool:
        """Whether the TensorFlow reader streams the shards (``--sequential-reads``, or a URL)."""
        return self.sequential_reads or "://" in self.data_dir

    def check_backend(self, backend: str) -> None:
        """A ValueError naming the first option ``backend`` cannot honour: options are refused, never ignored."""
        if problem := unsupported_option(self, backend):
            raise ValueError(problem)


def avoid_crashing_kernels(config: TrainConfig) -> None:
    """TF_ENABLE_ONEDNN_OPTS=0 (unless set): TensorFlow 2.21's oneDNN CPU kernels kill a run of a stem under 16
    channels (seen from 8) and an odd batch; it counts only before TensorFlow starts, as in the CLI."""
    if config.backend == "tensorflow" and round(64 * config.width_multiplier) < 16 and config.batch_size % 2:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def unsupported_option(config: TrainConfig, backend: str) -> str | None:
    """Why ``backend`` cannot run ``config`` as asked (naming the option and what to do instead), or None."""
    other = "--backend tensorflow"
    if backend != "tensorflow":
        if "://" in config.data_dir:
            return (f"--backend {backend} reads local datasets only (NumPy input), not {config.data_dir}: copy the "
                    f"dataset to a local disk, or train with {other}")
        if config.sequential_reads:
            return (f"--sequential-reads streams shards through tf.data, which --backend {backend} does not use "
                    f"(its NumPy input reads local shards by random access): drop --sequential-reads, or train "
                    f"with {other}")
    if config.shuffle_buffer is not None and not (backend == "tensorflow" and config.streamed()):
        return ("--shuffle-buffer sizes the shuffle buffer of streamed reads (--sequential-reads or a gs:// dataset "
                "on --backend tensorflow); local shards read by random access are shuffled in a full permutation "
                "each epoch and have no buffer: drop --shuffle-buffer" +
                (", or add --sequential-reads" if backend == "tensorflow" else ""))
    if backend == "jax" and config.jit_compile is False:
        return "--no-jit-compile: --backend jax always compiles its step with XLA (jax.jit); drop --no-jit-compile"
    if config.profile_batch not in ("0", 0):
        if not config.tensorboard:
            return ("--profile-batch traces batches into the TensorBoard logs, which --no-tensorboard turns off: "
                    "drop one of them")
        if backend == "torch":
            return "--profile-batch: Keras's TensorBoard profiler does not run on --backend torch; drop it"
        if backend == "jax" and sys.version_info < (3, 12):
            return (f"--profile-batch on --backend jax needs Python 3.12 or newer (Keras's profiler), this is "
                    f"{sys.version_info.major}.{sys.version_info.minor}: drop it, or train with {other}")
    return None
