"""Near-duplicate detection: what it finds, what it wrongly pairs, and what it costs as the dataset grows.

    .venv/bin/python benchmarks/near_duplicate_bench.py ../shared/data/imagenet-sample [--sizes 10000,30000,100000]

1. Recall on planted copies. Each photo of the folder is stored as preprocess stores it (shorter side 128, centre
   crop, raw), and so is each changed copy of it (JPEG quality 30, rescaled 0.5 and 0.8, cropped 2% and 4% of each
   side, shifted 2% and 3%, brightness +/-10%, contrast -10%, flipped, and all of rescale 0.6 + 1% crop + brightness
   + JPEG 40 at once). Per change: the share of copies within 6, 8, 10 and 12 bits of their original; and the share
   validate's search (FindNearDuplicates, train = the originals, validation = every copy) flags, with its default
   threshold, and any pair it lists between different photos.
2. False pairs: every pair of distinct photos of the folder (19,900 for 200) within 6..14 bits.
3. Cost as the dataset grows: N generated 32x32 records (distinct textures; 1% planted copies), each size in a child
   process of its own: fingerprinting per record, the search's wall time on the in-process runner (one worker), and
   the child's peak resident memory.
"""

from __future__ import annotations

import argparse
import glob
import io
import itertools
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from PIL import Image, ImageEnhance

from shardprep.preprocess import encodings, image_ops
from shardprep.preprocess.perceptual_hash import distance, fingerprint

THRESHOLDS = (6, 8, 10, 12)
DEFAULT = 10


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def _crop(image: Image.Image, fraction: float) -> Image.Image:
    w, h = image.size
    return image.crop((round(w * fraction), round(h * fraction), w - round(w * fraction), h - round(h * fraction)))


def _shift(image: Image.Image, fraction: float) -> Image.Image:
    array = np.asarray(image)
    pixels = max(1, round(array.shape[1] * fraction))
    return Image.fromarray(np.concatenate([np.repeat(array[:, :1], pixels, axis=1), array[:, :-pixels]], axis=1))


def _scale(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)), Image.Resampling.BILINEAR)


CHANGES = {
    "JPEG quality 30": lambda im: _jpeg(im, 30),
    "rescaled 0.5x": lambda im: _scale(im, 0.5),
    "rescaled 0.8x": lambda im: _scale(im, 0.8),
    "cropped 2% a side": lambda im: _crop(im, 0.02),
    "cropped 4% a side": lambda im: _crop(im, 0.04),
    "shifted 2%": lambda im: _shift(im, 0.02),
    "shifted 3%": lambda im: _shift(im, 0.03),
    "brightness +10%": lambda im: ImageEnhance.Brightness(im).enhance(1.1),
    "brightness -10%": lambda im: ImageEnhance.Brightness(im).enhance(0.9),
    "contrast -10%": lambda im: ImageEnhance.Contrast(im).enhance(0.9),
    "flipped": lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
    "all at once": lambda im: _jpeg(ImageEnhance.Brightness(_crop(_scale(im, 0.6), 0.01)).enhance(1.1), 40),
}


def stored(image: Image.Image) -> np.ndarray:
    """The pixels preprocess would store for ``image`` (shorter side 128, centre crop, raw)."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    options = image_ops.ProcessOptions(shorter_side=128)
    done = image_ops.process_image(buffer.getvalue(), options)
    return encodings.get(options.encoding).decode(done.encoded, done.height, done.width)


def quality(folder: str) -> dict:
    from shardprep.pipelines.validation.elements import RecordLocation

    photos = [Image.open(path).convert("RGB") for path in sorted(glob.glob(os.path.join(folder, "*")))]
    originals = [fingerprint(stored(photo)) for photo in photos]
    records = [(fp, RecordLocation("train", "t", i, f"photo_{i}")) for i, fp in enumerate(originals)]
    distances: dict[str, list[int]] = {}
    for name, change in CHANGES.items():
        for i, photo in enumerate(photos):
            copy = fingerprint(stored(change(photo)))
            distances.setdefault(name, []).append(distance(originals[i], copy))
            records.append((copy, RecordLocation("validation", name, i, f"{name}/photo_{i}")))
    found = _search(records, len(records))
    flagged = {(location.file, location.index) for location in found["leaked"]}
    per_change = {name: {"within": {t: float(np.mean(np.array(d) <= t)) for t in THRESHOLDS},
                         "max": int(max(d)), "searched_recall": sum((name, i) in flagged for i in range(len(photos)))
                         / len(photos)} for name, d in distances.items()}
    wrong = [pair for pair in found["pairs"] if pair.reference.index != pair.duplicate.index]
    all_pairs = np.array([distance(a, b) for a, b in itertools.combinations(originals, 2)])
    return {"photos": len(photos), "per_change": per_change, "wrong_pairs_listed": len(wrong),
            "distinct_pairs": int(all_pairs.size), "closest_distinct": int(all_pairs.min()),
            "false_pairs": {t: int((all_pairs <= t).sum()) for t in (6, 8, 10, 12, 14)},
            "search": found["search"]}


def _search(records, pairs_listed: int) -> dict:
    """FindNearDuplicates on ``records`` in this process (one worker); its outputs read back from text files."""
    import pickle
    import tempfile

    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from shardprep.pipelines.near_duplicates import FindNearDuplicates
    from shardprep.pipelines.validation.near_pairs import SearchKeys

    search = SearchKeys.for_records(len(records), DEFAULT)  # as validate keys a dataset of this many records
    with tempfile.TemporaryDirectory(prefix="near-bench-") as folder:
        with beam.Pipeline(runner=FnApiRunner()) as p:
            found = p | beam.Create(records) | FindNearDuplicates(["train", "validation"], DEFAULT, pairs_listed,
                                                                    search)
            for name in ("leaked", "pairs", "search"):
                _ = (found[name] | f"Pickle{name}" >> beam.Map(lambda element: pickle.dumps(element).hex())
                     | f"Write{name}" >> beam.io.WriteToText(os.path.join(folder, name), shard_name_template=""))
        out = {}
        for name in ("leaked", "pairs", "search"):
            with open(os.path.join(folder, name)) as f:
                out[name] = [pickle.loads(bytes.fromhex(line.strip())) for line in f if line.strip()]
    out["pairs"] = [pair for _, pairs in out["pairs"] for pair in pairs]
    out["search"] = {"result": out["search"][0] if out["search"] else None, "tables": search.tables,
                     "key_bits": search.bits, "expected_recall_at_10": round(search.recall(DEFAULT), 3)}
    return out


def generated(count: int, seed: int = 0) -> np.ndarray:
    """``count`` distinct 32x32 RGB textures (8x8 noise upsampled): photo-like enough to hash apart."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (count, 8, 8, 3), dtype=np.uint8)
    return np.stack([np.asarray(Image.fromarray(s).resize((32, 32), Image.Resampling.BICUBIC)) for s in small])


def scale_child(count: int) -> dict:
    from shardprep.pipelines.validation.elements import RecordLocation

    images = generated(count)
    started = time.perf_counter()
    fingerprints = [fingerprint(image) for image in images]
    hash_s = time.perf_counter() - started
    held = max(1, count // 10)  # validation: the last tenth, 1 in 10 of them copies of a train record
    records = []
    for i, fp in enumerate(fingerprints):
        split = "validation" if i >= count - held else "train"
        if split == "validation" and i % 10 == 0:
            fp = fingerprint(np.asarray(ImageEnhance.Brightness(Image.fromarray(images[i - held])).enhance(1.1)))
        records.append((fp, RecordLocation(split, "f", i, f"r{i}")))
    started = time.perf_counter()
    found = _search(records, 10)
    search_s = time.perf_counter() - started
    planted = sum(1 for i in range(count - held, count) if i % 10 == 0)
    return {"records": count, "hash_us_per_record": hash_s / count * 1e6, "search_s": search_s,
            "search_us_per_record": search_s / count * 1e6, "peak_rss_mib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024, "planted": planted, "leaked_found": len(found["leaked"]),
            "search": found["search"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", nargs="?")
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--child", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(scale_child(args.child)))
        return
    if args.folder:
        result = quality(args.folder)
        for name, change in result.pop("per_change").items():
            print(json.dumps({"change": name, **change}), flush=True)
        print(json.dumps(result), flush=True)
    for size in [int(s) for s in args.sizes.split(",") if s]:
        child = subprocess.run([sys.executable, __file__, "--child", str(size)], capture_output=True, text=True,
                               check=True)
        print(child.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
