"""A finished one-epoch training run (TensorBoard logs, checkpoints), made once per test session (conftest.py offers
the fixtures ``finished_run`` and ``run_copy``), and a copy of it for each test that changes one; ``TINY``, the
options of a tiny run: ``from finished_runs import TINY``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

TINY = ["--epochs", "1", "--batch-size", "16", "--image-size", "16", "--width-multiplier", "0.125", "--seed", "1",
        "--warmup-epochs", "0", "--no-early-stopping"]


@pytest.fixture(scope="session")
def finished_run(colour_dataset, tmp_path_factory):
    """A finished one-epoch run with TensorBoard logs and checkpoints: copy it before changing it."""
    from once_per_session import made_once

    return Path(made_once(tmp_path_factory, "finished", lambda folder: _finish(colour_dataset, folder / "run")))


def _finish(data: str, folder) -> str:
    from shardprep.cli import main

    result = CliRunner().invoke(main, ["train", data, "--output-dir", str(folder), *TINY])
    assert result.exit_code == 0, result.output
    return str(folder)


@pytest.fixture
def run_copy(finished_run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder, symlinks=True)
    return folder
