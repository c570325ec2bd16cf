"""Resuming a killed preprocess run: the resumed run's wall time against a full run's, side by side.

    python benchmarks/preprocess_resume_bench.py ../shared/data/imagenet-sample [--copies 100] [--workers 2]
                                                 [--kill-at 0.7]

The ImageNet sample is replicated as in preprocess_bench.py (hard links, one ImageFolder tree). In one run: the job
uninterrupted (``shardprep preprocess SRC OUT --quiet -- --direct_num_workers=N``, defaults: raw centre crops 256);
then the same job into a new OUTPUT, killed with SIGKILL (its whole process group) once ``--kill-at`` of its decode
groups are recorded in OUTPUT/.tmp/journal.jsonl; then ``--resume`` on it. Prints the three wall times, the resumed
run's ``resumed: K of N decode groups kept`` line, the ratio resumed / full (the target is <= 0.40) and whether the
resumed run's shards and manifest equal the full run's (SOURCE_DATE_EPOCH is set for all runs, so ``created`` does
too; the manifests differ only in ``options.output``, the OUTPUT argument).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from preprocess_bench import replicate  # noqa: E402 - the same replicated tree as the throughput benchmark

from shardprep.preprocess.format import sharding  # noqa: E402


def job_command(source: str, output: str, workers: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "shardprep.cli", "preprocess", source, output, "--quiet", *options, "--",
            f"--direct_num_workers={workers}"]


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    completed = subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, completed.stdout


def killed_at(command: list[str], journal: str, units: int) -> float:
    """Runs ``command`` until ``journal`` records ``units`` decode groups, then kills its process group."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while process.poll() is None:
            if os.path.exists(journal):
                with open(journal, "rb") as f:
                    if f.read().count(b"\n") - 1 >= units:
                        break
            time.sleep(0.05)
        else:
            raise SystemExit(f"the job ended (exit {process.returncode}) before {units} groups were recorded")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return time.perf_counter() - started


def decode_groups(manifest: dict, workers: int) -> int:
    """The number of decode groups of the run (raw centre crops: predicted from the record layout)."""
    total = 0
    for info in manifest["splits"].values():
        layout = info["record_layout"]
        total += sharding.decode_groups(info["num_inputs"], info["num_inputs"] * layout["record_bytes"], None,
                                        2 * workers)
    return total


def dataset(manifest_path: str) -> dict:
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["options"].pop("output")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_dir")
    parser.add_argument("--copies", type=int, default=100, help="replicas of each image (default 100: 20,000)")
    parser.add_argument("--workers", type=int, default=2, help="local job workers (default 2)")
    parser.add_argument("--kill-at", type=float, default=0.7, help="share of decode groups done at the kill")
    args = parser.parse_args(argv)

    os.environ["SOURCE_DATE_EPOCH"] = "1700000000"
    work = tempfile.mkdtemp(prefix="shardprep-resume-bench-")
    try:
        source = os.path.join(work, "src")
        paths = replicate(args.source_dir, source, args.copies)
        full_out, resumed_out = os.path.join(work, "full"), os.path.join(work, "resumed")
        full_seconds, _ = timed(job_command(source, full_out, args.workers))
        full = dataset(os.path.join(full_out, "manifest.json"))
        groups = decode_groups(full, args.workers)
        units = math.ceil(args.kill_at * groups)
        kill_seconds = killed_at(job_command(source, resumed_out, args.workers),
                                 os.path.join(resumed_out, ".tmp", "journal.jsonl"), units)
        resumed_seconds, said = timed(job_command(source, resumed_out, args.workers, "--resume"))
        resumed_line = next(line for line in said.splitlines() if line.startswith("resumed:"))
        identical = dataset(os.path.join(resumed_out, "manifest.json")) == full and all(
            _same_file(os.path.join(full_out, shard["file"]), os.path.join(resumed_out, shard["file"]))
            for info in full["splits"].values() for shard in info["shards"])
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"inputs: {len(paths)} ({args.copies} copies of the images in {args.source_dir}), {groups} decode "
              f"groups, {args.workers} workers")
        print(f"full run:     {full_seconds:6.1f} s")
        print(f"killed run:   {kill_seconds:6.1f} s until SIGKILL at {units} of {groups} groups recorded")
        print(f"resumed run:  {resumed_seconds:6.1f} s  ({resumed_line})")
        print(f"ratio resumed / full: {resumed_seconds / full_seconds:.2f}  (target <= 0.40); "
              f"shards and manifest identical to the full run's: {identical}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _same_file(a: str, b: str) -> bool:
    with open(a, "rb") as f, open(b, "rb") as g:
        while True:
            x, y = f.read(1 << 20), g.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


if __name__ == "__main__":
    sys.exit(main())
