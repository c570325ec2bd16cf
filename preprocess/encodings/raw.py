"""``--encoding raw``: the uint8 pixels themselves, H x W x 3 bytes, row-major."""

from __future__ import annotations

from shardprep.preprocess.encodings.base import CHANNELS, Encoding


class Raw(Encoding):
    """Pixels stored as they are: nothing to decode at train time, and every image of a size the same length, so
    centre crops get a fixed record layout."""

    name = "raw"
    summary = "uint8 HxWx3 bytes (no decode at train time)"
    label = "raw"
    # The shards hold exactly the pixels the manifest's mean/std were computed from: only float rounding differs.
    mean_std_tolerance = 0.05

    def encode(self, image, quality: int) -> bytes:
        return image.tobytes()  # a Pillow RGB image's and a C-order H x W x 3 array's bytes are the same layout

    def decode(self, encoded: bytes, height: int, width: int):
        import numpy as np

        return np.frombuffer(encoded, dtype=np.uint8).reshape(height, width, CHANNELS)

    def decode_tf(self, encoded, height, width):
        import tensorflow as tf

        return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [height, width, CHANNELS])

    def stored_bytes(self, width: int, height: int) -> int | None:
        return width * height * CHANNELS
