"""The unit journal's lines, written sealed and read back as untrusted input: a bad header refuses the resume, a bad
unit line (its ``line_sha256`` seals it to the header against edits and mix-ups, not forgery) is decoded again."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from typing import NamedTuple

import numpy as np

from shardprep.preprocess.checks import names
from shardprep.preprocess.format import sharding

JOURNAL_VERSION = 2  # 2: every unit line sealed with LINE_HASH
LINE_HASH = "line_sha256"
SPILL_FILE = re.compile(r"spill-[0-9a-f]{32}\.records")  # spill.SpillWriter's names, and the only ones kept
MAX_DECODE_GROUPS = 1 << 20  # far above any run's (64 remote, twice the workers locally), far below a hang
_HEX64 = re.compile(r"[0-9a-f]{64}")
_POINTER_BYTES = 32  # four uint64 columns a record: sort key high, low, offset, size


class JournalHeader(NamedTuple):
    """The journal's first line: the run's fingerprint, and what a resume reuses to cut the same groups."""

    version: int
    tool_version: str
    options: dict  # fingerprint.fingerprinted_options
    overwrite: bool  # the killed run's --overwrite, so that the manifest records the command that was run
    min_decode_groups: int
    listing_sha256: str
    num_listed: int


class UnitRecord(NamedTuple):
    """A journal line: one finished decode group, its file and what the decode stage emitted for it."""

    split: str
    group: int
    inputs_sha256: str  # fingerprint.inputs_sha256 of the group's inputs
    file: str | None  # the spill file's name under OUTPUT/.tmp/ (None: every input was rejected)
    size: int
    sha256: str
    records: int
    pointers: str  # base64 of the RecordPointers' uint64 columns
    rejects: list  # [key, reason, detail] per rejected input
    summary: dict  # the group's RecordSummary (summary_to_json)


class DamagedUnit(NamedTuple):
    """A unit line that failed a check (``why``): its group is decoded again."""

    split: str
    group: int
    why: str


class JournalError(ValueError):
    """The journal's header cannot be read as one shardprep wrote; the message says why, for the user."""


def line_hash(header_line: bytes, fields: dict) -> str:
    """The sha256 sealing a unit line: its header line (without the newline) and its own fields."""
    canonical = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(b"shardprep journal line\0" + header_line + b"\0"
                          + canonical.encode("utf-8", "surrogatepass")).hexdigest()


def sealed(header_line: bytes, fields: dict) -> dict:
    """``fields`` with their ``LINE_HASH`` under ``header_line``, as written to the journal."""
    return {**fields, LINE_HASH: line_hash(header_line, fields)}


def summary_to_json(summary: sharding.RecordSummary) -> dict:
    return {"examples": summary.examples, "bytes": summary.bytes,
            "classes": [[split, label, n] for (split, label), n in sorted(summary.classes.items())],
            "pixel_sums": list(summary.pixel_sums), "max_label": summary.max_label}


def summary_from_json(data: dict) -> sharding.RecordSummary:
    return sharding.RecordSummary(dict(data["examples"]), dict(data["bytes"]),
                                  {(split, int(label)): int(n) for split, label, n in data["classes"]},
                                  tuple(int(v) for v in data["pixel_sums"]), int(data["max_label"]))


def pointer_columns(unit: UnitRecord) -> np.ndarray:
    """The unit's RecordPointers columns (records x 4 uint64)."""
    return np.frombuffer(base64.b64decode(unit.pointers), dtype=np.uint64).reshape(-1, 4).copy()


def _is_count(value) -> bool:
    return type(value) is int and value >= 0  # not bool, not float (NaN, 1e400)


def _is_hex64(value) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def parse_header(line: bytes, path: str) -> JournalHeader:
    """The header of a journal's first line (without its newline); JournalError unless shardprep wrote it so."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a line of 100,000 nested brackets
        data = None
    if not isinstance(data, dict) or set(data) != set(JournalHeader._fields):
        raise JournalError(f"{path} does not start with a journal header shardprep understands")
    if data["version"] != JOURNAL_VERSION:
        raise JournalError(f"{path} is a journal of version {data['version']!r}, this shardprep writes "
                           f"{JOURNAL_VERSION}")
    problems = [name for name, ok in (
        ("tool_version", isinstance(data["tool_version"], str)), ("options", isinstance(data["options"], dict)),
        ("overwrite", type(data["overwrite"]) is bool),
        ("min_decode_groups", _is_count(data["min_decode_groups"])
         and 1 <= data["min_decode_groups"] <= MAX_DECODE_GROUPS),
        ("listing_sha256", _is_hex64(data["listing_sha256"])), ("num_listed", _is_count(data["num_listed"])))
        if not ok]
    if problems:
        raise JournalError(f"{path}: its journal header has a {problems[0]} no run writes "
                           f"({json.dumps(data[problems[0]])[:60]})")
    return JournalHeader(**data)


def parse_unit(line: bytes, header_line: bytes) -> UnitRecord | DamagedUnit | None:
    """A unit line read back: a UnitRecord that passed every check, a DamagedUnit, or None if it names no group."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("split"), str) or not _is_count(data.get("group")):
        return None
    split, group = data["split"], data["group"]
    if set(data) != set(UnitRecord._fields) | {LINE_HASH}:
        return DamagedUnit(split, group, "its fields are not a unit line's")
    fields = {name: data[name] for name in UnitRecord._fields}
    if data[LINE_HASH] != line_hash(header_line, fields):
        return DamagedUnit(split, group, "its hash does not match its fields (edited, or of another run)")
    unit = UnitRecord(**fields)
    why = _unit_problem(unit)
    return DamagedUnit(split, group, why) if why else unit


def _unit_problem(unit: UnitRecord) -> str | None:
    """What is inconsistent in a sealed unit line (a line a forger re-hashed must still hang together)."""
    if names.problem(unit.split, "split") or not _is_hex64(unit.inputs_sha256):
        return "its split or inputs hash is not one a run writes"
    if not (_is_count(unit.size) and _is_count(unit.records) and isinstance(unit.pointers, str)):
        return "its size, records or pointers are not of their types"
    if unit.file is None:
        if unit.records or unit.size or unit.sha256 or unit.pointers:
            return "it has records but no file"
    elif not (isinstance(unit.file, str) and SPILL_FILE.fullmatch(unit.file) and _is_hex64(unit.sha256)
              and unit.records):
        return "its file is not a spill file's bare name (spill-<32 hex>.records) with records and a sha256"
    return _pointers_problem(unit) or _rejects_problem(unit.rejects) or _summary_problem(unit)


def _pointers_problem(unit: UnitRecord) -> str | None:
    try:
        raw = base64.b64decode(unit.pointers, validate=True)
    except (binascii.Error, ValueError):
        return "its pointers are not base64"
    if len(raw) != unit.records * _POINTER_BYTES:
        return "its pointers are not one per record"
    if not unit.records:
        return None
    high, low, offsets, sizes = np.frombuffer(raw, dtype=np.uint64).reshape(-1, 4).T
    if (sizes > unit.size).any() or int(sizes.sum(dtype=np.uint64)) != unit.size:
        return "its records' sizes do not add up to its file's"
    if not np.array_equal(offsets, np.concatenate(([0], np.cumsum(sizes, dtype=np.uint64)[:-1])).astype(np.uint64)):
        return "its records do not follow each other in its file"
    if not ((high[1:] > high[:-1]) | ((high[1:] == high[:-1]) & (low[1:] > low[:-1]))).all():
        return "its records are not in seeded order"
    return None


def _rejects_problem(rejects) -> str | None:
    if not isinstance(rejects, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(v, str) for v in r) for r in rejects):
        return "its rejects are not [key, reason, detail] lists"
    return None


def _summary_problem(unit: UnitRecord) -> str | None:
    summary = unit.summary
    if not isinstance(summary, dict) or set(summary) != {"examples", "bytes", "classes", "pixel_sums", "max_label"}:
        return "its summary is not a record summary"
    classes = summary["classes"]
    if not (isinstance(classes, list) and all(
            isinstance(c, list) and len(c) == 3 and c[0] == unit.split and _is_count(c[1]) and _is_count(c[2])
            for c in classes)):
        return "its class counts are not [split, label, count] of its split"
    labels = [label for _, label, _ in classes]
    expected = {unit.split: unit.records} if unit.records else {}
    checks = (
        summary["examples"] == expected,
        isinstance(summary["bytes"], dict) and set(summary["bytes"]) == set(expected)
        and all(_is_count(v) for v in summary["bytes"].values()),
        sum(n for _, _, n in classes) == unit.records and len(set(labels)) == len(labels),
        summary["max_label"] == (max(labels) if labels else -1),
        isinstance(summary["pixel_sums"], list) and len(summary["pixel_sums"]) in (0, 7)
        and all(_is_count(v) for v in summary["pixel_sums"]))
    if not all(checks):
        return "its summary does not agree with its records"
    return None
