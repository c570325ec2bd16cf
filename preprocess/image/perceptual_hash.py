"""A 64-bit DCT perceptual hash of an image's pixels (grey, 32x32, sign of the 64 lowest coefficients), close under
re-encoding, rescaling and small crops; ``Fingerprint.mirror`` catches horizontally flipped copies."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

HASH_BITS = 64
SIDE = 32  # the grey image is shrunk to SIDE × SIDE before the DCT


def _dct_matrix(n: int) -> np.ndarray:
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    matrix[0] /= np.sqrt(2.0)
    return matrix


def _low_frequencies(count: int) -> tuple[np.ndarray, np.ndarray]:
    order = sorted(((v, u) for v in range(SIDE) for u in range(SIDE) if (v, u) != (0, 0)),
                   key=lambda vu: (vu[0] + vu[1], vu[0]))[:count]
    return np.array([v for v, _ in order]), np.array([u for _, u in order])


_DCT = _dct_matrix(SIDE)
_ROWS, _COLUMNS = _low_frequencies(HASH_BITS)
_MIRROR_SIGNS = np.where(_COLUMNS % 2 == 1, -1.0, 1.0)  # a horizontal flip negates odd horizontal frequencies


class Fingerprint(NamedTuple):
    """An image's perceptual hash and its mirror image's, as unsigned 64-bit integers."""
    hash: int
    mirror: int


def _bits(coefficients: np.ndarray) -> int:
    return int.from_bytes(np.packbits(coefficients > 0).tobytes(), "big")


def fingerprint(pixels: np.ndarray) -> Fingerprint:
    """The hashes of ``pixels`` (H×W×3 or H×W uint8), grey and shrunk to SIDE×SIDE by area averaging."""
    from PIL import Image

    if not np.asarray(pixels).size:
        raise ValueError("an image of no pixels has no fingerprint")
    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).convert("L")
    thumbnail = np.asarray(image.resize((SIDE, SIDE), Image.Resampling.BOX), dtype=np.float64)
    # Rounded, so that a flat image's coefficients (zero up to rounding noise) give the hash 0, not noise.
    coefficients = np.round((_DCT @ thumbnail @ _DCT.T)[_ROWS, _COLUMNS], 3)
    return Fingerprint(_bits(coefficients), _bits(coefficients * _MIRROR_SIGNS))


def _feature_bits() -> tuple[list[int], list[tuple[int, int]]]:
    """(bit shifts of even horizontal frequency, pairs of shifts of odd horizontal frequency)."""
    positions = [HASH_BITS - 1 - i for i in range(HASH_BITS)]  # bit i of the zigzag order, as a shift
    even = [shift for shift, column in zip(positions, _COLUMNS.tolist()) if column % 2 == 0]
    odd = [shift for shift, column in zip(positions, _COLUMNS.tolist()) if column % 2 == 1]
    return even, list(zip(odd[0::2], odd[1::2]))


_EVEN_SHIFTS, _ODD_PAIRS = _feature_bits()
FEATURE_BITS = len(_EVEN_SHIFTS) + len(_ODD_PAIRS)


def flip_invariant_features(image_hash: int) -> int:
    """FEATURE_BITS bits of ``image_hash`` a horizontal flip leaves unchanged: each even-frequency bit and the XOR of
    each pair of odd-frequency bits (a flip inverts both)."""
    value = 0
    for shift in _EVEN_SHIFTS:
        value = (value << 1) | ((image_hash >> shift) & 1)
    for first, second in _ODD_PAIRS:
        value = (value << 1) | (((image_hash >> first) ^ (image_hash >> second)) & 1)
    return value

