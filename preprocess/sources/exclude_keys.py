"""The keys file (``validate --leaked-keys`` writes it, ``preprocess --exclude`` reads it): one key a line, blank and
``#`` lines skipped, a BOM dropped; a key a line cannot hold is written and read as a JSON string."""

from __future__ import annotations

import bisect
import itertools
import json
from typing import Iterable, Iterator

import numpy as np


class ExcludeKeysError(ValueError):
    """A keys file that cannot be read as one; the message names the file and the line."""


class SortedKeys:
    """A set of keys as one sorted UTF-8 buffer and end offsets, searched by bisection: pickles as two buffers (a
    frozenset of 3,000,000 keys cost each worker ~2 GB). Iterates in sorted order."""

    def __init__(self, keys: Iterable[str]):
        ordered = list(dict.fromkeys(sorted(keys)))  # a sorted file sorts in one pass; repeats dropped
        text = "".join(ordered)
        self._blob = text.encode("utf-8", "surrogatepass")
        lengths = (map(len, ordered) if len(self._blob) == len(text)  # ASCII: a key's bytes are its characters
                   else (len(key.encode("utf-8", "surrogatepass")) for key in ordered))
        self._ends = np.cumsum(np.fromiter(lengths, np.int64, len(ordered)))

    def __len__(self) -> int:
        return len(self._ends)

    def _at(self, index: int) -> bytes:
        return self._blob[int(self._ends[index - 1]) if index else 0:int(self._ends[index])]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        wanted = key.encode("utf-8", "surrogatepass")
        low = bisect.bisect_left(range(len(self)), wanted, key=self._at)
        return low < len(self) and self._at(low) == wanted

    def __iter__(self) -> Iterator[str]:
        for start, end in itertools.pairwise(itertools.chain([0], self._ends.tolist())):
            yield self._blob[start:end].decode("utf-8", "surrogatepass")


def _needs_quoting(key: str) -> bool:
    return (not key or key != key.strip() or key[0] in "\"#" or any(c in key for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85"
                                                                    "\u2028\u2029"))


def format_keys(keys: list[str], comment: str = "") -> str:
    """The file's text: ``comment`` as ``#`` lines, then one line per key."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [json.dumps(key) if _needs_quoting(key) else key for key in keys]
    return "".join(line + "\n" for line in lines)


def parse_keys(text: str, path: str) -> list[str]:
    """The keys in a file's ``text`` (``path`` for errors), in file order, repeats dropped."""
    text = text[1:] if text.startswith("\ufeff") else text  # "UTF-8 with BOM": the mark is no key's first character
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if not (text.startswith('"') or '\n"' in text):  # no quoted key: one pass in C, not a branch per line
        return list(dict.fromkeys(line for line in lines if line.strip() and not line.startswith("#")))
    keys: dict[str, None] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith('"'):
            try:
                key = json.loads(line)
            except json.JSONDecodeError as e:
                raise ExcludeKeysError(f"{path} line {number}: a quoted key that is not a JSON string ({e.msg})") \
                    from None
            if not isinstance(key, str):
                raise ExcludeKeysError(f"{path} line {number}: a quoted key that is not a JSON string")
        else:
            key = line
        keys[key] = None
    return list(keys)
