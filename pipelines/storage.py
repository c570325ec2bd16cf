"""Where the preprocess job may write: local vs remote paths, resolved paths, OUTPUT apart from every input, what
``--overwrite`` may delete, and the output lock.

Every check here runs on the launching machine before anything under OUTPUT is created or deleted:

* ``check_apart``: OUTPUT never equals, contains or lies inside an input (SOURCE, each ``tfrecord:`` file and its
  glob's folder, ``--labels-file``, a ``tfds:`` data dir). Local paths are compared as resolved real paths
  (symlinks, ``..``, ``.``, trailing slashes), remote ones (``gs://``) as normalized prefixes.
* ``atomic_write``: every file a run finishes (a streamed shard, the manifest) appears whole or not at all.
* ``prepare_output``: a non-empty OUTPUT needs ``--overwrite``, and ``--overwrite`` deletes only what a shardprep
  run writes (``deletable``); a folder holding anything else is refused, naming it, and nothing is deleted.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import posixpath
import re
import uuid
from typing import Iterable, NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.preprocess import manifest

SPILL_DIR = ".tmp"  # OUTPUT/.tmp/: decode groups' spill files while a run writes
JOURNAL_NAME = "journal.jsonl"  # OUTPUT/.tmp/journal.jsonl: a local run's finished decode groups (pipelines/journal)
_SHARD = re.compile(r"(?P<split>.+)-\d{5}-of-\d{5}" + re.escape(manifest.SHARD_SUFFIX))
_TOP_LEVEL_FILES = (manifest.MANIFEST_NAME, manifest.REJECTS_NAME, manifest.LOCK_NAME)


class OutputError(RuntimeError):
    """OUTPUT cannot be used (it overlaps an input, holds foreign files, is locked or unwritable); for the user."""


def is_local(path: str) -> bool:
    """True for a path on this machine's file system (no scheme, or file://)."""
    return FileSystems.get_scheme(path) in (None, "file")


TEMPORARY_PREFIX = ".tmp-"  # ".tmp-<32 hex>-<name>": a file atomic_write has not finished, beside its final name


class Written(NamedTuple):
    """What ``atomic_write`` wrote: bytes, chunks (a shard's records) and the sha256 hex digest of the whole file."""

    num_bytes: int
    num_chunks: int
    sha256: str


def temporary_path(path: str) -> str:
    """The name ``path`` is written under until it is complete: ``.tmp-<uuid>-<name>`` in the same folder."""
    folder, name = posixpath.split(path)
    return posixpath.join(folder, f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}-{name}")


def atomic_write(path: str, data: bytes | Iterable[bytes], mime_type: str = "application/octet-stream") -> Written:
    """Writes ``data`` (bytes, or an iterable of byte chunks written in turn) to ``path``, local or any Beam file
    system (``gs://``), so that ``path`` appears only once complete: written under ``temporary_path(path)``, then
    renamed (on ``gs://`` a rename is a copy and a delete). On any error the temporary file is deleted and the error
    raised as it came; ``path`` is left as it was. Returns the bytes, the chunks and the sha256 written.
    """
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
    """A path to compare: local ones absolute with symlinks and ``..`` resolved, remote ones normalized (no ``..``,
    ``.``, doubled or trailing slashes); ``file://`` URLs as local paths."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    if is_local(path):
        return os.path.realpath(os.path.abspath(path))  # no '~': the job does not expand it either
    scheme, rest = path.split("://", 1)
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/")
    return f"{scheme}://{bucket}" + (f"/{key}" if key else "")


def inside(path: str, folder: str) -> bool:
    """True when resolved ``path`` is ``folder`` or lies under it (a whole-component prefix: ``gs://b/xy`` is not
    inside ``gs://b/x``). Both arguments must already be ``resolved``."""
    if path == folder:
        return True
    return path.startswith(folder if folder.endswith("/") else folder + "/")


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


def check_apart(output: str, inputs: list[tuple[str, str]]) -> None:
    """Refuses an OUTPUT that is, contains or lies inside one of ``inputs`` ((what, path) pairs)."""
    for what, path in inputs:
        how = overlap(output, path)
        if how:
            where = "" if how == "is" else f" ({resolved(path)})"
            raise OutputError(
                f"OUTPUT {output} {how} the {what} {path}{where}: writing there would change or delete the input; "
                "pick an OUTPUT outside every input")


def check_apart_from_files(output: str, files, what: str) -> None:
    """Refuses an OUTPUT that holds (or is) one of ``files``, e.g. the files a ``tfrecord:`` glob matched."""
    out = resolved(output)
    for path in files:
        if inside(resolved(path), out):
            raise OutputError(f"OUTPUT {output} contains the {what} {path}: writing there would change or delete "
                              "the input; pick an OUTPUT outside every input")


def inputs_of(source: str, labels_file: str | None, tfds_data_dir: str | None) -> list[tuple[str, str]]:
    """The (what, path) inputs a run reads that OUTPUT must keep apart from (the files a ``tfrecord:`` glob matches
    are checked once matched, with ``check_apart_from_files``)."""
    from shardprep.preprocess.sources import SourceSpec

    spec = SourceSpec.parse(source)
    inputs = []
    if spec.kind == "folder":
        inputs.append(("SOURCE", spec.location))
    elif spec.kind == "tfrecord" and not re.search(r"[*?\[]", spec.location):
        inputs.append(("input TFRecord file", spec.location))
    elif spec.kind == "tfds":
        data_dir = tfds_data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
        if is_local(data_dir):
            data_dir = os.path.expanduser(data_dir)  # as TFDS reads it
        inputs.append(("TFDS data dir", data_dir))
    if labels_file:
        inputs.append(("labels file", labels_file))
    return inputs


def check_apart_from_glob(output: str, pattern: str) -> None:
    """A ``tfrecord:`` glob: OUTPUT must not be or contain its folder, nor lie inside it when the glob recurses
    (``**``: the next run would read the shards as input)."""
    folder = glob_folder(pattern)
    how = overlap(output, folder)
    if how in ("is", "contains") or (how == "is inside" and "**" in pattern):
        raise OutputError(
            f"OUTPUT {output} {how} the folder of the input TFRecords {pattern} ({resolved(folder)}): writing there "
            "would change or delete the input; pick an OUTPUT outside every input")


# --- what OUTPUT may hold ------------------------------------------------------------------------------------------

def deletable(relative: str) -> bool:
    """True for what a shardprep run writes into OUTPUT (``relative`` to it, '/'-separated): manifest, rejects, lock,
    ``.tmp/`` spill files, and in a split folder its shards and their ``.tmp-*`` temporaries."""
    parts = relative.strip("/").split("/")
    if len(parts) == 1:
        return parts[0] in _TOP_LEVEL_FILES or parts[0] == SPILL_DIR
    if parts[0] == SPILL_DIR:
        return True
    if len(parts) != 2:
        return False
    split, name = parts
    if name.startswith(TEMPORARY_PREFIX):
        return True
    match = _SHARD.fullmatch(name)
    return bool(match) and match.group("split") == split


def foreign_files(output: str, existing: list[str]) -> list[str]:
    """The paths of ``existing`` (files under OUTPUT) that no shardprep run wrote; empty folders are never foreign."""
    base = output.rstrip("/") + "/"
    foreign = []
    for path in existing:
        relative = path[len(base):] if path.startswith(base) else path
        if is_local(output) and os.path.isdir(path) and not os.path.islink(path):
            continue  # listed because empty: deleting it loses nothing
        if not deletable(relative):
            foreign.append(path)
    return foreign


def existing_files(output: str) -> list[str]:
    """Every file under OUTPUT except the lock (locally, empty sub-folders and symlinks count too)."""
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
    """Refuses a local OUTPUT that is a file, or whose nearest existing folder cannot be written."""
    if not is_local(output):
        return
    if os.path.lexists(output) and not os.path.isdir(output):
        raise OutputError(f"OUTPUT {output} exists and is not a folder; pick another OUTPUT")
    probe = os.path.abspath(output)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise OutputError(f"OUTPUT {output} cannot be created: {probe} is not a folder; pick another OUTPUT")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"OUTPUT {output} cannot be written: no write permission on {probe}; pick another OUTPUT")


def check_replaceable(output: str, overwrite: bool) -> list[str]:
    """Refuses an OUTPUT holding anything a shardprep run did not write (read-only: runs before the lock is taken, so
    a refused run leaves not even a lock file in someone's folder); returns the files found."""
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


def prepare_output(output: str, overwrite: bool) -> None:
    """Refuses a non-empty OUTPUT unless ``overwrite``, and one holding anything a shardprep run did not write even
    then; removes the old manifest first, and the rest after it.

    Removing manifest.json before anything else means an interrupted overwrite never leaves a manifest that
    describes shards which are no longer there.
    """
    existing = check_replaceable(output, overwrite)
    if existing and not overwrite:
        journal = manifest.join(output, SPILL_DIR, JOURNAL_NAME)
        resumable = " (or --resume to continue the run that stopped there)" if journal in existing else ""
        raise OutputError(f"{output} is not empty ({len(existing)} files, e.g. {existing[0]}); pass --overwrite to "
                          f"replace it{resumable}")
    if existing:
        manifest_path = manifest.join(output, manifest.MANIFEST_NAME)
        try:
            if manifest_path in existing:
                FileSystems.delete([manifest_path])
            if is_local(output):
                _remove_local(output)
            else:
                rest = [path for path in existing if path != manifest_path]
                if rest:
                    FileSystems.delete(rest)
        except OSError as e:
            raise OutputError(f"--overwrite could not delete the old dataset in {output}: {e}") from e
    if is_local(output):
        _make_folder(output)


def _remove_local(output: str) -> None:
    import shutil

    for name in os.listdir(output):
        path = os.path.join(output, name)
        if name == manifest.LOCK_NAME:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def _make_folder(output: str) -> None:
    try:
        os.makedirs(output, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"OUTPUT {output} exists and is not a folder; pick another OUTPUT") from None
    except OSError as e:
        raise OutputError(f"OUTPUT {output} cannot be created: {e.strerror or e}; pick another OUTPUT") from None


@contextlib.contextmanager
def output_lock(output: str):
    """Holds OUTPUT/.shardprep.lock for the whole run, so a second run into the same OUTPUT is refused.

    Locally this is an advisory ``flock``: the kernel releases it when the holder dies, so a killed run never
    blocks the rerun. The lock file itself stays (hidden; readers ignore it). On object stores there is no
    lock: there, a second run is refused because OUTPUT is not empty, unless it passes --overwrite.
    """
    if not is_local(output):
        yield
        return
    import fcntl
    import socket

    _make_folder(output)
    path = os.path.join(output, manifest.LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(f"OUTPUT {output} cannot be written: {e.strerror or e}; pick another OUTPUT") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
            raise OutputError(
                f"another shardprep run is writing to {output} ({holder}); wait for it to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
