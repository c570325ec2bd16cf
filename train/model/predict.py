"""Inference on new photos: :func:`predict_images` stores each photo as the preprocess job did
(:func:`~shardprep.preprocess.image.image_ops.process_image`, the manifest's options), runs the model and names the
classes; :func:`check_dataset` refuses a manifest that is not the model's dataset, naming what differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from shardprep.preprocess.format import encodings
from shardprep.preprocess.image import image_ops
from shardprep.preprocess.checks import untrusted
from shardprep.preprocess.sources import wordnet_names
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest, ManifestShapeError, load_manifest

# How far the model's normalization may be from the manifest's mean_rgb/std_rgb (0-255 scale): the model stores
# them in float32, so the same dataset agrees to ~1e-5; another dataset differs by far more.
NORMALIZATION_TOLERANCE = 1e-3
PHOTO_MAX_BYTES = 1 << 30  # a photo file larger than this is not read (no image format preprocess reads needs it)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's answer for one image (``source``: its path, or ``"<bytes #i>"``): the most probable class
    and the ``top_k`` as ``(name, index, probability)``, best first."""

    source: str
    class_name: str
    index: int
    probability: float
    top: tuple[tuple[str, int, float], ...]

    @property
    def display_name(self) -> str:
        """The class as a person reads it: ``golf ball (n03445777)`` for an ImageNet WordNet ID, else the name."""
        return wordnet_names.display_name(self.class_name)


@dataclasses.dataclass(frozen=True)
class PhotoFailure:
    """A photo that could not be classified (``errors="report"``): its source and why, e.g. ``does not exist``."""

    source: str
    message: str


def process_options(manifest: Manifest) -> image_ops.ProcessOptions:
    """The options the job used for this dataset, with raw encoding (pixels, not a JPEG round trip)."""
    max_pixels = (manifest.options or {}).get("max_pixels")
    return image_ops.ProcessOptions(
        shorter_side=int(manifest.shorter_side), crop=manifest.crop, encoding=encodings.RAW.name,
        max_pixels=int(max_pixels) if isinstance(max_pixels, int) and max_pixels > 0 else image_ops.DEFAULT_MAX_PIXELS,
        resize_method=manifest.resize_method_used)


def _dataset_manifest(manifest, data: str) -> Manifest:
    """``manifest`` as a ``Manifest``: itself, a document, or loaded from a dataset folder or its ``manifest.json``
    (a ``ValueError`` naming ``data`` for a wrong shape). Record layouts are not required: no record is read."""
    try:
        if isinstance(manifest, Manifest):
            return manifest
        if isinstance(manifest, dict):
            return Manifest.from_json(manifest, layouts_required=False, lenient_layouts=True)
        path = os.fspath(manifest)
        if path.endswith(manifest_lib.MANIFEST_NAME) and not path.endswith("/"):
            path = path[: -len(manifest_lib.MANIFEST_NAME)].rstrip("/") or "."
        return load_manifest(path, lenient_layouts=True)
    except ManifestShapeError as e:
        raise ValueError(f"{data}: the manifest has the wrong shape: {e.problems[0]}") from None


def model_image_size(model) -> int | None:
    """The crop the model was trained at (its ``CropFlipNormalize``, ``CenterCrop`` or input), or None."""
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
    """``data`` as the job stores it, ``uint8 [H, W, 3]`` (``RejectError`` for an image the job rejects); with
    ``min_side``, a shorter side below it resized up with the job's own resize so the model's crop fits."""
    processed = image_ops.process_image(bytes(data), options)
    pixels = np.frombuffer(processed.encoded, np.uint8).reshape(processed.height, processed.width, 3)
    if min_side is not None and min(pixels.shape[:2]) < min_side:
        image = image_ops.resize_and_crop(Image.fromarray(pixels, "RGB"), min_side, options.crop, options.resize_method)
        pixels = np.asarray(image.convert("RGB"), np.uint8)
    return pixels


def model_normalization(model) -> tuple[list[float], list[float]] | None:
    """(mean RGB, std RGB), 0-255 scale, of the model's ``Normalization`` (the saved inference model) or
    ``CropFlipNormalize`` (a training model); None for neither."""
    import keras

    for layer in getattr(model, "layers", ()):
        if isinstance(layer, keras.layers.Normalization) and getattr(layer, "mean", None) is not None:
            mean = np.asarray(keras.ops.convert_to_numpy(layer.mean), np.float64).ravel()
            variance = np.asarray(keras.ops.convert_to_numpy(layer.variance), np.float64).ravel()
            return mean.tolist(), np.sqrt(variance).tolist()
        if getattr(layer, "mean_rgb", None) is not None and getattr(layer, "std_rgb", None) is not None:
            return [float(v) for v in layer.mean_rgb], [float(v) for v in layer.std_rgb]
    return None


def _numbers(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if values is not None else "none"


def classes_name(classes) -> str:
    """A model's name for the class list it learns (names and order), which predict checks: a hash, not the list."""
    return "shardprep_resnet18_" + hashlib.sha256(json.dumps(list(classes)).encode()).hexdigest()[:12]


def check_dataset(model, manifest: Manifest, data: str) -> None:
    """A ``ValueError`` naming what differs when ``manifest`` (of ``data``) cannot be ``model``'s dataset: the
    number of classes, stored images smaller than the crop, another normalization (when the model has one)."""
    give = "give the dataset the model was trained on (the DATA shardprep train was given)"
    outputs = (getattr(model, "output_shape", None) or (None,))[-1]
    if outputs is not None and outputs != len(manifest.classes):
        raise ValueError(f"the model has {outputs} outputs but the manifest lists {len(manifest.classes)} "
                         f"classes: {give}")
    name = getattr(model, "name", "")  # a model of an older shardprep (or built by hand) says nothing of its classes
    if name.startswith("shardprep_resnet18_") and name != classes_name(manifest.classes):
        raise ValueError(f"the model was trained on other classes, or the same in another order, than {data}'s "
                         f"manifest lists: {give}")
    size = model_image_size(model)
    height, width = manifest.stored_shape
    if size is not None and min(height, width) < size:
        raise ValueError(f"{data} stores {height}x{width} images, smaller than the model's {size}-pixel crop, so "
                         f"the model was not trained on it (training crops lie inside the stored images): {give}")
    normalization = model_normalization(model)
    if normalization is None:
        return
    stored = (manifest.mean_rgb, manifest.std_rgb)
    if any(values is None for values in stored) or any(
            abs(a - b) > NORMALIZATION_TOLERANCE for model_values, values in zip(normalization, stored)
            for a, b in zip(model_values, values)):
        raise ValueError(
            f"the model was not trained on {data}: the model normalizes with mean RGB {_numbers(normalization[0])}, "
            f"std RGB {_numbers(normalization[1])}, but {data}'s manifest says mean RGB {_numbers(stored[0])}, "
            f"std RGB {_numbers(stored[1])}: {give}")


def _read(image, position: int) -> bytes:
    """The photo's bytes, at most PHOTO_MAX_BYTES: a local path only if a regular file (never a FIFO), a URL as the
    shards are read."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        if "://" not in path:
            return untrusted.read_regular_file(path, PHOTO_MAX_BYTES)
        from shardprep.train.data.reader import read_url  # as the shards are read; a TensorFlow error: OSError

        data = read_url(path, PHOTO_MAX_BYTES + 1)
        if data is None:
            raise FileNotFoundError(path)
        if len(data) > PHOTO_MAX_BYTES:  # read one byte more than allowed: its whole size is not asked for
            raise untrusted.NotRegularFileError(path, f"is more than the {PHOTO_MAX_BYTES:,} bytes allowed")
        return data
    raise TypeError(f"image #{position} is a {type(image).__name__}: give a path or the file's bytes")


def _source(image, position: int) -> str:
    return os.fspath(image) if isinstance(image, (str, os.PathLike)) else f"<bytes #{position}>"


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=-1, keepdims=True)


def predict_images(model, manifest, images: Sequence | Iterable, top_k: int = 1, batch_size: int = 32,
                   errors: str = "raise") -> list:
    """One :class:`Prediction` per photo (paths or bytes), in order, from ``model`` (or its ``model.keras``) trained on
    ``manifest`` (checked: :func:`check_dataset`), ``top_k`` classes each; a bad photo is a ``ValueError``
    (``errors="raise"``) or a :class:`PhotoFailure` in its place (``"report"``)."""
    if errors not in ("raise", "report"):
        raise ValueError(f"errors must be 'raise' or 'report', got {errors!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    images = list(images)
    data = "the given manifest" if isinstance(manifest, (dict, Manifest)) else os.fspath(manifest)
    if isinstance(model, (str, os.PathLike)):
        model = _load(os.fspath(model))
    manifest = _dataset_manifest(manifest, data)
    check_dataset(model, manifest, data)
    classes = list(manifest.classes)
    results = _stored_images(images, process_options(manifest), errors)
    good = [position for position, result in enumerate(results) if isinstance(result, np.ndarray)]
    probabilities = _class_probabilities(model, [results[p] for p in good], len(classes), batch_size)
    for position, row in zip(good, probabilities):
        order = np.argsort(-row, kind="stable")[:min(top_k, len(classes))]
        top = tuple((classes[int(i)], int(i), float(row[i])) for i in order)
        results[position] = Prediction(_source(images[position], position), *top[0], top=top)
    return results


def _load(path: str):
    import zipfile

    from shardprep.train.model.keras_model import load_model

    if path.endswith(".keras") and "://" not in path and os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise ValueError(f"MODEL {path} is not a .keras model file (not a zip archive: damaged, or another kind of "
                         "file): give the model.keras shardprep train wrote")
    if "://" not in path and os.path.isfile(path) and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:  # Keras reads its JSON members whole (a ResNet-18's: ~100 KB)
            big = next((m for m in archive.infolist() if m.filename.endswith(".json") and m.file_size > 64 << 20), None)
        if big is not None:
            raise ValueError(f"MODEL {path}: its {big.filename} unpacks to {big.file_size >> 20:,} MiB, over the "
                             "64 MiB a model's may: give the model.keras shardprep train wrote")
    try:
        return load_model(path)
    except Exception as error:  # noqa: BLE001 - Keras raises many kinds for a file that is no model
        raise ValueError(f"MODEL {path} cannot be loaded as a Keras model ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else 'no detail'}): give the model.keras "
                         "shardprep train wrote") from None


def _stored_images(images, options: image_ops.ProcessOptions, errors: str) -> list:
    """Each photo's stored pixels, or its :class:`PhotoFailure`; ``errors="raise"``: a ValueError instead."""
    results: list = []
    for position, image in enumerate(images):
        source = _source(image, position)
        try:
            results.append(stored_pixels(_read(image, position), options))
            continue
        except image_ops.RejectError as error:
            message = f"not usable as an image ({error})"
        except untrusted.NotRegularFileError as error:
            message = error.reason
        except FileNotFoundError:
            message = "does not exist"
        except OSError as error:
            message = f"cannot be read ({error.strerror or error})"
        if errors == "raise":
            raise ValueError(f"{source}: {message}")
        results.append(PhotoFailure(source, message))
    return results


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
