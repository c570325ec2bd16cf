"""Plain JPEGs decoded straight to RGB by libjpeg-turbo (simplejpeg): Pillow's pixels byte for byte, at less cost.

Anything else (not baseline/progressive RGB or grey, EXIF-turned, any simplejpeg error, no simplejpeg) gives None and
the caller decodes with Pillow, which decides every reject."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from PIL import ImageFile

_DECODED_MODES = ("RGB", "L")  # libjpeg gives both as RGB, as Pillow's convert("RGB") does (grey replicated)


def decode_plain_rgb(image: ImageFile.ImageFile, data: bytes,
                     turns: Callable[[ImageFile.ImageFile], bool]) -> np.ndarray | None:
    """``image`` (opened by Pillow from ``data``, perhaps drafted) as an H x W x 3 uint8 array, or None where only
    Pillow's decode applies. ``turns(image)``: its EXIF orientation would turn it."""
    if image.format != "JPEG" or image.mode not in _DECODED_MODES or len(image.tile) != 1:
        return None
    try:
        if "transparency" in image.info or turns(image):
            return None
    except Exception:  # noqa: BLE001 - unreadable metadata: Pillow's decode meets it again and decides
        return None
    try:
        import simplejpeg
    except ImportError:
        return None
    scale = image.decoderconfig[0] if image.decoderconfig else 1  # draft()'s DCT scaling: 1, 2, 4 or 8
    width, height = image.size  # the drafted size: each side divided by the scale, rounded up
    try:
        if scale > 1:
            pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=height, min_width=width, min_factor=scale)
        else:
            pixels = simplejpeg.decode_jpeg(data, "RGB")
    except (ValueError, MemoryError):  # a damaged file, or one libjpeg only warns about: Pillow's decode decides
        return None
    if pixels.shape != (height, width, 3):
        return None
    return pixels
