"""Training from prepared shards: tf.data reader, on-device augmentation, ResNet-18 and the training loop.

Public API:

* :func:`train.reader.make_dataset` — batches of ``(uint8 images, int32 labels)`` from a prepared dataset.
* :class:`train.augment.CropFlipNormalize` and the batched functions beside it — augmentation on the accelerator.
* :func:`train.resnet.resnet18`, :func:`train.model.build_model`, :func:`train.model.load_model`.
* :func:`train.loop.train` with :class:`train.loop.TrainConfig` — what ``shardprep train`` runs.

Modules import TensorFlow; import them, not this package, where that matters.
"""
