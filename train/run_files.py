"""What a ``shardprep train`` run owns in ``--output-dir``: the names of its files, and the run record that lists them.

``shardprep train`` writes the run record, ``RECORD_NAME`` (``.shardprep-train.json``), into ``--output-dir`` before
anything else (:func:`claim`): every file the run may write there (``RUN_FILES``, each listed before it is first
written, temporary names included) and the folders it makes (``RUN_FOLDERS``). TensorBoard names its files itself;
:func:`event_file_recorder` adds them (and their folders) as they appear: at the start of the run, every epoch end
and its end. What ``--resume`` and ``--overwrite`` may do with a folder, by that record, is
:mod:`shardprep.train.output_dir`.

The record is untrusted input when read back (:func:`read_record`): an entry no run writes (``..``, an absolute
path, any other name) marks it damaged. Locally it is read and written without following links (``O_NOFOLLOW``);
URLs (``gs://``, which has no links) go through ``tf.io.gfile``. Imports neither Keras nor TensorFlow (but for
URLs; :func:`event_file_recorder` imports Keras when called), so the CLI checks a folder before either starts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from typing import NamedTuple

from shardprep.preprocess import folder_lock
from shardprep.preprocess.folder_lock import LOCK_NAME

RECORD_NAME = ".shardprep-train.json"
RECORD_TEMPORARY = RECORD_NAME + ".tmp"
RECORD_FORMAT = 1
MAX_RECORD_BYTES = 16 * 2**20
# Every file a run writes into --output-dir (run_paths), with the temporary names each is written under before the
# rename that completes it; relative, '/'-separated.
RUN_FILES = ("history.json", "history.json.tmp", "summary.json", "summary.json.tmp", "model.keras",
             "model.writing.keras", "checkpoints/best.keras", "checkpoints/best.writing.keras", "checkpoints/last.keras",
             "checkpoints/last.writing.keras", "checkpoints/state.json", "checkpoints/state.json.tmp")
RUN_FOLDERS = ("checkpoints", "logs")
LOGS = "logs"
EVENT_FILE_PREFIX = "events.out.tfevents."  # TensorBoard's summary writers: events.out.tfevents.<time>.<host>...
PROFILE_FOLDERS = ("plugins", "profile")  # the profiler's traces: logs/<run>/plugins/profile/<time>/<host>.*
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class OutputDirError(ValueError):
    """``--output-dir`` cannot be used as asked; the message is one line for the user."""


class RunRecord(NamedTuple):
    """The run record: files and folders a run wrote (or was about to) under ``--output-dir``, relative paths."""

    files: frozenset
    folders: frozenset


def run_paths(output_dir: str) -> dict:
    """The files and folders of a run under ``output_dir``, by name (each file of ``RUN_FILES``)."""
    checkpoints = os.path.join(output_dir, "checkpoints")
    return {
        "checkpoints": checkpoints,
        "best": os.path.join(checkpoints, "best.keras"),
        "best_writing": os.path.join(checkpoints, "best.writing.keras"),  # Keras writes here; renamed to best.keras
        "last": os.path.join(checkpoints, "last.keras"),
        "last_writing": os.path.join(checkpoints, "last.writing.keras"),  # renamed to last.keras when complete
        "state": os.path.join(checkpoints, "state.json"),
        "history": os.path.join(output_dir, "history.json"),
        "summary": os.path.join(output_dir, "summary.json"),
        "model": os.path.join(output_dir, "model.keras"),
        "model_writing": os.path.join(output_dir, "model.writing.keras"),  # renamed to model.keras when complete
        "logs": os.path.join(output_dir, LOGS),
    }


def is_url(path: str) -> bool:
    return "://" in path


def record_path(output_dir: str) -> str:
    return os.path.join(output_dir, RECORD_NAME)


def gfile():
    import tensorflow as tf  # only for URLs (gs://)

    return tf.io.gfile


# --- what a run may list ---------------------------------------------------------------------------------------------


def _clean(relative) -> bool:
    """A relative '/'-separated path with no empty, '.' or '..' part and no control character."""
    if not isinstance(relative, str) or not relative or relative.startswith("/"):
        return False
    parts = relative.split("/")
    return all(part not in ("", ".", "..") for part in parts) and not any(ord(c) < 32 for c in relative)


def _in_logs(relative: str) -> bool:
    return relative.startswith(LOGS + "/")


def allowed_file(relative) -> bool:
    """True for a file a run writes: one of ``RUN_FILES``, or under logs/ a TensorBoard event file or profile."""
    if not _clean(relative):
        return False
    if relative in RUN_FILES:
        return True
    parts = relative.split("/")
    if not _in_logs(relative):
        return False
    profile = any(parts[i:i + 2] == list(PROFILE_FOLDERS) for i in range(1, len(parts) - 1))
    return parts[-1].startswith(EVENT_FILE_PREFIX) or profile


def allowed_folder(relative) -> bool:
    return _clean(relative) and (relative in RUN_FOLDERS or _in_logs(relative))


# --- the record -------------------------------------------------------------------------------------------------------


def _damaged(path: str, why: str) -> OutputDirError:
    return OutputDirError(f"{path} is damaged ({why}); it lists what an earlier shardprep train run wrote there, so "
                          "nothing in that folder is touched: move the folder's files away yourself, or choose "
                          "another --output-dir")


def _read_record_bytes(path: str) -> bytes | None:
    """The record's bytes (at most one more than ``MAX_RECORD_BYTES``), None when there is none."""
    if is_url(path):
        if not gfile().exists(path):
            return None
        if gfile().isdir(path):
            raise OutputDirError(f"{path} is a folder, not the run record shardprep train writes; nothing there is "
                                 "touched: choose another --output-dir")
        with gfile().GFile(path, "rb") as f:
            return f.read(MAX_RECORD_BYTES + 1)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise OutputDirError(f"{path} is {'a link' if stat.S_ISLNK(info.st_mode) else 'not a regular file'}, not "
                             "the run record shardprep train writes; nothing there is touched: choose another "
                             "--output-dir")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_RECORD_BYTES + 1)


def read_record(output_dir: str) -> RunRecord | None:
    """The run record in ``output_dir``, None when there is none; an :class:`OutputDirError` when it is damaged or
    lists anything a run never writes."""
    path = record_path(output_dir)
    try:
        data = _read_record_bytes(path)
    except OSError as error:
        raise OutputDirError(f"cannot read {path}: {error.strerror or error}") from None
    if data is None:
        return None
    if len(data) > MAX_RECORD_BYTES:
        raise _damaged(path, f"more than {MAX_RECORD_BYTES:,} bytes, more than any run writes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise _damaged(path, f"not JSON: {str(error)[:80] or type(error).__name__}") from None
    if not isinstance(document, dict):
        raise _damaged(path, f"a JSON {type(document).__name__}, not an object")
    if document.get("format") != RECORD_FORMAT:
        raise _damaged(path, f"format {document.get('format')!r}, not {RECORD_FORMAT}")
    files, folders = document.get("files"), document.get("folders")
    if not isinstance(files, list) or not isinstance(folders, list):
        raise _damaged(path, "'files' and 'folders' must be lists")
    for relative in files:
        if not allowed_file(relative):
            raise _damaged(path, f"it lists {relative!r}, which no shardprep train run writes")
    for relative in folders:
        if not allowed_folder(relative):
            raise _damaged(path, f"it lists the folder {relative!r}, which no shardprep train run makes")
    return RunRecord(frozenset(files), frozenset(folders))


def write_record(output_dir: str, record: RunRecord) -> None:
    """Writes the record under a temporary name (never through a link) and renames it into place."""
    document = {"format": RECORD_FORMAT, "written_by": "shardprep train",
                "about": "the files a shardprep train run wrote here: the only ones --overwrite deletes",
                "files": sorted(record.files), "folders": sorted(record.folders)}
    data = (json.dumps(document, indent=1) + "\n").encode()
    if is_url(output_dir):
        with gfile().GFile(os.path.join(output_dir, RECORD_TEMPORARY), "wb") as f:
            f.write(data)
        gfile().rename(os.path.join(output_dir, RECORD_TEMPORARY), record_path(output_dir), overwrite=True)
        return
    folder = os.open(output_dir, NOFOLLOW_DIR)
    try:
        fd = os.open(RECORD_TEMPORARY, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644,
                     dir_fd=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(RECORD_TEMPORARY, RECORD_NAME, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


# --- what a run writes ------------------------------------------------------------------------------------------------


def claim(output_dir: str, resume: bool) -> None:
    """Makes ``output_dir`` (if missing) and writes the run record listing every file the run may write, before it
    writes any; ``resume`` keeps what the record already lists (an earlier process's event files)."""
    if is_url(output_dir):
        gfile().makedirs(output_dir)
    else:
        os.makedirs(output_dir, exist_ok=True)
    existing = read_record(output_dir) if resume else None
    record = RunRecord(frozenset(RUN_FILES) | (existing.files if existing else frozenset()),
                       frozenset(RUN_FOLDERS) | (existing.folders if existing else frozenset()))
    if record != existing:
        write_record(output_dir, record)


def check_not_busy(output_dir: str) -> None:
    """Refuses a local ``output_dir`` whose lock a live run holds, before its contents are judged (whatever else
    would be refused, the run writing there is what to know)."""
    if not is_url(output_dir):
        holder = folder_lock.held_by(os.path.join(output_dir, LOCK_NAME))
        if holder is not None:
            raise OutputDirError(busy_message(output_dir, holder))


def busy_message(output_dir: str, holder: str) -> str:
    return f"another shardprep run is writing to {output_dir} ({holder}); wait for it to finish or stop it"


@contextlib.contextmanager
def holding_lock(output_dir: str):
    """Holds ``output_dir``'s ``.shardprep.lock`` (``preprocess.folder_lock``) around a run's clearing, claiming
    and training, so that a second run into the same folder (``--overwrite`` or ``--resume`` from another
    terminal) is refused while this one writes there. Makes the folder if it is missing; removes the lock file when
    the run ends. URLs (``gs://``) have no lock."""
    if is_url(output_dir):
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_NAME)
    try:
        fd, _ = folder_lock.take(path)
    except folder_lock.LockHeld as held:
        raise OutputDirError(busy_message(output_dir, held.holder)) from None
    except folder_lock.NotALockFile:
        raise OutputDirError(f"{path} is not a regular file (a link, a folder or a special file), not a lock file "
                             "shardprep made; nothing was changed: remove it yourself if no shardprep run is "
                             "writing there") from None
    try:
        yield
    finally:
        folder_lock.release(path, fd)


def children(folder: str) -> list[tuple[str, str]]:
    """(name, kind) of what ``folder`` holds, kind "folder", "file", "link" or "special"; links are not followed."""
    if is_url(folder):
        if not gfile().isdir(folder):
            return []
        return [(name.rstrip("/"), "folder" if gfile().isdir(os.path.join(folder, name.rstrip("/"))) else "file")
                for name in gfile().listdir(folder)]
    if os.path.islink(folder) or not os.path.isdir(folder):
        return []  # a link is never looked through
    with os.scandir(folder) as listing:
        return [(entry.name, kind(entry)) for entry in listing]


def kind(entry: os.DirEntry) -> str:
    """"link", "folder", "file", "hard link" (a file with another name too: writing it in place would change that
    one) or "special" (a FIFO, socket or device)."""
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "folder"
    if not entry.is_file(follow_symlinks=False):
        return "special"
    return "file" if entry.stat(follow_symlinks=False).st_nlink == 1 else "hard link"


def record_new_files(output_dir: str) -> None:
    """Adds TensorBoard's files under logs/ (and their folders) to the run record; nothing without a record (a run
    started from Python rather than ``shardprep train``)."""
    record = read_record(output_dir)
    if record is None:
        return
    files, folders = set(record.files), set(record.folders)
    pending = [LOGS]
    while pending:
        relative = pending.pop()
        for name, found in children(os.path.join(output_dir, relative)):
            path = f"{relative}/{name}"
            if found == "folder" and allowed_folder(path):
                folders.add(path)
                pending.append(path)
            elif found == "file" and allowed_file(path):
                files.add(path)
    if files != record.files or folders != record.folders:
        write_record(output_dir, RunRecord(frozenset(files), frozenset(folders)))


def event_file_recorder(output_dir: str):
    """A Keras callback recording TensorBoard's files in the run record at the start, every epoch end and the end;
    put it after the TensorBoard callback, so that it sees the files that callback has just made."""
    import keras

    class EventFileRecorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            record_new_files(output_dir)

        def on_epoch_end(self, epoch, logs=None):
            record_new_files(output_dir)

        def on_train_end(self, logs=None):
            record_new_files(output_dir)

    return EventFileRecorder()


_UNPRINTABLE = {*range(32), 0x7F, *range(0x80, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def printable(text: str) -> str:
    """``text`` with control and bidi characters escaped (``\\x1b``), so a file name cannot rewrite the terminal."""
    return "".join(c if ord(c) not in _UNPRINTABLE else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


RESUME_HINT = "--resume to continue from the last checkpoint (--overwrite when there is none)"


def user_name(path: str) -> str:
    """The name a user knows for ``path``: ``best.keras`` for the ``best.writing.keras`` it is written under."""
    return path[:-len(WRITING_SUFFIX)] + ".keras" if path.endswith(WRITING_SUFFIX) else path


WRITING_SUFFIX = ".writing.keras"  # a model written under a temporary name, renamed to NAME.keras when whole


def describe_os_error(error: OSError, doing: str = "writing") -> str:
    """One line for a failed file operation: the path and the cause (``[Errno 28] No space left on device``)."""
    where = f" {user_name(str(error.filename))}" if error.filename else ""
    cause = error.strerror or str(error)
    hint = (f"; free some space, then rerun with {RESUME_HINT}" if error.errno == errno.ENOSPC else "")
    return f"{doing}{where} failed: {cause}{hint}"
