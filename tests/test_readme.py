"""The Python examples of the README and docs/ run as written, on a small dataset made by the real preprocess job.

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
from source_routes import folder_files, write_archive, write_hub_parquet

from shardprep.cli import main as cli

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = sorted((README.parent / "docs").glob("*.md"))


def python_blocks() -> list[str]:
    """Every Python example of the README and docs/."""
    return [block for path in [README, *DOCS]
            for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)]


def block_with(text: str) -> str:
    (block,) = [b for b in python_blocks() if text in b]
    return block


def scaled(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the README example no longer has {old!r}: update tests/test_readme.py"
        code = code.replace(old, new)
    return code


# Every documented route a user brings a dataset by, each with its own name for the held-out split: the examples
# ask for "validation" and must find it on all of them.
ROUTES = ("folder with val", "folder with validation", ".tgz", "folder of archives", "parquet")


def _source(root: Path, route: str) -> str:
    """The route's SOURCE for 24 train and 8 held-out images of two classes, written under ``root``."""
    held_out = "validation" if route in ("folder with validation", "parquet") else "val"
    image_factory.write_image_folder(root / "images", {"train": 24, held_out: 8}, classes=("red", "blue"))
    files = folder_files(root / "images")
    if route.startswith("folder with"):
        return str(root / "images")
    if route == ".tgz":  # as fast.ai ships Imagenette: one top folder holding the splits
        write_archive(str(root / "photos.tgz"), {f"photos/{name}": data for name, data in files.items()})
        return str(root / "photos.tgz")
    if route == "folder of archives":  # as image-net.org's download folder: an archive per split
        (root / "download").mkdir()
        for split in ("train", "val"):
            write_archive(str(root / "download" / f"{split}.zip"),
                          {name.split("/", 1)[1]: data for name, data in files.items() if name.startswith(split + "/")})
        return str(root / "download")
    write_hub_parquet(root / "hub", files, ["blue", "red"])
    return f"parquet:{root / 'hub' / 'data' / '*.parquet'}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(route)``: the folder holding the route's source and its shards, preprocessed once per module."""
    folders: dict[str, Path] = {}

    def build(route: str) -> Path:
        if route not in folders:
            root = tmp_path_factory.mktemp("readme")
            result = CliRunner().invoke(cli, ["preprocess", _source(root, route), str(root / "shards"),
                                              "--shorter-side", "16", "--quiet", "--", "--direct_running_mode=in_memory"])
            assert result.exit_code == 0, result.output
            folders[route] = root
        return folders[route]

    return build


# The example's lookup of "validation" is the one step a route changes (the split stored under that name, or under
# another name of the role, "val"): every route runs the example's lines up to the model below. What follows them,
# the training, runs the same code on any route, so it runs once (a run costs seconds).
TRAINED = "folder of archives"


def keras_code(dataset: Path) -> str:
    return scaled(block_with("model.fit("), {
        '"imagenette-shards", 64, 224': f'{str(dataset / "shards")!r}, 4, 12',
        "epochs=5": "epochs=1",
        "resnet18_layers(x, manifest.num_classes)": "resnet18_layers(x, manifest.num_classes, 0.125)",
        '"my-model.keras"': repr(str(dataset / "my-model.keras")),
    })


@pytest.fixture(scope="module")
def keras_example(built) -> Path:
    """Runs the 'your own Keras code' example in the dataset's folder; returns the model it saved."""
    dataset = built(TRAINED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runpy.run_path(_write(dataset / "keras_example.py", keras_code(dataset)), run_name="__main__")
    # The one-pass validation dataset declares its length, so Keras reads it to its end without a warning; and fit
    # is not asked to shuffle a tf.data dataset (the reader shuffles), which Keras would warn it ignores.
    assert not [w for w in caught if "ran out of data" in str(w.message) or "shuffle" in str(w.message)]
    return dataset / "my-model.keras"


def test_every_python_example_imports_shardprep_before_tensorflow_or_keras():
    """TensorFlow's C++ log lines (absl, oneDNN, CUDA) come at its import: an example that imports keras or
    tensorflow first prints them before ``shardprep.train`` can keep them off (the README says it does)."""
    for block in python_blocks():
        imports = [line.split()[1].split(".")[0] for line in block.splitlines() if line.startswith(("import ", "from "))]
        heavy = [i for i, name in enumerate(imports) if name in ("keras", "tensorflow")]
        if heavy:
            assert "shardprep" in imports[:heavy[0]], block


def test_the_keras_example_trains_and_saves_a_model(keras_example):
    assert keras_example.stat().st_size > 0


@pytest.mark.parametrize("route", ROUTES)
def test_the_keras_example_reads_the_training_and_the_validation_split_on_every_route(built, route):
    """The example's lines up to the model, as written, on each route: "validation" is found by its role."""
    dataset = built(route)
    code = keras_code(dataset)
    found = runpy.run_path(_write(dataset / "keras_data.py", code[:code.index("images = keras.Input")]),
                           run_name="__main__")
    assert found["split_size"](found["manifest"], "train") == 24
    assert sum(int(labels.shape[0]) for _, labels in found["val"]) == 8
    assert int(found["val"].cardinality()) == 2  # declared, so Keras reads the one pass to its end without a warning


@pytest.mark.parametrize("route", ROUTES)
def test_the_inference_example_prints_class_names_for_a_path_and_bytes(built, route, keras_example, capsys):
    dataset = built(route)
    photos = sorted((dataset / "images").rglob("*.png"))[:2]
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


@pytest.mark.parametrize("route", ROUTES)
def test_the_framework_free_reader_example_reads_an_epoch_and_the_validation_pass(built, route, capsys):
    dataset = built(route)
    code = scaled(block_with("NumpyReader("), {'"imagenette-shards", 64': f'{str(dataset / "shards")!r}, 4'})
    runpy.run_path(_write(dataset / "numpy_reader_example.py", code), run_name="__main__")
    # 24 training images: 6 batches an epoch, so 7 batches read end in epoch 1 at batch 1.
    assert capsys.readouterr().out.splitlines()[-1] == "epoch 1, batch 1; validation: 8 images"


def _write(path: Path, code: str) -> str:
    path.write_text(code, encoding="utf-8")
    return str(path)


# --- the install, the first hour, the extras ------------------------------------------------------------------------

REPO = README.parent


def section(title: str) -> str:
    """The README's text from the heading ``## title`` (any level) to the next heading."""
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", README.read_text(encoding="utf-8"),
                      flags=re.S | re.M)
    assert match, f"the README has no section {title!r}: update tests/test_readme.py"
    return match.group(1)


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_the_two_commands_install_the_default_then_the_test_extra_as_ci_does():
    from extras_blocker import setup_arguments

    first, second = bash_blocks(section("Two commands for a fresh machine"))
    extras = setup_arguments()["extras_require"]
    # -qqq: pip's hundreds of lines, and its warnings and the build backend's (wider than a terminal), would bury the
    # summary the first command ends with; the errors that stop it still show
    assert ".venv/bin/pip install -qqq -e . &&" in first and "shardprep preprocess demo/images demo/shards" in first
    assert ".venv/bin/pip install --quiet -e '.[test]' &&" in second and "pytest" in second
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install --quiet -e '.[test]'" in ci
    assert "pytest -q -p no:cacheprovider -n logical --dist worksteal tests" in ci
    # one test process per core (pytest-xdist); a process that runs out of tests takes half of another's queue, so
    # no long file is left to run alone at the end (pytest-xdist 3.2 added worksteal)
    assert "-m pytest -q -n logical --dist worksteal tests" in second and "pytest-xdist>=3.5" in extras["test"]
    assert set(extras["gcp"]) <= set(extras["test"])  # the tests run gs:// paths (tests/test_gcs.py)


def test_bare_shardprep_commands_come_after_the_activation_line():
    text = README.read_text(encoding="utf-8")
    activation = re.search(r"^\. \.venv/bin/activate$", text, flags=re.M)
    first_bare = re.search(r"^shardprep \w", text, flags=re.M)
    assert activation and first_bare and activation.start() < first_bare.start()


def test_every_extra_is_documented_and_every_documented_extra_exists():
    from extras_blocker import setup_arguments

    text = README.read_text(encoding="utf-8")
    documented = {extra for group in re.findall(r"(?:\.|shardprep)\[([a-z,]+)\]", text) for extra in group.split(",")}
    assert documented == set(setup_arguments()["extras_require"])


def test_the_missing_gcp_extra_error_is_quoted_as_the_cli_prints_it(monkeypatch):
    from shardprep.preprocess.checks import install_extras

    monkeypatch.setattr(install_extras, "gcp_installed", lambda: False)
    with pytest.raises(install_extras.MissingExtraError) as error:
        install_extras.check_arguments(["gs://BUCKET/imagenet"])
    assert str(error.value) in README.read_text(encoding="utf-8")


def test_the_first_training_run_is_sized_for_a_laptop_cpu():
    """Small stored images, crop, epochs; a batch size that leaves none of the demo's train images out; a photo the
    demo has."""
    import inspect

    from shardprep import demo
    from shardprep.commands.preprocess import command as preprocess
    from shardprep.commands.train import command as train

    lines = [line for block in bash_blocks(section("Your first day with your own data")) for line in block.splitlines()]
    (prepared,) = [line for line in lines if line.startswith("shardprep preprocess demo/images ")]
    (trained,) = [line for line in lines if line.startswith("shardprep train demo/")]
    (predicted,) = [line for line in lines if line.startswith("shardprep predict demo/")]
    stored = preprocess.make_context("preprocess", prepared.split()[2:]).params
    options = train.make_context("train", trained.split()[2:]).params
    assert trained.split()[2] == stored["output"] == predicted.split()[3]
    assert options["image_size"] <= stored["shorter_side"] <= 128
    assert options["epochs"] <= 10 and options["warmup_epochs"] < options["epochs"]
    defaults = inspect.signature(demo.write_demo_dataset).parameters
    train_images = defaults["train_per_class"].default * len(demo.CLASSES)  # its broken files are rejected
    assert train_images % options["batch_size"] == 0
    assert predicted.split()[2] == f"{options['output_dir']}/model.keras"
    photo = predicted.split()[4]
    assert photo.startswith("demo/images/") and demo.is_demo_file(photo[len("demo/images/"):])
    split, class_name, name = photo[len("demo/images/"):].split("/")
    index = int(name.split("_")[1].split(".")[0])
    kind = demo.KINDS[(index + demo.CLASSES.index(class_name)) % len(demo.KINDS)]
    assert name == f"{class_name}_{index:03d}{demo._EXTENSIONS[kind]}"  # a photo write_demo_dataset writes
