"""Readable names of the ImageNet-1k classes by WordNet ID, from ``wordnet_names.txt`` (taken from
tensorflow-datasets 4.9.10, Apache 2.0), so reading it needs no TFDS."""

from __future__ import annotations

import functools
import importlib.resources
import re

WORDNET_ID = re.compile(r"^n\d{8}$")


@functools.cache
def table() -> dict[str, str]:
    text = importlib.resources.files("shardprep.preprocess.sources").joinpath("wordnet_names.txt").read_text(encoding="utf-8")
    return dict(line.split("\t", 1) for line in text.splitlines() if line)


def display_name(class_name: str) -> str:
    """``golf ball (n03445777)`` for an ImageNet-1k WordNet ID; any other class name as it is."""
    names = table().get(class_name) if WORDNET_ID.match(class_name) else None
    return f"{names.split(', ')[0]} ({class_name})" if names else class_name
