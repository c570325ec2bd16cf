"""Training from prepared shards: tf.data reader, on-device augmentation, ResNet-18 and the training loop.

Public API:

* :func:`shardprep.train.reader.make_dataset` — batches of ``(uint8 images, int32 labels)`` from a prepared dataset.
* :class:`shardprep.train.numpy_reader.NumpyReader` — the same batches as NumPy arrays, without TensorFlow; its
  ``as_py_dataset()`` for Keras on any backend, and :class:`shardprep.train.record_dataset.RecordDataset` with
  :class:`~shardprep.train.record_dataset.EpochSampler` for PyTorch's ``DataLoader`` or Grain.
* :class:`shardprep.train.augment.CropFlipNormalize` and the batched functions beside it — augmentation on the accelerator.
* :func:`shardprep.train.resnet.resnet18`, :func:`shardprep.train.model.build_model`, :func:`shardprep.train.model.load_model`.
* :func:`shardprep.train.predict.predict_images` — class names and probabilities for new photos (paths or bytes),
  turned into the stored form with the dataset's own options.
* :func:`shardprep.train.loop.train` with :class:`shardprep.train.config.TrainConfig` — what ``shardprep train`` runs.

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
  from (mid-epoch too), read back by ``checkpoint_state``; ``run_files``: the names of a run's files and the run
  record listing them; ``output_dir``: what a run may do with ``--output-dir``; ``losses``: the smoothed
  cross-entropy; ``loop``: the backend-neutral training loop, its
  progress within an epoch and its input-bound report, over ``steps_tf`` (TensorFlow) or ``steps_keras`` (JAX,
  PyTorch); ``preflight``: the checks ``shardprep train`` makes before importing Keras; ``predict``: inference on
  new photos.

``config``, ``record_order``, ``record_index``, ``record_gather``, ``verified_gather``, ``batch_sources``,
``batch_prefetch``, ``numpy_reader``, ``record_dataset``, ``run_files``, ``output_dir`` and ``checkpoint_state``
import no TensorFlow (but for ``gs://``); ``keras_batches``, ``augment``,
``resnet``, ``model``, ``losses``, ``schedules``, ``checkpoints`` (but for ``gs://``), ``steps_keras`` and ``loop``
import Keras, and Keras its backend (TensorFlow only when it is the backend); the other modules import TensorFlow:
import them, not this package, where that matters.
"""
