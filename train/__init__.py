"""Training from prepared shards: tf.data reader, on-device augmentation, ResNet-18 and the training loop.

Public API, importable from this package (``from shardprep.train import NumpyReader``); each name is imported from
its module on first use, so a name costs only what its module imports (``NumpyReader``: no TensorFlow, Keras or
Beam):

* ``make_dataset`` (``reader``) — batches of ``(uint8 images, int32 labels)`` from a prepared dataset, with
  ``load_manifest`` and ``split_size``.
* ``NumpyReader`` (``numpy_reader``) — the same batches as NumPy arrays, without TensorFlow; its
  ``as_py_dataset()`` for Keras on any backend; its ``state()`` a ``ReaderState``; ``RecordDataset`` with
  ``EpochSampler`` (``record_dataset``) for PyTorch's ``DataLoader`` or Grain. ``DatasetChangedError``: a dataset
  rebuilt or changed while read.
* ``CropFlipNormalize`` (``augment``) — augmentation and normalization on the accelerator, as the model's first layer.
* ``resnet18``, ``resnet18_layers`` (``resnet``), ``build_model``, ``load_model`` (``model``).
* ``predict_images`` (``predict``) — a ``Prediction`` (or ``PhotoFailure``) for each new photo (a path or bytes),
  turned into the stored form with the dataset's own options.
* ``train`` (``loop``) with ``TrainConfig`` (``config``) — what ``shardprep train`` runs.

Modules, each one concern:

* ``config``: the run's options and their choices (no TensorFlow: the CLI imports it).
* ``record_order``: the one record order of random-access reads, in NumPy (a permutation per seed and epoch, each
  process's share, start steps); ``record_index``: TFRecord offsets from the framing, and Examples read by offset.
* ``reader``: the manifest helpers and ``make_dataset``, which dispatches to one read strategy:
  ``read_gather`` (local shards by random access in ``record_order``: fixed-layout records gathered into the batch
  by ``record_gather``, CRC-checked by ``verified_gather``, other Examples read through ``record_index``),
  ``read_stream`` (fixed-layout shards streamed) or ``read_examples`` (Examples decoded in TensorFlow, gathered or
  streamed); streams follow the tf.data order of ``read_plan``.
* ``numpy_reader``: ``NumpyReader``, reading batches on threads (``batch_prefetch``) from ``batch_sources`` (the
  fixed-layout gather, or Examples decoded with NumPy/Pillow); ``keras_batches``: it as a ``keras.utils.PyDataset``;
  ``record_dataset``: one record at a time, with a seeded sampler, for PyTorch or Grain.
* ``augment``, ``resnet``, ``model``: the training model, with augmentation and normalization as its first layer
  (``keras.ops`` only: every Keras backend), and the inference model saved as ``model.keras`` (Keras's own layers).
* ``schedules``: learning-rate warm-up and decay, and the optimizer; ``checkpoints``: what a run writes and resumes
  from (mid-epoch too), read back by ``checkpoint_state``; ``run_files``: the names of a run's files, the run
  record listing them and what a run may do with ``--output-dir``; ``losses``: the smoothed
  cross-entropy; ``loop``: the backend-neutral training loop, its
  progress within an epoch and its input-bound report, over ``steps_tf`` (TensorFlow) or ``steps_keras`` (JAX,
  PyTorch); ``preflight``: the checks ``shardprep train`` makes before importing Keras; ``predict``: inference on
  new photos.

``config``, ``record_order``, ``record_index``, ``record_gather``, ``verified_gather``, ``batch_sources``,
``batch_prefetch``, ``numpy_reader``, ``record_dataset``, ``run_files`` and ``checkpoint_state``
import no TensorFlow (but for ``gs://``); ``keras_batches``, ``augment``,
``resnet``, ``model``, ``losses``, ``schedules``, ``checkpoints`` (but for ``gs://``), ``steps_keras`` and ``loop``
import Keras, and Keras its backend (TensorFlow only when it is the backend); the other modules import TensorFlow.
A public name imported from this package costs what its own module imports, nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if __name__ != "shardprep.train":  # the folder imported by its bare name, e.g. from the repository's root
    raise ImportError(f"train/ is installed as shardprep.train: import shardprep.train, not {__name__} (a second "
                      "copy of its modules, with classes of their own)")

from shardprep.preprocess.lazy_exports import lazy_exports  # noqa: E402 - after the check above
from shardprep.preprocess import streams  # noqa: E402

# A plain session reading a dataset shows none of TensorFlow's C++ log lines (oneDNN, cuInit, absl) unless the user
# set TF_CPP_MIN_LOG_LEVEL: the one effect of this import, and only before TensorFlow is (``streams``).
streams.quiet_library()

# Each public name and the module of this package that defines it.
_EXPORTS = {
    "make_dataset": "reader", "load_manifest": "reader", "split_size": "reader",
    "NumpyReader": "numpy_reader", "ReaderState": "record_order", "DatasetChangedError": "record_identity",
    "RecordDataset": "record_dataset", "EpochSampler": "record_dataset",
    "CropFlipNormalize": "augment", "resnet18": "resnet", "resnet18_layers": "resnet",
    "build_model": "model", "load_model": "model",
    "predict_images": "predict", "Prediction": "predict", "PhotoFailure": "predict",
    "train": "loop", "TrainConfig": "config",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports each name when first used
    from shardprep.train.augment import CropFlipNormalize
    from shardprep.train.config import TrainConfig
    from shardprep.train.loop import train
    from shardprep.train.model import build_model, load_model
    from shardprep.train.numpy_reader import NumpyReader
    from shardprep.train.predict import PhotoFailure, Prediction, predict_images
    from shardprep.train.reader import load_manifest, make_dataset, split_size
    from shardprep.train.record_dataset import EpochSampler, RecordDataset
    from shardprep.train.record_identity import DatasetChangedError
    from shardprep.train.record_order import ReaderState
    from shardprep.train.resnet import resnet18, resnet18_layers
