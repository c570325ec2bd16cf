"""ResNet-18 as in He et al. 2015: layer layout and the parameter count torchvision gives."""

import keras
import numpy as np
import pytest

from shardprep.train.model.keras_model import build_model
from shardprep.train.model.keras_model import resnet18

pytestmark = pytest.mark.usefixtures("full_resnet18")  # the model as shipped, not the tests' short one


def _trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_default_network_is_resnet18_with_11_7_million_parameters():
    model = resnet18(1000)
    assert _trainable(model) == 11_689_512  # torchvision.models.resnet18().parameters()
    convolutions = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    # stem + 8 blocks x 2 convolutions + 3 projections
    assert len(convolutions) == 1 + 16 + 3
    stem = convolutions[0]
    assert stem.kernel_size == (7, 7) and stem.strides == (2, 2) and stem.filters == 64
    assert any(layer.__class__.__name__ == "MaxPooling2D" for layer in model.layers)
    assert sorted({c.filters for c in convolutions}) == [64, 128, 256, 512]
    assert all(not c.use_bias for c in convolutions)
    assert model.output_shape == (None, 1000)


def test_width_multiplier_scales_channels_for_small_test_models():
    model = resnet18(2, input_shape=(32, 32, 3), width_multiplier=0.125)
    filters = {layer.filters for layer in model.layers if layer.__class__.__name__ == "Conv2D"}
    assert filters == {8, 16, 32, 64}
    assert model.predict(np.zeros((2, 32, 32, 3), np.float32), verbose=0).shape == (2, 2)


def test_weight_decay_regularizes_kernels_only():
    model = resnet18(10, input_shape=(32, 32, 3), width_multiplier=0.125, weight_decay=1e-4)
    kernels = [layer for layer in model.layers if layer.__class__.__name__ in ("Conv2D", "Dense")]
    assert len(model.losses) == len(kernels)


def test_full_model_takes_uint8_images_of_any_size_and_returns_float32_logits():
    model = build_model(3, 32, [120.0, 110.0, 100.0], [60.0, 60.0, 60.0], width_multiplier=0.125)
    assert model.input.dtype == "uint8"
    for size in (32, 45):
        logits = model.predict(np.zeros((2, size, size + 3, 3), np.uint8), verbose=0)
        assert logits.shape == (2, 3) and logits.dtype == np.float32


def test_network_is_keras_layers_only_and_channels_last_whatever_the_global_setting():
    previous = keras.config.image_data_format()
    keras.config.set_image_data_format("channels_first")
    try:
        model = build_model(3, 16, [0.0] * 3, [1.0] * 3, width_multiplier=0.125)
    finally:
        keras.config.set_image_data_format(previous)
    network = model.layers[2:]  # after the input and the augmentation layer
    assert all(type(layer).__module__.startswith("keras.src.layers.") for layer in network)
    formats = {layer.data_format for layer in network if hasattr(layer, "data_format")}
    assert formats == {"channels_last"}
    assert {layer.axis for layer in network if isinstance(layer, keras.layers.BatchNormalization)} == {-1}
    assert model.predict(np.zeros((2, 20, 18, 3), np.uint8), verbose=0).shape == (2, 3)
