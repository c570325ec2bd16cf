"""The manifest's schema, declared once: every key of ``manifest.json``, a split, a shard and a record layout, in
written order, with the check of its value. From it come :func:`shape_problems` (a damaged manifest is reported, not
met as a crash in a reader) and :func:`docs_table` (docs/manifest.md; a test keeps the two equal)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from shardprep.preprocess.format import encodings
from shardprep.preprocess.checks import names
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.config import CROPS, largest_stored_side

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Counts and byte sizes stay exact in every JSON reader and in int64 (2**53 - 1, JSON's largest safe integer).
MAX_COUNT = (1 << 53) - 1
MAX_SIDE = largest_stored_side()  # no stored image is larger a side (JPEG's 65,500; raw stops below: 2 GiB records)
MIN_FRAMED_RECORD_BYTES = 16  # a TFRecord record's length, its CRC and the data's CRC, with empty data
_ROUNDING = 1e-6  # float rounding of the pixel statistics' ranges

Check = Callable[[list, str, Any], None]  # (problems, path in the document, value): appends what is wrong


class Key(NamedTuple):
    """One key: its name, type and meaning as docs/manifest.md shows them; ``check`` its value's."""
    name: str
    type: str
    required: bool
    meaning: str
    check: Check | None = None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value) -> str:
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"


def _counted(minimum: int = 0, maximum: int = MAX_COUNT, nullable: bool = False) -> Check:
    def check(problems, path, value):
        if nullable and value is None:
            return
        if not _is_int(value):
            problems.append(f"{path}: must be an integer, is {_describe(value)}")
        elif value < minimum:
            problems.append(f"{path}: must be at least {minimum}, is {value}")
        elif value > maximum:
            problems.append(f"{path}: must be at most {maximum:,}, is {_describe(value)}")
    return check


def _one_of(choices: Callable[[], tuple], nullable: bool = False) -> Check:
    def check(problems, path, value):
        if value not in choices() and not (nullable and value is None):
            problems.append(f"{path}: must be one of {', '.join(choices())}{' or null' if nullable else ''}, "
                            f"is {_describe(value)}")
    return check


def _expect(test: Callable[[Any], bool], what: str) -> Check:
    def check(problems, path, value):
        if not test(value):
            problems.append(f"{path}: must be {what}, is {_describe(value)}")
    return check


def _channel_values(high: float) -> Check:
    def check(problems, path, value):
        if value is None:
            return
        if not (isinstance(value, list) and len(value) == 3
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            problems.append(f"{path}: must be a list of 3 numbers or null, is {_describe(value)}")
            return
        for index, number in enumerate(value):
            if not (math.isfinite(number) and -_ROUNDING <= number <= high + _ROUNDING):
                problems.append(f"{path}[{index}]: must be within 0-{high:g}, is {number!r}")
    return check


def _median_input_size(problems, path, value) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != {"width", "height"}:
        problems.append(f"{path}: must be {{\"width\": n, \"height\": n}} or null, is {_describe(value)}")
        return
    for key in ("width", "height"):
        _counted(minimum=1)(problems, f"{path}.{key}", value[key])


def _classes(problems, path, classes) -> None:
    if not isinstance(classes, list):
        problems.append(f"{path}: must be a list of class names, is {_describe(classes)}")
        return
    for index, name in enumerate(classes):
        if not isinstance(name, str):
            problems.append(f"{path}[{index}]: must be a string, is {_describe(name)}")
        elif names.problem(name, "class"):
            problems.append(f"{path}[{index}]: {names.describe(name)} {names.problem(name, 'class')}")
    if len(set(map(str, classes))) != len(classes):
        problems.append(f"{path}: names must be unique")


def unsafe_relative_path(path: str) -> str | None:
    """Why a shard ``file`` entry would point outside the dataset folder, or None."""
    if not path:
        return "is empty"
    if path.startswith(("/", "\\")) or "://" in path or re.match(r"^[A-Za-z]:", path):
        return "must be relative to the dataset folder, is absolute"
    if ".." in re.split(r"[/\\]", path):
        return "must stay inside the dataset folder, contains '..'"
    return None


def _shard_file(problems, path, value) -> None:
    if not isinstance(value, str):
        problems.append(f"{path}: must be a string, is {_describe(value)}")
    elif unsafe_relative_path(value):
        problems.append(f"{path}: {value!r} {unsafe_relative_path(value)}")


def _object_of_counts(problems, path, value) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object {{class: count}}, is {_describe(value)}")
        return
    for name, n in value.items():
        _counted()(problems, f"{path}.{name}", n)


SHARD_KEYS = (
    Key("file", "string", True, "the shard's path relative to the dataset folder", _shard_file),
    Key("num_examples", "integer", True, "records in the shard", _counted()),
    Key("num_bytes", "integer", True, "the shard file's bytes", _counted()),
    Key("sha256", "string or null", False, "SHA-256 of the shard file (64 lowercase hex digits)",
        _expect(lambda v: v is None or (isinstance(v, str) and bool(_HEX64.match(v))), "64 lowercase hex digits")))
LAYOUT_KEYS = (
    Key("record_bytes", "integer", True, "every record's length", _counted(minimum=1)),
    Key("image_offset", "integer", True, "where the pixels start in a record", _counted()),
    Key("label_offset", "integer", True, "where the label starts in a record", _counted()))
SPLIT_KEYS = (
    Key("num_inputs", "integer", False, "inputs listed", _counted()),
    Key("num_examples", "integer", True, "records written", _counted()),
    Key("num_rejected", "integer", False, "inputs rejected (rejects.jsonl)", _counted()),
    Key("rejected_by_reason", "object", False, "{reason: count} of the rejects",
        _expect(lambda v: isinstance(v, dict), "an object")),
    Key("class_counts", "object", True, "{class: records}, in label order", _object_of_counts),
    Key("num_shards", "integer", False, "shards of the split", _counted()),
    Key("shards", "list", True, "one entry per shard (table below), in order"),
    Key("record_layout", "object", False, "the fixed layout of raw centre crops' records (required for them)"))
MANIFEST_KEYS = (
    Key("format_version", "integer", True, "1: the manifest format this shardprep reads",
        _expect(_is_int, "an integer")),
    Key("tool", "string", False, "shardprep"),
    Key("tool_version", "string", False, "the version of shardprep that wrote it"),
    Key("created", "string", False, "when (ISO 8601; SOURCE_DATE_EPOCH if set)"),
    Key("source", "string", False, "SOURCE as given"),
    Key("source_kind", "string", False, "what SOURCE is (a folder, an archive, tfrecord:, tfds:, parquet:)"),
    Key("options", "object", False, "every option of the run, and the runner"),
    Key("classes", "list of strings", True, "class names in label order", _classes),
    Key("num_classes", "integer", False, "the number of classes", _counted()),
    Key("encoding", "string", True, "how images are stored: " + ", ".join(encodings.NAMES),
        _one_of(lambda: encodings.NAMES)),
    Key("jpeg_quality", "integer or null", False, "--jpeg-quality where the encoding uses it",
        _expect(lambda v: v is None or (_is_int(v) and 1 <= v <= 100), "within 1-100 or null")),
    Key("shorter_side", "integer", True, "the stored images' shorter side", _counted(1, MAX_SIDE)),
    Key("crop", "string", True, "center (S x S images) or none (aspect ratio kept)", _one_of(lambda: CROPS)),
    Key("resize_method", "string", False, "the resize method (absent: pillow-bicubic, before the key existed)",
        _one_of(lambda: resize.RESIZE_METHODS, nullable=True)),
    Key("image_height", "integer or null", False, "the stored height (required for centre crops; null for none)",
        _counted(1, MAX_SIDE, nullable=True)),
    Key("image_width", "integer or null", False, "the stored width (required for centre crops; null for none)",
        _counted(1, MAX_SIDE, nullable=True)),
    Key("channels", "integer or null", False, "3 (RGB)", _expect(lambda v: v is None or v == 3, "3 (RGB) or null")),
    Key("seed", "integer or null", False, "--seed, of the record order",
        _expect(lambda v: v is None or _is_int(v), "an integer or null")),
    Key("splits", "object", True, "{split: its entry (table below)}"),
    Key("num_inputs", "integer", False, "inputs listed, all splits", _counted()),
    Key("num_examples", "integer", False, "records written, all splits", _counted()),
    Key("num_rejected", "integer", False, "inputs rejected, all splits", _counted()),
    Key("rejects_file", "string", False, "rejects.jsonl: one JSON line per rejected input"),
    Key("stats_split", "string or null", False, "the split mean_rgb and std_rgb were computed over",
        _expect(lambda v: v is None or isinstance(v, str), "a split name or null")),
    Key("mean_rgb", "list or null", False, "per-channel mean, 0-255", _channel_values(255.0)),
    Key("std_rgb", "list or null", False, "per-channel standard deviation, 0-255 scale", _channel_values(127.5)),
    Key("not_used", "list", False, "{path, reason} of what lay beside the splits or classes and was not read "
        "(written when there was any)"),
    Key("median_input_size", "object or null", False, "{width, height} of the median input in a sample of their "
        "headers (absent before the key existed)", _median_input_size))


def _keys(problems: list, path: str, value, keys: tuple[Key, ...]) -> bool:
    """Checks ``value`` against ``keys`` (required ones present, each present value's check); whether it is an
    object."""
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object, is {_describe(value)}")
        return False
    problems.extend(f"{path}.{key.name}: missing" for key in keys if key.required and key.name not in value)
    for key in keys:
        if key.check is not None and key.name in value:
            key.check(problems, f"{path}.{key.name}", value[key.name])
    return True


def _split_problems(problems: list, path: str, info, fixed_layout: bool) -> None:
    if not _keys(problems, path, info, SPLIT_KEYS):
        return
    if isinstance(info.get("shards"), list):
        for index, shard in enumerate(info["shards"]):
            where = f"{path}.shards[{index}]"
            if _keys(problems, where, shard, SHARD_KEYS) and all(
                    _is_int(shard.get(key)) and shard[key] >= 0 for key in ("num_examples", "num_bytes")) \
                    and shard["num_examples"] * MIN_FRAMED_RECORD_BYTES > shard["num_bytes"]:
                problems.append(f"{where}.num_examples: {shard['num_examples']:,} records cannot fit in "
                                f"{shard['num_bytes']:,} bytes (a record takes at least {MIN_FRAMED_RECORD_BYTES})")
    elif "shards" in info:
        problems.append(f"{path}.shards: must be a list, is {_describe(info['shards'])}")
    layout = info.get("record_layout")
    fixed_layout = fixed_layout and info.get("num_examples") != 0  # an empty split has no records to lay out
    if layout is not None:
        _keys(problems, f"{path}.record_layout", layout, LAYOUT_KEYS)
    elif fixed_layout and "record_layout" not in info:
        problems.append(f"{path}.record_layout: missing (required for raw centre crops: the train reader "
                        "reads records by it)")
    elif fixed_layout:
        problems.append(f"{path}.record_layout: must be an object, is null")


def shape_problems(manifest, *, layouts_required: bool = True) -> list[str]:
    """``"<path>: <what is wrong>"`` for the manifest's keys and value types; empty when readers can rely on them.
    ``layouts_required=False``: a raw centre-crop split may lack ``record_layout``."""
    if not isinstance(manifest, dict):
        return [f"manifest: must be a JSON object, is {_describe(manifest)}"]
    problems: list[str] = []
    _keys(problems, "", manifest, MANIFEST_KEYS)
    problems = [problem[1:] for problem in problems]  # top-level paths without the leading "."
    classes = manifest.get("classes")
    if isinstance(classes, list) and _is_int(manifest.get("num_classes")) and manifest["num_classes"] >= 0 \
            and manifest["num_classes"] != len(classes):
        problems.append(f"num_classes: is {manifest['num_classes']} but classes lists {len(classes)}")
    for key in ("image_height", "image_width") if manifest.get("crop") == "center" else ():
        if key not in manifest:
            problems.append(f"{key}: missing (required for centre crops)")
        elif manifest[key] is None:
            problems.append(f"{key}: must be an integer for centre crops, is null")
    splits = manifest.get("splits", {})
    if not isinstance(splits, dict):
        problems.append(f"splits: must be an object {{split: {{...}}}}, is {_describe(splits)}")
        return problems
    fixed_layout = layouts_required and encodings.has_fixed_layout(manifest.get("encoding"), manifest.get("crop"))
    for split, info in splits.items():
        if names.problem(split, "split"):
            problems.append(f"splits: the split name {names.describe(split)} {names.problem(split, 'split')}")
        _split_problems(problems, f"splits.{split}", info, fixed_layout)
    stats_split = manifest.get("stats_split")
    if isinstance(stats_split, str) and "splits" in manifest and stats_split not in splits:
        problems.append(f"stats_split: {stats_split!r} is not one of the splits ({', '.join(splits)})")
    return problems


def docs_table() -> str:
    parts = []
    for title, keys in (("manifest.json", MANIFEST_KEYS), ("a split (`splits.<split>`)", SPLIT_KEYS),
                        ("a shard (`splits.<split>.shards[i]`)", SHARD_KEYS),
                        ("a record layout (`splits.<split>.record_layout`)", LAYOUT_KEYS)):
        rows = [f"| `{key.name}` | {key.type} | {'yes' if key.required else 'no'} | {key.meaning} |" for key in keys]
        parts.append("\n".join([f"Keys of {title}:", "", "| key | type | required | meaning |", "|---|---|---|---|",
                                *rows]))
    return "\n\n".join(parts) + "\n"
