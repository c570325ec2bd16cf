"""Ctrl-C, in process: every subcommand exits 130 with one line; a local Beam run waited for in the main thread
stops on KeyboardInterrupt. The real SIGINT in a terminal is in ``test_terminal_preprocess.py``."""

from __future__ import annotations

import _thread
import threading
import time

import click
import pytest
from click.testing import CliRunner

from shardprep import cli
from shardprep.pipelines import stopping


def test_ctrl_c_in_any_subcommand_exits_130_with_one_line(monkeypatch):
    @click.command("sleep")
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.LazyGroup, "get_command", lambda self, ctx, name: interrupted)
    result = CliRunner().invoke(cli.main, ["sleep"])
    assert result.exit_code == 130
    assert result.output == "stopped (Ctrl-C)\n"


def test_a_stoppable_run_returns_its_result_and_raises_its_error():
    assert stopping.run_stoppable(lambda: 42) == 42

    def failing():
        raise ValueError("the run's own error")

    with pytest.raises(ValueError, match="the run's own error"):
        stopping.run_stoppable(failing)


def test_ctrl_c_while_a_run_is_waited_for_stops_the_wait_at_once():
    release = threading.Event()
    threading.Timer(0.3, _thread.interrupt_main).start()  # as SIGINT does: KeyboardInterrupt in the main thread
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stopping.run_stoppable(lambda: release.wait(30))  # a run that would block for 30 s
    release.set()
    assert time.monotonic() - started < 10


def test_ctrl_c_while_stderr_is_restored_takes_effect_after_it(monkeypatch):
    """A KeyboardInterrupt in the middle of putting fd 2 back would leave it on the workers' pipe."""
    import os
    import signal
    import sys

    from shardprep.pipelines import runner

    monkeypatch.setattr(runner, "_hide_worker_traces", True)  # as the CLI without --verbose
    stderr_before = os.fstat(2)
    original_dup2 = os.dup2

    def dup2_interrupted(fd, fd2, *args):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C just as the block puts fd 2 back
        return original_dup2(fd, fd2, *args)

    with pytest.raises(KeyboardInterrupt):
        with runner.worker_stderr_held(True):
            monkeypatch.setattr(os, "dup2", dup2_interrupted)
    monkeypatch.setattr(os, "dup2", original_dup2)
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (stderr_before.st_dev, stderr_before.st_ino)
    assert not sys.stderr.closed
