"""The manifest's keys as data: :func:`key` declares one on a field of the typed manifest (``dataset.py``: its name,
type, whether required, meaning and value check, once), :func:`keys_of` lists them, and the checks of values and of
an object against its keys (:func:`check_object`) report a damaged manifest instead of crashing a reader."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from shardprep.preprocess.checks import names
from shardprep.preprocess.format.config import largest_stored_side

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


def key(type: str, required: bool, meaning: str, check: Check | None = None, **field_options) -> Any:
    """A dataclass field that is a manifest key (docs/manifest.md shows its type, whether required and meaning)."""
    return dataclasses.field(metadata={"manifest_key": (type, required, meaning, check)}, **field_options)


def keys_of(cls) -> tuple[Key, ...]:
    """The manifest keys of a dataclass, in field order."""
    return tuple(Key(f.name, *f.metadata["manifest_key"]) for f in dataclasses.fields(cls)
                 if "manifest_key" in f.metadata)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def describe(value) -> str:
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"


def counted(minimum: int = 0, maximum: int = MAX_COUNT, nullable: bool = False) -> Check:
    def check(problems, path, value):
        if nullable and value is None:
            return
        if not is_int(value):
            problems.append(f"{path}: must be an integer, is {describe(value)}")
        elif value < minimum:
            problems.append(f"{path}: must be at least {minimum}, is {value}")
        elif value > maximum:
            problems.append(f"{path}: must be at most {maximum:,}, is {describe(value)}")
    return check


def one_of(choices: Callable[[], tuple], nullable: bool = False) -> Check:
    def check(problems, path, value):
        if value not in choices() and not (nullable and value is None):
            problems.append(f"{path}: must be one of {', '.join(choices())}{' or null' if nullable else ''}, "
                            f"is {describe(value)}")
    return check


def expect(test: Callable[[Any], bool], what: str) -> Check:
    def check(problems, path, value):
        if not test(value):
            problems.append(f"{path}: must be {what}, is {describe(value)}")
    return check


def channel_values(high: float) -> Check:
    def check(problems, path, value):
        if value is None:
            return
        if not (isinstance(value, list) and len(value) == 3
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            problems.append(f"{path}: must be a list of 3 numbers or null, is {describe(value)}")
            return
        for index, number in enumerate(value):
            if not (math.isfinite(number) and -_ROUNDING <= number <= high + _ROUNDING):
                problems.append(f"{path}[{index}]: must be within 0-{high:g}, is {number!r}")
    return check


def median_input_size(problems, path, value) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != {"width", "height"}:
        problems.append(f"{path}: must be {{\"width\": n, \"height\": n}} or null, is {describe(value)}")
        return
    for key in ("width", "height"):
        counted(minimum=1)(problems, f"{path}.{key}", value[key])


def class_names(problems, path, classes) -> None:
    if not isinstance(classes, list):
        problems.append(f"{path}: must be a list of class names, is {describe(classes)}")
        return
    for index, name in enumerate(classes):
        if not isinstance(name, str):
            problems.append(f"{path}[{index}]: must be a string, is {describe(name)}")
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


def shard_file(problems, path, value) -> None:
    if not isinstance(value, str):
        problems.append(f"{path}: must be a string, is {describe(value)}")
    elif unsafe_relative_path(value):
        problems.append(f"{path}: {value!r} {unsafe_relative_path(value)}")


SHA256 = expect(lambda v: v is None or (isinstance(v, str) and bool(_HEX64.match(v))), "64 lowercase hex digits")


def object_of_counts(problems, path, value) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object {{class: count}}, is {describe(value)}")
        return
    for name, n in value.items():
        counted()(problems, f"{path}.{name}", n)


LAYOUT_KEYS = (
    Key("record_bytes", "integer", True, "every record's length", counted(minimum=1)),
    Key("image_offset", "integer", True, "where the pixels start in a record", counted()),
    Key("label_offset", "integer", True, "where the label starts in a record", counted()))


def check_object(problems: list, path: str, value, keys: tuple[Key, ...]) -> bool:
    """Checks ``value`` against ``keys`` (required ones present, each present value's check); whether it is an
    object."""
    if not isinstance(value, dict):
        problems.append(f"{path}: must be an object, is {describe(value)}")
        return False
    problems.extend(f"{path}.{key.name}: missing" for key in keys if key.required and key.name not in value)
    for key in keys:
        if key.check is not None and key.name in value:
            key.check(problems, f"{path}.{key.name}", value[key.name])
    return True
