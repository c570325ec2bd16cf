"""The pure parts of a SOURCE (no Beam): ``SourceError``, split names, source keys, ``InputBatch``."""

from __future__ import annotations

import os
import re

from shardprep.preprocess.format.elements import Input

# Folder names taken as splits when every sub-folder of SOURCE has one of them.
SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval", "holdout")
# TFDS file naming: <dataset>-<split>.tfrecord-00000-of-00016 (shard numbers as %05d: 5 digits or more).
_TFDS_FILE_SPLIT = re.compile(r"-([A-Za-z0-9_]+)\.tfrecord(?:-\d{5,}-of-\d{5,})?$")
_OWN_SHARD_SPLIT = re.compile(r"^(.+)-\d{5,}-of-\d{5,}\.tfrecord$")  # shardprep's: train-00000-of-00004.tfrecord


class SourceError(ValueError):
    """SOURCE or its options cannot be used (the message says why), found before anything is written; exit 2."""
    exit_code = 2


def split_from_tfrecord_name(filename: str) -> str | None:
    """The split in a TFDS-style file name (``x-train.tfrecord-00000-of-00016``: ``train``) or a shard of shardprep's
    (``train-00000-of-00016.tfrecord``), or None."""
    name = filename.rsplit("/", 1)[-1]
    match = _OWN_SHARD_SPLIT.match(name) or _TFDS_FILE_SPLIT.search(name)
    return match.group(1) if match else None


def source_key(root: str, path: str) -> str:
    return path[len(root):].lstrip("/") if path.startswith(root) else path


def is_utf8(text: str) -> bool:
    """False for a name the OS gave with undecodable bytes (surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_key(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_hidden(name: str) -> bool:
    return name.startswith(".")


class InputBatch:
    """A few listed ``Input``s packed for the shuffle: pickles as a handful of strings (common prefix and the joined
    rest), ~20 bytes per input, since Beam's local runner holds every batch at once."""
    __slots__ = ("_state",)
    _SEPARATOR = "\0"  # cannot occur in a path, a split or class name, or a TFRecord key

    def __init__(self, items=()):
        items = list(items)
        for split, key, _, path, _ in items:
            if any(self._SEPARATOR in text for text in (split, key, path or "")):
                raise ValueError(f"input {key!r} has a NUL character in its split, key or path")
        splits, keys, labels, paths, data = zip(*items) if items else ((),) * 5
        self._state = (len(items), self._pack(splits), self._pack(keys), tuple(labels),
                       None if all(p is None for p in paths) else self._pack([p or "" for p in paths]),
                       None if all(d is None for d in data) else tuple(data))

    @classmethod
    def _pack(cls, texts) -> tuple[str, str]:
        prefix = os.path.commonprefix(texts) if texts else ""
        return prefix, cls._SEPARATOR.join(text[len(prefix):] for text in texts)

    @classmethod
    def _unpack(cls, packed: tuple[str, str], count: int) -> list[str]:
        prefix, rest = packed
        return [prefix + text for text in rest.split(cls._SEPARATOR)] if count else []

    def __len__(self) -> int:
        return self._state[0]

    def __iter__(self):
        count, splits, keys, labels, paths, data = self._state
        path_list = [p or None for p in self._unpack(paths, count)] if paths is not None else [None] * count
        data_list = data if data is not None else [None] * count
        return iter(list(map(Input._make, zip(self._unpack(splits, count), self._unpack(keys, count), labels,
                                              path_list, data_list))))
