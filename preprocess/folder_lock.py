"""The lock a run holds on the folder it writes (``.shardprep.lock``): an advisory ``flock`` on a file naming the
holder, for preprocess's OUTPUT and train's --output-dir alike.

The kernel releases a flock when its holder dies, so a killed run never blocks the next one: the file it leaves is
taken over, and what it said is returned as stale. The holder removes the file when it ends (:func:`release`), while
it still holds the flock. Nothing here follows a link: a lock path that is a link or not a regular file is refused.
Callers say what a refusal means for their folder.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import stat

LOCK_NAME = ".shardprep.lock"


class LockHeld(Exception):
    """Another live process holds the lock; ``holder`` is what its lock file says (pid, host, start)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


class NotALockFile(Exception):
    """The lock path exists but is a link, a folder or a special file: not a lock file a run made."""


def take(path: str) -> tuple[int, str | None]:
    """Takes the lock at ``path``: (its descriptor, flocked and naming this process; what a stale lock file left by
    a stopped run said, or None). Raises :class:`LockHeld`, :class:`NotALockFile` or the ``OSError`` of opening it."""
    import fcntl
    import socket

    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError:
            if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
                raise NotALockFile(path) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotALockFile(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
            os.close(fd)
            raise LockHeld(holder) from None
        if same_file(fd, path):
            break
        os.close(fd)  # the holder removed it as it finished: take the lock anew
    stale = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                  f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(), 0)
    return fd, stale


def held_by(path: str) -> str | None:
    """What the lock file at ``path`` says of the live process holding it (pid, host, start), or None when no
    process holds it (no file, a stale one, or not a regular file: :func:`take` decides those). Takes nothing."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
        return None  # closing the descriptor drops the shared lock just taken
    finally:
        os.close(fd)


def same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove_lock_file(path: str, fd: int) -> None:
    """Removes the lock file while its flock is held, if it is still the file this run locked."""
    if same_file(fd, path):
        with contextlib.suppress(OSError):
            os.remove(path)


def release(path: str, fd: int) -> None:
    """Removes the lock file (still holding the flock) and closes it, which releases the flock."""
    try:
        remove_lock_file(path, fd)
    finally:
        os.close(fd)
