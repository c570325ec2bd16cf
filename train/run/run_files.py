"""What a ``shardprep train`` run owns in ``--output-dir`` (docs/safety.md, on ``owned_folder``'s model): its files,
and its record listing every file it may write, written first (:func:`claim`). No Keras or TensorFlow.
"""

from __future__ import annotations

import errno
import os

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


def make_dirs(path: str) -> None:
    if is_url(path):
        owned_folder.gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def claim(output_dir: str, resume: bool) -> None:
    """Makes ``output_dir`` (if missing) and writes the record listing every file the run may write, before it
    writes any; ``resume`` keeps what the record already lists (an earlier process's event files)."""
    make_dirs(output_dir)
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


def holds_files(found: list[Entry]) -> bool:
    """Whether a folder holds more than the run record and empty folders (a run that stopped before writing)."""
    return any(entry.kind != "folder" and entry.relative not in (RECORD_NAME, LOCK_NAME) for entry in found)
