"""What ``shardprep validate`` says when Ctrl-C or SIGTERM stops it: which of the files it was asked to write
(``--leaked-keys``, ``--pictures``, ``--json``, written in that order, after every shard was read) this run wrote and
which not, so that a file of the same name left by an earlier run is not taken for this run's."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Iterator

import click

from shardprep.broken_pipe import say
from shardprep.pipelines.stopping import exit_status
from shardprep.pipelines.validate_options import ValidateOptions
from shardprep.preprocess.text import output_width, series, wrap

if TYPE_CHECKING:  # validate_paths imports NumPy and PIL: not for `validate --help`
    from shardprep.pipelines.validate_paths import WrittenOutputs


@contextlib.contextmanager
def outputs_told(ctx: click.Context, options: ValidateOptions, outputs: WrittenOutputs) -> Iterator[None]:
    """Around the run and its report: after a stop, one line on what of the asked-for files was written, and exit
    130 (143 after SIGTERM); a run asked to write nothing stops as any command does (the CLI's one line)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        line = stopped_line(options, outputs, getattr(stop, "by", "Ctrl-C"))
        if line is None:
            raise
        say(wrap(line, output_width(sys.stderr)), err=True)
        ctx.exit(exit_status(stop))


def stopped_line(options: ValidateOptions, outputs: WrittenOutputs, by: str) -> str | None:
    """``stopped (Ctrl-C) after validate wrote A, before it wrote B: ...``, paths as given; None when no file was
    asked for. A picture folder written in part: its pictures that were written, and "the rest of" it."""
    asked = [(flag, given) for flag, given in (("--leaked-keys", options.leaked_keys), ("--pictures", options.pictures),
                                               ("--json", options.json_path)) if given]
    if not asked:
        return None
    written, not_written = [], []
    for flag, given in asked:
        if flag in outputs.whole:
            written.append(f"{flag} {given}")
            continue
        files = [os.path.join(given, os.path.basename(path)) for wrote, path in outputs.files if wrote == flag]
        written += files
        not_written.append(f"the rest of {flag} {given}" if files else f"{flag} {given}")
    earlier = ": a file there now is an earlier run's"
    if not written:
        return f"stopped ({by}) before validate wrote {series(not_written, 'or')}{earlier}"
    if not not_written:
        return f"stopped ({by}) after validate wrote {series(written, 'and')}"
    return f"stopped ({by}) after validate wrote {series(written, 'and')}, before it wrote " \
           f"{series(not_written, 'and')}{earlier}"
