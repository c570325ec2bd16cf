"""The manifest's own shape: the keys and value types every reader (validate, train) relies on.

:func:`shape_problems` returns human-readable problems (``"<path in the document>: <what is wrong>"``) for a loaded
manifest dict, so that a hand-edited or damaged manifest is reported, not met as a crash deep in a reader. Every
manifest ``shardprep.pipelines.manifest_writer.build_manifest`` writes has none.
"""

from __future__ import annotations

import math
import re

from shardprep.preprocess import names
from shardprep.preprocess import encodings, resize
from shardprep.preprocess.config import CROPS
from shardprep.preprocess.limits import largest_stored_side

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Counts and byte sizes stay exact in every JSON reader and in int64 (2**53 - 1, JSON's largest safe integer).
MAX_COUNT = (1 << 53) - 1
MAX_SIDE = largest_stored_side()  # no stored image is larger a side (JPEG's 65,500; raw stops below: 2 GiB records)
MIN_FRAMED_RECORD_BYTES = 16  # a TFRecord record's length, its CRC and the data's CRC, with empty data
# Per-channel pixel statistics on the 0-255 scale: a mean lies in 0-255, a standard deviation in 0-127.5 (values
# half 0 and half 255); the small margin absorbs float rounding.
_MEAN_RANGE, _STD_RANGE = (0.0, 255.0), (0.0, 127.5)
_ROUNDING = 1e-6
_LAYOUT_KEYS = ("record_bytes", "image_offset", "label_offset")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _describe(value) -> str:
    text = repr(value)
    return f"{_type_name(value)} ({text if len(text) <= 40 else text[:37] + '...'})"


def _input_statistics(problems: list[str], manifest: dict) -> None:
    """``mean_rgb``, ``std_rgb`` and ``median_input_size``: what the run found of its inputs."""
    _channel_values(problems, "mean_rgb", manifest.get("mean_rgb"), _MEAN_RANGE)
    _channel_values(problems, "std_rgb", manifest.get("std_rgb"), _STD_RANGE)
    _median_input_size(problems, manifest.get("median_input_size"))


def _median_input_size(problems: list[str], value) -> None:
    """``median_input_size``: absent or null (written before the key existed), else {"width": n, "height": n}."""
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != {"width", "height"}:
        problems.append(f"median_input_size: must be {{\"width\": n, \"height\": n}} or null, is {_describe(value)}")
        return
    for key in ("width", "height"):
        _count(problems, f"median_input_size.{key}", value[key], minimum=1)


def _count(problems: list[str], path: str, value, *, minimum: int = 0, maximum: int = MAX_COUNT) -> bool:
    if not _is_int(value):
        problems.append(f"{path}: must be an integer, is {_describe(value)}")
        return False
    if value < minimum:
        problems.append(f"{path}: must be at least {minimum}, is {value}")
        return False
    if value > maximum:
        problems.append(f"{path}: must be at most {maximum:,}, is {_describe(value)}")
        return False
    return True


def _channel_values(problems: list[str], key: str, value, allowed: tuple[float, float]) -> None:
    """``mean_rgb``/``std_rgb``: null, or 3 finite numbers within ``allowed`` (0-255 scale)."""
    if value is None:
        return
    if not (isinstance(value, list) and len(value) == 3 and all(map(_is_number, value))):
        problems.append(f"{key}: must be a list of 3 numbers or null, is {_describe(value)}")
        return
    low, high = allowed
    for index, number in enumerate(value):
        if not (math.isfinite(number) and low - _ROUNDING <= number <= high + _ROUNDING):
            problems.append(f"{key}[{index}]: must be within {low:g}-{high:g}, is {number!r}")


def unsafe_relative_path(path: str) -> str | None:
    """Why a shard ``file`` entry would point outside the dataset folder, or None if it stays inside."""
    if not path:
        return "is empty"
    if path.startswith(("/", "\\")) or "://" in path or re.match(r"^[A-Za-z]:", path):
        return "must be relative to the dataset folder, is absolute"
    if ".." in re.split(r"[/\\]", path):
        return "must stay inside the dataset folder, contains '..'"
    return None


def _object_with_keys(problems: list[str], path: str, value, required) -> bool:
    """Whether ``value`` is an object; each of ``required`` it lacks (or its not being one) is a problem."""
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object, is {_describe(value)}")
        return False
    problems.extend(f"{path}.{key}: missing" for key in required if key not in value)
    return True


def _shard_problems(problems: list[str], path: str, shard) -> None:
    if not _object_with_keys(problems, path, shard, ("file", "num_examples", "num_bytes")):
        return
    if "file" in shard:
        if not isinstance(shard["file"], str):
            problems.append(f"{path}.file: must be a string, is {_describe(shard['file'])}")
        else:
            unsafe = unsafe_relative_path(shard["file"])
            if unsafe:
                problems.append(f"{path}.file: {shard['file']!r} {unsafe}")
    counted = [key for key in ("num_examples", "num_bytes") if key in shard and _count(problems, f"{path}.{key}",
                                                                                           shard[key])]
    if len(counted) == 2 and shard["num_examples"] * MIN_FRAMED_RECORD_BYTES > shard["num_bytes"]:
        problems.append(f"{path}.num_examples: {shard['num_examples']:,} records cannot fit in "
                        f"{shard['num_bytes']:,} bytes (a record takes at least {MIN_FRAMED_RECORD_BYTES})")
    # sha256: null is allowed (datasets assembled by hand); a value must be 64 lowercase hex digits.
    sha = shard.get("sha256")
    if sha is not None and not (isinstance(sha, str) and _HEX64.match(sha)):
        problems.append(f"{path}.sha256: must be 64 lowercase hex digits, is {_describe(sha)}")


def _split_problems(problems: list[str], split: str, info, fixed_layout: bool, classes) -> None:
    path = f"splits.{split}"
    if not _object_with_keys(problems, path, info, ("num_examples", "class_counts", "shards")):
        return
    for key in ("num_inputs", "num_examples", "num_rejected", "num_shards"):
        if key in info:
            _count(problems, f"{path}.{key}", info[key])
    if "class_counts" in info:
        counts = info["class_counts"]
        if not isinstance(counts, dict):
            problems.append(f"{path}.class_counts: must be an object {{class: count}}, is {_describe(counts)}")
        else:
            for name, n in counts.items():
                _count(problems, f"{path}.class_counts.{name}", n)
    if "rejected_by_reason" in info and not isinstance(info["rejected_by_reason"], dict):
        problems.append(f"{path}.rejected_by_reason: must be an object, is {_describe(info['rejected_by_reason'])}")
    if "shards" in info:
        shards = info["shards"]
        if not isinstance(shards, list):
            problems.append(f"{path}.shards: must be a list, is {_describe(shards)}")
        else:
            for index, shard in enumerate(shards):
                _shard_problems(problems, f"{path}.shards[{index}]", shard)
    layout = info.get("record_layout")
    fixed_layout = fixed_layout and info.get("num_examples") != 0  # an empty split has no records to lay out
    if layout is None:
        if fixed_layout and "record_layout" not in info:
            problems.append(f"{path}.record_layout: missing (required for raw centre crops: the train reader "
                            "reads records by it)")
        elif fixed_layout:
            problems.append(f"{path}.record_layout: must be an object, is null")
    elif _object_with_keys(problems, f"{path}.record_layout", layout, _LAYOUT_KEYS):
        for key in (key for key in _LAYOUT_KEYS if key in layout):
            _count(problems, f"{path}.record_layout.{key}", layout[key], minimum=1 if key == "record_bytes" else 0)


def _classes(problems: list[str], manifest: dict) -> list | None:
    """The manifest's ``classes`` if it is a list (problems with its names appended), else None."""
    classes = manifest.get("classes")
    if "classes" not in manifest:
        return classes
    if not isinstance(classes, list):
        problems.append(f"classes: must be a list of class names, is {_describe(classes)}")
        return None
    for index, name in enumerate(classes):
        if not isinstance(name, str):
            problems.append(f"classes[{index}]: must be a string, is {_describe(name)}")
        elif names.problem(name, "class"):
            problems.append(f"classes[{index}]: {names.describe(name)} {names.problem(name, 'class')}")
    if len(set(map(str, classes))) != len(classes):
        problems.append("classes: names must be unique")
    return classes


def _options_numbers(problems: list[str], manifest: dict) -> None:
    """The numbers readers do not use but a person reads: ``channels`` (3), ``jpeg_quality`` (1-100), ``seed``."""
    if manifest.get("channels") is not None and manifest["channels"] != 3:
        problems.append(f"channels: must be 3 (RGB) or null, is {_describe(manifest['channels'])}")
    if manifest.get("jpeg_quality") is not None:
        quality = manifest["jpeg_quality"]
        if not (_is_int(quality) and 1 <= quality <= 100):
            problems.append(f"jpeg_quality: must be within 1-100 or null, is {_describe(quality)}")
    if manifest.get("seed") is not None and not _is_int(manifest["seed"]):
        problems.append(f"seed: must be an integer or null, is {_describe(manifest['seed'])}")


def shape_problems(manifest, *, layouts_required: bool = True) -> list[str]:
    """Problems with the manifest's keys and value types; empty when every reader can rely on them.

    ``layouts_required=False``: a raw centre-crop split without ``record_layout`` is no problem (the train reader
    reads such a split as ordinary TFRecords); one that has a ``record_layout`` is still checked."""
    if not isinstance(manifest, dict):
        return [f"manifest: must be a JSON object, is {_describe(manifest)}"]
    problems: list[str] = []
    required = ("format_version", "classes", "encoding", "crop", "shorter_side", "splits")
    for key in required:
        if key not in manifest:
            problems.append(f"{key}: missing")
    if "format_version" in manifest and not _is_int(manifest["format_version"]):
        problems.append(f"format_version: must be an integer, is {_describe(manifest['format_version'])}")
    classes = _classes(problems, manifest)
    if "num_classes" in manifest and _count(problems, "num_classes", manifest["num_classes"]) and classes is not None:
        if manifest["num_classes"] != len(classes):
            problems.append(f"num_classes: is {manifest['num_classes']} but classes lists {len(classes)}")
    if "encoding" in manifest and manifest["encoding"] not in encodings.NAMES:
        problems.append(f"encoding: must be one of {', '.join(encodings.NAMES)}, is {_describe(manifest['encoding'])}")
    if "crop" in manifest and manifest["crop"] not in CROPS:
        problems.append(f"crop: must be one of {', '.join(CROPS)}, is {_describe(manifest['crop'])}")
    method = manifest.get("resize_method")
    if method is not None and method not in resize.RESIZE_METHODS:  # absent or null: made before the key existed
        problems.append(f"resize_method: must be one of {', '.join(resize.RESIZE_METHODS)} or null, "
                        f"is {_describe(method)}")
    if "shorter_side" in manifest:
        _count(problems, "shorter_side", manifest["shorter_side"], minimum=1, maximum=MAX_SIDE)
    square = manifest.get("crop") == "center"
    for key in ("image_height", "image_width"):
        if square and key not in manifest:
            problems.append(f"{key}: missing (required for centre crops)")
        elif manifest.get(key) is not None:
            _count(problems, key, manifest[key], minimum=1, maximum=MAX_SIDE)
        elif square:
            problems.append(f"{key}: must be an integer for centre crops, is null")
    for key in ("num_inputs", "num_examples", "num_rejected"):
        if key in manifest:
            _count(problems, key, manifest[key])
    _input_statistics(problems, manifest)
    _options_numbers(problems, manifest)
    stats_split = manifest.get("stats_split")
    if stats_split is not None and not isinstance(stats_split, str):
        problems.append(f"stats_split: must be a split name or null, is {_describe(manifest['stats_split'])}")
    if "splits" in manifest:
        splits = manifest["splits"]
        if not isinstance(splits, dict):
            problems.append(f"splits: must be an object {{split: {{...}}}}, is {_describe(splits)}")
        else:
            fixed_layout = layouts_required and encodings.has_fixed_layout(manifest.get("encoding"), manifest.get("crop"))
            for split, info in splits.items():
                wrong = names.problem(split, "split")
                if wrong:
                    problems.append(f"splits: the split name {names.describe(split)} {wrong}")
                _split_problems(problems, split, info, fixed_layout, classes)
            stats_split = manifest.get("stats_split")
            if isinstance(stats_split, str) and stats_split not in splits:
                problems.append(f"stats_split: {stats_split!r} is not one of the splits ({', '.join(splits)})")
    return problems
