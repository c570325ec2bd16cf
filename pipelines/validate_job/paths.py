"""Where validate may write (--json, --pictures, --leaked-keys), checked before anything runs (never inside the
dataset, links and bind mounts seen through, nor onto a file DATA reads), and what a run has written so far."""

from __future__ import annotations

import contextlib
import dataclasses
import os

from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.runtime import storage
from shardprep.pipelines.validate_job.pictures import (CLASS_COUNTS_NAME, CONTACT_SHEET_NAME, MAX_PAGES,
                                                     NEAR_DUPLICATES_HTML, NEAR_DUPLICATES_NAME, page_name)
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.checks import untrusted

# what --pictures writes (the near-duplicate pages as far as they may run)
PICTURE_NAMES = (CONTACT_SHEET_NAME, NEAR_DUPLICATES_NAME, NEAR_DUPLICATES_HTML, CLASS_COUNTS_NAME,
                 *(page_name(page) for page in range(2, MAX_PAGES + 1)))


class ValidateError(Exception):
    """Validation cannot run at all (not: the dataset has problems); the message is meant for the user."""


@dataclasses.dataclass
class WrittenOutputs:
    """What a validate run has written so far, for what it says after a stop: a file of the same name that is not
    listed here is an earlier run's. ``files``: (flag, path) as each file is in place (``--leaked-keys``, then each
    of ``--pictures``' pictures, then ``--json``); ``whole``: the flags whose output is complete."""
    files: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    whole: list[str] = dataclasses.field(default_factory=list)

    def write(self, flag: str, path: str, data: bytes, mime_type: str, whole: bool = True) -> str:
        """Writes ``data`` renamed over ``path`` (a link replaced, not written through), then records it; returns it."""
        storage.atomic_write(path, data, mime_type)
        self.files.append((flag, path))
        if whole:
            self.whole.append(flag)
        return path


def data_kind(data: str):
    """DATA's source kind as validate reads it: a local folder named like an archive is a folder (``FALLBACK``)."""
    kind = source_registry.kind_of(data)
    if (kind is not source_registry.FALLBACK and not kind.validated_as_records and storage.is_local(data)
            and os.path.isdir(absolute(data))):
        return source_registry.FALLBACK
    return kind


def absolute(path: str) -> str:
    """Local paths made absolute (so listed files can be made relative again); remote ones unchanged."""
    return os.path.abspath(path.removeprefix("file://")) if storage.is_local(path) else path


def check_output_paths(options) -> None:
    """Refuses, before anything runs, two outputs on one path, one inside the dataset DATA, and one not writable."""
    json_path, pictures, leaked_keys, data = options.json_path, options.pictures, options.leaked_keys, options.data
    given = [(flag, path) for flag, path in (("--json", json_path), ("--leaked-keys", leaked_keys),
                                             ("--pictures", pictures)) if path]
    for i, (flag, path) in enumerate(given):  # the second write would replace the first, both claimed written
        for other_flag, other in given[i + 1:]:
            if storage.resolved(path) == storage.resolved(other):
                raise ValidateError(f"{flag} {path} and {other_flag} {other} are the same path: each output needs "
                                    "its own; choose another path for one of them")
    for flag, path in given:
        if flag != "--pictures" and pictures and storage.resolved(path) in _pictures(pictures):
            raise ValidateError(f"{flag} {path} is a picture --pictures {pictures} writes: each output needs its own "
                                "path; choose another")
    for flag, path in given:
        if data_kind(data) is source_registry.FALLBACK and _inside(path, data):
            raise ValidateError(f"{flag} {path} is inside the dataset {data}: validate writes nothing there; choose "
                                "a path outside it")
    if json_path and storage.is_local(json_path):
        _check_file_path("--json", json_path, "the report", "report.json")
    if leaked_keys and storage.is_local(leaked_keys):
        _check_file_path("--leaked-keys", leaked_keys, "the keys", "leaked-keys.txt")
    if pictures and storage.is_local(pictures):
        _check_pictures(pictures)


def _pictures(pictures: str) -> set[str]:
    return {storage.resolved(manifest_lib.join(pictures, name)) for name in PICTURE_NAMES}


def check_not_read(options, read_files: list[str]) -> None:
    """Refuses an output that is one of ``read_files`` (what a ``tfrecord:``/``tfds:`` DATA matched)."""
    read = {storage.resolved(path) for path in read_files}
    for flag, given in (("--json", options.json_path), ("--leaked-keys", options.leaked_keys)):
        if given and storage.resolved(given) in read:
            raise ValidateError(f"{flag} {given} is a file that {options.data} reads: validate writes nothing "
                                "there; choose another path")
    if options.pictures and _pictures(options.pictures) & read:
        raise ValidateError(f"--pictures {options.pictures} holds files that {options.data} reads: validate writes "
                            "nothing there; choose another folder")


def _inside(given: str, data: str) -> bool:
    """``given`` inside the folder ``data``, however spelled, or through a bind mount of it (by device and inode)."""
    folder = storage.resolved(given)
    if storage.inside(folder, storage.resolved(data)):
        return True
    if not (storage.is_local(given) and storage.is_local(data)):
        return False
    with contextlib.suppress(OSError):
        data_folder = os.stat(storage.resolved(data))
        while folder != os.path.dirname(folder):
            with contextlib.suppress(OSError):
                if os.path.samestat(os.stat(folder), data_folder):
                    return True
            folder = os.path.dirname(folder)
    return False


def _check_pictures(pictures: str) -> None:
    path = absolute(pictures)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValidateError(f"--pictures {pictures} is a file, not a folder; give a folder for the pictures")
    existing = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isdir(existing):
        raise ValidateError(f"--pictures {pictures}: the folder {existing} does not exist; create it or choose "
                            "another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValidateError(f"--pictures {pictures}: cannot write into {existing} (permission denied); choose a "
                            "writable folder")
    for named in (os.path.join(path, name) for name in PICTURE_NAMES):
        if os.path.lexists(named) and not os.path.islink(named) and not os.path.isfile(named):
            raise ValidateError(f"--pictures {pictures}: {named} is {untrusted.file_kind(named)}, where the picture "
                                "of that name goes; move it or choose another folder")


def _check_file_path(flag: str, given: str, what: str, example: str) -> None:
    path = absolute(given)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise ValidateError(f"{flag} {given} is a folder; give a file name for {what}, "
                            f"e.g. {manifest_lib.join(given, example)}")
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the write, a device swallow it
        raise ValidateError(f"{flag} {given} is {untrusted.file_kind(path)}, not a file; give a file name for {what}")
    if not os.path.isdir(parent):
        raise ValidateError(f"{flag} {given}: the folder {parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValidateError(f"{flag} {given}: cannot write there (permission denied); choose a writable path")
