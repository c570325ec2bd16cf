"""A real ``shardprep preprocess`` process killed with SIGKILL at an exact point of its code.

The job runs in one process (``--direct_running_mode=in_memory``), so a function of the job can be wrapped before
the command starts: the wrapper sends SIGKILL to its own process before (or after) the n-th call whose first
argument, a path, ends with a given suffix. The kill is as real as any: nothing after it runs, no ``finally``, no
exit hook; what the process had written stays as the kernel holds it.

A test module that kills many runs starts them from a ``Zygote``: a process that imports Beam and the job once and
forks each run from there (~1.2 s of CPU less a run than a new interpreter); each run is still its own process,
killed as above.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple

WAIT_S = 240  # only against hangs on a loaded machine; nothing asserts on time

# Defines arm(): wraps the function a KillPoint names (its five fields, as text) in this process.
_ARM = """
import importlib, os, signal, sys, threading

def arm(module_name, function_name, nth, after, suffix):
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
"""

_SCRIPT = _ARM + """
arm(*sys.argv[1:6])
from shardprep.cli import main
main(sys.argv[6:], prog_name="shardprep")
"""

# The zygote: imports its arguments' modules, then forks a run for each request line (JSON) on stdin; the child
# takes the run's folder, environment and streams (a log file), arms the point and runs the command. Replies: the
# child's pid at once, its exit status once reaped. Single-threaded, so that no fork copies a lock held elsewhere.
_ZYGOTE = _ARM + r"""
import json, select
for name in sys.argv[1:]:
    importlib.import_module(name)
replies, running, pending = os.fdopen(os.dup(1), "w", buffering=1), {}, b""


def become(request):
    os.chdir(request["folder"])
    os.environ.clear()
    os.environ.update(request["env"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0), os.dup2(log, 1), os.dup2(log, 2), os.close(log), os.close(null)
    replies.close()
    arm(*request["point"])
    from shardprep.cli import main
    main(request["args"], prog_name="shardprep")  # its SystemExit ends this process as the command's own would
    sys.exit(0)


while True:
    if select.select([0], [], [], 0.05 if running else None)[0]:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            request = json.loads(line)
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                become(request)
            running[pid] = request["id"]
            replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
    for pid in list(running):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            replies.write(json.dumps({"id": running.pop(pid), "status": os.waitstatus_to_exitcode(status)}) + "\n")
for pid in running:
    os.waitpid(pid, 0)
"""

# What a preprocess run imports (Beam's in-process runner, the job, the decoders): the zygote's share.
PRELOAD = ("shardprep.cli", "shardprep.commands.preprocess", "shardprep.pipelines.preprocess_job.graph",
           "shardprep.pipelines.preprocess_job.decode", "shardprep.pipelines.preprocess_job.decode_groups",
           "shardprep.pipelines.preprocess_job.listing", "shardprep.pipelines.preprocess_job.manifest_writer",
           "shardprep.pipelines.preprocess_job.shards", "shardprep.pipelines.runtime.runner",
           "shardprep.pipelines.runtime.progress", "shardprep.pipelines.runtime.journal",
           "shardprep.pipelines.runtime.spill", "shardprep.preprocess.checks.owned_folder",
           "shardprep.preprocess.image.image_ops", "apache_beam.runners.portability.fn_api_runner", "rich", "cv2",
           "simplejpeg")


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


class Zygote:
    """Forks killed runs from one process that has imported ``PRELOAD`` (started with ``env``); any thread may call
    ``run``, and runs go on side by side. ``close`` waits for the zygote, so that its CPU is counted."""

    def __init__(self, env: dict | None = None):
        self._logs = tempfile.mkdtemp(prefix="kill-points-")
        self._own_log = os.path.join(self._logs, "zygote.log")  # its own stderr: an import's error, say
        with open(self._own_log, "wb") as log:
            self._process = subprocess.Popen([sys.executable, "-c", _ZYGOTE, *PRELOAD], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, env=env)
        self._lock, self._ids = threading.Lock(), itertools.count()
        self._pids: dict[int, concurrent.futures.Future] = {}
        self._ends: dict[int, concurrent.futures.Future] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            reply = json.loads(line)
            with self._lock:
                waiting = self._pids if "pid" in reply else self._ends
                future = waiting.pop(reply["id"])
            future.set_result(reply.get("pid", reply.get("status")))
        with self._lock, open(self._own_log, "rb") as log:  # the zygote ended: nothing more will come
            ended = RuntimeError("the kill-points zygote ended: " + log.read()[-3000:].decode("utf-8", "replace"))
            for future in [*self._pids.values(), *self._ends.values()]:
                future.set_exception(ended)

    def run(self, point: KillPoint, folder, args: list[str], env: dict) -> tuple[int, str]:
        started, ended = concurrent.futures.Future(), concurrent.futures.Future()
        with self._lock:
            ident = next(self._ids)
            self._pids[ident], self._ends[ident] = started, ended
            log = os.path.join(self._logs, f"{ident}.log")
            request = {"id": ident, "point": [str(field) for field in point], "folder": str(folder),
                       "env": env, "log": log, "args": list(map(str, args))}
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        pid = started.result(timeout=WAIT_S)
        try:
            returncode = ended.result(timeout=WAIT_S)
        except concurrent.futures.TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise
        with open(log, "rb") as f:
            return returncode, f.read().decode("utf-8", "replace")

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        shutil.rmtree(self._logs, ignore_errors=True)


def run_killed(point: KillPoint, folder, args: list[str], env: dict | None = None, *,
               base_env: dict | None = None, zygote: Zygote | None = None) -> tuple[int, str]:
    """Runs ``shardprep *args`` in ``folder`` with ``point`` armed (forked from ``zygote`` where one is given);
    returns its exit status (``-SIGKILL`` when the point was reached) and its output. Its environment is
    ``base_env`` (default: this process's) with ``env``; a caller on another thread passes a copy taken on its own,
    as the main thread may change ``os.environ``."""
    base = os.environ if base_env is None else base_env
    environment = {**base, **(env or {})}
    if zygote is not None:
        return zygote.run(point, folder, args, environment)
    command = [sys.executable, "-c", _SCRIPT, point.module, point.function, str(point.nth), point.when,
               point.suffix, *map(str, args)]
    completed = subprocess.run(command, cwd=folder, env=environment, capture_output=True, timeout=WAIT_S)
    return completed.returncode, (completed.stdout + completed.stderr).decode("utf-8", "replace")


KILLED = -signal.SIGKILL
