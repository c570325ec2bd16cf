"""The inference model.keras: Keras's own layers only, so plain ``keras.models.load_model`` reads it on any backend
in a process that never imported shardprep, and predicts what the trained model predicts. The module's one JAX
process also runs test_train_augment.py's and test_keras_steps.py's checks on JAX (one JAX start for all)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import keras
import numpy as np
import pytest

from shardprep.train.model.keras_model import build_model, inference_model, save_inference_model

IMAGE_SIZE = 16
MEAN, STD = [120.0, 110.0, 100.0], [60.0, 50.0, 40.0]

# Loads model.keras with plain Keras and writes its logits for the images; never imports shardprep.
LOAD_AND_PREDICT = textwrap.dedent("""
    import json
    import sys
    import keras
    import numpy as np

    model = keras.models.load_model(sys.argv[1])
    logits = keras.ops.convert_to_numpy(model(np.load(sys.argv[2])))
    np.save(sys.argv[3], logits)
    print(json.dumps({"backend": keras.backend.backend(),
                      "shardprep": any(m.startswith("shardprep") for m in sys.modules),
                      "layers": sorted({type(layer).__module__.split(".")[0] for layer in model.layers})}))
""")

# Then (on JAX, in the same process: one JAX start for both) builds and saves a trained-like model with shardprep,
# with its logits for other images. Plain loading imports neither shardprep nor TensorFlow, so both are still
# unimported when the build starts.
BUILD_AND_SAVE = textwrap.dedent("""
    from shardprep.train.model.keras_model import build_model, save_inference_model

    images = np.load(sys.argv[5])
    tensorflow_before_build = "tensorflow" in sys.modules
    model = build_model(3, 16, [120.0, 110.0, 100.0], [60.0, 50.0, 40.0], width_multiplier=0.125)
    rng = np.random.default_rng(1)
    model.set_weights([(rng.uniform(0.5, 2.0, w.shape) if "variance" in v.path else w + rng.normal(0, 0.1, w.shape))
                       .astype(w.dtype) for w, v in zip(model.get_weights(), model.weights)])
    kernel, bias = model.get_layer("logits").get_weights()
    centre = keras.ops.convert_to_numpy(model(images, training=False)).mean(axis=0)
    model.get_layer("logits").set_weights([kernel, bias - centre])  # classes told apart
    np.save(sys.argv[6], keras.ops.convert_to_numpy(model(images, training=False)))
    # Before saving: Keras's serialization itself imports TensorFlow whenever it is installed, on any backend.
    tensorflow = "tensorflow" in sys.modules
    save_inference_model(model, sys.argv[4])
    print(json.dumps({"backend": keras.backend.backend(), "tensorflow": tensorflow,
                      "tensorflow_before_build": tensorflow_before_build}))
""")


# Moved here from test_train_augment.py and test_keras_steps.py to share this module's JAX process, between the plain
# load (no shardprep yet) and shardprep's build (no TensorFlow yet), which this does not import either. On JAX,
# under jax.jit: test_train_augment.py's checks of windows, flips, centre crop and seeds; the layer through
# stateless_call (how Keras's JAX trainer runs it), its seed state carried from step to step.
AUGMENT_UNDER_JAX_JIT = textwrap.dedent("""
    import json
    import sys
    import jax
    import keras
    import numpy as np
    from shardprep.train.model import augment

    rows, columns = np.meshgrid(np.arange(20), np.arange(24), indexing="ij")
    images = np.stack([np.stack([columns, rows, np.full_like(rows, b)], -1) for b in range(32)]).astype(np.uint8)
    crop = jax.jit(lambda x, seed: augment.random_crop_flip(x, 16, seed))
    cropped = np.asarray(crop(images, jax.numpy.array([3, 4], "uint32")))
    windows = []
    for index, c in enumerate(cropped):
        top, left = int(c[0, 0, 1]), int(c[..., 0].min())
        window = images[index, top:top + 16, left:left + 16]
        windows.append(bool((c == window).all() or (c == window[:, ::-1]).all()))
    flips = int(sum(c[0, 0, 0] > c[0, -1, 0] for c in cropped))
    again = np.asarray(crop(images, jax.numpy.array([3, 4], "uint32")))
    other = np.asarray(crop(images, jax.numpy.array([5, 6], "uint32")))
    centre = np.asarray(jax.jit(lambda x: augment.center_crop(x, 16))(images))
    rrc = np.asarray(jax.jit(lambda x: augment.random_resized_crop_flip(x, 16, 9))(images))
    layer = augment.CropFlipNormalize(16, [0, 0, 0], [1, 1, 1], augment="rrc", seed=1)
    layer.build((None, None, None, 3))
    step = jax.jit(lambda state, x: layer.stateless_call([], state, x, training=True))
    state = [v.value for v in layer.non_trainable_variables]
    first, state = step(state, images)
    second, _ = step(state, images)
    print(json.dumps({
        "tensorflow": "tensorflow" in sys.modules, "backend": keras.backend.backend(),
        "windows": all(windows), "flips": flips, "dtype": str(cropped.dtype), "repeat": bool((cropped == again).all()),
        "other_seed_differs": bool((cropped != other).any()),
        "centre": bool((centre == images[:, 2:18, 4:20]).all()), "rrc_shape": list(rrc.shape),
        "rrc_labels_kept": bool(np.allclose(rrc[..., 2], np.arange(32)[:, None, None], atol=1e-3)),
        "layer_steps_differ": bool((np.asarray(first) != np.asarray(second)).any()),
    }))
""")



# Last (after the save imported TensorFlow): a validation pass whose last batch is short. Counts how often Keras
# traces (so XLA compiles) the evaluation step, and compares the metrics with those of the same batches evaluated
# unpadded, one test_on_batch each, summed by examples as KerasSteps sums them.
SHORT_LAST_BATCH_ON_JAX = textwrap.dedent("""
    import json
    import keras
    import numpy as np
    from shardprep.train.run.config import TrainConfig
    from shardprep.train.run.steps_keras import KerasSteps

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])

    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(11, 6, 6, 3)).astype("float32"), rng.integers(0, 3, 11).astype("int32")
    batches = [(images[i:i + 4], labels[i:i + 4]) for i in range(0, 11, 4)]  # 4, 4, 3

    steps = KerasSteps(TrainConfig(data_dir="unused", batch_size=4, precision="float32"), None, "jax")
    steps.compile(model(), keras.optimizers.SGD(), num_classes=3)
    traced_shapes = []
    test_step = steps.model.test_step
    def counted_test_step(*args):
        traced_shapes.append(str(args[-1][0].shape))
        return test_step(*args)
    steps.model.test_step = counted_test_step
    for batch in batches:
        steps.eval_step(batch)

    unpadded = KerasSteps(TrainConfig(data_dir="unused", batch_size=4, precision="float32"), None, "jax")
    unpadded.compile(model(), keras.optimizers.SGD(), num_classes=3)
    for batch_images, batch_labels in batches:
        logs = unpadded.model.test_on_batch(batch_images, batch_labels, return_dict=True)
        unpadded._val.add({"val_loss": logs["data_loss"], "val_accuracy": logs["accuracy"]}, len(batch_labels))
    print(json.dumps({"traced_shapes": traced_shapes, "results": steps.val_results(),
                      "unpadded": unpadded.val_results(), "examples": steps._val.examples}))
""")



@pytest.fixture(scope="module")
def trained_like():
    """:func:`_trained_like_model`, built once for the tests that only read it."""
    return _trained_like_model()


def _trained_like_model(seed=1):
    """A tiny model whose weights and batch-norm statistics are random, so that every copied value matters."""
    keras.utils.set_random_seed(0)
    model = build_model(3, IMAGE_SIZE, MEAN, STD, width_multiplier=0.125)
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.uniform(0.5, 2.0, w.shape) if "variance" in v.path else w + rng.normal(0, 0.1, w.shape))
                       .astype(w.dtype) for w, v in zip(model.get_weights(), model.weights)])
    # Logits centred over the test images: else one class wins for every image and "same classes" says little.
    kernel, bias = model.get_layer("logits").get_weights()
    centre = keras.ops.convert_to_numpy(model(_images(), training=False)).mean(axis=0)
    model.get_layer("logits").set_weights([kernel, bias - centre])
    return model


def _images(count=6, height=23, width=19, seed=2):
    """uint8 images larger than the train size, with odd and even margins: a colour each, plus noise (noise
    alone averages out in the pooling, and every image would get the same class)."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 256, (count, 1, 1, 3))
    return np.clip(colours + rng.integers(-40, 41, (count, height, width, 3)), 0, 255).astype(np.uint8)


def _run(script, backend, *args, cwd, results=1):
    """The JSON line ``script`` prints last (with ``results``: its last ``results`` lines, as a list)."""
    # XLA's optimizations off: on JAX, compiling each weight initializer and op dominates a tiny model's run.
    env = {**os.environ, "KERAS_BACKEND": backend, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()[-results:]]
    return lines[0] if results == 1 else lines


def test_inference_model_is_keras_layers_only_and_predicts_as_the_trained_model(trained_like):
    model = trained_like
    inference = inference_model(model)
    assert [type(layer).__name__ for layer in inference.layers[:4]] == [
        "InputLayer", "CenterCrop", "Normalization", "Conv2D"]
    assert all(type(layer).__module__.startswith("keras.") for layer in inference.layers)
    assert inference.input.dtype == "uint8" and getattr(inference, "optimizer", None) is None
    images = _images()
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    # Called without `training` (as users do): batch normalization must use its moving statistics.
    for logits in (inference(images), inference(images, training=False), inference.predict(images, verbose=0)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), expected, rtol=1e-5, atol=1e-5)
    assert len(set(expected.argmax(axis=1))) > 1  # the images are told apart, so "same classes" means something


def test_inference_model_crops_stored_pixels_and_normalizes_with_the_manifest_scale(trained_like):
    inference = inference_model(trained_like)
    normalized = keras.Model(inference.input, inference.get_layer("normalization").output)
    for height, width in [(16, 16), (23, 19), (40, 64)]:
        images = _images(2, height, width)
        top, left = (height - IMAGE_SIZE) // 2, (width - IMAGE_SIZE) // 2
        window = images[:, top:top + IMAGE_SIZE, left:left + IMAGE_SIZE].astype(np.float32)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(normalized(images)),
                                   (window - np.array(MEAN)) / np.array(STD), rtol=1e-5, atol=1e-5)


def _saved(model, tmp_path):
    """``model`` saved as the inference model.keras, with the test images: their paths and the logits expected."""
    path, images_path = tmp_path / "model.keras", tmp_path / "images.npy"
    save_inference_model(model, str(path))
    images = _images()
    np.save(images_path, images)
    return path, images_path, keras.ops.convert_to_numpy(model(images, training=False))


def _assert_same_predictions(logits, expected):
    np.testing.assert_array_equal(logits.argmax(axis=1), expected.argmax(axis=1))
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


# Plain Keras loads the saved model on TensorFlow without shardprep: test_train_loop.py, in its TensorFlow process
# (before that imports shardprep).


class JaxRun(NamedTuple):
    """The module's JAX process: its folder, the logits expected of the model saved here, and what each part
    printed."""
    folder: Path
    expected: np.ndarray
    jax_images: np.ndarray
    loaded: dict
    augment: dict
    saved: dict
    short_last_batch: dict


@pytest.fixture(scope="module")
def jax_run(trained_like, tmp_path_factory) -> JaxRun:
    """One JAX process (one JAX start for every check on JAX of this module): LOAD_AND_PREDICT of the model saved
    here, AUGMENT_UNDER_JAX_JIT, BUILD_AND_SAVE, SHORT_LAST_BATCH_ON_JAX, in that order."""
    folder = tmp_path_factory.mktemp("jax")
    path, images_path, expected = _saved(trained_like, folder)
    jax_path, jax_images_path, jax_logits_path = folder / "jax.keras", folder / "jax.npy", folder / "jax-out.npy"
    jax_images = _images(8, 20, 27)
    np.save(jax_images_path, jax_images)
    done = _run(LOAD_AND_PREDICT + AUGMENT_UNDER_JAX_JIT + BUILD_AND_SAVE + SHORT_LAST_BATCH_ON_JAX, "jax", path,
                images_path, folder / "logits.npy", jax_path, jax_images_path, jax_logits_path, cwd=folder, results=4)
    return JaxRun(folder, expected, jax_images, *done)


def test_on_jax_plain_keras_loads_the_saved_model_and_a_model_saved_there_loads_here(jax_run):
    """Plain Keras loads the model saved here (without shardprep); then shardprep's model is built and saved there
    without TensorFlow, and loads here with the same predictions."""
    assert jax_run.loaded == {"backend": "jax", "shardprep": False, "layers": ["keras"]}
    _assert_same_predictions(np.load(jax_run.folder / "logits.npy"), jax_run.expected)

    # shardprep's model runs without TensorFlow (its import came with neither the plain load nor shardprep's)
    assert jax_run.saved == {"backend": "jax", "tensorflow": False, "tensorflow_before_build": False}
    assert keras.backend.backend() == "tensorflow"
    jax_expected = np.load(jax_run.folder / "jax-out.npy")
    _assert_same_predictions(keras.ops.convert_to_numpy(keras.models.load_model(str(jax_run.folder / "jax.keras"))(
        jax_run.jax_images)), jax_expected)
    assert len(set(jax_expected.argmax(axis=1))) > 1


def test_augmentation_compiles_under_jax_jit_without_tensorflow(jax_run):
    """(From test_train_augment.py.) The same crops, flips and seeds under jax.jit, TensorFlow never imported."""
    result = dict(jax_run.augment)
    assert result.pop("flips") in range(6, 27)
    assert result == {"tensorflow": False, "backend": "jax", "windows": True, "dtype": "uint8", "repeat": True,
                      "other_seed_differs": True, "centre": True, "rrc_shape": [32, 16, 16, 3],
                      "rrc_labels_kept": True, "layer_steps_differ": True}


def test_a_short_last_validation_batch_on_jax_compiles_no_second_evaluation_step(jax_run):
    """(From test_keras_steps.py.) Padded up to the batch size with copies that weigh nothing, the short last batch
    reuses the compiled evaluation step (XLA compiles once per input shape and structure), and val_loss and
    val_accuracy stay those of the real images."""
    seen = jax_run.short_last_batch
    assert seen["traced_shapes"] == ["(4, 6, 6, 3)"]
    assert seen["examples"] == 11
    # Every batch of a compiled step carries weights, and XLA sums a weighted mean in another order: the same
    # float32 figure to its last bit or so.
    assert seen["results"]["val_accuracy"] == seen["unpadded"]["val_accuracy"]
    assert seen["results"] == pytest.approx(seen["unpadded"], rel=1e-6)


def test_predict_images_and_shardprep_predict_take_the_inference_model(colour_dataset, tmp_path):
    import io

    from click.testing import CliRunner
    from PIL import Image

    from shardprep.cli import main
    from shardprep.train.model.predict import model_image_size, predict_images

    data = colour_dataset  # 20x20 stored images, classes red and blue
    keras.utils.set_random_seed(0)
    with open(os.path.join(data, "manifest.json")) as f:
        manifest = json.load(f)  # predict checks mean/std
    model = build_model(2, IMAGE_SIZE, manifest["mean_rgb"], manifest["std_rgb"], width_multiplier=0.125)
    path = tmp_path / "model.keras"
    save_inference_model(model, str(path))
    loaded = keras.models.load_model(str(path))
    assert model_image_size(loaded) == IMAGE_SIZE  # from its CenterCrop: small photos are resized up to fit
    photos = []
    for seed, shape in enumerate([(30, 40, 3), (7, 5, 3)]):  # the second is smaller than the train size
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(buffer, "PNG")
        photos.append(buffer.getvalue())
    new = predict_images(str(path), data, photos, top_k=2)
    old = predict_images(model, data, photos, top_k=2)  # the training model, evaluated: the same answers
    for a, b in zip(new, old):
        assert a.class_name == b.class_name and a.probability == pytest.approx(b.probability, abs=1e-5)
    (tmp_path / "photo.png").write_bytes(photos[0])
    result = CliRunner().invoke(main, ["predict", str(path), data, str(tmp_path / "photo.png")])
    assert result.exit_code == 0, result.output
    assert result.output.strip().startswith(f"{tmp_path / 'photo.png'}: {new[0].class_name} ")
