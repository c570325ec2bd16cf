"""Training from prepared shards: readers, on-device augmentation, ResNet-18 and the training loop.
Public API: ``from shardprep.train import NumpyReader`` etc. (:data:`_EXPORTS`), each imported on first use, so it
costs only what its module imports (``NumpyReader``, ``RecordDataset``: no TensorFlow, Keras or Beam).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if __name__ != "shardprep.train":  # the folder imported by its bare name, e.g. from the repository's root
    raise ImportError(f"train/ is installed as shardprep.train: import shardprep.train, not {__name__} (a second "
                      "copy of its modules, with classes of their own)")

from shardprep.preprocess.lazy_exports import lazy_exports  # noqa: E402 - after the check above
from shardprep.preprocess.checks import streams  # noqa: E402

# A plain session reading a dataset shows none of TensorFlow's C++ log lines (oneDNN, cuInit, absl) unless the user
# set TF_CPP_MIN_LOG_LEVEL: the one effect of this import, and only before TensorFlow is (``streams``).
streams.quiet_library()

# Each public name and the module of this package that defines it.
_EXPORTS = {
    "make_dataset": "data.reader", "load_manifest": "data.reader", "split_size": "data.reader",
    "NumpyReader": "data.numpy_reader", "ReaderState": "data.record_order", "DatasetChangedError": "data.batch_sources",
    "RecordDataset": "data.numpy_reader", "EpochSampler": "data.numpy_reader",
    "CropFlipNormalize": "model.augment", "resnet18": "model.keras_model", "resnet18_layers": "model.keras_model",
    "build_model": "model.keras_model", "load_model": "model.keras_model",
    "predict_images": "model.predict", "Prediction": "model.predict", "PhotoFailure": "model.predict",
    "train": "run.loop", "TrainConfig": "run.config"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports each name when first used
    from shardprep.train.model.augment import CropFlipNormalize
    from shardprep.train.run.config import TrainConfig
    from shardprep.train.run.loop import train
    from shardprep.train.model.keras_model import build_model, load_model, resnet18, resnet18_layers
    from shardprep.train.model.predict import PhotoFailure, Prediction, predict_images
    from shardprep.train.data.reader import load_manifest, make_dataset, split_size
    from shardprep.train.data.numpy_reader import EpochSampler, NumpyReader, RecordDataset
    from shardprep.train.data.batch_sources import DatasetChangedError
    from shardprep.train.data.record_order import ReaderState
