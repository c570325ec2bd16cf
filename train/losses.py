"""The training loss on every backend: sparse labels, label smoothing, cross-entropy on logits in float32
(``keras.ops``); weight decay is the model's ``model.losses``. :class:`SmoothedCrossentropy` and the metric
:class:`SmoothedCrossentropyMean` (``history.json``'s ``loss`` on every backend) are registered with Keras.
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
