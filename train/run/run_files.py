"""What a ``shardprep train`` run owns in ``--output-dir`` (docs/safety.md, on ``owned_folder``'s model): its record lists
every file it may write, written first (:func:`claim`); it writes only into an empty folder or, with ``--resume`` or
``--overwrite``, its own; ``--overwrite`` deletes listed files only. No Keras or TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from typing import NoReturn

from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.checks.names import printable  # noqa: F401 - shown names, escaped
from shardprep.preprocess.checks.owned_folder import LOCK_NAME, Entry, OutputError, Record, is_url  # noqa: F401

RECORD_NAME = ".shardprep-train.json"
LOGS = "logs"
# The files of a run (run_paths), relative, '/'-separated; a model is written as NAME.writing.keras, then renamed.
_FILES = {"best": "checkpoints/best.keras", "best_writing": "checkpoints/best.writing.keras",
          "last": "checkpoints/last.keras", "last_writing": "checkpoints/last.writing.keras",
          "state": "checkpoints/state.json", "history": "history.json", "summary": "summary.json",
          "model": "model.keras", "model_writing": "model.writing.keras"}
# Every file a run writes into --output-dir, with the temporary names (.tmp) its JSON files are written under.
RUN_FILES = (*_FILES.values(), *(name + ".tmp" for name in _FILES.values() if name.endswith(".json")))
RUN_FOLDERS = ("checkpoints", LOGS)
EVENT_FILE_PREFIX = "events.out.tfevents."  # TensorBoard's summary writers: events.out.tfevents.<time>.<host>...
PROFILE_FOLDERS = ("plugins", "profile")  # the profiler's traces: logs/<run>/plugins/profile/<time>/<host>.*


def run_paths(output_dir: str) -> dict:
    """The files and folders of a run under ``output_dir``, by name (each file of ``RUN_FILES``)."""
    return {"checkpoints": os.path.join(output_dir, "checkpoints"), "logs": os.path.join(output_dir, LOGS),
            **{key: os.path.join(output_dir, *name.split("/")) for key, name in _FILES.items()}}


def _clean(relative) -> bool:
    """A relative '/'-separated path with no empty, '.' or '..' part and no control character."""
    return (isinstance(relative, str) and bool(relative) and not relative.startswith("/")
            and all(part not in ("", ".", "..") for part in relative.split("/"))
            and not any(ord(c) < 32 for c in relative))


def allowed_file(relative) -> bool:
    """A file a run writes: one of ``RUN_FILES``, or under logs/ a TensorBoard event file or profile."""
    if not _clean(relative):
        return False
    parts = relative.split("/")
    profile = any(parts[i:i + 2] == list(PROFILE_FOLDERS) for i in range(1, len(parts) - 1))
    return relative in RUN_FILES or (parts[0] == LOGS and (parts[-1].startswith(EVENT_FILE_PREFIX) or profile))


def allowed_folder(relative) -> bool:
    return _clean(relative) and (relative in RUN_FOLDERS or relative.startswith(LOGS + "/"))


TRAIN_RECORD = owned_folder.RecordKind(RECORD_NAME, "shardprep train", allowed_file, allowed_folder)


def read_record(output_dir: str) -> Record | None:
    return owned_folder.read_record(output_dir, TRAIN_RECORD)


def claim(output_dir: str, resume: bool) -> None:
    """Makes ``output_dir`` (if missing) and writes the record listing every file the run may write, before it
    writes any; ``resume`` keeps what the record already lists (an earlier process's event files)."""
    if is_url(output_dir):
        owned_folder.gfile().makedirs(output_dir)
    else:
        os.makedirs(output_dir, exist_ok=True)
    existing = read_record(output_dir) if resume else None
    record = Record(frozenset(RUN_FILES) | (existing.files if existing else frozenset()),
                    frozenset(RUN_FOLDERS) | (existing.folders if existing else frozenset()))
    if record != existing:
        owned_folder.write_record(output_dir, TRAIN_RECORD, record)


def record_new_files(output_dir: str) -> None:
    """Adds TensorBoard's files under logs/ (and their folders) to the record; nothing without a record (a run
    started from Python rather than ``shardprep train``)."""
    record = read_record(output_dir)
    if record is None:
        return
    files, folders, pending = set(record.files), set(record.folders), [LOGS]
    while pending:
        relative = pending.pop()
        for name, found in owned_folder.children(os.path.join(output_dir, relative)):
            path = f"{relative}/{name}"
            if found == "folder" and allowed_folder(path):
                folders.add(path)
                pending.append(path)
            elif found == "file" and allowed_file(path):
                files.add(path)
    if files != record.files or folders != record.folders:
        owned_folder.write_record(output_dir, TRAIN_RECORD, Record(frozenset(files), frozenset(folders)))


def event_file_recorder(output_dir: str):
    """A Keras callback recording TensorBoard's files at the start, every epoch end and the end; put it after the
    TensorBoard callback, so that it sees the files that callback has just made."""
    import keras

    def record(*_) -> None:
        record_new_files(output_dir)

    return keras.callbacks.LambdaCallback(on_train_begin=record, on_epoch_end=record, on_train_end=record)


def describe_os_error(error: OSError, doing: str = "writing") -> str:
    """One line for a failed file operation: the path the user knows (``best.keras`` for the ``best.writing.keras``
    it is written under) and the cause (``[Errno 28] No space left on device``)."""
    name = str(error.filename)
    if name.endswith(".writing.keras"):
        name = name.removesuffix(".writing.keras") + ".keras"
    where = f" {name}" if error.filename else ""
    hint = ("; free some space, then rerun with --resume to continue from the last checkpoint (--overwrite when "
            "there is none)") if error.errno == errno.ENOSPC else ""
    return f"{doing}{where} failed: {error.strerror or error}{hint}"


# --- the checks before a run, and --overwrite ------------------------------------------------------------------------


def holds_files(found: list[Entry]) -> bool:
    """Whether a folder holds more than the run record and empty folders (a run that stopped before writing)."""
    return any(entry.kind != "folder" and entry.relative not in (RECORD_NAME, LOCK_NAME) for entry in found)


def check_path(output_dir: str, data_dir: str) -> None:
    """Refuses an ``--output-dir`` that is a link, not a folder, under a dangling link or a file, not writable, or
    that is, lies inside or contains DATA. Nothing is created."""
    if not output_dir.strip():
        raise OutputError("--output-dir is empty; name the folder the run writes into")
    if is_url(output_dir):
        if is_url(data_dir):
            _check_apart(output_dir, _normalized(output_dir), data_dir, _normalized(data_dir))
        return
    path, named = os.path.abspath(output_dir), f"--output-dir {output_dir}"  # no trailing slash: a link is a link
    if os.path.islink(path):
        target = os.readlink(path)
        if not os.path.exists(path):
            raise OutputError(f"{named} is a dangling link (to {target}, which does not exist); choose a real folder "
                              "(it is created if missing)")
        raise OutputError(f"{named} is a link (to {target}); shardprep train writes only into a real folder, never "
                          "through a link: pass the folder itself or another --output-dir")
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.isfile(path) else "a FIFO, socket or device"
        raise OutputError(f"{named} is {what}, not a folder; choose a folder (it is created if missing)")
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if os.path.islink(existing) and not os.path.exists(existing):
        raise OutputError(f"{named} cannot be created: {existing} is a dangling link (to {os.readlink(existing)}, "
                          "which does not exist); choose another --output-dir")
    if not os.path.isdir(existing):
        raise OutputError(f"{named}: {existing} is a file, not a folder, so the folder cannot be created; choose "
                          "another --output-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"{named}: cannot write into {existing} (permission denied); choose another --output-dir")
    if not is_url(data_dir):
        _check_apart(output_dir, os.path.realpath(path), data_dir, os.path.realpath(data_dir))


def _normalized(url: str) -> str:
    """``scheme://bucket/key`` without ``..``, ``.``, doubled or trailing slashes."""
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/")
    return f"{scheme}://{bucket}" + (f"/{key}" if key else "")


def _check_apart(output_dir: str, output: str, data_dir: str, data: str) -> None:
    how = ("is" if output == data else "is inside" if output.startswith(data.rstrip("/") + "/")
           else "contains" if data.startswith(output.rstrip("/") + "/") else None)
    if how is not None:
        raise OutputError(f"--output-dir {output_dir} {how} DATA ({data_dir}); a training run writes into a folder "
                          "of its own, apart from the dataset: choose another --output-dir")


def check_contents(output_dir: str, resume: bool, overwrite: bool) -> None:
    """Refuses what ``--output-dir`` holds, unless: nothing (or only a run record with nothing written); with
    ``--resume`` or ``--overwrite``, a run record and only what it lists. Read-only."""
    path = output_dir if is_url(output_dir) else os.path.abspath(output_dir)
    exists = owned_folder.gfile().exists(path) if is_url(path) else os.path.lexists(path)
    # A regular lock file is a run's: a live one is refused when the lock is taken, a killed one's taken over.
    found = [entry for entry in owned_folder.entries(path) if entry != (LOCK_NAME, "file")]
    if not found:
        if resume:
            how = "is empty" if exists else "does not exist"
            raise OutputError(f"--resume: nothing to resume: {output_dir} {how}; run without --resume")
        return
    if "manifest.json" in {entry.relative for entry in found}:
        raise OutputError(f"--output-dir {output_dir} holds a dataset (manifest.json); a training run writes into a "
                          "folder of its own, apart from any dataset: choose another --output-dir")
    record = read_record(path)
    if record is None:
        _refuse_unrecorded(output_dir, found, resume, overwrite)
    found = owned_folder.entries(path, record)
    alien = owned_folder.foreign(found, record, (RECORD_NAME, RECORD_NAME + ".tmp"))
    them = "it" if len(alien) == 1 else "them"
    if not (resume or overwrite):
        if alien or holds_files(found):
            shown = owned_folder.names(alien or [entry for entry in found if "/" not in entry.relative
                                                 and entry.relative not in (RECORD_NAME, LOCK_NAME)])
            raise OutputError(f"--output-dir {output_dir} is not empty: it holds an earlier run ({shown}); pass "
                              "--resume to continue it, --overwrite to replace it, or choose another --output-dir")
        return
    if alien:
        raise OutputError(f"{'--resume' if resume else '--overwrite'} refused: {output_dir} holds "
                          f"{owned_folder.names(alien)}, which the shardprep train run recorded in {RECORD_NAME} did "
                          f"not write; move {them} away or choose another --output-dir")
    for folder in [] if is_url(path) else [os.path.join(path, e.relative) for e in found if e.kind == "folder"]:
        if not os.access(folder, os.W_OK | os.X_OK):  # found now, not at the first checkpoint
            why = "permission denied"
            with contextlib.suppress(OSError):
                why = "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else why
            raise OutputError(f"--output-dir {output_dir}: cannot write into {folder} ({why}), where the run writes "
                              "its files; make it writable or choose another --output-dir")


def _refuse_unrecorded(output_dir: str, found: list[Entry], resume: bool, overwrite: bool) -> NoReturn:
    shown, them = owned_folder.names(found), "it" if len(found) == 1 else "them"
    if resume:
        raise OutputError(f"--resume: nothing to resume in {output_dir}: it holds {shown} but no shardprep train "
                          f"run (no {RECORD_NAME}); choose the folder of the run to resume")
    if overwrite:
        raise OutputError(f"--overwrite refused: {output_dir} holds {shown} and no {RECORD_NAME}, so no shardprep "
                          f"train run wrote {them} (it deletes only the files a run recorded); move {them} away or "
                          "choose another --output-dir")
    raise OutputError(f"--output-dir {output_dir} is not empty ({shown}) and holds no shardprep train run; choose "
                      "a new or empty --output-dir")


def clear(output_dir: str) -> list[str]:
    """Deletes the files the record lists, then its folders left empty (never through a link); returns the files
    deleted. Check first (:func:`check_contents` with ``overwrite``)."""
    record = read_record(output_dir)
    return [] if record is None else owned_folder.clear(output_dir, record)
