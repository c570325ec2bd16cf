"""The one rule for split and class names, whatever they are read from.

Split names become folders and shard file names under OUTPUT; class names go into the manifest and the records. A
name is refused when it is empty, holds a path separator or a control character, is ``.``/``..`` or starts with a dot
(hidden: every lister skips it), or is not valid UTF-8. Split names are also kept short enough for a shard's
temporary file name to fit the 255 bytes file systems allow.
"""

from __future__ import annotations

import unicodedata

from shardprep.preprocess.sources import SourceError

MAX_SPLIT_BYTES = 180  # "<split>-00000-of-00001.tfrecord" under ".tmp-<32 hex>-" stays under 255 bytes


def problem(name: str, kind: str = "class") -> str | None:
    """What is wrong with ``name`` as a split or class name (``kind``), or None when it is fine."""
    if not name:
        return "is empty"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if "/" in name or "\\" in name:
        return "contains a path separator ('/' or '\\')"
    if name in (".", ".."):
        return f"is {name!r}, a path step"
    if name.startswith("."):
        return "starts with '.' (a hidden name, skipped by every reader)"
    for char in name:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return f"contains the control character {char!r}"
    if kind == "split" and len(encoded) > MAX_SPLIT_BYTES:
        return f"is {len(encoded)} bytes long (split names have at most {MAX_SPLIT_BYTES})"
    return None


def printable(text: str) -> str:
    """``text`` on one line: bytes that are not UTF-8 and control characters as backslash escapes."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(char.encode("unicode_escape").decode("ascii") if unicodedata.category(char) in ("Cc", "Zl", "Zp")
                   else char for char in text)


def describe(name: str) -> str:
    """``name`` quoted for a message, with undecodable bytes and control characters escaped."""
    return f"'{printable(name)}'"


def check(name: str, kind: str, where: str, fix: str = "") -> str:
    """``name`` if it passes the rule; else SourceError naming the ``kind`` (split or class), ``where`` it was read
    and what to do (``fix``)."""
    wrong = problem(name, kind)
    if wrong is not None:
        raise SourceError(f"the {kind} name {describe(name)} from {where} {wrong}"
                          + (f": {fix}" if fix else "; split and class names must be non-empty, without '/', '\\', "
                             "control characters or a leading '.'"))
    return name
