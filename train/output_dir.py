"""What ``shardprep train`` may do with ``--output-dir``: the checks before a run, and ``--overwrite``'s deletions.

One rule (docs/safety.md): a run writes into a folder that is missing or empty, or, with ``--resume`` or
``--overwrite``, into one holding its run record (:mod:`shardprep.train.run_files`) and nothing the record does not
list (:func:`check_contents`); ``--overwrite`` deletes listed files only, and removes a listed folder only when
it is empty (:func:`clear`). ``--output-dir`` is a real folder, never a link, DATA, inside DATA, around it, or a
dataset (:func:`check_path`).

Nothing is written or deleted through a link: every entry under ``--output-dir`` is looked at without following
links (a link is never ours), and deletions go through folder descriptors opened with ``O_NOFOLLOW``. URLs
(``gs://``: no links, no real folders) are listed and deleted through ``tf.io.gfile``. Everything here but
:func:`clear` only reads.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from typing import NamedTuple

from shardprep.train import run_files
from shardprep.train.run_files import LOCK_NAME, RECORD_NAME, RECORD_TEMPORARY, OutputDirError, RunRecord, is_url


class Entry(NamedTuple):
    """Something under ``--output-dir``: its relative path and kind (file, folder, link or special)."""

    relative: str
    kind: str


# --- what a folder holds -------------------------------------------------------------------------------------------


def entries(output_dir: str, record: RunRecord | None = None) -> list[Entry]:
    """What ``output_dir`` holds, without following links: every entry at the top, and inside the folders
    ``record`` lists (the rest is not looked into: it is reported as a whole)."""
    found, pending = [], [""]
    while pending:
        relative = pending.pop()
        for name, kind in run_files.children(os.path.join(output_dir, relative) if relative else output_dir):
            path = posixpath.join(relative, name) if relative else name
            found.append(Entry(path, kind))
            if kind == "folder" and record is not None and path in record.folders:
                pending.append(path)
    return sorted(found)


def _shown(entry: Entry) -> str:
    return {"folder": entry.relative + "/", "link": f"{entry.relative} (a link)",
            "special": f"{entry.relative} (not a regular file)",
            "hard link": f"{entry.relative} (a hard link to another file)"}.get(entry.kind, entry.relative)


def names(found: list[Entry], limit: int = 5) -> str:
    shown = [_shown(entry) for entry in found[:limit]]
    return ", ".join(shown) + (f" and {len(found) - limit} more" if len(found) > limit else "")


def foreign(found: list[Entry], record: RunRecord) -> list[Entry]:
    """The entries a run did not write: links, special files, and files or folders the record does not list."""
    ours = {RECORD_NAME: "file", RECORD_TEMPORARY: "file", LOCK_NAME: "file"}
    ours.update({name: "file" for name in record.files})
    ours.update({name: "folder" for name in record.folders})
    return [entry for entry in found if ours.get(entry.relative) != entry.kind]


def holds_files(found: list[Entry]) -> bool:
    """Whether a folder holds more than the run record and empty folders (a run that stopped before writing)."""
    return any(entry.kind != "folder" and entry.relative not in (RECORD_NAME, LOCK_NAME) for entry in found)


# --- the checks before a run -----------------------------------------------------------------------------------------


def check_path(output_dir: str, data_dir: str) -> None:
    """Refuses an ``--output-dir`` that is a link, not a folder, under a dangling link or a file, not writable, or
    that is, lies inside or contains DATA. Nothing is created."""
    if not output_dir.strip():
        raise OutputDirError("--output-dir is empty; name the folder the run writes into")
    if is_url(output_dir):
        if is_url(data_dir):
            _check_apart(output_dir, _normalized(output_dir), data_dir, _normalized(data_dir))
        return
    path = os.path.abspath(output_dir)  # no trailing slash: a link is seen as a link
    if os.path.islink(path):
        target = os.readlink(path)
        if not os.path.exists(path):
            raise OutputDirError(f"--output-dir {output_dir} is a dangling link (to {target}, which does not exist); "
                                 "choose a real folder (it is created if missing)")
        raise OutputDirError(f"--output-dir {output_dir} is a link (to {target}); shardprep train writes only into a "
                             "real folder, never through a link: pass the folder itself or another --output-dir")
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.isfile(path) else "a FIFO, socket or device"
        raise OutputDirError(f"--output-dir {output_dir} is {what}, not a folder; choose a folder (it is created if "
                             "missing)")
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.path.islink(existing) and not os.path.exists(existing):
        raise OutputDirError(f"--output-dir {output_dir} cannot be created: {existing} is a dangling link (to "
                             f"{os.readlink(existing)}, which does not exist); choose another --output-dir")
    if not os.path.isdir(existing):
        raise OutputDirError(f"--output-dir {output_dir}: {existing} is a file, not a folder, so the folder cannot "
                             "be created; choose another --output-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"--output-dir {output_dir}: cannot write into {existing} (permission denied); "
                             "choose another --output-dir")
    if not is_url(data_dir):
        _check_apart(output_dir, os.path.realpath(path), data_dir, os.path.realpath(data_dir))


def _normalized(url: str) -> str:
    """``scheme://bucket/key`` without ``..``, ``.``, doubled or trailing slashes."""
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/")
    return f"{scheme}://{bucket}" + (f"/{key}" if key else "")


def _exists(path: str) -> bool:
    return run_files.gfile().exists(path) if is_url(path) else os.path.lexists(path)


def _check_apart(output_dir: str, output: str, data_dir: str, data: str) -> None:
    how = ("is" if output == data else "is inside" if output.startswith(data.rstrip("/") + "/")
           else "contains" if data.startswith(output.rstrip("/") + "/") else None)
    if how is not None:
        raise OutputDirError(f"--output-dir {output_dir} {how} DATA ({data_dir}); a training run writes into a "
                             "folder of its own, apart from the dataset: choose another --output-dir")


def check_contents(output_dir: str, resume: bool, overwrite: bool) -> None:
    """Refuses what ``--output-dir`` holds, unless: nothing (or only a run record with nothing written); with
    ``--resume`` or ``--overwrite``, a run record and only what it lists. Read-only."""
    path = output_dir if is_url(output_dir) else os.path.abspath(output_dir)
    if not _exists(path):
        if resume:
            raise OutputDirError(f"--resume: nothing to resume: {output_dir} does not exist; run without --resume")
        return
    # A lock file (a regular one) is a run's: held by one writing there (refused when this run takes the lock), or
    # left by a killed one (taken over).
    found = [entry for entry in entries(path) if (entry.relative, entry.kind) != (LOCK_NAME, "file")]
    if not found:
        if resume:
            raise OutputDirError(f"--resume: nothing to resume: {output_dir} is empty; run without --resume")
        return
    if "manifest.json" in {entry.relative for entry in found}:
        raise OutputDirError(f"--output-dir {output_dir} holds a dataset (manifest.json); a training run writes into "
                             "a folder of its own, apart from any dataset: choose another --output-dir")
    record = run_files.read_record(path)
    if record is None:
        _refuse_unrecorded(output_dir, found, resume, overwrite)
    found = entries(path, record)
    alien = foreign(found, record)
    if not (resume or overwrite):
        if alien or holds_files(found):
            shown = names(alien or [entry for entry in found if "/" not in entry.relative
                                    and entry.relative not in (RECORD_NAME, LOCK_NAME)])
            raise OutputDirError(f"--output-dir {output_dir} is not empty: it holds an earlier run ({shown}); pass "
                                 "--resume to continue it, --overwrite to replace it, or choose another --output-dir")
        return
    if alien:
        raise OutputDirError(f"{'--resume' if resume else '--overwrite'} refused: {output_dir} holds {names(alien)}, "
                             f"which the shardprep train run recorded in {RECORD_NAME} did not write; move "
                             f"{_them(alien)} away or choose another --output-dir")
    if not is_url(path):
        _check_writable(output_dir, [os.path.join(path, entry.relative) for entry in found if entry.kind == "folder"])


def _check_writable(output_dir: str, folders: list[str]) -> None:
    """Refuses a folder of the run (``checkpoints/``, ``logs/…``) that cannot be written: found before training,
    not at the first checkpoint, and before ``--overwrite`` deletes anything."""
    for folder in folders:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputDirError(f"--output-dir {output_dir}: cannot write into {folder} ({_why_not_writable(folder)}), "
                                 "where the run writes its files; make it writable or choose another --output-dir")


def _why_not_writable(folder: str) -> str:
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"


def _them(found: list[Entry]) -> str:
    """The pronoun for ``found`` in a refusal: one entry is "it"."""
    return "it" if len(found) == 1 else "them"


def _refuse_unrecorded(output_dir: str, found: list[Entry], resume: bool, overwrite: bool) -> None:
    shown = names(found)
    if resume:
        raise OutputDirError(f"--resume: nothing to resume in {output_dir}: it holds {shown} but no shardprep train "
                             f"run (no {RECORD_NAME}); choose the folder of the run to resume")
    if overwrite:
        raise OutputDirError(f"--overwrite refused: {output_dir} holds {shown} and no {RECORD_NAME}, so no "
                             f"shardprep train run wrote {_them(found)} (it deletes only the files a run recorded); "
                             f"move {_them(found)} away or choose another --output-dir")
    raise OutputDirError(f"--output-dir {output_dir} is not empty ({shown}) and holds no shardprep train run; "
                         "choose a new or empty --output-dir")


# --- what a run does to the folder ----------------------------------------------------------------------------------


def clear(output_dir: str) -> list[str]:
    """Deletes the files the run record lists (never through a link) and then its folders that are left empty;
    returns the files deleted. Check first (:func:`check_contents` with ``overwrite``): a listed path that is
    not a regular file, or reached through a link, stops it with an :class:`OutputDirError`."""
    record = run_files.read_record(output_dir)
    if record is None:
        return []
    if is_url(output_dir):
        return _clear_url(output_dir, record)
    deleted = []
    root = os.open(output_dir, run_files.NOFOLLOW_DIR)
    try:
        for relative in sorted(record.files):
            if _remove_at(root, relative, output_dir):
                deleted.append(relative)
        for relative in sorted(record.folders, key=lambda folder: (-folder.count("/"), folder)):
            _remove_at(root, relative, output_dir, folder=True)
    finally:
        os.close(root)
    return deleted


def _clear_url(output_dir: str, record: RunRecord) -> list[str]:
    """:func:`clear` on a URL: listed files that are files (object stores keep no empty folders to remove)."""
    gfile, deleted = run_files.gfile(), []
    for relative in sorted(record.files):
        path = f"{output_dir.rstrip('/')}/{relative}"
        if gfile.exists(path) and not gfile.isdir(path):
            gfile.remove(path)
            deleted.append(relative)
    return deleted


def _remove_at(root: int, relative: str, output_dir: str, folder: bool = False) -> bool:
    """Removes ``relative`` under the folder open as ``root``: a regular file, or an empty folder; True if removed."""
    *parents, name = relative.split("/")
    opened = []
    try:
        at = root
        for part in parents:
            try:
                at = os.open(part, run_files.NOFOLLOW_DIR, dir_fd=at)
            except FileNotFoundError:
                return False
            except OSError:
                raise OutputDirError(f"{os.path.join(output_dir, relative)} was not deleted: {part} on its way is a "
                                     "link or not a folder, which no run makes") from None
            opened.append(at)
        try:
            info = os.stat(name, dir_fd=at, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if folder:
            if not stat.S_ISDIR(info.st_mode):
                return False
            try:
                os.rmdir(name, dir_fd=at)
            except OSError as error:
                if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    return False
                raise _named(error, os.path.join(output_dir, relative)) from error
            return True
        if not stat.S_ISREG(info.st_mode):
            raise OutputDirError(f"{os.path.join(output_dir, relative)} was not deleted: it is not a regular file "
                                 "(a link, folder or device), which no run writes")
        try:
            os.unlink(name, dir_fd=at)
        except OSError as error:
            raise _named(error, os.path.join(output_dir, relative)) from error
        return True
    finally:
        for fd in opened:
            os.close(fd)


def _named(error: OSError, path: str) -> OSError:
    """``error`` of an operation by name inside an open folder, naming the whole path (its own name is the last
    part only)."""
    return OSError(error.errno, error.strerror or str(error), path)
