"""``shardprep preprocess`` as a person runs it: in a real pseudo-terminal 80 columns wide, to the end and with Ctrl-C.

Each test drives the real CLI (``tests/terminal.py``): the exit status, the summary, what is left on the screen, the
widest line written, and after Ctrl-C the stop line, the resume command it prints and that command's own run.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

import image_factory
from shardprep.preprocess import manifest as manifest_lib
from terminal import ROOT, run_in_terminal, shardprep_argv

WAIT_S = 240  # only against hangs on a loaded machine
FINAL_PROGRESS = re.compile(r"^images\b.*\b(\d[\d,]*)/\1\b")  # a progress line whose count is complete


@pytest.fixture(scope="module")
def small_source(tmp_path_factory):
    source = tmp_path_factory.mktemp("terminal") / "images"
    image_factory.write_image_folder(source, {"train": 30, "validation": 10}, classes=("cat", "dog"))
    return source


def test_a_display_started_while_worker_stderr_is_held_leaves_stderr_working():
    """The display may start (on its first update) inside the block where the workers' stderr is held: after both
    end, this process's stderr still works, and the program runs on and exits 0."""
    script = textwrap.dedent("""
        import sys
        from shardprep.commands.preprocess import _ProgressDisplay
        from shardprep.pipelines import runner

        runner.quiet_beam_logging(False)
        stderr = sys.stderr
        display = _ProgressDisplay(enabled=True)
        with display:
            with runner.worker_stderr_held(True):
                display.update({"listed": 3, "processed": 0})
            display.update({"listed": 3, "processed": 3})
        print("after the display; same stderr:", sys.stderr is stderr)
        print("stderr still writes", file=sys.stderr)
    """)
    run = run_in_terminal([sys.executable, "-c", script], timeout=WAIT_S)
    assert run.status == 0, run.describe()
    assert "after the display; same stderr: True" in run.text and "stderr still writes" in run.text, run.describe()
    assert "Bad file descriptor" not in run.text


def test_preprocess_in_an_80_column_terminal_ends_with_the_summary(small_source, tmp_path):
    output = tmp_path / "shards"
    run = run_in_terminal(shardprep_argv("preprocess", small_source, output, "--shorter-side", "16"),
                          timeout=WAIT_S)
    assert run.status == 0, run.describe()
    screen = run.screen
    assert any(line.startswith("shardprep preprocess → ") for line in screen), run.describe()
    assert f"manifest {output}/manifest.json" in run.written_lines, run.describe()  # a path is never broken
    assert os.path.exists(output / manifest_lib.MANIFEST_NAME)
    # The last progress line once, complete; nothing wider than the terminal (the output path is given whole).
    finals = [line for line in screen if FINAL_PROGRESS.match(line)]
    assert len(finals) == 1 and "40/40" in finals[0], run.describe()
    assert run.widest <= 80 or all(str(output) in line for line in run.written_lines if len(line) > 80), \
        run.describe()
    assert "Traceback" not in run.text and "lost sys.stderr" not in run.text
    assert "2 classes" in run.text and " 1 shards" not in run.text
