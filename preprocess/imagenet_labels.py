"""ImageNet's validation labels as tensorflow-datasets ships them, found without importing it. Pure file reading.

ILSVRC2012's validation images come flat (``ILSVRC2012_val_00000001.JPEG`` ...) with their classes elsewhere: the
devkit's ground truth file numbers the classes in its own order, while TFDS's installed package holds
``datasets/imagenet2012/validation_labels.txt``, the WordNet ID of image i on line i. Those IDs, sorted, are the
class order (the order ImageNet's 1,000 classes are usually numbered in, TFDS's and torchvision's).
"""

from __future__ import annotations

import importlib.util
import os
import re

from shardprep.preprocess import sources

VALIDATION_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$")
_RELATIVE = os.path.join("datasets", "imagenet2012", "validation_labels.txt")
_WNID = re.compile(r"^n\d{8}$")


def is_validation_name(name: str) -> bool:
    """True for an ILSVRC2012 validation image's file name (the part after the last '/')."""
    return VALIDATION_NAME.match(name.rsplit("/", 1)[-1]) is not None


def tfds_labels_path() -> str | None:
    """The installed tensorflow-datasets' ``validation_labels.txt``, or None (not installed, or without it);
    nothing is imported."""
    try:
        spec = importlib.util.find_spec("tensorflow_datasets")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, _RELATIVE)
        if os.path.isfile(path):
            return path
    return None


def validation_labels(path: str | None = None) -> dict[str, str]:
    """{file name: WordNet ID} of the 50,000 validation images, from ``path`` (TFDS's file when None);
    ``SourceError`` when there is none or it is not one WordNet ID a line."""
    path = path or tfds_labels_path()
    if path is None:
        raise sources.SourceError(
            "ImageNet validation images (ILSVRC2012_val_*.JPEG) need their labels: install tensorflow-datasets "
            "(it ships them) or give --labels-file (a CSV of filename,label, or Kaggle's LOC_val_solution.csv)")
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    bad = next((number for number, wnid in enumerate(lines, start=1) if not _WNID.match(wnid)), None)
    if bad is not None:
        raise sources.SourceError(f"{path} line {bad} is not a WordNet ID (n01440764): not ImageNet's validation labels")
    return {f"ILSVRC2012_val_{index:08d}.JPEG": wnid for index, wnid in enumerate(lines, start=1)}
