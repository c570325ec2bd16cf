"""The process's standard streams and what third-party code writes to them, in one place: the only code that points
a file descriptor elsewhere (``dup2``), standard streams started closed, a stream silenced after its reader went
away; TensorFlow's C++ log lines, Beam's logs and its local workers' tracebacks kept off stderr. Low in the layers
so that the jobs, the training loop and the CLI all use it; no Beam import."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import signal
import tempfile
import threading
import traceback


def point(fd: int, target: int) -> int:
    """``fd`` now writes (or reads) ``target``'s file; returns a copy of what it was, to ``os.dup2`` back and close."""
    saved = os.dup(fd)
    os.dup2(target, fd)
    return saved


def to_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def silence(stream) -> None:
    """``stream``'s descriptor to ``/dev/null``: its buffer and its flush at exit go nowhere, so nothing prints
    "Exception ignored ... BrokenPipeError". A stream without one (a test's captured output) is left alone."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # UnsupportedOperation: an OSError and a ValueError
        to_null(stream.fileno())


def open_closed_streams() -> None:
    """``/dev/null`` on a stdin or stderr the process started without (``2>&-``): Python leaves ``sys.stderr`` None
    then, and the first file opened would take the free descriptor (and a worker's "stderr" go into it)."""
    for fd, name in ((0, "stdin"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            to_null(fd)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "w" if fd else "r", closefd=False))


# TensorFlow's C++ log lines: absl/glog's (I0000 00:00:1796063803.991698 11321 port.cc:153] ...), absl's pre-init
# notice (printed whatever the level), and the continuation of cpu_feature_guard's message.
NATIVE_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} \d+:\d+:\d+(\.\d+)?\s+\d+ \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.)")
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3"}  # later lines (cuInit on a machine without a GPU); oneDNN's left alone
QUIET_MODULES = ("tensorflow",)
_set_here: dict[str, str] = {}


def quiet_tensorflow() -> None:
    """Hides TensorFlow's C++ log lines here and in child processes, unless the user set the variables: the level
    variable, and an import hook that runs TensorFlow's first import with fd 2 filtered (:func:`native_filtered`)."""
    for name, value in ENVIRONMENT.items():
        if name not in os.environ:
            os.environ[name] = _set_here[name] = value
    if not any(name in sys.modules for name in QUIET_MODULES) and not _hooks():
        sys.meta_path.insert(0, _QuietImport())


def quiet_library() -> None:
    """:func:`quiet_tensorflow` on ``import shardprep.train``, unless TensorFlow is imported, the user set
    ``TF_CPP_MIN_LOG_LEVEL`` (their logging is theirs) or the CLI's ``--verbose`` was given."""
    if not (any(name in os.environ for name in ENVIRONMENT) or any(m in sys.modules for m in QUIET_MODULES)
            or _verbose_requested()):
        quiet_tensorflow()


def restore() -> None:
    """Undoes :func:`quiet_tensorflow` (``--verbose``) where TensorFlow is not imported yet."""
    for name, value in list(_set_here.items()):
        if os.environ.get(name) == value:
            del os.environ[name]
        del _set_here[name]
    for finder in _hooks():
        sys.meta_path.remove(finder)


def _hooks() -> list:
    return [finder for finder in sys.meta_path if isinstance(finder, _QuietImport)]


def native_log_free(text: str) -> str:  # text without its C++ log lines
    return "".join(line for line in text.splitlines(keepends=True) if not NATIVE_LOG_LINE.match(line))


@contextlib.contextmanager
def native_filtered():
    """fd 2 goes to a temporary file inside the block; what is not a C++ log line is then written to stderr."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = point(2, captured.fileno())
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            if rest := native_log_free(captured.read().decode("utf-8", "replace")):
                sys.stderr.write(rest)
                sys.stderr.flush()


def _verbose_requested() -> bool:
    import click

    ctx = click.get_current_context(silent=True)
    while ctx is not None and not (ctx.params or {}).get("verbose"):
        ctx = ctx.parent
    return ctx is not None


class _QuietImport(importlib.abc.MetaPathFinder):
    """Runs the first import of a :data:`QUIET_MODULES` module inside :func:`native_filtered`. It stays until the
    module executes: ``importlib.util.find_spec`` asks finders without importing."""
    def find_spec(self, name, path, target=None):
        if name not in QUIET_MODULES or name in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def exec_module(self, module):
        for finder in _hooks():
            sys.meta_path.remove(finder)  # once: TensorFlow's own imports, and later ones, go the usual way
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with native_filtered():
            self.loader.exec_module(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


# --- Beam: its loggers, and its local workers' stderr ---------------------------------------------------------

_hide_worker_traces = False  # set by quiet_beam: the CLI without --verbose


def quiet_beam(verbose: bool = False) -> None:
    """Unless ``verbose``: Beam's warnings and tracebacks silenced (the job's error says what failed, in one line),
    and the local workers' stderr held during a run."""
    global _hide_worker_traces
    _hide_worker_traces = not verbose
    level = logging.WARNING if verbose else logging.CRITICAL
    for name in ("apache_beam", "apache_beam.runners.portability", "apache_beam.runners.worker"):
        logging.getLogger(name).setLevel(level)


def drop_in_memory_warning() -> None:
    """Drops FnApiRunner's warning about in_memory with several workers (``runner.make_pipeline``'s are processes);
    added once however many pipelines a process makes (logging keeps one of each filter)."""
    logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").addFilter(_no_in_memory_warning)


def _no_in_memory_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


@contextlib.contextmanager
def stops_held():
    """Ctrl-C or SIGTERM in the block takes effect when it ends: its handler is swapped for one that notes it (a
    signal mask would hold it off this thread only, and any other thread may take it); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    previous = {number: signal.signal(number, lambda *received: caught.append(received))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if caught and callable(previous[caught[0][0]]):
            previous[caught[0][0]](*caught[0])  # the default SIGINT handler raises KeyboardInterrupt; the CLI's too
        elif caught and previous[caught[0][0]] == signal.SIG_DFL:
            os.kill(os.getpid(), caught[0][0])


WORKER_STDERR_KEPT = 64 * 1024  # bytes of the workers' stderr kept while held back


@contextlib.contextmanager
def worker_stderr_held(enabled: bool):
    """While a local run goes, fd 2 (inherited by the workers, which print each failed bundle's traceback) is a pipe
    whose text a failed run drops and a finished one passes on; this process writes to a copy of the terminal's fd,
    never closed under whoever saved it as ``sys.stderr`` (at exit: "lost sys.stderr", status 120)."""
    if not (enabled and _hide_worker_traces):
        yield
        return
    sys.stderr.flush()
    own_stderr = sys.stderr
    terminal = open(os.dup(2), "w", buffering=1, encoding=getattr(own_stderr, "encoding", None) or "utf-8",
                    errors="backslashreplace")
    read_end, write_end = os.pipe()
    saved = point(2, write_end)
    os.close(write_end)
    held = bytearray()
    drainer = threading.Thread(target=_drain, args=(read_end, held), name="shardprep-worker-stderr", daemon=True)
    drainer.start()
    # The runner's threads die with tracebacks of their own when a worker is killed: held too.
    thread_errors: list = []
    own_excepthook = threading.excepthook
    threading.excepthook = thread_errors.append
    sys.stderr = terminal
    failed = True
    try:
        yield
        failed = False
    finally:
        with stops_held():  # a Ctrl-C here would leave fd 2 on the pipe
            with contextlib.suppress(OSError, ValueError):
                terminal.flush()
            os.dup2(saved, 2)  # first: fd 2 is the terminal again; the pipe closes once workers exit
            if sys.stderr is terminal:
                sys.stderr = own_stderr
            if sys.getrefcount(terminal) <= 2:  # no one but this name (and getrefcount's argument) keeps it
                terminal.close()
            drainer.join(timeout=2)
            if not failed and held:
                with contextlib.suppress(OSError):  # `2>&1 | head`, a full disk: a finished run is not failed by it
                    os.write(saved, bytes(held))
            os.close(saved)
            threading.excepthook = own_excepthook
            if not failed:
                for args in thread_errors:
                    own_excepthook(args)
            else:  # the runner's threads may still be dying while the error is reported: keep quiet about those
                threading.excepthook = _quiet_about_runner_threads(own_excepthook)


def _drain(read_end: int, held: bytearray) -> None:
    """Reads the pipe until every writer closed it, keeping its last WORKER_STDERR_KEPT bytes in ``held``."""
    with contextlib.suppress(OSError):
        while chunk := os.read(read_end, 65536):
            held.extend(chunk)
            del held[:-WORKER_STDERR_KEPT]
        os.close(read_end)


def _quiet_about_runner_threads(own_excepthook):
    def excepthook(args):
        frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback else []
        if not any("apache_beam" in frame.filename or "grpc" in frame.filename for frame in frames):
            own_excepthook(args)
    return excepthook
