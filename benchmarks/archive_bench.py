"""ImageNet as downloaded, read in place against extracted first: a tar of per-class tars (ImageNet's train tar),
and the same images as a .tgz and a .zip, each run as ``shardprep preprocess`` side by side in one run of this script.

    python benchmarks/archive_bench.py ../shared/data/imagenet-sample [--classes 100] [--per-class 20] [--rounds 1]

The photos of SOURCE_DIR are repeated into ``--classes`` classes of ``--per-class`` images each (names
``nXXXXXXXX_N.JPEG``) and written as: ``train.tar``, a tar of per-class tars ``nXXXXXXXX.tar`` (image-net.org's
shape); ``imagenet.tgz`` (gzip, ``imagenet/train/<class>/<file>``, Imagenette's shape); and ``imagenet.zip`` (stored,
the same paths). Each round runs, in turn:

* ``in place, tar of tars``: ``shardprep preprocess train.tar OUT``;
* ``extract, then folder``: ``tar -xf train.tar`` then ``tar -xf`` of each class tar into its folder (as the usual
  ImageNet recipe does), the class tars deleted, then ``shardprep preprocess`` of the folder; timed together;
* ``in place, .tgz`` and ``in place, .zip``.

Every job runs with the same options (raw, centre crop 256, ``--quiet``, ``-- --direct_num_workers=N``). Printed:
wall time of each (start-up included), images/s, the ratio to ``extract, then folder``, and the disk each needs
beyond the archive and the output (the extracted folder's bytes for the extracting route, none in place); plus the
time ``plan_source`` alone takes per archive kind (the launcher's index: headers of the outer tar, a zip's central
directory, a .tgz decompressed once for its names). The shards of every route are checked equal.
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
import tarfile
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDPREP = [sys.executable, "-c", "from shardprep.cli import main; main()"]


def photos(source_dir: str, classes: int, per_class: int) -> dict[str, dict[str, str]]:
    """{class: {file name: photo path}}: the sample's photos dealt round-robin into ``classes`` synthetic WNIDs."""
    names = sorted(f for f in os.listdir(source_dir) if not f.startswith("."))
    dealt: dict[str, dict[str, str]] = {}
    for c in range(classes):
        wnid = f"n{1440764 + c:08d}"
        dealt[wnid] = {f"{wnid}_{i}.JPEG": os.path.join(source_dir, names[(c * per_class + i) % len(names)])
                       for i in range(per_class)}
    return dealt


def write_archives(root: str, dealt) -> None:
    with tarfile.open(os.path.join(root, "train.tar"), "w", format=tarfile.GNU_FORMAT) as outer:
        for wnid, files in dealt.items():
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for name, path in files.items():
                    tar.add(path, arcname=name)
            info = tarfile.TarInfo(f"{wnid}.tar")
            info.size = len(inner.getvalue())
            outer.addfile(info, io.BytesIO(inner.getvalue()))
    with tarfile.open(os.path.join(root, "imagenet.tgz"), "w:gz") as tgz, \
            zipfile.ZipFile(os.path.join(root, "imagenet.zip"), "w", zipfile.ZIP_STORED) as archive:
        for wnid, files in dealt.items():
            for name, path in files.items():
                tgz.add(path, arcname=f"imagenet/train/{wnid}/{name}")
                archive.write(path, f"imagenet/train/{wnid}/{name}")


def folder_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def preprocess(source: str, output: str, workers: int) -> float:
    started = time.perf_counter()
    subprocess.run(SHARDPREP + ["preprocess", source, output, "--quiet", "--", f"--direct_num_workers={workers}"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def extract_then_preprocess(root: str, output: str, workers: int) -> tuple[float, float, int]:
    """(wall time of extracting the tar of tars and preprocessing the folder, of extracting alone, the extracted
    folder's bytes)."""
    started = time.perf_counter()
    folder = extract(root)
    extracted = folder_bytes(folder)
    extracting = time.perf_counter() - started
    seconds = extracting + preprocess(folder, output, workers)
    shutil.rmtree(os.path.join(root, "extracted"))
    return seconds, extracting, extracted


def read_seconds(root: str) -> dict[str, float]:
    """Seconds to get every image's bytes the way the job does, one process, no decoding: each archive kind against
    the extracted folder (the archives and the folder just written, so in the page cache alike)."""
    from shardprep.preprocess.sources import archive_index

    def tar_of_tars() -> int:
        total = 0
        with open(os.path.join(root, "train.tar"), "rb") as raw:
            for outer in archive_index.index_tar(raw).members:
                for member in archive_index.index_tar(raw, outer.offset, outer.size).members:
                    total += len(archive_index.read_member(raw, archive_index.MemberRef.of("", member)))
        return total

    def zip_ranges() -> int:
        with open(os.path.join(root, "imagenet.zip"), "rb") as raw:
            return sum(len(archive_index.read_member(raw, archive_index.MemberRef.of("", member)))
                       for member in archive_index.index_zip(raw).members if not member.is_dir)

    def tgz_stream() -> int:
        with open(os.path.join(root, "imagenet.tgz"), "rb") as raw:
            return sum(len(streamed.data or b"") for streamed in archive_index.stream_tar(raw))

    def folder_files() -> int:
        total = 0
        for folder, _, files in os.walk(os.path.join(root, "extracted")):
            for name in files:
                with open(os.path.join(folder, name), "rb") as f:
                    total += len(f.read())
        return total

    extract(root)
    seconds = {}
    for name, read in (("folder", folder_files), ("tar of tars", tar_of_tars), ("zip", zip_ranges),
                       (".tgz", tgz_stream)):
        started = time.perf_counter()
        read_bytes = read()
        seconds[name] = time.perf_counter() - started
        seconds[name + " MB"] = read_bytes / 1e6
    shutil.rmtree(os.path.join(root, "extracted"))
    return seconds


def extract(root: str) -> str:
    """The tar of tars extracted as the usual ImageNet recipe does; the folder."""
    folder = os.path.join(root, "extracted", "train")
    os.makedirs(folder)
    subprocess.run(["tar", "-xf", os.path.join(root, "train.tar"), "-C", folder], check=True)
    for name in sorted(os.listdir(folder)):
        class_folder = os.path.join(folder, name[:-len(".tar")])
        os.makedirs(class_folder)
        subprocess.run(["tar", "-xf", os.path.join(folder, name), "-C", class_folder], check=True)
        os.remove(os.path.join(folder, name))
    return folder


def plan_seconds(source: str) -> float:
    from shardprep.pipelines.sources.registry import plan_source
    from shardprep.preprocess.format.config import PreprocessConfig

    started = time.perf_counter()
    plan_source(PreprocessConfig(source=source, output=source + ".plan-out"))
    return time.perf_counter() - started


def shard_hashes(output: str) -> dict[str, str]:
    with open(os.path.join(output, "manifest.json")) as f:
        document = json.load(f)
    return {s["file"]: s["sha256"] for split in document["splits"].values() for s in split["shards"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_dir")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--read-only", action="store_true", help="only the reading costs, no preprocess jobs")
    args = parser.parse_args()
    images = args.classes * args.per_class
    root = tempfile.mkdtemp(prefix="archive-bench-")
    try:
        write_archives(root, photos(args.source_dir, args.classes, args.per_class))
        sizes = {name: os.path.getsize(os.path.join(root, name)) for name in ("train.tar", "imagenet.tgz",
                                                                              "imagenet.zip")}
        plans = {name: plan_seconds(os.path.join(root, name)) for name in sizes}
        for round_index in range(max(args.rounds, 3)):
            reads = read_seconds(root)
            print("reading every image's bytes, one process (s): " + ", ".join(
                f"{name} {reads[name]:.2f} ({reads[name + ' MB'] / reads[name]:.0f} MB/s)"
                for name in ("folder", "tar of tars", "zip", ".tgz")), flush=True)
        if args.read_only:
            return
        results: dict[str, list[float]] = {}
        extracted_bytes, extracting = 0, []
        for round_index in range(args.rounds):
            out = os.path.join(root, f"out-{round_index}")
            results.setdefault("in place, tar of tars", []).append(
                preprocess(os.path.join(root, "train.tar"), out + "-tar", args.workers))
            seconds, extract_seconds, extracted_bytes = extract_then_preprocess(root, out + "-folder", args.workers)
            results.setdefault("extract, then folder", []).append(seconds)
            extracting.append(extract_seconds)
            results.setdefault("in place, .tgz", []).append(
                preprocess(os.path.join(root, "imagenet.tgz"), out + "-tgz", args.workers))
            results.setdefault("in place, .zip", []).append(
                preprocess(os.path.join(root, "imagenet.zip"), out + "-zip", args.workers))
            hashes = [shard_hashes(out + suffix) for suffix in ("-tar", "-folder")]
            assert hashes[0] == hashes[1], "the tar of tars and the extracted folder gave different shards"
            assert shard_hashes(out + "-tgz") == shard_hashes(out + "-zip"), "the .tgz and the .zip differ"
            for suffix in ("-tar", "-folder", "-tgz", "-zip"):
                shutil.rmtree(out + suffix)
        print(f"{images:,} images ({args.classes} classes x {args.per_class}), {args.workers} workers, "
              f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}")
        print(f"archives: " + ", ".join(f"{name} {size / 1e6:.1f} MB (plan {plans[name]:.2f} s)"
                                        for name, size in sizes.items()))
        print("extracting alone (tar -xf, then each class tar): " + ", ".join(f"{t:.1f} s" for t in extracting))
        best_folder = min(results["extract, then folder"])
        print(f"{'route':<24}{'wall s (each round)':>26}{'images/s':>10}{'x extract':>11}{'extra disk MB':>15}")
        for route, times in results.items():
            extra = extracted_bytes if route.startswith("extract") else 0
            print(f"{route:<24}{', '.join(f'{t:.1f}' for t in times):>26}{images / min(times):>10.1f}"
                  f"{best_folder / min(times):>11.2f}{extra / 1e6:>15.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
