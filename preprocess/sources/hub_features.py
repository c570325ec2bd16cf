"""A Hugging Face Hub dataset's features (``{column: Feature}``) from its card's YAML front matter,
``dataset_info.json`` or a Parquet file's ``huggingface`` metadata. Read as untrusted: bounded size and depth, YAML
scalars kept as written (a class ``no`` stays "no"); a wrong name or numbering is a SourceError."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from shardprep.preprocess.sources import labels, common as sources
from shardprep.preprocess.checks import untrusted

IMAGE = "image"
CLASS_LABEL = "class_label"
_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)  # a class's number in the Hub's mapping '0': name
MAX_FEATURES_BYTES = 4 << 20  # a card's front matter, a dataset_info.json, a file's huggingface metadata


class Feature(NamedTuple):
    """A column's feature: ``IMAGE``, ``CLASS_LABEL`` (with its class names or None) or another type's name."""
    type: str
    names: tuple[str, ...] | None = None


Features = dict[str, Feature]


def from_card(data: bytes, path: str) -> Features:
    """The features in a card's YAML front matter ({} for none; of several configs the first with a class label).
    ``data`` may be the card's first MAX_FEATURES_BYTES + 1 bytes."""
    text = data.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    front = "\n".join(lines[1:end]) if end is not None else text
    if len(front.encode("utf-8")) > MAX_FEATURES_BYTES or (end is None and len(data) > MAX_FEATURES_BYTES):
        raise sources.SourceError(f"{path}: front matter of more than {MAX_FEATURES_BYTES:,} bytes: not a dataset "
                                  "card shardprep reads")
    if end is None:
        return {}
    front = _yaml_document(front, path)
    info = front.get("dataset_info") if isinstance(front, dict) else None
    configs = [c for c in (info if isinstance(info, list) else [info]) if isinstance(c, dict)]
    found = [_card_features(c.get("features"), path) for c in configs]
    return next((f for f in found if any(v.type == CLASS_LABEL for v in f.values())), found[0] if found else {})


def _yaml_document(text: str, path: str):
    """The YAML document ``text``, scalars kept as written, its nesting checked before anything is built."""
    import yaml

    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # libyaml's when installed: the same, faster
    try:
        level = 0
        for event in yaml.parse(text, Loader=loader):
            level += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if level > untrusted.MAX_DEPTH:
                raise sources.SourceError(f"{path}: nested deeper than {untrusted.MAX_DEPTH} levels (lists or "
                                          "mappings inside each other): not a dataset card shardprep reads")
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:  # libyaml refuses nesting beyond 1,000 itself (flow lists are scanned ahead).
        # Lines are the card's: its front matter starts on its second line.
        problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
        detail = (f"{problem} (line {mark.line + 2} of the card)" if problem and mark else problem) or \
            (str(e).splitlines() or [type(e).__name__])[0]
        raise sources.SourceError(f"the dataset card {path} has front matter that is not YAML: {detail}") from None


def _card_features(listed, path: str) -> Features:
    features: Features = {}
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        dtype = entry.get("dtype", entry)
        if isinstance(dtype, dict) and isinstance(dtype.get(CLASS_LABEL), dict):
            features[entry["name"]] = Feature(CLASS_LABEL, _names(dtype[CLASS_LABEL].get("names"), path, entry["name"]))
        elif isinstance(dtype, str):
            features[entry["name"]] = Feature(dtype)
    return features


def from_info(data: bytes, path: str) -> Features:
    """The features of a ``dataset_info.json`` (or Parquet ``huggingface`` metadata: its ``info``)."""
    if len(data) > MAX_FEATURES_BYTES:
        raise sources.SourceError(f"{path}: more than the {MAX_FEATURES_BYTES:,} bytes shardprep reads of a dataset's "
                                  "features")
    try:
        document = untrusted.json_loads(data, source=path, max_bytes=MAX_FEATURES_BYTES,
                                        expected="a dataset's features")
    except untrusted.UntrustedJSONError as e:
        raise sources.SourceError(str(e)) from None
    if isinstance(document, dict) and isinstance(document.get("info"), dict):
        document = document["info"]
    listed = document.get("features") if isinstance(document, dict) else None
    features: Features = {}
    for name, feature in (listed.items() if isinstance(listed, dict) else ()):
        kind = feature.get("_type") if isinstance(feature, dict) else None
        if kind == "ClassLabel":
            features[name] = Feature(CLASS_LABEL, _names(feature.get("names"), path, name))
        elif kind == "Image":
            features[name] = Feature(IMAGE)
        elif isinstance(kind, str):
            features[name] = Feature(kind)
    return features


def _names(names, path: str, column: str) -> tuple[str, ...] | None:
    """Class names from a list or the Hub's ``{'0': name, ...}``; None for none; SourceError when unusable."""
    where = f"{path} (feature {column!r})"
    if names is None or names == [] or names == {}:
        return None
    if not isinstance(names, (list, dict)):
        raise sources.SourceError(f"the class names in {where} are {_shown(names)}, not a list or a mapping")
    if len(names) > labels.MAX_CLASSES:
        raise sources.SourceError(f"{path} names {len(names):,} classes for {column!r}, more than the "
                                  f"{labels.MAX_CLASSES:,} shardprep takes")
    if isinstance(names, dict):
        keys = list(names)
        if not all(isinstance(k, str) and _NUMBER.fullmatch(k) for k in keys) or sorted(map(int, keys)) != list(
                range(len(keys))):
            shown = ", ".join(str(k)[:20] for k in keys[:6]) + (", ..." if len(keys) > 6 else "")
            raise sources.SourceError(f"the class names in {where} are numbered {shown}, not 0 to {len(keys) - 1}")
        names = [names[str(label)] for label in range(len(keys))]
    for label, name in enumerate(names):
        if not isinstance(name, str):
            raise sources.SourceError(f"class name {label} in {where} is {_shown(name)}, not a string: write it in "
                                      "quotes")
    return tuple(names)


def _shown(value) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else type(value).__name__


def column_of(features: Features, kind: str) -> str | None:
    """The first column whose feature is ``kind`` (IMAGE or CLASS_LABEL)."""
    return next((name for name, feature in features.items() if feature.type == kind), None)
