"""On-device augmentation: crops stay inside the image, keep each image with its label, and repeat with the seed;
the same code compiles under XLA on TensorFlow and under jax.jit on JAX, without importing TensorFlow there."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from shardprep.train.model import augment

SEED = 34  # an int seed: stateless, as keras.random takes it


def _coordinate_images(batch, height, width):
    """uint8 images whose pixels say where they are: red = column, green = row, blue = image number."""
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    images = np.stack([np.stack([columns, rows, np.full_like(rows, b)], axis=-1) for b in range(batch)])
    return images.astype(np.uint8)


def test_center_crop_is_the_central_window():
    images = _coordinate_images(2, 10, 13)
    cropped = augment.center_crop(tf.constant(images), 6).numpy()
    np.testing.assert_array_equal(cropped, images[:, 2:8, 3:9])


def test_random_crop_flip_gives_each_image_its_own_window_of_stored_pixels():
    images = _coordinate_images(64, 20, 24)
    cropped = augment.random_crop_flip(tf.constant(images), 16, SEED).numpy()
    assert cropped.shape == (64, 16, 16, 3) and cropped.dtype == np.uint8
    positions, flips = set(), 0
    for index, crop in enumerate(cropped):
        assert (crop[..., 2] == index).all()  # the batch order (and so each label) is kept
        top, columns = int(crop[0, 0, 1]), crop[0, :, 0].astype(int)
        flipped = columns[0] > columns[-1]
        flips += flipped
        left = int(columns.min())
        assert 0 <= top <= 20 - 16 and 0 <= left <= 24 - 16  # inside the image
        window = images[index, top:top + 16, left:left + 16]
        np.testing.assert_array_equal(crop, window[:, ::-1] if flipped else window)
        positions.add((top, left))
    assert len(positions) > 20  # per-image positions, not one per batch
    assert 16 <= flips <= 48


def test_random_crop_flip_repeats_with_the_seed_and_changes_without():
    images = tf.constant(_coordinate_images(8, 12, 12))
    first = augment.random_crop_flip(images, 8, SEED).numpy()
    np.testing.assert_array_equal(first, augment.random_crop_flip(images, 8, SEED).numpy())
    assert not np.array_equal(first, augment.random_crop_flip(images, 8, 56).numpy())


def _rrc_draws(batch: int):
    return keras.random.uniform((batch, 2 * augment.RRC_ATTEMPTS + 2), dtype="float32", seed=SEED)


def test_rrc_windows_lie_inside_the_image_within_the_area_and_aspect_ranges():
    height, width = 30, 50
    top, left, window_height, window_width = (t.numpy() for t in augment.rrc_windows(
        _rrc_draws(4000), height, width))
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + window_height <= height + 1e-3).all() and (left + window_width <= width + 1e-3).all()
    area = window_height * window_width / (height * width)
    aspect = window_width / window_height
    assert (area >= 0.08 - 1e-4).all() and (area <= 1 + 1e-4).all()
    assert (aspect >= 3 / 4 - 1e-4).all() and (aspect <= 4 / 3 + 1e-4).all()
    assert area.min() < 0.15 and area.max() > 0.6  # the range is used, not one size


def test_rrc_falls_back_to_the_largest_central_window_in_range_when_nothing_fits():
    # A 4x400 strip: 8% of it is 128 px, which at aspect <= 4/3 is over 4 px high, so nothing fits.
    top, left, window_height, window_width = (t.numpy() for t in augment.rrc_windows(_rrc_draws(50), 4, 400))
    np.testing.assert_allclose(window_height, 4)
    np.testing.assert_allclose(window_width, 4 * 4 / 3, rtol=1e-5)
    np.testing.assert_allclose(left, (400 - 16 / 3) / 2, rtol=1e-5)
    np.testing.assert_allclose(top, 0)


def test_resampling_matches_tf_image_resize_with_antialiasing():
    # Whole images, so both read the same pixels (inside a larger image, a window's kernel may read past its edge).
    rng = np.random.default_rng(0)
    for height, width in [(40, 36), (12, 20)]:  # down- and upscaling
        images = rng.integers(0, 256, (2, height, width, 3)).astype(np.uint8)
        zeros, ones = tf.zeros([2]), tf.ones([2])
        resized = augment.resize_windows(tf.constant(images), zeros, zeros, height * ones, width * ones, 16).numpy()
        expected = tf.image.resize(images.astype(np.float32), (16, 16), antialias=True).numpy()
        np.testing.assert_allclose(resized, expected, atol=0.05)


def test_a_window_of_the_output_size_is_exactly_that_window():
    images = _coordinate_images(2, 20, 30)
    top, left = tf.constant([3.0, 0.0]), tf.constant([5.0, 22.0])
    size = 8 * tf.ones([2])
    resized = augment.resize_windows(tf.constant(images), top, left, size, size, 8).numpy()
    np.testing.assert_allclose(resized[0], images[0, 3:11, 5:13], atol=1e-4)
    np.testing.assert_allclose(resized[1], images[1, 0:8, 22:30], atol=1e-4)


def test_resize_of_a_same_size_window_is_the_identity_and_flip_mirrors():
    images = _coordinate_images(2, 8, 8)
    ones = tf.ones([2])
    resized = augment.resize_windows(tf.constant(images), 0 * ones, 0 * ones, 8 * ones, 8 * ones, 8,
                                     flip=tf.constant([False, True])).numpy()
    np.testing.assert_allclose(resized[0], images[0], atol=1e-4)
    np.testing.assert_allclose(resized[1], images[1, :, ::-1], atol=1e-4)


def test_rrc_keeps_each_image_with_its_label_and_values_inside_the_image():
    # Constant-colour images: any window of image i, resized, is image i's colour.
    colours = np.array([[10 * i, 255 - 10 * i, 7 * i] for i in range(16)], np.uint8)
    images = np.broadcast_to(colours[:, None, None, :], (16, 24, 20, 3)).copy()
    resized = augment.random_resized_crop_flip(tf.constant(images), 12, SEED).numpy()
    assert resized.shape == (16, 12, 12, 3)
    np.testing.assert_allclose(resized, np.broadcast_to(colours[:, None, None, :], resized.shape), atol=1e-3)


def test_normalize_uses_the_manifest_scale():
    images = tf.constant([[[[0, 128, 255]]]], tf.uint8)
    normalized = augment.normalize(images, [0.0, 128.0, 127.5], [1.0, 2.0, 127.5]).numpy()
    np.testing.assert_allclose(normalized[0, 0, 0], [0.0, 0.0, 1.0])


@pytest.mark.parametrize("mode", augment.AUGMENTATIONS)
def test_layer_augments_in_training_and_centre_crops_in_inference(mode):
    images = tf.constant(_coordinate_images(6, 14, 14))
    layer = augment.CropFlipNormalize(8, mean_rgb=[0, 0, 0], std_rgb=[1, 1, 1], augment=mode, seed=1)
    evaluated = layer(images, training=False).numpy()
    np.testing.assert_array_equal(evaluated, images.numpy()[:, 3:11, 3:11].astype(np.float32))
    trained = layer(images, training=True).numpy()
    assert trained.shape == (6, 8, 8, 3) and trained.dtype == np.float32
    assert not np.array_equal(trained, evaluated)
    again = layer(images, training=True).numpy()
    assert not np.array_equal(trained, again)  # fresh parameters every batch
    np.testing.assert_allclose(trained[..., 2], np.broadcast_to(np.arange(6.0)[:, None, None], (6, 8, 8)),
                               atol=1e-3)


@pytest.mark.parametrize("mode", augment.AUGMENTATIONS)
@pytest.mark.parametrize("jit_compile", [False, True])
def test_layer_runs_in_a_compiled_function_with_unknown_image_size(mode, jit_compile):
    layer = augment.CropFlipNormalize(8, mean_rgb=[1, 2, 3], std_rgb=[4, 5, 6], augment=mode, seed=2)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)], jit_compile=jit_compile)
    def both(images):
        trained, evaluated = layer(images, training=True), layer(images, training=False)
        assert tuple(trained.shape[1:]) == (8, 8, 3) and tuple(evaluated.shape[1:]) == (8, 8, 3)  # static sides
        return trained, evaluated

    for height, width in [(11, 17), (20, 9)]:  # one function, two image sizes
        images = _coordinate_images(3, height, width)
        trained, evaluated = both(tf.constant(images))
        assert trained.shape == (3, 8, 8, 3)
        top, left = (height - 8) // 2, (width - 8) // 2
        np.testing.assert_allclose(evaluated.numpy() * [4, 5, 6] + [1, 2, 3],
                                   images[:, top:top + 8, left:left + 8], atol=1e-4)


def test_the_same_seed_gives_the_same_augmentation():
    images = _coordinate_images(8, 14, 18)
    for function in (augment.random_crop_flip, augment.random_resized_crop_flip):
        first = keras.ops.convert_to_numpy(function(images, 8, 7))
        np.testing.assert_array_equal(first, keras.ops.convert_to_numpy(function(images, 8, 7)))
        assert not np.array_equal(first, keras.ops.convert_to_numpy(function(images, 8, 8)))
    for mode in augment.AUGMENTATIONS:  # layers with one seed give one sequence of batches
        runs = []
        for _ in range(2):
            layer = augment.CropFlipNormalize(8, [0, 0, 0], [1, 1, 1], augment=mode, seed=7)
            runs.append([keras.ops.convert_to_numpy(layer(images, training=True)) for _ in range(2)])
        np.testing.assert_array_equal(runs[0][0], runs[1][0])
        np.testing.assert_array_equal(runs[0][1], runs[1][1])
        assert not np.array_equal(runs[0][0], runs[0][1])


# On JAX, under jax.jit, the same checks: test_model_backends.py, in its one JAX process.


def test_layer_survives_a_keras_save_and_load(tmp_path):
    inputs = keras.Input((None, None, 3), dtype="uint8")
    outputs = augment.CropFlipNormalize(4, [1.0, 2.0, 3.0], [2.0, 2.0, 2.0], augment="rrc")(inputs)
    model = keras.Model(inputs, outputs)
    path = str(tmp_path / "layer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    images = tf.constant(_coordinate_images(2, 9, 9))
    np.testing.assert_array_equal(loaded(images).numpy(), model(images).numpy())
    assert loaded.layers[-1].get_config()["augment"] == "rrc"
    assert math.isclose(loaded.layers[-1].mean_rgb[2], 3.0)
