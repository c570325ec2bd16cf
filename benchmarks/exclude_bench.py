"""``preprocess --exclude FILE`` with a large keys file: what the file costs a small run, in time and memory.

    python benchmarks/exclude_bench.py [--keys 3000000] [--images 100] [-- beam options]

Writes ``--images`` 32x32 PNGs (train/a, train/b), a keys file of ``--keys`` keys that name none of them but the
first, and runs ``shardprep preprocess SOURCE OUTPUT --exclude FILE`` twice: without and with the file. Prints the
wall time and the peak resident memory of the run's process tree (the CLI and its workers, from
``resource.getrusage(RUSAGE_CHILDREN)``: the largest single process) of each, and the keys file's size.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image


def _source(folder: str, images: int) -> list[str]:
    keys = []
    for i in range(images):
        key = f"train/{'ab'[i % 2]}/{i:05d}.png"
        os.makedirs(os.path.dirname(os.path.join(folder, key)), exist_ok=True)
        Image.fromarray(np.full((32, 32, 3), i % 256, np.uint8)).save(os.path.join(folder, key))
        keys.append(key)
    return keys


def _run(args: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of one CLI run in a fresh process (so RUSAGE_CHILDREN is its tree alone)."""
    code = ("import resource, subprocess, sys, time; t = time.monotonic(); "
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, r.returncode)")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    seconds, peak, rc = out.split()
    if rc != "0":
        raise SystemExit(f"the run failed ({rc}): {' '.join(args)}")
    return float(seconds), float(peak)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("beam_args", nargs="*")
    args = parser.parse_args()
    cli = os.path.join(os.path.dirname(sys.executable), "shardprep")
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "source")
        keys = _source(source, args.images)
        keys_file = os.path.join(tmp, "keys.txt")
        with open(keys_file, "w") as f:
            f.write(keys[0] + "\n")
            f.writelines(f"train/x/{i:09d}.png\n" for i in range(args.keys - 1))
        base = [cli, "preprocess", source, "--shorter-side", "32", "--num-shards", "1", "--quiet"]
        for label, extra in (("without --exclude", []), (f"--exclude {args.keys:,} keys", ["--exclude", keys_file])):
            seconds, peak = _run(base[:3] + [os.path.join(tmp, f"out-{len(extra)}")] + base[3:] + extra
                                 + (["--", *args.beam_args] if args.beam_args else []))
            print(f"{label}: {seconds:.1f} s, peak RSS {peak:,.0f} MiB")
        print(f"keys file {os.path.getsize(keys_file) / 2**20:,.0f} MiB; {args.images} images")


if __name__ == "__main__":
    main()
