"""Terminal output shared by the subcommands: a console that keeps tables readable in logs, and live progress."""

from __future__ import annotations

import os
import sys
import threading
import time

# Outside a terminal (output sent to a file, CI) progress is a plain line this often, in seconds.
PROGRESS_SECONDS_ENV = "SHARDPREP_PROGRESS_SECONDS"
DEFAULT_PROGRESS_SECONDS = 10.0


def console():
    """A rich console for stdout; outside a terminal (logs, CI) it is wide enough to keep table rows on one line."""
    from rich.console import Console

    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=150)


def progress_seconds() -> float:
    """Seconds between plain progress lines: ``$SHARDPREP_PROGRESS_SECONDS``, else 10."""
    try:
        seconds = float(os.environ.get(PROGRESS_SECONDS_ENV, DEFAULT_PROGRESS_SECONDS))
    except ValueError:
        return DEFAULT_PROGRESS_SECONDS
    return seconds if seconds > 0 else DEFAULT_PROGRESS_SECONDS


def duration(seconds: float) -> str:
    """``0:01:05``, like rich's elapsed and remaining columns."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LiveProgress:
    """A rich progress display on stderr with one task; started on the first update when ``lazy``.

    Starting lazily keeps errors found before a job runs from being drawn under an empty bar. When stderr is not a
    terminal (a log file, CI), where rich would draw the bar only at the end, it writes a plain line instead: at the
    first update, then every :func:`progress_seconds` seconds, and (when not ``transient``) a last one at the end.
    Subclasses say what a line holds in :meth:`plain_line`.
    """

    def __init__(self, enabled: bool, columns_factory, transient: bool, lazy: bool, **fields):
        self.enabled, self.columns_factory, self.transient, self.lazy = enabled, columns_factory, transient, lazy
        self.fields = fields
        self.progress = None
        self.task = None
        self.plain = False
        self.state: dict = {"description": "starting", "completed": 0, "total": None, **fields}
        self.last_line_at: float | None = None
        self.last_line = ""
        self.lock = threading.Lock()

    def start(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        stderr = Console(stderr=True)
        self.started_at = time.monotonic()
        if not stderr.is_terminal:
            self.plain = True
            return
        # Rich would replace sys.stdout and sys.stderr while it runs and put back, when it stops, the ones it found:
        # a stream another context swapped in meanwhile (the runner's, holding the Beam workers' stderr back) and
        # has closed since, which fails at exit ("lost sys.stderr", exit status 120).
        self.progress = Progress(*self.columns_factory(), console=stderr, transient=self.transient,
                                 redirect_stdout=False, redirect_stderr=False)
        self.progress.start()
        self.task = self.progress.add_task("starting", total=None, **self.fields)

    def show(self, **update) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.progress is None and not self.plain:
                self.start()
            self.state.update(update)
            if self.plain:
                now = time.monotonic()
                if self.last_line_at is None or now - self.last_line_at >= progress_seconds():
                    self._write_line(now)
            else:
                self.progress.update(self.task, **update)

    def plain_line(self, state: dict, elapsed: float) -> str:
        """The plain progress line for ``state`` (description, completed, total and the fields)."""
        done, total = state.get("completed") or 0, state.get("total")
        count = f" {done:,}/{total:,} ({100 * done / total:.0f}%)" if total else ""
        return f"{state['description']}{count}, {duration(elapsed)}"

    def _write_line(self, now: float) -> None:
        line = self.plain_line(self.state, now - self.started_at)
        self.last_line_at, self.last_line = now, line
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def __enter__(self):
        if self.enabled and not self.lazy:
            self.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()
        elif self.plain and not self.transient and self.last_line_at is not None:
            with self.lock:
                if self.plain_line(self.state, time.monotonic() - self.started_at) != self.last_line:
                    self._write_line(time.monotonic())
        return False
