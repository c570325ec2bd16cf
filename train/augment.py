"""On-device augmentation: batched crops, flips and normalization with per-image random parameters.

The reader ships stored ``uint8`` images; these functions turn a whole batch into the network's ``float32`` input
in a few batched ops (gathers and small matrix products), so they run on the accelerator as the first layer of
the model, compile under XLA, and cost the host nothing. :class:`CropFlipNormalize` wraps them as a Keras layer,
which is how the saved model applies the evaluation crop and normalization by itself.

* ``crop`` (default): a random ``size`` x ``size`` window (e.g. 224 of the stored 256) and a horizontal flip with
  probability 1/2. The window is gathered, not interpolated, so pixels are exactly the stored ones.
* ``rrc``: Inception-style random-resized-crop (area 8-100% of the image, aspect ratio 3/4-4/3, up to 10 tries
  per image, else the largest central window within those ratios), resized to ``size`` with an antialiased
  bilinear (triangle) filter, then flipped with probability 1/2.
* evaluation: the central ``size`` x ``size`` window.

Every function takes a stateless ``seed`` (shape ``[2]`` integers): the same seed gives the same augmentation.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from shardprep.train.config import AUGMENTATIONS

RRC_AREA_RANGE = (0.08, 1.0)
RRC_ASPECT_RANGE = (3 / 4, 4 / 3)
RRC_ATTEMPTS = 10


def _split_seed(seed, count: int):
    """``count`` independent stateless seeds derived from ``seed``."""
    return tf.unstack(tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=count))


def _uniform(shape, seed, low=0.0, high=1.0):
    return tf.random.stateless_uniform(shape, seed=seed, minval=low, maxval=high, dtype=tf.float32)


def center_crop(images, size: int):
    """The central ``size`` x ``size`` window of each image of a ``[B, H, W, C]`` batch (H, W >= size)."""
    shape = tf.shape(images)
    top, left = (shape[1] - size) // 2, (shape[2] - size) // 2
    cropped = images[:, top:top + size, left:left + size, :]
    cropped.set_shape([images.shape[0], size, size, images.shape[-1]])
    return cropped


def random_crop_flip(images, size: int, seed):
    """A random ``size`` x ``size`` window of each image, mirrored left-right for a random half of the batch.

    Windows are gathered by index, so each output pixel is a stored pixel; every image gets its own position.
    """
    offsets_seed, flip_seed = _split_seed(seed, 2)
    shape = tf.shape(images)
    batch = shape[0]
    spare = tf.cast(tf.stack([shape[1], shape[2]]) - size + 1, tf.float32)  # possible positions per axis
    positions = tf.cast(tf.floor(_uniform([batch, 2], offsets_seed) * spare), tf.int32)
    positions = tf.minimum(positions, tf.cast(spare, tf.int32) - 1)  # uniform() < 1, but stay safe from rounding
    steps = tf.range(size)[tf.newaxis, :]
    rows = positions[:, :1] + steps
    columns = positions[:, 1:] + steps
    flip = _uniform([batch], flip_seed) < 0.5
    columns = tf.where(flip[:, tf.newaxis], tf.reverse(columns, axis=[1]), columns)
    cropped = tf.gather(images, rows, axis=1, batch_dims=1)
    cropped = tf.gather(cropped, columns, axis=2, batch_dims=1)
    cropped.set_shape([images.shape[0], size, size, images.shape[-1]])
    return cropped


def sample_rrc_windows(batch, height, width, seed, area_range=RRC_AREA_RANGE, aspect_range=RRC_ASPECT_RANGE,
                       attempts: int = RRC_ATTEMPTS):
    """Random-resized-crop windows ``(top, left, window_height, window_width)``, float32 ``[batch]`` each.

    Per image: up to ``attempts`` draws of area fraction in ``area_range`` and log-uniform aspect ratio (w/h) in
    ``aspect_range``; the first that fits is used, else the largest central window whose aspect ratio is in the
    range (as torchvision does). Windows are in pixels and lie inside the image; they need not be whole pixels.
    """
    area_seed, aspect_seed, position_seed = _split_seed(seed, 3)
    height = tf.cast(height, tf.float32)
    width = tf.cast(width, tf.float32)
    area = _uniform([batch, attempts], area_seed, *area_range) * height * width
    log_aspect = _uniform([batch, attempts], aspect_seed, math.log(aspect_range[0]), math.log(aspect_range[1]))
    aspect = tf.exp(log_aspect)
    window_width = tf.sqrt(area * aspect)
    window_height = tf.sqrt(area / aspect)
    fits = (window_width <= width) & (window_height <= height)
    first_fit = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
    window_height = tf.gather(window_height, first_fit, batch_dims=1)
    window_width = tf.gather(window_width, first_fit, batch_dims=1)

    image_aspect = width / height
    fallback_width = tf.where(image_aspect > aspect_range[1], height * aspect_range[1], width)
    fallback_height = tf.where(image_aspect < aspect_range[0], width / aspect_range[0], height)
    any_fit = tf.reduce_any(fits, axis=1)
    window_height = tf.where(any_fit, window_height, fallback_height)
    window_width = tf.where(any_fit, window_width, fallback_width)

    position = _uniform([batch, 2], position_seed)
    top = tf.where(any_fit, position[:, 0] * (height - window_height), (height - window_height) / 2)
    left = tf.where(any_fit, position[:, 1] * (width - window_width), (width - window_width) / 2)
    return top, left, window_height, window_width


def _resize_weights(start, extent, source_size, size: int):
    """``[B, size, source_size]`` antialiased bilinear weights mapping a window of each row/column onto ``size``.

    Output sample ``i`` sits at ``start + (i + 0.5) * extent / size - 0.5`` in source pixel centres (half-pixel
    convention, as ``tf.image.resize``); the triangle kernel widens by the downscale factor, and each row of weights
    is normalized, so edges renormalize instead of reading outside the window's image.
    """
    scale = extent / size  # source pixels per output pixel, [B]
    centres = start[:, tf.newaxis] + (tf.range(size, dtype=tf.float32)[tf.newaxis, :] + 0.5) * scale[:, tf.newaxis]
    centres -= 0.5
    support = tf.maximum(scale, 1.0)[:, tf.newaxis, tf.newaxis]
    source = tf.range(source_size, dtype=tf.float32)[tf.newaxis, tf.newaxis, :]
    weights = tf.nn.relu(1.0 - tf.abs(source - centres[:, :, tf.newaxis]) / support)
    return weights / tf.reduce_sum(weights, axis=2, keepdims=True)


def resize_windows(images, top, left, window_height, window_width, size: int, flip=None):
    """Each image's window resized to ``size`` x ``size`` (float32), optionally mirrored left-right.

    Two batched matrix products (rows, then columns) with per-image interpolation weights: no per-image ops.
    """
    images = tf.cast(images, tf.float32)
    shape = tf.shape(images)
    row_weights = _resize_weights(top, window_height, shape[1], size)      # [B, size, H]
    column_weights = _resize_weights(left, window_width, shape[2], size)   # [B, size, W]
    if flip is not None:
        column_weights = tf.where(flip[:, tf.newaxis, tf.newaxis], tf.reverse(column_weights, axis=[1]),
                                  column_weights)
    resized = tf.einsum("bih,bhwc->biwc", row_weights, images)
    resized = tf.einsum("bjw,biwc->bijc", column_weights, resized)
    resized.set_shape([images.shape[0], size, size, images.shape[-1]])
    return resized


def random_resized_crop_flip(images, size: int, seed, area_range=RRC_AREA_RANGE, aspect_range=RRC_ASPECT_RANGE):
    """Inception-style random-resized-crop of each image to ``size`` x ``size``, flipped for a random half."""
    window_seed, flip_seed = _split_seed(seed, 2)
    shape = tf.shape(images)
    windows = sample_rrc_windows(shape[0], shape[1], shape[2], window_seed, area_range, aspect_range)
    flip = _uniform([shape[0]], flip_seed) < 0.5
    return resize_windows(images, *windows, size=size, flip=flip)


def normalize(images, mean_rgb, std_rgb):
    """``(images - mean) / std`` in float32, with per-channel mean and std on the 0-255 scale."""
    mean = tf.constant(mean_rgb, tf.float32)
    std = tf.constant(std_rgb, tf.float32)
    return (tf.cast(images, tf.float32) - mean) / std


@keras.saving.register_keras_serializable(package="shardprep")
class CropFlipNormalize(keras.layers.Layer):
    """The model's input layer: stored ``uint8`` images in, normalized ``float32`` ``size`` x ``size`` out.

    In training (``training=True``) it applies ``augment`` (``"crop"``: random crop + flip, ``"rrc"``: random-
    resized-crop + flip) with fresh per-image parameters every batch; otherwise the central crop. Images may be any
    size >= ``image_size``; the output is normalized with the dataset's ``mean_rgb`` / ``std_rgb`` (0-255 scale).
    It always computes in float32, whatever the mixed-precision policy: the next layer casts.
    """

    def __init__(self, image_size: int, mean_rgb, std_rgb, augment: str = "crop", seed: int | None = None,
                 **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {augment!r}")
        self.image_size = int(image_size)
        self.mean_rgb = [float(v) for v in mean_rgb]
        self.std_rgb = [float(v) for v in std_rgb]
        self.augment = augment
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        """Rejects images smaller than the crop when their size is known here (``keras.Input((72, 72, 3))``);
        a model built for any size (``(None, None, 3)``, as :func:`~shardprep.train.model.build_model` does) gets
        no check, and must be given images of at least ``image_size`` a side."""
        sides = [side for side in tuple(input_shape)[1:3] if side is not None]
        if sides and min(sides) < self.image_size:
            height, width = (tuple(input_shape)[1:3] + (None, None))[:2]
            shown = "x".join("?" if side is None else str(side) for side in (height, width))
            raise ValueError(f"CropFlipNormalize({self.image_size}) crops {self.image_size}x{self.image_size} "
                             f"windows, but its input images are {shown}: give images of at least "
                             f"{self.image_size}x{self.image_size}, or a smaller image_size")
        super().build(input_shape)

    def call(self, images, training=None):
        if training:
            seed = self.seed_generator.next()
            if self.augment == "rrc":
                images = random_resized_crop_flip(images, self.image_size, seed)
            else:
                images = random_crop_flip(images, self.image_size, seed)
        else:
            images = center_crop(images, self.image_size)
        return normalize(images, self.mean_rgb, self.std_rgb)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.image_size, self.image_size, input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(image_size=self.image_size, mean_rgb=self.mean_rgb, std_rgb=self.std_rgb,
                      augment=self.augment, seed=self.seed)
        return config
