"""Peak memory of a local preprocess run against the number of inputs (issue 5: no stage holds the dataset).

    python benchmarks/memory_bench.py [--sizes 2000 20000] [--shorter-sides 16 64] [--records-per-shard 1000]
                                      [--workers 2] [--repeats 1] [--json RESULTS] [--keep DIR]

For each size, writes an ImageFolder of that many small generated PNGs (16-48 px, 10 classes, one split), runs
``shardprep preprocess SRC OUT --shorter-side S --num-shards SIZE/records-per-shard`` as a separate process on
``--workers`` local Beam worker processes, and samples the resident memory (RSS) of the whole process tree -- the
launcher (which on the local runner also holds what crosses a shuffle), the ``/bin/sh`` wrappers and the SDK worker
processes -- every 0.1 s. A fixed number of records per shard keeps the shards alike at every size; a larger
shorter side stores more bytes per input, to tell image bytes from per-input bookkeeping.

Reports per run: wall time, inputs/s, peak RSS of the tree (sum over processes at one sample), of the launcher and of
the largest worker, and the growth per added input between the smallest and the largest size. Shared library pages
count once per process in an RSS sum, so the tree figure overstates what the machine spends, equally at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from shardprep.pipelines.runtime.worker_zygote import WORKER_NAME

SAMPLE_INTERVAL_S = 0.1
CLASSES = tuple(f"class{i:02d}" for i in range(10))
MIB = 2**20


def write_inputs(root: str, num_inputs: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import image_factory

    image_factory.write_image_folder(root, {"train": num_inputs}, classes=CLASSES, min_side=16, max_side=48,
                                     kinds=("png",))


def sample_tree(root: psutil.Process) -> dict[str, int]:
    """RSS of the launcher, of the largest SDK worker, and of the whole tree, at one instant."""
    launcher = largest_worker = total = processes = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            rss = process.memory_info().rss
            command = process.cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        total += rss
        processes += 1
        if process.pid == root.pid:
            launcher = rss
        elif any("sdk_worker_main" in part for part in command) and not command[0].endswith("sh") or \
                process.name() == WORKER_NAME:  # a worker forked by the worker zygote has the launcher's command
            largest_worker = max(largest_worker, rss)
    return {"tree": total, "launcher": launcher, "largest_worker": largest_worker, "processes": processes}


def measure_run(source: str, output: str, workers: int, shorter_side: int, num_shards: int | None) -> dict:
    """Runs the job once and returns its peaks (bytes) and wall time; raises if the job fails."""
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet", "--overwrite",
               "--allow-upscale",  # a larger shorter side stores more bytes per input on purpose
               "--shorter-side", str(shorter_side), *(["--num-shards", str(num_shards)] if num_shards else []),
               "--", f"--direct_num_workers={workers}"]
    peaks = {"tree": 0, "launcher": 0, "largest_worker": 0, "processes": 0}
    samples = 0
    log = tempfile.TemporaryFile()
    started = time.perf_counter()
    job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        root = psutil.Process(job.pid)
        while job.poll() is None:
            sample = sample_tree(root)
            peaks = {name: max(peaks[name], sample[name]) for name in peaks}
            samples += 1
            time.sleep(SAMPLE_INTERVAL_S)
        wall = time.perf_counter() - started
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    if job.returncode != 0:
        log.seek(0)
        raise RuntimeError(f"job failed (exit {job.returncode}):\n{log.read().decode(errors='replace')[-3000:]}")
    with open(os.path.join(output, "manifest.json")) as f:
        manifest = json.load(f)
    return {**peaks, "wall_s": wall, "samples": samples, "num_inputs": manifest["num_inputs"],
            "num_examples": manifest["num_examples"], "num_shards": manifest["splits"]["train"]["num_shards"],
            "record_bytes": sum(s["num_bytes"] for s in manifest["splits"]["train"]["shards"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000], help="numbers of inputs")
    parser.add_argument("--shorter-sides", type=int, nargs="+", default=[16],
                        help="--shorter-side values to run each size with (bigger: more record bytes per input)")
    parser.add_argument("--records-per-shard", type=int, default=1000,
                        help="--num-shards is inputs / this, so the shard one worker writes has the same size at "
                             "every dataset size; 0: the job's default (one shard below 200 MB)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="local Beam worker processes")
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (peaks vary a little run to run)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)

    work = args.keep or tempfile.mkdtemp(prefix="shardprep-memory-bench-")
    results = []
    try:
        for size in args.sizes:
            source = os.path.join(work, f"source-{size}")
            if not os.path.isdir(source):
                started = time.perf_counter()
                write_inputs(source, size)
                print(f"wrote {size:,} inputs in {time.perf_counter() - started:.0f} s", flush=True)
            num_shards = -(-size // args.records_per_shard) if args.records_per_shard else None
            for shorter_side in args.shorter_sides:
                for repeat in range(args.repeats):
                    result = measure_run(source, os.path.join(work, "out"), args.workers, shorter_side, num_shards)
                    assert result["num_inputs"] == result["num_examples"] == size, result
                    results.append({"size": size, "shorter_side": shorter_side, "repeat": repeat, **result})
                    print(f"{size:>7,} inputs, shorter side {shorter_side}, {result['num_shards']} shards: peak tree "
                          f"{result['tree'] / MIB:,.0f} MiB, launcher {result['launcher'] / MIB:,.0f} MiB, largest "
                          f"worker {result['largest_worker'] / MIB:,.0f} MiB; {result['wall_s']:.0f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{platform.platform()}, {os.cpu_count()} cores, {args.workers} workers, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB\n")
    print("| inputs | shorter side | shards | records MiB | wall s | inputs/s | peak tree RSS MiB | peak launcher MiB "
          "| peak largest worker MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['size']:,} | {r['shorter_side']} | {r['num_shards']} | {r['record_bytes'] / MIB:,.1f} | "
              f"{r['wall_s']:.0f} | {r['size'] / r['wall_s']:,.0f} | {r['tree'] / MIB:,.0f} | "
              f"{r['launcher'] / MIB:,.0f} | {r['largest_worker'] / MIB:,.0f} |")
    small, large = min(args.sizes), max(args.sizes)
    for shorter_side in args.shorter_sides if small != large else ():
        def lowest(size, name):
            return min(r[name] for r in results if r["size"] == size and r["shorter_side"] == shorter_side)

        for name in ("tree", "launcher", "largest_worker"):
            growth = lowest(large, name) - lowest(small, name)
            print(f"shorter side {shorter_side}, {name}: {growth / MIB:+,.1f} MiB from {small:,} to {large:,} inputs "
                  f"({growth / (large - small):+,.0f} bytes per added input)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"platform": platform.platform(), "cores": os.cpu_count(), "workers": args.workers,
                       "records_per_shard": args.records_per_shard, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
