"""Random crop and flip on the host, in NumPy (``NumpyReader``/``RecordDataset`` ``crop_size=``): a uniform window
mirrored for half in training, central in evaluation, drawn from (seed, epoch, position) by a counter-based hash
(SplitMix64), so resumed readers and any batch size cut the same.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_STREAM = 2  # record_order's streams: 0 the permutation, 1 the crop: none squares
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class CropAt(NamedTuple):
    """What ``EpochSampler(..., crops=True)`` hands a ``RecordDataset``: a record and its window's draws."""

    record: int  # the record's global index
    draws: tuple[int, int, int]  # top, left, flip: see ``crop_flip``


def window_draws(seed: int, epoch: int, positions) -> np.ndarray:
    """int64 ``[n, 3]`` (top, left, flip) draws in ``[0, 2**31)`` of the records at ``positions``."""
    key = np.random.SeedSequence([int(seed), int(epoch), _STREAM]).generate_state(1, np.uint64)[0]
    counters = np.asarray(positions, np.uint64)[:, None] * np.uint64(3) + np.arange(3, dtype=np.uint64)
    with np.errstate(over="ignore"):  # SplitMix64's finaliser (wrapping): a well-mixed 64-bit hash of each counter
        mixed = key + counters * _GOLDEN
        mixed ^= mixed >> np.uint64(30)
        mixed *= np.uint64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> np.uint64(27)
        mixed *= np.uint64(0x94D049BB133111EB)
        mixed ^= mixed >> np.uint64(31)
    return (mixed >> np.uint64(33)).astype(np.int64)


def check_fits(size: int, image_shape) -> None:
    """A ``ValueError`` when a ``size`` square does not fit images of ``image_shape`` (H, W, C)."""
    if size > min(image_shape[0], image_shape[1]):
        raise ValueError(f"crop_size {size} does not fit the stored {image_shape[0]}x{image_shape[1]} images: give "
                         f"at most {min(image_shape[0], image_shape[1])}")


def crop_flip(images: np.ndarray, size: int, draws=None, out: np.ndarray | None = None) -> np.ndarray:
    """``[B, size, size, C]`` windows of ``images`` ``[B, H, W, C]``: with ``draws`` (int ``[B, 3]``, as
    ``window_draws``) top ``= d[0] % (H - size + 1)``, left ``= d[1] % (W - size + 1)``, mirrored when ``d[2]`` is
    odd; without, the central windows. ``out``: where to write them (a new array by default)."""
    count, height, width = images.shape[:3]
    check_fits(size, images.shape[1:])
    if out is None:
        out = np.empty((count, size, size) + images.shape[3:], images.dtype)
    elif not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous array")  # cv2 writes into a contiguous dst only
    if draws is None:
        top, left = (height - size) // 2, (width - size) // 2
        out[...] = images[:, top:top + size, left:left + size]
        return out
    import cv2  # its flip is ~8x NumPy's copy of a negative-stride view of 3-byte pixels (host_crop_bench.py)

    draws = np.asarray(draws, np.int64)
    tops = (draws[:, 0] % (height - size + 1)).tolist()
    lefts = (draws[:, 1] % (width - size + 1)).tolist()
    flips = (draws[:, 2] & 1).tolist()
    for i in range(count):
        window = images[i, tops[i]:tops[i] + size, lefts[i]:lefts[i] + size]
        if flips[i]:
            cv2.flip(window, 1, dst=out[i])
        else:
            out[i] = window
    return out
