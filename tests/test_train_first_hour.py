"""A new user's first hour with ``shardprep train`` (issue #16): --output-dir refusals and --overwrite, errors that
name the flag and the sizes, progress within an epoch, and inference on new photos with predict_images."""

import dataclasses
import io
import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardprep.cli import main
from shardprep.preprocess.format.dataset import load_manifest
from shardprep.train.run import preflight
from train_helpers import predict_entries, random_images, write_dataset


def _error_lines(result):
    return [line for line in result.output.splitlines() if line.startswith("Error: ")]


# --- --output-dir: refused when not empty, --overwrite deletes only a run's files ----------------------------------


EVENTS = "logs/train/events.out.tfevents.1700000000.host.1.0.v2"


def _previous_run(folder):
    """The files of an earlier run, listed in its run record as `shardprep train` lists them."""
    from shardprep.train.run import run_files

    run_files.claim(str(folder), resume=False)
    os.makedirs(folder / "checkpoints", exist_ok=True)
    os.makedirs(folder / "logs" / "train")
    for name in ("history.json", "summary.json", "model.keras", "checkpoints/last.keras", EVENTS):
        (folder / name).write_text("old")
    run_files.record_new_files(str(folder))


def test_train_refuses_a_non_empty_output_dir(colour_dataset, tmp_path):
    _previous_run(tmp_path / "run")
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--image-size", "16"])
    assert result.exit_code == 1
    assert _error_lines(result) == [_error_lines(result)[0]]
    line = _error_lines(result)[0]
    assert "is not empty" in line and "--resume" in line and "--overwrite" in line and "history.json" in line
    assert (tmp_path / "run" / "model.keras").read_text() == "old"
    # An empty folder and a missing one are fine; --resume needs a whole checkpoint (state.json is missing here).
    os.makedirs(tmp_path / "empty")
    for folder in (tmp_path / "empty", tmp_path / "missing"):
        preflight.check(colour_dataset, "train", "validation", str(folder))
    with pytest.raises(preflight.PreflightError, match="state.json is missing beside .*last.keras"):
        preflight.check(colour_dataset, "train", "validation", str(tmp_path / "run"), resume=True)


def test_a_split_whose_count_is_not_its_shards_is_refused_before_training(colour_dataset, tmp_path):
    # validate calls it manifest_inconsistent; train planned its epochs by the split's count (exit 0, wrong steps).
    import json
    import shutil

    data = shutil.copytree(colour_dataset, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["num_examples"] -= 1
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(preflight.PreflightError, match=r"split 'train' .* but its shards hold .*shardprep validate"):
        preflight.check(str(data), "train", "validation", str(tmp_path / "run"))


def test_overwrite_deletes_only_what_a_run_writes(colour_dataset, tmp_path):
    run = tmp_path / "run"
    _previous_run(run)
    preflight.check(colour_dataset, "train", "validation", str(run), overwrite=True)
    assert preflight.clear_run(str(run)) == ["checkpoints/last.keras", "history.json", EVENTS, "model.keras",
                                             "summary.json"]
    assert os.listdir(run) == [".shardprep-train.json"]  # the record: the next run rewrites it


def test_overwrite_refuses_a_folder_holding_other_files_and_names_them(colour_dataset, tmp_path):
    run = tmp_path / "run"
    _previous_run(run)
    (run / "notes.txt").write_text("mine")
    os.makedirs(run / "photos")
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(run), "--overwrite",
                                       "--image-size", "16"])
    assert result.exit_code == 1
    line, = _error_lines(result)
    assert "notes.txt" in line and "photos/" in line and "did not write" in line
    assert sorted(os.listdir(run)) == [".shardprep-train.json", "checkpoints", "history.json", "logs", "model.keras",
                                       "notes.txt", "photos", "summary.json"]
    both = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(run), "--overwrite", "--resume"])
    assert both.exit_code == 2 and "pass one" in both.output


# --- errors that name the flag and the sizes -----------------------------------------------------------------------


def test_a_split_typo_names_the_flag_without_stray_quotes(colour_dataset, tmp_path):
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--val-split", "val"])
    line, = _error_lines(result)
    assert line.startswith("Error: --val-split 'val' is not a split of") and '"' not in line
    assert "splits: train, validation" in line


def test_the_training_api_names_the_flag_for_a_split_typo(colour_dataset, tmp_path):
    from shardprep.train.run import loop

    config = loop.TrainConfig(data_dir=colour_dataset, output_dir=str(tmp_path), image_size=16, train_split="trian")
    with pytest.raises(ValueError, match=r"--train-split 'trian' is not a split of .*\(splits: train, validation; "
                                         r"examples: train 64, validation 32\)"):
        loop.train(config, report=lambda message: None)


def test_an_image_size_above_the_stored_size_is_one_line_before_the_run(colour_dataset, tmp_path):
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--image-size", "24"])
    line, = _error_lines(result)
    assert "--image-size 24 is larger than the stored images" in line and "(20x20)" in line
    assert "--image-size 20 or less" in line
    assert not (tmp_path / "run").exists()


def test_a_val_split_and_a_small_crop_are_said_before_the_first_step(tmp_path):
    """A dataset as imagenette2's .tgz makes it (splits train and val), trained with a crop under half the stored
    size: the run says which split it validates on and why, and warns of the patches, saying what to pass."""
    data = tmp_path / "data"
    write_dataset(data, {"train": random_images(16, 20, 20), "val": random_images(8, 20, 20, seed=1)},
                  classes=["a", "b"])
    result = CliRunner().invoke(main, [
        "train", str(data), "--output-dir", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "8",
        "--image-size", "8", "--width-multiplier", "0.125", "--no-tensorboard", "--no-checkpoint"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # lines fitted to the width
    assert ("Validating on split 'val' after each epoch (no split is named 'validation', and 'val' is named like a "
            "validation split).") in text
    assert ("Warning: --image-size 8 trains on random 8x8 patches of the stored 20x20 images (under half their "
            "size); pass --image-size 17 to train on most of each image, or rerun preprocess with --shorter-side 10 "
            "to store images of about that size.") in text


def test_the_augmentation_layer_rejects_a_crop_larger_than_its_input_when_built():
    import keras

    from shardprep.train.model.augment import CropFlipNormalize

    with pytest.raises(ValueError, match=r"CropFlipNormalize\(96\) crops 96x96 windows, but its input images are "
                                         r"72x72"):
        CropFlipNormalize(96, [0.0] * 3, [1.0] * 3)(keras.Input((72, 72, 3), dtype="uint8"))
    # Unknown sizes are left to run time; a large enough input builds.
    CropFlipNormalize(96, [0.0] * 3, [1.0] * 3)(keras.Input((None, None, 3), dtype="uint8"))
    CropFlipNormalize(64, [0.0] * 3, [1.0] * 3)(keras.Input((72, 72, 3), dtype="uint8"))


# --- progress within an epoch, the warm-up note, "1 epoch" -------------------------------------------------------


def test_a_tiny_run_in_a_pipe_shows_progress_within_the_epoch_and_overwrite_replaces_a_run(colour_dataset, tmp_path,
                                                                                          monkeypatch):
    """One run, as a pipe (or a log file) gets it: plain lines of at most $COLUMNS, a line after every step with the
    running metrics, the warm-up note, the unused-images warning, the summary; and --overwrite replacing a run."""
    import json

    from shardprep import output

    monkeypatch.setattr(output, "TRAIN_PLAIN_SECONDS", 0.0)  # a line after every step (10 s in real runs)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)  # paths as a person types them (a path longer than a line stays whole)
    run = tmp_path / "run"
    _previous_run(run)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", "run", "--overwrite",
                                       "--epochs", "1", "--batch-size", "24", "--image-size", "16",
                                       "--width-multiplier", "0.125", "--no-tensorboard", "--seed", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "--overwrite: deleted the 5 files of the earlier run in run"
    assert "\r" not in result.output  # not a terminal: plain lines
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    text = " ".join(result.output.split())
    assert "64 training images, 2 steps of 24 per epoch, epoch 1." in text
    assert "Warning: 2 steps of 24 per epoch; 16 images (25%) unused each epoch" in text
    progress = [line for line in lines if line.strip().startswith("step ")]
    assert [line.split(",")[0] for line in progress] == ["  step 1/2 (50%)", "  step 2/2 (100%)"]
    assert all("images/s, ETA " in line for line in progress[:-1]) and ", took " in progress[-1]
    assert all("loss " in line and "accuracy " in line for line in progress)  # the epoch's running metrics
    assert any(line.startswith("Note: the warm-up (5 epochs, --warmup-epochs) is as long as the run (1 epoch)")
               for line in lines)
    assert "Summary: 1 epoch; best by val_loss" in text and "(epoch 1)" in text
    assert "Validating on split 'validation' after each epoch (the split named 'validation')." in text
    assert "patches" not in text  # --image-size 16 of 20: no crop warning
    assert (run / "model.keras").read_bytes() != b"old" and not (run / "logs").exists()
    assert not (run / "checkpoints" / "last.keras").read_bytes() == b"old"
    # No --backend: the default, TensorFlow here (test_train_backends.py: the choice), and the summary says so.
    assert json.loads((run / "summary.json").read_text())["backend"] == "tensorflow"


def test_progress_rewrites_one_line_on_a_terminal():
    from shardprep.output import TrainDisplay
    from shardprep.preprocess.checks.events import TrainingSteps, ValidationBatches

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, reported = Terminal(), []
    display = TrainDisplay(reported.append, stream=terminal, interval_tty=0.0, width=80)
    for step in range(1, 11):
        display(TrainingSteps(step, 10, 0, 32, float(step), lambda: {"loss": 0.5, "accuracy": 0.75}))
    display(TrainingSteps(10, 10, 0, 32, 10.0, lambda: {"loss": 0.5, "accuracy": 0.75}, finished=True))
    display(ValidationBatches(1, 2))
    display(ValidationBatches(1, 2, finished=True))
    assert reported == []
    shown = terminal.getvalue()
    # The count reaches N/N, and that line stays; the validation line is cleared before the epoch's report.
    assert shown.count("\r  step ") == 10 and "step 9/10 " in shown and "step 10/10 " in shown
    assert "loss 0.5000, accuracy 0.7500" in shown and "\r  validation: batch 1/2" in shown and shown.endswith("\r")
    assert max(len(line) for line in shown.replace("\n", "\r").split("\r")) <= 79  # never wraps at 80


# --- predict_images -------------------------------------------------------------------------------------------------


def _encoded(pixels, fmt, **kwargs):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_model(colour_dataset):
    import keras

    from shardprep.train.data import reader
    from shardprep.train.model.keras_model import build_model

    keras.utils.set_random_seed(3)
    manifest = reader.load_manifest(colour_dataset)
    return build_model(2, 16, manifest.mean_rgb, manifest.std_rgb, width_multiplier=0.125)


def _expected(model, manifest, data):
    """What the model says for ``data`` stored exactly as the preprocess job stores it."""
    from shardprep.preprocess.image import image_ops
    from shardprep.train.model.predict import _softmax, process_options

    processed = image_ops.process_image(data, process_options(manifest))
    pixels = np.frombuffer(processed.encoded, np.uint8).reshape(processed.height, processed.width, 3)
    return _softmax(np.asarray(model(pixels[np.newaxis], training=False), np.float64))[0]


def test_predict_images_takes_paths_and_bytes_and_names_the_classes(colour_dataset, tiny_model, tmp_path):
    from shardprep.train.model.predict import Prediction, predict_images
    from shardprep.train.data.reader import load_manifest

    manifest = load_manifest(colour_dataset)
    rng = np.random.default_rng(5)
    photo = rng.integers(0, 256, (60, 45, 3), dtype=np.uint8)
    jpeg = _encoded(photo, "JPEG", quality=92)
    (tmp_path / "photo.jpg").write_bytes(jpeg)
    rgba = np.dstack([photo, np.full(photo.shape[:2], 128, np.uint8)])
    png_alpha = _encoded(rgba, "PNG")
    small = _encoded(rng.integers(0, 256, (7, 5, 3), dtype=np.uint8), "PNG")  # smaller than the train size 16
    images = [str(tmp_path / "photo.jpg"), jpeg, png_alpha, small]

    predictions = predict_images(tiny_model, colour_dataset, images, top_k=2)
    assert [p.source for p in predictions] == [str(tmp_path / "photo.jpg"), "<bytes #1>", "<bytes #2>",
                                               "<bytes #3>"]
    for prediction, data in zip(predictions, [jpeg, jpeg, png_alpha, small]):
        assert isinstance(prediction, Prediction)
        assert prediction.class_name in ("red", "blue")
        assert prediction.class_name == manifest.classes[prediction.index]
        assert [name for name, _, _ in prediction.top] == [manifest.classes[i] for _, i, _ in prediction.top]
        assert sum(p for _, _, p in prediction.top) == pytest.approx(1.0, abs=1e-5)  # top 2 of 2 classes
        assert prediction.top[0][2] >= prediction.top[1][2] and prediction.probability == prediction.top[0][2]
        np.testing.assert_allclose([p for _, _, p in sorted(prediction.top, key=lambda t: t[1])],
                                   _expected(tiny_model, manifest, data), atol=1e-5)
    assert predictions[0].top == predictions[1].top  # a path and its bytes are the same image
    # The loaded manifest and the model as a saved file give the same answers.
    tiny_model.save(tmp_path / "model.keras")
    again = predict_images(str(tmp_path / "model.keras"), manifest, images[:1], top_k=1)
    assert len(again[0].top) == 1 and again[0].top[0] == pytest.approx(predictions[0].top[0], abs=1e-5)


def test_predict_images_refuses_a_stored_form_smaller_than_the_train_size(colour_dataset, tiny_model):
    from shardprep.train.model.predict import predict_images, stored_pixels, process_options
    from shardprep.train.data.reader import load_manifest

    manifest = dataclasses.replace(load_manifest(colour_dataset), shorter_side=12, image_height=12, image_width=12)
    photo = _encoded(np.random.default_rng(1).integers(0, 256, (30, 40, 3), dtype=np.uint8), "PNG")
    assert stored_pixels(photo, process_options(manifest)).shape == (12, 12, 3)
    assert stored_pixels(photo, process_options(manifest), min_side=16).shape == (16, 16, 3)
    # Training crops lie inside the stored images: a manifest of smaller ones is another dataset's.
    with pytest.raises(ValueError, match="stores 12x12 images, smaller than the model's 16-pixel crop"):
        predict_images(tiny_model, manifest, [photo])


def test_a_photo_url_that_is_missing_or_too_large_is_a_failure_named_not_a_traceback(colour_dataset, tiny_model,
                                                                                     monkeypatch):
    """A URL photo (gs://, read through tf.io.gfile; TensorFlow's ram:// here) is read as a path is: a missing one
    "does not exist", one over PHOTO_MAX_BYTES says its size, and the others are answered."""
    import tensorflow as tf

    from shardprep.train.model import predict
    from shardprep.train.model.predict import PhotoFailure, Prediction, predict_images

    monkeypatch.setattr(predict, "PHOTO_MAX_BYTES", 2_000)
    good = _encoded(np.zeros((20, 20, 3), np.uint8), "PNG")
    with tf.io.gfile.GFile("ram://photos/good.png", "wb") as f:
        f.write(good)
    with tf.io.gfile.GFile("ram://photos/large.bmp", "wb") as f:
        f.write(_encoded(np.zeros((40, 40, 3), np.uint8), "BMP"))  # 4,854 bytes
    results = predict_images(tiny_model, colour_dataset, ["ram://photos/missing.png", "ram://photos/large.bmp",
                                                          "ram://photos/good.png"], errors="report")
    assert [type(result) for result in results] == [PhotoFailure, PhotoFailure, Prediction]
    assert results[0].message == "does not exist"
    assert results[1].message == "is more than the 2,000 bytes allowed"


def test_predict_images_explains_what_it_cannot_use(colour_dataset, tiny_model):
    from shardprep.train.model.predict import predict_images

    with pytest.raises(ValueError, match=r"<bytes #0>: not usable as an image"):
        predict_images(tiny_model, colour_dataset, [b"not an image"])
    with pytest.raises(TypeError, match="give a path or the file's bytes"):
        predict_images(tiny_model, colour_dataset, [np.zeros((4, 4, 3), np.uint8)])
    from shardprep.train.data.reader import load_manifest

    manifest = {**load_manifest(colour_dataset).to_json(), "classes": ["a", "b", "c"], "num_classes": 3}
    photo = _encoded(np.zeros((20, 20, 3), np.uint8), "PNG")
    with pytest.raises(ValueError, match="the model has 2 outputs but the manifest lists 3 classes"):
        predict_images(tiny_model, manifest, [photo])


def test_shardprep_predict_prints_class_names_and_refuses_missing_files(colour_dataset, tiny_model, tmp_path):
    from shardprep.cli import main

    model_path = tmp_path / "model.keras"
    tiny_model.save(model_path)
    photo = tmp_path / "photo.png"
    photo.write_bytes(_encoded(np.random.default_rng(9).integers(0, 256, (30, 40, 3), dtype=np.uint8), "PNG"))
    result = CliRunner().invoke(main, ["predict", str(model_path), colour_dataset, str(photo), "--top-k", "2"])
    assert result.exit_code == 0, result.output
    (line,) = predict_entries(result.output)
    assert line.startswith(f"{photo}: ") and {"red", "blue"} == {part.rsplit(" ", 1)[0]
                                                                 for part in line.split(": ", 1)[1].split(", ")}
    result = CliRunner().invoke(main, ["predict", str(tmp_path / "nope.keras"), colour_dataset, str(photo)])
    assert result.exit_code == 1 and _error_lines(result)[0].startswith("Error: MODEL ")
    result = CliRunner().invoke(main, ["predict", str(model_path), colour_dataset, str(tmp_path / "nope.jpg")])
    assert result.exit_code == 1
    assert predict_entries(result.output) == [f"{tmp_path / 'nope.jpg'}: not classified: does not exist"]
    assert _error_lines(result) == ["Error: 1 of 1 photo could not be classified (each is named above)"]


def test_a_batch_larger_than_the_training_split_is_one_line_before_the_run(colour_dataset, tmp_path):
    examples = load_manifest(colour_dataset).split("train").num_examples
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--image-size", "16", "--batch-size", str(examples + 1)])
    line, = _error_lines(result)
    assert f"--batch-size {examples + 1} is larger than the {examples:,} examples of training split 'train'" in line
    assert f"pass --batch-size {examples} or smaller" in line
    assert not (tmp_path / "run").exists()
