"""Output that cannot be written: a reader that went away (``shardprep train ... | head -3``), a full disk or an I/O
error (``shardprep validate DATA > log`` on a full disk, ``> /dev/full``).

When ``head`` exits, every later write to the pipe fails (``BrokenPipeError``; Python ignores SIGPIPE, so the
process is not killed). A terminal whose window closed (or whose ssh connection dropped) under a process that
ignores the hang-up fails every later write with EIO: its reader went away too. A training run is hours of work whose result is its files, not its output: losing it
because the reader of its progress went away is never what the person wanted. :class:`Reporter` stops printing to
a stream whose reader has gone, says so once on stderr (where that still has a reader), and lets the run go on to
its end; the command then exits as it would have.

Any other write error on stdout (ENOSPC, EIO from a disk, EDQUOT) means output the person meant to keep is lost: the command
ends (a training run at its end, its files complete) with one line on stderr, ``Error: cannot write to standard
output: [Errno 28] No space left on device``, saying what was done, and exit status 1, as coreutils'
``echo hi > /dev/full`` does (:class:`OutputError`). A stderr that cannot be written is silenced: the exit status
still tells the result.

A failed stream's file descriptor is pointed at ``/dev/null`` (:func:`silence`): what Python still holds in its
buffer, and its flush at exit, go nowhere, so no "Exception ignored ... BrokenPipeError" is printed at exit, and
whatever else writes there (a library, a warning) fails no more.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import termios
from typing import Callable, Iterator, NoReturn

import click


def reader_gone(error: BaseException, stream=None) -> bool:
    """True for the error of a write to a pipe nobody reads any more, or to a terminal that hung up: EIO from
    ``stream`` (the one written, asked before it is silenced) when it is a terminal; from a file, EIO is a disk's."""
    if not isinstance(error, OSError):
        return False
    if isinstance(error, BrokenPipeError) or error.errno == errno.EPIPE:
        return True
    return error.errno == errno.EIO and stream is not None and _terminal(stream)


def gone_reason(error: OSError) -> str:
    """Why the reader of a write that failed with ``error`` is gone (:func:`reader_gone`), in a few words."""
    return "broken pipe" if isinstance(error, BrokenPipeError) or error.errno == errno.EPIPE else "the terminal hung up"


def _terminal(stream) -> bool:
    """Whether ``stream`` writes to a terminal, hung up or not: a hung-up one answers a terminal's query with EIO
    (and ``isatty()`` with False), any other file with ENOTTY. A stream without a descriptor answers ``isatty()``."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return bool(getattr(stream, "isatty", lambda: False)())
    try:
        termios.tcgetattr(descriptor)
    except termios.error as error:
        return error.args[0] == errno.EIO
    return True


def silence(stream) -> None:
    """Points ``stream``'s file descriptor at ``/dev/null`` (a stream without one, as in a test's captured output,
    is left alone: nothing flushes it to a pipe at exit)."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)


def open_closed_streams() -> None:
    """Puts ``/dev/null`` on a standard input or error the command was started without (``2>&-``, ``<&-``): Python
    leaves ``sys.stderr`` None then, which the first progress line failed on (exit 1, no word), and the first file
    the run opens would take the free descriptor, and what writes to "stderr" (a worker process) go into it."""
    for descriptor, name, mode in ((0, "stdin", os.O_RDONLY), (2, "stderr", os.O_WRONLY)):
        try:
            os.fstat(descriptor)
            continue
        except OSError:
            null = os.open(os.devnull, mode)
        if null != descriptor:
            os.dup2(null, descriptor)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(descriptor, "w" if descriptor else "r", closefd=False))


class OutputError(click.ClickException):
    """Standard output could not be written (not a reader that went away): exit status 1 and one line on stderr,
    ``done`` (what the command finished: "the dataset is complete (OUT/manifest.json)") after the error."""

    def __init__(self, error: OSError, done: str | None = None):
        super().__init__(f"cannot write to standard output: {error}" + (f"; {done}" if done else ""))

    def show(self, file=None) -> None:
        from shardprep.preprocess.text import terminal_columns, wrap

        line = f"Error: {self.format_message()}"
        columns = terminal_columns(sys.stderr)  # a person's terminal: broken between words; a log: one line
        say(wrap(line, columns) if columns else line, err=True)


class Reporter:
    """``report(text)`` for a long run: ``click.echo`` to stdout until a write fails, then a note once on stderr,
    and nothing more. ``note`` (or ``note(error)``) is said when the reader went away, ``failed_note(error)`` for any
    other write error (a full disk), which :meth:`raise_failure` then reports when the run is done; None says
    nothing. :meth:`write` writes text as it is (a terminal's live line), its failure handled the same way."""

    def __init__(self, note: str | Callable[[OSError], str] | None,
                 failed_note: Callable[[OSError], str] | None = None):
        self.note = note
        self.failed_note = failed_note
        self.gone = False
        self.failure: OSError | None = None

    def __call__(self, text: str) -> None:
        self._echo(text, nl=True)

    def write(self, text: str) -> None:
        """``text`` without a newline added: a live line rewritten in place (``"\\r..."``) on a terminal."""
        self._echo(text, nl=False)

    def _echo(self, text: str, nl: bool) -> None:
        if self.gone:
            return
        try:
            click.echo(text, nl=nl)
        except OSError as error:
            self.gone = True
            gone = reader_gone(error, sys.stdout)
            silence(sys.stdout)
            if not gone:
                self.failure = error
            note = (self.note(error) if callable(self.note) else self.note) if gone else (
                self.failed_note and self.failed_note(error))
            if note:
                say(note, err=True)

    def raise_failure(self, done: str | None = None) -> None:
        """Ends the command (:class:`OutputError`) if a write failed other than for a reader that went away."""
        if self.failure is not None:
            raise OutputError(self.failure, done)


@contextlib.contextmanager
def reader_may_go(stream=None, done: str | None = None) -> Iterator[None]:
    """For the lines a command prints after its work is done: if their reader has gone (``| head``), the rest goes
    nowhere and the command ends as it would have, its exit status still its result (click's own handling of a
    broken pipe exits 1). Any other write error ends it with :class:`OutputError`, saying ``done``."""
    try:
        yield
    except OSError as error:
        gone = reader_gone(error, stream or sys.stdout)
        silence(stream or sys.stdout)
        if not gone:
            raise OutputError(error, done) from None


def say(text: str, err: bool = False) -> None:
    """``click.echo``, a stream whose reader has gone silenced instead of failing. On stdout any other write error
    raises :class:`OutputError`; on stderr it is silenced too (nowhere is left to say it)."""
    stream = sys.stderr if err else sys.stdout
    try:
        click.echo(text, err=err)
    except OSError as error:
        gone = reader_gone(error, stream)
        silence(stream)
        if not err and not gone:
            raise OutputError(error) from None


@contextlib.contextmanager
def failed_writes_exit() -> Iterator[None]:
    """Around the CLI's ``main``: a write error that escapes from click's own output (``--help``; an error line on a
    stderr that cannot be written) ends the process with its exit status, never a traceback."""
    try:
        yield
    except OSError as error:
        stream = _echo_stream(error)
        if stream is None or (stream is sys.stdout and reader_gone(error)):
            raise  # not click writing to stdout or stderr; or a broken pipe on stdout, which click handles itself
        _exit_after(error, stream)


def _echo_stream(error: OSError):
    """``sys.stdout`` or ``sys.stderr``: the one ``click.echo`` was writing when ``error`` was raised; None when it
    was raised elsewhere, or writing another file (the traceback's frames tell: click prints through ``echo``)."""
    traceback = error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code is click.utils.echo.__code__:
            written = frame.f_locals.get("file")
            return next((stream for stream in (sys.stdout, sys.stderr) if _same_file(written, stream)), None)
        traceback = traceback.tb_next
    return None


def _same_file(stream, other) -> bool:
    if stream is other:
        return True
    try:
        return stream.fileno() == other.fileno()
    except (AttributeError, OSError, ValueError):
        return False


def _exit_after(error: OSError, stream) -> NoReturn:
    """Exits as the command would have: 1 after stdout's :class:`OutputError`; the status of the error whose line
    could not be written on stderr (a usage error's 2)."""
    silence(stream)
    if stream is sys.stdout:
        OutputError(error).show()
        sys.exit(1)
    traceback, status = error.__traceback__, 1
    while traceback is not None:  # the ClickException whose show() wrote it
        shown = traceback.tb_frame.f_locals.get("self")
        if isinstance(shown, click.ClickException):
            status = shown.exit_code
        traceback = traceback.tb_next
    sys.exit(status)
