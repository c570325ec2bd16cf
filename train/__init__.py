"""Training from prepared shards: tf.data reader, on-device augmentation, ResNet-18 and the training loop.

Public API:

* :func:`shardprep.train.reader.make_dataset` — batches of ``(uint8 images, int32 labels)`` from a prepared dataset.
* :class:`shardprep.train.augment.CropFlipNormalize` and the batched functions beside it — augmentation on the accelerator.
* :func:`shardprep.train.resnet.resnet18`, :func:`shardprep.train.model.build_model`, :func:`shardprep.train.model.load_model`.
* :func:`shardprep.train.predict.predict_images` — class names and probabilities for new photos (paths or bytes),
  turned into the stored form with the dataset's own options.
* :func:`shardprep.train.loop.train` with :class:`shardprep.train.config.TrainConfig` — what ``shardprep train`` runs.

Modules, each one concern:

* ``config``: the run's options and their choices (no TensorFlow: the CLI imports it).
* ``reader``: the manifest helpers and ``make_dataset``, which dispatches to one read strategy:
  ``read_gather`` (local fixed-layout shards, records gathered into the batch by ``record_gather``),
  ``read_stream`` (fixed-layout shards streamed) or ``read_examples`` (TFRecords of Examples); all share the record
  order of ``read_plan``.
* ``augment``, ``resnet``, ``model``: the model, with augmentation and normalization as its first layer.
* ``schedules``: learning-rate warm-up and decay, and the optimizer; ``checkpoints``: what a run writes and resumes
  from; ``loop``: the training loop, its progress within an epoch and its input-bound report; ``preflight``: the
  checks ``shardprep train`` makes before importing TensorFlow; ``predict``: inference on new photos.

Modules other than ``config`` and ``record_gather`` import TensorFlow; import them, not this package, where that
matters.
"""
