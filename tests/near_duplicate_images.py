"""Generated photo-like images and the changes that make a near-duplicate of one (re-encoded at JPEG quality 30,
rescaled, cropped, shifted, brighter, darker, lower contrast, flipped), for the near-duplicate tests and benchmark."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageEnhance

import image_factory


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


def shift(image: Image.Image, pixels: int) -> Image.Image:
    """The image moved right by ``pixels``, the uncovered strip filled by repeating its edge column."""
    array = np.asarray(image)
    moved = np.concatenate([np.repeat(array[:, :1], pixels, axis=1), array[:, :-pixels]], axis=1)
    return Image.fromarray(moved)


def rescale(image: Image.Image, factor: float) -> Image.Image:
    width, height = image.size
    return image.resize((round(width * factor), round(height * factor)), Image.Resampling.BILINEAR)


PLANTED = {
    "jpeg quality 30": lambda image: jpeg(image, 30),
    "rescaled 0.5x": lambda image: rescale(image, 0.5),
    "rescaled 0.8x": lambda image: rescale(image, 0.8),
    "cropped 3%": lambda image: crop(image, 0.015),  # 1.5% off each side
    "shifted 2%": lambda image: shift(image, 2),
    "brightness +10%": lambda image: ImageEnhance.Brightness(image).enhance(1.1),
    "brightness -10%": lambda image: ImageEnhance.Brightness(image).enhance(0.9),
    "contrast -10%": lambda image: ImageEnhance.Contrast(image).enhance(0.9),
    "flipped": lambda image: image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
    "all at once": lambda image: jpeg(ImageEnhance.Brightness(crop(rescale(image, 0.6), 0.01)).enhance(0.9), 30),
}
