"""Fixture datasets for the train tests: a manifest and shards written with the record format codec.

These stand in for the preprocess job's output where a test needs exact control of pixels, encoding or crop; the
end-to-end test goes through the real job.
"""

from __future__ import annotations

import json
import os

import numpy as np
from PIL import Image

from shardprep.preprocess.format import encodings
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format import record_format
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.tfrecord_io import frame


def write_dataset(root, splits: dict, *, classes, encoding="raw", crop="center", shorter_side=None,
                  num_shards=2, jpeg_quality=95, fixed_layout=None, filename=None) -> dict:
    """Writes ``splits = {split: [(uint8 HxWx3 array, label), ...]}`` as a shardprep dataset under ``root``.

    Returns the manifest. Images are stored as given (the caller resizes/crops); records go round-robin to shards.
    Raw centre crops get the job's fixed record layout unless ``fixed_layout=False`` (the layout of datasets written
    before it existed). ``filename(split, index)`` names the records (default ``split/000000.png``).
    """
    if fixed_layout is None:
        fixed_layout = encodings.has_fixed_layout(encoding, crop)
    filename = filename or (lambda split, index: f"{split}/{index:06d}.png")
    root = str(root)
    os.makedirs(root, exist_ok=True)
    manifest_splits = {}
    all_pixels = []
    for split, items in splits.items():
        os.makedirs(os.path.join(root, split), exist_ok=True)
        shards = [[] for _ in range(num_shards)]
        class_counts = {name: 0 for name in classes}
        layout = None
        if fixed_layout:
            name_lengths = [len(filename(split, i).encode()) for i in range(len(items))]
            height, width = items[0][0].shape[:2]
            layout = FixedLayout.for_records(height, width, (min(name_lengths), max(name_lengths)),
                                                           max(int(label) for _, label in items))
        for index, (pixels, label) in enumerate(items):
            pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
            height, width = pixels.shape[:2]
            encoded = encodings.get(encoding).encode(Image.fromarray(pixels, "RGB"), jpeg_quality)
            record = record_format.ImageRecord(encoded=encoded, format=encoding, height=height, width=width,
                                               label=int(label), filename=filename(split, index))
            if layout is not None:
                shards[index % num_shards].append(layout.encode(record))
            else:
                shards[index % num_shards].append(frame(record_format.encode_example(record)))
            class_counts[classes[label]] += 1
            all_pixels.append(pixels.reshape(-1, 3))
        shard_entries = []
        for shard_index, framed in enumerate(shards):
            relative = manifest_lib.SHARD_FILES.path(split, shard_index, num_shards)
            if layout is not None:
                framed = list(layout.shard_records(framed))
            data = b"".join(framed)
            with open(os.path.join(root, relative), "wb") as f:
                f.write(data)
            shard_entries.append({"file": relative, "num_examples": len(framed), "num_bytes": len(data),
                                  "sha256": None})
        manifest_splits[split] = {
            "num_inputs": len(items), "num_examples": len(items), "num_rejected": 0, "rejected_by_reason": {},
            "class_counts": class_counts, "num_shards": num_shards, "shards": shard_entries,
        }
        if layout is not None:
            manifest_splits[split]["record_layout"] = layout.to_json()
    pixels = np.concatenate(all_pixels).astype(np.float64)
    first = next(iter(splits.values()))[0][0]
    manifest = {
        "format_version": manifest_lib.FORMAT_VERSION, "tool": "tests", "tool_version": "0", "created": "",
        "source": "fixture", "options": {}, "classes": list(classes), "num_classes": len(classes),
        "encoding": encoding, "jpeg_quality": jpeg_quality if encodings.get(encoding).uses_quality else None,
        "shorter_side": shorter_side or min(first.shape[:2]), "crop": crop,
        "image_height": first.shape[0] if crop == "center" else None,
        "image_width": first.shape[1] if crop == "center" else None,
        "channels": 3, "seed": 0, "splits": manifest_splits,
        "num_inputs": sum(len(v) for v in splits.values()),
        "num_examples": sum(len(v) for v in splits.values()), "num_rejected": 0,
        "rejects_file": manifest_lib.REJECTS_NAME, "stats_split": next(iter(splits)),
        "mean_rgb": pixels.mean(axis=0).tolist(), "std_rgb": pixels.std(axis=0).tolist(),
    }
    with open(os.path.join(root, manifest_lib.MANIFEST_NAME), "w") as f:
        f.write(manifest_lib.document_text(manifest))
    return manifest


def random_images(count, height, width, seed=0, labels=(0, 1)):
    """``count`` distinct random images with labels cycling through ``labels``."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), labels[i % len(labels)])
            for i in range(count)]


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_colour_dataset(root) -> str:
    """Two classes told apart by colour (red, blue), 20x20 raw centre crops: 64 train and 32 validation images."""
    rng = np.random.default_rng(0)

    def image(label):
        pixels = rng.integers(0, 120, (20, 20, 3))
        pixels[..., 0 if label == 0 else 2] += 120
        return pixels.astype(np.uint8), label

    write_dataset(root, {"train": [image(i % 2) for i in range(64)],
                         "validation": [image(i % 2) for i in range(32)]}, classes=["red", "blue"], num_shards=2)
    return str(root)


def predict_entries(output: str) -> list[str]:
    """``shardprep predict``'s output as one entry per photo: a line wider than the output continues on lines
    indented by two spaces, joined back here; the closing ``Error:`` line is left out."""
    entries = []
    for line in output.splitlines():
        if line.startswith("  ") and entries:
            entries[-1] += " " + line.strip()
        elif not line.startswith("Error: "):
            entries.append(line)
    return entries


def write_flipped_dataset(root):
    """A dataset of random images with one byte of record 0's pixels flipped in its first train shard (its CRC no
    longer matches): (root, that shard)."""
    write_dataset(root, {"train": random_images(48, 20, 20), "validation": random_images(16, 20, 20, seed=1)},
                  classes=["a", "b"])
    shard = root / "train" / sorted(os.listdir(root / "train"))[0]
    data = bytearray(shard.read_bytes())
    data[500] ^= 0xFF  # inside record 0's pixels
    shard.write_bytes(bytes(data))
    return root, shard
