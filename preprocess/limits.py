"""Options checked against each other and against what a record can hold, before a run starts: S*S pixels within
``--max-pixels``, a record under protobuf's 2 GiB limit, a side within the encoding's ``max_side``."""

from __future__ import annotations

import math

from shardprep.preprocess import encodings
from shardprep.preprocess.sources import SourceError

MAX_RECORD_BYTES = (1 << 31) - 1  # protobuf's limit on a serialized message (INT_MAX)
RECORD_OVERHEAD = 1 << 16  # feature keys, filename, label, sizes, padding: far less than this
CHANNELS = encodings.CHANNELS


def largest_side_for_pixels(max_pixels: int) -> int:
    return math.isqrt(max_pixels)


def largest_square_side(stored: encodings.Encoding) -> int:
    """The largest S whose S x S image fits a record where ``stored``'s size fixes its bytes, at most its
    ``max_side``."""
    low, high = 1, stored.max_side or math.isqrt(MAX_RECORD_BYTES)  # every stored pixel takes a byte or more
    while low < high:  # stored bytes grow with the side
        middle = (low + high + 1) // 2
        stored_bytes = stored.stored_bytes(middle, middle)
        low, high = (middle, high) if stored_bytes is None or record_fits(stored_bytes) else (low, middle - 1)
    return low


def largest_stored_side() -> int:
    """The most pixels a side any encoding stores."""
    return max(largest_square_side(stored) for stored in encodings.REGISTERED)


def record_fits(num_bytes: int) -> bool:
    return num_bytes + RECORD_OVERHEAD <= MAX_RECORD_BYTES


def check_options(shorter_side: int, crop: str, encoding: str, max_pixels: int) -> None:
    """Raises SourceError (what, why, the largest value that works) for options that cannot work."""
    if shorter_side * shorter_side > max_pixels:
        raise SourceError(
            f"--shorter-side {shorter_side} makes every image at least {shorter_side}x{shorter_side} = "
            f"{shorter_side * shorter_side:,} pixels, more than --max-pixels {max_pixels:,}: the largest --shorter-side "
            f"it allows is {largest_side_for_pixels(max_pixels)} (or raise --max-pixels)")
    stored = encodings.get(encoding)
    if stored.max_side is not None and shorter_side > stored.max_side:
        raise SourceError(f"--shorter-side {shorter_side} is more than {stored.label} stores a side ({stored.max_side}): "
                          f"the largest --shorter-side for --encoding {stored.name} is {stored.max_side}")
    stored_bytes = stored.stored_bytes(shorter_side, shorter_side)
    if stored_bytes is not None and not record_fits(stored_bytes):
        raise SourceError(
            f"--shorter-side {shorter_side} makes {stored.label} records of {stored_bytes:,} bytes, over "
            f"the {MAX_RECORD_BYTES:,} bytes a TFRecord example can hold (protobuf's 2 GiB limit): the largest "
            f"--shorter-side that fits is {largest_square_side(stored)} (or use {_compressed_choices()})")


def _compressed_choices() -> str:
    return " or ".join(f"--encoding {e.name}" for e in encodings.REGISTERED if e.stored_bytes(1, 1) is None)
