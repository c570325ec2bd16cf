"""Output whose reader went away: ``shardprep train ... | head -3``.

When ``head`` exits, every later write to the pipe fails (``BrokenPipeError``; Python ignores SIGPIPE, so the
process is not killed). A training run is hours of work whose result is its files, not its output: losing it
because the reader of its progress went away is never what the person wanted. :class:`Reporter` stops printing to
a stream whose reader has gone, says so once on stderr (where that still has a reader), and lets the run go on to
its end; the command then exits as it would have.

A gone stream's file descriptor is pointed at ``/dev/null`` (:func:`silence`): what Python still holds in its
buffer, and its flush at exit, go nowhere, so no "Exception ignored ... BrokenPipeError" is printed at exit, and
whatever else writes there (a library, a warning) fails no more.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

import click


def reader_gone(error: BaseException) -> bool:
    """True for the error of a write to a pipe nobody reads any more."""
    return isinstance(error, OSError) and (isinstance(error, BrokenPipeError) or error.errno == errno.EPIPE)


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


class Reporter:
    """``report(text)`` for a long run: ``click.echo`` to stdout until its reader goes away, then ``note`` once on
    stderr, and nothing more."""

    def __init__(self, note: str):
        self.note = note
        self.gone = False

    def __call__(self, text: str) -> None:
        if self.gone:
            return
        try:
            click.echo(text)
        except OSError as error:
            if not reader_gone(error):
                raise
            self.gone = True
            silence(sys.stdout)
            say(self.note, err=True)


@contextlib.contextmanager
def reader_may_go(stream=None):
    """For the lines a command prints after its work is done: if their reader has gone (``| head``), the rest goes
    nowhere and the command ends as it would have, its exit status still its result (click's own handling of a
    broken pipe exits 1)."""
    try:
        yield
    except OSError as error:
        if not reader_gone(error):
            raise
        silence(stream or sys.stdout)


def say(text: str, err: bool = False) -> None:
    """``click.echo``, a stream whose reader has gone silenced instead of failing."""
    try:
        click.echo(text, err=err)
    except OSError as error:
        if not reader_gone(error):
            raise
        silence(sys.stderr if err else sys.stdout)
