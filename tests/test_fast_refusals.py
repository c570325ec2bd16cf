"""A wrong path or a wrong kind of input is refused before Beam or TensorFlow is imported (seconds, not tens of
seconds under load): validate on a missing path, a file or an image folder; preprocess on a SOURCE that is not
there. Run in a fresh interpreter, since this one has Beam imported already."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def refused_without_heavy_imports(*argv: str) -> tuple[int, str, list[str]]:
    """(exit status, the error line, the heavy modules imported) of the CLI run in a fresh interpreter."""
    script = textwrap.dedent(f"""
        import sys
        from shardprep.cli import main
        try:
            main({list(argv)!r})
        except SystemExit as e:
            code = e.code
        print("LOADED", sorted(name for name in ("apache_beam", "tensorflow") if name in sys.modules))
        print("STATUS", code)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))
    lines = done.stdout.strip().splitlines()
    loaded = eval(lines[-2].removeprefix("LOADED "))  # noqa: S307 - our own print of a list of names
    return int(lines[-1].removeprefix("STATUS ")), done.stderr.strip(), loaded


@pytest.fixture
def image_folder(tmp_path):
    os.makedirs(tmp_path / "photos" / "train" / "cat")
    Image.new("RGB", (300, 300)).save(tmp_path / "photos" / "train" / "cat" / "a.jpg")
    return tmp_path / "photos"


def test_validate_refuses_what_is_no_dataset_before_importing_beam(tmp_path, image_folder):
    (tmp_path / "file.txt").write_text("x")
    for data, said in ((tmp_path / "nope", "does not exist"), (tmp_path / "file.txt", "not a prepared dataset"),
                       (image_folder, "is an image folder (e.g. train/cat/a.jpg), not a prepared dataset")):
        status, error, loaded = refused_without_heavy_imports("validate", str(data))
        assert status == 1 and error.startswith("Error: ") and said in error and len(error.splitlines()) == 1, error
        assert loaded == [], (data, loaded)


def test_preprocess_refuses_a_source_that_is_not_there_before_importing_beam(tmp_path):
    status, error, loaded = refused_without_heavy_imports("preprocess", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert status == 2 and error == f"Error: SOURCE {tmp_path / 'nope'} does not exist", error
    assert loaded == [] and not (tmp_path / "out").exists()
