"""Near-duplicate detection: the perceptual fingerprint on planted copies (re-encoded, rescaled, cropped, shifted,
brighter or darker, flipped) and distinct look-alikes, and the Beam stage alone (TestPipeline + assert_that)."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from PIL import Image, ImageEnhance

import image_factory
from shardprep.preprocess import perceptual_hash
from shardprep.preprocess.perceptual_hash import Fingerprint, distance, fingerprint, flip_invariant_features

THRESHOLD = 10  # ValidateOptions' default near_duplicate_distance


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


def fp(image: Image.Image) -> Fingerprint:
    return fingerprint(np.asarray(image.convert("RGB")))


@pytest.mark.parametrize("change", list(PLANTED))
def test_planted_copies_are_within_the_threshold(change):
    for seed in range(6):
        original = photo(seed)
        assert distance(fp(original), fp(PLANTED[change](original))) <= THRESHOLD, (change, seed)


def test_distinct_look_alikes_are_beyond_the_threshold():
    fingerprints = [fp(photo(seed)) for seed in range(40)]
    closest = min(distance(a, b) for a, b in itertools.combinations(fingerprints, 2))
    assert closest > THRESHOLD


def test_flip_is_exact_and_its_features_are_shared():
    original = np.asarray(photo(7))
    own, flipped = fingerprint(original), fingerprint(original[:, ::-1])
    assert (flipped.hash, flipped.mirror) == (own.mirror, own.hash)
    assert own.hash != own.mirror
    assert flip_invariant_features(own.hash) == flip_invariant_features(flipped.hash)
    assert distance(own, flipped) == 0


def test_a_flat_image_hashes_to_zero_whatever_its_colour_or_size():
    for colour, size in (((0, 0, 0), (5, 9)), ((200, 10, 40), (64, 64)), ((255, 255, 255), (1, 1))):
        assert fingerprint(np.full((*size, 3), colour, np.uint8)) == Fingerprint(0, 0)


def test_grey_and_rgb_of_the_same_picture_agree():
    grey = np.asarray(photo(2).convert("L"))
    assert distance(fingerprint(grey), fingerprint(np.stack([grey] * 3, axis=-1))) <= 1


def test_the_hash_has_64_bits_and_distance_counts_them():
    value = fp(photo(1))
    assert 0 <= value.hash < 2 ** perceptual_hash.HASH_BITS
    assert perceptual_hash.hamming(0, 2 ** 64 - 1) == 64
    assert distance(Fingerprint(0b1011, 0), Fingerprint(0b0001, 0b1011)) == 0
