"""What the Hugging Face Hub says about a dataset's columns: its *features* (each column's type: an image, a class
label with its names), read from the three places they are written.

* The dataset card, ``README.md``, whose YAML front matter holds ``dataset_info.features``: a list of
  ``{name, dtype}``, where an image column's dtype is ``image`` and a label's is ``{class_label: {names: ...}}``
  (names as a list, or as a mapping ``'0': name`` as the Hub writes them).
* ``dataset_info.json`` (written by the ``datasets`` library): ``{"features": {column: {"_type": "Image"} or
  {"_type": "ClassLabel", "names": [...]}}}``.
* A Parquet file's own schema metadata, key ``huggingface``: ``{"info": {"features": ...}}`` as in
  ``dataset_info.json``.

All three become ``{column: Feature}``. Pure functions of bytes and dicts: no file access.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import NamedTuple

from shardprep.preprocess import names as name_rules
from shardprep.preprocess import sources

IMAGE = "image"
CLASS_LABEL = "class_label"


class Feature(NamedTuple):
    """A column's feature: ``IMAGE``, ``CLASS_LABEL`` (with its class names, None when none are given) or another
    type's name."""

    type: str
    names: tuple[str, ...] | None = None


Features = dict[str, Feature]


def from_card(data: bytes, path: str) -> Features:
    """The features in a dataset card's YAML front matter (``---`` lines around it); {} when it has none. A card
    with several configurations (``dataset_info`` a list) gives the first that has a class label.
    ``sources.SourceError`` for front matter that is not YAML."""
    import yaml

    text = data.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        return {}
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise sources.SourceError(f"the dataset card {path} has front matter that is not YAML: {detail}") from None
    info = front.get("dataset_info") if isinstance(front, dict) else None
    configs = [info] if isinstance(info, dict) else [c for c in info if isinstance(c, dict)] if isinstance(
        info, list) else []
    found = [_card_features(c.get("features")) for c in configs]
    return next((f for f in found if any(v.type == CLASS_LABEL for v in f.values())), found[0] if found else {})


def _card_features(listed) -> Features:
    features: Features = {}
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        dtype = entry.get("dtype", entry)
        if isinstance(dtype, dict) and isinstance(dtype.get(CLASS_LABEL), dict):
            features[entry["name"]] = Feature(CLASS_LABEL, _names(dtype[CLASS_LABEL].get("names")))
        elif isinstance(dtype, str):
            features[entry["name"]] = Feature(dtype)
    return features


def from_info(data: bytes, path: str) -> Features:
    """The features of a ``dataset_info.json`` (or of a Parquet file's ``huggingface`` metadata, whose ``info``
    holds them); ``sources.SourceError`` for one that is not JSON."""
    try:
        document = json.loads(data)
    except ValueError as e:
        raise sources.SourceError(f"{path} is not JSON: {e}") from None
    if isinstance(document, dict) and isinstance(document.get("info"), dict):
        document = document["info"]
    listed = document.get("features") if isinstance(document, dict) else None
    features: Features = {}
    for name, feature in (listed.items() if isinstance(listed, dict) else ()):
        kind = feature.get("_type") if isinstance(feature, dict) else None
        if kind == "ClassLabel":
            features[name] = Feature(CLASS_LABEL, _names(feature.get("names")))
        elif kind == "Image":
            features[name] = Feature(IMAGE)
        elif isinstance(kind, str):
            features[name] = Feature(kind)
    return features


def _names(names) -> tuple[str, ...] | None:
    """Class names as a list, or as the Hub's mapping ``{'0': name, ...}`` (ordered by its integer keys)."""
    if isinstance(names, dict):
        try:
            ordered = sorted((int(key), value) for key, value in names.items())
        except (TypeError, ValueError):
            return None
        if [key for key, _ in ordered] != list(range(len(ordered))):
            return None
        names = [value for _, value in ordered]
    if isinstance(names, list) and names and all(isinstance(n, (str, int)) for n in names):
        return tuple(str(n) for n in names)
    return None


def column_of(features: Features, kind: str) -> str | None:
    """The first column whose feature is ``kind`` (IMAGE or CLASS_LABEL)."""
    return next((name for name, feature in features.items() if feature.type == kind), None)


def usable_class_names(names: tuple[str, ...], where: str) -> tuple[tuple[str, ...], str | None]:
    """(``names`` as shardprep keeps class names: each checked by the rule for names, one that repeats told apart by
    its label, ``crane (134)``; a note naming those, or None). ``sources.SourceError`` naming ``where`` for a name
    that breaks the rule."""
    checked = [name_rules.check(name, "class", where) for name in names]
    counts = Counter(checked)
    unique = tuple(f"{name} ({label})" if counts[name] > 1 else name for label, name in enumerate(checked))
    if len(set(unique)) != len(unique):
        raise sources.SourceError(f"the class names in {where} repeat even when told apart by their label")
    repeated = [name for name, given in zip(unique, checked) if counts[given] > 1]
    return unique, ("repeated class names told apart by label: " + ", ".join(repeated) if repeated else None)
