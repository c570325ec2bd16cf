"""Peak memory of ``shardprep preprocess`` on hostile archives of at most 10 MB (issue 37: every process stays under
1 GB and the run ends in one clear line).

    python benchmarks/hostile_memory_bench.py [--gib 1] [--workers 2] [--only NAME ...] [--keep DIR]

Builds each archive in a temporary folder (a few seconds each), then runs ``shardprep preprocess ARCHIVE OUT
--shorter-side 8`` as a separate process and samples the resident memory (RSS) of every process of its tree every
0.05 s. Reports per archive: its size, the peak RSS of the largest single process and of the whole tree, the wall
time, the exit status and the run's last line (its ``Error:`` line, or the manifest's).

The archives (``--gib``: how many GiB the bombs inflate to):

* ``zip-bomb``: two images and a member of GiB of zeros, deflated (its central directory honest);
* ``zip-lying``: the same member (at most 2 GiB) with its recorded size lowered to 1,000 bytes;
* ``zip-many``: thousands of 1 MiB members of zeros named ``.jpg`` (each under the ratio floor);
* ``tgz-bomb``: a gzip-compressed tar holding a member of GiB of zeros;
* ``tgz-many``: a gzip-compressed tar of thousands of 1 MiB members of zeros named ``.jpg``;
* ``labels-bomb``: a zip of one image and a labels CSV of GiB of rows, given as ``ZIP/val --labels-file ZIP/labels.csv``.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from typing import NamedTuple

import psutil

MIB = 1 << 20
SAMPLE_INTERVAL_S = 0.05


def _jpeg(index: int) -> bytes:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import image_factory

    return image_factory.rgb_jpeg((image_factory.RED, image_factory.BLUE)[index % 2], width=12 + index, height=10)


def _zeros_member(archive: zipfile.ZipFile, name: str, size: int) -> None:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with archive.open(info, "w", force_zip64=size >= (1 << 31)) as member:
        chunk = b"\0" * MIB
        for _ in range(size // MIB):
            member.write(chunk)


def _deflated_zip(path: str, members: dict[str, bytes | int]) -> None:
    """A zip of ``members``: bytes as they are, an int as that many zeros, deflated."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in members.items():
            if isinstance(data, int):
                _zeros_member(archive, name, data)
            else:
                archive.writestr(name, data)


def zip_bomb(path: str, size: int) -> None:
    _deflated_zip(path, {"cat/a.jpg": _jpeg(0), "dog/b.jpg": _jpeg(1), "cat/bomb.jpg": size})


def zip_lying(path: str, size: int) -> None:
    """The bomb with its uncompressed size lowered to 1,000 in the local header and the central directory (at most
    2 GiB: past that zip64's extra fields hold the sizes)."""
    zip_bomb(path, min(size, (1 << 31) - MIB))
    data = bytearray(open(path, "rb").read())
    for signature, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            name_length = struct.unpack("<H", data[start + at + 4:start + at + 6])[0] if signature == b"PK\x03\x04" \
                else struct.unpack("<H", data[start + 28:start + 30])[0]
            name_at = start + (30 if signature == b"PK\x03\x04" else 46)
            if data[name_at:name_at + name_length] == b"cat/bomb.jpg":
                data[start + at:start + at + 4] = struct.pack("<I", 1000)
            start += 4
    open(path, "wb").write(bytes(data))


def zip_many(path: str, size: int) -> None:
    _deflated_zip(path, {"cat/a.jpg": _jpeg(0), "dog/b.jpg": _jpeg(1),
                         **{f"cat/zeros{i:05d}.jpg": MIB for i in range(size // MIB)}})


def _tgz(path: str, members: dict[str, bytes | int]) -> None:
    class Zeros(io.RawIOBase):
        def __init__(self, size: int):
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            count = min(len(buffer), self.left)
            buffer[:count] = b"\0" * count
            self.left -= count
            return count

    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, Zeros(data) if isinstance(data, int) else io.BytesIO(data))


def tgz_bomb(path: str, size: int) -> None:
    _tgz(path, {"cat/a.jpg": _jpeg(0), "cat/bomb.jpg": size, "dog/b.jpg": _jpeg(1)})


def tgz_many(path: str, size: int) -> None:
    _tgz(path, {"cat/a.jpg": _jpeg(0), "dog/b.jpg": _jpeg(1),
                **{f"cat/zeros{i:05d}.jpg": MIB for i in range(size // MIB)}})


def labels_bomb(path: str, size: int) -> None:
    row = b"a.jpg,cat\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("val/a.jpg", _jpeg(0))
        with archive.open("labels.csv", "w", force_zip64=size >= (1 << 31)) as member:
            chunk = row * (MIB // len(row))
            for _ in range(size // len(chunk)):
                member.write(chunk)


ARCHIVES = {"zip-bomb": ("bomb.zip", zip_bomb), "zip-lying": ("lying.zip", zip_lying),
            "zip-many": ("many.zip", zip_many), "tgz-bomb": ("bomb.tgz", tgz_bomb),
            "tgz-many": ("many.tgz", tgz_many), "labels-bomb": ("labels.zip", labels_bomb)}


def peaks(root: psutil.Process) -> tuple[int, int]:
    """(the largest single process's RSS, the tree's sum) at one instant."""
    largest = total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            rss = process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        largest, total = max(largest, rss), total + rss
    return largest, total


class SampledRun(NamedTuple):
    """A command run to its end (or its time limit) with its process tree's peak memory sampled."""

    returncode: int | None
    largest: int  # the largest single process's peak RSS
    tree: int  # the tree's peak summed RSS
    wall_s: float
    output: str  # what it wrote (stdout and stderr together)


def sampled_run(command: list[str], timeout_s: float | None = None) -> SampledRun:
    """Runs ``command`` in a session of its own, sampling ``peaks`` every SAMPLE_INTERVAL_S; killed past
    ``timeout_s``."""
    log = tempfile.TemporaryFile()
    started = time.perf_counter()
    job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    largest = total = 0
    try:
        root = psutil.Process(job.pid)
        while job.poll() is None and (timeout_s is None or time.perf_counter() - started < timeout_s):
            one, tree = peaks(root)
            largest, total = max(largest, one), max(total, tree)
            time.sleep(SAMPLE_INTERVAL_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    log.seek(0)
    return SampledRun(job.returncode, largest, total, time.perf_counter() - started,
                      log.read().decode(errors="replace"))


def measure(args: list[str], workers: int) -> dict:
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", *args, "--shorter-side", "8", "--overwrite",
               "--", f"--direct_num_workers={workers}"]
    run = sampled_run(command)
    lines = [line for line in run.output.splitlines() if line.strip()]
    error = [line for line in lines if line.startswith("Error:")]
    at = next((i for i, line in enumerate(lines) if line.startswith("rejected by reason")), len(lines))
    reasons = "; ".join(line.strip() for line in lines[at + 1:] if line.startswith("  "))  # the summary's reasons
    return {"exit": run.returncode, "largest": run.largest, "tree": run.tree, "wall_s": run.wall_s,
            "last": (error or [f"rejected: {reasons}"] if reasons else lines or [""])[-1].strip(),
            "tracebacks": sum("Traceback" in line for line in lines)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="GiB the bombs inflate to")
    parser.add_argument("--workers", type=int, default=2, help="local Beam worker processes")
    parser.add_argument("--only", nargs="+", choices=sorted(ARCHIVES), default=sorted(ARCHIVES))
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="shardprep-hostile-bench-")
    os.makedirs(work, exist_ok=True)
    size = int(args.gib * (1 << 30))
    rows = []
    try:
        for name in args.only:
            file_name, build = ARCHIVES[name]
            path = os.path.join(work, file_name)
            if not os.path.exists(path):
                build(path, size)
            source = [f"{path}/val", "--labels-file", f"{path}/labels.csv"] if name == "labels-bomb" else [path]
            result = measure([*source, os.path.join(work, f"out-{name}")], args.workers)
            inflates = min(size, (1 << 31) - MIB) if name == "zip-lying" else size
            rows.append((name, os.path.getsize(path), inflates, result))
            print(f"{name}: {os.path.getsize(path) / MIB:.1f} MB, largest process {result['largest'] / MIB:,.0f} MiB, "
                  f"tree {result['tree'] / MIB:,.0f} MiB, {result['wall_s']:.1f} s, exit {result['exit']}: "
                  f"{result['last']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| archive | MB | inflates to | largest process MiB | tree MiB | s | exit | last line |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, archive_bytes, inflates, r in rows:
        print(f"| {name} | {archive_bytes / 1e6:.1f} | {inflates / (1 << 30):.1f} GiB | {r['largest'] / MIB:,.0f} | "
              f"{r['tree'] / MIB:,.0f} | {r['wall_s']:.1f} | {r['exit']} | {r['last']} |")
    return 0 if all(r["largest"] < (1 << 30) and not r["tracebacks"] for *_, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
