"""``--encoding jpeg``: a baseline JPEG per image, without chroma subsampling."""

from __future__ import annotations

from shardprep.preprocess.encodings.base import CHANNELS, PillowEncoding


class Jpeg(PillowEncoding):
    """Smaller shards; decoded per image at train time."""

    name = "jpeg"
    summary = "smaller shards"
    label = "JPEG"
    pillow_format = "JPEG"
    max_side = 65_500  # libjpeg's limit on either side
    uses_quality = True
    mean_std_tolerance = 1.0
    tolerance_reason = "lossy against the pre-encode pixels the manifest used"

    def save_options(self, quality: int) -> dict:
        # 4:4:4 keeps colour detail at 256 px; Pillow's optimize=False (its default) keeps encoding fast and the
        # bytes deterministic.
        return {"quality": quality, "subsampling": 0}

    def decode_tf(self, encoded, height, width):
        import tensorflow as tf

        # The whole image, with the integer DCT that Pillow (decode, the NumPy reader's) uses too, so both readers
        # give the same pixels; decode_and_crop_jpeg would upsample chroma differently at a window's edges.
        return tf.io.decode_jpeg(encoded, channels=CHANNELS, dct_method="INTEGER_ACCURATE")
