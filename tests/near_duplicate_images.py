"""Generated photo-like images, the changes that make a near-duplicate of one (each kind the search must catch:
re-encoded at JPEG quality 30 to 90, resized, cropped up to 10%, brighter, darker, more or less contrast, flipped,
shifted 1 to 4 px, colour-jittered) and the hard negatives it must not pair (the same background with other
objects, the same object on other backgrounds), at any size: for the near-duplicate tests and benchmark."""

from __future__ import annotations

import functools
import io

import numpy as np
from PIL import Image, ImageEnhance

import image_factory


@functools.lru_cache(maxsize=256)  # the tests ask for the same few seeds again and again; callers never change it
def photo(seed: int, side: int = 96) -> Image.Image:
    """A generated photo-like image: detail at every scale, with power falling as 1/f² like a photo's, over the
    gradients every seed shares (look-alikes of one class)."""
    rng = np.random.default_rng(seed)
    frequencies = np.hypot(*np.meshgrid(np.fft.fftfreq(side), np.fft.fftfreq(side)))
    amplitude = 1 / np.maximum(frequencies, 1 / side)
    channels = []
    for _ in range(3):
        phases = np.exp(2j * np.pi * rng.random((side, side)))
        texture = np.real(np.fft.ifft2(amplitude * phases))
        channels.append(texture / texture.std() * 40)
    base = image_factory.smooth_photo(side, side, seed=seed).astype(np.float64)
    return Image.fromarray(np.clip(base + np.stack(channels, axis=-1), 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, quality: int) -> Image.Image:
    return Image.open(io.BytesIO(image_factory.encode(image, "JPEG", quality=quality))).convert("RGB")


def crop(image: Image.Image, fraction: float) -> Image.Image:
    width, height = image.size
    dx, dy = round(width * fraction), round(height * fraction)
    return image.crop((dx, dy, width - dx, height - dy))


def crop_resized(image: Image.Image, fraction: float, corner: bool = False) -> Image.Image:
    """``fraction`` of the side cut off (half from each side, or all from the left and bottom: ``corner``), then
    resized back to the original size, as a dataset's preprocessing would store it."""
    width, height = image.size
    cut = round(width * fraction)
    box = (cut, 0, width, height - cut) if corner else (cut // 2, cut // 2, width - (cut - cut // 2),
                                                           height - (cut - cut // 2))
    return image.crop(box).resize(image.size, Image.Resampling.BICUBIC)


def shift(image: Image.Image, pixels: int, down: bool = False) -> Image.Image:
    """The image moved right (and down: ``down``) by ``pixels``, the uncovered strip filled by repeating its edge."""
    array = np.asarray(image)
    moved = np.concatenate([np.repeat(array[:, :1], pixels, axis=1), array[:, :-pixels]], axis=1)
    if down:
        moved = np.concatenate([np.repeat(moved[:1], pixels, axis=0), moved[:-pixels]], axis=0)
    return Image.fromarray(moved)


def rescale(image: Image.Image, factor: float) -> Image.Image:
    width, height = image.size
    return image.resize((round(width * factor), round(height * factor)), Image.Resampling.BILINEAR)


def colour_jitter(image: Image.Image) -> Image.Image:
    """Each channel's gain and offset changed a little, then the saturation raised by 30%."""
    array = np.asarray(image).astype(np.float64) * (1.1, 0.95, 0.9) + (5, -3, 8)
    return ImageEnhance.Color(Image.fromarray(np.clip(array, 0, 255).astype(np.uint8))).enhance(1.3)


def pasted(base: Image.Image, patch: Image.Image, fraction: float = 0.6) -> Image.Image:
    """``base`` with its central square, ``fraction`` of a side, replaced by the same square of ``patch``."""
    array, source = np.asarray(base).copy(), np.asarray(patch.resize(base.size))
    side = round(array.shape[0] * fraction)
    top = (array.shape[0] - side) // 2
    array[top:top + side, top:top + side] = source[top:top + side, top:top + side]
    return Image.fromarray(array)


PLANTED = {
    "jpeg quality 30": lambda image: jpeg(image, 30),
    "jpeg quality 60": lambda image: jpeg(image, 60),
    "jpeg quality 90": lambda image: jpeg(image, 90),
    "rescaled 0.5x": lambda image: rescale(image, 0.5),
    "rescaled 0.8x": lambda image: rescale(image, 0.8),
    "rescaled 1.5x": lambda image: rescale(image, 1.5),
    "cropped 3%": lambda image: crop(image, 0.015),  # 1.5% off each side
    "cropped 10%, resized back": lambda image: crop_resized(image, 0.10),
    "cropped 10% at a corner, resized back": lambda image: crop_resized(image, 0.10, corner=True),
    "shifted 1 px": lambda image: shift(image, 1),
    "shifted 2 px both ways": lambda image: shift(image, 2, down=True),
    "shifted 4 px": lambda image: shift(image, 4),
    "brightness +20%": lambda image: ImageEnhance.Brightness(image).enhance(1.2),
    "brightness -20%": lambda image: ImageEnhance.Brightness(image).enhance(0.8),
    "contrast -30%": lambda image: ImageEnhance.Contrast(image).enhance(0.7),
    "contrast +30%": lambda image: ImageEnhance.Contrast(image).enhance(1.3),
    "flipped": lambda image: image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
    "colour jitter": colour_jitter,
    "all at once": lambda image: jpeg(ImageEnhance.Brightness(crop(rescale(image, 0.8), 0.01)).enhance(0.9), 40),
}

# Pairs of different pictures that share most of what a hash sees: (name, first, second) from three photos.
HARD_NEGATIVES = {
    "same background, other objects": lambda a, b, c: (pasted(a, b), pasted(a, c)),
    "same object, other backgrounds": lambda a, b, c: (pasted(b, a, 0.5), pasted(c, a, 0.5)),
    "distinct look-alikes": lambda a, b, c: (a, b),
}
