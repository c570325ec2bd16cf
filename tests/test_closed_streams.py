"""A command started with its stderr closed (``2>&-``, a cron line, a daemon's child) runs as it would with one:
the same exit status, its summary or report on stdout (it died at its first progress line, status 1, no word)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from small_sources import two_class_photos as source  # noqa: F401 - a fixture

IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


def run_without_stderr(*args) -> subprocess.CompletedProcess:
    """``shardprep ARGS 2>&-``: file descriptor 2 closed when the command starts (no --quiet: progress shown)."""
    return subprocess.run([sys.executable, "-m", "shardprep.cli", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, timeout=300, preexec_fn=lambda: os.close(2))


def test_preprocess_and_validate_with_stderr_closed_exit_as_they_would_with_their_summary(source, tmp_path):
    made = run_without_stderr("preprocess", source, tmp_path / "out", "--shorter-side", "8", "--num-shards", "1",
                              *IN_PROCESS)
    assert made.returncode == 0, made.stdout
    assert f"manifest {tmp_path / 'out' / 'manifest.json'}" in made.stdout
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]["train"]["num_examples"] > 0

    checked = run_without_stderr("validate", tmp_path / "out", "--json", tmp_path / "report.json", *IN_PROCESS)
    assert checked.returncode == 0, checked.stdout
    assert "OK: every check passed" in checked.stdout
    assert json.loads((tmp_path / "report.json").read_text())["ok"] is True
