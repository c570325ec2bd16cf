"""The near-duplicate score: how alike two records' pixels are, once aligned, on a small grey thumbnail of each
(NumPy and Pillow, no Beam). validate's search finds candidate pairs by perceptual hash, then keeps a pair only when
its score reaches :data:`MIN_SCORE`.

Each record is kept as a :data:`SIDE` × :data:`SIDE` grey thumbnail (``uint8``, 1 KiB) shrunk by area averaging,
so one threshold means the same at 32 px and at 1,000 px. The score of two thumbnails is the normalized
correlation of their gradients (after a light blur, so a shift of half a thumbnail pixel costs little), over the
central window of the first, at the best of: the second as it is or mirrored, zoomed by each of :data:`SCALES`
about its centre, and shifted by up to :data:`MAX_SHIFT` pixels each way. Correlation is blind to brightness and
contrast (an offset and a gain); gradients leave out the broad shading that unrelated photos share (sky above,
ground below). 1.0: the same picture; unrelated photos score about 0.3 and rarely above 0.75.
"""

from __future__ import annotations

import numpy as np

SIDE = 32  # px of the grey thumbnail kept per record
MAX_SHIFT = 4  # thumbnail px each way (4 px of a 32-px image, 1.6% of a 256-px one)
WINDOW = SIDE - 2 * MAX_SHIFT
SCALES = (1.0, 1.05, 1.1, 1 / 1.05, 1 / 1.1)  # a crop of up to ~10% (then resized back) is a zoom of up to 1.1
MIN_SCORE = 0.85  # the default: planted copies of every kind score above it, distinct photos below (BENCHMARKS.md)
FLAT = 1e-6  # a thumbnail whose gradients' energy is below this has nothing to align: it scores 0


def thumbnail(pixels: np.ndarray) -> bytes:
    """``pixels`` (H×W×3 or H×W uint8) as the SIDE×SIDE grey thumbnail the score compares (ITU-R 601 luma, area
    averaging; bilinear where an image is smaller, so its edges stay smooth), row by row."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).convert("L")
    small = min(image.size) < SIDE
    return image.resize((SIDE, SIDE), Image.Resampling.BILINEAR if small else Image.Resampling.BOX).tobytes()


def _grid(thumb: bytes) -> np.ndarray:
    return np.frombuffer(thumb, np.uint8).reshape(SIDE, SIDE).astype(np.float32)


def _zoomed(grid: np.ndarray, scale: float) -> np.ndarray:
    """``grid`` magnified by ``scale`` about its centre (bilinear; edges repeated where it shrinks)."""
    if scale == 1.0:
        return grid
    centre = (SIDE - 1) / 2
    x = np.clip(centre + (np.arange(SIDE) - centre) / scale, 0, SIDE - 1)
    low = np.minimum(np.floor(x).astype(int), SIDE - 2)
    weight = (x - low).astype(np.float32)
    rows = grid[low] * (1 - weight)[:, None] + grid[low + 1] * weight[:, None]
    return rows[:, low] * (1 - weight)[None] + rows[:, low + 1] * weight[None]


def _gradients(grid: np.ndarray) -> np.ndarray:
    """(2, SIDE, SIDE): horizontal and vertical central differences of ``grid`` after a [1 2 1] blur."""
    blurred = grid.copy()
    blurred[1:-1] = (grid[:-2] + 2 * grid[1:-1] + grid[2:]) / 4
    blurred[:, 1:-1] = (blurred[:, :-2] + 2 * blurred[:, 1:-1] + blurred[:, 2:]) / 4
    gradients = np.zeros((2, SIDE, SIDE), np.float32)
    gradients[0, :, 1:-1] = blurred[:, 2:] - blurred[:, :-2]
    gradients[1, 1:-1] = blurred[2:] - blurred[:-2]
    return gradients


def _centred(values: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    values = values - values.mean(axis=axes, keepdims=True)
    return values, np.sqrt((values * values).sum(axis=axes))


def _window_sums(images: np.ndarray) -> np.ndarray:
    """(views, shifts, shifts): the sum of each view over the WINDOW × WINDOW window at every shift."""
    integral = np.zeros((images.shape[0], SIDE + 1, SIDE + 1), np.float64)
    integral[:, 1:, 1:] = images.cumsum(axis=1).cumsum(axis=2)
    end = SIDE - WINDOW + 1
    return (integral[:, WINDOW:, WINDOW:] - integral[:, :end, WINDOW:] - integral[:, WINDOW:, :end]
            + integral[:, :end, :end])


def score(first: bytes, second: bytes) -> float:
    """How alike two thumbnails are, from -1 to 1 (see the module); 0 when either is flat."""
    window = slice(MAX_SHIFT, SIDE - MAX_SHIFT)
    reference, energy = _centred(_gradients(_grid(first))[:, window, window], (0, 1, 2))
    if energy < FLAT:
        return 0.0
    other = _grid(second)
    candidates = np.stack([_gradients(_zoomed(grid, scale)) for grid in (other, other[:, ::-1].copy())
                           for scale in SCALES])  # (views, 2, SIDE, SIDE)
    # Every shift at once: the reference's correlation with each view by FFT (no wrap-around: the window plus the
    # largest shift fits in SIDE), and each shifted window's sum and sum of squares from integral images.
    padded = np.zeros((2, SIDE, SIDE), np.float32)
    padded[:, :WINDOW, :WINDOW] = reference
    spectrum = np.fft.rfft2(candidates) * np.conj(np.fft.rfft2(padded))
    shifts = 2 * MAX_SHIFT + 1
    dots = np.fft.irfft2(spectrum, s=(SIDE, SIDE)).sum(axis=1)[:, :shifts, :shifts]
    sums = _window_sums(candidates.sum(axis=1))
    squares = _window_sums((candidates * candidates).sum(axis=1))
    norms = np.sqrt(np.maximum(squares - sums * sums / (2 * WINDOW * WINDOW), 0))
    valid = norms > np.sqrt(FLAT)
    if not valid.any():
        return 0.0
    return float(np.max(dots[valid] / (norms[valid] * energy)))
