"""The resize methods (``pillow-bicubic``, what a manifest without ``resize_method`` used; ``lanczos2-cubic``,
OpenCV, about half Pillow's time at about its error); a centre crop filters only the source pixels it reads."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # Pillow and NumPy are imported by the functions that use them (the CLI imports this module)
    import numpy as np
    from PIL import Image

    Pixels = Image.Image | np.ndarray  # a decoded RGB image: Pillow's, or an H x W x 3 uint8 array

PILLOW_BICUBIC = "pillow-bicubic"
LANCZOS2_CUBIC = "lanczos2-cubic"
RESIZE_METHODS = (PILLOW_BICUBIC, LANCZOS2_CUBIC)
METHOD_WITHOUT_KEY = PILLOW_BICUBIC  # what made every dataset before the manifest recorded resize_method

_LOBES = {LANCZOS2_CUBIC: 2}
# A downscale by twice this or more is first reduced by area to within this and twice this of the target.
_REDUCED_SCALE = 2
# A centre crop resizes the whole image when that is at most this many times the crop's pixels (4:3 photos: 1.33).
_WHOLE_RESIZE_LIMIT = 4
_kernels: dict[tuple[float, int], np.ndarray] = {}  # (scale, lobes) -> its low-pass kernel: few scales a dataset


def recorded(method: str) -> str | None:
    """The manifest's ``resize_method`` for ``method``: None (key left out) for METHOD_WITHOUT_KEY, so such datasets
    keep the manifest they always had."""
    return None if method == METHOD_WITHOUT_KEY else method


def method_of(document: dict) -> str:
    method = document.get("resize_method")
    return METHOD_WITHOUT_KEY if method is None else method


def check_method(method: str) -> None:
    if method not in RESIZE_METHODS:
        raise ValueError(f"resize method must be one of {', '.join(RESIZE_METHODS)}, is {method!r}")


def centre_box(size: tuple[int, int], source: tuple[int, int], shorter_side: int) -> tuple[float, float, float, float]:
    """The centred ``shorter_side`` square of an image resized to ``size``, in ``source`` coordinates (l, t, r, b)."""
    new_width, new_height = size
    left, top = (new_width - shorter_side) // 2, (new_height - shorter_side) // 2
    x_scale, y_scale = source[0] / new_width, source[1] / new_height
    return left * x_scale, top * y_scale, (left + shorter_side) * x_scale, (top + shorter_side) * y_scale


def resize_and_crop(image: Pixels, size: tuple[int, int], shorter_side: int, crop: str, method: str) -> Pixels:
    """The RGB ``image`` (Pillow or H x W x 3 uint8, answered in kind) scaled to ``size`` by ``method``;
    ``crop="center"`` keeps the centred square."""
    import numpy as np
    from PIL import Image

    new_width, new_height = size
    if crop == "none" or new_width == new_height:
        origin, out = (0, 0), size
    else:
        origin, out = ((new_width - shorter_side) // 2, (new_height - shorter_side) // 2), (shorter_side, shorter_side)
    if size == size_of(image):
        if out == size:
            return image
        if isinstance(image, np.ndarray):
            return _cut(image, origin, out)
        return image.crop((*origin, origin[0] + out[0], origin[1] + out[1]))
    if method == PILLOW_BICUBIC:
        pillow = Image.fromarray(image, "RGB") if isinstance(image, np.ndarray) else image
        box = None if out == size else centre_box(size, pillow.size, shorter_side)
        resized = pillow.resize(out, Image.Resampling.BICUBIC, box=box)
        return np.asarray(resized) if isinstance(image, np.ndarray) else resized
    check_method(method)
    pixels = lanczos_cubic(image, size, origin, out, _LOBES[method])
    return pixels if isinstance(image, np.ndarray) else Image.fromarray(pixels, "RGB")


def size_of(image: Pixels) -> tuple[int, int]:
    """(width, height) of a Pillow image or an H x W x 3 array."""
    import numpy as np

    return (image.shape[1], image.shape[0]) if isinstance(image, np.ndarray) else image.size


def _cut(pixels: np.ndarray, origin: tuple[int, int], out: tuple[int, int]) -> np.ndarray:
    import numpy as np

    return np.ascontiguousarray(pixels[origin[1]:origin[1] + out[1], origin[0]:origin[0] + out[0]])


def lanczos_cubic(image: Pixels, size: tuple[int, int], origin: tuple[int, int], out: tuple[int, int],
                  lobes: int) -> np.ndarray:
    """The ``out`` rectangle at ``origin`` of ``image`` resized to ``size``, as uint8 H x W x 3. A downscale by 4 or
    more is first area-reduced to 2-4 times the target (as Pillow's ``reducing_gap``), so the low-pass stays short."""
    import numpy as np

    cv2 = opencv()
    # An array is used as it is, never copied whole; a Pillow image becomes one only where all of it is needed.
    pixels = image if isinstance(image, np.ndarray) else None
    image_width, image_height = size_of(image)
    reduce = int(min(image_width / size[0], image_height / size[1]) // _REDUCED_SCALE)
    if reduce >= 2:
        reduced = (max(1, round(image_width / reduce)), max(1, round(image_height / reduce)))
        pixels = cv2.resize(np.asarray(image), reduced, interpolation=cv2.INTER_AREA)
    width, height = size_of(image if pixels is None else pixels)
    x_scale, y_scale = width / size[0], height / size[1]
    kernel_x, kernel_y = _kernel(x_scale, lobes), _kernel(y_scale, lobes)
    left, top = origin[0] * x_scale, origin[1] * y_scale
    # The source pixels the rectangle reads: cubic reaches 2 beyond a sample, the low-pass its radius beyond that.
    x0, x1 = _reach(left, left + out[0] * x_scale, len(kernel_x) // 2 + 3, width)
    y0, y1 = _reach(top, top + out[1] * y_scale, len(kernel_y) // 2 + 3, height)
    if size[0] * size[1] <= _WHOLE_RESIZE_LIMIT * out[0] * out[1]:
        # The usual case: resize the whole image, then cut the rectangle out (cv2.resize's loops are the fast ones);
        # only the band it reads is low-passed, the rest left unset (a 4:3 photo's centre crop: 3/4 of the work).
        pixels = np.asarray(image) if pixels is None else pixels
        if len(kernel_x) > 1 or len(kernel_y) > 1:
            source, pixels = pixels, np.empty_like(pixels)
            cv2.sepFilter2D(source[y0:y1, x0:x1], -1, kernel_x, kernel_y, dst=pixels[y0:y1, x0:x1],
                            borderType=cv2.BORDER_REFLECT)
        resized = cv2.resize(pixels, size, interpolation=cv2.INTER_CUBIC)
        return resized if out == size else _cut(resized, origin, out)
    # A very long image: only the source pixels the rectangle needs (and the filters' reach), resampled to it.
    if pixels is not None:
        pixels = np.ascontiguousarray(pixels[y0:y1, x0:x1])
    else:
        pixels = np.asarray(cast("Image.Image", image).crop((x0, y0, x1, y1)))  # given is None: a Pillow image
    if len(kernel_x) > 1 or len(kernel_y) > 1:
        pixels = cv2.sepFilter2D(pixels, -1, kernel_x, kernel_y, borderType=cv2.BORDER_REFLECT)
    # Output pixel x's centre x + 0.5 lies at left + (x + 0.5) * x_scale in the source (pixel i centred at i + 0.5).
    matrix = np.array([[x_scale, 0.0, left - x0 + 0.5 * x_scale - 0.5],
                       [0.0, y_scale, top - y0 + 0.5 * y_scale - 0.5]])
    return cv2.warpAffine(pixels, matrix, out, flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REFLECT)


def _reach(start: float, end: float, margin: int, limit: int) -> tuple[int, int]:
    return max(0, math.floor(start) - margin), min(limit, math.ceil(end) + margin)


def _kernel(scale: float, lobes: int) -> np.ndarray:
    """Lanczos of ``lobes`` lobes widened by ``scale``, sampled at whole pixels, summing to 1; ``[1]`` if not
    downscaling."""
    import numpy as np

    if scale <= 1.0:
        return np.ones(1, dtype=np.float32)
    key = (round(scale, 6), lobes)
    kernel = _kernels.get(key)
    if kernel is None:
        radius = math.ceil(lobes * scale)
        x = np.arange(-radius, radius + 1, dtype=np.float64) / scale
        weights = np.sinc(x) * np.sinc(x / lobes) * (np.abs(x) < lobes)
        kernel = (weights / weights.sum()).astype(np.float32)
        if len(_kernels) < 1024:
            _kernels[key] = kernel
    return kernel


@functools.cache
def opencv():
    """``cv2``, imported on first use, one thread (the job's parallelism is its worker processes)."""
    import cv2

    cv2.setNumThreads(1)
    return cv2
