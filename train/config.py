"""The options of a training run (:class:`TrainConfig`) and their allowed values, free of TensorFlow and Keras.

The CLI imports these to build ``shardprep train --help`` without loading TensorFlow; the training modules import
them too, so there is one list of choices.
"""

from __future__ import annotations

import dataclasses

PRECISIONS = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
LR_SCHEDULES = ("cosine", "step", "plateau")
AUGMENTATIONS = ("crop", "rrc")


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
