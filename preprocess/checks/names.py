"""The one rule for split and class names, wherever they are read, and the form they compare in (Unicode NFC).

Class order is by code point as torchvision's ``ImageFolder`` ("10" before "2"), unless a class list gives one."""

from __future__ import annotations

import collections
import unicodedata

from shardprep.preprocess.format import manifest
from shardprep.preprocess.sources.common import SourceError

MAX_CLASS_LIST_BYTES = 64 << 20  # a --classes file: a million long names fit

MAX_SPLIT_BYTES = 180  # "<split>-00000-of-00001.tfrecord" under ".tmp-<32 hex>-" stays under 255 bytes
_JOINERS = ("\u200c", "\u200d")  # zero-width non-joiner and joiner: part of words in Persian, Hindi, emoji
_OUTPUT_FILES = (manifest.MANIFEST_NAME, manifest.REJECTS_NAME)  # a split folder of that name would take their place


def canonical(name: str) -> str:
    return unicodedata.normalize("NFC", name)


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
    if not name.strip():
        return "is blank (only white space)"
    if name != name.strip():
        return "starts or ends with a space or other white space, which no listing shows"
    for char in name:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return f"contains the control character {char!r}"
        if unicodedata.category(char) == "Cf" and char not in _JOINERS:
            return (f"contains the invisible formatting character U+{ord(char):04X} ({unicodedata.name(char, '?')}; "
                    "bidi controls and zero-width characters make names that look like others)")
    if kind != "split":
        return None
    if name.casefold() in _OUTPUT_FILES:
        return (f"is the name of OUTPUT's own {name.casefold()}: a split folder of that name would take its place; "
                "pick another split name")
    if manifest.SHARD_FILES.parse_name(name, any_case=True) is not None:
        return "is named like a shard file (NAME-00000-of-00001.tfrecord); pick another split name"
    if len(encoded) > MAX_SPLIT_BYTES:
        return f"is {len(encoded)} bytes long (split names have at most {MAX_SPLIT_BYTES})"
    return None


def printable(text: str) -> str:
    """``text`` on one line: non-UTF-8 bytes, control and formatting characters as backslash escapes."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(char.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") else char for char in text)


def describe(name: str) -> str:
    return f"'{printable(name)}'"


def check(name: str, kind: str, where: str, fix: str = "") -> str:
    """``name`` in NFC if it passes the rule; else SourceError naming the ``kind``, ``where`` it was read and
    ``fix``."""
    wrong = problem(name, kind)
    if wrong is not None:
        raise SourceError(f"the {kind} name {describe(name)} from {where} {wrong}"
                          + (f": {fix}" if fix else "; split and class names must be non-empty, without '/', '\\', "
                             "control or invisible characters, surrounding spaces or a leading '.'"))
    return canonical(name)


def class_order(stored, where: str, listed: list[str] | None = None, listed_where: str = "") -> list[str]:
    """The class names (NFC) in label order: the ``stored`` names sorted by code point, or the ``listed`` order,
    which must name every stored class. A class in two spellings of one NFC name, or listed twice, is a SourceError."""
    spellings: dict[str, set[str]] = {}
    for name in stored:
        spellings.setdefault(canonical(name), set()).add(name)
    for shown, found in sorted(spellings.items()):
        if len(found) > 1:
            first, second = sorted(found)[:2]
            raise SourceError(f"the class {describe(shown)} is stored twice in {where}, spelled {ascii(first)} and "
                              f"{ascii(second)} (two Unicode forms of one name; other tools would read two classes): "
                              "rename one so that both are spelled alike")
    if listed is None:
        return [canonical(name) for name in sorted(name for found in spellings.values() for name in found)]
    order = [canonical(name) for name in listed]
    if repeated := sorted(name for name, count in collections.Counter(order).items() if count > 1):
        raise SourceError(f"{listed_where} names the class {describe(repeated[0])} twice: each class once, in the "
                          "order of its label")
    if missing := sorted(set(spellings) - set(order)):
        shown = ", ".join(describe(name) for name in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise SourceError(f"{listed_where} does not name {len(missing)} class{'es' if len(missing) > 1 else ''} "
                          f"found in {where}: {shown}; add {'them' if len(missing) > 1 else 'it'} (one name a line)")
    return order
