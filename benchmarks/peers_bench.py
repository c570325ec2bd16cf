"""shardprep against its peers, side by side: writing a dataset of raw 256x256 crops, and reading it back one epoch.

    pip install -e '.[bench]'   # the peers: WebDataset, LitData, mosaicml-streaming (FFCV: see BENCHMARKS.md)
    python benchmarks/peers_bench.py [SOURCE] [--copies 10] [--rounds 3] [--workers 2] [--batch 100]
    python benchmarks/peers_bench.py --smoke   # a few generated images, 1 round: the test suite's run

SOURCE (default ../shared/data/imagenet-sample) is a folder of images, linked ``--copies`` times into an ImageFolder
tree. Every writer does the same work: decode, RGB, shorter side 256, centre crop 256, raw uint8 pixels, on
``--workers`` processes: shardprep (its CLI, ``--encoding raw``), WebDataset ``ShardWriter``, MosaicML ``MDSWriter``
(both fed by a ``multiprocessing.Pool``), LitData ``optimize``, FFCV ``DatasetWriter``, and two bare Pool loops that
write nothing (Pillow: draft + BICUBIC, as the peers' own per-image function; OpenCV: ``imdecode`` + ``INTER_AREA``).
Rounds are interleaved: each round runs shardprep, then every other writer in a rotated order with shardprep again
after each, then the readers the same way; each ratio is to the mean of shardprep's two runs around that tool, so the
load of a shared machine, which moves within minutes, mostly cancels (``--smoke``: one shardprep run a round). The
tables give the median of the rounds' ratios (> 1: slower, more) and each round's. Per writer:

* whole command: wall time of the command, interpreter start to exit (each tool runs as a process of its own);
* without start-up: first image done to last image done. The peers' per-image function stamps the time after each
  image; shardprep's is read from its progress lines (``SHARDPREP_PROGRESS_SECONDS``, its workers' counts polled
  every 0.5 s, so +-0.5 s); "n/a" when the run is too short to tell (the smoke run);
* CPU: user + system seconds of the process tree (``getrusage`` of the waited-for children);
* peak memory: the most the process tree held at once (the RSS of the command and all its children, summed, polled
  every 0.1 s; pages shared between processes count once per process);
* output bytes, and pixel error: the mean |difference| in 8-bit levels, over the distinct images, of the per-image
  function each writer stores against a Lanczos reference (the full decode in float, Lanczos to shorter side 256,
  centre crop 256).

Shardprep's row says how many runs its figures (medians) come from. Readers (one process each, 2 epochs, the second timed): one epoch of random 224 crops + flips on the host, batches of
``--batch``: shardprep ``NumpyReader(crop_size=224)`` and ``NumpyReader`` + a NumPy crop per sample, WebDataset
``WebLoader``, MDS ``StreamingDataset``, LitData ``StreamingDataset``, FFCV ``Loader``; wall of the steady epoch and
its CPU ms an image (the process's CPU time / images). A peer that is not installed is skipped, and says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

import numpy as np

import peers_work
from preprocess_bench import replicate  # the same replicated tree as the throughput benchmark

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "..", "shared", "data", "imagenet-sample")
# tool -> the import names it needs: a peer without one of them is skipped, and the tables say so
PEERS = {"webdataset": ("webdataset",), "litdata": ("litdata", "torch"), "mds": ("streaming", "torch"),
         "ffcv": ("ffcv",)}
WRITERS = {"shardprep": "shardprep preprocess", "webdataset": "WebDataset ShardWriter + Pool",
           "litdata": "LitData optimize", "mds": "MosaicML MDSWriter + Pool", "ffcv": "FFCV DatasetWriter",
           "bare-pillow": "bare Pillow Pool loop (writes nothing)",
           "bare-opencv": "bare OpenCV Pool loop (writes nothing)"}
READERS = {"shardprep": "shardprep NumpyReader(crop_size=224)", "shardprep-numpy": "shardprep NumpyReader + NumPy crop",
           "webdataset": "WebDataset WebLoader", "mds": "MDS StreamingDataset", "litdata": "LitData StreamingDataset",
           "ffcv": "FFCV Loader"}
ERROR_FUNCTIONS = {"shardprep": peers_work.shardprep_pixels, "pillow": peers_work.pillow_pixels,
                   "opencv": peers_work.opencv_pixels}
ERROR_OF = {"shardprep": "shardprep", "bare-opencv": "opencv"}  # every other writer stores the Pillow function's
SKIPPED = "skipped: not installed (pip install -e '.[bench]')"


class Run(NamedTuple):
    wall: float  # the whole command
    steady: float | None  # first image done to last image done (None: too short to tell)
    cpu: float  # CPU seconds of the process tree (user + system)
    peak_bytes: int
    out_bytes: int


class Measured(NamedTuple):
    result: Run | dict | str  # a writer's Run, a reader's figures, or why it failed
    base: Run | dict | None  # shardprep's right before and right after it, averaged (None: one of them failed)


class Failed(Exception):
    """A tool's command exited with an error: its row says so and the others go on."""


def missing(tool: str) -> list[str]:
    """The import names ``tool`` needs that this Python cannot import."""
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ImportError:
            return True

    return [name for name in PEERS.get(tool, ()) if absent(name)]


# --- the inputs ------------------------------------------------------------------------------------------------------

def smoke_source(folder: str, count: int = 8) -> str:
    """``count`` small photo-like JPEGs (smooth gradients and noise, 600x450 and 450x600) in ``folder``."""
    from PIL import Image

    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for index in range(count):
        width, height = (600, 450) if index % 2 else (450, 600)
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"c{index % 2}_{index}.jpg"), quality=90)
    return folder


# --- one timed command -----------------------------------------------------------------------------------------------

def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run_command(command: list[str], env: dict) -> tuple[float, float, int, list[tuple[float, str]]]:
    """(wall s, CPU s and peak RSS of the process tree, (time, line) of each stderr line) of ``command``."""
    import resource

    import psutil

    lines: list[tuple[float, str]] = []
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process waited for, grandchildren included
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr
    assert stderr is not None
    reading = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in stderr), daemon=True)
    reading.start()
    peak = 0
    while child.poll() is None:
        total = 0
        try:
            parent = psutil.Process(child.pid)
            for process in [parent, *parent.children(recursive=True)]:
                total += process.memory_info().rss
        except psutil.Error:  # a process ended between the listing and the reading
            pass
        peak = max(peak, total)
        time.sleep(0.1)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    reading.join()
    if child.returncode:
        last = lines[-1][1].strip() if lines else ""
        raise Failed(f"failed (exit {child.returncode}): {last}")
    return wall, cpu, peak, lines


def run_writer(tool: str, source: str, out: str, workers: int) -> Run:
    if tool == "shardprep":
        command = [sys.executable, "-m", "shardprep.cli", "preprocess", source, out, "--encoding", "raw", "--",
                   f"--direct_num_workers={workers}"]
        wall, cpu, peak, lines = run_command(command, {**os.environ, "SHARDPREP_PROGRESS_SECONDS": "0.01"})
        return Run(wall, progress_span(lines), cpu, peak, tree_bytes(out))
    stamps = tempfile.mkdtemp(prefix="peers-stamps-")
    try:
        command = [sys.executable, os.path.join(HERE, "peers_work.py"), "--workers", str(workers),
                   "--write", tool, source, out]
        wall, cpu, peak, _ = run_command(command, {**os.environ, peers_work.STAMPS_ENV: stamps})
        spans = [struct.unpack("dd", open(os.path.join(stamps, name), "rb").read(16)) for name in os.listdir(stamps)]
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
    steady = max(last for _, last in spans) - min(first for first, _ in spans) if spans else None
    return Run(wall, steady, cpu, peak, tree_bytes(out) if os.path.exists(out) else 0)


def progress_span(lines: list[tuple[float, str]]) -> float | None:
    """First image to last from shardprep's plain progress lines (``images 120/303 (40%), ...``): the first line
    with images done, the first with all done; None when fewer than a second apart (the 0.5 s polls can't tell)."""
    done = [(moment, line.split()[1].split("/")) for moment, line in lines if line.startswith("images ")]
    if not done:
        return None
    last = next((moment for moment, (count, total) in done if count == total), done[-1][0])
    span = last - done[0][0]
    return span if span >= 1.0 else None


def run_reader(tool: str, out: str, batch: int) -> dict:
    command = [sys.executable, os.path.join(HERE, "peers_work.py"), "--batch", str(batch), "--read", tool, out]
    answer = subprocess.run(command, capture_output=True, text=True)
    if answer.returncode:
        raise Failed(f"failed (exit {answer.returncode}): {(answer.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(answer.stdout.strip().splitlines()[-1])


def pixel_errors(paths: list[str]) -> dict[str, float]:
    """{function: mean |error| in 8-bit levels against the Lanczos reference over ``paths``}."""
    totals = dict.fromkeys(ERROR_FUNCTIONS, 0.0)
    for path in paths:
        reference = peers_work.lanczos_reference(path)
        for name, function in ERROR_FUNCTIONS.items():
            totals[name] += float(np.abs(function(path).astype(np.float32) - reference).mean())
    return {name: total / len(paths) for name, total in totals.items()}


# --- rounds and tables -----------------------------------------------------------------------------------------------

def rotated(names: list[str], turn: int) -> list[str]:
    return names[turn % len(names):] + names[:turn % len(names)]


def dataset_of(reader: str) -> str:
    return "shardprep" if reader.startswith("shardprep") else reader


def averaged(before, after):
    """shardprep's two runs around a tool's, averaged: what its ratio is taken to."""
    if isinstance(before, str) or isinstance(after, str):
        return None
    if isinstance(before, dict):
        return {key: (before[key] + after[key]) / 2 for key in before}
    steady = (before.steady + after.steady) / 2 if before.steady and after.steady else None
    return Run((before.wall + after.wall) / 2, steady, (before.cpu + after.cpu) / 2,
               max(before.peak_bytes, after.peak_bytes), before.out_bytes)


def bracketed(names: list[str], run_one, turn: int, results: dict, again: bool = True) -> None:
    """One round: shardprep, then each other tool (in an order rotated by ``turn``) followed by shardprep ``again``, so
    every ratio is to shardprep's runs right around it: on a shared machine the load moves within minutes. Without
    ``again`` (the smoke run) every ratio is to the round's first shardprep run."""
    def attempt(name: str):
        try:
            result = run_one(name)
        except Failed as failure:
            result = str(failure)
        print(f"round {turn + 1} {name}: {result}", file=sys.stderr)
        return result

    before = attempt("shardprep")
    results["shardprep"].append(Measured(before, before if not isinstance(before, str) else None))
    for name in rotated([n for n in names if n != "shardprep"], turn):
        result = attempt(name)
        if not again:
            results[name].append(Measured(result, before if not isinstance(before, str) else None))
            continue
        after = attempt("shardprep")
        results[name].append(Measured(result, averaged(before, after)))
        results["shardprep"].append(Measured(after, after if not isinstance(after, str) else None))
        before = after


def run_rounds(tree: str, work: str, args) -> tuple[dict, dict]:
    """({writer: [Measured]}, {reader: [Measured]}): every writer, then every reader, ``args.rounds`` times."""
    writers = [tool for tool in WRITERS if not missing(tool) and tool in args.only]
    readers = [tool for tool in READERS if not missing(tool) and dataset_of(tool) in writers]
    writes: dict = {tool: [] for tool in writers}
    reads: dict = {tool: [] for tool in readers}

    def write_one(tool: str) -> Run:
        out = os.path.join(work, f"out-{tool}")
        shutil.rmtree(out, ignore_errors=True)
        return run_writer(tool, tree, out, args.workers)

    for turn in range(args.rounds):
        bracketed(writers, write_one, turn, writes, not args.smoke)
        bracketed(readers, lambda tool: run_reader(tool, os.path.join(work, f"out-{dataset_of(tool)}"), args.batch),
                  turn, reads, not args.smoke)
    return writes, reads


def ratios(measured: list[Measured], value, rounds: bool = True) -> str:
    """The median of the ratios of ``value(run)`` to shardprep's around it, and (``rounds``) each round's."""
    if measured and measured[0].result is measured[0].base:  # shardprep's own row
        return f"1 | the base: {len(measured)} runs" if rounds else "1"
    pairs = [(value(m.result), value(m.base)) for m in measured if not isinstance(m.result, str) and m.base
             and value(m.result) is not None and value(m.base)]
    if not pairs:
        return "n/a | n/a" if rounds else "n/a"
    each = [mine / base for mine, base in pairs]
    median = f"{statistics.median(each):.2f}×"
    return f"{median} | {', '.join(f'{r:.2f}' for r in each)}" if rounds else median


def megabytes(count: float) -> str:
    return f"{count / 1e6:,.0f} MB" if count >= 1e6 else f"{count / 1e6:.2f} MB"


def seconds(values: list) -> str:
    present = [value for value in values if value]
    return f"{statistics.median(present):.1f}" if present else "n/a"


def write_table(writes: dict, errors: dict[str, float], args) -> list[str]:
    lines = ["| write | whole command vs shardprep | per round | without start-up vs shardprep | per round | CPU (tree) "
             "vs shardprep | s: whole / without start-up / CPU | peak memory (tree) | output | error (levels) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for tool, name in WRITERS.items():
        runs = [m.result for m in writes.get(tool, []) if isinstance(m.result, Run)]
        if not runs:
            why = writes[tool][-1].result if writes.get(tool) else reason(tool, args)
            lines.append(f"| {name} | {why} |" + "  |" * 9)
            continue
        output = megabytes(statistics.median(r.out_bytes for r in runs)) if not tool.startswith("bare") else "none"
        lines.append(f"| {name} | {ratios(writes[tool], lambda r: r.wall)} | "
                     f"{ratios(writes[tool], lambda r: r.steady)} | {ratios(writes[tool], lambda r: r.cpu, False)} | "
                     f"{seconds([r.wall for r in runs])} / {seconds([r.steady for r in runs])} / "
                     f"{seconds([r.cpu for r in runs])} | {megabytes(max(r.peak_bytes for r in runs))} | {output} | "
                     f"{errors[ERROR_OF.get(tool, 'pillow')]:.2f} |")
    return lines


def read_table(reads: dict, args) -> list[str]:
    lines = ["| read one epoch, crop 224 + flip on the host, 1 process | steady epoch vs shardprep | per round | "
             "steady epoch s | CPU ms an image | first epoch s |", "|---|---|---|---|---|---|"]
    for tool, name in READERS.items():
        runs = [m.result for m in reads.get(tool, []) if isinstance(m.result, dict)]
        if not runs:
            why = reads[tool][-1].result if reads.get(tool) else reason(tool, args)
            lines.append(f"| {name} | {why} |  |  |  |  |")
            continue
        cpu = [r["cpu_ms"] for r in runs]
        lines.append(f"| {name} | {ratios(reads[tool], lambda r: r['wall'])} | "
                     f"{statistics.median(r['wall'] for r in runs):.2f} | {min(cpu):.2f}–{max(cpu):.2f} | "
                     f"{statistics.median(r['first_wall'] for r in runs):.2f} |")
    return lines


def reason(tool: str, args) -> str:
    absent = missing(dataset_of(tool))
    if absent:
        return f"{SKIPPED[:-1]}: no {', '.join(absent)})"
    return "not run (--only)" if dataset_of(tool) not in args.only else "not run"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", nargs="?", default=DEFAULT_SOURCE, help="a folder of images")
    parser.add_argument("--copies", type=int, default=10, help="links of each image (default 10)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--only", default=",".join(WRITERS), help="writers to run (comma-separated; shardprep is "
                        "always run: every ratio is to it)")
    parser.add_argument("--smoke", action="store_true", help="8 generated images, 1 round, batches of 4")
    args = parser.parse_args(argv)
    args.only = {"shardprep", *args.only.split(",")}
    work = tempfile.mkdtemp(prefix="peers-bench-")
    try:
        if args.smoke:
            args.source, args.copies, args.rounds, args.batch = smoke_source(os.path.join(work, "photos")), 1, 1, 4
        if not os.path.isdir(args.source):
            print(f"Error: {args.source} is not a folder of images", file=sys.stderr)
            return 2
        replicate(args.source, os.path.join(work, "src"), args.copies)
        distinct = sorted(os.path.join(args.source, f) for f in os.listdir(args.source) if not f.startswith("."))
        writes, reads = run_rounds(os.path.join(work, "src"), work, args)
        errors = pixel_errors(distinct)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"command: python benchmarks/peers_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, Python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"inputs: {len(distinct) * args.copies} ({args.copies} copies of {len(distinct)} images), "
          f"{args.workers} workers, {args.rounds} rounds interleaved; ratios are medians of the rounds' (>1: slower)")
    print("\n".join(["", *write_table(writes, errors, args), "", *read_table(reads, args)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
