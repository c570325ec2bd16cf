"""Peak memory of ``shardprep preprocess parquet:GLOB`` on hostile tables and dataset cards (issue #37, parts 3 and
4): each input at most 10 MB, each run a subprocess whose process tree is sampled with psutil.

    python benchmarks/hostile_table_bench.py [--only NAME ...] [--rows 1000000]

Cases (Parquet files in the Hugging Face Hub's layout, ``hub/data/train-00000-of-00001.parquet``, tiny PNGs):

* ``label 10**12``, ``label 3,000,000``, ``uint64 label 2**64-1``: an integer label far beyond the class limit, no
  class names (before: a MemoryError, a 108 MB manifest, a failed job);
* ``card 5,000-digit number``: a card whose front matter holds a 5,000-digit number, and its class names (a run);
* ``card 100,000 names`` (3 MB, a run) and ``card 10 MB front matter`` (beyond the size bound);
* ``card 100,000-deep``, ``dataset_info.json 100,000-deep``, ``huggingface metadata 100,000-deep``: nesting;
* ``N rows, one row group``: ``--rows`` rows of one repeated image in a single row group (dictionary-encoded, a few
  kilobytes of Parquet), read batch by batch.

Printed per case: the input's bytes, the exit status, the last line the run wrote to stderr (the one clear line),
the wall time, the peak RSS of the largest single process and of the whole tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple

import psutil
from hostile_memory_bench import sampled_run  # the one way both benchmarks sample a process tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
SAMPLE_INTERVAL_S = 0.05
DEEP = 100_000


class Case(NamedTuple):
    name: str
    make: Callable[[str, argparse.Namespace], None]  # writes ROOT/hub/...


class Peaks(NamedTuple):
    status: int
    last_line: str
    wall_s: float
    largest_process: int  # bytes
    tree: int  # bytes


def table(root: str, labels: list[int], kind: str = "int64", metadata: bytes | None = None) -> None:
    import image_factory
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = image_factory.tiny_png()
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    data = pa.table({"image": pa.array([{"bytes": png, "path": f"{i}.png"} for i in range(len(labels))],
                                       type=image_type),
                     "label": pa.array(labels, type=getattr(pa, kind)())})
    if metadata is not None:
        data = data.replace_schema_metadata({"huggingface": metadata})
    os.makedirs(os.path.join(root, "hub", "data"), exist_ok=True)
    pq.write_table(data, os.path.join(root, "hub", "data", "train-00000-of-00001.parquet"))


def card(names=("tench", "goldfish", "shark"), extra: str = "license: other") -> str:
    listed = "".join(f"          '{i}': {name}\n" for i, name in enumerate(names))
    return (f"---\n{extra}\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: label\n"
            f"    dtype:\n      class_label:\n        names:\n{listed}---\n")


def write(path: str, text: str | bytes) -> None:
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def many_rows(root: str, rows: int) -> None:
    import image_factory
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = image_factory.tiny_png()
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": png, "path": "a.png"}], type=image_type).take(pa.array([0] * rows))
    os.makedirs(os.path.join(root, "hub", "data"), exist_ok=True)
    pq.write_table(pa.table({"image": images, "label": pa.array([0] * rows, type=pa.int64())}),
                   os.path.join(root, "hub", "data", "train-00000-of-00001.parquet"), row_group_size=rows)
    write(os.path.join(root, "hub", "README.md"), card(("only",)))


CASES = (
    Case("label 10**12", lambda root, a: table(root, [0, 10 ** 12])),
    Case("label 3,000,000", lambda root, a: table(root, [0, 3_000_000])),
    Case("uint64 label 2**64-1", lambda root, a: table(root, [0, 2 ** 64 - 1], "uint64")),
    Case("card 5,000-digit number", lambda root, a: (table(root, [0, 1, 2]), write(
        os.path.join(root, "hub", "README.md"), card(extra="size_in_bytes: " + "9" * 5000)))),
    Case("card 100,000 names", lambda root, a: (table(root, [0, 1, 2]), write(
        os.path.join(root, "hub", "README.md"), card([f"name{i}" for i in range(100_000)])))),
    Case("card 10 MB front matter", lambda root, a: (table(root, [0, 1]), write(
        os.path.join(root, "hub", "README.md"), card(extra="k: v\n" * 1_900_000)))),
    Case("card 100,000-deep", lambda root, a: (table(root, [0, 1]), write(
        os.path.join(root, "hub", "README.md"), card(extra="x: " + "[" * DEEP + "]" * DEEP)))),
    Case("dataset_info.json 100,000-deep", lambda root, a: (table(root, [0, 1]), write(
        os.path.join(root, "hub", "data", "dataset_info.json"), b"[" * DEEP + b"]" * DEEP))),
    Case("huggingface metadata 100,000-deep", lambda root, a: table(
        root, [0, 1], metadata=b'{"info": ' + b"[" * DEEP + b"]" * DEEP + b"}")),
    Case("N rows, one row group", lambda root, a: many_rows(root, a.rows)),
)


def input_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(os.path.join(root, "hub"))
               for f in files)


def measure(root: str, timeout_s: float) -> Peaks:
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", f"parquet:{root}/hub/data/*.parquet",
               os.path.join(root, "out"), "--quiet", "--shorter-side", "8"]
    run = sampled_run(command, timeout_s)  # --quiet: what it writes is the error line, if any
    lines = run.output.strip().splitlines()
    return Peaks(run.returncode, lines[-1] if lines else "", run.wall_s, largest_process=run.largest, tree=run.tree)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="names of cases to run (default: all)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the one-row-group case")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a run may take before it is killed")
    args = parser.parse_args(argv)
    print(f"# {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB")
    results = {}
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as root:
            case.make(root, args)
            size = input_bytes(root)
            peaks = measure(root, args.timeout)
        results[case.name] = {"input_bytes": size, **peaks._asdict()}
        print(f"{case.name:36} {size / 1e6:6.2f} MB  exit {peaks.status:3}  {peaks.wall_s:6.1f} s  "
              f"largest process {peaks.largest_process / 2**20:6.0f} MiB  tree {peaks.tree / 2**20:6.0f} MiB\n"
              f"    {peaks.last_line[:200]}", flush=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
