"""Stopping a local Beam run (Ctrl-C, SIGTERM, SIGHUP, a failed or stopped worker) and its worker processes; no
Beam import."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time

from shardprep.pipelines.runtime.worker_zygote import WORKER_NAME, flush_streams

STOP_WAIT_S = 3.0  # after Ctrl-C: how long the worker processes get to exit on SIGTERM, and the run to unwind
# A worker process stopped (SIGSTOP, Ctrl-Z sent to it alone) this long ends the run: its work would wait forever.
STOPPED_WORKER_S = 60.0


class Terminated(KeyboardInterrupt):
    """SIGTERM (``sigterm_stops``): a command stops as on Ctrl-C, not silently with its workers running."""

    by = "SIGTERM"


class HungUp(KeyboardInterrupt):
    by = "SIGHUP"  # the terminal closed


def _raise_terminated(signum, frame) -> None:
    raise HungUp() if signum == signal.SIGHUP else Terminated()


@contextlib.contextmanager
def _handled(numbers, handler):
    """``handler`` for the signals ``numbers`` in the block; yields the previous ones, put back after."""
    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield previous
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


@contextlib.contextmanager
def sigterm_stops():
    """In the block, SIGTERM raises :class:`Terminated`, SIGHUP :class:`HungUp` (main thread; ``nohup`` kept)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _handled([signal.SIGTERM] + [signal.SIGHUP] * (signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN),
                  _raise_terminated):
        yield


def exit_status(stop: BaseException) -> int:
    """128 + the signal, as shells report it: 130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP."""
    return {"SIGTERM": 143, "SIGHUP": 129}.get(getattr(stop, "by", "Ctrl-C"), 130)


# Set on Ctrl-C: a run in this process (in_memory: no worker processes to end) checks it between inputs and stops.
_stop_requested = threading.Event()


class RunStopped(Exception):
    """Unwinds an in-process run's thread after Ctrl-C."""


def check_not_stopped() -> None:
    if _stop_requested.is_set():
        raise RunStopped("stopped by Ctrl-C")


WORKER_FAILED = "Worker subprocess exited"  # how Beam's local runner words a worker process's failure
FAILED = 1  # the exit status after a failed worker left the run's thread stuck (the CLI's, for an Error: line)


class WorkerStopped(ChildProcessError):
    """A worker process of the run has been stopped for longer than the limit."""


class _StoppedWorkers:
    """``check`` (about once a second) raises WorkerStopped once a worker stayed stopped (state T) for ``limit_s``."""

    def __init__(self, limit_s: float):
        self.limit_s, self.looked = limit_s, 0.0
        self.since: dict[int, float] = {}  # pid -> when it was first seen stopped

    def check(self) -> None:
        now = time.monotonic()
        if now - self.looked < min(1.0, self.limit_s / 4):
            return
        self.looked = now
        stopped = [pid for pid in worker_processes(os.getpid()) if (_stat(pid) or ["R"])[0] in "Tt"]
        self.since = {pid: self.since.get(pid, now) for pid in stopped}
        for pid, since in self.since.items():
            if now - since >= self.limit_s:
                raise WorkerStopped(f"worker process {pid} has been stopped (SIGSTOP or Ctrl-Z sent to it) for "
                                    f"{now - since:.0f} s: the run cannot finish without it, so it was ended; send "
                                    "SIGCONT to a worker you stop")


def run_stoppable(run, stopped_limit_s: float = STOPPED_WORKER_S):
    """``run()`` on a thread of its own, so that Ctrl-C (which the runner's thread could swallow), a stopped worker
    or a failed one (else waited for forever) ends the workers, gives the run STOP_WAIT_S to unwind, and is raised."""
    if threading.current_thread() is not threading.main_thread():
        return run()  # only the main thread receives signals
    outcome: dict = {}
    # An Event, not Thread.join: a KeyboardInterrupt inside join can mark a running thread stopped (bpo-45274).
    finished = threading.Event()

    def target():
        try:
            outcome["result"] = run()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as is
            outcome["error"] = e
        finally:
            finished.set()

    thread = threading.Thread(target=target, name="shardprep-pipeline", daemon=True)
    _stop_requested.clear()
    workers = _StoppedWorkers(stopped_limit_s)
    with _worker_failures() as failures:
        thread.start()
        try:
            while not finished.wait(0.2):
                workers.check()
                if failures and not finished.wait(STOP_WAIT_S):
                    _end_run(finished, FAILED)
                    raise failures[0]
        except (KeyboardInterrupt, WorkerStopped) as stop:
            _end_run(finished, exit_status(stop) if isinstance(stop, KeyboardInterrupt) else FAILED)
            raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@contextlib.contextmanager
def _worker_failures():
    """The worker failures the runner's threads raise in the block (passed on to the previous hook)."""
    failures: list[BaseException] = []
    outer = threading.excepthook

    def hook(args):
        if args.exc_value is not None and str(args.exc_value).startswith(WORKER_FAILED):
            failures.append(args.exc_value)
        outer(args)

    threading.excepthook = hook
    try:
        yield failures
    finally:
        if threading.excepthook is hook:
            threading.excepthook = outer


def _end_run(finished: threading.Event, status: int) -> None:
    """Ends the workers (signals ignored meanwhile); a run not unwound in STOP_WAIT_S exits with ``status`` at exit."""
    with _handled((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), signal.SIG_IGN):
        _stop_requested.set()
        stop_worker_processes()
        if not finished.wait(STOP_WAIT_S):
            atexit.register(_exit_before_finalizing, finished, status)


def _exit_before_finalizing(finished: threading.Event, status: int) -> None:
    """Ends the process before Python finalizes, which would ``pthread_exit`` the stopped run's thread inside OpenCV
    and abort (status 134); its files are as a kill leaves them, which resume handles."""
    if not finished.is_set():
        flush_streams()
        os._exit(status)


def stop_worker_processes(wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM, then after ``wait_s`` SIGKILL, to the SDK worker processes under this one."""
    workers = worker_processes(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any((_stat(pid) or "Z")[0] != "Z" for pid in workers):  # not gone
            time.sleep(0.05)


def worker_processes(pid: int) -> list[int]:
    """The SDK worker processes under ``pid``: Beam's worker module on their command line, or the zygote's name."""
    return [child for child in _descendants(pid) if b"apache_beam.runners.worker" in _proc(child, "cmdline")
            or _proc(child, "comm").strip() == WORKER_NAME.encode()]


def _proc(pid, name: str) -> bytes:
    """``/proc/PID/NAME``; b"" once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in filter(str.isdigit, os.listdir("/proc")):
            if stat := _stat(name):
                children.setdefault(int(stat[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _stat(pid) -> list[str] | None:
    """(state, parent id, ...) from ``/proc/PID/stat``."""
    fields = _proc(pid, "stat").rsplit(b")", 1)
    return fields[1].decode().split() if len(fields) == 2 else None
