"""The CLI's one output boundary: what a person reads (rich, as wide as ``text.output_width``; the jobs' and the
training run's typed events drawn), and what happens when it cannot be written: a reader gone (``| head``, a hung-up
terminal) silences the stream; any other stdout error (a full disk) ends the command after its work with one
``Error:`` line and status 1; a failing stderr is silenced."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sys
import termios
import threading
import time
from typing import Any, Iterator

import click

from shardprep.preprocess.checks.events import Message, StageProgress, TrainingSteps, ValidationBatches
from shardprep.preprocess.checks.streams import silence
from shardprep.preprocess.checks.text import MIN_COLUMNS, bar, clock, count, output_width, terminal_columns, wrap  # noqa: F401

PROGRESS_SECONDS_ENV = "SHARDPREP_PROGRESS_SECONDS"  # outside a terminal: a plain progress line this often
DEFAULT_PROGRESS_SECONDS = 10.0
HEARTBEAT_SECONDS = 60.0  # a plain line with unchanged counts at most this often


def reader_gone(error: OSError, stream=None) -> str | None:
    """How ``stream``'s reader went away, if it did: a write to a pipe nobody reads (EPIPE), or EIO from a terminal (a
    hung-up one answers ``tcgetattr`` with EIO, a file with ENOTTY); EIO from a file is a disk's: None."""
    if isinstance(error, BrokenPipeError) or error.errno == errno.EPIPE:
        return "broken pipe"
    if error.errno != errno.EIO or stream is None:
        return None
    try:
        termios.tcgetattr(stream.fileno())
    except termios.error as failed:
        hung_up = failed.args[0] == errno.EIO
    except (AttributeError, OSError, ValueError):
        hung_up = bool(getattr(stream, "isatty", lambda: False)())
    else:
        hung_up = True
    return "the terminal hung up" if hung_up else None


class OutputError(click.ClickException):
    """Stdout could not be written: status 1, one line saying ``done`` (what the command finished)."""

    def __init__(self, error: OSError, done: str | None = None):
        super().__init__(f"cannot write to standard output: {error}" + (f"; {done}" if done else ""))

    def show(self, file=None) -> None:
        show_error(self)


def show_error(error: click.ClickException) -> None:
    """click's ``Error:`` line, on a person's terminal broken between words to its width (a log: one line); a usage
    error as click shows it (usage and hint)."""
    if isinstance(error, click.UsageError):
        return error.show()
    line = f"Error: {error.format_message()}"
    columns = terminal_columns(sys.stderr)
    say(wrap(line, columns) if columns else line, err=True)


def say(text: str, err: bool = False) -> None:
    """``click.echo`` that never fails on a reader gone, nor on stderr; any other stdout error: OutputError."""
    with reader_may_go(err=err):
        click.echo(text, err=err)


@contextlib.contextmanager
def reader_may_go(done: str | None = None, err: bool = False) -> Iterator[None]:
    """Around a command's lines after its work: a reader gone, the rest goes nowhere and the status is the
    command's; any other stdout write error ends it with :class:`OutputError` saying ``done``."""
    try:
        yield
    except OSError as error:
        stream = sys.stderr if err else sys.stdout
        gone = reader_gone(error, stream)
        silence(stream)
        if not err and gone is None:
            raise OutputError(error, done) from None


class Reporter:
    """A long run's lines to stdout until a write fails; then one note on stderr, why and ``goes_on`` (when given).
    :meth:`raise_failure` ends the command after its work for a failure other than a reader gone."""

    def __init__(self, goes_on: str | None = None):
        self.goes_on = goes_on
        self.gone = False
        self.failure: OSError | None = None

    def write(self, text: str) -> None:
        self(text, nl=False)

    def __call__(self, text: str, nl: bool = True) -> None:
        if self.gone:
            return
        try:
            click.echo(text, nl=nl)
        except OSError as error:
            self.gone, gone = True, reader_gone(error, sys.stdout)
            silence(sys.stdout)
            self.failure = None if gone else error
            why = f"the reader of this output went away ({gone})" if gone else \
                f"cannot write to standard output ({error})"
            if self.goes_on:  # as wide as train's progress lines
                say(wrap(f"note: {why}; {self.goes_on}", train_width()), err=True)

    def raise_failure(self, done: str | None = None) -> None:
        if self.failure is not None:
            raise OutputError(self.failure, done)


def _unflushable(stream) -> bool:
    with contextlib.suppress(OSError):
        stream.flush()
        return False
    return True


@contextlib.contextmanager
def failed_writes_exit(help_asked: bool) -> Iterator[None]:
    """Around the CLI's ``main``: click's own stdout output that failed (``--help``, or text a failed write left in
    stdout's buffer) ends with :class:`OutputError`'s line and status 1. EPIPE is click's to handle."""
    try:
        yield
    except OSError as error:
        if reader_gone(error) or not (help_asked or _unflushable(sys.stdout)):
            raise
        silence(sys.stdout)
        OutputError(error).show()
        sys.exit(1)


def console(stderr: bool = False):
    """A rich console as wide as :func:`output_width`; a reader gone raises BrokenPipeError for
    :func:`reader_may_go` (rich itself would exit 1 there and then)."""
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")

    return PipeAwareConsole(stderr=stderr, width=output_width(sys.stderr if stderr else sys.stdout))


def fit(parts: list[tuple[str, int]], width: int, separator: str = ", ") -> str:
    """``parts`` (text, rank) joined in order, as many as fit ``width``, lower ranks taken first; rank 0 always
    kept (a line of those alone is cut with "…")."""
    parts = [(text, rank) for text, rank in parts if text]
    kept = {i for i, (_, rank) in enumerate(parts) if rank == 0}

    def joined(indices) -> str:
        return separator.join(text for i, (text, _) in enumerate(parts) if i in indices)

    for i in sorted(set(range(len(parts))) - kept, key=lambda i: parts[i][1]):
        if len(joined(kept | {i})) <= width:
            kept.add(i)
    line = joined(kept)
    return line if len(line) <= width else line[:max(0, width - 1)] + "…"


def progress_seconds() -> float:
    with contextlib.suppress(ValueError):
        seconds = float(os.environ.get(PROGRESS_SECONDS_ENV, DEFAULT_PROGRESS_SECONDS))
        if seconds > 0:
            return seconds
    return DEFAULT_PROGRESS_SECONDS


BAR_COLUMNS = (10, 40)  # a live bar's narrowest and widest


class LiveProgress:
    """One task's progress on stderr: on a terminal rich's live display of :meth:`live_line` (from the first update
    when ``lazy``); elsewhere :meth:`plain_line` at the first update, then every :func:`progress_seconds` when
    :meth:`line_key` changed (a minute when not), at the end unless ``transient``. Reads ``sys.stderr`` afresh."""

    spinner: Any = None  # rich's Spinner, for a kind that draws one

    def __init__(self, enabled: bool, transient: bool, lazy: bool):
        self.enabled, self.transient, self.lazy = enabled, transient, lazy
        self.live: Any = None  # rich's Live, imported when drawn
        self.plain = False
        self.state: dict = {"description": "starting", "completed": 0, "total": None}
        self.started_at = time.monotonic()
        self.last_line_at: float | None = None
        self.last_key = None
        self.lock = threading.Lock()

    @property
    def width(self) -> int:
        return output_width(sys.stderr)

    def parts(self, state: dict, elapsed: float, width: int) -> list[tuple[str, int]]:
        raise NotImplementedError  # what a line says after its description, ranked for :func:`fit`

    def glue(self, state: dict) -> str:
        """What joins a plain line's description to its parts."""
        return " "

    def start(self) -> None:
        from rich.console import Console
        from rich.live import Live

        stderr = Console(stderr=True, width=self.width)
        self.started_at, self.plain = time.monotonic(), not stderr.is_terminal
        if not self.plain:  # rich asks self.__rich__ at every refresh
            self.live = Live(self, console=stderr, transient=self.transient, refresh_per_second=10,
                             redirect_stdout=False, redirect_stderr=False)
            self.live.start()

    def show(self, **update) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.live is None and not self.plain:
                self.start()
            self.state.update(update)
            if not self.plain:
                return
            now = time.monotonic()
            since = now - self.last_line_at if self.last_line_at is not None else float("inf")  # the first: at once
            if since >= progress_seconds() and (self.line_key(self.state) != self.last_key
                                                or since >= max(HEARTBEAT_SECONDS, progress_seconds())):
                self._write_line(now)

    def line_key(self, state: dict):
        """What a plain line says apart from the time: a last line is written only when this changed."""
        return tuple(state.get(key) for key in ("description", "completed", "total", "final", "finished"))

    def plain_line(self, state: dict, elapsed: float) -> str:
        description = state.get("description") or ""
        room = self.width - len(description) - 2
        return description + self.glue(state) + fit(self.parts(state, elapsed, room), room)

    def live_line(self):
        """Description, an ASCII bar (80 columns in bytes too; no total: a block moving with the clock), :meth:`parts`;
        three columns spare (a line that fills the last column may wrap; Ctrl-C echoes "^C" after it)."""
        from rich.table import Table
        from rich.text import Text

        with self.lock:
            state = dict(self.state)
        description = state.get("description") or ""
        width = self.width - 3 - (2 if self.spinner else 0)
        room = width - len(description) - BAR_COLUMNS[0] - 2
        rest = fit(self.parts(state, time.monotonic() - self.started_at, room), room)
        cells = max(BAR_COLUMNS[0], min(BAR_COLUMNS[1], width - len(description) - len(rest) - 2))
        done, total = state.get("completed") or 0, state.get("total") if state.get("final", True) else None
        fraction = min(1.0, done / total) if total else None
        style = "bar.pulse" if fraction is None else "bar.finished" if fraction == 1 else "bar.complete"
        line = Table.grid(padding=(0, 1))
        line.add_row(*([self.spinner] if self.spinner else []), Text(description, style="bold"),
                     Text(bar(fraction, cells, int(time.monotonic() * 8)), style=style), Text(rest))
        return line

    __rich__ = live_line

    def _write_line(self, now: float) -> None:
        self.last_line_at, self.last_key = now, self.line_key(self.state)
        say(self.plain_line(self.state, now - self.started_at), err=True)  # `2>&1 | head`, a full disk: silenced

    def __enter__(self):
        if self.enabled and not self.lazy:
            self.start()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.stop()
        elif not self.transient and self.last_line_at is not None:  # a plain line was written
            with self.lock:
                if self.line_key(self.state) != self.last_key:
                    self._write_line(time.monotonic())


ACROSS_RECORDS = "every shard read; comparing records (near-duplicates)"


class SpinnerProgress(LiveProgress):
    """``validate``'s and ``demo-data``'s progress: a spinner, the stage, files done of total, records, elapsed.
    ``all_done``: the stage's words once every file is done while work goes on (validate's near-duplicate search:
    a minute on a large dataset, where a full bar would seem stuck)."""

    def __init__(self, enabled: bool, all_done: str | None = None):
        from rich.spinner import Spinner

        super().__init__(enabled, transient=True, lazy=False)
        self.all_done, self.spinner = all_done, Spinner("line")

    def update(self, event: StageProgress):
        if event.done is None:
            return self.show(description=event.stage, completed=0, total=None, records="")
        all_done = self.all_done and event.total and event.done >= event.total
        self.show(description=self.all_done if all_done else event.stage, completed=event.done, total=event.total,
                  records=f"{event.records:,} records" if event.records is not None else "")

    def parts(self, state: dict, elapsed: float, width: int) -> list[tuple[str, int]]:
        done, total = state.get("completed") or 0, state.get("total")
        done_of = f"{done:,}/{total:,}" if total else ""
        share = f" ({100 * done / total:.0f}%)" if total and len(done_of) + 7 <= width else ""  # a long stage: M/N
        return [(done_of + share, 0), (state.get("records") or "", 2), (clock(elapsed, hours=True), 1)]


TRAIN_PLAIN_SECONDS = 10.0  # a training epoch's plain progress lines (logs, pipes): at most this often


def train_width() -> int:
    return max(MIN_COLUMNS, output_width())


class TrainDisplay:
    """A training run's events drawn through ``report`` (:class:`Reporter`; ``write``: the live line): messages wrapped
    to the width; within an epoch, on a terminal one line rewritten in place (a column short of the width) at most
    every ``interval_tty`` s, elsewhere a line every 10 s and a last N/N one if any; then the validation's batches."""

    def __init__(self, report=print, *, stream=None, write=None, interval_tty: float = 0.5, width: int | None = None):
        self.report, self.stream = report, stream if stream is not None else sys.stdout
        self.write = write or (lambda text: (self.stream.write(text), self.stream.flush()))
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval_tty if self.tty else TRAIN_PLAIN_SECONDS
        self.width = width or train_width()
        self.last_shown, self.shown, self.live, self.in_epoch = time.perf_counter(), False, False, False

    def __call__(self, event) -> None:
        now = time.perf_counter()
        if isinstance(event, Message) and event.immediate:
            self.immediate(event.text)
        elif isinstance(event, Message):
            self.end_line()
            self.report(wrap(event.text, self.width))
        elif isinstance(event, TrainingSteps):
            if not self.in_epoch:  # the epoch's first event: its clock started ``seconds`` ago
                self.in_epoch, self.shown, self.last_shown = True, False, now - event.seconds
            if event.finished:
                if self.tty or self.shown:
                    self.show(self.step_line(event, event.metrics()))
                self.end_line()
                self.last_shown = now
            elif now - self.last_shown >= self.interval and event.step < event.steps:
                self.last_shown = now
                self.show(self.step_line(event, event.metrics()))
        elif isinstance(event, ValidationBatches):
            if event.finished:  # the terminal's live line cleared before the epoch's lines
                self.in_epoch = False
                if self.tty and self.live:
                    self.write("\r" + " " * (self.width - 1) + "\r")
                    self.live = False
            elif now - self.last_shown >= self.interval or (self.tty and event.batch == 1):
                self.last_shown = now
                self.show(f"  validation: batch {event.batch}{f'/{event.batches}' if event.batches else ''}")

    def step_line(self, event: TrainingSteps, metrics) -> str:
        ran, seconds = event.step - event.first, event.seconds
        rate = ran * event.batch_size / seconds if seconds > 0 else math.nan
        left = (event.steps - event.step) * seconds / ran if ran else math.nan
        rest = ", ".join([f"{rate:,.0f} images/s" if math.isfinite(rate) else "? images/s",
                          f"took {clock(seconds)}" if event.step >= event.steps
                          else f"ETA {clock(left) if math.isfinite(left) else '?'}",
                          *(f"{name} {value:.4f}" for name, value in (metrics or {}).items()
                            if value is not None and math.isfinite(value))])
        steps = f"  step {event.step}/{event.steps}"
        if not self.tty:
            return f"{steps} ({100 * event.step / event.steps:.0f}%), {rest}"
        room = self.width - 1 - len(steps) - len(rest) - 2
        return f"{steps} {bar(event.step / event.steps, min(20, room))} {rest}" if room >= 5 else \
            f"{steps} {rest}"[:self.width - 1]

    def show(self, text: str) -> None:
        self.shown = True
        if self.tty:
            self.write("\r" + text.ljust(self.width - 1)[:self.width - 1])
            self.live = True
        else:
            self.report(wrap(text, self.width, indent="    "))

    def end_line(self) -> None:
        """Ends a live terminal line so that what is printed next starts on a line of its own."""
        if self.tty and self.live:
            self.write("\n")
            self.live = False

    def immediate(self, text: str) -> None:
        """From a signal handler: straight to the descriptor (a buffered write could fail as reentrant), over the
        "^C" a terminal echoed; without a descriptor, the stop message says it all."""
        text = ("\n" if self.tty and self.live else "") + wrap(text, self.width) + "\n"
        self.live = False
        # io.UnsupportedOperation is an OSError and a ValueError
        with contextlib.suppress(AttributeError, OSError, ValueError):
            descriptor = self.stream.fileno()
            os.write(descriptor, (("\r" + text) if os.isatty(descriptor) else text).encode())


def flow(items, width: int, indent: str = "  "):
    """One rich ``Text`` of ``items`` (``(separator, phrase)``; ``Text`` or plain strings, never markup) in lines of
    at most ``width`` cells, broken only between phrases (a phrase longer than a line: between its words), the
    separator's punctuation ending a line and the next indented."""
    from rich.text import Text

    phrases = []
    for separator, phrase in items:
        phrase = phrase if isinstance(phrase, Text) else Text(phrase)
        if phrase.cell_len <= width - len(indent):
            words = [phrase]
        else:  # between its words, its leading spaces kept with the first (an indented line stays indented)
            lead = len(phrase.plain) - len(phrase.plain.lstrip(" "))
            words = list(phrase[lead:].split(" ", allow_blank=True))
            words[0] = phrase[:lead] + words[0]
        phrases += [(separator if index == 0 else " ", word) for index, word in enumerate(words)]
    lines, line = [], Text()
    for index, (separator, phrase) in enumerate(phrases):
        if line.plain:
            trailing = len(phrases[index + 1][0].rstrip()) if index + 1 < len(phrases) else 0  # the next ';'
            if line.cell_len + len(separator) + phrase.cell_len + trailing <= width:
                line.append(separator)
            else:
                line.append(separator.rstrip())
                lines.append(line)
                line = Text(indent)
        line.append_text(phrase)
    lines.append(line)
    return Text("\n").join(lines)


def headed(items: list, text: str, separator: str = ": ") -> list:
    """:func:`flow` items: ``items`` (a heading), then ``text`` after ``separator``, cut where our sentences allow a
    break (after ': ', '; ', ', ' before a word, before a parenthesis of words); lists of numbers stay whole."""
    import re

    pieces = re.split(r"(: |; |, (?=[A-Za-z])| (?=\([A-Za-z]))", text)
    cut = [(pieces[index - 1] if index else "", piece) for index, piece in enumerate(pieces)
           if not index % 2 and piece]
    return items + [(separator, cut[0][1])] + cut[1:] if cut else items
