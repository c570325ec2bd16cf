"""Local SDK worker processes forked from a copy of the launcher that has Beam imported: the worker zygote.

Beam's FnApiRunner starts each local worker process as a new interpreter (``python -m
apache_beam.runners.worker.sdk_worker_main``), which imports Beam again: ~1 s of CPU a worker before its first
element, while the launcher already holds every module a worker needs. The zygote is forked from the launcher once,
early, while the launcher has started no thread of its own, no gRPC server and no run; it then only waits. When the
runner asks for a worker, the zygote forks one, which becomes Beam's SDK harness with exactly the environment Beam
would have given the subprocess, and the launcher's standard streams of that moment (so held-back stderr still
works). The launcher hears the worker's pid, and later its exit status, on a socket of that worker's own.

Where forking is not safe (not Linux, Python threads already running) or the run cannot use worker processes, no
zygote is made and Beam starts its workers itself; ``SHARDPREP_FORKED_WORKERS=0`` does the same on purpose.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from typing import NamedTuple

DISABLE_VARIABLE = "SHARDPREP_FORKED_WORKERS"  # "0": workers start as new interpreters, as Beam starts them
# The processes' names (``ps -o comm``, /proc/PID/comm; 15 bytes at most): a forked process keeps the launcher's
# command line, so this is how a worker is told from the launcher (``stopping.worker_processes``).
ZYGOTE_NAME, WORKER_NAME = "worker-zygote", "beam-sdk-worker"
_BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD}
START_WAIT_S = 30.0  # for the zygote to fork a worker (milliseconds when it runs): longer, it is stopped or stuck
_MESSAGE_LIMIT = 4 * 2**20  # a worker's environment (the launcher's, and the pipeline options as JSON)
_WORKER_MODULES = ("numpy", "cv2", "simplejpeg", "PIL.Image", "shardprep.preprocess.image_ops",
                   "shardprep.preprocess.jpeg_decode", "shardprep.preprocess.resize")

_active: WorkerZygote | None = None


class ForkedWorker(NamedTuple):
    """A worker the zygote forked: its pid, and the socket on which its exit status will come."""

    pid: int
    status_socket: socket.socket

    def wait(self) -> int | None:
        """The worker's exit status, as ``subprocess`` gives it (negative: the signal that ended it); None if the
        zygote ended before it could tell."""
        line = _read_line(self.status_socket)
        self.status_socket.close()
        if line.startswith("exit "):
            return int(line.split()[1])
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)


class WorkerZygote:
    """The launcher's end of a zygote process (``forked_for``)."""

    def __init__(self, pid: int, control: socket.socket, closed_streams: frozenset[int] = frozenset()):
        self.pid, self.control = pid, control
        self.closed_streams = closed_streams  # of 0, 1, 2: closed in this process (then reused by whatever came)
        self.lock = threading.Lock()
        self.prepared = False

    def prepare(self) -> None:
        """Has the zygote import what the workers will import (NumPy, OpenCV, the decoders) while the launcher builds
        the graph, once, so that every worker it forks has them; a run in this process never asks."""
        with self.lock:
            if not self.prepared:
                self.prepared = True
                with contextlib.suppress(OSError):
                    self.control.send(b"prepare")

    def start_worker(self, environment: dict[str, str]) -> ForkedWorker:
        """Forks a worker with ``environment`` and this process's standard streams (``/dev/null`` for one that is
        closed); OSError if the zygote is gone, or has not answered within START_WAIT_S (stopped: it is killed)."""
        ours, theirs = _socket_pair(socket.SOCK_STREAM)
        streams = _standard_streams(self.closed_streams)
        try:
            message = b"start " + json.dumps(environment).encode()
            with self.lock:
                socket.send_fds(self.control, [message], [*streams, theirs.fileno()])
        finally:
            theirs.close()
            for fd in streams:
                if fd > 2:
                    os.close(fd)
        ours.settimeout(START_WAIT_S)
        try:
            first = _read_line(ours)
        except TimeoutError:
            first = ""
            self.close(wait_s=0)
        ours.settimeout(None)
        if not first.startswith("pid "):
            ours.close()
            raise OSError("the worker zygote did not start a worker")
        return ForkedWorker(int(first.split()[1]), ours)

    @property
    def closed(self) -> bool:
        return self.control.fileno() == -1

    def close(self, wait_s: float = 5.0) -> None:
        """Ends the zygote (it exits when its socket closes) and reaps it, killed if it has not gone within
        ``wait_s``; again, nothing."""
        with self.lock:
            if self.closed:
                return
            self.control.close()
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(0.005)


def _socket_pair(kind: int) -> tuple[socket.socket, socket.socket]:
    """A connected pair whose descriptors are above the standard streams' (where a launcher started with one of
    them closed would otherwise get it: a worker's stdin would then be the zygote's socket)."""
    return tuple(_above_standard_streams(end) for end in socket.socketpair(socket.AF_UNIX, kind))  # type: ignore


def _above_standard_streams(end: socket.socket) -> socket.socket:
    if end.fileno() > 2:
        return end
    moved = fcntl.fcntl(end.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
    replacement = socket.socket(end.family, end.type, fileno=moved)
    end.close()
    return replacement


def _closed_standard_streams() -> frozenset[int]:
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    return frozenset(closed)


def _standard_streams(closed: frozenset[int]) -> list[int]:
    """This process's descriptors 0, 1 and 2, each replaced by a new ``/dev/null`` descriptor where it was closed
    when the zygote was made (by now the number may be another file's: a gRPC poller's)."""
    streams = []
    for fd in (0, 1, 2):
        if fd in closed:
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            streams.append(fcntl.fcntl(null, fcntl.F_DUPFD_CLOEXEC, 3))
            os.close(null)
        else:
            streams.append(fd)
    return streams


def _read_line(status_socket: socket.socket) -> str:
    """One line from a worker's status socket, read a byte at a time: nothing after it is taken off the socket."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = status_socket.recv(1)
        if not byte:
            break
        line += byte
    return line.decode()


def active() -> WorkerZygote | None:
    """The zygote of the run in progress, if any and not ended (``forked_for``, ``end_unneeded``)."""
    return _active if _active is not None and not _active.closed else None


def end_unneeded() -> None:
    """Ends the active zygote early: the run turned out to need no worker process (it runs in this one)."""
    if _active is not None:
        _active.close()


@contextlib.contextmanager
def forked_for(may_use_worker_processes: bool):
    """Makes a zygote for the block, if the run ``may_use_worker_processes`` and forking is safe here; ends it after.

    Call it early, after Beam is imported and before anything starts a thread."""
    global _active
    if active() is not None:  # made by a caller, before it started a thread (the validate command's display)
        yield active()
        return
    zygote = _fork_zygote() if may_use_worker_processes and _can_fork() else None
    if zygote is None:
        yield None
        return
    previous, _active = _active, zygote
    try:
        yield zygote
    finally:
        _active = previous
        zygote.close()


def _can_fork() -> bool:
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        return False
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    # Another Python thread may hold a lock (a stream's, the import system's) that the copy could never take. Beam's
    # runner and gRPC start threads: this is also what keeps a second run in one process from forking after gRPC.
    return threading.active_count() == 1


def _fork_zygote() -> WorkerZygote | None:
    closed_streams = _closed_standard_streams()  # before the sockets, which may take their numbers
    ours, theirs = _socket_pair(socket.SOCK_SEQPACKET)
    pid = _fork_with_signals_blocked()
    if pid == 0:
        code = 1
        try:
            ours.close()
            code = _serve(theirs)
        finally:
            os._exit(code)  # never back into the launcher's stack, its cleanups, or its atexit hooks
    theirs.close()
    return WorkerZygote(pid, ours, closed_streams)


def _fork_with_signals_blocked() -> int:
    """``os.fork()`` with Ctrl-C, SIGTERM and SIGCHLD held back around it: the child resets its handlers before any
    signal reaches it (Python drops the flags of signals caught just before a fork in the child)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    pid = -1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "multi-threaded": NumPy's idle BLAS threads
            pid = os.fork()
    finally:
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return pid


def _serve(control: socket.socket) -> int:
    """The zygote: forks a worker for each request, reports each worker's exit, ends when the launcher's end closes."""
    _name_process(ZYGOTE_NAME)
    _detach_from_launcher(keep=control.fileno())
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the handler's only job: the wakeup byte above
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the launcher decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # not the launcher's handler (stopping.sigterm_stops)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    workers: dict[int, socket.socket] = {}
    while True:
        ready = select.select([control.fileno(), wakeup_read], [], [])[0]  # retried after each signal (PEP 475)
        if wakeup_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup_read, 4096)
        _report_exits(workers)
        if control.fileno() not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, _MESSAGE_LIMIT, 4)
        if not message:
            return 0  # the launcher closed its end, or exited
        if message == b"prepare":
            _import_worker_modules()
        elif message.startswith(b"start "):
            environment = json.loads(message[len(b"start "):])
            _start_worker(environment, fds, workers, [control.fileno(), wakeup_read, wakeup_write])
        else:
            for fd in fds:
                os.close(fd)


def _name_process(name: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME


def _detach_from_launcher(keep: int) -> None:
    """The zygote keeps none of the launcher's files, as a new interpreter would have none (Beam starts its
    workers with ``close_fds``): a pipe the launcher writes to (``| tee``) must close when the launcher exits, a
    file or socket of a program that runs the job as a library must not outlive its own close. Its standard
    streams are ``/dev/null``; workers get the launcher's with each request. ``keep``: its socket to the launcher."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for name in os.listdir("/proc/self/fd"):  # the listing's own descriptor is among them: closed already, or soon
        if int(name) > 2 and int(name) != keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _import_worker_modules() -> None:
    for name in _WORKER_MODULES:
        with contextlib.suppress(Exception):
            __import__(name)


def _start_worker(environment: dict, fds: list[int], workers: dict[int, socket.socket], own_fds: list[int]) -> None:
    status_socket = socket.socket(fileno=fds[3])
    pid = _fork_with_signals_blocked()
    if pid == 0:
        code = 1
        try:
            for fd in own_fds + [other.fileno() for other in workers.values()] + [fds[3]]:
                os.close(fd)
            code = _become_worker(environment, fds[:3])
        finally:
            os._exit(code)
    for fd in fds[:3]:
        os.close(fd)
    workers[pid] = status_socket
    with contextlib.suppress(OSError):
        status_socket.sendall(f"pid {pid}\n".encode())


def _report_exits(workers: dict[int, socket.socket]) -> None:
    while workers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status_socket = workers.pop(pid, None)
        if status_socket is not None:
            with contextlib.suppress(OSError):
                status_socket.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            status_socket.close()


def _become_worker(environment: dict[str, str], stdio: list[int]) -> int:
    """Runs Beam's SDK harness in this forked process as ``sdk_worker_main`` runs it in a new one; its exit status."""
    _name_process(WORKER_NAME)
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    signal.set_wakeup_fd(-1)
    for number, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                            (signal.SIGCHLD, signal.SIG_DFL)):
        signal.signal(number, handler)
    os.environ.clear()
    os.environ.update(environment)
    _as_a_new_process()
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main([])
        return 0
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 1
    except KeyboardInterrupt:
        _flush_streams()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ended by Ctrl-C, as an interpreter reports it: by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:  # noqa: BLE001 - reported as an uncaught exception would be, then the exit status
        traceback.print_exc()
        return 1
    finally:
        _flush_streams()


def _as_a_new_process() -> None:
    """What a new interpreter would have that the launcher's copy does not: fresh standard streams (the launcher's may
    be replaced, or locked by a thread that is not here), logging as configured by nothing, default hooks, and the
    malloc arena cap the environment asks for (read by glibc only when a process starts)."""
    import logging

    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, for its whole life
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.setLevel(logging.NOTSET)
            logger.disabled = False
    threading.excepthook, sys.excepthook = threading.__excepthook__, sys.__excepthook__
    arenas = os.environ.get("MALLOC_ARENA_MAX", "")
    if arenas.isdigit():
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL("libc.so.6").mallopt(-8, int(arenas))  # M_ARENA_MAX


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
