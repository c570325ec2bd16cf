"""ResNet-18 (He et al. 2015, "Deep Residual Learning for Image Recognition", table 1) in Keras 3, channels-last.

7x7/2 stem convolution with 64 channels, 3x3/2 max-pool, four stages of two BasicBlocks (two 3x3 convolutions and
an identity shortcut, or a 1x1 projection where the shape changes: option B) with 64, 128, 256 and 512 channels,
global average pooling and a dense classifier. Convolutions have no bias (batch normalization follows each);
initialization is He-normal (fan-out) as in torchvision; batch normalization uses momentum 0.9 and epsilon 1e-5
(PyTorch's 0.1 / 1e-5), so its moving statistics settle within tens of steps. With 1000 classes the network has
11,689,512 trainable parameters, the figure torchvision gives.

Only Keras's own layers, so it runs and saves on every Keras backend. Channels-last is fixed in every layer, not
taken from ``keras.config.image_data_format()``: the augmentation layer before it yields ``[B, H, W, C]``.
"""

from __future__ import annotations

import keras
from keras import layers

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
    """Applies ResNet-18 to the float tensor ``x`` (``[B, H, W, 3]``) and returns float32 logits ``[B, classes]``.

    ``width_multiplier`` scales every layer's channel count (1.0 is the real network; small values make test models
    that train in seconds). ``weight_decay`` is the classic coupled L2 coefficient of He et al. (1e-4): the
    gradient of every convolution and dense kernel gets ``weight_decay * w`` (biases and batch-norm parameters are
    not decayed).
    """
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
