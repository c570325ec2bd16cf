"""Options checked against each other and against the limits of what gets written, before a run starts.

* Both crops resize the shorter side to S, so every stored image has at least S*S pixels: S*S must fit
  ``--max-pixels`` (else every image fails to allocate while resizing).
* A record is one protobuf message: TensorFlow's parser and protobuf refuse messages of 2 GiB and more. A raw
  image is at least S*S*3 bytes plus a small overhead (exactly that for centre crops); ``--crop none`` images and
  JPEGs also get the per-image check :func:`record_fits` (a long side is not bounded by S).
* JPEG stores at most 65,500 pixels a side.
"""

from __future__ import annotations

import math

from shardprep.preprocess.sources import SourceError

MAX_RECORD_BYTES = (1 << 31) - 1  # protobuf's limit on a serialized message (INT_MAX)
RECORD_OVERHEAD = 1 << 16  # feature keys, filename, label, sizes, padding: far less than this
JPEG_MAX_SIDE = 65_500  # image_ops.JPEG_MAX_SIDE, libjpeg's limit on either side
CHANNELS = 3


def largest_side_for_pixels(max_pixels: int) -> int:
    return math.isqrt(max_pixels)


def largest_raw_square_side() -> int:
    """The largest S whose raw S x S x 3 record stays under MAX_RECORD_BYTES."""
    return math.isqrt((MAX_RECORD_BYTES - RECORD_OVERHEAD) // CHANNELS)


def record_fits(num_bytes: int) -> bool:
    """Whether an encoded image of ``num_bytes`` makes a record readers can parse."""
    return num_bytes + RECORD_OVERHEAD <= MAX_RECORD_BYTES


def check_options(shorter_side: int, crop: str, encoding: str, max_pixels: int) -> None:
    """Raises SourceError (one line: what, why, the largest value that works) for options that cannot work."""
    if shorter_side * shorter_side > max_pixels:
        raise SourceError(
            f"--shorter-side {shorter_side} makes every image at least {shorter_side}x{shorter_side} = "
            f"{shorter_side * shorter_side:,} pixels, more than --max-pixels {max_pixels:,}: the largest --shorter-side "
            f"it allows is {largest_side_for_pixels(max_pixels)} (or raise --max-pixels)")
    if encoding == "jpeg" and shorter_side > JPEG_MAX_SIDE:
        raise SourceError(f"--shorter-side {shorter_side} is more than JPEG stores a side ({JPEG_MAX_SIDE}): the "
                          f"largest --shorter-side for --encoding jpeg is {JPEG_MAX_SIDE}")
    if encoding == "raw" and not record_fits(shorter_side * shorter_side * CHANNELS):
        raise SourceError(
            f"--shorter-side {shorter_side} makes raw records of {shorter_side * shorter_side * CHANNELS:,} bytes, over "
            f"the {MAX_RECORD_BYTES:,} bytes a TFRecord example can hold (protobuf's 2 GiB limit): the largest "
            f"--shorter-side that fits is {largest_raw_square_side()} (or use --encoding jpeg)")
