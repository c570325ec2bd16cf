"""Ctrl-C in a command's first tenth of a second (while the console script imports the CLI, or while click reads
the arguments) ends it as later: one line, ``stopped (Ctrl-C)``, exit status 130, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from shardprep import cli

# The console script's two lines, with Ctrl-C pressed (SIGINT sent to the process itself) as a module is imported.
_INTERRUPTED_IMPORT = """
import os, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["shardprep", "validate", "no-such-data"]
from shardprep.cli import main
sys.exit(main())
"""


def test_ctrl_c_while_the_console_script_imports_the_cli_is_one_line_and_130():
    for module in ("click.core", "shardprep.pipelines.runtime.stopping"):
        done = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT.format(module=module)], capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stderr, done.stdout) == (130, "stopped (Ctrl-C)\n", ""), done.stderr


def test_ctrl_c_while_click_reads_the_arguments_is_one_line_and_130(monkeypatch):
    def interrupted(self, ctx, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(click.Group, "parse_args", interrupted)
    result = CliRunner().invoke(cli.main, ["validate", "x"])
    assert (result.exit_code, result.output) == (130, "stopped (Ctrl-C)\n")
