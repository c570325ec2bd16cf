"""The score that confirms a candidate pair: the normalized correlation of two 32x32 grey thumbnails' gradients,
best over a mirror, a small zoom and shifts; what it measures: docs/near_duplicates.md."""

from __future__ import annotations

import numpy as np

SIDE = 32  # px of the grey thumbnail kept per record
MAX_SHIFT = 4  # thumbnail px each way (4 px of a 32-px image, 1.6% of a 256-px one)
WINDOW = SIDE - 2 * MAX_SHIFT
SCALES = (1.0, 1.05, 1.1, 1 / 1.05, 1 / 1.1)  # a crop of up to ~10% (then resized back) is a zoom of up to 1.1
MIN_SCORE = 0.85  # the default: planted copies of every kind score above it, distinct photos below (BENCHMARKS.md)
FLAT = 1e-6  # a thumbnail whose gradients' energy is below this has nothing to align: it scores 0
BATCH = 16  # pairs scored at once: their arrays (~2.6 MB) stay in the cache, 1.4x as fast as 64


def thumbnail(pixels: np.ndarray) -> bytes:
    """``pixels`` as the SIDE×SIDE grey thumbnail the score compares (luma; area averaging, bilinear when smaller)."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).convert("L")
    small = min(image.size) < SIDE
    return image.resize((SIDE, SIDE), Image.Resampling.BILINEAR if small else Image.Resampling.BOX).tobytes()


def _zoomed(grids: np.ndarray, scale: float) -> np.ndarray:
    """``grids`` (..., SIDE, SIDE) magnified by ``scale`` about the centre (bilinear; edges repeated where shrunk)."""
    if scale == 1.0:
        return grids
    centre = (SIDE - 1) / 2
    x = np.clip(centre + (np.arange(SIDE) - centre) / scale, 0, SIDE - 1)
    low = np.minimum(np.floor(x).astype(int), SIDE - 2)
    weight = x - low
    rows = grids[..., low, :] * (1 - weight)[:, None] + grids[..., low + 1, :] * weight[:, None]
    return rows[..., low] * (1 - weight) + rows[..., low + 1] * weight


def _gradients(grids: np.ndarray) -> np.ndarray:
    """(..., 2, SIDE, SIDE): horizontal and vertical central differences of ``grids`` after a [1 2 1] blur."""
    blurred = grids.copy()
    blurred[..., 1:-1, :] = (grids[..., :-2, :] + 2 * grids[..., 1:-1, :] + grids[..., 2:, :]) / 4
    blurred[..., 1:-1] = (blurred[..., :-2] + 2 * blurred[..., 1:-1] + blurred[..., 2:]) / 4
    gradients = np.zeros((*grids.shape[:-2], 2, SIDE, SIDE))
    gradients[..., 0, :, 1:-1] = blurred[..., 2:] - blurred[..., :-2]
    gradients[..., 1, 1:-1, :] = blurred[..., 2:, :] - blurred[..., :-2, :]
    return gradients


def _window_sums(images: np.ndarray) -> np.ndarray:
    """(..., shifts, shifts): the sum of each image over the WINDOW × WINDOW window at every shift."""
    shifts = np.arange(2 * MAX_SHIFT + 1)[:, None]
    windows = ((np.arange(SIDE) >= shifts) & (np.arange(SIDE) < shifts + WINDOW)).astype(np.float64)
    return windows @ images @ windows.T


def _scores(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """:func:`score_many` of one batch of grids (pairs, SIDE, SIDE)."""
    window = slice(MAX_SHIFT, SIDE - MAX_SHIFT)
    flat = np.ascontiguousarray(_gradients(first)[..., window, window]).reshape(len(first), -1)  # row by row
    reference = flat - flat.mean(axis=1, keepdims=True)
    energy = np.sqrt((reference * reference).sum(axis=1))
    views = _gradients(np.stack([_zoomed(grids, scale) for grids in (second, second[..., ::-1]) for scale in SCALES],
                                axis=1))  # (pairs, views, 2, SIDE, SIDE)
    # Every shift at once: the reference's correlation with each view by FFT (no wrap-around: the window plus the
    # largest shift fits in SIDE), and each shifted window's sum and sum of squares by matrix products.
    padded = np.zeros((len(first), 2, SIDE, SIDE))
    padded[..., :WINDOW, :WINDOW] = reference.reshape(len(first), 2, WINDOW, WINDOW)
    spectrum = (np.fft.rfft2(views) * np.conj(np.fft.rfft2(padded))[:, None]).sum(axis=2)
    shifts = 2 * MAX_SHIFT + 1
    # irfft2 is an inverse FFT down the columns then one along the rows: only the rows of a shift are needed.
    dots = np.fft.irfft(np.fft.ifft(spectrum, axis=-2)[..., :shifts, :], SIDE)[..., :shifts]
    squared = views * views
    sums, squares = _window_sums(np.stack([views[:, :, 0] + views[:, :, 1], squared[:, :, 0] + squared[:, :, 1]]))
    norms = np.sqrt(np.maximum(squares - sums * sums / (2 * WINDOW * WINDOW), 0))
    valid = norms > np.sqrt(FLAT)
    scale = np.where(valid, norms, 1) * np.maximum(energy, FLAT)[:, None, None, None]
    best = np.where(valid, dots / scale, -np.inf).reshape(len(first), -1).max(axis=1)
    return np.where((energy < FLAT) | ~valid.reshape(len(first), -1).any(axis=1), 0.0, best)


def score_many(first: list[bytes], second: list[bytes]) -> np.ndarray:
    """How alike each thumbnail of ``first`` is to the one of ``second`` beside it, from -1 to 1 (0 when either is
    flat): the best gradient correlation over a mirror, zooms and shifts. Batched; each pair's value its own."""
    found = [np.zeros(0)]
    for start in range(0, len(first), BATCH):
        grids = [np.frombuffer(b"".join(side[start:start + BATCH]), np.uint8).reshape(-1, SIDE, SIDE)
                 .astype(np.float64) for side in (first, second)]  # float64: NumPy's float32 FFT is slower
        found.append(_scores(*grids))
    return np.concatenate(found)

