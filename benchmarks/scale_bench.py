"""ImageNet's count on one machine: the whole preprocess job, then validate, on up to 1.28 M small generated inputs.

    python benchmarks/scale_bench.py [--sizes 128000 256000 512000] [--workers 2] [--json RESULTS] [--keep DIR]
    python benchmarks/scale_bench.py --distinct --near-duplicates --rounds 3 --sizes 1280000   # the search's cost
    python benchmarks/scale_bench.py --smoke     # 300 inputs, for the test suite

For each size, an ImageFolder like ImageNet's train split: 1,000 class folders of WordNet-style names, the inputs
spread over them, each a hard link to one of 256 distinct small JPEGs (10-24 px a side), and one input in 1,000 a
text file named ``.JPEG`` (a reject). Then ``shardprep preprocess SRC OUT --shorter-side 8 --num-shards N`` (1,250
records a shard, as ImageNet's 1,024 train shards) runs the whole job as a separate process -- listing, ordering,
decode groups, shards, manifest, rejects, the journal -- and ``shardprep validate OUT`` reads every shard back.
Each run's resident memory is sampled every 0.1 s (``memory_bench.sample_tree``): the launcher and the largest SDK
worker. Small images keep the run to minutes: the per-image decode is what ``preprocess_bench.py`` measures; this
one measures what grows with the count.

``--distinct`` makes every input a picture of its own (random noise, 10-24 px; one JPEG encode each, so writing
1.28 M takes minutes), so that validate's near-duplicate search faces as many distinct hashes as ImageNet would;
``--near-duplicates`` runs validate without the search (``--no-near-duplicates``) and with it, interleaved,
``--rounds`` times each, and prints the ratio of their wall times per round (side by side: the same load).

Prints per size and command: wall time, CPU seconds of the whole process tree (and of the launcher alone), peak RSS
of the launcher and of the largest worker, and the CPU seconds per 100,000 inputs against the smallest size's (1.00
is linear). CPU time, not wall time, is the linearity measure: on a shared machine the wall time follows the load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_bench import MIB, sample_tree  # noqa: E402

CLASSES = 1000
DISTINCT = 256
REJECT_EVERY = 1000
RECORDS_PER_SHARD = 1250
SHORTER_SIDE = 8


def distinct_jpegs(folder: str) -> list[str]:
    """256 small JPEGs of varied sizes and colours."""
    import numpy as np
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for index in range(DISTINCT):
        width, height = (int(v) for v in rng.integers(10, 25, 2))
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        path = os.path.join(folder, f"{index:03d}.JPEG")
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
        paths.append(path)
    text = os.path.join(folder, "notes.JPEG")
    with open(text, "w") as f:
        f.write("not an image\n")
    return paths + [text]


def write_source(root: str, size: int, pool: list[str], distinct: bool = False) -> None:
    """``size`` inputs in ``root/train/<class>/``, hard links into ``pool`` (its last entry the reject); with
    ``distinct``, each input not a reject a small random JPEG of its own."""
    import numpy as np
    from PIL import Image

    class_dirs = [os.path.join(root, "train", f"n{index:08d}") for index in range(CLASSES)]
    for directory in class_dirs:
        os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(size)
    for index in range(size):
        path = os.path.join(class_dirs[index % CLASSES], f"img_{index:08d}.JPEG")
        if index % REJECT_EVERY == REJECT_EVERY - 1 or not distinct:
            os.link(pool[-1] if index % REJECT_EVERY == REJECT_EVERY - 1 else pool[index % DISTINCT], path)
            continue
        width, height = (int(v) for v in rng.integers(10, 25, 2))
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path, "JPEG", quality=90)


def cpu_seconds(root: psutil.Process, seen: dict[int, float]) -> None:
    """Each process's user + system CPU seconds so far, into ``seen`` by pid (a process's last sample is kept)."""
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        seen[process.pid] = times.user + times.system


def measure(command: list[str]) -> dict:
    """Runs ``command`` once: wall time, CPU seconds of the launcher and of the whole process tree (sampled every
    0.1 s, so a process's last 0.1 s is missed), and peak RSS (bytes); raises if it fails."""
    peaks = {"tree": 0, "launcher": 0, "largest_worker": 0, "processes": 0}
    seen: dict[int, float] = {}
    log = tempfile.TemporaryFile()
    started = time.perf_counter()
    run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        root = psutil.Process(run.pid)
        while run.poll() is None:
            sample = sample_tree(root)
            peaks = {name: max(peaks[name], sample[name]) for name in peaks}
            cpu_seconds(root, seen)
            time.sleep(0.1)
        wall = time.perf_counter() - started
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 9)
            run.wait()
    if run.returncode != 0:
        log.seek(0)
        raise RuntimeError(f"{command[3]} failed (exit {run.returncode}):\n"
                           f"{log.read().decode(errors='replace')[-3000:]}")
    return {**peaks, "wall_s": wall, "cpu_s": sum(seen.values()), "launcher_cpu_s": seen.get(run.pid, 0.0)}


def prepare(work: str, size: int, workers: int, pool: list[str], distinct: bool) -> tuple[str, dict, float]:
    """The prepared dataset of ``size`` inputs (one a --keep folder holds from an earlier run is reused: its
    preprocess run's figures come from that run), the preprocess run's figures, and the source's writing time."""
    source, output = (os.path.join(work, f"{name}-{size}{'-distinct' * distinct}") for name in ("source", "out"))
    kept = output + ".preprocess.json"
    if os.path.exists(kept) and os.path.exists(os.path.join(output, "manifest.json")):
        with open(kept) as f:
            job, written = json.load(f), 0.0
    else:
        for partial in (source, output):
            shutil.rmtree(partial, ignore_errors=True)
        started = time.perf_counter()
        write_source(source, size, pool, distinct)
        written = time.perf_counter() - started
        job = measure([sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet",
                       "--shorter-side", str(SHORTER_SIDE), "--num-shards", str(-(-size // RECORDS_PER_SHARD)),
                       "--", f"--direct_num_workers={workers}"])
        shutil.rmtree(source, ignore_errors=True)
        with open(kept, "w") as f:
            json.dump(job, f)
    return output, job, written


def run_size(work: str, size: int, workers: int, pool: list[str], distinct: bool = False,
             near: bool = False, rounds: int = 1, keep: bool = False) -> dict:
    output, job, written = prepare(work, size, workers, pool, distinct)
    with open(os.path.join(output, "manifest.json")) as f:
        manifest = json.load(f)
    job["num_shards"] = manifest["splits"]["train"]["num_shards"]
    assert manifest["num_inputs"] == size and manifest["num_examples"] == size - size // REJECT_EVERY, manifest
    validate = [sys.executable, "-m", "shardprep.cli", "validate", output]
    runs = {}
    report_path = os.path.join(work, f"report-{size}.json")
    for round_ in range(1, rounds + 1 if near else 2):
        suffix = f" (round {round_})" if round_ > 1 else ""
        if near:
            runs[f"validate --no-near-duplicates{suffix}"] = measure([*validate, "--no-near-duplicates", "--",
                                                                      f"--direct_num_workers={workers}"])
        runs[f"validate{suffix}"] = measure([*validate, *["--near-duplicates"] * near, "--json", report_path, "--",
                                             f"--direct_num_workers={workers}"])
    with open(report_path) as f:
        near_report = json.load(f).get("near_duplicates")
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    return {"size": size, "source_written_s": written, "preprocess": job, **runs,
            "search": near_report and near_report["search"]}


def report(results: list[dict], workers: int) -> None:
    print(f"\n{platform.platform()}, {os.cpu_count()} cores, {workers} workers, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, load {os.getloadavg()[0]:.1f}\n")
    print("| inputs | shards | command | wall s | CPU s (launcher) | launcher MiB | largest worker MiB | "
          "CPU s per 100k inputs (x smallest) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for name in [name for name in results[0] if name.startswith(("preprocess", "validate"))]:
        base = results[0][name]["cpu_s"] / results[0]["size"]
        for r in results:
            run, size = r[name], r["size"]
            print(f"| {size:,} | {r['preprocess']['num_shards']} | {name} | {run['wall_s']:.0f} | "
                  f"{run['cpu_s']:.0f} ({run['launcher_cpu_s']:.0f}) | {run['launcher'] / MIB:,.0f} | "
                  f"{run['largest_worker'] / MIB:,.0f} | {1e5 * run['cpu_s'] / size:.1f} "
                  f"({run['cpu_s'] / size / base:.2f}) |", flush=True)
    for r in results:
        for name in (name for name in r if name.startswith("validate --no-near-duplicates")):
            without, with_ = r[name], r[name.replace(" --no-near-duplicates", "")]
            print(f"{r['size']:,} inputs{name[len('validate --no-near-duplicates'):]}: validate with the "
                  f"near-duplicate search / without: wall {with_['wall_s'] / without['wall_s']:.2f}x, CPU "
                  f"{with_['cpu_s'] / without['cpu_s']:.2f}x")
        if r.get("search"):
            print(f"{r['size']:,} inputs: search {r['search']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128_000, 256_000, 512_000])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--keep", help="work in this folder and keep each dataset written, reusing one there "
                        "(default: a temporary one, removed)")
    parser.add_argument("--smoke", action="store_true", help="300 inputs, 1 worker")
    parser.add_argument("--distinct", action="store_true", help="every input a picture of its own")
    parser.add_argument("--near-duplicates", action="store_true",
                        help="validate with and without the near-duplicate search")
    parser.add_argument("--rounds", type=int, default=1, help="with --near-duplicates: runs of each, interleaved")
    args = parser.parse_args(argv)
    sizes, workers = ([300], 1) if args.smoke else (args.sizes, args.workers)
    work = args.keep or tempfile.mkdtemp(prefix="shardprep-scale-bench-")
    results = []
    try:
        pool = distinct_jpegs(os.path.join(work, "pool"))
        for size in sizes:
            results.append(run_size(work, size, workers, pool, args.distinct, args.near_duplicates, args.rounds,
                                    bool(args.keep)))
            r = results[-1]
            print(f"{size:,} inputs: preprocess {r['preprocess']['wall_s']:.0f} s ({r['preprocess']['cpu_s']:.0f} CPU s), "
                  f"validate {r['validate']['wall_s']:.0f} s ({r['validate']['cpu_s']:.0f} CPU s) (source written in "
                  f"{r['source_written_s']:.0f} s)", flush=True)
            if args.json_path:
                with open(args.json_path, "w") as f:
                    json.dump({"platform": platform.platform(), "cores": os.cpu_count(), "workers": workers,
                               "results": results}, f, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(results, workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
