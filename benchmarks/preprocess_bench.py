"""Preprocess throughput: the Beam job on N local workers against a plain single-process Pillow loop.

    python benchmarks/preprocess_bench.py ../shared/data/imagenet-sample [--copies 15] [--workers N]

Both sides do the same work per image on the same files in the same run: read the file, decode (JPEG draft
decoding when the target is at most half the source), convert to RGB, resize the shorter side to 256 (BICUBIC),
centre-crop 256x256, and produce the raw bytes. The job also does what the loop does not: serialize records,
shuffle them into seeded uniform shards, hash and write them, count classes and pixel statistics.

Inputs are the images of SOURCE_DIR replicated ``--copies`` times (hard links) into an ImageFolder tree, so Beam's
start-up cost is amortised. Prints images/s of both and the ratio job / (N x loop); the target is >= 0.8.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from PIL import Image

SHORTER_SIDE = 256


def pillow_loop(paths: list[str]) -> float:
    """Images/s of a plain single-process Pillow loop over ``paths``."""
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        import io

        image = Image.open(io.BytesIO(data))
        width, height = image.size
        scale = SHORTER_SIDE / min(width, height)
        if image.format == "JPEG" and scale <= 0.5:
            image.draft(None, (int(width * scale + 1), int(height * scale + 1)))
        image = image.convert("RGB")
        width, height = image.size
        if width <= height:
            size = (SHORTER_SIDE, max(1, round(height * SHORTER_SIDE / width)))
        else:
            size = (max(1, round(width * SHORTER_SIDE / height)), SHORTER_SIDE)
        image = image.resize(size, Image.Resampling.BICUBIC)
        left, top = (size[0] - SHORTER_SIDE) // 2, (size[1] - SHORTER_SIDE) // 2
        image.crop((left, top, left + SHORTER_SIDE, top + SHORTER_SIDE)).tobytes()
    return len(paths) / (time.perf_counter() - started)


def replicate(source_dir: str, root: str, copies: int) -> list[str]:
    """An ImageFolder tree root/train/<class>/<copy>_<file> of hard links (copies when linking fails)."""
    files = sorted(f for f in os.listdir(source_dir) if not f.startswith("."))
    paths = []
    for name in files:
        class_dir = os.path.join(root, "train", os.path.splitext(name)[0].split("_", 1)[0])
        os.makedirs(class_dir, exist_ok=True)
        for copy in range(copies):
            target = os.path.join(class_dir, f"{copy:03d}_{name}")
            try:
                os.link(os.path.join(source_dir, name), target)
            except OSError:
                shutil.copyfile(os.path.join(source_dir, name), target)
            paths.append(target)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_dir")
    parser.add_argument("--copies", type=int, default=15, help="replicas of each image (default 15: 3,000 inputs)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="local job workers (default: cores)")
    parser.add_argument("--loop-images", type=int, default=600, help="images the single-process loop times")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="shardprep-bench-")
    try:
        paths = replicate(args.source_dir, os.path.join(work, "src"), args.copies)
        loop_rate = pillow_loop(paths[: args.loop_images])
        command = [sys.executable, "-m", "shardprep.cli", "preprocess", os.path.join(work, "src"),
                   os.path.join(work, "out"), "--quiet", "--", f"--direct_num_workers={args.workers}"]
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        job_seconds = time.perf_counter() - started
        job_rate = len(paths) / job_seconds
        ratio = job_rate / (args.workers * loop_rate)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"inputs: {len(paths)} ({args.copies} copies of {len(paths) // args.copies} images from {args.source_dir})")
        print(f"pillow loop (1 process, {min(len(paths), args.loop_images)} images): {loop_rate:8.1f} images/s")
        print(f"preprocess job ({args.workers} workers, wall {job_seconds:.1f} s incl. start-up): {job_rate:8.1f} images/s")
        print(f"ratio job / ({args.workers} x loop): {ratio:.2f}  (target >= 0.8)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
