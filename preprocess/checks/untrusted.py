"""Files shardprep wrote and reads back, read as untrusted input: JSON within bounds (size, nesting, finite numbers,
valid UTF-8, no repeated key), and only regular files (a FIFO would block, ``/dev/zero`` never ends)."""

from __future__ import annotations

import json
import os
import re
import stat

import numpy as np

from shardprep.preprocess.sources.common import is_utf8

MAX_DEPTH = 64
MAX_INT_DIGITS = 100
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UntrustedJSONError(ValueError):
    """A JSON file we read back is not what we write; the message names the file and the cause."""


class NotRegularFileError(OSError):
    """A path that should be a regular file is a FIFO, a device, a folder or a socket (or too large); ``reason`` is
    the message without the path."""
    def __init__(self, path: str, reason: str):
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


class _Refused:
    """A refused value the parser met, until the walk finds where it is."""
    def __init__(self, why: str):
        self.why = why


def _number(text: str):
    value = float(text)
    return value if np.isfinite(value) else _Refused(f"is {text}, which overflows to infinity: numbers must be "
                                                     "finite")


def _integer(text: str):
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Refused(f"is an integer of {digits:,} digits (at most {MAX_INT_DIGITS} allowed)")
    return int(text)


def depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def json_loads(data: str | bytes, *, source: str, max_bytes: int, max_depth: int = MAX_DEPTH,
               expected: str = "a file shardprep writes"):
    """The JSON document in ``data`` read from ``source`` (named in every error), within the bounds above; else
    UntrustedJSONError. ``expected``: what the file should be, for the nesting error."""
    if len(data) > max_bytes:
        raise UntrustedJSONError(f"{source}: is {len(data):,} bytes, more than the {max_bytes:,} bytes allowed")
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise UntrustedJSONError(f"{source}: is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                                     f"{e.start})") from None
    if depth(data) > max_depth:
        raise UntrustedJSONError(f"{source}: nested deeper than {max_depth} levels (arrays or objects inside each "
                                 f"other): not {expected}")

    def pairs(items):
        document = {}
        for key, value in items:
            if key in document:
                shown = repr(key) if is_utf8(key) else ascii(key)
                raise UntrustedJSONError(f"{source}: key {shown} appears twice in one object")
            document[key] = value
        return document

    try:
        document = json.loads(data, object_pairs_hook=pairs, parse_float=_number, parse_int=_integer,
                              parse_constant=lambda name: _Refused(f"is {name}, not a number: numbers must be finite"))
    except json.JSONDecodeError as e:
        raise UntrustedJSONError(f"{source}: not valid JSON: {e}") from None
    except RecursionError:  # the parser's own limit, should it be below max_depth
        raise UntrustedJSONError(f"{source}: nested too deeply to parse") from None
    _check_values(document, source)
    return document


def _check_values(document, source: str) -> None:
    """Raises for the first refused number or lone surrogate, in document order, naming its path."""
    stack = [(document, "")]
    while stack:
        value, path = stack.pop()
        where = path or "the document"
        if isinstance(value, dict):
            for key in value:
                if not is_utf8(key):
                    raise UntrustedJSONError(f"{source}: key {ascii(key)} in {where} holds a lone surrogate, not "
                                             "valid Unicode")
            stack.extend(reversed([(child, f"{path}.{key}" if path else key) for key, child in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([(child, f"{path}[{index}]") for index, child in enumerate(value)]))
        elif isinstance(value, _Refused):
            raise UntrustedJSONError(f"{source}: {where} {value.why}")
        elif isinstance(value, str) and not is_utf8(value):
            raise UntrustedJSONError(f"{source}: {where} {ascii(value)[:60]} holds a lone surrogate, not valid "
                                     "Unicode")


def _kind(mode: int) -> str | None:
    return next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def file_kind(path: str) -> str:
    """What ``path`` is, for a message: ``a file`` (a regular one), ``a folder``, ``a FIFO (named pipe)``, ..."""
    try:
        return _kind(os.stat(path).st_mode) or "a file"
    except OSError:
        return "a file"


def open_regular_file(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a regular file (links followed); else NotRegularFileError. A FIFO
    is never waited on, a device never opened."""
    kind = _kind(os.stat(path).st_mode)
    if kind is None:
        # O_NONBLOCK: should a FIFO replace the file between the stat and the open, the open does not wait.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        kind = _kind(os.fstat(descriptor).st_mode)
        if kind is None:
            os.set_blocking(descriptor, True)
            return descriptor
        os.close(descriptor)
    raise NotRegularFileError(path, f"is {kind}, not a regular file")


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` (else NotRegularFileError)."""
    descriptor = open_regular_file(path)
    with os.fdopen(descriptor, "rb") as f:
        size = os.fstat(descriptor).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
        size = max(size, len(data))
    if size > max_bytes:
        raise NotRegularFileError(path, f"is {size:,} bytes, more than the {max_bytes:,} bytes allowed")
    return data
