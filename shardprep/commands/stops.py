"""What a command stopped by Ctrl-C or SIGTERM says. ``preprocess``: what the run kept and the command that goes on
(one line however wide, to copy whole), or for a remote run whether its job was submitted. ``validate``: which of
the files it was asked to write this run wrote (a file left by an earlier run is not this run's)."""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import sys
from typing import TYPE_CHECKING, Iterator

import click

from shardprep.output import say
from shardprep.pipelines.runtime.stopping import exit_status
from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.preprocess.checks.events import RunCounts
from shardprep.preprocess.format.manifest import MANIFEST_NAME
from shardprep.preprocess.checks.text import count, output_width, series, wrap

if TYPE_CHECKING:  # validate_paths imports NumPy and PIL: not for `validate --help`
    from shardprep.pipelines.validate_job.paths import WrittenOutputs


def stopped_lines(output: str, counts: RunCounts, command: list[str], remote_runner: str | None = None,
                  run_began: float | None = None, job_submitted: bool = False) -> list[str]:
    """A stop after the run wrote manifest.json (``run_began``: ``time.time()`` at its start) lost nothing. A local
    run of an image folder keeps its finished decode groups (OUTPUT/.tmp, its journal) for ``--resume``; other local
    runs keep nothing: rerun, with ``--overwrite`` once OUTPUT was written to."""
    from shardprep.pipelines.runtime import journal, storage

    if remote_runner:
        return remote_lines(remote_runner, job_submitted)
    manifest = os.path.join(output, MANIFEST_NAME)
    folder = os.path.join(output, storage.SPILL_DIR)
    try:
        found = os.lstat(manifest)
        complete = run_began is not None and stat.S_ISREG(found.st_mode) and found.st_mtime >= run_began
    except OSError:
        complete = False
    if complete:
        return [*_prose(f"stopped after the dataset was complete: {manifest} is written"),
                *_leftover_lines(folder, command), f"check it: {shlex.join(['shardprep', 'validate', output])}"]
    try:
        kept_work = journal.kept_work(output)
    except (storage.OutputError, OSError):
        kept_work = None
    if kept_work is not None:
        kept = kept_work.inputs
        total = counts.listed if counts.processed else 0  # final once decoding started
        if kept_work.groups:
            of = f" of {total:,}" if total >= kept else ""
            said = (f"stopped: {kept:,}{of} image{'s' if (total or kept) != 1 else ''} kept "
                    f"({count(kept_work.groups, 'finished decode group')}) in {folder}")
        else:
            said = "stopped: no decode group had finished, so nothing decoded is kept"
        return [*_prose(said), "resume: " + shlex.join(_with_flag(command, "--resume", drop=("--overwrite",)))]
    try:
        started = bool(storage.existing_files(output))
    except storage.OutputError:
        started = False
    if started:
        return [*_prose("stopped: this run keeps no finished work (only a local run of an image folder can be "
                        "resumed)"),
                "rerun: " + shlex.join(_with_flag(command, "--overwrite", drop=("--resume",)))]
    return [*_prose(f"stopped before anything was written to {output}"), "rerun: " + shlex.join(command)]


def remote_lines(runner: str, submitted: bool) -> list[str]:
    """A submitted job (``p.run()`` returned) runs on there, no longer waited for; a stop before that came while
    Beam staged or submitted it, so a job may or may not exist."""
    from shardprep.pipelines.runtime import runner as runners

    dataflow = runners.on_dataflow(["--runner", runner])  # gcloud names only Dataflow's jobs
    if submitted:
        said = (f"stopped waiting: a job already submitted to {runner} runs on there; cancel it there if it should "
                "stop" + (" (e.g. gcloud dataflow jobs cancel JOB_ID)" if dataflow else ""))
    else:
        said = (f"stopped before or during the submission of the job to {runner}: a job may or may not have been "
                "created there; look for it and cancel it if it is listed"
                + (" (e.g. gcloud dataflow jobs list, then gcloud dataflow jobs cancel JOB_ID)" if dataflow else ""))
    return _prose(said)


def _leftover_lines(folder: str, command: list[str]) -> list[str]:
    """A run stopped while removing OUTPUT/.tmp (its last step): what is left and the command that removes it;
    nothing once the journal is gone."""
    from shardprep.pipelines.runtime.storage import JOURNAL_NAME

    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    if JOURNAL_NAME not in {entry.name for entry in entries}:
        return []
    size = sum(entry.stat(follow_symlinks=False).st_size for entry in entries if entry.is_file(follow_symlinks=False))
    return [*_prose(f"{folder} still holds {size / 2**20:.1f} MiB of the run's temporary files; they go with", "  "),
            "  " + shlex.join(_with_flag(command, "--resume", drop=("--overwrite",)))]


def _prose(text: str, indent: str = "") -> list[str]:
    width = max(output_width(sys.stderr) - len(indent), 20)  # narrower would set one word a line
    return [indent + line for line in wrap(text, width).splitlines()]


def typed_command(ctx) -> list[str]:
    """``shardprep [--verbose] preprocess ARGS...`` as it was typed."""
    verbose = ["--verbose"] if (ctx.find_root().params or {}).get("verbose") else []
    return ["shardprep", *verbose, "preprocess", *ctx.meta.get("args", [])]


def _with_flag(command: list[str], flag: str, drop: tuple[str, ...]) -> list[str]:
    """``command`` with ``flag`` last and without ``drop``, both before the Beam options after ``--``."""
    beam = command.index("--") if "--" in command else len(command)
    return [arg for arg in command[:beam] if arg not in drop and arg != flag] + [flag] + command[beam:]


@contextlib.contextmanager
def outputs_told(ctx: click.Context, options: ValidateOptions, outputs: WrittenOutputs) -> Iterator[None]:
    """Around validate's run and report: after a stop, one line on which asked-for files were written, and exit
    130 (143 after SIGTERM); a run asked to write nothing stops as any command does."""
    try:
        yield
    except KeyboardInterrupt as stop:
        line = stopped_line(options, outputs, getattr(stop, "by", "Ctrl-C"))
        if line is None:
            raise
        say(wrap(line, output_width(sys.stderr)), err=True)
        ctx.exit(exit_status(stop))


def stopped_line(options: ValidateOptions, outputs: WrittenOutputs, by: str) -> str | None:
    """``stopped (Ctrl-C) after validate wrote A, before it wrote B: ...`` (``--leaked-keys``, ``--pictures``,
    ``--json``, written in that order); None when none was asked for. A picture folder written in part: its
    pictures written, and "the rest of" it."""
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
    earlier = ": any file there now is an earlier run's"
    if not written:
        return f"stopped ({by}) before validate wrote {series(not_written, 'or')}{earlier}"
    if not not_written:
        return f"stopped ({by}) after validate wrote {series(written, 'and')}"
    return f"stopped ({by}) after validate wrote {series(written, 'and')}, before it wrote " \
           f"{series(not_written, 'and')}{earlier}"
