"""A folder a shardprep command owns while it writes there (docs/safety.md): its lock (an advisory ``flock`` on
``.shardprep.lock``, naming the holder; a killed run's is taken over), its ownership record (train's
``.shardprep-train.json``: only listed files are deleted, never through a link) and the one error every refusal
raises. URLs (``gs://``: no links, no locks) go through ``tf.io.gfile``, imported only for them."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import os
import posixpath
import socket
import stat
from typing import Callable, NamedTuple

LOCK_NAME = ".shardprep.lock"
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
MAX_RECORD_BYTES = 16 * 2**20


class OutputError(ValueError):
    """A folder a command would write cannot be used as asked; the message is one line for the user."""


def is_url(path: str) -> bool:
    return "://" in path


def gfile():
    import tensorflow as tf  # only for URLs (gs://)

    return tf.io.gfile


def normalized_url(url: str) -> str:
    """``scheme://bucket/key`` without ``..``, ``.``, doubled or trailing slashes."""
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/")
    return f"{scheme}://{bucket}" + (f"/{key}" if key else "")


@dataclasses.dataclass
class Lock:
    """A held lock. ``stale``: what a lock file left by a killed run said, else None. Until :meth:`begin` (the run
    is past its refusals), a stale lock file is put back as found when the run ends: a refusal changes nothing."""
    stale: str | None = None
    began: bool = False

    def begin(self) -> None:
        self.began = True


def _holder(fd: int) -> str:
    return os.pread(fd, 512, 0).decode("utf-8", "replace").strip()


def special_kind(path: str) -> str | None:
    """'a folder', 'a link to T', 'a FIFO', 'a socket' or 'a device'; None for a regular file or none."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return f"a link to {os.readlink(path)}"
    return (None if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device")


def check_creatable(folder: str, named: str, advice: str) -> None:
    """Refuses a local ``folder`` (``named`` for the user) that is no folder, or under a dangling link or a file, or
    whose nearest existing folder cannot be written; ``advice`` ends the line. Nothing is created."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe):  # the root always exists
        if os.path.islink(probe):
            raise OutputError(f"{named} cannot be created: {probe} is a dangling link (to {os.readlink(probe)}, which "
                              f"does not exist); {advice}")
        probe = os.path.dirname(probe)
    kind = lambda path: "a file" if os.path.isfile(path) else special_kind(path) or "no folder"  # noqa: E731
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise OutputError(f"{named} is {kind(folder)}, not a folder; {advice}")
    if not os.path.isdir(probe):
        raise OutputError(f"{named} cannot be created: {probe} is {kind(probe)}, not a folder; {advice}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{named}: cannot write into {probe} (permission denied); {advice}")


def busy_message(folder: str, holder: str) -> str:
    return f"another shardprep run is writing to {folder} ({holder}); wait for it to finish or stop it"


def _take(folder: str, path: str) -> tuple[int, str | None]:
    """(the lock file's descriptor, flocked and naming this process; what a stale lock file said, or None)."""
    import fcntl

    not_ours = (f"{path} is {{}}, not a lock file shardprep made; nothing was changed: remove it yourself if no "
                "shardprep run is writing there")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError:
            if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
                raise OutputError(not_ours.format(special_kind(path) or "no regular file")) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(not_ours.format(special_kind(path) or "no regular file"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd) or "unknown process"
            os.close(fd)
            raise OutputError(busy_message(folder, holder)) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed it as it finished: take the lock anew
    stale = _holder(fd) or None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                  f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(), 0)
    return fd, stale


def held_by(folder: str) -> str | None:
    """What ``folder``'s lock file says of the live run holding it, or None when none does. Takes nothing."""
    import fcntl

    try:
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder(fd) or "unknown process"
        return None  # closing the descriptor drops the shared lock just taken
    finally:
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove_lock_file(path: str, fd: int) -> None:
    """Removes the lock file while its flock is held, if it is still the file this run locked."""
    if _same_file(fd, path):
        with contextlib.suppress(OSError):
            os.remove(path)


@contextlib.contextmanager
def holding(folder: str, what: str):
    """Holds ``folder``'s lock for the block, making the folder if missing (and removing it again if the run leaves
    it empty); yields a :class:`Lock`. ``what``: the folder's name for the user (``OUTPUT``, ``--output-dir``).
    A second run is refused (:class:`OutputError`) while one holds it; URLs have no lock."""
    if is_url(folder):
        yield Lock()
        return
    created, path = not os.path.lexists(folder), os.path.join(folder, LOCK_NAME)
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{what} {folder} exists and is not a folder; pick another {what}") from None
    except OSError as e:
        raise OutputError(f"{what} {folder} cannot be created: {e.strerror or e}; pick another {what}") from None
    try:
        fd, stale = _take(folder, path)
    except OSError as e:
        _remove_if_empty(folder, created)
        raise OutputError(f"{what} {folder} cannot be written: {e.strerror or e}; pick another {what}") from None
    except BaseException:
        _remove_if_empty(folder, created)
        raise
    lock = Lock(stale)
    try:
        yield lock
    finally:
        try:
            if stale and not lock.began:  # a refusal: the stopped run's lock file stays as it was found
                os.ftruncate(fd, 0)
                os.pwrite(fd, (stale + "\n").encode("utf-8"), 0)
            else:
                remove_lock_file(path, fd)
        finally:
            os.close(fd)  # releases the flock
            _remove_if_empty(folder, created)


def _remove_if_empty(folder: str, created: bool) -> None:
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


class Entry(NamedTuple):
    """Something in an owned folder: its relative path and kind (file, folder, link, hard link or special)."""
    relative: str
    kind: str


class Record(NamedTuple):
    """The ownership record: the files and folders a run wrote (or was about to), relative '/'-separated paths."""
    files: frozenset
    folders: frozenset


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


def children(folder: str) -> list[tuple[str, str]]:
    """(name, kind) of what ``folder`` holds; a link is never looked through."""
    if is_url(folder):
        if not gfile().isdir(folder):
            return []
        return [(name.rstrip("/"), "folder" if gfile().isdir(os.path.join(folder, name.rstrip("/"))) else "file")
                for name in gfile().listdir(folder)]
    if os.path.islink(folder) or not os.path.isdir(folder):
        return []
    with os.scandir(folder) as listing:
        return [(entry.name, kind(entry)) for entry in listing]


def entries(folder: str, record: Record | None = None) -> list[Entry]:
    """What ``folder`` holds, without following links: the top, and inside the folders ``record`` lists."""
    found, pending = [], [""]
    while pending:
        relative = pending.pop()
        for name, found_kind in children(os.path.join(folder, relative) if relative else folder):
            path = posixpath.join(relative, name) if relative else name
            found.append(Entry(path, found_kind))
            if found_kind == "folder" and record is not None and path in record.folders:
                pending.append(path)
    return sorted(found)


def foreign(found: list[Entry], record: Record, own_files: tuple = ()) -> list[Entry]:
    """The entries no run wrote: links, special files, and what ``record`` (or ``own_files``) does not list."""
    ours = {name: "file" for name in (LOCK_NAME, *own_files, *record.files)}
    ours.update({name: "folder" for name in record.folders})
    return [entry for entry in found if ours.get(entry.relative) != entry.kind]


def names(found: list[Entry], limit: int = 5) -> str:
    shown = [{"folder": e.relative + "/", "link": f"{e.relative} (a link)",
              "special": f"{e.relative} (not a regular file)",
              "hard link": f"{e.relative} (a hard link to another file)"}.get(e.kind, e.relative) for e in found[:limit]]
    return ", ".join(shown) + (f" and {len(found) - limit} more" if len(found) > limit else "")


class RecordKind(NamedTuple):
    """Whose record a file is: its name, the command that writes it, and the paths that command may list."""
    name: str
    writer: str
    allowed_file: Callable[[object], bool]
    allowed_folder: Callable[[object], bool]


RECORD_FORMAT = 1


def _read_bytes(path: str, writer: str) -> bytes | None:
    """At most one byte more than ``MAX_RECORD_BYTES`` of the record, None when there is none; never a link."""
    if is_url(path):
        if not gfile().exists(path):
            return None
        if gfile().isdir(path):
            raise OutputError(f"{path} is a folder, not the run record {writer} writes; nothing there is "
                              "touched: choose another --output-dir")
        with gfile().GFile(path, "rb") as f:
            return f.read(MAX_RECORD_BYTES + 1)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{path} is {'a link' if stat.S_ISLNK(info.st_mode) else 'not a regular file'}, not the "
                          f"run record {writer} writes; nothing there is touched: choose another --output-dir")
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        return f.read(MAX_RECORD_BYTES + 1)


def read_record(folder: str, owner: RecordKind) -> Record | None:
    """``folder``'s record, None when there is none; untrusted: an :class:`OutputError` when it is damaged or lists
    anything ``owner`` never writes."""
    path = os.path.join(folder, owner.name)
    try:
        data = _read_bytes(path, owner.writer)
    except OSError as error:
        raise OutputError(f"cannot read {path}: {error.strerror or error}") from None
    if data is None:
        return None

    def damaged(why: str) -> OutputError:
        return OutputError(f"{path} is damaged ({why}); it lists what an earlier {owner.writer} run wrote there, so "
                           "nothing in that folder is touched: move the folder's files away yourself, or choose "
                           "another --output-dir")

    if len(data) > MAX_RECORD_BYTES:
        raise damaged(f"more than {MAX_RECORD_BYTES:,} bytes, more than any run writes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise damaged(f"not JSON: {str(error)[:80] or type(error).__name__}") from None
    if not isinstance(document, dict):
        raise damaged(f"a JSON {type(document).__name__}, not an object")
    if document.get("format") != RECORD_FORMAT:
        raise damaged(f"format {document.get('format')!r}, not {RECORD_FORMAT}")
    files, folders = document.get("files"), document.get("folders")
    if not isinstance(files, list) or not isinstance(folders, list):
        raise damaged("'files' and 'folders' must be lists")
    for relative in files:
        if not owner.allowed_file(relative):
            raise damaged(f"it lists {relative!r}, which no {owner.writer} run writes")
    for relative in folders:
        if not owner.allowed_folder(relative):
            raise damaged(f"it lists the folder {relative!r}, which no {owner.writer} run makes")
    return Record(frozenset(files), frozenset(folders))


def write_record(folder: str, owner: RecordKind, record: Record) -> None:
    """Writes the record under ``NAME.tmp`` (never through a link) and renames it into place."""
    document = {"format": RECORD_FORMAT, "written_by": owner.writer,
                "about": f"the files a {owner.writer} run wrote here: the only ones --overwrite deletes",
                "files": sorted(record.files), "folders": sorted(record.folders)}
    data, temporary = (json.dumps(document, indent=1) + "\n").encode(), owner.name + ".tmp"
    if is_url(folder):
        with gfile().GFile(os.path.join(folder, temporary), "wb") as f:
            f.write(data)
        gfile().rename(os.path.join(folder, temporary), os.path.join(folder, owner.name), overwrite=True)
        return
    at = os.open(folder, NOFOLLOW_DIR)
    try:
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644,
                               dir_fd=at), "wb") as f:
            f.write(data)
        os.replace(temporary, owner.name, src_dir_fd=at, dst_dir_fd=at)
    finally:
        os.close(at)


def clear(folder: str, record: Record) -> list[str]:
    """Deletes the files ``record`` lists (never through a link), then its folders left empty, deepest first;
    returns the files deleted. A listed path that is not a regular file, or reached through a link, stops it."""
    if is_url(folder):  # object stores keep no empty folders to remove
        paths = {relative: f"{folder.rstrip('/')}/{relative}" for relative in sorted(record.files)}
        gone = [relative for relative, path in paths.items() if gfile().exists(path) and not gfile().isdir(path)]
        for relative in gone:
            gfile().remove(paths[relative])
        return gone
    root = os.open(folder, NOFOLLOW_DIR)
    try:
        deleted = [relative for relative in sorted(record.files) if _remove_at(root, relative, folder)]
        for relative in sorted(record.folders, key=lambda listed: (-listed.count("/"), listed)):
            _remove_at(root, relative, folder, is_folder=True)
    finally:
        os.close(root)
    return deleted


def _remove_at(root: int, relative: str, folder: str, is_folder: bool = False) -> bool:
    """Removes ``relative`` under the folder open as ``root``: a regular file, or an empty folder; True if removed."""
    *parents, name = relative.split("/")
    shown, opened, at = os.path.join(folder, relative), [], root
    try:
        for part in parents:
            try:
                at = os.open(part, NOFOLLOW_DIR, dir_fd=at)
            except FileNotFoundError:
                return False
            except OSError:
                raise OutputError(f"{shown} was not deleted: {part} on its way is a link or not a folder, which no "
                                  "run makes") from None
            opened.append(at)
        try:
            mode = os.stat(name, dir_fd=at, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return False
        if is_folder and not stat.S_ISDIR(mode):
            return False
        if not is_folder and not stat.S_ISREG(mode):
            raise OutputError(f"{shown} was not deleted: it is not a regular file (a link, folder or device), which "
                              "no run writes")
        try:
            (os.rmdir if is_folder else os.unlink)(name, dir_fd=at)
        except OSError as error:
            if is_folder and error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                return False
            raise OSError(error.errno, error.strerror or str(error), shown) from error  # the whole path named
        return True
    finally:
        for fd in opened:
            os.close(fd)
