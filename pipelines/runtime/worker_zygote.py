"""Local SDK worker processes forked from a copy of the launcher that has Beam imported (a new interpreter imports it
again: ~1 s of CPU a worker). Beam's public subprocess environment runs ``worker_command()``: this file, which has the
zygote fork a worker with its environment and streams and exits with its status, or becomes Beam's own worker where
no zygote answers. Off Linux, with threads running, or with ``SHARDPREP_FORKED_WORKERS=0``, Beam starts them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import select
import shlex
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import warnings

DISABLE_VARIABLE = "SHARDPREP_FORKED_WORKERS"  # "0": workers start as new interpreters, as Beam starts them
# Process names (/proc/PID/comm): a forked process keeps the launcher's command line (``stopping.worker_processes``).
ZYGOTE_NAME, WORKER_NAME = "worker-zygote", "beam-sdk-worker"
M_ARENA_MAX = -8  # mallopt parameter number, glibc's malloc.h
_BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD}
START_WAIT_S = 30.0  # for the zygote to fork a worker (milliseconds when it runs): longer, it is stopped or stuck
_MESSAGE_LIMIT = 4 * 2**20  # a worker's environment (the launcher's, and the pipeline options as JSON)
BEAM_WORKER = ("-m", "apache_beam.runners.worker.sdk_worker_main")  # how Beam starts a local worker itself
_WORKER_MODULES = ("numpy", "cv2", "simplejpeg", "PIL.Image", "shardprep.preprocess.image.image_ops",
                   "shardprep.preprocess.image.resize")

_active: WorkerZygote | None = None


class WorkerZygote:
    """The launcher's end of a zygote: its pid, its control socket (whose close ends it) and the abstract socket
    name of its requests."""

    def __init__(self, pid: int, control: socket.socket, address: str):
        self.pid, self.control, self.address = pid, control, address
        self.lock = threading.Lock()
        self.prepared = False

    def prepare(self) -> None:
        """Has the zygote import the workers' modules (NumPy, OpenCV, the decoders) while the graph is built."""
        with self.lock:
            if not self.prepared:
                self.prepared = True
                with contextlib.suppress(OSError):
                    self.control.send(b"prepare")

    def worker_command(self) -> str:
        """The shell command that starts one worker, for Beam's subprocess environment."""
        arguments = (sys.executable, "-S", "-E", os.path.abspath(__file__), self.address, self.pid, START_WAIT_S)
        return "exec " + " ".join(shlex.quote(str(part)) for part in arguments)  # exec: no shell left in between

    @property
    def closed(self) -> bool:
        return self.control.fileno() == -1

    def close(self, wait_s: float = 5.0) -> None:
        """Ends the zygote (its socket closed) and reaps it, killed after ``wait_s``."""
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


def _above_standard_streams(end: socket.socket) -> socket.socket:
    """``end`` above descriptor 2 (a launcher started with a standard stream closed would give it away)."""
    if end.fileno() > 2:
        return end
    moved = fcntl.fcntl(end.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
    replacement = socket.socket(end.family, end.type, fileno=moved)
    end.close()
    return replacement


def libc_call(function: str, *args) -> None:
    """Calls glibc's ``function`` where there is one (not on macOS or musl)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        getattr(ctypes.CDLL("libc.so.6"), function)(*args)


def active() -> WorkerZygote | None:
    """The zygote of the run in progress, if any and not ended."""
    return _active if _active is not None and not _active.closed else None


def end_unneeded() -> None:
    """Ends the active zygote early: the run turned out to need no worker process (it runs in this one)."""
    if _active is not None:
        _active.close()


@contextlib.contextmanager
def forked_for(may_use_worker_processes: bool):
    """A zygote for the block, if the run ``may_use_worker_processes`` and forking is safe (no other thread)."""
    global _active
    if active() is not None:  # made by a caller, before it started a thread (the validate command's display)
        yield active()
        return
    # Another thread may hold a lock the copy could never take (and gRPC's threads keep a second run from forking).
    if not (may_use_worker_processes and os.environ.get(DISABLE_VARIABLE, "1") != "0"
            and sys.platform.startswith("linux") and threading.active_count() == 1):
        yield None
        return
    zygote = _active = _fork_zygote()
    try:
        yield zygote
    finally:
        _active = None
        zygote.close()


def _fork_zygote() -> WorkerZygote:
    ours, theirs = (_above_standard_streams(end) for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    address = f"shardprep-worker-zygote-{os.getpid()}-{secrets.token_hex(8)}"
    listener = _above_standard_streams(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    listener.bind("\0" + address)
    listener.listen(64)
    pid = _fork_with_signals_blocked()
    if pid == 0:
        code = 1
        try:
            ours.close()
            code = _serve(theirs, listener)
        finally:
            os._exit(code)  # never back into the launcher's stack, its cleanups, or its atexit hooks
    theirs.close()
    listener.close()
    return WorkerZygote(pid, ours, address)


def _fork_with_signals_blocked() -> int:
    """``os.fork()`` with Ctrl-C, SIGTERM and SIGCHLD held back: the child resets its handlers before any arrives."""
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


def _serve(control: socket.socket, listener: socket.socket) -> int:
    """Forks a worker per request on ``listener``, reports its exit to its requester (kills it if the requester
    went); ends when the launcher closes ``control``."""
    _name_process(ZYGOTE_NAME)
    _detach_from_launcher(keep=(control.fileno(), listener.fileno()))
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the handler's only job: the wakeup byte above
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the launcher decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # not the launcher's handler (stopping.sigterm_stops)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    workers: dict[int, socket.socket] = {}
    own_fds = [control.fileno(), listener.fileno(), wakeup_read, wakeup_write]
    while True:
        requesters = {c.fileno(): pid for pid, c in workers.items() if c.fileno() != -1}
        ready = select.select([control.fileno(), listener.fileno(), wakeup_read, *requesters], [], [])[0]
        if wakeup_read in ready:  # select is retried after each signal (PEP 475): SIGCHLD wakes it through here
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup_read, 4096)
        _report_exits(workers)
        for fd in set(ready) & set(requesters):  # a requester sends nothing after its request: it has gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(requesters[fd], signal.SIGKILL)
            workers[requesters[fd]].close()
        if listener.fileno() in ready:
            _take_request(listener, workers, own_fds)
        if control.fileno() in ready:
            if not control.recv(64):
                return 0  # the launcher closed its end, or exited
            for name in _WORKER_MODULES:  # "prepare"
                with contextlib.suppress(Exception):
                    __import__(name)


def _take_request(listener: socket.socket, workers: dict[int, socket.socket], own_fds: list[int]) -> None:
    """One request for a worker: the environment and three standard streams, from a process of this user."""
    connection = listener.accept()[0]
    fds: list[int] = []
    try:
        connection.settimeout(5.0)  # the requester sends as it connects: never held up by one that does not
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", credentials)[1] != os.getuid():  # (pid, uid, gid)
            raise PermissionError("a worker requested by another user")
        message, fds, _, _ = socket.recv_fds(connection, _MESSAGE_LIMIT, 3)
        if not message.startswith(b"start ") or len(fds) != 3:
            raise ValueError("not a request for a worker")
        _start_worker(json.loads(message[len(b"start "):]), fds, connection, workers, own_fds)
    except (OSError, ValueError):
        connection.close()
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _name_process(name: str) -> None:
    libc_call("prctl", 15, name.encode(), 0, 0, 0)  # PR_SET_NAME


def _detach_from_launcher(keep: tuple[int, ...]) -> None:
    """Closes every launcher's file but ``keep`` (a ``| tee`` pipe must close with the launcher), standard streams on
    ``/dev/null``."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for name in os.listdir("/proc/self/fd"):  # the listing's own descriptor is among them: closed already, or soon
        if int(name) > 2 and int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _start_worker(environment: dict, stdio: list[int], connection: socket.socket,
                  workers: dict[int, socket.socket], own_fds: list[int]) -> None:
    pid = _fork_with_signals_blocked()
    if pid == 0:
        code = 1
        try:
            for fd in own_fds + [other.fileno() for other in workers.values() if other.fileno() != -1]:
                os.close(fd)
            connection.close()
            code = _become_worker(environment, stdio)
        finally:
            os._exit(code)
    workers[pid] = connection
    connection.settimeout(None)
    connection.send(f"pid {pid}".encode())


def _report_exits(workers: dict[int, socket.socket]) -> None:
    while workers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = workers.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):  # its requester gone: nobody to tell
                connection.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
            connection.close()


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
        flush_streams()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ended by Ctrl-C, as an interpreter reports it: by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:  # noqa: BLE001 - reported as an uncaught exception would be, then the exit status
        traceback.print_exc()
        return 1
    finally:
        flush_streams()


def _as_a_new_process() -> None:
    """What a new interpreter would have: fresh standard streams, unconfigured logging, default hooks, and the
    environment's malloc arena cap (glibc reads it only at start)."""
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
        libc_call("mallopt", M_ARENA_MAX, int(arenas))


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def request_worker(address: str, zygote: int, wait_s: float) -> int:
    """The worker command: has the zygote fork a worker with this process's environment and streams, and returns
    its exit status; with no answer within ``wait_s`` (the zygote killed), becomes the worker as Beam starts it."""
    for fd in (0, 1, 2):  # a stream Beam left closed: /dev/null, which takes its number
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the worker decides
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.settimeout(wait_s)
    answer = b""
    try:
        connection.connect("\0" + address)
        socket.send_fds(connection, [b"start " + json.dumps(dict(os.environ)).encode()], [0, 1, 2])
        answer = connection.recv(64)
    except TimeoutError:  # stopped or stuck: killed, so that the next request fails at once
        with contextlib.suppress(OSError):
            os.kill(zygote, signal.SIGKILL)  # the launcher's child, reaped by it only: not a pid reused meanwhile
    except OSError:
        pass
    if not answer.startswith(b"pid "):
        connection.close()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, *BEAM_WORKER])
    worker = int(answer.split()[1])
    connection.settimeout(None)
    answer = connection.recv(64)
    if not answer.startswith(b"exit "):  # the zygote went first: the status is unknown, the worker killed
        with contextlib.suppress(OSError):
            os.kill(worker, signal.SIGKILL)
        answer = b"exit %d" % -signal.SIGKILL
    status = int(answer.split()[1])
    if status < 0:  # ended by a signal: this process too, so that Beam reports it as it would the worker
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's own cannot be set, and needs not be
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(request_worker(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
