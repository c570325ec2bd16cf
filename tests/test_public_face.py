"""The packages' public faces: ``shardprep.train`` and ``shardprep.preprocess`` export the names the README uses,
each imported from its module on first use (so ``from shardprep.train import NumpyReader`` loads no TensorFlow);
the README imports from them; and the layers' folders imported by their bare names fail at once, naming the
installed name, instead of loading a second copy of their modules."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardprep.preprocess
import shardprep.train

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("tensorflow", "keras", "apache_beam", "jax", "torch")
LIGHT_IMPORTS = {
    "shardprep.train": ["NumpyReader", "RecordDataset", "EpochSampler", "ReaderState", "DatasetChangedError",
                        "TrainConfig"],
    "shardprep.preprocess": ["PreprocessConfig", "process_image", "ProcessOptions", "RejectError"],
}


def loaded_after(code: str) -> list[str]:
    """The heavy frameworks in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json\n"
                                                 f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}}"
                                                 f" & set({list(HEAVY)!r}))))"],
                          capture_output=True, text=True, timeout=120, cwd=REPO / "tests")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_reader_names_import_no_tensorflow_keras_or_beam():
    code = "\n".join(f"from {package} import {', '.join(names)}" for package, names in LIGHT_IMPORTS.items())
    assert loaded_after(code) == []


def test_importing_the_package_alone_imports_none_of_its_modules():
    assert loaded_after("import shardprep.train, shardprep.preprocess") == []


@pytest.mark.parametrize("package", [shardprep.train, shardprep.preprocess], ids=lambda p: p.__name__)
def test_every_public_name_is_its_modules_own(package):
    for name in package.__all__:
        module = importlib.import_module(f"{package.__name__}.{package._EXPORTS[name]}")
        assert getattr(package, name) is getattr(module, name), name
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import():
    with pytest.raises(AttributeError, match="module 'shardprep.train' has no attribute 'NoSuchReader'"):
        shardprep.train.NoSuchReader  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'NoSuchReader'"):
        exec("from shardprep.train import NoSuchReader", {})
    from shardprep.train.data import record_order  # a module, not an exported name

    assert record_order.__name__ == "shardprep.train.data.record_order"


def test_the_readme_examples_import_only_public_names():
    blocks = [block for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)]
    imported = [(node.module, alias.name) for block in blocks for node in ast.walk(ast.parse(block))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardprep")
                for alias in node.names]
    assert imported, "the README's examples import nothing from shardprep"
    faces = {"shardprep.train": shardprep.train, "shardprep.preprocess": shardprep.preprocess}
    for module, name in imported:
        assert module in faces, f"the README imports {name} from {module}, not from a public face"
        assert name in faces[module].__all__, f"{name} is not exported by {module}"


@pytest.mark.parametrize("layer, module", [("preprocess", "image_ops"), ("pipelines", "validate_options"),
                                           ("train", "record_order")])
def test_a_layer_imported_by_its_folder_name_fails_naming_the_installed_name(layer, module):
    """From the repository's root the folders are importable as top-level names; that would load a second copy of
    every module (``preprocess.image_ops.RejectError`` is not ``shardprep.preprocess.image.image_ops.RejectError``)."""
    done = subprocess.run([sys.executable, "-c", f"import {layer}.{module}"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: {layer}/ is installed as shardprep.{layer}: import shardprep.{layer}, not "
                    f"{layer} (a second copy of its modules, with classes of their own)")
