"""Where local worker processes start to pay: a folder of photos run in-process against N worker processes.

    python benchmarks/worker_sizing_bench.py ../shared/data/imagenet-sample [--mib 16 64 128] [--workers 2]
    python benchmarks/worker_sizing_bench.py --smoke     # two generated photos, for the test suite

For each size, an ImageFolder of about that many MiB of the given photos (hard links, cycled, so the page cache
holds them: the decode is what is timed, not the disk), preprocessed by ``shardprep preprocess SRC OUT --quiet``
three ways, interleaved: in-process (``--direct_running_mode=in_memory``), with ``--workers`` SDK worker processes,
and as a user starts it (no Beam options: ``runner.sized_to_work`` chooses). Prints each run's wall seconds and
CPU seconds (the whole process tree) and the in-process wall time over the workers' (above 1: the workers paid
for their start). ``PREPROCESS_BYTES_PER_WORKER`` is meant to sit near the size where that ratio crosses 1.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

MIB = 2**20


def photos_of(folder: str) -> list[str]:
    names = sorted(name for name in os.listdir(folder) if name.lower().endswith((".jpeg", ".jpg", ".png")))
    return [os.path.join(folder, name) for name in names]


def make_source(photos: list[str], target_bytes: int, folder: str) -> tuple[int, int]:
    """A train split of two classes holding about ``target_bytes`` of ``photos`` (hard links); (files, bytes)."""
    count = total = 0
    while total < target_bytes:
        photo = photos[count % len(photos)]
        label = folder + f"/train/c{count % 2}"
        os.makedirs(label, exist_ok=True)
        target = os.path.join(label, f"{count:06d}{os.path.splitext(photo)[1]}")
        try:
            os.link(photo, target)
        except OSError:
            shutil.copyfile(photo, target)
        total += os.path.getsize(photo)
        count += 1
    return count, total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(source: str, output: str, beam_args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one preprocess run."""
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet", "--shorter-side", "128",
               "--allow-upscale"]  # --smoke's 80x60 images: the decode is timed, whatever their size
    if beam_args:
        command += ["--", *beam_args]
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode(errors="replace")[-2000:])
    return time.perf_counter() - started, children_cpu() - cpu


def smoke_photos(folder: str) -> str:
    import numpy as np
    from PIL import Image

    os.makedirs(folder)
    for index in range(2):
        pixels = np.random.default_rng(index).integers(0, 256, (60, 80, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG")
        with open(os.path.join(folder, f"{index}.jpg"), "wb") as f:
            f.write(buffer.getvalue())
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", nargs="?", help="a folder of photos (e.g. ../shared/data/imagenet-sample)")
    parser.add_argument("--mib", type=float, nargs="+", default=[16, 64, 128])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--smoke", action="store_true", help="two generated photos, 0.01 MiB, one worker")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="shardprep-worker-sizing-bench-")
    try:
        if args.smoke:
            args.photos, args.mib, args.workers = smoke_photos(os.path.join(work, "photos")), [0.01], 1
        if not args.photos:
            parser.error("give a folder of photos, or --smoke")
        photos = photos_of(args.photos)
        modes = {"in-process": ["--direct_running_mode=in_memory", "--direct_num_workers=1"],
                 f"{args.workers} workers": [f"--direct_num_workers={args.workers}"], "default (sized)": []}
        print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"load {os.getloadavg()[0]:.1f} at the start")
        print(f"{'MiB':>7} {'files':>6}  " + "  ".join(f"{m + ' wall/CPU s':>28}" for m in modes)
              + "  in-process wall / workers'")
        for mib in args.mib:
            source = os.path.join(work, f"source-{mib}")
            files, size = make_source(photos, int(mib * MIB), source)
            figures = {}
            for mode, beam_args in modes.items():
                output = os.path.join(work, f"out-{mib}-{len(figures)}")
                figures[mode] = run(source, output, beam_args)
                shutil.rmtree(output)
            cells = "  ".join(f"{wall:>17.1f} / {cpu:>8.1f}" for wall, cpu in figures.values())
            ratio = figures["in-process"][0] / figures[f"{args.workers} workers"][0]
            print(f"{size / MIB:7.1f} {files:6d}  {cells}  {ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
