"""`shardprep train` in a child process, stopped at a known step: by SIGKILL, or by a real SIGINT in a pipe or in a
pseudo-terminal.

The child is :data:`DRIVER`: the CLI with an ``on_batch`` observer around ``loop.train``. At global step
``$TRAIN_RUNS_BLOCK_AT`` (before that step runs) the observer creates the file ``$TRAIN_RUNS_MARKER`` and then either
waits there for good (a kill lands at a known step) or, with ``$TRAIN_RUNS_STEP_SECONDS``, sleeps that long before
each step from then on (a SIGINT lands while a step is in flight and the run can still stop on its own).
With ``$TRAIN_RUNS_FIRST`` (a JSON list of CLI arguments), the child first runs that command to its end, unobserved
(e.g. an uninterrupted reference run, without paying a second process's start), then the one it is stopped in. With
``$TRAIN_RUNS_COPY_AT``, the --output-dir of the first run (or, without one, of the run stopped) is copied to
``$TRAIN_RUNS_COPY_TO`` before that global step runs (the disk a SIGKILL there would leave).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = """
import functools, json, os, shutil, sys, time
from shardprep.preprocess.checks import streams as quiet_logs
quiet_logs.quiet_tensorflow()  # the CLI's own quiet import of TensorFlow, before the loop imports it
from shardprep.train.run import loop
from shardprep.train.model import keras_model
keras_model.BLOCKS_PER_STAGE = (1, 1)  # conftest.short_resnet, as the test process trains

block_at = int(os.environ.get("TRAIN_RUNS_BLOCK_AT", "-1"))
marker = os.environ.get("TRAIN_RUNS_MARKER", "")
step_seconds = float(os.environ.get("TRAIN_RUNS_STEP_SECONDS", "0"))
first = json.loads(os.environ.get("TRAIN_RUNS_FIRST", "null"))
copy_at = int(os.environ.get("TRAIN_RUNS_COPY_AT", "-1"))
copy_to = os.environ.get("TRAIN_RUNS_COPY_TO", "")
armed = [first is None]

def observe(step, batch):
    if step == copy_at and armed[0] == (first is None):  # the first run's folder, else the stopped run's
        args = sys.argv[1:] if armed[0] else first
        named = [a.split("=", 1)[1] for a in args if a.startswith("--output-dir=")]
        shutil.copytree((named or [args[args.index("--output-dir") + 1]])[0], copy_to, symlinks=True)
    if not armed[0]:
        return
    if step == block_at:
        open(marker, "w").close()
        if not step_seconds:
            time.sleep(600)  # killed here
    if block_at >= 0 and step >= block_at and step_seconds:
        time.sleep(step_seconds)

loop.train = functools.partial(loop.train, on_batch=observe)
from shardprep.cli import main
if first is not None:
    try:
        main(first, prog_name="shardprep")
    except SystemExit as done:
        if done.code not in (0, None):
            raise
    armed[0] = True
main(sys.argv[1:], prog_name="shardprep")
"""


class Finished(NamedTuple):
    returncode: int
    output: str
    seconds_after_signal: float | None  # from the signal to the child's exit


def environment(backend: str, **extra) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRAIN_RUNS_")}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend, COLUMNS="80", **extra)
    return env


def run(args, backend: str, tmp_path, *, block_at: int | None = None, stop: int = signal.SIGKILL,
        step_seconds: float = 0.0, timeout: float = 300, first_args=None, copy=None) -> Finished:
    """The driver with ``args`` (CLI arguments after ``shardprep``) in a pipe, in the folder ``tmp_path`` (relative
    paths in ``args`` are there); with ``block_at``, ``stop`` is sent once the run reaches that step. With
    ``first_args``, the same process first runs ``shardprep *first_args`` to its end (an exit status other than 0
    ends the child there). With ``copy`` = (step, folder), the --output-dir of that first run (or, without one, of
    the run stopped) is copied to ``folder`` (relative to ``tmp_path``) before that step."""
    import json

    marker = tmp_path / f"reached-{time.monotonic_ns()}"
    extra = {}
    if first_args is not None:
        extra["TRAIN_RUNS_FIRST"] = json.dumps(list(map(str, first_args)))
    if copy is not None:
        extra.update(TRAIN_RUNS_COPY_AT=str(copy[0]), TRAIN_RUNS_COPY_TO=str(copy[1]))
    if block_at is not None:
        extra.update(TRAIN_RUNS_BLOCK_AT=str(block_at), TRAIN_RUNS_MARKER=str(marker),
                     TRAIN_RUNS_STEP_SECONDS=str(step_seconds))
    process = subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, args)], env=environment(backend, **extra),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signalled = None
    try:
        if block_at is not None:
            deadline = time.monotonic() + timeout
            while not marker.exists():
                if process.poll() is not None:
                    raise AssertionError(f"the run ended before step {block_at}:\n{process.stdout.read()[-3000:]}")
                assert time.monotonic() < deadline, "the run never reached the step it waits at"
                time.sleep(0.05)
            process.send_signal(stop)
            signalled = time.monotonic()
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    after = time.monotonic() - signalled if signalled is not None else None
    return Finished(process.returncode, output, after)


def spawn_in_terminal(args, backend: str, tmp_path, *, block_at: int | None = None, step_seconds: float = 0.0,
                      columns: int = 80):
    """The driver in a pseudo-terminal of ``columns`` columns (a ``pexpect.spawn``) in the folder ``tmp_path``, and
    the marker it creates at ``block_at``; the caller reads and signals it."""
    import pexpect

    marker = tmp_path / f"reached-{time.monotonic_ns()}"
    extra = {}
    if block_at is not None:
        extra = dict(TRAIN_RUNS_BLOCK_AT=str(block_at), TRAIN_RUNS_MARKER=str(marker),
                     TRAIN_RUNS_STEP_SECONDS=str(step_seconds))
    env = environment(backend, **extra)
    env.pop("COLUMNS")  # the terminal says how wide it is
    child = pexpect.spawn(sys.executable, ["-c", DRIVER, *map(str, args)], env=env, dimensions=(24, columns),
                          cwd=str(tmp_path), encoding="utf-8", timeout=300)
    return child, marker


def wait_for(path, child, timeout: float = 300) -> None:
    """Reads the terminal while waiting for ``path`` to exist (a child whose terminal fills would stall)."""
    import pexpect

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert child.isalive(), child.before
        assert time.monotonic() < deadline, "the run never reached the step it waits at"
        try:
            child.expect(pexpect.TIMEOUT, timeout=0.05)
        except pexpect.EOF:
            break


def screen_lines(text: str) -> list[str]:
    """What a terminal shows of ``text``: each carriage return starts the line again (the rest of the old one is
    assumed cleared, as the progress line pads or clears it), ANSI sequences dropped."""
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r\n", "\n")
    return [line.split("\r")[-1] for line in text.split("\n")]


def side_by_side(args: list[str], tmp_path, redirections: dict[str, str]) -> dict[str, str]:
    """``shardprep train ARGS --output-dir NAME REDIRECTION`` (:data:`DRIVER`, no step observed) for each
    ``{NAME: REDIRECTION}`` (``>/dev/full``, ``2>&1 | head -1``), run at once by bash in ``tmp_path`` on TensorFlow;
    returns ``{NAME: its exit status}`` (the train command's, not a pipe's last)."""
    import shlex

    train = shlex.join([sys.executable, "-c", DRIVER, "train", *map(str, args), "--output-dir"])
    script = "".join(f"( {train} {name} {redirection}; echo ${{PIPESTATUS[0]}} >{name}.status ) &\n"
                     for name, redirection in redirections.items()) + "wait\n"
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environment("tensorflow"), timeout=600, check=True)
    return {name: (tmp_path / f"{name}.status").read_text().strip() for name in redirections}
