"""A worker process that is stopped (SIGSTOP, or Ctrl-Z sent to it alone) holds its work forever: the run hung
with no word. The launcher watches its workers' state while it waits; one stopped for longer than a limit ends the
run with an error that names it, the workers ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from shardprep.pipelines.runtime import stopping
from small_sources import two_class_photos as source  # noqa: F401 - a fixture


def test_a_worker_stopped_past_the_limit_ends_the_run_with_a_message():
    # A process the launcher takes for a Beam SDK worker (its command line names Beam's worker module).
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "apache_beam.runners.worker"])
    try:
        time.sleep(0.3)
        worker.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(stopping.WorkerStopped, match=rf"worker process {worker.pid} has been stopped"):
            stopping.run_stoppable(worker.wait, stopped_limit_s=1.0)
        assert time.monotonic() - started < 1.0 + stopping.STOP_WAIT_S + 5
        assert worker.wait(timeout=10) < 0  # ended (SIGTERM), not left stopped
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_worker_stopped_briefly_and_continued_is_left_alone():
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.5)", "apache_beam.runners.worker"])
    try:
        time.sleep(0.3)
        worker.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        worker.send_signal(signal.SIGCONT)
        assert stopping.run_stoppable(worker.wait, stopped_limit_s=1.5) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_preprocess_and_validate_end_with_the_one_line_that_names_the_stopped_worker(source, tmp_path, monkeypatch):
    import validate_helpers as helpers
    from click.testing import CliRunner

    from shardprep.cli import main

    helpers.preprocess(source, tmp_path / "data")
    message = "worker process 4321 has been stopped (SIGSTOP or Ctrl-Z sent to it) for 60 s"

    def stopped(run, stopped_limit_s=stopping.STOPPED_WORKER_S):
        raise stopping.WorkerStopped(message)

    monkeypatch.setattr(stopping, "run_stoppable", stopped)
    in_process = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    preprocess = ["preprocess", str(source), str(tmp_path / "out"), "--quiet", "--allow-upscale"]
    for args in (preprocess, ["validate", str(tmp_path / "data"), "--quiet"]):
        result = CliRunner().invoke(main, args + in_process)
        assert result.exit_code == 1, (args[0], result.output, result.exception)
        lines = [line for line in result.output.splitlines() if not line.startswith(("inputs: ", "expected output: "))]
        assert lines == [f"Error: {message}"], (args[0], result.output, repr(result.exception))  # after the plan's
