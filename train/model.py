"""The trained model: stored uint8 images in, logits out, with augmentation and normalization inside."""

from __future__ import annotations

import keras

from shardprep.train.augment import CropFlipNormalize
from shardprep.train.resnet import resnet18_layers


def build_model(num_classes: int, image_size: int, mean_rgb, std_rgb, *, augment: str = "crop",
                seed: int | None = None, width_multiplier: float = 1.0, weight_decay: float = 0.0) -> keras.Model:
    """ResNet-18 behind a :class:`~shardprep.train.augment.CropFlipNormalize` input layer.

    The model takes ``uint8 [B, H, W, 3]`` images of any size >= ``image_size`` (what the reader yields, or any
    stored image): called with ``training=True`` it augments them (``augment``: ``"crop"`` or ``"rrc"``), otherwise
    it takes their central ``image_size`` crop; then it normalizes with ``mean_rgb`` / ``std_rgb`` (0-255 scale,
    from the manifest). So the saved model needs no preprocessing code for inference.
    """
    images = keras.Input((None, None, 3), dtype="uint8", name="images")
    x = CropFlipNormalize(image_size, mean_rgb, std_rgb, augment=augment, seed=seed, name="crop_flip_normalize")(
        images)
    logits = resnet18_layers(x, num_classes, width_multiplier=width_multiplier, weight_decay=weight_decay)
    return keras.Model(images, logits, name="shardprep_resnet18")


def load_model(path: str) -> keras.Model:
    """Loads a ``model.keras`` saved by ``shardprep train`` (registers shardprep's layers first).

    ``load_model(path)(uint8_images)`` gives logits for stored images of any size >= the train size.
    """
    import shardprep.train.augment  # noqa: F401  registers CropFlipNormalize
    import shardprep.train.schedules  # noqa: F401  registers WarmupSchedule (checkpoints hold the optimizer)

    return keras.models.load_model(path)
