"""Stopping a local Beam run (Ctrl-C, SIGTERM, SIGHUP, a failed or stopped worker): the run on a thread of its
own while the main thread waits, its SDK worker processes ended with it. No Beam import."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

STOP_WAIT_S = 3.0  # after Ctrl-C: how long the worker processes get to exit on SIGTERM, and the run to unwind
INTERRUPTED = 130  # the exit status after Ctrl-C, as shells report it (128 + SIGINT)
TERMINATED = 143  # after SIGTERM (128 + SIGTERM): a scheduler's or `timeout`'s stop, where a command handles it
HUNG_UP = 129  # after SIGHUP (128 + SIGHUP): the terminal closed, the ssh connection dropped
# A worker process stopped (SIGSTOP, Ctrl-Z sent to it alone) this long ends the run: its work would wait forever.
STOPPED_WORKER_S = 60.0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by :func:`sigterm_stops`: a command stops as on Ctrl-C, where Python would end it silently
    (its workers running, its lock file left). ``by`` names it in messages."""

    by = "SIGTERM"


class HungUp(KeyboardInterrupt):
    """SIGHUP (the terminal closed), raised as :class:`Terminated` is."""

    by = "SIGHUP"


def _raise_terminated(signum, frame) -> None:
    raise HungUp() if signum == signal.SIGHUP else Terminated()


@contextlib.contextmanager
def _handled(numbers, handler):
    """``handler`` for the signals ``numbers`` in the block, the previous ones (yielded by number) put back after."""
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
    """130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP (a stop's ``by``)."""
    return {"SIGTERM": TERMINATED, "SIGHUP": HUNG_UP}.get(getattr(stop, "by", "Ctrl-C"), INTERRUPTED)


# Set on Ctrl-C: a run in this process (in_memory: no worker processes to end) checks it between inputs and stops.
_stop_requested = threading.Event()


class RunStopped(Exception):
    """Raised inside an in-process run after Ctrl-C, so that the run's thread unwinds instead of going on."""


def check_not_stopped() -> None:
    """Raises RunStopped once Ctrl-C stopped the run of this process; a no-op in a worker process."""
    if _stop_requested.is_set():
        raise RunStopped("stopped by Ctrl-C")


WORKER_FAILED = "Worker subprocess exited"  # how Beam's local runner words a worker process's failure
FAILED = 1  # the exit status after a failed worker left the run's thread stuck (the CLI's, for an Error: line)


class WorkerStopped(ChildProcessError):
    """A worker process of the run has been stopped for longer than the limit (``run_stoppable``)."""


class _StoppedWorkers:
    """:meth:`check` (about once a second, from ``/proc``) raises :class:`WorkerStopped` when a worker process has
    stayed stopped (state T or t) for ``limit_s``."""

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
    """``run()`` (a local pipeline run) on a thread of its own, so that Ctrl-C stops it (the runner's thread could
    swallow it): the workers are ended, the run gets STOP_WAIT_S to unwind, and the stop is raised; so is
    :class:`WorkerStopped`, and a failed worker's error (one that never connected would be waited for forever)."""
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
    """A list of the worker failures the runner's threads raise in the block (passed on to the previous hook)."""
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
    """Ends the workers, gives the run's thread a few seconds, else exits with ``status`` at interpreter exit;
    Ctrl-C, SIGTERM and SIGHUP are ignored meanwhile."""
    with _handled((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), signal.SIG_IGN):
        _stop_requested.set()
        stop_worker_processes()
        if not finished.wait(STOP_WAIT_S):
            atexit.register(_exit_before_finalizing, finished, status)


def _exit_before_finalizing(finished: threading.Event, status: int = INTERRUPTED) -> None:
    """At exit, while the stopped run's thread has not unwound: ends the process with ``status`` before Python
    finalizes, which would ``pthread_exit`` a thread inside OpenCV and abort (status 134). Its files are as a kill
    leaves them, which resume handles."""
    if finished.is_set():
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def stop_worker_processes(wait_s: float = STOP_WAIT_S) -> list[int]:
    """SIGTERM, then after ``wait_s`` SIGKILL, to the SDK worker processes under this one (``/proc``); their ids."""
    workers = worker_processes(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any((_stat(pid) or "Z")[0] != "Z" for pid in workers):  # not gone
            time.sleep(0.05)
    return workers


def worker_processes(pid: int) -> list[int]:
    """The SDK worker processes under ``pid``: Beam's worker module on their command line (and their shells), or
    the zygote's worker name."""
    from shardprep.pipelines.runtime.worker_zygote import WORKER_NAME

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
    """Every process under ``pid``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in filter(str.isdigit, names):
        if stat := _stat(name):
            children.setdefault(int(stat[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stat(pid) -> list[str] | None:
    """(state, parent id, ...): the fields of ``/proc/PID/stat`` after its command name."""
    fields = _proc(pid, "stat").rsplit(b")", 1)
    return fields[1].decode().split() if len(fields) == 2 else None


@contextlib.contextmanager
def sigint_deferred():
    """Ctrl-C or SIGTERM in the block takes effect when it ends (fd 2 restored first); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    try:
        with _handled((signal.SIGINT, signal.SIGTERM), lambda *received: caught.append(received)) as previous:
            yield
    finally:
        if caught:
            handler = previous[caught[0][0]]
            if callable(handler):
                handler(*caught[0])  # the default SIGINT handler raises KeyboardInterrupt; sigterm_stops' too
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0][0])
