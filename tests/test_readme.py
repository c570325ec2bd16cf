"""The README's Python examples run as written, on a small dataset made by the real preprocess job.

Each example is taken from README.md as it is; only the sizes that make it an ImageNet-scale run are scaled down
(the data path, batch size, image size, epochs, the output file), and each of those replacements must find its text,
so an edit to the README that this test no longer covers fails here instead of going stale.
"""

from __future__ import annotations

import re
import runpy
import warnings
from pathlib import Path

import image_factory
import pytest
from click.testing import CliRunner

from shardprep.cli import main as cli

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def block_with(text: str) -> str:
    (block,) = [b for b in python_blocks() if text in b]
    return block


def scaled(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the README example no longer has {old!r}: update tests/test_readme.py"
        code = code.replace(old, new)
    return code


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    image_factory.write_image_folder(root / "images", {"train": 24, "validation": 8}, classes=("red", "blue"))
    result = CliRunner().invoke(cli, ["preprocess", str(root / "images"), str(root / "shards"), "--shorter-side",
                                      "16", "--quiet", "--", "--direct_running_mode=in_memory"])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def keras_example(dataset) -> Path:
    """Runs the 'your own Keras code' example in the dataset's folder; returns the model it saved."""
    code = scaled(block_with("model.fit("), {
        '"imagenette-shards", 64, 224': f'{str(dataset / "shards")!r}, 4, 12',
        "epochs=5": "epochs=1",
        "resnet18_layers(x, manifest[\"num_classes\"])": "resnet18_layers(x, manifest[\"num_classes\"], 0.125)",
        '"my-model.keras"': repr(str(dataset / "my-model.keras")),
    })
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runpy.run_path(_write(dataset / "keras_example.py", code), run_name="__main__")
    # The one-pass validation dataset declares its length, so Keras reads it to its end without a warning.
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    return dataset / "my-model.keras"


def test_the_keras_example_trains_and_saves_a_model(keras_example):
    assert keras_example.stat().st_size > 0


def test_the_inference_example_prints_class_names_for_a_path_and_bytes(dataset, keras_example, capsys):
    photos = sorted((dataset / "images" / "validation").rglob("*.png"))[:2]
    assert len(photos) == 2
    code = scaled(block_with("predict_images("), {
        '"cat.jpg"': repr(str(photos[0])),
        '"dog.png"': repr(str(photos[1])),
        '"imagenette-run/model.keras"': repr(str(keras_example)),
        '"imagenette-shards"': repr(str(dataset / "shards")),
        "top_k=3": "top_k=2",
    })
    runpy.run_path(_write(dataset / "inference_example.py", code), run_name="__main__")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith((str(photos[0]), "<bytes"))]
    assert len(lines) == 2
    for line in lines:
        rest = line.split(">", 1)[1] if line.startswith("<bytes") else line[len(str(photos[0])):]
        assert rest.split()[0] in ("blue", "red")  # a class name from the manifest, not an index


def test_the_framework_free_reader_example_reads_an_epoch_and_the_validation_pass(dataset, capsys):
    code = scaled(block_with("NumpyReader("), {'"imagenette-shards", 64': f'{str(dataset / "shards")!r}, 4'})
    runpy.run_path(_write(dataset / "numpy_reader_example.py", code), run_name="__main__")
    # 24 training images: 6 batches an epoch, so 7 batches read end in epoch 1 at batch 1.
    assert capsys.readouterr().out.splitlines()[-1] == "epoch 1, batch 1; validation: 8 images"


def _write(path: Path, code: str) -> str:
    path.write_text(code, encoding="utf-8")
    return str(path)
