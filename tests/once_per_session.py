"""A result made once for the whole test session, however many pytest-xdist processes ask for it: the first to ask
makes it under a file lock in the folder the session's processes share, the others read what it wrote there.

pytest-xdist gives each process a temporary folder ``popen-gwN`` inside one folder of the session (its
documentation's way to run a session fixture once); without xdist the result is simply made.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Callable


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object]) -> object:
    """``make(folder)``'s JSON-able result, made in ``folder`` once per session."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    folder = tmp_path_factory.getbasetemp().parent / name
    folder.mkdir(exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        result = folder.parent / f"{name}.json"  # beside the folder: it holds only what ``make`` writes
        if not result.exists():
            result.write_text(json.dumps(make(folder)))
        return json.loads(result.read_text())
