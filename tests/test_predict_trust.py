"""``predict`` answers only for the dataset the model was trained on, reports every photo (bad ones one line each),
and names ImageNet classes readably."""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardprep.preprocess.sources import wordnet_names
from train_helpers import predict_entries, random_images, write_colour_dataset, write_dataset

IMAGE_SIZE = 16


def png(seed: int, shape=(30, 40, 3)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def model_for(data_dir, path):
    """An (untrained) inference model for ``data_dir``, saved at ``path`` as shardprep train saves one."""
    import keras

    from shardprep.train.model.keras_model import build_model, save_inference_model
    from shardprep.train.data.reader import load_manifest

    manifest = load_manifest(str(data_dir))
    keras.utils.set_random_seed(0)
    model = build_model(len(manifest.classes), IMAGE_SIZE, manifest.mean_rgb, manifest.std_rgb,
                        width_multiplier=0.125, classes=manifest.classes)
    save_inference_model(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(dataset, its model.keras, another dataset of the same two classes and size, its folder)."""
    root = tmp_path_factory.mktemp("predict")
    data = write_colour_dataset(root / "colours")
    other = root / "other"
    write_dataset(other, {"train": random_images(8, 20, 20, seed=4), "validation": random_images(4, 20, 20, seed=5)},
                  classes=["red", "blue"])
    return data, model_for(data, root / "model.keras"), str(other), root


def invoke(*args):
    from shardprep.cli import main

    return CliRunner().invoke(main, ["predict", *map(str, args)])


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error: ")]


# ---- the dataset must be the model's -------------------------------------------------------------------------------

def test_the_same_images_with_the_classes_in_another_order_are_refused_by_name(trained, tmp_path):
    # preprocess --classes with another order (or names swapped in manifest.json): the same pixels and statistics,
    # but every label another class's: the model's name carries a digest of the class list it was trained on.
    import json
    import shutil

    data, model, _, root = trained
    reordered = shutil.copytree(data, tmp_path / "reordered")
    manifest = json.loads((reordered / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"][::-1]
    (reordered / "manifest.json").write_text(json.dumps(manifest))
    photo = root / "photo.png"
    photo.write_bytes(png(1))
    result = invoke(model, reordered, photo)
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = error_lines(result)
    assert "trained on other classes, or the same in another order" in line and "give the dataset" in line
    assert invoke(model, data, photo).exit_code == 0


def test_another_dataset_of_the_same_class_count_is_refused_by_its_mean_and_std(trained):
    from shardprep.train.model.predict import predict_images

    data, model, other, root = trained
    photo = root / "photo.png"
    photo.write_bytes(png(1))
    with pytest.raises(ValueError, match=r"was not trained on .*other.*: the model normalizes with mean RGB "):
        predict_images(model, other, [str(photo)])
    result = invoke(model, other, photo)
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = error_lines(result)
    assert "mean RGB" in line and "std RGB" in line and "give the dataset the model was trained on" in line
    assert str(photo) + ":" not in result.output  # no answer at all
    assert predict_images(model, data, [str(photo)])[0].class_name in ("red", "blue")


def test_a_dataset_stored_smaller_than_the_models_crop_is_refused(trained, tmp_path):
    from shardprep.train.model.predict import predict_images
    from shardprep.train.data.reader import load_manifest

    data, model, _, _ = trained
    manifest = {**load_manifest(data).to_json(), "shorter_side": 12, "image_height": 12, "image_width": 12}
    with pytest.raises(ValueError, match=r"stores 12x12 images, smaller than the model's 16-pixel crop"):
        predict_images(model, manifest, [png(2)])


def test_a_class_count_mismatch_is_refused_before_any_photo_is_read(trained):
    from shardprep.train.model.predict import predict_images
    from shardprep.train.data.reader import load_manifest

    data, model, _, _ = trained
    manifest = {**load_manifest(data).to_json(), "classes": ["a", "b", "c"], "num_classes": 3}
    with pytest.raises(ValueError, match="the model has 2 outputs but the manifest lists 3 classes"):
        predict_images(model, manifest, [b"not an image"])


def test_a_model_file_that_is_no_keras_archive_is_one_error_line(trained, tmp_path):
    data, _, _, _ = trained
    junk = tmp_path / "model.keras"
    junk.write_bytes(os.urandom(3000))
    result = invoke(junk, data, tmp_path / "photo.png")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert error_lines(result) == [f"Error: MODEL {junk} is not a .keras model file (not a zip archive: damaged, "
                                   "or another kind of file): give the model.keras shardprep train wrote"]


def test_a_model_file_whose_config_unpacks_to_gigabytes_is_refused_unread(trained, tmp_path):
    import zipfile

    data, model, _, _ = trained
    bomb = tmp_path / "bomb.keras"
    with zipfile.ZipFile(model) as real, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as packed:
        for member in real.namelist():  # config.json: 200 MiB of spaces (~200 KB packed) before the real one
            packed.writestr(member, (b" " * (200 << 20) if member == "config.json" else b"") + real.read(member))
    result = invoke(bomb, data, tmp_path / "photo.png")
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = error_lines(result)
    assert f"MODEL {bomb}: its config.json unpacks to 200 MiB" in line and "give the model.keras" in line


# ---- every photo reported --------------------------------------------------------------------------------------------

def test_every_photo_gets_a_line_and_bad_ones_do_not_stop_the_good(trained, tmp_path):
    data, model, _, _ = trained
    good, later = tmp_path / "good.png", tmp_path / "later.png"
    good.write_bytes(png(3))
    later.write_bytes(png(4))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image at all")
    folder = tmp_path / "folder.jpg"
    folder.mkdir()
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    missing = tmp_path / "missing.jpg"
    outcome = {}

    def run():
        outcome["result"] = invoke(model, data, good, broken, folder, fifo, missing, later, "--top-k", "2")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "predict blocked on a FIFO"
    result = outcome["result"]

    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = predict_entries(result.output)
    assert result.output.splitlines()[:-1] == lines  # in a pipe one line per photo, for scripts: never wrapped
    assert [line.split(": ", 1)[0] for line in lines] == list(map(str, [good, broken, folder, fifo, missing, later]))
    for line in (lines[0], lines[-1]):
        answers = line.split(": ", 1)[1].split(", ")
        assert len(answers) == 2 and {answer.rsplit(" ", 1)[0] for answer in answers} == {"red", "blue"}
        assert all(0.0 <= float(answer.rsplit(" ", 1)[1]) <= 1.0 for answer in answers)
    assert "not classified: not usable as an image" in lines[1]
    assert "not classified: is a folder" in lines[2]
    assert "not classified: is a FIFO (named pipe), not a regular file" in lines[3]
    assert "not classified: does not exist" in lines[4]
    assert error_lines(result) == ["Error: 4 of 6 photos could not be classified (each is named above)"]


def test_predict_wraps_its_lines_to_a_terminal_only(trained, tmp_path, monkeypatch):
    import shardprep.preprocess.checks.text as text

    data, model, _, _ = trained
    photo = tmp_path / ("a-long-folder-name-" * 3) / "photo with spaces in its name.png"
    photo.parent.mkdir()
    photo.write_bytes(png(3))
    piped = invoke(model, data, photo, "--top-k", "2")
    assert piped.exit_code == 0 and len(piped.output.splitlines()) == 1, piped.output
    monkeypatch.setattr(text, "terminal_columns", lambda stream: 40)  # stdout is a 40-column terminal
    monkeypatch.delenv("COLUMNS", raising=False)
    shown = invoke(model, data, photo, "--top-k", "2")
    assert shown.exit_code == 0
    lines = shown.output.splitlines()
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert all(len(line) <= 40 for line in lines if " " in line.strip())  # only an unbreakable word is wider
    assert predict_entries(shown.output) == piped.output.splitlines()


def test_predict_images_reports_bad_photos_when_asked_and_raises_by_default(trained):
    from shardprep.train.model.predict import PhotoFailure, Prediction, predict_images

    from shardprep.train.model.keras_model import load_model

    data, path, _, _ = trained
    model = load_model(path)  # loaded once for the three calls (a path is loaded by each)
    results = predict_images(model, data, [png(5), b"junk", png(6)], errors="report")
    assert [type(result) for result in results] == [Prediction, PhotoFailure, Prediction]
    assert results[1].source == "<bytes #1>" and "not usable as an image" in results[1].message
    with pytest.raises(ValueError, match=r"<bytes #1>: not usable as an image"):
        predict_images(model, data, [png(5), b"junk"])
    with pytest.raises(ValueError, match="errors must be 'raise' or 'report'"):
        predict_images(model, data, [png(5)], errors="ignore")


# ---- readable ImageNet names -----------------------------------------------------------------------------------------

def test_wordnet_ids_are_shown_with_their_readable_names(trained, tmp_path):
    """A dataset whose classes are named by WordNet ids, as imagenette's are, and a model trained on it (a model
    refuses data it was not trained on, other class names included)."""
    import json
    import shutil

    colours, model, _, _ = trained
    data = tmp_path / "imagenette"
    shutil.copytree(colours, data)
    manifest = json.loads((data / "manifest.json").read_text())
    renamed = dict(zip(manifest["classes"], ["n01440764", "n03445777"]))
    manifest["classes"] = list(renamed.values())
    for split in manifest["splits"].values():
        split["class_counts"] = {renamed[name]: count for name, count in split["class_counts"].items()}
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert invoke(model, data, tmp_path).exit_code == 1  # the colours' model: trained on other class names
    model = model_for(data, tmp_path / "model.keras")
    photo = tmp_path / "photo.png"
    photo.write_bytes(png(9))
    result = invoke(model, data, photo, "--top-k", "2")
    assert result.exit_code == 0, result.output
    [line] = predict_entries(result.output)
    answers = line.split(": ", 1)[1].split(", ")
    assert {answer.rsplit(" ", 1)[0] for answer in answers} == {"tench (n01440764)", "golf ball (n03445777)"}
    from shardprep.train.model.predict import predict_images

    prediction = predict_images(model, str(data), [str(photo)])[0]
    assert prediction.class_name in ("n01440764", "n03445777")
    assert prediction.display_name == wordnet_names.display_name(prediction.class_name)


def test_the_wordnet_table_is_imagenet_1k_as_tfds_names_it():
    import importlib.util

    import tensorflow_datasets

    root = os.path.dirname(tensorflow_datasets.__file__)
    wnids = open(os.path.join(root, "datasets", "imagenet2012", "labels.txt")).read().split()
    spec = importlib.util.spec_from_file_location("siscore_labels", os.path.join(root, "datasets", "siscore",
                                                                                 "labels.py"))
    labels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(labels)
    assert wordnet_names.table() == dict(zip(wnids, labels.IMAGENET_LABELS_LIST))
    assert len(wordnet_names.table()) == 1000
    imagenette = {"n01440764": "tench", "n02102040": "English springer", "n02979186": "cassette player",
                  "n03000684": "chain saw", "n03028079": "church", "n03394916": "French horn",
                  "n03417042": "garbage truck", "n03425413": "gas pump", "n03445777": "golf ball",
                  "n03888257": "parachute"}
    for wnid, name in imagenette.items():
        assert wordnet_names.display_name(wnid) == f"{name} ({wnid})"
    assert wordnet_names.display_name("red") == "red" and wordnet_names.display_name("n99999999") == "n99999999"


def test_a_photo_name_with_control_characters_is_one_escaped_entry(trained, tmp_path):
    """A newline would split an entry, ESC sequences would reach the terminal: they are escaped as train's and
    validate's names are, one entry a photo, each at column 0."""
    data, model, _, _ = trained
    named = tmp_path / "evil\n\x1b[31mred.png"
    named.write_bytes(png(3))
    missing = tmp_path / "gone\x1b]0;x\x07.png"
    bidi = tmp_path / "gpj.\u202eevil.png"  # shown as "evil.png.jpg" by a terminal that applies it
    bidi.write_bytes(png(4))
    result = invoke(model, data, named, missing, bidi)
    assert result.exit_code == 1 and "\x1b" not in result.output and "\x07" not in result.output
    entries = predict_entries(result.output)
    assert len(entries) == 3 and "\u202e" not in result.output, result.output
    assert entries[0].startswith(f"{tmp_path}/evil\\n\\x1b[31mred.png: ")
    assert entries[1].startswith(f"{tmp_path}/gone\\x1b]0;x\\x07.png: not classified: ")
    assert entries[2].startswith(f"{tmp_path}/gpj.\\u202eevil.png: ")
