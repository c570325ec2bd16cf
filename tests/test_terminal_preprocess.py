"""``shardprep preprocess`` as a person runs it: in a real pseudo-terminal 80 columns wide, to the end and with Ctrl-C.

Each test drives the real CLI (``tests/terminal.py``): the exit status, the summary, what is left on the screen, the
widest line written, and after Ctrl-C the stop line, the resume command it prints and that command's own run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import image_factory
from shardprep.pipelines.runtime import stopping
from shardprep.preprocess.format import manifest as manifest_lib
from terminal import ROOT, run_in_terminal, running, shardprep_argv

WAIT_S = 240  # only against hangs on a loaded machine
FINAL_PROGRESS = re.compile(r"^images\b.*\b(\d[\d,]*)/\1\b")  # a progress line whose count is complete


def test_a_display_started_while_worker_stderr_is_held_leaves_stderr_working():
    """The display may start (on its first update) inside the block where the workers' stderr is held: after both
    end, this process's stderr still works, and the program runs on and exits 0."""
    script = textwrap.dedent("""
        import sys
        from shardprep.commands.preprocess import _ProgressDisplay
        from shardprep.preprocess.checks.events import RunCounts
        from shardprep.preprocess.checks import streams

        streams.quiet_beam(False)
        stderr = sys.stderr
        display = _ProgressDisplay(enabled=True)
        with display:
            with streams.worker_stderr_held(True):
                display.update(RunCounts(listed=3, processed=0))
            display.update(RunCounts(listed=3, processed=3))
        print("after the display; same stderr:", sys.stderr is stderr)
        print("stderr still writes", file=sys.stderr)
    """)
    run = run_in_terminal([sys.executable, "-c", script], timeout=WAIT_S)
    assert run.status == 0, run.describe()
    assert "after the display; same stderr: True" in run.text and "stderr still writes" in run.text, run.describe()
    assert "Bad file descriptor" not in run.text


def assert_ends_with_the_summary(run, output: str, inputs: int) -> None:
    assert run.status == 0, run.describe()
    screen = run.screen
    assert f"shardprep preprocess → {output}" in run.written_lines, run.describe()
    assert f"manifest {output}/manifest.json" in run.written_lines, run.describe()  # a path is never broken
    # The last progress line once, complete; nothing wider than the terminal (a long output path is given whole).
    finals = [line for line in screen if FINAL_PROGRESS.match(line)]
    assert len(finals) == 1 and f"{inputs}/{inputs}" in finals[0], run.describe()
    # 80 columns however they are counted: in bytes too (a log viewer, a terminal without UTF-8, a check that counts
    # bytes saw the bar's "━" as 3 columns each: 147 on an 80-column terminal).
    assert all(len(line.encode("utf-8")) <= 80 for line in run.written_lines if output not in line), run.describe()
    assert "Traceback" not in run.text and "lost sys.stderr" not in run.text
    assert " 1 shards" not in run.text and " 1 classes" not in run.text


def test_readme_command_1_in_an_80_column_terminal_ends_with_the_summary(tmp_path):
    """README's first command after the install: the demo data, then preprocess, chained with && in a shell; in a
    shell whose stale ``COLUMNS`` (200) must never widen the output past the terminal's 80 columns."""
    shardprep = os.path.join(os.path.dirname(sys.executable), "shardprep")
    run = run_in_terminal(["bash", "-c", f"{shardprep} demo-data demo/images && "
                                         f"{shardprep} preprocess demo/images demo/shards --overwrite"],
                          cwd=str(tmp_path), env={"COLUMNS": "200"}, timeout=WAIT_S)
    assert_ends_with_the_summary(run, "demo/shards", 303)
    assert "rejected by reason:" in run.screen and "4 classes; raw pixels, 256x256 centre crops" in run.screen
    assert "4 classes; raw pixels, 256x256 centre crops" in run.written_lines  # a whole line: not wrapped at 200
    assert os.path.exists(tmp_path / "demo" / "shards" / manifest_lib.MANIFEST_NAME)


# --- Ctrl-C ----------------------------------------------------------------------------------------------------

# Photos big enough that decoding takes some seconds on two workers, so Ctrl-C lands while groups are decoded:
# copies of one generated JPEG (generating each would take longer than the runs).
SLOW_SPLITS = {"train": 160, "validation": 32}


@pytest.fixture(scope="module")
def slow_source(tmp_path_factory):
    import io

    import numpy as np
    from PIL import Image

    source = tmp_path_factory.mktemp("terminal-slow") / "photos"
    encoded = io.BytesIO()
    Image.fromarray(image_factory.class_image((200, 80, 40), 1200, 900, np.random.default_rng(0))).save(
        encoded, "JPEG", quality=90)
    for split, count in SLOW_SPLITS.items():
        for i in range(count):
            folder = source / split / ("cat", "dog")[i % 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{split}_{i:04d}.jpg").write_bytes(encoded.getvalue())
    return source


@pytest.mark.timeout(600)
@pytest.mark.parametrize("beam", [[], ["--", "--direct_num_workers=2"]], ids=["in-process", "two-workers"])
def test_ctrl_c_stops_cleanly_says_what_is_kept_and_the_resume_command_finishes(slow_source, tmp_path, beam):
    """By default this small folder runs in shardprep's own process; with two worker processes, they stop too.

    The resume command is run once, the in-process one: resuming with worker processes is
    test_preprocess_resume's (a killed two-worker run resumed byte-identical)."""
    output = tmp_path / "shards"
    argv = shardprep_argv("preprocess", slow_source, output, "--shorter-side", "64", *beam)
    # Ctrl-C once the journal holds a finished decode group (so some work is kept), most likely while others are
    # still decoded (if the run got further, everything is kept: the checks below hold all the same).
    run = run_in_terminal(argv, timeout=WAIT_S, interrupt_when=lambda _: journal_lines(output) >= 2)
    assert run.interrupted_at is not None, run.describe()
    assert run.status == 130, run.describe()
    assert run.stopped_after < 15, run.describe()  # a clean stop, not a hang (seconds on an idle machine)
    assert bool(run.processes_at_interrupt) == bool(beam), run.describe()
    assert not run.left_running, run.describe()  # the Beam workers stopped too
    assert "Traceback" not in run.text and "Aborted!" not in run.text, run.describe()
    starts = [index for index, line in enumerate(run.written_lines) if line.startswith("stopped:")]
    assert len(starts) == 1, run.describe()
    commands = [line for line in run.written_lines if line.startswith("resume: ")]
    assert len(commands) == 1, run.describe()
    # The stop line is prose, broken between words at 80 columns (the terminal broke it mid-word, mid-path): its
    # lines up to the resume command, read together.
    stop_lines = run.written_lines[starts[0]:run.written_lines.index(commands[0])]
    kept = re.fullmatch(r"stopped: ([\d,]+) of ([\d,]+) images? kept \((\d+) finished decode groups?\) in (\S+)",
                        " ".join(" ".join(stop_lines).split()))
    assert kept, stop_lines
    assert int(kept.group(1).replace(",", "")) > 0 and kept.group(4) == f"{output}/.tmp"
    assert not os.path.exists(output / manifest_lib.MANIFEST_NAME)
    # Lines fit the terminal but for a path longer than a line alone, and the resume command, each kept whole.
    assert all(len(line) <= 80 or len(line.split()) == 1 or line in commands for line in run.written_lines), \
        run.describe()
    command = shlex.split(commands[0][len("resume: "):])
    assert command == ["shardprep", "preprocess", str(slow_source), str(output), "--shorter-side", "64", "--resume",
                       *beam]
    if beam:
        return

    resumed = run_in_terminal(shardprep_argv(*command[1:]), timeout=WAIT_S)
    assert resumed.status == 0, resumed.describe()
    assert "resuming: " in resumed.text and "Traceback" not in resumed.text
    assert all(len(line) <= 80 for line in resumed.written_lines if str(output) not in line), resumed.describe()
    groups = re.search(r"resumed: (\d+) of (\d+) decode groups kept", resumed.text)
    assert groups and int(groups.group(1)) >= int(kept.group(3)), resumed.describe()
    assert os.path.exists(output / manifest_lib.MANIFEST_NAME)


@pytest.mark.timeout(600)
def test_sigint_to_the_launcher_alone_stops_its_beam_workers(slow_source, tmp_path):
    """``kill -INT`` of the shardprep process only (not its process group, as a terminal would): the Beam worker
    processes it started are stopped too, and it exits 130."""
    output = tmp_path / "shards"
    process = subprocess.Popen(
        shardprep_argv("preprocess", slow_source, output, "--shorter-side", "64", "--", "--direct_num_workers=2"),
        cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + WAIT_S
        workers: list[int] = []
        while time.monotonic() < deadline and process.poll() is None:
            workers = stopping.worker_processes(process.pid)
            if len(workers) >= 2 and os.path.exists(output / ".tmp" / "journal.jsonl"):
                break
            time.sleep(0.2)
        assert workers and process.poll() is None  # the run is going (forked workers can finish it within 1 s)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
        text = out.decode("utf-8", "replace")
        assert process.returncode == 130, text
        assert "resume: shardprep preprocess" in text, text
        assert not [pid for pid in workers if running(pid)], text
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def journal_lines(output) -> int:
    """Complete lines in OUTPUT/.tmp/journal.jsonl: its header, then one per finished decode group."""
    try:
        return (output / ".tmp" / "journal.jsonl").read_bytes().count(b"\n")
    except OSError:
        return 0

