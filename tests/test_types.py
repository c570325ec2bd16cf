"""mypy over the package, at the level pyproject.toml's [tool.mypy] sets, is clean; and type checkers resolve
``shardprep.<layer>`` to the top-level folders (shardprep/preprocess, shardprep/pipelines and shardprep/train are
links to them), public faces included, instead of reporting the layers' modules as not found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("preprocess", "pipelines", "train")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One cache for this file's runs (never the checkout's): the first run checks everything, later ones reuse it."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir), "--no-error-summary", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if ": error:" in line]


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_is_linked_under_its_installed_name(layer):
    link = REPO / "shardprep" / layer
    assert link.is_symlink() and os.readlink(link) == f"../{layer}"
    assert (link / "__init__.py").samefile(REPO / layer / "__init__.py")


def test_the_package_is_marked_typed():
    assert (REPO / "shardprep" / "py.typed").is_file()


def test_mypy_over_the_package_is_clean(cache_dir):
    done = mypy(cache_dir)  # the packages and the level: pyproject.toml
    assert done.returncode == 0 and not errors(done), done.stdout[-5000:] + done.stderr[-2000:]
    # Every relaxed module still exists (a renamed or removed one must leave the list, not linger in it).
    assert "unused section" not in done.stdout, done.stdout[-3000:]


def test_mypy_resolves_the_layers_and_the_public_faces(cache_dir, tmp_path):
    """A user's file importing the package: its names have their real types (before the links, mypy reported
    ``shardprep.train.data.reader`` as not found and every name as Any)."""
    snippet = tmp_path / "uses_shardprep.py"
    snippet.write_text("from shardprep.train import NumpyReader\n"
                       "from shardprep.train.data.reader import make_dataset\n"
                       "from shardprep.preprocess import RejectError\n"
                       "from shardprep.pipelines.validate_job.options import ValidateOptions\n"
                       "reveal_type(NumpyReader)\nreveal_type(make_dataset)\nreveal_type(RejectError)\n"
                       "ValidateOptions('data', samples_per_class='6')\n", encoding="utf-8")
    done = mypy(cache_dir, str(snippet))
    revealed = [line.split("Revealed type is ", 1)[1] for line in done.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3, done.stdout
    assert revealed[0].endswith('-> shardprep.train.data.numpy_reader.NumpyReader"')
    assert revealed[1].startswith('"def (data_dir: str, split: str, batch_size: int')
    assert revealed[2].endswith('-> shardprep.preprocess.image.image_ops.RejectError"')
    # A wrong argument is found, and nothing else: the options are typed, not Any.
    assert [line.split(": error: ", 1)[1] for line in errors(done)] == [
        'Argument "samples_per_class" to "ValidateOptions" has incompatible type "str"; expected "int"  [arg-type]']
