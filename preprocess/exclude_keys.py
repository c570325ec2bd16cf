"""The keys file: source keys to leave out of a ``preprocess`` run (``--exclude FILE``), as ``validate
--leaked-keys FILE`` writes it. No Beam.

One key per line, as it is; blank lines and lines starting with ``#`` are skipped; a leading byte-order mark (some
editors write one) is not part of the first key. A key that could not be read back so (one holding a line break,
starting with ``"`` or ``#``, or with spaces at either end) is written as a JSON string, and a line starting with
``"`` is read as one.
"""

from __future__ import annotations

import json


class ExcludeKeysError(ValueError):
    """A keys file that cannot be read as one; the message names the file and the line."""


def _needs_quoting(key: str) -> bool:
    return (not key or key != key.strip() or key[0] in "\"#" or any(c in key for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85"
                                                                    "\u2028\u2029"))


def format_keys(keys: list[str], comment: str = "") -> str:
    """The file's text: ``comment`` as ``#`` lines, then one line per key."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [json.dumps(key) if _needs_quoting(key) else key for key in keys]
    return "".join(line + "\n" for line in lines)


def parse_keys(text: str, path: str) -> list[str]:
    """The keys in a file's ``text`` (read from ``path``, which errors name), in file order, repeats dropped."""
    keys: dict[str, None] = {}
    text = text[1:] if text.startswith("\ufeff") else text  # "UTF-8 with BOM": the mark is no key's first character
    for number, line in enumerate(text.split("\n"), start=1):
        line = line[:-1] if line.endswith("\r") else line
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
