"""Where the preprocess job may write: OUTPUT apart from every input (``keep_apart``), files that appear whole
(``atomic_write``), and what ``--overwrite`` may delete (``deletable``: only regular files and folders a run writes;
a link, FIFO or device is refused, never followed). The lock and ``OutputError``: ``checks.owned_folder``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import stat
import uuid
from typing import Iterable, NamedTuple

from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.preprocess.format import manifest
from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.checks.owned_folder import OutputError  # noqa: F401 - the one error of an output folder

SPILL_DIR = ".tmp"  # OUTPUT/.tmp/: decode groups' spill files while a run writes
JOURNAL_NAME = "journal.jsonl"  # OUTPUT/.tmp/journal.jsonl: a local run's finished decode groups (pipelines/journal)
_TOP_LEVEL_FILES = (manifest.MANIFEST_NAME, manifest.REJECTS_NAME, manifest.LOCK_NAME)
# What a run writes under OUTPUT/.tmp/: spill files, the journal and listing, and their atomic_write temporaries.
_SPILL_ENTRY = re.compile(r"spill-[0-9a-f]+\.records|journal\.jsonl|listing\.jsonl"
                          r"|\.tmp-[0-9a-f]+-(journal|listing)\.jsonl")
_TOP_LEVEL_TEMPORARY = re.compile(r"\.tmp-[0-9a-f]+-(" + re.escape(manifest.MANIFEST_NAME) + "|"
                                  + re.escape(manifest.REJECTS_NAME) + ")")
_CHANGES_INPUT = "writing there would change or delete the input; pick an OUTPUT outside every input"


def is_local(path: str) -> bool:
    """True for a path on this machine's file system (no scheme, or file://)."""
    return FileSystems.get_scheme(path) in (None, "file")


TEMPORARY_PREFIX = ".tmp-"  # ".tmp-<32 hex>-<name>": a file atomic_write has not finished, beside its final name


class Written(NamedTuple):
    """What ``atomic_write`` wrote: bytes, chunks (a shard's records) and the sha256 hex digest of the whole file."""

    num_bytes: int
    num_chunks: int
    sha256: str


def list_files(directory: str) -> list[str]:
    """Every file under ``directory`` (recursively), relative to it; local and ``gs://`` alike."""
    directory = directory.rstrip("/")
    try:
        matched = FileSystems.match([manifest.join(directory, "**")])[0].metadata_list
    except BeamIOError:
        return []
    prefix = directory + "/"
    return sorted(meta.path[len(prefix):] for meta in matched if meta.path.startswith(prefix))


def temporary_path(path: str) -> str:
    """The name ``path`` is written under until it is complete: ``.tmp-<uuid>-<name>`` in the same folder."""
    folder, name = posixpath.split(path)
    return posixpath.join(folder, f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}-{name}")


def atomic_write(path: str, data: bytes | Iterable[bytes], mime_type: str = "application/octet-stream") -> Written:
    """Writes ``data`` (bytes or byte chunks) under ``temporary_path(path)``, then renames it to ``path``; on any error
    the temporary is deleted and ``path`` left as it was."""
    chunks = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
    temporary = temporary_path(path)
    digest, num_bytes, num_chunks = hashlib.sha256(), 0, 0
    try:
        with FileSystems.create(temporary, mime_type=mime_type, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                num_bytes += len(chunk)
                num_chunks += 1
        FileSystems.rename([temporary], [path])
    except BaseException:
        with contextlib.suppress(Exception):
            FileSystems.delete([temporary])
        raise
    return Written(num_bytes, num_chunks, digest.hexdigest())


def resolved(path: str) -> str:
    """A path to compare: local ones real and absolute, remote ones normalized; ``file://`` URLs as local."""
    path = path.removeprefix("file://")
    if is_local(path):
        return os.path.realpath(os.path.abspath(path))  # no '~': the job does not expand it either
    return owned_folder.normalized_url(path)


def inside(path: str, folder: str) -> bool:
    """True when resolved ``path`` is resolved ``folder`` or under it, by whole components."""
    return path == folder or path.startswith(folder if folder.endswith("/") else folder + "/")


def overlap(output: str, input_path: str) -> str | None:
    """How OUTPUT overlaps an input: 'is', 'contains', 'is inside', or None when they are apart."""
    out, other = resolved(output), resolved(input_path)
    if out == other:
        return "is"
    if inside(other, out):
        return "contains"
    if inside(out, other):
        return "is inside"
    return None


def glob_folder(pattern: str) -> str:
    """The folder part of a glob before its first wildcard (``data/train-*.tfrecord`` gives ``data``)."""
    head = re.split(r"[*?\[]", pattern, 1)[0]
    if head == pattern:  # no wildcard: the file's folder
        head = pattern.rstrip("/")
    return head.rsplit("/", 1)[0] if "/" in head else "."


def keep_apart(output: str, inputs) -> None:
    """Refuses an OUTPUT that is, contains or lies inside one of ``inputs`` (``source_kind.ApartFrom``): a glob's
    folder (lying inside it only when the glob recurses), a file a glob matched (only holding it), or a path."""
    for found in inputs:
        if found.glob:
            folder = glob_folder(found.path)
            how = overlap(output, folder)
            if how in ("is", "contains") or (how == "is inside" and "**" in found.path):
                raise OutputError(f"OUTPUT {output} {how} the folder of the {found.what} {found.path} "
                                  f"({resolved(folder)}): {_CHANGES_INPUT}")
        elif found.matched:
            if inside(resolved(found.path), resolved(output)):
                raise OutputError(f"OUTPUT {output} contains the {found.what} {found.path}: {_CHANGES_INPUT}")
        elif how := overlap(output, found.path):
            where = "" if how == "is" else f" ({resolved(found.path)})"
            raise OutputError(f"OUTPUT {output} {how} the {found.what} {found.path}{where}: {_CHANGES_INPUT}")


def deletable(relative: str) -> bool:
    """True for what a run writes into OUTPUT (``relative``, '/'-separated): manifest, rejects, lock, ``.tmp/`` and its
    files, shards, and their temporaries."""
    parts = relative.strip("/").split("/")
    if len(parts) == 1:
        return (parts[0] in _TOP_LEVEL_FILES or parts[0] == SPILL_DIR
                or _TOP_LEVEL_TEMPORARY.fullmatch(parts[0]) is not None)
    if len(parts) != 2:
        return False
    folder, name = parts
    if folder == SPILL_DIR:
        return _SPILL_ENTRY.fullmatch(name) is not None
    if name.startswith(TEMPORARY_PREFIX):
        name = name[len(TEMPORARY_PREFIX):].partition("-")[2]  # ".tmp-<hex>-<shard name>"
    return manifest.SHARD_FILES.parse_path(f"{folder}/{name}") is not None


def foreign_files(output: str, existing: list[str]) -> list[str]:
    """The paths of ``existing`` that no run wrote, with what each is when not a plain file (an empty top-level folder
    is not foreign: deleting it loses nothing)."""
    base = output.rstrip("/") + "/"
    foreign = []
    for path in existing:
        relative = path[len(base):] if path.startswith(base) else path
        if is_local(output):
            kind = owned_folder.special_kind(path)
            if kind == "a folder" and "/" not in relative.strip("/"):
                continue
            if kind:
                foreign.append(f"{path} ({kind}, which no run writes)")
                continue
        if not deletable(relative):
            foreign.append(path)
    return foreign


def regular_entries(folder: str) -> list[str]:
    """The names in a local ``folder``, sorted; OutputError when it is a link or holds anything but regular files."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{folder} is {owned_folder.special_kind(folder) or 'a file'}, not a folder a shardprep "
                          "run made; nothing was deleted: move it away, then rerun")
    names = sorted(os.listdir(folder))
    for name in names:
        if kind := owned_folder.special_kind(os.path.join(folder, name)):
            raise OutputError(f"{os.path.join(folder, name)} is {kind}, which no shardprep run writes there; nothing "
                              "was deleted: move it away, then rerun")
    return names


def existing_files(output: str) -> list[str]:
    """Every file under OUTPUT but the lock (locally empty folders and links too, never followed)."""
    lock = manifest.join(output, manifest.LOCK_NAME)
    if not is_local(output):
        return sorted(m.path for m in FileSystems.match([manifest.join(output, "**")])[0].metadata_list
                      if m.path != lock)
    if not os.path.lexists(output):
        return []
    if not os.path.isdir(output):
        raise OutputError(f"OUTPUT {output} exists and is not a folder; pick another OUTPUT")
    found = []
    for directory, sub_dirs, files in os.walk(output):
        found += [os.path.join(directory, name) for name in files]
        for name in sub_dirs:
            path = os.path.join(directory, name)
            if os.path.islink(path) or not os.listdir(path):
                found.append(path)
    return sorted(path for path in found if path != lock)


def check_output_path(output: str) -> None:
    """Refuses a local OUTPUT that is a file, a dangling link or under one, or whose nearest folder is not writable."""
    if is_local(output):
        owned_folder.check_creatable(output, f"OUTPUT {output}", "pick another OUTPUT")


def check_replaceable(output: str, overwrite: bool) -> list[str]:
    """Refuses an OUTPUT holding anything no run wrote (before the lock: a refusal leaves nothing); its files."""
    existing = existing_files(output)
    foreign = foreign_files(output, existing)
    if foreign and not overwrite:
        raise OutputError(
            f"{output} is not empty: it holds {foreign[0]}, which no shardprep run wrote; pick a new or empty OUTPUT")
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise OutputError(
            f"--overwrite refused: {output} holds {foreign[0]}{more}, which no shardprep run wrote "
            "(--overwrite deletes only a dataset's manifest, shards, rejects and temporary files); "
            "move it away or pick another OUTPUT")
    return existing


def prepare_output(output: str, overwrite: bool, stale_lock: str | None = None) -> None:
    """Refuses a non-empty OUTPUT unless ``overwrite`` (foreign files even then); removes the old manifest first (never
    a manifest of shards that are gone), then the rest. ``stale_lock``: a stopped run's lock's text."""
    existing = check_replaceable(output, overwrite)
    if existing and not overwrite:
        journal = manifest.join(output, SPILL_DIR, JOURNAL_NAME)
        resumable = " (or --resume to continue the run that stopped there)" if journal in existing else ""
        stopped = (f"; a run stopped there without finishing (its lock file said: {stale_lock})"
                   if stale_lock and not os.path.isfile(manifest.join(output, manifest.MANIFEST_NAME)) else "")
        raise OutputError(f"{output} is not empty ({len(existing)} files, e.g. {existing[0]}){stopped}; pass "
                          f"--overwrite to replace it{resumable}")
    manifest_path = manifest.join(output, manifest.MANIFEST_NAME)
    rest = [path for path in existing if path != manifest_path]
    try:
        if manifest_path in existing:
            FileSystems.delete([manifest_path])
        if rest and is_local(output):  # never through a link; then the folders that leaves empty, deepest first
            relative = [path.removeprefix(output.rstrip("/") + "/") for path in rest]
            files = {name for name, path in zip(relative, rest) if not os.path.isdir(path) or os.path.islink(path)}
            folders = {name.rsplit("/", i)[0] for name in relative for i in range(1, name.count("/") + 1)}
            folders |= set(relative) - files  # empty folders, listed themselves
            owned_folder.clear(output, owned_folder.Record(frozenset(files), frozenset(folders)))
        elif rest:
            FileSystems.delete(rest)
    except OSError as e:
        raise OutputError(f"--overwrite could not delete the old dataset in {output}: {e}") from e
    if is_local(output):
        os.makedirs(output, exist_ok=True)  # the lock (owned_folder.holding) made it already, and words its errors

