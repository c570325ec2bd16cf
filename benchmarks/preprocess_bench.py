"""Preprocess throughput: the Beam job on N local workers against N plain loops running at once.

    python benchmarks/preprocess_bench.py ../shared/data/imagenet-sample [--copies 100] [--workers N]

Three loops are measured, each as N processes at once, on the same files in the same run:

* ``decode-resize``: read the file, open it with Pillow, decode (JPEG draft decoding when the target is at most
  half the source; plain JPEGs as the job decodes them, ``--loop-decode``), resize the shorter side to 256 and
  centre-crop 256x256 with the job's resize method (``--loop-method``, default the job's: ``lanczos2-cubic``), and
  produce the raw bytes: the work any preprocessor of these photos must do, and nothing the job promises beyond it.
* ``process-image``: the job's own per-image function, ``image_ops.process_image``, per file. Beyond the
  ``decode-resize`` loop it checks the input (format by content, ``--max-pixels`` before decoding, a JPEG's scan
  count, Pillow's warnings caught) and counts every channel's values exactly for the manifest's mean and standard
  deviation; it always decodes as the job does (``--loop-decode`` applies to the first loop only).
* ``write-records`` (the loop the target is judged on: the same per-image work as the job): the per-image function,
  the record's sort key, the record framed in the split's fixed layout, written to a file and hashed with SHA-256
  as the job writes a decode group's file (a raw 256x256 record is 196 KB: 3.9 GB for 20,000 inputs), a new file
  every 625 records (one shard's group). Its ratio is what the pipeline around the work costs: listing, ordering,
  Beam's per-element work, the journal, counts, shards and manifest. The other two ratios say what the promised
  work costs on top of decoding (``decode-resize``: the checks, statistics, records, hashes and writes).

Inputs are the images of SOURCE_DIR replicated ``--copies`` times (hard links) into an ImageFolder tree, so Beam's
start-up cost (~2.5-3.5 s on 2 cores, measured separately on a one-image dataset) is amortised. The loop runs right
before and right after the job, and the job is compared with their mean: on a shared machine the speed drifts
during a run, and a baseline taken only before the job would carry that drift into the ratio. The N loops run at
once, one process each, and their rates are summed: two processes on this 2-vCPU machine give 1.05-1.25x one, not
2x, so N x one loop would overstate what N cores do. Prints images/s of the job and of every loop and the ratios
job / N parallel loops, with and without the job's start-up; the target is >= 0.9 of the ``write-records`` loops
without it. ``--loop-passes 50`` gives each of two loops 10,000 inputs: together the job's 20,000 and its 3.9 GB.
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


def pillow_loop(paths: list[str], method: str = "lanczos2-cubic", job_decode: bool = True) -> float:
    """Images/s of a plain single-process loop over ``paths``, resizing with ``method``; ``job_decode``: plain JPEGs
    decoded as the job decodes them (``image_ops.decode_plain_rgb``: libjpeg-turbo straight to an array), else all by Pillow."""
    from shardprep.preprocess.image import image_ops, resize

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
        fast = image_ops.decode_plain_rgb(image, data) if job_decode else None
        image = fast if fast is not None else image.convert("RGB")
        width, height = (image.shape[1], image.shape[0]) if fast is not None else image.size
        if width <= height:
            size = (SHORTER_SIDE, max(1, round(height * SHORTER_SIDE / width)))
        else:
            size = (max(1, round(width * SHORTER_SIDE / height)), SHORTER_SIDE)
        resize.resize_and_crop(image, size, SHORTER_SIDE, "center", method).tobytes()
    return len(paths) / (time.perf_counter() - started)


def process_image_loop(paths: list[str], method: str = "lanczos2-cubic") -> float:
    """Images/s of a single-process loop calling the job's per-image function on every file of ``paths``."""
    from shardprep.preprocess.image import image_ops

    options = image_ops.ProcessOptions(shorter_side=SHORTER_SIDE, resize_method=method)
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            image_ops.process_image(f.read(), options)
    return len(paths) / (time.perf_counter() - started)


GROUP_RECORDS = 625  # the job's decode group on this tree: one shard's records, written to a file of its own


def write_records_loop(paths: list[str], method: str = "lanczos2-cubic", folder: str | None = None) -> float:
    """Images/s of a single-process loop doing the job's whole per-image work on every file of ``paths``: the
    per-image function, the record's sort key, the record framed in the split's fixed layout, written to a file under
    ``folder`` and hashed (SHA-256) as the job writes a decode group's file (a new file every GROUP_RECORDS); the
    files are removed after the timing."""
    import hashlib

    from shardprep.preprocess.format import fixed_layout, record_format, sharding
    from shardprep.preprocess.image import image_ops

    options = image_ops.ProcessOptions(shorter_side=SHORTER_SIDE, resize_method=method)
    keys = [os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.dirname(path)))) for path in paths]
    sizes = [len(key.encode("utf-8")) for key in keys]
    layout = fixed_layout.FixedLayout.for_records(SHORTER_SIDE, SHORTER_SIDE, (min(sizes), max(sizes)), 999)
    written = []
    started = time.perf_counter()
    stream = digest = None
    for index, (path, key) in enumerate(zip(paths, keys)):
        if index % GROUP_RECORDS == 0:
            if stream is not None:
                stream.close()
                digest.hexdigest()
            written.append(tempfile.mktemp(dir=folder, suffix=".records"))
            stream, digest = open(written[-1], "xb"), hashlib.sha256()
        with open(path, "rb") as f:
            image = image_ops.process_image(f.read(), options)
        sharding.sort_key(0, "train", key)
        record = record_format.ImageRecord(encoded=image.encoded, format=options.encoding, height=image.height,
                                           width=image.width, label=index % 1000, filename=key)
        framed = layout.encode(record, shard_end=(index + 1) % GROUP_RECORDS == 0)
        stream.write(framed)
        digest.update(framed)
    stream.close()
    digest.hexdigest()
    rate = len(paths) / (time.perf_counter() - started)
    for path in written:
        os.remove(path)
    return rate


LOOP_WORKS = ("decode-resize", "process-image", "write-records")


def _one_loop(arguments: tuple) -> float:
    work, paths, method, job_decode, folder = arguments
    if work == "decode-resize":
        return pillow_loop(paths, method, job_decode)
    return process_image_loop(paths, method) if work == "process-image" else write_records_loop(paths, method, folder)


def parallel_loops(paths: list[str], processes: int, method: str, job_decode: bool,
                   work: str = "decode-resize", folder: str | None = None) -> float:
    """Images/s of ``processes`` loops of ``work`` (one of LOOP_WORKS) run at once, one process each (their rates
    summed): what N cores give."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.map(_one_loop, [(work, paths, method, job_decode, folder)] * processes))


def all_loops(paths: list[str], processes: int, method: str, job_decode: bool,
              folder: str | None = None) -> dict[str, float]:
    """{work: images/s of ``processes`` parallel loops of it} for every loop in LOOP_WORKS (``folder``: where the
    ``write-records`` loops write)."""
    return {work: parallel_loops(paths, processes, method, job_decode, work, folder) for work in LOOP_WORKS}


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
    parser.add_argument("--copies", type=int, default=100,
                        help="replicas of each image (default 100: 20,000 inputs)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="local job workers (default: cores)")
    parser.add_argument("--loop-passes", type=int, default=3, help="passes of the loop over every distinct image")
    parser.add_argument("--loop-method", default="lanczos2-cubic", choices=("lanczos2-cubic", "pillow-bicubic"),
                        help="the loop's resize method (the job's is lanczos2-cubic)")
    parser.add_argument("--loop-decode", default="job", choices=("job", "pillow"),
                        help="the loop's JPEG decode: the job's (simplejpeg for plain JPEGs) or Pillow's for all")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="shardprep-bench-")
    try:
        paths = replicate(args.source_dir, os.path.join(work, "src"), args.copies)
        distinct = paths[:: args.copies]  # one copy of every image, so the loop sees the same mix as the job
        loop_args = (distinct * args.loop_passes, args.workers, args.loop_method, args.loop_decode == "job", work)
        loops_before = all_loops(*loop_args)

        def run_job(source: str, output: str) -> float:
            command = [sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet", "--",
                       f"--direct_num_workers={args.workers}"]
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - started

        # Start-up (imports, worker processes, planning, manifest) measured on a one-image dataset.
        os.makedirs(os.path.join(work, "one", "train", "x"))
        os.link(distinct[0], os.path.join(work, "one", "train", "x", "image.JPEG"))
        startup_seconds = run_job(os.path.join(work, "one"), os.path.join(work, "one-out"))
        job_seconds = run_job(os.path.join(work, "src"), os.path.join(work, "out"))
        loops_after = all_loops(*loop_args)
        job_rate = len(paths) / job_seconds
        steady_rate = len(paths) / max(1e-9, job_seconds - startup_seconds)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"inputs: {len(paths)} ({args.copies} copies of {len(distinct)} images from {args.source_dir})")
        print(f"preprocess job ({args.workers} workers): wall {job_seconds:.1f} s incl. start-up, {job_rate:.1f} "
              f"images/s; start-up alone (1-image run) {startup_seconds:.1f} s, without it {steady_rate:.1f} images/s")
        for loop in LOOP_WORKS:
            before, after = loops_before[loop], loops_after[loop]
            loop_rate = (before + after) / 2
            target = "  (target >= 0.9)" if loop == "write-records" else ""
            print(f"{args.workers} {loop} loops at once ({len(distinct) * args.loop_passes} images each, before and "
                  f"after the job): {before:.1f} and {after:.1f}, mean {loop_rate:.1f} images/s -> job / loops "
                  f"{job_rate / loop_rate:.2f} with start-up, {steady_rate / loop_rate:.2f} without{target}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
