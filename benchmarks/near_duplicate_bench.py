"""Near-duplicate detection: what it finds, what it wrongly pairs, and what it costs as the dataset grows.

    .venv/bin/python benchmarks/near_duplicate_bench.py ../shared/data/imagenet-sample [--sides 32,256]
        [--sizes 10000,30000,100000]

1. Precision and recall per kind, at each side (32 px: CIFAR's size; 256 px: ImageNet-like). Each photo of the
   folder is stored as a dataset would hold it (shorter side to SIDE, centre crop); each planted kind of
   ``tests/near_duplicate_images.PLANTED`` (JPEG quality 30/60/90, resized, cropped up to 10%, shifted 1-4 px,
   brightness, contrast, flipped, colour jitter, all at once) is applied to every stored photo. validate's search
   (FindNearDuplicates with its defaults) runs once per kind: train = the photos, test = their copies. Recall: the
   share of copies reported with their own original; precision: the share of reported pairs that are right.
   Hard negatives (``HARD_NEGATIVES``: same background, same object, distinct look-alikes) from photo triples:
   first in train, second in test; every reported pair is wrong. And the photos alone (every pair of distinct
   photos, 19,900 for 200): every pair reported within the split is wrong.
2. Cost as the dataset grows: N generated 32x32 records (distinct textures; 1% planted copies), each size in a child
   process of its own: fingerprinting per record, the search's wall time on the in-process runner (one worker), and
   the child's peak resident memory.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from PIL import Image, ImageEnhance

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from near_duplicate_images import HARD_NEGATIVES, PLANTED  # noqa: E402
from shardprep.pipelines.validate_job.options import default  # noqa: E402
from shardprep.pipelines.validate_job.checks import RecordLocation  # noqa: E402
from shardprep.pipelines.validate_job.near_pairs import NearRecord  # noqa: E402
from shardprep.pipelines.validate_job.near_pairs import thumbnail  # noqa: E402
from shardprep.preprocess.image.perceptual_hash import fingerprint  # noqa: E402

DEFAULT = default("near_duplicate_distance")


def stored(image: Image.Image, side: int) -> Image.Image:
    """``image`` with its shorter side resized to ``side`` (bicubic) and centre-cropped square."""
    scale = side / min(image.size)
    image = image.resize((max(side, round(image.width * scale)), max(side, round(image.height * scale))),
                         Image.Resampling.BICUBIC)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    return image.crop((left, top, left + side, top + side))


def near_record(image: Image.Image, split: str, index: int, name: str) -> NearRecord:
    pixels = np.asarray(image.convert("RGB"))
    return NearRecord(fingerprint(pixels), RecordLocation(split, name, index, f"{split}/{index}"), thumbnail(pixels))


def _row(kind: str, side: int, planted: int, found: dict) -> dict:
    """One table row: right pairs are a test copy reported with the train photo of its own index."""
    pairs = [pair for _, listed in found["pairs"] for pair in listed
             if pair.reference.split != pair.duplicate.split]
    right = sum(pair.reference.index == pair.duplicate.index for pair in pairs)
    within = sum(len(listed) for key, listed in found["pairs"] if key[0] == key[1])
    return {"side": side, "kind": kind, "planted": planted, "reported": len(pairs), "right": right,
            "recall": right / planted if planted else None, "precision": right / len(pairs) if pairs else None,
            "within_split_pairs": within}


def quality(folder: str, side: int) -> list[dict]:
    photos = [stored(Image.open(path).convert("RGB"), side) for path in sorted(glob.glob(os.path.join(folder, "*")))]
    originals = [near_record(photo, "train", i, "photos") for i, photo in enumerate(photos)]
    rows = [_row(f"distinct photos ({len(photos) * (len(photos) - 1) // 2:,} pairs)", side, 0,
                 _search(originals, len(originals)))]
    for kind, change in PLANTED.items():
        copies = [near_record(change(photo), "test", i, kind) for i, photo in enumerate(photos)]
        rows.append(_row(kind, side, len(photos), _search(originals + copies, len(originals) + len(copies))))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for kind, make in HARD_NEGATIVES.items():
        records = []
        for i in range(0, len(photos) - 2, 3):
            first, second = make(*photos[i:i + 3])
            records += [near_record(first, "train", i, kind), near_record(second, "test", i + 1000, kind)]
        rows.append(_row(f"hard negative: {kind}", side, 0, _search(records, len(records))))
    return rows


def _search(records, size: int) -> dict:
    """FindNearDuplicates with validate's defaults on ``records`` in this process (one worker); its outputs read
    back from text files."""
    import pickle
    import tempfile

    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from shardprep.pipelines.validate_job.graph import FindNearDuplicates
    from shardprep.pipelines.validate_job.near_pairs import SearchKeys

    search = SearchKeys.for_records(size, DEFAULT)  # as validate keys a dataset of this many records
    with tempfile.TemporaryDirectory(prefix="near-bench-") as folder:
        with beam.Pipeline(runner=FnApiRunner()) as p:
            found = p | beam.Create(records) | FindNearDuplicates(["train", "test"], DEFAULT, 10, search)
            for name in ("leaked", "pairs", "search"):
                _ = (found[name] | f"Pickle{name}" >> beam.Map(lambda element: pickle.dumps(element).hex())
                     | f"Write{name}" >> beam.io.WriteToText(os.path.join(folder, name), shard_name_template=""))
        out = {}
        for name in ("leaked", "pairs", "search"):
            with open(os.path.join(folder, name)) as f:
                out[name] = [pickle.loads(bytes.fromhex(line.strip())) for line in f if line.strip()]
    out["search"] = {"result": out["search"][0] if out["search"] else None, "tables": search.tables,
                     "key_bits": search.bits, "expected_recall": round(search.recall(DEFAULT), 3)}
    return out


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| px | kind | planted | pairs reported | right | recall | precision |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        reported = row["reported"] + row["within_split_pairs"]
        fmt = lambda value: "—" if value is None else f"{value:.3f}"  # noqa: E731
        lines.append(f"| {row['side']} | {row['kind']} | {row['planted'] or '—'} | {reported} | {row['right']} | "
                     f"{fmt(row['recall'])} | {fmt(row['precision']) if row['planted'] else '—'} |")
    return "\n".join(lines)


def generated(count: int, seed: int = 0) -> np.ndarray:
    """``count`` distinct 32x32 RGB textures (8x8 noise upsampled): photo-like enough to hash apart."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (count, 8, 8, 3), dtype=np.uint8)
    return np.stack([np.asarray(Image.fromarray(s).resize((32, 32), Image.Resampling.BICUBIC)) for s in small])


def scale_child(count: int) -> dict:
    images = generated(count)
    started = time.perf_counter()
    fingerprints = [(fingerprint(image), thumbnail(image)) for image in images]
    hash_s = time.perf_counter() - started
    held = max(1, count // 10)  # test: the last tenth, 1 in 10 of them copies of a train record
    records = []
    for i, (fp, thumb) in enumerate(fingerprints):
        split = "test" if i >= count - held else "train"
        if split == "test" and i % 10 == 0:
            copy = np.asarray(ImageEnhance.Brightness(Image.fromarray(images[i - held])).enhance(1.1))
            fp, thumb = fingerprint(copy), thumbnail(copy)
        records.append(NearRecord(fp, RecordLocation(split, "f", i, f"r{i}"), thumb))
    started = time.perf_counter()
    found = _search(records, len(records))
    search_s = time.perf_counter() - started
    planted = sum(1 for i in range(count - held, count) if i % 10 == 0)
    return {"records": count, "hash_us_per_record": hash_s / count * 1e6, "search_s": search_s,
            "search_us_per_record": search_s / count * 1e6, "peak_rss_mib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024, "planted": planted, "leaked_found": len(found["leaked"]),
            "search": found["search"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", nargs="?")
    parser.add_argument("--sides", default="32,256")
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--child", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(scale_child(args.child)))
        return
    if args.folder:
        rows = [row for side in args.sides.split(",") if side for row in quality(args.folder, int(side))]
        print(table(rows), flush=True)
    for size in [int(s) for s in args.sizes.split(",") if s]:
        child = subprocess.run([sys.executable, __file__, "--child", str(size)], capture_output=True, text=True,
                               check=True)
        print(child.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
