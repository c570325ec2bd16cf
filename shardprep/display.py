"""Terminal output shared by the subcommands: consoles as wide as the output, lines that fit, and live progress.

Widths follow :func:`shardprep.preprocess.text.output_width`, the one rule for every command. Live progress never touches ``sys.stdout`` or ``sys.stderr``: other code may swap them
while it runs (the preprocess runner holds the Beam workers' stderr back), and a display that saved one and put it
back later would leave a stale stream behind.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

from shardprep.preprocess.text import count, output_width, terminal_columns  # noqa: F401  (shared by the commands)

# Outside a terminal (output sent to a file, CI) progress is a plain line this often, in seconds.
PROGRESS_SECONDS_ENV = "SHARDPREP_PROGRESS_SECONDS"
DEFAULT_PROGRESS_SECONDS = 10.0
HEARTBEAT_SECONDS = 60.0  # a plain line with unchanged counts at most this often


def console(stderr: bool = False):
    """A rich console for stdout (or stderr) as wide as :func:`output_width` says. A write whose reader has gone
    (``| head``) raises BrokenPipeError, as ``click.echo``'s does, for the command to decide
    (``broken_pipe.reader_may_go``): rich's own handling ends the process with status 1 there and then."""
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")

    return PipeAwareConsole(stderr=stderr, width=output_width(sys.stderr if stderr else sys.stdout))


def fit(parts: list[tuple[str, int]], width: int, separator: str = ", ") -> str:
    """``parts`` (text, rank) joined in their order, as many as fit ``width``: lower ranks are taken first, and a
    part that does not fit is left out; rank 0 parts are always kept (a line of those alone is cut with "…")."""
    parts = [(text, rank) for text, rank in parts if text]
    kept = {i for i, (_, rank) in enumerate(parts) if rank == 0}

    def joined(indices) -> str:
        return separator.join(text for i, (text, _) in enumerate(parts) if i in indices)

    for i in sorted(set(range(len(parts))) - kept, key=lambda i: parts[i][1]):
        if len(joined(kept | {i})) <= width:
            kept.add(i)
    line = joined(kept)
    return line if len(line) <= width else line[:max(0, width - 1)] + "…"


def shortened(text: str, width: int) -> str:
    """``text`` if it fits ``width``, else its end after "…" (a path's last folders say most)."""
    return text if len(text) <= width else "…" + text[len(text) - max(0, width - 1):]


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
    first update, then every :func:`progress_seconds` seconds when its counts (:meth:`line_key`) changed (once a
    minute when they did not), and (when not ``transient``) a last one at the end if they changed since the last. Subclasses say what a line holds in
    :meth:`plain_line`. Rich never redirects stdout or stderr here (see the module's docstring).
    """

    def __init__(self, enabled: bool, columns_factory, transient: bool, lazy: bool, **fields):
        self.enabled, self.columns_factory, self.transient, self.lazy = enabled, columns_factory, transient, lazy
        self.fields = fields
        self.progress = None
        self.task = None
        self.plain = False
        self.state: dict = {"description": "starting", "completed": 0, "total": None, **fields}
        self.started_at = time.monotonic()
        self.last_line_at: float | None = None
        self.last_line = ""
        self.last_key = None
        self.lock = threading.Lock()

    @property
    def width(self) -> int:
        """Columns of a line on stderr (see :func:`output_width`)."""
        return output_width(sys.stderr)

    def start(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        stderr = Console(stderr=True, width=self.width)
        self.started_at = time.monotonic()
        if not stderr.is_terminal:
            self.plain = True
            return
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
                if self._line_due(now):
                    self._write_line(now)
            else:
                self.progress.update(self.task, **update)

    def _line_due(self, now: float) -> bool:
        """A plain line is due at the first update, then every interval if its counts changed, and at least once a
        minute (a log that says the run is alive, without repeating a last line every interval)."""
        if self.last_line_at is None:
            return True
        since = now - self.last_line_at
        changed = self.line_key(self.state) != self.last_key
        return since >= progress_seconds() and (changed or since >= max(HEARTBEAT_SECONDS, progress_seconds()))

    def line_key(self, state: dict):
        """What a plain line says apart from the time: a last line is written only when this changed."""
        return state.get("description"), state.get("completed"), state.get("total")

    def plain_line(self, state: dict, elapsed: float) -> str:
        """The plain progress line for ``state`` (description, completed, total and the fields)."""
        done, total = state.get("completed") or 0, state.get("total")
        count_text = f" {done:,}/{total:,} ({100 * done / total:.0f}%)" if total else ""
        return fit([(f"{state['description']}{count_text}", 0), (duration(elapsed), 1)], self.width)

    def _write_line(self, now: float) -> None:
        line = self.plain_line(self.state, now - self.started_at)
        self.last_line_at, self.last_line, self.last_key = now, line, self.line_key(self.state)
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except OSError:  # its reader went away (`2>&1 | head`), a full disk: the run goes on without progress lines
            from shardprep.broken_pipe import silence

            self.enabled = False
            silence(sys.stderr)

    def __enter__(self):
        if self.enabled and not self.lazy:
            self.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()
        elif self.plain and not self.transient and self.last_line_at is not None:
            with self.lock:
                if self.line_key(self.state) != self.last_key:
                    self._write_line(time.monotonic())
        return False
