"""A run's fingerprint and the first difference between two: what ``preprocess --resume`` compares. A resume keeps
work only when it would make the same bytes: same options, version and listing (sizes and mtimes, as make does)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import NamedTuple

from shardprep.preprocess.image import resize
from shardprep.preprocess.format.config import DEFAULT_RESIZE_METHOD, recorded_options

# Options that name where the output goes or how it is replaced, not what it holds.
NOT_FINGERPRINTED = ("output", "overwrite")
# Not an option, but it reaches the bytes: the resize method (a journal without it was written by pillow-bicubic).
RESIZE_METHOD = "resize_method"


class ListedEntry(NamedTuple):
    """One listed input file (size and mtime in ns) or a skipped entry (its reject reason)."""
    key: str
    size: int  # -1: not a file that could be stat'ed (a broken link), or a skipped entry
    mtime_ns: int
    skipped: str = ""  # the reject reason of a skipped entry (hidden, symlinked folder); "" for an input

    def line(self) -> str:
        return json.dumps(list(self), ensure_ascii=False) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ListedEntry:
        key, size, mtime_ns, skipped = json.loads(line)
        if not (isinstance(key, str) and isinstance(skipped, str)):
            raise ValueError(f"not a listing line: {line[:80]!r}")
        return cls(key, int(size), int(mtime_ns), skipped)  # OverflowError for 1e999


def listing_text(entries) -> str:
    """The listing as JSON lines sorted by key: what ``listing_sha256`` hashes and the journal keeps."""
    return "".join(entry.line() for entry in sorted(entries))


def listing_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprinted_options(config, runner: str) -> dict:
    """The options that reach the output bytes, plus where each local path option pointed when the run started
    (``<name>_resolved``), which a resume compares instead of the text typed."""
    options = {**recorded_options(config, runner), RESIZE_METHOD: DEFAULT_RESIZE_METHOD}
    options = {name: value for name, value in options.items() if name not in NOT_FINGERPRINTED}
    for name in _PATH_OPTIONS:
        if isinstance(options.get(name), str):
            options[name + RESOLVED] = _comparable(name, options[name])
    return options


def option_flag(name: str) -> str:
    """The option that sets PreprocessConfig's field ``name`` (``--shorter-side``; ``classes_file``: ``--classes``)."""
    if name == RESIZE_METHOD:
        return "the resize method"
    if name in ("source", "runner"):
        return name.upper()
    return "--classes" if name == "classes_file" else "--" + name.replace("_", "-")


def options_difference(old: dict, new: dict) -> str | None:
    """'--shorter-side was 64, is now 32' for the first option that differs, else None."""
    old, new = ({**options, RESIZE_METHOD: options.get(RESIZE_METHOD, resize.METHOD_WITHOUT_KEY)}
                for options in (old, new))
    for name in list(old) + [name for name in new if name not in old]:
        if name.endswith(RESOLVED):
            continue  # compared with its option
        before, after = _where(name, old), _where(name, new)
        if before == after:
            continue
        if old.get(name) == new.get(name):  # the same text naming another folder (a link moved, another cwd)
            return f"{option_flag(name)} {old.get(name)!r} was {before}, is now {after}"
        return f"{option_flag(name)} was {old.get(name)!r}, is now {new.get(name)!r}"
    return None


def _where(name: str, options: dict):
    """What option ``name`` stands for: a path option, where it pointed when recorded; any other, its value."""
    return options.get(name + RESOLVED, _comparable(name, options.get(name)))


# Options whose value is a local path (SOURCE: after its kind's prefix): compared as the folder or file they name.
_PATH_OPTIONS = ("source", "labels_file", "tfds_data_dir")
_GLOB_PREFIXES = ("tfrecord:", "parquet:")
RESOLVED = "_resolved"


def _comparable(name: str, value):
    """A local path option made absolute with links resolved (``img/``, ``./img``, ``file:///abs/img`` are one
    folder); anything else as it is."""
    if name not in _PATH_OPTIONS or not isinstance(value, str) or not value:
        return value
    prefix = next((p for p in _GLOB_PREFIXES if value.startswith(p)), "")
    path = value[len(prefix):]
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path or (name == "source" and not prefix and ":" in path.split("/", 1)[0]):
        return value  # a URL (gs://...) or another kind's name (tfds:mnist): compared as typed
    return prefix + os.path.realpath(os.path.abspath(path))


def listing_difference(old: list[ListedEntry], new: list[ListedEntry]) -> str | None:
    """The first difference between two sorted listings ('input X added', ...), or None."""
    old_by_key, new_by_key = {e.key: e for e in old}, {e.key: e for e in new}
    for key in sorted(set(old_by_key) | set(new_by_key)):
        before, after = old_by_key.get(key), new_by_key.get(key)
        if before == after:
            continue
        if before is None:
            return f"input {key} added"
        if after is None:
            return f"input {key} removed"
        if before.skipped != after.skipped:
            return f"input {key} changed ({before.skipped or 'read'} -> {after.skipped or 'read'})"
        if before.size != after.size:
            return f"input {key} changed (size {before.size} -> {after.size} bytes)"
        return f"input {key} changed (same size, modified: mtime {before.mtime_ns} -> {after.mtime_ns} ns)"
    return None


def inputs_sha256(items) -> str:
    """A decode group's identity: its inputs (source key and label) in seeded order."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(f"{item.key}\0{item.label}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
