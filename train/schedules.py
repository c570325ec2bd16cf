"""Learning-rate schedules (warm-up then cosine or step decay: :class:`WarmupSchedule`, registered with Keras; the
warm-up before ReduceLROnPlateau: :class:`PlateauWarmup`) and the SGD optimizer.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from shardprep.train.config import TrainConfig


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
        # keras.ops, so the schedule runs inside every backend's compiled step.
        step = ops.cast(step, "float32")
        warmup = float(self.warmup_steps)
        if self.kind == "cosine":
            progress = ops.clip((step - warmup) / max(1.0, self.total_steps - warmup), 0.0, 1.0)
            lr = 0.5 * self.base_lr * (1.0 + ops.cos(math.pi * progress))
        elif self.kind == "step":
            passed = sum(ops.cast(step >= b, "float32") for b in self.boundaries) if self.boundaries else 0.0
            lr = self.base_lr * ops.power(self.decay, passed)
        else:
            lr = ops.full((), self.base_lr, "float32")
        if self.warmup_steps:
            lr = ops.where(step < warmup, self.base_lr * (step + 1.0) / warmup, lr)
        return lr

    def get_config(self):
        return dict(base_lr=self.base_lr, warmup_steps=self.warmup_steps, total_steps=self.total_steps,
                    kind=self.kind, boundaries=self.boundaries, decay=self.decay)


class PlateauWarmup(keras.callbacks.Callback):
    """Linear warm-up for ``--lr-schedule plateau`` (a plain rate ReduceLROnPlateau can lower), the step counted
    here: reading the optimizer's would wait for the device each step."""

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


def warmup_steps(config: TrainConfig, steps_per_epoch: int) -> int:
    return int(round(config.warmup_epochs * steps_per_epoch))


def make_optimizer(config: TrainConfig, base_lr: float, steps_per_epoch: int, precision: str):
    """SGD with momentum on ``config.lr_schedule``: a :class:`WarmupSchedule`, or for ``plateau`` a plain rate that
    :class:`PlateauWarmup` and ReduceLROnPlateau set; loss-scaled under ``mixed_float16``."""
    warmup = warmup_steps(config, steps_per_epoch)
    total_steps = config.epochs * steps_per_epoch
    if config.lr_schedule == "plateau":
        learning_rate = base_lr / warmup if warmup else base_lr
    else:
        step_epochs = config.lr_step_epochs or (config.epochs / 3, 2 * config.epochs / 3, 8 * config.epochs / 9)
        learning_rate = WarmupSchedule(base_lr, warmup, total_steps, kind=config.lr_schedule,
                                       boundaries=[round(e * steps_per_epoch) for e in step_epochs],
                                       decay=config.lr_decay)
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate, momentum=config.momentum, nesterov=False)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
