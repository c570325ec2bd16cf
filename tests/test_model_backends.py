"""The inference model.keras: Keras's own layers only, so plain ``keras.models.load_model`` reads it on any backend
in a process that never imported shardprep, and predicts what the trained model predicts."""

import json
import os
import subprocess
import sys
import textwrap

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


def test_plain_keras_loads_the_saved_model_on_tensorflow_without_shardprep(trained_like, tmp_path):
    path, images_path, expected = _saved(trained_like, tmp_path)
    loaded = _run(LOAD_AND_PREDICT, "tensorflow", path, images_path, tmp_path / "logits.npy", cwd=tmp_path)
    assert loaded == {"backend": "tensorflow", "shardprep": False, "layers": ["keras"]}
    _assert_same_predictions(np.load(tmp_path / "logits.npy"), expected)


def test_on_jax_plain_keras_loads_the_saved_model_and_a_model_saved_there_loads_here(trained_like, tmp_path):
    """One JAX process: plain Keras loads the model saved here (without shardprep); then shardprep's model is built
    and saved there without TensorFlow, and loads here with the same predictions."""
    path, images_path, expected = _saved(trained_like, tmp_path)
    jax_path, jax_images_path, jax_logits_path = tmp_path / "jax.keras", tmp_path / "jax.npy", tmp_path / "jax-out.npy"
    jax_images = _images(8, 20, 27)
    np.save(jax_images_path, jax_images)
    done = _run(LOAD_AND_PREDICT + BUILD_AND_SAVE, "jax", path, images_path, tmp_path / "logits.npy", jax_path,
                jax_images_path, jax_logits_path, cwd=tmp_path, results=2)
    loaded, saved = done
    assert loaded == {"backend": "jax", "shardprep": False, "layers": ["keras"]}
    _assert_same_predictions(np.load(tmp_path / "logits.npy"), expected)

    # shardprep's model runs without TensorFlow (its import came with neither the plain load nor shardprep's)
    assert saved == {"backend": "jax", "tensorflow": False, "tensorflow_before_build": False}
    assert keras.backend.backend() == "tensorflow"
    jax_expected = np.load(jax_logits_path)
    _assert_same_predictions(keras.ops.convert_to_numpy(keras.models.load_model(str(jax_path))(jax_images)),
                             jax_expected)
    assert len(set(jax_expected.argmax(axis=1))) > 1


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
