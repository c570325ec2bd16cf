"""Plain JPEGs decoded straight to an RGB array by libjpeg-turbo (simplejpeg): Pillow's pixels, at less cost.

Pillow uses the same libjpeg-turbo settings but its row loop and an extra copy; the pixels are the same byte for
byte (``tests/test_jpeg_decode.py``), so datasets do not change. Only a baseline or progressive JPEG Pillow opened
as RGB or grey, without EXIF orientation, is taken; anything else, any simplejpeg error or warning, or no
simplejpeg returns None and the caller decodes with Pillow, which decides every reject.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from PIL import ImageFile

_DECODED_MODES = ("RGB", "L")  # libjpeg gives both as RGB, as Pillow's convert("RGB") does (grey replicated)


def decode_plain_rgb(image: ImageFile.ImageFile, data: bytes,
                     turns: Callable[[ImageFile.ImageFile], bool]) -> np.ndarray | None:
    """``image`` (opened by Pillow from ``data``, perhaps drafted, not loaded) decoded as an RGB uint8 array
    (H x W x 3), or None where only Pillow's decode applies. ``turns(image)``: True when its EXIF orientation would
    turn it. The array goes on to the resize as it is: no Pillow image is made of the full-size pixels."""
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
