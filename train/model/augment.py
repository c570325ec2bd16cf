"""On-device augmentation in ``keras.ops``/``keras.random`` only (every backend, XLA, ``jax.jit``), the model's first
layer (:class:`CropFlipNormalize`): ``crop`` (random window, flipped), ``rrc`` (Inception-style random-resized-crop,
flipped) or the central window in evaluation, then normalization.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from shardprep.train.run.config import AUGMENTATIONS

RRC_AREA_RANGE = (0.08, 1.0)
RRC_ASPECT_RANGE = (3 / 4, 4 / 3)
RRC_ATTEMPTS = 10


def _uniforms(batch, count: int, seed):
    """``float32 [batch, count]`` uniform in [0, 1): every random number one call needs, in one draw."""
    return keras.random.uniform((batch, count), dtype="float32", seed=seed)


def _with_static_shape(images, size: int):
    """``images`` reshaped to ``[B, size, size, C]``: a no-op that gives TensorFlow's graph the known sides back."""
    channels = images.shape[-1] if images.shape[-1] is not None else ops.shape(images)[-1]
    return ops.reshape(images, (-1, size, size, channels))


def center_crop(images, size: int):
    """The central ``size`` x ``size`` window of each image of a ``[B, H, W, C]`` batch (H, W >= size)."""
    batch, height, width, channels = ops.shape(images)
    top, left = (height - size) // 2, (width - size) // 2
    return _with_static_shape(ops.slice(images, (0, top, left, 0), (batch, size, size, channels)), size)


def random_crop_flip(images, size: int, seed):
    """A random ``size`` window of each image (stored pixels, one ``take``), mirrored for a random half."""
    batch, height, width, channels = ops.shape(images)
    draws = _uniforms(batch, 3, seed)  # top, left, flip
    spare_rows, spare_columns = height - size + 1, width - size + 1  # possible positions per axis
    top = ops.cast(ops.floor(draws[:, 0] * ops.cast(spare_rows, "float32")), "int32")
    left = ops.cast(ops.floor(draws[:, 1] * ops.cast(spare_columns, "float32")), "int32")
    top = ops.minimum(top, spare_rows - 1)  # uniform() < 1, but stay safe from rounding
    left = ops.minimum(left, spare_columns - 1)
    steps = ops.arange(size, dtype="int32")[None, :]
    rows = top[:, None] + steps                                   # [B, size]
    columns = left[:, None] + steps
    columns = ops.where(draws[:, 2:3] < 0.5, ops.flip(columns, axis=1), columns)
    image_starts = ops.arange(batch, dtype="int32") * ops.cast(height * width, "int32")
    pixel_ids = image_starts[:, None, None] + rows[:, :, None] * ops.cast(width, "int32") + columns[:, None, :]
    pixels = ops.reshape(images, (-1, channels))                 # [B * H * W, C]
    return _with_static_shape(ops.take(pixels, pixel_ids, axis=0), size)


def rrc_windows(draws, height, width, area_range=RRC_AREA_RANGE, aspect_range=RRC_ASPECT_RANGE,
                attempts: int = RRC_ATTEMPTS):
    """Random-resized-crop windows ``(top, left, height, width)``, float32 ``[B]`` each, from ``draws``, uniforms
    ``[B, 2 * attempts + 2]``: the first of ``attempts`` areas and aspects that fits, else the largest central window
    within the aspect range (as torchvision)."""
    height, width = ops.cast(height, "float32"), ops.cast(width, "float32")
    area = (area_range[0] + (area_range[1] - area_range[0]) * draws[:, :attempts]) * height * width
    low, high = math.log(aspect_range[0]), math.log(aspect_range[1])
    aspect = ops.exp(low + (high - low) * draws[:, attempts:2 * attempts])
    window_width = ops.sqrt(area * aspect)
    window_height = ops.sqrt(area / aspect)
    fits = ops.logical_and(window_width <= width, window_height <= height)
    first_fit = ops.argmax(ops.cast(fits, "int32"), axis=1)[:, None]
    window_height = ops.take_along_axis(window_height, first_fit, axis=1)[:, 0]
    window_width = ops.take_along_axis(window_width, first_fit, axis=1)[:, 0]

    image_aspect = width / height
    fallback_width = ops.where(image_aspect > aspect_range[1], height * aspect_range[1], width)
    fallback_height = ops.where(image_aspect < aspect_range[0], width / aspect_range[0], height)
    any_fit = ops.any(fits, axis=1)
    window_height = ops.where(any_fit, window_height, fallback_height)
    window_width = ops.where(any_fit, window_width, fallback_width)

    position = draws[:, 2 * attempts:2 * attempts + 2]
    top = ops.where(any_fit, position[:, 0] * (height - window_height), (height - window_height) / 2)
    left = ops.where(any_fit, position[:, 1] * (width - window_width), (width - window_width) / 2)
    return top, left, window_height, window_width


def _resize_weights(start, extent, source_size, size: int):
    """``[B, size, source_size]`` antialiased bilinear weights (half-pixel centres, rows normalized)."""
    scale = extent / size  # source pixels per output pixel, [B]
    outputs = ops.cast(ops.arange(size, dtype="int32"), "float32")
    centres = start[:, None] + (outputs[None, :] + 0.5) * scale[:, None] - 0.5
    support = ops.maximum(scale, 1.0)[:, None, None]
    source = ops.cast(ops.arange(source_size, dtype="int32"), "float32")[None, None, :]
    weights = ops.relu(1.0 - ops.abs(source - centres[:, :, None]) / support)
    return weights / ops.sum(weights, axis=2, keepdims=True)


def resize_windows(images, top, left, window_height, window_width, size: int, flip=None):
    """Each image's window resized to ``size`` (float32) by two batched matmuls, optionally mirrored."""
    images = ops.cast(images, "float32")
    _, height, width, _ = ops.shape(images)
    row_weights = _resize_weights(top, window_height, height, size)      # [B, size, H]
    column_weights = _resize_weights(left, window_width, width, size)    # [B, size, W]
    if flip is not None:
        column_weights = ops.where(flip[:, None, None], ops.flip(column_weights, axis=1), column_weights)
    resized = ops.einsum("bih,bhwc->biwc", row_weights, images)
    resized = ops.einsum("bjw,biwc->bijc", column_weights, resized)
    return _with_static_shape(resized, size)


def random_resized_crop_flip(images, size: int, seed, area_range=RRC_AREA_RANGE, aspect_range=RRC_ASPECT_RANGE):
    """Inception-style random-resized-crop of each image to ``size`` x ``size``, flipped for a random half."""
    batch, height, width, _ = ops.shape(images)
    draws = _uniforms(batch, 2 * RRC_ATTEMPTS + 3, seed)  # windows, then the flip
    windows = rrc_windows(draws, height, width, area_range, aspect_range)
    return resize_windows(images, *windows, size=size, flip=draws[:, -1] < 0.5)


def normalize(images, mean_rgb, std_rgb):
    """``(images - mean) / std`` in float32, with per-channel mean and std on the 0-255 scale."""
    mean, std = ops.convert_to_tensor(mean_rgb, "float32"), ops.convert_to_tensor(std_rgb, "float32")
    return (ops.cast(images, "float32") - mean) / std


@keras.saving.register_keras_serializable(package="shardprep")
class CropFlipNormalize(keras.layers.Layer):
    """The model's input layer: uint8 images (any size >= ``image_size``) in, normalized float32 squares out;
    ``augment`` with fresh draws every batch in training, else the central crop."""

    def __init__(self, image_size: int, mean_rgb, std_rgb, augment: str = "crop", seed: int | None = None,
                 **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {augment!r}")
        self.image_size, self.augment, self.seed = int(image_size), augment, seed
        self.mean_rgb, self.std_rgb = [float(v) for v in mean_rgb], [float(v) for v in std_rgb]
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        """Rejects images smaller than the crop when their size is known here (``(None, None, 3)`` is not)."""
        sides = tuple(input_shape)[1:3]
        if any(side is not None and side < self.image_size for side in sides):
            shown = "x".join("?" if side is None else str(side) for side in sides)
            raise ValueError(f"CropFlipNormalize({self.image_size}) crops {self.image_size}x{self.image_size} "
                             f"windows, but its input images are {shown}: give images of at least "
                             f"{self.image_size}x{self.image_size}, or a smaller image_size")
        super().build(input_shape)

    def call(self, images, training=None):
        if not training:
            images = center_crop(images, self.image_size)
        elif self.augment == "rrc":
            images = random_resized_crop_flip(images, self.image_size, self.seed_generator)
        else:
            images = random_crop_flip(images, self.image_size, self.seed_generator)
        return normalize(images, self.mean_rgb, self.std_rgb)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.image_size, self.image_size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "image_size": self.image_size, "mean_rgb": self.mean_rgb,
                "std_rgb": self.std_rgb, "augment": self.augment, "seed": self.seed}
