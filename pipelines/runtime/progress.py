"""Progress of local runs: workers write running counts to small files the launcher polls (Beam's local runner
reports metrics only at the end). Remote runners show progress in their own UI: the folder is None, calls no-ops."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid

from shardprep.pipelines.runtime.storage import TEMPORARY_PREFIX, atomic_write


class ProgressReporter:
    """A worker's running count of ``counter``, written to a file of its own at most every half second."""

    def __init__(self, directory: str | None, counter: str):
        self.directory, self.count, self._last = directory, 0, 0.0
        self._path = _counter_file(directory, counter) if directory else ""

    def add(self, n: int = 1, now: bool = False) -> None:
        if not self.directory:
            return
        self.count += n
        if now or time.monotonic() - self._last >= 0.5:
            self.flush()
            self._last = time.monotonic()

    def flush(self, zero: bool = False) -> None:
        """Writes the running count; a count of 0 only when ``zero`` (it then says the counter exists)."""
        if self.directory and (self.count or zero):
            atomic_write(self._path, str(self.count).encode())  # the launcher never reads half a number


def _counter_file(directory: str, counter: str) -> str:
    return os.path.join(directory, f"{counter}-{os.getpid()}-{uuid.uuid4().hex}")


def read_progress(directory: str) -> dict[str, int]:
    totals: collections.Counter = collections.Counter()
    with contextlib.suppress(FileNotFoundError):
        for name in (name for name in os.listdir(directory) if not name.startswith(TEMPORARY_PREFIX)):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(directory, name)) as f:
                totals[name.split("-", 1)[0]] += int(f.read() or 0)
    return dict(totals)


def mark(directory: str | None, **counts: int) -> None:
    """Adds ``counts`` once (e.g. one finished file and its records), as files of their own."""
    if directory is None:
        return
    for counter, value in counts.items():
        with open(_counter_file(directory, counter), "w") as f:
            f.write(str(value))


@contextlib.contextmanager
def watching(enabled: bool, on_counts, prefix: str, interval_s: float = 0.5):
    """Yields a progress folder (None when not ``enabled``) and calls ``on_counts(totals)`` while it is used."""
    if not enabled:
        yield None
        return
    directory = tempfile.mkdtemp(prefix=prefix)
    stop = threading.Event()

    def poll():
        while not stop.wait(interval_s):
            on_counts(read_progress(directory))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield directory
    finally:
        stop.set()
        watcher.join()
        on_counts(read_progress(directory))
        shutil.rmtree(directory, ignore_errors=True)
