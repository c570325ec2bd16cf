"""Inference on new photos: :func:`predict_images` turns photos into the dataset's stored form and names the classes.

A model trained by ``shardprep train`` takes *stored* images: what the preprocess job wrote (decoded, EXIF-oriented,
RGB, resized so the shorter side is the manifest's ``shorter_side``, centre-cropped when the manifest's ``crop`` is
``center``). Feeding it a whole photo opened another way (another resize, or none) gives other pixels and worse
predictions, so this module runs each photo through the job's own :func:`shardprep.preprocess.image_ops.process_image`
with the manifest's options, and reads the class names from the manifest.

    from shardprep.train.predict import predict_images

    for p in predict_images("run/model.keras", "shards", ["cat.jpg", "dog.png"], top_k=3):
        print(p.source, p.class_name, f"{p.probability:.2f}", p.top)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from shardprep.preprocess import image_ops
from shardprep.preprocess import manifest as manifest_lib


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's answer for one image.

    ``class_name``/``index``/``probability``: the most probable class (``index`` into the manifest's ``classes``,
    ``probability`` the softmax of the logits). ``top``: the ``top_k`` most probable classes, best first, as
    ``(class_name, index, probability)``. ``source``: the image's path, or ``"<bytes #i>"`` for the i-th image given
    as bytes.
    """

    source: str
    class_name: str
    index: int
    probability: float
    top: tuple[tuple[str, int, float], ...]


def process_options(manifest: dict) -> image_ops.ProcessOptions:
    """The options the preprocess job used for this dataset, with raw encoding (pixels, not a JPEG round trip).

    Built from the manifest the way the job builds them (``PreprocessConfig.process_options``): ``shorter_side``,
    ``crop`` and, when the manifest records it, ``max_pixels``.
    """
    options = manifest.get("options") or {}
    max_pixels = options.get("max_pixels")
    return image_ops.ProcessOptions(
        shorter_side=int(manifest["shorter_side"]), crop=manifest.get("crop", "center"), encoding="raw",
        max_pixels=int(max_pixels) if isinstance(max_pixels, int) and max_pixels > 0 else image_ops.DEFAULT_MAX_PIXELS)


def load_manifest(manifest) -> dict:
    """``manifest`` as a dict: a loaded manifest, a dataset folder (local or ``gs://``) or its ``manifest.json``."""
    if isinstance(manifest, dict):
        return manifest
    path = os.fspath(manifest)
    if path.endswith(manifest_lib.MANIFEST_NAME) and not path.endswith("/"):
        path = path[: -len(manifest_lib.MANIFEST_NAME)].rstrip("/") or "."
    from shardprep.train import preflight  # no TensorFlow: the manifest alone, with one-line errors

    return preflight.load_manifest(path)


def model_image_size(model) -> int | None:
    """The crop the model was trained at: its :class:`~shardprep.train.augment.CropFlipNormalize` layer's
    ``image_size`` (a training model, or a ``model.keras`` of an earlier version), else its
    ``keras.layers.CenterCrop``'s smaller side (the inference model ``shardprep train`` saves), else a fixed input
    size, else None."""
    import keras

    for layer in getattr(model, "layers", ()):
        size = getattr(layer, "image_size", None)
        if isinstance(size, int):
            return size
        if isinstance(layer, keras.layers.CenterCrop):
            return int(min(layer.height, layer.width))
    shape = getattr(model, "input_shape", None)
    if shape and len(shape) == 4 and shape[1] is not None and shape[2] is not None:
        return int(min(shape[1], shape[2]))
    return None


def stored_pixels(data: bytes, options: image_ops.ProcessOptions, min_side: int | None = None) -> np.ndarray:
    """``data`` (any format the preprocess job reads) as the job stores it: ``uint8 [H, W, 3]``.

    With ``min_side``, an image whose shorter side is still below it (a manifest whose ``shorter_side`` is smaller
    than the model's train size) is resized up, with the job's own resize, so that its shorter side is ``min_side``
    and the model's centre crop fits. Raises :class:`shardprep.preprocess.image_ops.RejectError` for an image the
    job would reject.
    """
    processed = image_ops.process_image(bytes(data), options)
    pixels = np.frombuffer(processed.encoded, np.uint8).reshape(processed.height, processed.width, 3)
    if min_side is not None and min(pixels.shape[:2]) < min_side:
        image = image_ops.resize_and_crop(Image.fromarray(pixels, "RGB"), min_side, options.crop)
        pixels = np.asarray(image.convert("RGB"), np.uint8)
    return pixels


def _read(image, position: int) -> tuple[str, bytes]:
    if isinstance(image, (bytes, bytearray, memoryview)):
        return f"<bytes #{position}>", bytes(image)
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if "://" in path:
            import tensorflow as tf

            with tf.io.gfile.GFile(path, "rb") as f:
                return path, f.read()
        with open(path, "rb") as f:
            return path, f.read()
    raise TypeError(f"image #{position} is a {type(image).__name__}: give a path or the file's bytes")


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=-1, keepdims=True)


def predict_images(model, manifest, images: Sequence | Iterable, top_k: int = 1,
                   batch_size: int = 32) -> list[Prediction]:
    """Classifies photos with a model trained by ``shardprep train``; one :class:`Prediction` per image, in order.

    Args:
      model: a Keras model (uint8 images in, logits out, as ``shardprep train`` saves it) or the path of its
        ``model.keras`` (loaded with :func:`shardprep.train.model.load_model`, which also reads older files).
      manifest: the dataset the model was trained on: its folder (local or ``gs://``), its ``manifest.json``, or
        the loaded dict. Its options say how to turn a photo into the stored form, and its ``classes`` name the
        predictions.
      images: paths (local or ``gs://``) or the files' bytes, in any format the preprocess job reads (JPEG, PNG with
        or without alpha, GIF, BMP, WebP, TIFF; EXIF orientation applied).
      top_k: how many classes each ``Prediction.top`` lists (at most the number of classes).
      batch_size: images per call of the model.

    Each photo goes through :func:`shardprep.preprocess.image_ops.process_image` with the manifest's options
    (:func:`process_options`), exactly as the job stored the training images, so small photos are resized up to the
    manifest's ``shorter_side`` like any other. Should the stored form still be smaller than the model's train size
    (the manifest's ``shorter_side`` below it: another dataset's manifest), it is resized up with the same resize
    so that the model's centre crop fits, instead of failing with a shape error. The model then takes the central
    train-size crop and normalizes, as in validation.

    Raises ``ValueError`` naming the image for a photo the job would reject (not an image, too many pixels), and
    when the model's number of outputs differs from the manifest's number of classes.
    """
    from shardprep.train.model import load_model

    if isinstance(model, (str, os.PathLike)):
        model = load_model(os.fspath(model))
    manifest = load_manifest(manifest)
    classes = list(manifest["classes"])
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    sources, arrays = _stored_images(images, process_options(manifest), model_image_size(model))
    probabilities = _class_probabilities(model, arrays, len(classes), batch_size)
    predictions = []
    for source, row in zip(sources, probabilities):
        order = np.argsort(-row, kind="stable")[:min(top_k, len(classes))]
        top = tuple((classes[int(i)], int(i), float(row[i])) for i in order)
        predictions.append(Prediction(source, *top[0], top=top))
    return predictions


def _stored_images(images, options: image_ops.ProcessOptions, min_side: int | None) -> tuple[list, list]:
    """(sources, uint8 H x W x 3 arrays) of ``images`` in their stored form; a rejected image is a ValueError."""
    sources, arrays = [], []
    for position, image in enumerate(images):
        source, data = _read(image, position)
        try:
            arrays.append(stored_pixels(data, options, min_side))
        except image_ops.RejectError as error:
            raise ValueError(f"{source}: not usable as an image ({error})") from None
        sources.append(source)
    return sources, arrays


def _class_probabilities(model, arrays: list, num_classes: int, batch_size: int) -> list:
    """The softmax of the model's logits for each array, in order (one batch per image shape)."""
    import keras

    probabilities: list[np.ndarray | None] = [None] * len(arrays)
    by_shape: dict[tuple, list[int]] = {}
    for position, pixels in enumerate(arrays):
        by_shape.setdefault(pixels.shape, []).append(position)
    for positions in by_shape.values():  # crop "none" datasets keep the aspect ratio: one batch per shape
        for start in range(0, len(positions), batch_size):
            chunk = positions[start:start + batch_size]
            logits = model(np.stack([arrays[i] for i in chunk]), training=False)
            logits = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(logits, "float32")))
            if logits.shape[-1] != num_classes:
                raise ValueError(f"the model has {logits.shape[-1]} outputs but the manifest lists "
                                 f"{num_classes} classes: give the dataset the model was trained on")
            for i, row in zip(chunk, _softmax(logits)):
                probabilities[i] = row
    return probabilities
