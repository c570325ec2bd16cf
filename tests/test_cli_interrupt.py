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
from shardprep.pipelines.runtime import stopping
from shardprep.pipelines.runtime.worker_zygote import WORKER_NAME


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



def test_ctrl_c_gives_the_run_time_to_unwind_before_it_is_reported():
    """The stop lines count what the run saved, so the run gets up to STOP_WAIT_S to reach its next input check
    and unwind. (A KeyboardInterrupt inside Thread.join had marked the running thread stopped: no wait at all.)"""
    unwound = threading.Event()

    def run():
        try:
            while True:
                stopping.check_not_stopped()
                time.sleep(1.0)  # one input's work, uninterruptible
        finally:
            unwound.set()

    threading.Timer(0.5, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        stopping.run_stoppable(run)
    assert unwound.is_set()

def test_ctrl_c_while_stderr_is_restored_takes_effect_after_it(monkeypatch):
    """A KeyboardInterrupt in the middle of putting fd 2 back would leave it on the workers' pipe."""
    import os
    import signal
    import sys

    from shardprep.preprocess.checks import streams

    monkeypatch.setattr(streams, "_hide_worker_traces", True)  # as the CLI without --verbose
    stderr_before = os.fstat(2)
    original_dup2 = os.dup2

    def dup2_interrupted(fd, fd2, *args):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C just as the block puts fd 2 back
        return original_dup2(fd, fd2, *args)

    # Another thread, as the runner's are: the signal may be delivered to it (a mask on this thread alone holds off
    # nothing then), and Python still runs the handler in this one, at once.
    import threading

    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with streams.worker_stderr_held(True):
                monkeypatch.setattr(os, "dup2", dup2_interrupted)
    finally:
        done.set()
        other.join()
    monkeypatch.setattr(os, "dup2", original_dup2)
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (stderr_before.st_dev, stderr_before.st_ino)
    assert not sys.stderr.closed


# A run that never reaches its next input check: it stays in OpenCV's native code, as a long decode does.
_RUN_IN_NATIVE_CODE = """
import sys
import numpy as np
from shardprep.pipelines.runtime import stopping
from shardprep.preprocess.image import resize

cv2 = resize.opencv()
image = np.zeros((3000, 4000, 3), np.uint8)

def run():
    print("running", flush=True)
    while True:
        cv2.resize(image, (2000, 1500), interpolation=cv2.INTER_AREA)

try:
    stopping.run_stoppable(run)
except KeyboardInterrupt:
    print("stopped", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_while_the_run_is_in_native_code_exits_130_not_an_abort(tmp_path):
    """After Ctrl-C the run's thread may still be inside a C++ library when the interpreter exits; Python then ends
    that thread with pthread_exit, and the C++ frames it unwinds through abort the process ("terminate called
    without an active exception", status 134) after the stop lines were printed. The process ends 130 instead."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(_RUN_IN_NATIVE_CODE)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline() == b"running\n"
    time.sleep(0.5)  # inside the resize loop
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err.decode()
    assert out.decode() == "stopped\n"
    assert b"terminate called" not in err and not err, err.decode()
    assert time.monotonic() - started < stopping.STOP_WAIT_S + 10


def test_the_command_line_entry_imports_little_so_ctrl_c_at_start_is_the_clis_own():
    """The console script imports ``shardprep.cli`` before any Ctrl-C handling can run: a Ctrl-C then printed
    Python's KeyboardInterrupt traceback. That import took ~0.2 s (NumPy, for the version); it now takes what click
    does, and everything after it (the subcommand's imports too) ends with exit 130 and one line."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", "import sys, shardprep.cli; "
                                                   "print(sorted(m for m in ('numpy', 'rich', 'PIL') if m in sys.modules))"],
                            capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"
    version = CliRunner().invoke(cli.main, ["--version"])
    from shardprep.preprocess.format.manifest import tool_version

    assert version.exit_code == 0 and version.output == f"shardprep, version {tool_version()}\n"


def test_ctrl_c_of_validate_on_worker_processes_is_one_line_not_their_tracebacks(tmp_path):
    """validate let its SDK worker processes write to the terminal: a Ctrl-C there printed 60-90 lines of their
    and Beam's thread tracebacks ("Worker subprocess exited with return code -15") before "stopped (Ctrl-C)". It
    holds them back now, as preprocess does."""
    import os
    import signal
    import subprocess
    import sys

    from train_helpers import random_images, write_dataset

    def sdk_workers() -> int:  # Beam's SDK worker processes running now (only this test starts any)
        count = 0
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    count += b"apache_beam.runners.worker.sdk_worker_main" in f.read()
                with open(f"/proc/{name}/comm", "rb") as f:  # a worker forked by the worker zygote
                    count += f.read().strip() == WORKER_NAME.encode()
            except OSError:
                pass
        return count

    # 800 records keep validate reading for seconds after its workers start; 64 px is enough (its work is per record)
    write_dataset(tmp_path / "data", {"train": random_images(800, 64, 64)}, classes=["a", "b"], num_shards=2)
    process = subprocess.Popen([sys.executable, "-m", "shardprep.cli", "validate", str(tmp_path / "data"), "--",
                                "--direct_num_workers=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while sdk_workers() < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the workers started (forked: at once), reading
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        output = process.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130, output[-3000:]  # stopped mid-run, not finished first
    assert "Traceback" not in output and "Exception in thread" not in output, output[-3000:]
    assert output.rstrip().splitlines()[-1] == "stopped (Ctrl-C)"


def test_sigterm_stops_preprocess_as_ctrl_c_does_workers_ended_lines_printed_exit_143(tmp_path):
    """`kill PID` / `timeout` sends SIGTERM to shardprep alone: it died at once, printed nothing, left its lock file
    and its SDK worker processes running (holding the output pipe open for ~2 minutes). It now stops as Ctrl-C
    does: the workers ended, what was kept and the resume command, exit 143 (128 + SIGTERM), no lock left."""
    import os
    import signal
    import subprocess
    import sys

    import image_factory

    source, output = tmp_path / "src", tmp_path / "out"
    image_factory.write_image_folder(source, {"train": 400}, classes=("a", "b"), min_side=100, max_side=200,
                                     kinds=("jpeg",))  # the workers decode for a second or more after they start
    process = subprocess.Popen([sys.executable, "-m", "shardprep.cli", "preprocess", str(source), str(output),
                                "--allow-upscale", "--", "--direct_num_workers=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not stopping.worker_processes(process.pid) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the run is going: its workers (forked in milliseconds) have started
        process.send_signal(signal.SIGTERM)  # to shardprep alone, as kill and timeout send it
        started = time.monotonic()
        text = process.communicate(timeout=60)[0].decode(errors="replace")  # the pipe closes: no worker holds it
        waited = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, text[-3000:]
    assert waited < 20, waited
    assert "Traceback" not in text, text[-3000:]
    lines = text.rstrip().splitlines()
    assert lines[-1].startswith("resume: shardprep preprocess ") or lines[-1] == "stopped (SIGTERM)", text[-3000:]
    assert not (output / ".shardprep.lock").exists()


def test_the_in_memory_notice_filter_is_added_once_however_many_pipelines_are_made():
    """Every local run's pipeline asks for the filter; a process making many (a notebook, a test session) keeps one."""
    import logging

    from shardprep.preprocess.checks import streams

    logger = logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner")
    for _ in range(3):
        streams.drop_in_memory_warning()
    assert len(logger.filters) == 1
    record = logging.LogRecord(logger.name, logging.WARNING, __file__, 1, "If direct_num_workers is not equal to 1, "
                               "direct_running_mode should be ...", None, None)
    assert not logger.filter(record) and logger.filter(logging.LogRecord(logger.name, logging.WARNING, __file__, 1,
                                                                         "another warning", None, None))
