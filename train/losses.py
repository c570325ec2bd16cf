"""The training loss on every backend: cross-entropy on logits with label smoothing, from sparse labels, in float32.

Labels are class indices (what the reader yields); label smoothing needs one-hot targets, made here with
``keras.ops`` so the same code runs on TensorFlow, JAX and PyTorch. Logits are cast to float32 first, so the loss
is float32 under a mixed-precision policy. Weight decay is not here: it is the model's own ``model.losses``.

:class:`SmoothedCrossentropy` and :class:`SmoothedCrossentropyMean` (the per-example loss as a metric, without
weight decay, so ``history.json``'s ``loss`` means the same on every backend) are registered with Keras, so a
checkpoint compiled with them loads wherever this module is imported.
"""

from __future__ import annotations

import keras
from keras import ops


def smoothed_crossentropy(labels, logits, num_classes: int, label_smoothing: float):
    """Per-example float32 cross-entropy of ``logits`` against the one-hot of ``labels``, smoothed."""
    one_hot = ops.one_hot(ops.cast(ops.reshape(labels, (-1,)), "int32"), num_classes, dtype="float32")
    return keras.losses.categorical_crossentropy(one_hot, ops.cast(logits, "float32"), from_logits=True,
                                                 label_smoothing=label_smoothing)


@keras.saving.register_keras_serializable(package="shardprep")
class SmoothedCrossentropy(keras.losses.Loss):
    """:func:`smoothed_crossentropy` as a Keras loss, averaged over the batch."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, name: str = "smoothed_crossentropy",
                 reduction: str = "sum_over_batch_size", dtype: str | None = "float32"):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.num_classes, self.label_smoothing = int(num_classes), float(label_smoothing)

    def call(self, y_true, y_pred):
        return smoothed_crossentropy(y_true, y_pred, self.num_classes, self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="shardprep")
class SmoothedCrossentropyMean(keras.metrics.MeanMetricWrapper):
    """The running mean of :func:`smoothed_crossentropy` (the loss without weight decay)."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, name: str = "data_loss",
                 dtype: str | None = "float32"):
        super().__init__(smoothed_crossentropy, name=name, dtype=dtype, num_classes=int(num_classes),
                         label_smoothing=float(label_smoothing))
        self.num_classes, self.label_smoothing = int(num_classes), float(label_smoothing)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "num_classes": self.num_classes,
                "label_smoothing": self.label_smoothing}
