"""Generated images -> the real preprocess job -> shardprep train -> a model that has learned the two classes."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardprep.cli import main
from shardprep.train.model.keras_model import load_model

CLASSES = ("blue", "red")  # ImageFolder sorts class folders: blue = 0, red = 1
# The job in this process: what is checked here is what training makes of its output, not Beam's worker processes
# (each costs seconds of CPU just to start; the preprocess tests run real workers).
IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """ImageFolder layout, two colour-tinted noise classes, images of assorted sizes and aspect ratios."""
    root = tmp_path_factory.mktemp("source")
    rng = np.random.default_rng(0)
    for split, count in (("train", 48), ("validation", 24)):
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                height, width = rng.integers(44, 64, 2)
                pixels = rng.integers(0, 120, (height, width, 3))
                pixels[..., 2 if name == "blue" else 0] += 120
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index:03d}.png")
    return root


def test_preprocess_then_train_learns_the_classes(source, tmp_path):
    runner = CliRunner()
    data = tmp_path / "prepared"
    prepared = runner.invoke(main, ["preprocess", str(source), str(data), "--shorter-side", "40",
                                    "--num-shards", "2", "--quiet", *IN_PROCESS])
    assert prepared.exit_code == 0, prepared.output
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["classes"] == list(CLASSES) and manifest["encoding"] == "raw"

    output = tmp_path / "run"
    trained = runner.invoke(main, ["train", str(data), "--output-dir", str(output), "--epochs", "3",
                                   "--batch-size", "16", "--image-size", "32", "--width-multiplier", "0.125",
                                   "--warmup-epochs", "1", "--seed", "0", "--no-tensorboard"])
    assert trained.exit_code == 0, trained.output
    lines = trained.output.splitlines()
    epoch_lines = [line for line in lines if line.startswith("epoch ")]
    took = [line for line in lines if line.startswith("  took ")]  # each epoch's second line
    assert len(epoch_lines) == len(took) == 3 and all("images/s, waiting for input" in line for line in took)
    assert "Summary:" in trained.output
    history = json.loads((output / "history.json").read_text())
    assert history["epoch"] == list(range(1, 4))
    assert history["val_accuracy"][-1] >= 0.9

    # The saved model takes the stored uint8 images as they are (40x40 here, larger than its 32 px crop) and crops
    # and normalizes them itself: the validation split read back with the framework-free reader.
    from shardprep.train.data.numpy_reader import NumpyReader

    model = load_model(str(output / "model.keras"))
    correct = total = 0
    for images, labels in NumpyReader(str(data), "validation", 8, training=False):
        assert images.shape[1:] == (40, 40, 3)
        correct += int(np.sum(np.argmax(model.predict(images, verbose=0), axis=-1) == labels))
        total += len(labels)
    assert total == 48 and correct / total >= 0.9

    # New photos go through predict_images: the job's own decode and resize, class names from the manifest; photos
    # smaller than the train size (10x8 here, under 32) are resized up like any other.
    from shardprep.train.model.predict import predict_images

    paths = sorted((source / "validation").glob("*/*.png"))
    predictions = predict_images(str(output / "model.keras"), str(data), [str(p) for p in paths], top_k=2)
    assert np.mean([p.class_name == path.parent.name for p, path in zip(predictions, paths)]) >= 0.9
    assert all(abs(sum(prob for _, _, prob in p.top) - 1) < 1e-5 for p in predictions)
    rng = np.random.default_rng(9)
    tiny = rng.integers(0, 120, (10, 8, 3))
    tiny[..., 0] += 120  # red
    tiny_path = tmp_path / "tiny.png"
    Image.fromarray(tiny.astype(np.uint8)).save(tiny_path)
    assert predict_images(model, data, [tiny_path])[0].class_name == "red"


def test_reader_reads_the_jobs_uncropped_jpeg_shards(source, tmp_path):
    from shardprep.train.data import reader

    data = tmp_path / "jpeg-none"
    prepared = CliRunner().invoke(main, ["preprocess", str(source), str(data), "--shorter-side", "40",
                                         "--crop", "none", "--encoding", "jpeg", "--num-shards", "2", "--quiet",
                                         *IN_PROCESS])
    assert prepared.exit_code == 0, prepared.output
    count = 0
    for training in (False, True):
        dataset = reader.make_dataset(str(data), "validation", 8, training=training, seed=1)
        for images, labels in dataset.take(6):
            images, labels = images.numpy(), labels.numpy()
            assert images.shape[1:] == (40, 40, 3) and images.dtype == np.uint8
            # Each image's dominant colour still says its class: labels travelled with their images.
            blue_dominant = images[..., 2].mean(axis=(1, 2)) > images[..., 0].mean(axis=(1, 2))
            np.testing.assert_array_equal(blue_dominant, labels == CLASSES.index("blue"))
            count += len(labels)
    assert count >= 48 + 48  # one full validation pass, then training batches
