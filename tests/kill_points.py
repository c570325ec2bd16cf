"""A real ``shardprep preprocess`` process killed with SIGKILL at an exact point of its code.

The job runs in one process (``--direct_running_mode=in_memory``), so a function of the job can be wrapped before
the command starts: the wrapper sends SIGKILL to its own process before (or after) the n-th call whose first
argument, a path, ends with a given suffix. The kill is as real as any: nothing after it runs, no ``finally``, no
exit hook; what the process had written stays as the kernel holds it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import NamedTuple

WAIT_S = 240  # only against hangs on a loaded machine; nothing asserts on time

_SCRIPT = """
import importlib, os, signal, sys, threading
module_name, function_name, nth, after, suffix = sys.argv[1:6]
module, nth, after = importlib.import_module(module_name), int(nth), after == "after"
original, calls, counting = getattr(module, function_name), [0], threading.Lock()

def killing(*args, **kwargs):
    first = args[0] if args else ""
    if suffix and not (isinstance(first, str) and first.endswith(suffix)):
        return original(*args, **kwargs)
    with counting:  # the runner's threads call it concurrently (two splits' shards at once)
        calls[0] += 1
        index = calls[0]
    if index == nth and not after:
        os.kill(os.getpid(), signal.SIGKILL)
    result = original(*args, **kwargs)
    if index == nth and after:
        os.kill(os.getpid(), signal.SIGKILL)
    return result

setattr(module, function_name, killing)
from shardprep.cli import main
main(sys.argv[6:], prog_name="shardprep")
"""


class KillPoint(NamedTuple):
    """Where the process dies: ``before`` or ``after`` the ``nth`` call of ``module.function`` (counting only calls
    whose first argument ends with ``suffix``, when one is given)."""

    module: str
    function: str
    nth: int = 1
    when: str = "before"
    suffix: str = ""

    def __str__(self) -> str:
        what = f"{self.function}({'…' + self.suffix if self.suffix else ''})#{self.nth}"
        return f"{self.when} {what}"


def run_killed(point: KillPoint, folder, args: list[str], env: dict | None = None, *,
               base_env: dict | None = None) -> tuple[int, str]:
    """Runs ``shardprep *args`` in ``folder`` with ``point`` armed; returns its exit status (``-SIGKILL`` when the
    point was reached) and its output. Its environment is ``base_env`` (default: this process's) with ``env``; a
    caller on another thread passes a copy taken on its own, as the main thread may change ``os.environ``."""
    command = [sys.executable, "-c", _SCRIPT, point.module, point.function, str(point.nth), point.when,
               point.suffix, *map(str, args)]
    base = os.environ if base_env is None else base_env
    completed = subprocess.run(command, cwd=folder, env={**base, **(env or {})}, capture_output=True,
                               timeout=WAIT_S)
    return completed.returncode, (completed.stdout + completed.stderr).decode("utf-8", "replace")


KILLED = -signal.SIGKILL
