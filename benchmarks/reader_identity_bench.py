"""What the readers' dataset-change check costs: ``NumpyReader`` with it and without it, side by side.

    python benchmarks/reader_identity_bench.py [IMAGES_DIR] [--num-images 2048] [--shards 8 64] [--rounds 3]

Every batch a reader gathers opens the shards it reads; with the check (the default), each opened descriptor is also
``fstat``-ed and compared with the ``DatasetSnapshot`` taken when the reader opened the split, and the manifest and
every shard are ``stat``-ed at each epoch's start (``shardprep.train.data.batch_sources``). Without it is the same
reader with those two methods made no-ops. Raw 256x256 centre crops written by the preprocess job (the photos of
IMAGES_DIR, default ``../shared/data/imagenet-sample``, replicated to ``--num-images``), batches of 256; the more
shards, the more descriptors a batch opens (a global shuffle touches nearly every shard of a small dataset). Prints
host CPU ms per image and images/s, medians of interleaved rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import input_bench  # noqa: E402  (the photos replicated into an ImageFolder, as the input bench makes them)

BATCH = 256


def _dataset(folder: str, output: str, num_shards: int) -> str:
    import subprocess

    command = [os.path.join(os.path.dirname(sys.executable), "shardprep"), "preprocess", folder, output,
               "--shorter-side", "256", "--num-shards", str(num_shards), "--quiet"]
    subprocess.run(command, check=True)
    return output


def _measure(data_dir: str, checked: bool, seconds: float) -> tuple[float, float]:
    from shardprep.train.data import batch_sources as record_identity
    from shardprep.train.data.numpy_reader import NumpyReader

    saved = record_identity.DatasetSnapshot.check_descriptor, record_identity.DatasetSnapshot.check
    if not checked:
        record_identity.DatasetSnapshot.check_descriptor = lambda self, shard, descriptor: None
        record_identity.DatasetSnapshot.check = lambda self: None
    try:
        iterator = iter(NumpyReader(data_dir, "train", BATCH, training=True, seed=0))
        for _ in range(4):
            next(iterator)
        batches, cpu, wall = 0, time.process_time(), time.perf_counter()
        while batches < 8 or time.perf_counter() - wall < seconds:
            next(iterator)
            batches += 1
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        del iterator
    finally:
        record_identity.DatasetSnapshot.check_descriptor, record_identity.DatasetSnapshot.check = saved
    gc.collect()
    time.sleep(0.5)
    return 1000 * cpu / (batches * BATCH), batches * BATCH / wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images_dir", nargs="?", default=input_bench.DEFAULT_IMAGES)
    parser.add_argument("--num-images", type=int, default=2048)
    parser.add_argument("--shards", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="reader_identity_bench_")
    try:
        names = sorted(name for name in os.listdir(args.images_dir) if name.lower().endswith((".jpeg", ".jpg")))
        folder = input_bench._replicated_image_folder(args.images_dir, names, os.path.join(work, "photos"),
                                                      args.num_images)
        datasets = {shards: _dataset(folder, os.path.join(work, f"raw-{shards}"), shards)
                    for shards in args.shards}
        print(f"{args.num_images} raw 256x256 images; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
        results = {(shards, checked): [] for shards in args.shards for checked in (False, True)}
        for round_index in range(args.rounds):
            for (shards, checked), measured in results.items():
                measured.append(_measure(datasets[shards], checked, args.seconds))
                print(f"  round {round_index + 1}, {shards} shards, check {'on' if checked else 'off'}: "
                      f"{measured[-1][0]:.4f} ms CPU/image, {measured[-1][1]:,.0f} images/s", flush=True)
        print(f"\n{'shards':>6} {'check off ms':>12} {'check on ms':>12} {'on/off':>7} {'off img/s':>10} "
              f"{'on img/s':>10}")
        for shards in args.shards:
            off, on = (np.median(np.asarray(results[(shards, checked)]), axis=0) for checked in (False, True))
            print(f"{shards:>6} {off[0]:>12.4f} {on[0]:>12.4f} {on[0] / off[0]:>7.3f} {off[1]:>10,.0f} "
                  f"{on[1]:>10,.0f}")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
