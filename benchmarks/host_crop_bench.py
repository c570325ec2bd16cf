"""Host crops, side by side: CPU per image of a random 224 window + flip of 256x256 uint8 images.

    python benchmarks/host_crop_bench.py [--batch 256] [--rounds 5] [--seconds 2]

Three ways over the same batch of random 256x256x3 images, rounds interleaved, one thread:

1. per-sample: a NumPy crop per image as a PyTorch ``Dataset`` transform would do it (``rng.integers`` for the
   window, a slice, ``np.flip`` and ``np.ascontiguousarray`` per image): the issue's baseline.
2. host_crop: ``shardprep.train.data.host_crop.crop_flip`` on the whole batch with ``window_draws`` (what
   ``NumpyReader(..., crop_size=224)`` runs per batch), into a reused output buffer.
3. copy: one contiguous copy of the batch's pixels (a lower bound: every crop must at least move its pixels).

Prints CPU ms per image (process time / images) for each, the median of ``--rounds``, and the ratio to per-sample.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from shardprep.train.data import host_crop

SIDE, CROP = 256, 224


def per_sample(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = []
    for image in images:
        top, left = rng.integers(0, SIDE - CROP + 1, 2)
        window = image[top:top + CROP, left:left + CROP]
        out.append(np.ascontiguousarray(np.flip(window, axis=1) if rng.random() < 0.5 else window))
    return np.stack(out)


def timed(work, batch: int, seconds: float) -> float:
    """CPU ms per image of ``work()`` (one batch), repeated for at least ``seconds``."""
    start, count = time.process_time(), 0
    wall = time.perf_counter()
    while time.perf_counter() - wall < seconds:
        work()
        count += batch
    return (time.process_time() - start) * 1000 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    images = np.random.default_rng(0).integers(0, 256, (args.batch, SIDE, SIDE, 3), dtype=np.uint8)
    out = np.empty((args.batch, CROP, CROP, 3), np.uint8)
    copy_out = np.empty_like(images)
    rng = np.random.default_rng(1)
    steps = iter(range(1 << 40))

    def batched():
        draws = host_crop.window_draws(0, 0, np.arange(args.batch) + next(steps) * args.batch)
        host_crop.crop_flip(images, CROP, draws, out)

    ways = {"per-sample": lambda: per_sample(images, rng), "host_crop": batched,
            "copy": lambda: np.copyto(copy_out, images)}
    results: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, work in ways.items():
            results[name].append(timed(work, args.batch, args.seconds))
    base = statistics.median(results["per-sample"])
    print(f"{'way':<12} {'CPU ms/image':>13} {'vs per-sample':>14}   (batch {args.batch}, {SIDE}->{CROP}, "
          f"median of {args.rounds})")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<12} {median:>13.4f} {base / median:>13.2f}x")


if __name__ == "__main__":
    main()
