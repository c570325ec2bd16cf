"""Third-party log noise kept off our commands' output, and off a library user's session.

TensorFlow writes C++ log lines to stderr: some while its libraries load (oneDNN, "Could not find cuda drivers", and
absl's "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"), which no
environment variable hides because absl prints everything logged before ``InitializeLog`` whatever the level, and
later ones (``E0000 ... failed call to cuInit`` on a machine without a GPU) that ``TF_CPP_MIN_LOG_LEVEL=3`` hides.

:func:`quiet_tensorflow` sets ``TF_CPP_MIN_LOG_LEVEL`` (unless the user set it) and installs an import hook: when
TensorFlow is first imported, file descriptor 2 goes to a temporary file for the import, and every captured line
that is not a C++ log line (a Python warning, a crash message) is written to stderr afterwards.
``TF_ENABLE_ONEDNN_OPTS`` is left alone: it changes numerics, not only the message. With ``--verbose`` nothing is
hidden.

Importing ``shardprep.train`` calls :func:`quiet_library`: the same, only where TensorFlow is not imported yet and
the user has not set ``TF_CPP_MIN_LOG_LEVEL`` (their own choice, e.g. ``0`` to see every line, stands).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile

# A C++ log line (absl/glog format: I0000 00:00:1796063803.991698   11321 port.cc:153] ...), absl's pre-init notice,
# and the continuation line of cpu_feature_guard's message.
NATIVE_LOG_LINE = re.compile(
    r"^([IWEF]\d{4} \d+:\d+:\d+(\.\d+)?\s+\d+ \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.)")
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3"}
QUIET_MODULES = ("tensorflow",)


_set_here: dict[str, str] = {}


def quiet_tensorflow() -> None:
    """Hides TensorFlow's C++ log lines in this process (and the processes it starts) unless the user set the
    variables; the import hook does nothing once TensorFlow is imported."""
    for name, value in ENVIRONMENT.items():
        if name not in os.environ:
            os.environ[name] = _set_here[name] = value
    if any(name in sys.modules for name in QUIET_MODULES):
        return
    if not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())


def quiet_library() -> None:
    """:func:`quiet_tensorflow` for a library session (``import shardprep.train``), unless TensorFlow is already
    imported or the user set ``TF_CPP_MIN_LOG_LEVEL``: then their logging is theirs."""
    if any(name in os.environ for name in ENVIRONMENT) or any(name in sys.modules for name in QUIET_MODULES):
        return
    quiet_tensorflow()


def restore() -> None:
    """Undoes :func:`quiet_tensorflow` (for a subcommand's own ``--verbose``) where TensorFlow is not imported yet."""
    for name, value in list(_set_here.items()):
        if os.environ.get(name) == value:
            del os.environ[name]
        del _set_here[name]
    for finder in [f for f in sys.meta_path if isinstance(f, _QuietImport)]:
        sys.meta_path.remove(finder)


def _verbose_requested() -> bool:
    """Whether the running click command or its group was given ``--verbose``."""
    try:
        import click
    except ImportError:  # pragma: no cover - click is a dependency
        return False
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if (ctx.params or {}).get("verbose"):
            return True
        ctx = ctx.parent
    return False


def native_log_free(text: str) -> str:
    """``text`` without its C++ log lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not NATIVE_LOG_LINE.match(line))


@contextlib.contextmanager
def native_stderr_filtered():
    """File descriptor 2 goes to a temporary file inside the block; what is not a C++ log line is then written to
    ``sys.stderr``."""
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError):
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            rest = native_log_free(captured.read().decode("utf-8", "replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


class _QuietImport(importlib.abc.MetaPathFinder):
    """Runs the first import of a :data:`QUIET_MODULES` module inside :func:`native_stderr_filtered`."""

    def find_spec(self, name, path, target=None):
        if name not in QUIET_MODULES or name in sys.modules:
            return None
        # The finder stays until the module is executed (``_FilteredLoader``): ``importlib.util.find_spec`` asks
        # finders without importing (other libraries probe for TensorFlow that way), and the real import comes later.
        if _verbose_requested():
            restore()
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        for finder in [f for f in sys.meta_path if isinstance(f, _QuietImport)]:
            sys.meta_path.remove(finder)  # once: TensorFlow's own imports, and later ones, go the usual way
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with native_stderr_filtered():
            self.loader.exec_module(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)
