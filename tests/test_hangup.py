"""SIGHUP (the terminal closed, the ssh connection dropped) and SIGTERM stop a run as Ctrl-C does: its worker
processes ended, exit 129 or 143, and nothing of it left in TMPDIR (SIGHUP killed it at once: Beam's
``beam-pipeline-temp*`` and the progress display's ``shardprep-progress-*`` folders stayed behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import image_factory
import pytest

from shardprep.pipelines.runtime import stopping


def _hangup_as_from_a_terminal():
    """A suite started under nohup passes SIGHUP on ignored, and a run that inherits it ignored keeps it so (the test
    below): the child starts with the default action, as a run started from a terminal does."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Enough work that the run is still going when its workers have started; written once for both signals."""
    source = tmp_path_factory.mktemp("hangup") / "src"
    image_factory.write_image_folder(source, {"train": 400}, classes=("a", "b"), min_side=200, max_side=400,
                                     kinds=("jpeg",))
    return source


@pytest.mark.parametrize("number, status", [(signal.SIGHUP, 129), (signal.SIGTERM, 143)])
def test_a_hangup_or_terminate_stops_the_run_and_leaves_no_temporary_folders(source, tmp_path, number, status):
    output, temporary = tmp_path / "out", tmp_path / "tmp"
    temporary.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "shardprep.cli", "preprocess", str(source), str(output),
                                "--shorter-side", "160", "--", "--direct_num_workers=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "TMPDIR": str(temporary)}, preexec_fn=_hangup_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline and not (
                stopping.worker_processes(process.pid) and list(temporary.glob("shardprep-progress-*"))):
            time.sleep(0.02)
        process.send_signal(number)
        text = process.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == status, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert sorted(path.name for path in temporary.iterdir()) == []


def test_a_hangup_ignored_by_nohup_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stopping.sigterm_stops():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
