"""The unit journal: what a local preprocess run has finished, so that ``--resume`` keeps it after a kill.

The unit of work is the decode group (``decode_groups``): its spill file is a pure function of its inputs, the
options and the seed, and everything the later stages take from it (RecordPointers, Rejects, its share of the
RecordSummary) fits in one line. Layout, under OUTPUT/.tmp/ (deleted with the spill files when a run succeeds)::

    listing.jsonl    the listing the run started from (fingerprint.ListedEntry per line), written before the header
    journal.jsonl    line 1: the header (JournalHeader: options, tool version, listing sha256, decode groups);
                     then one UnitRecord per finished decode group, appended (under a flock) once its file is
                     written and closed; a later line for the same group replaces an earlier one, and a torn last
                     line (a kill while appending) is ignored

Nothing is fsynced. A killed process loses nothing it wrote (the kernel holds it), and after a machine crash a group
whose bytes did not reach the disk fails the size and sha256 check on resume and is decoded again: the check, not
the write order, is what makes a kept unit trustworthy. Forcing ~90 MB group files to disk one by one cost ~5% of
a local run's wall time (BENCHMARKS.md).

``--resume`` (``reopen``) compares the fingerprint and refuses, naming the first difference; the decode stage then
asks ``UnitJournal.reuse`` for each group, which gives back the recorded outputs when the group's inputs are the
same and its file has the recorded size and sha256, and otherwise deletes the damaged file so the group is redone.
Local runs only: journal lines are appended to a local file by every worker.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
from typing import NamedTuple

import numpy as np

from shardprep.pipelines.common import PreprocessError
from shardprep.pipelines.storage import (JOURNAL_NAME, SPILL_DIR, TEMPORARY_PREFIX, OutputError, atomic_write,
                                        existing_files, foreign_files, is_local)
from shardprep.preprocess import accounting, fingerprint, manifest, record_pointers, sharding, sources
from shardprep.preprocess.elements import Reject

LISTING_NAME = "listing.jsonl"
JOURNAL_VERSION = 1
_SHARD_FILE = re.compile(r".+-\d{5}-of-\d{5}" + re.escape(manifest.SHARD_SUFFIX))


class JournalHeader(NamedTuple):
    """The journal's first line: the run's fingerprint, and what a resume must reuse to cut the same groups."""

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


class UnitOutputs(NamedTuple):
    """What the decode stage emits for a kept group, as it emitted it when the group was decoded."""

    pointers: record_pointers.RecordPointers | None
    rejects: list[Reject]
    summary: sharding.RecordSummary


class ResumeCounts(NamedTuple):
    """The decode stage's counts (Beam metrics of the run): groups, groups kept, damaged groups redone, inputs
    decoded."""

    groups: int
    kept: int
    redone: int
    inputs_decoded: int


def summary_to_json(summary: sharding.RecordSummary) -> dict:
    return {"examples": summary.examples, "bytes": summary.bytes,
            "classes": [[split, label, n] for (split, label), n in sorted(summary.classes.items())],
            "pixel_sums": list(summary.pixel_sums), "max_label": summary.max_label}


def summary_from_json(data: dict) -> sharding.RecordSummary:
    summary = sharding.RecordSummary()
    summary.examples, summary.bytes = dict(data["examples"]), dict(data["bytes"])
    summary.classes = {(split, int(label)): int(n) for split, label, n in data["classes"]}
    summary.pixel_sums, summary.max_label = tuple(int(v) for v in data["pixel_sums"]), int(data["max_label"])
    return summary


# --- the journal as the workers use it -----------------------------------------------------------------------------

class UnitJournal:
    """OUTPUT/.tmp/journal.jsonl for the decode stage's workers (picklable: paths only).

    ``resume_bytes``: on ``--resume``, the journal's length when the run started; the groups recorded in it may be
    kept. None for a fresh run.
    """

    def __init__(self, output: str, resume_bytes: int | None = None):
        self.output, self.resume_bytes = output, resume_bytes
        self.path = manifest.join(output, SPILL_DIR, JOURNAL_NAME)

    def record(self, split: str, group: int, inputs_sha256: str, pointers, rejects: list[Reject],
               summary: sharding.RecordSummary) -> None:
        """Appends a finished group's line (its file already written and closed)."""
        if pointers is not None:
            records, size, sha256 = pointers.file_info
            name, columns = os.path.basename(pointers.spill_path), pointers.columns.tobytes()
        else:
            records, size, sha256, name, columns = 0, 0, "", None, b""
        unit = UnitRecord(split, group, inputs_sha256, name, size, sha256, records,
                          base64.b64encode(columns).decode("ascii"),
                          [[r.key, r.reason, r.detail] for r in rejects], summary_to_json(summary))
        append_line(self.path, json.dumps(unit._asdict(), ensure_ascii=False) + "\n")

    def recorded_units(self) -> dict[tuple[str, int], UnitRecord]:
        """The groups recorded when the run started (the last line of each), none for a fresh run."""
        if self.resume_bytes is None:
            return {}
        with open(self.path, "rb") as f:
            lines = f.read(self.resume_bytes).splitlines()[1:]
        units = {}
        for line in lines:
            try:
                unit = UnitRecord(**json.loads(line))
            except (ValueError, TypeError):
                continue  # not a line this journal wrote whole: its group is redone
            units[(unit.split, unit.group)] = unit
        return units

    def reuse(self, unit: UnitRecord, inputs_sha256: str) -> UnitOutputs | None:
        """The recorded outputs of a group whose inputs match and whose file is intact; else None, after deleting
        a damaged file (the group is decoded again into a new one)."""
        if unit.inputs_sha256 != inputs_sha256:
            return None
        pointers = None
        if unit.file is not None:
            path = manifest.join(self.output, SPILL_DIR, unit.file)
            if file_sha256(path, unit.size) != unit.sha256:
                with contextlib.suppress(OSError):
                    os.remove(path)
                return None
            columns = np.frombuffer(base64.b64decode(unit.pointers), dtype=np.uint64).reshape(-1, 4)
            pointers = record_pointers.RecordPointers(unit.split, path, columns.copy(),
                                                      (unit.records, unit.size, unit.sha256))
        rejects = [Reject(unit.split, key, reason, detail) for key, reason, detail in unit.rejects]
        return UnitOutputs(pointers, rejects, summary_from_json(unit.summary))


def file_sha256(path: str, size: int) -> str | None:
    """The sha256 of a local file that is ``size`` bytes long; None when it is missing or of another size."""
    try:
        if os.path.getsize(path) != size:
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


def append_line(path: str, line: str) -> None:
    """Appends one line to a local file shared by several processes, in one write under an exclusive flock."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = line.encode("utf-8", "surrogateescape")
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)  # releases the flock
    except OSError as e:
        raise PreprocessError(f"writing {path} failed: {type(e).__name__}: {e}") from e


# --- the launcher's side: start, or reopen for --resume ---------------------------------------------------------

def journaled(config, plan, local_runner: bool) -> bool:
    """Local runs of a local image folder into a local OUTPUT keep a journal (TFRecord sources are decoded per
    bundle, whose contents depend on the runner's scheduling: they have no units to keep)."""
    return (local_runner and plan.kind == "folder" and is_local(config.output)
            and is_local(sources.SourceSpec.parse(config.source).location))


def check_resumable(config, plan, local_runner: bool) -> None:
    """Refuses ``--resume`` where it cannot work, before anything is touched."""
    if config.overwrite:
        raise OutputError("--resume keeps OUTPUT's finished work and --overwrite deletes it: pass one of them")
    if not journaled(config, plan, local_runner):
        raise OutputError(
            "--resume works for local runs (no --runner, or a local one) of a local image folder into a local "
            "OUTPUT; on Dataflow, Beam retries failed work itself, and a killed job is rerun with --overwrite")
    _existing_journal(config.output)  # before the lock, which would create OUTPUT
    foreign = foreign_files(config.output, existing_files(config.output))
    if foreign:
        raise OutputError(f"--resume refused: {config.output} holds {foreign[0]}, which no shardprep run wrote; "
                          "move it away first")


def listing_of(config, plan) -> list[fingerprint.ListedEntry]:
    """Every entry the job reads, rejects or does not use (the class folders walked, the flat folders, the labels
    file, what lies beside the folders), keyed by source key, with each file's size and mtime."""
    root = sources.SourceSpec.parse(config.source).location
    source_root = os.path.realpath(root)
    entries = [fingerprint.ListedEntry(reject.key, -1, 0, reject.reason) for reject in plan.skipped]
    entries += [fingerprint.ListedEntry(entry.path, -1, 0, "not_used") for entry in plan.not_used]
    not_used = {entry.path for entry in plan.not_used}
    folders = [(directory, True) for _, _, directory in plan.class_dirs] + [(d, False) for _, d in plan.flat_dirs]
    for directory, recursive in folders:
        paths, skipped = accounting.walk_local(directory, recursive, source_root if recursive else None)
        entries += [fingerprint.ListedEntry(sources.printable_key(sources.source_key(root, path)), -1, 0, reason)
                    for path, reason in skipped]
        entries += [_stat_entry(sources.printable_key(sources.source_key(root, path)), path) for path in paths
                    if sources.source_key(root, path) not in not_used]
    if config.labels_file:
        entries.append(_stat_entry(f"--labels-file {config.labels_file}", config.labels_file))
    return entries


def _stat_entry(key: str, path: str) -> fingerprint.ListedEntry:
    try:
        stat = os.stat(path)
    except OSError:
        return fingerprint.ListedEntry(key, -1, 0)
    return fingerprint.ListedEntry(key, stat.st_size, stat.st_mtime_ns)


def start(config, plan, runner: str, min_decode_groups: int) -> UnitJournal:
    """Writes the listing and the journal's header into a freshly prepared OUTPUT; returns the workers' journal."""
    from shardprep.preprocess.manifest import tool_version

    text = fingerprint.listing_text(listing_of(config, plan))
    folder = manifest.join(config.output, SPILL_DIR)
    os.makedirs(folder, exist_ok=True)
    header = JournalHeader(JOURNAL_VERSION, tool_version(), fingerprint.fingerprinted_options(config, runner),
                           config.overwrite, min_decode_groups, fingerprint.listing_sha256(text), text.count("\n"))
    try:  # the listing first: a header always has its listing beside it
        atomic_write(manifest.join(folder, LISTING_NAME), text.encode("utf-8", "surrogateescape"))
        atomic_write(manifest.join(folder, JOURNAL_NAME), (json.dumps(header._asdict()) + "\n").encode("utf-8"))
    except OSError as e:
        raise PreprocessError(f"writing {folder}/{JOURNAL_NAME} failed: {type(e).__name__}: {e}") from e
    return UnitJournal(config.output)


def reopen(config, plan, runner: str) -> tuple[UnitJournal, JournalHeader]:
    """``--resume``: checks that OUTPUT holds a killed run of the same options and listing (refusing, naming the
    first difference, with nothing touched), then tidies what the kill left (a torn last line, files of unfinished
    groups, shards' temporaries) and puts back group files that had already been renamed into shards."""
    output = config.output
    path = _existing_journal(output)
    with open(path, "rb") as f:
        data = f.read()
    header = _header(data, path)
    difference = _difference(config, plan, runner, header)
    if difference:
        raise OutputError(f"--resume refused: {difference}, compared with the run that stopped in {output}; resume "
                          "with the same SOURCE, inputs and options, or rerun with --overwrite")
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) != len(data):  # a kill while appending: the torn line is dropped
        os.truncate(path, len(complete))
    journal = UnitJournal(output, len(complete))
    _tidy(output, journal.recorded_units())
    return journal, header


def _existing_journal(output: str) -> str:
    """OUTPUT/.tmp/journal.jsonl, or a clear refusal when OUTPUT holds no run to resume."""
    path = manifest.join(output, SPILL_DIR, JOURNAL_NAME)
    if not os.path.isfile(path):
        if os.path.isfile(manifest.join(output, manifest.MANIFEST_NAME)):
            raise OutputError(f"nothing to resume in {output}: it holds a finished dataset (manifest.json); run "
                              "without --resume (with --overwrite to make it again)")
        raise OutputError(f"nothing to resume in {output} (no {SPILL_DIR}/{JOURNAL_NAME} of a stopped run); run "
                          "without --resume")
    return path


def _header(data: bytes, path: str) -> JournalHeader:
    try:
        header = JournalHeader(**json.loads(data.split(b"\n", 1)[0]))
    except (ValueError, TypeError):
        raise OutputError(f"{path} does not start with a journal header shardprep understands; rerun with "
                          "--overwrite") from None
    if header.version != JOURNAL_VERSION:
        raise OutputError(f"{path} is a journal of version {header.version}, this shardprep writes "
                          f"{JOURNAL_VERSION}; rerun with --overwrite")
    return header


def _difference(config, plan, runner: str, header: JournalHeader) -> str | None:
    """The first difference between the killed run's fingerprint and this run's, in words; None if the same."""
    if header.tool_version != manifest.tool_version():
        return f"shardprep's version changed ({header.tool_version} -> {manifest.tool_version()})"
    changed = fingerprint.options_difference(header.options, fingerprint.fingerprinted_options(config, runner))
    if changed:
        return changed
    text = fingerprint.listing_text(listing_of(config, plan))
    if fingerprint.listing_sha256(text) == header.listing_sha256:
        return None
    try:
        with open(manifest.join(config.output, SPILL_DIR, LISTING_NAME), encoding="utf-8",
                  errors="surrogateescape") as f:
            old = [fingerprint.ListedEntry.from_line(line) for line in f]
    except (OSError, ValueError):
        return "the listing of SOURCE changed (the killed run's listing.jsonl is missing or damaged)"
    new = [fingerprint.ListedEntry.from_line(line) for line in text.splitlines()]
    return fingerprint.listing_difference(old, new) or "the listing of SOURCE changed"


def _tidy(output: str, units: dict[tuple[str, int], UnitRecord]) -> None:
    """Deletes what no kept group needs (files of unfinished groups, shards' temporaries) and moves group files
    that a shard writer had renamed into place back under OUTPUT/.tmp/ (found by size and sha256)."""
    folder = manifest.join(output, SPILL_DIR)
    wanted = {unit.file: unit for unit in units.values() if unit.file is not None}
    for name in os.listdir(folder):
        if name not in wanted and name not in (JOURNAL_NAME, LISTING_NAME):
            os.remove(os.path.join(folder, name))
    missing = {}
    for name, unit in wanted.items():
        if not os.path.exists(os.path.join(folder, name)):
            missing.setdefault((unit.size, unit.sha256), name)
    for split_folder in sorted({unit.split for unit in units.values()}):
        directory = os.path.join(output, split_folder)
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            path = os.path.join(directory, name)
            if name.startswith(TEMPORARY_PREFIX):
                os.remove(path)  # a shard the kill interrupted
            elif missing and _SHARD_FILE.fullmatch(name) and any(size == os.path.getsize(path) for size, _ in missing):
                found = missing.pop((os.path.getsize(path), file_sha256(path, os.path.getsize(path))), None)
                if found is not None:
                    os.rename(path, os.path.join(folder, found))
