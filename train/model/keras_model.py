"""The model: ResNet-18 (He et al. 2015; torchvision's init, channels-last) behind :class:`CropFlipNormalize`, uint8
in, logits out; the inference model in Keras's own layers; the smoothed float32 cross-entropy and SGD on a warm-up
then cosine/step schedule or ReduceLROnPlateau, registered with Keras so checkpoints load.
"""

from __future__ import annotations

import math

import keras
from keras import layers, ops

from shardprep.train.model.augment import CropFlipNormalize
from shardprep.train.model.predict import classes_name
from shardprep.train.run.config import TrainConfig

STAGE_WIDTHS = (64, 128, 256, 512)
BLOCKS_PER_STAGE = (2, 2, 2, 2)
BATCH_NORM_MOMENTUM = 0.9
BATCH_NORM_EPSILON = 1e-5
DATA_FORMAT = "channels_last"


def _conv(filters: int, kernel_size: int, strides: int, regularizer, name: str):
    return layers.Conv2D(
        filters, kernel_size, strides=strides, padding="same", use_bias=False, data_format=DATA_FORMAT,
        kernel_initializer=keras.initializers.VarianceScaling(2.0, mode="fan_out", distribution="untruncated_normal"),
        kernel_regularizer=regularizer, name=name)


def _batch_norm(name: str):
    return layers.BatchNormalization(axis=-1, momentum=BATCH_NORM_MOMENTUM, epsilon=BATCH_NORM_EPSILON, name=name)


def _basic_block(x, filters: int, strides: int, regularizer, name: str):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv(filters, 1, strides, regularizer, f"{name}_projection")(x)
        shortcut = _batch_norm(f"{name}_projection_bn")(shortcut)
    x = _conv(filters, 3, strides, regularizer, f"{name}_conv1")(x)
    x = _batch_norm(f"{name}_bn1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(x)
    x = _conv(filters, 3, 1, regularizer, f"{name}_conv2")(x)
    x = _batch_norm(f"{name}_bn2")(x)
    x = layers.Add(name=f"{name}_add")([x, shortcut])
    return layers.ReLU(name=f"{name}_relu2")(x)


def resnet18_layers(x, num_classes: int, width_multiplier: float = 1.0, weight_decay: float = 0.0):
    """ResNet-18 on float ``x`` ``[B, H, W, 3]`` to float32 logits; ``width_multiplier`` scales every layer's
    channels; ``weight_decay``: He et al.'s coupled L2 (1e-4) on convolution and dense kernels."""
    regularizer = keras.regularizers.L2(weight_decay / 2) if weight_decay else None
    widths = [max(1, round(width * width_multiplier)) for width in STAGE_WIDTHS]
    x = _conv(widths[0], 7, 2, regularizer, "stem_conv")(x)
    x = _batch_norm("stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.MaxPooling2D(3, strides=2, padding="same", data_format=DATA_FORMAT, name="stem_pool")(x)
    for stage, (filters, blocks) in enumerate(zip(widths, BLOCKS_PER_STAGE), start=1):
        for block in range(blocks):
            strides = 2 if stage > 1 and block == 0 else 1
            x = _basic_block(x, filters, strides, regularizer, f"stage{stage}_block{block + 1}")
    x = layers.GlobalAveragePooling2D(data_format=DATA_FORMAT, name="pool")(x)
    # Logits in float32 under mixed precision: the softmax and the loss need the range.
    return layers.Dense(num_classes, kernel_regularizer=regularizer, dtype="float32", name="logits")(x)


def resnet18(num_classes: int, input_shape=(224, 224, 3), width_multiplier: float = 1.0,
             weight_decay: float = 0.0) -> keras.Model:
    """ResNet-18 from normalized float images to logits, as a Keras functional model (see :func:`resnet18_layers`)."""
    inputs = keras.Input(input_shape, name="images")
    return keras.Model(inputs, resnet18_layers(inputs, num_classes, width_multiplier, weight_decay), name="resnet18")


def build_model(num_classes: int, image_size: int, mean_rgb, std_rgb, *, augment: str = "crop",
                seed: int | None = None, width_multiplier: float = 1.0, weight_decay: float = 0.0,
                classes=None) -> keras.Model:
    """The training model: uint8 images in, augmented or centrally cropped, normalized, logits out; named by
    ``classes`` (:func:`classes_name`) when given."""
    images = keras.Input((None, None, 3), dtype="uint8", name="images")
    x = CropFlipNormalize(image_size, mean_rgb, std_rgb, augment=augment, seed=seed, name="crop_flip_normalize")(
        images)
    logits = resnet18_layers(x, num_classes, width_multiplier=width_multiplier, weight_decay=weight_decay)
    return keras.Model(images, logits, name="shardprep_resnet18" if classes is None else classes_name(classes))


def inference_model(model: keras.Model) -> keras.Model:
    """The model of :func:`build_model` in Keras's own layers, with its weights, not compiled: its
    ``CropFlipNormalize`` becomes ``CenterCrop`` and ``Normalization(mean, variance=std**2)`` (float32), every other
    layer a fresh copy of the same config, so plain ``keras.models.load_model`` loads it on any backend."""
    normalizing = next((layer for layer in model.layers if isinstance(layer, CropFlipNormalize)), None)
    crops = []  # the CenterCrop standing in for it, which the Normalization follows

    def clone_layer(layer):
        if layer is normalizing:
            crops.append(keras.layers.CenterCrop(layer.image_size, layer.image_size, dtype="float32",
                                                 name="center_crop"))
            return crops[-1]
        return layer.__class__.from_config(layer.get_config())

    def call_layer(layer, *args, **kwargs):
        if layer not in crops:
            return layer(*args, **kwargs)
        # training=False in the graph: CenterCrop's call defaults to training=True, which a model called without
        # `training` would pass on to the batch normalizations after it (a call with `training` overrides it).
        cropped = layer(*args, **{**kwargs, "training": False})
        variance = [std ** 2 for std in normalizing.std_rgb]
        return keras.layers.Normalization(mean=normalizing.mean_rgb, variance=variance, dtype="float32",
                                          name="normalization")(cropped)

    cloned = keras.models.clone_model(model, clone_function=clone_layer, call_function=call_layer)
    inference = keras.Model(cloned.input, cloned.output, name=model.name)  # clone_model compiles as the model was
    for layer in inference.layers:
        if layer.weights and layer.name in {original.name for original in model.layers}:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    return inference


def save_inference_model(model: keras.Model, path: str) -> None:
    """Saves :func:`inference_model` of ``model`` to ``path`` (a ``.keras`` file)."""
    inference_model(model).save(path)


def load_model(path: str) -> keras.Model:
    """Loads a ``model.keras`` of ``shardprep train`` (any version) or a checkpoint."""
    return keras.models.load_model(path)


def smoothed_crossentropy(labels, logits, num_classes: int, label_smoothing: float):
    """Per-example float32 cross-entropy of ``logits`` against the one-hot of ``labels``, smoothed."""
    one_hot = ops.one_hot(ops.cast(ops.reshape(labels, (-1,)), "int32"), num_classes, dtype="float32")
    return keras.losses.categorical_crossentropy(one_hot, ops.cast(logits, "float32"), from_logits=True,
                                                 label_smoothing=label_smoothing)


@keras.saving.register_keras_serializable(package="shardprep")
class SmoothedCrossentropy(keras.losses.Loss):
    """:func:`smoothed_crossentropy` as a Keras loss, averaged over the batch."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, name: str = "smoothed_crossentropy",
                 reduction: str = "sum_over_batch_size", dtype: str | None = "float32"):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.num_classes, self.label_smoothing = int(num_classes), float(label_smoothing)

    def call(self, y_true, y_pred):
        return smoothed_crossentropy(y_true, y_pred, self.num_classes, self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="shardprep")
class SmoothedCrossentropyMean(keras.metrics.MeanMetricWrapper):
    """The running mean of :func:`smoothed_crossentropy` (the loss without weight decay)."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, name: str = "data_loss",
                 dtype: str | None = "float32"):
        super().__init__(smoothed_crossentropy, name=name, dtype=dtype, num_classes=int(num_classes),
                         label_smoothing=float(label_smoothing))
        self.num_classes, self.label_smoothing = int(num_classes), float(label_smoothing)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "num_classes": self.num_classes,
                "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="shardprep")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps``, or step decay
    (``* decay`` at each of ``boundaries``), or constant (``kind="constant"``)."""

    def __init__(self, base_lr: float, warmup_steps: int, total_steps: int, kind: str = "cosine",
                 boundaries=(), decay: float = 0.1):
        self.base_lr, self.warmup_steps, self.total_steps = float(base_lr), int(warmup_steps), int(total_steps)
        self.kind, self.boundaries, self.decay = kind, [int(b) for b in boundaries], float(decay)

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
    """SGD with momentum on ``config.lr_schedule``; loss-scaled under ``mixed_float16``."""
    warmup = warmup_steps(config, steps_per_epoch)
    if config.lr_schedule == "plateau":
        learning_rate = base_lr / warmup if warmup else base_lr
    else:
        step_epochs = config.lr_step_epochs or (config.epochs / 3, 2 * config.epochs / 3, 8 * config.epochs / 9)
        learning_rate = WarmupSchedule(base_lr, warmup, config.epochs * steps_per_epoch, kind=config.lr_schedule,
                                       boundaries=[round(e * steps_per_epoch) for e in step_epochs],
                                       decay=config.lr_decay)
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate, momentum=config.momentum, nesterov=False)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
