"""The unit journal: OUTPUT/.tmp/listing.jsonl, then journal.jsonl (a header, then one sealed ``UnitRecord`` per
finished decode group, the last line for a group counting), so that ``--resume`` keeps finished groups. Nothing is
fsynced (~5 % of a run): a group whose bytes never reached the disk fails its checks and is decoded again."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import stat
from typing import NamedTuple

from shardprep.pipelines.preprocess_job import exclude
from shardprep.pipelines.preprocess_job.common import PreprocessError
from shardprep.pipelines.runtime.journal_records import (JOURNAL_VERSION, DamagedUnit, JournalError, JournalHeader,
                                                         UnitRecord, parse_header, parse_unit, pointer_columns, sealed,
                                                         summary_from_json, summary_to_json)
from shardprep.pipelines.runtime.storage import (JOURNAL_NAME, SPILL_DIR, OutputError, atomic_write, deletable,
                                        existing_files, foreign_files, is_local, regular_entries)
from shardprep.preprocess.format import fingerprint, manifest, record_pointers, sharding
from shardprep.preprocess.format.elements import Reject

LISTING_NAME = "listing.jsonl"


class UnitOutputs(NamedTuple):
    """What the decode stage emitted for a kept group."""

    pointers: record_pointers.RecordPointers | None
    rejects: list[Reject]
    summary: sharding.RecordSummary


class ResumeCounts(NamedTuple):
    """The decode stage's counts (Beam metrics): groups, kept, damaged and redone, inputs decoded."""

    groups: int
    kept: int
    redone: int
    inputs_decoded: int


class UnitJournal:
    """The journal for the decode stage's workers (picklable). ``resume_bytes``: on ``--resume``, its length at the
    start, else None; ``header_line``: what every line's hash covers."""

    def __init__(self, output: str, resume_bytes: int | None = None, header_line: bytes = b""):
        self.output, self.resume_bytes, self.header_line = output, resume_bytes, header_line
        self.path = manifest.join(output, SPILL_DIR, JOURNAL_NAME)

    def record(self, split: str, group: int, inputs_sha256: str, pointers, rejects: list[Reject],
               summary: sharding.RecordSummary) -> None:
        """Appends a finished group's line, sealed (its file already written and closed)."""
        if pointers is not None:
            records, size, sha256 = pointers.file_info
            name, columns = os.path.basename(pointers.spill_path), pointers.columns.tobytes()
        else:
            records, size, sha256, name, columns = 0, 0, "", None, b""
        unit = UnitRecord(split, group, inputs_sha256, name, size, sha256, records,
                          base64.b64encode(columns).decode("ascii"),
                          [[r.key, r.reason, r.detail] for r in rejects], summary_to_json(summary))
        append_line(self.path, json.dumps(sealed(self.header_line, unit._asdict()), ensure_ascii=False) + "\n")

    def recorded_units(self) -> dict[tuple[str, int], UnitRecord | DamagedUnit]:
        """The groups recorded when the run started (each one's last line, checked; a damaged one a DamagedUnit)."""
        if self.resume_bytes is None:
            return {}
        with open(self.path, "rb") as f:
            lines = f.read(self.resume_bytes).splitlines()[1:]
        units = (parse_unit(line, self.header_line) for line in lines)  # None: not a line it wrote whole: redone
        return {(unit.split, unit.group): unit for unit in units if unit is not None}

    def reuse(self, unit: UnitRecord | DamagedUnit, inputs_sha256: str) -> UnitOutputs | None:
        """A group's recorded outputs if its line passed, its inputs match and its file is intact; else None, a
        damaged file deleted."""
        if isinstance(unit, DamagedUnit) or unit.inputs_sha256 != inputs_sha256:
            return None
        pointers = None
        if unit.file is not None:
            path = manifest.join(self.output, SPILL_DIR, unit.file)  # a bare spill-file name: parse_unit checked
            if file_sha256(path, unit.size) != unit.sha256:
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        os.remove(path)
                return None
            pointers = record_pointers.RecordPointers(unit.split, path, pointer_columns(unit),
                                                      (unit.records, unit.size, unit.sha256))
        rejects = [Reject(unit.split, key, reason, detail) for key, reason, detail in unit.rejects]
        return UnitOutputs(pointers, rejects, summary_from_json(unit.summary))


def _open_regular(path: str):
    """``path`` open for reading, None when it is not a regular file (no link followed, no FIFO waited on)."""
    f = open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")  # noqa: SIM115 - returned open
    if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        return f
    f.close()
    return None


def file_sha256(path: str, size: int) -> str | None:
    """The sha256 of a local regular file of ``size`` bytes; None otherwise."""
    try:
        f = _open_regular(path)
        if f is None:
            return None
        with f:
            return hashlib.file_digest(f, "sha256").hexdigest() if os.fstat(f.fileno()).st_size == size else None
    except OSError:
        return None


def append_line(path: str, line: str) -> None:
    """Appends one line to a file shared by several processes, under an exclusive flock."""
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


def journaled(config, plan, local_runner: bool) -> bool:
    """Local runs into a local OUTPUT of a source its kind can resume keep a journal."""
    return local_runner and is_local(config.output) and plan.kind.resume_refusal(plan) is None


def check_resumable(config, plan, local_runner: bool) -> None:
    """Refuses ``--resume`` before anything is touched (with --overwrite, a remote run, a source its kind cannot
    resume, a foreign file in OUTPUT, or no stopped run)."""
    if config.overwrite:
        raise OutputError("--resume keeps OUTPUT's finished work and --overwrite deletes it: pass one of them")
    if not local_runner or not is_local(config.output):
        raise OutputError(
            "--resume works for local runs (no --runner, or a local one) of a local image folder into a local "
            "OUTPUT; on Dataflow, Beam retries failed work itself, and a killed job is rerun with --overwrite")
    if refusal := plan.kind.resume_refusal(plan):
        raise OutputError(f"--resume refused: {refusal}; rerun with --overwrite")
    if foreign := foreign_files(config.output, existing_files(config.output)):
        raise OutputError(f"--resume refused: {config.output} holds {foreign[0]}, which no shardprep run wrote; "
                          "move it away first (nothing was deleted)")
    if not _finished(config.output):
        _existing_journal(config.output)


def start(config, plan, runner: str, min_decode_groups: int, listing: list) -> UnitJournal:
    """Writes the listing and the journal's header into a freshly prepared OUTPUT; the workers' journal."""
    text = fingerprint.listing_text(listing)
    folder = manifest.join(config.output, SPILL_DIR)
    header = JournalHeader(JOURNAL_VERSION, manifest.tool_version(), exclude.fingerprinted_options(config, runner),
                           config.overwrite, min_decode_groups, fingerprint.listing_sha256(text), text.count("\n"))
    header_line = json.dumps(header._asdict()).encode("utf-8")
    try:  # the listing first: a header always has its listing beside it
        os.mkdir(folder)  # prepare_output left OUTPUT holding no .tmp: a link or folder there now is not ours
        atomic_write(manifest.join(folder, LISTING_NAME), text.encode("utf-8", "surrogateescape"))
        atomic_write(manifest.join(folder, JOURNAL_NAME), header_line + b"\n")
    except OSError as e:
        raise PreprocessError(f"writing {folder}/{JOURNAL_NAME} failed: {type(e).__name__}: {e}") from e
    return UnitJournal(config.output, header_line=header_line)


class Reopened(NamedTuple):
    """The stopped run's journal and header, or a ``finished`` run's leftovers removed; ``recorded``: its groups."""

    journal: UnitJournal | None
    header: JournalHeader | None
    finished: bool
    recorded: int


def reopen(config, runner: str, begin, listing: list) -> Reopened:
    """``--resume``, under the lock: a finished run's leftovers removed, or a killed run of the same options and
    listing reopened and tidied (else refused, naming the first difference); ``begin()`` once the checks passed."""
    output = config.output
    if _finished(output):
        problem = _manifest_problem(output)
        if problem and os.path.lexists(manifest.join(output, SPILL_DIR, JOURNAL_NAME)):
            raise OutputError(f"--resume refused: {output} holds the journal of a stopped run beside a manifest.json "
                              f"that {problem}; nothing was deleted: move manifest.json away to resume the run, or "
                              "rerun with --overwrite")
        begin()
        return finish_committed(output)
    path = _existing_journal(output)
    data = _read_journal(path)
    header_line = data.split(b"\n", 1)[0]
    try:
        header = parse_header(header_line, path)
    except JournalError as e:
        raise OutputError(f"{e}; the run it records cannot be checked: rerun with --overwrite") from None
    if difference := _difference(config, runner, header, listing):
        raise OutputError(f"--resume refused: {difference}, compared with the run that stopped in {output}; resume "
                          "with the same SOURCE, inputs and options, or rerun with --overwrite")
    begin()
    journal, complete = _journal_of(output, data), data.rfind(b"\n") + 1
    try:
        if complete != len(data):  # a kill while appending: the torn line is dropped
            os.truncate(path, complete)
        units = journal.recorded_units()
        _tidy(output, units)
    except OSError as e:  # a read-only or full disk: one line, the journal kept for the next try
        raise OutputError(f"--resume could not tidy {output}: {e}; the stopped run's journal is kept") from None
    return Reopened(journal, header, False, len(units))


class KeptWork(NamedTuple):
    """What ``--resume`` would keep of a stopped run: its intact groups' inputs."""

    inputs: int  # records and rejects
    groups: int


def kept_work(output: str) -> KeptWork | None:
    """The finished work OUTPUT's journal keeps (lines that pass their checks); None without a journal."""
    path = manifest.join(output, SPILL_DIR, JOURNAL_NAME)
    if not os.path.isfile(path):
        return None
    units = _journal_of(output, _read_journal(path)).recorded_units().values()
    intact = [unit for unit in units if isinstance(unit, UnitRecord)]
    return KeptWork(sum(unit.records + len(unit.rejects) for unit in intact), len(intact))


def _journal_of(output: str, data: bytes) -> UnitJournal:
    """The journal whose bytes are ``data``, its groups those of its complete lines."""
    return UnitJournal(output, data.rfind(b"\n") + 1, data.split(b"\n", 1)[0])


def _finished(output: str) -> bool:
    """True when OUTPUT holds a manifest (written last)."""
    return os.path.isfile(manifest.join(output, manifest.MANIFEST_NAME))


def _manifest_problem(output: str) -> str | None:
    """Why OUTPUT's manifest.json does not fit the shards beside it; None when it does."""
    from shardprep.preprocess.format.dataset import load_manifest

    try:
        written = load_manifest(output)
    except (manifest.ManifestError, OSError) as e:  # each names the file: OUTPUT's manifest.json, named already
        return f"cannot be read ({str(e).removeprefix(manifest.manifest_path(output) + ': ')[:120]})"
    if written.num_inputs is None or not any(split.shards for split in written.splits.values()):
        return "is not one preprocess writes (no shards, or no num_inputs)"
    for name, split in written.splits.items():
        for shard in split.shards:
            path = manifest.join(output, shard.file)
            if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) != shard.num_bytes:
                return f"lists {shard.file} of split {name}, which is missing or of another size"
    return None


def finish_committed(output: str) -> Reopened:
    """A run killed after its manifest: removes what is left under OUTPUT/.tmp/ (the journal last)."""
    from shardprep.pipelines.runtime import spill

    folder = manifest.join(output, SPILL_DIR)
    try:
        recorded = 0
        if JOURNAL_NAME in regular_entries(folder):  # its groups, each line's checks aside: the dataset holds them
            with open(manifest.join(folder, JOURNAL_NAME), "rb") as f:
                recorded = len(_journal_of(output, f.read()).recorded_units())
        spill.remove_local_spill(output)
    except OSError as e:
        raise OutputError(f"{output} holds a finished dataset, but removing its {SPILL_DIR}/ failed: {e}") from None
    return Reopened(None, None, True, recorded)


def _existing_journal(output: str) -> str:
    """OUTPUT/.tmp/journal.jsonl, or a clear refusal when OUTPUT holds no run to resume."""
    path = manifest.join(output, SPILL_DIR, JOURNAL_NAME)
    if not os.path.isfile(path):
        if shards := [p for p in existing_files(output) if p.endswith(manifest.SHARD_SUFFIX)]:
            held, them, they = ((f"a shard ({shards[0]})", "it", "it") if len(shards) == 1 else
                                (f"{len(shards):,} shards ({shards[0]}, ...)", "them", "they"))
            raise OutputError(f"nothing to resume in {output}: it holds {held} but neither a manifest.json nor the "
                              f"{SPILL_DIR}/{JOURNAL_NAME} of the run that wrote {them}, so {they} cannot be checked; "
                              "rerun with --overwrite")
        raise OutputError(f"nothing to resume in {output} (no {SPILL_DIR}/{JOURNAL_NAME} of a stopped run); run "
                          "without --resume")
    return path


def _read_journal(path: str) -> bytes:
    try:
        f = _open_regular(path)
    except OSError as e:
        raise OutputError(f"cannot read {path}: {e.strerror or e}; rerun with --overwrite") from None
    if f is None:
        raise OutputError(f"{path} is not a regular file: no shardprep run wrote it; remove it yourself")
    with f:
        return f.read()


def _difference(config, runner: str, header: JournalHeader, listing: list) -> str | None:
    """The first difference between the killed run's fingerprint and this run's, in words."""
    if header.tool_version != manifest.tool_version():
        return f"shardprep's version changed ({header.tool_version} -> {manifest.tool_version()})"
    if changed := fingerprint.options_difference(header.options, exclude.fingerprinted_options(config, runner)):
        return changed
    text = fingerprint.listing_text(listing)
    if fingerprint.listing_sha256(text) == header.listing_sha256:
        return None
    try:
        with open(manifest.join(config.output, SPILL_DIR, LISTING_NAME), encoding="utf-8",
                  errors="surrogateescape") as f:
            old = [fingerprint.ListedEntry.from_line(line) for line in f]
    except (OSError, ValueError, TypeError, RecursionError, OverflowError):
        return "the listing of SOURCE changed (the killed run's listing.jsonl is missing or damaged)"
    new = [fingerprint.ListedEntry.from_line(line) for line in text.splitlines()]
    return fingerprint.listing_difference(old, new) or "the listing of SOURCE changed"


def _tidy(output: str, units: dict) -> None:
    """Deletes what no kept group needs (all written again) and moves kept group files a shard writer had adopted
    back (found by size and sha256)."""
    folder = manifest.join(output, SPILL_DIR)
    wanted = {unit.file: unit for unit in units.values() if isinstance(unit, UnitRecord) and unit.file is not None}
    for name in regular_entries(folder):
        if name not in wanted and name not in (JOURNAL_NAME, LISTING_NAME) and deletable(f"{SPILL_DIR}/{name}"):
            os.remove(os.path.join(folder, name))
    missing: dict = {}
    for name, unit in wanted.items():
        if not os.path.lexists(os.path.join(folder, name)):
            missing.setdefault((unit.size, unit.sha256), name)
    for top in sorted(os.listdir(output)):
        directory = os.path.join(output, top)
        if top == SPILL_DIR or os.path.islink(directory) or not os.path.isdir(directory):
            if top != SPILL_DIR and top.startswith(".tmp-") and deletable(top) and os.path.isfile(directory):
                os.remove(directory)  # a manifest or rejects file the kill interrupted
            continue
        for name in regular_entries(directory):
            if deletable(f"{top}/{name}"):
                _put_back_or_remove(os.path.join(directory, name), folder, missing)
        if not os.listdir(directory):
            os.rmdir(directory)


def _put_back_or_remove(path: str, folder: str, missing: dict) -> None:
    """A kept group's file adopted as a shard goes back under ``folder``; any other shard-named file is deleted."""
    size = os.path.getsize(path)
    if missing and any(size == wanted_size for wanted_size, _ in missing):
        found = missing.pop((size, file_sha256(path, size)), None)
        if found is not None:
            os.rename(path, os.path.join(folder, found))
            return
    os.remove(path)
