"""What ``shardprep preprocess`` says after Ctrl-C or SIGTERM: what the stopped run kept, and the command that goes
on from there (``--resume``, or a rerun); for a remote run, whether its job was submitted.

The prose is broken between words to stderr's width (``_prose``), never inside a path; a command (``resume:``,
``rerun:``, ``check it:``) is one line however wide, so that it can be copied whole.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys

from shardprep.preprocess.manifest import MANIFEST_NAME
from shardprep.preprocess.text import count, output_width, wrap


def stopped_lines(output: str, counts: dict, command: list[str], remote_runner: str | None = None,
                  run_began: float | None = None, job_submitted: bool = False) -> list[str]:
    """After Ctrl-C: what the stopped run kept, and the command that goes on from there. A stop that came after the
    run wrote manifest.json (``run_began``: the run's start, ``time.time()``) lost nothing: the dataset is complete.

    A local run of an image folder keeps its finished decode groups in OUTPUT/.tmp (its journal), and ``--resume``
    keeps them. Other local runs keep nothing: rerun, with ``--overwrite`` where the run had started to write
    OUTPUT. A job on a remote runner is not stopped by Ctrl-C here (``remote_lines``).
    """
    from shardprep.pipelines import journal, storage

    if remote_runner:
        return remote_lines(remote_runner, job_submitted)
    manifest = os.path.join(output, MANIFEST_NAME)
    folder = os.path.join(output, storage.SPILL_DIR)
    if run_began is not None and _written_since(manifest, run_began):
        return [*_prose(f"stopped after the dataset was complete: {manifest} is written"),
                *_leftover_lines(folder, command), f"check it: {shlex.join(['shardprep', 'validate', output])}"]
    try:
        kept_work = journal.kept_work(output)
    except (storage.OutputError, OSError):
        kept_work = None
    if kept_work is not None:
        kept = kept_work.inputs
        total = counts.get("listed", 0) if counts.get("processed") else 0  # final once decoding started
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
    """A stopped remote run: its job, once submitted (``p.run()`` returned), runs on there, only no longer waited
    for; a stop before that came while Beam staged, uploaded or submitted it, so a job may or may not exist."""
    from shardprep.pipelines import remote_runs

    dataflow = remote_runs.on_dataflow(["--runner", runner])  # gcloud names only Dataflow's jobs
    if submitted:
        said = (f"stopped waiting: a job already submitted to {runner} runs on there; cancel it there if it should "
                "stop" + (" (e.g. gcloud dataflow jobs cancel JOB_ID)" if dataflow else ""))
    else:
        said = (f"stopped before or during the submission of the job to {runner}: a job may or may not have been "
                "created there; look for it and cancel it if it is listed"
                + (" (e.g. gcloud dataflow jobs list, then gcloud dataflow jobs cancel JOB_ID)" if dataflow else ""))
    return _prose(said)


def _leftover_lines(folder: str, command: list[str]) -> list[str]:
    """A run stopped while removing OUTPUT/.tmp (its last step): how much is left, and the command that removes it
    (``--resume`` of a finished run finishes that step); nothing when the journal is gone (then nothing of the
    run's is left there)."""
    from shardprep.pipelines.storage import JOURNAL_NAME

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
    """``text`` in lines of stderr's width (``output_width``) after ``indent``, broken only between words
    (``text.wrap``: a path stays whole), the lines after the first indented two more."""
    width = max(output_width(sys.stderr) - len(indent), 20)  # narrower would set one word a line
    return [indent + line for line in wrap(text, width).splitlines()]


def _written_since(path: str, since: float) -> bool:
    """Whether ``path`` is a regular file modified at or after ``since`` (``time.time()``)."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_mtime >= since


def typed_command(ctx) -> list[str]:
    """``shardprep [--verbose] preprocess ARGS...`` as it was typed."""
    verbose = ["--verbose"] if (ctx.find_root().params or {}).get("verbose") else []
    return ["shardprep", *verbose, "preprocess", *ctx.meta.get("preprocess.args", [])]


def _with_flag(command: list[str], flag: str, drop: tuple[str, ...]) -> list[str]:
    """``command`` with ``flag`` last and without ``drop``, both before the Beam options after ``--``."""
    beam = command.index("--") if "--" in command else len(command)
    own = [arg for arg in command[:beam] if arg not in drop and arg != flag]
    return own + [flag] + command[beam:]
