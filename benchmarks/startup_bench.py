"""Start-up of a local preprocess run: where the seconds before the first decode go.

    python benchmarks/startup_bench.py [--repeats 3] [--workers 2] [--image PATH] [--also TREE]

Each repeat times, as separate processes: the bare interpreter (``python -c pass``); the launcher's imports
(``import shardprep.cli`` and the job's module ``shardprep.pipelines.preprocess_job.graph``, which imports Beam); and a
one-image ``shardprep preprocess SRC OUT --quiet`` run twice, interleaved: as a user starts it (no Beam options: a
folder this small runs in shardprep's own process, no worker process started) and with ``-- --direct_num_workers=N``
(``--workers``: N SDK worker processes, as every local run started before workers were sized to the work), the
workers forked from the worker zygote (the default) and, third, started as new interpreters as Beam starts them
(``SHARDPREP_FORKED_WORKERS=0``: every run with workers before the zygote). Each from its start to the first decode (the moment the decode stage's spill file appears under ``OUTPUT/.tmp/``,
polled every 5 ms), to its exit, and its CPU seconds (the whole process tree). Medians are printed. ``--image``
defaults to a generated 500x375 JPEG. ``--also TREE`` adds the forked mode run from another source tree (``git
archive COMMIT | tar -x -C TREE``; put first on PYTHONPATH: run the benchmark outside this tree), to compare two
versions side by side in one run.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

POLL_S = 0.005


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def first_spill(folder: str) -> bool:
    try:
        return any(name.startswith("spill-") for name in os.listdir(folder))
    except OSError:
        return False


def one_run(source: str, output: str, workers: int | None, forked: bool = True,
            tree: str | None = None) -> tuple[float, float, float]:
    """(seconds to the first decode, seconds to exit, CPU seconds) of a one-image run; ``workers`` None: as a user
    starts it, without Beam options; ``forked`` False: worker processes started as new interpreters; ``tree``: the
    shardprep of that source tree."""
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet"]
    if workers is not None:
        command += ["--", f"--direct_num_workers={workers}"]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    environment = dict(os.environ, SHARDPREP_FORKED_WORKERS="1" if forked else "0")
    if tree:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, environment.get("PYTHONPATH"))))
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment)
    first = None
    spill_folder = os.path.join(output, ".tmp")
    while run.poll() is None:
        if first is None and first_spill(spill_folder):
            first = time.perf_counter() - started
        time.sleep(POLL_S)
    total = time.perf_counter() - started
    if run.returncode != 0:
        raise RuntimeError(f"preprocess failed: {run.stderr.read().decode(errors='replace')[-2000:]}")
    return (first if first is not None else float("nan")), total, _children_cpu() - cpu_before


def _children_cpu() -> float:
    """CPU seconds of every process this one has waited for (a waited-for launcher's workers included)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_image(folder: str, image: str | None) -> None:
    os.makedirs(os.path.join(folder, "train", "x"))
    target = os.path.join(folder, "train", "x", "image.jpg")
    if image:
        shutil.copyfile(image, target)
        return
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    with open(target, "wb") as f:
        f.write(buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--image")
    parser.add_argument("--also", metavar="TREE", help="also the forked mode from this source tree")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="shardprep-startup-bench-")
    modes = {"default (in-process)": (None, True, None), f"{args.workers} workers, forked": (args.workers, True, None),
             f"{args.workers} workers, new interpreters": (args.workers, False, None)}
    if args.also:
        modes[f"{args.workers} workers, forked, {os.path.basename(args.also.rstrip('/'))}"] = (args.workers, True,
                                                                                               args.also)
    rows: dict[str, list[float]] = {"interpreter": [], "imports": []}
    for mode in modes:
        rows.update({f"{mode}: first decode": [], f"{mode}: exit": [], f"{mode}: CPU s": []})
    try:
        write_image(os.path.join(work, "src"), args.image)
        for repeat in range(args.repeats):
            rows["interpreter"].append(timed([sys.executable, "-c", "pass"]))
            rows["imports"].append(timed([sys.executable, "-c",
                                          "import shardprep.cli, shardprep.pipelines.preprocess_job.graph"]))
            for number, (mode, (workers, forked, tree)) in enumerate(modes.items()):
                output = os.path.join(work, f"out-{repeat}-{number}")
                first, total, cpu = one_run(os.path.join(work, "src"), output, workers, forked, tree)
                rows[f"{mode}: first decode"].append(first)
                rows[f"{mode}: exit"].append(total)
                rows[f"{mode}: CPU s"].append(cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {args.workers} workers, "
          f"load {os.getloadavg()[0]:.1f}, {args.repeats} repeats (median, then each)")
    for name, values in rows.items():
        print(f"{name:50} {statistics.median(values):6.2f} s   " + " ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
