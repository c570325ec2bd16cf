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

from shardprep.train.model import build_model, inference_model, save_inference_model

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

# Builds and saves a trained-like model on the subprocess's backend, with its logits for the images.
BUILD_AND_SAVE = textwrap.dedent("""
    import json
    import sys
    import keras
    import numpy as np
    from shardprep.train.model import build_model, save_inference_model

    model = build_model(3, 16, [120.0, 110.0, 100.0], [60.0, 50.0, 40.0], width_multiplier=0.125)
    rng = np.random.default_rng(1)
    model.set_weights([(rng.uniform(0.5, 2.0, w.shape) if "variance" in v.path else w + rng.normal(0, 0.1, w.shape))
                       .astype(w.dtype) for w, v in zip(model.get_weights(), model.weights)])
    images = np.load(sys.argv[2])
    kernel, bias = model.get_layer("logits").get_weights()
    centre = keras.ops.convert_to_numpy(model(images, training=False)).mean(axis=0)
    model.get_layer("logits").set_weights([kernel, bias - centre])  # classes told apart
    np.save(sys.argv[3], keras.ops.convert_to_numpy(model(images, training=False)))
    # Before saving: Keras's serialization itself imports TensorFlow whenever it is installed, on any backend.
    tensorflow = "tensorflow" in sys.modules
    save_inference_model(model, sys.argv[1])
    print(json.dumps({"backend": keras.backend.backend(), "tensorflow": tensorflow}))
""")


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


def _run(script, backend, *args, cwd):
    # XLA's optimizations off: on JAX, compiling each weight initializer and op dominates a tiny model's run.
    env = {**os.environ, "KERAS_BACKEND": backend, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_inference_model_is_keras_layers_only_and_predicts_as_the_trained_model():
    model = _trained_like_model()
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


def test_inference_model_crops_stored_pixels_and_normalizes_with_the_manifest_scale():
    inference = inference_model(_trained_like_model())
    normalized = keras.Model(inference.input, inference.get_layer("normalization").output)
    for height, width in [(16, 16), (23, 19), (40, 64)]:
        images = _images(2, height, width)
        top, left = (height - IMAGE_SIZE) // 2, (width - IMAGE_SIZE) // 2
        window = images[:, top:top + IMAGE_SIZE, left:left + IMAGE_SIZE].astype(np.float32)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(normalized(images)),
                                   (window - np.array(MEAN)) / np.array(STD), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_plain_keras_loads_the_saved_model_on_a_backend_without_shardprep(backend, tmp_path):
    model = _trained_like_model()
    path, images_path, logits_path = tmp_path / "model.keras", tmp_path / "images.npy", tmp_path / "logits.npy"
    save_inference_model(model, str(path))
    images = _images()
    np.save(images_path, images)
    loaded = _run(LOAD_AND_PREDICT, backend, path, images_path, logits_path, cwd=tmp_path)
    assert loaded == {"backend": backend, "shardprep": False, "layers": ["keras"]}
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    logits = np.load(logits_path)
    np.testing.assert_array_equal(logits.argmax(axis=1), expected.argmax(axis=1))
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_a_model_saved_on_jax_loads_and_predicts_the_same_classes_here(tmp_path):
    path, images_path, logits_path = tmp_path / "model.keras", tmp_path / "images.npy", tmp_path / "logits.npy"
    images = _images(8, 20, 27)
    np.save(images_path, images)
    saved = _run(BUILD_AND_SAVE, "jax", path, images_path, logits_path, cwd=tmp_path)
    assert saved == {"backend": "jax", "tensorflow": False}  # shardprep's model runs without TensorFlow
    assert keras.backend.backend() == "tensorflow"
    loaded = keras.models.load_model(str(path))
    expected = np.load(logits_path)
    logits = keras.ops.convert_to_numpy(loaded(images))
    np.testing.assert_array_equal(logits.argmax(axis=1), expected.argmax(axis=1))
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    assert len(set(expected.argmax(axis=1))) > 1


def test_predict_images_and_shardprep_predict_take_the_inference_model(colour_dataset, tmp_path):
    import io

    from click.testing import CliRunner
    from PIL import Image

    from shardprep.cli import main
    from shardprep.train.predict import model_image_size, predict_images

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
