"""The output lock: OUTPUT/.shardprep.lock, held (``flock``) for a whole run and removed when the run ends.

A second run into the same local OUTPUT is refused while the first holds the lock. The kernel releases a flock
when its holder dies, so a killed run never blocks the rerun: the lock file it leaves is taken over, and what it said
(the killed run's pid, host and start) is named in the refusal of a non-empty OUTPUT. Finished and failed runs
remove the file; a refused run leaves a stale one as it found it.
"""

from __future__ import annotations

import contextlib
import os

from shardprep.pipelines.storage import OutputError, is_local, make_folder, special_kind
from shardprep.preprocess import folder_lock, manifest


class Lock:
    """A held output lock. ``stale``: what the lock file said when this run found it left by a run that had stopped
    without removing it (killed), else None. ``begin()``: the run is past its refusals and changes OUTPUT; until
    then, a stale lock file is put back as it was when the run ends, so that a refusal changes nothing."""

    def __init__(self, stale: str | None = None):
        self.stale, self.began = stale, False

    def begin(self) -> None:
        self.began = True


@contextlib.contextmanager
def output_lock(output: str):
    """Holds OUTPUT/.shardprep.lock for the whole run, so a second run into the same OUTPUT is refused; yields a
    ``Lock``. The lock file exists only while a run holds it: it is removed when the run ends, finished or failed.

    Locally this is an advisory ``flock``: the kernel releases it when the holder dies, so a killed run never
    blocks the rerun; the file it leaves is taken over, and what it said is ``Lock.stale`` (put back if this run is
    refused before it changes anything, ``Lock.begin``). A lock file that is a
    link or not a regular file is refused, untouched. An OUTPUT this run created is removed again if the run leaves
    it empty. On object stores there is no lock: there, a second run is refused because OUTPUT is not empty, unless
    it passes --overwrite.
    """
    if not is_local(output):
        yield Lock()
        return
    created = not os.path.lexists(output)
    make_folder(output)
    path = os.path.join(output, manifest.LOCK_NAME)
    try:
        fd, stale = _take_lock(output, path)
    except BaseException:
        _remove_if_empty(output, created)
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
            _remove_if_empty(output, created)


def _take_lock(output: str, path: str) -> tuple[int, str | None]:
    """(the lock file's descriptor, flocked and naming this process; what a stale lock file said, or None)."""
    try:
        return folder_lock.take(path)
    except folder_lock.NotALockFile:
        kind = special_kind(path)
        kind = "a folder" if kind == "folder" else kind
        raise OutputError(f"{path} is {kind}, not a lock file shardprep made; nothing was changed: remove it "
                          "yourself if no shardprep run is writing there") from None
    except folder_lock.LockHeld as held:
        raise OutputError(f"another shardprep run is writing to {output} ({held.holder}); wait for it to finish or "
                          "stop it") from None
    except OSError as e:
        raise OutputError(f"OUTPUT {output} cannot be written: {e.strerror or e}; pick another OUTPUT") from None


remove_lock_file = folder_lock.remove_lock_file


def _remove_if_empty(output: str, created: bool) -> None:
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(output)
