"""The trained model (stored uint8 images in, logits out, augmentation and normalization inside) and the inference
model saved as ``model.keras``, built from Keras's own layers so that any Keras loads it.
"""

from __future__ import annotations

import keras

from shardprep.train.augment import CropFlipNormalize
from shardprep.train.resnet import resnet18_layers


def build_model(num_classes: int, image_size: int, mean_rgb, std_rgb, *, augment: str = "crop",
                seed: int | None = None, width_multiplier: float = 1.0, weight_decay: float = 0.0) -> keras.Model:
    """ResNet-18 behind a :class:`~shardprep.train.augment.CropFlipNormalize` input layer: the training model.

    The model takes ``uint8 [B, H, W, 3]`` images of any size >= ``image_size`` (what the reader yields, or any
    stored image): called with ``training=True`` it augments them (``augment``: ``"crop"`` or ``"rrc"``), otherwise
    it takes their central ``image_size`` crop; then it normalizes with ``mean_rgb`` / ``std_rgb`` (0-255 scale,
    from the manifest). :func:`inference_model` turns it into the model that is saved for inference.
    """
    images = keras.Input((None, None, 3), dtype="uint8", name="images")
    x = CropFlipNormalize(image_size, mean_rgb, std_rgb, augment=augment, seed=seed, name="crop_flip_normalize")(
        images)
    logits = resnet18_layers(x, num_classes, width_multiplier=width_multiplier, weight_decay=weight_decay)
    return keras.Model(images, logits, name="shardprep_resnet18")


def inference_model(model: keras.Model) -> keras.Model:
    """The inference form of a model from :func:`build_model`, of Keras's own layers only, with its weights.

    Its ``CropFlipNormalize`` becomes ``keras.layers.CenterCrop(size, size)`` (a crop, not a resize, for images of
    at least ``size`` a side) and ``keras.layers.Normalization(mean, variance=std**2)`` (0-255 scale), both in
    float32; every other layer is a fresh copy (same config, so the same names and dtype policies) holding the
    trained weights. So plain ``keras.models.load_model`` loads the saved file on any backend, without shardprep,
    and it still takes ``uint8`` images of any size >= the train size. A model without a ``CropFlipNormalize``
    layer is copied as it is. The copy is not compiled: no optimizer goes into the file.
    """
    normalizing = next((layer for layer in model.layers if isinstance(layer, CropFlipNormalize)), None)
    crops = []  # the CenterCrop standing in for it, which the Normalization follows

    def clone_layer(layer):
        if layer is normalizing:
            crops.append(keras.layers.CenterCrop(layer.image_size, layer.image_size, dtype="float32",
                                                 name="center_crop"))
            return crops[-1]
        return layer.__class__.from_config(layer.get_config())

    def call_layer(layer, *args, **kwargs):
        if layer not in crops:
            return layer(*args, **kwargs)
        # training=False in the graph: CenterCrop's call defaults to training=True, which a model called without
        # `training` would pass on to the batch normalizations after it (a call with `training` overrides it).
        cropped = layer(*args, **{**kwargs, "training": False})
        variance = [std ** 2 for std in normalizing.std_rgb]
        return keras.layers.Normalization(mean=normalizing.mean_rgb, variance=variance, dtype="float32",
                                          name="normalization")(cropped)

    cloned = keras.models.clone_model(model, clone_function=clone_layer, call_function=call_layer)
    inference = keras.Model(cloned.input, cloned.output, name=model.name)  # clone_model compiles as the model was
    for layer in inference.layers:
        if layer.weights and layer.name in {original.name for original in model.layers}:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    return inference


def save_inference_model(model: keras.Model, path: str) -> None:
    """Saves :func:`inference_model` of ``model`` to ``path`` (a ``.keras`` file): no optimizer state, no custom
    layers; ``keras.models.load_model(path)(uint8_images)`` gives logits for stored images of any size >= the train
    size, on any backend."""
    inference_model(model).save(path)


def load_model(path: str) -> keras.Model:
    """Loads a ``model.keras`` saved by ``shardprep train``; also files from before the inference model was built
    of Keras's own layers, and checkpoints (it registers shardprep's layers and schedule first).

    ``load_model(path)(uint8_images)`` gives logits for stored images of any size >= the train size.
    """
    import shardprep.train.augment  # noqa: F401  registers CropFlipNormalize
    import shardprep.train.losses  # noqa: F401  registers the smoothed loss and metric (JAX/PyTorch checkpoints)
    import shardprep.train.schedules  # noqa: F401  registers WarmupSchedule (checkpoints hold the optimizer)

    return keras.models.load_model(path)
