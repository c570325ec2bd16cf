"""The same images read three ways: a ``parquet:`` source (the Hugging Face Hub's layout), a folder, and
``tfrecord:`` files, each run as ``shardprep preprocess`` in one process of this script, side by side.

    python benchmarks/parquet_bench.py ../shared/data/imagenet-sample [--copies 10] [--workers N] [--rounds 2]

The photos of SOURCE_DIR are repeated ``--copies`` times (class: the synset before the first '_' of the name) and
written as: an ImageFolder tree (hard links), Parquet files ``data/train-NNNNN-of-NNNNN.parquet`` (image struct
``{bytes, path}``, int label, 100 rows per row group as the ``datasets`` library writes them, a dataset card with
the class names), and TFDS-style TFRecords ``bench-train.tfrecord-NNNNN-of-NNNNN`` (the same number of files as the
Parquet source). Every job runs with the same options (raw, centre crop 256, ``--quiet``, N local workers);
``--rounds`` runs the three in turn that many times, so the machine's drift falls on all of them. Prints images/s
of each (wall time of the command, start-up included) and the ratios to the folder.
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

ROWS_PER_GROUP = 100  # the datasets library's row group size for image datasets
FILES = 4


def photos(source_dir: str, copies: int) -> list[tuple[str, str]]:
    """(path, class) of every photo, ``copies`` times."""
    names = sorted(f for f in os.listdir(source_dir) if not f.startswith("."))
    return [(os.path.join(source_dir, name), name.split("_", 1)[0]) for _ in range(copies) for name in names]


def write_folder(root: str, items) -> None:
    for index, (path, class_name) in enumerate(items):
        folder = os.path.join(root, "train", class_name)
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, f"{index:06d}_{os.path.basename(path)}")
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)


def write_parquet(root: str, items, classes) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(root, "data"))
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for n in range(FILES):
        part = items[n::FILES]
        images = [{"bytes": open(path, "rb").read(), "path": os.path.basename(path)} for path, _ in part]
        table = pa.table({"image": pa.array(images, type=image_type),
                          "label": pa.array([classes.index(c) for _, c in part], type=pa.int64())})
        pq.write_table(table, os.path.join(root, "data", f"train-{n:05d}-of-{FILES:05d}.parquet"),
                       row_group_size=ROWS_PER_GROUP)
    names = "".join(f"          '{i}': {name}\n" for i, name in enumerate(classes))
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write("---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: label\n    dtype:\n"
                f"      class_label:\n        names:\n{names}---\n")


def write_tfrecords(root: str, items, classes) -> None:
    from shardprep.preprocess.format import record_format, tfrecord_io

    os.makedirs(root)
    for n in range(FILES):
        with open(os.path.join(root, f"bench-train.tfrecord-{n:05d}-of-{FILES:05d}"), "wb") as f:
            for path, class_name in items[n::FILES]:
                record = record_format.ImageRecord(encoded=open(path, "rb").read(), format="jpeg", height=1,
                                                   width=1, label=classes.index(class_name),
                                                   filename=os.path.basename(path))
                f.write(tfrecord_io.frame(record_format.encode_example(record)))
    with open(os.path.join(root, "label.labels.txt"), "w") as f:
        f.write("".join(f"{name}\n" for name in classes))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_dir")
    parser.add_argument("--copies", type=int, default=10, help="repeats of each photo (default 10: 2,000 inputs)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="local job workers (default: cores)")
    parser.add_argument("--rounds", type=int, default=2, help="times the three jobs run, in turn")
    args = parser.parse_args(argv)

    items = photos(args.source_dir, args.copies)
    classes = sorted({c for _, c in items})
    work = tempfile.mkdtemp(prefix="shardprep-parquet-bench-")
    try:
        write_folder(os.path.join(work, "folder"), items)
        write_parquet(os.path.join(work, "hub"), items, classes)
        write_tfrecords(os.path.join(work, "tfr"), items, classes)
        sources = {"folder": [os.path.join(work, "folder")],
                   "parquet": [f"parquet:{work}/hub/data/*.parquet"],
                   "tfrecord": [f"tfrecord:{work}/tfr/*.tfrecord-*", "--image-key", "image/encoded",
                                "--label-key", "image/class/label"]}
        rates: dict[str, list[float]] = {name: [] for name in sources}
        for round_ in range(args.rounds):
            for name, source in sources.items():
                output = os.path.join(work, f"out-{name}-{round_}")
                command = [sys.executable, "-m", "shardprep.cli", "preprocess", source[0], output, *source[1:],
                           "--quiet", "--", f"--direct_num_workers={args.workers}"]
                started = time.perf_counter()
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                rates[name].append(len(items) / (time.perf_counter() - started))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print(f"inputs: {len(items)} ({args.copies} copies of {len(items) // args.copies} photos from "
              f"{args.source_dir}), {args.workers} workers, {args.rounds} rounds")
        folder = max(rates["folder"])
        for name, found in rates.items():
            runs = ", ".join(f"{r:.1f}" for r in found)
            print(f"{name:9s} best {max(found):7.1f} images/s (runs: {runs})  "
                  f"ratio to folder {max(found) / folder:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
